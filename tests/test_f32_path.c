/* test_f32_path.c — the f32 product paths (tensor/gemm_path.c): sgemm (the
 * BLAS), avx2 and avx512 (ember's own GEMM, tensor/gemm_widen.c's blocking
 * with nothing rounded, on its 6x16 AVX2+FMA or its 6x32 AVX-512F micro-
 * kernel). Each kernel is compared with f64 on the same inputs at odd
 * shapes, every layout and past each of its blocks, within f32
 * accumulation's rounding; the 6x32 kernel must also give the 6x16 one's
 * bits, in f32 and low-precision products alike; the setting is checked
 * like EMBER_BF16_PATH's. */
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"
#include "path_test.h"
#include "planted.h"
#include "tensor/dtype_math.h"
#include "tensor/kernel_impl.h"

static bool have_avx2(void) { return gemm_widen_usable(); }

#define NO_OWN_KERNEL "this CPU has no AVX2+FMA+F16C: ember's f32 kernels cannot run here"

/* ember's own f32 paths this CPU runs (avx2, and avx512 with AVX-512F) in
 * out; how many */
static int own_paths(const char *out[2])
{
    int n = 0;
    if (have_avx2()) out[n++] = "avx2";
    if (gemm_wide_usable()) out[n++] = "avx512";
    return n;
}

static float *rand_f32(int64_t n, uint64_t seed)
{
    float *p = malloc((size_t)n * sizeof *p);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (float)((double)(x >> 11) * 0x1p-53 * 2 - 1);
    }
    return p;
}

/* C = alpha op(A) @ op(B) (+ C0 when add) by gemm_f32_own against f64:
 * within f32 accumulation's rounding, (K + 3) ulps of the absolute sum */
static void avx2_matches(int64_t m, int64_t K, int64_t n, bool ta, bool tb, float alpha, bool add)
{
    int64_t lda = ta ? m + 3 : K + 1, ldb = tb ? K + 2 : n + 5, ldc = n + 7; /* padded rows */
    float *A = rand_f32((ta ? K : m) * lda, (uint64_t)(m * 31 + K)),
          *B = rand_f32((tb ? n : K) * ldb, (uint64_t)(n + 7 * K));
    float *C = rand_f32(m * ldc, 99), *C0 = malloc((size_t)(m * ldc) * sizeof *C0);
    memcpy(C0, C, (size_t)(m * ldc) * sizeof *C);
    CHECK(gemm_f32_own(ta, tb, m, n, K, alpha, A, lda, B, ldb, add, C, ldc, NULL, NULL, 0));
    int bad = 0;
    for (int64_t i = 0; i < m && bad < 3; i++)
        for (int64_t j = 0; j < ldc; j++) {
            if (j >= n) { /* past the row's n columns: untouched */
                if (C[i * ldc + j] != C0[i * ldc + j]) bad++, th_fail(__FILE__, __LINE__, "padding changed");
                continue;
            }
            double w = 0, s = 0;
            for (int64_t p = 0; p < K; p++) {
                double x = ta ? A[p * lda + i] : A[i * lda + p], y = tb ? B[j * ldb + p] : B[p * ldb + j];
                w += x * y;
                s += fabs(x * y);
            }
            w = alpha * w + (add ? C0[i * ldc + j] : 0);
            s = fabs(alpha) * s + (add ? fabs(C0[i * ldc + j]) : 0);
            double g = C[i * ldc + j];
            if (fabs(g - w) > (double)(K + 3) * 0x1p-24 * s + 1e-30) {
                bad++;
                th_fail(__FILE__, __LINE__,
                        "(%lld,%lld)%s @ (%lld,%lld)%s alpha %g%s: [%lld,%lld] = %.9g, want %.9g",
                        (long long)m, (long long)K, ta ? "^T" : "", (long long)K, (long long)n,
                        tb ? "^T" : "", alpha, add ? " added" : "", (long long)i, (long long)j, g, w);
            }
        }
    free(A), free(B), free(C), free(C0);
}

static const int64_t odd[] = {1, 7, 17, 50};

/* one product for avx2_matches: (m,K) @ (K,n), transposes, alpha, add */
typedef struct f64_case {
    int64_t m, K, n;
    bool ta, tb;
    float alpha;
    bool add;
} f64_case;

/* every case on each of ember's own f32 paths this CPU runs; false when
 * it runs none (nothing checked) */
static bool own_kernels_match(const f64_case *c, size_t n)
{
    const char *paths[2];
    int np = own_paths(paths);
    for (int p = 0; p < np; p++) {
        use_f32_path(paths[p]);
        for (size_t i = 0; i < n; i++)
            avx2_matches(c[i].m, c[i].K, c[i].n, c[i].ta, c[i].tb, c[i].alpha, c[i].add);
    }
    use_f32_path(NULL);
    return np > 0;
}

TEST(test_f32_own_kernels_match_f64_at_odd_shapes_in_every_layout)
{
    f64_case c[65];
    size_t n = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 4; k++)
                c[n++] = (f64_case){odd[i], odd[j], odd[k], k & 1, j & 1, 1.0f, false};
    c[n++] = (f64_case){50, 64, 100, false, false, 1.0f, false}; /* panels in pairs and one alone */
    if (!own_kernels_match(c, n)) SKIP(NO_OWN_KERNEL);
}

TEST(test_f32_own_kernels_scale_by_alpha_and_add_to_c)
{
    static const f64_case c[] = {
        {17, 33, 50, false, true, 0.125f, false}, /* attention's q @ k^T * scale */
        {17, 33, 50, true, false, 1.0f, true},    /* a gradient added where it lies */
        {50, 600, 17, true, false, -2.0f, true},  /* both, past two blocks of depth */
        {50, 300, 17, true, false, -2.0f, true},  /* both, in one step past KC */
        {30, 600, 70, true, false, 0.5f, false},  /* scaled, deep, whole pairs of panels */
        {30, 300, 64, false, true, 1.0f, true},   /* added, pairs of panels */
    };
    if (!own_kernels_match(c, sizeof c / sizeof c[0])) SKIP(NO_OWN_KERNEL);
}

TEST(test_f32_own_kernels_match_f64_past_each_block)
{
    static const f64_case c[] = {
        {150, 40, 33, false, false, 1.0f, false},   /* past a block of 144 rows */
        {9, 520, 40, false, true, 1.0f, false},     /* three blocks of depth (256) */
        {40, 512, 1600, false, false, 1.0f, false}, /* one step of 512, past 1536 columns */
        {40, 513, 50, false, true, 1.0f, false},    /* a K past 512: three blocks of depth */
        {20, 300, 300, true, false, 1.0f, true},    /* deep, past 256 columns */
        {1030, 520, 20, true, false, 1.0f, false},  /* deep, past 1024 rows summed together */
        {3, 16, 3100, false, false, 1.0f, false},   /* past 3072 columns */
    };
    if (!own_kernels_match(c, sizeof c / sizeof c[0])) SKIP(NO_OWN_KERNEL);
}

/* em_matmul of f32 (M,K) @ (K,N) on the path now set */
static em_tensor *product(int64_t M, int64_t K, int64_t N, bool tb)
{
    em_rng r = em_rng_new((uint64_t)(M + 3 * K + 5 * N));
    em_tensor *a = em_randn(EM_F32, 2, (int64_t[]){M, K}, &r);
    em_tensor *b = em_randn(EM_F32, 2, tb ? (int64_t[]){N, K} : (int64_t[]){K, N}, &r);
    return em_matmul(a, tb ? em_transpose(b, 0, 1) : b);
}

/* the f32 path auto should take here (gemm_path.c's rule) */
static const char *auto_f32_path(void)
{
    if (gemm_wide_usable() && !blas_sgemm_avx512()) return "avx512";
    return have_avx2() && !em_cpu_detect().avx512f ? "avx2" : "sgemm";
}

TEST(test_f32_paths_agree_and_auto_takes_embers_kernel_where_the_blas_has_none_as_wide)
{
    em_scope s = em_scope_begin();
    use_f32_path(NULL);
    CHECK(!strcmp(em_matmul_path(EM_F32), auto_f32_path()));
    use_f32_path("sgemm");
    CHECK(!strcmp(em_matmul_path(EM_F32), "sgemm"));
    em_tensor *blas = product(300, 70, 90, true);
    const char *paths[2];
    int np = own_paths(paths);
    for (int p = 0; p < np; p++) {
        use_f32_path(paths[p]);
        CHECK(!strcmp(em_matmul_path(EM_F32), paths[p]));
        em_tensor *own = product(300, 70, 90, true);
        CHECK_NOTNULL(own);
        CHECK(th_max_abs_diff(own, blas) < 1e-4); /* K = 70 terms of |x| ~ 1: f32 rounding */
    }
    if (!gemm_wide_usable()) {
        use_f32_path("avx512");
        CHECK_ERR(em_matmul_path(EM_F32), EM_ERR_UNSUPPORTED, "EMBER_F32_PATH=avx512: this CPU");
    }
    use_f32_path(NULL);
    em_scope_end(s);
}

TEST(test_f32_path_setting_names_a_bad_value_and_matmul_reports_it)
{
    em_scope s = em_scope_begin();
    use_f32_path("diagonal");
    CHECK_ERR(em_matmul_path(EM_F32), EM_ERR_ARG,
              "EMBER_F32_PATH='diagonal' is not one of auto, sgemm, avx2, avx512");
    CHECK_ERR(product(20, 20, 20, false), EM_ERR_ARG, "EMBER_F32_PATH='diagonal'");
    use_f32_path(NULL);
    CHECK_NOTNULL(product(20, 20, 20, false));
    em_scope_end(s);
}

TEST(test_f32_avx2_products_do_not_depend_on_the_thread_count)
{
    if (!have_avx2()) SKIP("this CPU has no AVX2+FMA+F16C: the avx2 f32 path cannot run here");
    em_scope s = em_scope_begin();
    use_f32_path("avx2");
    int threads = em_num_threads();
    CHECK_OK(em_set_num_threads(1));
    em_tensor *one = product(768, 128, 384, true);
    CHECK_OK(em_set_num_threads(2));
    em_tensor *two = product(768, 128, 384, true);
    CHECK_OK(em_set_num_threads(threads));
    CHECK(one && two && !memcmp(em_data(one), em_data(two), 768 * 384 * sizeof(float)));
    use_f32_path(NULL);
    em_scope_end(s);
}

/* em_gemm (f32, the avx2 path) of one shape at 1, 2 and 3 threads: split
 * over the pool by rows or by columns (gemm_run), at every thread count the
 * result must be the one thread's bit for bit (each element is one k loop
 * in a fixed order, whoever computes it). bias: a Linear's; add: beta 1. */
static void same_bits_at_any_thread_count(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool bias,
                                          bool add)
{
    int64_t lda = ta ? M + 1 : K + 3, ldb = tb ? K + 2 : N + 1, ldc = N + 5;
    float *A = rand_f32((ta ? K : M) * lda, (uint64_t)(M + 3 * K)), *B = rand_f32((tb ? N : K) * ldb, 11);
    float *bv = rand_f32(N, 12), *C0 = rand_f32(M * ldc, 13), *C[3];
    int threads = em_num_threads();
    for (int t = 0; t < 3; t++) {
        C[t] = malloc((size_t)(M * ldc) * sizeof(float));
        memcpy(C[t], C0, (size_t)(M * ldc) * sizeof(float));
        CHECK_OK(em_set_num_threads(t + 1));
        if (bias)
            em_gemm_bias(EM_F32, ta, tb, M, N, K, 1.0, A, lda, B, ldb, C[t], ldc, bv);
        else
            em_gemm(EM_F32, ta, tb, M, N, K, 1.0, A, lda, B, ldb, add ? 1.0 : 0.0, C[t], ldc);
    }
    CHECK_OK(em_set_num_threads(threads));
    for (int t = 1; t < 3; t++)
        if (memcmp(C[0], C[t], (size_t)(M * ldc) * sizeof(float)))
            th_fail(__FILE__, __LINE__, "(%lld,%lld)%s @ (%lld,%lld)%s%s%s: %d threads differ from 1",
                    (long long)M, (long long)K, ta ? "^T" : "", (long long)K, (long long)N, tb ? "^T" : "",
                    bias ? " + bias" : "", add ? " added" : "", t + 1);
    for (int t = 0; t < 3; t++) free(C[t]);
    free(A), free(B), free(bv), free(C0);
}

TEST(test_f32_avx2_split_products_have_one_threads_bits_in_every_layout)
{
    if (!have_avx2()) SKIP("this CPU has no AVX2+FMA+F16C: the avx2 f32 path cannot run here");
    use_f32_path("avx2");
    same_bits_at_any_thread_count(768, 384, 128, false, true, true, false);   /* a Linear: rows, W^T shared */
    same_bits_at_any_thread_count(768, 128, 384, false, false, false, false); /* its dX */
    same_bits_at_any_thread_count(384, 128, 768, true, false, false, true);   /* its dW, added: deep rows */
    same_bits_at_any_thread_count(128, 512, 768, true, false, false, false);  /* by columns */
    same_bits_at_any_thread_count(100, 700, 600, false, true, true, false);   /* columns, deep, edges */
    same_bits_at_any_thread_count(100, 2000, 400, false, false, false, false); /* columns, one step past KC */
    same_bits_at_any_thread_count(100, 300, 400, false, false, false, false);  /* its parts narrower */
    same_bits_at_any_thread_count(257, 200, 517, true, true, false, true);    /* rows, deep, edges */
    same_bits_at_any_thread_count(60, 3100, 70, false, false, false, false);  /* past 3072 columns */
    /* rows with op(B) packed by the parts together (gemm_shared_b): two
     * column blocks, one step past KC, groups ragged; and an op(B) too
     * large to share (K 512, 2100 columns: two blocks of 1536) */
    same_bits_at_any_thread_count(1030, 3100, 70, false, true, true, false);
    same_bits_at_any_thread_count(600, 1000, 400, false, false, false, true);
    same_bits_at_any_thread_count(700, 90, 33, true, true, false, false);
    same_bits_at_any_thread_count(600, 2100, 512, false, false, false, false);
    use_f32_path(NULL);
}

/* the part that claims the middle group of a shared op(B) fills its
 * panels with NaN and packs them 5 ms late */
static void late_middle_group(int64_t q, int64_t groups, float *dst, size_t n)
{
    if (q != groups / 2) return;
    for (size_t i = 0; i < n; i++) dst[i] = NAN;
    usleep(5000);
}

TEST(test_f32_avx2_parts_sharing_op_b_wait_for_a_group_packed_late)
{
    if (!have_avx2()) SKIP("this CPU has no AVX2+FMA+F16C: the avx2 f32 path cannot run here");
    use_f32_path("avx2");
    gemm_shared_b_hook_for_test(late_middle_group);
    same_bits_at_any_thread_count(768, 384, 128, false, true, true, false);
    same_bits_at_any_thread_count(1030, 3100, 70, false, false, false, false);
    same_bits_at_any_thread_count(384, 128, 768, true, false, false, true); /* a deep K: 3 KC steps */
    gemm_shared_b_hook_for_test(NULL);
    use_f32_path(NULL);
}

/* C of em_gemm (f32, bias and add as in same_bits_at_any_thread_count) on
 * f32 path p, in a new buffer of M * ldc floats (the caller frees it) */
static float *gemm_on(const char *p, int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool bias, bool add,
                      int64_t ldc)
{
    int64_t lda = ta ? M + 1 : K + 3, ldb = tb ? K + 2 : N + 1;
    float *A = rand_f32((ta ? K : M) * lda, (uint64_t)(M + 3 * K)), *B = rand_f32((tb ? N : K) * ldb, 11);
    float *bv = rand_f32(N, 12), *C = rand_f32(M * ldc, 13);
    use_f32_path(p);
    if (bias)
        em_gemm_bias(EM_F32, ta, tb, M, N, K, 1.0, A, lda, B, ldb, C, ldc, bv);
    else
        em_gemm(EM_F32, ta, tb, M, N, K, add ? 1.0 : 0.5, A, lda, B, ldb, add ? 1.0 : 0.0, C, ldc);
    free(A), free(B), free(bv);
    return C;
}

/* whether the avx512 path's C is the avx2 path's bit for bit at one shape
 * (kernel_wide sums each element in the 6x16 kernel's order and puts it
 * the same way); why says where not */
static bool wide_same_bits(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool bias, bool add, char *why,
                           size_t nwhy)
{
    int64_t ldc = N + 3;
    float *n = gemm_on("avx2", M, N, K, ta, tb, bias, add, ldc),
          *w = gemm_on("avx512", M, N, K, ta, tb, bias, add, ldc);
    bool same = !memcmp(n, w, (size_t)(M * ldc) * sizeof(float));
    if (!same)
        snprintf(why, nwhy, "(%lld,%lld)%s @ (%lld,%lld)%s%s%s: avx512 differs from avx2", (long long)M,
                 (long long)K, ta ? "^T" : "", (long long)K, (long long)N, tb ? "^T" : "",
                 bias ? " + bias" : "", add ? " added" : "");
    free(n), free(w);
    return same;
}

/* random operand of n values stored as dt (f32, or bf16/f16 bits) */
static void *rand_as(em_dtype dt, int64_t n, uint64_t seed)
{
    float *f = rand_f32(n, seed);
    if (dt == EM_F32) return f;
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = dt == EM_F16 ? f32_to_f16_bits(f[i]) : f32_to_bf16_bits(f[i]);
    free(f);
    return h;
}

/* whether low-precision products (bf16 and f16; operands low or f32; C low,
 * f32, added, with a bias) on the 6x32 kernel give the 6x16 kernel's bits */
static bool wide_low_same_bits(char *why, size_t nwhy)
{
    static const int64_t shapes[][5] = {{60, 96, 70, 0, 1}, {70, 64, 600, 1, 0}, {19, 100, 33, 0, 0}};
    float *bias = rand_f32(100, 5);
    bool same = true;
    for (int lo = 0; lo < 2; lo++)
        for (int form = 0; form < 5; form++)
            for (size_t s = 0; same && s < sizeof shapes / sizeof shapes[0]; s++) {
                int64_t m = shapes[s][0], n = shapes[s][1], K = shapes[s][2];
                bool ta = shapes[s][3], tb = shapes[s][4];
                em_dtype l = lo ? EM_F16 : EM_BF16;
                gemm_low_dtypes dt = {
                    l,         form & 1 ? EM_F32 : l,  form & 1 ? EM_F32 : l, form ? EM_F32 : l,
                    form == 2, form == 4 ? bias : NULL};
                size_t cs = dt.c == EM_F32 ? 4 : 2;
                void *A = rand_as(dt.a, m * K, 1 + s), *B = rand_as(dt.b, K * n, 2 + s);
                void *C[2];
                for (int p = 0; p < 2; p++) {
                    C[p] = rand_as(dt.c, m * n, 3);
                    use_f32_path(p ? "avx512" : "avx2");
                    CHECK(gemm_widen(dt, ta, tb, m, n, K, A, ta ? m : K, B, tb ? K : n, C[p], n, NULL, 0));
                }
                if (memcmp(C[0], C[1], (size_t)(m * n) * cs)) {
                    same = false;
                    snprintf(why, nwhy, "%s product %lldx%lldx%lld, form %d: avx512 differs from avx2",
                             em_dtype_name(l), (long long)m, (long long)n, (long long)K, form);
                }
                free(A), free(B), free(C[0]), free(C[1]);
            }
    free(bias);
    return same;
}

/* every comparison of the 6x32 kernel with the 6x16 one: f32 products in
 * each layout (a Linear and its gradients, deep, edges, a head of 65
 * columns: pairs of panels, a panel alone and an edge; scaled through
 * store_low; one step past KC; A read where it lies, one step or deep)
 * and the low-precision ones */
static bool wide_gives_avx2s_bits(char *why, size_t n)
{
    bool same = wide_same_bits(768, 384, 128, false, true, true, false, why, n) &&
                wide_same_bits(768, 128, 384, false, false, false, false, why, n) &&
                wide_same_bits(384, 128, 768, true, false, false, true, why, n) &&
                wide_same_bits(128, 512, 768, true, false, false, false, why, n) &&
                wide_same_bits(100, 700, 600, false, true, true, false, why, n) &&
                wide_same_bits(50, 65, 128, false, true, true, false, why, n) &&
                wide_same_bits(37, 48, 40, false, false, false, false, why, n) &&
                wide_same_bits(37, 48, 700, true, true, false, false, why, n) &&
                wide_same_bits(100, 2000, 400, false, false, false, false, why, n) &&
                /* alpha 1, every block whole: A read where it lies */
                wide_same_bits(768, 128, 384, false, false, true, false, why, n) &&
                wide_same_bits(96, 64, 1000, false, false, false, true, why,
                               n) && /* (past 1024: avx2 takes the BLAS) */
                wide_same_bits(96, 64, 1100, true, false, false, true, why, n) &&
                wide_low_same_bits(why, n);
    use_f32_path(NULL);
    return same;
}

TEST(test_f32_avx512_kernel_gives_the_avx2_kernels_bits)
{
    if (!em_cpu_detect().avx512f || !gemm_wide_usable())
        SKIP("this CPU has no AVX-512F: the native 6x32 kernel cannot run here (the emulated one is tested)");
    char why[256] = "";
    if (!wide_gives_avx2s_bits(why, sizeof why)) th_fail(__FILE__, __LINE__, "%s", why);
}

TEST(test_f32_avx512_path_on_the_emulated_kernel_gives_the_avx2_kernels_bits)
{
    if (!have_avx2()) SKIP(NO_OWN_KERNEL);
    gemm_wide_emulate_for_test(gemm_wide_sums_emulated);
    char why[256] = "";
    bool same = wide_gives_avx2s_bits(why, sizeof why);
    gemm_wide_emulate_for_test(NULL);
    if (!same) th_fail(__FILE__, __LINE__, "%s", why);
}

/* the comparison catches a wrong 6x32 kernel: the sums' own source with a
 * bug planted (tests/wide_planted.c) differs from the 6x16 kernel */
TEST(test_f32_avx512_comparison_catches_planted_kernel_bugs)
{
    if (!have_avx2()) SKIP(NO_OWN_KERNEL);
    for (int b = 0; b < WIDE_PLANTED; b++) {
        th_case("%s", wide_planted_sums[b].bug);
        gemm_wide_emulate_for_test(wide_planted_sums[b].sums);
        char why[256] = "";
        CHECK(!wide_gives_avx2s_bits(why, sizeof why));
        gemm_wide_emulate_for_test(NULL);
    }
}
