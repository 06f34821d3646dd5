/* runtime.c — the CUDA runtime API of ember's emulator (meson -Dcuda=sim):
 * set-up from the environment, devices, errors, and the kernel attributes
 * of cudaFuncSetAttribute. Streams, events and the queues of work they run
 * (launches included) are stream.c, device memory memory.c, copies and
 * memsets copy.c.
 *
 * A kernel that fails (cusim_exec != 0) makes its error sticky for the
 * process, as on a GPU: every later sync, launch and copy returns it,
 * cudaGetLastError cannot clear it, and queued work no longer runs. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cusim_impl.h"
#include "runtime_impl.h"

enum { DEFAULT_DYNAMIC_SMEM = 48 * 1024, MAX_DYNAMIC_SMEM = 227 * 1024 };

static pthread_mutex_t big_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int ndevices;
static size_t device_memory;
static int sticky; /* the first kernel failure; read and written atomically */
static _Thread_local int current;
static _Thread_local cudaError_t last_error;

typedef struct func_attr {
    const void *func;
    size_t max_dynamic_smem;
} func_attr;
static func_attr *funcs;
static size_t nfuncs, cap_funcs;

void cusim_lock(void) { pthread_mutex_lock(&big_lock); }
void cusim_unlock(void) { pthread_mutex_unlock(&big_lock); }

/* ---- set-up and errors --------------------------------------------------------------- */

/* the value of environment variable name: an integer with an optional
 * binary suffix (k, m, g, t) when sized; fallback when unset or malformed */
static unsigned long long env_number(const char *name, unsigned long long fallback, bool sized)
{
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    unsigned shift = 0;
    if (sized && *end) {
        const char *units = "kmgt", *u = strchr(units, *end | 0x20);
        if (u) {
            shift = 10 * (unsigned)(u - units + 1);
            end++;
        }
    }
    if (end == v || *end || (shift && n > (ULLONG_MAX >> shift))) {
        fprintf(stderr, "cusim: %s=%s is not a %s; using %llu\n", name, v, sized ? "size" : "number",
                fallback);
        return fallback;
    }
    return n << shift;
}

static void init(void)
{
    unsigned long long n = env_number("EMBER_CUSIM_DEVICES", 2, false);
    ndevices = n > CUSIM_MAX_DEVICES ? CUSIM_MAX_DEVICES : (int)n;
    device_memory = (size_t)env_number("EMBER_CUSIM_MEMORY", 8ull << 30, true);
    rt_init_streams();
}

cudaError_t rt_begin(void)
{
    pthread_once(&once, init);
    if (ndevices == 0) return rt_fail(cudaErrorNoDevice);
    return (cudaError_t)__atomic_load_n(&sticky, __ATOMIC_ACQUIRE);
}

void rt_init(void) { pthread_once(&once, init); }

cudaError_t rt_fail(cudaError_t e)
{
    if (e != cudaSuccess) last_error = e;
    return e;
}

size_t rt_device_memory(void) { return device_memory; }

void rt_set_sticky(int e)
{
    int none = 0;
    __atomic_compare_exchange_n(&sticky, &none, e, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

cudaError_t rt_sticky_error(void) { return (cudaError_t)__atomic_load_n(&sticky, __ATOMIC_ACQUIRE); }

/* the error codes this runtime knows: code, name, text (as CUDA's) */
#define ERR(code, text)                                                                                      \
    {                                                                                                        \
        code, #code, text                                                                                    \
    }
static const struct {
    cudaError_t code;
    const char *name, *text;
} errors[] = {
    ERR(cudaSuccess, "no error"),
    ERR(cudaErrorInvalidValue, "invalid argument"),
    ERR(cudaErrorMemoryAllocation, "out of memory"),
    ERR(cudaErrorInitializationError, "initialization error"),
    ERR(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    ERR(cudaErrorInvalidDevicePointer, "invalid device pointer"),
    ERR(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    ERR(cudaErrorMisalignedAddress, "misaligned address"),
    ERR(cudaErrorInvalidDevice, "invalid device ordinal"),
    ERR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    ERR(cudaErrorNotReady, "device not ready"),
    ERR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    ERR(cudaErrorLaunchOutOfResources, "too many resources requested for launch"),
    ERR(cudaErrorLaunchFailure, "unspecified launch failure"),
    ERR(cudaErrorInvalidDeviceFunction, "invalid device function"),
    ERR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    ERR(cudaErrorUnknown, "unknown error"),
};
#undef ERR

const char *cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == e) return errors[i].text;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e)
{
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == e) return errors[i].name;
    return "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t s = rt_sticky_error();
    if (s) return s;
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t s = rt_sticky_error();
    return s ? s : last_error;
}

/* ---- devices ------------------------------------------------------------------------- */

int cusim_device_count(void)
{
    pthread_once(&once, init);
    return ndevices;
}

int cusim_current_device(void) { return current; }

cudaError_t cudaGetDeviceCount(int *n)
{
    pthread_once(&once, init);
    if (!n) return rt_fail(cudaErrorInvalidValue);
    *n = ndevices;
    return ndevices ? cudaSuccess : rt_fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int dev)
{
    pthread_once(&once, init);
    if (dev < 0 || dev >= ndevices) return rt_fail(ndevices ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    current = dev;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev)
{
    pthread_once(&once, init);
    if (!dev) return rt_fail(cudaErrorInvalidValue);
    if (ndevices == 0) return rt_fail(cudaErrorNoDevice);
    *dev = current;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
    pthread_once(&once, init);
    if (!p) return rt_fail(cudaErrorInvalidValue);
    if (dev < 0 || dev >= ndevices) return rt_fail(ndevices ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "ember cusim sm_90 (emulated)");
    p->totalGlobalMem = device_memory;
    p->sharedMemPerBlock = DEFAULT_DYNAMIC_SMEM;
    p->sharedMemPerBlockOptin = MAX_DYNAMIC_SMEM;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = INT_MAX;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v) return rt_fail(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v) return rt_fail(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* ---- kernel attributes --------------------------------------------------------------- */

size_t rt_max_dynamic_smem(const void *func)
{
    for (size_t i = 0; i < nfuncs; i++)
        if (funcs[i].func == func) return funcs[i].max_dynamic_smem;
    return DEFAULT_DYNAMIC_SMEM;
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    pthread_once(&once, init);
    if (!func) return rt_fail(cudaErrorInvalidDeviceFunction);
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || value > MAX_DYNAMIC_SMEM) return rt_fail(cudaErrorInvalidValue);
        break;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        return value < -1 || value > 100 ? rt_fail(cudaErrorInvalidValue)
                                         : cudaSuccess; /* a hint: no effect */
    default: return rt_fail(cudaErrorInvalidValue);
    }
    cusim_lock();
    size_t i = 0;
    while (i < nfuncs && funcs[i].func != func) i++;
    if (i == nfuncs) {
        if (nfuncs == cap_funcs) {
            size_t cap = cap_funcs ? 2 * cap_funcs : 32;
            func_attr *grown = realloc(funcs, cap * sizeof *grown);
            if (!grown) {
                cusim_unlock();
                return rt_fail(cudaErrorMemoryAllocation);
            }
            funcs = grown;
            cap_funcs = cap;
        }
        funcs[nfuncs++].func = func;
    }
    funcs[i].max_dynamic_smem = (size_t)value;
    cusim_unlock();
    return cudaSuccess;
}
