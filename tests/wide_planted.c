/* wide_planted.c — the 6x32 f32 micro-kernel's sums (tensor/gemm_wide_sums.h)
 * compiled three more times on ember's emulation of its intrinsics
 * (tensor/avx512_emu.h), each with one planted bug, as
 * tests/dpbf16_planted.c does for the VDPBF16PS kernel: each bug is a macro
 * over one intrinsic, defined before the source is included and undefined
 * after, expanded inside the kernel's own text (so it may name the
 * kernel's variables); a function-like macro's name in parentheses calls
 * the emulation's function itself. */
#include "planted.h"
#include "tensor/avx512_emu.h"

/* sums_<name> from the source, and <name> storing them as a wide_sums_fn */
#define WIDE_WRAP(name)                                                                                      \
    static void name(int64_t kc, const float *a, int64_t ars, int64_t aks, const float *b,                   \
                     float out[2 * WIDEN_MR][16])                                                            \
    {                                                                                                        \
        __m512 acc[2 * WIDEN_MR];                                                                            \
        sums_##name(kc, a, ars, aks, b, acc);                                                                \
        for (int i = 0; i < 2 * WIDEN_MR; i++) _mm512_storeu_ps(out[i], acc[i]);                             \
    }

/* the second panel read where the first lies: columns 16-31 get 0-15's sums */
#define WIDE_SUMS static inline void sums_second_panel_is_the_first
#define _mm512_loadu_ps(p) (_mm512_loadu_ps)((p) >= b1 ? (p)-kc * WIDEN_NR : (p))
#include "tensor/gemm_wide_sums.h"
#undef _mm512_loadu_ps
#undef WIDE_SUMS
WIDE_WRAP(second_panel_is_the_first)

/* each row's broadcast takes the next row's value of A (the last row the first's) */
#define WIDE_SUMS static inline void sums_rows_of_a_rotated
#define _mm512_set1_ps(x)                                                                                    \
    (_mm512_set1_ps)((&(x))[&(x)-ak == (WIDEN_MR - 1) * ars ? (1 - WIDEN_MR) * ars : ars])
#include "tensor/gemm_wide_sums.h"
#undef _mm512_set1_ps
#undef WIDE_SUMS
WIDE_WRAP(rows_of_a_rotated)

/* the k loop's last step dropped (A's value taken as 0 there) */
#define WIDE_SUMS static inline void sums_last_k_dropped
#define _mm512_set1_ps(x) (_mm512_set1_ps)(k + 1 < kc ? (x) : 0.0f)
#include "tensor/gemm_wide_sums.h"
#undef _mm512_set1_ps
#undef WIDE_SUMS
WIDE_WRAP(last_k_dropped)

const planted wide_planted_sums[WIDE_PLANTED] = {
    {"the second B panel read where the first lies", .sums = second_panel_is_the_first},
    {"each row's broadcast takes the next row of A", .sums = rows_of_a_rotated},
    {"the k loop's last step dropped", .sums = last_k_dropped},
};
