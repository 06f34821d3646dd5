/* dtype_math.h — one element converted between dtypes, written once for the
 * CPU and for CUDA devices (EM_HD, tensor/hd.h). The CPU's users:
 * tensor/dtype.c (em_f32_to_f16 and friends, ld/st, the bulk conversions'
 * scalar loops), tensor/gemm_bf16.c (bf16_round); the device's:
 * tensor/cuda_common.cuh (load/store, so every kernel) and the attention
 * kernels' f16/bf16 operands (tensor/ops_matmul.cu).
 *
 * f16 (1 sign, 5 exponent bits, bias 15, 10 mantissa bits) and bf16 (the top
 * half of an f32) round to nearest, ties to even, through subnormals to zero
 * and up to infinity. A NaN stays a quiet NaN with its sign and the top bits
 * of its payload: the rule of the x86 F16C instructions, so tensor/dtype.c's
 * F16C fast path and these functions give the same bits for every input
 * (tests/test_scalar_math.c). Float to integer truncates toward zero and
 * saturates, NaN to 0. */
#ifndef EMBER_DTYPE_MATH_H
#define EMBER_DTYPE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ember/tensor.h"
#include "hd.h"

static inline EM_HD uint32_t f32_as_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline EM_HD float bits_as_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f32 bits -> bf16 bits: round the dropped 16 bits to nearest even; a NaN
 * is made quiet instead of rounding into inf. Branch-free, so loops over it
 * vectorise. */
static inline EM_HD uint16_t bf16_round(uint32_t u)
{
    uint32_t r = u + 0x7fffu + ((u >> 16) & 1), q = u | 0x400000u;
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u ? q : r) >> 16);
}
static inline EM_HD uint16_t f32_to_bf16_bits(float x) { return bf16_round(f32_as_bits(x)); }
static inline EM_HD float bf16_bits_to_f32(uint16_t h) { return bits_as_f32((uint32_t)h << 16); }

static inline EM_HD uint16_t f32_to_f16_bits(float x)
{
    uint32_t u = f32_as_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN: quiet, payload kept */
    if (a >= 0x477ff000u) return sign | 0x7c00u;                  /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                        /* below 2^-14: subnormal or 0 */
        /* f16 subnormals count units of 2^-24: round the 24-bit significand
         * shifted to those units */
        if (a < 0x33000000u) return sign;         /* < 2^-25: rounds to 0 */
        uint32_t e = a >> 23;                     /* biased f32 exponent */
        uint32_t m = (a & 0x7fffffu) | 0x800000u; /* 24-bit significand */
        uint32_t shift = 126 - e;                 /* so that m >> shift is in 2^-24 units */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++; /* may carry into the smallest normal: right */
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent 127 -> 15, keep 10 of 23 mantissa bits (a carry
     * into the exponent is right, up to inf) */
    uint32_t r = a - ((127u - 15u) << 23);
    uint32_t q = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

/* exact; a NaN comes back quiet with its payload */
static inline EM_HD float f16_bits_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_as_f32(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0));
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    return bits_as_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline EM_HD int32_t f64_to_i32_sat(double v)
{
    if (v != v) return 0;
    if (v >= 2147483647.0) return INT32_MAX;
    if (v <= -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}
static inline EM_HD uint8_t f64_to_u8_sat(double v)
{
    if (v != v || v <= 0) return 0;
    if (v >= 255) return 255;
    return (uint8_t)v;
}

/* Element i of a buffer of dtype dt, as double (exact for every dtype; a
 * bool is its byte as stored); NaN for a dtype that is not one. */
static inline EM_HD double elem_load(em_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case EM_F32: return ((const float *)p)[i];
    case EM_F64: return ((const double *)p)[i];
    case EM_F16: return f16_bits_to_f32(((const uint16_t *)p)[i]);
    case EM_BF16: return bf16_bits_to_f32(((const uint16_t *)p)[i]);
    case EM_I32: return ((const int32_t *)p)[i];
    case EM_U8:
    case EM_BOOL: return ((const uint8_t *)p)[i];
    case EM_NUM_DTYPES: break;
    }
    return NAN;
}

/* v into element i of dtype dt: f16/bf16 round from f32 (so an f64 value
 * rounds twice, as PyTorch's CPU casts do), integers truncate and saturate,
 * bool is v != 0; nothing for a dtype that is not one. */
static inline EM_HD void elem_store(em_dtype dt, void *p, int64_t i, double v)
{
    switch (dt) {
    case EM_F32: ((float *)p)[i] = (float)v; break;
    case EM_F64: ((double *)p)[i] = v; break;
    case EM_F16: ((uint16_t *)p)[i] = f32_to_f16_bits((float)v); break;
    case EM_BF16: ((uint16_t *)p)[i] = f32_to_bf16_bits((float)v); break;
    case EM_I32: ((int32_t *)p)[i] = f64_to_i32_sat(v); break;
    case EM_U8: ((uint8_t *)p)[i] = f64_to_u8_sat(v); break;
    case EM_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case EM_NUM_DTYPES: break;
    }
}

#endif
