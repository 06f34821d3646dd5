/* cuda_fp16.h — IEEE binary16 (`__half`) as ember's CUDA emulator serves it:
 * a 16-bit value with the exact conversions a GPU performs (float to half
 * rounds to nearest, ties to even, through subnormals to zero and up to
 * infinity; a NaN becomes the canonical NaN 0x7fff, as the hardware's
 * cvt.rn.f16.f32 gives; half to float is exact). C and C++. */
#ifndef EMBER_CUSIM_CUDA_FP16_H
#define EMBER_CUSIM_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

typedef struct __half_raw {
    unsigned short x;
} __half_raw;

#ifdef __cplusplus
struct __half {
    unsigned short __x;
    __half() = default;
    constexpr __half(__half_raw r) : __x(r.x) {}
    __half(float f);
    operator float() const;
};
typedef __half half;
#else
typedef struct __half {
    unsigned short __x;
} __half;
#endif

/* f32 bits -> f16 bits, round to nearest even */
static inline unsigned short cusim_f32_to_f16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    unsigned short sign = (unsigned short)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7fff;          /* NaN: the canonical one */
    if (u >= 0x477ff000u) return sign | 0x7c00u; /* |f| >= 65520 rounds to infinity */
    if (u >= 0x38800000u) {                      /* a normal half: |f| >= 2^-14 */
        uint32_t h = ((u >> 23) - 127 + 15) << 10 | (u & 0x7fffffu) >> 13, rest = u & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++; /* a carry into the exponent is right */
        return (unsigned short)(sign | h);
    }
    if (u < 0x33000000u) return sign; /* below 2^-25: zero */
    /* a subnormal half: f in units of 2^-24 is mant24 >> (126 - exponent) */
    uint32_t mant = (u & 0x7fffffu) | 0x800000u, shift = 126 - (u >> 23);
    uint32_t h = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1))) h++; /* may round up to the smallest normal: right */
    return (unsigned short)(sign | h);
}

/* f16 bits -> f32, exact */
static inline float cusim_f16_bits_to_f32(unsigned short h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        float f = (float)m * 0x1p-24f; /* zero or subnormal: exact in f32 */
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7f800000u | m << 13; /* infinity, or NaN with its payload */
    } else {
        u = sign | (e - 15 + 127) << 23 | m << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline __half cusim_half_from_bits(unsigned short b)
{
    __half h;
    h.__x = b;
    return h;
}

static inline __half __float2half_rn(float f) { return cusim_half_from_bits(cusim_f32_to_f16_bits(f)); }
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float __half2float(__half h) { return cusim_f16_bits_to_f32(h.__x); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short b) { return cusim_half_from_bits(b); }
static inline short __half_as_short(__half h) { return (short)h.__x; }
static inline __half __short_as_half(short b) { return cusim_half_from_bits((unsigned short)b); }

#ifdef __cplusplus
inline __half::__half(float f) : __x(cusim_f32_to_f16_bits(f)) {}
inline __half::operator float() const { return cusim_f16_bits_to_f32(__x); }
#endif

#endif
