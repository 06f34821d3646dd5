/* ops_reduce.c — reductions over dims: sum (more to come in this file). */
#include "tensor_impl.h"

/* Parses (ndims, dims) into a mask of reduced dims; all dims when ndims==0. */
static bool reduce_mask(const char *op, const tensor *t, int ndims, const int *dims, bool *mask)
{
    for (int i = 0; i < t->ndim; i++) mask[i] = ndims == 0;
    if (ndims && !dims) {
        em_fail(EM_ERR_ARG, "%s: dims is NULL but ndims is %d", op, ndims);
        return false;
    }
    for (int i = 0; i < ndims; i++) {
        int d = t_dim(op, dims[i], t->ndim, 0);
        if (d < 0) return false;
        if (mask[d]) {
            em_fail(EM_ERR_ARG, "%s: dim %d is listed twice", op, dims[i]);
            return false;
        }
        mask[d] = true;
    }
    return true;
}

typedef struct red_ctx {
    tensor *t, *out;
    int nk, nr;                           /* kept dims, reduced dims */
    int64_t kshape[EM_MAX_DIMS], kstride[EM_MAX_DIMS], ostride[EM_MAX_DIMS];
    int64_t rshape[EM_MAX_DIMS], rstride[EM_MAX_DIMS];
} red_ctx;

static void sum_range(void *p, int64_t lo, int64_t hi)
{
    red_ctx *c = p;
    size_t es = t_esize(c->t), os = t_esize(c->out);
    const char *base = t_ptr(c->t);
    int64_t rn = shape_numel(c->nr, c->rshape);
    nditer ko;
    nditer_init(&ko, c->nk, c->kshape, 1, (const int64_t *[]){c->kstride});
    nditer_seek(&ko, lo);
    for (int64_t i = lo; i < hi; i++) {
        double acc = 0;
        nditer ri;
        nditer_init(&ri, c->nr, c->rshape, 1, (const int64_t *[]){c->rstride});
        const char *b = base + ko.off[0] * (int64_t)es;
        if (c->t->dtype == EM_F32) {
            for (int64_t j = 0; j < rn; j++) {
                acc += ((const float *)b)[ri.off[0]];
                nditer_next(&ri);
            }
        } else {
            for (int64_t j = 0; j < rn; j++) {
                acc += ld(c->t->dtype, b + ri.off[0] * (int64_t)es);
                nditer_next(&ri);
            }
        }
        st(c->out->dtype, (char *)t_ptr(c->out) + i * (int64_t)os, acc);
        nditer_next(&ko);
    }
}

/* g has the kept shape (keepdim or not); expand it back over the input. */
static em_status sum_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    int64_t ks[EM_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) ks[i] = (n->ip[0] >> i) & 1 ? 1 : x->shape[i];
    tensor *gx = t_expand(t_reshape(g, x->ndim, ks), x->ndim, x->shape);
    return gx ? ag_accum(x, gx) : em_last_status();
}

tensor *t_sum(tensor *t, int ndims, const int *dims, bool keepdim)
{
    if (!t) return NULL;
    bool mask[EM_MAX_DIMS];
    if (!reduce_mask("sum", t, ndims, dims, mask)) return NULL;
    if (t->dtype == EM_BOOL) return em_fail(EM_ERR_DTYPE, "sum: does not take bool tensors (%s); cast first", shp(t));
    red_ctx c = {.t = t};
    int64_t oshape[EM_MAX_DIMS];
    int on = 0;
    int64_t bits = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (mask[i]) {
            bits |= (int64_t)1 << i;
            c.rshape[c.nr] = t->shape[i];
            c.rstride[c.nr++] = t->stride[i];
            if (keepdim) oshape[on++] = 1;
        } else {
            c.kshape[c.nk] = t->shape[i];
            c.kstride[c.nk++] = t->stride[i];
            oshape[on++] = t->shape[i];
        }
    }
    /* integer sums accumulate in i32 like their inputs (u8 widens to i32) */
    em_dtype odt = t->dtype == EM_U8 ? EM_I32 : t->dtype;
    tensor *out = t_new(odt, on, oshape);
    if (!out) return NULL;
    c.out = out;
    int64_t n = t_numel(out), rn = shape_numel(c.nr, c.rshape);
    parallel_for(n, rn >= 4096 ? 1 : 4096 / (rn + 1) + 1, sum_range, &c);
    if (ag_needed(1, &t)) {
        node *nd = ag_record("sum", sum_backward, out, 1, &t);
        if (!nd) return NULL;
        nd->ip[0] = bits;
    }
    return out;
}

em_tensor *em_sum(em_tensor *h, int ndims, const int *dims, bool keepdim)
{
    tensor *t = t_resolve(h, "sum");
    return t ? t_handle(t_sum(t, ndims, dims, keepdim)) : NULL;
}
