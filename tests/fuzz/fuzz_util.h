/* fuzz_util.h — what the libFuzzer targets share: the input as a file the
 * readers can open (a memfd, reached as /proc/self/fd/N: a regular file, no
 * disk), and a check that fails the run loudly. */
#ifndef EMBER_FUZZ_UTIL_H
#define EMBER_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* An invariant of the reader under test: a violation is a finding. */
#define FUZZ_CHECK(cond, ...)                                                                                \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "fuzz check failed: %s: ", #cond);                                               \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fprintf(stderr, "\n");                                                                           \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

/* Makes the file at the returned path hold the n0 bytes at p0 then the n1
 * bytes at p1 (p1 NULL: zeros). The path stays the same for the process. */
static inline const char *fuzz_file(const void *p0, size_t n0, const void *p1, size_t n1)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("ember-fuzz", 0);
        FUZZ_CHECK(fd >= 0, "memfd_create failed");
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    FUZZ_CHECK(ftruncate(fd, 0) == 0 && ftruncate(fd, (off_t)(n0 + n1)) == 0, "ftruncate failed");
    FUZZ_CHECK(!n0 || pwrite(fd, p0, n0, 0) == (ssize_t)n0, "pwrite failed");
    FUZZ_CHECK(!n1 || !p1 || pwrite(fd, p1, n1, (off_t)n0) == (ssize_t)n1, "pwrite failed");
    return path;
}

#endif
