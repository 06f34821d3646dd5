/* exec_impl.h — the state the execution model's files share: exec.c (the
 * launch, blocks, the scheduler, barriers, schedule comparison), warp.c
 * (warp operations, atomics and the other calls device code makes),
 * memcheck.c (what an access from a kernel touches: bounds, device, the
 * shared-memory race shadow, snapshots for the schedule comparison) and
 * hooks.c (the ThreadSanitizer instrumentation ABI that feeds memcheck.c).
 *
 * Everything runs under cusim_lock on the OS thread that runs the launch:
 * one launch at a time, one block at a time, one GPU thread (fiber) at a
 * time. The only thread-local is cusim_cur, so that the hooks can tell a
 * kernel's accesses from host code's in the same translation unit. */
#ifndef EMBER_CUSIM_EXEC_IMPL_H
#define EMBER_CUSIM_EXEC_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "cusim_impl.h"
#include "fiber.h"

#define CUSIM_MAX_THREADS 1024
#define CUSIM_WARP 32
#define CUSIM_MAX_WARPS (CUSIM_MAX_THREADS / CUSIM_WARP)
#define CUSIM_MAX_DYNAMIC_SMEM 232448u /* 227 KiB: sm_90's opt-in limit */

typedef enum {
    CUSIM_T_RUNNABLE,
    CUSIM_T_BARRIER, /* waiting in __syncthreads */
    CUSIM_T_WARP,    /* waiting in a warp operation */
    CUSIM_T_EXITED,
    CUSIM_T_STOPPED /* abandoned: the launch was aborted while it ran */
} cusim_tstate;

/* One GPU thread of the running block. */
typedef struct cusim_thread {
    cusim_fiber fiber;
    cusim_uint3 idx; /* threadIdx */
    unsigned tid;    /* linear index in the block, x fastest */
    unsigned warp, lane;
    cusim_tstate state;
    const char *file; /* where it waits (barrier or warp op), for reports */
    int line, column;
    int op;          /* the warp op it waits in (cusim_warp_kind) */
    uint64_t value;  /* its operand of that op */
    int arg;         /* source lane / delta / lane mask of a shuffle */
    uint64_t result; /* what the op gave it */
} cusim_thread;

/* A warp operation some lanes wait in: it completes when every lane of
 * mask has arrived. */
typedef struct cusim_warp_pending {
    unsigned mask, arrived;
    int op, width;
} cusim_warp_pending;

typedef struct cusim_warp {
    unsigned lanes; /* lanes that exist (a partial last warp has fewer) */
    unsigned live;  /* lanes that have not exited */
    int npending;
    cusim_warp_pending pending[CUSIM_WARP];
    /* per-lane count of warp synchronisations (racecheck's order within a
     * warp): a completed op sets every member lane to max + 1 */
    uint16_t clock[CUSIM_WARP];
} cusim_warp;

/* The launch being run (one at a time). */
typedef struct cusim_exec_state {
    const cusim_launch *l;
    cusim_uint3 block_idx;
    unsigned nthreads, nwarps;
    cusim_thread *threads; /* CUSIM_MAX_THREADS, fibers and stacks kept across launches */
    cusim_warp warps[CUSIM_MAX_WARPS];
    cusim_fiber sched;                      /* the scheduler: the OS thread's own stack */
    uint64_t ready[CUSIM_MAX_THREADS / 64]; /* threads runnable in the next round */
    unsigned live, arrived;                 /* threads not exited; of them, waiting at the barrier */
    bool failed;                            /* the launch fails (something was reported) */
    bool aborted;                           /* stop running it now */
    bool reported_exit;                     /* "exited while others wait" said once per launch */
    bool reported_divergence;
    bool reported_race;
    bool fp_atomics; /* a floating-point atomic ran (the schedule comparison is skipped) */
    bool racecheck;
    uint32_t epoch;   /* barrier interval; racecheck's shadow is valid within one */
    char *dyn;        /* this block's dynamic shared memory (l->smem bytes) */
    char *dyn_region; /* dyn with redzones around it: [dyn_region, dyn_region + CUSIM_DYN_REGION) */
} cusim_exec_state;

/* dynamic shared memory sits at dyn_region + CUSIM_DYN_REDZONE; an access
 * elsewhere in the region is out of bounds */
#define CUSIM_DYN_REDZONE 4096u
#define CUSIM_DYN_REGION (CUSIM_DYN_REDZONE + CUSIM_MAX_DYNAMIC_SMEM + CUSIM_DYN_REDZONE)

extern cusim_exec_state cusim_ex;
/* The GPU thread running now; NULL on host code (the scheduler included). */
extern __thread cusim_thread *cusim_cur __attribute__((tls_model("initial-exec")));

/* exec.c */
/* "kernel K block (x,y,z) thread (x,y,z)" of t, into buf. */
const char *cusim_who(const cusim_thread *t, char *buf, size_t n);
/* Ends the launch now: marks it failed and abandons the running thread
 * (call after reporting). */
__attribute__((noreturn)) void cusim_abort_launch(void);
/* The running thread waits (its state says for what): back to the scheduler. */
void cusim_block_current(void);
/* Makes t runnable in the next round. */
void cusim_wake(cusim_thread *t);

/* warp.c */
void cusim_warps_begin_block(void);
/* t exits: a pending warp op that names it can never complete (reported). */
void cusim_warps_thread_exits(cusim_thread *t);
/* A line saying where t waits, for a deadlock report. */
const char *cusim_wait_text(const cusim_thread *t, char *buf, size_t n);

/* memcheck.c */
enum { CUSIM_READ = 1, CUSIM_WRITE = 2, CUSIM_ATOMIC = 4 };
/* An access by the running thread to [p, p+n) that is not on its stack:
 * checked (a bad one is reported and ends the launch) and recorded. */
void cusim_access(const void *p, size_t n, int kind);
/* Reports an n-byte access at p that is not n-byte aligned and ends the launch. */
__attribute__((noreturn)) void cusim_misaligned(const void *p, size_t n, int kind);
void cusim_mem_begin_launch(void);
void cusim_mem_new_epoch(void); /* a barrier: shared-memory accesses before it are ordered */
/* Schedule comparison: from cusim_snap_begin on, the first write to each
 * device allocation saves its contents first. */
void cusim_snap_begin(void);
/* After the first run: keeps what it produced and puts back the before;
 * -1 (nothing changed) when the copies would pass EMBER_CUSIM_COMPARE_MAX_MIB
 * or memory ran out: the launch is then not compared. */
int cusim_snap_rewind(void);
/* After the second run: 0 when both runs left the same bytes, else reports
 * the first difference and returns -1. Ends tracking and frees the copies. */
int cusim_snap_compare(void);
void cusim_snap_end(void);

#endif
