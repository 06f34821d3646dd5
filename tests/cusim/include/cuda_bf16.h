/* cuda_bf16.h — bfloat16 (`__nv_bfloat16`: the top half of an f32) as ember's
 * CUDA emulator serves it: float to bf16 rounds to nearest, ties to even,
 * and a NaN stays a (quiet) NaN with its sign; bf16 to float is exact.
 * C and C++. */
#ifndef EMBER_CUSIM_CUDA_BF16_H
#define EMBER_CUSIM_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f);
    operator float() const;
};
#else
typedef struct __nv_bfloat16 {
    unsigned short __x;
} __nv_bfloat16;
#endif
typedef __nv_bfloat16 nv_bfloat16;

static inline unsigned short cusim_f32_to_bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (unsigned short)((u | 0x400000u) >> 16); /* NaN: quiet, kept */
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float cusim_bf16_bits_to_f32(unsigned short b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    __nv_bfloat16 h;
    h.__x = cusim_f32_to_bf16_bits(f);
    return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return cusim_bf16_bits_to_f32(h.__x); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b)
{
    __nv_bfloat16 h;
    h.__x = b;
    return h;
}

#ifdef __cplusplus
inline __nv_bfloat16::__nv_bfloat16(float f) : __x(cusim_f32_to_bf16_bits(f)) {}
inline __nv_bfloat16::operator float() const { return cusim_bf16_bits_to_f32(__x); }
#endif

#endif
