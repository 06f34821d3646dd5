/* cmd_train.c — `ember train`: trains a character-level GPT on a text file.
 *
 * The loop is nanoGPT's: random windows of block+1 characters from the
 * first 90% of the file, AdamW with decay on matrices only, linear warm-up
 * then cosine decay of the learning rate, global-norm clipping, and an
 * evaluation on both splits every --eval-every steps (and at the end) that
 * prints `eval step=N train_loss=X val_loss=Y`. It writes DIR/model.safetensors,
 * DIR/config (model shape and vocabulary) and DIR/metrics.jsonl, and the
 * whole resumable state in DIR/state (em_accel_save_state).
 *
 * It runs through the Accelerator, so `ember launch -n N ember train ...`
 * trains with DDP: --batch is the global batch, each rank draws its share of
 * the same windows (batch % N == 0), and the result matches one process up
 * to float reassociation. Rank 0 prints and writes the files.
 *
 * --resume DIR continues from a checkpoint, also on another number of
 * processes (the global --batch stays, so the run goes on with the same
 * windows; with --dropout the masks then differ, see em_accel_load_state).
 * --resume auto is for `ember launch --max-restarts`: each attempt resumes
 * from OUT/state when it holds a checkpoint and otherwise starts fresh (and
 * says so, with an empty metrics file); a checkpoint that fails to load is
 * an error, never a fresh start. The fault points "train.step" (the end of
 * each step) and "train.save" (a save begins) let EMBER_FAULT kill a run
 * there, as do those of every write, fsync and rename of the files and of
 * the checkpoint (tensor/fault_impl.h lists them all).
 *
 * --save-total-limit K saves each checkpoint as OUT/checkpoints/checkpoint_N
 * instead (the Accelerator's automatic naming: N counts up, the newest K are
 * kept), and --resume auto then takes the newest complete one. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "dist/checkpoint_impl.h"
#include "ember/ember.h"
#include "mem_check.h"
#include "progress.h"
#include "tensor/fault_impl.h"
#include "tensor/fileio_impl.h"
#include "train_config.h"

typedef struct train_opts {
    const char *data, *out, *init, *resume;
    const char *device; /* NULL: the config file / EMBER_DEVICE, else cpu */
    em_gpt_config model;
    int64_t batch, iters, warmup, eval_every, eval_iters, log_every, grad_accum;
    int64_t zero; /* --zero: ZeRO stage + 1 (0: not given) */
    int64_t save_total_limit; /* > 0: checkpoints as OUT/checkpoints/checkpoint_N, the newest K kept */
    double lr, min_lr, weight_decay, beta1, beta2, grad_clip;
    uint64_t seed;
    bool bytes;
    bool resume_auto; /* --resume auto: resume is OUT/state when it holds a checkpoint, else NULL */
    bool no_memory_check;        /* --no-memory-check: start even when the estimate exceeds the memory */
    bool zero_offload;           /* --zero-offload: ZeRO's optimizer state in host memory (CUDA) */
    em_precision_kind precision; /* DEFAULT: the config file / EMBER_MIXED_PRECISION */
    int log_with;                /* EM_TRACK_* beyond metrics.jsonl (--log-with, else EMBER_LOG_WITH) */
    bool log_with_set;
    const char *logging_dir; /* NULL: OUT/runs */
} train_opts;

static int usage(FILE *f)
{
    fprintf(
        f,
        "usage: ember train --data FILE.txt [options]\n"
        "  --out DIR          where model.safetensors, config, metrics.jsonl go (default out)\n"
        "  --layers N --heads N --embd N --block N   model shape (default 4 4 128 64)\n"
        "  --batch N --iters N                        (default 12, 2000); the batch is global: each of\n"
        "                                             N processes under `ember launch` takes batch/N\n"
        "  --grad-accum K                             micro-batches per step (default: config file, 1)\n"
        "  --zero S                                   ZeRO stage under `ember launch`: 0 DDP, 1 shard the\n"
        "                                             optimizer state, 2 and the gradients, 3 and the\n"
        "                                             parameters (default: config zero_stage,\n"
        "                                             EMBER_ZERO_STAGE, else 0)\n"
        "                                             (3 on a device: only this rank's chunks of the\n"
        "                                             parameters stay mapped between uses, in 2 MiB\n"
        "                                             granules; the gradient buffer stays allocated)\n"
        "  --zero-offload                             with --zero 1|2|3 and --device cuda: the optimizer\n"
        "                                             state in host memory, updated on the CPU\n"
        "  --mixed-precision no|bf16|fp16             autocast forward passes, f32 master weights; fp16\n"
        "                                             with dynamic loss scaling (default: config file, no)\n"
        "  --lr X --min-lr X --warmup N               AdamW lr, cosine to min-lr after warm-up\n"
        "                                             (default 1e-3, 1e-4, 100)\n"
        "  --weight-decay X --beta1 X --beta2 X       (default 0.1, 0.9, 0.99)\n"
        "  --grad-clip X --dropout X --seed N         (default 1.0, 0, 1337)\n"
        "  --eval-every N --eval-iters N --log-every N (default 250, 200, 10)\n"
        "  --device cpu|cuda|cuda:N                   where to train (default cpu; cuda is cuda:LOCAL_RANK,\n"
        "                                             one device per process under `ember launch`); --cpu\n"
        "  --init FILE.safetensors                    start from these weights (names as ember saves them)\n"
        "  --resume DIR|auto                          continue a run from its checkpoint DIR (OUT/state)\n"
        "                                             with the same flags; the process count may change\n"
        "                                             if --batch divides over it. auto: from OUT/state\n"
        "                                             when it holds one, else start fresh (for `ember\n"
        "                                             launch --max-restarts`); a checkpoint that cannot be\n"
        "                                             loaded is an error, never a fresh start\n"
        "  --save-total-limit K                       checkpoints go to OUT/checkpoints/checkpoint_N (N\n"
        "                                             counting up), keeping the newest K; --resume auto\n"
        "                                             takes the newest of them\n"
        "  --bytes                                    byte vocabulary instead of the file's characters\n"
        "  --no-memory-check                          start even when the estimated memory per process\n"
        "                                             (ember estimate-memory) exceeds what is available\n"
        "  --no-bias                                  no biases in Linear and LayerNorm\n"
        "  --gelu exact|tanh                          MLP activation (default exact, as nanoGPT)\n"
        "  --log-with tensorboard|jsonl|all|none      trackers beside OUT/metrics.jsonl (always written):\n"
        "                                             tensorboard: event files in LOGDIR/<name of OUT>\n"
        "                                             for `tensorboard --logdir LOGDIR` (default:\n"
        "                                             EMBER_LOG_WITH, else none)\n"
        "  --logging-dir LOGDIR                       (default OUT/runs)\n");
    return f == stderr ? 2 : 0;
}

/* Parses a flag value: an integer in [min, max] (nothing wraps: a value
 * past max is refused, naming the range) or a float (>= 0). */
static bool parse_int(const char *flag, const char *s, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < min || v > max) {
        fprintf(stderr, "ember train: %s needs an integer from %lld to %lld, got '%s'\n", flag, (long long)min,
                (long long)max, s);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_real(const char *flag, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= 0) || isinf(v)) {
        fprintf(stderr, "ember train: %s needs a number >= 0, got '%s'\n", flag, s);
        return false;
    }
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, train_opts *o)
{
    *o = (train_opts){.out = "out",
                      .model = {.n_layer = 4, .n_head = 4, .n_embd = 128, .block_size = 64, .bias = true},
                      .batch = 12,
                      .iters = 2000,
                      .warmup = 100,
                      .eval_every = 250,
                      .eval_iters = 200,
                      .log_every = 10,
                      .lr = 1e-3,
                      .min_lr = 1e-4,
                      .weight_decay = 0.1,
                      .beta1 = 0.9,
                      .beta2 = 0.99,
                      .grad_clip = 1.0,
                      .seed = 1337};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return usage(stdout) - 1; /* -1: done, exit 0 */
        if (!strcmp(f, "--bytes")) {
            o->bytes = true;
            continue;
        }
        if (!strcmp(f, "--cpu")) {
            o->device = "cpu";
            continue;
        }
        if (!strcmp(f, "--no-memory-check")) {
            o->no_memory_check = true;
            continue;
        }
        if (!strcmp(f, "--zero-offload")) {
            o->zero_offload = true;
            continue;
        }
        if (!strcmp(f, "--no-bias")) {
            o->model.bias = false;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "ember train: %s needs a value\n", f);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n;
        bool ok = true;
        if (!strcmp(f, "--init")) o->init = v;
        else if (!strcmp(f, "--device")) {
            em_device d;
            ok = em_device_parse(v, 0, &d) == EM_OK;
            if (ok) o->device = v;
            else fprintf(stderr, "ember train: --device needs cpu, cuda or cuda:N, got '%s'\n", v);
        } else if (!strcmp(f, "--resume")) {
            o->resume = v;
            o->resume_auto = !strcmp(v, "auto");
        } else if (!strcmp(f, "--grad-accum"))
            ok = parse_int(f, v, 1, 1 << 20, &o->grad_accum);
        else if (!strcmp(f, "--zero")) {
            ok = parse_int(f, v, 0, 3, &o->zero);
            if (ok) o->zero++;
        }
        else if (!strcmp(f, "--save-total-limit"))
            ok = parse_int(f, v, 1, 1 << 20, &o->save_total_limit);
        else if (!strcmp(f, "--mixed-precision")) {
            ok = em_precision_parse(v, &o->precision) == EM_OK;
            if (!ok) fprintf(stderr, "ember train: --mixed-precision needs no, bf16 or fp16, got '%s'\n", v);
        }
        else if (!strcmp(f, "--data"))
            o->data = v;
        else if (!strcmp(f, "--log-with")) {
            ok = em_tracker_parse(v, &o->log_with) == EM_OK;
            o->log_with_set = true;
            if (!ok)
                fprintf(stderr, "ember train: --log-with needs tensorboard, jsonl, all or none, got '%s'\n",
                        v);
        } else if (!strcmp(f, "--logging-dir"))
            o->logging_dir = v;
        else if (!strcmp(f, "--gelu")) {
            ok = !strcmp(v, "exact") || !strcmp(v, "tanh");
            if (ok)
                o->model.gelu_tanh = !strcmp(v, "tanh");
            else
                fprintf(stderr, "ember train: --gelu needs exact or tanh, got '%s'\n", v);
        } else if (!strcmp(f, "--out"))
            o->out = v;
        else if (!strcmp(f, "--layers"))
            ok = parse_int(f, v, 1, 1024, &n) && ((o->model.n_layer = n), true);
        else if (!strcmp(f, "--heads"))
            ok = parse_int(f, v, 1, 1024, &n) && ((o->model.n_head = n), true);
        else if (!strcmp(f, "--embd"))
            ok = parse_int(f, v, 1, 1 << 16, &n) && ((o->model.n_embd = n), true);
        else if (!strcmp(f, "--block"))
            ok = parse_int(f, v, 1, 1 << 20, &n) && ((o->model.block_size = n), true);
        else if (!strcmp(f, "--batch"))
            ok = parse_int(f, v, 1, 1 << 24, &o->batch);
        else if (!strcmp(f, "--iters"))
            ok = parse_int(f, v, 0, (int64_t)1 << 40, &o->iters);
        else if (!strcmp(f, "--warmup"))
            ok = parse_int(f, v, 0, (int64_t)1 << 40, &o->warmup);
        else if (!strcmp(f, "--eval-every"))
            ok = parse_int(f, v, 1, (int64_t)1 << 40, &o->eval_every);
        else if (!strcmp(f, "--eval-iters"))
            ok = parse_int(f, v, 1, 1 << 30, &o->eval_iters);
        else if (!strcmp(f, "--log-every"))
            ok = parse_int(f, v, 1, (int64_t)1 << 40, &o->log_every);
        else if (!strcmp(f, "--seed"))
            ok = parse_int(f, v, 0, INT64_MAX, &n) && ((o->seed = (uint64_t)n), true);
        else if (!strcmp(f, "--lr"))
            ok = parse_real(f, v, &o->lr);
        else if (!strcmp(f, "--min-lr"))
            ok = parse_real(f, v, &o->min_lr);
        else if (!strcmp(f, "--weight-decay"))
            ok = parse_real(f, v, &o->weight_decay);
        else if (!strcmp(f, "--beta1"))
            ok = parse_real(f, v, &o->beta1);
        else if (!strcmp(f, "--beta2"))
            ok = parse_real(f, v, &o->beta2);
        else if (!strcmp(f, "--grad-clip"))
            ok = parse_real(f, v, &o->grad_clip);
        else if (!strcmp(f, "--dropout"))
            ok = parse_real(f, v, &o->model.dropout);
        else {
            fprintf(stderr, "ember train: unknown flag '%s'\n", f);
            usage(stderr);
            return 2;
        }
        if (!ok) return 2;
    }
    const char *env = getenv("EMBER_LOG_WITH");
    if (!o->log_with_set && env && *env && em_tracker_parse(env, &o->log_with)) {
        fprintf(stderr, "ember train: EMBER_LOG_WITH needs tensorboard, jsonl, all or none, got '%s'\n", env);
        return 2;
    }
    if (!o->data) {
        fprintf(stderr, "ember train: --data FILE is required\n");
        usage(stderr);
        return 2;
    }
    if (o->beta1 >= 1 || o->beta2 >= 1 || o->model.dropout >= 1) {
        fprintf(stderr, "ember train: --beta1, --beta2 and --dropout must be below 1\n");
        return 2;
    }
    if (o->model.n_embd % o->model.n_head) {
        fprintf(stderr, "ember train: --embd %lld is not a multiple of --heads %lld\n",
                (long long)o->model.n_embd, (long long)o->model.n_head);
        return 2;
    }
    return 0;
}

/* ---- the run ------------------------------------------------------------------ */

typedef struct run {
    train_opts o;
    em_accelerator *acc;
    bool main; /* rank 0: prints and writes the files */
    em_text *text;
    em_tokens train, val;
    em_gpt *gpt;
    em_optimizer *opt;
    em_lr_schedule sched;
    em_window_sampler sampler, eval_sampler[2];
    char path[4096];
    char logdir[4096]; /* the trackers' LOGDIR and run name, when --log-with tensorboard */
    char run_name[256];
    char state[4096]; /* OUT/state, when --resume auto finds a checkpoint there */
    double base_rss;  /* the resident set before the model existed: the estimate's runtime */
} run;

static const char *in_out(run *r, const char *name)
{
    snprintf(r->path, sizeof r->path, "%s/%s", r->o.out, name);
    return r->path;
}

/* Mean loss over eval_iters random batches of each split, in eval mode. Each
 * rank evaluates its share of every batch; the means are averaged over the
 * ranks (equal shares, so this is the mean over the whole batches). */
static em_status evaluate(run *r, double loss[2])
{
    bool prev = em_set_grad_enabled(false);
    em_module_train(r->gpt->m, false);
    em_status s = em_accel_autocast_begin(r->acc); /* evaluation forwards in the run's precision too */
    double local[2] = {0, 0};
    for (int split = 0; split < 2 && !s; split++) {
        for (int64_t i = 0; i < r->o.eval_iters && !s; i++) {
            em_scope sc = em_scope_begin();
            em_batch b;
            s = em_window_sampler_next(&r->eval_sampler[split], &b);
            if (!s) s = em_accel_to_device(r->acc, &b);
            em_tensor *l = s ? NULL : em_gpt_loss(r->gpt, b.x, b.y);
            if (!s && !l) s = em_last_status();
            if (!s) local[split] += em_item(l);
            em_scope_end(sc);
        }
        local[split] /= (double)r->o.eval_iters;
    }
    em_accel_autocast_end(r->acc);
    em_module_train(r->gpt->m, true);
    em_set_grad_enabled(prev);
    if (s) return s;
    em_scope sc = em_scope_begin();
    em_tensor *t = em_empty(EM_F64, 1, (int64_t[]){2});
    if (t) memcpy(em_data(t), local, sizeof local);
    em_tensor *avg = t ? em_accel_reduce(r->acc, t, EM_RED_AVG) : NULL;
    if (avg) memcpy(loss, em_data(avg), sizeof local);
    s = avg ? EM_OK : em_last_status();
    em_scope_end(sc);
    return s;
}

/* The model and config (rank 0), then every rank's resumable state. Each is
 * written atomically and carries a checksum (crash-safe: the fault tests kill
 * -9 at every write, fsync and rename). The weights come first, so DIR/state
 * at step k always sits beside weights of step k or later, and a run resumed
 * from it rewrites them. */
static em_status save(run *r)
{
    fault_point("train.save"); /* EMBER_FAULT: a crash as a save begins */
    /* ZeRO-3: every rank gathers the whole model (collective), rank 0 writes it */
    em_status s = em_accel_gather_params(r->acc);
    if (!s && r->main) {
        s = em_module_save(r->gpt->m, in_out(r, "model.safetensors"));
        if (!s) s = run_config_write(in_out(r, "config"), &r->gpt->cfg, &r->text->vocab);
    }
    /* collective: every rank calls it even if rank 0 failed above, and it
     * fails on every rank if any did */
    em_status st = em_accel_save_state(r->acc, r->o.save_total_limit ? NULL : in_out(r, "state"));
    return s ? s : st;
}

/* One optimisation step of grad_accum micro-batches; *loss gets the mean
 * loss over the step's whole (global) batch. */
static em_status train_step_body(run *r, double *loss, double *norm);

/* The profiler sees the step, its forwards (here) and backwards (the
 * Accelerator) as ranges. */
static em_status train_step(run *r, double *loss, double *norm)
{
    em_profile_range_begin("step");
    em_status s = train_step_body(r, loss, norm);
    em_profile_range_end();
    return s;
}

static em_status train_step_body(run *r, double *loss, double *norm)
{
    em_status s = EM_OK;
    int k = em_accel_grad_accum(r->acc);
    double sum = 0;
    for (int micro = 0; micro < k && !s; micro++) {
        em_scope sc = em_scope_begin();
        em_accel_accumulate(r->acc);
        em_batch b;
        s = em_window_sampler_next(&r->sampler, &b);
        if (!s) s = em_accel_to_device(r->acc, &b);
        em_profile_range_begin("forward");
        em_tensor *l = s ? NULL : em_gpt_loss(r->gpt, b.x, b.y);
        em_profile_range_end();
        if (!s && !l) s = em_last_status();
        if (!s) {
            sum += em_item(l);
            s = em_accel_backward(r->acc, l);
        }
        em_scope_end(sc);
    }
    if (!s && r->o.grad_clip > 0) *norm = em_accel_clip_grad_norm(r->acc, r->o.grad_clip, &s);
    if (!s) s = em_accel_step(r->acc);
    if (!s) s = em_accel_zero_grad(r->acc);
    if (s) return s;
    em_scope sc = em_scope_begin();
    em_tensor *t = em_scalar(EM_F64, sum / k);
    em_tensor *avg = t ? em_accel_reduce(r->acc, t, EM_RED_AVG) : NULL;
    if (avg) *loss = em_item(avg);
    s = avg ? EM_OK : em_last_status();
    em_scope_end(sc);
    return s;
}

/* AdamW with decay on matrices (embeddings, linear weights), not on biases
 * or norms, as nanoGPT groups them. */
static em_status make_optimizer(run *r)
{
    int n = em_module_params(r->gpt->m, NULL, 0);
    em_named *all = malloc(sizeof *all * (size_t)n);
    em_tensor **decay = malloc(sizeof *decay * (size_t)n), **nodecay = malloc(sizeof *nodecay * (size_t)n);
    em_status s = EM_OK;
    if (!all || !decay || !nodecay) {
        s = em_set_error(EM_ERR_OOM, "out of memory");
        goto out;
    }
    em_module_params(r->gpt->m, all, n);
    int nd = 0, nn = 0;
    for (int i = 0; i < n; i++) {
        if (em_ndim(all[i].t) >= 2)
            decay[nd++] = all[i].t;
        else
            nodecay[nn++] = all[i].t;
    }
    em_adam_config ac = em_adamw_defaults();
    ac.lr = r->o.lr;
    ac.beta1 = r->o.beta1;
    ac.beta2 = r->o.beta2;
    ac.weight_decay = r->o.weight_decay;
    r->opt = em_adamw_new(nd, decay, &ac);
    if (!r->opt || em_optim_add_group(r->opt, nn, nodecay, r->o.lr, 0.0) < 0) s = em_last_status();
out:
    free(all);
    free(decay);
    free(nodecay);
    return s;
}

/* Every dropout generator of the model, so a resume continues their masks. */
static em_status register_dropout_rngs(run *r)
{
    em_gpt *g = r->gpt;
    em_status s = em_accel_register_rng(r->acc, &g->drop->rng);
    for (int i = 0; i < g->cfg.n_layer && !s; i++) {
        s = em_accel_register_rng(r->acc, &g->h[i]->attn->resid_dropout->rng);
        if (!s) s = em_accel_register_rng(r->acc, &g->h[i]->mlp->dropout->rng);
    }
    return s;
}

/* The run's memory per rank (em_estimate_memory, for this model, batch,
 * precision, world and data), the figure check_fits compares and the end
 * of the run prints beside the measured peak. */
static em_status estimate(run *r, em_mem_estimate *e)
{
    em_mem_config c = em_mem_config_defaults();
    c.model = r->o.model;
    c.world = em_accel_world(r->acc);
    c.batch = r->o.batch / c.world;
    c.zero_stage = em_accel_zero_stage(r->acc);
    c.cuda = em_accel_device(r->acc).type == EM_CUDA;
    em_dtype dt = em_accel_autocast_dtype(r->acc);
    c.precision = dt == EM_BF16 ? EM_PREC_BF16 : dt == EM_F16 ? EM_PREC_FP16 : EM_PREC_NO;
    /* the text's tokens (i32, the splits are views of them) and the vocabulary */
    /* what this process holds now (libraries, CUDA's when built with it, the
     * pool, the text already read) is the runtime's baseline */
    if (!r->base_rss) r->base_rss = mem_rss(); /* the first call's: before the model exists */
    c.base_bytes = (size_t)r->base_rss;
    if (!c.base_bytes) /* unknown: the guess, plus the text's tokens and vocabulary */
        c.data_bytes = (size_t)r->text->tokens.n * sizeof(int32_t) + (size_t)r->text->vocab.size * 8;
    return em_estimate_memory(&c, e);
}

/* The part of estimate e a CUDA device holds: all but the runtime and the
 * communication segment (on the host), and the optimizer state under
 * --zero-offload. Under ZeRO stage 3 its parameters are this rank's share
 * plus the buckets whole at once and the 2 MiB granules the chunks straddle
 * (dist/zero.c), beside the full gradient buffer and the shard. */
static double device_part(const run *r, const em_mem_estimate *e)
{
    double need = (double)(e->total - e->bytes[EM_MEM_RUNTIME] - e->bytes[EM_MEM_COMM]);
    if (r->o.zero_offload) need -= (double)e->bytes[EM_MEM_OPTIMIZER]; /* on the host */
    return need;
}

/* Refuses, before the model is allocated, a run whose estimate per rank
 * (times the processes of this machine, em_accel_local_world) exceeds what this
 * process may use (mem_available: MemAvailable or a lower cgroup limit), or
 * whose device part exceeds a CUDA device's memory; the message names the
 * estimate, the memory and the biggest category. --no-memory-check skips it. */
static em_status check_fits(run *r)
{
    em_mem_estimate e;
    em_status s = estimate(r, &e);
    if (s || r->o.no_memory_check) return s;
    em_mem_category big = em_mem_biggest(&e);
    int local = em_accel_local_world(r->acc); /* the launcher's count of processes on this machine */
    if (local < 1) local = 1;
    double need = (double)e.total * local, have;
    char where[1200], b0[32], b1[32], b2[32];
    em_device dev = em_accel_device(r->acc);
    em_cuda_device_info info;
    if (dev.type == EM_CUDA && em_cuda_device_info_of(dev.index, &info) == EM_OK) {
        have = (double)info.total_memory; /* one device per process; the runtime stays on the host */
        need = device_part(r, &e);
        snprintf(where, sizeof where, "cuda:%d has", dev.index);
    } else {
        char what[1100];
        have = mem_available(what, sizeof what);
        snprintf(where, sizeof where, "%s says", what);
    }
    if (!(have > 0) || need <= have) return EM_OK;
    char procs[64] = "";
    if (local > 1 && dev.type != EM_CUDA)
        snprintf(procs, sizeof procs, " (x %d processes on this machine)", local);
    return em_set_error(
        EM_ERR_OOM,
        "the run cannot fit: it needs an estimated %s per process%s, %s of them %s, and %s %s "
        "are available; make --layers, --embd, --batch or the vocabulary smaller, "
        "or pass --no-memory-check to run anyway "
        "(ember estimate-memory shows the whole table)",
        mem_human((double)e.total, b0, sizeof b0), procs, mem_human((double)e.bytes[big], b1, sizeof b1),
        em_mem_category_name(big), where, mem_human(have, b2, sizeof b2));
}

/* A resumed run continues from its checkpoint at `step`, so the records a
 * killed run wrote after that checkpoint would come twice: path keeps only
 * the records up to step (rewritten atomically). A missing file is fine. */
static em_status keep_metrics_until(const char *path, int64_t step)
{
    char *buf;
    size_t n;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return EM_OK;
    if (file_read_all(path, (size_t)1 << 32, &buf, &n, "ember train")) return em_last_status();
    size_t kept = 0;
    for (size_t at = 0; at < n;) {
        char *nl = memchr(buf + at, '\n', n - at);
        size_t len = nl ? (size_t)(nl - (buf + at)) + 1 : n - at;
        long long k;
        /* a torn last line (no newline) or a record past the checkpoint goes */
        if (nl && sscanf(buf + at, "{\"step\": %lld", &k) == 1 && k <= step) {
            memmove(buf + kept, buf + at, len);
            kept += len;
        }
        at += len;
    }
    em_status s = kept == n ? EM_OK : file_write_atomic(path, buf, kept, "ember train");
    free(buf);
    return s;
}

/* Whether dir holds a checkpoint for --resume auto: anything but a missing
 * path or an empty directory counts (so a damaged checkpoint is loaded, and
 * fails, rather than silently trained over); so does a missing dir with a
 * DIR.old-* copy beside it (a save interrupted between the two renames of a
 * file system without atomic swaps: the load takes that copy). */
static em_status has_checkpoint(const char *dir, bool *yes)
{
    struct stat sb;
    *yes = false;
    if (stat(dir, &sb) != 0) {
        if (errno == ENOENT) {
            *yes = ckpt_has_old(dir);
            return EM_OK;
        }
        return em_set_error(EM_ERR_IO, "--resume auto: cannot look at %s: %s", dir, strerror(errno));
    }
    *yes = true;
    if (!S_ISDIR(sb.st_mode)) return EM_OK;
    DIR *d = opendir(dir);
    if (!d) return em_set_error(EM_ERR_IO, "--resume auto: cannot read %s: %s", dir, strerror(errno));
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    *yes = !empty;
    return EM_OK;
}

/* --resume auto: o->resume becomes OUT/state when it holds a checkpoint,
 * else NULL (a fresh start). Every rank looks, and all must see the same
 * (they share the directory, as a checkpoint needs). */
static em_status resolve_auto_resume(run *r)
{
    snprintf(r->state, sizeof r->state, "%s/state", r->o.out);
    bool yes;
    em_status s = EM_OK;
    if (r->o.save_total_limit) { /* the newest complete OUT/checkpoints/checkpoint_N */
        snprintf(r->state, sizeof r->state, "%s/checkpoints", r->o.out);
        char latest[sizeof r->state];
        int k = em_accel_latest_checkpoint(r->acc, latest, sizeof latest);
        yes = k > 0;
        if (k < 0) s = em_last_status();
        if (yes) snprintf(r->state, sizeof r->state, "%s", latest);
    } else {
        s = has_checkpoint(r->state, &yes);
    }
    int world = em_accel_world(r->acc);
    em_scope sc = em_scope_begin();
    em_tensor *t = em_scalar(EM_F64, s ? -1.0 : yes ? 1.0 : 0.0);
    em_tensor *lo = t ? em_accel_reduce(r->acc, t, EM_RED_MIN) : NULL;
    em_tensor *hi = lo ? em_accel_reduce(r->acc, t, EM_RED_MAX) : NULL;
    double min = lo ? em_item(lo) : 0, max = hi ? em_item(hi) : 0;
    em_status rs = hi ? EM_OK : em_last_status();
    em_scope_end(sc);
    if (s || rs) return s ? s : rs;
    if (min < 0) return em_set_error(EM_ERR_IO, "--resume auto: another process cannot look at %s", r->state);
    if (min != max)
        return em_set_error(EM_ERR_IO,
                            "--resume auto: some of the %d processes see a checkpoint in %s and some do not; "
                            "a checkpoint directory must be shared by every process",
                            world, r->state);
    r->o.resume = yes ? r->state : NULL;
    return EM_OK;
}

/* The run's trackers (on every rank; rank 0 writes): OUT/metrics.jsonl,
 * kept and continued by a resumed run, and with --log-with tensorboard the
 * event files in LOGDIR/<OUT's last component>. */
static em_status init_trackers(run *r)
{
    const train_opts *o = &r->o;
    snprintf(r->logdir, sizeof r->logdir, "%s/runs", o->out);
    if (o->logging_dir) snprintf(r->logdir, sizeof r->logdir, "%s", o->logging_dir);
    size_t n = strlen(o->out);
    while (n > 1 && o->out[n - 1] == '/') n--;
    const char *base = o->out + n;
    while (base > o->out && base[-1] != '/') base--;
    snprintf(r->run_name, sizeof r->run_name, "%.*s", (int)(o->out + n - base), base);
    if (!r->run_name[0] || !strcmp(r->run_name, ".") || !strcmp(r->run_name, "..") ||
        !strcmp(r->run_name, "/"))
        snprintf(r->run_name, sizeof r->run_name, "train");
    return em_accel_init_trackers(r->acc, r->run_name,
                                  &(em_tracker_config){.log_with = EM_TRACK_JSONL | o->log_with,
                                                       .logging_dir = r->logdir,
                                                       .jsonl_path = in_out(r, "metrics.jsonl"),
                                                       .append = o->resume != NULL});
}

static em_status setup(run *r)
{
    train_opts *o = &r->o;
    r->acc = em_accelerator_new(&(em_accel_config){.grad_accum = (int)o->grad_accum,
                                                   .zero_stage = o->zero == 1 ? -1 : (int)o->zero - 1,
                                                   .zero_offload = o->zero_offload,
                                                   .mixed_precision = o->precision,
                                                   .device = o->device,
                                                   .project_dir = o->save_total_limit ? o->out : NULL,
                                                   .automatic_checkpoint_naming = o->save_total_limit > 0,
                                                   .total_limit = (int)o->save_total_limit});
    if (!r->acc) return em_last_status();
    r->main = em_accel_is_main_process(r->acc);
    int rank = em_accel_rank(r->acc), world = em_accel_world(r->acc);
    if (o->batch % world)
        return em_set_error(EM_ERR_ARG, "--batch %lld is not a multiple of the %d processes", (long long)o->batch,
                            world);
    r->text = em_text_open(o->data, o->bytes ? EM_TEXT_BYTES : EM_TEXT_CHARS);
    if (!r->text) return em_last_status();
    em_status s = em_tokens_split(&r->text->tokens, 0.9, &r->train, &r->val);
    if (s) return s;
    o->model.vocab_size = r->text->vocab.size;
    /* one independent random stream per use: init (the seed itself), training
     * windows, and the windows of each evaluation split */
    int64_t T = o->model.block_size;
    if (!s) s = em_window_sampler_init(&r->sampler, &r->train, o->batch, T, em_seed_derive(o->seed, 1));
    if (!s)
        s = em_window_sampler_init(&r->eval_sampler[0], &r->train, o->batch, T, em_seed_derive(o->seed, 2));
    if (!s) s = em_window_sampler_init(&r->eval_sampler[1], &r->val, o->batch, T, em_seed_derive(o->seed, 3));
    for (int i = 0; i < 2 && !s; i++) {
        s = em_window_sampler_shard(&r->eval_sampler[i], rank, world);
        if (!s) s = em_accel_register_rng(r->acc, &r->eval_sampler[i].rng);
    }
    if (s) return s;
    if ((s = check_fits(r))) return s;
    r->gpt = em_gpt_new(&o->model, o->seed);
    /* on the Accelerator's device before the flat buffers are made */
    if (!r->gpt || (s = em_module_to(r->gpt->m, em_accel_device(r->acc))) || (s = em_module_flatten(r->gpt->m)))
        return em_last_status();
    if (o->init && (s = em_module_load(r->gpt->m, o->init, true))) return s;
    if ((s = make_optimizer(r))) return s;
    if (o->model.dropout > 0 && (s = register_dropout_rngs(r))) return s;
    r->sched = (em_lr_schedule){.kind = EM_LR_COSINE,
                                .base_lr = o->lr,
                                .min_lr = o->min_lr,
                                .warmup = o->warmup,
                                .total = o->iters > o->warmup ? o->iters : o->warmup + 1};
    if ((s = em_accel_prepare(r->acc, r->gpt->m, r->opt, NULL, &r->sched))) return s;
    if ((s = em_accel_prepare_sampler(r->acc, &r->sampler))) return s;
    if (o->resume_auto && (s = resolve_auto_resume(r))) return s;
    if (o->resume && (s = em_accel_load_state(r->acc, o->resume))) return s;
    if (r->main) {
        struct stat sb;
        if (mkdir(o->out, 0777) != 0 && errno != EEXIST)
            s = em_set_error(EM_ERR_IO, "cannot create --out %s: %s", o->out, strerror(errno));
        else if (stat(o->out, &sb) != 0 || !S_ISDIR(sb.st_mode))
            s = em_set_error(EM_ERR_IO, "--out %s exists and is not a directory", o->out);
        else if (o->resume)
            s = keep_metrics_until(in_out(r, "metrics.jsonl"), em_accel_step_count(r->acc));
    }
    return s ? s : init_trackers(r);
}

static void teardown(run *r)
{
    em_accelerator_free(r->acc); /* closes the trackers if the run failed before end_training */
    em_optim_free(r->opt);
    if (r->gpt) em_gpt_free(r->gpt);
    em_text_free(r->text);
}

int cmd_train(int argc, char **argv)
{
    run r = {0};
    int rc = parse_args(argc, argv, &r.o);
    if (rc) return rc < 0 ? 0 : rc;
    train_opts *o = &r.o;
    em_status s = setup(&r);
    if (s) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        teardown(&r);
        return 1;
    }
    progress bar = progress_on(stdout, 0); /* a terminal gets a bar (tools/progress.c), a log plain lines */
    bool tty = r.main && bar.tty;
    int world = em_accel_world(r.acc);
    int64_t start = em_accel_step_count(r.acc);
    if (r.main && o->resume_auto && !o->resume) {
        printf("ember train: --resume auto: no checkpoint in %s, starting fresh\n", r.state);
        fflush(stdout);
    }
    if (r.main) {
        printf("ember train: %s, %lld train / %lld val tokens, vocab %lld; GPT %lld layers, %lld heads, %lld "
               "wide, context %lld (%.2fM parameters); batch %lld",
               o->data, (long long)r.train.n, (long long)r.val.n, (long long)o->model.vocab_size,
               (long long)o->model.n_layer, (long long)o->model.n_head, (long long)o->model.n_embd,
               (long long)o->model.block_size, (double)em_module_num_params(r.gpt->m) / 1e6, (long long)o->batch);
        if (world > 1) printf(" (%lld on each of %d processes)", (long long)(o->batch / world), world);
        if (em_accel_grad_accum(r.acc) > 1) printf(" x %d accumulated", em_accel_grad_accum(r.acc));
        if (em_accel_zero_stage(r.acc) > 0) printf(", ZeRO stage %d", em_accel_zero_stage(r.acc));
        if (em_accel_autocast_dtype(r.acc) != EM_F32)
            printf(", mixed precision %s", em_accel_autocast_dtype(r.acc) == EM_BF16 ? "bf16" : "fp16");
        printf(", %lld iterations", (long long)o->iters);
        if (o->resume) printf(", resuming at step %lld from %s", (long long)start, o->resume);
        printf("\n");
        fflush(stdout);
    }
    double t_start = progress_now(), t_last = t_start, loss = NAN, norm = 0;
    int64_t tokens_per_step = o->batch * em_accel_grad_accum(r.acc) * o->model.block_size;
    int64_t since = 0; /* steps timed since t_last */
    for (int64_t step = start; !s; step++) {
        /* EMBER_FAULT's point at the end of each training step (after its
         * metrics record, before a checkpoint that follows it) */
        if (step > start) fault_point("train.step");
        /* a resumed run's state was saved right after its evaluation at `start` */
        bool resumed_here = o->resume && step == start;
        if ((step % o->eval_every == 0 || step == o->iters) && !resumed_here) {
            double el[2];
            if ((s = evaluate(&r, el))) break;
            if (r.main) {
                progress_clear(&bar);
                printf("eval step=%lld train_loss=%.4f val_loss=%.4f\n", (long long)step, el[0], el[1]);
                fflush(stdout);
            }
            /* each record reaches the files as it is logged: a killed run keeps it */
            if ((s = em_accel_log(r.acc, step, 2, (em_metric[]){{"train_loss", el[0]}, {"val_loss", el[1]}})))
                break;
            if ((s = save(&r))) break;
            t_last = progress_now(); /* step timings leave evaluation out */
            since = 0;
        }
        if (step >= o->iters) break;
        double lr = em_lr_at(&r.sched, step);
        if ((s = train_step(&r, &loss, &norm))) break;
        since++;
        if (!r.main) continue;
        bool log_now = (step + 1) % o->log_every == 0 || step + 1 == o->iters;
        if (tty && !log_now) { /* the bar moves every step on a terminal */
            double dt = (progress_now() - t_last) / (double)since;
            progress_draw(&bar, step + 1, o->iters, "", loss, (double)tokens_per_step / dt,
                          (double)(o->iters - step - 1) * dt);
        }
        if (log_now) {
            double t = progress_now(), dt = (t - t_last) / (double)since;
            t_last = t;
            since = 0;
            double tps = (double)tokens_per_step / dt, eta = (double)(o->iters - step - 1) * dt;
            if ((s = em_accel_log(r.acc, step + 1, 5,
                                  (em_metric[]){{"loss", loss},
                                                {"lr", lr},
                                                {"grad_norm", norm},
                                                /* timings to what they mean: 1 µs, 0.1 token/s */
                                                {"ms_per_step", round(1e6 * dt) / 1e3},
                                                {"tokens_per_s", round(10 * tps) / 10}})))
                break;
            if (tty)
                progress_draw(&bar, step + 1, o->iters, "", loss, tps, eta);
            else
                printf("step %lld/%lld loss %.4f lr %.3g %.1f ms/step %.0f tok/s\n", (long long)(step + 1),
                       (long long)o->iters, loss, lr, 1e3 * dt, tps);
            fflush(stdout);
        }
    }
    if (!s) s = em_accel_end_training(r.acc);
    if (s)
        fprintf(stderr, "%sember train: %s\n", tty ? "\n" : "", em_last_error());
    else if (r.main) {
        printf("ember train: done in %.1f s; wrote %s/model.safetensors, %s/config, %s/metrics.jsonl, "
               "%s/%s",
               progress_now() - t_start, o->out, o->out, o->out, o->out,
               o->save_total_limit ? "checkpoints" : "state");
        if (o->log_with & EM_TRACK_TENSORBOARD)
            printf(", TensorBoard event files in %s/%s (tensorboard --logdir %s)", r.logdir, r.run_name,
                   r.logdir);
        printf("\n");
        /* VmHWM, beside the estimate the start was checked against */
        em_mem_estimate e;
        char b0[32], b1[32];
        if (estimate(&r, &e) == EM_OK && mem_peak_rss() > 0)
            printf("ember train: peak memory %s on process 0 (estimated %s per process)\n",
                   mem_human(mem_peak_rss(), b0, sizeof b0), mem_human((double)e.total, b1, sizeof b1));
        /* and on its device: the caching allocator's peak in use, and under
         * ZeRO stage 3 the parameters' mapped granules at their peak */
        em_device dev = em_accel_device(r.acc);
        em_cuda_memory m;
        char b2[32];
        if (dev.type == EM_CUDA && estimate(&r, &e) == EM_OK && em_cuda_memory_stats(dev.index, &m) == EM_OK)
            printf("ember train: cuda:%d peak %s in use%s%s (estimated %s on the device)\n", dev.index,
                   mem_human((double)m.peak_allocated, b0, sizeof b0),
                   m.peak_mapped ? " + parameters mapped " : "",
                   m.peak_mapped ? mem_human((double)m.peak_mapped, b2, sizeof b2) : "",
                   mem_human(device_part(&r, &e), b1, sizeof b1));
    }
    teardown(&r);
    return s ? 1 : 0;
}
