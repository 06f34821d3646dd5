/* launch_impl.h — between `ember launch`'s two halves: cmd_launch.c (flags,
 * config file, environment, the store, restarts) and launch_group.c (one
 * attempt: start the node's workers, relay their output, watch them, stop
 * them). Internal to the ember tool. */
#ifndef EMBER_TOOLS_LAUNCH_IMPL_H
#define EMBER_TOOLS_LAUNCH_IMPL_H

#include <signal.h>
#include <stdbool.h>

/* What one attempt runs: nproc workers of `path` (resolved already) with
 * argv; worker i gets envs[i] (a NULL-terminated "K=V" array) and global
 * rank first_rank + i. */
typedef struct launch_group {
    int nproc, first_rank;
    const char *path;
    char *const *argv;
    char **const *envs;
    double grace_s; /* SIGTERM, then SIGKILL this long after */
    bool prefix;    /* "[rank N] " before each output line (pipes); false: workers share our stdout/stderr */
    int sigfd; /* signalfd for SIGCHLD and the signals we forward (SIGINT, SIGTERM, SIGHUP unless ignored) */
    sigset_t child_mask; /* the signal mask the caller had before blocking those: the workers get it */
    /* the job's store, where a worker's exit is noted as r<restart>/exited/<rank> (ember/dist.h,
     * em_pg_from_env), so ranks waiting to join a group with it fail at once; token NULL: not noted */
    const char *store_addr, *store_token;
    int store_port, restart;
} launch_group;

typedef enum launch_end {
    LAUNCH_OK,          /* every worker exited 0 */
    LAUNCH_FAILED,      /* a worker failed (rank, status / signal below); the rest were stopped */
    LAUNCH_INTERRUPTED, /* we got `signal` and stopped the workers */
    LAUNCH_ERROR        /* could not start (message printed) */
} launch_end;

typedef struct launch_outcome {
    launch_end end;
    int rank;   /* LAUNCH_FAILED: the first failing rank */
    int status; /* its exit status, or 0 when killed by a signal */
    int signal; /* LAUNCH_FAILED: the signal that killed it (0 if it exited); INTERRUPTED: the signal we got
                 */
} launch_outcome;

/* Runs one attempt to its end: every worker has exited and been reaped, and
 * no process is left in any worker's process group. Prints the failure
 * ("ember launch: rank R exited with status S") on stderr. */
launch_outcome launch_run(const launch_group *g);

#endif
