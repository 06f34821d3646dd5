/* test_launch.c — `ember launch`, run as a user runs it (EMBER_BUILD_DIR/ember)
 * with small sh scripts as workers: the environment each rank gets, output
 * prefixes, failure and signal teardown (no process left behind: workers
 * write their pids to files and the test checks them), restarts, the store's
 * port, flags and the config file.
 *
 * The test process makes itself a child subreaper, so a worker's orphaned
 * children are re-parented to it: it can tell a killed one (a zombie, which
 * it then reaps) from a live one, and never leaves one behind. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"
#define run_ember(...) th_run(EMBER_BIN, __VA_ARGS__)

static char dir[PATH_MAX];

/* A scratch directory, exported as D for the worker scripts; no config file
 * but one that picks a free port (XDG_CONFIG_HOME points into the directory),
 * and no inherited launcher variables. */
static void setup(void)
{
    th_tmpdir(dir, sizeof dir, "ember-launch");
    setenv("D", dir, 1);
    setenv("XDG_CONFIG_HOME", dir, 1);
    const char *clear[] = {"EMBER_CONFIG_FILE",     "EMBER_STORE_TOKEN",   "EMBER_GRAD_ACCUM",
                           "EMBER_MIXED_PRECISION", "EMBER_SPLIT_BATCHES", "EMBER_EVEN_BATCHES",
                           "EMBER_TIMEOUT",         "EMBER_NUM_THREADS"};
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) unsetenv(clear[i]);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* the default config picks a free port: tests of several people share this machine */
    em_config c = em_config_defaults();
    c.main_process_port = 0;
    char path[PATH_MAX];
    th_pathf(path, sizeof path, "%s/ember/default_config.yaml", dir);
    CHECK_OK(em_config_write(path, &c));
}

static const char *in_dir(const char *name)
{
    static char bufs[4][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 4];
    th_pathf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The pid in dir/name, or 0 when the file is not there (yet). */
static pid_t read_pid(const char *name)
{
    FILE *f = fopen(in_dir(name), "r");
    if (!f) return 0;
    long v = 0;
    if (fscanf(f, "%ld", &v) != 1) v = 0;
    fclose(f);
    return (pid_t)v;
}

/* Waits up to 5 s for dir/name to hold a pid. */
static pid_t wait_pid_file(const char *name)
{
    for (double t0 = now_s(); now_s() - t0 < 5.0; usleep(10000)) {
        pid_t p = read_pid(name);
        if (p > 0) return p;
    }
    th_fail(__FILE__, __LINE__, "no pid in %s after 5 s", in_dir(name));
}

/* true while pid runs (a zombie does not count: it has been killed). */
static bool alive(pid_t pid)
{
    char path[64], stat[256] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *paren = strrchr(stat, ')');
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

/* Fails if any of the pids in the named files still runs (killing it first,
 * so the test leaves nothing behind); reaps orphans re-parented to us. */
static void check_all_gone(const char *const *names, int n)
{
    char live[256] = "";
    usleep(20000);
    for (int i = 0; i < n; i++) {
        pid_t p = read_pid(names[i]);
        if (p <= 0) th_fail(__FILE__, __LINE__, "no pid in %s", names[i]);
        if (alive(p)) {
            size_t len = strlen(live);
            snprintf(live + len, sizeof live - len, " %s=%d", names[i], (int)p);
            kill(p, SIGKILL);
        }
    }
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    if (live[0]) th_fail(__FILE__, __LINE__, "still running after ember launch returned:%s", live);
}

/* Reaps the workers re-parented to this test (it is their subreaper); the
 * runner removes dir. */
static void cleanup(void)
{
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

/* the line of `text` that starts with prefix, up to its newline, or NULL */
static const char *line_of(const char *text, const char *prefix)
{
    static char buf[1024];
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, n)) {
            size_t len = strcspn(p, "\n");
            snprintf(buf, sizeof buf, "%.*s", (int)len, p);
            return buf;
        }
    return NULL;
}

/* ---- the environment ------------------------------------------------------------- */

TEST(test_launch_sets_rank_variables_for_each_worker)
{
    setup();
    th_run_result *r = run_ember(
        "launch", "-n", "3", "--master-port", "0", "sh", "-c",
        "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE A=$MASTER_ADDR G=$GROUP_RANK "
        "N=$EMBER_NNODES C=$EMBER_RESTART_COUNT T=${#EMBER_STORE_TOKEN}\"",
        NULL);
    CHECK_EXIT(r, 0);
    for (int i = 0; i < 3; i++) {
        char want[160], prefix[16];
        snprintf(prefix, sizeof prefix, "[rank %d] ", i);
        snprintf(want, sizeof want, "[rank %d] R=%d L=%d W=3 LW=3 A=127.0.0.1 G=0 N=1 C=0 T=32", i, i, i);
        const char *got = line_of(r->out, prefix);
        if (!got || strcmp(got, want))
            th_fail(__FILE__, __LINE__, "want '%s', got '%s'", want, got ? got : "");
    }
    cleanup();
}

TEST(test_launch_gives_every_worker_the_same_token_and_port)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "2", "--master-port", "0", "sh", "-c",
                                 "echo \"$MASTER_PORT $EMBER_STORE_TOKEN\"", NULL);
    CHECK_EXIT(r, 0);
    char a[1024];
    const char *l0 = line_of(r->out, "[rank 0] ");
    CHECK(l0 != NULL);
    snprintf(a, sizeof a, "%s", l0 + 9);
    const char *b = line_of(r->out, "[rank 1] ");
    CHECK(b != NULL);
    b += 9;
    CHECK(strlen(a) > 33); /* port, space, 32 hex characters */
    CHECK(!strcmp(a, b));
    cleanup();
}

TEST(test_launch_port_zero_gives_a_port_that_accepts_connections)
{
    setup();
    if (access("/bin/bash", X_OK) != 0) SKIP("needs bash for /dev/tcp");
    th_run_result *r = run_ember(
        "launch", "-n", "1", "--master-port", "0", "/bin/bash", "-c",
        "echo port=$MASTER_PORT; exec 3<>/dev/tcp/$MASTER_ADDR/$MASTER_PORT && echo connected", NULL);
    CHECK_EXIT(r, 0);
    const char *l = line_of(r->out, "[rank 0] port=");
    CHECK(l != NULL);
    int port = atoi(l + strlen("[rank 0] port="));
    CHECK(port > 0 && port < 65536);
    CHECK(line_of(r->out, "[rank 0] connected") != NULL);
    cleanup();
}

TEST(test_launch_node_rank_offsets_ranks_and_hosts_no_store)
{
    setup();
    setenv("EMBER_STORE_TOKEN", "0123456789abcdef0123", 1);
    th_run_result *r = run_ember("launch", "-n", "2", "--nnodes", "3", "--node-rank", "1", "--master-addr",
                                 "10.9.8.7", "--master-port", "29999", "sh", "-c",
                                 "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE A=$MASTER_ADDR P=$MASTER_PORT "
                                 "G=$GROUP_RANK N=$EMBER_NNODES T=$EMBER_STORE_TOKEN\"",
                                 NULL);
    CHECK_EXIT(r, 0);
    const char *l = line_of(r->out, "[rank 3] ");
    CHECK(l && !strcmp(l, "[rank 3] R=3 L=1 W=6 A=10.9.8.7 P=29999 G=1 N=3 T=0123456789abcdef0123"));
    CHECK(line_of(r->out, "[rank 2] R=2 L=0") != NULL);
    cleanup();
}

TEST(test_launch_several_machines_need_a_shared_token)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "1", "--nnodes", "2", "--node-rank", "1", "--master-port",
                                 "29999", "true", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "EMBER_STORE_TOKEN") != NULL);
    cleanup();
}

/* ---- output ------------------------------------------------------------------------- */

TEST(test_launch_prefixes_every_output_line_with_its_rank)
{
    setup();
    th_run_result *r =
        run_ember("launch", "-n", "2", "sh", "-c", "echo one; echo two; echo oops >&2; printf last", NULL);
    CHECK_EXIT(r, 0);
    for (int i = 0; i < 2; i++) {
        char want[64];
        const char *words[] = {"one", "two", "last"};
        for (int k = 0; k < 3; k++) {
            snprintf(want, sizeof want, "[rank %d] %s", i, words[k]);
            const char *l = line_of(r->out, want);
            if (!l || strcmp(l, want))
                th_fail(__FILE__, __LINE__, "no line '%s' in stdout:\n%s", want, r->out);
        }
        snprintf(want, sizeof want, "[rank %d] oops", i);
        CHECK(line_of(r->err, want) != NULL); /* stderr stays stderr */
        CHECK(line_of(r->out, want) == NULL);
    }
    /* every stdout line is prefixed, and the partial last line got its newline */
    for (const char *p = r->out; *p; p = strchr(p, '\n') + 1) {
        CHECK(!strncmp(p, "[rank ", 6));
        CHECK(strchr(p, '\n') != NULL);
    }
    cleanup();
}

TEST(test_launch_no_prefix_passes_output_through)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "1", "--no-prefix", "sh", "-c", "echo plain", NULL);
    CHECK_EXIT(r, 0);
    CHECK(!strcmp(r->out, "plain\n"));
    cleanup();
}

/* ---- failures and signals --------------------------------------------------------------- */

/* rank 1 exits 3 once all have written their pid; the others sleep 60 */
static const char failing_group[] = "echo $$ > $D/w$RANK.pid; "
                                    "if [ $RANK = 1 ]; then while [ ! -s $D/w0.pid ] || [ ! -s $D/w2.pid ]; "
                                    "do sleep 0.01; done; exit 3; fi; sleep 60";

TEST(test_launch_worker_failure_stops_the_others_and_names_the_rank)
{
    setup();
    double t0 = now_s();
    th_run_result *r = run_ember("launch", "-n", "3", "sh", "-c", failing_group, NULL);
    double took = now_s() - t0;
    CHECK(r->status == 1);
    CHECK(took < 10.0);
    CHECK(strstr(r->err, "rank 1 exited with status 3") != NULL);
    const char *pids[] = {"w0.pid", "w1.pid", "w2.pid"};
    check_all_gone(pids, 3);
    cleanup();
}

TEST(test_launch_worker_killed_by_signal_is_named)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "1", "sh", "-c", "kill -KILL $$", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "rank 0 killed by signal 9 (SIGKILL)") != NULL);
    cleanup();
}

TEST(test_launch_stops_the_children_of_stopped_workers)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "2", "sh", "-c",
                                 "if [ $RANK = 0 ]; then sleep 60 & echo $! > $D/child.pid; sleep 60; fi; "
                                 "while [ ! -s $D/child.pid ]; do sleep 0.01; done; exit 1",
                                 NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "rank 1 exited with status 1") != NULL);
    const char *pids[] = {"child.pid"};
    check_all_gone(pids, 1);
    cleanup();
}

TEST(test_launch_stops_what_a_finished_worker_left_running)
{
    setup();
    th_run_result *r =
        run_ember("launch", "-n", "1", "sh", "-c", "sleep 60 & echo $! > $D/child.pid; exit 0", NULL);
    CHECK_EXIT(r, 0);
    const char *pids[] = {"child.pid"};
    check_all_gone(pids, 1);
    cleanup();
}

TEST(test_launch_worker_ignoring_sigterm_is_killed_after_grace)
{
    setup();
    double t0 = now_s();
    th_run_result *r =
        run_ember("launch", "-n", "2", "--grace", "0.5", "sh", "-c",
                  "trap '' TERM; echo $$ > $D/w$RANK.pid; "
                  "if [ $RANK = 1 ]; then while [ ! -s $D/w0.pid ]; do sleep 0.01; done; exit 2; fi; "
                  "while :; do sleep 0.05; done",
                  NULL);
    CHECK_EXIT(r, 1);
    CHECK(now_s() - t0 < 5.0);
    CHECK(strstr(r->err, "SIGKILL") != NULL);
    const char *pids[] = {"w0.pid"};
    check_all_gone(pids, 1);
    cleanup();
}

TEST(test_launch_exec_failure_is_the_workers_failure)
{
    setup();
    const char *script = in_dir("bad.sh");
    FILE *f = fopen(script, "w");
    CHECK(f != NULL);
    fputs("#!/nonexistent/interpreter\n", f);
    fclose(f);
    chmod(script, 0755);
    th_run_result *r = run_ember("launch", "-n", "2", script, NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "cannot run") && strstr(r->err, script));
    CHECK(strstr(r->err, "exited with status 127") != NULL);
    cleanup();
}

TEST(test_launch_sigterm_stops_every_worker)
{
    setup();
    int out = open(in_dir("out.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(out >= 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(out, 1);
        dup2(out, 2);
        execl(EMBER_BIN, EMBER_BIN, "launch", "-n", "2", "sh", "-c",
              "sleep 60 & echo $! > $D/c$RANK.pid; echo $$ > $D/w$RANK.pid; wait", (char *)NULL);
        _exit(126);
    }
    close(out);
    wait_pid_file("w0.pid");
    wait_pid_file("w1.pid");
    wait_pid_file("c0.pid");
    wait_pid_file("c1.pid");
    kill(pid, SIGTERM);
    int st = 0;
    double t0 = now_s();
    while (waitpid(pid, &st, WNOHANG) == 0 && now_s() - t0 < 10.0) usleep(10000);
    if (now_s() - t0 >= 10.0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        th_fail(__FILE__, __LINE__, "ember launch still running 10 s after SIGTERM");
    }
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM);
    const char *pids[] = {"w0.pid", "w1.pid", "c0.pid", "c1.pid"};
    check_all_gone(pids, 4);
    cleanup();
}

TEST(test_launch_keeps_ignoring_a_signal_it_was_started_ignoring)
{
    setup();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) { /* as under nohup */
        int out = open(in_dir("out.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        dup2(out, 2);
        signal(SIGHUP, SIG_IGN);
        execl(EMBER_BIN, EMBER_BIN, "launch", "-n", "2", "sh", "-c",
              "echo $$ > $D/w$RANK.pid; sleep 0.5; echo done", (char *)NULL);
        _exit(126);
    }
    wait_pid_file("w0.pid");
    wait_pid_file("w1.pid");
    kill(pid, SIGHUP);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cleanup();
}

/* ---- restarts ------------------------------------------------------------------------- */

TEST(test_launch_max_restarts_restarts_the_group_with_its_count)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "2", "--max-restarts", "1", "sh", "-c",
                                 "echo count=$EMBER_RESTART_COUNT; "
                                 "if [ $EMBER_RESTART_COUNT = 0 ] && [ $RANK = 1 ]; then exit 5; fi; "
                                 "[ $EMBER_RESTART_COUNT = 1 ] || sleep 60",
                                 NULL);
    CHECK_EXIT(r, 0);
    CHECK(line_of(r->out, "[rank 0] count=1") && line_of(r->out, "[rank 1] count=1"));
    CHECK(strstr(r->err, "rank 1 exited with status 5") && strstr(r->err, "restart 1 of 1"));
    cleanup();
}

TEST(test_launch_gives_up_after_max_restarts)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "1", "--max-restarts", "2", "sh", "-c",
                                 "echo c=$EMBER_RESTART_COUNT; exit 4", NULL);
    CHECK_EXIT(r, 1);
    CHECK(line_of(r->out, "[rank 0] c=0") && line_of(r->out, "[rank 0] c=1") &&
          line_of(r->out, "[rank 0] c=2"));
    CHECK(!line_of(r->out, "[rank 0] c=3"));
    CHECK(strstr(r->err, "giving up after 2 restarts") != NULL);
    cleanup();
}

/* ---- usage ------------------------------------------------------------------------- */

TEST(test_launch_bad_usage_exits_2_naming_the_flag)
{
    setup();
    struct {
        const char *args[6], *want;
    } cases[] = {
        {{"--bogus", "1", "true"}, "--bogus"},
        {{"-n", "zero", "true"}, "zero"},
        {{"-n", "2"}, "no PROGRAM"},
        {{"--master-port", "70000", "true"}, "--master-port"},
        {{"--nnodes", "2", "--node-rank", "2", "true"}, "node rank 2"},
        {{"--nnodes", "2", "--master-port", "0", "true"}, "--master-port 0"},
        {{"--mixed-precision", "fp8", "true"}, "fp8"},
        {{"-n"}, "-n needs a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char **a = cases[i].args;
        th_run_result *r = run_ember("launch", a[0], a[1], a[2], a[3], a[4], a[5], NULL);
        if (r->status != 2 || !strstr(r->err, cases[i].want))
            th_fail(__FILE__, __LINE__, "case %zu: exit %d, stderr '%s' (want 2 and '%s')", i, r->status,
                    r->err, cases[i].want);
    }
    cleanup();
}

TEST(test_launch_missing_program_exits_1_naming_it)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "2", "no-such-program-xyz", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "no-such-program-xyz") != NULL);
    cleanup();
}

TEST(test_launch_help_exits_0)
{
    th_run_result *r = run_ember("launch", "--help", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "usage: ember launch") && strstr(r->out, "--max-restarts"));
}

/* ---- the config file ------------------------------------------------------------------- */

static const char show_settings[] = "echo \"W=$WORLD_SIZE MP=$EMBER_MIXED_PRECISION GA=$EMBER_GRAD_ACCUM "
                                    "SB=$EMBER_SPLIT_BATCHES EB=$EMBER_EVEN_BATCHES TO=$EMBER_TIMEOUT\"";

static void write_config(const char *path)
{
    em_config c = em_config_defaults();
    c.num_processes = 3, c.mixed_precision = EM_PREC_BF16, c.grad_accum = 4;
    c.split_batches = true, c.even_batches = false, c.timeout_s = 42, c.main_process_port = 0;
    CHECK_OK(em_config_write(path, &c));
}

TEST(test_launch_reads_the_default_config_file)
{
    setup();
    write_config(in_dir("ember/default_config.yaml")); /* XDG_CONFIG_HOME is dir */
    th_run_result *r = run_ember("launch", "sh", "-c", show_settings, NULL);
    CHECK_EXIT(r, 0);
    const char *l = line_of(r->out, "[rank 2] ");
    CHECK(l && !strcmp(l, "[rank 2] W=3 MP=bf16 GA=4 SB=1 EB=0 TO=42"));
    cleanup();
}

TEST(test_launch_flags_override_the_config_file)
{
    setup();
    write_config(in_dir("c.yaml"));
    th_run_result *r =
        run_ember("launch", "--config-file", in_dir("c.yaml"), "-n", "2", "--mixed-precision", "no",
                  "--gradient-accumulation-steps=2", "--no-split-batches", "sh", "-c", show_settings, NULL);
    CHECK_EXIT(r, 0);
    const char *l = line_of(r->out, "[rank 1] ");
    CHECK(l && !strcmp(l, "[rank 1] W=2 MP=no GA=2 SB=0 EB=0 TO=42"));
    CHECK(line_of(r->out, "[rank 2] ") == NULL);
    cleanup();
}

TEST(test_launch_environment_beats_config_but_not_flags)
{
    setup();
    write_config(in_dir("c.yaml"));
    setenv("EMBER_GRAD_ACCUM", "7", 1);
    th_run_result *r =
        run_ember("launch", "--config-file", in_dir("c.yaml"), "-n", "1", "sh", "-c", show_settings, NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "GA=7 ") != NULL);
    r = run_ember("launch", "--config-file", in_dir("c.yaml"), "-n", "1", "--gradient-accumulation-steps",
                  "3", "sh", "-c", show_settings, NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "GA=3 ") != NULL);
    cleanup();
}

TEST(test_launch_bad_or_missing_config_file_exits_1_naming_it)
{
    setup();
    th_run_result *r = run_ember("launch", "--config-file", in_dir("none.yaml"), "true", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "none.yaml") != NULL);
    FILE *f = fopen(in_dir("bad.yaml"), "w");
    CHECK(f != NULL);
    fputs("num_procs: 2\n", f);
    fclose(f);
    r = run_ember("launch", "--config-file", in_dir("bad.yaml"), "true", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "bad.yaml") && strstr(r->err, "num_procs"));
    cleanup();
}

/* ---- with the real store -------------------------------------------------------------- */

#define WORKER_BIN EMBER_BUILD_DIR "/tests/launch_worker"

TEST(test_launch_workers_join_the_store_it_hosts)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "3", "--master-port", "0", WORKER_BIN, NULL);
    CHECK_EXIT(r, 0);
    for (int i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "[rank %d] rank %d of 3 ok (restart 0)", i, i);
        if (!line_of(r->out, want)) th_fail(__FILE__, __LINE__, "no '%s' in:\n%s\n%s", want, r->out, r->err);
    }
    cleanup();
}

/* Two launchers on this host playing two machines (--nnodes 2) form one job:
 * node 1's workers find node 0's store and every rank joins one group. */
TEST(test_launch_two_nodes_form_one_group)
{
    setup();
    setenv("EMBER_STORE_TOKEN", "two-nodes-0123456789abcdef", 1);
    setenv("EMBER_TRANSPORT", "tcp", 1); /* what machines apart would use */
    int fd = socket(AF_INET, SOCK_STREAM, 0); /* a port free now (node 0 binds it next) */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    char port[16];
    snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
    close(fd);
    fflush(stdout);
    pid_t node1 = fork();
    if (node1 == 0) { /* node 1, output into a file */
        int out = open(in_dir("node1.out"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(out, 1);
        dup2(out, 2);
        execl(EMBER_BIN, EMBER_BIN, "launch", "-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr",
              "127.0.0.1", "--master-port", port, WORKER_BIN, "group", (char *)NULL);
        _exit(127);
    }
    th_run_result *r = run_ember("launch", "-n", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr",
                                 "127.0.0.1", "--master-port", port, WORKER_BIN, "group", NULL);
    int st = 0;
    waitpid(node1, &st, 0);
    unsetenv("EMBER_TRANSPORT");
    CHECK_EXIT(r, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    static char n1[8192];
    FILE *f = fopen(in_dir("node1.out"), "r");
    CHECK_NOTNULL(f);
    n1[fread(n1, 1, sizeof n1 - 1, f)] = '\0';
    fclose(f);
    CHECK(line_of(r->out, "[rank 0] rank 0 sum 10 over tcp") && line_of(r->out, "[rank 1] rank 1 sum 10 over tcp"));
    CHECK(line_of(n1, "[rank 2] rank 2 sum 10 over tcp") && line_of(n1, "[rank 3] rank 3 sum 10 over tcp"));
    cleanup();
}

/* A worker that exits 0 without joining the group: ember launch notes its
 * exit in the store, and rank 0's join fails at once naming it, not after
 * the 20 s timeout. */
TEST(test_launch_a_worker_exiting_before_the_group_fails_the_join_at_once_naming_it)
{
    setup();
    double t0 = now_s();
    th_run_result *r = run_ember("launch", "-n", "2", "--timeout", "20", WORKER_BIN, "group-without-1", NULL);
    CHECK_EXIT(r, 1);
    CHECK(now_s() - t0 < 8);
    CHECK(strstr(r->err, "rank 1 will not join: its process exited with status 0") != NULL);
    cleanup();
}

TEST(test_launch_store_outlives_a_restart)
{
    setup();
    th_run_result *r = run_ember("launch", "-n", "2", "--max-restarts", "1", WORKER_BIN, "fail-once", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->err, "rank 1 exited with status 3") != NULL);
    CHECK(line_of(r->out, "[rank 0] rank 0 of 2 ok (restart 1)") &&
          line_of(r->out, "[rank 1] rank 1 of 2 ok (restart 1)"));
    cleanup();
}
