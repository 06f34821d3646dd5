/* ops_binary.c — add, sub, mul, div with broadcasting, their scalar forms,
 * and neg: shape/dtype checks, CPU forward, backward, in one place. On a
 * CUDA device the same ops run through tensor/ops_elementwise.cu (bin_cuda,
 * affine_cuda); the backward functions only call ops that do too. The
 * per-element arithmetic is tensor/elementwise_formulas.h, which both
 * backends share. Under autocast's PROMOTE the CPU kernels also take float
 * inputs of different dtypes as they are (op_call.mixed: a bf16 product's
 * output and an f32 bias), widening them as they read them.
 *
 * This file is the pattern for an op family: an internal t_xxx that goes
 * through the dispatcher (op_begin, its own checks and output shape,
 * op_out, op_run, op_end: tensor/dispatch.h), its kernels per backend
 * (plain loops, with a fast path for the common contiguous f32 case beside
 * the general strided one), a backward function, and a public em_xxx
 * wrapper. */
#include "dispatch.h"
#include "elementwise_math.h"
#include "kernel_impl.h"
#if EM_HAVE_CUDA
#include "cuda_elementwise.h"
#endif

#pragma GCC diagnostic error "-Wswitch-enum" /* a switch over binop names every op */

typedef struct bin_ctx {
    binop k;
    tensor *out, *a, *b;
    int64_t sa[EM_MAX_DIMS], sb[EM_MAX_DIMS]; /* broadcast strides */
    int64_t inner;                            /* fast path: contiguous run length */
} bin_ctx;

/* o[i] = x[i] <k> y[i] for i < n, f32: one loop per op (generated from the
 * op list) so that each vectorises with its op a constant */
static void run_f32(binop k, const float *x, const float *y, float *o, int64_t n)
{
    switch (k) {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_BINARY(id, name, amp, be)                                                                        \
    case BIN_##id:                                                                                           \
        for (int64_t i = 0; i < n; i++) o[i] = ew_binary_f32v(BIN_##id, x[i], y[i]);                         \
        break;
#include "ops.def"
    }
}

/* Same shape, both contiguous, f32: one flat loop per range. */
static void bin_flat_f32(void *p, int64_t lo, int64_t hi)
{
    bin_ctx *c = p;
    const float *x = t_ptr(c->a), *y = t_ptr(c->b);
    run_f32(c->k, x + lo, y + lo, (float *)t_ptr(c->out) + lo, hi - lo);
}

/* a contiguous (rows, inner), b contiguous (inner) repeated per row, f32:
 * the bias-add shape, or any block of b's trailing dims (is_trailing_block).
 * Ranges are rows. */
static void bin_rows_f32(void *p, int64_t lo, int64_t hi)
{
    bin_ctx *c = p;
    int64_t n = c->inner;
    const float *y = t_ptr(c->b), *x = (const float *)t_ptr(c->a) + lo * n;
    float *o = (float *)t_ptr(c->out) + lo * n;
    for (int64_t r = lo; r < hi; r++, x += n, o += n) run_f32(c->k, x, y, o, n);
}

/* ---- float inputs of different dtypes, or f16/bf16 ones ----------------------
 * Autocast's PROMOTE leaves inputs of different float dtypes uncast on the
 * CPU (dispatch.c, op_call.mixed): a bf16 product's output meets an f32
 * bias, and the result is f32. Each contiguous run is widened a block at a
 * time into f32 as it is read and the f32 loop runs over the block, so the
 * result has the bits of casting first, without the cast's pass. Inputs and
 * result all f16 or all bf16 go the same way, the block rounded into the
 * result as it is stored: the bits of computing each element in double and
 * rounding (bin_strided), since +, -, * and / of two floats computed in
 * double and rounded to float are the float operation's result (double
 * holds more than 2 x 24 + 2 bits). Read element by element instead, an
 * f16/bf16 add or mul ran 20-44x slower than f32's. */
enum { MIX_BLOCK = 512 };

/* n (<= MIX_BLOCK) values of contiguous t from element i as f32: t's own
 * memory when it is f32, else widened into buf */
static const float *f32_run(const tensor *t, int64_t i, int64_t n, float *buf)
{
    const char *p = (const char *)t_ptr(t) + i * (int64_t)t_esize(t);
    if (t->dtype == EM_F32) return (const float *)p;
    convert_n(EM_F32, buf, t->dtype, p, n);
    return buf;
}

/* out[io..io+n) = a[ia..] <k> b[ib..], contiguous runs, block by block:
 * into out's memory when it is f32, else through a block rounded into it */
static void run_mixed(binop k, const tensor *a, int64_t ia, const tensor *b, int64_t ib, tensor *out,
                      int64_t io, int64_t n)
{
    float xa[MIX_BLOCK], xb[MIX_BLOCK], xo[MIX_BLOCK];
    bool f32 = out->dtype == EM_F32;
    char *o = (char *)t_ptr(out) + io * (int64_t)t_esize(out);
    for (int64_t j = 0; j < n; j += MIX_BLOCK) {
        int64_t w = n - j < MIX_BLOCK ? n - j : MIX_BLOCK;
        float *ob = f32 ? (float *)o + j : xo;
        run_f32(k, f32_run(a, ia + j, w, xa), f32_run(b, ib + j, w, xb), ob, w);
        if (!f32) convert_n(out->dtype, o + j * (int64_t)t_esize(out), EM_F32, ob, w);
    }
}

/* bin_flat_f32 with inputs of any float dtypes */
static void bin_flat_mixed(void *p, int64_t lo, int64_t hi)
{
    bin_ctx *c = p;
    run_mixed(c->k, c->a, lo, c->b, lo, c->out, lo, hi - lo);
}

/* bin_rows_f32 with inputs of any float dtypes */
static void bin_rows_mixed(void *p, int64_t lo, int64_t hi)
{
    bin_ctx *c = p;
    int64_t n = c->inner;
    for (int64_t r = lo; r < hi; r++) run_mixed(c->k, c->a, r * n, c->b, 0, c->out, r * n, n);
}

/* Any strides, any dtypes (the inputs' may differ: op_call.mixed): element by
 * element through double, or float where the result is f32. */
static void bin_strided(void *p, int64_t lo, int64_t hi)
{
    bin_ctx *c = p;
    tensor *o = c->out;
    em_dtype dt = o->dtype;
    size_t es = t_esize(o);
    char *op = t_ptr(o);
    const char *ap = t_ptr(c->a), *bp = t_ptr(c->b);
    nditer it;
    nditer_init(&it, o->ndim, o->shape, 2, (const int64_t *[]){c->sa, c->sb});
    nditer_seek(&it, lo);
    em_dtype da = c->a->dtype, db = c->b->dtype;
    size_t ea = t_esize(c->a), eb = t_esize(c->b);
    if (dt == EM_F32 && da == EM_F32 && db == EM_F32) {
        for (int64_t i = lo; i < hi; i++) {
            ((float *)op)[i] =
                ew_binary_f32v(c->k, ((const float *)ap)[it.off[0]], ((const float *)bp)[it.off[1]]);
            nditer_next(&it);
        }
        return;
    }
    if (dt == EM_F32) { /* mixed float inputs: each value is exactly an f32 */
        for (int64_t i = lo; i < hi; i++) {
            float x = (float)ld(da, ap + it.off[0] * (int64_t)ea),
                  y = (float)ld(db, bp + it.off[1] * (int64_t)eb);
            ((float *)op)[i] = ew_binary_f32v(c->k, x, y);
            nditer_next(&it);
        }
        return;
    }
    for (int64_t i = lo; i < hi; i++) {
        double x = ld(da, ap + it.off[0] * (int64_t)ea), y = ld(db, bp + it.off[1] * (int64_t)eb);
        st(dt, op + i * (int64_t)es, ew_binary_f64(c->k, x, y));
        nditer_next(&it);
    }
}

static em_status add_backward(node *n, tensor *g)
{
    tensor *a = n->in[0], *b = n->in[1];
    em_status s = EM_OK;
    if (a->requires_grad) {
        tensor *ga = t_sum_to(g, a->ndim, a->shape);
        if (!ga || (s = op_grad(a, ga))) return s ? s : em_last_status();
    }
    if (b->requires_grad) {
        tensor *gb = n->ip[0] == BIN_SUB ? t_neg(g) : g;
        gb = gb ? t_sum_to(gb, b->ndim, b->shape) : NULL;
        if (!gb || (s = op_grad(b, gb))) return s ? s : em_last_status();
    }
    return EM_OK;
}

/* d(a*b) = g*b, g*a ; d(a/b) = g/b, -g*out/b */
static em_status muldiv_backward(node *n, tensor *g)
{
    tensor *a = n->in[0], *b = n->in[1];
    bool div = n->ip[0] == BIN_DIV;
    em_status s;
    /* inputs the forward read mixed (op_call.mixed) meet g in its dtype, the
     * one they were promoted to: the products below do not mix */
    tensor *av = a->dtype == g->dtype || !b->requires_grad ? a : t_cast(a, g->dtype);
    tensor *bv = b->dtype == g->dtype ? b : t_cast(b, g->dtype);
    if (!av || !bv) return em_last_status();
    if (a->requires_grad) {
        tensor *ga = t_sum_to(div ? t_div(g, bv) : t_mul(g, bv), a->ndim, a->shape);
        if (!ga) return em_last_status();
        if ((s = op_grad(a, ga))) return s;
    }
    if (b->requires_grad) {
        tensor *gb = div ? t_neg(t_div(t_mul(g, n->out), bv)) : t_mul(g, av);
        gb = gb ? t_sum_to(gb, b->ndim, b->shape) : NULL;
        if (!gb) return em_last_status();
        if ((s = op_grad(b, gb))) return s;
    }
    return EM_OK;
}

/* Whether b, broadcast to shape (nd dims), is one block repeated: its dims
 * are shape's last ones, and any before those are 1 (a bias (C) or (1,C)
 * under (R,C); a position table (T,C) under (B,T,C)). Contiguous, b's
 * elements are then the block in order. */
static bool is_trailing_block(const tensor *b, int nd, const int64_t *shape)
{
    if (b->ndim > nd) return false;
    int k = nd; /* b matches shape on dims [k, nd) */
    for (int i = b->ndim - 1; i >= 0; i--) {
        int o = nd - b->ndim + i;
        if (k == o + 1 && b->shape[i] == shape[o])
            k = o;
        else if (b->shape[i] != 1)
            return false;
    }
    return true;
}

/* out (contiguous, of the broadcast shape) = a <k> b; the binop in ip[0] */
static em_status bin_cpu(const op_call *call, tensor *out)
{
    tensor *a = call->in[0], *b = call->in[1];
    int nd = out->ndim;
    const int64_t *shape = out->shape;
    int64_t n = t_numel(out);
    bin_ctx c = {.k = (binop)call->ip[0], .out = out, .a = a, .b = b};
    bool same = a->ndim == nd && b->ndim == nd && !memcmp(a->shape, shape, sizeof(int64_t) * (size_t)nd) &&
                !memcmp(b->shape, shape, sizeof(int64_t) * (size_t)nd);
    int64_t nb = t_numel(b);
    bool rows = nd >= 1 && t_numel(a) == n && nb > 0 && (nb == shape[nd - 1] || nb >= 16) &&
                is_trailing_block(b, nd, shape);
    bool f32 = a->dtype == EM_F32 && b->dtype == EM_F32, contig = t_is_contig(a) && t_is_contig(b);
    bool low = out->dtype == EM_F16 || out->dtype == EM_BF16;
    bool mixed = (a->dtype != b->dtype && out->dtype == EM_F32) /* op_call.mixed */ ||
                 (low && a->dtype == out->dtype && b->dtype == out->dtype);
    if ((f32 || mixed) && contig && same) {
        parallel_for(n, 1 << 15, f32 ? bin_flat_f32 : bin_flat_mixed, &c);
    } else if ((f32 || mixed) && contig && rows) {
        c.inner = nb;
        parallel_for(n / nb, (1 << 15) / nb + 1, f32 ? bin_rows_f32 : bin_rows_mixed, &c);
    } else {
        bcast_strides(a, nd, shape, c.sa);
        bcast_strides(b, nd, shape, c.sb);
        parallel_for(n, 1 << 14, bin_strided, &c);
    }
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status bin_cuda(const op_call *call, tensor *out)
{
    tensor *a = call->in[0], *b = call->in[1];
    int nd = out->ndim;
    cu_walk w = {.ndim = nd};
    memcpy(w.shape, out->shape, sizeof(int64_t) * (size_t)nd);
    t_contig_strides(nd, out->shape, w.stride[0]);
    bcast_strides(a, nd, out->shape, w.stride[1]);
    bcast_strides(b, nd, out->shape, w.stride[2]);
    return cu_binary(out->device.index, (binop)call->ip[0], &w, a->dtype, t_ptr(out), t_ptr(a), t_ptr(b));
}
#endif

static const op_kernels bin_kernels = OP_KERNELS(bin_cpu, bin_cuda);

static tensor *binary(binop k, tensor *a, tensor *b)
{
    const char *name = binop_name(k);
    tensor *in[2] = {a, b};
    OP_CALL(c);
    if (!op_begin(&c, binop_ops[k], 2, in)) return NULL;
    a = in[0], b = in[1];
    if (a->dtype == EM_BOOL || (k == BIN_DIV && !em_dtype_is_float(a->dtype)))
        return em_fail(EM_ERR_DTYPE, "%s: does not take %s tensors (%s and %s)", name,
                       em_dtype_name(a->dtype), shp(a), shp(b));
    if (c.record && !chk_float(name, a)) return NULL;
    tensor *out = op_out(&c, c.mixed != EM_BOOL ? c.mixed : a->dtype, c.ndim, c.shape);
    c.ip[0] = k;
    if (!out || op_run(&c, &bin_kernels, out)) return NULL;
    return op_end(&c, out, k == BIN_ADD || k == BIN_SUB ? add_backward : muldiv_backward);
}

/* t_add, t_sub, ...: one per DEF_BINARY line of the op list (declared in
 * tensor_impl.h; a line without a declaration is a compile error) */
#pragma GCC diagnostic error "-Wmissing-prototypes"
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_BINARY(id, fn, amp, be)                                                                          \
    tensor *t_##fn(tensor *a, tensor *b) { return binary(BIN_##id, a, b); }
#include "ops.def"

/* ---- scalar forms: out = a*m + s (add_scalar: m=1; mul_scalar: s=0; neg: m=-1) */

typedef struct affine_ctx {
    tensor *out, *a;
    double m, s;
} affine_ctx;

static void affine_range(void *p, int64_t lo, int64_t hi)
{
    affine_ctx *c = p;
    tensor *a = c->a;
    if (a->dtype == EM_F32 && t_is_contig(a)) {
        const float *x = t_ptr(a);
        float *o = t_ptr(c->out), m = (float)c->m, s = (float)c->s;
        for (int64_t i = lo; i < hi; i++) o[i] = ew_affine_f32v(x[i], m, s);
        return;
    }
    size_t es = t_esize(a);
    char *o = t_ptr(c->out);
    const char *x = t_ptr(a);
    if ((a->dtype == EM_F16 || a->dtype == EM_BF16) && t_is_contig(a)) {
        /* a block at a time, each element as below: x*m + s in double,
         * rounded to float, then to the dtype (convert_n, st's rounding) */
        float xb[MIX_BLOCK];
        for (int64_t b0 = lo; b0 < hi; b0 += MIX_BLOCK) {
            int64_t n = hi - b0 < MIX_BLOCK ? hi - b0 : MIX_BLOCK;
            convert_n(EM_F32, xb, a->dtype, x + b0 * (int64_t)es, n);
            for (int64_t j = 0; j < n; j++) xb[j] = (float)ew_affine_f64(xb[j], c->m, c->s);
            convert_n(a->dtype, o + b0 * (int64_t)es, EM_F32, xb, n);
        }
        return;
    }
    nditer it;
    nditer_init(&it, a->ndim, a->shape, 1, (const int64_t *[]){a->stride});
    nditer_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++) {
        st(a->dtype, o + i * (int64_t)es,
           ew_affine_f64(ld(a->dtype, x + it.off[0] * (int64_t)es), c->m, c->s));
        nditer_next(&it);
    }
}

static em_status affine_backward(node *n, tensor *g)
{
    tensor *ga = n->dp[0] == 1.0 ? g : t_mul_scalar(g, n->dp[0]);
    return ga ? op_grad(n->in[0], ga) : em_last_status();
}

/* out (contiguous, a's shape) = a*m + s: m in dp[0], s in dp[1] */
static em_status affine_cpu(const op_call *call, tensor *out)
{
    affine_ctx c = {out, call->in[0], call->dp[0], call->dp[1]};
    parallel_for(t_numel(out), 1 << 15, affine_range, &c);
    return EM_OK;
}

#if EM_HAVE_CUDA
static em_status affine_cuda(const op_call *call, tensor *out)
{
    tensor *a = call->in[0];
    cu_walk w;
    cu_walk_of(&w, out, 2, (const tensor *[]){out, a});
    return cu_affine(a->device.index, call->op, &w, a->dtype, t_ptr(out), t_ptr(a), call->dp[0], call->dp[1]);
}
#endif

static const op_kernels affine_kernels = OP_KERNELS(affine_cpu, affine_cuda);

static tensor *affine(op_id op, tensor *a, double m, double s)
{
    OP_CALL(c);
    if (!op_begin(&c, op, 1, &a)) return NULL;
    if (a->dtype == EM_BOOL || (a->dtype == EM_U8 && m < 0))
        return em_fail(EM_ERR_DTYPE, "%s: does not take %s tensors (%s)", op_name(op),
                       em_dtype_name(a->dtype), shp(a));
    tensor *out = op_out(&c, a->dtype, a->ndim, a->shape);
    c.dp[0] = m;
    c.dp[1] = s;
    if (!out || op_run(&c, &affine_kernels, out)) return NULL;
    return op_end(&c, out, affine_backward);
}

tensor *t_add_scalar(tensor *a, double s) { return affine(OP_ADD_SCALAR, a, 1.0, s); }
tensor *t_mul_scalar(tensor *a, double m) { return affine(OP_MUL_SCALAR, a, m, 0.0); }
tensor *t_neg(tensor *a) { return affine(OP_NEG, a, -1.0, 0.0); }

/* ---- public wrappers ---------------------------------------------------------- */

static em_tensor *pub2(binop k, em_tensor *a, em_tensor *b)
{
    const char *name = binop_name(k);
    tensor *x = t_resolve(a, name), *y = x ? t_resolve(b, name) : NULL;
    return y ? t_handle(binary(k, x, y)) : NULL;
}

/* em_add, em_sub, ...: one per DEF_BINARY line (declared, with their
 * documentation, in include/ember/tensor.h) */
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_BINARY(id, fn, amp, be)                                                                          \
    em_tensor *em_##fn(em_tensor *a, em_tensor *b) { return pub2(BIN_##id, a, b); }
#include "ops.def"

static em_tensor *pub_affine(op_id op, em_tensor *a, double m, double s)
{
    tensor *x = t_resolve(a, op_name(op));
    return x ? t_handle(affine(op, x, m, s)) : NULL;
}

em_tensor *em_add_scalar(em_tensor *a, double s) { return pub_affine(OP_ADD_SCALAR, a, 1.0, s); }
em_tensor *em_mul_scalar(em_tensor *a, double s) { return pub_affine(OP_MUL_SCALAR, a, s, 0.0); }
em_tensor *em_neg(em_tensor *a) { return pub_affine(OP_NEG, a, -1.0, 0.0); }
