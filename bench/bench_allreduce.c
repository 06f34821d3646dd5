/* bench_allreduce.c — all_reduce latency and bandwidth between local ranks
 * for 1, 16 and 100 MiB of f32, over the shared-memory and the TCP data
 * paths, side by side with torch.distributed's gloo backend measured in the
 * same run (bench/allreduce_gloo.py, when /usr/bin/python3 has torch), and
 * with one memcpy of the same size for scale.
 *
 * A measurement: every rank waits at a barrier, times one all_reduce(sum),
 * and the slowest rank's time counts; the figure is the median over reps
 * after warm-up. Bandwidth is the message size over that time (for 2 ranks
 * this is also what nccl-tests calls bus bandwidth).
 *
 * usage: bench_allreduce [ranks] [reps]   (default 2 ranks; 100/20/7 reps for 1/16/100 MiB) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_dist.h"
#include "bench_util.h"

#define NSIZES 3
static const int sizes_mb[NSIZES] = {1, 16, 100};
static const int default_reps[NSIZES] = {100, 20, 7};

typedef struct job {
    int reps[NSIZES];
    double *ms; /* shared with the parent: ms[size], written by rank 0 */
} job;

static int measure(em_pg *pg, void *ctx)
{
    job *j = ctx;
    int world = em_pg_world(pg);
    for (int s = 0; s < NSIZES; s++) {
        int64_t n = (int64_t)sizes_mb[s] * (1 << 20) / 4;
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
        for (int i = 0; i < warm + reps; i++) {
            if (em_barrier(pg, NULL)) goto fail;
            double t0 = now();
            if (em_all_reduce(pg, t, EM_RED_SUM, NULL)) goto fail;
            if (i >= warm) dt[i - warm] = now() - t0;
        }
        int64_t nr = reps;
        em_tensor *times = em_from_data(EM_F64, 1, &nr, dt);
        if (!times || em_all_reduce(pg, times, EM_RED_MAX, NULL)) goto fail; /* the slowest rank's */
        memcpy(dt, em_data(times), sizeof *dt * (size_t)reps);
        if (em_pg_rank(pg) == 0) j->ms[s] = 1e3 * median(dt, reps);
        em_free(times);
        em_free(t);
        free(dt);
    }
    return 0;
fail:
    fprintf(stderr, "bench_allreduce: rank %d: %s\n", em_pg_rank(pg), em_last_error());
    return 1;
}

/* gloo's medians (ms) into ms[], or 1 when torch is not available. */
static int gloo(int world, const job *j, double *ms)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/allreduce_gloo.py --world %d --reps %d,%d,%d 2>/dev/null",
             EMBER_BENCH_DIR, world, j->reps[0], j->reps[1], j->reps[2]);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    int got = 0;
    char line[256];
    while (fgets(line, sizeof line, p)) {
        int mb;
        double m;
        if (sscanf(line, "%d %lf", &mb, &m) != 2) continue;
        for (int s = 0; s < NSIZES; s++)
            if (sizes_mb[s] == mb) ms[s] = m, got++;
    }
    return pclose(p) != 0 || got != NSIZES;
}

static double memcpy_ms(int mb)
{
    size_t n = (size_t)mb << 20;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double t[7];
    for (int i = 0; i < 7; i++) {
        double t0 = now();
        memcpy(b, a, n);
        t[i] = now() - t0;
    }
    volatile char sink = b[n - 1];
    (void)sink;
    free(a);
    free(b);
    return 1e3 * median(t, 7);
}

static double gbps(int mb, double ms) { return (double)mb * (1 << 20) / (ms * 1e-3) / 1e9; }

int main(int argc, char **argv)
{
    int world = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 0;
    if (world < 2 || world > 64) {
        fprintf(stderr, "usage: bench_allreduce [ranks 2..64] [reps]\n");
        return 2;
    }
    job j;
    for (int s = 0; s < NSIZES; s++) j.reps[s] = reps > 0 ? reps : default_reps[s];
    double *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return 1;
    double shm[NSIZES], tcp[NSIZES], ref[NSIZES];
    j.ms = shared;
    if (bench_ranks(world, EM_TRANSPORT_SHM, "bench/shm", measure, &j)) return 1;
    memcpy(shm, shared, sizeof shm);
    if (bench_ranks(world, EM_TRANSPORT_TCP, "bench/tcp", measure, &j)) return 1;
    memcpy(tcp, shared, sizeof tcp);
    bool have_gloo = gloo(world, &j, ref) == 0;
    printf("bench_allreduce: all_reduce(sum) of f32 between %d local ranks; median of %d/%d/%d reps, slowest "
           "rank; GB/s = bytes / time\n",
           world, j.reps[0], j.reps[1], j.reps[2]);
    printf("%7s | %9s %7s | %9s %7s | %9s %7s | %13s | %10s\n", "size", "shm ms", "GB/s", "tcp ms", "GB/s",
           "gloo ms", "GB/s", "gloo/shm time", "memcpy ms");
    for (int s = 0; s < NSIZES; s++) {
        char g1[16] = "-", g2[16] = "-", g3[16] = "-";
        if (have_gloo) {
            snprintf(g1, sizeof g1, "%.3f", ref[s]);
            snprintf(g2, sizeof g2, "%.2f", gbps(sizes_mb[s], ref[s]));
            snprintf(g3, sizeof g3, "%.1fx", ref[s] / shm[s]);
        }
        printf("%4d MiB | %9.3f %7.2f | %9.3f %7.2f | %9s %7s | %13s | %10.3f\n", sizes_mb[s], shm[s],
               gbps(sizes_mb[s], shm[s]), tcp[s], gbps(sizes_mb[s], tcp[s]), g1, g2, g3, memcpy_ms(sizes_mb[s]));
    }
    if (!have_gloo) printf("(gloo: /usr/bin/python3 has no torch; apt-get install python3-torch)\n");
    return 0;
}
