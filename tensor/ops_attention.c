/* ops_attention.c — causal scaled-dot-product attention as one op:
 * q, k, v (B,H,T,D) -> (B,H,T,D), position i attending to positions j <= i.
 *
 * Forward, per head (b,h):  S = q k^T * scale (T,T), P = softmax(S) row-wise
 * over j <= i (0 above the diagonal), O = P v. P (B,H,T,T) is kept in the
 * step scope for backward. Heads run in parallel (parallel_for over B*H), each
 * with plain loops written so the innermost loop is a contiguous axpy the
 * compiler vectorises: S rows are built from k transposed into scratch.
 * f32 and f64 have their own kernels; f16/bf16 go through f32. */
#include "tensor_impl.h"

typedef struct attn_ctx {
    int64_t T, D;
    double scale;
    const void *q, *k, *v; /* (BH,T,D), contiguous, compute dtype */
    void *o;               /* forward: (BH,T,D) */
    void *p;               /* (BH,T,T) probabilities */
    void *tr;              /* scratch (BH,D,T): k (forward) or v (backward) transposed */
    const void *go;        /* backward: dO (BH,T,D) */
    void *gq, *gk, *gv;    /* backward: (BH,T,D) */
    void *row;             /* backward scratch (BH,T) */
} attn_ctx;

/* ---- forward kernels ---------------------------------------------------------- */

/* s_ij = scale q_i.k_j (j <= i); p_i = softmax(s_i); o_i = sum_j p_ij v_j */
static void fwd_f32(void *ctx, int64_t lo, int64_t hi)
{
    attn_ctx *c = ctx;
    int64_t T = c->T, D = c->D;
    float scale = (float)c->scale;
    for (int64_t h = lo; h < hi; h++) {
        const float *q = (const float *)c->q + h * T * D, *k = (const float *)c->k + h * T * D;
        const float *v = (const float *)c->v + h * T * D;
        float *o = (float *)c->o + h * T * D, *P = (float *)c->p + h * T * T, *kt = (float *)c->tr + h * D * T;
        for (int64_t j = 0; j < T; j++)
            for (int64_t d = 0; d < D; d++) kt[d * T + j] = k[j * D + d];
        for (int64_t i = 0; i < T; i++) {
            float *s = P + i * T, *oi = o + i * D;
            for (int64_t j = 0; j <= i; j++) s[j] = 0.0f;
            for (int64_t d = 0; d < D; d++) {
                float qd = q[i * D + d] * scale;
                const float *kr = kt + d * T;
                for (int64_t j = 0; j <= i; j++) s[j] += qd * kr[j];
            }
            float m = s[0], sum = 0.0f;
            for (int64_t j = 1; j <= i; j++) m = s[j] > m ? s[j] : m;
            for (int64_t j = 0; j <= i; j++) {
                s[j] = expf(s[j] - m);
                sum += s[j];
            }
            float inv = 1.0f / sum;
            for (int64_t j = 0; j <= i; j++) s[j] *= inv;
            for (int64_t j = i + 1; j < T; j++) s[j] = 0.0f;
            for (int64_t d = 0; d < D; d++) oi[d] = 0.0f;
            for (int64_t j = 0; j <= i; j++) {
                float pj = s[j];
                const float *vj = v + j * D;
                for (int64_t d = 0; d < D; d++) oi[d] += pj * vj[d];
            }
        }
    }
}

static void fwd_f64(void *ctx, int64_t lo, int64_t hi)
{
    attn_ctx *c = ctx;
    int64_t T = c->T, D = c->D;
    double scale = c->scale;
    for (int64_t h = lo; h < hi; h++) {
        const double *q = (const double *)c->q + h * T * D, *k = (const double *)c->k + h * T * D;
        const double *v = (const double *)c->v + h * T * D;
        double *o = (double *)c->o + h * T * D, *P = (double *)c->p + h * T * T, *kt = (double *)c->tr + h * D * T;
        for (int64_t j = 0; j < T; j++)
            for (int64_t d = 0; d < D; d++) kt[d * T + j] = k[j * D + d];
        for (int64_t i = 0; i < T; i++) {
            double *s = P + i * T, *oi = o + i * D;
            for (int64_t j = 0; j <= i; j++) s[j] = 0.0;
            for (int64_t d = 0; d < D; d++) {
                double qd = q[i * D + d] * scale;
                const double *kr = kt + d * T;
                for (int64_t j = 0; j <= i; j++) s[j] += qd * kr[j];
            }
            double m = s[0], sum = 0.0;
            for (int64_t j = 1; j <= i; j++) m = s[j] > m ? s[j] : m;
            for (int64_t j = 0; j <= i; j++) {
                s[j] = exp(s[j] - m);
                sum += s[j];
            }
            double inv = 1.0 / sum;
            for (int64_t j = 0; j <= i; j++) s[j] *= inv;
            for (int64_t j = i + 1; j < T; j++) s[j] = 0.0;
            for (int64_t d = 0; d < D; d++) oi[d] = 0.0;
            for (int64_t j = 0; j <= i; j++) {
                double pj = s[j];
                const double *vj = v + j * D;
                for (int64_t d = 0; d < D; d++) oi[d] += pj * vj[d];
            }
        }
    }
}

/* ---- backward kernels ----------------------------------------------------------
 * dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dP * P));
 * dQ = dS K * scale;  dK = dS^T Q * scale   (all restricted to j <= i) */

static void bwd_f32(void *ctx, int64_t lo, int64_t hi)
{
    attn_ctx *c = ctx;
    int64_t T = c->T, D = c->D;
    float scale = (float)c->scale;
    for (int64_t h = lo; h < hi; h++) {
        int64_t off = h * T * D;
        const float *q = (const float *)c->q + off, *k = (const float *)c->k + off, *v = (const float *)c->v + off;
        const float *go = (const float *)c->go + off, *P = (const float *)c->p + h * T * T;
        float *gq = (float *)c->gq + off, *gk = (float *)c->gk + off, *gv = (float *)c->gv + off;
        float *vt = (float *)c->tr + h * D * T, *dp = (float *)c->row + h * T;
        for (int64_t j = 0; j < T; j++)
            for (int64_t d = 0; d < D; d++) vt[d * T + j] = v[j * D + d];
        for (int64_t x = 0; x < T * D; x++) gk[x] = gv[x] = 0.0f;
        for (int64_t i = 0; i < T; i++) {
            const float *pi = P + i * T, *goi = go + i * D, *qi = q + i * D;
            float *gqi = gq + i * D;
            for (int64_t j = 0; j <= i; j++) {
                float pij = pi[j];
                float *gvj = gv + j * D;
                for (int64_t d = 0; d < D; d++) gvj[d] += pij * goi[d];
            }
            for (int64_t j = 0; j <= i; j++) dp[j] = 0.0f;
            for (int64_t d = 0; d < D; d++) {
                float g = goi[d];
                const float *vr = vt + d * T;
                for (int64_t j = 0; j <= i; j++) dp[j] += g * vr[j];
            }
            float r = 0.0f;
            for (int64_t j = 0; j <= i; j++) r += dp[j] * pi[j];
            for (int64_t d = 0; d < D; d++) gqi[d] = 0.0f;
            for (int64_t j = 0; j <= i; j++) {
                float ds = pi[j] * (dp[j] - r) * scale;
                const float *kj = k + j * D;
                float *gkj = gk + j * D;
                for (int64_t d = 0; d < D; d++) {
                    gqi[d] += ds * kj[d];
                    gkj[d] += ds * qi[d];
                }
            }
        }
    }
}

static void bwd_f64(void *ctx, int64_t lo, int64_t hi)
{
    attn_ctx *c = ctx;
    int64_t T = c->T, D = c->D;
    double scale = c->scale;
    for (int64_t h = lo; h < hi; h++) {
        int64_t off = h * T * D;
        const double *q = (const double *)c->q + off, *k = (const double *)c->k + off;
        const double *v = (const double *)c->v + off;
        const double *go = (const double *)c->go + off, *P = (const double *)c->p + h * T * T;
        double *gq = (double *)c->gq + off, *gk = (double *)c->gk + off, *gv = (double *)c->gv + off;
        double *vt = (double *)c->tr + h * D * T, *dp = (double *)c->row + h * T;
        for (int64_t j = 0; j < T; j++)
            for (int64_t d = 0; d < D; d++) vt[d * T + j] = v[j * D + d];
        for (int64_t x = 0; x < T * D; x++) gk[x] = gv[x] = 0.0;
        for (int64_t i = 0; i < T; i++) {
            const double *pi = P + i * T, *goi = go + i * D, *qi = q + i * D;
            double *gqi = gq + i * D;
            for (int64_t j = 0; j <= i; j++) {
                double pij = pi[j];
                double *gvj = gv + j * D;
                for (int64_t d = 0; d < D; d++) gvj[d] += pij * goi[d];
            }
            for (int64_t j = 0; j <= i; j++) dp[j] = 0.0;
            for (int64_t d = 0; d < D; d++) {
                double g = goi[d];
                const double *vr = vt + d * T;
                for (int64_t j = 0; j <= i; j++) dp[j] += g * vr[j];
            }
            double r = 0.0;
            for (int64_t j = 0; j <= i; j++) r += dp[j] * pi[j];
            for (int64_t d = 0; d < D; d++) gqi[d] = 0.0;
            for (int64_t j = 0; j <= i; j++) {
                double ds = pi[j] * (dp[j] - r) * scale;
                const double *kj = k + j * D;
                double *gkj = gk + j * D;
                for (int64_t d = 0; d < D; d++) {
                    gqi[d] += ds * kj[d];
                    gkj[d] += ds * qi[d];
                }
            }
        }
    }
}

/* ---- plumbing ------------------------------------------------------------------ */

static em_dtype compute_dtype(em_dtype dt) { return dt == EM_F64 ? EM_F64 : EM_F32; }

/* t's values as contiguous compute-dtype elements: t's own memory when it
 * already is that, else a copy in temp scratch. NULL on OOM. */
static const void *as_compute(tensor *t, em_dtype ct)
{
    if (t->dtype == ct && t_is_contig(t)) return t_ptr(t);
    void *buf = tmp_alloc((size_t)t_numel(t) * em_dtype_size(ct) + 1);
    if (!buf) return NULL;
    storage s = {.data = buf, .nbytes = (size_t)t_numel(t) * em_dtype_size(ct)};
    tensor h = {.dtype = ct, .ndim = t->ndim, .st = &s};
    memcpy(h.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    t_contig_strides(t->ndim, t->shape, h.stride);
    copy_strided(&h, t);
    return buf;
}

static em_status attention_backward(node *n, tensor *g)
{
    tensor *q = n->in[0];
    em_dtype ct = compute_dtype(q->dtype);
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3];
    size_t es = em_dtype_size(ct);
    tensor *grads[3];
    for (int i = 0; i < 3; i++)
        if (!(grads[i] = t_new(ct, 4, q->shape))) return em_last_status();
    size_t mk = tmp_mark();
    attn_ctx c = {.T = T, .D = D, .scale = n->dp[0], .p = n->saved};
    c.q = as_compute(n->in[0], ct);
    c.k = as_compute(n->in[1], ct);
    c.v = as_compute(n->in[2], ct);
    c.go = as_compute(g, ct);
    c.tr = tmp_alloc((size_t)(BH * D * T) * es + 1);
    c.row = tmp_alloc((size_t)(BH * T) * es + 1);
    if (!c.q || !c.k || !c.v || !c.go || !c.tr || !c.row) {
        tmp_release(mk);
        return em_last_status();
    }
    c.gq = t_ptr(grads[0]);
    c.gk = t_ptr(grads[1]);
    c.gv = t_ptr(grads[2]);
    parallel_for(BH, 1, ct == EM_F32 ? bwd_f32 : bwd_f64, &c);
    tmp_release(mk);
    for (int i = 0; i < 3; i++) {
        tensor *x = n->in[i];
        if (!x->requires_grad) continue;
        tensor *gx = x->dtype == ct ? grads[i] : t_cast(grads[i], x->dtype);
        if (!gx) return em_last_status();
        em_status s = ag_accum(x, gx);
        if (s) return s;
    }
    return EM_OK;
}

static bool same_shape(const tensor *a, const tensor *b)
{
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

static tensor *attention_causal(tensor *q, tensor *k, tensor *v, double scale)
{
    if (!q || !k || !v) return NULL;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return em_fail(EM_ERR_SHAPE, "attention: q, k, v must be 4-D (B,H,T,D): q is %s, k is %s, v is %s", shp(q),
                       shp(k), shp(v));
    if (!same_shape(q, k) || !same_shape(q, v))
        return em_fail(EM_ERR_SHAPE, "attention: q, k, v must have the same shape: q is %s, k is %s, v is %s",
                       shp(q), shp(k), shp(v));
    if (!chk_same_dtype("attention", q, k) || !chk_same_dtype("attention", q, v) || !chk_float("attention", q))
        return NULL;
    if (isnan(scale) || isinf(scale))
        return em_fail(EM_ERR_ARG, "attention: scale must be finite, got %g (<= 0 means 1/sqrt(D))", scale);
    tensor *in[3] = {q, k, v};
    bool need = ag_needed(3, in);
    if (need && em_scope_depth() == 0)
        return em_fail(EM_ERR_SCOPE, "attention: recording a gradient needs an open step scope (em_scope_begin), "
                                     "or run it under em_set_grad_enabled(false)");
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], D = q->shape[3];
    if (scale <= 0) scale = D > 0 ? 1.0 / sqrt((double)D) : 1.0;
    em_dtype dt = q->dtype, ct = compute_dtype(dt);
    size_t es = em_dtype_size(ct);
    tensor *out = t_new(dt, 4, q->shape);
    if (!out) return NULL;
    node *n = need ? ag_record("attention_causal", attention_backward, out, 3, in) : NULL;
    if (need && !n) return NULL;
    /* P lives as long as the tape when it is saved, else only for this call */
    void *P = need ? scope_alloc((size_t)(BH * T * T) * es + 1) : NULL;
    if (need && !P) return NULL;

    size_t mk = tmp_mark();
    attn_ctx c = {.T = T, .D = D, .scale = scale, .p = P};
    if (!c.p) c.p = tmp_alloc((size_t)(BH * T * T) * es + 1);
    c.q = as_compute(q, ct);
    c.k = as_compute(k, ct);
    c.v = as_compute(v, ct);
    c.o = dt == ct ? t_ptr(out) : tmp_alloc((size_t)t_numel(out) * es + 1);
    c.tr = tmp_alloc((size_t)(BH * D * T) * es + 1);
    if (!c.p || !c.q || !c.k || !c.v || !c.o || !c.tr) {
        tmp_release(mk);
        return NULL;
    }
    parallel_for(BH, 1, ct == EM_F32 ? fwd_f32 : fwd_f64, &c);
    if (dt != ct) convert_n(dt, t_ptr(out), ct, c.o, t_numel(out));
    tmp_release(mk);
    if (n) {
        n->saved = P;
        n->dp[0] = scale;
    }
    return out;
}

em_tensor *em_attention_causal(em_tensor *q, em_tensor *k, em_tensor *v, double scale)
{
    tensor *x = t_resolve(q, "attention"), *y = x ? t_resolve(k, "attention") : NULL;
    tensor *z = y ? t_resolve(v, "attention") : NULL;
    return z ? t_handle(attention_causal(x, y, z, scale)) : NULL;
}
