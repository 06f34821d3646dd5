/* ember/nn.h — modules: a tree of named parameters and buffers, train/eval
 * mode, the flat parameter layout, and the layers up to a GPT.
 *
 * A module is a node with a name; its full name is the dotted path from the
 * root ("h.3.attn.qkv"). Parameters and buffers are persistent tensors that
 * the module owns (freed with the root). Layers are plain structs holding
 * their module and direct handles to their tensors, so a forward function
 * reads like the maths:  y = x @ W^T + b.
 *
 * Flat layout (DESIGN.md): after the model is built, em_module_flatten moves
 * every parameter into one contiguous buffer per dtype and every gradient
 * into a matching buffer, in registration order. Parameter handles stay
 * valid (their storage is re-pointed), so the optimizer, all-reduce buckets,
 * ZeRO shards and checkpoints can work on flat slices.
 */
#ifndef EMBER_NN_H
#define EMBER_NN_H

#include "autograd.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is the exported API of libember.so, which
 * builds with hidden visibility (meson.build): nothing else leaves it. (nvcc
 * is left out: no .cu file defines a public function.) */
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

typedef struct em_module em_module;

/* A tensor with its full dotted name. */
typedef struct em_named {
    const char *name;
    em_tensor *t;
} em_named;

/* ---- the module tree -------------------------------------------------------
 * em_module_new makes a child of parent (NULL: a root). The name must be
 * non-empty for a child, without '.', and unique among parent's children
 * (EM_ERR_ARG otherwise; NULL returned). Children are owned by their parent;
 * em_module_free on the root frees the whole tree: modules, parameters,
 * buffers and the layer structs attached with em_module_set_owner. */
em_module *em_module_new(em_module *parent, const char *name);
void em_module_free(em_module *root);
/* Full dotted name ("" for a root). Owned by m. */
const char *em_module_name(const em_module *m);
/* Attaches a heap block that is free()d with m (the layer struct). */
void em_module_set_owner(em_module *m, void *block);

/* Registers a persistent tensor as parameter `name` of m; m takes ownership
 * (do not em_free it) and sets requires_grad. EM_ERR_SCOPE for a scoped
 * tensor, EM_ERR_ARG for a duplicate or bad name. */
em_status em_module_add_param(em_module *m, const char *name, em_tensor *t);
/* Same for a buffer (state that is saved but not trained; no grad). */
em_status em_module_add_buffer(em_module *m, const char *name, em_tensor *t);

/* All parameters (or buffers) of m's subtree, depth-first in registration
 * order, names relative to m ("attn.qkv.weight" when m is a block). Writes
 * min(count, max) entries to out (out may be NULL with max 0); returns the
 * count. Names stay valid while the tree lives. */
int em_module_params(const em_module *m, em_named *out, int max);
int em_module_buffers(const em_module *m, em_named *out, int max);
/* A generator a module owns, with its full dotted name ("h.0.mlp.dropout.rng"). */
typedef struct em_named_rng {
    const char *name;
    em_rng *rng;
} em_named_rng;

/* Registers generator `name` of m (a layer's own random stream, such as
 * dropout's mask generator), so that whoever saves the model's training
 * state finds it: em_accel_save_state / em_accel_load_state keep the
 * generators of every prepared model by name. rng is borrowed and must live
 * as long as m (put it in the layer struct attached to m). Names share one
 * namespace with m's parameters, buffers and children: EM_ERR_ARG for a
 * duplicate or bad name (or NULL m / rng). */
em_status em_module_add_rng(em_module *m, const char *name, em_rng *rng);
/* The generators of m's subtree, depth-first in registration order, names
 * relative to m; writes min(count, max) entries to out (out may be NULL with
 * max 0) and returns the count, like em_module_params. */
int em_module_rngs(const em_module *m, em_named_rng *out, int max);

/* The parameter or buffer at a dotted name relative to m; NULL (no error
 * set) if none. */
em_tensor *em_module_find(const em_module *m, const char *name);
/* Number of parameter elements in m's subtree. */
int64_t em_module_num_params(const em_module *m);

/* Training mode (dropout on) for m's subtree; modules start in training. */
void em_module_train(em_module *m, bool training);
bool em_module_is_training(const em_module *m);

/* Moves every parameter and buffer of root's subtree to device `dev`
 * (values kept, gradients dropped); handles stay valid. Call it before
 * em_module_flatten (and so before em_accel_prepare, which flattens).
 * Errors: EM_ERR_ARG if root is not a root or is already flattened,
 * EM_ERR_DEVICE if dev is not usable; on an error part of the model may
 * have moved, so the model should not be used further. */
em_status em_module_to(em_module *root, em_device dev);
/* Moves every parameter of root's subtree into one contiguous persistent
 * buffer per dtype (values kept) and points every gradient into a matching
 * zeroed buffer (em_set_grad_buffer), on the parameters' device. Handles
 * stay valid. Idempotent. EM_ERR_ARG if root is not a root; EM_ERR_DEVICE
 * if parameters of one dtype are on different devices. */
em_status em_module_flatten(em_module *root);
/* The flat parameter / gradient buffer of dtype dt (1-D, owned by root), or
 * NULL if root is not flattened or has no parameter of that dtype. */
em_tensor *em_module_flat_params(const em_module *root, em_dtype dt);
em_tensor *em_module_flat_grads(const em_module *root, em_dtype dt);
/* Zeroes every parameter gradient of m's subtree. */
em_status em_module_zero_grad(em_module *m);

/* ---- state dicts: safetensors (nn/safetensors.c) ---------------------------
 * The real format: 8-byte little-endian header length, a JSON header
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 *  "__metadata__": {...}}, then raw little-endian data. Files are written to
 * PATH.tmp, fsync'd and renamed, so a crash never leaves a half file at PATH.
 * Every file ember writes carries its own checksum, "ember.crc32" in the
 * metadata (8 hex digits: the crc32 of the whole file with those digits read
 * as '0'); a file that has one is verified when opened. */
/* Writes n named tensors (any strides; written contiguous). metadata: NULL
 * or a flat JSON object of string values, e.g. {"format":"pt"}; its
 * "ember.crc32", if any, is replaced by the file's own. */
em_status em_safetensors_save(const char *path, int n, const em_named *tensors, const char *metadata_json);

typedef struct em_safetensors em_safetensors;
/* Opens and validates a file (header JSON, dtypes, offsets inside the file,
 * no overlaps) and, when it has "ember.crc32", reads it once through to
 * check it. NULL + EM_ERR_IO naming the path and what is wrong ("the
 * checksum does not match" for a damaged file). Files of other writers have
 * no checksum and are not read through. */
em_safetensors *em_safetensors_open(const char *path);
void em_safetensors_close(em_safetensors *f);
int em_safetensors_count(const em_safetensors *f);
const char *em_safetensors_name(const em_safetensors *f, int i); /* owned by f */
/* The shape of tensor `name` from the header alone (no data is read): its
 * dims into shape (caller's, EM_MAX_DIMS long) and their number returned;
 * -1 + EM_ERR_ARG if there is no such name (or f, name, shape is NULL),
 * EM_ERR_SHAPE if it has more than EM_MAX_DIMS dims. */
int em_safetensors_shape(const em_safetensors *f, const char *name, int64_t shape[EM_MAX_DIMS]);
/* A new persistent tensor (caller frees) with the stored values; NULL +
 * EM_ERR_ARG if there is no such name. */
em_tensor *em_safetensors_get(const em_safetensors *f, const char *name);
/* The value of a metadata key, or NULL. Owned by f. */
const char *em_safetensors_metadata(const em_safetensors *f, const char *key);

/* Saves m's parameters and buffers (names relative to m). */
em_status em_module_save(const em_module *m, const char *path);
/* Loads into m's parameters and buffers by name: shapes must match exactly;
 * dtypes are converted. strict: every tensor of m must be in the file and
 * every tensor in the file must belong to m (EM_ERR_ARG listing the first
 * missing/unexpected names). Nothing is modified unless all checks pass. */
em_status em_module_load(em_module *m, const char *path, bool strict);

/* ---- layers (nn/layers.c) ---------------------------------------------------
 * Each layer is a plain struct holding its module `m` and direct handles to
 * its parameters. xxx_new(parent, name, ..., rng) makes the child module
 * `name` of parent (parent NULL: the layer is a root), registers the
 * parameters, attaches the struct to the module (it is freed with the root:
 * em_module_free, never free() it) and returns it; on a bad argument it
 * returns NULL with EM_ERR_ARG naming the layer and the value, having made
 * nothing. rng (NULL: the default generator) draws the initial values and
 * advances. Parameters are persistent, of the dtype set by
 * em_nn_set_param_dtype (f32 unless changed).
 *
 * Forward functions take the struct and input tensors and return a tensor in
 * the caller's scope (or persistent, with grad mode off, when no scope is
 * open); a shape or dtype that does not fit fails with EM_ERR_SHAPE /
 * EM_ERR_DTYPE naming the module ("linear 'h.0.mlp.c_fc': ...") and the
 * shapes. A NULL input gives NULL, keeping the earlier error. */

/* The float dtype of parameters made by later xxx_new calls on this thread
 * (like torch.set_default_dtype); returns the previous one. A non-float dtype
 * is ignored (and returned unchanged). */
em_dtype em_nn_set_param_dtype(em_dtype dt);

/* y = x @ W^T + b.  weight (out,in) (PyTorch layout), bias (out) or NULL.
 * Init (PyTorch's default): W, b ~ U(-1/sqrt(in), 1/sqrt(in)).
 * Forward: x (...,in) -> (...,out); x may be 1-D (in) -> (out). */
typedef struct em_nn_linear {
    em_module *m;
    em_tensor *weight, *bias;
    int64_t in, out;
} em_nn_linear;
em_nn_linear *em_nn_linear_new(em_module *parent, const char *name, int64_t in, int64_t out, bool bias,
                               em_rng *rng);
em_tensor *em_nn_linear_forward(em_nn_linear *l, em_tensor *x);

/* y = weight[idx].  weight (num,dim), init N(0,1) (PyTorch's default).
 * Forward: idx EM_I32 (...) -> (...,dim); an index outside [0,num) fails
 * with EM_ERR_INDEX. */
typedef struct em_nn_embedding {
    em_module *m;
    em_tensor *weight;
    int64_t num, dim;
} em_nn_embedding;
em_nn_embedding *em_nn_embedding_new(em_module *parent, const char *name, int64_t num, int64_t dim, em_rng *rng);
em_tensor *em_nn_embedding_forward(em_nn_embedding *e, em_tensor *idx);

/* y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim.
 * weight ones (dim), bias zeros (dim) or none; eps 1e-5 (the field may be
 * changed). Forward: x (...,dim) -> (...,dim). */
typedef struct em_nn_layer_norm {
    em_module *m;
    em_tensor *weight, *bias;
    int64_t dim;
    double eps;
} em_nn_layer_norm;
em_nn_layer_norm *em_nn_layer_norm_new(em_module *parent, const char *name, int64_t dim, bool bias);
em_tensor *em_nn_layer_norm_forward(em_nn_layer_norm *l, em_tensor *x);

/* y = x / sqrt(mean(x^2) + eps) * weight over the last dim; weight ones
 * (dim); eps 1e-6 (the field may be changed). x (...,dim) -> (...,dim). */
typedef struct em_nn_rms_norm {
    em_module *m;
    em_tensor *weight;
    int64_t dim;
    double eps;
} em_nn_rms_norm;
em_nn_rms_norm *em_nn_rms_norm_new(em_module *parent, const char *name, int64_t dim);
em_tensor *em_nn_rms_norm_forward(em_nn_rms_norm *l, em_tensor *x);

/* Zeroes elements with probability p (scaling the rest by 1/(1-p)) while
 * the module is training (em_module_train), the identity in eval mode or
 * when p == 0 (then the input handle itself is returned). p in [0,1). The
 * mask comes from the layer's own generator `rng`, seeded at creation from
 * one draw of the rng passed to _new; it advances with every masked call.
 * It is registered as the module's generator "rng" (em_module_add_rng), so
 * an Accelerator's save_state keeps it with the model. */
typedef struct em_nn_dropout {
    em_module *m;
    double p;
    em_rng rng;
} em_nn_dropout;
em_nn_dropout *em_nn_dropout_new(em_module *parent, const char *name, double p, em_rng *rng);
em_tensor *em_nn_dropout_forward(em_nn_dropout *d, em_tensor *x);

/* 2-D convolution. weight (out_ch,in_ch,k,k), bias (out_ch) or none; init
 * (PyTorch's default) U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in =
 * in_ch*k*k. Forward: x (N,in_ch,H,W) -> (N,out_ch,OH,OW). */
typedef struct em_nn_conv2d {
    em_module *m;
    em_tensor *weight, *bias;
    int64_t in_ch, out_ch;
    int kernel, stride, padding;
} em_nn_conv2d;
em_nn_conv2d *em_nn_conv2d_new(em_module *parent, const char *name, int64_t in_ch, int64_t out_ch, int kernel,
                               int stride, int padding, bool bias, em_rng *rng);
em_tensor *em_nn_conv2d_forward(em_nn_conv2d *c, em_tensor *x);

/* Max pooling has no parameters and no module: a value struct.
 *   em_nn_max_pool2d pool = {2, 2, 0};  y = em_nn_max_pool2d_forward(&pool, x);
 * x (N,C,H,W) -> (N,C,OH,OW); stride 0 means stride = kernel. */
typedef struct em_nn_max_pool2d {
    int kernel, stride, padding;
} em_nn_max_pool2d;
em_tensor *em_nn_max_pool2d_forward(const em_nn_max_pool2d *p, em_tensor *x);

/* Flattens dims start_dim.. into one (torch.flatten(x, start_dim); nn.Flatten
 * uses start_dim 1): (N,C,H,W) with start_dim 1 -> (N,C*H*W). A view when the
 * strides allow, else a copy. Differentiable. */
em_tensor *em_nn_flatten(em_tensor *x, int start_dim);

/* Mean squared error: mean((pred - target)^2) over all elements, a 0-dim
 * tensor. pred and target have the same shape and float dtype (EM_ERR_SHAPE
 * / EM_ERR_DTYPE naming both). Differentiable in both. */
em_tensor *em_mse_loss(em_tensor *pred, em_tensor *target);

/* The GPT-2 MLP: c_fc Linear C->4C, gelu (tanh approximation), c_proj
 * Linear 4C->C, dropout. x (...,C) -> (...,C). */
typedef struct em_nn_mlp {
    em_module *m;
    em_nn_linear *c_fc, *c_proj;
    em_nn_dropout *dropout;
    bool gelu_tanh; /* false (the default): exact GELU, as torch.nn.GELU and nanoGPT;
                     * true: the tanh approximation of GPT-2 */
} em_nn_mlp;
em_nn_mlp *em_nn_mlp_new(em_module *parent, const char *name, int64_t n_embd, bool bias, double dropout,
                         em_rng *rng);
em_tensor *em_nn_mlp_forward(em_nn_mlp *mlp, em_tensor *x);

/* Causal self-attention: c_attn Linear C->3C gives q, k, v (in that order
 * along the last dim), each split into n_head heads of D = C/n_head;
 * softmax(q k^T / sqrt(D)) v with position i seeing j <= i; heads merged,
 * c_proj Linear C->C, resid_dropout. x (B,T,C) -> (B,T,C). n_embd must be a
 * multiple of n_head. */
typedef struct em_nn_attention {
    em_module *m;
    em_nn_linear *c_attn, *c_proj;
    em_nn_dropout *resid_dropout;
    int64_t n_embd, n_head;
} em_nn_attention;
em_nn_attention *em_nn_attention_new(em_module *parent, const char *name, int64_t n_embd, int64_t n_head,
                                     bool bias, double dropout, em_rng *rng);
em_tensor *em_nn_attention_forward(em_nn_attention *a, em_tensor *x);

/* A pre-LN transformer block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
 * x (B,T,C) -> (B,T,C). */
typedef struct em_nn_block {
    em_module *m;
    em_nn_layer_norm *ln_1, *ln_2;
    em_nn_attention *attn;
    em_nn_mlp *mlp;
} em_nn_block;
em_nn_block *em_nn_block_new(em_module *parent, const char *name, int64_t n_embd, int64_t n_head, bool bias,
                             double dropout, em_rng *rng);
em_tensor *em_nn_block_forward(em_nn_block *b, em_tensor *x);

/* ---- GPT (nn/gpt.c) -----------------------------------------------------------
 * GPT-2 as nanoGPT builds it: token (wte) + learned position (wpe)
 * embeddings, dropout, n_layer pre-LN blocks, ln_f, and logits = x @ wte^T
 * (the output projection is tied to wte: there is no lm_head parameter).
 * Parameter names, relative to g->m (the root):
 *   wte.weight (V,C), wpe.weight (block_size,C),
 *   h.{i}.ln_1.weight/.bias (C), h.{i}.attn.c_attn.weight (3C,C)/.bias (3C),
 *   h.{i}.attn.c_proj.weight (C,C)/.bias (C), h.{i}.ln_2.weight/.bias (C),
 *   h.{i}.mlp.c_fc.weight (4C,C)/.bias (4C), h.{i}.mlp.c_proj.weight (C,4C)/.bias (C),
 *   ln_f.weight/.bias (C)
 * (no .bias parameters when cfg.bias is false). Init (GPT-2): every Linear
 * and Embedding weight ~ N(0, 0.02), the two c_proj weights of each block ~
 * N(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weights 1. */
typedef struct em_gpt_config {
    int64_t vocab_size, block_size, n_layer, n_head, n_embd;
    double dropout; /* in [0,1) */
    bool bias;      /* biases in the Linear and LayerNorm layers */
    bool gelu_tanh; /* MLP activation: false = exact GELU (nanoGPT, the default), true = the
                     * tanh approximation (GPT-2; set it to run GPT-2 checkpoints) */
} em_gpt_config;

typedef struct em_gpt {
    em_module *m; /* the root: params, train/eval, flatten, save/load */
    em_gpt_config cfg;
    em_nn_embedding *wte, *wpe;
    em_nn_dropout *drop;
    em_nn_block **h; /* n_layer blocks */
    em_nn_layer_norm *ln_f;
} em_gpt;

/* A new model initialised from `seed` (the same seed gives the same weights
 * and dropout masks). NULL + EM_ERR_ARG naming the field when a size is not
 * > 0, n_embd is not a multiple of n_head, or dropout is not in [0,1). The
 * model is in training mode; em_gpt_free frees it and all its tensors. */
em_gpt *em_gpt_new(const em_gpt_config *cfg, uint64_t seed);
void em_gpt_free(em_gpt *g); /* NULL is a no-op */

/* idx EM_I32 (B,T), 1 <= T <= block_size (EM_ERR_SHAPE otherwise; a token
 * outside [0,V) is EM_ERR_INDEX) -> logits (B,T,V), in the caller's scope. */
em_tensor *em_gpt_forward(em_gpt *g, em_tensor *idx);
/* Mean cross-entropy of em_gpt_forward(g, idx) against targets EM_I32 (B,T)
 * (the shape of idx, EM_ERR_SHAPE otherwise), already shifted: targets[b,t]
 * is the token that follows idx[b,t] (nanoGPT's y). EM_IGNORE_INDEX (-100,
 * PyTorch's default) marks a position to ignore; before ember took
 * PyTorch's convention it was -1, which is now an error (EM_ERR_INDEX)
 * saying so. A 0-dim tensor, NaN when every position is ignored. */
em_tensor *em_gpt_loss(em_gpt *g, em_tensor *idx, em_tensor *targets);
/* The loss of Hugging Face's GPT2LMHeadModel(input_ids=idx, labels=labels):
 * labels EM_I32 (B,T) unshifted, usually idx itself with -100 where a
 * position should not count (padding, a prompt); the shift happens here:
 * logits[:, :-1] against labels[:, 1:], so labels[:, 0] is never used. Mean
 * over the positions not ignored (EM_IGNORE_INDEX): a 0-dim tensor, NaN
 * when there are none (T = 1 among them). Errors as em_gpt_loss. */
em_tensor *em_gpt_loss_labels(em_gpt *g, em_tensor *idx, em_tensor *labels);

/* ---- sampling with a key/value cache ----------------------------------------
 * The cache holds, per layer, the keys and values of the positions already
 * run: persistent buffers (n_layer,batch,n_head,block_size,D) for K and V
 * on the model's device (made when the cache is: move the model first), and
 * the number of positions filled. It belongs to the model it was made
 * for and must be freed before it (em_gpt_cache_free). */
typedef struct em_gpt_cache em_gpt_cache;
em_gpt_cache *em_gpt_cache_new(em_gpt *g, int64_t batch); /* NULL + EM_ERR_ARG if batch < 1 */
void em_gpt_cache_reset(em_gpt_cache *c);                 /* forget every position */
int64_t em_gpt_cache_len(const em_gpt_cache *c);          /* positions filled */
void em_gpt_cache_free(em_gpt_cache *c);                  /* NULL is a no-op */

/* idx EM_I32 (batch,t), on the host or the model's device: t new tokens at
 * positions len..len+t-1 after the cached ones. Returns their logits
 * (batch,t,V), on the model's device, in the caller's scope
 * (persistent if none is open) and appends their keys and values to the
 * cache. Inference only: runs with grad mode off (restored after) and
 * without dropout whatever the modules' mode. EM_ERR_SHAPE when len+t would
 * exceed block_size or idx is not (batch,t); the cache is unchanged on any
 * error. Same values as em_gpt_forward on the whole sequence, position by
 * position (up to rounding). */
em_tensor *em_gpt_forward_cached(em_gpt *g, em_gpt_cache *c, em_tensor *idx);

/* Generates n_new tokens after prompt[0..n_prompt) (n_prompt >= 1, tokens in
 * [0,V)) and writes the n_prompt + n_new tokens to out. Each new token is
 * drawn from softmax(logits / temperature) (temperature > 0) restricted to
 * the top_k largest logits (top_k 0: all; ties at the k-th value are kept),
 * with one uniform draw from rng (NULL: the default generator) per token, so
 * a seed gives the same tokens. When the context is longer than block_size
 * only its last block_size tokens are seen (the cache is recomputed for the
 * cropped window). Uses no dropout and no autograd; opens its own scopes.
 * A model on a CUDA device samples there (each step's last logits come back
 * to the host for the draw).
 * Returns n_prompt + n_new, or -1 with the error set. */
int em_gpt_sample(em_gpt *g, const int32_t *prompt, int n_prompt, int n_new, double temperature, int top_k,
                  em_rng *rng, int32_t *out);
/* em_gpt_sample calling on_token(ctx, done, n_new) (when not NULL) after
 * each new token, done = 1..n_new, out[0..n_prompt+done) written: for a
 * progress display or streaming. The tokens are em_gpt_sample's. */
typedef void (*em_gpt_token_fn)(void *ctx, int done, int n_new);
int em_gpt_sample_progress(em_gpt *g, const int32_t *prompt, int n_prompt, int n_new, double temperature,
                           int top_k, em_rng *rng, int32_t *out, em_gpt_token_fn on_token, void *ctx);

/* ---- GPT-2 checkpoints in the Hugging Face layout (nn/gpt_hf.c) ---------- */
/* Loads a Hugging Face GPT-2 checkpoint into gpt_root. path: a
 * model.safetensors file, a sharded checkpoint's
 * model.safetensors.index.json (its weight_map names each tensor's shard
 * file, beside it), or a directory holding either (the index first). Names
 * with or without the "transformer." prefix; gpt_root's parameters use
 * ember's GPT names (wte.weight, wpe.weight, h.{i}.ln_1.weight, ...,
 * h.{i}.attn.c_attn.weight (3C,C), ..., ln_f.bias). HF stores the Conv1D
 * weights attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj as (in, out); they
 * are transposed on load. h.{i}.attn.bias / attn.masked_bias (mask buffers)
 * are ignored; lm_head.weight, if present, must equal wte.weight (tied).
 * Dtypes are converted. Fails with EM_ERR_ARG for a missing or unexpected
 * tensor, EM_ERR_SHAPE for a wrong shape (naming the tensor, its shape and
 * the expected one; a vocab size, block size or layer count mismatch is
 * named as such), EM_ERR_IO for an unreadable file, a missing shard or a
 * malformed index (not JSON, no weight_map, a name listed twice), and
 * EM_ERR_ARG naming the tensor and file when the shards disagree with the
 * index (a tensor in no shard, in two, or unlisted) or when one shard of
 * several is passed alone. Nothing is modified
 * unless every check passes (the file's tensors are staged first, so peak
 * memory is about twice the model). */
em_status em_gpt_load_hf(em_module *gpt_root, const char *path);
/* (GPT-2 was trained with the tanh GELU: build the model with
 * em_gpt_config.gelu_tanh = true to reproduce its outputs.) */

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
