/* test_collectives_mismatch.c — point-to-point calls are checked like
 * collectives: a send or recv that meets any other call fails on every rank
 * involved, at once and naming both calls, on both transports; an unmatched
 * send is reported at the next collective at the latest; and matched
 * send/recv interleaved with collectives still gives the right values.
 *
 * A case is one call per rank. A rank whose call returns OK (a send is
 * eager: it completes when its data is handed over) then calls barrier, and
 * that must fail: so every rank fails, with the message the case names,
 * well before the groups' timeout (5 s here; each failure must come within
 * 2 s, so a failure found only by the timeout fails the test). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"

typedef enum op_kind {
    OP_SEND = 1,
    OP_RECV,
    OP_ALL_REDUCE,
    OP_BROADCAST,
    OP_ALL_GATHER,
    OP_REDUCE_SCATTER,
    OP_GATHER,
    OP_BARRIER
} op_kind;

typedef struct op {
    op_kind kind;
    int peer; /* send: dst; recv: src */
    em_dtype dt;
    int64_t n;
} op;

typedef struct mcase {
    char name[400];
    int world;
    op calls[3];         /* rank r's call */
    const char *want[2]; /* every rank's failure message holds both */
    em_transport tr;
} mcase;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs o on rank `rank`; its tensors hold rank + 1 everywhere. */
static em_status run_op(em_pg *pg, int rank, int world, const op *o)
{
    int64_t n = o->n ? o->n : 4, wn = n * world;
    em_dtype dt = o->dt ? o->dt : EM_F32;
    em_tensor *t = em_full(dt, 1, &n, rank + 1.0), *big = em_full(dt, 1, &wn, rank + 1.0);
    em_status s = EM_OK;
    switch (o->kind) {
    case OP_SEND: s = em_send(pg, t, o->peer, NULL); break;
    case OP_RECV: s = em_recv(pg, t, o->peer, NULL); break;
    case OP_ALL_REDUCE: s = em_all_reduce(pg, t, EM_RED_SUM, NULL); break;
    case OP_BROADCAST: s = em_broadcast(pg, t, 0, NULL); break;
    case OP_ALL_GATHER: s = em_all_gather(pg, big, t, NULL); break;
    case OP_REDUCE_SCATTER: s = em_reduce_scatter(pg, t, big, EM_RED_SUM, NULL); break;
    case OP_GATHER: s = em_gather(pg, big, t, 0, NULL); break;
    case OP_BARRIER: s = em_barrier(pg, NULL); break;
    }
    em_free(t);
    em_free(big);
    return s;
}

static const char *tr_name(em_transport tr) { return tr == EM_TRANSPORT_TCP ? "tcp" : "shm"; }

static void case_rank(em_pg *pg, int rank, int world, void *ctx)
{
    const mcase *k = ctx;
    double t0 = now();
    em_status s = run_op(pg, rank, world, &k->calls[rank]);
    const char *what = "its call";
    if (s == EM_OK) { /* an eager send (or a call that met one): the next call must fail */
        what = "the barrier after its call";
        s = em_barrier(pg, NULL);
    }
    double took = now() - t0;
    const char *msg = em_last_error();
    if (s != EM_ERR_DIST)
        th_fail(__FILE__, __LINE__, "case '%s' (%s), rank %d: %s returned %s, want EM_ERR_DIST: %s", k->name,
                tr_name(k->tr), rank, what, em_status_name(s), msg);
    for (int i = 0; i < 2; i++)
        if (k->want[i] && !strstr(msg, k->want[i]))
            th_fail(__FILE__, __LINE__, "case '%s' (%s), rank %d: the message of %s lacks \"%s\": %s",
                    k->name, tr_name(k->tr), rank, what, k->want[i], msg);
    if (took > 2.0)
        th_fail(__FILE__, __LINE__,
                "case '%s' (%s), rank %d: failing took %.2f s (the timeout, not a check?): %s", k->name,
                tr_name(k->tr), rank, took, msg);
}

static void run_case(mcase *k, em_transport tr)
{
    k->tr = tr;
    th_ranks_timeout = 5;
    th_ranks(__FILE__, __LINE__, k->world, tr, case_rank, k);
}

/* "rank 0 called send(f32, 4 elements, to rank 1)" etc. */
static void describe(int rank, const op *o, int world, char *buf, size_t n)
{
    static const char *names[] = {"",           "send",           "recv",   "all_reduce", "broadcast",
                                  "all_gather", "reduce_scatter", "gather", "barrier"};
    long long cnt = o->kind == OP_REDUCE_SCATTER ? 4LL * world : 4;
    switch (o->kind) {
    case OP_SEND: snprintf(buf, n, "rank %d called send(f32, 4 elements, to rank %d)", rank, o->peer); break;
    case OP_RECV:
        snprintf(buf, n, "rank %d called recv(f32, 4 elements, from rank %d)", rank, o->peer);
        break;
    case OP_ALL_REDUCE:
    case OP_REDUCE_SCATTER:
        snprintf(buf, n, "rank %d called %s(f32, %lld elements, sum)", rank, names[o->kind], cnt);
        break;
    case OP_BROADCAST:
    case OP_GATHER:
        snprintf(buf, n, "rank %d called %s(f32, 4 elements, root 0)", rank, names[o->kind]);
        break;
    case OP_ALL_GATHER: snprintf(buf, n, "rank %d called all_gather(f32, 4 elements)", rank); break;
    case OP_BARRIER: snprintf(buf, n, "rank %d called barrier()", rank); break;
    }
}

/* send or recv on one rank against each collective on the other, both ways round */
static void p2p_against_collectives(em_transport tr)
{
    static const op_kind colls[] = {OP_ALL_REDUCE,     OP_BROADCAST, OP_ALL_GATHER,
                                    OP_REDUCE_SCATTER, OP_GATHER,    OP_BARRIER};
    for (int p2p = OP_SEND; p2p <= OP_RECV; p2p++)
        for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++)
            for (int who = 0; who < 2; who++) { /* the rank calling send/recv */
                static char w0[160], w1[160];
                mcase k = {.world = 2};
                k.calls[who] = (op){.kind = (op_kind)p2p, .peer = 1 - who};
                k.calls[1 - who] = (op){.kind = colls[i]};
                describe(0, &k.calls[0], 2, w0, sizeof w0);
                describe(1, &k.calls[1], 2, w1, sizeof w1);
                snprintf(k.name, sizeof k.name, "%s vs %s", w0 + 14, w1 + 14);
                k.want[0] = w0;
                k.want[1] = w1;
                run_case(&k, tr);
            }
}

TEST(test_send_or_recv_against_any_collective_fails_on_both_ranks_tcp)
{
    p2p_against_collectives(EM_TRANSPORT_TCP);
}
TEST(test_send_or_recv_against_any_collective_fails_on_both_ranks_shm)
{
    p2p_against_collectives(EM_TRANSPORT_SHM);
}

/* Both ranks wait in recv for the other: each has announced its recv to the other. */
static void recv_against_recv(em_transport tr)
{
    mcase k = {.name = "recv vs recv",
               .world = 2,
               .calls = {{.kind = OP_RECV, .peer = 1}, {.kind = OP_RECV, .peer = 0}},
               .want = {"rank 0 called recv(f32, 4 elements, from rank 1)",
                        "rank 1 called recv(f32, 4 elements, from rank 0)"}};
    run_case(&k, tr);
}

TEST(test_recv_against_recv_fails_on_both_ranks_at_once_tcp) { recv_against_recv(EM_TRANSPORT_TCP); }
TEST(test_recv_against_recv_fails_on_both_ranks_at_once_shm) { recv_against_recv(EM_TRANSPORT_SHM); }

/* Both send (eagerly: each returns), then both call barrier, which cannot
 * be the recv the other's send needs: the barrier fails naming the sends. */
static void send_against_send(em_transport tr)
{
    mcase k = {.name = "send vs send, then barrier",
               .world = 2,
               .calls = {{.kind = OP_SEND, .peer = 1}, {.kind = OP_SEND, .peer = 0}},
               .want = {"called send(f32, 4 elements, to rank ", "called barrier()"}};
    run_case(&k, tr);
}

TEST(test_send_against_send_fails_at_the_next_collective_tcp) { send_against_send(EM_TRANSPORT_TCP); }
TEST(test_send_against_send_fails_at_the_next_collective_shm) { send_against_send(EM_TRANSPORT_SHM); }

/* send and recv that disagree on dtype or element count, either order */
static void send_recv_disagree(em_transport tr)
{
    mcase ks[] = {
        {.name = "send f32 vs recv f64",
         .calls = {{.kind = OP_SEND, .peer = 1}, {.kind = OP_RECV, .peer = 0, .dt = EM_F64}},
         .want = {"rank 0 called send(f32, 4 elements, to rank 1)",
                  "rank 1 called recv(f64, 4 elements, from rank 0)"}},
        {.name = "recv f32 vs send f64",
         .calls = {{.kind = OP_RECV, .peer = 1}, {.kind = OP_SEND, .peer = 0, .dt = EM_F64}},
         .want = {"rank 0 called recv(f32, 4 elements, from rank 1)",
                  "rank 1 called send(f64, 4 elements, to rank 0)"}},
        {.name = "send 4 vs recv 5 elements",
         .calls = {{.kind = OP_SEND, .peer = 1}, {.kind = OP_RECV, .peer = 0, .n = 5}},
         .want = {"rank 0 called send(f32, 4 elements, to rank 1)",
                  "rank 1 called recv(f32, 5 elements, from rank 0)"}},
        {.name = "recv 5 vs send 4 elements",
         .calls = {{.kind = OP_RECV, .peer = 1, .n = 5}, {.kind = OP_SEND, .peer = 0}},
         .want = {"rank 0 called recv(f32, 5 elements, from rank 1)",
                  "rank 1 called send(f32, 4 elements, to rank 0)"}},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        ks[i].world = 2;
        run_case(&ks[i], tr);
    }
}

TEST(test_send_recv_with_different_dtype_or_count_fails_on_both_ranks_tcp)
{
    send_recv_disagree(EM_TRANSPORT_TCP);
}
TEST(test_send_recv_with_different_dtype_or_count_fails_on_both_ranks_shm)
{
    send_recv_disagree(EM_TRANSPORT_SHM);
}

/* Three ranks, the wrong peer: rank 1 waits for rank 2, which calls
 * barrier; rank 0's send to rank 1 completes, and its barrier fails too. */
static void wrong_peer(em_transport tr)
{
    mcase k = {.name = "recv from the wrong peer",
               .world = 3,
               .calls = {{.kind = OP_SEND, .peer = 1}, {.kind = OP_RECV, .peer = 2}, {.kind = OP_BARRIER}},
               .want = {"rank 1 called recv(f32, 4 elements, from rank 2)", "rank 2 called barrier()"}};
    run_case(&k, tr);
}

TEST(test_recv_from_the_wrong_peer_fails_on_every_rank_tcp) { wrong_peer(EM_TRANSPORT_TCP); }
TEST(test_recv_from_the_wrong_peer_fails_on_every_rank_shm) { wrong_peer(EM_TRANSPORT_SHM); }

/* The case: rank 0 sends to rank 1 and then calls all_reduce;
 * rank 1 only calls all_reduce. Neither all_reduce may return a value (rank
 * 0's send may fail already, when rank 1's header reaches it first). */
static void unreceived(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    int64_t n = 4;
    em_tensor *t = em_full(EM_F32, 1, &n, rank + 1.0);
    double t0 = now();
    em_status s = rank == 0 ? em_send(pg, t, 1, NULL) : EM_OK;
    if (!s) s = em_all_reduce(pg, t, EM_RED_SUM, NULL);
    if (s != EM_ERR_DIST)
        th_fail(__FILE__, __LINE__, "rank %d: all_reduce returned %s with t[0] = %g: %s", rank,
                em_status_name(s), ((float *)em_data(t))[0], em_last_error());
    CHECK(strstr(em_last_error(), "rank 0 called send(f32, 4 elements, to rank 1)") != NULL);
    CHECK(strstr(em_last_error(), "rank 1 called all_reduce(f32, 4 elements, sum)") != NULL);
    CHECK(now() - t0 < 2.0);
    em_free(t);
}

TEST(test_an_unreceived_send_fails_the_next_collective_on_every_rank)
{
    th_ranks_timeout = 5;
    TH_RANKS(2, EM_TRANSPORT_TCP, unreceived, NULL);
    th_ranks_timeout = 5;
    TH_RANKS(2, EM_TRANSPORT_SHM, unreceived, NULL);
}

/* ---- matched calls still work -------------------------------------------------- */

static float first(em_tensor *t) { return ((float *)em_data(t))[0]; }

/* Three ranks: send/recv in a ring (async), one to many, both ways at once
 * (each sends before it receives), interleaved with collectives, sync and
 * queued; every value checked. */
static void interleaved(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    int64_t n = 1000, wn = n * world;
    int right = (rank + 1) % world, left = (rank + world - 1) % world;
    for (int it = 0; it < 3; it++) {
        em_scope sc = em_scope_begin();
        em_tensor *tx = em_full(EM_F32, 1, &n, rank + 10.0 * it), *rx = em_zeros(EM_F32, 1, &n);
        em_work *w1, *w2, *w3;
        CHECK_OK(em_send(pg, tx, right, &w1));
        CHECK_OK(em_recv(pg, rx, left, &w2));
        CHECK_OK(em_work_wait(w1));
        CHECK_OK(em_work_wait(w2));
        CHECK(first(rx) == left + 10.0f * it);
        em_tensor *a = em_full(EM_F32, 1, &n, rank + 1.0);
        CHECK_OK(em_all_reduce(pg, a, EM_RED_SUM, NULL));
        CHECK(first(a) == world * (world + 1) / 2.0f);
        /* rank 0 to every other rank, then a broadcast */
        em_tensor *m = em_full(EM_F64, 1, &n, rank == 0 ? 7.0 + it : 0.0);
        if (rank == 0)
            for (int r = 1; r < world; r++) CHECK_OK(em_send(pg, m, r, NULL));
        else
            CHECK_OK(em_recv(pg, m, 0, NULL));
        CHECK(((double *)em_data(m))[n - 1] == 7.0 + it);
        em_tensor *b = em_full(EM_F32, 1, &n, rank == 1 ? 5.0 : 0.0);
        CHECK_OK(em_broadcast(pg, b, 1, NULL));
        CHECK(first(b) == 5.0f);
        /* ranks 0 and 1 each send first, then receive (sends are eager) */
        if (rank < 2) {
            em_tensor *mine = em_full(EM_I32, 1, &n, 100 + rank), *theirs = em_zeros(EM_I32, 1, &n);
            CHECK_OK(em_send(pg, mine, 1 - rank, NULL));
            CHECK_OK(em_recv(pg, theirs, 1 - rank, NULL));
            CHECK(((int32_t *)em_data(theirs))[n - 1] == 100 + (1 - rank));
        }
        /* queued: a collective, a ring step, another collective */
        em_tensor *c1 = em_full(EM_F32, 1, &n, 1.0), *g = em_zeros(EM_F32, 1, &wn);
        em_tensor *tx2 = em_full(EM_F32, 1, &n, rank * 3.0), *rx2 = em_zeros(EM_F32, 1, &n);
        em_work *w4, *w5;
        CHECK_OK(em_all_reduce(pg, c1, EM_RED_SUM, &w1));
        CHECK_OK(em_send(pg, tx2, left, &w2));
        CHECK_OK(em_recv(pg, rx2, right, &w3));
        CHECK_OK(em_all_gather(pg, g, tx2, &w4));
        CHECK_OK(em_barrier(pg, &w5));
        CHECK_OK(em_work_wait(w5));
        CHECK_OK(em_work_wait(w4));
        CHECK_OK(em_work_wait(w3));
        CHECK_OK(em_work_wait(w2));
        CHECK_OK(em_work_wait(w1));
        CHECK(first(c1) == (float)world);
        CHECK(first(rx2) == right * 3.0f);
        for (int r = 0; r < world; r++) CHECK(((float *)em_data(g))[r * n] == r * 3.0f);
        em_scope_end(sc);
    }
}

TEST(test_matched_send_recv_interleaved_with_collectives_work_tcp)
{
    TH_RANKS(3, EM_TRANSPORT_TCP, interleaved, NULL);
}
TEST(test_matched_send_recv_interleaved_with_collectives_work_shm)
{
    TH_RANKS(3, EM_TRANSPORT_SHM, interleaved, NULL);
}

/* Rank 0 sends to rank 1 once rank 1 waits in its recv (rank 0 spins
 * first), then at once makes its next call: an all_reduce, or a recv from
 * rank 1, which sends back after its recv. Neither is a mismatch, however
 * the frames' arrival meets the recv's look for one (the MPI transport once
 * called them one: tests/test_mpi.c's late-send). */
static void late_send(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    int64_t n = 16;
    em_tensor *t = em_zeros(EM_F32, 1, &n);
    for (int k = 0; k < 300; k++) {
        bool back = k % 2;
        if (rank == 0) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            do clock_gettime(CLOCK_MONOTONIC, &b);
            while ((b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) * 1e-3 < 50 + 10 * (k % 7));
            CHECK_OK(em_send(pg, t, 1, NULL));
            if (back) CHECK_OK(em_recv(pg, t, 1, NULL));
        } else {
            CHECK_OK(em_recv(pg, t, 0, NULL));
            if (back) CHECK_OK(em_send(pg, t, 0, NULL));
        }
        if (!back) CHECK_OK(em_all_reduce(pg, t, EM_RED_MAX, NULL));
    }
    em_free(t);
}

TEST(test_recv_whose_send_comes_just_before_the_senders_next_call_succeeds_tcp)
{
    TH_RANKS(2, EM_TRANSPORT_TCP, late_send, NULL);
}
TEST(test_recv_whose_send_comes_just_before_the_senders_next_call_succeeds_shm)
{
    TH_RANKS(2, EM_TRANSPORT_SHM, late_send, NULL);
}

/* Rank 1 sends two messages and exits (its sends done: they are eager)
 * without reading rank 0's announcement of the first recv, which arrives
 * while it sleeps: its close then resets the connection. Rank 0 takes the
 * second message after that: the announcement it writes fails, and the
 * message, already in its socket, must still be received. */
static void send_then_exit(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    int64_t n = 4;
    em_tensor *t = em_zeros(EM_F32, 1, &n);
    float *v = em_data(t);
    if (rank == 1) {
        for (int k = 1; k <= 2; k++) {
            v[0] = (float)k;
            CHECK_OK(em_send(pg, t, 0, NULL));
        }
        usleep(200000);
    } else {
        usleep(50000);
        CHECK_OK(em_recv(pg, t, 1, NULL));
        CHECK(v[0] == 1.0f);
        usleep(350000); /* rank 1 has exited by now */
        CHECK_OK(em_recv(pg, t, 1, NULL));
        CHECK(v[0] == 2.0f);
    }
    em_free(t);
}

TEST(test_a_message_sent_before_its_sender_exited_is_received_tcp)
{
    TH_RANKS(2, EM_TRANSPORT_TCP, send_then_exit, NULL);
}
TEST(test_a_message_sent_before_its_sender_exited_is_received_shm)
{
    TH_RANKS(2, EM_TRANSPORT_SHM, send_then_exit, NULL);
}

/* Rank 1 sends a small message and then 10 MB, and exits at once: its last
 * bytes are still queued in its socket (rank 0 is not reading yet). Rank 0
 * then announces its recvs: an announcement reaching a closed socket
 * resets the connection, which would throw the queued bytes away, so the
 * sender's em_pg_free waits until they are delivered. */
static void large_send_then_exit(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    int64_t one = 1, n = 10 << 18; /* 10 MiB of f32 */
    em_tensor *a = em_full(EM_F32, 1, &one, 7.0), *b = em_full(EM_F32, 1, &n, rank == 1 ? 5.0 : 0.0);
    if (rank == 1) {
        CHECK_OK(em_send(pg, a, 0, NULL));
        CHECK_OK(em_send(pg, b, 0, NULL));
    } else {
        usleep(200000);
        ((float *)em_data(a))[0] = 0;
        CHECK_OK(em_recv(pg, a, 1, NULL));
        CHECK_OK(em_recv(pg, b, 1, NULL));
        CHECK(((float *)em_data(a))[0] == 7.0f && ((float *)em_data(b))[n - 1] == 5.0f);
    }
    em_free(a);
    em_free(b);
}

TEST(test_a_large_message_sent_right_before_its_sender_exited_is_received)
{
    TH_RANKS(2, EM_TRANSPORT_TCP, large_send_then_exit, NULL);
    TH_RANKS(2, EM_TRANSPORT_SHM, large_send_then_exit, NULL);
}

/* Two ranks each send the other 24 MB, more than the connection buffers
 * hold, before either receives: both sends complete, then both recvs. */
static void both_ways_large(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    int64_t n = 6 << 20;
    em_tensor *tx = em_full(EM_F32, 1, &n, rank + 1.0), *rx = em_zeros(EM_F32, 1, &n);
    CHECK_OK(em_send(pg, tx, 1 - rank, NULL));
    CHECK_OK(em_recv(pg, rx, 1 - rank, NULL));
    CHECK(((float *)em_data(rx))[0] == 2.0f - rank && ((float *)em_data(rx))[n - 1] == 2.0f - rank);
    CHECK_OK(em_all_reduce(pg, tx, EM_RED_SUM, NULL));
    CHECK(((float *)em_data(tx))[n - 1] == 3.0f);
    em_free(tx);
    em_free(rx);
}

TEST(test_large_sends_both_ways_at_once_complete)
{
    th_ranks_timeout = 5;
    TH_RANKS(2, EM_TRANSPORT_TCP, both_ways_large, NULL);
    th_ranks_timeout = 5;
    TH_RANKS(2, EM_TRANSPORT_SHM, both_ways_large, NULL);
}
