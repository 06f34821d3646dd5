/* dpbf16_planted.c — the VDPBF16PS micro-kernel's own source
 * (tensor/gemm_dpbf16_kernel.h) compiled three more times on ember's
 * emulation of its intrinsics (tensor/avx512_emu.h), each time with one
 * planted bug, for tests/test_bf16_path.c. Each bug is a macro over one
 * intrinsic, defined before the source is included and undefined after:
 * it is expanded inside the kernel's own text (so it may name the
 * kernel's parameters), and the source itself carries no trace of it. A
 * function-like macro's name in parentheses calls the emulation's function
 * itself. */
#include "planted.h"
#include "tensor/avx512_emu.h"

/* the accumulators zeroed where the kernel should load them: each block of
 * K after the first drops the sums of the blocks before */
#define DP_KERNEL static void accumulators_not_loaded
#define _mm512_loadu_ps(p) _mm512_setzero_ps()
#include "tensor/gemm_dpbf16_kernel.h"
#undef _mm512_loadu_ps
#undef DP_KERNEL

/* A's pair broadcast with its halves swapped: the odd k of A meets the
 * even k of B, and the reverse */
#define DP_KERNEL static void a_pair_halves_swapped
#define _mm512_set1_epi32(x) (_mm512_set1_epi32)((int)((uint32_t)(x) << 16 | (uint32_t)(x) >> 16))
#include "tensor/gemm_dpbf16_kernel.h"
#undef _mm512_set1_epi32
#undef DP_KERNEL

/* B's two 16-column groups swapped: columns 0-15 get the sums of columns
 * 16-31 and the reverse (the first group lies at bp, the second at
 * bp + gstride) */
#define DP_KERNEL static void column_groups_swapped
#define _mm512_loadu_si512(q) (_mm512_loadu_si512)((q) < bp + gstride ? (q) + gstride : (q)-gstride)
#include "tensor/gemm_dpbf16_kernel.h"
#undef _mm512_loadu_si512
#undef DP_KERNEL

const planted dp_planted_kernels[DP_PLANTED] = {
    {"the accumulators not loaded", .kernel = accumulators_not_loaded},
    {"A's pair broadcast with its halves swapped", .kernel = a_pair_halves_swapped},
    {"B's two 16-column groups swapped", .kernel = column_groups_swapped},
};
