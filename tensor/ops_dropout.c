/* ops_dropout.c — dropout with a counter-based mask.
 *
 * Element i (row-major over t's shape) is kept when the uniform number u_i
 * made from word i%4 of Philox(seed, counter offset + i/4) satisfies
 * u_i >= p — the same u_i em_rand would draw from that generator — so the
 * mask depends only on (seed, offset), never on the thread split. The draw
 * advances rng->offset by ceil(n/4). Kept values are scaled by 1/(1-p).
 * The per-element rules are tensor/dropout_math.h's, shared with the CUDA
 * kernels (tensor/ops_nn.cu). The op goes through the dispatcher
 * (tensor/dispatch.h): the call's ip[0], ip[1] are the generator's seed and
 * offset (as bits), dp[0] the scale 1/(1-p), dp[1] p; the mask is c.saved
 * when recording. */
#include "dispatch.h"
#include "dropout_math.h"
#include "kernel_impl.h"
#if EM_HAVE_CUDA
#include "cuda_nn.h"
#endif

typedef struct drop_ctx {
    tensor *x, *out;
    uint8_t *mask; /* n bytes, or NULL when no backward is recorded */
    em_rng rng;
    double p, scale;
    int64_t n;
} drop_ctx;

/* Contiguous f32, counters [lo,hi): the words of DROP_PIECE counters drawn
 * first, then each element's rule in a loop of its own, with nothing read
 * through c inside it, so that loop vectorises (dropout_keeps and
 * dropout_forward_elem as the general path applies them: the same mask and
 * bits). Element by element with a dtype switch, the tiny GPT's twelve
 * dropouts took 4 ms of a 36 ms step at p = 0.2. */
enum { DROP_PIECE = 64 };

static void drop_range_f32(const drop_ctx *c, int64_t lo, int64_t hi)
{
    const float *x = t_ptr(c->x);
    float *o = t_ptr(c->out);
    uint8_t *mask = c->mask;
    double p = c->p, scale = c->scale;
    uint64_t seed = c->rng.seed, offset = c->rng.offset;
    int64_t n = c->n;
    uint32_t w[4 * DROP_PIECE];
    for (int64_t b0 = lo; b0 < hi; b0 += DROP_PIECE) {
        int64_t nb = hi - b0 < DROP_PIECE ? hi - b0 : DROP_PIECE;
        for (int64_t b = 0; b < nb; b++) philox4x32_10(seed, 0, offset + (uint64_t)(b0 + b), w + 4 * b);
        int64_t i0 = b0 * 4, m = 4 * nb < n - i0 ? 4 * nb : n - i0;
        if (mask)
            for (int64_t j = 0; j < m; j++) {
                bool keep = dropout_keeps(w[j], p);
                mask[i0 + j] = keep;
                dropout_forward_elem(EM_F32, x, i0 + j, o, i0 + j, keep, scale);
            }
        else
            for (int64_t j = 0; j < m; j++)
                dropout_forward_elem(EM_F32, x, i0 + j, o, i0 + j, dropout_keeps(w[j], p), scale);
    }
}

/* Ranges are counters (blocks of 4 elements). */
static void drop_range(void *p, int64_t lo, int64_t hi)
{
    drop_ctx *c = p;
    tensor *x = c->x;
    em_dtype dt = x->dtype;
    if (dt == EM_F32 && t_is_contig(x)) {
        drop_range_f32(c, lo, hi);
        return;
    }
    const char *xp = t_ptr(x);
    char *op = t_ptr(c->out);
    bool flat = t_is_contig(x);
    nditer it;
    nditer_init(&it, x->ndim, x->shape, 1, (const int64_t *[]){x->stride});
    nditer_seek(&it, lo * 4);
    for (int64_t blk = lo; blk < hi; blk++) {
        uint32_t w[4];
        philox4x32_10(c->rng.seed, 0, c->rng.offset + (uint64_t)blk, w);
        for (int j = 0; j < 4; j++) {
            int64_t i = blk * 4 + j;
            if (i >= c->n) break;
            bool keep = dropout_keeps(w[j], c->p);
            if (c->mask) c->mask[i] = keep;
            dropout_forward_elem(dt, xp, flat ? i : it.off[0], op, i, keep, c->scale);
            if (!flat) nditer_next(&it);
        }
    }
}

typedef struct dback_ctx {
    tensor *g, *out;
    const uint8_t *mask;
    double scale;
} dback_ctx;

static void dback_range(void *p, int64_t lo, int64_t hi)
{
    dback_ctx *c = p;
    tensor *g = c->g;
    em_dtype dt = g->dtype;
    const char *gp = t_ptr(g);
    char *op = t_ptr(c->out);
    if (dt == EM_F32 && t_is_contig(g)) { /* the same rule in a loop that vectorises */
        const uint8_t *mask = c->mask;
        double scale = c->scale;
        for (int64_t i = lo; i < hi; i++) dropout_backward_elem(EM_F32, gp, i, op, i, mask[i], scale);
        return;
    }
    nditer it;
    nditer_init(&it, g->ndim, g->shape, 1, (const int64_t *[]){g->stride});
    nditer_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++) {
        dropout_backward_elem(dt, gp, it.off[0], op, i, c->mask[i], c->scale);
        nditer_next(&it);
    }
}

/* gx = g * mask / (1-p): g = in[0], the mask c.saved (n bytes of scope
 * memory), the scale dp[0] */
static em_status dropout_grad_cpu(const op_call *call, tensor *gx)
{
    tensor *g = call->in[0];
    dback_ctx c = {g, gx, call->saved, call->dp[0]};
    parallel_for(t_numel(g), 1 << 14, dback_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
/* the same; the mask is a u8 device tensor */
static em_status dropout_grad_cuda(const op_call *call, tensor *gx)
{
    tensor *g = call->in[0], *mask = call->saved, *gc = t_contig(g);
    em_status s = gc ? cu_dropout_bwd(g->device.index, g->dtype, t_ptr(gc), t_ptr(mask), t_ptr(gx),
                                      t_numel(g), call->dp[0])
                     : em_last_status();
    if (gc && gc != g) t_drop(gc);
    return s;
}
#endif

static const op_kernels dropout_grad_kernels = OP_KERNELS(dropout_grad_cpu, dropout_grad_cuda);

/* d dropout = g * mask / (1-p) */
static em_status dropout_backward(node *n, tensor *g)
{
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 1, &g)) return em_last_status();
    tensor *gx = op_out(&c, g->dtype, g->ndim, g->shape);
    if (!gx) return em_last_status();
    em_status s = op_run(&c, &dropout_grad_kernels, gx);
    return s ? s : op_grad(n->in[0], gx);
}

/* The generator state of a call (ip[0], ip[1]). */
static em_rng rng_of(const op_call *c) { return (em_rng){(uint64_t)c->ip[0], (uint64_t)c->ip[1]}; }

/* out = dropout of c->in[0]; the mask (n bytes, scope memory) to c->saved when given */
static em_status dropout_cpu(const op_call *call, tensor *out)
{
    tensor *x = call->in[0];
    int64_t n = t_numel(x);
    drop_ctx c = {x, out, call->saved, rng_of(call), call->dp[1], call->dp[0], n};
    parallel_for((n + 3) / 4, 1024, drop_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
/* the same counters and arithmetic on the device: the CPU's mask, bit for
 * bit; c->saved, when given, a u8 device tensor of n for the mask */
static em_status dropout_cuda(const op_call *c, tensor *out)
{
    tensor *x = c->in[0], *mask = c->saved, *xc = t_contig(x);
    em_rng rng = rng_of(c);
    em_status s =
        xc ? cu_dropout_fwd(x->device.index, x->dtype, t_ptr(xc), t_ptr(out), mask ? t_ptr(mask) : NULL,
                            t_numel(x), rng.seed, rng.offset, c->dp[1], c->dp[0])
           : em_last_status();
    if (xc && xc != x) t_drop(xc);
    return s;
}
#endif

static const op_kernels dropout_kernels = OP_KERNELS(dropout_cpu, dropout_cuda);

static tensor *t_dropout(tensor *t, double p, bool training, em_rng *rng)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_DROPOUT, 1, &t)) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) return em_fail(EM_ERR_ARG, "dropout: p = %g is not in [0, 1]", p);
    if (!training || p == 0.0) { /* the identity: nothing to record */
        op_done(&c, true);
        return t;
    }
    if (!rng) rng = em_default_rng();
    int64_t n = t_numel(t), blocks = (n + 3) / 4;
    bool cuda = c.dev.type == EM_CUDA;
    tensor *out = op_out(&c, t->dtype, t->ndim, t->shape);
    if (!out) return NULL;
    c.ip[0] = (int64_t)rng->seed;
    c.ip[1] = (int64_t)rng->offset;
    c.dp[0] = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    c.dp[1] = p;
    if (c.record) {
        c.saved =
            cuda ? (void *)t_new_on(c.dev, EM_U8, 1, (const int64_t[]){n}) : scope_alloc((size_t)(n ? n : 1));
        if (!c.saved) {
            t_drop(out);
            return NULL;
        }
    }
    if (op_run(&c, &dropout_kernels, out)) {
        if (cuda) t_drop(c.saved);
        t_drop(out);
        return NULL;
    }
    rng->offset += (uint64_t)blocks;
    tensor *r = op_end(&c, out, dropout_backward);
    if (!r && cuda) t_drop(c.saved); /* the mask, when recording failed */
    return r;
}

em_tensor *em_dropout(em_tensor *h, double p, bool training, em_rng *rng)
{
    tensor *t = t_resolve(h, "dropout");
    if (!t) return NULL;
    tensor *r = t_dropout(t, p, training, rng);
    return r == t ? h : t_handle(r);
}
