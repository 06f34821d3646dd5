/* bench_python.h — how the benchmarks find the Python that runs their
 * PyTorch reference, and how they run a child process and read what it
 * printed and how much memory it took. Header-only (static), like
 * bench_util.h.
 *
 * Where the reference comes from, first match wins:
 *   1. EMBER_BENCH_PYTHON, a python executable (e.g. a venv's bin/python).
 *      When it is set but cannot run, that is said and no other is tried.
 *   2. bench/.venv/bin/python in the source tree (bench/setup_torch.sh makes
 *      it; .gitignore keeps it out of git).
 *   3. /usr/bin/python3, where Debian's python3-torch (PyTorch 1.13) is a
 *      fallback only, printed as such.
 * The reference should be PyTorch 2: `bash bench/setup_torch.sh` (README.md, Quick start). */
#ifndef EMBER_BENCH_PYTHON_H
#define EMBER_BENCH_PYTHON_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* What a child printed and what it cost. */
typedef struct bench_child {
    char out[4096]; /* its stdout, NUL-terminated (truncated to fit) */
    char err[256];  /* the last non-empty line of its stderr, or "" */
    int status;     /* waitpid status */
    double rss_mb;  /* ru_maxrss of the child (wait4), in MB */
} bench_child;

/* The last non-empty line of the file open at fd (from its last 4 KiB) into out. */
static inline void bench_last_line(int fd, char *out, size_t cap)
{
    out[0] = '\0';
    off_t end = lseek(fd, 0, SEEK_END);
    if (end <= 0) return;
    char buf[4096];
    off_t from = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t n = pread(fd, buf, (size_t)(end - from), from);
    if (n <= 0) return;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\r')) n--;
    buf[n] = '\0';
    const char *nl = strrchr(buf, '\n'), *line = nl ? nl + 1 : buf;
    size_t len = strlen(line) < cap ? strlen(line) : cap - 1;
    memcpy(out, line, len);
    out[len] = '\0';
}

/* Runs a child and waits for it: argv (argv[0] a path) through execv, or,
 * when argv is NULL, fn(arg, fd) in a fork that writes its result to fd.
 * The peak resident memory comes from wait4's ru_maxrss of that child, so
 * every side of a benchmark is measured the same way. Returns 0 when the
 * child exited with status 0. */
static inline int bench_run_child(char *const *argv, int (*fn)(void *arg, int fd), void *arg, bench_child *c)
{
    memset(c, 0, sizeof *c);
    int fd[2];
    if (pipe(fd)) return -1;
    char errpath[] = "/tmp/ember-bench-stderr-XXXXXX";
    int errfd = mkstemp(errpath);
    if (errfd >= 0) unlink(errpath);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        if (errfd >= 0) close(errfd);
        return -1;
    }
    if (pid == 0) {
        close(fd[0]);
        if (argv) {
            dup2(fd[1], 1);
            if (errfd >= 0) dup2(errfd, 2);
            execv(argv[0], argv);
            dprintf(2, "cannot run %s\n", argv[0]);
            _exit(127);
        }
        /* exit, not _exit: the atexit handlers run, so EMBER_PROFILE=1 prints
         * the table of ember's child (the parent's records were dropped at fork) */
        exit(fn(arg, fd[1]) ? 1 : 0);
    }
    close(fd[1]);
    size_t len = 0;
    char sink[4096]; /* what does not fit in c->out is read and dropped, so the child never blocks */
    for (;;) {
        bool room = len < sizeof c->out - 1;
        ssize_t got =
            room ? read(fd[0], c->out + len, sizeof c->out - 1 - len) : read(fd[0], sink, sizeof sink);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        if (room) len += (size_t)got;
    }
    c->out[len] = '\0';
    close(fd[0]);
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &c->status, 0, &ru) < 0)
        if (errno != EINTR) return -1;
    c->rss_mb = (double)ru.ru_maxrss / 1024.0;
    if (errfd >= 0) {
        bench_last_line(errfd, c->err, sizeof c->err);
        close(errfd);
    }
    return WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0 ? 0 : 1;
}

/* The string value of "key" in a one-line JSON object (no escapes inside
 * the value: train_step_torch.py keeps quotes and backslashes out), or "". */
static inline const char *bench_json_str(const char *json, const char *key, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = strstr(json, pat);
    out[0] = '\0';
    if (!p) return out;
    p += strlen(pat);
    const char *q = strchr(p, '"');
    size_t n = q ? (size_t)(q - p) : strlen(p);
    snprintf(out, cap, "%.*s", (int)n, p);
    return out;
}

/* The number value of "key" in a one-line JSON object, or -1. */
static inline double bench_json_num(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(json, pat);
    return p ? atof(p + strlen(pat)) : -1;
}

/* The reference found by bench_find_python. */
typedef struct bench_python {
    char path[1024];   /* the python executable; "" when there is none */
    const char *how;   /* "EMBER_BENCH_PYTHON", "bench/.venv" or "/usr/bin/python3" */
    char version[64];  /* torch.__version__ */
    char build[256];   /* MKL, oneDNN, CPU capability */
    char fused[300];   /* "yes" or "no: why" */
    char compile[300]; /* "yes" or "no: why" */
    bool fallback;     /* PyTorch 1.x: not the reference the issue asks for */
    char why[512];     /* when path is "": what was tried */
} bench_python;

/* Asks `python` to run `script --info`; fills *py and returns 0 when it
 * imports torch, else writes why into py->why. */
static inline int bench_probe_python(const char *python, const char *script, bench_python *py)
{
    char *argv[] = {(char *)python, (char *)script, "--info", NULL};
    bench_child c;
    int rc = bench_run_child(argv, NULL, NULL, &c);
    char buf[300];
    if (rc || !strstr(c.out, "\"torch\": ")) {
        const char *why = bench_json_str(c.out, "error", buf, sizeof buf);
        snprintf(py->why + strlen(py->why), sizeof py->why - strlen(py->why), "%s%s: %s",
                 py->why[0] ? "; " : "", python,
                 why[0]     ? why
                 : c.err[0] ? c.err
                            : "does not run");
        return 1;
    }
    snprintf(py->path, sizeof py->path, "%s", python);
    bench_json_str(c.out, "torch", py->version, sizeof py->version);
    bench_json_str(c.out, "build", py->build, sizeof py->build);
    bench_json_str(c.out, "fused", py->fused, sizeof py->fused);
    bench_json_str(c.out, "compile", py->compile, sizeof py->compile);
    py->fallback = atoi(py->version) < 2;
    return 0;
}

/* Finds the reference's python (the order is at the top of this file);
 * `bench_dir` is the source tree's bench/ folder, `script` the Python file
 * whose --info answers the probe. Returns 0 when one imports torch. */
static inline int bench_find_python(const char *bench_dir, const char *script, bench_python *py)
{
    memset(py, 0, sizeof *py);
    const char *env = getenv("EMBER_BENCH_PYTHON");
    if (env && env[0]) {
        py->how = "EMBER_BENCH_PYTHON";
        return bench_probe_python(env, script, py);
    }
    char venv[1024];
    snprintf(venv, sizeof venv, "%s/.venv/bin/python", bench_dir);
    if (access(venv, X_OK) == 0) {
        py->how = "bench/.venv";
        if (!bench_probe_python(venv, script, py)) return 0;
    }
    py->how = "/usr/bin/python3";
    return bench_probe_python("/usr/bin/python3", script, py);
}

#endif
