/* gemm_wide_emu.c — gemm_wide_sums_emulated: the 6x32 f32 micro-kernel's
 * sums (tensor/gemm_wide_sums.h, the text kernel_wide inlines) compiled
 * against ember's emulation of the AVX-512 intrinsics it calls
 * (tensor/avx512_emu.h), so the avx512 path runs on a CPU without AVX-512F
 * in the tests (gemm_wide_emulate_for_test). The emulation's multiply-add
 * is fmaf, rounded once as VFMADD231PS rounds, so the emulated path must
 * give the 6x16 kernel's bits exactly as the native one does; what it
 * verifies is the data movement (which B panel each half reads, which row
 * of A each broadcast takes, where each sum goes), the pairing of panels in
 * gemm_widen.c's blocking and the stores after it.
 *
 * This file must not include <immintrin.h>: the emulation defines the same
 * names. */
#include "avx512_emu.h"
#include "kernel_impl.h"

#define WIDE_SUMS static inline void sums
#include "gemm_wide_sums.h"
#undef WIDE_SUMS

void gemm_wide_sums_emulated(int64_t kc, const float *a, int64_t ars, int64_t aks, const float *b,
                             float out[2 * WIDEN_MR][16])
{
    __m512 acc[2 * WIDEN_MR];
    sums(kc, a, ars, aks, b, acc);
    for (int i = 0; i < 2 * WIDEN_MR; i++) _mm512_storeu_ps(out[i], acc[i]);
}
