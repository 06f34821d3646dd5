/* gpt.c — GPT-2 (nanoGPT's model): building and initialising it, the
 * training forward and loss, and sampling with a key/value cache.
 *
 * logits = ln_f(blocks(drop(wte[idx] + wpe[0..T)))) @ wte^T, the output
 * projection tied to the token embedding. The cached forward runs new tokens
 * against the keys and values of the positions already seen (kept in
 * persistent buffers on the model's device), in a private scope, and copies
 * only the logits out. On CUDA every op of the sampling path runs on the
 * device; only the last position's logits come back to the host to draw. */
#include <stdio.h>
#include <stdlib.h>

#include "../tensor/tensor_impl.h"
#include "ember/nn.h"
#include "module_impl.h"

struct em_gpt_cache {
    em_gpt *g;
    int64_t batch, len;
    em_tensor *k, *v; /* (n_layer,B,H,block_size,D) */
};

static void drop(em_tensor *h)
{
    if (h) t_drop(t_resolve(h, "drop"));
}

/* ---- construction ------------------------------------------------------------ */

static em_status check_config(const em_gpt_config *c)
{
    if (!c) return em_err(EM_ERR_ARG, "em_gpt_new: config is NULL");
    const struct {
        const char *name;
        int64_t v;
    } sizes[] = {{"vocab_size", c->vocab_size},
                 {"block_size", c->block_size},
                 {"n_layer", c->n_layer},
                 {"n_head", c->n_head},
                 {"n_embd", c->n_embd}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].v < 1)
            return em_err(EM_ERR_ARG, "em_gpt_new: %s = %lld must be > 0", sizes[i].name,
                          (long long)sizes[i].v);
    if (c->n_embd % c->n_head)
        return em_err(EM_ERR_ARG, "em_gpt_new: n_embd = %lld is not a multiple of n_head = %lld",
                      (long long)c->n_embd, (long long)c->n_head);
    if (c->n_layer > 1000000)
        return em_err(EM_ERR_ARG, "em_gpt_new: n_layer = %lld is too large", (long long)c->n_layer);
    if (!(c->dropout >= 0.0 && c->dropout < 1.0))
        return em_err(EM_ERR_ARG, "em_gpt_new: dropout = %g is not in [0, 1)", c->dropout);
    return EM_OK;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* GPT-2 init: 2-D weights ~ N(0, 0.02) (c_proj: 0.02/sqrt(2 n_layer)), biases
 * 0, LayerNorm weights stay 1. */
static em_status gpt2_init(em_gpt *g, em_rng *rng)
{
    int n = em_module_params(g->m, NULL, 0);
    em_named *v = malloc(sizeof *v * (size_t)n);
    if (!v) return em_err(EM_ERR_OOM, "em_gpt_new: out of memory");
    em_module_params(g->m, v, n);
    em_status st = EM_OK;
    bool prev = em_set_grad_enabled(false);
    for (int i = 0; i < n && !st; i++) {
        em_scope s = em_scope_begin();
        em_tensor *p = v[i].t, *r = NULL;
        if (em_ndim(p) == 2) {
            double std =
                ends_with(v[i].name, "c_proj.weight") ? 0.02 / sqrt(2.0 * (double)g->cfg.n_layer) : 0.02;
            r = em_mul_scalar(em_randn(em_dtype_of(p), em_ndim(p), em_shape(p), rng), std);
        } else if (ends_with(v[i].name, ".bias")) {
            r = em_scalar(em_dtype_of(p), 0.0);
        }
        if (r)
            st = em_copy_into(p, r);
        else if (em_ndim(p) == 2)
            st = em_last_status();
        em_scope_end(s);
    }
    em_set_grad_enabled(prev);
    free(v);
    return st;
}

em_gpt *em_gpt_new(const em_gpt_config *cfg, uint64_t seed)
{
    if (check_config(cfg)) return NULL;
    em_gpt_config c = *cfg;
    em_module *root = em_module_new(NULL, NULL);
    em_gpt *g = root ? calloc(1, sizeof *g) : NULL;
    em_nn_block **h = g ? calloc((size_t)c.n_layer, sizeof *h) : NULL;
    if (!h) {
        free(g);
        em_module_free(root);
        return em_fail(EM_ERR_OOM, "em_gpt_new: out of memory");
    }
    em_module_set_owner(root, g);
    em_module_set_owner(root, h);
    *g = (em_gpt){.m = root, .cfg = c, .h = h};
    em_rng rng = em_rng_new(seed);
    g->wte = em_nn_embedding_new(root, "wte", c.vocab_size, c.n_embd, &rng);
    g->wpe = g->wte ? em_nn_embedding_new(root, "wpe", c.block_size, c.n_embd, &rng) : NULL;
    g->drop = g->wpe ? em_nn_dropout_new(root, "drop", c.dropout, &rng) : NULL;
    em_module *hm = g->drop ? em_module_new(root, "h") : NULL;
    bool ok = hm != NULL;
    for (int64_t i = 0; i < c.n_layer && ok; i++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)i);
        h[i] = em_nn_block_new(hm, name, c.n_embd, c.n_head, c.bias, c.dropout, &rng);
        ok = h[i] != NULL;
        if (ok) h[i]->mlp->gelu_tanh = c.gelu_tanh;
    }
    g->ln_f = ok ? em_nn_layer_norm_new(root, "ln_f", c.n_embd, c.bias) : NULL;
    if (!g->ln_f || gpt2_init(g, &rng)) {
        em_module_free(root);
        return NULL;
    }
    return g;
}

void em_gpt_free(em_gpt *g)
{
    if (g) em_module_free(g->m); /* g itself is owned by its root */
}

/* ---- training forward ------------------------------------------------------------ */

static tensor *check_idx(em_gpt *g, const char *op, em_tensor *idx)
{
    if (!g) return em_fail(EM_ERR_ARG, "%s: model is NULL", op);
    tensor *i = t_resolve(idx, op);
    if (!i) return NULL;
    if (i->dtype != EM_I32)
        return em_fail(EM_ERR_DTYPE, "%s: idx must be i32, got %s%s", op, em_dtype_name(i->dtype), shp(i));
    if (i->ndim != 2 || i->shape[1] < 1 || i->shape[1] > g->cfg.block_size)
        return em_fail(EM_ERR_SHAPE, "%s: idx is %s, expected (B,T) with 1 <= T <= block_size = %lld", op,
                       shp(i), (long long)g->cfg.block_size);
    return i;
}

/* x (B,T,C) -> ln_f -> @ wte^T -> (B,T,V) */
static em_tensor *head(em_gpt *g, em_tensor *x)
{
    em_tensor *xf = em_nn_layer_norm_forward(g->ln_f, x);
    tensor *w = t_resolve(g->wte->weight, "gpt");
    tensor *wt = w ? t_transpose(w, 0, 1) : NULL; /* (C,V) */
    em_tensor *logits = xf && wt ? em_matmul(xf, t_handle(wt)) : NULL;
    t_drop(wt);
    drop(xf);
    return logits;
}

static em_tensor *gpt_forward(em_gpt *g, tensor *i, em_tensor *idx)
{
    int64_t T = i->shape[1];
    em_tensor *tok = em_nn_embedding_forward(g->wte, idx); /* (B,T,C) */
    tensor *w = tok ? t_resolve(g->wpe->weight, "em_gpt_forward") : NULL;
    tensor *pos = w ? t_narrow(w, 0, 0, T) : NULL; /* (T,C) */
    em_tensor *x0 = pos ? em_add(tok, t_handle(pos)) : NULL;
    drop(tok);
    t_drop(pos);
    em_tensor *x = x0 ? em_nn_dropout_forward(g->drop, x0) : NULL;
    if (x != x0) drop(x0);
    for (int64_t l = 0; l < g->cfg.n_layer && x; l++) {
        em_tensor *y = em_nn_block_forward(g->h[l], x);
        drop(x);
        x = y;
    }
    em_tensor *logits = x ? head(g, x) : NULL;
    drop(x);
    return logits;
}

em_tensor *em_gpt_forward(em_gpt *g, em_tensor *idx)
{
    tensor *i = check_idx(g, "em_gpt_forward", idx);
    if (!i) return NULL;
    return nn_named(g->m, "gpt", gpt_forward(g, i, idx)); /* a failing layer names itself */
}

/* targets (or labels) resolved and checked against idx: i32 of its shape */
static tensor *check_targets(em_gpt *g, const char *op, em_tensor *idx, em_tensor *targets, const char *what)
{
    tensor *i = check_idx(g, op, idx);
    tensor *t = i ? t_resolve(targets, op) : NULL;
    if (!t) return NULL;
    if (t->dtype != EM_I32 || t->ndim != 2 || t->shape[0] != i->shape[0] || t->shape[1] != i->shape[1])
        return em_fail(EM_ERR_SHAPE, "%s: %s are %s%s, expected i32 of idx's shape %s", op, what,
                       em_dtype_name(t->dtype), shp(t), shp(i));
    return t;
}

/* The cross-entropy of logits against targets ignoring EM_IGNORE_INDEX; a
 * target of -1 (ember's ignore value before it took PyTorch's -100) is
 * named as such. */
static em_tensor *gpt_ce(const char *op, em_tensor *logits, em_tensor *targets)
{
    em_tensor *loss = logits && targets ? em_cross_entropy(logits, targets, EM_IGNORE_INDEX) : NULL;
    if (!loss && em_last_status() == EM_ERR_INDEX && strstr(em_last_error(), "target -1 ")) {
        return em_fail(
            EM_ERR_INDEX,
            "%s: %s; positions to ignore are marked -100 (EM_IGNORE_INDEX, as in PyTorch and Hugging "
            "Face), no longer -1",
            op, em_last_error());
    }
    return loss;
}

em_tensor *em_gpt_loss(em_gpt *g, em_tensor *idx, em_tensor *targets)
{
    if (!check_targets(g, "em_gpt_loss", idx, targets, "targets")) return NULL;
    em_tensor *logits = em_gpt_forward(g, idx);
    em_tensor *loss = gpt_ce("em_gpt_loss", logits, targets);
    drop(logits);
    return loss;
}

em_tensor *em_gpt_loss_labels(em_gpt *g, em_tensor *idx, em_tensor *labels)
{
    const char *op = "em_gpt_loss_labels";
    tensor *l = check_targets(g, op, idx, labels, "labels");
    if (!l) return NULL;
    int64_t T = l->shape[1];
    em_tensor *logits = em_gpt_forward(g, idx); /* (B,T,V) */
    /* position t predicts token t+1: logits[:, :-1] against labels[:, 1:] */
    em_tensor *lg = logits ? em_narrow(logits, 1, 0, T - 1) : NULL;
    em_tensor *lb = lg ? em_narrow(labels, 1, 1, T - 1) : NULL;
    em_tensor *loss = gpt_ce(op, lg, lb);
    drop(lb);
    drop(lg);
    drop(logits);
    return loss;
}

/* ---- the key/value cache ------------------------------------------------------------ */

em_gpt_cache *em_gpt_cache_new(em_gpt *g, int64_t batch)
{
    if (!g) return em_fail(EM_ERR_ARG, "em_gpt_cache_new: model is NULL");
    if (batch < 1)
        return em_fail(EM_ERR_ARG, "em_gpt_cache_new: batch = %lld must be >= 1", (long long)batch);
    const em_gpt_config *c = &g->cfg;
    int64_t shape[5] = {c->n_layer, batch, c->n_head, c->block_size, c->n_embd / c->n_head};
    em_gpt_cache *kv = calloc(1, sizeof *kv);
    em_dtype dt = em_dtype_of(g->wte->weight);
    em_device dev = em_device_of(g->wte->weight); /* the cache lives beside the model */
    tensor *k = kv ? t_new_persistent_on(dev, dt, 5, shape) : NULL,
           *v = k ? t_new_persistent_on(dev, dt, 5, shape) : NULL;
    if (!v) {
        t_drop(k);
        free(kv);
        return em_fail(EM_ERR_OOM, "em_gpt_cache_new: out of memory for 2 x %s", shp_of(5, shape));
    }
    *kv = (em_gpt_cache){g, batch, 0, t_handle(k), t_handle(v)};
    return kv;
}

void em_gpt_cache_reset(em_gpt_cache *c)
{
    if (c) c->len = 0;
}

int64_t em_gpt_cache_len(const em_gpt_cache *c) { return c ? c->len : 0; }

void em_gpt_cache_free(em_gpt_cache *c)
{
    if (!c) return;
    em_free(c->k);
    em_free(c->v);
    free(c);
}

/* Layer l's cache buffer narrowed to positions [0, n): (B,H,n,D). */
static em_tensor *cache_view(em_tensor *buf, int64_t l, int64_t n)
{
    return em_narrow(em_squeeze(em_narrow(buf, 0, l, 1), 0), 2, 0, n);
}

/* One block on t new tokens at positions pos..pos+t-1: x (B,t,C) -> (B,t,C),
 * appending their keys and values to the cache. No dropout. */
static em_tensor *block_cached(em_gpt *g, em_gpt_cache *c, int64_t l, em_tensor *x, int64_t pos, int64_t t)
{
    em_nn_block *b = g->h[l];
    int64_t B = c->batch, C = g->cfg.n_embd, H = g->cfg.n_head, D = C / H, L = pos + t;
    em_tensor *qkv =
        em_nn_linear_forward(b->attn->c_attn, em_nn_layer_norm_forward(b->ln_1, x)); /* (B,t,3C) */
    em_tensor *p[3];
    for (int i = 0; i < 3; i++) /* (B,t,C) -> (B,H,t,D) */
        p[i] = em_transpose(em_reshape(em_narrow(qkv, 2, i * C, C), EM_SHAPE(B, t, H, D)), 1, 2);
    em_tensor *K = cache_view(c->k, l, L), *V = cache_view(c->v, l, L); /* (B,H,L,D) */
    if (!p[0] || !p[1] || !p[2] || !K || !V) return NULL;
    em_status st = em_copy_into(em_narrow(K, 2, pos, t), p[1]);
    if (!st) st = em_copy_into(em_narrow(V, 2, pos, t), p[2]);
    if (st) return NULL;
    /* new query i (absolute position pos+i) sees keys j <= pos+i; made on the
     * host, then moved to the model's device */
    em_tensor *mask = em_empty(EM_BOOL, EM_SHAPE(t, L));
    if (!mask) return NULL;
    uint8_t *mk = em_data(mask);
    for (int64_t i = 0; i < t; i++)
        for (int64_t j = 0; j < L; j++) mk[i * L + j] = j > pos + i;
    if (!(mask = em_to(mask, em_device_of(x)))) return NULL;
    em_tensor *s =
        em_mul_scalar(em_matmul(p[0], em_transpose(K, 2, 3)), 1.0 / sqrt((double)D)); /* (B,H,t,L) */
    em_tensor *y = em_matmul(em_softmax(em_masked_fill(s, mask, -INFINITY), -1), V);  /* (B,H,t,D) */
    y = em_reshape(em_transpose(y, 1, 2), EM_SHAPE(B, t, C));
    x = em_add(x, em_nn_linear_forward(b->attn->c_proj, y));
    em_tensor *f = em_nn_linear_forward(b->mlp->c_fc, em_nn_layer_norm_forward(b->ln_2, x));
    return em_add(x, em_nn_linear_forward(b->mlp->c_proj, b->mlp->gelu_tanh ? em_gelu_tanh(f) : em_gelu(f)));
}

em_tensor *em_gpt_forward_cached(em_gpt *g, em_gpt_cache *c, em_tensor *idx)
{
    if (!g || !c) return em_fail(EM_ERR_ARG, "em_gpt_forward_cached: model or cache is NULL");
    if (c->g != g) return em_fail(EM_ERR_ARG, "em_gpt_forward_cached: the cache was made for another model");
    tensor *i = t_resolve(idx, "em_gpt_forward_cached");
    if (!i) return NULL;
    if (i->dtype != EM_I32)
        return em_fail(EM_ERR_DTYPE, "em_gpt_forward_cached: idx must be i32, got %s%s",
                       em_dtype_name(i->dtype), shp(i));
    if (i->ndim != 2 || i->shape[0] != c->batch || i->shape[1] < 1)
        return em_fail(EM_ERR_SHAPE, "em_gpt_forward_cached: idx is %s, expected (%lld,t) with t >= 1",
                       shp(i), (long long)c->batch);
    int64_t t = i->shape[1], pos = c->len, V = g->cfg.vocab_size;
    if (pos + t > g->cfg.block_size)
        return em_fail(EM_ERR_SHAPE,
                       "em_gpt_forward_cached: %lld cached + %lld new positions exceed block_size = %lld "
                       "(reset the cache and crop the context)",
                       (long long)pos, (long long)t, (long long)g->cfg.block_size);
    bool prev = em_set_grad_enabled(false);
    /* the result lives in the caller's scope, on the model's device; the rest
     * in a private one (idx moves to the model's device when it is elsewhere) */
    em_device dev = em_device_of(g->wte->weight);
    em_tensor *out = t_handle(t_new_on(dev, em_dtype_of(g->wte->weight), 3, (int64_t[]){c->batch, t, V}));
    em_scope s = em_scope_begin();
    em_tensor *x = em_nn_embedding_forward(g->wte, em_to(idx, dev));
    x = em_add(x, em_narrow(g->wpe->weight, 0, pos, t)); /* (B,t,C) */
    for (int64_t l = 0; l < g->cfg.n_layer && x; l++) x = block_cached(g, c, l, x, pos, t);
    em_tensor *logits = x ? head(g, x) : NULL;
    em_status st = out && logits ? em_copy_into(out, logits) : EM_ERR_ARG;
    em_scope_end(s);
    em_set_grad_enabled(prev);
    if (st) {
        if (out && !em_scope_depth()) em_free(out);
        return NULL;
    }
    c->len += t;
    return out;
}

/* ---- sampling --------------------------------------------------------------------- */

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* A token drawn from softmax(logits / temperature) over the top_k largest
 * logits, with the uniform number u in [0,1). work: V doubles of scratch. */
static int32_t draw_token(const double *logits, int64_t V, double temperature, int top_k, double u,
                          double *work)
{
    double thr = -INFINITY, mx = -INFINITY;
    if (top_k > 0 && top_k < V) {
        memcpy(work, logits, sizeof *work * (size_t)V);
        qsort(work, (size_t)V, sizeof *work, cmp_desc);
        thr = work[top_k - 1];
    }
    for (int64_t j = 0; j < V; j++)
        if (logits[j] >= thr && logits[j] > mx) mx = logits[j];
    double total = 0;
    for (int64_t j = 0; j < V; j++) { /* p_j ∝ exp((l_j - max) / temperature) */
        work[j] = logits[j] >= thr ? exp((logits[j] - mx) / temperature) : 0.0;
        total += work[j];
    }
    double target = u * total, cum = 0;
    int32_t last = 0;
    for (int64_t j = 0; j < V; j++) {
        if (work[j] <= 0) continue;
        cum += work[j];
        last = (int32_t)j;
        if (cum > target) return last;
    }
    return last;
}

/* Runs tokens[0..n) through the cache and leaves the last position's logits
 * in row (V doubles). */
static em_status feed(em_gpt *g, em_gpt_cache *c, const int32_t *tokens, int64_t n, double *row)
{
    em_scope s = em_scope_begin();
    em_tensor *idx = em_from_data(EM_I32, EM_SHAPE(1, n), tokens);
    if (idx) idx = em_to(idx, em_device_of(g->wte->weight));
    em_tensor *logits = idx ? em_gpt_forward_cached(g, c, idx) : NULL;
    em_tensor *last = logits ? em_narrow(logits, 1, n - 1, 1) : NULL;
    em_status st = last ? em_to_array(last, EM_F64, row) : em_last_status();
    em_scope_end(s);
    return st;
}

int em_gpt_sample(em_gpt *g, const int32_t *prompt, int n_prompt, int n_new, double temperature, int top_k,
                  em_rng *rng, int32_t *out)
{
    return em_gpt_sample_progress(g, prompt, n_prompt, n_new, temperature, top_k, rng, out, NULL, NULL);
}

int em_gpt_sample_progress(em_gpt *g, const int32_t *prompt, int n_prompt, int n_new, double temperature,
                           int top_k, em_rng *rng, int32_t *out, em_gpt_token_fn on_token, void *ctx)
{
    if (!g || !prompt || !out) return em_err(EM_ERR_ARG, "em_gpt_sample: model, prompt or out is NULL"), -1;
    if (n_prompt < 1 || n_new < 0)
        return em_err(EM_ERR_ARG, "em_gpt_sample: n_prompt = %d must be >= 1 and n_new = %d >= 0", n_prompt,
                      n_new),
               -1;
    if (!(temperature > 0) || !isfinite(temperature) || top_k < 0)
        return em_err(EM_ERR_ARG, "em_gpt_sample: temperature = %g must be > 0 and top_k = %d >= 0",
                      temperature, top_k),
               -1;
    int64_t V = g->cfg.vocab_size, block = g->cfg.block_size;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return em_err(EM_ERR_INDEX, "em_gpt_sample: prompt[%d] = %d is out of range [0, %lld)", i,
                          prompt[i], (long long)V),
                   -1;
    if (!rng) rng = em_default_rng();
    memmove(out, prompt, sizeof *out * (size_t)n_prompt);
    if (n_new == 0) return n_prompt;
    em_gpt_cache *c = em_gpt_cache_new(g, 1);
    double *row = malloc(sizeof *row * (size_t)V * 2);
    if (!c || !row) {
        em_gpt_cache_free(c);
        free(row);
        return em_err(EM_ERR_OOM, "em_gpt_sample: out of memory"), -1;
    }
    int64_t len = n_prompt, start = len > block ? len - block : 0;
    em_status st = feed(g, c, out + start, len - start, row);
    for (int k = 0; k < n_new && !st; k++) {
        em_scope s = em_scope_begin();
        double u = em_item(em_rand(EM_F64, EM_SHAPE(1), rng));
        em_scope_end(s);
        out[len++] = draw_token(row, V, temperature, top_k, u, row + V);
        if (on_token) on_token(ctx, k + 1, n_new);
        if (k == n_new - 1) break;
        if (len - start > block) { /* the window slides: positions change, recompute */
            start = len - block;
            em_gpt_cache_reset(c);
            st = feed(g, c, out + start, block, row);
        } else {
            st = feed(g, c, out + len - 1, 1, row);
        }
    }
    em_gpt_cache_free(c);
    free(row);
    return st ? -1 : n_prompt + n_new;
}
