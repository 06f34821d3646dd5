/* avx2_impl.h — AVX2 pieces shared by ember's x86 kernels (the GEMM's
 * packing in tensor/gemm_widen.c, the fused attention head in
 * tensor/attention_avx2.c): the 6x16 multiply-add block both run their
 * products on, and an 8x8 transpose (also the bf16 packs', tensor/gemm_bf16.c
 * and tensor/gemm_dpbf16.c). Include only where x86 intrinsics build
 * (both files guard it); each function carries its own target attribute,
 * so it inlines into callers compiled for AVX2 or more. */
#ifndef EMBER_AVX2_IMPL_H
#define EMBER_AVX2_IMPL_H

#include <immintrin.h>
#include <stdint.h>

/* 8x8 transpose of r[0..8) in place: r[i] lane j becomes r[j] lane i */
__attribute__((target("avx2"))) static inline void transpose8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* the same transpose of 8 rows of 8 32-bit integers (bf16 pairs): the float
 * shuffles only move bits */
__attribute__((target("avx2"))) static inline void transpose8_u32(__m256i x[8])
{
    __m256 r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_castsi256_ps(x[i]);
    transpose8(r);
    for (int i = 0; i < 8; i++) x[i] = _mm256_castps_si256(r[i]);
}

/* The register block of a 6x16 GEMM micro-kernel: for r < mr (<= 6),
 *   acc[2r] = sum_{k<K} a[r ars + k aks] * b[k ldb + 0:8)
 *   acc[2r+1] = the same for b[k ldb + 8:16) (nv = 2; nv = 1: not touched)
 * each a broadcast times b's vectors, multiply-adds in k order. a is read
 * through two strides, so a packed panel (ars 1, aks 6) and a matrix read
 * where it lies (rows or columns) are the same call. Meant to be inlined
 * with mr and nv constant: the 12 sums are named variables, which gcc keeps
 * in registers (an array of them it spilled at every k). */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
fma_block(int mr, int nv, int64_t K, const float *a, int64_t ars, int64_t aks, const float *b, int64_t ldb,
          __m256 acc[12])
{
    __m256 z = _mm256_setzero_ps();
    __m256 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z,
           c51 = z;
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++) {
        const float *ak = a + k * aks;
        __m256 b0 = _mm256_loadu_ps(b + k * ldb), b1 = nv > 1 ? _mm256_loadu_ps(b + k * ldb + 8) : z, x;
#define EM_FMA_ROW(r)                                                                                        \
    if (mr > r) {                                                                                            \
        x = _mm256_broadcast_ss(ak + r * ars);                                                               \
        c##r##0 = _mm256_fmadd_ps(x, b0, c##r##0);                                                           \
        if (nv > 1) c##r##1 = _mm256_fmadd_ps(x, b1, c##r##1);                                               \
    }
        EM_FMA_ROW(0) EM_FMA_ROW(1) EM_FMA_ROW(2) EM_FMA_ROW(3) EM_FMA_ROW(4) EM_FMA_ROW(5)
#undef EM_FMA_ROW
    }
    acc[0] = c00, acc[1] = c01, acc[2] = c10, acc[3] = c11, acc[4] = c20, acc[5] = c21;
    acc[6] = c30, acc[7] = c31, acc[8] = c40, acc[9] = c41, acc[10] = c50, acc[11] = c51;
}

#endif
