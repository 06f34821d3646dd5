/* memcheck.c — what a kernel's memory access touches, and whether it may.
 *
 * hooks.c hands every load and store of kernel code that is not on the
 * thread's own stack to cusim_access, which sorts it out:
 *   - this block's dynamic shared memory: in bounds (l->smem bytes), else
 *     an out-of-bounds report; then the race checker;
 *   - a device allocation (cusim_mem_lookup, with a small cache in front):
 *     wholly inside it and on the launch's device, else a report; a write
 *     saves the allocation's contents first when the schedule comparison
 *     tracks writes;
 *   - static storage of the program (where `static __shared__` variables
 *     live, since __shared__ is `static` here): the race checker;
 *   - anything else (the host heap, a freed or guard zone of device memory):
 *     reported, and the launch ends before the access happens.
 *
 * The race checker keeps, per byte of shared memory, who last wrote it and
 * who read it in the current barrier interval (epoch); two different
 * threads touching a byte in one interval, at least one writing and not
 * both atomically, race - unless they are lanes of one warp and a warp
 * operation came between (lane clocks, warp.c). The shadow is an
 * open-addressing hash on 8-byte granules whose entries go stale when the
 * epoch advances, so a barrier costs nothing. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec_impl.h"

/* ---- device allocations: a cache in front of cusim_mem_lookup -------------------------------- */

typedef struct alloc_entry {
    char *base;
    size_t size;
    int snap; /* index in snaps[] once a write saved it, else -1 */
} alloc_entry;

#define NCACHE 8
static alloc_entry cache[NCACHE];
static int ncache, victim;

/* ---- snapshots for the schedule comparison ----------------------------------------------------- */

typedef struct snapshot {
    char *base;
    size_t size;
    char *before; /* contents before the launch */
    char *after;  /* contents after the first run (NULL: it did not write there) */
} snapshot;

static snapshot *snaps;
static int nsnaps, capsnaps;
static bool tracking, too_big;
static size_t snap_bytes;

/* Limit on the bytes saved for one launch's comparison (EMBER_CUSIM_COMPARE_MAX_MIB,
 * default 256): past it the launch is not compared (it still runs once, right). */
static size_t snap_limit(void)
{
    static size_t limit;
    if (!limit) {
        const char *s = getenv("EMBER_CUSIM_COMPARE_MAX_MIB");
        limit = (s && *s ? (size_t)strtoull(s, NULL, 0) : 256) << 20;
        if (!limit) limit = 1;
    }
    return limit;
}

static int find_snap(const char *base)
{
    for (int i = 0; i < nsnaps; i++)
        if (snaps[i].base == base) return i;
    return -1;
}

/* The first access of this launch to e's allocation: save it first. */
static void save_before(alloc_entry *e)
{
    if ((e->snap = find_snap(e->base)) >= 0 || too_big) return;
    if (snap_bytes + e->size > snap_limit()) {
        too_big = true;
        return;
    }
    if (nsnaps == capsnaps) {
        int cap = capsnaps ? 2 * capsnaps : 16;
        snapshot *n = realloc(snaps, (size_t)cap * sizeof *n);
        if (!n) {
            too_big = true;
            return;
        }
        snaps = n;
        capsnaps = cap;
    }
    char *copy = malloc(e->size ? e->size : 1);
    if (!copy) {
        too_big = true;
        return;
    }
    memcpy(copy, e->base, e->size);
    snaps[nsnaps] = (snapshot){e->base, e->size, copy, NULL};
    e->snap = nsnaps++;
    snap_bytes += e->size;
}

void cusim_snap_begin(void)
{
    tracking = true;
    too_big = false;
    nsnaps = 0;
    snap_bytes = 0;
}

void cusim_snap_end(void)
{
    for (int i = 0; i < nsnaps; i++) {
        free(snaps[i].before);
        free(snaps[i].after);
    }
    nsnaps = 0;
    tracking = false;
}

int cusim_snap_rewind(void)
{
    if (too_big) return -1;
    for (int i = 0; i < nsnaps; i++)
        if (!(snaps[i].after = malloc(snaps[i].size ? snaps[i].size : 1)))
            return -1; /* cusim_snap_end frees */
    for (int i = 0; i < nsnaps; i++) {
        snapshot *s = &snaps[i];
        memcpy(s->after, s->base, s->size);
        memcpy(s->base, s->before, s->size);
    }
    return 0;
}

int cusim_snap_compare(void)
{
    if (too_big) return 0; /* the second run saved too much to compare: take it as it is */
    for (int i = 0; i < nsnaps; i++) {
        const snapshot *s = &snaps[i];
        const unsigned char *want = (const unsigned char *)(s->after ? s->after : s->before);
        const unsigned char *got = (const unsigned char *)s->base;
        if (!memcmp(want, got, s->size)) continue;
        size_t at = 0;
        while (want[at] == got[at]) at++;
        cusim_report(
            "kernel %s: the result depends on the order threads run in: device allocation %p (%zu bytes) "
            "differs at byte %zu (0x%02x in order, 0x%02x in a random order): threads or blocks write "
            "the same global memory, or read what others write, without an order between them",
            cusim_ex.l->name, (void *)s->base, s->size, at, want[at], got[at]);
        return -1;
    }
    return 0;
}

/* ---- static storage: the loaded objects' segments -------------------------------------------- */

typedef struct segment {
    uintptr_t lo, hi;
    bool writable;
} segment;

#define NSEGS 512
static segment segs[NSEGS];
static int nsegs, last_seg;

static int add_segments(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size, (void)ctx;
    for (int i = 0; i < info->dlpi_phnum && nsegs < NSEGS; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        segs[nsegs++] = (segment){lo, lo + ph->p_memsz, (ph->p_flags & PF_W) != 0};
    }
    return 0;
}

static void read_segments(void)
{
    nsegs = last_seg = 0;
    dl_iterate_phdr(add_segments, NULL);
}

static const segment *static_segment(uintptr_t a)
{
    if (a - segs[last_seg].lo < segs[last_seg].hi - segs[last_seg].lo) return &segs[last_seg];
    for (int i = 0; i < nsegs; i++)
        if (a - segs[i].lo < segs[i].hi - segs[i].lo) {
            last_seg = i;
            return &segs[i];
        }
    return NULL;
}

/* ---- the race shadow ----------------------------------------------------------------------------- */

enum { F_MANY = 1, F_MANY_WARPS = 2, F_W_ATOMIC = 4, F_R_PLAIN = 8 };

typedef struct cell {
    uint16_t w, r;   /* last writer, first reader: linear thread index + 1 (0: none) */
    uint16_t wc, rc; /* their lane clocks then (rc: the largest of the readers') */
    uint8_t flags, rwarp;
} cell;

typedef struct slot {
    uintptr_t key; /* address / 8 */
    uint32_t epoch;
    cell c[8];
} slot;

static slot *tab;
static size_t tab_bits, tab_live;

static size_t slot_of(uintptr_t key) { return (size_t)((key * 0x9e3779b97f4a7c15u) >> (64 - tab_bits)); }

static slot *claim(slot *t, size_t bits, uintptr_t key, uint32_t epoch)
{
    size_t mask = ((size_t)1 << bits) - 1;
    for (size_t i = (size_t)((key * 0x9e3779b97f4a7c15u) >> (64 - bits));; i = (i + 1) & mask) {
        slot *s = &t[i];
        if (s->epoch == epoch && s->key == key) return s;
        if (s->epoch != epoch) { /* stale or empty: the key is not in this epoch's part of the table */
            s->key = key;
            s->epoch = epoch;
            memset(s->c, 0, sizeof s->c);
            return s;
        }
    }
}

static bool grow(void)
{
    size_t bits = tab_bits ? tab_bits + 1 : 12;
    slot *n = calloc((size_t)1 << bits, sizeof *n);
    if (!n) return false;
    uint32_t ep = cusim_ex.epoch;
    for (size_t i = 0; tab && i < ((size_t)1 << tab_bits); i++)
        if (tab[i].epoch == ep) *claim(n, bits, tab[i].key, ep) = tab[i];
    free(tab);
    tab = n;
    tab_bits = bits;
    return true;
}

static slot *lookup(uintptr_t key)
{
    uint32_t ep = cusim_ex.epoch;
    if ((tab_live + 1) * 2 > ((size_t)1 << tab_bits) && !grow()) return NULL;
    size_t mask = ((size_t)1 << tab_bits) - 1;
    for (size_t i = slot_of(key);; i = (i + 1) & mask) {
        slot *s = &tab[i];
        if (s->epoch == ep && s->key == key) return s;
        if (s->epoch != ep) {
            tab_live++;
            return claim(tab, tab_bits, key, ep);
        }
    }
}

void cusim_mem_new_epoch(void)
{
    if (++cusim_ex.epoch == 0) { /* wrapped: forget everything */
        if (tab) memset(tab, 0, ((size_t)1 << tab_bits) * sizeof *tab);
        cusim_ex.epoch = 1;
    }
    tab_live = 0;
}

/* the lane clock of thread id (index + 1) now */
static uint16_t clock_of(unsigned tid) { return cusim_ex.warps[tid / CUSIM_WARP].clock[tid % CUSIM_WARP]; }

/* Whether thread other's access at its lane clock oc is ordered before now for me. */
static bool ordered(const cusim_thread *me, unsigned other_id, uint16_t oc)
{
    unsigned o = other_id - 1;
    return o / CUSIM_WARP == me->warp && (int16_t)(clock_of(me->tid) - oc) > 0;
}

static void report_race(const cusim_thread *me, uintptr_t a, int kind, unsigned other_id,
                        const char *other_kind)
{
    if (cusim_ex.reported_race) return;
    cusim_ex.reported_race = true;
    cusim_ex.failed = true;
    char who[200], where[80];
    uintptr_t dyn = (uintptr_t)cusim_ex.dyn;
    if (a - dyn < cusim_ex.l->smem)
        snprintf(where, sizeof where, "dynamic shared memory + %zu", (size_t)(a - dyn));
    else
        snprintf(where, sizeof where, "static shared memory %p", (void *)a);
    const cusim_thread *o = &cusim_ex.threads[other_id - 1];
    cusim_report("race on shared memory in %s: it %s %s while thread (%u,%u,%u) %s it in the same barrier "
                 "interval (no __syncthreads between, nor a warp operation for lanes of one warp)",
                 cusim_who(me, who, sizeof who),
                 kind & CUSIM_ATOMIC  ? "atomically updates"
                 : kind & CUSIM_WRITE ? "writes"
                                      : "reads",
                 where, o->idx.x, o->idx.y, o->idx.z, other_kind);
}

static void race_byte(const cusim_thread *me, cell *e, uintptr_t a, int kind)
{
    unsigned id = me->tid + 1;
    uint16_t c = clock_of(me->tid);
    bool at = kind & CUSIM_ATOMIC;
    if (e->w && e->w != id && !(at && (e->flags & F_W_ATOMIC)) && !ordered(me, e->w, e->wc))
        report_race(me, a, kind, e->w, e->flags & F_W_ATOMIC ? "updated atomically" : "wrote");
    if (!(kind & CUSIM_WRITE)) {
        if (!e->r) {
            e->r = (uint16_t)id;
            e->rc = c;
            e->rwarp = (uint8_t)me->warp;
        } else {
            if (e->r != id) e->flags |= F_MANY;
            if (e->rwarp != me->warp) e->flags |= F_MANY_WARPS;
            if ((int16_t)(c - e->rc) > 0) e->rc = c;
        }
        if (!at) e->flags |= F_R_PLAIN;
        return;
    }
    if (e->r && !(at && !(e->flags & F_R_PLAIN))) {
        bool fine = (e->flags & F_MANY)
                        ? !(e->flags & F_MANY_WARPS) && e->rwarp == me->warp && (int16_t)(c - e->rc) > 0
                        : e->r == id || ordered(me, e->r, e->rc);
        if (!fine) report_race(me, a, kind, e->r == id ? e->w ? e->w : id : e->r, "read");
    }
    e->w = (uint16_t)id;
    e->wc = c;
    e->r = 0;
    e->flags = at ? F_W_ATOMIC : 0;
}

static void race_access(uintptr_t a, size_t n, int kind)
{
    const cusim_thread *me = cusim_cur;
    for (uintptr_t end = a + n; a < end;) {
        slot *s = lookup(a >> 3);
        if (!s) return; /* out of memory for the shadow: stop checking */
        uintptr_t stop = ((a >> 3) + 1) << 3;
        for (; a < end && a < stop; a++) race_byte(me, &s->c[a & 7], a, kind);
    }
}

/* ---- classifying an access --------------------------------------------------------------------- */

void cusim_mem_begin_launch(void)
{
    ncache = victim = 0;
    if (!nsegs) read_segments();
}

static const char *kind_name(int kind)
{
    return kind & CUSIM_ATOMIC ? "atomic on" : kind & CUSIM_WRITE ? "write of" : "read of";
}

__attribute__((noreturn)) static void bad_access(const void *p, size_t n, int kind, const char *what)
{
    char who[200];
    cusim_report("%s: %s %zu bytes at %p: %s", cusim_who(cusim_cur, who, sizeof who), kind_name(kind), n, p,
                 what);
    cusim_abort_launch();
}

/* Saved at the launch's first access of any kind, not only its first
 * write: gcc's -fsanitize=thread instrumentation misses some stores (a
 * struct such as __half returned by a call and stored straight into memory,
 * seen at -O0), and such a store nearly always sits beside a load of the
 * same allocation (out[i] += ...), so this still rewinds what it wrote. */
static void device_access(alloc_entry *e, int kind)
{
    (void)kind;
    if (tracking && e->snap < 0) save_before(e);
}

void cusim_misaligned(const void *p, size_t n, int kind)
{
    char what[200];
    snprintf(what, sizeof what, "misaligned: an access of %zu bytes must be %zu-byte aligned (a GPU faults: "
             "cudaErrorMisalignedAddress)", n, n);
    bad_access(p, n, kind, what);
}

void cusim_access(const void *p, size_t n, int kind)
{
    uintptr_t a = (uintptr_t)p;
    char what[200];
    if (a - (uintptr_t)cusim_ex.dyn_region < CUSIM_DYN_REGION) {
        intptr_t off = (intptr_t)(a - (uintptr_t)cusim_ex.dyn);
        if (off < 0 || (size_t)off + n > cusim_ex.l->smem) {
            snprintf(what, sizeof what, "out of bounds of dynamic shared memory (offset %td of %zu bytes)",
                     off, cusim_ex.l->smem);
            bad_access(p, n, kind, what);
        }
        if (cusim_ex.racecheck) race_access(a, n, kind);
        return;
    }
    for (int i = 0; i < ncache; i++)
        if (a - (uintptr_t)cache[i].base < cache[i].size) {
            if (a + n - (uintptr_t)cache[i].base <= cache[i].size) {
                device_access(&cache[i], kind);
                return;
            }
            break; /* runs past its end: cusim_mem_lookup says how */
        }
    const segment *sg = static_segment(a);
    if (sg) {
        if (sg->writable && cusim_ex.racecheck) race_access(a, n, kind);
        return;
    }
    cusim_alloc_info info;
    switch (cusim_mem_lookup(p, n, &info)) {
    case CUSIM_MEM_DEVICE:
        if (a + n > (uintptr_t)info.base + info.size) break;
        if (info.device != cusim_ex.l->device) {
            snprintf(what, sizeof what, "device memory of device %d, but the kernel runs on device %d",
                     info.device, cusim_ex.l->device);
            bad_access(p, n, kind, what);
        }
        if (ncache < NCACHE)
            victim = ncache++;
        else
            victim = (victim + 1) % NCACHE;
        cache[victim] = (alloc_entry){info.base, info.size, find_snap(info.base)};
        device_access(&cache[victim], kind);
        return;
    case CUSIM_MEM_INVALID: break;
    case CUSIM_MEM_OTHER:
        read_segments(); /* something may have been loaded since */
        if ((sg = static_segment(a))) {
            if (sg->writable && cusim_ex.racecheck) race_access(a, n, kind);
            return;
        }
        bad_access(p, n, kind, "not device memory nor shared memory (a host pointer passed to a kernel?)");
    }
    /* out of bounds of a device allocation, or freed memory */
    if (!info.base) bad_access(p, n, kind, "not in any device allocation (freed?)");
    long long off = (long long)(a - (uintptr_t)info.base);
    if (info.freed)
        snprintf(what, sizeof what,
                 "device allocation %p (%zu bytes) was freed: offset %lld (a use after free)", info.base,
                 info.size, off);
    else if (info.unmapped)
        snprintf(
            what, sizeof what,
            "an unmapped part of the range reserved at %p (%zu bytes): offset %lld (nothing mapped there, "
            "or mapped without access)",
            info.base, info.size, off);
    else
        snprintf(what, sizeof what, "out of bounds of device allocation %p (%zu bytes): offset %lld",
                 info.base, info.size, off);
    bad_access(p, n, kind, what);
}
