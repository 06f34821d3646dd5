/* gemm_dpbf16_emu.c — dp_kernel_emulated: the VDPBF16PS micro-kernel's own
 * source (tensor/gemm_dpbf16_kernel.h, the text dp_kernel_avx512 is
 * compiled from) compiled against ember's emulation of its intrinsics
 * (tensor/avx512_emu.h), so it runs on a CPU without AVX-512.
 *
 * The tests hold it to the scalar model bit for bit (same arithmetic:
 * the emulated VDPBF16PS computes each lane with the model's dpbf16_lane),
 * and run the whole avx512bf16 path on it (gemm_dpbf16_use_kernel_for_test,
 * tests/test_bf16_path.c). That executes the kernel's data movement and the
 * path's blocking, threading and dispatch; the instruction's own rounding
 * and speed only a CPU with AVX512-BF16 shows (avx512_emu.h says why).
 *
 * This file must not include <immintrin.h>: the emulation defines the same
 * names. */
#include "avx512_emu.h"
#include "kernel_impl.h"

#define DP_KERNEL static void emulated
#include "gemm_dpbf16_kernel.h"
#undef DP_KERNEL

const dp_kernel dp_kernel_emulated = emulated;
