/* bench_allreduce_mpi.c — MPI_Allreduce (f32 sum, in place) timed the way
 * bench_allreduce times ember's all_reduce, so the two can be compared in
 * one run: every rank waits at a barrier, times one call, the slowest rank's
 * time counts, and the figure is the median over reps after 2 warm-up calls.
 * One checked call on rank-dependent values comes first; the timed calls
 * run on zeros (the same work, a sum that cannot overflow).
 *
 * Built only when meson finds MPI; bench_allreduce runs it under mpirun.
 *
 * usage: mpirun -n <ranks> bench_allreduce_mpi <bytes>:<reps>...
 * prints, on rank 0, one line per size: "<bytes> <median ms>" */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static int measure(size_t bytes, int reps, int rank, int world)
{
    int64_t n = (int64_t)(bytes / sizeof(float));
    float *x = malloc((size_t)n * sizeof *x);
    double *dt = calloc((size_t)reps, sizeof *dt), *slowest = calloc((size_t)reps, sizeof *slowest);
    if (!x || !dt || !slowest || n > 0x7fffffff) {
        fprintf(stderr, "bench_allreduce_mpi: cannot take %zu bytes\n", bytes);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rank + 1);
    MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    float want = (float)(world * (world + 1) / 2);
    if (x[0] != want || x[n - 1] != want) {
        fprintf(stderr, "bench_allreduce_mpi: wrong result %g, want %g\n", x[n - 1], want);
        return 1;
    }
    memset(x, 0, (size_t)n * sizeof *x);
    enum { WARM = 2 };
    for (int i = 0; i < WARM + reps; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (i >= WARM) dt[i - WARM] = now() - t0;
    }
    MPI_Reduce(dt, slowest, reps, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%zu %.6f\n", bytes, 1e3 * median(slowest, reps));
    fflush(stdout);
    free(x);
    free(dt);
    free(slowest);
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, world, bad = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
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
    if (bad) MPI_Abort(MPI_COMM_WORLD, 2);
    MPI_Finalize();
    return 0;
}
