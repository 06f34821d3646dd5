/* layers.c — the layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout,
 * Conv2d, max pooling, flatten, the MSE loss, and the GPT-2 pieces built
 * from them (MLP, causal self-attention, pre-LN block).
 *
 * Each layer is a struct attached to its module (freed with the root) with
 * direct handles to its parameters. Forward functions compose the ops; the
 * temporaries they make are dropped with `drop` (a no-op inside a scope,
 * where the scope owns them and autograd may still need them), so a forward
 * run outside any scope with grad mode off leaves only its result. Each
 * public forward is a static body plus a wrapper whose exit, nn_named
 * (nn/module.c), makes a failure name the layer ("linear 'h.0.mlp.c_fc':
 * x is (2,5), ...") rather than the op that failed inside it. */
#include <stdlib.h>

#include "../tensor/dispatch.h"
#include "../tensor/kernel_impl.h"
#include "../tensor/tensor_impl.h"
#include "ember/nn.h"
#include "module_impl.h"

static _Thread_local em_dtype param_dtype = EM_F32;

em_dtype em_nn_set_param_dtype(em_dtype dt)
{
    em_dtype prev = param_dtype;
    if (em_dtype_is_float(dt)) param_dtype = dt;
    return prev;
}

/* Ends a forward's temporary (see t_drop); NULL is a no-op. */
static void drop(em_tensor *h)
{
    if (h) t_drop(t_resolve(h, "drop"));
}

/* ---- construction helpers ---------------------------------------------------- */

/* Fills p with lo + (hi - lo) * U[0,1) drawn from rng. */
static em_status fill_uniform(em_tensor *p, double lo, double hi, em_rng *rng)
{
    em_scope s = em_scope_begin();
    bool prev = em_set_grad_enabled(false);
    em_tensor *u = em_rand(em_dtype_of(p), em_ndim(p), em_shape(p), rng);
    em_tensor *r = em_add_scalar(em_mul_scalar(u, hi - lo), lo);
    em_status st = r ? em_copy_into(p, r) : em_last_status();
    em_set_grad_enabled(prev);
    em_scope_end(s);
    return st;
}

/* Registers a new persistent parameter `name` of m: constant `value`, or
 * U(-bound, bound) when bound > 0. NULL + error on failure. */
static em_tensor *add_param(em_module *m, const char *name, int ndim, const int64_t *shape, double value,
                            double bound, em_rng *rng)
{
    tensor *t = t_new_persistent(param_dtype, ndim, shape);
    if (!t) return NULL;
    em_tensor *h = t_handle(t);
    fill_n(t->dtype, t_ptr(t), value, t_numel(t));
    em_status st = bound > 0 ? fill_uniform(h, -bound, bound, rng) : EM_OK;
    if (!st) st = em_module_add_param(m, name, h);
    if (st) {
        em_free(h);
        return NULL;
    }
    return h;
}

/* The module for a new layer and its struct (size bytes, zeroed), attached to
 * it. NULL + error if the name is bad or memory runs out. */
static void *new_layer(em_module *parent, const char *name, size_t size, em_module **m)
{
    *m = em_module_new(parent, name);
    if (!*m) return NULL;
    void *l = calloc(1, size);
    if (!l) {
        if (!parent) em_module_free(*m);
        return em_fail(EM_ERR_OOM, "%s: out of memory", name ? name : "layer");
    }
    em_module_set_owner(*m, l);
    return l;
}

/* After a failure while filling a layer: frees it when it is a root (a child
 * stays in its parent's tree, freed with it). Returns NULL. */
static void *abandon(em_module *parent, em_module *m)
{
    if (!parent) em_module_free(m);
    return NULL;
}

/* Checks a layer forward's input x: its last dim must be `dim`, its dtype the
 * parameter's, or, under autocast, the autocast dtype over f32 parameters
 * (a bf16 product's output going into the next Linear: the ops cast as their
 * policies say). */
static tensor *check_x(const char *kind, em_tensor *xh, int64_t dim, em_tensor *param)
{
    tensor *x = t_resolve(xh, kind);
    tensor *p = x ? t_resolve(param, kind) : NULL;
    if (!p) return NULL;
    if (x->ndim < 1 || x->shape[x->ndim - 1] != dim)
        return em_fail(EM_ERR_SHAPE, "x is %s, its last dim must be %lld (parameter is %s)", shp(x),
                       (long long)dim, shp(p));
    em_dtype ac = op_autocast();
    bool autocast_ok = ac != EM_F32 && p->dtype == EM_F32 && (x->dtype == ac || x->dtype == EM_F32);
    if (x->dtype != p->dtype && !autocast_ok)
        return em_fail(EM_ERR_DTYPE, "x is %s%s but the parameters are %s", em_dtype_name(x->dtype), shp(x),
                       em_dtype_name(p->dtype));
    return x;
}

/* ---- Linear -------------------------------------------------------------------- */

em_nn_linear *em_nn_linear_new(em_module *parent, const char *name, int64_t in, int64_t out, bool bias,
                               em_rng *rng)
{
    if (in < 1 || out < 1)
        return em_fail(EM_ERR_ARG, "em_nn_linear_new '%s': in = %lld and out = %lld must be >= 1",
                       name ? name : "", (long long)in, (long long)out);
    em_module *m;
    em_nn_linear *l = new_layer(parent, name, sizeof *l, &m);
    if (!l) return NULL;
    *l = (em_nn_linear){m, NULL, NULL, in, out};
    double bound = 1.0 / sqrt((double)in);
    l->weight = add_param(m, "weight", 2, (int64_t[]){out, in}, 0, bound, rng);
    if (!l->weight) return abandon(parent, m);
    if (bias) {
        l->bias = add_param(m, "bias", 1, (int64_t[]){out}, 0, bound, rng);
        if (!l->bias) return abandon(parent, m);
    }
    return l;
}

/* y = x @ W^T + b: (...,in) @ (in,out) -> (...,out), one linear op (the
 * bias added as the product is stored: tensor/ops_matmul.c) */
static em_tensor *linear_forward(em_nn_linear *l, em_tensor *xh)
{
    if (!l) return em_fail(EM_ERR_ARG, "em_nn_linear_forward: layer is NULL");
    tensor *x = check_x("linear", xh, l->in, l->weight);
    if (!x) return NULL;
    tensor *w = t_resolve(l->weight, "linear"), *b = l->bias ? t_resolve(l->bias, "linear") : NULL;
    if (!w || (l->bias && !b)) return NULL;
    return t_handle(t_linear(x, w, b));
}

em_tensor *em_nn_linear_forward(em_nn_linear *l, em_tensor *xh)
{
    if (!l) return em_fail(EM_ERR_ARG, "em_nn_linear_forward: layer is NULL");
    return nn_named(l->m, "linear", linear_forward(l, xh));
}

/* ---- Embedding ------------------------------------------------------------------ */

em_nn_embedding *em_nn_embedding_new(em_module *parent, const char *name, int64_t num, int64_t dim,
                                     em_rng *rng)
{
    if (num < 1 || dim < 1)
        return em_fail(EM_ERR_ARG, "em_nn_embedding_new '%s': num = %lld and dim = %lld must be >= 1",
                       name ? name : "", (long long)num, (long long)dim);
    em_module *m;
    em_nn_embedding *e = new_layer(parent, name, sizeof *e, &m);
    if (!e) return NULL;
    *e = (em_nn_embedding){m, NULL, num, dim};
    e->weight = add_param(m, "weight", 2, (int64_t[]){num, dim}, 0, 0, rng);
    if (!e->weight) return abandon(parent, m);
    /* N(0,1) */
    em_scope s = em_scope_begin();
    bool prev = em_set_grad_enabled(false);
    em_tensor *r = em_randn(param_dtype, EM_SHAPE(num, dim), rng);
    em_status st = r ? em_copy_into(e->weight, r) : em_last_status();
    em_set_grad_enabled(prev);
    em_scope_end(s);
    return st ? abandon(parent, m) : e;
}

/* y[...] = W[idx[...]] */
static em_tensor *embedding_forward(em_nn_embedding *e, em_tensor *idx)
{
    if (!e) return em_fail(EM_ERR_ARG, "em_nn_embedding_forward: layer is NULL");
    tensor *i = t_resolve(idx, "embedding");
    if (!i) return NULL;
    if (i->dtype != EM_I32)
        return em_fail(EM_ERR_DTYPE, "indices must be i32, got %s%s", em_dtype_name(i->dtype), shp(i));
    return em_embedding(e->weight, idx);
}

em_tensor *em_nn_embedding_forward(em_nn_embedding *e, em_tensor *idx)
{
    if (!e) return em_fail(EM_ERR_ARG, "em_nn_embedding_forward: layer is NULL");
    return nn_named(e->m, "embedding", embedding_forward(e, idx));
}

/* ---- LayerNorm, RMSNorm ------------------------------------------------------------ */

em_nn_layer_norm *em_nn_layer_norm_new(em_module *parent, const char *name, int64_t dim, bool bias)
{
    if (dim < 1)
        return em_fail(EM_ERR_ARG, "em_nn_layer_norm_new '%s': dim = %lld must be >= 1", name ? name : "",
                       (long long)dim);
    em_module *m;
    em_nn_layer_norm *l = new_layer(parent, name, sizeof *l, &m);
    if (!l) return NULL;
    *l = (em_nn_layer_norm){m, NULL, NULL, dim, 1e-5};
    l->weight = add_param(m, "weight", 1, &dim, 1.0, 0, NULL);
    if (!l->weight) return abandon(parent, m);
    if (bias) {
        l->bias = add_param(m, "bias", 1, &dim, 0.0, 0, NULL);
        if (!l->bias) return abandon(parent, m);
    }
    return l;
}

/* y = (x - mean) / sqrt(var + eps) * w + b */
static em_tensor *layer_norm_forward(em_nn_layer_norm *l, em_tensor *x)
{
    if (!l) return em_fail(EM_ERR_ARG, "em_nn_layer_norm_forward: layer is NULL");
    if (!check_x("layer_norm", x, l->dim, l->weight)) return NULL;
    return em_layer_norm(x, l->weight, l->bias, l->eps);
}

em_tensor *em_nn_layer_norm_forward(em_nn_layer_norm *l, em_tensor *x)
{
    if (!l) return em_fail(EM_ERR_ARG, "em_nn_layer_norm_forward: layer is NULL");
    return nn_named(l->m, "layer_norm", layer_norm_forward(l, x));
}

em_nn_rms_norm *em_nn_rms_norm_new(em_module *parent, const char *name, int64_t dim)
{
    if (dim < 1)
        return em_fail(EM_ERR_ARG, "em_nn_rms_norm_new '%s': dim = %lld must be >= 1", name ? name : "",
                       (long long)dim);
    em_module *m;
    em_nn_rms_norm *l = new_layer(parent, name, sizeof *l, &m);
    if (!l) return NULL;
    *l = (em_nn_rms_norm){m, NULL, dim, 1e-6};
    l->weight = add_param(m, "weight", 1, &dim, 1.0, 0, NULL);
    return l->weight ? l : abandon(parent, m);
}

/* y = x / sqrt(mean(x^2) + eps) * w */
static em_tensor *rms_norm_forward(em_nn_rms_norm *l, em_tensor *x)
{
    if (!l) return em_fail(EM_ERR_ARG, "em_nn_rms_norm_forward: layer is NULL");
    if (!check_x("rms_norm", x, l->dim, l->weight)) return NULL;
    return em_rms_norm(x, l->weight, l->eps);
}

em_tensor *em_nn_rms_norm_forward(em_nn_rms_norm *l, em_tensor *x)
{
    if (!l) return em_fail(EM_ERR_ARG, "em_nn_rms_norm_forward: layer is NULL");
    return nn_named(l->m, "rms_norm", rms_norm_forward(l, x));
}

/* ---- Dropout ------------------------------------------------------------------------ */

em_nn_dropout *em_nn_dropout_new(em_module *parent, const char *name, double p, em_rng *rng)
{
    if (!(p >= 0.0 && p < 1.0))
        return em_fail(EM_ERR_ARG, "em_nn_dropout_new '%s': p = %g is not in [0, 1)", name ? name : "", p);
    em_module *m;
    em_nn_dropout *d = new_layer(parent, name, sizeof *d, &m);
    if (!d) return NULL;
    if (!rng) rng = em_default_rng();
    uint32_t w[4]; /* one counter of rng gives the layer's seed */
    em_philox4x32(rng->seed, 0, rng->offset++, w);
    *d = (em_nn_dropout){m, p, em_rng_new((uint64_t)w[0] << 32 | w[1])};
    return em_module_add_rng(m, "rng", &d->rng) ? abandon(parent, m) : d;
}

static em_tensor *dropout_forward(em_nn_dropout *d, em_tensor *x)
{
    if (!d) return em_fail(EM_ERR_ARG, "em_nn_dropout_forward: layer is NULL");
    return em_dropout(x, d->p, em_module_is_training(d->m), &d->rng);
}

em_tensor *em_nn_dropout_forward(em_nn_dropout *d, em_tensor *x)
{
    if (!d) return em_fail(EM_ERR_ARG, "em_nn_dropout_forward: layer is NULL");
    return nn_named(d->m, "dropout", dropout_forward(d, x));
}

/* ---- Conv2d, pooling, flatten ---------------------------------------------------------- */

em_nn_conv2d *em_nn_conv2d_new(em_module *parent, const char *name, int64_t in_ch, int64_t out_ch, int kernel,
                               int stride, int padding, bool bias, em_rng *rng)
{
    if (in_ch < 1 || out_ch < 1 || kernel < 1 || stride < 1 || padding < 0)
        return em_fail(EM_ERR_ARG,
                       "em_nn_conv2d_new '%s': in_ch = %lld, out_ch = %lld, kernel = %d, stride = %d must be "
                       ">= 1 and padding = %d >= 0",
                       name ? name : "", (long long)in_ch, (long long)out_ch, kernel, stride, padding);
    em_module *m;
    em_nn_conv2d *c = new_layer(parent, name, sizeof *c, &m);
    if (!c) return NULL;
    *c = (em_nn_conv2d){m, NULL, NULL, in_ch, out_ch, kernel, stride, padding};
    double bound = 1.0 / sqrt((double)(in_ch * kernel * kernel));
    c->weight = add_param(m, "weight", 4, (int64_t[]){out_ch, in_ch, kernel, kernel}, 0, bound, rng);
    if (!c->weight) return abandon(parent, m);
    if (bias) {
        c->bias = add_param(m, "bias", 1, &out_ch, 0, bound, rng);
        if (!c->bias) return abandon(parent, m);
    }
    return c;
}

static em_tensor *conv2d_forward(em_nn_conv2d *c, em_tensor *xh)
{
    if (!c) return em_fail(EM_ERR_ARG, "em_nn_conv2d_forward: layer is NULL");
    tensor *x = t_resolve(xh, "conv2d");
    if (!x) return NULL;
    if (x->ndim != 4 || x->shape[1] != c->in_ch)
        return em_fail(EM_ERR_SHAPE, "x is %s, expected (N,%lld,H,W)", shp(x), (long long)c->in_ch);
    return em_conv2d(xh, c->weight, c->bias, c->stride, c->padding);
}

em_tensor *em_nn_conv2d_forward(em_nn_conv2d *c, em_tensor *xh)
{
    if (!c) return em_fail(EM_ERR_ARG, "em_nn_conv2d_forward: layer is NULL");
    return nn_named(c->m, "conv2d", conv2d_forward(c, xh));
}

em_tensor *em_nn_max_pool2d_forward(const em_nn_max_pool2d *p, em_tensor *x)
{
    if (!p) return em_fail(EM_ERR_ARG, "em_nn_max_pool2d_forward: pool is NULL");
    return em_max_pool2d(x, p->kernel, p->stride ? p->stride : p->kernel, p->padding);
}

/* (d0,..,d_{s-1}, d_s,..,d_n) -> (d0,..,d_{s-1}, d_s*..*d_n) */
em_tensor *em_nn_flatten(em_tensor *xh, int start_dim)
{
    tensor *x = t_resolve(xh, "flatten");
    if (!x) return NULL;
    int nd = x->ndim ? x->ndim : 1;
    int s = t_dim("flatten", start_dim, nd, 0);
    if (s < 0) return NULL;
    int64_t shape[EM_MAX_DIMS];
    for (int d = 0; d < s; d++) shape[d] = x->shape[d];
    shape[s] = 1;
    for (int d = s; d < x->ndim; d++) shape[s] *= x->shape[d];
    return t_handle(t_reshape(x, s + 1, shape));
}

/* ---- MSE loss ------------------------------------------------------------------------ */

/* L = sum((p - t)^2) / n;  dL/dp = 2 (p - t) / n. Composed of ops, after
 * mse_loss's own autocast policy (ops.def) is applied to both inputs. */
em_tensor *em_mse_loss(em_tensor *pred, em_tensor *target)
{
    tensor *p = t_resolve(pred, "mse_loss"), *t = p ? t_resolve(target, "mse_loss") : NULL;
    tensor *in[2] = {p, t};
    if (!t || !op_autocast_inputs(OP_MSE_LOSS, 2, in)) return NULL;
    p = in[0], t = in[1];
    if (p->ndim != t->ndim || memcmp(p->shape, t->shape, sizeof(int64_t) * (size_t)p->ndim))
        return em_fail(EM_ERR_SHAPE, "mse_loss: pred is %s but target is %s; shapes must be equal", shp(p),
                       shp(t));
    if (!chk_float("mse_loss", p) || !chk_same_dtype("mse_loss", p, t)) return NULL;
    int64_t n = t_numel(p);
    tensor *d = t_sub(p, t);
    tensor *sq = d ? t_mul(d, d) : NULL;
    tensor *s = sq ? t_sum(sq, 0, NULL, false) : NULL;
    tensor *l = s ? t_mul_scalar(s, n ? 1.0 / (double)n : NAN) : NULL;
    t_drop(d);
    t_drop(sq);
    t_drop(s);
    return t_handle(l);
}

/* ---- MLP ----------------------------------------------------------------------------- */

em_nn_mlp *em_nn_mlp_new(em_module *parent, const char *name, int64_t n_embd, bool bias, double dropout,
                         em_rng *rng)
{
    if (n_embd < 1)
        return em_fail(EM_ERR_ARG, "em_nn_mlp_new '%s': n_embd = %lld must be >= 1", name ? name : "",
                       (long long)n_embd);
    if (!(dropout >= 0.0 && dropout < 1.0))
        return em_fail(EM_ERR_ARG, "em_nn_mlp_new '%s': dropout = %g is not in [0, 1)", name ? name : "",
                       dropout);
    em_module *m;
    em_nn_mlp *l = new_layer(parent, name, sizeof *l, &m);
    if (!l) return NULL;
    l->m = m;
    l->c_fc = em_nn_linear_new(m, "c_fc", n_embd, 4 * n_embd, bias, rng);
    l->c_proj = l->c_fc ? em_nn_linear_new(m, "c_proj", 4 * n_embd, n_embd, bias, rng) : NULL;
    l->dropout = l->c_proj ? em_nn_dropout_new(m, "dropout", dropout, rng) : NULL;
    return l->dropout ? l : abandon(parent, m);
}

/* y = dropout(c_proj(gelu(c_fc(x)))): (...,C) -> (...,4C) -> (...,C) */
static em_tensor *mlp_forward(em_nn_mlp *l, em_tensor *x)
{
    if (!l) return em_fail(EM_ERR_ARG, "em_nn_mlp_forward: layer is NULL");
    em_tensor *h = em_nn_linear_forward(l->c_fc, x);
    em_tensor *a = l->gelu_tanh ? em_gelu_tanh(h) : em_gelu(h);
    drop(h);
    em_tensor *p = em_nn_linear_forward(l->c_proj, a);
    drop(a);
    em_tensor *y = em_nn_dropout_forward(l->dropout, p);
    if (y != p) drop(p);
    return y;
}

em_tensor *em_nn_mlp_forward(em_nn_mlp *l, em_tensor *x)
{
    if (!l) return em_fail(EM_ERR_ARG, "em_nn_mlp_forward: layer is NULL");
    return nn_named(l->m, "mlp", mlp_forward(l, x));
}

/* ---- causal self-attention ------------------------------------------------------------- */

em_nn_attention *em_nn_attention_new(em_module *parent, const char *name, int64_t n_embd, int64_t n_head,
                                     bool bias, double dropout, em_rng *rng)
{
    if (n_embd < 1 || n_head < 1 || n_embd % n_head)
        return em_fail(EM_ERR_ARG,
                       "em_nn_attention_new '%s': n_embd = %lld must be a positive multiple of n_head = %lld",
                       name ? name : "", (long long)n_embd, (long long)n_head);
    if (!(dropout >= 0.0 && dropout < 1.0))
        return em_fail(EM_ERR_ARG, "em_nn_attention_new '%s': dropout = %g is not in [0, 1)",
                       name ? name : "", dropout);
    em_module *m;
    em_nn_attention *a = new_layer(parent, name, sizeof *a, &m);
    if (!a) return NULL;
    *a = (em_nn_attention){m, NULL, NULL, NULL, n_embd, n_head};
    a->c_attn = em_nn_linear_new(m, "c_attn", n_embd, 3 * n_embd, bias, rng);
    a->c_proj = a->c_attn ? em_nn_linear_new(m, "c_proj", n_embd, n_embd, bias, rng) : NULL;
    a->resid_dropout = a->c_proj ? em_nn_dropout_new(m, "resid_dropout", dropout, rng) : NULL;
    return a->resid_dropout ? a : abandon(parent, m);
}

/* qkv = c_attn(x) (B,T,3C); y = softmax(q k^T / sqrt(D)) v (causal) per
 * head, read from qkv and merged into (B,T,C) by one op with no copy
 * (em_attention_causal_qkv); out = dropout(c_proj(y)) */
static em_tensor *attention_forward(em_nn_attention *a, em_tensor *xh)
{
    if (!a) return em_fail(EM_ERR_ARG, "em_nn_attention_forward: layer is NULL");
    tensor *x = t_resolve(xh, "attention");
    if (!x) return NULL;
    int64_t C = a->n_embd;
    if (x->ndim != 3 || x->shape[2] != C)
        return em_fail(EM_ERR_SHAPE, "x is %s, expected (B,T,%lld)", shp(x), (long long)C);
    em_tensor *qkv = em_nn_linear_forward(a->c_attn, xh);
    em_tensor *y = qkv ? em_attention_causal_qkv(qkv, a->n_head, 0) : NULL; /* (B,T,C) */
    drop(qkv);
    em_tensor *o = y ? em_nn_linear_forward(a->c_proj, y) : NULL;
    drop(y);
    em_tensor *out = o ? em_nn_dropout_forward(a->resid_dropout, o) : NULL;
    if (out != o) drop(o);
    return out;
}

em_tensor *em_nn_attention_forward(em_nn_attention *a, em_tensor *xh)
{
    if (!a) return em_fail(EM_ERR_ARG, "em_nn_attention_forward: layer is NULL");
    return nn_named(a->m, "attention", attention_forward(a, xh));
}

/* ---- transformer block ------------------------------------------------------------------ */

em_nn_block *em_nn_block_new(em_module *parent, const char *name, int64_t n_embd, int64_t n_head, bool bias,
                             double dropout, em_rng *rng)
{
    if (n_embd < 1 || n_head < 1 || n_embd % n_head)
        return em_fail(EM_ERR_ARG,
                       "em_nn_block_new '%s': n_embd = %lld must be a positive multiple of n_head = %lld",
                       name ? name : "", (long long)n_embd, (long long)n_head);
    if (!(dropout >= 0.0 && dropout < 1.0))
        return em_fail(EM_ERR_ARG, "em_nn_block_new '%s': dropout = %g is not in [0, 1)", name ? name : "",
                       dropout);
    em_module *m;
    em_nn_block *b = new_layer(parent, name, sizeof *b, &m);
    if (!b) return NULL;
    b->m = m;
    b->ln_1 = em_nn_layer_norm_new(m, "ln_1", n_embd, bias);
    b->attn = b->ln_1 ? em_nn_attention_new(m, "attn", n_embd, n_head, bias, dropout, rng) : NULL;
    b->ln_2 = b->attn ? em_nn_layer_norm_new(m, "ln_2", n_embd, bias) : NULL;
    b->mlp = b->ln_2 ? em_nn_mlp_new(m, "mlp", n_embd, bias, dropout, rng) : NULL;
    return b->mlp ? b : abandon(parent, m);
}

/* x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)) */
static em_tensor *block_forward(em_nn_block *b, em_tensor *x)
{
    if (!b) return em_fail(EM_ERR_ARG, "em_nn_block_forward: layer is NULL");
    em_tensor *h = em_nn_layer_norm_forward(b->ln_1, x);
    em_tensor *a = h ? em_nn_attention_forward(b->attn, h) : NULL;
    drop(h);
    em_tensor *x1 = a ? em_add(x, a) : NULL;
    drop(a);
    em_tensor *h2 = x1 ? em_nn_layer_norm_forward(b->ln_2, x1) : NULL;
    em_tensor *f = h2 ? em_nn_mlp_forward(b->mlp, h2) : NULL;
    drop(h2);
    em_tensor *y = f ? em_add(x1, f) : NULL;
    drop(f);
    drop(x1);
    return y;
}

em_tensor *em_nn_block_forward(em_nn_block *b, em_tensor *x)
{
    if (!b) return em_fail(EM_ERR_ARG, "em_nn_block_forward: layer is NULL");
    return nn_named(b->m, "block", block_forward(b, x));
}
