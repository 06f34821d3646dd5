/* tensor.c — the public face of a tensor: metadata, creation, element access,
 * copies in and out, em_keep. */
#include <stdio.h>
#include <stdlib.h>

#include "kernel_impl.h"
#include "tensor_impl.h"

int em_ndim(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_ndim");
    return t ? t->ndim : -1;
}

int64_t em_size(const em_tensor *h, int dim)
{
    tensor *t = t_resolve(h, "em_size");
    if (!t) return -1;
    int d = t_dim("em_size", dim, t->ndim, 0);
    return d < 0 ? -1 : t->shape[d];
}

const int64_t *em_shape(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_shape");
    return t ? t->shape : NULL;
}

const int64_t *em_strides(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_strides");
    return t ? t->stride : NULL;
}

int64_t em_offset(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_offset");
    return t ? t->offset : -1;
}

int64_t em_numel(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_numel");
    return t ? t_numel(t) : -1;
}

em_dtype em_dtype_of(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_dtype_of");
    return t ? t->dtype : EM_NUM_DTYPES;
}

em_device em_device_of(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_device_of");
    return t ? t->device : (em_device){EM_CPU, -1};
}

bool em_is_contiguous(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_is_contiguous");
    return t && t_is_contig(t);
}

bool em_shares_storage(const em_tensor *a, const em_tensor *b)
{
    tensor *x = t_resolve(a, "em_shares_storage"), *y = t_resolve(b, "em_shares_storage");
    return x && y && x->st == y->st;
}

void *em_data(em_tensor *h)
{
    tensor *t = t_resolve(h, "em_data");
    return t ? t_ptr(t) : NULL;
}

char *em_describe(const em_tensor *h, char *buf, size_t n)
{
    if (!n) return buf;
    tensor *t = h ? t_resolve(h, "em_describe") : NULL;
    if (!t)
        snprintf(buf, n, h ? "<stale>" : "<null>");
    else
        snprintf(buf, n, "%s%s", em_dtype_name(t->dtype), shp(t));
    return buf;
}

/* ---- creation --------------------------------------------------------------- */

em_tensor *em_empty(em_dtype dt, int ndim, const int64_t *shape) { return t_handle(t_new(dt, ndim, shape)); }
em_tensor *em_zeros(em_dtype dt, int ndim, const int64_t *shape)
{
    return t_handle(t_zeros(dt, ndim, shape));
}

em_tensor *em_full(em_dtype dt, int ndim, const int64_t *shape, double value)
{
    tensor *t = t_new(dt, ndim, shape);
    if (t) fill_n(dt, t_ptr(t), value, t_numel(t));
    return t_handle(t);
}

em_tensor *em_ones(em_dtype dt, int ndim, const int64_t *shape) { return em_full(dt, ndim, shape, 1.0); }
em_tensor *em_scalar(em_dtype dt, double value) { return em_full(dt, 0, NULL, value); }

em_tensor *em_arange(double start, double end, double step, em_dtype dt)
{
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step))
        return em_fail(EM_ERR_ARG, "em_arange: bad range start=%g end=%g step=%g", start, end, step);
    double span = (end - start) / step;
    int64_t n = span > 0 ? (int64_t)ceil(span) : 0;
    tensor *t = t_new(dt, 1, (int64_t[]){n});
    if (!t) return NULL;
    size_t s = t_esize(t);
    for (int64_t i = 0; i < n; i++) st(dt, (char *)t_ptr(t) + (size_t)i * s, start + (double)i * step);
    return t_handle(t);
}

em_tensor *em_from_data(em_dtype dt, int ndim, const int64_t *shape, const void *data)
{
    tensor *t = t_new(dt, ndim, shape);
    if (!t) return NULL;
    if (!data && t_numel(t) > 0) {
        if (!t->depth) t_free(t);
        return em_fail(EM_ERR_ARG, "em_from_data: data is NULL for %s%s", em_dtype_name(dt), shp(t));
    }
    if (t->st->nbytes) memcpy(t_ptr(t), data, t->st->nbytes);
    return t_handle(t);
}

em_tensor *em_zeros_like(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_zeros_like");
    return t ? t_handle(t_zeros_like(t)) : NULL;
}

em_tensor *em_ones_like(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_ones_like");
    tensor *o = t ? t_new_like(t) : NULL;
    if (!o) return NULL;
#if EM_HAVE_CUDA
    if (t_on_cuda(o)) {
        if (cu_fill(o->device.index, o->dtype, t_ptr(o), t_numel(o), 1.0)) {
            t_drop(o);
            return NULL;
        }
        return t_handle(o);
    }
#endif
    fill_n(o->dtype, t_ptr(o), 1.0, t_numel(o));
    return t_handle(o);
}

em_status em_copy_into(em_tensor *dh, const em_tensor *sh)
{
    tensor *d = t_resolve(dh, "em_copy_into"), *s = t_resolve(sh, "em_copy_into");
    if (!d || !s) return em_last_status();
    if (t_same_device("em_copy_into", 2, (tensor *[]){d, s}, NULL)) return em_last_status();
    int nd;
    int64_t shape[EM_MAX_DIMS];
    if (bcast_shape("em_copy_into", d->ndim, d->shape, s->ndim, s->shape, &nd, shape))
        return em_last_status();
    if (nd != d->ndim || shape_numel(nd, shape) != t_numel(d))
        return em_err(EM_ERR_SHAPE, "em_copy_into: source %s does not broadcast to destination %s", shp(s),
                      shp(d));
    int64_t bs[EM_MAX_DIMS];
    bcast_strides(s, nd, shape, bs);
    tensor view = *s; /* a stack copy with broadcast geometry, never handed out */
    view.ndim = nd;
    memcpy(view.shape, shape, sizeof shape);
    memcpy(view.stride, bs, sizeof bs);
    copy_strided(d, &view);
    return EM_OK;
}

em_status em_to_array(const em_tensor *h, em_dtype dt, void *dst)
{
    tensor *t = t_resolve(h, "em_to_array");
    if (!t) return em_last_status();
    if ((unsigned)dt >= EM_NUM_DTYPES) return em_err(EM_ERR_DTYPE, "em_to_array: invalid dtype %d", (int)dt);
    if (!dst && t_numel(t)) return em_err(EM_ERR_ARG, "em_to_array: dst is NULL");
    tensor *host = t_copy_to(t, em_device_cpu()); /* t itself on the host; waits for a device */
    if (!host) return em_last_status();
    tensor out = *host;
    out.dtype = dt;
    out.offset = 0;
    t_contig_strides(t->ndim, t->shape, out.stride);
    storage s = {.data = dst, .nbytes = (size_t)t_numel(t) * em_dtype_size(dt), .refcount = 1, .in_arena = true};
    out.st = &s;
    copy_strided(&out, host);
    if (host != t) t_drop(host);
    return EM_OK;
}

static int64_t elem_offset(const char *op, const tensor *t, const int64_t *index)
{
    int64_t off = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        if (index[i] < 0 || index[i] >= t->shape[i]) {
            em_fail(EM_ERR_INDEX, "%s: index %lld is out of range for dim %d of size %lld (shape %s)", op,
                    (long long)index[i], i, (long long)t->shape[i], shp(t));
            return -1;
        }
        off += index[i] * t->stride[i];
    }
    return off;
}

double em_get(const em_tensor *h, const int64_t *index)
{
    tensor *t = t_resolve(h, "em_get");
    if (!t) return NAN;
    if (t->ndim && !index) return em_fail(EM_ERR_ARG, "em_get: index is NULL"), NAN;
    int64_t off = elem_offset("em_get", t, index);
    if (off < 0) return NAN;
    return ld(t->dtype, (char *)t->st->data + off * (int64_t)t_esize(t));
}

em_status em_set(em_tensor *h, const int64_t *index, double value)
{
    tensor *t = t_resolve(h, "em_set");
    if (!t) return em_last_status();
    if (t->ndim && !index) return em_err(EM_ERR_ARG, "em_set: index is NULL");
    int64_t off = elem_offset("em_set", t, index);
    if (off < 0) return em_last_status();
    st(t->dtype, (char *)t->st->data + off * (int64_t)t_esize(t), value);
    return EM_OK;
}

double em_item(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_item");
    if (!t) return NAN;
    if (t_numel(t) != 1)
        return em_fail(EM_ERR_SHAPE, "em_item: needs exactly one element, got %s%s", em_dtype_name(t->dtype),
                       shp(t)),
               NAN;
#if EM_HAVE_CUDA
    if (t_on_cuda(t)) { /* one element to the host (waits for the device) */
        double v[1];
        return em_to_array(h, EM_F64, v) ? NAN : v[0];
    }
#endif
    return ld(t->dtype, t_ptr(t));
}

em_tensor *em_keep(const em_tensor *h)
{
    tensor *t = t_resolve(h, "em_keep");
    if (!t) return NULL;
    tensor *k = t_new_persistent(t->dtype, t->ndim, t->shape);
    if (!k) return NULL;
    copy_strided(k, t);
    return t_handle(k);
}
