/* test_collectives.c — every collective on every dtype for world sizes 1 to
 * 4 (oversubscribed on 2 cores), odd sizes and sizes the world does not
 * divide, both message-size algorithms; and the failure cases: a mismatched
 * call fails on every rank naming both calls, a killed peer makes the others
 * fail (not hang), a stray connection is refused, a broken group fails fast. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"

static const em_dtype dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32};

/* value of element i on rank r: small integers, exact in every dtype */
static double val(int r, int64_t i) { return (double)((r * 7 + i * 3) % 17) - 5; }

static em_tensor *filled(em_dtype dt, int64_t n, int r)
{
    em_tensor *t = em_empty(dt, 1, &n);
    for (int64_t i = 0; i < n; i++) {
        double v = val(r, i);
        void *p = em_data(t);
        switch (dt) {
        case EM_F32: ((float *)p)[i] = (float)v; break;
        case EM_F64: ((double *)p)[i] = v; break;
        case EM_F16: ((uint16_t *)p)[i] = em_f32_to_f16((float)v); break;
        case EM_BF16: ((uint16_t *)p)[i] = em_f32_to_bf16((float)v); break;
        default: ((int32_t *)p)[i] = (int32_t)v;
        }
    }
    return t;
}

static double at(em_tensor *t, int64_t i) { return em_item(em_narrow(t, 0, i, 1)); }

static void check_all(em_pg *pg, int rank, int world, int64_t n)
{
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        em_dtype dt = dtypes[d];
        em_scope s = em_scope_begin();
        int64_t probe[] = {0, n / 2, n - 1};
        /* all_reduce: sum, avg, max, min */
        for (int op = EM_RED_SUM; op <= EM_RED_MIN; op++) {
            em_tensor *t = filled(dt, n, rank);
            CHECK_OK(em_all_reduce(pg, t, (em_reduce_op)op, NULL));
            for (int k = 0; k < 3; k++) {
                int64_t i = probe[k];
                double sum = 0, mx = -1e9, mn = 1e9;
                for (int r = 0; r < world; r++) {
                    sum += val(r, i);
                    mx = val(r, i) > mx ? val(r, i) : mx;
                    mn = val(r, i) < mn ? val(r, i) : mn;
                }
                double want = op == EM_RED_SUM ? sum : op == EM_RED_MAX ? mx : op == EM_RED_MIN ? mn
                              : dt == EM_I32 ? (double)((long)sum / world) : sum / world;
                double tol = dt == EM_F16 || dt == EM_BF16 ? fabs(want) * 1e-2 : 1e-6;
                if (!(fabs(at(t, i) - want) <= tol))
                    th_fail(__FILE__, __LINE__, "all_reduce op %d %s n=%lld world %d: [%lld] = %g, want %g", op,
                            em_dtype_name(dt), (long long)n, world, (long long)i, at(t, i), want);
            }
        }
        /* broadcast from the last rank */
        em_tensor *b = filled(dt, n, rank);
        CHECK_OK(em_broadcast(pg, b, world - 1, NULL));
        CHECK(at(b, n - 1) == val(world - 1, n - 1));
        /* all_gather and gather to rank 0 */
        int64_t wn = world * n;
        em_tensor *all = em_zeros(dt, 1, &wn), *g = em_zeros(dt, 1, &wn);
        CHECK_OK(em_all_gather(pg, all, filled(dt, n, rank), NULL));
        CHECK_OK(em_gather(pg, rank == 0 ? g : NULL, filled(dt, n, rank), 0, NULL));
        for (int r = 0; r < world; r++) {
            CHECK(at(all, r * n + n - 1) == val(r, n - 1));
            if (rank == 0) CHECK(at(g, r * n) == val(r, 0));
        }
        /* reduce_scatter: chunk `rank` of the sum over ranks */
        em_tensor *out = em_zeros(dt, 1, &n);
        CHECK_OK(em_reduce_scatter(pg, out, filled(dt, wn, rank), EM_RED_SUM, NULL));
        for (int k = 0; k < 3; k++) {
            double sum = 0;
            for (int r = 0; r < world; r++) sum += val(r, rank * n + probe[k]);
            CHECK_NEAR(at(out, probe[k]), sum, dt == EM_F16 || dt == EM_BF16 ? fabs(sum) * 1e-2 : 1e-6);
        }
        /* send/recv around a ring, asynchronously */
        if (world > 1) {
            em_tensor *tx = filled(dt, n, rank), *rx = em_zeros(dt, 1, &n);
            em_work *w1, *w2;
            CHECK_OK(em_send(pg, tx, (rank + 1) % world, &w1));
            CHECK_OK(em_recv(pg, rx, (rank + world - 1) % world, &w2));
            CHECK_OK(em_work_wait(w1));
            CHECK_OK(em_work_wait(w2));
            CHECK(at(rx, n - 1) == val((rank + world - 1) % world, n - 1));
        }
        CHECK_OK(em_barrier(pg, NULL));
        em_scope_end(s);
    }
}

static void small_and_odd(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    check_all(pg, rank, world, 1);
    check_all(pg, rank, world, 7); /* odd, not divisible by 2, 3 or 4 */
}

/* 40001 elements: past the small-message limit for every dtype, so the ring */
static void large(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    check_all(pg, rank, world, 40001);
}

/* 300001 elements: several shared-memory pieces in every dtype, the last one short */
static void pieces(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    check_all(pg, rank, world, 300001);
}

TEST(test_collectives_every_op_and_dtype_world_1) { TH_RANKS(1, EM_TRANSPORT_AUTO, small_and_odd, NULL); }
TEST(test_collectives_every_op_and_dtype_world_2_tcp) { TH_RANKS(2, EM_TRANSPORT_TCP, small_and_odd, NULL); }
TEST(test_collectives_every_op_and_dtype_world_2_shm) { TH_RANKS(2, EM_TRANSPORT_SHM, small_and_odd, NULL); }
TEST(test_collectives_every_op_and_dtype_world_3_tcp) { TH_RANKS(3, EM_TRANSPORT_TCP, small_and_odd, NULL); }
TEST(test_collectives_every_op_and_dtype_world_3_shm) { TH_RANKS(3, EM_TRANSPORT_SHM, small_and_odd, NULL); }
TEST(test_collectives_every_op_and_dtype_world_4_tcp) { TH_RANKS(4, EM_TRANSPORT_TCP, small_and_odd, NULL); }
TEST(test_collectives_every_op_and_dtype_world_4_shm) { TH_RANKS(4, EM_TRANSPORT_SHM, small_and_odd, NULL); }
TEST(test_collectives_ring_sizes_world_2_tcp) { TH_RANKS(2, EM_TRANSPORT_TCP, large, NULL); }
TEST(test_collectives_ring_sizes_world_3_tcp) { TH_RANKS(3, EM_TRANSPORT_TCP, large, NULL); }
TEST(test_collectives_large_world_2_shm) { TH_RANKS(2, EM_TRANSPORT_SHM, large, NULL); }
TEST(test_collectives_many_pieces_world_2_shm) { TH_RANKS(2, EM_TRANSPORT_SHM, pieces, NULL); }
TEST(test_collectives_many_pieces_world_3_shm) { TH_RANKS(3, EM_TRANSPORT_SHM, pieces, NULL); }

static void expect_transport(em_pg *pg, int rank, int world, void *ctx)
{
    (void)rank;
    (void)world;
    CHECK(em_pg_transport(pg) == (em_transport)(intptr_t)ctx);
}

TEST(test_auto_transport_is_shared_memory_on_one_machine)
{
    TH_RANKS(2, EM_TRANSPORT_AUTO, expect_transport, (void *)(intptr_t)EM_TRANSPORT_SHM);
    TH_RANKS(3, EM_TRANSPORT_TCP, expect_transport, (void *)(intptr_t)EM_TRANSPORT_TCP);
    TH_RANKS(1, EM_TRANSPORT_SHM, expect_transport, (void *)(intptr_t)EM_TRANSPORT_TCP);
}

/* a 4 MB all_reduce gives bitwise the same bytes on every rank */
static void identical(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    int64_t n = 1 << 20;
    em_tensor *t = em_rand(EM_F32, 1, &n, &(em_rng){(uint64_t)rank + 1, 0});
    CHECK_OK(em_all_reduce(pg, t, EM_RED_AVG, NULL));
    em_tensor *r0 = em_copy(t);
    CHECK_OK(em_broadcast(pg, r0, 0, NULL));
    CHECK(memcmp(em_data(r0), em_data(t), (size_t)n * 4) == 0);
    (void)world;
    em_free(t);
    em_free(r0);
}

TEST(test_all_reduce_results_are_bitwise_identical_on_every_rank)
{
    TH_RANKS(3, EM_TRANSPORT_TCP, identical, NULL);
    TH_RANKS(3, EM_TRANSPORT_SHM, identical, NULL);
}

/* asynchronous calls complete in call order */
static void async_order(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    em_tensor *t[4];
    em_work *w[4];
    int64_t n = 100000;
    for (int i = 0; i < 4; i++) {
        t[i] = em_full(EM_F32, 1, &n, (double)(i + rank));
        CHECK_OK(em_all_reduce(pg, t[i], EM_RED_SUM, &w[i]));
    }
    for (int i = 3; i >= 0; i--) CHECK_OK(em_work_wait(w[i])); /* any waiting order */
    for (int i = 0; i < 4; i++) {
        CHECK(((float *)em_data(t[i]))[n - 1] == (float)(i * world + world * (world - 1) / 2));
        em_free(t[i]);
    }
}

TEST(test_async_collectives_complete_and_wait_in_any_order)
{
    TH_RANKS(2, EM_TRANSPORT_TCP, async_order, NULL);
    TH_RANKS(2, EM_TRANSPORT_SHM, async_order, NULL);
}

/* rank 1 calls broadcast while the others call all_reduce */
static void mismatch(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    int64_t n = 1024;
    em_tensor *t = em_zeros(EM_F32, 1, &n);
    em_status s = rank == 1 ? em_broadcast(pg, t, 0, NULL) : em_all_reduce(pg, t, EM_RED_SUM, NULL);
    CHECK(s == EM_ERR_DIST);
    CHECK(strstr(em_last_error(), "rank 1 called broadcast(f32, 1024 elements, root 0)") != NULL);
    CHECK(strstr(em_last_error(), "rank 0 called all_reduce(f32, 1024 elements, sum)") != NULL);
    /* the group is broken now: later calls fail at once */
    CHECK_ERR(em_barrier(pg, NULL), EM_ERR_DIST, "broken");
    em_free(t);
}

TEST(test_mismatched_collective_fails_on_every_rank_naming_both_calls)
{
    TH_RANKS(3, EM_TRANSPORT_TCP, mismatch, NULL);
    TH_RANKS(3, EM_TRANSPORT_SHM, mismatch, NULL);
}

static void dtype_mismatch(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    int64_t n = 5;
    em_tensor *t = em_zeros(rank == 0 ? EM_F32 : EM_F64, 1, &n);
    CHECK_ERR(em_all_reduce(pg, t, EM_RED_SUM, NULL), EM_ERR_DIST, "mismatch");
    em_free(t);
}

TEST(test_all_reduce_rejects_dtype_mismatch_between_ranks)
{
    TH_RANKS(2, EM_TRANSPORT_TCP, dtype_mismatch, NULL);
    TH_RANKS(2, EM_TRANSPORT_SHM, dtype_mismatch, NULL);
}

/* rank 1 dies; the others fail within moments, never hang */
static void peer_dies(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    if (rank == 1) _exit(0); /* gone without a word (its sockets close) */
    int64_t n = 10;
    em_tensor *t = em_zeros(EM_F32, 1, &n);
    em_status s = em_all_reduce(pg, t, EM_RED_SUM, NULL);
    CHECK(s == EM_ERR_DIST || s == EM_ERR_TIMEOUT);
    em_free(t);
}

TEST(test_a_dead_peer_makes_the_others_fail_not_hang)
{
    TH_RANKS(3, EM_TRANSPORT_TCP, peer_dies, NULL);
    TH_RANKS(3, EM_TRANSPORT_SHM, peer_dies, NULL);
}

/* one rank never calls: the others time out (1.5 s here) */
static void silent(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    if (rank == 1) {
        sleep(2);
        return;
    }
    em_status s = em_barrier(pg, NULL);
    CHECK(s == EM_ERR_TIMEOUT);
    CHECK(strstr(em_last_error(), "waited 1.5 s") != NULL);
}

TEST(test_a_collective_that_a_rank_never_joins_times_out)
{
    th_ranks_timeout = 1.5;
    TH_RANKS(2, EM_TRANSPORT_TCP, silent, NULL);
    th_ranks_timeout = 1.5;
    TH_RANKS(2, EM_TRANSPORT_SHM, silent, NULL);
}

/* Rank 1 first plays a stray peer: it reads rank 0's address from the store
 * and connects claiming to be rank 1 with a wrong secret. Rank 0 must close
 * that connection and still form the group with the real rank 1. */
static void forged_peer(int rank, int world, void *ctx)
{
    (void)ctx;
    if (rank == 1) {
        em_store *st = em_store_connect(getenv("MASTER_ADDR"), atoi(getenv("MASTER_PORT")),
                                        getenv("EMBER_STORE_TOKEN"), 10);
        CHECK_NOTNULL(st);
        char key[64], host[128];
        snprintf(key, sizeof key, "r%s/pg/0/addr/0", getenv("EMBER_RESTART_COUNT")); /* generation 0 */
        void *v = NULL;
        CHECK_OK(em_store_get(st, key, &v, NULL));
        int port = 0;
        CHECK(sscanf(v, "%127s %d", host, &port) == 2);
        free(v);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        CHECK(inet_pton(AF_INET, host, &a.sin_addr) == 1);
        CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
        struct {
            uint32_t magic;
            int32_t rank;
            uint8_t secret[16];
        } hello = {0x656d6267u, 1, "not-the-secret!"};
        CHECK(send(fd, &hello, sizeof hello, 0) == (ssize_t)sizeof hello);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        CHECK(poll(&p, 1, 5000) == 1);
        char b;
        CHECK(recv(fd, &b, 1, 0) == 0); /* closed on us */
        close(fd);
        em_store_close(st);
    }
    em_pg *pg = em_pg_from_env();
    CHECK_NOTNULL(pg);
    int64_t n = 3;
    em_tensor *t = em_full(EM_F32, 1, &n, rank + 1.0);
    CHECK_OK(em_all_reduce(pg, t, EM_RED_SUM, NULL));
    CHECK(((float *)em_data(t))[0] == (float)(world * (world + 1) / 2));
    em_free(t);
    em_pg_free(pg);
}

TEST(test_a_peer_without_the_groups_secret_is_refused) { TH_RANKS_ENV(2, forged_peer, NULL); }

TEST(test_collectives_reject_bad_arguments)
{
    em_pg *pg = em_pg_new(&(em_pg_config){.rank = 0, .world = 1});
    CHECK_NOTNULL(pg);
    int64_t n = 4, m = 3;
    em_tensor *a = em_zeros(EM_F32, 1, &n), *b = em_zeros(EM_F32, 1, &m), *u = em_zeros(EM_U8, 1, &n);
    CHECK_ERR(em_all_reduce(NULL, a, EM_RED_SUM, NULL), EM_ERR_ARG, "process group is NULL");
    CHECK_ERR(em_all_reduce(pg, NULL, EM_RED_SUM, NULL), EM_ERR_ARG, "tensor is NULL");
    CHECK_ERR(em_all_reduce(pg, u, EM_RED_SUM, NULL), EM_ERR_DTYPE, "u8");
    CHECK_ERR(em_broadcast(pg, a, 1, NULL), EM_ERR_ARG, "root 1 is outside [0, 1)");
    CHECK_ERR(em_all_gather(pg, b, a, NULL), EM_ERR_SHAPE, "needs world 1 x 4");
    em_tensor *tr = em_transpose(em_zeros(EM_F32, 2, (int64_t[]){2, 3}), 0, 1);
    CHECK_ERR(em_all_reduce(pg, tr, EM_RED_SUM, NULL), EM_ERR_ARG, "not contiguous");
    CHECK_ERR(em_pg_new(&(em_pg_config){.rank = 2, .world = 2}), EM_ERR_ARG, "rank 2 is outside");
    CHECK_ERR(em_pg_new(&(em_pg_config){.rank = 0, .world = 2}), EM_ERR_ARG, "needs a store");
    CHECK_ERR(em_pg_new(&(em_pg_config){.rank = 0, .world = 1, .transport = (em_transport)7}), EM_ERR_ARG,
              "transport 7 is not AUTO, TCP, SHM or MPI");
    em_pg_free(pg);
}

TEST(test_pg_from_env_without_world_size_is_a_group_of_one)
{
    unsetenv("WORLD_SIZE");
    em_pg *pg = em_pg_from_env();
    CHECK_NOTNULL(pg);
    CHECK(em_pg_world(pg) == 1 && em_pg_rank(pg) == 0);
    int64_t n = 3;
    em_tensor *t = em_full(EM_F32, 1, &n, 2.0);
    CHECK_OK(em_all_reduce(pg, t, EM_RED_AVG, NULL));
    CHECK(((float *)em_data(t))[2] == 2.0f);
    em_free(t);
    em_pg_free(pg);
}

TEST(test_pg_from_env_names_a_malformed_variable)
{
    setenv("WORLD_SIZE", "two", 1);
    CHECK_ERR(em_pg_from_env(), EM_ERR_ARG, "WORLD_SIZE='two'");
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "5", 1);
    CHECK_ERR(em_pg_from_env(), EM_ERR_ARG, "RANK='5'");
}
