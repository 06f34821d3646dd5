/* test_unary.c — pow_scalar, exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu,
 * gelu, gelu_tanh, silu: reference values (tests/fixtures/gen_unary.py),
 * gradients, f32 vs f64, f16/bf16, non-contiguous inputs, errors. */
#include "harness.h"

#include "fixtures/unary_ref.h"

typedef em_tensor *(*unary_fn)(em_tensor *);

/* An op under test: fn, or em_pow_scalar with power p when fn is NULL.
 * pos: the op needs positive inputs (log, sqrt, rsqrt, fractional powers). */
typedef struct uop {
    const char *name;
    unary_fn fn;
    double p;
    bool pos;
} uop;

static const uop OP_EXP = {"exp", em_exp, 0, false};
static const uop OP_LOG = {"log", em_log, 0, true};
static const uop OP_SQRT = {"sqrt", em_sqrt, 0, true};
static const uop OP_RSQRT = {"rsqrt", em_rsqrt, 0, true};
static const uop OP_ABS = {"abs", em_abs, 0, false};
static const uop OP_TANH = {"tanh", em_tanh, 0, false};
static const uop OP_SIGMOID = {"sigmoid", em_sigmoid, 0, false};
static const uop OP_RELU = {"relu", em_relu, 0, false};
static const uop OP_GELU = {"gelu", em_gelu, 0, false};
static const uop OP_GELU_TANH = {"gelu_tanh", em_gelu_tanh, 0, false};
static const uop OP_SILU = {"silu", em_silu, 0, false};
static const uop OP_POW3 = {"pow_scalar 3", NULL, 3.0, false};
static const uop OP_POW2_5 = {"pow_scalar 2.5", NULL, 2.5, true};
static const uop OP_POW_M1_5 = {"pow_scalar -1.5", NULL, -1.5, true};

/* max |t| over all elements */
static double max_abs(em_tensor *t)
{
    double m = 0, v[64];
    int64_t n = em_numel(t);
    CHECK(n <= 64);
    CHECK_OK(em_to_array(t, EM_F64, v));
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(v[i]));
    return m;
}

static em_tensor *apply(const uop *u, em_tensor *x) { return u->fn ? u->fn(x) : em_pow_scalar(x, u->p); }
static em_tensor *f_unary(em_tensor **x, void *ctx) { return apply(ctx, x[0]); }

/* (3,4) inputs kept away from 0 (the kinks of relu/abs); positive ones for
 * the ops that need them. */
static const double REAL_IN[12] = {-2.1, -1.3, -0.7, -0.35, -0.15, 0.12, 0.3, 0.55, 0.9, 1.4, 1.9, 2.6};
static const double POS_IN[12] = {0.2, 0.35, 0.5, 0.8, 1.1, 1.5, 2.0, 2.4, 3.1, 3.9, 4.6, 5.5};

/* ---- reference values ------------------------------------------------------------ */

/* op(in) in f64 equals want to 1e-12 (relative), and in f32 to 1e-6 */
static void ref_case(const uop *u, const double *want)
{
    em_scope s = em_scope_begin();
    int n = u->pos ? 6 : 8;
    const double *in = u->pos ? ref_pos_in : ref_real_in;
    double scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    em_tensor *x64 = th_tensor(EM_F64, 1, (int64_t[]){n}, in);
    em_tensor *y64 = apply(u, x64);
    CHECK(em_dtype_of(y64) == EM_F64);
    th_check_values(__FILE__, __LINE__, y64, want, 1e-12 * scale);
    em_tensor *y32 = apply(u, em_cast(x64, EM_F32));
    CHECK(em_dtype_of(y32) == EM_F32);
    th_check_values(__FILE__, __LINE__, y32, want, 1e-6 * scale);
    em_scope_end(s);
}

TEST(test_exp_matches_reference_values) { ref_case(&OP_EXP, ref_exp); }
TEST(test_log_matches_reference_values) { ref_case(&OP_LOG, ref_log); }
TEST(test_sqrt_matches_reference_values) { ref_case(&OP_SQRT, ref_sqrt); }
TEST(test_rsqrt_matches_reference_values) { ref_case(&OP_RSQRT, ref_rsqrt); }
TEST(test_abs_matches_reference_values) { ref_case(&OP_ABS, ref_abs); }
TEST(test_tanh_matches_reference_values) { ref_case(&OP_TANH, ref_tanh); }
TEST(test_sigmoid_matches_reference_values) { ref_case(&OP_SIGMOID, ref_sigmoid); }
TEST(test_relu_matches_reference_values) { ref_case(&OP_RELU, ref_relu); }
TEST(test_gelu_matches_reference_values) { ref_case(&OP_GELU, ref_gelu); }
TEST(test_gelu_tanh_matches_reference_values) { ref_case(&OP_GELU_TANH, ref_gelu_tanh); }
TEST(test_silu_matches_reference_values) { ref_case(&OP_SILU, ref_silu); }
TEST(test_pow_scalar_integer_power_matches_reference_values) { ref_case(&OP_POW3, ref_pow3); }
TEST(test_pow_scalar_fractional_power_matches_reference_values) { ref_case(&OP_POW2_5, ref_pow2_5); }
TEST(test_pow_scalar_negative_power_matches_reference_values) { ref_case(&OP_POW_M1_5, ref_pow_m1_5); }

TEST(test_gelu_exact_and_tanh_forms_differ_slightly)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(1), (double[]){-3.0});
    double d = em_item(em_gelu(x)) - em_item(em_gelu_tanh(x));
    CHECK(fabs(d) > 1e-4 && fabs(d) < 1e-3); /* -0.004050 vs -0.003637 */
    em_scope_end(s);
}

/* ---- gradients, f32 vs f64, non-contiguous ------------------------------------------- */

/* GRADCHECK in f64 on a (3,4) input, f32 agreeing with f64, and a
 * non-contiguous copy giving the same values and passing GRADCHECK. */
static void grad_case(const uop *u)
{
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(3, 4), u->pos ? POS_IN : REAL_IN);
    GRADCHECK(u->name, f_unary, (void *)u, 1, &x);
    F32_MATCHES_F64(u->name, f_unary, (void *)u, 1, &x, 2e-6);
    em_tensor *nc = th_noncontig(x);
    CHECK(!em_is_contiguous(nc));
    em_scope s = em_scope_begin();
    CHECK(th_max_abs_diff(apply(u, nc), apply(u, x)) == 0);
    em_tensor *nc32 = em_cast(nc, EM_F32), *nc32t = th_noncontig(nc32);
    CHECK(!em_is_contiguous(nc32t));
    em_tensor *y32 = apply(u, nc32);
    CHECK(th_max_abs_diff(apply(u, nc32t), y32) <= 1e-6 * fmax(1.0, max_abs(y32)));
    em_scope_end(s);
    GRADCHECK(u->name, f_unary, (void *)u, 1, &nc);
    em_free(nc);
    em_free(x);
}

TEST(test_exp_gradient_matches_finite_difference) { grad_case(&OP_EXP); }
TEST(test_log_gradient_matches_finite_difference) { grad_case(&OP_LOG); }
TEST(test_sqrt_gradient_matches_finite_difference) { grad_case(&OP_SQRT); }
TEST(test_rsqrt_gradient_matches_finite_difference) { grad_case(&OP_RSQRT); }
TEST(test_abs_gradient_matches_finite_difference) { grad_case(&OP_ABS); }
TEST(test_tanh_gradient_matches_finite_difference) { grad_case(&OP_TANH); }
TEST(test_sigmoid_gradient_matches_finite_difference) { grad_case(&OP_SIGMOID); }
TEST(test_relu_gradient_matches_finite_difference) { grad_case(&OP_RELU); }
TEST(test_gelu_gradient_matches_finite_difference) { grad_case(&OP_GELU); }
TEST(test_gelu_tanh_gradient_matches_finite_difference) { grad_case(&OP_GELU_TANH); }
TEST(test_silu_gradient_matches_finite_difference) { grad_case(&OP_SILU); }
TEST(test_pow_scalar_integer_power_gradient_matches_finite_difference) { grad_case(&OP_POW3); }
TEST(test_pow_scalar_fractional_power_gradient_matches_finite_difference) { grad_case(&OP_POW2_5); }
TEST(test_pow_scalar_negative_power_gradient_matches_finite_difference) { grad_case(&OP_POW_M1_5); }

/* grad of sum(op(x)) for x = (-1, 0, 2), in f32, f64 and bf16 */
static void grad_at(unary_fn f, const double *want)
{
    em_dtype dts[] = {EM_F32, EM_F64, EM_BF16};
    for (int d = 0; d < 3; d++) {
        em_tensor *x = th_tensor(dts[d], EM_SHAPE(3), (double[]){-1, 0, 2});
        CHECK_OK(em_set_requires_grad(x, true));
        em_scope s = em_scope_begin();
        CHECK_OK(em_backward(em_sum(f(x), 0, NULL, false), NULL));
        em_scope_end(s);
        th_check_values(__FILE__, __LINE__, em_grad(x), want, 0);
        em_free(x);
    }
}

TEST(test_relu_gradient_at_zero_is_zero) { grad_at(em_relu, (double[]){0, 0, 1}); }
TEST(test_abs_gradient_at_zero_is_zero) { grad_at(em_abs, (double[]){-1, 0, 1}); }

TEST(test_pow_scalar_zero_power_gives_ones_and_zero_gradient)
{
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(3), (double[]){-1.5, 0.5, 2});
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    em_tensor *y = em_pow_scalar(x, 0);
    CHECK_VALUES(y, 0, 1, 1, 1);
    CHECK_OK(em_backward(em_sum(y, 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK_VALUES(em_grad(x), 0, 0, 0, 0);
    em_free(x);
}

TEST(test_unary_f32_gradient_matches_f64_gradient)
{
    /* backward in f32 (fast path) agrees with backward in f64 for every op */
    const uop *ops[] = {&OP_EXP,  &OP_LOG,  &OP_SQRT,      &OP_RSQRT, &OP_ABS,  &OP_TANH,   &OP_SIGMOID,
                        &OP_RELU, &OP_GELU, &OP_GELU_TANH, &OP_SILU,  &OP_POW3, &OP_POW2_5, &OP_POW_M1_5};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        const double *in = ops[k]->pos ? POS_IN : REAL_IN;
        em_tensor *x64 = th_tensor(EM_F64, EM_SHAPE(12), in), *x32 = th_tensor(EM_F32, EM_SHAPE(12), in);
        CHECK_OK(em_set_requires_grad(x64, true));
        CHECK_OK(em_set_requires_grad(x32, true));
        em_scope s = em_scope_begin();
        CHECK_OK(em_backward(em_sum(apply(ops[k], x64), 0, NULL, false), NULL));
        CHECK_OK(em_backward(em_sum(apply(ops[k], x32), 0, NULL, false), NULL));
        double scale = max_abs(em_grad(x64));
        double diff = th_max_abs_diff(em_grad(x64), em_grad(x32));
        if (!(diff <= 2e-6 * fmax(scale, 1.0)))
            th_fail(__FILE__, __LINE__, "%s: f32 grad off by %g", ops[k]->name, diff);
        em_scope_end(s);
        em_free(x64);
        em_free(x32);
    }
}

/* ---- dtypes ------------------------------------------------------------------------ */

TEST(test_unary_half_dtypes_compute_in_f32_and_keep_dtype)
{
    const uop *ops[] = {&OP_EXP,       &OP_TANH, &OP_SIGMOID, &OP_RELU, &OP_GELU,
                        &OP_GELU_TANH, &OP_SILU, &OP_ABS,     &OP_POW3};
    const double *want[] = {ref_exp,       ref_tanh, ref_sigmoid, ref_relu, ref_gelu,
                            ref_gelu_tanh, ref_silu, ref_abs,     ref_pow3};
    em_dtype dts[] = {EM_F16, EM_BF16};
    em_scope s = em_scope_begin();
    for (int d = 0; d < 2; d++) {
        em_tensor *x = th_tensor(dts[d], EM_SHAPE(8), ref_real_in);
        double eps = dts[d] == EM_F16 ? 1.0 / 1024 : 1.0 / 128; /* one ulp at 1, relative */
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            em_tensor *y = apply(ops[k], x);
            CHECK(em_dtype_of(y) == dts[d]);
            /* input rounding plus output rounding: a few ulps */
            double got[8];
            CHECK_OK(em_to_array(y, EM_F64, got));
            for (int i = 0; i < 8; i++)
                if (!(fabs(got[i] - want[k][i]) <= 4 * eps * fmax(fabs(want[k][i]), 0.1)))
                    th_fail(__FILE__, __LINE__, "%s %s: element %d = %g, want %g", ops[k]->name,
                            em_dtype_name(dts[d]), i, got[i], want[k][i]);
        }
    }
    em_scope_end(s);
}

TEST(test_half_dtype_gradient_has_input_dtype)
{
    em_tensor *x = th_tensor(EM_BF16, EM_SHAPE(3), (double[]){-1, 0.5, 2});
    CHECK_OK(em_set_requires_grad(x, true));
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(em_sum(em_tanh(x), 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK(em_dtype_of(em_grad(x)) == EM_BF16);
    double t1 = tanh(1.0), t05 = tanh(0.5), t2 = tanh(2.0);
    CHECK_VALUES(em_grad(x), 0.01, 1 - t1 * t1, 1 - t05 * t05, 1 - t2 * t2);
    em_free(x);
}

TEST(test_abs_takes_integers)
{
    em_scope s = em_scope_begin();
    em_tensor *i = th_tensor(EM_I32, EM_SHAPE(4), (double[]){-3, 0, 2, -7});
    em_tensor *a = em_abs(i);
    CHECK(em_dtype_of(a) == EM_I32);
    CHECK_VALUES(a, 0, 3, 0, 2, 7);
    em_tensor *u = th_tensor(EM_U8, EM_SHAPE(2), (double[]){0, 200});
    CHECK_VALUES(em_abs(u), 0, 0, 200);
    em_scope_end(s);
}

TEST(test_sigmoid_and_silu_are_stable_for_large_inputs)
{
    em_scope s = em_scope_begin();
    em_dtype dts[] = {EM_F32, EM_F64};
    for (int d = 0; d < 2; d++) {
        em_tensor *x = th_tensor(dts[d], EM_SHAPE(4), (double[]){-1000, -100, 100, 1000});
        CHECK_VALUES(em_sigmoid(x), 1e-30, 0, 0, 1, 1);
        CHECK_VALUES(em_silu(x), 1e-30, 0, 0, 100, 1000);
        CHECK_VALUES(em_gelu(x), 1e-30, 0, 0, 100, 1000);
        CHECK_VALUES(em_gelu_tanh(x), 1e-30, 0, 0, 100, 1000);
        CHECK_VALUES(em_tanh(x), 0, -1, -1, 1, 1);
    }
    em_scope_end(s);
}

TEST(test_log_sqrt_of_zero_and_negative_follow_ieee)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2), (double[]){0, -1});
    CHECK_VALUES(em_log(x), 0, -INFINITY, NAN);
    CHECK_VALUES(em_sqrt(x), 0, 0, NAN);
    CHECK_VALUES(em_rsqrt(x), 0, INFINITY, NAN);
    em_scope_end(s);
}

TEST(test_unary_on_empty_and_scalar_tensors)
{
    em_scope s = em_scope_begin();
    em_tensor *e = em_exp(em_zeros(EM_F32, EM_SHAPE(0, 3)));
    CHECK(e && em_numel(e) == 0 && em_size(e, 1) == 3);
    CHECK_NEAR(em_item(em_exp(em_scalar(EM_F64, 1.0))), M_E, 1e-15);
    em_scope_end(s);
}

TEST(test_unary_large_tensor_runs_in_parallel_like_serial)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(5);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(300, 1000), &r);
    CHECK_OK(em_set_num_threads(1));
    em_tensor *a = em_gelu(x);
    CHECK_OK(em_set_num_threads(4));
    em_tensor *b = em_gelu(x);
    CHECK(th_max_abs_diff(a, b) == 0);
    em_scope_end(s);
}

/* ---- errors ------------------------------------------------------------------------ */

TEST(test_float_unary_ops_reject_integer_input)
{
    em_scope s = em_scope_begin();
    em_tensor *i = em_zeros(EM_I32, EM_SHAPE(3));
    CHECK_ERR(em_exp(i), EM_ERR_DTYPE, "exp: needs a float tensor, got i32(3,)");
    CHECK_ERR(em_log(i), EM_ERR_DTYPE, "log:");
    CHECK_ERR(em_sqrt(i), EM_ERR_DTYPE, "sqrt:");
    CHECK_ERR(em_rsqrt(i), EM_ERR_DTYPE, "rsqrt:");
    CHECK_ERR(em_tanh(i), EM_ERR_DTYPE, "tanh:");
    CHECK_ERR(em_sigmoid(i), EM_ERR_DTYPE, "sigmoid:");
    CHECK_ERR(em_relu(i), EM_ERR_DTYPE, "relu:");
    CHECK_ERR(em_gelu(i), EM_ERR_DTYPE, "gelu:");
    CHECK_ERR(em_gelu_tanh(i), EM_ERR_DTYPE, "gelu_tanh:");
    CHECK_ERR(em_silu(i), EM_ERR_DTYPE, "silu:");
    CHECK_ERR(em_pow_scalar(i, 2), EM_ERR_DTYPE, "pow_scalar:");
    CHECK_ERR(em_exp(em_zeros(EM_U8, EM_SHAPE(2, 2))), EM_ERR_DTYPE,
              "exp: needs a float tensor, got u8(2,2)");
    em_scope_end(s);
}

TEST(test_abs_rejects_bool)
{
    em_scope s = em_scope_begin();
    CHECK_ERR(em_abs(em_zeros(EM_BOOL, EM_SHAPE(2))), EM_ERR_DTYPE,
              "abs: does not take bool tensors, got bool(2,)");
    em_scope_end(s);
}

TEST(test_unary_propagates_null_and_rejects_stale_handle)
{
    em_clear_error();
    CHECK(em_tanh(NULL) == NULL);
    CHECK(em_last_status() != EM_OK);
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(2));
    em_scope_end(s);
    CHECK_ERR(em_sigmoid(x), EM_ERR_SCOPE, "sigmoid");
}

TEST(test_unary_records_only_when_grad_needed)
{
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(2), (double[]){1, 2});
    em_scope s = em_scope_begin();
    int64_t n0 = em_tape_length();
    em_tensor *y = em_exp(x);
    CHECK(em_tape_length() == n0 && !em_requires_grad(y));
    CHECK_OK(em_set_requires_grad(x, true));
    y = em_exp(x);
    CHECK(em_tape_length() == n0 + 1 && em_requires_grad(y));
    em_scope_end(s);
    em_free(x);
}
