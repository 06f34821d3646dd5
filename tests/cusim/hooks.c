/* hooks.c — the emulator's own implementation of ThreadSanitizer's
 * instrumentation ABI. Kernel translation units are compiled with
 * -fsanitize=thread but not linked against libtsan: the compiler's calls
 * before every load and store (__tsan_read4, __tsan_write8, ...) land here
 * instead, and hand kernel code's accesses to the memory checker
 * (memcheck.c). On host code, and on a GPU thread's own stack (its locals),
 * they return at once.
 *
 * This file must NOT be compiled with -fsanitize=thread (it would call
 * itself). The __tsan_atomic* entry points perform the atomic operation
 * the compiler replaced, as libtsan would. */
#include <stdint.h>
#include <string.h>

#include "exec_impl.h"

static inline void check(const void *p, size_t n, int kind)
{
    const cusim_thread *t = cusim_cur;
    if (!t) return;
    if ((uintptr_t)p - (uintptr_t)t->fiber.stack < t->fiber.stack_size) return;
    cusim_access(p, n, kind);
}

/* An N-byte access through an ordinary pointer (not one the compiler
 * marked as possibly unaligned) must be N-byte aligned, as on a GPU, where
 * a float4 load from a float* that is not 16-byte aligned faults
 * (cudaErrorMisalignedAddress). The kernels are built without the host's
 * auto-vectoriser and store merging, so a wide access here is one the
 * source asked for. */
static inline void check_aligned(const void *p, size_t n, int kind)
{
    const cusim_thread *t = cusim_cur;
    if (!t) return;
    if ((uintptr_t)p - (uintptr_t)t->fiber.stack < t->fiber.stack_size) return;
    if ((uintptr_t)p & (n - 1)) cusim_misaligned(p, n, kind);
    cusim_access(p, n, kind);
}

/* ---- plain accesses ---------------------------------------------------------------------------- */

void __tsan_init(void);
void __tsan_func_entry(void *pc);
void __tsan_func_exit(void *unused);
void __tsan_init(void) {}
void __tsan_func_entry(void *pc) { (void)pc; }
void __tsan_func_exit(void *unused) { (void)unused; }

#define ACCESS(N)                                                                                            \
    void __tsan_read##N(void *p);                                                                            \
    void __tsan_write##N(void *p);                                                                           \
    void __tsan_unaligned_read##N(void *p);                                                                  \
    void __tsan_unaligned_write##N(void *p);                                                                 \
    void __tsan_volatile_read##N(void *p);                                                                   \
    void __tsan_volatile_write##N(void *p);                                                                  \
    void __tsan_read##N(void *p) { check_aligned(p, N, CUSIM_READ); }                                        \
    void __tsan_write##N(void *p) { check_aligned(p, N, CUSIM_WRITE); }                                      \
    void __tsan_unaligned_read##N(void *p) { check(p, N, CUSIM_READ); }                                      \
    void __tsan_unaligned_write##N(void *p) { check(p, N, CUSIM_WRITE); }                                    \
    void __tsan_volatile_read##N(void *p) { check(p, N, CUSIM_READ); }                                       \
    void __tsan_volatile_write##N(void *p) { check(p, N, CUSIM_WRITE); }

ACCESS(1)
ACCESS(2)
ACCESS(4)
ACCESS(8)
ACCESS(16)

void __tsan_read_range(void *p, long n);
void __tsan_write_range(void *p, long n);
void __tsan_read_range(void *p, long n) { check(p, (size_t)n, CUSIM_READ); }
void __tsan_write_range(void *p, long n) { check(p, (size_t)n, CUSIM_WRITE); }

/* virtual calls (no kernel has them; host code in a kernel's file may) */
void __tsan_vptr_read(void **p);
void __tsan_vptr_update(void *p, void *v);
void __tsan_vptr_read(void **p) { check(p, sizeof *p, CUSIM_READ); }
void __tsan_vptr_update(void *p, void *v)
{
    (void)v;
    check(p, sizeof(void *), CUSIM_WRITE);
}

/* clang calls these for memcpy/memset/memmove (gcc calls libc directly) */
void *__tsan_memcpy(void *d, const void *s, size_t n);
void *__tsan_memmove(void *d, const void *s, size_t n);
void *__tsan_memset(void *d, int c, size_t n);
void *__tsan_memcpy(void *d, const void *s, size_t n)
{
    check(s, n, CUSIM_READ);
    check(d, n, CUSIM_WRITE);
    return memcpy(d, s, n);
}
void *__tsan_memmove(void *d, const void *s, size_t n)
{
    check(s, n, CUSIM_READ);
    check(d, n, CUSIM_WRITE);
    return memmove(d, s, n);
}
void *__tsan_memset(void *d, int c, size_t n)
{
    check(d, n, CUSIM_WRITE);
    return memset(d, c, n);
}

/* ---- atomics (the memory order argument is ignored: sequentially consistent) ------------------ */

#define RMW (CUSIM_READ | CUSIM_WRITE | CUSIM_ATOMIC)
#define SC __ATOMIC_SEQ_CST

#define FETCH(N, T, name, builtin)                                                                           \
    T __tsan_atomic##N##_##name(volatile void *a, T v, int mo);                                              \
    T __tsan_atomic##N##_##name(volatile void *a, T v, int mo)                                               \
    {                                                                                                        \
        (void)mo;                                                                                            \
        check((const void *)a, sizeof(T), RMW);                                                              \
        return builtin((volatile T *)a, v, SC);                                                              \
    }

#define ATOMICS(N, T)                                                                                        \
    T __tsan_atomic##N##_load(const volatile void *a, int mo);                                               \
    T __tsan_atomic##N##_load(const volatile void *a, int mo)                                                \
    {                                                                                                        \
        (void)mo;                                                                                            \
        check((const void *)a, sizeof(T), CUSIM_READ | CUSIM_ATOMIC);                                        \
        return __atomic_load_n((const volatile T *)a, SC);                                                   \
    }                                                                                                        \
    void __tsan_atomic##N##_store(volatile void *a, T v, int mo);                                            \
    void __tsan_atomic##N##_store(volatile void *a, T v, int mo)                                             \
    {                                                                                                        \
        (void)mo;                                                                                            \
        check((const void *)a, sizeof(T), CUSIM_WRITE | CUSIM_ATOMIC);                                       \
        __atomic_store_n((volatile T *)a, v, SC);                                                            \
    }                                                                                                        \
    FETCH(N, T, exchange, __atomic_exchange_n)                                                               \
    FETCH(N, T, fetch_add, __atomic_fetch_add)                                                               \
    FETCH(N, T, fetch_sub, __atomic_fetch_sub)                                                               \
    FETCH(N, T, fetch_and, __atomic_fetch_and)                                                               \
    FETCH(N, T, fetch_or, __atomic_fetch_or)                                                                 \
    FETCH(N, T, fetch_xor, __atomic_fetch_xor)                                                               \
    FETCH(N, T, fetch_nand, __atomic_fetch_nand)                                                             \
    _Bool __tsan_atomic##N##_compare_exchange_strong(volatile void *a, void *c, T v, int mo, int fmo);       \
    _Bool __tsan_atomic##N##_compare_exchange_strong(volatile void *a, void *c, T v, int mo, int fmo)        \
    {                                                                                                        \
        (void)mo, (void)fmo;                                                                                 \
        check((const void *)a, sizeof(T), RMW);                                                              \
        return __atomic_compare_exchange_n((volatile T *)a, (T *)c, v, 0, SC, SC);                           \
    }                                                                                                        \
    _Bool __tsan_atomic##N##_compare_exchange_weak(volatile void *a, void *c, T v, int mo, int fmo);         \
    _Bool __tsan_atomic##N##_compare_exchange_weak(volatile void *a, void *c, T v, int mo, int fmo)          \
    {                                                                                                        \
        (void)mo, (void)fmo;                                                                                 \
        check((const void *)a, sizeof(T), RMW);                                                              \
        return __atomic_compare_exchange_n((volatile T *)a, (T *)c, v, 0, SC, SC);                           \
    }                                                                                                        \
    T __tsan_atomic##N##_compare_exchange_val(volatile void *a, T c, T v, int mo, int fmo);                  \
    T __tsan_atomic##N##_compare_exchange_val(volatile void *a, T c, T v, int mo, int fmo)                   \
    {                                                                                                        \
        (void)mo, (void)fmo;                                                                                 \
        check((const void *)a, sizeof(T), RMW);                                                              \
        __atomic_compare_exchange_n((volatile T *)a, &c, v, 0, SC, SC);                                      \
        return c;                                                                                            \
    }

/* the value types as gcc's declarations of these builtins have them */
ATOMICS(8, unsigned char)
ATOMICS(16, unsigned short)
ATOMICS(32, unsigned int)
ATOMICS(64, unsigned long)

void __tsan_atomic_thread_fence(int mo);
void __tsan_atomic_signal_fence(int mo);
void __tsan_atomic_thread_fence(int mo)
{
    (void)mo;
    __atomic_thread_fence(SC);
}
void __tsan_atomic_signal_fence(int mo)
{
    (void)mo;
    __atomic_signal_fence(SC);
}
