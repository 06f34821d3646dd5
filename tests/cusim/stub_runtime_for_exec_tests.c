/* stub_runtime_for_exec_tests.c — NOT part of the emulator's build: a
 * throwaway stand-in for runtime.c so that the execution model (exec.c,
 * warp.c, memcheck.c, hooks.c, fiber.c) can be tested on its own by
 * selftest_exec.cu. Device memory is malloc'd with a guard zone on each
 * side, tracked in a table (freed entries kept, so a freed pointer is
 * "invalid"); a launch is checked and run at once; one device, no streams. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "cusim_impl.h"

#define GUARD 256
#define MAXALLOC 4096

static struct {
    char *base;
    size_t size;
    bool freed;
} allocs[MAXALLOC];
static int nallocs;

static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
void cusim_lock(void) { pthread_mutex_lock(&lock); }
void cusim_unlock(void) { pthread_mutex_unlock(&lock); }

cusim_mem_kind cusim_mem_lookup(const void *p, size_t n, cusim_alloc_info *info)
{
    const char *c = p;
    memset(info, 0, sizeof *info);
    for (int i = 0; i < nallocs; i++) {
        char *b = allocs[i].base;
        if (c >= b - GUARD && c < b + allocs[i].size + GUARD) {
            info->base = b;
            info->size = allocs[i].size;
            info->device = 0;
            if (!allocs[i].freed && c >= b && c + n <= b + allocs[i].size) return CUSIM_MEM_DEVICE;
            return CUSIM_MEM_INVALID;
        }
    }
    return CUSIM_MEM_OTHER;
}

void cusim_mem_foreach(void (*fn)(void *ctx, void *base, size_t size, int device), void *ctx)
{
    for (int i = 0; i < nallocs; i++)
        if (!allocs[i].freed) fn(ctx, allocs[i].base, allocs[i].size, 0);
}

static struct {
    const void *func;
    int max_smem;
} attrs[64];
static int nattrs;
static cudaError_t last_error;

int cusim_launch_kernel(cusim_launch *l, void *stream)
{
    (void)stream;
    size_t max = 48 * 1024;
    for (int i = 0; i < nattrs; i++)
        if (attrs[i].func == l->func) max = (size_t)attrs[i].max_smem;
    l->device = 0;
    int rc = cusim_check_launch(l, max);
    if (rc == 0) {
        cusim_lock();
        rc = cusim_exec(l);
        cusim_unlock();
    } else {
        fprintf(stderr, "(stub runtime: launch refused: %s)\n", cusim_launch_error_message());
    }
    l->free_args(l->args);
    free(l);
    last_error = (cudaError_t)rc;
    return rc;
}

int cusim_stream_drain(void *stream)
{
    (void)stream;
    return 0;
}

int cusim_enqueue_host_fn(void *stream, void (*fn)(void *ctx), void *ctx, void (*free_ctx)(void *ctx))
{
    (void)stream;
    fn(ctx);
    if (free_ctx) free_ctx(ctx);
    return 0;
}

int cusim_current_device(void) { return 0; }
int cusim_device_count(void) { return 1; }
void cusim_mem_open(void) {}
void cusim_mem_close(void) {}

cudaError_t cudaMalloc(void **p, size_t n)
{
    if (nallocs == MAXALLOC) return cudaErrorMemoryAllocation;
    char *m = malloc(n + 2 * GUARD);
    if (!m) return cudaErrorMemoryAllocation;
    memset(m, 0xbe, n + 2 * GUARD);
    allocs[nallocs].base = m + GUARD;
    allocs[nallocs].size = n;
    allocs[nallocs].freed = false;
    *p = allocs[nallocs++].base;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].base == p && !allocs[i].freed) {
            allocs[i].freed = true; /* kept (never reused) so that later accesses are "freed" */
            return cudaSuccess;
        }
    return cudaErrorInvalidDevicePointer;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    (void)kind;
    memcpy(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (value < 0 || value > 232448) return cudaErrorInvalidValue;
    for (int i = 0; i < nattrs; i++)
        if (attrs[i].func == func) {
            attrs[i].max_smem = value;
            return cudaSuccess;
        }
    if (nattrs == 64) return cudaErrorMemoryAllocation;
    attrs[nattrs].func = func;
    attrs[nattrs++].max_smem = value;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "other error";
    }
}
