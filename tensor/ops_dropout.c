/* ops_dropout.c — dropout with a counter-based mask.
 *
 * Element i (row-major over t's shape) is kept when the uniform number u_i
 * made from word i%4 of Philox(seed, counter offset + i/4) satisfies
 * u_i >= p — the same u_i em_rand would draw from that generator — so the
 * mask depends only on (seed, offset), never on the thread split. The draw
 * advances rng->offset by ceil(n/4). Kept values are scaled by 1/(1-p).
 * The per-element rules are tensor/dropout_math.h's, shared with the CUDA
 * kernels (tensor/ops_nn.cu). */
#include "dropout_math.h"
#include "dispatch.h"
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

/* Ranges are counters (blocks of 4 elements). */
static void drop_range(void *p, int64_t lo, int64_t hi)
{
    drop_ctx *c = p;
    tensor *x = c->x;
    em_dtype dt = x->dtype;
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
    nditer it;
    nditer_init(&it, g->ndim, g->shape, 1, (const int64_t *[]){g->stride});
    nditer_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++) {
        dropout_backward_elem(dt, gp, it.off[0], op, i, c->mask[i], c->scale);
        nditer_next(&it);
    }
}

/* d dropout = g * mask / (1-p) */
static em_status dropout_backward(node *n, tensor *g)
{
    tensor *gx = t_new_like(g);
    if (!gx) return em_last_status();
#if EM_HAVE_CUDA
    if (t_on_cuda(g)) { /* n->saved is the mask as a u8 device tensor */
        tensor *mask = n->saved, *gc = t_contig(g);
        em_status s = gc ? cu_dropout_bwd(g->device.index, g->dtype, t_ptr(gc), t_ptr(mask), t_ptr(gx),
                                          t_numel(g), n->dp[0])
                         : em_last_status();
        if (gc && gc != g) t_drop(gc);
        return s ? s : op_grad(n->in[0], gx);
    }
#endif
    dback_ctx c = {g, gx, n->saved, n->dp[0]};
    parallel_for(t_numel(g), 1 << 14, dback_range, &c);
    return op_grad(n->in[0], gx);
}

static tensor *t_dropout(tensor *t, double p, bool training, em_rng *rng)
{
    if (!t) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) return em_fail(EM_ERR_ARG, "dropout: p = %g is not in [0, 1]", p);
    if (!chk_float("dropout", t)) return NULL;
    if (!training || p == 0.0) return t;
    if (!rng) rng = em_default_rng();
    int64_t n = t_numel(t), blocks = (n + 3) / 4;
    bool grad = ag_needed(1, &t);
    tensor *out = t_new_like(t);
#if EM_HAVE_CUDA
    if (out && t_on_cuda(t)) {
        /* the same counters and arithmetic on the device: the CPU's mask, bit for bit */
        tensor *mask = grad ? t_new_on(t->device, EM_U8, 1, (const int64_t[]){n}) : NULL;
        tensor *xc = !grad || mask ? t_contig(t) : NULL;
        double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
        em_status s = xc ? cu_dropout_fwd(t->device.index, t->dtype, t_ptr(xc), t_ptr(out),
                                          mask ? t_ptr(mask) : NULL, n, rng->seed, rng->offset, p, scale)
                         : em_last_status();
        if (xc && xc != t) t_drop(xc);
        if (s) {
            t_drop(mask);
            return NULL;
        }
        rng->offset += (uint64_t)blocks;
        if (grad) {
            node *nd = ag_record("dropout", dropout_backward, out, 1, &t);
            if (!nd) {
                t_drop(mask);
                return NULL;
            }
            nd->saved = mask;
            nd->dp[0] = scale;
        }
        return out;
    }
#endif
    uint8_t *mask = grad && out ? scope_alloc((size_t)(n ? n : 1)) : NULL;
    if (!out || (grad && !mask)) return NULL;
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    drop_ctx c = {t, out, mask, *rng, p, scale, n};
    parallel_for(blocks, 1024, drop_range, &c);
    rng->offset += (uint64_t)blocks;
    if (grad) {
        node *nd = ag_record("dropout", dropout_backward, out, 1, &t);
        if (!nd) return NULL;
        nd->saved = mask;
        nd->dp[0] = scale;
    }
    return out;
}

em_tensor *em_dropout(em_tensor *h, double p, bool training, em_rng *rng)
{
    tensor *t = t_resolve(h, "dropout");
    if (!t) return NULL;
    tensor *r = t_dropout(t, p, training, rng);
    return r == t ? h : t_handle(r);
}
