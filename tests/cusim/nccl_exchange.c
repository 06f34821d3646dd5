/* nccl_exchange.c — how the emulator's NCCL moves data between ranks
 * through the shared-memory segment (layout in nccl_impl.h), once a call is
 * prepared: collectives through the per-rank slots, send/recv through the
 * mailboxes, and the waiting that tells a slow peer from a dead or absent one.
 *
 * Collectives. Each rank's step counter only grows: barrier() publishes
 * "I reached step v" (release) and waits for every other rank to reach v
 * (acquire). A call starts with a check step: every rank writes the call's
 * header (op, count, type, op, root, sequence number) into ctl.desc[seq & 1]
 * and, after the barrier, compares all of them; a mismatch fails every rank
 * with the same message, naming both calls. Then data moves in pieces of
 * half a slot, alternating halves, one barrier per piece: a rank refills a
 * half (piece j+2) only after everyone reached piece j+1's barrier, which
 * they do after reading piece j. Every rank reduces every rank's piece, in
 * rank order, in the type's arithmetic (f16/bf16 in float, rounded once), so
 * every rank gets the same bits.
 *
 * Send/recv go through the (src, dst) mailbox one chunk at a time: the
 * sender waits until the receiver took the chunk before writing the next,
 * and until it took the last before the send returns. A group runs its
 * calls at ncclGroupEnd: collectives in call order, then all sends and
 * receives polled together (so a send and a recv in one group never wait for
 * each other); with several communicators in the group (one thread driving
 * several devices), one thread per communicator.
 *
 * Waiting spins briefly, yields, then sleeps on a futex in 1 ms slices,
 * checking between them for the shared failure (a peer gave up and said
 * why), a peer that destroyed its communicator, a peer process that exited,
 * and EMBER_CUSIM_NCCL_TIMEOUT (seconds without progress, default 60). Any
 * such error breaks the communicator on every rank. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "nccl_impl.h"

/* ---- small things ------------------------------------------------------------------ */

double cusim_nccl_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static bool reached(uint32_t have, uint32_t want) { return (int32_t)(have - want) >= 0; }

void cusim_nccl_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (void *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void cusim_nccl_sleep_on(_Atomic uint32_t *w, uint32_t cur)
{
    struct timespec ts = {0, SLEEP_NS};
    syscall(SYS_futex, (void *)w, FUTEX_WAIT, cur, &ts, NULL, 0);
}

/* Waiting step i of a wait: spin, then yield; true when it is time to sleep. */
bool cusim_nccl_backoff(int i)
{
    if (i < SPIN_ITERS) {
        cpu_relax();
        return false;
    }
    if (i < SPIN_ITERS + YIELD_ITERS) {
        sched_yield();
        return false;
    }
    return true;
}

/* false once process pid has exited (gone, or a zombie not yet reaped). */
static bool process_alive(pid_t pid)
{
    if (kill(pid, 0) && errno == ESRCH) return false;
    char path[64], text[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true; /* no /proc: trust kill() */
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *p = strrchr(text, ')'); /* "pid (name) S ...": the name may hold anything */
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

const char *cusim_nccl_api_name(op_kind k)
{
    switch (k) {
    case K_ALL_REDUCE: return "ncclAllReduce";
    case K_BROADCAST: return "ncclBroadcast";
    case K_REDUCE: return "ncclReduce";
    case K_ALL_GATHER: return "ncclAllGather";
    case K_REDUCE_SCATTER: return "ncclReduceScatter";
    case K_SEND: return "ncclSend";
    case K_RECV: return "ncclRecv";
    }
    return "nccl";
}

/* "#3 all_reduce(count=10, float32, sum)" */
static void describe(const call_desc *d, char *s, size_t n)
{
    const char *t = cusim_nccl_dtype_name(d->dtype), *r = cusim_nccl_red_name(d->red);
    unsigned long long c = (unsigned long long)d->count;
    switch ((op_kind)d->kind) {
    case K_ALL_REDUCE: snprintf(s, n, "#%u all_reduce(count=%llu, %s, %s)", d->seq, c, t, r); return;
    case K_BROADCAST: snprintf(s, n, "#%u broadcast(count=%llu, %s, root=%d)", d->seq, c, t, d->root); return;
    case K_REDUCE:
        snprintf(s, n, "#%u reduce(count=%llu, %s, %s, root=%d)", d->seq, c, t, r, d->root);
        return;
    case K_ALL_GATHER: snprintf(s, n, "#%u all_gather(sendcount=%llu, %s)", d->seq, c, t); return;
    case K_REDUCE_SCATTER:
        snprintf(s, n, "#%u reduce_scatter(recvcount=%llu, %s, %s)", d->seq, c, t, r);
        return;
    case K_SEND:
    case K_RECV: break;
    }
    snprintf(s, n, "#%u (unknown call %d)", d->seq, d->kind);
}

/* Sets o's result and message; returns the result. */
ncclResult_t cusim_nccl_fail(op *o, ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->msg, sizeof o->msg, fmt, ap);
    va_end(ap);
    o->result = r;
    return r;
}

/* ---- the segment: failures and peers ------------------------------------------------ */

static uint8_t *half_of(ncclComm_t c, int rank, uint32_t piece)
{
    return c->base + slot_off(c->nranks) + (size_t)rank * SLOT_BYTES + (piece & 1) * HALF_BYTES;
}

static mbox_head *mbox(ncclComm_t c, int src, int dst)
{
    return (mbox_head *)(c->base + mbox_off(c->nranks) +
                         ((size_t)src * (size_t)c->nranks + (size_t)dst) * (PAGE + MBOX_BYTES));
}

static uint8_t *mbox_data(mbox_head *b) { return (uint8_t *)b + PAGE; }

/* Tells every rank why this one gave up (the first failure wins). */
void cusim_nccl_poison(seg_head *h, int rank, ncclResult_t r, const char *msg)
{
    uint32_t none = 0;
    if (!atomic_compare_exchange_strong(&h->fail_state, &none, 1)) return;
    h->fail_code = r;
    h->fail_rank = rank;
    snprintf(h->fail_msg, sizeof h->fail_msg, "%s", msg);
    atomic_store(&h->fail_state, 2);
}

/* ncclSuccess while rank q may still come; else why not (in o). start: when
 * this wait began (or last saw progress); what: what o waits for q to do. */
static ncclResult_t peer_check(op *o, int q, double start, const char *what)
{
    ncclComm_t c = o->comm;
    seg_head *h = c->head;
    if (atomic_load(&h->fail_state) == 2 && h->fail_rank != c->rank)
        return cusim_nccl_fail(o, (ncclResult_t)h->fail_code, "%s (rank %d gave up): %s",
                               cusim_nccl_api_name(o->kind), h->fail_rank, h->fail_msg);
    pid_t pid = atomic_load(&c->ctl[q].pid);
    if (atomic_load(&c->ctl[q].gone))
        return cusim_nccl_fail(o, ncclRemoteError,
                               "%s: rank %d destroyed its communicator while rank %d waited for it %s",
                               cusim_nccl_api_name(o->kind), q, c->rank, what);
    if (pid != getpid() && !process_alive(pid))
        return cusim_nccl_fail(o, ncclRemoteError,
                               "%s: rank %d (pid %d) exited while rank %d waited for it %s",
                               cusim_nccl_api_name(o->kind), q, (int)pid, c->rank, what);
    double waited = cusim_nccl_now_s() - start;
    if (waited >= c->timeout)
        return cusim_nccl_fail(
            o, ncclSystemError,
            "%s: rank %d waited %.3g s for rank %d (pid %d) %s: is it stuck, or calling something else? "
            "(EMBER_CUSIM_NCCL_TIMEOUT=%g)",
            cusim_nccl_api_name(o->kind), c->rank, waited, q, (int)pid, what, c->timeout);
    return ncclSuccess;
}

/* ---- collectives ----------------------------------------------------------------------- */

static call_desc desc_of(const op *o, uint32_t seq)
{
    bool reduces = o->kind == K_ALL_REDUCE || o->kind == K_REDUCE || o->kind == K_REDUCE_SCATTER;
    bool rooted = o->kind == K_BROADCAST || o->kind == K_REDUCE;
    return (call_desc){.kind = (int32_t)o->kind,
                       .dtype = o->dt,
                       .red = reduces ? (int32_t)o->red : -1,
                       .root = rooted ? o->root : -1,
                       .count = o->count,
                       .seq = seq};
}

static bool desc_same(const call_desc *a, const call_desc *b)
{
    return a->kind == b->kind && a->dtype == b->dtype && a->red == b->red && a->root == b->root &&
           a->count == b->count && a->seq == b->seq;
}

/* This rank reaches its next step; waits until every rank did. */
static ncclResult_t barrier(op *o, const call_desc *d)
{
    ncclComm_t c = o->comm;
    uint32_t v = ++c->step;
    atomic_store_explicit(&c->ctl[c->rank].step, v, memory_order_release);
    cusim_nccl_wake(&c->ctl[c->rank].step);
    for (int q = 0; q < c->nranks; q++) {
        if (q == c->rank) continue;
        _Atomic uint32_t *w = &c->ctl[q].step;
        double start = 0;
        for (int i = 0;; i++) {
            uint32_t cur = atomic_load_explicit(w, memory_order_acquire);
            if (reached(cur, v)) break;
            if (!cusim_nccl_backoff(i)) continue;
            if (start == 0) start = cusim_nccl_now_s();
            cusim_nccl_sleep_on(w, cur);
            if (reached(atomic_load_explicit(w, memory_order_acquire), v)) break;
            char call[160], what[200];
            describe(d, call, sizeof call);
            snprintf(what, sizeof what, "to make call %s", call);
            ncclResult_t r = peer_check(o, q, start, what);
            /* it may have arrived and then exited between the two looks */
            if (r && reached(atomic_load_explicit(w, memory_order_acquire), v)) {
                o->result = ncclSuccess;
                break;
            }
            if (r) return r;
        }
    }
    return ncclSuccess;
}

ncclResult_t cusim_nccl_run_collective(op *o)
{
    ncclComm_t c = o->comm;
    int n = c->nranks, me = c->rank;
    call_desc d = desc_of(o, c->seq++);
    c->ctl[me].desc[d.seq & 1] = d;
    ncclResult_t r = barrier(o, &d);
    if (r) return r;
    for (int q = 0; q < n; q++) {
        call_desc e = c->ctl[q].desc[d.seq & 1], first = c->ctl[0].desc[d.seq & 1];
        if (desc_same(&first, &e)) continue;
        char a[160], b[160];
        describe(&first, a, sizeof a);
        describe(&e, b, sizeof b);
        return cusim_nccl_fail(
            o, ncclInvalidUsage,
            "%s: ranks called different collectives: rank 0 called %s but rank %d called %s",
            cusim_nccl_api_name(o->kind), a, q, b);
    }
    size_t es = cusim_nccl_dtype_size(o->dt), cnt = o->count;
    const void *src[MAX_RANKS];
    uint32_t j = 0; /* the piece: half j & 1 */
    switch (o->kind) {
    case K_ALL_REDUCE:
    case K_REDUCE: {
        bool keep = o->kind == K_ALL_REDUCE || me == o->root;
        size_t pe = HALF_BYTES / es;
        for (size_t off = 0; off < cnt; off += pe, j++) {
            size_t m = cnt - off < pe ? cnt - off : pe;
            uint8_t *mine = o->buf + off * es;
            memcpy(half_of(c, me, j), mine, m * es);
            if ((r = barrier(o, &d))) return r;
            if (!keep) continue;
            for (int q = 0; q < n; q++) src[q] = half_of(c, q, j);
            cusim_nccl_reduce(o->dt, o->red, mine, src, n, m);
        }
        return ncclSuccess;
    }
    case K_BROADCAST: {
        size_t pe = HALF_BYTES / es;
        for (size_t off = 0; off < cnt; off += pe, j++) {
            size_t m = cnt - off < pe ? cnt - off : pe;
            if (me == o->root) memcpy(half_of(c, me, j), o->buf + off * es, m * es);
            if ((r = barrier(o, &d))) return r;
            if (me != o->root) memcpy(o->buf + off * es, half_of(c, o->root, j), m * es);
        }
        return ncclSuccess;
    }
    case K_ALL_GATHER: { /* buf: n blocks of cnt, this rank's input in block me */
        size_t pe = HALF_BYTES / es;
        for (size_t off = 0; off < cnt; off += pe, j++) {
            size_t m = cnt - off < pe ? cnt - off : pe;
            memcpy(half_of(c, me, j), o->buf + ((size_t)me * cnt + off) * es, m * es);
            if ((r = barrier(o, &d))) return r;
            for (int q = 0; q < n; q++)
                if (q != me) memcpy(o->buf + ((size_t)q * cnt + off) * es, half_of(c, q, j), m * es);
        }
        return ncclSuccess;
    }
    case K_REDUCE_SCATTER: { /* buf: n blocks of cnt; each half holds a piece of every block */
        size_t pe = HALF_BYTES / es / (size_t)n;
        for (size_t off = 0; off < cnt; off += pe, j++) {
            size_t m = cnt - off < pe ? cnt - off : pe;
            for (int b = 0; b < n; b++)
                memcpy(half_of(c, me, j) + (size_t)b * pe * es, o->buf + ((size_t)b * cnt + off) * es,
                       m * es);
            if ((r = barrier(o, &d))) return r;
            for (int q = 0; q < n; q++) src[q] = half_of(c, q, j) + (size_t)me * pe * es;
            cusim_nccl_reduce(o->dt, o->red, o->buf + ((size_t)me * cnt + off) * es, src, n, m);
        }
        return ncclSuccess;
    }
    case K_SEND:
    case K_RECV: break;
    }
    return cusim_nccl_fail(o, ncclInternalError, "%s: not a collective", cusim_nccl_api_name(o->kind));
}

/* ---- send and receive ------------------------------------------------------------------- */

static void p2p_start(op *o)
{
    ncclComm_t c = o->comm;
    size_t bytes = o->count * cusim_nccl_dtype_size(o->dt);
    o->msg_seq = o->kind == K_SEND ? c->send_seq[o->root]++ : c->recv_seq[o->root]++;
    o->nchunks =
        bytes ? (uint32_t)((bytes + MBOX_BYTES - 1) / MBOX_BYTES) : 1; /* an empty message still matches */
    o->started = true;
}

/* Moves o along if it can: true when it did something (or finished, or failed). */
static bool send_step(op *o)
{
    ncclComm_t c = o->comm;
    mbox_head *b = mbox(c, c->rank, o->root);
    if (atomic_load_explicit(&b->refused, memory_order_acquire)) {
        cusim_nccl_fail(o, ncclInvalidUsage, "ncclSend: %s", b->why);
        return true;
    }
    uint32_t posted = atomic_load_explicit(&b->posted, memory_order_relaxed);
    if (atomic_load_explicit(&b->taken, memory_order_acquire) != posted) return false; /* not taken yet */
    if (o->chunk == o->nchunks) {
        o->done = true; /* the receiver took the last chunk */
        return true;
    }
    size_t off = (size_t)o->chunk * MBOX_BYTES, left = o->buf_bytes - off;
    size_t k = left < MBOX_BYTES ? left : MBOX_BYTES;
    memcpy(mbox_data(b), o->buf + off, k);
    b->bytes = (uint32_t)k;
    b->msg_seq = o->msg_seq;
    b->dtype = o->dt;
    b->count = o->count;
    atomic_store_explicit(&b->posted, posted + 1, memory_order_release);
    cusim_nccl_wake(&b->posted);
    o->chunk++;
    return true;
}

static bool recv_step(op *o)
{
    ncclComm_t c = o->comm;
    mbox_head *b = mbox(c, o->root, c->rank);
    uint32_t taken = atomic_load_explicit(&b->taken, memory_order_relaxed);
    if (atomic_load_explicit(&b->posted, memory_order_acquire) == taken) return false; /* nothing yet */
    if (o->chunk == 0 && (b->msg_seq != o->msg_seq || b->count != o->count || b->dtype != (int32_t)o->dt)) {
        snprintf(
            b->why, sizeof b->why,
            "rank %d sent message #%u (count=%llu, %s) to rank %d, which called recv #%u (count=%llu, %s) "
            "from it",
            o->root, b->msg_seq, (unsigned long long)b->count, cusim_nccl_dtype_name(b->dtype), c->rank,
            o->msg_seq, (unsigned long long)o->count, cusim_nccl_dtype_name(o->dt));
        atomic_store_explicit(&b->refused, 1, memory_order_release);
        cusim_nccl_wake(&b->taken);
        cusim_nccl_fail(o, ncclInvalidUsage, "ncclRecv: %s", b->why);
        return true;
    }
    memcpy(o->buf + (size_t)o->chunk * MBOX_BYTES, mbox_data(b), b->bytes);
    atomic_store_explicit(&b->taken, taken + 1, memory_order_release);
    cusim_nccl_wake(&b->taken);
    if (++o->chunk == o->nchunks) o->done = true;
    return true;
}

/* One step of a send or a receive; whether it moved. */
static bool p2p_step(op *o) { return o->kind == K_SEND ? send_step(o) : recv_step(o); }

/* Runs the sends and receives in p[0..n) together until all are done or
 * one failed (the others then fail too). */
ncclResult_t cusim_nccl_run_p2p(op **p, int n)
{
    for (int i = 0; i < n; i++) p[i]->started ? (void)0 : p2p_start(p[i]);
    double start = 0;
    for (int idle = 0;;) {
        bool moved = false;
        int pending = 0;
        op *last = NULL;
        for (int i = 0; i < n; i++) {
            op *o = p[i];
            if (o->done) continue;
            while (!o->done && !o->result && p2p_step(o)) moved = true;
            if (o->result) {
                for (int k = 0; k < n; k++)
                    if (k != i && !p[k]->done) cusim_nccl_fail(p[k], o->result, "%s", o->msg);
                return o->result;
            }
            if (!o->done) pending++, last = o;
        }
        if (!pending) return ncclSuccess;
        if (moved) {
            idle = 0;
            start = 0;
            continue;
        }
        if (!cusim_nccl_backoff(idle++)) continue;
        if (start == 0) start = cusim_nccl_now_s();
        if (pending == 1) { /* sleep on the word the peer will change */
            mbox_head *b = last->kind == K_SEND ? mbox(last->comm, last->comm->rank, last->root)
                                                : mbox(last->comm, last->root, last->comm->rank);
            _Atomic uint32_t *w = last->kind == K_SEND ? &b->taken : &b->posted;
            uint32_t cur = atomic_load(w);
            bool ready =
                last->kind == K_SEND ? cur == atomic_load(&b->posted) : cur != atomic_load(&b->taken);
            if (!ready && !atomic_load(&b->refused)) cusim_nccl_sleep_on(w, cur);
        } else {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        for (int i = 0; i < n; i++) {
            op *o = p[i];
            /* a peer that finished this message and then destroyed its
             * communicator is no failure: seen gone, the message's last
             * step (which it made before going) is seen too */
            if (!o->done && atomic_load(&o->comm->ctl[o->root].gone))
                while (!o->done && !o->result && p2p_step(o)) {
                }
            if (o->done || o->result) continue;
            char what[160];
            snprintf(what, sizeof what, "to %s message #%u (count=%llu, %s)",
                     o->kind == K_SEND ? "receive its" : "send its", o->msg_seq, (unsigned long long)o->count,
                     cusim_nccl_dtype_name(o->dt));
            if (peer_check(o, o->root, start, what)) {
                for (int k = 0; k < n; k++)
                    if (k != i && !p[k]->done) cusim_nccl_fail(p[k], o->result, "%s", o->msg);
                return o->result;
            }
        }
    }
}
