/* bench_util.h — the helpers every benchmark shares: a monotonic clock,
 * the median of repeated measurements, and the CPU's model name for the
 * header a benchmark prints. Header-only (static). */
#ifndef EMBER_BENCH_UTIL_H
#define EMBER_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Seconds on the monotonic clock. */
static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v in place). */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Waits out OpenBLAS's start: its pthreads build starts its worker
 * threads when the library is loaded, and they spin in sched_yield for
 * about 0.1 s before they sleep (measured on the 2-core VM: 0.10 s of CPU
 * in a 2 s process that made one sgemm call), even when every call is
 * single-threaded (ember sets one BLAS thread). A benchmark whose timed
 * calls start at once shares its cores with them: one product of 64x128x768
 * on one thread took 0.31 ms in the first 0.1 s and 0.17 ms after. */
static inline void settle_blas_threads(void) { usleep(250000); }

/* The CPU's model name (/proc/cpuinfo's first "model name") into s (n
 * bytes, truncated), or "unknown CPU" where there is none. */
static inline void bench_cpu_model(char *s, size_t n)
{
    snprintf(s, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *v = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && v) {
            v += 1 + strspn(v + 1, " \t");
            v[strcspn(v, "\n")] = '\0';
            snprintf(s, n, "%s", v);
            break;
        }
    }
    if (f) fclose(f);
}

#endif
