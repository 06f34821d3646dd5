/* test_netns.c — `ember launch --nnodes 2` across a real network: two
 * network namespaces (the two "machines") joined by a veth pair on a private
 * /30, one node of `ember train` in each. One run trains to the end; in the
 * other the link goes down mid-run and both nodes must fail within the
 * collective timeout, each naming the peer it lost, leaving no process in
 * either namespace. Then the same two machines run a job started by
 * OpenMPI's `mpirun --hostfile` (one slot each, no `ember launch`), whose
 * losses must equal `ember launch -n 2`'s.
 *
 * Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; where
 * a namespace cannot be made the tests skip and say why. Each test makes its
 * own namespaces (named after its pid) and always removes them: the scenario
 * runs in a child process and the test process cleans up whatever happened
 * to it, killing anything still inside the namespaces first. Its files (the
 * corpus, logs, runs) are in a th_tmpdir the runner removes.
 *
 * The workers use EMBER_TRANSPORT=tcp: both namespaces share this host's
 * boot id, hostname and /dev/shm, so the process group would otherwise move
 * collectives through shared memory and never touch the link. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"
#define NETNS_TIMEOUT "3"
#define NETNS_TIMEOUT_PASSED "30" /* the collective timeout the nodes get (--timeout), seconds */
#define NETNS_ADDR0 "10.213.13.1"
#define NETNS_ADDR1 "10.213.13.2"

typedef struct netns_pair {
    char ns[2][32];  /* the namespaces of node 0 and node 1 */
    char dev[2][16]; /* the veth end in each */
    char dir[PATH_MAX]; /* scratch: corpus, logs, the run's --out */
} netns_pair;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs a shell command; true when it exits 0. Its stderr into err. */
static bool sh(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool sh(char *err, size_t n, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    th_run_result *r = th_run("/bin/sh", "-c", cmd, NULL);
    if (err && n) snprintf(err, n, "%.*s", (int)(n - 1), r->err);
    return r->status == 0;
}

/* Kills whatever runs in the namespaces and deletes them (which removes the
 * veth pair). Safe to call on a partial setup. */
static void pair_down(const netns_pair *p)
{
    for (int k = 0; k < 2; k++) {
        sh(NULL, 0, "ip netns pids %s 2>/dev/null | xargs -r kill -9", p->ns[k]);
        sh(NULL, 0, "ip netns del %s 2>/dev/null", p->ns[k]);
    }
}

/* Makes the two namespaces and the link between them; skips the test (after
 * removing what was made) where that is not permitted. */
static void pair_up(netns_pair *p)
{
    *p = (netns_pair){0};
    th_tmpdir(p->dir, sizeof p->dir, "ember-netns");
    if (!sh(NULL, 0, "command -v ip >/dev/null"))
        th_skip("needs iproute2's `ip` command to make network namespaces");
    int pid = (int)getpid();
    for (int k = 0; k < 2; k++) {
        snprintf(p->ns[k], sizeof p->ns[k], "ember-t%d-%c", pid, 'a' + k);
        snprintf(p->dev[k], sizeof p->dev[k], "ev%d%c", pid % 1000000, 'a' + k);
    }
    char err[512];
    if (!sh(err, sizeof err, "ip netns add %s", p->ns[0])) {
        char why[700];
        snprintf(why, sizeof why,
                 "cannot make a network namespace here (needs root or CAP_NET_ADMIN + CAP_SYS_ADMIN): %s",
                 err);
        why[strcspn(why, "\n")] = '\0';
        pair_down(p);
        th_skip(why);
    }
    bool ok = sh(err, sizeof err, "ip netns add %s", p->ns[1]) &&
              sh(err, sizeof err, "ip link add %s netns %s type veth peer name %s netns %s", p->dev[0],
                 p->ns[0], p->dev[1], p->ns[1]) &&
              sh(err, sizeof err, "ip -n %s addr add " NETNS_ADDR0 "/30 dev %s", p->ns[0], p->dev[0]) &&
              sh(err, sizeof err, "ip -n %s addr add " NETNS_ADDR1 "/30 dev %s", p->ns[1], p->dev[1]);
    for (int k = 0; k < 2 && ok; k++)
        ok = sh(err, sizeof err, "ip -n %s link set lo up && ip -n %s link set %s up", p->ns[k], p->ns[k],
                p->dev[k]);
    if (!ok) {
        pair_down(p);
        th_fail(__FILE__, __LINE__, "setting up the veth link failed: %s", err);
    }
}

/* dir/name */
static const char *at(const netns_pair *p, const char *name)
{
    static char bufs[4][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 4];
    th_pathf(b, sizeof bufs[0], "%s/%s", p->dir, name);
    return b;
}

/* A small text corpus for the tiny model. */
static void write_corpus(const netns_pair *p)
{
    FILE *f = fopen(at(p, "corpus.txt"), "w");
    if (!f) th_fail(__FILE__, __LINE__, "cannot write the corpus");
    for (int i = 0; i < 300; i++) fprintf(f, "the quick brown fox jumps over the lazy dog %d times\n", i);
    fclose(f);
}

/* Starts node `node` (0 or 1) of a 2-node `ember launch ... ember train` in
 * its namespace, output into dir/node<k>.log; returns the launcher's pid. */
static pid_t start_node(const netns_pair *p, int node, const char *iters)
{
    static char cmd[4096]; /* split at spaces into argv below (no path here has one) */
    snprintf(cmd, sizeof cmd,
             "ip netns exec %s " EMBER_BIN " launch --nnodes 2 --node-rank %d -n 1 --master-addr " NETNS_ADDR0
             " --master-port 29500 --timeout " NETNS_TIMEOUT " " EMBER_BIN
             " train --data %s --out %s --layers 1"
             " --heads 1 --embd 16 --block 16 --batch 4 --iters %s --log-every 1 --eval-every 100000000"
             " --eval-iters 1",
             p->ns[node], node, at(p, "corpus.txt"), at(p, "run"), iters);
    char *argv[64];
    int argc = 0;
    for (char *tok = strtok(cmd, " "); tok && argc < 63; tok = strtok(NULL, " ")) argv[argc++] = tok;
    argv[argc] = NULL;
    const char *log = at(p, node ? "node1.log" : "node0.log");
    pid_t pid = fork();
    if (pid < 0) th_fail(__FILE__, __LINE__, "fork failed");
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0) dup2(in, 0);
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* The last n lines of text (for messages). */
static const char *tail_of(const char *text, int n)
{
    const char *s = text + strlen(text);
    while (s > text && s[-1] == '\n') s--;
    for (int k = 0; s > text; s--)
        if (s[-1] == '\n' && ++k == n) break;
    return s;
}

/* The whole of dir/name, NUL-terminated (static buffer per node). */
static const char *read_log(const netns_pair *p, int node)
{
    static char buf[2][1 << 16];
    char *b = buf[node];
    b[0] = '\0';
    FILE *f = fopen(at(p, node ? "node1.log" : "node0.log"), "r");
    if (!f) return b;
    /* only the tail matters: the last lines say how it ended */
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)sizeof buf[0] - 1 ? size - (long)sizeof buf[0] + 1 : 0, SEEK_SET);
    size_t n = fread(b, 1, sizeof buf[0] - 1, f);
    b[n] = '\0';
    fclose(f);
    return b;
}

/* Waits until pid exits or the deadline passes: its exit status (128+N on
 * signal N), or -1 if it still runs. */
static int wait_until(pid_t pid, double deadline)
{
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0 && errno != EINTR) return -1;
        if (now_s() >= deadline) return -1;
        usleep(20000);
    }
}

/* The pids still in namespace ns, as text ("" when none). */
static const char *pids_in(const char *ns)
{
    static char buf[512];
    th_run_result *r = th_run("/bin/sh", "-c", "ip netns pids \"$0\" | tr '\\n' ' '", ns, NULL);
    snprintf(buf, sizeof buf, "%.*s", (int)sizeof buf - 1, r->out);
    return buf;
}

/* The last line of text containing needle, or "". */
static const char *line_with(const char *text, const char *needle)
{
    static char buf[1024];
    buf[0] = '\0';
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) {
        const char *s = p;
        while (s > text && s[-1] != '\n') s--;
        snprintf(buf, sizeof buf, "%.*s", (int)strcspn(s, "\n"), s);
    }
    return buf;
}

/* Runs scenario(p) in a child and removes the namespaces whatever became of
 * it; the child's failure or skip (already reported) becomes this test's. */
static void with_pair(void (*scenario)(netns_pair *))
{
    netns_pair p;
    pair_up(&p);
    write_corpus(&p);
    setenv("EMBER_STORE_TOKEN", "netns-test-token-0123456789", 1); /* a 2-node job needs one */
    setenv("EMBER_TRANSPORT", "tcp", 1);
    setenv("EMBER_NUM_THREADS", "1", 1);
    setenv("XDG_CONFIG_HOME", p.dir, 1); /* no config file: the flags say everything */
    const char *clear[] = {"EMBER_CONFIG_FILE", "EMBER_GRAD_ACCUM",    "EMBER_MIXED_PRECISION",
                           "EMBER_TIMEOUT",     "EMBER_SPLIT_BATCHES", "EMBER_EVEN_BATCHES"};
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) unsetenv(clear[i]);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        scenario(&p);
        _exit(0);
    }
    int st = pid > 0 ? wait_until(pid, now_s() + 60) : -1;
    if (st < 0 && pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    pair_down(&p);
    if (st == 0) return;
    if (st == 77) _exit(77);          /* the child's th_skip wrote the reason */
    if (st > 0 && st < 128) _exit(1); /* the child's th_fail wrote the message */
    th_fail(__FILE__, __LINE__, st < 0 ? "the scenario ran over 60 s" : "the scenario died (status %d)", st);
}

/* ---- the tests -------------------------------------------------------------------- */

static void train_to_the_end(netns_pair *p)
{
    pid_t n0 = start_node(p, 0, "30"), n1 = start_node(p, 1, "30");
    double deadline = now_s() + 40;
    int s0 = wait_until(n0, deadline), s1 = wait_until(n1, deadline);
    const char *l0 = read_log(p, 0), *l1 = read_log(p, 1);
    if (s0 != 0 || s1 != 0)
        th_fail(__FILE__, __LINE__, "node 0 exited %d, node 1 exited %d\nnode 0: %s\nnode 1: %s", s0, s1,
                tail_of(l0, 4), tail_of(l1, 4));
    CHECK(strstr(l0, "[rank 0] step 30/30 loss") != NULL);
    CHECK(strstr(l0, "ember train: done") != NULL);
    char model[PATH_MAX];
    snprintf(model, sizeof model, "%s", at(p, "run/model.safetensors"));
    CHECK(access(model, R_OK) == 0);
}

TEST(test_netns_two_nodes_over_a_veth_link_train_to_the_end) { with_pair(train_to_the_end); }

static void cut_mid_run(netns_pair *p)
{
    pid_t n0 = start_node(p, 0, "1000000"), n1 = start_node(p, 1, "1000000");
    /* mid-run: once node 0 has printed step 20 */
    for (double t0 = now_s(); !strstr(read_log(p, 0), "[rank 0] step 20/"); usleep(20000))
        if (now_s() - t0 > 30)
            th_fail(__FILE__, __LINE__, "no step 20 after 30 s\nnode 0: %s\nnode 1: %s",
                    tail_of(read_log(p, 0), 4), tail_of(read_log(p, 1), 4));
    char err[512];
    if (!sh(err, sizeof err, "ip -n %s link set %s down", p->ns[0], p->dev[0]))
        th_fail(__FILE__, __LINE__, "cutting the link failed: %s", err);
    double cut = now_s(), limit = atof(NETNS_TIMEOUT) + 3.0;
    int s0 = wait_until(n0, cut + limit), s1 = wait_until(n1, cut + limit);
    double took = now_s() - cut;
    const char *l0 = read_log(p, 0), *l1 = read_log(p, 1);
    if (s0 < 0 || s1 < 0)
        th_fail(__FILE__, __LINE__,
                "%.1f s after the cut node 0 %s and node 1 %s (timeout " NETNS_TIMEOUT
                " s)\nnode 0: %s\nnode 1: %s",
                took, s0 < 0 ? "still runs" : "exited", s1 < 0 ? "still runs" : "exited", tail_of(l0, 4),
                tail_of(l1, 4));
    if (s0 != 1 || s1 != 1)
        th_fail(__FILE__, __LINE__,
                "node 0 exited %d, node 1 exited %d (want 1 and 1)\nnode 0: %s\nnode 1: %s", s0, s1,
                tail_of(l0, 4), tail_of(l1, 4));
    /* each names the peer it lost */
    char e0[1024], e1[1024];
    snprintf(e0, sizeof e0, "%s", line_with(l0, "[rank 0] ember train:"));
    snprintf(e1, sizeof e1, "%s", line_with(l1, "[rank 1] ember train:"));
    if (!strstr(e0, "rank 1") || !strstr(e1, "rank 0"))
        th_fail(__FILE__, __LINE__, "errors do not name the peer:\nnode 0: %s\nnode 1: %s", e0, e1);
    CHECK(strstr(l0, "ember launch: rank 0 exited with status 1") != NULL);
    CHECK(strstr(l1, "ember launch: rank 1 exited with status 1") != NULL);
    /* nothing left in either namespace */
    const char *left[2];
    for (int k = 0; k < 2; k++) {
        for (double t0 = now_s(); (left[k] = pids_in(p->ns[k]))[0] && now_s() - t0 < 2; usleep(50000)) {
        }
        if (left[k][0]) th_fail(__FILE__, __LINE__, "processes left in node %d's namespace: %s", k, left[k]);
    }
}

TEST(test_netns_link_cut_mid_run_fails_both_nodes_naming_the_peer_within_the_timeout)
{
    with_pair(cut_mid_run);
}

/* ---- mpirun with a hostfile ---------------------------------------------------------
 * mpirun runs in node 0's namespace; the hostfile names the two addresses,
 * one slot each. OpenMPI starts its daemon on the other "machine" through an
 * rsh agent: instead of ssh, a script that enters the namespace the address
 * belongs to. Each namespace also gets its own UTS namespace and hostname
 * (ember-node0/1): both share this host's name otherwise, and OpenMPI would
 * take them for one node. Its own traffic (oob, and the btl of an MPI
 * transport) is held to the veth subnet. The ranks find their rank and world
 * in OMPI_COMM_WORLD_*, and the store at MASTER_ADDR (node 0; rank 0 hosts
 * it) given with -x: more than one machine needs it unless the transport is
 * MPI. */

#define NETNS_SUBNET "10.213.13.0/30"

/* Writes dir/agent.sh and dir/hosts. */
static void write_mpirun_files(const netns_pair *p)
{
    FILE *f = fopen(at(p, "agent.sh"), "w");
    if (!f) th_fail(__FILE__, __LINE__, "cannot write the rsh agent");
    fprintf(f,
            "#!/bin/sh\n"
            "# mpirun's rsh agent: HOST COMMAND... runs COMMAND in HOST's namespace, as ssh would on HOST\n"
            "host=$1; shift\n"
            "case $host in\n" NETNS_ADDR0 ") ns=%s name=ember-node0 ;;\n" NETNS_ADDR1
            ") ns=%s name=ember-node1 ;;\n"
            "*) echo \"agent: unknown host $host\" >&2; exit 1 ;;\n"
            "esac\n"
            "exec ip netns exec \"$ns\" unshare --uts sh -c \"hostname $name && exec $*\"\n",
            p->ns[0], p->ns[1]);
    fclose(f);
    chmod(at(p, "agent.sh"), 0755);
    f = fopen(at(p, "hosts"), "w");
    if (!f) th_fail(__FILE__, __LINE__, "cannot write the hostfile");
    fprintf(f, NETNS_ADDR0 " slots=1\n" NETNS_ADDR1 " slots=1\n");
    fclose(f);
}

#define TINY_TRAIN                                                                                           \
    "train --layers 1 --heads 1 --embd 16 --block 16 --batch 4 --iters 6 --log-every 1 --eval-every "        \
    "100000000 "                                                                                             \
    "--eval-iters 1"

/* A 2-machine `mpirun --hostfile` job of ember train with EMBER_TRANSPORT
 * = transport; its losses and gradient norms (metrics.jsonl: stdout is a
 * terminal under mpirun, so it shows a bar) equal a local `ember launch -n 2`'s. */
static void mpirun_job(netns_pair *p, const char *transport)
{
    /* Under ASan, a rank that initialised OpenMPI exits 1 from LeakSanitizer:
     * OpenMPI leaks by design (tests/test_mpi.c says more). Address and UB
     * checks stay on. */
    static const char no_leak_checks[] =
        " -x ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 -x LSAN_OPTIONS=detect_leaks=0";
    if (!sh(NULL, 0, "command -v mpirun >/dev/null && command -v unshare >/dev/null"))
        th_skip("needs OpenMPI's mpirun and util-linux's unshare");
    write_mpirun_files(p);
    char cmd[4096], want[2048], got[2048];
    snprintf(cmd, sizeof cmd, EMBER_BIN " launch -n 2 " EMBER_BIN " " TINY_TRAIN " --data %s --out %s",
             at(p, "corpus.txt"), at(p, "launch"));
    th_run_result *r = th_run("/bin/sh", "-c", cmd, NULL);
    CHECK_EXIT(r, 0);
    th_train_steps(at(p, "launch"), want, sizeof want);
    CHECK(strstr(want, "\n6 ") != NULL);
    snprintf(
        cmd, sizeof cmd,
        "exec ip netns exec %s unshare --uts sh -c 'hostname ember-node0 && exec timeout 40 mpirun "
        "--allow-run-as-root --hostfile %s -n 2 --mca plm_rsh_agent %s --mca oob_tcp_if_include " NETNS_SUBNET
        " --mca btl tcp,self --mca btl_tcp_if_include " NETNS_SUBNET
        " -x EMBER_TRANSPORT=%s%s -x MASTER_ADDR=" NETNS_ADDR0
        " -x MASTER_PORT=29501 -x EMBER_NUM_THREADS=1 " EMBER_BIN " " TINY_TRAIN " --data %s --out %s'",
        p->ns[0], at(p, "hosts"), at(p, "agent.sh"), transport,
        strcmp(transport, "mpi") ? "" : no_leak_checks, at(p, "corpus.txt"), at(p, "mpirun"));
    r = th_run("/bin/sh", "-c", cmd, NULL);
    char both[2 * sizeof r->out];
    snprintf(both, sizeof both, "%s%s", r->out, r->err);
    if (r->status != 0 && strstr(both, "EMBER_TRANSPORT='mpi' must be"))
        th_skip("this ember has no MPI transport (EMBER_TRANSPORT=mpi is refused)");
    if (r->status != 0)
        th_fail(__FILE__, __LINE__, "mpirun exited %d\nstdout: %s\nstderr: %s", r->status, tail_of(r->out, 6),
                tail_of(r->err, 6));
    if (!strstr(r->out, "(2 on each of 2 processes)") || !strstr(r->out, "ember train: done"))
        th_fail(__FILE__, __LINE__, "rank 0 did not train as one of 2 processes to the end:\n%s", r->out);
    th_train_steps(at(p, "mpirun"), got, sizeof got);
    if (strcmp(got, want))
        th_fail(__FILE__, __LINE__,
                "mpirun's losses differ from ember launch's:\nmpirun:\n%sember launch:\n%s", got, want);
}

static void mpirun_tcp(netns_pair *p) { mpirun_job(p, "tcp"); }
static void mpirun_mpi(netns_pair *p) { mpirun_job(p, "mpi"); }

TEST(test_netns_mpirun_hostfile_two_machines_over_tcp_match_ember_launch_losses) { with_pair(mpirun_tcp); }

/* The same job on ember's MPI transport; skips while ember is built without one. */
TEST(test_netns_mpirun_hostfile_two_machines_over_mpi_match_ember_launch_losses) { with_pair(mpirun_mpi); }
