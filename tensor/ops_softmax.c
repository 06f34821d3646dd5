/* ops_softmax.c — softmax and log_softmax along any dim, stable (the row max
 * is subtracted before exp), with fused backward.
 *
 * The kernels work on contiguous rows (the dim last) of f32 or f64. The
 * "rows" helpers below give them that: a tensor that already is so is used
 * in place; otherwise it is gathered into the temp arena (dim moved last,
 * f16/bf16 widened to f32) and results are scattered back. ops_norm.c and
 * ops_loss.c use the same helpers, and ops_loss.c the f32 row primitives
 * (max, exp-and-sum with a vectorisable exp). Rows are split across threads. */
#include "dispatch.h"
#include "kernel_impl.h"
#include "rows_impl.h"
#include "vmath_impl.h"
#if EM_HAVE_CUDA
#include "cuda_nn.h"
#endif

/* ---- rows: a tensor seen as contiguous rows along one dim ------------------------- */

/* The dtype a kernel computes in: f64 for f64, else f32. */
em_dtype rows_dtype(em_dtype dt) { return dt == EM_F64 ? EM_F64 : EM_F32; }

/* A header (on the stack) over t's storage with dim d swapped with the last. */
static tensor swap_last(const tensor *t, int d)
{
    tensor h = *t;
    int l = t->ndim - 1;
    if (t->ndim > 0 && d != l) {
        h.shape[d] = t->shape[l];
        h.shape[l] = t->shape[d];
        h.stride[d] = t->stride[l];
        h.stride[l] = t->stride[d];
    }
    return h;
}

/* A header for the contiguous buffer p of dtype dt with like's shape. */
static tensor buf_header(const tensor *like, em_dtype dt, void *p, storage *s)
{
    tensor h = *like;
    h.dtype = dt;
    h.offset = 0;
    t_contig_strides(h.ndim, h.shape, h.stride);
    *s = (storage){
        .data = p, .nbytes = (size_t)t_numel(like) * em_dtype_size(dt), .refcount = 1, .in_arena = true};
    h.st = s;
    return h;
}

static bool is_rows(const tensor *t, int d)
{
    return t->dtype == rows_dtype(t->dtype) && t_is_contig(t) && (t->ndim == 0 || d == t->ndim - 1);
}

static void *rows_buf(const tensor *t)
{
    return tmp_alloc((size_t)t_numel(t) * em_dtype_size(rows_dtype(t->dtype)) + 64);
}

/* t's values with dim d last, contiguous, in rows_dtype: t's own data when it
 * already is that, else a copy in the temp arena (caller releases). NULL on OOM. */
const void *rows_in(tensor *t, int d)
{
    if (is_rows(t, d)) return t_ptr(t);
    void *p = rows_buf(t);
    if (!p) return NULL;
    storage s;
    tensor h = swap_last(t, d), b = buf_header(&h, rows_dtype(t->dtype), p, &s);
    copy_strided(&b, &h);
    return p;
}

/* Where a kernel writes out's values in rows layout: out's own data when it
 * fits, else the temp arena (then rows_done copies them over). */
void *rows_out(tensor *out, int d) { return is_rows(out, d) ? t_ptr(out) : rows_buf(out); }

void rows_done(tensor *out, int d, void *p)
{
    if (p == t_ptr(out)) return;
    storage s;
    tensor h = swap_last(out, d), b = buf_header(&h, rows_dtype(out->dtype), p, &s);
    copy_strided(&h, &b);
}

#if EM_HAVE_CUDA
/* ---- rows of a CUDA tensor (cuda_nn.h): the kernels there take any float dtype,
 * so only the layout changes; the copies are device copies. */

tensor *nn_rows(tensor *t, int d)
{
    if (t_is_contig(t) && (t->ndim == 0 || d == t->ndim - 1)) return t;
    tensor h = swap_last(t, d);
    tensor *r = t_new_on(t->device, t->dtype, h.ndim, h.shape);
    if (r) copy_strided(r, &h);
    return r;
}

tensor *nn_rows_out(tensor *out, int d)
{
    if (t_is_contig(out) && (out->ndim == 0 || d == out->ndim - 1)) return out;
    tensor h = swap_last(out, d);
    return t_new_on(out->device, out->dtype, h.ndim, h.shape);
}

void nn_rows_done(tensor *out, int d, tensor *r)
{
    if (!r || r == out) return;
    tensor h = swap_last(out, d);
    copy_strided(&h, r);
    t_drop(r);
}
#endif

/* ---- f32 row primitives (also used by ops_loss.c) ------------------------------------ */

enum { LANES = 8 };

/* max of n floats (-inf for n == 0), in lanes. NaNs may be skipped: callers
 * go on to exp(x - max), which turns any NaN into a NaN result anyway. */
float rows_max_f32(const float *x, int64_t n)
{
    float mx[LANES];
    for (int k = 0; k < LANES; k++) mx[k] = -INFINITY;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) {
            float v = x[i + k];
            mx[k] = v > mx[k] ? v : mx[k];
        }
    for (; i < n; i++) mx[0] = x[i] > mx[0] ? x[i] : mx[0];
    float m = mx[0];
    for (int k = 1; k < LANES; k++) m = mx[k] > m ? mx[k] : m;
    return m;
}

/* y_j = exp(x_j - shift) for n floats; returns sum_j y_j (double lanes).
 * y may not be NULL: callers without an output pass scratch, in pieces. */
double rows_expsum_f32(const float *x, float shift, float *y, int64_t n)
{
    for (int64_t j = 0; j < n; j++) y[j] = vexpf(x[j] - shift);
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += y[i + k];
    double s = 0;
    for (; i < n; i++) s += y[i];
    for (int k = 0; k < LANES; k++) s += acc[k];
    return s;
}

/* ---- kernels ---------------------------------------------------------------------- */

typedef struct sm_ctx {
    const void *x, *y, *g; /* contiguous (rows, n), all f32 or all f64 */
    void *out;             /* y in the forward, dx in the backward */
    int64_t n;
    bool log;
} sm_ctx;

/* softmax: y = exp(x - max) / sum exp(x - max);  log: y = x - max - log(sum) */
static void sm_fwd_f32(void *p, int64_t lo, int64_t hi)
{
    sm_ctx *c = p;
    int64_t n = c->n;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = (const float *)c->x + r * n;
        float *y = (float *)c->out + r * n;
        float m = rows_max_f32(x, n);
        double s = rows_expsum_f32(x, m, y, n); /* log: y is scratch here */
        if (c->log) {
            float ls = (float)log(s);
            for (int64_t j = 0; j < n; j++) y[j] = x[j] - m - ls;
        } else {
            float inv = (float)(1.0 / s);
            for (int64_t j = 0; j < n; j++) y[j] *= inv;
        }
    }
}

static void sm_fwd_f64(void *p, int64_t lo, int64_t hi)
{
    sm_ctx *c = p;
    int64_t n = c->n;
    for (int64_t r = lo; r < hi; r++) {
        const double *x = (const double *)c->x + r * n;
        double *y = (double *)c->out + r * n;
        double m = -INFINITY;
        for (int64_t j = 0; j < n; j++) m = x[j] > m || x[j] != x[j] ? x[j] : m;
        double s = 0;
        for (int64_t j = 0; j < n; j++) {
            double e = exp(x[j] - m);
            if (!c->log) y[j] = e;
            s += e;
        }
        if (c->log) {
            double ls = log(s);
            for (int64_t j = 0; j < n; j++) y[j] = x[j] - m - ls;
        } else {
            double inv = 1.0 / s;
            for (int64_t j = 0; j < n; j++) y[j] *= inv;
        }
    }
}

/* softmax: dx = y * (g - sum(g*y));  log_softmax: dx = g - exp(y) * sum(g).
 */
static void sm_bwd_f32(void *p, int64_t lo, int64_t hi)
{
    sm_ctx *c = p;
    int64_t n = c->n;
    for (int64_t r = lo; r < hi; r++) {
        const float *y = (const float *)c->y + r * n, *g = (const float *)c->g + r * n;
        float *dx = (float *)c->out + r * n;
        double s = 0;
        if (c->log) {
            for (int64_t j = 0; j < n; j++) s += g[j];
            float sf = (float)s;
            for (int64_t j = 0; j < n; j++) dx[j] = g[j] - vexpf(y[j]) * sf;
        } else {
            for (int64_t j = 0; j < n; j++) s += (double)g[j] * y[j];
            float sf = (float)s;
            for (int64_t j = 0; j < n; j++) dx[j] = y[j] * (g[j] - sf);
        }
    }
}

static void sm_bwd_f64(void *p, int64_t lo, int64_t hi)
{
    sm_ctx *c = p;
    int64_t n = c->n;
    for (int64_t r = lo; r < hi; r++) {
        const double *y = (const double *)c->y + r * n, *g = (const double *)c->g + r * n;
        double *dx = (double *)c->out + r * n;
        double s = 0;
        if (c->log) {
            for (int64_t j = 0; j < n; j++) s += g[j];
            for (int64_t j = 0; j < n; j++) dx[j] = g[j] - exp(y[j]) * s;
        } else {
            for (int64_t j = 0; j < n; j++) s += g[j] * y[j];
            for (int64_t j = 0; j < n; j++) dx[j] = y[j] * (g[j] - s);
        }
    }
}

/* dx = the gradient of softmax (log_softmax: ip[1]) along dim ip[0] from
 * y = in[0] (the forward's output) and g = in[1] */
static em_status softmax_grad_cpu(const op_call *call, tensor *dx)
{
    tensor *y = call->in[0], *g = call->in[1];
    int d = (int)call->ip[0];
    int64_t len = y->ndim ? y->shape[d] : 1, rows = len ? t_numel(y) / len : 0;
    size_t m = tmp_mark();
    sm_ctx c = {
        .y = rows_in(y, d), .g = rows_in(g, d), .out = rows_out(dx, d), .n = len, .log = call->ip[1] != 0};
    if (!c.y || !c.g || !c.out) {
        tmp_release(m);
        return em_last_status();
    }
    parallel_for(rows, (1 << 14) / (len + 1) + 1, rows_dtype(dx->dtype) == EM_F32 ? sm_bwd_f32 : sm_bwd_f64,
                 &c);
    rows_done(dx, d, c.out);
    tmp_release(m);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status softmax_grad_cuda(const op_call *call, tensor *dx)
{
    tensor *y = call->in[0], *g = call->in[1];
    int d = (int)call->ip[0];
    int64_t len = y->ndim ? y->shape[d] : 1, rows = len ? t_numel(y) / len : 0;
    tensor *yr = nn_rows(y, d), *gr = yr ? nn_rows(g, d) : NULL, *dr = gr ? nn_rows_out(dx, d) : NULL;
    em_status s = dr ? cu_softmax_bwd(dx->device.index, dx->dtype, t_ptr(yr), t_ptr(gr), t_ptr(dr), rows, len,
                                      call->ip[1] != 0)
                     : em_last_status();
    if (dr) nn_rows_done(dx, d, dr);
    if (yr && yr != y) t_drop(yr);
    if (gr && gr != g) t_drop(gr);
    return s;
}
#endif

static const op_kernels softmax_grad_kernels = OP_KERNELS(softmax_grad_cpu, softmax_grad_cuda);

static em_status softmax_backward(node *n, tensor *g)
{
    tensor *x = n->in[0], *in[2] = {n->out, g};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 2, in)) return em_last_status();
    tensor *dx = op_out(&c, x->dtype, x->ndim, x->shape);
    if (!dx) return em_last_status();
    em_status s = op_run(&c, &softmax_grad_kernels, dx);
    return s ? s : op_grad(x, dx);
}

/* y = softmax or log_softmax of c->in[0] along dim ip[0] (log: ip[1]) */
static em_status softmax_cpu(const op_call *call, tensor *y)
{
    tensor *x = call->in[0];
    int d = (int)call->ip[0];
    int64_t len = x->ndim ? x->shape[d] : 1, rows = len ? t_numel(x) / len : 0;
    size_t m = tmp_mark();
    sm_ctx c = {.x = rows_in(x, d), .out = rows_out(y, d), .n = len, .log = call->ip[1] != 0};
    if (!c.x || !c.out) {
        tmp_release(m);
        return em_last_status();
    }
    parallel_for(rows, (1 << 14) / (len + 1) + 1, rows_dtype(x->dtype) == EM_F32 ? sm_fwd_f32 : sm_fwd_f64,
                 &c);
    rows_done(y, d, c.out);
    tmp_release(m);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status softmax_cuda(const op_call *call, tensor *y)
{
    tensor *x = call->in[0];
    int d = (int)call->ip[0];
    int64_t len = x->ndim ? x->shape[d] : 1, rows = len ? t_numel(x) / len : 0;
    tensor *xr = nn_rows(x, d), *yr = xr ? nn_rows_out(y, d) : NULL;
    em_status s =
        yr ? cu_softmax_fwd(x->device.index, x->dtype, t_ptr(xr), t_ptr(yr), rows, len, call->ip[1] != 0)
           : em_last_status();
    if (yr) nn_rows_done(y, d, yr);
    if (xr && xr != x) t_drop(xr);
    return s;
}
#endif

static const op_kernels softmax_kernels = OP_KERNELS(softmax_cpu, softmax_cuda);

static tensor *softmax_impl(op_id opid, tensor *x, int dim, bool log)
{
    const char *op = op_name(opid);
    OP_CALL(c);
    if (!op_begin(&c, opid, 1, &x)) return NULL;
    /* a 0-dim tensor counts as one row of one element */
    int d = t_dim(op, dim, x->ndim ? x->ndim : 1, 0);
    if (d < 0) return NULL;
    tensor *y = op_out(&c, x->dtype, x->ndim, x->shape);
    if (!y) return NULL;
    c.ip[0] = d;
    c.ip[1] = log;
    if (op_run(&c, &softmax_kernels, y)) {
        t_drop(y);
        return NULL;
    }
    return op_end(&c, y, softmax_backward);
}

em_tensor *em_softmax(em_tensor *t, int dim)
{
    tensor *x = t_resolve(t, "softmax");
    return x ? t_handle(softmax_impl(OP_SOFTMAX, x, dim, false)) : NULL;
}

em_tensor *em_log_softmax(em_tensor *t, int dim)
{
    tensor *x = t_resolve(t, "log_softmax");
    return x ? t_handle(softmax_impl(OP_LOG_SOFTMAX, x, dim, true)) : NULL;
}
