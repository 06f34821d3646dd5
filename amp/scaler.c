/* scaler.c — dynamic loss scaling for fp16 (torch.amp.GradScaler's rules).
 *
 * A step: loss * scale -> backward -> unscale (gradients / scale, noting any
 * inf/NaN; reduced over the ranks so they agree) -> step unless found_inf
 * -> update. The update backs off (scale * 0.5) on an overflow and grows
 * (scale * 2) after growth_interval clean steps in a row. */
#include <math.h>
#include <stdlib.h>

#include "amp/amp_impl.h"
#include "ember/autograd.h"
#include "optim/optim_impl.h"
#include "optim/update_math.h"
#include "tensor/kernel_impl.h"
#include "tensor/profile_impl.h"
#if EM_HAVE_CUDA
#include "optim/cuda_optim.h"
#endif

#pragma GCC diagnostic error "-Wswitch-enum" /* a switch over dtypes names each */

struct em_grad_scaler {
    em_scaler_config cfg;
    double scale;
    int64_t tracker;  /* clean steps since the scale last changed */
    bool unscaled;    /* this step's gradients were unscaled */
    bool found_inf;
};

em_grad_scaler *em_grad_scaler_new(const em_scaler_config *cfg)
{
    em_scaler_config c = cfg ? *cfg : (em_scaler_config){0};
    if (c.init_scale == 0) c.init_scale = 65536.0;
    if (c.growth_factor == 0) c.growth_factor = 2.0;
    if (c.backoff_factor == 0) c.backoff_factor = 0.5;
    if (c.growth_interval == 0) c.growth_interval = 2000;
    if (!(c.init_scale > 0) || isinf(c.init_scale))
        return em_fail(EM_ERR_ARG, "em_grad_scaler_new: init_scale %g must be > 0 and finite", c.init_scale);
    if (!(c.growth_factor >= 1) || isinf(c.growth_factor))
        return em_fail(EM_ERR_ARG, "em_grad_scaler_new: growth_factor %g must be >= 1 and finite", c.growth_factor);
    if (!(c.backoff_factor > 0 && c.backoff_factor <= 1))
        return em_fail(EM_ERR_ARG, "em_grad_scaler_new: backoff_factor %g must be in (0, 1]", c.backoff_factor);
    if (c.growth_interval < 1)
        return em_fail(EM_ERR_ARG, "em_grad_scaler_new: growth_interval %d must be >= 1", c.growth_interval);
    em_grad_scaler *s = calloc(1, sizeof *s);
    if (!s) return em_fail(EM_ERR_OOM, "em_grad_scaler_new: out of memory");
    s->cfg = c;
    s->scale = c.init_scale;
    return s;
}

void em_grad_scaler_free(em_grad_scaler *s) { free(s); }

em_tensor *em_scaler_scale(em_grad_scaler *s, em_tensor *loss)
{
    if (!s) return em_fail(EM_ERR_ARG, "em_scaler_scale: scaler is NULL");
    return em_mul_scalar(loss, s->scale);
}

static amp_vote_fn overflow_vote;

void amp_set_overflow_vote(amp_vote_fn fn) { overflow_vote = fn; }

/* Gradient i of the list unscale works on: a parameter's (params: left out
 * when it has none since the last set-to-none zero_grad, as the optimizer
 * skips it) or a tensor given as it is (grads); NULL when there is none. */
static tensor *grad_at(em_tensor *const *params, tensor *const *grads, int i, em_status *st)
{
    if (grads) return grads[i];
    if (!params[i]) return NULL;
    tensor *t = t_resolve(params[i], "em_scaler_unscale");
    if (!t) *st = em_last_status();
    return t ? t_live_grad(t) : NULL;
}

static em_status unscale(em_grad_scaler *s, int n, em_tensor *const *params, tensor *const *grads, em_pg *pg)
{
    if (!s) return em_err(EM_ERR_ARG, "em_scaler_unscale: scaler is NULL");
    if (n < 0 || (n > 0 && !params && !grads)) return em_err(EM_ERR_ARG, "em_scaler_unscale: %d params at NULL", n);
    if (s->unscaled) return EM_OK; /* once per step */
    double inv = 1.0 / s->scale;
    bool bad = false;
    prof_mark pm;
    prof_begin(&pm);
    size_t mark = tmp_mark();
    tensor **cpu = tmp_alloc(sizeof(tensor *) * (size_t)(n > 0 ? n : 1)); /* the CPU gradients */
    int ncpu = 0;
    if (!cpu) {
        tmp_release(mark);
        prof_abandon(&pm);
        return em_err(EM_ERR_OOM, "em_scaler_unscale: out of memory for a list of %d gradients", n);
    }
    /* CUDA gradients (all on one device): one kernel each, the inf/NaN flag
     * in device memory, copied to the host once at the end */
#if EM_HAVE_CUDA
    int *found = NULL;
    em_device fdev = {EM_CPU, 0};
#endif
    em_status st = EM_OK;
    for (int i = 0; i < n && !st; i++) {
        tensor *g = grad_at(params, grads, i, &st);
        if (st) break;
        if (!g) continue;
        if (!em_dtype_is_float(g->dtype) || !t_is_contig(g)) {
            st = em_err(EM_ERR_ARG, "em_scaler_unscale: param %d's gradient %s%s is not a contiguous float tensor", i,
                        em_dtype_name(g->dtype), shp(g));
            break;
        }
        if (!t_on_cuda(g)) {
            cpu[ncpu++] = g;
            continue;
        }
#if EM_HAVE_CUDA
        if (!found) {
            fdev = g->device;
            found = cu_alloc(fdev.index, sizeof *found);
            st = found ? cu_fill(fdev.index, EM_I32, found, 1, 0) : em_last_status();
        } else if (!em_device_equal(fdev, g->device)) {
            char a[16], b[16];
            st = em_err(EM_ERR_DEVICE, "em_scaler_unscale: gradients on %s and %s; the scaler takes one device",
                        em_device_str(fdev, a, sizeof a), em_device_str(g->device, b, sizeof b));
        }
        if (!st) st = cu_unscale(fdev.index, g->dtype, t_ptr(g), t_numel(g), inv, found);
#endif
    }
#if EM_HAVE_CUDA
    if (found) {
        int f = 0;
        if (!st) st = cu_memcpy(&f, em_device_cpu(), found, fdev, sizeof f); /* the step's one sync */
        bad |= f != 0;
        cu_free(fdev.index, found);
    }
#endif
    if (!st) bad |= opt_scale_grads(cpu, ncpu, inv, NULL); /* all contiguous: checked above */
    tmp_release(mark);
    prof_end(&pm, "scaler.unscale", PROF_OPTIMIZER);
    if (st) return st;
    if (pg) { /* every rank skips the same steps */
        if (!overflow_vote)
            return em_err(EM_ERR_ARG, "em_scaler_unscale: a process group was given but no collectives are linked");
        if ((st = overflow_vote(pg, &bad))) return st;
    }
    amp_unscaled(s, bad);
    return EM_OK;
}

em_status em_scaler_unscale(em_grad_scaler *s, int n, em_tensor *const *params, em_pg *pg)
{
    return unscale(s, n, params, NULL, pg);
}

em_status amp_unscale_grads(em_grad_scaler *s, int n, tensor *const *grads, em_pg *pg)
{
    return unscale(s, n, NULL, grads, pg);
}

bool amp_unscale_due(const em_grad_scaler *s, double *inv)
{
    if (!s || s->unscaled) return false;
    *inv = 1.0 / s->scale;
    return true;
}

void amp_unscaled(em_grad_scaler *s, bool found_inf)
{
    s->found_inf = found_inf;
    s->unscaled = true;
}

static em_status vote_pg(void *pg, bool *bad) { return overflow_vote(pg, bad); }

double em_scaler_unscale_clip(em_grad_scaler *s, int n, em_tensor *const *params, const em_clip_config *cfg,
                              em_pg *pg, em_status *status)
{
    em_status st = EM_OK;
    double inv;
    if (amp_unscale_due(s, &inv) && (!pg || overflow_vote)) {
        bool taken, inf;
        prof_mark pm;
        prof_begin(&pm);
        double norm = opt_unscale_clip(n, params, cfg, inv, pg ? vote_pg : NULL, pg, &taken, &inf, &st);
        if (taken) {
            prof_end(&pm, "scaler.unscale_clip", PROF_OPTIMIZER);
            if (!st) amp_unscaled(s, inf);
            if (status) *status = st;
            return st ? NAN : norm;
        }
        prof_abandon(&pm);
    }
    if ((st = unscale(s, n, params, NULL, pg))) {
        if (status) *status = st;
        return NAN;
    }
    if (s->found_inf) {
        if (status) *status = EM_OK;
        return INFINITY;
    }
    return em_clip_grad_norm_with(n, params, cfg, status);
}

bool em_scaler_found_inf(const em_grad_scaler *s) { return s && s->found_inf; }

void em_scaler_update(em_grad_scaler *s)
{
    if (!s || !s->unscaled) return;
    if (s->found_inf) {
        s->scale *= s->cfg.backoff_factor;
        s->tracker = 0;
    } else if (++s->tracker >= s->cfg.growth_interval) {
        s->scale *= s->cfg.growth_factor;
        s->tracker = 0;
    }
    s->unscaled = false;
    s->found_inf = false;
}

double em_scaler_get_scale(const em_grad_scaler *s) { return s ? s->scale : NAN; }

em_scaler_state em_scaler_get_state(const em_grad_scaler *s)
{
    return s ? (em_scaler_state){s->scale, s->tracker} : (em_scaler_state){NAN, -1};
}

em_status em_scaler_set_state(em_grad_scaler *s, em_scaler_state st)
{
    if (!s) return em_err(EM_ERR_ARG, "em_scaler_set_state: scaler is NULL");
    if (!(st.scale > 0) || isinf(st.scale) || st.growth_tracker < 0)
        return em_err(EM_ERR_ARG, "em_scaler_set_state: scale %g must be > 0 and finite, tracker %lld >= 0",
                      st.scale, (long long)st.growth_tracker);
    s->scale = st.scale;
    s->tracker = st.growth_tracker;
    s->unscaled = false;
    s->found_inf = false;
    return EM_OK;
}
