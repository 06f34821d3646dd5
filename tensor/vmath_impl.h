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

/* e^x / 2 for x in [-87, 88.72], the core of vexpf: x = k ln2 + r with
 * |r| <= ln2/2, e^r by its degree-7 Taylor polynomial, 2^(k-1) built in the
 * exponent bits (halved so that k = 128 stays finite). Where k = -126 (x
 * below about -86.99) the exponent bits are 0 and so is the result; NaN
 * stays NaN. Callers clamp x into the range first. */
static inline float vexpf_half(float xc)
{
    /* k = round(x / ln2) by adding and removing 1.5*2^23 (rintf does not vectorise) */
    float k = (xc * 1.44269504f + 12582912.0f) - 12582912.0f; /* in [-126, 128] */
    /* r = x - k ln2, with ln2 split into a part exact in few bits and the rest */
    float r = xc - k * 0.693359375f + k * 2.12194440e-4f;
    float p =
        1.0f +
        r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                                     r * (4.1666668e-2f +
                                          r * (8.3333338e-3f + r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    /* 2^(k-1); shifted unsigned, as a NaN's k converts to INT_MIN (on x86) */
    uint32_t bits = (uint32_t)((int32_t)k + 126) << 23;
    float half_scale;
    memcpy(&half_scale, &bits, sizeof half_scale);
    return p * half_scale;
}

/* e^x by vexpf_half: within 2 ulp of expf. Below -86.99 it returns 0 (no
 * subnormals; expf is under 1.7e-38 there), above 88.72 inf (expf within
 * 0.3% of FLT_MAX); NaN stays NaN. */
static inline float vexpf(float x)
{
    float xc = x < -87.0f ? -87.0f : x > 88.72f ? 88.72f : x;
    float v = vexpf_half(xc) * 2.0f;
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

/* Phi(x), the standard normal distribution function P(N(0,1) <= x), and
 * into *pdf its density phi(x) = e^(-x^2/2) / sqrt(2 pi): the exact GELU's
 * x Phi(x) and its derivative Phi(x) + x phi(x) (elementwise_formulas.h).
 *
 * One exponential serves both, and no erf: with a = |x|, the tail is
 * Phi(-a) = e^(-a^2/2) R(a), where R(a) = erfcx(a/sqrt 2)/2 falls slowly
 * from 1/2 at 0 like 1/(a sqrt(2 pi)). R is written as t S(t) with
 * t = 1/(1 + 0.304 a) and S a degree-7 polynomial, fitted to R for least
 * relative error over a in [0, 13.2] (1.0e-7 in exact arithmetic with
 * these float coefficients; doubled here, as vexpf_half gives e^(-a^2/2)/2).
 * Then Phi(x) is Phi(-a) for x < 0 and 1 - Phi(-a) otherwise, so the
 * negative tail keeps its relative accuracy instead of cancelling in
 * 1 + erf. Branch-free, one division, 8 lanes with AVX2.
 *
 * Measured on every float (tests/test_unary.c holds these bounds): Phi
 * within 2.47e-7 absolute (the worst near 0, where 1 - Phi(-a) rounds),
 * Phi(-a) within 7.8e-7 relative for a <= 5 and 4.1e-6 for a <= 12.9, phi
 * within 6.1e-7 and 3.9e-6 relative (the rounding of x^2/2 feeds
 * e^(-x^2/2), more as x grows). Beyond |x| = 13.19
 * e^(-x^2/2) is 0 (as vexpf's flush), so Phi is 0 or 1 and phi 0. NaN
 * stays NaN; Phi(-inf) = 0, Phi(inf) = 1, phi(+-inf) = 0. */
static inline float vnormalf(float x, float *pdf)
{
    float a = fabsf(x), n = -0.5f * x * x;
    float eh = vexpf_half(n < -87.0f ? -87.0f : n); /* e^(-x^2/2) / 2 */
    float t = 1.0f / (1.0f + 0.304f * a);
    float s2 = 2.424692512e-1f +
               t * (2.443429679e-1f +
                    t * (2.048358172e-1f +
                         t * (2.471377850e-1f +
                              t * (-8.631841093e-2f +
                                   t * (3.844423890e-1f + t * (-3.106361032e-1f + t * 7.372638583e-2f))))));
    float q = t * s2 * eh;     /* Phi(-a) */
    *pdf = eh * 0.7978845608f; /* 2/sqrt(2 pi) */
    return x < 0 ? q : 1.0f - q;
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
