/* transpose_avx2.h — an 8 x 8 transpose of 32-bit elements in AVX2
 * registers, for the bf16 GEMMs' packs (tensor/gemm_bf16.c: B^T's pairs;
 * tensor/gemm_dpbf16.c: A's 8-row panels). x86-64 with GCC or clang only;
 * callers compile with target("avx2"). */
#ifndef EMBER_TRANSPOSE_AVX2_H
#define EMBER_TRANSPOSE_AVX2_H

#include <immintrin.h>

/* x[i] = row i of 8 uint32 in, x[p] = column p out */
__attribute__((target("avx2"))) static inline void transpose8_u32(__m256i x[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(x[i], x[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(x[i], x[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) { /* columns h/4*4 .. of rows h .. h+3 */
        u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
        u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
        u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    for (int i = 0; i < 4; i++) { /* rows 0-3 from u[i], rows 4-7 from u[i + 4] */
        x[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        x[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

#endif
