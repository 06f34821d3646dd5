/* loader.c — batches from a dataset: per-epoch seeded shuffle, drop_last,
 * a resumable position {epoch, batch}, background prefetch and sharding over
 * ranks (a distributed sampler); plus the random-window sampler for language
 * models, which can be sharded too.
 *
 * Sharding is arithmetic on the epoch's order, which every rank computes the
 * same way from (seed, epoch). Positions 0 .. total-1 of the order are cut
 * into global batches of G examples; rank r's batch b is the chunk of c =
 * G / world examples at position b*G + r*c (fewer, or none, at the end when
 * total is not a multiple of G). With even_batches total is rounded up to a
 * multiple of G and position k >= n reads order[k % n] (the wrap-around
 * padding); unsharded is world 1, G = c = batch_size.
 *
 * Prefetch. One worker thread walks the same batch sequence the caller will
 * ask for (epoch by epoch, computing each epoch's permutation itself) and
 * writes each batch into a slot of a ring of plain C buffers; the caller's
 * em_loader_next copies the head slot into tensors it makes itself (tensor
 * handles are only ever made by the calling thread). One mutex guards the
 * ring indices; `not_empty` wakes the caller, `not_full` the worker. A slot
 * between head and head+count belongs to the caller, the others to the
 * worker, so the copies themselves run unlocked. Seek and free stop the
 * worker (flag + broadcast + join) and, for seek, start a new one.
 *
 * Collate. With a collate the batch is built by the user's function from
 * the examples' plain buffers (a slot: the prefetched head, or the caller's
 * own `raw` slot without prefetch) plus each example's lengths and index,
 * on the calling thread (it makes tensors). A collate that fails leaves the
 * slot at the head, so the next call retries the same batch. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../tensor/profile_impl.h"
#include "../tensor/tensor_impl.h"
#include "data/loader_impl.h"
#include "data_impl.h"
#include "ember/data.h"

/* Every batch any loader returns takes the next stamp, so of several
 * loaders the one with the largest last stamp returned a batch last. */
static uint64_t stamp_clock;

typedef struct slot {
    uint8_t *x, *y;       /* (B, x_field...) and (B, y_field...) */
    int64_t *lens, *idx;  /* with a collate: x_len, y_len pairs and the dataset index of each example */
    int64_t epoch, batch; /* which batch this is */
    int64_t size;
    em_status status;
    char msg[ERROR_BYTES];
} slot;

/* A permutation cache: order of epoch `epoch` (NULL order = identity). */
typedef struct order {
    int64_t *perm;
    int64_t epoch;
} order;

struct em_loader {
    em_dataset *ds;
    em_loader_config cfg;
    int64_t n, nb; /* examples; this rank's batches per epoch */
    /* sharding (see the top of the file): this rank of world; global batch
     * G, this rank's chunk c of it, positions per epoch, padded duplicates */
    int rank, world;
    int64_t G, chunk, total, pad;
    size_t xbytes, ybytes; /* one example */
    em_loader_pos pos;     /* the caller's next batch */
    order own;             /* the caller's permutation (no-prefetch path) */
    slot raw;              /* with a collate and no prefetch: the caller's examples */
    em_example *ex;        /* with a collate: the examples handed to it */
    /* the batch em_loader_next last returned: whether it was its epoch's
     * last, and its stamp (loader_last_stamp; 0: none since the last seek) */
    bool last_final;
    uint64_t last_stamp;

    /* prefetch */
    slot *ring;
    int cap, head, count;
    bool running, stop;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full;
    em_loader_pos wpos; /* the worker's next batch */
    order wown;         /* the worker's permutation */
};

/* ---- batch order ------------------------------------------------------------------ */

/* Fisher-Yates over 0..n-1: for i = n-1 .. 1 swap i with j uniform in [0, i],
 * j from Philox(key seed, counter (epoch, i)) scaled by a 64x64 multiply. */
static void shuffle_order(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch)
{
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t w[4];
        em_philox4x32(seed, (uint64_t)epoch, (uint64_t)i, w);
        uint64_t r = (uint64_t)w[0] | (uint64_t)w[1] << 32;
        int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* Sets the batch geometry from n, the config and the shard (rank, world,
 * split_batches, even_batches; world 1 is the plain loader whatever the
 * flags): G, chunk, total, pad and this rank's batch count nb. */
static void set_geometry(em_loader *l, int rank, int world, bool split, bool even)
{
    int64_t B = l->cfg.batch_size, n = l->n;
    l->rank = rank;
    l->world = world;
    l->G = world == 1 || split ? B : B * world;
    l->chunk = l->G / world;
    int64_t full = n / l->G, rem = n % l->G;
    l->total = n;
    l->pad = 0;
    if (l->cfg.drop_last || rem == 0) {
        l->total = full * l->G;
        l->nb = full;
    } else if (even && world > 1) {
        l->total = (full + 1) * l->G;
        l->pad = l->total - n;
        l->nb = full + 1;
    } else { /* this rank's chunk of the short last global batch, if it has one */
        l->nb = full + (rem > (int64_t)rank * l->chunk ? 1 : 0);
    }
}

/* This rank's batch `batch` starts at position *start of the epoch's order
 * and holds the returned number of examples. */
static int64_t batch_span(const em_loader *l, int64_t batch, int64_t *start)
{
    *start = batch * l->G + (int64_t)l->rank * l->chunk;
    int64_t left = l->total - *start;
    return left < l->chunk ? left : l->chunk;
}

/* Writes batch pos of the sequence into s->x and s->y (contiguous, s->size
 * examples), and with s->lens each example's lengths and index; the
 * dataset's status on failure (its message on the calling thread). */
static em_status fill_batch_raw(em_loader *l, order *o, em_loader_pos pos, slot *sl)
{
    int64_t start;
    int64_t *size = &sl->size;
    uint8_t *x = sl->x, *y = sl->y;
    *size = batch_span(l, pos.batch, &start);
    if (o->perm && o->epoch != pos.epoch) {
        shuffle_order(o->perm, l->n, l->cfg.seed, pos.epoch);
        o->epoch = pos.epoch;
    }
    for (int64_t j = 0; j < *size; j++) {
        int64_t k = (start + j) % l->n; /* k >= n only in even_batches padding: wrap to the start */
        int64_t idx = o->perm ? o->perm[k] : k;
        if (sl->lens) {
            sl->idx[j] = idx;
            em_status s =
                dataset_lengths(l->ds, idx, &sl->lens[2 * j], &sl->lens[2 * j + 1], "em_loader_next");
            if (s != EM_OK) return s;
        }
        em_status s = l->ds->get(l->ds->user, idx, x + (size_t)j * l->xbytes, y + (size_t)j * l->ybytes);
        if (s != EM_OK) {
            if (em_last_status() == EM_OK)
                em_err(s, "em_loader_next: dataset get(%lld) failed", (long long)idx);
            return s;
        }
    }
    return EM_OK;
}

/* The same, recorded by the profiler as "loader_fetch" on the thread that
 * reads (the prefetch worker, or the caller when nothing is prefetched). */
static em_status fill_batch(em_loader *l, order *o, em_loader_pos pos, slot *sl)
{
    prof_mark pm;
    prof_begin(&pm);
    em_status s = fill_batch_raw(l, o, pos, sl);
    prof_end(&pm, "loader_fetch", PROF_LOADER);
    return s;
}

/* ---- the prefetch worker ------------------------------------------------------------- */

static void *worker_main(void *arg)
{
    em_loader *l = arg;
    prof_thread_name("loader");
    for (;;) {
        if (l->wpos.batch == l->nb) l->wpos = (em_loader_pos){l->wpos.epoch + 1, 0};
        pthread_mutex_lock(&l->mu);
        while (l->count == l->cap && !l->stop) pthread_cond_wait(&l->not_full, &l->mu);
        if (l->stop) {
            pthread_mutex_unlock(&l->mu);
            return NULL;
        }
        slot *s = &l->ring[(l->head + l->count) % l->cap];
        pthread_mutex_unlock(&l->mu);

        em_clear_error();
        s->epoch = l->wpos.epoch;
        s->batch = l->wpos.batch;
        s->status = fill_batch(l, &l->wown, l->wpos, s);
        snprintf(s->msg, sizeof s->msg, "%s", s->status == EM_OK ? "" : em_last_error());

        pthread_mutex_lock(&l->mu);
        l->count++;
        pthread_cond_signal(&l->not_empty);
        if (s->status != EM_OK) { /* park until stopped: the caller restarts us */
            while (!l->stop) pthread_cond_wait(&l->not_full, &l->mu);
            pthread_mutex_unlock(&l->mu);
            return NULL;
        }
        pthread_mutex_unlock(&l->mu);
        l->wpos.batch++;
    }
}

static void stop_worker(em_loader *l)
{
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->not_full);
    pthread_cond_broadcast(&l->not_empty);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->running = false;
    l->stop = false;
    l->head = l->count = 0;
}

/* Starts the worker at the caller's position (no thread when there is
 * nothing to prefetch). */
static em_status start_worker(em_loader *l)
{
    if (l->cap == 0 || l->nb == 0) return EM_OK;
    l->wpos = l->pos;
    l->head = l->count = 0;
    l->stop = false;
    int rc = pthread_create(&l->thread, NULL, worker_main, l);
    if (rc != 0)
        return em_err(EM_ERR_UNSUPPORTED, "em_loader: cannot start the prefetch thread: %s", strerror(rc));
    l->running = true;
    return EM_OK;
}

/* ---- the loader ----------------------------------------------------------------------- */

/* Buffers for B examples of xb and yb bytes, and with lens their lengths
 * and indices; false when out of memory (slot_free frees what was made). */
static bool slot_alloc(slot *s, size_t B, size_t xb, size_t yb, bool lens)
{
    s->x = malloc(B * xb + 1);
    s->y = malloc(B * yb + 1);
    if (lens) {
        s->lens = malloc(2 * B * sizeof(int64_t));
        s->idx = malloc(B * sizeof(int64_t));
    }
    return s->x && s->y && (!lens || (s->lens && s->idx));
}

static void slot_free(slot *s)
{
    free(s->x);
    free(s->y);
    free(s->lens);
    free(s->idx);
}

/* dtype known, 0 <= ndim < EM_MAX_DIMS (room for the batch dim), dims >= 0 */
static bool field_valid(const em_field *f)
{
    if ((unsigned)f->dtype >= EM_NUM_DTYPES || f->ndim < 0 || f->ndim >= EM_MAX_DIMS) return false;
    for (int d = 0; d < f->ndim; d++)
        if (f->shape[d] < 0) return false;
    return true;
}

em_loader *em_loader_new(em_dataset *ds, const em_loader_config *cfg)
{
    if (!ds || !cfg) return em_fail(EM_ERR_ARG, "em_loader_new: dataset and config must not be NULL");
    if (!ds->len || !ds->get) return em_fail(EM_ERR_ARG, "em_loader_new: dataset has no len or get");
    if (cfg->batch_size < 1)
        return em_fail(EM_ERR_ARG, "em_loader_new: batch_size must be >= 1, got %lld",
                       (long long)cfg->batch_size);
    if (cfg->prefetch < 0)
        return em_fail(EM_ERR_ARG, "em_loader_new: prefetch must be >= 0, got %d", cfg->prefetch);
    if (!field_valid(&ds->x_field) || !field_valid(&ds->y_field))
        return em_fail(EM_ERR_ARG,
                       "em_loader_new: dataset has an invalid x or y field (x ndim %d, y ndim %d)",
                       ds->x_field.ndim, ds->y_field.ndim);
    if (ds->lengths && !cfg->collate)
        return em_fail(EM_ERR_ARG,
                       "em_loader_new: the dataset has variable-length examples (lengths is set): give the "
                       "config a collate that pads them (e.g. em_collate_pad)");
    size_t xb = em_field_bytes(&ds->x_field), yb = em_field_bytes(&ds->y_field);
    int64_t n = ds->len(ds->user);
    if (n < 0) return em_fail(EM_ERR_ARG, "em_loader_new: dataset length is %lld", (long long)n);

    em_loader *l = calloc(1, sizeof *l);
    if (!l) return em_fail(EM_ERR_OOM, "em_loader_new: out of memory");
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->not_empty, NULL);
    pthread_cond_init(&l->not_full, NULL);
    l->ds = ds;
    l->cfg = *cfg;
    l->n = n;
    set_geometry(l, 0, 1, false, false);
    l->xbytes = xb;
    l->ybytes = yb;
    l->own.epoch = l->wown.epoch = -1;
    bool ok = true;
    if (cfg->shuffle) {
        l->own.perm = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
        ok = l->own.perm != NULL;
        if (cfg->prefetch > 0) {
            l->wown.perm = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
            ok = ok && l->wown.perm;
        }
    }
    size_t B = (size_t)cfg->batch_size;
    if (ok && cfg->collate) {
        l->ex = malloc(B * sizeof(em_example));
        ok = l->ex && (cfg->prefetch > 0 || slot_alloc(&l->raw, B, xb, yb, true));
    }
    if (ok && cfg->prefetch > 0) {
        l->ring = calloc((size_t)cfg->prefetch, sizeof(slot));
        ok = l->ring != NULL;
        for (int k = 0; ok && k < cfg->prefetch; k++) {
            ok = slot_alloc(&l->ring[k], B, xb, yb, cfg->collate != NULL);
            l->cap = k + 1; /* slots to free */
        }
    }
    if (!ok) {
        em_loader_free(l);
        return em_fail(EM_ERR_OOM, "em_loader_new: out of memory for %d prefetch batches of %lld",
                       cfg->prefetch, (long long)cfg->batch_size);
    }
    if (start_worker(l) != EM_OK) {
        held_error h;
        error_hold(&h, em_last_status());
        em_loader_free(l);
        error_restore(&h);
        return NULL;
    }
    return l;
}

void em_loader_free(em_loader *l)
{
    if (!l) return;
    stop_worker(l);
    for (int k = 0; l->ring && k < l->cap; k++) slot_free(&l->ring[k]);
    free(l->ring);
    slot_free(&l->raw);
    free(l->ex);
    free(l->own.perm);
    free(l->wown.perm);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->not_empty);
    pthread_cond_destroy(&l->not_full);
    free(l);
}

int64_t em_loader_num_batches(const em_loader *l)
{
    if (!l) {
        em_err(EM_ERR_ARG, "em_loader_num_batches: loader is NULL");
        return -1;
    }
    return l->nb;
}

em_loader_pos em_loader_position(const em_loader *l)
{
    if (!l) {
        em_err(EM_ERR_ARG, "em_loader_position: loader is NULL");
        return (em_loader_pos){-1, -1};
    }
    return l->pos;
}

em_status em_loader_set_shard(em_loader *l, int rank, int world, bool split_batches, bool even_batches)
{
    if (!l) return em_err(EM_ERR_ARG, "em_loader_set_shard: loader is NULL");
    if (world < 1 || rank < 0 || rank >= world)
        return em_err(EM_ERR_ARG, "em_loader_set_shard: rank %d outside [0, world %d)", rank, world);
    if (split_batches && l->cfg.batch_size % world != 0)
        return em_err(EM_ERR_ARG,
                      "em_loader_set_shard: split_batches needs batch_size %% world == 0, got batch_size "
                      "%lld, world %d",
                      (long long)l->cfg.batch_size, world);
    if (l->pos.batch != 0)
        return em_err(EM_ERR_ARG,
                      "em_loader_set_shard: loader is at {epoch %lld, batch %lld}, not at the start of an "
                      "epoch (batch 0)",
                      (long long)l->pos.epoch, (long long)l->pos.batch);
    stop_worker(l);
    set_geometry(l, rank, world, split_batches, even_batches);
    l->last_final = false;
    l->last_stamp = 0;
    return start_worker(l);
}

int64_t em_loader_padding(const em_loader *l)
{
    if (!l) {
        em_err(EM_ERR_ARG, "em_loader_padding: loader is NULL");
        return -1;
    }
    return l->pad;
}

int64_t em_loader_global_batch(const em_loader *l)
{
    if (!l) {
        em_err(EM_ERR_ARG, "em_loader_global_batch: loader is NULL");
        return -1;
    }
    return l->G;
}

em_status em_loader_seek(em_loader *l, em_loader_pos pos)
{
    if (!l) return em_err(EM_ERR_ARG, "em_loader_seek: loader is NULL");
    if (pos.epoch < 0 || pos.batch < 0 || pos.batch > l->nb)
        return em_err(EM_ERR_ARG,
                      "em_loader_seek: position {epoch %lld, batch %lld} outside epochs >= 0, batches "
                      "[0, %lld]",
                      (long long)pos.epoch, (long long)pos.batch, (long long)l->nb);
    stop_worker(l);
    l->pos = pos;
    l->last_final = false;
    l->last_stamp = 0;
    return start_worker(l);
}

/* Batch tensors (size, field...) in the caller's scope. */
static tensor *batch_tensor(const em_field *f, int64_t size)
{
    int64_t shape[EM_MAX_DIMS];
    shape[0] = size;
    for (int d = 0; d < f->ndim; d++) shape[d + 1] = f->shape[d];
    return t_new(f->dtype, f->ndim + 1, shape);
}

/* The prefetched head slot, which must be batch l->pos of `size` examples.
 * NULL with the error set (the worker's, or a mismatch) otherwise; the
 * worker is then restarted at the same position, so the next call retries
 * this batch. */
static slot *head_slot(em_loader *l, int64_t size)
{
    prof_mark pm; /* the time em_loader_next waits for the prefetch worker */
    prof_begin(&pm);
    pthread_mutex_lock(&l->mu);
    while (l->count == 0) pthread_cond_wait(&l->not_empty, &l->mu);
    slot *s = &l->ring[l->head];
    pthread_mutex_unlock(&l->mu);
    prof_end(&pm, "loader_wait", PROF_LOADER);
    if (s->epoch == l->pos.epoch && s->batch == l->pos.batch && s->size == size && s->status == EM_OK)
        return s;
    em_status st = s->status != EM_OK ? s->status : EM_ERR_ARG;
    if (s->status != EM_OK)
        em_err(st, "%s", s->msg);
    else
        em_err(st, "em_loader_next: prefetched batch {%lld, %lld} is not the expected {%lld, %lld}",
               (long long)s->epoch, (long long)s->batch, (long long)l->pos.epoch, (long long)l->pos.batch);
    held_error h;
    error_hold(&h, st);
    stop_worker(l); /* and restart at the same position: the next call retries this batch */
    if (start_worker(l) == EM_OK) error_restore(&h);
    return NULL;
}

/* Hands the head slot back to the worker. */
static void pop_slot(em_loader *l)
{
    pthread_mutex_lock(&l->mu);
    l->head = (l->head + 1) % l->cap;
    l->count--;
    pthread_cond_signal(&l->not_full);
    pthread_mutex_unlock(&l->mu);
}

/* Moves past the batch em_loader_next is returning, noting whether it ends
 * its epoch and stamping it (see loader_impl.h). */
static void returned_one(em_loader *l)
{
    l->pos.batch++;
    l->last_final = l->pos.batch == l->nb;
    l->last_stamp = __atomic_add_fetch(&stamp_clock, 1, __ATOMIC_RELAXED);
}

/* Batch l->pos built by the collate from the examples of a slot (see the
 * top of the file). false with the error set; the position stays. */
static bool next_collated(em_loader *l, int64_t size, em_batch *b)
{
    slot *s = &l->raw;
    if (l->running) {
        if (!(s = head_slot(l, size))) return false;
    } else if (fill_batch(l, &l->own, l->pos, s) != EM_OK) {
        return false;
    }
    for (int64_t j = 0; j < size; j++)
        l->ex[j] = (em_example){s->x + (size_t)j * l->xbytes, s->y + (size_t)j * l->ybytes, s->lens[2 * j],
                                s->lens[2 * j + 1], s->idx[j]};
    em_batch out = {0};
    em_clear_error();
    em_status st = l->cfg.collate(l->cfg.collate_ctx, l->ds, size, l->ex, &out);
    if (st == EM_OK && !out.x)
        st = em_err(EM_ERR_ARG, "em_loader_next: the collate returned EM_OK but made no x");
    if (st != EM_OK) {
        if (em_last_status() == EM_OK)
            em_err(st, "em_loader_next: the collate failed (status %d) on batch {%lld, %lld}", (int)st,
                   (long long)l->pos.epoch, (long long)l->pos.batch);
        held_error h;
        error_hold(&h, st);
        if (em_scope_depth() == 0) { /* persistent tensors would leak; scoped ones die with the scope */
            em_free(out.x);
            em_free(out.y);
            em_free(out.mask);
        }
        error_restore(&h);
        return false; /* the slot stays at the head: the next call retries it */
    }
    if (l->running) pop_slot(l);
    returned_one(l);
    out.size = size;
    *b = out;
    return true;
}

int em_loader_next(em_loader *l, em_batch *b)
{
    if (b) *b = (em_batch){0};
    if (!l || !b) {
        em_err(EM_ERR_ARG, "em_loader_next: loader and batch must not be NULL");
        return -1;
    }
    if (l->pos.batch >= l->nb) { /* end of the epoch; the worker has moved on already */
        l->pos = (em_loader_pos){l->pos.epoch + 1, 0};
        em_clear_error();
        return 0;
    }
    int64_t start, size = batch_span(l, l->pos.batch, &start);
    if (l->cfg.collate) return next_collated(l, size, b) ? 1 : -1;
    tensor *x = batch_tensor(&l->ds->x_field, size);
    tensor *y = x ? batch_tensor(&l->ds->y_field, size) : NULL;
    if (!x || !y) {
        t_drop(x);
        return -1;
    }
    if (!l->running) {
        slot direct = {.x = t_ptr(x), .y = t_ptr(y)}; /* straight into the tensors */
        if (fill_batch(l, &l->own, l->pos, &direct) != EM_OK) {
            t_drop(x);
            t_drop(y);
            return -1;
        }
    } else {
        slot *s = head_slot(l, size);
        if (!s) {
            t_drop(x);
            t_drop(y);
            return -1;
        }
        memcpy(t_ptr(x), s->x, (size_t)size * l->xbytes);
        memcpy(t_ptr(y), s->y, (size_t)size * l->ybytes);
        pop_slot(l);
    }
    returned_one(l);
    *b = (em_batch){.x = t_handle(x), .y = t_handle(y), .size = size};
    return 1;
}

bool em_loader_last_was_final(const em_loader *l) { return l && l->last_final; }

uint64_t loader_last_stamp(const em_loader *l) { return l ? l->last_stamp : 0; }

/* ---- the random-window sampler ------------------------------------------------------------ */

em_status em_window_sampler_init(em_window_sampler *s, const em_tokens *tokens, int64_t B, int64_t T,
                                 uint64_t seed)
{
    if (!s || !tokens || (!tokens->data && tokens->n > 0))
        return em_err(EM_ERR_ARG, "em_window_sampler_init: sampler and tokens must not be NULL");
    if (B < 1 || T < 1)
        return em_err(EM_ERR_ARG, "em_window_sampler_init: B and T must be >= 1, got B %lld, T %lld",
                      (long long)B, (long long)T);
    if (tokens->n < T + 1)
        return em_err(EM_ERR_ARG, "em_window_sampler_init: %lld tokens is shorter than T + 1 = %lld",
                      (long long)tokens->n, (long long)(T + 1));
    *s = (em_window_sampler){
        em_tokens_view(tokens->data, tokens->n, tokens->type), B, T, em_rng_new(seed), 0, 1};
    return EM_OK;
}

static em_status window_sampler_next(em_window_sampler *s, em_batch *b);

em_status em_window_sampler_next(em_window_sampler *s, em_batch *b)
{
    prof_mark pm;
    prof_begin(&pm);
    em_status st = window_sampler_next(s, b);
    prof_end(&pm, "window_sampler", PROF_LOADER);
    return st;
}

static em_status window_sampler_next(em_window_sampler *s, em_batch *b)
{
    if (b) *b = (em_batch){0};
    if (!s || !b) return em_err(EM_ERR_ARG, "em_window_sampler_next: sampler and batch must not be NULL");
    int64_t B = s->batch, T = s->block, n = s->tokens.n;
    if (B < 1 || T < 1 || !s->tokens.data || n < T + 1)
        return em_err(EM_ERR_ARG, "em_window_sampler_next: sampler not set up (B %lld, T %lld, %lld tokens)",
                      (long long)B, (long long)T, (long long)n);
    if (s->world < 1 || s->rank < 0 || s->rank >= s->world || B % s->world != 0)
        return em_err(EM_ERR_ARG,
                      "em_window_sampler_next: bad shard: rank %d of world %d with batch %lld (needs 0 <= "
                      "rank < world and batch %% world == 0)",
                      s->rank, s->world, (long long)B);
    /* this rank's windows r0 .. r0+Bl-1 of the global draw of B */
    int64_t Bl = B / s->world, r0 = (int64_t)s->rank * Bl;
    tensor *x = t_new(EM_I32, 2, (int64_t[]){Bl, T});
    tensor *y = x ? t_new(EM_I32, 2, (int64_t[]){Bl, T}) : NULL;
    if (!x || !y) {
        t_drop(x);
        return em_last_status();
    }
    int32_t *px = t_ptr(x), *py = t_ptr(y);
    uint64_t starts = (uint64_t)(n - T); /* s in [0, n - T - 1] */
    for (int64_t r = 0; r < Bl; r++) {
        uint32_t w[4];
        em_philox4x32(s->rng.seed, 0, s->rng.offset + (uint64_t)(r0 + r), w);
        uint64_t u = (uint64_t)w[0] | (uint64_t)w[1] << 32;
        int64_t st0 = (int64_t)(((unsigned __int128)u * starts) >> 64);
        /* x[r] = tokens[s .. s+T), y[r] = tokens[s+1 .. s+T+1) */
        for (int64_t t = 0; t < T; t++) {
            px[r * T + t] = (int32_t)em_tokens_at(&s->tokens, st0 + t);
            py[r * T + t] = (int32_t)em_tokens_at(&s->tokens, st0 + t + 1);
        }
    }
    s->rng.offset += (uint64_t)B;
    *b = (em_batch){.x = t_handle(x), .y = t_handle(y), .size = Bl};
    return EM_OK;
}

em_status em_window_sampler_shard(em_window_sampler *s, int rank, int world)
{
    if (!s) return em_err(EM_ERR_ARG, "em_window_sampler_shard: sampler is NULL");
    if (world < 1 || rank < 0 || rank >= world)
        return em_err(EM_ERR_ARG, "em_window_sampler_shard: rank %d outside [0, world %d)", rank, world);
    if (s->batch % world != 0)
        return em_err(EM_ERR_ARG, "em_window_sampler_shard: batch %lld is not divisible by world %d",
                      (long long)s->batch, world);
    s->rank = rank;
    s->world = world;
    return EM_OK;
}
