/* avx512_emu.h — ember's own emulation of the AVX-512 types and
 * intrinsics two micro-kernels use: VDPBF16PS's (tensor/gemm_dpbf16_kernel.h)
 * and the f32 GEMM's 6x32 block (tensor/gemm_wide_sums.h), in C that runs
 * on any CPU, as the CUDA emulator (tests/cusim) runs the .cu sources on
 * the host. A file includes this instead of <immintrin.h>, never beside it
 * (it defines the same names), then a kernel's source:
 * tensor/gemm_dpbf16_emu.c (dp_kernel_emulated), tensor/gemm_wide_emu.c
 * (gemm_wide_sums_emulated)
 * and tests/dpbf16_planted.c, tests/wide_planted.c (the same sources with
 * planted bugs). For the 6x32 block the emulation is exact:
 * _mm512_fmadd_ps is fmaf in each lane, one rounding, as the instruction
 * rounds.
 *
 * What running the kernel here verifies: its data movement. Each intrinsic
 * moves data as Intel defines it: 64-byte unaligned loads and stores, a
 * 32-bit value broadcast to all 16 lanes, vector casts that reinterpret
 * the same 64 bytes (as they do in gcc and clang, whose __m512 types are
 * vectors like these), and VDPBF16PS reading the bf16 pair of 32-bit lane
 * j. A kernel that gives the model's bits here sends the right pair to the
 * right lane, broadcasts A's pair, covers both 16-column groups, loads the
 * accumulators when asked and stores them where they belong. What it does
 * not verify: _mm512_dpbf16_ps's arithmetic here is the model's
 * (dpbf16_lane, tensor/gemm_dpbf16.c), which tests/test_bf16_path.c checks
 * against the SDM's text; whether the instruction itself rounds that way,
 * and how fast it runs, only a CPU that has it can tell.
 *
 * gcc warns (-Wpsabi) at a function that returns a 64-byte vector on a CPU
 * without AVX-512F: its calling convention would differ from an AVX-512
 * build's. Everything here is static inline, never called across object
 * files, so the warning is turned off for the rest of the including file;
 * the intrinsics that take vectors are macros that pass them as
 * one-element arrays, because gcc also prints a note (which no pragma
 * silences) at every function with a 64-byte vector parameter. */
#ifndef EMBER_AVX512_EMU_H
#define EMBER_AVX512_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernel_impl.h"

#if defined(_IMMINTRIN_H_INCLUDED) || defined(__IMMINTRIN_H)
#error "avx512_emu.h defines the intrinsics <immintrin.h> declares: include one of them"
#endif

#pragma GCC diagnostic ignored "-Wpsabi"

/* The types: 64-byte vectors with the real ones' element types (a bf16 as
 * its 16 bits). */
typedef float __m512 __attribute__((vector_size(64)));
typedef long long __m512i __attribute__((vector_size(64)));
typedef uint16_t __m512bh __attribute__((vector_size(64)));
typedef int32_t emu_v16si __attribute__((vector_size(64))); /* 16 lanes of 32 bits */

static inline __m512 _mm512_setzero_ps(void) { return (__m512){0}; }

/* 16 floats from p, any alignment */
static inline __m512 _mm512_loadu_ps(const float *p)
{
    __m512 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* 64 bytes from p, any alignment */
static inline __m512i _mm512_loadu_si512(const void *p)
{
    __m512i v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* x in each of the 16 lanes */
static inline __m512 _mm512_set1_ps(float x)
{
    __m512 v;
    for (int j = 0; j < 16; j++) v[j] = x;
    return v;
}

/* a * b + c in each lane, rounded once (VFMADD) */
#define _mm512_fmadd_ps(a, b, c)                                                                             \
    emu_fmadd_ps((const __m512[1]){a}, (const __m512[1]){b}, (const __m512[1]){c})
static inline __m512 emu_fmadd_ps(const __m512 *a, const __m512 *b, const __m512 *c)
{
    __m512 r;
    for (int j = 0; j < 16; j++) r[j] = fmaf((*a)[j], (*b)[j], (*c)[j]);
    return r;
}

/* x in each of the 16 32-bit lanes */
static inline __m512i _mm512_set1_epi32(int x)
{
    emu_v16si v;
    for (int j = 0; j < 16; j++) v[j] = x;
    return (__m512i)v;
}

/* v's 16 floats to p, any alignment */
#define _mm512_storeu_ps(p, v) emu_storeu_ps((p), (const __m512[1]){v})
static inline void emu_storeu_ps(float *p, const __m512 *v) { memcpy(p, v, sizeof *v); }

/* VDPBF16PS as the SDM writes it: 32-bit lane j of a and of b holds a pair
 * of bf16 (element 0 in the low half, element 1 in the high); lane j of
 * the result is lane j of src plus the pairs' products, computed as the
 * model computes one lane (odd product first, each add rounded, DAZ/FTZ) */
#define _mm512_dpbf16_ps(src, a, b)                                                                          \
    emu_dpbf16_ps((const __m512[1]){src}, (const __m512bh[1]){a}, (const __m512bh[1]){b})
static inline __m512 emu_dpbf16_ps(const __m512 *src, const __m512bh *a, const __m512bh *b)
{
    emu_v16si a32 = (emu_v16si)*a, b32 = (emu_v16si)*b;
    __m512 r;
    for (int j = 0; j < 16; j++) {
        uint32_t x = (uint32_t)a32[j], y = (uint32_t)b32[j];
        r[j] = dpbf16_lane((*src)[j], (uint16_t)x, (uint16_t)(x >> 16), (uint16_t)y, (uint16_t)(y >> 16));
    }
    return r;
}

#endif
