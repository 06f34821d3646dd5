/* ops_view.c — ops that change how storage is seen, not what it holds:
 * reshape/view, flatten, transpose, permute, narrow, slice, expand,
 * squeeze/unsqueeze; and the copies contiguous, copy and cast.
 * Each view is differentiable: its backward maps the gradient back through
 * the inverse geometry.
 *
 * A view goes through the dispatcher without a kernel: op_begin, the view
 * (t_view_of: no allocation, no copy), op_end. The copies have one kernel
 * for both backends, the core strided copy (copy_strided), which runs on
 * the device of its tensors. These ops' autocast policy is NONE (ops.def):
 * the dispatcher's autocast itself calls t_cast and t_transpose, so they
 * must never autocast their own input. */
#include "dispatch.h"
#include "kernel_impl.h"

/* ---- reshape / view ----------------------------------------------------------- */

/* Strides for seeing (on, oshape, ostride) as nshape without copying, or
 * false when the memory layout does not allow it. Dims are grouped into
 * chunks that are contiguous with each other; each chunk must map onto whole
 * new dims. */
static bool view_strides(int on, const int64_t *oshape, const int64_t *ostride, int nn, const int64_t *nshape,
                         int64_t *nstride)
{
    if (on == 0 || shape_numel(on, oshape) == 0) {
        t_contig_strides(nn, nshape, nstride);
        return true;
    }
    int vd = nn - 1;
    int64_t base = ostride[on - 1], tnum = 1, vnum = 1;
    for (int td = on - 1; td >= 0; td--) {
        tnum *= oshape[td];
        if (td == 0 || (oshape[td - 1] != 1 && ostride[td - 1] != tnum * base)) {
            while (vd >= 0 && (vnum < tnum || nshape[vd] == 1)) {
                nstride[vd] = vnum * base;
                vnum *= nshape[vd];
                vd--;
            }
            if (vnum != tnum) return false;
            if (td > 0) {
                base = ostride[td - 1];
                tnum = 1;
                vnum = 1;
            }
        }
    }
    return vd == -1;
}

/* Resolves one -1 and checks the element count. */
static bool infer_shape(const char *op, const tensor *t, int ndim, const int64_t *shape, int64_t *out)
{
    if (ndim < 0 || ndim > EM_MAX_DIMS || (ndim && !shape)) {
        em_fail(EM_ERR_SHAPE, "%s: bad target ndim %d", op, ndim);
        return false;
    }
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (infer >= 0) {
                em_fail(EM_ERR_SHAPE, "%s: more than one -1 in target shape %s", op, shp_of(ndim, shape));
                return false;
            }
            infer = i;
        } else if (shape[i] < 0) {
            em_fail(EM_ERR_SHAPE, "%s: negative size in target shape %s", op, shp_of(ndim, shape));
            return false;
        } else {
            known *= shape[i];
        }
        out[i] = shape[i];
    }
    int64_t n = t_numel(t);
    if (infer >= 0) {
        if (known == 0 || n % known) {
            em_fail(EM_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", op, shp(t), (long long)n,
                    shp_of(ndim, shape));
            return false;
        }
        out[infer] = n / known;
    } else if (known != n) {
        em_fail(EM_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s (%lld elements)", op, shp(t),
                (long long)n, shp_of(ndim, shape), (long long)known);
        return false;
    }
    return true;
}

static em_status reshape_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    tensor *gx = t_reshape(g, x->ndim, x->shape);
    return gx ? op_grad(x, gx) : em_last_status();
}

/* reshape (OP_RESHAPE, copies when it must) or view (OP_VIEW, never copies) */
static tensor *reshape_impl(op_id id, tensor *t, int ndim, const int64_t *shape)
{
    const char *op = op_name(id);
    bool may_copy = id == OP_RESHAPE;
    OP_CALL(c);
    if (!op_begin(&c, id, 1, &t)) return NULL;
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    if (!infer_shape(op, t, ndim, shape, ns)) return NULL;
    tensor *out;
    if (view_strides(t->ndim, t->shape, t->stride, ndim, ns, nst)) {
        out = t_view_of(t, ndim, ns, nst, t->offset);
    } else if (may_copy) {
        tensor *copy = t_clone(t);
        if (!copy) return NULL;
        t_contig_strides(ndim, ns, nst);
        out = t_view_of(copy, ndim, ns, nst, 0);
        t_drop(copy); /* the view holds the storage */
    } else {
        return em_fail(EM_ERR_SHAPE, "%s: %s with strides %s cannot be viewed as %s; use reshape (copies)",
                       op, shp(t), shp_of(t->ndim, t->stride), shp_of(ndim, ns));
    }
    return op_end(&c, out, reshape_backward);
}

tensor *t_reshape(tensor *t, int ndim, const int64_t *shape)
{
    return reshape_impl(OP_RESHAPE, t, ndim, shape);
}

/* ---- transpose / permute ------------------------------------------------------- */

static em_status permute_backward(node *n, tensor *g)
{
    int inv[EM_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++) inv[n->ip[i]] = i;
    tensor *gx = t_permute(g, inv);
    return gx ? op_grad(n->in[0], gx) : em_last_status();
}

/* The input's gradient accumulator seen through the same permutation: a
 * consumer of x^T adds into x's gradient where it lies (op_grad_acc). */
static tensor *permute_grad_view(const node *n, tensor *acc)
{
    int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
    for (int i = 0; i < acc->ndim; i++) {
        shape[i] = acc->shape[n->ip[i]];
        stride[i] = acc->stride[n->ip[i]];
    }
    return t_view_of(acc, acc->ndim, shape, stride, acc->offset);
}

tensor *t_permute(tensor *t, const int *dims)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_PERMUTE, 1, &t)) return NULL;
    if (!dims && t->ndim) return em_fail(EM_ERR_ARG, "permute: dims is NULL");
    int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
    bool seen[EM_MAX_DIMS] = {false};
    int d[EM_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        d[i] = t_dim("permute", dims[i], t->ndim, 0);
        if (d[i] < 0) return NULL;
        if (seen[d[i]])
            return em_fail(EM_ERR_ARG, "permute: dim %d repeated; dims must be a permutation of 0..%d",
                           dims[i], t->ndim - 1);
        seen[d[i]] = true;
        shape[i] = t->shape[d[i]];
        stride[i] = t->stride[d[i]];
        c.ip[i] = d[i];
    }
    c.grad_view = permute_grad_view;
    return op_end(&c, t_view_of(t, t->ndim, shape, stride, t->offset), permute_backward);
}

tensor *t_transpose(tensor *t, int d0, int d1)
{
    if (!t) return NULL;
    int a = t_dim("transpose", d0, t->ndim, 0), b = t_dim("transpose", d1, t->ndim, 0);
    if (a < 0 || b < 0) return NULL;
    int p[EM_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) p[i] = i;
    p[a] = b;
    p[b] = a;
    return t_permute(t, p);
}

/* ---- narrow / slice -------------------------------------------------------------- */

/* Zeroes gx (CPU) outside elements [start, start + len) of dim d: the
 * parts a narrow's gradient does not write. */
static em_status zero_outside(tensor *gx, int d, int64_t start, int64_t len)
{
    int64_t shape[EM_MAX_DIMS], ends[2][2] = {{0, start}, {start + len, gx->shape[d]}};
    memcpy(shape, gx->shape, sizeof shape);
    for (int k = 0; k < 2; k++) {
        shape[d] = ends[k][1] - ends[k][0];
        if (!shape[d]) continue;
        tensor *v = t_view_of(gx, gx->ndim, shape, gx->stride, gx->offset + ends[k][0] * gx->stride[d]);
        if (!v) return em_last_status();
        zero_strided(v);
        t_drop(v);
    }
    return EM_OK;
}

/* gx = zeros(x); gx[slice] = g. On the CPU (f32, f64) the slice is added
 * into x's gradient where it lies (op_grad_acc): the q, k and v narrowed
 * from one (B,T,3C) tensor fill one gradient, not three of (B,T,3C) and a
 * sum. The first to arrive writes its slice and zeroes only the rest (a
 * narrow; a slice with a step zeroes the whole first); the others add. */
static em_status slice_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    bool fresh = false;
    tensor *acc = !t_on_cuda(g) && g->dtype == x->dtype && (x->dtype == EM_F32 || x->dtype == EM_F64)
                      ? op_grad_acc(x, &fresh)
                      : NULL;
    int d = (int)n->ip[0];
    int64_t start = n->ip[1], step = n->ip[2];
    /* acc is contiguous or a permutation of a contiguous tensor: its bytes
     * are one block, which t_fill_zero clears */
    tensor *gx = acc ? acc : t_new_on(g->device, g->dtype, x->ndim, x->shape);
    if (!gx) return em_last_status();
    em_status z = EM_OK;
    if (acc && fresh && step == 1)
        z = zero_outside(gx, d, start, g->shape[d]);
    else if (!acc || fresh)
        z = t_fill_zero(gx);
    if (z) return z;
    int64_t stride[EM_MAX_DIMS];
    memcpy(stride, gx->stride, sizeof stride);
    stride[d] *= step;
    tensor *v = t_view_of(gx, g->ndim, g->shape, stride, gx->offset + start * gx->stride[d]);
    if (!v) return em_last_status();
    if (!acc || fresh)
        copy_strided(v, g);
    else
        add_strided(v, g);
    return acc ? op_grad_done(x) : op_grad(x, gx);
}

/* Ends call c (narrow or slice of c->in[0]) with the view that keeps len
 * elements of dim d, step apart, from start. */
static tensor *slice_impl(op_call *c, int d, int64_t start, int64_t len, int64_t step)
{
    tensor *t = c->in[0];
    int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(stride, t->stride, sizeof stride);
    shape[d] = len;
    stride[d] *= step;
    c->ip[0] = d;
    c->ip[1] = start;
    c->ip[2] = step;
    return op_end(c, t_view_of(t, t->ndim, shape, stride, t->offset + start * t->stride[d]), slice_backward);
}

tensor *t_narrow(tensor *t, int dim, int64_t start, int64_t len)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_NARROW, 1, &t)) return NULL;
    int d = t_dim("narrow", dim, t->ndim, 0);
    if (d < 0) return NULL;
    if (start < 0 || len < 0 || start + len > t->shape[d])
        return em_fail(EM_ERR_INDEX, "narrow: [%lld, %lld) is outside dim %d of size %lld (shape %s)",
                       (long long)start, (long long)(start + len), dim, (long long)t->shape[d], shp(t));
    return slice_impl(&c, d, start, len, 1);
}

static tensor *t_slice(tensor *t, int dim, int64_t start, int64_t end, int64_t step)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_SLICE, 1, &t)) return NULL;
    int d = t_dim("slice", dim, t->ndim, 0);
    if (d < 0) return NULL;
    if (step < 1) return em_fail(EM_ERR_ARG, "slice: step %lld must be >= 1", (long long)step);
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    int64_t len = (end - start + step - 1) / step;
    return slice_impl(&c, d, start, len, step);
}

/* ---- expand -------------------------------------------------------------------------- */

static em_status expand_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    tensor *gx = t_sum_to(g, x->ndim, x->shape);
    return gx ? op_grad(x, gx) : em_last_status();
}

tensor *t_expand(tensor *t, int ndim, const int64_t *shape)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_EXPAND, 1, &t)) return NULL;
    if (ndim < t->ndim || ndim > EM_MAX_DIMS || (ndim && !shape))
        return em_fail(EM_ERR_SHAPE, "expand: cannot expand %s to %d dims", shp(t), ndim);
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        int64_t want = shape[i];
        if (j < 0) {
            if (want < 0)
                return em_fail(EM_ERR_SHAPE, "expand: -1 is not allowed for a new leading dim (%s to %s)",
                               shp(t), shp_of(ndim, shape));
            ns[i] = want;
            nst[i] = 0;
        } else if (want == -1 || want == t->shape[j]) {
            ns[i] = t->shape[j];
            nst[i] = t->stride[j];
        } else if (t->shape[j] == 1 && want >= 0) {
            ns[i] = want;
            nst[i] = 0;
        } else {
            return em_fail(EM_ERR_SHAPE, "expand: %s does not broadcast to %s (dim %d: %lld vs %lld)", shp(t),
                           shp_of(ndim, shape), i, (long long)t->shape[j], (long long)want);
        }
    }
    return op_end(&c, t_view_of(t, ndim, ns, nst, t->offset), expand_backward);
}

/* ---- squeeze / unsqueeze -------------------------------------------------------------- */

tensor *t_squeeze(tensor *t, int dim)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_SQUEEZE, 1, &t)) return NULL;
    int d = t_dim("squeeze", dim, t->ndim, 0);
    if (d < 0) return NULL;
    if (t->shape[d] != 1)
        return em_fail(EM_ERR_SHAPE, "squeeze: dim %d of %s has size %lld, not 1", dim, shp(t),
                       (long long)t->shape[d]);
    int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++)
        if (i != d) {
            shape[j] = t->shape[i];
            stride[j++] = t->stride[i];
        }
    return op_end(&c, t_view_of(t, t->ndim - 1, shape, stride, t->offset), reshape_backward);
}

tensor *t_unsqueeze(tensor *t, int dim)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_UNSQUEEZE, 1, &t)) return NULL;
    int d = t_dim("unsqueeze", dim, t->ndim, 1);
    if (d < 0) return NULL;
    if (t->ndim >= EM_MAX_DIMS)
        return em_fail(EM_ERR_SHAPE, "unsqueeze: %s already has %d dims", shp(t), EM_MAX_DIMS);
    int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            shape[i] = 1;
            stride[i] = d < t->ndim ? t->stride[d] * t->shape[d] : 1;
        } else {
            shape[i] = t->shape[j];
            stride[i] = t->stride[j++];
        }
    }
    return op_end(&c, t_view_of(t, t->ndim + 1, shape, stride, t->offset), reshape_backward);
}

/* ---- copies ------------------------------------------------------------------------------ */

/* out (in[0]'s shape, contiguous, maybe another dtype) = in[0], on either
 * backend: copy_strided runs where its tensors are */
static em_status copy_kernel(const op_call *c, tensor *out)
{
    copy_strided(out, c->in[0]);
    return EM_OK;
}

static const op_kernels copy_kernels = OP_KERNELS(copy_kernel, copy_kernel);

static em_status identity_backward(node *n, tensor *g) { return op_grad(n->in[0], g); }

static em_status cast_backward(node *n, tensor *g)
{
    /* back to a wider dtype (a low-precision copy's gradient reaching its
     * f32 master): accumulation converts exactly on the way, no copy first;
     * and to a narrower one whose producer reads a wider gradient itself (a
     * low product's output cast up for an f32 op): handed over as it is */
    if (widens_exactly(g->dtype, n->in[0]->dtype) || t_takes_grad_in(n->in[0], g->dtype))
        return op_grad(n->in[0], g);
    tensor *gx = t_cast(g, n->in[0]->dtype);
    return gx ? op_grad(n->in[0], gx) : em_last_status();
}

/* The dispatcher's autocast calls t_cast: cast's policy is NONE (ops.def,
 * and em_amp_set_policy refuses it), so op_begin casts nothing here. */
tensor *t_cast(tensor *t, em_dtype dt)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_CAST, 1, &t)) return NULL;
    if ((unsigned)dt >= EM_NUM_DTYPES) return em_fail(EM_ERR_DTYPE, "cast: invalid dtype %d", (int)dt);
    if (!em_dtype_is_float(dt)) c.record = false; /* integer results carry no gradient */
    tensor *out = op_out(&c, dt, t->ndim, t->shape);
    if (!out || op_run(&c, &copy_kernels, out)) return NULL;
    return op_end(&c, out, cast_backward);
}

/* a contiguous copy of t: copy (OP_COPY) or contiguous (OP_CONTIGUOUS, only
 * called for a t that is not contiguous) */
static tensor *t_copy(op_id id, tensor *t)
{
    OP_CALL(c);
    if (!op_begin(&c, id, 1, &t)) return NULL;
    tensor *out = op_out(&c, t->dtype, t->ndim, t->shape);
    if (!out || op_run(&c, &copy_kernels, out)) return NULL;
    return op_end(&c, out, identity_backward);
}

/* ---- public wrappers ------------------------------------------------------------------------ */

em_tensor *em_reshape(em_tensor *t, int ndim, const int64_t *shape)
{
    tensor *x = t_resolve(t, "reshape");
    return x ? t_handle(t_reshape(x, ndim, shape)) : NULL;
}
em_tensor *em_view(em_tensor *t, int ndim, const int64_t *shape)
{
    tensor *x = t_resolve(t, "view");
    return x ? t_handle(reshape_impl(OP_VIEW, x, ndim, shape)) : NULL;
}
em_tensor *em_flatten(em_tensor *t)
{
    tensor *x = t_resolve(t, "flatten");
    return x ? t_handle(t_reshape(x, 1, (int64_t[]){-1})) : NULL;
}
em_tensor *em_transpose(em_tensor *t, int d0, int d1)
{
    tensor *x = t_resolve(t, "transpose");
    return x ? t_handle(t_transpose(x, d0, d1)) : NULL;
}
em_tensor *em_permute(em_tensor *t, const int *dims)
{
    tensor *x = t_resolve(t, "permute");
    return x ? t_handle(t_permute(x, dims)) : NULL;
}
em_tensor *em_narrow(em_tensor *t, int dim, int64_t start, int64_t len)
{
    tensor *x = t_resolve(t, "narrow");
    return x ? t_handle(t_narrow(x, dim, start, len)) : NULL;
}
em_tensor *em_slice(em_tensor *t, int dim, int64_t start, int64_t end, int64_t step)
{
    tensor *x = t_resolve(t, "slice");
    return x ? t_handle(t_slice(x, dim, start, end, step)) : NULL;
}
em_tensor *em_expand(em_tensor *t, int ndim, const int64_t *shape)
{
    tensor *x = t_resolve(t, "expand");
    return x ? t_handle(t_expand(x, ndim, shape)) : NULL;
}
em_tensor *em_squeeze(em_tensor *t, int dim)
{
    tensor *x = t_resolve(t, "squeeze");
    return x ? t_handle(t_squeeze(x, dim)) : NULL;
}
em_tensor *em_unsqueeze(em_tensor *t, int dim)
{
    tensor *x = t_resolve(t, "unsqueeze");
    return x ? t_handle(t_unsqueeze(x, dim)) : NULL;
}
em_tensor *em_contiguous(em_tensor *t)
{
    tensor *x = t_resolve(t, "contiguous");
    return x ? t_is_contig(x) ? t : t_handle(t_copy(OP_CONTIGUOUS, x)) : NULL;
}
em_tensor *em_copy(em_tensor *t)
{
    tensor *x = t_resolve(t, "copy");
    return x ? t_handle(t_copy(OP_COPY, x)) : NULL;
}
em_tensor *em_cast(em_tensor *t, em_dtype dt)
{
    tensor *x = t_resolve(t, "cast");
    return x ? t_handle(t_cast(x, dt)) : NULL;
}
