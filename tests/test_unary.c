/* test_unary.c — pow_scalar, exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu,
 * gelu, gelu_tanh, silu: reference values and gradients for every row of
 * the unary test table (tests/unary_cases.h), f32 vs f64, f16/bf16, non-contiguous inputs, errors; and the
 * CPU's vectorisable f32 approximations held to the exact formulas the CUDA
 * kernels use (tensor/elementwise_math.h), with the tolerances stated there. */
#include "harness.h"
#include "tensor/elementwise_math.h"

#include "tensor/ops.h"
#include "unary_cases.h"

typedef em_tensor *(*unary_fn)(em_tensor *);

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

static em_tensor *f_unary(em_tensor **x, void *ctx) { return uc_apply(ctx, x[0]); }

/* (3,4) inputs kept away from 0 (the kinks of relu/abs); positive ones for
 * the ops that need them. */
static const double REAL_IN[12] = {-2.1, -1.3, -0.7, -0.35, -0.15, 0.12, 0.3, 0.55, 0.9, 1.4, 1.9, 2.6};
static const double POS_IN[12] = {0.2, 0.35, 0.5, 0.8, 1.1, 1.5, 2.0, 2.4, 3.1, 3.9, 4.6, 5.5};

/* ---- reference values ------------------------------------------------------------ */

/* op(in) in f64 equals the table's values to 1e-12 (relative), and in f32 to 1e-6 */
static void ref_case(const unary_case *u)
{
    em_scope s = em_scope_begin();
    int n = u->domain == UC_POS ? 6 : 8;
    const double *in = u->domain == UC_POS ? uc_pos_in : uc_real_in;
    double scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(u->want[i]));
    em_tensor *x64 = th_tensor(EM_F64, 1, (int64_t[]){n}, in);
    em_tensor *y64 = uc_apply(u, x64);
    CHECK(em_dtype_of(y64) == EM_F64);
    th_check_values(__FILE__, __LINE__, y64, u->want, 1e-12 * scale);
    em_tensor *y32 = uc_apply(u, em_cast(x64, EM_F32));
    CHECK(em_dtype_of(y32) == EM_F32);
    th_check_values(__FILE__, __LINE__, y32, u->want, 1e-6 * scale);
    em_scope_end(s);
}

TEST(test_every_unary_op_matches_its_reference_values)
{
    for (int i = 0; i < N_UNARY_CASES; i++) {
        th_case("%s p=%g", unary_cases[i].op, unary_cases[i].p);
        ref_case(&unary_cases[i]);
    }
}

TEST(test_every_unary_op_of_the_list_has_a_row_in_the_test_table)
{
    int missing = 0;
    for (int op = 0; op < OP_COUNT; op++) {
        if (op_table[op].kind != OPK_UNARY) continue;
        bool found = false;
        for (int k = 0; k < N_UNARY_CASES && !found; k++)
            found = !strcmp(unary_cases[k].op, op_table[op].name);
        if (!found) {
            fprintf(stderr, "  unary op '%s' (tensor/ops.def) has no row in tests/unary_cases.h\n",
                    op_table[op].name);
            missing++;
        }
    }
    CHECK(missing == 0);
}

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
static void grad_case(const unary_case *u)
{
    em_tensor *x = th_tensor(EM_F64, EM_SHAPE(3, 4), u->domain == UC_POS ? POS_IN : REAL_IN);
    GRADCHECK(u->op, f_unary, (void *)u, 1, &x);
    F32_MATCHES_F64(u->op, f_unary, (void *)u, 1, &x, 2e-6);
    em_tensor *nc = th_noncontig(x);
    CHECK(!em_is_contiguous(nc));
    em_scope s = em_scope_begin();
    CHECK(th_max_abs_diff(uc_apply(u, nc), uc_apply(u, x)) == 0);
    em_tensor *nc32 = em_cast(nc, EM_F32), *nc32t = th_noncontig(nc32);
    CHECK(!em_is_contiguous(nc32t));
    em_tensor *y32 = uc_apply(u, nc32);
    CHECK(th_max_abs_diff(uc_apply(u, nc32t), y32) <= 1e-6 * fmax(1.0, max_abs(y32)));
    em_scope_end(s);
    GRADCHECK(u->op, f_unary, (void *)u, 1, &nc);
    em_free(nc);
    em_free(x);
}

TEST(test_every_unary_op_gradient_matches_finite_difference)
{
    for (int i = 0; i < N_UNARY_CASES; i++) {
        th_case("%s p=%g", unary_cases[i].op, unary_cases[i].p);
        grad_case(&unary_cases[i]);
    }
}

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
    for (int k = 0; k < N_UNARY_CASES; k++) {
        const unary_case *u = &unary_cases[k];
        const double *in = u->domain == UC_POS ? POS_IN : REAL_IN;
        em_tensor *x64 = th_tensor(EM_F64, EM_SHAPE(12), in), *x32 = th_tensor(EM_F32, EM_SHAPE(12), in);
        CHECK_OK(em_set_requires_grad(x64, true));
        CHECK_OK(em_set_requires_grad(x32, true));
        em_scope s = em_scope_begin();
        CHECK_OK(em_backward(em_sum(uc_apply(u, x64), 0, NULL, false), NULL));
        CHECK_OK(em_backward(em_sum(uc_apply(u, x32), 0, NULL, false), NULL));
        double scale = max_abs(em_grad(x64));
        double diff = th_max_abs_diff(em_grad(x64), em_grad(x32));
        if (!(diff <= 2e-6 * fmax(scale, 1.0)))
            th_fail(__FILE__, __LINE__, "%s p=%g: f32 grad off by %g", u->op, u->p, diff);
        em_scope_end(s);
        em_free(x64);
        em_free(x32);
    }
}

/* ---- dtypes ------------------------------------------------------------------------ */

TEST(test_unary_half_dtypes_compute_in_f32_and_keep_dtype)
{
    em_dtype dts[] = {EM_F16, EM_BF16};
    em_scope s = em_scope_begin();
    for (int d = 0; d < 2; d++) {
        em_tensor *x = th_tensor(dts[d], EM_SHAPE(8), uc_real_in);
        double eps = dts[d] == EM_F16 ? 1.0 / 1024 : 1.0 / 128; /* one ulp at 1, relative */
        for (int k = 0; k < N_UNARY_CASES; k++) {
            const unary_case *u = &unary_cases[k];
            if (u->domain != UC_REAL) continue;
            const double *want = u->want;
            em_tensor *y = uc_apply(u, x);
            CHECK(em_dtype_of(y) == dts[d]);
            /* input rounding plus output rounding: a few ulps */
            double got[8];
            CHECK_OK(em_to_array(y, EM_F64, got));
            for (int i = 0; i < 8; i++)
                if (!(fabs(got[i] - want[i]) <= 4 * eps * fmax(fabs(want[i]), 0.1)))
                    th_fail(__FILE__, __LINE__, "%s %s: element %d = %g, want %g", u->op,
                            em_dtype_name(dts[d]), i, got[i], want[i]);
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

TEST(test_gelu_of_infinities_is_zero_and_identity_and_nan_stays_nan)
{
    em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (int d = 0; d < 4; d++) {
        th_case("%s", em_dtype_name(dts[d]));
        em_tensor *x = th_tensor(dts[d], EM_SHAPE(3), (double[]){-INFINITY, INFINITY, NAN});
        CHECK_OK(em_set_requires_grad(x, true));
        em_scope s = em_scope_begin();
        em_tensor *y = em_gelu(x);
        CHECK_VALUES(y, 0, 0, INFINITY, NAN); /* gelu(-inf) is -0 */
        CHECK_OK(em_backward(y, em_ones(dts[d], EM_SHAPE(3))));
        em_scope_end(s);
        CHECK_VALUES(em_grad(x), 0, 0, 1, NAN);
        em_free(x);
    }
}

TEST(test_gelu_on_f16_and_bf16_gives_the_f32_paths_bits_rounded)
{
    /* f16/bf16 widen to f32, run the contiguous f32 loop and round: the
     * f32 result of the same values, rounded, bit for bit */
    em_dtype dts[] = {EM_F16, EM_BF16};
    for (int d = 0; d < 2; d++) {
        th_case("%s", em_dtype_name(dts[d]));
        em_rng r = em_rng_new(7);
        em_scope s0 = em_scope_begin();
        em_tensor *x = em_detach(em_cast(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(41, 37), &r), 4.0), dts[d]));
        em_tensor *g = em_cast(em_randn(EM_F32, EM_SHAPE(41, 37), &r), dts[d]);
        em_tensor *x32 = em_detach(em_cast(x, EM_F32));
        CHECK_OK(em_set_requires_grad(x, true));
        CHECK_OK(em_set_requires_grad(x32, true));
        em_tensor *y = em_gelu(x), *y32 = em_gelu(x32);
        CHECK(em_dtype_of(y) == dts[d]);
        CHECK(!memcmp(em_data(y), em_data(em_cast(y32, dts[d])), 41 * 37 * 2));
        CHECK_OK(em_backward(y, g));
        CHECK_OK(em_backward(y32, em_cast(g, EM_F32)));
        CHECK(em_dtype_of(em_grad(x)) == dts[d]);
        CHECK(!memcmp(em_data(em_grad(x)), em_data(em_cast(em_grad(x32), dts[d])), 41 * 37 * 2));
        em_scope_end(s0);
    }
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

/* ---- the CPU's fast f32 maths against the exact formulas ----------------------------
 * The CPU computes f32 (and f16/bf16) elementwise maths with vexpf, vtanhf,
 * vsigmoidf and vnormalf (tensor/vmath_impl.h), which vectorise; the CUDA
 * kernels use the same formulas with expf, tanhf, erfcf (the _f32 flavour).
 * These tests state how far apart the two may be, over inputs from 2^-40
 * to 100 in size (log-spaced), both signs, plus an even grid over
 * [-30, 30]. The largest differences measured on every float in the range
 * are in the comments. */

enum { SWEEP = 120000 };

/* the i-th input of the sweep, i in [0, SWEEP) */
static float sweep_x(int i)
{
    int half = SWEEP / 2, j = i % half;
    float x = i < half ? (float)pow(2.0, -40 + 46.65 * j / half) : (float)(-30 + 60.0 * j / half);
    return j % 2 ? -x : x;
}

/* one unit in the last place of the float |v| (normal range) */
static double ulp_of(float v)
{
    int e;
    frexpf(fabsf(v), &e);
    return ldexp(1.0, e - 24);
}

TEST(test_vexpf_is_within_2_ulp_of_expf_and_flushes_below_minus_87)
{
    for (int i = 0; i < SWEEP; i++) {
        float x = 3 * sweep_x(i), v = vexpf(x), e = expf(x);
        if (x < -86.99f) { /* below: 0 where expf is tiny or subnormal */
            if (!(v == 0 && e < 1.7e-38f)) th_fail(__FILE__, __LINE__, "vexpf(%g) = %g, expf %g", x, v, e);
        } else if (x > 88.72f) { /* above: inf where expf is within 0.3% of FLT_MAX, or inf */
            if (!(isinf(v) && e > 3.39e38f)) th_fail(__FILE__, __LINE__, "vexpf(%g) = %g, expf %g", x, v, e);
        } else if (!(fabs((double)v - e) <= 2 * ulp_of(e))) { /* measured: 2 ulp */
            th_fail(__FILE__, __LINE__, "vexpf(%.9g) = %.9g, expf %.9g: %.1f ulp", x, v, e,
                    fabs((double)v - e) / ulp_of(e));
        }
    }
    CHECK(isnan(vexpf(NAN)) && vexpf(-INFINITY) == 0 && isinf(vexpf(INFINITY)));
}

TEST(test_vtanhf_is_within_16_ulp_and_1_2e_7_of_tanhf)
{
    for (int i = 0; i < SWEEP; i++) {
        float x = sweep_x(i), v = vtanhf(x), e = tanhf(x);
        double d = fabs((double)v - e);
        /* measured: 15 ulp just above |x| = 1/8, where the series gives way
         * to 1 - 2/(e^2x + 1); 1.19e-7 absolute */
        if (!(d <= 16 * ulp_of(e) && d <= 1.2e-7))
            th_fail(__FILE__, __LINE__, "vtanhf(%.9g) = %.9g, tanhf %.9g: %.1f ulp", x, v, e, d / ulp_of(e));
    }
}

/* ---- the CPU's exact GELU against an f64 reference ----------------------------------
 * The fast GELU's error is stated against erfc in double (Phi(x) =
 * erfc(-x/sqrt 2)/2, the negative tail without cancellation), over a dense
 * sweep: every 509th float with |x| <= 30. The largest errors measured on
 * every float are in the bounds' comments, with the erf-based form this
 * replaced (A&S 7.1.26, over the same floats) in brackets. */

enum { DENSE_STEP = 509 };

static double ref_phi(double x) { return 0.5 * erfc(-x * 0.70710678118654752440); }
static double ref_pdf(double x) { return 0.39894228040143267794 * exp(-0.5 * x * x); }

TEST(test_vnormalf_is_within_2_5e_7_of_phi_and_keeps_the_tails_relative_accuracy)
{
    for (uint64_t b = 0; b < (1ull << 32); b += DENSE_STEP) {
        uint32_t bits = (uint32_t)b;
        float x, pdf;
        memcpy(&x, &bits, sizeof x);
        if (!(fabsf(x) <= 30)) continue;
        float c = vnormalf(x, &pdf);
        double cr = ref_phi(x), pr = ref_pdf(x), a = fabs(x);
        /* measured on every float: Phi within 2.47e-7 (near 0, where
         * 1 - Phi(-a) rounds); Phi(-a) within 7.8e-7 relative for a <= 5
         * and 4.1e-6 to 12.9, phi within 6.1e-7 and 3.9e-6 (the rounding
         * of x^2/2) */
        double rel_tail = a <= 5 ? 8e-7 : 4.5e-6;
        bool ok = fabs(c - cr) <= 2.5e-7;
        if (x <= 0 && a <= 12.9) ok = ok && fabs(c - cr) <= rel_tail * cr;
        if (a <= 12.9) ok = ok && fabs(pdf - pr) <= rel_tail * pr;
        if (a > 13.2) ok = ok && pdf == 0 && c == (x < 0 ? 0 : 1); /* e^(-x^2/2) flushed */
        if (!ok)
            th_fail(__FILE__, __LINE__, "vnormalf(%.9g) = %.9g, pdf %.9g; want %.9g, %.9g", x, c, pdf, cr,
                    pr);
    }
    float pdf;
    CHECK(vnormalf(-INFINITY, &pdf) == 0 && pdf == 0);
    CHECK(vnormalf(INFINITY, &pdf) == 1 && pdf == 0);
    CHECK(isnan(vnormalf(NAN, &pdf)) && isnan(pdf));
}

/* one GELU to judge: y = gelu(x), *grad = gelu'(x) */
typedef float (*gelu_eval)(float x, float *grad);

static float gelu_fast(float x, float *grad)
{
    float y = ew_unary_f32v(UN_GELU, x, 0);
    *grad = ew_unary_grad_f32v(UN_GELU, x, y, 1, 0);
    return y;
}

/* planted errors: the tanh form, and the exact GELU with its x/sqrt 2 scale
 * off by one part in 2^20 */
static float gelu_tanh_form(float x, float *grad)
{
    float y = ew_unary_f32v(UN_GELU_TANH, x, 0);
    *grad = ew_unary_grad_f32v(UN_GELU_TANH, x, y, 1, 0);
    return y;
}

static float gelu_scale_off(float x, float *grad) { return gelu_fast(x * (1 + 0x1p-20f), grad); }

/* the stated bounds, each with what it measures */
enum { GB_FWD_ABS, GB_FWD_ULP, GB_FWD_TAIL, GB_GRAD_ABS, GB_GRAD_TAIL, GB_COUNT };
static const struct {
    const char *what;
    double bound;
} gelu_bounds[GB_COUNT] = {
    /* measured 1.41e-7 [erf form: 2.60e-7] */
    [GB_FWD_ABS] = {"forward |err| / max(1, |gelu|)", 1.5e-7},
    /* measured 12.4 ulp [6.7e5 ulp: 4.9% near x = -5] */
    [GB_FWD_ULP] = {"forward ulp of gelu, x >= -5", 14},
    /* measured 4.1e-6 [1: flushed to -0 below x = -5.7] */
    [GB_FWD_TAIL] = {"forward |err| / |gelu|, -12.9 <= x < -5", 4.5e-6},
    /* measured 2.59e-7 [3.24e-7] */
    [GB_GRAD_ABS] = {"gradient |err| / max(1, |gelu'|)", 2.7e-7},
    /* measured 4.0e-6 [3.3e-2] */
    [GB_GRAD_TAIL] = {"gradient |err| / |gelu'|, -12.9 <= x < -5", 4.5e-6},
};

/* the largest of each measure over the dense sweep */
static void gelu_worst(gelu_eval f, double worst[GB_COUNT])
{
    for (int k = 0; k < GB_COUNT; k++) worst[k] = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += DENSE_STEP) {
        uint32_t bits = (uint32_t)b;
        float x, g;
        memcpy(&x, &bits, sizeof x);
        if (!(fabsf(x) <= 30)) continue;
        float y = f(x, &g);
        double yr = x * ref_phi(x), gr = ref_phi(x) + x * ref_pdf(x);
        double dy = fabs(y - yr), dg = fabs(g - gr);
        double m[GB_COUNT] = {
            [GB_FWD_ABS] = dy / fmax(1, fabs(yr)),
            [GB_FWD_ULP] = x >= -5 && yr != 0 ? dy / fmax(ulp_of((float)yr), 0x1p-149) : 0,
            [GB_FWD_TAIL] = x < -5 && x >= -12.9f ? dy / fabs(yr) : 0,
            [GB_GRAD_ABS] = dg / fmax(1, fabs(gr)),
            [GB_GRAD_TAIL] = x < -5 && x >= -12.9f ? dg / fabs(gr) : 0,
        };
        for (int k = 0; k < GB_COUNT; k++) worst[k] = fmax(worst[k], isnan(m[k]) ? INFINITY : m[k]);
    }
}

TEST(test_fast_gelu_forward_and_gradient_are_within_stated_bounds_of_the_f64_reference)
{
    double worst[GB_COUNT];
    gelu_worst(gelu_fast, worst);
    for (int k = 0; k < GB_COUNT; k++)
        if (!(worst[k] <= gelu_bounds[k].bound))
            th_fail(__FILE__, __LINE__, "%s: %.3g, bound %.3g", gelu_bounds[k].what, worst[k],
                    gelu_bounds[k].bound);
}

TEST(test_gelu_bounds_catch_the_tanh_form_and_a_scale_off_by_2_to_the_minus_20)
{
    double worst[GB_COUNT];
    gelu_worst(gelu_tanh_form, worst);
    CHECK(worst[GB_FWD_ABS] > gelu_bounds[GB_FWD_ABS].bound);
    CHECK(worst[GB_GRAD_ABS] > gelu_bounds[GB_GRAD_ABS].bound);
    gelu_worst(gelu_scale_off, worst);
    CHECK(worst[GB_FWD_ABS] > gelu_bounds[GB_FWD_ABS].bound);
    CHECK(worst[GB_FWD_ULP] > gelu_bounds[GB_FWD_ULP].bound);
    CHECK(worst[GB_GRAD_ABS] > gelu_bounds[GB_GRAD_ABS].bound);
}

TEST(test_vsigmoidf_is_within_4_ulp_and_1_2e_7_of_the_exact_sigmoid)
{
    for (int i = 0; i < SWEEP; i++) {
        float x = 3 * sweep_x(i), v = vsigmoidf(x), e = ew_sigmoid_f32(x);
        double d = fabs((double)v - e);
        /* measured: 4 ulp above -86.9 (below, vexpf's overflow gives 0 where
         * the exact value is under 1.7e-38); 1.19e-7 absolute */
        if (!(d <= 1.2e-7 && (x < -86.9f || d <= 4 * ulp_of(e))))
            th_fail(__FILE__, __LINE__, "vsigmoidf(%.9g) = %.9g, exact %.9g", x, v, e);
    }
}

TEST(test_every_unary_op_fast_f32_forward_and_gradient_are_within_6e_7_of_the_exact_formula_1e_6_without_fma)
{
    /* |fast - exact| <= bound * max(1, |exact|); measured worst: silu's
     * gradient 4.7e-7, gelu's gradient 2.4e-7 where the build contracts
     * a * b + c to one FMA (-march=native on an FMA CPU); in a build
     * without FMA (-Dnative=false) each is rounded twice, and gelu_tanh's
     * gradient measured 8.2e-7 (2026-12-07). p = 2.5 for pow_scalar. */
#ifdef __FMA__
    const double bound = 6e-7;
#else
    const double bound = 1e-6;
#endif
    for (int k = 0; k < UN_COUNT; k++) {
        for (int i = 0; i < SWEEP; i++) {
            float x = sweep_x(i), p = 2.5f, g = 1.0f - (float)(i % 7) / 4;
            if (k == UN_EXP && x > 88.7f) continue; /* vexpf's inf, tested above */
            float yv = ew_unary_f32v((unop)k, x, p), ye = ew_unary_f32((unop)k, x, p);
            float gv = ew_unary_grad_f32v((unop)k, x, yv, g, p), ge = ew_unary_grad_f32((unop)k, x, ye, g, p);
            float got[2] = {yv, gv}, want[2] = {ye, ge};
            for (int j = 0; j < 2; j++) {
                if (isnan(want[j]) || (isinf(want[j]) && got[j] == want[j])) {
                    if (!(isnan(want[j]) == isnan(got[j])))
                        th_fail(__FILE__, __LINE__, "%s(%g): %g, exact %g", unop_name((unop)k), x, got[j],
                                want[j]);
                    continue;
                }
                double d = fabs((double)got[j] - want[j]) / fmax(1.0, fabs(want[j]));
                if (!(d <= bound))
                    th_fail(__FILE__, __LINE__, "%s %s at %.9g: fast %.9g, exact %.9g", unop_name((unop)k),
                            j ? "gradient" : "forward", x, got[j], want[j]);
            }
        }
    }
}

TEST(test_unary_f32_strided_path_gives_the_fast_paths_bits_forward_and_backward)
{
    /* the strided kernel and the contiguous loop compute one formula, so a
     * transposed input must give the contiguous result bit for bit */
    for (int k = 0; k < N_UNARY_CASES; k++) {
        const unary_case *u = &unary_cases[k];
        em_scope s = em_scope_begin();
        em_rng r = em_rng_new(40 + (uint64_t)k);
        em_tensor *x = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(37, 29), &r), 3.0);
        if (u->domain == UC_POS) x = em_add_scalar(em_abs(x), 0.05);
        em_tensor *g = em_randn(EM_F32, EM_SHAPE(37, 29), &r);
        em_tensor *a = em_detach(x), *b = em_detach(em_contiguous(em_transpose(x, 0, 1)));
        CHECK_OK(em_set_requires_grad(a, true));
        CHECK_OK(em_set_requires_grad(b, true));
        em_tensor *ya = uc_apply(u, a);                     /* the contiguous loop */
        em_tensor *yb = uc_apply(u, em_transpose(b, 0, 1)); /* the strided kernel */
        if (th_max_abs_diff(ya, yb) != 0 || memcmp(em_data(ya), em_data(em_contiguous(yb)), 37 * 29 * 4))
            th_fail(__FILE__, __LINE__, "%s: the strided forward differs from the contiguous one", u->op);
        CHECK_OK(em_backward(em_sum(em_mul(ya, g), 0, NULL, false), NULL));
        CHECK_OK(em_backward(em_sum(em_mul(yb, g), 0, NULL, false), NULL));
        em_tensor *gb = em_contiguous(em_transpose(em_grad(b), 0, 1));
        if (memcmp(em_data(em_grad(a)), em_data(gb), 37 * 29 * 4))
            th_fail(__FILE__, __LINE__, "%s: the strided backward differs from the contiguous one", u->op);
        em_scope_end(s);
        em_free(a);
        em_free(b);
    }
}

/* A recorded gelu (either form) keeps its slope f'(x) from the forward, and
 * backward multiplies the output's gradient by it: the gradient has the
 * bits of g * f'(x) for the x the forward read, even when x's storage is
 * written between forward and backward (backward reads the slope, not x),
 * contiguous, strided and bf16 alike. */
TEST(test_gelu_backward_multiplies_by_the_slope_its_forward_kept)
{
    const struct {
        em_tensor *(*f)(em_tensor *);
        unop k;
    } forms[] = {{em_gelu, UN_GELU}, {em_gelu_tanh, UN_GELU_TANH}};
    for (int k = 0; k < 2; k++)
        for (int layout = 0; layout < 3; layout++) { /* contiguous f32, transposed f32, bf16 */
            em_scope s = em_scope_begin();
            em_rng r = em_rng_new(90 + (uint64_t)(3 * k + layout));
            em_dtype dt = layout == 2 ? EM_BF16 : EM_F32;
            int64_t rows = layout == 1 ? 13 : 9, cols = layout == 1 ? 9 : 13;
            em_tensor *x =
                em_detach(em_cast(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(rows, cols), &r), 3.0), dt));
            /* g exact in bf16, so the bf16 case's gradient arrives unrounded */
            em_tensor *g = em_cast(em_cast(em_randn(EM_F32, EM_SHAPE(9, 13), &r), EM_BF16), EM_F32);
            CHECK_OK(em_set_requires_grad(x, true));
            em_tensor *in = layout == 1 ? em_transpose(x, 0, 1) : x;
            em_tensor *xf = em_contiguous(em_cast(in, EM_F32)); /* the values the forward reads */
            float want[9 * 13];
            for (int i = 0; i < 9 * 13; i++) {
                want[i] =
                    ((float *)em_data(g))[i] * ew_gelu_slope_f32v(forms[k].k, ((float *)em_data(xf))[i]);
                if (dt == EM_BF16) want[i] = em_bf16_to_f32(em_f32_to_bf16(want[i]));
            }
            em_tensor *y = forms[k].f(in);
            memset(em_data(x), 0, 9 * 13 * em_dtype_size(dt)); /* x's storage overwritten after the forward */
            CHECK_OK(em_backward(em_sum(em_mul(em_cast(y, EM_F32), g), 0, NULL, false), NULL));
            em_tensor *gx = layout == 1 ? em_transpose(em_grad(x), 0, 1) : em_grad(x);
            em_tensor *got = em_contiguous(em_cast(gx, EM_F32));
            for (int i = 0; i < 9 * 13; i++)
                if (((float *)em_data(got))[i] != want[i])
                    th_fail(__FILE__, __LINE__, "%s, layout %d: element %d: gradient %.9g, want %.9g",
                            unop_name(forms[k].k), layout, i, ((float *)em_data(got))[i], want[i]);
            CHECK_OK(em_scope_end(s)); /* x, made in the scope, goes with it */
        }
}

/* f16 and bf16 tensors are read and written in bulk where contiguous
 * (gather_f32, convert_n): every unary op, forward and backward, gives
 * the bits of the element-by-element path a strided input takes, over a
 * size the pool splits and several 256-element blocks; the forward is the
 * f32 loop's result rounded, as for gelu above. x holds the specials. */
TEST(test_unary_on_contiguous_f16_bf16_gives_the_strided_paths_bits)
{
    static const struct {
        const char *name;
        em_tensor *(*f)(em_tensor *);
    } ops[] = {{"exp", em_exp},   {"log", em_log},   {"sqrt", em_sqrt},          {"rsqrt", em_rsqrt},
               {"abs", em_abs},   {"tanh", em_tanh}, {"sigmoid", em_sigmoid},    {"relu", em_relu},
               {"gelu", em_gelu}, {"silu", em_silu}, {"gelu_tanh", em_gelu_tanh}};
    const em_dtype dts[] = {EM_F16, EM_BF16};
    const int64_t R = 131, C = 173; /* 22663 elements: over 1 << 13, so split over the pool */
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            th_case("%s %s", ops[k].name, em_dtype_name(dts[d]));
            em_scope s = em_scope_begin();
            em_rng r = em_rng_new(300 + (uint64_t)k);
            em_tensor *x32 = em_contiguous(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(R, C), &r), 3.0));
            float *xv = em_data(x32);
            const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-6f, 70000.0f, -1e-30f};
            for (int i = 0; i < 8; i++) xv[i * 997] = specials[i];
            em_tensor *x = em_detach(em_cast(x32, dts[d]));
            /* the same values, not contiguous: x^T's copy, transposed */
            em_tensor *xs = em_detach(em_transpose(em_contiguous(em_transpose(x, 0, 1)), 0, 1));
            em_tensor *g = em_cast(em_randn(EM_F32, EM_SHAPE(R, C), &r), dts[d]);
            CHECK_OK(em_set_requires_grad(x, true));
            CHECK_OK(em_set_requires_grad(xs, true));
            em_tensor *y = ops[k].f(x), *ys = ops[k].f(xs);
            em_tensor *want = em_cast(ops[k].f(em_cast(x, EM_F32)), dts[d]);
            size_t bytes = (size_t)(R * C) * em_dtype_size(dts[d]);
            CHECK(y && ys && want && em_dtype_of(y) == dts[d]);
            CHECK(!memcmp(em_data(y), em_data(ys), bytes));
            CHECK(!memcmp(em_data(y), em_data(want), bytes));
            CHECK_OK(em_backward(y, g));
            /* g strided for xs too: each input gathered through its own iterator */
            CHECK_OK(em_backward(ys, em_transpose(em_contiguous(em_transpose(g, 0, 1)), 0, 1)));
            /* compared through a copy, whatever layout xs's gradient has */
            CHECK(!memcmp(em_data(em_grad(x)), em_data(em_contiguous(em_grad(xs))), bytes));
            em_scope_end(s);
        }
}
