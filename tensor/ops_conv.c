/* ops_conv.c — 2-D convolution and pooling on (N,C,H,W) tensors.
 *
 * conv2d lowers each image to columns (im2col: one row per (c,kh,kw), one
 * column per output pixel) and multiplies by the (O, C*KH*KW) weight with
 * BLAS gemm; its backward uses gemm for dW and dcols and scatters dcols back
 * onto the image (col2im). max_pool2d and avg_pool2d are direct loops over
 * each (n,c) plane. All compute in f32 (f64 for f64 inputs); f16/bf16 inputs
 * are converted to f32 scratch and results converted back. Output size along
 * each axis is floor((H + 2p - k) / s) + 1.
 *
 * CUDA tensors take the same plan on the device (tensor/ops_conv.cu,
 * cuda_conv.h): im2col of the whole batch, cuBLAS products through
 * cu_matmul, col2im; pooling as direct kernels. The bias gradient there is
 * the device sum over (N, OH, OW).
 *
 * The ops go through the dispatcher (tensor/dispatch.h): conv2d's inputs are
 * (x, w) or (x, w, bias), ip[0] its stride, ip[1] its padding; a pool's input
 * is x, ip[0..3] kernel, stride, padding and whether it is max_pool2d, and
 * c.saved the max's choices when recording. */
#include <cblas.h>
#include <limits.h>

#include "dispatch.h"
#include "ember/runtime.h"
#include "kernel_impl.h"
#if EM_HAVE_CUDA
#include "cuda_conv.h"
#include "cuda_matmul.h"
#endif

typedef struct geom {
    int64_t N, C, H, W, O, KH, KW, OH, OW;
    int64_t s, p;
    bool dbl; /* compute in f64 */
} geom;

static inline double rd(const void *p, bool dbl, int64_t i)
{
    return dbl ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static inline void wr(void *p, bool dbl, int64_t i, double v)
{
    if (dbl)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

static inline void acc(void *p, bool dbl, int64_t i, double v)
{
    if (dbl)
        ((double *)p)[i] += v;
    else
        ((float *)p)[i] += (float)v;
}

/* A tensor of dtype ct and out's shape to compute into: out itself when it
 * is of ct, else a new one, which conv_done copies into out and drops. */
static tensor *compute_into(tensor *out, em_dtype ct)
{
    return ct == out->dtype ? out : t_new_on(out->device, ct, out->ndim, out->shape);
}

static void compute_done(tensor *out, tensor *acc_t)
{
    if (acc_t == out) return;
    copy_strided(out, acc_t); /* to out's dtype */
    t_drop(acc_t);
}

/* A zeroed tensor of dtype ct and out's shape to add into (compute_into's) */
static tensor *zeros_into(tensor *out, em_dtype ct)
{
    tensor *t = compute_into(out, ct);
    if (t && t_fill_zero(t)) {
        if (t != out) t_drop(t);
        return NULL;
    }
    return t;
}

/* The conv backward's call: in = {x, w, g} (g the output's gradient), ip[0]
 * and ip[1] the stride and padding; out is dx (NULL when x needs none) and
 * c.saved points to this: dw and db (NULL when not wanted). Each gradient
 * has its input's shape and dtype; the kernels compute in f32 (f64 for f64)
 * and convert. */
typedef struct conv_grads {
    tensor *dw, *db;
} conv_grads;

/* t's values as contiguous elements of dtype ct: t's own data when it already
 * is, else a copy in the temp arena (the caller holds a tmp_mark). */
static void *as_ct(tensor *t, em_dtype ct)
{
    if (t->dtype == ct && t_is_contig(t)) return t_ptr(t);
    size_t nb = (size_t)t_numel(t) * em_dtype_size(ct);
    void *buf = tmp_alloc(nb ? nb : 1);
    if (!buf) return NULL;
    storage s = {.data = buf, .nbytes = nb, .refcount = 1, .in_arena = true};
    tensor v = *t; /* a stack header, never handed out */
    v.dtype = ct;
    v.offset = 0;
    v.st = &s;
    t_contig_strides(t->ndim, t->shape, v.stride);
    copy_strided(&v, t);
    return buf;
}

/* Output size along one axis, or < 1 when the window does not fit. */
static int64_t out_size(int64_t n, int64_t k, int64_t s, int64_t p) { return (n + 2 * p - k) / s + 1; }

static bool chk_4d(const char *op, const tensor *x, const char *what)
{
    if (x->ndim == 4) return true;
    em_fail(EM_ERR_SHAPE, "%s: %s must be 4-D (N,C,H,W), got %s", op, what, shp(x));
    return false;
}

/* ---- im2col / col2im --------------------------------------------------------------
 * col (C*KH*KW, OH*OW) for one image x (C,H,W); rows r = (c*KH + kh)*KW + kw. */

typedef struct col_ctx {
    const geom *g;
    const void *x; /* one image (C,H,W), contiguous, compute dtype */
    void *col;     /* (C*KH*KW, OH*OW) */
} col_ctx;

static void im2col_range(void *p, int64_t lo, int64_t hi)
{
    col_ctx *c = p;
    const geom *g = c->g;
    int64_t ohw = g->OH * g->OW;
    for (int64_t r = lo; r < hi; r++) {
        int64_t ch = r / (g->KH * g->KW), kh = (r / g->KW) % g->KH, kw = r % g->KW;
        for (int64_t oh = 0; oh < g->OH; oh++) {
            int64_t ih = oh * g->s - g->p + kh, o = r * ohw + oh * g->OW;
            for (int64_t ow = 0; ow < g->OW; ow++) {
                int64_t iw = ow * g->s - g->p + kw;
                bool in = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W;
                wr(c->col, g->dbl, o + ow, in ? rd(c->x, g->dbl, (ch * g->H + ih) * g->W + iw) : 0.0);
            }
        }
    }
}

/* dx (C,H,W) += the columns scattered back; ranges are channels, so no two
 * threads write the same element. */
static void col2im_range(void *p, int64_t lo, int64_t hi)
{
    col_ctx *c = p;
    const geom *g = c->g;
    void *dx = (void *)c->x;
    int64_t ohw = g->OH * g->OW;
    for (int64_t ch = lo; ch < hi; ch++)
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                int64_t r = (ch * g->KH + kh) * g->KW + kw;
                for (int64_t oh = 0; oh < g->OH; oh++) {
                    int64_t ih = oh * g->s - g->p + kh;
                    if (ih < 0 || ih >= g->H) continue;
                    for (int64_t ow = 0; ow < g->OW; ow++) {
                        int64_t iw = ow * g->s - g->p + kw;
                        if (iw >= 0 && iw < g->W)
                            acc(dx, g->dbl, (ch * g->H + ih) * g->W + iw,
                                rd(c->col, g->dbl, r * ohw + oh * g->OW + ow));
                    }
                }
            }
}

/* 1x1 kernel, stride 1, no padding: the image already is its column matrix. */
static bool col_is_image(const geom *g) { return g->KH == 1 && g->KW == 1 && g->s == 1 && g->p == 0; }

static void im2col(const geom *g, const void *x, void *col)
{
    col_ctx c = {g, x, col};
    int64_t rows = g->C * g->KH * g->KW;
    parallel_for(rows, 1 + (1 << 14) / (g->OH * g->OW + 1), im2col_range, &c);
}

/* C (M,N) = op(A) op(B) + beta C, row-major, packed (lda, ldb, ldc from the shapes). */
static void gemm(bool dbl, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, const void *B,
                 double beta, void *C)
{
    em_gemm(dbl ? EM_F64 : EM_F32, ta, tb, M, N, K, 1.0, A, ta ? M : K, B, tb ? K : N, beta, C, N);
}

/* ---- conv2d ------------------------------------------------------------------------ */

static void conv_geom(geom *g, const tensor *x, const tensor *w, int64_t s, int64_t p)
{
    *g = (geom){x->shape[0],
                x->shape[1],
                x->shape[2],
                x->shape[3],
                w->shape[0],
                w->shape[2],
                w->shape[3],
                out_size(x->shape[2], w->shape[2], s, p),
                out_size(x->shape[3], w->shape[3], s, p),
                s,
                p,
                x->dtype == EM_F64};
}

/* ---- conv2d on CUDA ------------------------------------------------------------------ */
#if EM_HAVE_CUDA

static cu_conv_geom cu_geom(const geom *g)
{
    return (cu_conv_geom){g->N, g->C, g->H, g->W, g->O, g->KH, g->KW, g->OH, g->OW, g->s, g->p};
}

/* t as contiguous elements of dtype ct on its device: t itself when it
 * already is, else a new tensor the caller t_drop's. */
static tensor *dev_as_ct(tensor *t, em_dtype ct)
{
    if (t->dtype == ct && t_is_contig(t)) return t;
    tensor *c = t_new_on(t->device, ct, t->ndim, t->shape);
    if (c) copy_strided(c, t);
    return c;
}

/* C (M,N) = op(A) op(B) on the device, packed row-major like gemm() above;
 * M or N of 0 is nothing to do, K of 0 is zeros. */
static em_status gemm_cuda(int dev, em_dtype ct, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const tensor *a,
                           const tensor *b, tensor *c)
{
    if (M == 0 || N == 0) return EM_OK;
    if (K == 0) return cu_fill(dev, ct, t_ptr(c), M * N, 0.0);
    cu_gemm gm = {.dt = ct, .tf32 = em_cuda_tf32(), .M = M, .N = N, .K = K, .batch = 1,
                  .a = t_ptr(a), .ta = ta, .lda = ta ? M : K,
                  .b = t_ptr(b), .tb = tb, .ldb = tb ? K : N,
                  .c = t_ptr(c), .ldc = N};
    return cu_matmul(dev, &gm);
}

/* col (C*KH*KW, N*OH*OW) of dtype ct for x, on x's device; NULL + error */
static tensor *im2col_cuda(const geom *g, tensor *x, em_dtype ct)
{
    cu_conv_geom cg = cu_geom(g);
    tensor *xc = t_contig(x);
    tensor *col = xc ? t_new_on(x->device, ct, 2, (int64_t[]){g->C * g->KH * g->KW, g->N * g->OH * g->OW}) : NULL;
    em_status s = col ? cu_im2col(x->device.index, &cg, x->dtype, t_ptr(xc), ct, t_ptr(col)) : em_last_status();
    if (xc != x) t_drop(xc);
    if (s) {
        t_drop(col);
        return NULL;
    }
    return col;
}

/* out (N,O,OH,OW) of x's dtype: yt (O, N,OH,OW) = W @ col, + bias, then
 * permuted into place (the core copy converts to x's dtype) */
static em_status conv2d_cuda(const op_call *c, tensor *out)
{
    tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
    geom g;
    conv_geom(&g, x, w, c->ip[0], c->ip[1]);
    int dev = x->device.index;
    em_dtype ct = g.dbl ? EM_F64 : EM_F32;
    int64_t ckk = g.C * g.KH * g.KW, cols = g.N * g.OH * g.OW;
    tensor *wc = dev_as_ct(w, ct), *col = wc ? im2col_cuda(&g, x, ct) : NULL;
    tensor *yt = col ? t_new_on(x->device, ct, 4, (int64_t[]){g.O, g.N, g.OH, g.OW}) : NULL;
    em_status s = yt ? gemm_cuda(dev, ct, false, false, g.O, cols, ckk, wc, col, yt) : em_last_status();
    if (!s && b) { /* yt[o, :] += b[o], summed in ct as the CPU does */
        cu_walk bw = {.ndim = 2, .shape = {g.O, cols}, .stride = {{cols, 1}, {b->stride[0], 0}}};
        s = cu_add_into(dev, &bw, ct, t_ptr(yt), b->dtype, t_ptr(b));
    }
    if (!s) {
        tensor v = *yt; /* a stack header: yt seen as (N,O,OH,OW) */
        int64_t ohw = g.OH * g.OW;
        memcpy(v.shape, out->shape, sizeof v.shape);
        int64_t st[4] = {ohw, g.N * ohw, g.OW, 1};
        memcpy(v.stride, st, sizeof st);
        copy_strided(out, &v);
    }
    if (wc && wc != w) t_drop(wc);
    t_drop(col);
    t_drop(yt);
    return s;
}

/* dx = col2im(W^T gt); dW = gt col^T; db = sum of g over (N,OH,OW), with
 * gt (O, N*OH*OW) the gradient regrouped by output channel */
static em_status conv_grad_cuda(const op_call *c, tensor *dx)
{
    const conv_grads *o = c->saved;
    tensor *x = c->in[0], *w = c->in[1], *gout = c->in[2];
    geom g;
    conv_geom(&g, x, w, c->ip[0], c->ip[1]);
    int dev = x->device.index;
    em_dtype ct = g.dbl ? EM_F64 : EM_F32;
    int64_t ckk = g.C * g.KH * g.KW, cols = g.N * g.OH * g.OW;
    cu_conv_geom cg = cu_geom(&g);
    tensor *gt = t_new_on(x->device, ct, 4, (int64_t[]){g.O, g.N, g.OH, g.OW});
    if (!gt) return em_last_status();
    tensor v = *gout; /* gout seen as (O,N,OH,OW) */
    v.shape[0] = gout->shape[1], v.shape[1] = gout->shape[0];
    v.stride[0] = gout->stride[1], v.stride[1] = gout->stride[0];
    copy_strided(gt, &v);
    em_status s = EM_OK;
    if (o->dw) {
        tensor *col = im2col_cuda(&g, x, ct);
        tensor *dw = col ? compute_into(o->dw, ct) : NULL;
        s = dw ? gemm_cuda(dev, ct, false, true, g.O, ckk, cols, gt, col, dw) : em_last_status();
        t_drop(col);
        if (!s)
            compute_done(o->dw, dw);
        else if (dw && dw != o->dw)
            t_drop(dw);
    }
    if (!s && dx) {
        tensor *wc = dev_as_ct(w, ct);
        tensor *dcol = wc ? t_new_on(x->device, ct, 2, (int64_t[]){ckk, cols}) : NULL;
        s = dcol ? gemm_cuda(dev, ct, true, false, ckk, cols, g.O, wc, gt, dcol) : em_last_status();
        if (!s) s = cu_col2im(dev, &cg, ct, t_ptr(dcol), x->dtype, t_ptr(dx));
        if (wc && wc != w) t_drop(wc);
        t_drop(dcol);
    }
    if (!s && o->db) {
        tensor *db = t_sum(gout, 3, (const int[]){0, 2, 3}, false);
        if (db) copy_strided(o->db, db); /* to the bias's dtype */
        s = db ? EM_OK : em_last_status();
        t_drop(db);
    }
    t_drop(gt);
    return s;
}

#endif

/* dx = col2im(W^T g_n); dW = sum_n g_n col_n^T; db = sum over n, oh, ow of g */
static em_status conv_grad_cpu(const op_call *c, tensor *dx_out)
{
    const conv_grads *o = c->saved;
    tensor *x = c->in[0], *w = c->in[1], *gout = c->in[2];
    geom g;
    conv_geom(&g, x, w, c->ip[0], c->ip[1]);
    em_dtype ct = g.dbl ? EM_F64 : EM_F32;
    size_t es = em_dtype_size(ct);
    int64_t ckk = g.C * g.KH * g.KW, ohw = g.OH * g.OW, chw = g.C * g.H * g.W;
    /* the sums in ct: the outputs themselves when they are of ct */
    tensor *outs[3] = {dx_out, o->dw, o->db}, *sums[3] = {NULL, NULL, NULL};
    bool ok = true;
    for (int k = 0; k < 3 && ok; k++)
        if (outs[k]) ok = (sums[k] = zeros_into(outs[k], ct)) != NULL;
    tensor *dx = sums[0], *dw = sums[1], *db = sums[2];
    size_t m = tmp_mark();
    const void *gp = ok ? as_ct(gout, ct) : NULL, *xp = dw ? as_ct(x, ct) : NULL,
               *wp = dx ? as_ct(w, ct) : NULL;
    void *col = dw && !col_is_image(&g) ? tmp_alloc((size_t)(ckk * ohw) * es) : NULL;
    void *dcol = dx && !col_is_image(&g) ? tmp_alloc((size_t)(ckk * ohw) * es) : NULL;
    if (!gp || (dw && !xp) || (dx && !wp) || (dw && !col && !col_is_image(&g)) ||
        (dx && !dcol && !col_is_image(&g))) {
        tmp_release(m);
        for (int k = 0; k < 3; k++)
            if (sums[k] && sums[k] != outs[k]) t_drop(sums[k]);
        return em_last_status();
    }
    for (int64_t i = 0; i < g.N; i++) {
        const char *gi = (const char *)gp + (size_t)(i * g.O * ohw) * es;
        if (dw) {
            const void *ci = (const char *)xp + (size_t)(i * chw) * es;
            if (col) {
                im2col(&g, ci, col);
                ci = col;
            }
            gemm(g.dbl, false, true, g.O, ckk, ohw, gi, ci, 1.0, t_ptr(dw));
        }
        if (dx) {
            void *dxi = (char *)t_ptr(dx) + (size_t)(i * chw) * es;
            if (!dcol) { /* 1x1: dx_i = W^T g_i directly */
                gemm(g.dbl, true, false, ckk, ohw, g.O, wp, gi, 0.0, dxi);
            } else {
                gemm(g.dbl, true, false, ckk, ohw, g.O, wp, gi, 0.0, dcol);
                col_ctx c = {&g, dxi, dcol};
                parallel_for(g.C, 1 + (1 << 14) / (g.KH * g.KW * ohw + 1), col2im_range, &c);
            }
        }
        if (db)
            for (int64_t o = 0; o < g.O; o++) {
                double s = 0;
                for (int64_t j = 0; j < ohw; j++) s += rd(gi, g.dbl, o * ohw + j);
                acc(t_ptr(db), g.dbl, o, s);
            }
    }
    tmp_release(m);
    for (int k = 0; k < 3; k++)
        if (outs[k]) compute_done(outs[k], sums[k]);
    return EM_OK;
}

static const op_kernels conv_grad_kernels = OP_KERNELS(conv_grad_cpu, conv_grad_cuda);

static em_status conv_backward(node *n, tensor *gout)
{
    tensor *x = n->in[0], *w = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    tensor *in[3] = {x, w, gout};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 3, in)) return em_last_status();
    conv_grads o = {NULL, NULL};
    tensor *dx = NULL;
    if ((x->requires_grad && !(dx = op_out(&c, x->dtype, x->ndim, x->shape))) ||
        (w->requires_grad && !(o.dw = op_out(&c, w->dtype, w->ndim, w->shape))) ||
        (b && b->requires_grad && !(o.db = op_out(&c, b->dtype, b->ndim, b->shape))))
        return em_last_status();
    c.saved = &o;
    em_status s = op_run(&c, &conv_grad_kernels, dx);
    if (!s && dx) s = op_grad(x, dx);
    if (!s && o.dw) s = op_grad(w, o.dw);
    if (!s && o.db) s = op_grad(b, o.db);
    return s;
}

/* out (N,O,OH,OW) of x's dtype: per image, im2col then (O,CKK) @ (CKK,OHW) + bias */
static em_status conv2d_cpu(const op_call *c, tensor *out)
{
    tensor *x = c->in[0], *w = c->in[1], *b = c->nin > 2 ? c->in[2] : NULL;
    geom g;
    conv_geom(&g, x, w, c->ip[0], c->ip[1]);
    em_dtype ct = g.dbl ? EM_F64 : EM_F32;
    size_t es = em_dtype_size(ct);
    int64_t ckk = g.C * g.KH * g.KW, ohw = g.OH * g.OW;
    tensor *acc_t = compute_into(out, ct);
    if (!acc_t) return em_last_status();
    size_t m = tmp_mark();
    const void *xp = as_ct(x, ct), *wp = as_ct(w, ct), *bp = b ? as_ct(b, ct) : NULL;
    void *col = col_is_image(&g) ? NULL : tmp_alloc((size_t)(ckk * ohw) * es);
    if (!xp || !wp || (b && !bp) || (!col && !col_is_image(&g))) {
        tmp_release(m);
        if (acc_t != out) t_drop(acc_t);
        return em_last_status();
    }
    for (int64_t i = 0; i < g.N; i++) {
        const void *ci = (const char *)xp + (size_t)(i * g.C * g.H * g.W) * es;
        void *oi = (char *)t_ptr(acc_t) + (size_t)(i * g.O * ohw) * es;
        if (col) {
            im2col(&g, ci, col);
            ci = col;
        }
        gemm(g.dbl, false, false, g.O, ohw, ckk, wp, ci, 0.0, oi); /* (O,CKK) @ (CKK,OHW) */
        if (bp)
            for (int64_t o = 0; o < g.O; o++)
                for (int64_t j = 0; j < ohw; j++) acc(oi, g.dbl, o * ohw + j, rd(bp, g.dbl, o));
    }
    tmp_release(m);
    compute_done(out, acc_t);
    return EM_OK;
}

static const op_kernels conv2d_kernels = OP_KERNELS(conv2d_cpu, conv2d_cuda);

static tensor *t_conv2d(tensor *x, tensor *w, tensor *b, int stride, int padding)
{
    const char *op = "conv2d";
    tensor *in[3] = {x, w, b};
    OP_CALL(c);
    if (!op_begin(&c, OP_CONV2D, b ? 3 : 2, in)) return NULL;
    x = in[0], w = in[1], b = b ? in[2] : NULL;
    if (!chk_same_dtype(op, x, w) || (b && !chk_same_dtype(op, x, b))) return NULL;
    if (!chk_4d(op, x, "input") || !chk_4d(op, w, "weight")) return NULL;
    if (x->shape[1] != w->shape[1])
        return em_fail(EM_ERR_SHAPE, "conv2d: input %s has %lld channels but weight %s expects %lld", shp(x),
                       (long long)x->shape[1], shp(w), (long long)w->shape[1]);
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return em_fail(EM_ERR_SHAPE, "conv2d: bias %s must be (%lld,) for weight %s", shp(b),
                       (long long)w->shape[0], shp(w));
    if (stride < 1 || padding < 0)
        return em_fail(EM_ERR_ARG, "conv2d: stride %d must be >= 1 and padding %d >= 0", stride, padding);
    geom g;
    conv_geom(&g, x, w, stride, padding);
    if (x->shape[2] + 2 * padding < g.KH || x->shape[3] + 2 * padding < g.KW || g.KH < 1 || g.KW < 1)
        return em_fail(EM_ERR_SHAPE, "conv2d: kernel %lldx%lld does not fit input %s with padding %d",
                       (long long)g.KH, (long long)g.KW, shp(x), padding);
    int64_t ckk = g.C * g.KH * g.KW, ohw = g.OH * g.OW;
    /* the device multiplies the whole batch at once: N*OH*OW columns */
    if (ckk > INT_MAX || ohw > INT_MAX || g.O > INT_MAX || (c.dev.type == EM_CUDA && g.N * ohw > INT_MAX))
        return em_fail(EM_ERR_SHAPE, "conv2d: input %s with weight %s is too large for gemm", shp(x), shp(w));
    tensor *out = op_out(&c, x->dtype, 4, (int64_t[]){g.N, g.O, g.OH, g.OW});
    if (!out) return NULL;
    c.ip[0] = stride;
    c.ip[1] = padding;
    if (op_run(&c, &conv2d_kernels, out)) {
        t_drop(out);
        return NULL;
    }
    return op_end(&c, out, conv_backward);
}

/* ---- pooling ---------------------------------------------------------------------------
 * Ranges are (n,c) planes. Padding counts as -inf for max, 0 for avg. */

typedef struct pool_ctx {
    geom g;         /* C = channels, KH = KW = kernel */
    const void *x;  /* (N,C,H,W) contiguous compute dtype */
    void *y;        /* (N,C,OH,OW) */
    int32_t *arg;   /* max: h*W+w of the chosen element, or NULL */
    const void *gy; /* backward: gradient of y */
} pool_ctx;

static void maxpool_range(void *p, int64_t lo, int64_t hi)
{
    pool_ctx *c = p;
    const geom *g = &c->g;
    for (int64_t pl = lo; pl < hi; pl++) {
        int64_t xb = pl * g->H * g->W, yb = pl * g->OH * g->OW;
        for (int64_t oh = 0; oh < g->OH; oh++)
            for (int64_t ow = 0; ow < g->OW; ow++) {
                double best = -INFINITY;
                int64_t bi = -1;
                for (int64_t kh = 0; kh < g->KH; kh++) {
                    int64_t ih = oh * g->s - g->p + kh;
                    if (ih < 0 || ih >= g->H) continue;
                    for (int64_t kw = 0; kw < g->KW; kw++) {
                        int64_t iw = ow * g->s - g->p + kw;
                        if (iw < 0 || iw >= g->W) continue;
                        double v = rd(c->x, g->dbl, xb + ih * g->W + iw);
                        if (bi < 0 || v > best || (v != v && best == best)) { /* first max; NaN wins */
                            best = v;
                            bi = ih * g->W + iw;
                        }
                    }
                }
                wr(c->y, g->dbl, yb + oh * g->OW + ow, best);
                if (c->arg) c->arg[yb + oh * g->OW + ow] = (int32_t)bi;
            }
    }
}

/* dx[argmax] += g */
static void maxpool_back_range(void *p, int64_t lo, int64_t hi)
{
    pool_ctx *c = p;
    const geom *g = &c->g;
    int64_t ohw = g->OH * g->OW;
    for (int64_t pl = lo; pl < hi; pl++)
        for (int64_t j = 0; j < ohw; j++) {
            int32_t a = c->arg[pl * ohw + j];
            if (a >= 0) acc(c->y, g->dbl, pl * g->H * g->W + a, rd(c->gy, g->dbl, pl * ohw + j));
        }
}

/* forward (gy == NULL): y = window sum / k^2; backward: x-grad (in y) += gy / k^2 over the window */
static void avgpool_range(void *p, int64_t lo, int64_t hi)
{
    pool_ctx *c = p;
    const geom *g = &c->g;
    double inv = 1.0 / (double)(g->KH * g->KW);
    for (int64_t pl = lo; pl < hi; pl++) {
        int64_t xb = pl * g->H * g->W, yb = pl * g->OH * g->OW;
        for (int64_t oh = 0; oh < g->OH; oh++)
            for (int64_t ow = 0; ow < g->OW; ow++) {
                double s = 0, gv = c->gy ? rd(c->gy, g->dbl, yb + oh * g->OW + ow) * inv : 0.0;
                for (int64_t kh = 0; kh < g->KH; kh++) {
                    int64_t ih = oh * g->s - g->p + kh;
                    if (ih < 0 || ih >= g->H) continue;
                    for (int64_t kw = 0; kw < g->KW; kw++) {
                        int64_t iw = ow * g->s - g->p + kw;
                        if (iw < 0 || iw >= g->W) continue;
                        if (c->gy)
                            acc(c->y, g->dbl, xb + ih * g->W + iw, gv);
                        else
                            s += rd(c->x, g->dbl, xb + ih * g->W + iw);
                    }
                }
                if (!c->gy) wr(c->y, g->dbl, yb + oh * g->OW + ow, s * inv);
            }
    }
}

static void pool_geom(geom *g, const tensor *x, int64_t k, int64_t s, int64_t p)
{
    *g = (geom){x->shape[0],
                x->shape[1],
                x->shape[2],
                x->shape[3],
                x->shape[1],
                k,
                k,
                out_size(x->shape[2], k, s, p),
                out_size(x->shape[3], k, s, p),
                s,
                p,
                x->dtype == EM_F64};
}

/* dx (x's shape and dtype) from g = in[0], the pool's ip[0..3]; the max's
 * choices in c.saved */
static em_status pool_grad_cpu(const op_call *call, tensor *dx)
{
    bool is_max = call->ip[3];
    pool_ctx c = {.arg = call->saved};
    pool_geom(&c.g, dx, call->ip[0], call->ip[1], call->ip[2]);
    em_dtype ct = c.g.dbl ? EM_F64 : EM_F32;
    tensor *sum = zeros_into(dx, ct);
    if (!sum) return em_last_status();
    size_t m = tmp_mark();
    c.gy = as_ct(call->in[0], ct);
    c.y = t_ptr(sum);
    if (!c.gy) {
        tmp_release(m);
        if (sum != dx) t_drop(sum);
        return em_last_status();
    }
    int64_t work = (is_max ? 1 : c.g.KH * c.g.KW) * c.g.OH * c.g.OW + 1;
    parallel_for(c.g.N * c.g.C, 1 + (1 << 14) / work, is_max ? maxpool_back_range : avgpool_range, &c);
    tmp_release(m);
    compute_done(dx, sum);
    return EM_OK;
}

#if EM_HAVE_CUDA
/* every element of dx written once: no zeroing */
static em_status pool_grad_cuda(const op_call *call, tensor *dx)
{
    tensor *gout = call->in[0];
    geom g;
    pool_geom(&g, dx, call->ip[0], call->ip[1], call->ip[2]);
    cu_conv_geom cg = cu_geom(&g);
    tensor *gc = t_contig(gout);
    em_status s = gc ? cu_pool_bwd(dx->device.index, call->ip[3] != 0, &cg, gout->dtype, t_ptr(gc),
                                   call->saved, dx->dtype, t_ptr(dx))
                     : em_last_status();
    if (gc && gc != gout) t_drop(gc);
    return s;
}
#endif

static const op_kernels pool_grad_kernels = OP_KERNELS(pool_grad_cpu, pool_grad_cuda);

static em_status pool_backward(node *n, tensor *gout)
{
    tensor *x = n->in[0];
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 1, &gout))
        return em_last_status();
    tensor *dx = op_out(&c, x->dtype, x->ndim, x->shape);
    if (!dx) return em_last_status();
    em_status s = op_run(&c, &pool_grad_kernels, dx);
    return s ? s : op_grad(x, dx);
}

/* c->in[0]'s geometry and the pool's (ip[0..2]); the max's choices to c->saved when given */
static pool_ctx pool_of(const op_call *c)
{
    pool_ctx p = {.arg = c->saved};
    pool_geom(&p.g, c->in[0], c->ip[0], c->ip[1], c->ip[2]);
    return p;
}

/* out (N,C,OH,OW) of x's dtype on the CPU */
static em_status pool_cpu(const op_call *call, tensor *out)
{
    tensor *x = call->in[0];
    bool is_max = call->ip[3];
    pool_ctx c = pool_of(call);
    em_dtype ct = c.g.dbl ? EM_F64 : EM_F32;
    tensor *y = compute_into(out, ct);
    if (!y) return em_last_status();
    size_t m = tmp_mark();
    c.x = as_ct(x, ct);
    c.y = t_ptr(y);
    if (!c.x) {
        tmp_release(m);
        if (y != out) t_drop(y);
        return em_last_status();
    }
    int64_t work = c.g.KH * c.g.KW * c.g.OH * c.g.OW + 1;
    parallel_for(c.g.N * c.g.C, 1 + (1 << 14) / work, is_max ? maxpool_range : avgpool_range, &c);
    tmp_release(m);
    compute_done(out, y);
    return EM_OK;
}

#if EM_HAVE_CUDA
/* out (N,C,OH,OW) of x's dtype on x's device */
static em_status pool_cuda(const op_call *call, tensor *out)
{
    tensor *x = call->in[0];
    pool_ctx c = pool_of(call);
    cu_conv_geom cg = cu_geom(&c.g);
    tensor *xc = t_contig(x);
    em_status s =
        xc ? cu_pool_fwd(x->device.index, call->ip[3] != 0, &cg, x->dtype, t_ptr(xc), t_ptr(out), c.arg)
           : em_last_status();
    if (xc && xc != x) t_drop(xc);
    return s;
}
#endif

static const op_kernels pool_kernels = OP_KERNELS(pool_cpu, pool_cuda);

static tensor *t_pool(op_id opid, tensor *x, int kernel, int stride, int padding)
{
    const char *op = op_name(opid);
    bool is_max = opid == OP_MAX_POOL2D;
    OP_CALL(c);
    if (!op_begin(&c, opid, 1, &x)) return NULL;
    if (!chk_4d(op, x, "input")) return NULL;
    if (kernel < 1 || stride < 1 || padding < 0)
        return em_fail(EM_ERR_ARG, "%s: kernel %d and stride %d must be >= 1, padding %d >= 0", op, kernel,
                       stride, padding);
    if (padding > kernel / 2)
        return em_fail(EM_ERR_ARG, "%s: padding %d must be at most half the kernel %d", op, padding, kernel);
    geom g;
    pool_geom(&g, x, kernel, stride, padding);
    if (x->shape[2] + 2 * padding < kernel || x->shape[3] + 2 * padding < kernel)
        return em_fail(EM_ERR_SHAPE, "%s: kernel %d does not fit input %s with padding %d", op, kernel,
                       shp(x), padding);
    int64_t ys[4] = {g.N, g.C, g.OH, g.OW};
    tensor *out = op_out(&c, x->dtype, 4, ys);
    if (!out) return NULL;
    c.ip[0] = kernel;
    c.ip[1] = stride;
    c.ip[2] = padding;
    c.ip[3] = is_max;
    /* the max's choices (h*W+w per output element, i32) for backward: scope
     * memory on the CPU, an i32 tensor of the scope on CUDA */
    tensor *argt = NULL;
    if (c.record && is_max) {
        if (c.dev.type == EM_CUDA)
            c.saved = (argt = t_new_on(c.dev, EM_I32, 4, ys)) ? t_ptr(argt) : NULL;
        else
            c.saved = scope_alloc(sizeof(int32_t) * (size_t)(t_numel(out) ? t_numel(out) : 1));
        if (!c.saved) {
            t_drop(out);
            return NULL;
        }
    }
    if (op_run(&c, &pool_kernels, out)) {
        t_drop(argt);
        t_drop(out);
        return NULL;
    }
    tensor *r = op_end(&c, out, pool_backward);
    if (!r) t_drop(argt);
    return r;
}

/* ---- public wrappers ------------------------------------------------------------------------ */

em_tensor *em_conv2d(em_tensor *x, em_tensor *w, em_tensor *bias, int stride, int padding)
{
    tensor *xt = t_resolve(x, "conv2d"), *wt = xt ? t_resolve(w, "conv2d") : NULL;
    tensor *bt = wt && bias ? t_resolve(bias, "conv2d") : NULL;
    if (!wt || (bias && !bt)) return NULL;
    return t_handle(t_conv2d(xt, wt, bt, stride, padding));
}

em_tensor *em_max_pool2d(em_tensor *x, int kernel, int stride, int padding)
{
    tensor *t = t_resolve(x, "max_pool2d");
    return t ? t_handle(t_pool(OP_MAX_POOL2D, t, kernel, stride, padding)) : NULL;
}

em_tensor *em_avg_pool2d(em_tensor *x, int kernel, int stride, int padding)
{
    tensor *t = t_resolve(x, "avg_pool2d");
    return t ? t_handle(t_pool(OP_AVG_POOL2D, t, kernel, stride, padding)) : NULL;
}
