/* mem_check.h — what `ember train` and `ember estimate-memory` share about
 * memory: how much this process may still use, its own peak, and sizes
 * printed for people. */
#ifndef EMBER_TOOLS_MEM_CHECK_H
#define EMBER_TOOLS_MEM_CHECK_H

#include <stddef.h>
#include <stdint.h>

/* Bytes this process may use: MemAvailable of /proc/meminfo, or the lowest
 * cgroup limit above it when lower (cgroup v2 memory.max, or v1
 * memory.limit_in_bytes, on the process's cgroup and each parent). *what
 * says which ("MemAvailable" or the limit file's path, in buf of n bytes).
 * 0 when nothing can be read (no check is possible). */
double mem_available(char *what, size_t n);

/* This process's peak resident set (VmHWM of /proc/self/status), bytes; 0
 * when it cannot be read. */
double mem_peak_rss(void);
/* Its current resident set (VmRSS), bytes; 0 when it cannot be read. */
double mem_rss(void);

/* "123.4 MiB" / "1.23 GiB" into buf (n bytes); returns buf. */
const char *mem_human(double bytes, char *buf, size_t n);

#endif
