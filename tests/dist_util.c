/* dist_util.c — see dist_util.h: forked ranks around a store the test hosts. */
#include "dist_util.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

double th_ranks_timeout = 10;
static int rounds; /* groups made by this test process so far */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run(const char *file, int line, int world, em_transport tr, th_rank_fn fn, th_env_fn efn, void *ctx)
{
    if (world < 1 || world > 16) th_fail(file, line, "th_ranks: world %d out of range", world);
    char token[40];
    snprintf(token, sizeof token, "test-token-%08x%08x", (unsigned)getpid(), (unsigned)rand());
    /* The store runs in its own child: forking ranks from a process whose
     * server thread may hold an allocator lock (ASan's) can deadlock them. */
    int pfd[2];
    if (pipe(pfd) != 0) th_fail(file, line, "th_ranks: pipe failed");
    fflush(stdout);
    fflush(stderr);
    pid_t store_pid = fork();
    if (store_pid < 0) th_fail(file, line, "th_ranks: fork failed");
    if (store_pid == 0) {
        close(pfd[0]);
        em_store_server *srv = em_store_server_start(NULL, 0, token);
        int p = srv ? em_store_server_port(srv) : -1;
        if (write(pfd[1], &p, sizeof p) != (ssize_t)sizeof p || !srv) _exit(1);
        for (;;) pause(); /* until the parent kills it */
    }
    close(pfd[1]);
    int port = -1;
    if (read(pfd[0], &port, sizeof port) != (ssize_t)sizeof port || port <= 0) {
        close(pfd[0]);
        kill(store_pid, SIGKILL);
        waitpid(store_pid, NULL, 0);
        th_fail(file, line, "th_ranks: cannot start a store");
    }
    close(pfd[0]);
    int round = ++rounds;
    pid_t pids[16];
    for (int r = 0; r < world; r++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) th_fail(file, line, "th_ranks: fork failed");
        if (pid == 0) {
            char v[64];
            if (efn) {
                snprintf(v, sizeof v, "%d", r);
                setenv("RANK", v, 1);
                setenv("LOCAL_RANK", v, 1);
                snprintf(v, sizeof v, "%d", world);
                setenv("WORLD_SIZE", v, 1);
                setenv("LOCAL_WORLD_SIZE", v, 1);
                setenv("MASTER_ADDR", "127.0.0.1", 1);
                snprintf(v, sizeof v, "%d", port);
                setenv("MASTER_PORT", v, 1);
                setenv("EMBER_STORE_TOKEN", token, 1);
                snprintf(v, sizeof v, "%d", round);
                setenv("EMBER_RESTART_COUNT", v, 1);
                setenv("EMBER_TIMEOUT", "30", 1);
                efn(r, world, ctx);
                exit(0);
            }
            em_store *st = em_store_connect("127.0.0.1", port, token, 10);
            if (!st) th_fail(file, line, "rank %d: cannot reach the store: %s", r, em_last_error());
            snprintf(v, sizeof v, "t%d/pg", round);
            em_pg *pg = em_pg_new(&(em_pg_config){.rank = r, .world = world, .store = st, .name = v,
                                                  .timeout_s = th_ranks_timeout, .transport = tr});
            if (!pg) th_fail(file, line, "rank %d: cannot join: %s", r, em_last_error());
            fn(pg, r, world, ctx);
            em_pg_free(pg);
            em_store_close(st);
            exit(0);
        }
        pids[r] = pid;
    }
    /* as `ember launch` does: a rank's exit is noted in the store (r<round>/exited/<rank>), so
     * ranks still joining a group with it fail at once naming it (em_pg_from_env) */
    em_store *notes = efn ? em_store_connect("127.0.0.1", port, token, 10) : NULL;
    int status[16], left = world, first_bad = -1;
    for (int r = 0; r < world; r++) status[r] = -1;
    double start = now(), fail_at = 0;
    while (left > 0) {
        for (int r = 0; r < world; r++) {
            if (status[r] != -1) continue;
            int st;
            if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
                status[r] = st;
                left--;
                if (notes) {
                    char key[64], what[64];
                    snprintf(key, sizeof key, "r%d/exited/%d", round, r);
                    snprintf(what, sizeof what,
                             WIFEXITED(st) ? "its process exited with status %d"
                                           : "its process was killed by signal %d",
                             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                    em_store_set(notes, key, what, strlen(what));
                }
                if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && first_bad < 0) {
                    first_bad = r;
                    fail_at = now();
                }
            }
        }
        double t = now();
        if (left > 0 && (t - start > 60 || (first_bad >= 0 && t - fail_at > 10))) {
            for (int r = 0; r < world; r++)
                if (status[r] == -1) kill(pids[r], SIGKILL);
            for (int r = 0; r < world; r++)
                if (status[r] == -1) {
                    waitpid(pids[r], &status[r], 0);
                    if (first_bad < 0) first_bad = r;
                }
            em_store_close(notes);
            kill(store_pid, SIGKILL);
            waitpid(store_pid, NULL, 0);
            th_fail(file, line, "rank %d did not finish in time (killed)", first_bad);
        }
        if (left > 0) {
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    em_store_close(notes);
    kill(store_pid, SIGKILL);
    waitpid(store_pid, NULL, 0);
    if (first_bad >= 0) {
        int st = status[first_bad];
        if (WIFSIGNALED(st))
            th_fail(file, line, " [rank %d of %d killed by signal %d]", first_bad, world, WTERMSIG(st));
        th_fail(file, line, " [rank %d of %d failed]", first_bad, world);
    }
}

void th_ranks(const char *file, int line, int world, em_transport tr, th_rank_fn fn, void *ctx)
{
    run(file, line, world, tr, fn, NULL, ctx);
}

void th_ranks_env(const char *file, int line, int world, th_env_fn fn, void *ctx)
{
    run(file, line, world, EM_TRANSPORT_AUTO, NULL, fn, ctx);
}

em_optimizer *th_adamw_of(em_module *m, double lr)
{
    int n = em_module_params(m, NULL, 0);
    em_named *ps = calloc((size_t)n + 1, sizeof *ps);
    em_tensor **pt = calloc((size_t)n + 1, sizeof *pt);
    em_optimizer *opt = NULL;
    if (ps && pt) {
        em_module_params(m, ps, n);
        for (int i = 0; i < n; i++) pt[i] = ps[i].t;
        em_adam_config ac = em_adamw_defaults();
        if (!isnan(lr)) ac.lr = lr;
        opt = em_adamw_new(n, pt, &ac);
    }
    free(ps);
    free(pt);
    return opt;
}
