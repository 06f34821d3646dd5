/* elementwise_math.h — the per-element maths of the elementwise ops, once,
 * for both backends: the CPU kernels (ops_unary.c, ops_binary.c,
 * ops_compare.c) and the CUDA kernels (ops_elementwise.cu) include this.
 *
 * The formulas themselves are in elementwise_formulas.h, written once over
 * a number type and a few primitive functions; this header instantiates
 * them per flavour, and a function's suffix names its flavour:
 *
 *   _f64   double, with libm's exp, tanh, erfc: f64 tensors on every backend.
 *   _f32   float, with expf, tanhf, erfcf (on a GPU: CUDA's maths library):
 *          the exact float formulas. The CUDA kernels use them for f32,
 *          f16 and bf16 tensors.
 *   _f32v  float, with the vectorisable approximations of vmath_impl.h
 *          (vexpf, vtanhf, vsigmoidf, vnormalf): the CPU's f32, f16 and bf16
 *          tensors, whose fast loops need them to vectorise. C only.
 *          tests/test_unary.c holds every _f32v function to its _f32 twin
 *          over a wide range of inputs within stated tolerances.
 *
 * Everything else in a formula (the order of the operations, the constants,
 * pow/log/sqrt) is the same text in every flavour. Integer tensors (abs,
 * the arithmetic) compute in _f64, as the loads widen them to double.
 *
 * EM_HD (hd.h) marks a function for both sides of a CUDA build. */
#ifndef EMBER_ELEMENTWISE_MATH_H
#define EMBER_ELEMENTWISE_MATH_H

#include <math.h>
#include <stdbool.h>

#include "hd.h"
#include "ops.h"
#ifndef __cplusplus
#include "vmath_impl.h"
#endif

#define EW_GELU_K 0.7978845608028654       /* sqrt(2/pi) */
#define EW_GELU_C 0.044715                 /* gelu_tanh's cubic coefficient */
#define EW_INV_SQRT2 0.7071067811865476    /* 1/sqrt(2) */
#define EW_INV_SQRT_2PI 0.3989422804014327 /* 1/sqrt(2 pi) */

/* ---- the primitives of the exact flavours ---------------------------------------------- */

/* sigmoid(x) = 1/(1+e^-x), written so that exp never overflows */
static EM_HD inline double ew_sigmoid_f64(double x)
{
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static EM_HD inline float ew_sigmoid_f32(float x)
{
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* Phi(x) = P(N(0,1) <= x) = erfc(-x/sqrt 2)/2, and its density phi(x) into
 * *pdf. erfc, not 1 + erf, so that the negative tail keeps its relative
 * accuracy. */
static EM_HD inline double ew_normal_f64(double x, double *pdf)
{
    *pdf = EW_INV_SQRT_2PI * exp(-0.5 * x * x);
    return 0.5 * erfc(-x * EW_INV_SQRT2);
}

static EM_HD inline float ew_normal_f32(float x, float *pdf)
{
    *pdf = (float)EW_INV_SQRT_2PI * expf(-0.5f * x * x);
    return 0.5f * erfcf(-x * (float)EW_INV_SQRT2);
}

/* a*b, then + c, each rounded on its own. In GPU code (nvcc's device pass,
 * or a .cu built as C++ for the emulator, whose _rn functions keep the
 * optimiser from fusing) that is what __fmul_rn/__fadd_rn promise; plain C
 * lets the compiler fuse the two into one FMA (gnu11 contracts, and
 * -march=native has FMA), a difference of one rounding that the
 * CPU-vs-CUDA tests allow. */
#if defined(__CUDA_ARCH__) || (defined(__cplusplus) && !defined(__CUDACC__))
#define EW_MUL_ADD_F32(a, b, c) __fadd_rn(__fmul_rn(a, b), c)
#define EW_MUL_ADD_F64(a, b, c) __dadd_rn(__dmul_rn(a, b), c)
#else
#define EW_MUL_ADD_F32(a, b, c) ((a) * (b) + (c))
#define EW_MUL_ADD_F64(a, b, c) ((a) * (b) + (c))
#endif

/* ---- the flavours ----------------------------------------------------------------------- */

#define EW_T double
#define EW_FN(name) name##_f64
#define EW_EXP exp
#define EW_TANH tanh
#define EW_NORMAL ew_normal_f64
#define EW_SIGMOID ew_sigmoid_f64
#define EW_POW pow
#define EW_LOG log
#define EW_SQRT sqrt
#define EW_ABS fabs
#define EW_MUL_ADD EW_MUL_ADD_F64
#include "elementwise_formulas.h"

#define EW_T float
#define EW_FN(name) name##_f32
#define EW_EXP expf
#define EW_TANH tanhf
#define EW_NORMAL ew_normal_f32
#define EW_SIGMOID ew_sigmoid_f32
#define EW_POW powf
#define EW_LOG logf
#define EW_SQRT sqrtf
#define EW_ABS fabsf
#define EW_MUL_ADD EW_MUL_ADD_F32
#include "elementwise_formulas.h"

#ifndef __cplusplus
#define EW_T float
#define EW_FN(name) name##_f32v
#define EW_EXP vexpf
#define EW_TANH vtanhf
#define EW_NORMAL vnormalf
#define EW_SIGMOID vsigmoidf
#define EW_POW powf
#define EW_LOG logf
#define EW_SQRT sqrtf
#define EW_ABS fabsf
#define EW_MUL_ADD EW_MUL_ADD_F32
#include "elementwise_formulas.h"
#endif

/* Whether unary op k has a slope formula of its own (ew_gelu_both: gelu,
 * gelu_tanh), as costly as the op itself: the CPU's recorded forward keeps
 * it for backward (tensor/ops_unary.c). */
static EM_HD inline bool ew_slope_kept(unop k) { return k == UN_GELU || k == UN_GELU_TANH; }

/* ---- comparisons ------------------------------------------------------------------------ */

/* x <op> y. NaN compares unequal to everything, as IEEE says. Every dtype
 * widens to double exactly, so one function serves them all. */
static EM_HD inline bool ew_compare(cmpop k, double x, double y)
{
    switch (k) {
    case CMP_EQ: return x == y;
    case CMP_NE: return x != y;
    case CMP_LT: return x < y;
    case CMP_LE: return x <= y;
    case CMP_GT: return x > y;
    case CMP_GE: return x >= y;
    }
    return false; /* not reached: every op has its case */
}

#endif
