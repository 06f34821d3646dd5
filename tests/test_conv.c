/* test_conv.c — conv2d, max_pool2d, avg_pool2d: values against numpy
 * (tests/fixtures/gen_conv.py -> conv_ref.h), gradients, f32 vs f64,
 * non-contiguous inputs, half precision, and errors. */
#include "fixtures/conv_ref.h"
#include "harness.h"

static em_tensor *randn(int ndim, const int64_t *shape, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    return em_randn(EM_F64, ndim, shape, &r);
}

static void check_ref(const char *file, int line, em_tensor *y, const double *want, int64_t n, double tol)
{
    if (!y) th_fail(file, line, "result is NULL: %s", em_last_error());
    if (em_numel(y) != n)
        th_fail(file, line, "result has %lld elements, want %lld", (long long)em_numel(y), (long long)n);
    th_check_values(file, line, y, want, tol);
}
#define CHECK_REF(y, want, tol)                                                                              \
    check_ref(__FILE__, __LINE__, (y), (want), (int64_t)(sizeof(want) / sizeof(want[0])), (tol))

/* ---- conv2d values ------------------------------------------------------------------------- */

TEST(test_conv2d_matches_numpy_with_stride2_padding1_and_bias)
{
    em_scope s = em_scope_begin();
    for (int k = 0; k < 2; k++) {
        em_dtype dt = k ? EM_F32 : EM_F64;
        em_tensor *x = th_tensor(dt, EM_SHAPE(2, 3, 5, 5), conv1_x),
                  *w = th_tensor(dt, EM_SHAPE(4, 3, 3, 3), conv1_w);
        em_tensor *b = th_tensor(dt, EM_SHAPE(4), conv1_b);
        em_tensor *y = em_conv2d(x, w, b, 2, 1);
        CHECK(em_ndim(y) == 4 && em_size(y, 0) == 2 && em_size(y, 1) == 4 && em_size(y, 2) == 3 &&
              em_size(y, 3) == 3);
        CHECK(em_dtype_of(y) == dt);
        CHECK_REF(y, conv1_y, k ? 1e-5 : 1e-12);
    }
    em_scope_end(s);
}

TEST(test_conv2d_matches_numpy_with_nonsquare_kernel_and_no_bias)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(1, 2, 4, 5), conv2_x),
              *w = th_tensor(EM_F64, EM_SHAPE(3, 2, 2, 3), conv2_w);
    em_tensor *y = em_conv2d(x, w, NULL, 1, 0);
    CHECK(em_size(y, 2) == 3 && em_size(y, 3) == 3);
    CHECK_REF(y, conv2_y, 1e-12);
    em_scope_end(s);
}

TEST(test_conv2d_matches_numpy_with_1x1_kernel)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 3, 2, 3), conv3_x),
              *w = th_tensor(EM_F32, EM_SHAPE(2, 3, 1, 1), conv3_w);
    CHECK_REF(em_conv2d(x, w, th_tensor(EM_F32, EM_SHAPE(2), conv3_b), 1, 0), conv3_y, 1e-5);
    em_scope_end(s);
}

TEST(test_conv2d_noncontiguous_inputs_give_same_values)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(2, 3, 5, 5), conv1_x),
              *w = th_tensor(EM_F64, EM_SHAPE(4, 3, 3, 3), conv1_w);
    em_tensor *b = th_tensor(EM_F64, EM_SHAPE(4), conv1_b);
    CHECK_REF(em_conv2d(th_noncontig(x), th_noncontig(w), th_noncontig(b), 2, 1), conv1_y, 1e-12);
    /* an NHWC buffer seen as NCHW through permute */
    em_tensor *nhwc = em_contiguous(em_permute(x, (int[]){0, 2, 3, 1}));
    em_tensor *xv = em_permute(nhwc, (int[]){0, 3, 1, 2});
    CHECK(!em_is_contiguous(xv));
    CHECK_REF(em_conv2d(xv, w, b, 2, 1), conv1_y, 1e-12);
    em_scope_end(s);
}

TEST(test_conv2d_half_precision_close_to_f32)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 3, 5, 5), conv1_x),
              *w = th_tensor(EM_F32, EM_SHAPE(4, 3, 3, 3), conv1_w);
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(4), conv1_b);
    em_tensor *y32 = em_conv2d(x, w, b, 2, 1);
    em_dtype dts[2] = {EM_F16, EM_BF16};
    double tol[2] = {0.02, 0.15};
    for (int i = 0; i < 2; i++) {
        em_tensor *y = em_conv2d(em_cast(x, dts[i]), em_cast(w, dts[i]), em_cast(b, dts[i]), 2, 1);
        CHECK(em_dtype_of(y) == dts[i]);
        CHECK(th_max_abs_diff(y, y32) < tol[i]);
    }
    em_scope_end(s);
}

/* ---- conv2d gradients ------------------------------------------------------------------------ */

typedef struct conv_case {
    int stride, padding;
} conv_case;

static em_tensor *f_conv_bias(em_tensor **x, void *ctx)
{
    conv_case *c = ctx;
    return em_conv2d(x[0], x[1], x[2], c->stride, c->padding);
}

static em_tensor *f_conv(em_tensor **x, void *ctx)
{
    conv_case *c = ctx;
    return em_conv2d(x[0], x[1], NULL, c->stride, c->padding);
}

TEST(test_conv2d_gradient_matches_finite_difference_stride2_padding1_bias)
{
    em_scope s = em_scope_begin();
    conv_case c = {2, 1};
    em_tensor *in[3] = {randn(EM_SHAPE(2, 2, 5, 6), 1), randn(EM_SHAPE(3, 2, 3, 3), 2),
                        randn(EM_SHAPE(3), 3)};
    GRADCHECK("conv2d", f_conv_bias, &c, 3, in);
    F32_MATCHES_F64("conv2d", f_conv_bias, &c, 3, in, 1e-5);
    em_tensor *nc[3] = {th_noncontig(in[0]), th_noncontig(in[1]), th_noncontig(in[2])};
    GRADCHECK("conv2d noncontig", f_conv_bias, &c, 3, nc);
    em_scope_end(s);
}

TEST(test_conv2d_gradient_matches_finite_difference_other_geometries)
{
    em_scope s = em_scope_begin();
    conv_case c1 = {1, 0};
    em_tensor *a[2] = {randn(EM_SHAPE(1, 2, 4, 5), 4), randn(EM_SHAPE(2, 2, 2, 3), 5)};
    GRADCHECK("conv2d 2x3 kernel", f_conv, &c1, 2, a);
    em_tensor *b[3] = {randn(EM_SHAPE(2, 3, 2, 3), 6), randn(EM_SHAPE(2, 3, 1, 1), 7), randn(EM_SHAPE(2), 8)};
    GRADCHECK("conv2d 1x1", f_conv_bias, &c1, 3, b);
    F32_MATCHES_F64("conv2d 1x1", f_conv_bias, &c1, 3, b, 1e-5);
    conv_case c3 = {3, 2};
    em_tensor *d[2] = {randn(EM_SHAPE(1, 1, 4, 4), 9), randn(EM_SHAPE(2, 1, 3, 2), 10)};
    GRADCHECK("conv2d stride 3 padding 2", f_conv, &c3, 2, d);
    em_scope_end(s);
}

TEST(test_conv2d_gradient_only_for_inputs_that_need_it)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(1, 1, 3, 3)), *w = em_ones(EM_F32, EM_SHAPE(1, 1, 2, 2));
    em_tensor *b = em_zeros(EM_F32, EM_SHAPE(1));
    CHECK_OK(em_set_requires_grad(b, true));
    CHECK_OK(em_backward(em_sum(em_conv2d(x, w, b, 1, 0), 0, NULL, false), NULL));
    CHECK_VALUES(em_grad(b), 0, 4);
    CHECK(em_grad(x) == NULL && em_grad(w) == NULL);
    em_scope_end(s);
}

TEST(test_conv2d_half_precision_backward_close_to_f32)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 3, 5, 5), conv1_x),
              *w = th_tensor(EM_F32, EM_SHAPE(4, 3, 3, 3), conv1_w);
    em_tensor *xb = em_cast(x, EM_BF16), *wb = em_cast(w, EM_BF16);
    em_tensor *leaves[4] = {x, w, xb, wb};
    for (int i = 0; i < 4; i++) CHECK_OK(em_set_requires_grad(leaves[i], true));
    CHECK_OK(em_backward(em_sum(em_conv2d(x, w, NULL, 2, 1), 0, NULL, false), NULL));
    CHECK_OK(em_backward(em_sum(em_conv2d(xb, wb, NULL, 2, 1), 0, NULL, false), NULL));
    CHECK(em_dtype_of(em_grad(xb)) == EM_BF16 && em_dtype_of(em_grad(wb)) == EM_BF16);
    CHECK(th_max_abs_diff(em_grad(xb), em_grad(x)) < 0.1);
    CHECK(th_max_abs_diff(em_grad(wb), em_grad(w)) < 0.1);
    em_scope_end(s);
}

/* ---- conv2d errors ------------------------------------------------------------------------------- */

TEST(test_conv2d_rejects_channel_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2, 3, 8, 8)), *w = em_zeros(EM_F32, EM_SHAPE(4, 2, 3, 3));
    CHECK_ERR(em_conv2d(x, w, NULL, 1, 0), EM_ERR_SHAPE,
              "conv2d: input (2,3,8,8) has 3 channels but weight (4,2,3,3) expects 2");
    em_scope_end(s);
}

TEST(test_conv2d_rejects_empty_output_bad_bias_and_bad_args)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(1, 1, 2, 2)), *w = em_zeros(EM_F32, EM_SHAPE(1, 1, 3, 3));
    CHECK_ERR(em_conv2d(x, w, NULL, 1, 0), EM_ERR_SHAPE,
              "conv2d: kernel 3x3 does not fit input (1,1,2,2) with padding 0");
    CHECK(em_conv2d(x, w, NULL, 1, 1) != NULL); /* padding 1 makes it fit */
    CHECK_ERR(em_conv2d(x, w, em_zeros(EM_F32, EM_SHAPE(2)), 1, 1), EM_ERR_SHAPE,
              "conv2d: bias (2,) must be (1,) for weight (1,1,3,3)");
    CHECK_ERR(em_conv2d(x, w, NULL, 0, 1), EM_ERR_ARG, "conv2d: stride 0 must be >= 1");
    CHECK_ERR(em_conv2d(x, w, NULL, 1, -1), EM_ERR_ARG, "padding -1");
    CHECK_ERR(em_conv2d(em_zeros(EM_F32, EM_SHAPE(1, 2, 2)), w, NULL, 1, 0), EM_ERR_SHAPE,
              "conv2d: input must be 4-D (N,C,H,W), got (1,2,2)");
    em_scope_end(s);
}

TEST(test_conv2d_rejects_bad_dtypes)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(1, 1, 4, 4)), *w = em_zeros(EM_F64, EM_SHAPE(1, 1, 3, 3));
    CHECK_ERR(em_conv2d(x, w, NULL, 1, 0), EM_ERR_DTYPE,
              "conv2d: dtypes differ: f32(1,1,4,4) and f64(1,1,3,3)");
    CHECK_ERR(
        em_conv2d(em_zeros(EM_I32, EM_SHAPE(1, 1, 4, 4)), em_zeros(EM_I32, EM_SHAPE(1, 1, 3, 3)), NULL, 1, 0),
        EM_ERR_DTYPE, "conv2d: needs a float tensor, got i32(1,1,4,4)");
    em_scope_end(s);
}

/* ---- pooling ---------------------------------------------------------------------------------------- */

TEST(test_max_pool2d_matches_numpy_with_padding)
{
    em_scope s = em_scope_begin();
    for (int k = 0; k < 2; k++) {
        em_tensor *x = th_tensor(k ? EM_F32 : EM_F64, EM_SHAPE(2, 2, 5, 5), pool_x);
        em_tensor *y = em_max_pool2d(x, 3, 2, 1);
        CHECK(em_size(y, 2) == 3 && em_size(y, 3) == 3);
        CHECK_REF(y, maxpool_y, 1e-6);
        CHECK_REF(em_max_pool2d(th_noncontig(x), 3, 2, 1), maxpool_y, 1e-6);
    }
    em_scope_end(s);
}

TEST(test_avg_pool2d_matches_numpy_counting_padding)
{
    em_scope s = em_scope_begin();
    for (int k = 0; k < 2; k++) {
        em_tensor *x = th_tensor(k ? EM_F32 : EM_F64, EM_SHAPE(2, 2, 5, 5), pool_x);
        CHECK_REF(em_avg_pool2d(x, 3, 2, 1), avgpool_y, k ? 1e-5 : 1e-12);
        CHECK_REF(em_avg_pool2d(th_noncontig(x), 3, 2, 1), avgpool_y, k ? 1e-5 : 1e-12);
    }
    /* corner window of a ones image with padding 1: 4 of 9 cells are real */
    CHECK_VALUES(em_avg_pool2d(em_ones(EM_F32, EM_SHAPE(1, 1, 2, 2)), 3, 1, 1), 1e-7, 4.0 / 9, 4.0 / 9,
                 4.0 / 9, 4.0 / 9);
    em_scope_end(s);
}

TEST(test_pools_keep_half_precision_dtype)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_BF16, EM_SHAPE(2, 2, 5, 5), pool_x);
    em_tensor *y = em_max_pool2d(x, 3, 2, 1);
    CHECK(em_dtype_of(y) == EM_BF16);
    CHECK_REF(y, maxpool_y, 0.02);
    em_tensor *z = em_avg_pool2d(em_cast(x, EM_F16), 3, 2, 1);
    CHECK(em_dtype_of(z) == EM_F16);
    CHECK_REF(z, avgpool_y, 0.02);
    em_scope_end(s);
}

typedef struct pool_case {
    int kernel, stride, padding;
} pool_case;

static em_tensor *f_max(em_tensor **x, void *ctx)
{
    pool_case *c = ctx;
    return em_max_pool2d(x[0], c->kernel, c->stride, c->padding);
}

static em_tensor *f_avg(em_tensor **x, void *ctx)
{
    pool_case *c = ctx;
    return em_avg_pool2d(x[0], c->kernel, c->stride, c->padding);
}

TEST(test_max_pool2d_gradient_matches_finite_difference)
{
    em_scope s = em_scope_begin();
    pool_case c = {3, 2, 1};
    em_tensor *in[1] = {th_tensor(EM_F64, EM_SHAPE(2, 2, 5, 5), pool_x)}; /* distinct values: no ties */
    GRADCHECK("max_pool2d", f_max, &c, 1, in);
    F32_MATCHES_F64("max_pool2d", f_max, &c, 1, in, 1e-7);
    em_tensor *nc[1] = {th_noncontig(in[0])};
    GRADCHECK("max_pool2d noncontig", f_max, &c, 1, nc);
    pool_case c2 = {2, 1, 0}; /* overlapping windows: one element can win several */
    GRADCHECK("max_pool2d overlapping", f_max, &c2, 1, in);
    em_scope_end(s);
}

TEST(test_max_pool2d_backward_routes_to_the_argmax)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(1, 1, 2, 4), (double[]){1, 5, 2, 0, 3, 4, 7, 6});
    CHECK_OK(em_set_requires_grad(x, true));
    em_tensor *y = em_max_pool2d(x, 2, 2, 0);
    CHECK_VALUES(y, 0, 5, 7);
    CHECK_OK(em_backward(y, th_tensor(EM_F32, EM_SHAPE(1, 1, 1, 2), (double[]){10, 20})));
    CHECK_VALUES(em_grad(x), 0, 0, 10, 0, 0, 0, 0, 20, 0);
    em_scope_end(s);
}

TEST(test_avg_pool2d_gradient_matches_finite_difference)
{
    em_scope s = em_scope_begin();
    pool_case c = {3, 2, 1};
    em_tensor *in[1] = {randn(EM_SHAPE(2, 2, 5, 6), 11)};
    GRADCHECK("avg_pool2d", f_avg, &c, 1, in);
    F32_MATCHES_F64("avg_pool2d", f_avg, &c, 1, in, 1e-6);
    em_tensor *nc[1] = {th_noncontig(in[0])};
    GRADCHECK("avg_pool2d noncontig", f_avg, &c, 1, nc);
    pool_case c2 = {2, 1, 0};
    GRADCHECK("avg_pool2d overlapping", f_avg, &c2, 1, in);
    em_scope_end(s);
}

TEST(test_pools_reject_bad_arguments)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(1, 1, 2, 2));
    CHECK_ERR(em_max_pool2d(x, 3, 1, 0), EM_ERR_SHAPE,
              "max_pool2d: kernel 3 does not fit input (1,1,2,2) with padding 0");
    CHECK_ERR(em_avg_pool2d(x, 2, 1, 2), EM_ERR_ARG,
              "avg_pool2d: padding 2 must be at most half the kernel 2");
    CHECK_ERR(em_max_pool2d(x, 2, 0, 0), EM_ERR_ARG, "max_pool2d: kernel 2 and stride 0 must be >= 1");
    CHECK_ERR(em_avg_pool2d(em_zeros(EM_F32, EM_SHAPE(2, 2)), 2, 1, 0), EM_ERR_SHAPE,
              "avg_pool2d: input must be 4-D (N,C,H,W), got (2,2)");
    CHECK_ERR(em_max_pool2d(em_zeros(EM_U8, EM_SHAPE(1, 1, 2, 2)), 2, 1, 0), EM_ERR_DTYPE,
              "max_pool2d: needs a float tensor, got u8(1,1,2,2)");
    em_scope_end(s);
}
