/* wire.c — what travels on a process group's connections, and how every call
 * is checked against the other ranks' calls.
 *
 * Frames. Everything on a connection is a frame (pg_impl.h: magic, type,
 * number, length, a call header) or data a frame announced: a SEND frame's
 * len bytes, or a collective's data after a DATA frame. A rank reads a
 * connection only where a frame begins, and takes a frame only where it can
 * be taken (on_frame); anything else fails the call. So a stale or foreign
 * header is never taken for a verdict, nor a header for data.
 *
 * Collectives over TCP (check_call). The other ranks send rank 0 a CALL
 * frame (the call's header: number, kind, dtype, count, op, root, and the
 * rank's send/recv totals) and wait for a VERDICT with the same number;
 * rank 0 compares every header with its own. When the calls agree but the
 * totals of messages sent and received do not, a send is unreceived: rank 0
 * asks everyone for its counts per peer (ASK, COUNTS) to name it. Everyone
 * gets the same verdict. Then data moves; the first bytes of a call on a
 * connection go after a DATA frame, so a rank still waiting for its verdict
 * (reading every connection) knows a peer that has started.
 *
 * send/recv (p2p_run). The receiver sends the sender a RECV frame (its
 * header, and the pair's message number it waits for) and waits for the
 * SEND frame with that number; the sender writes its SEND frame and data
 * without waiting for the recv (a send is eager: it completes once its data
 * is handed over), reading meanwhile what the receiver sends: RECV frames,
 * which acknowledge its messages, and, when both send each other more than
 * the connection buffers hold, the other's message, which it keeps (a
 * stash) for its own recv, so neither blocks. A send and its recv agree on
 * dtype, count and the number of collectives before them: a message never
 * crosses a collective. A sender may exit once its send is done; when its
 * close (with our announcement unread) resets the connection, the receiver
 * cannot write its RECV frame, and takes the SEND frame already in its
 * socket all the same.
 *
 * Reading while waiting. Whatever a rank waits for, it reads every peer's
 * connection and judges each frame where it is (on_frame): a RECV for a
 * message not yet sent (the peer waits in recv for us), a SEND (the peer
 * sent to us), a CALL at rank 0 (the peer is in a collective). Each is a
 * mismatch, failing at once with a message naming both calls, when this
 * rank is in a call that cannot meet it: a collective before which the
 * peer made its call, or a send/recv with that very peer; otherwise it is
 * left in place for a later call. Every frame carries the number of
 * collectives its rank had called, which tells a peer that already finished
 * the collective this rank is in (its frame is for later) from one that
 * never came to it (a mismatch).
 *
 * CUDA tensors. Their calls take the same check, on the CPU and before NCCL
 * sees them (the header says cuda, and no data moves here); a send of CUDA
 * tensors also waits for its recv's RECV frame (W_ACK), as NCCL's send,
 * which would hang without one, does.
 *
 * Notes. A rank whose call fails sends its reason in an ABORT frame to every
 * peer that reads a frame from it next (never into data, where it would be
 * read as data), then closes its sockets; a rank that reads a note fails
 * naming that reason and the rank it came from. In shared memory the note
 * is also written in the segment (shm.c).
 *
 * What only the timeout finds: a rank that makes no call, and a cycle of
 * three or more ranks each waiting in recv for the next. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "dist/pg_impl.h"
#include "ember/tensor.h"

#define FRAME_MAGIC 0x656d6266u /* "embf" */
#define TEXT_MAX 511            /* bytes of a verdict's or a note's text */

static const char *frame_name(uint32_t t)
{
    static const char *names[] = {
        "?",           "call header", "verdict",     "request for counts", "table of counts",
        "data header", "send header", "recv header", "failure note"};
    return t >= FR_CALL && t <= FR_ABORT ? names[t] : "?";
}

/* Bytes of a call's data on the connections: none for CUDA tensors (NCCL moves them). */
static size_t call_bytes(const call_header *h)
{
    return h->cuda ? 0 : (size_t)h->count * em_dtype_size((em_dtype)h->dtype);
}

/* Do a send's header and a recv's agree (the peers are the connection's)? */
static bool p2p_agree(const call_header *send, const call_header *recv)
{
    return send->dtype == recv->dtype && send->count == recv->count && send->cuda == recv->cuda;
}

/* ---- what a rank waits for, and what it does with a frame ----------------------------- */

typedef enum wait_kind {
    W_CALLS,   /* rank 0, checking a collective: every rank's CALL */
    W_VERDICT, /* another rank, checking a collective: rank 0's VERDICT */
    W_COUNTS,  /* rank 0: every rank's COUNTS */
    W_DATA,    /* in a collective's data: the peer's DATA frame */
    W_SHM,     /* in a collective in shared memory: frames can only show a mismatch */
    W_SEND,    /* in recv: the peer's SEND frame */
    W_SENDING, /* in send: acknowledgements, the peer's own send (stashed) */
    W_ACK      /* a send of CUDA tensors: the peer's RECV for it, before NCCL is asked to send */
} wait_kind;

typedef struct waiter {
    wait_kind kind;
    int peer;         /* W_DATA, W_SEND, W_SENDING, W_ACK */
    call_header *hs;  /* W_CALLS: the headers by rank */
    p2p_count **rows; /* W_COUNTS: the tables by rank */
    bool *in;         /* W_CALLS, W_COUNTS: the ranks that answered */
    int missing;
    bool done;
    char text[TEXT_MAX + 1]; /* W_VERDICT: rank 0's verdict ("": go) */
} waiter;

enum { F_TAKEN, F_HELD, F_FAIL };

static bool collective(wait_kind k) { return k <= W_SHM; }

/* Does w still need a frame from rank r? A frame of r's left for later there
 * would block the wait forever. */
static bool awaited(const waiter *w, int r)
{
    switch (w->kind) {
    case W_CALLS:
    case W_COUNTS: return !w->in[r];
    case W_VERDICT: return r == 0;
    case W_DATA:
    case W_SEND:
    case W_ACK: return r == w->peer;
    case W_SHM:
    case W_SENDING: return false;
    }
    return false;
}

/* Does w fail when rank r's connection closes? Rank 0 checking needs every
 * rank; otherwise only the ranks w waits for matter (a peer that finished
 * its part, of a collective or of nothing we wait for, may have exited). */
static bool needs(const waiter *w, int r)
{
    return w->kind == W_CALLS || w->kind == W_COUNTS || awaited(w, r);
}

/* Rank a's call against rank b's: the message names both, the lower rank first. */
em_status call_mismatch(call *c, int a, const call_header *ha, int b, const call_header *hb)
{
    if (a > b) {
        int t = a;
        a = b;
        b = t;
        const call_header *th = ha;
        ha = hb;
        hb = th;
    }
    char da[160], db[160], where[128] = "";
    call_describe(ha, da, sizeof da);
    call_describe(hb, db, sizeof db);
    if (ha->seq != hb->seq)
        snprintf(where, sizeof where, " (rank %d after %llu collectives, rank %d after %llu)", a,
                 (unsigned long long)ha->seq, b, (unsigned long long)hb->seq);
    return call_fail(c, EM_ERR_DIST, "call mismatch: rank %d called %s, rank %d called %s%s", a, da, b, db,
                     where);
}

static em_status unexpected(em_pg *pg, call *c, int r, const frame *f)
{
    char d[160];
    call_describe(&c->h, d, sizeof d);
    if (f->magic != FRAME_MAGIC || f->type < FR_CALL || f->type > FR_ABORT)
        return call_fail(
            c, EM_ERR_DIST,
            "%s: rank %d read bytes from rank %d that are not a frame (a protocol error: a bug in "
            "ember, or something else writing to its connections)",
            d, pg->rank, r);
    return call_fail(
        c, EM_ERR_DIST,
        "%s: rank %d got an unexpected %s #%llu from rank %d (a protocol error: a bug in ember, or "
        "something else writing to its connections)",
        d, pg->rank, frame_name(f->type), (unsigned long long)f->seq, r);
}

em_status call_broke(em_pg *pg, call *c, int origin, const char *text)
{
    if (pg->abort_origin < 0) {
        pg->abort_origin = origin;
        snprintf(pg->abort_text, sizeof pg->abort_text, "%s", text);
    }
    char d[160];
    call_describe(&c->h, d, sizeof d);
    return call_refail(c, EM_ERR_DIST, "%s: the group broke on rank %d: %s", d, origin, text);
}

/* Reads up to a whole frame from rank r into its buffer, never blocking.
 * 1: a whole frame is there; 0: not yet; -1: closed (errno 0) or failed. */
static int frame_pull(em_pg *pg, int r)
{
    peer_state *p = &pg->peer[r];
    while (p->in_got < sizeof p->in) {
        ssize_t n = recv(pg->fd[r], (char *)&p->in + p->in_got, sizeof p->in - p->in_got, MSG_DONTWAIT);
        if (n > 0) {
            p->in_got += (size_t)n;
            continue;
        }
        if (n == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
    return 1;
}

/* The text after a frame (a verdict, a note), NUL-terminated in text. */
static em_status read_text(em_pg *pg, call *c, int r, const frame *f, char *text, double deadline)
{
    if (f->len > TEXT_MAX) return unexpected(pg, c, r, f);
    if (f->len && io_recv(pg, c, r, text, f->len, deadline)) return c->status;
    text[f->len] = '\0';
    return EM_OK;
}

static int take_note(em_pg *pg, call *c, int r, double deadline)
{
    frame f = pg->peer[r].in;
    pg->peer[r].in_got = 0;
    char text[TEXT_MAX + 1];
    if (read_text(pg, c, r, &f, text, deadline)) return F_FAIL;
    call_broke(pg, c, f.h.root >= 0 && f.h.root < pg->world ? f.h.root : r, text);
    return F_FAIL;
}

/* After an I/O error with rank r (c has failed): a note r left in what it
 * sent us is the better reason. */
static em_status lost(em_pg *pg, call *c, int r)
{
    peer_state *p = &pg->peer[r];
    for (int i = 0; i < 64 && frame_pull(pg, r) == 1 && p->in.magic == FRAME_MAGIC; i++) {
        if (p->in.type == FR_ABORT) {
            take_note(pg, c, r, pg_now() + 1);
            break;
        }
        if (p->in.len || p->in.type == FR_SEND) break; /* what follows is not a frame */
        p->in_got = 0;                                 /* the call failed: this frame no longer matters */
    }
    return c->status;
}

/* Writes frame f (magic set here) and its payload of f->len bytes, if any. */
static em_status frame_put(em_pg *pg, call *c, int r, frame *f, const void *payload, double deadline)
{
    f->magic = FRAME_MAGIC;
    pg->peer[r].out_ok = false;
    em_status s = io_send(pg, c, r, f, sizeof *f, deadline);
    if (!s && payload && f->len) s = io_send(pg, c, r, payload, f->len, deadline);
    if (s) return lost(pg, c, r);
    pg->peer[r].out_ok = true;
    return EM_OK;
}

void p2p_row(const em_pg *pg, p2p_count *row)
{
    for (int r = 0; r < pg->world; r++) {
        const peer_state *p = &pg->peer[r];
        row[r] = (p2p_count){
            .sent = p->sent, .recvd = p->recvd, .dtype = p->last_send.dtype, .count = p->last_send.count};
    }
}

static em_status send_counts(em_pg *pg, call *c, double deadline)
{
    size_t n = (size_t)pg->world * sizeof(p2p_count);
    p2p_count *row = malloc(n);
    if (!row) return call_fail(c, EM_ERR_OOM, "collective check: out of memory");
    p2p_row(pg, row);
    frame f = {.type = FR_COUNTS, .seq = c->h.seq, .len = n};
    em_status s = frame_put(pg, c, 0, &f, row, deadline);
    free(row);
    return s;
}

/* A frame of rank r's send or recv met while this rank is in collective c:
 * made before r's own collective c->h.seq, so r never came to this one
 * without it (a mismatch); after it (r finished this collective already),
 * it is for later. */
static int collective_meets(em_pg *pg, call *c, const waiter *w, int r, const frame *f)
{
    if (f->h.seq == c->h.seq) {
        call_mismatch(c, pg->rank, &c->h, r, &f->h);
        return F_FAIL;
    }
    if (f->h.seq > c->h.seq && w->kind != W_DATA) return F_HELD;
    unexpected(pg, c, r, f);
    return F_FAIL;
}

static int start_stash(em_pg *pg, call *c, int r)
{
    peer_state *p = &pg->peer[r];
    p->st = p->in;
    p->in_got = 0;
    p->st_data = malloc(p->st.len ? p->st.len : 1);
    if (!p->st_data) {
        call_fail(c, EM_ERR_OOM, "send: out of memory keeping the %llu bytes rank %d sent meanwhile",
                  (unsigned long long)p->st.len, r);
        return F_FAIL;
    }
    p->st_got = 0;
    p->st_on = true;
    return F_TAKEN;
}

/* Rank r's whole frame (in its buffer), met while waiting as w says. */
static int on_frame(em_pg *pg, call *c, waiter *w, int r, double deadline)
{
    peer_state *p = &pg->peer[r];
    frame f = p->in;
    if (f.magic != FRAME_MAGIC) {
        unexpected(pg, c, r, &f);
        return F_FAIL;
    }
    switch ((frame_type)f.type) {
    case FR_ABORT: return take_note(pg, c, r, deadline);
    case FR_RECV:
        if (f.seq <= p->sent) { /* r's recv of a message we sent: acknowledged */
            if (f.seq != p->acked + 1) break;
            p->acked = f.seq;
            p->in_got = 0;
            if (f.seq == p->sent && !p2p_agree(&p->last_send, &f.h)) {
                call_mismatch(c, pg->rank, &p->last_send, r, &f.h);
                return F_FAIL;
            }
            if (w->kind == W_ACK && w->peer == r && f.seq == p->sent) w->done = true;
            return F_TAKEN;
        }
        if (f.seq != p->sent + 1) break;
        /* r waits in recv for a message we have not sent */
        if (collective(w->kind)) return collective_meets(pg, c, w, r, &f);
        if (w->kind == W_SEND && w->peer == r) { /* and we wait in recv for r */
            call_mismatch(c, pg->rank, &c->h, r, &f.h);
            return F_FAIL;
        }
        return F_HELD;
    case FR_SEND:
        if (f.seq != p->recvd + 1 + (p->st_on ? 1 : 0) || f.len != call_bytes(&f.h)) break;
        if (collective(w->kind)) return collective_meets(pg, c, w, r, &f);
        if (w->kind == W_SEND && w->peer == r) {
            w->done = true;
            return F_HELD; /* p2p_recv takes it */
        }
        if (w->kind == W_SENDING && w->peer == r && !p->st_on) return start_stash(pg, c, r);
        if (w->kind == W_ACK && w->peer == r) { /* both send, neither receives: NCCL would hang */
            call_mismatch(c, pg->rank, &c->h, r, &f.h);
            return F_FAIL;
        }
        return F_HELD;
    case FR_CALL:
        if (pg->rank != 0) break;
        if (w->kind == W_CALLS && !w->in[r]) {
            w->hs[r] = f.h;
            w->in[r] = true;
            w->missing--;
            w->done = w->missing == 0;
            p->in_got = 0;
            return F_TAKEN;
        }
        if (!collective(w->kind) && w->peer == r) { /* r went on to a collective */
            call_mismatch(c, pg->rank, &c->h, r, &f.h);
            return F_FAIL;
        }
        if (!collective(w->kind)) return F_HELD;
        break;
    case FR_VERDICT:
    case FR_ASK:
        if (w->kind != W_VERDICT || r != 0 || f.seq != c->h.seq) break;
        p->in_got = 0;
        if (f.type == FR_ASK) return send_counts(pg, c, deadline) ? F_FAIL : F_TAKEN;
        if (read_text(pg, c, 0, &f, w->text, deadline)) return F_FAIL;
        w->done = true;
        return F_TAKEN;
    case FR_COUNTS:
        if (w->kind != W_COUNTS || f.seq != c->h.seq || w->in[r] || f.len != pg->world * sizeof(p2p_count))
            break;
        p->in_got = 0;
        if (io_recv(pg, c, r, w->rows[r], f.len, deadline)) return F_FAIL;
        w->in[r] = true;
        w->missing--;
        w->done = w->missing == 0;
        return F_TAKEN;
    case FR_DATA:
        if (f.seq != c->h.seq) break;
        if (w->kind == W_DATA && w->peer == r) {
            p->in_got = 0;
            w->done = true;
            return F_TAKEN;
        }
        if (w->kind == W_VERDICT && r != 0) return F_HELD; /* r has its verdict: its data follows */
        break;
    }
    unexpected(pg, c, r, &f);
    return F_FAIL;
}

/* Reads every peer's connection until w is done, the deadline passes, or a
 * frame fails c. */
static em_status wait_frames(em_pg *pg, call *c, waiter *w, double deadline)
{
    int n = pg->world;
    bool *held = calloc((size_t)n, sizeof *held);
    struct pollfd *pf = malloc(sizeof *pf * (size_t)n);
    int *who = malloc(sizeof *who * (size_t)n);
    if (!held || !pf || !who) {
        free(held);
        free(pf);
        free(who);
        return call_fail(c, EM_ERR_OOM, "process group: out of memory");
    }
    em_status s = EM_OK;
    while (!s) {
        for (int r = 0; r < n && !s && !w->done; r++) { /* whole frames first */
            if (r == pg->rank || held[r] || pg->peer[r].in_got < sizeof(frame)) continue;
            int a = on_frame(pg, c, w, r, deadline);
            if (a == F_FAIL) s = c->status;
            if (a == F_HELD) held[r] = true;
            if (a == F_HELD && awaited(w, r) && !w->done) s = unexpected(pg, c, r, &pg->peer[r].in);
        }
        if (s || w->done) break;
        int np = 0;
        for (int r = 0; r < n && !s; r++) {
            if (r == pg->rank || held[r]) continue;
            if (pg->peer[r].closed && needs(w, r)) s = peer_io_error(pg, c, r, "waiting for", 0);
            if (pg->peer[r].closed) continue;
            who[np] = r;
            pf[np++] = (struct pollfd){.fd = pg->fd[r], .events = POLLIN};
        }
        if (s) break;
        int k = poll(pf, (nfds_t)np, pg_ms_until(deadline));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            s = peer_io_error(pg, c, np ? who[0] : 0, "waiting on", errno);
            break;
        }
        if (k == 0) {
            if (pg_now() < deadline) continue;
            int r = w->kind == W_SEND || w->kind == W_ACK ? w->peer : 0;
            for (int q = 0; (w->kind == W_CALLS || w->kind == W_COUNTS) && q < n; q++)
                if (!w->in[q]) {
                    r = q;
                    break;
                }
            s = peer_timed_out(pg, c, r,
                               w->kind == W_SEND  ? "for data from"
                               : w->kind == W_ACK ? "for the recv of"
                                                  : "for");
            break;
        }
        for (int i = 0; i < np && !s; i++) {
            if (!pf[i].revents) continue;
            if (frame_pull(pg, who[i]) >= 0) continue;
            if (needs(w, who[i]))
                s = peer_io_error(pg, c, who[i], "waiting for", errno);
            else
                pg->peer[who[i]].closed = true;
        }
    }
    free(held);
    free(pf);
    free(who);
    return s;
}

/* ---- the check of a collective over TCP ------------------------------------------------ */

static bool same_call(const call_header *a, const call_header *b)
{
    if (a->kind != b->kind || a->seq != b->seq || a->cuda != b->cuda) return false;
    if (a->kind == CALL_BARRIER) return true;
    if (a->dtype != b->dtype || a->count != b->count) return false;
    if ((a->kind == CALL_ALL_REDUCE || a->kind == CALL_REDUCE_SCATTER) && a->op != b->op) return false;
    if ((a->kind == CALL_BROADCAST || a->kind == CALL_GATHER) && a->root != b->root) return false;
    return true;
}

int calls_compare(const call_header *hs, int world, char *msg, size_t n)
{
    msg[0] = '\0';
    uint64_t sent = 0, recvd = 0;
    for (int r = 0; r < world; r++) {
        sent += hs[r].sent;
        recvd += hs[r].recvd;
    }
    if (sent != recvd) return CMP_COUNTS; /* first: a send left unreceived came before this call */
    for (int r = 1; r < world; r++)
        if (!same_call(&hs[r], &hs[0])) {
            char mine[160], theirs[160];
            call_describe(&hs[0], mine, sizeof mine);
            call_describe(&hs[r], theirs, sizeof theirs);
            snprintf(msg, n, "call mismatch at call #%llu: rank 0 called %s, rank %d called %s%s",
                     (unsigned long long)hs[0].seq, mine, r, theirs,
                     hs[r].seq != hs[0].seq ? " (the ranks have made different numbers of calls)" : "");
            return CMP_CALLS;
        }
    return CMP_OK;
}

/* Appends to msg (n bytes in all) what fits. */
static void append(char *msg, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *msg, size_t n, const char *fmt, ...)
{
    size_t k = strlen(msg);
    if (k + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + k, n - k, fmt, ap);
    va_end(ap);
}

void p2p_compose(const call_header *hs, const p2p_count *const *rows, int world, char *msg, size_t n)
{
    snprintf(msg, n, "call mismatch at call #%llu: ", (unsigned long long)hs[0].seq);
    int shown = 0, more = 0;
    for (int a = 0; a < world; a++)
        for (int b = 0; b < world; b++) {
            uint64_t sent = rows[a][b].sent, got = rows[b][a].recvd;
            if (a == b || sent <= got) continue;
            if (shown == 2) {
                more++;
                continue;
            }
            call_header sh = {
                .kind = CALL_SEND, .dtype = rows[a][b].dtype, .count = rows[a][b].count, .root = b};
            char ds[160], db[160];
            call_describe(&sh, ds, sizeof ds);
            call_describe(&hs[b], db, sizeof db);
            append(msg, n, "%srank %d called %s, rank %d called %s without receiving it", shown ? "; " : "",
                   a, ds, b, db);
            if (sent - got > 1)
                append(msg, n, " (%llu of rank %d's sends to rank %d are unreceived; the last is named)",
                       (unsigned long long)(sent - got), a, b);
            shown++;
        }
    if (more) append(msg, n, "; and %d more unreceived", more);
    if (!shown) append(msg, n, "the ranks' send and recv counts disagree (a protocol error)");
}

/* Rank 0, when the totals disagree: everyone's counts, and the message. */
static em_status gather_counts(em_pg *pg, call *c, const call_header *hs, char *msg, size_t msgn,
                               double deadline)
{
    int n = pg->world;
    p2p_count *all = malloc(sizeof *all * (size_t)n * (size_t)n), **rows = malloc(sizeof *rows * (size_t)n);
    bool *in = calloc((size_t)n, sizeof *in);
    em_status s = EM_OK;
    if (!all || !rows || !in) s = call_fail(c, EM_ERR_OOM, "collective check: out of memory");
    for (int r = 0; r < n && !s; r++) rows[r] = all + (size_t)r * (size_t)n;
    if (!s) {
        p2p_row(pg, rows[0]);
        in[0] = true;
        for (int r = 1; r < n && !s; r++) {
            frame f = {.type = FR_ASK, .seq = c->h.seq};
            s = frame_put(pg, c, r, &f, NULL, deadline);
        }
    }
    if (!s) {
        waiter w = {.kind = W_COUNTS, .rows = rows, .in = in, .missing = n - 1};
        s = wait_frames(pg, c, &w, deadline);
    }
    if (!s) p2p_compose(hs, (const p2p_count *const *)rows, n, msg, msgn);
    free(all);
    free(rows);
    free(in);
    return s;
}

em_status check_call(em_pg *pg, call *c, double deadline)
{
    int n = pg->world;
    if (pg->rank != 0) {
        frame f = {.type = FR_CALL, .seq = c->h.seq, .h = c->h};
        if (frame_put(pg, c, 0, &f, NULL, deadline)) return c->status;
        waiter w = {.kind = W_VERDICT};
        if (wait_frames(pg, c, &w, deadline)) return c->status;
        return w.text[0] ? call_fail(c, EM_ERR_DIST, "%s", w.text) : EM_OK;
    }
    call_header *hs = malloc(sizeof *hs * (size_t)n);
    bool *in = calloc((size_t)n, sizeof *in);
    if (!hs || !in) {
        free(hs);
        free(in);
        return call_fail(c, EM_ERR_OOM, "collective check: out of memory");
    }
    hs[0] = c->h;
    in[0] = true;
    waiter w = {.kind = W_CALLS, .hs = hs, .in = in, .missing = n - 1};
    char msg[512] = "";
    em_status s = wait_frames(pg, c, &w, deadline);
    if (!s && calls_compare(hs, n, msg, sizeof msg) == CMP_COUNTS)
        s = gather_counts(pg, c, hs, msg, sizeof msg, deadline);
    free(hs);
    free(in);
    for (int r = 1; r < n && !s; r++) {
        frame f = {.type = FR_VERDICT, .seq = c->h.seq, .len = strlen(msg)};
        s = frame_put(pg, c, r, &f, msg, deadline);
    }
    if (s) return s;
    return msg[0] ? call_fail(c, EM_ERR_DIST, "%s", msg) : EM_OK;
}

/* ---- a collective's data over TCP ----------------------------------------------------- */

em_status peer_exchange(em_pg *pg, call *c, int sr, const void *sp, size_t sn, int rr, void *rp, size_t rn,
                        double deadline)
{
    frame df = {.magic = FRAME_MAGIC, .type = FR_DATA, .seq = c->h.seq};
    size_t hs = sizeof df; /* bytes of our DATA frame sent (all: none to send) */
    if (sn && !pg->peer[sr].data_out) {
        hs = 0;
        pg->peer[sr].data_out = true;
        pg->peer[sr].out_ok = false; /* it reads data from us until the call ends */
    }
    bool hin = rn && !pg->peer[rr].data_in; /* its DATA frame still to read */
    const char *s = sp;
    char *d = rp;
    size_t sent = 0, got = 0;
    while (hs < sizeof df || sent < sn || hin || got < rn) {
        if (hin && pg->peer[rr].in_got == sizeof(frame)) {
            waiter w = {.kind = W_DATA, .peer = rr};
            if (on_frame(pg, c, &w, rr, deadline) == F_FAIL) return c->status;
            if (w.done) {
                hin = false;
                pg->peer[rr].data_in = true;
            }
            continue;
        }
        bool sending = hs < sizeof df || sent < sn, receiving = hin || got < rn;
        struct pollfd p[2];
        int np = 0, si = -1, ri = -1;
        if (sending) {
            si = np;
            p[np++] = (struct pollfd){.fd = pg->fd[sr], .events = POLLOUT};
        }
        if (receiving) {
            ri = np;
            p[np++] = (struct pollfd){.fd = pg->fd[rr], .events = POLLIN};
        }
        int k = poll(p, (nfds_t)np, pg_ms_until(deadline));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return peer_io_error(pg, c, sending ? sr : rr, "waiting on", errno);
        if (k == 0) {
            if (pg_now() < deadline) continue;
            return receiving ? peer_timed_out(pg, c, rr, "for data from")
                             : peer_timed_out(pg, c, sr, "to send to");
        }
        if (ri >= 0 && p[ri].revents) {
            if (hin) {
                if (frame_pull(pg, rr) < 0) return peer_io_error(pg, c, rr, "receiving from", errno);
            } else {
                ssize_t m = recv(pg->fd[rr], d + got, rn - got, MSG_DONTWAIT);
                if (m == 0) return peer_io_error(pg, c, rr, "receiving from", 0);
                if (m < 0 && errno != EAGAIN && errno != EINTR)
                    return peer_io_error(pg, c, rr, "receiving from", errno);
                if (m > 0) got += (size_t)m;
            }
        }
        if (si >= 0 && p[si].revents) {
            bool note_there = !pg->peer[sr].data_in; /* what it sends us is still frames */
            if (p[si].revents & (POLLERR | POLLHUP)) {
                peer_io_error(pg, c, sr, "sending to", 0);
                return note_there ? lost(pg, c, sr) : c->status;
            }
            /* the header and the data in one write: one segment, one wake-up at the peer */
            struct iovec iov[2] = {{(char *)&df + hs, sizeof df - hs}, {(char *)s + sent, sn - sent}};
            struct msghdr mh = {.msg_iov = hs < sizeof df ? iov : iov + 1,
                                .msg_iovlen = hs < sizeof df ? 2 : 1};
            ssize_t m = sendmsg(pg->fd[sr], &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (m < 0 && errno != EAGAIN && errno != EINTR) {
                peer_io_error(pg, c, sr, "sending to", errno);
                return note_there ? lost(pg, c, sr) : c->status;
            }
            size_t h =
                m > 0 && hs < sizeof df ? ((size_t)m < sizeof df - hs ? (size_t)m : sizeof df - hs) : 0;
            hs += h;
            if (m > 0) sent += (size_t)m - h;
        }
    }
    return EM_OK;
}

em_status peer_send(em_pg *pg, call *c, int r, const void *p, size_t n, double deadline)
{
    return peer_exchange(pg, c, r, p, n, r, NULL, 0, deadline);
}

em_status peer_recv(em_pg *pg, call *c, int r, void *p, size_t n, double deadline)
{
    return peer_exchange(pg, c, r, NULL, 0, r, p, n, deadline);
}

/* ---- send and recv --------------------------------------------------------------------- */

/* Writes f and its data to rank q, reading what q sends meanwhile. */
static em_status send_watching(em_pg *pg, call *c, int q, const frame *f, const void *data, double deadline)
{
    peer_state *p = &pg->peer[q];
    const char *part[2] = {(const char *)f, data};
    size_t len[2] = {sizeof *f, f->len}, done[2] = {0, 0};
    int at = 0;
    bool held = false; /* q's next frame is for a later call: read no further */
    for (;;) {
        bool stashing = p->st_on && p->st_got < p->st.len;
        if (!held && !stashing && p->in_got == sizeof(frame)) {
            waiter w = {.kind = W_SENDING, .peer = q};
            int a = on_frame(pg, c, &w, q, deadline);
            if (a == F_FAIL) return c->status;
            held = a == F_HELD;
            continue;
        }
        while (at < 2 && done[at] == len[at]) at++;
        bool writing = at < 2;
        if (!writing && !stashing) break;
        bool reading = stashing || !held;
        struct pollfd pf = {.fd = pg->fd[q],
                            .events = (short)((writing ? POLLOUT : 0) | (reading ? POLLIN : 0))};
        int k = poll(&pf, 1, pg_ms_until(deadline));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            peer_io_error(pg, c, q, "waiting on", errno);
            return lost(pg, c, q);
        }
        if (k == 0) {
            if (pg_now() < deadline) continue;
            return writing ? peer_timed_out(pg, c, q, "to send to")
                           : peer_timed_out(pg, c, q, "for data from");
        }
        if (reading && (pf.revents & (POLLIN | POLLHUP | POLLERR))) {
            if (stashing) {
                ssize_t m = recv(pg->fd[q], p->st_data + p->st_got, p->st.len - p->st_got, MSG_DONTWAIT);
                if (m == 0 || (m < 0 && errno != EAGAIN && errno != EINTR))
                    return peer_io_error(pg, c, q, "receiving from", m == 0 ? 0 : errno);
                if (m > 0) p->st_got += (size_t)m;
            } else if (frame_pull(pg, q) < 0) {
                peer_io_error(pg, c, q, "receiving from", errno);
                return c->status;
            }
            continue; /* a whole frame is judged before writing on */
        }
        if (writing && pf.revents) {
            ssize_t m = send(pg->fd[q], part[at] + done[at], len[at] - done[at], MSG_DONTWAIT | MSG_NOSIGNAL);
            if (m < 0 && errno != EAGAIN && errno != EINTR) {
                peer_io_error(pg, c, q, "sending to", errno);
                return lost(pg, c, q);
            }
            if (m > 0) {
                done[at] += (size_t)m;
                p->out_ok = false; /* until the data is all out: q reads on as a send's */
            }
        }
    }
    p->out_ok = true;
    return EM_OK;
}

static em_status p2p_send(em_pg *pg, call *c, double deadline)
{
    int q = c->h.root;
    peer_state *p = &pg->peer[q];
    p->sent++;
    pg->p2p_sent++;
    p->last_send = c->h;
    frame f = {.magic = FRAME_MAGIC, .type = FR_SEND, .seq = p->sent, .len = call_bytes(&c->h), .h = c->h};
    if (send_watching(pg, c, q, &f, c->in, deadline)) return c->status;
    if (c->h.cuda && p->acked < p->sent) { /* NCCL's send waits for the recv: so do we, to check it */
        waiter w = {.kind = W_ACK, .peer = q};
        return wait_frames(pg, c, &w, deadline);
    }
    return EM_OK;
}

static void drop_stash(peer_state *p)
{
    free(p->st_data);
    p->st_data = NULL;
    p->st_on = false;
}

static em_status p2p_recv(em_pg *pg, call *c, double deadline)
{
    int q = c->h.root;
    peer_state *p = &pg->peer[q];
    frame f = {.type = FR_RECV, .seq = p->recvd + 1, .h = c->h};
    if (frame_put(pg, c, q, &f, NULL, deadline)) {
        /* q closed its end. A send is eager (done once its data is handed
         * over), so q may have sent this message as its last call and gone:
         * when its SEND frame is here (lost() stops at one) or stashed, the
         * message is still ours to take. A note from q stands. */
        bool sent =
            p->st_on || (p->in_got == sizeof(frame) && p->in.magic == FRAME_MAGIC && p->in.type == FR_SEND);
        if (!sent || pg->abort_origin >= 0) return c->status;
        c->status = EM_OK;
        c->msg[0] = '\0';
    }
    frame sf;
    if (p->st_on) { /* it came while we were sending to q */
        sf = p->st;
    } else {
        waiter w = {.kind = W_SEND, .peer = q};
        if (wait_frames(pg, c, &w, deadline)) return c->status;
        sf = p->in;
        p->in_got = 0;
    }
    if (!p2p_agree(&sf.h, &c->h) || sf.h.seq != c->h.seq) {
        if (p->st_on) drop_stash(p);
        return call_mismatch(c, q, &sf.h, pg->rank, &c->h);
    }
    if (p->st_on) {
        if (sf.len) memcpy(c->in, p->st_data, sf.len);
        drop_stash(p);
    } else if (sf.len && io_recv(pg, c, q, c->in, sf.len, deadline)) {
        return c->status;
    }
    p->recvd++;
    pg->p2p_recvd++;
    return EM_OK;
}

em_status p2p_run(em_pg *pg, call *c, double deadline)
{
    return c->h.kind == CALL_SEND ? p2p_send(pg, c, deadline) : p2p_recv(pg, c, deadline);
}

/* ---- shared memory, notes, the end of a call ----------------------------------------------- */

em_status peer_watch(em_pg *pg, call *c, int q, double deadline, bool *closed)
{
    *closed = false;
    for (;;) {
        if (pg->peer[q].in_got == sizeof(frame)) {
            waiter w = {.kind = W_SHM};
            int a = on_frame(pg, c, &w, q, deadline);
            if (a == F_FAIL) return c->status;
            if (a == F_HELD) return EM_OK;
            continue;
        }
        int g = frame_pull(pg, q);
        if (g == 0) return EM_OK;
        if (g < 0) {
            *closed = true;
            return EM_OK;
        }
    }
}

void wire_abort(em_pg *pg, const call *c)
{
    bool relay = pg->abort_origin >= 0; /* the group broke elsewhere first: pass that on */
    const char *text = relay ? pg->abort_text : c->msg;
    struct {
        frame f;
        char text[TEXT_MAX + 1];
    } note;
    memset(&note, 0, sizeof note);
    size_t len = strnlen(text, TEXT_MAX);
    note.f = (frame){.magic = FRAME_MAGIC,
                     .type = FR_ABORT,
                     .seq = c->h.seq,
                     .len = len,
                     .h = {.root = relay ? pg->abort_origin : pg->rank}};
    memcpy(note.text, text, len);
    for (int r = 0; r < pg->world; r++)
        if (r != pg->rank && pg->fd[r] >= 0 && pg->peer[r].out_ok) { /* best effort: it may be gone */
            ssize_t w = send(pg->fd[r], &note, sizeof note.f + len, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)w;
        }
}

void wire_call_done(em_pg *pg)
{
    for (int r = 0; r < pg->world; r++) {
        peer_state *p = &pg->peer[r];
        p->data_out = p->data_in = false;
        p->out_ok = true;
    }
}

void wire_free(em_pg *pg)
{
    for (int r = 0; pg->peer && r < pg->world; r++) drop_stash(&pg->peer[r]);
}
