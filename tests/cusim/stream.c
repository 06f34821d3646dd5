/* stream.c — the streams and events of ember's CUDA emulator (meson
 * -Dcuda=sim), and the queues of work they run: copies, memsets, kernel
 * launches and host functions. Set-up, devices and errors are runtime.c;
 * copies and memsets are built by copy.c and queued through rt_queue_copy /
 * rt_queue_memset.
 *
 * Nothing runs when it is called. Copies, memsets, launches and host
 * functions go on their stream's queue and run only when something orders
 * them: cudaStreamSynchronize, cudaDeviceSynchronize (every stream of the
 * device), cudaEventSynchronize, a blocking cudaMemcpy, cusim_stream_drain,
 * the copies CUDA completes before returning (device to pageable host
 * memory, host to host), cudaFree and cudaFreeHost (CUDA synchronises there
 * too), or a stream reaching a wait on an event, which first runs the
 * recording stream up to the event. So code that forgets an ordering sees
 * what a GPU may show it: a copy into pinned memory that has not landed
 * before the sync, a stream that reads what another writes without
 * cudaStreamWaitEvent reading the old data. cudaStreamQuery and
 * cudaEventQuery answer cudaErrorNotReady the first time they see pending
 * work and run it when asked again: polling loops end, and code that
 * assumes "done right after the launch" is caught.
 *
 * Each device has its legacy default stream (NULL). Its implicit
 * synchronisation with the device's blocking streams is NOT emulated: here
 * it is an ordinary stream (ember only uses non-blocking streams).
 *
 * Streams and events belong to the device current at their creation. A
 * wait on an event captures the event's last record at the call, as CUDA
 * does, so destroying or re-recording the event afterwards is safe.
 *
 * Work runs under cusim_lock with device memory open, on the host thread
 * that ordered it. After a kernel failed (the sticky error, runtime.c),
 * queued work no longer runs. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cusim_impl.h"
#include "runtime_impl.h"

typedef rt_stream stream;
typedef struct CUevent_st event;

typedef enum { ITEM_KERNEL, ITEM_COPY, ITEM_MEMSET, ITEM_WAIT, ITEM_HOST_FN } item_kind;

/* one piece of queued work */
struct item {
    item_kind kind;
    uint64_t seq;     /* its place in the stream: the stream's `done` once it ran */
    const char *what; /* the API that queued it, for fault messages */
    struct item *next;
    union {
        cusim_launch *launch;
        struct {
            void *dst;
            const void *src;
            size_t n;
            void *staging; /* pageable source copied at the call, or NULL */
        } copy;
        struct {
            void *dst;
            int value;
            size_t n;
        } set;
        struct {
            stream *on; /* run `on` up to seq first (we hold a reference on it) */
            uint64_t seq;
        } wait;
        struct {
            void (*fn)(void *);
            void *ctx;
            void (*free_ctx)(void *);
        } host;
    } u;
};

struct CUstream_st {
    int device;
    unsigned flags;
    bool legacy;    /* a device's NULL stream: never freed */
    bool destroyed; /* cudaStreamDestroy'd; freed once idle and unreferenced */
    bool running;   /* its queue is being run further up this thread's stack */
    bool polled;    /* cudaStreamQuery said NotReady for the pending work */
    struct item *head, *tail;
    uint64_t queued, done; /* items ever queued / ever run */
    int refs;              /* events recorded on it, waits on it */
};

struct CUevent_st {
    int device;
    unsigned flags;
    stream *on;   /* the stream of the last record (a reference), or NULL */
    uint64_t seq; /* complete once on->done >= seq */
    bool polled;  /* cudaEventQuery said NotReady for this record */
};

typedef struct item item;

/* a set of live handles (a handful: a linear search is fine) */
typedef struct handle_set {
    void **p;
    size_t n, cap;
} handle_set;

static stream legacy[CUSIM_MAX_DEVICES];
static handle_set streams; /* created streams, including destroyed ones still busy */
static handle_set events;

void rt_init_streams(void)
{
    for (int d = 0; d < CUSIM_MAX_DEVICES; d++) legacy[d] = (stream){.device = d, .legacy = true};
}

/* ---- handles ------------------------------------------------------------------------- */

static bool set_add(handle_set *s, void *x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        void **grown = realloc(s->p, cap * sizeof *grown);
        if (!grown) return false;
        s->p = grown;
        s->cap = cap;
    }
    s->p[s->n++] = x;
    return true;
}

static long set_find(const handle_set *s, const void *x)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->p[i] == x) return (long)i;
    return -1;
}

static void set_remove(handle_set *s, const void *x)
{
    long i = set_find(s, x);
    if (i >= 0) s->p[i] = s->p[--s->n];
}

/* s as a live stream (NULL: the current device's default stream), or NULL
 * after reporting; lock held */
static stream *get_stream(cudaStream_t s, const char *api)
{
    if (!s) return &legacy[cusim_current_device()];
    if (set_find(&streams, s) >= 0 && !s->destroyed) return s;
    cusim_report("%s: stream %p is not a live stream (destroyed, or never created)", api, (void *)s);
    return NULL;
}

static event *get_event(cudaEvent_t e, const char *api)
{
    if (e && set_find(&events, e) >= 0) return e;
    cusim_report("%s: event %p is not a live event (destroyed, or never created)", api, (void *)e);
    return NULL;
}

/* a destroyed stream is freed once nothing is queued on it or refers to it */
static void maybe_free_stream(stream *s)
{
    if (s->legacy || !s->destroyed || s->refs > 0 || s->head || s->running) return;
    set_remove(&streams, s);
    free(s);
}

static void release_stream(stream *s)
{
    s->refs--;
    maybe_free_stream(s);
}

int rt_stream_device(void *s)
{
    if (rt_begin() == cudaErrorNoDevice) return -1;
    cusim_lock();
    stream *st = get_stream(s, "stream");
    int dev = st ? st->device : -1;
    cusim_unlock();
    return dev;
}

/* ---- queues -------------------------------------------------------------------------- */

static item *new_item(item_kind kind, const char *what)
{
    item *it = calloc(1, sizeof *it);
    if (it) {
        it->kind = kind;
        it->what = what;
    }
    return it;
}

static void free_launch(cusim_launch *l)
{
    if (l->free_args) l->free_args(l->args);
    free(l);
}

static void free_item(item *it)
{
    switch (it->kind) {
    case ITEM_KERNEL: free_launch(it->u.launch); break;
    case ITEM_COPY: free(it->u.copy.staging); break;
    case ITEM_MEMSET: break;
    case ITEM_WAIT: release_stream(it->u.wait.on); break;
    case ITEM_HOST_FN:
        if (it->u.host.free_ctx) it->u.host.free_ctx(it->u.host.ctx);
        break;
    }
    free(it);
}

/* appends it to s; returns its place (lock held) */
static uint64_t enqueue(stream *s, item *it)
{
    it->seq = ++s->queued;
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    return it->seq;
}

static void run_until(stream *s, uint64_t seq);

/* runs one item (lock held, memory open); after a kernel failed nothing runs */
static void run_item(item *it)
{
    if (rt_sticky_error()) return;
    const char *was;
    switch (it->kind) {
    case ITEM_KERNEL: {
        char what[192];
        snprintf(what, sizeof what, "kernel %s", it->u.launch->name ? it->u.launch->name : "(unnamed)");
        was = mem_activity(what);
        int e = cusim_exec(it->u.launch);
        mem_activity(was);
        if (e) rt_set_sticky(e);
        break;
    }
    case ITEM_COPY:
        was = mem_activity(it->what);
        memcpy(it->u.copy.dst, it->u.copy.staging ? it->u.copy.staging : it->u.copy.src, it->u.copy.n);
        mem_activity(was);
        break;
    case ITEM_MEMSET:
        was = mem_activity(it->what);
        memset(it->u.set.dst, it->u.set.value, it->u.set.n);
        mem_activity(was);
        break;
    case ITEM_WAIT: run_until(it->u.wait.on, it->u.wait.seq); break;
    case ITEM_HOST_FN:
        was = mem_activity(it->what);
        it->u.host.fn(it->u.host.ctx);
        mem_activity(was);
        break;
    }
}

/* runs s's queue until s->done >= seq (lock held, memory open). A stream
 * already running further up this thread's stack is left alone: its order
 * is being kept there. */
static void run_until(stream *s, uint64_t seq)
{
    if (s->running) return;
    s->running = true;
    while (s->done < seq && s->head) {
        item *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        run_item(it);
        s->done = it->seq;
        free_item(it);
    }
    if (!s->head) s->polled = false;
    s->running = false;
}

/* runs s up to seq with device memory open; the sticky error or 0 */
static cudaError_t drain(stream *s, uint64_t seq)
{
    cusim_lock();
    if (s->done < seq && s->head && !s->running) {
        cusim_mem_open();
        run_until(s, seq);
        cusim_mem_close();
    }
    cusim_unlock();
    return rt_sticky_error();
}

/* the next stream of dev (any: dev < 0) with work that can run now, or NULL */
static stream *busy_stream(int dev)
{
    for (int d = 0, n = cusim_device_count(); d < n; d++)
        if ((dev < 0 || d == dev) && legacy[d].head && !legacy[d].running) return &legacy[d];
    for (size_t i = 0; i < streams.n; i++) {
        stream *s = streams.p[i];
        if ((dev < 0 || s->device == dev) && s->head && !s->running) return s;
    }
    return NULL;
}

void rt_drain_device(int dev)
{
    rt_init();
    cusim_lock();
    stream *s = busy_stream(dev);
    if (s) {
        cusim_mem_open();
        for (; s; s = busy_stream(dev)) {
            run_until(s, s->queued);
            maybe_free_stream(s);
        }
        cusim_mem_close();
    }
    cusim_unlock();
}

rt_stream *rt_get_stream(cudaStream_t s, const char *api) { return get_stream(s, api); }

uint64_t rt_queue_copy(rt_stream *s, const char *api, void *dst, const void *src, size_t n, void *staging)
{
    item *it = new_item(ITEM_COPY, api);
    if (!it) return 0;
    it->u.copy.dst = dst;
    it->u.copy.src = src;
    it->u.copy.n = n;
    it->u.copy.staging = staging;
    return enqueue(s, it);
}

uint64_t rt_queue_memset(rt_stream *s, const char *api, void *dst, int value, size_t n)
{
    item *it = new_item(ITEM_MEMSET, api);
    if (!it) return 0;
    it->u.set.dst = dst;
    it->u.set.value = value;
    it->u.set.n = n;
    return enqueue(s, it);
}

cudaError_t rt_drain(rt_stream *s, uint64_t seq) { return drain(s, seq); }

int cusim_stream_drain(void *stream_handle)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    cusim_lock();
    stream *s = get_stream(stream_handle, "cusim_stream_drain");
    e = s ? drain(s, s->queued) : cudaErrorInvalidResourceHandle;
    cusim_unlock();
    return rt_fail(e);
}

int cusim_enqueue_host_fn(void *stream_handle, void (*fn)(void *ctx), void *ctx, void (*free_ctx)(void *ctx))
{
    cudaError_t e = rt_begin();
    if (!e && !fn) e = cudaErrorInvalidValue;
    cusim_lock();
    stream *s = e ? NULL : get_stream(stream_handle, "cusim_enqueue_host_fn");
    item *it = s ? new_item(ITEM_HOST_FN, "host work") : NULL;
    if (it) {
        it->u.host.fn = fn;
        it->u.host.ctx = ctx;
        it->u.host.free_ctx = free_ctx;
        enqueue(s, it);
    } else {
        if (!e) e = s ? cudaErrorMemoryAllocation : cudaErrorInvalidResourceHandle;
        if (free_ctx) free_ctx(ctx);
    }
    cusim_unlock();
    return rt_fail(e);
}

/* ---- kernel launches ----------------------------------------------------------------- */

int cusim_launch_kernel(cusim_launch *l, void *stream_handle)
{
    cudaError_t e = rt_begin();
    if (e) {
        free_launch(l);
        return rt_fail(e);
    }
    int current = cusim_current_device();
    cusim_lock();
    stream *s = get_stream(stream_handle, "kernel launch");
    if (!s)
        e = cudaErrorInvalidResourceHandle;
    else if (s->device != current) {
        cusim_report("kernel launch of %s: stream %p belongs to cuda:%d but cuda:%d is current", l->name,
                     (void *)stream_handle, s->device, current);
        e = cudaErrorInvalidResourceHandle;
    }
    if (!e) {
        l->device = s->device;
        e = (cudaError_t)cusim_check_launch(l, rt_max_dynamic_smem(l->func));
    }
    item *it = e ? NULL : new_item(ITEM_KERNEL, "kernel");
    if (!e && !it) e = cudaErrorMemoryAllocation;
    if (e) {
        free_launch(l);
    } else {
        it->u.launch = l;
        enqueue(s, it);
    }
    cusim_unlock();
    return rt_fail(e);
}

/* ---- streams ------------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking)) return rt_fail(cudaErrorInvalidValue);
    stream *s = calloc(1, sizeof *s);
    if (!s) return rt_fail(cudaErrorMemoryAllocation);
    s->device = cusim_current_device();
    s->flags = flags;
    cusim_lock();
    bool ok = set_add(&streams, s);
    cusim_unlock();
    if (!ok) {
        free(s);
        return rt_fail(cudaErrorMemoryAllocation);
    }
    *out = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

/* As on CUDA, work still queued on the stream completes later (when
 * something orders it, e.g. cudaDeviceSynchronize); the handle is dead now. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    rt_init();
    cusim_lock();
    stream *st = s ? get_stream(s, "cudaStreamDestroy") : NULL;
    if (st) {
        st->destroyed = true;
        maybe_free_stream(st);
    }
    cusim_unlock();
    return st ? cudaSuccess : rt_fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    cusim_lock();
    stream *st = get_stream(s, "cudaStreamSynchronize");
    e = st ? drain(st, st->queued) : cudaErrorInvalidResourceHandle;
    cusim_unlock();
    return rt_fail(e);
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    cusim_lock();
    stream *st = get_stream(s, "cudaStreamQuery");
    if (!st)
        e = rt_fail(cudaErrorInvalidResourceHandle);
    else if (st->done < st->queued && !st->polled) {
        st->polled = true; /* not done yet; it will be when asked again */
        e = cudaErrorNotReady;
    } else {
        e = rt_fail(drain(st, st->queued));
    }
    cusim_unlock();
    return e;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    cudaError_t err = rt_begin();
    if (err) return err;
    if (flags != 0) return rt_fail(cudaErrorInvalidValue);
    cusim_lock();
    stream *st = get_stream(s, "cudaStreamWaitEvent");
    event *ev = st ? get_event(e, "cudaStreamWaitEvent") : NULL;
    if (!ev) {
        err = cudaErrorInvalidResourceHandle;
    } else if (ev->on && ev->on != st && ev->on->done < ev->seq) { /* else: nothing to wait for */
        item *it = new_item(ITEM_WAIT, "cudaStreamWaitEvent");
        if (!it) {
            err = cudaErrorMemoryAllocation;
        } else {
            it->u.wait.on = ev->on;
            it->u.wait.seq = ev->seq;
            ev->on->refs++;
            enqueue(st, it);
        }
    }
    cusim_unlock();
    return rt_fail(err);
}

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    rt_drain_device(cusim_current_device());
    return rt_fail(rt_sticky_error());
}

/* ---- events -------------------------------------------------------------------------- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned flags)
{
    cudaError_t e = rt_begin();
    if (e) return e;
    unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | 0x04 /* cudaEventInterprocess */;
    if (!out || (flags & ~known)) return rt_fail(cudaErrorInvalidValue);
    event *ev = calloc(1, sizeof *ev);
    if (!ev) return rt_fail(cudaErrorMemoryAllocation);
    ev->device = cusim_current_device();
    ev->flags = flags;
    cusim_lock();
    bool ok = set_add(&events, ev);
    cusim_unlock();
    if (!ok) {
        free(ev);
        return rt_fail(cudaErrorMemoryAllocation);
    }
    *out = ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, cudaEventDefault); }

/* Safe with waits still queued on it: a wait captured the record it needs. */
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    rt_init();
    cusim_lock();
    event *ev = get_event(e, "cudaEventDestroy");
    if (ev) {
        if (ev->on) release_stream(ev->on);
        set_remove(&events, ev);
        free(ev);
    }
    cusim_unlock();
    return ev ? cudaSuccess : rt_fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    cudaError_t err = rt_begin();
    if (err) return err;
    cusim_lock();
    event *ev = get_event(e, "cudaEventRecord");
    stream *st = ev ? get_stream(s, "cudaEventRecord") : NULL;
    if (!st) {
        err = cudaErrorInvalidResourceHandle;
    } else if (st->device != ev->device) {
        cusim_report("cudaEventRecord: event %p of cuda:%d recorded on stream %p of cuda:%d", (void *)e,
                     ev->device, (void *)s, st->device);
        err = cudaErrorInvalidResourceHandle;
    } else {
        st->refs++;
        if (ev->on) release_stream(ev->on);
        ev->on = st;
        ev->seq = st->queued; /* everything queued on st so far */
        ev->polled = false;
    }
    cusim_unlock();
    return rt_fail(err);
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    cudaError_t err = rt_begin();
    if (err) return err;
    cusim_lock();
    event *ev = get_event(e, "cudaEventQuery");
    if (!ev) {
        err = rt_fail(cudaErrorInvalidResourceHandle);
    } else if (ev->on && ev->on->done < ev->seq) {
        if (!ev->polled) {
            ev->polled = true; /* not yet; done when asked again */
            err = cudaErrorNotReady;
        } else {
            err = rt_fail(drain(ev->on, ev->seq));
        }
    }
    cusim_unlock();
    return err;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    cudaError_t err = rt_begin();
    if (err) return err;
    cusim_lock();
    event *ev = get_event(e, "cudaEventSynchronize");
    if (!ev)
        err = cudaErrorInvalidResourceHandle;
    else if (ev->on)
        err = drain(ev->on, ev->seq);
    cusim_unlock();
    return rt_fail(err);
}
