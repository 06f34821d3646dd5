/* gemm_dpbf16_kernel.h — the VDPBF16PS micro-kernel's source, one text
 * compiled more than once:
 *   - by tensor/gemm_dpbf16.c with <immintrin.h> and
 *     target("avx512f,avx512bf16"): dp_kernel_avx512, the kernel the
 *     avx512bf16 path runs;
 *   - by tensor/gemm_dpbf16_emu.c against ember's emulation of the
 *     intrinsics it calls (tensor/avx512_emu.h): dp_kernel_emulated,
 *     the same text on any CPU;
 *   - by tests/dpbf16_planted.c, on the emulation, with planted bugs.
 * Define DP_KERNEL as the function's attributes, return type and name, then
 * include this file: it defines that function with dp_kernel's parameters
 * (tensor/kernel_impl.h says what it computes). No include guard: each
 * inclusion is one more copy.
 *
 * DP_MR rows of A times 32 columns of B, held in 2 x DP_MR zmm
 * accumulators (c0: columns 0-15, c1: columns 16-31). Each k-pair p loads
 * B's two 16-column groups (16 pairs each) and broadcasts row i's pair of A
 * to all 16 lanes; VDPBF16PS then adds, in lane j, A's pair times column
 * j's pair. */
DP_KERNEL(const uint32_t *ap, const uint32_t *bp, int64_t gstride, int64_t pairs, float *acc, int64_t ldacc,
          bool accumulate)
{
    __m512 c0[DP_MR], c1[DP_MR];
    for (int i = 0; i < DP_MR; i++) {
        c0[i] = accumulate ? _mm512_loadu_ps(acc + i * ldacc) : _mm512_setzero_ps();
        c1[i] = accumulate ? _mm512_loadu_ps(acc + i * ldacc + 16) : _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < pairs; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * 16);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + gstride + p * 16);
        for (int i = 0; i < DP_MR; i++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[p * DP_MR + i]);
            c0[i] = _mm512_dpbf16_ps(c0[i], a, b0);
            c1[i] = _mm512_dpbf16_ps(c1[i], a, b1);
        }
    }
    for (int i = 0; i < DP_MR; i++) {
        _mm512_storeu_ps(acc + i * ldacc, c0[i]);
        _mm512_storeu_ps(acc + i * ldacc + 16, c1[i]);
    }
}
