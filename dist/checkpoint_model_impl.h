/* checkpoint_model_impl.h — a model's part of em_accel_save_state's
 * directory under ZeRO stage 3: one shard file per rank, each rank's share
 * of every parameter; and the model read back, from those shards or from
 * the whole model file, by a load (whole, or this rank's shares) and by
 * `ember merge-weights` (whole). dist/checkpoint_model.c's header comment
 * has the format and the rules. Internal: users never include it. */
#ifndef EMBER_DIST_CHECKPOINT_MODEL_IMPL_H
#define EMBER_DIST_CHECKPOINT_MODEL_IMPL_H

#include "dist/checkpoint_impl.h"
#include "ember/nn.h"

/* Elements [lo, lo + n) of a tensor, in its element order. */
typedef struct ckpt_range {
    int64_t lo, n;
} ckpt_range;

/* The file name of model k: rank < 0 the whole model's ("model.safetensors",
 * "model_1.safetensors", ...), else rank's shard ("model.rank_0.safetensors"). */
void ckpt_model_file(char *buf, size_t n, int k, int rank);

/* Writes this rank's shard of m to path: of the tensors of m (parameters
 * then buffers, em_module_save's order) those with share[i].n > 0, each
 * tensor's elements share[i] (a part of a parameter must be contiguous),
 * and the save *id. *sum gets the file's size and crc32. Errors name fn. */
em_status ckpt_model_save(const em_module *m, const ckpt_range *share, const char *path,
                          const ckpt_shard_id *id, file_sum *sum, const char *fn);

/* One tensor of the saved model. */
typedef struct ckpt_mtensor {
    char *name; /* malloc'd */
    em_dtype dtype;
    int ndim;
    int64_t shape[EM_MAX_DIMS], numel;
} ckpt_mtensor;

/* Where one file holds elements [lo, lo + n) of tensor t. */
typedef struct ckpt_mpiece {
    int file, t;
    int64_t lo, n;
} ckpt_mpiece;

/* What a save holds of model k, from its files' headers. */
typedef struct ckpt_model {
    const char *dir, *fn;
    int k, nfiles;
    bool sharded;
    int nt;          /* the model's tensors, in em_module_save's order */
    ckpt_mtensor *t; /* nt */
    ckpt_mpiece *pc; /* every file's pieces, sorted by tensor, then lo */
    int npc, cap;
} ckpt_model;

/* Reads the headers of model k's files in the verified checkpoint dir (m
 * its manifest; dir must outlive cm): the whole model file, or every rank's
 * shard. Checks each shard's save, world and rank, each piece against its
 * entry, that the files agree on each tensor's name, shape and dtype, and
 * that the pieces tile every tensor exactly. EM_ERR_IO naming the file, or
 * dir and the tensor not covered. cm is freed on failure too. */
em_status ckpt_model_scan(ckpt_model *cm, const char *dir, const ckpt_manifest *m, int k, const char *fn);
/* For each tensor i of cm with want[i].n > 0, copies its elements
 * want[i] into dst[i] (want[i].n contiguous elements of t[i].dtype), from
 * the files that hold them, one file open and one entry read at a time. */
em_status ckpt_model_fill(const ckpt_model *cm, const ckpt_range *want, void *const *dst);
/* The tensor of cm named name, or -1. */
int ckpt_model_find(const ckpt_model *cm, const char *name);
void ckpt_model_free(ckpt_model *cm);

/* `ember merge-weights`: model k of em_accel_save_state's checkpoint dir
 * (its manifest and every file verified first), from its shards or its
 * whole file, as one standard safetensors file at out: em_module_save's
 * names, order, shapes and metadata ({"format": "pt"}), so the same bytes
 * em_module_save writes for that model. Written to out.tmp and renamed
 * (st_save): a failure leaves no out. Holds the output plus one entry of
 * one file. *ntensors, *bytes (when not NULL) get what was written.
 * EM_ERR_IO naming dir, the file or out. */
em_status ckpt_merge_model(const char *dir, int k, const char *out, int *ntensors, int64_t *bytes,
                           const char *fn);

#endif
