/* dropout_math.h — dropout's per-element rules, written once for the CPU
 * (tensor/ops_dropout.c) and CUDA devices (tensor/ops_nn.cu), so a device
 * gives the CPU's mask and values bit for bit.
 *
 * Element i (row-major) uses word i%4 of Philox(seed, offset + i/4)
 * (tensor/philox.h) and is kept when that word's uniform number is >= p;
 * a kept value is scaled by scale = 1/(1-p). */
#ifndef EMBER_DROPOUT_MATH_H
#define EMBER_DROPOUT_MATH_H

#include <stdbool.h>
#include <stdint.h>

#include "dtype_math.h"
#include "hd.h"
#include "philox.h"

static inline EM_HD bool dropout_keeps(uint32_t word, double p) { return philox_u01(word) >= p; }

/* out[oi] = keep ? x[xi] * scale : 0 in x's float dtype dt: f32 multiplies
 * by scale rounded to f32, f64 by scale, f16/bf16 (exact in double) by the
 * f32 scale, rounded once on store. */
static inline EM_HD void dropout_forward_elem(em_dtype dt, const void *x, int64_t xi, void *out, int64_t oi,
                                              bool keep, double scale)
{
    float sf = (float)scale;
    if (dt == EM_F32)
        ((float *)out)[oi] = keep ? ((const float *)x)[xi] * sf : 0.0f;
    else if (dt == EM_F64)
        ((double *)out)[oi] = keep ? ((const double *)x)[xi] * scale : 0.0;
    else
        elem_store(dt, out, oi, keep ? elem_load(dt, x, xi) * (double)sf : 0.0);
}

/* dx[i] = keep ? g[gi] * scale : 0: f32 by scale rounded to f32, other
 * dtypes in double by scale itself, rounded once on store. */
static inline EM_HD void dropout_backward_elem(em_dtype dt, const void *g, int64_t gi, void *dx, int64_t i,
                                               bool keep, double scale)
{
    if (dt == EM_F32)
        ((float *)dx)[i] = keep ? ((const float *)g)[gi] * (float)scale : 0.0f;
    else
        elem_store(dt, dx, i, keep ? elem_load(dt, g, gi) * scale : 0.0);
}

#endif
