/* test_threadpool.c — parallel_for (tensor/threadpool.c): fixed ranges,
 * each run exactly once whichever thread claims it, across many jobs in a
 * row (a worker that wakes late must not run a part of a finished job or
 * lose a part of the next). */
#include <stdatomic.h>

#include "../tensor/kernel_impl.h"
#include "harness.h"

typedef struct ranges_seen {
    atomic_int calls;
    int64_t lo[8], hi[8];
    atomic_llong covered; /* sum over ranges of their length */
} ranges_seen;

static void record_range(void *ctx, int64_t lo, int64_t hi)
{
    ranges_seen *r = ctx;
    int i = atomic_fetch_add(&r->calls, 1);
    if (i < 8) {
        r->lo[i] = lo;
        r->hi[i] = hi;
    }
    atomic_fetch_add(&r->covered, hi - lo);
}

TEST(test_parallel_for_splits_into_ranges_fixed_by_n_and_the_thread_count)
{
    int prev = em_num_threads();
    CHECK_OK(em_set_num_threads(2));
    ranges_seen r = {0};
    parallel_for(1000, 1, record_range, &r);
    CHECK(atomic_load(&r.calls) == 2);
    CHECK(atomic_load(&r.covered) == 1000);
    /* whichever thread ran which: the two ranges are [0,500) and [500,1000) */
    int64_t a = r.lo[0] < r.lo[1] ? 0 : 1;
    CHECK(r.lo[a] == 0 && r.hi[a] == 500 && r.lo[1 - a] == 500 && r.hi[1 - a] == 1000);
    CHECK_OK(em_set_num_threads(prev));
}

typedef struct job_sum {
    const int *v;
    atomic_llong sum;
} job_sum;

static void sum_range(void *ctx, int64_t lo, int64_t hi)
{
    job_sum *j = ctx;
    long long s = 0;
    for (int64_t i = lo; i < hi; i++) s += j->v[i];
    atomic_fetch_add(&j->sum, s);
}

TEST(test_parallel_for_runs_every_part_of_every_job_once_over_many_short_jobs)
{
    /* thousands of jobs of a few microseconds, each on its own context: a
     * part run twice, lost, or run on the previous job's context shows up
     * as a wrong sum. 8 threads on however many cores: claims contend. */
    int prev = em_num_threads();
    CHECK_OK(em_set_num_threads(8));
    enum { N = 64 };
    int v[N];
    for (int i = 0; i < N; i++) v[i] = i + 1;
    int bad = 0;
    for (int k = 0; k < 5000; k++) {
        job_sum j = {.v = v};
        int64_t n = 2 + k % (N - 1); /* 2..64 items, in up to 8 parts */
        parallel_for(n, 1, sum_range, &j);
        if (atomic_load(&j.sum) != n * (n + 1) / 2) bad++;
    }
    CHECK(bad == 0);
    CHECK_OK(em_set_num_threads(prev));
}
