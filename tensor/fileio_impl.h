/* fileio_impl.h — whole-file reads and crash-safe writes, for every layer
 * that saves something small (checkpoint counters, config files) or reads a
 * file whole. Internal: users never include it.
 *
 * file_write_atomic writes to a unique temporary beside the target, fsyncs
 * it, renames it over the target and fsyncs the directory, so a crash at any
 * moment leaves either the old file or the new one, never a part. Its
 * steps are fault points (fault_impl.h): "file.write" (half the bytes
 * written), "file.fsync" and "file.rename" (before each). */
#ifndef EMBER_TENSOR_FILEIO_IMPL_H
#define EMBER_TENSOR_FILEIO_IMPL_H

#include <stddef.h>
#include <stdio.h>

#include <stdint.h>

#include "ember/tensor.h"

/* A file's size and zlib crc32, as a checkpoint's manifest records them. */
typedef struct file_sum {
    uint64_t size;
    uint32_t crc;
} file_sum;

/* zlib's crc32 continued over p[0..n) (any n: zlib takes at most 4 GiB a
 * call). Start with crc = 0. */
uint32_t file_crc32(uint32_t crc, const void *p, size_t n);
/* The crc of A followed by B, from crc(A), crc(B) and B's length. */
uint32_t file_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* Size and crc32 of the regular file at path, read once. EM_ERR_IO "fn:
 * cannot open/read PATH: reason". */
em_status file_checksum(const char *path, file_sum *sum, const char *fn);

/* data[0..n) -> path. EM_ERR_IO "fn: cannot write PATH: reason" (the target
 * untouched, no temporary left) on failure. */
em_status file_write_atomic(const char *path, const void *data, size_t n, const char *fn);
/* fsync of the directory holding path, so a rename into it is durable (best
 * effort: some file systems refuse it). */
void file_sync_dir(const char *path);
/* Opens path for reading only if it is a regular file: a FIFO, device or
 * directory is refused by type before anything reads it (opening a FIFO
 * would wait for a writer forever). The descriptor (O_CLOEXEC, blocking),
 * or -1 with EM_ERR_IO "fn: cannot open PATH: reason" / "fn: PATH is a
 * directory / FIFO / device, not a regular file". */
int file_open_regular(const char *path, const char *fn);
/* The whole file into *out (malloc'd, NUL-terminated after *n bytes; the
 * caller frees). EM_ERR_IO "fn: cannot open PATH: reason" / "fn: PATH is
 * larger than MAX bytes" / read errors; EM_ERR_OOM. */
em_status file_read_all(const char *path, size_t max, char **out, size_t *n, const char *fn);
/* file_open_regular as a stdio stream ("rb"); NULL with the same errors. */
FILE *file_fopen_regular(const char *path, const char *fn);

#endif
