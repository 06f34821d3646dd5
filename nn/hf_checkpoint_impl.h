/* hf_checkpoint_impl.h — Hugging Face's checkpoint layout: one
 * model.safetensors, or shards model-0000k-of-0000K.safetensors with
 * model.safetensors.index.json mapping every tensor name to its shard:
 *   {"metadata": {"total_size": N, ...}, "weight_map": {"name": "file", ...}}
 * The index is written by em_accel_save_model (dist/accel_ckpt.c) and read,
 * with the shards, by em_gpt_load_hf (nn/gpt_hf.c). Internal: users never
 * include it. */
#ifndef EMBER_NN_HF_CHECKPOINT_IMPL_H
#define EMBER_NN_HF_CHECKPOINT_IMPL_H

#include <stdint.h>

#include "ember/nn.h"
#include "tensor/fileio_impl.h"

#define HF_INDEX_NAME "model.safetensors.index.json"
#define HF_SINGLE_NAME "model.safetensors"

/* Writes the index of n tensors, names[i] in the shard file files[i] (a
 * name relative to the index's directory), keys sorted as transformers
 * sorts them; total: the bytes of all tensor data. Atomic
 * (file_write_atomic); *sum (when not NULL) gets the index's size and crc32.
 * Errors name fn: EM_ERR_IO, EM_ERR_OOM. */
em_status hf_index_write(const char *path, int n, const char *const *names, const char *const *files,
                         uint64_t total, file_sum *sum, const char *fn);

/* A checkpoint opened for reading: its tensors by name, whichever shard
 * holds each. */
typedef struct hf_ckpt hf_ckpt;
/* Opens path: a safetensors file, a model.safetensors.index.json, or a
 * directory holding one of them (the index first). With an index every
 * shard it names is opened and must hold exactly the tensors the index
 * maps to it. Errors name fn and the file: EM_ERR_IO for a missing or
 * unreadable file or a malformed index (not JSON, no "weight_map" object,
 * a value that is not a file name, a name listed twice); EM_ERR_ARG for an
 * index whose shards disagree with it (naming the tensor and the shard),
 * for a directory with neither file, and for a single shard passed alone
 * (naming the index to pass instead). NULL with the error set. */
hf_ckpt *hf_ckpt_open(const char *path, const char *fn);
void hf_ckpt_close(hf_ckpt *c); /* NULL is a no-op */
/* Tensors in all shards, each once; their names (owned by c). */
int hf_ckpt_count(const hf_ckpt *c);
const char *hf_ckpt_name(const hf_ckpt *c, int i);
/* The index of tensor `name`, or -1. */
int hf_ckpt_find(const hf_ckpt *c, const char *name);
/* Tensor i read from its shard: a new persistent tensor (caller frees), or
 * NULL with the error set. */
em_tensor *hf_ckpt_get(const hf_ckpt *c, int i);
/* The number of shard files (1 for a single file). */
int hf_ckpt_shards(const hf_ckpt *c);

#endif
