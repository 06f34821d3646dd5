/* mpi_worker.c — a worker for test_mpi.c, started by `mpirun -n N`: it makes
 * its group with em_pg_from_env alone (no launcher variables: the MPI
 * transport is chosen by itself under mpirun, rank 0 hosts the store) and
 * runs one scenario, named by its argument:
 *   collectives  every collective on every dtype and op that matters,
 *                send/recv, asynchronous work, a second group alive beside the
 *                first; each result checked against
 *                the value every rank can compute alone (integer-valued data,
 *                so sums are exact in any order)
 *   mismatch     rank 0 all-reduces 4 elements, the others 5
 *   unreceived   rank 0 sends to rank 1, which does not receive, then all
 *                ranks all-reduce
 *   recv-vs-collective  rank 1 receives from rank 0, which all-reduces
 *   recv-vs-recv rank 0 and rank 1 each receive from the other
 *   late-send    rounds in which a recv is waiting when its send comes, the
 *                sender's next call right behind it: a collective, or a recv
 *                of its own from the receiver (neither is a mismatch)
 *   send-exit    rank 1 sends 4 bytes and 10 MiB to rank 0 and leaves at once;
 *                rank 0 receives both 0.3 s later
 *   random       a random program of collectives and send/recv every rank
 *                agrees on, each rank pausing at random before each call
 *                (also runs under ember launch, over TCP and shared memory)
 *   skip         every rank but 0 skips a barrier (EMBER_TIMEOUT short)
 *   bf16         prints the bits of a bf16 all_reduce (avg) of fixed data (the
 *                test compares them with the TCP path's: also runs under
 *                ember launch)
 *   bad-config   em_pg_new with the MPI transport and a world MPI disagrees with
 * With "serialized" after the scenario the worker initialises MPI itself
 * at MPI_THREAD_SERIALIZED first (ember then locks around its MPI calls).
 * Prints "rank R ok" and exits 0 when the scenario went as it should (a
 * failing scenario: each rank prints the error it got, "rank R error: ...");
 * else prints why and exits 1. Not a test itself. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/dist.h"

static int rank, world;

#define FAIL(...)                                                                                            \
    do {                                                                                                     \
        fprintf(stderr, "rank %d: ", rank);                                                                  \
        fprintf(stderr, __VA_ARGS__);                                                                        \
        fprintf(stderr, " (last error: %s)\n", em_last_error());                                             \
        exit(1);                                                                                             \
    } while (0)
#define OK(x)                                                                                                \
    do {                                                                                                     \
        if ((x) != EM_OK) FAIL("%s failed", #x);                                                             \
    } while (0)

/* rank r's value at i: small integers, exact in every dtype */
static double val(int r, int64_t i) { return (double)((r * 7 + i * 3) % 11) - 5.0; }

static em_tensor *filled(em_dtype dt, int64_t n, int r)
{
    em_tensor *t = em_zeros(dt, 1, &n);
    if (!t) FAIL("em_zeros");
    em_tensor *f = em_zeros(EM_F64, 1, &n);
    for (int64_t i = 0; i < n; i++) ((double *)em_data(f))[i] = val(r, i);
    OK(em_copy_into(t, f));
    em_free(f);
    return t;
}

static double at(em_tensor *t, int64_t i)
{
    int64_t n = em_numel(t);
    em_tensor *f = em_zeros(EM_F64, 1, &n);
    OK(em_copy_into(f, t));
    double v = ((double *)em_data(f))[i];
    em_free(f);
    return v;
}

static double reduce_want(int op, int64_t i)
{
    double acc = val(0, i);
    for (int r = 1; r < world; r++) {
        double x = val(r, i);
        acc = op == EM_RED_MAX ? fmax(acc, x) : op == EM_RED_MIN ? fmin(acc, x) : acc + x;
    }
    return op == EM_RED_AVG ? acc / world : acc;
}

static void collectives(em_pg *pg)
{
    const em_dtype dts[] = {EM_F32, EM_F64, EM_BF16, EM_F16, EM_I32};
    const int64_t sizes[] = {1, 37, 70000};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (int op = EM_RED_SUM; op <= EM_RED_MIN; op++)
            for (size_t k = 0; k < 3; k++) {
                int64_t n = sizes[k];
                em_tensor *t = filled(dts[d], n, rank);
                OK(em_all_reduce(pg, t, op, NULL));
                for (int64_t i = 0; i < n; i += 1 + n / 50) {
                    double want = reduce_want(op, i);
                    if (dts[d] == EM_I32 && op == EM_RED_AVG) want = trunc(want);
                    double tol = dts[d] == EM_BF16 ? 0.02 * fabs(want) + 1e-3 : 1e-3 * fabs(want) + 1e-6;
                    if (fabs(at(t, i) - want) > tol)
                        FAIL("all_reduce(%s, op %d, n %lld)[%lld] = %g, want %g", em_dtype_name(dts[d]), op,
                             (long long)n, (long long)i, at(t, i), want);
                }
                em_free(t);
            }
    /* MAX propagates NaN as the TCP path does */
    int64_t one = 1;
    em_tensor *nan = em_full(EM_F32, 1, &one, rank == world - 1 ? NAN : 1.0);
    OK(em_all_reduce(pg, nan, EM_RED_MAX, NULL));
    if (!isnan(at(nan, 0))) FAIL("all_reduce max of a NaN gave %g", at(nan, 0));
    em_free(nan);
    /* broadcast from the last rank */
    em_tensor *b = filled(EM_F32, 1000, rank);
    OK(em_broadcast(pg, b, world - 1, NULL));
    if (at(b, 999) != val(world - 1, 999)) FAIL("broadcast");
    em_free(b);
    /* all_gather and gather */
    const int64_t m = 33;
    int64_t wm = world * m;
    em_tensor *in = filled(EM_F64, m, rank), *out = em_zeros(EM_F64, 1, &wm);
    OK(em_all_gather(pg, out, in, NULL));
    for (int r = 0; r < world; r++)
        if (at(out, r * m + 5) != val(r, 5)) FAIL("all_gather: chunk %d", r);
    em_tensor *g = em_zeros(EM_F64, 1, &wm);
    OK(em_gather(pg, rank == 1 ? g : NULL, in, 1, NULL));
    if (rank == 1)
        for (int r = 0; r < world; r++)
            if (at(g, r * m + 7) != val(r, 7)) FAIL("gather: chunk %d", r);
    /* reduce_scatter: chunk `rank` of the sum (in f32 and bf16) */
    for (int k = 0; k < 2; k++) {
        em_dtype dt = k ? EM_BF16 : EM_F32;
        em_tensor *rin = filled(dt, wm, rank), *rout = em_zeros(dt, 1, &m);
        OK(em_reduce_scatter(pg, rout, rin, EM_RED_SUM, NULL));
        for (int64_t i = 0; i < m; i++)
            if (at(rout, i) != reduce_want(EM_RED_SUM, rank * m + i))
                FAIL("reduce_scatter(%s)[%lld]", em_dtype_name(dt), (long long)i);
        em_free(rin);
        em_free(rout);
    }
    em_free(in);
    em_free(out);
    em_free(g);
    OK(em_barrier(pg, NULL));
    /* send/recv around the ring: both sends first (eager), then the recvs */
    int right = (rank + 1) % world, left = (rank + world - 1) % world;
    em_tensor *s1 = filled(EM_I32, 100000, rank), *s2 = filled(EM_F32, 3, rank);
    em_tensor *r1 = em_zeros(EM_I32, 1, (int64_t[]){100000}), *r2 = em_zeros(EM_F32, 1, (int64_t[]){3});
    OK(em_send(pg, s1, right, NULL));
    OK(em_send(pg, s2, right, NULL));
    OK(em_recv(pg, r1, left, NULL));
    OK(em_recv(pg, r2, left, NULL));
    if (at(r1, 99999) != val(left, 99999) || at(r2, 2) != val(left, 2)) FAIL("send/recv ring");
    /* asynchronous work: several all_reduces in flight, then waited in order */
    em_work *w[4];
    em_tensor *a[4];
    for (int k = 0; k < 4; k++) {
        a[k] = filled(EM_F32, 1000 * (k + 1), rank);
        OK(em_all_reduce(pg, a[k], EM_RED_SUM, &w[k]));
    }
    for (int k = 0; k < 4; k++) {
        OK(em_work_wait(w[k]));
        if (at(a[k], 17) != reduce_want(EM_RED_SUM, 17)) FAIL("async all_reduce %d", k);
        em_free(a[k]);
    }
    em_free(s1), em_free(s2), em_free(r1), em_free(r2);
    /* a second group alive beside the first (its own communicator and store):
     * calls on both, interleaved, one of them asynchronous */
    em_pg *pg2 = em_pg_from_env();
    if (!pg2) FAIL("a second group");
    em_tensor *x = filled(EM_F32, 500, rank), *y = filled(EM_F64, 300, rank);
    em_work *wx;
    OK(em_all_reduce(pg, x, EM_RED_SUM, &wx));
    OK(em_all_reduce(pg2, y, EM_RED_MAX, NULL));
    OK(em_work_wait(wx));
    if (at(x, 499) != reduce_want(EM_RED_SUM, 499) || at(y, 299) != reduce_want(EM_RED_MAX, 299))
        FAIL("two groups at once");
    em_free(x), em_free(y);
    em_pg_free(pg2);
}

/* Spins for about us microseconds (the peer is then already waiting). */
static void spin_us(double us)
{
    double t0 = MPI_Wtime();
    while (MPI_Wtime() - t0 < us * 1e-6) {
    }
}

/* Rank 0 sends to rank 1 once rank 1 waits in its recv, then at once makes
 * its next call: an all_reduce (even rounds) or a recv from rank 1, which
 * sends back after its recv (odd rounds). A recv that took the header of
 * rank 0's next call for a missing send would fail the round as a mismatch. */
static void late_send(em_pg *pg)
{
    int64_t n = 16;
    em_tensor *t = em_zeros(EM_F32, 1, &n);
    for (int k = 0; k < 400; k++) {
        bool back = k % 2;
        if (rank == 0) {
            spin_us(50 + 10 * (k % 7));
            OK(em_send(pg, t, 1, NULL));
            if (back) OK(em_recv(pg, t, 1, NULL));
        } else if (rank == 1) {
            OK(em_recv(pg, t, 0, NULL));
            if (back) OK(em_send(pg, t, 0, NULL));
        }
        if (!back) OK(em_all_reduce(pg, t, EM_RED_MAX, NULL));
    }
    em_free(t);
}

/* xorshift64: the same sequence on every rank from the same seed */
static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A random program every rank agrees on (one seed): all_reduces,
 * broadcasts, a send/recv between two random ranks, rings of send/recv,
 * barriers, all_gathers, and queued calls waited out of order;
 * each rank spins 0-120 us (its own random) before each call, so every
 * order of arrival comes up. Every value received is checked. */
static void random_calls(em_pg *pg)
{
    uint64_t prog = 0x9e3779b97f4a7c15ull, mine = 0x2545f4914f6cdd1dull * (uint64_t)(rank + 1);
    int64_t n = 8;
    int64_t wn = n * world;
    em_tensor *t = em_zeros(EM_F32, 1, &n), *all = em_zeros(EM_F32, 1, &wn);
    float *v = em_data(t);
    for (int step = 0; step < 600; step++) {
        int kind = (int)(next_rand(&prog) % 7), a = (int)(next_rand(&prog) % (uint64_t)world);
        int b = (a + 1 + (int)(next_rand(&prog) % (uint64_t)(world - 1))) % world;
        spin_us((double)(next_rand(&mine) % 120));
        if (kind == 0) {
            v[0] = (float)rank;
            OK(em_all_reduce(pg, t, EM_RED_SUM, NULL));
            if (v[0] != (float)(world * (world - 1) / 2)) FAIL("step %d: all_reduce gave %g", step, v[0]);
        } else if (kind == 1) {
            v[0] = rank == a ? (float)step : -1.0f;
            OK(em_broadcast(pg, t, a, NULL));
            if (v[0] != (float)step) FAIL("step %d: broadcast gave %g", step, v[0]);
        } else if (kind == 2) {
            if (rank == a) {
                v[0] = (float)(step * 10 + a);
                OK(em_send(pg, t, b, NULL));
            } else if (rank == b) {
                OK(em_recv(pg, t, a, NULL));
                if (v[0] != (float)(step * 10 + a)) FAIL("step %d: recv from %d gave %g", step, a, v[0]);
            }
        } else if (kind == 3) {
            v[0] = (float)(step * 10 + rank);
            OK(em_send(pg, t, (rank + 1) % world, NULL));
            int left = (rank + world - 1) % world;
            OK(em_recv(pg, t, left, NULL));
            if (v[0] != (float)(step * 10 + left)) FAIL("step %d: ring recv gave %g", step, v[0]);
        } else if (kind == 4) {
            OK(em_barrier(pg, NULL));
        } else if (kind == 5) {
            v[0] = (float)(step + rank);
            OK(em_all_gather(pg, all, t, NULL));
            for (int r = 0; r < world; r++)
                if (((float *)em_data(all))[r * n] != (float)(step + r))
                    FAIL("step %d: all_gather chunk %d", step, r);
        } else { /* queued: an all_reduce, a ring step, waited in the other order */
            em_tensor *x = em_full(EM_F32, 1, &n, 1.0), *y = em_full(EM_F32, 1, &n, (double)rank);
            em_work *w1, *w2, *w3;
            OK(em_all_reduce(pg, x, EM_RED_SUM, &w1));
            OK(em_send(pg, y, (rank + 1) % world, &w2));
            OK(em_recv(pg, t, (rank + world - 1) % world, &w3));
            OK(em_work_wait(w3));
            OK(em_work_wait(w2));
            OK(em_work_wait(w1));
            if (((float *)em_data(x))[0] != (float)world || v[0] != (float)((rank + world - 1) % world))
                FAIL("step %d: queued calls gave %g, %g", step, ((float *)em_data(x))[0], v[0]);
            em_free(x), em_free(y);
        }
    }
    em_free(t);
    em_free(all);
}

/* Rank 1's last calls are sends (eager: done once handed over), and it
 * frees its group and exits right after; rank 0 receives them later. */
static void send_exit(em_pg *pg)
{
    int64_t one = 1, n = 10 << 18;
    em_tensor *a = em_full(EM_F32, 1, &one, rank == 1 ? 7.0 : 0.0),
              *b = em_full(EM_F32, 1, &n, rank == 1 ? 5.0 : 0.0);
    if (rank == 1) {
        OK(em_send(pg, a, 0, NULL));
        OK(em_send(pg, b, 0, NULL));
    } else if (rank == 0) {
        spin_us(300000);
        OK(em_recv(pg, a, 1, NULL));
        OK(em_recv(pg, b, 1, NULL));
        if (at(a, 0) != 7.0 || at(b, n - 1) != 5.0) FAIL("send-exit: got %g, %g", at(a, 0), at(b, n - 1));
    }
    em_free(a), em_free(b);
}

/* A scenario that must fail on every rank: prints the error it got. */
static int failing(em_pg *pg, const char *what)
{
    em_status s = EM_OK;
    int64_t four = 4, five = 5;
    em_tensor *t = em_zeros(EM_F32, 1, rank == 0 ? &four : &five);
    if (!strcmp(what, "mismatch")) {
        s = em_all_reduce(pg, t, EM_RED_SUM, NULL);
    } else if (!strcmp(what, "unreceived")) {
        if (rank == 0) OK(em_send(pg, t, 1, NULL));
        em_tensor *u = em_zeros(EM_F32, 1, &four);
        s = em_all_reduce(pg, u, EM_RED_SUM, NULL);
    } else if (!strcmp(what, "recv-vs-collective")) {
        if (rank == 1)
            s = em_recv(pg, t, 0, NULL);
        else
            s = em_all_reduce(pg, t, EM_RED_SUM, NULL);
    } else if (!strcmp(what, "recv-vs-recv")) {
        s = em_recv(pg, t, 1 - rank, NULL);
    } else if (!strcmp(what, "skip")) {
        if (rank == 0)
            s = em_barrier(pg, NULL);
        else
            s = EM_ERR_TIMEOUT; /* it skips the call: nothing to report */
    }
    if (s == EM_OK) FAIL("scenario %s succeeded", what);
    printf("rank %d error %s: %s\n", rank, em_status_name(s), em_last_error());
    /* a broken group fails every later call at once */
    if (rank == 0 && em_barrier(pg, NULL) != EM_ERR_DIST) FAIL("a call after the failure did not fail fast");
    return 0;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "collectives";
    /* "serialized" after the scenario: the program initialises MPI itself, at
     * MPI_THREAD_SERIALIZED, and ember keeps that (and finalizes nothing) */
    bool own = argc > 2 && !strcmp(argv[2], "serialized");
    if (own) {
        int level = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &level);
        if (level != MPI_THREAD_SERIALIZED) {
            fprintf(stderr, "mpi_worker: MPI gave thread level %d\n", level);
            return 1;
        }
    }
    em_pg *pg = em_pg_from_env();
    if (!pg) {
        fprintf(stderr, "mpi_worker: %s\n", em_last_error());
        return 1;
    }
    rank = em_pg_rank(pg);
    world = em_pg_world(pg);
    /* bf16 also runs under ember launch, over TCP, for the bits to compare */
    if (em_pg_transport(pg) != EM_TRANSPORT_MPI && strcmp(what, "bf16") && strcmp(what, "random"))
        FAIL("the transport is %d, not MPI", (int)em_pg_transport(pg));
    if (!strcmp(what, "collectives")) {
        collectives(pg);
    } else if (!strcmp(what, "late-send")) {
        late_send(pg);
    } else if (!strcmp(what, "send-exit")) {
        send_exit(pg);
    } else if (!strcmp(what, "random")) {
        random_calls(pg);
        printf("rank %d transport %d\n", rank, (int)em_pg_transport(pg));
    } else if (!strcmp(what, "bf16")) {
        int64_t n = 8;
        em_tensor *t = em_zeros(EM_BF16, 1, &n);
        for (int i = 0; i < n; i++) ((uint16_t *)em_data(t))[i] = (uint16_t)(0x3f80 + 37 * i + 11 * rank);
        OK(em_all_reduce(pg, t, EM_RED_AVG, NULL));
        printf("bits");
        for (int i = 0; i < n; i++) printf(" %04x", ((uint16_t *)em_data(t))[i]);
        printf("\n");
    } else if (!strcmp(what, "bad-config")) {
        /* an MPI group is MPI_COMM_WORLD: a config that says otherwise is refused */
        em_pg *bad =
            em_pg_new(&(em_pg_config){.rank = rank, .world = world + 1, .transport = EM_TRANSPORT_MPI});
        if (bad || em_last_status() != EM_ERR_ARG) FAIL("em_pg_new with world %d was not refused", world + 1);
        printf("rank %d error %s: %s\n", rank, em_status_name(em_last_status()), em_last_error());
    } else {
        failing(pg, what);
    }
    em_pg_free(pg);
    if (own) MPI_Finalize();
    printf("rank %d ok\n", rank);
    return 0;
}
