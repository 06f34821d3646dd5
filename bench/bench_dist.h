/* bench_dist.h — what the distributed benchmarks share: forking `world`
 * ranks on this machine around a rendezvous store the parent hosts, each
 * joining a process group, as `ember launch` would arrange. Header-only. */
#ifndef EMBER_BENCH_DIST_H
#define EMBER_BENCH_DIST_H

#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ember/ember.h"

/* When set, bench_ranks binds rank r to CPU r (mod the CPU count), as
 * mpirun binds each of up to 2 ranks to a core by default. */
static bool bench_pin_ranks;

/* A rank's body: returns 0 on success. */
typedef int (*bench_rank_fn)(em_pg *pg, void *ctx);

/* Runs fn as ranks 0..world-1 (forked children) in one group with transport
 * tr and group name `name`. Returns 0 when every rank returned 0. */
static inline int bench_ranks(int world, em_transport tr, const char *name, bench_rank_fn fn, void *ctx)
{
    static const char token[] = "bench-token-0123456789abcdef";
    em_store_server *srv = em_store_server_start(NULL, 0, token);
    if (!srv) {
        fprintf(stderr, "bench: cannot start a store: %s\n", em_last_error());
        return 1;
    }
    int port = em_store_server_port(srv);
    pid_t pids[64];
    fflush(stdout);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            if (bench_pin_ranks) {
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(r % (int)sysconf(_SC_NPROCESSORS_ONLN), &set);
                if (sched_setaffinity(0, sizeof set, &set)) fprintf(stderr, "bench: rank %d: cannot bind\n", r);
            }
            em_store *st = em_store_connect("127.0.0.1", port, token, 60);
            em_pg *pg = st ? em_pg_new(&(em_pg_config){.rank = r, .world = world, .store = st, .name = name,
                                                        .timeout_s = 120, .transport = tr})
                           : NULL;
            if (!pg) {
                fprintf(stderr, "bench: rank %d cannot join: %s\n", r, em_last_error());
                _exit(1);
            }
            int rc = fn(pg, ctx);
            em_pg_free(pg);
            em_store_close(st);
            fflush(stdout);
            _exit(rc);
        }
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
    }
    em_store_server_stop(srv);
    return bad;
}

#endif
