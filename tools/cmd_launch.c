/* cmd_launch.c — `ember launch`: runs PROGRAM as the workers of one
 * distributed job on this machine, torchrun-style.
 *
 * Settings come from the config file (`ember config` writes it) and flags
 * override them. The node of rank 0 hosts the rendezvous store; each worker
 * gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT, GROUP_RANK, EMBER_NNODES, EMBER_STORE_TOKEN and
 * EMBER_RESTART_COUNT, plus the training settings the Accelerator reads
 * (EMBER_MIXED_PRECISION, EMBER_GRAD_ACCUM, EMBER_SPLIT_BATCHES,
 * EMBER_EVEN_BATCHES, EMBER_TIMEOUT) unless our own environment already
 * sets them and no flag does. launch_group.c runs each attempt; on a
 * failure the whole group is restarted up to --max-restarts times.
 *
 * Exit status: 0 every worker exited 0; 1 a worker failed (after the
 * restarts) or the job could not start; 2 bad usage; 128+N when stopped by
 * signal N. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "ember/ember.h"
#include "launch_impl.h"

extern char **environ;

static int usage(FILE *f)
{
    fprintf(f,
            "usage: ember launch [options] PROGRAM [ARGS...]\n"
            "Runs PROGRAM as N processes of one distributed job (torchrun's conventions). Each gets\n"
            "RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK,\n"
            "EMBER_NNODES, EMBER_STORE_TOKEN and EMBER_RESTART_COUNT; its output lines are prefixed\n"
            "\"[rank N] \". When a worker fails, the others get SIGTERM, then SIGKILL after the grace\n"
            "period, and the launch fails naming the rank. Defaults come from the config file\n"
            "(`ember config`); options override it.\n"
            "  -n, --nproc-per-node N     workers on this machine (config num_processes)\n"
            "  --nnodes M                 machines in the job (config num_machines)\n"
            "  --node-rank R              this machine's rank, 0..M-1 (config machine_rank)\n"
            "  --master-addr A            address of the machine of rank 0; used when M > 1 (a single\n"
            "                             machine's job runs on 127.0.0.1) (config main_process_ip)\n"
            "  --master-port P            the store's port; 0 = a free one, one machine only\n"
            "                             (config main_process_port)\n"
            "  --max-restarts K           restart the whole group up to K times after a failure\n"
            "  --grace S                  seconds between SIGTERM and SIGKILL when stopping (default 5)\n"
            "  --no-prefix                workers write straight to our stdout/stderr\n"
            "  --config-file PATH         read PATH instead of the default config file (it must exist)\n"
            "  --mixed-precision no|bf16|fp16, --gradient-accumulation-steps K, --timeout S,\n"
            "  --split-batches, --no-split-batches, --even-batches, --no-even-batches\n"
            "                             passed to the workers as EMBER_MIXED_PRECISION, EMBER_GRAD_ACCUM,\n"
            "                             EMBER_TIMEOUT, EMBER_SPLIT_BATCHES, EMBER_EVEN_BATCHES\n"
            "With M > 1, run it on every machine with the same EMBER_STORE_TOKEN exported (a secret of\n"
            "at least 16 characters). Workers read stdin from /dev/null; EMBER_NUM_THREADS defaults to\n"
            "the cores divided among the workers. Exit status: 0 all workers exited 0, 1 a worker\n"
            "failed (every restart used) or the job could not start, 2 bad usage, 128+N on signal N.\n");
    return f == stderr ? 2 : 0;
}

/* ---- flags ------------------------------------------------------------------------- */

typedef struct launch_opts {
    em_config cfg;
    double grace_s;
    bool prefix;
    const char *config_file; /* --config-file, or NULL for the default path */
    /* training settings given as flags (they beat our environment) */
    bool set_precision, set_accum, set_timeout, set_split, set_even;
    int prog; /* index of PROGRAM in argv */
} launch_opts;

static bool bad_value(const char *flag, const char *v, const char *want)
{
    fprintf(stderr, "ember launch: %s: bad value '%s' (want %s)\n", flag, v, want);
    return false;
}

static bool int_flag(const char *flag, const char *v, long lo, long hi, int *out, const char *want)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || !v[0] || *end || x < lo || x > hi) return bad_value(flag, v, want);
    *out = (int)x;
    return true;
}

static bool seconds_flag(const char *flag, const char *v, double *out, bool zero_ok)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || !v[0] || *end || !(zero_ok ? x >= 0 : x > 0) || isinf(x))
        return bad_value(flag, v, zero_ok ? "seconds >= 0" : "seconds > 0");
    *out = x;
    return true;
}

/* Flags that take a value, each with its torchrun spelling where it has one. */
static const char *canonical(const char *name)
{
    static const char *const pairs[][2] = {
        {"-n", "--nproc-per-node"},
        {"--nproc-per-node", "--nproc-per-node"},
        {"--nproc_per_node", "--nproc-per-node"},
        {"--nnodes", "--nnodes"},
        {"--node-rank", "--node-rank"},
        {"--node_rank", "--node-rank"},
        {"--master-addr", "--master-addr"},
        {"--master_addr", "--master-addr"},
        {"--master-port", "--master-port"},
        {"--master_port", "--master-port"},
        {"--max-restarts", "--max-restarts"},
        {"--max_restarts", "--max-restarts"},
        {"--grace", "--grace"},
        {"--config-file", "--config-file"},
        {"--mixed-precision", "--mixed-precision"},
        {"--gradient-accumulation-steps", "--gradient-accumulation-steps"},
        {"--timeout", "--timeout"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (!strcmp(name, pairs[i][0])) return pairs[i][1];
    return NULL;
}

static bool apply(launch_opts *o, const char *flag, const char *v)
{
    em_config *c = &o->cfg;
    if (!strcmp(flag, "--nproc-per-node"))
        return int_flag(flag, v, 1, 1 << 16, &c->num_processes, "an integer >= 1");
    if (!strcmp(flag, "--nnodes")) return int_flag(flag, v, 1, 1 << 16, &c->num_machines, "an integer >= 1");
    if (!strcmp(flag, "--node-rank"))
        return int_flag(flag, v, 0, 1 << 16, &c->machine_rank, "an integer >= 0");
    if (!strcmp(flag, "--master-port"))
        return int_flag(flag, v, 0, 65535, &c->main_process_port, "a port 0..65535");
    if (!strcmp(flag, "--max-restarts"))
        return int_flag(flag, v, 0, 1000000, &c->max_restarts, "an integer >= 0");
    if (!strcmp(flag, "--grace")) return seconds_flag(flag, v, &o->grace_s, true);
    if (!strcmp(flag, "--timeout")) return o->set_timeout = true, seconds_flag(flag, v, &c->timeout_s, false);
    if (!strcmp(flag, "--gradient-accumulation-steps"))
        return o->set_accum = true, int_flag(flag, v, 1, INT_MAX, &c->grad_accum, "an integer >= 1");
    if (!strcmp(flag, "--mixed-precision")) {
        o->set_precision = true;
        if (strcmp(v, "no") && strcmp(v, "bf16") && strcmp(v, "fp16"))
            return bad_value(flag, v, "no, bf16 or fp16");
        return em_precision_parse(v, &c->mixed_precision) == EM_OK;
    }
    if (!strcmp(flag, "--master-addr")) {
        size_t n = strlen(v);
        if (n == 0 || n >= sizeof c->main_process_ip ||
            strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:") != n)
            return bad_value(flag, v, "a host name or address");
        memcpy(c->main_process_ip, v, n + 1);
        return true;
    }
    return true; /* --config-file: taken in the first pass */
}

static bool is_switch(const char *a)
{
    return !strcmp(a, "--no-prefix") || !strcmp(a, "--split-batches") || !strcmp(a, "--no-split-batches") ||
           !strcmp(a, "--even-batches") || !strcmp(a, "--no-even-batches");
}

/* Splits "--flag=value"; name gets the flag part. Returns the value or NULL. */
static const char *split_eq(const char *a, char *name, size_t n)
{
    const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
    snprintf(name, n, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
    return eq ? eq + 1 : NULL;
}

/* Returns 0 to run, 2 for bad usage (printed), -1 after --help. Reads the
 * config file between the passes: flags override it. */
static int parse(int argc, char **argv, launch_opts *o)
{
    *o = (launch_opts){.grace_s = 5.0, .prefix = true, .prog = -1};
    char name[64];
    /* pass 1: shape of every flag, --help, --config-file, where PROGRAM starts */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            o->prog = i + 1;
            break;
        }
        if (a[0] != '-' || !a[1]) {
            o->prog = i;
            break;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout) - 1;
        if (is_switch(a)) continue;
        const char *v = split_eq(a, name, sizeof name);
        const char *flag = canonical(name);
        if (!flag) {
            fprintf(stderr, "ember launch: unknown flag '%s' (see ember launch --help)\n", a);
            return 2;
        }
        if (!v && i + 1 >= argc) {
            fprintf(stderr, "ember launch: %s needs a value\n", name);
            return 2;
        }
        if (!v) v = argv[++i];
        if (!strcmp(flag, "--config-file")) o->config_file = v;
    }
    if (o->prog < 0 || o->prog >= argc) {
        fprintf(stderr,
                "ember launch: no PROGRAM to run (usage: ember launch [options] PROGRAM [ARGS...])\n");
        return 2;
    }

    o->cfg = em_config_defaults();
    if (em_config_load(o->config_file, &o->cfg) != EM_OK) {
        fprintf(stderr, "ember launch: %s\n", em_last_error());
        return 1;
    }

    /* pass 2: the values, in order */
    for (int i = 1; i < o->prog; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (!strcmp(a, "--no-prefix"))
            o->prefix = false;
        else if (!strcmp(a, "--split-batches") || !strcmp(a, "--no-split-batches"))
            o->cfg.split_batches = a[2] != 'n', o->set_split = true;
        else if (!strcmp(a, "--even-batches") || !strcmp(a, "--no-even-batches"))
            o->cfg.even_batches = a[2] != 'n', o->set_even = true;
        else {
            const char *v = split_eq(a, name, sizeof name);
            if (!v) v = argv[++i];
            if (!apply(o, canonical(name), v)) return 2;
        }
    }
    em_config *c = &o->cfg;
    if (c->machine_rank >= c->num_machines) {
        fprintf(stderr,
                "ember launch: node rank %d is not below the number of nodes %d (--node-rank, --nnodes)\n",
                c->machine_rank, c->num_machines);
        return 2;
    }
    if (c->main_process_port == 0 && c->num_machines > 1) {
        fprintf(stderr,
                "ember launch: --master-port 0 (a free port) works on one machine only; with --nnodes %d "
                "give every machine the same port\n",
                c->num_machines);
        return 2;
    }
    return 0;
}

/* ---- the program, the token, the environment -------------------------------------------- */

/* The file PROGRAM names: as given when it holds a '/', else the first
 * executable match in PATH. false + message when there is none. */
static bool resolve(const char *prog, char *out, size_t n)
{
    struct stat sb;
    if (strchr(prog, '/')) {
        if (stat(prog, &sb) != 0) {
            fprintf(stderr, "ember launch: cannot run %s: %s\n", prog, strerror(errno));
            return false;
        }
        if (!S_ISREG(sb.st_mode) || access(prog, X_OK) != 0) {
            fprintf(stderr, "ember launch: cannot run %s: not an executable file\n", prog);
            return false;
        }
        snprintf(out, n, "%s", prog);
        return true;
    }
    const char *path = getenv("PATH");
    if (!path || !path[0]) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(out, n, "%.*s/%s", (int)len, len ? p : ".", prog);
        if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode) && access(out, X_OK) == 0) return true;
        p += len;
        if (*p == ':') p++;
    }
    fprintf(stderr, "ember launch: cannot run %s: no executable of that name in PATH\n", prog);
    return false;
}

/* 32 hex characters from the kernel's random source. */
static bool make_token(char out[33])
{
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        got += (size_t)r;
    }
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return true;
}

/* The variables every worker gets (values differ by rank); the environment
 * passes on everything else. */
typedef struct env_plan {
    char *vars[24]; /* "K=V", malloc'd; rank-specific ones filled per worker */
    int n;
} env_plan;

static void plan_add(env_plan *p, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void plan_add(env_plan *p, const char *key, const char *fmt, ...)
{
    char val[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof val, fmt, ap);
    va_end(ap);
    size_t n = strlen(key) + strlen(val) + 2;
    char *kv = malloc(n);
    if (!kv) return;
    snprintf(kv, n, "%s=%s", key, val);
    p->vars[p->n++] = kv;
}

/* A setting the worker reads from the environment: ours stays unless a flag set it. */
static bool pass_setting(const char *key, bool flag_given) { return flag_given || !getenv(key); }

/* environ without the keys the plan sets, then the plan: a NULL-terminated
 * array whose strings are borrowed (environ's and the plan's). */
static char **build_env(const env_plan *p)
{
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **env = malloc((ne + (size_t)p->n + 1) * sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < ne; i++) {
        bool replaced = false;
        for (int j = 0; j < p->n && !replaced; j++) {
            size_t klen = (size_t)(strchr(p->vars[j], '=') - p->vars[j]);
            replaced = !strncmp(environ[i], p->vars[j], klen) && environ[i][klen] == '=';
        }
        if (!replaced) env[k++] = environ[i];
    }
    for (int j = 0; j < p->n; j++) env[k++] = p->vars[j];
    env[k] = NULL;
    return env;
}

/* ---- the command ------------------------------------------------------------------- */

typedef struct job {
    launch_opts o;
    char token[256];
    const char *addr;
    int port;
} job;

/* The plan for local rank i of attempt `restart`. */
static void plan_worker(const job *j, int i, int restart, env_plan *p)
{
    const em_config *c = &j->o.cfg;
    p->n = 0;
    plan_add(p, "RANK", "%d", c->machine_rank * c->num_processes + i);
    plan_add(p, "LOCAL_RANK", "%d", i);
    plan_add(p, "WORLD_SIZE", "%d", c->num_machines * c->num_processes);
    plan_add(p, "LOCAL_WORLD_SIZE", "%d", c->num_processes);
    plan_add(p, "GROUP_RANK", "%d", c->machine_rank);
    plan_add(p, "EMBER_NNODES", "%d", c->num_machines);
    plan_add(p, "MASTER_ADDR", "%s", j->addr);
    plan_add(p, "MASTER_PORT", "%d", j->port);
    plan_add(p, "EMBER_STORE_TOKEN", "%s", j->token);
    plan_add(p, "EMBER_RESTART_COUNT", "%d", restart);
    const launch_opts *o = &j->o;
    if (pass_setting("EMBER_MIXED_PRECISION", o->set_precision))
        plan_add(p, "EMBER_MIXED_PRECISION", "%s", em_precision_name(c->mixed_precision));
    if (pass_setting("EMBER_GRAD_ACCUM", o->set_accum)) plan_add(p, "EMBER_GRAD_ACCUM", "%d", c->grad_accum);
    if (pass_setting("EMBER_SPLIT_BATCHES", o->set_split))
        plan_add(p, "EMBER_SPLIT_BATCHES", "%d", c->split_batches ? 1 : 0);
    if (pass_setting("EMBER_EVEN_BATCHES", o->set_even))
        plan_add(p, "EMBER_EVEN_BATCHES", "%d", c->even_batches ? 1 : 0);
    if (pass_setting("EMBER_TIMEOUT", o->set_timeout)) plan_add(p, "EMBER_TIMEOUT", "%.17g", c->timeout_s);
    if (o->config_file) plan_add(p, "EMBER_CONFIG_FILE", "%s", o->config_file);
    if (!getenv("EMBER_NUM_THREADS")) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long t = cores / c->num_processes;
        plan_add(p, "EMBER_NUM_THREADS", "%ld", t < 1 ? 1 : t);
    }
}

/* Runs attempts until one succeeds, is interrupted, or the restarts run out. */
static int run_attempts(const job *j, const char *path, char **argv, int sigfd, const sigset_t *child_mask)
{
    const em_config *c = &j->o.cfg;
    int n = c->num_processes;
    env_plan *plans = calloc((size_t)n, sizeof *plans);
    char ***envs = calloc((size_t)n, sizeof *envs);
    if (!plans || !envs) {
        fprintf(stderr, "ember launch: out of memory\n");
        free(plans), free(envs);
        return 1;
    }
    int rc = 1;
    for (int restart = 0;; restart++) {
        bool built = true;
        for (int i = 0; i < n; i++) {
            plan_worker(j, i, restart, &plans[i]);
            envs[i] = build_env(&plans[i]);
            built = built && envs[i];
        }
        launch_outcome out = {.end = LAUNCH_ERROR};
        if (built) {
            launch_group g = {.nproc = n,
                              .first_rank = c->machine_rank * n,
                              .path = path,
                              .argv = argv,
                              .envs = envs,
                              .grace_s = j->o.grace_s,
                              .prefix = j->o.prefix,
                              .sigfd = sigfd,
                              .child_mask = *child_mask,
                              .store_addr = j->addr,
                              .store_token = j->token,
                              .store_port = j->port,
                              .restart = restart};
            out = launch_run(&g);
        } else {
            fprintf(stderr, "ember launch: out of memory\n");
        }
        for (int i = 0; i < n; i++) {
            free(envs[i]);
            for (int k = 0; k < plans[i].n; k++) free(plans[i].vars[k]);
        }
        if (out.end == LAUNCH_OK) {
            rc = 0;
            break;
        }
        if (out.end == LAUNCH_INTERRUPTED) {
            rc = 128 + out.signal;
            break;
        }
        if (out.end == LAUNCH_ERROR) break;
        if (restart >= c->max_restarts) {
            if (c->max_restarts > 0)
                fprintf(stderr, "ember launch: giving up after %d restart%s\n", c->max_restarts,
                        c->max_restarts == 1 ? "" : "s");
            break;
        }
        fprintf(stderr, "ember launch: restarting the group (restart %d of %d)\n", restart + 1,
                c->max_restarts);
    }
    free(plans);
    free(envs);
    return rc;
}

int cmd_launch(int argc, char **argv)
{
    /* EMBER_PROFILE profiles the workers; the launcher records nothing, so it writes no trace */
    em_profile_stop();
    job j = {0};
    int rc = parse(argc, argv, &j.o);
    if (rc) return rc < 0 ? 0 : rc;
    const em_config *c = &j.o.cfg;
    char path[PATH_MAX];
    if (!resolve(argv[j.o.prog], path, sizeof path)) return 1;

    if (c->num_machines > 1) {
        const char *t = getenv("EMBER_STORE_TOKEN");
        if (!t || strlen(t) < 16 || strlen(t) >= sizeof j.token) {
            fprintf(stderr,
                    "ember launch: a job on %d machines needs the same secret on every machine: export "
                    "EMBER_STORE_TOKEN (16 to 255 characters, e.g. from `openssl rand -hex 16`) on each "
                    "before running ember launch%s\n",
                    c->num_machines, t ? " (the one set is too short or too long)" : "");
            return 1;
        }
        snprintf(j.token, sizeof j.token, "%s", t);
        j.addr = c->main_process_ip;
    } else {
        if (!make_token(j.token)) {
            fprintf(stderr, "ember launch: cannot read random bytes for the store's token: %s\n",
                    strerror(errno));
            return 1;
        }
        j.addr = "127.0.0.1";
    }
    j.port = c->main_process_port;

    /* Signals arrive through a signalfd in launch_group.c's poll loop: block
     * them before the store's thread starts so that it inherits the mask. */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
    for (int k = 0; k < 3; k++) { /* one we were started ignoring (nohup, a background job) stays ignored */
        struct sigaction sa;
        if (sigaction(forwarded[k], NULL, &sa) == 0 && sa.sa_handler != SIG_IGN)
            sigaddset(&set, forwarded[k]);
    }
    sigprocmask(SIG_BLOCK, &set, &old);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill us while workers run */
    int sigfd = signalfd(-1, &set, SFD_CLOEXEC);
    if (sigfd < 0) {
        fprintf(stderr, "ember launch: signalfd: %s\n", strerror(errno));
        return 1;
    }

    em_store_server *store = NULL;
    if (c->machine_rank == 0) {
        const char *host = c->num_machines > 1 ? "0.0.0.0" : "127.0.0.1";
        store = em_store_server_start(host, j.port, j.token);
        if (!store) {
            fprintf(stderr, "ember launch: cannot host the store: %s\n", em_last_error());
            close(sigfd);
            return 1;
        }
        j.port = em_store_server_port(store);
    }
    rc = run_attempts(&j, path, argv + j.o.prog, sigfd, &old);
    em_store_server_stop(store);
    close(sigfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}
