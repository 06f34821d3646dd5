/* exec.c — how the emulator runs a kernel launch: the sm_90 launch limits,
 * then every block of the grid in turn, each GPU thread of a block on its
 * own fiber, switched at __syncthreads and warp operations by a scheduler
 * whose order is chosen (in order, reversed, seeded random), and the
 * schedule comparison that runs a launch twice in different orders and
 * demands the same device memory afterwards.
 *
 * The scheduler works in rounds: every runnable thread runs, in the chosen
 * order, until it waits (barrier, warp op) or exits; threads released while
 * a round runs form the next round. Nothing preempts a thread between two
 * synchronisation points, so a data race on shared memory shows up as a
 * result that depends on the order, and the race checker (memcheck.c) names
 * it whichever order ran. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "exec_impl.h"

cusim_exec_state cusim_ex;
__thread cusim_thread *cusim_cur __attribute__((tls_model("initial-exec")));

/* ---- settings (environment, read once) ------------------------------------------------- */

typedef enum { ORDER_IN, ORDER_REVERSED, ORDER_RANDOM, ORDER_COMPARE } order_mode;

static struct {
    bool read;
    order_mode mode;
    uint64_t seed; /* random / compare: the first launch's seed */
    bool racecheck;
    uint64_t launches; /* launches run so far: advances the seed */
} cfg;

static void read_settings(void)
{
    if (cfg.read) return;
    cfg.read = true;
    cfg.mode = ORDER_COMPARE;
    cfg.seed = 0x5eedu;
    const char *s = getenv("EMBER_CUSIM_SEED");
    if (s && *s) cfg.seed = strtoull(s, NULL, 0);
    s = getenv("EMBER_CUSIM_SCHEDULE");
    if (s && *s) {
        if (!strcmp(s, "in-order"))
            cfg.mode = ORDER_IN;
        else if (!strcmp(s, "reversed"))
            cfg.mode = ORDER_REVERSED;
        else if (!strcmp(s, "compare"))
            cfg.mode = ORDER_COMPARE;
        else if (!strncmp(s, "random", 6) && (s[6] == 0 || s[6] == ':')) {
            cfg.mode = ORDER_RANDOM;
            if (s[6] == ':') cfg.seed = strtoull(s + 7, NULL, 0);
        } else
            fprintf(stderr,
                    "cusim: EMBER_CUSIM_SCHEDULE=%s is not in-order, reversed, random[:SEED] or compare; "
                    "using compare\n",
                    s);
    }
    s = getenv("EMBER_CUSIM_RACECHECK");
    cfg.racecheck = !(s && !strcmp(s, "0"));
}

/* splitmix64: the seed of launch n, and the random orders drawn from it */
static uint64_t mix(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* ---- launch limits ------------------------------------------------------------------------ */

static __thread char launch_msg[512];

const char *cusim_launch_error_message(void) { return launch_msg; }

static int bad_launch(int err, const cusim_launch *l, const char *fmt, unsigned a, unsigned long b)
{
    char what[256];
    snprintf(what, sizeof what, fmt, a, b);
    snprintf(launch_msg, sizeof launch_msg, "launch of %s with grid (%u,%u,%u) block (%u,%u,%u): %s",
             l->name ? l->name : "?", l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
             l->block[2], what);
    return err;
}

int cusim_check_launch(const cusim_launch *l, size_t max_dynamic_smem)
{
    const unsigned *g = l->grid, *b = l->block;
    static const unsigned block_max[3] = {1024, 1024, 64};
    static const unsigned grid_max[3] = {2147483647u, 65535, 65535};
    launch_msg[0] = 0;
    for (int d = 0; d < 3; d++) {
        if (b[d] == 0 || g[d] == 0)
            return bad_launch(cudaErrorInvalidConfiguration, l, "a zero dimension (%c)%.0lu", "xyz"[d], 0);
        if (b[d] > block_max[d])
            return bad_launch(cudaErrorInvalidConfiguration, l, "blockDim.%c is above sm_90's limit of %lu",
                              "xyz"[d], block_max[d]);
        if (g[d] > grid_max[d])
            return bad_launch(cudaErrorInvalidConfiguration, l, "gridDim.%c is above sm_90's limit of %lu",
                              "xyz"[d], grid_max[d]);
    }
    uint64_t threads = (uint64_t)b[0] * b[1] * b[2];
    if (threads > CUSIM_MAX_THREADS)
        return bad_launch(cudaErrorInvalidConfiguration, l,
                          "%u threads per block, above sm_90's limit of %lu", (unsigned)threads,
                          CUSIM_MAX_THREADS);
    if (l->smem > CUSIM_MAX_DYNAMIC_SMEM)
        return bad_launch(cudaErrorInvalidValue, l,
                          "%u bytes of dynamic shared memory, above sm_90's limit of %lu (227 KiB)",
                          (unsigned)l->smem, CUSIM_MAX_DYNAMIC_SMEM);
    if (l->smem > max_dynamic_smem)
        return bad_launch(cudaErrorInvalidValue, l,
                          "%u bytes of dynamic shared memory, above the kernel's limit of %lu (raise it with "
                          "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))",
                          (unsigned)l->smem, (unsigned long)max_dynamic_smem);
    return cudaSuccess;
}

/* ---- naming threads in reports ------------------------------------------------------------ */

/* "kernel K block (x,y,z)" */
static const char *block_name(char *buf, size_t n)
{
    const cusim_uint3 b = cusim_ex.block_idx;
    snprintf(buf, n, "kernel %s block (%u,%u,%u)", cusim_ex.l->name, b.x, b.y, b.z);
    return buf;
}

const char *cusim_who(const cusim_thread *t, char *buf, size_t n)
{
    char b[160];
    snprintf(buf, n, "%s thread (%u,%u,%u)", block_name(b, sizeof b), t->idx.x, t->idx.y, t->idx.z);
    return buf;
}

/* ---- threads and the scheduler ------------------------------------------------------------- */

void cusim_wake(cusim_thread *t)
{
    t->state = CUSIM_T_RUNNABLE;
    cusim_ex.ready[t->tid / 64] |= (uint64_t)1 << (t->tid % 64);
}

void cusim_block_current(void) { cusim_fiber_switch(&cusim_cur->fiber, &cusim_ex.sched, 0); }

void cusim_abort_launch(void)
{
    cusim_thread *t = cusim_cur;
    cusim_ex.failed = cusim_ex.aborted = true;
    t->state = CUSIM_T_STOPPED;
    cusim_fiber_switch(&t->fiber, &cusim_ex.sched, 1);
    abort(); /* never resumed */
}

static void release_barrier(void);

/* Said once per launch: CUDA requires every thread of the block at each
 * __syncthreads; one that has exited never arrives. */
static void report_exit_at_barrier(void)
{
    if (cusim_ex.reported_exit) return;
    const cusim_thread *gone = NULL, *waiting = NULL;
    for (unsigned i = 0; i < cusim_ex.nthreads && !(gone && waiting); i++) {
        const cusim_thread *t = &cusim_ex.threads[i];
        if (t->state == CUSIM_T_EXITED && !gone) gone = t;
        if (t->state == CUSIM_T_BARRIER && !waiting) waiting = t;
    }
    if (!gone || !waiting) return;
    char a[200];
    cusim_report(
        "%s exited while thread (%u,%u,%u) of its block waits at __syncthreads (%s:%d): every thread "
        "of a block must reach each __syncthreads",
        cusim_who(gone, a, sizeof a), waiting->idx.x, waiting->idx.y, waiting->idx.z, waiting->file,
        waiting->line);
    cusim_ex.reported_exit = true;
    cusim_ex.failed = true;
}

static void thread_exit(cusim_thread *t)
{
    t->state = CUSIM_T_EXITED;
    cusim_ex.live--;
    cusim_warps_thread_exits(t);
    if (cusim_ex.arrived > 0) {
        report_exit_at_barrier();
        if (cusim_ex.arrived == cusim_ex.live)
            release_barrier(); /* as the hardware would: exited threads count */
    }
    cusim_fiber_switch(&t->fiber, &cusim_ex.sched, 1);
    abort(); /* never resumed */
}

/* Every thread of the block starts here, on its fiber. */
static void thread_main(void *arg)
{
    cusim_thread *t = arg;
    cusim_ex.l->run(cusim_ex.l->args);
    thread_exit(t);
}

static void run_thread(cusim_thread *t)
{
    cusim_cur = t;
    cusim_fiber_switch(&cusim_ex.sched, &t->fiber, 0);
    cusim_cur = NULL;
}

/* No thread can run but some have not exited: each waits for another. */
static void report_deadlock(void)
{
    char buf[900], who[200], where[200];
    size_t n = 0;
    int shown = 0;
    for (unsigned i = 0; i < cusim_ex.nthreads && shown < 4; i++) {
        const cusim_thread *t = &cusim_ex.threads[i];
        if (t->state != CUSIM_T_BARRIER && t->state != CUSIM_T_WARP) continue;
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s thread (%u,%u,%u) %s", shown ? ";" : "", t->idx.x,
                              t->idx.y, t->idx.z, cusim_wait_text(t, where, sizeof where));
        if (n >= sizeof buf) n = sizeof buf - 1;
        shown++;
    }
    cusim_report("deadlock in %s: no thread can go on:%s%s", block_name(who, sizeof who), buf,
                 cusim_ex.live > (unsigned)shown ? "; ..." : "");
    cusim_ex.failed = cusim_ex.aborted = true;
}

/* Runs the block cusim_ex.block_idx to completion (or until the launch is aborted). */
static void run_block(order_mode order, uint64_t *rng)
{
    const cusim_launch *l = cusim_ex.l;
    unsigned n = cusim_ex.nthreads;
    memset(cusim_ex.ready, 0, sizeof cusim_ex.ready);
    for (unsigned i = 0; i < n; i++) {
        cusim_thread *t = &cusim_ex.threads[i];
        t->tid = i;
        t->idx =
            (cusim_uint3){i % l->block[0], i / l->block[0] % l->block[1], i / (l->block[0] * l->block[1])};
        t->warp = i / CUSIM_WARP;
        t->lane = i % CUSIM_WARP;
        t->file = NULL;
        t->line = t->column = 0;
        if (cusim_fiber_prepare(&t->fiber, thread_main, t) != 0) {
            cusim_report("kernel %s: no memory for the stack of a GPU thread", l->name);
            cusim_ex.failed = cusim_ex.aborted = true;
            return;
        }
        cusim_wake(t);
    }
    cusim_ex.live = n;
    cusim_ex.arrived = 0;
    cusim_warps_begin_block();
    cusim_mem_new_epoch();
    memset(cusim_ex.dyn, 0xff, l->smem); /* uninitialised shared memory reads as NaN / all ones */

    unsigned round[CUSIM_MAX_THREADS];
    while (!cusim_ex.aborted) {
        unsigned k = 0;
        for (unsigned w = 0; w < (n + 63) / 64; w++) {
            for (uint64_t bits = cusim_ex.ready[w]; bits; bits &= bits - 1)
                round[k++] = w * 64 + (unsigned)__builtin_ctzll(bits);
            cusim_ex.ready[w] = 0;
        }
        if (k == 0) {
            if (cusim_ex.live > 0) report_deadlock();
            return;
        }
        if (order == ORDER_REVERSED)
            for (unsigned i = 0; i < k / 2; i++) {
                unsigned x = round[i];
                round[i] = round[k - 1 - i];
                round[k - 1 - i] = x;
            }
        else if (order == ORDER_RANDOM)
            for (unsigned i = k - 1; i > 0; i--) {
                unsigned j = (unsigned)(mix(rng) % (i + 1)), x = round[i];
                round[i] = round[j];
                round[j] = x;
            }
        for (unsigned i = 0; i < k && !cusim_ex.aborted; i++) run_thread(&cusim_ex.threads[round[i]]);
    }
}

/* ---- barriers ----------------------------------------------------------------------------- */

static bool same_site(const cusim_thread *a, const cusim_thread *b)
{
    return a->line == b->line && a->column == b->column && (a->file == b->file || !strcmp(a->file, b->file));
}

/* Every live thread has arrived: all must be at the same __syncthreads. */
static void release_barrier(void)
{
    const cusim_thread *first = NULL;
    for (unsigned i = 0; i < cusim_ex.nthreads; i++) {
        cusim_thread *t = &cusim_ex.threads[i];
        if (t->state != CUSIM_T_BARRIER) continue;
        if (!first) {
            first = t;
        } else if (!same_site(first, t) && !cusim_ex.reported_divergence) {
            char a[200];
            cusim_report("barrier divergence in %s: it waits at __syncthreads %s:%d while thread (%u,%u,%u) "
                         "waits at __syncthreads %s:%d (threads of a block must meet at the same barrier)",
                         cusim_who(t, a, sizeof a), t->file, t->line, first->idx.x, first->idx.y,
                         first->idx.z, first->file, first->line);
            cusim_ex.reported_divergence = true;
            cusim_ex.failed = true;
        }
        cusim_wake(t);
    }
    cusim_ex.arrived = 0;
    cusim_mem_new_epoch();
}

void cusim_syncthreads(const char *file, int line, int column)
{
    cusim_thread *t = cusim_cur;
    t->state = CUSIM_T_BARRIER;
    t->file = file;
    t->line = line;
    t->column = column;
    cusim_ex.arrived++;
    if (cusim_ex.live < cusim_ex.nthreads) report_exit_at_barrier();
    if (cusim_ex.arrived == cusim_ex.live) release_barrier();
    cusim_block_current();
}

/* ---- what device code asks ------------------------------------------------------------------- */

cusim_uint3 cusim_thread_idx(void) { return cusim_cur->idx; }
cusim_uint3 cusim_block_idx(void) { return cusim_ex.block_idx; }
cusim_uint3 cusim_block_dim(void)
{
    const unsigned *b = cusim_ex.l->block;
    return (cusim_uint3){b[0], b[1], b[2]};
}
cusim_uint3 cusim_grid_dim(void)
{
    const unsigned *g = cusim_ex.l->grid;
    return (cusim_uint3){g[0], g[1], g[2]};
}
void *cusim_dynamic_shared(void) { return cusim_ex.dyn; }
void cusim_copy_args(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

void cusim_trap(const char *file, int line)
{
    char a[200];
    cusim_report("%s: __trap() at %s:%d", cusim_who(cusim_cur, a, sizeof a), file, line);
    cusim_abort_launch();
}

/* ---- the launch ---------------------------------------------------------------------------- */

/* The order blocks run in: 0, 1, ... (or backwards), or for a random
 * schedule a seeded permutation of the linear block index: an affine map
 * and an xorshift (both bijections on k bits), skipping values >= n. */
typedef struct block_order {
    order_mode mode;
    uint64_t n, next, mask, a, c, a2, c2;
    unsigned half;
} block_order;

static void order_init(block_order *o, order_mode mode, uint64_t n, uint64_t *rng)
{
    memset(o, 0, sizeof *o);
    o->mode = mode;
    o->n = n;
    unsigned k = 1;
    while (k < 63 && ((uint64_t)1 << k) < n) k++;
    o->mask = ((uint64_t)1 << k) - 1;
    o->half = (k + 1) / 2;
    o->a = mix(rng) | 1;
    o->c = mix(rng);
    o->a2 = mix(rng) | 1;
    o->c2 = mix(rng);
}

/* The next block's linear index, or false when all have run. */
static bool order_next(block_order *o, uint64_t *b)
{
    if (o->mode != ORDER_RANDOM) {
        if (o->next >= o->n) return false;
        *b = o->mode == ORDER_REVERSED ? o->n - 1 - o->next : o->next;
        o->next++;
        return true;
    }
    while (o->next <= o->mask) {
        uint64_t x = (o->a * o->next++ + o->c) & o->mask;
        x ^= x >> o->half;
        x = (o->a2 * x + o->c2) & o->mask;
        if (x < o->n) {
            *b = x;
            return true;
        }
    }
    return false;
}

static bool setup(void)
{
    if (!cusim_ex.threads) {
        cusim_ex.threads = calloc(CUSIM_MAX_THREADS, sizeof *cusim_ex.threads);
        cusim_ex.dyn_region = aligned_alloc(64, CUSIM_DYN_REGION);
        if (!cusim_ex.threads || !cusim_ex.dyn_region) {
            free(cusim_ex.threads);
            free(cusim_ex.dyn_region);
            cusim_ex.threads = NULL;
            return false;
        }
        cusim_ex.dyn = cusim_ex.dyn_region + CUSIM_DYN_REDZONE;
    }
    return true;
}

/* One run of every block of l in the given order. */
static int run_launch(const cusim_launch *l, order_mode mode, uint64_t seed)
{
    cusim_ex.l = l;
    cusim_ex.nthreads = l->block[0] * l->block[1] * l->block[2];
    cusim_ex.nwarps = (cusim_ex.nthreads + CUSIM_WARP - 1) / CUSIM_WARP;
    cusim_ex.failed = cusim_ex.aborted = false;
    cusim_ex.reported_exit = cusim_ex.reported_divergence = cusim_ex.reported_race = false;
    cusim_ex.fp_atomics = false;
    cusim_ex.racecheck = cfg.racecheck;
    cusim_mem_begin_launch();
    uint64_t rng = seed;
    block_order o;
    order_init(&o, mode, (uint64_t)l->grid[0] * l->grid[1] * l->grid[2], &rng);
    uint64_t b;
    while (!cusim_ex.aborted && order_next(&o, &b)) {
        cusim_ex.block_idx =
            (cusim_uint3){(unsigned)(b % l->grid[0]), (unsigned)(b / l->grid[0] % l->grid[1]),
                          (unsigned)(b / ((uint64_t)l->grid[0] * l->grid[1]))};
        run_block(mode, &rng);
    }
    return cusim_ex.failed ? cudaErrorLaunchFailure : cudaSuccess;
}

/* Kernels told once that their floating-point atomics exempt them from the comparison. */
static void note_fp_atomics(const char *name)
{
    static const char *told[64];
    static int ntold;
    for (int i = 0; i < ntold; i++)
        if (!strcmp(told[i], name)) return;
    if (ntold < 64) told[ntold++] = name;
    fprintf(
        stderr,
        "cusim: note: kernel %s used floating-point atomics, whose sums depend on the order on a GPU too: "
        "its launches are not compared across schedules\n",
        name);
}

/* ---- EMBER_CUSIM_PROFILE=1: where the emulator's time goes, per kernel --------------------- */

typedef struct kernel_time {
    const char *name;
    uint64_t launches, threads;
    double seconds;
} kernel_time;

static kernel_time prof[256];
static int nprof;

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_time(const void *a, const void *b)
{
    double x = ((const kernel_time *)a)->seconds, y = ((const kernel_time *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void print_profile(void)
{
    qsort(prof, (size_t)nprof, sizeof *prof, by_time);
    fprintf(stderr, "cusim profile (pid %d): seconds, launches, threads per launch, kernel\n", (int)getpid());
    for (int i = 0; i < nprof; i++)
        fprintf(stderr, "  %8.3f %8" PRIu64 " %10.0f  %s\n", prof[i].seconds, prof[i].launches,
                (double)prof[i].threads / (double)prof[i].launches, prof[i].name);
}

static void profile(const cusim_launch *l, double seconds)
{
    int i = 0;
    while (i < nprof && strcmp(prof[i].name, l->name)) i++;
    if (i == nprof) {
        if (nprof == (int)(sizeof prof / sizeof prof[0])) return;
        if (nprof == 0) atexit(print_profile);
        prof[nprof++] = (kernel_time){.name = l->name};
    }
    prof[i].launches++;
    prof[i].threads += (uint64_t)l->grid[0] * l->grid[1] * l->grid[2] * l->block[0] * l->block[1] * l->block[2];
    prof[i].seconds += seconds;
}

static int exec_launch(const cusim_launch *l);

int cusim_exec(const cusim_launch *l)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("EMBER_CUSIM_PROFILE");
        on = v && !strcmp(v, "1");
    }
    if (!on) return exec_launch(l);
    double t0 = seconds_now();
    int rc = exec_launch(l);
    profile(l, seconds_now() - t0);
    return rc;
}

static int exec_launch(const cusim_launch *l)
{
    read_settings();
    if (!setup()) {
        cusim_report("kernel %s: no memory to run it", l->name);
        return cudaErrorLaunchFailure;
    }
    uint64_t launch_no = cfg.launches++, seed_state = cfg.seed + launch_no;
    uint64_t seed = mix(&seed_state);
    if (cfg.mode != ORDER_COMPARE) return run_launch(l, cfg.mode, seed);

    /* compare: in order, then again from the same memory in a random order */
    cusim_snap_begin();
    int rc = run_launch(l, ORDER_IN, 0);
    if (rc == cudaSuccess && cusim_ex.fp_atomics) note_fp_atomics(l->name);
    if (rc != cudaSuccess || cusim_ex.fp_atomics) {
        cusim_snap_end();
        return rc;
    }
    if (cusim_snap_rewind() != 0) { /* too much to compare: the in-order run stands */
        cusim_snap_end();
        return rc;
    }
    rc = run_launch(l, ORDER_RANDOM, seed);
    if (rc == cudaSuccess && !cusim_ex.fp_atomics && cusim_snap_compare() != 0) {
        fprintf(stderr,
                "cusim: (launch %" PRIu64
                " of this process; EMBER_CUSIM_SCHEDULE=random EMBER_CUSIM_SEED=%" PRIu64
                " runs the same random order at this launch)\n",
                launch_no, cfg.seed);
        rc = cudaErrorLaunchFailure;
    }
    cusim_snap_end();
    return rc;
}
