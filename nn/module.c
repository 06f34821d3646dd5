/* module.c — the module tree: names, parameters, buffers, train/eval, and
 * the flat parameter layout.
 *
 * Every parameter stores its full dotted name from the root
 * ("h.0.attn.qkv.weight"); a name relative to a module m is a suffix of it
 * (skip m's own full name and the dot), so listing needs no allocation.
 *
 * Flattening copies each parameter into one 64-byte-aligned slot of a
 * persistent 1-D buffer per dtype and re-points the parameter's storage
 * there (its handle is unchanged); gradients get views into a matching
 * buffer. The padding between slots stays zero, so a collective can reduce
 * the whole buffer. */
#include <stdio.h>
#include <stdlib.h>

#include "../tensor/kernel_impl.h"
#include "../tensor/tensor_impl.h"
#include "ember/nn.h"
#include "module_impl.h"

typedef struct entry {
    char *full; /* dotted name from the root */
    em_tensor *t;
} entry;

typedef struct entries {
    entry *v;
    int n, cap;
} entries;

typedef struct rng_entry {
    char *full;  /* dotted name from the root */
    em_rng *rng; /* borrowed: lives in a layer struct the module owns */
} rng_entry;

struct em_module {
    char *name; /* local name ("" for a root) */
    char *full; /* dotted path from the root */
    em_module *parent, *first, *last, *next;
    entries params, buffers;
    rng_entry *rngs;
    int n_rngs;
    bool training;
    void **owned;
    int n_owned;
    /* root only: the flat layout */
    bool flat;
    em_tensor *flat_params[EM_NUM_DTYPES], *flat_grads[EM_NUM_DTYPES];
    em_tensor **grad_views;
    int n_grad_views;
};

static bool valid_name(const char *name) { return name && name[0] && !strchr(name, '.'); }

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (!s) return NULL;
    if (la) {
        memcpy(s, a, la);
        s[la] = '.';
        memcpy(s + la + 1, b, lb + 1);
    } else {
        memcpy(s, b, lb + 1);
    }
    return s;
}

em_module *em_module_new(em_module *parent, const char *name)
{
    if (parent) {
        if (!valid_name(name))
            return em_fail(EM_ERR_ARG, "em_module_new: child name '%s' must be non-empty and without '.'",
                           name ? name : "(null)");
        for (em_module *c = parent->first; c; c = c->next)
            if (!strcmp(c->name, name))
                return em_fail(EM_ERR_ARG, "em_module_new: '%s' already has a child named '%s'", parent->full,
                               name);
    }
    em_module *m = calloc(1, sizeof *m);
    if (!m) return em_fail(EM_ERR_OOM, "em_module_new: out of memory");
    m->name = strdup(parent ? name : "");
    m->full = parent ? join(parent->full, name) : strdup("");
    if (!m->name || !m->full) {
        free(m->name);
        free(m->full);
        free(m);
        return em_fail(EM_ERR_OOM, "em_module_new: out of memory");
    }
    m->training = parent ? parent->training : true;
    if (parent) {
        m->parent = parent;
        if (parent->last)
            parent->last->next = m;
        else
            parent->first = m;
        parent->last = m;
    }
    return m;
}

const char *em_module_name(const em_module *m) { return m ? m->full : ""; }

void em_module_set_owner(em_module *m, void *block)
{
    void **o = realloc(m->owned, sizeof *o * (size_t)(m->n_owned + 1));
    if (!o) return; /* the block leaks rather than being freed early */
    m->owned = o;
    m->owned[m->n_owned++] = block;
}

static void free_entries(entries *e)
{
    for (int i = 0; i < e->n; i++) {
        em_free(e->v[i].t);
        free(e->v[i].full);
    }
    free(e->v);
}

static void module_free(em_module *m)
{
    for (em_module *c = m->first, *n; c; c = n) {
        n = c->next;
        module_free(c);
    }
    free_entries(&m->params);
    free_entries(&m->buffers);
    for (int i = 0; i < m->n_rngs; i++) free(m->rngs[i].full);
    free(m->rngs);
    for (int i = 0; i < m->n_grad_views; i++) em_free(m->grad_views[i]);
    free(m->grad_views);
    for (int d = 0; d < EM_NUM_DTYPES; d++) {
        em_free(m->flat_params[d]);
        em_free(m->flat_grads[d]);
    }
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->name);
    free(m->full);
    free(m);
}

void em_module_free(em_module *root)
{
    if (!root) return;
    if (root->parent) {
        em_fail(EM_ERR_ARG, "em_module_free: '%s' is not a root; free the root of its tree", root->full);
        return;
    }
    module_free(root);
}

/* The local name of an entry: what follows the last dot of its full name. */
static const char *local_name(const entry *e)
{
    const char *dot = strrchr(e->full, '.');
    return dot ? dot + 1 : e->full;
}

static bool name_taken(const em_module *m, const char *name)
{
    for (int i = 0; i < m->params.n; i++)
        if (!strcmp(local_name(&m->params.v[i]), name)) return true;
    for (int i = 0; i < m->buffers.n; i++)
        if (!strcmp(local_name(&m->buffers.v[i]), name)) return true;
    for (int i = 0; i < m->n_rngs; i++)
        if (!strcmp(local_name(&(entry){m->rngs[i].full, NULL}), name)) return true;
    for (em_module *c = m->first; c; c = c->next)
        if (!strcmp(c->name, name)) return true;
    return false;
}

static em_status add_entry(em_module *m, entries *e, const char *what, const char *name, em_tensor *h,
                           bool grad)
{
    if (!m) return em_err(EM_ERR_ARG, "em_module_add_%s: module is NULL", what);
    tensor *t = t_resolve(h, what);
    if (!t) return em_last_status();
    if (!valid_name(name))
        return em_err(EM_ERR_ARG, "em_module_add_%s: name '%s' must be non-empty and without '.'", what,
                      name ? name : "(null)");
    if (name_taken(m, name))
        return em_err(EM_ERR_ARG, "em_module_add_%s: '%s' already has a member named '%s'", what, m->full,
                      name);
    if (t->depth != 0)
        return em_err(EM_ERR_SCOPE,
                      "em_module_add_%s: '%s' is a step-scope tensor; parameters must be persistent", what,
                      name);
    if (m->parent == NULL && m->flat)
        return em_err(EM_ERR_ARG, "em_module_add_%s: the module is already flattened", what);
    if (grad && !t->requires_grad) {
        em_status s = em_set_requires_grad(h, true);
        if (s) return s;
    }
    if (e->n == e->cap) {
        int cap = e->cap ? 2 * e->cap : 4;
        entry *v = realloc(e->v, sizeof *v * (size_t)cap);
        if (!v) return em_err(EM_ERR_OOM, "em_module_add_%s: out of memory", what);
        e->v = v;
        e->cap = cap;
    }
    char *full = join(m->full, name);
    if (!full) return em_err(EM_ERR_OOM, "em_module_add_%s: out of memory", what);
    e->v[e->n++] = (entry){full, h};
    return EM_OK;
}

em_status em_module_add_param(em_module *m, const char *name, em_tensor *t)
{
    return add_entry(m, m ? &m->params : NULL, "param", name, t, true);
}

em_status em_module_add_buffer(em_module *m, const char *name, em_tensor *t)
{
    return add_entry(m, m ? &m->buffers : NULL, "buffer", name, t, false);
}

/* name of e relative to module m (a suffix of its full name) */
static const char *relative(const em_module *m, const entry *e)
{
    size_t n = strlen(m->full);
    return n ? e->full + n + 1 : e->full;
}

static int collect(const em_module *base, const em_module *m, bool params, em_named *out, int max, int k)
{
    const entries *e = params ? &m->params : &m->buffers;
    for (int i = 0; i < e->n; i++, k++)
        if (k < max) out[k] = (em_named){relative(base, &e->v[i]), e->v[i].t};
    for (const em_module *c = m->first; c; c = c->next) k = collect(base, c, params, out, max, k);
    return k;
}

int em_module_params(const em_module *m, em_named *out, int max)
{
    return m ? collect(m, m, true, out, max, 0) : 0;
}
int em_module_buffers(const em_module *m, em_named *out, int max)
{
    return m ? collect(m, m, false, out, max, 0) : 0;
}

em_status em_module_add_rng(em_module *m, const char *name, em_rng *rng)
{
    if (!m || !rng) return em_err(EM_ERR_ARG, "em_module_add_rng: %s is NULL", m ? "generator" : "module");
    if (!valid_name(name))
        return em_err(EM_ERR_ARG, "em_module_add_rng: name '%s' must be non-empty and without '.'",
                      name ? name : "(null)");
    if (name_taken(m, name))
        return em_err(EM_ERR_ARG, "em_module_add_rng: '%s' already has a member named '%s'", m->full, name);
    rng_entry *v = realloc(m->rngs, sizeof *v * (size_t)(m->n_rngs + 1));
    if (!v) return em_err(EM_ERR_OOM, "em_module_add_rng: out of memory");
    m->rngs = v;
    char *full = join(m->full, name);
    if (!full) return em_err(EM_ERR_OOM, "em_module_add_rng: out of memory");
    m->rngs[m->n_rngs++] = (rng_entry){full, rng};
    return EM_OK;
}

static int collect_rngs(const em_module *base, const em_module *m, em_named_rng *out, int max, int k)
{
    size_t skip = strlen(base->full);
    for (int i = 0; i < m->n_rngs; i++, k++)
        if (k < max) out[k] = (em_named_rng){m->rngs[i].full + (skip ? skip + 1 : 0), m->rngs[i].rng};
    for (const em_module *c = m->first; c; c = c->next) k = collect_rngs(base, c, out, max, k);
    return k;
}

int em_module_rngs(const em_module *m, em_named_rng *out, int max)
{
    return m ? collect_rngs(m, m, out, max, 0) : 0;
}

static em_tensor *find(const em_module *base, const em_module *m, const char *name)
{
    for (int p = 0; p < 2; p++) {
        const entries *e = p ? &m->buffers : &m->params;
        for (int i = 0; i < e->n; i++)
            if (!strcmp(relative(base, &e->v[i]), name)) return e->v[i].t;
    }
    for (const em_module *c = m->first; c; c = c->next) {
        em_tensor *t = find(base, c, name);
        if (t) return t;
    }
    return NULL;
}

em_tensor *em_module_find(const em_module *m, const char *name)
{
    return m && name ? find(m, m, name) : NULL;
}

int64_t em_module_num_params(const em_module *m)
{
    int n = em_module_params(m, NULL, 0);
    em_named *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    if (!v) return -1;
    em_module_params(m, v, n);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += em_numel(v[i].t);
    free(v);
    return total;
}

void em_module_train(em_module *m, bool training)
{
    if (!m) return;
    m->training = training;
    for (em_module *c = m->first; c; c = c->next) em_module_train(c, training);
}

bool em_module_is_training(const em_module *m) { return m && m->training; }

em_status em_module_zero_grad(em_module *m)
{
    int n = em_module_params(m, NULL, 0);
    em_named *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    if (!v) return em_err(EM_ERR_OOM, "em_module_zero_grad: out of memory");
    em_module_params(m, v, n);
    em_status s = EM_OK;
    for (int i = 0; i < n && !s; i++) s = em_zero_grad(v[i].t);
    free(v);
    return s;
}

/* ---- flat layout ------------------------------------------------------------- */

static int64_t align_up(int64_t n, em_dtype dt)
{
    int64_t per = 64 / (int64_t)em_dtype_size(dt); /* elements per 64 bytes */
    return (n + per - 1) / per * per;
}

/* t's values into new persistent storage on dev; t then points at it */
static em_status move_tensor(tensor *t, em_device dev)
{
    if (em_device_equal(t->device, dev)) return EM_OK;
    em_tensor *moved = em_to(t_handle(t), dev); /* contiguous, on dev, in the current scope or persistent */
    tensor *m = moved ? t_resolve(moved, "em_module_to") : NULL;
    if (!m) return em_last_status();
    tensor *home = t_new_persistent_on(dev, t->dtype, t->ndim, t->shape);
    if (!home) return em_last_status();
    copy_strided(home, m);
    if (m->depth == 0) t_free(m);
    if (t->grad && !t->grad_external) t_free(t->grad);
    t->grad = NULL;
    t->grad_set = false;
    t_repoint(t, home, 0);
    t_free(home); /* t holds the storage now */
    return em_last_status();
}

em_status em_module_to(em_module *root, em_device dev)
{
    if (!root) return em_err(EM_ERR_ARG, "em_module_to: module is NULL");
    if (root->parent) return em_err(EM_ERR_ARG, "em_module_to: '%s' is not a root", root->full);
    if (root->flat)
        return em_err(EM_ERR_ARG, "em_module_to: '%s' is already flattened; move it before em_module_flatten "
                                  "(and before em_accel_prepare)",
                      root->full);
    int np = em_module_params(root, NULL, 0), nb = em_module_buffers(root, NULL, 0);
    em_named *v = malloc(sizeof *v * (size_t)(np + nb + 1));
    if (!v) return em_err(EM_ERR_OOM, "em_module_to: out of memory");
    em_module_params(root, v, np);
    em_module_buffers(root, v + np, nb);
    bool prev = em_set_grad_enabled(false);
    em_scope sc = em_scope_begin();
    em_status s = EM_OK;
    for (int i = 0; i < np + nb && !s; i++) {
        tensor *t = t_resolve(v[i].t, "em_module_to");
        s = t ? move_tensor(t, dev) : em_last_status();
    }
    em_scope_end(sc);
    em_set_grad_enabled(prev);
    free(v);
    return s;
}

em_status em_module_flatten(em_module *root)
{
    if (!root) return em_err(EM_ERR_ARG, "em_module_flatten: module is NULL");
    if (root->parent) return em_err(EM_ERR_ARG, "em_module_flatten: '%s' is not a root", root->full);
    if (root->flat) return EM_OK;
    int n = em_module_params(root, NULL, 0);
    em_named *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    em_tensor **views = malloc(sizeof *views * (size_t)(n ? n : 1));
    if (!v || !views) {
        free(v);
        free(views);
        return em_err(EM_ERR_OOM, "em_module_flatten: out of memory");
    }
    em_module_params(root, v, n);
    int64_t total[EM_NUM_DTYPES] = {0};
    em_device where[EM_NUM_DTYPES]; /* the device of each dtype's parameters */
    for (int i = 0; i < n; i++) {
        tensor *t = t_resolve(v[i].t, "em_module_flatten");
        if (!t) goto fail;
        if (total[t->dtype] && !em_device_equal(where[t->dtype], t->device)) {
            em_err(EM_ERR_DEVICE, "em_module_flatten: %s parameters on two devices ('%s' is on another than the "
                                  "first); move the whole model with em_module_to",
                   em_dtype_name(t->dtype), v[i].name);
            goto fail;
        }
        where[t->dtype] = t->device;
        total[t->dtype] += align_up(t_numel(t), t->dtype);
    }
    bool prev = em_set_grad_enabled(false);
    for (int d = 0; d < EM_NUM_DTYPES; d++) {
        if (!total[d]) continue;
        tensor *fp = t_new_persistent_on(where[d], (em_dtype)d, 1, (int64_t[]){total[d]});
        tensor *fg = fp ? t_new_persistent_on(where[d], (em_dtype)d, 1, (int64_t[]){total[d]}) : NULL;
        if (!fg || t_fill_zero(fp) || t_fill_zero(fg)) {
            t_drop(fp);
            t_drop(fg);
            em_set_grad_enabled(prev);
            goto fail;
        }
        root->flat_params[d] = t_handle(fp);
        root->flat_grads[d] = t_handle(fg);
    }
    int64_t off[EM_NUM_DTYPES] = {0};
    for (int i = 0; i < n; i++) {
        tensor *t = t_resolve(v[i].t, "em_module_flatten");
        tensor *fp = t_resolve(root->flat_params[t->dtype], "em_module_flatten");
        tensor *fg = t_resolve(root->flat_grads[t->dtype], "em_module_flatten");
        int64_t o = off[t->dtype], k = t_numel(t);
        /* the values move into the flat buffer, then the parameter follows */
        int64_t stride[EM_MAX_DIMS];
        t_contig_strides(t->ndim, t->shape, stride);
        tensor *dst = t_view_persistent(fp, t->ndim, t->shape, stride, o);
        if (!dst) {
            em_set_grad_enabled(prev);
            goto fail;
        }
        copy_strided(dst, t);
        t_free(dst);
        t_repoint(t, fp, o);
        tensor *gv = t_view_persistent(fg, t->ndim, t->shape, t->stride, o); /* the module's, not a scope's */
        if (!gv) {
            em_set_grad_enabled(prev);
            goto fail;
        }
        if (t->grad) copy_strided(gv, t->grad);
        views[i] = t_handle(gv);
        root->grad_views = views; /* owned by root from the first view on */
        root->n_grad_views = i + 1;
        bool had = t->grad_set; /* a buffer is not a gradient (em_has_grad stays) */
        em_set_grad_buffer(v[i].t, views[i]);
        t->grad_set = had;
        off[t->dtype] = o + align_up(k, t->dtype);
    }
    em_set_grad_enabled(prev);
    root->grad_views = views;
    root->n_grad_views = n;
    root->flat = true;
    free(v);
    return EM_OK;
fail:
    free(v);
    if (root->grad_views != views) free(views);
    return em_last_status() ? em_last_status() : em_err(EM_ERR_OOM, "em_module_flatten: failed");
}

em_tensor *em_module_flat_params(const em_module *root, em_dtype dt)
{
    return root && (unsigned)dt < EM_NUM_DTYPES ? root->flat_params[dt] : NULL;
}

em_tensor *em_module_flat_grads(const em_module *root, em_dtype dt)
{
    return root && (unsigned)dt < EM_NUM_DTYPES ? root->flat_grads[dt] : NULL;
}

/* ---- errors named by the layer (module_impl.h) ------------------------------------ */

static _Thread_local uint64_t named_error; /* error_seq() of the last error a layer named */

em_tensor *nn_named(const em_module *m, const char *kind, em_tensor *y)
{
    if (y) return y;
    em_status s = em_last_status();
    if (s == EM_OK || error_seq() == named_error) return NULL; /* nothing to name, or named inside already */
    const char *name = m && m->full[0] ? m->full : "(root)";
    char who[300];
    snprintf(who, sizeof who, "%s '%s'", kind, name);
    if (s == EM_ERR_SCOPE && em_scope_depth() == 0)
        em_set_error(
            s,
            "%s: this forward records gradients, which needs a scope: call em_scope_begin() before the "
            "forward (and em_scope_end() once the step is done), or run it under "
            "em_set_grad_enabled(false) for inference",
            who);
    else
        em_set_error(s, "%s: %s", who, em_last_error());
    named_error = error_seq();
    return NULL;
}
