/* test_matmul.c — matmul: values against numpy, batch broadcasting, transposed
 * and strided operands, reduced-precision dtypes, gradients, errors. */
#include "fixtures/matmul_ref.h"
#include "harness.h"

static em_tensor *f_matmul(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_matmul(x[0], x[1]);
}

/* a (M,K) @ b (K,N) by plain loops in double, for comparisons. */
static em_tensor *naive_matmul(em_tensor *a, em_tensor *b)
{
    int64_t M = em_size(a, 0), K = em_size(a, 1), N = em_size(b, 1);
    double av[64 * 64], bv[64 * 64], cv[64 * 64];
    em_to_array(a, EM_F64, av);
    em_to_array(b, EM_F64, bv);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t p = 0; p < K; p++) s += av[i * K + p] * bv[p * N + j];
            cv[i * N + j] = s;
        }
    return em_from_data(EM_F64, EM_SHAPE(M, N), cv);
}

TEST(test_matmul_2d_matches_numpy)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_from_data(EM_F64, EM_SHAPE(3, 4), mm2_a),
              *b = em_from_data(EM_F64, EM_SHAPE(4, 2), mm2_b);
    em_tensor *c = em_matmul(a, b);
    CHECK_NOTNULL(c);
    CHECK(em_ndim(c) == 2 && em_size(c, 0) == 3 && em_size(c, 1) == 2);
    th_check_values(__FILE__, __LINE__, c, mm2_out, 1e-12);
    em_tensor *c32 = em_matmul(em_cast(a, EM_F32), em_cast(b, EM_F32));
    CHECK(em_dtype_of(c32) == EM_F32);
    th_check_values(__FILE__, __LINE__, c32, mm2_out, 1e-5);
    em_scope_end(s);
}

TEST(test_matmul_hand_computed_2x2)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){5, 6, 7, 8});
    CHECK_VALUES(em_matmul(a, b), 0, 19, 22, 43, 50);
    em_scope_end(s);
}

TEST(test_matmul_batched_broadcast_matches_numpy)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_from_data(EM_F64, EM_SHAPE(2, 1, 2, 3), mmb_a);
    em_tensor *b = em_from_data(EM_F64, EM_SHAPE(3, 3, 2), mmb_b);
    em_tensor *c = em_matmul(a, b);
    CHECK_NOTNULL(c);
    CHECK(em_ndim(c) == 4 && em_size(c, 0) == 2 && em_size(c, 1) == 3 && em_size(c, 2) == 2 &&
          em_size(c, 3) == 2);
    th_check_values(__FILE__, __LINE__, c, mmb_out, 1e-12);
    th_check_values(__FILE__, __LINE__, em_matmul(em_cast(a, EM_F32), em_cast(b, EM_F32)), mmb_out, 1e-5);
    em_scope_end(s);
}

TEST(test_matmul_batched_by_matrix_equals_per_batch_products)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(3);
    em_tensor *a = em_randn(EM_F32, EM_SHAPE(2, 3, 5, 4), &r), *b = em_randn(EM_F32, EM_SHAPE(4, 6), &r);
    em_tensor *c = em_matmul(a, b);
    CHECK_NOTNULL(c);
    CHECK(em_ndim(c) == 4 && em_size(c, 2) == 5 && em_size(c, 3) == 6);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            em_tensor *ai = em_squeeze(em_squeeze(em_narrow(em_narrow(a, 0, i, 1), 1, j, 1), 0), 0);
            em_tensor *ci = em_squeeze(em_squeeze(em_narrow(em_narrow(c, 0, i, 1), 1, j, 1), 0), 0);
            CHECK(th_max_abs_diff(ci, naive_matmul(ai, b)) < 1e-5);
        }
    em_scope_end(s);
}

TEST(test_matmul_batched_by_batched_multiplies_matching_pairs)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(8);
    em_tensor *a = em_randn(EM_F64, EM_SHAPE(3, 2, 4), &r), *b = em_randn(EM_F64, EM_SHAPE(3, 4, 5), &r);
    em_tensor *c = em_matmul(a, b);
    CHECK_NOTNULL(c);
    for (int i = 0; i < 3; i++) {
        em_tensor *ai = em_squeeze(em_narrow(a, 0, i, 1), 0), *bi = em_squeeze(em_narrow(b, 0, i, 1), 0);
        CHECK(th_max_abs_diff(em_squeeze(em_narrow(c, 0, i, 1), 0), naive_matmul(ai, bi)) < 1e-12);
    }
    em_scope_end(s);
}

TEST(test_matmul_matrix_by_batched_broadcasts_a)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(4);
    em_tensor *a = em_randn(EM_F64, EM_SHAPE(3, 4), &r), *b = em_randn(EM_F64, EM_SHAPE(2, 4, 5), &r);
    em_tensor *c = em_matmul(a, b);
    CHECK_NOTNULL(c);
    CHECK(em_ndim(c) == 3 && em_size(c, 0) == 2 && em_size(c, 1) == 3 && em_size(c, 2) == 5);
    for (int i = 0; i < 2; i++) {
        em_tensor *bi = em_squeeze(em_narrow(b, 0, i, 1), 0), *ci = em_squeeze(em_narrow(c, 0, i, 1), 0);
        CHECK(th_max_abs_diff(ci, naive_matmul(a, bi)) < 1e-12);
    }
    em_scope_end(s);
}

TEST(test_matmul_transposed_operands_give_same_result)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(5);
    em_tensor *a = em_randn(EM_F32, EM_SHAPE(5, 7), &r), *b = em_randn(EM_F32, EM_SHAPE(7, 3), &r);
    em_tensor *want = naive_matmul(a, b);
    /* a^T and b^T stored contiguously, then transposed back: strides (1,ld) */
    em_tensor *at = em_transpose(em_contiguous(em_transpose(a, 0, 1)), 0, 1);
    em_tensor *bt = em_transpose(em_contiguous(em_transpose(b, 0, 1)), 0, 1);
    CHECK(!em_is_contiguous(at) && !em_is_contiguous(bt));
    CHECK(em_strides(at)[0] == 1 && em_strides(bt)[0] == 1);
    CHECK(th_max_abs_diff(em_matmul(at, b), want) < 1e-5);
    CHECK(th_max_abs_diff(em_matmul(a, bt), want) < 1e-5);
    CHECK(th_max_abs_diff(em_matmul(at, bt), want) < 1e-5);
    em_scope_end(s);
}

TEST(test_matmul_strided_and_noncontiguous_operands_give_same_result)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(6);
    em_tensor *a = em_randn(EM_F64, EM_SHAPE(4, 6), &r), *b = em_randn(EM_F64, EM_SHAPE(6, 5), &r);
    em_tensor *want = naive_matmul(a, b);
    /* every other element: strides (12,2) fit neither BLAS layout: copied */
    CHECK(th_max_abs_diff(em_matmul(th_noncontig(a), th_noncontig(b)), want) < 1e-12);
    /* columns narrowed out of a wider matrix: row stride (ld) > cols */
    em_tensor *wide = em_randn(EM_F64, EM_SHAPE(4, 9), &r);
    em_tensor *an = em_narrow(wide, 1, 2, 6);
    CHECK_OK(em_copy_into(an, a));
    CHECK(!em_is_contiguous(an));
    CHECK(th_max_abs_diff(em_matmul(an, b), want) < 1e-12);
    /* a broadcast row (stride 0 along M) */
    em_tensor *row = em_narrow(a, 0, 1, 1);
    em_tensor *rows = em_expand(row, EM_SHAPE(3, 6));
    em_tensor *got = em_matmul(rows, b);
    for (int i = 0; i < 3; i++)
        CHECK(th_max_abs_diff(em_narrow(got, 0, i, 1), em_narrow(want, 0, 1, 1)) < 1e-12);
    em_scope_end(s);
}

TEST(test_matmul_noncontiguous_batch_dims_give_same_result)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(7);
    /* (T,H,D) seen as (H,T,D) by a permute: batch stride D, row stride H*D */
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(5, 3, 4), &r), *w = em_randn(EM_F32, EM_SHAPE(4, 2), &r);
    em_tensor *xp = em_permute(x, (int[]){1, 0, 2});
    em_tensor *got = em_matmul(xp, w), *want = em_matmul(em_contiguous(xp), w);
    CHECK_NOTNULL(got);
    CHECK(th_max_abs_diff(got, want) < 1e-6);
    em_scope_end(s);
}

TEST(test_matmul_f16_and_bf16_keep_dtype_and_values)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    em_tensor *b = th_tensor(EM_F64, EM_SHAPE(2, 3), (double[]){0.5, -1, 2, 0.25, 1.5, -3});
    em_dtype dts[2] = {EM_F16, EM_BF16};
    for (int i = 0; i < 2; i++) {
        em_tensor *c = em_matmul(em_cast(a, dts[i]), em_cast(b, dts[i]));
        CHECK_NOTNULL(c);
        CHECK(em_dtype_of(c) == dts[i]);
        CHECK_VALUES(c, 0, 1, 2, -4, 2.5, 3, -6);
    }
    em_scope_end(s);
}

TEST(test_matmul_integer_dtype)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_I32, EM_SHAPE(2, 2), (double[]){1, -2, 3, 4});
    em_tensor *b = th_tensor(EM_I32, EM_SHAPE(2, 1), (double[]){5, 6});
    em_tensor *c = em_matmul(a, b);
    CHECK(em_dtype_of(c) == EM_I32);
    CHECK_VALUES(c, 0, -7, 39);
    em_scope_end(s);
}

TEST(test_matmul_empty_inner_dim_gives_zeros)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2, 0)), *b = em_ones(EM_F32, EM_SHAPE(0, 3));
    CHECK_VALUES(em_matmul(a, b), 0, 0, 0, 0, 0, 0, 0);
    em_scope_end(s);
}

TEST(test_matmul_gradient_2d_matches_finite_difference)
{
    em_rng r = em_rng_new(11);
    em_tensor *in[2] = {em_randn(EM_F64, EM_SHAPE(3, 4), &r), em_randn(EM_F64, EM_SHAPE(4, 2), &r)};
    GRADCHECK("matmul 2-D", f_matmul, NULL, 2, in);
    F32_MATCHES_F64("matmul 2-D", f_matmul, NULL, 2, in, 1e-6);
    em_tensor *nc[2] = {th_noncontig(in[0]), th_noncontig(in[1])};
    GRADCHECK("matmul 2-D noncontiguous", f_matmul, NULL, 2, nc);
    for (int i = 0; i < 2; i++) {
        em_free(in[i]);
        em_free(nc[i]);
    }
}

TEST(test_matmul_gradient_batched_broadcast_matches_finite_difference)
{
    em_rng r = em_rng_new(12);
    em_tensor *in[2] = {em_randn(EM_F64, EM_SHAPE(2, 1, 2, 3), &r), em_randn(EM_F64, EM_SHAPE(3, 3, 2), &r)};
    GRADCHECK("matmul batched broadcast", f_matmul, NULL, 2, in);
    F32_MATCHES_F64("matmul batched broadcast", f_matmul, NULL, 2, in, 1e-6);
    for (int i = 0; i < 2; i++) em_free(in[i]);
}

TEST(test_matmul_gradient_batched_by_matrix_matches_finite_difference)
{
    em_rng r = em_rng_new(13);
    em_tensor *in[2] = {em_randn(EM_F64, EM_SHAPE(2, 3, 4), &r), em_randn(EM_F64, EM_SHAPE(4, 3), &r)};
    GRADCHECK("matmul (B,T,C) @ (C,N)", f_matmul, NULL, 2, in);
    em_tensor *sw[2] = {em_randn(EM_F64, EM_SHAPE(3, 4), &r), em_randn(EM_F64, EM_SHAPE(2, 4, 2), &r)};
    GRADCHECK("matmul (M,K) @ (B,K,N)", f_matmul, NULL, 2, sw);
    for (int i = 0; i < 2; i++) {
        em_free(in[i]);
        em_free(sw[i]);
    }
}

static em_tensor *f_matmul_bt(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_matmul(x[0], em_transpose(x[1], -1, -2));
}

TEST(test_matmul_gradient_through_transposed_operand)
{
    em_rng r = em_rng_new(14);
    em_tensor *in[2] = {em_randn(EM_F64, EM_SHAPE(2, 3, 4), &r), em_randn(EM_F64, EM_SHAPE(2, 5, 4), &r)};
    GRADCHECK("matmul a @ b^T", f_matmul_bt, NULL, 2, in);
    for (int i = 0; i < 2; i++) em_free(in[i]);
}

TEST(test_matmul_gradient_in_f16_has_input_dtype)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_cast(th_tensor(EM_F64, EM_SHAPE(1, 2), (double[]){1, 2}), EM_F16);
    em_tensor *b = em_cast(th_tensor(EM_F64, EM_SHAPE(2, 1), (double[]){3, 4}), EM_F16);
    CHECK_OK(em_set_requires_grad(a, true));
    CHECK_OK(em_set_requires_grad(b, true));
    CHECK_OK(em_backward(em_matmul(a, b), NULL));
    CHECK(em_dtype_of(em_grad(a)) == EM_F16);
    CHECK_VALUES(em_grad(a), 0, 3, 4);
    CHECK_VALUES(em_grad(b), 0, 1, 2);
    em_scope_end(s);
}

TEST(test_matmul_rejects_inner_dim_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(32, 768)), *b = em_zeros(EM_F32, EM_SHAPE(512, 10));
    CHECK_ERR(em_matmul(a, b), EM_ERR_SHAPE, "matmul: inner dims differ: a is (32,768), b is (512,10)");
    em_scope_end(s);
}

TEST(test_matmul_rejects_1d_operand)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(3)), *b = em_zeros(EM_F32, EM_SHAPE(3, 2));
    CHECK_ERR(em_matmul(a, b), EM_ERR_SHAPE, "matmul: operands must be at least 2-D: a is (3,), b is (3,2)");
    CHECK_ERR(em_matmul(b, a), EM_ERR_SHAPE, "at least 2-D");
    em_scope_end(s);
}

TEST(test_matmul_rejects_dtype_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3)), *b = em_zeros(EM_F64, EM_SHAPE(3, 2));
    CHECK_ERR(em_matmul(a, b), EM_ERR_DTYPE, "matmul: dtypes differ: f32(2,3) and f64(3,2)");
    em_tensor *c = em_zeros(EM_BOOL, EM_SHAPE(2, 2));
    CHECK_ERR(em_matmul(c, c), EM_ERR_DTYPE, "matmul: does not take bool");
    em_scope_end(s);
}

TEST(test_matmul_rejects_batch_dims_that_do_not_broadcast)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3, 4)), *b = em_zeros(EM_F32, EM_SHAPE(3, 4, 5));
    CHECK_ERR(em_matmul(a, b), EM_ERR_SHAPE,
              "matmul: batch dims do not broadcast: a is (2,3,4), b is (3,4,5)");
    em_scope_end(s);
}
