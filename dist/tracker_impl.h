/* tracker_impl.h — the checksum of TensorBoard's record framing, for
 * dist/trackers.c and the tests that read its files back. */
#ifndef EMBER_DIST_TRACKER_IMPL_H
#define EMBER_DIST_TRACKER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ember/tracker.h"

/* CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and
 * final xor 0xFFFFFFFF) of p[0..n), continued from crc (start with 0):
 * tracker_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t tracker_crc32c(uint32_t crc, const void *p, size_t n);
/* A TFRecord's masked CRC: rotate right by 15, add 0xa282ead8 (mod 2^32). */
uint32_t tracker_crc_mask(uint32_t crc);

/* The checks em_tracker_open / em_tracker_log make, for the Accelerator to
 * make the same ones on every rank (only the main process writes): a run
 * name of one path component, known EM_TRACK_* flags, and step >= 0, n >= 0,
 * metrics given, tags non-empty, not "step", none twice. EM_ERR_ARG
 * messages start with fn. */
em_status tracker_check_run_name(const char *name, const char *fn);
em_status tracker_check_flags(int log_with, const char *fn);
em_status tracker_check_metrics(int64_t step, int n, const em_metric *m, const char *fn);

#endif
