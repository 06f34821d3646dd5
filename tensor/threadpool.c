/* threadpool.c — one pool of worker threads for every CPU kernel.
 *
 * parallel_for splits [0,n) into one contiguous range per thread (the caller
 * takes the first). Workers sleep on a condition variable between jobs, so
 * they do not spin against OpenBLAS's own threads, which run only inside
 * GEMM calls (see docs/ARCHITECTURE.md, "Threads"). */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "tensor_impl.h"

enum { MAX_THREADS = 64 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static pthread_t workers[MAX_THREADS];
static int n_threads; /* including the caller; 0 = not started */
static int n_started;
static uint64_t job_id;
static int pending;
static range_fn job_fn;
static void *job_ctx;
static int64_t job_n, job_parts;
static _Thread_local bool in_parallel;
static pthread_mutex_t submit_lock = PTHREAD_MUTEX_INITIALIZER;

static void run_part(int64_t part)
{
    int64_t lo = job_n * part / job_parts, hi = job_n * (part + 1) / job_parts;
    if (lo < hi) job_fn(job_ctx, lo, hi);
}

static void *worker_main(void *arg)
{
    int64_t me = (int64_t)(intptr_t)arg; /* part index 1.. */
    uint64_t seen = 0;
    in_parallel = true;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (job_id == seen) pthread_cond_wait(&work_cv, &lock);
        seen = job_id;
        int64_t parts = job_parts;
        pthread_mutex_unlock(&lock);
        if (me < parts) run_part(me);
        pthread_mutex_lock(&lock);
        if (me < parts && --pending == 0) pthread_cond_signal(&done_cv);
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
        if (pthread_create(&workers[n_started], NULL, worker_main, (void *)(intptr_t)(n_started + 1)) != 0)
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
    pthread_mutex_lock(&lock);
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    job_parts = parts;
    pending = (int)parts - 1;
    job_id++;
    pthread_cond_broadcast(&work_cv);
    pthread_mutex_unlock(&lock);
    in_parallel = true;
    run_part(0);
    in_parallel = false;
    pthread_mutex_lock(&lock);
    while (pending > 0) pthread_cond_wait(&done_cv, &lock);
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&submit_lock);
}
