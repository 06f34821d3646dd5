/* fiber.c — the context switch behind the emulator's GPU threads (see
 * fiber.h): mmap'd stacks with a guard page, a hand-written x86-64 switch
 * (a ucontext fallback elsewhere), and the AddressSanitizer annotations
 * that keep ASan's view of "the current stack" right across switches. */
#include "fiber.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define CUSIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUSIM_ASAN 1
#endif
#endif

#ifdef CUSIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* The fiber we are switching away from, read by the fiber we arrive in
 * (only ASan needs it: it tells us the stack bounds of where we came from). */
static __thread cusim_fiber *switched_from;

/* Runs in the fiber we have just arrived in, right after a switch. */
static void arrived(cusim_fiber *self)
{
#ifdef CUSIM_ASAN
    const void *bottom = NULL;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(self->asan_fake_stack, &bottom, &size);
    /* the first switch away from an OS thread's own stack is how we learn
     * its bounds, which ASan needs when we switch back to it */
    cusim_fiber *from = switched_from;
    if (from && !from->owns_stack) {
        from->stack = (void *)bottom;
        from->stack_size = size;
    }
#else
    (void)self;
#endif
}

/* Every fiber starts here, on its own stack. */
static void fiber_main(cusim_fiber *f)
{
    arrived(f);
    f->entry(f->arg);
    abort(); /* entry must switch away for good instead of returning */
}

#if defined(__x86_64__)

/* cusim_fiber_swap_x86(void **save_sp, void *new_sp): pushes the callee-saved
 * registers and the MXCSR / x87 control words, saves rsp in *save_sp, and
 * pops the same from new_sp. A new fiber's stack is laid out as if it had
 * been switched out just before cusim_fiber_start_x86, which calls
 * fiber_main (r12) with the fiber (r13). */
__asm__(".text\n"
        ".globl cusim_fiber_swap_x86\n"
        ".hidden cusim_fiber_swap_x86\n"
        ".type cusim_fiber_swap_x86,@function\n"
        "cusim_fiber_swap_x86:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsp, %rax\n"
        "    movq %rsi, %rsp\n"
        /* loading the control words is slow: only when they differ */
        "    movl (%rax), %ecx\n"
        "    cmpl (%rsp), %ecx\n"
        "    je 1f\n"
        "    ldmxcsr (%rsp)\n"
        "1:  movw 4(%rax), %cx\n"
        "    cmpw 4(%rsp), %cx\n"
        "    je 2f\n"
        "    fldcw 4(%rsp)\n"
        "2:  addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size cusim_fiber_swap_x86, .-cusim_fiber_swap_x86\n"
        ".globl cusim_fiber_start_x86\n"
        ".hidden cusim_fiber_start_x86\n"
        ".type cusim_fiber_start_x86,@function\n"
        "cusim_fiber_start_x86:\n"
        "    movq %r13, %rdi\n"
        "    xorl %ebp, %ebp\n"
        "    callq *%r12\n"
        "    ud2\n"
        ".size cusim_fiber_start_x86, .-cusim_fiber_start_x86\n");

void cusim_fiber_swap_x86(void **save_sp, void *new_sp);
void cusim_fiber_start_x86(void);

static void init_context(cusim_fiber *f)
{
    uint32_t mxcsr;
    uint16_t fcw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fcw));
    /* the frame cusim_fiber_swap_x86 pops: control words, r15, r14, r13,
     * r12, rbx, rbp, return address; 16-byte aligned so that the call in
     * cusim_fiber_start_x86 sees the ABI's alignment */
    uint64_t *sp = (uint64_t *)((char *)f->stack + f->stack_size - 80);
    sp[0] = mxcsr | (uint64_t)fcw << 32;
    sp[1] = sp[2] = 0;                       /* r15, r14 */
    sp[3] = (uint64_t)(uintptr_t)f;          /* r13: fiber_main's argument */
    sp[4] = (uint64_t)(uintptr_t)fiber_main; /* r12 */
    sp[5] = sp[6] = 0;                       /* rbx, rbp */
    sp[7] = (uint64_t)(uintptr_t)cusim_fiber_start_x86;
    sp[8] = sp[9] = 0;
    f->sp = sp;
}

static void swap_context(cusim_fiber *from, cusim_fiber *to) { cusim_fiber_swap_x86(&from->sp, to->sp); }

#else /* ucontext: slower (it saves the signal mask with a system call), but portable */

static void fiber_main_uc(unsigned hi, unsigned lo)
{
    fiber_main((cusim_fiber *)(uintptr_t)((uint64_t)hi << 32 | lo));
}

static void init_context(cusim_fiber *f)
{
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->stack_size;
    f->uc.uc_link = NULL;
    uint64_t p = (uint64_t)(uintptr_t)f;
    makecontext(&f->uc, (void (*)(void))fiber_main_uc, 2, (unsigned)(p >> 32), (unsigned)p);
}

static void swap_context(cusim_fiber *from, cusim_fiber *to) { swapcontext(&from->uc, &to->uc); }

#endif

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

int cusim_fiber_prepare(cusim_fiber *f, void (*entry)(void *arg), void *arg)
{
    if (!f->owns_stack) {
        size_t page = page_size();
        char *base = mmap(NULL, CUSIM_FIBER_STACK + page, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) return -1;
        if (mprotect(base, page, PROT_NONE) != 0) { /* the guard page below the stack */
            munmap(base, CUSIM_FIBER_STACK + page);
            return -1;
        }
        f->stack = base + page;
        f->stack_size = CUSIM_FIBER_STACK;
        f->owns_stack = 1;
    }
#ifdef CUSIM_ASAN
    /* A finished or abandoned (trapped) thread may have left its frames'
     * redzones poisoned. Frames live at the top of the stack (a GPU thread's
     * are small), so the top 32 KiB is cleared: all 256 KiB at every block
     * was a third of an ASan build's emulator time, in memset of shadow. */
    size_t top = f->stack_size < (32u << 10) ? f->stack_size : (32u << 10);
    ASAN_UNPOISON_MEMORY_REGION((char *)f->stack + f->stack_size - top, top);
#endif
    f->entry = entry;
    f->arg = arg;
    f->asan_fake_stack = NULL;
    init_context(f);
    return 0;
}

void cusim_fiber_switch(cusim_fiber *from, cusim_fiber *to, int final)
{
#ifdef CUSIM_ASAN
    __sanitizer_start_switch_fiber(final ? NULL : &from->asan_fake_stack, to->stack, to->stack_size);
#else
    (void) final;
#endif
    switched_from = from;
    swap_context(from, to);
    arrived(from); /* from is running again */
}

void cusim_fiber_release(cusim_fiber *f)
{
    if (!f->owns_stack) return;
    size_t page = page_size();
    munmap((char *)f->stack - page, f->stack_size + page);
    f->stack = NULL;
    f->stack_size = 0;
    f->owns_stack = 0;
}
