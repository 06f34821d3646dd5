/* zero.c — ZeRO stages 1-3: data parallelism where each rank keeps the
 * optimizer state (stage 1), also the averaged gradients (stage 2), and
 * also the parameters between uses (stage 3), of only its share of the
 * parameters.
 *
 * The share. DDP's buckets (dist/ddp.c) cut the flat gradient buffer into
 * slices; ZeRO cuts every bucket of n elements into `world` chunks of
 * c = ceil(n / world), and rank r owns chunk r of every bucket:
 *
 *   bucket b:   | rank 0's chunk | rank 1's chunk | ... | last (may be short) |
 *
 * A parameter lies in one bucket, so this rank owns at most one piece of it
 * (optim_set_piece): the optimizer keeps Adam's moments for that piece only
 * and updates only it. Owning chunks of buckets rather than one range of
 * the flat buffer makes the gradient's reduce-scatter a bucket's own call,
 * started the moment backward finishes the bucket, as DDP's all-reduce is.
 *
 *   stage 1: backward all-reduces the buckets as DDP does (every rank holds
 *            all the averaged gradients); the optimizer updates this rank's
 *            pieces; each bucket's parameters are all-gathered.
 *   stage 2: backward reduce-scatters the buckets instead: this rank gets the
 *            average of its chunk only, into its gradient shard, and the
 *            bucket's slice of the full gradient buffer is given back to the
 *            kernel (madvise) once the collective is done, so the full
 *            gradients are never all resident at once; zero_grad gives back
 *            the whole buffer. Clipping sums the squares of the shards and
 *            all-reduces that one number.
 *   stage 3: as stage 2, and the parameters too are kept whole only while
 *            they are used: after the step each rank gives back the memory
 *            of every parameter element outside its chunks; an op that
 *            reads a parameter (tensor/dispatch.h calls fetch for any input
 *            in the flat parameter buffer, forward or backward) first
 *            all-gathers the bucket it lies in. At most KEEP buckets are
 *            whole at once (least recently used evicted), and the bucket
 *            after the one fetched, in the direction the fetches go
 *            (forward walks the buckets down, backward up), is prefetched
 *            while the current one computes.
 *
 * Communication per step, in elements of the flat buffer (P): DDP's
 * all-reduce moves about 2P per rank; stage 2's reduce-scatter P and the
 * parameters' all-gather P, the same total; stage 1 adds the all-gather to
 * DDP's all-reduce. A bucket whose size is not a multiple of the world goes
 * through a padded copy (world * c), so every collective has equal chunks.
 *
 * On a CUDA device: the same buckets, chunks and collectives, through NCCL
 * on device buffers (dist/nccl.c); the pads and the gradient shard live on
 * the device, filled by copies queued on the compute stream (dev_copy,
 * dev_zero), and the optimizer updates each piece with one launch
 * (optim/optim.c). A cudaMalloc block cannot be given back in part, so
 * stages 2-3 keep the full gradient buffer allocated (zeroed once the
 * reduce-scatters are done, so it reads as on the CPU): there stage 2 saves
 * the optimizer state as stage 1 does, holds its gradient shard besides,
 * and moves less (a reduce-scatter instead of an all-reduce).
 *   Stage 3 on a device keeps the CPU's design, with CUDA's virtual memory
 * management (tensor/cuda_vmm.c) in place of madvise: at set-up the flat
 * parameters move into an address range reserved for them
 * (reserve_on_device; every view keeps its offsets, so nothing else
 * changes), cut into granules (2 MiB on current GPUs) each mapped to memory
 * of its own. evict unmaps the granules of a bucket that no one needs
 * (granule_needed: none of this rank's chunks, no bucket whole or being
 * gathered lies in them), once the kernels queued so far have read them
 * (cu_vrange_unmap waits on an event, not the host); gather_start maps the
 * bucket's granules before the all-gather writes them. A granule the ends
 * of a chunk share with other ranks' elements stays mapped: up to 2 per
 * bucket beyond this rank's share. The fetch hook, KEEP, the prefetch on
 * the communication stream (em_all_gather with a work handle: dist/nccl.c
 * orders it after the compute stream, and the compute stream waits for it
 * before the bucket is used) are the CPU's. em_zero_free copies the range
 * back into an ordinary block (unmapped parts read zeros).
 *
 * Offload (CUDA, stages 1-3): the optimizer state lives in host memory.
 * Each step copies this rank's chunk of every bucket's parameters and
 * averaged gradients to the host (hpar, hgrad: laid out as gshard), the
 * optimizer updates its pieces there (optim_set_piece's ppiece), and the
 * parameters go back to the device before the all-gather (offload_chunks;
 * stage 3: into its chunks, which stay mapped, gathered at the next use).
 *
 * Parameters of f32 or f64 only (stage 3: f32; f32 masters under mixed
 * precision), all on one device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "amp/amp_impl.h"
#include "dist/ddp_impl.h"
#include "dist/zero_impl.h"
#include "ember/dist.h"
#include "optim/optim_impl.h"
#include "optim/update_math.h"
#include "tensor/dispatch.h"
#include "tensor/profile_impl.h"
#include "tensor/tensor_impl.h"
#if EM_HAVE_CUDA
#include "optim/cuda_optim.h"
#include "tensor/cuda_impl.h"
#endif

typedef struct zbucket {
    em_dtype dtype;
    int64_t lo, n;   /* the bucket's slice of the flat buffers */
    int64_t c;       /* chunk: ceil(n / world) */
    int64_t own;     /* elements of this rank's chunk inside the bucket: [r*c, r*c + own) */
    int64_t at;      /* where its chunk starts in gshard, hpar and hgrad */
    em_tensor *params;  /* the bucket's slice of the flat parameters (n) */
    em_tensor *shard;   /* stage 2: this rank's c reduced gradients (a slice of gshard) */
    em_tensor *pad;     /* n % world != 0: world * c scratch, else NULL */
    em_work *work;      /* stage 2: the bucket's reduce-scatter in this backward */
    bool released;      /* stage 2: its gradient pages were given back */
    em_tensor *mine;    /* this rank's chunk (c) of params, or of pad: what it sends to the all-gather */
    /* stage 3: whether every element of the bucket's parameters is there,
     * the all-gather bringing them (a prefetch), and when it was last used */
    bool resident;
    em_work *gwork;
    uint64_t used;
} zbucket;

struct em_zero {
    em_pg *pg;
    em_module *model;
    em_optimizer *opt;
    em_ddp *ddp;
    bool owns_ddp;
    em_device dev; /* the model's: its flat buffers, pads and shard live there */
    int stage, world, rank;
    int nb;
    zbucket *b;
    em_tensor *gshard; /* stage 2: every bucket's chunk of reduced gradients, bucket after bucket */
    tensor **gpiece;   /* stage 2: per optimizer parameter, its piece's view of gshard (or NULL) */
    int npiece;
    /* offload (CUDA models): this rank's chunks of the parameters and of the
     * averaged gradients on the host, bucket after bucket as in gshard, and
     * per optimizer parameter its piece's view of hpar (gpiece: of hgrad) */
    bool offload;
    em_tensor *hpar, *hgrad;
    tensor **ppiece;
    /* stage 3: the flat parameters (f32), the use clock, the last bucket
     * fetched (for the prefetch's direction) */
    tensor *flat;
    uint64_t clock;
    int last;
    /* stage 3 on a CUDA device: the flat parameters' address range, whose
     * granules are mapped only while needed (tensor/cuda_vmm.c), its
     * granule size, and per granule whether one of this rank's chunks
     * lies in it (those stay mapped) */
    struct cu_vrange *vr;
    size_t gran;
    unsigned char *own_g;
};

/* Stage 3 keeps at most this many buckets of parameters whole at once: the
 * one in use, the one before it (a residual's), and the prefetched next. */
enum { KEEP = 3 };

/* Stages 2-3: buckets of gradients whose reduce-scatter may still be running
 * while backward fills the next one. */
enum { INFLIGHT = 2 };

/* Whether a stage 3 engine holds the dispatcher's fetch (one at a time). */
static bool fetching;

/* ---- bytes on the model's device ----------------------------------------------------- */

/* dst (on dd) = src (on sd), bytes: a host copy between host pointers,
 * else cu_memcpy (within a device: queued on its compute stream; to the
 * host: waits for the device; to a device: returns before it lands). */
static em_status xfer(void *dst, em_device dd, const void *src, em_device sd, size_t bytes)
{
#if EM_HAVE_CUDA
    if (dd.type == EM_CUDA || sd.type == EM_CUDA) return cu_memcpy(dst, dd, src, sd, bytes);
#endif
    (void)dd, (void)sd;
    memcpy(dst, src, bytes);
    return EM_OK;
}

/* dst = src (bytes, both on z's device): a host copy on the CPU; on CUDA a
 * copy queued on the device's compute stream, after the kernels that wrote
 * src and before the collectives started after it (dist/nccl.c). */
static em_status dev_copy(const em_zero *z, void *dst, const void *src, size_t bytes)
{
    return xfer(dst, z->dev, src, z->dev, bytes);
}

/* p[0, bytes) = 0 on z's device (queued on CUDA, as dev_copy). */
static em_status dev_zero(const em_zero *z, void *p, size_t bytes)
{
#if EM_HAVE_CUDA
    if (z->dev.type == EM_CUDA) return cu_fill(z->dev.index, EM_U8, p, (int64_t)bytes, 0.0);
#endif
    (void)z;
    memset(p, 0, bytes);
    return EM_OK;
}

/* ---- the gradient buffer's pages ----------------------------------------------------- */

/* Gives the whole pages inside [p, p + bytes) back to the kernel (they read
 * as zeros from then on, and cost no memory until written); *pa, *pe: that
 * page-aligned part. false when there is none or madvise refused. */
static bool pages_back(void *p, size_t bytes, uintptr_t *pa, uintptr_t *pe)
{
    uintptr_t a = (uintptr_t)p, e = a + bytes, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    *pa = (a + pg - 1) / pg * pg;
    *pe = e / pg * pg;
    return *pe > *pa && madvise((void *)*pa, *pe - *pa, MADV_DONTNEED) == 0;
}

/* [p, p + bytes) reads zeros from now on: its whole pages given back, the
 * bytes at the ends that share a page with other data zeroed. */
static void give_back(void *p, size_t bytes)
{
    uintptr_t pa, pe, e = (uintptr_t)p + bytes;
    if (!pages_back(p, bytes, &pa, &pe)) {
        memset(p, 0, bytes);
        return;
    }
    memset(p, 0, pa - (uintptr_t)p);
    memset((void *)pe, 0, e - pe);
}

/* Bucket i's slice of the full gradient buffer, its collective done, reads
 * zeros from now on: its pages are given back on the CPU; device memory
 * cannot be given back in part, so on CUDA the slice is zeroed in place (a
 * kernel queued after the collective: the compute stream has waited for it). */
static em_status release_bucket(em_zero *z, int i)
{
    zbucket *b = &z->b[i];
    em_tensor *flat = em_module_flat_grads(z->model, b->dtype);
    size_t es = em_dtype_size(b->dtype);
    char *p = (char *)em_data(flat) + (size_t)b->lo * es;
    b->released = true;
    if (z->dev.type != EM_CPU) return dev_zero(z, p, (size_t)b->n * es);
    give_back(p, (size_t)b->n * es);
    return EM_OK;
}

/* ---- stage 2's reduce-scatter, bucket by bucket (DDP's hooks) ------------------------------ */

static em_status launch(void *ctx, int i, em_tensor *grads, em_work **work)
{
    em_zero *z = ctx;
    zbucket *b = &z->b[i];
    /* The buckets whose collective is done give their pages back; at most
     * INFLIGHT buckets of gradients stay resident behind this one, so
     * backward waits for the oldest when communication falls behind (the
     * handle stays DDP's to wait on: this only watches it). */
    for (int j = 0; j < i && z->dev.type == EM_CPU; j++) { /* CUDA: nothing to give back (finished) */
        zbucket *o = &z->b[j];
        if (!o->work || o->released) continue;
        if (j < i - INFLIGHT)
            while (!em_work_done(o->work)) nanosleep(&(struct timespec){0, 20000}, NULL);
        if (em_work_done(o->work)) release_bucket(z, j);
    }
    em_tensor *in = grads;
    em_status s = EM_OK;
    if (b->pad) { /* equal chunks: the bucket, then zeros */
        size_t es = em_dtype_size(b->dtype);
        s = dev_copy(z, em_data(b->pad), em_data(grads), (size_t)b->n * es);
        if (!s)
            s = dev_zero(z, (char *)em_data(b->pad) + (size_t)b->n * es,
                         (size_t)(z->world * b->c - b->n) * es);
        in = b->pad;
    }
    if (!s) s = em_reduce_scatter(z->pg, b->shard, in, EM_RED_AVG, work);
    b->work = s ? NULL : *work;
    return s;
}

static void finished(void *ctx)
{
    em_zero *z = ctx;
    for (int i = 0; i < z->nb; i++) {
        /* a CUDA zeroing that fails to queue shows at the next check of the device */
        if (!z->b[i].released) (void)release_bucket(z, i);
        z->b[i].work = NULL;
        z->b[i].released = false; /* for the next backward */
    }
}

/* ---- the parameters' all-gather -------------------------------------------------------------- */

#if EM_HAVE_CUDA
/* Bucket i's parameters as bytes [*lo, *hi) of the flat buffer's storage
 * (stage 3: the storage's own offsets, which the device's granules use). */
static void bucket_bytes(const em_zero *z, const zbucket *b, size_t *lo, size_t *hi)
{
    size_t es = em_dtype_size(b->dtype);
    *lo = (size_t)(z->flat->offset + b->lo) * es;
    *hi = *lo + (size_t)b->n * es;
}
#endif

/* Starts (work not NULL) or runs bucket i's all-gather of parameters: every
 * rank's chunk to every rank (through the pad when the world does not
 * divide the bucket; gather_done copies it back). */
static em_status gather_start(em_zero *z, int i, em_work **work)
{
    zbucket *b = &z->b[i];
    size_t es = em_dtype_size(b->dtype);
#if EM_HAVE_CUDA
    if (z->vr) { /* stage 3 on a device: memory under the whole bucket first */
        size_t lo, hi;
        bucket_bytes(z, b, &lo, &hi);
        em_status s = cu_vrange_map(z->vr, lo, hi);
        if (s) return s;
    }
#endif
    if (b->pad) {
        em_status s =
            dev_copy(z, em_data(b->mine), (char *)em_data(b->params) + (size_t)(z->rank * b->c) * es,
                     (size_t)b->own * es);
        if (s) return s;
    }
    return em_all_gather(z->pg, b->pad ? b->pad : b->params, b->mine, work);
}

static em_status gather_done(em_zero *z, int i)
{
    zbucket *b = &z->b[i];
    if (!b->pad) return EM_OK;
    return dev_copy(z, em_data(b->params), em_data(b->pad), (size_t)b->n * em_dtype_size(b->dtype));
}

/* ---- stage 3: parameters whole only while they are used ------------------------------------- */

#if EM_HAVE_CUDA
/* Whether granule g of the device's flat parameters holds something this
 * rank needs now: a piece of its chunks, or of a bucket that is whole or
 * being gathered. */
static bool granule_needed(const em_zero *z, size_t g)
{
    if (z->own_g[g]) return true;
    size_t glo = g * z->gran, ghi = glo + z->gran;
    for (int k = 0; k < z->nb; k++) {
        size_t lo, hi;
        bucket_bytes(z, &z->b[k], &lo, &hi);
        if (lo < ghi && glo < hi && (z->b[k].resident || z->b[k].gwork)) return true;
    }
    return false;
}

/* Stage 3 on a device: unmaps the granules of bucket i's parameters that no
 * one needs (granule_needed), run by run, once the work queued so far has
 * read them (cu_vrange_unmap). */
static em_status unmap_bucket(em_zero *z, int i)
{
    size_t lo, hi;
    bucket_bytes(z, &z->b[i], &lo, &hi);
    em_status first = EM_OK;
    for (size_t g = lo / z->gran; g * z->gran < hi;) {
        size_t e = g;
        while (e * z->gran < hi && !granule_needed(z, e)) e++;
        if (e > g) {
            em_status s = cu_vrange_unmap(z->vr, g * z->gran, e * z->gran);
            if (s && !first) first = s;
        }
        g = e + 1;
    }
    return first;
}
#endif

/* Bucket i's parameters are whole no more: on the CPU the whole pages
 * outside this rank's chunk are given back (its chunk stays: the optimizer
 * updates it; pages shared with a chunk or another bucket stay too, stale,
 * until the next gather); on a device the granules no one needs are
 * unmapped. */
static em_status evict(em_zero *z, int i)
{
    zbucket *b = &z->b[i];
    b->resident = false;
#if EM_HAVE_CUDA
    if (z->vr) return unmap_bucket(z, i);
#endif
    size_t es = em_dtype_size(b->dtype);
    char *p = em_data(b->params);
    size_t regions[2][2] = {{0, (size_t)(z->rank * b->c)}, {(size_t)(z->rank * b->c + b->own), (size_t)b->n}};
    for (int k = 0; k < 2; k++) {
        uintptr_t pa, pe; /* the ends stay as they are: stale values, overwritten by the next gather */
        (void)pages_back(p + regions[k][0] * es, (regions[k][1] - regions[k][0]) * es, &pa, &pe);
    }
    return EM_OK;
}

static em_status finish_prefetch(em_zero *z, int i)
{
    zbucket *b = &z->b[i];
    em_status s = em_work_wait(b->gwork);
    b->gwork = NULL;
    if (!s) s = gather_done(z, i);
    if (!s) b->resident = true;
    return s;
}

/* Bucket i whole, if it is not: its prefetch waited for, or a gather. */
static em_status make_whole(em_zero *z, int i)
{
    zbucket *b = &z->b[i];
    if (b->resident) return EM_OK;
    em_status s = b->gwork ? finish_prefetch(z, i) : gather_start(z, i, NULL);
    if (!s && !b->resident && !(s = gather_done(z, i))) b->resident = true;
    return s;
}

/* Makes bucket i whole: waits for its prefetch or gathers it; keeps at
 * most KEEP buckets whole (the least recently used others are evicted);
 * then starts the prefetch of the next bucket in the direction the
 * fetches go (forward walks the buckets down, backward up). */
static em_status make_resident(em_zero *z, int i)
{
    zbucket *b = &z->b[i];
    b->used = ++z->clock;
    if (b->resident) return EM_OK;
    em_status s = make_whole(z, i);
    if (s) return s;
    for (;;) { /* whole or coming: at most KEEP */
        int n = 0, lru = -1;
        for (int k = 0; k < z->nb; k++) {
            if (!z->b[k].resident && !z->b[k].gwork) continue;
            n++;
            if (k != i && !z->b[k].gwork && (lru < 0 || z->b[k].used < z->b[lru].used)) lru = k;
        }
        if (n <= KEEP || lru < 0) break;
        if ((s = evict(z, lru))) return s;
    }
    int d = z->last >= 0 ? i - z->last : 0, next = i + d;
    z->last = i;
    if ((d == 1 || d == -1) && next >= 0 && next < z->nb && !z->b[next].resident && !z->b[next].gwork) {
        z->b[next].used = z->clock;
        if ((s = gather_start(z, next, &z->b[next].gwork))) z->b[next].gwork = NULL;
    }
    return s;
}

/* The dispatcher's fetch (tensor/dispatch.h): t lies in the flat
 * parameters; every bucket it touches is made whole. */
static em_status fetch(void *ctx, const tensor *t)
{
    em_zero *z = ctx;
    int64_t lo = t->offset - z->flat->offset, hi = lo + 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return EM_OK;
        hi += (t->shape[d] - 1) * (t->stride[d] < 0 ? -t->stride[d] : t->stride[d]);
    }
    for (int i = 0; i < z->nb; i++) {
        const zbucket *b = &z->b[i];
        if (b->lo < hi && lo < b->lo + b->n) {
            em_status s = make_resident(z, i);
            if (s) return s;
        }
    }
    return EM_OK;
}

em_status em_zero_gather_params(em_zero *z)
{
    if (!z) return em_err(EM_ERR_ARG, "em_zero_gather_params: zero is NULL");
    if (z->stage < 3) return EM_OK;
    em_status first = EM_OK;
    for (int i = 0; i < z->nb; i++) { /* every rank the same calls, whatever fails */
        em_status s = make_whole(z, i);
        if (s && !first) first = s;
    }
    return first;
}

/* Where parameter t (a slice of the model's flat parameters) meets this
 * rank's chunk of its bucket: elements [*lo, *hi) of the flat buffer (lo =
 * hi = t's start when none of it is mine). The bucket's index, or -1 when t
 * is not a parameter of the model or lies in no bucket. */
static int own_range(const em_zero *z, const tensor *t, int64_t *lo, int64_t *hi)
{
    em_tensor *flat = em_module_flat_params(z->model, t->dtype);
    tensor *ft = flat ? t_resolve(flat, "em_zero") : NULL;
    if (!ft || t->st != ft->st) return -1;
    int64_t off = t->offset - ft->offset, n = t_numel(t);
    for (int k = 0; k < z->nb; k++) {
        const zbucket *b = &z->b[k];
        if (b->dtype != t->dtype || off < b->lo || off >= b->lo + b->n) continue;
        int64_t own_lo = b->lo + (int64_t)z->rank * b->c, own_hi = own_lo + b->own;
        *lo = off > own_lo ? off : own_lo;
        *hi = off + n < own_hi ? off + n : own_hi;
        if (*hi <= *lo) *lo = *hi = off; /* none of it is mine */
        return k;
    }
    return -1;
}

bool zero_param_share(const em_zero *z, const em_tensor *param, int64_t *lo, int64_t *n)
{
    tensor *t = t_resolve(param, "zero_param_share");
    int64_t a, e;
    if (!t || own_range(z, t, &a, &e) < 0) return false;
    em_tensor *flat = em_module_flat_params(z->model, t->dtype);
    *lo = a - (t->offset - t_resolve(flat, "zero_param_share")->offset);
    *n = e - a;
    return true;
}

em_status zero_params_changed(em_zero *z)
{
    if (z->stage < 3) return EM_OK;
    em_status first = EM_OK;
    for (int i = 0; i < z->nb; i++) { /* a prefetch still running would overwrite the new values */
        em_status s = z->b[i].gwork ? finish_prefetch(z, i) : EM_OK;
        if (s && !first) first = s;
        s = evict(z, i);
        if (s && !first) first = s;
    }
    z->last = -1;
    return first;
}

/* ---- set-up ------------------------------------------------------------------------------ */

/* A persistent 1-D view of elements [lo, lo + n) of base's storage (base's
 * own offset counts), whatever scope is open; em_free frees it. */
static em_tensor *slice_of(em_tensor *base, int64_t lo, int64_t n)
{
    tensor *b = t_resolve(base, "em_zero"), *v = b ? t_new_persistent(b->dtype, 0, NULL) : NULL;
    if (!v) return NULL;
    v->ndim = 1;
    v->shape[0] = n;
    v->stride[0] = 1;
    t_repoint(v, b, b->offset + lo);
    return t_handle(v);
}

/* A persistent zeroed 1-D tensor of n elements on dev. */
static em_tensor *zeros_on(em_device dev, em_dtype dt, int64_t n)
{
    tensor *t = t_new_persistent_on(dev, dt, 1, &n);
    if (t && t_fill_zero(t)) {
        t_free(t);
        return NULL;
    }
    return t ? t_handle(t) : NULL;
}

/* The optimizer's parameter i as a piece: the part of it that lies in this
 * rank's chunk of its bucket (stage 2: its gradient read from the shard). */
static em_status set_piece(em_zero *z, int i, const char *fn)
{
    tensor *t = t_resolve(z->opt->p[i].h, fn);
    if (!t) return em_last_status();
    em_tensor *flat = em_module_flat_params(z->model, t->dtype);
    tensor *ft = flat ? t_resolve(flat, fn) : NULL;
    if (!ft || t->st != ft->st)
        return em_err(EM_ERR_ARG, "%s: optimizer parameter %d %s%s is not a parameter of the model", fn, i,
                      em_dtype_name(t->dtype), shp(t));
    int64_t off = t->offset - ft->offset, lo, hi;
    int k = own_range(z, t, &lo, &hi);
    if (k >= 0) {
        const zbucket *b = &z->b[k];
        int64_t own_lo = b->lo + (int64_t)z->rank * b->c;
        tensor *g = NULL, *pp = NULL;
        if (z->offload) { /* headers over the piece's values and gradients in the host chunks */
            em_tensor *hp = slice_of(z->hpar, b->at + (lo - own_lo), hi - lo);
            em_tensor *hg = hp ? slice_of(z->hgrad, b->at + (lo - own_lo), hi - lo) : NULL;
            if (!hg) {
                em_free(hp);
                return em_last_status();
            }
            z->ppiece[i] = pp = t_resolve(hp, fn);
            z->gpiece[i] = g = t_resolve(hg, fn);
        } else if (z->stage >= 2) { /* a header over the piece's gradients in the shard */
            g = t_new_persistent(t->dtype, 0, NULL);
            if (!g) return em_last_status();
            z->gpiece[i] = g;
            g->ndim = 1;
            g->shape[0] = hi - lo;
            g->stride[0] = 1;
            t_repoint(g, t_resolve(z->gshard, fn), em_offset(b->shard) + (lo - own_lo));
        }
        return optim_set_piece(z->opt, i, lo - off, hi - lo, g, pp);
    }
    return em_err(EM_ERR_ARG, "%s: optimizer parameter %d %s%s lies in no bucket", fn, i, em_dtype_name(t->dtype),
                  shp(t));
}

/* The buckets' chunks, shards, pads and parameter slices. */
static em_status make_chunks(em_zero *z, const char *fn)
{
    z->nb = em_ddp_num_buckets(z->ddp);
    z->b = calloc((size_t)z->nb + 1, sizeof *z->b);
    if (!z->b) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    int64_t total = 0; /* the shard's length */
    for (int i = 0; i < z->nb; i++) {
        zbucket *b = &z->b[i];
        ddp_bucket_span(z->ddp, i, &b->dtype, &b->lo, &b->n);
        if (b->dtype != EM_F32 && b->dtype != EM_F64)
            return em_err(EM_ERR_UNSUPPORTED, "%s: the model has %s parameters; ZeRO shards f32 and f64 ones", fn,
                          em_dtype_name(b->dtype));
        b->c = (b->n + z->world - 1) / z->world;
        int64_t start = (int64_t)z->rank * b->c;
        b->own = start >= b->n ? 0 : (b->n - start < b->c ? b->n - start : b->c);
        em_tensor *fp = em_module_flat_params(z->model, b->dtype);
        em_device dev = em_device_of(fp);
        if (i == 0) z->dev = dev;
        if (!em_device_equal(dev, z->dev)) {
            char a[16], d[16];
            return em_err(EM_ERR_DEVICE, "%s: the model's parameters are on %s and %s; ZeRO takes one device",
                          fn, em_device_str(z->dev, a, sizeof a), em_device_str(dev, d, sizeof d));
        }
        if (!(b->params = slice_of(fp, b->lo, b->n))) return em_last_status();
        if (b->n % z->world) {
            int64_t padded = b->c * z->world;
            if (!(b->pad = zeros_on(dev, b->dtype, padded))) return em_last_status();
        }
        b->mine = b->pad ? slice_of(b->pad, (int64_t)z->rank * b->c, b->c)
                         : slice_of(fp, b->lo + (int64_t)z->rank * b->c, b->c);
        if (!b->mine) return em_last_status();
        b->at = total;
        total += b->c;
    }
    if (z->offload && z->dev.type == EM_CPU)
        return em_err(EM_ERR_ARG,
                      "%s: offload keeps a CUDA model's optimizer state in host memory; this model is "
                      "on the CPU already",
                      fn);
    if ((z->stage >= 2 || z->offload) && z->nb > 0) {
        /* one shard buffer per dtype would be needed for f64 beside f32 */
        for (int i = 1; i < z->nb; i++)
            if (z->b[i].dtype != z->b[0].dtype)
                return em_err(EM_ERR_UNSUPPORTED, "%s: %s takes parameters of one dtype (f32 and f64 found)",
                              fn, z->offload ? "offload" : "stage 2");
    }
    if (z->offload && z->nb > 0) {
        if (!(z->hpar = zeros_on(em_device_cpu(), z->b[0].dtype, total)) ||
            !(z->hgrad = zeros_on(em_device_cpu(), z->b[0].dtype, total)))
            return em_last_status();
    }
    if (z->stage >= 2 && z->nb > 0) {
        if (!(z->gshard = zeros_on(z->dev, z->b[0].dtype, total))) return em_last_status();
        int64_t at = 0;
        for (int i = 0; i < z->nb; i++) {
            if (!(z->b[i].shard = slice_of(z->gshard, at, z->b[i].c))) return em_last_status();
            at += z->b[i].c;
        }
    }
    return EM_OK;
}

/* Stage 3 on a CUDA device: the flat parameters move into an address range
 * whose granules can be unmapped (tensor/cuda_vmm.c; every view keeps its
 * offsets), and the granules holding this rank's chunks are marked to stay. */
static em_status reserve_on_device(em_zero *z, const char *fn)
{
#if EM_HAVE_CUDA
    if (z->dev.type != EM_CUDA) return EM_OK;
    storage *st = z->flat->st;
    if (!(z->vr = cu_vrange_adopt(z->dev.index, &st->data, st->nbytes))) return em_last_status();
    z->gran = cu_vrange_granule(z->vr);
    if (!(z->own_g = calloc(st->nbytes / z->gran + 2, 1))) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; i < z->nb; i++) {
        const zbucket *b = &z->b[i];
        size_t lo, hi, es = em_dtype_size(b->dtype);
        bucket_bytes(z, b, &lo, &hi);
        size_t a = lo + (size_t)(z->rank * b->c) * es, e = a + (size_t)b->own * es;
        for (size_t g = a / z->gran; b->own && g * z->gran < e; g++) z->own_g[g] = 1;
    }
#else
    (void)z, (void)fn;
#endif
    return EM_OK;
}

/* NULL, z freed, with the error s that the set-up met (its message kept
 * across the frees). */
static em_zero *fail_freeing(em_zero *z, em_status s)
{
    held_error h;
    error_hold(&h, s);
    em_zero_free(z);
    error_restore(&h);
    return NULL;
}

em_zero *zero_attach(em_ddp *ddp, bool owns_ddp, em_optimizer *opt, int stage, bool offload)
{
    const char *fn = "em_zero_new";
    if (stage < 1 || stage > 3) {
        if (owns_ddp) em_ddp_free(ddp);
        return em_fail(EM_ERR_ARG, "%s: stage %d is not a ZeRO stage (1, 2 or 3; 0 is plain DDP)", fn, stage);
    }
    if (stage == 3 && fetching) {
        if (owns_ddp) em_ddp_free(ddp);
        return em_fail(EM_ERR_UNSUPPORTED, "%s: another stage 3 model is live in this process; one at a time", fn);
    }
    em_zero *z = calloc(1, sizeof *z);
    if (!z) {
        if (owns_ddp) em_ddp_free(ddp);
        return em_fail(EM_ERR_OOM, "%s: out of memory", fn);
    }
    z->ddp = ddp;
    z->owns_ddp = owns_ddp;
    z->pg = ddp_pg(ddp);
    z->model = ddp_model(ddp);
    z->opt = opt;
    z->stage = stage;
    z->world = em_pg_world(z->pg);
    z->rank = em_pg_rank(z->pg);
    z->npiece = opt->np;
    z->last = -1;
    z->offload = offload;
    z->gpiece = calloc((size_t)opt->np + 1, sizeof *z->gpiece);
    z->ppiece = calloc((size_t)opt->np + 1, sizeof *z->ppiece);
    em_status s = z->gpiece && z->ppiece ? make_chunks(z, fn) : em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; i < opt->np && !s; i++) s = set_piece(z, i, fn);
    if (s) return fail_freeing(z, s);
    if (stage >= 2) { /* the full gradient buffer holds memory only while backward fills it */
        ddp_set_hooks(ddp, (ddp_hooks){.launch = launch, .finished = finished, .ctx = z});
        em_zero_zero_grad(z);
    }
    if (stage == 3) { /* from now on parameters are whole only while used */
        em_tensor *fp = em_module_flat_params(z->model, EM_F32);
        z->flat = fp ? t_resolve(fp, fn) : NULL;
        if (!z->flat) {
            em_zero_free(z);
            return em_fail(EM_ERR_UNSUPPORTED, "%s: stage 3 shards f32 parameters; the model has none", fn);
        }
        s = reserve_on_device(z, fn);
        for (int i = 0; i < z->nb && !s; i++) s = evict(z, i);
        if (s) return fail_freeing(z, s);
        op_set_fetch(z->flat->st, fetch, z);
        fetching = true;
    }
    return z;
}

em_zero *em_zero_new(em_pg *pg, em_module *model, em_optimizer *opt, const em_zero_config *cfg)
{
    if (!pg || !model || !opt)
        return em_fail(EM_ERR_ARG, "em_zero_new: %s is NULL", !pg ? "pg" : !model ? "model" : "opt");
    em_zero_config c = cfg ? *cfg : (em_zero_config){.stage = 1};
    if (c.stage < 1 || c.stage > 3)
        return em_fail(EM_ERR_ARG, "em_zero_new: stage %d is not a ZeRO stage (1, 2 or 3; 0 is plain DDP)", c.stage);
    em_ddp *d = em_ddp_new(pg, model, &(em_ddp_config){.bucket_mb = c.bucket_mb,
                                                        .find_unused_parameters = c.find_unused_parameters});
    return d ? zero_attach(d, true, opt, c.stage, c.offload) : NULL;
}

void em_zero_free(em_zero *z)
{
    if (!z) return;
    if (z->ddp) ddp_set_hooks(z->ddp, (ddp_hooks){0});
    if (z->flat) {
        op_set_fetch(NULL, NULL, NULL);
        fetching = false;
    }
    for (int i = 0; i < z->nb; i++)
        if (z->b[i].gwork) em_work_wait(z->b[i].gwork);
#if EM_HAVE_CUDA
    /* the flat parameters back in an ordinary block: this rank's chunks and
     * the buckets whole now, zeros elsewhere */
    if (z->vr) (void)cu_vrange_return(z->vr, &z->flat->st->data);
    free(z->own_g);
#endif
    for (int i = 0; i < z->nb; i++) {
        em_free(z->b[i].mine);
        em_free(z->b[i].params);
        em_free(z->b[i].shard);
        em_free(z->b[i].pad);
    }
    /* the optimizer's pieces point into the shard: it forgets them first */
    for (int i = 0; i < z->npiece && i < z->opt->np; i++) {
        if (z->gpiece && z->gpiece[i]) z->opt->p[i].gpiece = NULL;
        if (z->ppiece && z->ppiece[i]) z->opt->p[i].ppiece = NULL;
    }
    for (int i = 0; i < z->npiece; i++) {
        if (z->gpiece) t_free(z->gpiece[i]);
        if (z->ppiece) t_free(z->ppiece[i]);
    }
    em_free(z->hpar);
    em_free(z->hgrad);
    free(z->ppiece);
    em_free(z->gshard);
    if (z->owns_ddp) em_ddp_free(z->ddp);
    free(z->gpiece);
    free(z->b);
    free(z);
}

int em_zero_stage(const em_zero *z) { return z ? z->stage : -1; }

em_ddp *em_zero_ddp(const em_zero *z) { return z ? z->ddp : NULL; }

/* ---- the step ----------------------------------------------------------------------------- */

em_status em_zero_backward(em_zero *z, em_tensor *loss, bool sync)
{
    if (!z) return em_err(EM_ERR_ARG, "em_zero_backward: zero is NULL");
    em_ddp_set_sync(z->ddp, sync);
    return em_ddp_backward(z->ddp, loss, NULL);
}

/* The gradients clipping and the scaler look at: the shard (stage 2), or
 * every bucket's full slice (stage 1: each rank has them all). */
static int grads_of(const em_zero *z, tensor **out)
{
    if (z->stage >= 2) {
        out[0] = t_resolve(z->gshard, "em_zero");
        return z->gshard ? 1 : 0;
    }
    int n = 0;
    static const em_dtype dts[] = {EM_F32, EM_F64};
    for (int k = 0; k < 2; k++) {
        em_tensor *g = em_module_flat_grads(z->model, dts[k]);
        if (g) out[n++] = t_resolve(g, "em_zero");
    }
    return n;
}

/* *acc = the p-norm's accumulation (optim/update_math.h's norm_acc) of
 * this rank's chunks of the gradient shard, on a CUDA device: one device
 * accumulation per bucket (optim/optim.cu's fixed-order reduction, in
 * double), one copy to the host, joined there in bucket order. */
static em_status shard_norm_cuda(const em_zero *z, double p, double *acc)
{
#if EM_HAVE_CUDA
    const char *fn = "em_zero_clip_grad_norm";
    int d = z->dev.index;
    double *dev_acc = cu_alloc(d, (size_t)(z->nb + 1) * sizeof(double)),
           *host = calloc((size_t)z->nb + 1, sizeof *host);
    em_status s =
        dev_acc && host ? cu_fill(d, EM_F64, dev_acc, z->nb, 0) : em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; i < z->nb && !s; i++) {
        const zbucket *b = &z->b[i];
        s = cu_norm_acc(d, b->dtype, em_data(b->shard), b->own, p, &dev_acc[i]);
    }
    if (!s) s = cu_memcpy(host, em_device_cpu(), dev_acc, z->dev, (size_t)z->nb * sizeof(double)); /* waits */
    *acc = 0;
    for (int i = 0; i < z->nb && !s; i++) *acc = norm_join(*acc, host[i], p);
    if (dev_acc) cu_free(d, dev_acc);
    free(host);
    return s;
#else
    (void)p, (void)acc;
    return em_err(EM_ERR_DEVICE, "em_zero_clip_grad_norm: the gradients are on %s in a build without CUDA",
                  z->dev.type == EM_CUDA ? "a CUDA device" : "another device");
#endif
}

/* Stages 2-3's clip of the gradient shard: the accumulation over this
 * rank's chunks (the pads' zeros add nothing; a parameter no rank used is
 * zeros there), joined over ranks (a sum, or for inf a max), then the
 * shard scaled where it clips. pre != 0 (a CPU f32 shard, p = 2): the
 * loss scaler's unscale in the same two passes, as opt_unscale_clip does
 * for whole gradients: the norm of the shard times pre, then the shard
 * multiplied by pre and, where it clips, by the clip's factor, the bits
 * of unscaling then clipping. A total that is not finite is then
 * *found_inf on every rank (a sum over ranks of accumulations one of
 * which is inf or NaN is not finite on every rank either, so the norm's
 * all-reduce is the overflow vote): the shard is only unscaled and
 * INFINITY returned. */
static double shard_clip(em_zero *z, const em_clip_config *cfg, double p, double pre, bool *found_inf,
                         em_status *status)
{
    const char *fn = pre ? "em_accel_clip_grad_norm" : "em_zero_clip_grad_norm";
    double acc = 0;
    em_status s = z->dev.type != EM_CPU ? shard_norm_cuda(z, p, &acc) : EM_OK;
    for (int i = 0; i < z->nb && z->dev.type == EM_CPU && !s; i++) {
        /* each bucket's chunk as clipping sums a gradient (blocks over the
         * pool, 8 lanes): 8.2 ms on one Zen 5 core for 62M floats, a 124M
         * model's shard at 2 ranks, where one add chain element by element
         * took 33 ms */
        const zbucket *b = &z->b[i];
        double part = 0;
        s = opt_norm_acc(em_data(b->shard), b->dtype != EM_F32, b->own, p, pre ? (float)pre : 1.0f, &part);
        acc = norm_join(acc, part, p);
    }
    if (s) return *status = s, NAN;
    em_scope sc = em_scope_begin();
    em_tensor *t = em_scalar(EM_F64, acc);
    s = t ? em_all_reduce(z->pg, t, isinf(p) ? EM_RED_MAX : EM_RED_SUM, NULL) : em_last_status();
    double total = s ? NAN : norm_root(em_item(t), p);
    em_scope_end(sc);
    if (s) return *status = s, NAN;
    tensor *g = t_resolve(z->gshard, fn);
    if (pre && !isfinite(total)) { /* the step is to be skipped: unscaled only */
        (void)opt_scale_grads(&g, 1, pre, NULL);
        *found_inf = true;
        return INFINITY;
    }
    if (!isfinite(total) && cfg->error_if_nonfinite) /* every rank has the same total: all refuse */
        return *status =
                   opt_clip_refuse(fn, total, p,
                                   isfinite(acc) ? " (on another rank's gradient shard)"
                                                 : " (this rank's gradient shard holds a value that is not "
                                                   "finite)"),
               NAN;
    bool clip = !(total + 1e-6 <= cfg->max_norm); /* NaN too: torch's clamp passes it through */
    double c = clip ? cfg->max_norm / (total + 1e-6) : 1;
#if EM_HAVE_CUDA
    if (clip && t_on_cuda(g)) {
        if ((s = cu_scale(g->device.index, g->dtype, t_ptr(g), t_numel(g), c))) return *status = s, NAN;
        return total;
    }
#endif
    if (pre) /* the unscale always, the clip's factor after it where it clips */
        (void)opt_scale_grads2(&g, 1, pre, c, NULL);
    else if (clip)
        (void)opt_scale_grads(&g, 1, c, NULL); /* contiguous: over the pool */
    return total;
}

double em_zero_clip_grad_norm(em_zero *z, double max_norm, em_status *status)
{
    return em_zero_clip_grad_norm_with(z, &(em_clip_config){.max_norm = max_norm}, status);
}

double em_zero_clip_grad_norm_with(em_zero *z, const em_clip_config *cfg, em_status *status)
{
    const char *fn = "em_zero_clip_grad_norm";
    em_status dummy;
    if (!status) status = &dummy;
    *status = EM_OK;
    if (!z) return *status = em_err(EM_ERR_ARG, "%s: zero is NULL", fn), NAN;
    double p;
    if ((*status = opt_clip_check(fn, cfg, &p))) return NAN;
    if (z->stage < 2) { /* every rank has every averaged gradient: DDP's clip, bit for bit */
        int n = em_module_params(z->model, NULL, 0);
        em_named *ps = calloc((size_t)n + 1, sizeof *ps);
        em_tensor **pt = calloc((size_t)n + 1, sizeof *pt);
        if (!ps || !pt) {
            free(ps);
            free(pt);
            return *status = em_err(EM_ERR_OOM, "%s: out of memory", fn), NAN;
        }
        em_module_params(z->model, ps, n);
        for (int i = 0; i < n; i++) pt[i] = ps[i].t;
        double total = em_clip_grad_norm_with(n, pt, cfg, status);
        free(ps);
        free(pt);
        return total;
    }
    return shard_clip(z, cfg, p, 0, NULL, status);
}

em_status zero_unscale(em_zero *z, em_grad_scaler *sc)
{
    tensor *g[2];
    int n = grads_of(z, g);
    return amp_unscale_grads(sc, n, g, z->pg);
}

double zero_unscale_clip(em_zero *z, em_grad_scaler *sc, const em_clip_config *cfg, em_status *status)
{
    double inv, p = 0;
    *status = EM_OK;
    if (z->stage >= 2 && z->dev.type == EM_CPU && z->b[0].dtype == EM_F32 && amp_unscale_due(sc, &inv) &&
        !opt_clip_check("em_accel_clip_grad_norm", cfg, &p) && p == 2) {
        bool inf = false;
        prof_mark pm;
        prof_begin(&pm);
        double total = shard_clip(z, cfg, p, inv, &inf, status);
        prof_end(&pm, "scaler.unscale_clip", PROF_OPTIMIZER);
        if (!*status) amp_unscaled(sc, inf);
        return total;
    }
    if ((*status = zero_unscale(z, sc))) return NAN;
    if (em_scaler_found_inf(sc)) return INFINITY; /* this step will be skipped */
    return em_zero_clip_grad_norm_with(z, cfg, status);
}

/* Offload: this rank's chunk of every bucket's parameters and averaged
 * gradients (the shard in stage 2, the full buffer's chunk in stage 1)
 * device -> host (in: before the optimizer steps on the host; each copy
 * waits for the device), or the updated parameters host -> device (out:
 * queued before the all-gather that sends them). */
static em_status offload_chunks(em_zero *z, bool in)
{
    em_device cpu = em_device_cpu();
    em_tensor *fg = em_module_flat_grads(z->model, z->b[0].dtype);
    em_status s = EM_OK;
    for (int i = 0; i < z->nb && !s; i++) {
        zbucket *b = &z->b[i];
        size_t es = em_dtype_size(b->dtype), bytes = (size_t)b->own * es,
               mine = (size_t)(z->rank * b->c) * es;
        char *hp = (char *)em_data(z->hpar) + (size_t)b->at * es,
             *hg = (char *)em_data(z->hgrad) + (size_t)b->at * es;
        char *dp = (char *)em_data(b->params) + mine;
        const char *dg = z->stage >= 2 ? (const char *)em_data(b->shard)
                                       : (const char *)em_data(fg) + (size_t)b->lo * es + mine;
        if (!in)
            s = xfer(dp, z->dev, hp, cpu, bytes);
        else if (!(s = xfer(hp, cpu, dp, z->dev, bytes)))
            s = xfer(hg, cpu, dg, z->dev, bytes);
    }
    return s;
}

em_status em_zero_step(em_zero *z)
{
    if (!z) return em_err(EM_ERR_ARG, "em_zero_step: zero is NULL");
    /* stage 3: a prefetch still running reads the chunk the step changes */
    for (int i = 0; i < z->nb; i++)
        if (z->b[i].gwork) {
            em_status s = finish_prefetch(z, i);
            if (s) return s;
        }
    em_status s = z->offload ? offload_chunks(z, true) : EM_OK;
    if (!s) s = em_optim_step(z->opt);
    if (!s && z->offload) s = offload_chunks(z, false);
    if (s) return s;
    if (z->stage == 3) return zero_params_changed(z); /* the next forward gathers the new chunks */
    /* every bucket's chunks to every rank: started together, then waited */
    em_status first = EM_OK;
    for (int i = 0; i < z->nb; i++) {
        zbucket *b = &z->b[i];
        if ((s = gather_start(z, i, &b->work))) {
            b->work = NULL;
            if (!first) first = s;
        }
    }
    for (int i = 0; i < z->nb; i++) {
        zbucket *b = &z->b[i];
        if (!b->work) continue;
        s = em_work_wait(b->work);
        b->work = NULL;
        if (!s) s = gather_done(z, i);
        if (s && !first) first = s;
    }
    return first;
}

em_status em_zero_zero_grad(em_zero *z)
{
    if (!z) return em_err(EM_ERR_ARG, "em_zero_zero_grad: zero is NULL");
    if (z->stage < 2 || z->dev.type != EM_CPU) { /* CUDA: kept, zeroed */
        em_status s = em_module_zero_grad(z->model);
        if (!s) optim_grads_zeroed(z->opt);
        return s;
    }
    static const em_dtype dts[] = {EM_F32, EM_F64};
    for (int k = 0; k < 2; k++) {
        em_tensor *g = em_module_flat_grads(z->model, dts[k]);
        if (g) give_back(em_data(g), (size_t)em_numel(g) * em_dtype_size(dts[k]));
    }
    optim_grads_zeroed(z->opt);
    return EM_OK;
}
