/* test_reduce.c — sum, mean, max/min, argmax: values against numpy
 * references (tests/fixtures/gen_reduce.py), fast paths against the strided
 * path, accuracy of long f32 sums, empty reductions, gradients, errors. */
#include <stdlib.h>

#include "fixtures/reduce_ref.h"
#include "harness.h"

static em_tensor *ref_x(em_dtype dt) { return th_tensor(dt, EM_SHAPE(2, 3, 4), REF_X); }

static void check_shape(em_tensor *t, int ndim, const int64_t *shape)
{
    CHECK_NOTNULL(t);
    CHECK(em_ndim(t) == ndim);
    for (int i = 0; i < ndim; i++) CHECK(em_shape(t)[i] == shape[i]);
}

/* ---- sum ---------------------------------------------------------------------------- */

TEST(test_sum_over_dims_matches_reference)
{
    em_scope s = em_scope_begin();
    em_tensor *x = ref_x(EM_F64);
    em_tensor *a = em_sum(x, 1, (int[]){1}, false);
    check_shape(a, EM_SHAPE(2, 4));
    th_check_values(__FILE__, __LINE__, a, REF_SUM_D1, 1e-12);
    em_tensor *b = em_sum(x, 2, (int[]){0, -1}, false);
    check_shape(b, EM_SHAPE(3));
    th_check_values(__FILE__, __LINE__, b, REF_SUM_D02, 1e-12);
    /* the same through the f32 fast paths */
    th_check_values(__FILE__, __LINE__, em_sum(ref_x(EM_F32), 1, (int[]){1}, false), REF_SUM_D1, 1e-5);
    em_scope_end(s);
}

TEST(test_sum_keepdim_leaves_size_one_dims)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_sum(ref_x(EM_F32), 2, (int[]){0, 2}, true);
    check_shape(a, EM_SHAPE(1, 3, 1));
    th_check_values(__FILE__, __LINE__, a, REF_SUM_D02, 1e-5);
    em_scope_end(s);
}

TEST(test_sum_of_all_dims_is_a_scalar)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    em_tensor *a = em_sum(x, 0, NULL, false);
    CHECK(em_ndim(a) == 0);
    CHECK_NEAR(em_item(a), 21, 0);
    check_shape(em_sum(x, 0, NULL, true), EM_SHAPE(1, 1));
    em_scope_end(s);
}

TEST(test_sum_of_million_f32_ones_is_exact)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(1000000));
    CHECK_NEAR(em_item(em_sum(x, 0, NULL, false)), 1e6, 0);
    em_tensor *m = em_ones(EM_F32, EM_SHAPE(1000, 1000));
    em_tensor *rows = em_sum(m, 1, (int[]){1}, false), *cols = em_sum(m, 1, (int[]){0}, false);
    CHECK_NEAR(em_get(rows, (int64_t[]){999}), 1000, 0);
    CHECK_NEAR(em_get(cols, (int64_t[]){0}), 1000, 0);
    CHECK_NEAR(em_item(em_sum(rows, 0, NULL, false)), 1e6, 0);
    em_scope_end(s);
}

/* A float accumulator drifts to ~100958 here; a wide one stays at 1e6 * 0.1f. */
TEST(test_sum_of_million_f32_tenths_does_not_drift)
{
    em_scope s = em_scope_begin();
    double want = 1e6 * (double)0.1f;
    em_tensor *x = em_full(EM_F32, EM_SHAPE(1000000), 0.1);
    CHECK_NEAR(em_item(em_sum(x, 0, NULL, false)), want, want * 1e-7);
    em_tensor *nc = th_noncontig(em_full(EM_F32, EM_SHAPE(1000, 1000), 0.1));
    CHECK_NEAR(em_item(em_sum(nc, 0, NULL, false)), want, want * 1e-7);
    em_tensor *col = em_sum(em_full(EM_F32, EM_SHAPE(1000000, 2), 0.1), 1, (int[]){0}, false);
    CHECK_NEAR(em_get(col, (int64_t[]){1}), want, want * 1e-7);
    em_scope_end(s);
}

/* Every dims set on a contiguous f32 tensor (fast row / column paths where
 * they apply) and on a non-contiguous copy (strided path) agrees with f64. */
TEST(test_sum_fast_paths_agree_with_strided_path)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(3);
    em_tensor *x64 = em_randn(EM_F64, EM_SHAPE(6, 7, 300), &r), *x32 = em_cast(x64, EM_F32);
    em_tensor *nc = th_noncontig(x32);
    CHECK(!em_is_contiguous(nc));
    int sets[][3] = {{2}, {1, 2}, {0}, {0, 1}, {1}, {0, 2}, {0, 1, 2}};
    int counts[] = {1, 2, 1, 2, 1, 2, 3};
    for (int k = 0; k < 7; k++) {
        em_tensor *want = em_sum(x64, counts[k], sets[k], false);
        CHECK(th_max_abs_diff(em_sum(x32, counts[k], sets[k], false), want) < 1e-3);
        CHECK(th_max_abs_diff(em_sum(nc, counts[k], sets[k], false), want) < 1e-3);
    }
    em_scope_end(s);
}

/* Shapes big enough to split across threads, including few long rows
 * (split within rows) and the (N,C)->(C) bias-gradient shape. */
TEST(test_sum_parallel_paths_agree_with_f64)
{
    em_set_num_threads(4);
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(5);
    int64_t shapes[][2] = {{64, 5000}, {3, 200000}, {1, 300000}, {5000, 64}, {40000, 3}};
    int dims[] = {1, 1, 1, 0, 0};
    for (int k = 0; k < 5; k++) {
        em_tensor *x64 = em_randn(EM_F64, 2, shapes[k], &r), *x32 = em_cast(x64, EM_F32);
        em_tensor *want = em_sum(x64, 1, &dims[k], false), *got = em_sum(x32, 1, &dims[k], false);
        CHECK(em_dtype_of(got) == EM_F32);
        CHECK(th_max_abs_diff(got, want) < 1e-3);
    }
    em_scope_end(s);
}

TEST(test_sum_of_empty_is_zero)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(0, 3));
    em_tensor *a = em_sum(x, 1, (int[]){0}, false);
    check_shape(a, EM_SHAPE(3));
    CHECK_VALUES(a, 0, 0, 0, 0);
    CHECK_VALUES(em_sum(x, 0, NULL, false), 0, 0);
    check_shape(em_sum(x, 1, (int[]){1}, false), EM_SHAPE(0));
    CHECK_VALUES(em_sum(em_zeros(EM_F64, EM_SHAPE(3, 0)), 1, (int[]){1}, false), 0, 0, 0, 0);
    em_scope_end(s);
}

TEST(test_sum_integer_inputs_give_i32)
{
    em_scope s = em_scope_begin();
    em_tensor *i = th_tensor(EM_I32, EM_SHAPE(2, 2), (double[]){1, -2, 3, 40});
    em_tensor *a = em_sum(i, 1, (int[]){0}, false);
    CHECK(em_dtype_of(a) == EM_I32);
    CHECK_VALUES(a, 0, 4, 38);
    em_tensor *u = th_tensor(EM_U8, EM_SHAPE(3), (double[]){200, 100, 50});
    em_tensor *b = em_sum(u, 0, NULL, false);
    CHECK(em_dtype_of(b) == EM_I32);
    CHECK_NEAR(em_item(b), 350, 0);
    em_scope_end(s);
}

TEST(test_sum_and_mean_of_half_dtypes_keep_the_dtype)
{
    em_scope s = em_scope_begin();
    em_dtype dts[] = {EM_F16, EM_BF16};
    for (int k = 0; k < 2; k++) {
        em_tensor *x = ref_x(dts[k]);
        em_tensor *a = em_sum(x, 1, (int[]){1}, false), *m = em_mean(x, 1, (int[]){2}, false);
        CHECK(em_dtype_of(a) == dts[k] && em_dtype_of(m) == dts[k]);
        th_check_values(__FILE__, __LINE__, a, REF_SUM_D1, 0.05);
        th_check_values(__FILE__, __LINE__, m, REF_MEAN_D2, 0.02);
    }
    em_scope_end(s);
}

typedef struct red_case {
    int nd;
    int dims[3];
    bool keep;
} red_case;

static em_tensor *f_sum(em_tensor **x, void *ctx)
{
    red_case *c = ctx;
    return em_sum(x[0], c->nd, c->dims, c->keep);
}
static em_tensor *f_mean(em_tensor **x, void *ctx)
{
    red_case *c = ctx;
    return em_mean(x[0], c->nd, c->dims, c->keep);
}
static em_tensor *f_max(em_tensor **x, void *ctx)
{
    red_case *c = ctx;
    return em_max(x[0], c->nd, c->dims, c->keep);
}
static em_tensor *f_min(em_tensor **x, void *ctx)
{
    red_case *c = ctx;
    return em_min(x[0], c->nd, c->dims, c->keep);
}

/* GRADCHECK and F32_MATCHES_F64 over several dims sets, contiguous and not. */
static void grad_cases(const char *what, th_graph_fn f)
{
    red_case cases[] = {
        {1, {1}, false}, {2, {0, 2}, true}, {1, {-1}, false}, {0, {0}, false}, {2, {0, 1}, false}};
    em_rng r = em_rng_new(11);
    em_tensor *x = em_randn(EM_F64, EM_SHAPE(3, 4, 5), &r);
    em_tensor *nc = th_noncontig(x);
    for (int k = 0; k < 5; k++) {
        GRADCHECK(what, f, &cases[k], 1, &x);
        GRADCHECK(what, f, &cases[k], 1, &nc);
        F32_MATCHES_F64(what, f, &cases[k], 1, &x, 1e-6);
    }
    em_free(x);
    em_free(nc);
}

TEST(test_sum_gradient_matches_finite_difference) { grad_cases("sum", f_sum); }
TEST(test_mean_gradient_matches_finite_difference) { grad_cases("mean", f_mean); }
TEST(test_max_gradient_matches_finite_difference) { grad_cases("max", f_max); }
TEST(test_min_gradient_matches_finite_difference) { grad_cases("min", f_min); }

/* ---- mean ------------------------------------------------------------------------------ */

TEST(test_mean_over_dim_matches_reference)
{
    em_scope s = em_scope_begin();
    em_tensor *m = em_mean(ref_x(EM_F64), 1, (int[]){2}, false);
    check_shape(m, EM_SHAPE(2, 3));
    th_check_values(__FILE__, __LINE__, m, REF_MEAN_D2, 1e-12);
    th_check_values(__FILE__, __LINE__, em_mean(th_noncontig(ref_x(EM_F32)), 1, (int[]){2}, false),
                    REF_MEAN_D2, 1e-6);
    CHECK_NEAR(em_item(em_mean(ref_x(EM_F64), 0, NULL, false)), (-4.5219 + 1.8223 + 7.901) / 24, 1e-12);
    em_scope_end(s);
}

TEST(test_mean_of_empty_is_nan)
{
    em_scope s = em_scope_begin();
    CHECK(isnan(em_item(em_mean(em_zeros(EM_F32, EM_SHAPE(0)), 0, NULL, false))));
    CHECK_VALUES(em_mean(em_zeros(EM_F64, EM_SHAPE(0, 2)), 1, (int[]){0}, false), 0, NAN, NAN);
    em_scope_end(s);
}

TEST(test_mean_rejects_integer_input)
{
    em_scope s = em_scope_begin();
    em_tensor *i = em_zeros(EM_I32, EM_SHAPE(2, 3));
    CHECK_ERR(em_mean(i, 0, NULL, false), EM_ERR_DTYPE, "mean: needs a float tensor, got i32(2,3)");
    em_scope_end(s);
}

/* ---- max / min / argmax ------------------------------------------------------------------ */

TEST(test_max_min_argmax_match_reference)
{
    em_scope s = em_scope_begin();
    em_dtype dts[] = {EM_F64, EM_F32};
    for (int k = 0; k < 2; k++) {
        em_tensor *x = ref_x(dts[k]), *nc = th_noncontig(x);
        double tol = k ? 1e-6 : 0;
        th_check_values(__FILE__, __LINE__, em_max(x, 1, (int[]){1}, false), REF_MAX_D1, tol);
        th_check_values(__FILE__, __LINE__, em_min(x, 2, (int[]){0, 2}, false), REF_MIN_D02, tol);
        th_check_values(__FILE__, __LINE__, em_max(nc, 1, (int[]){1}, false), REF_MAX_D1, tol);
        em_tensor *am = em_argmax(x, 2, false);
        CHECK(em_dtype_of(am) == EM_I32);
        check_shape(am, EM_SHAPE(2, 3));
        th_check_values(__FILE__, __LINE__, am, REF_ARGMAX_D2, 0);
        th_check_values(__FILE__, __LINE__, em_argmax(nc, -1, false), REF_ARGMAX_D2, 0);
    }
    em_scope_end(s);
}

TEST(test_max_keepdim_and_all_dims)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 3), (double[]){1, 9, 3, -4, 5, 6});
    em_tensor *a = em_max(x, 1, (int[]){1}, true);
    check_shape(a, EM_SHAPE(2, 1));
    CHECK_VALUES(a, 0, 9, 6);
    CHECK_NEAR(em_item(em_max(x, 0, NULL, false)), 9, 0);
    CHECK_NEAR(em_item(em_min(x, 0, NULL, false)), -4, 0);
    em_tensor *i = th_tensor(EM_I32, EM_SHAPE(3), (double[]){-7, 12, 3});
    CHECK(em_dtype_of(em_max(i, 0, NULL, false)) == EM_I32);
    CHECK_NEAR(em_item(em_min(i, 0, NULL, false)), -7, 0);
    em_scope_end(s);
}

TEST(test_max_gradient_splits_evenly_among_ties)
{
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(2, 4), (double[]){1, 3, 3, 2, 5, 5, 5, -1});
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(em_sum(em_max(x, 1, (int[]){1}, false), 0, NULL, false), NULL));
    CHECK_VALUES(em_grad(x), 1e-15, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0);
    em_scope_end(s);
    CHECK_OK(em_zero_grad(x));
    s = em_scope_begin();
    CHECK_OK(em_backward(em_min(x, 0, NULL, false), NULL));
    CHECK_VALUES(em_grad(x), 0, 0, 0, 0, 0, 0, 0, 0, 1);
    em_scope_end(s);
    em_free(x);
}

TEST(test_argmax_picks_the_first_maximum)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 4), (double[]){1, 5, 5, 2, 7, 7, 7, 7});
    CHECK_VALUES(em_argmax(x, 1, false), 0, 1, 0);
    em_tensor *k = em_argmax(x, 0, true);
    check_shape(k, EM_SHAPE(1, 4));
    CHECK_VALUES(k, 0, 1, 1, 1, 1);
    em_scope_end(s);
}

TEST(test_max_and_argmax_propagate_nan)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(4), (double[]){1, NAN, 9, NAN});
    CHECK(isnan(em_item(em_max(x, 0, NULL, false))));
    CHECK(isnan(em_item(em_min(x, 0, NULL, false))));
    CHECK_NEAR(em_item(em_argmax(x, 0, false)), 1, 0);
    em_scope_end(s);
}

TEST(test_max_min_argmax_of_empty_dim_are_errors)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2, 0));
    CHECK_ERR(em_max(x, 1, (int[]){1}, false), EM_ERR_SHAPE,
              "max: cannot reduce over an empty dim: dim 1 of (2,0)");
    CHECK_ERR(em_min(x, 0, NULL, false), EM_ERR_SHAPE, "min: cannot reduce over an empty dim");
    CHECK_ERR(em_argmax(x, -1, false), EM_ERR_SHAPE, "argmax: cannot reduce over an empty dim");
    /* reducing a non-empty dim of an empty tensor is fine: an empty result */
    check_shape(em_max(x, 1, (int[]){0}, false), EM_SHAPE(0));
    em_scope_end(s);
}

TEST(test_reductions_reject_bad_dims)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2, 3));
    CHECK_ERR(em_sum(x, 1, (int[]){2}, false), EM_ERR_ARG, "sum: dim 2 is out of range for a 2-dim tensor");
    CHECK_ERR(em_mean(x, 2, (int[]){1, -1}, false), EM_ERR_ARG, "mean: dim -1 is listed twice");
    CHECK_ERR(em_max(x, 1, (int[]){-3}, false), EM_ERR_ARG, "max: dim -3 is out of range");
    CHECK_ERR(em_argmax(x, 5, false), EM_ERR_ARG, "argmax: dim 5 is out of range");
    CHECK_ERR(em_sum(x, 2, NULL, false), EM_ERR_ARG, "sum: bad dims list");
    CHECK_ERR(em_sum(em_zeros(EM_BOOL, EM_SHAPE(2)), 0, NULL, false), EM_ERR_DTYPE,
              "sum: does not take bool");
    em_scope_end(s);
}

/* f16/bf16 sums and means over contiguous inputs take the f32 paths (rows,
 * few long rows in chunks, columns), widening as they read: the bits of
 * summing the input cast to f32 and rounding, where the slow path read
 * each element through ld (a bf16 mean over columns ran 25x slower than
 * f32's). */
TEST(test_f16_bf16_sums_give_the_f32_paths_bits_rounded)
{
    const em_dtype dts[] = {EM_F16, EM_BF16};
    const struct {
        int64_t r, c;
        int dim; /* -1: every dim */
    } cases[] = {{300, 129, 1}, {300, 129, 0}, {2, 70001, 1}, {1, 70001, -1}, {1030, 700, 0}, {7, 9, -1}};
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (int mean = 0; mean < 2; mean++) {
                th_case("%s (%lld,%lld) dim %d %s", em_dtype_name(dts[d]), (long long)cases[k].r,
                        (long long)cases[k].c, cases[k].dim, mean ? "mean" : "sum");
                em_scope s = em_scope_begin();
                em_rng r = em_rng_new(40 + k);
                em_tensor *x = em_cast(em_randn(EM_F32, EM_SHAPE(cases[k].r, cases[k].c), &r), dts[d]);
                em_tensor *x32 = em_cast(x, EM_F32);
                int nd = cases[k].dim < 0 ? 0 : 1, dims[1] = {cases[k].dim};
                em_tensor *y = mean ? em_mean(x, nd, dims, false) : em_sum(x, nd, dims, false);
                em_tensor *w =
                    em_cast(mean ? em_mean(x32, nd, dims, false) : em_sum(x32, nd, dims, false), dts[d]);
                CHECK(y && w && em_dtype_of(y) == dts[d] && em_numel(y) == em_numel(w));
                if (y && w) CHECK(!memcmp(em_data(y), em_data(w), (size_t)em_numel(y) * 2));
                em_scope_end(s);
            }
}
