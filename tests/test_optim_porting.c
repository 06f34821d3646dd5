/* test_optim_porting.c — the optimizer conventions a script ported from
 * PyTorch relies on, each against torch / transformers
 * (fixtures/optim_porting_ref.h, made by fixtures/gen_optim_porting.py):
 * schedules scale each group's own base lr; transformers' cosine and
 * linear schedules; zero_grad sets gradients to none, so a step skips a
 * parameter no backward reached (and the in-place mode does not); amsgrad
 * and maximize; clipping by the 1-, 3- and inf-norm and
 * error_if_nonfinite. (DDP and ZeRO: test_optim_porting_dist.c.) */
#include <stdlib.h>

#include "optim_porting_rig.h"

/* ---- schedules scale each group's base lr ------------------------------------------------ */

/* group 0 = p0 at 0.1, group 1 = p1 at 0.01 */
static em_optimizer *two_group_opt(prig *r, bool adamw)
{
    em_optimizer *o;
    if (adamw) {
        em_adam_config c = em_adamw_defaults();
        c.lr = 0.1, c.weight_decay = 0.1;
        o = em_adamw_new(1, &r->p[0], &c);
        CHECK_NOTNULL(o);
        CHECK(em_optim_add_group(o, 1, &r->p[1], 0.01, 0.1) == 1);
    } else {
        em_sgd_config c = em_sgd_defaults();
        c.lr = 0.1, c.momentum = 0.9;
        o = em_sgd_new(1, &r->p[0], &c);
        CHECK_NOTNULL(o);
        CHECK(em_optim_add_group(o, 1, &r->p[1], 0.01, 0.0) == 1);
    }
    return o;
}

/* Both groups under s for PT_STEPS steps: each group's lr against lrs, the
 * parameters against want (f64, then f32). */
static void two_groups_follow(const em_lr_schedule *s, bool adamw, const double lrs[][2],
                              const double want64[][10], const double want32[][10], const char *what)
{
    for (int d = 0; d < 2; d++) {
        prig r;
        prig_init(&r, d ? EM_F32 : EM_F64, true);
        em_optimizer *o = two_group_opt(&r, adamw);
        for (int k = 0; k < PT_STEPS; k++) {
            CHECK_OK(em_optim_apply_schedule(o, s, k));
            th_case("%s step %d", what, k);
            CHECK_NEAR(em_optim_get_lr(o, 0), lrs[k][0], 1e-15);
            CHECK_NEAR(em_optim_get_lr(o, 1), lrs[k][1], 1e-16);
            prig_backward(&r, PT_G0[k], PT_G1[k], 1.0);
            CHECK_OK(em_optim_step(o));
            CHECK_OK(em_optim_zero_grad(o));
            prig_check(&r, 2, d ? want32[k] : want64[k], pr_tol(r.dt), what, k);
        }
        th_case(NULL);
        CHECK(em_optim_get_base_lr(o, 0) == 0.1 && em_optim_get_base_lr(o, 1) == 0.01); /* bases stay */
        em_optim_free(o);
        prig_free(&r);
    }
}

TEST(test_step_schedule_scales_each_groups_own_lr_as_torch_steplr)
{
    em_lr_schedule s = {.kind = EM_LR_STEP, .base_lr = 0.1, .step_size = 2, .gamma = 0.5};
    two_groups_follow(&s, false, PT_GROUPS_STEP_LR, PT_GROUPS_STEP_F64, PT_GROUPS_STEP_F32, "StepLR");
}

TEST(test_cosine_hf_schedule_scales_each_groups_own_lr_as_transformers)
{
    em_lr_schedule s = {.kind = EM_LR_COSINE_HF, .base_lr = 0.1, .warmup = 2, .total = PT_STEPS};
    two_groups_follow(&s, true, PT_GROUPS_COSINE_HF_LR, PT_GROUPS_COSINE_HF_F64, PT_GROUPS_COSINE_HF_F32,
                      "cosine_hf");
}

TEST(test_a_group_with_the_schedules_base_lr_gets_em_lr_at_bit_for_bit)
{
    prig r;
    prig_init(&r, EM_F32, false);
    em_optimizer *o = two_group_opt(&r, true);
    em_lr_schedule s = {.kind = EM_LR_COSINE, .base_lr = 0.1, .min_lr = 0.01, .warmup = 2, .total = 9};
    for (int k = 0; k < 12; k++) {
        CHECK_OK(em_optim_apply_schedule(o, &s, k));
        th_case("step %d", k);
        CHECK(em_optim_get_lr(o, 0) == em_lr_at(&s, k));
        CHECK_NEAR(em_optim_get_lr(o, 1), em_lr_at(&s, k) / 10, 1e-17); /* min_lr scaled too */
    }
    em_optim_free(o);
    prig_free(&r);
}

TEST(test_set_lr_overrides_one_group_until_the_next_apply_schedule)
{
    prig r;
    prig_init(&r, EM_F32, false);
    em_optimizer *o = two_group_opt(&r, false);
    em_lr_schedule s = {.kind = EM_LR_STEP, .base_lr = 0.1, .step_size = 1, .gamma = 0.5};
    CHECK_OK(em_optim_apply_schedule(o, &s, 1));
    CHECK_OK(em_optim_set_lr(o, 1, 0.3)); /* an explicit value for group 1 */
    CHECK(em_optim_get_lr(o, 0) == 0.05 && em_optim_get_lr(o, 1) == 0.3);
    CHECK(em_optim_get_base_lr(o, 1) == 0.01);
    CHECK_OK(em_optim_apply_schedule(o, &s, 2)); /* the schedule takes over again */
    CHECK(em_optim_get_lr(o, 1) == 0.01 * 0.25);
    em_optim_free(o);
    prig_free(&r);
}

TEST(test_set_base_lr_changes_what_the_schedule_scales)
{
    prig r;
    prig_init(&r, EM_F32, false);
    em_optimizer *o = two_group_opt(&r, false);
    em_lr_schedule s = {.kind = EM_LR_STEP, .base_lr = 0.1, .step_size = 1, .gamma = 0.5};
    CHECK_OK(em_optim_set_base_lr(o, -1, 0.4));
    CHECK(em_optim_get_lr(o, 1) == 0.01); /* the current lr waits for the schedule */
    CHECK_OK(em_optim_apply_schedule(o, &s, 1));
    CHECK(em_optim_get_lr(o, 0) == 0.2 && em_optim_get_lr(o, 1) == 0.2);
    CHECK_ERR(em_optim_set_base_lr(o, 2, 0.1), EM_ERR_ARG, "em_optim_set_base_lr: group 2 out of range");
    CHECK_ERR(em_optim_set_base_lr(o, 0, -1), EM_ERR_ARG, "lr must be >= 0, got -1");
    CHECK(isnan(em_optim_get_base_lr(o, 5)));
    em_optim_free(o);
    prig_free(&r);
}

/* The schedule em_accel_prepare takes drives the groups the same way. */
TEST(test_accelerator_schedule_scales_each_groups_own_lr_as_torch_steplr)
{
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    prig r;
    prig_init(&r, EM_F64, false);
    em_optimizer *o = two_group_opt(&r, false);
    em_lr_schedule s = {.kind = EM_LR_STEP, .base_lr = 0.1, .step_size = 2, .gamma = 0.5};
    CHECK_OK(em_accel_prepare(a, r.m, o, NULL, &s));
    for (int k = 0; k < PT_STEPS; k++) {
        em_scope sc = em_scope_begin();
        CHECK(em_accel_accumulate(a));
        CHECK_OK(em_accel_backward(a, prig_loss(&r, PT_G0[k], PT_G1[k], 1.0)));
        CHECK_OK(em_accel_step(a));
        CHECK_OK(em_accel_zero_grad(a));
        em_scope_end(sc);
        th_case("step %d", k);
        CHECK_NEAR(em_optim_get_lr(o, 0), PT_GROUPS_STEP_LR[k][0], 1e-15);
        CHECK_NEAR(em_optim_get_lr(o, 1), PT_GROUPS_STEP_LR[k][1], 1e-16);
        prig_check(&r, 2, PT_GROUPS_STEP_F64[k], 1e-12, "StepLR through the Accelerator", k);
    }
    em_accelerator_free(a);
    em_optim_free(o);
    prig_free(&r);
}

static double bad_at_2(int64_t step, void *ctx)
{
    (void)ctx;
    return step == 2 ? -1.0 : 0.5;
}

TEST(test_apply_schedule_that_fails_changes_no_group)
{
    prig r;
    prig_init(&r, EM_F32, false);
    em_optimizer *o = two_group_opt(&r, false);
    em_lr_schedule s = {.kind = EM_LR_CUSTOM, .base_lr = 0.1, .fn = bad_at_2};
    CHECK_OK(em_optim_apply_schedule(o, &s, 1));
    CHECK_ERR(em_optim_apply_schedule(o, &s, 2), EM_ERR_ARG, "returned -1 for step 2");
    CHECK(em_optim_get_lr(o, 0) == 0.05 && em_optim_get_lr(o, 1) == 0.005);
    CHECK_ERR(em_optim_apply_schedule(o, &s, -1), EM_ERR_ARG, "step must be >= 0, got -1");
    CHECK_ERR(em_optim_apply_schedule(NULL, &s, 0), EM_ERR_ARG, "optimizer is NULL");
    em_optim_free(o);
    prig_free(&r);
}

/* ---- transformers' schedules --------------------------------------------------------------- */

static void hf_follows(em_lr_kind kind, const double want[][14])
{
    for (int c = 0; c < PT_HF_CASES; c++) {
        em_lr_schedule s = {.kind = kind,
                            .base_lr = PT_HF_BASE,
                            .warmup = PT_HF_WARMUP_TOTAL[c][0],
                            .total = PT_HF_WARMUP_TOTAL[c][1]};
        for (int k = 0; k < s.total + 4; k++) {
            th_case("warmup %lld total %lld step %d", (long long)s.warmup, (long long)s.total, k);
            CHECK_NEAR(em_lr_at(&s, k), want[c][k], 1e-17);
        }
    }
}

TEST(test_lr_cosine_hf_is_transformers_cosine_schedule_step_for_step)
{
    hf_follows(EM_LR_COSINE_HF, PT_HF_COSINE);
}

TEST(test_lr_linear_hf_is_transformers_linear_schedule_step_for_step)
{
    hf_follows(EM_LR_LINEAR_HF, PT_HF_LINEAR);
}

TEST(test_lr_linear_hf_is_the_old_lr_linear)
{
    CHECK(EM_LR_LINEAR_HF == EM_LR_LINEAR);
    em_lr_schedule s = {.kind = EM_LR_LINEAR, .base_lr = PT_HF_BASE, .warmup = 3, .total = 10};
    for (int k = 0; k < 14; k++) CHECK_NEAR(em_lr_at(&s, k), PT_HF_LINEAR[1][k], 1e-17);
}

TEST(test_lr_cosine_hf_rejects_a_total_not_after_warmup)
{
    em_lr_schedule s = {.kind = EM_LR_COSINE_HF, .base_lr = 0.1, .warmup = 4, .total = 4};
    CHECK_ERR(em_lr_schedule_check(&s), EM_ERR_ARG, "total must be > warmup, got total=4 warmup=4");
    s.warmup = -1;
    CHECK_ERR(em_lr_at(&s, 0), EM_ERR_ARG, "warmup must be >= 0, got -1");
}

/* ---- set_to_none: a parameter without a gradient is skipped --------------------------------- */

static em_optimizer *three_param_opt(prig *r, bool adamw)
{
    if (adamw) {
        em_adam_config c = em_adamw_defaults();
        c.lr = 0.01, c.weight_decay = 0.1;
        return em_adamw_new(3, r->p, &c);
    }
    em_sgd_config c = em_sgd_defaults();
    c.lr = 0.1, c.momentum = 0.9, c.weight_decay = 0.05;
    return em_sgd_new(3, r->p, &c);
}

/* p0 used at every step, p1 at PT_USED1's, p2 never; zero_grad in mode */
static void unused_follows(bool adamw, em_zero_grad_mode mode, const double want64[][13],
                           const double want32[][13], const char *what)
{
    for (int d = 0; d < 2; d++) {
        prig r;
        prig_init(&r, d ? EM_F32 : EM_F64, true);
        em_optimizer *o = three_param_opt(&r, adamw);
        CHECK_NOTNULL(o);
        if (mode != EM_ZERO_GRAD_SET_TO_NONE) CHECK_OK(em_optim_set_zero_grad_mode(o, mode));
        for (int k = 0; k < PT_STEPS; k++) {
            prig_backward(&r, PT_G0[k], PT_USED1[k] ? PT_G1[k] : NULL, 1.0);
            CHECK_OK(em_optim_step(o));
            CHECK_OK(em_optim_zero_grad(o));
            prig_check(&r, 3, d ? want32[k] : want64[k], pr_tol(r.dt), what, k);
        }
        em_optim_free(o);
        prig_free(&r);
    }
}

TEST(test_adamw_skips_a_parameter_without_gradient_after_set_to_none_zero_grad)
{
    unused_follows(true, EM_ZERO_GRAD_SET_TO_NONE, PT_UNUSED_ADAMW_NONE_F64, PT_UNUSED_ADAMW_NONE_F32,
                   "AdamW");
}

TEST(test_sgd_momentum_skips_a_parameter_without_gradient_after_set_to_none_zero_grad)
{
    unused_follows(false, EM_ZERO_GRAD_SET_TO_NONE, PT_UNUSED_SGD_NONE_F64, PT_UNUSED_SGD_NONE_F32, "SGD");
}

TEST(test_in_place_zero_grad_steps_a_parameter_that_once_had_a_gradient)
{
    unused_follows(true, EM_ZERO_GRAD_IN_PLACE, PT_UNUSED_ADAMW_INPLACE_F64, PT_UNUSED_ADAMW_INPLACE_F32,
                   "AdamW in place");
    unused_follows(false, EM_ZERO_GRAD_IN_PLACE, PT_UNUSED_SGD_INPLACE_F64, PT_UNUSED_SGD_INPLACE_F32,
                   "SGD in place");
}

TEST(test_a_skipped_parameter_keeps_its_adam_step_count_and_a_never_used_one_has_no_state)
{
    prig r;
    prig_init(&r, EM_F32, true);
    em_optimizer *o = three_param_opt(&r, true);
    for (int k = 0; k < PT_STEPS; k++) {
        prig_backward(&r, PT_G0[k], PT_USED1[k] ? PT_G1[k] : NULL, 1.0);
        CHECK_OK(em_optim_step(o));
        CHECK_OK(em_optim_zero_grad(o));
    }
    em_named st[16];
    int n = em_optim_state(o, st, 16);
    CHECK(n == 7); /* "step", and step, exp_avg, exp_avg_sq of p0 and p1: none of p2 */
    for (int i = 0; i < n; i++) {
        CHECK(strncmp(st[i].name, "state.2.", 8) != 0);
        if (!strcmp(st[i].name, "state.0.step")) CHECK(em_item(st[i].t) == PT_STEPS);
        if (!strcmp(st[i].name, "state.1.step")) CHECK(em_item(st[i].t) == 3); /* PT_USED1's steps */
    }
    CHECK(em_optim_step_count(o) == PT_STEPS);
    em_optim_free(o);
    prig_free(&r);
}

TEST(test_has_grad_follows_backward_set_to_none_and_in_place_zero_grad)
{
    prig r;
    prig_init(&r, EM_F32, true);
    em_optimizer *o = three_param_opt(&r, false);
    CHECK(em_grad(r.p[2]) != NULL && !em_has_grad(r.p[2])); /* a flat buffer is no gradient */
    prig_backward(&r, PT_G0[0], PT_G1[0], 1.0);
    CHECK(em_has_grad(r.p[0]) && em_has_grad(r.p[1]) && !em_has_grad(r.p[2]));
    CHECK_OK(em_optim_zero_grad(o));
    CHECK(!em_has_grad(r.p[0]) && !em_has_grad(r.p[1]));
    CHECK(((float *)em_data(em_grad(r.p[0])))[0] == 0); /* the buffer stays, zeroed */
    prig_backward(&r, PT_G0[0], NULL, 1.0);
    CHECK_OK(em_optim_set_zero_grad_mode(o, EM_ZERO_GRAD_IN_PLACE));
    CHECK_OK(em_optim_zero_grad(o));
    CHECK(em_has_grad(r.p[0]) && !em_has_grad(r.p[1])); /* zeroed, kept */
    CHECK_ERR(em_optim_set_zero_grad_mode(o, (em_zero_grad_mode)7), EM_ERR_ARG, "unknown mode 7");
    CHECK_OK(em_set_grad_buffer(r.p[1], em_grad(r.p[1]))); /* torch's p.grad = g: a gradient */
    CHECK(em_has_grad(r.p[1]));
    em_optim_free(o);
    prig_free(&r);
}

/* A value in the buffer of a parameter without a gradient is nobody's
 * business: clipping and the loss scaler leave it out, as the step does. */
TEST(test_clip_and_the_loss_scaler_leave_out_a_parameter_without_gradient)
{
    prig r;
    prig_init(&r, EM_F32, true);
    prig_backward(&r, PT_G0[0], PT_G1[0], 1.0);
    float *stale = em_data(em_grad(r.p[2]));
    stale[0] = INFINITY, stale[1] = 100;
    em_status st;
    double with = em_clip_grad_norm(3, r.p, 1e9, &st), without = em_clip_grad_norm(2, r.p, 1e9, &st);
    CHECK_OK(st);
    CHECK(with == without);
    CHECK(em_clip_grad_norm(3, r.p, 0.1, &st) < 1e9 && stale[1] == 100); /* not scaled either */
    em_grad_scaler *sc = em_grad_scaler_new(NULL);
    CHECK_OK(em_scaler_unscale(sc, 3, r.p, NULL));
    CHECK(!em_scaler_found_inf(sc));
    em_grad_scaler_free(sc);
    prig_free(&r);
}

/* ---- amsgrad and maximize ---------------------------------------------------------------- */

static em_optimizer *am_opt(em_tensor **p, int which)
{
    if (which == 4) {
        em_sgd_config c = em_sgd_defaults();
        c.lr = 0.1, c.momentum = 0.9, c.nesterov = true, c.weight_decay = 0.05, c.maximize = true;
        return em_sgd_new(2, p, &c);
    }
    bool adamw = which == 1 || which == 3;
    em_adam_config c = adamw ? em_adamw_defaults() : em_adam_defaults();
    c.lr = 0.01;
    c.weight_decay = which == 0 ? 0 : 0.1;
    c.amsgrad = which != 2;
    c.maximize = which >= 2;
    return adamw ? em_adamw_new(2, p, &c) : em_adam_new(2, p, &c);
}

static void am_follows(int which, const double want64[][10], const double want32[][10], const char *what)
{
    for (int d = 0; d < 2; d++) {
        prig r;
        prig_init(&r, d ? EM_F32 : EM_F64, true);
        em_optimizer *o = am_opt(r.p, which);
        CHECK_NOTNULL(o);
        for (int k = 0; k < PT_STEPS; k++) {
            prig_backward(&r, PT_G0[k], PT_G1[k], PT_SHRINK[k]);
            CHECK_OK(em_optim_step(o));
            CHECK_OK(em_optim_zero_grad(o));
            prig_check(&r, 2, d ? want32[k] : want64[k], pr_tol(r.dt), what, k);
        }
        em_optim_free(o);
        prig_free(&r);
    }
}

TEST(test_adam_amsgrad_follows_torch)
{
    am_follows(0, PT_ADAM_AMSGRAD_F64, PT_ADAM_AMSGRAD_F32, "Adam amsgrad");
}

TEST(test_adamw_amsgrad_follows_torch)
{
    am_follows(1, PT_ADAMW_AMSGRAD_F64, PT_ADAMW_AMSGRAD_F32, "AdamW amsgrad");
}

TEST(test_adam_maximize_with_weight_decay_follows_torch)
{
    am_follows(2, PT_ADAM_MAXIMIZE_F64, PT_ADAM_MAXIMIZE_F32, "Adam maximize");
}

TEST(test_adamw_amsgrad_maximize_follows_torch)
{
    am_follows(3, PT_ADAMW_AMSGRAD_MAXIMIZE_F64, PT_ADAMW_AMSGRAD_MAXIMIZE_F32, "AdamW amsgrad maximize");
}

TEST(test_sgd_nesterov_maximize_follows_torch)
{
    am_follows(4, PT_SGD_MAXIMIZE_F64, PT_SGD_MAXIMIZE_F32, "SGD maximize");
}

/* amsgrad's running maximum is state: saved as state.<i>.max_exp_avg_sq,
 * and a run resumed from it continues bit for bit. */
TEST(test_amsgrad_state_has_max_exp_avg_sq_and_resumes_bitwise)
{
    prig a, b;
    prig_init(&a, EM_F32, true);
    prig_init(&b, EM_F32, true);
    em_optimizer *oa = am_opt(a.p, 1), *ob = am_opt(b.p, 1);
    for (int k = 0; k < 3; k++) {
        prig_backward(&a, PT_G0[k], PT_G1[k], PT_SHRINK[k]);
        CHECK_OK(em_optim_step(oa));
        CHECK_OK(em_optim_zero_grad(oa));
    }
    em_named st[16];
    int n = em_optim_state(oa, st, 16);
    CHECK(n == 9); /* "step", and 4 entries of each parameter */
    bool seen = false;
    for (int i = 0; i < n; i++)
        if (!strcmp(st[i].name, "state.1.max_exp_avg_sq")) seen = em_numel(st[i].t) == 4;
    CHECK(seen);
    /* b takes a's parameters and state, then both go on */
    for (int i = 0; i < 2; i++) CHECK_OK(em_copy_into(b.p[i], a.p[i]));
    CHECK_OK(em_optim_load_state(ob, n, st));
    for (int k = 3; k < PT_STEPS; k++) {
        prig *rs[2] = {&a, &b};
        em_optimizer *os[2] = {oa, ob};
        for (int j = 0; j < 2; j++) {
            prig_backward(rs[j], PT_G0[k], PT_G1[k], PT_SHRINK[k]);
            CHECK_OK(em_optim_step(os[j]));
            CHECK_OK(em_optim_zero_grad(os[j]));
        }
    }
    for (int i = 0; i < 2; i++)
        CHECK(memcmp(em_data(a.p[i]), em_data(b.p[i]), (size_t)em_numel(a.p[i]) * sizeof(float)) == 0);
    /* a state without the maximum does not load into an amsgrad optimizer */
    em_named less[16];
    int m = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(st[i].name, "state.0.max_exp_avg_sq") != 0) less[m++] = st[i];
    CHECK_ERR(em_optim_load_state(ob, m, less), EM_ERR_ARG, "'state.0.max_exp_avg_sq' is missing");
    em_optim_free(oa);
    em_optim_free(ob);
    prig_free(&a);
    prig_free(&b);
}

/* ---- clipping by other norms -------------------------------------------------------------- */

static void clip_follows(double p, double norm64, const double *grads64, double norm32, const double *grads32)
{
    for (int d = 0; d < 2; d++) {
        prig r;
        prig_init(&r, d ? EM_F32 : EM_F64, true);
        prig_backward(&r, PT_G0[0], PT_G1[0], 1.0);
        em_status st;
        double total =
            em_clip_grad_norm_with(3, r.p, &(em_clip_config){.max_norm = 0.5, .norm_type = p}, &st);
        CHECK_OK(st);
        th_case("norm_type %g, %s", p, d ? "f32" : "f64");
        double want = d ? norm32 : norm64, tol = d ? 1e-6 : 1e-13;
        CHECK_NEAR(total, want, tol * want);
        double got[10];
        CHECK_OK(em_to_array(em_grad(r.p[0]), EM_F64, got));
        CHECK_OK(em_to_array(em_grad(r.p[1]), EM_F64, got + 6));
        for (int i = 0; i < 10; i++) CHECK_NEAR(got[i], (d ? grads32 : grads64)[i], tol);
        prig_free(&r);
    }
}

TEST(test_clip_by_the_1_norm_follows_torch)
{
    clip_follows(1, PT_CLIP_1_NORM_F64, PT_CLIP_1_GRADS_F64, PT_CLIP_1_NORM_F32, PT_CLIP_1_GRADS_F32);
}

TEST(test_clip_by_the_3_norm_follows_torch)
{
    clip_follows(3, PT_CLIP_3_NORM_F64, PT_CLIP_3_GRADS_F64, PT_CLIP_3_NORM_F32, PT_CLIP_3_GRADS_F32);
}

TEST(test_clip_by_the_inf_norm_follows_torch)
{
    clip_follows(INFINITY, PT_CLIP_INF_NORM_F64, PT_CLIP_INF_GRADS_F64, PT_CLIP_INF_NORM_F32,
                 PT_CLIP_INF_GRADS_F32);
}

TEST(test_accelerator_clip_with_takes_the_norm_type)
{
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    em_accelerator *a = em_accelerator_new(NULL);
    prig r;
    prig_init(&r, EM_F64, false);
    em_optimizer *o = two_group_opt(&r, false);
    CHECK_OK(em_accel_prepare(a, r.m, o, NULL, NULL));
    em_scope sc = em_scope_begin();
    CHECK(em_accel_accumulate(a));
    CHECK_OK(em_accel_backward(a, prig_loss(&r, PT_G0[0], PT_G1[0], 1.0)));
    em_status st;
    double total =
        em_accel_clip_grad_norm_with(a, &(em_clip_config){.max_norm = 0.5, .norm_type = INFINITY}, &st);
    CHECK_OK(st);
    CHECK(total == PT_CLIP_INF_NORM_F64);
    CHECK(((double *)em_data(em_grad(r.p[0])))[0] == PT_CLIP_INF_GRADS_F64[0]);
    em_scope_end(sc);
    em_accelerator_free(a);
    em_optim_free(o);
    prig_free(&r);
}

TEST(test_clip_error_if_nonfinite_refuses_a_nan_gradient_naming_it_and_changes_nothing)
{
    prig r;
    prig_init(&r, EM_F32, true);
    prig_backward(&r, PT_G0[0], PT_G1[0], 1.0);
    ((float *)em_data(em_grad(r.p[1])))[2] = NAN;
    float before[10];
    memcpy(before, em_data(em_grad(r.p[0])), 6 * sizeof(float));
    memcpy(before + 6, em_data(em_grad(r.p[1])), 4 * sizeof(float));
    double norms[] = {2, 1, INFINITY};
    for (int k = 0; k < 3; k++) {
        em_status st;
        em_clip_config c = {.max_norm = 0.01, .norm_type = norms[k], .error_if_nonfinite = true};
        th_case("norm_type %g", norms[k]);
        CHECK(isnan(em_clip_grad_norm_with(3, r.p, &c, &st)));
        CHECK(st == EM_ERR_ARG);
        CHECK_ERR(em_clip_grad_norm_with(3, r.p, &c, NULL), EM_ERR_ARG,
                  "norm of the gradients is nan (parameter 1 f32(4,) has a gradient that is not finite), so "
                  "they cannot be clipped; nothing was changed");
        CHECK(memcmp(before, em_data(em_grad(r.p[0])), 6 * sizeof(float)) == 0);
        CHECK(memcmp(before + 6, em_data(em_grad(r.p[1])), 4 * sizeof(float)) == 0);
    }
    th_case(NULL);
    em_status st; /* without the flag, torch's way: the NaN norm scales everything */
    CHECK(isnan(em_clip_grad_norm(3, r.p, 0.01, &st)));
    CHECK_OK(st);
    CHECK(isnan(((float *)em_data(em_grad(r.p[0])))[0]));
    prig_free(&r);
}

TEST(test_clip_refuses_a_norm_type_not_above_0_and_reads_0_as_2)
{
    prig r;
    prig_init(&r, EM_F64, true);
    prig_backward(&r, PT_G0[0], PT_G1[0], 1.0);
    em_status st;
    CHECK_ERR(em_clip_grad_norm_with(3, r.p, &(em_clip_config){.max_norm = 1, .norm_type = -2}, &st),
              EM_ERR_ARG, "em_clip_grad_norm: norm_type must be > 0 or inf (0 means 2), got -2");
    CHECK_ERR(em_clip_grad_norm_with(3, r.p, &(em_clip_config){.max_norm = 1, .norm_type = NAN}, &st),
              EM_ERR_ARG, "got nan");
    CHECK_ERR(em_clip_grad_norm_with(3, r.p, NULL, &st), EM_ERR_ARG, "cfg is NULL");
    double two = em_clip_grad_norm_with(3, r.p, &(em_clip_config){.max_norm = 1e9, .norm_type = 2}, &st);
    CHECK(em_clip_grad_norm_with(3, r.p, &(em_clip_config){.max_norm = 1e9}, &st) == two);
    CHECK(em_clip_grad_norm(3, r.p, 1e9, &st) == two);
    prig_free(&r);
}
