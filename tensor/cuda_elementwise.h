/* cuda_elementwise.h — the CUDA kernels of the elementwise, compare and
 * reduction families (tensor/ops_elementwise.cu), as ops_binary.c,
 * ops_unary.c, ops_compare.c and ops_reduce.c call them.
 *
 * Conventions are cuda_impl.h's: `dev` is the device index, work is queued
 * on its compute stream, pointers are device pointers to element 0, strides
 * are in elements, and the return is EM_OK or an EM_ERR_DEVICE error naming
 * the op. Every walk has operand 0 = the output. The arithmetic follows the
 * CPU kernels' (f32 in float, f16/bf16 through float or double as the CPU
 * does, f64 in double) and stores round as the CPU's st() does. */
#ifndef EMBER_CUDA_ELEMENTWISE_H
#define EMBER_CUDA_ELEMENTWISE_H

#include "cuda_impl.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op codes are the sub-enums of the op list (tensor/ops.h): binop,
 * cmpop, unop, redop; each function names its op by the list's name in
 * errors. The per-element maths is tensor/elementwise_formulas.h, the CPU
 * kernels' own (the _f32 / _f64 flavours: exact expf/tanhf/erfcf where the
 * CPU uses its vectorisable approximations). */

/* out = a <op> b over w (operands: 0 out, 1 a, 2 b; broadcasting by stride
 * 0); a, b and out have dtype dt. */
em_status cu_binary(int dev, binop op, const cu_walk *w, em_dtype dt, void *out, const void *a,
                    const void *b);

/* out = a <op> b as EM_BOOL over w (operands as cu_binary's); a and b have
 * dtype dt. */
em_status cu_compare(int dev, cmpop op, const cu_walk *w, em_dtype dt, void *out, const void *a,
                     const void *b);

/* out = f(x) over w (operands: 0 out, 1 x), both of dtype dt; p is
 * pow_scalar's power. */
em_status cu_unary(int dev, unop op, const cu_walk *w, em_dtype dt, void *out, const void *x, double p);

/* out = x*m + s over w (operands: 0 out, 1 x), both of dtype dt: the
 * AFFINE ops (add_scalar, mul_scalar, neg); op names it in errors. */
em_status cu_affine(int dev, op_id op, const cu_walk *w, em_dtype dt, void *out, const void *x, double m,
                    double s);

/* gx = g * f'(x, y) over w (operands: 0 gx, 1 x, 2 g). gx and y (the
 * forward's output) are contiguous of x's shape and dtype dt; g has dtype
 * gdt. p is pow_scalar's power. */
em_status cu_unary_backward(int dev, unop op, const cu_walk *w, em_dtype dt, void *gx, const void *x,
                            const void *y, em_dtype gdt, const void *g, double p);

/* Where (cond != 0) == keep: out = x, or `fill` when x is NULL; elsewhere
 * out is left as it was. w's operands: 0 out, 1 cond (EM_BOOL), 2 x (dtype
 * dt, out's dtype). */
em_status cu_select(int dev, const cu_walk *w, em_dtype dt, void *out, const void *cond, const void *x,
                    bool keep, double fill);

/* out[k] = reduction over the positions of rw of the input, for each
 * position k of kw. kw: operand 0 the output's strides, operand 1 the
 * input's over the kept dims; rw: operand 1 the input's over the reduced
 * dims (rw's numel > 0 except for sums). op: RED_SUM or RED_MEAN (both the
 * sum times `scale`), RED_MAX, RED_MIN, RED_ARGMAX. Sums accumulate in double and are
 * scaled by `scale` (mean) before the one rounding into out_dt; max/min
 * propagate NaN and argmax keeps the first of ties and writes EM_I32. The
 * order of the additions depends only on the shapes: results repeat. */
em_status cu_reduce(int dev, redop op, const cu_walk *kw, const cu_walk *rw, em_dtype in_dt, const void *in,
                    em_dtype out_dt, void *out, double scale);

/* Backward of max/min: for each kept position k, count the inputs equal to
 * y[k] and give each g[k]/count, the rest 0. kw: operands 0 g, 1 x, 2 gx
 * over the kept dims; rw: operands 1 x, 2 gx over the reduced dims. y is
 * contiguous over the kept positions, of dtype ydt; gx has x's dtype xdt. */
em_status cu_extreme_backward(int dev, const cu_walk *kw, const cu_walk *rw, em_dtype xdt, const void *x,
                              em_dtype ydt, const void *y, em_dtype gdt, const void *g, void *gx);

#ifdef __cplusplus
}
#endif
#endif
