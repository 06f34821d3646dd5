/* test_ddp.c — data parallelism end to end: DDP's gradient averaging, its
 * checks, and the equivalences, each rank a forked process:
 *   2 ranks x batch 6  ==  1 rank x batch 12           (20 steps, rel 1e-5)
 *   accumulation 2 x batch 6  ==  batch 12
 *   DDP + accumulation  ==  batch 12
 *   save_state at 10, load_state in a new run, on to 20  ==  20 straight
 *   (bitwise, 1 and 2 processes).
 * and the same jobs on CUDA devices (under ember's emulator in CI: cusim):
 *   cuda:LOCAL_RANK follows the CPU's losses (1 and 2 processes, DDP over
 *   NCCL), and resumes bitwise; ZeRO stages 1-3 give CUDA DDP's weights,
 *   and stage 3 keeps only its chunks' parameters mapped between uses.
 * The training runs go through the Accelerator, as a user program would. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist/ddp_impl.h"
#include "dist/zero_impl.h"
#include "dist_util.h"
#include "harness.h"

/* ---- a small GPT training job ---------------------------------------------------- */

enum { VOCAB = 16, T = 8, NTOK = 4000 };

typedef struct job {
    int accum;         /* micro-batches per step */
    int batch;         /* global micro-batch */
    int steps;         /* train until this many optimizer steps */
    int save_at;       /* save_state after this step (0: never) */
    bool resume;       /* load_state from dir first */
    double bucket_mb;  /* small: many buckets */
    const char *device; /* the Accelerator's device: NULL = cpu */
    em_precision_kind precision;
    int zero;          /* the Accelerator's zero_stage */
    int embd;          /* the GPT's n_embd: 0 = 16 */
    bool offload;      /* the Accelerator's zero_offload */
    char dir[PATH_MAX];    /* state directory */
    char losses[PATH_MAX]; /* rank 0 writes "step loss" lines here */
    char params[PATH_MAX]; /* rank 0 writes the final flat parameters here */
    char model[PATH_MAX];  /* and, when set, em_module_save's file of the final model */
} job;

/* A learnable token stream: mostly t+1 mod V, with some noise. */
static void make_tokens(int32_t *tok)
{
    uint32_t x = 12345;
    tok[0] = 0;
    for (int i = 1; i < NTOK; i++) {
        x = x * 1664525u + 1013904223u;
        tok[i] = (x >> 28) < 3 ? (int32_t)((x >> 8) % VOCAB) : (tok[i - 1] + 1) % VOCAB;
    }
}

/* Two heads, or one when embd is odd (parameters of odd sizes). */
static em_gpt *small_gpt(uint64_t seed, int64_t embd)
{
    em_gpt_config c = {.vocab_size = VOCAB,
                       .block_size = T,
                       .n_layer = 2,
                       .n_head = embd % 2 ? 1 : 2,
                       .n_embd = embd,
                       .bias = true};
    return em_gpt_new(&c, seed);
}

static void write_file(const char *path, const char *mode, const void *p, size_t n)
{
    FILE *f = fopen(path, mode);
    CHECK(f != NULL);
    CHECK(fwrite(p, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

static void train_job(int rank, int world, void *ctx)
{
    (void)world;
    job *j = ctx;
    th_no_user_config();
    em_accelerator *acc = em_accelerator_new(&(em_accel_config){.grad_accum = j->accum,
                                                                .bucket_mb = j->bucket_mb,
                                                                .device = j->device,
                                                                .mixed_precision = j->precision,
                                                                .zero_stage = j->zero,
                                                                .zero_offload = j->offload});
    CHECK_NOTNULL(acc);
    static int32_t tok[NTOK];
    make_tokens(tok);
    em_tokens tokens = em_tokens_view(tok, NTOK, EM_TOK_I32);
    em_window_sampler sampler;
    CHECK_OK(em_window_sampler_init(&sampler, &tokens, j->batch, T, 7));
    /* different inits: DDP must broadcast rank 0's */
    em_gpt *g = small_gpt(1234 + (uint64_t)rank, j->embd ? j->embd : 16);
    CHECK_NOTNULL(g);
    em_optimizer *opt = th_adamw_of(g->m, 1e-2);
    CHECK_NOTNULL(opt);
    em_lr_schedule sched = {.kind = EM_LR_COSINE, .base_lr = 1e-2, .min_lr = 1e-3, .warmup = 3, .total = 20};
    CHECK_OK(em_accel_prepare(acc, g->m, opt, NULL, &sched));
    CHECK_OK(em_accel_prepare_sampler(acc, &sampler));
    if (j->resume) CHECK_OK(em_accel_load_state(acc, j->dir));
    for (int64_t step = em_accel_step_count(acc); step < j->steps; step++) {
        double sum = 0;
        for (int m = 0; m < j->accum; m++) {
            em_scope s = em_scope_begin();
            em_accel_accumulate(acc);
            em_batch b;
            CHECK_OK(em_window_sampler_next(&sampler, &b));
            CHECK_OK(em_accel_to_device(acc, &b));
            em_tensor *loss = em_gpt_loss(g, b.x, b.y);
            CHECK_NOTNULL(loss);
            sum += em_item(loss);
            CHECK_OK(em_accel_backward(acc, loss));
            em_scope_end(s);
        }
        CHECK(em_accel_sync_gradients(acc));
        em_status st;
        em_accel_clip_grad_norm(acc, 1.0, &st);
        CHECK_OK(st);
        CHECK_OK(em_accel_step(acc));
        CHECK_OK(em_accel_zero_grad(acc));
        em_scope s = em_scope_begin();
        em_tensor *avg = em_accel_reduce(acc, em_scalar(EM_F64, sum / j->accum), EM_RED_AVG);
        CHECK_NOTNULL(avg);
        if (rank == 0 && j->losses[0]) {
            char line[64];
            int k = snprintf(line, sizeof line, "%lld %.17g\n", (long long)step, em_item(avg));
            write_file(j->losses, "a", line, (size_t)k);
        }
        em_scope_end(s);
        if (j->save_at && step + 1 == j->save_at) {
            CHECK_OK(em_accel_save_state(acc, j->dir));
            break;
        }
    }
    CHECK_OK(em_accel_gather_params(acc)); /* ZeRO-3: whole parameters on every rank */
    if (rank == 0 && j->params[0]) {
        em_scope s = em_scope_begin();
        em_tensor *flat = em_to(em_module_flat_params(g->m, EM_F32), em_device_cpu());
        CHECK_NOTNULL(flat);
        write_file(j->params, "w", em_data(flat), (size_t)em_numel(flat) * sizeof(float));
        em_scope_end(s);
    }
    if (rank == 0 && j->model[0]) CHECK_OK(em_module_save(g->m, j->model));
    em_accelerator_free(acc);
    em_optim_free(opt);
    em_gpt_free(g);
}

static void job_files(job *j, const char *tag)
{
    char base[PATH_MAX];
    th_tmpdir(base, sizeof base, "ember-ddp");
    th_pathf(j->dir, sizeof j->dir, "%s/state", base);
    th_pathf(j->losses, sizeof j->losses, "%s/losses-%s", base, tag);
    th_pathf(j->params, sizeof j->params, "%s/params-%s", base, tag);
}

static int read_losses(const char *path, double *out, int max)
{
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    int n = 0;
    long long step;
    double v;
    while (n < max && fscanf(f, "%lld %lf", &step, &v) == 2) {
        CHECK(step == n);
        out[n++] = v;
    }
    fclose(f);
    return n;
}

/* Runs `a` and `b` (same number of steps) and checks their losses agree to
 * within rel at every step. */
static void check_losses_within(int world_a, job a, int world_b, job b, double rel_tol)
{
    job_files(&a, "a");
    job_files(&b, "b");
    TH_RANKS_ENV(world_a, train_job, &a);
    TH_RANKS_ENV(world_b, train_job, &b);
    double la[64], lb[64];
    int na = read_losses(a.losses, la, 64), nb = read_losses(b.losses, lb, 64);
    CHECK(na == a.steps && nb == b.steps);
    for (int i = 0; i < na; i++) {
        double rel = fabs(la[i] - lb[i]) / fabs(lb[i]);
        if (!(rel < rel_tol))
            th_fail(__FILE__, __LINE__, "step %d: loss %.9g vs %.9g (rel %.3g > %.3g)", i, la[i], lb[i], rel, rel_tol);
    }
    CHECK(la[na - 1] < la[0] - 0.3); /* and it learned something */
}

/* Runs `a` and `b` and checks their 20 losses agree to rel 1e-5. */
static void check_same_losses(int world_a, job a, int world_b, job b) { check_losses_within(world_a, a, world_b, b, 1e-5); }

TEST(test_ddp_two_ranks_batch_6_match_one_rank_batch_12)
{
    check_same_losses(2, (job){.accum = 1, .batch = 12, .steps = 20, .bucket_mb = 0.002}, 1,
                      (job){.accum = 1, .batch = 12, .steps = 20});
}

TEST(test_accumulation_2_x_batch_6_matches_batch_12)
{
    check_same_losses(1, (job){.accum = 2, .batch = 6, .steps = 20}, 1, (job){.accum = 1, .batch = 12, .steps = 20});
}

TEST(test_ddp_with_accumulation_matches_batch_12)
{
    check_same_losses(2, (job){.accum = 2, .batch = 6, .steps = 20, .bucket_mb = 0.002}, 1,
                      (job){.accum = 1, .batch = 12, .steps = 20});
}

static bool same_bytes(const char *p, const char *q)
{
    FILE *a = fopen(p, "rb"), *b = fopen(q, "rb");
    CHECK(a && b);
    int ca, cb;
    long n = 0;
    do {
        ca = fgetc(a);
        cb = fgetc(b);
        n++;
    } while (ca == cb && ca != EOF);
    fclose(a);
    fclose(b);
    return ca == cb && n > 1;
}

/* save_state after step 10 (device: 6), load_state in a new run, on to 20
 * (12): the weights are the straight run's, byte for byte (zero: the
 * Accelerator's zero_stage, in all three runs). */
static void check_resume_is_exact_on(int world, const char *device, int zero)
{
    /* a smaller batch and run on the device: the emulator runs about 1 µs a
     * GPU thread, and three runs of 20 steps took over 60 s under ASan on a
     * busy 2-core machine */
    job straight = {.accum = 2,
                    .batch = device ? 2 : 6,
                    .steps = device ? 12 : 20,
                    .bucket_mb = 0.002,
                    .device = device,
                    .zero = zero};
    job_files(&straight, "straight");
    straight.losses[0] = 0;
    TH_RANKS_ENV(world, train_job, &straight);
    job first = straight, second;
    job_files(&first, "first");
    first.save_at = straight.steps / 2;
    first.params[0] = 0;
    first.losses[0] = 0;
    TH_RANKS_ENV(world, train_job, &first);
    second = first;
    second.save_at = 0;
    second.resume = true;
    th_pathf(second.params, sizeof second.params, "%s.resumed", first.dir);
    TH_RANKS_ENV(world, train_job, &second);
    if (!same_bytes(straight.params, second.params))
        th_fail(__FILE__, __LINE__, "world %d zero stage %d: resumed weights differ from the straight run's",
                world, zero);
}

static void check_resume_is_exact(int world) { check_resume_is_exact_on(world, NULL, 0); }

TEST(test_resume_at_step_10_gives_bitwise_the_straight_weights_one_process) { check_resume_is_exact(1); }

TEST(test_resume_at_step_10_gives_bitwise_the_straight_weights_two_processes) { check_resume_is_exact(2); }

/* ---- ZeRO stages 1 and 2 (dist/zero.c) against DDP ------------------------------------------
 * The same training job through the Accelerator with zero_stage set. Stage
 * 1 all-reduces the gradients as DDP does and clips them as DDP does, and
 * its chunked AdamW computes each element as the whole one does: bitwise
 * DDP's weights. Stage 2 averages each chunk with a reduce-scatter and
 * clips by a norm whose squares are summed per chunk, then over ranks.
 * Measured: bitwise DDP's losses and weights on the shared-memory
 * transport (world 2 and 4); over TCP at world 4 the ring's reduce-scatter
 * adds the ranks in another order than its all-reduce, 1.5e-8 relative
 * apart after 18 steps. Held to 1e-6. Small buckets (2 KB) make many
 * buckets, several of them with a size the world does not divide. */

static void check_zero_against_ddp(int world, job base, int stage, bool bitwise)
{
    job ddp = base, zero = base;
    zero.zero = stage;
    job_files(&ddp, "ddp");
    job_files(&zero, "zero");
    TH_RANKS_ENV(world, train_job, &ddp);
    TH_RANKS_ENV(world, train_job, &zero);
    double la[64], lb[64];
    int na = read_losses(ddp.losses, la, 64), nb = read_losses(zero.losses, lb, 64);
    CHECK(na == base.steps && nb == base.steps);
    for (int i = 0; i < na; i++) {
        double rel = fabs(la[i] - lb[i]) / fabs(la[i]);
        if (bitwise ? la[i] != lb[i] : !(rel < 1e-6))
            th_fail(__FILE__, __LINE__, "world %d stage %d step %d: loss %.17g vs DDP's %.17g (rel %.3g)", world,
                    stage, i, lb[i], la[i], rel);
    }
    if (bitwise && !same_bytes(ddp.params, zero.params))
        th_fail(__FILE__, __LINE__, "world %d stage %d: final weights differ from DDP's", world, stage);
    CHECK(lb[nb - 1] < lb[0] - 0.3); /* and it learned */
}

static const job zero_job = {.accum = 1, .batch = 12, .steps = 20, .bucket_mb = 0.002};

TEST(test_zero_stage_1_gives_ddp_weights_bitwise_two_ranks) { check_zero_against_ddp(2, zero_job, 1, true); }

TEST(test_zero_stage_1_gives_ddp_weights_bitwise_four_ranks) { check_zero_against_ddp(4, zero_job, 1, true); }

TEST(test_zero_stage_2_follows_ddp_two_ranks) { check_zero_against_ddp(2, zero_job, 2, false); }

TEST(test_zero_stage_2_follows_ddp_four_ranks) { check_zero_against_ddp(4, zero_job, 2, false); }

TEST(test_zero_stage_3_follows_ddp_two_ranks) { check_zero_against_ddp(2, zero_job, 3, false); }

TEST(test_zero_stage_3_follows_ddp_four_ranks) { check_zero_against_ddp(4, zero_job, 3, false); }

/* Stages 1 (bitwise), 2 and 3 against DDP on job j at world 2. */
static void check_every_stage(job j)
{
    check_zero_against_ddp(2, j, 1, true);
    check_zero_against_ddp(2, j, 2, false);
    check_zero_against_ddp(2, j, 3, false);
}

TEST(test_zero_stages_follow_ddp_with_accumulation)
{
    job j = zero_job;
    j.accum = 2;
    j.batch = 6;
    check_every_stage(j);
}

TEST(test_zero_stages_follow_ddp_under_bf16)
{
    job j = zero_job;
    j.precision = EM_PREC_BF16;
    check_every_stage(j);
}

TEST(test_zero_stages_follow_ddp_under_fp16_with_the_loss_scaler)
{
    job j = zero_job;
    j.precision = EM_PREC_FP16;
    check_every_stage(j);
}

/* A small GPT with AdamW over all its parameters, for the em_zero tests. */
typedef struct zero_fixture {
    em_gpt *g;
    em_optimizer *opt;
} zero_fixture;

static zero_fixture zero_fixture_new(uint64_t seed, int64_t embd, int dev /* cuda:dev, or -1: the CPU */)
{
    zero_fixture f = {small_gpt(seed, embd), NULL};
    CHECK_NOTNULL(f.g);
    if (dev >= 0) CHECK_OK(em_module_to(f.g->m, em_device_cuda(dev)));
    f.opt = th_adamw_of(f.g->m, NAN);
    CHECK_NOTNULL(f.opt);
    return f;
}

static void zero_fixture_free(zero_fixture f)
{
    em_optim_free(f.opt);
    em_gpt_free(f.g);
}

/* One synced stage step of z on a batch of 2 made from `salt`. */
static void zero_one_step(em_zero *z, em_gpt *g, int salt, bool step, int dev)
{
    int32_t tok[2 * T];
    for (int i = 0; i < 2 * T; i++) tok[i] = (i * 7 + salt) % VOCAB;
    em_tensor *x = em_from_data(EM_I32, EM_SHAPE(2, T), tok);
    if (dev >= 0) x = em_to(x, em_device_cuda(dev));
    CHECK_OK(em_zero_backward(z, em_gpt_loss(g, x, x), true));
    if (step) CHECK_OK(em_zero_step(z));
}

/* em_zero_new's refusals, each on every rank alike. */
static void zero_refusals(em_pg *pg, int rank, int world, void *ctx)
{
    (void)rank, (void)world, (void)ctx;
    zero_fixture f = zero_fixture_new(5, 16, -1), other = zero_fixture_new(6, 16, -1);
    em_named po[64];
    em_module_params(other.g->m, po, 64);
    em_tensor *foreign = po[0].t;
    em_optimizer *bad = em_adamw_new(1, &foreign, NULL);
    CHECK_NOTNULL(bad);
    CHECK_ERR(em_zero_new(pg, f.g->m, f.opt, &(em_zero_config){.stage = 4}), EM_ERR_ARG, "stage 4");
    CHECK_ERR(em_zero_new(pg, f.g->m, f.opt, &(em_zero_config){.stage = 0}), EM_ERR_ARG, "stage 0");
    CHECK_ERR(em_zero_new(NULL, f.g->m, f.opt, NULL), EM_ERR_ARG, "pg is NULL");
    CHECK_ERR(em_zero_new(pg, f.g->m, bad, NULL), EM_ERR_ARG, "not a parameter of the model");
    /* and a good one still works after the refusals */
    em_zero *z = em_zero_new(pg, f.g->m, f.opt, &(em_zero_config){.stage = 2, .bucket_mb = 0.001});
    CHECK_NOTNULL(z);
    CHECK(em_zero_stage(z) == 2);
    CHECK(em_ddp_num_buckets(em_zero_ddp(z)) > 1);
    em_zero_free(z);
    em_optim_free(bad);
    zero_fixture_free(other);
    zero_fixture_free(f);
}

TEST(test_zero_new_refuses_bad_stages_and_foreign_parameters)
{
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_refusals, NULL);
}

/* The Accelerator's clip under fp16 in stages 2-3 (zero_unscale_clip): the
 * shard unscaled and clipped in two passes, the norm's all-reduce doubling
 * as the overflow vote, against the scaler's unscale and then the clip
 * (what it does when it cannot fuse). Each way on a fresh model: after the
 * clip the parameters are set to zero and a plain SGD step of lr 1 leaves
 * -g, so the gradients' bits are compared whole. Cases: clipping, not
 * clipping, and rank 1's gradient of one parameter made to overflow (found
 * on every rank, the gradients only unscaled). */
static void unscale_clip_one(em_pg *pg, int rank, int stage, double max_norm, bool overflow, bool fused,
                             double *total, bool *found_inf, float *out, int64_t n)
{
    em_gpt *g = small_gpt(11, 16);
    CHECK_NOTNULL(g);
    em_named ps[64];
    int np = em_module_params(g->m, ps, 64);
    em_tensor *pt[64];
    for (int i = 0; i < np; i++) pt[i] = ps[i].t;
    em_sgd_config c = em_sgd_defaults();
    c.lr = 1;
    em_optimizer *o = em_sgd_new(np, pt, &c);
    em_zero *z = em_zero_new(pg, g->m, o, &(em_zero_config){.stage = stage, .bucket_mb = 0.002});
    em_grad_scaler *sc = em_grad_scaler_new(&(em_scaler_config){.init_scale = 4096});
    CHECK(o && z && sc);
    em_scope s = em_scope_begin();
    int32_t tok[2 * T];
    for (int i = 0; i < 2 * T; i++) tok[i] = (i * 5 + 3 * rank) % VOCAB;
    em_tensor *x = em_from_data(EM_I32, EM_SHAPE(2, T), tok), *loss = em_gpt_loss(g, x, x);
    if (overflow && rank == 1) {
        /* a gradient that overflows in one parameter wholly in rank 1's
         * chunks (world 2: rank 0 has none of it), so only rank 1's shard
         * holds the infs and rank 0 learns of them from the vote */
        int k = 0;
        for (int64_t lo, m; k < np; k++)
            if (zero_param_share(z, pt[k], &lo, &m) && m == em_numel(pt[k])) break;
        CHECK(k < np);
        loss = em_add(loss, em_mul_scalar(em_sum(pt[k], 0, NULL, false), 1e38));
    }
    CHECK_OK(em_zero_backward(z, em_scaler_scale(sc, loss), true));
    em_scope_end(s);
    em_clip_config cfg = {.max_norm = max_norm};
    em_status st;
    if (fused) {
        *total = zero_unscale_clip(z, sc, &cfg, &st);
        CHECK_OK(st);
    } else {
        CHECK_OK(zero_unscale(z, sc));
        *total = em_scaler_found_inf(sc) ? INFINITY : em_zero_clip_grad_norm_with(z, &cfg, &st);
        CHECK_OK(st);
    }
    *found_inf = em_scaler_found_inf(sc);
    CHECK_OK(em_zero_gather_params(z));
    em_tensor *flat = em_module_flat_params(g->m, EM_F32);
    CHECK(flat && em_numel(flat) == n);
    memset(em_data(flat), 0, (size_t)n * sizeof(float));
    CHECK_OK(em_zero_step(z));
    CHECK_OK(em_zero_gather_params(z));
    memcpy(out, em_data(flat), (size_t)n * sizeof(float));
    em_grad_scaler_free(sc);
    em_zero_free(z);
    em_optim_free(o);
    em_gpt_free(g);
}

static void zero_unscale_clip_bits(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world, (void)ctx;
    em_gpt *probe = small_gpt(11, 16);
    CHECK_NOTNULL(probe);
    em_named ps[64];
    int64_t n = 0;
    for (int i = 0, np = em_module_params(probe->m, ps, 64); i < np; i++) n += em_numel(ps[i].t);
    em_gpt_free(probe);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    CHECK(a && b);
    const struct {
        double max_norm;
        bool overflow;
    } cases[] = {{0.05, false}, {1e6, false}, {0.05, true}};
    for (int stage = 2; stage <= 3; stage++)
        for (int k = 0; k < 3; k++) {
            th_case("rank %d stage %d max_norm %g overflow %d", rank, stage, cases[k].max_norm,
                    cases[k].overflow);
            double ta, tb;
            bool fa, fb;
            unscale_clip_one(pg, rank, stage, cases[k].max_norm, cases[k].overflow, false, &ta, &fa, a, n);
            unscale_clip_one(pg, rank, stage, cases[k].max_norm, cases[k].overflow, true, &tb, &fb, b, n);
            CHECK(fa == cases[k].overflow && fb == fa);
            if (fa)
                CHECK(isinf(ta) && isinf(tb));
            else
                CHECK(ta == tb && (ta > cases[k].max_norm) == (k == 0));
            CHECK(memcmp(a, b, (size_t)n * sizeof *a) == 0);
            bool moved = false; /* and the step saw gradients: some -g is not zero */
            for (int64_t i = 0; i < n; i++) moved |= a[i] != 0;
            CHECK(moved);
        }
    th_case(NULL);
    free(a);
    free(b);
}

TEST(test_zero_fp16_clip_unscales_and_clips_the_shard_in_two_passes_with_the_bits_of_four)
{
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_unscale_clip_bits, NULL);
}

/* Stage 2 keeps the optimizer state of about 1/world of the parameters on
 * each rank, and the ranks' pieces together cover every element once. */
static void zero_state_size(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    zero_fixture f = zero_fixture_new(5, 32, -1);
    em_zero *z = em_zero_new(pg, f.g->m, f.opt, &(em_zero_config){.stage = 2, .bucket_mb = 0.004});
    CHECK_NOTNULL(z);
    em_scope sc = em_scope_begin();
    zero_one_step(z, f.g, rank, true, -1);
    em_scope_end(sc);
    em_named st[256];
    int k = em_optim_state(f.opt, st, 256);
    int64_t mine = 0;
    for (int i = 0; i < k; i++)
        if (strstr(st[i].name, ".exp_avg_sq")) mine += em_numel(st[i].t);
    int64_t total = em_module_num_params(f.g->m);
    em_tensor *sum = em_scalar(EM_F64, (double)mine);
    CHECK_OK(em_all_reduce(pg, sum, EM_RED_SUM, NULL));
    CHECK(em_item(sum) == (double)total);              /* every element once */
    CHECK(mine <= total / world + total / 10);          /* and about my share */
    em_free(sum);
    em_zero_free(z);
    zero_fixture_free(f);
}

/* Stage 2 gives the full gradient buffer back after every synced backward
 * (its memory is the point): the flat gradients read zeros after each of
 * several steps, while the shard holds the averaged chunk. */
static void zero_gives_back(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    int dev = ctx ? rank : -1; /* on cuda:rank the buffer stays allocated, and reads zeros */
    zero_fixture f = zero_fixture_new(5, 32, dev);
    em_zero *z = em_zero_new(pg, f.g->m, f.opt, &(em_zero_config){.stage = 2, .bucket_mb = 0.004});
    CHECK_NOTNULL(z);
    for (int step = 0; step < 3; step++) {
        em_scope sc = em_scope_begin();
        zero_one_step(z, f.g, rank + step, false, dev);
        em_tensor *flat = em_module_flat_grads(f.g->m, EM_F32);
        if (dev >= 0) flat = em_to(flat, em_device_cpu());
        const float *fg = em_data(flat);
        int64_t nz = 0, total = em_numel(flat);
        for (int64_t i = 0; i < total; i++) nz += fg[i] != 0;
        if (nz)
            th_fail(__FILE__, __LINE__, "step %d: %lld of %lld flat gradients kept after backward", step,
                    (long long)nz, (long long)total);
        CHECK_OK(em_zero_step(z));
        CHECK_OK(em_zero_zero_grad(z));
        em_scope_end(sc);
    }
    em_zero_free(z);
    zero_fixture_free(f);
}

TEST(test_zero_stage_2_gives_the_full_gradient_buffer_back_after_every_backward)
{
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_gives_back, NULL);
}

TEST(test_zero_stage_2_keeps_a_world_share_of_the_optimizer_state_per_rank)
{
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_state_size, NULL);
    TH_RANKS(4, EM_TRANSPORT_AUTO, zero_state_size, NULL);
}

/* ---- ZeRO checkpoints (dist/checkpoint_optim.c) ----------------------------------------------
 * Under ZeRO each rank saves its own optimizer shard; a load assembles the
 * state of this run's pieces from the shards that overlap them. At the same
 * world size every rank reads back its own shard: bitwise. At another world
 * size, or between ZeRO and DDP, the same global batch (12 windows) keeps
 * the data order and the state is the same numbers re-cut; what changes is
 * the order of the gradients' sums (a reduce-scatter over other chunks, a
 * world of one that sums nothing): the losses after the resume follow the
 * straight run's within 1e-5 relative. */

TEST(test_zero_stage_1_resume_at_step_10_gives_bitwise_the_straight_weights_two_ranks)
{
    check_resume_is_exact_on(2, NULL, 1);
}

TEST(test_zero_stage_2_resume_at_step_10_gives_bitwise_the_straight_weights_two_ranks)
{
    check_resume_is_exact_on(2, NULL, 2);
}

TEST(test_zero_stage_3_resume_at_step_10_gives_bitwise_the_straight_weights_two_ranks)
{
    check_resume_is_exact_on(2, NULL, 3);
}

/* The losses of lines "step loss" into out[step] (steps below max); how many lines. */
static int read_losses_by_step(const char *path, double *out, int max)
{
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    int n = 0;
    long long step;
    double v;
    while (fscanf(f, "%lld %lf", &step, &v) == 2) {
        CHECK(step >= 0 && step < max);
        out[step] = v;
        n++;
    }
    fclose(f);
    return n;
}

/* A job of world_a ranks at zero stage zero_a saves after step 10; a new
 * job of world_b ranks at stage zero_b loads it and trains to step 20: its
 * losses follow the straight world_a run's within 1e-5 relative. */
static void check_reshard(int world_a, int zero_a, int world_b, int zero_b)
{
    job straight = zero_job, first = zero_job;
    straight.zero = first.zero = zero_a;
    job_files(&straight, "straight");
    straight.params[0] = 0;
    TH_RANKS_ENV(world_a, train_job, &straight);
    job_files(&first, "first");
    first.save_at = zero_job.steps / 2;
    first.losses[0] = first.params[0] = 0;
    TH_RANKS_ENV(world_a, train_job, &first);
    job second = first;
    second.save_at = 0;
    second.resume = true;
    second.zero = zero_b;
    th_pathf(second.losses, sizeof second.losses, "%s.resumed-losses", first.dir);
    TH_RANKS_ENV(world_b, train_job, &second);
    double la[64], lb[64];
    CHECK(read_losses_by_step(straight.losses, la, 64) == zero_job.steps);
    CHECK(read_losses_by_step(second.losses, lb, 64) == zero_job.steps - first.save_at);
    for (int i = first.save_at; i < zero_job.steps; i++) {
        double rel = fabs(la[i] - lb[i]) / fabs(la[i]);
        if (!(rel < 1e-5))
            th_fail(
                __FILE__, __LINE__,
                "saved by %d ranks at stage %d, resumed by %d at stage %d: step %d loss %.9g vs the straight "
                "run's %.9g (rel %.3g)",
                world_a, zero_a, world_b, zero_b, i, lb[i], la[i], rel);
    }
}

TEST(test_zero_stage_1_save_of_two_ranks_resumes_on_one_process_without_zero) { check_reshard(2, 1, 1, 0); }

TEST(test_zero_stage_2_save_of_two_ranks_resumes_on_one_process_without_zero) { check_reshard(2, 2, 1, 0); }

TEST(test_zero_stage_1_save_of_two_ranks_resumes_on_four_at_stage_1) { check_reshard(2, 1, 4, 1); }

TEST(test_zero_stage_2_save_of_two_ranks_resumes_on_four_at_stage_2) { check_reshard(2, 2, 4, 2); }

TEST(test_zero_stage_3_save_of_two_ranks_resumes_on_four_at_stage_3_and_on_one_without_zero)
{
    check_reshard(2, 3, 4, 3);
    check_reshard(2, 3, 1, 0);
}

TEST(test_ddp_save_resumes_under_zero_stage_1_and_2) /* each rank slices the whole state */
{
    check_reshard(2, 0, 2, 1);
    check_reshard(2, 0, 4, 2);
}

TEST(test_ddp_save_resumes_under_zero_stage_3) /* each rank fills its chunks from model.safetensors */
{
    check_reshard(2, 0, 2, 3);
}

TEST(test_zero_save_resumes_under_ddp) /* each rank joins every shard */
{
    check_reshard(2, 2, 2, 0);
    check_reshard(2, 1, 4, 0);
}

/* ---- merge-weights (tools/cmd_merge.c, dist/checkpoint_model.c) ------------------------------ */

#define EMBER_BIN EMBER_BUILD_DIR "/ember"

/* A job of `world` ranks at stage `zero` that saves after step 10 and then
 * writes em_module_save's file of its (gathered) model: j->dir, j->model. */
static job saved_job(int world, int zero)
{
    job j = zero_job;
    j.zero = zero;
    j.save_at = 10;
    job_files(&j, "merge");
    j.losses[0] = j.params[0] = 0;
    th_pathf(j.model, sizeof j.model, "%s.gathered.safetensors", j.dir);
    TH_RANKS_ENV(world, train_job, &j);
    return j;
}

/* The f32 parameters of a fresh GPT after em_module_load(path), one after
 * another. */
static float *loaded_params(const char *path, uint64_t seed, int64_t *n)
{
    em_gpt *g = small_gpt(seed, 16);
    CHECK_NOTNULL(g);
    CHECK_OK(em_module_load(g->m, path, true));
    em_named ps[64];
    int np = em_module_params(g->m, NULL, 0);
    CHECK(np <= 64);
    em_module_params(g->m, ps, np);
    *n = 0;
    for (int i = 0; i < np; i++) *n += em_numel(ps[i].t);
    float *p = malloc(sizeof *p * (size_t)*n), *at = p;
    CHECK(p != NULL);
    for (int i = 0; i < np; i++) {
        memcpy(at, em_data(ps[i].t), sizeof *p * (size_t)em_numel(ps[i].t));
        at += em_numel(ps[i].t);
    }
    em_gpt_free(g);
    return p;
}

/* Under ZeRO stage 3 no rank holds the whole model: the save is one model
 * shard per rank, and `ember merge-weights` joins them into the very file
 * em_module_save writes for the same run's gathered model, which loads
 * into a GPT with the gathered weights. */
TEST(test_merge_weights_joins_zero_3_shards_into_the_gathered_models_file_byte_for_byte)
{
    job j = saved_job(2, 3);
    char p[3][PATH_MAX];
    snprintf(p[0], sizeof p[0], "%s", th_path(j.dir, "model.rank_0.safetensors"));
    snprintf(p[1], sizeof p[1], "%s", th_path(j.dir, "model.rank_1.safetensors"));
    snprintf(p[2], sizeof p[2], "%s", th_path(j.dir, "model.safetensors"));
    CHECK(access(p[0], F_OK) == 0 && access(p[1], F_OK) == 0 && access(p[2], F_OK) != 0);
    char out[PATH_MAX];
    th_pathf(out, sizeof out, "%s.merged.safetensors", j.dir);
    th_run_result *r = th_run(EMBER_BIN, "merge-weights", j.dir, out, NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "merged") != NULL);
    if (!same_bytes(out, j.model))
        th_fail(__FILE__, __LINE__, "%s differs from em_module_save's %s of the gathered model", out,
                j.model);
    int64_t na, nb;
    float *a = loaded_params(out, 5, &na), *b = loaded_params(j.model, 6, &nb);
    CHECK(na == nb && !memcmp(a, b, sizeof *a * (size_t)na));
    free(a);
    free(b);
}

/* A save without ZeRO holds the whole model file; merging it gives it back. */
TEST(test_merge_weights_of_a_ddp_save_gives_its_model_file_byte_for_byte)
{
    job j = saved_job(2, 0);
    char out[PATH_MAX], whole[PATH_MAX];
    th_pathf(out, sizeof out, "%s.merged.safetensors", j.dir);
    snprintf(whole, sizeof whole, "%s", th_path(j.dir, "model.safetensors"));
    CHECK_EXIT(th_run(EMBER_BIN, "merge-weights", j.dir, out, NULL), 0);
    CHECK(same_bytes(out, whole) && same_bytes(out, j.model));
}

/* merge-weights refuses: exit 1, a message saying `want`, and no output
 * file (nor its temporary). */
static void check_merge_refused(const char *dir, const char *out, const char *want)
{
    th_run_result *r = th_run(EMBER_BIN, "merge-weights", dir, out, NULL);
    CHECK_EXIT(r, 1);
    if (!strstr(r->err, want)) th_fail(__FILE__, __LINE__, "stderr '%s' does not say '%s'", r->err, want);
    struct stat st;
    CHECK(stat(out, &st) != 0 || S_ISDIR(st.st_mode));
    char tmp[PATH_MAX];
    th_pathf(tmp, sizeof tmp, "%s.tmp", out);
    CHECK(access(tmp, F_OK) != 0);
}

TEST(test_merge_weights_refuses_what_is_not_a_checkpoint_and_bad_output_paths)
{
    job j = saved_job(2, 3);
    char out[PATH_MAX], bad[PATH_MAX], base[PATH_MAX];
    th_pathf(out, sizeof out, "%s.merged.safetensors", j.dir);
    check_merge_refused("/nonexistent/ember-ckpt", out, "no checkpoint at /nonexistent/ember-ckpt");
    snprintf(base, sizeof base, "%s", j.dir);
    *strrchr(base, '/') = '\0';
    check_merge_refused(base, out, "is not a complete checkpoint"); /* a directory without a manifest */
    th_pathf(bad, sizeof bad, "%s/no/such/dir/out.safetensors", base);
    check_merge_refused(j.dir, bad, "cannot create");
    check_merge_refused(j.dir, base, "is a directory");
    th_run_result *r = th_run(EMBER_BIN, "merge-weights", j.dir, NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "no output file given") != NULL);
}

TEST(test_merge_weights_refuses_a_checkpoint_missing_a_model_shard_naming_it)
{
    job j = saved_job(2, 3);
    char shard[PATH_MAX], out[PATH_MAX];
    snprintf(shard, sizeof shard, "%s", th_path(j.dir, "model.rank_1.safetensors"));
    CHECK(unlink(shard) == 0);
    th_pathf(out, sizeof out, "%s.merged.safetensors", j.dir);
    check_merge_refused(j.dir, out, shard);
}

/* ---- on CUDA devices ----------------------------------------------------------------------
 * The same job with the Accelerator's device "cuda" (cuda:LOCAL_RANK). The
 * device computes the same maths in another order: cuBLAS sums a product in
 * one go (the emulator: in double, rounded once) where OpenBLAS sums f32
 * blocks, and the device's reductions are trees. Those differences are one
 * f32 rounding per op, and 50 AdamW steps at lr 1e-2 grow them to about
 * 1e-5 of the loss (measured: see docs/cuda.md); f32 is held to 1e-4.
 * Under bf16/fp16 autocast both devices round the same products to 8 / 11
 * bits, but the roundings fall on different sides once the f32 inputs
 * differ in their last bits: held to 2e-3 (bf16) and 1e-3 (fp16) where
 * 2.4e-4 and 5e-5 were measured (those runs are `ember train
 * --mixed-precision` in test_cli.c). */

#define CUDA_JOBS_OR_SKIP(world)                                                                                     \
    do {                                                                                                             \
        if (em_cuda_device_count() < (world)) SKIP("needs " #world " CUDA device(s) (GPU test)");                    \
    } while (0)

TEST(test_cuda_training_follows_the_cpu_losses_for_24_steps)
{
    CUDA_JOBS_OR_SKIP(1);
    check_losses_within(1, (job){.accum = 1, .batch = 4, .steps = 24, .device = "cuda"}, 1,
                        (job){.accum = 1, .batch = 4, .steps = 24}, 1e-4);
}

TEST(test_cuda_ddp_two_ranks_over_nccl_follow_the_cpu_ddp_losses)
{
    CUDA_JOBS_OR_SKIP(2);
    check_losses_within(2, (job){.accum = 2, .batch = 4, .steps = 24, .bucket_mb = 0.002, .device = "cuda"}, 2,
                        (job){.accum = 2, .batch = 4, .steps = 24, .bucket_mb = 0.002}, 1e-4);
}

TEST(test_cuda_resume_at_step_6_of_12_gives_bitwise_the_straight_weights_one_process)
{
    CUDA_JOBS_OR_SKIP(1);
    check_resume_is_exact_on(1, "cuda", 0);
}

TEST(test_cuda_resume_at_step_6_of_12_gives_bitwise_the_straight_weights_two_processes)
{
    CUDA_JOBS_OR_SKIP(2);
    check_resume_is_exact_on(2, "cuda", 0);
}

/* ---- ZeRO on CUDA devices (dist/zero.c over NCCL) --------------------------------------------
 * The CUDA DDP job above at world 2 with zero_stage 1, 2 and 3, against the
 * same job under CUDA DDP and under CPU DDP. n_embd 9 (one head) gives
 * parameters of odd sizes, so buckets of odd sizes: each goes through its
 * padded copy on the device. Stage 1 all-reduces and clips as DDP does and
 * updates each element of its pieces with the kernel DDP's fused launches
 * use: bitwise CUDA DDP's losses and weights. Stage 2 reduce-scatters
 * (the emulated NCCL adds the ranks in the all-reduce's order) and sums
 * the clip's squares per bucket chunk, then over ranks: measured bitwise
 * too (losses and weights); held to 1e-6 relative, as on the CPU, since a
 * GPU's NCCL may order the two collectives' sums apart. Stage 3 is stage 2
 * with the parameters gathered around each use: measured bitwise too, in
 * f32 and bf16, held to 1e-6. Against CPU DDP:
 * the CUDA tolerance above, 1e-4 (measured: under 3e-8). 16 steps of
 * global batch 2 with accumulation 2: two emulated runs of about 12 s each
 * under ASan on a busy 2-core machine. */

/* One ZeRO run (stage, offload) of `base` against the CUDA DDP run `ddp`
 * (losses ld, weights file) and the CPU DDP losses lc (NULL: none), made
 * once. */
static void check_cuda_zero_run(job base, const job *ddp, const double *ld, const double *lc, int stage,
                                bool offload, bool bitwise)
{
    job zero = base;
    zero.zero = stage;
    zero.offload = offload;
    job_files(&zero, "zero");
    TH_RANKS_ENV(2, train_job, &zero);
    double lz[64];
    int nz = read_losses(zero.losses, lz, 64);
    CHECK(nz == base.steps);
    for (int i = 0; i < nz; i++) {
        double rel = fabs(lz[i] - ld[i]) / fabs(ld[i]), rel_cpu = lc ? fabs(lz[i] - lc[i]) / fabs(lc[i]) : 0;
        if (bitwise ? lz[i] != ld[i] : !(rel < 1e-6))
            th_fail(__FILE__, __LINE__, "stage %d%s step %d: loss %.17g vs CUDA DDP's %.17g (rel %.3g)", stage,
                    offload ? " offload" : "", i, lz[i], ld[i], rel);
        if (lc && !(rel_cpu < 1e-4))
            th_fail(__FILE__, __LINE__, "stage %d%s step %d: loss %.9g vs CPU DDP's %.9g (rel %.3g > 1e-4)",
                    stage, offload ? " offload" : "", i, lz[i], lc[i], rel_cpu);
    }
    if (bitwise && !same_bytes(ddp->params, zero.params))
        th_fail(__FILE__, __LINE__, "stage %d: final weights differ from CUDA DDP's", stage);
    CHECK(lz[nz - 1] < lz[0] - 0.3); /* and it learned */
}

/* Offload: the optimizer state on the host, each step's update there on
 * this rank's chunks copied off the device and back. The CPU's AdamW
 * computes each element with the device kernel's functions
 * (optim/update_math.h). Measured: within 5e-8 of CUDA DDP's losses; held
 * to 1e-6, as the compilers may contract the two builds' arithmetic
 * differently. A test per stage, each making its own CUDA and CPU DDP runs:
 * as one test of eight runs it took up to 105 s of its 120 s under ASan on a
 * busy 2-core machine. Stage 1 without offload is bitwise CUDA DDP's. */
static void cuda_zero_baselines(job base, job *ddp, double *ld, double *lc)
{
    *ddp = base;
    job_files(ddp, "ddp");
    TH_RANKS_ENV(2, train_job, ddp);
    CHECK(read_losses(ddp->losses, ld, 64) == base.steps);
    if (!lc) return;
    job cpu = base;
    cpu.device = NULL;
    job_files(&cpu, "cpu");
    TH_RANKS_ENV(2, train_job, &cpu);
    CHECK(read_losses(cpu.losses, lc, 64) == base.steps);
}

static const job cuda_zero_base = {
    .accum = 2, .batch = 2, .steps = 16, .bucket_mb = 0.002, .device = "cuda", .embd = 9};

/* One test per stage, each with and without offload; stage 1's also
 * against CPU DDP (the others then are within 1e-6 of what is). */
static void check_cuda_zero_stage(int stage)
{
    job ddp;
    double ld[64], lc_buf[64], *lc = stage == 1 ? lc_buf : NULL;
    cuda_zero_baselines(cuda_zero_base, &ddp, ld, lc);
    check_cuda_zero_run(cuda_zero_base, &ddp, ld, lc, stage, false, stage == 1);
    check_cuda_zero_run(cuda_zero_base, &ddp, ld, lc, stage, true, false);
}

TEST(test_cuda_zero_stage_1_with_and_without_offload_follows_cuda_and_cpu_ddp_two_ranks)
{
    CUDA_JOBS_OR_SKIP(2);
    check_cuda_zero_stage(1);
}

TEST(test_cuda_zero_stage_2_with_and_without_offload_follows_cuda_ddp_two_ranks)
{
    CUDA_JOBS_OR_SKIP(2);
    check_cuda_zero_stage(2);
}

TEST(test_cuda_zero_stage_3_with_and_without_offload_follows_cuda_ddp_two_ranks)
{
    CUDA_JOBS_OR_SKIP(2);
    check_cuda_zero_stage(3);
}

/* Stage 3 under bf16 autocast (f32 masters, the CUDA DDP job's
 * accumulation): CUDA DDP's losses within 1e-6, as in f32 (measured:
 * bitwise, losses and weights). Its own CUDA DDP baseline: the shared one
 * is f32. */
TEST(test_cuda_zero_stage_3_under_bf16_follows_cuda_ddp_two_ranks)
{
    CUDA_JOBS_OR_SKIP(2);
    job base = {.accum = 2,
                .batch = 2,
                .steps = 16,
                .bucket_mb = 0.002,
                .device = "cuda",
                .embd = 9,
                .precision = EM_PREC_BF16};
    job ddp = base;
    job_files(&ddp, "ddp");
    TH_RANKS_ENV(2, train_job, &ddp);
    double ld[64];
    CHECK(read_losses(ddp.losses, ld, 64) == base.steps);
    check_cuda_zero_run(base, &ddp, ld, NULL, 3, false, false);
}

/* The device memory a stage 1 engine and one step of it leave in use on
 * cuda:rank, with or without offload (the cache emptied first, so blocks
 * are not reused at up to twice their request); *mine (if not NULL) gets
 * this rank's state elements. */
static size_t device_bytes_after_a_step(em_pg *pg, int rank, em_gpt *g, bool offload, int64_t *mine)
{
    em_cuda_memory before, m;
    em_cuda_empty_cache(rank);
    CHECK_OK(em_cuda_memory_stats(rank, &before));
    em_optimizer *opt = th_adamw_of(g->m, NAN);
    /* zero_grad keeps the gradients, for the step without the engine below */
    if (opt) CHECK_OK(em_optim_set_zero_grad_mode(opt, EM_ZERO_GRAD_IN_PLACE));
    em_zero *z = opt ? em_zero_new(pg, g->m, opt,
                                   &(em_zero_config){.stage = 1, .bucket_mb = 0.004, .offload = offload})
                     : NULL;
    CHECK_NOTNULL(z);
    em_scope sc = em_scope_begin();
    int32_t tok[2 * T];
    for (int i = 0; i < 2 * T; i++) tok[i] = (i * 7 + rank) % VOCAB;
    em_tensor *x = em_to(em_from_data(EM_I32, EM_SHAPE(2, T), tok), em_device_cuda(rank));
    CHECK_OK(em_zero_backward(z, em_gpt_loss(g, x, x), true));
    CHECK_OK(em_zero_step(z));
    CHECK_OK(em_zero_zero_grad(z));
    em_scope_end(sc);
    CHECK_OK(em_cuda_memory_stats(rank, &m));
    if (mine) {
        em_named st[256];
        int k = em_optim_state(opt, st, 256);
        *mine = 0;
        for (int i = 0; i < k; i++)
            if (strstr(st[i].name, ".exp_avg_sq")) *mine += em_numel(st[i].t);
    }
    em_zero_free(z);
    /* its state stays on the host: stepped without the engine, it says so */
    if (offload) CHECK_ERR(em_optim_step(opt), EM_ERR_DEVICE, "offloaded ZeRO optimizer");
    em_optim_free(opt);
    return m.allocated - before.allocated;
}

/* Offload keeps the optimizer state off the device: at least the 8 bytes
 * per element of this rank's AdamW moments fewer in use there (measured:
 * none of it on the device, 119-122 KB without offload for 105 KB of
 * moments, blocks rounded to 512 bytes). */
static void offload_frees_the_device(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world, (void)ctx;
    em_gpt *g = small_gpt(5, 32);
    CHECK_NOTNULL(g);
    CHECK_OK(em_module_to(g->m, em_device_cuda(rank)));
    int64_t mine = 0;
    device_bytes_after_a_step(pg, rank, g, false, NULL); /* the first backward makes the gradient buffer */
    size_t on_device = device_bytes_after_a_step(pg, rank, g, false, &mine);
    size_t offloaded = device_bytes_after_a_step(pg, rank, g, true, NULL);
    if (!(offloaded + 8 * (size_t)mine <= on_device))
        th_fail(__FILE__, __LINE__,
                "rank %d: %zu bytes in use with offload, %zu without; the state is %lld bytes", rank,
                offloaded, on_device, (long long)(8 * mine));
    CHECK(mine > 0);
    em_gpt_free(g);
}

TEST(test_cuda_zero_offload_keeps_the_optimizer_state_off_the_device)
{
    CUDA_JOBS_OR_SKIP(2);
    TH_RANKS(2, EM_TRANSPORT_AUTO, offload_frees_the_device, NULL);
}

TEST(test_cuda_zero_stage_2_flat_gradients_read_zeros_after_every_backward)
{
    CUDA_JOBS_OR_SKIP(2);
    TH_RANKS(2, EM_TRANSPORT_AUTO, zero_gives_back, (void *)1);
}

/* save_state at step 6 of 12 and load_state under ZeRO on the device:
 * each rank's shard of device state goes out through host copies and comes
 * back onto the device; the weights are the straight run's, byte for byte. */
TEST(test_cuda_zero_stage_2_resume_at_step_6_of_12_gives_bitwise_the_straight_weights_two_ranks)
{
    CUDA_JOBS_OR_SKIP(2);
    check_resume_is_exact_on(2, "cuda", 2);
}

/* Stage 3 on the devices saves at step 6 of 12 (each rank its model shard,
 * from its chunks through host copies). The save resumes under stage 3
 * (each rank's shard back into its chunks) to bitwise the straight run's
 * weights, and under CUDA DDP (each rank joins the shards into the whole
 * model on its device) to the straight run's losses within 1e-5 (measured:
 * bitwise). One straight run and one save serve both resumes. */
TEST(test_cuda_zero_stage_3_save_at_step_6_resumes_bitwise_and_under_cuda_ddp_two_ranks)
{
    CUDA_JOBS_OR_SKIP(2);
    job straight = {.accum = 2, .batch = 2, .steps = 12, .bucket_mb = 0.002, .device = "cuda", .zero = 3};
    job_files(&straight, "straight");
    TH_RANKS_ENV(2, train_job, &straight);
    job first = straight;
    job_files(&first, "first");
    first.save_at = 6;
    first.params[0] = first.losses[0] = 0;
    TH_RANKS_ENV(2, train_job, &first);
    job again = first, ddp = first;
    again.save_at = ddp.save_at = 0;
    again.resume = ddp.resume = true;
    th_pathf(again.params, sizeof again.params, "%s.resumed", first.dir);
    TH_RANKS_ENV(2, train_job, &again);
    if (!same_bytes(straight.params, again.params))
        th_fail(__FILE__, __LINE__, "stage 3 on cuda: resumed weights differ from the straight run's");
    ddp.zero = 0;
    th_pathf(ddp.losses, sizeof ddp.losses, "%s.ddp-losses", first.dir);
    TH_RANKS_ENV(2, train_job, &ddp);
    double ls[64], ld[64];
    CHECK(read_losses_by_step(straight.losses, ls, 64) == straight.steps);
    CHECK(read_losses_by_step(ddp.losses, ld, 64) == straight.steps - first.save_at);
    for (int i = first.save_at; i < straight.steps; i++) {
        double rel = fabs(ld[i] - ls[i]) / fabs(ls[i]);
        if (!(rel < 1e-5))
            th_fail(__FILE__, __LINE__,
                    "resumed under CUDA DDP: step %d loss %.9g vs the straight run's %.9g (rel %.3g)", i,
                    ld[i], ls[i], rel);
    }
}

/* ---- ZeRO stage 3 on a device: parameters mapped only while used ---------------------------
 * The flat parameters live in an address range whose granules are mapped
 * only while needed (tensor/cuda_vmm.c, dist/zero.c). The emulator's
 * granularity is set to one host page (4 KiB; a GPU's is 2 MiB), so a model
 * of 400 KB makes about 100 granules and buckets of 13 of them. */

enum { Z3_STEPS = 2, Z3_EMBD = 64 };

typedef struct z3_share {
    int64_t full;           /* the flat parameters' bytes */
    int64_t largest_bucket; /* bytes */
    int nb;
    size_t granule;
    size_t mapped[2][Z3_STEPS]; /* per rank, after each step (its unmaps done) */
    size_t peak[2];             /* per rank, the most mapped during the steps */
    size_t own[2];              /* per rank, the bytes of its chunks */
} z3_share;

/* Z3_STEPS stage 3 steps of a GPT of width Z3_EMBD on cuda:rank with
 * buckets of 52 KB; what is mapped after each step and at the peak into
 * the shared page; rank 0 writes the gathered parameters to path. */
static void z3_steps(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    z3_share *sh = ((void **)ctx)[0];
    const char *path = ((void **)ctx)[1];
    zero_fixture f = zero_fixture_new(5, Z3_EMBD, rank);
    em_zero *z = em_zero_new(pg, f.g->m, f.opt, &(em_zero_config){.stage = 3, .bucket_mb = 0.05});
    CHECK_NOTNULL(z);
    em_tensor *flat = em_module_flat_params(f.g->m, EM_F32);
    sh->full = em_numel(flat) * 4;
    sh->nb = em_ddp_num_buckets(em_zero_ddp(z));
    em_named ps[64];
    int np = em_module_params(f.g->m, ps, 64);
    for (int i = 0; i < np; i++) {
        int64_t lo, n;
        if (zero_param_share(z, ps[i].t, &lo, &n)) sh->own[rank] += (size_t)n * 4;
    }
    for (int i = 0; i < sh->nb; i++) {
        em_dtype dt;
        int64_t lo, n;
        ddp_bucket_span(em_zero_ddp(z), i, &dt, &lo, &n);
        if (n * 4 > sh->largest_bucket) sh->largest_bucket = n * 4;
    }
    em_cuda_empty_cache(rank);
    em_cuda_reset_peak(rank);
    for (int step = 0; step < Z3_STEPS; step++) {
        em_scope sc = em_scope_begin();
        zero_one_step(z, f.g, rank + step, true, rank);
        CHECK_OK(em_zero_zero_grad(z));
        em_scope_end(sc);
        em_cuda_empty_cache(rank); /* the unmaps waiting for the step's kernels */
        em_cuda_memory m;
        CHECK_OK(em_cuda_memory_stats(rank, &m));
        sh->mapped[rank][step] = m.mapped;
        sh->peak[rank] = m.peak_mapped;
    }
    CHECK_OK(em_zero_gather_params(z));
    if (rank == 0) {
        em_scope sc = em_scope_begin();
        em_tensor *h = em_to(flat, em_device_cpu());
        CHECK_NOTNULL(h);
        write_file(path, "w", em_data(h), (size_t)em_numel(h) * 4);
        em_scope_end(sc);
    }
    em_zero_free(z);
    em_cuda_memory m;
    CHECK_OK(em_cuda_memory_stats(rank, &m));
    CHECK(m.mapped == 0); /* the range went with the engine */
    zero_fixture_free(f);
}

/* Between steps a rank keeps mapped only the granules of its chunks: at
 * most its share plus the two granules each chunk may straddle, and far
 * below the whole buffer; during a step at most KEEP (3) buckets more are
 * whole, plus the one being gathered. And unmapping changes no value: the
 * same steps with 2 MiB granules (nothing ever unmapped, the whole model in
 * one) end with the same parameters, byte for byte. */
TEST(test_cuda_zero_stage_3_maps_only_this_ranks_chunks_between_steps_and_changes_no_weight)
{
    CUDA_JOBS_OR_SKIP(2);
    char base[PATH_MAX], fine[PATH_MAX], whole[PATH_MAX];
    th_tmpdir(base, sizeof base, "ember-z3");
    th_pathf(fine, sizeof fine, "%s/fine", base);
    th_pathf(whole, sizeof whole, "%s/whole", base);
    z3_share *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    setenv("EMBER_CUSIM_VMM_GRANULARITY", "2097152", 1);
    TH_RANKS(2, EM_TRANSPORT_AUTO, z3_steps, ((void *[]){sh, whole}));
    memset(sh, 0, sizeof *sh);
    char g[32];
    snprintf(g, sizeof g, "%ld", sysconf(_SC_PAGESIZE));
    setenv("EMBER_CUSIM_VMM_GRANULARITY", g, 1);
    TH_RANKS(2, EM_TRANSPORT_AUTO, z3_steps, ((void *[]){sh, fine}));
    unsetenv("EMBER_CUSIM_VMM_GRANULARITY");
    size_t gr = (size_t)sysconf(_SC_PAGESIZE);
    CHECK(sh->nb >= 6);
    for (int r = 0; r < 2; r++) {
        size_t most = sh->own[r] + 2 * (size_t)sh->nb * gr, whole_bytes = (size_t)sh->full;
        for (int step = 0; step < Z3_STEPS; step++)
            if (!(sh->mapped[r][step] <= most && sh->mapped[r][step] < whole_bytes * 7 / 10))
                th_fail(__FILE__, __LINE__,
                        "rank %d step %d: %zu bytes mapped between steps; its chunks are %zu, the whole %zu",
                        r, step, sh->mapped[r][step], sh->own[r], whole_bytes);
        size_t peak_most = most + 4 * ((size_t)sh->largest_bucket + 2 * gr);
        if (!(sh->peak[r] <= peak_most && sh->peak[r] < whole_bytes))
            th_fail(__FILE__, __LINE__,
                    "rank %d: %zu bytes mapped at the peak; at most %zu expected, the whole %zu", r,
                    sh->peak[r], peak_most, whole_bytes);
    }
    if (!same_bytes(fine, whole))
        th_fail(__FILE__, __LINE__,
                "the weights after unmapping differ from those of a run that never unmapped");
}
