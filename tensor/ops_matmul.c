/* ops_matmul.c — batched matrix product a (...,M,K) @ b (...,K,N) -> (...,M,N)
 * on BLAS: shape/dtype checks, forward, backward; and linear, x (...,in) @
 * W^T + b (out) -> (...,out), the same product with the bias added to each
 * block of the result as the GEMM stores it (section at the end).
 *
 * f32 goes to cblas_sgemm and f64 to cblas_dgemm; bf16 and f16 stay in their
 * dtype and go to em_gemm_low (f32 accumulation, each result rounded once):
 * bf16 on the process's bf16 path (AMX tiles, AVX512-BF16, or widened to f32
 * block by block next to sgemm: tensor/gemm_path.c), f16 widened likewise.
 * Under autocast on the CPU's f32 product path (dispatch.c gives the call
 * c.low) a bf16/f16 product takes f32 operands as they are: em_gemm_low
 * rounds them as it packs them (the bits a cast would give, without the
 * cast), and the backward products give an f32 operand its gradient in f32
 * (rounded as the low result would be). Integers are converted to f64
 * scratch, multiplied and converted back.
 * An operand whose last two dims are a row-major matrix (strides (ld,1)) or a
 * transposed one (strides (1,ld)) is handed to BLAS as it is, with the
 * matching transpose flag; only other layouts are copied. Batch dims
 * broadcast (NumPy rules) and are looped over, one GEMM per batch element;
 * the threads come from OpenBLAS inside each call. When b has no batch dims
 * and a's batch dims and rows are one evenly strided run (a linear layer on
 * (B,T,C)), the whole product is a single GEMM of (B*T,K) @ (K,N).
 * On a CUDA device the product is one cuBLAS strided-batched GEMM (see
 * matmul_cuda below): f32 (TF32 when em_cuda_tf32), f64, and f16/bf16
 * multiplied as they are with f32 accumulation. t_matmul goes through the
 * dispatcher (tensor/dispatch.h); the backward is built from t_matmul, views
 * and t_sum_to, so it runs wherever the forward does. */
#include <cblas.h>
#include <limits.h>

#include "dispatch.h"
#include "ember/runtime.h"
#include "kernel_impl.h"
#if EM_HAVE_CUDA
#include "cuda_elementwise.h"
#include "cuda_matmul.h"
#endif

/* An operand as BLAS sees it: data in the dtype the GEMM reads, its
 * geometry, and how its last two dims map onto a BLAS matrix. */
typedef struct operand {
    const char *data; /* element 0, dtype dt */
    em_dtype dt;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t stride[EM_MAX_DIMS];
    CBLAS_TRANSPOSE trans;
    int64_t ld;
} operand;

/* The BLAS view of a (R,C) matrix with strides (sr,sc): row-major as is, or
 * the transpose of a row-major (C,R) one; false when neither fits. */
static bool blas_layout(int64_t R, int64_t C, int64_t sr, int64_t sc, CBLAS_TRANSPOSE *tr, int64_t *ld)
{
    int64_t c1 = C > 1 ? C : 1, r1 = R > 1 ? R : 1;
    if ((C <= 1 || sc == 1) && (R <= 1 || sr >= c1)) {
        *tr = CblasNoTrans;
        *ld = R <= 1 ? c1 : sr;
    } else if ((R <= 1 || sr == 1) && (C <= 1 || sc >= r1)) {
        *tr = CblasTrans;
        *ld = C <= 1 ? r1 : sc;
    } else {
        return false;
    }
    return *ld <= INT_MAX;
}

/* A header over scratch memory, for copy_strided to write into. */
static void scratch_header(tensor *h, storage *s, em_dtype dt, int ndim, const int64_t *shape, void *data)
{
    memset(h, 0, sizeof *h);
    memset(s, 0, sizeof *s);
    s->data = data;
    s->nbytes = (size_t)shape_numel(ndim, shape) * em_dtype_size(dt);
    h->dtype = dt;
    h->ndim = ndim;
    memcpy(h->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t_contig_strides(ndim, shape, h->stride);
    h->st = s;
}

/* Whether t is a contiguous tensor with its last two dims swapped. */
static bool swapped_contiguous(const tensor *t)
{
    int n = t->ndim;
    if (n < 2 || t->stride[n - 2] != 1 || t->stride[n - 1] != t->shape[n - 2]) return false;
    int64_t want = t->shape[n - 2] * t->shape[n - 1];
    for (int i = n - 3; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != want) return false;
        want *= t->shape[i];
    }
    return true;
}

/* Fills op for t in dtype ct, copying t into temp scratch only when its
 * dtype differs or its matrix layout suits BLAS neither way. */
static bool prepare(operand *op, tensor *t, em_dtype ct)
{
    int n = t->ndim;
    op->ndim = n;
    op->dt = ct;
    memcpy(op->shape, t->shape, sizeof(int64_t) * (size_t)n);
    if (t->dtype == ct && blas_layout(t->shape[n - 2], t->shape[n - 1], t->stride[n - 2], t->stride[n - 1],
                                      &op->trans, &op->ld)) {
        op->data = t_ptr(t);
        memcpy(op->stride, t->stride, sizeof(int64_t) * (size_t)n);
        return true;
    }
    void *buf = tmp_alloc((size_t)t_numel(t) * em_dtype_size(ct) + 1);
    if (!buf) return false;
    if (t->dtype != ct && swapped_contiguous(t)) {
        /* a transposed matrix (W^T): convert its memory in order and keep
         * the transposed layout, which BLAS takes as it is */
        convert_par(ct, buf, t->dtype, t_ptr(t), t_numel(t));
        op->data = buf;
        memcpy(op->stride, t->stride, sizeof(int64_t) * (size_t)n);
        blas_layout(t->shape[n - 2], t->shape[n - 1], t->stride[n - 2], t->stride[n - 1], &op->trans,
                    &op->ld);
        return true;
    }
    tensor h;
    storage s;
    scratch_header(&h, &s, ct, n, t->shape, buf);
    copy_strided(&h, t);
    op->data = buf;
    memcpy(op->stride, h.stride, sizeof(int64_t) * (size_t)n);
    blas_layout(t->shape[n - 2], t->shape[n - 1], h.stride[n - 2], h.stride[n - 1], &op->trans, &op->ld);
    return true;
}

/* op's strides over the output's batch dims (nb of them, sizes bs): 0 where
 * op is missing the dim or broadcasts along it. */
static void batch_strides(const operand *op, int nb, const int64_t *bs, int64_t *out)
{
    for (int i = 0; i < nb; i++) {
        int j = op->ndim - 2 - nb + i;
        out[i] = (j < 0 || (op->shape[j] == 1 && bs[i] != 1)) ? 0 : op->stride[j];
    }
}

/* c (M,N) row-major of dtype ct, ldc = N  <-  op(a) (M,K) @ op(b) (K,N) as
 * a product in lo: bf16/f16 by em_gemm_low (operands and c in lo, or f32
 * where it reads them), else f32/f64 (all in lo) by em_gemm; then bias (N
 * values: f64 for an f64 c, else f32; or NULL) added to every row as the
 * GEMM finishes each block (gemm_add_bias's rule); EM_ERR_ARG or
 * EM_ERR_UNSUPPORTED for an EMBER_BF16_PATH/EMBER_F32_PATH it cannot take */
static em_status gemm(em_dtype lo, const operand *a, const char *ap, const operand *b, const char *bp,
                      em_dtype ct, char *cp, int64_t M, int64_t N, int64_t K, const void *bias)
{
    bool ta = a->trans == CblasTrans, tb = b->trans == CblasTrans;
    if (lo == EM_BF16 || lo == EM_F16)
        return em_gemm_low((gemm_low_dtypes){.lo = lo, .a = a->dt, .b = b->dt, .c = ct, .bias = bias}, ta, tb,
                           M, N, K, ap, a->ld, bp, b->ld, cp, N > 1 ? N : 1);
    f32_path p; /* a bad EMBER_F32_PATH is reported here (em_gemm cannot) */
    em_status s = lo == EM_F32 ? gemm_f32_path(&p) : EM_OK;
    if (s) return s;
    em_gemm_bias(lo, ta, tb, M, N, K, 1.0, ap, a->ld, bp, b->ld, cp, N > 1 ? N : 1, bias);
    return EM_OK;
}

/* True when a's batch dims and its M rows form one run of stride a->ld (so
 * a is a (rows,K) row-major matrix), and b repeats over every batch dim. */
static bool folds_into_one_gemm(const operand *a, const int64_t *sa, const int64_t *sb, int nb,
                                const int64_t *bs, int64_t M)
{
    if (a->trans != CblasNoTrans) return false;
    int64_t want = a->ld * M;
    for (int i = nb - 1; i >= 0; i--) {
        if (bs[i] == 1) continue;
        if (sb[i] != 0 || sa[i] != want) return false;
        want *= bs[i];
    }
    return true;
}

/* Runs the products in lo into c (contiguous, out's shape, dtype ct), bias
 * (gemm's) added to every row. */
static em_status matmul_kernel(em_dtype lo, const operand *a, const operand *b, em_dtype ct, char *c, int nb,
                               const int64_t *bs, int64_t M, int64_t N, int64_t K, const void *bias)
{
    size_t ea = em_dtype_size(a->dt), eb = em_dtype_size(b->dt), ec = em_dtype_size(ct);
    int64_t nbatch = shape_numel(nb, bs);
    int64_t sa[EM_MAX_DIMS], sb[EM_MAX_DIMS];
    batch_strides(a, nb, bs, sa);
    batch_strides(b, nb, bs, sb);
    if (M == 0 || N == 0 || nbatch == 0) return EM_OK;
    if (K == 0) {
        memset(c, 0, (size_t)(nbatch * M * N) * ec);
        if (bias) gemm_add_bias(ct, bias, c, N, nbatch * M, N);
        return EM_OK;
    }
    if (nbatch == 1 || (folds_into_one_gemm(a, sa, sb, nb, bs, M) && nbatch * M <= INT_MAX))
        return gemm(lo, a, a->data, b, b->data, ct, c, nbatch * M, N, K, bias);
    nditer it;
    nditer_init(&it, nb, bs, 2, (const int64_t *[]){sa, sb});
    for (int64_t i = 0; i < nbatch; i++) {
        em_status s = gemm(lo, a, a->data + it.off[0] * (int64_t)ea, b, b->data + it.off[1] * (int64_t)eb, ct,
                           c + (size_t)(i * M * N) * ec, M, N, K, bias);
        if (s) return s;
        nditer_next(&it);
    }
    return EM_OK;
}

/* acc (R,C) = x (R,M) @ y (M,C), or (add) acc + that: one GEMM on the CPU,
 * with acc row-major or the transpose of a row-major matrix (then acc^T =
 * y^T @ x^T, so the GEMM writes rows of the memory it is given). x and y
 * are laid out for BLAS as matmul's operands are (prepare). lo EM_F32: a
 * product in acc's dtype (f32 or f64) throughout; else a product in lo
 * (bf16/f16) into an f32 acc, where gemm_low_reads_f32(lo), reading f32
 * operands as they are and adding each result rounded to lo. */
/* The dtype gemm_into reads operand t in: acc's (ct) in an f32/f64
 * product; in a low product (lo bf16/f16) t's own where that is f32
 * (rounded as it is packed), else lo. */
static em_dtype read_as(em_dtype lo, const tensor *t, em_dtype ct)
{
    if (lo == EM_F32) return ct;
    return t->dtype == EM_F32 ? EM_F32 : lo;
}

static em_status gemm_into(tensor *acc, tensor *x, tensor *y, em_dtype lo, bool add)
{
    em_dtype ct = acc->dtype;
    int64_t R = acc->shape[0], C = acc->shape[1], M = x->shape[1];
    bool transposed = C > 1 && acc->stride[1] != 1;
    tensor *l = transposed ? t_transpose(y, 0, 1) : x, *r = transposed ? t_transpose(x, 0, 1) : y;
    size_t mk = tmp_mark();
    operand ol, orr;
    bool low = lo != EM_F32;
    if (!l || !r || !prepare(&ol, l, read_as(lo, l, ct)) || !prepare(&orr, r, read_as(lo, r, ct))) {
        tmp_release(mk);
        return em_last_status();
    }
    int64_t rows = transposed ? C : R, cols = transposed ? R : C;
    int64_t ldc = transposed ? acc->stride[1] : acc->stride[0];
    ldc = ldc > 1 ? ldc : (cols > 1 ? cols : 1);
    bool ta = ol.trans == CblasTrans, tb = orr.trans == CblasTrans;
    em_status s = EM_OK;
    if (low)
        s = em_gemm_low((gemm_low_dtypes){.lo = lo, .a = ol.dt, .b = orr.dt, .c = EM_F32, .add = add}, ta, tb,
                        rows, cols, M, ol.data, ol.ld, orr.data, orr.ld, t_ptr(acc), ldc);
    else
        em_gemm(ct, ta, tb, rows, cols, M, 1.0, ol.data, ol.ld, orr.data, orr.ld, add ? 1.0 : 0.0, t_ptr(acc),
                ldc);
    tmp_release(mk);
    return s;
}

static tensor *matmul(tensor *a, tensor *b, em_dtype lo, em_dtype out_dt);

/* Whether x's gradient, a product over the output's batch dims (those of
 * g), must be summed down to x's shape (x broadcast along some of them). */
static bool summed(const tensor *x, const tensor *g)
{
    if (x->ndim != g->ndim) return true;
    for (int i = 0; i < g->ndim - 2; i++)
        if (x->shape[i] != g->shape[i]) return true;
    return false;
}

/* x @ y for operand t's gradient: the forward's kind of product. A product
 * in lo (the forward read f32 operands as they were: node ip[0]) gives t's
 * gradient in t's dtype, so an f32 weight takes it without a copy; where
 * it is still to be summed (a broadcast t), in lo, as a bf16 copy of t
 * would have taken it, and the engine widens it into t's gradient. */
static tensor *grad_product(tensor *x, tensor *y, em_dtype lo, const tensor *t, bool sum)
{
    if (lo == EM_F32) return t_matmul(x, y);
    return matmul(x, y, lo, sum ? lo : t->dtype);
}

/* dA = g @ B^T, dB = A^T @ g, each summed over the batch dims it broadcast
 * along, for a product a @ b in lo (matmul's ip[0]). When b is a plain
 * (K,N) matrix, dB is one GEMM over all rows; on the CPU in f32/f64 that
 * GEMM adds into b's gradient where it lies (op_grad_acc: a Linear's dW
 * into W's buffer, with beta 1 once it holds something), so a weight's
 * gradient is never made a second time. w: NULL, or (linear) the weight
 * whose transpose b is, a view made for this call: b's gradient goes to w,
 * computed as for a matmul's b = W^T (the same GEMMs, so the same bits). */
static em_status product_grads(tensor *a, tensor *b, tensor *w, em_dtype lo, tensor *g)
{
    tensor *bw = w ? w : b; /* the tensor b's gradient goes to */
    em_status s;
    if (a->requires_grad) {
        bool sum = summed(a, g);
        tensor *bt = t_transpose(b, -1, -2);
        tensor *ga = bt ? grad_product(g, bt, lo, a, sum) : NULL;
        ga = ga ? t_sum_to(ga, a->ndim, a->shape) : NULL;
        if (!ga) return em_last_status();
        if ((s = op_grad(a, ga))) return s;
    }
    if (bw->requires_grad) {
        tensor *gb;
        if (b->ndim == 2 && a->ndim >= 2) {
            int64_t K = a->shape[a->ndim - 1], N = g->shape[g->ndim - 1];
            tensor *a2 = t_reshape(a, 2, (int64_t[]){-1, K}), *g2 = t_reshape(g, 2, (int64_t[]){-1, N});
            /* b = W^T for a contiguous W (N,K) (a Linear layer): compute
             * dW = g^T a directly, so the gradient reaches W contiguous */
            bool b_is_wt = w || (b->stride[0] == 1 && b->stride[1] == K && K > 1);
            bool fresh = false;
            /* in place where the product is f32/f64 throughout, or a low
             * product (of the forward) that reads f32 into an f32 weight */
            bool here = !t_on_cuda(g) &&
                        (lo == EM_F32 ? g->dtype == b->dtype && (b->dtype == EM_F32 || b->dtype == EM_F64)
                                      : b->dtype == EM_F32 && gemm_low_reads_f32(lo));
            tensor *acc = here ? op_grad_acc(bw, &fresh) : NULL;
            if (acc) {
                /* the same GEMM as below (dW = g^T a for W^T), written into
                 * acc: W's accumulator seen as b's, as a W^T view's is */
                tensor *ab = w ? t_transpose(acc, 0, 1) : acc;
                s = ab && a2 && g2 ? gemm_into(ab, t_transpose(a2, 0, 1), g2, lo, !fresh) : em_last_status();
                return s ? s : op_grad_done(bw);
            }
            tensor *g2t = g2 ? t_transpose(g2, 0, 1) : NULL, *a2t = a2 ? t_transpose(a2, 0, 1) : NULL;
            if (b_is_wt) {
                tensor *gw = g2t && a2 ? grad_product(g2t, a2, lo, b, false) : NULL;
                gb = w || !gw ? gw : t_transpose(gw, 0, 1);
            } else {
                gb = a2t && g2 ? grad_product(a2t, g2, lo, b, false) : NULL;
            }
        } else {
            bool sum = summed(b, g);
            tensor *at = t_transpose(a, -1, -2);
            gb = at ? grad_product(at, g, lo, b, sum) : NULL;
            gb = gb ? t_sum_to(gb, b->ndim, b->shape) : NULL;
        }
        if (!gb) return em_last_status();
        if ((s = op_grad(bw, gb))) return s;
    }
    return EM_OK;
}

static em_status matmul_backward(node *n, tensor *g)
{
    return product_grads(n->in[0], n->in[1], NULL, (em_dtype)n->ip[0], g);
}

/* The CPU product of a (...,M,K) and b (...,K,N) (checked) into out
 * (contiguous, (...,M,N)), then bias (N values: f64 for an f64 out, else
 * f32; or NULL) added to every row (gemm_add_bias's rule, on the value the
 * product stored in out). A product in lo (bf16/f16, the operands and out
 * each in it or f32; EM_F32: in the operands' dtype) reads f32 operands as
 * they are where its path reads f32 (gemm_low_reads_f32), else copies of
 * them in lo, and writes an f32 out directly where its path writes f32
 * (gemm_low_writes_f32: also AVX512-BF16), else through a copy in lo (the
 * bias then added after the copy into out). */
static em_status product_cpu(tensor *a, tensor *b, em_dtype lo, tensor *out, const void *bias)
{
    int nb = out->ndim - 2;
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    em_dtype dt = a->dtype, od = out->dtype;
    /* the product's dtype: lo when set; else floats stay in theirs
     * (bf16/f16 accumulate in f32 and round each result once:
     * em_gemm_low), integers go through f64 */
    if (lo == EM_F32) lo = em_dtype_is_float(dt) ? dt : EM_F64;
    bf16_path path;
    if (lo == EM_BF16 && gemm_bf16_path(&path)) return em_last_status();
    bool direct = (lo == EM_BF16 || lo == EM_F16) && gemm_low_reads_f32(lo);
    em_dtype at = direct && a->dtype == EM_F32 ? EM_F32 : lo, bt = direct && b->dtype == EM_F32 ? EM_F32 : lo,
             ct = od == EM_F32 && (lo == EM_BF16 || lo == EM_F16) && gemm_low_writes_f32(lo) ? EM_F32 : lo;
    size_t mk = tmp_mark();
    operand oa, ob;
    char *c = od == ct ? t_ptr(out) : tmp_alloc((size_t)t_numel(out) * em_dtype_size(ct) + 1);
    if (!c || !prepare(&oa, a, at) || !prepare(&ob, b, bt)) {
        tmp_release(mk);
        return em_last_status();
    }
    em_status s = matmul_kernel(lo, &oa, &ob, ct, c, nb, out->shape, M, N, K, od == ct ? bias : NULL);
    if (!s && od != ct) {
        convert_par(od, t_ptr(out), ct, c, t_numel(out));
        if (bias && N > 0) gemm_add_bias(od, bias, t_ptr(out), N, t_numel(out) / N, N);
    }
    tmp_release(mk);
    return s;
}

/* The product of call->in[0] and in[1] (checked) in ip[0] into out. */
static em_status matmul_cpu(const op_call *call, tensor *out)
{
    return product_cpu(call->in[0], call->in[1], (em_dtype)call->ip[0], out, NULL);
}

/* w (out,in) seen as W^T (in,out): a header over its memory, made for a
 * kernel (no node; t_drop it) */
static tensor *w_transposed(tensor *w)
{
    return t_view_of(w, 2, (int64_t[]){w->shape[1], w->shape[0]}, (int64_t[]){w->stride[1], w->stride[0]},
                     w->offset);
}

/* linear on the CPU: out = x @ W^T as matmul's product in ip[0], with b
 * (in[2] when given) added to each block of out as the GEMM stores it:
 * the f32 avx2 and widening kernels add it in registers, the BLAS paths
 * to each part's block right after its GEMM (tensor/gemm.c). b is read
 * as out's dtype adds it (f64 for f64, else f32: a bf16/f16 bias widened
 * into scratch first, as every non-contiguous one is copied). */
static em_status linear_cpu(const op_call *call, tensor *out)
{
    tensor *x = call->in[0], *b = call->nin > 2 ? call->in[2] : NULL;
    tensor *wt = w_transposed(call->in[1]);
    if (!wt) return em_last_status();
    size_t mk = tmp_mark();
    const void *bias = NULL;
    if (b) {
        em_dtype bt = out->dtype == EM_F64 ? EM_F64 : EM_F32;
        bias = t_ptr(b);
        if (b->dtype != bt || (b->shape[0] > 1 && b->stride[0] != 1)) {
            void *buf = tmp_alloc((size_t)b->shape[0] * em_dtype_size(bt) + 1);
            tensor h;
            storage st;
            if (buf) {
                scratch_header(&h, &st, bt, 1, b->shape, buf);
                copy_strided(&h, b);
            }
            bias = buf;
        }
    }
    em_status s = b && !bias ? em_last_status() : product_cpu(x, wt, (em_dtype)call->ip[0], out, bias);
    tmp_release(mk);
    t_drop(wt);
    return s;
}

#if EM_HAVE_CUDA
/* ---- CUDA: one cuBLAS call ----------------------------------------------------------
 * Each operand goes to cuBLAS as it lies when its last two dims are a
 * row-major or a transposed matrix (a Linear's W^T: a transpose flag, no
 * copy) and its batch dims step through the output's batch with one
 * stride (0 when it repeats: a (K,N) weight under a (B,M,K) input). Then
 * the whole product is one strided-batched GEMM, and a (B,M,K) @ (K,N)
 * folds into a single (B*M,K) @ (K,N). Any other layout is first copied on
 * the device: a matrix that is neither way round into a contiguous one,
 * batch dims that no single stride walks (a broadcast in the middle, a
 * permuted view) into contiguous matrices over the output's batch dims. */

/* The operand of a GEMM: device pointer, transpose flag, leading dim and
 * the stride from one matrix of the batch to the next. */
typedef struct cu_operand {
    const void *data;
    bool trans;
    int64_t ld, batch_stride;
} cu_operand;

/* Whether batch strides s over the batch shape (nb, bs) walk the flattened
 * batch index with one stride (*S). */
static bool one_batch_stride(int nb, const int64_t *bs, const int64_t *s, int64_t *S)
{
    bool found = false;
    int64_t inner = 1; /* batch elements per step of dim i */
    *S = 0;
    for (int i = nb - 1; i >= 0; i--) {
        if (bs[i] == 1) continue;
        if (!found) {
            *S = s[i];
            found = true;
        } else if (s[i] != *S * inner) {
            return false;
        }
        inner *= bs[i];
    }
    return true;
}

/* t as a GEMM operand over the output's batch dims (nb, bs). *copy is a
 * tensor made for it on the device, or NULL; drop it once the GEMM is
 * queued. */
static em_status cu_operand_of(cu_operand *op, tensor *t, int nb, const int64_t *bs, tensor **copy)
{
    *copy = NULL;
    int n = t->ndim;
    int64_t R = t->shape[n - 2], C = t->shape[n - 1];
    CBLAS_TRANSPOSE tr = CblasNoTrans;
    int64_t ld = 1;
    if (!blas_layout(R, C, t->stride[n - 2], t->stride[n - 1], &tr, &ld)) {
        if (!(*copy = t_clone(t))) return em_last_status();
        t = *copy;
        blas_layout(R, C, t->stride[n - 2], t->stride[n - 1], &tr, &ld); /* row-major now */
    }
    operand o = {.ndim = n};
    memcpy(o.shape, t->shape, sizeof(int64_t) * (size_t)n);
    memcpy(o.stride, t->stride, sizeof(int64_t) * (size_t)n);
    int64_t sb[EM_MAX_DIMS], S;
    batch_strides(&o, nb, bs, sb);
    if (!one_batch_stride(nb, bs, sb, &S)) {
        /* t expanded to (bs..., R, C), contiguous */
        int64_t shape[EM_MAX_DIMS];
        memcpy(shape, bs, sizeof(int64_t) * (size_t)nb);
        shape[nb] = R;
        shape[nb + 1] = C;
        tensor *e = t_new_on(t->device, t->dtype, nb + 2, shape);
        if (!e) {
            t_drop(*copy);
            return em_last_status();
        }
        cu_walk w = {.ndim = nb + 2};
        memcpy(w.shape, shape, sizeof(int64_t) * (size_t)(nb + 2));
        memcpy(w.stride[0], e->stride, sizeof(int64_t) * (size_t)(nb + 2));
        memcpy(w.stride[1], sb, sizeof(int64_t) * (size_t)nb);
        w.stride[1][nb] = t->stride[n - 2];
        w.stride[1][nb + 1] = t->stride[n - 1];
        em_status s = cu_copy(e->device.index, &w, e->dtype, t_ptr(e), t->dtype, t_ptr(t));
        t_drop(*copy); /* queued before anything that could reuse its memory */
        *copy = e;
        if (s) return s;
        t = e;
        blas_layout(R, C, t->stride[nb], t->stride[nb + 1], &tr, &ld);
        S = R * C;
    }
    op->data = t_ptr(t);
    op->trans = tr == CblasTrans;
    op->ld = ld;
    op->batch_stride = S;
    return EM_OK;
}

/* The product of a and b on their CUDA device (checked) into out. */
static em_status product_cuda(tensor *a, tensor *b, tensor *out)
{
    int nb = out->ndim - 2;
    const int64_t *shape = out->shape;
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    int64_t nbatch = shape_numel(nb, shape);
    if (M == 0 || N == 0 || nbatch == 0) return EM_OK;
    if (K == 0) return t_fill_zero(out); /* an empty sum */
    cu_operand oa, ob;
    tensor *ca = NULL, *cb = NULL;
    em_status s = cu_operand_of(&oa, a, nb, shape, &ca);
    if (!s) s = cu_operand_of(&ob, b, nb, shape, &cb);
    if (!s) {
        cu_gemm g = {.dt = a->dtype,
                     .tf32 = em_cuda_tf32(),
                     .M = M,
                     .N = N,
                     .K = K,
                     .batch = nbatch,
                     .a = oa.data,
                     .ta = oa.trans,
                     .lda = oa.ld,
                     .stride_a = oa.batch_stride,
                     .b = ob.data,
                     .tb = ob.trans,
                     .ldb = ob.ld,
                     .stride_b = ob.batch_stride,
                     .c = t_ptr(out),
                     .ldc = N,
                     .stride_c = M * N};
        /* a's rows run on through its batch at stride lda and b repeats:
         * one (nbatch*M,K) @ (K,N) */
        if (nbatch > 1 && !oa.trans && ob.batch_stride == 0 && oa.batch_stride == oa.ld * M &&
            nbatch * M <= INT_MAX) {
            g.M = nbatch * M;
            g.batch = 1;
        }
        s = cu_matmul(a->device.index, &g);
    }
    t_drop(ca); /* in stream order: the GEMM was queued first */
    t_drop(cb);
    return s;
}

static em_status matmul_cuda(const op_call *call, tensor *out)
{
    return product_cuda(call->in[0], call->in[1], out);
}

/* linear on a CUDA device: the product as matmul's (in ip[1], the dtype of
 * x and w), into out or, where out is wider (an f32 bias under autocast),
 * into a copy of the product's dtype widened into out; then b added by the
 * elementwise add's kernel. That is a second pass over out, which the CPU
 * avoids; a cuBLASLt bias epilogue would remove it here too (not yet). */
static em_status linear_cuda(const op_call *call, tensor *out)
{
    tensor *x = call->in[0], *b = call->nin > 2 ? call->in[2] : NULL;
    em_dtype pd = (em_dtype)call->ip[1], od = out->dtype;
    int dev = out->device.index, nd = out->ndim;
    tensor *wt = w_transposed(call->in[1]);
    tensor *y = wt && pd != od ? t_new_on(out->device, pd, nd, out->shape) : out;
    tensor *bc = b && b->dtype != od ? t_new_on(out->device, od, 1, b->shape) : b;
    em_status s = wt && y && (!b || bc) ? product_cuda(x, wt, y) : em_last_status();
    cu_walk w = {.ndim = nd};
    memcpy(w.shape, out->shape, sizeof(int64_t) * (size_t)nd);
    t_contig_strides(nd, out->shape, w.stride[0]);
    memcpy(w.stride[1], w.stride[0], sizeof(int64_t) * (size_t)nd);
    if (!s && y != out) s = cu_copy(dev, &w, od, t_ptr(out), pd, t_ptr(y));
    if (!s && bc != b) {
        cu_walk wb = {.ndim = 1, .shape = {b->shape[0]}, .stride = {{1}, {b->stride[0]}}};
        s = cu_copy(dev, &wb, od, t_ptr(bc), b->dtype, t_ptr(b));
    }
    if (!s && b) { /* out += b along its last dim */
        w.stride[2][nd - 1] = bc->stride[0];
        s = cu_binary(dev, BIN_ADD, &w, od, t_ptr(out), t_ptr(out), t_ptr(bc));
    }
    if (y != out) t_drop(y); /* in stream order, after the kernels that read them */
    if (bc != b) t_drop(bc);
    t_drop(wt);
    return s;
}
#endif

static const op_kernels matmul_kernels = OP_KERNELS(matmul_cpu, matmul_cuda);
static const op_kernels linear_kernels = OP_KERNELS(linear_cpu, linear_cuda);

/* a @ b. lo EM_F32: a product in the operands' common dtype, unless
 * op_begin's autocast makes it one in its dtype (c.low: matmul reads the
 * f32 operands it left uncast). lo bf16/f16 (backward of such a product):
 * one in lo whatever autocast says. In a product in lo each operand is lo
 * or f32 and the result is out_dt (lo or f32; EM_F32 given with lo EM_F32
 * means lo). */
static tensor *matmul(tensor *a, tensor *b, em_dtype lo, em_dtype out_dt)
{
    tensor *in[2] = {a, b};
    OP_CALL(c);
    if (!op_begin(&c, OP_MATMUL, 2, in)) return NULL;
    a = in[0], b = in[1];
    if (a->ndim < 2 || b->ndim < 2)
        return em_fail(EM_ERR_SHAPE,
                       "matmul: operands must be at least 2-D: a is %s, b is %s (unsqueeze a vector)", shp(a),
                       shp(b));
    if (lo == EM_F32 && c.low != EM_F32) lo = out_dt = c.low;
    if (lo == EM_F32 && !chk_same_dtype("matmul", a, b)) return NULL;
    if (lo != EM_F32 && ((a->dtype != lo && a->dtype != EM_F32) || (b->dtype != lo && b->dtype != EM_F32)))
        return em_fail(EM_ERR_DTYPE, "matmul: a %s product takes %s or f32 operands: a is %s%s, b is %s%s",
                       em_dtype_name(lo), em_dtype_name(lo), em_dtype_name(a->dtype), shp(a),
                       em_dtype_name(b->dtype), shp(b));
    if (a->dtype == EM_BOOL)
        return em_fail(EM_ERR_DTYPE, "matmul: does not take bool tensors (%s and %s)", shp(a), shp(b));
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    if (b->shape[b->ndim - 2] != K)
        return em_fail(EM_ERR_SHAPE, "matmul: inner dims differ: a is %s, b is %s", shp(a), shp(b));
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return em_fail(EM_ERR_UNSUPPORTED, "matmul: dims beyond BLAS's int range: a is %s, b is %s", shp(a),
                       shp(b));
    int nb;
    int64_t shape[EM_MAX_DIMS];
    if (bcast_shape("matmul", a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nb, shape))
        return em_fail(EM_ERR_SHAPE, "matmul: batch dims do not broadcast: a is %s, b is %s", shp(a), shp(b));
    shape[nb] = M;
    shape[nb + 1] = N;
    if (c.dev.type == EM_CUDA) {
        em_dtype dt = a->dtype;
        if (dt != EM_F32 && dt != EM_F64 && dt != EM_F16 && dt != EM_BF16)
            return em_fail(EM_ERR_DTYPE, "matmul: no CUDA product for %s (f32, f64, f16, bf16): a is %s",
                           em_dtype_name(dt), shp(a));
        if (lo != EM_F32) /* autocast casts for a device's products (dispatch.c) */
            return em_fail(EM_ERR_UNSUPPORTED,
                           "matmul: no CUDA product of mixed dtypes: a is %s%s, b is %s%s",
                           em_dtype_name(a->dtype), shp(a), em_dtype_name(b->dtype), shp(b));
        int64_t nbatch = shape_numel(nb, shape);
        if (nbatch > INT_MAX)
            return em_fail(EM_ERR_UNSUPPORTED, "matmul: %lld batch elements are beyond cuBLAS's int range",
                           (long long)nbatch);
    }
    c.ip[0] = lo; /* the kernel's and backward's: EM_F32 = in the operands' dtype */
    /* a low product that reads f32 operands reads an f32 gradient too */
    c.grad_reads_f32 = c.dev.type == EM_CPU && lo != EM_F32 && gemm_low_reads_f32(lo);
    tensor *out = op_out(&c, lo == EM_F32 ? a->dtype : out_dt, nb + 2, shape);
    if (!out) return NULL;
    if (op_run(&c, &matmul_kernels, out)) {
        t_drop(out);
        return NULL;
    }
    return op_end(&c, out, matmul_backward);
}

tensor *t_matmul(tensor *a, tensor *b) { return matmul(a, b, EM_F32, EM_F32); }

em_tensor *em_matmul(em_tensor *a, em_tensor *b)
{
    tensor *x = t_resolve(a, "matmul"), *y = x ? t_resolve(b, "matmul") : NULL;
    return y ? t_handle(t_matmul(x, y)) : NULL;
}

/* ---- linear: y = x @ W^T + b ------------------------------------------------------
 * One op for a Linear layer: the product as matmul makes it (x @ W^T, W^T
 * the transposed view of W) and the bias added to it as the GEMM stores it
 * (linear_cpu). The bits are those of add(matmul(x, W^T), b): under
 * autocast the product is rounded to the low dtype and the bias (left in
 * its dtype by autocast: dispatch.c) is added in the wider of the two, the
 * dtype add's PROMOTE would give. */

/* The dtype a product in pd meets a bias in bd in: add's PROMOTE (f64 >
 * f32 > bf16, f16; bf16 against f16 meets at f32). */
static em_dtype promoted(em_dtype pd, em_dtype bd)
{
    if (pd == bd) return pd;
    return pd == EM_F64 || bd == EM_F64 ? EM_F64 : EM_F32;
}

/* db = g summed over all rows; dx, dW as matmul's backward makes them for
 * x @ W^T (product_grads), from g in the product's dtype (ip[1]) as the
 * autograd engine would have handed it to the product: as it is where the
 * product reads an f32 gradient (node.grad_reads_f32), else rounded. */
static em_status linear_backward(node *n, tensor *g)
{
    tensor *x = n->in[0], *w = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    em_dtype lo = (em_dtype)n->ip[0], pd = (em_dtype)n->ip[1];
    em_status s;
    if (b && b->requires_grad) {
        tensor *gb = t_sum_to(g, 1, b->shape);
        if (!gb) return em_last_status();
        if ((s = op_grad(b, gb))) return s;
    }
    if (!x->requires_grad && !w->requires_grad) return EM_OK;
    tensor *gp = g->dtype == pd || (g->dtype == EM_F32 && n->grad_reads_f32) ? g : t_cast(g, pd);
    tensor *wt = gp ? t_transpose(w, 0, 1) : NULL;
    return wt ? product_grads(x, wt, w, lo, gp) : em_last_status();
}

/* x (...,M,in) @ W^T + b, x at least 2-D (t_linear takes a vector) */
static tensor *linear(tensor *x, tensor *w, tensor *b)
{
    tensor *in[3] = {x, w, b};
    OP_CALL(c);
    if (!op_begin(&c, OP_LINEAR, b ? 3 : 2, in)) return NULL;
    x = in[0], w = in[1], b = b ? in[2] : NULL;
    if (w->ndim != 2)
        return em_fail(EM_ERR_SHAPE, "linear: w must be 2-D (out,in): w is %s, x is %s", shp(w), shp(x));
    int64_t nout = w->shape[0], nin = w->shape[1], M = x->shape[x->ndim - 2];
    if (x->shape[x->ndim - 1] != nin)
        return em_fail(EM_ERR_SHAPE, "linear: x's last dim must be w's in (w is (out,in)): x is %s, w is %s",
                       shp(x), shp(w));
    if (b && (b->ndim != 1 || b->shape[0] != nout))
        return em_fail(EM_ERR_SHAPE, "linear: b must be (out) = (%lld) for w %s: b is %s", (long long)nout,
                       shp(w), shp(b));
    if (!em_dtype_is_float(x->dtype) || !em_dtype_is_float(w->dtype) || (b && !em_dtype_is_float(b->dtype)))
        return em_fail(EM_ERR_DTYPE, "linear: takes float tensors: x is %s%s, w is %s%s%s%s",
                       em_dtype_name(x->dtype), shp(x), em_dtype_name(w->dtype), shp(w), b ? ", b is " : "",
                       b ? em_dtype_name(b->dtype) : "");
    em_dtype lo = c.low; /* a product in the autocast dtype from f32 operands (dispatch.c), or EM_F32 */
    if (lo == EM_F32 && !chk_same_dtype("linear", x, w)) return NULL;
    if (lo != EM_F32 && ((x->dtype != lo && x->dtype != EM_F32) || (w->dtype != lo && w->dtype != EM_F32)))
        return em_fail(EM_ERR_DTYPE, "linear: a %s product takes %s or f32 operands: x is %s%s, w is %s%s",
                       em_dtype_name(lo), em_dtype_name(lo), em_dtype_name(x->dtype), shp(x),
                       em_dtype_name(w->dtype), shp(w));
    em_dtype pd = lo == EM_F32 ? x->dtype : lo; /* the product's dtype */
    /* without autocast b is in the product's dtype, as add wants its inputs */
    if (b && b->dtype != pd && op_autocast() == EM_F32)
        return em_fail(EM_ERR_DTYPE, "linear: b is %s%s but x and w are %s", em_dtype_name(b->dtype), shp(b),
                       em_dtype_name(pd));
    if (M > INT_MAX || nout > INT_MAX || nin > INT_MAX)
        return em_fail(EM_ERR_UNSUPPORTED, "linear: dims beyond BLAS's int range: x is %s, w is %s", shp(x),
                       shp(w));
    int nd = x->ndim;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)nd);
    shape[nd - 1] = nout;
    if (c.dev.type == EM_CUDA) {
        if (pd != EM_F32 && pd != EM_F64 && pd != EM_F16 && pd != EM_BF16)
            return em_fail(EM_ERR_DTYPE, "linear: no CUDA product for %s (f32, f64, f16, bf16): x is %s",
                           em_dtype_name(pd), shp(x));
        if (shape_numel(nd - 2, shape) > INT_MAX)
            return em_fail(EM_ERR_UNSUPPORTED, "linear: %lld batch elements are beyond cuBLAS's int range",
                           (long long)shape_numel(nd - 2, shape));
    }
    c.ip[0] = lo; /* as matmul's: EM_F32 = in the operands' dtype */
    c.ip[1] = pd;
    c.grad_reads_f32 = c.dev.type == EM_CPU && lo != EM_F32 && gemm_low_reads_f32(lo);
    tensor *out = op_out(&c, b ? promoted(pd, b->dtype) : pd, nd, shape);
    if (!out) return NULL;
    if (op_run(&c, &linear_kernels, out)) {
        t_drop(out);
        return NULL;
    }
    return op_end(&c, out, linear_backward);
}

tensor *t_linear(tensor *x, tensor *w, tensor *b)
{
    if (!x || x->ndim >= 2) return linear(x, w, b);
    if (x->ndim == 0)
        return em_fail(EM_ERR_SHAPE, "linear: x must be at least 1-D (...,in): x is %s", shp(x));
    tensor *x2 = t_unsqueeze(x, 0); /* (in) -> (1,in) */
    tensor *y2 = x2 ? linear(x2, w, b) : NULL;
    tensor *y = y2 ? t_squeeze(y2, 0) : NULL;
    t_drop(x2);
    t_drop(y2);
    return y;
}

em_tensor *em_linear(em_tensor *x, em_tensor *w, em_tensor *b)
{
    tensor *xt = t_resolve(x, "linear"), *wt = xt ? t_resolve(w, "linear") : NULL;
    tensor *bt = wt && b ? t_resolve(b, "linear") : NULL;
    if (!wt || (b && !bt)) return NULL;
    return t_handle(t_linear(xt, wt, bt));
}
