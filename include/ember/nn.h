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
/* The parameter or buffer at a dotted name relative to m; NULL (no error
 * set) if none. */
em_tensor *em_module_find(const em_module *m, const char *name);
/* Number of parameter elements in m's subtree. */
int64_t em_module_num_params(const em_module *m);

/* Training mode (dropout on) for m's subtree; modules start in training. */
void em_module_train(em_module *m, bool training);
bool em_module_is_training(const em_module *m);

/* Moves every parameter of root's subtree into one contiguous persistent
 * buffer per dtype (values kept) and points every gradient into a matching
 * zeroed buffer (em_set_grad_buffer). Handles stay valid. Idempotent.
 * EM_ERR_ARG if root is not a root. */
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
 * PATH.tmp, fsync'd and renamed, so a crash never leaves a half file at PATH. */
/* Writes n named tensors (any strides; written contiguous). metadata: NULL
 * or a flat JSON object of string values, e.g. {"format":"pt"}. */
em_status em_safetensors_save(const char *path, int n, const em_named *tensors, const char *metadata_json);

typedef struct em_safetensors em_safetensors;
/* Opens and validates a file (header JSON, dtypes, offsets inside the file,
 * no overlaps). NULL + EM_ERR_IO naming the path and what is wrong. */
em_safetensors *em_safetensors_open(const char *path);
void em_safetensors_close(em_safetensors *f);
int em_safetensors_count(const em_safetensors *f);
const char *em_safetensors_name(const em_safetensors *f, int i); /* owned by f */
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

/* Loads a Hugging Face GPT-2 checkpoint (model.safetensors, names with or
 * without the "transformer." prefix) into gpt_root, whose parameters use
 * ember's GPT names (wte.weight, wpe.weight, h.{i}.ln_1.weight, ...,
 * h.{i}.attn.c_attn.weight (3C,C), ..., ln_f.bias). HF stores the Conv1D
 * weights attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj as (in, out); they
 * are transposed on load. h.{i}.attn.bias / attn.masked_bias (mask buffers)
 * are ignored; lm_head.weight, if present, must equal wte.weight (tied).
 * Dtypes are converted. Fails with EM_ERR_ARG for a missing or unexpected
 * tensor, EM_ERR_SHAPE for a wrong shape (naming the tensor, its shape and
 * the expected one; a vocab size, block size or layer count mismatch is
 * named as such), EM_ERR_IO for an unreadable file. Nothing is modified
 * unless every check passes (the file's tensors are staged first, so peak
 * memory is about twice the model). */
em_status em_gpt_load_hf(em_module *gpt_root, const char *path);

#ifdef __cplusplus
}
#endif
#endif
