/* stub_runtime_for_nccl_tests.c — a stand-in for runtime.c, only for
 * building selftest_nccl.c by hand before the real runtime exists (not part
 * of any meson build). It implements what nccl.c calls of cusim_impl.h, in
 * the simplest way that keeps the contract: draining a stream does nothing
 * (nothing is ever queued), a host function queued on a stream runs at once,
 * device memory is what stub_dev_alloc handed out (plain malloc'd memory,
 * registered), and the current device is a per-thread number. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "cusim_impl.h"
#include "stub_runtime_for_nccl_tests.h"

enum { MAX_ALLOCS = 1024 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t big_lock; /* cusim_lock: recursive, made on first use */
static pthread_once_t big_once = PTHREAD_ONCE_INIT;
static struct {
    void *base;
    size_t size;
    int device;
} allocs[MAX_ALLOCS];
static _Thread_local int current_device;

static void big_init(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&big_lock, &a);
}

void cusim_lock(void)
{
    pthread_once(&big_once, big_init);
    pthread_mutex_lock(&big_lock);
}

void cusim_unlock(void) { pthread_mutex_unlock(&big_lock); }

void *stub_dev_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) return NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (!allocs[i].base) {
            allocs[i].base = p;
            allocs[i].size = n;
            allocs[i].device = current_device;
            pthread_mutex_unlock(&lock);
            return p;
        }
    pthread_mutex_unlock(&lock);
    free(p);
    return NULL;
}

void stub_dev_free(void *p)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].base == p) allocs[i].base = NULL;
    pthread_mutex_unlock(&lock);
    free(p);
}

void stub_set_device(int dev) { current_device = dev; }

cusim_mem_kind cusim_mem_lookup(const void *p, size_t n, cusim_alloc_info *info)
{
    uintptr_t a = (uintptr_t)p;
    cusim_mem_kind k = CUSIM_MEM_OTHER;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        uintptr_t b = (uintptr_t)allocs[i].base;
        if (!b || a < b || a >= b + allocs[i].size) continue;
        k = a + n <= b + allocs[i].size ? CUSIM_MEM_DEVICE : CUSIM_MEM_INVALID;
        if (info) *info = (cusim_alloc_info){allocs[i].base, allocs[i].size, allocs[i].device, false, false};
    }
    pthread_mutex_unlock(&lock);
    return k;
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

int cusim_current_device(void) { return current_device; }
int cusim_device_count(void) { return 2; }
void cusim_mem_open(void) {}
void cusim_mem_close(void) {}
