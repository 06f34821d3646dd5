/* test_bf16_path.c — the bf16 product paths (tensor/gemm_path.c): choosing
 * one (EMBER_BF16_PATH, refusing what the CPU lacks), the f32 path that
 * widens bf16/f16 operands inside the GEMM, and the AVX512-BF16 GEMM: its
 * blocking and packing through the scalar model of VDPBF16PS on every CPU,
 * its kernel where the CPU has the instruction, and on every CPU the
 * kernel's own source on ember's emulation of its intrinsics
 * (tensor/gemm_dpbf16_emu.c): bit for bit the model's, with planted bugs
 * caught, and the whole avx512bf16 path (em_matmul, a bf16 training step)
 * running on it. Each result is compared with f64 on the same (rounded)
 * inputs, within the rounding the path documents: the output's (half a
 * bf16/f16 ulp) plus f32 accumulation's. */
#include <stdlib.h>

#include "harness.h"
#include "path_test.h"
#include "planted.h"
#include "tensor/dtype_math.h"
#include "tensor/kernel_impl.h"

/* |got - want| within half an ulp of dt at |want|, doubled, plus f32
 * accumulation over K terms whose absolute products sum to s */
static bool within_rounding(em_dtype dt, double got, double want, double s, int64_t K)
{
    double ulp = dt == EM_BF16 ? 0x1p-8 : 0x1p-11,
           sub = dt == EM_F16 ? 0x1p-24 : 0; /* f16's subnormal step */
    return fabs(got - want) <= ulp * fabs(want) + sub + (double)(K + 2) * 0x1p-24 * s;
}

/* op(a) (M,K) @ op(b) (K,N) by em_matmul in dt (a stored transposed when
 * ta, b when tb, as a Linear's W^T and its backward's g^T are), against f64
 * on the same rounded values */
static void matmul_matches(em_dtype dt, int64_t M, int64_t K, int64_t N, bool ta, bool tb)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new((uint64_t)(M * 1000003 + K * 1009 + N * 7 + ta * 2 + tb));
    int64_t sa[2] = {ta ? K : M, ta ? M : K}, sb[2] = {tb ? N : K, tb ? K : N};
    em_tensor *a = em_cast(em_randn(EM_F32, 2, sa, &r), dt);
    em_tensor *b = em_cast(em_randn(EM_F32, 2, sb, &r), dt);
    if (ta) a = em_transpose(a, 0, 1);
    if (tb) b = em_transpose(b, 0, 1);
    em_tensor *c = em_matmul(a, b);
    CHECK_NOTNULL(c);
    CHECK(em_dtype_of(c) == dt);
    em_tensor *got = em_cast(c, EM_F64), *a64 = em_cast(a, EM_F64), *b64 = em_cast(b, EM_F64);
    em_tensor *want = em_matmul(a64, b64), *sum = em_matmul(em_abs(a64), em_abs(b64));
    CHECK(got && want && sum);
    for (int64_t i = 0; i < M * N; i++) {
        double g = ((double *)em_data(got))[i], w = ((double *)em_data(want))[i],
               sa = ((double *)em_data(sum))[i];
        if (!within_rounding(dt, g, w, sa, K))
            th_fail(__FILE__, __LINE__, "%s (%lld,%lld)%s @ (%lld,%lld)%s: [%lld,%lld] = %.9g, want %.9g",
                    em_dtype_name(dt), (long long)M, (long long)K, ta ? "^T" : "", (long long)K, (long long)N,
                    tb ? "^T" : "", (long long)(i / N), (long long)(i % N), g, w);
    }
    em_scope_end(s);
}

static const int64_t odd[] = {1, 7, 33, 257};
static uint16_t bf(float x);
static void rand_bf16(uint16_t *x, int64_t n, uint64_t seed, bool small_ints);

TEST(test_bf16_f32_path_matches_f64_at_odd_shapes_and_layouts)
{
    use_bf16_path("f32");
    CHECK(!strcmp(em_matmul_path(EM_BF16), "f32"));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 4; k++)
                for (int t = 0; t < 4; t++) matmul_matches(EM_BF16, odd[i], odd[j], odd[k], t & 1, t & 2);
}

TEST(test_f16_products_widened_in_the_gemm_match_f64_at_odd_shapes)
{
    CHECK(!strcmp(em_matmul_path(EM_F16), "f32"));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 4; k += 3) matmul_matches(EM_F16, odd[i], odd[j], odd[k], k, !k);
}

/* past one block of rows (256), depth (768 = 1.5 blocks) and columns (1024):
 * every block edge of the widening GEMM, and the GPT's three products of a
 * Linear (x @ W^T, g @ W, g^T @ x) */
/* (M,1) @ (1,N): each result is one exact product rounded once, so it must
 * be bf16_round's bits (ties to even, NaN kept quiet, infinities) on any
 * path; a K of 1 also takes every edge of the packing */
TEST(test_bf16_products_round_each_result_once_like_a_cast)
{
    em_scope s = em_scope_begin();
    enum { M = 37, N = 41 };
    uint16_t a[M], b[N];
    rand_bf16(a, M, 3, false);
    rand_bf16(b, N, 4, false);
    /* (1 + 2^-4)^2 = 1 + 2^-3 + 2^-8 lies halfway between two bf16 (2^-7
     * apart): it rounds to the even one, 1 + 2^-3; and specials */
    a[0] = b[0] = bf(1.0625f);
    a[1] = bf(INFINITY), a[2] = bf(NAN), a[3] = 0x8000, a[4] = bf(3e38f);
    b[1] = bf(-1.0078125f), b[2] = 0;
    em_tensor *ta = em_from_data(EM_BF16, EM_SHAPE(M, 1), a), *tb = em_from_data(EM_BF16, EM_SHAPE(1, N), b);
    em_tensor *c = em_matmul(ta, tb);
    CHECK_NOTNULL(c);
    const uint16_t *got = em_data(c);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            uint16_t want = f32_to_bf16_bits(0.0f + bf16_bits_to_f32(a[i]) * bf16_bits_to_f32(b[j]));
            if (got[i * N + j] != want)
                th_fail(__FILE__, __LINE__, "[%d,%d] %s: 0x%04x, want 0x%04x", i, j, em_matmul_path(EM_BF16),
                        got[i * N + j], want);
        }
    em_scope_end(s);
}

TEST(test_bf16_f32_path_crosses_its_block_edges)
{
    use_bf16_path("f32");
    matmul_matches(EM_BF16, 261, 777, 1031, false, true);
    matmul_matches(EM_BF16, 261, 1031, 777, false, false);
    matmul_matches(EM_BF16, 1031, 261, 777, true, false);
    matmul_matches(EM_F16, 261, 777, 1031, false, true);
}

TEST(test_bf16_path_env_forces_a_path_and_refuses_what_the_cpu_lacks)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_BF16, EM_SHAPE(3, 3));
    use_bf16_path("f32");
    CHECK(!strcmp(em_matmul_path(EM_BF16), "f32"));
    use_bf16_path("sideways");
    CHECK_ERR(em_matmul_path(EM_BF16), EM_ERR_ARG, "EMBER_BF16_PATH='sideways' is not one of");
    CHECK_ERR(em_matmul(a, a), EM_ERR_ARG, "EMBER_BF16_PATH='sideways'");
    use_bf16_path("avx512bf16");
    if (em_cpu_detect().avx512bf16) {
        CHECK(!strcmp(em_matmul_path(EM_BF16), "avx512bf16"));
    } else {
        CHECK_ERR(em_matmul_path(EM_BF16), EM_ERR_UNSUPPORTED, "EMBER_BF16_PATH=avx512bf16: this CPU");
        CHECK_ERR(em_matmul(a, a), EM_ERR_UNSUPPORTED, "no AVX512-BF16");
    }
    use_bf16_path("amx");
    if (gemm_bf16_amx_usable())
        CHECK(!strcmp(em_matmul_path(EM_BF16), "amx"));
    else
        CHECK_ERR(em_matmul(a, a), EM_ERR_UNSUPPORTED, "EMBER_BF16_PATH=amx: AMX is not usable here");
    /* by default: the fastest this CPU has */
    use_bf16_path(NULL);
    const char *want = gemm_bf16_amx_usable() ? "amx" : em_cpu_detect().avx512bf16 ? "avx512bf16" : "f32";
    CHECK(!strcmp(em_matmul_path(EM_BF16), want));
    use_bf16_path("auto");
    CHECK(!strcmp(em_matmul_path(EM_BF16), want));
    CHECK(!strcmp(em_matmul_path(EM_F16), "f32")); /* f32's own paths: tests/test_f32_path.c */
    CHECK_ERR(em_matmul_path(EM_BOOL), EM_ERR_DTYPE, "em_matmul_path");
    em_scope_end(s);
}

/* ---- VDPBF16PS: the model and the GEMM built on it ------------------------------------ */

static uint16_t bf(float x) { return f32_to_bf16_bits(x); }

/* Intel SDM: the odd pair's product is added first, then the even pair's,
 * each add rounded to nearest even: 2^24 + 1 ties back to 2^24, then + 2
 * (the other order, or one rounding of the exact sum, gives 2^24 + 4) */
TEST(test_dpbf16_model_adds_the_odd_product_first_rounding_each_add)
{
    CHECK(dpbf16_lane(0x1p24f, bf(2.0f), bf(1.0f), bf(1.0f), bf(1.0f)) == 0x1p24f + 2.0f);
    CHECK(dpbf16_lane(0x1p24f, bf(1.0f), bf(2.0f), bf(1.0f), bf(1.0f)) == 0x1p24f + 4.0f);
    CHECK(dpbf16_lane(1.5f, bf(2.0f), bf(-3.0f), bf(0.5f), bf(4.0f)) == 1.5f - 12.0f + 1.0f);
}

TEST(test_dpbf16_model_reads_subnormals_as_zero_and_flushes_results)
{
    uint16_t sub = 0x0001; /* the smallest bf16 subnormal */
    CHECK(dpbf16_lane(0.0f, sub, 0, bf(0x1p100f), 0) == 0.0f);
    CHECK(dpbf16_lane(0x1p-130f, 0, 0, 0, 0) == 0.0f);                     /* a subnormal accumulator */
    CHECK(dpbf16_lane(0.0f, bf(0x1p-70f), 0, bf(0x1p-70f), 0) == 0.0f);    /* a product below f32's range */
    CHECK(dpbf16_lane(0x1p-125f, bf(-1.5f), 0, bf(0x1p-126f), 0) == 0.0f); /* a sum that lands subnormal */
    CHECK(isinf(dpbf16_lane(0.0f, bf(0x1p100f), 0, bf(0x1p100f), 0)));
}

/* random bf16 (m,K) and (K,n) stored as the flags say */
static void rand_bf16(uint16_t *x, int64_t n, uint64_t seed, bool small_ints)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0;
        x[i] = bf(small_ints ? (float)((int)(u * 9) - 4) : (float)((u - 0.5) * 4));
    }
}

/* gemm_dpbf16 with kernel k on op(A) (m,K) @ op(B) (K,n), C f32 and bf16,
 * against f64 (exactly, when the inputs are small integers) */
static void dpbf16_matches(dp_kernel k, int64_t m, int64_t K, int64_t n, bool ta, bool tb, bool ints)
{
    uint16_t *A = malloc((size_t)(m * K) * 2), *B = malloc((size_t)(K * n) * 2),
             *Cb = malloc((size_t)(m * n) * 2);
    float *C = malloc((size_t)(m * n) * 4);
    rand_bf16(A, m * K, (uint64_t)(m + 3 * K), ints);
    rand_bf16(B, K * n, (uint64_t)(n + 5 * K), ints);
    int64_t lda = ta ? m : K, ldb = tb ? K : n;
    CHECK(gemm_dpbf16(k, ta, tb, m, n, K, A, lda, B, ldb, C, false, n));
    CHECK(gemm_dpbf16(k, ta, tb, m, n, K, A, lda, B, ldb, Cb, true, n));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double w = 0, s = 0;
            for (int64_t p = 0; p < K; p++) {
                double x = bf16_bits_to_f32(ta ? A[p * lda + i] : A[i * lda + p]),
                       y = bf16_bits_to_f32(tb ? B[j * ldb + p] : B[p * ldb + j]);
                w += x * y;
                s += fabs(x * y);
            }
            double g = C[i * n + j], gb = bf16_bits_to_f32(Cb[i * n + j]);
            bool ok = ints ? g == w && gb == bf16_bits_to_f32(bf((float)w))
                           : within_rounding(EM_F32, g, w, s, K) && within_rounding(EM_BF16, gb, w, s, K);
            if (!ok)
                th_fail(__FILE__, __LINE__,
                        "(%lld,%lld)%s @ (%lld,%lld)%s%s: [%lld,%lld] = %.9g (bf16 %.9g), want %.9g",
                        (long long)m, (long long)K, ta ? "^T" : "", (long long)K, (long long)n,
                        tb ? "^T" : "", ints ? " (integers)" : "", (long long)i, (long long)j, g, gb, w);
        }
    free(A);
    free(B);
    free(C);
    free(Cb);
}

TEST(test_dpbf16_gemm_on_the_model_kernel_matches_f64_at_odd_shapes)
{
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 4; k++)
                dpbf16_matches(dp_kernel_model, odd[i], odd[j], odd[k], k & 1, j & 1, false);
    /* past a block of depth (512), columns (256) and rows (256) */
    dpbf16_matches(dp_kernel_model, 9, 1031, 33, true, false, false);
    dpbf16_matches(dp_kernel_model, 263, 9, 259, false, true, false);
    dpbf16_matches(dp_kernel_model, 263, 1030, 259, false, true, true); /* exact sums */
}

TEST(test_dpbf16_kernel_matches_its_model_where_the_cpu_has_it)
{
    if (!gemm_dpbf16_usable())
        SKIP("this CPU has no AVX512-BF16: the VDPBF16PS kernel cannot run here; its source ran on the "
             "emulation instead (test_dpbf16_kernel_source_on_the_emulation_gives_the_models_bits)");
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 4; k++)
                dpbf16_matches(dp_kernel_avx512, odd[i], odd[j], odd[k], k & 1, j & 1, false);
    dpbf16_matches(dp_kernel_avx512, 263, 1030, 259, false, true, true);
    /* whether the instruction gives the model's bits on random data: said,
     * not asserted (the model follows the SDM's text; a CPU that rounds
     * otherwise is within the tolerance checked above) */
    int64_t pairs = 300;
    uint32_t *ap = malloc((size_t)(pairs * DP_MR) * 4), *bp = malloc((size_t)(pairs * 32) * 4);
    rand_bf16((uint16_t *)ap, 2 * pairs * DP_MR, 1, false);
    rand_bf16((uint16_t *)bp, 2 * pairs * 32, 2, false);
    float hw[DP_MR * 32], md[DP_MR * 32];
    dp_kernel_avx512(ap, bp, pairs * 16, pairs, hw, 32, false);
    dp_kernel_model(ap, bp, pairs * 16, pairs, md, 32, false);
    int differ = 0;
    for (int i = 0; i < DP_MR * 32; i++) differ += hw[i] != md[i];
    fprintf(stderr, "VDPBF16PS and its model differ in %d of %d sums of %lld pairs\n", differ, DP_MR * 32,
            (long long)pairs);
    free(ap);
    free(bp);
}

/* em_matmul on the avx512bf16 path (whichever kernel it runs) at odd
 * shapes, every layout, and past the blocks (split over the pool) */
static void avx512bf16_path_matches_f64(void)
{
    use_bf16_path("avx512bf16");
    CHECK(!strcmp(em_matmul_path(EM_BF16), "avx512bf16"));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int t = 0; t < 4; t++)
                matmul_matches(EM_BF16, odd[i], odd[j], odd[(i + j) % 4], t & 1, t & 2);
    matmul_matches(EM_BF16, 261, 777, 1031, false, true);
}

TEST(test_bf16_avx512bf16_path_matmul_matches_f64_where_the_cpu_has_it)
{
    if (!gemm_dpbf16_usable())
        SKIP("this CPU has no AVX512-BF16: the VDPBF16PS path cannot run here; it ran on the emulated "
             "kernel instead (test_bf16_avx512bf16_path_on_the_emulated_kernel_matches_f64)");
    avx512bf16_path_matches_f64();
}

/* ---- the kernel's own source on ember's emulation of its intrinsics ----------------------
 * dp_kernel_emulated is dp_kernel_avx512's source compiled against
 * tensor/avx512_emu.h, whose VDPBF16PS computes each lane with the
 * model's arithmetic: so it must give the model's bits exactly, and where
 * it does the kernel moves its data right. The instruction's own rounding
 * is the hardware test's (above). */

/* Whether kernel k, called alone, gives the model's bits for 300 pairs
 * into an accumulator of row stride 40 (B's groups 48 uint32 further apart
 * than packed), summed onto it (nonzero) and not (NaN, which must not be
 * read); the first difference into why (n bytes) */
static bool kernel_gives_the_models_bits(dp_kernel k, char *why, size_t n)
{
    enum { PAIRS = 300, GSTRIDE = PAIRS * 16 + 48, LDACC = 40 };
    uint32_t *ap = malloc(PAIRS * DP_MR * 4), *bp = malloc((GSTRIDE + PAIRS * 16) * 4);
    float init[DP_MR * LDACC], got[DP_MR * LDACC], want[DP_MR * LDACC];
    rand_bf16((uint16_t *)ap, 2 * PAIRS * DP_MR, 1, false);
    rand_bf16((uint16_t *)bp, 2 * (GSTRIDE + PAIRS * 16), 2, false);
    bool same = true;
    for (int accumulate = 0; accumulate < 2 && same; accumulate++) {
        for (int i = 0; i < DP_MR * LDACC; i++) init[i] = accumulate ? (float)(i % 7) - 3.25f : NAN;
        memcpy(got, init, sizeof init);
        memcpy(want, init, sizeof init);
        k(ap, bp, GSTRIDE, PAIRS, got, LDACC, accumulate);
        dp_kernel_model(ap, bp, GSTRIDE, PAIRS, want, LDACC, accumulate);
        for (int i = 0; i < DP_MR * LDACC && same; i++)
            if (memcmp(&got[i], &want[i], 4)) {
                snprintf(why, n, "%d pairs%s: acc[%d][%d] = %.9g, the model's %.9g", PAIRS,
                         accumulate ? " onto acc" : "", i / LDACC, i % LDACC, got[i], want[i]);
                same = false;
            }
    }
    free(ap);
    free(bp);
    return same;
}

/* Whether gemm_dpbf16 gives the same bits on kernel k as on the model for
 * op(A) (m,K) @ op(B) (K,n), C f32; the first difference into why */
static bool gemm_gives_the_models_bits(dp_kernel k, int64_t m, int64_t K, int64_t n, bool ta, bool tb,
                                       bool ints, char *why, size_t wn)
{
    uint16_t *A = malloc((size_t)(m * K) * 2), *B = malloc((size_t)(K * n) * 2);
    float *got = malloc((size_t)(m * n) * 4), *want = malloc((size_t)(m * n) * 4);
    rand_bf16(A, m * K, (uint64_t)(m + 3 * K), ints);
    rand_bf16(B, K * n, (uint64_t)(n + 5 * K), ints);
    int64_t lda = ta ? m : K, ldb = tb ? K : n;
    CHECK(gemm_dpbf16(k, ta, tb, m, n, K, A, lda, B, ldb, got, false, n));
    CHECK(gemm_dpbf16(dp_kernel_model, ta, tb, m, n, K, A, lda, B, ldb, want, false, n));
    bool same = true;
    for (int64_t i = 0; i < m * n && same; i++)
        if (memcmp(&got[i], &want[i], 4)) {
            snprintf(why, wn, "(%lld,%lld)%s @ (%lld,%lld)%s: [%lld,%lld] = %.9g, the model's %.9g",
                     (long long)m, (long long)K, ta ? "^T" : "", (long long)K, (long long)n, tb ? "^T" : "",
                     (long long)(i / n), (long long)(i % n), got[i], want[i]);
            same = false;
        }
    free(A);
    free(B);
    free(got);
    free(want);
    return same;
}

/* ... past a block of depth (the second block sums onto the first), then
 * at the shapes and layouts the hardware test uses: exact sums past a
 * block of depth, rows and columns, and every odd shape */
static bool gemms_give_the_models_bits(dp_kernel k, char *why, size_t n)
{
    if (!gemm_gives_the_models_bits(k, 9, 1031, 33, true, false, false, why, n)) return false;
    if (!gemm_gives_the_models_bits(k, 263, 1030, 259, false, true, true, why, n)) return false;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 4; l++)
                if (!gemm_gives_the_models_bits(k, odd[i], odd[j], odd[l], l & 1, j & 1, false, why, n))
                    return false;
    return true;
}

TEST(test_dpbf16_kernel_source_on_the_emulation_gives_the_models_bits)
{
    char why[256];
    if (!kernel_gives_the_models_bits(dp_kernel_emulated, why, sizeof why))
        th_fail(__FILE__, __LINE__, "the kernel alone: %s", why);
    if (!gemms_give_the_models_bits(dp_kernel_emulated, why, sizeof why))
        th_fail(__FILE__, __LINE__, "the GEMM: %s", why);
}

/* the same comparisons catch a kernel that moves its data wrong: its
 * source compiled on the emulation with a bug planted
 * (tests/dpbf16_planted.c) fails both, alone and under the GEMM */
TEST(test_dpbf16_comparison_with_the_model_catches_planted_kernel_bugs)
{
    char why[256];
    for (int b = 0; b < DP_PLANTED; b++) {
        th_case("%s", dp_planted_kernels[b].bug);
        CHECK(!kernel_gives_the_models_bits(dp_planted_kernels[b].kernel, why, sizeof why));
        CHECK(!gemms_give_the_models_bits(dp_planted_kernels[b].kernel, why, sizeof why));
    }
}

/* the emulated kernel, counting its calls (any thread) */
static int64_t emulated_calls;
static void counted_emulated(const uint32_t *ap, const uint32_t *bp, int64_t gstride, int64_t pairs,
                             float *acc, int64_t ldacc, bool accumulate)
{
    __atomic_add_fetch(&emulated_calls, 1, __ATOMIC_RELAXED);
    dp_kernel_emulated(ap, bp, gstride, pairs, acc, ldacc, accumulate);
}

/* the whole avx512bf16 path as a user reaches it (EMBER_BF16_PATH,
 * em_matmul, the path's blocking and its split over 4 threads), with the
 * emulated kernel standing in for VDPBF16PS */
TEST(test_bf16_avx512bf16_path_on_the_emulated_kernel_matches_f64)
{
    CHECK_OK(em_set_num_threads(4));
    gemm_dpbf16_use_kernel_for_test(counted_emulated);
    avx512bf16_path_matches_f64();
    CHECK(emulated_calls > 0);
    gemm_dpbf16_use_kernel_for_test(NULL);
}

TEST(test_bf16_path_refuses_avx512bf16_again_once_the_test_kernel_is_undone)
{
    if (gemm_dpbf16_usable()) SKIP("this CPU has AVX512-BF16: nothing to refuse");
    gemm_dpbf16_use_kernel_for_test(dp_kernel_emulated);
    use_bf16_path("avx512bf16");
    CHECK(!strcmp(em_matmul_path(EM_BF16), "avx512bf16"));
    gemm_dpbf16_use_kernel_for_test(NULL);
    CHECK_ERR(em_matmul_path(EM_BF16), EM_ERR_UNSUPPORTED, "EMBER_BF16_PATH=avx512bf16: this CPU");
}

/* One step of a tiny GPT under bf16 autocast (forward, backward) with its
 * bf16 products on `path`, kernel k standing in for VDPBF16PS when not
 * NULL: the loss, and every parameter's gradient (flat) into grads, n of
 * them. 18 x 32 tokens: a weight's gradient sums over 576 of them, past
 * the GEMM's depth block (512), and the products split over the pool. */
enum { STEP_GRADS_MAX = 1 << 16, STEP_B = 18, STEP_T = 32 };
static float gpt_step(const char *path, dp_kernel k, float *grads, int64_t *n)
{
    gemm_dpbf16_use_kernel_for_test(k);
    use_bf16_path(path);
    em_gpt_config c = {.vocab_size = 64, .block_size = STEP_T, .n_layer = 1, .n_head = 2, .n_embd = 32};
    em_gpt *g = em_gpt_new(&c, 7);
    CHECK_NOTNULL(g);
    CHECK_OK(em_module_flatten(g->m));
    em_scope s = em_scope_begin();
    int32_t tok[STEP_B * STEP_T], tgt[STEP_B * STEP_T];
    for (int i = 0; i < STEP_B * STEP_T; i++) tok[i] = (i * 13 + 5) % 64, tgt[i] = (i * 7 + 3) % 64;
    em_dtype prev = em_autocast_set(EM_BF16);
    em_tensor *loss = em_gpt_loss(g, em_from_data(EM_I32, EM_SHAPE(STEP_B, STEP_T), tok),
                                  em_from_data(EM_I32, EM_SHAPE(STEP_B, STEP_T), tgt));
    em_autocast_set(prev);
    CHECK_NOTNULL(loss);
    CHECK_OK(em_backward(loss, NULL));
    float l = (float)em_item(loss);
    em_tensor *flat = em_module_flat_grads(g->m, EM_F32);
    *n = em_numel(flat);
    CHECK(*n <= STEP_GRADS_MAX);
    memcpy(grads, em_data(flat), (size_t)*n * 4);
    em_scope_end(s);
    em_gpt_free(g);
    gemm_dpbf16_use_kernel_for_test(NULL);
    return l;
}

/* a training step on the avx512bf16 path with the emulated kernel: the
 * model kernel's bits exactly, and the f32 path's numbers (the same bf16
 * operands and results, summed in another order) within bf16 rounding */
TEST(test_bf16_autocast_gpt_step_on_the_emulated_avx512bf16_path_matches_the_model_and_f32_path)
{
    float *emu = malloc(STEP_GRADS_MAX * 4), *mod = malloc(STEP_GRADS_MAX * 4),
          *f32 = malloc(STEP_GRADS_MAX * 4);
    int64_t n, n2, n3;
    CHECK_OK(em_set_num_threads(4));
    float l_emu = gpt_step("avx512bf16", counted_emulated, emu, &n);
    CHECK(emulated_calls > 0);
    float l_mod = gpt_step("avx512bf16", dp_kernel_model, mod, &n2);
    float l_f32 = gpt_step("f32", NULL, f32, &n3);
    CHECK(n == n2 && n == n3);
    CHECK(!memcmp(&l_emu, &l_mod, 4));
    CHECK(!memcmp(emu, mod, (size_t)n * 4));
    double gmax = 0, dmax = 0;
    for (int64_t i = 0; i < n; i++) {
        gmax = fmax(gmax, fabs(f32[i]));
        dmax = fmax(dmax, fabs((double)emu[i] - f32[i]));
    }
    fprintf(stderr, "loss %.9g (f32 path %.9g); largest gradient %.3g, largest difference %.3g\n", l_emu,
            l_f32, gmax, dmax);
    CHECK(fabs(l_emu - l_f32) <= 0x1p-8 * fabs(l_f32));
    CHECK(dmax <= 0x1p-7 * gmax); /* about a bf16 ulp of the largest */
    free(emu);
    free(mod);
    free(f32);
}

/* the f32 path of CPUs without AVX2+FMA (widening next to sgemm), called
 * directly: odd shapes, every layout, past its blocks (256 rows, 768 deep,
 * 1024 columns) */
static void widen_sgemm_matches(em_dtype dt, int64_t m, int64_t K, int64_t n, bool ta, bool tb)
{
    uint16_t *A = malloc((size_t)(m * K) * 2), *B = malloc((size_t)(K * n) * 2),
             *C = malloc((size_t)(m * n) * 2);
    rand_bf16(A, m * K, (uint64_t)(m + 7 * K), false);
    rand_bf16(B, K * n, (uint64_t)(n + 11 * K), false);
    if (dt == EM_F16) /* the same values as f16 (they are small: exact) */
        for (int64_t i = 0; i < m * K || i < K * n; i++) {
            if (i < m * K) A[i] = f32_to_f16_bits(bf16_bits_to_f32(A[i]));
            if (i < K * n) B[i] = f32_to_f16_bits(bf16_bits_to_f32(B[i]));
        }
    float (*val)(uint16_t) = dt == EM_F16 ? f16_bits_to_f32 : bf16_bits_to_f32;
    int64_t lda = ta ? m : K, ldb = tb ? K : n;
    CHECK(gemm_widen_sgemm((gemm_low_dtypes){.lo = dt, .a = dt, .b = dt, .c = dt}, ta, tb, m, n, K, A, lda, B,
                           ldb, C, n));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double w = 0, s = 0;
            for (int64_t p = 0; p < K; p++) {
                double x = val(ta ? A[p * lda + i] : A[i * lda + p]),
                       y = val(tb ? B[j * ldb + p] : B[p * ldb + j]);
                w += x * y;
                s += fabs(x * y);
            }
            double g = val(C[i * n + j]);
            if (!within_rounding(dt, g, w, s, K))
                th_fail(__FILE__, __LINE__, "%s (%lld,%lld)%s @ (%lld,%lld)%s: [%lld,%lld] = %.9g, want %.9g",
                        em_dtype_name(dt), (long long)m, (long long)K, ta ? "^T" : "", (long long)K,
                        (long long)n, tb ? "^T" : "", (long long)i, (long long)j, g, w);
        }
    free(A);
    free(B);
    free(C);
}

TEST(test_widening_next_to_sgemm_matches_f64_at_odd_shapes)
{
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int t = 0; t < 4; t++)
                widen_sgemm_matches(EM_BF16, odd[i], odd[j], odd[(i + j + t) % 4], t & 1, t & 2);
    widen_sgemm_matches(EM_BF16, 261, 777, 1031, false, true);
    widen_sgemm_matches(EM_F16, 261, 777, 33, true, false);
}
