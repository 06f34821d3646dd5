/* nccl_impl.h — how the three files of the emulator's NCCL share their
 * state: the shared-memory segment's layout (nccl.c makes it, nccl_exchange.c
 * moves data through it), the communicator, and one call's record from its
 * arguments to its publication. nccl_reduce.c is the element arithmetic.
 * Internal to tests/cusim; users include nccl.h. */
#ifndef EMBER_CUSIM_NCCL_IMPL_H
#define EMBER_CUSIM_NCCL_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define MAX_RANKS 64
#define PAGE ((size_t)4096)
#define SLOT_BYTES ((size_t)1 << 20)
#define HALF_BYTES (SLOT_BYTES / 2)
#define MBOX_BYTES ((size_t)128 << 10)
#define MSG_BYTES 512
#define MAGIC 0x6c63636e6d697375ULL /* "usimnccl" */
#define ID_PREFIX "/ember-cusim-nccl-"
#define SPIN_ITERS 2000   /* pause instructions before yielding, */
#define YIELD_ITERS 50    /* then yields before sleeping */
#define SLEEP_NS 1000000L /* one futex sleep; peers are checked after each */

/* What a call is. */
typedef enum {
    K_ALL_REDUCE = 1,
    K_BROADCAST,
    K_REDUCE,
    K_ALL_GATHER,
    K_REDUCE_SCATTER,
    K_SEND,
    K_RECV
} op_kind;

/* What a rank calls, as the others see it (red, root: -1 when unused). */
typedef struct call_desc {
    int32_t kind, dtype, red, root;
    uint64_t count;
    uint32_t seq, unused;
} call_desc;

typedef struct rank_ctl {
    _Atomic uint32_t step; /* the last step this rank reached (wraps; compared as a difference) */
    _Atomic int32_t pid;   /* 0 until the rank registered */
    _Atomic uint32_t gone; /* 1 once it destroyed or aborted its communicator */
    uint32_t unused;
    call_desc desc[2]; /* collective #seq's header is in desc[seq & 1] */
    char pad[128 - 16 - 2 * sizeof(call_desc)];
} rank_ctl;
_Static_assert(sizeof(rank_ctl) == 128, "a rank's control block is two cache lines");

typedef struct seg_head {
    uint64_t magic;
    int32_t nranks, creator_rank, creator_pid, unused;
    _Atomic uint32_t arrived;    /* ranks registered */
    _Atomic uint32_t fail_state; /* 0: none, 1: being written, 2: fail_* hold the first failure */
    int32_t fail_code, fail_rank;
    char fail_msg[MSG_BYTES];
} seg_head;
_Static_assert(sizeof(seg_head) <= PAGE, "the head fits its page");

/* One mailbox; its data follows one page after it. */
typedef struct mbox_head {
    _Atomic uint32_t posted;  /* chunks the sender wrote (ever) */
    _Atomic uint32_t taken;   /* chunks the receiver took */
    _Atomic uint32_t refused; /* 1: the receiver expected another message; why says so */
    uint32_t bytes;           /* the chunk's size */
    uint32_t msg_seq;         /* the message it belongs to: the sender's count of sends to this peer */
    int32_t dtype;
    uint64_t count;
    char why[MSG_BYTES];
} mbox_head;
_Static_assert(sizeof(mbox_head) <= PAGE, "a mailbox head fits its page");

struct ncclComm {
    int rank, nranks, device;
    uint8_t *base;
    size_t size;
    seg_head *head;
    rank_ctl *ctl;
    uint32_t step; /* the last step this rank reached */
    uint32_t seq;  /* collectives made */
    uint32_t send_seq[MAX_RANKS], recv_seq[MAX_RANKS];
    double timeout;
    ncclResult_t broken; /* not ncclSuccess: an earlier error left the communicator unusable */
    char msg[MSG_BYTES]; /* the last error on this communicator */
};

/* One call, from its arguments to its publication. */
typedef struct op {
    op_kind kind;
    ncclComm_t comm;
    void *stream;
    const void *sendbuff;
    void *recvbuff;
    size_t count; /* as the API counts it: sendcount for all_gather, recvcount for reduce_scatter */
    ncclDataType_t dt;
    ncclRedOp_t red;
    int root;                             /* the peer for send/recv */
    uint8_t *buf;                         /* private host buffer: the input, then the result */
    size_t buf_bytes, out_off, out_bytes; /* publication: buf + out_off -> recvbuff (none when 0) */
    uint32_t chunk, nchunks, msg_seq;     /* send/recv progress */
    bool started, done;
    ncclResult_t result;
    char msg[MSG_BYTES];
} op;

/* ---- the segment's layout, for n ranks --------------------------------------------- */

static inline size_t ctl_off(void) { return PAGE; }
static inline size_t slot_off(int n)
{
    return ctl_off() + ((size_t)n * sizeof(rank_ctl) + PAGE - 1) / PAGE * PAGE;
}
static inline size_t mbox_off(int n) { return slot_off(n) + (size_t)n * SLOT_BYTES; }
static inline size_t seg_bytes(int n) { return mbox_off(n) + (size_t)n * (size_t)n * (PAGE + MBOX_BYTES); }

/* ---- nccl_reduce.c: the element arithmetic ---------------------------------------------- */

/* Bytes of an element (0 for a bad type); names for messages. */
size_t cusim_nccl_dtype_size(ncclDataType_t t);
const char *cusim_nccl_dtype_name(int t);
const char *cusim_nccl_red_name(int r);
/* dst[0..m) = src[0] op src[1] op ... op src[nsrc-1], in that order, in t's
 * arithmetic (f16/bf16 in float, rounded once; integers wrap); Avg divides
 * the sum by nsrc. dst overlaps no source. */
void cusim_nccl_reduce(ncclDataType_t t, ncclRedOp_t op, void *dst, const void *const *src, int nsrc,
                       size_t m);

/* ---- nccl_exchange.c: moving data between ranks ------------------------------------------ */

double cusim_nccl_now_s(void);
/* Futex wake-all on a shared word; a sleep of at most SLEEP_NS while *w == cur. */
void cusim_nccl_wake(_Atomic uint32_t *w);
void cusim_nccl_sleep_on(_Atomic uint32_t *w, uint32_t cur);
/* Waiting step i: spins, then yields; true when it is time to sleep. */
bool cusim_nccl_backoff(int i);
const char *cusim_nccl_api_name(op_kind k);
/* Sets o's result and message; returns the result. */
ncclResult_t cusim_nccl_fail(op *o, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Tells every rank why this one gave up (the first failure wins). */
void cusim_nccl_poison(seg_head *h, int rank, ncclResult_t r, const char *msg);
/* The exchange of one prepared collective (o->buf holds the input and
 * receives the result), blocking until every rank made the same call. */
ncclResult_t cusim_nccl_run_collective(op *o);
/* The sends and receives p[0..n) of one communicator, run together until all
 * are done or one failed (then all fail). */
ncclResult_t cusim_nccl_run_p2p(op **p, int n);

#endif
