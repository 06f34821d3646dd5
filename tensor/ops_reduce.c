/* ops_reduce.c — reductions over dims: sum, mean, max/min (torch.amax/amin)
 * and argmax.
 *
 * Every reduction splits the input's dims into kept dims (the output's
 * positions) and reduced dims (walked for each output element). sum has two
 * fast contiguous-f32 paths for the shapes training hits most: row sums over
 * trailing dims, (rows,inner)->(rows), and column sums over leading dims,
 * (R,C)->(C) (the bias gradient); the rest goes through one strided kernel.
 * f32 sums accumulate in double lanes, so summing 1e6 ones is exact and
 * long sums do not drift. Empty reductions: sum 0, mean NaN, max/min/argmax an error.
 *
 * On a CUDA device every reduction and the max/min backward run through
 * tensor/ops_elementwise.cu: one block per output element, a tree in shared
 * memory, double accumulators, a fixed order (results repeat run to run). */
#include "dispatch.h"
#include "kernel_impl.h"
#include "ops.h"
#if EM_HAVE_CUDA
#include "cuda_elementwise.h"
#endif

/* Parses (ndims, dims) into a mask of reduced dims; all dims when ndims==0. */
static bool reduce_mask(const char *op, const tensor *t, int ndims, const int *dims, bool *mask)
{
    for (int i = 0; i < t->ndim; i++) mask[i] = ndims == 0;
    if (ndims < 0 || (ndims && !dims)) {
        em_fail(EM_ERR_ARG, "%s: bad dims list (ndims %d, dims %s)", op, ndims, dims ? "given" : "NULL");
        return false;
    }
    for (int i = 0; i < ndims; i++) {
        int d = t_dim(op, dims[i], t->ndim, 0);
        if (d < 0) return false;
        if (mask[d]) {
            em_fail(EM_ERR_ARG, "%s: dim %d is listed twice (tensor %s)", op, dims[i], shp(t));
            return false;
        }
        mask[d] = true;
    }
    return true;
}

/* The split of t's dims into kept (k) and reduced (r) ones, and the output
 * shape (reduced dims dropped, or 1 with keepdim). */
typedef struct red_geo {
    bool mask[EM_MAX_DIMS];
    int nk, nr, on;
    int64_t kshape[EM_MAX_DIMS], kstride[EM_MAX_DIMS];
    int64_t rshape[EM_MAX_DIMS], rstride[EM_MAX_DIMS];
    int64_t oshape[EM_MAX_DIMS];
    int64_t bits;   /* bit i set: dim i reduced */
    int64_t kn, rn; /* output elements, elements per output */
} red_geo;

/* Fills g from g->mask (set) and t. */
static void red_split(const tensor *t, bool keepdim, red_geo *g)
{
    for (int i = 0; i < t->ndim; i++) {
        if (g->mask[i]) {
            g->bits |= (int64_t)1 << i;
            g->rshape[g->nr] = t->shape[i];
            g->rstride[g->nr++] = t->stride[i];
            if (keepdim) g->oshape[g->on++] = 1;
        } else {
            g->kshape[g->nk] = t->shape[i];
            g->kstride[g->nk++] = t->stride[i];
            g->oshape[g->on++] = t->shape[i];
        }
    }
    g->kn = shape_numel(g->nk, g->kshape);
    g->rn = shape_numel(g->nr, g->rshape);
}

static bool red_setup(const char *op, const tensor *t, int ndims, const int *dims, bool keepdim, red_geo *g)
{
    memset(g, 0, sizeof *g);
    if (!reduce_mask(op, t, ndims, dims, g->mask)) return false;
    red_split(t, keepdim, g);
    return true;
}

/* The geometry a kernel needs (kept and reduced dims, not the output's
 * shape) from its input and the reduced dims as bits (ip[0]). */
static void red_geo_of(const tensor *t, int64_t bits, red_geo *g)
{
    memset(g, 0, sizeof *g);
    for (int i = 0; i < t->ndim; i++) g->mask[i] = (bits >> i) & 1;
    red_split(t, false, g);
}

/* max/min/argmax have no value for an empty reduction. */
static bool chk_nonempty(const char *op, const tensor *t, const red_geo *g)
{
    if (g->rn > 0) return true;
    for (int i = 0; i < t->ndim; i++)
        if (g->mask[i] && t->shape[i] == 0) {
            em_fail(EM_ERR_SHAPE, "%s: cannot reduce over an empty dim: dim %d of %s has size 0", op, i,
                    shp(t));
            return false;
        }
    em_fail(EM_ERR_SHAPE, "%s: cannot reduce an empty tensor %s", op, shp(t));
    return false;
}

#if EM_HAVE_CUDA
/* g's kept and reduced dims as CUDA walks: kw operand 0 the contiguous
 * output, 1 the input; rw operand 1 the input */
static void red_walks(const red_geo *g, cu_walk *kw, cu_walk *rw)
{
    memset(kw, 0, sizeof *kw);
    memset(rw, 0, sizeof *rw);
    kw->ndim = g->nk;
    memcpy(kw->shape, g->kshape, sizeof(int64_t) * (size_t)g->nk);
    t_contig_strides(g->nk, g->kshape, kw->stride[0]);
    memcpy(kw->stride[1], g->kstride, sizeof(int64_t) * (size_t)g->nk);
    rw->ndim = g->nr;
    memcpy(rw->shape, g->rshape, sizeof(int64_t) * (size_t)g->nr);
    memcpy(rw->stride[1], g->rstride, sizeof(int64_t) * (size_t)g->nr);
}
#endif

/* ---- sum / mean -------------------------------------------------------------------- */

enum { LANES = 8 };

/* acc[k] += x[i + k] over the whole groups of LANES among x[0,n): each
 * lane its own chain, so it vectorises; returns how many it took. */
static int64_t add_lanes(double *acc, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) acc[k] += x[i + k];
    return i;
}

/* The sum of the tail x[0,n) in order, then of the lanes */
static double lanes_total(const double *acc, const float *x, int64_t n)
{
    double total = 0;
    for (int64_t i = 0; i < n; i++) total += x[i];
    for (int k = 0; k < LANES; k++) total += acc[k];
    return total;
}

/* Sum of n contiguous elements of dtype dt (f32, f16 or bf16) from p in
 * LANES double accumulators, added up at the end. An f16/bf16 row is
 * widened a block at a time (a multiple of LANES elements, so each element
 * meets the lane it would have as f32): the sum of the row cast to f32. */
static double sum_any(em_dtype dt, const void *p, int64_t n)
{
    double acc[LANES] = {0};
    if (dt == EM_F32) {
        int64_t i = add_lanes(acc, p, n);
        return lanes_total(acc, (const float *)p + i, n - i);
    }
    enum { BLOCK = 64 * LANES };
    float buf[BLOCK];
    size_t es = em_dtype_size(dt);
    for (int64_t b0 = 0;; b0 += BLOCK) {
        int64_t w = n - b0 < BLOCK ? n - b0 : BLOCK;
        convert_n(EM_F32, buf, dt, (const char *)p + b0 * (int64_t)es, w);
        int64_t i = add_lanes(acc, buf, w);
        if (b0 + BLOCK >= n) return lanes_total(acc, buf + i, w - i); /* the last block holds the tail */
    }
}

typedef struct sum_ctx {
    tensor *t, *out;
    const red_geo *g;
    double scale;    /* 1 for sum, 1/count for mean */
    int64_t inner;   /* row path: elements per row; column path: columns */
    int64_t rows;    /* column path: rows summed */
    int64_t nch;     /* row path: chunks per row (few long rows) */
    int64_t nparts;  /* column path: row ranges */
    double *partial; /* scratch made before the parallel call */
} sum_ctx;

/* Element i of the contiguous output: v rounded to float, then (f16/bf16)
 * to the output's dtype, as st rounds */
static inline void put_out(tensor *out, int64_t i, double v)
{
    if (out->dtype == EM_F32)
        ((float *)t_ptr(out))[i] = (float)v;
    else
        st(out->dtype, (char *)t_ptr(out) + i * (int64_t)t_esize(out), (float)v);
}

/* The contiguous input's element i (f32, f16 or bf16) */
static inline const char *elem_ptr(const tensor *t, int64_t i)
{
    return (const char *)t_ptr(t) + i * (int64_t)t_esize(t);
}

/* (rows,inner) -> (rows): one output per row. The f32 paths below take
 * f16/bf16 inputs too (sum_any), with an output of the input's dtype. */
static void sum_rows_f32(void *p, int64_t lo, int64_t hi)
{
    sum_ctx *c = p;
    em_dtype dt = c->t->dtype;
    for (int64_t r = lo; r < hi; r++)
        put_out(c->out, r, sum_any(dt, elem_ptr(c->t, r * c->inner), c->inner) * c->scale);
}

/* Few long rows: task i is chunk i % nch of row i / nch, into partial[i]. */
static void sum_chunks_f32(void *p, int64_t lo, int64_t hi)
{
    sum_ctx *c = p;
    for (int64_t i = lo; i < hi; i++) {
        int64_t r = i / c->nch, k = i % c->nch;
        int64_t a = c->inner * k / c->nch, b = c->inner * (k + 1) / c->nch;
        c->partial[i] = sum_any(c->t->dtype, elem_ptr(c->t, r * c->inner + a), b - a);
    }
}

/* (R,C) -> (C): part q adds its range of rows into partial[q*C ..] (an
 * f16/bf16 row widened a block of columns at a time). */
static void sum_cols_f32(void *p, int64_t lo, int64_t hi)
{
    sum_ctx *c = p;
    int64_t C = c->inner;
    enum { COLS = 512 };
    float buf[COLS];
    for (int64_t q = lo; q < hi; q++) {
        double *acc = c->partial + q * C;
        for (int64_t j = 0; j < C; j++) acc[j] = 0;
        int64_t r0 = c->rows * q / c->nparts, r1 = c->rows * (q + 1) / c->nparts;
        for (int64_t r = r0; r < r1; r++) {
            if (c->t->dtype == EM_F32) {
                const float *row = (const float *)t_ptr(c->t) + r * C;
                for (int64_t j = 0; j < C; j++) acc[j] += row[j];
                continue;
            }
            for (int64_t j0 = 0; j0 < C; j0 += COLS) {
                int64_t w = C - j0 < COLS ? C - j0 : COLS;
                convert_n(EM_F32, buf, c->t->dtype, elem_ptr(c->t, r * C + j0), w);
                for (int64_t j = 0; j < w; j++) acc[j0 + j] += buf[j];
            }
        }
    }
}

/* Any strides, any dtype: a double accumulator per output element. */
static void sum_strided(void *p, int64_t lo, int64_t hi)
{
    sum_ctx *c = p;
    const red_geo *g = c->g;
    em_dtype dt = c->t->dtype;
    size_t es = t_esize(c->t), os = t_esize(c->out);
    const char *base = t_ptr(c->t);
    nditer ko;
    nditer_init(&ko, g->nk, g->kshape, 1, (const int64_t *[]){g->kstride});
    nditer_seek(&ko, lo);
    for (int64_t i = lo; i < hi; i++) {
        double acc = 0;
        nditer ri;
        nditer_init(&ri, g->nr, g->rshape, 1, (const int64_t *[]){g->rstride});
        const char *b = base + ko.off[0] * (int64_t)es;
        if (dt == EM_F32) {
            for (int64_t j = 0; j < g->rn; j++) {
                acc += ((const float *)b)[ri.off[0]];
                nditer_next(&ri);
            }
        } else if (dt == EM_F64) {
            for (int64_t j = 0; j < g->rn; j++) {
                acc += ((const double *)b)[ri.off[0]];
                nditer_next(&ri);
            }
        } else {
            for (int64_t j = 0; j < g->rn; j++) {
                acc += ld(dt, b + ri.off[0] * (int64_t)es);
                nditer_next(&ri);
            }
        }
        st(c->out->dtype, (char *)t_ptr(c->out) + i * (int64_t)os, acc * c->scale);
        nditer_next(&ko);
    }
}

/* out (contiguous, the kept shape) = the sum of in[0] over the dims in the
 * bits of ip[0], times dp[0] (1 for sum, 1/count for mean). */
static em_status sum_cpu(const op_call *call, tensor *out)
{
    tensor *t = call->in[0];
    double scale = call->dp[0];
    red_geo geo;
    const red_geo *g = &geo;
    red_geo_of(t, call->ip[0], &geo);
    sum_ctx c = {.t = t, .out = out, .g = g, .scale = scale};
    int nd = t->ndim, first = nd, last = -1;
    for (int i = 0; i < nd; i++)
        if (g->mask[i]) {
            if (first == nd) first = i;
            last = i;
        }
    bool contiguous_mask = last < 0 || last - first + 1 == g->nr;
    bool suffix = contiguous_mask && (last == nd - 1 || nd == 0);
    bool prefix = contiguous_mask && first == 0 && last < nd - 1 && g->nr > 0;
    bool fast = (t->dtype == EM_F32 || t->dtype == EM_F16 || t->dtype == EM_BF16) && out->dtype == t->dtype &&
                t_is_contig(t) && g->kn > 0;
    int nt = em_num_threads();
    if (fast && suffix) {
        c.inner = g->rn;
        if (g->kn >= nt || g->rn < (1 << 16)) {
            parallel_for(g->kn, (1 << 15) / (g->rn + 1) + 1, sum_rows_f32, &c);
            return EM_OK;
        }
        c.nch = nt;
        size_t m = tmp_mark();
        c.partial = tmp_alloc(sizeof(double) * (size_t)(g->kn * c.nch));
        if (!c.partial) return em_last_status();
        parallel_for(g->kn * c.nch, 1, sum_chunks_f32, &c);
        for (int64_t r = 0; r < g->kn; r++) {
            double s = 0;
            for (int64_t k = 0; k < c.nch; k++) s += c.partial[r * c.nch + k];
            put_out(out, r, s * scale);
        }
        tmp_release(m);
        return EM_OK;
    }
    if (fast && prefix) {
        c.inner = g->kn;
        c.rows = g->rn;
        int64_t per = (1 << 15) / g->kn + 1; /* rows worth one part */
        c.nparts = c.rows / per < nt ? c.rows / per : nt;
        if (c.nparts < 1) c.nparts = 1;
        size_t m = tmp_mark();
        c.partial = tmp_alloc(sizeof(double) * (size_t)(c.nparts * g->kn));
        if (!c.partial) return em_last_status();
        parallel_for(c.nparts, 1, sum_cols_f32, &c);
        for (int64_t j = 0; j < g->kn; j++) {
            double s = 0;
            for (int64_t q = 0; q < c.nparts; q++) s += c.partial[q * g->kn + j];
            put_out(out, j, s * scale);
        }
        tmp_release(m);
        return EM_OK;
    }
    parallel_for(g->kn, g->rn >= 4096 ? 1 : 4096 / (g->rn + 1) + 1, sum_strided, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
/* every reduction on CUDA: the redop in ip[1], the reduced dims' bits in
 * ip[0], the result times dp[0] (mean's 1/count; 1 otherwise) */
static em_status reduce_cuda(const op_call *call, tensor *out)
{
    tensor *t = call->in[0];
    red_geo g;
    red_geo_of(t, call->ip[0], &g);
    cu_walk kw, rw;
    red_walks(&g, &kw, &rw);
    return cu_reduce(t->device.index, (redop)call->ip[1], &kw, &rw, t->dtype, t_ptr(t), out->dtype, t_ptr(out),
                     call->dp[0]);
}
#endif

static const op_kernels sum_kernels = OP_KERNELS(sum_cpu, reduce_cuda);

/* d sum = g broadcast back over the reduced dims; d mean = that / count.
 * g has the kept shape (keepdim or not). */
static em_status sum_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    int64_t ks[EM_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) ks[i] = (n->ip[0] >> i) & 1 ? 1 : x->shape[i];
    tensor *gs = n->dp[0] == 1.0 ? g : t_mul_scalar(g, n->dp[0]);
    tensor *gx = gs ? t_expand(t_reshape(gs, x->ndim, ks), x->ndim, x->shape) : NULL;
    return gx ? op_grad(x, gx) : em_last_status();
}

/* sum (OP_SUM) or mean (OP_MEAN) */
static tensor *sum_like(op_id id, tensor *t, int ndims, const int *dims, bool keepdim)
{
    const char *op = op_name(id);
    bool mean = id == OP_MEAN;
    OP_CALL(c);
    if (!op_begin(&c, id, 1, &t)) return NULL;
    red_geo g;
    if (!red_setup(op, t, ndims, dims, keepdim, &g)) return NULL;
    if (mean && !em_dtype_is_float(t->dtype))
        return em_fail(EM_ERR_DTYPE, "mean: needs a float tensor, got %s%s (cast it first)",
                       em_dtype_name(t->dtype), shp(t));
    if (t->dtype == EM_BOOL)
        return em_fail(EM_ERR_DTYPE, "%s: does not take bool tensors (%s); cast first", op, shp(t));
    /* integer sums accumulate in i32 like their inputs (u8 widens to i32) */
    em_dtype odt = t->dtype == EM_U8 ? EM_I32 : t->dtype;
    tensor *out = op_out(&c, odt, g.on, g.oshape);
    c.ip[0] = g.bits;
    /* mean of nothing is 0/0 = NaN */
    c.ip[1] = RED_SUM; /* for reduce_cuda: a mean is a sum times dp[0] */
    c.dp[0] = mean ? (g.rn ? 1.0 / (double)g.rn : NAN) : 1.0;
    if (!out || op_run(&c, &sum_kernels, out)) return NULL;
    return op_end(&c, out, sum_backward);
}

tensor *t_sum(tensor *t, int ndims, const int *dims, bool keepdim)
{
    return sum_like(OP_SUM, t, ndims, dims, keepdim);
}

static tensor *t_mean(tensor *t, int ndims, const int *dims, bool keepdim)
{
    return sum_like(OP_MEAN, t, ndims, dims, keepdim);
}

/* ---- max / min / argmax ------------------------------------------------------------ */

/* v beats the best so far m: strictly larger (smaller), or the first NaN
 * (NaN propagates, as in PyTorch). Ties keep the first. */
static inline bool beats(redop k, double v, double m)
{
    if (v != v) return m == m;
    return k == RED_MIN ? v < m : v > m;
}

typedef struct ext_ctx {
    redop k; /* RED_MAX, RED_MIN or RED_ARGMAX */
    tensor *t, *out;
    const red_geo *g;
} ext_ctx;

static void ext_range(void *p, int64_t lo, int64_t hi)
{
    ext_ctx *c = p;
    const red_geo *g = c->g;
    em_dtype dt = c->t->dtype;
    int64_t es = (int64_t)t_esize(c->t), os = (int64_t)t_esize(c->out);
    const char *base = t_ptr(c->t);
    nditer ko;
    nditer_init(&ko, g->nk, g->kshape, 1, (const int64_t *[]){g->kstride});
    nditer_seek(&ko, lo);
    for (int64_t i = lo; i < hi; i++) {
        nditer ri;
        nditer_init(&ri, g->nr, g->rshape, 1, (const int64_t *[]){g->rstride});
        const char *b = base + ko.off[0] * es;
        double m = ld(dt, b);
        int64_t at = 0;
        for (int64_t j = 0; j < g->rn; j++) {
            double v = dt == EM_F32 ? ((const float *)b)[ri.off[0]] : ld(dt, b + ri.off[0] * es);
            if (beats(c->k, v, m)) {
                m = v;
                at = j;
            }
            nditer_next(&ri);
        }
        char *o = (char *)t_ptr(c->out) + i * os;
        if (c->k == RED_ARGMAX)
            *(int32_t *)o = (int32_t)at;
        else
            st(c->out->dtype, o, m);
        nditer_next(&ko);
    }
}

/* Backward of max/min: per output, count the inputs equal to it (ties), and
 * give each of them g/count. Input, gradient and result strides per kept and
 * reduced dim are precomputed. */
typedef struct ext_bw_ctx {
    tensor *x, *y, *g, *gx;
    int nk, nr;
    int64_t kshape[EM_MAX_DIMS], rshape[EM_MAX_DIMS];
    int64_t kx[EM_MAX_DIMS], kg[EM_MAX_DIMS], kgx[EM_MAX_DIMS];
    int64_t rx[EM_MAX_DIMS], rgx[EM_MAX_DIMS];
} ext_bw_ctx;

static void ext_bw_range(void *p, int64_t lo, int64_t hi)
{
    ext_bw_ctx *c = p;
    em_dtype xt = c->x->dtype, gt = c->g->dtype, ot = c->gx->dtype;
    int64_t xs = (int64_t)t_esize(c->x), gs = (int64_t)t_esize(c->g), ys = (int64_t)t_esize(c->y),
            os = (int64_t)t_esize(c->gx);
    const char *xb = t_ptr(c->x), *gb = t_ptr(c->g), *yb = t_ptr(c->y);
    char *ob = t_ptr(c->gx);
    int64_t rn = shape_numel(c->nr, c->rshape);
    nditer ko;
    nditer_init(&ko, c->nk, c->kshape, 3, (const int64_t *[]){c->kx, c->kg, c->kgx});
    nditer_seek(&ko, lo);
    for (int64_t i = lo; i < hi; i++) {
        double y = ld(c->y->dtype, yb + i * ys), gv = ld(gt, gb + ko.off[1] * gs);
        nditer ri;
        nditer_init(&ri, c->nr, c->rshape, 2, (const int64_t *[]){c->rx, c->rgx});
        int64_t cnt = 0;
        for (int64_t j = 0; j < rn; j++) {
            cnt += ld(xt, xb + (ko.off[0] + ri.off[0]) * xs) == y;
            nditer_next(&ri);
        }
        double share = cnt ? gv / (double)cnt : 0;
        nditer_seek(&ri, 0);
        for (int64_t j = 0; j < rn; j++) {
            bool hit = ld(xt, xb + (ko.off[0] + ri.off[0]) * xs) == y;
            st(ot, ob + (ko.off[2] + ri.off[1]) * os, hit ? share : 0.0);
            nditer_next(&ri);
        }
        nditer_next(&ko);
    }
}

/* The backward's geometry: x = in[0], y = in[1] (the result), g = in[2],
 * the reduced dims in the bits of ip[0]; gx is the output. */
static void ext_bw_of(const op_call *call, tensor *gx, ext_bw_ctx *c)
{
    tensor *x = call->in[0], *g = call->in[2];
    *c = (ext_bw_ctx){.x = x, .y = call->in[1], .g = g, .gx = gx};
    bool keep = g->ndim == x->ndim;
    for (int i = 0; i < x->ndim; i++) {
        if ((call->ip[0] >> i) & 1) {
            c->rshape[c->nr] = x->shape[i];
            c->rx[c->nr] = x->stride[i];
            c->rgx[c->nr++] = gx->stride[i];
        } else {
            c->kshape[c->nk] = x->shape[i];
            c->kx[c->nk] = x->stride[i];
            c->kgx[c->nk] = gx->stride[i];
            c->kg[c->nk] = keep ? g->stride[i] : g->stride[c->nk];
            c->nk++;
        }
    }
}

static em_status ext_grad_cpu(const op_call *call, tensor *gx)
{
    ext_bw_ctx c;
    ext_bw_of(call, gx, &c);
    int64_t kn = shape_numel(c.nk, c.kshape), rn = shape_numel(c.nr, c.rshape);
    parallel_for(kn, rn >= 4096 ? 1 : 4096 / (rn + 1) + 1, ext_bw_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status ext_grad_cuda(const op_call *call, tensor *gx)
{
    ext_bw_ctx c;
    ext_bw_of(call, gx, &c);
    cu_walk kw = {.ndim = c.nk}, rw = {.ndim = c.nr};
    memcpy(kw.shape, c.kshape, sizeof(int64_t) * (size_t)c.nk);
    memcpy(kw.stride[0], c.kg, sizeof(int64_t) * (size_t)c.nk);
    memcpy(kw.stride[1], c.kx, sizeof(int64_t) * (size_t)c.nk);
    memcpy(kw.stride[2], c.kgx, sizeof(int64_t) * (size_t)c.nk);
    memcpy(rw.shape, c.rshape, sizeof(int64_t) * (size_t)c.nr);
    memcpy(rw.stride[1], c.rx, sizeof(int64_t) * (size_t)c.nr);
    memcpy(rw.stride[2], c.rgx, sizeof(int64_t) * (size_t)c.nr);
    return cu_extreme_backward(gx->device.index, &kw, &rw, c.x->dtype, t_ptr(c.x), c.y->dtype, t_ptr(c.y),
                               c.g->dtype, t_ptr(c.g), t_ptr(gx));
}
#endif

static const op_kernels ext_grad_kernels = OP_KERNELS(ext_grad_cpu, ext_grad_cuda);

/* d amax = g / (number of ties) at the elements equal to the result, else 0 */
static em_status ext_backward(node *n, tensor *g)
{
    tensor *x = n->in[0], *in[3] = {x, n->out, g};
    OP_CALL(c);
    if (!op_begin_backward(&c, n, 3, in)) return em_last_status();
    tensor *gx = op_out(&c, x->dtype, x->ndim, x->shape);
    if (!gx) return em_last_status();
    em_status s = op_run(&c, &ext_grad_kernels, gx);
    return s ? s : op_grad(x, gx);
}

/* out (contiguous, kept shape) = max/min/argmax (the redop in ip[1]) of
 * in[0] over the dims in the bits of ip[0] */
static em_status ext_cpu(const op_call *call, tensor *out)
{
    red_geo g;
    red_geo_of(call->in[0], call->ip[0], &g);
    ext_ctx c = {.k = (redop)call->ip[1], .t = call->in[0], .out = out, .g = &g};
    parallel_for(g.kn, g.rn >= 4096 ? 1 : 4096 / (g.rn + 1) + 1, ext_range, &c);
    return EM_OK;
}


static const op_kernels ext_kernels = OP_KERNELS(ext_cpu, reduce_cuda);

/* k: RED_MAX, RED_MIN or RED_ARGMAX */
static tensor *extreme(redop k, tensor *t, int ndims, const int *dims, bool keepdim)
{
    const char *op = redop_name(k);
    OP_CALL(c);
    if (!op_begin(&c, redop_ops[k], 1, &t)) return NULL;
    red_geo g;
    if (!red_setup(op, t, ndims, dims, keepdim, &g)) return NULL;
    if (!chk_nonempty(op, t, &g)) return NULL;
    tensor *out = op_out(&c, k == RED_ARGMAX ? EM_I32 : t->dtype, g.on, g.oshape);
    c.ip[0] = g.bits;
    c.ip[1] = k;
    c.dp[0] = 1.0;
    if (k == RED_ARGMAX) c.record = false; /* indices have no gradient */
    if (!out || op_run(&c, &ext_kernels, out)) return NULL;
    return op_end(&c, out, ext_backward);
}

/* ---- public wrappers ------------------------------------------------------------------ */

em_tensor *em_sum(em_tensor *h, int ndims, const int *dims, bool keepdim)
{
    tensor *t = t_resolve(h, "sum");
    return t ? t_handle(t_sum(t, ndims, dims, keepdim)) : NULL;
}

em_tensor *em_mean(em_tensor *h, int ndims, const int *dims, bool keepdim)
{
    tensor *t = t_resolve(h, "mean");
    return t ? t_handle(t_mean(t, ndims, dims, keepdim)) : NULL;
}

em_tensor *em_max(em_tensor *h, int ndims, const int *dims, bool keepdim)
{
    tensor *t = t_resolve(h, "max");
    return t ? t_handle(extreme(RED_MAX, t, ndims, dims, keepdim)) : NULL;
}

em_tensor *em_min(em_tensor *h, int ndims, const int *dims, bool keepdim)
{
    tensor *t = t_resolve(h, "min");
    return t ? t_handle(extreme(RED_MIN, t, ndims, dims, keepdim)) : NULL;
}

em_tensor *em_argmax(em_tensor *h, int dim, bool keepdim)
{
    tensor *t = t_resolve(h, "argmax");
    return t ? t_handle(extreme(RED_ARGMAX, t, 1, &dim, keepdim)) : NULL;
}

tensor *t_sum_to(tensor *g, int ndim, const int64_t *shape)
{
    if (g->ndim == ndim && !memcmp(g->shape, shape, sizeof(int64_t) * (size_t)ndim)) return g;
    int dims[EM_MAX_DIMS], nd = 0;
    int lead = g->ndim - ndim;
    for (int i = 0; i < g->ndim; i++)
        if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1)) dims[nd++] = i;
    tensor *s = nd ? t_sum(g, nd, dims, true) : g;
    if (!s) return NULL;
    return t_reshape(s, ndim, shape);
}
