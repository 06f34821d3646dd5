/* nccl.c — the NCCL calls ember makes, run on the CPU across processes
 * through POSIX shared memory (the emulator's include/nccl.h).
 *
 * The segment. ncclGetUniqueId puts a fresh shared-memory name in the id;
 * every rank of ncclCommInitRank opens (or creates) that segment, checks its
 * header (a rank given a different nranks fails every rank), registers its
 * pid and waits for all; the last to arrive unlinks the name, so the memory
 * goes when the last rank unmaps it. Layout, for n ranks:
 *     head (one page)                 magic, n, arrivals, the shared failure
 *     ctl[n] (128 bytes each)         a rank's step counter, pid, call headers
 *     slot[n] (1 MiB each)            two halves of 512 KiB, for collectives
 *     mbox[n][n] (page + 128 KiB)     mailbox src -> dst, for send/recv
 * Ranks may be processes or threads of one process (several emulated
 * devices): nothing here takes a process-wide lock while it waits.
 *
 * A collective call (the execution model):
 *   1. prepare, on the caller's thread: drain the stream (what was queued
 *      before the call runs now), copy the input into a private buffer;
 *   2. exchange: compute the result into that buffer now, with the peers,
 *      blocking until every rank has made the same call;
 *   3. publish, on the caller's thread: queue the copy of the result into
 *      the output on the stream (cusim_enqueue_host_fn), so the output
 *      changes only when the stream gets there, as on a GPU.
 * Doing the exchange at call time means progress never depends on when a
 * process happens to synchronise its streams.
 *
 * The exchange. Each rank's step counter only grows: barrier() publishes
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
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cusim_impl.h"
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

typedef enum { K_ALL_REDUCE = 1, K_BROADCAST, K_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_SEND, K_RECV } op_kind;

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
    int root; /* the peer for send/recv */
    uint8_t *buf; /* private host buffer: the input, then the result */
    size_t buf_bytes, out_off, out_bytes; /* publication: buf + out_off -> recvbuff (none when 0) */
    uint32_t chunk, nchunks, msg_seq;     /* send/recv progress */
    bool started, done;
    ncclResult_t result;
    char msg[MSG_BYTES];
} op;

static _Thread_local char thread_msg[MSG_BYTES]; /* the last error on this thread */
static _Thread_local struct {
    int depth;
    op *ops;
    int n, cap;
} group;

/* ---- small things ------------------------------------------------------------------ */

static double now_s(void)
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

static void wake(_Atomic uint32_t *w) { syscall(SYS_futex, (void *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static void sleep_on(_Atomic uint32_t *w, uint32_t cur)
{
    struct timespec ts = {0, SLEEP_NS};
    syscall(SYS_futex, (void *)w, FUTEX_WAIT, cur, &ts, NULL, 0);
}

/* Waiting step i of a wait: spin, then yield; true when it is time to sleep. */
static bool backoff(int i)
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

static size_t dtype_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    case ncclNumTypes: break;
    }
    return 0;
}

static const char *dtype_name(int t)
{
    static const char *names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                  "uint64",  "float16", "float32", "float64", "bfloat16"};
    return t >= 0 && t < ncclNumTypes ? names[t] : "(bad type)";
}

static const char *red_name(int r)
{
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return r >= 0 && r < ncclNumOps ? names[r] : "(bad op)";
}

static const char *api_name(op_kind k)
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
    const char *t = dtype_name(d->dtype), *r = red_name(d->red);
    unsigned long long c = (unsigned long long)d->count;
    switch ((op_kind)d->kind) {
    case K_ALL_REDUCE: snprintf(s, n, "#%u all_reduce(count=%llu, %s, %s)", d->seq, c, t, r); return;
    case K_BROADCAST: snprintf(s, n, "#%u broadcast(count=%llu, %s, root=%d)", d->seq, c, t, d->root); return;
    case K_REDUCE: snprintf(s, n, "#%u reduce(count=%llu, %s, %s, root=%d)", d->seq, c, t, r, d->root); return;
    case K_ALL_GATHER: snprintf(s, n, "#%u all_gather(sendcount=%llu, %s)", d->seq, c, t); return;
    case K_REDUCE_SCATTER: snprintf(s, n, "#%u reduce_scatter(recvcount=%llu, %s, %s)", d->seq, c, t, r); return;
    case K_SEND:
    case K_RECV: break;
    }
    snprintf(s, n, "#%u (unknown call %d)", d->seq, d->kind);
}

/* Sets o's result and message; returns the result. */
static ncclResult_t fail(op *o, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ncclResult_t fail(op *o, ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->msg, sizeof o->msg, fmt, ap);
    va_end(ap);
    o->result = r;
    return r;
}

/* An error returned to the caller: kept for ncclGetLastError, printed. */
static ncclResult_t report(ncclComm_t comm, ncclResult_t r, const char *msg)
{
    snprintf(thread_msg, sizeof thread_msg, "%s", msg);
    if (comm) snprintf(comm->msg, sizeof comm->msg, "%s", msg);
    fprintf(stderr, "cusim: nccl: %s\n", msg);
    return r;
}

static ncclResult_t api_error(ncclComm_t comm, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclResult_t api_error(ncclComm_t comm, ncclResult_t r, const char *fmt, ...)
{
    char msg[MSG_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return report(comm, r, msg);
}

/* ---- reductions: dst = src[0] op src[1] op ... in rank order ------------------------ */

/* In T's arithmetic; sums and products in U (the unsigned type for integers,
 * so they wrap). Avg: the sum divided by the number of ranks (integers
 * truncate). dst never overlaps a source. */
#define DEFINE_REDUCE(NAME, T, U)                                                                      \
    static void NAME(void *dst, const void *const *src, int nsrc, size_t m, ncclRedOp_t op)           \
    {                                                                                                  \
        T *d = dst;                                                                                    \
        memcpy(d, src[0], m * sizeof(T));                                                              \
        for (int q = 1; q < nsrc; q++) {                                                               \
            const T *s = src[q];                                                                       \
            if (op == ncclSum || op == ncclAvg)                                                        \
                for (size_t i = 0; i < m; i++) d[i] = (T)((U)d[i] + (U)s[i]);                          \
            else if (op == ncclProd)                                                                   \
                for (size_t i = 0; i < m; i++) d[i] = (T)((U)d[i] * (U)s[i]);                          \
            else if (op == ncclMax)                                                                    \
                for (size_t i = 0; i < m; i++) d[i] = s[i] > d[i] ? s[i] : d[i];                       \
            else                                                                                       \
                for (size_t i = 0; i < m; i++) d[i] = s[i] < d[i] ? s[i] : d[i];                       \
        }                                                                                              \
        if (op == ncclAvg)                                                                             \
            for (size_t i = 0; i < m; i++) d[i] = (T)(d[i] / (T)nsrc);                                 \
    }

DEFINE_REDUCE(reduce_i8, int8_t, uint8_t)
DEFINE_REDUCE(reduce_u8, uint8_t, uint8_t)
DEFINE_REDUCE(reduce_i32, int32_t, uint32_t)
DEFINE_REDUCE(reduce_u32, uint32_t, uint32_t)
DEFINE_REDUCE(reduce_i64, int64_t, uint64_t)
DEFINE_REDUCE(reduce_u64, uint64_t, uint64_t)
DEFINE_REDUCE(reduce_f32, float, float)
DEFINE_REDUCE(reduce_f64, double, double)

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000 | m << 13); /* inf, nan */
    if (e) return bits_f32(sign | (e + 112) << 23 | m << 13);      /* rebias 15 -> 127 */
    float v = (float)m * (1.0f / 16777216.0f);                     /* subnormal: m x 2^-24, exact */
    return sign ? -v : v;
}

/* Round to nearest, ties to even. */
static uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return (uint16_t)(sign | 0x7e00 | (ax >> 13 & 0x3ff)); /* nan stays quiet nan */
    if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* from 65520 up: inf */
    if (ax >= 0x38800000) /* normal in f16: round at bit 13, rebias 127 -> 15 */
        return (uint16_t)(sign | (ax + 0xfff + (ax >> 13 & 1) - 0x38000000) >> 13);
    /* subnormal in f16: adding 0.5 leaves |f| rounded to a multiple of 2^-24 in the low bits */
    return (uint16_t)(sign | (f32_bits(bits_f32(ax) + 0.5f) - 0x3f000000));
}

static float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(x >> 16 | 0x40);
    return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16);
}

/* f16 and bf16: converted to float, reduced in rank order, rounded once. */
static void reduce_half(void *dst, const void *const *src, int nsrc, size_t m, ncclRedOp_t op, bool bf)
{
    enum { BLOCK = 256 };
    float acc[BLOCK];
    uint16_t *d = dst;
    for (size_t b = 0; b < m; b += BLOCK) {
        size_t k = m - b < BLOCK ? m - b : BLOCK;
        for (int q = 0; q < nsrc; q++) {
            const uint16_t *s = (const uint16_t *)src[q] + b;
            for (size_t i = 0; i < k; i++) {
                float v = bf ? bf16_to_f32(s[i]) : f16_to_f32(s[i]);
                if (q == 0) acc[i] = v;
                else if (op == ncclSum || op == ncclAvg) acc[i] += v;
                else if (op == ncclProd) acc[i] *= v;
                else if (op == ncclMax) acc[i] = v > acc[i] ? v : acc[i];
                else acc[i] = v < acc[i] ? v : acc[i];
            }
        }
        for (size_t i = 0; i < k; i++) {
            float v = op == ncclAvg ? acc[i] / (float)nsrc : acc[i];
            d[b + i] = bf ? f32_to_bf16(v) : f32_to_f16(v);
        }
    }
}

static void reduce(ncclDataType_t t, ncclRedOp_t op, void *dst, const void *const *src, int nsrc, size_t m)
{
    switch (t) {
    case ncclInt8: reduce_i8(dst, src, nsrc, m, op); return;
    case ncclUint8: reduce_u8(dst, src, nsrc, m, op); return;
    case ncclInt32: reduce_i32(dst, src, nsrc, m, op); return;
    case ncclUint32: reduce_u32(dst, src, nsrc, m, op); return;
    case ncclInt64: reduce_i64(dst, src, nsrc, m, op); return;
    case ncclUint64: reduce_u64(dst, src, nsrc, m, op); return;
    case ncclFloat16: reduce_half(dst, src, nsrc, m, op, false); return;
    case ncclFloat32: reduce_f32(dst, src, nsrc, m, op); return;
    case ncclFloat64: reduce_f64(dst, src, nsrc, m, op); return;
    case ncclBfloat16: reduce_half(dst, src, nsrc, m, op, true); return;
    case ncclNumTypes: break;
    }
    abort(); /* checked at the API */
}

/* ---- the segment ------------------------------------------------------------------- */

static size_t ctl_off(void) { return PAGE; }
static size_t slot_off(int n) { return ctl_off() + ((size_t)n * sizeof(rank_ctl) + PAGE - 1) / PAGE * PAGE; }
static size_t mbox_off(int n) { return slot_off(n) + (size_t)n * SLOT_BYTES; }
static size_t seg_bytes(int n) { return mbox_off(n) + (size_t)n * (size_t)n * (PAGE + MBOX_BYTES); }

static uint8_t *half_of(ncclComm_t c, int rank, uint32_t piece)
{
    return c->base + slot_off(c->nranks) + (size_t)rank * SLOT_BYTES + (piece & 1) * HALF_BYTES;
}

static mbox_head *mbox(ncclComm_t c, int src, int dst)
{
    return (mbox_head *)(c->base + mbox_off(c->nranks) + ((size_t)src * (size_t)c->nranks + (size_t)dst) * (PAGE + MBOX_BYTES));
}

static uint8_t *mbox_data(mbox_head *b) { return (uint8_t *)b + PAGE; }

/* Tells every rank why this one gave up (the first failure wins). */
static void poison(seg_head *h, int rank, ncclResult_t r, const char *msg)
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
        return fail(o, (ncclResult_t)h->fail_code, "%s (rank %d gave up): %s", api_name(o->kind), h->fail_rank,
                    h->fail_msg);
    pid_t pid = atomic_load(&c->ctl[q].pid);
    if (atomic_load(&c->ctl[q].gone))
        return fail(o, ncclRemoteError, "%s: rank %d destroyed its communicator while rank %d waited for it %s",
                    api_name(o->kind), q, c->rank, what);
    if (pid != getpid() && !process_alive(pid))
        return fail(o, ncclRemoteError, "%s: rank %d (pid %d) exited while rank %d waited for it %s",
                    api_name(o->kind), q, (int)pid, c->rank, what);
    double waited = now_s() - start;
    if (waited >= c->timeout)
        return fail(o, ncclSystemError,
                    "%s: rank %d waited %.3g s for rank %d (pid %d) %s: is it stuck, or calling something else? "
                    "(EMBER_CUSIM_NCCL_TIMEOUT=%g)",
                    api_name(o->kind), c->rank, waited, q, (int)pid, what, c->timeout);
    return ncclSuccess;
}

/* ---- collectives ----------------------------------------------------------------------- */

static call_desc desc_of(const op *o, uint32_t seq)
{
    bool reduces = o->kind == K_ALL_REDUCE || o->kind == K_REDUCE || o->kind == K_REDUCE_SCATTER;
    bool rooted = o->kind == K_BROADCAST || o->kind == K_REDUCE;
    return (call_desc){.kind = (int32_t)o->kind, .dtype = o->dt, .red = reduces ? (int32_t)o->red : -1,
                       .root = rooted ? o->root : -1, .count = o->count, .seq = seq};
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
    wake(&c->ctl[c->rank].step);
    for (int q = 0; q < c->nranks; q++) {
        if (q == c->rank) continue;
        _Atomic uint32_t *w = &c->ctl[q].step;
        double start = 0;
        for (int i = 0;; i++) {
            uint32_t cur = atomic_load_explicit(w, memory_order_acquire);
            if (reached(cur, v)) break;
            if (!backoff(i)) continue;
            if (start == 0) start = now_s();
            sleep_on(w, cur);
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

static ncclResult_t run_collective(op *o)
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
        return fail(o, ncclInvalidUsage, "%s: ranks called different collectives: rank 0 called %s but rank %d called %s",
                    api_name(o->kind), a, q, b);
    }
    size_t es = dtype_size(o->dt), cnt = o->count;
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
            reduce(o->dt, o->red, mine, src, n, m);
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
                memcpy(half_of(c, me, j) + (size_t)b * pe * es, o->buf + ((size_t)b * cnt + off) * es, m * es);
            if ((r = barrier(o, &d))) return r;
            for (int q = 0; q < n; q++) src[q] = half_of(c, q, j) + (size_t)me * pe * es;
            reduce(o->dt, o->red, o->buf + ((size_t)me * cnt + off) * es, src, n, m);
        }
        return ncclSuccess;
    }
    case K_SEND:
    case K_RECV: break;
    }
    return fail(o, ncclInternalError, "%s: not a collective", api_name(o->kind));
}

/* ---- send and receive ------------------------------------------------------------------- */

static void p2p_start(op *o)
{
    ncclComm_t c = o->comm;
    size_t bytes = o->count * dtype_size(o->dt);
    o->msg_seq = o->kind == K_SEND ? c->send_seq[o->root]++ : c->recv_seq[o->root]++;
    o->nchunks = bytes ? (uint32_t)((bytes + MBOX_BYTES - 1) / MBOX_BYTES) : 1; /* an empty message still matches */
    o->started = true;
}

/* Moves o along if it can: true when it did something (or finished, or failed). */
static bool send_step(op *o)
{
    ncclComm_t c = o->comm;
    mbox_head *b = mbox(c, c->rank, o->root);
    if (atomic_load_explicit(&b->refused, memory_order_acquire)) {
        fail(o, ncclInvalidUsage, "ncclSend: %s", b->why);
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
    wake(&b->posted);
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
        snprintf(b->why, sizeof b->why,
                 "rank %d sent message #%u (count=%llu, %s) to rank %d, which called recv #%u (count=%llu, %s) "
                 "from it",
                 o->root, b->msg_seq, (unsigned long long)b->count, dtype_name(b->dtype), c->rank, o->msg_seq,
                 (unsigned long long)o->count, dtype_name(o->dt));
        atomic_store_explicit(&b->refused, 1, memory_order_release);
        wake(&b->taken);
        fail(o, ncclInvalidUsage, "ncclRecv: %s", b->why);
        return true;
    }
    memcpy(o->buf + (size_t)o->chunk * MBOX_BYTES, mbox_data(b), b->bytes);
    atomic_store_explicit(&b->taken, taken + 1, memory_order_release);
    wake(&b->taken);
    if (++o->chunk == o->nchunks) o->done = true;
    return true;
}

/* Runs the sends and receives in p[0..n) together until all are done or
 * one failed (the others then fail too). */
static ncclResult_t run_p2p(op **p, int n)
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
            while (!o->done && !o->result && (o->kind == K_SEND ? send_step(o) : recv_step(o))) moved = true;
            if (o->result) {
                for (int k = 0; k < n; k++)
                    if (k != i && !p[k]->done) fail(p[k], o->result, "%s", o->msg);
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
        if (!backoff(idle++)) continue;
        if (start == 0) start = now_s();
        if (pending == 1) { /* sleep on the word the peer will change */
            mbox_head *b = last->kind == K_SEND ? mbox(last->comm, last->comm->rank, last->root)
                                                : mbox(last->comm, last->root, last->comm->rank);
            _Atomic uint32_t *w = last->kind == K_SEND ? &b->taken : &b->posted;
            uint32_t cur = atomic_load(w);
            bool ready = last->kind == K_SEND ? cur == atomic_load(&b->posted) : cur != atomic_load(&b->taken);
            if (!ready && !atomic_load(&b->refused)) sleep_on(w, cur);
        } else {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        for (int i = 0; i < n; i++) {
            op *o = p[i];
            if (o->done) continue;
            char what[160];
            snprintf(what, sizeof what, "to %s message #%u (count=%llu, %s)",
                     o->kind == K_SEND ? "receive its" : "send its", o->msg_seq, (unsigned long long)o->count,
                     dtype_name(o->dt));
            if (peer_check(o, o->root, start, what)) {
                for (int k = 0; k < n; k++)
                    if (k != i && !p[k]->done) fail(p[k], o->result, "%s", o->msg);
                return o->result;
            }
        }
    }
}

/* ---- a call's life: check, prepare, exchange, publish ---------------------------------- */

/* ncclSuccess when [p, p+n) is device memory; else an error naming it. */
static ncclResult_t check_device(op *o, const char *what, const void *p, size_t n)
{
    cusim_alloc_info info = {0};
    if (!p) return fail(o, ncclInvalidArgument, "%s: %s is NULL", api_name(o->kind), what);
    switch (cusim_mem_lookup(p, n, &info)) {
    case CUSIM_MEM_DEVICE:
        if ((const uint8_t *)p + n > (const uint8_t *)info.base + info.size)
            return fail(o, ncclInvalidArgument,
                        "%s: %s %p + %zu bytes runs past the end of its device allocation (%p, %zu bytes)",
                        api_name(o->kind), what, p, n, info.base, info.size);
        return ncclSuccess;
    case CUSIM_MEM_INVALID:
        if ((const uint8_t *)p >= (const uint8_t *)info.base && (const uint8_t *)p < (const uint8_t *)info.base + info.size)
            return fail(o, ncclInvalidArgument,
                        "%s: %s %p + %zu bytes runs past the end of its device allocation (%p, %zu bytes)",
                        api_name(o->kind), what, p, n, info.base, info.size);
        return fail(o, ncclInvalidArgument,
                    "%s: %s %p (%zu bytes) is not in a live device allocation (nearest: %p, %zu bytes; freed, "
                    "or out of bounds?)",
                    api_name(o->kind), what, p, n, info.base, info.size);
    case CUSIM_MEM_OTHER: break;
    }
    return fail(o, ncclInvalidArgument, "%s: %s %p is not device memory (a host pointer?)", api_name(o->kind), what,
                p);
}

/* The arguments, before anything happens. */
static ncclResult_t check_op(op *o)
{
    const char *api = api_name(o->kind);
    ncclComm_t c = o->comm;
    if (!c) return fail(o, ncclInvalidArgument, "%s: comm is NULL", api);
    if (c->broken)
        return fail(o, c->broken, "%s: the communicator failed earlier (destroy or abort it): %s", api, c->msg);
    if ((unsigned)o->dt >= ncclNumTypes)
        return fail(o, ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t", api, (int)o->dt);
    bool reduces = o->kind == K_ALL_REDUCE || o->kind == K_REDUCE || o->kind == K_REDUCE_SCATTER;
    if (reduces && (unsigned)o->red >= ncclNumOps)
        return fail(o, ncclInvalidArgument, "%s: op %d is not an ncclRedOp_t", api, (int)o->red);
    int n = c->nranks, me = c->rank;
    bool rooted = o->kind == K_BROADCAST || o->kind == K_REDUCE;
    if (rooted && (o->root < 0 || o->root >= n))
        return fail(o, ncclInvalidArgument, "%s: root %d is outside [0, %d)", api, o->root, n);
    if ((o->kind == K_SEND || o->kind == K_RECV) && (o->root < 0 || o->root >= n))
        return fail(o, ncclInvalidArgument, "%s: peer %d is outside [0, %d)", api, o->root, n);
    size_t es = dtype_size(o->dt);
    if (o->count > SIZE_MAX / es / (size_t)n / 2)
        return fail(o, ncclInvalidArgument, "%s: count %zu of %s is too large", api, o->count, dtype_name(o->dt));
    size_t bytes = o->count * es, all = bytes * (size_t)n;
    size_t in = 0, out = 0; /* bytes read from sendbuff, written to recvbuff */
    switch (o->kind) {
    case K_ALL_REDUCE: in = out = bytes; break;
    case K_BROADCAST: in = me == o->root ? bytes : 0, out = bytes; break;
    case K_REDUCE: in = bytes, out = me == o->root ? bytes : 0; break;
    case K_ALL_GATHER: in = bytes, out = all; break;
    case K_REDUCE_SCATTER: in = all, out = bytes; break;
    case K_SEND: in = bytes; break;
    case K_RECV: out = bytes; break;
    }
    ncclResult_t r;
    if (in && (r = check_device(o, "sendbuff", o->sendbuff, in))) return r;
    if (out && (r = check_device(o, "recvbuff", o->recvbuff, out))) return r;
    o->buf_bytes = o->kind == K_ALL_GATHER || o->kind == K_REDUCE_SCATTER ? all : bytes;
    o->out_off = o->kind == K_REDUCE_SCATTER ? (size_t)me * bytes : 0;
    o->out_bytes = out;
    return ncclSuccess;
}

/* On the caller's thread: the stream's earlier work runs, the input is copied. */
static ncclResult_t prepare(op *o)
{
    ncclComm_t c = o->comm;
    int e = cusim_stream_drain(o->stream);
    if (e) return fail(o, ncclUnhandledCudaError, "%s: the stream's earlier work failed (CUDA error %d)",
                       api_name(o->kind), e);
    if (!(o->buf = malloc(o->buf_bytes ? o->buf_bytes : 1)))
        return fail(o, ncclSystemError, "%s: out of memory for %zu bytes", api_name(o->kind), o->buf_bytes);
    size_t bytes = o->count * dtype_size(o->dt);
    uint8_t *to = NULL;
    switch (o->kind) {
    case K_ALL_REDUCE:
    case K_REDUCE:
    case K_SEND:
    case K_REDUCE_SCATTER: to = o->buf; break;
    case K_BROADCAST: to = c->rank == o->root ? o->buf : NULL; break;
    case K_ALL_GATHER: to = o->buf + (size_t)c->rank * bytes; break;
    case K_RECV: break;
    }
    if (to) {
        cusim_mem_open();
        memcpy(to, o->sendbuff, o->kind == K_REDUCE_SCATTER ? o->buf_bytes : bytes);
        cusim_mem_close();
    }
    return ncclSuccess;
}

typedef struct publication {
    void *dst;
    uint8_t *buf;
    size_t off, bytes;
} publication;

static void publish_now(void *ctx)
{
    publication *p = ctx;
    memcpy(p->dst, p->buf + p->off, p->bytes);
}

static void publication_free(void *ctx)
{
    publication *p = ctx;
    free(p->buf);
    free(p);
}

/* On the caller's thread: the result reaches recvbuff in stream order. */
static ncclResult_t publish(op *o)
{
    if (!o->out_bytes) return ncclSuccess;
    publication *p = malloc(sizeof *p);
    if (!p) return fail(o, ncclSystemError, "%s: out of memory", api_name(o->kind));
    *p = (publication){.dst = o->recvbuff, .buf = o->buf, .off = o->out_off, .bytes = o->out_bytes};
    int e = cusim_enqueue_host_fn(o->stream, publish_now, p, publication_free);
    if (e) {
        free(p); /* not queued: the buffer is still the op's */
        return fail(o, ncclUnhandledCudaError, "%s: cannot queue the result on the stream (CUDA error %d)",
                    api_name(o->kind), e);
    }
    o->buf = NULL;
    return ncclSuccess;
}

/* The exchange of the ops of one communicator: collectives in call order,
 * then the sends and receives together. A failure breaks the communicator
 * (on every rank: the others are told through the segment). */
typedef struct comm_work {
    ncclComm_t comm;
    op **ops;
    int n;
} comm_work;

static void *run_comm(void *arg)
{
    comm_work *w = arg;
    ncclComm_t c = w->comm;
    op *failed = NULL, *p2p[w->n > 0 ? w->n : 1];
    int np = 0;
    for (int i = 0; i < w->n && !failed; i++) {
        op *o = w->ops[i];
        if (o->result) failed = o;
        else if (o->kind == K_SEND || o->kind == K_RECV) p2p[np++] = o;
        else if (run_collective(o)) failed = o;
    }
    if (!failed && np && run_p2p(p2p, np)) {
        for (int i = 0; i < np && !failed; i++)
            if (p2p[i]->result) failed = p2p[i];
    }
    if (!failed) return NULL;
    for (int i = 0; i < w->n; i++)
        if (!w->ops[i]->result)
            fail(w->ops[i], failed->result, "%s (not run: an earlier call in its group failed): %s",
                 api_name(w->ops[i]->kind), failed->msg);
    if (!c->broken) {
        c->broken = failed->result;
        snprintf(c->msg, sizeof c->msg, "%s", failed->msg);
        poison(c->head, c->rank, failed->result, failed->msg);
    }
    return NULL;
}

/* Runs ops[0..n) (checked already): prepare each, exchange per communicator
 * (one thread each when there are several), publish each. The first error. */
static ncclResult_t run_ops(op *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (!ops[i].result) prepare(&ops[i]);
    comm_work work[n > 0 ? n : 1];
    op *list[n > 0 ? n : 1];
    int nw = 0, nl = 0;
    for (int i = 0; i < n; i++) { /* group the ops by communicator, in call order */
        bool seen = false;
        for (int k = 0; k < nw; k++) seen |= work[k].comm == ops[i].comm;
        if (seen) continue;
        work[nw] = (comm_work){.comm = ops[i].comm, .ops = list + nl, .n = 0};
        for (int k = i; k < n; k++)
            if (ops[k].comm == ops[i].comm) list[nl++] = &ops[k], work[nw].n++;
        nw++;
    }
    pthread_t tid[nw > 0 ? nw : 1];
    bool threaded[nw > 0 ? nw : 1];
    for (int k = 0; k < nw; k++)
        threaded[k] = nw > 1 && k > 0 && !pthread_create(&tid[k], NULL, run_comm, &work[k]);
    for (int k = 0; k < nw; k++)
        if (!threaded[k]) run_comm(&work[k]); /* the first here; others if no thread could be made */
    for (int k = 0; k < nw; k++)
        if (threaded[k]) pthread_join(tid[k], NULL);
    ncclResult_t first = ncclSuccess;
    for (int i = 0; i < n; i++) {
        op *o = &ops[i];
        if (!o->result) publish(o);
        free(o->buf);
        o->buf = NULL;
        if (o->result && !first) first = report(o->comm, o->result, o->msg);
    }
    return first;
}

/* A call from the API: checked now; run now, or at ncclGroupEnd in a group. */
static ncclResult_t submit(op o)
{
    if (check_op(&o)) return report(o.comm, o.result, o.msg);
    if (group.depth == 0) return run_ops(&o, 1);
    if (group.n == group.cap) {
        int cap = group.cap ? 2 * group.cap : 16;
        op *ops = realloc(group.ops, (size_t)cap * sizeof *ops);
        if (!ops) return api_error(o.comm, ncclSystemError, "%s: out of memory", api_name(o.kind));
        group.ops = ops;
        group.cap = cap;
    }
    group.ops[group.n++] = o;
    return ncclSuccess;
}

/* ---- the API: collectives ---------------------------------------------------------------- */

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op_, ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_ALL_REDUCE, .comm = comm, .stream = stream, .sendbuff = sendbuff,
                       .recvbuff = recvbuff, .count = count, .dt = datatype, .red = op_, .root = -1});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_BROADCAST, .comm = comm, .stream = stream, .sendbuff = sendbuff,
                       .recvbuff = recvbuff, .count = count, .dt = datatype, .root = root});
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op_, int root, ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_REDUCE, .comm = comm, .stream = stream, .sendbuff = sendbuff,
                       .recvbuff = recvbuff, .count = count, .dt = datatype, .red = op_, .root = root});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_ALL_GATHER, .comm = comm, .stream = stream, .sendbuff = sendbuff,
                       .recvbuff = recvbuff, .count = sendcount, .dt = datatype, .root = -1});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op_, ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_REDUCE_SCATTER, .comm = comm, .stream = stream, .sendbuff = sendbuff,
                       .recvbuff = recvbuff, .count = recvcount, .dt = datatype, .red = op_, .root = -1});
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return submit((op){.kind = K_SEND, .comm = comm, .stream = stream, .sendbuff = sendbuff, .count = count,
                       .dt = datatype, .root = peer});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return submit((op){.kind = K_RECV, .comm = comm, .stream = stream, .recvbuff = recvbuff, .count = count,
                       .dt = datatype, .root = peer});
}

ncclResult_t ncclGroupStart(void)
{
    group.depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group.depth == 0) return api_error(NULL, ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart before it");
    if (--group.depth > 0) return ncclSuccess;
    op *ops = group.ops;
    int n = group.n;
    group.ops = NULL;
    group.n = group.cap = 0;
    ncclResult_t r = run_ops(ops, n);
    free(ops);
    return r;
}

/* ---- the API: communicators ---------------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return api_error(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static _Atomic unsigned counter;
    uint64_t r = 0;
    if (!id) return api_error(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
        return api_error(NULL, ncclSystemError, "ncclGetUniqueId: no random bytes: %s", strerror(errno));
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, ID_PREFIX "%d-%u-%016llx", (int)getpid(),
             atomic_fetch_add(&counter, 1), (unsigned long long)r);
    return ncclSuccess;
}

static double timeout_from_env(void)
{
    const char *s = getenv("EMBER_CUSIM_NCCL_TIMEOUT");
    char *end;
    double t = s ? strtod(s, &end) : 0;
    return s && end != s && t > 0 ? t : 60;
}

/* Opens (or creates) the segment under an exclusive lock and checks its head. */
static ncclResult_t seg_open(ncclComm_t c, const char *name, char *msg, size_t msg_n)
{
    int n = c->nranks, fd = shm_open(name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(msg, msg_n, "ncclCommInitRank: cannot open shared memory %s: %s", name, strerror(errno));
        return ncclSystemError;
    }
    ncclResult_t r = ncclSuccess;
    struct stat st;
    seg_head *h = MAP_FAILED;
    if (flock(fd, LOCK_EX) || fstat(fd, &st)) {
        snprintf(msg, msg_n, "ncclCommInitRank: cannot lock %s: %s", name, strerror(errno));
        r = ncclSystemError;
        goto out;
    }
    bool create = st.st_size == 0;
    int e = 0;
    /* reserve the head and slots now: a full /dev/shm is an error here, not a SIGBUS later */
    if (create && (ftruncate(fd, (off_t)seg_bytes(n)) ? (e = errno) : (e = posix_fallocate(fd, 0, (off_t)mbox_off(n))))) {
        snprintf(msg, msg_n, "ncclCommInitRank: cannot reserve %zu bytes of shared memory for %s: %s", seg_bytes(n),
                 name, strerror(e));
        r = ncclSystemError;
        goto out;
    }
    if (!create && (size_t)st.st_size < PAGE) {
        snprintf(msg, msg_n, "ncclCommInitRank: %s is not a communicator's segment", name);
        r = ncclInvalidUsage;
        goto out;
    }
    h = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        snprintf(msg, msg_n, "ncclCommInitRank: cannot map %s: %s", name, strerror(errno));
        r = ncclSystemError;
        goto out;
    }
    if (create) {
        *h = (seg_head){.magic = MAGIC, .nranks = n, .creator_rank = c->rank, .creator_pid = (int32_t)getpid()};
    } else if (h->magic != MAGIC) {
        snprintf(msg, msg_n, "ncclCommInitRank: %s is not a communicator's segment", name);
        r = ncclInvalidUsage;
        goto out;
    } else if (h->nranks != n) {
        snprintf(msg, msg_n,
                 "ncclCommInitRank: rank %d (pid %d) was given nranks=%d, but rank %d (pid %d) made the communicator "
                 "with nranks=%d",
                 c->rank, (int)getpid(), n, h->creator_rank, h->creator_pid, h->nranks);
        poison(h, c->rank, ncclInvalidUsage, msg);
        r = ncclInvalidUsage;
        goto out;
    }
    c->size = seg_bytes(n);
    c->base = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (c->base == MAP_FAILED) {
        c->base = NULL;
        snprintf(msg, msg_n, "ncclCommInitRank: cannot map %zu bytes of %s: %s", c->size, name, strerror(errno));
        r = ncclSystemError;
        goto out;
    }
    c->head = (seg_head *)c->base;
    c->ctl = (rank_ctl *)(c->base + ctl_off());
out:
    if (h != MAP_FAILED) munmap(h, PAGE);
    flock(fd, LOCK_UN); /* explicitly: the mapping keeps the open file, and so the lock, alive */
    close(fd);
    return r;
}

/* Registers this rank and waits for all. */
static ncclResult_t seg_join(ncclComm_t c, const char *name, char *msg, size_t msg_n)
{
    seg_head *h = c->head;
    int32_t none = 0, me = (int32_t)getpid();
    if (!atomic_compare_exchange_strong(&c->ctl[c->rank].pid, &none, me)) {
        snprintf(msg, msg_n, "ncclCommInitRank: rank %d joined twice (pids %d and %d)", c->rank, (int)none, (int)me);
        poison(h, c->rank, ncclInvalidUsage, msg);
        return ncclInvalidUsage;
    }
    if (atomic_fetch_add(&h->arrived, 1) + 1 == (uint32_t)c->nranks) shm_unlink(name); /* everyone has it */
    wake(&h->arrived);
    double start = 0;
    for (int i = 0;; i++) {
        uint32_t cur = atomic_load(&h->arrived);
        if (atomic_load(&h->fail_state) == 2) { /* a rank gave up */
            snprintf(msg, msg_n, "%s", h->fail_msg);
            return (ncclResult_t)h->fail_code;
        }
        if (cur >= (uint32_t)c->nranks) return ncclSuccess;
        if (!backoff(i)) continue;
        if (start == 0) start = now_s();
        sleep_on(&h->arrived, cur);
        if (now_s() - start < c->timeout) continue;
        char missing[128] = "";
        for (int q = 0, k = 0; q < c->nranks && k < (int)sizeof missing - 8; q++)
            if (!atomic_load(&c->ctl[q].pid)) k += snprintf(missing + k, sizeof missing - (size_t)k, " %d", q);
        snprintf(msg, msg_n,
                 "ncclCommInitRank: rank %d waited %g s for the other ranks: %u of %d arrived; missing:%s "
                 "(EMBER_CUSIM_NCCL_TIMEOUT)",
                 c->rank, c->timeout, atomic_load(&h->arrived), c->nranks, missing);
        poison(h, c->rank, ncclSystemError, msg);
        shm_unlink(name); /* a late rank makes a new segment and times out too */
        return ncclSystemError;
    }
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    if (!comm) return api_error(NULL, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS)
        return api_error(NULL, ncclInvalidArgument, "ncclCommInitRank: nranks %d is outside [1, %d]", nranks,
                         MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return api_error(NULL, ncclInvalidArgument, "ncclCommInitRank: rank %d is outside [0, %d)", rank, nranks);
    if (!memchr(id.internal, 0, sizeof id.internal) || strncmp(id.internal, ID_PREFIX, strlen(ID_PREFIX)))
        return api_error(NULL, ncclInvalidArgument, "ncclCommInitRank: the id was not made by ncclGetUniqueId");
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) return api_error(NULL, ncclSystemError, "ncclCommInitRank: out of memory");
    c->rank = rank;
    c->nranks = nranks;
    c->device = cusim_current_device();
    c->timeout = timeout_from_env();
    char msg[MSG_BYTES];
    ncclResult_t r = seg_open(c, id.internal, msg, sizeof msg);
    if (!r) r = seg_join(c, id.internal, msg, sizeof msg);
    if (r) {
        if (r != ncclSystemError || !c->base) shm_unlink(id.internal); /* the others fail through the head */
        if (c->base) {
            atomic_store(&c->ctl[rank].gone, 1);
            munmap(c->base, c->size);
        }
        free(c);
        return report(NULL, r, msg);
    }
    *comm = c;
    return ncclSuccess;
}

/* Not collective: peers still waiting for this rank learn it is gone. */
static ncclResult_t comm_free(ncclComm_t comm, const char *api)
{
    if (!comm) return api_error(NULL, ncclInvalidArgument, "%s: comm is NULL", api);
    atomic_store(&comm->ctl[comm->rank].gone, 1);
    wake(&comm->ctl[comm->rank].step);
    munmap(comm->base, comm->size);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return comm_free(comm, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return comm_free(comm, "ncclCommAbort"); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count) return api_error(comm, ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device) return api_error(comm, ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank) return api_error(comm, ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "a CUDA call failed (ncclGetLastError says which)";
    case ncclSystemError: return "a system call failed or a peer timed out (ncclGetLastError says which)";
    case ncclInternalError: return "internal error in the NCCL emulator";
    case ncclInvalidArgument: return "invalid argument (ncclGetLastError says which)";
    case ncclInvalidUsage: return "invalid usage, e.g. ranks calling different collectives (ncclGetLastError says which)";
    case ncclRemoteError: return "a peer exited or gave up (ncclGetLastError says which)";
    case ncclInProgress: return "operation in progress";
    case ncclNumResults: break;
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) { return comm && comm->msg[0] ? comm->msg : thread_msg; }
