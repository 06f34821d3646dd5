/* accelerator.c — the Accelerator: the few calls a training loop makes so the
 * same program trains alone or as one rank of many (Hugging Face Accelerate's
 * Accelerator, in C).
 *
 *   em_accelerator *acc = em_accelerator_new(NULL);      config file + env
 *   em_accel_prepare(acc, model, opt, loader, &sched);   DDP, shards, schedule
 *   while (em_accel_next(acc, &b)) {
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

#include "ember/dist.h"
#include "ember/runtime.h"
#include "dist/accel_impl.h"
#include "dist/dist_impl.h"
#include "tensor/tensor_impl.h"

/* ---- configuration ------------------------------------------------------------ */

/* LOCAL_RANK / LOCAL_WORLD_SIZE: an integer >= lo, when set. */
static em_status env_int(const char *var, int lo, int *out)
{
    const char *v = getenv(var);
    if (!v || !*v) return EM_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > 1 << 30)
        return em_err(EM_ERR_ARG, "em_accelerator_new: %s='%s' is not an integer >= %d", var, v, lo);
    *out = (int)x;
    return EM_OK;
}

/* The environment's settings are the config file's keys under other names. */
static const struct {
    const char *var, *key;
} env_keys[] = {
    {"EMBER_MIXED_PRECISION", "mixed_precision"},
    {"EMBER_GRAD_ACCUM", "gradient_accumulation_steps"},
    {"EMBER_SPLIT_BATCHES", "split_batches"},
    {"EMBER_EVEN_BATCHES", "even_batches"},
    {"EMBER_TIMEOUT", "timeout"},
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
    if (cfg->bucket_mb < 0 || cfg->bucket_mb != cfg->bucket_mb)
        return em_fail(EM_ERR_ARG, "em_accelerator_new: bucket_mb %g must be >= 0", cfg->bucket_mb);
    em_config c;
    if (resolve_config(cfg, &c) != EM_OK) return NULL;
    em_accelerator *a = calloc(1, sizeof *a);
    if (!a) return em_fail(EM_ERR_OOM, "em_accelerator_new: out of memory");
    /* the resolved timeout (code > env > file > default) goes to the group in its config */
    a->pg = em_pg_from_env_with(&(em_pg_env_config){.timeout_s = c.timeout_s});
    if (!a->pg) {
        free(a);
        return NULL;
    }
    a->rank = em_pg_rank(a->pg);
    a->world = em_pg_world(a->pg);
    a->local_rank = a->rank;
    a->local_world = a->world;
    if (env_int("LOCAL_RANK", 0, &a->local_rank) || env_int("LOCAL_WORLD_SIZE", 1, &a->local_world)) {
        em_accelerator_free(a);
        return NULL;
    }
    if (resolve_device(a, cfg->device)) {
        em_accelerator_free(a);
        return NULL;
    }
    a->grad_accum = c.grad_accum;
    a->split_batches = c.split_batches;
    a->even_batches = c.even_batches;
    a->bucket_mb = cfg->bucket_mb;
    a->find_unused = cfg->find_unused_parameters;
    a->amp = c.mixed_precision == EM_PREC_BF16 ? EM_BF16 : c.mixed_precision == EM_PREC_FP16 ? EM_F16 : EM_F32;
    if (a->amp == EM_F16 && !(a->scaler = em_grad_scaler_new(&cfg->scaler))) {
        char msg[512];
        snprintf(msg, sizeof msg, "em_accelerator_new: %s", em_last_error());
        em_accelerator_free(a);
        em_set_error(EM_ERR_ARG, "%s", msg);
        return NULL;
    }
    return a;
}

void em_accelerator_free(em_accelerator *a)
{
    if (!a) return;
    if (a->autocast_on) em_autocast_set(a->autocast_prev);
    em_grad_scaler_free(a->scaler);
    em_ddp_free(a->ddp);
    free(a->params);
    em_pg_free(a->pg);
    free(a);
}

int em_accel_rank(const em_accelerator *a) { return a ? a->rank : -1; }
int em_accel_world(const em_accelerator *a) { return a ? a->world : -1; }
int em_accel_local_rank(const em_accelerator *a) { return a ? a->local_rank : -1; }
bool em_accel_is_main_process(const em_accelerator *a) { return a && a->rank == 0; }
bool em_accel_is_local_main(const em_accelerator *a) { return a && a->local_rank == 0; }
int em_accel_grad_accum(const em_accelerator *a) { return a ? a->grad_accum : -1; }
em_pg *em_accel_pg(const em_accelerator *a) { return a ? a->pg : NULL; }
em_device em_accel_device(const em_accelerator *a) { return a ? a->device : em_device_cpu(); }

em_status em_accel_to_device(em_accelerator *a, em_batch *b)
{
    if (!a || !b) return em_err(EM_ERR_ARG, "em_accel_to_device: %s is NULL", a ? "batch" : "accelerator");
    em_tensor *x = b->x ? em_to(b->x, a->device) : NULL, *y = b->y ? em_to(b->y, a->device) : NULL;
    if ((b->x && !x) || (b->y && !y)) return em_last_status();
    b->x = x;
    b->y = y;
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

/* whether every parameter of m is on dev (true for a model without any) */
static bool model_is_on(em_module *m, em_device dev)
{
    int n = em_module_params(m, NULL, 0);
    em_named *ps = calloc((size_t)n + 1, sizeof *ps);
    if (!ps) return false;
    em_module_params(m, ps, n);
    bool on = true;
    for (int i = 0; i < n && on; i++) on = em_device_equal(em_device_of(ps[i].t), dev);
    free(ps);
    return on;
}

static em_status prepare_model(em_accelerator *a, em_module *model)
{
    if (a->model) return em_err(EM_ERR_ARG, "em_accel_prepare: a model is already prepared");
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
    int n = em_module_params(model, NULL, 0);
    em_named *ps = calloc((size_t)n + 1, sizeof *ps);
    a->params = calloc((size_t)n + 1, sizeof *a->params);
    if (!ps || !a->params) {
        free(ps);
        return em_err(EM_ERR_OOM, "em_accel_prepare: out of memory");
    }
    em_module_params(model, ps, n);
    for (int i = 0; i < n; i++) a->params[i] = ps[i].t;
    free(ps);
    a->nparams = n;
    if (a->world > 1) {
        em_ddp_config dc = {.bucket_mb = a->bucket_mb, .find_unused_parameters = a->find_unused};
        a->ddp = em_ddp_new(a->pg, model, &dc);
        if (!a->ddp) return em_last_status();
    }
    a->model = model;
    if (a->amp != EM_F32 && !a->autocast_on) { /* the forward passes from here on */
        a->autocast_prev = em_autocast_set(a->amp);
        a->autocast_on = true;
    }
    return EM_OK;
}

em_status em_accel_prepare(em_accelerator *a, em_module *model, em_optimizer *opt, em_loader *loader,
                           const em_lr_schedule *sched)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_prepare: accelerator is NULL");
    em_status s;
    if (sched && (s = em_lr_schedule_check(sched))) return s;
    if (model && (s = prepare_model(a, model))) return s;
    if (loader) {
        if ((s = em_loader_set_shard(loader, a->rank, a->world, a->split_batches, a->even_batches))) return s;
        a->loader = loader;
    }
    if (opt) a->opt = opt;
    if (sched) {
        a->sched = *sched;
        a->has_sched = true;
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

/* ---- the loop ------------------------------------------------------------------ */

bool em_accel_next(em_accelerator *a, em_batch *b)
{
    if (!a || !a->loader) {
        if (b) *b = (em_batch){0};
        em_err(EM_ERR_ARG, "em_accel_next: %s", a ? "no loader was prepared" : "accelerator is NULL");
        return false;
    }
    bool got = em_loader_next(a->loader, b);
    a->end_of_data = got && em_loader_position(a->loader).batch == em_loader_num_batches(a->loader);
    if (got && a->device.type != EM_CPU && em_accel_to_device(a, b)) return false;
    return got;
}

bool em_accel_accumulate(em_accelerator *a)
{
    if (!a) return false;
    if (a->end_of_data) {
        a->micro = 0;
        a->sync = true;
    } else {
        a->micro++;
        a->sync = a->micro % a->grad_accum == 0;
        if (a->sync) a->micro = 0;
    }
    return a->sync;
}

em_status em_accel_backward(em_accelerator *a, em_tensor *loss)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_backward: accelerator is NULL");
    if (!loss) return em_last_status() ? em_last_status() : em_err(EM_ERR_ARG, "em_accel_backward: loss is NULL");
    /* without em_accel_accumulate every micro-step is a sync step */
    if (a->grad_accum == 1) a->sync = true;
    em_tensor *l = a->grad_accum > 1 ? em_mul_scalar(loss, 1.0 / a->grad_accum) : loss;
    if (l && a->scaler) l = em_scaler_scale(a->scaler, l); /* fp16: keep small gradients representable */
    if (!l) return em_last_status();
    if (!a->ddp) return em_backward(l, NULL);
    em_ddp_set_sync(a->ddp, a->sync);
    return em_ddp_backward(a->ddp, l, NULL);
}

double em_accel_clip_grad_norm(em_accelerator *a, double max_norm, em_status *status)
{
    if (!a || !a->model) {
        em_status s = em_err(EM_ERR_ARG, "em_accel_clip_grad_norm: %s",
                             a ? "no model was prepared" : "accelerator is NULL");
        if (status) *status = s;
        return NAN;
    }
    if (status) *status = EM_OK;
    if (!a->sync) return NAN; /* gradients are still accumulating: nothing to clip yet */
    if (a->scaler) { /* clip the true gradients: unscale first (once per step) */
        em_status s = em_scaler_unscale(a->scaler, a->nparams, a->params, a->pg);
        if (s) {
            if (status) *status = s;
            return NAN;
        }
        if (em_scaler_found_inf(a->scaler)) return INFINITY; /* this step will be skipped */
    }
    /* after a synced backward every rank holds the same averaged gradients,
     * so the local norm is the global one */
    return em_clip_grad_norm(a->nparams, a->params, max_norm, status);
}

em_status em_accel_step(em_accelerator *a)
{
    if (!a || !a->opt) return em_err(EM_ERR_ARG, "em_accel_step: %s", a ? "no optimizer was prepared" : "accelerator is NULL");
    if (!a->sync) return EM_OK;
    em_status s;
    a->skipped = false;
    if (a->scaler) {
        /* every rank agreed on found_inf in the unscale: all skip, or none */
        if ((s = em_scaler_unscale(a->scaler, a->nparams, a->params, a->pg))) return s;
        a->skipped = em_scaler_found_inf(a->scaler);
        em_scaler_update(a->scaler);
        if (a->skipped) return EM_OK; /* no update, and the schedule stays where it is */
    }
    if (a->has_sched && (s = em_optim_set_lr(a->opt, -1, em_lr_at(&a->sched, a->steps)))) return s;
    if ((s = em_optim_step(a->opt))) return s;
    a->steps++;
    return EM_OK;
}

em_status em_accel_zero_grad(em_accelerator *a)
{
    if (!a || !a->opt) return em_err(EM_ERR_ARG, "em_accel_zero_grad: %s", a ? "no optimizer was prepared" : "accelerator is NULL");
    if (!a->sync) return EM_OK;
    return em_optim_zero_grad(a->opt);
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
    if (!all || !a->loader || !a->end_of_data) return all;
    int64_t pad = em_loader_padding(a->loader);
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
