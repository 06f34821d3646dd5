/* ops_loss.c — cross-entropy: fused, stable log-softmax + negative
 * log-likelihood, mean over the targets that are not ignore_index.
 *
 * Targets are range-checked before anything is allocated. The forward saves
 * each row's log-sum-exp and the targets in the node (scope arena); the
 * backward writes (softmax - onehot) * g / count directly, zero rows for
 * ignored targets. f16/bf16 logits are computed in f32. The op goes
 * through the dispatcher (tensor/dispatch.h) with inputs (logits, targets);
 * ip[0] is ignore_index. */
#include "dispatch.h"
#include "kernel_impl.h"
#include "rows_impl.h"
#if EM_HAVE_CUDA
#include "cuda_nn.h"
#endif

typedef struct ce_ctx {
    bool f64;
    int64_t rows, C, nparts, ignore;
    const void *x;      /* logits rows (rows, C) */
    const int32_t *tgt; /* (rows) */
    double *lse;        /* (rows) log-sum-exp per row */
    double *part_loss;  /* forward: per part */
    int64_t *part_count;
    void *dx;     /* backward: (rows, C) */
    double scale; /* backward: g / count */
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

/* loss_r = lse_r - x[r, t_r]; part q sums its rows' losses and counts them. */
static void ce_fwd(void *p, int64_t lo, int64_t hi)
{
    ce_ctx *c = p;
    for (int64_t q = lo; q < hi; q++) {
        double loss = 0;
        int64_t count = 0;
        int64_t r0 = c->rows * q / c->nparts, r1 = c->rows * (q + 1) / c->nparts;
        for (int64_t r = r0; r < r1; r++) {
            int64_t t = c->tgt[r];
            if (t == c->ignore) {
                c->lse[r] = 0;
                continue;
            }
            double l, xt;
            if (c->f64) {
                const double *x = (const double *)c->x + r * c->C;
                l = lse_f64(x, c->C);
                xt = x[t];
            } else {
                const float *x = (const float *)c->x + r * c->C;
                l = lse_f32(x, c->C);
                xt = x[t];
            }
            c->lse[r] = l;
            loss += l - xt;
            count++;
        }
        c->part_loss[q] = loss;
        c->part_count[q] = count;
    }
}

/* d loss / d x[r, j] = (exp(x[r, j] - lse_r) - [j == t_r]) * g / count; 0 for ignored rows */
static void ce_bwd(void *p, int64_t lo, int64_t hi)
{
    ce_ctx *c = p;
    int64_t C = c->C;
    for (int64_t r = lo; r < hi; r++) {
        int64_t t = c->tgt[r];
        bool skip = t == c->ignore;
        if (c->f64) {
            const double *x = (const double *)c->x + r * C;
            double *d = (double *)c->dx + r * C;
            for (int64_t j = 0; j < C; j++) d[j] = skip ? 0 : (exp(x[j] - c->lse[r]) - (j == t)) * c->scale;
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
            float f = (float)(exp((double)m - c->lse[r]) * c->scale);
            for (int64_t j = 0; j < C; j++) d[j] *= f;
            d[t] -= (float)c->scale;
        }
    }
}

typedef struct ce_saved {
    double *lse;
    int32_t *tgt;
    int64_t count;
} ce_saved;

static em_status ce_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    ce_saved *sv = n->saved;
    int last = x->ndim - 1;
    int64_t C = x->shape[last];
    tensor *dx = t_new(x->dtype, x->ndim, x->shape);
    if (!dx) return em_last_status();
    double gv = ld(g->dtype, t_ptr(g));
    ce_ctx c = {.f64 = rows_dtype(x->dtype) == EM_F64,
                .rows = C ? t_numel(x) / C : 0,
                .C = C,
                .ignore = n->ip[0],
                .tgt = sv->tgt,
                .lse = sv->lse,
                .scale = gv / (double)sv->count};
    size_t m = tmp_mark();
    bool ok = (c.x = rows_in(x, last)) && (c.dx = rows_out(dx, last));
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
    tensor *stats; /* f64 (3*rows + 1): max, lse, loss per row; count (cuda_nn.h) */
} ce_cuda_saved;

static em_status ce_backward_cuda(node *n, tensor *g)
{
    tensor *x = n->in[0];
    ce_cuda_saved *sv = n->saved;
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = t_numel(sv->tgt);
    tensor *xr = nn_rows(x, last), *dx = xr ? t_new_like(x) : NULL;
    em_status s = dx ? cu_cross_entropy_bwd(x->device.index, x->dtype, t_ptr(xr), t_ptr(sv->tgt), rows, C,
                                            n->ip[0], t_ptr(sv->stats), g->dtype, t_ptr(g), t_ptr(dx))
                     : em_last_status();
    if (xr && xr != x) t_drop(xr);
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
    tensor *stats = ok ? t_new_on(x->device, EM_F64, 1, (const int64_t[]){3 * rows + 1}) : NULL;
    if (!stats) {
        t_drop(tv);
        return false;
    }
    *sv = (ce_cuda_saved){tv, stats};
    return true;
}

/* the loss of c->in[0] against c->saved's targets; stats to c->saved's */
static em_status ce_cuda(const op_call *c, tensor *out)
{
    tensor *x = c->in[0];
    const ce_cuda_saved *sv = c->saved;
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = t_numel(sv->tgt);
    tensor *xr = nn_rows(x, last);
    em_status s = xr ? cu_cross_entropy_fwd(x->device.index, x->dtype, t_ptr(xr), t_ptr(sv->tgt), rows, C,
                                            (int)c->ip[0], t_ptr(sv->stats), t_ptr(out))
                     : em_last_status();
    if (xr && xr != x) t_drop(xr);
    return s;
}
#endif

/* the loss of c->in[0] against the targets c->in[1] into out (0-dim); when
 * recording, c->saved is a ce_saved whose lse and tgt (scope memory) the
 * kernel fills, with the count of targets not ignored */
static em_status ce_cpu(const op_call *call, tensor *out)
{
    tensor *x = call->in[0], *tg = call->in[1];
    ce_saved *sv = call->saved;
    int last = x->ndim - 1;
    int64_t C = x->shape[last], rows = t_numel(tg);
    size_t m = tmp_mark();
    size_t lbytes = sizeof(double) * (size_t)(rows + 1), tbytes = sizeof(int32_t) * (size_t)(rows + 1);
    ce_ctx c = {.f64 = rows_dtype(x->dtype) == EM_F64, .rows = rows, .C = C, .ignore = call->ip[0]};
    int64_t per = (1 << 14) / (C + 1) + 1;
    c.nparts = rows / per < em_num_threads() ? rows / per : em_num_threads();
    if (c.nparts < 1) c.nparts = 1;
    bool ok = (c.lse = sv ? sv->lse : tmp_alloc(lbytes)) && (c.tgt = sv ? sv->tgt : tmp_alloc(tbytes)) &&
              (c.part_loss = tmp_alloc(sizeof(double) * (size_t)c.nparts)) &&
              (c.part_count = tmp_alloc(sizeof(int64_t) * (size_t)c.nparts)) && (c.x = rows_in(x, last));
    if (ok) {
        /* targets copied out contiguous: the node keeps them for the backward */
        int32_t *tv = (int32_t *)c.tgt;
        tensor th = *tg;
        storage s = {.data = tv, .nbytes = (size_t)rows * sizeof(int32_t), .refcount = 1, .in_arena = true};
        th.st = &s;
        th.offset = 0;
        t_contig_strides(th.ndim, th.shape, th.stride);
        copy_strided(&th, tg);
        parallel_for(c.nparts, 1, ce_fwd, &c);
        double loss = 0;
        int64_t count = 0;
        for (int64_t q = 0; q < c.nparts; q++) {
            loss += c.part_loss[q];
            count += c.part_count[q];
        }
        st(out->dtype, t_ptr(out), loss / (double)count); /* NaN when every target is ignored */
        if (sv) sv->count = count;
    }
    tmp_release(m);
    return ok ? EM_OK : em_last_status();
}

static const op_kernels ce_kernels = OP_KERNELS(ce_cpu, ce_cuda);

static tensor *cross_entropy(tensor *x, tensor *tg, int ignore)
{
    const char *op = "cross_entropy";
    tensor *in[2] = {x, tg};
    op_call c;
    if (!op_begin(&c, OP_CROSS_ENTROPY, 2, in)) return NULL;
    x = in[0], tg = in[1];
    if (!chk_dtype(op, tg, EM_I32, "targets")) return NULL;
    if (x->ndim < 1)
        return em_fail(EM_ERR_SHAPE, "%s: logits must have a class dim (...,C), got %s", op, shp(x));
    if (tg->ndim != x->ndim - 1 || memcmp(tg->shape, x->shape, sizeof(int64_t) * (size_t)tg->ndim))
        return em_fail(EM_ERR_SHAPE,
                       "%s: targets %s must have the shape of logits %s without the last dim, %s", op,
                       shp(tg), shp(x), shp_of(x->ndim - 1, x->shape));
    int64_t C = x->shape[x->ndim - 1], rows = t_numel(tg);
    bool cuda = c.dev.type == EM_CUDA;
    if (!cuda && !chk_targets(tg, C, ignore)) return NULL; /* CUDA: checked on a host copy */
    if (c.record && em_scope_depth() == 0)
        return em_fail(EM_ERR_SCOPE, "%s: recording a gradient needs an open step scope (em_scope_begin)",
                       op);
    c.ip[0] = ignore;
#if EM_HAVE_CUDA
    ce_cuda_saved cs = {0};
    if (cuda && !ce_cuda_prepare(&cs, x, tg, ignore)) return NULL;
#endif
    tensor *out = op_out(&c, x->dtype, 0, NULL);
    bool ok = out != NULL;
    if (ok && !cuda && c.record) { /* what backward reads, kept in the scope */
        ce_saved *sv = scope_alloc(sizeof *sv);
        size_t lbytes = sizeof(double) * (size_t)(rows + 1), tbytes = sizeof(int32_t) * (size_t)(rows + 1);
        ok = sv && (sv->lse = scope_alloc(lbytes)) && (sv->tgt = scope_alloc(tbytes));
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
    return t ? t_handle(cross_entropy(x, t, ignore_index)) : NULL;
}
