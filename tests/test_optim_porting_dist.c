/* test_optim_porting_dist.c — the optimizer conventions of
 * test_optim_porting.c where ranks meet, against torch
 * (fixtures/optim_porting_ref.h): DDP with find_unused_parameters at world
 * 2 skips a parameter no rank used and averages one only rank 0 used, as
 * torch DDP does, and ZeRO stages 1 and 2 agree; ZeRO's sharded clip by the
 * 1-, 3- and inf-norm and its error_if_nonfinite on every rank; amsgrad's
 * maximum in ZeRO's sharded checkpoint, resumed at world 2 and at world 1. */
#include <stdlib.h>
#include <unistd.h>

#include "dist_util.h"
#include "optim_porting_rig.h"

static em_optimizer *adamw_of(prig *r, bool amsgrad)
{
    em_adam_config c = em_adamw_defaults();
    c.lr = 0.01, c.weight_decay = 0.1, c.amsgrad = amsgrad;
    em_optimizer *o = em_adamw_new(3, r->p, &c);
    CHECK_NOTNULL(o);
    return o;
}

/* Rank 0's loss uses p0 (G0) and p1 (G1), rank 1's p0 (H0) only; no rank
 * uses p2. */
static em_tensor *unused_loss(prig *r, int rank, int k)
{
    return rank == 0 ? prig_loss(r, PT_G0[k], PT_G1[k], 1.0) : prig_loss(r, PT_H0[k], NULL, 1.0);
}

/* stage 0: DDP and the optimizer; 1, 2: ZeRO. Buckets of one parameter
 * each, so ZeRO cuts every parameter between the ranks. */
static void unused_over_ranks(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    int stage = (int)(intptr_t)ctx;
    prig r;
    prig_init(&r, EM_F64, false);
    em_optimizer *o = adamw_of(&r, false);
    em_ddp *d = NULL;
    em_zero *z = NULL;
    if (stage == 0)
        d = em_ddp_new(pg, r.m, &(em_ddp_config){.bucket_mb = 1e-6, .find_unused_parameters = true});
    else
        z = em_zero_new(pg, r.m, o,
                        &(em_zero_config){.stage = stage, .bucket_mb = 1e-6, .find_unused_parameters = true});
    CHECK(d || z);
    for (int k = 0; k < PT_STEPS; k++) {
        em_scope s = em_scope_begin();
        em_tensor *loss = unused_loss(&r, rank, k);
        CHECK_OK(d ? em_ddp_backward(d, loss, NULL) : em_zero_backward(z, loss, true));
        em_scope_end(s);
        /* every rank agrees: p1 has a gradient (rank 0's, averaged), p2 none */
        CHECK(em_has_grad(r.p[0]) && em_has_grad(r.p[1]) && !em_has_grad(r.p[2]));
        CHECK_OK(d ? em_optim_step(o) : em_zero_step(z));
        CHECK_OK(d ? em_optim_zero_grad(o) : em_zero_zero_grad(z));
        CHECK(!em_has_grad(r.p[0]));
        th_case("stage %d rank %d", stage, rank);
        prig_check(&r, 3, PT_DDP_UNUSED_F64[k], 1e-12, "DDP unused", k);
    }
    em_zero_free(z);
    em_ddp_free(d);
    em_optim_free(o);
    prig_free(&r);
}

TEST(test_ddp_find_unused_skips_a_parameter_no_rank_used_and_averages_one_rank_0_used_as_torch)
{
    TH_RANKS(2, EM_TRANSPORT_AUTO, unused_over_ranks, (void *)0);
}

TEST(test_zero_stages_1_and_2_skip_and_average_unused_parameters_as_ddp)
{
    TH_RANKS(2, EM_TRANSPORT_AUTO, unused_over_ranks, (void *)1);
    TH_RANKS(2, EM_TRANSPORT_AUTO, unused_over_ranks, (void *)2);
}

/* ---- ZeRO's sharded clip ------------------------------------------------------------------- */

typedef struct clip_job {
    int stage;
    bool nan; /* rank 1 makes one gradient element NaN, and clips with error_if_nonfinite */
} clip_job;

/* Both ranks give p0, p1 the gradients G0[0], G1[0] (their average too);
 * clip by each norm, then a plain SGD step of lr 1 shows the clipped
 * gradient: p - g. */
static void zero_clips(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    const clip_job *j = ctx;
    double norms[] = {1, 3, INFINITY},
           want_norm[] = {PT_CLIP_1_NORM_F64, PT_CLIP_3_NORM_F64, PT_CLIP_INF_NORM_F64};
    const double *want_grads[] = {PT_CLIP_1_GRADS_F64, PT_CLIP_3_GRADS_F64, PT_CLIP_INF_GRADS_F64};
    for (int c = 0; c < (j->nan ? 1 : 3); c++) {
        prig r;
        prig_init(&r, EM_F64, false);
        em_sgd_config sc = em_sgd_defaults();
        sc.lr = 1;
        em_optimizer *o = em_sgd_new(3, r.p, &sc);
        em_zero *z = em_zero_new(
            pg, r.m, o,
            &(em_zero_config){.stage = j->stage, .bucket_mb = 1e-6, .find_unused_parameters = true});
        CHECK_NOTNULL(z);
        double g1[4];
        memcpy(g1, PT_G1[0], sizeof g1);
        if (j->nan && rank == 1) g1[2] = NAN;
        em_scope s = em_scope_begin();
        CHECK_OK(em_zero_backward(z, prig_loss(&r, PT_G0[0], g1, 1.0), true));
        em_scope_end(s);
        em_status st;
        em_clip_config cfg = {.max_norm = 0.5, .norm_type = norms[c], .error_if_nonfinite = j->nan};
        double total = em_zero_clip_grad_norm_with(z, &cfg, &st);
        th_case("stage %d rank %d norm_type %g", j->stage, rank, norms[c]);
        if (j->nan) { /* every rank refuses, and the gradients are as they were */
            CHECK(isnan(total) && st == EM_ERR_ARG);
            CHECK_ERR(em_zero_clip_grad_norm_with(z, &cfg, NULL), EM_ERR_ARG,
                      "the total 1-norm of the gradients is nan");
        } else {
            CHECK_OK(st);
            CHECK_NEAR(total, want_norm[c], 1e-13 * want_norm[c]);
        }
        CHECK_OK(em_zero_step(z));
        double got[10], p[10];
        memcpy(p, PT_P0, sizeof(double) * 6);
        memcpy(p + 6, PT_P1, sizeof(double) * 4);
        CHECK_OK(em_to_array(r.p[0], EM_F64, got));
        CHECK_OK(em_to_array(r.p[1], EM_F64, got + 6));
        for (int i = 0; i < 10; i++) {
            double g = j->nan ? (i < 6 ? PT_G0[0][i] : i == 8 ? NAN : PT_G1[0][i - 6]) : want_grads[c][i];
            if (isnan(g))
                CHECK(isnan(got[i]));
            else
                CHECK_NEAR(got[i], p[i] - g, 1e-13);
        }
        em_zero_free(z);
        em_optim_free(o);
        prig_free(&r);
    }
}

TEST(test_zero_clip_by_the_1_3_and_inf_norm_over_shards_follows_torch)
{
    clip_job a = {.stage = 1}, b = {.stage = 2};
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_clips, &a);
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_clips, &b);
}

TEST(test_zero_clip_error_if_nonfinite_refuses_on_every_rank_and_changes_nothing)
{
    clip_job a = {.stage = 1, .nan = true}, b = {.stage = 2, .nan = true};
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_clips, &a);
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_clips, &b);
}

/* ---- amsgrad's maximum in ZeRO's sharded checkpoint ------------------------------------------ */

typedef struct ams_job {
    int zero;     /* the Accelerator's zero_stage (-1: off) */
    int from, to; /* steps [from, to) */
    bool load;    /* load dir first */
    bool save;    /* save dir after step to - 1 */
    char dir[PATH_MAX];
} ams_job;

/* An Accelerator over the three parameters (f64) and AdamW with amsgrad;
 * every rank's loss is G * PT_SHRINK (the average too), p2 unused: the
 * parameters follow torch's amsgrad run after each step. */
static void ams_run(int rank, int world, void *ctx)
{
    (void)rank, (void)world;
    const ams_job *j = ctx;
    th_no_user_config();
    em_accelerator *a = em_accelerator_new(
        &(em_accel_config){.zero_stage = j->zero, .bucket_mb = 1e-6, .find_unused_parameters = true});
    CHECK_NOTNULL(a);
    prig r;
    prig_init(&r, EM_F64, false);
    em_optimizer *o = adamw_of(&r, true);
    CHECK_OK(em_accel_prepare(a, r.m, o, NULL, NULL));
    if (j->load) CHECK_OK(em_accel_load_state(a, j->dir));
    CHECK(em_accel_step_count(a) == j->from);
    for (int k = j->from; k < j->to; k++) {
        em_scope s = em_scope_begin();
        CHECK(em_accel_accumulate(a));
        CHECK_OK(em_accel_backward(a, prig_loss(&r, PT_G0[k], PT_G1[k], PT_SHRINK[k])));
        CHECK_OK(em_accel_step(a));
        CHECK_OK(em_accel_zero_grad(a));
        em_scope_end(s);
        double want[13];
        memcpy(want, PT_ADAMW_AMSGRAD_F64[k], sizeof(double) * 10);
        memcpy(want + 10, PT_P2, sizeof(double) * 3); /* never stepped */
        th_case("zero %d rank %d", j->zero, rank);
        prig_check(&r, 3, want, 1e-12, "AdamW amsgrad", k);
    }
    if (j->save) CHECK_OK(em_accel_save_state(a, j->dir));
    em_accelerator_free(a);
    em_optim_free(o);
    prig_free(&r);
}

TEST(test_zero_saves_amsgrad_maximum_in_its_shards_and_resumes_at_world_2_and_1)
{
    char base[PATH_MAX];
    th_tmpdir(base, sizeof base, "ember-ams");
    for (int stage = 1; stage <= 2; stage++) {
        ams_job save = {.zero = stage, .from = 0, .to = 2, .save = true};
        th_pathf(save.dir, sizeof save.dir, "%s/stage%d", base, stage);
        TH_RANKS_ENV(2, ams_run, &save);
        ams_job again = save; /* the same world and stage */
        again.from = 2, again.to = PT_STEPS, again.save = false, again.load = true;
        TH_RANKS_ENV(2, ams_run, &again);
        ams_job alone = again; /* one process without ZeRO: every shard's pieces joined */
        alone.zero = -1;
        TH_RANKS_ENV(1, ams_run, &alone);
    }
}
