/* test_resize.c — em_accel_load_state at another world size: a checkpoint
 * saved by 2 ranks continues on 1 or 4 the trajectory the 2 ranks were on
 * (same global batch, same data order; only float sums reassociate), the
 * per-rank generators follow the documented rule (rank r takes saved rank
 * r % W's), the global window sampler goes on as it was, and what cannot
 * continue the same trajectory is refused with an error saying what the
 * checkpoint has and what the run has.
 *
 * The training job: a small MLP regressing a fixed function on 48 examples,
 * shuffled each epoch, through the Accelerator's prepared loader with a
 * global batch of 8 (8 / world per rank), AdamW; 15 steps cross two epoch
 * ends; the checkpoint is taken after step 5, in the middle of the first. */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"

enum { N = 48, D = 4, GLOBAL = 8, STEPS = 15, SAVE_AT = 5 };

/* ---- the job ----------------------------------------------------------------------- */

/* x_i in [-1, 1]^D from i; y_i = a smooth function of x_i. */
static int64_t reg_len(void *user)
{
    (void)user;
    return N;
}

static em_status reg_get(void *user, int64_t i, void *xv, void *yv)
{
    (void)user;
    float *x = xv, *y = yv;
    for (int d = 0; d < D; d++) x[d] = sinf(0.37f * (float)(i * (d + 1)) + (float)d);
    for (int d = 0; d < D; d++) y[d] = tanhf(x[d] - 0.5f * x[(d + 1) % D]) + 0.25f * x[(d + 2) % D];
    return EM_OK;
}

typedef struct job {
    int per_rank;     /* the loader's batch_size (the global batch is per_rank x world) */
    int accum;        /* micro-batches per optimizer step */
    int steps;        /* train until this many optimizer steps */
    int save_at;      /* save_state after this many steps and stop (0: never) */
    int save_micro;   /* or save after this many micro-batches and stop (0: never) */
    bool resume;      /* load_state from dir first */
    int skew;         /* after loading, move the loader this many batches on: a wrong position */
    char dir[PATH_MAX];    /* the state directory */
    char params[PATH_MAX]; /* rank 0 writes the final flat parameters here ("" = not) */
} job;

static void train_job(int rank, int world, void *ctx)
{
    (void)world;
    job *j = ctx;
    th_no_user_config();
    em_accelerator *acc = em_accelerator_new(&(em_accel_config){.grad_accum = j->accum});
    CHECK_NOTNULL(acc);
    em_dataset *ds = em_dataset_new(&(em_dataset){
        .len = reg_len, .get = reg_get, .x_field = {EM_F32, 1, {D}}, .y_field = {EM_F32, 1, {D}}});
    CHECK_NOTNULL(ds);
    em_loader *l =
        em_loader_new(ds, &(em_loader_config){.batch_size = j->per_rank, .shuffle = true, .seed = 5});
    CHECK_NOTNULL(l);
    em_rng init = em_rng_new(42);
    em_module *root = em_module_new(NULL, NULL);
    em_nn_mlp *mlp = em_nn_mlp_new(root, "mlp", D, true, 0.0, &init);
    CHECK_NOTNULL(mlp);
    em_named ps[8];
    em_tensor *pt[8];
    int n = em_module_params(root, NULL, 0);
    CHECK(n <= 8);
    em_module_params(root, ps, n);
    for (int i = 0; i < n; i++) pt[i] = ps[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 3e-2;
    em_optimizer *opt = em_adamw_new(n, pt, &ac);
    CHECK_NOTNULL(opt);
    CHECK_OK(em_accel_prepare(acc, root, opt, l, NULL));
    if (j->resume) {
        CHECK_OK(em_accel_load_state(acc, j->dir));
        em_loader_pos p = em_loader_position(l);
        if (j->skew) CHECK_OK(em_loader_seek(l, (em_loader_pos){p.epoch, p.batch + j->skew}));
    }
    int micro = 0;
    while (em_accel_step_count(acc) < j->steps) {
        em_scope s = em_scope_begin();
        em_batch b;
        int got = em_accel_next(acc, &b);
        if (got <= 0) { /* end of the epoch */
            CHECK(got == 0);
            CHECK_OK(em_last_status());
            em_scope_end(s);
            continue;
        }
        em_accel_accumulate(acc);
        em_tensor *loss = em_mse_loss(em_nn_mlp_forward(mlp, b.x), b.y);
        CHECK_NOTNULL(loss);
        CHECK_OK(em_accel_backward(acc, loss));
        CHECK_OK(em_accel_step(acc));
        CHECK_OK(em_accel_zero_grad(acc));
        em_scope_end(s);
        micro++;
        if ((j->save_at && em_accel_sync_gradients(acc) && em_accel_step_count(acc) == j->save_at) ||
            (j->save_micro && micro == j->save_micro)) {
            CHECK_OK(em_accel_save_state(acc, j->dir));
            break;
        }
    }
    if (rank == 0 && j->params[0]) {
        em_tensor *flat = em_module_flat_params(root, EM_F32);
        th_write_file(j->params, em_data(flat), (size_t)em_numel(flat) * sizeof(float));
    }
    em_accelerator_free(acc);
    em_optim_free(opt);
    em_module_free(root);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* A fresh directory for one test: dir/state, dir/<tag>.params. */
static void job_dirs(job *j, const char *base, const char *tag)
{
    th_pathf(j->dir, sizeof j->dir, "%s/state", base);
    th_pathf(j->params, sizeof j->params, "%s/%s.params", base, tag);
}

static char *new_base(void)
{
    static char base[PATH_MAX];
    return th_tmpdir(base, sizeof base, "ember-resize");
}

static int read_floats(const char *path, float *out, int max)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    int n = (int)fread(out, sizeof(float), (size_t)max, f);
    fclose(f);
    return n;
}

/* max |a - b| over two parameter files of the same length */
static double params_diff(const char *a, const char *b)
{
    static float pa[4096], pb[4096];
    int na = read_floats(a, pa, 4096), nb = read_floats(b, pb, 4096);
    CHECK(na == nb && na > 0 && na < 4096);
    double d = 0;
    for (int i = 0; i < na; i++) d = fmax(d, fabs((double)pa[i] - (double)pb[i]));
    return d;
}

/* The straight run of 2 ranks, and a run of 2 ranks saved at step SAVE_AT
 * then resumed on `world` ranks (skew: the resumed loader moved on so many
 * batches); returns max |difference| of their final parameters. */
static double resumed_vs_straight(int world, int skew)
{
    char *base = new_base();
    job straight = {.per_rank = GLOBAL / 2, .accum = 1, .steps = STEPS};
    job_dirs(&straight, base, "straight");
    TH_RANKS_ENV(2, train_job, &straight);
    job first = straight;
    first.save_at = SAVE_AT;
    first.params[0] = 0;
    TH_RANKS_ENV(2, train_job, &first);
    job second = {.per_rank = GLOBAL / world, .accum = 1, .steps = STEPS, .resume = true, .skew = skew};
    job_dirs(&second, base, "resumed");
    TH_RANKS_ENV(world, train_job, &second);
    return params_diff(straight.params, second.params);
}

/* Reassociation over the 10 resumed AdamW steps at lr 3e-2 moves the
 * parameters by about 1e-7 (measured: 9e-8 for 2 -> 1, 1.2e-7 for 2 -> 4);
 * the loader one batch off moves them by 4e-2. */
#define RESIZE_TOL 1e-5

TEST(test_resume_of_two_ranks_on_one_continues_the_two_rank_trajectory)
{
    double d = resumed_vs_straight(1, 0);
    if (!(d < RESIZE_TOL)) th_fail(__FILE__, __LINE__, "2 -> 1: max |diff| %.3g >= %g", d, RESIZE_TOL);
}

TEST(test_resume_of_two_ranks_on_four_continues_the_two_rank_trajectory)
{
    double d = resumed_vs_straight(4, 0);
    if (!(d < RESIZE_TOL)) th_fail(__FILE__, __LINE__, "2 -> 4: max |diff| %.3g >= %g", d, RESIZE_TOL);
}

/* The tolerance means something: the same resume with the loader one batch
 * off (what a wrong position conversion would do) lands far outside it. */
TEST(test_resume_on_another_world_with_a_wrong_loader_position_exceeds_the_tolerance)
{
    double d = resumed_vs_straight(1, 1);
    if (!(d > 100 * RESIZE_TOL)) th_fail(__FILE__, __LINE__, "a wrong position gave max |diff| %.3g only", d);
}

/* The unchanged world keeps the exact path: bitwise the straight weights. */
TEST(test_resume_of_two_ranks_on_two_with_a_loader_is_bitwise_exact)
{
    double d = resumed_vs_straight(2, 0);
    if (d != 0) th_fail(__FILE__, __LINE__, "2 -> 2: max |diff| %.3g, want 0", d);
}

/* ---- what stays impossible ------------------------------------------------------------ */

typedef struct expect {
    job j;
    em_status status;
    const char *msg[3]; /* substrings rank 0's error must hold */
} expect;

static void load_fails(int rank, int world, void *ctx)
{
    (void)world;
    expect *e = ctx;
    th_no_user_config();
    em_accelerator *acc = em_accelerator_new(&(em_accel_config){.grad_accum = e->j.accum});
    CHECK_NOTNULL(acc);
    em_dataset *ds = em_dataset_new(&(em_dataset){
        .len = reg_len, .get = reg_get, .x_field = {EM_F32, 1, {D}}, .y_field = {EM_F32, 1, {D}}});
    em_loader *l =
        em_loader_new(ds, &(em_loader_config){.batch_size = e->j.per_rank, .shuffle = true, .seed = 5});
    CHECK_NOTNULL(l);
    /* the objects the checkpoint holds: a model, its optimizer, the loader */
    em_rng init = em_rng_new(42);
    em_module *root = em_module_new(NULL, NULL);
    em_nn_mlp *mlp = em_nn_mlp_new(root, "mlp", D, true, 0.0, &init);
    CHECK_NOTNULL(mlp);
    em_named ps[8];
    em_tensor *pt[8];
    int n = em_module_params(root, ps, 8);
    for (int i = 0; i < n; i++) pt[i] = ps[i].t;
    em_optimizer *opt = em_adamw_new(n, pt, NULL);
    CHECK_OK(em_accel_prepare(acc, root, opt, l, NULL));
    em_clear_error();
    em_status s = em_accel_load_state(acc, e->j.dir);
    if (rank == 0 ? s != e->status : s == EM_OK) /* the others fail too, naming their own cause or rank */
        th_fail(__FILE__, __LINE__, "rank %d: load_state gave %s: %s", rank, em_status_name(s),
                em_last_error());
    for (int i = 0; rank == 0 && i < 3 && e->msg[i]; i++)
        if (!strstr(em_last_error(), e->msg[i]))
            th_fail(__FILE__, __LINE__, "message \"%s\" lacks \"%s\"", em_last_error(), e->msg[i]);
    CHECK(em_loader_position(l).batch == 0); /* nothing changed */
    em_accelerator_free(acc);
    em_optim_free(opt);
    em_module_free(root);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* A checkpoint of 2 ranks x 4 (global batch 8) saved after step 5. */
static void save_two_rank_state(job *j)
{
    char *base = new_base();
    *j = (job){.per_rank = GLOBAL / 2, .accum = 1, .steps = STEPS, .save_at = SAVE_AT};
    job_dirs(j, base, "x");
    j->params[0] = 0;
    TH_RANKS_ENV(2, train_job, j);
}

TEST(test_load_state_on_another_world_refuses_a_different_global_batch)
{
    expect e = {.status = EM_ERR_ARG};
    save_two_rank_state(&e.j);
    e.j.per_rank = GLOBAL / 2; /* 1 rank x 4: a global batch of 4 */
    e.msg[0] = "saved by 2 processes with a global batch of 8 examples (4 each)";
    e.msg[1] = "this run's 1 processes make a global batch of 4";
    e.msg[2] = "give each process a batch_size of 8";
    TH_RANKS_ENV(1, load_fails, &e);
}

TEST(test_load_state_refuses_a_global_batch_that_does_not_divide_over_the_new_world)
{
    expect e = {.status = EM_ERR_ARG};
    save_two_rank_state(&e.j);
    e.j.per_rank = 3; /* 3 ranks x 3 = 9 */
    e.msg[0] = "global batch of 8 examples";
    e.msg[1] = "8 examples cannot be split evenly over 3 processes";
    TH_RANKS_ENV(3, load_fails, &e);
}

TEST(test_load_state_on_another_world_refuses_a_save_made_mid_accumulation)
{
    char *base = new_base();
    expect e = {.status = EM_ERR_ARG};
    e.j = (job){.per_rank = GLOBAL / 2, .accum = 2, .steps = STEPS, .save_micro = 3}; /* micro-step 1 of 2 */
    job_dirs(&e.j, base, "x");
    e.j.params[0] = 0;
    TH_RANKS_ENV(2, train_job, &e.j);
    e.j.per_rank = GLOBAL;
    e.msg[0] = "saved by 2 processes in the middle of an accumulation window (micro-step 1 of 2)";
    e.msg[1] = "this run has 1 processes";
    TH_RANKS_ENV(1, load_fails, &e);
}

/* ---- files that are not one save ------------------------------------------------------ */

/* Replaces the first `from` in path by `to`. */
static void edit_file(const char *path, const char *from, const char *to)
{
    static char text[1 << 16], out[1 << 16];
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *at = strstr(text, from);
    CHECK(at != NULL);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(out, f);
    CHECK(fclose(f) == 0);
}

TEST(test_load_state_names_both_files_when_the_ranks_disagree_on_the_step)
{
    expect e = {.status = EM_ERR_IO};
    save_two_rank_state(&e.j);
    char r1[PATH_MAX];
    th_pathf(r1, sizeof r1, "%s/rank_1.json", e.j.dir);
    edit_file(r1, "\"steps\": \"5\"", "\"steps\": \"4\"");
    th_reseal_checkpoint(e.j.dir); /* past the checksums, to the check of one save */
    e.j.per_rank = GLOBAL; /* on 1 rank, rank 0 itself verifies rank_1.json */
    e.msg[0] = "rank_0.json and ";
    e.msg[1] = "rank_1.json disagree on optimizer steps (5 vs 4)";
    TH_RANKS_ENV(1, load_fails, &e);
    /* on 2 ranks, rank 1 finds it; rank 0 names rank 1 */
    e.j.per_rank = GLOBAL / 2;
    e.status = EM_ERR_DIST;
    e.msg[0] = "rank 1 failed";
    e.msg[1] = NULL;
    TH_RANKS_ENV(2, load_fails, &e);
}

TEST(test_load_state_on_another_world_refuses_a_state_without_its_global_batch)
{
    expect e = {.status = EM_ERR_ARG};
    save_two_rank_state(&e.j);
    for (int r = 0; r < 2; r++) { /* as an ember of before this change wrote them */
        char p[PATH_MAX];
        th_pathf(p, sizeof p, "%s/rank_%d.json", e.j.dir, r);
        edit_file(p, "\"loader.global_batch\": \"8\",", "");
    }
    th_reseal_checkpoint(e.j.dir);
    e.j.per_rank = GLOBAL;
    e.msg[0] = "does not record its loader's global batch";
    e.msg[1] = "resumes only on the 2 processes that saved it; this run has 1";
    TH_RANKS_ENV(1, load_fails, &e);
}

/* ---- per-rank generators -------------------------------------------------------------- */

/* Rank r saves a registered generator {100 + r, 7 r} and a default one
 * {200 + r, 3 r}; a run of another size loads them and rank r must hold
 * saved rank r % 2's. */
typedef struct gen_job {
    char dir[PATH_MAX];
    bool save;
} gen_job;

static void generators(int rank, int world, void *ctx)
{
    (void)world;
    gen_job *g = ctx;
    th_no_user_config();
    em_accelerator *acc = em_accelerator_new(NULL);
    CHECK_NOTNULL(acc);
    em_rng mine = {0, 0};
    CHECK_OK(em_accel_register_rng(acc, &mine));
    if (g->save) {
        mine = (em_rng){100 + (uint64_t)rank, 7 * (uint64_t)rank};
        *em_default_rng() = (em_rng){200 + (uint64_t)rank, 3 * (uint64_t)rank};
        CHECK_OK(em_accel_save_state(acc, g->dir));
    } else {
        CHECK_OK(em_accel_load_state(acc, g->dir));
        uint64_t src = (uint64_t)(rank % 2);
        CHECK(mine.seed == 100 + src && mine.offset == 7 * src);
        CHECK(em_default_rng()->seed == 200 + src && em_default_rng()->offset == 3 * src);
    }
    em_accelerator_free(acc);
}

TEST(test_load_state_on_another_world_gives_rank_r_the_generators_of_saved_rank_r_mod_w)
{
    gen_job g = {.save = true};
    th_pathf(g.dir, sizeof g.dir, "%s/state", new_base());
    TH_RANKS_ENV(2, generators, &g);
    g.save = false;
    TH_RANKS_ENV(4, generators, &g);
    TH_RANKS_ENV(1, generators, &g);
}

/* ---- the window sampler ------------------------------------------------------------------ */

typedef struct sampler_job {
    char dir[PATH_MAX];
    int64_t batch; /* the sampler's (global) batch */
    bool save;
} sampler_job;

/* Saves (2 ranks, after one draw) or loads a prepared window sampler. */
static void sampler_state(int rank, int world, void *ctx)
{
    (void)world;
    sampler_job *sj = ctx;
    th_no_user_config();
    em_accelerator *acc = em_accelerator_new(NULL);
    CHECK_NOTNULL(acc);
    static int32_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = i % 7;
    em_tokens tokens = em_tokens_view(tok, 100, EM_TOK_I32);
    em_window_sampler s;
    CHECK_OK(em_window_sampler_init(&s, &tokens, sj->batch, 4, 9));
    CHECK_OK(em_accel_prepare_sampler(acc, &s));
    if (sj->save) {
        em_scope sc = em_scope_begin();
        em_batch b;
        CHECK_OK(em_window_sampler_next(&s, &b));
        em_scope_end(sc);
        CHECK_OK(em_accel_save_state(acc, sj->dir));
    } else if (sj->batch == 8) {
        CHECK_OK(em_accel_load_state(acc, sj->dir));
        CHECK(s.rng.seed == 9 && s.rng.offset == 8); /* global: one draw of 8 windows */
    } else {
        em_clear_error();
        CHECK(em_accel_load_state(acc, sj->dir) == EM_ERR_ARG);
        CHECK(rank != 0 ||
              strstr(em_last_error(), "window sampler drawing 8 windows a batch (all processes "
                                      "together); this run's draws 4: keep the global batch at 8"));
    }
    em_accelerator_free(acc);
}

TEST(test_load_state_on_another_world_keeps_the_global_window_sampler_and_refuses_another_batch)
{
    sampler_job sj = {.batch = 8, .save = true};
    th_pathf(sj.dir, sizeof sj.dir, "%s/state", new_base());
    TH_RANKS_ENV(2, sampler_state, &sj);
    sj.save = false;
    TH_RANKS_ENV(4, sampler_state, &sj);
    TH_RANKS_ENV(1, sampler_state, &sj);
    sj.batch = 4;
    TH_RANKS_ENV(1, sampler_state, &sj);
}
