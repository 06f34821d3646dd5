/* ddp.c — data-parallel training: the model's flat gradient buffer is cut
 * into buckets, and each bucket is averaged over the ranks with an
 * asynchronous all-reduce that starts the moment backward has finished the
 * bucket's last gradient, so communication overlaps the rest of backward.
 *
 *   flat grads (one dtype):  | p0 | p1 | p2 | ... | p(n-1) |
 *   buckets (reverse order):          ... | bucket 1 | bucket 0 |
 *
 * Backward produces gradients roughly in reverse registration order (the
 * output layer first), so bucket 0 — the last parameters — fills first. A
 * bucket is a contiguous slice of the flat buffer: the all-reduce works on
 * the gradients in place, no copy in or out. Buckets are started strictly in
 * index order on every rank (a ready bucket waits for the ones before it),
 * so every rank issues the same collectives in the same order even when
 * gradients become final in a different order.
 *
 * CUDA models: the flat gradient buffer (so every bucket) lives on the
 * parameters' device, and a bucket's all-reduce goes through NCCL
 * (dist/nccl.c) on the device's communication stream, queued after the
 * kernels that produced its gradients while backward keeps queueing kernels
 * on the compute stream. Waiting on a bucket's work makes the compute
 * stream wait for the communication stream, so the optimizer step that
 * follows em_ddp_backward runs on the averaged gradients; the host never
 * blocks.
 *
 * Unused parameters (find_unused_parameters): a parameter no backward
 * reached since the last zero_grad sits in its bucket as zeros, so the
 * average is the other ranks' sum over the world, as in torch. Whether it
 * has a gradient at all (em_has_grad: the optimizer skips it otherwise) is
 * then OR-ed over the ranks (share_used), so every rank steps the same
 * parameters.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ddp_impl.h"
#include "ember/dist.h"
#include "tensor/tensor_impl.h"

typedef struct bucket {
    em_dtype dtype;
    em_tensor *grads;   /* persistent 1-D view of the flat gradient buffer */
    int first, count;   /* parameters [first, first+count) in registration order */
    int pending;        /* gradients not yet final in this backward */
    em_work *work;      /* the in-flight all-reduce, or NULL */
} bucket;

typedef struct param {
    em_ddp *ddp;
    const char *name;
    em_tensor *t;
    int bucket;
    bool ready; /* its gradient is final in this backward */
} param;

struct em_ddp {
    em_pg *pg;
    em_module *model;
    em_ddp_config cfg;
    param *params;
    int nparams;
    bucket *buckets;
    int nbuckets;
    int next_launch; /* buckets [0, next_launch) have been started */
    bool sync;
    bool in_backward;
    /* several models in one backward (ddp_backward_many): the hook only
     * marks gradients, and buckets are started after backward */
    bool deferred;
    bool touched; /* a parameter got a gradient in this backward */
    bool dirty;   /* one did in a no_sync backward since the last synced one */
    em_status first_err;
    char err_msg[ERROR_BYTES];
    ddp_hooks hooks; /* ZeRO's collectives in place of the all-reduce */
};

static void note_error(em_ddp *d, em_status s)
{
    if (d->first_err != EM_OK) return;
    d->first_err = s;
    snprintf(d->err_msg, sizeof d->err_msg, "%s", em_last_error());
}

/* Starts every bucket from next_launch on that is complete (or all of them,
 * when `all`), stopping at the first incomplete one. */
static void launch_ready(em_ddp *d, bool all)
{
    while (d->next_launch < d->nbuckets) {
        bucket *b = &d->buckets[d->next_launch];
        if (!all && b->pending > 0) return;
        em_status s = d->hooks.launch ? d->hooks.launch(d->hooks.ctx, d->next_launch, b->grads, &b->work)
                                      : em_all_reduce(d->pg, b->grads, EM_RED_AVG, &b->work);
        if (s != EM_OK) {
            b->work = NULL;
            note_error(d, s);
        }
        d->next_launch++;
    }
}

/* find_unused_parameters, after a synced backward: a parameter has a
 * gradient on every rank when it has one on any (its bucket averaged it),
 * and on none otherwise. One all-reduce (max) of a flag per parameter;
 * every rank calls it whatever failed before, so the ranks stay matched. */
static em_status share_used(em_ddp *d)
{
    int64_t n = d->nparams;
    em_scope sc = em_scope_begin(); /* `used` dies here */
    em_tensor *used = em_zeros(EM_I32, 1, &n);
    em_status s = used ? EM_OK : em_last_status();
    for (int i = 0; i < d->nparams && !s; i++) ((int32_t *)em_data(used))[i] = em_has_grad(d->params[i].t);
    if (!s) s = em_all_reduce(d->pg, used, EM_RED_MAX, NULL);
    for (int i = 0; i < d->nparams && !s; i++) {
        tensor *t = t_resolve(d->params[i].t, "em_has_grad"); /* a name that takes device tensors */
        if (t) t->grad_set = ((int32_t *)em_data(used))[i] != 0;
    }
    em_scope_end(sc);
    return s;
}

/* Starts every bucket not started yet (all are ready now) and waits for
 * all of them; a failed one is noted (note_error), the others still run, so
 * every rank finishes the same collectives. */
static void finish_buckets(em_ddp *d)
{
    launch_ready(d, true);
    for (int i = 0; i < d->nbuckets; i++) {
        if (!d->buckets[i].work) continue;
        em_status ws = em_work_wait(d->buckets[i].work);
        d->buckets[i].work = NULL;
        if (ws != EM_OK) note_error(d, ws);
    }
    if (d->hooks.finished) d->hooks.finished(d->hooks.ctx);
}

void ddp_set_hooks(em_ddp *d, ddp_hooks h) { d->hooks = h; }

void ddp_bucket_span(const em_ddp *d, int b, em_dtype *dt, int64_t *lo, int64_t *n)
{
    *dt = d->buckets[b].dtype;
    *lo = em_offset(d->buckets[b].grads);
    *n = em_numel(d->buckets[b].grads);
}

em_pg *ddp_pg(const em_ddp *d) { return d->pg; }

em_module *ddp_model(const em_ddp *d) { return d->model; }

/* The gradient hook: p's gradient is final for this backward. */
static em_status on_grad_ready(em_tensor *t, em_tensor *grad, void *ctx)
{
    (void)t;
    (void)grad;
    param *p = ctx;
    em_ddp *d = p->ddp;
    if (!d->in_backward || p->ready) return EM_OK;
    if (d->deferred) {
        p->ready = true;
        d->touched = true;
        return EM_OK;
    }
    if (!d->sync) return EM_OK;
    p->ready = true;
    d->buckets[p->bucket].pending--;
    launch_ready(d, false);
    return EM_OK;
}

/* "name:dtype:(shape);" for every parameter: what every rank must agree on. */
static char *signature(const em_named *ps, int n)
{
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    for (int i = 0; i < n; i++) {
        char item[1400];
        int k = snprintf(item, sizeof item, "%s:%s:(", ps[i].name, em_dtype_name(em_dtype_of(ps[i].t)));
        int nd = em_ndim(ps[i].t);
        for (int j = 0; j < nd && k < (int)sizeof item - 32; j++)
            k += snprintf(item + k, sizeof item - (size_t)k, "%s%lld", j ? "," : "", (long long)em_shape(ps[i].t)[j]);
        k += snprintf(item + k, sizeof item - (size_t)k, ");");
        if (len + (size_t)k + 1 > cap) {
            while (len + (size_t)k + 1 > cap) cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns) {
                free(s);
                return NULL;
            }
            s = ns;
        }
        memcpy(s + len, item, (size_t)k + 1);
        len += (size_t)k;
    }
    return s;
}

/* The i-th ';'-separated entry of sig into out. */
static void entry(const char *sig, int i, char *out, size_t n)
{
    const char *p = sig;
    for (int k = 0; k < i && p; k++) {
        p = strchr(p, ';');
        if (p) p++;
    }
    if (!p || !*p) {
        snprintf(out, n, "(nothing: fewer parameters)");
        return;
    }
    const char *e = strchr(p, ';');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len >= n) len = n - 1;
    memcpy(out, p, len);
    out[len] = '\0';
}

/* Every rank checks its parameter list against rank 0's (broadcast as i32
 * words); all ranks learn whether any differed, so all fail together. */
static em_status check_same_params(em_pg *pg, const em_named *ps, int n)
{
    char *sig = signature(ps, n);
    if (!sig) return em_err(EM_ERR_OOM, "em_ddp_new: out of memory");
    int rank = em_pg_rank(pg);
    int64_t one = 1;
    em_status s = EM_OK;
    em_tensor *len = em_zeros(EM_I32, 1, &one), *bad = em_zeros(EM_I32, 1, &one), *words = NULL;
    char *theirs = NULL;
    if (!len || !bad) {
        s = em_last_status();
        goto out;
    }
    int32_t mylen = (int32_t)strlen(sig) + 1;
    if (rank == 0) ((int32_t *)em_data(len))[0] = mylen;
    if ((s = em_broadcast(pg, len, 0, NULL)) != EM_OK) goto out;
    int64_t nw = (((int32_t *)em_data(len))[0] + 3) / 4;
    words = em_zeros(EM_I32, 1, &nw);
    if (!words) {
        s = em_last_status();
        goto out;
    }
    if (rank == 0) memcpy(em_data(words), sig, (size_t)mylen);
    if ((s = em_broadcast(pg, words, 0, NULL)) != EM_OK) goto out;
    theirs = calloc(1, (size_t)nw * 4 + 1);
    if (!theirs) {
        s = em_err(EM_ERR_OOM, "em_ddp_new: out of memory");
        goto out;
    }
    memcpy(theirs, em_data(words), (size_t)nw * 4);
    bool differs = strcmp(theirs, sig) != 0;
    ((int32_t *)em_data(bad))[0] = differs ? rank + 1 : 0;
    if ((s = em_all_reduce(pg, bad, EM_RED_MAX, NULL)) != EM_OK) goto out;
    int worst = ((int32_t *)em_data(bad))[0];
    if (differs) {
        int i = 0;
        char a[600], b[600];
        for (;; i++) {
            entry(sig, i, a, sizeof a);
            entry(theirs, i, b, sizeof b);
            if (strcmp(a, b)) break;
        }
        s = em_err(EM_ERR_DIST,
                   "em_ddp_new: the ranks' models differ: parameter %d is %s on rank %d but %s on rank 0 "
                   "(every rank must build the same model)",
                   i, a, rank, b);
    } else if (worst) {
        s = em_err(EM_ERR_DIST,
                   "em_ddp_new: rank %d's parameters differ from rank 0's (its error names the first "
                   "difference; every rank must build the same model)",
                   worst - 1);
    }
out:
    free(sig);
    free(theirs);
    em_free(len);
    em_free(bad);
    em_free(words);
    return s;
}

/* Parameters and buffers := rank 0's. */
static em_status broadcast_state(em_ddp *d)
{
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        em_tensor *flat = em_module_flat_params(d->model, dts[i]);
        if (!flat) continue;
        em_status s = em_broadcast(d->pg, flat, 0, NULL);
        if (s != EM_OK) return s;
    }
    int nb = em_module_buffers(d->model, NULL, 0);
    if (nb == 0) return EM_OK;
    em_named *bs = calloc((size_t)nb, sizeof *bs);
    if (!bs) return em_err(EM_ERR_OOM, "em_ddp_new: out of memory");
    em_module_buffers(d->model, bs, nb);
    em_status s = EM_OK;
    for (int i = 0; i < nb && s == EM_OK; i++) {
        em_dtype dt = em_dtype_of(bs[i].t);
        if (!em_is_contiguous(bs[i].t) || dt == EM_U8 || dt == EM_BOOL) {
            s = em_err(EM_ERR_UNSUPPORTED, "em_ddp_new: buffer '%s' (%s%s) cannot be broadcast", bs[i].name,
                       em_dtype_name(dt), em_is_contiguous(bs[i].t) ? "" : ", not contiguous");
            break;
        }
        s = em_broadcast(d->pg, bs[i].t, 0, NULL);
    }
    free(bs);
    return s;
}

/* Cuts each dtype's flat gradient buffer into buckets of about cap bytes,
 * walking the parameters from the last to the first. */
static em_status make_buckets(em_ddp *d, size_t cap)
{
    d->buckets = calloc((size_t)d->nparams + 1, sizeof *d->buckets);
    if (!d->buckets) return em_err(EM_ERR_OOM, "em_ddp_new: out of memory");
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        em_tensor *flat = em_module_flat_grads(d->model, dts[k]);
        if (!flat) continue;
        size_t esz = em_dtype_size(dts[k]);
        int i = d->nparams - 1;
        while (i >= 0) {
            if (em_dtype_of(d->params[i].t) != dts[k]) {
                i--;
                continue;
            }
            /* params of this dtype from i downward, until the bucket is full */
            int first = i;
            int64_t lo = INT64_MAX, hi = 0;
            size_t bytes = 0;
            int count = 0;
            while (i >= 0) {
                param *p = &d->params[i];
                if (em_dtype_of(p->t) != dts[k]) {
                    i--;
                    continue;
                }
                if (count > 0 && bytes + (size_t)em_numel(p->t) * esz > cap) break;
                em_tensor *g = em_grad(p->t);
                if (!g) return em_err(EM_ERR_ARG, "em_ddp_new: parameter '%s' has no gradient buffer", p->name);
                int64_t off = em_offset(g);
                if (off < lo) lo = off;
                if (off + em_numel(p->t) > hi) hi = off + em_numel(p->t);
                bytes += (size_t)em_numel(p->t) * esz;
                p->bucket = d->nbuckets;
                first = i;
                count++;
                i--;
            }
            bucket *b = &d->buckets[d->nbuckets];
            b->dtype = dts[k];
            b->first = first;
            b->count = count;
            b->grads = em_narrow(flat, 0, lo, hi - lo);
            if (!b->grads) return em_last_status();
            d->nbuckets++;
        }
    }
    return EM_OK;
}

void em_ddp_free(em_ddp *d)
{
    if (!d) return;
    for (int i = 0; i < d->nbuckets; i++) {
        if (d->buckets[i].work) em_work_wait(d->buckets[i].work);
        em_free(d->buckets[i].grads);
    }
    for (int i = 0; i < d->nparams; i++) em_clear_grad_hooks(d->params[i].t);
    free(d->buckets);
    free(d->params);
    free(d);
}

em_ddp *em_ddp_new(em_pg *pg, em_module *model, const em_ddp_config *cfg)
{
    if (!pg || !model) return em_fail(EM_ERR_ARG, "em_ddp_new: %s is NULL", pg ? "model" : "pg");
    em_ddp_config c = cfg ? *cfg : (em_ddp_config){0};
    if (c.bucket_mb < 0 || c.bucket_mb != c.bucket_mb)
        return em_fail(EM_ERR_ARG, "em_ddp_new: bucket_mb %g must be >= 0", c.bucket_mb);
    if (c.bucket_mb == 0) c.bucket_mb = 25;
    em_status s = em_module_flatten(model);
    if (s != EM_OK) return NULL;
    em_ddp *d = calloc(1, sizeof *d);
    if (!d) return em_fail(EM_ERR_OOM, "em_ddp_new: out of memory");
    d->pg = pg;
    d->model = model;
    d->cfg = c;
    d->sync = true;
    d->nparams = em_module_params(model, NULL, 0);
    em_named *ps = calloc((size_t)d->nparams + 1, sizeof *ps);
    d->params = calloc((size_t)d->nparams + 1, sizeof *d->params);
    if (!ps || !d->params) {
        free(ps);
        em_ddp_free(d);
        return em_fail(EM_ERR_OOM, "em_ddp_new: out of memory");
    }
    em_module_params(model, ps, d->nparams);
    for (int i = 0; i < d->nparams; i++) d->params[i] = (param){d, ps[i].name, ps[i].t, -1, false};
    s = check_same_params(pg, ps, d->nparams);
    free(ps);
    if (s == EM_OK) s = broadcast_state(d);
    if (s == EM_OK) s = make_buckets(d, (size_t)(c.bucket_mb * 1024 * 1024));
    for (int i = 0; i < d->nparams && s == EM_OK; i++)
        s = em_register_grad_hook(d->params[i].t, on_grad_ready, &d->params[i]);
    if (s != EM_OK) {
        held_error h;
        error_hold(&h, s);
        em_ddp_free(d);
        error_restore(&h);
        return NULL;
    }
    return d;
}

void em_ddp_set_sync(em_ddp *d, bool sync)
{
    if (d) d->sync = sync;
}

bool em_ddp_sync(const em_ddp *d) { return d && d->sync; }

int em_ddp_num_buckets(const em_ddp *d) { return d ? d->nbuckets : -1; }

em_status em_ddp_backward(em_ddp *d, em_tensor *loss, em_tensor *grad_output)
{
    if (!d) return em_err(EM_ERR_ARG, "em_ddp_backward: ddp is NULL");
    if (!d->sync) return em_backward(loss, grad_output);
    for (int i = 0; i < d->nbuckets; i++) {
        d->buckets[i].pending = d->buckets[i].count;
        d->buckets[i].work = NULL;
    }
    for (int i = 0; i < d->nparams; i++) d->params[i].ready = false;
    d->next_launch = 0;
    d->first_err = EM_OK;
    d->err_msg[0] = '\0';
    d->in_backward = true;
    em_status bs = em_backward(loss, grad_output);
    d->in_backward = false;
    held_error bh;
    if (bs != EM_OK) error_hold(&bh, bs);
    /* Whatever happened, every rank starts and finishes every bucket, so the
     * ranks' collectives stay matched: a local failure never turns into a
     * hang elsewhere. */
    const char *unused = NULL;
    for (int i = 0; i < d->nparams && !unused; i++)
        if (!d->params[i].ready) unused = d->params[i].name;
    finish_buckets(d);
    em_status us = d->cfg.find_unused_parameters ? share_used(d) : EM_OK;
    if (bs != EM_OK) return error_restore(&bh);
    if (d->first_err != EM_OK) return em_set_error(d->first_err, "%s", d->err_msg);
    if (us != EM_OK) return us;
    if (unused && !d->cfg.find_unused_parameters)
        return em_err(EM_ERR_DIST,
                      "em_ddp_backward: parameter '%s' received no gradient in this backward; use it in the "
                      "loss, or set find_unused_parameters (its gradient is then averaged as it stands)",
                      unused);
    return EM_OK;
}

/* ---- several models in one backward ------------------------------------------
 * A loss may depend on several DDP-wrapped models. Their buckets must start
 * in one order every rank agrees on, whatever order backward finishes the
 * gradients in, or two buckets of equal size could be averaged with each
 * other's. So the hooks only mark gradients; after backward the ranks agree
 * (one small all-reduce) which models took part, here or on any rank (a
 * model with gradients from no_sync backwards since the last synced one
 * counts), and start the buckets of those models, model by model in the
 * order given. A model that took part nowhere is left alone, so a backward
 * through some of the models (a GAN's discriminator step) syncs just those.
 * (Communication no longer overlaps backward; one model keeps
 * em_ddp_backward's overlap.) */
em_status ddp_backward_many(em_ddp *const *ds, int n, em_tensor *loss, bool sync)
{
    if (n == 1) {
        em_ddp_set_sync(ds[0], sync);
        return em_ddp_backward(ds[0], loss, NULL);
    }
    for (int k = 0; k < n; k++) {
        em_ddp *d = ds[k];
        d->sync = sync;
        d->deferred = true;
        d->touched = false;
        d->first_err = EM_OK;
        d->err_msg[0] = '\0';
        for (int i = 0; i < d->nparams; i++) d->params[i].ready = false;
        d->in_backward = true;
    }
    em_status bs = em_backward(loss, NULL);
    for (int k = 0; k < n; k++) {
        ds[k]->in_backward = false;
        ds[k]->deferred = false;
        ds[k]->dirty = ds[k]->dirty || ds[k]->touched;
    }
    if (!sync) return bs;
    held_error bh;
    if (bs != EM_OK) error_hold(&bh, bs);
    /* every rank makes the same collectives whatever failed locally */
    int64_t nn = n;
    em_scope sc = em_scope_begin(); /* `took` dies here */
    em_tensor *took = em_zeros(EM_I32, 1, &nn);
    em_status s = took ? EM_OK : em_last_status();
    for (int k = 0; k < n && !s; k++) ((int32_t *)em_data(took))[k] = ds[k]->dirty;
    if (!s) s = em_all_reduce(ds[0]->pg, took, EM_RED_MAX, NULL);
    bool agreed = s == EM_OK; /* then every model that took part is synced, whatever fails */
    for (int k = 0; k < n && agreed; k++) {
        em_ddp *d = ds[k];
        d->dirty = false;
        d->touched = ((int32_t *)em_data(took))[k] != 0; /* now: took part on some rank */
        if (!d->touched) continue;
        d->next_launch = 0;
        for (int i = 0; i < d->nbuckets; i++) d->buckets[i].work = NULL;
        finish_buckets(d);
        if (d->first_err != EM_OK && !s) s = em_set_error(d->first_err, "%s", d->err_msg);
        em_status us = d->cfg.find_unused_parameters ? share_used(d) : EM_OK;
        if (us != EM_OK && !s) s = us;
    }
    for (int k = 0; k < n && !agreed; k++) ds[k]->touched = false;
    em_scope_end(sc);
    if (bs != EM_OK) return error_restore(&bh);
    if (s != EM_OK) return s;
    for (int k = 0; k < n; k++) {
        em_ddp *d = ds[k];
        if (!d->touched || d->cfg.find_unused_parameters) continue;
        for (int i = 0; i < d->nparams; i++)
            if (!d->params[i].ready)
                return em_err(EM_ERR_DIST,
                              "em_ddp_backward: parameter '%s' of model %d received no gradient in this "
                              "backward; use it in the loss, or set find_unused_parameters (its gradient is "
                              "then averaged as it stands)",
                              d->params[i].name, k);
    }
    return EM_OK;
}
