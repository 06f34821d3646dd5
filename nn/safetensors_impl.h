/* safetensors_impl.h — the safetensors writer as a checkpoint uses it: the
 * same files em_safetensors_save / em_module_save write, plus the size and
 * crc32 of what was written (for the checkpoint's manifest), computed while
 * writing instead of by reading the file back. Internal: users never
 * include it. */
#ifndef EMBER_NN_SAFETENSORS_IMPL_H
#define EMBER_NN_SAFETENSORS_IMPL_H

#include "ember/nn.h"
#include "tensor/fileio_impl.h"

/* The metadata key of the file's own checksum (safetensors.c's header comment). */
#define ST_CRC_KEY "ember.crc32"

/* em_safetensors_save; *sum (when not NULL) gets the file's size and crc32. */
em_status st_save(const char *path, int n, const em_named *tensors, const char *metadata_json, file_sum *sum);
/* em_module_save; *sum (when not NULL) as st_save. */
em_status module_save(const em_module *m, const char *path, file_sum *sum);

/* em_safetensors_open; verify = false skips the check of the file's own
 * "ember.crc32" (one pass over every byte), for a caller that has just
 * verified the same bytes another way (a checkpoint's manifest). */
em_safetensors *st_open(const char *path, bool verify);
/* The dtype em_safetensors_get would give entry `name` of f (its header
 * only), or -1 with the error set (EM_ERR_ARG for a name f lacks, as
 * em_safetensors_get's; EM_ERR_DTYPE for one ember does not read). */
int st_dtype(const em_safetensors *f, const char *name);
/* em_module_load, with st_open's verify. */
em_status module_load(em_module *m, const char *path, bool strict, bool verify);

#endif
