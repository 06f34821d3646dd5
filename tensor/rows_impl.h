/* rows_impl.h — a tensor seen as contiguous rows along one dim, for the
 * row-wise kernels (softmax, log_softmax, layer_norm, rms_norm,
 * cross_entropy). Implemented in ops_softmax.c. Kernels compute in
 * rows_dtype (f64 for f64, f32 for everything else). Buffers come from the
 * temp arena: the caller brackets use with tmp_mark / tmp_release. */
#ifndef EMBER_ROWS_IMPL_H
#define EMBER_ROWS_IMPL_H

#include "tensor_impl.h"

/* The dtype a row kernel computes in for tensors of dtype dt. */
em_dtype rows_dtype(em_dtype dt);
/* t's values with dim d moved last, contiguous, in rows_dtype: t's own data
 * when it already is that, else a copy in the temp arena. NULL on OOM. */
const void *rows_in(tensor *t, int d);
/* Where a kernel writes out's values in that layout: out's own data when it
 * fits, else a temp-arena buffer that rows_done copies back into out. */
void *rows_out(tensor *out, int d);
void rows_done(tensor *out, int d, void *p);
/* max of x[0..n) (f32). */
float rows_max_f32(const float *x, int64_t n);
/* y[i] = exp(x[i] - shift) (y may be NULL); returns the sum in double. */
double rows_expsum_f32(const float *x, float shift, float *y, int64_t n);

#endif
