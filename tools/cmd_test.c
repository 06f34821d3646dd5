/* cmd_test.c — `ember test`: a 2-process self-check of this machine's
 * distributed setup (like `accelerate test`): `ember launch -n 2` runs this
 * same binary as two workers, which check every collective on every dtype
 * and then train a small GPT with DDP for a few steps, and rank 0 prints
 * what passed. Started by a launcher (mpirun, srun, ember launch: whatever
 * dist/launch_env.c recognises), it is one of the workers itself, so
 * `mpirun -n 4 ember test` checks that job's group. `ember test --suite
 * [substring...]` runs the unit-test suite of this build instead. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "dist/launch_env_impl.h"
#include "ember/ember.h"

/* The directory this binary lives in (build/ or an install's bin/). */
static int self_path(char *buf, size_t n)
{
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    if (k <= 0) {
        fprintf(stderr, "ember test: cannot find this program's path (/proc/self/exe): %s\n", strerror(errno));
        return 1;
    }
    buf[k] = '\0';
    return 0;
}

/* `ember test --suite`: runs tests/ember-tests of the build directory this
 * binary lives in, so build/ember runs build's tests and build-asan/ember
 * the sanitized ones. */
static int run_suite(int argc, char **argv)
{
    char self[PATH_MAX];
    if (self_path(self, sizeof self)) return 1;
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tests/ember-tests", self);
    if (access(path, X_OK) != 0) {
        fprintf(stderr, "ember test: no test binary at %s (build it with: ninja -C %s)\n", path, self);
        return 1;
    }
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) return 1;
    args[0] = path;
    for (int i = 1; i < argc; i++) args[i] = argv[i];
    execv(path, args);
    fprintf(stderr, "ember test: cannot run %s: %s\n", path, strerror(errno));
    free(args);
    return 1;
}

/* ---- the worker side of the self-check ----------------------------------------- */

static int failures;

static void report(em_pg *pg, const char *what, bool ok)
{
    if (!ok) failures++;
    if (!ok) fprintf(stderr, "FAILED %s: %s\n", what, em_last_error());
    else if (em_pg_rank(pg) == 0) printf("ok  %s\n", what);
    fflush(stdout);
}

/* Every collective on one dtype; values are small integers, exact in all. */
static bool check_dtype(em_pg *pg, em_dtype dt)
{
    int r = em_pg_rank(pg), w = em_pg_world(pg);
    int64_t n = 1001; /* odd, not divisible by the world */
    bool ok = true;
    em_scope s = em_scope_begin();
    em_tensor *t = em_full(dt, 1, &n, r + 1);
    ok = ok && em_all_reduce(pg, t, EM_RED_SUM, NULL) == EM_OK && em_item(em_narrow(t, 0, 7, 1)) == w * (w + 1) / 2;
    em_tensor *m = em_full(dt, 1, &n, r + 1);
    ok = ok && em_all_reduce(pg, m, EM_RED_MAX, NULL) == EM_OK && em_item(em_narrow(m, 0, 0, 1)) == w;
    em_tensor *mn = em_full(dt, 1, &n, r + 1);
    ok = ok && em_all_reduce(pg, mn, EM_RED_MIN, NULL) == EM_OK && em_item(em_narrow(mn, 0, n - 1, 1)) == 1;
    em_tensor *b = em_full(dt, 1, &n, r == 0 ? 5 : 0);
    ok = ok && em_broadcast(pg, b, 0, NULL) == EM_OK && em_item(em_narrow(b, 0, 3, 1)) == 5;
    int64_t wn = w * n;
    em_tensor *all = em_zeros(dt, 1, &wn), *mine = em_full(dt, 1, &n, r);
    ok = ok && em_all_gather(pg, all, mine, NULL) == EM_OK && em_item(em_narrow(all, 0, wn - 1, 1)) == w - 1;
    em_tensor *rs_in = em_full(dt, 1, &wn, 1), *rs_out = em_zeros(dt, 1, &n);
    ok = ok && em_reduce_scatter(pg, rs_out, rs_in, EM_RED_SUM, NULL) == EM_OK && em_item(em_narrow(rs_out, 0, 0, 1)) == w;
    em_tensor *g = em_zeros(dt, 1, &wn);
    ok = ok && em_gather(pg, r == 0 ? g : NULL, mine, 0, NULL) == EM_OK;
    if (r == 0) ok = ok && em_item(em_narrow(g, 0, wn - 1, 1)) == w - 1;
    em_tensor *p2p = em_full(dt, 1, &n, r == 0 ? 9 : 0);
    if (r == 0) ok = ok && em_send(pg, p2p, 1, NULL) == EM_OK;
    if (r == 1) ok = ok && em_recv(pg, p2p, 0, NULL) == EM_OK && em_item(em_narrow(p2p, 0, 0, 1)) == 9;
    em_work *work = NULL;
    em_tensor *async = em_full(dt, 1, &n, 1);
    ok = ok && em_all_reduce(pg, async, EM_RED_SUM, &work) == EM_OK && em_work_wait(work) == EM_OK &&
         em_item(em_narrow(async, 0, 0, 1)) == w;
    ok = ok && em_barrier(pg, NULL) == EM_OK;
    em_scope_end(s);
    return ok;
}

/* A few DDP steps of a small GPT: the ranks must end with identical weights
 * and a falling loss. */
static bool check_ddp(em_pg *pg)
{
    em_gpt_config c = {.vocab_size = 16, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 32, .bias = true};
    em_gpt *g = em_gpt_new(&c, 42 + (uint64_t)em_pg_rank(pg));
    em_ddp *d = g ? em_ddp_new(pg, g->m, &(em_ddp_config){.bucket_mb = 0.01}) : NULL;
    if (!d) {
        em_gpt_free(g);
        return false;
    }
    int n = em_module_params(g->m, NULL, 0);
    em_named *ps = calloc((size_t)n, sizeof *ps);
    em_tensor **pt = calloc((size_t)n, sizeof *pt);
    em_module_params(g->m, ps, n);
    for (int i = 0; i < n; i++) pt[i] = ps[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-2;
    em_optimizer *opt = em_adamw_new(n, pt, &ac);
    int32_t tok[512];
    for (int i = 0; i < 512; i++) tok[i] = i % 16;
    em_tokens tokens = em_tokens_view(tok, 512, EM_TOK_I32);
    em_window_sampler ws;
    bool ok = opt && em_window_sampler_init(&ws, &tokens, 8, 8, 3) == EM_OK &&
              em_window_sampler_shard(&ws, em_pg_rank(pg), em_pg_world(pg)) == EM_OK;
    double first = NAN, last = NAN;
    for (int step = 0; step < 8 && ok; step++) {
        em_scope s = em_scope_begin();
        em_batch b;
        em_tensor *loss = em_window_sampler_next(&ws, &b) == EM_OK ? em_gpt_loss(g, b.x, b.y) : NULL;
        ok = loss && em_ddp_backward(d, loss, NULL) == EM_OK && em_optim_step(opt) == EM_OK &&
             em_optim_zero_grad(opt) == EM_OK;
        if (ok) last = em_item(loss);
        if (ok && step == 0) first = last;
        em_scope_end(s);
    }
    /* identical weights: rank 0's broadcast equals every rank's own */
    em_tensor *flat = em_module_flat_params(g->m, EM_F32), *copy = ok ? em_copy(flat) : NULL;
    ok = ok && copy && em_broadcast(pg, copy, 0, NULL) == EM_OK &&
         memcmp(em_data(copy), em_data(flat), (size_t)em_numel(flat) * 4) == 0;
    int64_t one = 1;
    em_tensor *flag = em_full(EM_I32, 1, &one, ok ? 0 : 1);
    ok = em_all_reduce(pg, flag, EM_RED_MAX, NULL) == EM_OK && em_item(flag) == 0 && ok;
    ok = ok && last < first;
    em_free(flag);
    em_free(copy);
    em_optim_free(opt);
    free(pt);
    free(ps);
    em_ddp_free(d);
    em_gpt_free(g);
    return ok;
}

static int worker(void)
{
    em_pg *pg = em_pg_from_env();
    if (!pg) {
        fprintf(stderr, "ember test: cannot join the group: %s\n", em_last_error());
        return 1;
    }
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32};
    em_transport tr = em_pg_transport(pg);
    if (em_pg_rank(pg) == 0)
        printf("data path: %s\n", tr == EM_TRANSPORT_MPI ? "MPI (started by an MPI launcher)"
                                  : tr == EM_TRANSPORT_SHM
                                      ? "shared memory (every rank on this machine)"
                                      : "TCP (set EMBER_TRANSPORT=shm to require shared memory)");
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        char what[192];
        snprintf(what, sizeof what, "collectives on %s (all_reduce sum/max/min, broadcast, all_gather, "
                 "reduce_scatter, gather, send/recv, async, barrier)", em_dtype_name(dts[i]));
        report(pg, what, check_dtype(pg, dts[i]));
    }
    report(pg, "DDP: 8 steps of a small GPT, identical weights on every rank, falling loss", check_ddp(pg));
    if (em_pg_rank(pg) == 0)
        printf("%s: %d processes, %d check%s failed\n", failures ? "FAILED" : "passed", em_pg_world(pg), failures,
               failures == 1 ? "" : "s");
    em_pg_free(pg);
    return failures ? 1 : 0;
}

int cmd_test(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: ember test [-n N]              2-process (or N) self-check of collectives and DDP\n"
               "                                          (started by mpirun, srun or ember launch: one of\n"
               "                                          that job's processes, checking its group)\n"
               "       ember test --suite [substring...]  the unit tests of this build (names containing a\n"
               "                                          substring; all when none), ending with\n"
               "                                          \"N passed, N failed, N skipped\"\n");
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--suite")) return run_suite(argc - 1, argv + 1);
    if (argc == 2 && !strcmp(argv[1], "--worker")) return worker();
    launch_env e;
    if (launch_env_read("ember test", &e)) {
        fprintf(stderr, "%s\n", em_last_error());
        return 2;
    }
    if (e.kind != LAUNCHER_NONE) { /* a launcher started this process: it is a worker */
        if (argc > 1) {
            fprintf(stderr,
                    "ember test: started by %s, which says how many processes: '%s' is not taken here\n",
                    launcher_name(e.kind), argv[1]);
            return 2;
        }
        return worker();
    }
    const char *n = "2";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 2 || v > 64) {
                fprintf(stderr, "ember test: -n needs a process count from 2 to 64, got '%s'\n", argv[i]);
                return 2;
            }
            n = argv[i];
        } else {
            fprintf(stderr, "ember test: unknown argument '%s' (ember test --help)\n", argv[i]);
            return 2;
        }
    }
    char self[PATH_MAX];
    if (self_path(self, sizeof self)) return 1;
    char *largv[] = {"launch", "-n", (char *)n, self, "test", "--worker", NULL};
    printf("ember test: %s processes on this machine (ember launch -n %s)\n", n, n);
    fflush(stdout);
    return cmd_launch(6, largv);
}
