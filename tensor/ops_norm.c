/* ops_norm.c — layer_norm and rms_norm over the last dim C, fused.
 *
 * Forward: one pass per row gathers the statistics (shifted sums, in
 * double), a second writes y. mean and rstd per row are saved in the node
 * (scope arena) for the backward, which computes dx, dweight and dbias in one
 * fused kernel (rows split into at most NORM_PARTS ranges set by the shape,
 * each with its own dweight/dbias partial sums in double, added up in order
 * at the end, so the bits do not depend on the thread count). f32 rows go
 * eight elements at a time. f16/bf16 are computed in f32.
 *
 * Both go through the dispatcher (tensor/dispatch.h) with the inputs that are
 * present, x first, then weight and bias when given: the call's (and the
 * node's) ip[1] and ip[2] say whether weight and bias are among them, ip[0]
 * whether it is rms_norm, dp[0] is eps. */
#include "dispatch.h"
#include "kernel_impl.h"
#include "rows_impl.h"
#ifdef __AVX__
#include <immintrin.h>
#endif
#if EM_HAVE_CUDA
#include "cuda_nn.h"
#endif

/* Element i of a contiguous f32 or f64 buffer, as double. */
static inline double at(const void *p, bool f64, int64_t i)
{
    return f64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static inline void put(void *p, bool f64, int64_t i, double v)
{
    if (f64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

typedef struct norm_ctx {
    bool rms, f64;
    int64_t rows, C;
    double eps;
    const void *x, *w, *b, *g; /* contiguous; w, b may be NULL */
    void *y, *dx;
    double *mean, *rstd;       /* per row */
    int64_t nparts;            /* backward: row ranges, each with partials */
    double *dw, *db;           /* nparts * C each, or NULL */
    const float *ones, *zeros; /* f32: (C) stand-ins for a missing weight / bias */
} norm_ctx;

enum { LANES = 8, NORM_PARTS = 16 };

/* The 8 double lanes of the row sums as two vectors of 4 (gcc/clang vector
 * extensions: AVX2 registers with -march=native, pairs of SSE2 ones
 * otherwise). Lane l sums the elements j = l mod 8, as a plain array of 8
 * would; the vectors only let the compiler do the 8 at once (it does not
 * vectorise a float-to-double widening reduction written per lane). The
 * widening itself is one instruction with AVX (gcc splits the generic
 * conversion into pairs); it is exact either way. */
/* (built without AVX, -Dnative=false, gcc warns that a function returning
 * a 32-byte vector would pass it differently from an AVX build: these are
 * static and never called across object files) */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));
typedef double v4d __attribute__((vector_size(32)));

static inline v8f load8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

/* *lo, *hi = lanes 0..3 and 4..7 of v, as doubles */
static inline void widen8(v8f v, v4d *lo, v4d *hi)
{
#ifdef __AVX__
    *lo = (v4d)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)v));
    *hi = (v4d)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)v, 1));
#else
    v4f a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, (const float *)&v + 4, sizeof b);
    *lo = __builtin_convertvector(a, v4d);
    *hi = __builtin_convertvector(b, v4d);
#endif
}

/* t += lanes 0..3 of a, then 4..7 of b, in lane order */
static inline double add_lanes(double t, v4d a, v4d b)
{
    for (int l = 0; l < 4; l++) t += a[l];
    for (int l = 0; l < 4; l++) t += b[l];
    return t;
}

/* f32 row statistics: s1 = sum (x - k), s2 = sum (x - k)^2, in double lanes */
static void stats_f32(const float *x, int64_t C, double k, double *s1, double *s2)
{
    v4d a0 = {0}, a1 = {0}, q0 = {0}, q1 = {0}, kk = {k, k, k, k};
    double t1 = 0, t2 = 0;
    int64_t j = 0;
    for (; j + LANES <= C; j += LANES) {
        v4d d0, d1;
        widen8(load8(x + j), &d0, &d1);
        d0 -= kk;
        d1 -= kk;
        a0 += d0;
        a1 += d1;
        q0 += d0 * d0;
        q1 += d1 * d1;
    }
    for (; j < C; j++) {
        double d = x[j] - k;
        t1 += d;
        t2 += d * d;
    }
    *s1 = add_lanes(t1, a0, a1);
    *s2 = add_lanes(t2, q0, q1);
}

/* (C) floats equal to v in the temp arena (NULL on OOM). */
static const float *const_row(int64_t C, float v)
{
    float *p = tmp_alloc(sizeof(float) * (size_t)(C + 1));
    if (p)
        for (int64_t j = 0; j < C; j++) p[j] = v;
    return p;
}

/* d[0..4) += a, d[4..8) += b (double vectors at an unaligned address) */
static inline void add8d(double *d, v4d a, v4d b)
{
    v4d d0, d1;
    memcpy(&d0, d, sizeof d0);
    memcpy(&d1, d + 4, sizeof d1);
    d0 += a;
    d1 += b;
    memcpy(d, &d0, sizeof d0);
    memcpy(d + 4, &d1, sizeof d1);
}

/* One f32 row of the backward (see norm_bwd); adds into dw/db when given.
 * Eight elements at a time in explicit vectors: xh and g*w in float, their
 * sums and dw/db in double lanes (lane l holds j = l mod 8, added up in
 * lane order at the end), dx in float. Each element's arithmetic is the
 * same expression as the scalar tail's, so the vector and tail elements
 * round alike. */
static void bwd_row_f32(const norm_ctx *c, int64_t r, double *dw, double *db)
{
    int64_t C = c->C;
    const float *x = (const float *)c->x + r * C, *g = (const float *)c->g + r * C;
    const float *w = c->w ? c->w : c->ones;
    float mf = (float)c->mean[r], rf = (float)c->rstd[r];
    v8f mv = {mf, mf, mf, mf, mf, mf, mf, mf}, rv = {rf, rf, rf, rf, rf, rf, rf, rf};
    v4d a0 = {0}, a1 = {0}, q0 = {0}, q1 = {0};
    double sg = 0, sgx = 0;
    int64_t j = 0;
    for (; j + LANES <= C; j += LANES) {
        v8f gv = load8(g + j), xh = (load8(x + j) - mv) * rv, gw = gv * load8(w + j);
        v4d h0, h1, g0, g1, r0, r1;
        widen8(xh, &h0, &h1);
        widen8(gw, &g0, &g1);
        widen8(gv, &r0, &r1);
        a0 += g0;
        a1 += g1;
        q0 += g0 * h0;
        q1 += g1 * h1;
        if (dw) add8d(dw + j, r0 * h0, r1 * h1);
        if (db) add8d(db + j, r0, r1);
    }
    int64_t tail = j;
    for (; j < C; j++) {
        float xh = (x[j] - mf) * rf, gw = g[j] * w[j];
        sg += gw;
        sgx += (double)gw * xh;
        if (dw) dw[j] += (double)g[j] * xh;
        if (db) db[j] += g[j];
    }
    sg = add_lanes(sg, a0, a1);
    sgx = add_lanes(sgx, q0, q1);
    if (!c->dx) return;
    float af = c->rms ? 0 : (float)(sg / (double)C), bf = (float)(sgx / (double)C);
    v8f av = {af, af, af, af, af, af, af, af}, bv = {bf, bf, bf, bf, bf, bf, bf, bf};
    float *dx = (float *)c->dx + r * C;
    for (j = 0; j < tail; j += LANES) {
        v8f xh = (load8(x + j) - mv) * rv;
        store8(dx + j, rv * (load8(g + j) * load8(w + j) - av - xh * bv));
    }
    for (; j < C; j++) {
        float xh = (x[j] - mf) * rf;
        dx[j] = rf * (g[j] * w[j] - af - xh * bf);
    }
}

/* layer_norm: y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps);
 * rms_norm:   y = x * rstd * w,              rstd = 1/sqrt(mean(x^2) + eps) */
static void norm_fwd(void *p, int64_t lo, int64_t hi)
{
    norm_ctx *c = p;
    int64_t C = c->C;
    bool f = c->f64;
    for (int64_t r = lo; r < hi; r++) {
        int64_t o = r * C;
        /* one pass: sums of (x - k) and (x - k)^2 with k = the first element,
         * which keeps the variance free of cancellation when |mean| >> std */
        double k = c->rms || C == 0 ? 0 : at(c->x, f, o), s1 = 0, s2 = 0;
        if (!f) {
            stats_f32((const float *)c->x + o, C, k, &s1, &s2);
        } else {
            for (int64_t j = 0; j < C; j++) {
                double d = at(c->x, f, o + j) - k;
                s1 += d;
                s2 += d * d;
            }
        }
        double m1 = s1 / (double)C, var = s2 / (double)C - (c->rms ? 0 : m1 * m1);
        double mean = c->rms ? 0 : k + m1, rstd = 1.0 / sqrt((var > 0 ? var : 0) + c->eps);
        c->mean[r] = mean;
        c->rstd[r] = rstd;
        if (!f) {
            const float *x = (const float *)c->x + o, *w = c->w ? c->w : c->ones, *b = c->b ? c->b : c->zeros;
            float *y = (float *)c->y + o, mf = (float)mean, rf = (float)rstd;
            for (int64_t j = 0; j < C; j++) y[j] = (x[j] - mf) * rf * w[j] + b[j];
            continue;
        }
        for (int64_t j = 0; j < C; j++) {
            double v = (at(c->x, f, o + j) - mean) * rstd;
            if (c->w) v *= at(c->w, f, j);
            if (c->b) v += at(c->b, f, j);
            put(c->y, f, o + j, v);
        }
    }
}

/* With xh = (x - mean)*rstd and gw = g*w (g without weight):
 * layer_norm: dx = rstd * (gw - mean(gw) - xh * mean(gw*xh))
 * rms_norm:   dx = rstd * (gw - xh * mean(gw*xh))
 * dw = sum over rows g*xh, db = sum over rows g. Item q is a range of rows. */
static void norm_bwd(void *p, int64_t lo, int64_t hi)
{
    norm_ctx *c = p;
    int64_t C = c->C;
    bool f = c->f64;
    for (int64_t q = lo; q < hi; q++) {
        double *dw = c->dw ? c->dw + q * C : NULL, *db = c->db ? c->db + q * C : NULL;
        for (int64_t j = 0; j < C; j++) {
            if (dw) dw[j] = 0;
            if (db) db[j] = 0;
        }
        int64_t r0 = c->rows * q / c->nparts, r1 = c->rows * (q + 1) / c->nparts;
        for (int64_t r = r0; r < r1; r++) {
            if (!f) {
                bwd_row_f32(c, r, dw, db);
                continue;
            }
            int64_t o = r * C;
            double mean = c->mean[r], rstd = c->rstd[r], sg = 0, sgx = 0;
            for (int64_t j = 0; j < C; j++) {
                double gv = at(c->g, f, o + j), xh = (at(c->x, f, o + j) - mean) * rstd;
                double gw = c->w ? gv * at(c->w, f, j) : gv;
                sg += gw;
                sgx += gw * xh;
                if (dw) dw[j] += gv * xh;
                if (db) db[j] += gv;
            }
            double a = c->rms ? 0 : sg / (double)C, bb = sgx / (double)C;
            if (!c->dx) continue;
            for (int64_t j = 0; j < C; j++) {
                double gv = at(c->g, f, o + j), xh = (at(c->x, f, o + j) - mean) * rstd;
                double gw = c->w ? gv * at(c->w, f, j) : gv;
                put(c->dx, f, o + j, rstd * (gw - a - xh * bb));
            }
        }
    }
}

/* t (C), contiguous, of any float dtype = the sum of nparts partials of C doubles */
static void sum_partials(const double *part, int64_t nparts, int64_t C, tensor *t)
{
    for (int64_t j = 0; j < C; j++) {
        double s = 0;
        for (int64_t q = 0; q < nparts; q++) s += part[q * C + j];
        st(t->dtype, (char *)t_ptr(t) + j * (int64_t)t_esize(t), s);
    }
}

/* The weight and bias among in[0..nin) (NULL when not given), as ip[1], ip[2] say. */
static void params_of(tensor *const *in, int nin, const int64_t *ip, tensor **w, tensor **b)
{
    *w = ip[1] ? in[1] : NULL;
    *b = ip[2] ? in[nin - 1] : NULL;
}

/* The backward kernels' call: in = {x, g} or {x, g, weight}; out is dx (NULL
 * when x needs no gradient); c.saved points to this: the forward's per-row
 * mean and rstd (the node's saved) and the other outputs, dw and db (NULL
 * when not wanted), of the weight's and bias's dtype and shape. */
typedef struct norm_grads {
    void *stats;
    tensor *dw, *db;
} norm_grads;

#if EM_HAVE_CUDA
/* ---- CUDA (tensor/ops_nn.cu): the node saves a device tensor of per-row
 * mean and rstd (compute dtype, (2*rows)) instead of host doubles. */

static void drop_copy(tensor *copy, const tensor *orig)
{
    if (copy != orig) t_drop(copy);
}

/* dx, dw, db on the device (see norm_grads); the statistics are a device tensor */
static em_status norm_grad_cuda(const op_call *c, tensor *dx)
{
    const norm_grads *o = c->saved;
    tensor *x = c->in[0], *g = c->in[1], *w = c->nin > 2 ? c->in[2] : NULL, *dw = o->dw, *db = o->db;
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = C ? t_numel(x) / C : 0, nch = cu_norm_chunks(rows);
    /* zeros: with no rows the kernels write nothing, and the sums are 0 */
    if ((dw && t_fill_zero(dw)) || (db && t_fill_zero(db))) return em_last_status();
    tensor *xr = nn_rows(x, last), *gr = xr ? nn_rows(g, last) : NULL, *wr = gr && w ? nn_rows(w, 0) : NULL;
    tensor *part =
        dw || db ? t_new_on(x->device, rows_dtype(x->dtype), 1, (const int64_t[]){2 * nch * C + 1}) : NULL;
    bool ok = xr && gr && (!w || wr) && (!(dw || db) || part);
    em_status s =
        ok ? cu_norm_bwd(x->device.index, x->dtype, c->ip[0] != 0, t_ptr(xr), wr ? t_ptr(wr) : NULL,
                         t_ptr(gr), t_ptr((tensor *)o->stats), dx ? t_ptr(dx) : NULL, dw ? t_ptr(dw) : NULL,
                         db ? t_ptr(db) : NULL, part ? t_ptr(part) : NULL, rows, C)
           : em_last_status();
    if (xr) drop_copy(xr, x);
    if (gr) drop_copy(gr, g);
    if (wr) drop_copy(wr, w);
    t_drop(part);
    return s;
}

/* y = the norm of c->in on the device; per-row mean and rstd to the tensor in c->saved */
static em_status norm_cuda(const op_call *c, tensor *y)
{
    tensor *x = c->in[0], *w, *b;
    params_of(c->in, c->nin, c->ip, &w, &b);
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = C ? t_numel(x) / C : 0;
    tensor *xr = nn_rows(x, last);
    tensor *wr = xr && w ? nn_rows(w, 0) : NULL, *br = xr && b ? nn_rows(b, 0) : NULL;
    em_status s =
        xr && (!w || wr) && (!b || br)
            ? cu_norm_fwd(x->device.index, x->dtype, c->ip[0] != 0, t_ptr(xr), wr ? t_ptr(wr) : NULL,
                          br ? t_ptr(br) : NULL, t_ptr(y), t_ptr((tensor *)c->saved), rows, C, c->dp[0])
            : em_last_status();
    if (xr) drop_copy(xr, x);
    if (wr) drop_copy(wr, w);
    if (br) drop_copy(br, b);
    return s;
}
#endif

/* dx, dw, db on the CPU (see norm_grads); the statistics are 2*rows doubles */
static em_status norm_grad_cpu(const op_call *call, tensor *dx)
{
    const norm_grads *o = call->saved;
    tensor *x = call->in[0], *g = call->in[1], *w = call->nin > 2 ? call->in[2] : NULL;
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = C ? t_numel(x) / C : 0;
    const double *saved = o->stats;
    norm_ctx c = {.rms = call->ip[0] != 0,
                  .f64 = rows_dtype(x->dtype) == EM_F64,
                  .rows = rows,
                  .C = C,
                  .mean = (double *)saved,
                  .rstd = (double *)saved + rows};
    /* Row ranges of at least ~16K elements, at most NORM_PARTS of them: a
     * count set by the shape alone, never by the threads, so dw and db (the
     * ranges' partial sums added in order) have the same bits at any
     * thread count. */
    int64_t per = (1 << 14) / (C + 1) + 1;
    c.nparts = rows / per < NORM_PARTS ? rows / per : NORM_PARTS;
    if (c.nparts < 1) c.nparts = 1;
    size_t m = tmp_mark(), part_bytes = sizeof(double) * (size_t)(c.nparts * C + 1);
    bool ok = (c.x = rows_in(x, last)) && (c.g = rows_in(g, last)) && (!w || (c.w = rows_in(w, 0))) &&
              (!dx || (c.dx = rows_out(dx, last))) && (!o->dw || (c.dw = tmp_alloc(part_bytes))) &&
              (!o->db || (c.db = tmp_alloc(part_bytes))) && (c.f64 || (c.ones = const_row(C, 1)));
    if (ok) {
        parallel_for(c.nparts, 1, norm_bwd, &c);
        if (dx) rows_done(dx, last, c.dx);
        if (o->dw) sum_partials(c.dw, c.nparts, C, o->dw);
        if (o->db) sum_partials(c.db, c.nparts, C, o->db);
    }
    tmp_release(m);
    return ok ? EM_OK : em_last_status();
}

static const op_kernels norm_grad_kernels = OP_KERNELS(norm_grad_cpu, norm_grad_cuda);

static em_status norm_backward(node *n, tensor *g)
{
    tensor *x = n->in[0], *w, *b;
    params_of(n->in, n->nin, n->ip, &w, &b);
    tensor *in[3] = {x, g, w};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, w ? 3 : 2, in)) return em_last_status();
    norm_grads o = {.stats = n->saved};
    tensor *dx = NULL;
    if ((x->requires_grad && !(dx = op_out(&c, x->dtype, x->ndim, x->shape))) ||
        (w && w->requires_grad && !(o.dw = op_out(&c, w->dtype, w->ndim, w->shape))) ||
        (b && b->requires_grad && !(o.db = op_out(&c, b->dtype, b->ndim, b->shape))))
        return em_last_status();
    c.saved = &o;
    em_status s = op_run(&c, &norm_grad_kernels, dx);
    if (!s && dx) s = op_grad(x, dx);
    if (!s && o.dw) s = op_grad(w, o.dw);
    if (!s && o.db) s = op_grad(b, o.db);
    return s;
}

/* weight / bias must be (C) of x's dtype */
static bool chk_param(const char *op, const char *what, const tensor *p, const tensor *x)
{
    if (!p) return true;
    int64_t C = x->shape[x->ndim - 1];
    if (p->ndim != 1 || p->shape[0] != C) {
        em_fail(EM_ERR_SHAPE, "%s: %s is %s, expected (%lld,) to match the last dim of x %s", op, what,
                shp(p), (long long)C, shp(x));
        return false;
    }
    if (p->dtype != x->dtype) {
        em_fail(EM_ERR_DTYPE, "%s: %s is %s%s but x is %s%s", op, what, em_dtype_name(p->dtype), shp(p),
                em_dtype_name(x->dtype), shp(x));
        return false;
    }
    return true;
}

/* y = the norm of c->in on the CPU; per-row mean and rstd (2*rows doubles)
 * to c->saved when recording (scope memory), else to temp memory */
static em_status norm_cpu(const op_call *call, tensor *y)
{
    tensor *x = call->in[0], *w, *b;
    params_of(call->in, call->nin, call->ip, &w, &b);
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = C ? t_numel(x) / C : 0;
    size_t m = tmp_mark();
    double *stats = call->saved ? call->saved : tmp_alloc(sizeof(double) * (size_t)(2 * rows + 1));
    norm_ctx c = {.rms = call->ip[0] != 0,
                  .f64 = rows_dtype(x->dtype) == EM_F64,
                  .rows = rows,
                  .C = C,
                  .eps = call->dp[0],
                  .mean = stats,
                  .rstd = stats + rows};
    bool ok = stats && (c.x = rows_in(x, last)) && (!w || (c.w = rows_in(w, 0))) &&
              (!b || (c.b = rows_in(b, 0))) && (c.y = rows_out(y, last)) &&
              (c.f64 || ((c.ones = const_row(C, 1)) && (c.zeros = const_row(C, 0))));
    if (ok) {
        parallel_for(rows, (1 << 14) / (C + 1) + 1, norm_fwd, &c);
        rows_done(y, last, c.y);
    }
    tmp_release(m);
    return ok ? EM_OK : em_last_status();
}

static const op_kernels norm_kernels = OP_KERNELS(norm_cpu, norm_cuda);

static tensor *norm_impl(op_id opid, tensor *x, tensor *w, tensor *b, double eps)
{
    const char *op = op_name(opid);
    bool rms = opid == OP_RMS_NORM;
    tensor *in[3] = {x};
    int nin = 1;
    if (w) in[nin++] = w;
    if (b) in[nin++] = b;
    OP_CALL(c);
    if (!op_begin(&c, opid, nin, in)) return NULL;
    x = in[0];
    c.ip[0] = rms;
    c.ip[1] = w != NULL;
    c.ip[2] = b != NULL;
    params_of(in, nin, c.ip, &w, &b);
    if (x->ndim < 1) return em_fail(EM_ERR_SHAPE, "%s: x must have at least 1 dim, got %s", op, shp(x));
    if (!chk_param(op, "weight", w, x) || !chk_param(op, "bias", b, x)) return NULL;
    if (!(eps >= 0) || isinf(eps))
        return em_fail(EM_ERR_ARG, "%s: eps must be finite and >= 0, got %g", op, eps);
    c.dp[0] = eps;
    int64_t C = x->shape[x->ndim - 1];
    int64_t rows = C ? t_numel(x) / C : 0;
    if (c.record && em_scope_depth() == 0)
        return em_fail(EM_ERR_SCOPE, "%s: recording a gradient needs an open step scope (em_scope_begin)",
                       op);
    tensor *y = op_out(&c, x->dtype, x->ndim, x->shape);
    if (!y) return NULL;
    /* the per-row mean and rstd backward reads: on CUDA a device tensor of
     * the compute dtype the kernel always writes, kept only when recording;
     * on the CPU scope memory when recording (else the kernel's temp memory) */
    if (c.dev.type == EM_CUDA)
        c.saved = t_new_on(c.dev, rows_dtype(x->dtype), 1, (const int64_t[]){2 * rows});
    else if (c.record)
        c.saved = scope_alloc(sizeof(double) * (size_t)(2 * rows + 1));
    if ((c.dev.type == EM_CUDA || c.record) && !c.saved) {
        t_drop(y);
        return NULL;
    }
    if (op_run(&c, &norm_kernels, y)) {
        if (c.dev.type == EM_CUDA) t_drop(c.saved);
        t_drop(y);
        return NULL;
    }
    if (c.dev.type == EM_CUDA && !c.record) {
        t_drop(c.saved);
        c.saved = NULL;
    }
    tensor *r = op_end(&c, y, norm_backward);
    if (!r && c.dev.type == EM_CUDA) t_drop(c.saved); /* the stats, when recording failed */
    return r;
}

em_tensor *em_layer_norm(em_tensor *x, em_tensor *weight, em_tensor *bias, double eps)
{
    tensor *xt = t_resolve(x, "layer_norm");
    if (!xt) return NULL;
    tensor *w = weight ? t_resolve(weight, "layer_norm") : NULL;
    if (weight && !w) return NULL;
    tensor *b = bias ? t_resolve(bias, "layer_norm") : NULL;
    if (bias && !b) return NULL;
    return t_handle(norm_impl(OP_LAYER_NORM, xt, w, b, eps));
}

em_tensor *em_rms_norm(em_tensor *x, em_tensor *weight, double eps)
{
    tensor *xt = t_resolve(x, "rms_norm");
    if (!xt) return NULL;
    tensor *w = weight ? t_resolve(weight, "rms_norm") : NULL;
    if (weight && !w) return NULL;
    return t_handle(norm_impl(OP_RMS_NORM, xt, w, NULL, eps));
}
