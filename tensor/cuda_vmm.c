/* cuda_vmm.c — device memory whose addresses stay while its pages come and
 * go, through CUDA's virtual memory management (built only with CUDA; the
 * contract is in cuda_impl.h).
 *
 * A cu_vrange takes over a block of device memory: the driver reserves an
 * address range of its size rounded up to the granularity G
 * (cuMemGetAllocationGranularity, 2 MiB on current GPUs), and every
 * granule of it is mapped to physical memory of its own (cuMemCreate,
 * cuMemMap, cuMemSetAccess; the handle is released at once, so the memory
 * goes when the granule is unmapped). The block's bytes are copied there
 * and the block goes back to the caching allocator: whoever pointed into
 * the block now points into the range, at the same offsets. From then on
 * the owner unmaps the granules it does not need (their memory is given
 * back to the device) and maps them again before their next use (their
 * contents then undefined until written). This is what lets ZeRO stage 3
 * keep a model's flat parameters in one place on a device while holding
 * only this rank's chunks between uses (dist/zero.c).
 *
 * Unmapping waits for the device without stalling the host: cu_vrange_unmap
 * records an event on the compute stream (after the kernels queued so far,
 * which may still read the granules) and the granules are unmapped once it
 * has completed, looked at by every later call on the range (and waited for
 * by em_cuda_empty_cache). A granule mapped again before then just stays.
 * The communication stream needs no event of its own: a collective's
 * buffers are the caller's until the compute stream has waited for it
 * (dist/nccl.c).
 *
 * The driver's functions come through the runtime
 * (cudaGetDriverEntryPointByVersion), so ember needs no link against
 * libcuda and a machine without a driver still loads it; under the
 * emulator they are tests/cusim/vmm.c's. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "tensor_impl.h"

/* the driver functions used, as cuda.h declares them */
static struct {
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static char drv_missing[64]; /* the first function the driver did not give, if any */

static void load_driver(void)
{
    static const char *names[] = {"cuMemGetAllocationGranularity",
                                  "cuMemAddressReserve",
                                  "cuMemAddressFree",
                                  "cuMemCreate",
                                  "cuMemRelease",
                                  "cuMemMap",
                                  "cuMemUnmap",
                                  "cuMemSetAccess"};
    void **slots[] = {(void **)&drv.granularity, (void **)&drv.reserve,   (void **)&drv.addr_free,
                      (void **)&drv.create,      (void **)&drv.release,   (void **)&drv.map,
                      (void **)&drv.unmap,       (void **)&drv.set_access};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        void *fn = NULL;
#if CUDART_VERSION >= 12050
        cudaError_t e = cudaGetDriverEntryPointByVersion(names[i], &fn, 12000, cudaEnableDefault, &q);
#else
        cudaError_t e = cudaGetDriverEntryPoint(names[i], &fn, cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
            cudaGetLastError();
            snprintf(drv_missing, sizeof drv_missing, "%s", names[i]);
            return;
        }
        memcpy(slots[i], &fn, sizeof fn);
    }
}

/* EM_OK, or an error naming the driver call and its result */
static em_status drv_check(CUresult r, const char *call, int dev)
{
    if (r == CUDA_SUCCESS) return EM_OK;
    const char *what = r == CUDA_ERROR_OUT_OF_MEMORY    ? "out of memory"
                       : r == CUDA_ERROR_INVALID_VALUE  ? "invalid value"
                       : r == CUDA_ERROR_NOT_SUPPORTED  ? "not supported"
                       : r == CUDA_ERROR_INVALID_DEVICE ? "invalid device"
                       : r == CUDA_ERROR_NOT_PERMITTED  ? "not permitted"
                                                        : "driver error";
    return em_err(r == CUDA_ERROR_OUT_OF_MEMORY ? EM_ERR_OOM : EM_ERR_DEVICE,
                  "cuda:%d: %s failed: %s (CUresult %d)", dev, call, what, (int)r);
}

typedef enum { G_UNMAPPED, G_MAPPED, G_PENDING } gstate;

typedef struct pending {
    cudaEvent_t done; /* recorded after the work that may still use the granules */
    uint64_t seq;
} pending;

struct cu_vrange {
    int dev;
    char *base;
    size_t nbytes;        /* what the owner uses */
    size_t g;             /* the granularity */
    size_t n;             /* granules */
    unsigned char *state; /* gstate per granule */
    uint64_t *seq;        /* G_PENDING: the unmap call that asked for it */
    pending *pend;        /* unmap calls not yet done, oldest first */
    size_t npend, cap_pend;
    uint64_t next_seq, done_seq;
    struct cu_vrange *next; /* every live range, for em_cuda_empty_cache */
};

static cu_vrange *ranges;
static pthread_mutex_t ranges_lock = PTHREAD_MUTEX_INITIALIZER;

static CUmemAllocationProp prop_of(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

/* granule k gets physical memory of its own, read-write for the device */
static em_status map_granule(cu_vrange *r, size_t k)
{
    CUmemAllocationProp p = prop_of(r->dev);
    CUdeviceptr va = (CUdeviceptr)(uintptr_t)(r->base + k * r->g);
    CUmemGenericAllocationHandle h = 0;
    em_status s = drv_check(drv.create(&h, r->g, &p, 0), "cuMemCreate", r->dev);
    if (s) return s;
    s = drv_check(drv.map(va, r->g, 0, h, 0), "cuMemMap", r->dev);
    (void)drv.release(h); /* the memory stays while mapped, and goes with the unmap */
    if (s) return s;
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location = p.location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    s = drv_check(drv.set_access(va, r->g, &a, 1), "cuMemSetAccess", r->dev);
    if (s) {
        (void)drv.unmap(va, r->g);
        return s;
    }
    r->state[k] = G_MAPPED;
    cu_note_mapped(r->dev, (int64_t)r->g);
    return EM_OK;
}

static em_status unmap_granule(cu_vrange *r, size_t k)
{
    em_status s =
        drv_check(drv.unmap((CUdeviceptr)(uintptr_t)(r->base + k * r->g), r->g), "cuMemUnmap", r->dev);
    if (s) return s;
    r->state[k] = G_UNMAPPED;
    cu_note_mapped(r->dev, -(int64_t)r->g);
    return EM_OK;
}

/* The unmaps whose work is done (all of them when wait) happen now. */
static em_status reap(cu_vrange *r, bool wait)
{
    size_t done = 0;
    for (; done < r->npend; done++) {
        cudaError_t e = wait ? cudaEventSynchronize(r->pend[done].done) : cudaEventQuery(r->pend[done].done);
        if (e == cudaErrorNotReady) break;
        cudaGetLastError();
        if (e != cudaSuccess) return cu_check(e, "cuda vrange: waiting for the work before an unmap");
        r->done_seq = r->pend[done].seq;
        cudaEventDestroy(r->pend[done].done);
    }
    if (!done) return EM_OK;
    memmove(r->pend, r->pend + done, (r->npend - done) * sizeof *r->pend);
    r->npend -= done;
    em_status first = EM_OK;
    for (size_t k = 0; k < r->n; k++)
        if (r->state[k] == G_PENDING && r->seq[k] <= r->done_seq) {
            em_status s = unmap_granule(r, k);
            if (s && !first) first = s;
        }
    return first;
}

cu_vrange *cu_vrange_adopt(int dev, void **data, size_t nbytes)
{
    const char *fn = "cu_vrange_adopt";
    em_status s = cu_use(dev, fn);
    if (s) return NULL;
    pthread_once(&drv_once, load_driver);
    if (drv_missing[0])
        return em_fail(EM_ERR_UNSUPPORTED, "cuda:%d: the driver has no %s (CUDA virtual memory management)",
                       dev, drv_missing);
    CUmemAllocationProp p = prop_of(dev);
    size_t g = 0;
    if (drv_check(drv.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity",
                  dev))
        return NULL;
    cu_vrange *r = calloc(1, sizeof *r);
    if (!r) return em_fail(EM_ERR_OOM, "%s: out of memory", fn);
    r->dev = dev;
    r->g = g;
    r->nbytes = nbytes;
    r->n = (nbytes + g - 1) / g;
    if (!r->n) r->n = 1;
    r->state = calloc(r->n, 1);
    r->seq = calloc(r->n, sizeof *r->seq);
    CUdeviceptr base = 0;
    s = !r->state || !r->seq ? em_err(EM_ERR_OOM, "%s: out of memory", fn)
                             : drv_check(drv.reserve(&base, r->n * g, g, 0, 0), "cuMemAddressReserve", dev);
    r->base = (char *)(uintptr_t)base;
    for (size_t k = 0; k < r->n && !s; k++) s = map_granule(r, k);
    if (!s) s = cu_memcpy(r->base, em_device_cuda(dev), *data, em_device_cuda(dev), nbytes);
    if (s) {
        for (size_t k = 0; k < r->n && r->state; k++)
            if (r->state[k] == G_MAPPED) (void)unmap_granule(r, k);
        if (base) (void)drv.addr_free(base, r->n * g);
        free(r->state);
        free(r->seq);
        free(r);
        return NULL;
    }
    cu_free(dev, *data); /* reused only by work queued after the copy */
    *data = r->base;
    pthread_mutex_lock(&ranges_lock);
    r->next = ranges;
    ranges = r;
    pthread_mutex_unlock(&ranges_lock);
    return r;
}

size_t cu_vrange_granule(const cu_vrange *r) { return r ? r->g : 0; }

em_status cu_vrange_map(cu_vrange *r, size_t lo, size_t hi)
{
    em_status s = cu_use(r->dev, "cu_vrange_map");
    if (!s) s = reap(r, false);
    for (size_t k = lo / r->g; k < r->n && k * r->g < hi && !s; k++) {
        if (r->state[k] == G_PENDING) r->state[k] = G_MAPPED; /* never left */
        if (r->state[k] == G_UNMAPPED) {
            s = map_granule(r, k);
            if (s == EM_ERR_OOM && reap(r, true) == EM_OK) /* the pending unmaps may free enough */
                s = map_granule(r, k);
        }
    }
    return s;
}

em_status cu_vrange_unmap(cu_vrange *r, size_t lo, size_t hi)
{
    em_status s = cu_use(r->dev, "cu_vrange_unmap");
    if (s) return s;
    size_t k0 = (lo + r->g - 1) / r->g, k1 = hi / r->g; /* the granules wholly inside */
    bool any = false;
    for (size_t k = k0; k < k1 && k < r->n; k++) any = any || r->state[k] == G_MAPPED;
    if (!any) return reap(r, false);
    if (r->npend == r->cap_pend) {
        size_t cap = r->cap_pend ? 2 * r->cap_pend : 8;
        pending *grown = realloc(r->pend, cap * sizeof *grown);
        if (!grown) return em_err(EM_ERR_OOM, "cu_vrange_unmap: out of memory");
        r->pend = grown;
        r->cap_pend = cap;
    }
    pending *p = &r->pend[r->npend];
    s = cu_check(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "cu_vrange_unmap");
    if (!s) s = cu_check(cudaEventRecord(p->done, (cudaStream_t)cu_stream(r->dev)), "cu_vrange_unmap");
    if (s) return s;
    p->seq = ++r->next_seq;
    r->npend++;
    for (size_t k = k0; k < k1 && k < r->n; k++)
        if (r->state[k] == G_MAPPED) {
            r->state[k] = G_PENDING;
            r->seq[k] = p->seq;
        }
    return reap(r, false);
}

bool cu_vrange_mapped(const cu_vrange *r, size_t off)
{
    size_t k = off / r->g;
    return k < r->n && r->state[k] != G_UNMAPPED;
}

em_status cu_vrange_return(cu_vrange *r, void **data)
{
    if (!r) return EM_OK;
    em_device d = em_device_cuda(r->dev);
    void *block = cu_alloc(r->dev, r->nbytes);
    em_status s = block ? cu_fill(r->dev, EM_U8, block, (int64_t)r->nbytes, 0) : em_last_status();
    for (size_t k = 0; k < r->n && !s; k++) { /* what is mapped, run by run */
        if (r->state[k] == G_UNMAPPED) continue;
        size_t e = k;
        while (e + 1 < r->n && r->state[e + 1] != G_UNMAPPED) e++;
        size_t lo = k * r->g, hi = (e + 1) * r->g < r->nbytes ? (e + 1) * r->g : r->nbytes;
        if (lo < hi) s = cu_memcpy((char *)block + lo, d, r->base + lo, d, hi - lo);
        k = e;
    }
    if (!s) s = cu_sync(r->dev); /* nothing reads the range any more */
    if (s) {
        if (block) cu_free(r->dev, block);
        return s;
    }
    for (size_t k = 0; k < r->npend; k++) cudaEventDestroy(r->pend[k].done);
    for (size_t k = 0; k < r->n; k++)
        if (r->state[k] != G_UNMAPPED && !s) s = unmap_granule(r, k);
    if (!s)
        s = drv_check(drv.addr_free((CUdeviceptr)(uintptr_t)r->base, r->n * r->g), "cuMemAddressFree",
                      r->dev);
    *data = block;
    pthread_mutex_lock(&ranges_lock);
    for (cu_vrange **p = &ranges; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    pthread_mutex_unlock(&ranges_lock);
    free(r->pend);
    free(r->state);
    free(r->seq);
    free(r);
    return s;
}

void cu_vrange_settle(int dev)
{
    pthread_mutex_lock(&ranges_lock);
    for (cu_vrange *r = ranges; r; r = r->next)
        if (r->dev == dev) (void)reap(r, true);
    pthread_mutex_unlock(&ranges_lock);
}
