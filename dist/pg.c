/* pg.c — the process group: joining (addresses through the store, a TCP
 * connection per pair of ranks, authenticated with a secret rank 0 puts in
 * the store), the communication thread that runs calls in order, and the
 * socket primitives with deadlines that notice a dead peer. How every call
 * is checked against the other ranks' (the frames on the connections) is in
 * wire.c; the algorithms are in collectives.c and shm.c.
 *
 * Failure policy: the first failed call breaks the group. It sends a note
 * with its reason to every peer that reads a frame from it next (and writes
 * it in the shared segment), then closes its sockets at once, so peers
 * blocked on this rank fail within moments, naming the reason, instead of
 * waiting for their timeout; every later call fails fast with the first
 * error. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist_impl.h"
#include "dist/launch_env_impl.h"
#include "dist/pg_impl.h"
#include "ember_config.h"
#include "tensor/error_impl.h"
#include "tensor/profile_impl.h"

#define PG_MAGIC 0x656d6267u /* "embg" */

#if !EM_HAVE_MPI
static const char no_mpi[] =
    "this ember was built without MPI (install OpenMPI: apt-get install openmpi-bin libopenmpi-dev, "
    "then meson setup --reconfigure)";
#endif

double pg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int pg_ms_until(double deadline)
{
    double left = deadline - pg_now();
    if (left <= 0) return 0;
    return left > 1.0 ? 1000 : (int)(left * 1000) + 1;
}

static const char *kind_name(int k)
{
    static const char *names[] = {"?",      "all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                  "gather", "barrier",    "send",      "recv"};
    return k >= 1 && k <= CALL_RECV ? names[k] : "?";
}

static const char *op_name(int op)
{
    static const char *names[] = {"sum", "avg", "max", "min"};
    return op >= 0 && op <= EM_RED_MIN ? names[op] : "?";
}

void call_describe(const call_header *h, char *buf, size_t n)
{
    if (h->kind == CALL_BARRIER) {
        snprintf(buf, n, "barrier()");
        return;
    }
    int k = snprintf(buf, n, "%s(%s, %lld elements", kind_name(h->kind), em_dtype_name((em_dtype)h->dtype),
                     (long long)h->count);
    if (k < 0 || (size_t)k >= n) return;
    if (h->kind == CALL_ALL_REDUCE || h->kind == CALL_REDUCE_SCATTER)
        snprintf(buf + k, n - (size_t)k, ", %s)", op_name(h->op));
    else if (h->kind == CALL_BROADCAST || h->kind == CALL_GATHER)
        snprintf(buf + k, n - (size_t)k, ", root %d)", h->root);
    else if (h->kind == CALL_SEND)
        snprintf(buf + k, n - (size_t)k, ", to rank %d)", h->root);
    else if (h->kind == CALL_RECV)
        snprintf(buf + k, n - (size_t)k, ", from rank %d)", h->root);
    else
        snprintf(buf + k, n - (size_t)k, ")");
    size_t len = strlen(buf);
    if (h->cuda && len > 0 && len + 6 < n) memcpy(buf + len - 1, ", cuda)", 8); /* "..., cuda)" */
}

em_status call_fail(call *c, em_status s, const char *fmt, ...)
{
    if (c->status != EM_OK) return c->status; /* keep the first reason */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    c->status = s;
    return s;
}

em_status call_refail(call *c, em_status s, const char *fmt, ...)
{
    char msg[sizeof c->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(c->msg, msg, sizeof msg);
    c->status = s;
    return s;
}

/* ---- sockets with deadlines ------------------------------------------------------ */

em_status peer_io_error(em_pg *pg, call *c, int r, const char *what, int err)
{
    char desc[160];
    call_describe(&c->h, desc, sizeof desc);
    if (err == 0 || err == ECONNRESET || err == EPIPE)
        return call_fail(c, EM_ERR_DIST, "%s: rank %d lost the connection to rank %d while %s (did rank %d exit?)",
                         desc, pg->rank, r, what, r);
    return call_fail(c, EM_ERR_DIST, "%s: rank %d: %s rank %d failed: %s", desc, pg->rank, what, r, strerror(err));
}

em_status peer_timed_out(em_pg *pg, call *c, int r, const char *what)
{
    char desc[160];
    call_describe(&c->h, desc, sizeof desc);
    return call_fail(c, EM_ERR_TIMEOUT, "%s: rank %d waited %g s %s rank %d (is it stuck, or calling something else?)",
                     desc, pg->rank, pg->timeout, what, r);
}

em_status io_exchange(em_pg *pg, call *c, int sr, const void *sp, size_t sn, int rr, void *rp, size_t rn,
                      double deadline)
{
    const char *s = sp;
    char *d = rp;
    size_t sent = 0, got = 0;
    while (sent < sn || got < rn) {
        struct pollfd p[2];
        int np = 0, si = -1, ri = -1;
        if (sent < sn) {
            si = np;
            p[np++] = (struct pollfd){.fd = pg->fd[sr], .events = POLLOUT};
        }
        if (got < rn) {
            ri = np;
            p[np++] = (struct pollfd){.fd = pg->fd[rr], .events = POLLIN};
        }
        int k = poll(p, (nfds_t)np, pg_ms_until(deadline));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return peer_io_error(pg, c, sent < sn ? sr : rr, "waiting on", errno);
        if (k == 0) {
            if (pg_now() < deadline) continue;
            return got < rn ? peer_timed_out(pg, c, rr, "for data from") : peer_timed_out(pg, c, sr, "to send to");
        }
        if (ri >= 0 && p[ri].revents) {
            ssize_t n = recv(pg->fd[rr], d + got, rn - got, MSG_DONTWAIT);
            if (n == 0) return peer_io_error(pg, c, rr, "receiving from", 0);
            if (n < 0 && errno != EAGAIN && errno != EINTR) return peer_io_error(pg, c, rr, "receiving from", errno);
            if (n > 0) got += (size_t)n;
        }
        if (si >= 0 && p[si].revents) {
            if (p[si].revents & (POLLERR | POLLHUP)) return peer_io_error(pg, c, sr, "sending to", 0);
            ssize_t n = send(pg->fd[sr], s + sent, sn - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN && errno != EINTR) return peer_io_error(pg, c, sr, "sending to", errno);
            if (n > 0) sent += (size_t)n;
        }
    }
    return EM_OK;
}

em_status io_send(em_pg *pg, call *c, int r, const void *p, size_t n, double deadline)
{
    return io_exchange(pg, c, r, p, n, r, NULL, 0, deadline);
}

em_status io_recv(em_pg *pg, call *c, int r, void *p, size_t n, double deadline)
{
    return io_exchange(pg, c, r, NULL, 0, r, p, n, deadline);
}

/* ---- the communication thread -------------------------------------------------------- */

static void break_group(em_pg *pg, const call *c)
{
    pg->broken = true;
    snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", c->msg);
    wire_abort(pg, c); /* the reason, to every peer that can read it */
    if (pg->shm) shm_abort(pg, c);
#if EM_HAVE_MPI
    if (pg->mpi) mpi_abort(pg, c); /* over MPI the note goes as a message (no sockets) */
#endif
    for (int r = 0; r < pg->world; r++) /* peers blocked on us notice at once */
        if (pg->fd[r] >= 0) shutdown(pg->fd[r], SHUT_RDWR);
}

static void execute_call(em_pg *pg, call *c);

/* Runs c here, on the thread that moves its data: the profiler records it
 * where it actually runs (an asynchronous call on the communication thread). */
static void execute(em_pg *pg, call *c)
{
    prof_mark pm;
    prof_begin(&pm);
    execute_call(pg, c);
    prof_end_bytes(&pm, kind_name(c->h.kind), PROF_COLLECTIVE,
                   c->h.kind == CALL_BARRIER ? 0 : c->h.count * (int64_t)em_dtype_size((em_dtype)c->h.dtype),
                   c->h.kind == CALL_BARRIER ? -1 : c->h.dtype);
}

static void execute_call(em_pg *pg, call *c)
{
    if (pg->broken) {
        call_fail(c, EM_ERR_DIST, "the process group is broken by an earlier failure: %s", pg->broken_msg);
        return;
    }
    double deadline = pg_now() + pg->timeout;
    em_status s;
#if EM_HAVE_MPI
    if (pg->mpi && pg->world > 1) {
        if (c->h.kind != CALL_SEND && c->h.kind != CALL_RECV) {
            c->h.sent = pg->p2p_sent;
            c->h.recvd = pg->p2p_recvd;
        }
        if (mpi_run(pg, c, deadline)) break_group(pg, c);
        return;
    }
#endif
    if (c->h.kind == CALL_SEND || c->h.kind == CALL_RECV) {
        s = pg->world == 1 ? run_call(pg, c, deadline) : p2p_run(pg, c, deadline);
    } else {
        /* the header says how many messages this rank sent and received:
         * the totals over ranks differ while a send is unreceived */
        c->h.sent = pg->p2p_sent;
        c->h.recvd = pg->p2p_recvd;
        if (pg->shm) {
            s = shm_check(pg, c, deadline);
            if (!s && !c->h.cuda) s = shm_run(pg, c, deadline);
        } else {
            s = pg->world == 1 ? EM_OK : check_call(pg, c, deadline);
            if (!s && !c->h.cuda) s = run_call(pg, c, deadline);
        }
    }
    if (s)
        break_group(pg, c);
    else if (pg->world > 1)
        wire_call_done(pg);
}

static void *comm_thread(void *arg)
{
    em_pg *pg = arg;
    prof_thread_name("pg comm");
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while ((!pg->head || pg->inline_busy) && !pg->stopping) pthread_cond_wait(&pg->cv, &pg->mu);
        if (!pg->head) break;
        call *c = pg->head;
        pthread_mutex_unlock(&pg->mu);
        execute(pg, c);
        pthread_mutex_lock(&pg->mu);
        pg->head = c->next;
        if (!pg->head) pg->tail = NULL;
        c->done = true;
        pthread_cond_broadcast(&pg->cv);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

/* Runs c (world > 1: queued on the communication thread, or, when it is
 * synchronous and nothing is queued, right here on the caller's thread,
 * which saves two thread hand-offs per call). */
static void submit(em_pg *pg, call *c, bool sync)
{
    /* a send or recv carries the number of collectives before it, and is not one */
    c->h.seq = pg->seq;
    if (c->h.kind != CALL_SEND && c->h.kind != CALL_RECV) pg->seq++;
    if (pg->world == 1) {
        execute(pg, c);
        c->done = true;
        return;
    }
    pthread_mutex_lock(&pg->mu);
    if (sync && !pg->head && !pg->inline_busy) {
        pg->inline_busy = true;
        pthread_mutex_unlock(&pg->mu);
        execute(pg, c);
        pthread_mutex_lock(&pg->mu);
        pg->inline_busy = false;
        c->done = true;
        /* work queued meanwhile may go now; with none, nobody waits for this
         * (the communication thread sleeps until work comes, and a waiter
         * waits for queued work): waking it for nothing would cost a thread
         * switch per call, on a core the peers may need */
        if (pg->head) pthread_cond_broadcast(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        return;
    }
    c->next = NULL;
    if (pg->tail)
        pg->tail->next = c;
    else
        pg->head = c;
    pg->tail = c;
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
}

static em_status finish(em_pg *pg, call *c)
{
    if (pg->world > 1) {
        pthread_mutex_lock(&pg->mu);
        if (!c->done) { /* the profiler records the time blocked here */
            prof_mark pm;
            prof_begin(&pm);
            while (!c->done) pthread_cond_wait(&pg->cv, &pg->mu);
            prof_end(&pm, "work_wait", PROF_COLLECTIVE);
        }
        pthread_mutex_unlock(&pg->mu);
    }
    if (c->status) return em_set_error(c->status, "%s", c->msg);
    return EM_OK;
}

em_status em_work_wait(em_work *w)
{
    if (!w) return em_err(EM_ERR_ARG, "em_work_wait: work is NULL");
#if EM_HAVE_NCCL
    if (w->nccl_done) return nccl_work_wait(w);
#endif
    em_status s = finish(w->pg, &w->c);
    free(w);
    return s;
}

bool em_work_done(const em_work *w)
{
    if (!w) return true;
#if EM_HAVE_NCCL
    if (w->nccl_done) return nccl_work_done(w);
#endif
    pthread_mutex_lock(&w->pg->mu);
    bool d = w->c.done;
    pthread_mutex_unlock(&w->pg->mu);
    return d;
}

em_status pg_issue(em_pg *pg, const call *proto, em_work **work)
{
    em_work *w = calloc(1, sizeof *w);
    if (!w) return em_err(EM_ERR_OOM, "process group: out of memory");
    w->c = *proto;
    w->pg = pg;
    submit(pg, &w->c, work == NULL);
    if (work) {
        *work = w;
        return EM_OK;
    }
    return em_work_wait(w);
}

/* ---- joining ------------------------------------------------------------------------- */

typedef struct hello {
    uint32_t magic;
    int32_t rank;
    uint8_t secret[16];
} hello;

static int listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int buf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* The address peers reach this rank at: EMBER_ADVERTISE_ADDR, else loopback
 * when the store's address m (MASTER_ADDR, or what em_pg_from_env resolved
 * the store's host to) is loopback, unset or not numeric, else the address
 * the kernel picks to reach m. */
static void advertise_addr(const char *m, char *buf, size_t n)
{
    const char *adv = getenv("EMBER_ADVERTISE_ADDR");
    if (adv && *adv) {
        snprintf(buf, n, "%s", adv);
        return;
    }
    snprintf(buf, n, "127.0.0.1");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9)};
    if (!m || !*m || inet_pton(AF_INET, m, &a.sin_addr) != 1 || (ntohl(a.sin_addr.s_addr) >> 24) == 127) return;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&me, &len) == 0)
        inet_ntop(AF_INET, &me.sin_addr, buf, (socklen_t)n);
    if (fd >= 0) close(fd);
}

/* What identifies this machine: ranks with the same id can share memory.
 * The boot id differs between machines (and between boots); containers on
 * one host share it but maybe not /dev/shm, which the mapping then finds. */
static void host_id(char *buf, size_t n)
{
    char boot[64] = "", host[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    if (gethostname(host, sizeof host)) host[0] = '\0';
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++)
        if (*p == ' ') *p = '_';
    snprintf(buf, n, "%s/%s", boot[0] ? boot : "noboot", host[0] ? host : "nohost");
}

/* ---- what the store knows about a rank that will not come --------------------------
 * A joining rank registers NAME/gone/RANK with the store as its first step:
 * the server sets it the moment the rank's store connection closes (its
 * process exited or died). A launcher that watches the workers' processes
 * (`ember launch`, the test harness) sets r<K>/exited/<RANK> when one ends
 * (em_pg_from_env's groups look there). Every wait of the join watches
 * these beside what it waits for, so a rank that is gone fails the join at
 * once, named, instead of after the timeout. */

/* The keys that say rank r is gone; returns how many (1 or 2). */
static int gone_keys(const em_pg *pg, int r, char k[2][256])
{
    snprintf(k[0], 256, "%s/gone/%d", pg->name, r);
    if (!pg->exited[0]) return 1;
    snprintf(k[1], 256, "%s%d", pg->exited, r);
    return 2;
}

static em_status rank_gone(const em_pg *pg, int r, const void *why, size_t n)
{
    return em_err(EM_ERR_DIST,
                  "em_pg_new: rank %d cannot form group '%s' of %d ranks: rank %d will not join: %.*s",
                  pg->rank, pg->name, pg->world, r, (int)(n < 200 ? n : 200), (const char *)why);
}

/* Reads key (which exists) and fails naming rank r with its text. */
static em_status fail_gone(em_pg *pg, int r, const char *key)
{
    void *v = NULL;
    size_t n = 0;
    em_status s = em_store_get(pg->store, key, &v, &n);
    if (!s) s = rank_gone(pg, r, v, n);
    free(v);
    return s;
}

/* Waits until the store holds `key`, which rank `owner` publishes, and
 * returns its value (*val malloc'd, NUL-terminated; *len bytes). Fails at
 * once, naming owner, when the store says it is gone; EM_ERR_TIMEOUT naming
 * it at the deadline. */
static em_status await_key(em_pg *pg, const char *key, int owner, double deadline, void **val, size_t *len)
{
    char gk[2][256];
    int ng = gone_keys(pg, owner, gk);
    const char *keys[3] = {key, gk[0], gk[1]};
    double left = deadline - pg_now();
    int idx = -1;
    em_status s = dist_store_wait_any(pg->store, 1 + ng, keys, left > 0.001 ? left : 0.001, &idx);
    if (s == EM_ERR_TIMEOUT)
        return em_err(
            EM_ERR_TIMEOUT,
            "em_pg_new: rank %d waited %g s for rank %d to join group '%s' of %d ranks (is it running, "
            "and making the same groups in the same order?)",
            pg->rank, pg->timeout, owner, pg->name, pg->world);
    if (s) return s;
    if (idx > 0) return fail_gone(pg, owner, keys[idx]);
    return em_store_get(pg->store, key, val, len);
}

/* Whether one of the ranks r with missing[r] is known to be gone: EM_OK
 * when none is (without waiting), else the failure naming it. */
static em_status check_gone(em_pg *pg, const bool *missing)
{
    int n = 0, cap = 0, *who = NULL;
    char(*k)[256] = NULL;
    em_status s = EM_OK;
    for (int r = 0; r < pg->world && !s; r++) {
        if (!missing[r]) continue;
        if (n + 2 > cap) {
            cap = cap ? 2 * cap : 16;
            char(*nk)[256] = realloc(k, sizeof *k * (size_t)cap);
            int *nw = nk ? realloc(who, sizeof *who * (size_t)cap) : NULL;
            if (nk) k = nk;
            if (nw) who = nw;
            if (!nk || !nw) s = em_err(EM_ERR_OOM, "em_pg_new: out of memory");
            if (s) break;
        }
        char gk[2][256];
        int ng = gone_keys(pg, r, gk);
        for (int i = 0; i < ng; i++) {
            memcpy(k[n], gk[i], 256);
            who[n++] = r;
        }
    }
    const char **keys = s || n == 0 ? NULL : malloc(sizeof *keys * (size_t)n);
    if (!s && n > 0 && !keys) s = em_err(EM_ERR_OOM, "em_pg_new: out of memory");
    int idx = -1;
    for (int i = 0; keys && i < n; i++) keys[i] = k[i];
    if (!s && n > 0) s = dist_store_wait_any(pg->store, n, keys, 0, &idx);
    if (!s && idx >= 0) s = fail_gone(pg, who[idx], keys[idx]);
    free(keys);
    free(k);
    free(who);
    return s;
}

/* Connects to rank r at host:port into *fd, retrying until the deadline (r
 * listens before it publishes its address, so a refusal means it is not
 * there: once the store says r is gone, this fails at once naming it). */
static em_status connect_to(em_pg *pg, int r, const char *host, int port, double deadline, int *fd)
{
    *fd = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return em_err(EM_ERR_DIST, "em_pg_new: rank %d's address '%s' is not an IPv4 address", r, host);
    bool *missing = calloc((size_t)pg->world, sizeof *missing);
    if (!missing) return em_err(EM_ERR_OOM, "em_pg_new: out of memory");
    missing[r] = true;
    em_status s = EM_OK;
    while (!s && *fd < 0) {
        if (pg_now() >= deadline) {
            s = em_err(EM_ERR_TIMEOUT, "em_pg_new: rank %d cannot connect to rank %d at %s:%d within %g s",
                       pg->rank, r, host, port, pg->timeout);
            break;
        }
        int f = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (f < 0) {
            s = em_err(EM_ERR_DIST, "em_pg_new: rank %d cannot make a socket: %s", pg->rank, strerror(errno));
            break;
        }
        int buf = 4 << 20;
        setsockopt(f, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
        setsockopt(f, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
        if (connect(f, (struct sockaddr *)&a, sizeof a) == 0) {
            *fd = f;
            break;
        }
        close(f);
        if ((s = check_gone(pg, missing))) break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    free(missing);
    return s;
}

static em_status key_get(em_pg *pg, const char *what, int r, char *out, size_t n)
{
    char key[256];
    snprintf(key, sizeof key, "%s/%s/%d", pg->name, what, r);
    void *v = NULL;
    size_t len = 0;
    em_status s = em_store_get(pg->store, key, &v, &len);
    if (s) return s;
    if (len >= n) len = n - 1;
    memcpy(out, v, len);
    out[len] = '\0';
    free(v);
    return EM_OK;
}

/* After the mesh: maps the shared segment when every rank is on this
 * machine and the transport allows it. Ranks agree through rank 0 (over
 * the mesh) on whether every one of them mapped it; if not, AUTO stays on
 * TCP and SHM fails naming the rank. */
static em_status setup_shm(em_pg *pg, em_transport tr, bool local, double deadline)
{
    if (tr == EM_TRANSPORT_TCP) return EM_OK;
    if (!local || pg->world > SHM_MAX_WORLD) {
        if (tr == EM_TRANSPORT_AUTO) return EM_OK;
        if (!local) return em_err(EM_ERR_ARG, "em_pg_new: transport shm needs every rank on one machine; these are not");
        return em_err(EM_ERR_ARG, "em_pg_new: transport shm takes at most %d ranks, not %d", SHM_MAX_WORLD,
                      pg->world);
    }
    char key[256], name[96] = "", why[ERROR_BYTES] = "";
    snprintf(key, sizeof key, "%s/shm", pg->name);
    em_status s = EM_OK;
    if (pg->rank == 0) {
        if (shm_create(pg, name, sizeof name)) snprintf(why, sizeof why, "%s", em_last_error()), name[0] = '\0';
        if ((s = em_store_set(pg->store, key, name, strlen(name)))) {
            if (name[0]) shm_unlink(name);
            shm_unmap(pg);
            return s;
        }
    } else {
        void *v = NULL;
        size_t len = 0;
        if ((s = await_key(pg, key, 0, deadline, &v, &len))) return s;
        snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), (char *)v);
        free(v);
        if (!name[0]) snprintf(why, sizeof why, "rank 0 could not make the segment");
        else if (shm_map(pg, name)) snprintf(why, sizeof why, "%s", em_last_error());
    }
    /* the verdict: -1 = everyone mapped it, else the first rank that did not */
    call c = {.h = {.kind = CALL_BARRIER}};
    int32_t bad = pg->shm ? -1 : pg->rank;
    if (pg->rank == 0) {
        for (int r = 1; r < pg->world && !s; r++) {
            uint8_t ok = 0;
            s = io_recv(pg, &c, r, &ok, 1, deadline);
            if (!s && !ok && bad < 0) bad = r;
        }
        if (name[0]) shm_unlink(name); /* every rank has it mapped or gave up: the name can go */
        for (int r = 1; r < pg->world && !s; r++) s = io_send(pg, &c, r, &bad, sizeof bad, deadline);
    } else {
        uint8_t ok = pg->shm != NULL;
        s = io_send(pg, &c, 0, &ok, 1, deadline);
        if (!s) s = io_recv(pg, &c, 0, &bad, sizeof bad, deadline);
    }
    if (s) return em_err(EM_ERR_DIST, "em_pg_new: rank %d, agreeing on shared memory: %s", pg->rank, c.msg);
    if (bad < 0) return EM_OK;
    shm_unmap(pg);
    if (tr == EM_TRANSPORT_AUTO) return EM_OK;
    if (bad == pg->rank) return em_err(EM_ERR_DIST, "em_pg_new: transport shm: %s", why);
    return em_err(EM_ERR_DIST, "em_pg_new: transport shm: rank %d could not map the shared segment", (int)bad);
}

/* The join. Every key lives under pg->name, which names this generation of
 * the group ("NAME/G"): a group made again under the same name (a second
 * Accelerator in the process, two groups alive at once) meets under fresh
 * keys. A rank's record NAME/G/addr/R is "host port machine-id world". */
static em_status join(em_pg *pg, em_transport tr)
{
    double deadline = pg_now() + pg->timeout;
    uint8_t secret[16];
    char key[256], val[512];
    /* first: the store tells the others if this rank's connection closes from now on */
    snprintf(key, sizeof key, "%s/gone/%d", pg->name, pg->rank);
    static const char gone_why[] = "its connection to the store closed (did its process exit?)";
    em_status s = dist_store_on_close(pg->store, key, gone_why, sizeof gone_why - 1);
    if (s) return s;
    /* rank 0's secret authenticates the mesh connections */
    snprintf(key, sizeof key, "%s/secret", pg->name);
    if (pg->rank == 0) {
        if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret)
            return em_err(EM_ERR_DIST, "em_pg_new: cannot get random bytes: %s", strerror(errno));
        if ((s = em_store_set(pg->store, key, secret, sizeof secret))) return s;
    } else {
        void *v = NULL;
        size_t len = 0;
        if ((s = await_key(pg, key, 0, deadline, &v, &len))) return s;
        if (len != sizeof secret) {
            free(v);
            return em_err(EM_ERR_DIST, "em_pg_new: the group's secret in the store is malformed");
        }
        memcpy(secret, v, sizeof secret);
        free(v);
    }
    int port, lfd = listen_any(&port);
    if (lfd < 0) return em_err(EM_ERR_DIST, "em_pg_new: rank %d cannot listen: %s", pg->rank, strerror(errno));
    char host[128], id[160];
    advertise_addr(pg->master, host, sizeof host);
    host_id(id, sizeof id);
    snprintf(key, sizeof key, "%s/addr/%d", pg->name, pg->rank);
    snprintf(val, sizeof val, "%s %d %s %d", host, port, id, pg->world);
    s = em_store_set(pg->store, key, val, strlen(val));
    /* connect to every lower rank; accept every higher one */
    for (int r = 0; r < pg->rank && !s; r++) {
        char h[128];
        int p, w = 0, fd = -1;
        void *v = NULL;
        snprintf(key, sizeof key, "%s/addr/%d", pg->name, r);
        if ((s = await_key(pg, key, r, deadline, &v, NULL))) break;
        int got = sscanf(v, "%127s %d %*s %d", h, &p, &w);
        free(v);
        if (got != 3) {
            s = em_err(EM_ERR_DIST, "em_pg_new: rank %d's record in the store is malformed", r);
            break;
        }
        if (w != pg->world) {
            s = em_err(
                EM_ERR_DIST,
                "em_pg_new: rank %d joins group '%s' as one of %d ranks, but rank %d as one of %d: the "
                "ranks disagree about the group (WORLD_SIZE, or the order groups are made in)",
                pg->rank, pg->name, pg->world, r, w);
            break;
        }
        if ((s = connect_to(pg, r, h, p, deadline, &fd))) break;
        hello me = {PG_MAGIC, pg->rank, {0}};
        memcpy(me.secret, secret, sizeof secret);
        ssize_t sent = send(fd, &me, sizeof me, MSG_NOSIGNAL);
        if (sent != (ssize_t)sizeof me) {
            close(fd);
            s = em_err(EM_ERR_DIST, "em_pg_new: rank %d cannot greet rank %d", pg->rank, r);
            break;
        }
        tune(fd);
        pg->fd[r] = fd;
    }
    int need = pg->world - 1 - pg->rank;
    bool *missing = need > 0 && !s ? calloc((size_t)pg->world, sizeof *missing) : NULL;
    if (need > 0 && !s && !missing) s = em_err(EM_ERR_OOM, "em_pg_new: out of memory");
    for (int r = pg->rank + 1; missing && r < pg->world; r++) missing[r] = true;
    while (need > 0 && !s) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int ms = pg_ms_until(deadline);
        int k = poll(&p, 1, ms < 200 ? ms : 200);
        if (k == 0 && pg_now() >= deadline) {
            char list[256] = "";
            for (int r = pg->rank + 1; r < pg->world; r++)
                if (pg->fd[r] < 0 && strlen(list) < 200)
                    snprintf(list + strlen(list), sizeof list - strlen(list), " %d", r);
            s = em_err(EM_ERR_TIMEOUT, "em_pg_new: rank %d waited %g s for ranks%s to join group '%s'",
                       pg->rank, pg->timeout, list, pg->name);
            break;
        }
        if (k == 0) { /* nothing to accept: is a missing rank known to be gone? */
            if (!check_gone(pg, missing)) continue;
            /* a rank that connected and then left is still in the backlog: take it first */
            if (poll(&p, 1, 0) == 1)
                em_clear_error();
            else
                s = em_last_status();
            continue;
        }
        if (k < 0) continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        hello h = {0};
        struct pollfd q = {.fd = fd, .events = POLLIN};
        if (poll(&q, 1, 2000) != 1 || recv(fd, &h, sizeof h, MSG_WAITALL) != (ssize_t)sizeof h ||
            h.magic != PG_MAGIC || memcmp(h.secret, secret, sizeof secret) || h.rank <= pg->rank ||
            h.rank >= pg->world || pg->fd[h.rank] >= 0) {
            close(fd); /* a stray or forged connection: refused */
            continue;
        }
        tune(fd);
        pg->fd[h.rank] = fd;
        missing[h.rank] = false;
        need--;
    }
    free(missing);
    close(lfd);
    /* one machine? every rank's record names its host */
    bool local = true;
    for (int r = 0; r < pg->world && !s; r++) {
        char h[128], their[160] = "";
        int p;
        if ((s = key_get(pg, "addr", r, val, sizeof val))) break;
        if (sscanf(val, "%127s %d %159s", h, &p, their) != 3 || strcmp(their, id)) local = false;
    }
    return s ? s : setup_shm(pg, tr, local, deadline);
}

/* Closes the connections once what this rank wrote to them has reached
 * its peers. A send is done once its data is handed to the socket, so a
 * rank may free its group right after one, its last bytes still queued;
 * and a socket closed with input unread (a peer's recv announcement)
 * resets the connection, which throws that queue away. So each connection
 * is half-closed, and its input read and dropped until the peer's kernel
 * has acknowledged all of our output (SIOCOUTQ 0), the peer closed, or the
 * group's timeout: a peer that never receives what it was sent delays the
 * exit by that much, as it would a call. A broken group closes at once. */
static void close_all(em_pg *pg)
{
    if (!pg->fd) return;
    double deadline = pg_now() + pg->timeout;
    int left = 0;
    for (int r = 0; r < pg->world; r++)
        if (pg->fd[r] >= 0 && !pg->broken) {
            shutdown(pg->fd[r], SHUT_WR);
            left++;
        }
    /* every connection at once: two ranks freeing their groups each drop
     * the other's input while they wait */
    while (left > 0 && pg_now() < deadline) {
        left = 0;
        for (int r = 0; r < pg->world; r++) {
            int fd = pg->fd[r], queued = 0;
            if (fd < 0) continue;
            char sink[4096];
            ssize_t n;
            while ((n = recv(fd, sink, sizeof sink, MSG_DONTWAIT)) > 0) {
            }
            bool gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR); /* the peer closed */
            if (gone || ioctl(fd, SIOCOUTQ, &queued) || queued == 0) {
                close(fd);
                pg->fd[r] = -1;
            } else {
                left++;
            }
        }
        if (left) nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    for (int r = 0; r < pg->world; r++)
        if (pg->fd[r] >= 0) close(pg->fd[r]);
}

/* The generation of the group being joined under `name`: the store counts
 * the joins under it, and a rank can finish joining generation G only after
 * all `world` ranks counted theirs, so the n-th count belongs to generation
 * (n - 1) / world on every rank. */
static em_status next_generation(em_store *st, const char *name, int world, long long *gen)
{
    char key[256];
    snprintf(key, sizeof key, "%s/joins", name);
    int64_t n = 0;
    em_status s = em_store_add(st, key, 1, &n);
    if (s) return s;
    *gen = (long long)((n - 1) / world);
    return EM_OK;
}

/* em_pg_new, plus the prefix of the keys where a launcher notes a worker's
 * exit ("r0/exited/"; "" = none). */
static em_pg *pg_new(const em_pg_config *cfg, const char *exited, const char *master)
{
    if (!cfg) return em_fail(EM_ERR_ARG, "em_pg_new: config is NULL");
    if (cfg->name && strlen(cfg->name) > 100)
        return em_fail(EM_ERR_ARG, "em_pg_new: name of %zu characters is longer than 100", strlen(cfg->name));
    if (cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world)
        return em_fail(EM_ERR_ARG, "em_pg_new: rank %d is outside [0, world %d)", cfg->rank, cfg->world);
    if (cfg->world > 1 && !cfg->store && cfg->transport != EM_TRANSPORT_MPI)
        return em_fail(EM_ERR_ARG, "em_pg_new: a group of %d ranks needs a store", cfg->world);
    if (cfg->timeout_s < 0 || cfg->timeout_s != cfg->timeout_s)
        return em_fail(EM_ERR_ARG, "em_pg_new: timeout_s %g must be >= 0", cfg->timeout_s);
    if (cfg->transport < EM_TRANSPORT_AUTO || cfg->transport > EM_TRANSPORT_MPI)
        return em_fail(EM_ERR_ARG, "em_pg_new: transport %d is not AUTO, TCP, SHM or MPI",
                       (int)cfg->transport);
#if !EM_HAVE_MPI
    if (cfg->transport == EM_TRANSPORT_MPI) return em_fail(EM_ERR_UNSUPPORTED, "em_pg_new: %s", no_mpi);
#endif
    em_pg *pg = calloc(1, sizeof *pg);
    if (!pg) return em_fail(EM_ERR_OOM, "em_pg_new: out of memory");
    pg->rank = cfg->rank;
    pg->world = cfg->world;
    pg->timeout = cfg->timeout_s > 0 ? cfg->timeout_s : EM_DIST_DEFAULT_TIMEOUT;
    snprintf(pg->name, sizeof pg->name, "%s", cfg->name ? cfg->name : "pg");
    snprintf(pg->exited, sizeof pg->exited, "%s", exited);
    snprintf(pg->master, sizeof pg->master, "%s", master ? master : "");
    pg->store = cfg->store;
    pg->fd = malloc(sizeof *pg->fd * (size_t)pg->world);
    pg->peer = calloc((size_t)pg->world, sizeof *pg->peer);
    if (!pg->fd || !pg->peer) {
        free(pg->fd);
        free(pg->peer);
        free(pg);
        return em_fail(EM_ERR_OOM, "em_pg_new: out of memory");
    }
    pg->abort_origin = -1;
    for (int r = 0; r < pg->world; r++) pg->peer[r].out_ok = true;
    for (int r = 0; r < pg->world; r++) pg->fd[r] = -1;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    bool mpi = cfg->transport == EM_TRANSPORT_MPI;
    em_status s = EM_OK;
    long long gen = 0;
    /* the store names the group's generation (NCCL's keys live under it);
     * under MPI before the communicator is made, which every rank must have
     * begun for any to finish: no rank is done with the store before all are */
    if (pg->world > 1 && pg->store) s = next_generation(pg->store, pg->name, pg->world, &gen);
    if (!s && pg->world > 1 && pg->store)
        snprintf(pg->name + strlen(pg->name), sizeof pg->name - strlen(pg->name), "/%lld", gen);
#if EM_HAVE_MPI
    if (!s && mpi) s = mpi_join(pg); /* MPI's communicator, also for a group of one (it reports MPI) */
#endif
    if (pg->world > 1 || s) {
        if (!s && !mpi) s = join(pg, cfg->transport);
        if (!s && pthread_create(&pg->thread, NULL, comm_thread, pg) != 0)
            s = em_err(EM_ERR_DIST, "em_pg_new: cannot start the communication thread");
        if (s) {
            held_error h;
            error_hold(&h, s);
            close_all(pg);
            shm_unmap(pg);
#if EM_HAVE_MPI
            mpi_leave(pg);
#endif
            free(pg->fd);
            free(pg->peer);
            free(pg);
            error_restore(&h);
            return NULL;
        }
        pg->thread_started = true;
    }
    prof_set_rank(pg->rank); /* the profiler's trace is named after it */
    return pg;
}

em_pg *em_pg_new(const em_pg_config *cfg) { return pg_new(cfg, "", getenv("MASTER_ADDR")); }

void em_pg_free(em_pg *pg)
{
    if (!pg) return;
    if (pg->thread_started) {
        pthread_mutex_lock(&pg->mu);
        pg->stopping = true;
        pthread_cond_broadcast(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        pthread_join(pg->thread, NULL);
    }
    close_all(pg);
    shm_unmap(pg);
#if EM_HAVE_NCCL
    nccl_pg_free(pg);
#endif
#if EM_HAVE_MPI
    mpi_leave(pg);
#endif
    if (pg->own_store) em_store_close(pg->store);
    em_store_server_stop(pg->own_server);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    wire_free(pg);
    free(pg->fd);
    free(pg->peer);
    free(pg);
}

int em_pg_rank(const em_pg *pg) { return pg ? pg->rank : -1; }
int em_pg_world(const em_pg *pg) { return pg ? pg->world : -1; }
double em_pg_timeout(const em_pg *pg) { return pg ? pg->timeout : 0; }
em_transport em_pg_transport(const em_pg *pg)
{
    if (pg && pg->mpi) return EM_TRANSPORT_MPI;
    return pg && pg->shm ? EM_TRANSPORT_SHM : EM_TRANSPORT_TCP;
}
em_store *em_pg_store(const em_pg *pg) { return pg ? pg->store : NULL; }

/* ---- from the environment -------------------------------------------------------- */

/* em_pg_from_env with the MPI transport: rank and world are MPI_COMM_WORLD's
 * (a launcher's world size that disagrees is an error), and the store is one
 * rank 0 hosts, its address passed with MPI (dist/mpi.c): no launcher
 * variables needed. */
static em_pg *from_mpi(double timeout, const launch_env *e)
{
#if EM_HAVE_MPI
    int rank = 0, world = 1;
    em_store *st = NULL;
    em_store_server *srv = NULL;
    if (mpi_rendezvous(timeout, &rank, &world, &st, &srv)) return NULL;
    em_pg *pg = NULL;
    if (e->kind != LAUNCHER_NONE && e->world != world)
        em_set_error(EM_ERR_ARG,
                     "em_pg_from_env: %s's environment says %d ranks, but MPI_COMM_WORLD has %d "
                     "(transport mpi: start the job with mpirun or srun --mpi, or set EMBER_TRANSPORT=tcp)",
                     launcher_name(e->kind), e->world, world);
    else
        pg = em_pg_new(&(em_pg_config){.rank = rank,
                                       .world = world,
                                       .store = st,
                                       .name = "mpi/pg",
                                       .timeout_s = timeout,
                                       .transport = EM_TRANSPORT_MPI});
    if (!pg) {
        held_error h;
        error_hold(&h, em_last_status());
        em_store_close(st);
        em_store_server_stop(srv);
        error_restore(&h);
        return NULL;
    }
    pg->own_store = true;
    pg->own_server = srv;
    return pg;
#else
    (void)timeout, (void)e;
    return em_fail(EM_ERR_UNSUPPORTED, "em_pg_from_env: EMBER_TRANSPORT=mpi: %s", no_mpi);
#endif
}

em_pg *em_pg_from_env(void) { return em_pg_from_env_with(NULL); }

em_pg *em_pg_from_env_with(const em_pg_env_config *cfg)
{
    static const char fn[] = "em_pg_from_env";
    double timeout = 0;
    if (cfg && (cfg->timeout_s < 0 || cfg->timeout_s != cfg->timeout_s || isinf(cfg->timeout_s)))
        return em_fail(EM_ERR_ARG, "em_pg_from_env_with: timeout_s %g must be >= 0 and finite",
                       cfg->timeout_s);
    launch_env e;
    if (launch_env_read(fn, &e)) return NULL;
    const char *t = getenv("EMBER_TIMEOUT");
    if (cfg && cfg->timeout_s > 0) {
        timeout = cfg->timeout_s; /* the caller's wins over the environment */
    } else if (t && *t) {         /* parsed as the config file's `timeout` */
        em_config c = em_config_defaults();
        if (config_set(&c, "timeout", t, "em_pg_from_env: EMBER_TIMEOUT")) return NULL;
        timeout = c.timeout_s;
    }
    em_transport tr = EM_TRANSPORT_AUTO;
    const char *trs = getenv("EMBER_TRANSPORT");
    if (trs && *trs) {
        if (!strcmp(trs, "tcp")) tr = EM_TRANSPORT_TCP;
        else if (!strcmp(trs, "shm")) tr = EM_TRANSPORT_SHM;
        else if (!strcmp(trs, "mpi"))
            tr = EM_TRANSPORT_MPI;
        else if (strcmp(trs, "auto"))
            return em_fail(EM_ERR_ARG, "em_pg_from_env: EMBER_TRANSPORT='%s' must be tcp, shm, mpi or auto",
                           trs);
    }
    /* MPI: asked for, or AUTO in a process an MPI launcher started */
    if (tr == EM_TRANSPORT_MPI || (tr == EM_TRANSPORT_AUTO && EM_HAVE_MPI && e.mpi))
        return from_mpi(timeout, &e);
    if (e.world == 1)
        return em_pg_new(&(em_pg_config){.rank = 0, .world = 1, .timeout_s = timeout, .transport = tr});
    /* the ranks meet in the store: the launcher's, or one rank 0 hosts */
    launch_store ls;
    if (launch_store_settings(fn, &e, &ls)) return NULL;
    em_store *st = launch_store_connect(fn, &ls, timeout);
    if (!st) return NULL;
    char name[64], exited[64] = "";
    snprintf(name, sizeof name, "r%ld/pg", e.restart);
    if (e.kind == LAUNCHER_TORCHRUN) /* only ember launch notes a worker's exit there */
        snprintf(exited, sizeof exited, "r%ld/exited/", e.restart);
    em_pg *pg = pg_new(&(em_pg_config){.rank = e.rank,
                                       .world = e.world,
                                       .store = st,
                                       .name = name,
                                       .timeout_s = timeout,
                                       .transport = tr},
                       exited, ls.ip[0] ? ls.ip : ls.addr);
    if (!pg) {
        held_error h;
        error_hold(&h, em_last_status());
        em_store_close(st);
        error_restore(&h);
        return NULL;
    }
    pg->own_store = true;
    return pg;
}
