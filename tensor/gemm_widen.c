/* gemm_widen.c — bf16/f16 products in f32 on AVX2+FMA CPUs without a bf16
 * multiplier: the packing step of a BLAS-style GEMM widens the operands to
 * f32 as it copies them, so a low-precision product reads half the bytes
 * of an f32 one and makes no other pass over its operands. An operand
 * stored in f32 (an f32 weight under autocast) is rounded to the low dtype
 * as it is packed instead: the values a cast would have made, without the
 * cast's pass over it (docs/ARCHITECTURE.md "Mixed precision").
 *
 * A BLAS GEMM already copies ("packs") blocks of both operands into the
 * order its micro-kernel reads them; sgemm's packing reads f32, this one
 * reads bf16 or f16 and writes the same f32 panels. Blocks (per thread):
 *   NC columns of op(B), KC deep, packed in panels of NR = 16 columns
 *     (k-major: 16 consecutive floats per k);
 *   MC rows of op(A), KC deep, packed in panels of MR = 6 rows;
 *   the micro-kernel keeps a 6x16 block of C in 12 ymm registers.
 * With K <= KONE a block of C is final after one pass and is rounded to
 * the low dtype as the micro-kernel stores it; a deeper K accumulates in an
 * f32 block of C, and its last KC step adds its sums to that block's and
 * rounds them on their way out of the registers. A C stored in f32 holds
 * the same rounded values, or has them added to it (gemm_low_dtypes.add).
 * A bias (a Linear's) is added to an f32 C's final values in registers as
 * they are stored. Only the blocks at C's edges go through a 6x16 scratch
 * tile. */
#include <stdlib.h>
#include <string.h>

#include "dtype_math.h"
#include "ember/runtime.h"
#include "kernel_impl.h"
#include "tensor_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define EM_WIDEN_BUILD 1
#include "avx2_impl.h"
#else
#define EM_WIDEN_BUILD 0
#endif

bool gemm_widen_usable(void)
{
    em_cpu_features f = em_cpu_detect();
    return EM_WIDEN_BUILD && f.avx2 && f.fma && f.f16c;
}

/* tests: the 6x32 kernel's sums on an emulation (gemm_wide_emulate_for_test) */
static wide_sums_fn wide_test_sums;

void gemm_wide_emulate_for_test(wide_sums_fn fn)
{
    __atomic_store_n(&wide_test_sums, fn, __ATOMIC_RELEASE);
    gemm_f32_path_reset();
}

bool gemm_wide_usable(void)
{
    return gemm_widen_usable() &&
           (em_cpu_detect().avx512f || __atomic_load_n(&wide_test_sums, __ATOMIC_ACQUIRE) != NULL);
}

bool gemm_wide_now(void) { return gemm_wide_usable() && gemm_f32_path_chosen() != F32_PATH_AVX2; }

#if EM_WIDEN_BUILD

/* micro-kernel rows and columns; blocks of rows, depth and columns (NCD:
 * columns when K takes several KC steps); the deepest K taken in one step
 * (KONE); rows summed over K together */
enum { MR = WIDEN_MR, NR = WIDEN_NR, MC = 144, KC = 256, KONE = 512, NC = 3072, NCD = 256, MSUM = 1024 };

#define TARGET __attribute__((target("avx2,fma,f16c")))

/* How an operand is read: its low-precision values widened (bf16 or f16),
 * or f32 values rounded to the low dtype and widened back (f32), or (exact:
 * an f32 product, gemm_f32_own) f32 values as they are. */
typedef struct src {
    bool f16;   /* the product's dtype is f16 (else bf16) */
    bool f32;   /* the operand is stored in f32 */
    bool exact; /* an f32 product: nothing is rounded */
    bool z;     /* the CPU has AVX-512F: an f32 B rounded 16 floats at a time (pack_b_panel16) */
} src;

/* 8 floats rounded to bf16 as bf16_round does (nearest even; a NaN stays a
 * quiet NaN with its sign and top payload bits), as 8 32-bit lanes holding
 * the bf16 in their top half */
TARGET static inline __m256i round8_bf16_hi(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                 _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
    __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q); /* all ones where x is a NaN */
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
}

/* 8 floats as the low dtype holds them (rounded once, widened back) */
TARGET static inline __m256 keep8(bool f16, __m256 x)
{
    if (f16) return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    return _mm256_castsi256_ps(_mm256_and_si256(round8_bf16_hi(x), _mm256_set1_epi32((int)0xffff0000u)));
}

/* the 8 values from element i of p as 8 floats */
TARGET static inline __m256 load8(src s, const void *p, int64_t i)
{
    if (s.f32) {
        __m256 x = _mm256_loadu_ps((const float *)p + i);
        return s.exact ? x : keep8(s.f16, x);
    }
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (s.f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the n (< 8) values from element i of p as 8 floats, zero past n */
TARGET static inline __m256 load8_part(src s, const void *p, int64_t i, int64_t n)
{
    union {
        float f[8];
        uint16_t h[8];
    } t = {{0}};
    for (int64_t j = 0; j < n; j++)
        if (s.f32)
            t.f[j] = ((const float *)p)[i + j];
        else
            t.h[j] = ((const uint16_t *)p)[i + j];
    return load8(s, &t, 0);
}

/* one float as the low dtype holds it (f16: F16C's scalar conversions,
 * keep8's bits; dtype_math.h's f16 conversions in C, branch by branch, made
 * the packs' edges a third of the tiny GPT's fp16 pack time) */
TARGET static inline float keep1(bool f16, float x)
{
    return f16 ? _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)) : bf16_bits_to_f32(f32_to_bf16_bits(x));
}

/* element i of p as a float */
TARGET static inline float load1(src s, const void *p, int64_t i)
{
    if (s.f32) return s.exact ? ((const float *)p)[i] : keep1(s.f16, ((const float *)p)[i]);
    uint16_t h = ((const uint16_t *)p)[i];
    return s.f16 ? _cvtsh_ss(h) : bf16_bits_to_f32(h);
}

/* asks for the cache line of element i of p ahead of its load. B's
 * packing when it walks down the rows of B (K,N) (one line per row, a row
 * apart: dX = g @ W) asks PF rows ahead. Measured side by side: dX 1.0-1.05x
 * with operands fresh from memory, and no loss with them in cache. The same
 * in A^T's packing (dW = g^T @ x) gained 1.04-1.23x with fresh operands but
 * lost 8-10% with operands in cache (the tiny GPT's dW products went from
 * 0.98-1.16x sgemm to 0.86-0.99x), and a whole step could not tell the two
 * apart, so it is not done; nor in the transposing packs (no gain). */
enum { PF = 8 };
static inline void prefetch1(src s, const void *p, int64_t i)
{
    __builtin_prefetch((const char *)p + i * (s.f32 ? 4 : 2), 0, 3);
}

/* ---- AVX-512F: B's panels rounded 16 floats at a time ----
 * Rounding an f32 operand to bf16 takes 8 instructions a vector, as many
 * for 16 floats in a zmm as for 8 in a ymm. B's packing, where it rounds
 * (an f32 weight under autocast on the f32 path), does so here in zmm
 * registers on CPUs with AVX-512F: the same values (keep8's rule per lane;
 * f16 by the same conversion instructions), the same panels. bench_ab,
 * bf16 on the f32 path (Zen 5): the tiny step 0.979x the time, 124M
 * 0.950x; fp16 tiny 0.990x. Tried and not kept: A's packing so (its
 * six-row transposes from 16 k's, its transposed panels two k's to a zmm:
 * the tiny step 0.997x and 1.006x, 124M 0.992x), an f32 product's B
 * read 16 at a time without rounding (tiny 0.989x, 124M 1.031x), and the
 * 6x32 kernel rounding its sums 16 to a zmm before they are put (tiny
 * 0.994x and 1.003x, 124M 1.022x and 1.009x); keep16 with the lsb tested
 * into a mask and added under it (6 instructions a zmm instead of 7),
 * together with pack_a_rows 16 at a time (tiny 0.998x and 0.993x, 124M
 * 1.001x: noise). */
#define TARGET512 __attribute__((target("avx512f,avx2,fma,f16c")))

/* 16 floats as the low dtype holds them (keep8's rule, 16 lanes) */
TARGET512 static inline __m512 keep16(bool f16, __m512 x)
{
    if (f16) return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q); /* a NaN: quiet, its top payload kept */
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* the upper 8 floats of x */
TARGET512 static inline __m256 hi8(__m512 x)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
}

/* A whole panel (NR columns from column j of op(B)) of f32 B rounded to
 * the low dtype (f16, else bf16), rows k0..k0+kc, into d as pack_b lays it:
 * every row where B is (K,N); where B is stored (N,K), the k's in whole 16s,
 * their count returned (pack_b takes the rest). */
TARGET512 static int64_t pack_b_panel16(bool f16, bool tb, const float *B, int64_t ldb, int64_t k0,
                                        int64_t kc, int64_t j, float *d)
{
    if (!tb) {
        for (int64_t k = 0; k < kc; k++) {
            int64_t s = (k0 + k) * ldb + j;
            if (k + PF < kc) __builtin_prefetch(B + s + PF * ldb, 0, 3);
            _mm512_storeu_ps(d + k * NR, keep16(f16, _mm512_loadu_ps(B + s)));
        }
        return kc;
    }
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16)
        for (int h = 0; h < 2; h++) { /* 8 columns' 16 k's: two 8x8 blocks transposed */
            __m256 lo[8], hi[8];
            for (int c = 0; c < 8; c++) {
                __m512 v = keep16(f16, _mm512_loadu_ps(B + (j + 8 * h + c) * ldb + k0 + k));
                lo[c] = _mm512_castps512_ps256(v), hi[c] = hi8(v);
            }
            transpose8(lo);
            transpose8(hi);
            for (int q = 0; q < 8; q++) {
                _mm256_storeu_ps(d + (k + q) * NR + 8 * h, lo[q]);
                _mm256_storeu_ps(d + (k + 8 + q) * NR + 8 * h, hi[q]);
            }
        }
    return k;
}

/* op(B) rows k0..k0+kc, columns n0..n0+nc into panels of NR columns
 * (zero past nc): dst[panel][k][NR] */
TARGET static void pack_b(src sb, bool tb, const void *B, int64_t ldb, int64_t k0, int64_t kc, int64_t n0,
                          int64_t nc, float *dst)
{
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
        float *d = dst + j0 * kc;
        int64_t w = nc - j0 < NR ? nc - j0 : NR;
        bool z16 = sb.z && sb.f32 && !sb.exact && w == NR;
        int64_t k = z16 ? pack_b_panel16(sb.f16, tb, B, ldb, k0, kc, n0 + j0, d) : 0;
        if (!tb) { /* B (K,N): 16 consecutive values of row k */
            for (; k < kc; k++) {
                int64_t s = (k0 + k) * ldb + n0 + j0;
                if (k + PF < kc) prefetch1(sb, B, s + PF * ldb);
                _mm256_storeu_ps(d + k * NR, w >= 8 ? load8(sb, B, s) : load8_part(sb, B, s, w));
                _mm256_storeu_ps(d + k * NR + 8, w == NR ? load8(sb, B, s + 8)
                                                 : w > 8 ? load8_part(sb, B, s + 8, w - 8)
                                                         : _mm256_setzero_ps());
            }
            continue;
        }
        /* B stored (N,K): op(B)(k, j) = B[j][k]; 8x8 blocks transposed */
        if (w == NR)
            for (; k + 8 <= kc; k += 8)
                for (int h = 0; h < 2; h++) {
                    __m256 r[8];
                    for (int j = 0; j < 8; j++) r[j] = load8(sb, B, (n0 + j0 + 8 * h + j) * ldb + k0 + k);
                    transpose8(r);
                    for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (k + q) * NR + 8 * h, r[q]);
                }
        for (; k < kc; k++)
            for (int64_t j = 0; j < NR; j++)
                d[k * NR + j] = j < w ? load1(sb, B, (n0 + j0 + j) * ldb + k0 + k) : 0.0f;
    }
}

/* op(A) rows m0..m0+mc (of m), k0..k0+kc into panels of MR rows (zero past
 * mc): dst[panel][k][MR] */
TARGET static void pack_a(src sa, bool ta, const void *A, int64_t lda, int64_t m, int64_t m0, int64_t mc,
                          int64_t k0, int64_t kc, float *dst)
{
    for (int64_t i0 = 0; i0 < mc; i0 += MR) {
        float *d = dst + i0 * kc;
        int64_t h = mc - i0 < MR ? mc - i0 : MR;
        if (ta) { /* A stored (K,m): op(A)(r, k) = A[k][r], a panel's MR values per k side by side */
            bool wide = h == MR && m0 + i0 + 8 <= m; /* 8 loads stay inside the row */
            for (int64_t k = 0; k < kc; k++) { /* 8 values stored: the next k's store overwrites the last
                                                * 2 (dst has slack) */
                int64_t s = (k0 + k) * lda + m0 + i0;
                _mm256_storeu_ps(d + k * MR, wide ? load8(sa, A, s) : load8_part(sa, A, s, h));
            }
            continue;
        }
        int64_t k8 = 0;
        if (h == MR) /* 8 values of each row at a time, transposed to 8 k's of MR values; each store of 8
                      * overlaps the next k's (dst has slack for the last) */
            for (; k8 + 8 <= kc; k8 += 8) {
                __m256 r[8];
                for (int i = 0; i < MR; i++) r[i] = load8(sa, A, (m0 + i0 + i) * lda + k0 + k8);
                r[6] = r[7] = _mm256_setzero_ps();
                transpose8(r);
                for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (k8 + q) * MR, r[q]);
            }
        for (int64_t i = 0; i < MR; i++) {
            if (i >= h) {
                for (int64_t k = 0; k < kc; k++) d[k * MR + i] = 0.0f;
                continue;
            }
            int64_t s = (m0 + i0 + i) * lda + k0, k = k8;
            for (; k + 8 <= kc; k += 8) {
                float v[8];
                _mm256_storeu_ps(v, load8(sa, A, s + k));
                for (int q = 0; q < 8; q++) d[(k + q) * MR + i] = v[q];
            }
            for (; k < kc; k++) d[k * MR + i] = load1(sa, A, s + k);
        }
    }
}

/* op(A) rows m0..m0+mc of A (m,K), depth k0..k0+kc, each row's kc values
 * read as sa says into dst (row stride kc): A's own layout, for the 6x32
 * kernel to read as it reads an f32 A in place (A_ROWS in blocked: no
 * transposing; bench_ab tiny bf16 on the f32 path 0.990x and 0.992x the
 * time, fp16 0.985x and 0.996x, 124M 0.999x; rounding 16 to a zmm here
 * measured no better) */
TARGET static void pack_a_rows(src sa, const void *A, int64_t lda, int64_t m0, int64_t mc, int64_t k0,
                               int64_t kc, float *dst)
{
    for (int64_t r = 0; r < mc; r++) {
        int64_t s = (m0 + r) * lda + k0, k = 0;
        float *d = dst + r * kc;
        for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(d + k, load8(sa, A, s + k));
        for (; k < kc; k++) d[k] = load1(sa, A, s + k);
    }
}

/* r = a-panel @ b-panel over kc: the MR x NR block in 12 ymm registers
 * (r[2i], r[2i+1]: row i's two halves) */
TARGET static inline __attribute__((always_inline)) void sums(int64_t kc, const float *a, const float *b,
                                                              __m256 r[2 * MR])
{
    fma_block(MR, 2, kc, a, 1, MR, b, NR, r);
}

/* 8 floats rounded to 8 bf16 (round8_bf16_hi's rule) */
TARGET static inline __m128i round8_bf16(__m256 x)
{
    __m256i v = _mm256_srli_epi32(round8_bf16_hi(x), 16);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
}

/* How the micro-kernel's sums leave its registers for C: as they are
 * (PUT_F32), added to an f32 C (PUT_ADD), rounded to the low dtype and kept
 * in f32 (PUT_KEEP) or so added (PUT_KEEP_ADD), or rounded into a bf16 or
 * f16 C (PUT_LOW). Each is store_low's rule for that C, applied in
 * registers. */
typedef enum put_mode { PUT_F32, PUT_ADD, PUT_KEEP, PUT_KEEP_ADD, PUT_LOW } put_mode;

/* the mode of a product's C (sc, add), or -1 where store_low alone writes
 * it (an exact product scaled by alpha != 1) */
static int put_mode_of(src sc, bool add, float alpha)
{
    if (sc.exact) return alpha != 1.0f ? -1 : add ? PUT_ADD : PUT_F32;
    if (!sc.f32) return PUT_LOW;
    return add ? PUT_KEEP_ADD : PUT_KEEP;
}

/* 8 sums v into C at p as pm says (f16: the low dtype is f16, else bf16),
 * with the 8 values of *bias added last where given (PUT_F32, PUT_KEEP:
 * a Linear's bias, added to the value C would hold without it) */
TARGET static inline void put8(put_mode pm, bool f16, __m256 v, const __m256 *bias, char *p)
{
    float *f = (float *)p;
    switch (pm) {
    case PUT_F32: _mm256_storeu_ps(f, bias ? _mm256_add_ps(v, *bias) : v); break;
    case PUT_ADD: _mm256_storeu_ps(f, _mm256_add_ps(_mm256_loadu_ps(f), v)); break;
    case PUT_KEEP: _mm256_storeu_ps(f, bias ? _mm256_add_ps(keep8(f16, v), *bias) : keep8(f16, v)); break;
    case PUT_KEEP_ADD: _mm256_storeu_ps(f, _mm256_add_ps(_mm256_loadu_ps(f), keep8(f16, v))); break;
    case PUT_LOW:
        _mm_storeu_si128((__m128i *)p, f16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : round8_bf16(v));
        break;
    }
}

/* the 6x16 sums r into C's block at c (row stride ldc elements), each
 * added to init's (row stride ldi) first when init is given, put as pm
 * says, bias[0..2) (the block's 16 columns) added last when given; inlined
 * with pm, f16 and whether bias is given constant, so r stays in
 * registers */
TARGET static inline __attribute__((always_inline)) void put_block(put_mode pm, bool f16,
                                                                   const __m256 r[2 * MR], const float *init,
                                                                   int64_t ldi, const __m256 *bias, void *c,
                                                                   int64_t ldc)
{
    size_t es = pm == PUT_LOW ? 2 : 4;
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 2; h++) {
            __m256 v = r[2 * i + h];
            if (init) v = _mm256_add_ps(_mm256_loadu_ps(init + i * ldi + 8 * h), v);
            put8(pm, f16, v, bias ? bias + h : NULL, (char *)c + (size_t)(i * ldc + 8 * h) * es);
        }
}

/* put_block for any pm and f16, bias as given (NULL or the block's 16
 * columns): one copy of the stores per mode, each with r in registers */
TARGET static inline __attribute__((always_inline)) void put_any(put_mode pm, bool f16,
                                                                 const __m256 r[2 * MR], const float *init,
                                                                 int64_t ldi, const __m256 *bias, void *c,
                                                                 int64_t ldc)
{
    switch (pm) {
    case PUT_F32: put_block(PUT_F32, false, r, init, ldi, bias, c, ldc); break;
    case PUT_ADD: put_block(PUT_ADD, false, r, init, ldi, NULL, c, ldc); break;
    case PUT_KEEP:
        if (f16)
            put_block(PUT_KEEP, true, r, init, ldi, bias, c, ldc);
        else
            put_block(PUT_KEEP, false, r, init, ldi, bias, c, ldc);
        break;
    case PUT_KEEP_ADD:
        if (f16)
            put_block(PUT_KEEP_ADD, true, r, init, ldi, NULL, c, ldc);
        else
            put_block(PUT_KEEP_ADD, false, r, init, ldi, NULL, c, ldc);
        break;
    case PUT_LOW:
        if (f16)
            put_block(PUT_LOW, true, r, init, ldi, NULL, c, ldc);
        else
            put_block(PUT_LOW, false, r, init, ldi, NULL, c, ldc);
        break;
    }
}

/* C's MR x NR block at c (row stride ldc elements) gets (init ? init's
 * block : 0) + a-panel @ b-panel over kc, put as pm says. init (row stride
 * ldi, f32) holds the sums of the earlier KC steps; this step's sums are
 * added to it after their own k loop, as every step's are. */
TARGET static void kernel(put_mode pm, bool f16, int64_t kc, const float *a, const float *b,
                          const float *init, int64_t ldi, void *c, int64_t ldc)
{
    __m256 r[2 * MR];
    sums(kc, a, b, r);
    put_any(pm, f16, r, init, ldi, NULL, c, ldc);
}

/* rows [0,r) and the first 8 * nv columns of init's block (or 0) +
 * a-panel @ b-panel over kc, stored in f32 at out (row stride ldo): a
 * block at C's last rows (r < MR) or last columns (nv 1: at most 8 of
 * them) multiplies only those, so a part whose rows end 2 or 4 past a
 * multiple of MR (the tiny GPT's dW products of 128 and 512 rows, split
 * over two threads) or whose columns end just past a panel (its head, 65
 * columns) pays for them, not for a whole block. Each element's sums are
 * the ones kernel makes. */
TARGET static void kernel_edge(int r, int nv, int64_t kc, const float *a, const float *b, const float *init,
                               int64_t ldi, float *out, int64_t ldo)
{
    __m256 acc[2 * MR];
    /* fma_block inlined with its row and vector counts constant */
#define EM_EDGE(rows)                                                                                        \
    (nv == 1 ? fma_block(rows, 1, kc, a, 1, MR, b, NR, acc) : fma_block(rows, 2, kc, a, 1, MR, b, NR, acc))
    switch (r) {
    case 1: EM_EDGE(1); break;
    case 2: EM_EDGE(2); break;
    case 3: EM_EDGE(3); break;
    case 4: EM_EDGE(4); break;
    case 5: EM_EDGE(5); break;
    default: EM_EDGE(MR); break;
    }
#undef EM_EDGE
    for (int i = 0; i < r; i++)
        for (int h = 0; h < nv; h++) {
            __m256 v = acc[2 * i + h];
            if (init) v = _mm256_add_ps(_mm256_loadu_ps(init + i * ldi + 8 * h), v);
            _mm256_storeu_ps(out + i * ldo + 8 * h, v);
        }
}

/* a block's sums (r rows, w columns of it) in f32 at out (row stride ldo),
 * added to init's when given, by the cheapest kernel that covers them */
TARGET static inline void kernel_f32(int64_t r, int64_t w, int64_t kc, const float *a, const float *b,
                                     const float *init, int64_t ldi, float *out, int64_t ldo)
{
    if (r < MR || w <= 8)
        kernel_edge((int)r, w <= 8 ? 1 : 2, kc, a, b, init, ldi, out, ldo);
    else
        kernel(PUT_F32, false, kc, a, b, init, ldi, out, ldo);
}

/* kernel with bias (NR values) added to each row as the block is put: pm
 * PUT_F32 or PUT_KEEP (a Linear's output, in f32 or rounded under
 * autocast). Its own function, so kernel's stores stay as they were. */
TARGET static void kernel_bias(put_mode pm, bool f16, int64_t kc, const float *a, const float *b,
                               const float *init, int64_t ldi, const float *bias, void *c, int64_t ldc)
{
    __m256 r[2 * MR];
    sums(kc, a, b, r);
    __m256 bv[2] = {_mm256_loadu_ps(bias), _mm256_loadu_ps(bias + 8)};
    put_any(pm, f16, r, init, ldi, bv, c, ldc);
}

/* ---- the wide micro-kernel: AVX-512F, two panels of B at once ----------------------------
 * On a CPU with 512-bit FMA units (Zen 5) a ymm FMA does half the work a
 * zmm one does in the same slot, so the 6x16 kernel above runs at half the
 * machine's multiply-add rate. kernel_wide multiplies one A panel by two
 * adjacent B panels (B's packing is unchanged: 16 columns a panel, the
 * next panel kc * NR floats on), a 6x32 block in 12 zmm registers
 * (tensor/gemm_wide_sums.h). Each element is the same k loop of
 * multiply-adds in the same order as sums() makes, so its bits are the
 * 6x16 kernel's, and the two halves leave the registers through put_block
 * as two 6x16 blocks. */
/* the 6x32 sums of gemm_wide_sums.h, inlined into kernel_wide */
#define WIDE_SUMS TARGET512 static inline __attribute__((always_inline)) void wide_sums
#include "gemm_wide_sums.h"
#undef WIDE_SUMS

/* the 6x32 block's halves lft (its first 16 columns) and rgt put into C at
 * c (and init, bias) as two 6x16 blocks, as kernel and kernel_bias put one */
TARGET static inline __attribute__((always_inline)) void
put_wide(put_mode pm, bool f16, const __m256 lft[2 * MR], const __m256 rgt[2 * MR], const float *init,
         int64_t ldi, const float *bias, void *c, int64_t ldc)
{
    char *c2 = (char *)c + (pm == PUT_LOW ? 2 : 4) * NR;
    const float *init2 = init ? init + NR : NULL;
    if (bias) {
        __m256 bl[2] = {_mm256_loadu_ps(bias), _mm256_loadu_ps(bias + 8)},
               br[2] = {_mm256_loadu_ps(bias + 16), _mm256_loadu_ps(bias + 24)};
        put_any(pm, f16, lft, init, ldi, bl, c, ldc);
        put_any(pm, f16, rgt, init2, ldi, br, c2, ldc);
    } else {
        put_any(pm, f16, lft, init, ldi, NULL, c, ldc);
        put_any(pm, f16, rgt, init2, ldi, NULL, c2, ldc);
    }
}

/* C's MR x 2NR block at c gets (init ? init's block : 0) + A's six rows
 * (a(r,k) = a[r ars + k aks]: a packed panel, ars 1 and aks MR, or rows of
 * an f32 A where they lie) @ the two b-panels from b (kc * NR floats
 * apart), put as pm says, bias (2 NR values, or NULL) added as kernel_bias
 * adds it */
TARGET512 static void kernel_wide_native(put_mode pm, bool f16, int64_t kc, const float *a, int64_t ars,
                                         int64_t aks, const float *b, const float *init, int64_t ldi,
                                         const float *bias, void *c, int64_t ldc)
{
    __m512 s[2 * MR];
    wide_sums(kc, a, ars, aks, b, s);
    /* the left block's rows (s[2i]) and the right's (s[2i+1]) as 6x16 blocks of ymm halves */
    __m256 lft[2 * MR], rgt[2 * MR];
    for (int i = 0; i < MR; i++) {
        lft[2 * i] = _mm512_castps512_ps256(s[2 * i]), lft[2 * i + 1] = hi8(s[2 * i]);
        rgt[2 * i] = _mm512_castps512_ps256(s[2 * i + 1]), rgt[2 * i + 1] = hi8(s[2 * i + 1]);
    }
    put_wide(pm, f16, lft, rgt, init, ldi, bias, c, ldc);
}

/* kernel_wide_native's block with the sums from the tests' fn (an
 * emulation), on AVX2 alone */
TARGET static void kernel_wide_test(wide_sums_fn fn, put_mode pm, bool f16, int64_t kc, const float *a,
                                    int64_t ars, int64_t aks, const float *b, const float *init, int64_t ldi,
                                    const float *bias, void *c, int64_t ldc)
{
    float out[2 * MR][16];
    fn(kc, a, ars, aks, b, out);
    __m256 lft[2 * MR], rgt[2 * MR];
    for (int i = 0; i < MR; i++) {
        lft[2 * i] = _mm256_loadu_ps(out[2 * i]), lft[2 * i + 1] = _mm256_loadu_ps(out[2 * i] + 8);
        rgt[2 * i] = _mm256_loadu_ps(out[2 * i + 1]), rgt[2 * i + 1] = _mm256_loadu_ps(out[2 * i + 1] + 8);
    }
    put_wide(pm, f16, lft, rgt, init, ldi, bias, c, ldc);
}

static void kernel_wide(put_mode pm, bool f16, int64_t kc, const float *a, int64_t ars, int64_t aks,
                        const float *b, const float *init, int64_t ldi, const float *bias, void *c,
                        int64_t ldc)
{
    wide_sums_fn fn = __atomic_load_n(&wide_test_sums, __ATOMIC_RELAXED);
    if (fn)
        kernel_wide_test(fn, pm, f16, kc, a, ars, aks, b, init, ldi, bias, c, ldc);
    else
        kernel_wide_native(pm, f16, kc, a, ars, aks, b, init, ldi, bias, c, ldc);
}

/* rows [0,r) x cols [0,w) of the f32 block t (row stride ldt) into C,
 * rounded once to the low dtype: stored in it, or (s.f32) in f32, or
 * (add, C f32) added to C; an exact (f32) product stores alpha * t, or adds
 * it, unrounded. bias (w values, or NULL; an f32 C without add) is added
 * to each row's stored values last. */
TARGET static void store_low(src s, bool add, float alpha, const float *bias, const float *t, int64_t ldt,
                             void *C, int64_t ldc, int64_t r, int64_t w)
{
    __m256 al = _mm256_set1_ps(alpha);
    for (int64_t i = 0; i < r; i++) {
        const float *x = t + i * ldt;
        int64_t j = 0;
        if (s.exact) {
            float *d = (float *)C + i * ldc;
            for (; j + 8 <= w; j += 8) {
                __m256 v = _mm256_mul_ps(al, _mm256_loadu_ps(x + j));
                if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j));
                _mm256_storeu_ps(d + j, add ? _mm256_add_ps(_mm256_loadu_ps(d + j), v) : v);
            }
            for (; j < w; j++) {
                float v = alpha * x[j];
                if (bias) v += bias[j];
                d[j] = add ? d[j] + v : v;
            }
            continue;
        }
        if (add) {
            float *d = (float *)C + i * ldc;
            for (; j + 8 <= w; j += 8)
                _mm256_storeu_ps(d + j,
                                 _mm256_add_ps(_mm256_loadu_ps(d + j), keep8(s.f16, _mm256_loadu_ps(x + j))));
            for (; j < w; j++) d[j] += keep1(s.f16, x[j]);
            continue;
        }
        if (s.f32) {
            float *d = (float *)C + i * ldc;
            for (; j + 8 <= w; j += 8) {
                __m256 v = keep8(s.f16, _mm256_loadu_ps(x + j));
                _mm256_storeu_ps(d + j, bias ? _mm256_add_ps(v, _mm256_loadu_ps(bias + j)) : v);
            }
            for (; j < w; j++) d[j] = bias ? keep1(s.f16, x[j]) + bias[j] : keep1(s.f16, x[j]);
            continue;
        }
        uint16_t *d = (uint16_t *)C + i * ldc;
        for (; j + 8 <= w; j += 8) {
            __m256 v = _mm256_loadu_ps(x + j);
            _mm_storeu_si128((__m128i *)(d + j),
                             s.f16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : round8_bf16(v));
        }
        for (; j < w; j++) d[j] = s.f16 ? _cvtss_sh(x[j], _MM_FROUND_TO_NEAREST_INT) : f32_to_bf16_bits(x[j]);
    }
}

/* How blocked() cuts a product of n columns and depth K: K summed in one
 * step (K <= KONE) or in KC steps into an f32 block of C (deep); columns
 * in blocks of nc_max (a block of op(B) is kc_max x ncp floats, ncp: nc_max
 * rounded up to panels); nkb depth blocks and nnb column blocks. */
typedef struct geom {
    bool deep;
    int64_t kc_max, nc_max, ncp, nkb, nnb;
} geom;

static geom geom_of(int64_t n, int64_t K)
{
    geom g;
    /* K up to KONE in one step: on Zen 3 (bench_f32_paths) one step at K
     * 384-512 ran the tiny GPT's dX = g @ W of qkv and fc and fc's second
     * Linear 8-10% faster than two KC steps summed in acc; at K 768 (its
     * dW products) it gained nothing. Decided by K alone, so a product's
     * bits do not depend on how its columns are split over threads (each
     * element is summed over K in one order either way). */
    g.deep = K > KONE;
    /* a deep K sums its KC steps into an f32 block of C (up to MSUM x NCD);
     * one step past KC takes fewer columns a block, so B's block is no
     * larger than at KC */
    int64_t ncb = g.deep ? NCD : K <= KC ? NC : NC * KC / K / NR * NR;
    g.kc_max = g.deep ? KC : K;
    g.nc_max = n < ncb ? n : ncb;
    g.ncp = (g.nc_max + NR - 1) / NR * NR;
    g.nkb = (K + g.kc_max - 1) / g.kc_max;
    g.nnb = (n + g.nc_max - 1) / g.nc_max;
    return g;
}

/* a shared op(B)'s groups: GP panels of one (column block, depth block);
 * the most floats a shared op(B) takes (4 MiB: the tiny GPT's take at most
 * 384 KiB, GPT-2 124M's dW products 768 KiB) */
enum { GP = 2, SHARED_MAX = 1 << 20 };

size_t gemm_shared_b_size(int64_t n, int64_t K, int64_t *groups)
{
    geom g = geom_of(n, K);
    size_t floats = (size_t)(g.nnb * g.nkb * g.kc_max * g.ncp);
    /* Not shared: an op(B) larger than SHARED_MAX (a wide head, 512 x
     * 50257), whose parts pack at most a column block each at a time. A
     * deep K is shared whole, every KC step's block: the tiny GPT's dW
     * products (768 tokens deep, x as op(B)) made the step 0.995x the time
     * of each part packing its own block per KC step (bench_ab, three
     * pairs both ways round, f32 and bf16), 1024-2048 rows at K 768-1024
     * no different (bench_f32_paths). Alone, the proj dW (128x128x768^T,
     * 64 rows a part) reads 1.00-1.01x the unshared time alternating with
     * itself, but 0.90-0.91x sgemm against 0.93-0.94x alternating with
     * sgemm (not isolated: perhaps the half of op(B) the other core
     * packed, read after OpenBLAS's call has been through the caches). */
    if (floats > SHARED_MAX) {
        *groups = 0;
        return 0;
    }
    *groups = g.nnb * g.nkb * ((g.ncp / NR + GP - 1) / GP);
    return floats;
}

/* op(B)'s block at column block nb, depth block kb in a shared buffer */
static float *shared_block(const gemm_shared_b *sh, geom g, int64_t nb, int64_t kb)
{
    return sh->buf + (nb * g.nkb + kb) * g.kc_max * g.ncp;
}

/* tests: called by the part that claimed group q of a shared op(B), with
 * the n floats the group's panels take at dst, before it packs them
 * (gemm_shared_b_hook_for_test) */
static gemm_shared_b_hook claim_hook;

void gemm_shared_b_hook_for_test(gemm_shared_b_hook hook) { claim_hook = hook; }

/* every group of sh packed, by this part or another (gemm_shared_b):
 * claims and packs each unclaimed group, from group first on, then waits
 * for the rest */
static void pack_shared(src sb, bool tb, const void *B, int64_t ldb, int64_t n, int64_t K, geom g,
                        const gemm_shared_b *sh, int64_t first)
{
    int64_t gpb = sh->groups / (g.nnb * g.nkb); /* groups in a block */
    for (int64_t t = 0; t < sh->groups; t++) {
        int64_t q = (first + t) % sh->groups, blk = q / gpb, p0 = q % gpb * GP * NR;
        int expect = 0;
        if (__atomic_load_n(&sh->state[q], __ATOMIC_RELAXED) != 0 ||
            !__atomic_compare_exchange_n(&sh->state[q], &expect, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            continue;
        int64_t nb = blk / g.nkb, kb = blk % g.nkb, n0 = nb * g.nc_max, k0 = kb * g.kc_max;
        int64_t nc = n - n0 < g.nc_max ? n - n0 : g.nc_max, kc = K - k0 < g.kc_max ? K - k0 : g.kc_max;
        if (p0 < nc) { /* the group's panels: columns n0 + p0 .. + GP * NR of the block */
            int64_t w = nc - p0 < GP * NR ? nc - p0 : GP * NR;
            float *dst = shared_block(sh, g, nb, kb) + p0 * kc;
            if (claim_hook) claim_hook(q, sh->groups, dst, (size_t)((w + NR - 1) / NR * NR * kc));
            pack_b(sb, tb, B, ldb, k0, kc, n0 + p0, w, dst);
        }
        __atomic_store_n(&sh->state[q], 2, __ATOMIC_RELEASE);
    }
    for (int64_t q = 0; q < sh->groups; q++)
        while (__atomic_load_n(&sh->state[q], __ATOMIC_ACQUIRE) != 2) __builtin_ia32_pause();
}

/* What the blocks of one blocked() call share: C's src, add and alpha
 * (store_low's) and how a whole block leaves the registers (pm, -1:
 * through store_low). */
typedef struct blocks {
    src sc;
    bool add;
    float alpha;
    int pm;
} blocks;

/* C's block at c of r rows and w columns (one panel's at most) over kc,
 * final after this step (init: the earlier steps' sums, row stride ldi;
 * bias: its w columns or NULL): a whole block straight from the kernel's
 * registers, an edge one through scratch (row stride lds) and store_low */
static void final_block(const blocks *x, int64_t r, int64_t w, int64_t kc, const float *a, const float *b,
                        const float *init, int64_t ldi, const float *bias, float *scratch, int64_t lds,
                        void *c, int64_t ldc)
{
    if (r == MR && w == NR && x->pm >= 0) {
        if (bias)
            kernel_bias(x->pm, x->sc.f16, kc, a, b, init, ldi, bias, c, ldc);
        else
            kernel(x->pm, x->sc.f16, kc, a, b, init, ldi, c, ldc);
        return;
    }
    kernel_f32(r, w, kc, a, b, init, ldi, scratch, lds);
    store_low(x->sc, x->add, x->alpha, bias, scratch, lds, c, ldc, r, w);
}

/* Six rows of A as kernel_wide reads them (a(r,k) = a[r rs + k ks]) */
typedef struct arows {
    const float *a;
    int64_t rs, ks;
} arows;

/* How blocked() holds op(A): packed into panels of MR rows (pack_a), read
 * as A's rows where they lie (an f32 A, every block a whole 6x32 one), or
 * copied, widened or rounded, into rows of A's layout (pack_a_rows; the
 * same blocks) */
typedef enum a_form { A_PANELS, A_IN_PLACE, A_ROWS } a_form;

/* op(A)'s rows m0..m0+mc, depth k0..k0+kc, into dst as form holds them
 * (nothing: A_IN_PLACE) */
static void pack_a_as(a_form form, src sa, bool ta, const void *A, int64_t lda, int64_t m, int64_t m0,
                      int64_t mc, int64_t k0, int64_t kc, float *dst)
{
    if (form == A_ROWS)
        pack_a_rows(sa, A, lda, m0, mc, k0, kc, dst);
    else if (form == A_PANELS)
        pack_a(sa, ta, A, lda, m, m0, mc, k0, kc, dst);
}

/* rows i.. of A from depth k0 as kernel_wide reads them: where they lie
 * (A_IN_PLACE), else from pa, rows of kc values (A_ROWS) or a panel */
static arows rows_at(a_form form, int64_t kc, const void *A, int64_t lda, const float *pa, int64_t i,
                     int64_t k0)
{
    if (form == A_IN_PLACE) return (arows){(const float *)A + i * lda + k0, lda, 1};
    return form == A_ROWS ? (arows){pa, kc, 1} : (arows){pa, 1, MR};
}

/* C (m,n) = op(A) @ op(B), each operand read as its src says, stored as
 * sc and store_low say (add: added to C; alpha: an exact product's scale),
 * bias (n values or NULL; an f32 C without add) added to each row last */
static bool blocked(src sa, src sb, src sc, bool add, float alpha, const float *bias, bool ta, bool tb,
                    int64_t m, int64_t n, int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb,
                    void *C, int64_t ldc, const gemm_shared_b *shb, int64_t first, bool wide)
{
    geom g = geom_of(n, K);
    bool deep = g.deep;
    /* how a whole 6x16 block of C leaves the kernel's registers (-1: through
     * store_low); a block at C's edge goes through store_low too */
    int pm = put_mode_of(sc, add, alpha);
    blocks x = {sc, add, alpha, pm};
    size_t cs = sc.f32 ? 4 : 2;
    char *c8 = C;
    int64_t kc_max = g.kc_max, nc_max = g.nc_max, mc_max = m < MC ? m : MC;
    int64_t ncp = g.ncp, mcp = (mc_max + MR - 1) / MR * MR;
    int64_t msum = m <= MSUM ? m : MC, msp = (msum + MC - 1) / MC * MC + MR; /* acc rows, padded */
    /* An f32 A (M,K) is read where it lies, never packed, when every block
     * of C is a whole 6x32 one on kernel_wide (rows a multiple of MR, every
     * column block a multiple of 2 NR, no alpha to scale by): its six rows
     * are broadcast from A's rows as from a panel, the same values in the
     * same order, so the same bits. With zmm multiply-adds the kernel runs
     * twice as fast as with ymm, and packing A had become 7% of the tiny
     * GPT's step (perf, Zen 5). bench_ab (f32, both ways round): the tiny
     * step 0.978x and 0.987x the time, 124M 0.993x and 1.001x. A stored
     * transposed too (its columns broadcast, one k every lda floats): tiny
     * 0.97x but 124M 1.03x, slower, so a transposed A is still packed. (On
     * the 6x16 kernel, Zen 3, reading A in place had made the step slower,
     * 1.027x.) */
    bool whole = wide && !ta && pm >= 0 && m % MR == 0 && n % (2 * NR) == 0 && nc_max % (2 * NR) == 0;
    /* A read as sa says (widened, or rounded) into rows as A holds them, not
     * into panels, where every block is a whole 6x32 one: no transposing */
    a_form af = !whole ? A_PANELS : sa.exact ? A_IN_PLACE : A_ROWS;
    bool a_direct = af == A_IN_PLACE;
    size_t mark = tmp_mark();
    /* (pack_a's last store of 8 reaches 2 floats past its panel) */
    float *bp = shb ? NULL : tmp_alloc((size_t)(kc_max * ncp) * 4),
          *ap = a_direct ? NULL : tmp_alloc((size_t)(kc_max * mcp + 8) * 4);
    float *acc = deep ? tmp_alloc((size_t)(msp * ncp) * 4) : NULL;
    /* a deep K with few rows (an activation times a weight): op(A) packed
     * once for every column block, when that takes at most 16 MiB */
    int64_t nkb = (K + kc_max - 1) / kc_max, nmb = (m + mc_max - 1) / mc_max;
    bool a_once = deep && !a_direct && m <= MSUM && nkb * nmb * kc_max * mcp <= (1 << 22);
    float *aall = a_once ? tmp_alloc((size_t)(nkb * nmb * kc_max * mcp + 8) * 4) : NULL;
    float tile[MR * NR];
    if ((!shb && !bp) || (!a_direct && !ap) || (deep && !acc) || (a_once && !aall)) {
        tmp_release(mark);
        return false;
    }
    if (shb) pack_shared(sb, tb, B, ldb, n, K, g, shb, first);
    for (int64_t kb = 0; a_once && kb < nkb; kb++)
        for (int64_t mb = 0; mb < nmb; mb++) {
            int64_t k0 = kb * kc_max, kc = K - k0 < kc_max ? K - k0 : kc_max;
            int64_t m0 = mb * mc_max, mc = m - m0 < mc_max ? m - m0 : mc_max;
            pack_a_as(af, sa, ta, A, lda, m, m0, mc, k0, kc, aall + (kb * nmb + mb) * kc_max * mcp);
        }
    for (int64_t n0 = 0; n0 < n; n0 += nc_max) {
        int64_t nc = n - n0 < nc_max ? n - n0 : nc_max;
        if (!deep) { /* one KC step: B's block once, then every block of rows, each final at once */
            if (shb)
                bp = shared_block(shb, g, n0 / nc_max, 0);
            else
                pack_b(sb, tb, B, ldb, 0, K, n0, nc, bp);
            for (int64_t m0 = 0; m0 < m; m0 += mc_max) {
                int64_t mc = m - m0 < mc_max ? m - m0 : mc_max;
                pack_a_as(af, sa, ta, A, lda, m, m0, mc, 0, K, ap);
                for (int64_t j0 = 0; j0 < nc; j0 += NR) {
                    bool pair = wide && j0 + 2 * NR <= nc; /* two whole panels: kernel_wide */
                    for (int64_t i0 = 0; i0 < mc; i0 += MR) {
                        int64_t r = mc - i0 < MR ? mc - i0 : MR, w = nc - j0 < NR ? nc - j0 : NR;
                        char *cij = c8 + (size_t)((m0 + i0) * ldc + n0 + j0) * cs;
                        const float *bj = bias ? bias + n0 + j0 : NULL;
                        if (pair && r == MR && pm >= 0) { /* (every block, unless A_PANELS) */
                            arows ar = rows_at(af, K, A, lda, ap ? ap + i0 * K : NULL, m0 + i0, 0);
                            kernel_wide(pm, sc.f16, K, ar.a, ar.rs, ar.ks, bp + j0 * K, NULL, 0, bj, cij,
                                        ldc);
                            continue;
                        }
                        for (int64_t h = 0; h <= (pair ? NR : 0); h += NR)
                            final_block(&x, r, w, K, ap + i0 * K, bp + (j0 + h) * K, NULL, 0,
                                        bj ? bj + h : NULL, tile, NR, cij + h * cs, ldc);
                    }
                    if (pair) j0 += NR;
                }
            }
            continue;
        }
        /* up to MSUM rows share each packed block of B (packed once per
         * KC step, or read from the parts' shared op(B)), their sums in
         * acc; more rows take turns. The last KC step puts each block's
         * sums, added to acc's, into C. */
        for (int64_t M0 = 0; M0 < m; M0 += msum) {
            int64_t ms = m - M0 < msum ? m - M0 : msum;
            for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
                int64_t kc = K - k0 < kc_max ? K - k0 : kc_max;
                if (shb)
                    bp = shared_block(shb, g, n0 / nc_max, k0 / kc_max);
                else
                    pack_b(sb, tb, B, ldb, k0, kc, n0, nc, bp);
                for (int64_t m0 = 0; m0 < ms; m0 += mc_max) {
                    int64_t mc = ms - m0 < mc_max ? ms - m0 : mc_max;
                    const float *a = ap;
                    if (a_once) /* M0 is 0: every row is in this turn */
                        a = aall + (k0 / kc_max * nmb + m0 / mc_max) * kc_max * mcp;
                    else
                        pack_a_as(af, sa, ta, A, lda, m, M0 + m0, mc, k0, kc, ap);
                    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
                        bool pair = wide && j0 + 2 * NR <= nc, last = k0 + kc == K;
                        for (int64_t i0 = 0; i0 < mc; i0 += MR) {
                            float *sum = acc + (m0 + i0) * ncp + j0, *prev = k0 > 0 ? sum : NULL;
                            const float *ai = a ? a + i0 * kc : NULL,
                                        *bj = bp + j0 * kc; /* (a: NULL when A_IN_PLACE) */
                            int64_t r = mc - i0 < MR ? mc - i0 : MR, w = nc - j0 < NR ? nc - j0 : NR;
                            char *cij = c8 + (size_t)((M0 + m0 + i0) * ldc + n0 + j0) * cs;
                            const float *biasj = bias ? bias + n0 + j0 : NULL;
                            if (pair && r == MR && (!last || pm >= 0)) { /* (every block, unless A_PANELS) */
                                arows ar = rows_at(af, kc, A, lda, ai, M0 + m0 + i0, k0);
                                if (!last)
                                    kernel_wide(PUT_F32, false, kc, ar.a, ar.rs, ar.ks, bj, prev, ncp, NULL,
                                                sum, ncp);
                                else
                                    kernel_wide(pm, sc.f16, kc, ar.a, ar.rs, ar.ks, bj, prev, ncp, biasj, cij,
                                                ldc);
                                continue;
                            }
                            for (int64_t h = 0; h <= (pair ? NR : 0); h += NR) {
                                const float *ph = prev ? prev + h : NULL, *bh = biasj ? biasj + h : NULL;
                                if (!last)
                                    kernel_f32(r, w, kc, ai, bj + h * kc, ph, ncp, sum + h, ncp);
                                else
                                    final_block(&x, r, w, kc, ai, bj + h * kc, ph, ncp, bh, sum + h, ncp,
                                                cij + h * cs, ldc);
                            }
                        }
                        if (pair) j0 += NR;
                    }
                }
            }
        }
    }
    tmp_release(mark);
    return true;
}

bool gemm_widen(gemm_low_dtypes dt, bool ta, bool tb, int64_t m, int64_t n, int64_t K, const void *A,
                int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc, const gemm_shared_b *shb,
                int64_t first)
{
    bool f16 = dt.lo == EM_F16;
    bool z = em_cpu_detect().avx512f;
    src sa = {f16, dt.a == EM_F32, false, z}, sb = {f16, dt.b == EM_F32, false, z},
        sc = {f16, dt.c == EM_F32, false, z};
    return blocked(sa, sb, sc, dt.add, 1.0f, dt.bias, ta, tb, m, n, K, A, lda, B, ldb, C, ldc, shb, first,
                   gemm_wide_now());
}

bool gemm_f32_own(bool ta, bool tb, int64_t m, int64_t n, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, bool add, float *C, int64_t ldc, const float *bias,
                  const gemm_shared_b *shb, int64_t first)
{
    src s = {false, true, true, false};
    return blocked(s, s, s, add, alpha, bias, ta, tb, m, n, K, A, lda, B, ldb, C, ldc, shb, first,
                   gemm_wide_now());
}

#else

void gemm_shared_b_hook_for_test(gemm_shared_b_hook hook) { (void)hook; }

size_t gemm_shared_b_size(int64_t n, int64_t K, int64_t *groups)
{
    (void)n, (void)K;
    *groups = 0;
    return 0;
}

bool gemm_widen(gemm_low_dtypes dt, bool ta, bool tb, int64_t m, int64_t n, int64_t K, const void *A,
                int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc, const gemm_shared_b *shb,
                int64_t first)
{
    (void)dt, (void)ta, (void)tb, (void)m, (void)n, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C,
        (void)ldc, (void)shb, (void)first;
    return false;
}

bool gemm_f32_own(bool ta, bool tb, int64_t m, int64_t n, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, bool add, float *C, int64_t ldc, const float *bias,
                  const gemm_shared_b *shb, int64_t first)
{
    (void)ta, (void)tb, (void)m, (void)n, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb,
        (void)add, (void)C, (void)ldc, (void)bias, (void)shb, (void)first;
    return false;
}

#endif
