/* cuda_optim.h — the CUDA kernels of optim/ and amp/ (optim/optim.cu), as the
 * C code sees them: fused optimizer updates, the norm and scaling of
 * gradient clipping, and the loss scaler's unscale + inf check.
 *
 * Built only with CUDA (the callers guard with `#if EM_HAVE_CUDA`). The
 * conventions are tensor/cuda_impl.h's: `dev` is made current, work is
 * queued on dev's compute stream, pointers are device pointers to n
 * contiguous elements, and the return is EM_OK or an error naming the op. */
#ifndef EMBER_CUDA_OPTIM_H
#define EMBER_CUDA_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "ember/tensor.h"
#include "update_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One update u (computed on the host exactly as for a CPU parameter) of n
 * parameters p (dtype pdt: f32, f64, f16 or bf16) with gradients g (dtype
 * gdt, same n) and state s[0..2] of dtype sdt (f64 for f64 parameters, else
 * f32): SGD s[0] = momentum buffer (NULL without momentum); Adam/AdamW s[0]
 * = m, s[1] = v, s[2] = vmax (amsgrad; else NULL). f16/bf16 parameters
 * compute in f32 and round once on store. The arithmetic is the CPU's:
 * optim/update_math.h. */
em_status cu_optim_update(int dev, const opt_coef *u, em_dtype pdt, void *p, em_dtype gdt, const void *g,
                          em_dtype sdt, void *const *s, int64_t n);

/* *out (a device double) = the p-norm's accumulation over n elements x of
 * float dtype dt, in double, in a fixed order (the same bits every run):
 * p = 2 the sum of x^2, p = 1 the sum of |x|, p = inf the max of |x|,
 * another p the sum of |x|^p (gradient clipping: grad_norm_acc). */
em_status cu_norm_acc(int dev, em_dtype dt, const void *x, int64_t n, double p, double *out);

/* x[i] *= c over n elements (f32: c rounded to f32 first, as the CPU). */
em_status cu_scale(int dev, em_dtype dt, void *x, int64_t n, double c);

/* x[i] *= inv (f32/f16/bf16 through f32, as amp/scaler.c); *found (a device
 * int) := 1 when any result is inf or NaN (never reset here). */
em_status cu_unscale(int dev, em_dtype dt, void *x, int64_t n, double inv, int *found);

#ifdef __cplusplus
}
#endif
#endif
