/* shm.c — collectives through a shared-memory segment, for a group whose
 * ranks are all on one machine.
 *
 * The segment (one per group, made by rank 0, mapped by all, unlinked as
 * soon as everyone has it) holds a control block per rank and a data slot
 * per rank. A control block has a step counter that only grows: "arrive(v)"
 * publishes that this rank finished step v (a release store), "wait(q, v)"
 * waits until rank q's counter reached v (an acquire load). Every rank runs
 * the same sequence of steps for a call, so the numbers line up.
 *
 * The check. Each rank writes the header of its call into its control block
 * (two header places, used alternately by call number) and arrives; once all
 * arrived, every rank compares every header with rank 0's and, on a
 * mismatch, fails with the same message the TCP check gives. When only the
 * send/recv totals disagree (a send is unreceived), every rank writes its
 * counts per peer into its slot and arrives once more, and all name the
 * unreceived send the same way. Arriving at a call's check also says "I
 * finished the previous call", so after the check every slot is free again.
 *
 * A note. A rank whose call fails writes its reason into the segment's note
 * (the first one stays) and wakes the sleepers; a waiting rank looks at it
 * between sleeps, and at the sockets of the rank it waits for, where a
 * send or recv frame sent to it instead of this collective is a mismatch
 * (wire.c, peer_watch).
 *
 * The data. A slot is two halves; data moves in pieces of at most a half
 * (512 KiB for a message larger than a half), alternating halves so a
 * rank can fill piece j while others still read piece j-1. all_reduce of
 * piece j on rank r:
 *     1. copy the piece into my half, except sub-range r (nobody else reads it)
 *     2. arrive; wait for all
 *     3. reduce sub-range r over every rank's copy, in rank order, into my
 *        tensor and into my half for the others
 *     4. arrive; wait for all
 *     5. copy every other sub-range's result from its owner's half
 * Each element is reduced once, by one rank, so every rank ends with the
 * same bits. Pieces are small enough (L2-sized) that what one rank writes is
 * still in cache when the other reads it. Refilling a half needs no wait
 * of its own: everyone read piece j-2 before arriving at step 2 of piece
 * j-1.
 * The first piece goes in with the check (step 1 before it, step 2 is its
 * arrival) when this rank knows a half nobody can still be reading: after
 * an all_reduce, the other half than its last piece's; after a call without
 * data, either. So a one-piece all_reduce costs two waits, and a tiny one
 * (every rank reduces everything, in the same order) one.
 *
 * Waiting spins briefly (the peer usually runs on another core), then yields
 * (it may need this core), then sleeps on a futex on the peer's counter in
 * short slices, between which it checks the note, the deadline and the
 * peer's socket: a peer that died, or broke its group, has closed it. A rank
 * notes the CPU it runs on in its control block; a waiter that finds its
 * peer last ran on its own CPU yields at once instead of spinning.
 *
 * Tried for all_reduce and not kept, 100 MiB at 2 ranks on a 2-core Zen 5
 * VM whose two vCPUs at times share no cache ("slow": their exchange
 * through the caches about 40 GB/s against 85-90, bench_allreduce prints
 * it; shm then takes 8.0-9.3 ms beside a 3.2-3.7 ms memory pass, against
 * 6.0-6.6 beside 5.0-5.6 when "fast"):
 * - prefetching the other rank's pieces a block ahead: 1.1-1.2x the time;
 * - this rank's half written with non-temporal stores, so the other reads
 *   it from memory: 0.90-0.95x slow, 1.4-1.9x fast (50-60 runs each);
 * - pieces of 256 KiB or 1 MiB: within 3-5% of 512 KiB either way;
 * - piece j's copy-back interleaved with piece j+1's fill in 4-64 KiB
 *   chunks: 0.96x fast, 1.03-1.14x slow;
 * - PREFETCHW of the fill's lines 1-4 KiB ahead: 1.4-1.5x slow;
 * - a ring of 8 or 64 pieces (4 or 32 MiB a rank) instead of two halves,
 *   so a line is rewritten long after the other read it: no gain slow
 *   (8.4-9.5 and 8.4-9.1 ms), the 64 ring 8.3-11.8 ms fast (cold lines);
 * - a single copy through the kernel (process_vm_readv of the other's
 *   tensor): 17 ms on 4 KiB pages; on transparent huge pages 0.6-0.9x
 *   slow, 1.4-1.5x fast;
 * - a single copy in user space, every rank's tensor in memory all map
 *   (a MAP_SHARED prototype: my half reduced reading the other's in
 *   place, its half copied with non-temporal stores): 4.6-4.7 ms slow,
 *   but the next pass writing the tensor then took 6.9 ms instead of 3.5,
 *   the other core's caches holding its lines (the saving moves to the
 *   tensor's next writer); each line read flushed (CLFLUSHOPT): 6.1-6.5
 *   ms slow with the next pass unharmed, but 11.0 fast (unflushed 8.1).
 * shm shares only its segment's lines and pays for them inside the call. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dist/pg_impl.h"
#include "tensor/error_impl.h"

#define SLOT_BYTES ((size_t)2 << 20)    /* per rank: two halves of 1 MiB */
#define PIECE_BYTES ((size_t)512 << 10) /* a piece of a message larger than a half (L2-sized) */
#define TINY_BYTES ((size_t)16 << 10) /* below this, every rank reduces everything */
#define SPIN_S 20e-6                  /* seconds of spinning, */
#define YIELD_S 200e-6                /* then of yielding, before sleeping */
#define SLEEP_NS 1000000L             /* one futex sleep */

typedef struct shm_ctl {
    _Atomic uint32_t step;     /* steps this rank finished (wraps; compared as a difference) */
    _Atomic uint32_t sleepers; /* ranks asleep on `step` */
    call_header hdr[2];        /* this rank's call #seq is in hdr[seq & 1] */
    _Atomic int32_t cpu;       /* the CPU this rank last ran on when it arrived or waited */
    char pad[128 - 12 - 2 * sizeof(call_header)];
} shm_ctl;
_Static_assert(sizeof(shm_ctl) == 128, "a control block fills two cache lines");
_Static_assert(SHM_MAX_WORLD * sizeof(p2p_count) <= SLOT_BYTES / 2, "a rank's counts fit in half its slot");

/* The note of the first rank whose call failed, after the control blocks. */
typedef struct shm_note {
    _Atomic uint32_t state; /* 0: none; 1: being written; 2: written */
    int32_t origin;         /* the rank the group broke on */
    char text[512];
} shm_note;

static size_t ctl_bytes(int world)
{
    return ((size_t)world * sizeof(shm_ctl) + sizeof(shm_note) + 4095) & ~(size_t)4095;
}

static shm_note *note_of(const em_pg *pg) { return (shm_note *)(pg->shm->ctl + pg->world); }

size_t shm_bytes(int world) { return ctl_bytes(world) + (size_t)world * SLOT_BYTES; }

/* ---- the segment ----------------------------------------------------------------- */

static em_status attach(em_pg *pg, int fd, const char *name)
{
    size_t size = shm_bytes(pg->world);
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED)
        return em_err(EM_ERR_DIST, "shared memory: rank %d cannot map %s: %s", pg->rank, name, strerror(errno));
    shm_seg *s = calloc(1, sizeof *s);
    if (!s) {
        munmap(base, size);
        return em_err(EM_ERR_OOM, "shared memory: out of memory");
    }
    *s = (shm_seg){.base = base, .size = size, .ctl = base, .data = (uint8_t *)base + ctl_bytes(pg->world),
                   .slot = SLOT_BYTES};
    s->busy = s->staged = -1; /* nothing read yet; nothing staged */
    pg->shm = s;
    return EM_OK;
}

em_status shm_create(em_pg *pg, char *name, size_t n)
{
    uint8_t r[8];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return em_err(EM_ERR_DIST, "shared memory: cannot get random bytes: %s", strerror(errno));
    snprintf(name, n, "/ember-%d-%02x%02x%02x%02x%02x%02x%02x%02x", (int)getpid(), r[0], r[1], r[2], r[3], r[4],
             r[5], r[6], r[7]);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return em_err(EM_ERR_DIST, "shared memory: cannot create %s: %s", name, strerror(errno));
    /* reserve the pages now: a full /dev/shm is an error here, not a SIGBUS later */
    int e = ftruncate(fd, (off_t)shm_bytes(pg->world)) ? errno : posix_fallocate(fd, 0, (off_t)shm_bytes(pg->world));
    if (e) {
        close(fd);
        shm_unlink(name);
        return em_err(EM_ERR_DIST, "shared memory: cannot reserve %zu bytes for %s: %s", shm_bytes(pg->world), name,
                      strerror(e));
    }
    em_status s = attach(pg, fd, name);
    if (s) shm_unlink(name);
    for (int r = 0; !s && r < pg->world; r++) atomic_store(&pg->shm->ctl[r].cpu, -1); /* no CPU known yet */
    return s;
}

em_status shm_map(em_pg *pg, const char *name)
{
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return em_err(EM_ERR_DIST, "shared memory: rank %d cannot open %s: %s", pg->rank, name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || (size_t)st.st_size != shm_bytes(pg->world)) {
        close(fd);
        return em_err(EM_ERR_DIST, "shared memory: %s is not a segment for %d ranks", name, pg->world);
    }
    return attach(pg, fd, name);
}

void shm_unmap(em_pg *pg)
{
    if (!pg->shm) return;
    munmap(pg->shm->base, pg->shm->size);
    free(pg->shm);
    pg->shm = NULL;
}

/* ---- steps --------------------------------------------------------------------------- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static bool reached(uint32_t have, uint32_t want) { return (int32_t)(have - want) >= 0; }

/* Notes the CPU this rank runs on, for peers deciding whether to spin. */
static int note_cpu(shm_ctl *me)
{
    int cpu = sched_getcpu();
    if (atomic_load_explicit(&me->cpu, memory_order_relaxed) != cpu)
        atomic_store_explicit(&me->cpu, cpu, memory_order_relaxed);
    return cpu;
}

static void arrive(em_pg *pg, uint32_t v)
{
    shm_ctl *me = &pg->shm->ctl[pg->rank];
    note_cpu(me);
    atomic_store(&me->step, v); /* seq_cst: ordered before the load of sleepers */
    if (atomic_load(&me->sleepers)) syscall(SYS_futex, &me->step, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    pg->shm->step = v;
}

/* The note, when a rank wrote one: c fails naming its reason. */
static em_status noted(em_pg *pg, call *c)
{
    shm_note *n = note_of(pg);
    if (atomic_load_explicit(&n->state, memory_order_acquire) != 2) return EM_OK;
    char text[sizeof n->text];
    snprintf(text, sizeof text, "%.*s", (int)sizeof n->text - 1, n->text);
    return call_broke(pg, c, n->origin, text);
}

void shm_abort(em_pg *pg, const call *c)
{
    shm_note *n = note_of(pg);
    uint32_t none = 0;
    if (!atomic_compare_exchange_strong(&n->state, &none, 1)) return; /* the first note stays */
    bool relay = pg->abort_origin >= 0;
    n->origin = relay ? pg->abort_origin : pg->rank;
    snprintf(n->text, sizeof n->text, "%s", relay ? pg->abort_text : c->msg);
    atomic_store_explicit(&n->state, 2, memory_order_release);
    for (int q = 0; q < pg->world; q++) /* sleepers look now, not at their next slice */
        if (atomic_load(&pg->shm->ctl[q].sleepers))
            syscall(SYS_futex, &pg->shm->ctl[q].step, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static em_status wait_rank(em_pg *pg, call *c, int q, uint32_t v, double deadline)
{
    shm_ctl *o = &pg->shm->ctl[q], *me = &pg->shm->ctl[pg->rank];
    double start = 0;
    bool yielding = false;
    for (int i = 0;; i++) {
        if (reached(atomic_load_explicit(&o->step, memory_order_acquire), v)) return EM_OK;
        if ((i & 63) == 0 || yielding) {
            double now = pg_now();
            if (start == 0) start = now;
            if (now - start >= YIELD_S) break;
            /* q last ran on this CPU, so it is not running now: spinning
             * would only keep it off. Yield instead (at once, to q when it
             * is next), staying runnable, so the scheduler sees two busy
             * ranks on one CPU and moves one to another */
            int cpu = note_cpu(me); /* -1: unknown */
            yielding = now - start >= SPIN_S ||
                       (cpu >= 0 && atomic_load_explicit(&o->cpu, memory_order_relaxed) == cpu);
            if (yielding) sched_yield();
        }
        cpu_relax();
    }
    for (;;) {
        atomic_fetch_add(&o->sleepers, 1);
        uint32_t cur = atomic_load(&o->step);
        if (!reached(cur, v)) {
            struct timespec ts = {0, SLEEP_NS};
            syscall(SYS_futex, &o->step, FUTEX_WAIT, cur, &ts, NULL, 0);
        }
        atomic_fetch_sub(&o->sleepers, 1);
        if (reached(atomic_load_explicit(&o->step, memory_order_acquire), v)) return EM_OK;
        bool closed = false;
        em_status s = noted(pg, c);
        if (!s) s = peer_watch(pg, c, q, deadline, &closed);
        if (s) return s;
        if (closed) { /* it may have arrived and then exited between the two looks */
            if (reached(atomic_load_explicit(&o->step, memory_order_acquire), v)) return EM_OK;
            return peer_io_error(pg, c, q, "waiting for", 0);
        }
        if (pg_now() >= deadline) return peer_timed_out(pg, c, q, "for");
    }
}

static em_status wait_all(em_pg *pg, call *c, uint32_t v, double deadline)
{
    for (int q = 0; q < pg->world; q++)
        if (q != pg->rank) {
            em_status s = wait_rank(pg, c, q, v, deadline);
            if (s) return s;
        }
    return EM_OK;
}

static uint8_t *half(const em_pg *pg, int rank, uint32_t j);

/* ---- the check ---------------------------------------------------------------------- */

static void stage(em_pg *pg, call *c);

em_status shm_check(em_pg *pg, call *c, double deadline)
{
    int w = pg->world;
    uint32_t v = pg->shm->step + 1;
    pg->shm->staged = -1;
    if (c->h.kind == CALL_ALL_REDUCE && !c->h.cuda && pg->shm->busy != 2) stage(pg, c);
    pg->shm->ctl[pg->rank].hdr[c->h.seq & 1] = c->h;
    arrive(pg, v);
    em_status s = wait_all(pg, c, v, deadline);
    if (s) return s;
    pg->shm->busy = -1; /* everyone finished the previous call; what this one reads, its algorithm says */
    call_header hs[SHM_MAX_WORLD];
    for (int r = 0; r < w; r++) hs[r] = pg->shm->ctl[r].hdr[c->h.seq & 1];
    char msg[512];
    int verdict = calls_compare(hs, w, msg, sizeof msg);
    if (verdict == CMP_OK) return EM_OK;
    if (noted(pg, c)) return c->status; /* a rank that failed says why */
    if (verdict == CMP_COUNTS) {        /* name the unreceived sends: everyone's counts, through the slots */
        p2p_row(pg, (p2p_count *)half(pg, pg->rank, 0));
        arrive(pg, v + 1);
        if ((s = wait_all(pg, c, v + 1, deadline))) return s;
        const p2p_count *rows[SHM_MAX_WORLD];
        for (int r = 0; r < w; r++) rows[r] = (const p2p_count *)half(pg, r, 0);
        p2p_compose(hs, rows, w, msg, sizeof msg);
    }
    return call_fail(c, EM_ERR_DIST, "%s", msg);
}

/* ---- the algorithms ----------------------------------------------------------------- */

static uint8_t *half(const em_pg *pg, int rank, uint32_t j)
{
    return pg->shm->data + (size_t)rank * pg->shm->slot + (j & 1) * (pg->shm->slot / 2);
}

/* Elements of a piece (a multiple of 64 bytes in every dtype): 512 KiB,
 * except that an all_reduce of n elements that fit in a half moves as one
 * piece (fewer waits; larger pieces measured slower for large messages). */
static int64_t piece_elems(size_t es) { return (int64_t)(PIECE_BYTES / es); }
static int64_t all_reduce_piece(const em_pg *pg, size_t es, int64_t n)
{
    return (size_t)n * es <= pg->shm->slot / 2 ? n : piece_elems(es);
}

/* Sub-range k of m elements split over w ranks: [lo, hi). */
static int64_t split(int64_t m, int w, int k) { return m * k / w; }

/* Sub-range of piece j (m elements) that rank k reduces: [lo, hi). */
static void sub_range(int64_t m, int w, int k, int64_t *lo, int64_t *hi)
{
    *lo = split(m, w, k);
    *hi = split(m, w, k + 1);
}

/* Copies piece j (m elements at tj) into my half, all but my own sub-range
 * (or all of it on the tiny path). */
static void fill(em_pg *pg, call *c, int h, const uint8_t *tj, int64_t m, bool tiny)
{
    size_t es = em_dtype_size((em_dtype)c->h.dtype);
    uint8_t *mine = half(pg, pg->rank, (uint32_t)h);
    if (tiny) {
        memcpy(mine, tj, (size_t)m * es);
        return;
    }
    int64_t lo, hi;
    sub_range(m, pg->world, pg->rank, &lo, &hi);
    memcpy(mine, tj, (size_t)lo * es);
    memcpy(mine + hi * (int64_t)es, tj + hi * (int64_t)es, (size_t)(m - hi) * es);
}

static bool is_tiny(const call *c)
{
    return (size_t)c->h.count * em_dtype_size((em_dtype)c->h.dtype) <= TINY_BYTES;
}

/* With the check: the first piece of an all_reduce into the half that the
 * previous call's readers do not touch (see the header comment). */
static void stage(em_pg *pg, call *c)
{
    int64_t pe = all_reduce_piece(pg, em_dtype_size((em_dtype)c->h.dtype), c->h.count);
    int h = pg->shm->busy == 0 ? 1 : 0;
    fill(pg, c, h, c->in, c->h.count < pe ? c->h.count : pe, is_tiny(c));
    pg->shm->staged = h;
}

static em_status all_reduce_tiny(em_pg *pg, call *c, double deadline)
{
    int w = pg->world, h = pg->shm->staged;
    em_dtype dt = (em_dtype)c->h.dtype;
    if (h < 0) {
        h = 0;
        fill(pg, c, h, c->in, c->h.count, true);
        uint32_t v = pg->shm->step + 1;
        arrive(pg, v);
        em_status s = wait_all(pg, c, v, deadline);
        if (s) return s;
    }
    const void *src[SHM_MAX_WORLD];
    for (int k = 0; k < w; k++) src[k] = half(pg, k, (uint32_t)h);
    reduce_sources(dt, c->h.op, w, c->in, src, w, c->h.count); /* everyone, the same order: the same bits */
    pg->shm->busy = h;
    return EM_OK;
}

/* The reduction of n elements over w sources, in rank order, into the
 * tensor t and into the segment at seg (for the other ranks). f32 sums
 * (DDP's gradients) go through an accumulator block in L1 and are written
 * to both places from there; other dtypes and ops take reduce_sources.
 * Either way element i is src[0][i] op src[1][i] op ... in that order. */
static void reduce_out(em_dtype dt, int op, int w, void *t, void *seg, const void *const *src, int64_t n)
{
    if (dt != EM_F32 || (op != EM_RED_SUM && op != EM_RED_AVG)) {
        reduce_sources(dt, op, w, t, src, w, n);
        memcpy(seg, t, (size_t)n * em_dtype_size(dt));
        return;
    }
    enum { BLOCK = 2048 };
    _Alignas(64) float acc[BLOCK];
    for (int64_t i = 0; i < n; i += BLOCK) {
        int m = n - i < BLOCK ? (int)(n - i) : BLOCK;
        const float *a = (const float *)src[0] + i, *b = (const float *)src[1] + i;
        for (int e = 0; e < m; e++) acc[e] = a[e] + b[e];
        for (int k = 2; k < w; k++) {
            const float *x = (const float *)src[k] + i;
            for (int e = 0; e < m; e++) acc[e] += x[e];
        }
        if (op == EM_RED_AVG)
            for (int e = 0; e < m; e++) acc[e] /= (float)w;
        memcpy((float *)t + i, acc, (size_t)m * sizeof *acc);
        memcpy((float *)seg + i, acc, (size_t)m * sizeof *acc);
    }
}

/* all_reduce in pieces, the steps of the header comment: piece j's are
 * a and a + 1, and piece 0's a was the check's when it was staged. Pieces
 * alternate halves from the first one's. */
static em_status all_reduce(em_pg *pg, call *c, double deadline)
{
    if (is_tiny(c)) return all_reduce_tiny(pg, c, deadline);
    int w = pg->world, me = pg->rank;
    bool staged = pg->shm->staged >= 0;
    int h0 = staged ? pg->shm->staged : 0;
    em_dtype dt = (em_dtype)c->h.dtype;
    size_t es = em_dtype_size(dt);
    int64_t n = c->h.count, pe = all_reduce_piece(pg, es, n);
    uint8_t *t = c->in;
    /* staged: the check's step was piece 0's step a */
    uint32_t s0 = pg->shm->step - (staged ? 1 : 0), np = (uint32_t)((n + pe - 1) / pe);
    const void *src[SHM_MAX_WORLD];
    em_status s;
    for (uint32_t j = 0; j < np; j++) {
        int64_t off = (int64_t)j * pe, m = n - off < pe ? n - off : pe, lo, hi;
        sub_range(m, w, me, &lo, &hi);
        uint32_t h = (uint32_t)h0 + j, a = s0 + 2 * j + 1;
        uint8_t *mine = half(pg, me, h), *tj = t + off * (int64_t)es;
        if (j > 0 || !staged) {
            fill(pg, c, (int)(h & 1), tj, m, false);
            arrive(pg, a);
            if ((s = wait_all(pg, c, a, deadline))) return s;
        }
        for (int k = 0; k < w; k++) src[k] = (k == me ? tj : half(pg, k, h)) + lo * (int64_t)es;
        reduce_out(dt, c->h.op, w, tj + lo * (int64_t)es, mine + lo * (int64_t)es, src, hi - lo);
        arrive(pg, a + 1);
        if ((s = wait_all(pg, c, a + 1, deadline))) return s;
        for (int k = 0; k < w; k++) {
            int64_t kl, kh;
            sub_range(m, w, k, &kl, &kh);
            if (k != me)
                memcpy(tj + kl * (int64_t)es, half(pg, k, h) + kl * (int64_t)es, (size_t)(kh - kl) * es);
        }
    }
    pg->shm->busy = (int)((h0 + np - 1) & 1);
    return EM_OK;
}

static em_status broadcast(em_pg *pg, call *c, double deadline)
{
    int root = c->h.root;
    size_t es = em_dtype_size((em_dtype)c->h.dtype);
    int64_t n = c->h.count, pe = piece_elems(es);
    uint8_t *t = c->in;
    uint32_t s0 = pg->shm->step, np = (uint32_t)((n + pe - 1) / pe);
    em_status s;
    for (uint32_t j = 0; j < np; j++) {
        int64_t off = (int64_t)j * pe, m = n - off < pe ? n - off : pe;
        uint32_t a = s0 + j + 1; /* root: piece j is in; others: piece j is read */
        if (pg->rank == root) {
            if (j >= 2 && (s = wait_all(pg, c, a - 2, deadline))) return s;
            memcpy(half(pg, root, j), t + off * (int64_t)es, (size_t)m * es);
        } else {
            if ((s = wait_rank(pg, c, root, a, deadline))) return s;
            memcpy(t + off * (int64_t)es, half(pg, root, j), (size_t)m * es);
        }
        arrive(pg, a);
    }
    pg->shm->busy = 2; /* peers may read either half still */
    return EM_OK;
}

/* all_gather (every rank takes every piece) or gather (only the root does). */
static em_status gather(em_pg *pg, call *c, bool all, double deadline)
{
    int w = pg->world, me = pg->rank;
    size_t es = em_dtype_size((em_dtype)c->h.dtype);
    int64_t n = c->h.count, pe = piece_elems(es);
    uint8_t *in = c->in, *out = c->out;
    uint32_t s0 = pg->shm->step, np = (uint32_t)((n + pe - 1) / pe);
    bool takes = all || me == c->h.root;
    em_status s;
    if (takes) memmove(out + (size_t)me * (size_t)n * es, in, (size_t)n * es);
    for (uint32_t j = 0; j < np; j++) {
        int64_t off = (int64_t)j * pe, m = n - off < pe ? n - off : pe;
        uint32_t a = s0 + 2 * j + 1; /* a: piece j is in; a + 1: piece j is read */
        if (j >= 2 && (s = wait_all(pg, c, a - 3, deadline))) return s;
        memcpy(half(pg, me, j), in + off * (int64_t)es, (size_t)m * es);
        arrive(pg, a);
        if (takes) {
            if ((s = wait_all(pg, c, a, deadline))) return s;
            for (int k = 0; k < w; k++)
                if (k != me) memcpy(out + ((int64_t)k * n + off) * (int64_t)es, half(pg, k, j), (size_t)m * es);
        }
        arrive(pg, a + 1);
    }
    pg->shm->busy = 2; /* peers may read either half still */
    return EM_OK;
}

/* in: w blocks of m elements; out: the reduction of block `rank`. */
static em_status reduce_scatter(em_pg *pg, call *c, double deadline)
{
    int w = pg->world, me = pg->rank;
    em_dtype dt = (em_dtype)c->h.dtype;
    size_t es = em_dtype_size(dt);
    int64_t m = c->h.count / w, pe = piece_elems(es) / w; /* a piece holds w parts of pe */
    uint8_t *in = c->in, *out = c->out;
    uint32_t s0 = pg->shm->step, np = (uint32_t)((m + pe - 1) / pe);
    const void *src[SHM_MAX_WORLD];
    em_status s;
    for (uint32_t j = 0; j < np; j++) {
        int64_t off = (int64_t)j * pe, len = m - off < pe ? m - off : pe;
        uint32_t a = s0 + 2 * j + 1;
        if (j >= 2 && (s = wait_all(pg, c, a - 3, deadline))) return s;
        uint8_t *mine = half(pg, me, j);
        for (int k = 0; k < w; k++) /* part k goes to rank k; my own part stays in `in` */
            if (k != me)
                memcpy(mine + (int64_t)k * pe * (int64_t)es, in + ((int64_t)k * m + off) * (int64_t)es,
                       (size_t)len * es);
        arrive(pg, a);
        if ((s = wait_all(pg, c, a, deadline))) return s;
        for (int k = 0; k < w; k++)
            src[k] = k == me ? in + ((int64_t)me * m + off) * (int64_t)es
                             : half(pg, k, j) + (int64_t)me * pe * (int64_t)es;
        reduce_sources(dt, c->h.op, w, out + off * (int64_t)es, src, w, len);
        arrive(pg, a + 1);
    }
    pg->shm->busy = 2; /* peers may read either half still */
    return EM_OK;
}

em_status shm_run(em_pg *pg, call *c, double deadline)
{
    switch (c->h.kind) {
    case CALL_ALL_REDUCE: return all_reduce(pg, c, deadline);
    case CALL_BROADCAST: return broadcast(pg, c, deadline);
    case CALL_ALL_GATHER: return gather(pg, c, true, deadline);
    case CALL_GATHER: return gather(pg, c, false, deadline);
    case CALL_REDUCE_SCATTER: return reduce_scatter(pg, c, deadline);
    default: return EM_OK; /* barrier: the check was the rendezvous */
    }
}
