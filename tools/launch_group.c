/* launch_group.c — one attempt of `ember launch` on this node: starts the
 * workers, relays their output line by line with a "[rank N] " prefix,
 * watches them, and stops them all when one fails or when we get a signal.
 *
 * Each worker leads its own process group, so kill(-pid, sig) reaches the
 * worker and every child it started. A worker's exit is first seen with
 * waitid(WNOWAIT): the zombie still holds its pid, so the group id cannot be
 * reused while we SIGKILL whatever the worker left in its group; only then
 * is it reaped. One poll() loop waits on a signalfd (SIGCHLD and the
 * signals we forward) and the workers' stdout/stderr pipes, so nothing here
 * runs in a signal handler. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ember/dist.h"
#include "launch_impl.h"

enum { LINE_MAX_BYTES = 64 * 1024 }; /* a longer line is cut into pieces of this size */

/* One of a worker's output pipes: what has come in since its last newline. */
typedef struct stream {
    int fd, to; /* read end (-1 once closed); 1 or 2 */
    char *buf;
    size_t len;
} stream;

typedef struct worker {
    pid_t pid; /* 0 once reaped (or never started) */
    int rank;
    stream s[2];
} worker;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *sig_name(int sig)
{
    static char buf[32];
    const char *abbrev = sigabbrev_np(sig);
    snprintf(buf, sizeof buf, "SIG%s", abbrev ? abbrev : "?");
    return buf;
}

/* ---- output --------------------------------------------------------------------- */

/* Writes the iovecs fully to fd; gives up quietly if fd is gone (EPIPE). */
static void write_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return;
        }
        while (n > 0 && (size_t)w >= iov->iov_len) w -= (ssize_t)iov->iov_len, iov++, n--;
        if (n > 0) iov->iov_base = (char *)iov->iov_base + w, iov->iov_len -= (size_t)w;
    }
}

/* "[rank N] " + line + "\n" in one writev, so lines of different ranks do not
 * interleave (line already ends in '\n' unless add_newline). */
static void emit_line(int to, int rank, const char *line, size_t n, bool add_newline)
{
    char prefix[32];
    int pn = snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    struct iovec iov[3] = {{prefix, (size_t)pn}, {(void *)line, n}, {"\n", 1}};
    write_all(to, iov, add_newline ? 3 : 2);
}

/* Prints the complete lines in s->buf and keeps the rest. */
static void emit_lines(stream *s, int rank)
{
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n') continue;
        emit_line(s->to, rank, s->buf + start, i + 1 - start, false);
        start = i + 1;
    }
    if (start == 0 && s->len == LINE_MAX_BYTES) { /* no newline in a full buffer: cut the line here */
        emit_line(s->to, rank, s->buf, s->len, true);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

/* Prints a partial last line (with a newline added) and closes the pipe. */
static void close_stream(stream *s, int rank)
{
    if (s->fd < 0) return;
    if (s->len) emit_line(s->to, rank, s->buf, s->len, true);
    s->len = 0;
    close(s->fd);
    s->fd = -1;
}

/* Reads what the pipe has; EOF or an error closes it. */
static void pump(stream *s, int rank)
{
    ssize_t r = read(s->fd, s->buf + s->len, LINE_MAX_BYTES - s->len);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (r <= 0) {
        close_stream(s, rank);
        return;
    }
    s->len += (size_t)r;
    emit_lines(s, rank);
}

/* ---- starting ------------------------------------------------------------------- */

/* Forks worker i. In the child: its own process group, SIGKILL if we die,
 * stdin from /dev/null, stdout/stderr into the pipes (when prefixing), the
 * signal mask we were started with, then exec. An exec failure is sent back
 * through a close-on-exec pipe so we can name its reason. false + message
 * when fork or pipe fail. */
static bool spawn(const launch_group *g, int i, worker *w, const sigset_t *child_mask)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1}, report[2] = {-1, -1};
    const char *failed = NULL;
    if (pipe2(report, O_CLOEXEC) != 0 ||
        (g->prefix && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)))
        failed = "pipe";
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = failed ? -1 : fork();
    if (pid < 0) {
        fprintf(stderr, "ember launch: cannot start rank %d: %s: %s\n", w->rank, failed ? failed : "fork",
                strerror(errno));
        int fds[] = {out[0], out[1], err[0], err[1], report[0], report[1]};
        for (int k = 0; k < 6; k++)
            if (fds[k] >= 0) close(fds[k]);
        return false;
    }
    if (pid == 0) { /* only async-signal-safe calls from here: the store's thread may hold locks */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1); /* we died before the line above */
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, 0);
        if (g->prefix) dup2(out[1], 1), dup2(err[1], 2);
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigaction(SIGPIPE, &dfl, NULL);
        sigprocmask(SIG_SETMASK, child_mask, NULL);
        execve(g->path, g->argv, g->envs[i]);
        int e = errno;
        ssize_t wr = write(report[1], &e, sizeof e);
        (void)wr;
        _exit(127);
    }
    setpgid(pid, pid); /* also here, so the group exists before we ever signal it */
    w->pid = pid;
    close(report[1]);
    int e = 0;
    ssize_t r;
    while ((r = read(report[0], &e, sizeof e)) < 0 && errno == EINTR) {
    }
    close(report[0]);
    if (r == (ssize_t)sizeof e)
        fprintf(stderr, "ember launch: rank %d: cannot run %s: %s\n", w->rank, g->path, strerror(e));
    if (g->prefix) {
        close(out[1]);
        close(err[1]);
        w->s[0] = (stream){.fd = out[0], .to = 1, .buf = malloc(LINE_MAX_BYTES)};
        w->s[1] = (stream){.fd = err[0], .to = 2, .buf = malloc(LINE_MAX_BYTES)};
        for (int k = 0; k < 2; k++) fcntl(w->s[k].fd, F_SETFL, O_NONBLOCK);
    }
    return true;
}

/* ---- watching and stopping ---------------------------------------------------------- */

typedef struct run_state {
    const launch_group *g;
    worker *w;
    int running;
    bool stopping, killed; /* SIGTERM (or the forwarded signal) sent / SIGKILL sent */
    double kill_at, drain_until;
    launch_outcome out;
} run_state;

static void signal_all(run_state *st, int sig)
{
    for (int i = 0; i < st->g->nproc; i++)
        if (st->w[i].pid > 0) kill(-st->w[i].pid, sig);
}

/* Sends sig to every worker group and arms the SIGKILL deadline. */
static void begin_stop(run_state *st, int sig)
{
    if (st->stopping) return;
    st->stopping = true;
    st->kill_at = now_s() + st->g->grace_s;
    signal_all(st, sig);
}

/* Notes in the job's store that a worker ended (best effort): a rank still
 * waiting to join a group with it then fails at once, naming it, instead of
 * waiting for its timeout (e.g. a worker that exited 0 before joining). */
static void note_exit(const launch_group *g, int rank, int status)
{
    if (!g->store_token) return;
    em_store *s = em_store_connect(g->store_addr, g->store_port, g->store_token, 2.0);
    char key[64], what[96];
    snprintf(key, sizeof key, "r%d/exited/%d", g->restart, rank);
    if (WIFEXITED(status))
        snprintf(what, sizeof what, "its process exited with status %d (ember launch saw it)",
                 WEXITSTATUS(status));
    else
        snprintf(what, sizeof what, "its process was killed by signal %d (%s) (ember launch saw it)",
                 WTERMSIG(status), sig_name(WTERMSIG(status)));
    if (s) em_store_set(s, key, what, strlen(what));
    em_store_close(s);
    em_clear_error();
}

/* Reaps every worker that has exited; the first failure is reported and
 * stops the rest. */
static void reap(run_state *st)
{
    for (;;) {
        siginfo_t info = {0};
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
        pid_t pid = info.si_pid;
        worker *w = NULL;
        for (int i = 0; i < st->g->nproc; i++)
            if (st->w[i].pid == pid) w = &st->w[i];
        if (w) kill(-pid, SIGKILL); /* what it left in its group; its zombie pins the group id */
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (!w) continue; /* not one of ours (cannot happen: we start no other children) */
        w->pid = 0;
        if (--st->running == 0) st->drain_until = now_s() + 2.0;
        if (st->running > 0 && !st->stopping) note_exit(st->g, w->rank, status);
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (ok || st->stopping) continue; /* a worker we stopped is not a failure */
        st->out = (launch_outcome){.end = LAUNCH_FAILED, .rank = w->rank};
        if (WIFEXITED(status)) {
            st->out.status = WEXITSTATUS(status);
            fprintf(stderr, "ember launch: rank %d exited with status %d\n", w->rank, st->out.status);
        } else {
            st->out.signal = WTERMSIG(status);
            fprintf(stderr, "ember launch: rank %d killed by signal %d (%s)\n", w->rank, st->out.signal,
                    sig_name(st->out.signal));
        }
        if (st->running > 0) {
            fprintf(stderr, "ember launch: stopping the other %d worker%s (SIGTERM, SIGKILL after %g s)\n",
                    st->running, st->running == 1 ? "" : "s", st->g->grace_s);
            begin_stop(st, SIGTERM);
        }
    }
}

/* A signal arrived through the signalfd. */
static void on_signal(run_state *st, int sig)
{
    if (sig == SIGCHLD) {
        reap(st);
        return;
    }
    if (st->stopping) { /* a second Ctrl-C: no more waiting */
        if (!st->killed) {
            fprintf(stderr, "ember launch: got %s again; sending SIGKILL\n", sig_name(sig));
            signal_all(st, SIGKILL);
        }
        st->killed = true;
        return;
    }
    if (st->out.end == LAUNCH_OK) st->out = (launch_outcome){.end = LAUNCH_INTERRUPTED, .signal = sig};
    fprintf(stderr, "ember launch: got %s; passing it to %d worker%s (SIGKILL after %g s)\n", sig_name(sig),
            st->running, st->running == 1 ? "" : "s", st->g->grace_s);
    begin_stop(st, sig);
}

static int ms_until(double t)
{
    double ms = (t - now_s()) * 1000.0;
    return ms <= 0 ? 0 : ms > 60000 ? 60000 : (int)ms + 1;
}

launch_outcome launch_run(const launch_group *g)
{
    int n = g->nproc;
    worker *w = calloc((size_t)n, sizeof *w);
    struct pollfd *pfd = calloc((size_t)(2 * n + 1), sizeof *pfd);
    stream **pstream = calloc((size_t)(2 * n + 1), sizeof *pstream);
    int *prank = calloc((size_t)(2 * n + 1), sizeof *prank);
    if (!w || !pfd || !pstream || !prank) {
        fprintf(stderr, "ember launch: out of memory\n");
        free(w), free(pfd), free(pstream), free(prank);
        return (launch_outcome){.end = LAUNCH_ERROR};
    }
    run_state st = {.g = g, .w = w};

    for (int i = 0; i < n; i++) {
        w[i].rank = g->first_rank + i;
        w[i].s[0].fd = w[i].s[1].fd = -1;
        if (!spawn(g, i, &w[i], &g->child_mask)) {
            st.out = (launch_outcome){.end = LAUNCH_ERROR};
            begin_stop(&st, SIGKILL);
            st.killed = true;
            break;
        }
        st.running++;
    }

    for (;;) {
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = g->sigfd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            for (int k = 0; k < 2; k++)
                if (w[i].s[k].fd >= 0) {
                    pstream[np] = &w[i].s[k];
                    prank[np] = w[i].rank;
                    pfd[np++] = (struct pollfd){.fd = w[i].s[k].fd, .events = POLLIN};
                }
        if (st.running == 0 && np == 1) break;
        int timeout = -1;
        if (st.running == 0)
            timeout = ms_until(st.drain_until); /* pipes held open by something that left its group */
        else if (st.stopping && !st.killed)
            timeout = ms_until(st.kill_at);
        int r = poll(pfd, (nfds_t)np, timeout);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "ember launch: poll: %s\n", strerror(errno));
            break;
        }
        if (st.stopping && !st.killed && st.running > 0 && now_s() >= st.kill_at) {
            fprintf(stderr, "ember launch: %d worker%s still running after %g s; sending SIGKILL\n",
                    st.running, st.running == 1 ? "" : "s", g->grace_s);
            signal_all(&st, SIGKILL);
            st.killed = true;
        }
        if (st.running == 0 && now_s() >= st.drain_until) break;
        if (r <= 0) continue;
        for (int k = 1; k < np; k++)
            if (pfd[k].revents) pump(pstream[k], prank[k]);
        if (pfd[0].revents & POLLIN) {
            struct signalfd_siginfo si[8];
            ssize_t got = read(g->sigfd, si, sizeof si);
            for (ssize_t k = 0; got > 0 && k < got / (ssize_t)sizeof si[0]; k++)
                on_signal(&st, (int)si[k].ssi_signo);
        }
    }
    /* a poll failure left workers behind: stop and reap them rather than orphan them */
    if (st.running > 0) {
        signal_all(&st, SIGKILL);
        for (int i = 0; i < n; i++)
            if (w[i].pid > 0) waitpid(w[i].pid, NULL, 0);
        st.out = (launch_outcome){.end = LAUNCH_ERROR};
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            close_stream(&w[i].s[k], w[i].rank);
            free(w[i].s[k].buf);
        }
    launch_outcome out = st.out;
    free(w), free(pfd), free(pstream), free(prank);
    return out;
}
