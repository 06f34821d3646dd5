/* update_math.h — the optimizers' per-element updates (SGD with momentum and
 * Nesterov, Adam, AdamW), written once for the CPU (optim/optim.c's update
 * loops) and CUDA devices (optim/optim.cu's fused kernel), so a parameter
 * on a device takes the CPU's step in the CPU's arithmetic.
 *
 * A step's coefficients are computed on the host in double (opt_coef, as
 * torch computes its Python-float scalars); an f32 update rounds each one to
 * f32 once (opt_k_f32), an f64 update keeps them (opt_k_f64). Then per
 * element, in that compute type (g negated first under maximize):
 *   SGD:   d = g + wd p;  b = first ? d : mom b + (1-damp) d;
 *          p -= lr (nesterov ? d + mom b : b)      (no momentum buffer: p -= lr d)
 *   Adam:  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *          amsgrad: vmax = max(vmax, v), used for v below;
 *          p -= step_size m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *          with g += wd p first (Adam with weight decay) or p *= 1 - lr wd (AdamW).
 * The f32 and f64 functions are one text, update_math_t.h, included once per
 * compute type: opt_k_f32 / opt_k_of_f32 / sgd_elem_f32 / adam_elem_f32 and
 * the same names ending in _f64.
 *
 * And gradient clipping's norm of any order (optim/optim_state.c, dist/zero.c
 * and optim.cu: norm_acc, norm_join, norm_root), and the scaling of
 * gradients that clipping and the loss scaler's unscale (amp/scaler.c)
 * apply, on the CPU and on a device (optim.cu): grad_scale_elem. */
#ifndef EMBER_UPDATE_MATH_H
#define EMBER_UPDATE_MATH_H

#include <math.h>
#include <stdbool.h>

#include "tensor/dtype_math.h"
#include "tensor/hd.h"

/* One parameter's step, as the host computes it. */
typedef struct opt_coef {
    bool sgd;             /* SGD; else Adam (l2) or AdamW (decoupled) */
    bool l2, decoupled;   /* Adam with weight decay: g += wd p;  AdamW: p *= decay */
    bool nesterov, first; /* SGD: Nesterov momentum; the momentum buffer's first step */
    bool maximize;        /* all: step along +g (the gradient negated first) */
    bool amsgrad;         /* Adam/AdamW: divide by the running maximum of v (a third state array) */
    double lr, wd;        /* all */
    double mom, damp;     /* SGD: momentum, dampening */
    double b1, b2, eps;   /* Adam/AdamW */
    double step_size;     /* lr / (1 - b1^t) at the parameter's step t */
    double bc2_sqrt;      /* sqrt(1 - b2^t) */
    double decay;         /* AdamW: 1 - lr wd */
} opt_coef;

#define UM_T float
#define UM_K opt_k_f32
#define UM_SQRT sqrtf
#define UM_(name) name##_f32
#include "update_math_t.h"
#undef UM_T
#undef UM_K
#undef UM_SQRT
#undef UM_

#define UM_T double
#define UM_K opt_k_f64
#define UM_SQRT sqrt
#define UM_(name) name##_f64
#include "update_math_t.h"
#undef UM_T
#undef UM_K
#undef UM_SQRT
#undef UM_

/* Gradient clipping's norm of order p (> 0, or inf), accumulated in
 * double element by element: acc starts at 0, takes every element x with
 * norm_acc, two partial accumulations combine with norm_join, and
 * norm_root gives the norm. p = 2: sum x^2, sqrt; p = 1: sum |x|; p = inf:
 * max |x| (a NaN sticks, as in torch); another p: sum |x|^p, then ^(1/p). */
static inline EM_HD double norm_acc(double acc, double x, double p)
{
    double a = fabs(x);
    if (p == 2) return acc + x * x;
    if (p == 1) return acc + a;
    if (isinf(p)) return a > acc || a != a ? a : acc;
    return acc + pow(a, p);
}

static inline EM_HD double norm_join(double a, double b, double p)
{
    if (isinf(p)) return b > a || b != b ? b : a;
    return a + b;
}

static inline EM_HD double norm_root(double acc, double p)
{
    if (p == 2) return sqrt(acc);
    if (p == 1 || isinf(p)) return acc;
    return pow(acc, 1.0 / p);
}

/* x[i] *= c for a gradient of float dtype dt: an f64 gradient multiplies by
 * c, every other dtype in f32 by c rounded to f32 (as torch), rounded into
 * dt on store. Whether that f32 (f64) product is finite. */
static inline EM_HD bool grad_scale_elem(em_dtype dt, void *x, int64_t i, double c)
{
    if (dt == EM_F64) {
        double v = ((double *)x)[i] * c;
        ((double *)x)[i] = v;
        return isfinite(v);
    }
    float v = (dt == EM_F32 ? ((float *)x)[i] : (float)elem_load(dt, x, i)) * (float)c;
    if (dt == EM_F32)
        ((float *)x)[i] = v;
    else
        elem_store(dt, x, i, v);
    return isfinite(v);
}

#endif
