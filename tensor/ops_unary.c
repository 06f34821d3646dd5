/* ops_unary.c — elementwise maths on one tensor: pow_scalar, exp, log, sqrt,
 * rsqrt, abs, tanh, sigmoid, relu, gelu (exact and tanh form), silu (the
 * UNARY ops of tensor/ops.def).
 *
 * One driver serves every op: a kernel with a contiguous-f32 fast path and a
 * general strided path (ld/st; f16/bf16 computed in f32, f64 in f64), and one
 * backward kernel gx = g * f'(x, y) that reads the saved input x and output y
 * (whichever the derivative is cheaper from), or, for gelu and gelu_tanh
 * on the CPU, the slope f'(x) their recorded forward kept (as costly as
 * the forward itself to compute again). The per-element maths is not
 * here: it is tensor/elementwise_formulas.h, shared with the CUDA kernels
 * (tensor/ops_elementwise.cu); the CPU computes floats in its _f32v flavour
 * (vectorisable exp, tanh and normal distribution, see tensor/elementwise_math.h). */
#include "dispatch.h"
#include "elementwise_math.h"
#include "kernel_impl.h"
#if EM_HAVE_CUDA
#include "cuda_elementwise.h"
#endif

#pragma GCC diagnostic error "-Wswitch-enum" /* a switch over unop names every op */

/* ---- kernels ----------------------------------------------------------------------- */

typedef struct un_ctx {
    unop k;
    double p;
    tensor *out, *x; /* forward: out = f(x) */
    tensor *g, *y;   /* backward: out = g * f'(x, y); y is contiguous */
    /* gelu, gelu_tanh: their slope f'(x), f32, contiguous (x's elements in
     * order), or NULL. A recording forward writes it beside out; backward
     * then reads it instead of computing it again: out = g * slope. */
    float *slope;
} un_ctx;

/* Contiguous f32: one loop per op (generated from the op list), so each
 * inner loop is the op's formula alone and vectorises. */
static void fwd_flat_f32(unop k, const float *x, float *o, int64_t lo, int64_t hi, float p)
{
    switch (k) {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_UNARY(id, name, amp, be)                                                                         \
    case UN_##id:                                                                                            \
        for (int64_t i = lo; i < hi; i++) o[i] = ew_unary_f32v(UN_##id, x[i], p);                            \
        break;
#include "ops.def"
    }
}

/* o[0,n) = gelu or gelu_tanh of x[0,n), and slope[0,n) its f'(x), in
 * one loop from one Phi or exponential (ew_gelu_both: the formulas of the
 * forward and of the backward's slope) */
static void slope_flat_f32(unop k, const float *x, float *o, float *slope, int64_t n)
{
    if (k == UN_GELU)
        for (int64_t i = 0; i < n; i++) o[i] = ew_gelu_both_f32v(UN_GELU, x[i], &slope[i]);
    else
        for (int64_t i = 0; i < n; i++) o[i] = ew_gelu_both_f32v(UN_GELU_TANH, x[i], &slope[i]);
}

/* The elements a strided or f16/bf16 range is computed in: gathered into
 * floats, run through the contiguous loop, stored back. One loop computes
 * every f32/f16/bf16 element, so a strided input gives the contiguous bits. */
#define UN_BLOCK 256

/* xb[0,n) = the n elements of t from element i in order, as floats: one
 * bulk conversion where t is contiguous (vectorised: a bf16 or f16 tensor
 * read element by element through ld ran 7-56x slower than f32), else
 * through it, an iterator over t alone at element i, which this advances
 * (unused, and may be NULL, where t is contiguous). The values are the same
 * either way: (float)ld's. */
static void gather_f32(const tensor *t, bool contig, nditer *it, int64_t i, int64_t n, float *xb)
{
    size_t es = t_esize(t);
    const char *p = t_ptr(t);
    if (contig) {
        convert_n(EM_F32, xb, t->dtype, p + i * (int64_t)es, n);
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        xb[j] = (float)ld(t->dtype, p + it->off[0] * (int64_t)es);
        nditer_next(it);
    }
}

static void fwd_range(void *ctx, int64_t lo, int64_t hi)
{
    un_ctx *c = ctx;
    tensor *x = c->x;
    em_dtype dt = x->dtype;
    if (dt == EM_F32 && t_is_contig(x)) {
        if (c->slope)
            slope_flat_f32(c->k, (const float *)t_ptr(x) + lo, (float *)t_ptr(c->out) + lo, c->slope + lo,
                           hi - lo);
        else
            fwd_flat_f32(c->k, t_ptr(x), t_ptr(c->out), lo, hi, (float)c->p);
        return;
    }
    size_t es = t_esize(x);
    char *o = t_ptr(c->out);
    const char *xp = t_ptr(x);
    nditer it;
    nditer_init(&it, x->ndim, x->shape, 1, (const int64_t *[]){x->stride});
    nditer_seek(&it, lo);
    if (dt == EM_F64 || !em_dtype_is_float(dt)) { /* f64 and integers (abs) in double */
        for (int64_t i = lo; i < hi; i++) {
            st(dt, o + i * (int64_t)es, ew_unary_f64(c->k, ld(dt, xp + it.off[0] * (int64_t)es), c->p));
            nditer_next(&it);
        }
        return;
    }
    /* f32 (strided), f16, bf16: out is contiguous, and its rounding from
     * floats in bulk is st's */
    bool contig = t_is_contig(x);
    float xb[UN_BLOCK], ob[UN_BLOCK];
    for (int64_t b0 = lo; b0 < hi; b0 += UN_BLOCK) {
        int64_t n = hi - b0 < UN_BLOCK ? hi - b0 : UN_BLOCK;
        gather_f32(x, contig, &it, b0, n, xb);
        if (c->slope)
            slope_flat_f32(c->k, xb, ob, c->slope + b0, n);
        else
            fwd_flat_f32(c->k, xb, ob, 0, n, (float)c->p);
        convert_n(dt, o + b0 * (int64_t)es, EM_F32, ob, n);
    }
}

/* Contiguous f32 backward, o = g * f'(x, y): one loop per op, as forward
 * (gelu and gelu_tanh, the GPT's, are the hot ones). */
static void bwd_flat_f32(unop k, const float *x, const float *y, const float *g, float *o, int64_t lo,
                         int64_t hi, float p)
{
    switch (k) {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_UNARY(id, name, amp, be)                                                                         \
    case UN_##id:                                                                                            \
        for (int64_t i = lo; i < hi; i++) o[i] = ew_unary_grad_f32v(UN_##id, x[i], y[i], g[i], p);           \
        break;
#include "ops.def"
    }
}

/* out (contiguous, x's dtype) = g * f'(x, y) */
static void bwd_range(void *ctx, int64_t lo, int64_t hi)
{
    un_ctx *c = ctx;
    tensor *x = c->x, *g = c->g, *y = c->y;
    em_dtype dt = x->dtype;
    if (c->slope && dt == EM_F32 && g->dtype == EM_F32 && t_is_contig(g)) { /* the forward's f'(x) */
        const float *gv = t_ptr(g), *sl = c->slope;
        float *o = t_ptr(c->out);
        for (int64_t i = lo; i < hi; i++) o[i] = gv[i] * sl[i];
        return;
    }
    if (dt == EM_F32 && g->dtype == EM_F32 && t_is_contig(x) && t_is_contig(g)) {
        const float *xv = t_ptr(x), *gv = t_ptr(g), *yv = t_ptr(y);
        float *o = t_ptr(c->out), p = (float)c->p;
        bwd_flat_f32(c->k, xv, yv, gv, o, lo, hi, p);
        return;
    }
    size_t es = t_esize(x);
    char *o = t_ptr(c->out);
    if (dt == EM_F64) {
        size_t gs = t_esize(g);
        const char *xp = t_ptr(x), *gp = t_ptr(g), *yp = t_ptr(y);
        nditer it;
        nditer_init(&it, x->ndim, x->shape, 2, (const int64_t *[]){x->stride, g->stride});
        nditer_seek(&it, lo);
        for (int64_t i = lo; i < hi; i++) {
            double gx = ew_unary_grad_f64(c->k, ld(dt, xp + it.off[0] * (int64_t)es),
                                          ld(dt, yp + i * (int64_t)es), ld(g->dtype, gp + it.off[1] * (int64_t)gs),
                                          c->p);
            st(dt, o + i * (int64_t)es, gx);
            nditer_next(&it);
        }
        return;
    }
    /* f32 (strided), f16, bf16, each input gathered into floats on its own
     * (x and y only where there is no slope to read) */
    bool xc = t_is_contig(x), gc = t_is_contig(g);
    nditer ix, ig;
    nditer_init(&ix, x->ndim, x->shape, 1, (const int64_t *[]){x->stride});
    nditer_init(&ig, g->ndim, g->shape, 1, (const int64_t *[]){g->stride});
    nditer_seek(&ix, lo);
    nditer_seek(&ig, lo);
    float xb[UN_BLOCK], yb[UN_BLOCK], gb[UN_BLOCK], ob[UN_BLOCK];
    for (int64_t b0 = lo; b0 < hi; b0 += UN_BLOCK) {
        int64_t n = hi - b0 < UN_BLOCK ? hi - b0 : UN_BLOCK;
        gather_f32(g, gc, &ig, b0, n, gb);
        if (c->slope) {
            for (int64_t j = 0; j < n; j++) ob[j] = gb[j] * c->slope[b0 + j];
        } else {
            gather_f32(x, xc, &ix, b0, n, xb);
            gather_f32(y, true, NULL, b0, n, yb);
            bwd_flat_f32(c->k, xb, yb, gb, ob, 0, n, (float)c->p);
        }
        convert_n(dt, o + b0 * (int64_t)es, EM_F32, ob, n);
    }
}

/* gx = g * f'(x, y): in = {x, y, g}, the unop in ip[0], its parameter in
 * dp[0]; saved: the forward's slope tensor (gelu, gelu_tanh), or NULL */
static em_status unary_grad_cpu(const op_call *c, tensor *gx)
{
    un_ctx u = {.k = (unop)c->ip[0],
                .p = c->dp[0],
                .out = gx,
                .x = c->in[0],
                .y = c->in[1],
                .g = c->in[2],
                .slope = c->saved ? t_ptr((tensor *)c->saved) : NULL};
    parallel_for(t_numel(gx), 1 << 13, bwd_range, &u);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status unary_grad_cuda(const op_call *c, tensor *gx)
{
    tensor *x = c->in[0], *y = c->in[1], *g = c->in[2];
    cu_walk w;
    cu_walk_of(&w, gx, 3, (const tensor *[]){gx, x, g});
    return cu_unary_backward(x->device.index, (unop)c->ip[0], &w, x->dtype, t_ptr(gx), t_ptr(x), t_ptr(y),
                             g->dtype, t_ptr(g), c->dp[0]);
}
#endif

static const op_kernels unary_grad_kernels = OP_KERNELS(unary_grad_cpu, unary_grad_cuda);

static em_status unary_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    tensor *in[3] = {x, n->out, g};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 3, in)) return em_last_status();
    tensor *gx = op_out(&c, x->dtype, x->ndim, x->shape);
    if (!gx) return em_last_status();
    em_status s = op_run(&c, &unary_grad_kernels, gx);
    return s ? s : op_grad(x, gx);
}

/* out (contiguous, x's shape) = f(x); the unop in ip[0], its parameter in
 * dp[0]; saved: NULL, or an f32 tensor of x's shape for f'(x) (gelu,
 * gelu_tanh: unary) */
static em_status unary_cpu(const op_call *c, tensor *out)
{
    un_ctx u = {.k = (unop)c->ip[0],
                .p = c->dp[0],
                .out = out,
                .x = c->in[0],
                .slope = c->saved ? t_ptr((tensor *)c->saved) : NULL};
    parallel_for(t_numel(out), 1 << 13, fwd_range, &u);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status unary_cuda(const op_call *c, tensor *out)
{
    tensor *x = c->in[0];
    cu_walk w;
    cu_walk_of(&w, out, 2, (const tensor *[]){out, x});
    return cu_unary(x->device.index, (unop)c->ip[0], &w, x->dtype, t_ptr(out), t_ptr(x), c->dp[0]);
}
#endif

static const op_kernels unary_kernels = OP_KERNELS(unary_cpu, unary_cuda);

static tensor *unary(unop k, tensor *x, double p)
{
    OP_CALL(c);
    if (!op_begin(&c, unop_ops[k], 1, &x)) return NULL;
    if (k == UN_ABS) {
        if (x->dtype == EM_BOOL)
            return em_fail(EM_ERR_DTYPE, "abs: does not take bool tensors, got bool%s", shp(x));
    } else if (!chk_float(unop_name(k), x)) {
        return NULL;
    }
    tensor *out = op_out(&c, x->dtype, x->ndim, x->shape);
    c.ip[0] = k;
    c.dp[0] = p;
    /* gelu's slope costs as much as gelu itself: a CPU forward that will be
     * recorded keeps it (f32, 4 bytes an element), computed beside the
     * output from the same Phi or exponential, and backward multiplies by
     * it instead of computing it again (the same bits) */
    if (out && c.record && em_scope_depth() > 0 && ew_slope_kept(k) && c.dev.type == EM_CPU &&
        x->dtype != EM_F64 && !(c.saved = t_new(EM_F32, x->ndim, x->shape))) {
        t_drop(out);
        return NULL;
    }
    if (!out || op_run(&c, &unary_kernels, out)) return NULL;
    return op_end(&c, out, unary_backward);
}

/* ---- public wrappers ------------------------------------------------------------------ */

static em_tensor *pub1(unop k, em_tensor *h, double p)
{
    tensor *x = t_resolve(h, unop_name(k));
    return x ? t_handle(unary(k, x, p)) : NULL;
}

/* em_exp, em_log, ...: one per DEF_UNARY line of the op list. The
 * declarations are the public header's (include/ember/tensor.h), with each
 * op's documentation; a line added to ops.def without one is a compile
 * error here. */
#pragma GCC diagnostic error "-Wmissing-prototypes"
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_UNARY_P(id, fn, amp, be)
#define DEF_UNARY(id, fn, amp, be)                                                                           \
    em_tensor *em_##fn(em_tensor *a) { return pub1(UN_##id, a, 0); }
#include "ops.def"

em_tensor *em_pow_scalar(em_tensor *a, double p) { return pub1(UN_POW_SCALAR, a, p); }
