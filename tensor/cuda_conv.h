/* cuda_conv.h — the CUDA kernels of 2-D convolution and pooling
 * (tensor/ops_conv.cu), as tensor/ops_conv.c calls them. Built only with
 * CUDA.
 *
 * conv2d on the device is the CPU's plan with every image at once: im2col
 * lays the whole batch out as one column matrix col (C*KH*KW, N*OH*OW), one
 * cuBLAS product with the (O, C*KH*KW) weight gives (O, N*OH*OW), and the
 * backward is two more products (dW, dcol) and col2im. Pooling is direct:
 * one thread per output (forward) or per input element (backward).
 *
 * Conventions are cuda_impl.h's: `dev` is made current, work is queued on
 * its compute stream, pointers are device pointers to element 0 of
 * contiguous buffers, and the return is EM_OK or an EM_ERR_DEVICE error
 * naming the op. Every kernel here writes each element of its output from
 * one thread, in a fixed order: no atomics, results repeat bit for bit and
 * follow the CPU's order of additions (tensor/ops_conv.c). */
#ifndef EMBER_CUDA_CONV_H
#define EMBER_CUDA_CONV_H

#include "cuda_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Input (N,C,H,W), kernel (KH,KW), stride s, padding p, output (OH,OW);
 * O is conv2d's output channels (pooling: unused). */
typedef struct cu_conv_geom {
    int64_t N, C, H, W, O, KH, KW, OH, OW, s, p;
} cu_conv_geom;

/* col (C*KH*KW, N*OH*OW) of dtype ct (f32 or f64) from x (N,C,H,W) of any
 * float dtype xdt: col[(c*KH+kh)*KW+kw, (n*OH+oh)*OW+ow] = x[n,c,oh*s-p+kh,
 * ow*s-p+kw], 0 where that falls in the padding. */
em_status cu_im2col(int dev, const cu_conv_geom *g, em_dtype xdt, const void *x, em_dtype ct, void *col);

/* dx (N,C,H,W) of dtype xdt = the columns dcol (layout as cu_im2col's, dtype
 * ct) summed back onto the image: each element adds, in ct, its (kh,kw)
 * contributions in ascending order (the CPU's order), and is written once. */
em_status cu_col2im(int dev, const cu_conv_geom *g, em_dtype ct, const void *dcol, em_dtype xdt, void *dx);

/* y (N,C,OH,OW) = max or mean over each KHxKW window of x (N,C,H,W), both of
 * dtype dt; padding counts as -inf for max and 0 for the mean (divided by
 * KH*KW). Max keeps the first largest, a NaN wins; arg (N,C,OH,OW), may be
 * NULL, receives the chosen element's h*W + w. Sums are in f64, stored as
 * the CPU stores them (through f32 unless dt is f64). */
em_status cu_pool_fwd(int dev, bool is_max, const cu_conv_geom *g, em_dtype dt, const void *x, void *y,
                      int32_t *arg);

/* dx (N,C,H,W) of dtype dt from gy (N,C,OH,OW) of dtype gdt: max gives each
 * input the sum of the gradients of the windows whose arg chose it; avg
 * gives each input the sum of gy / (KH*KW) over the windows covering it.
 * Summed in f32 (f64 for dt f64), windows in ascending order. */
em_status cu_pool_bwd(int dev, bool is_max, const cu_conv_geom *g, em_dtype gdt, const void *gy,
                      const int32_t *arg, em_dtype dt, void *dx);

#ifdef __cplusplus
}
#endif
#endif
