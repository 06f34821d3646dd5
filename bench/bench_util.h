/* bench_util.h — the timing helpers every benchmark shares: a monotonic
 * clock and the median of repeated measurements. Header-only (static). */
#ifndef EMBER_BENCH_UTIL_H
#define EMBER_BENCH_UTIL_H

#include <stdlib.h>
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

#endif
