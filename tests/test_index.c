/* test_index.c — embedding, index_select, scatter_add: values, gradients
 * (repeated indices accumulate), f32 vs f64, non-contiguous inputs, and the
 * index range checks. */
#include "harness.h"

static em_tensor *idx_of(int ndim, const int64_t *shape, const double *v)
{
    return th_tensor(EM_I32, ndim, shape, v);
}

static em_tensor *randn(int ndim, const int64_t *shape, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    return em_randn(EM_F64, ndim, shape, &r);
}

/* ---- embedding ---------------------------------------------------------------------- */

TEST(test_embedding_gathers_rows_for_any_index_shape)
{
    em_scope s = em_scope_begin();
    em_tensor *w = em_arange(0, 12, 1, EM_F32);
    w = em_reshape(w, EM_SHAPE(4, 3));
    em_tensor *idx = idx_of(EM_SHAPE(2, 2), (double[]){3, 0, 1, 3});
    em_tensor *y = em_embedding(w, idx);
    CHECK(em_ndim(y) == 3 && em_size(y, 0) == 2 && em_size(y, 1) == 2 && em_size(y, 2) == 3);
    CHECK_VALUES(y, 0, 9, 10, 11, 0, 1, 2, 3, 4, 5, 9, 10, 11);
    /* a 0-dim index gives one row */
    em_tensor *y0 = em_embedding(w, em_scalar(EM_I32, 2));
    CHECK(em_ndim(y0) == 1);
    CHECK_VALUES(y0, 0, 6, 7, 8);
    em_scope_end(s);
}

TEST(test_embedding_keeps_half_and_integer_dtypes)
{
    em_scope s = em_scope_begin();
    em_tensor *idx = idx_of(EM_SHAPE(3), (double[]){1, 1, 0});
    em_dtype dts[] = {EM_F16, EM_BF16, EM_I32, EM_U8};
    for (int i = 0; i < 4; i++) {
        em_tensor *w = th_tensor(dts[i], EM_SHAPE(2, 2), (double[]){1, 2, 3, 4});
        em_tensor *y = em_embedding(w, idx);
        CHECK(em_dtype_of(y) == dts[i]);
        CHECK_VALUES(y, 0, 3, 4, 3, 4, 1, 2);
    }
    em_scope_end(s);
}

static em_tensor *f_embedding(em_tensor **x, void *ctx) { return em_embedding(x[0], ctx); }

TEST(test_embedding_gradient_matches_finite_difference_with_repeats)
{
    em_scope s = em_scope_begin();
    em_tensor *idx = idx_of(EM_SHAPE(2, 3), (double[]){4, 1, 4, 0, 4, 1});
    em_tensor *in[1] = {randn(EM_SHAPE(5, 3), 1)};
    GRADCHECK("embedding", f_embedding, idx, 1, in);
    F32_MATCHES_F64("embedding", f_embedding, idx, 1, in, 1e-6);
    em_tensor *nc[1] = {th_noncontig(in[0])};
    CHECK(!em_is_contiguous(nc[0]));
    GRADCHECK("embedding noncontig", f_embedding, th_noncontig(idx), 1, nc);
    em_scope_end(s);
}

TEST(test_embedding_backward_counts_each_use_of_a_row)
{
    em_scope s = em_scope_begin();
    /* 300 columns: more than one column block in the index-add kernel */
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(50, 300));
    CHECK_OK(em_set_requires_grad(w, true));
    em_rng r = em_rng_new(3);
    em_tensor *idx = em_randint(0, 50, EM_I32, EM_SHAPE(40, 50), &r);
    CHECK_OK(em_backward(em_sum(em_embedding(w, idx), 0, NULL, false), NULL));
    int32_t iv[2000];
    em_to_array(idx, EM_I32, iv);
    double count[50] = {0};
    for (int i = 0; i < 2000; i++) count[iv[i]] += 1;
    em_tensor *g = em_grad(w);
    for (int64_t row = 0; row < 50; row++)
        for (int64_t col = 0; col < 300; col += 299)
            CHECK_NEAR(em_get(g, (int64_t[]){row, col}), count[row], 0);
    em_scope_end(s);
}

/* The gradient of a GPT's token table (65 x 128, one slice of 128
 * columns, 768 uses): split over the pool by blocks of columns, it must
 * have the one-thread bits at any thread count */
TEST(test_embedding_gradient_has_the_same_bits_at_any_thread_count)
{
    int threads = em_num_threads();
    float got[3][65 * 128];
    for (int t = 0; t < 3; t++) {
        CHECK_OK(em_set_num_threads(t + 1));
        em_scope s = em_scope_begin();
        em_rng r = em_rng_new(5);
        em_tensor *w = em_randn(EM_F32, EM_SHAPE(65, 128), &r);
        CHECK_OK(em_set_requires_grad(w, true));
        em_tensor *idx = em_randint(0, 65, EM_I32, EM_SHAPE(12, 64), &r);
        em_tensor *up = em_randn(EM_F32, EM_SHAPE(12, 64, 128), &r);
        CHECK_OK(em_backward(em_sum(em_mul(em_embedding(w, idx), up), 0, NULL, false), NULL));
        memcpy(got[t], em_data(em_grad(w)), sizeof got[t]);
        em_scope_end(s);
    }
    CHECK_OK(em_set_num_threads(threads));
    CHECK(!memcmp(got[0], got[1], sizeof got[0]) && !memcmp(got[0], got[2], sizeof got[0]));
}

TEST(test_embedding_noncontiguous_inputs_give_same_values)
{
    em_scope s = em_scope_begin();
    em_tensor *w = randn(EM_SHAPE(6, 4), 2);
    em_tensor *idx = idx_of(EM_SHAPE(2, 3), (double[]){5, 0, 2, 2, 1, 3});
    em_tensor *want = em_embedding(w, idx);
    CHECK(th_max_abs_diff(em_embedding(th_noncontig(w), idx), want) == 0);
    CHECK(th_max_abs_diff(em_embedding(w, th_noncontig(idx)), want) == 0);
    /* a transposed index tensor */
    em_tensor *it = em_transpose(idx_of(EM_SHAPE(3, 2), (double[]){5, 2, 0, 1, 2, 3}), 0, 1);
    CHECK(th_max_abs_diff(em_embedding(w, it), want) == 0);
    em_scope_end(s);
}

TEST(test_embedding_rejects_out_of_range_index)
{
    em_scope s = em_scope_begin();
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(65, 8));
    em_tensor *idx = idx_of(EM_SHAPE(5), (double[]){0, 1, 64, 70, 2});
    CHECK_ERR(em_embedding(w, idx), EM_ERR_INDEX,
              "embedding: index 70 at position 3 is out of range for 65 rows");
    em_tensor *idx2 = idx_of(EM_SHAPE(2, 2), (double[]){0, 1, 65, 2});
    CHECK_ERR(em_embedding(w, idx2), EM_ERR_INDEX, "embedding: index 65 at position (1,0) is out of range");
    em_scope_end(s);
}

TEST(test_embedding_rejects_negative_index)
{
    em_scope s = em_scope_begin();
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(4, 2));
    CHECK_ERR(em_embedding(w, idx_of(EM_SHAPE(2), (double[]){1, -1})), EM_ERR_INDEX,
              "embedding: index -1 at position 1 is out of range for 4 rows");
    em_scope_end(s);
}

TEST(test_embedding_rejects_bad_dtype_and_shape)
{
    em_scope s = em_scope_begin();
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(4, 2));
    CHECK_ERR(em_embedding(w, em_zeros(EM_F32, EM_SHAPE(3))), EM_ERR_DTYPE,
              "embedding: indices must be i32, got f32(3,)");
    CHECK_ERR(em_embedding(em_zeros(EM_F32, EM_SHAPE(4)), em_zeros(EM_I32, EM_SHAPE(3))), EM_ERR_SHAPE,
              "embedding: weight must be 2-D (V,C), got (4,)");
    em_scope_end(s);
}

/* ---- index_select -------------------------------------------------------------------- */

TEST(test_index_select_picks_slices_along_dim)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_reshape(em_arange(0, 12, 1, EM_F64), EM_SHAPE(3, 4));
    CHECK_VALUES(em_index_select(t, 1, idx_of(EM_SHAPE(3), (double[]){3, 0, 3})), 0, 3, 0, 3, 7, 4, 7, 11, 8,
                 11);
    CHECK_VALUES(em_index_select(t, 0, idx_of(EM_SHAPE(2), (double[]){2, 0})), 0, 8, 9, 10, 11, 0, 1, 2, 3);
    CHECK_VALUES(em_index_select(t, -1, idx_of(EM_SHAPE(1), (double[]){1})), 0, 1, 5, 9);
    em_tensor *e = em_index_select(t, 0, em_zeros(EM_I32, EM_SHAPE(0)));
    CHECK(em_size(e, 0) == 0 && em_size(e, 1) == 4);
    /* integer tensors and a transposed (non-contiguous) input */
    em_tensor *ti = em_cast(t, EM_I32);
    CHECK_VALUES(em_index_select(em_transpose(ti, 0, 1), 1, idx_of(EM_SHAPE(2), (double[]){2, 2})), 0, 8, 8,
                 9, 9, 10, 10, 11, 11);
    em_scope_end(s);
}

typedef struct sel_case {
    int dim;
    em_tensor *idx;
} sel_case;

static em_tensor *f_select(em_tensor **x, void *ctx)
{
    sel_case *c = ctx;
    return em_index_select(x[0], c->dim, c->idx);
}

TEST(test_index_select_gradient_matches_finite_difference)
{
    em_scope s = em_scope_begin();
    em_tensor *in[1] = {randn(EM_SHAPE(2, 4, 3), 4)};
    for (int dim = 0; dim < 3; dim++) {
        sel_case c = {dim, idx_of(EM_SHAPE(4), (double[]){1, 0, 1, 1})};
        GRADCHECK("index_select", f_select, &c, 1, in);
        F32_MATCHES_F64("index_select", f_select, &c, 1, in, 1e-6);
        em_tensor *nc[1] = {th_noncontig(in[0])};
        GRADCHECK("index_select noncontig", f_select, &c, 1, nc);
    }
    em_scope_end(s);
}

TEST(test_index_select_rejects_out_of_range_index)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(3, 4));
    CHECK_ERR(em_index_select(t, 1, idx_of(EM_SHAPE(2), (double[]){0, 4})), EM_ERR_INDEX,
              "index_select: index 4 at position 1 is out of range for dim 1 of size 4");
    CHECK_ERR(em_index_select(t, 0, idx_of(EM_SHAPE(1), (double[]){-2})), EM_ERR_INDEX,
              "index_select: index -2 at position 0");
    em_scope_end(s);
}

TEST(test_index_select_rejects_bad_index_shape_dtype_and_dim)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(3, 4));
    CHECK_ERR(em_index_select(t, 0, em_zeros(EM_I32, EM_SHAPE(2, 1))), EM_ERR_SHAPE,
              "index_select: indices must be 1-D, got (2,1)");
    CHECK_ERR(em_index_select(t, 0, em_zeros(EM_U8, EM_SHAPE(2))), EM_ERR_DTYPE,
              "index_select: indices must be i32");
    CHECK_ERR(em_index_select(t, 2, em_zeros(EM_I32, EM_SHAPE(2))), EM_ERR_ARG,
              "index_select: dim 2 is out of range");
    em_scope_end(s);
}

/* ---- scatter_add ---------------------------------------------------------------------- */

TEST(test_scatter_add_adds_src_at_indices_along_dim0)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(3, 3));
    em_tensor *index = idx_of(EM_SHAPE(2, 3), (double[]){0, 1, 2, 2, 0, 0});
    em_tensor *src = th_tensor(EM_F32, EM_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    CHECK_VALUES(em_scatter_add(t, 0, index, src), 0, 1, 5, 6, 0, 2, 0, 4, 0, 3);
    em_scope_end(s);
}

TEST(test_scatter_add_accumulates_duplicates_along_dim1_and_keeps_input)
{
    em_scope s = em_scope_begin();
    /* index (2,3) is smaller than t (3,4) in the non-scatter dim: row 2 is untouched */
    em_tensor *t = em_ones(EM_F64, EM_SHAPE(3, 4));
    em_tensor *index = idx_of(EM_SHAPE(2, 3), (double[]){0, 0, 3, 1, 2, 1});
    em_tensor *src = th_tensor(EM_F64, EM_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    em_tensor *y = em_scatter_add(t, -1, index, src);
    CHECK_VALUES(y, 0, 4, 1, 1, 4, 1, 11, 6, 1, 1, 1, 1, 1);
    CHECK_VALUES(t, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1); /* t is not modified */
    /* integer dtype and non-contiguous operands give the same result */
    em_tensor *yi = em_scatter_add(em_cast(t, EM_I32), 1, th_noncontig(index), em_cast(src, EM_I32));
    CHECK(em_dtype_of(yi) == EM_I32);
    CHECK(th_max_abs_diff(yi, y) == 0);
    CHECK(th_max_abs_diff(em_scatter_add(th_noncontig(t), 1, index, th_noncontig(src)), y) == 0);
    em_scope_end(s);
}

typedef struct scat_case {
    int dim;
    em_tensor *index;
} scat_case;

static em_tensor *f_scatter(em_tensor **x, void *ctx)
{
    scat_case *c = ctx;
    return em_scatter_add(x[0], c->dim, c->index, x[1]);
}

TEST(test_scatter_add_gradient_matches_finite_difference_for_both_inputs)
{
    em_scope s = em_scope_begin();
    em_tensor *in[2] = {randn(EM_SHAPE(3, 4, 2), 5), randn(EM_SHAPE(2, 4, 2), 6)};
    scat_case c0 = {0, idx_of(EM_SHAPE(2, 4, 2), (double[]){0, 2, 1, 1, 2, 2, 0, 0, 2, 2, 1, 0, 0, 1, 2, 2})};
    GRADCHECK("scatter_add dim0", f_scatter, &c0, 2, in);
    F32_MATCHES_F64("scatter_add dim0", f_scatter, &c0, 2, in, 1e-6);
    em_tensor *nc[2] = {th_noncontig(in[0]), th_noncontig(in[1])};
    GRADCHECK("scatter_add noncontig", f_scatter, &c0, 2, nc);
    /* dim 1, index smaller than src-free dims of t */
    em_tensor *in1[2] = {randn(EM_SHAPE(3, 4, 2), 7), randn(EM_SHAPE(2, 3, 2), 8)};
    scat_case c1 = {1, idx_of(EM_SHAPE(2, 3, 2), (double[]){3, 3, 0, 3, 3, 1, 2, 0, 0, 0, 1, 1})};
    GRADCHECK("scatter_add dim1", f_scatter, &c1, 2, in1);
    em_scope_end(s);
}

TEST(test_scatter_add_rejects_out_of_range_index)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(3, 3));
    em_tensor *src = em_ones(EM_F32, EM_SHAPE(2, 3));
    CHECK_ERR(em_scatter_add(t, 0, idx_of(EM_SHAPE(2, 3), (double[]){0, 1, 2, 0, 0, 3}), src), EM_ERR_INDEX,
              "scatter_add: index 3 at position (1,2) is out of range for dim 0 of size 3");
    CHECK_ERR(em_scatter_add(t, 0, idx_of(EM_SHAPE(2, 3), (double[]){0, -1, 2, 0, 0, 0}), src), EM_ERR_INDEX,
              "scatter_add: index -1 at position (0,1)");
    em_scope_end(s);
}

TEST(test_scatter_add_rejects_mismatched_shapes_and_dtypes)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(3, 3));
    em_tensor *i23 = em_zeros(EM_I32, EM_SHAPE(2, 3));
    CHECK_ERR(em_scatter_add(t, 0, i23, em_ones(EM_F32, EM_SHAPE(2, 2))), EM_ERR_SHAPE,
              "scatter_add: src (2,2) and index (2,3) must have the same shape");
    CHECK_ERR(em_scatter_add(t, 0, em_zeros(EM_I32, EM_SHAPE(6)), em_ones(EM_F32, EM_SHAPE(6))), EM_ERR_SHAPE,
              "scatter_add: index (6,) must have as many dims as the input (3,3)");
    CHECK_ERR(em_scatter_add(t, 0, em_zeros(EM_I32, EM_SHAPE(2, 4)), em_ones(EM_F32, EM_SHAPE(2, 4))),
              EM_ERR_SHAPE, "scatter_add: index (2,4) is larger than the input (3,3) in dim 1");
    CHECK_ERR(em_scatter_add(t, 0, i23, em_ones(EM_F64, EM_SHAPE(2, 3))), EM_ERR_DTYPE,
              "scatter_add: dtypes differ");
    CHECK_ERR(em_scatter_add(t, 0, em_zeros(EM_F32, EM_SHAPE(2, 3)), em_ones(EM_F32, EM_SHAPE(2, 3))),
              EM_ERR_DTYPE, "scatter_add: indices must be i32");
    em_scope_end(s);
}
