/* test_attention.c — causal attention: values against numpy and against the
 * composed reference (matmul + masked softmax), causality, gradients,
 * dtypes, non-contiguous inputs, errors. */
#include <stdlib.h>

#include "fixtures/matmul_ref.h"
#include "harness.h"

typedef struct att_args {
    double scale;
} att_args;

static em_tensor *f_att(em_tensor **x, void *ctx)
{
    att_args *a = ctx;
    return em_attention_causal(x[0], x[1], x[2], a ? a->scale : 0.0);
}

/* softmax(q k^T * scale, masked to j <= i) v, with em_matmul for the products
 * and the masked softmax by plain loops here. q, k, v (B,H,T,D) f64. */
static em_tensor *composed_reference(em_tensor *q, em_tensor *k, em_tensor *v, double scale)
{
    const int64_t *sh = em_shape(q);
    int64_t BH = sh[0] * sh[1], T = sh[2];
    em_tensor *S = em_matmul(q, em_transpose(k, -1, -2));
    if (!S) return NULL;
    double *s = malloc(sizeof(double) * (size_t)(BH * T * T));
    em_to_array(S, EM_F64, s);
    for (int64_t h = 0; h < BH; h++)
        for (int64_t i = 0; i < T; i++) {
            double *row = s + (h * T + i) * T, m = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= i; j++) m = fmax(m, row[j] * scale);
            for (int64_t j = 0; j < T; j++) {
                row[j] = j <= i ? exp(row[j] * scale - m) : 0.0;
                sum += row[j];
            }
            for (int64_t j = 0; j < T; j++) row[j] /= sum;
        }
    em_tensor *P = em_from_data(EM_F64, EM_SHAPE(sh[0], sh[1], T, T), s);
    free(s);
    return em_matmul(P, v);
}

TEST(test_attention_matches_numpy)
{
    em_scope s = em_scope_begin();
    em_tensor *q = em_from_data(EM_F64, EM_SHAPE(1, 2, 3, 2), att_q);
    em_tensor *k = em_from_data(EM_F64, EM_SHAPE(1, 2, 3, 2), att_k);
    em_tensor *v = em_from_data(EM_F64, EM_SHAPE(1, 2, 3, 2), att_v);
    em_tensor *o = em_attention_causal(q, k, v, 0.0); /* default 1/sqrt(2) */
    CHECK_NOTNULL(o);
    CHECK(em_ndim(o) == 4 && em_size(o, 2) == 3 && em_size(o, 3) == 2);
    th_check_values(__FILE__, __LINE__, o, att_out, 1e-12);
    th_check_values(__FILE__, __LINE__, em_attention_causal(q, k, v, 3.0), att_out_scale3, 1e-12);
    em_tensor *o32 = em_attention_causal(em_cast(q, EM_F32), em_cast(k, EM_F32), em_cast(v, EM_F32), -1.0);
    CHECK(em_dtype_of(o32) == EM_F32);
    th_check_values(__FILE__, __LINE__, o32, att_out, 1e-5);
    em_scope_end(s);
}

TEST(test_attention_first_position_returns_first_value)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(21);
    em_tensor *q = em_randn(EM_F32, EM_SHAPE(1, 1, 4, 3), &r),
              *k = em_randn(EM_F32, EM_SHAPE(1, 1, 4, 3), &r);
    em_tensor *v = em_randn(EM_F32, EM_SHAPE(1, 1, 4, 3), &r);
    em_tensor *o = em_attention_causal(q, k, v, 0.0);
    CHECK(th_max_abs_diff(em_narrow(o, 2, 0, 1), em_narrow(v, 2, 0, 1)) == 0);
    em_scope_end(s);
}

TEST(test_attention_equals_composed_reference)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(22);
    em_tensor *q = em_randn(EM_F64, EM_SHAPE(2, 3, 7, 5), &r),
              *k = em_randn(EM_F64, EM_SHAPE(2, 3, 7, 5), &r);
    em_tensor *v = em_randn(EM_F64, EM_SHAPE(2, 3, 7, 5), &r);
    em_tensor *want = composed_reference(q, k, v, 1.0 / sqrt(5.0));
    CHECK(th_max_abs_diff(em_attention_causal(q, k, v, 0.0), want) < 1e-12);
    em_tensor *q32 = em_cast(q, EM_F32), *k32 = em_cast(k, EM_F32), *v32 = em_cast(v, EM_F32);
    CHECK(th_max_abs_diff(em_attention_causal(q32, k32, v32, 0.0), want) < 1e-5);
    CHECK(th_max_abs_diff(em_attention_causal(q, k, v, 0.7), composed_reference(q, k, v, 0.7)) < 1e-12);
    em_scope_end(s);
}

/* Gradients of sum(o * go) by the textbook formulas, with plain loops, for
 * one head: q, k, v, go (T,D) -> dq, dk, dv (T,D). */
static void loop_backward(int64_t T, int64_t D, double scale, const double *q, const double *k,
                          const double *v, const double *go, double *dq, double *dk, double *dv)
{
    double *P = calloc((size_t)(T * T), sizeof(double)), *dS = calloc((size_t)(T * T), sizeof(double));
    for (int64_t i = 0; i < T; i++) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
            double s = 0;
            for (int64_t d = 0; d < D; d++) s += q[i * D + d] * k[j * D + d];
            P[i * T + j] = s * scale;
            m = fmax(m, s * scale);
        }
        for (int64_t j = 0; j <= i; j++) sum += (P[i * T + j] = exp(P[i * T + j] - m));
        for (int64_t j = 0; j <= i; j++) P[i * T + j] /= sum;
        double r = 0;
        for (int64_t j = 0; j <= i; j++) {
            double dp = 0;
            for (int64_t d = 0; d < D; d++) dp += go[i * D + d] * v[j * D + d];
            dS[i * T + j] = dp;
            r += dp * P[i * T + j];
        }
        for (int64_t j = 0; j <= i; j++) dS[i * T + j] = P[i * T + j] * (dS[i * T + j] - r);
    }
    memset(dq, 0, sizeof(double) * (size_t)(T * D));
    memset(dk, 0, sizeof(double) * (size_t)(T * D));
    memset(dv, 0, sizeof(double) * (size_t)(T * D));
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j <= i; j++)
            for (int64_t d = 0; d < D; d++) {
                dv[j * D + d] += P[i * T + j] * go[i * D + d];
                dq[i * D + d] += dS[i * T + j] * k[j * D + d] * scale;
                dk[j * D + d] += dS[i * T + j] * q[i * D + d] * scale;
            }
    free(P);
    free(dS);
}

/* T = 300 spans two of the op's blocks of query rows. */
TEST(test_attention_long_sequence_matches_references)
{
    enum { T = 300, D = 3 };
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(28);
    em_tensor *x[4];
    for (int i = 0; i < 4; i++) x[i] = em_randn(EM_F64, EM_SHAPE(1, 1, T, D), &r);
    for (int i = 0; i < 3; i++) CHECK_OK(em_set_requires_grad(x[i], true));
    em_tensor *o = em_attention_causal(x[0], x[1], x[2], 0.0);
    CHECK(th_max_abs_diff(o, composed_reference(x[0], x[1], x[2], 1.0 / sqrt(3.0))) < 1e-12);
    CHECK_OK(em_backward(o, x[3]));
    static double v[4][T * D], want[3][T * D];
    for (int i = 0; i < 4; i++) em_to_array(x[i], EM_F64, v[i]);
    loop_backward(T, D, 1.0 / sqrt(3.0), v[0], v[1], v[2], v[3], want[0], want[1], want[2]);
    for (int i = 0; i < 3; i++) th_check_values(__FILE__, __LINE__, em_grad(x[i]), want[i], 1e-10);
    em_tensor *o32 =
        em_attention_causal(em_cast(x[0], EM_F32), em_cast(x[1], EM_F32), em_cast(x[2], EM_F32), 0.0);
    CHECK(th_max_abs_diff(o32, o) < 1e-5);
    em_scope_end(s);
}

TEST(test_attention_is_causal)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(23);
    em_tensor *q = em_randn(EM_F32, EM_SHAPE(1, 2, 6, 4), &r),
              *k = em_randn(EM_F32, EM_SHAPE(1, 2, 6, 4), &r);
    em_tensor *v = em_randn(EM_F32, EM_SHAPE(1, 2, 6, 4), &r);
    em_tensor *o1 = em_attention_causal(q, k, v, 0.0);
    /* change the keys and values of tokens 4 and 5 */
    CHECK_OK(em_copy_into(em_narrow(k, 2, 4, 2), em_randn(EM_F32, EM_SHAPE(1, 2, 2, 4), &r)));
    CHECK_OK(em_copy_into(em_narrow(v, 2, 4, 2), em_randn(EM_F32, EM_SHAPE(1, 2, 2, 4), &r)));
    em_tensor *o2 = em_attention_causal(q, k, v, 0.0);
    CHECK(th_max_abs_diff(em_narrow(o1, 2, 0, 4), em_narrow(o2, 2, 0, 4)) == 0);
    CHECK(th_max_abs_diff(em_narrow(o1, 2, 4, 1), em_narrow(o2, 2, 4, 1)) > 1e-3);
    CHECK(th_max_abs_diff(em_narrow(o1, 2, 5, 1), em_narrow(o2, 2, 5, 1)) > 1e-3);
    em_scope_end(s);
}

TEST(test_attention_gradient_matches_finite_difference)
{
    em_rng r = em_rng_new(24);
    em_tensor *in[3];
    for (int i = 0; i < 3; i++) in[i] = em_randn(EM_F64, EM_SHAPE(2, 2, 4, 3), &r);
    GRADCHECK("attention", f_att, NULL, 3, in);
    att_args big = {1.3};
    GRADCHECK("attention scale 1.3", f_att, &big, 3, in);
    F32_MATCHES_F64("attention", f_att, NULL, 3, in, 1e-5);
    for (int i = 0; i < 3; i++) em_free(in[i]);
}

TEST(test_attention_gradient_with_noncontiguous_inputs)
{
    em_rng r = em_rng_new(25);
    em_tensor *base[3], *nc[3];
    for (int i = 0; i < 3; i++) {
        base[i] = em_randn(EM_F64, EM_SHAPE(1, 2, 3, 2), &r);
        nc[i] = th_noncontig(base[i]);
        CHECK(!em_is_contiguous(nc[i]));
    }
    GRADCHECK("attention noncontiguous", f_att, NULL, 3, nc);
    for (int i = 0; i < 3; i++) {
        em_free(base[i]);
        em_free(nc[i]);
    }
}

TEST(test_attention_gradient_only_for_inputs_that_require_it)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(26);
    em_tensor *q = em_randn(EM_F64, EM_SHAPE(1, 1, 3, 2), &r),
              *k = em_randn(EM_F64, EM_SHAPE(1, 1, 3, 2), &r);
    em_tensor *v = em_randn(EM_F64, EM_SHAPE(1, 1, 3, 2), &r);
    CHECK_OK(em_set_requires_grad(v, true));
    em_tensor *o = em_attention_causal(q, k, v, 0.0);
    CHECK_OK(em_backward(em_sum(o, 0, NULL, false), NULL));
    CHECK(em_grad(q) == NULL && em_grad(k) == NULL);
    /* d sum(P v) / dv_j = sum_i P_ij: the column sums of P, which total T */
    CHECK_NOTNULL(em_grad(v));
    CHECK_NEAR(em_item(em_sum(em_grad(v), 0, NULL, false)), 6.0, 1e-12);
    em_scope_end(s);
}

TEST(test_attention_noncontiguous_inputs_give_same_result)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(27);
    /* GPT layout: (B,T,H,D) permuted to (B,H,T,D) */
    em_tensor *x[3], *p[3];
    for (int i = 0; i < 3; i++) {
        x[i] = em_randn(EM_F32, EM_SHAPE(2, 5, 3, 4), &r);
        p[i] = em_permute(x[i], (int[]){0, 2, 1, 3});
    }
    em_tensor *got = em_attention_causal(p[0], p[1], p[2], 0.0);
    em_tensor *want = em_attention_causal(em_contiguous(p[0]), em_contiguous(p[1]), em_contiguous(p[2]), 0.0);
    CHECK_NOTNULL(got);
    CHECK(th_max_abs_diff(got, want) == 0);
    em_scope_end(s);
}

TEST(test_attention_f16_and_bf16_keep_dtype)
{
    em_scope s = em_scope_begin();
    em_tensor *q = em_from_data(EM_F64, EM_SHAPE(1, 2, 3, 2), att_q);
    em_tensor *k = em_from_data(EM_F64, EM_SHAPE(1, 2, 3, 2), att_k);
    em_tensor *v = em_from_data(EM_F64, EM_SHAPE(1, 2, 3, 2), att_v);
    em_dtype dts[2] = {EM_F16, EM_BF16};
    double tol[2] = {5e-3, 3e-2};
    for (int i = 0; i < 2; i++) {
        em_tensor *o = em_attention_causal(em_cast(q, dts[i]), em_cast(k, dts[i]), em_cast(v, dts[i]), 0.0);
        CHECK_NOTNULL(o);
        CHECK(em_dtype_of(o) == dts[i]);
        th_check_values(__FILE__, __LINE__, o, att_out, tol[i]);
    }
    em_scope_end(s);
}

TEST(test_attention_rejects_bad_shapes)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(1, 2, 3, 4)), *b = em_zeros(EM_F32, EM_SHAPE(1, 2, 5, 4));
    em_tensor *c = em_zeros(EM_F32, EM_SHAPE(2, 3, 4));
    CHECK_ERR(em_attention_causal(a, b, a, 0.0), EM_ERR_SHAPE,
              "attention: q, k, v must have the same shape: q is (1,2,3,4), k is (1,2,5,4), v is (1,2,3,4)");
    CHECK_ERR(em_attention_causal(c, c, c, 0.0), EM_ERR_SHAPE,
              "attention: q, k, v must be 4-D (B,H,T,D): q is (2,3,4)");
    em_scope_end(s);
}

TEST(test_attention_rejects_bad_dtypes_and_scale)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(1, 1, 2, 2)), *b = em_zeros(EM_F64, EM_SHAPE(1, 1, 2, 2));
    em_tensor *i = em_zeros(EM_I32, EM_SHAPE(1, 1, 2, 2));
    CHECK_ERR(em_attention_causal(a, b, a, 0.0), EM_ERR_DTYPE,
              "attention: dtypes differ: f32(1,1,2,2) and f64");
    CHECK_ERR(em_attention_causal(i, i, i, 0.0), EM_ERR_DTYPE, "attention: needs a float tensor, got i32");
    CHECK_ERR(em_attention_causal(a, a, a, NAN), EM_ERR_ARG, "attention: scale must be finite");
    em_scope_end(s);
}
