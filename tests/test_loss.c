/* test_loss.c — cross_entropy: value against a numpy reference with ignored
 * targets, all-ignored NaN, huge logits, fused gradient, errors checked before
 * any work. */
#include "fixtures/reduce_ref.h"
#include "harness.h"

enum { IGNORE = -100 };

static em_tensor *logits(em_dtype dt) { return th_tensor(dt, EM_SHAPE(2, 3, 5), REF_CE_LOGITS); }
static em_tensor *targets(void) { return th_tensor(EM_I32, EM_SHAPE(2, 3), REF_CE_TARGETS); }

TEST(test_cross_entropy_matches_reference_with_ignored_targets)
{
    em_scope s = em_scope_begin();
    em_tensor *l = em_cross_entropy(logits(EM_F64), targets(), IGNORE);
    CHECK(em_ndim(l) == 0 && em_dtype_of(l) == EM_F64);
    CHECK_NEAR(em_item(l), REF_CE_LOSS[0], 1e-13);
    CHECK_NEAR(em_item(em_cross_entropy(logits(EM_F32), targets(), IGNORE)), REF_CE_LOSS[0], 1e-5);
    CHECK_NEAR(em_item(em_cross_entropy(logits(EM_BF16), targets(), IGNORE)), REF_CE_LOSS[0], 0.05);
    /* non-contiguous logits and targets */
    em_tensor *nl = th_noncontig(logits(EM_F64)), *nt = th_noncontig(targets());
    CHECK(!em_is_contiguous(nl) && !em_is_contiguous(nt));
    CHECK_NEAR(em_item(em_cross_entropy(nl, nt, IGNORE)), REF_CE_LOSS[0], 1e-13);
    em_scope_end(s);
}

TEST(test_cross_entropy_hand_computed_values)
{
    em_scope s = em_scope_begin();
    /* one row: -log softmax([0, ln 3])[1] = -log(3/4) */
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(1, 2), (double[]){0, log(3.0)});
    em_tensor *t = th_tensor(EM_I32, EM_SHAPE(1), (double[]){1});
    CHECK_NEAR(em_item(em_cross_entropy(x, t, IGNORE)), -log(0.75), 1e-15);
    /* uniform logits over C classes: log C */
    em_tensor *u = em_zeros(EM_F32, EM_SHAPE(4, 7));
    em_tensor *tu = th_tensor(EM_I32, EM_SHAPE(4), (double[]){0, 6, 3, 3});
    CHECK_NEAR(em_item(em_cross_entropy(u, tu, IGNORE)), log(7.0), 1e-6);
    em_scope_end(s);
}

TEST(test_cross_entropy_of_all_ignored_targets_is_nan)
{
    em_scope s = em_scope_begin();
    em_tensor *t = th_tensor(EM_I32, EM_SHAPE(2), (double[]){IGNORE, IGNORE});
    CHECK(isnan(em_item(em_cross_entropy(em_zeros(EM_F32, EM_SHAPE(2, 3)), t, IGNORE))));
    em_scope_end(s);
}

TEST(test_cross_entropy_of_huge_logits_stays_finite)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){1000, 0, 1000, 0});
    em_tensor *t = th_tensor(EM_I32, EM_SHAPE(2), (double[]){0, 1});
    CHECK_NEAR(em_item(em_cross_entropy(x, t, IGNORE)), 500, 1e-3);
    em_scope_end(s);
}

typedef struct ce_case {
    em_tensor *targets;
} ce_case;

static em_tensor *f_ce(em_tensor **x, void *ctx)
{
    ce_case *c = ctx;
    return em_cross_entropy(x[0], c->targets, IGNORE);
}

TEST(test_cross_entropy_gradient_matches_finite_difference)
{
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(2, 3, 5), REF_CE_LOGITS), *nc = th_noncontig(x);
    int32_t tv[6];
    for (int i = 0; i < 6; i++) tv[i] = (int32_t)REF_CE_TARGETS[i];
    ce_case c = {em_from_data(EM_I32, EM_SHAPE(2, 3), tv)};
    GRADCHECK("cross_entropy", f_ce, &c, 1, &x);
    GRADCHECK("cross_entropy", f_ce, &c, 1, &nc);
    F32_MATCHES_F64("cross_entropy", f_ce, &c, 1, &x, 1e-6);
    /* 2-D logits, targets with a different ignored row */
    em_tensor *x2 = em_randn(EM_F64, EM_SHAPE(4, 3), NULL);
    ce_case c2 = {em_from_data(EM_I32, EM_SHAPE(4), (int32_t[]){2, IGNORE, 0, 1})};
    GRADCHECK("cross_entropy 2-D", f_ce, &c2, 1, &x2);
    em_free(x);
    em_free(nc);
    em_free(x2);
    em_free(c.targets);
    em_free(c2.targets);
}

/* f32 backward against f64, with logits around 1e4 (a float log-sum-exp
 * would lose the low bits there) */
TEST(test_cross_entropy_f32_gradient_matches_f64)
{
    em_rng r = em_rng_new(13);
    em_scope s = em_scope_begin();
    /* logits exact in f32, so only the kernels differ */
    em_tensor *x = em_keep(em_cast(
        em_cast(em_add_scalar(em_mul_scalar(em_randn(EM_F64, EM_SHAPE(16, 300), &r), 4.0), 1e4), EM_F32),
        EM_F64));
    em_scope_end(s);
    int32_t tv[16];
    for (int i = 0; i < 16; i++) tv[i] = i % 5 == 4 ? IGNORE : i * 17;
    ce_case c = {em_from_data(EM_I32, EM_SHAPE(16), tv)};
    GRAD_F32_MATCHES_F64(f_ce, &c, 1, &x, 5e-7);
    em_free(x);
    em_free(c.targets);
}

/* d/dx = (softmax - onehot) / count, zero for ignored rows. */
TEST(test_cross_entropy_gradient_is_softmax_minus_onehot_over_count)
{
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(3, 4));
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    em_tensor *t = th_tensor(EM_I32, EM_SHAPE(3), (double[]){1, IGNORE, 3});
    CHECK_OK(em_backward(em_cross_entropy(x, t, IGNORE), NULL));
    double q = 0.25 / 2, p = (0.25 - 1) / 2;
    CHECK_VALUES(em_grad(x), 1e-7, q, p, q, q, 0, 0, 0, 0, q, q, q, p);
    em_scope_end(s);
    em_free(x);
}

TEST(test_cross_entropy_rejects_out_of_range_target)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2, 3, 5));
    em_tensor *t = th_tensor(EM_I32, EM_SHAPE(2, 3), (double[]){0, 1, 2, 5, 0, 0});
    CHECK_ERR(em_cross_entropy(x, t, IGNORE), EM_ERR_INDEX,
              "cross_entropy: target 5 at position (1,0) (flat 3) is out of range for C = 5 classes");
    em_tensor *neg = th_tensor(EM_I32, EM_SHAPE(2, 3), (double[]){0, 1, 2, 3, -1, 0});
    CHECK_ERR(em_cross_entropy(x, neg, IGNORE), EM_ERR_INDEX, "cross_entropy: target -1 at position (1,1)");
    /* -1 is fine when it is the ignore_index */
    CHECK(!isnan(em_item(em_cross_entropy(x, neg, -1))));
    em_scope_end(s);
}

/* The range check runs before anything is allocated or recorded. */
TEST(test_cross_entropy_bad_target_leaves_no_trace)
{
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2, 5));
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    em_tensor *t = th_tensor(EM_I32, EM_SHAPE(2), (double[]){0, 9});
    int64_t tape = em_tape_length();
    CHECK_ERR(em_cross_entropy(x, t, IGNORE), EM_ERR_INDEX, "target 9");
    CHECK(em_tape_length() == tape);
    em_scope_end(s);
    em_free(x);
}

TEST(test_cross_entropy_rejects_bad_dtypes_and_shapes)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_zeros(EM_F32, EM_SHAPE(2, 3, 5));
    CHECK_ERR(em_cross_entropy(x, em_zeros(EM_F32, EM_SHAPE(2, 3)), IGNORE), EM_ERR_DTYPE,
              "cross_entropy: targets must be i32, got f32(2,3)");
    CHECK_ERR(
        em_cross_entropy(x, em_zeros(EM_I32, EM_SHAPE(3)), IGNORE), EM_ERR_SHAPE,
        "cross_entropy: targets (3,) must have the shape of logits (2,3,5) without the last dim, (2,3)");
    CHECK_ERR(em_cross_entropy(x, em_zeros(EM_I32, EM_SHAPE(2, 3, 5)), IGNORE), EM_ERR_SHAPE,
              "cross_entropy: targets (2,3,5)");
    CHECK_ERR(em_cross_entropy(em_zeros(EM_I32, EM_SHAPE(2, 5)), em_zeros(EM_I32, EM_SHAPE(2)), IGNORE),
              EM_ERR_DTYPE, "cross_entropy: needs a float tensor, got i32(2,5)");
    CHECK_ERR(em_cross_entropy(em_scalar(EM_F32, 0), em_scalar(EM_I32, 0), IGNORE), EM_ERR_SHAPE,
              "cross_entropy: logits must have a class dim");
    em_scope_end(s);
}
