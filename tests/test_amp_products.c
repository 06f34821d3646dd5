/* test_amp_products.c — which operands autocast casts for a matmul, per
 * product path (docs/ARCHITECTURE.md "Mixed precision"). Where bf16 (or
 * f16) products are computed in f32 anyway (the CPU's f32 path), the
 * matmul reads f32 operands as they are and rounds them as the GEMM packs
 * them: no cast, no bf16 copy of a weight, and the same bits as casting
 * first. Where a fast bf16 product wants bf16 operands (AMX, AVX512-BF16, a
 * GPU), autocast casts them as before; AVX512-BF16's products still write
 * an f32 result themselves (rounded, or added). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"
#include "harness.h"
#include "path_test.h"
#include "tensor/dtype_math.h"
#include "tensor/kernel_impl.h"

/* calls of the cast op the profiler recorded */
static int64_t cast_calls(void)
{
    em_profile_row rows[256];
    int64_t n = em_profile_rows(rows, 256);
    for (int64_t i = 0; i < n && i < 256; i++)
        if (!strcmp(rows[i].name, "cast") && !strcmp(rows[i].category, "op")) return rows[i].calls;
    return 0;
}

/* A Linear's product y = x @ W^T (x (2,3,K), W (N,K), both f32 leaves on
 * dev) under autocast dt, and its backward; returns the casts made, checks
 * the dtypes (y in dt, the gradients in f32). */
static int64_t casts_of_a_linear(em_dtype dt, em_device dev)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(5);
    em_tensor *x = em_to(em_randn(EM_F32, EM_SHAPE(2, 3, 40), &r), dev),
              *w = em_to(em_randn(EM_F32, EM_SHAPE(24, 40), &r), dev);
    em_set_requires_grad(x, true);
    em_set_requires_grad(w, true);
    em_profile_reset();
    em_profile_start();
    em_dtype prev = em_autocast_set(dt);
    em_tensor *y = em_matmul(x, em_transpose(w, 0, 1));
    em_autocast_set(prev);
    CHECK_NOTNULL(y);
    CHECK(em_dtype_of(y) == dt);
    CHECK_OK(em_backward(em_sum(y, 0, NULL, false), NULL));
    em_profile_stop();
    int64_t casts = cast_calls();
    CHECK(em_dtype_of(em_grad(w)) == EM_F32 && em_dtype_of(em_grad(x)) == EM_F32);
    em_scope_end(s);
    return casts;
}

TEST(test_autocast_matmul_on_the_f32_path_casts_no_f32_operand)
{
    use_bf16_path("f32");
    CHECK(casts_of_a_linear(EM_BF16, em_device_cpu()) == 0);
    CHECK(casts_of_a_linear(EM_F16, em_device_cpu()) == 0);
}

TEST(test_autocast_casts_f32_operands_where_the_cpu_has_a_bf16_product)
{
    em_cpu_features f = em_cpu_detect();
    if (!f.avx512bf16)
        SKIP("no AVX512-BF16 on this CPU; the path ran on the emulated kernel instead "
             "(test_autocast_casts_f32_operands_on_the_emulated_avx512bf16_path)");
    use_bf16_path("avx512bf16");
    CHECK(!gemm_low_reads_f32(EM_BF16));
    CHECK(casts_of_a_linear(EM_BF16, em_device_cpu()) == 2); /* x and W */
}

/* the same on any CPU: the avx512bf16 path with the VDPBF16PS kernel's own
 * source on ember's emulation of its intrinsics (tensor/gemm_dpbf16_emu.c) */
TEST(test_autocast_casts_f32_operands_on_the_emulated_avx512bf16_path)
{
    gemm_dpbf16_use_kernel_for_test(dp_kernel_emulated);
    use_bf16_path("avx512bf16");
    CHECK(!gemm_low_reads_f32(EM_BF16));
    CHECK(casts_of_a_linear(EM_BF16, em_device_cpu()) == 2); /* x and W */
    gemm_dpbf16_use_kernel_for_test(NULL);
}

/* element i of a fixed spread of values in [-4, 4) (salt: another spread) */
static float spread(int64_t i, int salt)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)salt * 40503u;
    return (float)(h % 8000u) / 1000.0f - 4.0f;
}

/* The avx512bf16 path (its kernel emulated) writes an f32 C itself: each
 * result rounded to bf16 and kept in f32, or added to C; the bits of its
 * bf16 C widened, or of adding that. */
TEST(test_avx512bf16_products_write_an_f32_c_with_the_bits_of_their_bf16_one)
{
    gemm_dpbf16_use_kernel_for_test(dp_kernel_emulated);
    use_bf16_path("avx512bf16");
    CHECK(!gemm_low_reads_f32(EM_BF16) && gemm_low_writes_f32(EM_BF16));
    static const int64_t shapes[][3] = {{7, 33, 300}, {300, 70, 45}, {9, 600, 40}};
    for (int q = 0; q < 3; q++)
        for (int t = 0; t < 4; t++) {
            int64_t m = shapes[q][0], K = shapes[q][1], n = shapes[q][2];
            bool ta = t & 1, tb = t & 2;
            uint16_t *A = malloc((size_t)(m * K) * 2), *B = malloc((size_t)(K * n) * 2),
                     *C16 = malloc((size_t)(m * n) * 2);
            float *C = malloc((size_t)(m * n) * 4), *D = malloc((size_t)(m * n) * 4);
            for (int64_t i = 0; i < m * K; i++) A[i] = f32_to_bf16_bits(spread(i, 3 + t));
            for (int64_t i = 0; i < K * n; i++) B[i] = f32_to_bf16_bits(spread(i, 5 + q));
            for (int64_t i = 0; i < m * n; i++) D[i] = spread(i, 7);
            int64_t lda = ta ? m : K, ldb = tb ? K : n;
            gemm_low_dtypes lo = {.lo = EM_BF16, .a = EM_BF16, .b = EM_BF16, .c = EM_BF16};
            CHECK_OK(em_gemm_low(lo, ta, tb, m, n, K, A, lda, B, ldb, C16, n));
            lo.c = EM_F32;
            CHECK_OK(em_gemm_low(lo, ta, tb, m, n, K, A, lda, B, ldb, C, n));
            lo.add = true;
            CHECK_OK(em_gemm_low(lo, ta, tb, m, n, K, A, lda, B, ldb, D, n));
            for (int64_t i = 0; i < m * n; i++) {
                float w = bf16_bits_to_f32(C16[i]), sum = spread(i, 7) + w;
                if (memcmp(&C[i], &w, 4) || memcmp(&D[i], &sum, 4)) {
                    th_fail(__FILE__, __LINE__,
                            "(%lld,%lld)%s @ (%lld,%lld)%s [%lld]: f32 C %.9g, added %.9g; bf16 C %.9g",
                            (long long)m, (long long)K, ta ? "^T" : "", (long long)K, (long long)n,
                            tb ? "^T" : "", (long long)i, C[i], D[i], w);
                    break;
                }
            }
            free(A), free(B), free(C16), free(C), free(D);
        }
    gemm_dpbf16_use_kernel_for_test(NULL);
}

TEST(test_autocast_casts_a_cuda_matmuls_f32_operands)
{
    CUDA_OR_SKIP();
    use_bf16_path("f32");
    CHECK(casts_of_a_linear(EM_BF16, em_device_cuda(0)) == 2); /* x and W */
}

TEST(test_products_read_f32_operands_only_where_they_are_computed_in_f32)
{
    CHECK(gemm_low_reads_f32(EM_F16));
    use_bf16_path("f32");
    CHECK(gemm_low_reads_f32(EM_BF16) && gemm_low_writes_f32(EM_BF16) && gemm_low_writes_f32(EM_F16));
    CHECK(!gemm_low_reads_f32(EM_F32) && !gemm_low_reads_f32(EM_F64));
    CHECK(!gemm_low_writes_f32(EM_F32) && !gemm_low_writes_f32(EM_F64));
    use_bf16_path("sideways"); /* a bad setting: cast as before, and the matmul reports it */
    CHECK(!gemm_low_reads_f32(EM_BF16));
    CHECK(em_last_status() == EM_OK);
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2, 2));
    em_dtype prev = em_autocast_set(EM_BF16);
    em_tensor *y = em_matmul(a, a);
    em_autocast_set(prev);
    CHECK(y == NULL && em_last_status() == EM_ERR_ARG);
    em_scope_end(s);
}

/* ---- the same numbers as casting first ------------------------------------------------- */

/* got and want hold the same bits (same dtype and shape) */
static void same_bits(const char *what, em_tensor *got, em_tensor *want)
{
    CHECK(got && want);
    CHECK(em_dtype_of(got) == em_dtype_of(want) && em_numel(got) == em_numel(want));
    size_t n = (size_t)em_numel(got) * em_dtype_size(em_dtype_of(got));
    if (memcmp(em_data(em_contiguous(got)), em_data(em_contiguous(want)), n))
        th_fail(__FILE__, __LINE__, "%s: the bits differ from casting first", what);
}

typedef em_tensor *(*product_fn)(em_tensor *a, em_tensor *b);
static em_tensor *linear(em_tensor *x, em_tensor *w) { return em_matmul(x, em_transpose(w, 0, 1)); }
static em_tensor *plain(em_tensor *a, em_tensor *b) { return em_matmul(a, b); }
/* a permuted a: a layout BLAS takes neither way (copied by the product) */
static em_tensor *permuted(em_tensor *a, em_tensor *b)
{
    return em_matmul(em_permute(a, (int[]){1, 0, 2}), b);
}

/* f(a, b) for f32 leaves a, b under autocast dt, backward with a random
 * cotangent, against f on em_cast copies of a and b with autocast off (what
 * autocast did before it left f32 operands alone): y, a's and b's
 * gradients bit for bit */
static void matches_casting_first(const char *what, em_dtype dt, product_fn f, int na, const int64_t *sa,
                                  int nb, const int64_t *sb)
{
    em_scope s = em_scope_begin();
    em_tensor *y[2], *ga[2], *gb[2];
    for (int k = 0; k < 2; k++) {
        em_rng r = em_rng_new(11);
        em_tensor *a = em_randn(EM_F32, na, sa, &r), *b = em_randn(EM_F32, nb, sb, &r);
        em_set_requires_grad(a, true);
        em_set_requires_grad(b, true);
        if (k == 0) {
            em_dtype prev = em_autocast_set(dt);
            y[k] = f(a, b);
            em_autocast_set(prev);
        } else {
            y[k] = f(em_cast(a, dt), em_cast(b, dt));
        }
        CHECK_NOTNULL(y[k]);
        em_tensor *cot = em_randn(EM_F32, em_ndim(y[k]), em_shape(y[k]), &r);
        CHECK_OK(em_backward(em_sum(em_mul(em_cast(y[k], EM_F32), cot), 0, NULL, false), NULL));
        ga[k] = em_grad(a);
        gb[k] = em_grad(b);
    }
    char name[160];
    snprintf(name, sizeof name, "%s %s: y", what, em_dtype_name(dt));
    same_bits(name, y[0], y[1]);
    snprintf(name, sizeof name, "%s %s: a's gradient", what, em_dtype_name(dt));
    same_bits(name, ga[0], ga[1]);
    snprintf(name, sizeof name, "%s %s: b's gradient", what, em_dtype_name(dt));
    same_bits(name, gb[0], gb[1]);
    em_scope_end(s);
}

TEST(test_autocast_matmul_on_the_f32_path_gives_the_bits_of_casting_first)
{
    use_bf16_path("f32");
    const em_dtype dts[2] = {EM_BF16, EM_F16};
    for (int d = 0; d < 2; d++) {
        em_dtype dt = dts[d];
        /* a Linear over (B,T,C), deeper than one block of the GEMM (256) */
        matches_casting_first("linear", dt, linear, EM_SHAPE(2, 5, 300), EM_SHAPE(37, 300));
        matches_casting_first("linear", dt, linear, EM_SHAPE(7, 33), EM_SHAPE(19, 33));
        /* batched, b broadcast over a's first dim (its gradient summed) */
        matches_casting_first("batched", dt, plain, EM_SHAPE(2, 3, 5, 17), EM_SHAPE(3, 17, 9));
        matches_casting_first("broadcast a", dt, plain, EM_SHAPE(1, 6, 17), EM_SHAPE(4, 17, 9));
        matches_casting_first("permuted", dt, permuted, EM_SHAPE(6, 2, 13), EM_SHAPE(13, 8));
    }
}

/* ---- the GEMM's side ------------------------------------------------------------------ */

/* n f32 values: normal ones, ties of dt's rounding, and specials */
static void rand_f32_with_specials(em_dtype dt, float *x, int64_t n, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    em_scope s = em_scope_begin();
    em_tensor *t = em_randn(EM_F32, 1, (int64_t[]){n}, &r);
    memcpy(x, em_data(t), (size_t)n * 4);
    em_scope_end(s);
    /* halfway between two values of dt (ties to even), NaN, infinities,
     * a subnormal, one past dt's largest */
    float tie = dt == EM_BF16 ? 1.0f + 0x1p-8f : 1.0f + 0x1p-11f;
    const float sp[] = {tie,       -tie,   1.0f + 3 * (tie - 1.0f),           NAN, INFINITY,
                        -INFINITY, 1e-40f, dt == EM_BF16 ? 3.4e38f : 65520.0f};
    for (int64_t i = 0; i < n; i += 13) x[i] = sp[(i / 13) % (int64_t)(sizeof sp / sizeof sp[0])];
}

/* em_gemm_low on f32 A and B (rounded by the GEMM) and on their casts to dt:
 * the same bits, and an f32 C holds exactly the widened low C */
static void f32_operands_match_their_casts(em_dtype dt, int64_t m, int64_t K, int64_t n, bool ta, bool tb)
{
    float *A = malloc((size_t)(m * K) * 4), *B = malloc((size_t)(K * n) * 4),
          *C32 = malloc((size_t)(m * n) * 4);
    uint16_t *A16 = malloc((size_t)(m * K) * 2), *B16 = malloc((size_t)(K * n) * 2),
             *C16 = malloc((size_t)(m * n) * 2), *C16b = malloc((size_t)(m * n) * 2);
    rand_f32_with_specials(dt, A, m * K, (uint64_t)(m + 7 * K));
    rand_f32_with_specials(dt, B, K * n, (uint64_t)(n + 11 * K));
    convert_n(dt, A16, EM_F32, A, m * K);
    convert_n(dt, B16, EM_F32, B, K * n);
    int64_t lda = ta ? m : K, ldb = tb ? K : n;
    CHECK_OK(em_gemm_low((gemm_low_dtypes){.lo = dt, .a = dt, .b = dt, .c = dt}, ta, tb, m, n, K, A16, lda,
                         B16, ldb, C16, n));
    CHECK_OK(em_gemm_low((gemm_low_dtypes){.lo = dt, .a = EM_F32, .b = EM_F32, .c = dt}, ta, tb, m, n, K, A,
                         lda, B, ldb, C16b, n));
    CHECK_OK(em_gemm_low((gemm_low_dtypes){.lo = dt, .a = EM_F32, .b = dt, .c = EM_F32}, ta, tb, m, n, K, A,
                         lda, B16, ldb, C32, n));
    for (int64_t i = 0; i < m * n; i++) {
        float w = dt == EM_BF16 ? bf16_bits_to_f32(C16[i]) : f16_bits_to_f32(C16[i]);
        if (C16b[i] != C16[i] || memcmp(&C32[i], &w, 4))
            th_fail(__FILE__, __LINE__,
                    "%s (%lld,%lld)%s @ (%lld,%lld)%s [%lld]: 0x%04x / %.9g from f32, 0x%04x "
                    "from its cast",
                    em_dtype_name(dt), (long long)m, (long long)K, ta ? "^T" : "", (long long)K, (long long)n,
                    tb ? "^T" : "", (long long)i, C16b[i], C32[i], C16[i]);
    }
    free(A), free(B), free(C32), free(A16), free(B16), free(C16), free(C16b);
}

TEST(test_gemm_rounds_f32_operands_as_a_cast_rounds_them)
{
    use_bf16_path("f32");
    static const int64_t odd[] = {1, 7, 33, 300};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 4; i++)
            for (int t = 0; t < 4; t++)
                f32_operands_match_their_casts(d ? EM_F16 : EM_BF16, odd[i], odd[(i + t) % 4],
                                               odd[(i + 2 * t + 1) % 4], t & 1, t & 2);
}

/* em_gemm_low (f32 A and B rounded by the GEMM, C in dt) at 1, 2 and 3
 * threads: the one thread's bits at each, the parts splitting C's rows and
 * packing op(B) together (gemm_shared_b) */
static void low_same_bits_at_any_thread_count(em_dtype dt, int64_t m, int64_t K, int64_t n, bool tb)
{
    float *A = malloc((size_t)(m * K) * 4), *B = malloc((size_t)(K * n) * 4);
    uint16_t *C[3];
    rand_f32_with_specials(dt, A, m * K, (uint64_t)(m + 3 * K));
    rand_f32_with_specials(dt, B, K * n, (uint64_t)(n + 5 * K));
    int threads = em_num_threads();
    for (int t = 0; t < 3; t++) {
        C[t] = malloc((size_t)(m * n) * 2);
        CHECK_OK(em_set_num_threads(t + 1));
        CHECK_OK(em_gemm_low((gemm_low_dtypes){.lo = dt, .a = EM_F32, .b = EM_F32, .c = dt}, false, tb, m, n,
                             K, A, K, B, tb ? K : n, C[t], n));
    }
    CHECK_OK(em_set_num_threads(threads));
    for (int t = 1; t < 3; t++)
        if (memcmp(C[0], C[t], (size_t)(m * n) * 2))
            th_fail(__FILE__, __LINE__, "%s (%lld,%lld) @ (%lld,%lld)%s: %d threads differ from 1",
                    em_dtype_name(dt), (long long)m, (long long)K, (long long)K, (long long)n, tb ? "^T" : "",
                    t + 1);
    for (int t = 0; t < 3; t++) free(C[t]);
    free(A), free(B);
}

TEST(test_low_products_split_over_threads_have_one_threads_bits)
{
    use_bf16_path("f32");
    for (int d = 0; d < 2; d++) {
        em_dtype dt = d ? EM_F16 : EM_BF16;
        low_same_bits_at_any_thread_count(dt, 768, 128, 384, true);  /* a Linear under autocast */
        low_same_bits_at_any_thread_count(dt, 1030, 70, 3100, false); /* two column blocks */
        low_same_bits_at_any_thread_count(dt, 600, 400, 1000, false);  /* one step past KC */
        low_same_bits_at_any_thread_count(dt, 700, 33, 90, true);     /* ragged groups */
    }
    use_bf16_path(NULL);
}

/* the widening next to sgemm (CPUs without AVX2+FMA), called directly */
TEST(test_widening_next_to_sgemm_rounds_f32_operands_as_a_cast_rounds_them)
{
    enum { m = 37, K = 300, n = 41 };
    for (int d = 0; d < 2; d++) {
        em_dtype dt = d ? EM_F16 : EM_BF16;
        float *A = malloc(m * K * 4), *B = malloc(K * n * 4), *C32 = malloc(m * n * 4);
        uint16_t *A16 = malloc(m * K * 2), *B16 = malloc(K * n * 2), *C16 = malloc(m * n * 2);
        rand_f32_with_specials(dt, A, m * K, 1);
        rand_f32_with_specials(dt, B, K * n, 2);
        convert_n(dt, A16, EM_F32, A, m * K);
        convert_n(dt, B16, EM_F32, B, K * n);
        CHECK(gemm_widen_sgemm((gemm_low_dtypes){.lo = dt, .a = dt, .b = dt, .c = dt}, false, true, m, n, K,
                               A16, K, B16, K, C16, n));
        CHECK(gemm_widen_sgemm((gemm_low_dtypes){.lo = dt, .a = EM_F32, .b = EM_F32, .c = EM_F32}, false,
                               true, m, n, K, A, K, B, K, C32, n));
        for (int i = 0; i < m * n; i++) {
            float w = dt == EM_BF16 ? bf16_bits_to_f32(C16[i]) : f16_bits_to_f32(C16[i]);
            if (memcmp(&C32[i], &w, 4))
                th_fail(__FILE__, __LINE__, "%s [%d]: %.9g from f32, %.9g from its cast", em_dtype_name(dt),
                        i, C32[i], w);
        }
        free(A), free(B), free(C32), free(A16), free(B16), free(C16);
    }
}

/* ---- the ops around a product: no cast pass on the f32 path ------------------------------
 * A bf16 product's output meets an f32 bias (PROMOTE): the add reads the bf16
 * values as they are (op_call.mixed), and its f32 gradient goes back to the
 * product as it is (node.grad_reads_f32), which rounds it as it packs it; a
 * weight's gradient is added where it lies by the GEMM itself. */

/* y = x @ W^T + b for f32 leaves, under autocast dt (k == 0) or on explicit
 * casts with autocast off (k == 1: what autocast did before); two backward
 * passes, so the second adds into the gradients the first left */
static void linear_bias_step(int k, em_dtype dt, em_tensor **y, em_tensor **gx, em_tensor **gw,
                             em_tensor **gb)
{
    em_rng r = em_rng_new(23);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(3, 7, 300), &r), *w = em_randn(EM_F32, EM_SHAPE(45, 300), &r),
              *b = em_randn(EM_F32, EM_SHAPE(45), &r);
    em_set_requires_grad(x, true);
    em_set_requires_grad(w, true);
    em_set_requires_grad(b, true);
    for (int pass = 0; pass < 2; pass++) {
        em_tensor *out;
        if (k == 0) {
            em_dtype prev = em_autocast_set(dt);
            out = em_add(em_matmul(x, em_transpose(w, 0, 1)), b);
            em_autocast_set(prev);
        } else {
            em_tensor *p = em_matmul(em_cast(x, dt), em_transpose(em_cast(w, dt), 0, 1));
            out = em_add(em_cast(p, EM_F32), b);
        }
        CHECK_NOTNULL(out);
        CHECK(em_dtype_of(out) == EM_F32);
        em_tensor *cot = em_randn(EM_F32, em_ndim(out), em_shape(out), &r);
        CHECK_OK(em_backward(em_sum(em_mul(out, cot), 0, NULL, false), NULL));
        *y = out;
    }
    *gx = em_grad(x);
    *gw = em_grad(w);
    *gb = em_grad(b);
}

/* Bytes the backward of y = x @ W^T + b (f32 leaves) leaves in the step
 * scope, under autocast dt (EM_F32: off): the gradients of non-leaves it
 * made. */
static size_t linear_bias_backward_bytes(em_dtype dt)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(29);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(64, 256), &r), *w = em_randn(EM_F32, EM_SHAPE(96, 256), &r),
              *b = em_randn(EM_F32, EM_SHAPE(96), &r);
    em_set_requires_grad(x, true);
    em_set_requires_grad(w, true);
    em_set_requires_grad(b, true);
    em_dtype prev = em_autocast_set(dt);
    em_tensor *out = em_add(em_matmul(x, em_transpose(w, 0, 1)), b);
    em_autocast_set(prev);
    em_tensor *loss = em_sum(em_mul(out, em_randn(EM_F32, EM_SHAPE(64, 96), &r)), 0, NULL, false);
    size_t before = em_arena_in_use();
    CHECK_OK(em_backward(loss, NULL));
    size_t used = em_arena_in_use() - before;
    em_scope_end(s);
    return used;
}

TEST(test_autocast_linear_with_bias_on_the_f32_path_makes_no_cast)
{
    use_bf16_path("f32");
    const em_dtype dts[2] = {EM_BF16, EM_F16};
    for (int d = 0; d < 2; d++) {
        em_scope s = em_scope_begin();
        em_tensor *y, *gx, *gw, *gb;
        em_profile_reset();
        em_profile_start();
        linear_bias_step(0, dts[d], &y, &gx, &gw, &gb);
        em_profile_stop();
        CHECK(cast_calls() == 0);
        CHECK(em_dtype_of(gx) == EM_F32 && em_dtype_of(gw) == EM_F32 && em_dtype_of(gb) == EM_F32);
        em_scope_end(s);
        /* nor a copy the engine makes: no narrower copy of the output's
         * gradient, no dW made beside W's gradient and added to it; the
         * backward keeps what an f32 one keeps */
        size_t low = linear_bias_backward_bytes(dts[d]), f32 = linear_bias_backward_bytes(EM_F32);
        if (low > f32)
            th_fail(__FILE__, __LINE__, "%s: backward kept %zu bytes, f32's %zu", em_dtype_name(dts[d]), low,
                    f32);
    }
}

TEST(test_autocast_linear_with_bias_on_the_f32_path_gives_the_bits_of_casting_first)
{
    use_bf16_path("f32");
    const em_dtype dts[2] = {EM_BF16, EM_F16};
    for (int d = 0; d < 2; d++) {
        em_scope s = em_scope_begin();
        em_tensor *y[2], *gx[2], *gw[2], *gb[2];
        for (int k = 0; k < 2; k++) linear_bias_step(k, dts[d], &y[k], &gx[k], &gw[k], &gb[k]);
        char name[96];
        const char *what[4] = {"y", "x's gradient", "W's gradient (accumulated twice)", "b's gradient"};
        em_tensor *got[4] = {y[0], gx[0], gw[0], gb[0]}, *want[4] = {y[1], gx[1], gw[1], gb[1]};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "linear+bias %s: %s", em_dtype_name(dts[d]), what[i]);
            same_bits(name, got[i], want[i]);
        }
        em_scope_end(s);
    }
}

/* a <op> b for float leaves of dtypes da and db under autocast (which leaves
 * them mixed on the CPU) against the same op on casts of both to the wider
 * dtype with autocast off: the result and both gradients bit for bit */
static void mixed_matches_promoting(em_tensor *(*op)(em_tensor *, em_tensor *), const char *what, em_dtype da,
                                    int na, const int64_t *sa, em_dtype db, int nb, const int64_t *sb)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(31);
    /* values exact in both dtypes' ranges, away from 0 (div) */
    em_tensor *a32 = em_add_scalar(em_rand(EM_F32, na, sa, &r), 0.5),
              *b32 = em_add_scalar(em_rand(EM_F32, nb, sb, &r), 0.5);
    em_tensor *a = em_cast(a32, da), *b = em_cast(b32, db);
    em_set_requires_grad(a, true);
    em_set_requires_grad(b, true);
    em_dtype wide = da == EM_F64 || db == EM_F64 ? EM_F64 : EM_F32;
    em_profile_reset();
    em_profile_start();
    em_dtype prev = em_autocast_set(EM_BF16);
    em_tensor *y = op(a, b);
    em_autocast_set(prev);
    em_profile_stop();
    CHECK_NOTNULL(y);
    CHECK(em_dtype_of(y) == wide);
    if (cast_calls() != 0) th_fail(__FILE__, __LINE__, "%s: the forward cast its inputs", what);
    em_tensor *cot = em_randn(wide, em_ndim(y), em_shape(y), &r);
    CHECK_OK(em_backward(em_sum(em_mul(y, cot), 0, NULL, false), NULL));
    /* copies: zero_grad clears the buffers em_grad hands out */
    em_tensor *ga = em_copy(em_grad(a)), *gb = em_copy(em_grad(b));
    CHECK_OK(em_zero_grad(a));
    CHECK_OK(em_zero_grad(b));
    em_tensor *want = op(em_cast(a, wide), em_cast(b, wide));
    CHECK_OK(em_backward(em_sum(em_mul(want, cot), 0, NULL, false), NULL));
    char name[96];
    snprintf(name, sizeof name, "%s %s,%s: y", what, em_dtype_name(da), em_dtype_name(db));
    same_bits(name, y, want);
    snprintf(name, sizeof name, "%s %s,%s: a's gradient", what, em_dtype_name(da), em_dtype_name(db));
    same_bits(name, ga, em_grad(a));
    snprintf(name, sizeof name, "%s %s,%s: b's gradient", what, em_dtype_name(da), em_dtype_name(db));
    same_bits(name, gb, em_grad(b));
    em_scope_end(s);
}

TEST(test_binary_ops_under_autocast_read_mixed_float_inputs_with_the_bits_of_promoting)
{
    em_tensor *(*ops[4])(em_tensor *, em_tensor *) = {em_add, em_sub, em_mul, em_div};
    const char *names[4] = {"add", "sub", "mul", "div"};
    /* (low, f32) pairs, either way round, and two low dtypes meeting in f32 */
    const em_dtype pairs[][2] = {
        {EM_BF16, EM_F32}, {EM_F32, EM_BF16}, {EM_F16, EM_F32}, {EM_BF16, EM_F16}, {EM_BF16, EM_F64}};
    for (int o = 0; o < 4; o++)
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
            em_dtype da = pairs[p][0], db = pairs[p][1];
            /* same shape (flat), a bias row (rows), and a broadcast column (strided) */
            mixed_matches_promoting(ops[o], names[o], da, EM_SHAPE(5, 1031), db, EM_SHAPE(5, 1031));
            mixed_matches_promoting(ops[o], names[o], da, EM_SHAPE(3, 9, 700), db, EM_SHAPE(700));
            mixed_matches_promoting(ops[o], names[o], da, EM_SHAPE(6, 1), db, EM_SHAPE(6, 37));
        }
}
