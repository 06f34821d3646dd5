/* test_cuda_elementwise.c — the elementwise, compare and reduction ops on
 * CUDA against the CPU (skip without a device): each op runs on the same
 * inputs on both, and the outputs and the gradients of sum(out * r) must
 * agree, exactly where the arithmetic is the same and within a few ulps of
 * the dtype where the maths functions or the order of a sum differ. Inputs
 * cover every float dtype, broadcasting and non-contiguous views. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"

static const em_dtype float_dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};

static em_tensor *to_cuda(em_tensor *x) { return em_to(x, em_device_cuda(0)); }

/* Relative tolerance per dtype: `f32` for f32, a few ulps for the others. */
static double tol_for(em_dtype dt, double f32)
{
    switch (dt) {
    case EM_F64: return f32 > 0 ? 1e-12 : 0;
    case EM_F16: return f32 > 0 ? 4e-3 : 0;
    case EM_BF16: return f32 > 0 ? 3e-2 : 0;
    default: return f32;
    }
}

/* got (any device) and want (CPU) have one shape and every element within
 * tol * (1 + |want|); NaNs must match. tol 0 asks for equal values. */
static void check_close(const char *file, int line, em_tensor *got, em_tensor *want, double tol)
{
    if (!got || !want) th_fail(file, line, "a result is NULL: %s", em_last_error());
    em_tensor *g = em_to(got, em_device_cpu());
    if (!g) th_fail(file, line, "em_to cpu failed: %s", em_last_error());
    if (em_device_of(got).type != EM_CUDA) th_fail(file, line, "the CUDA result is not on the device");
    int nd = em_ndim(g);
    if (nd != em_ndim(want) || memcmp(em_shape(g), em_shape(want), sizeof(int64_t) * (size_t)nd))
        th_fail(file, line, "shapes differ (ndim %d vs %d)", nd, em_ndim(want));
    if (em_dtype_of(g) != em_dtype_of(want)) th_fail(file, line, "dtypes differ");
    int64_t n = em_numel(g);
    double *x = malloc(sizeof(double) * (size_t)(n ? n : 1)),
           *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_to_array(g, EM_F64, x);
    em_to_array(want, EM_F64, y);
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i] && y[i] != y[i]) continue;
        if (!(fabs(x[i] - y[i]) <= tol * (1 + fabs(y[i])))) {
            double a = x[i], b = y[i];
            free(x);
            free(y);
            th_fail(file, line, "element %lld: cuda %.10g, cpu %.10g (tol %g)", (long long)i, a, b, tol);
        }
    }
    free(x);
    free(y);
}
#define CHECK_CLOSE(got, want, tol) check_close(__FILE__, __LINE__, (got), (want), (tol))

typedef em_tensor *(*opfn)(em_tensor *const *in, const void *arg);

/* Runs f on in[0..nin) (CPU tensors made for this call) on the CPU and on
 * cuda:0; compares the outputs within tol, then (float outputs) the
 * gradients of sum(out * r) for each float input within gtol. */
static void check_op(const char *file, int line, opfn f, const void *arg, int nin, em_tensor *const *in,
                     double tol, double gtol)
{
    em_tensor *cin[4], *gin[4];
    for (int i = 0; i < nin; i++) {
        cin[i] = in[i];
        gin[i] = to_cuda(in[i]);
        if (!gin[i]) th_fail(file, line, "em_to cuda failed: %s", em_last_error());
    }
    bool grads = gtol >= 0;
    for (int i = 0; i < nin && grads; i++)
        if (em_dtype_is_float(em_dtype_of(in[i]))) {
            CHECK_OK(em_set_requires_grad(cin[i], true));
            CHECK_OK(em_set_requires_grad(gin[i], true));
        }
    em_tensor *yc = f(cin, arg), *yg = f(gin, arg);
    check_close(file, line, yg, yc, tol);
    if (!grads || !em_dtype_is_float(em_dtype_of(yc))) return;
    em_rng rng = em_rng_new(77);
    em_tensor *r = em_randn(em_dtype_of(yc), em_ndim(yc), em_shape(yc), &rng);
    CHECK_OK(em_backward(em_sum(em_mul(yc, r), 0, NULL, false), NULL));
    CHECK_OK(em_backward(em_sum(em_mul(yg, to_cuda(r)), 0, NULL, false), NULL));
    for (int i = 0; i < nin; i++)
        if (em_dtype_is_float(em_dtype_of(in[i])))
            check_close(file, line, em_grad(gin[i]), em_grad(cin[i]), gtol);
}
#define CHECK_OP(f, arg, tol, gtol, ...)                                                                     \
    check_op(__FILE__, __LINE__, (f), (arg),                                                                 \
             (int)(sizeof((em_tensor *[]){__VA_ARGS__}) / sizeof(em_tensor *)),                              \
             (em_tensor *[]){__VA_ARGS__}, (tol), (gtol))

/* a standard normal tensor of dtype dt made in f32 (same values on every run) */
static em_tensor *randn(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    return em_contiguous(em_cast(em_randn(EM_F32, ndim, shape, &r), dt));
}

/* |randn| + 0.5: inside the domain of log, sqrt, rsqrt, pow */
static em_tensor *positive(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    return em_contiguous(em_cast(em_add_scalar(em_abs(randn(EM_F32, ndim, shape, seed)), 0.5), dt));
}

/* small whole numbers as dtype dt: ties for compares and max/min */
static em_tensor *whole(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    return em_contiguous(em_cast(em_cast(em_mul_scalar(randn(EM_F32, ndim, shape, seed), 2.0), EM_I32), dt));
}

/* ---- binary ----------------------------------------------------------------------------- */

typedef struct bin_arg {
    em_tensor *(*f)(em_tensor *, em_tensor *);
} bin_arg;

static em_tensor *bin_plain(em_tensor *const *in, const void *arg)
{
    return ((const bin_arg *)arg)->f(in[0], in[1]);
}
/* a (5,4) seen transposed as (4,5), b (4,10) seen with every other column: both non-contiguous */
static em_tensor *bin_views(em_tensor *const *in, const void *arg)
{
    return ((const bin_arg *)arg)->f(em_transpose(in[0], 0, 1), em_slice(in[1], 1, 0, 10, 2));
}

TEST(test_cuda_binary_ops_match_the_cpu_exactly_with_broadcasting)
{
    CUDA_OR_SKIP();
    const bin_arg fns[] = {{em_add}, {em_sub}, {em_mul}, {em_div}};
    for (int d = 0; d < 4; d++) {
        em_dtype dt = float_dts[d];
        for (int k = 0; k < 4; k++) {
            em_scope s = em_scope_begin();
            em_tensor *a = randn(dt, EM_SHAPE(4, 1, 5), 10 + k), *b = positive(dt, EM_SHAPE(3, 5), 20 + k);
            CHECK_OP(bin_plain, &fns[k], 0, tol_for(dt, 1e-5), a, b);
            em_tensor *c = randn(dt, EM_SHAPE(5, 4), 30 + k), *e = positive(dt, EM_SHAPE(4, 10), 40 + k);
            CHECK_OP(bin_views, &fns[k], 0, tol_for(dt, 1e-5), c, e);
            em_scope_end(s);
        }
    }
}

TEST(test_cuda_integer_add_and_mul_match_the_cpu)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    const bin_arg fns[] = {{em_add}, {em_sub}, {em_mul}};
    for (int k = 0; k < 3; k++) {
        em_tensor *a = whole(EM_I32, EM_SHAPE(6, 7), 1), *b = whole(EM_I32, EM_SHAPE(7), 2);
        CHECK_OP(bin_plain, &fns[k], 0, -1, a, b);
        em_tensor *u = em_cast(em_abs(whole(EM_I32, EM_SHAPE(6, 7), 3)), EM_U8);
        CHECK_OP(bin_plain, &fns[k], 0, -1, u, u);
    }
    em_scope_end(s);
}

TEST(test_cuda_ops_refuse_inputs_on_two_devices)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(3)), *b = to_cuda(em_zeros(EM_F32, EM_SHAPE(3)));
    CHECK_ERR(em_add(a, b), EM_ERR_DEVICE, "add");
    CHECK_ERR(em_lt(b, a), EM_ERR_DEVICE, "lt");
    em_scope_end(s);
}

/* ---- scalar forms and unary ------------------------------------------------------------ */

/* The one-input ops by name; p is the power of pow_scalar, the addend of
 * add_scalar and the factor of mul_scalar; pos: needs positive inputs. */
typedef struct un_arg {
    const char *name;
    em_tensor *(*f)(em_tensor *);
    em_tensor *(*fp)(em_tensor *, double);
    double p;
    bool pos;
} un_arg;

static const un_arg UN_OPS[] = {
    {"pow_scalar", NULL, em_pow_scalar, 2.5, true},
    {"exp", em_exp, NULL, 0, true},
    {"log", em_log, NULL, 0, true},
    {"sqrt", em_sqrt, NULL, 0, true},
    {"rsqrt", em_rsqrt, NULL, 0, true},
    {"abs", em_abs, NULL, 0, false},
    {"tanh", em_tanh, NULL, 0, false},
    {"sigmoid", em_sigmoid, NULL, 0, false},
    {"relu", em_relu, NULL, 0, false},
    {"gelu", em_gelu, NULL, 0, false},
    {"gelu_tanh", em_gelu_tanh, NULL, 0, false},
    {"silu", em_silu, NULL, 0, false},
    {"add_scalar", NULL, em_add_scalar, 0.75, false},
    {"mul_scalar", NULL, em_mul_scalar, -1.5, false},
    {"neg", em_neg, NULL, 0, false},
};
enum { NUM_UN = sizeof UN_OPS / sizeof UN_OPS[0] };

static const un_arg *un_op(const char *name)
{
    for (int k = 0; k < NUM_UN; k++)
        if (!strcmp(UN_OPS[k].name, name)) return &UN_OPS[k];
    return NULL;
}

static em_tensor *un_apply(const un_arg *u, em_tensor *x) { return u->f ? u->f(x) : u->fp(x, u->p); }

static em_tensor *un_plain(em_tensor *const *in, const void *arg) { return un_apply(arg, in[0]); }
/* (6,4) seen transposed */
static em_tensor *un_view(em_tensor *const *in, const void *arg)
{
    return un_apply(arg, em_transpose(in[0], 0, 1));
}

TEST(test_cuda_unary_and_scalar_ops_match_the_cpu)
{
    CUDA_OR_SKIP();
    for (int d = 0; d < 4; d++) {
        em_dtype dt = float_dts[d];
        for (int k = 0; k < NUM_UN; k++) {
            em_scope s = em_scope_begin();
            const un_arg *u = &UN_OPS[k];
            em_tensor *x =
                u->pos ? positive(dt, EM_SHAPE(3, 33), 50 + k) : randn(dt, EM_SHAPE(3, 33), 50 + k);
            CHECK_OP(un_plain, u, tol_for(dt, 2e-6), tol_for(dt, 1e-5), x);
            em_tensor *y = u->pos ? positive(dt, EM_SHAPE(6, 4), 70 + k) : randn(dt, EM_SHAPE(6, 4), 70 + k);
            CHECK_OP(un_view, u, tol_for(dt, 2e-6), tol_for(dt, 1e-5), y);
            em_scope_end(s);
        }
    }
}

TEST(test_cuda_integer_abs_and_neg_are_exact)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    CHECK_OP(un_plain, un_op("abs"), 0, -1, whole(EM_I32, EM_SHAPE(5, 9), 5));
    CHECK_OP(un_view, un_op("neg"), 0, -1, whole(EM_I32, EM_SHAPE(6, 4), 6));
    em_scope_end(s);
}

/* ---- compare, where, masked_fill --------------------------------------------------------- */

TEST(test_cuda_compares_match_the_cpu_with_ties_and_broadcasting)
{
    CUDA_OR_SKIP();
    const bin_arg fns[] = {{em_eq}, {em_ne}, {em_lt}, {em_le}, {em_gt}, {em_ge}};
    const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32};
    for (int d = 0; d < 5; d++)
        for (int k = 0; k < 6; k++) {
            em_scope s = em_scope_begin();
            em_tensor *a = whole(dts[d], EM_SHAPE(4, 1, 6), 80 + k),
                      *b = whole(dts[d], EM_SHAPE(3, 6), 90 + k);
            CHECK_OP(bin_plain, &fns[k], 0, -1, a, b);
            em_tensor *c = em_transpose(whole(dts[d], EM_SHAPE(6, 4), 100 + k), 0, 1);
            CHECK_OP(bin_plain, &fns[k], 0, -1, c, c);
            em_scope_end(s);
        }
}

static em_tensor *where_op(em_tensor *const *in, const void *arg)
{
    (void)arg;
    return em_where(in[0], in[1], em_transpose(in[2], 0, 1)); /* b (5,4) seen as (4,5) */
}

static em_tensor *masked_fill_op(em_tensor *const *in, const void *arg)
{
    return em_masked_fill(in[0], in[1], *(const double *)arg);
}

TEST(test_cuda_where_and_masked_fill_match_the_cpu_forward_and_backward)
{
    CUDA_OR_SKIP();
    for (int d = 0; d < 4; d++) {
        em_dtype dt = float_dts[d];
        em_scope s = em_scope_begin();
        em_tensor *cond = em_gt(randn(EM_F32, EM_SHAPE(4, 1), 110), em_zeros(EM_F32, EM_SHAPE(1)));
        em_tensor *cond2 = em_gt(randn(EM_F32, EM_SHAPE(3, 4, 5), 111), em_zeros(EM_F32, EM_SHAPE(1)));
        CHECK_OP(where_op, NULL, 0, tol_for(dt, 1e-6), cond, randn(dt, EM_SHAPE(3, 1, 5), 112),
                 randn(dt, EM_SHAPE(5, 4), 113));
        CHECK_OP(where_op, NULL, 0, tol_for(dt, 1e-6), cond2, randn(dt, EM_SHAPE(5), 114),
                 randn(dt, EM_SHAPE(5, 4), 115));
        double v = -3.25;
        em_tensor *mask = em_lt(randn(EM_F32, EM_SHAPE(5), 116), em_zeros(EM_F32, EM_SHAPE(1)));
        CHECK_OP(masked_fill_op, &v, 0, tol_for(dt, 1e-6), randn(dt, EM_SHAPE(3, 5), 117), mask);
        em_scope_end(s);
    }
}

/* ---- reductions --------------------------------------------------------------------------- */

typedef struct red_arg {
    int k; /* 0 sum, 1 mean, 2 max, 3 min, 4 argmax */
    int ndims;
    int dims[3];
    bool keepdim;
    bool view; /* reduce x transposed (0,2) */
} red_arg;

static em_tensor *red_op(em_tensor *const *in, const void *arg)
{
    const red_arg *r = arg;
    em_tensor *x = r->view ? em_transpose(in[0], 0, 2) : in[0];
    switch (r->k) {
    case 0: return em_sum(x, r->ndims, r->dims, r->keepdim);
    case 1: return em_mean(x, r->ndims, r->dims, r->keepdim);
    case 2: return em_max(x, r->ndims, r->dims, r->keepdim);
    case 3: return em_min(x, r->ndims, r->dims, r->keepdim);
    default: return em_argmax(x, r->dims[0], r->keepdim);
    }
}

TEST(test_cuda_sum_and_mean_match_the_cpu_over_any_dims)
{
    CUDA_OR_SKIP();
    const red_arg cases[] = {
        {0, 1, {2}, false, false}, {0, 2, {0, 2}, true, false},  {0, 0, {0}, false, false},
        {1, 1, {1}, true, true},   {1, 2, {-1, 0}, false, true}, {0, 1, {0}, false, true},
    };
    for (int d = 0; d < 4; d++)
        for (int c = 0; c < 6; c++) {
            em_scope s = em_scope_begin();
            em_dtype dt = float_dts[d];
            /* sums round once into 16-bit dtypes from a double on both sides */
            CHECK_OP(red_op, &cases[c], tol_for(dt, 1e-6), tol_for(dt, 1e-6),
                     randn(dt, EM_SHAPE(3, 7, 300), 120 + c));
            em_scope_end(s);
        }
}

TEST(test_cuda_long_sum_is_exact_and_repeats_bit_for_bit)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *ones = to_cuda(em_full(EM_F32, EM_SHAPE(2, 1000000), 1.0));
    em_tensor *t = em_to(em_sum(ones, 1, (int[]){1}, false), em_device_cpu());
    CHECK(t != NULL);
    CHECK(((float *)em_data(t))[0] == 1e6f && ((float *)em_data(t))[1] == 1e6f);
    em_tensor *x = to_cuda(randn(EM_F32, EM_SHAPE(5, 70000), 130));
    em_tensor *a = em_to(em_sum(x, 1, (int[]){1}, false), em_device_cpu());
    em_tensor *b = em_to(em_sum(x, 1, (int[]){1}, false), em_device_cpu());
    CHECK(a && b && memcmp(em_data(a), em_data(b), 5 * sizeof(float)) == 0);
    em_scope_end(s);
}

TEST(test_cuda_integer_sums_match_the_cpu)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    red_arg r = {0, 1, {1}, false, false};
    CHECK_OP(red_op, &r, 0, -1, whole(EM_I32, EM_SHAPE(4, 9, 3), 140));
    CHECK_OP(red_op, &r, 0, -1, em_cast(em_abs(whole(EM_I32, EM_SHAPE(4, 9, 3), 141)), EM_U8));
    em_scope_end(s);
}

TEST(test_cuda_max_min_argmax_match_the_cpu_with_ties)
{
    CUDA_OR_SKIP();
    const red_arg cases[] = {
        {2, 1, {2}, false, false}, {3, 2, {0, 2}, true, false}, {2, 0, {0}, false, true},
        {3, 1, {1}, true, true},   {4, 1, {2}, false, false},   {4, 1, {0}, true, true},
    };
    const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32};
    for (int d = 0; d < 5; d++)
        for (int c = 0; c < 6; c++) {
            em_scope s = em_scope_begin();
            em_dtype dt = dts[d];
            /* whole numbers: many ties, each getting g / count */
            CHECK_OP(red_op, &cases[c], 0, tol_for(dt, 1e-6), whole(dt, EM_SHAPE(3, 7, 300), 150 + c));
            CHECK_OP(red_op, &cases[c], 0, tol_for(dt, 1e-6), randn(dt, EM_SHAPE(3, 7, 40), 160 + c));
            em_scope_end(s);
        }
}

TEST(test_cuda_max_propagates_nan_like_the_cpu)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    float v[6] = {1, NAN, 3, 2, 5, NAN};
    em_tensor *x = em_from_data(EM_F32, EM_SHAPE(2, 3), v);
    CHECK(x != NULL);
    red_arg mx = {2, 1, {1}, false, false}, am = {4, 1, {1}, false, false};
    CHECK_OP(red_op, &mx, 0, -1, x);
    CHECK_OP(red_op, &am, 0, -1, x);
    em_scope_end(s);
}
