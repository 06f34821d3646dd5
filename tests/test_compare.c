/* test_compare.c — eq, ne, lt, le, gt, ge (bool results, broadcasting, no
 * gradient), where and masked_fill (values, broadcasting, gradients, errors). */
#include "harness.h"

/* ---- comparisons ------------------------------------------------------------------ */

TEST(test_comparisons_give_bool_values)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(3), (double[]){1, 2, 3});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(3), (double[]){3, 2, 1});
    CHECK(em_dtype_of(em_eq(a, b)) == EM_BOOL);
    CHECK_VALUES(em_eq(a, b), 0, 0, 1, 0);
    CHECK_VALUES(em_ne(a, b), 0, 1, 0, 1);
    CHECK_VALUES(em_lt(a, b), 0, 1, 0, 0);
    CHECK_VALUES(em_le(a, b), 0, 1, 1, 0);
    CHECK_VALUES(em_gt(a, b), 0, 0, 0, 1);
    CHECK_VALUES(em_ge(a, b), 0, 0, 1, 1);
    em_scope_end(s);
}

TEST(test_comparisons_broadcast)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(2, 1), (double[]){1, 2});
    em_tensor *b = th_tensor(EM_F64, EM_SHAPE(3), (double[]){0, 1, 2});
    em_tensor *r = em_lt(a, b);
    CHECK(em_ndim(r) == 2 && em_size(r, 0) == 2 && em_size(r, 1) == 3);
    CHECK_VALUES(r, 0, 0, 0, 1, 0, 0, 0);
    CHECK_VALUES(em_ge(b, em_scalar(EM_F64, 1)), 0, 0, 1, 1);
    em_scope_end(s);
}

TEST(test_comparisons_work_for_every_dtype)
{
    em_scope s = em_scope_begin();
    for (em_dtype dt = 0; dt < EM_NUM_DTYPES; dt++) {
        em_tensor *a = th_tensor(dt, EM_SHAPE(3), (double[]){0, 1, 1});
        em_tensor *b = th_tensor(dt, EM_SHAPE(3), (double[]){1, 1, 0});
        CHECK_VALUES(em_eq(a, b), 0, 0, 1, 0);
        CHECK_VALUES(em_gt(a, b), 0, 0, 0, 1);
    }
    em_tensor *i = th_tensor(EM_I32, EM_SHAPE(2), (double[]){-5, 2000000000});
    em_tensor *j = th_tensor(EM_I32, EM_SHAPE(2), (double[]){-4, 1999999999});
    CHECK_VALUES(em_lt(i, j), 0, 1, 0);
    em_scope_end(s);
}

TEST(test_comparisons_with_nan_follow_ieee)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(2), (double[]){NAN, 1});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(2), (double[]){NAN, NAN});
    CHECK_VALUES(em_eq(a, b), 0, 0, 0);
    CHECK_VALUES(em_ne(a, b), 0, 1, 1);
    CHECK_VALUES(em_le(a, b), 0, 0, 0);
    CHECK_VALUES(em_ge(a, b), 0, 0, 0);
    em_scope_end(s);
}

TEST(test_comparisons_noncontiguous_match_contiguous)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(3);
    em_tensor *a = em_randint(0, 3, EM_F32, EM_SHAPE(4, 5), &r),
              *b = em_randint(0, 3, EM_F32, EM_SHAPE(4, 5), &r);
    em_tensor *na = th_noncontig(a), *nb = th_noncontig(b);
    CHECK(!em_is_contiguous(na));
    em_tensor *(*ops[])(em_tensor *, em_tensor *) = {em_eq, em_ne, em_lt, em_le, em_gt, em_ge};
    for (int k = 0; k < 6; k++) {
        em_tensor *want = ops[k](a, b);
        CHECK(th_max_abs_diff(ops[k](na, nb), want) == 0);
        CHECK(th_max_abs_diff(ops[k](na, b), want) == 0);
    }
    /* a transposed view against a contiguous tensor of the transposed shape */
    em_tensor *at = em_transpose(a, 0, 1), *atc = em_contiguous(at);
    CHECK(th_max_abs_diff(em_le(at, em_transpose(b, 0, 1)),
                          em_le(atc, em_contiguous(em_transpose(b, 0, 1)))) == 0);
    em_scope_end(s);
}

TEST(test_comparison_result_never_requires_grad)
{
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(2), (double[]){1, 2});
    CHECK_OK(em_set_requires_grad(a, true));
    em_scope s = em_scope_begin();
    int64_t n0 = em_tape_length();
    em_tensor *r = em_gt(a, em_zeros(EM_F64, EM_SHAPE(2)));
    CHECK_VALUES(r, 0, 1, 1);
    CHECK(!em_requires_grad(r));
    CHECK(em_tape_length() == n0);
    em_scope_end(s);
    em_free(a);
}

TEST(test_comparison_rejects_dtype_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2)), *b = em_zeros(EM_F64, EM_SHAPE(2));
    CHECK_ERR(em_lt(a, b), EM_ERR_DTYPE, "lt: dtypes differ: f32(2,) and f64(2,)");
    em_scope_end(s);
}

TEST(test_comparison_rejects_broadcast_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_I32, EM_SHAPE(2, 3)), *b = em_zeros(EM_I32, EM_SHAPE(4));
    CHECK_ERR(em_ge(a, b), EM_ERR_SHAPE, "ge: shapes (2,3) and (4,) do not broadcast");
    em_scope_end(s);
}

/* ---- where ------------------------------------------------------------------------ */

static em_tensor *bools(int ndim, const int64_t *shape, const double *v)
{
    return th_tensor(EM_BOOL, ndim, shape, v);
}

TEST(test_where_selects_elementwise)
{
    em_scope s = em_scope_begin();
    em_tensor *c = bools(EM_SHAPE(4), (double[]){1, 0, 0, 1});
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(4), (double[]){1, 2, 3, 4});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(4), (double[]){-1, -2, -3, -4});
    em_tensor *r = em_where(c, a, b);
    CHECK(em_dtype_of(r) == EM_F32);
    CHECK_VALUES(r, 0, 1, -2, -3, 4);
    em_scope_end(s);
}

TEST(test_where_broadcasts_three_ways)
{
    em_scope s = em_scope_begin();
    em_tensor *c = bools(EM_SHAPE(2, 1), (double[]){1, 0});                /* (2,1) */
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(1, 3), (double[]){1, 2, 3}); /* (1,3) */
    em_tensor *b = em_scalar(EM_F64, -9);                                  /* () */
    em_tensor *r = em_where(c, a, b);
    CHECK(em_ndim(r) == 2 && em_size(r, 0) == 2 && em_size(r, 1) == 3);
    CHECK_VALUES(r, 0, 1, 2, 3, -9, -9, -9);
    /* cond decides the shape alone: (2,2,1) with a (3) and b (1) -> (2,2,3) */
    em_tensor *c3 = bools(EM_SHAPE(2, 2, 1), (double[]){0, 1, 1, 0});
    em_tensor *r3 =
        em_where(c3, th_tensor(EM_F64, EM_SHAPE(3), (double[]){1, 2, 3}), em_ones(EM_F64, EM_SHAPE(1)));
    CHECK(em_ndim(r3) == 3 && em_numel(r3) == 12);
    CHECK_VALUES(r3, 0, 1, 1, 1, 1, 2, 3, 1, 2, 3, 1, 1, 1);
    em_scope_end(s);
}

TEST(test_where_works_for_every_dtype)
{
    em_scope s = em_scope_begin();
    em_tensor *c = bools(EM_SHAPE(3), (double[]){0, 1, 0});
    for (em_dtype dt = 0; dt < EM_NUM_DTYPES; dt++) {
        em_tensor *a = th_tensor(dt, EM_SHAPE(3), (double[]){1, 1, 1});
        em_tensor *b = em_zeros(dt, EM_SHAPE(1));
        em_tensor *r = em_where(c, a, b);
        CHECK(em_dtype_of(r) == dt);
        CHECK_VALUES(r, 0, 0, 1, 0);
    }
    em_tensor *h = th_tensor(EM_F16, EM_SHAPE(3), (double[]){0.5, -2, 65504});
    CHECK_VALUES(em_where(c, em_neg(h), h), 0, 0.5, 2, 65504);
    em_scope_end(s);
}

typedef struct sel_case {
    em_tensor *mask; /* bool, persistent */
} sel_case;

static em_tensor *f_where(em_tensor **x, void *ctx) { return em_where(((sel_case *)ctx)->mask, x[0], x[1]); }
static em_tensor *f_masked_fill(em_tensor **x, void *ctx)
{
    return em_masked_fill(x[0], ((sel_case *)ctx)->mask, -0.75);
}

/* a (2,3) and b (3) under cond (2,3): gradients masked and summed to b's shape */
TEST(test_where_gradient_matches_finite_difference)
{
    em_rng r = em_rng_new(11);
    sel_case sc = {bools(EM_SHAPE(2, 3), (double[]){1, 0, 1, 0, 0, 1})};
    em_tensor *in[2] = {em_randn(EM_F64, EM_SHAPE(2, 3), &r), em_randn(EM_F64, EM_SHAPE(3), &r)};
    GRADCHECK("where", f_where, &sc, 2, in);
    F32_MATCHES_F64("where", f_where, &sc, 2, in, 1e-7);
    em_tensor *nc[2] = {th_noncontig(in[0]), th_noncontig(in[1])};
    CHECK(!em_is_contiguous(nc[0]));
    GRADCHECK("where noncontig", f_where, &sc, 2, nc);
    for (int i = 0; i < 2; i++) {
        em_free(in[i]);
        em_free(nc[i]);
    }
    em_free(sc.mask);
}

/* a (3) and b (2,1) under cond (2,1,3): both inputs broadcast up to (2,2,3) */
TEST(test_where_gradient_sums_broadcast_dims)
{
    sel_case sc = {bools(EM_SHAPE(2, 1, 3), (double[]){1, 0, 1, 0, 1, 1})};
    em_tensor *in[2] = {th_tensor(EM_F64, EM_SHAPE(3), (double[]){1, 2, 3}),
                        th_tensor(EM_F64, EM_SHAPE(2, 1), (double[]){4, 5})};
    GRADCHECK("where broadcast", f_where, &sc, 2, in);
    /* with an all-ones cotangent: a gets the count of true per column (x2
     * rows of b), b gets the count of false per row */
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(em_sum(f_where(in, &sc), 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK_VALUES(em_grad(in[0]), 0, 2, 2, 4);
    CHECK_VALUES(em_grad(in[1]), 0, 2, 2);
    for (int i = 0; i < 2; i++) em_free(in[i]);
    em_free(sc.mask);
}

TEST(test_where_noncontiguous_inputs_match_contiguous)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(2);
    em_tensor *c = em_cast(em_randint(0, 2, EM_U8, EM_SHAPE(3, 4), &r), EM_BOOL);
    em_tensor *a = em_randn(EM_F32, EM_SHAPE(3, 4), &r), *b = em_randn(EM_F32, EM_SHAPE(3, 4), &r);
    em_tensor *want = em_where(c, a, b);
    CHECK(th_max_abs_diff(em_where(th_noncontig(c), th_noncontig(a), th_noncontig(b)), want) == 0);
    em_tensor *a64 = em_cast(a, EM_F64), *b64 = em_cast(b, EM_F64);
    CHECK(th_max_abs_diff(em_where(th_noncontig(c), th_noncontig(a64), b64), want) == 0);
    em_scope_end(s);
}

TEST(test_where_rejects_non_bool_cond)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2));
    CHECK_ERR(em_where(a, a, a), EM_ERR_DTYPE, "where: cond must be bool, got f32(2,)");
    em_scope_end(s);
}

TEST(test_where_rejects_dtype_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *c = em_zeros(EM_BOOL, EM_SHAPE(2));
    CHECK_ERR(em_where(c, em_zeros(EM_F32, EM_SHAPE(2)), em_zeros(EM_I32, EM_SHAPE(2))), EM_ERR_DTYPE,
              "where: dtypes differ: f32(2,) and i32(2,)");
    em_scope_end(s);
}

TEST(test_where_rejects_shapes_that_do_not_broadcast)
{
    em_scope s = em_scope_begin();
    em_tensor *c = em_zeros(EM_BOOL, EM_SHAPE(4)), *a = em_zeros(EM_F32, EM_SHAPE(2, 3));
    CHECK_ERR(em_where(c, a, a), EM_ERR_SHAPE,
              "where: cond (4,), a (2,3) and b (2,3) do not broadcast together");
    em_tensor *c2 = em_zeros(EM_BOOL, EM_SHAPE(3));
    CHECK_ERR(em_where(c2, a, em_zeros(EM_F32, EM_SHAPE(2))), EM_ERR_SHAPE,
              "where: cond (3,), a (2,3) and b (2,) do not broadcast together");
    em_scope_end(s);
}

/* ---- masked_fill ------------------------------------------------------------------ */

TEST(test_masked_fill_fills_where_mask_is_true)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    em_tensor *m = bools(EM_SHAPE(2, 3), (double[]){0, 1, 0, 1, 1, 0});
    CHECK_VALUES(em_masked_fill(a, m, 9.5), 0, 1, 9.5, 3, 9.5, 9.5, 6);
    em_scope_end(s);
}

TEST(test_masked_fill_broadcasts_mask_and_takes_minus_infinity)
{
    em_scope s = em_scope_begin();
    /* a causal mask (T,T) over scores (2,T,T), T = 3 */
    em_tensor *a = em_zeros(EM_F64, EM_SHAPE(2, 3, 3));
    em_tensor *m = bools(EM_SHAPE(3, 3), (double[]){0, 1, 1, 0, 0, 1, 0, 0, 0});
    double ni = -INFINITY;
    CHECK_VALUES(em_masked_fill(a, m, ni), 0, 0, ni, ni, 0, 0, ni, 0, 0, 0, 0, ni, ni, 0, 0, ni, 0, 0, 0);
    em_tensor *col = bools(EM_SHAPE(3, 1), (double[]){1, 0, 0});
    em_tensor *r = em_masked_fill(em_ones(EM_F32, EM_SHAPE(3, 2)), col, 0);
    CHECK_VALUES(r, 0, 0, 0, 1, 1, 1, 1);
    em_scope_end(s);
}

TEST(test_masked_fill_keeps_dtype_for_integers_and_halves)
{
    em_scope s = em_scope_begin();
    em_tensor *m = bools(EM_SHAPE(3), (double[]){1, 0, 1});
    em_tensor *i = th_tensor(EM_I32, EM_SHAPE(3), (double[]){1, 2, 3});
    em_tensor *ri = em_masked_fill(i, m, -7);
    CHECK(em_dtype_of(ri) == EM_I32);
    CHECK_VALUES(ri, 0, -7, 2, -7);
    em_tensor *rb = em_masked_fill(em_ones(EM_BF16, EM_SHAPE(3)), m, 0.1);
    CHECK(em_dtype_of(rb) == EM_BF16);
    CHECK_VALUES(rb, 0, em_bf16_to_f32(em_f32_to_bf16(0.1f)), 1, em_bf16_to_f32(em_f32_to_bf16(0.1f)));
    em_scope_end(s);
}

TEST(test_masked_fill_gradient_matches_finite_difference)
{
    em_rng r = em_rng_new(5);
    sel_case sc = {bools(EM_SHAPE(3), (double[]){0, 1, 0})}; /* broadcasts over rows */
    em_tensor *a = em_randn(EM_F64, EM_SHAPE(2, 3), &r);
    GRADCHECK("masked_fill", f_masked_fill, &sc, 1, &a);
    F32_MATCHES_F64("masked_fill", f_masked_fill, &sc, 1, &a, 1e-7);
    em_tensor *nc = th_noncontig(a);
    GRADCHECK("masked_fill noncontig", f_masked_fill, &sc, 1, &nc);
    em_scope s = em_scope_begin();
    CHECK(th_max_abs_diff(f_masked_fill(&nc, &sc), f_masked_fill(&a, &sc)) == 0);
    CHECK_OK(em_backward(em_sum(f_masked_fill(&a, &sc), 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK_VALUES(em_grad(a), 0, 1, 0, 1, 1, 0, 1);
    em_free(a);
    em_free(nc);
    em_free(sc.mask);
}

TEST(test_masked_fill_rejects_non_bool_mask)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2));
    CHECK_ERR(em_masked_fill(a, em_zeros(EM_U8, EM_SHAPE(2)), 0), EM_ERR_DTYPE,
              "masked_fill: mask must be bool, got u8(2,)");
    em_scope_end(s);
}

TEST(test_masked_fill_rejects_mask_that_does_not_broadcast_to_a)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(3));
    CHECK_ERR(em_masked_fill(a, em_zeros(EM_BOOL, EM_SHAPE(2, 3)), 0), EM_ERR_SHAPE,
              "masked_fill: mask (2,3) does not broadcast to a's shape (3,)");
    CHECK_ERR(em_masked_fill(a, em_zeros(EM_BOOL, EM_SHAPE(2)), 0), EM_ERR_SHAPE,
              "masked_fill: mask (2,) does not broadcast to a's shape (3,)");
    em_scope_end(s);
}
