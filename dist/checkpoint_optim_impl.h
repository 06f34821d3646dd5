/* checkpoint_optim_impl.h — an optimizer's part of em_accel_save_state's
 * directory: one file of the whole state (DDP, one process), or under ZeRO
 * one shard file per rank; and, on load, the state this run's optimizer
 * needs assembled from whichever of them the save has (re-sharding).
 * dist/checkpoint_optim.c's header comment has the format and the rules.
 * Internal: users never include it. */
#ifndef EMBER_DIST_CHECKPOINT_OPTIM_IMPL_H
#define EMBER_DIST_CHECKPOINT_OPTIM_IMPL_H

#include "dist/checkpoint_impl.h"
#include "ember/optim.h"

/* The file name of optimizer k's state: rank < 0 the whole state's
 * ("optimizer.safetensors", "optimizer_1.safetensors", ...), else rank's
 * shard ("optimizer.rank_0.safetensors", "optimizer_1.rank_0.safetensors"). */
void ckpt_optim_file(char *buf, size_t n, int k, int rank);

/* Whether o is sharded (ZeRO gave it pieces: dist/zero.c): its state is
 * then saved one shard per rank. */
bool ckpt_optim_is_sharded(const em_optimizer *o);

/* Writes o's state to path: the whole state when id is NULL, else this
 * rank's shard (the state of its non-empty pieces, where each piece lies,
 * and *id). *sum gets the file's size and crc32. Errors name fn. */
em_status ckpt_optim_save(const em_optimizer *o, const char *path, const ckpt_shard_id *id, file_sum *sum,
                          const char *fn);

/* The state for o assembled from optimizer k's files in the verified
 * checkpoint dir (m its manifest): for each parameter the save has state
 * of, its fields over this run's piece of it (or over all of it when o is
 * not sharded), copied from the files whose pieces overlap it, one file
 * open at a time. Checks everything first: the files' save, world and
 * ranks, that the pieces tile each parameter exactly, each piece's fields
 * and shapes, and the result against o (optim_check_state). *out gets *n
 * entries named as em_optim_state names them (names owned by o, tensors
 * persistent: ckpt_optim_state_free). Changes nothing. EM_ERR_IO naming
 * the file for a file that does not fit the save, EM_ERR_ARG for state
 * that does not fit o (em_optim_load_state's checks, which name it). Other
 * errors name fn. */
em_status ckpt_optim_read(const em_optimizer *o, const char *dir, const ckpt_manifest *m, int k,
                          em_named **out, int *n, const char *fn);
/* Loads what ckpt_optim_read assembled into o (it was checked there): the
 * tensors become o's state where they can, without a copy, so the state
 * is never in memory twice (their entries' t become NULL). */
em_status ckpt_optim_load(em_optimizer *o, int n, em_named *st);
void ckpt_optim_state_free(em_named *st, int n);

#endif
