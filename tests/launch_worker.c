/* launch_worker.c — a worker for test_launch.c's end-to-end tests: joins the
 * store `ember launch` hosts, using only what the launcher put in the
 * environment (MASTER_ADDR, MASTER_PORT, EMBER_STORE_TOKEN, RANK,
 * WORLD_SIZE, EMBER_RESTART_COUNT), meets every other rank at a barrier and
 * checks that each rank published its own key. Prints "rank R of W ok" and
 * exits 0, or prints why and exits 1. With argument "fail-once", rank 1 of
 * restart 0 exits 3 before the barrier. With argument "group" it then also
 * joins the process group (em_pg_from_env) and prints the all_reduce sum of
 * rank + 1 and the transport; with "group-without-1", rank 1 exits 0 instead
 * of joining it (the others must fail at once, naming it). Not a test itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/dist.h"

static int env_int(const char *name)
{
    const char *v = getenv(name);
    if (!v) {
        fprintf(stderr, "launch_worker: %s is not set\n", name);
        exit(1);
    }
    return atoi(v);
}

int main(int argc, char **argv)
{
    int rank = env_int("RANK"), world = env_int("WORLD_SIZE"), port = env_int("MASTER_PORT");
    int restart = env_int("EMBER_RESTART_COUNT");
    const char *addr = getenv("MASTER_ADDR"), *token = getenv("EMBER_STORE_TOKEN");
    if (!addr || !token) {
        fprintf(stderr, "launch_worker: MASTER_ADDR or EMBER_STORE_TOKEN is not set\n");
        return 1;
    }
    if (argc > 1 && !strcmp(argv[1], "fail-once") && restart == 0 && rank == 1) return 3;
    em_store *s = em_store_connect(addr, port, token, 10.0);
    if (!s) {
        fprintf(stderr, "launch_worker: rank %d: %s\n", rank, em_last_error());
        return 1;
    }
    char key[64], name[64];
    snprintf(key, sizeof key, "attempt%d/rank%d", restart, rank);
    snprintf(name, sizeof name, "attempt%d", restart);
    em_status st = em_store_set(s, key, "x", 1);
    if (!st) st = em_store_barrier(s, name, world, 10.0);
    for (int r = 0; !st && r < world; r++) {
        snprintf(key, sizeof key, "attempt%d/rank%d", restart, r);
        const char *k = key;
        st = em_store_wait(s, 1, &k, 10.0);
    }
    if (st) {
        fprintf(stderr, "launch_worker: rank %d: %s\n", rank, em_last_error());
        em_store_close(s);
        return 1;
    }
    printf("rank %d of %d ok (restart %d)\n", rank, world, restart);
    em_store_close(s);
    if (argc > 1 && !strcmp(argv[1], "group-without-1") && rank == 1) return 0;
    if (argc > 1 && (!strcmp(argv[1], "group") || !strcmp(argv[1], "group-without-1"))) {
        em_pg *pg = em_pg_from_env();
        int64_t n = 1;
        em_tensor *t = pg ? em_full(EM_F32, 1, &n, rank + 1.0) : NULL;
        if (!t || em_all_reduce(pg, t, EM_RED_SUM, NULL)) {
            fprintf(stderr, "launch_worker: rank %d: %s\n", rank, em_last_error());
            return 1;
        }
        printf("rank %d sum %g over %s\n", rank, ((float *)em_data(t))[0],
               em_pg_transport(pg) == EM_TRANSPORT_SHM ? "shm" : "tcp");
        em_free(t);
        em_pg_free(pg);
    }
    return 0;
}
