/* vmm.c — CUDA's virtual memory management in ember's emulator: an address
 * range reserved first (cuMemAddressReserve), physical allocations made on
 * their own (cuMemCreate) and mapped into it piece by piece (cuMemMap,
 * cuMemSetAccess, cuMemUnmap), so a range keeps its addresses while its
 * memory comes and goes (ZeRO stage 3's parameters: dist/zero.c). Also the
 * runtime's door to these driver functions, cudaGetDriverEntryPointByVersion.
 *
 * Built to catch what a GPU would punish, like cudaMalloc's memory (memory.c):
 *   - a reservation is an mmap'd PROT_NONE range between two guard pages:
 *     touching a part where nothing is mapped faults, from host code or
 *     from device work, and the checkers (memcheck for kernels, copy.c,
 *     nccl.c, cublas.c) see it through cusim_mem_lookup (vmm_lookup here)
 *     and report "an unmapped part of a reserved range" before any access.
 *   - a physical allocation is a memfd of its size, filled with 0xff bytes
 *     (a NaN as floats: CUDA leaves new memory undefined, so a read before
 *     any write should show). Mapping it is mmap(MAP_SHARED | MAP_FIXED) of
 *     that file over the reservation, so its contents survive an unmap and a
 *     map elsewhere, as on a GPU; unmapping puts PROT_NONE pages back.
 *   - a mapping is inaccessible until cuMemSetAccess; then it is protected
 *     from host code as cudaMalloc's memory is (protection keys, or
 *     mprotect opened by the fault handler at device work's first touch).
 *   - a device's memory counts an allocation from cuMemCreate until it is
 *     both released and unmapped (a mapped one released goes at its last
 *     unmap), beside cudaMalloc's.
 *   - cuMemUnmap does not wait for queued work: work still queued that uses
 *     the range finds it unmapped when it runs, and is reported. (The
 *     driver documents the call as synchronous "for most use cases"; ember
 *     waits for the work itself, and the emulator makes sure it does.)
 * The argument rules are the driver's: sizes, addresses and mappings in
 * multiples of the granularity (EMBER_CUSIM_VMM_GRANULARITY, default 2 MiB
 * as on an H100; tests set the host page size), reservations in multiples of
 * the host page, a map only where nothing is mapped, an unmap of whole
 * mappings only, access set only on a fully mapped range. A broken rule
 * returns the driver's error and is reported (a caller's bug).
 *
 * Tables are guarded by cusim_lock; the fault handler reads them without it
 * (it runs only when the process is about to die, or to open a mapping). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda.h"
#include "cusim_impl.h"
#include "runtime_impl.h"

typedef struct phys {
    CUmemGenericAllocationHandle id;
    int fd;
    size_t size;
    int device;
    int maps;      /* mappings of it alive */
    bool released; /* cuMemRelease ran: it goes at its last unmap */
} phys;

typedef struct vmap {
    char *va;
    size_t len;
    phys *h;
    bool access; /* cuMemSetAccess made it read-write */
    bool opened; /* PROTECT_MPROTECT: made accessible since the last close */
} vmap;

typedef struct reservation {
    char *map; /* guard page, the range, guard page */
    size_t map_len;
    char *base;
    size_t size;
    int device; /* current when it was reserved: for messages only */
    vmap *maps; /* sorted by address */
    size_t nmaps, cap;
} reservation;

static reservation *res; /* sorted by address */
static size_t nres, cap_res;
static phys **handles;
static size_t nhandles, cap_handles;
static CUmemGenericAllocationHandle next_id = 1;
static size_t granularity;

static size_t host_page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static size_t gran(void)
{
    if (!granularity) {
        size_t pg = host_page(), g = 2u << 20;
        const char *v = getenv("EMBER_CUSIM_VMM_GRANULARITY");
        if (v && *v) {
            char *end;
            unsigned long long n = strtoull(v, &end, 10);
            if (*end || n == 0 || n % pg)
                fprintf(stderr,
                        "cusim: EMBER_CUSIM_VMM_GRANULARITY=%s is not a multiple of the %zu-byte page; "
                        "using 2 MiB\n",
                        v, pg);
            else
                g = (size_t)n;
        }
        granularity = g;
    }
    return granularity;
}

/* the reservation whose mapping (guards included) holds p, or NULL */
static reservation *find_res(const char *p)
{
    size_t lo = 0, hi = nres;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (res[mid].map <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return NULL;
    reservation *r = &res[lo - 1];
    return p < r->map + r->map_len ? r : NULL;
}

/* index in r->maps of the mapping holding p, or -1 */
static long find_map(const reservation *r, const char *p)
{
    size_t lo = 0, hi = r->nmaps;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->maps[mid].va <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return -1;
    const vmap *m = &r->maps[lo - 1];
    return p < m->va + m->len ? (long)(lo - 1) : -1;
}

static phys *find_handle(CUmemGenericAllocationHandle id)
{
    for (size_t i = 0; i < nhandles; i++)
        if (handles[i]->id == id) return handles[i];
    return NULL;
}

/* a broken argument rule: reported (a caller's bug) and returned */
static CUresult bad(CUresult e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static CUresult bad(CUresult e, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cusim_report("%s", msg);
    return e;
}

/* the allocation properties ember may pass: pinned device memory of a
 * device that exists, no export handle */
static CUresult check_prop(const char *api, const CUmemAllocationProp *prop)
{
    if (!prop) return bad(CUDA_ERROR_INVALID_VALUE, "%s: prop is NULL", api);
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return bad(CUDA_ERROR_INVALID_VALUE, "%s: prop->type %d is not CU_MEM_ALLOCATION_TYPE_PINNED", api,
                   (int)prop->type);
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return bad(CUDA_ERROR_INVALID_VALUE,
                   "%s: prop->location.type %d is not CU_MEM_LOCATION_TYPE_DEVICE "
                   "(the emulator has device memory only)",
                   api, (int)prop->location.type);
    if (prop->location.id < 0 || prop->location.id >= cusim_device_count())
        return bad(CUDA_ERROR_INVALID_DEVICE, "%s: prop->location.id %d is not a device (%d emulated)", api,
                   prop->location.id, cusim_device_count());
    if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return bad(CUDA_ERROR_NOT_SUPPORTED,
                   "%s: exportable handles (requestedHandleTypes %d) are not emulated", api,
                   (int)prop->requestedHandleTypes);
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity_out, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    rt_init();
    if (!granularity_out)
        return bad(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: granularity is NULL");
    CUresult e = check_prop("cuMemGetAllocationGranularity", prop);
    if (e) return e;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return bad(CUDA_ERROR_INVALID_VALUE,
                   "cuMemGetAllocationGranularity: option %d is neither MINIMUM nor "
                   "RECOMMENDED",
                   (int)option);
    *granularity_out = gran();
    return CUDA_SUCCESS;
}

/* ---- reservations ---------------------------------------------------------------------------- */

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    rt_init();
    const char *api = "cuMemAddressReserve";
    size_t pg = host_page();
    if (!ptr) return bad(CUDA_ERROR_INVALID_VALUE, "%s: ptr is NULL", api);
    *ptr = 0;
    if (size == 0 || size % pg)
        return bad(CUDA_ERROR_INVALID_VALUE,
                   "%s: size %zu is not a positive multiple of the %zu-byte host page", api, size, pg);
    if (addr % pg)
        return bad(CUDA_ERROR_INVALID_VALUE, "%s: addr %#llx is not a multiple of the host page", api, addr);
    if (alignment & (alignment - 1))
        return bad(CUDA_ERROR_INVALID_VALUE, "%s: alignment %zu is not a power of two (or 0)", api,
                   alignment);
    if (flags) return bad(CUDA_ERROR_INVALID_VALUE, "%s: flags %llu must be 0", api, flags);
    size_t align = alignment ? alignment : gran(); /* the emulator's default: the granularity */
    if (align < pg) align = pg;
    /* room for the aligned range and a guard page on each side; the hint is not followed */
    size_t span = size + align + 2 * pg;
    char *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    char *base = (char *)(((uintptr_t)raw + pg + align - 1) / align * align);
    char *map = base - pg, *end = base + size + pg;
    if (map > raw) munmap(raw, (size_t)(map - raw));
    if (raw + span > end) munmap(end, (size_t)(raw + span - end));
    cusim_lock();
    mem_install_handler();
    if (nres == cap_res) {
        size_t cap = cap_res ? 2 * cap_res : 8;
        reservation *grown = realloc(res, cap * sizeof *grown);
        if (!grown) {
            cusim_unlock();
            munmap(map, (size_t)(end - map));
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        res = grown;
        cap_res = cap;
    }
    size_t at = 0;
    while (at < nres && res[at].map < map) at++;
    memmove(&res[at + 1], &res[at], (nres - at) * sizeof *res);
    res[at] = (reservation){map, (size_t)(end - map), base, size, cusim_current_device(), NULL, 0, 0};
    nres++;
    cusim_unlock();
    *ptr = (CUdeviceptr)(uintptr_t)base;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    rt_init();
    const char *api = "cuMemAddressFree";
    char *p = (char *)(uintptr_t)ptr;
    cusim_lock();
    reservation *r = find_res(p);
    CUresult e = CUDA_SUCCESS;
    if (!r || r->base != p)
        e = bad(CUDA_ERROR_INVALID_VALUE, "%s: %p is not the start of a reserved range", api, (void *)p);
    else if (size != r->size)
        e = bad(CUDA_ERROR_INVALID_VALUE, "%s: size %zu differs from the %zu bytes reserved at %p", api, size,
                r->size, (void *)p);
    else if (r->nmaps)
        e = bad(CUDA_ERROR_INVALID_VALUE,
                "%s: the range at %p still has %zu mapping%s (cuMemUnmap them first)", api, (void *)p,
                r->nmaps, r->nmaps == 1 ? "" : "s");
    if (!e) {
        munmap(r->map, r->map_len);
        free(r->maps);
        size_t i = (size_t)(r - res);
        memmove(&res[i], &res[i + 1], (nres - i - 1) * sizeof *res);
        nres--;
    }
    cusim_unlock();
    return e;
}

/* ---- physical allocations -------------------------------------------------------------------- */

/* lock held: h goes (its file closed, its bytes back to the device) */
static void destroy(phys *h)
{
    close(h->fd);
    mem_uncharge(h->device, h->size);
    for (size_t i = 0; i < nhandles; i++)
        if (handles[i] == h) {
            handles[i] = handles[--nhandles];
            break;
        }
    free(h);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    rt_init();
    const char *api = "cuMemCreate";
    if (!handle) return bad(CUDA_ERROR_INVALID_VALUE, "%s: handle is NULL", api);
    *handle = 0;
    CUresult e = check_prop(api, prop);
    if (e) return e;
    if (flags) return bad(CUDA_ERROR_INVALID_VALUE, "%s: flags %llu must be 0", api, flags);
    if (size == 0 || size % gran())
        return bad(CUDA_ERROR_INVALID_VALUE, "%s: size %zu is not a positive multiple of the granularity %zu",
                   api, size, gran());
    int dev = prop->location.id;
    phys *h = calloc(1, sizeof *h);
    int fd = h ? memfd_create("cusim-vmm", MFD_CLOEXEC) : -1;
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) close(fd);
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *fill = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fill == MAP_FAILED) {
        close(fd);
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(fill, 0xff, size); /* undefined on a GPU: NaN here */
    munmap(fill, size);
    cusim_lock();
    if (nhandles == cap_handles) {
        size_t cap = cap_handles ? 2 * cap_handles : 64;
        phys **grown = realloc(handles, cap * sizeof *grown);
        if (grown) handles = grown, cap_handles = cap;
    }
    if (nhandles == cap_handles || !mem_charge(dev, size)) {
        cusim_unlock();
        close(fd);
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (phys){next_id++, fd, size, dev, 0, false};
    handles[nhandles++] = h;
    cusim_unlock();
    *handle = h->id;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    rt_init();
    cusim_lock();
    phys *h = find_handle(handle);
    CUresult e = CUDA_SUCCESS;
    if (!h || h->released)
        e = bad(CUDA_ERROR_INVALID_VALUE, "cuMemRelease: handle %llu is not a live allocation%s", handle,
                h ? " (released already)" : "");
    else if (h->maps)
        h->released = true; /* goes at its last unmap */
    else
        destroy(h);
    cusim_unlock();
    return e;
}

/* ---- mappings -------------------------------------------------------------------------------- */

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    rt_init();
    const char *api = "cuMemMap";
    char *p = (char *)(uintptr_t)ptr;
    size_t g = gran();
    if (flags) return bad(CUDA_ERROR_INVALID_VALUE, "%s: flags %llu must be 0", api, flags);
    if (offset) return bad(CUDA_ERROR_INVALID_VALUE, "%s: offset %zu must be 0", api, offset);
    if (size == 0 || size % g || ptr % g)
        return bad(CUDA_ERROR_INVALID_VALUE,
                   "%s: %p + %zu bytes: address and size must be multiples of the "
                   "granularity %zu",
                   api, (void *)p, size, g);
    cusim_lock();
    phys *h = find_handle(handle);
    reservation *r = find_res(p);
    CUresult e = CUDA_SUCCESS;
    if (!h || h->released)
        e = bad(CUDA_ERROR_INVALID_VALUE, "%s: handle %llu is not a live allocation", api, handle);
    else if (size > h->size)
        e = bad(CUDA_ERROR_INVALID_VALUE, "%s: size %zu is more than the allocation's %zu bytes", api, size,
                h->size);
    else if (!r || p < r->base || size > (size_t)(r->base + r->size - p))
        e = bad(CUDA_ERROR_INVALID_VALUE, "%s: %p + %zu bytes is not inside one reserved range", api,
                (void *)p, size);
    for (size_t k = 0; !e && k < r->nmaps; k++) { /* nothing mapped in [p, p + size) yet */
        const vmap *m = &r->maps[k];
        if (m->va < p + size && p < m->va + m->len)
            e = bad(CUDA_ERROR_INVALID_VALUE,
                    "%s: %p + %zu bytes overlaps the mapping at %p (%zu bytes): "
                    "unmap it first",
                    api, (void *)p, size, (void *)m->va, m->len);
    }
    if (!e && r->nmaps == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        vmap *grown = realloc(r->maps, cap * sizeof *grown);
        if (!grown)
            e = CUDA_ERROR_OUT_OF_MEMORY;
        else
            r->maps = grown, r->cap = cap;
    }
    if (!e && mmap(p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, 0) == MAP_FAILED)
        e = CUDA_ERROR_OUT_OF_MEMORY;
    if (!e) {
        size_t at = 0;
        while (at < r->nmaps && r->maps[at].va < p) at++;
        memmove(&r->maps[at + 1], &r->maps[at], (r->nmaps - at) * sizeof *r->maps);
        r->maps[at] = (vmap){p, size, h, false, false};
        r->nmaps++;
        h->maps++;
    }
    cusim_unlock();
    return e;
}

/* the indices [*first, *last] of r's mappings that make up [p, p + size)
 * exactly (adjacent, whole), or false */
static bool whole_mappings(const reservation *r, const char *p, size_t size, long *first, long *last)
{
    long i = r ? find_map(r, p) : -1;
    if (i < 0 || r->maps[i].va != p) return false;
    const char *end = p + size, *at = p;
    long k = i;
    for (; k < (long)r->nmaps && at < end; k++) {
        if (r->maps[k].va != at) return false;
        at += r->maps[k].len;
    }
    *first = i;
    *last = k - 1;
    return at == end;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    rt_init();
    char *p = (char *)(uintptr_t)ptr;
    cusim_lock();
    reservation *r = find_res(p);
    long first, last;
    if (!whole_mappings(r, p, size, &first, &last)) {
        cusim_unlock();
        return bad(CUDA_ERROR_INVALID_VALUE,
                   "cuMemUnmap: %p + %zu bytes is not a run of whole mappings (a "
                   "mapping cannot be unmapped in part)",
                   (void *)p, size);
    }
    /* the reservation's PROT_NONE pages back over the range */
    if (mmap(p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) ==
        MAP_FAILED) {
        cusim_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (long k = first; k <= last; k++) {
        phys *h = r->maps[k].h;
        if (--h->maps == 0 && h->released) destroy(h);
    }
    memmove(&r->maps[first], &r->maps[last + 1], (r->nmaps - (size_t)last - 1) * sizeof *r->maps);
    r->nmaps -= (size_t)(last - first + 1);
    cusim_unlock();
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    rt_init();
    const char *api = "cuMemSetAccess";
    char *p = (char *)(uintptr_t)ptr;
    if (!desc || count == 0) return bad(CUDA_ERROR_INVALID_VALUE, "%s: no access descriptor", api);
    cusim_lock();
    reservation *r = find_res(p);
    long first, last;
    CUresult e = CUDA_SUCCESS;
    if (!whole_mappings(r, p, size, &first, &last))
        e = bad(CUDA_ERROR_INVALID_VALUE, "%s: %p + %zu bytes is not a fully mapped range of whole mappings",
                api, (void *)p, size);
    bool rw = false;
    for (size_t i = 0; i < count && !e; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= cusim_device_count())
            e = bad(CUDA_ERROR_INVALID_DEVICE, "%s: desc[%zu] names no emulated device", api, i);
        else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE &&
                 desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
            e = bad(CUDA_ERROR_NOT_SUPPORTED,
                    "%s: desc[%zu].flags %d: only read-write or no access is emulated", api, i,
                    (int)desc[i].flags);
        else
            rw = rw || desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    for (long k = first; !e && k <= last; k++) {
        vmap *m = &r->maps[k];
        m->access = rw;
        m->opened = false;
        if (mem_protect(m->va, m->len, rw)) e = CUDA_ERROR_OUT_OF_MEMORY;
    }
    cusim_unlock();
    return e;
}

/* ---- what the checkers and the fault handler ask ---------------------------------------------- */

cusim_mem_kind vmm_lookup(const void *p, size_t n, cusim_alloc_info *info)
{
    const char *c = p;
    reservation *r = find_res(c);
    if (!r && (uintptr_t)c + n - 1 >= (uintptr_t)c) r = find_res(c + n - 1);
    if (!r) return CUSIM_MEM_OTHER;
    cusim_alloc_info whole = {r->base, r->size, r->device, false, true};
    if (c < r->base || n > (size_t)(r->base + r->size - c)) {
        whole.unmapped = false; /* a guard page: out of the range's bounds */
        if (info) *info = whole;
        return CUSIM_MEM_INVALID;
    }
    long i = find_map(r, c);
    if (i < 0 || !r->maps[i].access) {
        if (info) *info = whole;
        return CUSIM_MEM_INVALID;
    }
    /* the run of adjacent accessible mappings of one device around p */
    long lo = i, hi = i;
    int dev = r->maps[i].h->device;
    while (lo > 0 && r->maps[lo - 1].access && r->maps[lo - 1].h->device == dev &&
           r->maps[lo - 1].va + r->maps[lo - 1].len == r->maps[lo].va)
        lo--;
    while (hi + 1 < (long)r->nmaps && r->maps[hi + 1].access && r->maps[hi + 1].h->device == dev &&
           r->maps[hi].va + r->maps[hi].len == r->maps[hi + 1].va)
        hi++;
    char *start = r->maps[lo].va, *end = r->maps[hi].va + r->maps[hi].len;
    if (n > (size_t)(end - c)) {
        if (info) *info = whole;
        return CUSIM_MEM_INVALID; /* runs into a part that is not mapped (or not accessible) */
    }
    if (info) *info = (cusim_alloc_info){start, (size_t)(end - start), dev, false, false};
    return CUSIM_MEM_DEVICE;
}

void vmm_foreach(void (*fn)(void *ctx, void *base, size_t size, int device), void *ctx)
{
    for (size_t k = 0; k < nres; k++)
        for (size_t i = 0; i < res[k].nmaps; i++)
            if (res[k].maps[i].access)
                fn(ctx, res[k].maps[i].va, res[k].maps[i].len, res[k].maps[i].h->device);
}

int vmm_fault(const char *a, bool device_work, const char *activity, bool lazy, char *msg, size_t cap)
{
    reservation *r = find_res(a);
    if (!r) return -1;
    long i = a >= r->base && a < r->base + r->size ? find_map(r, a) : -1;
    vmap *m = i >= 0 ? &r->maps[i] : NULL;
    if (m && m->access && device_work && lazy && !m->opened) {
        mprotect(m->va, m->len, PROT_READ | PROT_WRITE);
        m->opened = true;
        return 0;
    }
    const char *who = device_work ? (activity ? activity : "device work") : "host code";
    if (m && m->access)
        snprintf(msg, cap,
                 "cusim: %s dereferenced device memory at %p (%zu bytes into a %zu-byte mapping in "
                 "the range reserved at %p on cuda:%d); copy it to the host with cudaMemcpy\n",
                 who, (const void *)a, (size_t)(a - m->va), m->len, (void *)r->base, m->h->device);
    else if (m)
        snprintf(msg, cap,
                 "cusim: %s accessed %p, mapped in the range reserved at %p but without access "
                 "(cuMemSetAccess)\n",
                 who, (const void *)a, (void *)r->base);
    else if (a >= r->base && a < r->base + r->size)
        snprintf(msg, cap,
                 "cusim: %s accessed %p, in an unmapped part of the %zu-byte range reserved at %p "
                 "(offset %zu)\n",
                 who, (const void *)a, r->size, (void *)r->base, (size_t)(a - r->base));
    else
        snprintf(msg, cap, "cusim: %s accessed %p, in a guard page of the %zu-byte range reserved at %p\n",
                 who, (const void *)a, r->size, (void *)r->base);
    return 1;
}

void vmm_close(void)
{
    for (size_t k = 0; k < nres; k++)
        for (size_t i = 0; i < res[k].nmaps; i++) {
            vmap *m = &res[k].maps[i];
            if (!m->opened) continue;
            mprotect(m->va, m->len, PROT_NONE);
            m->opened = false;
        }
}

/* ---- the runtime's door to the driver -------------------------------------------------------- */

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus)
{
    rt_init();
    static const struct {
        const char *name;
        void *fn;
    } served[] = {
        {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
        {"cuMemAddressReserve", (void *)cuMemAddressReserve},
        {"cuMemAddressFree", (void *)cuMemAddressFree},
        {"cuMemCreate", (void *)cuMemCreate},
        {"cuMemRelease", (void *)cuMemRelease},
        {"cuMemMap", (void *)cuMemMap},
        {"cuMemUnmap", (void *)cuMemUnmap},
        {"cuMemSetAccess", (void *)cuMemSetAccess},
    };
    if (!symbol || !funcPtr || flags > cudaEnablePerThreadDefaultStream)
        return rt_fail(cudaErrorInvalidValue);
    *funcPtr = NULL;
    if (cudaVersion > CUDART_VERSION) return rt_fail(cudaErrorInvalidValue); /* newer than the driver */
    for (size_t i = 0; i < sizeof served / sizeof *served; i++)
        if (!strcmp(served[i].name, symbol)) {
            *funcPtr = served[i].fn;
            if (driverStatus) *driverStatus = cudaDriverEntryPointSuccess;
            return cudaSuccess;
        }
    if (driverStatus) *driverStatus = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
