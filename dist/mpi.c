/* mpi.c — the MPI transport of a process group (EM_TRANSPORT_MPI): the same
 * calls, the same check and the same failure policy as the TCP path
 * (pg.c, wire.c), with MPI moving the bytes. Built when meson finds MPI.
 *
 * MPI is initialised when the first MPI group is made (MPI_THREAD_MULTIPLE
 * asked for; with only MPI_THREAD_SERIALIZED every MPI call here holds one
 * process-wide mutex, never across a wait), unless the program initialised
 * it itself; what ember initialised it finalizes at process exit. A group's
 * rank and world are MPI_COMM_WORLD's, and it talks on a communicator of its
 * own (MPI_Comm_idup), whose errors come back as return codes.
 *
 * Every call is point-to-point messages on that communicator plus, for a
 * collective's data, one MPI collective once the call is checked. Tags:
 *   CHECK  a collective's call_header, from every rank to every other: each
 *          rank holds all the headers, and calls_compare gives every rank the
 *          same verdict (and the TCP path's message) without a second round;
 *   COUNTS the ranks' point-to-point rows, when the headers' send/recv totals
 *          disagree (p2p_compose names the unreceived send);
 *   SEND   a send's header, then DATA its bytes (a copy: the send is eager);
 *   RECV   a recv's header, to its source (which message it waits for);
 *   ABORT  a broken rank's note: the origin rank and its message.
 * Every wait for a peer's call polls its requests with MPI_Test until the
 * group's deadline,
 * and probes for an ABORT on the way, so a rank that never makes its call
 * is EM_ERR_TIMEOUT naming the call and the ranks missing, and a rank whose
 * call failed makes its peers fail at once naming it. A recv that finds its
 * source's collective header instead of a send, or its source's recv
 * announcement for a message this rank has not sent, fails as a mismatch
 * naming both calls (and tells the others), as on TCP.
 *
 * Reductions: f32/f64/i32 in place with MPI's own ops (MAX/MIN of floats
 * with an op of ours that propagates NaN, as the TCP path does); f16/bf16
 * widened to f32, reduced, rounded once; AVG is the sum divided by the
 * world size (collectives.c's rule). */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "dist/pg_impl.h"
#include "tensor/error_impl.h"

enum { TAG_CHECK = 1, TAG_COUNTS, TAG_SEND, TAG_DATA, TAG_RECV, TAG_ABORT };

#define SPIN_S 50e-6 /* seconds a wait spins on MPI_Test, then yields between tests */
#define YIELD_S 1.0  /* then sleeps SLEEP_NS between tests (a peer that long away is not near) */
#define SLEEP_NS 200000L

/* An eager send still in flight: its header and data copies live until MPI is done with them. */
typedef struct pending_send {
    MPI_Request rq[2];
    call_header h;
    void *data;
    struct pending_send *next;
} pending_send;

/* A broken rank's note to its peers (TAG_ABORT). */
typedef struct abort_note {
    int32_t origin; /* the rank the group broke on first */
    char text[512];
} abort_note;

typedef struct mpi_group {
    MPI_Comm comm;
    pending_send *sends;
    call_header *hs; /* world headers of the collective being checked */
    MPI_Request *rq; /* 2 * world requests of the check */
    int *peer;       /* 2 * world: the rank each request of the check waits for (-1: a send of ours) */
    call_header *wanted; /* wanted[r]: rank r's latest recv announced to us (seq: the message it waits for) */
    bool aborted;    /* this rank sent its note */
    abort_note note;
    MPI_Request *note_rq; /* world: the note's sends */
} mpi_group;

/* ---- MPI itself: initialisation, the lock, errors --------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static bool serialized; /* MPI gave only MPI_THREAD_SERIALIZED: every call holds mu */
static bool ready;
static MPI_Op op_max, op_min;

static void lk(void)
{
    if (serialized) pthread_mutex_lock(&mu);
}

static void ulk(void)
{
    if (serialized) pthread_mutex_unlock(&mu);
}

static void finalize_at_exit(void)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

/* inout[i] = in[i] max/min inout[i], NaN propagating (collectives.c's rule) */
static void nan_max(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    red_combine(*dt == MPI_DOUBLE ? EM_F64 : EM_F32, EM_RED_MAX, inout, in, *len);
}

static void nan_min(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    red_combine(*dt == MPI_DOUBLE ? EM_F64 : EM_F32, EM_RED_MIN, inout, in, *len);
}

/* Initialises MPI once per process (keeping a program's own initialisation). */
static em_status mpi_ready(const char *fn)
{
    static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&once);
    em_status s = EM_OK;
    if (!ready) {
        int inited = 0, fin = 0, level = 0;
        MPI_Finalized(&fin);
        MPI_Initialized(&inited);
        if (fin) {
            s = em_err(EM_ERR_DIST, "%s: MPI was finalized already in this process", fn);
        } else if (!inited) {
            if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level) != MPI_SUCCESS)
                s = em_err(EM_ERR_DIST, "%s: MPI_Init_thread failed", fn);
            else
                atexit(finalize_at_exit);
        } else {
            MPI_Query_thread(&level);
        }
        if (!s && level < MPI_THREAD_SERIALIZED)
            s = em_err(EM_ERR_DIST,
                       "%s: MPI was initialised with thread level %d; ember's communication thread needs "
                       "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (MPI_Init_thread)",
                       fn, level);
        if (!s) {
            serialized = level < MPI_THREAD_MULTIPLE;
            MPI_Op_create(nan_max, 1, &op_max);
            MPI_Op_create(nan_min, 1, &op_min);
            ready = true;
        }
    }
    pthread_mutex_unlock(&once);
    return s;
}

static void mpi_text(int code, char *buf, size_t n)
{
    char t[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, t, &len) != MPI_SUCCESS) len = snprintf(t, sizeof t, "MPI error %d", code);
    snprintf(buf, n, "%.*s", len, t);
}

static em_status mpi_failed(em_pg *pg, call *c, const char *what, int code)
{
    char d[160], t[MPI_MAX_ERROR_STRING];
    call_describe(&c->h, d, sizeof d);
    mpi_text(code, t, sizeof t);
    return call_fail(c, EM_ERR_DIST, "%s: rank %d: %s failed: %s", d, pg->rank, what, t);
}

/* ---- waiting ------------------------------------------------------------------------------ */

/* A peer's note, if one came: c fails naming its origin and text. */
static bool noted(em_pg *pg, call *c)
{
    int flag = 0;
    MPI_Status st;
    lk();
    MPI_Iprobe(MPI_ANY_SOURCE, TAG_ABORT, pg->mpi->comm, &flag, &st);
    if (!flag) {
        ulk();
        return false;
    }
    abort_note note = {0};
    MPI_Recv(&note, (int)sizeof note, MPI_BYTE, st.MPI_SOURCE, TAG_ABORT, pg->mpi->comm, MPI_STATUS_IGNORE);
    ulk();
    note.text[sizeof note.text - 1] = '\0';
    call_broke(pg, c, note.origin, note.text);
    return true;
}

static void pause_after(double waited)
{
    if (waited < SPIN_S) return;
    if (waited < YIELD_S) {
        sched_yield();
        return;
    }
    nanosleep(&(struct timespec){0, SLEEP_NS}, NULL);
}

/* Waits until every one of the n requests completed (MPI_REQUEST_NULL ones
 * count as done), c fails (a peer's note, or `watch`, run between tests
 * with the requests, finds something wrong), or the deadline: then EM_ERR_TIMEOUT naming
 * `what` and the ranks whose requests are still open (peer[i] >= 0; peer
 * NULL: "the other ranks"). */
static em_status wait_requests(em_pg *pg, call *c, int n, MPI_Request *rq, const int *peer, const char *what,
                               double deadline, bool (*watch)(em_pg *, call *, MPI_Request *))
{
    double start = pg_now();
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; i++) {
            if (rq[i] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            lk();
            int e = MPI_Test(&rq[i], &flag, MPI_STATUS_IGNORE);
            ulk();
            if (e != MPI_SUCCESS) return mpi_failed(pg, c, what, e);
            if (!flag) all = false;
        }
        if (all) return EM_OK;
        if (noted(pg, c)) return c->status;
        if (watch && watch(pg, c, rq)) return c->status;
        double now = pg_now();
        if (now >= deadline) {
            char d[160], who[160] = "";
            call_describe(&c->h, d, sizeof d);
            for (int i = 0; peer && i < n && strlen(who) < 120; i++)
                if (rq[i] != MPI_REQUEST_NULL && peer[i] >= 0)
                    snprintf(who + strlen(who), sizeof who - strlen(who), "%s%d", who[0] ? ", " : "",
                             peer[i]);
            return call_fail(c, EM_ERR_TIMEOUT,
                             "%s: rank %d waited %g s %s %s%s (is it stuck, or calling something else?)", d,
                             pg->rank, pg->timeout, what, who[0] ? "rank " : "the other ranks", who);
        }
        pause_after(now - start);
    }
}

/* After a failed wait: receives still posted are cancelled, so no late
 * message lands in memory the caller gives back. */
static void cancel_recvs(int n, MPI_Request *rq)
{
    lk();
    for (int i = 0; i < n; i++)
        if (rq[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&rq[i]);
            MPI_Request_free(&rq[i]);
        }
    ulk();
}

/* Frees the eager sends MPI is done with. */
static void reap_sends(em_pg *pg)
{
    pending_send **p = &pg->mpi->sends;
    while (*p) {
        int flag = 0;
        lk();
        MPI_Testall(2, (*p)->rq, &flag, MPI_STATUSES_IGNORE);
        ulk();
        if (!flag) {
            p = &(*p)->next;
            continue;
        }
        pending_send *done = *p;
        *p = done->next;
        free(done->data);
        free(done);
    }
}

/* ---- the check of a collective ---------------------------------------------------------------- */

/* Posts buf[r] <- rank r and rank r <- mine (`bytes` each, tag) for every
 * peer r, in the group's check requests, and waits for them all. */
static em_status exchange(em_pg *pg, call *c, int tag, void *buf, size_t bytes, const char *what,
                          double deadline)
{
    mpi_group *g = pg->mpi;
    int w = pg->world, me = pg->rank;
    char *b = buf;
    lk();
    for (int r = 0; r < w; r++) {
        g->rq[r] = g->rq[w + r] = MPI_REQUEST_NULL;
        g->peer[r] = r;
        g->peer[w + r] = -1;
        if (r == me) continue;
        MPI_Irecv(b + (size_t)r * bytes, (int)bytes, MPI_BYTE, r, tag, g->comm, &g->rq[r]);
        MPI_Isend(b + (size_t)me * bytes, (int)bytes, MPI_BYTE, r, tag, g->comm, &g->rq[w + r]);
    }
    ulk();
    em_status s = wait_requests(pg, c, 2 * w, g->rq, g->peer, what, deadline, NULL);
    if (s) cancel_recvs(w, g->rq); /* the sends read memory the group keeps while it lives */
    return s;
}

/* Every rank's header to every rank; every rank then reaches the same verdict. */
static em_status check(em_pg *pg, call *c, double deadline)
{
    int w = pg->world, me = pg->rank;
    mpi_group *g = pg->mpi;
    g->hs[me] = c->h;
    em_status s = exchange(pg, c, TAG_CHECK, g->hs, sizeof *g->hs, "for the call of", deadline);
    if (s) return s;
    char msg[512] = "";
    if (calls_compare(g->hs, w, msg, sizeof msg) == CMP_COUNTS) {
        /* a send is unreceived: every rank's counts name it */
        p2p_count *all = malloc(sizeof *all * (size_t)w * (size_t)w);
        p2p_count **rows = malloc(sizeof *rows * (size_t)w);
        if (!all || !rows) {
            free(all);
            free(rows);
            return call_fail(c, EM_ERR_OOM, "collective check: out of memory");
        }
        for (int r = 0; r < w; r++) rows[r] = all + (size_t)r * (size_t)w;
        p2p_row(pg, rows[me]);
        s = exchange(pg, c, TAG_COUNTS, all, sizeof *all * (size_t)w, "for the send/recv counts of",
                     deadline);
        if (!s) p2p_compose(g->hs, (const p2p_count *const *)rows, w, msg, sizeof msg);
        if (!s) free(all); /* else the group's sends may still read it */
        free(rows);
        if (s) return s;
    }
    return msg[0] ? call_fail(c, EM_ERR_DIST, "%s", msg) : EM_OK;
}

/* ---- a collective's data ------------------------------------------------------------------------ */

static MPI_Datatype wide_type(em_dtype dt)
{
    return dt == EM_F64 ? MPI_DOUBLE : dt == EM_I32 ? MPI_INT32_T : MPI_FLOAT;
}

static MPI_Op mpi_op(em_dtype dt, int op)
{
    if (op == EM_RED_MAX) return dt == EM_I32 ? MPI_MAX : op_max;
    if (op == EM_RED_MIN) return dt == EM_I32 ? MPI_MIN : op_min;
    return MPI_SUM; /* SUM, and AVG before its division */
}

static bool overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    const char *x = a, *y = b;
    return x < y + bn && y < x + an;
}

/* Bytes of scratch a collective's data needs: f16/bf16 reduce in f32
 * copies; a reduce_scatter whose out lies inside its in (a shard of its own
 * bucket) receives into a copy. Taken before the check, so that once every
 * rank's call is checked nothing local can fail. */
static size_t scratch_bytes(const em_pg *pg, const call *c)
{
    em_dtype dt = (em_dtype)c->h.dtype;
    bool half = dt == EM_F16 || dt == EM_BF16;
    int64_t n = c->h.count, m = n / pg->world;
    size_t es = em_dtype_size(dt);
    if (c->h.kind == CALL_ALL_REDUCE) return half ? (size_t)n * 4 : 0;
    if (c->h.kind != CALL_REDUCE_SCATTER) return 0;
    if (half) return (size_t)(n + m) * 4;
    return overlaps(c->in, (size_t)n * es, c->out, (size_t)m * es) ? (size_t)m * es : 0;
}

/* One MPI collective: what it moves (sbuf MPI_IN_PLACE where it allows). */
typedef struct coll {
    call_kind kind;
    const void *sbuf;
    void *rbuf;
    int scount, rcount; /* rcount: all_gather / gather's per rank */
    MPI_Datatype type;
    MPI_Op op;
    int root;
} coll;

/* Starts k: blocking when rq is NULL, else nonblocking into *rq. */
static int coll_start(const coll *k, MPI_Comm comm, MPI_Request *rq)
{
    void *sb = (void *)k->sbuf;
    switch (k->kind) {
    case CALL_ALL_REDUCE:
        return rq ? MPI_Iallreduce(sb, k->rbuf, k->rcount, k->type, k->op, comm, rq)
                  : MPI_Allreduce(sb, k->rbuf, k->rcount, k->type, k->op, comm);
    case CALL_REDUCE_SCATTER:
        return rq ? MPI_Ireduce_scatter_block(sb, k->rbuf, k->rcount, k->type, k->op, comm, rq)
                  : MPI_Reduce_scatter_block(sb, k->rbuf, k->rcount, k->type, k->op, comm);
    case CALL_BROADCAST:
        return rq ? MPI_Ibcast(k->rbuf, k->rcount, k->type, k->root, comm, rq)
                  : MPI_Bcast(k->rbuf, k->rcount, k->type, k->root, comm);
    case CALL_ALL_GATHER:
        return rq ? MPI_Iallgather(sb, k->scount, k->type, k->rbuf, k->rcount, k->type, comm, rq)
                  : MPI_Allgather(sb, k->scount, k->type, k->rbuf, k->rcount, k->type, comm);
    case CALL_GATHER:
        return rq ? MPI_Igather(sb, k->scount, k->type, k->rbuf, k->rcount, k->type, k->root, comm, rq)
                  : MPI_Gather(sb, k->scount, k->type, k->rbuf, k->rcount, k->type, k->root, comm);
    case CALL_BARRIER:
    case CALL_SEND:
    case CALL_RECV: break;
    }
    return MPI_SUCCESS;
}

/* Runs k for checked call c. Every rank made this very call (the check said
 * so) and nothing local can fail now, so MPI's blocking collective runs it:
 * only a dead rank could keep it from completing, and mpirun ends the job
 * then. (Measured on 2 ranks: MPI_Iallreduce polled with MPI_Test took 7.5
 * ms for 1 MiB, MPI_Allreduce 0.44 ms, as fast as MPI alone.) Under
 * MPI_THREAD_SERIALIZED, whose lock may not be held across a wait (two
 * groups' blocking calls could each wait for the other), the nonblocking
 * one instead, polled to the deadline. */
static em_status coll_run(em_pg *pg, call *c, const coll *k, double deadline)
{
    MPI_Request rq = MPI_REQUEST_NULL;
    lk();
    int e = coll_start(k, pg->mpi->comm, serialized ? &rq : NULL);
    ulk();
    if (e != MPI_SUCCESS) return mpi_failed(pg, c, "the collective", e);
    return serialized ? wait_requests(pg, c, 1, &rq, NULL, "for the data of", deadline, NULL) : EM_OK;
}

static em_status all_reduce(em_pg *pg, call *c, void *scratch, double deadline)
{
    em_dtype dt = (em_dtype)c->h.dtype;
    int64_t n = c->h.count;
    void *buf = scratch ? scratch : c->in; /* f16/bf16: an f32 copy */
    if (scratch) red_widen(dt, c->in, buf, n);
    coll k = {CALL_ALL_REDUCE, MPI_IN_PLACE, buf, 0, (int)n, wide_type(dt), mpi_op(dt, c->h.op), 0};
    em_status s = coll_run(pg, c, &k, deadline);
    if (s) return s;
    red_finish_avg(dt, c->h.op, buf, n, pg->world);
    if (scratch) red_narrow(dt, buf, c->in, n);
    return EM_OK;
}

static em_status reduce_scatter(em_pg *pg, call *c, void *scratch, double deadline)
{
    em_dtype dt = (em_dtype)c->h.dtype;
    int64_t total = c->h.count, m = total / pg->world;
    bool half = dt == EM_F16 || dt == EM_BF16;
    void *in = half ? scratch : c->in;
    void *out = half ? (char *)scratch + (size_t)total * 4 : scratch ? scratch : c->out;
    if (half) red_widen(dt, c->in, in, total);
    coll k = {CALL_REDUCE_SCATTER, in, out, 0, (int)m, wide_type(dt), mpi_op(dt, c->h.op), 0};
    em_status s = coll_run(pg, c, &k, deadline);
    if (s) return s;
    red_finish_avg(dt, c->h.op, out, m, pg->world);
    if (half)
        red_narrow(dt, out, c->out, m);
    else if (out != c->out)
        memcpy(c->out, out, (size_t)m * em_dtype_size(dt));
    return EM_OK;
}

/* A checked collective's data. */
static em_status data(em_pg *pg, call *c, void *scratch, double deadline)
{
    int bytes = (int)((size_t)c->h.count * em_dtype_size((em_dtype)c->h.dtype)); /* <= INT32_MAX: mpi_run */
    char *out = c->out;
    bool root = pg->rank == c->h.root;
    coll k = {.kind = (call_kind)c->h.kind, .type = MPI_BYTE, .root = c->h.root};
    switch ((call_kind)c->h.kind) {
    case CALL_ALL_REDUCE: return all_reduce(pg, c, scratch, deadline);
    case CALL_REDUCE_SCATTER: return reduce_scatter(pg, c, scratch, deadline);
    case CALL_BROADCAST: k.rbuf = c->in, k.rcount = bytes; return coll_run(pg, c, &k, deadline);
    case CALL_ALL_GATHER: /* in may already be out's own chunk (ZeRO gathers in place) */
    case CALL_GATHER:
        if (c->h.kind == CALL_ALL_GATHER || root) {
            memmove(out + (size_t)pg->rank * (size_t)bytes, c->in, (size_t)bytes);
            k.sbuf = MPI_IN_PLACE, k.rbuf = out, k.rcount = bytes;
        } else {
            k.sbuf = c->in, k.scount = bytes;
        }
        return coll_run(pg, c, &k, deadline);
    case CALL_BARRIER: /* the check was the rendezvous */
    case CALL_SEND:    /* not a collective */
    case CALL_RECV: return EM_OK;
    }
    return EM_OK;
}

/* ---- send and recv ------------------------------------------------------------------------------- */

/* Eager: header and a copy of the data handed to MPI, completed later. A
 * send of CUDA tensors (its header here, NCCL moves the data) waits until
 * the recv took the header, as on TCP: NCCL's send would hang otherwise. */
static em_status p2p_send(em_pg *pg, call *c, double deadline)
{
    int dst = c->h.root;
    size_t bytes = c->h.cuda ? 0 : (size_t)c->h.count * em_dtype_size((em_dtype)c->h.dtype);
    if (bytes > INT32_MAX)
        return call_fail(c, EM_ERR_UNSUPPORTED,
                         "send: the MPI transport sends at most 2^31-1 bytes in one call");
    pending_send *p = calloc(1, sizeof *p);
    void *copy = p ? malloc(bytes + 1) : NULL;
    if (!copy) {
        free(p);
        return call_fail(c, EM_ERR_OOM, "send: out of memory for a copy of %zu bytes", bytes);
    }
    peer_state *ps = &pg->peer[dst];
    p->h = c->h;
    p->h.seq = ps->sent + 1; /* the pair's message number, from 1 */
    p->data = copy;
    if (bytes) memcpy(copy, c->in, bytes);
    lk();
    int e = c->h.cuda ? MPI_Issend(&p->h, (int)sizeof p->h, MPI_BYTE, dst, TAG_SEND, pg->mpi->comm, &p->rq[0])
                      : MPI_Isend(&p->h, (int)sizeof p->h, MPI_BYTE, dst, TAG_SEND, pg->mpi->comm, &p->rq[0]);
    if (e == MPI_SUCCESS) e = MPI_Isend(copy, (int)bytes, MPI_BYTE, dst, TAG_DATA, pg->mpi->comm, &p->rq[1]);
    ulk();
    if (e != MPI_SUCCESS) {
        free(copy);
        free(p);
        return mpi_failed(pg, c, "MPI_Isend", e);
    }
    p->next = pg->mpi->sends;
    pg->mpi->sends = p;
    ps->sent++;
    ps->last_send = c->h;
    pg->p2p_sent++;
    if (!c->h.cuda) return EM_OK;
    return wait_requests(pg, c, 1, &p->rq[0], &dst, "for the recv of", deadline, NULL);
}

/* Takes the recv announcements that came (TAG_RECV: the peer waits for our
 * message number h.seq to it): the latest per peer is kept. */
static void take_announcements(em_pg *pg)
{
    mpi_group *g = pg->mpi;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        call_header h;
        lk();
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_RECV, g->comm, &flag, &st);
        if (flag) MPI_Recv(&h, (int)sizeof h, MPI_BYTE, st.MPI_SOURCE, TAG_RECV, g->comm, MPI_STATUS_IGNORE);
        ulk();
        if (!flag) return;
        if (h.seq > g->wanted[st.MPI_SOURCE].seq) g->wanted[st.MPI_SOURCE] = h;
    }
}

/* While a recv waits and its source's send is not there: the source's
 * collective header means it called a collective instead; its recv
 * announcement for a message we have not sent means it waits in a recv from
 * us as we wait in ours. Either is a mismatch naming both calls, unless the
 * send's header came meanwhile: MPI matches it to the posted receive *rq,
 * where no probe sees it, and the source sent it before the header of its
 * next call, which OpenMPI matches in the order sent; so *rq, tested after
 * the probes, tells a send that came late from one that never will (a
 * completed *rq is left MPI_REQUEST_NULL for the wait). */
static bool watch_recv(em_pg *pg, call *c, MPI_Request *rq)
{
    int src = c->h.root, flag = 0, done = 0;
    take_announcements(pg);
    call_header theirs = pg->mpi->wanted[src];
    bool waits = theirs.seq > pg->peer[src].sent;
    lk();
    if (!waits) MPI_Iprobe(src, TAG_CHECK, pg->mpi->comm, &flag, MPI_STATUS_IGNORE);
    if (waits || flag) MPI_Test(rq, &done, MPI_STATUS_IGNORE);
    if (!waits && flag && !done)
        MPI_Recv(&theirs, (int)sizeof theirs, MPI_BYTE, src, TAG_CHECK, pg->mpi->comm, MPI_STATUS_IGNORE);
    ulk();
    if ((!waits && !flag) || done) return false;
    if (waits) theirs.seq = c->h.seq; /* as a call, not a message number */
    call_mismatch(c, pg->rank, &c->h, src, &theirs);
    return true;
}

static em_status p2p_recv(em_pg *pg, call *c, double deadline)
{
    int src = c->h.root;
    call_header h;
    MPI_Request rq = MPI_REQUEST_NULL;
    /* announced to the source (eager, like a send), so a recv of its facing this one shows */
    pending_send *a = calloc(1, sizeof *a);
    if (!a) return call_fail(c, EM_ERR_OOM, "recv: out of memory");
    a->h = c->h;
    a->h.seq = pg->peer[src].recvd + 1; /* the message it waits for */
    a->rq[1] = MPI_REQUEST_NULL;
    lk();
    MPI_Isend(&a->h, (int)sizeof a->h, MPI_BYTE, src, TAG_RECV, pg->mpi->comm, &a->rq[0]);
    MPI_Irecv(&h, (int)sizeof h, MPI_BYTE, src, TAG_SEND, pg->mpi->comm, &rq);
    ulk();
    a->next = pg->mpi->sends;
    pg->mpi->sends = a;
    em_status s = wait_requests(pg, c, 1, &rq, &src, "for a send from", deadline, watch_recv);
    if (s) {
        cancel_recvs(1, &rq);
        return s;
    }
    h.root = pg->rank; /* h is the send: to us */
    if (h.dtype != c->h.dtype || h.count != c->h.count || h.cuda != c->h.cuda)
        return call_mismatch(c, pg->rank, &c->h, src, &h);
    size_t bytes = h.cuda ? 0 : (size_t)c->h.count * em_dtype_size((em_dtype)c->h.dtype);
    char one;
    lk();
    MPI_Irecv(bytes ? c->in : &one, (int)bytes, MPI_BYTE, src, TAG_DATA, pg->mpi->comm, &rq);
    ulk();
    s = wait_requests(pg, c, 1, &rq, &src, "for the data of a send from", deadline, NULL);
    if (s) {
        cancel_recvs(1, &rq);
        return s;
    }
    pg->peer[src].recvd++;
    pg->p2p_recvd++;
    return EM_OK;
}

/* ---- the group ----------------------------------------------------------------------------------- */

em_status mpi_run(em_pg *pg, call *c, double deadline)
{
    reap_sends(pg);
    take_announcements(pg); /* none pile up in MPI's queue */
    if (noted(pg, c)) return c->status;
    if (c->h.kind == CALL_SEND) return p2p_send(pg, c, deadline);
    if (c->h.kind == CALL_RECV) return p2p_recv(pg, c, deadline);
    /* MPI counts are ints; the check below makes every rank refuse together */
    size_t bytes = (size_t)c->h.count * em_dtype_size((em_dtype)c->h.dtype), need = 0;
    void *scratch = NULL;
    if (!c->h.cuda && (bytes > INT32_MAX || (need = scratch_bytes(pg, c)) > INT32_MAX))
        return call_fail(c, EM_ERR_UNSUPPORTED,
                         "the MPI transport moves at most 2^31-1 bytes per rank in one call");
    if (!c->h.cuda && need && !(scratch = malloc(need)))
        return call_fail(c, EM_ERR_OOM, "out of memory for %zu bytes of the MPI transport's scratch", need);
    em_status s = check(pg, c, deadline);
    if (!s && !c->h.cuda)
        s = data(pg, c, scratch, deadline); /* CUDA tensors: checked here, NCCL moves them */
    free(scratch);
    return s;
}

void mpi_abort(em_pg *pg, const call *c)
{
    mpi_group *g = pg->mpi;
    if (g->aborted) return;
    g->aborted = true;
    bool relay = pg->abort_origin >= 0; /* the group broke elsewhere first: pass that on */
    g->note.origin = relay ? pg->abort_origin : pg->rank;
    snprintf(g->note.text, sizeof g->note.text, "%s", relay ? pg->abort_text : c->msg);
    lk();
    for (int r = 0; r < pg->world; r++) {
        g->note_rq[r] = MPI_REQUEST_NULL;
        if (r != pg->rank)
            MPI_Isend(&g->note, (int)sizeof g->note, MPI_BYTE, r, TAG_ABORT, g->comm, &g->note_rq[r]);
    }
    ulk();
}

static void group_free(mpi_group *g)
{
    if (!g) return;
    free(g->hs);
    free(g->rq);
    free(g->peer);
    free(g->wanted);
    free(g->note_rq);
    free(g);
}

em_status mpi_join(em_pg *pg)
{
    em_status s = mpi_ready("em_pg_new");
    if (s) return s;
    int rank = 0, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank != pg->rank || world != pg->world)
        return em_err(
            EM_ERR_ARG,
            "em_pg_new: transport mpi: the config says rank %d of %d, but MPI_COMM_WORLD says rank %d of %d "
            "(an MPI group is MPI_COMM_WORLD)",
            pg->rank, pg->world, rank, world);
    mpi_group *g = calloc(1, sizeof *g);
    if (g) {
        g->hs = malloc(sizeof *g->hs * (size_t)world);
        g->rq = malloc(sizeof *g->rq * 2 * (size_t)world);
        g->peer = malloc(sizeof *g->peer * 2 * (size_t)world);
        g->wanted = calloc((size_t)world, sizeof *g->wanted);
        g->note_rq = malloc(sizeof *g->note_rq * (size_t)world);
    }
    if (!g || !g->hs || !g->rq || !g->peer || !g->wanted || !g->note_rq) {
        group_free(g);
        return em_err(EM_ERR_OOM, "em_pg_new: out of memory");
    }
    /* a communicator of its own, made without waiting past the timeout */
    MPI_Request rq = MPI_REQUEST_NULL;
    lk();
    int e = MPI_Comm_idup(MPI_COMM_WORLD, &g->comm, &rq);
    ulk();
    double start = pg_now(), deadline = start + pg->timeout;
    while (e == MPI_SUCCESS) {
        int flag = 0;
        lk();
        e = MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
        ulk();
        if (flag || e != MPI_SUCCESS) break;
        if (pg_now() >= deadline) {
            group_free(g); /* the request stays open: the communicator never came */
            return em_err(
                EM_ERR_TIMEOUT,
                "em_pg_new: transport mpi: rank %d waited %g s for the other ranks to make the group "
                "(every rank makes its groups in the same order)",
                pg->rank, pg->timeout);
        }
        pause_after(pg_now() - start);
    }
    if (e != MPI_SUCCESS) {
        char t[MPI_MAX_ERROR_STRING];
        mpi_text(e, t, sizeof t);
        group_free(g);
        return em_err(EM_ERR_DIST, "em_pg_new: transport mpi: MPI_Comm_idup failed: %s", t);
    }
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    pg->mpi = g;
    return EM_OK;
}

void mpi_leave(em_pg *pg)
{
    mpi_group *g = pg->mpi;
    if (!g) return;
    reap_sends(pg);
    int fin = 0;
    MPI_Finalized(&fin);
    if (pg->broken || g->sends) {
        /* messages still in flight may read or write the group's memory:
         * it stays allocated, and the communicator is left to MPI */
        return;
    }
    lk();
    if (!fin) MPI_Comm_free(&g->comm);
    ulk();
    group_free(g);
}

/* ---- the rendezvous under an MPI launcher ------------------------------------------------------------ */

/* An address the other machines reach this one at: EMBER_ADVERTISE_ADDR,
 * else the first IPv4 interface that is up and not loopback. */
static void reachable_addr(char *buf, size_t n)
{
    const char *adv = getenv("EMBER_ADVERTISE_ADDR");
    if (adv && *adv) {
        snprintf(buf, n, "%s", adv);
        return;
    }
    snprintf(buf, n, "127.0.0.1");
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs)) return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP)) {
            struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
            if ((ntohl(a.s_addr) >> 24) == 127) continue;
            inet_ntop(AF_INET, &a, buf, (socklen_t)n);
            break;
        }
    freeifaddrs(ifs);
}

/* What rank 0 tells the others: where its store listens, or why it does not. */
typedef struct store_addr {
    char host[128];
    char token[48];
    int32_t port; /* 0: no store; host holds rank 0's error */
} store_addr;

/* Broadcasts a from rank 0 over a communicator of its own, before the deadline. */
static em_status bcast_addr(store_addr *a, int rank, double timeout)
{
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Request rq = MPI_REQUEST_NULL;
    double start = pg_now(), deadline = start + timeout;
    lk();
    int e = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &rq);
    ulk();
    for (int stage = 0; e == MPI_SUCCESS && stage < 2; stage++) {
        if (stage == 1) {
            MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
            lk();
            e = MPI_Ibcast(a, (int)sizeof *a, MPI_BYTE, 0, comm, &rq);
            ulk();
        }
        while (e == MPI_SUCCESS) {
            int flag = 0;
            lk();
            e = MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
            ulk();
            if (flag) break;
            if (pg_now() >= deadline)
                return em_err(EM_ERR_TIMEOUT,
                              "em_pg_from_env: transport mpi: rank %d waited %g s for rank 0's store address "
                              "(does every rank call em_pg_from_env?)",
                              rank, timeout);
            pause_after(pg_now() - start);
        }
    }
    if (e != MPI_SUCCESS) {
        char t[MPI_MAX_ERROR_STRING];
        mpi_text(e, t, sizeof t);
        return em_err(EM_ERR_DIST, "em_pg_from_env: transport mpi: sharing the store's address failed: %s",
                      t);
    }
    lk();
    MPI_Comm_free(&comm);
    ulk();
    return EM_OK;
}

em_status mpi_rendezvous(double timeout, int *rank, int *world, em_store **store, em_store_server **server)
{
    *store = NULL;
    *server = NULL;
    em_status s = mpi_ready("em_pg_from_env");
    if (s) return s;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    if (timeout <= 0) timeout = EM_DIST_DEFAULT_TIMEOUT;
    store_addr a = {0};
    if (*rank == 0) {
        /* on one machine (OpenMPI says how many ranks share this node) loopback will do */
        const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        bool local = *world == 1 || (ls && atoi(ls) == *world);
        uint8_t r[16];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
            snprintf(a.host, sizeof a.host, "cannot get random bytes: %s", strerror(errno));
        } else {
            for (int i = 0; i < 16; i++) snprintf(a.token + 2 * i, 3, "%02x", r[i]);
            *server = em_store_server_start(local ? "127.0.0.1" : "0.0.0.0", 0, a.token);
            if (*server) {
                a.port = em_store_server_port(*server);
                if (local)
                    snprintf(a.host, sizeof a.host, "127.0.0.1");
                else
                    reachable_addr(a.host, sizeof a.host);
            } else {
                snprintf(a.host, sizeof a.host, "%s", em_last_error());
            }
        }
    }
    s = bcast_addr(&a, *rank, timeout);
    if (!s && a.port == 0)
        s = em_err(EM_ERR_DIST, "em_pg_from_env: transport mpi: rank 0 could not start the store: %s",
                   a.host);
    if (!s) {
        *store = em_store_connect(a.host, a.port, a.token, timeout);
        if (!*store) s = em_last_status();
    }
    if (s) {
        held_error h;
        error_hold(&h, s);
        em_store_server_stop(*server);
        *server = NULL;
        error_restore(&h);
    }
    return s;
}
