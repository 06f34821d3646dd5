/* test_cuda_matmul.c — matmul and the fused causal attention (on q, k, v,
 * and read from one qkv tensor) on CUDA against the CPU (skip without a
 * device).
 *
 * Every comparison starts from the same random inputs rounded to the dtype
 * under test: the reference runs on the CPU in f64 from those rounded
 * values, the device in the dtype itself, and forward and gradients (from
 * one random cotangent, also rounded) must agree to a relative error norm
 * ||got - want|| / ||want|| within the dtype's tolerance: f64 1e-12, f32
 * 1e-5, TF32 2e-3 (10-bit mantissa inputs), f16 1e-3, bf16 1e-2 (one or two
 * roundings of the result). The attention's gradients get more room (f32
 * 5e-5, f16 5e-3, bf16 3e-2): its backward works from the stored output,
 * already rounded to the dtype, through the difference dP - rowsum(dO*O). */
#include <math.h>
#include <string.h>

#include "cuda_test.h"

/* x (any device, any float dtype) as a contiguous f64 tensor on the CPU */
static em_tensor *host64(em_tensor *x) { return em_contiguous(em_cast(em_to(x, em_device_cpu()), EM_F64)); }

/* ||got - want|| / ||want||, both brought to the CPU in f64 */
static double rel_err(em_tensor *got, em_tensor *want)
{
    em_tensor *g = host64(got), *w = host64(want);
    if (!g || !w || em_numel(g) != em_numel(w)) return INFINITY;
    const double *a = em_data(g), *b = em_data(w);
    double num = 0, den = 0;
    for (int64_t i = 0; i < em_numel(g); i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define CHECK_REL(what, got, want, tol)                                                                      \
    do {                                                                                                     \
        double th_e = rel_err((got), (want));                                                                \
        if (!(th_e <= (tol)))                                                                                \
            th_fail(__FILE__, __LINE__, "%s: relative error %.3g > %g; last error: %s", (what), th_e,        \
                    (double)(tol), em_last_error());                                                         \
    } while (0)

typedef em_tensor *(*graph_fn)(em_tensor **in);

/* Runs f on the n inputs x[] (f32, on the CPU) rounded to dt: on the CPU in
 * f64 and on cuda:0 in dt; checks the output (tol) and every input's
 * gradient (gtol). Call inside a scope. */
static void compare(const char *what, graph_fn f, int n, em_tensor **x, em_dtype dt, double tol, double gtol,
                    uint64_t seed)
{
    em_tensor *ref_in[4], *dev_in[4];
    for (int i = 0; i < n; i++) {
        em_tensor *r = em_cast(x[i], dt);
        ref_in[i] = em_detach(em_cast(r, EM_F64));
        dev_in[i] = em_detach(em_to(r, em_device_cuda(0)));
        CHECK(ref_in[i] && dev_in[i]);
        CHECK_OK(em_set_requires_grad(ref_in[i], true));
        CHECK_OK(em_set_requires_grad(dev_in[i], true));
    }
    em_tensor *ref = f(ref_in), *out = f(dev_in);
    CHECK_NOTNULL(ref);
    CHECK_NOTNULL(out);
    CHECK(em_device_of(out).type == EM_CUDA);
    CHECK(em_dtype_of(out) == dt);
    CHECK(em_ndim(out) == em_ndim(ref));
    CHECK(memcmp(em_shape(out), em_shape(ref), sizeof(int64_t) * (size_t)em_ndim(ref)) == 0);
    CHECK_REL(what, out, ref, tol);

    em_rng rng = em_rng_new(seed);
    em_tensor *cot = em_cast(em_randn(EM_F32, em_ndim(ref), em_shape(ref), &rng), dt);
    CHECK_OK(em_backward(ref, em_cast(cot, EM_F64)));
    CHECK_OK(em_backward(out, em_to(cot, em_device_cuda(0))));
    for (int i = 0; i < n; i++) {
        em_tensor *g = em_grad(dev_in[i]);
        CHECK_NOTNULL(g);
        CHECK(em_device_of(g).type == EM_CUDA);
        CHECK_REL(what, g, em_grad(ref_in[i]), gtol);
    }
}

static const em_dtype dtypes[] = {EM_F64, EM_F32, EM_F16, EM_BF16};
static double tol_of(em_dtype dt)
{
    return dt == EM_F64 ? 1e-12 : dt == EM_F32 ? 1e-5 : dt == EM_F16 ? 1e-3 : 1e-2;
}

/* ---- matmul ----------------------------------------------------------------------------- */

static em_tensor *mm(em_tensor **in) { return em_matmul(in[0], in[1]); }
/* a @ W^T, W (N,K): a Linear layer's product, the transpose a view */
static em_tensor *mm_bt(em_tensor **in) { return em_matmul(in[0], em_transpose(in[1], -2, -1)); }
/* a^T @ b with a stored (...,K,M) */
static em_tensor *mm_at(em_tensor **in) { return em_matmul(em_transpose(in[0], -2, -1), in[1]); }
/* a non-contiguous a: (B,M,H,K) permuted to (B,H,M,K) */
static em_tensor *mm_perm(em_tensor **in)
{
    return em_matmul(em_permute(in[0], (const int[]){0, 2, 1, 3}), in[1]);
}

static void compare_mm(const char *what, graph_fn f, em_tensor *a, em_tensor *b)
{
    for (int d = 0; d < 4; d++) {
        char name[96];
        snprintf(name, sizeof name, "%s %s", what, em_dtype_name(dtypes[d]));
        compare(name, f, 2, (em_tensor *[]){a, b}, dtypes[d], tol_of(dtypes[d]), tol_of(dtypes[d]),
                7 + (uint64_t)d);
    }
}

TEST(test_cuda_matmul_2d_matches_the_cpu_in_every_dtype)
{
    CUDA_OR_SKIP();
    em_cuda_set_tf32(false);
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(1);
    compare_mm("(37,45)@(45,29)", mm, em_randn(EM_F32, EM_SHAPE(37, 45), &r),
               em_randn(EM_F32, EM_SHAPE(45, 29), &r));
    compare_mm("(1,64)@(64,1)", mm, em_randn(EM_F32, EM_SHAPE(1, 64), &r),
               em_randn(EM_F32, EM_SHAPE(64, 1), &r));
    em_scope_end(s);
}

TEST(test_cuda_matmul_takes_transposed_operands_as_they_are)
{
    CUDA_OR_SKIP();
    em_cuda_set_tf32(false);
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(2);
    /* (B,T,C) @ W^T with W (N,C): one GEMM over B*T rows, dW through the W^T path */
    compare_mm("(3,17,40)@W^T", mm_bt, em_randn(EM_F32, EM_SHAPE(3, 17, 40), &r),
               em_randn(EM_F32, EM_SHAPE(24, 40), &r));
    compare_mm("a^T@b", mm_at, em_randn(EM_F32, EM_SHAPE(2, 33, 19), &r),
               em_randn(EM_F32, EM_SHAPE(2, 33, 21), &r));
    em_scope_end(s);
}

TEST(test_cuda_matmul_broadcasts_batch_dims)
{
    CUDA_OR_SKIP();
    em_cuda_set_tf32(false);
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(3);
    /* b repeats over a's batch: folds into one GEMM */
    compare_mm("(4,9,16)@(16,11)", mm, em_randn(EM_F32, EM_SHAPE(4, 9, 16), &r),
               em_randn(EM_F32, EM_SHAPE(16, 11), &r));
    /* equal batches, one strided-batched call */
    compare_mm("(2,3,9,16)@(2,3,16,11)", mm, em_randn(EM_F32, EM_SHAPE(2, 3, 9, 16), &r),
               em_randn(EM_F32, EM_SHAPE(2, 3, 16, 11), &r));
    /* a broadcasts over b's batch (stride 0 for a) */
    compare_mm("(1,9,16)@(5,16,11)", mm, em_randn(EM_F32, EM_SHAPE(1, 9, 16), &r),
               em_randn(EM_F32, EM_SHAPE(5, 16, 11), &r));
    /* b broadcasts along an outer dim only: no single batch stride, expanded */
    compare_mm("(2,3,9,16)@(3,16,11)", mm, em_randn(EM_F32, EM_SHAPE(2, 3, 9, 16), &r),
               em_randn(EM_F32, EM_SHAPE(3, 16, 11), &r));
    compare_mm("(2,1,9,16)@(1,3,16,11)", mm, em_randn(EM_F32, EM_SHAPE(2, 1, 9, 16), &r),
               em_randn(EM_F32, EM_SHAPE(1, 3, 16, 11), &r));
    /* a permuted view (batch strides out of order) */
    compare_mm("permuted a", mm_perm, em_randn(EM_F32, EM_SHAPE(2, 9, 3, 16), &r),
               em_randn(EM_F32, EM_SHAPE(2, 3, 16, 11), &r));
    em_scope_end(s);
}

TEST(test_cuda_matmul_tf32_stays_close_to_f32)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(4);
    em_cuda_set_tf32(true);
    em_tensor *a = em_randn(EM_F32, EM_SHAPE(2, 65, 130), &r), *w = em_randn(EM_F32, EM_SHAPE(70, 130), &r);
    compare("tf32 (2,65,130)@W^T", mm_bt, 2, (em_tensor *[]){a, w}, EM_F32, 2e-3, 2e-3, 11);
    em_cuda_set_tf32(false);
    em_scope_end(s);
}

TEST(test_cuda_matmul_with_an_empty_inner_dim_is_zeros)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *a = em_to(em_zeros(EM_F32, EM_SHAPE(3, 0)), em_device_cuda(0));
    em_tensor *b = em_to(em_zeros(EM_F32, EM_SHAPE(0, 4)), em_device_cuda(0));
    em_tensor *out = em_matmul(a, b);
    CHECK_NOTNULL(out);
    CHECK(rel_err(out, em_zeros(EM_F32, EM_SHAPE(3, 4))) == 0);
    em_scope_end(s);
}

TEST(test_cuda_matmul_rejects_operands_on_different_devices)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3));
    em_tensor *b = em_to(em_zeros(EM_F32, EM_SHAPE(3, 2)), em_device_cuda(0));
    CHECK_ERR(em_matmul(a, b), EM_ERR_DEVICE, "matmul");
    CHECK_ERR(em_matmul(b, a), EM_ERR_DEVICE, "matmul");
    em_scope_end(s);
}

/* ---- attention -------------------------------------------------------------------------- */

static em_tensor *attn(em_tensor **in) { return em_attention_causal(in[0], in[1], in[2], 0.0); }
static em_tensor *attn_scaled(em_tensor **in) { return em_attention_causal(in[0], in[1], in[2], 0.3); }
/* q, k, v read from one (B,T,3C) tensor, 3 heads, y (B,T,C) */
static em_tensor *attn_qkv3(em_tensor **in) { return em_attention_causal_qkv(in[0], 3, 0.0); }
static em_tensor *attn_qkv2_scaled(em_tensor **in) { return em_attention_causal_qkv(in[0], 2, 0.3); }
/* q, k, v given as (B,T,H,D), attended as (B,H,T,D) views */
static em_tensor *attn_bthd(em_tensor **in)
{
    const int p[] = {0, 2, 1, 3};
    return em_attention_causal(em_permute(in[0], p), em_permute(in[1], p), em_permute(in[2], p), 0.0);
}

/* f on n inputs of one shape */
static void compare_attn_n(const char *what, graph_fn f, int n, int ndim, const int64_t *shape, em_dtype dt,
                           uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    em_tensor *x[3];
    for (int i = 0; i < n; i++) x[i] = em_randn(EM_F32, ndim, shape, &r);
    double gtol = dt == EM_F64 ? 1e-12 : dt == EM_F32 ? 5e-5 : dt == EM_F16 ? 5e-3 : 3e-2;
    char name[96];
    snprintf(name, sizeof name, "%s %s", what, em_dtype_name(dt));
    compare(name, f, n, x, dt, tol_of(dt), gtol, seed + 100);
}

static void compare_attn(const char *what, graph_fn f, int ndim, const int64_t *shape, em_dtype dt,
                         uint64_t seed)
{
    compare_attn_n(what, f, 3, ndim, shape, dt, seed);
}

TEST(test_cuda_attention_matches_the_cpu_in_every_dtype)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    /* T = 37: not a multiple of the 16-row blocks nor of the 32-row tiles */
    for (int d = 0; d < 4; d++)
        compare_attn("(2,3,37,40)", attn, EM_SHAPE(2, 3, 37, 40), dtypes[d], 20 + (uint64_t)d);
    em_scope_end(s);
}

TEST(test_cuda_attention_handles_long_rows_and_head_dim_128)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    /* rows of several tiles in every dtype; the longest (6 tiles) in f32 only,
     * which keeps the emulated run short */
    compare_attn("(1,2,161,128)", attn, EM_SHAPE(1, 2, 161, 128), EM_F32, 30);
    for (int d = 0; d < 4; d++)
        compare_attn("(1,1,67,128)", attn, EM_SHAPE(1, 1, 67, 128), dtypes[d], 31 + (uint64_t)d);
    compare_attn("(1,1,1,8)", attn, EM_SHAPE(1, 1, 1, 8), EM_F32, 40);
    compare_attn("(2,2,50,7)", attn, EM_SHAPE(2, 2, 50, 7), EM_F32, 41);
    em_scope_end(s);
}

TEST(test_cuda_attention_takes_a_scale_and_strided_views)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    compare_attn("scale 0.3", attn_scaled, EM_SHAPE(2, 2, 45, 32), EM_F32, 50);
    compare_attn("(B,T,H,D) views", attn_bthd, EM_SHAPE(2, 45, 3, 32), EM_F32, 51);
    compare_attn("(B,T,H,D) views", attn_bthd, EM_SHAPE(2, 45, 3, 32), EM_BF16, 52);
    em_scope_end(s);
}

TEST(test_cuda_attention_rejects_a_head_dim_beyond_128)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *q = em_to(em_zeros(EM_F32, EM_SHAPE(1, 1, 4, 129)), em_device_cuda(0));
    CHECK_ERR(em_attention_causal(q, q, q, 0.0), EM_ERR_UNSUPPORTED, "129");
    em_scope_end(s);
}

TEST(test_cuda_attention_rejects_inputs_on_different_devices)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *q = em_zeros(EM_F32, EM_SHAPE(1, 1, 4, 8));
    em_tensor *k = em_to(q, em_device_cuda(0));
    CHECK_ERR(em_attention_causal(q, k, q, 0.0), EM_ERR_DEVICE, "attention");
    em_scope_end(s);
}

/* the views of qkv and y copied to the kernels' (B,H,T,D) and back */
TEST(test_cuda_attention_qkv_matches_the_cpu_in_every_dtype)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    for (int d = 0; d < 4; d++)
        compare_attn_n("qkv (2,37,360) 3 heads", attn_qkv3, 1, EM_SHAPE(2, 37, 360), dtypes[d],
                       60 + (uint64_t)d);
    compare_attn_n("qkv (2,50,42) 2 heads, scale 0.3", attn_qkv2_scaled, 1, EM_SHAPE(2, 50, 42), EM_F32, 64);
    em_scope_end(s);
}

TEST(test_cuda_attention_qkv_rejects_a_head_dim_beyond_128)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *qkv = em_to(em_zeros(EM_F32, EM_SHAPE(1, 4, 3 * 129)), em_device_cuda(0));
    CHECK_ERR(em_attention_causal_qkv(qkv, 1, 0.0), EM_ERR_UNSUPPORTED,
              "attention_qkv: head dim D = 129 is beyond the CUDA kernel's 128: qkv is (1,4,387)");
    em_scope_end(s);
}
