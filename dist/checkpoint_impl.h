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

#include "ember/tensor.h"
#include "tensor/fileio_impl.h"

#define CKPT_MANIFEST "manifest.json"
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

#endif
