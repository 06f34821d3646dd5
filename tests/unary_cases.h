/* unary_cases.h — the unary ops' test table (the DEF_UNARY lines of
 * tensor/ops.def), shared by tests/test_unary.c (reference values,
 * gradients by finite differences, f32 against f64, non-contiguous inputs)
 * and tests/test_cuda_ops.c (CPU against CUDA in every float dtype). Adding
 * a unary op adds its row here; a test fails while a unary op of the list
 * has none.
 *
 * Reference values are double precision from an independent implementation
 * (Python's math module: exp, log, sqrt, tanh, erf, x ** p; sigmoid as
 * 1/(1+exp(-x)), gelu as 0.5x(1+erf(x/sqrt 2)), gelu_tanh with
 * sqrt(2/pi)(x+0.044715x^3)) at the inputs below: UC_REAL for ops defined
 * everywhere, UC_POS for those that need x > 0. */
#ifndef EMBER_TEST_UNARY_CASES_H
#define EMBER_TEST_UNARY_CASES_H

#include <stdbool.h>

#include "ember/tensor.h"

typedef enum { UC_REAL, UC_POS } uc_domain;

static const double uc_real_in[8] = {-3.0, -1.5, -0.5, -0.1, 0.2, 0.7, 1.3, 2.5};
static const double uc_pos_in[6] = {0.1, 0.5, 1.0, 2.0, 3.7, 10.0};

typedef struct unary_case {
    const char *op;                 /* its name in the op list */
    em_tensor *(*fn)(em_tensor *a); /* NULL: em_pow_scalar(a, p) */
    double p;
    uc_domain domain;
    double want[8]; /* op(uc_real_in) or op(uc_pos_in) (the first 6) */
} unary_case;

/* clang-format off */
static const unary_case unary_cases[] = {
    {"exp", em_exp, 0, UC_REAL,
     {0.049787068367863944, 0.22313016014842982, 0.6065306597126334, 0.9048374180359595, 1.2214027581601699,
      2.0137527074704766, 3.6692966676192444, 12.182493960703473}},
    {"log", em_log, 0, UC_POS,
     {-2.3025850929940455, -0.6931471805599453, 0.0, 0.6931471805599453, 1.308332819650179, 2.302585092994046}},
    {"sqrt", em_sqrt, 0, UC_POS,
     {0.31622776601683794, 0.7071067811865476, 1.0, 1.4142135623730951, 1.9235384061671346, 3.1622776601683795}},
    {"rsqrt", em_rsqrt, 0, UC_POS,
     {3.162277660168379, 1.414213562373095, 1.0, 0.7071067811865475, 0.5198752449100363, 0.31622776601683794}},
    {"abs", em_abs, 0, UC_REAL,
     {3.0, 1.5, 0.5, 0.1, 0.2, 0.7, 1.3, 2.5}},
    {"tanh", em_tanh, 0, UC_REAL,
     {-0.9950547536867305, -0.9051482536448664, -0.46211715726000974, -0.09966799462495582, 0.197375320224904,
      0.6043677771171636, 0.8617231593133063, 0.9866142981514303}},
    {"sigmoid", em_sigmoid, 0, UC_REAL,
     {0.04742587317756678, 0.18242552380635635, 0.3775406687981454, 0.47502081252106, 0.549833997312478,
      0.6681877721681662, 0.7858349830425586, 0.9241418199787566}},
    {"relu", em_relu, 0, UC_REAL,
     {0.0, 0.0, 0.0, 0.0, 0.2, 0.7, 1.3, 2.5}},
    {"gelu", em_gelu, 0, UC_REAL,
     {-0.00404969409489031, -0.10021080190328713, -0.15426876936299344, -0.0460172162722971, 0.11585194188782061,
      0.5306254434438489, 1.1741593700387067, 2.4844758366855597}},
    {"gelu_tanh", em_gelu_tanh, 0, UC_REAL,
     {-0.0036373920817729943, -0.10042842301976707, -0.15428599017485606, -0.04601724895456484, 0.11585142978210627,
      0.5305701347051167, 1.1739290123173094, 2.484915733910001}},
    {"silu", em_silu, 0, UC_REAL,
     {-0.14227761953270035, -0.2736382857095345, -0.1887703343990727, -0.047502081252106004, 0.1099667994624956,
      0.46773144051771626, 1.0215854779553262, 2.3103545499468914}},
    {"pow_scalar", NULL, 3.0, UC_REAL,
     {-27.0, -3.375, -0.125, -0.0010000000000000002, 0.008000000000000002, 0.3429999999999999, 2.197, 15.625}},
    {"pow_scalar", NULL, 2.5, UC_POS,
     {0.00316227766016838, 0.1767766952966369, 1.0, 5.656854249492381, 26.333240780428074, 316.22776601683796}},
    {"pow_scalar", NULL, -1.5, UC_POS,
     {31.62277660168379, 2.8284271247461903, 1.0, 0.3535533905932738, 0.14050682294865846, 0.03162277660168379}},
};
/* clang-format on */
enum { N_UNARY_CASES = sizeof unary_cases / sizeof unary_cases[0] };

/* op(x) for case u */
static inline em_tensor *uc_apply(const unary_case *u, em_tensor *x)
{
    return u->fn ? u->fn(x) : em_pow_scalar(x, u->p);
}

#endif
