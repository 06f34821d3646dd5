/* optim_state.c — an optimizer's state as named tensors (em_optim_state,
 * em_optim_load_state) and gradient clipping by the global norm of any
 * order (em_clip_grad_norm_with, torch.nn.utils.clip_grad_norm_). */
#include <stdio.h>
#include <stdlib.h>

#include "optim_impl.h"
#include "tensor/kernel_impl.h"
#include "tensor/profile_impl.h"
#include "update_math.h"
#if EM_HAVE_CUDA
#include "cuda_optim.h"
#endif

/* ---- state --------------------------------------------------------------- */

em_status opt_copy(tensor *dst, tensor *src)
{
    if (em_device_equal(dst->device, src->device)) {
        copy_strided(dst, src); /* on CUDA: queued, a launch failure shows up at the next check */
        return EM_OK;
    }
#if EM_HAVE_CUDA
    /* across devices: src contiguous on its device, to the host, converted
     * to dst's dtype there, then to dst */
    em_status s = EM_OK;
    tensor *sc = t_contig(src), *h = NULL, *hc = NULL;
    if (!sc) return em_last_status();
    if (t_on_cuda(sc)) {
        h = t_new_persistent(sc->dtype, sc->ndim, sc->shape);
        s = h ? cu_memcpy(t_ptr(h), em_device_cpu(), t_ptr(sc), sc->device, (size_t)t_numel(sc) * t_esize(sc))
              : em_last_status();
    }
    tensor *host = h ? h : sc;
    if (!s && host->dtype != dst->dtype) {
        hc = t_new_persistent(dst->dtype, dst->ndim, dst->shape);
        if (hc)
            copy_strided(hc, host);
        else
            s = em_last_status();
        host = hc;
    }
    if (!s) {
        if (t_on_cuda(dst))
            s = cu_memcpy(t_ptr(dst), dst->device, t_ptr(host), em_device_cpu(), (size_t)t_numel(dst) * t_esize(dst));
        else
            copy_strided(dst, host);
    }
    t_free(h);
    t_free(hc);
    if (sc != src) t_drop(sc);
    return s;
#else
    return em_err(EM_ERR_DEVICE, "em_optim: state copy between devices in a build without CUDA");
#endif
}

/* The handle em_optim_state gives for field f of parameter i: the state
 * itself on the CPU; for CUDA state a host copy (refreshed now) that the
 * optimizer owns. NULL + error. */
static em_tensor *state_handle(const em_optimizer *o, int i, int f)
{
    tensor *t = o->p[i].f[f];
    if (!t_on_cuda(t)) return t_handle(t);
    tensor **h = &o->p[i].host[f];
    if (!*h && !(*h = t_new_persistent(t->dtype, t->ndim, t->shape))) return NULL;
    return opt_copy(*h, t) ? NULL : t_handle(*h);
}

int em_optim_state(const em_optimizer *o, em_named *out, int max)
{
    if (!o) return em_err(EM_ERR_ARG, "em_optim_state: optimizer is NULL"), -1;
    int k = 0;
    if (k < max) out[k] = (em_named){"step", t_handle(o->step)};
    k++;
    for (int i = 0; i < o->np; i++) {
        const oparam *p = &o->p[i];
        if (!p->started) continue;
        for (int f = 0; f < F_COUNT; f++) {
            if (!opt_has_field(o, f)) continue;
            if (k < max) {
                out[k] = (em_named){p->name[f], state_handle(o, i, f)};
                if (!out[k].t) return -1;
            }
            k++;
        }
    }
    return k;
}

/* Parses "state.<i>.<field>" for o: sets *param and *field, or returns false. */
static bool parse_name(const em_optimizer *o, const char *name, int *param, int *field)
{
    if (strncmp(name, "state.", 6) != 0) return false;
    const char *s = name + 6;
    if (*s < '0' || *s > '9') return false;
    char *end;
    long i = strtol(s, &end, 10);
    if (*end != '.' || (end - s > 1 && *s == '0')) return false;
    for (int f = 0; f < F_COUNT; f++) {
        if (!strcmp(end + 1, opt_field_name[f]) && opt_has_field(o, f)) {
            *param = i > o->np ? o->np : (int)i; /* o->np = out of range */
            *field = f;
            return true;
        }
    }
    return false;
}

/* A step count: one finite, non-negative, integral value. */
static em_status chk_count(const char *fn, const char *name, const tensor *t)
{
    if (t_numel(t) != 1 || t->ndim > 1)
        return em_err(EM_ERR_SHAPE, "%s: '%s' must be a 0-dim tensor, got %s", fn, name, shp(t));
    double v;
    if (t_on_cuda(t)) {
        tensor *h = t_new_persistent(EM_F64, 0, NULL);
        em_status s = h ? opt_copy(h, (tensor *)t) : em_last_status();
        v = s ? NAN : *(double *)t_ptr(h);
        t_free(h);
        if (s) return s;
    } else
        v = ld(t->dtype, t_ptr(t));
    if (!(v >= 0 && v == floor(v) && v < 9e15))
        return em_err(EM_ERR_ARG, "%s: '%s' must be a non-negative integer count, got %g", fn, name, v);
    return EM_OK;
}

/* em_optim_load_state's checks of state against o (nothing is modified):
 * mask[i] (np + 1 ints, zeroed; [np] the global "step") gets the fields
 * found for parameter i. Errors name fn. */
static em_status check_state(const em_optimizer *o, int n, const em_named *state, int *mask, const char *fn)
{
    if (n < 0 || (n > 0 && !state)) return em_err(EM_ERR_ARG, "%s: bad state array (n=%d)", fn, n);
    for (int i = 0; i < o->np; i++)
        if (!t_resolve(o->p[i].h, fn)) return em_last_status();
    int full = 0;
    for (int f = 0; f < F_COUNT; f++)
        if (opt_has_field(o, f)) full |= 1 << f;
    em_status s = EM_OK;
    for (int k = 0; k < n && !s; k++) {
        const char *name = state[k].name;
        if (!name) {
            s = em_err(EM_ERR_ARG, "%s: state[%d] has no name", fn, k);
            break;
        }
        tensor *t = t_resolve(state[k].t, fn);
        if (!t) {
            s = em_last_status();
            break;
        }
        if (!em_dtype_is_float(t->dtype)) {
            s = em_err(EM_ERR_DTYPE, "%s: '%s' is %s%s; state tensors are float", fn, name,
                       em_dtype_name(t->dtype), shp(t));
            break;
        }
        int i = o->np, f = F_STEP;
        if (strcmp(name, "step") != 0 && !parse_name(o, name, &i, &f)) {
            s = em_err(EM_ERR_ARG, "%s: unknown state name '%s' for this optimizer", fn, name);
            break;
        }
        if (i == o->np && strcmp(name, "step") != 0) {
            s = em_err(EM_ERR_ARG, "%s: '%s': parameter index out of range (%d parameters)", fn, name, o->np);
            break;
        }
        if (mask[i] & (1 << f)) {
            s = em_err(EM_ERR_ARG, "%s: '%s' appears twice", fn, name);
            break;
        }
        mask[i] |= 1 << f;
        if (f == F_STEP) {
            s = chk_count(fn, name, t);
        } else {
            tensor *p = t_resolve(o->p[i].h, fn);
            int64_t want[EM_MAX_DIMS];
            int nd = opt_state_shape(&o->p[i], p, want);
            if (t->ndim != nd || memcmp(t->shape, want, sizeof(int64_t) * (size_t)nd))
                s = o->p[i].sharded ? em_err(EM_ERR_SHAPE, "%s: '%s' is %s but this rank's piece of parameter %d is (%lld)",
                                             fn, name, shp(t), i, (long long)o->p[i].n)
                                    : em_err(EM_ERR_SHAPE, "%s: '%s' is %s but parameter %d is %s", fn, name,
                                             shp(t), i, shp(p));
        }
    }
    if (!s && !(mask[o->np] & (1 << F_STEP))) s = em_err(EM_ERR_ARG, "%s: 'step' is missing", fn);
    for (int i = 0; i < o->np && !s; i++) {
        if (mask[i] == 0 || mask[i] == full) continue;
        for (int f = 0; f < F_COUNT; f++)
            if ((full & (1 << f)) && !(mask[i] & (1 << f)))
                s = em_err(EM_ERR_ARG, "%s: '%s' is missing (parameter %d has other state entries)", fn,
                           o->p[i].name[f], i);
    }
    return s;
}

em_status optim_check_state(const em_optimizer *o, int n, const em_named *state, const char *fn)
{
    if (!o) return em_err(EM_ERR_ARG, "%s: optimizer is NULL", fn);
    int *mask = calloc((size_t)o->np + 1, sizeof *mask);
    if (!mask) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    em_status s = check_state(o, n, state, mask, fn);
    free(mask);
    return s;
}

/* Whether state tensor t can become field f of parameter i as it is (no
 * copy): what opt_alloc_state would make there, a contiguous CPU tensor of
 * the state's dtype and shape beside a CPU parameter. */
static bool adoptable(const em_optimizer *o, int i, int f, const tensor *t, const char *fn)
{
    tensor *p = t_resolve(o->p[i].h, fn);
    if (t->depth != 0 || t_on_cuda(t) || t_on_cuda(p) || !t_is_contig(t)) return false;
    if (f == F_STEP) return t->dtype == EM_F64 && t->ndim == 0;
    int64_t want[EM_MAX_DIMS];
    int nd = opt_state_shape(&o->p[i], p, want);
    return t->dtype == opt_state_dtype(p->dtype) && t->ndim == nd &&
           !memcmp(t->shape, want, sizeof(int64_t) * (size_t)nd);
}

/* em_optim_load_state; with take, the entries adoptable() accepts become
 * the optimizer's own state (their handles set to NULL) instead of copies. */
static em_status load_state(em_optimizer *o, int n, em_named *state, bool take)
{
    const char *fn = "em_optim_load_state";
    if (!o) return em_err(EM_ERR_ARG, "%s: optimizer is NULL", fn);
    int *mask = calloc((size_t)o->np + 1, sizeof *mask); /* [np]: the global "step" */
    bool *adopt = calloc((size_t)(n > 0 ? n : 0) + 1, sizeof *adopt);
    if (!mask || !adopt) {
        free(mask);
        free(adopt);
        return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    }
    /* 1. check every entry */
    em_status s = check_state(o, n, state, mask, fn);
    /* 2. allocate what is missing and not taken (nothing is modified yet) */
    int *taken = s ? NULL : calloc((size_t)o->np + 1, sizeof *taken); /* per parameter: fields taken */
    if (!s && !taken) s = em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int k = 0; k < n && !s && take; k++) {
        int i = o->np, f = F_STEP;
        if (strcmp(state[k].name, "step") != 0) parse_name(o, state[k].name, &i, &f);
        if (i < o->np && (adopt[k] = adoptable(o, i, f, t_resolve(state[k].t, fn), fn))) taken[i] |= 1 << f;
    }
    for (int i = 0; i < o->np && !s; i++) {
        bool missing = false;
        for (int f = 0; f < F_COUNT; f++)
            missing |= opt_has_field(o, f) && !o->p[i].f[f] && !(taken[i] & (1 << f));
        if (mask[i] && missing) s = opt_alloc_state(o, i, t_resolve(o->p[i].h, fn));
    }
    free(taken);
    /* 3. copy (or take) */
    for (int k = 0; k < n && !s; k++) {
        tensor *t = t_resolve(state[k].t, fn);
        int i = o->np, f = F_STEP;
        if (strcmp(state[k].name, "step") != 0) parse_name(o, state[k].name, &i, &f);
        if (adopt[k]) {
            t_free(o->p[i].f[f]);
            o->p[i].f[f] = t;
            state[k].t = NULL;
            continue;
        }
        tensor *dst = i == o->np ? o->step : o->p[i].f[f];
        if (f == F_STEP && !t_on_cuda(t))
            *(double *)t_ptr(dst) = ld(t->dtype, t_ptr(t));
        else if ((s = opt_copy(dst, t))) /* device state: through the host; only this can fail here */
            break;
    }
    if (!s)
        for (int i = 0; i < o->np; i++) o->p[i].started = mask[i] != 0;
    free(mask);
    free(adopt);
    return s;
}

em_status em_optim_load_state(em_optimizer *o, int n, const em_named *state)
{
    return load_state(o, n, (em_named *)state, false); /* without take, state is only read */
}

em_status optim_load_state_taking(em_optimizer *o, int n, em_named *state)
{
    return load_state(o, n, state, true);
}

/* ---- gradient clipping ---------------------------------------------------- */

enum { BLOCK = 1 << 16, CHUNK = 2048 };

/* The p-norm's accumulation (update_math.h's norm_acc) of a contiguous
 * f32/f64 array in fixed blocks (so the result does not depend on the
 * thread count). An f32 element counts as x * pre, the f32 product the
 * loss scaler's unscale would store (grad_scale_elem; pre 1 leaves every
 * value as it is: the norm of the gradients as they lie). */
typedef struct norm_job {
    const void *x;
    bool f64;
    int64_t n;
    double p;
    double *part; /* one per block */
    float pre;
} norm_job;

static void norm_range(void *ctx, int64_t lo, int64_t hi)
{
    const norm_job *j = ctx;
    for (int64_t b = lo; b < hi; b++) {
        int64_t s = b * BLOCK, e = s + BLOCK < j->n ? s + BLOCK : j->n;
        double acc = 0;
        int64_t i = s;
        if (j->p == 2) {
            /* eight independent sums (lane = i % 8), so the loop vectorises;
             * the order is fixed, so the result does not depend on the
             * thread count */
            double lane[8] = {0};
            if (j->f64) {
                const double *x = j->x;
                for (; i + 8 <= e; i += 8)
                    for (int k = 0; k < 8; k++) lane[k] += x[i + k] * x[i + k];
                for (; i < e; i++) acc += x[i] * x[i];
            } else {
                const float *x = j->x;
                float pre = j->pre;
                for (; i + 8 <= e; i += 8)
                    for (int k = 0; k < 8; k++) {
                        float v = x[i + k] * pre;
                        lane[k] += (double)v * v;
                    }
                for (; i < e; i++) {
                    float v = x[i] * pre;
                    acc += (double)v * v;
                }
            }
            for (int k = 0; k < 8; k++) acc += lane[k];
        } else if (j->f64) {
            const double *x = j->x;
            for (; i < e; i++) acc = norm_acc(acc, x[i], j->p);
        } else {
            const float *x = j->x;
            for (; i < e; i++) acc = norm_acc(acc, x[i] * j->pre, j->p);
        }
        j->part[b] = acc;
    }
}

/* The p-norm's accumulation of n contiguous values at x (f64, else f32,
 * each times pre) in norm_job's blocks over the pool, joined in order;
 * part: one double per block. */
static double array_norm_acc(const void *x, bool f64, int64_t n, double p, float pre, double *part)
{
    int64_t nb = (n + BLOCK - 1) / BLOCK;
    norm_job j = {x, f64, n, p, part, pre};
    parallel_for(nb, 1, norm_range, &j);
    double acc = 0;
    for (int64_t b = 0; b < nb; b++) acc = norm_join(acc, part[b], p);
    return acc;
}

em_status opt_norm_acc(const void *x, bool f64, int64_t n, double p, float pre, double *acc)
{
    size_t m = tmp_mark();
    double *part = tmp_alloc((size_t)((n + BLOCK - 1) / BLOCK + 1) * sizeof(double));
    if (!part) {
        tmp_release(m);
        return em_err(EM_ERR_OOM, "clipping: out of memory for the norm's %lld block sums",
                      (long long)((n + BLOCK - 1) / BLOCK));
    }
    *acc = array_norm_acc(x, f64, n, p, pre, part);
    tmp_release(m);
    return EM_OK;
}

/* The p-norm's accumulation of g in double (its values times pre: a
 * contiguous f32 g only, else pre is 1); buf: CHUNK doubles of scratch;
 * part: enough blocks. */
static double grad_norm_acc(tensor *g, double p, float pre, double *buf, double *part)
{
    int64_t n = t_numel(g);
    double acc = 0;
    if (t_is_contig(g) && (g->dtype == EM_F32 || g->dtype == EM_F64))
        return array_norm_acc(t_ptr(g), g->dtype == EM_F64, n, p, pre, part);
    for (int64_t lo = 0; lo < n; lo += CHUNK) {
        int64_t k = n - lo < CHUNK ? n - lo : CHUNK;
        opt_gather(g, lo, k, EM_F64, buf);
        for (int64_t i = 0; i < k; i++) acc = norm_acc(acc, buf[i], p);
    }
    return acc;
}

/* ---- scaling gradients over the pool (clipping, the loss scaler's unscale) ---- */

/* g[lo,hi) (contiguous, a float dtype) *= c by grad_scale_elem, then
 * (c2 != 1: a contiguous f32 g only) *= c2 the same way, in the same
 * pass: the bits of two passes; whether any product by c is inf or NaN.
 * One loop per dtype, so the f32 and f64 ones vectorise: x and c are
 * locals (read through a job pointer, gcc reloaded both after every
 * store, as they might alias x, and left the loop scalar), and the
 * non-finite products are counted, not OR-ed into a bool (that kept a
 * compare, a setcc and an OR per element scalar). */
static bool scale_span(tensor *g, int64_t lo, int64_t hi, double c, double c2)
{
    void *x = t_ptr(g);
    int64_t nbad = 0;
    if (g->dtype == EM_F32 && c2 != 1)
        for (int64_t i = lo; i < hi; i++) {
            nbad += !grad_scale_elem(EM_F32, x, i, c);
            (void)grad_scale_elem(EM_F32, x, i, c2);
        }
    else if (g->dtype == EM_F32)
        for (int64_t i = lo; i < hi; i++) nbad += !grad_scale_elem(EM_F32, x, i, c);
    else if (g->dtype == EM_F64)
        for (int64_t i = lo; i < hi; i++) nbad += !grad_scale_elem(EM_F64, x, i, c);
    else /* f16, bf16: through f32 */
        for (int64_t i = lo; i < hi; i++) nbad += !grad_scale_elem(g->dtype, x, i, c);
    return nbad != 0;
}

/* a gradient scaled in the pool: contiguous, of a float dtype */
static bool pool_scaled(const tensor *g) { return g && t_is_contig(g) && em_dtype_is_float(g->dtype); }

typedef struct scale_job {
    tensor *const *g; /* n gradients (the small ones), or one (a large one) */
    double c, c2;
    int bad; /* set (relaxed) by any task that met an inf or NaN */
} scale_job;

static void flag_bad(scale_job *j, bool bad)
{
    if (bad) __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
}

static void scale_small(void *ctx, int64_t lo, int64_t hi)
{
    scale_job *j = ctx;
    for (int64_t i = lo; i < hi; i++)
        if (pool_scaled(j->g[i]) && t_numel(j->g[i]) <= BLOCK)
            flag_bad(j, scale_span(j->g[i], 0, t_numel(j->g[i]), j->c, j->c2));
}

static void scale_part(void *ctx, int64_t lo, int64_t hi)
{
    scale_job *j = ctx;
    flag_bad(j, scale_span(j->g[0], lo, hi, j->c, j->c2));
}

bool opt_scale_grads2(tensor *const *gs, int n, double c, double c2, double *buf)
{
    scale_job j = {.g = gs, .c = c, .c2 = c2};
    parallel_for(n, 8, scale_small, &j);
    for (int i = 0; i < n; i++) {
        tensor *g = gs[i];
        if (!g || (pool_scaled(g) && t_numel(g) <= BLOCK)) continue;
        int64_t ne = t_numel(g);
        if (pool_scaled(g)) {
            scale_job one = {.g = &gs[i], .c = c, .c2 = c2};
            parallel_for(ne, 1 << 15, scale_part, &one);
            flag_bad(&j, one.bad);
            continue;
        }
        for (int64_t lo = 0; lo < ne; lo += CHUNK) { /* strided: CHUNK elements at a time through buf */
            int64_t k = ne - lo < CHUNK ? ne - lo : CHUNK;
            bool bad = false;
            opt_gather(g, lo, k, g->dtype, buf);
            for (int64_t e = 0; e < k; e++) bad |= !grad_scale_elem(g->dtype, buf, e, c);
            opt_scatter(g, lo, k, g->dtype, buf);
            flag_bad(&j, bad);
        }
    }
    return j.bad != 0;
}

bool opt_scale_grads(tensor *const *gs, int n, double c, double *buf)
{
    return opt_scale_grads2(gs, n, c, 1, buf);
}

/* The gradient clipping acts on: a leaf's gradient since the last
 * set-to-none zero_grad, or NULL. */
static tensor *clip_grad(em_tensor *h) { return t_live_grad(t_resolve(h, "em_clip_grad_norm")); }

em_status opt_clip_check(const char *fn, const em_clip_config *cfg, double *p)
{
    if (!cfg) return em_err(EM_ERR_ARG, "%s: cfg is NULL", fn);
    if (!(cfg->max_norm >= 0))
        return em_err(EM_ERR_ARG, "%s: max_norm must be >= 0, got %g", fn, cfg->max_norm);
    *p = cfg->norm_type == 0 ? 2.0 : cfg->norm_type;
    if (!(*p > 0))
        return em_err(EM_ERR_ARG, "%s: norm_type must be > 0 or inf (0 means 2), got %g", fn, cfg->norm_type);
    return EM_OK;
}

em_status opt_clip_refuse(const char *fn, double total, double p, const char *where)
{
    return em_err(EM_ERR_ARG,
                  "%s: the total %g-norm of the gradients is %g%s, so they cannot be clipped; nothing was "
                  "changed (error_if_nonfinite is set; unset it to scale them by that norm anyway)",
                  fn, p, total, where);
}

/* The norms of gradients of at most one BLOCK (a small model's every
 * parameter, a big one's biases and norms): one thread each, over the
 * pool, instead of each a serial pass of its own (opt_scale_grads splits
 * the scaling alike). Per gradient the same arithmetic as grad_norm_acc,
 * so the same bits. */
typedef struct small_grads {
    tensor **g;  /* every parameter's gradient (NULL: none); the small ones are done here */
    double p;    /* the norm's p */
    double *acc; /* per gradient */
    float pre;   /* norm_job's */
} small_grads;

/* contiguous f32/f64 of at most one BLOCK */
static bool small_grad(const tensor *g)
{
    return g && t_is_contig(g) && (g->dtype == EM_F32 || g->dtype == EM_F64) && t_numel(g) <= BLOCK;
}

static void small_norms(void *ctx, int64_t lo, int64_t hi)
{
    small_grads *q = ctx;
    for (int64_t i = lo; i < hi; i++) {
        tensor *g = q->g[i];
        if (!small_grad(g)) continue;
        double part = 0;
        norm_job j = {t_ptr(g), g->dtype == EM_F64, t_numel(g), q->p, &part, q->pre};
        norm_range(&j, 0, t_numel(g) > 0 ? 1 : 0);
        q->acc[i] = norm_join(0, part, q->p);
    }
}

/* The refusal of a non-finite total, naming the first of the n parameters
 * whose accumulation acc[i] is not finite. */
static em_status refuse_at(const char *fn, double total, double p, int n, em_tensor *const *params,
                           const double *acc)
{
    char where[160] = "";
    for (int i = 0; i < n; i++)
        if (!isfinite(acc[i])) {
            tensor *t = t_resolve(params[i], fn);
            snprintf(where, sizeof where, " (parameter %d %s%s has a gradient that is not finite)", i,
                     em_dtype_name(t->dtype), shp(t));
            break;
        }
    return opt_clip_refuse(fn, total, p, where);
}

#if EM_HAVE_CUDA
/* em_clip_grad_norm_with when the gradients are on a CUDA device (all on
 * one): each gradient's accumulation into a slot of a device array (a fixed
 * block reduction), one copy of the array to the host, the total joined
 * there in parameter order, then a scale kernel per gradient. */
static double clip_cuda(int n, em_tensor *const *params, const em_clip_config *cfg, double p, em_status *st)
{
    const char *fn = "em_clip_grad_norm";
    em_device dev = {EM_CPU, 0};
    for (int i = 0; i < n && dev.type == EM_CPU; i++) { /* the device of the first CUDA gradient */
        tensor *g = clip_grad(params[i]);
        if (g && t_on_cuda(g)) dev = g->device;
    }
    for (int i = 0; i < n; i++) {
        tensor *g = clip_grad(params[i]);
        if (!g) continue;
        if (!em_device_equal(dev, g->device)) {
            char a[16], b[16];
            *st = em_err(EM_ERR_DEVICE, "%s: parameter %d's gradient is on %s but another's is on %s", fn, i,
                         em_device_str(g->device, a, sizeof a), em_device_str(dev, b, sizeof b));
            return NAN;
        }
        if (!t_is_contig(g) || !em_dtype_is_float(g->dtype)) {
            *st = em_err(EM_ERR_UNSUPPORTED, "%s: CUDA gradient of parameter %d (%s%s) is not contiguous", fn, i,
                         em_dtype_name(g->dtype), shp(g));
            return NAN;
        }
    }
    double *acc_dev = cu_alloc(dev.index, (size_t)n * sizeof(double)),
           *acc = calloc((size_t)n, sizeof(double));
    em_status s = acc_dev && acc ? EM_OK : em_err(EM_ERR_OOM, "%s: out of memory for %d sums", fn, n);
    if (!s) s = cu_fill(dev.index, EM_F64, acc_dev, n, 0);
    for (int i = 0; i < n && !s; i++) {
        tensor *g = clip_grad(params[i]);
        if (g) s = cu_norm_acc(dev.index, g->dtype, t_ptr(g), t_numel(g), p, &acc_dev[i]);
    }
    if (!s) s = cu_memcpy(acc, em_device_cpu(), acc_dev, dev, (size_t)n * sizeof(double)); /* the one sync */
    double total = NAN;
    if (!s) {
        /* total = the norm of them all;  g *= min(1, max_norm / (total + 1e-6)) */
        double all = 0;
        for (int i = 0; i < n; i++) all = norm_join(all, acc[i], p);
        total = norm_root(all, p);
        double c = cfg->max_norm / (total + 1e-6);
        if (!isfinite(total) && cfg->error_if_nonfinite)
            s = refuse_at(fn, total, p, n, params, acc);
        else if (!(c >= 1.0)) /* NaN too: torch's clamp passes it through */
            for (int i = 0; i < n && !s; i++) {
                tensor *g = clip_grad(params[i]);
                if (g) s = cu_scale(dev.index, g->dtype, t_ptr(g), t_numel(g), c);
            }
    }
    if (acc_dev) cu_free(dev.index, acc_dev);
    free(acc);
    *st = s;
    return s ? NAN : total;
}
#endif

/* What clip_grad_norm does beside clipping, for opt_unscale_clip: the
 * loss scaler's unscale (pre: its 1/scale; every gradient a contiguous
 * f32 one on the CPU) and its agreement across ranks (vote, or NULL). */
typedef struct clip_unscale {
    double pre;
    opt_vote_fn vote;
    void *ctx;
    bool found_inf; /* out */
} clip_unscale;

static double clip_grad_norm(int n, em_tensor *const *params, const em_clip_config *cfg, clip_unscale *u,
                             em_status *status);

double em_clip_grad_norm_with(int n, em_tensor *const *params, const em_clip_config *cfg, em_status *status)
{
    prof_mark pm;
    prof_begin(&pm);
    double norm = clip_grad_norm(n, params, cfg, NULL, status);
    prof_end(&pm, "clip_grad_norm", PROF_OPTIMIZER);
    return norm;
}

double em_clip_grad_norm(int n, em_tensor *const *params, double max_norm, em_status *status)
{
    return em_clip_grad_norm_with(n, params, &(em_clip_config){.max_norm = max_norm}, status);
}

/* The gradients opt_unscale_clip takes: p = 2, and each a contiguous f32
 * one on the CPU, or none */
static bool unscale_clip_fits(int n, em_tensor *const *params, const em_clip_config *cfg)
{
    double p = 0;
    if (n < 0 || (n > 0 && !params) || opt_clip_check("em_scaler_unscale_clip", cfg, &p) || p != 2)
        return false;
    for (int i = 0; i < n; i++) {
        tensor *t = t_resolve(params[i], "em_scaler_unscale_clip");
        if (!t) return false;
        tensor *g = t_live_grad(t);
        if (g && (g->dtype != EM_F32 || !t_is_contig(g) || t_on_cuda(g))) return false;
    }
    return true;
}

double opt_unscale_clip(int n, em_tensor *const *params, const em_clip_config *cfg, double inv,
                        opt_vote_fn vote, void *ctx, bool *taken, bool *found_inf, em_status *status)
{
    *taken = false;
    *found_inf = false;
    *status = EM_OK;
    if (!unscale_clip_fits(n, params, cfg)) return NAN;
    *taken = true;
    clip_unscale u = {.pre = inv, .vote = vote, .ctx = ctx};
    double total = clip_grad_norm(n, params, cfg, &u, status);
    *found_inf = u.found_inf;
    return total;
}

static double clip_grad_norm(int n, em_tensor *const *params, const em_clip_config *cfg, clip_unscale *u,
                             em_status *status)
{
    const char *fn = u ? "em_scaler_unscale_clip" : "em_clip_grad_norm";
    em_status s = EM_OK;
    double total = NAN, p = 2;
    if (n < 0 || (n > 0 && !params))
        s = em_err(EM_ERR_ARG, "%s: bad parameter array (n=%d)", fn, n);
    else
        s = opt_clip_check(fn, cfg, &p);
    for (int i = 0; i < n && !s; i++)
        if (!t_resolve(params[i], fn)) s = em_last_status();
    if (s) {
        if (status) *status = s;
        return NAN;
    }
#if EM_HAVE_CUDA
    for (int i = 0; i < n; i++) {
        tensor *g = clip_grad(params[i]);
        if (g && t_on_cuda(g)) {
            total = clip_cuda(n, params, cfg, p, &s);
            if (status) *status = s;
            return total;
        }
    }
#endif
    size_t m = tmp_mark();
    tensor **gs = tmp_alloc((size_t)(n > 0 ? n : 1) * sizeof(tensor *)); /* each parameter's gradient */
    int64_t blocks = 1;
    for (int i = 0; gs && i < n; i++) {
        gs[i] = clip_grad(params[i]);
        int64_t b = gs[i] ? (t_numel(gs[i]) + BLOCK - 1) / BLOCK : 0;
        if (b > blocks) blocks = b;
    }
    double *buf = tmp_alloc(CHUNK * sizeof(double)), *part = tmp_alloc((size_t)blocks * sizeof(double)),
           *acc = tmp_alloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!gs || !buf || !part || !acc) {
        tmp_release(m);
        s = em_err(EM_ERR_OOM, "%s: out of memory for scratch", fn);
        if (status) *status = s;
        return NAN;
    }
    /* total = the norm of them all;  g *= min(1, max_norm / (total + 1e-6)) */
    float pre = u ? (float)u->pre : 1.0f; /* (grad_scale_elem's f32 factor) */
    small_grads sg = {gs, p, acc, pre};
    parallel_for(n, 8, small_norms, &sg);
    double all = 0;
    for (int i = 0; i < n; i++) {
        if (!small_grad(gs[i])) acc[i] = gs[i] ? grad_norm_acc(gs[i], p, pre, buf, part) : 0;
        all = norm_join(all, acc[i], p);
    }
    total = norm_root(all, p);
    if (u) {
        /* f32 values' squares cannot sum past a double's range, so a total
         * that is not finite means a value that is not: the unscale alone,
         * and the step is to be skipped (on every rank, by the vote) */
        bool bad = !isfinite(total);
        if (u->vote && (s = u->vote(u->ctx, &bad))) {
            tmp_release(m);
            if (status) *status = s;
            return NAN;
        }
        if (bad) {
            (void)opt_scale_grads(gs, n, u->pre, buf);
            u->found_inf = true;
            tmp_release(m);
            if (status) *status = EM_OK;
            return INFINITY;
        }
    }
    if (!isfinite(total) && cfg->error_if_nonfinite) {
        s = refuse_at(fn, total, p, n, params, acc);
        tmp_release(m);
        if (status) *status = s;
        return NAN;
    }
    double c = cfg->max_norm / (total + 1e-6);
    bool clip = !(c >= 1.0); /* NaN too: torch's clamp passes it through */
    if (u)                   /* the unscale always, the clip's factor after it where it scales */
        (void)opt_scale_grads2(gs, n, u->pre, clip ? c : 1, buf);
    else if (clip)
        (void)opt_scale_grads(gs, n, c, buf);
    tmp_release(m);
    if (status) *status = EM_OK;
    return total;
}
