/* fiber.h — the smallest context switch the CUDA emulator needs: every GPU
 * thread of a block runs on its own fiber (its own stack and registers), and
 * the block's scheduler switches between them at barriers and warp
 * operations. Nothing here knows about CUDA; exec.c builds the execution
 * model on top.
 *
 * On x86-64 the switch is a few instructions of hand-written assembly (the
 * callee-saved registers, the stack pointer, MXCSR and the x87 control
 * word); elsewhere it falls back to <ucontext.h>. Stacks come from mmap with
 * an inaccessible guard page below them, so a fiber that overflows its
 * stack faults instead of corrupting a neighbour. Under AddressSanitizer
 * every switch is announced to it (__sanitizer_start/finish_switch_fiber).
 *
 * Not thread-safe: the emulator uses fibers only under cusim_lock. */
#ifndef EMBER_CUSIM_FIBER_H
#define EMBER_CUSIM_FIBER_H

#include <stddef.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

/* Bytes of stack per fiber (virtual: only the pages a thread touches cost memory). */
#define CUSIM_FIBER_STACK (256 * 1024)

typedef struct cusim_fiber {
#if defined(__x86_64__)
    void *sp; /* the saved stack pointer while the fiber is switched out */
#else
    ucontext_t uc;
#endif
    void *stack;       /* lowest usable byte of the stack (for an OS thread's own
                          stack: NULL, or what ASan told us) */
    size_t stack_size; /* usable bytes from stack */
    int owns_stack;    /* the stack is our mapping (cusim_fiber_prepare made it) */
    void (*entry)(void *arg);
    void *arg;
    void *asan_fake_stack; /* AddressSanitizer's fake stack while switched out */
} cusim_fiber;

/* Prepares f to run entry(arg) on its own stack the first time something
 * switches to it. The stack is f's own, kept across calls (so a fiber
 * struct reused for the next block reuses its stack); the first call maps
 * it. entry must never return: it ends by cusim_fiber_switch(..., 1).
 * 0, or -1 when the stack could not be mapped. */
int cusim_fiber_prepare(cusim_fiber *f, void (*entry)(void *arg), void *arg);

/* Saves the running context into from and resumes to. from may be a
 * zero-initialised cusim_fiber standing for the calling OS thread's own
 * stack. final: from will never be resumed (its entry has finished or
 * been abandoned), which AddressSanitizer needs to know. */
void cusim_fiber_switch(cusim_fiber *from, cusim_fiber *to, int final);

/* Unmaps f's stack (f can be prepared again afterwards). */
void cusim_fiber_release(cusim_fiber *f);

/* The usable stack range [lo, hi) of f (the hooks ignore accesses there). */
static inline char *cusim_fiber_stack_lo(const cusim_fiber *f) { return (char *)f->stack; }

#endif
