/* test_schedule.c — the linear warm-up-then-decay schedule (transformers'
 * get_linear_schedule_with_warmup), user-supplied schedule functions, and
 * both driven by the Accelerator, including across a save/load resume.
 * (The other schedules are in test_optim.c.) */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

/* ---- EM_LR_LINEAR ------------------------------------------------------------------- */

TEST(test_lr_linear_warms_up_from_zero_then_decays_to_zero)
{
    em_lr_schedule s = {.kind = EM_LR_LINEAR, .base_lr = 0.1, .warmup = 4, .total = 12};
    CHECK(em_lr_at(&s, 0) == 0.0);              /* warm-up starts at 0 */
    CHECK(em_lr_at(&s, 1) == 0.1 * 1.0 / 4.0);  /* 0.025 */
    CHECK(em_lr_at(&s, 3) == 0.1 * 3.0 / 4.0);  /* 0.075 */
    CHECK(em_lr_at(&s, 4) == 0.1);              /* the peak: (12 - 4) / 8 */
    CHECK(em_lr_at(&s, 8) == 0.1 * 4.0 / 8.0);  /* halfway down */
    CHECK(em_lr_at(&s, 11) == 0.1 * 1.0 / 8.0); /* the last step before 0 */
    CHECK(em_lr_at(&s, 12) == 0.0);
    CHECK(em_lr_at(&s, 1000) == 0.0);
}

TEST(test_lr_linear_without_warmup_starts_at_base)
{
    em_lr_schedule s = {.kind = EM_LR_LINEAR, .base_lr = 2.0, .warmup = 0, .total = 4};
    CHECK(em_lr_at(&s, 0) == 2.0);
    CHECK(em_lr_at(&s, 1) == 1.5);
    CHECK(em_lr_at(&s, 3) == 0.5);
    CHECK(em_lr_at(&s, 4) == 0.0);
}

/* transformers' lr_lambda for get_linear_schedule_with_warmup, written out
 * from its documented definition: the multiplier for LambdaLR's step s. */
static double hf_linear(int64_t s, int64_t warmup, int64_t total)
{
    if (s < warmup) return (double)s / (double)(warmup > 1 ? warmup : 1);
    double d = (double)(total - s) / (double)(total - warmup > 1 ? total - warmup : 1);
    return d > 0 ? d : 0.0;
}

TEST(test_lr_linear_matches_transformers_lambda_at_every_step)
{
    int64_t cases[][2] = {{0, 10}, {1, 10}, {3, 7}, {10, 100}, {99, 100}};
    for (int c = 0; c < 5; c++) {
        em_lr_schedule s = {
            .kind = EM_LR_LINEAR, .base_lr = 5e-5, .warmup = cases[c][0], .total = cases[c][1]};
        for (int64_t k = 0; k <= cases[c][1] + 3; k++) {
            th_case("warmup %lld total %lld step %lld", (long long)cases[c][0], (long long)cases[c][1],
                    (long long)k);
            CHECK_NEAR(em_lr_at(&s, k), 5e-5 * hf_linear(k, cases[c][0], cases[c][1]), 1e-20);
        }
    }
}

TEST(test_lr_linear_rejects_bad_warmup_and_total)
{
    em_lr_schedule s = {.kind = EM_LR_LINEAR, .base_lr = 1, .warmup = -1, .total = 10};
    CHECK_ERR(em_lr_at(&s, 0), EM_ERR_ARG, "em_lr_schedule: warmup must be >= 0, got -1");
    s.warmup = 10;
    CHECK_ERR(em_lr_schedule_check(&s), EM_ERR_ARG, "total must be > warmup, got total=10 warmup=10");
    s.total = 11;
    CHECK_OK(em_lr_schedule_check(&s));
}

/* ---- EM_LR_CUSTOM ------------------------------------------------------------------- */

/* Records the steps it is called with; returns 1 / (1 + step), or, at
 * step bad_at, the value bad. */
typedef struct recorder {
    int64_t steps[64];
    int n;
    int64_t bad_at;
    double bad;
} recorder;

static double inverse_step(int64_t step, void *ctx)
{
    recorder *r = ctx;
    if (r->n < 64) r->steps[r->n++] = step;
    return step == r->bad_at ? r->bad : 1.0 / (double)(1 + step);
}

TEST(test_lr_custom_is_base_lr_times_the_functions_multiplier)
{
    recorder r = {.bad_at = -1};
    em_lr_schedule s = {.kind = EM_LR_CUSTOM, .base_lr = 0.3, .fn = inverse_step, .ctx = &r};
    CHECK(em_lr_at(&s, 0) == 0.3);
    CHECK(em_lr_at(&s, 2) == 0.3 * (1.0 / 3.0));
    CHECK(em_lr_at(&s, 9) == 0.3 * (1.0 / 10.0));
    CHECK(r.n == 3 && r.steps[0] == 0 && r.steps[1] == 2 && r.steps[2] == 9);
}

TEST(test_lr_custom_rejects_a_null_fn)
{
    em_lr_schedule s = {.kind = EM_LR_CUSTOM, .base_lr = 0.3};
    CHECK_ERR(em_lr_schedule_check(&s), EM_ERR_ARG, "fn must be set for EM_LR_CUSTOM, got NULL");
    CHECK_ERR(em_lr_at(&s, 0), EM_ERR_ARG, "fn must be set");
}

TEST(test_lr_custom_nan_negative_or_infinite_multiplier_is_an_error_naming_the_step)
{
    double bad[] = {NAN, -0.5, INFINITY};
    const char *want[] = {"returned nan for step 5", "returned -0.5 for step 5", "returned inf for step 5"};
    for (int k = 0; k < 3; k++) {
        recorder r = {.bad_at = 5, .bad = bad[k]};
        em_lr_schedule s = {.kind = EM_LR_CUSTOM, .base_lr = 1.0, .fn = inverse_step, .ctx = &r};
        CHECK(em_lr_at(&s, 4) == 0.2);
        CHECK_ERR(em_lr_at(&s, 5), EM_ERR_ARG, want[k]);
        CHECK(isnan(em_lr_at(&s, 5)));
    }
}

/* ---- the Accelerator drives them -------------------------------------------------- */

/* An Accelerator (world 1) with an SGD over one parameter w (no gradient:
 * the optimizer skips it, only the lr moves) made with the schedule's
 * base_lr (so the group's lr is em_lr_at's, bit for bit), and the schedule
 * s. */
typedef struct run {
    em_accelerator *a;
    em_optimizer *o;
    em_module *m; /* owns w */
    em_tensor *w;
} run;

static void run_start(run *r, const em_lr_schedule *s)
{
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    r->a = em_accelerator_new(NULL);
    CHECK_NOTNULL(r->a);
    r->m = em_module_new(NULL, "");
    r->w = em_zeros(EM_F32, 1, (int64_t[]){2});
    CHECK_NOTNULL(r->m);
    CHECK_OK(em_module_add_param(r->m, "w", r->w));
    r->o = em_sgd_new(1, &r->w, &(em_sgd_config){.lr = s->base_lr});
    CHECK_NOTNULL(r->o);
    CHECK_OK(em_accel_prepare(r->a, r->m, r->o, NULL, s));
}

static void run_steps(run *r, int k)
{
    for (int i = 0; i < k; i++) {
        CHECK(em_accel_accumulate(r->a));
        CHECK_OK(em_accel_step(r->a));
    }
}

static void run_free(run *r)
{
    em_accelerator_free(r->a);
    em_optim_free(r->o);
    em_module_free(r->m);
}

TEST(test_accelerator_steps_a_custom_schedule_and_resumes_it_from_the_saved_step)
{
    recorder rec = {.bad_at = -1};
    em_lr_schedule s = {.kind = EM_LR_CUSTOM, .base_lr = 0.5, .fn = inverse_step, .ctx = &rec};
    run r;
    run_start(&r, &s);
    run_steps(&r, 3);
    CHECK(rec.n == 3 && rec.steps[0] == 0 && rec.steps[1] == 1 && rec.steps[2] == 2);
    CHECK(em_optim_get_lr(r.o, 0) == 0.5 * (1.0 / 3.0));
    char dir[PATH_MAX], state[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-sched");
    th_pathf(state, sizeof state, "%s/state", dir);
    CHECK_OK(em_accel_save_state(r.a, state));
    run_free(&r);

    /* a new process would start here: a fresh run, loaded, continues at step 3 */
    rec.n = 0;
    run_start(&r, &s);
    CHECK_OK(em_accel_load_state(r.a, state));
    run_steps(&r, 1);
    CHECK(rec.n == 1 && rec.steps[0] == 3);
    CHECK(em_optim_get_lr(r.o, 0) == 0.5 * (1.0 / 4.0));
    run_free(&r);
}

TEST(test_accelerator_step_fails_with_the_schedules_error_naming_the_step)
{
    recorder rec = {.bad_at = 1, .bad = NAN};
    em_lr_schedule s = {.kind = EM_LR_CUSTOM, .base_lr = 0.5, .fn = inverse_step, .ctx = &rec};
    run r;
    run_start(&r, &s);
    run_steps(&r, 1);
    CHECK(em_accel_accumulate(r.a));
    CHECK_ERR(em_accel_step(r.a), EM_ERR_ARG, "em_lr_at: the schedule's fn returned nan for step 1");
    CHECK(em_accel_step_count(r.a) == 1); /* no step was taken */
    run_free(&r);
}

TEST(test_accelerator_steps_the_linear_schedule)
{
    em_lr_schedule s = {.kind = EM_LR_LINEAR, .base_lr = 0.1, .warmup = 2, .total = 6};
    run r;
    run_start(&r, &s);
    double want[] = {0.0, 0.05, 0.1, 0.1 * 3.0 / 4.0, 0.1 * 2.0 / 4.0, 0.1 * 1.0 / 4.0, 0.0};
    for (int k = 0; k < 7; k++) {
        run_steps(&r, 1);
        th_case("step %d", k);
        CHECK(em_optim_get_lr(r.o, 0) == want[k]);
    }
    run_free(&r);
}

TEST(test_accelerator_prepare_refuses_a_custom_schedule_without_fn)
{
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    em_lr_schedule s = {.kind = EM_LR_CUSTOM, .base_lr = 0.5};
    CHECK_ERR(em_accel_prepare(a, NULL, NULL, NULL, &s), EM_ERR_ARG, "fn must be set for EM_LR_CUSTOM");
    em_accelerator_free(a);
}
