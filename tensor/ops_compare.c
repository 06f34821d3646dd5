/* ops_compare.c — comparisons (eq, ne, lt, le, gt, ge -> EM_BOOL, broadcasting,
 * not differentiable) and selection by a bool mask: where(cond, a, b) and
 * masked_fill(a, mask, value), both differentiable in their float inputs.
 * On a CUDA device they run through tensor/ops_elementwise.cu: compares as
 * cu_compare, the selections as a strided copy then cu_select. */
#include "dispatch.h"
#include "elementwise_math.h"
#include "kernel_impl.h"
#if EM_HAVE_CUDA
#include "cuda_elementwise.h"
#endif

#pragma GCC diagnostic error "-Wswitch-enum" /* a switch over an op enum names every op */

typedef struct cmp_ctx {
    cmpop k;
    tensor *out, *a, *b;
    int64_t sa[EM_MAX_DIMS], sb[EM_MAX_DIMS]; /* broadcast strides */
    bool flat;                                /* same shape, contiguous, f32 */
} cmp_ctx;

static void cmp_range(void *p, int64_t lo, int64_t hi)
{
    cmp_ctx *c = p;
    uint8_t *o = t_ptr(c->out);
    if (c->flat) {
        const float *x = t_ptr(c->a), *y = t_ptr(c->b);
        for (int64_t i = lo; i < hi; i++) o[i] = ew_compare(c->k, x[i], y[i]);
        return;
    }
    em_dtype dt = c->a->dtype;
    size_t es = t_esize(c->a);
    const char *ap = t_ptr(c->a), *bp = t_ptr(c->b);
    nditer it;
    nditer_init(&it, c->out->ndim, c->out->shape, 2, (const int64_t *[]){c->sa, c->sb});
    nditer_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++) {
        o[i] = ew_compare(c->k, ld(dt, ap + it.off[0] * (int64_t)es), ld(dt, bp + it.off[1] * (int64_t)es));
        nditer_next(&it);
    }
}

#if EM_HAVE_CUDA
/* w over contiguous out's shape: operand 0 out, 1 a and 2 b (either may be
 * NULL: strides 0), both broadcast to out */
static void bcast_walk(cu_walk *w, const tensor *out, const tensor *a, const tensor *b)
{
    memset(w, 0, sizeof *w);
    w->ndim = out->ndim;
    memcpy(w->shape, out->shape, sizeof(int64_t) * (size_t)out->ndim);
    t_contig_strides(out->ndim, out->shape, w->stride[0]);
    if (a) bcast_strides(a, out->ndim, out->shape, w->stride[1]);
    if (b) bcast_strides(b, out->ndim, out->shape, w->stride[2]);
}
#endif

/* out (contiguous, the broadcast shape, EM_BOOL) = a <k> b; the cmpop in ip[0] */
static em_status cmp_cpu(const op_call *call, tensor *out)
{
    tensor *a = call->in[0], *b = call->in[1];
    int64_t n = t_numel(out);
    cmp_ctx c = {.k = (cmpop)call->ip[0], .out = out, .a = a, .b = b};
    c.flat = a->dtype == EM_F32 && t_is_contig(a) && t_is_contig(b) && t_numel(a) == n && t_numel(b) == n;
    bcast_strides(a, out->ndim, out->shape, c.sa);
    bcast_strides(b, out->ndim, out->shape, c.sb);
    parallel_for(n, 1 << 14, cmp_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status cmp_cuda(const op_call *call, tensor *out)
{
    tensor *a = call->in[0], *b = call->in[1];
    cu_walk w;
    bcast_walk(&w, out, a, b);
    return cu_compare(out->device.index, (cmpop)call->ip[0], &w, a->dtype, t_ptr(out), t_ptr(a), t_ptr(b));
}
#endif

static const op_kernels cmp_kernels = OP_KERNELS(cmp_cpu, cmp_cuda);

/* out = a <op> b, broadcast, EM_BOOL; never recorded on the tape */
static tensor *compare(cmpop k, tensor *a, tensor *b)
{
    tensor *in[2] = {a, b};
    OP_CALL(c);
    if (!op_begin(&c, cmpop_ops[k], 2, in)) return NULL;
    a = in[0], b = in[1];
    tensor *out = op_out(&c, EM_BOOL, c.ndim, c.shape);
    c.ip[0] = k;
    c.record = false; /* a comparison has no gradient */
    if (!out || op_run(&c, &cmp_kernels, out)) return NULL;
    return op_end(&c, out, NULL);
}

/* ---- where / masked_fill ------------------------------------------------------------ */

typedef struct sel_ctx {
    tensor *out, *cond, *a, *b; /* a or b NULL: that side is `fill` */
    int64_t sc[EM_MAX_DIMS], sa[EM_MAX_DIMS], sb[EM_MAX_DIMS];
    unsigned char fill[8]; /* a value encoded in out's dtype */
} sel_ctx;

/* out[i] = cond ? a : b — a byte copy, as out, a and b share a dtype */
static void sel_range(void *p, int64_t lo, int64_t hi)
{
    sel_ctx *c = p;
    tensor *o = c->out;
    int64_t es = (int64_t)t_esize(o);
    char *op = t_ptr(o);
    const uint8_t *cp = t_ptr(c->cond);
    const char *ap = c->a ? t_ptr(c->a) : NULL, *bp = c->b ? t_ptr(c->b) : NULL;
    nditer it;
    nditer_init(&it, o->ndim, o->shape, 3, (const int64_t *[]){c->sc, c->sa, c->sb});
    nditer_seek(&it, lo);
    if (o->dtype == EM_F32 && ap && bp) {
        for (int64_t i = lo; i < hi; i++) {
            ((float *)op)[i] =
                cp[it.off[0]] ? ((const float *)ap)[it.off[1]] : ((const float *)bp)[it.off[2]];
            nditer_next(&it);
        }
        return;
    }
    for (int64_t i = lo; i < hi; i++) {
        const char *src = cp[it.off[0]] ? (ap ? ap + it.off[1] * es : (const char *)c->fill)
                                        : (bp ? bp + it.off[2] * es : (const char *)c->fill);
        memcpy(op + i * es, src, (size_t)es);
        nditer_next(&it);
    }
}

/* The operands of a selection out = cond ? a : b, with `fill` standing for a
 * NULL a or b: where(cond, a, b) is in[0..3); masked_fill(a, mask, value)
 * is mask ? value : a, the value in dp[0]. */
typedef struct sel_args {
    tensor *cond, *a, *b;
    double fill;
} sel_args;

static sel_args sel_args_of(const op_call *call)
{
    if (call->op == OP_WHERE) return (sel_args){call->in[0], call->in[1], call->in[2], 0.0};
    return (sel_args){call->in[1], NULL, call->in[0], call->dp[0]};
}

/* out (contiguous, the broadcast shape) = the selection (sel_args_of) */
static em_status sel_cpu(const op_call *call, tensor *out)
{
    sel_args s = sel_args_of(call);
    int nd = out->ndim;
    const int64_t *shape = out->shape;
    sel_ctx c = {.out = out, .cond = s.cond, .a = s.a, .b = s.b};
    st(out->dtype, c.fill, s.fill);
    bcast_strides(s.cond, nd, shape, c.sc);
    if (s.a) bcast_strides(s.a, nd, shape, c.sa);
    if (s.b) bcast_strides(s.b, nd, shape, c.sb);
    parallel_for(t_numel(out), 1 << 14, sel_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status sel_cuda(const op_call *call, tensor *out)
{
    sel_args s = sel_args_of(call);
    /* out = b (or fill), then a (or fill) over it where cond */
    cu_walk w;
    bcast_walk(&w, out, s.b, NULL);
    int dev = out->device.index;
    em_status e = s.b ? cu_copy(dev, &w, out->dtype, t_ptr(out), s.b->dtype, t_ptr(s.b))
                      : cu_fill(dev, out->dtype, t_ptr(out), t_numel(out), s.fill);
    if (e) return e;
    bcast_walk(&w, out, s.cond, s.a);
    return cu_select(dev, &w, out->dtype, t_ptr(out), t_ptr(s.cond), s.a ? t_ptr(s.a) : NULL, true, s.fill);
}
#endif

static const op_kernels sel_kernels = OP_KERNELS(sel_cpu, sel_cuda);

/* out = g where mask == keep, else 0 (g's shape and dtype, contiguous) */
typedef struct mask_ctx {
    tensor *out, *g, *mask;
    int64_t sm[EM_MAX_DIMS];
    bool keep;
} mask_ctx;

static void mask_range(void *p, int64_t lo, int64_t hi)
{
    mask_ctx *c = p;
    tensor *g = c->g;
    size_t es = t_esize(g);
    char *op = t_ptr(c->out);
    const char *gp = t_ptr(g);
    const uint8_t *mp = t_ptr(c->mask);
    nditer it;
    nditer_init(&it, g->ndim, g->shape, 2, (const int64_t *[]){g->stride, c->sm});
    nditer_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++) {
        if ((mp[it.off[1]] != 0) == c->keep)
            memcpy(op + i * (int64_t)es, gp + it.off[0] * (int64_t)es, es);
        else
            memset(op + i * (int64_t)es, 0, es);
        nditer_next(&it);
    }
}

/* out (g's shape) = g = in[0] where mask = in[1] (broadcast to g) equals
 * keep = ip[0], else 0 */
static em_status mask_grad_cpu(const op_call *call, tensor *out)
{
    tensor *g = call->in[0], *mask = call->in[1];
    mask_ctx c = {.out = out, .g = g, .mask = mask, .keep = call->ip[0] != 0};
    bcast_strides(mask, g->ndim, g->shape, c.sm);
    parallel_for(t_numel(g), 1 << 14, mask_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status mask_grad_cuda(const op_call *call, tensor *out)
{
    tensor *g = call->in[0], *mask = call->in[1];
    em_status s = t_fill_zero(out);
    if (s) return s;
    cu_walk w;
    bcast_walk(&w, out, mask, NULL);
    memcpy(w.stride[2], g->stride, sizeof(int64_t) * (size_t)g->ndim);
    return cu_select(g->device.index, &w, g->dtype, t_ptr(out), t_ptr(mask), t_ptr(g), call->ip[0] != 0, 0.0);
}
#endif

static const op_kernels mask_grad_kernels = OP_KERNELS(mask_grad_cpu, mask_grad_cuda);

/* For node n: g masked to where mask (broadcast to g) equals keep,
 * summed down to t's shape */
static tensor *masked_grad(const node *n, tensor *g, tensor *mask, bool keep, tensor *t)
{
    tensor *in[2] = {g, mask};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 2, in)) return NULL;
    c.ip[0] = keep; /* the kernels' parameter (this call's copy of the node's) */
    tensor *out = op_out(&c, g->dtype, g->ndim, g->shape);
    if (!out || op_run(&c, &mask_grad_kernels, out)) return NULL;
    return t_sum_to(out, t->ndim, t->shape);
}

/* d where = g where cond (to a), g where !cond (to b); each summed to its shape */
static em_status where_backward(node *n, tensor *g)
{
    tensor *cond = n->in[0];
    for (int i = 1; i <= 2; i++) {
        tensor *x = n->in[i];
        if (!x->requires_grad) continue;
        tensor *gx = masked_grad(n, g, cond, i == 1, x);
        if (!gx) return em_last_status();
        em_status s = op_grad(x, gx);
        if (s) return s;
    }
    return EM_OK;
}

static tensor *t_where(tensor *cond, tensor *a, tensor *b)
{
    tensor *in[3] = {cond, a, b};
    OP_CALL(c);
    if (!op_begin(&c, OP_WHERE, 3, in)) return NULL; /* PROMOTE: a and b (cond is bool) */
    cond = in[0], a = in[1], b = in[2];
    if (!chk_dtype("where", cond, EM_BOOL, "cond")) return NULL;
    if (!chk_same_dtype("where", a, b)) return NULL;
    int n1, nd;
    int64_t s1[EM_MAX_DIMS], shape[EM_MAX_DIMS];
    if (bcast_shape("where", a->ndim, a->shape, b->ndim, b->shape, &n1, s1) ||
        bcast_shape("where", cond->ndim, cond->shape, n1, s1, &nd, shape))
        return em_fail(EM_ERR_SHAPE, "where: cond %s, a %s and b %s do not broadcast together", shp(cond),
                       shp(a), shp(b));
    tensor *out = op_out(&c, a->dtype, nd, shape);
    if (!out || op_run(&c, &sel_kernels, out)) return NULL;
    return op_end(&c, out, where_backward);
}

/* d masked_fill = g where !mask */
static em_status masked_fill_backward(node *n, tensor *g)
{
    tensor *a = n->in[0];
    tensor *ga = masked_grad(n, g, n->in[1], false, a);
    return ga ? op_grad(a, ga) : em_last_status();
}

static tensor *t_masked_fill(tensor *a, tensor *mask, double value)
{
    tensor *in[2] = {a, mask};
    OP_CALL(c);
    if (!op_begin(&c, OP_MASKED_FILL, 2, in)) return NULL;
    a = in[0], mask = in[1];
    if (!chk_dtype("masked_fill", mask, EM_BOOL, "mask")) return NULL;
    int nd;
    int64_t shape[EM_MAX_DIMS];
    if (bcast_shape("masked_fill", a->ndim, a->shape, mask->ndim, mask->shape, &nd, shape) || nd != a->ndim ||
        memcmp(shape, a->shape, sizeof(int64_t) * (size_t)nd))
        return em_fail(EM_ERR_SHAPE, "masked_fill: mask %s does not broadcast to a's shape %s", shp(mask),
                       shp(a));
    tensor *out = op_out(&c, a->dtype, a->ndim, a->shape);
    c.dp[0] = value;
    if (!out || op_run(&c, &sel_kernels, out)) return NULL; /* mask ? value : a */
    return op_end(&c, out, masked_fill_backward);
}

/* ---- public wrappers ------------------------------------------------------------------ */

static em_tensor *pubc(cmpop k, em_tensor *a, em_tensor *b)
{
    tensor *x = t_resolve(a, cmpop_name(k)), *y = x ? t_resolve(b, cmpop_name(k)) : NULL;
    return y ? t_handle(compare(k, x, y)) : NULL;
}

em_tensor *em_eq(em_tensor *a, em_tensor *b) { return pubc(CMP_EQ, a, b); }
em_tensor *em_ne(em_tensor *a, em_tensor *b) { return pubc(CMP_NE, a, b); }
em_tensor *em_lt(em_tensor *a, em_tensor *b) { return pubc(CMP_LT, a, b); }
em_tensor *em_le(em_tensor *a, em_tensor *b) { return pubc(CMP_LE, a, b); }
em_tensor *em_gt(em_tensor *a, em_tensor *b) { return pubc(CMP_GT, a, b); }
em_tensor *em_ge(em_tensor *a, em_tensor *b) { return pubc(CMP_GE, a, b); }

em_tensor *em_where(em_tensor *cond, em_tensor *a, em_tensor *b)
{
    tensor *c = t_resolve(cond, "where"), *x = c ? t_resolve(a, "where") : NULL;
    tensor *y = x ? t_resolve(b, "where") : NULL;
    return y ? t_handle(t_where(c, x, y)) : NULL;
}

em_tensor *em_masked_fill(em_tensor *a, em_tensor *mask, double value)
{
    tensor *x = t_resolve(a, "masked_fill"), *m = x ? t_resolve(mask, "masked_fill") : NULL;
    return m ? t_handle(t_masked_fill(x, m, value)) : NULL;
}
