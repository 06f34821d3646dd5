/* accelerator.c — the Accelerator: the few calls a training loop makes so the
 * same program trains alone or as one rank of many (Hugging Face Accelerate's
 * Accelerator, in C).
 *
 *   em_accelerator *acc = em_accelerator_new(NULL);      config file + env
 *   em_accel_prepare(acc, model, opt, loader, &sched);   DDP, shards, schedule
 *   int r;
 *   while ((r = em_accel_next(acc, &b)) > 0) {           1 batch, 0 end, -1 error
 *       em_scope s = em_scope_begin();
 *       em_accel_accumulate(acc);                         sync this micro-step?
 *       em_accel_backward(acc, loss(model, b));           / grad_accum; buckets
 *       em_accel_clip_grad_norm(acc, 1.0, NULL);
 *       em_accel_step(acc);  em_accel_zero_grad(acc);     only when synced
 *       em_scope_end(s);
 *   }
 *
 * Everything it keeps for a resume (step, micro-step, loader position,
 * sampler and generator states) is plain numbers, written per rank by
 * em_accel_save_state beside the model and optimizer state.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/loader_impl.h"
#include "dist/accel_impl.h"
#include "dist/ddp_impl.h"
#include "dist/dist_impl.h"
#include "dist/launch_env_impl.h"
#include "dist/zero_impl.h"
#include "ember/dist.h"
#include "ember/profile.h"
#include "ember/runtime.h"
#include "optim/optim_impl.h"
#include "tensor/profile_impl.h"
#include "tensor/tensor_impl.h"

/* ---- configuration ------------------------------------------------------------ */

/* The environment's settings are the config file's keys under other names. */
static const struct {
    const char *var, *key;
} env_keys[] = {
    {"EMBER_MIXED_PRECISION", "mixed_precision"},
    {"EMBER_GRAD_ACCUM", "gradient_accumulation_steps"},
    {"EMBER_SPLIT_BATCHES", "split_batches"},
    {"EMBER_EVEN_BATCHES", "even_batches"},
    {"EMBER_TIMEOUT", "timeout"},
    {"EMBER_ZERO_STAGE", "zero_stage"},
};

/* defaults < config file < environment < code */
static em_status resolve_config(const em_accel_config *cfg, em_config *c)
{
    *c = em_config_defaults();
    em_status s = em_config_load(cfg->config_file, c);
    if (s) return s;
    for (size_t i = 0; i < sizeof env_keys / sizeof env_keys[0]; i++) {
        const char *v = getenv(env_keys[i].var);
        char source[64];
        snprintf(source, sizeof source, "em_accelerator_new: %s", env_keys[i].var);
        if (v && *v && (s = config_set(c, env_keys[i].key, v, source)) != EM_OK) return s;
    }
    if (cfg->grad_accum < 0)
        return em_err(EM_ERR_ARG, "em_accelerator_new: grad_accum %d must be >= 0", cfg->grad_accum);
    if (cfg->grad_accum) c->grad_accum = cfg->grad_accum;
    if (cfg->mixed_precision != EM_PREC_DEFAULT) c->mixed_precision = cfg->mixed_precision;
    if (cfg->split_batches) c->split_batches = cfg->split_batches > 0;
    if (cfg->even_batches) c->even_batches = cfg->even_batches > 0;
    if (cfg->timeout_s < 0 || cfg->timeout_s != cfg->timeout_s)
        return em_err(EM_ERR_ARG, "em_accelerator_new: timeout_s %g must be >= 0", cfg->timeout_s);
    if (cfg->timeout_s > 0) c->timeout_s = cfg->timeout_s;
    if (cfg->zero_stage < -1 || cfg->zero_stage > 3)
        return em_err(EM_ERR_ARG, "em_accelerator_new: zero_stage %d must be -1 (off), 0 (config/env), 1, 2 or 3",
                      cfg->zero_stage);
    if (cfg->zero_stage) c->zero_stage = cfg->zero_stage > 0 ? cfg->zero_stage : 0;
    return EM_OK;
}

/* a->device from the config or EMBER_DEVICE: "cuda" is cuda:LOCAL_RANK, and
 * a machine with fewer devices than local processes is an error. */
static em_status resolve_device(em_accelerator *a, const char *want)
{
    const char *src = "em_accelerator_new: device";
    if (!want || !*want) {
        want = getenv("EMBER_DEVICE");
        src = "em_accelerator_new: EMBER_DEVICE";
    }
    if (!want || !*want) want = "cpu";
    if (em_device_parse(want, a->local_rank, &a->device))
        return em_err(EM_ERR_ARG, "%s='%s' is not cpu, cuda or cuda:N", src, want);
    if (a->device.type != EM_CUDA) return EM_OK;
    int n = em_cuda_device_count();
    if (!strcmp(want, "cuda") && a->local_world > n)
        return em_err(EM_ERR_DEVICE,
                      "em_accelerator_new: %d processes on this machine need one CUDA device each, but %d %s "
                      "visible (not enough GPUs available)",
                      a->local_world, n, n == 1 ? "is" : "are");
    if (a->device.index >= n)
        return em_err(EM_ERR_DEVICE, "em_accelerator_new: cuda:%d does not exist (%d CUDA device%s visible)",
                      a->device.index, n, n == 1 ? "" : "s");
    return EM_OK;
}

em_accelerator *em_accelerator_new(const em_accel_config *cfg)
{
    em_accel_config zero = {0};
    if (!cfg) cfg = &zero;
    if (em_profile_env()) return NULL; /* EMBER_PROFILE that is not a boolean */
    if (cfg->bucket_mb < 0 || cfg->bucket_mb != cfg->bucket_mb)
        return em_fail(EM_ERR_ARG, "em_accelerator_new: bucket_mb %g must be >= 0", cfg->bucket_mb);
    em_config c;
    if (resolve_config(cfg, &c) != EM_OK) return NULL;
    em_accelerator *a = calloc(1, sizeof *a);
    if (!a) return em_fail(EM_ERR_OOM, "em_accelerator_new: out of memory");
    if (accel_ckpt_init(a, cfg)) { /* project_dir, automatic naming, total_limit */
        free(a);
        return NULL;
    }
    /* the resolved timeout (code > env > file > default) goes to the group in its config */
    a->pg = em_pg_from_env_with(&(em_pg_env_config){.timeout_s = c.timeout_s});
    if (!a->pg) {
        free(a);
        return NULL;
    }
    a->rank = em_pg_rank(a->pg);
    a->world = em_pg_world(a->pg);
    /* the local rank and world, as the launcher says them (the group took its ranks) */
    launch_env e;
    if (launch_env_read("em_accelerator_new", &e)) {
        em_accelerator_free(a);
        return NULL;
    }
    a->local_rank = e.local_rank;
    a->local_world = e.local_world;
    if (resolve_device(a, cfg->device) || accel_trackers_setup(a, cfg)) {
        em_accelerator_free(a);
        return NULL;
    }
    a->grad_accum = c.grad_accum;
    a->split_batches = c.split_batches;
    a->even_batches = c.even_batches;
    a->bucket_mb = cfg->bucket_mb;
    a->find_unused = cfg->find_unused_parameters;
    a->zero_stage = c.zero_stage;
    a->zero_offload = cfg->zero_offload;
    a->amp = c.mixed_precision == EM_PREC_BF16 ? EM_BF16 : c.mixed_precision == EM_PREC_FP16 ? EM_F16 : EM_F32;
    if (a->amp == EM_F16 && !(a->scaler = em_grad_scaler_new(&cfg->scaler))) {
        held_error h;
        error_hold(&h, EM_ERR_ARG);
        em_accelerator_free(a);
        em_set_error(h.status, "em_accelerator_new: %s", h.msg);
        return NULL;
    }
    return a;
}

void em_accelerator_free(em_accelerator *a)
{
    if (!a) return;
    accel_trackers_free(a);
    /* the thread's setting from before any region left open */
    if (a->auto_region && a->auto_depth == 0)
        em_autocast_set(a->auto_prev);
    else if (a->regions && a->amp != EM_F32)
        em_autocast_set(a->region_prev[0]);
    em_grad_scaler_free(a->scaler);
    em_zero_free(a->zero); /* before the DDP it drives */
    for (int i = 0; i < a->nmodels; i++) em_ddp_free(a->ddps[i]);
    free(a->params);
    em_pg_free(a->pg);
    free(a);
}

int em_accel_rank(const em_accelerator *a) { return a ? a->rank : -1; }
int em_accel_world(const em_accelerator *a) { return a ? a->world : -1; }
int em_accel_local_rank(const em_accelerator *a) { return a ? a->local_rank : -1; }
int em_accel_local_world(const em_accelerator *a) { return a ? a->local_world : -1; }
bool em_accel_is_main_process(const em_accelerator *a) { return a && a->rank == 0; }
bool em_accel_is_local_main(const em_accelerator *a) { return a && a->local_rank == 0; }
int em_accel_grad_accum(const em_accelerator *a) { return a ? a->grad_accum : -1; }
int em_accel_zero_stage(const em_accelerator *a) { return !a ? -1 : a->world > 1 ? a->zero_stage : 0; }

em_status em_accel_gather_params(em_accelerator *a)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_gather_params: accelerator is NULL");
    return a->zero ? em_zero_gather_params(a->zero) : EM_OK;
}
em_pg *em_accel_pg(const em_accelerator *a) { return a ? a->pg : NULL; }
em_device em_accel_device(const em_accelerator *a) { return a ? a->device : em_device_cpu(); }

em_status em_accel_to_device(em_accelerator *a, em_batch *b)
{
    if (!a || !b) return em_err(EM_ERR_ARG, "em_accel_to_device: %s is NULL", a ? "batch" : "accelerator");
    em_tensor *x = b->x ? em_to(b->x, a->device) : NULL, *y = b->y ? em_to(b->y, a->device) : NULL;
    em_tensor *mask = b->mask ? em_to(b->mask, a->device) : NULL; /* a collate's mask */
    if ((b->x && !x) || (b->y && !y) || (b->mask && !mask)) return em_last_status();
    b->x = x;
    b->y = y;
    b->mask = mask;
    return EM_OK;
}
bool em_accel_sync_gradients(const em_accelerator *a) { return a && a->sync; }
int64_t em_accel_step_count(const em_accelerator *a) { return a ? a->steps : -1; }
bool em_accel_step_was_skipped(const em_accelerator *a) { return a && a->skipped; }
em_dtype em_accel_autocast_dtype(const em_accelerator *a) { return a ? a->amp : EM_F32; }
em_grad_scaler *em_accel_scaler(const em_accelerator *a) { return a ? a->scaler : NULL; }

/* ---- prepare ------------------------------------------------------------------ */

static bool model_is_flat(const em_module *m)
{
    for (int dt = 0; dt < EM_NUM_DTYPES; dt++)
        if (em_module_flat_params(m, (em_dtype)dt)) return true;
    return false;
}

/* m's parameters (malloc'd, NULL + EM_ERR_OOM), their count in *n */
static em_named *model_params(const em_module *m, int *n)
{
    *n = em_module_params(m, NULL, 0);
    em_named *ps = calloc((size_t)*n + 1, sizeof *ps);
    if (!ps) return em_fail(EM_ERR_OOM, "em_accel_prepare: out of memory");
    em_module_params(m, ps, *n);
    return ps;
}

/* whether every parameter of m is on dev (true for a model without any) */
static bool model_is_on(em_module *m, em_device dev)
{
    int n;
    em_named *ps = model_params(m, &n);
    if (!ps) return false;
    bool on = true;
    for (int i = 0; i < n && on; i++) on = em_device_equal(em_device_of(ps[i].t), dev);
    free(ps);
    return on;
}

static em_status prepare_model(em_accelerator *a, em_module *model)
{
    em_status s = EM_OK;
    if (!model_is_flat(model)) {
        s = em_module_to(model, a->device);
    } else if (!model_is_on(model, a->device)) {
        char d[16];
        return em_err(EM_ERR_DEVICE,
                      "em_accel_prepare: the model was flattened on another device than the Accelerator's %s; "
                      "prepare it before em_module_flatten, or move it with em_module_to first",
                      em_device_str(a->device, d, sizeof d));
    }
    if (!s) s = em_module_flatten(model);
    if (s) return s;
    int n;
    em_named *ps = model_params(model, &n);
    em_tensor **all = ps ? realloc(a->params, sizeof *all * (size_t)(a->nparams + n + 1)) : NULL;
    if (!all) {
        free(ps);
        return em_err(EM_ERR_OOM, "em_accel_prepare: out of memory");
    }
    a->params = all;
    if (a->world > 1) {
        em_ddp_config dc = {.bucket_mb = a->bucket_mb, .find_unused_parameters = a->find_unused};
        a->ddps[a->nmodels] = em_ddp_new(a->pg, model, &dc);
        if (!a->ddps[a->nmodels]) {
            free(ps);
            return em_last_status();
        }
    }
    for (int i = 0; i < n; i++) a->params[a->nparams + i] = ps[i].t;
    free(ps);
    a->nparams += n;
    a->models[a->nmodels++] = model;
    return EM_OK;
}

/* Whether t is a parameter of a prepared model or of `model` (this call's). */
static bool is_model_param(const em_accelerator *a, const em_named *mine, int nmine, const em_tensor *t)
{
    for (int i = 0; i < a->nparams; i++)
        if (a->params[i] == t) return true;
    for (int i = 0; i < nmine; i++)
        if (mine[i].t == t) return true;
    return false;
}

/* EM_ERR_ARG naming the first parameter of opt that belongs to no prepared
 * model (nor to `model`, prepared in the same call). */
static em_status check_optimizer_params(const em_accelerator *a, em_module *model, const em_optimizer *opt)
{
    int nmine = 0;
    em_named *mine = NULL;
    if (model && !(mine = model_params(model, &nmine))) return em_last_status();
    em_status s = EM_OK;
    for (int i = 0; i < opt->np && !s; i++) {
        em_tensor *t = opt->p[i].h;
        if (is_model_param(a, mine, nmine, t)) continue;
        char shape[128] = "(";
        int nd = em_ndim(t);
        for (int d = 0; d < nd && strlen(shape) < sizeof shape - 24; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? "," : "",
                     (long long)em_shape(t)[d]);
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), ")");
        s = em_err(
            EM_ERR_ARG,
            "em_accel_prepare: the optimizer's parameter %d (shape %s) is not a parameter of a prepared "
            "model (%d prepared%s); prepare its model before or with the optimizer",
            i, shape, a->nmodels, model ? " plus this call's" : "");
    }
    free(mine);
    return s;
}

/* Everything prepare would refuse, before it changes anything. */
static em_status check_prepare(const em_accelerator *a, em_module *model, em_optimizer *opt,
                               em_loader *loader, const em_lr_schedule *sched)
{
    em_status s;
    if (sched && (s = em_lr_schedule_check(sched))) return s;
    if (sched && !opt && a->nopts == 0)
        return em_err(EM_ERR_ARG,
                      "em_accel_prepare: a schedule drives an optimizer, and none is prepared: prepare the "
                      "optimizer before the schedule or in the same call");
    if (sched && !opt && a->has_sched[a->nopts - 1])
        return em_err(EM_ERR_ARG,
                      "em_accel_prepare: optimizer %d (the last prepared) already has a schedule; a second "
                      "one would replace it",
                      a->nopts - 1);
    const char *full = model && a->nmodels == MAX_PREPARED     ? "models"
                       : opt && a->nopts == MAX_PREPARED       ? "optimizers"
                       : loader && a->nloaders == MAX_PREPARED ? "loaders"
                                                               : NULL;
    if (full) return em_err(EM_ERR_ARG, "em_accel_prepare: at most %d %s", MAX_PREPARED, full);
    for (int i = 0; i < a->nmodels; i++)
        if (a->models[i] == model)
            return em_err(EM_ERR_ARG, "em_accel_prepare: the model is prepared already (model %d)", i);
    for (int i = 0; i < a->nopts; i++)
        if (a->opts[i] == opt)
            return em_err(EM_ERR_ARG, "em_accel_prepare: the optimizer is prepared already (optimizer %d)",
                          i);
    for (int i = 0; i < a->nloaders; i++)
        if (a->loaders[i] == loader)
            return em_err(EM_ERR_ARG, "em_accel_prepare: the loader is prepared already (loader %d)", i);
    if (a->zero_stage > 0 && a->world > 1 &&
        ((model && a->nmodels + 1 > 1) || (opt && a->nopts + 1 > 1) || (opt && !model && a->nmodels == 0)))
        return em_err(EM_ERR_UNSUPPORTED,
                      "em_accel_prepare: ZeRO stage %d shards one model and one optimizer; this would be %s %d "
                      "(prepare exactly one of each, or set zero_stage 0)",
                      a->zero_stage, model && a->nmodels ? "model" : "optimizer",
                      model && a->nmodels ? a->nmodels + 1 : a->nopts + 1);
    return opt ? check_optimizer_params(a, model, opt) : EM_OK;
}

em_status em_accel_prepare(em_accelerator *a, em_module *model, em_optimizer *opt, em_loader *loader,
                           const em_lr_schedule *sched)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_prepare: accelerator is NULL");
    em_status s = check_prepare(a, model, opt, loader, sched);
    if (!s && model) s = prepare_model(a, model);
    if (!s && loader) s = em_loader_set_shard(loader, a->rank, a->world, a->split_batches, a->even_batches);
    if (!s && opt && a->zero_stage > 0 && a->world > 1 &&
        !(a->zero = zero_attach(a->ddps[0], false, opt, a->zero_stage, a->zero_offload)))
        s = em_last_status();
    if (s) return s;
    if (loader) a->loaders[a->nloaders++] = loader;
    if (opt) {
        a->opts[a->nopts] = opt;
        a->has_sched[a->nopts] = false;
        a->nopts++;
    }
    if (sched) { /* this call's optimizer's, or the last prepared one's */
        a->scheds[a->nopts - 1] = *sched;
        a->has_sched[a->nopts - 1] = true;
    }
    return EM_OK;
}

em_status em_accel_prepare_sampler(em_accelerator *a, em_window_sampler *s)
{
    if (!a || !s) return em_err(EM_ERR_ARG, "em_accel_prepare_sampler: %s is NULL", a ? "sampler" : "accelerator");
    em_status st = em_window_sampler_shard(s, a->rank, a->world);
    if (st) return st;
    a->sampler = s;
    return EM_OK;
}

em_status em_accel_register_rng(em_accelerator *a, em_rng *rng)
{
    if (!a || !rng) return em_err(EM_ERR_ARG, "em_accel_register_rng: %s is NULL", a ? "rng" : "accelerator");
    if (a->nrngs == MAX_RNGS) return em_err(EM_ERR_ARG, "em_accel_register_rng: at most %d generators", MAX_RNGS);
    a->rngs[a->nrngs++] = rng;
    return EM_OK;
}

/* ---- autocast regions --------------------------------------------------------- */

em_status em_accel_autocast_begin(em_accelerator *a)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_autocast_begin: accelerator is NULL");
    if (a->regions == MAX_REGIONS)
        return em_err(EM_ERR_ARG, "em_accel_autocast_begin: more than %d nested regions (is an end missing?)",
                      MAX_REGIONS);
    a->region_prev[a->regions++] = a->amp != EM_F32 ? em_autocast_set(a->amp) : em_autocast_dtype();
    return EM_OK;
}

em_status em_accel_autocast_end(em_accelerator *a)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_autocast_end: accelerator is NULL");
    if (a->regions == 0)
        return em_err(EM_ERR_ARG,
                      "em_accel_autocast_end: no region is open (em_accel_autocast_begin was not called)");
    em_dtype prev = a->region_prev[--a->regions];
    if (a->auto_region && a->regions < a->auto_depth) {
        /* a region that began before the micro-step's automatic one ends
         * inside it: autocast stays on until backward, which then restores
         * what this region found */
        a->auto_prev = prev;
        a->auto_depth = a->regions;
        return EM_OK;
    }
    if (a->amp != EM_F32) em_autocast_set(prev);
    return EM_OK;
}

/* The training step's forward: from em_accel_next or em_accel_accumulate,
 * whichever comes first in a micro-step, until em_accel_backward returns. */
static void auto_region_begin(em_accelerator *a)
{
    if (a->auto_region || a->amp == EM_F32) return;
    a->auto_prev = em_autocast_set(a->amp);
    a->auto_depth = a->regions;
    a->auto_region = true;
}

/* Regions the user opened inside the automatic one and left open stay on;
 * the outermost of them restores what the automatic region found. */
static void auto_region_end(em_accelerator *a)
{
    if (!a->auto_region) return;
    if (a->regions > a->auto_depth)
        a->region_prev[a->auto_depth] = a->auto_prev;
    else
        em_autocast_set(a->auto_prev);
    a->auto_region = false;
}

/* ---- the loop ------------------------------------------------------------------
 * Which micro-steps sync is decided from the count and from the training
 * loader itself, so the calls may come in any order: em_accel_accumulate
 * counts a micro-step (and predicts whether its batch ends the epoch: the
 * batch the loader returned since the last backward, or else the one it
 * will return next); em_accel_backward counts it if accumulate did not, and
 * makes it a sync step when its batch turned out to be the epoch's last. */

/* Whether the training loader returned a batch since the last backward. */
static bool drawn(const em_accelerator *a)
{
    return a->nloaders && loader_last_stamp(a->loaders[0]) != a->batch_stamp;
}

/* Whether the micro-step's batch ends the training loader's epoch: the one
 * drawn, or (peek, none drawn yet) the one the loader returns next. */
static bool ends_epoch(const em_accelerator *a, bool peek)
{
    if (!a->nloaders) return false;
    em_loader *l = a->loaders[0];
    if (drawn(a)) return em_loader_last_was_final(l);
    return peek && em_loader_position(l).batch + 1 == em_loader_num_batches(l);
}

/* Counts a micro-step and decides its sync. */
static void count_micro(em_accelerator *a, bool peek)
{
    a->micro++;
    a->sync = a->micro % a->grad_accum == 0 || ends_epoch(a, peek);
    if (a->sync) a->micro = 0;
}

int em_accel_next(em_accelerator *a, em_batch *b)
{
    if (!a || !a->nloaders) {
        if (b) *b = (em_batch){0};
        em_err(EM_ERR_ARG, "em_accel_next: %s", a ? "no loader was prepared" : "accelerator is NULL");
        return -1;
    }
    int r = em_loader_next(a->loaders[0], b);
    if (r <= 0) { /* no micro-step: a region accumulate began ends here */
        auto_region_end(a);
        return r;
    }
    auto_region_begin(a);
    if (a->device.type != EM_CPU && em_accel_to_device(a, b)) return -1;
    return 1;
}

bool em_accel_accumulate(em_accelerator *a)
{
    if (!a) return false;
    auto_region_begin(a);
    em_loader *l = a->nloaders ? a->loaders[0] : NULL;
    if (l && !drawn(a) && em_loader_position(l).batch == em_loader_num_batches(l)) {
        /* the loader's next call ends the epoch: this micro-step may have no
         * batch, so backward counts it if it happens */
        a->counted = false;
        a->sync = (a->micro + 1) % a->grad_accum == 0;
        return a->sync;
    }
    count_micro(a, true);
    a->counted = true;
    return a->sync;
}

em_status em_accel_backward(em_accelerator *a, em_tensor *loss)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_backward: accelerator is NULL");
    if (!loss) { /* the forward failed: no backward, nothing counted */
        auto_region_end(a);
        return em_last_status() ? em_last_status() : em_err(EM_ERR_ARG, "em_accel_backward: loss is NULL");
    }
    if (!a->counted) {
        count_micro(a, false);
    } else if (!a->sync && ends_epoch(a, false)) { /* accumulate came before the epoch's last batch */
        a->sync = true;
        a->micro = 0;
    }
    a->counted = false;
    a->batch_stamp = a->nloaders ? loader_last_stamp(a->loaders[0]) : 0;
    em_tensor *l = a->grad_accum > 1 ? em_mul_scalar(loss, 1.0 / a->grad_accum) : loss;
    if (l && a->scaler) l = em_scaler_scale(a->scaler, l); /* fp16: keep small gradients representable */
    em_status s;
    prof_mark pm; /* the profiler's "backward": the walk and, synced, DDP's wait for its buckets */
    prof_begin(&pm);
    if (!l)
        s = em_last_status();
    else if (a->world == 1 || a->nmodels == 0)
        s = em_backward(l, NULL);
    else
        s = ddp_backward_many(a->ddps, a->nmodels, l, a->sync);
    prof_end(&pm, "backward", PROF_RANGE);
    auto_region_end(a);
    return s;
}

double em_accel_clip_grad_norm(em_accelerator *a, double max_norm, em_status *status)
{
    return em_accel_clip_grad_norm_with(a, &(em_clip_config){.max_norm = max_norm}, status);
}

double em_accel_clip_grad_norm_with(em_accelerator *a, const em_clip_config *cfg, em_status *status)
{
    if (!a || !a->nmodels) {
        em_status s = em_err(EM_ERR_ARG, "em_accel_clip_grad_norm: %s",
                             a ? "no model was prepared" : "accelerator is NULL");
        if (status) *status = s;
        return NAN;
    }
    if (status) *status = EM_OK;
    if (!a->sync) return NAN; /* gradients are still accumulating: nothing to clip yet */
    /* the true gradients clipped, unscaled first (once per step), the two
     * in two passes; ZeRO stage 1 holds every gradient whole, as DDP does */
    if (a->scaler && (!a->zero || a->zero_stage == 1))
        return em_scaler_unscale_clip(a->scaler, a->nparams, a->params, cfg, a->pg, status);
    if (a->scaler && a->zero) { /* stages 2-3: the shard unscaled and clipped, likewise */
        em_status s;
        double total = zero_unscale_clip(a->zero, a->scaler, cfg, &s);
        if (status) *status = s;
        return total;
    }
    if (a->zero) return em_zero_clip_grad_norm_with(a->zero, cfg, status);
    /* after a synced backward every rank holds the same averaged gradients
     * (and agrees which parameters have one), so the local norm is the
     * global one */
    return em_clip_grad_norm_with(a->nparams, a->params, cfg, status);
}

em_status em_accel_step(em_accelerator *a)
{
    if (!a || !a->nopts)
        return em_err(EM_ERR_ARG, "em_accel_step: %s",
                      a ? "no optimizer was prepared" : "accelerator is NULL");
    if (!a->sync) return EM_OK;
    em_status s;
    a->skipped = false;
    if (a->scaler) {
        /* every rank agreed on found_inf in the unscale: all skip, or none */
        if ((s = a->zero ? zero_unscale(a->zero, a->scaler)
                         : em_scaler_unscale(a->scaler, a->nparams, a->params, a->pg)))
            return s;
        a->skipped = em_scaler_found_inf(a->scaler);
        em_scaler_update(a->scaler);
        if (a->skipped) return EM_OK; /* no update, and the schedules stay where they are */
    }
    /* every schedule first: a failing one (a user's fn) keeps its own
     * message, naming the step, and no optimizer has stepped yet */
    for (int i = 0; i < a->nopts; i++)
        if (a->has_sched[i] && (s = em_optim_apply_schedule(a->opts[i], &a->scheds[i], a->steps))) return s;
    for (int i = 0; i < a->nopts; i++)
        if ((s = a->zero ? em_zero_step(a->zero) : em_optim_step(a->opts[i]))) return s;
    a->steps++;
    return EM_OK;
}

em_status em_accel_zero_grad(em_accelerator *a)
{
    if (!a || !a->nopts)
        return em_err(EM_ERR_ARG, "em_accel_zero_grad: %s",
                      a ? "no optimizer was prepared" : "accelerator is NULL");
    if (!a->sync) return EM_OK;
    em_status s = EM_OK;
    for (int i = 0; i < a->nopts && !s; i++) s = a->zero ? em_zero_zero_grad(a->zero) : em_optim_zero_grad(a->opts[i]);
    return s;
}

/* ---- gathering and friends ---------------------------------------------------- */

em_tensor *em_accel_gather(em_accelerator *a, em_tensor *t)
{
    if (!a || !t) return em_fail(EM_ERR_ARG, "em_accel_gather: %s is NULL", a ? "tensor" : "accelerator");
    int nd = em_ndim(t);
    if (nd < 0) return NULL;
    int64_t shape[EM_MAX_DIMS];
    if (nd == 0) {
        shape[0] = a->world;
        nd = 1;
    } else {
        memcpy(shape, em_shape(t), (size_t)nd * sizeof *shape);
        shape[0] *= a->world;
    }
    em_tensor *out = em_empty(em_dtype_of(t), nd, shape);
    if (!out) return NULL;
    em_scope sc = em_scope_begin(); /* a contiguous copy of t, if one is needed, dies here */
    em_tensor *in = em_contiguous(t);
    em_status s = in ? em_all_gather(a->pg, out, in, NULL) : em_last_status();
    em_scope_end(sc);
    if (s != EM_OK) {
        if (!em_scope_depth()) em_free(out);
        return NULL;
    }
    return out;
}

em_tensor *em_accel_gather_for_metrics(em_accelerator *a, em_tensor *t)
{
    em_tensor *all = em_accel_gather(a, t);
    if (!all) return NULL;
    /* the prepared loader that returned a batch last, however it was called */
    em_loader *last = NULL;
    for (int i = 0; i < a->nloaders; i++)
        if (loader_last_stamp(a->loaders[i]) > loader_last_stamp(last)) last = a->loaders[i];
    if (!last || !em_loader_last_was_final(last)) return all;
    int64_t pad = em_loader_padding(last);
    if (pad <= 0 || em_ndim(t) == 0) return all;
    int64_t n = em_shape(all)[0];
    return em_narrow(all, 0, 0, n - (pad < n ? pad : n));
}

em_tensor *em_accel_reduce(em_accelerator *a, em_tensor *t, em_reduce_op op)
{
    if (!a || !t) return em_fail(EM_ERR_ARG, "em_accel_reduce: %s is NULL", a ? "tensor" : "accelerator");
    em_tensor *out = em_copy(t);
    if (!out) return NULL;
    if (em_all_reduce(a->pg, out, op, NULL) != EM_OK) return NULL;
    return out;
}

em_tensor *em_accel_pad_across_processes(em_accelerator *a, em_tensor *t, int dim, double pad_value, bool pad_first)
{
    if (!a || !t)
        return em_fail(EM_ERR_ARG, "em_accel_pad_across_processes: %s is NULL", a ? "tensor" : "accelerator");
    int nd = em_ndim(t);
    if (nd < 0) return NULL;
    if (dim < 0) dim += nd;
    if (dim < 0 || dim >= nd)
        return em_fail(EM_ERR_ARG, "em_accel_pad_across_processes: dim %d out of range for %d dims", dim, nd);
    int64_t one = 1, w = a->world, most = 0;
    em_scope sc = em_scope_begin();
    em_tensor *mine = em_full(EM_I32, 1, &one, (double)em_shape(t)[dim]);
    em_tensor *sizes = mine ? em_empty(EM_I32, 1, &w) : NULL;
    em_status s = sizes ? em_all_gather(a->pg, sizes, mine, NULL) : em_last_status();
    for (int r = 0; r < a->world && s == EM_OK; r++) {
        int64_t v = ((int32_t *)em_data(sizes))[r];
        if (v > most) most = v;
    }
    em_scope_end(sc);
    if (s != EM_OK) return NULL;
    int64_t have = em_shape(t)[dim];
    if (have == most) return em_copy(t);
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, em_shape(t), (size_t)nd * sizeof *shape);
    shape[dim] = most;
    em_tensor *out = em_full(em_dtype_of(t), nd, shape, pad_value);
    em_tensor *dst = out ? em_narrow(out, dim, pad_first ? most - have : 0, have) : NULL;
    if (!dst || em_copy_into(dst, t) != EM_OK) return NULL;
    return out;
}

em_status em_accel_wait_for_everyone(em_accelerator *a)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_wait_for_everyone: accelerator is NULL");
    return em_barrier(a->pg, NULL);
}

void em_accel_print(const em_accelerator *a, const char *fmt, ...)
{
    if (!a || a->rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void em_accel_split_between_processes(const em_accelerator *a, int64_t n, int64_t *start, int64_t *count)
{
    int w = a ? a->world : 1, r = a ? a->rank : 0;
    if (n < 0) n = 0;
    int64_t base = n / w, extra = n % w;
    int64_t c = base + (r < extra ? 1 : 0);
    int64_t s = r * base + (r < extra ? r : extra);
    if (start) *start = s;
    if (count) *count = c;
}

void em_accel_set_trigger(em_accelerator *a)
{
    if (a) a->trigger = true;
}

bool em_accel_check_trigger(em_accelerator *a, em_status *status)
{
    em_status s = EM_OK;
    bool fired = false;
    if (!a) {
        s = em_err(EM_ERR_ARG, "em_accel_check_trigger: accelerator is NULL");
    } else {
        int64_t one = 1;
        em_scope sc = em_scope_begin();
        em_tensor *f = em_full(EM_I32, 1, &one, a->trigger ? 1 : 0);
        s = f ? em_all_reduce(a->pg, f, EM_RED_MAX, NULL) : em_last_status();
        if (s == EM_OK) {
            fired = ((int32_t *)em_data(f))[0] != 0;
            a->trigger = false;
        }
        em_scope_end(sc);
    }
    if (status) *status = s;
    return fired;
}
