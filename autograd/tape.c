/* tape.c — eager reverse-mode autograd.
 *
 * Each differentiable op that needs a gradient appends a node to the calling
 * thread's tape (nodes and the input arrays live in the step scope's arena).
 * Nodes are appended in execution order, so the tape is already a topological
 * order: backward walks it in reverse from the root's node.
 *
 * Rule: leaf gradients use += (they accumulate across backward calls and
 * micro-batches); non-leaf gradients are temporaries of one walk.
 *
 * Before the walk, a reverse pass marks which nodes the root reaches and
 * counts, per leaf, how many reachable uses it has. The walk decrements that
 * count as each use contributes; at zero the leaf's gradient is final and its
 * hooks fire (DDP launches a bucket's all-reduce from there).
 */
#include <stdlib.h>

#include "../tensor/dispatch.h"
#include "../tensor/kernel_impl.h"
#include "ember/autograd.h"

/* The tape itself (the nodes ops recorded) and grad mode live with the
 * dispatcher (tensor/dispatch.c); this file is the engine that walks it. */

int64_t em_tape_length(void) { return tape_length(); }

bool em_set_grad_enabled(bool enabled) { return op_set_grad_mode(enabled); }

bool em_is_grad_enabled(void) { return op_grad_mode(); }

static em_status accum(tensor *t, tensor *g);
static em_status accum_view(tensor *t, tensor *g, const int64_t *stride, int64_t offset);

/* The engine serves the dispatcher's op_grad and op_grad_view (backward
 * functions hand their gradients there); registered when the library loads. */
__attribute__((constructor)) static void register_engine(void) { op_set_grad_sinks(accum, accum_view); }

/* ---- leaves ----------------------------------------------------------------- */

em_status em_set_requires_grad(em_tensor *h, bool rg)
{
    tensor *t = t_resolve(h, "em_set_requires_grad");
    if (!t) return em_last_status();
    if (t->grad_fn)
        return em_err(EM_ERR_AUTOGRAD,
                      "em_set_requires_grad: %s%s was made by op '%s'; only leaves take requires_grad "
                      "(use em_detach first)",
                      em_dtype_name(t->dtype), shp(t), op_name(t->grad_fn->op));
    if (rg && !chk_float("em_set_requires_grad", t)) return em_last_status();
    t->requires_grad = rg;
    return EM_OK;
}

bool em_requires_grad(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_requires_grad");
    return t && t->requires_grad;
}

bool em_is_leaf(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_is_leaf");
    return t && !t->grad_fn;
}

em_tensor *em_grad(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_grad");
    if (!t || t->grad_fn) return NULL;
    return t_handle(t->grad);
}

em_status em_set_grad_buffer(em_tensor *h, em_tensor *bh)
{
    tensor *t = t_resolve(h, "em_set_grad_buffer"), *b = t_resolve(bh, "em_set_grad_buffer");
    if (!t || !b) return em_last_status();
    if (t->grad_fn) return em_err(EM_ERR_AUTOGRAD, "em_set_grad_buffer: %s is not a leaf", shp(t));
    if (b->dtype != t->dtype || b->ndim != t->ndim ||
        memcmp(b->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim))
        return em_err(EM_ERR_SHAPE, "em_set_grad_buffer: buffer %s%s does not match tensor %s%s",
                      em_dtype_name(b->dtype), shp(b), em_dtype_name(t->dtype), shp(t));
    if (!t_is_contig(b) || b->depth != 0)
        return em_err(EM_ERR_ARG, "em_set_grad_buffer: buffer must be contiguous and persistent");
    if (t->grad && !t->grad_external) t_free(t->grad);
    t->grad = b;
    t->grad_external = true;
    return EM_OK;
}

em_status em_zero_grad(em_tensor *h)
{
    tensor *t = t_resolve(h, "em_zero_grad");
    if (!t) return em_last_status();
    if (t->grad) {
        tensor *g = t->grad;
        if (t_is_contig(g)) {
            em_status s = t_fill_zero(g);
            if (s) return s;
        }
        else {
            tensor *z = t_zeros_like(g);
            if (!z) return em_last_status();
            copy_strided(g, z);
            t_drop(z);
        }
    }
    return EM_OK;
}

em_status em_register_grad_hook(em_tensor *h, em_grad_hook fn, void *ctx)
{
    tensor *t = t_resolve(h, "em_register_grad_hook");
    if (!t) return em_last_status();
    if (!fn) return em_err(EM_ERR_ARG, "em_register_grad_hook: fn is NULL");
    if (t->grad_fn) return em_err(EM_ERR_AUTOGRAD, "em_register_grad_hook: %s is not a leaf", shp(t));
    hook_entry *e = malloc(sizeof *e);
    if (!e) return em_err(EM_ERR_OOM, "em_register_grad_hook: out of memory");
    *e = (hook_entry){NULL, fn, ctx};
    hook_entry **p = &t->hooks;
    while (*p) p = &(*p)->next;
    *p = e;
    return EM_OK;
}

em_status em_clear_grad_hooks(em_tensor *h)
{
    tensor *t = t_resolve(h, "em_clear_grad_hooks");
    if (!t) return em_last_status();
    for (hook_entry *e = t->hooks, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    t->hooks = NULL;
    return EM_OK;
}

em_tensor *em_detach(em_tensor *h)
{
    tensor *t = t_resolve(h, "em_detach");
    if (!t) return NULL;
    return t_handle(t_view_of(t, t->ndim, t->shape, t->stride, t->offset));
}

/* ---- accumulation ----------------------------------------------------------- */

static void add_into_view(tensor *dst, tensor *src);

/* dst += src, elementwise, same shape; dst contiguous, or a view into a
 * gradient (where a slice's contribution lands: add_into_view). */
static void add_into(tensor *dst, tensor *src)
{
    int64_t n = t_numel(dst);
#if EM_HAVE_CUDA
    if (t_on_cuda(dst)) { /* accum checked both are on this device */
        cu_walk w;
        cu_walk_of(&w, dst, 2, (const tensor *[]){dst, src});
        cu_add_into(dst->device.index, &w, dst->dtype, t_ptr(dst), src->dtype, t_ptr(src));
        return;
    }
#endif
    if (!t_is_contig(dst)) {
        add_into_view(dst, src);
        return;
    }
    if (t_is_contig(src) && widens_exactly(src->dtype, dst->dtype) && (dst->dtype == EM_F32 || dst->dtype == EM_F64)) {
        add_par(dst->dtype, t_ptr(dst), src->dtype, t_ptr(src), n);
        return;
    }
    nditer it;
    nditer_init(&it, src->ndim, src->shape, 1, (const int64_t *[]){src->stride});
    if (dst->dtype == EM_F32 && src->dtype == EM_F32) {
        float *d = t_ptr(dst);
        const float *s = t_ptr(src);
        for (int64_t i = 0; i < n; i++) {
            d[i] += s[it.off[0]];
            nditer_next(&it);
        }
        return;
    }
    size_t ds = t_esize(dst), ss = t_esize(src);
    char *dp = t_ptr(dst);
    const char *sp = t_ptr(src);
    for (int64_t i = 0; i < n; i++) {
        st(dst->dtype, dp + (size_t)i * ds,
           ld(dst->dtype, dp + (size_t)i * ds) + ld(src->dtype, sp + it.off[0] * (int64_t)ss));
        nditer_next(&it);
    }
}

/* The strided case of add_into (CPU; on CUDA add_into's walk covers it). */
static void add_into_view(tensor *dst, tensor *src)
{
    int last = src->ndim - 1;
    if (dst->dtype == EM_F32 && src->dtype == EM_F32 && last >= 0 && dst->stride[last] == 1 &&
        src->stride[last] == 1) { /* rows contiguous on both sides: a slice along a leading dim, or QKV's */
        int64_t w = src->shape[last], rows = t_numel(src) / (w ? w : 1);
        nditer it;
        nditer_init(&it, last, src->shape, 2, (const int64_t *[]){dst->stride, src->stride});
        float *dp = t_ptr(dst);
        const float *sp = t_ptr(src);
        for (int64_t r = 0; r < rows && w; r++) {
            float *d = dp + it.off[0];
            const float *q = sp + it.off[1];
            for (int64_t j = 0; j < w; j++) d[j] += q[j];
            nditer_next(&it);
        }
        return;
    }
    nditer it;
    nditer_init(&it, src->ndim, src->shape, 2, (const int64_t *[]){dst->stride, src->stride});
    size_t ds = t_esize(dst), ss = t_esize(src);
    char *dp = t_ptr(dst);
    const char *sp = t_ptr(src);
    for (int64_t i = 0, n = t_numel(src); i < n; i++) {
        char *d = dp + it.off[0] * (int64_t)ds;
        st(dst->dtype, d, ld(dst->dtype, d) + ld(src->dtype, sp + it.off[1] * (int64_t)ss));
        nditer_next(&it);
    }
}

/* g may contribute to t's gradient: `shape` (t's, or a view's) and device agree. */
static em_status check_contribution(tensor *t, tensor *g, const int64_t *shape)
{
    if (g->ndim != t->ndim || memcmp(g->shape, shape, sizeof(int64_t) * (size_t)t->ndim))
        return em_err(EM_ERR_AUTOGRAD, "backward: gradient %s does not match tensor %s (op '%s')", shp(g),
                      shp(t), t->grad_fn ? op_name(t->grad_fn->op) : "leaf");
    if (!em_device_equal(g->device, t->device))
        return em_err(EM_ERR_DEVICE, "backward: gradient %s is on another device than tensor %s (op '%s')", shp(g),
                      shp(t), t->grad_fn ? op_name(t->grad_fn->op) : "leaf");
    return EM_OK;
}

/* A leaf whose last reachable use has contributed: its gradient is final,
 * its hooks fire. */
static em_status contributed(tensor *t)
{
    if (!t->grad_fn && t->pending > 0 && --t->pending == 0) {
        for (hook_entry *e = t->hooks; e; e = e->next) {
            em_status s = e->fn(t_handle(t), t_handle(t->grad), e->ctx);
            if (s != EM_OK) return s;
        }
    }
    return EM_OK;
}

static em_status accum(tensor *t, tensor *g)
{
    em_status s = check_contribution(t, g, t->shape);
    if (s != EM_OK) return s;
    bool leaf = !t->grad_fn;
    if (!t->grad && !leaf && g->dtype == t->dtype) {
        /* a non-leaf's first contribution is adopted, not copied: backward
         * functions never write into a gradient they are given. It is
         * copied only if a second contribution has to be added to it. */
        t->grad = g;
        t->grad_shared = true;
    } else if (!t->grad || t->grad_shared) {
        tensor *ng = leaf ? t_new_persistent_on(t->device, t->dtype, t->ndim, t->shape) : t_new_like(t);
        if (!ng) return em_last_status();
        copy_strided(ng, t->grad ? t->grad : g);
        if (t->grad) add_into(ng, g);
        t->grad = ng;
        t->grad_shared = false;
    } else {
        add_into(t->grad, g);
    }
    return contributed(t);
}

/* g, the gradient of a view of t (a narrow or slice: g's shape, at `stride`
 * and `offset` in t's contiguous layout), is added into that part of t's
 * gradient, which becomes t's own (zeros where no view has contributed
 * yet). No zero tensor of t's size per contribution: the three narrows of a
 * fused QKV projection fill one buffer. */
static em_status accum_view(tensor *t, tensor *g, const int64_t *stride, int64_t offset)
{
    em_status s = check_contribution(t, g, g->shape);
    if (s != EM_OK) return s;
    if (!t->grad || t->grad_shared) {
        tensor *ng = !t->grad_fn ? t_new_persistent_on(t->device, t->dtype, t->ndim, t->shape) : t_new_like(t);
        if (!ng) return em_last_status();
        if (t->grad)
            copy_strided(ng, t->grad);
        else if (t_fill_zero(ng) != EM_OK)
            return em_last_status();
        t->grad = ng;
        t->grad_shared = false;
    }
    tensor *v = t_view_of(t->grad, g->ndim, g->shape, stride, t->grad->offset + offset);
    if (!v) return em_last_status();
    add_into(v, g);
    t_drop(v);
    return contributed(t);
}

/* ---- backward --------------------------------------------------------------- */

static void mark_reachable(node *root_node, tensor *root)
{
    for (int64_t i = 0; i < tape_length(); i++) tape_at(i)->reachable = false;
    if (!root_node) {
        root->pending = 1;
        return;
    }
    root_node->reachable = true;
    /* leaves: reset counts first (a leaf may be used by several nodes) */
    for (int64_t i = root_node->index; i >= 0; i--) {
        node *n = tape_at(i);
        for (int k = 0; k < n->nin; k++)
            if (n->in[k] && !n->in[k]->grad_fn) n->in[k]->pending = 0;
    }
    for (int64_t i = root_node->index; i >= 0; i--) {
        node *n = tape_at(i);
        if (!n->reachable) continue;
        for (int k = 0; k < n->nin; k++) {
            tensor *x = n->in[k];
            if (!x || !x->requires_grad) continue;
            if (x->grad_fn)
                x->grad_fn->reachable = true;
            else
                x->pending++;
        }
    }
}

em_status em_backward(em_tensor *rh, em_tensor *gh)
{
    tensor *root = t_resolve(rh, "em_backward");
    if (!root) return em_last_status();
    if (!root->requires_grad)
        return em_err(EM_ERR_AUTOGRAD,
                      "em_backward: %s%s does not require grad (no input of the ops that made it has "
                      "requires_grad set, or grad mode was off)",
                      em_dtype_name(root->dtype), shp(root));
    tensor *g0 = NULL;
    if (gh) {
        g0 = t_resolve(gh, "em_backward");
        if (!g0) return em_last_status();
        if (g0->ndim != root->ndim || memcmp(g0->shape, root->shape, sizeof(int64_t) * (size_t)root->ndim) ||
            g0->dtype != root->dtype)
            return em_err(EM_ERR_SHAPE, "em_backward: grad_output %s%s does not match root %s%s",
                          em_dtype_name(g0->dtype), shp(g0), em_dtype_name(root->dtype), shp(root));
    } else if (t_numel(root) != 1) {
        return em_err(EM_ERR_SHAPE,
                      "em_backward: root %s has %lld elements; pass grad_output for a non-scalar root",
                      shp(root), (long long)t_numel(root));
    }
    if (root->grad_fn && em_scope_depth() == 0)
        return em_err(EM_ERR_SCOPE, "em_backward: needs an open step scope for its temporaries");
    bool prev = op_set_grad_mode(false);
    em_dtype cast_prev = op_set_autocast(EM_F32); /* backward runs in the dtypes forward chose */
    node *rn = root->grad_fn;
    mark_reachable(rn, root);
    em_status s = EM_OK;
    if (!gh) {
        /* the seed dL/dL = 1, on the root's device */
        g0 = em_scope_depth() ? t_new_on(root->device, root->dtype, root->ndim, root->shape)
                              : t_new_persistent_on(root->device, root->dtype, root->ndim, root->shape);
        em_status fs = g0 ? EM_OK : em_last_status();
#if EM_HAVE_CUDA
        if (g0 && t_on_cuda(g0)) fs = cu_fill(g0->device.index, g0->dtype, t_ptr(g0), 1, 1.0);
        else
#endif
        if (g0) fill_n(g0->dtype, t_ptr(g0), 1.0, 1);
        if (fs) {
            if (g0 && g0->depth == 0) t_free(g0);
            op_set_grad_mode(prev);
            op_set_autocast(cast_prev);
            return fs;
        }
    }
    s = accum(root, g0);
    if (!gh && g0->depth == 0) t_free(g0);
    for (int64_t i = rn ? rn->index : -1; i >= 0 && s == EM_OK; i--) {
        node *n = tape_at(i);
        if (!n->reachable || !n->out->grad) continue;
        tensor *gout = n->out->grad;
        n->out->grad = NULL; /* non-leaf grads are temporaries of this walk */
        n->out->grad_shared = false;
        prof_mark pm;
        prof_begin(&pm);
        s = n->backward(n, gout);
        prof_end_op(&pm, n->op, true);
        if (s != EM_OK && em_last_status() == EM_OK) em_err(s, "backward of '%s' failed", op_name(n->op));
    }
    /* on failure, drop the temporaries the walk left behind */
    for (int64_t i = rn ? rn->index : -1; i >= 0; i--) {
        tape_at(i)->out->grad = NULL;
        tape_at(i)->out->grad_shared = false;
    }
    op_set_grad_mode(prev);
    op_set_autocast(cast_prev);
    return s;
}
