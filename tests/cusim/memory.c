/* memory.c — the emulator's device memory, built to catch the mistakes a
 * GPU would punish (or silently forgive):
 *
 *   - every cudaMalloc is its own mapping: a PROT_NONE guard page, the data
 *     pages, a PROT_NONE guard page. The returned base is 256-byte aligned
 *     and placed as close to the trailing guard as that alignment allows, so
 *     running off the end faults at once (within 255 bytes at most).
 *   - device memory is unreadable from host code: outside cusim_mem_open()
 *     ... cusim_mem_close() (which the runtime brackets queued work with)
 *     the data pages refuse access. With memory protection keys (x86 PKU)
 *     the pages carry a key and opening is one register write for the
 *     calling thread only (another host thread touching device memory
 *     meanwhile still faults). Without PKU, opening is lazy: the first
 *     access device work makes to an allocation faults, the handler makes
 *     that allocation accessible and the access resumes; closing protects
 *     again only what was opened. (Toggling all 200 allocations of a
 *     training step with mprotect costs ~1.4 ms per drain; see
 *     selftest_runtime bench.) EMBER_CUSIM_PROTECT=0 turns protection off,
 *     =mprotect forces the fallback.
 *   - a freed allocation stays mapped PROT_NONE (its pages given back) for
 *     the next QUARANTINE_MAX frees, so a use after free faults and is named.
 *   - a SIGSEGV/SIGBUS handler (installed at the first cudaMalloc, chaining
 *     to the previous one, e.g. ASan's, for addresses that are not ours)
 *     names what was touched: host code reading device memory, or device
 *     work running past an allocation, and aborts.
 *
 * Pinned host memory (cudaMallocHost) is plain host memory remembered as
 * pinned: the runtime's copies behave differently for it (see runtime.c).
 * Reserved ranges and the memory mapped into them (cuMemAddressReserve,
 * cuMemMap) are vmm.c's; this file answers for them through it (lookups,
 * faults, protection) and counts their memory with cudaMalloc's.
 *
 * The tables are guarded by cusim_lock; the fault handler reads them
 * without it (it only runs when the process is about to die). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cusim_impl.h"
#include "runtime_impl.h"

enum { ALIGN = 256, QUARANTINE_MAX = 1024 };

typedef struct region {
    char *map; /* the whole mapping: guard page, data pages, guard page */
    size_t map_len;
    char *base;  /* what cudaMalloc returned */
    size_t size; /* bytes asked for */
    int device;
    bool freed;
    bool opened; /* PROTECT_MPROTECT: made accessible since the last close */
} region;

/* every mapping we hold (live and quarantined), sorted by address */
static region *regions;
static size_t nregions, cap_regions;
/* the quarantined (freed) mappings by address, oldest first: a ring */
static char *quarantine[QUARANTINE_MAX];
static size_t q_first, q_count;
static size_t used_bytes[CUSIM_MAX_DEVICES];

typedef struct pinned_block {
    char *p;
    size_t n;
} pinned_block;
static pinned_block *pinned; /* unsorted: a handful of blocks */
static size_t npinned, cap_pinned;

static size_t page;
static enum { PROTECT_OFF, PROTECT_PKEY, PROTECT_MPROTECT } protect;
static int pkey = -1;
static int open_threads;                   /* PROTECT_MPROTECT: threads with memory open */
static _Thread_local int thread_open;      /* this thread's cusim_mem_open depth */
static _Thread_local const char *activity; /* what device work this thread runs */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool handler_installed;
static struct sigaction prev_segv, prev_bus;

static void init_memory(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    const char *env = getenv("EMBER_CUSIM_PROTECT");
    if (env && !strcmp(env, "0")) {
        protect = PROTECT_OFF;
        return;
    }
    if (env && strcmp(env, "1") && strcmp(env, "mprotect"))
        fprintf(stderr, "cusim: EMBER_CUSIM_PROTECT=%s is not 0, 1 or mprotect; protecting device memory\n",
                env);
    if (!env || strcmp(env, "mprotect")) pkey = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    protect = pkey >= 0 ? PROTECT_PKEY : PROTECT_MPROTECT;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
static char *data_start(const region *r) { return r->map + page; }
static size_t data_len(const region *r) { return r->map_len - 2 * page; }

/* index of the region whose mapping holds p, or -1 (no lock: the fault
 * handler calls it too) */
static long find_region(const void *p)
{
    const char *c = p;
    size_t lo = 0, hi = nregions; /* first region with map > p */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (regions[mid].map <= c)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return -1;
    const region *r = &regions[lo - 1];
    return c < r->map + r->map_len ? (long)(lo - 1) : -1;
}

static bool insert_region(region r)
{
    if (nregions == cap_regions) {
        size_t cap = cap_regions ? 2 * cap_regions : 256;
        region *grown = realloc(regions, cap * sizeof *grown);
        if (!grown) return false;
        regions = grown;
        cap_regions = cap;
    }
    size_t at = 0;
    while (at < nregions && regions[at].map < r.map) at++; /* the mmap is the cost here, not this */
    memmove(&regions[at + 1], &regions[at], (nregions - at) * sizeof *regions);
    regions[at] = r;
    nregions++;
    return true;
}

static void remove_region(long i)
{
    memmove(&regions[i], &regions[i + 1], (nregions - (size_t)i - 1) * sizeof *regions);
    nregions--;
}

/* the data pages of r readable and writable (open) or not, for PROTECT_MPROTECT
 * (async-signal-safe: on_fault calls it) */
static void toggle(region *r, bool open)
{
    mprotect(data_start(r), data_len(r), open ? PROT_READ | PROT_WRITE : PROT_NONE);
    r->opened = open;
}

/* ---- fault messages ------------------------------------------------------------------- */

/* "N bytes into a B-byte allocation on cuda:D" and its kin: where a is
 * relative to r */
static void where(char *out, size_t cap, const char *a, const region *r)
{
    const char *gone = r->freed ? " that was freed" : "";
    if (a >= r->base && a < r->base + r->size)
        snprintf(out, cap, "%zu bytes into a %zu-byte allocation at %p on cuda:%d%s", (size_t)(a - r->base),
                 r->size, (void *)r->base, r->device, gone);
    else if (a >= r->base)
        snprintf(out, cap, "%zu bytes past the end of a %zu-byte allocation at %p on cuda:%d%s",
                 (size_t)(a - (r->base + r->size)), r->size, (void *)r->base, r->device, gone);
    else
        snprintf(out, cap, "%zu bytes before the start of a %zu-byte allocation at %p on cuda:%d%s",
                 (size_t)(r->base - a), r->size, (void *)r->base, r->device, gone);
}

static void say(const char *msg)
{
    ssize_t w = write(STDERR_FILENO, msg, strlen(msg));
    (void)w;
}

/* hands a fault that is not ours to whoever handled it before us */
static void chain(int sig, siginfo_t *si, void *uc)
{
    const struct sigaction *p = sig == SIGSEGV ? &prev_segv : &prev_bus;
    if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction) {
        p->sa_sigaction(sig, si, uc);
    } else if (p->sa_handler == SIG_DFL || p->sa_handler == SIG_IGN) {
        signal(sig, SIG_DFL); /* the access repeats on return and takes the default action */
    } else {
        p->sa_handler(sig);
    }
}

static void on_fault(int sig, siginfo_t *si, void *uc)
{
    const char *a = si->si_addr;
    long i = find_region(a);
    char msg[768], rel[384];
    int v =
        i < 0 ? vmm_fault(a, thread_open > 0, activity, protect == PROTECT_MPROTECT, msg, sizeof msg) : -1;
    if (v == 0) return; /* device work's first touch of a mapping since memory was opened */
    if (v == 1) {
        say(msg);
        signal(SIGABRT, SIG_DFL);
        abort();
    }
    if (i < 0) {
        if (thread_open > 0) {
            snprintf(
                msg, sizeof msg,
                "cusim: %s accessed %p, outside any device allocation (a host pointer, a stack overflow, "
                "garbage?)\n",
                activity ? activity : "device work", (const void *)a);
            say(msg);
        }
        chain(sig, si, uc);
        return;
    }
    region *r = &regions[i];
    if (protect == PROTECT_MPROTECT && thread_open > 0 && !r->freed && !r->opened && a >= data_start(r) &&
        a < data_start(r) + data_len(r)) {
        toggle(r, true); /* device work's first touch of r since memory was opened: let it through */
        return;
    }
    where(rel, sizeof rel, a, r);
    bool inside = !r->freed && a >= r->base && a < r->base + r->size;
    if (thread_open == 0 && inside)
        snprintf(msg, sizeof msg,
                 "cusim: host code dereferenced device memory at %p (%zu bytes into a %zu-byte allocation on "
                 "cuda:%d); copy it to the host with cudaMemcpy\n",
                 (const void *)a, (size_t)(a - r->base), r->size, r->device);
    else if (thread_open == 0)
        snprintf(msg, sizeof msg, "cusim: host code dereferenced %p, %s\n", (const void *)a, rel);
    else
        snprintf(msg, sizeof msg, "cusim: %s accessed %p, %s\n", activity ? activity : "device work",
                 (const void *)a, rel);
    say(msg);
    signal(SIGABRT, SIG_DFL);
    abort();
}

void mem_install_handler(void)
{
    if (handler_installed) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &prev_segv);
    sigaction(SIGBUS, &sa, &prev_bus);
    handler_installed = true;
}

/* ---- device memory ------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **p, size_t n)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    pthread_once(&once, init_memory);
    if (!p) return rt_fail(cudaErrorInvalidValue);
    *p = NULL;
    if (n == 0) return cudaSuccess;
    int dev = cusim_current_device();
    if (n > rt_device_memory()) return rt_fail(cudaErrorMemoryAllocation);
    size_t len = round_up(n, page);
    cusim_lock();
    if (used_bytes[dev] + n > rt_device_memory()) {
        cusim_unlock();
        return rt_fail(cudaErrorMemoryAllocation);
    }
    char *map = mmap(NULL, len + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        cusim_unlock();
        return rt_fail(cudaErrorMemoryAllocation);
    }
    region r = {map, len + 2 * page, map + page + len - round_up(n, ALIGN), n, dev, false, false};
    int rc = 0;
    switch (protect) {
    case PROTECT_OFF: rc = mprotect(map + page, len, PROT_READ | PROT_WRITE); break;
    case PROTECT_PKEY: rc = pkey_mprotect(map + page, len, PROT_READ | PROT_WRITE, pkey); break;
    case PROTECT_MPROTECT: break; /* opened by the first touch (on_fault) */
    }
    if (rc || !insert_region(r)) {
        munmap(map, len + 2 * page);
        cusim_unlock();
        return rt_fail(cudaErrorMemoryAllocation);
    }
    used_bytes[dev] += n;
    mem_install_handler();
    cusim_unlock();
    *p = r.base;
    return cudaSuccess;
}

bool mem_charge(int dev, size_t n)
{
    if (used_bytes[dev] + n > rt_device_memory()) return false;
    used_bytes[dev] += n;
    return true;
}

void mem_uncharge(int dev, size_t n) { used_bytes[dev] -= n; }

int mem_protect(void *p, size_t n, bool accessible)
{
    pthread_once(&once, init_memory);
    if (!accessible) return mprotect(p, n, PROT_NONE);
    switch (protect) {
    case PROTECT_OFF: return mprotect(p, n, PROT_READ | PROT_WRITE);
    case PROTECT_PKEY: return pkey_mprotect(p, n, PROT_READ | PROT_WRITE, pkey);
    case PROTECT_MPROTECT: return mprotect(p, n, PROT_NONE); /* opened by the first touch (on_fault) */
    }
    return -1;
}

/* lock held: r is freed; it joins the quarantine, whose oldest member leaves */
static void quarantine_region(long i)
{
    region *r = &regions[i];
    madvise(data_start(r), data_len(r), MADV_DONTNEED);
    mprotect(r->map, r->map_len, PROT_NONE);
    r->freed = true;
    r->opened = false;
    char *map = r->map;
    if (q_count == QUARANTINE_MAX) {
        long old = find_region(quarantine[q_first]);
        munmap(regions[old].map, regions[old].map_len);
        remove_region(old);
        q_first = (q_first + 1) % QUARANTINE_MAX;
        q_count--;
    }
    quarantine[(q_first + q_count) % QUARANTINE_MAX] = map;
    q_count++;
}

cudaError_t cudaFree(void *p)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    if (!p) return cudaSuccess;
    cusim_lock();
    long i = find_region(p);
    const char *why = i < 0                  ? "is not device memory"
                      : regions[i].freed     ? "was already freed (a double free)"
                      : p != regions[i].base ? "is not the start of an allocation"
                                             : NULL;
    if (why) {
        cusim_unlock();
        cusim_report("cudaFree: %p %s", p, why);
        return rt_fail(cudaErrorInvalidValue);
    }
    /* as on CUDA, cudaFree waits for the device: work queued before it that
     * uses the block runs first */
    rt_drain_device(regions[i].device);
    i = find_region(p);              /* the work may have allocated: the table moved */
    if (i < 0 || regions[i].freed) { /* ... or freed it itself */
        cusim_unlock();
        return cudaSuccess;
    }
    used_bytes[regions[i].device] -= regions[i].size;
    quarantine_region(i);
    cusim_unlock();
    return cudaSuccess;
}

cusim_mem_kind cusim_mem_lookup(const void *p, size_t n, cusim_alloc_info *info)
{
    if (n == 0) n = 1;
    const char *c = p;
    cusim_lock();
    long i = find_region(c);
    if (i < 0 && (uintptr_t)c + n - 1 >= (uintptr_t)c)
        i = find_region(c + n - 1); /* starts before, ends inside */
    cusim_mem_kind kind = CUSIM_MEM_OTHER;
    if (i >= 0) {
        const region *r = &regions[i];
        bool inside = c >= r->base && c < r->base + r->size && n <= (size_t)(r->base + r->size - c);
        kind = inside && !r->freed ? CUSIM_MEM_DEVICE : CUSIM_MEM_INVALID;
        if (info) *info = (cusim_alloc_info){r->base, r->size, r->device, r->freed, false};
    } else {
        kind = vmm_lookup(p, n, info);
    }
    cusim_unlock();
    return kind;
}

void cusim_mem_foreach(void (*fn)(void *ctx, void *base, size_t size, int device), void *ctx)
{
    cusim_lock();
    for (size_t i = 0; i < nregions; i++)
        if (!regions[i].freed) fn(ctx, regions[i].base, regions[i].size, regions[i].device);
    vmm_foreach(fn, ctx);
    cusim_unlock();
}

void cusim_mem_open(void)
{
    pthread_once(&once, init_memory);
    if (thread_open++ > 0) return;
    switch (protect) {
    case PROTECT_OFF: break;
    case PROTECT_PKEY: pkey_set(pkey, 0); break;
    case PROTECT_MPROTECT: /* lazily: on_fault opens what device work touches */
        cusim_lock();
        open_threads++;
        cusim_unlock();
        break;
    }
}

void cusim_mem_close(void)
{
    pthread_once(&once, init_memory);
    if (thread_open == 0) {
        cusim_report("cusim_mem_close without a matching cusim_mem_open");
        return;
    }
    if (--thread_open > 0) return;
    switch (protect) {
    case PROTECT_OFF: break;
    case PROTECT_PKEY: pkey_set(pkey, PKEY_DISABLE_ACCESS); break;
    case PROTECT_MPROTECT:
        cusim_lock();
        if (--open_threads == 0) {
            for (size_t i = 0; i < nregions; i++)
                if (regions[i].opened) toggle(&regions[i], false);
            vmm_close();
        }
        cusim_unlock();
        break;
    }
}

const char *mem_activity(const char *what)
{
    const char *was = activity;
    activity = what;
    return was;
}

/* ---- pinned host memory -------------------------------------------------------------- */

cudaError_t cudaMallocHost(void **p, size_t n)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    if (!p) return rt_fail(cudaErrorInvalidValue);
    *p = NULL;
    void *mem = NULL;
    if (posix_memalign(&mem, 4096, n ? n : 1)) return rt_fail(cudaErrorMemoryAllocation);
    cusim_lock();
    if (npinned == cap_pinned) {
        size_t cap = cap_pinned ? 2 * cap_pinned : 16;
        pinned_block *grown = realloc(pinned, cap * sizeof *grown);
        if (!grown) {
            cusim_unlock();
            free(mem);
            return rt_fail(cudaErrorMemoryAllocation);
        }
        pinned = grown;
        cap_pinned = cap;
    }
    pinned[npinned++] = (pinned_block){mem, n};
    cusim_unlock();
    *p = mem;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    if (!p) return cudaSuccess;
    cusim_lock();
    size_t i = 0;
    while (i < npinned && pinned[i].p != p) i++;
    if (i == npinned) {
        cusim_unlock();
        cusim_report("cudaFreeHost: %p did not come from cudaMallocHost (or was freed already)", p);
        return rt_fail(cudaErrorInvalidValue);
    }
    /* queued copies may still read or write it: they run first */
    rt_drain_device(-1);
    pinned[i] = pinned[--npinned];
    cusim_unlock();
    free(p);
    return cudaSuccess;
}

bool mem_pinned(const void *p, size_t n)
{
    const char *c = p;
    bool yes = false;
    cusim_lock();
    for (size_t i = 0; i < npinned && !yes; i++)
        yes = c >= pinned[i].p && c <= pinned[i].p + pinned[i].n &&
              n <= (size_t)(pinned[i].p + pinned[i].n - c);
    cusim_unlock();
    return yes;
}
