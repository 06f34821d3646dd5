/* nccl.c — collectives on CUDA tensors through NCCL (built when NCCL is found).
 *
 * One communicator per (process group, device), made on the group's first
 * CUDA collective on that device: rank 0 makes an ncclUniqueId and puts it
 * in the group's store under "NAME/nccl/K" (K counts the communicators this
 * group has made, the same on every rank since every rank makes the same
 * calls); the others get it from there. A group of one needs no store.
 *
 * Streams: collectives run on a communication stream per device, so they
 * overlap the kernels of the compute stream (DDP's buckets during backward):
 *   compute: ... grad kernels --record(before)-->          ... wait(after) --> optimizer
 *   comm:               wait(before) --> ncclAllReduce --> record(after)
 * Buffers used by a collective are the caller's until the compute stream has
 * waited for `after` (at once for a synchronous call, at em_work_wait for an
 * asynchronous one), which is what keeps the caching allocator's stream-order
 * reuse rule (tensor/cuda_runtime.c) true.
 *
 * NCCL's own collectives serve all_reduce, broadcast, all_gather and
 * reduce_scatter; gather is point-to-point receives at the root in one
 * NCCL group (gather below).
 *
 * A call comes here only after the group checked it like any other, in the
 * same call sequence (collectives.c, issue(); wire.c): NCCL would hang on a
 * mismatched call, the check fails it on every rank naming both calls. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dist/dist_impl.h"
#include "dist/pg_impl.h"
#include "tensor/tensor_impl.h"

enum { MAX_DEVICES = 16 };

struct nccl_comms {
    ncclComm_t comm[MAX_DEVICES];
    int made; /* communicators made so far: the K of the store key */
};

static cudaStream_t comm_stream[MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* EM_OK, or EM_ERR_DIST with NCCL's words: the result's name and the
 * library's own last message (which names mismatched calls and dead peers). */
static em_status nccl_check(ncclResult_t r, const char *op)
{
    if (r == ncclSuccess) return EM_OK;
    const char *detail = ncclGetLastError(NULL);
    if (detail && *detail) return em_err(EM_ERR_DIST, "%s (NCCL): %s: %s", op, ncclGetErrorString(r), detail);
    return em_err(EM_ERR_DIST, "%s (NCCL): %s", op, ncclGetErrorString(r));
}

/* dev's communication stream, made on first use (dev current). */
static cudaStream_t stream_of(int dev, const char *op)
{
    pthread_mutex_lock(&lock);
    if (!comm_stream[dev] && cu_check(cudaStreamCreateWithFlags(&comm_stream[dev], cudaStreamNonBlocking), op))
        comm_stream[dev] = NULL;
    cudaStream_t s = comm_stream[dev];
    pthread_mutex_unlock(&lock);
    return s;
}

/* pg's communicator on dev, made on first use. */
static ncclComm_t comm_of(em_pg *pg, int dev, const char *op)
{
    if (!pg->nccl && !(pg->nccl = calloc(1, sizeof *pg->nccl)))
        return em_fail(EM_ERR_OOM, "%s: out of memory", op);
    if (pg->nccl->comm[dev]) return pg->nccl->comm[dev];
    ncclUniqueId id;
    char key[256];
    snprintf(key, sizeof key, "%s/nccl/%d", pg->name, pg->nccl->made);
    if (pg->rank == 0) {
        if (nccl_check(ncclGetUniqueId(&id), op)) return NULL;
        if (pg->world > 1 && em_store_set(pg->store, key, &id, sizeof id)) return NULL;
    } else {
        void *v = NULL;
        size_t len = 0;
        if (em_store_get(pg->store, key, &v, &len)) return NULL;
        if (len != sizeof id) {
            free(v);
            return em_fail(EM_ERR_DIST, "%s: store key '%s' holds %zu bytes, not an ncclUniqueId", op, key, len);
        }
        memcpy(&id, v, sizeof id);
        free(v);
    }
    ncclComm_t comm;
    if (nccl_check(ncclCommInitRank(&comm, pg->world, id, pg->rank), op)) return NULL;
    pg->nccl->comm[dev] = comm;
    pg->nccl->made++;
    return comm;
}

static bool nccl_type(em_dtype dt, ncclDataType_t *t)
{
    switch (dt) {
    case EM_F32: *t = ncclFloat32; return true;
    case EM_F64: *t = ncclFloat64; return true;
    case EM_F16: *t = ncclFloat16; return true;
    case EM_BF16: *t = ncclBfloat16; return true;
    case EM_I32: *t = ncclInt32; return true;
    case EM_U8: *t = ncclUint8; return true;
    default: return false;
    }
}

static ncclRedOp_t nccl_op(int op)
{
    switch (op) {
    case EM_RED_MAX: return ncclMax;
    case EM_RED_MIN: return ncclMin;
    case EM_RED_AVG: return ncclAvg;
    default: return ncclSum;
    }
}

static const char *op_text(int kind)
{
    switch (kind) {
    case CALL_ALL_REDUCE: return "all_reduce";
    case CALL_BROADCAST: return "broadcast";
    case CALL_ALL_GATHER: return "all_gather";
    case CALL_REDUCE_SCATTER: return "reduce_scatter";
    case CALL_GATHER: return "gather";
    case CALL_SEND: return "send";
    case CALL_RECV: return "recv";
    default: return "collective";
    }
}

/* An event recorded on s now; NULL + error. */
static cudaEvent_t record(cudaStream_t s, const char *op)
{
    cudaEvent_t e;
    if (cu_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), op)) return NULL;
    if (cu_check(cudaEventRecord(e, s), op)) {
        cudaEventDestroy(e);
        return NULL;
    }
    return e;
}

/* The compute stream of dev waits for e; e is released. */
static em_status compute_waits(int dev, cudaEvent_t e, const char *op)
{
    em_status s = cu_use(dev, op);
    if (!s) s = cu_check(cudaStreamWaitEvent((cudaStream_t)cu_stream(dev), e, 0), op);
    cudaEventDestroy(e); /* released once it has completed */
    return s;
}

/* gather (NCCL has none): in one group, the root receives each other rank's
 * n elements into its slot of out and copies its own; the others send. The
 * root's own copy goes on the communication stream, ordered with the rest. */
static ncclResult_t gather(em_pg *pg, const call *c, ncclDataType_t t, ncclComm_t comm, cudaStream_t cs)
{
    size_t n = (size_t)c->h.count, bytes = n * em_dtype_size((em_dtype)c->h.dtype);
    int root = c->h.root;
    if (pg->rank != root) return ncclSend(c->in, n, t, root, comm, cs);
    if (cudaMemcpyAsync((char *)c->out + (size_t)root * bytes, c->in, bytes, cudaMemcpyDeviceToDevice, cs) !=
        cudaSuccess)
        return ncclUnhandledCudaError;
    if (pg->world == 1) return ncclSuccess;
    ncclResult_t r = ncclGroupStart();
    for (int k = 0; k < pg->world && r == ncclSuccess; k++)
        if (k != root) r = ncclRecv((char *)c->out + (size_t)k * bytes, n, t, k, comm, cs);
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

em_status nccl_issue(em_pg *pg, const call *c, int dev, em_work **work)
{
    const char *op = op_text(c->h.kind);
    if (work) *work = NULL;
    ncclDataType_t t;
    if (!nccl_type((em_dtype)c->h.dtype, &t))
        return em_err(EM_ERR_DTYPE, "%s: %s has no NCCL type", op, em_dtype_name((em_dtype)c->h.dtype));
    if (dev < 0 || dev >= MAX_DEVICES) return em_err(EM_ERR_DEVICE, "%s: cuda:%d is out of range", op, dev);
    em_status s = cu_use(dev, op);
    if (s) return s;
    cudaStream_t cs = stream_of(dev, op);
    ncclComm_t comm = cs ? comm_of(pg, dev, op) : NULL;
    if (!comm) return em_last_status();
    /* the collective comes after everything queued so far on the compute stream */
    cudaEvent_t before = record((cudaStream_t)cu_stream(dev), op);
    if (!before) return em_last_status();
    s = cu_check(cudaStreamWaitEvent(cs, before, 0), op);
    cudaEventDestroy(before);
    if (s) return s;
    size_t n = (size_t)c->h.count;
    ncclResult_t r;
    switch (c->h.kind) {
    case CALL_ALL_REDUCE: r = ncclAllReduce(c->in, c->in, n, t, nccl_op(c->h.op), comm, cs); break;
    case CALL_BROADCAST: r = ncclBroadcast(c->in, c->in, n, t, c->h.root, comm, cs); break;
    case CALL_ALL_GATHER: r = ncclAllGather(c->in, c->out, n, t, comm, cs); break;
    case CALL_REDUCE_SCATTER: /* count: the input's elements, world x the output's */
        r = ncclReduceScatter(c->in, c->out, n / (size_t)pg->world, t, nccl_op(c->h.op), comm, cs);
        break;
    case CALL_GATHER: r = gather(pg, c, t, comm, cs); break;
    case CALL_SEND: r = ncclSend(c->in, n, t, c->h.root, comm, cs); break;
    case CALL_RECV: r = ncclRecv(c->in, n, t, c->h.root, comm, cs); break;
    default: return em_err(EM_ERR_UNSUPPORTED, "%s: not available for CUDA tensors", op);
    }
    if ((s = nccl_check(r, op))) return s;
    cudaEvent_t after = record(cs, op);
    if (!after) return em_last_status();
    if (!work) return compute_waits(dev, after, op);
    em_work *w = calloc(1, sizeof *w);
    if (!w) {
        compute_waits(dev, after, op);
        return em_err(EM_ERR_OOM, "%s: out of memory", op);
    }
    w->c = *c;
    w->pg = pg;
    w->nccl_done = after;
    w->nccl_dev = dev;
    *work = w;
    return EM_OK;
}

em_status nccl_work_wait(em_work *w)
{
    em_status s = compute_waits(w->nccl_dev, (cudaEvent_t)w->nccl_done, op_text(w->c.h.kind));
    free(w);
    return s;
}

bool nccl_work_done(const em_work *w)
{
    cudaSetDevice(w->nccl_dev);
    cudaError_t e = cudaEventQuery((cudaEvent_t)w->nccl_done);
    if (e != cudaErrorNotReady) cudaGetLastError();
    return e != cudaErrorNotReady;
}

void nccl_pg_free(em_pg *pg)
{
    if (!pg->nccl) return;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (pg->nccl->comm[d]) {
            cudaSetDevice(d);
            ncclCommDestroy(pg->nccl->comm[d]);
        }
    free(pg->nccl);
    pg->nccl = NULL;
}
