/* cuda_nn.h — the CUDA kernels of the neural-network ops (tensor/ops_nn.cu):
 * softmax / log_softmax, cross-entropy, layer_norm / rms_norm, index
 * gather / index-add (embedding, index_select), scatter_add and gather
 * along a dim, and dropout, with their
 * backwards; plus the C helpers the ops use to lay a CUDA tensor out as
 * contiguous rows (implemented in tensor/ops_softmax.c).
 *
 * Conventions are those of cuda_impl.h: `dev` is the device index, work is
 * queued on its compute stream, pointers are device pointers to element 0 of
 * contiguous buffers, and the return value is EM_OK or an EM_ERR_DEVICE
 * error naming the op. Float operands may be f32, f64, f16 or bf16: 16-bit
 * values are computed in f32 and rounded once when stored, as on the CPU.
 * Only in builds with EM_HAVE_CUDA. */
#ifndef EMBER_CUDA_NN_H
#define EMBER_CUDA_NN_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_impl.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- rows of a CUDA tensor (tensor/ops_softmax.c) --------------------------------- */
struct tensor;
/* t (on a CUDA device) with dim d moved last, contiguous, in t's dtype: t
 * itself when it already is that, else a new tensor on t's device (the
 * caller t_drop's it when it is not t). NULL + error on failure. */
struct tensor *nn_rows(struct tensor *t, int d);
/* Where a kernel writes out's values in that layout: out itself when it is
 * already so, else a new uninitialised tensor for nn_rows_done. */
struct tensor *nn_rows_out(struct tensor *out, int d);
/* Puts the rows r (from nn_rows' layout) back into out with dim d in its
 * place, and drops r; nothing when r is out. */
void nn_rows_done(struct tensor *out, int d, struct tensor *r);

/* ---- softmax (rows, n): y = softmax(x) or log_softmax(x) along n ----------------- */
em_status cu_softmax_fwd(int dev, em_dtype dt, const void *x, void *y, int64_t rows, int64_t n, bool log);
/* softmax: dx = y * (g - sum(g*y));  log_softmax: dx = g - exp(y) * sum(g) */
em_status cu_softmax_bwd(int dev, em_dtype dt, const void *y, const void *g, void *dx, int64_t rows,
                         int64_t n, bool log);

/* ---- cross-entropy: logits x (rows, C) of dtype dt, targets tgt (rows) i32 --------
 * w: (C) class weights of dtype wdt, or NULL; eps the label smoothing; the
 * per-row maths is tensor/ce_math.h's. stats (f64, 4*rows + 1) receives per
 * row: [0,rows) the max, [rows,2rows) the log-sum-exp, [2rows,3rows) the
 * loss (0 for an ignored row), [3rows,4rows) the gradient's s, and at
 * [4rows] the mean's denominator (the sum of w_t over the rows not
 * ignored). out: reduction none, (rows) the losses; else 0-dim, their sum,
 * divided by the denominator for the mean (NaN when every row is
 * ignored); dtype dt. */
em_status cu_cross_entropy_fwd(int dev, em_dtype dt, const void *x, const int32_t *tgt, int64_t rows,
                               int64_t C, int64_t ignore, em_dtype wdt, const void *w, double eps,
                               em_reduction red, double *stats, void *out);
/* dx (rows, C) = a (s softmax(x) - q), 0 for ignored rows (ce_math.h); g is
 * the incoming gradient on the device, dtype gdt: 0-dim, or (rows)
 * contiguous for reduction none; stats as the forward left them. */
em_status cu_cross_entropy_bwd(int dev, em_dtype dt, const void *x, const int32_t *tgt, int64_t rows,
                               int64_t C, int64_t ignore, em_dtype wdt, const void *w, double eps,
                               em_reduction red, const double *stats, em_dtype gdt, const void *g, void *dx);

/* ---- layer_norm / rms_norm over rows (rows, C) -------------------------------------
 * w, b: (C) of dtype dt or NULL. stats (2*rows) of the compute dtype (f64 for
 * f64, else f32): [0,rows) mean (0 for rms), [rows,2rows) rstd. */
em_status cu_norm_fwd(int dev, em_dtype dt, bool rms, const void *x, const void *w, const void *b, void *y,
                      void *stats, int64_t rows, int64_t C, double eps);
/* dx (may be NULL), dw, db ((C), dtype dt, may be NULL) from g (rows, C) of
 * dtype dt. dw/db are summed deterministically: per-chunk partial sums in
 * `part` (compute dtype, 2 * nchunks * C elements, nchunks from
 * cu_norm_chunks), then a fixed-order sum over the chunks. */
em_status cu_norm_bwd(int dev, em_dtype dt, bool rms, const void *x, const void *w, const void *g,
                      const void *stats, void *dx, void *dw, void *db, void *part, int64_t rows, int64_t C);
int64_t cu_norm_chunks(int64_t rows);

/* ---- index gather / add: t (outer, S, inner), out (outer, K, inner), idx (K) -------- */
/* out[o,k,i] = t[o,idx[k],i]; an exact copy of elements of esize bytes */
em_status cu_index_gather(int dev, size_t esize, const void *t, const int32_t *idx, void *out, int64_t outer,
                          int64_t S, int64_t K, int64_t inner);
/* acc[o,idx[k],i] += g[o,k,i]; acc f32 or f64 (act), g any float dtype */
em_status cu_index_add(int dev, em_dtype act, void *acc, em_dtype gdt, const void *g, const int32_t *idx,
                       int64_t outer, int64_t S, int64_t K, int64_t inner);

/* ---- scatter_add / gather along dim d (ops_index.c) ----------------------------------
 * w (cuda_impl.h) walks the positions of index with dim d removed; its
 * operands are 0 out, 1 index (i32), 2 src, each with its own strides over
 * those dims; osd, isd, ssd are their strides along d and L = index's size
 * along d. Indices are in range (the caller checked them). */
/* out[.., index[r,j], ..] += src[r,j] (dim d of out taking the index), out and
 * src of dtype dt (not bool). One thread per position r runs j = 0..L-1 in
 * order, so no two threads meet on an element: no atomics, deterministic,
 * and each element's additions in the CPU's order and arithmetic (f32 in
 * f32, f64 in f64, f16/bf16 rounded after every addition). */
em_status cu_scatter_add(int dev, em_dtype dt, const cu_walk *w, int64_t L, int64_t osd, int64_t isd, int64_t ssd,
                         void *out, const int32_t *index, const void *src);
/* out[r,j] = src[.., index[r,j], ..]: exact copies of esize-byte elements
 * (out has index's shape; the backward of scatter_add for src). */
em_status cu_gather_dim(int dev, size_t esize, const cu_walk *w, int64_t L, int64_t osd, int64_t isd, int64_t ssd,
                        void *out, const int32_t *index, const void *src);

/* ---- dropout over n contiguous elements --------------------------------------------
 * Element i is kept when u_i >= p, u_i from word i%4 of Philox4x32-10(seed,
 * counter offset + i/4) exactly as tensor/rng.c draws it; kept values are
 * scaled as the CPU scales them. mask (n bytes) may be NULL. */
em_status cu_dropout_fwd(int dev, em_dtype dt, const void *x, void *out, uint8_t *mask, int64_t n,
                         uint64_t seed, uint64_t offset, double p, double scale);
/* dx = mask ? g * scale : 0 (g contiguous, dtype dt) */
em_status cu_dropout_bwd(int dev, em_dtype dt, const void *g, const uint8_t *mask, void *dx, int64_t n,
                         double scale);

#ifdef __cplusplus
}
#endif
#endif
