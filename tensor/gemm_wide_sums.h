/* gemm_wide_sums.h — the sums of the f32 GEMM's 6x32 micro-kernel
 * (tensor/gemm_widen.c's kernel_wide), one text compiled more than once:
 *   - by tensor/gemm_widen.c with <immintrin.h> and target("avx512f"),
 *     inlined into kernel_wide, the kernel the avx512 path runs;
 *   - by tensor/gemm_wide_emu.c against ember's emulation of the
 *     intrinsics (tensor/avx512_emu.h): gemm_wide_sums_emulated, the same
 *     text on any CPU, which the tests run the avx512 path on where the
 *     CPU lacks AVX-512F (gemm_wide_emulate_for_test);
 *   - by tests/wide_planted.c, on the emulation, with planted bugs.
 * Define WIDE_SUMS as the function's storage, attributes, return type
 * (void) and name, then include this file. No include guard: each
 * inclusion is one more copy.
 *
 * For r < WIDEN_MR: acc[2r] = sum over k < kc of a[r ars + k aks] times
 * b[k WIDEN_NR + 0:16), acc[2r+1] the same for the next panel's columns
 * (b + kc WIDEN_NR + k WIDEN_NR + 0:16): A's packed panel (ars 1, aks
 * WIDEN_MR) or six rows of A where they lie, times two adjacent packed
 * panels of B, one multiply-add per k in k order, so each
 * element has the 6x16 kernel's bits (fma_block, tensor/avx2_impl.h). The
 * twelve sums are named variables, as fma_block's are, so the compiler
 * keeps them in registers. */
WIDE_SUMS(int64_t kc, const float *a, int64_t ars, int64_t aks, const float *b, __m512 acc[2 * WIDEN_MR])
{
    const float *b1 = b + kc * WIDEN_NR;
    __m512 z = _mm512_setzero_ps();
    __m512 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z,
           c51 = z;
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        const float *ak = a + k * aks;
        __m512 x0 = _mm512_loadu_ps(b + k * WIDEN_NR), x1 = _mm512_loadu_ps(b1 + k * WIDEN_NR), x;
#define EM_FMA_ROW(r)                                                                                        \
    x = _mm512_set1_ps(ak[r * ars]);                                                                         \
    c##r##0 = _mm512_fmadd_ps(x, x0, c##r##0);                                                               \
    c##r##1 = _mm512_fmadd_ps(x, x1, c##r##1);
        EM_FMA_ROW(0) EM_FMA_ROW(1) EM_FMA_ROW(2) EM_FMA_ROW(3) EM_FMA_ROW(4) EM_FMA_ROW(5)
#undef EM_FMA_ROW
    }
    acc[0] = c00, acc[1] = c01, acc[2] = c10, acc[3] = c11, acc[4] = c20, acc[5] = c21;
    acc[6] = c30, acc[7] = c31, acc[8] = c40, acc[9] = c41, acc[10] = c50, acc[11] = c51;
}
