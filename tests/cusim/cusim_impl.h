/* cusim_impl.h — how the pieces of ember's CUDA emulator talk to each other.
 *
 * The emulator lets the same .cu sources that nvcc builds for a GPU compile
 * with the host C++ compiler and run on the CPU (meson -Dcuda=sim). Its parts:
 *
 *   include/            the CUDA, cuBLAS and NCCL headers ember includes,
 *                       declaring just what ember uses (the real toolkit's
 *                       headers are not on the include path in this build)
 *   exec.c, fiber.c     the execution model: a block's threads as fibers,
 *                       barriers, warps, atomics, the sm_90 launch limits,
 *                       schedule fuzzing and the shared-memory race checker
 *   runtime.c, stream.c devices, device memory (guarded mappings, unreadable
 *   memory.c, copy.c    from host code), streams and events that run queued
 *   vmm.c               work only when something orders it, copies; reserved
 *                       address ranges with memory mapped into them
 *   cublas.c            the cuBLAS calls ember makes, argument rules checked,
 *                       computed in double
 *   nccl.c              the NCCL calls ember makes, across processes through
 *                       shared memory
 *
 * This header is C (runtime.c, cublas.c, nccl.c are C); the kernel side of
 * the emulator (include/cusim_device.h) is C++ and calls only what is here.
 * Every function is safe to call from any host thread: device work runs
 * under one process-wide lock (cusim_lock), on the thread that ordered it. */
#ifndef EMBER_CUSIM_IMPL_H
#define EMBER_CUSIM_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- a kernel launch (built by cusim::launch in include/cusim_device.h) ---- */
typedef struct cusim_launch {
    const void *func;     /* the kernel's address: its identity (attributes) */
    const char *name;     /* the kernel as the launch site spelled it, for reports */
    unsigned grid[3];     /* gridDim */
    unsigned block[3];    /* blockDim */
    size_t smem;          /* dynamic shared memory bytes */
    /* Runs the kernel body for the current thread (threadIdx etc. are set by
     * the executor before it calls this on the thread's fiber). */
    void (*run)(void *args);
    void *args;           /* the kernel's arguments, by value; owned by the launch */
    void (*free_args)(void *args);
    int device;           /* filled in by the runtime: the device it was launched on */
} cusim_launch;

/* ---- exec.c: the execution model ------------------------------------------ */

/* 0 (cudaSuccess) when l respects the sm_90 limits, else the cudaError_t a
 * GPU gives for it (cudaErrorInvalidConfiguration, ...), with a message for
 * cusim_last_message. max_dynamic_smem: what cudaFuncSetAttribute allowed
 * for l->func (48 KiB unless raised). */
int cusim_check_launch(const cusim_launch *l, size_t max_dynamic_smem);

/* Runs every block of l to completion now, on this thread (called by the
 * runtime with cusim_lock held and device memory accessible). 0, or
 * cudaErrorLaunchFailure after printing a report (barrier divergence, a
 * race, a bad warp mask, a trap). */
int cusim_exec(const cusim_launch *l);

/* The message of the last cusim_check_launch that failed on this thread
 * (a bad launch configuration is the caller's error, not a checker report,
 * so it does not go through cusim_report). */
const char *cusim_launch_error_message(void);

/* ---- exec.c / warp.c: what device code calls (include/cusim_device.h) ------
 * Valid only on a GPU thread of a running launch. */
typedef struct cusim_uint3 {
    unsigned x, y, z;
} cusim_uint3;
cusim_uint3 cusim_thread_idx(void);
cusim_uint3 cusim_block_idx(void);
cusim_uint3 cusim_block_dim(void);
cusim_uint3 cusim_grid_dim(void);
/* __syncthreads at file:line:column (the site identifies the barrier) */
void cusim_syncthreads(const char *file, int line, int column);
/* Warp operations: the lane waits until every lane of mask arrives at the
 * same operation, then gets its result (a shuffle's value bits, a vote). */
typedef enum {
    CUSIM_SYNCWARP,
    CUSIM_SHFL,      /* arg: source lane */
    CUSIM_SHFL_UP,   /* arg: delta */
    CUSIM_SHFL_DOWN, /* arg: delta */
    CUSIM_SHFL_XOR,  /* arg: lane mask */
    CUSIM_BALLOT,
    CUSIM_ANY,
    CUSIM_ALL
} cusim_warp_kind;
uint64_t cusim_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width, const char *file, int line,
                       int column);
unsigned cusim_activemask(void);
/* atomic op on the type at p: old value returned (bits in the low bytes) */
typedef enum { CUSIM_AT_ADD, CUSIM_AT_SUB, CUSIM_AT_MAX, CUSIM_AT_MIN, CUSIM_AT_EXCH, CUSIM_AT_CAS } cusim_atomic_op;
typedef enum { CUSIM_AT_I32, CUSIM_AT_U32, CUSIM_AT_I64, CUSIM_AT_U64, CUSIM_AT_F32, CUSIM_AT_F64 } cusim_atomic_type;
uint64_t cusim_atomic(int op, int type, void *p, uint64_t a, uint64_t b);
/* this block's dynamic shared memory (16-byte aligned) */
void *cusim_dynamic_shared(void);
/* __trap(): reported, and the launch fails */
__attribute__((noreturn)) void cusim_trap(const char *file, int line);
/* memcpy that the race checker does not see (a launch's argument copy) */
void cusim_copy_args(void *dst, const void *src, size_t n);

/* ---- runtime.c: what exec.c and nccl.c need of it ------------------------- */

/* The process-wide lock device work runs under (recursive). */
void cusim_lock(void);
void cusim_unlock(void);

/* What an address is to the emulator: in a live device allocation
 * (CUSIM_MEM_DEVICE, with the allocation's base, size and device; for
 * memory mapped into a reserved range (vmm.c), the run of adjacent
 * accessible mappings around it), in the guard zone around one, in a
 * freed one or in an unmapped part of a reserved range (CUSIM_MEM_INVALID,
 * with the nearest allocation, or the whole reserved range), or anything
 * else (CUSIM_MEM_OTHER). */
typedef enum { CUSIM_MEM_OTHER, CUSIM_MEM_DEVICE, CUSIM_MEM_INVALID } cusim_mem_kind;
typedef struct cusim_alloc_info {
    void *base;
    size_t size;
    int device;
    bool freed;    /* CUSIM_MEM_INVALID: that allocation was freed (use after free) */
    bool unmapped; /* CUSIM_MEM_INVALID: base is a reserved range, the access touches a part of it
                      with nothing mapped (or mapped without access) */
} cusim_alloc_info;
cusim_mem_kind cusim_mem_lookup(const void *p, size_t n, cusim_alloc_info *info);

/* Calls fn for every live device allocation (base, size, device), lowest
 * address first, then every accessible mapping in a reserved range. */
void cusim_mem_foreach(void (*fn)(void *ctx, void *base, size_t size, int device), void *ctx);

/* Queues l on stream s (NULL: the current device's default stream); the
 * runtime owns l from here (frees args with free_args, then l with free()).
 * Checks the launch first: an invalid launch is not queued and its error is
 * what cudaGetLastError returns next. Returns that error or 0. */
int cusim_launch_kernel(cusim_launch *l, void *stream);

/* Runs everything stream s has queued so far (and whatever that waits for);
 * NULL: the current device's default stream. 0 or the sticky error. */
int cusim_stream_drain(void *stream);

/* Queues fn(ctx) on stream s, to run in stream order (nccl.c publishes a
 * collective's result this way); fn runs with device memory accessible.
 * free_ctx(ctx) afterwards (may be NULL). 0 or an error; ctx is the
 * runtime's either way (on an error free_ctx(ctx) has already run). */
int cusim_enqueue_host_fn(void *stream, void (*fn)(void *ctx), void *ctx, void (*free_ctx)(void *ctx));

/* The device the calling host thread has current (cudaSetDevice), and how
 * many emulated devices there are (EMBER_CUSIM_DEVICES, default 2). */
int cusim_current_device(void);
int cusim_device_count(void);

/* Makes device memory readable and writable (depth-counted) for emulator
 * code that touches it outside a queued item; cusim_mem_close undoes it. */
void cusim_mem_open(void);
void cusim_mem_close(void);

/* ---- reports (shared by every part) --------------------------------------- */

/* Prints "cusim: <message>" on stderr, counts it, keeps it for
 * cusim_last_message, and aborts the process when EMBER_CUSIM_FATAL=1. */
void cusim_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* How many reports so far, and the text of the last (tests of the checkers). */
int cusim_report_count(void);
const char *cusim_last_message(void);

#ifdef __cplusplus
}
#endif
#endif
