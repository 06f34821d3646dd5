/* bench_peak.h — the CPU's multiply-add peak, measured: the ceiling no
 * matrix product and no training step can pass on this machine, printed
 * beside the BLAS figures so a "bound" from one library is not mistaken for
 * the hardware's. Header-only (static); needs -pthread.
 *
 * Each thread runs 12 independent vector multiply-adds per iteration: more
 * chains than an FMA unit's latency x its count on current x86 cores (4
 * cycles x 2 units), so the units never wait. The vectors are GCC/clang
 * vector types of the widest width this build targets (64 bytes with
 * AVX-512, else 32), and v * m + a is contracted to one FMA (-std=gnu11
 * contracts; without FMA the compiler emits a multiply and an add, and the
 * figure is that CPU's multiply-add peak instead). */
#ifndef EMBER_BENCH_PEAK_H
#define EMBER_BENCH_PEAK_H

#include <pthread.h>
#include <stdint.h>

#include "bench_util.h"

#if defined(__AVX512F__)
#define PEAK_VBYTES 64
#else
#define PEAK_VBYTES 32
#endif
typedef float peak_vec __attribute__((vector_size(PEAK_VBYTES)));
enum { PEAK_LANES = PEAK_VBYTES / 4, PEAK_CHAINS = 12 };

typedef struct peak_job {
    int64_t iters;
    double seconds;
    float sink; /* keeps the results alive */
} peak_job;

static void *peak_thread(void *arg)
{
    peak_job *j = arg;
    peak_vec v[PEAK_CHAINS], m, a;
    for (int l = 0; l < PEAK_LANES; l++) {
        m[l] = 0.999999f;
        a[l] = 1e-6f;
    }
    for (int c = 0; c < PEAK_CHAINS; c++)
        for (int l = 0; l < PEAK_LANES; l++) v[c][l] = (float)(c + l);
    double t0 = now();
    for (int64_t it = 0; it < j->iters; it++) {
#pragma GCC unroll 12
        for (int c = 0; c < PEAK_CHAINS; c++) v[c] = v[c] * m + a;
    }
    j->seconds = now() - t0;
    float s = 0;
    for (int c = 0; c < PEAK_CHAINS; c++) s += v[c][0];
    j->sink = s;
    return NULL;
}

/* GFLOP/s of `threads` threads (1..64) multiply-adding at once (each FMA
 * lane counts 2 flops): the sum over threads of each one's rate, best of 3
 * runs of about 0.1 s. 0 when a thread cannot be started. */
static double fma_peak_gflops(int threads)
{
    if (threads < 1 || threads > 64) return 0;
    double best = 0;
    for (int run = 0; run < 3; run++) {
        peak_job jobs[64];
        pthread_t th[64];
        int started = 0;
        for (int t = 0; t < threads; t++) {
            jobs[t] = (peak_job){.iters = 2000000};
            if (pthread_create(&th[t], NULL, peak_thread, &jobs[t])) break;
            started++;
        }
        for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
        if (started < threads) return 0;
        double g = 0;
        for (int t = 0; t < threads; t++)
            g += (double)jobs[t].iters * PEAK_CHAINS * PEAK_LANES * 2 / jobs[t].seconds * 1e-9;
        best = g > best ? g : best;
    }
    return best;
}

#endif
