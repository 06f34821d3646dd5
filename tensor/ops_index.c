/* ops_index.c — ops driven by integer index tensors: embedding (a row
 * lookup), index_select (pick slices along a dim) and scatter_add (add
 * values at indexed positions, torch.scatter_add), with their backwards
 * (index-add of the gradient rows; gather of the gradient).
 *
 * Every index value is checked before anything is allocated: a bad one fails
 * with EM_ERR_INDEX naming the op, the value, its position and the range.
 * CUDA tensors take the kernels of tensor/ops_nn.cu (cuda_nn.h); indices on
 * the device are checked on a host copy first. */
#include <stdio.h>

#include "dispatch.h"
#include "kernel_impl.h"
#if EM_HAVE_CUDA
#include "cuda_nn.h"
#endif

/* ---- index checks ------------------------------------------------------------- */

/* Checks that every value of idx (EM_I32, any strides) lies in [0, limit).
 * `range` completes the message: "for 65 rows". */
static bool check_index(const char *op, const tensor *idx, int64_t limit, const char *range)
{
    int64_t n = t_numel(idx);
    const int32_t *p = t_ptr(idx);
    nditer it;
    nditer_init(&it, idx->ndim, idx->shape, 1, (const int64_t *[]){idx->stride});
    for (int64_t i = 0; i < n; i++) {
        int32_t v = p[it.off[0]];
        if (v < 0 || v >= limit) {
            if (idx->ndim <= 1)
                em_fail(EM_ERR_INDEX, "%s: index %d at position %lld is out of range %s", op, (int)v,
                        (long long)i, range);
            else
                em_fail(EM_ERR_INDEX, "%s: index %d at position %s is out of range %s", op, (int)v,
                        shp_of(idx->ndim, it.idx), range);
            return false;
        }
        nditer_next(&it);
    }
    return true;
}

/* check_index for indices anywhere: CUDA indices are checked on a host copy. */
static bool check_index_any(const char *op, tensor *idx, int64_t limit, const char *range)
{
#if EM_HAVE_CUDA
    if (t_on_cuda(idx)) {
        int64_t n = t_numel(idx);
        tensor *ic = t_contig(idx);
        size_t m = tmp_mark();
        int32_t *host = ic ? tmp_alloc(sizeof(int32_t) * (size_t)(n + 1)) : NULL;
        bool ok =
            host && !cu_memcpy(host, em_device_cpu(), t_ptr(ic), ic->device, sizeof(int32_t) * (size_t)n);
        if (ok) {
            tensor th = *ic;
            storage hs = {
                .data = host, .nbytes = sizeof(int32_t) * (size_t)n, .refcount = 1, .in_arena = true};
            th.st = &hs;
            th.offset = 0;
            th.device = em_device_cpu();
            ok = check_index(op, &th, limit, range);
        }
        tmp_release(m);
        if (ic && ic != idx) t_drop(ic);
        return ok;
    }
#endif
    return check_index(op, idx, limit, range);
}

/* ---- index_select / embedding forward: out (outer, K, inner) from t (outer, S, inner) */

typedef struct sel_ctx {
    tensor *t, *out;
    const int32_t *idx; /* K values, contiguous */
    int64_t K, inner;
    int d;             /* the indexed dim of t */
    bool inner_contig; /* t's dims after d are row-major contiguous */
} sel_ctx;

/* Element offset of t[o (flat over dims < d), v, 0...] */
static int64_t sel_src_offset(const sel_ctx *c, int64_t o, int64_t v)
{
    const tensor *t = c->t;
    int64_t off = v * t->stride[c->d];
    for (int i = c->d - 1; i >= 0; i--) {
        off += (o % t->shape[i]) * t->stride[i];
        o /= t->shape[i];
    }
    return off;
}

static void select_range(void *p, int64_t lo, int64_t hi)
{
    sel_ctx *c = p;
    const tensor *t = c->t;
    size_t es = t_esize(t);
    const char *src = t_ptr(t);
    char *dst = t_ptr(c->out);
    int nin = t->ndim - c->d - 1;
    for (int64_t r = lo; r < hi; r++) {
        int64_t o = r / c->K, k = r % c->K;
        const char *s = src + sel_src_offset(c, o, c->idx[k]) * (int64_t)es;
        char *dr = dst + r * c->inner * (int64_t)es;
        if (c->inner_contig) {
            memcpy(dr, s, (size_t)c->inner * es);
            continue;
        }
        nditer it;
        nditer_init(&it, nin, t->shape + c->d + 1, 1, (const int64_t *[]){t->stride + c->d + 1});
        for (int64_t j = 0; j < c->inner; j++) {
            memcpy(dr + j * (int64_t)es, s + it.off[0] * (int64_t)es, es);
            nditer_next(&it);
        }
    }
}

/* Copies idx (EM_I32, any strides) into a contiguous int32 array. */
static void load_index(const tensor *idx, int32_t *dst)
{
    const int32_t *p = t_ptr(idx);
    nditer it;
    nditer_init(&it, idx->ndim, idx->shape, 1, (const int64_t *[]){idx->stride});
    for (int64_t i = 0, n = t_numel(idx); i < n; i++) {
        dst[i] = p[it.off[0]];
        nditer_next(&it);
    }
}

/* The selection's sizes: t (outer, S, inner) along d by K indices */
static void select_sizes(const tensor *t, int d, const tensor *idx, int64_t *outer, int64_t *K,
                         int64_t *inner)
{
    *K = t_numel(idx);
    *outer = *inner = 1;
    for (int i = 0; i < d; i++) *outer *= t->shape[i];
    for (int i = d + 1; i < t->ndim; i++) *inner *= t->shape[i];
}

/* Gathers slices of t = in[0] along dim d = ip[0] by idx = in[1] into out
 * (shape of t with dim d = K). The op has checked the indices. */
static em_status select_cpu(const op_call *call, tensor *out)
{
    tensor *t = call->in[0], *idx = call->in[1];
    int d = (int)call->ip[0];
    int64_t K, outer, inner;
    select_sizes(t, d, idx, &outer, &K, &inner);
    if (outer * K * inner == 0) return EM_OK;
    size_t m = tmp_mark();
    int32_t *iv = tmp_alloc(sizeof(int32_t) * (size_t)K);
    if (!iv) return em_last_status();
    load_index(idx, iv);
    bool ic = true;
    int64_t s = 1;
    for (int i = t->ndim - 1; i > d; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) ic = false;
        s *= t->shape[i];
    }
    sel_ctx c = {t, out, iv, K, inner, d, ic};
    int64_t rows = outer * K;
    parallel_for(rows, (1 << 14) / inner + 1, select_range, &c);
    tmp_release(m);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status select_cuda(const op_call *call, tensor *out)
{
    tensor *t = call->in[0], *idx = call->in[1];
    int d = (int)call->ip[0];
    int64_t K, outer, inner;
    select_sizes(t, d, idx, &outer, &K, &inner);
    if (outer * K * inner == 0) return EM_OK;
    tensor *tc = t_contig(t), *ic = tc ? t_contig(idx) : NULL;
    em_status s = ic ? cu_index_gather(t->device.index, t_esize(t), t_ptr(tc), t_ptr(ic), t_ptr(out), outer,
                                       t->shape[d], K, inner)
                     : em_last_status();
    if (tc && tc != t) t_drop(tc);
    if (ic && ic != idx) t_drop(ic);
    return s;
}
#endif

/* index_select and embedding: one gather (embedding is dim 0 of its weight) */
static const op_kernels select_kernels = OP_KERNELS(select_cpu, select_cuda);

/* ---- index-add (the backward of selection) -------------------------------------
 * acc (outer, S, inner) += g (outer, K, inner) at rows idx; acc and g contiguous,
 * both f32 or both f64. Tasks are (outer row, block of columns), so no two
 * tasks write the same element and the sums do not depend on thread count. */

enum { ADD_BLOCK = 256 };

/* The columns of a task: ADD_BLOCK, or fewer (whole cache lines) when a
 * few outer slices would otherwise leave threads idle: an embedding's
 * gradient (one slice of C = 128 columns) is split over the pool too. The
 * sums are per column, so the blocks do not change their bits. */
static int64_t add_block(int64_t outer, int64_t inner)
{
    int64_t nt = em_num_threads(), blk = ADD_BLOCK;
    if (outer * ((inner + ADD_BLOCK - 1) / ADD_BLOCK) < nt) {
        int64_t per = (nt + outer - 1) / outer; /* blocks wanted per slice */
        blk = ((inner + per - 1) / per + 15) / 16 * 16;
        if (blk < 16) blk = 16;
        if (blk > ADD_BLOCK) blk = ADD_BLOCK;
    }
    return blk;
}

typedef struct iadd_ctx {
    tensor *acc, *g;
    const int32_t *idx; /* index_add: the row of each of the K rows of g; index_acc: its slot */
    int64_t S, K, inner, blk, nblk; /* columns blk to a task, nblk tasks per outer slice */
    /* index_acc: the U distinct rows (first-use order) and their sums */
    const int32_t *uniq;
    int64_t U;
    void *sums;
} iadd_ctx;

static void index_add_range(void *p, int64_t lo, int64_t hi)
{
    iadd_ctx *c = p;
    for (int64_t task = lo; task < hi; task++) {
        int64_t o = task / c->nblk, b = task % c->nblk;
        int64_t c0 = b * c->blk, c1 = c0 + c->blk < c->inner ? c0 + c->blk : c->inner;
        if (c->acc->dtype == EM_F32) {
            float *a = (float *)t_ptr(c->acc) + o * c->S * c->inner;
            const float *g = (const float *)t_ptr(c->g) + o * c->K * c->inner;
            for (int64_t k = 0; k < c->K; k++) {
                float *ar = a + c->idx[k] * c->inner;
                const float *gr = g + k * c->inner;
                for (int64_t j = c0; j < c1; j++) ar[j] += gr[j];
            }
        } else {
            double *a = (double *)t_ptr(c->acc) + o * c->S * c->inner;
            const double *g = (const double *)t_ptr(c->g) + o * c->K * c->inner;
            for (int64_t k = 0; k < c->K; k++) {
                double *ar = a + c->idx[k] * c->inner;
                const double *gr = g + k * c->inner;
                for (int64_t j = c0; j < c1; j++) ar[j] += gr[j];
            }
        }
    }
}

/* acc (the selected tensor's shape, f32 or f64) = zeros + g = in[0] added
 * at the indices idx = in[1] along dim ip[0]; duplicated indices accumulate */
static em_status index_add_cpu(const op_call *call, tensor *acc)
{
    tensor *g = call->in[0], *idx = call->in[1];
    int d = (int)call->ip[0];
    em_dtype ct = acc->dtype;
    tensor *gc = g->dtype == ct ? t_contig(g) : t_cast(g, ct);
    if (!gc) return em_last_status();
    em_status s = t_fill_zero(acc);
    if (s) return s;
    int64_t K, outer, inner;
    select_sizes(acc, d, idx, &outer, &K, &inner);
    if (outer * K * inner > 0) {
        size_t m = tmp_mark();
        int32_t *iv = tmp_alloc(sizeof(int32_t) * (size_t)K);
        if (!iv) return em_last_status();
        load_index(idx, iv);
        int64_t blk = add_block(outer, inner), nblk = (inner + blk - 1) / blk;
        iadd_ctx c = {acc, gc, iv, acc->shape[d], K, inner, blk, nblk, NULL, 0, NULL};
        parallel_for(outer * nblk, 1 + (1 << 14) / (K * (inner < blk ? inner : blk) + 1), index_add_range,
                     &c);
        tmp_release(m);
    }
    return EM_OK;
}

#if EM_HAVE_CUDA
/* the same on the device: the kernel reads g in its own dtype and adds in
 * acc's (atomics: see ops_nn.cu) */
static em_status index_add_cuda(const op_call *call, tensor *acc)
{
    tensor *g = call->in[0], *idx = call->in[1];
    int d = (int)call->ip[0];
    int64_t K, outer, inner;
    select_sizes(acc, d, idx, &outer, &K, &inner);
    em_status s = t_fill_zero(acc);
    if (s) return s;
    tensor *gc = t_contig(g), *ic = gc ? t_contig(idx) : NULL;
    s = ic ? cu_index_add(acc->device.index, acc->dtype, t_ptr(acc), g->dtype, t_ptr(gc), t_ptr(ic), outer,
                          acc->shape[d], K, inner)
           : em_last_status();
    if (gc && gc != g) t_drop(gc);
    if (ic && ic != idx) t_drop(ic);
    return s;
}
#endif

static const op_kernels index_add_kernels = OP_KERNELS(index_add_cpu, index_add_cuda);

/* The rows [c0,c1) of one outer slice o of index_acc, in element type T:
 * the rows of g summed per distinct row (in index order, from zero: what
 * index_add_range leaves in those rows), then each sum added once into acc. */
#define INDEX_ACC_COLS(T)                                                                                    \
    static void index_acc_cols_##T(const iadd_ctx *c, int64_t o, int64_t c0, int64_t c1)                     \
    {                                                                                                        \
        /* (locals: stores through u must not make the compiler reload c's fields) */                        \
        int64_t n = c->inner, K = c->K, U = c->U;                                                            \
        const int32_t *slot = c->idx, *uniq = c->uniq;                                                       \
        T *a = (T *)t_ptr(c->acc) + o * c->S * n, *u = (T *)c->sums + o * U * n;                             \
        const T *g = (const T *)t_ptr(c->g) + o * K * n;                                                     \
        for (int64_t r = 0; r < U; r++)                                                                      \
            for (int64_t j = c0; j < c1; j++) u[r * n + j] = 0;                                              \
        for (int64_t k = 0; k < K; k++) {                                                                    \
            T *ur = u + slot[k] * n;                                                                         \
            const T *gr = g + k * n;                                                                         \
            for (int64_t j = c0; j < c1; j++) ur[j] += gr[j];                                                \
        }                                                                                                    \
        for (int64_t r = 0; r < U; r++) {                                                                    \
            T *ar = a + uniq[r] * n;                                                                         \
            const T *ur = u + r * n;                                                                         \
            for (int64_t j = c0; j < c1; j++) ar[j] += ur[j];                                                \
        }                                                                                                    \
    }
INDEX_ACC_COLS(float)
INDEX_ACC_COLS(double)
#undef INDEX_ACC_COLS

/* One task of index_acc: a block of columns of one outer slice. */
static void index_acc_range(void *p, int64_t lo, int64_t hi)
{
    iadd_ctx *c = p;
    for (int64_t task = lo; task < hi; task++) {
        int64_t o = task / c->nblk, b = task % c->nblk;
        int64_t c0 = b * c->blk, c1 = c0 + c->blk < c->inner ? c0 + c->blk : c->inner;
        if (c->acc->dtype == EM_F32)
            index_acc_cols_float(c, o, c0, c1);
        else
            index_acc_cols_double(c, o, c0, c1);
    }
}

/* acc (contiguous, f32 or f64, already holding a gradient) += g = in[0]
 * added at the indices idx = in[1] along dim ip[0], on the CPU. The bits of
 * index_add_cpu into zeros followed by acc += that, but the scratch is the
 * size of g (one sum per distinct index), not of acc: an embedding's
 * gradient is not made a second time at (V,C). */
static em_status index_acc_cpu(const op_call *call, tensor *acc)
{
    tensor *g = call->in[0], *idx = call->in[1];
    int d = (int)call->ip[0];
    em_dtype ct = acc->dtype;
    int64_t K, outer, inner, S = acc->shape[d];
    select_sizes(acc, d, idx, &outer, &K, &inner);
    if (outer * K * inner == 0) return EM_OK;
    tensor *gc = g->dtype == ct ? t_contig(g) : t_cast(g, ct);
    if (!gc) return em_last_status();
    size_t m = tmp_mark();
    int32_t *iv = tmp_alloc(sizeof(int32_t) * (size_t)K), *slot = tmp_alloc(sizeof(int32_t) * (size_t)K),
            *uniq = tmp_alloc(sizeof(int32_t) * (size_t)K), *slot_of = tmp_alloc(sizeof(int32_t) * (size_t)S);
    if (!iv || !slot || !uniq || !slot_of) {
        tmp_release(m);
        return em_last_status();
    }
    load_index(idx, iv);
    memset(slot_of, 0xff, sizeof(int32_t) * (size_t)S); /* -1: no slot yet */
    int64_t U = 0;
    for (int64_t k = 0; k < K; k++) {
        if (slot_of[iv[k]] < 0) {
            slot_of[iv[k]] = (int32_t)U;
            uniq[U++] = iv[k];
        }
        slot[k] = slot_of[iv[k]];
    }
    void *sums = tmp_alloc((size_t)(outer * U * inner) * em_dtype_size(ct));
    if (!sums) {
        tmp_release(m);
        return em_last_status();
    }
    int64_t blk = add_block(outer, inner), nblk = (inner + blk - 1) / blk;
    iadd_ctx c = {acc, gc, slot, S, K, inner, blk, nblk, uniq, U, sums};
    parallel_for(outer * nblk, 1 + (1 << 14) / (K * (inner < blk ? inner : blk) + 1), index_acc_range, &c);
    tmp_release(m);
    return EM_OK;
}

/* The gradient of the selection node n made from t = n->in[0] along
 * dim n->ip[0] by idx = n->in[1], given the gradient g of the selection
 * (t's dims with dim d of idx's length): index_select's backward, an
 * index_add of g into zeros(t) along dim. */
static em_status index_add_backward(node *n, tensor *g)
{
    tensor *t = n->in[0], *in[2] = {g, n->in[1]};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 2, in)) return em_last_status();
    em_dtype ct = t->dtype == EM_F64 ? EM_F64 : EM_F32;
    /* on the CPU, straight into t's gradient (op_grad_acc): the weight's
     * gradient is not made a second time */
    bool fresh = false;
    tensor *acc = c.dev.type == EM_CPU && ct == t->dtype ? op_grad_acc(t, &fresh) : NULL;
    if (acc && t_is_contig(acc)) {
        em_status s = fresh ? index_add_cpu(&c, acc) : index_acc_cpu(&c, acc);
        return s ? s : op_grad_done(t);
    }
    tensor *dense = op_out(&c, ct, t->ndim, t->shape);
    if (!dense || op_run(&c, &index_add_kernels, dense)) return em_last_status();
    if (acc) { /* a permuted accumulator */
        if (fresh)
            copy_strided(acc, dense);
        else
            add_strided(acc, dense);
        return op_grad_done(t);
    }
    tensor *gx = ct == t->dtype ? dense : t_cast(dense, t->dtype);
    return gx ? op_grad(t, gx) : em_last_status();
}

/* d embedding: dW[idx[p]] += g[p]; g (...,C) seen as (P,C) (the node's ip[0] is 0) */
static em_status embedding_backward(node *n, tensor *g)
{
    int64_t shape[2] = {t_numel(n->in[1]), n->in[0]->shape[1]};
    tensor *g2 = t_reshape(g, 2, shape);
    return g2 ? index_add_backward(n, g2) : em_last_status();
}

static bool chk_index_dtype(const char *op, const tensor *idx)
{
    if (idx->dtype == EM_I32) return true;
    em_fail(EM_ERR_DTYPE, "%s: indices must be i32, got %s%s", op, em_dtype_name(idx->dtype), shp(idx));
    return false;
}

static tensor *t_index_select(tensor *t, int dim, tensor *idx)
{
    tensor *in[2] = {t, idx};
    OP_CALL(c);
    if (!op_begin(&c, OP_INDEX_SELECT, 2, in)) return NULL;
    t = in[0], idx = in[1];
    int d = t_dim("index_select", dim, t->ndim, 0);
    if (d < 0 || !chk_index_dtype("index_select", idx)) return NULL;
    if (idx->ndim != 1) return em_fail(EM_ERR_SHAPE, "index_select: indices must be 1-D, got %s", shp(idx));
    char range[96];
    snprintf(range, sizeof range, "for dim %d of size %lld (shape %s)", dim, (long long)t->shape[d], shp(t));
    if (!check_index_any("index_select", idx, t->shape[d], range)) return NULL;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[d] = idx->shape[0];
    tensor *out = op_out(&c, t->dtype, t->ndim, shape);
    c.ip[0] = d;
    if (!out || op_run(&c, &select_kernels, out)) return NULL;
    return op_end(&c, out, index_add_backward); /* idx (i32) never requires grad */
}

static tensor *t_embedding(tensor *w, tensor *idx)
{
    tensor *in[2] = {w, idx};
    OP_CALL(c);
    if (!op_begin(&c, OP_EMBEDDING, 2, in)) return NULL;
    w = in[0], idx = in[1];
    if (w->ndim != 2) return em_fail(EM_ERR_SHAPE, "embedding: weight must be 2-D (V,C), got %s", shp(w));
    if (!chk_index_dtype("embedding", idx)) return NULL;
    if (idx->ndim + 1 > EM_MAX_DIMS)
        return em_fail(EM_ERR_SHAPE, "embedding: indices %s have too many dims for a (...,C) result",
                       shp(idx));
    char range[64];
    snprintf(range, sizeof range, "for %lld rows", (long long)w->shape[0]);
    if (!check_index_any("embedding", idx, w->shape[0], range)) return NULL;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    shape[idx->ndim] = w->shape[1];
    tensor *out = op_out(&c, w->dtype, idx->ndim + 1, shape);
    c.ip[0] = 0; /* rows of w */
    if (!out || op_run(&c, &select_kernels, out)) return NULL;
    return op_end(&c, out, embedding_backward);
}

/* ---- scatter_add / gather ---------------------------------------------------------
 * Both walk the positions of index with dim d removed (R of them); for each
 * they run along d serially. Different positions touch different output
 * elements, so the parallel split is race-free and deterministic. */

typedef struct scat_ctx {
    tensor *out, *index, *src; /* gather: out = result, src = g */
    int d, nr;
    int64_t L; /* index->shape[d] */
    int64_t rshape[EM_MAX_DIMS], ro[EM_MAX_DIMS], ri[EM_MAX_DIMS], rs[EM_MAX_DIMS];
} scat_ctx;

static void scat_init(scat_ctx *c, tensor *out, tensor *index, tensor *src, int d)
{
    *c = (scat_ctx){.out = out, .index = index, .src = src, .d = d, .L = index->shape[d]};
    for (int i = 0; i < index->ndim; i++) {
        if (i == d) continue;
        c->rshape[c->nr] = index->shape[i];
        c->ro[c->nr] = out->stride[i];
        c->ri[c->nr] = index->stride[i];
        c->rs[c->nr++] = src->stride[i];
    }
}

/* out[.., index[p], ..] += src[p] */
static void scatter_range(void *p, int64_t lo, int64_t hi)
{
    scat_ctx *c = p;
    em_dtype dt = c->out->dtype;
    size_t es = t_esize(c->out);
    char *o = t_ptr(c->out);
    const char *s = t_ptr(c->src);
    const int32_t *ix = t_ptr(c->index);
    int64_t osd = c->out->stride[c->d], isd = c->index->stride[c->d], ssd = c->src->stride[c->d];
    nditer it;
    nditer_init(&it, c->nr, c->rshape, 3, (const int64_t *[]){c->ro, c->ri, c->rs});
    nditer_seek(&it, lo);
    for (int64_t r = lo; r < hi; r++) {
        for (int64_t j = 0; j < c->L; j++) {
            int64_t oo = it.off[0] + ix[it.off[1] + j * isd] * osd, so = it.off[2] + j * ssd;
            if (dt == EM_F32)
                ((float *)o)[oo] += ((const float *)s)[so];
            else if (dt == EM_F64)
                ((double *)o)[oo] += ((const double *)s)[so];
            else
                st(dt, o + oo * (int64_t)es, ld(dt, o + oo * (int64_t)es) + ld(dt, s + so * (int64_t)es));
        }
        nditer_next(&it);
    }
}

/* out[p] = src[.., index[p], ..] (out has index's shape) */
static void gather_range(void *p, int64_t lo, int64_t hi)
{
    scat_ctx *c = p;
    size_t es = t_esize(c->out);
    char *o = t_ptr(c->out);
    const char *s = t_ptr(c->src);
    const int32_t *ix = t_ptr(c->index);
    int64_t osd = c->out->stride[c->d], isd = c->index->stride[c->d], ssd = c->src->stride[c->d];
    nditer it;
    nditer_init(&it, c->nr, c->rshape, 3, (const int64_t *[]){c->ro, c->ri, c->rs});
    nditer_seek(&it, lo);
    for (int64_t r = lo; r < hi; r++) {
        for (int64_t j = 0; j < c->L; j++)
            memcpy(o + (it.off[0] + j * osd) * (int64_t)es,
                   s + (it.off[2] + ix[it.off[1] + j * isd] * ssd) * (int64_t)es, es);
        nditer_next(&it);
    }
}

static int64_t scat_grain(int64_t L) { return (1 << 13) / (L + 1) + 1; }

#if EM_HAVE_CUDA
/* c's positions as a CUDA walk: operands 0 out, 1 index, 2 src */
static void scat_walk(const scat_ctx *c, cu_walk *w)
{
    w->ndim = c->nr;
    for (int i = 0; i < c->nr; i++) {
        w->shape[i] = c->rshape[i];
        w->stride[0][i] = c->ro[i];
        w->stride[1][i] = c->ri[i];
        w->stride[2][i] = c->rs[i];
    }
}
#endif

/* out (index's shape) = g = in[1] gathered at index = in[0] along dim ip[0] */
static em_status gather_cpu(const op_call *call, tensor *out)
{
    scat_ctx c;
    scat_init(&c, out, call->in[0], call->in[1], (int)call->ip[0]);
    /* gather_range reads g through c.rs and writes out through c.ro */
    parallel_for(shape_numel(c.nr, c.rshape), scat_grain(c.L), gather_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status gather_cuda(const op_call *call, tensor *out)
{
    tensor *index = call->in[0], *g = call->in[1];
    scat_ctx c;
    scat_init(&c, out, index, g, (int)call->ip[0]);
    cu_walk w;
    scat_walk(&c, &w);
    return cu_gather_dim(g->device.index, t_esize(g), &w, c.L, out->stride[c.d], index->stride[c.d],
                         g->stride[c.d], t_ptr(out), t_ptr(index), t_ptr(g));
}
#endif

static const op_kernels gather_kernels = OP_KERNELS(gather_cpu, gather_cuda);

/* d scatter_add: dt = g ; dsrc = gather(g, dim, index) */
static em_status scatter_backward(node *n, tensor *g)
{
    tensor *t = n->in[0], *index = n->in[1], *src = n->in[2];
    em_status s;
    if (t->requires_grad && (s = op_grad(t, g))) return s;
    if (!src->requires_grad) return EM_OK;
    tensor *in[2] = {index, g};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 2, in)) return em_last_status();
    tensor *gs = op_out(&c, g->dtype, index->ndim, index->shape);
    if (!gs) return em_last_status();
    s = op_run(&c, &gather_kernels, gs);
    return s ? s : op_grad(src, gs);
}

/* out (a copy of t = in[0]) += src = in[2] at index = in[1] along dim ip[0] */
static em_status scatter_cpu(const op_call *call, tensor *out)
{
    copy_strided(out, call->in[0]);
    scat_ctx c;
    scat_init(&c, out, call->in[1], call->in[2], (int)call->ip[0]);
    parallel_for(shape_numel(c.nr, c.rshape), scat_grain(c.L), scatter_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status scatter_cuda(const op_call *call, tensor *out)
{
    tensor *t = call->in[0], *index = call->in[1], *src = call->in[2];
    int d = (int)call->ip[0];
    copy_strided(out, t);
    scat_ctx c;
    scat_init(&c, out, index, src, d);
    cu_walk w;
    scat_walk(&c, &w);
    return cu_scatter_add(t->device.index, t->dtype, &w, c.L, out->stride[d], index->stride[d],
                          src->stride[d], t_ptr(out), t_ptr(index), t_ptr(src));
}
#endif

static const op_kernels scatter_kernels = OP_KERNELS(scatter_cpu, scatter_cuda);

static tensor *t_scatter_add(tensor *t, int dim, tensor *index, tensor *src)
{
    const char *op = "scatter_add";
    tensor *in[3] = {t, index, src};
    OP_CALL(c);
    if (!op_begin(&c, OP_SCATTER_ADD, 3, in)) return NULL;
    t = in[0], index = in[1], src = in[2];
    int d = t_dim(op, dim, t->ndim, 0);
    if (d < 0 || !chk_index_dtype(op, index) || !chk_same_dtype(op, t, src)) return NULL;
    if (t->dtype == EM_BOOL) return em_fail(EM_ERR_DTYPE, "%s: does not take bool tensors (%s)", op, shp(t));
    if (index->ndim != t->ndim)
        return em_fail(EM_ERR_SHAPE, "%s: index %s must have as many dims as the input %s", op, shp(index),
                       shp(t));
    if (src->ndim != index->ndim || memcmp(src->shape, index->shape, sizeof(int64_t) * (size_t)index->ndim))
        return em_fail(EM_ERR_SHAPE, "%s: src %s and index %s must have the same shape", op, shp(src),
                       shp(index));
    for (int i = 0; i < t->ndim; i++)
        if (i != d && index->shape[i] > t->shape[i])
            return em_fail(EM_ERR_SHAPE, "%s: index %s is larger than the input %s in dim %d", op, shp(index),
                           shp(t), i);
    char range[96];
    snprintf(range, sizeof range, "for dim %d of size %lld (input %s)", dim, (long long)t->shape[d], shp(t));
    if (!check_index_any(op, index, t->shape[d], range)) return NULL;
    tensor *out = op_out(&c, t->dtype, t->ndim, t->shape);
    c.ip[0] = d;
    if (!out || op_run(&c, &scatter_kernels, out)) return NULL;
    return op_end(&c, out, scatter_backward);
}

/* ---- public wrappers ------------------------------------------------------------------ */

em_tensor *em_embedding(em_tensor *weight, em_tensor *idx)
{
    tensor *w = t_resolve(weight, "embedding"), *i = w ? t_resolve(idx, "embedding") : NULL;
    return i ? t_handle(t_embedding(w, i)) : NULL;
}

em_tensor *em_index_select(em_tensor *t, int dim, em_tensor *idx)
{
    tensor *x = t_resolve(t, "index_select"), *i = x ? t_resolve(idx, "index_select") : NULL;
    return i ? t_handle(t_index_select(x, dim, i)) : NULL;
}

em_tensor *em_scatter_add(em_tensor *t, int dim, em_tensor *index, em_tensor *src)
{
    tensor *x = t_resolve(t, "scatter_add"), *i = x ? t_resolve(index, "scatter_add") : NULL;
    tensor *s = i ? t_resolve(src, "scatter_add") : NULL;
    return s ? t_handle(t_scatter_add(x, dim, i, s)) : NULL;
}
