/* attention_heads.c — the heads of causal attention on the CPU: the
 * kernels of tensor/ops_attention.c's two ops ("attention" on q, k, v
 * (B,H,T,D), "attention_qkv" on views of one (B,T,3C) tensor), which see
 * every operand and result as a (B,H,T,D) tensor of any strides.
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
 * The heads read q, k, v and the output's gradient where they lie, and
 * write o, dq, dk, dv where they belong, whenever those are in the compute
 * dtype with unit stride along D (head_operand: a base, the batch and head
 * strides and a row stride): the q, k, v of a fused QKV projection, heads
 * D apart and rows 3C apart, and a (B,T,C) output with the heads merged,
 * need no copy. Other operands are copied to contiguous temp memory first,
 * other results written there and copied over after.
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
 * Either way every element of a result is computed the same way wherever
 * the result lies, so both ops give the same bits.
 * tests/test_attention_fused.c holds the two ways to each other and to f64. */
#include "kernel_impl.h"
#include "vmath_impl.h"

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

/* A (B,H,T,D) operand or result as the heads see it: head (b,h) starts at
 * p + (b sb + h sh) elements, its rows ld apart, unit stride along D. */
typedef struct head_operand {
    char *p;
    int64_t H, sb, sh, ld;
} head_operand;

static char *head_at(const head_operand *a, int64_t bh, size_t es)
{
    return (char *)at(a->p, (bh / a->H) * a->sb + (bh % a->H) * a->sh, es);
}

/* (B,H,T,D) t with unit stride along D as a head operand */
static head_operand head_layout(const tensor *t)
{
    int64_t H = t->shape[1] > 0 ? t->shape[1] : 1;
    return (head_operand){.p = t_ptr(t), .H = H, .sb = t->stride[0], .sh = t->stride[1], .ld = t->stride[2]};
}

/* *h: a contiguous tensor of t's shape in dtype ct over temp scratch (its
 * storage *s). false on OOM. */
static bool scratch_like(const tensor *t, em_dtype ct, tensor *h, storage *s)
{
    size_t n = (size_t)t_numel(t) * em_dtype_size(ct);
    void *buf = tmp_alloc(n + 1);
    if (!buf) return false;
    *s = (storage){.data = buf, .nbytes = n};
    *h = (tensor){.dtype = ct, .ndim = t->ndim, .st = s};
    memcpy(h->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    t_contig_strides(t->ndim, t->shape, h->stride);
    if (t->shape[3] == 0) h->stride[2] = 1; /* D == 0: no head runs; a row stride the GEMMs accept */
    return true;
}

/* t (B,H,T,D) as a head operand: t's own memory when it is in the compute
 * dtype with unit stride along D (the q, k, v of a fused QKV projection
 * are such strided views: no copy), else a contiguous copy in temp
 * scratch. false on OOM. */
static bool as_heads(tensor *t, em_dtype ct, head_operand *a)
{
    int64_t D = t->shape[3];
    if (t->dtype == ct && t->stride[3] == 1 && t->stride[2] >= D && t->stride[2] > 0) {
        *a = head_layout(t);
        return true;
    }
    tensor h;
    storage s;
    if (!scratch_like(t, ct, &h, &s)) return false;
    copy_strided(&h, t);
    *a = head_layout(&h);
    return true;
}

/* Where the heads write result t (B,H,T,D): t itself when it is in the
 * compute dtype with unit stride along D, else the contiguous scratch *h
 * (over *s), which the caller copies into t once the heads are done
 * (copy_strided: the one rounding to t's dtype). NULL on OOM. */
static tensor *heads_out(tensor *t, em_dtype ct, tensor *h, storage *s)
{
    if (t->dtype == ct && (t->stride[3] == 1 || t->shape[3] <= 1) && t->stride[2] >= t->shape[3]) return t;
    return scratch_like(t, ct, h, s) ? h : NULL;
}

/* One call's heads: operands, outputs, and what every head shares. */
typedef struct heads_ctx {
    em_dtype ct;
    int64_t T, D;
    double scale;
    head_operand q, k, v, go;   /* go: the output's gradient */
    const void *P;              /* (B*H,T,T) */
    head_operand o, gq, gk, gv; /* results: forward o, backward the three gradients */
    bool fused;                 /* f32 heads on the fused kernel (attention_fused_usable) */
    int failed;                 /* a range had no memory for its scratch (set atomically) */
} heads_ctx;

/* Head h, forward. Per block of query rows [i0,i1): S = q[i0:i1] k[0:i1]^T
 * * scale; then P = masked softmax(S) by rows; then o[i0:i1] = P[i0:i1,
 * 0:i1] v[0:i1]. */
static void head_forward(const heads_ctx *c, int64_t h)
{
    em_dtype ct = c->ct;
    int64_t T = c->T, D = c->D, lq = c->q.ld, lk = c->k.ld, lv = c->v.ld, lo = c->o.ld;
    size_t es = em_dtype_size(ct);
    const void *q = head_at(&c->q, h, es), *k = head_at(&c->k, h, es), *v = head_at(&c->v, h, es);
    void *o = head_at(&c->o, h, es), *P = (void *)at(c->P, h * T * T, es);
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
                (void *)at(o, i0 * lo, es), lo);
    }
}

/* The (T,D) rows of a head's result, ld apart, set to 0 */
static void zero_rows(void *p, int64_t ld, int64_t T, int64_t D, size_t es)
{
    if (ld == D) {
        memset(p, 0, (size_t)(T * D) * es);
        return;
    }
    for (int64_t i = 0; i < T; i++) memset((char *)p + i * ld * (int64_t)es, 0, (size_t)D * es);
}

/* Head h, backward, blocks of query rows as in forward:
 * dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dP * P));
 * dQ = dS K * scale;  dK = dS^T Q * scale.  ds: (T,T) scratch. */
static void head_backward(const heads_ctx *c, int64_t h, void *ds)
{
    em_dtype ct = c->ct;
    int64_t T = c->T, D = c->D, lq = c->q.ld, lk = c->k.ld, lv = c->v.ld, lg = c->go.ld;
    int64_t lgq = c->gq.ld, lgk = c->gk.ld, lgv = c->gv.ld;
    size_t es = em_dtype_size(ct);
    const void *q = head_at(&c->q, h, es), *k = head_at(&c->k, h, es), *v = head_at(&c->v, h, es);
    const void *go = head_at(&c->go, h, es), *P = at(c->P, h * T * T, es);
    void *gq = head_at(&c->gq, h, es), *gk = head_at(&c->gk, h, es), *gv = head_at(&c->gv, h, es);
    zero_rows(gk, lgk, T, D, es);
    zero_rows(gv, lgv, T, D, es);
    for (int64_t i0 = 0; i0 < T; i0 += ROW_BLOCK) {
        int64_t i1 = i0 + ROW_BLOCK < T ? i0 + ROW_BLOCK : T, m = i1 - i0;
        em_gemm(ct, true, false, i1, D, m, 1.0, at(P, i0 * T, es), T, at(go, i0 * lg, es), lg, 1.0, gv, lgv);
        em_gemm(ct, false, true, m, i1, D, 1.0, at(go, i0 * lg, es), lg, v, lv, 0.0,
                (void *)at(ds, i0 * T, es), T);
    }
    rows_ctx rc = {.T = T, .f64 = ct == EM_F64, .scale = c->scale, .p = (void *)P, .ds = ds};
    parallel_for(T, 32, ct == EM_F32 ? dsoftmax_rows_f32 : dsoftmax_rows_f64, &rc);
    for (int64_t i0 = 0; i0 < T; i0 += ROW_BLOCK) {
        int64_t i1 = i0 + ROW_BLOCK < T ? i0 + ROW_BLOCK : T, m = i1 - i0;
        em_gemm(ct, false, false, m, D, i1, 1.0, at(ds, i0 * T, es), T, k, lk, 0.0,
                (void *)at(gq, i0 * lgq, es), lgq);
        em_gemm(ct, true, false, i1, D, m, 1.0, at(ds, i0 * T, es), T, at(q, i0 * lq, es), lq, 1.0, gk, lgk);
    }
}

/* ---- the fused f32 head (tensor/attention_avx2.c) --------------------------------- */

/* head h of a, NULL when a has no memory (a result the call does not make) */
static float *head_f32(const head_operand *a, int64_t h)
{
    return a->p ? (float *)head_at(a, h, sizeof(float)) : NULL;
}

static attn_head_f32 fused_head(const heads_ctx *c, int64_t h)
{
    return (attn_head_f32){.T = c->T,
                           .D = c->D,
                           .scale = (float)c->scale,
                           .q = head_f32(&c->q, h),
                           .k = head_f32(&c->k, h),
                           .v = head_f32(&c->v, h),
                           .go = head_f32(&c->go, h),
                           .lq = c->q.ld,
                           .lk = c->k.ld,
                           .lv = c->v.ld,
                           .lg = c->go.ld,
                           .P = (float *)c->P + h * c->T * c->T,
                           .o = head_f32(&c->o, h),
                           .gq = head_f32(&c->gq, h),
                           .gk = head_f32(&c->gk, h),
                           .gv = head_f32(&c->gv, h),
                           .lo = c->o.ld,
                           .lgq = c->gq.ld,
                           .lgk = c->gk.ld,
                           .lgv = c->gv.ld};
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

/* ---- the ops' kernels (kernel_impl.h) -------------------------------------------- */

em_status attention_heads_forward(const char *op, double scale, void *P, tensor *q, tensor *k, tensor *v,
                                  tensor *o)
{
    em_dtype ct = attention_compute_dtype(q->dtype);
    size_t es = em_dtype_size(ct);
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3];
    size_t mk = tmp_mark();
    /* P lives as long as the tape when it is saved, else only for this call */
    if (!P) P = tmp_alloc((size_t)(BH * T * T) * es + 1);
    heads_ctx hc = {.ct = ct, .T = T, .D = D, .scale = scale, .P = P};
    tensor scratch;
    storage ss;
    tensor *w = P ? heads_out(o, ct, &scratch, &ss) : NULL;
    if (!w || !as_heads(q, ct, &hc.q) || !as_heads(k, ct, &hc.k) || !as_heads(v, ct, &hc.v)) {
        tmp_release(mk);
        return em_last_status();
    }
    hc.o = head_layout(w);
    hc.fused = ct == EM_F32 && attention_fused_usable(T, D);
    if (D > 0 && !run_heads(&hc, BH, false)) {
        tmp_release(mk);
        return em_err(EM_ERR_OOM, "%s: no memory for a head's scratch (T=%lld, D=%lld)", op, (long long)T,
                      (long long)D);
    }
    if (w != o) copy_strided(o, w);
    tmp_release(mk);
    return EM_OK;
}

em_status attention_heads_backward(const char *op, double scale, const void *P, tensor *q, tensor *k,
                                   tensor *v, tensor *g, tensor *const d[3])
{
    em_dtype ct = attention_compute_dtype(q->dtype);
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3];
    size_t mk = tmp_mark();
    heads_ctx hc = {.ct = ct, .T = T, .D = D, .scale = scale, .P = P};
    tensor scratch[3], *w[3] = {NULL, NULL, NULL};
    storage ss[3];
    bool ok =
        as_heads(q, ct, &hc.q) && as_heads(k, ct, &hc.k) && as_heads(v, ct, &hc.v) && as_heads(g, ct, &hc.go);
    for (int i = 0; i < 3 && ok; i++) ok = (w[i] = heads_out(d[i], ct, &scratch[i], &ss[i])) != NULL;
    if (!ok) {
        tmp_release(mk);
        return em_last_status();
    }
    hc.gq = head_layout(w[0]);
    hc.gk = head_layout(w[1]);
    hc.gv = head_layout(w[2]);
    hc.fused = ct == EM_F32 && attention_fused_usable(T, D);
    if (D > 0 && !run_heads(&hc, BH, true)) { /* D == 0: the gradients are empty */
        tmp_release(mk);
        return em_err(EM_ERR_OOM, "%s backward: no memory for a (%lld,%lld) scratch matrix", op, (long long)T,
                      (long long)T);
    }
    for (int i = 0; i < 3; i++)
        if (w[i] != d[i]) copy_strided(d[i], w[i]);
    tmp_release(mk);
    return EM_OK;
}
