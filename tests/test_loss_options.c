/* test_loss_options.c — em_cross_entropy_loss, PyTorch's conventions:
 * values and gradients against torch.nn.functional.cross_entropy
 * (tests/fixtures/gen_loss.py) for class weights, label smoothing with
 * ignored targets and every reduction, the class dim 1 of (N,C,d1), an
 * ignore_index that is a class, 1-D logits; finite-difference gradients per
 * option; the option errors. */
#include <math.h>

#include "fixtures/loss_ref.h"
#include "harness.h"

static em_tensor *lx(em_dtype dt) { return th_tensor(dt, EM_SHAPE(3, 5, 2), REF_LX); }
static em_tensor *lt(void) { return th_tensor(EM_I32, EM_SHAPE(3, 2), REF_LT); }

TEST(test_cross_entropy_defaults_are_pytorchs)
{
    em_cross_entropy_config c = em_cross_entropy_defaults();
    CHECK(c.ignore_index == -100 && c.ignore_index == EM_IGNORE_INDEX);
    CHECK(c.label_smoothing == 0 && c.reduction == EM_REDUCTION_MEAN && c.weight == NULL && c.class_dim == 1);
}

/* One fixture case: the loss of (weighted, reduction, smoothing) on REF_LX
 * in dtype dt against want (tol), and in f64 its gradient against grad
 * (for none, of sum(loss * REF_LG)). */
static void check_case(bool weighted, em_reduction red, double smoothing, const double *want,
                       const double *grad)
{
    em_dtype dts[2] = {EM_F64, EM_F32};
    for (int k = 0; k < 2; k++) {
        em_tensor *x = lx(dts[k]);
        CHECK_OK(em_set_requires_grad(x, true));
        em_scope s = em_scope_begin();
        em_cross_entropy_config c = em_cross_entropy_defaults();
        c.reduction = red;
        c.label_smoothing = smoothing;
        if (weighted) c.weight = th_tensor(dts[k], EM_SHAPE(5), REF_LW);
        em_tensor *l = em_cross_entropy_loss(x, lt(), &c);
        CHECK_NOTNULL(l);
        double tol = k ? 2e-6 : 1e-12;
        if (red == EM_REDUCTION_NONE) {
            CHECK(em_ndim(l) == 2 && em_size(l, 0) == 3 && em_size(l, 1) == 2);
            th_check_values(__FILE__, __LINE__, l, want, tol);
            CHECK_OK(em_backward(l, th_tensor(dts[k], EM_SHAPE(3, 2), REF_LG)));
        } else {
            CHECK(em_ndim(l) == 0);
            CHECK_NEAR(em_item(l), want[0], tol);
            CHECK_OK(em_backward(l, NULL));
        }
        th_check_values(__FILE__, __LINE__, em_grad(x), grad, tol);
        em_scope_end(s);
        em_free(x);
    }
}

TEST(test_cross_entropy_class_dim_1_matches_torch)
{
    check_case(false, EM_REDUCTION_MEAN, 0, REF_CE_UMEAN_S0, REF_CE_UMEAN_S0_GRAD);
}

TEST(test_cross_entropy_sum_and_none_reductions_match_torch)
{
    check_case(false, EM_REDUCTION_SUM, 0, REF_CE_USUM_S0, REF_CE_USUM_S0_GRAD);
    check_case(false, EM_REDUCTION_NONE, 0, REF_CE_UNONE_S0, REF_CE_UNONE_S0_GRAD);
}

/* the weighted mean divides by the weights of the targets kept, not their count */
TEST(test_cross_entropy_class_weights_match_torch_with_every_reduction)
{
    check_case(true, EM_REDUCTION_MEAN, 0, REF_CE_WMEAN_S0, REF_CE_WMEAN_S0_GRAD);
    check_case(true, EM_REDUCTION_SUM, 0, REF_CE_WSUM_S0, REF_CE_WSUM_S0_GRAD);
    check_case(true, EM_REDUCTION_NONE, 0, REF_CE_WNONE_S0, REF_CE_WNONE_S0_GRAD);
}

TEST(test_cross_entropy_label_smoothing_with_ignored_targets_matches_torch)
{
    check_case(false, EM_REDUCTION_MEAN, 0.1, REF_CE_UMEAN_S1, REF_CE_UMEAN_S1_GRAD);
    check_case(false, EM_REDUCTION_SUM, 0.1, REF_CE_USUM_S1, REF_CE_USUM_S1_GRAD);
    check_case(false, EM_REDUCTION_NONE, 0.1, REF_CE_UNONE_S1, REF_CE_UNONE_S1_GRAD);
}

TEST(test_cross_entropy_label_smoothing_with_class_weights_matches_torch)
{
    check_case(true, EM_REDUCTION_MEAN, 0.1, REF_CE_WMEAN_S1, REF_CE_WMEAN_S1_GRAD);
    check_case(true, EM_REDUCTION_SUM, 0.1, REF_CE_WSUM_S1, REF_CE_WSUM_S1_GRAD);
    check_case(true, EM_REDUCTION_NONE, 0.1, REF_CE_WNONE_S1, REF_CE_WNONE_S1_GRAD);
}

TEST(test_cross_entropy_ignore_index_may_name_a_class)
{
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(4, 3), REF_L2X);
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    em_cross_entropy_config c = em_cross_entropy_defaults();
    c.ignore_index = 1;
    c.label_smoothing = 0.2;
    em_tensor *l = em_cross_entropy_loss(x, th_tensor(EM_I32, EM_SHAPE(4), REF_L2T), &c);
    CHECK_NEAR(em_item(l), REF_CE2[0], 1e-12);
    CHECK_OK(em_backward(l, NULL));
    th_check_values(__FILE__, __LINE__, em_grad(x), REF_CE2_GRAD, 1e-12);
    em_scope_end(s);
    em_free(x);
}

TEST(test_cross_entropy_of_1d_logits_takes_a_0_dim_target)
{
    em_scope s = em_scope_begin();
    em_cross_entropy_config c = em_cross_entropy_defaults();
    c.weight = th_tensor(EM_F64, EM_SHAPE(5), REF_LW);
    c.label_smoothing = 0.3;
    em_tensor *l = em_cross_entropy_loss(th_tensor(EM_F64, EM_SHAPE(5), REF_L1X), em_scalar(EM_I32, 3), &c);
    CHECK_NEAR(em_item(l), REF_CE1[0], 1e-12);
    em_scope_end(s);
}

/* class_dim -1 is em_cross_entropy's layout, bit for bit */
TEST(test_cross_entropy_loss_on_the_last_dim_equals_em_cross_entropy)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(4, 6, 9), NULL);
    em_tensor *t = th_tensor(EM_I32, EM_SHAPE(4, 6), (double[]){1, 2, 3, 4, 5, 6, 7, 8, 0, -100, 1, 2,
                                                                3, 4, 5, 6, 7, 8, 0, 1, 2, 3,    4, 5});
    em_cross_entropy_config c = em_cross_entropy_defaults();
    c.class_dim = -1;
    CHECK(em_item(em_cross_entropy_loss(x, t, &c)) == em_item(em_cross_entropy(x, t, -100)));
    c.class_dim = 2;
    CHECK(em_item(em_cross_entropy_loss(x, t, &c)) == em_item(em_cross_entropy(x, t, -100)));
    /* and dim 1 is the last dim moved: the same loss on the transposed logits */
    c.class_dim = 1;
    CHECK_NEAR(em_item(em_cross_entropy_loss(em_transpose(x, 1, 2), t, &c)),
               em_item(em_cross_entropy(x, t, -100)), 1e-6);
    em_scope_end(s);
}

/* NULL is the defaults: PyTorch's call with no keyword arguments */
TEST(test_cross_entropy_loss_with_null_config_is_the_defaults)
{
    em_scope s = em_scope_begin();
    CHECK_NEAR(em_item(em_cross_entropy_loss(lx(EM_F64), lt(), NULL)), REF_CE_UMEAN_S0[0], 1e-12);
    em_scope_end(s);
}

typedef struct opt_case {
    em_tensor *targets, *weight;
    em_reduction red;
    double smoothing;
    int class_dim;
} opt_case;

static em_tensor *f_loss(em_tensor **x, void *ctx)
{
    opt_case *o = ctx;
    em_cross_entropy_config c = em_cross_entropy_defaults();
    c.weight = o->weight;
    c.reduction = o->red;
    c.label_smoothing = o->smoothing;
    c.class_dim = o->class_dim;
    return em_cross_entropy_loss(x[0], o->targets, &c);
}

TEST(test_cross_entropy_loss_gradient_matches_finite_difference_for_each_option)
{
    em_tensor *x = lx(EM_F64), *nc = th_noncontig(x);
    em_tensor *t = lt(), *w = th_tensor(EM_F64, EM_SHAPE(5), REF_LW);
    opt_case cases[] = {
        {t, NULL, EM_REDUCTION_MEAN, 0, 1},    {t, w, EM_REDUCTION_MEAN, 0, 1},
        {t, NULL, EM_REDUCTION_MEAN, 0.25, 1}, {t, w, EM_REDUCTION_MEAN, 0.25, 1},
        {t, NULL, EM_REDUCTION_SUM, 0, 1},     {t, w, EM_REDUCTION_SUM, 0.25, 1},
        {t, NULL, EM_REDUCTION_NONE, 0, 1},    {t, w, EM_REDUCTION_NONE, 0.25, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char what[64];
        snprintf(what, sizeof what, "cross_entropy_loss case %zu", k);
        GRADCHECK(what, f_loss, &cases[k], 1, &x);
        GRADCHECK(what, f_loss, &cases[k], 1, &nc);
        F32_MATCHES_F64(what, f_loss, &cases[k], 1, &x, 1e-6);
    }
    em_free(x);
    em_free(nc);
    em_free(t);
    em_free(w);
}

TEST(test_cross_entropy_loss_all_ignored_is_nan_for_the_mean_and_zero_for_the_sum)
{
    em_scope s = em_scope_begin();
    em_tensor *x = lx(EM_F32), *t = em_full(EM_I32, 2, (int64_t[]){3, 2}, -100);
    em_cross_entropy_config c = em_cross_entropy_defaults();
    c.label_smoothing = 0.1;
    CHECK(isnan(em_item(em_cross_entropy_loss(x, t, &c))));
    c.reduction = EM_REDUCTION_SUM;
    CHECK(em_item(em_cross_entropy_loss(x, t, &c)) == 0);
    em_scope_end(s);
}

TEST(test_cross_entropy_loss_rejects_bad_options_naming_them)
{
    em_scope s = em_scope_begin();
    em_tensor *x = lx(EM_F32), *t = lt();
    em_cross_entropy_config c = em_cross_entropy_defaults();
    c.reduction = (em_reduction)7;
    CHECK_ERR(em_cross_entropy_loss(x, t, &c), EM_ERR_ARG,
              "cross_entropy: reduction 7 is not EM_REDUCTION_MEAN");
    c = em_cross_entropy_defaults();
    c.label_smoothing = 1.5;
    CHECK_ERR(em_cross_entropy_loss(x, t, &c), EM_ERR_ARG,
              "cross_entropy: label_smoothing 1.5 must be in [0, 1]");
    c.label_smoothing = NAN;
    CHECK_ERR(em_cross_entropy_loss(x, t, &c), EM_ERR_ARG, "label_smoothing nan");
    c = em_cross_entropy_defaults();
    c.class_dim = 3;
    CHECK_ERR(em_cross_entropy_loss(x, t, &c), EM_ERR_ARG,
              "cross_entropy: class_dim 3 is out of range for logits (3,5,2)");
    c.class_dim = -1; /* classes (2): targets would be (3,5) */
    CHECK_ERR(em_cross_entropy_loss(x, t, &c), EM_ERR_SHAPE,
              "cross_entropy: targets (3,2) must have the shape of logits (3,5,2) without the class dim 2 (C "
              "= 2), (3,5)");
    c = em_cross_entropy_defaults();
    c.weight = em_ones(EM_F32, EM_SHAPE(4));
    CHECK_ERR(em_cross_entropy_loss(x, t, &c), EM_ERR_SHAPE,
              "cross_entropy: weight (4,) must hold one weight per class, (5,)");
    c.weight = em_ones(EM_I32, EM_SHAPE(5));
    CHECK_ERR(em_cross_entropy_loss(x, t, &c), EM_ERR_DTYPE,
              "cross_entropy: weight must be a float tensor, got i32(5,)");
    em_scope_end(s);
    em_tensor *wg = em_ones(EM_F32, EM_SHAPE(5));
    CHECK_OK(em_set_requires_grad(wg, true));
    s = em_scope_begin();
    c.weight = wg;
    CHECK_ERR(em_cross_entropy_loss(lx(EM_F32), lt(), &c), EM_ERR_ARG, "weight requires grad");
    em_scope_end(s);
    em_free(wg);
}

TEST(test_cross_entropy_loss_names_a_target_out_of_range_with_class_dim_1)
{
    em_scope s = em_scope_begin();
    em_tensor *t = th_tensor(EM_I32, EM_SHAPE(3, 2), (double[]){1, 4, -100, 5, 0, -100});
    CHECK_ERR(em_cross_entropy_loss(lx(EM_F32), t, NULL), EM_ERR_INDEX,
              "cross_entropy: target 5 at position (1,1) (flat 3) is out of range for C = 5 classes");
    em_scope_end(s);
}
