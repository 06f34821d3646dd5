/* runtime_impl.h — what the emulator's runtime files share beyond
 * cusim_impl.h: runtime.c (set-up, devices, errors), stream.c (streams,
 * events, their queues, launches), memory.c (device and pinned memory,
 * protection, fault messages), copy.c and cublas.c.
 * Internal to tests/cusim; nothing outside includes it. */
#ifndef EMBER_CUSIM_RUNTIME_IMPL_H
#define EMBER_CUSIM_RUNTIME_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime_api.h"
#include "cusim_impl.h"

/* at most this many emulated devices (EMBER_CUSIM_DEVICES is clamped to it) */
enum { CUSIM_MAX_DEVICES = 16 };

/* ---- runtime.c ------------------------------------------------------------- */

/* Sets the emulator up on first use (environment, default streams);
 * returns the sticky error (a kernel failed earlier) or cudaSuccess. Every
 * API entry point that does device work calls it first. */
cudaError_t rt_begin(void);

/* Records e as the calling thread's last error (what cudaGetLastError
 * returns next) unless it is cudaSuccess; returns e. */
cudaError_t rt_fail(cudaError_t e);

/* Sets the emulator up on first use (environment, default streams), as
 * rt_begin does, for the calls that need no device (destroying a handle). */
void rt_init(void);

/* Bytes of memory each emulated device has (EMBER_CUSIM_MEMORY). */
size_t rt_device_memory(void);

/* The sticky error: cudaSuccess until a kernel fails, then that failure
 * for the rest of the process (rt_set_sticky keeps the first one). */
cudaError_t rt_sticky_error(void);
void rt_set_sticky(int e);

/* The most dynamic shared memory a launch of func may ask for: 48 KiB
 * unless cudaFuncSetAttribute raised it (lock held). */
size_t rt_max_dynamic_smem(const void *func);

/* ---- stream.c -------------------------------------------------------------- */

/* Sets up every device's legacy default stream (called once, by the
 * set-up of runtime.c). */
void rt_init_streams(void);

/* Runs everything queued on every stream of dev (every device: dev < 0). */
void rt_drain_device(int dev);

/* The queue of a stream. With cusim_lock held: */
typedef struct CUstream_st rt_stream;
/* s as a live stream (NULL: the current device's default stream), or NULL
 * after reporting that it is not one (api names the caller) */
rt_stream *rt_get_stream(cudaStream_t s, const char *api);
/* queue a copy of n bytes from staging (if not NULL, then owned by the
 * queue) or else src / a memset; return the item's place for rt_drain, 0
 * when out of memory */
uint64_t rt_queue_copy(rt_stream *s, const char *api, void *dst, const void *src, size_t n, void *staging);
uint64_t rt_queue_memset(rt_stream *s, const char *api, void *dst, int value, size_t n);
/* runs s up to place seq; the sticky error or cudaSuccess */
cudaError_t rt_drain(rt_stream *s, uint64_t seq);

/* The device stream s belongs to (NULL: the current device's default
 * stream), or -1 when s is not a live stream. */
int rt_stream_device(void *stream);

/* ---- memory.c -------------------------------------------------------------- */

/* true when [p, p+n) lies inside one block from cudaMallocHost */
bool mem_pinned(const void *p, size_t n);

/* Device memory charged to dev (lock held): false when n more bytes would
 * pass what it has (EMBER_CUSIM_MEMORY); mem_uncharge gives them back. */
bool mem_charge(int dev, size_t n);
void mem_uncharge(int dev, size_t n);
/* [p, p+n) (whole pages of a mapping) accessible to device work or not,
 * under the protection in force (memory.c's comment); 0 or -1. */
int mem_protect(void *p, size_t n, bool accessible);
/* The fault handler that names what was touched, installed once (lock held). */
void mem_install_handler(void);

/* Names the device work the calling thread runs now ("kernel foo",
 * "cudaMemcpyAsync"), for the message of a fault inside it; NULL: none.
 * Returns the name it replaces (work can nest: restore it afterwards). */
const char *mem_activity(const char *what);

/* ---- vmm.c: reserved ranges and what is mapped in them ------------------------ */

/* cusim_mem_lookup's answer for [p, p+n) when it touches a reserved range
 * (lock held); CUSIM_MEM_OTHER when it does not. */
cusim_mem_kind vmm_lookup(const void *p, size_t n, cusim_alloc_info *info);
/* cusim_mem_foreach's part: every accessible mapping (lock held). */
void vmm_foreach(void (*fn)(void *ctx, void *base, size_t size, int device), void *ctx);
/* The fault handler's part, for a fault at a (no lock: the process is about
 * to die, or device work touches a mapping first under lazy mprotect):
 * -1 when a is not in a reserved range; 0 when the access may resume (lazy:
 * the mapping was opened for device work); 1 with msg filled (the handler
 * prints it and aborts). */
int vmm_fault(const char *a, bool device_work, const char *activity, bool lazy, char *msg, size_t cap);
/* PROTECT_MPROTECT, the last thread closing device memory: every mapping
 * opened since is protected again (lock held). */
void vmm_close(void);

#endif
