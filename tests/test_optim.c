/* test_optim.c — SGD/Adam/AdamW against torch.optim trajectories
 * (fixtures/optim_ref.h), parameter groups, skipped parameters, f16/bf16
 * parameters, state save/load, gradient clipping, LR schedules, errors. */
#include <stdlib.h>

#include "fixtures/optim_ref.h"
#include "harness.h"

/* ---- a rig: p0 (2,3) and p1 (4), persistent leaves, with persistent
 * gradient buffers attached on first use --------------------------------- */

typedef struct rig {
    em_tensor *p[2], *g[2];
    bool attached[2];
} rig;

/* A persistent tensor of dtype dt with the values v. */
static em_tensor *persist(em_dtype dt, int ndim, const int64_t *shape, const double *v)
{
    em_tensor *t = em_from_data(EM_F64, ndim, shape, v);
    if (dt == EM_F64) return t;
    em_tensor *c = em_cast(t, dt);
    em_free(t);
    return c;
}

/* Writes the values v into t (converted to t's dtype). */
static void put(em_tensor *t, const double *v)
{
    em_tensor *src = em_from_data(EM_F64, em_ndim(t), em_shape(t), v);
    CHECK_OK(em_copy_into(t, src));
    em_free(src);
}

static void rig_init(rig *r, em_dtype dt)
{
    memset(r, 0, sizeof *r);
    r->p[0] = persist(dt, EM_SHAPE(2, 3), OPT_P0);
    r->p[1] = persist(dt, EM_SHAPE(4), OPT_P1);
    r->g[0] = em_zeros(dt, EM_SHAPE(2, 3));
    r->g[1] = em_zeros(dt, EM_SHAPE(4));
    for (int i = 0; i < 2; i++) CHECK_OK(em_set_requires_grad(r->p[i], true));
}

/* Gradients of step k: G0[k] always, G1[k] when with_g1 (else p1 keeps no
 * gradient, as long as it never had one). */
static void rig_grads(rig *r, int k, bool with_g1)
{
    const double *g[2] = {OPT_G0[k], OPT_G1[k]};
    for (int i = 0; i < 2; i++) {
        if (i == 1 && !with_g1) continue;
        put(r->g[i], g[i]);
        if (!r->attached[i]) CHECK_OK(em_set_grad_buffer(r->p[i], r->g[i]));
        r->attached[i] = true;
    }
}

static void rig_free(rig *r)
{
    for (int i = 0; i < 2; i++) {
        em_free(r->p[i]);
        em_free(r->g[i]);
    }
}

/* p0 then p1 against want (10 values) within tol * max(1, |want|). */
static void rig_check(rig *r, const double *want, double tol, const char *what, int k)
{
    double got[10];
    CHECK_OK(em_to_array(r->p[0], EM_F64, got));
    CHECK_OK(em_to_array(r->p[1], EM_F64, got + 6));
    for (int i = 0; i < 10; i++)
        if (!(fabs(got[i] - want[i]) <= tol * fmax(1.0, fabs(want[i]))))
            th_fail(__FILE__, __LINE__, "%s: after step %d, element %d = %.12g, want %.12g (tol %g)", what, k,
                    i, got[i], want[i], tol);
}

typedef em_optimizer *(*make_fn)(em_tensor **p);

/* Runs OPT_STEPS steps in f64 and f32 and checks every step against torch.
 * From step g1_from on p1 has a gradient. */
static void run_case(const char *what, make_fn make, const double want64[][10], const double want32[][10],
                     int g1_from)
{
    int64_t live = em_live_tensors();
    for (int d = 0; d < 2; d++) {
        rig r;
        rig_init(&r, d ? EM_F32 : EM_F64);
        em_optimizer *o = make(r.p);
        CHECK_NOTNULL(o);
        for (int k = 0; k < OPT_STEPS; k++) {
            rig_grads(&r, k, k >= g1_from);
            CHECK_OK(em_optim_step(o));
            rig_check(&r, d ? want32[k] : want64[k], d ? 1e-6 : 1e-12, what, k);
        }
        CHECK(em_optim_step_count(o) == OPT_STEPS);
        em_optim_free(o);
        rig_free(&r);
    }
    CHECK(em_live_tensors() == live);
}

static em_optimizer *mk_sgd_n(int n, em_tensor **p, double lr, double mom, double damp, double wd,
                              bool nesterov)
{
    em_sgd_config c = em_sgd_defaults();
    c.lr = lr, c.momentum = mom, c.dampening = damp, c.weight_decay = wd, c.nesterov = nesterov;
    return em_sgd_new(n, p, &c);
}
static em_optimizer *mk_sgd(em_tensor **p, double lr, double mom, double damp, double wd, bool nesterov)
{
    return mk_sgd_n(2, p, lr, mom, damp, wd, nesterov);
}
static em_optimizer *mk_sgd_plain(em_tensor **p) { return mk_sgd(p, 0.1, 0, 0, 0, false); }
static em_optimizer *mk_sgd_momentum(em_tensor **p) { return mk_sgd(p, 0.1, 0.9, 0, 0, false); }
static em_optimizer *mk_sgd_dampening(em_tensor **p) { return mk_sgd(p, 0.1, 0.9, 0.3, 0, false); }
static em_optimizer *mk_sgd_nesterov(em_tensor **p) { return mk_sgd(p, 0.1, 0.9, 0, 0, true); }
static em_optimizer *mk_sgd_wd(em_tensor **p) { return mk_sgd(p, 0.1, 0.8, 0, 0.05, false); }

static em_optimizer *mk_adam(em_tensor **p)
{
    em_adam_config c = em_adam_defaults();
    c.lr = 0.01;
    return em_adam_new(2, p, &c);
}
static em_optimizer *mk_adam_wd(em_tensor **p)
{
    em_adam_config c = {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
    return em_adam_new(2, p, &c);
}
static em_optimizer *mk_adamw(em_tensor **p)
{
    em_adam_config c = em_adamw_defaults();
    c.lr = 0.01, c.weight_decay = 0.1;
    return em_adamw_new(2, p, &c);
}
/* group 0: p0 (lr 0.01, wd 0.1); group 1: the 1-D p1 (lr 0.02, no decay) */
static em_optimizer *mk_adamw_groups(em_tensor **p)
{
    em_adam_config c = em_adamw_defaults();
    c.lr = 0.01, c.weight_decay = 0.1;
    em_optimizer *o = em_adamw_new(1, p, &c);
    CHECK(em_optim_add_group(o, 1, p + 1, 0.02, 0.0) == 1);
    return o;
}

TEST(test_sgd_matches_torch) { run_case("sgd", mk_sgd_plain, OPT_SGD_PLAIN_F64, OPT_SGD_PLAIN_F32, 0); }
TEST(test_sgd_momentum_matches_torch)
{
    run_case("sgd momentum", mk_sgd_momentum, OPT_SGD_MOMENTUM_F64, OPT_SGD_MOMENTUM_F32, 0);
}
TEST(test_sgd_dampening_matches_torch)
{
    run_case("sgd dampening", mk_sgd_dampening, OPT_SGD_DAMPENING_F64, OPT_SGD_DAMPENING_F32, 0);
}
TEST(test_sgd_nesterov_matches_torch)
{
    run_case("sgd nesterov", mk_sgd_nesterov, OPT_SGD_NESTEROV_F64, OPT_SGD_NESTEROV_F32, 0);
}
TEST(test_sgd_weight_decay_matches_torch)
{
    run_case("sgd wd", mk_sgd_wd, OPT_SGD_WD_F64, OPT_SGD_WD_F32, 0);
}
TEST(test_adam_matches_torch) { run_case("adam", mk_adam, OPT_ADAM_F64, OPT_ADAM_F32, 0); }
TEST(test_adam_l2_weight_decay_matches_torch)
{
    run_case("adam wd", mk_adam_wd, OPT_ADAM_WD_F64, OPT_ADAM_WD_F32, 0);
}
TEST(test_adamw_decoupled_decay_matches_torch)
{
    run_case("adamw", mk_adamw, OPT_ADAMW_F64, OPT_ADAMW_F32, 0);
}
TEST(test_param_groups_no_decay_on_1d_params_matches_torch)
{
    run_case("adamw groups", mk_adamw_groups, OPT_ADAMW_GROUPS_F64, OPT_ADAMW_GROUPS_F32, 0);
}
TEST(test_adam_skips_params_without_grad_like_torch)
{
    run_case("adam skip", mk_adam, OPT_ADAM_SKIP_F64, OPT_ADAM_SKIP_F32, 2);
}
TEST(test_sgd_momentum_skips_params_without_grad_like_torch)
{
    run_case("sgd skip", mk_sgd_momentum, OPT_SGD_SKIP_F64, OPT_SGD_SKIP_F32, 2);
}

TEST(test_skipped_param_is_unchanged_and_has_no_state)
{
    rig r;
    rig_init(&r, EM_F32);
    em_optimizer *o = mk_adam(r.p);
    rig_grads(&r, 0, false);
    CHECK_OK(em_optim_step(o));
    CHECK_VALUES(r.p[1], 0, (float)OPT_P1[0], (float)OPT_P1[1], (float)OPT_P1[2], (float)OPT_P1[3]);
    em_named st[8];
    CHECK(em_optim_state(o, st, 8) == 4); /* step + p0's three entries */
    CHECK(!strcmp(st[1].name, "state.0.step"));
    em_optim_free(o);
    rig_free(&r);
}

TEST(test_set_lr_before_each_step_matches_torch)
{
    for (int d = 0; d < 2; d++) {
        rig r;
        rig_init(&r, d ? EM_F32 : EM_F64);
        em_optimizer *o = mk_adamw(r.p);
        for (int k = 0; k < OPT_STEPS; k++) {
            CHECK_OK(em_optim_set_lr(o, -1, 0.01 * (k + 1) / 5));
            CHECK_NEAR(em_optim_get_lr(o, 0), 0.01 * (k + 1) / 5, 0);
            rig_grads(&r, k, true);
            CHECK_OK(em_optim_step(o));
            rig_check(&r, d ? OPT_ADAMW_LR_F32[k] : OPT_ADAMW_LR_F64[k], d ? 1e-6 : 1e-12, "adamw lr", k);
        }
        em_optim_free(o);
        rig_free(&r);
    }
}

TEST(test_set_lr_on_one_group_leaves_the_others)
{
    rig r;
    rig_init(&r, EM_F32);
    em_optimizer *o = mk_adamw_groups(r.p);
    CHECK(em_optim_num_groups(o) == 2);
    CHECK_NEAR(em_optim_get_lr(o, 0), 0.01, 0);
    CHECK_NEAR(em_optim_get_lr(o, 1), 0.02, 0);
    CHECK_OK(em_optim_set_lr(o, 1, 0.5));
    CHECK_NEAR(em_optim_get_lr(o, 0), 0.01, 0);
    CHECK_NEAR(em_optim_get_lr(o, 1), 0.5, 0);
    CHECK_ERR(em_optim_set_lr(o, 2, 0.1), EM_ERR_ARG, "group 2 out of range");
    CHECK_ERR(em_optim_set_lr(o, 0, -1), EM_ERR_ARG, "lr must be >= 0, got -1");
    CHECK_ERR(em_optim_get_lr(o, -1), EM_ERR_ARG, "em_optim_get_lr: group -1");
    CHECK(isnan(em_optim_get_lr(o, 5)));
    em_optim_free(o);
    rig_free(&r);
}

/* f16/bf16 parameters compute in f32 and round back: an f32 optimizer whose
 * parameters are rounded to the same dtype after every step follows them
 * bit for bit. */
static void low_precision_case(em_dtype dt)
{
    int64_t live = em_live_tensors();
    em_set_grad_enabled(false); /* the casts below are of parameters */
    rig lo, hi;
    rig_init(&lo, dt);
    rig_init(&hi, EM_F32);
    for (int i = 0; i < 2; i++) { /* hi starts from lo's rounded values */
        em_tensor *c = em_cast(lo.p[i], EM_F32);
        CHECK_OK(em_copy_into(hi.p[i], c));
        em_free(c);
    }
    em_optimizer *a = mk_adamw(lo.p), *b = mk_adamw(hi.p);
    for (int k = 0; k < OPT_STEPS; k++) {
        rig_grads(&lo, k, true);
        rig_grads(&hi, k, true);
        for (int i = 0; i < 2; i++) { /* hi's grads rounded like lo's */
            em_tensor *c = em_cast(lo.g[i], EM_F32);
            CHECK_OK(em_copy_into(hi.g[i], c));
            em_free(c);
        }
        CHECK_OK(em_optim_step(a));
        CHECK_OK(em_optim_step(b));
        for (int i = 0; i < 2; i++) {
            em_tensor *c = em_cast(hi.p[i], dt);
            CHECK(th_max_abs_diff(c, lo.p[i]) == 0);
            CHECK_OK(em_copy_into(hi.p[i], c));
            em_free(c);
        }
    }
    /* the parameters moved, and the state is f32 */
    em_tensor *c = em_cast(lo.p[1], EM_F64);
    CHECK(fabs(em_get(c, (int64_t[]){1}) - OPT_P1[1]) > 0.02);
    em_free(c);
    em_named st[8];
    CHECK(em_optim_state(a, st, 8) == 7);
    CHECK(em_dtype_of(st[2].t) == EM_F32 && em_dtype_of(st[1].t) == EM_F64);
    em_optim_free(a);
    em_optim_free(b);
    rig_free(&lo);
    rig_free(&hi);
    CHECK(em_live_tensors() == live);
}

TEST(test_f16_params_update_in_f32_and_round_back) { low_precision_case(EM_F16); }
TEST(test_bf16_params_update_in_f32_and_round_back) { low_precision_case(EM_BF16); }

TEST(test_noncontiguous_param_matches_contiguous)
{
    /* p: a (3,2) transposed view of a persistent (2,3) tensor */
    em_tensor *base = persist(EM_F32, EM_SHAPE(2, 3), OPT_P0);
    em_tensor *p = em_transpose(base, 0, 1), *q = em_keep(p);
    CHECK(!em_is_contiguous(p) && em_is_contiguous(q));
    CHECK_OK(em_set_requires_grad(p, true));
    CHECK_OK(em_set_requires_grad(q, true));
    em_tensor *gp = persist(EM_F32, EM_SHAPE(3, 2), OPT_G0[0]),
              *gq = persist(EM_F32, EM_SHAPE(3, 2), OPT_G0[0]);
    CHECK_OK(em_set_grad_buffer(p, gp));
    CHECK_OK(em_set_grad_buffer(q, gq));
    em_optimizer *a = mk_sgd_n(1, &p, 0.1, 0.9, 0, 0.01, true), *b = mk_sgd_n(1, &q, 0.1, 0.9, 0, 0.01, true);
    for (int k = 0; k < 3; k++) {
        CHECK_OK(em_optim_step(a));
        CHECK_OK(em_optim_step(b));
    }
    CHECK(th_max_abs_diff(p, q) == 0);
    CHECK(th_max_abs_diff(p, base) > 0); /* p is still base's transpose, updated in place */
    em_optim_free(a);
    em_optim_free(b);
    em_free(p);
    em_free(q);
    em_free(base);
    em_free(gp);
    em_free(gq);
}

TEST(test_large_param_updates_every_element)
{
    /* big enough for the threaded path: p -= lr * g everywhere */
    int64_t n = 100003;
    em_tensor *p = em_full(EM_F32, EM_SHAPE(n), 1.0), *g = em_arange(0, (double)n, 1, EM_F32);
    CHECK_OK(em_set_requires_grad(p, true));
    CHECK_OK(em_set_grad_buffer(p, g));
    em_sgd_config c = em_sgd_defaults();
    c.lr = 1e-5;
    em_optimizer *o = em_sgd_new(1, &p, &c);
    CHECK_OK(em_optim_step(o));
    float *x = em_data(p);
    for (int64_t i = 0; i < n; i += 997) CHECK_NEAR(x[i], 1.0f - (float)1e-5 * (float)i, 1.2e-7);
    CHECK_NEAR(x[n - 1], 1.0f - (float)1e-5 * (float)(n - 1), 1.2e-7);
    em_optim_free(o);
    em_free(p);
    em_free(g);
}

TEST(test_sgd_steps_on_gradients_from_backward)
{
    em_tensor *w = persist(EM_F64, EM_SHAPE(4), OPT_P1);
    CHECK_OK(em_set_requires_grad(w, true));
    em_sgd_config c = em_sgd_defaults();
    c.lr = 0.5;
    em_optimizer *o = em_sgd_new(1, &w, &c);
    em_scope s = em_scope_begin();
    em_tensor *coef = em_from_data(EM_F64, EM_SHAPE(4), (double[]){1, -2, 3, 0.5});
    CHECK_OK(em_backward(em_sum(em_mul(w, coef), 0, NULL, false), NULL)); /* d/dw = coef */
    int64_t tape = em_tape_length();
    CHECK_OK(em_optim_step(o));
    CHECK(em_tape_length() == tape); /* the update records nothing */
    CHECK_OK(em_scope_end(s));
    CHECK_VALUES(w, 1e-15, OPT_P1[0] - 0.5, OPT_P1[1] + 1.0, OPT_P1[2] - 1.5, OPT_P1[3] - 0.25);
    CHECK_OK(em_optim_zero_grad(o));
    CHECK_VALUES(em_grad(w), 0, 0, 0, 0, 0);
    em_optim_free(o);
    em_free(w);
}

TEST(test_zero_grad_zeroes_in_place_and_skips_params_without_grad)
{
    rig r;
    rig_init(&r, EM_F32);
    em_optimizer *o = mk_sgd_momentum(r.p);
    rig_grads(&r, 0, false);
    CHECK_OK(em_optim_zero_grad(o));
    CHECK(em_grad(r.p[0]) == r.g[0]); /* same storage, zeroed */
    CHECK_VALUES(r.g[0], 0, 0, 0, 0, 0, 0, 0);
    CHECK(em_grad(r.p[1]) == NULL);
    em_optim_free(o);
    rig_free(&r);
}

/* ---- state save / load ------------------------------------------------------ */

TEST(test_state_lists_documented_names_shapes_and_dtypes)
{
    rig r;
    rig_init(&r, EM_F32);
    em_optimizer *o = mk_adam(r.p);
    em_named st[8];
    CHECK(em_optim_state(o, st, 8) == 1); /* before any step: only the step count */
    CHECK(!strcmp(st[0].name, "step") && em_item(st[0].t) == 0);
    rig_grads(&r, 0, true);
    CHECK_OK(em_optim_step(o));
    CHECK_OK(em_optim_step(o));
    const char *want[] = {"step",         "state.0.step",    "state.0.exp_avg",   "state.0.exp_avg_sq",
                          "state.1.step", "state.1.exp_avg", "state.1.exp_avg_sq"};
    CHECK(em_optim_state(o, NULL, 0) == 7);
    CHECK(em_optim_state(o, st, 8) == 7);
    for (int i = 0; i < 7; i++) CHECK(!strcmp(st[i].name, want[i]));
    CHECK(em_item(st[0].t) == 2 && em_item(st[4].t) == 2 && em_dtype_of(st[4].t) == EM_F64);
    CHECK(em_ndim(st[1].t) == 0 && em_dtype_of(st[2].t) == EM_F32 && em_numel(st[3].t) == 6);
    CHECK(em_ndim(st[5].t) == 1 && em_size(st[5].t, 0) == 4);
    em_optim_free(o);
    o = mk_sgd_momentum(r.p);
    CHECK_OK(em_optim_step(o));
    CHECK(em_optim_state(o, st, 8) == 3);
    CHECK(!strcmp(st[1].name, "state.0.momentum_buffer") && !strcmp(st[2].name, "state.1.momentum_buffer"));
    em_optim_free(o);
    rig_free(&r);
}

/* Runs 2 steps on A, saves its state and parameters as copies, continues A
 * for 3 steps and a fresh B (loaded) for the same 3; the parameters agree
 * bit for bit. */
static void round_trip(em_dtype dt, make_fn make)
{
    int64_t live = em_live_tensors();
    rig a, b;
    rig_init(&a, dt);
    em_optimizer *oa = make(a.p);
    for (int k = 0; k < 2; k++) {
        rig_grads(&a, k, true);
        CHECK_OK(em_optim_step(oa));
    }
    em_named st[16], saved[16];
    int n = em_optim_state(oa, st, 16);
    CHECK(n > 1 && n <= 16);
    for (int i = 0; i < n; i++) saved[i] = (em_named){st[i].name, em_keep(st[i].t)};
    rig_init(&b, dt);
    for (int i = 0; i < 2; i++) CHECK_OK(em_copy_into(b.p[i], a.p[i]));
    em_optimizer *ob = make(b.p);
    CHECK_OK(em_optim_load_state(ob, n, saved));
    CHECK(em_optim_step_count(ob) == 2);
    for (int k = 2; k < OPT_STEPS; k++) {
        rig_grads(&a, k, true);
        rig_grads(&b, k, true);
        CHECK_OK(em_optim_step(oa));
        CHECK_OK(em_optim_step(ob));
        for (int i = 0; i < 2; i++)
            CHECK(!memcmp(em_data(a.p[i]), em_data(b.p[i]), (size_t)em_numel(a.p[i]) * em_dtype_size(dt)));
    }
    for (int i = 0; i < n; i++) em_free(saved[i].t);
    em_optim_free(oa);
    em_optim_free(ob);
    rig_free(&a);
    rig_free(&b);
    CHECK(em_live_tensors() == live);
}

TEST(test_adam_state_round_trip_is_bitwise)
{
    round_trip(EM_F32, mk_adam_wd);
    round_trip(EM_F64, mk_adam);
}
TEST(test_adamw_groups_state_round_trip_is_bitwise) { round_trip(EM_F32, mk_adamw_groups); }
TEST(test_sgd_state_round_trip_is_bitwise)
{
    round_trip(EM_F32, mk_sgd_nesterov);
    round_trip(EM_BF16, mk_sgd_dampening);
}

TEST(test_load_state_without_param_entries_starts_them_fresh)
{
    rig r;
    rig_init(&r, EM_F64);
    em_optimizer *o = mk_adam(r.p);
    rig_grads(&r, 0, true);
    CHECK_OK(em_optim_step(o));
    em_tensor *step = em_scalar(EM_F64, 7);
    CHECK_OK(em_optim_load_state(o, 1, (em_named[]){{"step", step}}));
    CHECK(em_optim_step_count(o) == 7);
    CHECK(em_optim_state(o, NULL, 0) == 1);
    /* the next step is a first step again: |update| = lr per element (m/sqrt(v) = sign g) */
    double before[6], after[6];
    em_to_array(r.p[0], EM_F64, before);
    CHECK_OK(em_optim_step(o));
    em_to_array(r.p[0], EM_F64, after);
    for (int i = 0; i < 6; i++) {
        double g = fabs(OPT_G0[0][i]);
        CHECK_NEAR(fabs(after[i] - before[i]), 0.01 * g / (g + 1e-8), 1e-15);
    }
    em_free(step);
    em_optim_free(o);
    rig_free(&r);
}

TEST(test_load_state_rejects_bad_entries_and_changes_nothing)
{
    rig r;
    rig_init(&r, EM_F32);
    em_optimizer *o = mk_adam(r.p);
    rig_grads(&r, 0, true);
    CHECK_OK(em_optim_step(o));
    em_named st[8];
    CHECK(em_optim_state(o, st, 8) == 7);
    em_tensor *m0 = em_keep(st[2].t);
    em_tensor *wrong = em_zeros(EM_F32, EM_SHAPE(3, 2)), *ints = em_zeros(EM_I32, EM_SHAPE(2, 3));
    em_tensor *half = em_scalar(EM_F64, 1.5), *zeros = em_zeros(EM_F32, EM_SHAPE(2, 3));
    em_named bad[8];
    memcpy(bad, st, sizeof bad);
    bad[2].t = zeros; /* a valid replacement, so a failure later must not apply it */
    bad[6].name = "state.0.momentum_buffer";
    CHECK_ERR(em_optim_load_state(o, 7, bad), EM_ERR_ARG, "unknown state name 'state.0.momentum_buffer'");
    bad[6] = st[6];
    bad[3].t = wrong;
    CHECK_ERR(em_optim_load_state(o, 7, bad), EM_ERR_SHAPE,
              "'state.0.exp_avg_sq' is (3,2) but parameter 0 is (2,3)");
    bad[3].t = ints;
    CHECK_ERR(em_optim_load_state(o, 7, bad), EM_ERR_DTYPE, "'state.0.exp_avg_sq' is i32(2,3)");
    bad[3] = st[3];
    bad[1].t = half;
    CHECK_ERR(em_optim_load_state(o, 7, bad), EM_ERR_ARG,
              "'state.0.step' must be a non-negative integer count, got 1.5");
    bad[1] = st[1];
    CHECK_ERR(em_optim_load_state(o, 6, bad + 1), EM_ERR_ARG, "'step' is missing");
    CHECK_ERR(em_optim_load_state(o, 6, bad), EM_ERR_ARG, "'state.1.exp_avg_sq' is missing");
    bad[6] = st[1];
    CHECK_ERR(em_optim_load_state(o, 7, bad), EM_ERR_ARG, "'state.0.step' appears twice");
    bad[6] = (em_named){"state.2.exp_avg_sq", st[6].t};
    CHECK_ERR(em_optim_load_state(o, 7, bad), EM_ERR_ARG,
              "'state.2.exp_avg_sq': parameter index out of range");
    CHECK(th_max_abs_diff(st[2].t, m0) == 0); /* exp_avg untouched by every failed load */
    CHECK(em_optim_state(o, NULL, 0) == 7);
    em_free(m0);
    em_free(wrong);
    em_free(ints);
    em_free(half);
    em_free(zeros);
    em_optim_free(o);
    rig_free(&r);
}

/* ---- errors --------------------------------------------------------------- */

TEST(test_optimizer_configs_reject_bad_values_naming_the_field)
{
    rig r;
    rig_init(&r, EM_F32);
    em_sgd_config s = em_sgd_defaults();
    CHECK_ERR(em_sgd_new(2, r.p, &s), EM_ERR_ARG, "em_sgd_new: lr is required");
    CHECK_ERR(em_sgd_new(2, r.p, NULL), EM_ERR_ARG, "em_sgd_new: cfg is NULL");
    s.lr = -0.1;
    CHECK_ERR(em_sgd_new(2, r.p, &s), EM_ERR_ARG, "lr must be >= 0, got -0.1");
    s.lr = 0.1, s.momentum = -0.5;
    CHECK_ERR(em_sgd_new(2, r.p, &s), EM_ERR_ARG, "momentum must be >= 0, got -0.5");
    s.momentum = 0.9, s.weight_decay = -1;
    CHECK_ERR(em_sgd_new(2, r.p, &s), EM_ERR_ARG, "weight_decay must be >= 0, got -1");
    s.weight_decay = 0, s.nesterov = true, s.dampening = 0.1;
    CHECK_ERR(em_sgd_new(2, r.p, &s), EM_ERR_ARG,
              "nesterov needs momentum > 0 and dampening == 0, got momentum=0.9 dampening=0.1");
    s.dampening = 0, s.momentum = 0;
    CHECK_ERR(em_sgd_new(2, r.p, &s), EM_ERR_ARG, "got momentum=0 dampening=0");
    em_adam_config a = em_adam_defaults();
    a.beta1 = 1.0;
    CHECK_ERR(em_adam_new(2, r.p, &a), EM_ERR_ARG, "em_adam_new: beta1 must be in [0, 1), got 1");
    a = em_adamw_defaults(), a.beta2 = -0.1;
    CHECK_ERR(em_adamw_new(2, r.p, &a), EM_ERR_ARG, "em_adamw_new: beta2 must be in [0, 1), got -0.1");
    a = em_adam_defaults(), a.eps = -1e-8;
    CHECK_ERR(em_adam_new(2, r.p, &a), EM_ERR_ARG, "eps must be >= 0, got -1e-08");
    a = em_adam_defaults(), a.lr = NAN;
    CHECK_ERR(em_adam_new(2, r.p, &a), EM_ERR_ARG, "lr must be >= 0, got nan");
    a = em_adam_defaults(), a.weight_decay = -0.01;
    CHECK_ERR(em_adamw_new(2, r.p, &a), EM_ERR_ARG, "weight_decay must be >= 0, got -0.01");
    rig_free(&r);
}

TEST(test_config_defaults_are_torchs)
{
    em_adam_config a = em_adam_defaults(), w = em_adamw_defaults();
    CHECK(a.lr == 1e-3 && a.beta1 == 0.9 && a.beta2 == 0.999 && a.eps == 1e-8 && a.weight_decay == 0);
    CHECK(w.lr == 1e-3 && w.beta1 == 0.9 && w.beta2 == 0.999 && w.eps == 1e-8 && w.weight_decay == 1e-2);
    em_sgd_config s = em_sgd_defaults();
    CHECK(isnan(s.lr) && s.momentum == 0 && s.dampening == 0 && s.weight_decay == 0 && !s.nesterov);
    rig r; /* NULL cfg = defaults for Adam/AdamW */
    rig_init(&r, EM_F32);
    em_optimizer *o = em_adamw_new(2, r.p, NULL);
    CHECK_NEAR(em_optim_get_lr(o, 0), 1e-3, 0);
    em_optim_free(o);
    rig_free(&r);
}

TEST(test_optimizer_rejects_bad_params)
{
    int64_t live = em_live_tensors();
    rig r;
    rig_init(&r, EM_F32);
    em_adam_config c = em_adam_defaults();
    em_tensor *ints = em_zeros(EM_I32, EM_SHAPE(3)), *frozen = em_zeros(EM_F32, EM_SHAPE(3));
    CHECK_ERR(em_adam_new(1, &ints, &c), EM_ERR_DTYPE,
              "em_adam_new: params[0] is i32(3,); parameters must be float");
    CHECK_ERR(em_adam_new(1, &frozen, &c), EM_ERR_ARG, "params[0] f32(3,) does not require grad");
    CHECK_ERR(em_adam_new(0, r.p, &c), EM_ERR_ARG, "needs at least one parameter, got n=0");
    CHECK_ERR(em_adam_new(2, (em_tensor *[]){r.p[0], r.p[0]}, &c), EM_ERR_ARG,
              "params[0] and params[1] are the same tensor");
    em_scope s = em_scope_begin();
    em_tensor *y = em_mul_scalar(r.p[0], 2.0);
    CHECK_ERR(em_adam_new(1, &y, &c), EM_ERR_ARG, "params[0] f32(2,3) is not a leaf (made by op");
    em_tensor *scoped = em_zeros(EM_F32, EM_SHAPE(2));
    CHECK_OK(em_set_requires_grad(scoped, true));
    CHECK_ERR(em_adam_new(1, &scoped, &c), EM_ERR_SCOPE,
              "belongs to step scope depth 1; parameters must be persistent");
    em_scope_end(s);
    CHECK_ERR(em_adam_new(1, &scoped, &c), EM_ERR_SCOPE, "em_adam_new");
    em_free(ints);
    em_free(frozen);
    rig_free(&r);
    CHECK(em_live_tensors() == live);
}

TEST(test_param_in_two_groups_is_rejected)
{
    rig r;
    rig_init(&r, EM_F32);
    em_optimizer *o = mk_adamw(r.p);
    CHECK_ERR(em_optim_add_group(o, 1, r.p + 1, 0.1, 0), EM_ERR_ARG,
              "em_optim_add_group: params[0] is already parameter 1 (group 0)");
    CHECK(em_optim_add_group(o, 1, r.p + 1, 0.1, 0) == -1);
    CHECK_ERR(em_optim_add_group(o, 1, r.p, -0.1, 0), EM_ERR_ARG, "lr must be >= 0, got -0.1");
    CHECK(em_optim_num_groups(o) == 1);
    em_optim_free(o);
    rig_free(&r);
}

TEST(test_step_with_freed_param_fails_and_changes_nothing)
{
    rig r;
    rig_init(&r, EM_F32);
    em_optimizer *o = mk_sgd_plain(r.p);
    rig_grads(&r, 0, true);
    em_free(r.p[1]);
    CHECK_ERR(em_optim_step(o), EM_ERR_SCOPE, "em_optim_step");
    CHECK_VALUES(r.p[0], 0, (float)OPT_P0[0], (float)OPT_P0[1], (float)OPT_P0[2], (float)OPT_P0[3],
                 (float)OPT_P0[4], (float)OPT_P0[5]);
    CHECK(em_optim_step_count(o) == 0);
    CHECK_ERR(em_optim_zero_grad(o), EM_ERR_SCOPE, "em_optim_zero_grad");
    CHECK_ERR(em_clip_grad_norm(2, r.p, 1.0, NULL), EM_ERR_SCOPE, "em_clip_grad_norm");
    em_optim_free(o);
    em_free(r.p[0]);
    em_free(r.g[0]);
    em_free(r.g[1]);
}

TEST(test_optim_free_releases_all_state)
{
    int64_t live = em_live_tensors();
    rig r;
    rig_init(&r, EM_F32);
    int64_t with_params = em_live_tensors();
    em_optimizer *o = mk_adamw_groups(r.p);
    for (int k = 0; k < 3; k++) {
        rig_grads(&r, k, true);
        CHECK_OK(em_optim_step(o));
    }
    CHECK(em_live_tensors() == with_params + 7); /* step + 2 x (step, m, v) */
    em_optim_free(o);
    em_optim_free(NULL);
    CHECK(em_live_tensors() == with_params);
    rig_free(&r);
    CHECK(em_live_tensors() == live);
}

/* ---- gradient clipping ------------------------------------------------------ */

static void clip_case(double max_norm, double want_norm64, const double *want64, double want_norm32,
                      const double *want32)
{
    for (int d = 0; d < 2; d++) {
        rig r;
        rig_init(&r, d ? EM_F32 : EM_F64);
        rig_grads(&r, 0, true);
        em_status s = EM_ERR_ARG;
        double norm = em_clip_grad_norm(2, r.p, max_norm, &s);
        CHECK_OK(s);
        CHECK_NEAR(norm, d ? want_norm32 : want_norm64, d ? 1e-6 : 1e-14);
        const double *w = d ? want32 : want64;
        double tol = d ? 1e-7 : 1e-15;
        CHECK_VALUES(r.g[0], tol, w[0], w[1], w[2], w[3], w[4], w[5]);
        CHECK_VALUES(r.g[1], tol, w[6], w[7], w[8], w[9]);
        rig_free(&r);
    }
}

TEST(test_clip_grad_norm_scales_like_torch)
{
    clip_case(1.0, OPT_CLIP_NORM_F64, OPT_CLIP_GRADS_F64, OPT_CLIP_NORM_F32, OPT_CLIP_GRADS_F32);
}
TEST(test_clip_grad_norm_leaves_small_grads_unchanged)
{
    clip_case(100.0, OPT_NOCLIP_NORM_F64, OPT_NOCLIP_GRADS_F64, OPT_NOCLIP_NORM_F32, OPT_NOCLIP_GRADS_F32);
}

TEST(test_clip_grad_norm_skips_params_without_grad)
{
    rig r;
    rig_init(&r, EM_F64);
    CHECK(em_clip_grad_norm(2, r.p, 1.0, NULL) == 0); /* no grads at all */
    rig_grads(&r, 0, false);
    double sq = 0;
    for (int i = 0; i < 6; i++) sq += OPT_G0[0][i] * OPT_G0[0][i];
    CHECK_NEAR(em_clip_grad_norm(2, r.p, 10.0, NULL), sqrt(sq), 1e-15);
    rig_free(&r);
}

TEST(test_clip_grad_norm_large_and_half_precision_grads)
{
    /* 200000 f32 grads of 0.01 (blocked, threaded sum) and an f16 grad: total
     * = sqrt(200000 * 1e-4 + 4 * 0.25) = sqrt(21) */
    int64_t n = 200000;
    em_tensor *p[2] = {em_zeros(EM_F32, EM_SHAPE(n)), em_zeros(EM_F16, EM_SHAPE(2, 2))};
    em_tensor *g[2] = {em_full(EM_F32, EM_SHAPE(n), 0.01), em_full(EM_F16, EM_SHAPE(2, 2), 0.5)};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(em_set_requires_grad(p[i], true));
        CHECK_OK(em_set_grad_buffer(p[i], g[i]));
    }
    double want = sqrt((double)n * (double)0.01f * (double)0.01f + 1.0);
    CHECK_NEAR(em_clip_grad_norm(2, p, 2.0, NULL), want, 1e-9);
    double c = 2.0 / (want + 1e-6);
    CHECK_NEAR(((float *)em_data(g[0]))[n - 1], 0.01f * (float)c, 0);
    CHECK_VALUES(g[1], 1e-3, 0.5 * c, 0.5 * c, 0.5 * c, 0.5 * c);
    for (int i = 0; i < 2; i++) {
        em_free(p[i]);
        em_free(g[i]);
    }
}

/* Many small gradients (one thread each: optim_state.c's small_grads)
 * beside big ones (blocks over the pool), in every norm: the total and the
 * clipped gradients have the one-thread bits at any thread count */
TEST(test_clip_grad_norm_has_the_same_bits_at_any_thread_count)
{
    enum { N = 9 };
    static const int64_t sizes[N] = {128, 65536, 7, 200000, 4096, 1, 65537, 300, 128};
    static const double norms[4] = {2, 1, 3.5, INFINITY};
    int threads = em_num_threads();
    for (int q = 0; q < 4; q++) {
        double total[3];
        uint64_t hash[3];
        for (int t = 0; t < 3; t++) {
            CHECK_OK(em_set_num_threads(t + 1));
            em_rng r = em_rng_new(9);
            em_tensor *p[N], *g[N];
            for (int i = 0; i < N; i++) {
                p[i] = em_zeros(EM_F32, EM_SHAPE(sizes[i]));
                g[i] = em_randn(EM_F32, EM_SHAPE(sizes[i]), &r);
                CHECK_OK(em_set_requires_grad(p[i], true));
                CHECK_OK(em_set_grad_buffer(p[i], g[i]));
            }
            em_status s = EM_ERR_ARG;
            total[t] =
                em_clip_grad_norm_with(N, p, &(em_clip_config){.max_norm = 0.5, .norm_type = norms[q]}, &s);
            CHECK_OK(s);
            hash[t] = 1469598103934665603ull;
            for (int i = 0; i < N; i++) {
                const unsigned char *b = em_data(g[i]);
                for (int64_t k = 0; k < sizes[i] * 4; k++) hash[t] = (hash[t] ^ b[k]) * 1099511628211ull;
                em_free(p[i]);
                em_free(g[i]);
            }
        }
        CHECK(total[0] == total[1] && total[0] == total[2] && total[0] > 0.5);
        CHECK(hash[0] == hash[1] && hash[0] == hash[2]);
    }
    CHECK_OK(em_set_num_threads(threads));
}

TEST(test_clip_grad_norm_rejects_bad_max_norm)
{
    rig r;
    rig_init(&r, EM_F32);
    rig_grads(&r, 0, true);
    em_status s = EM_OK;
    CHECK_ERR(em_clip_grad_norm(2, r.p, -1.0, &s), EM_ERR_ARG,
              "em_clip_grad_norm: max_norm must be >= 0, got -1");
    CHECK(s == EM_ERR_ARG);
    CHECK(isnan(em_clip_grad_norm(2, r.p, NAN, NULL)));
    CHECK_VALUES(r.g[1], 0, (float)OPT_G1[0][0], (float)OPT_G1[0][1], (float)OPT_G1[0][2],
                 (float)OPT_G1[0][3]);
    rig_free(&r);
}

/* ---- LR schedules ------------------------------------------------------------ */

TEST(test_lr_constant)
{
    em_lr_schedule s = {.kind = EM_LR_CONSTANT, .base_lr = 3e-4};
    CHECK(em_lr_at(&s, 0) == 3e-4 && em_lr_at(&s, 123456) == 3e-4);
}

TEST(test_lr_warmup_is_linear_then_constant)
{
    em_lr_schedule s = {.kind = EM_LR_WARMUP, .base_lr = 1.0, .warmup = 4};
    CHECK_NEAR(em_lr_at(&s, 0), 0.25, 0);
    CHECK_NEAR(em_lr_at(&s, 1), 0.5, 0);
    CHECK_NEAR(em_lr_at(&s, 3), 1.0, 0);
    CHECK_NEAR(em_lr_at(&s, 4), 1.0, 0);
    CHECK_NEAR(em_lr_at(&s, 1000), 1.0, 0);
}

TEST(test_lr_cosine_warms_up_then_decays_to_min)
{
    /* warmup 10, total 110, base 6e-4, min 6e-5 (nanoGPT's shape) */
    em_lr_schedule s = {.kind = EM_LR_COSINE, .base_lr = 6e-4, .min_lr = 6e-5, .warmup = 10, .total = 110};
    CHECK_NEAR(em_lr_at(&s, 0), 6e-5, 1e-18);                                   /* 6e-4 * 1/10 */
    CHECK_NEAR(em_lr_at(&s, 4), 3e-4, 1e-18);                                   /* 6e-4 * 5/10 */
    CHECK_NEAR(em_lr_at(&s, 10), 6e-4, 1e-18);                                  /* r = 0: base */
    CHECK_NEAR(em_lr_at(&s, 35), 6e-5 + 0.5 * (1 + sqrt(0.5)) * 5.4e-4, 1e-17); /* r = 1/4 */
    CHECK_NEAR(em_lr_at(&s, 60), 3.3e-4, 1e-17);                                /* r = 1/2: midpoint */
    CHECK_NEAR(em_lr_at(&s, 85), 6e-5 + 0.5 * (1 - sqrt(0.5)) * 5.4e-4, 1e-17); /* r = 3/4 */
    CHECK_NEAR(em_lr_at(&s, 110), 6e-5, 0);
    CHECK_NEAR(em_lr_at(&s, 5000), 6e-5, 0);
    s.warmup = 0; /* no warm-up: starts at base */
    CHECK_NEAR(em_lr_at(&s, 0), 6e-4, 1e-18);
    CHECK_NEAR(em_lr_at(&s, 55), 3.3e-4, 1e-17);
}

TEST(test_lr_step_decay)
{
    em_lr_schedule s = {.kind = EM_LR_STEP, .base_lr = 0.1, .step_size = 3, .gamma = 0.5};
    CHECK_NEAR(em_lr_at(&s, 0), 0.1, 0);
    CHECK_NEAR(em_lr_at(&s, 2), 0.1, 0);
    CHECK_NEAR(em_lr_at(&s, 3), 0.05, 0);
    CHECK_NEAR(em_lr_at(&s, 8), 0.025, 0);
    CHECK_NEAR(em_lr_at(&s, 9), 0.0125, 0);
}

TEST(test_lr_schedule_rejects_bad_fields)
{
    em_lr_schedule s = {.kind = EM_LR_COSINE, .base_lr = 1e-3, .min_lr = 1e-4, .warmup = 10, .total = 10};
    CHECK_ERR(em_lr_at(&s, 0), EM_ERR_ARG, "total must be > warmup, got total=10 warmup=10");
    CHECK(isnan(em_lr_at(&s, 0)));
    s.total = 100, s.min_lr = 2e-3;
    CHECK_ERR(em_lr_schedule_check(&s), EM_ERR_ARG, "min_lr must be in [0, base_lr=0.001], got 0.002");
    s.min_lr = 0;
    CHECK_OK(em_lr_schedule_check(&s));
    CHECK_ERR(em_lr_at(&s, -1), EM_ERR_ARG, "em_lr_at: step must be >= 0, got -1");
    em_lr_schedule w = {.kind = EM_LR_WARMUP, .base_lr = 1, .warmup = 0};
    CHECK_ERR(em_lr_at(&w, 0), EM_ERR_ARG, "warmup must be >= 1 for EM_LR_WARMUP, got 0");
    em_lr_schedule st = {.kind = EM_LR_STEP, .base_lr = 1, .step_size = 0, .gamma = 0.5};
    CHECK_ERR(em_lr_at(&st, 0), EM_ERR_ARG, "step_size must be >= 1, got 0");
    st.step_size = 1, st.gamma = -1;
    CHECK_ERR(em_lr_at(&st, 0), EM_ERR_ARG, "gamma must be >= 0, got -1");
    em_lr_schedule c = {.kind = EM_LR_CONSTANT, .base_lr = -1};
    CHECK_ERR(em_lr_at(&c, 0), EM_ERR_ARG, "base_lr must be >= 0, got -1");
    c.kind = (em_lr_kind)42, c.base_lr = 1;
    CHECK_ERR(em_lr_at(&c, 0), EM_ERR_ARG, "unknown kind 42");
}

TEST(test_schedule_drives_the_optimizer_lr)
{
    rig r;
    rig_init(&r, EM_F64);
    em_optimizer *o = mk_adamw_groups(r.p);
    em_lr_schedule s = {.kind = EM_LR_WARMUP, .base_lr = 0.01, .warmup = 5};
    for (int64_t k = 0; k < 3; k++) CHECK_OK(em_optim_set_lr(o, -1, em_lr_at(&s, k)));
    CHECK_NEAR(em_optim_get_lr(o, 0), 0.006, 1e-18);
    CHECK_NEAR(em_optim_get_lr(o, 1), 0.006, 1e-18);
    em_optim_free(o);
    rig_free(&r);
}
