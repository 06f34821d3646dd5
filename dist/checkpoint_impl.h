/* checkpoint_impl.h — the directory em_accel_save_state writes, as a whole:
 * written under a temporary name, described by a manifest written last,
 * published by one atomic rename, verified file by file before a load uses
 * it (dist/checkpoint.c's header comment has the layout and the steps).
 * What goes into the files is dist/accel_state.c's business. Internal: users
 * never include it. */
#ifndef EMBER_DIST_CHECKPOINT_IMPL_H
#define EMBER_DIST_CHECKPOINT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ember/nn.h"
#include "ember/tensor.h"
#include "nn/json_impl.h"
#include "tensor/fileio_impl.h"

#define CKPT_MANIFEST "manifest.json"
/* The format of em_accel_save_state's directories (their manifest's and
 * rank files'). */
#define CKPT_STATE_FORMAT "ember-accelerator-state-2"
#define CKPT_NAME_MAX 64

typedef struct ckpt_entry {
    char name[CKPT_NAME_MAX]; /* a plain file name inside the directory */
    file_sum sum;
} ckpt_entry;

typedef struct ckpt_manifest {
    uint64_t id;          /* the save id every file of the save carries */
    int64_t world, steps; /* the world size and optimizer steps at the save */
    int n;
    ckpt_entry *files; /* malloc'd; ckpt_manifest_free */
} ckpt_manifest;

void ckpt_manifest_free(ckpt_manifest *m);

/* A save id: 64 random bits (getrandom), never 0. */
uint64_t ckpt_new_id(void);
/* id as 16 lowercase hex digits (hex has room for 17 bytes). */
void ckpt_id_hex(uint64_t id, char *hex);
/* dir without trailing slashes, and (save: follow = true) a symbolic link
 * replaced by the path it points to, so the link keeps naming the newest
 * checkpoint. EM_ERR_ARG "fn: ..." for "" or "/", EM_ERR_IO if too long. */
em_status ckpt_dir_name(const char *dir, bool follow, char *out, size_t n, const char *fn);
/* The temporary sibling DIR.tmp-<id> a save writes into. */
void ckpt_tmp_dir(const char *dir, uint64_t id, char *out, size_t n);

/* ---- saving (one process: rank 0) ---- */
/* Checks that dir is absent or a directory holding only checkpoint files
 * (it will be replaced whole), removes stale DIR.tmp-* of interrupted saves
 * and creates tmp. EM_ERR_IO naming dir or tmp. */
em_status ckpt_begin(const char *dir, const char *tmp, const char *fn);
/* Writes tmp/manifest.json for m (format: the format name) and publishes
 * tmp as dir; the previous dir is removed once the new one is in place. */
em_status ckpt_finish(const char *dir, const char *tmp, const ckpt_manifest *m, const char *format,
                      const char *fn);
/* Removes tmp and its files (a failed save; best effort). */
void ckpt_abandon(const char *tmp);

/* ---- removing a checkpoint (rank 0; total_limit, dist/accel_ckpt.c) ---- */
/* EM_OK when dir is a directory holding only regular files a checkpoint or
 * a model save writes (no manifest needed: a half-removed one qualifies);
 * EM_ERR_IO naming dir and the first other entry (or "not a directory"). */
em_status ckpt_check_removable(const char *dir, const char *fn);
/* Removes dir after that check: manifest.json first (so a kill mid-way
 * never leaves something a load takes for complete), then the rest. */
em_status ckpt_remove(const char *dir, const char *fn);

/* ---- loading (every process) ---- */
/* Whether a DIR.old-* copy (an interrupted publish's) is beside dir: when
 * dir is missing, ckpt_open may load it. */
bool ckpt_has_old(const char *dir);
/* Finds the complete checkpoint at dir (or, when dir is missing, the newest
 * complete DIR.old-* an interrupted publish left), reads its manifest and
 * verifies every file it names (size, crc32, and a .json file's save_id)
 * before anything uses them. real gets the directory to read. EM_ERR_IO
 * naming the directory or file otherwise. */
em_status ckpt_open(const char *dir, const char *format, char *real, size_t n, ckpt_manifest *m,
                    const char *fn);

/* Whether m names the file `name` (so ckpt_open verified its bytes). */
bool ckpt_lists(const ckpt_manifest *m, const char *name);

/* ---- ZeRO's shard files (checkpoint_optim.c, checkpoint_model.c) ---- */
/* What a shard file says of the save it belongs to. */
typedef struct ckpt_shard_id {
    uint64_t save_id;
    int world, rank, stage;
} ckpt_shard_id;

/* The start of a shard's metadata JSON into b: {"format": format,
 * "save_id": 16 hex digits, "world", "rank", "zero_stage" (decimal
 * strings), without the closing brace (the caller adds its own keys). */
void ckpt_shard_meta(jbuf *b, const char *format, const ckpt_shard_id *id);
/* Checks a shard's metadata (f opened from path) against the save: its
 * format (what: "an optimizer shard", for the message), m's save id, and
 * that it is rank `rank` of a save by `world` ranks. EM_ERR_IO naming path. */
em_status ckpt_shard_check(const em_safetensors *f, const char *path, const char *format, const char *what,
                           const ckpt_manifest *m, int world, int rank, const char *fn);
/* The file of prepared object k of kind ("model", "optimizer"): rank < 0
 * the whole object's (KIND.safetensors, KIND_1.safetensors, ...), else
 * rank's shard (KIND.rank_R.safetensors, KIND_1.rank_R.safetensors). */
void ckpt_object_file(char *buf, size_t n, const char *kind, int k, int rank);
/* Which files hold an object's part of the save (file names them: rank
 * < 0 the whole file, else rank's shard, of the k-th object): the whole
 * file (*nfiles = 1, *sharded = false) or one shard per rank of the save,
 * each of which m must list. EM_ERR_IO naming dir, what ("model 0") and
 * the file missing from the manifest. */
em_status ckpt_find_files(const ckpt_manifest *m, const char *dir, void (*file)(char *, size_t, int, int),
                          int k, const char *what, int *nfiles, bool *sharded, const char *fn);
/* Room in the array *p (*cap elements of size bytes) for element n: grows
 * it (doubling) when n == *cap. EM_ERR_OOM naming fn. */
em_status ckpt_room(void **p, int *cap, int n, size_t size, const char *fn);
/* Metadata `key` of f as a count (decimal digits); EM_ERR_IO naming path. */
em_status ckpt_meta_count(const em_safetensors *f, const char *path, const char *key, int64_t *out,
                          const char *fn);

#endif
