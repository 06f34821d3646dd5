/* test_pg_join.c — joining process groups: a second group (or Accelerator)
 * in one process, one after another or alive at once, meets under its own
 * store keys; a join that cannot complete fails as soon as the store knows
 * (a rank's process exited, its store connection closed, the ranks disagree
 * about the group), naming the rank, well before the timeout; and the
 * Accelerator hands its timeout to the group in the group's config, leaving
 * the environment alone. The store's two requests the join waits with
 * (on-close keys, wait-for-any) are tested first. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist_impl.h"
#include "dist_util.h"
#include "harness.h"

#define TOKEN "test-token-0123456789abcdef"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the store: on-close keys and wait-for-any ------------------------------------ */

TEST(test_store_on_close_key_appears_when_the_connection_closes)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    CHECK_NOTNULL(srv);
    int port = em_store_server_port(srv);
    em_store *watcher = em_store_connect("127.0.0.1", port, TOKEN, 5);
    em_store *leaver = em_store_connect("127.0.0.1", port, TOKEN, 5);
    CHECK(watcher && leaver);
    CHECK_OK(dist_store_on_close(leaver, "g/gone/1", "bye", 3));
    bool exists = true;
    CHECK_OK(dist_store_check(watcher, "g/gone/1", &exists));
    CHECK(!exists); /* not while the connection lives */
    em_store_close(leaver);
    const char *keys[] = {"g/addr/1", "g/gone/1"};
    int idx = -1;
    double t0 = now_s();
    CHECK_OK(dist_store_wait_any(watcher, 2, keys, 5, &idx));
    CHECK(idx == 1);
    CHECK(now_s() - t0 < 2);
    void *v = NULL;
    size_t n = 0;
    CHECK_OK(em_store_get(watcher, "g/gone/1", &v, &n));
    CHECK(n == 3 && !memcmp(v, "bye", 3));
    free(v);
    em_store_close(watcher);
    em_store_server_stop(srv);
}

TEST(test_store_wait_any_returns_the_first_key_that_exists_or_times_out)
{
    em_store_server *srv = em_store_server_start(NULL, 0, TOKEN);
    CHECK_NOTNULL(srv);
    em_store *c = em_store_connect("127.0.0.1", em_store_server_port(srv), TOKEN, 5);
    CHECK_NOTNULL(c);
    const char *keys[] = {"a", "b", "c"};
    int idx = 7;
    CHECK_OK(dist_store_wait_any(c, 3, keys, 0, &idx)); /* only looks */
    CHECK(idx == -1);
    CHECK_OK(em_store_set(c, "c", "1", 1));
    CHECK_OK(em_store_set(c, "b", "1", 1));
    CHECK_OK(dist_store_wait_any(c, 3, keys, 1, &idx));
    CHECK(idx == 1);
    const char *none[] = {"x"};
    CHECK_ERR(dist_store_wait_any(c, 1, none, 0.2, &idx), EM_ERR_TIMEOUT, "'x'");
    em_store_close(c);
    em_store_server_stop(srv);
}

/* ---- a second group in one process --------------------------------------------------- */

/* One all_reduce of (rank + 1): checks the group works. */
static void sum_check(em_pg *pg, int world)
{
    int64_t n = 3;
    em_tensor *t = em_full(EM_F32, 1, &n, em_pg_rank(pg) + 1.0);
    CHECK_OK(em_all_reduce(pg, t, EM_RED_SUM, NULL));
    CHECK(((float *)em_data(t))[0] == (float)(world * (world + 1) / 2));
    em_free(t);
}

static void two_in_sequence(int rank, int world, void *ctx)
{
    (void)ctx;
    setenv("EMBER_TIMEOUT", "8", 1); /* before the fix the second join waited this long */
    for (int i = 0; i < 2; i++) {
        if (rank == 0) usleep(200 * 1000); /* rank 1 reaches the store first, as happens */
        em_pg *pg = em_pg_from_env();
        CHECK_NOTNULL(pg);
        sum_check(pg, world);
        em_pg_free(pg);
    }
}

TEST(test_two_groups_from_env_one_after_another_both_work) { TH_RANKS_ENV(2, two_in_sequence, NULL); }

static void two_at_once(int rank, int world, void *ctx)
{
    (void)rank;
    (void)ctx;
    setenv("EMBER_TIMEOUT", "8", 1);
    em_pg *a = em_pg_from_env();
    CHECK_NOTNULL(a);
    em_pg *b = em_pg_from_env();
    CHECK_NOTNULL(b);
    sum_check(b, world);
    sum_check(a, world);
    em_pg_free(a);
    sum_check(b, world);
    em_pg_free(b);
}

TEST(test_two_groups_from_env_alive_at_once_both_work) { TH_RANKS_ENV(2, two_at_once, NULL); }

static void same_name_twice(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    for (int i = 0; i < 2; i++) {
        if (rank == 0) usleep(200 * 1000); /* rank 1 reaches the store first, as happens */
        em_pg *g = em_pg_new(&(em_pg_config){.rank = rank,
                                             .world = world,
                                             .store = em_pg_store(pg),
                                             .name = "again",
                                             .timeout_s = 5,
                                             .transport = EM_TRANSPORT_TCP});
        CHECK_NOTNULL(g);
        sum_check(g, world);
        em_pg_free(g);
    }
}

TEST(test_pg_new_twice_under_one_name_on_one_store_works)
{
    TH_RANKS(2, EM_TRANSPORT_TCP, same_name_twice, NULL);
}

static void two_accelerators(int rank, int world, void *ctx)
{
    (void)ctx;
    th_no_user_config();
    for (int i = 0; i < 2; i++) {
        if (rank == 0) usleep(200 * 1000); /* rank 1 reaches the store first, as happens */
        em_accelerator *a = em_accelerator_new(&(em_accel_config){.timeout_s = 5});
        CHECK_NOTNULL(a);
        CHECK(em_accel_world(a) == world);
        sum_check(em_accel_pg(a), world);
        CHECK_OK(em_accel_wait_for_everyone(a));
        em_accelerator_free(a);
    }
}

TEST(test_two_accelerators_one_after_another_both_work) { TH_RANKS_ENV(2, two_accelerators, NULL); }

/* ---- a join that cannot complete fails at once, naming the rank ---------------------- */

static void one_never_joins(int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    if (rank == 1) _exit(0); /* leaves before joining, without an error */
    setenv("EMBER_TIMEOUT", "10", 1);
    double t0 = now_s();
    CHECK_ERR(em_pg_from_env(), EM_ERR_DIST, "rank 1 will not join");
    CHECK(strstr(em_last_error(), "exited with status 0") != NULL);
    CHECK(now_s() - t0 < 4); /* not the 10 s timeout */
}

TEST(test_a_rank_that_exits_before_joining_fails_the_join_at_once_naming_it)
{
    TH_RANKS_ENV(2, one_never_joins, NULL);
}

static void disagree_on_world(int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    setenv("EMBER_TIMEOUT", "10", 1);
    if (rank == 1) setenv("WORLD_SIZE", "3", 1); /* thinks it joins a group of 3 */
    double t0 = now_s();
    em_pg *pg = em_pg_from_env();
    CHECK(pg == NULL);
    if (rank == 1) {
        CHECK(strstr(em_last_error(), "rank 1 joins group") != NULL);
        CHECK(strstr(em_last_error(), "rank 0 as one of 2") != NULL);
    } else {
        CHECK(em_last_status() == EM_ERR_DIST);
        CHECK(strstr(em_last_error(), "rank 1 will not join") != NULL);
    }
    CHECK(now_s() - t0 < 4);
}

TEST(test_ranks_disagreeing_about_the_world_size_fail_at_once_naming_each_other)
{
    TH_RANKS_ENV(2, disagree_on_world, NULL);
}

/* ---- the timeout reaches the group through its config -------------------------------- */

TEST(test_accelerator_timeout_reaches_the_group_and_leaves_the_environment_alone)
{
    th_no_user_config();
    unsetenv("WORLD_SIZE");
    unsetenv("EMBER_TIMEOUT");
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.timeout_s = 7});
    CHECK_NOTNULL(a);
    CHECK(getenv("EMBER_TIMEOUT") == NULL);
    CHECK(em_pg_timeout(em_accel_pg(a)) == 7);
    em_accelerator_free(a);
    setenv("EMBER_TIMEOUT", "30", 1);
    a = em_accelerator_new(&(em_accel_config){.timeout_s = 7});
    CHECK_NOTNULL(a);
    CHECK(!strcmp(getenv("EMBER_TIMEOUT"), "30"));
    CHECK(em_pg_timeout(em_accel_pg(a)) == 7);
    em_accelerator_free(a);
    a = em_accelerator_new(NULL); /* no timeout in code: the environment's */
    CHECK_NOTNULL(a);
    CHECK(em_pg_timeout(em_accel_pg(a)) == 30);
    em_accelerator_free(a);
    unsetenv("EMBER_TIMEOUT");
}

TEST(test_pg_from_env_with_takes_the_timeout_over_the_environment)
{
    unsetenv("WORLD_SIZE");
    setenv("EMBER_TIMEOUT", "30", 1);
    em_pg *pg = em_pg_from_env_with(&(em_pg_env_config){.timeout_s = 3});
    CHECK_NOTNULL(pg);
    CHECK(em_pg_timeout(pg) == 3);
    em_pg_free(pg);
    pg = em_pg_from_env_with(NULL);
    CHECK_NOTNULL(pg);
    CHECK(em_pg_timeout(pg) == 30);
    em_pg_free(pg);
    CHECK_ERR(em_pg_from_env_with(&(em_pg_env_config){.timeout_s = -1}), EM_ERR_ARG, "timeout_s -1");
    unsetenv("EMBER_TIMEOUT");
}
