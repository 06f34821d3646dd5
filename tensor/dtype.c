/* dtype.c — element sizes, names, and the conversions between dtypes,
 * including f16 and bf16 (round to nearest, ties to even). */
#include "ember/runtime.h"
#include "tensor_impl.h"

static const size_t sizes[EM_NUM_DTYPES] = {4, 8, 2, 2, 4, 1, 1};
static const char *names[EM_NUM_DTYPES] = {"f32", "f64", "f16", "bf16", "i32", "u8", "bool"};

size_t em_dtype_size(em_dtype dt) { return (unsigned)dt < EM_NUM_DTYPES ? sizes[dt] : 0; }
const char *em_dtype_name(em_dtype dt) { return (unsigned)dt < EM_NUM_DTYPES ? names[dt] : "?"; }
bool em_dtype_is_float(em_dtype dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16; }

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t em_f32_to_bf16(float x) { return bf16_round(f2u(x)); }

float em_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

/* f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
uint16_t em_f32_to_f16(float x)
{
    uint32_t u = f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                       /* below 2^-14: subnormal or 0 */
        /* value = a_float; f16 subnormal unit is 2^-24. Round m * 2^(e) to units. */
        if (a < 0x33000000u) return sign;         /* < 2^-25: rounds to 0 */
        uint32_t e = a >> 23;                     /* biased f32 exponent */
        uint32_t m = (a & 0x7fffffu) | 0x800000u; /* 24-bit significand */
        uint32_t shift = 126 - e;                 /* so that m >> shift is in 2^-24 units */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    /* normal: rebias exponent 127 -> 15, keep 10 of 23 mantissa bits */
    uint32_t r = a - ((127u - 15u) << 23);
    uint32_t q = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++;
    return sign | (uint16_t)q;
}

float em_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    if (e == 0x1f) return u2f(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

double ld(em_dtype dt, const void *p)
{
    switch (dt) {
    case EM_F32: return *(const float *)p;
    case EM_F64: return *(const double *)p;
    case EM_F16: return em_f16_to_f32(*(const uint16_t *)p);
    case EM_BF16: return em_bf16_to_f32(*(const uint16_t *)p);
    case EM_I32: return *(const int32_t *)p;
    case EM_U8:
    case EM_BOOL: return *(const uint8_t *)p;
    default: return NAN;
    }
}

/* Float -> int truncates toward zero and saturates (C leaves overflow undefined). */
static int32_t to_i32(double v)
{
    if (v != v) return 0;
    if (v >= 2147483647.0) return INT32_MAX;
    if (v <= -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}
static uint8_t to_u8(double v)
{
    if (v != v || v <= 0) return 0;
    if (v >= 255) return 255;
    return (uint8_t)v;
}

void st(em_dtype dt, void *p, double v)
{
    switch (dt) {
    case EM_F32: *(float *)p = (float)v; break;
    case EM_F64: *(double *)p = v; break;
    case EM_F16: *(uint16_t *)p = em_f32_to_f16((float)v); break;
    case EM_BF16: *(uint16_t *)p = em_f32_to_bf16((float)v); break;
    case EM_I32: *(int32_t *)p = to_i32(v); break;
    case EM_U8: *(uint8_t *)p = to_u8(v); break;
    case EM_BOOL: *(uint8_t *)p = v != 0; break;
    default: break;
    }
}

/* ---- bulk conversions: the loops mixed precision lives on ------------------------
 * bf16 <-> f32 vectorise as written (bf16_round is branch-free); f16 <-> f32 use the F16C
 * instructions (IEEE round to nearest even, subnormals exact) when the CPU
 * has them, else the scalar functions above. */
static void f32_to_bf16_n(uint16_t *restrict d, const float *restrict s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) d[i] = bf16_round(f2u(s[i]));
}

static void bf16_to_f32_n(float *restrict d, const uint16_t *restrict s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(&d[i], &u, 4);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
static bool have_f16c(void)
{
    static int known; /* 0 unknown, 1 yes, -1 no */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (!k) { /* runtime.c's cpuid (clang 14 has no __builtin_cpu_supports("f16c")) */
        k = em_cpu_detect().f16c ? 1 : -1;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k > 0;
}

__attribute__((target("avx,f16c"))) static void f32_to_f16_hw(uint16_t *d, const float *s, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = em_f32_to_f16(s[i]);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_hw(float *d, const uint16_t *s, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = em_f16_to_f32(s[i]);
}
#else
static bool have_f16c(void) { return false; }
static void f32_to_f16_hw(uint16_t *d, const float *s, int64_t n) { (void)d, (void)s, (void)n; }
static void f16_to_f32_hw(float *d, const uint16_t *s, int64_t n) { (void)d, (void)s, (void)n; }
#endif

void convert_n(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n)
{
    size_t so = em_dtype_size(from), sd = em_dtype_size(to);
    if (to == from) {
        memmove(dst, src, (size_t)n * so);
        return;
    }
    if (from == EM_F32 && to == EM_BF16) {
        f32_to_bf16_n(dst, src, n);
        return;
    }
    if (from == EM_BF16 && to == EM_F32) {
        bf16_to_f32_n(dst, src, n);
        return;
    }
    if (from == EM_F32 && to == EM_F16) {
        if (have_f16c()) f32_to_f16_hw(dst, src, n);
        else
            for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = em_f32_to_f16(((const float *)src)[i]);
        return;
    }
    if (from == EM_F16 && to == EM_F32) {
        if (have_f16c()) f16_to_f32_hw(dst, src, n);
        else
            for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = em_f16_to_f32(((const uint16_t *)src)[i]);
        return;
    }
    /* f64 -> f16/bf16 goes through f32, which can round twice; acceptable for
     * storage dtypes (PyTorch does the same on CPU). */
    for (int64_t i = 0; i < n; i++) st(to, (char *)dst + i * sd, ld(from, (const char *)src + i * so));
}

void fill_n(em_dtype dt, void *dst, double v, int64_t n)
{
    if (dt == EM_F32) {
        float f = (float)v;
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = f;
        return;
    }
    size_t s = em_dtype_size(dt);
    unsigned char one[8];
    st(dt, one, v);
    for (int64_t i = 0; i < n; i++) memcpy((char *)dst + (size_t)i * s, one, s);
}
