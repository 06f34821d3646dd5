/* bench_allreduce.c — all_reduce latency and bandwidth between local ranks
 * for 64 KiB, 1, 16 and 100 MiB of f32, over the shared-memory and the TCP
 * data paths, side by side in the same run with OpenMPI's MPI_Allreduce
 * (bench/bench_allreduce_mpi.c under mpirun, when meson found MPI, which
 * in the same job also times ember's all_reduce over the MPI transport and
 * the every-call check's cost: em_barrier beside MPI_Barrier) and
 * torch.distributed's gloo backend (bench/allreduce_gloo.py, when the
 * Python in EMBER_BENCH_PYTHON, default /usr/bin/python3, has torch); then
 * the memory bandwidth bound at the largest size, measured here.
 *
 * A measurement: every rank waits at a barrier, times one all_reduce(sum),
 * and the slowest rank's time counts; the figure is the median over reps
 * after warm-up. Bandwidth is the message size over that time (for 2 ranks
 * this is also what nccl-tests calls bus bandwidth).
 *
 * The bound. Whatever the algorithm, every rank reads its whole input and
 * writes its whole result once: with w ranks of N bytes, 2wN bytes move
 * through memory, from w cores at once. The bench measures that beside each
 * all_reduce on shared memory: after each timed call, every rank passes
 * over the same tensor in place (x[i] += s: read N, write N), timed the
 * same way (barrier, slowest rank, median); the bound is that pass's time.
 * STREAM-like copy, add and in-place rates (1 and w threads, measured after
 * the rest) are printed beside it for scale, and the exchange between two
 * cores (CPU 1 copying a piece CPU 0 just wrote), measured before the shm
 * runs and after: it tells apart a VM whose two vCPUs share a cache from
 * one whose do not, where shm's all-reduce is slower and the bound faster.
 *
 * mpirun binds each rank to a core (said explicitly: --bind-to core); ember's
 * shm is measured unbound (as `ember launch` runs it) and again with rank r
 * bound to CPU r, so the comparison with MPI is like for like.
 *
 * usage: bench_allreduce [ranks] [reps]   (default 2 ranks; 1000/200/30/9 reps by size) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench_dist.h"
#include "bench_util.h"

#define NSIZES 4
static const size_t sizes[NSIZES] = {(size_t)64 << 10, (size_t)1 << 20, (size_t)16 << 20, (size_t)100 << 20};
static const int default_reps[NSIZES] = {1000, 200, 30, 9};

typedef struct job {
    int reps[NSIZES];
    double *ms;    /* shared with the parent: ms[size], written by rank 0 */
    double *bound; /* likewise: the bound's pass at each size (shm only), or NULL */
} job;

/* The bound's pass: every rank reads its tensor and writes it back (x + s,
 * s = 0 known only at run time), the traffic no all-reduce can avoid. */
__attribute__((noinline)) static void touch(float *x, int64_t n, float s)
{
    for (int64_t i = 0; i < n; i++) x[i] += s;
}

static int measure(em_pg *pg, void *ctx)
{
    job *j = ctx;
    int world = em_pg_world(pg);
    for (int s = 0; s < NSIZES; s++) {
        int64_t n = (int64_t)(sizes[s] / 4);
        int warm = 2, reps = j->reps[s];
        /* one checked call on rank-dependent values, then timed calls on
         * zeros (a sum that cannot overflow however many reps; the same work) */
        em_tensor *t = em_full(EM_F32, 1, &n, em_pg_rank(pg) + 1.0);
        double *dt = calloc((size_t)reps, sizeof *dt);
        if (em_all_reduce(pg, t, EM_RED_SUM, NULL)) goto fail;
        double want = world * (world + 1) / 2.0, got = ((float *)em_data(t))[n - 1];
        if (got != want) {
            fprintf(stderr, "bench_allreduce: wrong result %g, want %g\n", got, want);
            return 1;
        }
        memset(em_data(t), 0, (size_t)n * 4);
        /* rep i: the all_reduce, then (for the bound) the pass over the
         * same tensor, alternating, so both see the same load */
        double *bt = calloc((size_t)reps, sizeof *bt);
        for (int i = 0; i < warm + reps; i++) {
            if (em_barrier(pg, NULL)) goto fail;
            double t0 = now();
            if (em_all_reduce(pg, t, EM_RED_SUM, NULL)) goto fail;
            if (i >= warm) dt[i - warm] = now() - t0;
            if (!j->bound) continue;
            if (em_barrier(pg, NULL)) goto fail;
            t0 = now();
            touch(em_data(t), n, (float)(world - em_pg_world(pg)));
            if (i >= warm) bt[i - warm] = now() - t0;
        }
        int64_t nr = reps;
        for (int k = 0; k < (j->bound ? 2 : 1); k++) {
            double *v = k ? bt : dt;
            em_tensor *times = em_from_data(EM_F64, 1, &nr, v);
            if (!times || em_all_reduce(pg, times, EM_RED_MAX, NULL)) goto fail; /* the slowest rank's */
            memcpy(v, em_data(times), sizeof *v * (size_t)reps);
            if (em_pg_rank(pg) == 0) (k ? j->bound : j->ms)[s] = 1e3 * median(v, reps);
            em_free(times);
        }
        free(bt);
        em_free(t);
        free(dt);
    }
    return 0;
fail:
    fprintf(stderr, "bench_allreduce: rank %d: %s\n", em_pg_rank(pg), em_last_error());
    return 1;
}

/* Runs cmd, which prints "<bytes> <ms> [<ms2>]" lines, into ms[] (and
 * ms2[] when given: bench_allreduce_mpi's ember over MPI, and its line
 * "barrier <ms> <ms2>" into barrier[2]); 0 when every size came. */
static int reference2(const char *cmd, double *ms, double *ms2, double *barrier)
{
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    int got = 0;
    char line[256];
    while (fgets(line, sizeof line, p)) {
        size_t bytes;
        double m, m2 = 0;
        if (barrier && sscanf(line, "barrier %lf %lf", &barrier[0], &barrier[1]) == 2) continue;
        int k = sscanf(line, "%zu %lf %lf", &bytes, &m, &m2);
        if (k < 2 || (ms2 && k < 3)) continue;
        for (int s = 0; s < NSIZES; s++)
            if (sizes[s] == bytes) {
                ms[s] = m, got++;
                if (ms2) ms2[s] = m2;
            }
    }
    return pclose(p) != 0 || got != NSIZES;
}

static int reference(const char *cmd, double *ms) { return reference2(cmd, ms, NULL, NULL); }

static int gloo(int world, const job *j, double *ms)
{
    const char *py = getenv("EMBER_BENCH_PYTHON");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s %s/allreduce_gloo.py --world %d --sizes %zu,%zu,%zu,%zu --reps %d,%d,%d,%d 2>/dev/null",
             py && *py ? py : "/usr/bin/python3", EMBER_BENCH_DIR, world, sizes[0], sizes[1], sizes[2],
             sizes[3], j->reps[0], j->reps[1], j->reps[2], j->reps[3]);
    return reference(cmd, ms);
}

/* OpenMPI's medians, when meson found MPI and mpirun is there, and in the
 * same job ember's over its MPI transport (ems) and both barriers (bar[0]
 * MPI's, bar[1] ember's check). `how` says what ran (or why nothing did). */
static int mpi(int world, const job *j, double *ms, double *ems, double *bar, char *how, size_t n)
{
#if defined(EMBER_BENCH_MPI) && defined(EMBER_MPIRUN)
    if (access(EMBER_MPIRUN, X_OK) || access(EMBER_BENCH_MPI, X_OK)) {
        snprintf(how, n, "%s or %s is missing", EMBER_MPIRUN, EMBER_BENCH_MPI);
        return 1;
    }
    /* OpenMPI refuses root without --allow-run-as-root, and more ranks than
     * cores without --oversubscribe; each rank bound to a core (OpenMPI's
     * default for 2 ranks, said here so the run does not depend on it) */
    char flags[128];
    bool over = world > sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(flags, sizeof flags, "%s%s", geteuid() == 0 ? " --allow-run-as-root" : "",
             over ? " --oversubscribe --bind-to none" : " --bind-to core");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s%s -n %d %s %zu:%d %zu:%d %zu:%d %zu:%d", EMBER_MPIRUN, flags, world,
             EMBER_BENCH_MPI, sizes[0], j->reps[0], sizes[1], j->reps[1], sizes[2], j->reps[2], sizes[3],
             j->reps[3]);
    snprintf(how, n,
             "mpirun%s -n %d bench_allreduce_mpi (MPI_Allreduce, MPI_IN_PLACE; then ember's all_reduce over "
             "its MPI transport)",
             flags, world);
    return reference2(cmd, ms, ems, bar);
#else
    (void)world, (void)j, (void)ms, (void)ems, (void)bar;
    snprintf(how, n,
             "not built: meson found no MPI (apt-get install openmpi-bin libopenmpi-dev, then reconfigure)");
    return 1;
#endif
}

/* ---- memory bandwidth: STREAM-like passes over per-thread arrays ---------------------- */

enum { K_COPY, K_ADD, K_UPDATE, NKERNELS };
static const char *kernel_name[NKERNELS] = {"copy   c[i] = a[i]", "add    c[i] = a[i] + b[i]",
                                            "update a[i] += 1 (in place)"};
static const int kernel_arrays[NKERNELS] = {2, 3, 2}; /* bytes each pass reads and writes, in N */

typedef struct bw_job {
    int kernel, threads, reps;
    size_t bytes;
    pthread_barrier_t *bar;
    double *t; /* t[rep]: the pass's wall time, written by thread 0 */
} bw_job;

typedef struct bw_arg {
    bw_job *job;
    int id;
} bw_arg;

__attribute__((noinline)) static void pass(int kernel, float *restrict a, const float *restrict b,
                                           float *restrict c, size_t n)
{
    if (kernel == K_COPY)
        for (size_t i = 0; i < n; i++) c[i] = a[i];
    else if (kernel == K_ADD)
        for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
    else
        for (size_t i = 0; i < n; i++) a[i] += 1.0f;
}

static void *bw_thread(void *p)
{
    bw_arg *arg = p;
    bw_job *j = arg->job;
    size_t n = j->bytes / 4;
    float *a = malloc(j->bytes), *b = malloc(j->bytes), *c = malloc(j->bytes);
    if (a && b && c) { /* first touch by the thread that uses them */
        memset(a, 0, j->bytes);
        memset(b, 0, j->bytes);
        memset(c, 0, j->bytes);
    }
    for (int r = 0; r < j->reps + 1; r++) {
        pthread_barrier_wait(j->bar);
        double t0 = now();
        if (a && b && c) pass(j->kernel, a, b, c, n);
        pthread_barrier_wait(j->bar);
        if (arg->id == 0 && r > 0) j->t[r - 1] = now() - t0; /* rep 0 warms up */
    }
    volatile float sink = a && c ? a[n - 1] + c[n - 1] : 0;
    (void)sink;
    free(a);
    free(b);
    free(c);
    return NULL;
}

/* Median seconds of one pass of `kernel` run by `threads` threads at once,
 * each over its own arrays of `bytes`. */
static double bw_seconds(int kernel, int threads, size_t bytes)
{
    enum { REPS = 5 };
    double t[REPS];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    bw_job j = {kernel, threads, REPS, bytes, &bar, t};
    pthread_t th[64];
    bw_arg args[64];
    for (int i = 0; i < threads; i++) {
        args[i] = (bw_arg){&j, i};
        pthread_create(&th[i], NULL, bw_thread, &args[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    return median(t, REPS);
}

/* ---- the exchange between two cores: what shm's steps read --------------------------- */

static inline void cpu_relax_bench(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* One thread on CPU 0 writes a piece (512 KiB, shm's piece size), then one
 * on CPU 1 copies it into its own buffer, as shm's copy-back does: the
 * reader's time per piece is what shm's reduce and copy-back steps pay for
 * each piece another rank just wrote. turn: 2r + 1 once piece r is
 * written, 2r + 2 once it is read. */
typedef struct xc_job {
    float *buf, *own; /* the piece; the reader's copy */
    size_t n;
    int reps;
    _Atomic int turn;
    _Atomic int unpinned; /* a thread could not be bound to its CPU */
    double *t;            /* t[rep]: the copy's time */
} xc_job;

typedef struct xc_arg {
    xc_job *job;
    int id;
} xc_arg;

static void *xc_thread(void *p)
{
    xc_arg *arg = p;
    xc_job *j = arg->job;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(arg->id, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set)) atomic_store(&j->unpinned, 1);
    for (int r = 0; r < j->reps + 1; r++) {
        if (arg->id == 0) {
            while (atomic_load(&j->turn) != 2 * r) cpu_relax_bench();
            for (size_t i = 0; i < j->n; i++) j->buf[i] = (float)r;
            atomic_store(&j->turn, 2 * r + 1);
        } else {
            while (atomic_load(&j->turn) != 2 * r + 1) cpu_relax_bench();
            double t0 = now();
            memcpy(j->own, j->buf, j->n * sizeof(float));
            if (r > 0) j->t[r - 1] = now() - t0; /* rep 0 warms up */
            atomic_store(&j->turn, 2 * r + 2);
        }
    }
    return NULL;
}

/* GB/s of CPU 1 copying a piece CPU 0 just wrote (median of reps), or 0
 * where there are not two CPUs to bind the threads to */
static double exchange_gbps(void)
{
    enum { REPS = 200 };
    size_t bytes = (size_t)512 << 10;
    double t[REPS];
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) return 0;
    xc_job j = {.buf = calloc(1, bytes), .own = calloc(1, bytes), .n = bytes / 4, .reps = REPS, .t = t};
    double rate = 0;
    if (j.buf && j.own) {
        atomic_init(&j.turn, 0);
        atomic_init(&j.unpinned, 0);
        pthread_t th[2];
        xc_arg args[2] = {{&j, 0}, {&j, 1}};
        for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, xc_thread, &args[i]);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        if (!atomic_load(&j.unpinned)) rate = (double)bytes / median(t, REPS) / 1e9;
    }
    free(j.buf);
    free(j.own);
    return rate;
}

static double gbps(size_t bytes, double ms) { return (double)bytes / (ms * 1e-3) / 1e9; }

static void size_name(size_t bytes, char *s, size_t n)
{
    if (bytes >= (size_t)1 << 20)
        snprintf(s, n, "%zu MiB", bytes >> 20);
    else
        snprintf(s, n, "%zu KiB", bytes >> 10);
}

static void print_bound(int world, const double *shm, const double *bound, double xc_first)
{
    size_t big = sizes[NSIZES - 1];
    printf(
        "\nthe bound: whatever the algorithm, each of the %d ranks reads its whole input and writes its "
        "whole "
        "result\nat least once: 2 x %d x N bytes through memory, from %d cores at once. Measured beside each "
        "all_reduce\nabove (alternating, the same processes and tensors): every rank passes over its own "
        "tensor in place\n(x[i] += s: read N, write N), the slowest rank's time, median:\n",
        world, world, world);
    printf("%7s | %9s %9s | %9s\n", "size", "bound ms", "GB/s", "shm/bound");
    for (int s = 0; s < NSIZES; s++) {
        char sz[24];
        size_name(sizes[s], sz, sizeof sz);
        printf("%7s | %9.3f %9.2f | %8.2fx\n", sz, bound[s], 2.0 * world * sizes[s] / (bound[s] * 1e-3) / 1e9,
               shm[s] / bound[s]);
    }
    printf("at %zu MiB: %.0f MB moved in %.2f ms; ember shm takes %.2fx that (issue 16's target: at most "
           "1.5x).\n",
           big >> 20, 2.0 * world * big / 1e6, bound[NSIZES - 1], shm[NSIZES - 1] / bound[NSIZES - 1]);
    printf(
        "shm's own traffic per rank: its tensor read once and written once (the bound's bytes); through the\n"
        "segment it also writes about N (its input for the others' sub-ranges, its reduced sub-range) and\n"
        "reads about N (theirs), in pieces of at most 1 MiB that stay in cache.\n");
    printf(
        "\nfor scale, STREAM-like passes over %zu MiB arrays per thread (GB/s = bytes read + written / time, "
        "median of 5):\n",
        big >> 20);
    for (int k = 0; k < NKERNELS; k++) {
        size_t moved = (size_t)kernel_arrays[k] * big;
        double t1 = bw_seconds(k, 1, big), tw = bw_seconds(k, world, big);
        printf("  %-28s | 1 thread: %6.2f GB/s | %d threads: %6.2f GB/s\n", kernel_name[k], moved / t1 / 1e9,
               world, (double)world * moved / tw / 1e9);
    }
    double xc = exchange_gbps();
    if (xc <= 0) return;
    printf("and the exchange between two cores: CPU 1 copying 512 KiB that CPU 0 just wrote, as shm's\n");
    printf("reduce and copy-back read each piece; median of 200: %.2f GB/s before the shm runs, %.2f now.\n",
           xc_first, xc);
    printf("Where two vCPUs share no cache it falls, and the all-reduce slows while the bound does not\n");
    printf("(README, \"Measured\": on a 2-core Zen 5 VM, 83-91 GB/s beside 1.13-1.27x the bound, 39-40\n");
    printf("beside 2.67-2.78x).\n");
}

int main(int argc, char **argv)
{
    int world = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 0;
    if (world < 2 || world > 64) {
        fprintf(stderr, "usage: bench_allreduce [ranks 2..64] [reps]\n");
        return 2;
    }
    /* the exchange between two cores now, beside the shm runs that follow
     * (a VM may move its vCPUs within minutes) */
    double xc_first = exchange_gbps();
    job j;
    for (int s = 0; s < NSIZES; s++) j.reps[s] = reps > 0 ? reps : default_reps[s];
    /* what rank 0 writes, shared with this process */
    struct out {
        double ms[NSIZES], bound[NSIZES];
    } *out = mmap(NULL, sizeof *out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED) return 1;
    double shm[NSIZES], tcp[NSIZES], ref[NSIZES], mref[NSIZES], eref[NSIZES], bound[NSIZES], bar[2] = {0, 0};
    j.ms = out->ms;
    j.bound = out->bound;
    if (bench_ranks(world, EM_TRANSPORT_SHM, "bench/shm", measure, &j)) return 1;
    memcpy(shm, out->ms, sizeof shm);
    memcpy(bound, out->bound, sizeof bound);
    j.bound = NULL;
    /* shm again with each rank bound to a core, as mpirun runs MPI's */
    double pinned[NSIZES];
    bool can_pin = world <= sysconf(_SC_NPROCESSORS_ONLN);
    bench_pin_ranks = can_pin;
    if (can_pin && bench_ranks(world, EM_TRANSPORT_SHM, "bench/shm-bound", measure, &j)) return 1;
    bench_pin_ranks = false;
    memcpy(pinned, out->ms, sizeof pinned);
    if (bench_ranks(world, EM_TRANSPORT_TCP, "bench/tcp", measure, &j)) return 1;
    memcpy(tcp, out->ms, sizeof tcp);
    char how[512];
    bool have_mpi = mpi(world, &j, mref, eref, bar, how, sizeof how) == 0;
    bool have_gloo = gloo(world, &j, ref) == 0;
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("bench_allreduce: all_reduce(sum) of f32 between %d local ranks on %s (%ld CPUs); median of "
           "%d/%d/%d/%d reps, slowest rank; GB/s = bytes / time\n",
           world, model, sysconf(_SC_NPROCESSORS_ONLN), j.reps[0], j.reps[1], j.reps[2], j.reps[3]);
    printf("MPI: %s%s\n", how, have_mpi ? "" : " -- no MPI figures");
    printf("%7s | %9s %7s | %9s %7s | %9s %7s | %9s | %9s %7s | %9s\n", "size", "shm ms", "GB/s", "tcp ms",
           "GB/s", "mpi ms", "GB/s", "mpi/shm", "gloo ms", "GB/s", "gloo/shm");
    for (int s = 0; s < NSIZES; s++) {
        char sz[24], m1[16] = "-", m2[16] = "-", m3[16] = "-", g1[16] = "-", g2[16] = "-", g3[16] = "-";
        size_name(sizes[s], sz, sizeof sz);
        if (have_mpi) {
            snprintf(m1, sizeof m1, "%.3f", mref[s]);
            snprintf(m2, sizeof m2, "%.2f", gbps(sizes[s], mref[s]));
            snprintf(m3, sizeof m3, "%.2fx", mref[s] / shm[s]);
        }
        if (have_gloo) {
            snprintf(g1, sizeof g1, "%.3f", ref[s]);
            snprintf(g2, sizeof g2, "%.2f", gbps(sizes[s], ref[s]));
            snprintf(g3, sizeof g3, "%.1fx", ref[s] / shm[s]);
        }
        printf("%7s | %9.3f %7.2f | %9.3f %7.2f | %9s %7s | %9s | %9s %7s | %9s\n", sz, shm[s],
               gbps(sizes[s], shm[s]), tcp[s], gbps(sizes[s], tcp[s]), m1, m2, m3, g1, g2, g3);
    }
    printf("(mpi/shm and gloo/shm: the reference's time over ember's; 1.00x or more: ember is at least as "
           "fast)\n");
    if (!have_gloo) printf("(gloo: no torch in EMBER_BENCH_PYTHON or /usr/bin/python3)\n");
    if (have_mpi) {
        printf(
            "\nember over its MPI transport (EMBER_TRANSPORT=mpi), in the same mpirun job as MPI_Allreduce "
            "above,\nalternating with it on the same buffer; every call first checks all ranks' calls:\n");
        printf("%7s | %9s | %12s %7s | %13s\n", "size", "mpi ms", "ember-mpi ms", "GB/s", "mpi/ember-mpi");
        for (int s = 0; s < NSIZES; s++) {
            char sz[24];
            size_name(sizes[s], sz, sizeof sz);
            printf("%7s | %9.3f | %12.3f %7.2f | %12.2fx\n", sz, mref[s], eref[s], gbps(sizes[s], eref[s]),
                   mref[s] / eref[s]);
        }
        printf("the check alone: em_barrier %.3f ms beside MPI_Barrier %.3f ms (ember-mpi's all_reduce costs "
               "about this much over MPI's)\n",
               bar[1], bar[0]);
    }
    if (can_pin) {
        printf("\nshm with rank r bound to CPU r, as mpirun binds MPI's ranks above (--bind-to core):\n");
        printf("%7s | %9s %7s | %9s\n", "size", "shm ms", "GB/s", "mpi/shm");
        for (int s = 0; s < NSIZES; s++) {
            char sz[24], m3[16] = "-";
            size_name(sizes[s], sz, sizeof sz);
            if (have_mpi) snprintf(m3, sizeof m3, "%.2fx", mref[s] / pinned[s]);
            printf("%7s | %9.3f %7.2f | %9s\n", sz, pinned[s], gbps(sizes[s], pinned[s]), m3);
        }
    }
    print_bound(world, shm, bound, xc_first);
    return 0;
}
