/* ops_join.c — joining and splitting: concat and stack copy n inputs into
 * one new tensor (backward slices the gradient back to each input); split and
 * chunk return views made with t_narrow, so gradients flow through them.
 * Every input must be on one device; on CUDA the copies are the core
 * strided-copy kernel (copy_strided) and the backward is views plus
 * gradient accumulation, so both directions run on the device. concat and
 * stack go through the dispatcher with their list as the inputs; split and
 * chunk check their input there, and each piece is a narrow, recorded as
 * one. */
#include "dispatch.h"
#include "kernel_impl.h"

/* Starts op `op` (concat, stack) on the list ts[0..n): the array itself
 * (n >= 1, not NULL), then op_begin (no NULL entries, one device), then
 * one dtype. */
static bool begin_list(op_call *c, op_id op, int n, tensor **ts)
{
    const char *name = op_name(op);
    if (n <= 0) {
        em_fail(EM_ERR_ARG, "%s: needs at least one tensor, got n = %d", name, n);
        return false;
    }
    if (!ts) {
        em_fail(EM_ERR_ARG, "%s: tensor array is NULL", name);
        return false;
    }
    if (!op_begin(c, op, n, ts)) return false;
    for (int i = 1; i < n; i++)
        if (ts[i]->dtype != ts[0]->dtype) {
            em_fail(EM_ERR_DTYPE, "%s: tensor %d is %s%s but tensor 0 is %s%s", name, i,
                    em_dtype_name(ts[i]->dtype), shp(ts[i]), em_dtype_name(ts[0]->dtype), shp(ts[0]));
            return false;
        }
    return true;
}

/* A header-only copy of t (never handed out) seeing part of its storage:
 * dim d narrowed to [start, start+len), or removed at `start` when len < 0. */
static tensor part_of(const tensor *t, int d, int64_t start, int64_t len)
{
    tensor v = *t;
    v.offset = t->offset + start * t->stride[d];
    if (len >= 0) {
        v.shape[d] = len;
        return v;
    }
    for (int i = d; i < t->ndim - 1; i++) {
        v.shape[i] = t->shape[i + 1];
        v.stride[i] = t->stride[i + 1];
    }
    v.ndim = t->ndim - 1;
    return v;
}

/* ---- concat -------------------------------------------------------------------- */

/* d concat: g_i = g[.., off_i : off_i + n_i, ..] */
static em_status concat_backward(node *n, tensor *g)
{
    int d = (int)n->ip[0];
    int64_t off = 0;
    for (int i = 0; i < n->nin; i++) {
        tensor *x = n->in[i];
        if (x->requires_grad) {
            tensor v = part_of(g, d, off, x->shape[d]);
            tensor *gx = t_view_of(g, v.ndim, v.shape, v.stride, v.offset);
            em_status s = gx ? op_grad(x, gx) : em_last_status();
            if (s) return s;
        }
        off += x->shape[d];
    }
    return EM_OK;
}

/* out (contiguous) = in[0..nin) side by side along dim ip[0] */
static em_status concat_kernel(const op_call *c, tensor *out)
{
    int d = (int)c->ip[0];
    int64_t off = 0;
    for (int i = 0; i < c->nin; i++) {
        tensor v = part_of(out, d, off, c->in[i]->shape[d]);
        copy_strided(&v, c->in[i]);
        off += c->in[i]->shape[d];
    }
    return EM_OK;
}

/* copy_strided runs on the device of its tensors: one kernel for both backends */
static const op_kernels concat_kernels = OP_KERNELS(concat_kernel, concat_kernel);

static tensor *t_concat(int n, tensor **ts, int dim)
{
    OP_CALL(c);
    if (!begin_list(&c, OP_CONCAT, n, ts)) return NULL;
    int nd = ts[0]->ndim;
    int d = t_dim("concat", dim, nd, 0);
    if (d < 0) return NULL;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, ts[0]->shape, sizeof shape);
    for (int i = 1; i < n; i++) {
        bool ok = ts[i]->ndim == nd;
        for (int k = 0; ok && k < nd; k++) ok = k == d || ts[i]->shape[k] == ts[0]->shape[k];
        if (!ok)
            return em_fail(EM_ERR_SHAPE,
                           "concat: tensor %d has shape %s but tensor 0 has %s; shapes must match "
                           "except in dim %d",
                           i, shp(ts[i]), shp(ts[0]), dim);
        shape[d] += ts[i]->shape[d];
    }
    tensor *out = op_out(&c, ts[0]->dtype, nd, shape);
    c.ip[0] = d;
    if (!out || op_run(&c, &concat_kernels, out)) return NULL;
    return op_end(&c, out, concat_backward);
}

/* ---- stack ---------------------------------------------------------------------- */

/* d stack: g_i = g[.., i, ..] (dim d removed) */
static em_status stack_backward(node *n, tensor *g)
{
    int d = (int)n->ip[0];
    for (int i = 0; i < n->nin; i++) {
        tensor *x = n->in[i];
        if (!x->requires_grad) continue;
        tensor v = part_of(g, d, i, -1);
        tensor *gx = t_view_of(g, v.ndim, v.shape, v.stride, v.offset);
        em_status s = gx ? op_grad(x, gx) : em_last_status();
        if (s) return s;
    }
    return EM_OK;
}

/* out (contiguous) = in[0..nin) stacked along a new dim ip[0] */
static em_status stack_kernel(const op_call *c, tensor *out)
{
    for (int i = 0; i < c->nin; i++) {
        tensor v = part_of(out, (int)c->ip[0], i, -1);
        copy_strided(&v, c->in[i]);
    }
    return EM_OK;
}

static const op_kernels stack_kernels = OP_KERNELS(stack_kernel, stack_kernel);

static tensor *t_stack(int n, tensor **ts, int dim)
{
    OP_CALL(c);
    if (!begin_list(&c, OP_STACK, n, ts)) return NULL;
    int nd = ts[0]->ndim;
    if (nd >= EM_MAX_DIMS)
        return em_fail(EM_ERR_SHAPE, "stack: inputs %s already have %d dims", shp(ts[0]), nd);
    int d = t_dim("stack", dim, nd, 1);
    if (d < 0) return NULL;
    for (int i = 1; i < n; i++)
        if (ts[i]->ndim != nd || memcmp(ts[i]->shape, ts[0]->shape, sizeof(int64_t) * (size_t)nd))
            return em_fail(EM_ERR_SHAPE,
                           "stack: tensor %d has shape %s but tensor 0 has %s; all must be equal", i,
                           shp(ts[i]), shp(ts[0]));
    int64_t shape[EM_MAX_DIMS];
    for (int i = 0, j = 0; i <= nd; i++) shape[i] = i == d ? n : ts[0]->shape[j++];
    tensor *out = op_out(&c, ts[0]->dtype, nd + 1, shape);
    c.ip[0] = d;
    if (!out || op_run(&c, &stack_kernels, out)) return NULL;
    return op_end(&c, out, stack_backward);
}

/* ---- split / chunk ------------------------------------------------------------------ */

/* Pieces of `size` along d (the last may be smaller) as narrow views; out
 * has room for max_out. */
static int split_views(const char *op, tensor *t, int64_t size, int d, int64_t count, tensor **out,
                       int max_out)
{
    if (count > max_out)
        return em_err(EM_ERR_ARG, "%s: %s gives %lld pieces along dim %d but max_out is %d", op, shp(t),
                      (long long)count, d, max_out),
               -1;
    int64_t S = t->shape[d];
    for (int i = 0; i < count; i++) {
        int64_t start = (int64_t)i * size < S ? (int64_t)i * size : S;
        int64_t len = S - start < size ? S - start : size;
        if (!(out[i] = t_narrow(t, d, start, len))) return -1;
    }
    return (int)count;
}

/* split and chunk record nothing of their own (each piece is a narrow):
 * op_begin checks the input, op_done ends the call */
static int split_pieces(op_call *c, int64_t size, int dim, tensor **out, int max_out)
{
    tensor *t = c->in[0];
    int d = t_dim("split", dim, t->ndim, 0);
    if (d < 0) return -1;
    if (size < 1) return em_err(EM_ERR_ARG, "split: size %lld must be >= 1", (long long)size), -1;
    int64_t S = t->shape[d];
    return split_views("split", t, size, d, S == 0 ? 1 : (S + size - 1) / size, out, max_out);
}

static int t_split(tensor *t, int64_t size, int dim, tensor **out, int max_out)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_SPLIT, 1, &t)) return -1;
    int n = split_pieces(&c, size, dim, out, max_out);
    op_done(&c, n >= 0);
    return n;
}

/* torch.chunk: pieces of ceil(S/chunks), so there may be fewer than chunks */
static int chunk_pieces(op_call *c, int chunks, int dim, tensor **out, int max_out)
{
    tensor *t = c->in[0];
    int d = t_dim("chunk", dim, t->ndim, 0);
    if (d < 0) return -1;
    if (chunks < 1) return em_err(EM_ERR_ARG, "chunk: chunks %d must be >= 1", chunks), -1;
    int64_t S = t->shape[d];
    if (S == 0) /* torch.chunk gives `chunks` empty pieces here */
        return split_views("chunk", t, 0, d, chunks, out, max_out);
    int64_t size = (S + chunks - 1) / chunks;
    return split_views("chunk", t, size, d, (S + size - 1) / size, out, max_out);
}

static int t_chunk(tensor *t, int chunks, int dim, tensor **out, int max_out)
{
    OP_CALL(c);
    if (!op_begin(&c, OP_CHUNK, 1, &t)) return -1;
    int n = chunk_pieces(&c, chunks, dim, out, max_out);
    op_done(&c, n >= 0);
    return n;
}

/* ---- public wrappers ------------------------------------------------------------------ */

/* Resolves n handles into ts (n <= cap). */
static bool resolve_list(const char *op, int n, em_tensor *const *hs, tensor **ts)
{
    if (n <= 0 || !hs) {
        em_fail(EM_ERR_ARG, "%s: needs at least one tensor, got n = %d%s", op, n,
                hs ? "" : " (array is NULL)");
        return false;
    }
    for (int i = 0; i < n; i++)
        if (!(ts[i] = t_resolve(hs[i], op))) return false;
    return true;
}

static em_tensor *join(tensor *(*f)(int, tensor **, int), const char *op, int n, em_tensor *const *hs,
                       int dim)
{
    size_t m = tmp_mark();
    tensor **ts = n > 0 ? tmp_alloc(sizeof(tensor *) * (size_t)n) : NULL;
    em_tensor *r = NULL;
    if ((ts || n <= 0) && resolve_list(op, n, hs, ts)) r = t_handle(f(n, ts, dim));
    tmp_release(m);
    return r;
}

em_tensor *em_concat(int n, em_tensor *const *ts, int dim) { return join(t_concat, "concat", n, ts, dim); }
em_tensor *em_stack(int n, em_tensor *const *ts, int dim) { return join(t_stack, "stack", n, ts, dim); }

typedef int (*split_fn)(tensor *, int64_t, int, tensor **, int);

/* Runs f into a temporary array of internal pointers, then hands out handles. */
static int split_pub(split_fn f, const char *op, em_tensor *h, int64_t arg, int dim, em_tensor **out,
                     int max_out)
{
    tensor *t = t_resolve(h, op);
    if (!t) return -1;
    if (!out && max_out > 0) return em_err(EM_ERR_ARG, "%s: out is NULL but max_out is %d", op, max_out), -1;
    size_t m = tmp_mark();
    tensor **ts = tmp_alloc(sizeof(tensor *) * (size_t)(max_out > 0 ? max_out : 1));
    int r = ts ? f(t, arg, dim, ts, max_out < 0 ? 0 : max_out) : -1;
    for (int i = 0; i < r; i++) out[i] = t_handle(ts[i]);
    tmp_release(m);
    return r;
}

static int chunk_adapter(tensor *t, int64_t chunks, int dim, tensor **out, int max_out)
{
    return t_chunk(t, chunks > 1 << 30 ? 1 << 30 : (int)chunks, dim, out, max_out);
}

int em_split(em_tensor *h, int64_t size, int dim, em_tensor **out, int max_out)
{
    return split_pub(t_split, "split", h, size, dim, out, max_out);
}

int em_chunk(em_tensor *h, int chunks, int dim, em_tensor **out, int max_out)
{
    return split_pub(chunk_adapter, "chunk", h, chunks, dim, out, max_out);
}
