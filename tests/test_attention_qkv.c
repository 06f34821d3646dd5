/* test_attention_qkv.c — em_attention_causal_qkv, attention read straight
 * from a fused QKV projection: the bits of the composition it replaces
 * (q, k, v narrowed out of qkv, reshaped, transposed; em_attention_causal;
 * transposed back and reshaped), forward and backward, on the fused and
 * the portable f32 paths, in f64, in bf16/f16 and under autocast; the
 * gradient reaching qkv's producer when qkv has other uses; the attention
 * layer built on it; finite differences; errors. */
#include <limits.h>
#include <string.h>

#include "harness.h"
#include "tensor/kernel_impl.h"

/* The composition: qkv (B,T,3C) -> y (B,T,C) with n_head heads */
static em_tensor *composed(em_tensor *qkv, int64_t n_head, double scale)
{
    const int64_t *sh = em_shape(qkv);
    int64_t B = sh[0], T = sh[1], C = sh[2] / 3;
    em_tensor *p[3];
    for (int i = 0; i < 3; i++)
        p[i] =
            em_transpose(em_reshape(em_narrow(qkv, 2, i * C, C), EM_SHAPE(B, T, n_head, C / n_head)), 1, 2);
    em_tensor *y = em_attention_causal(p[0], p[1], p[2], scale);
    return em_reshape(em_transpose(y, 1, 2), EM_SHAPE(B, T, C));
}

static em_tensor *attend(bool op, em_tensor *qkv, int64_t n_head, double scale)
{
    return op ? em_attention_causal_qkv(qkv, n_head, scale) : composed(qkv, n_head, scale);
}

/* a and b hold the same bits: shape, dtype and every byte */
static bool same_bits(em_tensor *a, em_tensor *b)
{
    if (!a || !b || em_dtype_of(a) != em_dtype_of(b) || em_ndim(a) != em_ndim(b) ||
        memcmp(em_shape(a), em_shape(b), sizeof(int64_t) * (size_t)em_ndim(a)))
        return false;
    em_tensor *x = em_contiguous(em_detach(a)), *y = em_contiguous(em_detach(b));
    return !memcmp(em_data(x), em_data(y), (size_t)em_numel(x) * em_dtype_size(em_dtype_of(x)));
}

/* One case: x (B,T,E) through a Linear (w (3C,E), b (3C)) to qkv, then
 * attention with H heads, and the gradients of sum(y * g). */
typedef struct qkv_case {
    int64_t B, T, C, H;
    em_dtype dt;  /* the leaves' dtype */
    em_dtype amp; /* autocast dtype (EM_F32: off) */
    uint64_t seed;
} qkv_case;

typedef struct qkv_run {
    em_tensor *y, *dx, *dw, *db;
} qkv_run;

static qkv_run run_case(const qkv_case *k, bool op)
{
    enum { E = 24 };
    em_rng r = em_rng_new(k->seed);
    em_tensor *x = em_cast(em_randn(EM_F32, EM_SHAPE(k->B, k->T, E), &r), k->dt);
    em_tensor *w = em_cast(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(3 * k->C, E), &r), 0.3), k->dt);
    em_tensor *b = em_cast(em_randn(EM_F32, EM_SHAPE(3 * k->C), &r), k->dt);
    em_tensor *g = em_randn(EM_F32, EM_SHAPE(k->B, k->T, k->C), &r);
    em_tensor *leaf[3] = {x, w, b};
    for (int i = 0; i < 3; i++) CHECK_OK(em_set_requires_grad(leaf[i], true));
    em_dtype prev = em_autocast_set(k->amp);
    em_tensor *y = attend(op, em_linear(x, w, b), k->H, 0.0);
    em_autocast_set(prev);
    CHECK_NOTNULL(y);
    CHECK_OK(em_backward(y, em_cast(g, em_dtype_of(y))));
    return (qkv_run){y, em_grad(x), em_grad(w), em_grad(b)};
}

/* the op's run a and the composition's c: the same bits, output and gradients */
static void check_same_run(qkv_run a, qkv_run c)
{
    CHECK(same_bits(a.y, c.y));
    CHECK(same_bits(a.dx, c.dx));
    CHECK(same_bits(a.dw, c.dw));
    CHECK(same_bits(a.db, c.db));
}

static void same_as_composition(qkv_case k)
{
    th_case("B=%lld T=%lld C=%lld H=%lld %s autocast %s", (long long)k.B, (long long)k.T, (long long)k.C,
            (long long)k.H, em_dtype_name(k.dt), em_dtype_name(k.amp));
    em_scope s = em_scope_begin();
    check_same_run(run_case(&k, true), run_case(&k, false));
    em_scope_end(s);
    th_case(NULL);
}

static void f32_shapes_same_as_composition(void)
{
    same_as_composition((qkv_case){2, 64, 128, 4, EM_F32, EM_F32, 1}); /* the tiny GPT's heads */
    same_as_composition((qkv_case){2, 17, 36, 3, EM_F32, EM_F32, 2});  /* D = 12: rows padded */
    same_as_composition((qkv_case){1, 40, 24, 1, EM_F32, EM_F32, 3});  /* one head, rows split */
    same_as_composition((qkv_case){3, 1, 16, 2, EM_F32, EM_F32, 4});   /* T = 1 */
}

TEST(test_attention_qkv_equals_the_composition_bit_for_bit_in_f32) { f32_shapes_same_as_composition(); }

TEST(test_attention_qkv_equals_the_composition_bit_for_bit_on_the_portable_path)
{
    attention_fused_disable(true);
    f32_shapes_same_as_composition();
    same_as_composition((qkv_case){1, 300, 12, 2, EM_F32, EM_F32, 5}); /* two blocks of query rows */
    attention_fused_disable(false);
}

TEST(test_attention_qkv_equals_the_composition_bit_for_bit_in_f64)
{
    same_as_composition((qkv_case){2, 9, 30, 3, EM_F64, EM_F32, 6});
    same_as_composition((qkv_case){1, 260, 8, 2, EM_F64, EM_F32, 7});
}

TEST(test_attention_qkv_equals_the_composition_under_autocast)
{
    same_as_composition((qkv_case){2, 33, 64, 4, EM_F32, EM_BF16, 8});
    same_as_composition((qkv_case){2, 33, 60, 4, EM_F32, EM_F16, 9});
}

TEST(test_attention_qkv_on_bf16_and_f16_inputs_equals_the_composition)
{
    same_as_composition((qkv_case){2, 21, 48, 4, EM_BF16, EM_F32, 10});
    same_as_composition((qkv_case){2, 21, 48, 4, EM_F16, EM_F32, 11});
}

TEST(test_attention_qkv_output_is_f32_under_autocast_and_contiguous)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(12);
    em_tensor *qkv = em_cast(em_randn(EM_F32, EM_SHAPE(2, 5, 24), &r), EM_BF16);
    em_dtype prev = em_autocast_set(EM_BF16);
    em_tensor *y = em_attention_causal_qkv(qkv, 2, 0.0);
    em_autocast_set(prev);
    CHECK_NOTNULL(y);
    CHECK(em_dtype_of(y) == EM_F32 && em_is_contiguous(y));
    CHECK(em_ndim(y) == 3 && em_size(y, 0) == 2 && em_size(y, 1) == 5 && em_size(y, 2) == 8);
    em_scope_end(s);
}

/* qkv = x W^T + b also feeds sum(qkv * m), recorded before or after the
 * attention: its gradient is then made by one use and added to by the
 * other (the op writes into a fresh accumulator, or adds to one that holds
 * the other use's contribution) */
static qkv_run used_twice(bool op, bool other_first)
{
    em_rng r = em_rng_new(13);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(2, 12, 16), &r), *w = em_randn(EM_F32, EM_SHAPE(48, 16), &r);
    em_tensor *b = em_randn(EM_F32, EM_SHAPE(48), &r), *m = em_randn(EM_F32, EM_SHAPE(2, 12, 48), &r);
    em_tensor *g = em_randn(EM_F32, EM_SHAPE(2, 12, 16), &r);
    em_tensor *leaf[3] = {x, w, b};
    for (int i = 0; i < 3; i++) CHECK_OK(em_set_requires_grad(leaf[i], true));
    em_tensor *qkv = em_linear(x, w, b), *other = NULL, *y;
    if (other_first) other = em_sum(em_mul(qkv, m), 0, NULL, false);
    y = em_sum(em_mul(attend(op, qkv, 2, 0.0), g), 0, NULL, false);
    if (!other_first) other = em_sum(em_mul(qkv, m), 0, NULL, false);
    CHECK_OK(em_backward(em_add(y, other), NULL));
    return (qkv_run){y, em_grad(x), em_grad(w), em_grad(b)};
}

TEST(test_attention_qkv_gradient_adds_to_other_uses_of_qkv)
{
    for (int first = 0; first < 2; first++) {
        th_case("the other use recorded %s", first ? "first" : "last");
        em_scope s = em_scope_begin();
        check_same_run(used_twice(true, first), used_twice(false, first));
        em_scope_end(s);
    }
    th_case(NULL);
}

/* A leaf qkv's gradient over two backward passes: written, then added to */
static em_tensor *leaf_grad_twice(bool op)
{
    em_rng r = em_rng_new(14);
    em_tensor *qkv = em_randn(EM_F32, EM_SHAPE(2, 10, 48), &r),
              *g = em_randn(EM_F32, EM_SHAPE(2, 10, 16), &r);
    CHECK_OK(em_set_requires_grad(qkv, true));
    for (int pass = 0; pass < 2; pass++) CHECK_OK(em_backward(attend(op, qkv, 4, 0.0), g));
    return em_grad(qkv);
}

TEST(test_attention_qkv_gradient_accumulates_in_a_leaf)
{
    em_scope s = em_scope_begin();
    em_tensor *a = leaf_grad_twice(true), *c = leaf_grad_twice(false);
    CHECK(same_bits(a, c));
    em_scope_end(s);
}

/* Two layers made alike: one forward as nn does (the op), the other by
 * the composition from the same c_attn and c_proj; same output, same
 * gradient for every parameter and for x */
TEST(test_attention_layer_gives_the_bits_of_the_composed_attention)
{
    enum { B = 2, T = 20, C = 48, H = 4 };
    em_rng r1 = em_rng_new(15), r2 = em_rng_new(15), r = em_rng_new(16);
    em_nn_attention *la = em_nn_attention_new(NULL, NULL, C, H, true, 0.0, &r1);
    em_nn_attention *lc = em_nn_attention_new(NULL, NULL, C, H, true, 0.0, &r2);
    CHECK(la && lc);
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(B, T, C), &r), *g = em_randn(EM_F32, EM_SHAPE(B, T, C), &r);
    em_tensor *xa = em_detach(x), *xc = em_detach(x);
    CHECK_OK(em_set_requires_grad(xa, true));
    CHECK_OK(em_set_requires_grad(xc, true));
    em_tensor *ya = em_nn_attention_forward(la, xa);
    em_tensor *yc = em_nn_linear_forward(lc->c_proj, composed(em_nn_linear_forward(lc->c_attn, xc), H, 0.0));
    CHECK(same_bits(ya, yc));
    CHECK_OK(em_backward(ya, g));
    CHECK_OK(em_backward(yc, g));
    CHECK(same_bits(em_grad(xa), em_grad(xc)));
    em_named pa[8], pc[8];
    int n = em_module_params(la->m, pa, 8);
    CHECK(n == 4 && em_module_params(lc->m, pc, 8) == n);
    for (int i = 0; i < n; i++) {
        th_case("%s", pa[i].name);
        CHECK(same_bits(em_grad(pa[i].t), em_grad(pc[i].t)));
    }
    th_case(NULL);
    em_scope_end(s);
    em_module_free(la->m);
    em_module_free(lc->m);
}

typedef struct heads_arg {
    int64_t n_head;
    double scale;
} heads_arg;

static em_tensor *f_qkv(em_tensor **x, void *ctx)
{
    heads_arg *a = ctx;
    return em_attention_causal_qkv(x[0], a->n_head, a->scale);
}

TEST(test_attention_qkv_gradient_matches_finite_difference)
{
    em_rng r = em_rng_new(17);
    em_tensor *qkv = em_randn(EM_F64, EM_SHAPE(2, 4, 18), &r);
    heads_arg two = {2, 0.0}, three = {3, 1.3};
    GRADCHECK("attention_qkv 2 heads", f_qkv, &two, 1, &qkv);
    GRADCHECK("attention_qkv 3 heads scale 1.3", f_qkv, &three, 1, &qkv);
    em_free(qkv);
}

TEST(test_attention_qkv_reads_a_noncontiguous_qkv)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(18);
    em_tensor *base = em_randn(EM_F32, EM_SHAPE(2, 7, 24), &r), *nc = th_noncontig(base);
    CHECK(!em_is_contiguous(nc));
    CHECK(same_bits(em_attention_causal_qkv(nc, 2, 0.0), em_attention_causal_qkv(base, 2, 0.0)));
    em_scope_end(s);
}

/* ---- errors ---------------------------------------------------------------------------- */

TEST(test_attention_qkv_rejects_a_qkv_that_is_not_b_t_3c)
{
    em_scope s = em_scope_begin();
    CHECK_ERR(em_attention_causal_qkv(em_zeros(EM_F32, EM_SHAPE(2, 3, 4, 6)), 2, 0.0), EM_ERR_SHAPE,
              "attention_qkv: qkv must be (B,T,3C), its last dim a multiple of 3: qkv is (2,3,4,6)");
    CHECK_ERR(em_attention_causal_qkv(em_zeros(EM_F32, EM_SHAPE(2, 3, 10)), 2, 0.0), EM_ERR_SHAPE,
              "qkv is (2,3,10)");
    em_scope_end(s);
}

TEST(test_attention_qkv_rejects_a_head_count_that_does_not_divide_c)
{
    em_scope s = em_scope_begin();
    em_tensor *qkv = em_zeros(EM_F32, EM_SHAPE(1, 2, 12));
    CHECK_ERR(em_attention_causal_qkv(qkv, 3, 0.0), EM_ERR_SHAPE,
              "attention_qkv: C = 4 (qkv is (1,2,12)) is not a multiple of n_head = 3");
    CHECK_ERR(em_attention_causal_qkv(qkv, 0, 0.0), EM_ERR_ARG, "attention_qkv: n_head = 0 must be >= 1");
    CHECK_ERR(em_attention_causal_qkv(qkv, -2, 0.0), EM_ERR_ARG, "n_head = -2");
    em_scope_end(s);
}

TEST(test_attention_qkv_rejects_a_scale_that_is_not_finite)
{
    em_scope s = em_scope_begin();
    em_tensor *qkv = em_zeros(EM_F32, EM_SHAPE(1, 2, 12));
    CHECK_ERR(em_attention_causal_qkv(qkv, 2, NAN), EM_ERR_ARG,
              "attention_qkv: scale must be finite, got nan");
    CHECK_ERR(em_attention_causal_qkv(qkv, 2, -INFINITY), EM_ERR_ARG, "scale must be finite, got -inf");
    em_scope_end(s);
}

TEST(test_attention_qkv_rejects_integer_and_null_inputs)
{
    em_scope s = em_scope_begin();
    CHECK_ERR(em_attention_causal_qkv(em_zeros(EM_I32, EM_SHAPE(1, 2, 12)), 2, 0.0), EM_ERR_DTYPE,
              "attention_qkv: needs a float tensor, got i32");
    CHECK_ERR(em_attention_causal_qkv(NULL, 2, 0.0), EM_ERR_ARG, "attention_qkv");
    em_scope_end(s);
}

TEST(test_attention_qkv_needs_a_scope_to_record_a_gradient)
{
    em_tensor *qkv = em_zeros(EM_F32, EM_SHAPE(1, 2, 12));
    CHECK_OK(em_set_requires_grad(qkv, true));
    CHECK_ERR(em_attention_causal_qkv(qkv, 2, 0.0), EM_ERR_SCOPE,
              "attention_qkv: recording a gradient needs an open step scope");
    bool prev = em_set_grad_enabled(false);
    em_tensor *y = em_attention_causal_qkv(qkv, 2, 0.0); /* no gradient: no scope needed */
    em_set_grad_enabled(prev);
    CHECK_NOTNULL(y);
    em_free(y);
    em_free(qkv);
}

/* stride-0 views: lengths past int range without the memory */
TEST(test_attention_qkv_rejects_t_or_d_beyond_int_range)
{
    em_scope s = em_scope_begin();
    int64_t big = (int64_t)INT_MAX + 1;
    em_tensor *one = em_zeros(EM_F32, EM_SHAPE(1, 1, 1));
    CHECK_ERR(em_attention_causal_qkv(em_expand(one, EM_SHAPE(1, big, 3)), 1, 0.0), EM_ERR_UNSUPPORTED,
              "attention_qkv: T or D beyond BLAS's int range: qkv is (1,2147483648,3)");
    CHECK_ERR(em_attention_causal_qkv(em_expand(one, EM_SHAPE(1, 2, 3 * big)), 1, 0.0), EM_ERR_UNSUPPORTED,
              "T or D beyond BLAS's int range");
    em_scope_end(s);
}
