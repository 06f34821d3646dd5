/* test_join.c — concat, stack, split, chunk: values, views, gradients,
 * f32 vs f64, non-contiguous inputs, and errors. */
#include "harness.h"

static em_tensor *randn(int ndim, const int64_t *shape, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    return em_randn(EM_F64, ndim, shape, &r);
}

/* ---- concat ----------------------------------------------------------------------------- */

TEST(test_concat_joins_along_each_dim)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(2, 1), (double[]){5, 6});
    em_tensor *c = th_tensor(EM_F32, EM_SHAPE(1, 2), (double[]){7, 8});
    em_tensor *y1 = em_concat(2, (em_tensor *[]){a, b}, 1);
    CHECK(em_size(y1, 0) == 2 && em_size(y1, 1) == 3);
    CHECK_VALUES(y1, 0, 1, 2, 5, 3, 4, 6);
    em_tensor *y0 = em_concat(3, (em_tensor *[]){a, c, a}, -2);
    CHECK(em_size(y0, 0) == 5);
    CHECK_VALUES(y0, 0, 1, 2, 3, 4, 7, 8, 1, 2, 3, 4);
    /* integer dtype, and an empty piece */
    em_tensor *i = th_tensor(EM_I32, EM_SHAPE(2), (double[]){9, 8});
    CHECK_VALUES(em_concat(3, (em_tensor *[]){i, em_zeros(EM_I32, EM_SHAPE(0)), i}, 0), 0, 9, 8, 9, 8);
    em_scope_end(s);
}

TEST(test_concat_of_noncontiguous_inputs_matches_contiguous)
{
    em_scope s = em_scope_begin();
    em_tensor *a = randn(EM_SHAPE(3, 2, 4), 1), *b = randn(EM_SHAPE(3, 5, 4), 2);
    em_tensor *want = em_concat(2, (em_tensor *[]){a, b}, 1);
    CHECK(th_max_abs_diff(em_concat(2, (em_tensor *[]){th_noncontig(a), th_noncontig(b)}, 1), want) == 0);
    /* a transposed input */
    em_tensor *bt = em_transpose(em_contiguous(em_transpose(b, 0, 2)), 0, 2);
    CHECK(!em_is_contiguous(bt));
    CHECK(th_max_abs_diff(em_concat(2, (em_tensor *[]){a, bt}, 1), want) == 0);
    em_scope_end(s);
}

static em_tensor *f_concat(em_tensor **x, void *ctx) { return em_concat(3, x, *(int *)ctx); }

TEST(test_concat_gradient_matches_finite_difference)
{
    em_scope s = em_scope_begin();
    int dim = 1;
    em_tensor *in[3] = {randn(EM_SHAPE(2, 1, 3), 3), randn(EM_SHAPE(2, 3, 3), 4),
                        randn(EM_SHAPE(2, 2, 3), 5)};
    GRADCHECK("concat", f_concat, &dim, 3, in);
    F32_MATCHES_F64("concat", f_concat, &dim, 3, in, 1e-7);
    em_tensor *nc[3] = {th_noncontig(in[0]), th_noncontig(in[1]), th_noncontig(in[2])};
    GRADCHECK("concat noncontig", f_concat, &dim, 3, nc);
    dim = -1;
    em_tensor *in2[3] = {randn(EM_SHAPE(2, 2), 6), randn(EM_SHAPE(2, 1), 7), randn(EM_SHAPE(2, 3), 8)};
    GRADCHECK("concat last dim", f_concat, &dim, 3, in2);
    em_scope_end(s);
}

TEST(test_concat_gradient_skips_inputs_without_grad)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2)), *b = em_ones(EM_F32, EM_SHAPE(3));
    CHECK_OK(em_set_requires_grad(b, true));
    em_tensor *y = em_concat(2, (em_tensor *[]){a, b}, 0);
    CHECK_OK(em_backward(y, th_tensor(EM_F32, EM_SHAPE(5), (double[]){1, 2, 3, 4, 5})));
    CHECK(em_grad(a) == NULL);
    CHECK_VALUES(em_grad(b), 0, 3, 4, 5);
    em_scope_end(s);
}

TEST(test_concat_rejects_mismatched_inputs)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3)), *b = em_zeros(EM_F32, EM_SHAPE(3, 4));
    CHECK_ERR(em_concat(2, (em_tensor *[]){a, b}, 0), EM_ERR_SHAPE,
              "concat: tensor 1 has shape (3,4) but tensor 0 has (2,3); shapes must match except in dim 0");
    CHECK_ERR(em_concat(2, (em_tensor *[]){a, em_zeros(EM_F32, EM_SHAPE(6))}, 0), EM_ERR_SHAPE,
              "concat: tensor 1 has shape (6,)");
    CHECK_ERR(em_concat(2, (em_tensor *[]){a, em_zeros(EM_F64, EM_SHAPE(2, 3))}, 0), EM_ERR_DTYPE,
              "concat: tensor 1 is f64(2,3) but tensor 0 is f32(2,3)");
    CHECK_ERR(em_concat(0, (em_tensor *[]){a}, 0), EM_ERR_ARG,
              "concat: needs at least one tensor, got n = 0");
    CHECK_ERR(em_concat(1, (em_tensor *[]){a}, 2), EM_ERR_ARG, "concat: dim 2 is out of range");
    CHECK_ERR(em_concat(2, (em_tensor *[]){a, NULL}, 0), EM_ERR_ARG, "concat");
    em_scope_end(s);
}

/* ---- stack ---------------------------------------------------------------------------------- */

TEST(test_stack_adds_a_new_dim)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){5, 6, 7, 8});
    em_tensor *y0 = em_stack(2, (em_tensor *[]){a, b}, 0);
    CHECK(em_ndim(y0) == 3 && em_size(y0, 0) == 2);
    CHECK_VALUES(y0, 0, 1, 2, 3, 4, 5, 6, 7, 8);
    em_tensor *y2 = em_stack(2, (em_tensor *[]){a, b}, -1);
    CHECK(em_size(y2, 2) == 2);
    CHECK_VALUES(y2, 0, 1, 5, 2, 6, 3, 7, 4, 8);
    CHECK_VALUES(em_stack(2, (em_tensor *[]){a, th_noncontig(b)}, 1), 0, 1, 2, 5, 6, 3, 4, 7, 8);
    em_scope_end(s);
}

static em_tensor *f_stack(em_tensor **x, void *ctx) { return em_stack(3, x, *(int *)ctx); }

TEST(test_stack_gradient_matches_finite_difference)
{
    em_scope s = em_scope_begin();
    em_tensor *in[3] = {randn(EM_SHAPE(2, 3), 9), randn(EM_SHAPE(2, 3), 10), randn(EM_SHAPE(2, 3), 11)};
    for (int dim = 0; dim <= 2; dim++) {
        GRADCHECK("stack", f_stack, &dim, 3, in);
        F32_MATCHES_F64("stack", f_stack, &dim, 3, in, 1e-7);
    }
    int dim = 1;
    em_tensor *nc[3] = {th_noncontig(in[0]), th_noncontig(in[1]), th_noncontig(in[2])};
    GRADCHECK("stack noncontig", f_stack, &dim, 3, nc);
    em_scope_end(s);
}

TEST(test_stack_rejects_unequal_shapes_and_bad_dim)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3)), *b = em_zeros(EM_F32, EM_SHAPE(2, 4));
    CHECK_ERR(em_stack(2, (em_tensor *[]){a, b}, 0), EM_ERR_SHAPE,
              "stack: tensor 1 has shape (2,4) but tensor 0 has (2,3)");
    CHECK_ERR(em_stack(2, (em_tensor *[]){a, a}, 3), EM_ERR_ARG, "stack: dim 3 is out of range");
    CHECK_ERR(em_stack(-1, (em_tensor *[]){a}, 0), EM_ERR_ARG, "stack: needs at least one tensor");
    CHECK_ERR(em_stack(2, (em_tensor *[]){a, em_zeros(EM_I32, EM_SHAPE(2, 3))}, 0), EM_ERR_DTYPE,
              "stack: tensor 1 is i32(2,3) but tensor 0 is f32(2,3)");
    em_scope_end(s);
}

/* ---- split / chunk ------------------------------------------------------------------------------ */

TEST(test_split_returns_views_with_a_smaller_last_piece)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_reshape(em_arange(0, 14, 1, EM_F32), EM_SHAPE(2, 7));
    em_tensor *p[4];
    CHECK(em_split(t, 3, 1, p, 4) == 3);
    CHECK_VALUES(p[0], 0, 0, 1, 2, 7, 8, 9);
    CHECK_VALUES(p[1], 0, 3, 4, 5, 10, 11, 12);
    CHECK_VALUES(p[2], 0, 6, 13);
    CHECK(em_size(p[2], 1) == 1);
    CHECK(em_shares_storage(p[1], t));
    /* writing through a piece changes t */
    CHECK_OK(em_set(p[1], (int64_t[]){0, 0}, 100));
    CHECK_NEAR(em_get(t, (int64_t[]){0, 3}), 100, 0);
    CHECK(em_split(t, 7, -1, p, 4) == 1);
    CHECK(em_split(t, 1, 0, p, 2) == 2);
    CHECK_VALUES(p[1], 0, 7, 8, 9, 10, 11, 12, 13);
    em_scope_end(s);
}

TEST(test_chunk_gives_pieces_as_equal_as_possible)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_arange(0, 10, 1, EM_F64);
    em_tensor *p[8];
    CHECK(em_chunk(t, 3, 0, p, 8) == 3); /* sizes 4, 4, 2 */
    CHECK_VALUES(p[0], 0, 0, 1, 2, 3);
    CHECK_VALUES(p[2], 0, 8, 9);
    CHECK(em_chunk(t, 4, 0, p, 8) == 4); /* sizes 3, 3, 3, 1 */
    CHECK(em_size(p[3], 0) == 1);
    CHECK(em_chunk(em_arange(0, 6, 1, EM_F64), 4, 0, p, 8) == 3); /* torch: sizes 2, 2, 2 */
    CHECK(em_chunk(t, 20, 0, p, 8) == -1);
    CHECK(em_chunk(em_zeros(EM_F32, EM_SHAPE(0, 2)), 3, 0, p, 8) == 3); /* torch: 3 empty pieces */
    CHECK(em_size(p[2], 0) == 0);
    em_scope_end(s);
}

static em_tensor *f_split_mix(em_tensor **x, void *ctx)
{
    (void)ctx;
    em_tensor *p[3];
    if (em_split(x[0], 2, 1, p, 3) != 3) return NULL;
    /* (2,5) -> pieces (2,2),(2,2),(2,1); recombine in another order with weights */
    return em_concat(3, (em_tensor *[]){em_mul_scalar(p[2], 3.0), p[0], em_mul(p[1], p[1])}, 1);
}

static em_tensor *f_chunk_mix(em_tensor **x, void *ctx)
{
    (void)ctx;
    em_tensor *p[3];
    if (em_chunk(x[0], 3, 0, p, 3) != 3) return NULL;
    /* (7,2) -> (3,2),(3,2),(1,2); the middle piece is used twice, the first not at all */
    return em_stack(2, (em_tensor *[]){em_add(p[1], p[1]), em_mul(p[1], p[1])}, 0);
}

static em_tensor *f_chunk_last(em_tensor **x, void *ctx)
{
    (void)ctx;
    em_tensor *p[3];
    return em_chunk(x[0], 3, 0, p, 3) == 3 ? em_mul(p[2], p[2]) : NULL;
}

TEST(test_split_and_chunk_gradients_match_finite_difference)
{
    em_scope s = em_scope_begin();
    em_tensor *a[1] = {randn(EM_SHAPE(2, 5), 12)};
    GRADCHECK("split", f_split_mix, NULL, 1, a);
    F32_MATCHES_F64("split", f_split_mix, NULL, 1, a, 1e-6);
    em_tensor *na[1] = {th_noncontig(a[0])};
    GRADCHECK("split noncontig", f_split_mix, NULL, 1, na);
    em_tensor *b[1] = {randn(EM_SHAPE(7, 2), 13)};
    GRADCHECK("chunk", f_chunk_mix, NULL, 1, b);
    GRADCHECK("chunk last", f_chunk_last, NULL, 1, b);
    F32_MATCHES_F64("chunk", f_chunk_mix, NULL, 1, b, 1e-6);
    em_scope_end(s);
}

TEST(test_split_and_chunk_reject_bad_arguments)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(4, 6));
    em_tensor *p[2];
    CHECK_ERR(em_split(t, 2, 1, p, 2), EM_ERR_ARG,
              "split: (4,6) gives 3 pieces along dim 1 but max_out is 2");
    CHECK(em_split(t, 2, 1, p, 2) == -1);
    CHECK_ERR(em_split(t, 0, 1, p, 2), EM_ERR_ARG, "split: size 0 must be >= 1");
    CHECK_ERR(em_split(t, 2, 2, p, 2), EM_ERR_ARG, "split: dim 2 is out of range");
    CHECK_ERR(em_split(t, 2, 0, NULL, 2), EM_ERR_ARG, "split: out is NULL");
    CHECK_ERR(em_chunk(t, 3, 1, p, 2), EM_ERR_ARG,
              "chunk: (4,6) gives 3 pieces along dim 1 but max_out is 2");
    CHECK_ERR(em_chunk(t, 0, 1, p, 2), EM_ERR_ARG, "chunk: chunks 0 must be >= 1");
    CHECK_ERR(em_chunk(t, 2, -3, p, 2), EM_ERR_ARG, "chunk: dim -3 is out of range");
    em_scope_end(s);
}
