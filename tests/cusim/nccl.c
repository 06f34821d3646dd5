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
 * process happens to synchronise its streams. The exchange itself is in
 * nccl_exchange.c, the element arithmetic in nccl_reduce.c.
 *
 * Errors: arguments are checked before anything happens (ncclInvalidArgument,
 * naming the argument); a failure during the exchange breaks the
 * communicator on every rank. Every error is printed ("cusim: nccl: ...")
 * and kept for ncclGetLastError. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cusim_impl.h"
#include "nccl_impl.h"

static _Thread_local char thread_msg[MSG_BYTES]; /* the last error on this thread */
static _Thread_local struct {
    int depth;
    op *ops;
    int n, cap;
} group;

/* ---- errors ---------------------------------------------------------------------- */

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

/* ---- a call's life: check, prepare, exchange, publish ---------------------------------- */

/* ncclSuccess when [p, p+n) is device memory; else an error naming it. */
static ncclResult_t check_device(op *o, const char *what, const void *p, size_t n)
{
    cusim_alloc_info info = {0};
    if (!p)
        return cusim_nccl_fail(o, ncclInvalidArgument, "%s: %s is NULL", cusim_nccl_api_name(o->kind), what);
    switch (cusim_mem_lookup(p, n, &info)) {
    case CUSIM_MEM_DEVICE:
        if ((const uint8_t *)p + n > (const uint8_t *)info.base + info.size)
            return cusim_nccl_fail(
                o, ncclInvalidArgument,
                "%s: %s %p + %zu bytes runs past the end of its device allocation (%p, %zu bytes)",
                cusim_nccl_api_name(o->kind), what, p, n, info.base, info.size);
        return ncclSuccess;
    case CUSIM_MEM_INVALID:
        if (info.unmapped)
            return cusim_nccl_fail(
                o, ncclInvalidArgument,
                "%s: %s %p + %zu bytes touches an unmapped part of the range reserved at %p "
                "(%zu bytes)",
                cusim_nccl_api_name(o->kind), what, p, n, info.base, info.size);
        if ((const uint8_t *)p >= (const uint8_t *)info.base &&
            (const uint8_t *)p < (const uint8_t *)info.base + info.size)
            return cusim_nccl_fail(
                o, ncclInvalidArgument,
                "%s: %s %p + %zu bytes runs past the end of its device allocation (%p, %zu bytes)",
                cusim_nccl_api_name(o->kind), what, p, n, info.base, info.size);
        return cusim_nccl_fail(
            o, ncclInvalidArgument,
            "%s: %s %p (%zu bytes) is not in a live device allocation (nearest: %p, %zu bytes; freed, "
            "or out of bounds?)",
            cusim_nccl_api_name(o->kind), what, p, n, info.base, info.size);
    case CUSIM_MEM_OTHER: break;
    }
    return cusim_nccl_fail(o, ncclInvalidArgument, "%s: %s %p is not device memory (a host pointer?)",
                           cusim_nccl_api_name(o->kind), what, p);
}

/* The arguments, before anything happens. */
static ncclResult_t check_op(op *o)
{
    const char *api = cusim_nccl_api_name(o->kind);
    ncclComm_t c = o->comm;
    if (!c) return cusim_nccl_fail(o, ncclInvalidArgument, "%s: comm is NULL", api);
    if (c->broken)
        return cusim_nccl_fail(o, c->broken, "%s: the communicator failed earlier (destroy or abort it): %s",
                               api, c->msg);
    if ((unsigned)o->dt >= ncclNumTypes)
        return cusim_nccl_fail(o, ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t", api,
                               (int)o->dt);
    bool reduces = o->kind == K_ALL_REDUCE || o->kind == K_REDUCE || o->kind == K_REDUCE_SCATTER;
    if (reduces && (unsigned)o->red >= ncclNumOps)
        return cusim_nccl_fail(o, ncclInvalidArgument, "%s: op %d is not an ncclRedOp_t", api, (int)o->red);
    int n = c->nranks, me = c->rank;
    bool rooted = o->kind == K_BROADCAST || o->kind == K_REDUCE;
    if (rooted && (o->root < 0 || o->root >= n))
        return cusim_nccl_fail(o, ncclInvalidArgument, "%s: root %d is outside [0, %d)", api, o->root, n);
    if ((o->kind == K_SEND || o->kind == K_RECV) && (o->root < 0 || o->root >= n))
        return cusim_nccl_fail(o, ncclInvalidArgument, "%s: peer %d is outside [0, %d)", api, o->root, n);
    size_t es = cusim_nccl_dtype_size(o->dt);
    if (o->count > SIZE_MAX / es / (size_t)n / 2)
        return cusim_nccl_fail(o, ncclInvalidArgument, "%s: count %zu of %s is too large", api, o->count,
                               cusim_nccl_dtype_name(o->dt));
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
    if (e)
        return cusim_nccl_fail(o, ncclUnhandledCudaError,
                               "%s: the stream's earlier work failed (CUDA error %d)",
                               cusim_nccl_api_name(o->kind), e);
    if (!(o->buf = malloc(o->buf_bytes ? o->buf_bytes : 1)))
        return cusim_nccl_fail(o, ncclSystemError, "%s: out of memory for %zu bytes",
                               cusim_nccl_api_name(o->kind), o->buf_bytes);
    size_t bytes = o->count * cusim_nccl_dtype_size(o->dt);
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
    if (!p) return cusim_nccl_fail(o, ncclSystemError, "%s: out of memory", cusim_nccl_api_name(o->kind));
    *p = (publication){.dst = o->recvbuff, .buf = o->buf, .off = o->out_off, .bytes = o->out_bytes};
    int e = cusim_enqueue_host_fn(o->stream, publish_now, p, publication_free);
    o->buf = NULL; /* the publication owns it now, queued or not (freed on failure) */
    if (e) {
        return cusim_nccl_fail(o, ncclUnhandledCudaError,
                               "%s: cannot queue the result on the stream (CUDA error %d)",
                               cusim_nccl_api_name(o->kind), e);
    }
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
        if (o->result)
            failed = o;
        else if (o->kind == K_SEND || o->kind == K_RECV)
            p2p[np++] = o;
        else if (cusim_nccl_run_collective(o))
            failed = o;
    }
    if (!failed && np && cusim_nccl_run_p2p(p2p, np)) {
        for (int i = 0; i < np && !failed; i++)
            if (p2p[i]->result) failed = p2p[i];
    }
    if (!failed) return NULL;
    for (int i = 0; i < w->n; i++)
        if (!w->ops[i]->result)
            cusim_nccl_fail(w->ops[i], failed->result,
                            "%s (not run: an earlier call in its group failed): %s",
                            cusim_nccl_api_name(w->ops[i]->kind), failed->msg);
    if (!c->broken) {
        c->broken = failed->result;
        snprintf(c->msg, sizeof c->msg, "%s", failed->msg);
        cusim_nccl_poison(c->head, c->rank, failed->result, failed->msg);
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
        if (!ops) return api_error(o.comm, ncclSystemError, "%s: out of memory", cusim_nccl_api_name(o.kind));
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
    return submit((op){.kind = K_ALL_REDUCE,
                       .comm = comm,
                       .stream = stream,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dt = datatype,
                       .red = op_,
                       .root = -1});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_BROADCAST,
                       .comm = comm,
                       .stream = stream,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dt = datatype,
                       .root = root});
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op_, int root, ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_REDUCE,
                       .comm = comm,
                       .stream = stream,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dt = datatype,
                       .red = op_,
                       .root = root});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_ALL_GATHER,
                       .comm = comm,
                       .stream = stream,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = sendcount,
                       .dt = datatype,
                       .root = -1});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op_, ncclComm_t comm, cudaStream_t stream)
{
    return submit((op){.kind = K_REDUCE_SCATTER,
                       .comm = comm,
                       .stream = stream,
                       .sendbuff = sendbuff,
                       .recvbuff = recvbuff,
                       .count = recvcount,
                       .dt = datatype,
                       .red = op_,
                       .root = -1});
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return submit((op){.kind = K_SEND,
                       .comm = comm,
                       .stream = stream,
                       .sendbuff = sendbuff,
                       .count = count,
                       .dt = datatype,
                       .root = peer});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return submit((op){.kind = K_RECV,
                       .comm = comm,
                       .stream = stream,
                       .recvbuff = recvbuff,
                       .count = count,
                       .dt = datatype,
                       .root = peer});
}

ncclResult_t ncclGroupStart(void)
{
    group.depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group.depth == 0)
        return api_error(NULL, ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart before it");
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
    if (create && (ftruncate(fd, (off_t)seg_bytes(n)) ? (e = errno)
                                                      : (e = posix_fallocate(fd, 0, (off_t)mbox_off(n))))) {
        snprintf(msg, msg_n, "ncclCommInitRank: cannot reserve %zu bytes of shared memory for %s: %s",
                 seg_bytes(n), name, strerror(e));
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
        *h = (seg_head){
            .magic = MAGIC, .nranks = n, .creator_rank = c->rank, .creator_pid = (int32_t)getpid()};
    } else if (h->magic != MAGIC) {
        snprintf(msg, msg_n, "ncclCommInitRank: %s is not a communicator's segment", name);
        r = ncclInvalidUsage;
        goto out;
    } else if (h->nranks != n) {
        snprintf(msg, msg_n,
                 "ncclCommInitRank: rank %d (pid %d) was given nranks=%d, but rank %d (pid %d) made the "
                 "communicator "
                 "with nranks=%d",
                 c->rank, (int)getpid(), n, h->creator_rank, h->creator_pid, h->nranks);
        cusim_nccl_poison(h, c->rank, ncclInvalidUsage, msg);
        r = ncclInvalidUsage;
        goto out;
    }
    c->size = seg_bytes(n);
    c->base = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (c->base == MAP_FAILED) {
        c->base = NULL;
        snprintf(msg, msg_n, "ncclCommInitRank: cannot map %zu bytes of %s: %s", c->size, name,
                 strerror(errno));
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
        snprintf(msg, msg_n, "ncclCommInitRank: rank %d joined twice (pids %d and %d)", c->rank, (int)none,
                 (int)me);
        cusim_nccl_poison(h, c->rank, ncclInvalidUsage, msg);
        return ncclInvalidUsage;
    }
    if (atomic_fetch_add(&h->arrived, 1) + 1 == (uint32_t)c->nranks) shm_unlink(name); /* everyone has it */
    cusim_nccl_wake(&h->arrived);
    double start = 0;
    for (int i = 0;; i++) {
        uint32_t cur = atomic_load(&h->arrived);
        if (atomic_load(&h->fail_state) == 2) { /* a rank gave up */
            snprintf(msg, msg_n, "%s", h->fail_msg);
            return (ncclResult_t)h->fail_code;
        }
        if (cur >= (uint32_t)c->nranks) return ncclSuccess;
        if (!cusim_nccl_backoff(i)) continue;
        if (start == 0) start = cusim_nccl_now_s();
        cusim_nccl_sleep_on(&h->arrived, cur);
        if (cusim_nccl_now_s() - start < c->timeout) continue;
        char missing[128] = "";
        for (int q = 0, k = 0; q < c->nranks && k < (int)sizeof missing - 8; q++)
            if (!atomic_load(&c->ctl[q].pid))
                k += snprintf(missing + k, sizeof missing - (size_t)k, " %d", q);
        snprintf(msg, msg_n,
                 "ncclCommInitRank: rank %d waited %g s for the other ranks: %u of %d arrived; missing:%s "
                 "(EMBER_CUSIM_NCCL_TIMEOUT)",
                 c->rank, c->timeout, atomic_load(&h->arrived), c->nranks, missing);
        cusim_nccl_poison(h, c->rank, ncclSystemError, msg);
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
        return api_error(NULL, ncclInvalidArgument, "ncclCommInitRank: rank %d is outside [0, %d)", rank,
                         nranks);
    if (!memchr(id.internal, 0, sizeof id.internal) || strncmp(id.internal, ID_PREFIX, strlen(ID_PREFIX)))
        return api_error(NULL, ncclInvalidArgument,
                         "ncclCommInitRank: the id was not made by ncclGetUniqueId");
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
    cusim_nccl_wake(&comm->ctl[comm->rank].step);
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
    if (!comm || !device)
        return api_error(comm, ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
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
    case ncclInvalidUsage:
        return "invalid usage, e.g. ranks calling different collectives (ncclGetLastError says which)";
    case ncclRemoteError: return "a peer exited or gave up (ncclGetLastError says which)";
    case ncclInProgress: return "operation in progress";
    case ncclNumResults: break;
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) { return comm && comm->msg[0] ? comm->msg : thread_msg; }
