/* ops_attention.c — causal scaled-dot-product attention as one op, in two
 * forms:
 * - "attention": q, k, v (B,H,T,D) -> (B,H,T,D), position i attending to
 *   positions j <= i;
 * - "attention_qkv": the fused QKV projection's output qkv (B,T,3C) as it
 *   is -> y (B,T,C) with the heads merged (GPT-2's split: q, k, v the
 *   three thirds of the channels, head h channels h*D..(h+1)*D of each).
 *   The same heads on (B,H,T,D) views of qkv and y (heads D apart, rows
 *   3C or C apart), so neither the split into q, k, v, nor the merge of
 *   the heads, nor the gradient's assembly into d(qkv) makes a copy or a
 *   node: the heads write dq, dk, dv where they lie in d(qkv), each
 *   element by its head alone (no zeroing pass), into qkv's gradient
 *   accumulator itself when it holds nothing yet. The bits are those of narrow/reshape/transpose +
 *   attention + transpose/reshape.
 *
 * On the CPU the heads run in tensor/attention_heads.c (P (B,H,T,T) saved
 * in the step scope for backward). On a CUDA device each op is one fused
 * kernel (tensor/ops_matmul.cu, flash-attention style) on contiguous
 * (B,H,T,D) operands (attention_qkv's views are copied to that layout and
 * back): P is never stored; the forward saves the log-sum-exp of each row
 * (B,H,T) instead, and the backward recomputes P from it. The ops go
 * through the dispatcher (tensor/dispatch.h); the nodes they record are
 * "attention" and "attention_qkv". */
#include <limits.h>

#include "dispatch.h"
#include "kernel_impl.h"
#if EM_HAVE_CUDA
#include "cuda_matmul.h"
#endif

#if EM_HAVE_CUDA
/* On a CUDA device the kernels (tensor/ops_matmul.cu) take contiguous
 * (B,H,T,D) operands and results; the forward saves the (B,H,T)
 * log-sum-exp of each row (a scope tensor on the device, f32; f64 for f64
 * inputs), from which the backward recomputes P. */

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
        if (out[i] && out[i] != in[i]) t_drop_now(out[i]);
}

/* out[i]: res[i] itself when contiguous, else a new contiguous tensor of
 * its shape for a kernel to write; copy_back copies those into res. */
static bool contig_results(int n, tensor *const *res, tensor **out)
{
    for (int i = 0; i < n; i++)
        if (!(out[i] = t_is_contig(res[i]) ? res[i] : t_new_like(res[i]))) return false;
    return true;
}

static void copy_back(int n, tensor *const *res, tensor *const *out)
{
    for (int i = 0; i < n; i++)
        if (out[i] != res[i]) copy_strided(res[i], out[i]);
}

/* The forward on the device: o from q, k, v (B,H,T,D), the resolved scale
 * in dp[0]; the log-sum-exp into c->saved. */
static em_status forward_cuda(const op_call *c, tensor *q, tensor *k, tensor *v, tensor *o)
{
    tensor *in[3] = {q, k, v}, *cc[3] = {NULL, NULL, NULL}, *oc = NULL;
    em_status s = contig_all(3, in, cc) && contig_results(1, &o, &oc) ? EM_OK : em_last_status();
    if (!s)
        s = cu_attention_forward(q->device.index, q->dtype, q->shape[0] * q->shape[1], q->shape[2],
                                 q->shape[3], c->dp[0], t_ptr(cc[0]), t_ptr(cc[1]), t_ptr(cc[2]), t_ptr(oc),
                                 t_ptr((tensor *)c->saved));
    if (!s) copy_back(1, &o, &oc);
    drop_copies(3, in, cc);
    drop_copies(1, &o, &oc);
    return s;
}

/* The backward on the device: d[0..3) = dq, dk, dv (B,H,T,D) from q, k, v,
 * the forward's output o and its gradient g (B,H,T,D, g in q's dtype) and
 * the log-sum-exp lse: one fused kernel recomputing P. */
static em_status backward_cuda(const op_call *c, tensor *q, tensor *k, tensor *v, tensor *o, tensor *g,
                               tensor *const d[3], const tensor *lse)
{
    if (!lse) /* the forward failed after recording */
        return em_err(EM_ERR_AUTOGRAD, "%s backward: the forward of %s did not complete", op_name(c->op),
                      shp(q));
    tensor *in[5] = {q, k, v, o, g}, *cc[5] = {NULL}, *dc[3] = {NULL};
    em_status s = contig_all(5, in, cc) && contig_results(3, d, dc) ? EM_OK : em_last_status();
    if (!s)
        s = cu_attention_backward(q->device.index, q->dtype, q->shape[0] * q->shape[1], q->shape[2],
                                  q->shape[3], c->dp[0], t_ptr(cc[0]), t_ptr(cc[1]), t_ptr(cc[2]),
                                  t_ptr(cc[3]), t_ptr(cc[4]), t_ptr(lse), t_ptr(dc[0]), t_ptr(dc[1]),
                                  t_ptr(dc[2]));
    if (!s) copy_back(3, d, dc);
    drop_copies(5, in, cc);
    drop_copies(3, d, dc);
    return s;
}
#endif

/* ---- attention: q, k, v (B,H,T,D) -------------------------------------------------- */

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
    tensor *d[3] = {dq, o->dk, o->dv};
    return attention_heads_backward("attention", c->dp[0], o->saved, c->in[0], c->in[1], c->in[2], c->in[4],
                                    d);
}

static em_status attention_cpu(const op_call *c, tensor *out)
{
    return attention_heads_forward("attention", c->dp[0], c->saved, c->in[0], c->in[1], c->in[2], out);
}

#if EM_HAVE_CUDA
/* On the device, g cast to q's dtype first */
static em_status attention_grad_cuda(const op_call *c, tensor *dq)
{
    const attn_grads *o = c->saved;
    tensor *q = c->in[0], *g = c->in[4], *d[3] = {dq, o->dk, o->dv};
    tensor *gc = g->dtype == q->dtype ? g : t_cast(g, q->dtype);
    if (!gc) return em_last_status();
    em_status s = backward_cuda(c, q, c->in[1], c->in[2], c->in[3], gc, d, o->saved);
    if (gc != g) t_drop_now(gc);
    return s;
}

static em_status attention_cuda(const op_call *c, tensor *out)
{
    return forward_cuda(c, c->in[0], c->in[1], c->in[2], out);
}
#endif

static const op_kernels attention_kernels = OP_KERNELS(attention_cpu, attention_cuda);

static const op_kernels attention_grad_kernels = OP_KERNELS(attention_grad_cpu, attention_grad_cuda);

/* dq, dk, dv, all three computed; handed on for the inputs that require grad */
static em_status attention_backward(node *n, tensor *g)
{
    tensor *q = n->in[0], *in[5] = {n->in[0], n->in[1], n->in[2], n->out, g};
    OP_CALL(c);
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

/* The checks both ops make once the shapes are known (x, called what: the
 * input shown in messages): a finite scale, resolved into *scale (<= 0:
 * 1/sqrt(D)); a scope to record in; T and D within what the kernels take.
 * false + error. */
static bool check_call(const op_call *c, const char *what, const tensor *x, int64_t T, int64_t D,
                       double *scale)
{
    const char *name = op_name(c->op);
    if (isnan(*scale) || isinf(*scale)) {
        em_fail(EM_ERR_ARG, "%s: scale must be finite, got %g (<= 0 means 1/sqrt(D))", name, *scale);
        return false;
    }
    if (c->record && em_scope_depth() == 0) {
        em_fail(EM_ERR_SCOPE,
                "%s: recording a gradient needs an open step scope (em_scope_begin), "
                "or run it under em_set_grad_enabled(false)",
                name);
        return false;
    }
    if (T > INT_MAX || D > INT_MAX) {
        em_fail(EM_ERR_UNSUPPORTED, "%s: T or D beyond BLAS's int range: %s is %s", name, what, shp(x));
        return false;
    }
#if EM_HAVE_CUDA
    if (c->dev.type == EM_CUDA && D > CU_ATTENTION_MAX_D) {
        em_fail(EM_ERR_UNSUPPORTED, "%s: head dim D = %lld is beyond the CUDA kernel's %d: %s is %s", name,
                (long long)D, (int)CU_ATTENTION_MAX_D, what, shp(x));
        return false;
    }
#endif
    if (*scale <= 0) *scale = D > 0 ? 1.0 / sqrt((double)D) : 1.0;
    return true;
}

/* The end both ops share, out made: what backward reads (on the CPU, P
 * (B,H,T,T) in the scope arena when recording, else made by the kernel in
 * temp memory; on CUDA the (B,H,T) log-sum-exp of each row, a scope tensor
 * of f32, f64 for f64 inputs, that the kernel always writes), the kernel,
 * the node with backward bw. bht: B, H, T. */
static tensor *run_and_record(op_call *c, const op_kernels *k, tensor *out, const int64_t bht[3],
                              backward_fn bw)
{
    em_dtype dt = c->in[0]->dtype;
    bool cuda = c->dev.type == EM_CUDA;
    if (cuda)
        c->saved = t_new_on(c->dev, dt == EM_F64 ? EM_F64 : EM_F32, 3, bht);
    else if (c->record)
        c->saved = scope_alloc(
            (size_t)(bht[0] * bht[1] * bht[2] * bht[2]) * em_dtype_size(attention_compute_dtype(dt)) + 1);
    if ((cuda || c->record) && !c->saved) {
        t_drop(out);
        return NULL;
    }
    if (op_run(c, k, out)) {
        if (cuda) t_drop(c->saved);
        t_drop(out);
        return NULL;
    }
    if (cuda && !c->record) {
        t_drop(c->saved);
        c->saved = NULL;
    }
    tensor *r = op_end(c, out, bw);
    if (!r && cuda) t_drop(c->saved); /* the lse, when recording failed */
    return r;
}

static bool same_shape(const tensor *a, const tensor *b)
{
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

static tensor *attention_causal(tensor *q, tensor *k, tensor *v, double scale)
{
    tensor *in[3] = {q, k, v};
    OP_CALL(c);
    if (!op_begin(&c, OP_ATTENTION, 3, in)) return NULL;
    q = in[0], k = in[1], v = in[2];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return em_fail(EM_ERR_SHAPE, "attention: q, k, v must be 4-D (B,H,T,D): q is %s, k is %s, v is %s",
                       shp(q), shp(k), shp(v));
    if (!same_shape(q, k) || !same_shape(q, v))
        return em_fail(EM_ERR_SHAPE, "attention: q, k, v must have the same shape: q is %s, k is %s, v is %s",
                       shp(q), shp(k), shp(v));
    if (!chk_same_dtype("attention", q, k) || !chk_same_dtype("attention", q, v)) return NULL;
    if (!check_call(&c, "q", q, q->shape[2], q->shape[3], &scale)) return NULL;
    tensor *out = op_out(&c, q->dtype, 4, q->shape);
    if (!out) return NULL;
    c.dp[0] = scale;
    return run_and_record(&c, &attention_kernels, out, q->shape, attention_backward);
}

em_tensor *em_attention_causal(em_tensor *q, em_tensor *k, em_tensor *v, double scale)
{
    tensor *x = t_resolve(q, "attention"), *y = x ? t_resolve(k, "attention") : NULL;
    tensor *z = y ? t_resolve(v, "attention") : NULL;
    return z ? t_handle(attention_causal(x, y, z, scale)) : NULL;
}

/* ---- attention_qkv: qkv (B,T,3C) -> y (B,T,C) --------------------------------------- */

/* Channels [c0, c0 + H D) of x (B,T,W) as (B,H,T,D), head h at channels
 * c0 + h D: a header on the stack over x's storage, never handed out. */
static tensor heads_view(const tensor *x, int64_t c0, int64_t H, int64_t D)
{
    tensor v = {.dtype = x->dtype, .device = x->device, .ndim = 4, .st = x->st};
    int64_t shape[4] = {x->shape[0], H, x->shape[1], D};
    int64_t stride[4] = {x->stride[0], D * x->stride[2], x->stride[1], x->stride[2]};
    memcpy(v.shape, shape, sizeof shape);
    memcpy(v.stride, stride, sizeof stride);
    v.offset = x->offset + c0 * x->stride[2];
    return v;
}

/* q, k, v of qkv (B,T,3C) in H heads: channels [0,C), [C,2C), [2C,3C) */
static void split_qkv(const tensor *qkv, int64_t H, tensor out[3])
{
    int64_t C = qkv->shape[2] / 3;
    for (int i = 0; i < 3; i++) out[i] = heads_view(qkv, i * C, H, C / H);
}

/* y (B,T,C) from qkv: the heads in n_head = ip[0] views */
static em_status attention_qkv_cpu(const op_call *c, tensor *y)
{
    int64_t H = c->ip[0];
    tensor p[3], o = heads_view(y, 0, H, y->shape[2] / H);
    split_qkv(c->in[0], H, p);
    return attention_heads_forward("attention_qkv", c->dp[0], c->saved, &p[0], &p[1], &p[2], &o);
}

/* The backward's call: in = {qkv, y, g} (y the forward's output, g its
 * gradient), out d(qkv) (B,T,3C), written whole; c.saved the forward's */
static em_status attention_qkv_grad_cpu(const op_call *c, tensor *dqkv)
{
    int64_t H = c->ip[0];
    tensor p[3], dp[3], g = heads_view(c->in[2], 0, H, c->in[2]->shape[2] / H);
    split_qkv(c->in[0], H, p);
    split_qkv(dqkv, H, dp);
    return attention_heads_backward("attention_qkv", c->dp[0], c->saved, &p[0], &p[1], &p[2], &g,
                                    (tensor *[]){&dp[0], &dp[1], &dp[2]});
}

#if EM_HAVE_CUDA
static em_status attention_qkv_cuda(const op_call *c, tensor *y)
{
    int64_t H = c->ip[0];
    tensor p[3], o = heads_view(y, 0, H, y->shape[2] / H);
    split_qkv(c->in[0], H, p);
    return forward_cuda(c, &p[0], &p[1], &p[2], &o);
}

static em_status attention_qkv_grad_cuda(const op_call *c, tensor *dqkv)
{
    int64_t H = c->ip[0];
    tensor *qkv = c->in[0], *g = c->in[2];
    tensor *gc = g->dtype == qkv->dtype ? g : t_cast(g, qkv->dtype);
    if (!gc) return em_last_status();
    int64_t D = gc->shape[2] / H;
    tensor p[3], dp[3], o = heads_view(c->in[1], 0, H, D), gh = heads_view(gc, 0, H, D);
    split_qkv(qkv, H, p);
    split_qkv(dqkv, H, dp);
    em_status s =
        backward_cuda(c, &p[0], &p[1], &p[2], &o, &gh, (tensor *[]){&dp[0], &dp[1], &dp[2]}, c->saved);
    if (gc != g) t_drop_now(gc);
    return s;
}
#endif

static const op_kernels attention_qkv_kernels = OP_KERNELS(attention_qkv_cpu, attention_qkv_cuda);

static const op_kernels attention_qkv_grad_kernels =
    OP_KERNELS(attention_qkv_grad_cpu, attention_qkv_grad_cuda);

/* d(qkv) (B,T,3C): the heads' dq, dk, dv where q, k, v lie. On the CPU in
 * f32/f64 written straight into qkv's gradient accumulator when it holds
 * nothing yet (qkv is a Linear's output: its first and only gradient),
 * else made and added to it (one rounding per element, as op_grad would);
 * otherwise (CUDA, f16/bf16) made and handed to op_grad. */
static em_status attention_qkv_backward(node *n, tensor *g)
{
    tensor *qkv = n->in[0], *in[3] = {qkv, n->out, g};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 3, in)) return em_last_status();
    bool fresh = false;
    tensor *acc = c.dev.type == EM_CPU && (qkv->dtype == EM_F32 || qkv->dtype == EM_F64)
                      ? op_grad_acc(qkv, &fresh)
                      : NULL;
    tensor *d = acc && fresh ? acc : op_out(&c, qkv->dtype, 3, qkv->shape);
    em_status s = d ? op_run(&c, &attention_qkv_grad_kernels, d) : em_last_status();
    if (!acc) {
        if (s) t_drop(d);
        return s ? s : op_grad(qkv, d); /* which may keep d */
    }
    if (d != acc) {
        if (!s) add_strided(acc, d);
        t_drop(d);
    }
    return s ? s : op_grad_done(qkv);
}

static tensor *attention_qkv(tensor *qkv, int64_t n_head, double scale)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_ATTENTION_QKV, 1, &qkv)) return NULL;
    if (qkv->ndim != 3 || qkv->shape[2] % 3)
        return em_fail(EM_ERR_SHAPE,
                       "attention_qkv: qkv must be (B,T,3C), its last dim a multiple of 3: qkv is %s",
                       shp(qkv));
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    if (n_head < 1)
        return em_fail(EM_ERR_ARG, "attention_qkv: n_head = %lld must be >= 1 (qkv is %s)", (long long)n_head,
                       shp(qkv));
    if (C % n_head)
        return em_fail(EM_ERR_SHAPE, "attention_qkv: C = %lld (qkv is %s) is not a multiple of n_head = %lld",
                       (long long)C, shp(qkv), (long long)n_head);
    if (!check_call(&c, "qkv", qkv, T, C / n_head, &scale)) return NULL;
    tensor *y = op_out(&c, qkv->dtype, 3, (int64_t[]){B, T, C});
    if (!y) return NULL;
    c.ip[0] = n_head;
    c.dp[0] = scale;
    return run_and_record(&c, &attention_qkv_kernels, y, (int64_t[]){B, n_head, T}, attention_qkv_backward);
}

em_tensor *em_attention_causal_qkv(em_tensor *qkv, int64_t n_head, double scale)
{
    tensor *x = t_resolve(qkv, "attention_qkv");
    return x ? t_handle(attention_qkv(x, n_head, scale)) : NULL;
}
