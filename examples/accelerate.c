/* accelerate.c — one training program from prepare to save_model, the way a
 * Hugging Face Accelerate script is written; the README's walk-through.
 *
 * What it shows:
 *   - an Accelerator configured in code (accumulation, a project directory
 *     with numbered checkpoints and a total limit, trackers) while mixed
 *     precision and the rest still come from the config file / environment;
 *   - prepare called twice: the model, its optimizer, the training loader
 *     and a linear warmup-then-decay schedule, then the evaluation loader;
 *   - the loop: em_accel_next (1 batch / 0 end of epoch / -1 error),
 *     accumulate, backward, clip, step and zero_grad (acting on sync steps);
 *   - evaluation in an autocast region, with gather_for_metrics counting
 *     every example of the evaluation set exactly once on any number of
 *     processes;
 *   - logging to JSON lines and TensorBoard, a checkpoint per epoch that
 *     --resume continues from, and the final weights as sharded safetensors
 *     with a Hugging Face index.
 *
 * The task: fit y = sin(3x) on [-1, 1] from noisy samples with a small MLP.
 *
 *   ./build/examples/accelerate [--out DIR] [--epochs N] [--stop-after K] [--resume]
 *   ./build/ember launch -n 2 ./build/examples/accelerate --out DIR
 *
 * DIR (default accelerate-out) receives checkpoints/checkpoint_N (the last
 * two), runs/fit/ (metrics.jsonl and a TensorBoard event file) and model/
 * (the weights). --stop-after K ends the run after K epochs, as an
 * interruption would (no save_model); --resume then continues it, and the
 * weights come out bitwise those of an uninterrupted run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/ember.h"

enum { N_TRAIN = 1000, N_EVAL = 250, BATCH = 16, EVAL_BATCH = 64, HIDDEN = 64 };

/* ---- the data: (x, y) pairs in plain arrays behind em_dataset -------------------- */

typedef struct points {
    float *x, *y;
    int64_t n;
} points;

static int64_t points_len(void *user) { return ((points *)user)->n; }

static em_status points_get(void *user, int64_t i, void *x, void *y)
{
    points *p = user;
    *(float *)x = p->x[i];
    *(float *)y = p->y[i];
    return EM_OK;
}

static void points_free(void *user)
{
    points *p = user;
    free(p->x);
    free(p->y);
    free(p);
}

/* n points: x evenly spaced over [-1, 1] (eval) or uniform (train), y =
 * sin(3x) plus noise of std `noise`. Every rank builds the same data (the
 * same seed); the loader gives each rank its share. */
static em_dataset *make_points(int64_t n, bool uniform, double noise, em_rng *rng)
{
    points *p = malloc(sizeof *p);
    if (!p) return NULL;
    *p = (points){malloc(sizeof(float) * (size_t)n), malloc(sizeof(float) * (size_t)n), n};
    em_tensor *u = em_rand(EM_F32, EM_SHAPE(n), rng), *z = em_randn(EM_F32, EM_SHAPE(n), rng);
    if (p->x && p->y && u && z) {
        for (int64_t i = 0; i < n; i++) {
            float x = uniform ? 2 * ((const float *)em_data(u))[i] - 1 : -1 + 2 * (float)i / (float)(n - 1);
            p->x[i] = x;
            p->y[i] = sinf(3 * x) + (float)noise * ((const float *)em_data(z))[i];
        }
    }
    em_free(u);
    em_free(z);
    em_dataset def = {.len = points_len,
                      .get = points_get,
                      .free = points_free,
                      .user = p,
                      .x_field = {EM_F32, 1, {1}},
                      .y_field = {EM_F32, 1, {1}}};
    em_dataset *ds = p->x && p->y ? em_dataset_new(&def) : NULL;
    if (!ds) points_free(p);
    return ds;
}

/* ---- the model: Linear(1,64) GELU Dropout Linear(64,64) GELU Linear(64,1) -------- */

typedef struct mlp {
    em_module *root;
    em_nn_linear *in, *mid, *out;
    em_nn_dropout *drop; /* its generator belongs to the module: checkpoints keep it */
} mlp;

static em_status mlp_init(mlp *m, em_rng *rng)
{
    m->root = em_module_new(NULL, "");
    m->in = em_nn_linear_new(m->root, "in", 1, HIDDEN, true, rng);
    m->drop = em_nn_dropout_new(m->root, "drop", 0.1, rng);
    m->mid = em_nn_linear_new(m->root, "mid", HIDDEN, HIDDEN, true, rng);
    m->out = em_nn_linear_new(m->root, "out", HIDDEN, 1, true, rng);
    return m->out ? EM_OK : em_last_status();
}

/* x (N,1) -> (N,1), in the caller's scope. */
static em_tensor *mlp_forward(mlp *m, em_tensor *x)
{
    em_tensor *h = em_nn_dropout_forward(m->drop, em_gelu(em_nn_linear_forward(m->in, x)));
    h = em_gelu(em_nn_linear_forward(m->mid, h));
    return em_nn_linear_forward(m->out, h);
}

/* ---- evaluation: mean squared error over the whole evaluation set ---------------- */

/* Iterates the prepared evaluation loader with em_loader_next (em_accel_next
 * is the training loader's); gather_for_metrics drops the examples that the
 * last batch repeats to keep the ranks even, so *count ends equal to N_EVAL
 * on any number of processes. */
static em_status evaluate(em_accelerator *acc, mlp *m, em_loader *eval, double *mse, int64_t *count)
{
    em_module_train(m->root, false);
    bool grad = em_set_grad_enabled(false);
    em_status st = em_accel_autocast_begin(acc); /* the forward runs under the mixed precision */
    double sum = 0;
    int64_t n = 0;
    em_batch b;
    int r;
    while (st == EM_OK && (r = em_loader_next(eval, &b)) != 0) {
        em_scope s = em_scope_begin();
        em_tensor *err = NULL, *all = NULL;
        if (r > 0) {
            em_tensor *d = em_sub(mlp_forward(m, b.x), b.y);
            err = em_mul(d, d);
        }                                                     /* (B,1) */
        if (err) all = em_accel_gather_for_metrics(acc, err); /* (examples of all ranks, 1) */
        if (all) {
            sum += em_item(em_sum(em_cast(all, EM_F64), 0, NULL, false));
            n += em_shape(all)[0];
        } else {
            st = em_last_status();
        }
        em_scope_end(s);
    }
    em_status end = em_accel_autocast_end(acc);
    em_set_grad_enabled(grad);
    em_module_train(m->root, true);
    *mse = n ? sum / (double)n : NAN;
    *count = n;
    return st ? st : end;
}

/* ---- the program ------------------------------------------------------------------ */

static int fail(const char *what)
{
    fprintf(stderr, "accelerate: %s: %s\n", what, em_last_error());
    return 1;
}

/* What the program holds; run() fills it, main frees it whatever happened. */
typedef struct program {
    const char *out;
    int epochs, stop_after;
    bool resume;
    em_accelerator *acc;
    em_dataset *train_ds, *eval_ds;
    em_loader *train, *eval;
    mlp m;
    em_optimizer *opt;
} program;

/* Steps 1 to 6; 0 on success, 1 (after printing why) on a failure. */
static int run(program *p)
{
    char logdir[4096], modeldir[4096];
    snprintf(logdir, sizeof logdir, "%s/runs", p->out);
    snprintf(modeldir, sizeof modeldir, "%s/model", p->out);

    /* 1. The Accelerator: what is set here wins over the config file and the
     *    environment (EMBER_MIXED_PRECISION=bf16 still applies). */
    em_accelerator *acc = p->acc = em_accelerator_new(&(em_accel_config){
        .grad_accum = 2,
        .project_dir = p->out,
        .automatic_checkpoint_naming = true,
        .total_limit = 2,
        .log_with = EM_TRACK_JSONL | EM_TRACK_TENSORBOARD,
        .logging_dir = logdir,
    });
    if (!acc) return fail("em_accelerator_new");

    /* 2. Data, model and optimizer, built the same on every rank. */
    em_rng rng = em_rng_new(1);
    p->train_ds = make_points(N_TRAIN, true, 0.1, &rng);
    p->eval_ds = make_points(N_EVAL, false, 0, &rng);
    em_loader *train = p->train =
        p->train_ds
            ? em_loader_new(p->train_ds, &(em_loader_config){.batch_size = BATCH, .shuffle = true, .seed = 1})
            : NULL;
    em_loader *eval = p->eval =
        p->eval_ds ? em_loader_new(p->eval_ds, &(em_loader_config){.batch_size = EVAL_BATCH}) : NULL;
    mlp *m = &p->m;
    if (!train || !eval || mlp_init(m, &rng)) return fail("data and model");
    em_named ps[16];
    em_tensor *params[16];
    int np = em_module_params(m->root, ps, 16);
    for (int i = 0; i < np; i++) params[i] = ps[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-2;
    em_optimizer *opt = p->opt = em_adamw_new(np, params, &ac);
    if (!opt) return fail("em_adamw_new");

    /* 3. prepare: the model (DDP when there are several processes), its
     *    optimizer, the training loader (sharded) and the schedule that drives
     *    that optimizer; then the evaluation loader (sharded, padded even). */
    int epochs = p->epochs;
    int64_t global = (int64_t)BATCH * em_accel_world(acc);               /* each rank draws BATCH examples */
    int64_t steps_per_epoch = ((N_TRAIN + global - 1) / global + 1) / 2; /* 2 micro-batches a step */
    em_lr_schedule sched = {
        .kind = EM_LR_LINEAR_HF, .base_lr = 1e-2, .warmup = 10, .total = epochs * steps_per_epoch};
    if (em_accel_prepare(acc, m->root, opt, train, &sched) || em_accel_prepare(acc, NULL, NULL, eval, NULL))
        return fail("em_accel_prepare");

    /* 4. --resume: the newest complete checkpoint_N puts everything back:
     *    weights, optimizer, schedule, both loaders' positions, generators
     *    (dropout's included), so the run continues as if never stopped. */
    char ckpt[4096];
    int have = p->resume ? em_accel_latest_checkpoint(acc, ckpt, sizeof ckpt) : 0;
    if (have < 0) return fail("em_accel_latest_checkpoint");
    if (have > 0) {
        if (em_accel_load_state(acc, NULL)) return fail("em_accel_load_state");
        em_accel_print(acc, "resumed from %s at step %lld\n", ckpt, (long long)em_accel_step_count(acc));
    }
    if (em_accel_init_trackers(acc, "fit", &(em_tracker_config){.append = have > 0}))
        return fail("em_accel_init_trackers");
    em_accel_print(acc, "%d process(es), %lld parameters, %s\n", em_accel_world(acc),
                   (long long)em_module_num_params(m->root), em_dtype_name(em_accel_autocast_dtype(acc)));

    /* 5. The loop. */
    for (int64_t epoch = em_loader_position(train).epoch; epoch < epochs; epoch++) {
        double loss_sum = 0;
        int64_t micro = 0;
        em_batch b;
        int r;
        while ((r = em_accel_next(acc, &b)) > 0) {
            em_scope s = em_scope_begin();
            em_accel_accumulate(acc);
            em_tensor *loss = em_mse_loss(mlp_forward(m, b.x), b.y);
            em_status st = em_accel_backward(acc, loss);
            if (!st) em_accel_clip_grad_norm(acc, 1.0, &st);
            if (!st) st = em_accel_step(acc);
            if (!st) st = em_accel_zero_grad(acc);
            if (!st) loss_sum += em_item(loss);
            em_scope_end(s);
            if (st) return fail("training step");
            micro++;
        }
        if (r < 0) return fail("em_accel_next");

        double mse;
        int64_t count;
        if (evaluate(acc, m, eval, &mse, &count)) return fail("evaluation");
        double lr = em_optim_get_lr(opt, 0), train_loss = loss_sum / (double)(micro ? micro : 1);
        em_accel_print(
            acc, "epoch %lld | step %4lld | train loss %.4f | eval mse %.4f over %lld points | lr %.2e\n",
            (long long)epoch, (long long)em_accel_step_count(acc), train_loss, mse, (long long)count, lr);
        if (em_accel_log(acc, -1, 3,
                         (em_metric[]){{"train_loss", train_loss}, {"eval_mse", mse}, {"lr", lr}}))
            return fail("em_accel_log");
        /* checkpoints/checkpoint_N; the oldest beyond the last 2 are removed */
        if (em_accel_save_state(acc, NULL)) return fail("em_accel_save_state");
        if (p->stop_after && epoch + 1 == p->stop_after) {
            em_accel_print(acc, "stopping after epoch %lld (--stop-after)\n", (long long)epoch);
            return 0; /* em_accelerator_free closes the trackers' files */
        }
    }

    /* 6. The end: close the trackers, write the weights for inference or
     *    another framework (shards of at most 8 KiB here, to show the index). */
    if (em_accel_end_training(acc)) return fail("em_accel_end_training");
    if (em_accel_save_model(acc, m->root, modeldir, &(em_save_model_config){.max_shard_size = 8192}))
        return fail("em_accel_save_model");
    em_accel_print(acc, "wrote %s (safetensors shards and model.safetensors.index.json)\n", modeldir);

    return 0;
}

int main(int argc, char **argv)
{
    program p = {.out = "accelerate-out", .epochs = 6};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            p.out = argv[++i];
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc && (p.epochs = atoi(argv[++i])) > 0)
            ;
        else if (!strcmp(argv[i], "--stop-after") && i + 1 < argc && (p.stop_after = atoi(argv[++i])) > 0)
            ;
        else if (!strcmp(argv[i], "--resume"))
            p.resume = true;
        else {
            fprintf(stderr,
                    "accelerate: unknown or incomplete flag '%s'\n"
                    "usage: accelerate [--out DIR] [--epochs N>0] [--stop-after K>0] [--resume]\n",
                    argv[i]);
            return 2;
        }
    }
    int rc = run(&p);
    em_accelerator_free(p.acc);
    em_optim_free(p.opt);
    em_module_free(p.m.root);
    em_loader_free(p.train);
    em_loader_free(p.eval);
    em_dataset_free(p.train_ds);
    em_dataset_free(p.eval_ds);
    return rc;
}
