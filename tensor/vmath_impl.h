/* vmath_impl.h — f32 exp, tanh, sigmoid and erf written so that the
 * compiler vectorises a loop of them (libm's versions are a call per
 * element). The CPU's f32/f16/bf16 elementwise maths use them (the _f32v
 * flavour of tensor/elementwise_math.h), as do the fast paths of softmax,
 * cross-entropy and attention; f64 and the CUDA kernels use the exact
 * functions. tests/test_unary.c holds each to its libm twin within the
 * bounds stated here (measured on every float of the range). */
#ifndef EMBER_VMATH_IMPL_H
#define EMBER_VMATH_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* e^x: x = k ln2 + r with |r| <= ln2/2, e^r by its degree-7 Taylor
 * polynomial, 2^k built in the exponent bits: within 2 ulp of expf. Below
 * -86.99 it returns 0 (no subnormals; expf is under 1.7e-38 there), above
 * 88.72 inf (expf within 0.3% of FLT_MAX); NaN stays NaN. */
static inline float vexpf(float x)
{
    float xc = x < -87.0f ? -87.0f : x > 88.72f ? 88.72f : x;
    /* k = round(x / ln2) by adding and removing 1.5*2^23 (rintf does not vectorise) */
    float k = (xc * 1.44269504f + 12582912.0f) - 12582912.0f; /* in [-126, 128] */
    /* r = x - k ln2, with ln2 split into a part exact in few bits and the rest */
    float r = xc - k * 0.693359375f + k * 2.12194440e-4f;
    float p =
        1.0f +
        r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                                     r * (4.1666668e-2f +
                                          r * (8.3333338e-3f + r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    int32_t bits = ((int32_t)k + 126) << 23; /* 2^(k-1), so k = 128 stays finite */
    float half_scale;
    memcpy(&half_scale, &bits, sizeof half_scale);
    float v = p * half_scale * 2.0f;
    v = x < -87.0f ? 0.0f : v;
    v = x > 88.72f ? INFINITY : v;
    return x != x ? x : v;
}

/* tanh x = sign(x) (1 - 2/(e^{2|x|} + 1)); below |x| = 1/8 that loses
 * relative accuracy, so there its odd Taylor series to x^7 is used. Within
 * 1.2e-7 and 16 ulp of tanhf (15 just above 1/8). */
static inline float vtanhf(float x)
{
    float a = fabsf(x), x2 = x * x;
    float t = copysignf(1.0f - 2.0f / (vexpf(2.0f * a) + 1.0f), x);
    float s = x * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315))));
    return a < 0.125f ? s : t;
}

/* sigma(x) = 1 / (1 + e^-x): e^-x overflowing to inf gives exactly 0.
 * Within 1.2e-7 and (above -86.9) 4 ulp of the exact sigmoid. */
static inline float vsigmoidf(float x) { return 1.0f / (1.0f + vexpf(-x)); }

/* erf x by Abramowitz & Stegun 7.1.26: 1 - (a1 t + ... + a5 t^5) e^{-x^2}
 * with t = 1/(1 + p|x|), odd in x. The formula's error is under 1.5e-7;
 * evaluated in f32 it is within 5.1e-7 of erff (the worst near 0, where
 * 1 - poly e^{-x^2} cancels; relative to |x| there it is large, but the
 * GELU that uses it multiplies by x). */
static inline float verff(float x)
{
    float a = fabsf(x), t = 1.0f / (1.0f + 0.3275911f * a);
    float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    return copysignf(1.0f - poly * vexpf(-a * a), x);
}

/* vexpf on 8 lanes with AVX2+FMA, for kernels that check the CPU first
 * (em_cpu_detect) and carry the same target attribute: the same steps, so
 * the same bounds (within 2 ulp of expf; 0 below -87, inf above 88.72, NaN
 * kept). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#include <immintrin.h>

__attribute__((target("avx2,fma"))) static inline __m256 vexpf8_avx2(__m256 x)
{
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.72f));
    __m256 big = _mm256_set1_ps(12582912.0f);
    __m256 k = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504f), big), big);
    __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(2.12194440e-4f),
                               _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc));
    __m256 p = _mm256_set1_ps(1.9841270e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3888889e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3333338e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1666668e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666667e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(126)), 23);
    __m256 v = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), _mm256_set1_ps(2.0f));
    v = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ), v);
    v = _mm256_blendv_ps(v, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(88.72f), _CMP_GT_OQ));
    return _mm256_blendv_ps(v, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
#endif

#endif
