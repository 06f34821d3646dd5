/* kernel_impl.h — what a CPU kernel works with: element loads and stores
 * across dtypes, bulk conversions and copies, strided iteration,
 * broadcasting, scratch memory, the thread pool and the matrix multiply.
 * Kernels see plain tensors (tensor_impl.h); they know neither the tape nor
 * autocast (tensor/dispatch.h runs them). */
#ifndef EMBER_KERNEL_IMPL_H
#define EMBER_KERNEL_IMPL_H

#include "tensor_impl.h"

/* ---- element access ------------------------------------------------------- */
double ld(em_dtype dt, const void *p);
void st(em_dtype dt, void *p, double v);
/* Converts n contiguous elements between dtypes. */
void convert_n(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n);
/* convert_n split over the pool when n is large. */
void convert_par(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n);
/* Zeroes `bytes` bytes at dst, split over the pool when large. */
void zero_par(void *dst, size_t bytes);
/* dst[i] += src[i] for n contiguous elements, split over the pool when large:
 * dst f32 or f64, src any float dtype no wider than dst (so the conversion
 * is exact and the sum is rounded once). */
void add_par(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n);
/* Fills n contiguous elements of dtype dt with v. */
void fill_n(em_dtype dt, void *dst, double v, int64_t n);
/* Copies src into dst elementwise with dtype conversion; shapes must already
 * match (src may have stride-0 dims). Both on one device: on CUDA the copy
 * is queued and a launch error is left as the thread's last error. */
void copy_strided(tensor *dst, const tensor *src);
#if EM_HAVE_CUDA
/* w over t's shape with the strides of ops[0..nops) */
void cu_walk_of(cu_walk *w, const tensor *t, int nops, const tensor *const *ops);
#endif

/* ---- strided iteration -----------------------------------------------------
 * Walks `numel(shape)` positions in row-major order, tracking an element
 * offset for each of nop operands (each with its own strides, 0 where it
 * broadcasts). Usage:
 *     nditer it; nditer_init(&it, ndim, shape, 2, (const int64_t *[]){sa, sb});
 *     nditer_seek(&it, start);
 *     for (i = start; i < end; i++) { use it.off[0], it.off[1]; nditer_next(&it); }
 */
typedef struct nditer {
    int ndim, nop;
    int64_t shape[EM_MAX_DIMS];
    int64_t stride[4][EM_MAX_DIMS];
    int64_t idx[EM_MAX_DIMS];
    int64_t off[4];
} nditer;
void nditer_init(nditer *it, int ndim, const int64_t *shape, int nop, const int64_t *const *strides);
void nditer_seek(nditer *it, int64_t linear);
static inline void nditer_next(nditer *it)
{
    for (int d = it->ndim - 1; d >= 0; d--) {
        for (int k = 0; k < it->nop; k++) it->off[k] += it->stride[k][d];
        if (++it->idx[d] < it->shape[d]) return;
        for (int k = 0; k < it->nop; k++) it->off[k] -= it->stride[k][d] * it->shape[d];
        it->idx[d] = 0;
    }
}

/* ---- broadcasting ----------------------------------------------------------
 * The broadcast shape of a and b into (ndim, shape); EM_ERR_SHAPE naming op
 * and both shapes when they do not fit. */
em_status bcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb, int *ndim,
                      int64_t *shape);
/* t's strides seen from an output of (ndim, shape): stride 0 where t
 * broadcasts (t must broadcast to it). */
void bcast_strides(const tensor *t, int ndim, const int64_t *shape, int64_t *stride);

/* ---- temp arena: scratch memory inside one op -----------------------------
 * Stack discipline: m = tmp_mark(); p = tmp_alloc(n); ...; tmp_release(m).
 * 64-byte aligned. NULL + EM_ERR_OOM on failure. */
size_t tmp_mark(void);
void *tmp_alloc(size_t nbytes);
void tmp_release(size_t mark);

/* ---- thread pool ------------------------------------------------------------
 * Runs fn(ctx, lo, hi) over [0, n) split into contiguous ranges of at least
 * `grain` items, on the pool's threads and the caller's. Returns when all are
 * done. Nested calls run serially. */
typedef void (*range_fn)(void *ctx, int64_t lo, int64_t hi);
void parallel_for(int64_t n, int64_t grain, range_fn fn, void *ctx);

/* ---- matrix multiply (tensor/gemm.c) ----------------------------------------
 * C (M,N) = alpha op(A) @ op(B) + beta C, row-major, f32 or f64; op(X) is X
 * or its transpose (ta/tb); lda/ldb/ldc are the row strides of A, B, C as
 * stored. Split over ember's pool; OpenBLAS runs single-threaded inside.
 * dt = EM_BF16: A and B are bf16 and C is f32, alpha 1 and beta 0 only, and
 * only when gemm_bf16_fast() (AMX, tensor/gemm_bf16.c). */
void em_gemm(em_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
             int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
/* C (M,N) bf16 = op(A) @ op(B) on bf16 A and B, accumulated in f32 and
 * rounded once to bf16 (the same bits as em_gemm(EM_BF16) then a conversion);
 * only when gemm_bf16_fast(). */
void em_gemm_bf16_out(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, void *C, int64_t ldc);
/* Whether bf16 products run natively here (AMX tiles usable by this process). */
bool gemm_bf16_fast(void);
/* EMBER_NO_AMX (a boolean: true turns AMX off) is valid: EM_OK, or EM_ERR_ARG
 * naming the variable and its value. */
em_status gemm_bf16_setting(void);
/* One thread's C (m,n) = op(A) @ op(B) on bf16 operands, C f32 or (c_bf16)
 * bf16; false (nothing written) when !gemm_bf16_fast() or out of memory. */
bool gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t K, const uint16_t *A, int64_t lda, const uint16_t *B,
               int64_t ldb, void *C, bool c_bf16, int64_t ldc);

/* Whether every value of dtype `from` is exactly a value of float dtype `to`
 * (f16/bf16 -> f32 -> f64, and any dtype to itself). tensor/dtype.c */
bool widens_exactly(em_dtype from, em_dtype to);
/* Sums g (which broadcasts from (ndim, shape)) back down to (ndim, shape):
 * the gradient of a broadcast. g itself when the shapes agree. */
tensor *t_sum_to(tensor *g, int ndim, const int64_t *shape);

#endif
