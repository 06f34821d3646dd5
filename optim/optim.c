/* optim.c — SGD, Adam and AdamW (torch.optim semantics): configs and their
 * checks, construction over persistent leaf parameters, parameter groups, and
 * em_optim_step with its plain-loop update kernels (f32 and f64; f16/bf16 go
 * through f32 chunks). State save/load and clipping are in optim_state.c. */
#include <stdio.h>
#include <stdlib.h>

#include "optim_impl.h"
#include "tensor/kernel_impl.h"
#include "tensor/profile_impl.h"
#include "update_math.h"
#if EM_HAVE_CUDA
#include "cuda_optim.h"
#endif

/* ---- configs ------------------------------------------------------------ */

em_sgd_config em_sgd_defaults(void)
{
    return (em_sgd_config){.lr = NAN, .momentum = 0, .dampening = 0, .weight_decay = 0, .nesterov = false};
}

em_adam_config em_adam_defaults(void)
{
    return (em_adam_config){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0};
}

em_adam_config em_adamw_defaults(void)
{
    em_adam_config c = em_adam_defaults();
    c.weight_decay = 1e-2;
    return c;
}

/* "x >= 0" written so that NaN fails it too. */
static em_status chk_nonneg(const char *fn, const char *field, double v)
{
    if (!(v >= 0)) return em_err(EM_ERR_ARG, "%s: %s must be >= 0, got %g", fn, field, v);
    return EM_OK;
}

static em_status chk_beta(const char *fn, const char *field, double v)
{
    if (!(v >= 0 && v < 1)) return em_err(EM_ERR_ARG, "%s: %s must be in [0, 1), got %g", fn, field, v);
    return EM_OK;
}

static em_status chk_sgd(const char *fn, const em_sgd_config *c)
{
    if (isnan(c->lr)) return em_err(EM_ERR_ARG, "%s: lr is required (set cfg.lr), got nan", fn);
    if (chk_nonneg(fn, "lr", c->lr) || chk_nonneg(fn, "momentum", c->momentum) ||
        chk_nonneg(fn, "weight_decay", c->weight_decay))
        return EM_ERR_ARG;
    if (isnan(c->dampening)) return em_err(EM_ERR_ARG, "%s: dampening is nan", fn);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        return em_err(EM_ERR_ARG,
                      "%s: nesterov needs momentum > 0 and dampening == 0, got momentum=%g dampening=%g", fn,
                      c->momentum, c->dampening);
    return EM_OK;
}

static em_status chk_adam(const char *fn, const em_adam_config *c)
{
    if (chk_nonneg(fn, "lr", c->lr) || chk_beta(fn, "beta1", c->beta1) || chk_beta(fn, "beta2", c->beta2) ||
        chk_nonneg(fn, "eps", c->eps) || chk_nonneg(fn, "weight_decay", c->weight_decay))
        return EM_ERR_ARG;
    return EM_OK;
}

/* ---- construction and groups ---------------------------------------------- */

/* Checks n parameters for a new group of o (o->np existing ones): alive,
 * float, leaf, requires grad, persistent, each once. */
static em_status chk_params(const char *fn, const em_optimizer *o, int n, em_tensor *const *params)
{
    if (n <= 0 || !params) return em_err(EM_ERR_ARG, "%s: needs at least one parameter, got n=%d", fn, n);
    for (int i = 0; i < n; i++) {
        if (!params[i]) return em_err(EM_ERR_ARG, "%s: params[%d] is NULL", fn, i);
        tensor *t = t_resolve(params[i], fn);
        if (!t) return em_last_status();
        if (!em_dtype_is_float(t->dtype))
            return em_err(EM_ERR_DTYPE, "%s: params[%d] is %s%s; parameters must be float tensors", fn, i,
                          em_dtype_name(t->dtype), shp(t));
        if (t->grad_fn)
            return em_err(EM_ERR_ARG, "%s: params[%d] %s%s is not a leaf (made by op '%s')", fn, i,
                          em_dtype_name(t->dtype), shp(t), op_name(t->grad_fn->op));
        if (!t->requires_grad)
            return em_err(EM_ERR_ARG, "%s: params[%d] %s%s does not require grad", fn, i,
                          em_dtype_name(t->dtype), shp(t));
        if (t->depth != 0)
            return em_err(EM_ERR_SCOPE,
                          "%s: params[%d] %s%s belongs to step scope depth %d; parameters must be persistent",
                          fn, i, em_dtype_name(t->dtype), shp(t), t->depth);
        for (int j = 0; j < i; j++)
            if (t_resolve(params[j], fn) == t)
                return em_err(EM_ERR_ARG, "%s: params[%d] and params[%d] are the same tensor", fn, j, i);
        for (int j = 0; o && j < o->np; j++)
            if (t_resolve(o->p[j].h, fn) == t)
                return em_err(EM_ERR_ARG,
                              "%s: params[%d] is already parameter %d (group %d) of the optimizer", fn, i, j,
                              o->p[j].group);
    }
    return EM_OK;
}

const char *const opt_field_name[F_COUNT] = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                             "momentum_buffer"};

/* Appends a group (params already checked). */
static int push_group(em_optimizer *o, const char *fn, int n, em_tensor *const *params, double lr, double wd)
{
    if (o->ng == o->cap_g) {
        int cap = o->cap_g ? 2 * o->cap_g : 4;
        ogroup *g = realloc(o->g, sizeof *g * (size_t)cap);
        if (!g) return em_err(EM_ERR_OOM, "%s: out of memory", fn), -1;
        o->g = g, o->cap_g = cap;
    }
    if (o->np + n > o->cap_p) {
        int cap = o->cap_p ? o->cap_p : 8;
        while (cap < o->np + n) cap *= 2;
        oparam *p = realloc(o->p, sizeof *p * (size_t)cap);
        if (!p) return em_err(EM_ERR_OOM, "%s: out of memory", fn), -1;
        o->p = p, o->cap_p = cap;
    }
    int gi = o->ng++;
    o->g[gi] = (ogroup){.lr = lr, .wd = wd, .base_lr = lr};
    for (int k = 0; k < n; k++) {
        int i = o->np++;
        oparam *p = &o->p[i];
        memset(p, 0, sizeof *p);
        p->h = params[k];
        p->group = gi;
        for (int f = 0; f < F_COUNT; f++)
            snprintf(p->name[f], sizeof p->name[f], "state.%d.%s", i, opt_field_name[f]);
    }
    return gi;
}

static em_optimizer *opt_new(const char *fn, opt_kind kind, int n, em_tensor *const *params, double lr,
                             double wd)
{
    if (chk_params(fn, NULL, n, params)) return NULL;
    em_optimizer *o = calloc(1, sizeof *o);
    if (!o) return em_fail(EM_ERR_OOM, "%s: out of memory", fn);
    o->kind = kind;
    o->step = t_new_persistent(EM_F64, 0, NULL);
    if (o->step) *(double *)t_ptr(o->step) = 0;
    if (!o->step || push_group(o, fn, n, params, lr, wd) < 0) {
        em_optim_free(o);
        return NULL;
    }
    return o;
}

em_optimizer *em_sgd_new(int n, em_tensor *const *params, const em_sgd_config *cfg)
{
    const char *fn = "em_sgd_new";
    if (!cfg)
        return em_fail(EM_ERR_ARG, "%s: cfg is NULL; SGD has no default lr (use em_sgd_defaults and set lr)",
                       fn);
    if (chk_sgd(fn, cfg)) return NULL;
    em_optimizer *o = opt_new(fn, OPT_SGD, n, params, cfg->lr, cfg->weight_decay);
    if (o) o->sgd = *cfg;
    return o;
}

static em_optimizer *adam_new(const char *fn, opt_kind kind, int n, em_tensor *const *params,
                              const em_adam_config *cfg)
{
    em_adam_config c = cfg ? *cfg : kind == OPT_ADAMW ? em_adamw_defaults() : em_adam_defaults();
    if (chk_adam(fn, &c)) return NULL;
    em_optimizer *o = opt_new(fn, kind, n, params, c.lr, c.weight_decay);
    if (o) o->adam = c;
    return o;
}

em_optimizer *em_adam_new(int n, em_tensor *const *params, const em_adam_config *cfg)
{
    return adam_new("em_adam_new", OPT_ADAM, n, params, cfg);
}

em_optimizer *em_adamw_new(int n, em_tensor *const *params, const em_adam_config *cfg)
{
    return adam_new("em_adamw_new", OPT_ADAMW, n, params, cfg);
}

void em_optim_free(em_optimizer *o)
{
    if (!o) return;
    for (int i = 0; i < o->np; i++)
        for (int f = 0; f < F_COUNT; f++) {
            t_free(o->p[i].f[f]);
            t_free(o->p[i].host[f]);
        }
    t_free(o->step);
    free(o->p);
    free(o->g);
    free(o);
}

int em_optim_add_group(em_optimizer *o, int n, em_tensor *const *params, double lr, double weight_decay)
{
    const char *fn = "em_optim_add_group";
    if (!o) return em_err(EM_ERR_ARG, "%s: optimizer is NULL", fn), -1;
    if (chk_nonneg(fn, "lr", lr) || chk_nonneg(fn, "weight_decay", weight_decay)) return -1;
    if (chk_params(fn, o, n, params)) return -1;
    return push_group(o, fn, n, params, lr, weight_decay);
}

int em_optim_num_groups(const em_optimizer *o) { return o ? o->ng : 0; }

/* Sets the current (base: false) or base lr of group, or of every group
 * for -1. */
static em_status set_lr(const char *fn, em_optimizer *o, int group, double lr, bool base)
{
    if (!o) return em_err(EM_ERR_ARG, "%s: optimizer is NULL", fn);
    if (group < -1 || group >= o->ng)
        return em_err(EM_ERR_ARG, "%s: group %d out of range (%d groups; -1 = all)", fn, group, o->ng);
    if (chk_nonneg(fn, "lr", lr)) return EM_ERR_ARG;
    for (int g = 0; g < o->ng; g++)
        if (group == -1 || g == group) *(base ? &o->g[g].base_lr : &o->g[g].lr) = lr;
    return EM_OK;
}

static double get_lr(const char *fn, const em_optimizer *o, int group, bool base)
{
    if (!o) return em_err(EM_ERR_ARG, "%s: optimizer is NULL", fn), NAN;
    if (group < 0 || group >= o->ng)
        return em_err(EM_ERR_ARG, "%s: group %d out of range (%d groups)", fn, group, o->ng), NAN;
    return base ? o->g[group].base_lr : o->g[group].lr;
}

em_status em_optim_set_lr(em_optimizer *o, int group, double lr)
{
    return set_lr("em_optim_set_lr", o, group, lr, false);
}

double em_optim_get_lr(const em_optimizer *o, int group)
{
    return get_lr("em_optim_get_lr", o, group, false);
}

em_status em_optim_set_base_lr(em_optimizer *o, int group, double lr)
{
    return set_lr("em_optim_set_base_lr", o, group, lr, true);
}

double em_optim_get_base_lr(const em_optimizer *o, int group)
{
    return get_lr("em_optim_get_base_lr", o, group, true);
}

em_status em_optim_apply_schedule(em_optimizer *o, const em_lr_schedule *s, int64_t step)
{
    const char *fn = "em_optim_apply_schedule";
    if (!o) return em_err(EM_ERR_ARG, "%s: optimizer is NULL", fn);
    double *lr = malloc(sizeof *lr * (size_t)o->ng);
    if (!lr) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    /* every group's value first: a failing schedule changes nothing */
    for (int g = 0; g < o->ng; g++)
        if (isnan(lr[g] = lr_at_base(s, o->g[g].base_lr, step))) {
            free(lr);
            return em_last_status();
        }
    for (int g = 0; g < o->ng; g++) o->g[g].lr = lr[g];
    free(lr);
    return EM_OK;
}

em_status em_optim_set_zero_grad_mode(em_optimizer *o, em_zero_grad_mode mode)
{
    if (!o) return em_err(EM_ERR_ARG, "em_optim_set_zero_grad_mode: optimizer is NULL");
    switch (mode) {
    case EM_ZERO_GRAD_SET_TO_NONE:
    case EM_ZERO_GRAD_IN_PLACE: o->zero_grad_mode = mode; return EM_OK;
    }
    return em_err(EM_ERR_ARG, "em_optim_set_zero_grad_mode: unknown mode %d", (int)mode);
}

int64_t em_optim_step_count(const em_optimizer *o) { return o ? (int64_t) * (double *)t_ptr(o->step) : 0; }

static em_status optim_zero_grad(em_optimizer *o);

em_status em_optim_zero_grad(em_optimizer *o)
{
    prof_mark pm;
    prof_begin(&pm);
    em_status s = optim_zero_grad(o);
    prof_end(&pm, "zero_grad", PROF_OPTIMIZER);
    return s;
}

/* Gradients on the CPU, contiguous and under zero_par's own split (4 MiB,
 * every one of a small model's): zeroed one per thread over the pool, not
 * one serial memset after another (the optimizer's parameters are distinct
 * tensors: em_*_new refuses one listed twice) */
enum { SMALL_ZERO = 1 << 22 };

static tensor *small_zero(const oparam *p)
{
    tensor *t = t_resolve(p->h, "em_optim_zero_grad"), *g = t ? t->grad : NULL;
    if (!g || t_on_cuda(g) || !t_is_contig(g)) return NULL;
    return (size_t)t_numel(g) * t_esize(g) < SMALL_ZERO ? g : NULL;
}

static void zero_small(void *ctx, int64_t lo, int64_t hi)
{
    tensor **g = ctx;
    for (int64_t i = lo; i < hi; i++)
        if (g[i]) memset(t_ptr(g[i]), 0, (size_t)t_numel(g[i]) * t_esize(g[i]));
}

static em_status optim_zero_grad(em_optimizer *o)
{
    if (!o) return em_err(EM_ERR_ARG, "em_optim_zero_grad: optimizer is NULL");
    for (int i = 0; i < o->np; i++)
        if (!t_resolve(o->p[i].h, "em_optim_zero_grad")) return em_last_status();
    size_t m = tmp_mark();
    tensor **small = tmp_alloc(sizeof(tensor *) * (size_t)(o->np > 0 ? o->np : 1));
    for (int i = 0; small && i < o->np; i++) small[i] = small_zero(&o->p[i]);
    if (small) parallel_for(o->np, 4, zero_small, small);
    for (int i = 0; i < o->np; i++) {
        em_status s = small && small[i] ? EM_OK : em_zero_grad(o->p[i].h);
        if (s) {
            tmp_release(m);
            return s;
        }
    }
    tmp_release(m);
    optim_grads_zeroed(o);
    return EM_OK;
}

void optim_grads_zeroed(em_optimizer *o)
{
    if (o->zero_grad_mode != EM_ZERO_GRAD_SET_TO_NONE) return;
    for (int i = 0; i < o->np; i++) {
        tensor *t = t_resolve(o->p[i].h, "em_optim_zero_grad");
        if (t) t->grad_set = false;
    }
}

/* ---- update kernels ---------------------------------------------------------
 * One parameter's update coefficients (opt_coef), computed in double once per
 * step and applied elementwise by optim/update_math.h's functions, which the
 * CUDA kernel (optim.cu) applies too. */

/* SGD: one loop with a momentum buffer and one without, so each vectorises */
static void sgd_f32(const opt_coef *u, float *restrict p, const float *restrict g, float *restrict buf,
                    int64_t n)
{
    const opt_k_f32 k = opt_k_of_f32(u);
    const bool decay = u->wd != 0, first = u->first, nesterov = u->nesterov, max = u->maximize;
    if (buf)
        for (int64_t i = 0; i < n; i++)
            p[i] = sgd_elem_f32(&k, p[i], g[i], &buf[i], true, decay, first, nesterov, max);
    else
        for (int64_t i = 0; i < n; i++)
            p[i] = sgd_elem_f32(&k, p[i], g[i], NULL, false, decay, first, nesterov, max);
}

static void sgd_f64(const opt_coef *u, double *restrict p, const double *restrict g, double *restrict buf,
                    int64_t n)
{
    const opt_k_f64 k = opt_k_of_f64(u);
    const bool decay = u->wd != 0, first = u->first, nesterov = u->nesterov, max = u->maximize;
    if (buf)
        for (int64_t i = 0; i < n; i++)
            p[i] = sgd_elem_f64(&k, p[i], g[i], &buf[i], true, decay, first, nesterov, max);
    else
        for (int64_t i = 0; i < n; i++)
            p[i] = sgd_elem_f64(&k, p[i], g[i], NULL, false, decay, first, nesterov, max);
}

/* One Adam body per variant, each specialised with constant flags so the
 * loop has no branches and vectorises (sqrt and division are exact in vector
 * form, so the results do not change: tests/test_scalar_math.c compares the
 * step with adam_elem_f32 element by element). */
static inline __attribute__((always_inline)) void adam_f32_body(const opt_coef *u, float *restrict p,
                                                                const float *restrict g, float *restrict m,
                                                                float *restrict v, float *restrict vmax,
                                                                int64_t n, bool l2, bool decoupled,
                                                                bool amsgrad, bool maximize)
{
    const opt_k_f32 k = opt_k_of_f32(u);
    for (int64_t i = 0; i < n; i++)
        p[i] = adam_elem_f32(&k, p[i], g[i], &m[i], &v[i], amsgrad ? &vmax[i] : NULL, l2, decoupled, amsgrad,
                             maximize);
}

/* adam_f32_body for one weight-decay variant, amsgrad and maximize made
 * constants too */
static inline __attribute__((always_inline)) void adam_f32_flags(const opt_coef *u, float *p, const float *g,
                                                                 float *m, float *v, float *vmax, int64_t n,
                                                                 bool l2, bool decoupled)
{
    if (u->amsgrad) {
        if (u->maximize)
            adam_f32_body(u, p, g, m, v, vmax, n, l2, decoupled, true, true);
        else
            adam_f32_body(u, p, g, m, v, vmax, n, l2, decoupled, true, false);
    } else if (u->maximize)
        adam_f32_body(u, p, g, m, v, NULL, n, l2, decoupled, false, true);
    else
        adam_f32_body(u, p, g, m, v, NULL, n, l2, decoupled, false, false);
}

/* AdamW's decay p *= 1 - lr wd as a pass of its own (torch's p.mul_ before
 * its update), for amsgrad: fused into the update, p decay - ss q has two
 * products, and gcc's vectorised amsgrad loop fuses the other one than its
 * scalar tail and adam_elem do; apart, the update has one product, fused
 * alike everywhere (tests/test_scalar_math.c checks the bits). */
static void decay_f32(const opt_coef *u, float *restrict p, int64_t n)
{
    const float d = opt_k_of_f32(u).decay;
    for (int64_t i = 0; i < n; i++) p[i] *= d;
}

static void adam_f32(const opt_coef *u, float *p, const float *g, float *m, float *v, float *vmax, int64_t n)
{
    if (u->decoupled && u->amsgrad) {
        decay_f32(u, p, n);
        adam_f32_flags(u, p, g, m, v, vmax, n, false, false);
    } else if (u->decoupled)
        adam_f32_flags(u, p, g, m, v, vmax, n, false, true);
    else if (u->l2)
        adam_f32_flags(u, p, g, m, v, vmax, n, true, false);
    else
        adam_f32_flags(u, p, g, m, v, vmax, n, false, false);
}

static void adam_f64(const opt_coef *u, double *p, const double *g, double *m, double *v, double *vmax,
                     int64_t n)
{
    const opt_k_f64 k = opt_k_of_f64(u);
    const bool l2 = u->l2, ams = u->amsgrad, max = u->maximize, decoupled = u->decoupled && !ams;
    if (u->decoupled && ams) /* as adam_f32 */
        for (int64_t i = 0; i < n; i++) p[i] *= k.decay;
    for (int64_t i = 0; i < n; i++)
        p[i] = adam_elem_f64(&k, p[i], g[i], &m[i], &v[i], ams ? &vmax[i] : NULL, l2, decoupled, ams, max);
}

/* Elements [lo, lo+n) of p and g (compute-dtype arrays) with state from
 * element lo on. */
typedef struct upd_job {
    const opt_coef *u;
    bool f64;
    void *p;
    const void *g;
    void *s[3]; /* SGD: buf (or NULL); Adam: m, v, vmax (amsgrad, else NULL) */
} upd_job;

static void *at(void *base, int64_t i, size_t es) { return base ? (char *)base + (size_t)i * es : NULL; }

static void upd_range(void *ctx, int64_t lo, int64_t hi)
{
    const upd_job *j = ctx;
    size_t es = j->f64 ? sizeof(double) : sizeof(float);
    void *p = at(j->p, lo, es), *s1 = at(j->s[0], lo, es), *s2 = at(j->s[1], lo, es),
         *s3 = at(j->s[2], lo, es);
    const void *g = at((void *)j->g, lo, es);
    int64_t n = hi - lo;
    if (j->u->sgd) {
        if (j->f64)
            sgd_f64(j->u, p, g, s1, n);
        else
            sgd_f32(j->u, p, g, s1, n);
    } else if (j->f64)
        adam_f64(j->u, p, g, s1, s2, s3, n);
    else
        adam_f32(j->u, p, g, s1, s2, s3, n);
}

void opt_gather(const tensor *t, int64_t lo, int64_t n, em_dtype dt, void *dst)
{
    size_t es = t_esize(t), ed = em_dtype_size(dt);
    if (t_is_contig(t)) {
        convert_n(dt, dst, t->dtype, (const char *)t_ptr(t) + (size_t)lo * es, n);
        return;
    }
    nditer it;
    nditer_init(&it, t->ndim, t->shape, 1, (const int64_t *[]){t->stride});
    nditer_seek(&it, lo);
    for (int64_t k = 0; k < n; k++, nditer_next(&it))
        st(dt, (char *)dst + (size_t)k * ed, ld(t->dtype, (const char *)t_ptr(t) + it.off[0] * (int64_t)es));
}

void opt_scatter(tensor *t, int64_t lo, int64_t n, em_dtype dt, const void *src)
{
    size_t es = t_esize(t), ed = em_dtype_size(dt);
    if (t_is_contig(t)) {
        convert_n(t->dtype, (char *)t_ptr(t) + (size_t)lo * es, dt, src, n);
        return;
    }
    nditer it;
    nditer_init(&it, t->ndim, t->shape, 1, (const int64_t *[]){t->stride});
    nditer_seek(&it, lo);
    for (int64_t k = 0; k < n; k++, nditer_next(&it))
        st(t->dtype, (char *)t_ptr(t) + it.off[0] * (int64_t)es, ld(dt, (const char *)src + (size_t)k * ed));
}

enum { CHUNK = 2048 };

/* Applies u to parameter t with gradient g and state st[0..2] (contiguous,
 * of the compute dtype, NULL where the update has none). Contiguous
 * parameters of the compute dtype are updated in place in parallel; others
 * through CHUNK-element scratch buffers pb, gb (8-byte elements) converted
 * to and from it. */
static void apply(const opt_coef *u, tensor *t, tensor *g, tensor *const *st, void *pb, void *gb)
{
    em_dtype cd = opt_state_dtype(t->dtype);
    int64_t n = t_numel(t);
    upd_job j = {u, cd == EM_F64, NULL, NULL, {NULL, NULL, NULL}};
    for (int k = 0; k < 3; k++) j.s[k] = st[k] ? t_ptr(st[k]) : NULL;
    if (t->dtype == cd && g->dtype == cd && t_is_contig(t) && t_is_contig(g)) {
        j.p = t_ptr(t);
        j.g = t_ptr(g);
        parallel_for(n, 1 << 14, upd_range, &j);
        return;
    }
    size_t es = em_dtype_size(cd);
    for (int64_t lo = 0; lo < n; lo += CHUNK) {
        int64_t k = n - lo < CHUNK ? n - lo : CHUNK;
        opt_gather(t, lo, k, cd, pb);
        opt_gather(g, lo, k, cd, gb);
        upd_job c = {u, j.f64, pb, gb, {at(j.s[0], lo, es), at(j.s[1], lo, es), at(j.s[2], lo, es)}};
        upd_range(&c, 0, k);
        opt_scatter(t, lo, k, cd, pb);
    }
}

/* A 1-D header over elements [lo, lo + n) of contiguous t, sharing its
 * storage (for apply, which reads the pointer, size and dtype). */
static tensor piece_of(const tensor *t, int64_t lo, int64_t n)
{
    tensor v = *t;
    v.ndim = 1;
    v.shape[0] = n;
    v.stride[0] = 1;
    v.offset += lo;
    return v;
}

em_status optim_set_piece(em_optimizer *o, int i, int64_t lo, int64_t n, tensor *gpiece, tensor *ppiece)
{
    const char *fn = "optim_set_piece";
    if (!o || i < 0 || i >= o->np) return em_err(EM_ERR_ARG, "%s: parameter index %d out of range", fn, i);
    tensor *t = t_resolve(o->p[i].h, fn);
    if (!t) return em_last_status();
    if (!t_is_contig(t))
        return em_err(EM_ERR_UNSUPPORTED, "%s: parameter %d %s%s must be contiguous", fn, i,
                      em_dtype_name(t->dtype), shp(t));
    if (lo < 0 || n < 0 || lo + n > t_numel(t))
        return em_err(EM_ERR_ARG, "%s: piece [%lld, %lld) is outside parameter %d %s", fn, (long long)lo,
                      (long long)(lo + n), i, shp(t));
    if (ppiece && (!gpiece || t_numel(ppiece) != n || ppiece->dtype != t->dtype || !t_is_contig(ppiece)))
        return em_err(EM_ERR_ARG,
                      "%s: parameter piece %s%s does not fit %lld elements of %s (or has no gradient piece)",
                      fn, em_dtype_name(ppiece->dtype), shp(ppiece), (long long)n, em_dtype_name(t->dtype));
    em_device where = ppiece ? ppiece->device : t->device; /* where the update runs */
    if (gpiece && (t_numel(gpiece) != n || gpiece->dtype != t->dtype || !t_is_contig(gpiece) ||
                   !em_device_equal(gpiece->device, where)))
        return em_err(EM_ERR_ARG,
                      "%s: gradient piece %s%s does not fit %lld elements of %s on the update's device", fn,
                      em_dtype_name(gpiece->dtype), shp(gpiece), (long long)n, em_dtype_name(t->dtype));
    oparam *p = &o->p[i];
    for (int f = 0; f < F_COUNT; f++) {
        t_free(p->f[f]);
        t_free(p->host[f]);
        p->f[f] = p->host[f] = NULL;
    }
    p->started = false;
    p->sharded = true;
    p->lo = lo;
    p->n = n;
    p->gpiece = gpiece;
    p->ppiece = ppiece;
    return EM_OK;
}

em_status opt_alloc_state(em_optimizer *o, int i, tensor *t)
{
    oparam *p = &o->p[i];
    for (int f = 0; f < F_COUNT; f++) {
        if (!opt_has_field(o, f) || p->f[f]) continue;
        /* the step count is a host scalar; the rest lives beside the parameter */
        int64_t shape[EM_MAX_DIMS];
        int nd = opt_state_shape(p, t, shape);
        em_device dev = p->ppiece ? p->ppiece->device : t->device; /* offload: beside the host piece */
        tensor *s = f == F_STEP ? t_new_persistent(EM_F64, 0, NULL)
                                : t_new_persistent_on(dev, opt_state_dtype(t->dtype), nd, shape);
        if (!s) return em_err(EM_ERR_OOM, "em_optim: out of memory for state of parameter %d %s", i, shp(t));
        if (t_on_cuda(s)) {
            if (t_fill_zero(s)) return em_last_status();
        } else
            memset(t_ptr(s), 0, (size_t)t_numel(s) * t_esize(s));
        p->f[f] = s;
    }
    return EM_OK;
}

#if EM_HAVE_CUDA
/* ---- CUDA parameters ---------------------------------------------------------
 * One fused kernel per update. After em_module_flatten the parameters and
 * their gradients are consecutive slices of one buffer each; their state is
 * then allocated as one buffer per field too, so a run of such parameters
 * (same group, same step) is updated by a single launch over all of it.
 * ZeRO's pieces (optim_set_piece) are launched one by one, each over its
 * own state of shape (n) (opt_alloc_state). */

/* Whether b starts where a ends, in the same storage (both contiguous). */
static bool follows(const tensor *a, const tensor *b)
{
    return a && b && a->st == b->st && a->dtype == b->dtype && t_is_contig(a) && t_is_contig(b) &&
           b->offset == a->offset + t_numel(a);
}

/* Gives parameters [i, j) of o (CUDA, consecutive in one storage, without
 * state) their state fields as consecutive slices of one zeroed buffer. */
static em_status alloc_run_state(em_optimizer *o, int i, int j, const char *fn)
{
    tensor *t0 = t_resolve(o->p[i].h, fn);
    em_dtype sdt = opt_state_dtype(t0->dtype);
    int64_t total = 0;
    for (int k = i; k < j; k++) total += t_numel(t_resolve(o->p[k].h, fn));
    for (int f = 0; f < F_COUNT; f++) {
        if (f == F_STEP || !opt_has_field(o, f)) continue;
        tensor *flat = t_new_persistent_on(t0->device, sdt, 1, &total);
        if (!flat || t_fill_zero(flat)) return em_err(EM_ERR_OOM, "%s: out of memory for optimizer state", fn);
        int64_t off = 0;
        for (int k = i; k < j; k++) {
            tensor *t = t_resolve(o->p[k].h, fn);
            /* a 1-element header, given t's shape, then pointed into flat */
            tensor *s = t_new_persistent_on(t0->device, sdt, 0, NULL);
            if (!s) {
                t_free(flat);
                return em_err(EM_ERR_OOM, "%s: out of memory for optimizer state", fn);
            }
            s->ndim = t->ndim;
            memcpy(s->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
            t_repoint(s, flat, off);
            off += t_numel(t);
            o->p[k].f[f] = s;
        }
        t_free(flat); /* the slices keep the storage */
    }
    return EM_OK;
}

/* State for every CUDA parameter with a gradient and none yet: runs of
 * parameters consecutive in one storage share one buffer per field. */
static em_status alloc_cuda_state(em_optimizer *o, const char *fn)
{
    int want = o->kind == OPT_SGD ? F_MOMENTUM : F_EXP_AVG;
    if (!opt_has_field(o, want)) return EM_OK;
    for (int i = 0; i < o->np;) {
        tensor *t = t_resolve(o->p[i].h, fn); /* a piece (sharded): opt_alloc_state */
        if (!t_on_cuda(t) || !t_live_grad(t) || o->p[i].f[want] || o->p[i].sharded) {
            i++;
            continue;
        }
        int j = i + 1;
        while (j < o->np) {
            tensor *u = t_resolve(o->p[j].h, fn);
            if (!t_live_grad(u) || o->p[j].f[want] || o->p[j].sharded ||
                !follows(t_resolve(o->p[j - 1].h, fn), u))
                break;
            j++;
        }
        em_status s = alloc_run_state(o, i, j, fn);
        if (s) return s;
        i = j;
    }
    return EM_OK;
}

/* Whether parameter j can join the launch of parameter j-1 (whose run
 * started at a parameter with the same group and step). */
static bool fuses(const em_optimizer *o, int j, const char *fn)
{
    const oparam *a = &o->p[j - 1], *b = &o->p[j];
    tensor *ta = t_resolve(a->h, fn), *tb = t_resolve(b->h, fn);
    if (!t_live_grad(tb) || a->group != b->group || a->started != b->started) return false;
    if (a->sharded || b->sharded) return false; /* ZeRO's pieces: one launch each */
    if (!follows(ta, tb) || !follows(ta->grad, tb->grad)) return false;
    for (int f = 0; f < F_COUNT; f++)
        if (f != F_STEP && opt_has_field(o, f) && !follows(a->f[f], b->f[f])) return false;
    if (o->kind != OPT_SGD && *(double *)t_ptr(a->f[F_STEP]) != *(double *)t_ptr(b->f[F_STEP])) return false;
    return true;
}

/* One launch: u over n elements from parameter t, gradient g, state st[0..2]. */
static em_status apply_cuda(const opt_coef *u, tensor *t, tensor *g, tensor *const *st, int64_t n)
{
    tensor *gc = t_is_contig(g) ? g : t_contig(g); /* only a lone parameter's gradient can be strided */
    if (!gc) return em_last_status();
    void *sp[3];
    for (int k = 0; k < 3; k++) sp[k] = st[k] ? t_ptr(st[k]) : NULL;
    em_status s = cu_optim_update(t->device.index, u, t->dtype, t_ptr(t), gc->dtype, t_ptr(gc),
                                  opt_state_dtype(t->dtype), sp, n);
    if (gc != g) t_drop(gc);
    return s;
}
#endif

/* Parameter i's coefficients for this step (its Adam step count advanced,
 * fresh state zeroed) and its state tensors st[0..2]: SGD's momentum buffer
 * (or NULL), or Adam's m, v and vmax (NULL without amsgrad). */
static em_status prepare(em_optimizer *o, int i, opt_coef *u, tensor **st)
{
    oparam *p = &o->p[i];
    const ogroup *gr = &o->g[p->group];
    bool sgd = o->kind == OPT_SGD;
    *u = (opt_coef){.sgd = sgd,
                    .l2 = o->kind == OPT_ADAM && gr->wd != 0,
                    .decoupled = o->kind == OPT_ADAMW,
                    .maximize = sgd ? o->sgd.maximize : o->adam.maximize,
                    .amsgrad = !sgd && o->adam.amsgrad,
                    .lr = gr->lr,
                    .wd = gr->wd,
                    .first = !p->started};
    st[0] = st[1] = st[2] = NULL;
    if (sgd) {
        u->mom = o->sgd.momentum, u->damp = o->sgd.dampening, u->nesterov = o->sgd.nesterov;
        st[0] = p->f[F_MOMENTUM];
        return EM_OK;
    }
    st[0] = p->f[F_EXP_AVG], st[1] = p->f[F_EXP_AVG_SQ], st[2] = u->amsgrad ? p->f[F_MAX_EXP_AVG_SQ] : NULL;
    double *step = t_ptr(p->f[F_STEP]);
    if (!p->started) { /* fresh state: m = v = vmax = 0, step 0 */
        *step = 0;
        for (int k = 0; k < 3; k++) {
            if (!st[k]) continue;
            if (t_on_cuda(st[k])) {
                if (t_fill_zero(st[k])) return em_last_status();
            } else
                memset(t_ptr(st[k]), 0, (size_t)t_numel(st[k]) * t_esize(st[k]));
        }
    }
    *step += 1;
    u->b1 = o->adam.beta1, u->b2 = o->adam.beta2, u->eps = o->adam.eps;
    u->step_size = gr->lr / (1.0 - pow(u->b1, *step));
    u->bc2_sqrt = sqrt(1.0 - pow(u->b2, *step));
    u->decay = 1.0 - gr->lr * gr->wd;
    return EM_OK;
}

static em_status optim_step(em_optimizer *o);

em_status em_optim_step(em_optimizer *o)
{
    prof_mark pm;
    prof_begin(&pm);
    em_status s = optim_step(o);
    static const char *const names[] = {
        [OPT_SGD] = "sgd.step", [OPT_ADAM] = "adam.step", [OPT_ADAMW] = "adamw.step"};
    prof_end(&pm, o ? names[o->kind] : "step", PROF_OPTIMIZER);
    return s;
}

static em_status optim_step(em_optimizer *o)
{
    const char *fn = "em_optim_step";
    if (!o) return em_err(EM_ERR_ARG, "%s: optimizer is NULL", fn);
    /* every handle first: a stale one changes nothing */
    for (int i = 0; i < o->np; i++)
        if (!t_resolve(o->p[i].h, fn)) return em_last_status();
    for (int i = 0; i < o->np; i++) {
        tensor *t = t_resolve(o->p[i].h, fn), *g = t_live_grad(t);
        if (!g) continue;
        if (g->dtype != t->dtype || g->ndim != t->ndim ||
            memcmp(g->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim))
            return em_err(EM_ERR_SHAPE, "%s: parameter %d is %s%s but its gradient is %s%s", fn, i,
                          em_dtype_name(t->dtype), shp(t), em_dtype_name(g->dtype), shp(g));
        if (!em_device_equal(g->device, t->device))
            return em_err(EM_ERR_DEVICE, "%s: parameter %d %s%s and its gradient are on different devices", fn, i,
                          em_dtype_name(t->dtype), shp(t));
        if (t_on_cuda(t) && !t_is_contig(t))
            return em_err(EM_ERR_UNSUPPORTED, "%s: CUDA parameter %d %s%s is not contiguous", fn, i,
                          em_dtype_name(t->dtype), shp(t));
    }
#if EM_HAVE_CUDA
    if (alloc_cuda_state(o, fn)) return em_last_status();
#endif
    for (int i = 0; i < o->np; i++) {
        tensor *t = t_resolve(o->p[i].h, fn);
        if (t_live_grad(t) && opt_alloc_state(o, i, t)) return em_last_status();
    }
    size_t mark = tmp_mark();
    void *pb = tmp_alloc(CHUNK * sizeof(double)), *gb = tmp_alloc(CHUNK * sizeof(double));
    if (!pb || !gb) {
        tmp_release(mark);
        return em_err(EM_ERR_OOM, "%s: out of memory for scratch buffers", fn);
    }
    for (int i = 0; i < o->np;) {
        tensor *t = t_resolve(o->p[i].h, fn), *g = t_live_grad(t);
        if (!g) { /* no gradient since the last zero_grad: skipped whole (torch's .grad None) */
            i++;
            continue;
        }
        /* a CUDA parameter takes the consecutive ones that fuse with it */
        int j = i + 1;
#if EM_HAVE_CUDA
        if (t_on_cuda(t))
            while (j < o->np && fuses(o, j, fn)) j++;
#endif
        opt_coef u, uk;
        tensor *st[3], *sk[3];
        em_status s = prepare(o, i, &u, st);
        for (int k = i + 1; k < j && !s; k++) s = prepare(o, k, &uk, sk);
        if (!s && o->p[i].sharded) { /* ZeRO: this rank's piece only (j == i + 1) */
            const oparam *p = &o->p[i];
            tensor tv = p->ppiece ? *p->ppiece : piece_of(t, p->lo, p->n),
                   gv = p->gpiece ? *p->gpiece : piece_of(g, p->lo, p->n);
            if (st[0] && !em_device_equal(st[0]->device, tv.device)) {
                char a[16], b[16];
                s = em_err(
                    EM_ERR_DEVICE,
                    "%s: parameter %d's piece is on %s but its state on %s (an offloaded ZeRO optimizer "
                    "stepped without its engine?)",
                    fn, i, em_device_str(tv.device, a, sizeof a), em_device_str(st[0]->device, b, sizeof b));
            } else if (p->n > 0 && t_on_cuda(&tv)) {
#if EM_HAVE_CUDA
                s = apply_cuda(&u, &tv, &gv, st, p->n);
#endif
            } else if (p->n > 0)
                apply(&u, &tv, &gv, st, pb, gb);
        } else if (!s && t_on_cuda(t)) {
#if EM_HAVE_CUDA
            int64_t n = 0;
            for (int k = i; k < j; k++) n += t_numel(t_resolve(o->p[k].h, fn));
            s = apply_cuda(&u, t, g, st, n);
#endif
        } else if (!s)
            apply(&u, t, g, st, pb, gb);
        if (s) {
            tmp_release(mark);
            return s;
        }
        for (int k = i; k < j; k++) o->p[k].started = true;
        i = j;
    }
    tmp_release(mark);
    *(double *)t_ptr(o->step) += 1;
    return EM_OK;
}
