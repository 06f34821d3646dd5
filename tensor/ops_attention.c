/* ops_attention.c — causal scaled-dot-product attention as one op:
 * q, k, v (B,H,T,D) -> (B,H,T,D), position i attending to positions j <= i.
 *
 * Forward, per head (b,h):  S = q k^T * scale (T,T), P = softmax(S) row-wise
 * over j <= i (0 above the diagonal), O = P v. P (B,H,T,T) is kept in the
 * step scope for backward (recomputing it there would cost the forward's
 * S and exp again; at the GPT shapes P is under 1 MB a layer). The heads
 * are split over ember's pool (parallel_for over B*H): each thread runs
 * whole heads, so a step of small heads (the tiny GPT: 48 heads of 64x32)
 * pays one pool hand-off per call. f32 and f64 are computed as they are;
 * f16/bf16 through f32.
 *
 * Two ways to run a head:
 * - fused (f32, 1 <= T <= 256, 1 <= D <= 128, an AVX2+FMA CPU:
 *   attention_fused_usable): tensor/attention_avx2.c, every product a loop
 *   of register tiles over the causal triangle, no GEMM call. A single head
 *   (B*H == 1) is split over the pool by blocks of query rows (backward:
 *   then by blocks of key rows); each element is computed the same way
 *   however the blocks fall, so the bits do not depend on the thread count.
 * - portable (f64, longer T, wider D, other CPUs): per-head GEMMs
 *   (sgemm/dgemm) and row passes; query rows go in blocks of ROW_BLOCK so
 *   the keys after a block's last row (all masked) are never multiplied.
 *   With a single head the head's GEMMs and row passes are split over the
 *   pool instead.
 * tests/test_attention_fused.c holds the two to each other and to f64.
 *
 * On a CUDA device the op is one fused kernel (tensor/ops_matmul.cu,
 * flash-attention style): P is never stored; the forward saves the
 * log-sum-exp of each row (B,H,T) instead, and the backward recomputes P
 * from it (see attention_cuda below). The op goes through the dispatcher
 * (tensor/dispatch.h); the node it records is "attention". */
#include <cblas.h>
#include <limits.h>

#include "dispatch.h"
#include "kernel_impl.h"
#include "vmath_impl.h"
#if EM_HAVE_CUDA
#include "cuda_matmul.h"
#endif

enum { ROW_BLOCK = 256 }; /* query rows per GEMM block: keys past the block's last row are skipped */

static const char *at(const void *p, int64_t off, size_t es) { return (const char *)p + off * (int64_t)es; }

/* The row pass of one head: rows [lo,hi) of the (T,T) matrices. */
typedef struct rows_ctx {
    int64_t T;
    bool f64;
    double scale;
    void *p;  /* forward: S in, P out; backward: P */
    void *ds; /* backward: dP in, dS * scale out */
} rows_ctx;

/* p_ij = exp(s_ij - max_j s_ij) / sum, over j <= i; 0 for j > i */
static void softmax_rows(void *ctx, int64_t lo, int64_t hi)
{
    rows_ctx *c = ctx;
    int64_t T = c->T;
    for (int64_t i = lo; i < hi; i++) {
        if (!c->f64) {
            float *s = (float *)c->p + i * T, m = s[0], sum = 0.0f;
            for (int64_t j = 1; j <= i; j++) m = s[j] > m ? s[j] : m;
            for (int64_t j = 0; j <= i; j++) s[j] = vexpf(s[j] - m);
            for (int64_t j = 0; j <= i; j++) sum += s[j];
            float inv = 1.0f / sum;
            for (int64_t j = 0; j <= i; j++) s[j] *= inv;
            for (int64_t j = i + 1; j < T; j++) s[j] = 0.0f;
        } else {
            double *s = (double *)c->p + i * T, m = s[0], sum = 0.0;
            for (int64_t j = 1; j <= i; j++) m = s[j] > m ? s[j] : m;
            for (int64_t j = 0; j <= i; j++) sum += (s[j] = exp(s[j] - m));
            double inv = 1.0 / sum;
            for (int64_t j = 0; j <= i; j++) s[j] *= inv;
            for (int64_t j = i + 1; j < T; j++) s[j] = 0.0;
        }
    }
}

/* ds_ij = p_ij (dp_ij - sum_j dp_ij p_ij) * scale over j <= i; 0 for j > i */
static void dsoftmax_rows_f32(void *ctx, int64_t lo, int64_t hi)
{
    rows_ctx *c = ctx;
    int64_t T = c->T;
    float scale = (float)c->scale;
    for (int64_t i = lo; i < hi; i++) {
        const float *p = (const float *)c->p + i * T;
        float *d = (float *)c->ds + i * T, r = 0.0f;
        for (int64_t j = 0; j <= i; j++) r += d[j] * p[j];
        for (int64_t j = 0; j <= i; j++) d[j] = p[j] * (d[j] - r) * scale;
        for (int64_t j = i + 1; j < T; j++) d[j] = 0.0f;
    }
}

static void dsoftmax_rows_f64(void *ctx, int64_t lo, int64_t hi)
{
    rows_ctx *c = ctx;
    int64_t T = c->T;
    for (int64_t i = lo; i < hi; i++) {
        const double *p = (const double *)c->p + i * T;
        double *d = (double *)c->ds + i * T, r = 0.0;
        for (int64_t j = 0; j <= i; j++) r += d[j] * p[j];
        for (int64_t j = 0; j <= i; j++) d[j] = p[j] * (d[j] - r) * c->scale;
        for (int64_t j = i + 1; j < T; j++) d[j] = 0.0;
    }
}

/* ---- the heads ------------------------------------------------------------------ */

static em_dtype compute_dtype(em_dtype dt) { return dt == EM_F64 ? EM_F64 : EM_F32; }

/* A (B,H,T,D) operand as the per-head GEMMs read it: head (b,h) starts at
 * p + (b sb + h sh) elements, its rows ld apart. */
typedef struct head_operand {
    const char *p;
    int64_t H, sb, sh, ld;
} head_operand;

static const void *head_at(const head_operand *a, int64_t bh, size_t es)
{
    return at(a->p, (bh / a->H) * a->sb + (bh % a->H) * a->sh, es);
}

/* t as a head operand: t's own memory when it is in the compute dtype with
 * unit stride along D (the q, k, v of a fused QKV projection are such
 * strided views: no copy), else a contiguous copy in temp scratch. false on
 * OOM. */
static bool as_heads(tensor *t, em_dtype ct, head_operand *a)
{
    int64_t H = t->shape[1] > 0 ? t->shape[1] : 1, T = t->shape[2], D = t->shape[3];
    if (t->dtype == ct && t->stride[3] == 1 && t->stride[2] >= D && t->stride[2] > 0) {
        *a =
            (head_operand){.p = t_ptr(t), .H = H, .sb = t->stride[0], .sh = t->stride[1], .ld = t->stride[2]};
        return true;
    }
    void *buf = tmp_alloc((size_t)t_numel(t) * em_dtype_size(ct) + 1);
    if (!buf) return false;
    storage s = {.data = buf, .nbytes = (size_t)t_numel(t) * em_dtype_size(ct)};
    tensor h = {.dtype = ct, .ndim = t->ndim, .st = &s};
    memcpy(h.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    t_contig_strides(t->ndim, t->shape, h.stride);
    copy_strided(&h, t);
    *a = (head_operand){.p = buf, .H = H, .sb = H * T * D, .sh = T * D, .ld = D > 0 ? D : 1};
    return true;
}

/* One call's heads: operands, outputs, and what every head shares. */
typedef struct heads_ctx {
    em_dtype ct;
    int64_t T, D;
    double scale;
    head_operand q, k, v, go; /* go: the output's gradient */
    const void *P;            /* (B*H,T,T) */
    char *o, *gq, *gk, *gv;   /* (B*H,T,D) contiguous */
    bool fused;               /* f32 heads on the fused kernel (attention_fused_usable) */
    int failed;               /* a range had no memory for its scratch (set atomically) */
} heads_ctx;

/* Head h, forward. Per block of query rows [i0,i1): S = q[i0:i1] k[0:i1]^T
 * * scale; then P = masked softmax(S) by rows; then o[i0:i1] = P[i0:i1,
 * 0:i1] v[0:i1]. */
static void head_forward(const heads_ctx *c, int64_t h)
{
    em_dtype ct = c->ct;
    int64_t T = c->T, D = c->D, lq = c->q.ld, lk = c->k.ld, lv = c->v.ld;
    size_t es = em_dtype_size(ct);
    const void *q = head_at(&c->q, h, es), *k = head_at(&c->k, h, es), *v = head_at(&c->v, h, es);
    void *o = c->o + h * T * D * (int64_t)es, *P = (void *)at(c->P, h * T * T, es);
    for (int64_t i0 = 0; i0 < T; i0 += ROW_BLOCK) {
        int64_t i1 = i0 + ROW_BLOCK < T ? i0 + ROW_BLOCK : T;
        em_gemm(ct, false, true, i1 - i0, i1, D, c->scale, at(q, i0 * lq, es), lq, k, lk, 0.0,
                (void *)at(P, i0 * T, es), T);
    }
    rows_ctx rc = {.T = T, .f64 = ct == EM_F64, .p = P};
    parallel_for(T, 32, softmax_rows, &rc);
    for (int64_t i0 = 0; i0 < T; i0 += ROW_BLOCK) {
        int64_t i1 = i0 + ROW_BLOCK < T ? i0 + ROW_BLOCK : T;
        em_gemm(ct, false, false, i1 - i0, D, i1, 1.0, at(P, i0 * T, es), T, v, lv, 0.0,
                (void *)at(o, i0 * D, es), D);
    }
}

/* Head h, backward, blocks of query rows as in forward:
 * dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dP * P));
 * dQ = dS K * scale;  dK = dS^T Q * scale.  ds: (T,T) scratch. */
static void head_backward(const heads_ctx *c, int64_t h, void *ds)
{
    em_dtype ct = c->ct;
    int64_t T = c->T, D = c->D, lq = c->q.ld, lk = c->k.ld, lv = c->v.ld, lg = c->go.ld;
    size_t es = em_dtype_size(ct);
    const void *q = head_at(&c->q, h, es), *k = head_at(&c->k, h, es), *v = head_at(&c->v, h, es);
    const void *go = head_at(&c->go, h, es), *P = at(c->P, h * T * T, es);
    int64_t off = h * T * D * (int64_t)es;
    void *gq = c->gq + off, *gk = c->gk + off, *gv = c->gv + off;
    memset(gk, 0, (size_t)(T * D) * es);
    memset(gv, 0, (size_t)(T * D) * es);
    for (int64_t i0 = 0; i0 < T; i0 += ROW_BLOCK) {
        int64_t i1 = i0 + ROW_BLOCK < T ? i0 + ROW_BLOCK : T, m = i1 - i0;
        em_gemm(ct, true, false, i1, D, m, 1.0, at(P, i0 * T, es), T, at(go, i0 * lg, es), lg, 1.0, gv, D);
        em_gemm(ct, false, true, m, i1, D, 1.0, at(go, i0 * lg, es), lg, v, lv, 0.0,
                (void *)at(ds, i0 * T, es), T);
    }
    rows_ctx rc = {.T = T, .f64 = ct == EM_F64, .scale = c->scale, .p = (void *)P, .ds = ds};
    parallel_for(T, 32, ct == EM_F32 ? dsoftmax_rows_f32 : dsoftmax_rows_f64, &rc);
    for (int64_t i0 = 0; i0 < T; i0 += ROW_BLOCK) {
        int64_t i1 = i0 + ROW_BLOCK < T ? i0 + ROW_BLOCK : T, m = i1 - i0;
        em_gemm(ct, false, false, m, D, i1, 1.0, at(ds, i0 * T, es), T, k, lk, 0.0,
                (void *)at(gq, i0 * D, es), D);
        em_gemm(ct, true, false, i1, D, m, 1.0, at(ds, i0 * T, es), T, at(q, i0 * lq, es), lq, 1.0, gk, D);
    }
}

/* ---- the fused f32 head (tensor/attention_avx2.c) --------------------------------- */

static attn_head_f32 fused_head(const heads_ctx *c, int64_t h)
{
    int64_t off = h * c->T * c->D;
    const float *go = c->go.p ? head_at(&c->go, h, sizeof(float)) : NULL;
    return (attn_head_f32){.T = c->T,
                           .D = c->D,
                           .scale = (float)c->scale,
                           .q = head_at(&c->q, h, sizeof(float)),
                           .k = head_at(&c->k, h, sizeof(float)),
                           .v = head_at(&c->v, h, sizeof(float)),
                           .go = go,
                           .lq = c->q.ld,
                           .lk = c->k.ld,
                           .lv = c->v.ld,
                           .lg = c->go.ld,
                           .P = (float *)c->P + h * c->T * c->T,
                           .o = c->o ? (float *)c->o + off : NULL,
                           .gq = c->gq ? (float *)c->gq + off : NULL,
                           .gk = c->gk ? (float *)c->gk + off : NULL,
                           .gv = c->gv ? (float *)c->gv + off : NULL};
}

static int64_t row_blocks(int64_t T) { return (T + ATTN_ROWS - 1) / ATTN_ROWS; }

/* The (ATTN_ROWS, round16(T)) strip of a forward range */
static size_t strip_bytes(int64_t T) { return sizeof(float) * (size_t)(ATTN_ROWS * ((T + 15) / 16 * 16)); }

/* One head split by blocks of rows over the pool: its packed operands are
 * made once (split_head.scratch) and shared. */
typedef struct split_head {
    attn_head_f32 h;
    float *scratch;
    int *failed;
} split_head;

static void split_forward(void *ctx, int64_t lo, int64_t hi)
{
    split_head *s = ctx;
    size_t mk = tmp_mark();
    float *strip = tmp_alloc(strip_bytes(s->h.T));
    if (strip)
        attention_fused_forward_rows(&s->h, lo, hi, s->scratch, strip);
    else
        __atomic_store_n(s->failed, 1, __ATOMIC_RELAXED);
    tmp_release(mk);
}

static void split_backward_rows(void *ctx, int64_t lo, int64_t hi)
{
    split_head *s = ctx;
    attention_fused_backward_rows(&s->h, lo, hi, s->scratch);
}

static void split_backward_keys(void *ctx, int64_t lo, int64_t hi)
{
    split_head *s = ctx;
    attention_fused_backward_keys(&s->h, lo, hi, s->scratch);
}

/* The single head (BH == 1) of a fused call, its row blocks over the pool;
 * false when scratch runs out. */
static bool fused_single_head(heads_ctx *c, bool backward)
{
    size_t mk = tmp_mark();
    split_head s = {.h = fused_head(c, 0), .failed = &c->failed};
    s.scratch = tmp_alloc(sizeof(float) * attention_fused_scratch(c->T, c->D));
    if (!s.scratch) {
        tmp_release(mk);
        return false;
    }
    attention_fused_prepare(&s.h, backward, s.scratch);
    int64_t nb = row_blocks(c->T);
    if (!backward) {
        parallel_for(nb, 4, split_forward, &s);
    } else {
        parallel_for(nb, 4, split_backward_rows, &s);
        parallel_for(nb, 4, split_backward_keys, &s);
    }
    tmp_release(mk);
    return !c->failed;
}

/* ---- the heads over the pool ----------------------------------------------------- */

/* Heads [lo,hi), each run whole by the thread that claims it. */
static void heads_forward(void *ctx, int64_t lo, int64_t hi)
{
    heads_ctx *c = ctx;
    if (!c->fused) {
        for (int64_t h = lo; h < hi; h++) head_forward(c, h);
        return;
    }
    size_t mk = tmp_mark();
    float *scratch = tmp_alloc(sizeof(float) * attention_fused_scratch(c->T, c->D) + strip_bytes(c->T));
    if (!scratch) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *strip = scratch + attention_fused_scratch(c->T, c->D);
    for (int64_t h = lo; h < hi; h++) {
        attn_head_f32 a = fused_head(c, h);
        attention_fused_prepare(&a, false, scratch);
        attention_fused_forward_rows(&a, 0, row_blocks(c->T), scratch, strip);
    }
    tmp_release(mk);
}

static void heads_backward(void *ctx, int64_t lo, int64_t hi)
{
    heads_ctx *c = ctx;
    size_t mk = tmp_mark(); /* the temp arena is the running thread's */
    /* this range's scratch: the fused head's, else a (T,T) matrix */
    size_t n = c->fused ? sizeof(float) * attention_fused_scratch(c->T, c->D)
                        : (size_t)(c->T * c->T) * em_dtype_size(c->ct) + 1;
    void *ds = tmp_alloc(n);
    if (!ds) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t h = lo; h < hi; h++) {
        if (!c->fused) {
            head_backward(c, h, ds);
            continue;
        }
        attn_head_f32 a = fused_head(c, h);
        attention_fused_prepare(&a, true, ds);
        attention_fused_backward_rows(&a, 0, row_blocks(c->T), ds);
        attention_fused_backward_keys(&a, 0, row_blocks(c->T), ds);
    }
    tmp_release(mk);
}

/* The call's heads over the pool: whole heads per thread, or a single
 * head's row blocks (fused only; the portable path splits its GEMMs).
 * false (c->failed) when scratch ran out. */
static bool run_heads(heads_ctx *c, int64_t BH, bool backward)
{
    if (c->fused && BH == 1) return fused_single_head(c, backward);
    parallel_for(BH, 1, backward ? heads_backward : heads_forward, c);
    return !c->failed;
}

/* ---- plumbing ------------------------------------------------------------------ */

/* The backward's call: in = {q, k, v, out, g} (out the forward's output,
 * g its gradient), the scale in dp[0]; out is dq and c.saved points to this:
 * what the forward saved (the node's saved) and dk, dv. The gradients have
 * q's shape and dtype. */
typedef struct attn_grads {
    void *saved;
    tensor *dk, *dv;
} attn_grads;

/* On the CPU: per head from P (B,H,T,T, compute dtype), in the compute dtype */
static em_status attention_grad_cpu(const op_call *c, tensor *dq)
{
    const attn_grads *o = c->saved;
    tensor *q = c->in[0], *g = c->in[4], *grads[3] = {dq, o->dk, o->dv};
    em_dtype dt = q->dtype, ct = compute_dtype(dt);
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3], n = t_numel(q);
    size_t es = em_dtype_size(ct);
    size_t mk = tmp_mark();
    heads_ctx hc = {.ct = ct, .T = T, .D = D, .scale = c->dp[0], .P = o->saved};
    char *gp[3];
    bool ok = as_heads(q, ct, &hc.q) && as_heads(c->in[1], ct, &hc.k) && as_heads(c->in[2], ct, &hc.v) &&
              as_heads(g, ct, &hc.go);
    for (int i = 0; i < 3 && ok; i++) /* in the compute dtype: the outputs, else temp memory */
        ok = (gp[i] = dt == ct ? t_ptr(grads[i]) : tmp_alloc((size_t)n * es + 1)) != NULL;
    if (!ok) {
        tmp_release(mk);
        return em_last_status();
    }
    hc.gq = gp[0];
    hc.gk = gp[1];
    hc.gv = gp[2];
    hc.fused = ct == EM_F32 && attention_fused_usable(T, D);
    if (D > 0 && !run_heads(&hc, BH, true)) { /* D == 0: the gradients are empty */
        tmp_release(mk);
        return em_err(EM_ERR_OOM, "attention backward: no memory for a (%lld,%lld) scratch matrix",
                      (long long)T, (long long)T);
    }
    if (dt != ct)
        for (int i = 0; i < 3; i++) convert_par(dt, t_ptr(grads[i]), ct, gp[i], n);
    tmp_release(mk);
    return EM_OK;
}

#if EM_HAVE_CUDA
/* ---- CUDA ---------------------------------------------------------------------------
 * The node saves the (B,H,T) log-sum-exp tensor (n->saved, a scope tensor
 * on the device, f32; f64 for f64 inputs); the backward reads q, k, v from
 * n->in and the output from n->out. */

/* Contiguous copies of the tensors that are not (the rest as they are). */
static bool contig_all(int n, tensor *const *in, tensor **out)
{
    for (int i = 0; i < n; i++)
        if (!(out[i] = t_contig(in[i]))) return false;
    return true;
}

/* Drops out[i] where it is a copy of in[i]. */
static void drop_copies(int n, tensor *const *in, tensor *const *out)
{
    for (int i = 0; i < n; i++)
        if (out[i] && out[i] != in[i]) t_drop(out[i]);
}

/* On the device: one fused kernel, recomputing P from the log-sum-exp (a
 * device tensor); g in q's dtype */
static em_status attention_grad_cuda(const op_call *c, tensor *dq)
{
    const attn_grads *o = c->saved;
    tensor *q = c->in[0], *g = c->in[4];
    em_dtype dt = q->dtype;
    if (!o->saved) /* the forward failed after recording */
        return em_err(EM_ERR_AUTOGRAD, "attention backward: the forward of %s did not complete", shp(q));
    tensor *gc = g->dtype == dt ? g : t_cast(g, dt);
    if (!gc) return em_last_status();
    tensor *in[5] = {c->in[0], c->in[1], c->in[2], c->in[3], gc}, *cc[5] = {0};
    em_status s = contig_all(5, in, cc) ? EM_OK : em_last_status();
    if (!s)
        s = cu_attention_backward(q->device.index, dt, q->shape[0] * q->shape[1], q->shape[2], q->shape[3],
                                  c->dp[0], t_ptr(cc[0]), t_ptr(cc[1]), t_ptr(cc[2]), t_ptr(cc[3]),
                                  t_ptr(cc[4]), t_ptr((tensor *)o->saved), t_ptr(dq), t_ptr(o->dk),
                                  t_ptr(o->dv));
    drop_copies(5, in, cc);
    if (gc != g) t_drop(gc);
    return s;
}

/* The forward on the inputs' CUDA device (checked as attention_causal
 * checks them; the resolved scale in dp[0]); the (B,H,T) log-sum-exp goes
 * to the tensor in c->saved. */
static em_status attention_cuda(const op_call *c, tensor *out)
{
    tensor *q = c->in[0];
    tensor *in[3] = {c->in[0], c->in[1], c->in[2]}, *cc[3] = {0};
    em_status s = contig_all(3, in, cc) ? EM_OK : em_last_status();
    if (!s)
        s = cu_attention_forward(q->device.index, q->dtype, q->shape[0] * q->shape[1], q->shape[2],
                                 q->shape[3], c->dp[0], t_ptr(cc[0]), t_ptr(cc[1]), t_ptr(cc[2]), t_ptr(out),
                                 t_ptr((tensor *)c->saved));
    drop_copies(3, in, cc);
    return s;
}
#endif

static bool same_shape(const tensor *a, const tensor *b)
{
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

/* The forward on the CPU: the resolved scale in dp[0]; P (B,H,T,T) in
 * c->saved, scope memory allocated by the caller, when recording. */
static em_status attention_cpu(const op_call *c, tensor *out)
{
    tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    em_dtype dt = q->dtype, ct = compute_dtype(dt);
    size_t es = em_dtype_size(ct);
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3];
    size_t mk = tmp_mark();
    /* P lives as long as the tape when it is saved, else only for this call */
    void *P = c->saved ? c->saved : tmp_alloc((size_t)(BH * T * T) * es + 1);
    heads_ctx hc = {.ct = ct, .T = T, .D = D, .scale = c->dp[0], .P = P};
    char *o = dt == ct ? t_ptr(out) : tmp_alloc((size_t)t_numel(out) * es + 1);
    if (!P || !o || !as_heads(q, ct, &hc.q) || !as_heads(k, ct, &hc.k) || !as_heads(v, ct, &hc.v)) {
        tmp_release(mk);
        return em_last_status();
    }
    hc.o = o;
    hc.fused = ct == EM_F32 && attention_fused_usable(T, D);
    if (D > 0 && !run_heads(&hc, BH, false)) {
        tmp_release(mk);
        return em_err(EM_ERR_OOM, "attention: no memory for a head's scratch (T=%lld, D=%lld)", (long long)T,
                      (long long)D);
    }
    if (dt != ct) convert_n(dt, t_ptr(out), ct, o, t_numel(out));
    tmp_release(mk);
    return EM_OK;
}

static const op_kernels attention_kernels = OP_KERNELS(attention_cpu, attention_cuda);

static const op_kernels attention_grad_kernels = OP_KERNELS(attention_grad_cpu, attention_grad_cuda);

/* dq, dk, dv, all three computed; handed on for the inputs that require grad */
static em_status attention_backward(node *n, tensor *g)
{
    tensor *q = n->in[0], *in[5] = {n->in[0], n->in[1], n->in[2], n->out, g};
    op_call c;
    if (!op_begin_backward(&c, n, 5, in)) return em_last_status();
    attn_grads o = {.saved = n->saved};
    tensor *dq = op_out(&c, q->dtype, 4, q->shape);
    if (!dq || !(o.dk = op_out(&c, q->dtype, 4, q->shape)) || !(o.dv = op_out(&c, q->dtype, 4, q->shape)))
        return em_last_status();
    c.saved = &o;
    em_status s = op_run(&c, &attention_grad_kernels, dq);
    tensor *grads[3] = {dq, o.dk, o.dv};
    for (int i = 0; i < 3; i++) {
        if (!s && n->in[i]->requires_grad)
            s = op_grad(n->in[i], grads[i]); /* which may keep grads[i] */
        else
            t_drop(grads[i]);
    }
    return s;
}

static tensor *attention_causal(tensor *q, tensor *k, tensor *v, double scale)
{
    tensor *in[3] = {q, k, v};
    op_call c;
    if (!op_begin(&c, OP_ATTENTION, 3, in)) return NULL;
    q = in[0], k = in[1], v = in[2];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return em_fail(EM_ERR_SHAPE, "attention: q, k, v must be 4-D (B,H,T,D): q is %s, k is %s, v is %s",
                       shp(q), shp(k), shp(v));
    if (!same_shape(q, k) || !same_shape(q, v))
        return em_fail(EM_ERR_SHAPE, "attention: q, k, v must have the same shape: q is %s, k is %s, v is %s",
                       shp(q), shp(k), shp(v));
    if (!chk_same_dtype("attention", q, k) || !chk_same_dtype("attention", q, v)) return NULL;
    if (isnan(scale) || isinf(scale))
        return em_fail(EM_ERR_ARG, "attention: scale must be finite, got %g (<= 0 means 1/sqrt(D))", scale);
    if (c.record && em_scope_depth() == 0)
        return em_fail(EM_ERR_SCOPE,
                       "attention: recording a gradient needs an open step scope (em_scope_begin), "
                       "or run it under em_set_grad_enabled(false)");
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3];
    if (T > INT_MAX || D > INT_MAX)
        return em_fail(EM_ERR_UNSUPPORTED, "attention: T or D beyond BLAS's int range: q is %s", shp(q));
    if (scale <= 0) scale = D > 0 ? 1.0 / sqrt((double)D) : 1.0;
#if EM_HAVE_CUDA
    if (c.dev.type == EM_CUDA && D > CU_ATTENTION_MAX_D)
        return em_fail(EM_ERR_UNSUPPORTED,
                       "attention: head dim D = %lld is beyond the CUDA kernel's %d: q is %s", (long long)D,
                       (int)CU_ATTENTION_MAX_D, shp(q));
#endif
    tensor *out = op_out(&c, q->dtype, 4, q->shape);
    if (!out) return NULL;
    c.dp[0] = scale;
    /* what backward reads: on the CPU, P (B,H,T,T) in the scope arena (made
     * by the kernel in temp memory when not recording); on CUDA, the
     * log-sum-exp of each row, a (B,H,T) scope tensor (f64 for f64 inputs,
     * else f32) the kernel always writes */
    if (c.dev.type == EM_CUDA)
        c.saved = t_new_on(c.dev, q->dtype == EM_F64 ? EM_F64 : EM_F32, 3, q->shape);
    else if (c.record)
        c.saved = scope_alloc((size_t)(BH * T * T) * em_dtype_size(compute_dtype(q->dtype)) + 1);
    if ((c.dev.type == EM_CUDA || c.record) && !c.saved) {
        t_drop(out);
        return NULL;
    }
    if (op_run(&c, &attention_kernels, out)) {
        if (c.dev.type == EM_CUDA) t_drop(c.saved);
        t_drop(out);
        return NULL;
    }
    if (c.dev.type == EM_CUDA && !c.record) {
        t_drop(c.saved);
        c.saved = NULL;
    }
    tensor *r = op_end(&c, out, attention_backward);
    if (!r && c.dev.type == EM_CUDA) t_drop(c.saved); /* the lse, when recording failed */
    return r;
}

em_tensor *em_attention_causal(em_tensor *q, em_tensor *k, em_tensor *v, double scale)
{
    tensor *x = t_resolve(q, "attention"), *y = x ? t_resolve(k, "attention") : NULL;
    tensor *z = y ? t_resolve(v, "attention") : NULL;
    return z ? t_handle(attention_causal(x, y, z, scale)) : NULL;
}
