/* test_amp.c — mixed precision: the autocast policy, casting round trips,
 * bf16 / f16 matmul against f32, the loss scaler's rules, and the
 * Accelerator's fp16 / bf16 training (an overflow skipped on every rank with
 * the weights untouched, the scale's growth, a resume keeping the scale,
 * a tiny GPT within 2% of f32 with f32 master weights). */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"

static float f32_at(em_tensor *t, int64_t i) { return ((float *)em_data(t))[i]; }

/* ---- the policy ------------------------------------------------------------------ */

TEST(test_autocast_follows_the_policy_table)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(3);
    em_tensor *w = em_randn(EM_F32, EM_SHAPE(4, 3), &r), *x = em_randn(EM_F32, EM_SHAPE(2, 4), &r);
    em_set_requires_grad(w, true);
    CHECK(em_autocast_dtype() == EM_F32);
    em_dtype prev = em_autocast_set(EM_BF16);
    CHECK(prev == EM_F32 && em_autocast_dtype() == EM_BF16);
    em_tensor *y = em_matmul(x, w); /* LOW: bf16 out */
    CHECK(em_dtype_of(y) == EM_BF16);
    em_tensor *p = em_softmax(y, -1); /* F32 */
    CHECK(em_dtype_of(p) == EM_F32);
    CHECK(em_dtype_of(em_add(y, x ? em_zeros(EM_F32, EM_SHAPE(2, 3)) : NULL)) == EM_F32); /* PROMOTE */
    CHECK(em_dtype_of(em_layer_norm(y, NULL, NULL, 1e-5)) == EM_F32);
    em_tensor *loss = em_sum(em_mul(p, p), 0, NULL, false);
    CHECK(em_autocast_set(prev) == EM_BF16);
    CHECK_OK(em_backward(loss, NULL));
    CHECK(em_dtype_of(em_grad(w)) == EM_F32); /* the master's gradient arrives in f32 */
    CHECK(em_dtype_of(em_matmul(x, w)) == EM_F32); /* off again */
    /* a bad dtype keeps the setting */
    CHECK(em_autocast_set(EM_I32) == EM_F32);
    CHECK(em_last_status() == EM_ERR_DTYPE && em_autocast_dtype() == EM_F32);
    em_scope_end(s);
}

/* A GPT without biases under bf16 autocast: the MLP's GELU keeps the first
 * Linear's bf16 output (no bias add promotes it), and the second Linear
 * takes it over its f32 weight. It used to fail the Linear's dtype check. */
TEST(test_a_gpt_without_biases_trains_under_bf16_autocast)
{
    em_gpt_config c = {.vocab_size = 16, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16, .bias = false};
    em_gpt *g = em_gpt_new(&c, 3);
    CHECK_NOTNULL(g);
    em_scope sc = em_scope_begin();
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (i * 5) % 16;
    em_tensor *x = em_from_data(EM_I32, EM_SHAPE(2, 8), tok), *y = em_from_data(EM_I32, EM_SHAPE(2, 8), tok);
    em_dtype prev = em_autocast_set(EM_BF16);
    em_tensor *loss = em_gpt_loss(g, x, y);
    em_autocast_set(prev);
    CHECK_NOTNULL(loss);
    CHECK(isfinite(em_item(loss)));
    CHECK_OK(em_backward(loss, NULL));
    em_scope_end(sc);
    em_gpt_free(g);
}

TEST(test_amp_policy_can_be_overridden_per_op)
{
    CHECK(em_amp_policy_of("softmax") == EM_AMP_F32 && em_amp_policy_of("matmul") == EM_AMP_LOW);
    CHECK(em_amp_policy_of("relu") == EM_AMP_NONE);
    CHECK_ERR(em_amp_set_policy("relu", EM_AMP_F32), EM_ERR_ARG, "'relu' is not an op of the autocast table");
    CHECK_OK(em_amp_set_policy("matmul", EM_AMP_NONE)); /* matmul left in f32 */
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2, 2));
    em_dtype prev = em_autocast_set(EM_F16);
    CHECK(em_dtype_of(em_matmul(a, a)) == EM_F32);
    em_autocast_set(prev);
    em_scope_end(s);
    CHECK_OK(em_amp_set_policy("matmul", EM_AMP_LOW));
}

/* The dispatcher's autocast casts with t_cast, and keeps a transposed weight's
 * layout with t_transpose (a permute): were these ops autocast themselves,
 * each cast would start another without end. */
TEST(test_amp_policy_cannot_be_set_on_the_ops_autocast_calls_itself)
{
    const char *ops[] = {"cast", "transpose", "permute"};
    for (int i = 0; i < 3; i++) {
        CHECK(em_amp_policy_of(ops[i]) == EM_AMP_NONE);
        CHECK_ERR(em_amp_set_policy(ops[i], EM_AMP_LOW), EM_ERR_ARG, "is not an op of the autocast table");
        CHECK(em_amp_policy_of(ops[i]) == EM_AMP_NONE);
    }
}

/* ---- casts and products ------------------------------------------------------------ */

TEST(test_casts_round_trip_within_the_dtypes_precision)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(5);
    int64_t n = 10000;
    em_tensor *x = em_mul_scalar(em_randn(EM_F32, 1, &n, &r), 100.0);
    const em_dtype low[] = {EM_BF16, EM_F16};
    const double rel[] = {1.0 / 256, 1.0 / 2048}; /* half an ulp: 2^-9 and 2^-12, doubled for safety */
    for (int d = 0; d < 2; d++) {
        em_tensor *back = em_cast(em_cast(x, low[d]), EM_F32);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            double e = fabs(f32_at(back, i) - f32_at(x, i)) / fabs(f32_at(x, i));
            worst = e > worst ? e : worst;
        }
        if (!(worst <= rel[d]))
            th_fail(__FILE__, __LINE__, "%s round trip: worst relative error %g > %g", em_dtype_name(low[d]), worst,
                    rel[d]);
        /* exactly representable values survive unchanged, specials too */
        em_tensor *sp = em_from_data(EM_F32, EM_SHAPE(6), (float[]){0.0f, -0.0f, 1.5f, -2.0f, INFINITY, NAN});
        em_tensor *b2 = em_cast(em_cast(sp, low[d]), EM_F32);
        CHECK(f32_at(b2, 0) == 0 && signbit(f32_at(b2, 1)) && f32_at(b2, 2) == 1.5f && f32_at(b2, 3) == -2.0f);
        CHECK(isinf(f32_at(b2, 4)) && isnan(f32_at(b2, 5)));
    }
    em_scope_end(s);
}

/* (M,K)@(K,N) in dt against f64 on the same (rounded) inputs: the error is the
 * output's rounding (and f32 accumulation), not the inputs'. */
static void low_matmul_matches(em_dtype dt, int64_t M, int64_t K, int64_t N, bool trans_b)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new((uint64_t)(M * 131 + K * 7 + N));
    em_tensor *a = em_cast(em_randn(EM_F32, EM_SHAPE(M, K), &r), dt);
    em_tensor *b = trans_b ? em_transpose(em_cast(em_randn(EM_F32, EM_SHAPE(N, K), &r), dt), 0, 1)
                           : em_cast(em_randn(EM_F32, EM_SHAPE(K, N), &r), dt);
    em_tensor *got = em_cast(em_matmul(a, b), EM_F32);
    em_tensor *want = em_matmul(em_cast(a, EM_F64), em_cast(b, EM_F64));
    CHECK(em_dtype_of(em_matmul(a, b)) == dt);
    double ulp = dt == EM_BF16 ? 1.0 / 128 : 1.0 / 1024, tol_abs = 1e-4 * sqrt((double)K);
    for (int64_t i = 0; i < M * N; i++) {
        double w = ((double *)em_data(want))[i], g = f32_at(got, i);
        if (!(fabs(g - w) <= ulp * fabs(w) + tol_abs))
            th_fail(__FILE__, __LINE__, "%s matmul %lldx%lld@%lldx%lld%s: [%lld] = %g, want %g", em_dtype_name(dt),
                    (long long)M, (long long)K, (long long)K, (long long)N, trans_b ? " (b transposed)" : "",
                    (long long)i, g, w);
    }
    em_scope_end(s);
}

TEST(test_bf16_and_f16_matmul_match_f64_within_their_rounding)
{
    const em_dtype dts[] = {EM_BF16, EM_F16};
    for (int d = 0; d < 2; d++) {
        low_matmul_matches(dts[d], 1, 1, 1, false);
        low_matmul_matches(dts[d], 37, 70, 45, false); /* edges in every direction */
        low_matmul_matches(dts[d], 37, 70, 45, true);
        low_matmul_matches(dts[d], 64, 768, 100, true); /* a Linear's shape */
        low_matmul_matches(dts[d], 33, 31, 600, false); /* past one packed block of columns */
    }
}

/* A batch of transposed f16/bf16 matrices (converted to f32 in memory order,
 * keeping the layout) gives the products of the same values in f64. */
TEST(test_low_precision_batched_transposed_matmul_keeps_the_layout_right)
{
    const em_dtype dts[] = {EM_BF16, EM_F16};
    for (int d = 0; d < 2; d++) {
        em_scope s = em_scope_begin();
        em_rng r = em_rng_new(11);
        em_tensor *a = em_cast(em_randn(EM_F32, EM_SHAPE(3, 5, 7), &r), dts[d]);
        em_tensor *b = em_transpose(em_cast(em_randn(EM_F32, EM_SHAPE(3, 6, 7), &r), dts[d]), 1, 2);
        em_tensor *got = em_cast(em_matmul(a, b), EM_F64);
        em_tensor *want = em_matmul(em_cast(a, EM_F64), em_cast(b, EM_F64));
        CHECK(got && want);
        for (int64_t i = 0; i < 3 * 5 * 6; i++) {
            double w = ((double *)em_data(want))[i], g = ((double *)em_data(got))[i];
            if (!(fabs(g - w) <= fabs(w) / 128 + 1e-3))
                th_fail(__FILE__, __LINE__, "%s [%lld] = %g, want %g", em_dtype_name(dts[d]), (long long)i, g, w);
        }
        em_scope_end(s);
    }
}

TEST(test_bf16_matmul_without_amx_goes_through_f32)
{
    setenv("EMBER_NO_AMX", "1", 1); /* read once per process, at the first bf16 product */
    low_matmul_matches(EM_BF16, 37, 70, 45, true);
    low_matmul_matches(EM_BF16, 64, 768, 100, false);
    unsetenv("EMBER_NO_AMX");
}

/* ---- the scaler ------------------------------------------------------------------------ */

TEST(test_scaler_backs_off_on_overflow_and_grows_after_the_interval)
{
    CHECK_ERR(em_grad_scaler_new(&(em_scaler_config){.backoff_factor = 2}), EM_ERR_ARG, "backoff_factor 2");
    CHECK_ERR(em_grad_scaler_new(&(em_scaler_config){.growth_interval = -1}), EM_ERR_ARG, "growth_interval");
    em_grad_scaler *s = em_grad_scaler_new(&(em_scaler_config){.growth_interval = 2});
    CHECK_NOTNULL(s);
    CHECK(em_scaler_get_scale(s) == 65536.0);
    em_scope sc = em_scope_begin();
    em_tensor *p = em_ones(EM_F32, EM_SHAPE(3));
    em_set_requires_grad(p, true);
    /* a clean step: the gradient comes back divided by the scale */
    CHECK_OK(em_backward(em_scaler_scale(s, em_sum(em_mul_scalar(p, 2.0), 0, NULL, false)), NULL));
    CHECK(f32_at(em_grad(p), 0) == 2.0f * 65536.0f);
    CHECK_OK(em_scaler_unscale(s, 1, &p, NULL));
    CHECK_OK(em_scaler_unscale(s, 1, &p, NULL)); /* once per step */
    CHECK(f32_at(em_grad(p), 0) == 2.0f && !em_scaler_found_inf(s));
    em_scaler_update(s);
    CHECK(em_scaler_get_scale(s) == 65536.0);
    /* an overflow: found, and the scale halves */
    ((float *)em_data(em_grad(p)))[1] = INFINITY;
    CHECK_OK(em_scaler_unscale(s, 1, &p, NULL));
    CHECK(em_scaler_found_inf(s));
    em_scaler_update(s);
    CHECK(em_scaler_get_scale(s) == 32768.0);
    /* two clean steps: it doubles */
    for (int i = 0; i < 2; i++) {
        ((float *)em_data(em_grad(p)))[1] = 1.0f;
        CHECK_OK(em_scaler_unscale(s, 1, &p, NULL));
        em_scaler_update(s);
    }
    CHECK(em_scaler_get_scale(s) == 65536.0);
    CHECK_ERR(em_scaler_set_state(s, (em_scaler_state){-1, 0}), EM_ERR_ARG, "scale -1");
    CHECK_OK(em_scaler_set_state(s, (em_scaler_state){1024, 1}));
    CHECK(em_scaler_get_state(s).scale == 1024 && em_scaler_get_state(s).growth_tracker == 1);
    em_scope_end(sc);
    em_grad_scaler_free(s);
}

/* unscale splits the work over the pool: gradients of up to 64K elements
 * one per task, larger ones by elements. Every element comes back as g *
 * (1/scale) rounded as grad_scale_elem rounds it, whichever task took it,
 * and an inf or NaN anywhere is found: in a small gradient among many, or
 * near the end of a large one (a range the caller's thread may not run). */
TEST(test_scaler_unscale_split_over_threads_scales_every_element_and_finds_any_overflow)
{
    enum { NP = 21 };
    const int64_t sizes[NP] = {3, 70000, 65536, 1, 300000, 7,  128, 65537, 5,  9, 1000,
                               2, 4,     6,     8, 10,     12, 14,  16,    18, 20};
    for (int where = -1; where < 3; where++) { /* no overflow, then in a small one, a large one, f16 */
        th_case("overflow at %d", where);
        em_grad_scaler *s = em_grad_scaler_new(NULL);
        CHECK_NOTNULL(s);
        em_scope sc = em_scope_begin();
        em_rng r = em_rng_new(61);
        em_tensor *p[NP], *want[NP];
        for (int i = 0; i < NP; i++) {
            em_dtype dt = i == 20 ? EM_F16 : EM_F32;
            p[i] = em_zeros(dt, EM_SHAPE(sizes[i]));
            CHECK_OK(em_set_requires_grad(p[i], true));
            em_tensor *g = em_cast(
                em_mul_scalar(em_randn(EM_F32, EM_SHAPE(sizes[i]), &r), dt == EM_F16 ? 1000.0 : 65536.0), dt);
            CHECK_OK(em_backward(em_sum(em_mul(p[i], g), 0, NULL, false), NULL)); /* p's gradient is g */
            float *w = em_data(want[i] = em_contiguous(em_cast(g, EM_F32)));
            for (int64_t k = 0; k < sizes[i]; k++)
                w[k] = dt == EM_F16 ? em_f16_to_f32(em_f32_to_f16(w[k] * (float)(1.0 / 65536)))
                                    : w[k] * (float)(1.0 / 65536);
        }
        if (where == 0) ((float *)em_data(em_grad(p[9])))[8] = NAN;
        if (where == 1) ((float *)em_data(em_grad(p[4])))[299999] = -INFINITY;
        if (where == 2) ((uint16_t *)em_data(em_grad(p[20])))[19] = 0x7c00; /* f16 inf */
        CHECK_OK(em_scaler_unscale(s, NP, p, NULL));
        CHECK(em_scaler_found_inf(s) == (where >= 0));
        for (int i = 0; where < 0 && i < NP; i++) {
            em_tensor *got = em_cast(em_grad(p[i]), EM_F32);
            CHECK(!memcmp(em_data(got), em_data(want[i]), (size_t)sizes[i] * 4));
        }
        em_scope_end(sc);
        em_grad_scaler_free(s);
    }
}

/* NP parameters whose gradients are seed's values times 65536 (a scaled
 * loss's; the last one's, of dtype dt, times 1000), some of them so small
 * that unscaled they are subnormal. */
enum { UC_NP = 6 };
static const int64_t uc_sizes[UC_NP] = {3, 70000, 65536, 300001, 9, 40};
static void uc_params(em_tensor **p, uint64_t seed, em_dtype dt)
{
    em_rng r = em_rng_new(seed);
    for (int i = 0; i < UC_NP; i++) {
        em_dtype d = i == UC_NP - 1 ? dt : EM_F32;
        p[i] = em_zeros(d, EM_SHAPE(uc_sizes[i]));
        CHECK_OK(em_set_requires_grad(p[i], true));
        em_tensor *g = em_contiguous(/* (an f16 one within f16's range) */
                                     em_mul_scalar(em_randn(EM_F32, EM_SHAPE(uc_sizes[i]), &r),
                                                   d == EM_F16 ? 1000.0 : 65536.0));
        for (int64_t k = 0; k < uc_sizes[i]; k += 97)
            ((float *)em_data(g))[k] *= 3e-40f; /* subnormal / 65536 */
        CHECK_OK(em_backward(em_sum(em_mul(p[i], em_cast(g, d)), 0, NULL, false), NULL)); /* grad = g */
    }
}

/* em_scaler_unscale_clip gives what em_scaler_unscale and then
 * em_clip_grad_norm_with give, to the bit: the norm, the finding and every
 * gradient element (subnormal ones too, which a fused factor inv * c would
 * round otherwise), whether the clip scales or not, with an inf or NaN
 * (only unscaled, INFINITY), and where it takes the two calls themselves
 * (an f16 gradient, the inf-norm), or only clips (already unscaled). */
TEST(test_scaler_unscale_clip_gives_the_bits_of_unscale_then_clip)
{
    const struct {
        double max_norm, norm_type;
        int poison; /* 0 none, 1 a NaN in a small gradient, 2 an inf in a large one */
        em_dtype last;
        bool unscaled_first;
    } cases[] = {
        {1.0, 0, 0, EM_F32, false}, {1e9, 0, 0, EM_F32, false}, {1.0, 0, 1, EM_F32, false},
        {1.0, 0, 2, EM_F32, false}, {1.0, 0, 0, EM_F16, false}, {1.0, INFINITY, 0, EM_F32, false},
        {1.0, 0, 0, EM_F32, true},  {0.5, 2, 0, EM_F32, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        th_case("case %zu", c);
        em_clip_config cfg = {.max_norm = cases[c].max_norm, .norm_type = cases[c].norm_type};
        em_scope sc = em_scope_begin();
        em_tensor *a[UC_NP], *b[UC_NP];
        uc_params(a, 70 + c, cases[c].last);
        uc_params(b, 70 + c, cases[c].last);
        if (cases[c].poison) {
            em_tensor **ps[2] = {a, b};
            for (int k = 0; k < 2; k++)
                if (cases[c].poison == 1)
                    ((float *)em_data(em_grad(ps[k][4])))[5] = NAN;
                else
                    ((float *)em_data(em_grad(ps[k][3])))[300000] = INFINITY;
        }
        em_grad_scaler *sa = em_grad_scaler_new(NULL), *sb = em_grad_scaler_new(NULL);
        CHECK_NOTNULL(sa);
        CHECK_NOTNULL(sb);
        em_status st;
        CHECK_OK(em_scaler_unscale(sa, UC_NP, a, NULL));
        double want = em_scaler_found_inf(sa) ? INFINITY : em_clip_grad_norm_with(UC_NP, a, &cfg, &st);
        if (cases[c].unscaled_first) CHECK_OK(em_scaler_unscale(sb, UC_NP, b, NULL));
        double got = em_scaler_unscale_clip(sb, UC_NP, b, &cfg, NULL, &st);
        CHECK_OK(st);
        CHECK(em_scaler_found_inf(sb) == em_scaler_found_inf(sa));
        CHECK(em_scaler_found_inf(sb) == (cases[c].poison != 0));
        CHECK(!memcmp(&got, &want, sizeof got));
        CHECK(cases[c].poison || (isfinite(got) && got > 1));
        for (int i = 0; i < UC_NP; i++) {
            size_t bytes = (size_t)uc_sizes[i] * em_dtype_size(em_dtype_of(a[i]));
            CHECK(!memcmp(em_data(em_grad(a[i])), em_data(em_grad(b[i])), bytes));
        }
        /* once per step: a second call only clips (nothing left to scale) */
        if (!cases[c].poison) {
            double again = em_scaler_unscale_clip(sb, UC_NP, b, &cfg, NULL, &st);
            CHECK_OK(st);
            CHECK(again <= fmin(got, cfg.max_norm) * 1.000001);
        }
        em_grad_scaler_free(sa);
        em_grad_scaler_free(sb);
        em_scope_end(sc);
    }
    em_status st = EM_OK;
    CHECK_ERR(em_scaler_unscale_clip(NULL, 0, NULL, &(em_clip_config){.max_norm = 1}, NULL, &st), EM_ERR_ARG,
              "scaler is NULL");
    CHECK(st == EM_ERR_ARG);
    em_grad_scaler *s = em_grad_scaler_new(NULL);
    CHECK_ERR(em_scaler_unscale_clip(s, 0, NULL, &(em_clip_config){.max_norm = -1}, NULL, &st), EM_ERR_ARG,
              "max_norm");
    CHECK(st == EM_ERR_ARG);
    em_grad_scaler_free(s);
}

/* ---- the Accelerator ------------------------------------------------------------------------ */

static void no_user_config(void)
{
    th_no_user_config();
    unsetenv("EMBER_MIXED_PRECISION");
    unsetenv("EMBER_GRAD_ACCUM");
}

typedef struct small_run {
    em_accelerator *acc;
    em_module *m;
    em_nn_linear *lin;
    em_optimizer *opt;
    em_tensor *params[2];
} small_run;

static void small_setup(small_run *r, em_precision_kind mp, int growth_interval)
{
    r->acc = em_accelerator_new(&(em_accel_config){.mixed_precision = mp, .scaler.growth_interval = growth_interval});
    CHECK_NOTNULL(r->acc);
    em_rng rng = em_rng_new(11);
    r->m = em_module_new(NULL, "m");
    r->lin = em_nn_linear_new(r->m, "lin", 8, 4, true, &rng);
    CHECK_NOTNULL(r->lin);
    r->params[0] = r->lin->weight;
    r->params[1] = r->lin->bias;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-2;
    r->opt = em_adamw_new(2, r->params, &ac);
    CHECK_OK(em_accel_prepare(r->acc, r->m, r->opt, NULL, NULL));
}

static void small_free(small_run *r)
{
    em_accelerator_free(r->acc);
    em_optim_free(r->opt);
    em_module_free(r->m);
}

/* one step; rank `poison` (or -1: none) puts an inf into its gradient after backward */
static void small_step(small_run *r, int step, int poison)
{
    em_scope s = em_scope_begin();
    em_rng rng = em_rng_new(100 + (uint64_t)step * 10 + (uint64_t)em_accel_rank(r->acc));
    em_accel_accumulate(r->acc); /* the micro-step's forward autocasts */
    CHECK(em_autocast_dtype() == EM_F16);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(5, 8), &rng);
    em_tensor *h = em_nn_linear_forward(r->lin, x), *loss = em_mean(em_mul(h, h), 0, NULL, false);
    CHECK_OK(em_accel_backward(r->acc, loss));
    if (em_accel_rank(r->acc) == poison) ((float *)em_data(em_grad(r->params[0])))[3] = INFINITY;
    em_status st;
    em_accel_clip_grad_norm(r->acc, 1.0, &st);
    CHECK_OK(st);
    CHECK_OK(em_accel_step(r->acc));
    CHECK_OK(em_accel_zero_grad(r->acc));
    em_scope_end(s);
}

static void overflow_everywhere(int rank, int world, void *ctx)
{
    (void)rank, (void)world, (void)ctx;
    no_user_config();
    small_run r;
    small_setup(&r, EM_PREC_FP16, 3);
    /* prepare alone turns nothing on: only the training step's forward autocasts */
    CHECK(em_accel_autocast_dtype(r.acc) == EM_F16 && em_autocast_dtype() == EM_F32);
    CHECK_NOTNULL(em_accel_scaler(r.acc));
    small_step(&r, 0, -1);
    CHECK(em_accel_step_count(r.acc) == 1 && !em_accel_step_was_skipped(r.acc));
    float before[32]; /* the (4,8) weight */
    memcpy(before, em_data(r.params[0]), sizeof before);
    small_step(&r, 1, 1); /* only rank 1's gradient overflows */
    CHECK(em_accel_step_was_skipped(r.acc));
    CHECK(em_accel_step_count(r.acc) == 1); /* the schedule did not move */
    CHECK(memcmp(before, em_data(r.params[0]), sizeof before) == 0); /* weights untouched */
    CHECK(em_scaler_get_scale(em_accel_scaler(r.acc)) == 32768.0);
    for (int i = 2; i < 5; i++) small_step(&r, i, -1); /* 3 clean steps: the scale doubles */
    CHECK(em_scaler_get_scale(em_accel_scaler(r.acc)) == 65536.0 && em_accel_step_count(r.acc) == 4);
    CHECK(em_dtype_of(r.params[0]) == EM_F32); /* the masters stay f32 */
    small_free(&r);
    CHECK(em_autocast_dtype() == EM_F32); /* freeing the Accelerator turned autocast off */
}

TEST(test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank)
{
    TH_RANKS_ENV(2, overflow_everywhere, NULL);
}

TEST(test_fp16_resume_continues_with_the_same_scale)
{
    no_user_config();
    unsetenv("WORLD_SIZE");
    char dir[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-amp");
    small_run r;
    small_setup(&r, EM_PREC_FP16, 2000);
    small_step(&r, 0, -1);
    small_step(&r, 1, 0); /* an overflow: scale 32768 */
    small_step(&r, 2, -1);
    em_scaler_state st = em_scaler_get_state(em_accel_scaler(r.acc));
    CHECK(st.scale == 32768.0 && st.growth_tracker == 1);
    CHECK_OK(em_accel_save_state(r.acc, dir));
    small_free(&r);
    small_setup(&r, EM_PREC_FP16, 2000);
    CHECK_OK(em_accel_load_state(r.acc, dir));
    em_scaler_state back = em_scaler_get_state(em_accel_scaler(r.acc));
    CHECK(back.scale == st.scale && back.growth_tracker == st.growth_tracker);
    small_free(&r);
    /* a run without fp16 refuses the state, saying why */
    small_setup(&r, EM_PREC_BF16, 0);
    CHECK_ERR(em_accel_load_state(r.acc, dir), EM_ERR_ARG, "loss scaler");
    small_free(&r);
}

/* A tiny GPT on a fixed Markov text: bf16 and fp16 reach f32's validation
 * loss within 2% after the same steps. */
static void markov(int32_t *seq, int64_t n, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    em_tensor *u = em_rand(EM_F32, 1, &n, &r);
    int32_t s = 0;
    for (int64_t i = 0; i < n; i++) { /* next = (3 s + 1) mod 16 mostly, else a jump */
        float v = f32_at(u, i);
        s = v < 0.8f ? (3 * s + 1) % 16 : (int32_t)(v * 1000) % 16;
        seq[i] = s;
    }
    em_free(u);
}

static double train_gpt(em_precision_kind mp)
{
    no_user_config();
    unsetenv("WORLD_SIZE");
    enum { T = 16, B = 8, STEPS = 120, N = 4000 };
    static int32_t seq[N];
    markov(seq, N, 9);
    em_gpt_config cfg = {.vocab_size = 16, .block_size = T, .n_layer = 2, .n_head = 2, .n_embd = 32, .bias = true};
    em_gpt *g = em_gpt_new(&cfg, 1);
    CHECK_NOTNULL(g);
    em_accelerator *acc = em_accelerator_new(&(em_accel_config){.mixed_precision = mp});
    CHECK_NOTNULL(acc);
    int n = em_module_params(g->m, NULL, 0);
    em_named *named = malloc(sizeof *named * (size_t)n);
    em_tensor **ps = malloc(sizeof *ps * (size_t)n);
    em_module_params(g->m, named, n);
    for (int i = 0; i < n; i++) ps[i] = named[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 3e-3;
    em_optimizer *opt = em_adamw_new(n, ps, &ac);
    CHECK_OK(em_accel_prepare(acc, g->m, opt, NULL, NULL));
    em_rng rng = em_rng_new(21);
    int32_t xb[B * T], yb[B * T];
    for (int step = 0; step <= STEPS; step++) {
        bool eval = step == STEPS;
        if (eval) /* an evaluation forward, marked */
            CHECK_OK(em_accel_autocast_begin(acc));
        else /* the training step's forward autocasts from here until backward */
            em_accel_accumulate(acc);
        em_scope s = em_scope_begin();
        for (int b = 0; b < B; b++) { /* train on the first 3/4, evaluate on the rest */
            em_tensor *u = em_rand(EM_F32, EM_SHAPE(1), &rng);
            int64_t lo = eval ? 3 * N / 4 + b * 100 : 0, span = eval ? 1 : 3 * N / 4 - T - 1;
            int64_t st = lo + (eval ? 0 : (int64_t)(f32_at(u, 0) * (float)span));
            for (int t = 0; t < T; t++) {
                xb[b * T + t] = seq[st + t];
                yb[b * T + t] = seq[st + t + 1];
            }
        }
        em_tensor *x = em_from_data(EM_I32, EM_SHAPE(B, T), xb), *y = em_from_data(EM_I32, EM_SHAPE(B, T), yb);
        em_tensor *loss = em_gpt_loss(g, x, y);
        CHECK_NOTNULL(loss);
        if (eval) {
            double v = em_item(loss);
            em_scope_end(s);
            CHECK_OK(em_accel_autocast_end(acc));
            for (int i = 0; i < n; i++) CHECK(em_dtype_of(ps[i]) == EM_F32); /* masters stay f32 */
            em_accelerator_free(acc);
            em_optim_free(opt);
            free(ps);
            free(named);
            em_gpt_free(g);
            return v;
        }
        CHECK_OK(em_accel_backward(acc, loss));
        em_status st;
        em_accel_clip_grad_norm(acc, 1.0, &st);
        CHECK_OK(st);
        CHECK_OK(em_accel_step(acc));
        CHECK_OK(em_accel_zero_grad(acc));
        em_scope_end(s);
    }
    return NAN;
}

TEST(test_bf16_and_fp16_training_track_f32_within_2_percent)
{
    double f32 = train_gpt(EM_PREC_NO), bf16 = train_gpt(EM_PREC_BF16), fp16 = train_gpt(EM_PREC_FP16);
    if (!(f32 < 2.0)) th_fail(__FILE__, __LINE__, "f32 did not learn: val loss %g (chance is 2.77)", f32);
    if (!(fabs(bf16 - f32) <= 0.02 * f32) || !(fabs(fp16 - f32) <= 0.02 * f32))
        th_fail(__FILE__, __LINE__, "val loss f32 %g, bf16 %g, fp16 %g: not within 2%%", f32, bf16, fp16);
}
