/* memory.c — the three lifetimes: the slot table behind handles, persistent
 * storage, the per-thread scope arena with nestable step scopes, and the
 * per-thread temp arena for scratch inside one op.
 *
 * Handles: a handle is (generation << 32 | slot + 1) cast to a pointer. A slot
 * is reused after its tensor dies, with its generation bumped, so a stale
 * handle never resolves to the new tenant: that is how "used after its scope
 * ended" is caught for certain rather than by luck.
 *
 * Arenas: a list of chunks used as a stack. A mark is (chunk, used). Ending a
 * scope rewinds to its mark; the chunks stay, so the next step reuses them
 * without asking the system for memory.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "dispatch.h"
#include "kernel_impl.h"

/* ---- slot table ------------------------------------------------------------ */

enum { SLOTS_PER_PAGE = 4096, MAX_PAGES = 1 << 14 };

typedef struct slot {
    tensor t;           /* first, so &slot->t == (tensor *)slot */
    uint32_t next_free; /* 1-based index of the next free slot, 0 = none */
    bool live;
} slot;

static slot *pages[MAX_PAGES];
static uint32_t n_slots;   /* slots handed out so far (all pages) */
static uint32_t free_head; /* 1-based */
static int64_t n_live;
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;

static slot *slot_at(uint32_t i) { return &pages[i / SLOTS_PER_PAGE][i % SLOTS_PER_PAGE]; }

static tensor *slot_take(void)
{
    pthread_mutex_lock(&slot_lock);
    slot *s = NULL;
    uint32_t idx;
    if (free_head) {
        idx = free_head - 1;
        s = slot_at(idx);
        free_head = s->next_free;
    } else {
        idx = n_slots;
        uint32_t page = idx / SLOTS_PER_PAGE;
        if (page >= MAX_PAGES) {
            pthread_mutex_unlock(&slot_lock);
            return em_fail(EM_ERR_OOM, "tensor: more than %d live tensors", MAX_PAGES * SLOTS_PER_PAGE);
        }
        if (!pages[page]) {
            pages[page] = calloc(SLOTS_PER_PAGE, sizeof(slot));
            if (!pages[page]) {
                pthread_mutex_unlock(&slot_lock);
                return em_fail(EM_ERR_OOM, "tensor: out of memory for tensor headers");
            }
        }
        n_slots++;
        s = slot_at(idx);
        s->t.gen = 1;
    }
    uint32_t gen = s->t.gen;
    memset(&s->t, 0, sizeof s->t);
    s->t.gen = gen;
    s->t.slot = idx;
    s->live = true;
    n_live++;
    pthread_mutex_unlock(&slot_lock);
    return &s->t;
}

static void slot_give(tensor *t)
{
    pthread_mutex_lock(&slot_lock);
    slot *s = (slot *)t;
    s->live = false;
    n_live--;
    t->gen++;
    if (t->gen == 0) t->gen = 1;
    s->next_free = free_head;
    free_head = t->slot + 1;
    pthread_mutex_unlock(&slot_lock);
}

em_tensor *t_handle(tensor *t)
{
    if (!t) return NULL;
    return (em_tensor *)(uintptr_t)(((uint64_t)t->gen << 32) | ((uint64_t)t->slot + 1));
}

static tensor *lookup(const em_tensor *h)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    uint32_t idx = (uint32_t)(v & 0xffffffffu), gen = (uint32_t)(v >> 32);
    if (idx == 0 || idx > n_slots) return NULL;
    slot *s = slot_at(idx - 1);
    if (!s->live || s->t.gen != gen) return NULL;
    return &s->t;
}

tensor *t_resolve(const em_tensor *h, const char *op)
{
    if (!h) {
        if (em_last_status() == EM_OK) em_fail(EM_ERR_ARG, "%s: input tensor is NULL", op);
        return NULL;
    }
    tensor *t = lookup(h);
    if (!t)
        return em_fail(EM_ERR_SCOPE,
                       "%s: tensor handle %p is stale: its step scope has ended or it was freed "
                       "(keep it with em_keep to use it later)",
                       op, (const void *)h);
    if (t->device.type == EM_CUDA && !cuda_op_ok(op))
        return em_fail(EM_ERR_DEVICE, "%s: no CUDA kernel for this op yet; %s is on cuda:%d (em_to(t, em_device_cpu()) "
                                      "moves it to the CPU)",
                       op, shp(t), t->device.index);
    return t;
}

bool em_is_alive(const em_tensor *h) { return h && lookup(h); }

int64_t em_live_tensors(void)
{
    pthread_mutex_lock(&slot_lock);
    int64_t n = n_live;
    pthread_mutex_unlock(&slot_lock);
    return n;
}

/* ---- arenas ------------------------------------------------------------------ */

typedef struct chunk {
    struct chunk *next;
    size_t cap, used;
    _Alignas(64) unsigned char data[];
} chunk;

typedef struct arena {
    chunk *head; /* first chunk */
    chunk *cur;  /* chunk being carved */
    size_t reserved;
    uint64_t sys_allocs;
} arena;

typedef struct mark {
    chunk *c;
    size_t used;
} mark;

static void *arena_alloc(arena *a, size_t n)
{
    n = (n + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    for (;;) {
        chunk *c = a->cur;
        if (c && c->cap - c->used >= n) {
            void *p = c->data + c->used;
            c->used += n;
            return p;
        }
        if (c && c->next) { /* a later chunk kept from an earlier step */
            a->cur = c->next;
            a->cur->used = 0;
            continue;
        }
        size_t cap = n > ((size_t)4 << 20) ? n : ((size_t)4 << 20);
        if (a->reserved > cap) cap = a->reserved < n ? n : a->reserved; /* grow geometrically */
        chunk *nc = aligned_alloc(64, (sizeof(chunk) + cap + 63) & ~(size_t)63);
        if (!nc) return NULL;
        nc->next = NULL;
        nc->cap = cap;
        nc->used = 0;
        a->reserved += cap;
        a->sys_allocs++;
        if (c)
            c->next = nc;
        else
            a->head = nc;
        a->cur = nc;
    }
}

static mark arena_mark(arena *a) { return (mark){a->cur, a->cur ? a->cur->used : 0}; }

static void arena_rewind(arena *a, mark m)
{
    if (!m.c) {
        a->cur = a->head;
        if (a->cur) a->cur->used = 0;
        return;
    }
    a->cur = m.c;
    a->cur->used = m.used;
}

/* ---- scopes ------------------------------------------------------------------ */

enum { MAX_SCOPES = 64 };

typedef struct scope_frame {
    uint64_t id;
    mark m;
    tensor *tensors;  /* made in this scope, newest first */
    int64_t tape_len; /* tape length at begin */
} scope_frame;

static _Thread_local arena scope_arena;
static _Thread_local arena temp_arena;
static _Thread_local scope_frame frames[MAX_SCOPES + 1];
static _Thread_local int depth;
static uint64_t next_scope_id = 1; /* shared across threads: ids stay unique */


em_scope em_scope_begin(void)
{
    if (depth >= MAX_SCOPES) {
        em_fail(EM_ERR_SCOPE, "em_scope_begin: more than %d nested scopes", MAX_SCOPES);
        return (em_scope){-1, 0};
    }
    depth++;
    scope_frame *f = &frames[depth];
    f->id = __atomic_fetch_add(&next_scope_id, 1, __ATOMIC_RELAXED);
    f->m = arena_mark(&scope_arena);
    f->tensors = NULL;
    f->tape_len = tape_length();
    return (em_scope){depth, f->id};
}

static void storage_release(storage *s)
{
    if (!s || s->in_arena) return;
    if (--s->refcount == 0) {
#if EM_HAVE_CUDA
        if (s->dev.type == EM_CUDA)
            cu_free(s->dev.index, s->data);
        else
#endif
            free(s->data);
        free(s);
    }
}

/* Frees what a dying tensor owns outside the arena, then its slot. */
static void tensor_die(tensor *t)
{
    if (t->grad && !t->grad_external && t->grad->depth == 0) t_free(t->grad);
    t->grad = NULL;
    hook_entry *h = t->hooks;
    while (h) {
        hook_entry *n = h->next;
        free(h);
        h = n;
    }
    storage_release(t->st);
    slot_give(t);
}

em_status em_scope_end(em_scope s)
{
    if (s.depth <= 0 || s.depth != depth || frames[depth].id != s.id)
        return em_err(EM_ERR_SCOPE,
                      "em_scope_end: scope (depth %d, id %llu) is not the innermost open scope "
                      "(depth %d, id %llu); end scopes in reverse order",
                      s.depth, (unsigned long long)s.id, depth,
                      (unsigned long long)(depth ? frames[depth].id : 0));
    scope_frame *f = &frames[depth];
    for (tensor *t = f->tensors, *next; t; t = next) {
        next = t->scope_next;
        tensor_die(t);
    }
    tape_truncate(f->tape_len);
    arena_rewind(&scope_arena, f->m);
    depth--;
    return EM_OK;
}

int em_scope_depth(void) { return depth; }
size_t em_arena_reserved(void) { return scope_arena.reserved + temp_arena.reserved; }
uint64_t em_arena_system_allocs(void) { return scope_arena.sys_allocs + temp_arena.sys_allocs; }

size_t em_arena_in_use(void)
{
    /* the chunks up to the one being carved; a chunk left for a later one
     * counts up to where it was left (its tail is unused) */
    size_t n = 0;
    for (chunk *c = scope_arena.head; c && scope_arena.cur; c = c->next) {
        n += c->used;
        if (c == scope_arena.cur) break;
    }
    return n;
}

void *scope_alloc(size_t nbytes)
{
    if (depth == 0) return em_fail(EM_ERR_SCOPE, "scope_alloc: no step scope is open");
    void *p = arena_alloc(&scope_arena, nbytes);
    if (!p) return em_fail(EM_ERR_OOM, "scope arena: out of memory allocating %zu bytes", nbytes);
    return p;
}

size_t tmp_mark(void)
{
    /* encode (chunk index, used) compactly: walk is short (few chunks) */
    mark m = arena_mark(&temp_arena);
    size_t ci = 0;
    for (chunk *c = temp_arena.head; c && c != m.c; c = c->next) ci++;
    return (ci << 40) | m.used;
}

void *tmp_alloc(size_t nbytes)
{
    void *p = arena_alloc(&temp_arena, nbytes);
    if (!p) return em_fail(EM_ERR_OOM, "temp arena: out of memory allocating %zu bytes", nbytes);
    return p;
}

void tmp_release(size_t mk)
{
    size_t ci = mk >> 40, used = mk & (((size_t)1 << 40) - 1);
    chunk *c = temp_arena.head;
    if (!c) return;
    if (used == 0 && ci == 0 && temp_arena.cur == NULL) return;
    for (size_t i = 0; i < ci && c->next; i++) c = c->next;
    temp_arena.cur = c;
    c->used = used;
}

/* ---- tensors ---------------------------------------------------------------- */

static tensor *header(em_dtype dt, int ndim, const int64_t *shape)
{
    tensor *t = slot_take();
    if (!t) return NULL;
    t->dtype = dt;
    t->device = (em_device){EM_CPU, 0};
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->depth = depth;
    if (depth) {
        t->scope_next = frames[depth].tensors;
        frames[depth].tensors = t;
    }
    return t;
}

int64_t shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void t_contig_strides(int ndim, const int64_t *shape, int64_t *stride)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

/* The byte size of a new (dt, shape) tensor; false + error when invalid. */
static bool new_size(em_dtype dt, int ndim, const int64_t *shape, size_t *nbytes)
{
    if ((unsigned)dt >= EM_NUM_DTYPES) return em_fail(EM_ERR_DTYPE, "tensor: invalid dtype %d", (int)dt);
    if (ndim < 0 || ndim > EM_MAX_DIMS)
        return em_fail(EM_ERR_SHAPE, "tensor: %d dims; at most %d are supported", ndim, EM_MAX_DIMS);
    if (ndim && !shape) return em_fail(EM_ERR_ARG, "tensor: shape is NULL for %d dims", ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return em_fail(EM_ERR_SHAPE, "tensor: negative size %lld in shape %s", (long long)shape[i],
                           shp_of(ndim, shape));
    int64_t n = shape_numel(ndim, shape);
    if (n > ((int64_t)1 << 40)) return em_fail(EM_ERR_OOM, "tensor: shape %s is too large", shp_of(ndim, shape));
    *nbytes = (size_t)n * em_dtype_size(dt);
    return true;
}

tensor *t_new_on(em_device dev, em_dtype dt, int ndim, const int64_t *shape)
{
    if (dev.type == EM_CPU) return t_new(dt, ndim, shape);
#if EM_HAVE_CUDA
    size_t nbytes = 0;
    if (!new_size(dt, ndim, shape, &nbytes)) return NULL;
    /* device storage is never in the scope arena: the tensor's death (its
     * scope's end, or t_free) gives the block back to the caching allocator */
    storage *s = malloc(sizeof *s);
    void *d = s ? cu_alloc(dev.index, nbytes) : NULL;
    if (!d) {
        free(s);
        return s ? NULL : em_fail(EM_ERR_OOM, "tensor: out of memory for a storage header");
    }
    *s = (storage){.data = d, .nbytes = nbytes, .dev = dev, .refcount = 1, .in_arena = false};
    tensor *t = header(dt, ndim, shape);
    if (!t) {
        cu_free(dev.index, d);
        free(s);
        return NULL;
    }
    t->st = s;
    t->device = dev;
    t_contig_strides(ndim, shape, t->stride);
    return t;
#else
    (void)dt, (void)ndim, (void)shape;
    return em_fail(EM_ERR_DEVICE, "tensor: cuda:%d asked for, but this ember was built without CUDA", dev.index);
#endif
}

tensor *t_new(em_dtype dt, int ndim, const int64_t *shape)
{
    size_t nbytes = 0;
    if (!new_size(dt, ndim, shape, &nbytes)) return NULL;
    storage *s;
    if (depth) {
        s = arena_alloc(&scope_arena, sizeof(storage) + nbytes + 64);
        if (!s)
            return em_fail(EM_ERR_OOM, "tensor: out of memory for %s %s", em_dtype_name(dt),
                           shp_of(ndim, shape));
        s->data = (char *)s + 64; /* arena blocks are 64-aligned, so is data */
        s->dev = (em_device){EM_CPU, 0};
        s->in_arena = true;
        s->refcount = 1;
    } else {
        s = malloc(sizeof *s);
        void *d = aligned_alloc(64, (nbytes + 63) & ~(size_t)63 ? (nbytes + 63) & ~(size_t)63 : 64);
        if (!s || !d) {
            free(s);
            free(d);
            return em_fail(EM_ERR_OOM, "tensor: out of memory for %s %s", em_dtype_name(dt),
                           shp_of(ndim, shape));
        }
        s->data = d;
        s->dev = (em_device){EM_CPU, 0};
        s->in_arena = false;
        s->refcount = 0;
    }
    s->nbytes = nbytes;
    tensor *t = header(dt, ndim, shape);
    if (!t) {
        if (!s->in_arena) {
            free(s->data);
            free(s);
        }
        return NULL;
    }
    t->st = s;
    if (!s->in_arena) s->refcount++;
    t_contig_strides(ndim, shape, t->stride);
    return t;
}

tensor *t_new_persistent(em_dtype dt, int ndim, const int64_t *shape)
{
    return t_new_persistent_on((em_device){EM_CPU, 0}, dt, ndim, shape);
}

tensor *t_new_persistent_on(em_device dev, em_dtype dt, int ndim, const int64_t *shape)
{
    int saved = depth;
    depth = 0;
    tensor *t = t_new_on(dev, dt, ndim, shape);
    depth = saved;
    return t;
}

tensor *t_view_of(tensor *base, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset)
{
    tensor *t = header(base->dtype, ndim, shape);
    if (!t) return NULL;
    t->device = base->device;
    if (ndim) memcpy(t->stride, stride, sizeof(int64_t) * (size_t)ndim);
    t->offset = offset;
    t->st = base->st;
    if (!t->st->in_arena) t->st->refcount++;
    return t;
}

tensor *t_view_persistent(tensor *base, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset)
{
    int saved = depth;
    depth = 0;
    tensor *t = t_view_of(base, ndim, shape, stride, offset);
    depth = saved;
    return t;
}

void t_repoint(tensor *t, tensor *src, int64_t offset)
{
    storage *old = t->st;
    t->st = src->st;
    t->device = src->device;
    if (!t->st->in_arena) t->st->refcount++;
    t->offset = offset;
    t_contig_strides(t->ndim, t->shape, t->stride);
    storage_release(old);
}

void t_drop_now(tensor *t)
{
    if (t && t->depth > 0 && t->device.type != EM_CPU && t->st && !t->st->in_arena && t->st->refcount == 1) {
        storage_release(t->st);
        t->st = NULL;
        return;
    }
    t_drop(t);
}

void t_free(tensor *t)
{
    if (t) tensor_die(t);
}

em_status em_free(em_tensor *h)
{
    if (!h) return EM_OK;
    tensor *t = t_resolve(h, "em_free");
    if (!t) return em_last_status();
    if (t->depth != 0)
        return em_err(EM_ERR_SCOPE,
                      "em_free: %s%s belongs to step scope depth %d and is freed when it ends; only "
                      "persistent tensors are freed by hand",
                      em_dtype_name(t->dtype), shp(t), t->depth);
    tensor_die(t);
    return EM_OK;
}
