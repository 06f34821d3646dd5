/* dtype.c — element sizes, names, and the conversions between dtypes,
 * including f16 and bf16 (round to nearest, ties to even). */
#include "dtype_math.h"
#include "ember/runtime.h"
#include "kernel_impl.h"
#include "tensor_impl.h"

static const size_t sizes[EM_NUM_DTYPES] = {4, 8, 2, 2, 4, 1, 1};
static const char *names[EM_NUM_DTYPES] = {"f32", "f64", "f16", "bf16", "i32", "u8", "bool"};

size_t em_dtype_size(em_dtype dt) { return (unsigned)dt < EM_NUM_DTYPES ? sizes[dt] : 0; }
const char *em_dtype_name(em_dtype dt) { return (unsigned)dt < EM_NUM_DTYPES ? names[dt] : "?"; }
bool em_dtype_is_float(em_dtype dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16; }

/* The conversions themselves are dtype_math.h's, shared with the CUDA kernels. */
uint16_t em_f32_to_bf16(float x) { return f32_to_bf16_bits(x); }
float em_bf16_to_f32(uint16_t h) { return bf16_bits_to_f32(h); }
uint16_t em_f32_to_f16(float x) { return f32_to_f16_bits(x); }
float em_f16_to_f32(uint16_t h) { return f16_bits_to_f32(h); }

double ld(em_dtype dt, const void *p) { return elem_load(dt, p, 0); }
void st(em_dtype dt, void *p, double v) { elem_store(dt, p, 0, v); }

/* ---- bulk conversions: the loops mixed precision lives on ------------------------
 * bf16 <-> f32 vectorise as written (bf16_round is branch-free); f16 <-> f32 use the F16C
 * instructions (IEEE round to nearest even, subnormals exact, NaN as dtype_math.h: the
 * same bits as the scalar functions, which tests/test_scalar_math.c checks) when the CPU
 * has them, else the scalar functions. */
static void f32_to_bf16_n(uint16_t *restrict d, const float *restrict s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16_bits(s[i]);
}

static void bf16_to_f32_n(float *restrict d, const uint16_t *restrict s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) d[i] = bf16_bits_to_f32(s[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* runtime.c's cpuid, read once (clang 14 has no __builtin_cpu_supports("f16c")) */
static bool have_f16c(void) { return em_cpu_detect().f16c; }

__attribute__((target("avx,f16c"))) static void f32_to_f16_hw(uint16_t *d, const float *s, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = f32_to_f16_bits(s[i]);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_hw(float *d, const uint16_t *s, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = f16_bits_to_f32(s[i]);
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
            for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = f32_to_f16_bits(((const float *)src)[i]);
        return;
    }
    if (from == EM_F16 && to == EM_F32) {
        if (have_f16c()) f16_to_f32_hw(dst, src, n);
        else
            for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = f16_bits_to_f32(((const uint16_t *)src)[i]);
        return;
    }
    /* f64 -> f16/bf16 goes through f32, which can round twice; acceptable for
     * storage dtypes (PyTorch does the same on CPU). */
    for (int64_t i = 0; i < n; i++) st(to, (char *)dst + i * sd, ld(from, (const char *)src + i * so));
}

/* Whether dt is one of the dtypes convert_strided moves through floats */
static bool float_width(em_dtype dt) { return dt == EM_F32 || dt == EM_F16 || dt == EM_BF16; }

void convert_strided(em_dtype to, void *dst, int64_t dstride, em_dtype from, const void *src, int64_t sstride,
                     int64_t n)
{
    if (dstride == 1 && sstride == 1) {
        convert_n(to, dst, from, src, n);
        return;
    }
    size_t so = em_dtype_size(from), sd = em_dtype_size(to);
    if (!float_width(to) || !float_width(from)) {
        for (int64_t i = 0; i < n; i++)
            st(to, (char *)dst + i * dstride * (int64_t)sd,
               ld(from, (const char *)src + i * sstride * (int64_t)so));
        return;
    }
    enum { PIECE = 256 };
    float buf[PIECE];
    for (int64_t b0 = 0; b0 < n; b0 += PIECE) {
        int64_t w = n - b0 < PIECE ? n - b0 : PIECE;
        const char *sp = (const char *)src + b0 * sstride * (int64_t)so;
        char *dp = (char *)dst + b0 * dstride * (int64_t)sd;
        if (sstride == 1) {
            convert_n(EM_F32, buf, from, sp, w);
        } else if (from == EM_F32) {
            for (int64_t i = 0; i < w; i++) buf[i] = ((const float *)sp)[i * sstride];
        } else if (from == EM_BF16) {
            for (int64_t i = 0; i < w; i++) buf[i] = bf16_bits_to_f32(((const uint16_t *)sp)[i * sstride]);
        } else {
            for (int64_t i = 0; i < w; i++) buf[i] = f16_bits_to_f32(((const uint16_t *)sp)[i * sstride]);
        }
        if (dstride == 1) {
            convert_n(to, dp, EM_F32, buf, w);
        } else if (to == EM_F32) {
            for (int64_t i = 0; i < w; i++) ((float *)dp)[i * dstride] = buf[i];
        } else if (to == EM_BF16) {
            for (int64_t i = 0; i < w; i++) ((uint16_t *)dp)[i * dstride] = f32_to_bf16_bits(buf[i]);
        } else {
            for (int64_t i = 0; i < w; i++) ((uint16_t *)dp)[i * dstride] = f32_to_f16_bits(buf[i]);
        }
    }
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

bool widens_exactly(em_dtype from, em_dtype to)
{
    if (from == to) return true;
    switch (to) {
    case EM_F64: return from == EM_F32 || from == EM_F16 || from == EM_BF16;
    case EM_F32: return from == EM_F16 || from == EM_BF16;
    default: return false;
    }
}
