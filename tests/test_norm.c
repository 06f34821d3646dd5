/* test_norm.c — layer_norm and rms_norm: values against numpy references,
 * normalised statistics, accuracy under a large offset, gradients with and
 * without weight/bias, dtypes, errors. */
#include "fixtures/reduce_ref.h"
#include "harness.h"

static em_tensor *nx(em_dtype dt) { return th_tensor(dt, EM_SHAPE(3, 5), REF_NX); }
static em_tensor *nw(em_dtype dt) { return th_tensor(dt, EM_SHAPE(5), REF_NW); }
static em_tensor *nb(em_dtype dt) { return th_tensor(dt, EM_SHAPE(5), REF_NB); }

TEST(test_layer_norm_matches_reference)
{
    em_scope s = em_scope_begin();
    em_tensor *y = em_layer_norm(nx(EM_F64), nw(EM_F64), nb(EM_F64), 1e-5);
    CHECK(em_dtype_of(y) == EM_F64 && em_ndim(y) == 2);
    th_check_values(__FILE__, __LINE__, y, REF_LAYER_NORM, 1e-12);
    th_check_values(__FILE__, __LINE__, em_layer_norm(nx(EM_F64), NULL, NULL, 1e-5), REF_LAYER_NORM_PLAIN,
                    1e-12);
    th_check_values(__FILE__, __LINE__, em_layer_norm(nx(EM_F32), nw(EM_F32), nb(EM_F32), 1e-5),
                    REF_LAYER_NORM, 1e-5);
    em_scope_end(s);
}

TEST(test_rms_norm_matches_reference)
{
    em_scope s = em_scope_begin();
    th_check_values(__FILE__, __LINE__, em_rms_norm(nx(EM_F64), nw(EM_F64), 1e-6), REF_RMS_NORM, 1e-12);
    th_check_values(__FILE__, __LINE__, em_rms_norm(nx(EM_F32), nw(EM_F32), 1e-6), REF_RMS_NORM, 1e-5);
    /* without weight it is the weighted result divided by the weight */
    em_tensor *plain = em_rms_norm(nx(EM_F64), NULL, 1e-6);
    th_check_values(__FILE__, __LINE__, em_mul(plain, nw(EM_F64)), REF_RMS_NORM, 1e-12);
    em_scope_end(s);
}

TEST(test_layer_norm_rows_have_zero_mean_and_unit_variance)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(4);
    em_tensor *x = em_add_scalar(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(4, 8, 768), &r), 3.0), 2.0);
    em_tensor *y = em_layer_norm(x, NULL, NULL, 0.0);
    em_tensor *mean = em_mean(y, 1, (int[]){-1}, false);
    em_tensor *var = em_mean(em_mul(y, y), 1, (int[]){-1}, false);
    CHECK(th_max_abs_diff(mean, em_zeros(EM_F32, EM_SHAPE(4, 8))) < 1e-5);
    CHECK(th_max_abs_diff(var, em_ones(EM_F32, EM_SHAPE(4, 8))) < 1e-4);
    em_tensor *ms =
        em_mean(em_mul(em_rms_norm(x, NULL, 0.0), em_rms_norm(x, NULL, 0.0)), 1, (int[]){-1}, false);
    CHECK(th_max_abs_diff(ms, em_ones(EM_F32, EM_SHAPE(4, 8))) < 1e-4);
    em_scope_end(s);
}

/* A naive E[x^2] - E[x]^2 loses everything at an offset of 1e8. */
TEST(test_layer_norm_is_accurate_under_a_large_offset)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(1, 4), (double[]){1e8 + 1, 1e8 + 2, 1e8 + 3, 1e8 + 4});
    double k = 1 / sqrt(1.25);
    CHECK_VALUES(em_layer_norm(x, NULL, NULL, 0.0), 1e-7, -1.5 * k, -0.5 * k, 0.5 * k, 1.5 * k);
    em_scope_end(s);
}

TEST(test_norms_of_noncontiguous_input_give_the_same_values)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_noncontig(nx(EM_F64)), *w = th_noncontig(nw(EM_F64)), *b = th_noncontig(nb(EM_F64));
    CHECK(!em_is_contiguous(x) && !em_is_contiguous(w));
    th_check_values(__FILE__, __LINE__, em_layer_norm(x, w, b, 1e-5), REF_LAYER_NORM, 1e-12);
    th_check_values(__FILE__, __LINE__, em_rms_norm(x, w, 1e-6), REF_RMS_NORM, 1e-12);
    em_scope_end(s);
}

TEST(test_norms_of_half_dtypes_keep_the_dtype)
{
    em_scope s = em_scope_begin();
    em_dtype dts[] = {EM_F16, EM_BF16};
    for (int k = 0; k < 2; k++) {
        em_tensor *y = em_layer_norm(nx(dts[k]), nw(dts[k]), nb(dts[k]), 1e-5);
        em_tensor *z = em_rms_norm(nx(dts[k]), nw(dts[k]), 1e-6);
        CHECK(em_dtype_of(y) == dts[k] && em_dtype_of(z) == dts[k]);
        th_check_values(__FILE__, __LINE__, y, REF_LAYER_NORM, 0.05);
        th_check_values(__FILE__, __LINE__, z, REF_RMS_NORM, 0.05);
    }
    em_scope_end(s);
}

static em_tensor *f_ln_wb(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_layer_norm(x[0], x[1], x[2], 1e-5);
}
static em_tensor *f_ln_w(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_layer_norm(x[0], x[1], NULL, 1e-5);
}
static em_tensor *f_ln_b(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_layer_norm(x[0], NULL, x[1], 1e-5);
}
static em_tensor *f_ln(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_layer_norm(x[0], NULL, NULL, 1e-5);
}
static em_tensor *f_rms_w(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_rms_norm(x[0], x[1], 1e-6);
}
static em_tensor *f_rms(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_rms_norm(x[0], NULL, 1e-6);
}

/* x (2,3,6), weight and bias (6): f64 gradcheck, non-contiguous too, and f32. */
static void grad_case(const char *what, th_graph_fn f, int n)
{
    em_rng r = em_rng_new(21);
    em_tensor *in[3] = {em_randn(EM_F64, EM_SHAPE(2, 3, 6), &r), em_randn(EM_F64, EM_SHAPE(6), &r),
                        em_randn(EM_F64, EM_SHAPE(6), &r)};
    GRADCHECK(what, f, NULL, n, in);
    F32_MATCHES_F64(what, f, NULL, n, in, 1e-5);
    em_tensor *nc[3] = {th_noncontig(in[0]), th_noncontig(in[1]), th_noncontig(in[2])};
    GRADCHECK(what, f, NULL, n, nc);
    for (int i = 0; i < 3; i++) {
        em_free(in[i]);
        em_free(nc[i]);
    }
}

TEST(test_layer_norm_gradient_matches_finite_difference) { grad_case("layer_norm", f_ln_wb, 3); }
TEST(test_layer_norm_weight_only_gradient_matches_finite_difference)
{
    grad_case("layer_norm(w)", f_ln_w, 2);
}
TEST(test_layer_norm_bias_only_gradient_matches_finite_difference) { grad_case("layer_norm(b)", f_ln_b, 2); }
TEST(test_layer_norm_plain_gradient_matches_finite_difference) { grad_case("layer_norm()", f_ln, 1); }
TEST(test_rms_norm_gradient_matches_finite_difference) { grad_case("rms_norm", f_rms_w, 2); }
TEST(test_rms_norm_plain_gradient_matches_finite_difference) { grad_case("rms_norm()", f_rms, 1); }

TEST(test_norms_f32_gradient_matches_f64)
{
    em_rng r = em_rng_new(12);
    em_scope s = em_scope_begin();
    em_tensor *x = em_keep(em_add_scalar(em_randn(EM_F64, EM_SHAPE(2, 50, 96), &r), 3.0));
    em_scope_end(s);
    em_tensor *in[3] = {x, em_randn(EM_F64, EM_SHAPE(96), &r), em_randn(EM_F64, EM_SHAPE(96), &r)};
    GRAD_F32_MATCHES_F64(f_ln_wb, NULL, 3, in, 1e-4);
    GRAD_F32_MATCHES_F64(f_ln, NULL, 1, in, 1e-4);
    GRAD_F32_MATCHES_F64(f_rms_w, NULL, 2, in, 1e-4);
    GRAD_F32_MATCHES_F64(f_rms, NULL, 1, in, 1e-4);
    for (int i = 0; i < 3; i++) em_free(in[i]);
}

/* Rows split across threads each keep their own weight/bias partial sums. */
TEST(test_layer_norm_parameter_gradients_sum_over_many_rows)
{
    em_set_num_threads(4);
    em_tensor *w = em_ones(EM_F32, EM_SHAPE(16)), *b = em_zeros(EM_F32, EM_SHAPE(16));
    CHECK_OK(em_set_requires_grad(w, true));
    CHECK_OK(em_set_requires_grad(b, true));
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(8);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(5000, 16), &r);
    em_tensor *y = em_layer_norm(x, w, b, 1e-5);
    CHECK_OK(em_backward(em_sum(y, 0, NULL, false), NULL));
    /* d/db = number of rows; d/dw = sum of xhat over rows (matches a direct sum) */
    CHECK(th_max_abs_diff(em_grad(b), em_full(EM_F32, EM_SHAPE(16), 5000)) < 1e-3);
    em_tensor *xhat = em_layer_norm(em_detach(x), NULL, NULL, 1e-5);
    CHECK(th_max_abs_diff(em_grad(w), em_sum(xhat, 1, (int[]){0}, false)) < 1e-3);
    em_scope_end(s);
    em_free(w);
    em_free(b);
}

/* Without a weight the bias is the op's second input: it is added, not
 * multiplied, and its gradient is the number of rows. */
TEST(test_layer_norm_with_bias_only_adds_the_bias)
{
    em_tensor *b = nb(EM_F64);
    CHECK_OK(em_set_requires_grad(b, true));
    em_scope s = em_scope_begin();
    em_tensor *y = em_layer_norm(nx(EM_F64), NULL, b, 1e-5);
    CHECK(th_max_abs_diff(y, em_add(em_layer_norm(nx(EM_F64), NULL, NULL, 1e-5), b)) < 1e-12);
    CHECK_OK(em_backward(em_sum(y, 0, NULL, false), NULL));
    CHECK(th_max_abs_diff(em_grad(b), em_full(EM_F64, EM_SHAPE(5), 3)) < 1e-12);
    em_scope_end(s);
    em_free(b);
}

TEST(test_norms_reject_bad_weight_and_bias)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2, 5));
    em_tensor *w4 = em_ones(EM_F32, EM_SHAPE(4)), *w5 = em_ones(EM_F32, EM_SHAPE(5));
    CHECK_ERR(em_layer_norm(x, w4, NULL, 1e-5), EM_ERR_SHAPE,
              "layer_norm: weight is (4,), expected (5,) to match the last dim of x (2,5)");
    CHECK_ERR(em_layer_norm(x, w5, em_ones(EM_F32, EM_SHAPE(1, 5)), 1e-5), EM_ERR_SHAPE,
              "layer_norm: bias is (1,5), expected (5,)");
    CHECK_ERR(em_layer_norm(x, w5, em_ones(EM_F64, EM_SHAPE(5)), 1e-5), EM_ERR_DTYPE,
              "layer_norm: bias is f64(5,) but x is f32(2,5)");
    CHECK_ERR(em_rms_norm(x, w4, 1e-5), EM_ERR_SHAPE, "rms_norm: weight is (4,), expected (5,)");
    CHECK_ERR(em_rms_norm(em_zeros(EM_I32, EM_SHAPE(2, 5)), NULL, 1e-5), EM_ERR_DTYPE,
              "rms_norm: needs a float tensor, got i32(2,5)");
    CHECK_ERR(em_layer_norm(em_scalar(EM_F32, 1), NULL, NULL, 1e-5), EM_ERR_SHAPE,
              "layer_norm: x must have at least 1 dim");
    CHECK_ERR(em_layer_norm(x, NULL, NULL, -1), EM_ERR_ARG,
              "layer_norm: eps must be finite and >= 0, got -1");
    em_scope_end(s);
}

/* Widths that are not a multiple of 8 take the kernels' scalar tails beside
 * their 8-wide loops; a strided x is gathered into rows first. */
TEST(test_layer_norm_f32_gradient_matches_f64_at_odd_widths)
{
    const int64_t widths[] = {1, 7, 13, 77};
    for (int k = 0; k < 4; k++) {
        em_rng r = em_rng_new(30 + (uint64_t)k);
        int64_t C = widths[k];
        em_tensor *in[3] = {em_randn(EM_F64, EM_SHAPE(9, C), &r), em_randn(EM_F64, EM_SHAPE(C), &r),
                            em_randn(EM_F64, EM_SHAPE(C), &r)};
        GRAD_F32_MATCHES_F64(f_ln_wb, NULL, 3, in, 1e-4);
        GRAD_F32_MATCHES_F64(f_rms_w, NULL, 2, in, 1e-4);
        em_tensor *nc = th_noncontig(in[0]);
        em_tensor *nin[3] = {nc, in[1], in[2]};
        GRAD_F32_MATCHES_F64(f_ln_wb, NULL, 3, nin, 1e-4);
        em_free(nc);
        for (int i = 0; i < 3; i++) em_free(in[i]);
    }
}

/* dx, dweight and dbias of (rows, C) into the n buffers of out (f32), with n threads */
static void ln_grads_at(int threads, em_tensor *x0, em_tensor *w0, em_tensor *b0, em_tensor *g, float *out[3])
{
    CHECK_OK(em_set_num_threads(threads));
    em_scope s = em_scope_begin();
    em_tensor *x = em_detach(x0), *w = em_detach(w0), *b = em_detach(b0);
    em_tensor *leaves[3] = {x, w, b};
    for (int i = 0; i < 3; i++) CHECK_OK(em_set_requires_grad(leaves[i], true));
    CHECK_OK(em_backward(em_layer_norm(x, w, b, 1e-5), g));
    for (int i = 0; i < 3; i++)
        memcpy(out[i], em_data(em_grad(leaves[i])), sizeof(float) * (size_t)em_numel(leaves[i]));
    for (int i = 0; i < 3; i++) CHECK_OK(em_set_requires_grad(leaves[i], false));
    em_scope_end(s);
}

/* The weight and bias gradients sum per-row terms over row ranges; the
 * ranges are set by the shape, so the bits do not depend on the threads
 * (DDP and ZeRO compare ranks bitwise). */
TEST(test_layer_norm_gradients_have_the_same_bits_at_one_and_two_threads)
{
    int prev = em_num_threads();
    enum { R = 2000, C = 37 };
    em_rng r = em_rng_new(40);
    em_scope s = em_scope_begin();
    em_tensor *x = em_add_scalar(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(R, C), &r), 3.0), 1.0);
    em_tensor *w = em_randn(EM_F32, EM_SHAPE(C), &r), *b = em_randn(EM_F32, EM_SHAPE(C), &r);
    em_tensor *g = em_randn(EM_F32, EM_SHAPE(R, C), &r);
    static float one[3][R * C], two[3][R * C];
    ln_grads_at(1, x, w, b, g, (float *[]){one[0], one[1], one[2]});
    ln_grads_at(2, x, w, b, g, (float *[]){two[0], two[1], two[2]});
    CHECK(!memcmp(one[0], two[0], sizeof(float) * R * C));
    CHECK(!memcmp(one[1], two[1], sizeof(float) * C));
    CHECK(!memcmp(one[2], two[2], sizeof(float) * C));
    em_scope_end(s);
    CHECK_OK(em_set_num_threads(prev));
}
