/* test_binary.c — add, sub, mul, div: values, broadcasting, gradients, errors. */
#include "harness.h"

TEST(test_add_broadcasts_row_over_matrix)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(3), (double[]){10, 20, 30});
    CHECK_VALUES(em_add(a, b), 0, 11, 22, 33, 14, 25, 36);
    em_scope_end(s);
}

/* A (T,C) table under (B,T,C) (the GPT's positions), with and without a
 * leading 1, and widths that leave a tail after the 8-wide loop: each
 * element is a[b,t,c] <op> table[t,c], as the f64 strided path computes it. */
TEST(test_binary_ops_broadcast_a_trailing_block_over_leading_dims)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(50);
    const int64_t widths[] = {3, 13, 40};
    for (int k = 0; k < 3; k++) {
        int64_t C = widths[k];
        em_tensor *a = em_randn(EM_F32, EM_SHAPE(4, 5, C), &r), *t = em_randn(EM_F32, EM_SHAPE(5, C), &r);
        em_tensor *t1 = em_reshape(t, EM_SHAPE(1, 5, C));
        em_tensor *a64 = em_cast(a, EM_F64), *t64 = em_cast(t, EM_F64);
        CHECK(th_max_abs_diff(em_add(a, t), em_add(a64, t64)) < 1e-6);
        CHECK(th_max_abs_diff(em_sub(t1, a), em_sub(t64, a64)) < 1e-6);
        CHECK(th_max_abs_diff(em_mul(a, t1), em_mul(a64, t64)) < 1e-5);
        CHECK(th_max_abs_diff(em_div(a, t1), em_div(a64, t64)) <
              1e-3 * th_max_abs_diff(em_div(a64, t64), em_zeros(EM_F64, EM_SHAPE(1))));
    }
    em_scope_end(s);
}

static em_tensor *f_add(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_add(x[0], x[1]);
}
static em_tensor *f_sub(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_sub(x[0], x[1]);
}
static em_tensor *f_mul(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_mul(x[0], x[1]);
}
static em_tensor *f_div(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_div(x[0], x[1]);
}
static em_tensor *f_scalars(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_neg(em_add_scalar(em_mul_scalar(x[0], 3.0), -1.5));
}

/* Inputs: a (2,3) and a broadcasting b (3), both persistent f64 leaves. */
static void grad_case(const char *what, th_graph_fn f, bool positive_b)
{
    em_rng r = em_rng_new(7);
    em_tensor *in[2] = {em_randn(EM_F64, EM_SHAPE(2, 3), &r), em_randn(EM_F64, EM_SHAPE(3), &r)};
    if (positive_b) {
        em_tensor *b = em_add_scalar(em_mul(in[1], in[1]), 0.5);
        em_free(in[1]);
        in[1] = b;
    }
    GRADCHECK(what, f, NULL, 2, in);
    F32_MATCHES_F64(what, f, NULL, 2, in, 1e-6);
    /* non-contiguous inputs give the same gradients */
    em_tensor *nc[2] = {th_noncontig(in[0]), th_noncontig(in[1])};
    CHECK(!em_is_contiguous(nc[0]));
    GRADCHECK(what, f, NULL, 2, nc);
    for (int i = 0; i < 2; i++) {
        em_free(in[i]);
        em_free(nc[i]);
    }
}

TEST(test_add_gradient_matches_finite_difference) { grad_case("add", f_add, false); }
TEST(test_sub_gradient_matches_finite_difference) { grad_case("sub", f_sub, false); }
TEST(test_mul_gradient_matches_finite_difference) { grad_case("mul", f_mul, false); }
TEST(test_div_gradient_matches_finite_difference) { grad_case("div", f_div, true); }
TEST(test_scalar_ops_gradient_matches_finite_difference) { grad_case("scalars", f_scalars, false); }

TEST(test_binary_ops_values)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(2, 1), (double[]){1, 2});
    em_tensor *b = th_tensor(EM_F64, EM_SHAPE(1, 3), (double[]){4, 5, 8});
    CHECK_VALUES(em_sub(a, b), 0, -3, -4, -7, -2, -3, -6);
    CHECK_VALUES(em_mul(a, b), 0, 4, 5, 8, 8, 10, 16);
    CHECK_VALUES(em_div(a, b), 1e-15, 0.25, 0.2, 0.125, 0.5, 0.4, 0.25);
    CHECK_VALUES(em_add_scalar(a, 1.5), 0, 2.5, 3.5);
    CHECK_VALUES(em_neg(a), 0, -1, -2);
    em_tensor *i = th_tensor(EM_I32, EM_SHAPE(3), (double[]){1, -2, 3});
    CHECK_VALUES(em_mul(i, i), 0, 1, 4, 9);
    CHECK(em_dtype_of(em_add(i, i)) == EM_I32);
    em_scope_end(s);
}

TEST(test_add_rejects_broadcast_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3)), *b = em_zeros(EM_F32, EM_SHAPE(4));
    CHECK_ERR(em_add(a, b), EM_ERR_SHAPE, "add: shapes (2,3) and (4,) do not broadcast");
    em_scope_end(s);
}

TEST(test_mul_rejects_dtype_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2)), *b = em_zeros(EM_F64, EM_SHAPE(2));
    CHECK_ERR(em_mul(a, b), EM_ERR_DTYPE, "mul: dtypes differ: f32(2,) and f64(2,)");
    em_scope_end(s);
}

TEST(test_ops_propagate_null_and_keep_first_error)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3)), *b = em_zeros(EM_F32, EM_SHAPE(4));
    em_clear_error();
    em_tensor *r = em_neg(em_mul_scalar(em_add(a, b), 2.0));
    CHECK(r == NULL);
    CHECK(em_last_status() == EM_ERR_SHAPE);
    CHECK(strstr(em_last_error(), "add:") != NULL);
    em_scope_end(s);
}
