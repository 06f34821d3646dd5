/* gemm_dpbf16.c — bf16 x bf16 -> f32 matrix products with VDPBF16PS
 * (AVX512-BF16: Zen 4, Cooper Lake, Sapphire Rapids), for CPUs with that
 * instruction and no AMX.
 *
 * VDPBF16PS multiplies 16 pairs of bf16 by 16 pairs and adds each lane's
 * two products to an f32 accumulator: one instruction, 32 multiply-adds.
 * The GEMM is blocked like a BLAS one:
 *   - C is computed in blocks of MC rows x NC columns, in an f32 scratch
 *     block, then copied to C (f32) or rounded once to bf16 (gemm_dpbf16), or
 *     rounded and kept in an f32 C, or added to it (gemm_dpbf16_low: a
 *     Linear's f32 output under autocast, its bias added next);
 *   - K is walked in blocks of KC; for each, op(B)'s block is packed
 *     pair-interleaved (gemm_bf16_pack_pairs, the layout AMX uses too: 16
 *     columns x one k-pair = one 64-byte row) and op(A)'s rows in panels of
 *     DP_MR rows, pair by pair (a pair is broadcast to all lanes);
 *   - the micro-kernel keeps DP_MR x 32 outputs in 16 zmm accumulators.
 * The micro-kernel's source is gemm_dpbf16_kernel.h, compiled here with
 * the real intrinsics (dp_kernel_avx512) and in gemm_dpbf16_emu.c against
 * ember's emulation of them (dp_kernel_emulated, on any CPU); beside them
 * sits a scalar model of the kernel (the instruction's arithmetic as
 * Intel's SDM defines it). On every CPU the tests run the blocking and
 * packing on the model, hold the emulated kernel to the model's bits, and
 * run the whole avx512bf16 path on it; what only a CPU with the
 * instruction shows is VDPBF16PS's own rounding and speed
 * (tests/test_bf16_path.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype_math.h"
#include "ember/runtime.h"
#include "kernel_impl.h"
#include "tensor_impl.h"

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 10 || defined(__clang__))
#define EM_DP_BUILD 1
#include <immintrin.h>

#include "avx2_impl.h"
#else
#define EM_DP_BUILD 0
#endif

enum { KC = 512, NC = 256, MC = 256 }; /* k, columns and rows per block */

bool gemm_dpbf16_usable(void) { return EM_DP_BUILD && em_cpu_detect().avx512bf16; }

/* ---- the scalar model ----------------------------------------------------------------- */

/* VDPBF16PS reads subnormals as zero and flushes subnormal results (DAZ,
 * FTZ, whatever MXCSR says) */
static float daz(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

float dpbf16_lane(float acc, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1)
{
    float t = daz(acc);
    /* the odd element's product first, then the even one's; a product of
     * two bf16 is exact in f32 unless it leaves f32's range, so each step
     * rounds once (to nearest even), at the add */
    t = daz(t + daz(daz(bf16_bits_to_f32(a1)) * daz(bf16_bits_to_f32(b1))));
    t = daz(t + daz(daz(bf16_bits_to_f32(a0)) * daz(bf16_bits_to_f32(b0))));
    return t;
}

static void model(const uint32_t *ap, const uint32_t *bp, int64_t gstride, int64_t pairs, float *acc,
                  int64_t ldacc, bool accumulate)
{
    for (int i = 0; i < DP_MR; i++)
        for (int j = 0; j < 32; j++) {
            float t = accumulate ? acc[i * ldacc + j] : 0.0f;
            const uint32_t *b = bp + (j / 16) * gstride + j % 16;
            for (int64_t p = 0; p < pairs; p++) {
                uint32_t a = ap[p * DP_MR + i], bb = b[p * 16];
                t = dpbf16_lane(t, (uint16_t)a, (uint16_t)(a >> 16), (uint16_t)bb, (uint16_t)(bb >> 16));
            }
            acc[i * ldacc + j] = t;
        }
}

const dp_kernel dp_kernel_model = model;

/* ---- the AVX512-BF16 kernel ------------------------------------------------------------- */

#if EM_DP_BUILD
/* its source is gemm_dpbf16_kernel.h, which gemm_dpbf16_emu.c also compiles
 * against ember's emulation of these intrinsics (dp_kernel_emulated) */
#define DP_KERNEL __attribute__((target("avx512f,avx512bf16"))) static void avx512
#include "gemm_dpbf16_kernel.h"
#undef DP_KERNEL
const dp_kernel dp_kernel_avx512 = avx512;
#else
const dp_kernel dp_kernel_avx512 = NULL;
#endif

/* ---- the driver --------------------------------------------------------------------------- */

/* rows r0..r0+rows (< DP_MR: zero rows below) of op(A), k from k0, `pairs`
 * pairs (zero past K), into dst[p*DP_MR + i] */
static void pack_a_panel(bool ta, const uint16_t *A, int64_t lda, int64_t r0, int64_t rows, int64_t k0,
                         int64_t K, int64_t pairs, uint32_t *dst)
{
    for (int64_t p = 0; p < pairs; p++) {
        int64_t k = k0 + 2 * p;
        for (int64_t i = 0; i < DP_MR; i++) {
            uint32_t lo = 0, hi = 0;
            if (i < rows) {
                /* op(A)(r, k) = A[r][k], or A[k][r] when A is stored transposed */
                int64_t r = r0 + i;
                lo = ta ? A[k * lda + r] : A[r * lda + k];
                if (k + 1 < K) hi = ta ? A[(k + 1) * lda + r] : A[r * lda + k + 1];
            }
            dst[p * DP_MR + i] = lo | hi << 16;
        }
    }
}

#if EM_DP_BUILD
/* pack_a_panel with AVX2 for a whole panel (rows == DP_MR, k0 = 0): the
 * pairs whole in K by vectors (8 at a time when A is (M,K): a pair is one
 * uint32 of a row, 8 rows x 8 pairs transposed), the rest by pack_a_panel */
__attribute__((target("avx2"))) static void pack_a_panel_avx2(bool ta, const uint16_t *A, int64_t lda,
                                                              int64_t r0, int64_t K, int64_t pairs,
                                                              uint32_t *dst)
{
    _Static_assert(DP_MR == 8, "pack_a_panel_avx2 packs 8 rows");
    int64_t whole = ta ? K / 2 : K / 16 * 8;
    if (ta) /* rows k and k+1 of A (K,M), 8 columns each, interleaved */
        for (int64_t p = 0; p < whole; p++) {
            const uint16_t *s = A + 2 * p * lda + r0;
            __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + lda));
            _mm_storeu_si128((__m128i *)(dst + p * 8), _mm_unpacklo_epi16(a, b));
            _mm_storeu_si128((__m128i *)(dst + p * 8 + 4), _mm_unpackhi_epi16(a, b));
        }
    else
        for (int64_t p = 0; p < whole; p += 8) { /* 8 rows x 8 pairs, transposed */
            __m256i x[8];
            for (int i = 0; i < 8; i++)
                x[i] = _mm256_loadu_si256((const __m256i *)(A + (r0 + i) * lda + 2 * p));
            transpose8_u32(x);
            for (int q = 0; q < 8; q++) _mm256_storeu_si256((__m256i *)(dst + (p + q) * 8), x[q]);
        }
    /* pairs from `whole` on: k0 = 2 * whole, and dst from there */
    pack_a_panel(ta, A, lda, r0, DP_MR, 2 * whole, K, pairs - whole, dst + whole * DP_MR);
}
#endif

/* a panel of op(A) as pack_a_panel lays it, by vectors where they apply */
static void pack_a(bool ta, const uint16_t *A, int64_t lda, int64_t r0, int64_t rows, int64_t K,
                   int64_t pairs, uint32_t *dst)
{
#if EM_DP_BUILD
    if (rows == DP_MR && em_cpu_detect().avx2) {
        pack_a_panel_avx2(ta, A, lda, r0, K, pairs, dst);
        return;
    }
#endif
    pack_a_panel(ta, A, lda, r0, rows, 0, K, pairs, dst);
}

/* n sums rounded to bf16 (convert_n's bits, inlined: a call per row cost
 * more than the row's rounding) */
static void round_n(uint16_t *restrict d, const float *restrict s, int64_t n)
{
    for (int64_t j = 0; j < n; j++) d[j] = f32_to_bf16_bits(s[j]);
}

/* n sums rounded to bf16 and widened back (stored in f32, or added) */
static void keep_n(float *restrict d, const float *restrict s, int64_t n, bool add)
{
    if (add)
        for (int64_t j = 0; j < n; j++) d[j] += bf16_bits_to_f32(f32_to_bf16_bits(s[j]));
    else
        for (int64_t j = 0; j < n; j++) d[j] = bf16_bits_to_f32(f32_to_bf16_bits(s[j]));
}

/* How C is written: its sums as they are (f32), rounded into bf16, or
 * rounded and kept in f32, stored or added */
typedef enum dp_out { DP_RAW, DP_BF16, DP_KEEP, DP_KEEP_ADD } dp_out;

/* C (m,n) = op(A) @ op(B), written as out says */
static bool dp_gemm(dp_kernel kern, dp_out out, bool ta, bool tb, int64_t m, int64_t n, int64_t K,
                    const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, void *C, int64_t ldc)
{
    int64_t kc_max = K < KC ? K : KC, pairs_max = (kc_max + 1) / 2;
    int64_t mc_max = m < MC ? m : MC, nc_max = n < NC ? n : NC;
    int64_t panels_max = (mc_max + DP_MR - 1) / DP_MR, ncp = (nc_max + 31) / 32 * 32; /* padded columns */
    /* the thread's scratch arena (64-byte aligned, kept from call to call),
     * as ember's other GEMMs use: with an aligned_alloc of acc and bp (256
     * KiB each at the largest blocks) at every call the bf16 step took
     * 1.01x this time (bench_ab, tiny and 124M, pairs both ways round; Zen 5) */
    size_t mark = tmp_mark();
    uint32_t *ap = tmp_alloc((size_t)(pairs_max * DP_MR) * 4); /* one panel */
    uint32_t *bp = tmp_alloc((size_t)(ncp * pairs_max) * 4);
    float *acc = tmp_alloc((size_t)(panels_max * DP_MR * ncp) * 4);
    if (!ap || !bp || !acc) {
        tmp_release(mark);
        return false;
    }
    for (int64_t n0 = 0; n0 < n; n0 += nc_max) {
        int64_t nc = n - n0 < nc_max ? n - n0 : nc_max, groups2 = (nc + 31) / 32;
        for (int64_t m0 = 0; m0 < m; m0 += mc_max) {
            int64_t mc = m - m0 < mc_max ? m - m0 : mc_max, panels = (mc + DP_MR - 1) / DP_MR;
            for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
                int64_t kc = K - k0 < kc_max ? K - k0 : kc_max, pairs = (kc + 1) / 2;
                /* op(B) from row k0: B (K,n) rows, or B (n,K) when transposed */
                gemm_bf16_pack_pairs(tb, tb ? B + k0 : B + k0 * ldb, ldb, n0, nc, kc, 2 * pairs, bp);
                for (int64_t i = 0; i < panels; i++) {
                    int64_t rows = mc - i * DP_MR < DP_MR ? mc - i * DP_MR : DP_MR;
                    pack_a(ta, ta ? A + k0 * lda : A + k0, lda, m0 + i * DP_MR, rows, kc, pairs, ap);
                    for (int64_t g = 0; g < groups2; g++)
                        kern(ap, bp + 2 * g * pairs * 16, pairs * 16, pairs, acc + (i * DP_MR) * ncp + 32 * g,
                             ncp, k0 > 0);
                }
            }
            for (int64_t i = 0; i < mc; i++) {
                const float *src = acc + i * ncp;
                size_t off = (size_t)((m0 + i) * ldc + n0);
                switch (out) {
                case DP_RAW: memcpy((float *)C + off, src, (size_t)nc * 4); break;
                case DP_BF16: round_n((uint16_t *)C + off, src, nc); break;
                case DP_KEEP: keep_n((float *)C + off, src, nc, false); break;
                case DP_KEEP_ADD: keep_n((float *)C + off, src, nc, true); break;
                }
            }
        }
    }
    tmp_release(mark);
    return true;
}

bool gemm_dpbf16(dp_kernel kern, bool ta, bool tb, int64_t m, int64_t n, int64_t K, const uint16_t *A,
                 int64_t lda, const uint16_t *B, int64_t ldb, void *C, bool c_bf16, int64_t ldc)
{
    return dp_gemm(kern, c_bf16 ? DP_BF16 : DP_RAW, ta, tb, m, n, K, A, lda, B, ldb, C, ldc);
}

bool gemm_dpbf16_low(dp_kernel kern, gemm_low_dtypes dt, bool ta, bool tb, int64_t m, int64_t n, int64_t K,
                     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, void *C, int64_t ldc)
{
    dp_out out = dt.c == EM_BF16 ? DP_BF16 : dt.add ? DP_KEEP_ADD : DP_KEEP;
    return dp_gemm(kern, out, ta, tb, m, n, K, A, lda, B, ldb, C, ldc);
}
