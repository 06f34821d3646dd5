/* ops_loss.c — cross-entropy: fused, stable log-softmax + negative
 * log-likelihood, with torch.nn.functional.cross_entropy's options: class
 * weights, label smoothing, ignore_index and the mean / sum / none
 * reductions (the per-row maths is tensor/ce_math.h's, shared with CUDA).
 *
 * The kernels see logits as rows with the classes last; a class dim
 * elsewhere (PyTorch's (N,C,d1,...)) reaches the op as a permuted view
 * (em_cross_entropy_loss). Targets are range-checked before anything is
 * allocated. The forward saves each row's log-sum-exp, the targets, the
 * weights (as doubles) and the mean's denominator in the node (scope
 * arena); the backward writes a (s p - q) per row directly, zero rows for
 * ignored targets. f16/bf16 logits are computed in f32. The op goes
 * through the dispatcher (tensor/dispatch.h) with inputs (logits, targets
 * [, weight]); ip[0] is ignore_index, ip[1] the reduction, dp[0] the label
 * smoothing. */
#include "ce_math.h"
#include "dispatch.h"
#include "kernel_impl.h"
#include "rows_impl.h"
#if EM_HAVE_CUDA
#include "cuda_nn.h"
#endif

typedef struct ce_ctx {
    bool f64;
    int64_t rows, C, nparts, ignore;
    double eps;         /* label smoothing */
    const double *w;    /* (C) class weights; NULL: all 1 */
    double W;           /* sum of the weights (C without) */
    const void *x;      /* logits rows (rows, C) */
    const int32_t *tgt; /* (rows) */
    double *lse;        /* (rows) log-sum-exp per row */
    double *part_loss;  /* forward: per part, the sum of its rows' losses */
    double *part_den;   /* forward: per part, the sum of w_t over its rows not ignored */
    em_dtype out_dt;    /* forward, reduction none: each row's loss into out (rows) */
    void *out;
    void *dx;        /* backward: (rows, C) */
    double scale;    /* backward, mean / sum: a of every row */
    const double *g; /* backward, none: (rows) a of each row */
} ce_ctx;

/* log sum_j exp(x_j) = m + log sum_j exp(x_j - m), m = max_j x_j */
static double lse_f32(const float *x, int64_t C)
{
    float m = rows_max_f32(x, C), scratch[512];
    double s = 0;
    for (int64_t j = 0; j < C; j += 512) s += rows_expsum_f32(x + j, m, scratch, C - j < 512 ? C - j : 512);
    return m + log(s);
}

static double lse_f64(const double *x, int64_t C)
{
    double m = -INFINITY;
    for (int64_t j = 0; j < C; j++) m = x[j] > m || x[j] != x[j] ? x[j] : m;
    double s = 0;
    for (int64_t j = 0; j < C; j++) s += exp(x[j] - m);
    return m + log(s);
}

/* The loss of row r (target t, not ignored); its log-sum-exp to c->lse[r]. */
static double row_loss(const ce_ctx *c, int64_t r, int64_t t)
{
    int64_t C = c->C;
    const double *xd = c->f64 ? (const double *)c->x + r * C : NULL;
    const float *xf = c->f64 ? NULL : (const float *)c->x + r * C;
    double l = xd ? lse_f64(xd, C) : lse_f32(xf, C), S = 0;
    if (c->eps > 0) /* S = sum_j w_j (lse - x_j) */
        for (int64_t j = 0; j < C; j++) S += (c->w ? c->w[j] : 1) * (l - (xd ? xd[j] : xf[j]));
    c->lse[r] = l;
    return ce_row_loss(c->eps, (double)C, c->w ? c->w[t] : 1, l - (xd ? xd[t] : xf[t]), S);
}

/* Part q sums its rows' losses and w_t; with reduction none each row's
 * loss goes to out. */
static void ce_fwd(void *p, int64_t lo, int64_t hi)
{
    ce_ctx *c = p;
    size_t es = c->out ? em_dtype_size(c->out_dt) : 0;
    for (int64_t q = lo; q < hi; q++) {
        double loss = 0, den = 0;
        int64_t r0 = c->rows * q / c->nparts, r1 = c->rows * (q + 1) / c->nparts;
        for (int64_t r = r0; r < r1; r++) {
            int64_t t = c->tgt[r];
            double l = 0;
            if (t == c->ignore)
                c->lse[r] = 0;
            else {
                l = row_loss(c, r, t);
                loss += l;
                den += c->w ? c->w[t] : 1;
            }
            if (c->out) st(c->out_dt, (char *)c->out + (size_t)r * es, l);
        }
        c->part_loss[q] = loss;
        c->part_den[q] = den;
    }
}

/* d loss / d x[r, j] = a (s p_j - q_j) (ce_math.h); 0 for ignored rows */
static void ce_bwd(void *p, int64_t lo, int64_t hi)
{
    ce_ctx *c = p;
    int64_t C = c->C;
    double e = c->eps, Cd = (double)C;
    for (int64_t r = lo; r < hi; r++) {
        int64_t t = c->tgt[r];
        bool skip = t == c->ignore;
        double a = c->g ? c->g[r] : c->scale, wt = skip ? 0 : c->w ? c->w[t] : 1;
        double s = ce_row_scale(e, Cd, wt, c->W);
        if (c->f64) {
            const double *x = (const double *)c->x + r * C;
            double *d = (double *)c->dx + r * C;
            for (int64_t j = 0; j < C; j++)
                d[j] =
                    skip ? 0
                         : (exp(x[j] - c->lse[r]) * s - ce_row_q(e, Cd, c->w ? c->w[j] : 1, wt, j == t)) * a;
        } else {
            const float *x = (const float *)c->x + r * C;
            float *d = (float *)c->dx + r * C;
            if (skip) {
                memset(d, 0, sizeof(float) * (size_t)C);
                continue;
            }
            /* exp(x - lse) as exp(x - m) * exp(m - lse): a float lse would
             * lose bits when the logits are large */
            float m = rows_max_f32(x, C);
            rows_expsum_f32(x, m, d, C);
            float f = (float)(exp((double)m - c->lse[r]) * a * s);
            for (int64_t j = 0; j < C; j++) d[j] *= f;
            if (e > 0)
                for (int64_t j = 0; j < C; j++)
                    d[j] -= (float)(a * ce_row_q(e, Cd, c->w ? c->w[j] : 1, wt, false));
            d[t] -= (float)(a * (1 - e) * wt);
        }
    }
}

/* t's values (CPU, any strides) into the contiguous buffer p of dtype to */
static void to_buffer(const tensor *t, em_dtype to, void *p)
{
    tensor h = *t;
    storage s = {
        .data = p, .nbytes = (size_t)t_numel(t) * em_dtype_size(to), .refcount = 1, .in_arena = true};
    h.st = &s;
    h.offset = 0;
    h.dtype = to;
    t_contig_strides(h.ndim, h.shape, h.stride);
    copy_strided(&h, t);
}

/* The weights (C doubles, NULL without) into ctx, and their sum */
static void set_weights(ce_ctx *c, const tensor *w, double *buf)
{
    c->w = NULL;
    c->W = (double)c->C;
    if (!w) return;
    to_buffer(w, EM_F64, buf);
    c->w = buf;
    c->W = 0;
    for (int64_t j = 0; j < c->C; j++) c->W += buf[j];
}

typedef struct ce_saved {
    double *lse;
    int32_t *tgt;
    double *w;  /* (C) the weights, NULL without */
    double W;   /* their sum (C without) */
    double den; /* the mean's denominator: sum of w_t over the rows not ignored */
} ce_saved;

static em_status ce_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    ce_saved *sv = n->saved;
    int last = x->ndim - 1;
    int64_t C = x->shape[last];
    tensor *dx = t_new(x->dtype, x->ndim, x->shape);
    if (!dx) return em_last_status();
    em_reduction red = (em_reduction)n->ip[1];
    ce_ctx c = {.f64 = rows_dtype(x->dtype) == EM_F64,
                .rows = C ? t_numel(x) / C : 0,
                .C = C,
                .ignore = n->ip[0],
                .eps = n->dp[0],
                .w = sv->w,
                .W = sv->W,
                .tgt = sv->tgt,
                .lse = sv->lse};
    size_t m = tmp_mark();
    bool ok = true;
    if (red == EM_REDUCTION_NONE) { /* g has the targets' shape: a per row */
        double *gr = tmp_alloc(sizeof(double) * (size_t)(c.rows + 1));
        if ((ok = gr != NULL)) to_buffer(g, EM_F64, gr);
        c.g = gr;
    } else {
        double gv = ld(g->dtype, t_ptr(g));
        c.scale = red == EM_REDUCTION_MEAN ? gv / sv->den : gv;
    }
    ok = ok && (c.x = rows_in(x, last)) && (c.dx = rows_out(dx, last));
    if (ok) {
        parallel_for(c.rows, (1 << 14) / (C + 1) + 1, ce_bwd, &c);
        rows_done(dx, last, c.dx);
    }
    tmp_release(m);
    return ok ? op_grad(x, dx) : em_last_status();
}

/* Every target in [0, C) or equal to ignore; the first bad one is reported
 * with its position. */
static bool chk_targets(const tensor *tg, int64_t C, int64_t ignore)
{
    int64_t n = t_numel(tg);
    nditer it;
    nditer_init(&it, tg->ndim, tg->shape, 1, (const int64_t *[]){tg->stride});
    const int32_t *p = t_ptr(tg);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = p[it.off[0]];
        if (v != ignore && (v < 0 || v >= C)) {
            em_fail(
                EM_ERR_INDEX,
                "cross_entropy: target %lld at position %s (flat %lld) is out of range for C = %lld classes "
                "(valid: 0..%lld, or ignore_index %lld)",
                (long long)v, shp_of(tg->ndim, it.idx), (long long)i, (long long)C, (long long)C - 1,
                (long long)ignore);
            return false;
        }
        nditer_next(&it);
    }
    return true;
}

#if EM_HAVE_CUDA
/* ---- CUDA: the same maths in tensor/ops_nn.cu; what the backward needs lives
 * on the device, in tensors of the step's scope. */

typedef struct ce_cuda_saved {
    tensor *tgt;   /* (rows) i32, contiguous */
    tensor *stats; /* f64 (4*rows + 1): max, lse, loss, s per row; the mean's denominator (cuda_nn.h) */
} ce_cuda_saved;

/* t itself or the contiguous copy nn_rows made of it, dropped */
static void drop_rows(tensor *r, tensor *t)
{
    if (r && r != t) t_drop(r);
}

static em_status ce_backward_cuda(node *n, tensor *g)
{
    tensor *x = n->in[0], *w = n->nin > 2 ? n->in[2] : NULL;
    ce_cuda_saved *sv = n->saved;
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = t_numel(sv->tgt);
    tensor *xr = nn_rows(x, last), *wr = xr && w ? nn_rows(w, 0) : NULL;
    tensor *gr = xr && (!w || wr) ? nn_rows(g, g->ndim - 1) : NULL, *dx = gr ? t_new_like(x) : NULL;
    em_status s =
        dx ? cu_cross_entropy_bwd(x->device.index, x->dtype, t_ptr(xr), t_ptr(sv->tgt), rows, C, n->ip[0],
                                  w ? w->dtype : x->dtype, wr ? t_ptr(wr) : NULL, n->dp[0],
                                  (em_reduction)n->ip[1], t_ptr(sv->stats), g->dtype, t_ptr(gr), t_ptr(dx))
           : em_last_status();
    drop_rows(xr, x);
    drop_rows(wr, w);
    drop_rows(gr, g);
    return s ? s : op_grad(x, dx);
}

/* The targets of a CUDA call range-checked on the host (a copy of them
 * comes back first), and what the kernel writes besides the loss: sv's
 * contiguous copy of the targets and its stats tensor, both new (the
 * caller drops them unless the node keeps them). false + error, nothing
 * left allocated, otherwise. */
static bool ce_cuda_prepare(ce_cuda_saved *sv, tensor *x, tensor *tg, int ignore)
{
    int64_t C = x->shape[x->ndim - 1], rows = t_numel(tg);
    tensor *tv = t_clone(tg); /* the node keeps its own contiguous copy */
    if (!tv) return false;
    size_t m = tmp_mark();
    int32_t *host = tmp_alloc(sizeof(int32_t) * (size_t)(rows + 1));
    bool ok =
        host && !cu_memcpy(host, em_device_cpu(), t_ptr(tv), tv->device, sizeof(int32_t) * (size_t)rows);
    if (ok) {
        tensor th = *tv;
        storage hs = {
            .data = host, .nbytes = sizeof(int32_t) * (size_t)rows, .refcount = 1, .in_arena = true};
        th.st = &hs;
        th.offset = 0;
        th.device = em_device_cpu();
        ok = chk_targets(&th, C, ignore);
    }
    tmp_release(m);
    tensor *stats = ok ? t_new_on(x->device, EM_F64, 1, (const int64_t[]){4 * rows + 1}) : NULL;
    if (!stats) {
        t_drop(tv);
        return false;
    }
    *sv = (ce_cuda_saved){tv, stats};
    return true;
}

/* the loss of c->in[0] (weights c->in[2]) against c->saved's targets; stats
 * to c->saved's */
static em_status ce_cuda(const op_call *c, tensor *out)
{
    tensor *x = c->in[0], *w = c->nin > 2 ? c->in[2] : NULL;
    const ce_cuda_saved *sv = c->saved;
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = t_numel(sv->tgt);
    tensor *xr = nn_rows(x, last), *wr = xr && w ? nn_rows(w, 0) : NULL;
    em_status s = xr && (!w || wr)
                      ? cu_cross_entropy_fwd(x->device.index, x->dtype, t_ptr(xr), t_ptr(sv->tgt), rows, C,
                                             (int)c->ip[0], w ? w->dtype : x->dtype, wr ? t_ptr(wr) : NULL,
                                             c->dp[0], (em_reduction)c->ip[1], t_ptr(sv->stats), t_ptr(out))
                      : em_last_status();
    drop_rows(xr, x);
    drop_rows(wr, w);
    return s;
}
#endif

/* the loss of c->in[0] (weights c->in[2] when there) against the targets
 * c->in[1] into out (0-dim, or the targets' shape for reduction none); when
 * recording, c->saved is a ce_saved whose lse, tgt and w (scope memory) the
 * kernel fills, with W and the mean's denominator */
static em_status ce_cpu(const op_call *call, tensor *out)
{
    tensor *x = call->in[0], *tg = call->in[1], *w = call->nin > 2 ? call->in[2] : NULL;
    ce_saved *sv = call->saved;
    em_reduction red = (em_reduction)call->ip[1];
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = t_numel(tg);
    size_t m = tmp_mark();
    size_t lbytes = sizeof(double) * (size_t)(rows + 1), tbytes = sizeof(int32_t) * (size_t)(rows + 1),
           wbytes = sizeof(double) * (size_t)(C + 1);
    ce_ctx c = {.f64 = rows_dtype(x->dtype) == EM_F64,
                .rows = rows,
                .C = C,
                .ignore = call->ip[0],
                .eps = call->dp[0]};
    int64_t per = (1 << 14) / (C + 1) + 1;
    c.nparts = rows / per < em_num_threads() ? rows / per : em_num_threads();
    if (c.nparts < 1) c.nparts = 1;
    double *wb = NULL;
    bool ok = (c.lse = sv ? sv->lse : tmp_alloc(lbytes)) && (c.tgt = sv ? sv->tgt : tmp_alloc(tbytes)) &&
              (!w || (wb = sv ? sv->w : tmp_alloc(wbytes))) &&
              (c.part_loss = tmp_alloc(sizeof(double) * (size_t)c.nparts)) &&
              (c.part_den = tmp_alloc(sizeof(double) * (size_t)c.nparts)) && (c.x = rows_in(x, last));
    if (ok) {
        to_buffer(tg, EM_I32, (int32_t *)c.tgt); /* contiguous: the node keeps them for the backward */
        set_weights(&c, w, wb);
        if (red == EM_REDUCTION_NONE) c.out = t_ptr(out), c.out_dt = out->dtype;
        parallel_for(c.nparts, 1, ce_fwd, &c);
        double loss = 0, den = 0;
        for (int64_t q = 0; q < c.nparts; q++) {
            loss += c.part_loss[q];
            den += c.part_den[q];
        }
        /* the mean: NaN when every target is ignored */
        if (red != EM_REDUCTION_NONE)
            st(out->dtype, t_ptr(out), red == EM_REDUCTION_MEAN ? loss / den : loss);
        if (sv) sv->W = c.W, sv->den = den;
    }
    tmp_release(m);
    return ok ? EM_OK : em_last_status();
}

static const op_kernels ce_kernels = OP_KERNELS(ce_cpu, ce_cuda);

/* The op on logits x with the classes last, targets tg, weights w (or
 * NULL); the options checked by the caller. */
static tensor *cross_entropy(tensor *x, tensor *tg, tensor *w, int ignore, em_reduction red, double eps)
{
    const char *op = "cross_entropy";
    tensor *in[3] = {x, tg, w};
    OP_CALL(c);
    if (!op_begin(&c, OP_CROSS_ENTROPY, w ? 3 : 2, in)) return NULL;
    x = in[0], tg = in[1], w = w ? in[2] : NULL;
    if (!chk_dtype(op, tg, EM_I32, "targets")) return NULL;
    if (x->ndim < 1)
        return em_fail(EM_ERR_SHAPE, "%s: logits must have a class dim (...,C), got %s", op, shp(x));
    if (tg->ndim != x->ndim - 1 || memcmp(tg->shape, x->shape, sizeof(int64_t) * (size_t)tg->ndim))
        return em_fail(EM_ERR_SHAPE,
                       "%s: targets %s must have the shape of logits %s without the last dim, %s", op,
                       shp(tg), shp(x), shp_of(x->ndim - 1, x->shape));
    int64_t C = x->shape[x->ndim - 1], rows = t_numel(tg);
    if (w && !em_dtype_is_float(w->dtype))
        return em_fail(EM_ERR_DTYPE, "%s: weight must be a float tensor, got %s%s", op,
                       em_dtype_name(w->dtype), shp(w));
    if (w && (w->ndim != 1 || w->shape[0] != C))
        return em_fail(EM_ERR_SHAPE, "%s: weight %s must hold one weight per class, (%lld,)", op, shp(w),
                       (long long)C);
    bool cuda = c.dev.type == EM_CUDA;
    if (!cuda && !chk_targets(tg, C, ignore)) return NULL; /* CUDA: checked on a host copy */
    if (c.record && em_scope_depth() == 0)
        return em_fail(EM_ERR_SCOPE, "%s: recording a gradient needs an open step scope (em_scope_begin)",
                       op);
    c.ip[0] = ignore;
    c.ip[1] = red;
    c.dp[0] = eps;
#if EM_HAVE_CUDA
    ce_cuda_saved cs = {0};
    if (cuda && !ce_cuda_prepare(&cs, x, tg, ignore)) return NULL;
#endif
    tensor *out =
        red == EM_REDUCTION_NONE ? op_out(&c, x->dtype, tg->ndim, tg->shape) : op_out(&c, x->dtype, 0, NULL);
    bool ok = out != NULL;
    if (ok && !cuda && c.record) { /* what backward reads, kept in the scope */
        ce_saved *sv = scope_alloc(sizeof *sv);
        size_t lbytes = sizeof(double) * (size_t)(rows + 1), tbytes = sizeof(int32_t) * (size_t)(rows + 1);
        ok = sv && (sv->lse = scope_alloc(lbytes)) && (sv->tgt = scope_alloc(tbytes)) &&
             (!w || (sv->w = scope_alloc(sizeof(double) * (size_t)(C + 1))));
        if (ok && !w) sv->w = NULL;
        c.saved = sv;
    }
#if EM_HAVE_CUDA
    if (ok && cuda) {
        ce_cuda_saved *sv = c.record ? scope_alloc(sizeof *sv) : &cs;
        if ((ok = sv != NULL)) *sv = cs;
        c.saved = sv;
    }
#endif
    ok = ok && !op_run(&c, &ce_kernels, out);
#if EM_HAVE_CUDA
    if (cuda && (!ok || !c.record)) { /* the node keeps them only when recording */
        t_drop(cs.tgt);
        t_drop(cs.stats);
        c.saved = NULL;
    }
#endif
    if (!ok) {
        t_drop(out);
        return NULL;
    }
    backward_fn bw = ce_backward;
#if EM_HAVE_CUDA
    if (cuda) bw = ce_backward_cuda;
#endif
    tensor *r = op_end(&c, out, bw);
#if EM_HAVE_CUDA
    if (!r && cuda) { /* recording failed */
        t_drop(cs.tgt);
        t_drop(cs.stats);
    }
#endif
    return r;
}

em_tensor *em_cross_entropy(em_tensor *logits, em_tensor *targets, int ignore_index)
{
    tensor *x = t_resolve(logits, "cross_entropy");
    tensor *t = x ? t_resolve(targets, "cross_entropy") : NULL;
    return t ? t_handle(cross_entropy(x, t, NULL, ignore_index, EM_REDUCTION_MEAN, 0)) : NULL;
}

em_cross_entropy_config em_cross_entropy_defaults(void)
{
    return (em_cross_entropy_config){
        .ignore_index = EM_IGNORE_INDEX, .reduction = EM_REDUCTION_MEAN, .weight = NULL, .class_dim = 1};
}

em_tensor *em_cross_entropy_loss(em_tensor *logits, em_tensor *targets, const em_cross_entropy_config *cfg)
{
    const char *op = "cross_entropy";
    em_cross_entropy_config o = cfg ? *cfg : em_cross_entropy_defaults();
    tensor *x = t_resolve(logits, op);
    tensor *t = x ? t_resolve(targets, op) : NULL;
    tensor *w = t && o.weight ? t_resolve(o.weight, op) : NULL;
    if (!t || (o.weight && !w)) return NULL;
    if (o.reduction != EM_REDUCTION_MEAN && o.reduction != EM_REDUCTION_SUM &&
        o.reduction != EM_REDUCTION_NONE)
        return em_fail(EM_ERR_ARG, "%s: reduction %d is not EM_REDUCTION_MEAN, _SUM or _NONE", op,
                       (int)o.reduction);
    if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1))
        return em_fail(EM_ERR_ARG, "%s: label_smoothing %g must be in [0, 1]", op, o.label_smoothing);
    if (w && w->requires_grad)
        return em_fail(
            EM_ERR_ARG,
            "%s: weight requires grad, but the loss is not differentiable in its class weights (as in "
            "PyTorch): pass a tensor that does not (em_detach)",
            op);
    if (x->ndim < 1) return em_fail(EM_ERR_SHAPE, "%s: logits must have a class dim, got %s", op, shp(x));
    /* PyTorch's class dim: 1, or 0 for 1-D logits (C) */
    int cd = o.class_dim == 1 && x->ndim == 1 ? 0 : o.class_dim;
    if (cd < -x->ndim || cd >= x->ndim)
        return em_fail(EM_ERR_ARG, "%s: class_dim %d is out of range for logits %s", op, o.class_dim, shp(x));
    if (cd < 0) cd += x->ndim;
    /* targets: the logits' shape without the class dim */
    int64_t want[EM_MAX_DIMS];
    for (int d = 0, k = 0; d < x->ndim; d++)
        if (d != cd) want[k++] = x->shape[d];
    if (t->ndim != x->ndim - 1 || memcmp(t->shape, want, sizeof(int64_t) * (size_t)t->ndim))
        return em_fail(
            EM_ERR_SHAPE,
            "%s: targets %s must have the shape of logits %s without the class dim %d (C = %lld), %s", op,
            shp(t), shp(x), cd, (long long)x->shape[cd], shp_of(x->ndim - 1, want));
    if (cd == x->ndim - 1)
        return t_handle(cross_entropy(x, t, w, o.ignore_index, o.reduction, o.label_smoothing));
    if (op_grad_mode() && x->requires_grad && em_scope_depth() == 0)
        return em_fail(EM_ERR_SCOPE, "%s: recording a gradient needs an open step scope (em_scope_begin)",
                       op);
    /* the classes last: a permuted view, (N,C,d1,...) -> (N,d1,...,C) */
    int perm[EM_MAX_DIMS];
    for (int d = 0, k = 0; d < x->ndim; d++)
        if (d != cd) perm[k++] = d;
    perm[x->ndim - 1] = cd;
    tensor *xp = t_permute(x, perm);
    tensor *r = xp ? cross_entropy(xp, t, w, o.ignore_index, o.reduction, o.label_smoothing) : NULL;
    t_drop(xp);
    return t_handle(r);
}
