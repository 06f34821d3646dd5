/* iter.c — the shared machinery of ops: strided iteration, broadcasting,
 * dtype checks, contiguous copies and dim normalisation. */
#include "kernel_impl.h"
#include "tensor_impl.h"

void nditer_init(nditer *it, int ndim, const int64_t *shape, int nop, const int64_t *const *strides)
{
    it->ndim = ndim;
    it->nop = nop;
    for (int d = 0; d < ndim; d++) {
        it->shape[d] = shape[d];
        it->idx[d] = 0;
        for (int k = 0; k < nop; k++) it->stride[k][d] = strides[k][d];
    }
    for (int k = 0; k < nop; k++) it->off[k] = 0;
}

void nditer_seek(nditer *it, int64_t linear)
{
    for (int k = 0; k < it->nop; k++) it->off[k] = 0;
    for (int d = it->ndim - 1; d >= 0; d--) {
        int64_t n = it->shape[d] ? it->shape[d] : 1;
        it->idx[d] = linear % n;
        linear /= n;
        for (int k = 0; k < it->nop; k++) it->off[k] += it->idx[d] * it->stride[k][d];
    }
}

em_status bcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb, int *ndim,
                      int64_t *shape)
{
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t x = ia >= 0 ? sa[ia] : 1, y = ib >= 0 ? sb[ib] : 1;
        if (x != y && x != 1 && y != 1)
            return em_err(EM_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                          shp_of(na, sa), shp_of(nb, sb), i - n, (long long)x, (long long)y);
        shape[i] = x == 1 ? y : x;
    }
    *ndim = n;
    return EM_OK;
}

void bcast_strides(const tensor *t, int ndim, const int64_t *shape, int64_t *stride)
{
    for (int i = 0; i < ndim; i++) {
        int it = t->ndim - ndim + i;
        stride[i] = (it < 0 || (t->shape[it] == 1 && shape[i] != 1)) ? 0 : t->stride[it];
    }
}

bool chk_same_dtype(const char *op, const tensor *a, const tensor *b)
{
    if (a->dtype == b->dtype) return true;
    em_fail(EM_ERR_DTYPE, "%s: dtypes differ: %s%s and %s%s (cast one with em_cast)", op,
            em_dtype_name(a->dtype), shp(a), em_dtype_name(b->dtype), shp(b));
    return false;
}

bool chk_float(const char *op, const tensor *t)
{
    if (em_dtype_is_float(t->dtype)) return true;
    em_fail(EM_ERR_DTYPE, "%s: needs a float tensor, got %s%s", op, em_dtype_name(t->dtype), shp(t));
    return false;
}

bool chk_dtype(const char *op, const tensor *t, em_dtype want, const char *what)
{
    if (t->dtype == want) return true;
    em_fail(EM_ERR_DTYPE, "%s: %s must be %s, got %s%s", op, what, em_dtype_name(want),
            em_dtype_name(t->dtype), shp(t));
    return false;
}

int t_dim(const char *op, int dim, int ndim, int extra)
{
    int n = ndim + extra;
    int d = dim < 0 ? dim + n : dim;
    if (d < 0 || d >= n || (n == 0)) {
        em_fail(EM_ERR_ARG, "%s: dim %d is out of range for a %d-dim tensor", op, dim, ndim);
        return -1;
    }
    return d;
}

bool t_is_contig(const tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

int64_t t_numel(const tensor *t) { return shape_numel(t->ndim, t->shape); }

typedef struct copy_ctx {
    tensor *dst;
    const tensor *src;
    int64_t row; /* > 0: copy whole rows of this many elements (both inner dims contiguous) */
} copy_ctx;

/* Inner dim contiguous in both: ranges are rows, one memcpy each, or one
 * convert_n where the dtypes differ (the bits of copy_range's st(ld())). */
static void copy_rows(void *p, int64_t lo, int64_t hi)
{
    copy_ctx *c = p;
    tensor *d = c->dst;
    const tensor *s = c->src;
    size_t es = t_esize(d), ss = t_esize(s), bytes = (size_t)c->row * es;
    char *dp = t_ptr(d);
    const char *sp = t_ptr(s);
    nditer it;
    nditer_init(&it, d->ndim - 1, d->shape, 2, (const int64_t *[]){d->stride, s->stride});
    nditer_seek(&it, lo);
    for (int64_t r = lo; r < hi; r++) {
        if (d->dtype == s->dtype)
            memcpy(dp + it.off[0] * (int64_t)es, sp + it.off[1] * (int64_t)es, bytes);
        else
            convert_n(d->dtype, dp + it.off[0] * (int64_t)es, s->dtype, sp + it.off[1] * (int64_t)ss, c->row);
        nditer_next(&it);
    }
}

/* Element by element: typed moves for equal dtypes; a conversion a run of
 * the last dim at a time (convert_strided: the same bits as converting
 * each element, without a call and a switch per element). */
static void copy_range(void *p, int64_t lo, int64_t hi)
{
    copy_ctx *c = p;
    tensor *d = c->dst;
    const tensor *s = c->src;
    size_t ds = t_esize(d), ss = t_esize(s);
    char *dp = t_ptr(d);
    const char *sp = t_ptr(s);
    nditer it;
    nditer_init(&it, d->ndim, d->shape, 2, (const int64_t *[]){d->stride, s->stride});
    nditer_seek(&it, lo);
    if (d->dtype != s->dtype) {
        int last = d->ndim - 1;
        int64_t len = last >= 0 ? d->shape[last] : 1;
        int64_t dst1 = last >= 0 ? d->stride[last] : 1, sst1 = last >= 0 ? s->stride[last] : 1;
        for (int64_t i = lo; i < hi;) {
            int64_t col = last >= 0 ? it.idx[last] : 0, w = len - col < hi - i ? len - col : hi - i;
            convert_strided(d->dtype, dp + it.off[0] * (int64_t)ds, dst1, s->dtype,
                            sp + it.off[1] * (int64_t)ss, sst1, w);
            i += w;
            if (i < hi) { /* the run ended its row: on to the next row's start */
                for (int k = 0; k < 2; k++) it.off[k] += (len - 1 - col) * it.stride[k][last];
                it.idx[last] = len - 1;
                nditer_next(&it);
            }
        }
        return;
    }
    switch (ds) {
    case 4:
        for (int64_t i = lo; i < hi; i++) {
            ((uint32_t *)dp)[it.off[0]] = ((const uint32_t *)sp)[it.off[1]];
            nditer_next(&it);
        }
        break;
    case 2:
        for (int64_t i = lo; i < hi; i++) {
            ((uint16_t *)dp)[it.off[0]] = ((const uint16_t *)sp)[it.off[1]];
            nditer_next(&it);
        }
        break;
    case 8:
        for (int64_t i = lo; i < hi; i++) {
            ((uint64_t *)dp)[it.off[0]] = ((const uint64_t *)sp)[it.off[1]];
            nditer_next(&it);
        }
        break;
    default:
        for (int64_t i = lo; i < hi; i++) {
            dp[it.off[0]] = sp[it.off[1]];
            nditer_next(&it);
        }
    }
}

/* ---- bulk kernels over contiguous buffers, split over the pool ---- */

typedef struct bulk_ctx {
    em_dtype to, from;
    void *dst;
    const void *src;
} bulk_ctx;

static void convert_range(void *ctx, int64_t lo, int64_t hi)
{
    const bulk_ctx *c = ctx;
    size_t sd = em_dtype_size(c->to), ss = em_dtype_size(c->from);
    convert_n(c->to, (char *)c->dst + lo * (int64_t)sd, c->from, (const char *)c->src + lo * (int64_t)ss,
              hi - lo);
}

void convert_par(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n)
{
    bulk_ctx c = {to, from, dst, src};
    if (n >= 1 << 16 && (to != from || n >= 1 << 20))
        parallel_for(n, 1 << 15, convert_range, &c);
    else
        convert_n(to, dst, from, src, n);
}

static void zero_range(void *ctx, int64_t lo, int64_t hi)
{
    memset((char *)((bulk_ctx *)ctx)->dst + lo, 0, (size_t)(hi - lo));
}

void zero_par(void *dst, size_t bytes)
{
    bulk_ctx c = {EM_U8, EM_U8, dst, NULL};
    if (bytes >= 1 << 22)
        parallel_for((int64_t)bytes, 1 << 20, zero_range, &c);
    else
        memset(dst, 0, bytes);
}

/* dst (f32 or f64) += src (any float dtype); widening conversions are exact,
 * so this equals converting src first, then adding. dst f16 or bf16 (src
 * f32, f16 or bf16): each sum in f32, rounded into dst, a piece at a time
 * (the bits of adding in double and rounding, as the sum of two floats
 * computed in double rounds to the float sum). */
static void add_range(void *ctx, int64_t lo, int64_t hi)
{
    const bulk_ctx *c = ctx;
    if (c->to == EM_F16 || c->to == EM_BF16) {
        enum { LOW_PIECE = 512 };
        float d[LOW_PIECE], s[LOW_PIECE];
        size_t ss = em_dtype_size(c->from), sd = em_dtype_size(c->to);
        for (int64_t p = lo; p < hi; p += LOW_PIECE) {
            int64_t k = hi - p < LOW_PIECE ? hi - p : LOW_PIECE;
            char *dp = (char *)c->dst + p * (int64_t)sd;
            convert_n(EM_F32, d, c->to, dp, k);
            convert_n(EM_F32, s, c->from, (const char *)c->src + p * (int64_t)ss, k);
            for (int64_t i = 0; i < k; i++) d[i] += s[i];
            convert_n(c->to, dp, EM_F32, d, k);
        }
        return;
    }
    if (c->to == EM_F32 && c->from == EM_F32) {
        float *restrict d = (float *)c->dst + lo;
        const float *restrict s = (const float *)c->src + lo;
        for (int64_t i = 0; i < hi - lo; i++) d[i] += s[i];
        return;
    }
    if (c->to == EM_F64 && c->from == EM_F64) {
        double *restrict d = (double *)c->dst + lo;
        const double *restrict s = (const double *)c->src + lo;
        for (int64_t i = 0; i < hi - lo; i++) d[i] += s[i];
        return;
    }
    enum { PIECE = 512 };
    double buf[PIECE]; /* one piece of src in dst's dtype (8-byte elements fit either) */
    size_t ss = em_dtype_size(c->from), sd = em_dtype_size(c->to);
    for (int64_t p = lo; p < hi; p += PIECE) {
        int64_t k = hi - p < PIECE ? hi - p : PIECE;
        convert_n(c->to, buf, c->from, (const char *)c->src + p * (int64_t)ss, k);
        bulk_ctx one = {c->to, c->to, (char *)c->dst + p * (int64_t)sd, buf};
        add_range(&one, 0, k);
    }
}

void add_par(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n)
{
    bulk_ctx c = {to, from, dst, src};
    if (n >= 1 << 16)
        parallel_for(n, 1 << 15, add_range, &c);
    else
        add_range(&c, 0, n);
}

/* dst = a + b, n elements, all three of dt (f32 or f64) */
typedef struct sum_ctx2 {
    em_dtype dt;
    void *dst;
    const void *a, *b;
} sum_ctx2;

static void sum_range(void *ctx, int64_t lo, int64_t hi)
{
    const sum_ctx2 *c = ctx;
    if (c->dt == EM_F32) {
        float *restrict d = (float *)c->dst + lo;
        const float *restrict a = (const float *)c->a + lo, *restrict b = (const float *)c->b + lo;
        for (int64_t i = 0; i < hi - lo; i++) d[i] = a[i] + b[i];
        return;
    }
    double *restrict d = (double *)c->dst + lo;
    const double *restrict a = (const double *)c->a + lo, *restrict b = (const double *)c->b + lo;
    for (int64_t i = 0; i < hi - lo; i++) d[i] = a[i] + b[i];
}

void sum_par(em_dtype dt, void *dst, const void *a, const void *b, int64_t n)
{
    sum_ctx2 c = {dt, dst, a, b};
    if (n >= 1 << 16)
        parallel_for(n, 1 << 15, sum_range, &c);
    else
        sum_range(&c, 0, n);
}

#if EM_HAVE_CUDA
/* w over t's shape with operands ops[0..nops) (their strides; same shape) */
void cu_walk_of(cu_walk *w, const tensor *t, int nops, const tensor *const *ops)
{
    memset(w, 0, sizeof *w);
    w->ndim = t->ndim;
    memcpy(w->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    for (int k = 0; k < nops; k++) memcpy(w->stride[k], ops[k]->stride, sizeof(int64_t) * (size_t)t->ndim);
}
#endif

void copy_strided(tensor *dst, const tensor *src)
{
    int64_t n = t_numel(dst);
#if EM_HAVE_CUDA
    if (t_on_cuda(dst) || t_on_cuda(src)) {
        if (!em_device_equal(dst->device, src->device)) {
            em_err(EM_ERR_DEVICE, "copy: between devices only through em_to (%s and %s)", shp(dst), shp(src));
            return;
        }
        cu_walk w;
        cu_walk_of(&w, dst, 2, (const tensor *[]){dst, src});
        cu_copy(dst->device.index, &w, dst->dtype, t_ptr(dst), src->dtype, t_ptr(src));
        return;
    }
#endif
    if (t_is_contig(dst) && t_is_contig(src) && t_numel(src) == n) {
        convert_par(dst->dtype, t_ptr(dst), src->dtype, t_ptr(src), n);
        return;
    }
    copy_ctx c = {dst, src, 0};
    int last = dst->ndim - 1;
    if (last >= 0 && dst->stride[last] == 1 && src->stride[last] == 1 && dst->shape[last] >= 16) {
        c.row = dst->shape[last];
        parallel_for(n / c.row, (1 << 14) / c.row + 1, copy_rows, &c);
        return;
    }
    parallel_for(n, 1 << 14, copy_range, &c);
}

tensor *t_clone(tensor *t)
{
    tensor *o = t_new_like(t);
    if (!o) return NULL;
    copy_strided(o, t);
    return o;
}

tensor *t_contig(tensor *t)
{
    if (!t) return NULL;
    return t_is_contig(t) ? t : t_clone(t);
}

tensor *t_new_like(const tensor *t) { return t_new_on(t->device, t->dtype, t->ndim, t->shape); }

tensor *t_zeros_on(em_device dev, em_dtype dt, int ndim, const int64_t *shape)
{
    tensor *t = t_new_on(dev, dt, ndim, shape);
    if (t && t_fill_zero(t)) return NULL;
    return t;
}

tensor *t_zeros(em_dtype dt, int ndim, const int64_t *shape)
{
    return t_zeros_on((em_device){EM_CPU, 0}, dt, ndim, shape);
}

tensor *t_zeros_like(const tensor *t) { return t_zeros_on(t->device, t->dtype, t->ndim, t->shape); }

typedef struct add_ctx {
    tensor *dst;
    const tensor *src;
} add_ctx;

/* dst += src over rows [lo, hi), a row being the last dim; a row whose
 * elements are adjacent in both is a plain loop, which vectorises */
static void add_rows(void *p, int64_t lo, int64_t hi)
{
    const add_ctx *c = p;
    tensor *dst = c->dst;
    const tensor *src = c->src;
    int nd = dst->ndim;
    int64_t inner = nd ? dst->shape[nd - 1] : 1;
    int64_t sd = nd ? dst->stride[nd - 1] : 0, ss = nd ? src->stride[nd - 1] : 0;
    nditer it;
    nditer_init(&it, nd ? nd - 1 : 0, dst->shape, 2, (const int64_t *[]){dst->stride, src->stride});
    nditer_seek(&it, lo);
    for (int64_t r = lo; r < hi; r++) {
        if (dst->dtype == EM_F32) {
            float *restrict d = (float *)t_ptr(dst) + it.off[0];
            const float *restrict s = (const float *)t_ptr(src) + it.off[1];
            if (sd == 1 && ss == 1)
                for (int64_t j = 0; j < inner; j++) d[j] += s[j];
            else
                for (int64_t j = 0; j < inner; j++) d[j * sd] += s[j * ss];
        } else {
            double *restrict d = (double *)t_ptr(dst) + it.off[0];
            const double *restrict s = (const double *)t_ptr(src) + it.off[1];
            if (sd == 1 && ss == 1)
                for (int64_t j = 0; j < inner; j++) d[j] += s[j];
            else
                for (int64_t j = 0; j < inner; j++) d[j * sd] += s[j * ss];
        }
        nditer_next(&it);
    }
}

void add_strided(tensor *dst, const tensor *src)
{
    int nd = dst->ndim;
    int64_t inner = nd ? dst->shape[nd - 1] : 1, n = t_numel(dst);
    if (n == 0) return;
    add_ctx c = {dst, src};
    parallel_for(n / inner, (1 << 14) / inner + 1, add_rows, &c);
}

/* dst = 0 over rows [lo, hi), a row being the last dim */
static void zero_rows(void *p, int64_t lo, int64_t hi)
{
    tensor *dst = ((const add_ctx *)p)->dst;
    int nd = dst->ndim;
    int64_t inner = nd ? dst->shape[nd - 1] : 1, sd = nd ? dst->stride[nd - 1] : 0;
    size_t es = t_esize(dst);
    char *base = t_ptr(dst);
    nditer it;
    nditer_init(&it, nd ? nd - 1 : 0, dst->shape, 1, (const int64_t *[]){dst->stride});
    nditer_seek(&it, lo);
    for (int64_t r = lo; r < hi; r++) {
        char *d = base + it.off[0] * (int64_t)es;
        if (sd == 1)
            memset(d, 0, (size_t)inner * es);
        else
            for (int64_t j = 0; j < inner; j++) memset(d + j * sd * (int64_t)es, 0, es);
        nditer_next(&it);
    }
}

void zero_strided(tensor *dst)
{
    int nd = dst->ndim;
    int64_t inner = nd ? dst->shape[nd - 1] : 1, n = t_numel(dst);
    if (n == 0) return;
    add_ctx c = {dst, NULL};
    parallel_for(n / inner, (1 << 16) / inner + 1, zero_rows, &c);
}

em_status t_fill_zero(tensor *t)
{
    size_t nbytes = (size_t)t_numel(t) * t_esize(t);
#if EM_HAVE_CUDA
    if (t_on_cuda(t)) return cu_fill(t->device.index, EM_U8, t_ptr(t), (int64_t)nbytes, 0.0);
#endif
    zero_par(t_ptr(t), nbytes);
    return EM_OK;
}
