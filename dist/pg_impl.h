/* pg_impl.h — the process group's internals, shared by dist/pg.c (joining,
 * the connections, the communication thread), dist/wire.c (what travels on
 * the connections, and how every call is checked against the other ranks'),
 * dist/collectives.c (the TCP algorithms) and dist/shm.c (shared memory).
 *
 * Every call is a `call` run on the group's communication thread, in the
 * order the calls were made. A collective first goes through the check:
 * every rank sends rank 0 a header saying what it called, and how many
 * messages it has sent and received with send/recv; rank 0 compares them and
 * answers everyone with a verdict; only then does data move. send and recv
 * are checked pairwise: the receiver announces its recv to the sender, the
 * sender's data comes after a header naming its send, and a rank reads what
 * its peers send while it waits, so a send or recv that meets a different
 * call fails both ranks at once. A send is eager (it completes once its data
 * is handed over); one still unreceived when the next collective runs fails
 * that collective on every rank, because the counts disagree.
 *
 * The connections are one TCP socket per pair of ranks (a full mesh). Every
 * byte on them is a `frame`, typed and numbered, or data a SEND or DATA
 * frame announced; anything else is an error, never data. A data step sends
 * to one peer while it receives from another, polling both, so two ranks
 * sending each other large messages never deadlock on full socket buffers.
 *
 * When every rank is on one machine the group also maps a shared-memory
 * segment (dist/shm.c): collectives then check and move data through it,
 * and the sockets carry send/recv, a failed rank's note, and tell a rank
 * that a peer died.
 *
 * A group of the MPI transport (dist/mpi.c) has no sockets: the same calls,
 * headers, verdicts and notes travel as MPI messages on a communicator of
 * its own, and MPI's nonblocking collectives move the data. */
#ifndef EMBER_DIST_PG_IMPL_H
#define EMBER_DIST_PG_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/dist.h"

typedef enum call_kind {
    CALL_ALL_REDUCE = 1,
    CALL_BROADCAST,
    CALL_ALL_GATHER,
    CALL_REDUCE_SCATTER,
    CALL_GATHER,
    CALL_BARRIER,
    CALL_SEND,
    CALL_RECV
} call_kind;

/* What a rank called: a collective's header (sent to rank 0, or written in
 * the shared segment), and a send's or recv's in its frames. */
typedef struct call_header {
    uint64_t seq;            /* collectives called before this call: the same on every rank */
    int32_t kind, dtype, op; /* op: the reduction of all_reduce / reduce_scatter */
    int32_t root;            /* broadcast / gather: the root; send: the destination; recv: the source */
    int64_t count;           /* elements of the (input) tensor */
    uint64_t sent, recvd;    /* collectives: messages this rank has sent / received with send and recv */
    int32_t cuda, pad;       /* cuda: CUDA tensors; the group checks the call, NCCL moves the data */
} call_header;

/* Frames (dist/wire.c). Type and number say what a frame is; a frame a rank
 * cannot take where it is fails the call, naming both calls when it shows a
 * mismatch, as a protocol error otherwise. */
typedef enum frame_type {
    FR_CALL = 1, /* a collective's header, to rank 0 (seq: the call number) */
    FR_VERDICT,  /* rank 0's answer: len bytes of text follow; none: go (seq: the call number) */
    FR_ASK,      /* rank 0 asks for point-to-point counts: the headers' totals disagree */
    FR_COUNTS,   /* the answer: world p2p_count entries follow */
    FR_DATA,     /* a collective's data follows on this connection (seq: the call number) */
    FR_SEND,     /* a send: len bytes of data follow (seq: the pair's message number, from 1) */
    FR_RECV,     /* a recv is waiting for message seq of the pair */
    FR_ABORT,    /* the sender's group broke: len bytes of text; h.root: the rank it broke on first */
} frame_type;

typedef struct frame {
    uint32_t magic, type;
    uint64_t seq;
    uint64_t len;  /* bytes that follow: text, a table, a send's data */
    call_header h; /* CALL, SEND, RECV: the sender's call */
    /* to 128 bytes: frames a multiple of 64 bytes keep the data after them
     * cache-line aligned in the kernel's buffers, which copy it twice as
     * fast (TCP all_reduce of 1 MiB, 2 ranks: 1.2 ms with 72-byte frames,
     * 0.65 ms with these) */
    uint8_t reserved[48];
} frame;
_Static_assert(sizeof(frame) == 128, "a frame is two cache lines");

/* A rank's point-to-point counts with one peer (for a mismatch's message). */
typedef struct p2p_count {
    uint64_t sent, recvd;
    int32_t dtype, pad; /* the last send's dtype and count */
    int64_t count;
} p2p_count;

/* This rank's side of its connection to one peer. */
typedef struct peer_state {
    uint64_t sent, acked, recvd; /* messages sent to it, of those its RECV frames read, received from it */
    call_header last_send;
    bool out_ok;            /* it reads our next bytes as a frame: a note of our failure may go */
    bool data_out, data_in; /* this call's DATA frame went to / came from it */
    bool closed;            /* it closed its connection while it was no partner of ours */
    frame in;               /* the frame being read; whole once in_got == sizeof in */
    size_t in_got;
    bool st_on; /* a message it sent while we both were sending, kept for our recv */
    frame st;
    char *st_data;
    size_t st_got;
} peer_state;

typedef struct call {
    call_header h;
    void *in, *out; /* raw data: `in` count elements; `out` as the kind needs */
    struct call *next;
    em_status status;
    char msg[512];
    bool done;
} call;

/* The shared segment as this rank sees it (dist/shm.c). */
typedef struct shm_seg {
    void *base;
    size_t size;
    struct shm_ctl *ctl; /* one control block per rank */
    uint8_t *data;       /* world slots of `slot` bytes, each two halves */
    size_t slot;
    uint32_t step;       /* the steps this rank has published */
    int busy;            /* which of this rank's halves peers may still read after its last call:
                          * -1 none, 0 or 1 that half, 2 either */
    int staged;          /* the half the current all_reduce's first piece went into with the check, or -1 */
} shm_seg;

struct em_pg {
    int rank, world;
    shm_seg *shm;       /* NULL: collectives go over TCP */
    double timeout;
    char name[128];     /* the group's key prefix in the store: the config's name + "/" + generation */
    char exited[64];    /* where a launcher notes a worker's exit: key prefix + rank ("" = none) */
    char master[256];   /* the store's host (numeric when known): advertise the interface reaching it */
    em_store *store;    /* borrowed, or owned when own_store */
    bool own_store;
    int *fd;            /* fd[r]: the socket to rank r (-1 for self) */
    uint64_t seq;       /* collectives called so far (caller side) */
    peer_state *peer;   /* peer[r]: this rank's side of the connection to rank r */
    uint64_t p2p_sent, p2p_recvd; /* messages sent / received with send and recv */
    bool broken;
    char broken_msg[512];
    int abort_origin;     /* the rank the group broke on first, when a peer's note said so; else -1 */
    char abort_text[512]; /* that rank's message */
    /* the communication thread and its queue */
    pthread_t thread;
    bool thread_started, stopping;
    bool inline_busy;   /* a synchronous call is running on its caller's thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    call *head, *tail;
    struct nccl_comms *nccl; /* NCCL communicators, one per device used (dist/nccl.c) */
    struct mpi_group *mpi;   /* the MPI transport's state (dist/mpi.c); NULL for TCP / shm */
    em_store_server *own_server; /* a store this group's rank 0 hosts (em_pg_from_env under MPI) */
};

struct em_work {
    call c;
    em_pg *pg;
    void *nccl_done; /* an NCCL call: a cudaEvent_t recorded on the communication stream */
    int nccl_dev;
};

/* ---- dist/pg.c ---------------------------------------------------------------- */
/* Text for a call: "all_reduce(f32, 1024 elements, sum)". */
void call_describe(const call_header *h, char *buf, size_t n);
/* Fails c with status and message (printf-style), unless it failed already
 * (the first reason stays). Returns c's status. */
em_status call_fail(call *c, em_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same, replacing the reason c has (a better one was found). */
em_status call_refail(call *c, em_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Sends / receives exactly n raw bytes to / from rank r before the deadline;
 * io_exchange sends sn bytes to rank sr while receiving rn from rank rr. */
em_status io_send(em_pg *pg, call *c, int r, const void *p, size_t n, double deadline);
em_status io_recv(em_pg *pg, call *c, int r, void *p, size_t n, double deadline);
em_status io_exchange(em_pg *pg, call *c, int sr, const void *sp, size_t sn, int rr, void *rp, size_t rn,
                      double deadline);
double pg_now(void);
/* Milliseconds for poll() until deadline (at most 1000). */
int pg_ms_until(double deadline);
/* Failures that name the call, this rank and the peer: a lost connection
 * (err 0 = closed) and a deadline passed while `what` ("for data from"). */
em_status peer_io_error(em_pg *pg, call *c, int r, const char *what, int err);
em_status peer_timed_out(em_pg *pg, call *c, int r, const char *what);
/* Runs a copy of proto on the group: synchronously (work NULL) or queued,
 * handing back a handle. */
em_status pg_issue(em_pg *pg, const call *proto, em_work **work);

/* ---- dist/wire.c -------------------------------------------------------------- */
/* The TCP check of a collective through rank 0 (c->h carries the counts). */
em_status check_call(em_pg *pg, call *c, double deadline);
/* A send or recv, checked against the peer's call. */
em_status p2p_run(em_pg *pg, call *c, double deadline);
/* A checked collective's data over TCP: n bytes to / from rank r, or sn to
 * sr while rn come from rr. The first bytes a call moves on a connection go
 * after a DATA frame, so a peer still checking never takes them for a frame. */
em_status peer_send(em_pg *pg, call *c, int r, const void *p, size_t n, double deadline);
em_status peer_recv(em_pg *pg, call *c, int r, void *p, size_t n, double deadline);
em_status peer_exchange(em_pg *pg, call *c, int sr, const void *sp, size_t sn, int rr, void *rp, size_t rn,
                        double deadline);
/* While a shared-memory collective waits for rank q: reads the frames q
 * sent (never blocking) and fails c when one shows a mismatch or q's note
 * of failure. *closed: q's connection closed (c is not failed for that). */
em_status peer_watch(em_pg *pg, call *c, int q, double deadline, bool *closed);
/* The verdict on everyone's headers (hs[r] = rank r's): CMP_OK, CMP_CALLS
 * (msg says which ranks called what; the same text on every rank that
 * computes it) or CMP_COUNTS (point-to-point counts disagree: the ranks'
 * p2p_count tables are needed, see p2p_compose). */
enum { CMP_OK = 0, CMP_CALLS, CMP_COUNTS };
int calls_compare(const call_header *hs, int world, char *msg, size_t n);
/* This rank's row of counts: row[r] about rank r. */
void p2p_row(const em_pg *pg, p2p_count *row);
/* The message for counts that disagree: which sends were not received and
 * what their receivers called instead. rows[a][b]: rank a about rank b. */
void p2p_compose(const call_header *hs, const p2p_count *const *rows, int world, char *msg, size_t n);
/* Fails c with a mismatch of rank a's call ha and rank b's hb (the message
 * names both, the lower rank first). */
em_status call_mismatch(call *c, int a, const call_header *ha, int b, const call_header *hb);
/* Fails c because the group broke on rank `origin` (its message `text`),
 * and remembers both for this rank's own note. */
em_status call_broke(em_pg *pg, call *c, int origin, const char *text);
/* After c failed: a note (FR_ABORT) to every peer that reads a frame next. */
void wire_abort(em_pg *pg, const call *c);
/* After a call succeeded: its DATA frames are spent. */
void wire_call_done(em_pg *pg);
void wire_free(em_pg *pg);

/* ---- dist/collectives.c --------------------------------------------------------- */
/* Moves the data of a checked call (on the communication thread). */
em_status run_call(em_pg *pg, call *c, double deadline);
/* dst[i] = src[0][i] op src[1][i] op ... (nsrc sources, in that order), in
 * the wide type of dt and rounded once; AVG divides by `world`. dst may be
 * one of the sources. */
void reduce_sources(em_dtype dt, int op, int world, void *dst, const void *const *src, int nsrc, int64_t n);
/* The pieces of it, for transports that reduce elsewhere (dist/mpi.c). The
 * wide type of dt is f32 for f32/f16/bf16, else dt itself (f64, i32).
 * red_widen: n elements of dt at src -> the wide type at dst; red_narrow
 * back, rounding once; red_combine: acc[i] = acc[i] op x[i] in the wide
 * type (MAX/MIN propagate NaN; i32 sums wrap); red_finish_avg: AVG divides
 * by world (i32 truncating), other ops leave acc alone. */
void red_widen(em_dtype dt, const void *src, void *dst, int64_t n);
void red_narrow(em_dtype dt, const void *src, void *dst, int64_t n);
void red_combine(em_dtype dt, int op, void *acc, const void *x, int64_t n);
void red_finish_avg(em_dtype dt, int op, void *acc, int64_t n, int world);

/* ---- dist/nccl.c (built when NCCL is found) ------------------------------------------
 * Collectives on CUDA tensors. c's in/out are device pointers on cuda:dev.
 * The call is queued on dev's communication stream after everything queued
 * so far on its compute stream (an event), and returns without waiting:
 * synchronous (work NULL): the compute stream waits for the collective (an
 * event), so later kernels see its result; asynchronous: *work holds the
 * event, and em_work_wait makes the compute stream wait then. The group's
 * communicator for dev is made on first use (rank 0's ncclUniqueId through
 * the group's store). Errors: EM_ERR_DIST naming the op and NCCL's message. */
em_status nccl_issue(em_pg *pg, const call *c, int dev, em_work **work);
/* em_work_wait / em_work_done of an NCCL work (w->nccl_done set); wait frees w. */
em_status nccl_work_wait(em_work *w);
bool nccl_work_done(const em_work *w);
/* Destroys pg's communicators (em_pg_free). */
void nccl_pg_free(em_pg *pg);

/* ---- dist/mpi.c (built when MPI is found: EM_HAVE_MPI) ---------------------------------
 * MPI is initialised on first use (MPI_Init_thread, unless the program did)
 * and finalized at exit when ember initialised it. */
/* Makes pg (rank, world, timeout set) an MPI group: checks them against
 * MPI_COMM_WORLD (EM_ERR_ARG naming both) and duplicates its communicator
 * (EM_ERR_TIMEOUT when the other ranks do not make the group in time). */
em_status mpi_join(em_pg *pg);
/* Runs call c on an MPI group: a collective's check then its data, or a send / recv. */
em_status mpi_run(em_pg *pg, call *c, double deadline);
/* After c failed: a note to every peer, which its waits find. */
void mpi_abort(em_pg *pg, const call *c);
/* em_pg_free's part: the communicator and the group's buffers. */
void mpi_leave(em_pg *pg);
/* em_pg_from_env's under an MPI launcher: MPI_COMM_WORLD's rank and world;
 * rank 0 starts a store server (ephemeral port, random token; *server,
 * owned by the caller) and broadcasts where it is; every rank connects
 * (*store, owned by the caller). */
em_status mpi_rendezvous(double timeout, int *rank, int *world, em_store **store, em_store_server **server);

/* ---- dist/shm.c ------------------------------------------------------------------ */
#define SHM_MAX_WORLD 64
/* Bytes of the segment for a group of `world`. */
size_t shm_bytes(int world);
/* Rank 0 creates a segment (name written to `name`, n bytes), the others
 * map the one named. EM_OK, or an error saying why not (the caller may fall
 * back to TCP). */
em_status shm_create(em_pg *pg, char *name, size_t n);
em_status shm_map(em_pg *pg, const char *name);
void shm_unmap(em_pg *pg);
/* The call check and the data movement of a collective, through the segment. */
em_status shm_check(em_pg *pg, call *c, double deadline);
em_status shm_run(em_pg *pg, call *c, double deadline);
/* Publishes c's failure in the segment, where waiting ranks look. */
void shm_abort(em_pg *pg, const call *c);

#endif
