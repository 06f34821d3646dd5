/* copy.c — the emulator's copies and memsets (cudaMemcpy*, cudaMemset*):
 * the arguments checked (ranges inside one live allocation, the direction
 * matching the memory), then queued on their stream (runtime.c runs them).
 *
 * When a copy touches host memory (as CUDA's API synchronization behaviour
 * describes):
 *   host -> device   pinned source: read when the copy runs (later!);
 *                    pageable source: staged at the call
 *   device -> host   pinned destination: written when the copy runs, so a
 *                    host read before the sync sees the old data;
 *                    pageable destination: the copy completes before the
 *                    call returns
 *   host -> host     completes before the call returns
 *   cudaMemcpy       (blocking) runs the current device's default stream
 *                    through the copy before returning
 *   cudaMemset       queued on the default stream (asynchronous, as CUDA's
 *                    is for device memory) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cusim_impl.h"
#include "runtime_impl.h"

/* whether [p, p+n) is device memory (one live allocation; *dev its
 * device) or host memory; false after reporting when it is neither (it
 * touches a guard zone or a freed allocation) */
static bool classify(const char *api, const char *role, const void *p, size_t n, bool *device, int *dev)
{
    cusim_alloc_info a;
    switch (cusim_mem_lookup(p, n, &a)) {
    case CUSIM_MEM_DEVICE:
        *device = true;
        if (dev) *dev = a.device;
        return true;
    case CUSIM_MEM_OTHER: *device = false; return true;
    case CUSIM_MEM_INVALID: break;
    }
    const char *c = p, *base = a.base;
    if (a.unmapped)
        cusim_report(
            "%s: the %s (%zu bytes at %p) touches an unmapped part of the %zu-byte range reserved at %p", api,
            role, n, p, a.size, a.base);
    else if (a.freed)
        cusim_report(
            "%s: the %s (%zu bytes at %p) is in a %zu-byte allocation at %p on cuda:%d that was freed", api,
            role, n, p, a.size, a.base, a.device);
    else if (c < base)
        cusim_report(
            "%s: the %s (%zu bytes at %p) starts %zu bytes before a %zu-byte allocation at %p on cuda:%d",
            api, role, n, p, (size_t)(base - c), a.size, a.base, a.device);
    else
        cusim_report(
            "%s: the %s (%zu bytes at %p) runs %zu bytes past the end of a %zu-byte allocation at %p on "
            "cuda:%d",
            api, role, n, p, (size_t)(c + n - (base + a.size)), a.size, a.base, a.device);
    return false;
}

static const char *kind_name(cudaMemcpyKind k)
{
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
    }
    return "an unknown cudaMemcpyKind";
}

/* queues a copy of n bytes on s (lock held), then waits for it when
 * `blocking` or when CUDA would: into pageable host memory, host to host */
static cudaError_t copy_on(const char *api, rt_stream *s, void *dst, const void *src, size_t n,
                           cudaMemcpyKind kind, bool blocking)
{
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
    if (n == 0) return cudaSuccess;
    if (!dst || !src) {
        cusim_report("%s: %s pointer is NULL", api, dst ? "the source" : "the destination");
        return cudaErrorInvalidValue;
    }
    bool ddev, sdev;
    if (!classify(api, "destination", dst, n, &ddev, NULL) || !classify(api, "source", src, n, &sdev, NULL))
        return cudaErrorInvalidValue;
    if (kind != cudaMemcpyDefault) {
        bool want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        bool want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        if (ddev != want_d || sdev != want_s) {
            cusim_report("%s: %s, but the destination %p is %s memory and the source %p is %s memory", api,
                         kind_name(kind), dst, ddev ? "device" : "host", src, sdev ? "device" : "host");
            return cudaErrorInvalidValue;
        }
    }
    void *staging = NULL;
    if (ddev && !sdev && !blocking && !mem_pinned(src, n)) { /* pageable source: staged now */
        if (!(staging = malloc(n))) return cudaErrorMemoryAllocation;
        memcpy(staging, src, n);
    }
    bool wait = blocking || !ddev;
    if (sdev && !ddev && mem_pinned(dst, n)) wait = blocking; /* lands in pinned memory when it runs */
    uint64_t seq = rt_queue_copy(s, api, dst, src, n, staging);
    if (!seq) {
        free(staging);
        return cudaErrorMemoryAllocation;
    }
    return wait ? rt_drain(s, seq) : cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    cusim_lock();
    rt_stream *st = rt_get_stream(s, "cudaMemcpyAsync");
    e = st ? copy_on("cudaMemcpyAsync", st, dst, src, n, kind, false) : cudaErrorInvalidResourceHandle;
    cusim_unlock();
    return rt_fail(e);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    cusim_lock();
    e = copy_on("cudaMemcpy", rt_get_stream(NULL, ""), dst, src, n, kind, true);
    cusim_unlock();
    return rt_fail(e);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int ddev, const void *src, int sdev, size_t n, cudaStream_t s)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    if (ddev < 0 || ddev >= cusim_device_count() || sdev < 0 || sdev >= cusim_device_count())
        return rt_fail(cudaErrorInvalidDevice);
    if (n == 0) return cudaSuccess;
    cusim_lock();
    const char *api = "cudaMemcpyPeerAsync";
    rt_stream *st = rt_get_stream(s, api);
    bool dd = false, sd = false;
    int dgot = -1, sgot = -1;
    if (!st)
        e = cudaErrorInvalidResourceHandle;
    else if (!dst || !src || !classify(api, "destination", dst, n, &dd, &dgot) ||
             !classify(api, "source", src, n, &sd, &sgot))
        e = cudaErrorInvalidValue;
    else if (!dd || dgot != ddev || !sd || sgot != sdev) {
        cusim_report(
            "%s: the destination %p is not memory of cuda:%d or the source %p is not memory of cuda:%d", api,
            dst, ddev, src, sdev);
        e = cudaErrorInvalidValue;
    } else {
        e = copy_on(api, st, dst, src, n, cudaMemcpyDeviceToDevice, false);
    }
    cusim_unlock();
    return rt_fail(e);
}

static cudaError_t memset_on(const char *api, rt_stream *s, void *p, int v, size_t n)
{
    if (n == 0) return cudaSuccess;
    bool dev;
    if (!p || !classify(api, "destination", p, n, &dev, NULL)) return cudaErrorInvalidValue;
    if (!dev) {
        cusim_report("%s: %p is not device memory", api, p);
        return cudaErrorInvalidValue;
    }
    return rt_queue_memset(s, api, p, v, n) ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    cusim_lock();
    rt_stream *st = rt_get_stream(s, "cudaMemsetAsync");
    e = st ? memset_on("cudaMemsetAsync", st, p, v, n) : cudaErrorInvalidResourceHandle;
    cusim_unlock();
    return rt_fail(e);
}

/* like CUDA's, asynchronous with respect to the host for device memory */
cudaError_t cudaMemset(void *p, int v, size_t n)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    cusim_lock();
    e = memset_on("cudaMemset", rt_get_stream(NULL, ""), p, v, n);
    cusim_unlock();
    return rt_fail(e);
}
