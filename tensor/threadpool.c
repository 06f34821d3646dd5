/* threadpool.c — one pool of worker threads for every CPU kernel,
 * GEMMs included (tensor/gemm.c splits them over it).
 *
 * parallel_for splits [0,n) into one contiguous range per thread, and every
 * thread, the caller included, claims ranges from a shared counter until
 * none is left: the ranges are fixed by n and the thread count alone (so a
 * kernel's result does not depend on which thread ran what), and a worker
 * that is slow to wake (a loaded machine: another process on its core) is
 * not waited for, the caller runs its range instead. Measured on the 2-core
 * VM with two other busy processes: a tiny GPT step took 837 ms when each
 * range belonged to one thread, 161-169 ms with claiming (as fast as one
 * thread alone under that load).
 *
 * After a job a worker spins for a short while (~0.2 ms,
 * with the CPU's pause hint, never sched_yield) watching for the next one,
 * then sleeps on a condition variable. Training runs kernel after kernel, so
 * workers mostly find the next job while still spinning, on their own core;
 * a worker woken from sleep for every job tends to be placed on the waking
 * thread's core by the scheduler, and the two halves of a job then share one
 * core (measured: GEMMs at one-thread speed in whole stretches of a run). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernel_impl.h"
#include "tensor_impl.h"

enum { MAX_THREADS = 64, SPIN = 1 << 14 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static pthread_t workers[MAX_THREADS];
static int n_threads; /* including the caller; 0 = not decided yet */
static int n_started;
static atomic_uint_fast64_t job_id;
static atomic_int pending; /* parts not finished yet */
/* The claim word: the job's part count in the high 32 bits, the next part
 * to claim in the low 32. One word, so a claim reads the count of the job
 * whose part it takes: a worker late from the last job that claims after
 * the next is published takes a valid part of the new one. */
static atomic_uint_fast64_t claim;
static atomic_int sleeping; /* workers waiting on work_cv */
static range_fn job_fn;
static void *job_ctx;
static int64_t job_n;
static _Thread_local bool in_parallel;
static pthread_mutex_t submit_lock = PTHREAD_MUTEX_INITIALIZER;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Runs parts of the current job while any is unclaimed; returns whether
 * this thread finished the job's last part. job_fn, job_ctx and job_n are
 * set before the claim word is, and stay until every claimed part is done
 * (the next job waits for pending to reach 0), so a part claimed is run with
 * its own job's. */
static bool run_parts(void)
{
    bool last = false;
    for (;;) {
        uint64_t w = atomic_fetch_add(&claim, 1);
        int64_t parts = (int64_t)(w >> 32), part = (int64_t)(w & 0xffffffffu);
        if (part >= parts) return last;
        int64_t lo = job_n * part / parts, hi = job_n * (part + 1) / parts;
        if (lo < hi) job_fn(job_ctx, lo, hi);
        last = atomic_fetch_sub(&pending, 1) == 1;
    }
}

/* Waits until job_id moves past `seen`: spins first, then sleeps. */
static uint64_t wait_for_job(uint64_t seen)
{
    for (int i = 0; i < SPIN; i++) {
        uint64_t id = atomic_load(&job_id);
        if (id != seen) return id;
        cpu_relax();
    }
    pthread_mutex_lock(&lock);
    atomic_fetch_add(&sleeping, 1);
    while (atomic_load(&job_id) == seen) pthread_cond_wait(&work_cv, &lock);
    atomic_fetch_sub(&sleeping, 1);
    pthread_mutex_unlock(&lock);
    return atomic_load(&job_id);
}

static void *worker_main(void *arg)
{
    (void)arg;
    uint64_t seen = 0;
    in_parallel = true;
    for (;;) {
        seen = wait_for_job(seen);
        if (run_parts()) {
            pthread_mutex_lock(&lock);
            pthread_cond_signal(&done_cv);
            pthread_mutex_unlock(&lock);
        }
    }
    return NULL;
}

static int default_threads(void)
{
    const char *e = getenv("EMBER_NUM_THREADS");
    if (e && atoi(e) > 0) return atoi(e) > MAX_THREADS ? MAX_THREADS : atoi(e);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

int em_num_threads(void)
{
    if (!n_threads) n_threads = default_threads();
    return n_threads;
}

em_status em_set_num_threads(int n)
{
    if (n < 1 || n > MAX_THREADS)
        return em_err(EM_ERR_ARG, "em_set_num_threads: %d is not in [1, %d]", n, MAX_THREADS);
    pthread_mutex_lock(&submit_lock);
    n_threads = n; /* extra started workers simply get no part */
    pthread_mutex_unlock(&submit_lock);
    return EM_OK;
}

static void ensure_workers(int want)
{
    while (n_started < want - 1) {
        if (pthread_create(&workers[n_started], NULL, worker_main, NULL) != 0)
            break;
        pthread_detach(workers[n_started]);
        n_started++;
    }
}

void parallel_for(int64_t n, int64_t grain, range_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nt = em_num_threads();
    int64_t parts = n / grain;
    if (parts > nt) parts = nt;
    if (parts <= 1 || in_parallel) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&submit_lock);
    ensure_workers(nt);
    if (parts > n_started + 1) parts = n_started + 1;
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    atomic_store(&pending, (int)parts);
    atomic_store(&claim, (uint64_t)parts << 32); /* opens the parts (seq_cst: after the fields above) */
    atomic_fetch_add(&job_id, 1);                /* wakes the workers */
    if (atomic_load(&sleeping) > 0) {
        pthread_mutex_lock(&lock);
        pthread_cond_broadcast(&work_cv);
        pthread_mutex_unlock(&lock);
    }
    in_parallel = true;
    run_parts();
    in_parallel = false;
    for (int i = 0; i < SPIN && atomic_load(&pending) > 0; i++) cpu_relax();
    if (atomic_load(&pending) > 0) {
        pthread_mutex_lock(&lock);
        while (atomic_load(&pending) > 0) pthread_cond_wait(&done_cv, &lock);
        pthread_mutex_unlock(&lock);
    }
    pthread_mutex_unlock(&submit_lock);
}
