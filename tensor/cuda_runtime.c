/* cuda_runtime.c — devices, streams, the caching allocator, copies and
 * cuBLAS handles (built only with CUDA; see cuda_impl.h for the contract;
 * cuBLAS itself is opened on a device's first product: cublas_api.h).
 *
 * The caching allocator: every block ever taken from cudaMalloc stays with
 * ember until em_cuda_empty_cache (or an out-of-memory retry). A freed block
 * goes on its device's free list; an allocation takes the smallest free
 * block that fits and is at most twice the request (so a huge cached block
 * is not pinned by a tiny tensor). Blocks are never split: sizes are rounded
 * to 512 B below 1 MiB and to 2 MiB above, so a training step, which asks
 * for the same sizes every step, finds them all cached after its first.
 * Reuse is safe without events because every kernel runs on the device's
 * one compute stream, in call order: a block freed after a kernel was
 * queued is only reused by kernels queued after it. (The communication
 * stream of DDP uses persistent buffers, never freed mid-step.) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cublas_api.h"
#include "ember/runtime.h"
#include "ember_config.h"
#include "tensor_impl.h"

#if EM_HAVE_NCCL
#include <nccl.h>
#endif

enum { MAX_DEVICES = 16 };

typedef struct block {
    void *p;
    size_t size; /* the rounded size it was made with */
    size_t req;  /* what the allocation using it asked for */
    struct block *next;
} block;

typedef struct device_state {
    bool ready;
    cudaStream_t stream;
    cublasHandle_t blas;
    bool blas_tf32; /* the math mode the handle was last set to */
    block *free_list;  /* cached blocks, unsorted */
    block *used;       /* blocks handed out */
    size_t allocated, reserved, peak;
    size_t requested; /* the bytes asked for by the blocks in use */
    uint64_t mallocs;
    size_t mapped, peak_mapped; /* cuda_vmm.c's granules */
    void *pinned; /* staging for host -> device copies */
    size_t pinned_size;
    cudaEvent_t pinned_done; /* the last copy out of `pinned` */
} device_state;

static device_state devs[MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool tf32_on;

em_status cu_check(int st, const char *what)
{
    if (st == cudaSuccess) return EM_OK;
    return em_err(st == cudaErrorMemoryAllocation ? EM_ERR_OOM : EM_ERR_DEVICE, "%s: CUDA error %d (%s)", what, st,
                  cudaGetErrorString((cudaError_t)st));
}

em_status cu_launched(const char *op) { return cu_check(cudaGetLastError(), op); }

/* dev's state, set up on first use (stream, event); NULL + error */
static device_state *state(int dev, const char *op)
{
    int n = em_cuda_device_count();
    if (dev < 0 || dev >= n || dev >= MAX_DEVICES)
        return em_fail(EM_ERR_DEVICE, "%s: cuda:%d does not exist (%d CUDA device%s visible)", op, dev, n,
                       n == 1 ? "" : "s");
    device_state *d = &devs[dev];
    if (cu_check(cudaSetDevice(dev), op)) return NULL;
    if (d->ready) return d;
    pthread_mutex_lock(&lock);
    if (!d->ready) {
        em_status s = cu_check(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), op);
        if (!s) s = cu_check(cudaEventCreateWithFlags(&d->pinned_done, cudaEventDisableTiming), op);
        if (!s) d->ready = true;
    }
    pthread_mutex_unlock(&lock);
    return d->ready ? d : NULL;
}

em_status cu_use(int dev, const char *op) { return state(dev, op) ? EM_OK : em_last_status(); }

void *cu_stream(int dev)
{
    device_state *d = state(dev, "cuda stream");
    return d ? (void *)d->stream : NULL;
}

void *cu_blas(int dev)
{
    device_state *d = state(dev, "cublas");
    if (!d) return NULL;
    const cublas_api *blas = cublas_get(); /* the library is opened here, on a device's first product */
    if (!blas) return NULL;
    if (!d->blas) {
        if (blas->create(&d->blas) != CUBLAS_STATUS_SUCCESS)
            return em_fail(EM_ERR_DEVICE, "cublas: cublasCreate failed on cuda:%d", dev);
        blas->set_stream(d->blas, d->stream);
        d->blas_tf32 = !tf32_on; /* force the first set below */
    }
    if (d->blas_tf32 != tf32_on) {
        blas->set_math_mode(d->blas, tf32_on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
        d->blas_tf32 = tf32_on;
    }
    return d->blas;
}

static size_t round_size(size_t n)
{
    if (n == 0) n = 1;
    const size_t small = 512, big = 2u << 20;
    return n < (1u << 20) ? (n + small - 1) / small * small : (n + big - 1) / big * big;
}

/* returns every cached block of d to CUDA; lock held */
static void release_cached(device_state *d)
{
    for (block *b = d->free_list, *next; b; b = next) {
        next = b->next;
        cudaFree(b->p);
        d->reserved -= b->size;
        free(b);
    }
    d->free_list = NULL;
}

void *cu_alloc(int dev, size_t nbytes)
{
    device_state *d = state(dev, "cuda alloc");
    if (!d) return NULL;
    size_t size = round_size(nbytes);
    pthread_mutex_lock(&lock);
    block **best = NULL;
    for (block **b = &d->free_list; *b; b = &(*b)->next)
        if ((*b)->size >= size && (*b)->size <= 2 * size && (!best || (*b)->size < (*best)->size)) best = b;
    block *got = NULL;
    if (best) {
        got = *best;
        *best = got->next;
    } else {
        void *p = NULL;
        cudaError_t st = cudaMalloc(&p, size);
        if (st == cudaErrorMemoryAllocation) { /* give the cache back and try once more */
            cudaGetLastError();
            cudaDeviceSynchronize();
            release_cached(d);
            st = cudaMalloc(&p, size);
        }
        if (st != cudaSuccess || !(got = malloc(sizeof *got))) {
            if (st == cudaSuccess) cudaFree(p);
            cudaGetLastError();
            pthread_mutex_unlock(&lock);
            return em_fail(EM_ERR_OOM, "cuda:%d: out of memory allocating %zu bytes (%zu in use, %zu held)", dev,
                           nbytes, d->allocated, d->reserved);
        }
        got->p = p;
        got->size = size;
        d->reserved += size;
        d->mallocs++;
    }
    got->next = d->used;
    got->req = nbytes;
    d->used = got;
    d->allocated += got->size;
    d->requested += nbytes;
    if (d->allocated > d->peak) d->peak = d->allocated;
    pthread_mutex_unlock(&lock);
    return got->p;
}

void cu_free(int dev, void *p)
{
    if (!p || dev < 0 || dev >= MAX_DEVICES) return;
    device_state *d = &devs[dev];
    pthread_mutex_lock(&lock);
    for (block **b = &d->used; *b; b = &(*b)->next)
        if ((*b)->p == p) {
            block *x = *b;
            *b = x->next;
            d->allocated -= x->size;
            d->requested -= x->req;
            x->next = d->free_list;
            d->free_list = x;
            break;
        }
    pthread_mutex_unlock(&lock);
}

/* the pinned staging buffer of d, at least n bytes, free to overwrite */
static void *pinned(device_state *d, size_t n)
{
    cudaEventSynchronize(d->pinned_done); /* the previous copy out of it has landed */
    if (d->pinned_size < n) {
        if (d->pinned) cudaFreeHost(d->pinned);
        d->pinned = NULL;
        d->pinned_size = 0;
        if (cudaMallocHost(&d->pinned, n) != cudaSuccess) {
            cudaGetLastError();
            d->pinned = NULL;
            return NULL;
        }
        d->pinned_size = n;
    }
    return d->pinned;
}

em_status cu_memcpy(void *dst, em_device ddev, const void *src, em_device sdev, size_t nbytes)
{
    if (nbytes == 0) return EM_OK;
    bool dcu = ddev.type == EM_CUDA, scu = sdev.type == EM_CUDA;
    if (!dcu && !scu) {
        memcpy(dst, src, nbytes);
        return EM_OK;
    }
    device_state *d = state(dcu ? ddev.index : sdev.index, "copy");
    if (!d) return em_last_status();
    if (dcu && scu) {
        if (ddev.index == sdev.index)
            return cu_check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, d->stream), "copy");
        /* across devices: both streams' earlier work first, then a peer copy */
        device_state *s = state(sdev.index, "copy");
        if (!s) return em_last_status();
        em_status st = cu_check(cudaStreamSynchronize(s->stream), "copy");
        if (!st) st = cu_check(cudaMemcpyPeerAsync(dst, ddev.index, src, sdev.index, nbytes, d->stream), "copy");
        return st;
    }
    if (dcu) { /* host -> device: through pinned memory, so this returns before it lands */
        void *stage = pinned(d, nbytes);
        if (!stage) /* no pinned memory: a plain synchronous copy */
            return cu_check(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice), "copy to device");
        memcpy(stage, src, nbytes);
        em_status st = cu_check(cudaMemcpyAsync(dst, stage, nbytes, cudaMemcpyHostToDevice, d->stream),
                                "copy to device");
        if (!st) st = cu_check(cudaEventRecord(d->pinned_done, d->stream), "copy to device");
        return st;
    }
    /* device -> host: after the work that writes src */
    em_status st = cu_check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, d->stream), "copy to host");
    if (!st) st = cu_check(cudaStreamSynchronize(d->stream), "copy to host");
    return st;
}

em_status cu_sync(int dev)
{
    device_state *d = state(dev, "synchronize");
    return d ? cu_check(cudaStreamSynchronize(d->stream), "synchronize") : em_last_status();
}

/* ---- public runtime API ---------------------------------------------------------- */

em_status em_cuda_device_info_of(int index, em_cuda_device_info *out)
{
    if (!out) return em_err(EM_ERR_ARG, "em_cuda_device_info_of: out is NULL");
    if (!state(index, "em_cuda_device_info_of")) return em_last_status();
    struct cudaDeviceProp p;
    em_status s = cu_check(cudaGetDeviceProperties(&p, index), "em_cuda_device_info_of");
    if (s) return s;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->multiprocessors = p.multiProcessorCount;
    out->total_memory = p.totalGlobalMem;
    return EM_OK;
}

void em_cuda_versions(int *driver, int *runtime, int *nccl)
{
    int v = 0;
    if (driver) *driver = cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
    v = 0;
    if (runtime) *runtime = cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
    cudaGetLastError();
    if (nccl) {
        *nccl = 0;
#if EM_HAVE_NCCL
        int nv = 0;
        if (ncclGetVersion(&nv) == ncclSuccess) *nccl = nv;
#endif
    }
}

em_status em_cuda_synchronize(int index) { return cu_sync(index); }

em_status em_cuda_memory_stats(int index, em_cuda_memory *out)
{
    if (!out) return em_err(EM_ERR_ARG, "em_cuda_memory_stats: out is NULL");
    if (index < 0 || index >= MAX_DEVICES || index >= em_cuda_device_count())
        return em_err(EM_ERR_DEVICE, "em_cuda_memory_stats: cuda:%d does not exist", index);
    pthread_mutex_lock(&lock);
    device_state *d = &devs[index];
    *out = (em_cuda_memory){.allocated = d->allocated,
                            .reserved = d->reserved,
                            .peak_allocated = d->peak,
                            .device_mallocs = d->mallocs,
                            .mapped = d->mapped,
                            .peak_mapped = d->peak_mapped,
                            .requested = d->requested};
    pthread_mutex_unlock(&lock);
    return EM_OK;
}

void em_cuda_reset_peak(int index)
{
    if (index < 0 || index >= MAX_DEVICES) return;
    pthread_mutex_lock(&lock);
    devs[index].peak = devs[index].allocated;
    devs[index].peak_mapped = devs[index].mapped;
    pthread_mutex_unlock(&lock);
}

void cu_note_mapped(int dev, int64_t delta)
{
    if (dev < 0 || dev >= MAX_DEVICES) return;
    pthread_mutex_lock(&lock);
    device_state *d = &devs[dev];
    d->mapped = (size_t)((int64_t)d->mapped + delta);
    if (d->mapped > d->peak_mapped) d->peak_mapped = d->mapped;
    pthread_mutex_unlock(&lock);
}

void em_cuda_empty_cache(int index)
{
    if (index < 0 || index >= MAX_DEVICES || !devs[index].ready) return;
    cudaSetDevice(index);
    cudaStreamSynchronize(devs[index].stream);
    cu_vrange_settle(index); /* the unmaps waiting for that work */
    pthread_mutex_lock(&lock);
    release_cached(&devs[index]);
    pthread_mutex_unlock(&lock);
}

void em_cuda_set_tf32(bool on) { tf32_on = on; }
bool em_cuda_tf32(void) { return tf32_on; }
