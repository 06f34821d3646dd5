/* test_mpi.c — the MPI transport with the real programs: tests/mpi_worker
 * and `ember train` started by OpenMPI's `mpirun --oversubscribe -n N`,
 * which make their groups with em_pg_from_env alone (the transport chosen by
 * itself, rank 0 hosting the store). Skipped, saying why, when ember was
 * built without MPI or mpirun is missing.
 *
 * Under the ASan build the workers are ASan binaries, and OpenMPI's
 * initialisation leaks by design, much of it from components it loads and
 * unloads again (no module name left for a suppression to match): the
 * children run with detect_leaks=0 (address and UB checks stay on; the test
 * process itself keeps the options it started with). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ember_config.h"
#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"
#define WORKER EMBER_BUILD_DIR "/tests/mpi_worker"

#ifndef EMBER_MPIRUN
#define EMBER_MPIRUN "" /* need_mpi() skips */
#define NO_MPIRUN 1
#endif

/* mpirun for n ranks: more ranks than cores, as root (CI), and no single-copy
 * shared memory (containers often forbid the ptrace it needs) */
#define MPIRUN(n, ...)                                                                                       \
    th_run(EMBER_MPIRUN, "--oversubscribe", "--bind-to", "none", "--mca", "btl_vader_single_copy_mechanism", \
           "none", "-n", n, __VA_ARGS__, NULL)

static void need_mpi(void)
{
#if !EM_HAVE_MPI
    SKIP("ember was built without MPI (install openmpi-bin and libopenmpi-dev, then reconfigure)");
#elif defined(NO_MPIRUN)
    SKIP("mpirun was not found when ember was configured");
#else
    if (access(EMBER_MPIRUN, X_OK)) SKIP("mpirun (" EMBER_MPIRUN ") is not there any more");
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0:halt_on_error=1", 1);
    setenv("LSAN_OPTIONS", "detect_leaks=0", 1);
    const char *clear[] = {
        "WORLD_SIZE",      "RANK",          "MASTER_ADDR", "MASTER_PORT", "EMBER_STORE_TOKEN",
        "EMBER_TRANSPORT", "EMBER_TIMEOUT", "EMBER_FAULT"};
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) unsetenv(clear[i]);
#endif
}

/* The number of lines of out that contain s. */
static int lines_with(const char *out, const char *s)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, s)); p += strlen(s)) n++;
    return n;
}

/* mpi_worker's scenario on n ranks, every rank saying ok; mode
 * "serialized": the worker initialises MPI itself at MPI_THREAD_SERIALIZED
 * ("" = ember does) */
static void succeeds(const char *n, const char *scenario, const char *mode)
{
    need_mpi();
    th_run_result *r = MPIRUN(n, WORKER, scenario, mode);
    CHECK_EXIT(r, 0);
    if (lines_with(r->out, " ok\n") != atoi(n))
        th_fail(__FILE__, __LINE__, "%s: not every rank said ok: %s", scenario, r->out);
}
static void every_collective(const char *n, const char *mode) { succeeds(n, "collectives", mode); }

/* Runs a scenario every rank must fail (each prints "rank R error STATUS:
 * msg") and checks that both ranks' errors contain `want`. */
static th_run_result *fails_on_both(const char *file, int line, const char *scenario, const char *want)
{
    need_mpi();
    th_run_result *r = MPIRUN("2", WORKER, scenario);
    CHECK_EXIT(r, 0);
    if (lines_with(r->out, want) != 2) th_fail(file, line, "want on both ranks: %s\ngot: %s", want, r->out);
    return r;
}
#define FAILS_ON_BOTH(scenario, want) fails_on_both(__FILE__, __LINE__, (scenario), (want))

TEST(test_mpi_two_ranks_run_every_collective_and_send_recv) { every_collective("2", ""); }

TEST(test_mpi_four_ranks_run_every_collective_and_send_recv) { every_collective("4", ""); }

TEST(test_mpi_program_that_initialised_mpi_serialized_keeps_it_and_runs_every_collective)
{
    every_collective("2", "serialized");
}

/* A send's header matched while its recv looked for a mismatch, the
 * sender's next call's header seen too: once, the recv called that a
 * mismatch (a 4-rank run of the collectives above failed in CI). */
TEST(test_mpi_recv_whose_send_comes_just_before_the_senders_next_call_succeeds)
{
    succeeds("2", "late-send", "");
}

/* mpi_worker's random program (all_reduces, broadcasts, send/recv between
 * random ranks, rings), each rank pausing 0-120 us at random before each
 * call, on 3 ranks over MPI, TCP and shared memory: every call must meet
 * its match whatever order the messages come in. Over MPI it failed 5 runs
 * of 6 before the fix above (a late send taken for a mismatch). */
TEST(test_random_programs_of_collectives_and_send_recv_succeed_on_every_transport)
{
    need_mpi();
    const char *transports[] = {"mpi", "tcp", "shm"};
    const char *said[] = {"transport 3\n", "transport 1\n", "transport 2\n"}; /* em_transport's values */
    for (int i = 0; i < 3; i++) {
        th_run_result *r;
        if (i == 0) {
            r = MPIRUN("3", WORKER, "random");
        } else {
            setenv("EMBER_TRANSPORT", transports[i], 1);
            r = th_run(EMBER_BIN, "launch", "-n", "3", "--master-port", "0", WORKER, "random", NULL);
            unsetenv("EMBER_TRANSPORT");
        }
        CHECK_EXIT(r, 0);
        if (lines_with(r->out, " ok\n") != 3 || lines_with(r->out, said[i]) != 3)
            th_fail(__FILE__, __LINE__, "%s: not every rank said ok: %s", transports[i], r->out);
    }
}

/* A 10 MiB message past MPI's eager limit, sent as the sender's last call
 * before it frees its group and exits, is received 0.3 s later (TCP and
 * shared memory: test_a_large_message_sent_right_before_its_sender_exited_is_received). */
TEST(test_mpi_large_message_sent_right_before_its_sender_exited_is_received)
{
    succeeds("2", "send-exit", "");
}

TEST(test_mpi_count_mismatch_fails_every_rank_naming_both_calls)
{
    FAILS_ON_BOTH("mismatch",
                  "distributed: call mismatch at call #0: rank 0 called all_reduce(f32, 4 elements, "
                  "sum), rank 1 called all_reduce(f32, 5 elements, sum)");
}

TEST(test_mpi_unreceived_send_fails_the_next_collective_naming_the_send)
{
    FAILS_ON_BOTH("unreceived",
                  "rank 0 called send(f32, 4 elements, to rank 1), rank 1 called all_reduce(f32, 4 "
                  "elements, sum) without receiving it");
}

TEST(test_mpi_recv_facing_a_collective_fails_both_ranks_naming_both_calls)
{
    th_run_result *r =
        FAILS_ON_BOTH("recv-vs-collective", "rank 0 called all_reduce(f32, 4 elements, sum), rank 1 "
                                            "called recv(f32, 5 elements, from rank 0)");
    if (!strstr(r->out,
                "rank 0 error distributed: all_reduce(f32, 4 elements, sum): the group broke on rank 1"))
        th_fail(__FILE__, __LINE__, "rank 0 does not name rank 1 as the origin: %s", r->out);
}

TEST(test_mpi_recv_facing_a_recv_fails_both_ranks_at_once)
{
    setenv("EMBER_TIMEOUT", "60", 1); /* the mismatch must come long before */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    /* one rank finds it, or both do; the other may learn it from the note */
    FAILS_ON_BOTH("recv-vs-recv",
                  "call mismatch: rank 0 called recv(f32, 4 elements, from rank 1), rank 1 called "
                  "recv(f32, 5 elements, from rank 0)");
    clock_gettime(CLOCK_MONOTONIC, &b);
    unsetenv("EMBER_TIMEOUT");
    if (b.tv_sec - a.tv_sec > 30)
        th_fail(__FILE__, __LINE__, "it took %lld s", (long long)(b.tv_sec - a.tv_sec));
}

TEST(test_mpi_rank_that_skips_a_call_gives_a_timeout_not_a_hang)
{
    need_mpi();
    setenv("EMBER_TIMEOUT", "2", 1);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    th_run_result *r = MPIRUN("2", WORKER, "skip");
    clock_gettime(CLOCK_MONOTONIC, &b);
    unsetenv("EMBER_TIMEOUT");
    CHECK_EXIT(r, 0);
    const char *want = "rank 0 error timeout: barrier(): rank 0 waited 2 s for the call of rank 1";
    if (!strstr(r->out, want)) th_fail(__FILE__, __LINE__, "want: %s\ngot: %s", want, r->out);
    double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    if (s > 30) th_fail(__FILE__, __LINE__, "the run took %.1f s for a 2 s timeout", s);
}

TEST(test_mpi_group_config_that_disagrees_with_mpi_is_refused_naming_both)
{
    need_mpi();
    th_run_result *r = MPIRUN("2", WORKER, "bad-config");
    CHECK_EXIT(r, 0);
    const char *want = "error bad argument: em_pg_new: transport mpi: the config says rank 0 of 3, but "
                       "MPI_COMM_WORLD says rank 0 of 2";
    if (!strstr(r->out, want)) th_fail(__FILE__, __LINE__, "want: %s\ngot: %s", want, r->out);
}

TEST(test_mpi_bf16_all_reduce_gives_the_tcp_paths_bits)
{
    need_mpi();
    th_run_result *r = MPIRUN("3", WORKER, "bf16");
    CHECK_EXIT(r, 0);
    char mpi_bits[256] = "";
    const char *p = strstr(r->out, "bits");
    CHECK(p != NULL);
    snprintf(mpi_bits, sizeof mpi_bits, "%.*s", (int)strcspn(p, "\n"), p);
    setenv("EMBER_TRANSPORT", "tcp", 1);
    r = th_run(EMBER_BIN, "launch", "-n", "3", "--master-port", "0", WORKER, "bf16", NULL);
    unsetenv("EMBER_TRANSPORT");
    CHECK_EXIT(r, 0);
    if (lines_with(r->out, mpi_bits) != 3)
        th_fail(__FILE__, __LINE__, "mpi gave '%s'; tcp gave: %s", mpi_bits, r->out);
}

/* The per-step losses of metrics.jsonl (every line with "loss": ...), as text. */
static void losses(const char *out, char *buf, size_t n)
{
    char path[PATH_MAX], line[1024];
    th_pathf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    if (!f) th_fail(__FILE__, __LINE__, "no %s", path);
    buf[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        const char *l = strstr(line, "\"loss\": ");
        if (l && strlen(buf) + 40 < n)
            snprintf(buf + strlen(buf), n - strlen(buf), "%.*s;", (int)strcspn(l, ","), l);
    }
    fclose(f);
}

/* `ember train` (DDP through the Accelerator, or ZeRO stage `zero`) for 6
 * steps under mpirun -n 2, and under ember launch -n 2: the same losses. */
static void train_like_launch(const char *zero)
{
    need_mpi();
    char dir[PATH_MAX], txt[PATH_MAX], o1[PATH_MAX], o2[PATH_MAX], a[4096], b[4096];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(o1, sizeof o1, "%s/mpi", dir);
    th_pathf(o2, sizeof o2, "%s/launch", dir);
#define TRAIN(out)                                                                                           \
    "train", "--data", txt, "--out", out, "--layers", "1", "--heads", "2", "--embd", "16", "--block", "8",   \
        "--batch", "4", "--iters", "6", "--log-every", "1", "--eval-every", "6", "--eval-iters", "1",        \
        "--zero", zero, "--cpu"
    th_run_result *r = MPIRUN("2", EMBER_BIN, TRAIN(o1));
    CHECK_EXIT(r, 0);
    r = th_run(EMBER_BIN, "launch", "-n", "2", "--master-port", "0", EMBER_BIN, TRAIN(o2), NULL);
    CHECK_EXIT(r, 0);
#undef TRAIN
    losses(o1, a, sizeof a);
    losses(o2, b, sizeof b);
    if (lines_with(a, "loss") != 6) th_fail(__FILE__, __LINE__, "want 6 logged losses, got %s", a);
    /* bitwise: with two ranks each element's sum is one addition either way */
    if (strcmp(a, b)) th_fail(__FILE__, __LINE__, "losses under mpirun %s\nunder ember launch %s", a, b);
}

TEST(test_mpi_ddp_train_losses_equal_ember_launchs) { train_like_launch("0"); }

TEST(test_mpi_zero_stage_2_train_losses_equal_ember_launchs) { train_like_launch("2"); }

TEST(test_mpi_env_says_the_transport_is_built)
{
    th_run_result *r = th_run(EMBER_BIN, "env", NULL);
    CHECK_EXIT(r, 0);
    const char *want =
        EM_HAVE_MPI ? "MPI            transport built in" : "MPI            transport not built";
    if (!strstr(r->out, want)) th_fail(__FILE__, __LINE__, "want '%s' in: %s", want, r->out);
}

/* `ember test` started by mpirun is one of the job's processes (it used to
 * start an `ember launch -n 2` of its own in each): the self-check runs on
 * the MPI job's group. */
TEST(test_mpi_ember_test_under_mpirun_checks_the_mpi_group)
{
    need_mpi();
    th_run_result *r = MPIRUN("2", EMBER_BIN, "test");
    if (r->status != 0 || !strstr(r->out, "data path: MPI") ||
        !strstr(r->out, "passed: 2 processes, 0 checks failed") || strstr(r->out, "ember launch"))
        th_fail(__FILE__, __LINE__, "mpirun -n 2 ember test exited %d\nstdout: %s\nstderr: %s", r->status,
                r->out, r->err);
    r = MPIRUN("2", EMBER_BIN, "test", "-n", "3");
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "started by mpirun") != NULL);
}
