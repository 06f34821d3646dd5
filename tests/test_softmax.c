/* test_softmax.c — softmax and log_softmax: values against numpy references
 * along every dim, stability on huge logits, gradients, dtypes, errors. */
#include <stdlib.h>

#include "fixtures/reduce_ref.h"
#include "harness.h"

static const double *const REF_SM[3] = {REF_SOFTMAX_D0, REF_SOFTMAX_D1, REF_SOFTMAX_D2};
static const double *const REF_LSM[3] = {REF_LOG_SOFTMAX_D0, REF_LOG_SOFTMAX_D1, REF_LOG_SOFTMAX_D2};

static em_tensor *ref_x(em_dtype dt) { return th_tensor(dt, EM_SHAPE(2, 3, 4), REF_X); }

TEST(test_softmax_matches_reference_along_every_dim)
{
    em_scope s = em_scope_begin();
    em_tensor *x = ref_x(EM_F64);
    for (int d = 0; d < 3; d++) {
        em_tensor *y = em_softmax(x, d);
        CHECK(em_ndim(y) == 3 && em_dtype_of(y) == EM_F64);
        th_check_values(__FILE__, __LINE__, y, REF_SM[d], 1e-14);
        th_check_values(__FILE__, __LINE__, em_softmax(x, d - 3), REF_SM[d], 1e-14);
        th_check_values(__FILE__, __LINE__, em_softmax(ref_x(EM_F32), d), REF_SM[d], 1e-6);
    }
    em_scope_end(s);
}

TEST(test_log_softmax_matches_reference_along_every_dim)
{
    em_scope s = em_scope_begin();
    for (int d = 0; d < 3; d++) {
        th_check_values(__FILE__, __LINE__, em_log_softmax(ref_x(EM_F64), d), REF_LSM[d], 1e-13);
        th_check_values(__FILE__, __LINE__, em_log_softmax(ref_x(EM_F32), d), REF_LSM[d], 1e-5);
    }
    em_scope_end(s);
}

TEST(test_softmax_rows_sum_to_one)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(2);
    em_tensor *x = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(37, 1000), &r), 5.0);
    em_tensor *sums = em_sum(em_softmax(x, -1), 1, (int[]){1}, false);
    em_tensor *ones = em_ones(EM_F32, EM_SHAPE(37));
    CHECK(th_max_abs_diff(sums, ones) < 1e-5);
    sums = em_sum(em_softmax(x, 0), 1, (int[]){0}, false);
    CHECK(th_max_abs_diff(sums, em_ones(EM_F32, EM_SHAPE(1000))) < 1e-5);
    em_scope_end(s);
}

TEST(test_softmax_of_huge_logits_stays_finite)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 3), (double[]){1000, 1000, 999, -1000, -1000, -1001});
    double e = exp(-1.0), z = 2 + e;
    CHECK_VALUES(em_softmax(x, 1), 1e-6, 1 / z, 1 / z, e / z, 1 / z, 1 / z, e / z);
    CHECK_VALUES(em_log_softmax(x, 1), 1e-5, -log(z), -log(z), -1 - log(z), -log(z), -log(z), -1 - log(z));
    /* along dim 0: exp(2000) would overflow without the max shift */
    CHECK_VALUES(em_softmax(x, 0), 1e-6, 1, 1, 1, 0, 0, 0);
    CHECK_VALUES(em_log_softmax(x, 0), 1e-3, 0, 0, 0, -2000, -2000, -2000);
    em_scope_end(s);
}

TEST(test_softmax_of_noncontiguous_input_gives_the_same_values)
{
    em_scope s = em_scope_begin();
    em_tensor *nc = th_noncontig(ref_x(EM_F64));
    CHECK(!em_is_contiguous(nc));
    for (int d = 0; d < 3; d++) {
        th_check_values(__FILE__, __LINE__, em_softmax(nc, d), REF_SM[d], 1e-14);
        th_check_values(__FILE__, __LINE__, em_log_softmax(nc, d), REF_LSM[d], 1e-13);
    }
    /* a transposed view: softmax over its dim 0 is softmax over x's last dim */
    em_tensor *t = em_transpose(ref_x(EM_F64), 0, 2);
    em_tensor *y = em_transpose(em_softmax(t, 0), 0, 2);
    th_check_values(__FILE__, __LINE__, em_contiguous(y), REF_SOFTMAX_D2, 1e-14);
    em_scope_end(s);
}

TEST(test_softmax_of_half_dtypes_keeps_the_dtype)
{
    em_scope s = em_scope_begin();
    em_dtype dts[] = {EM_F16, EM_BF16};
    for (int k = 0; k < 2; k++) {
        em_tensor *y = em_softmax(ref_x(dts[k]), 1), *l = em_log_softmax(ref_x(dts[k]), 2);
        CHECK(em_dtype_of(y) == dts[k] && em_dtype_of(l) == dts[k]);
        th_check_values(__FILE__, __LINE__, y, REF_SOFTMAX_D1, 0.01);
        th_check_values(__FILE__, __LINE__, l, REF_LOG_SOFTMAX_D2, 0.06);
    }
    em_scope_end(s);
}

TEST(test_softmax_of_scalar_is_one)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_scalar(EM_F32, 3.5);
    em_tensor *y = em_softmax(x, 0);
    CHECK(em_ndim(y) == 0);
    CHECK_NEAR(em_item(y), 1, 0);
    CHECK_NEAR(em_item(em_log_softmax(x, -1)), 0, 0);
    em_scope_end(s);
}

static em_tensor *f_softmax(em_tensor **x, void *ctx) { return em_softmax(x[0], *(int *)ctx); }
static em_tensor *f_log_softmax(em_tensor **x, void *ctx) { return em_log_softmax(x[0], *(int *)ctx); }

static void grad_cases(const char *what, th_graph_fn f)
{
    em_rng r = em_rng_new(9);
    em_tensor *x = em_randn(EM_F64, EM_SHAPE(3, 4, 5), &r), *nc = th_noncontig(x);
    for (int d = -1; d < 3; d++) {
        GRADCHECK(what, f, &d, 1, &x);
        GRADCHECK(what, f, &d, 1, &nc);
        F32_MATCHES_F64(what, f, &d, 1, &x, 1e-6);
    }
    em_free(x);
    em_free(nc);
}

/* f32 kernels (vectorised exp) against f64, large logits included */
TEST(test_softmax_f32_gradient_matches_f64)
{
    em_rng r = em_rng_new(10);
    em_scope s = em_scope_begin();
    em_tensor *x = em_keep(em_mul_scalar(em_randn(EM_F64, EM_SHAPE(6, 300), &r), 8.0));
    em_tensor *big = em_keep(em_add_scalar(x, 1000.0));
    em_scope_end(s);
    for (int d = 0; d < 2; d++) {
        GRAD_F32_MATCHES_F64(f_softmax, &d, 1, &x, 1e-5);
        GRAD_F32_MATCHES_F64(f_log_softmax, &d, 1, &x, 1e-4);
        GRAD_F32_MATCHES_F64(f_softmax, &d, 1, &big, 1e-5);
    }
    em_free(x);
    em_free(big);
}

/* The vectorised f32 exp keeps softmax accurate over a wide range of logits. */
TEST(test_softmax_f32_is_accurate_over_a_wide_range)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_arange(-90, 10, 0.1, EM_F64);
    int64_t n = em_numel(x);
    double *a = malloc(sizeof(double) * (size_t)n), *b = malloc(sizeof(double) * (size_t)n);
    CHECK_OK(em_to_array(em_softmax(x, 0), EM_F64, a));
    CHECK_OK(em_to_array(em_softmax(em_cast(x, EM_F32), 0), EM_F64, b));
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        if (a[i] > 1e-30) worst = fmax(worst, fabs(b[i] - a[i]) / a[i]);
    free(a);
    free(b);
    CHECK(worst < 1e-5);
    em_scope_end(s);
}

TEST(test_softmax_gradient_matches_finite_difference) { grad_cases("softmax", f_softmax); }
TEST(test_log_softmax_gradient_matches_finite_difference) { grad_cases("log_softmax", f_log_softmax); }

/* The gradient of sum(softmax) is zero: the outputs always sum to one. */
TEST(test_softmax_gradient_of_its_sum_is_zero)
{
    em_tensor *x = em_from_data(EM_F32, EM_SHAPE(2, 3), (float[]){1, 2, 3, -1, 0, 4});
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(em_sum(em_softmax(x, 1), 0, NULL, false), NULL));
    CHECK(em_dtype_of(em_grad(x)) == EM_F32);
    CHECK_VALUES(em_grad(x), 1e-7, 0, 0, 0, 0, 0, 0);
    em_scope_end(s);
    em_free(x);
}

TEST(test_softmax_rejects_integer_input_and_bad_dim)
{
    em_scope s = em_scope_begin();
    em_tensor *i = em_zeros(EM_I32, EM_SHAPE(2, 3));
    CHECK_ERR(em_softmax(i, 1), EM_ERR_DTYPE, "softmax: needs a float tensor, got i32(2,3)");
    CHECK_ERR(em_log_softmax(i, 1), EM_ERR_DTYPE, "log_softmax: needs a float tensor");
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2, 3));
    CHECK_ERR(em_softmax(x, 2), EM_ERR_ARG, "softmax: dim 2 is out of range for a 2-dim tensor");
    CHECK_ERR(em_log_softmax(x, -3), EM_ERR_ARG, "log_softmax: dim -3 is out of range");
    em_scope_end(s);
}
