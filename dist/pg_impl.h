/* pg_impl.h — the process group's internals, shared by dist/pg.c (joining,
 * the connections, the communication thread, the call check) and
 * dist/collectives.c (the algorithms).
 *
 * Every collective is a `call` run on the group's communication thread, in
 * the order the calls were made (the same order on every rank). A call
 * first goes through the check: every rank sends rank 0 a header saying
 * what it called, rank 0 compares them with its own and answers everyone
 * with a verdict; only then does data move. The connections are one TCP
 * socket per pair of ranks (a full mesh); a data step sends to one peer
 * while it receives from another, polling both, so two ranks sending each
 * other large messages never deadlock on full socket buffers.
 *
 * When every rank is on one machine the group also maps a shared-memory
 * segment (dist/shm.c): collectives then check and move data through it,
 * and the sockets only carry send/recv and tell a rank that a peer died. */
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

/* What a rank called: the header every rank sends to rank 0. */
typedef struct call_header {
    uint64_t seq; /* the group's call count, the same on every rank */
    int32_t kind, dtype, op, root;
    int64_t count; /* elements of the (input) tensor */
} call_header;

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
} shm_seg;

struct em_pg {
    int rank, world;
    shm_seg *shm;       /* NULL: collectives go over TCP */
    double timeout;
    char name[128];
    em_store *store;    /* borrowed, or owned when own_store */
    bool own_store;
    int *fd;            /* fd[r]: the socket to rank r (-1 for self) */
    uint64_t seq;       /* calls made so far (caller side) */
    bool broken;
    char broken_msg[512];
    /* the communication thread and its queue */
    pthread_t thread;
    bool thread_started, stopping;
    bool inline_busy;   /* a synchronous call is running on its caller's thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    call *head, *tail;
    struct nccl_comms *nccl; /* NCCL communicators, one per device used (dist/nccl.c) */
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
/* Fails c with status and message (printf-style). Returns status. */
em_status call_fail(call *c, em_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Sends / receives exactly n bytes to / from rank r before the call's deadline. */
em_status peer_send(em_pg *pg, call *c, int r, const void *p, size_t n, double deadline);
em_status peer_recv(em_pg *pg, call *c, int r, void *p, size_t n, double deadline);
/* Sends sn bytes to rank sr while receiving rn bytes from rank rr (either may be 0 bytes). */
em_status peer_exchange(em_pg *pg, call *c, int sr, const void *sp, size_t sn, int rr, void *rp, size_t rn,
                        double deadline);
double pg_now(void);
/* Failures that name the call, this rank and the peer: a lost connection
 * (err 0 = closed) and a deadline passed while `what` ("for data from"). */
em_status peer_io_error(em_pg *pg, call *c, int r, const char *what, int err);
em_status peer_timed_out(em_pg *pg, call *c, int r, const char *what);
/* EM_OK while rank r's socket is open; the lost-connection error once it closed. */
em_status peer_alive(em_pg *pg, call *c, int r);
/* The verdict on everyone's headers (hs[r] = rank r's), the same text on
 * every rank that computes it: "" when they agree. */
void calls_compare(const call_header *hs, int world, char *msg, size_t n);
/* Runs a copy of proto on the group: synchronously (work NULL) or queued,
 * handing back a handle. */
em_status pg_issue(em_pg *pg, const call *proto, em_work **work);

/* ---- dist/collectives.c --------------------------------------------------------- */
/* Moves the data of a checked call (on the communication thread). */
em_status run_call(em_pg *pg, call *c, double deadline);
/* dst[i] = src[0][i] op src[1][i] op ... (nsrc sources, in that order), in
 * the wide type of dt and rounded once; AVG divides by `world`. dst may be
 * one of the sources. */
void reduce_sources(em_dtype dt, int op, int world, void *dst, const void *const *src, int nsrc, int64_t n);

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

#endif
