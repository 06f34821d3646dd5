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

/* The engine serves the dispatcher's op_grad (backward functions hand their
 * gradients there); registered when the library loads. */
static tensor *acc_of(tensor *t, bool *fresh);
static em_status acc_done(tensor *t);
__attribute__((constructor)) static void register_engine(void) { op_set_grad_sink(accum, acc_of, acc_done); }

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

bool em_has_grad(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_has_grad");
    return t && t_live_grad(t);
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
    t->grad_set = true; /* the buffer's values are the gradient (PyTorch's p.grad = b) */
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

/* dst += src, elementwise, same shape; dst contiguous. */
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
    bool low = (dst->dtype == EM_F16 || dst->dtype == EM_BF16) &&
               (src->dtype == EM_F32 || src->dtype == EM_F16 || src->dtype == EM_BF16);
    if (t_is_contig(src) &&
        (low || (widens_exactly(src->dtype, dst->dtype) && (dst->dtype == EM_F32 || dst->dtype == EM_F64)))) {
        add_par(dst->dtype, t_ptr(dst), src->dtype, t_ptr(src), n);
        return;
    }
    if (low) { /* a strided src (an expanded gradient): made contiguous first, then added in bulk */
        tensor *c = t_clone(src);
        if (c) {
            add_par(dst->dtype, t_ptr(dst), c->dtype, t_ptr(c), n);
            t_drop(c);
            return;
        } /* out of memory: element by element below */
        em_clear_error();
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

/* A use of leaf t has contributed: at its last one the gradient is final
 * and t's hooks run. */
static em_status leaf_used(tensor *t)
{
    if (!t->grad_fn && t->pending > 0 && --t->pending == 0) {
        for (hook_entry *e = t->hooks; e; e = e->next) {
            em_status s = e->fn(t_handle(t), t_handle(t->grad), e->ctx);
            if (s != EM_OK) return s;
        }
    }
    return EM_OK;
}

/* Whether dst = a + b (one shape: accum checked it) can be one pass
 * (sum_par) instead of a copy and an add: all on the CPU, contiguous, of
 * one dtype, f32 or f64. */
static bool sums_at_once(const tensor *dst, const tensor *a, const tensor *b)
{
    em_dtype dt = dst->dtype;
    return (dt == EM_F32 || dt == EM_F64) && a->dtype == dt && b->dtype == dt && !t_on_cuda(dst) &&
           !t_on_cuda(a) && !t_on_cuda(b) && t_is_contig(dst) && t_is_contig(a) && t_is_contig(b);
}

static em_status accum(tensor *t, tensor *g)
{
    if (g->ndim != t->ndim || memcmp(g->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim))
        return em_err(EM_ERR_AUTOGRAD, "backward: gradient %s does not match tensor %s (op '%s')", shp(g),
                      shp(t), t->grad_fn ? op_name(t->grad_fn->op) : "leaf");
    if (!em_device_equal(g->device, t->device))
        return em_err(EM_ERR_DEVICE, "backward: gradient %s is on another device than tensor %s (op '%s')", shp(g),
                      shp(t), t->grad_fn ? op_name(t->grad_fn->op) : "leaf");
    bool leaf = !t->grad_fn;
    if (leaf) t->grad_set = true;
    if (!t->grad && !leaf && t_takes_grad_in(t, g->dtype)) {
        /* a non-leaf's first contribution is adopted, not copied: backward
         * functions never write into a gradient they are given. It is
         * copied only if a second contribution has to be added to it (into
         * t's dtype, so a wider first one is rounded then, as it would
         * have been on arrival). */
        t->grad = g;
        t->grad_shared = true;
    } else if (!t->grad || t->grad_shared) {
        tensor *ng = leaf ? t_new_persistent_on(t->device, t->dtype, t->ndim, t->shape) : t_new_like(t);
        if (!ng) return em_last_status();
        if (t->grad && sums_at_once(ng, t->grad, g)) /* (a residual stream's second contribution) */
            sum_par(ng->dtype, t_ptr(ng), t_ptr(t->grad), t_ptr(g), t_numel(ng));
        else {
            copy_strided(ng, t->grad ? t->grad : g);
            if (t->grad) add_into(ng, g);
        }
        t->grad = ng;
        t->grad_shared = false;
    } else {
        add_into(t->grad, g);
    }
    return leaf_used(t);
}

/* op_grad_acc (tensor/dispatch.h): where a backward function may add its
 * contribution to t's gradient itself. A leaf's gradient (zero-filled when
 * it is made here, so a failed caller leaves no garbage in a persistent
 * buffer); a non-leaf's running gradient (a shared one copied first, as
 * accum would); for a view output without a gradient of its own, the view
 * of its input's accumulator (a Linear's W^T: dW lands in W's buffer, never
 * made twice); else a new uninitialised gradient. */
static tensor *acc_of(tensor *t, bool *fresh)
{
    *fresh = false;
    if (!t->grad_fn) {
        if (!t->grad) {
            tensor *ng = t_new_persistent_on(t->device, t->dtype, t->ndim, t->shape);
            if (!ng) return NULL;
            if (t_fill_zero(ng)) {
                t_free(ng);
                return NULL;
            }
            t->grad = ng;
            t->grad_shared = false;
            *fresh = true;
        }
        if (t->grad->dtype != t->dtype || !t_is_contig(t->grad)) return NULL;
        t->grad_set = true; /* the caller adds into it now */
        return t->grad;
    }
    if (t->grad) {
        if (t->grad->dtype != t->dtype) return NULL;
        if (t->grad_shared) {
            tensor *ng = t_new_like(t);
            if (!ng) return NULL;
            copy_strided(ng, t->grad);
            t->grad = ng;
            t->grad_shared = false;
        }
        return t->grad;
    }
    node *n = t->grad_fn;
    if (n->grad_view && n->nin == 1 && n->in[0]->requires_grad && n->in[0]->dtype == t->dtype) {
        tensor *acc = acc_of(n->in[0], fresh);
        return acc ? n->grad_view(n, acc) : NULL;
    }
    tensor *ng = t_new_like(t);
    if (!ng) return NULL;
    t->grad = ng;
    t->grad_shared = false;
    *fresh = true;
    return ng;
}

/* op_grad_done: t's accumulator holds the contribution. A non-leaf without
 * a gradient of its own was reached through its view: its node counts the
 * use of its input when the walk gets there (walk_delivered). */
static em_status acc_done(tensor *t)
{
    if (t->grad_fn) {
        if (!t->grad) t->grad_fn->delivered = true;
        return EM_OK;
    }
    return leaf_used(t);
}

/* The walk at view node n whose output got no gradient of its own but whose
 * consumers added into its input's gradient through the view: that use of
 * the input is complete (a leaf's count drops; a view input passes it on). */
static em_status walk_delivered(node *n) { return acc_done(n->in[0]); }

/* ---- backward --------------------------------------------------------------- */

static void mark_reachable(node *root_node, tensor *root)
{
    for (int64_t i = 0; i < tape_length(); i++) {
        tape_at(i)->reachable = false;
        tape_at(i)->delivered = false;
    }
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
        if (!n->reachable) continue;
        if (!n->out->grad && !n->delivered) continue;
        tensor *gout = n->out->grad;
        n->out->grad = NULL; /* non-leaf grads are temporaries of this walk */
        n->out->grad_shared = false;
        prof_mark pm;
        prof_begin(&pm); /* a delivered view's node too: its input's hooks run there */
        s = gout ? n->backward(n, gout) : walk_delivered(n);
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
