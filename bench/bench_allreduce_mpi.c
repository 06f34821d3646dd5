/* bench_allreduce_mpi.c — MPI_Allreduce (f32 sum, in place) timed the way
 * bench_allreduce times ember's all_reduce, so the two can be compared in
 * one run: every rank waits at a barrier, times one call, the slowest rank's
 * time counts, and the figure is the median over reps after 2 warm-up calls.
 * One checked call on rank-dependent values comes first; the timed calls
 * run on zeros (the same work, a sum that cannot overflow).
 *
 * In the same job, on the same buffers, ember's em_all_reduce over its MPI
 * transport (em_pg_from_env under mpirun: EM_TRANSPORT_MPI), timed the same
 * way; and the cost of ember's every-call check on its own: em_barrier (the
 * check and nothing else) beside MPI_Barrier.
 *
 * Built only when meson finds MPI; bench_allreduce runs it under mpirun.
 *
 * usage: mpirun -n <ranks> bench_allreduce_mpi <bytes>:<reps>...
 * prints, on rank 0, one line per size: "<bytes> <MPI median ms> <ember
 * median ms>", then "barrier <MPI_Barrier ms> <em_barrier ms>" */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ember/dist.h"

static em_pg *pg; /* ember's group over the MPI transport */

/* The slowest rank's median over reps of dt[], on rank 0. */
static double slowest_median(double *dt, int reps, int rank)
{
    double *m = calloc((size_t)reps, sizeof *m);
    MPI_Reduce(dt, m, reps, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    double v = rank == 0 ? 1e3 * median(m, reps) : 0;
    free(m);
    return v;
}

static int measure(size_t bytes, int reps, int rank, int world)
{
    int64_t n = (int64_t)(bytes / sizeof(float));
    em_tensor *t = em_zeros(EM_F32, 1, &n);
    float *x = t ? em_data(t) : NULL;
    double *dt = calloc((size_t)reps, sizeof *dt), *de = calloc((size_t)reps, sizeof *de);
    if (!x || !dt || !de || n > 0x7fffffff) {
        fprintf(stderr, "bench_allreduce_mpi: cannot take %zu bytes\n", bytes);
        return 1;
    }
    float want = (float)(world * (world + 1) / 2);
    for (int k = 0; k < 2; k++) { /* MPI's, then ember's, each checked once */
        for (int64_t i = 0; i < n; i++) x[i] = (float)(rank + 1);
        if (k == 0)
            MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (em_all_reduce(pg, t, EM_RED_SUM, NULL))
            return fprintf(stderr, "bench_allreduce_mpi: %s\n", em_last_error()), 1;
        if (x[0] != want || x[n - 1] != want) {
            fprintf(stderr, "bench_allreduce_mpi: wrong result %g, want %g\n", x[n - 1], want);
            return 1;
        }
    }
    memset(x, 0, (size_t)n * sizeof *x);
    /* alternating, so both see the same load */
    enum { WARM = 2 };
    for (int i = 0; i < WARM + reps; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (i >= WARM) dt[i - WARM] = now() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        if (em_all_reduce(pg, t, EM_RED_SUM, NULL))
            return fprintf(stderr, "bench_allreduce_mpi: %s\n", em_last_error()), 1;
        if (i >= WARM) de[i - WARM] = now() - t0;
    }
    double a = slowest_median(dt, reps, rank), b = slowest_median(de, reps, rank);
    if (rank == 0) printf("%zu %.6f %.6f\n", bytes, a, b);
    fflush(stdout);
    em_free(t);
    free(dt);
    free(de);
    return 0;
}

/* The check's own cost: em_barrier is the check alone; MPI_Barrier beside it. */
static void barriers(int rank)
{
    enum { REPS = 500, WARM = 10 };
    static double dm[REPS], de[REPS];
    for (int i = 0; i < WARM + REPS; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        MPI_Barrier(MPI_COMM_WORLD);
        if (i >= WARM) dm[i - WARM] = now() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        em_barrier(pg, NULL);
        if (i >= WARM) de[i - WARM] = now() - t0;
    }
    double a = slowest_median(dm, REPS, rank), b = slowest_median(de, REPS, rank);
    if (rank == 0) printf("barrier %.6f %.6f\n", a, b);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int level = 0; /* ember's communication thread calls MPI too */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
    int rank, world, bad = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    pg = em_pg_from_env(); /* under mpirun: the MPI transport, MPI as initialised here */
    if (!pg || em_pg_transport(pg) != EM_TRANSPORT_MPI) {
        fprintf(stderr, "bench_allreduce_mpi: no ember group over MPI: %s\n",
                pg ? "another transport" : em_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (int a = 1; a < argc && !bad; a++) {
        size_t bytes;
        int reps;
        if (sscanf(argv[a], "%zu:%d", &bytes, &reps) != 2 || bytes < sizeof(float) || reps < 1) {
            if (rank == 0) fprintf(stderr, "usage: bench_allreduce_mpi <bytes>:<reps>...\n");
            bad = 1;
            break;
        }
        bad = measure(bytes, reps, rank, world);
    }
    if (!bad) barriers(rank);
    if (bad) MPI_Abort(MPI_COMM_WORLD, 2);
    em_pg_free(pg);
    MPI_Finalize();
    return 0;
}
