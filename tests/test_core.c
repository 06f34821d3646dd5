/* test_core.c — creation, metadata, dtypes and conversions, RNG. */
#include "harness.h"
#include "tensor/error_impl.h"

TEST(test_zeros_has_shape_and_zero_values)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(2, 3));
    CHECK_NOTNULL(t);
    CHECK(em_ndim(t) == 2 && em_size(t, 0) == 2 && em_size(t, -1) == 3);
    CHECK(em_numel(t) == 6);
    CHECK_VALUES(t, 0, 0, 0, 0, 0, 0, 0);
    em_scope_end(s);
}

/* ---- creation ---------------------------------------------------------------- */

TEST(test_ones_full_and_scalar_fill_values)
{
    em_scope s = em_scope_begin();
    CHECK_VALUES(em_ones(EM_F64, EM_SHAPE(3)), 0, 1, 1, 1);
    em_tensor *f = em_full(EM_I32, EM_SHAPE(2, 2), -7.9);
    CHECK(em_dtype_of(f) == EM_I32);
    CHECK_VALUES(f, 0, -7, -7, -7, -7);
    CHECK_VALUES(em_full(EM_F16, EM_SHAPE(2), 0.1), 0, em_f16_to_f32(em_f32_to_f16(0.1f)),
                 em_f16_to_f32(em_f32_to_f16(0.1f)));
    em_tensor *sc = em_scalar(EM_F32, 2.5);
    CHECK(em_ndim(sc) == 0 && em_numel(sc) == 1);
    CHECK_NEAR(em_item(sc), 2.5, 0);
    CHECK(em_numel(em_zeros(EM_F32, EM_SHAPE(3, 0))) == 0);
    em_scope_end(s);
}

TEST(test_creation_rejects_bad_shapes)
{
    em_scope s = em_scope_begin();
    CHECK_ERR(em_zeros(EM_F32, EM_SHAPE(2, -1)), EM_ERR_SHAPE, "negative size -1 in shape (2,-1)");
    CHECK_ERR(em_ones(EM_F32, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}), EM_ERR_SHAPE, "9 dims; at most 8");
    CHECK_ERR(em_zeros(EM_NUM_DTYPES, EM_SHAPE(2)), EM_ERR_DTYPE, "invalid dtype 7");
    em_scope_end(s);
}

TEST(test_arange_counts_up_and_down)
{
    em_scope s = em_scope_begin();
    CHECK_VALUES(em_arange(0, 5, 1, EM_I32), 0, 0, 1, 2, 3, 4);
    em_tensor *f = em_arange(0, 1, 0.3, EM_F64);
    CHECK(em_numel(f) == 4);
    CHECK_VALUES(f, 1e-15, 0, 0.3, 0.6, 0.9);
    em_tensor *d = em_arange(5, 0, -1.5, EM_F32);
    CHECK(em_numel(d) == 4);
    CHECK_VALUES(d, 0, 5, 3.5, 2, 0.5);
    CHECK(em_numel(em_arange(3, 3, 1, EM_F32)) == 0);
    CHECK(em_numel(em_arange(3, 0, 1, EM_F32)) == 0); /* wrong direction: empty */
    CHECK_ERR(em_arange(0, 5, 0, EM_F32), EM_ERR_ARG, "em_arange: bad range start=0 end=5 step=0");
    CHECK_ERR(em_arange(0, INFINITY, 1, EM_F32), EM_ERR_ARG, "em_arange: bad range");
    em_scope_end(s);
}

TEST(test_from_data_copies_the_buffer)
{
    em_scope s = em_scope_begin();
    int32_t buf[6] = {1, -2, 3, -4, 5, -6};
    em_tensor *t = em_from_data(EM_I32, EM_SHAPE(3, 2), buf);
    buf[0] = 100; /* later writes to buf do not show */
    CHECK(em_dtype_of(t) == EM_I32 && em_size(t, 0) == 3 && em_size(t, 1) == 2);
    CHECK_VALUES(t, 0, 1, -2, 3, -4, 5, -6);
    CHECK_NEAR(em_get(t, (int64_t[]){2, 1}), -6, 0);
    CHECK_ERR(em_from_data(EM_F32, EM_SHAPE(2), NULL), EM_ERR_ARG, "em_from_data: data is NULL for f32(2,)");
    em_scope_end(s);
}

TEST(test_zeros_like_and_ones_like_keep_shape_and_dtype)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_transpose(em_full(EM_BF16, EM_SHAPE(2, 3), 4), 0, 1);
    em_tensor *z = em_zeros_like(a), *o = em_ones_like(a);
    CHECK(em_dtype_of(z) == EM_BF16 && em_dtype_of(o) == EM_BF16);
    CHECK(em_size(z, 0) == 3 && em_size(z, 1) == 2 && em_is_contiguous(z));
    CHECK_VALUES(z, 0, 0, 0, 0, 0, 0, 0);
    CHECK_VALUES(o, 0, 1, 1, 1, 1, 1, 1);
    em_scope_end(s);
}

/* ---- element access ------------------------------------------------------------ */

TEST(test_get_and_set_reject_out_of_range_index)
{
    em_scope s = em_scope_begin();
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(2, 3));
    CHECK_OK(em_set(t, (int64_t[]){1, 2}, 5));
    CHECK_NEAR(em_get(t, (int64_t[]){1, 2}), 5, 0);
    em_clear_error();
    CHECK(isnan(em_get(t, (int64_t[]){0, 3})));
    CHECK_ERR(em_get(t, (int64_t[]){0, 3}), EM_ERR_INDEX,
              "em_get: index 3 is out of range for dim 1 of size 3 (shape (2,3))");
    CHECK_ERR(em_get(t, (int64_t[]){-1, 0}), EM_ERR_INDEX, "em_get: index -1 is out of range for dim 0");
    CHECK(em_set(t, (int64_t[]){2, 0}, 1) == EM_ERR_INDEX);
    CHECK_ERR(em_set(t, (int64_t[]){2, 0}, 1), EM_ERR_INDEX,
              "em_set: index 2 is out of range for dim 0 of size 2");
    CHECK_VALUES(t, 0, 0, 0, 0, 0, 0, 5); /* the failed set wrote nothing */
    CHECK_ERR(em_item(t), EM_ERR_SHAPE, "em_item: needs exactly one element, got f32(2,3)");
    em_scope_end(s);
}

/* ---- the thread's error ---------------------------------------------------------- */

/* Cleanup that fails on its own does not replace the error it cleans up
 * after, and em_err may be given the message it replaces (a prefix). */
TEST(test_a_held_error_comes_back_whole_after_cleanup_sets_another)
{
    char want[ERROR_BYTES - 1];
    memset(want, 'x', sizeof want - 1);
    want[sizeof want - 1] = '\0';
    memcpy(want, "first: ", 7);
    em_err(EM_ERR_IO, "%s", want);
    held_error h;
    error_hold(&h, em_last_status());
    em_err(EM_ERR_ARG, "cleanup: failed too");
    uint64_t seq = error_seq();
    CHECK(error_restore(&h) == EM_ERR_IO);
    CHECK(em_last_status() == EM_ERR_IO);
    CHECK(strlen(em_last_error()) == strlen(want) && !strcmp(em_last_error(), want));
    CHECK(error_seq() == seq + 1); /* a new error, as far as a layer that names itself can tell */
    error_hold(&h, EM_ERR_DIST);   /* the status to report may differ from the one set */
    CHECK(error_restore(&h) == EM_ERR_DIST && em_last_status() == EM_ERR_DIST);
    em_err(EM_ERR_SHAPE, "inner: (2,3)");
    em_err(em_last_status(), "outer: %s; and more", em_last_error());
    CHECK(!strcmp(em_last_error(), "outer: inner: (2,3); and more"));
    em_clear_error();
}

/* ---- f16 / bf16 conversions ---------------------------------------------------- */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TEST(test_f16_conversion_bit_patterns)
{
    CHECK(em_f32_to_f16(1.0f) == 0x3C00);
    CHECK(em_f32_to_f16(-2.0f) == 0xC000);
    CHECK(em_f32_to_f16(0.0f) == 0x0000 && em_f32_to_f16(-0.0f) == 0x8000);
    CHECK(em_f32_to_f16(65504.0f) == 0x7BFF); /* largest finite */
    CHECK(em_f32_to_f16(65519.0f) == 0x7BFF); /* below the midpoint to 2^16: rounds down */
    CHECK(em_f32_to_f16(65520.0f) == 0x7C00); /* the midpoint ties to even = inf */
    CHECK(em_f32_to_f16(1e10f) == 0x7C00 && em_f32_to_f16(-1e10f) == 0xFC00);
    CHECK(em_f32_to_f16(INFINITY) == 0x7C00);
    CHECK(em_f32_to_f16(ldexpf(1, -14)) == 0x0400);                         /* smallest normal */
    CHECK(em_f32_to_f16(ldexpf(1, -24)) == 0x0001);                         /* smallest subnormal */
    CHECK(em_f32_to_f16(ldexpf(1, -25)) == 0x0000);                         /* half of it: tie to even 0 */
    CHECK(em_f32_to_f16(ldexpf(3, -26)) == 0x0001);                         /* 0.75 units: up */
    CHECK(em_f32_to_f16(ldexpf(3, -25)) == 0x0002);                         /* 1.5 units: tie to even 2 */
    CHECK(em_f32_to_f16(ldexpf(5, -25)) == 0x0002);                         /* 2.5 units: tie to even 2 */
    CHECK(em_f32_to_f16(ldexpf(1023, -24)) == 0x03FF);                      /* largest subnormal */
    CHECK(em_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3C00);                  /* tie: 1.0 (even) */
    CHECK(em_f32_to_f16(1.0f + ldexpf(3, -11)) == 0x3C02);                  /* tie: 1 + 2^-9 (even) */
    CHECK(em_f32_to_f16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)) == 0x3C01); /* past the tie: up */
    CHECK(em_f32_to_f16(ldexpf(2047, -25)) == 0x0400); /* largest subnormal + rounding carries into normal */
}

TEST(test_f16_to_f32_is_exact)
{
    CHECK(em_f16_to_f32(0x3C00) == 1.0f);
    CHECK(em_f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(em_f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(em_f16_to_f32(0x83FF) == -ldexpf(1023, -24));
    CHECK(em_f16_to_f32(0x0400) == ldexpf(1, -14));
    CHECK(em_f16_to_f32(0xFC00) == -INFINITY);
    CHECK(signbit(em_f16_to_f32(0x8000)) && em_f16_to_f32(0x8000) == 0);
    /* every finite f16 survives the round trip f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00) continue;
        if (em_f32_to_f16(em_f16_to_f32((uint16_t)h)) != h)
            th_fail(__FILE__, __LINE__, "f16 0x%04x does not round trip", h);
    }
}

TEST(test_half_conversions_keep_nan)
{
    float nans[] = {NAN, -NAN, bits_f32(0x7F800001u), bits_f32(0x7FC00000u), bits_f32(0xFF800100u)};
    for (int i = 0; i < 5; i++) {
        uint16_t h = em_f32_to_f16(nans[i]), b = em_f32_to_bf16(nans[i]);
        CHECK((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0);
        CHECK((b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0);
        CHECK(isnan(em_f16_to_f32(h)) && isnan(em_bf16_to_f32(b)));
    }
    CHECK(isnan(em_f16_to_f32(0x7E00)) && isnan(em_bf16_to_f32(0x7FC0)));
}

TEST(test_bf16_conversion_bit_patterns)
{
    CHECK(em_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(em_f32_to_bf16(-2.0f) == 0xC000);
    CHECK(em_f32_to_bf16(1.0f + ldexpf(1, -8)) == 0x3F80);                  /* tie: 1.0 (even) */
    CHECK(em_f32_to_bf16(1.0f + ldexpf(3, -8)) == 0x3F82);                  /* tie: 1 + 2^-6 (even) */
    CHECK(em_f32_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)) == 0x3F81); /* past the tie */
    CHECK(em_f32_to_bf16(bits_f32(0x7F7FFFFFu)) == 0x7F80);                 /* FLT_MAX rounds up to inf */
    CHECK(em_f32_to_bf16(bits_f32(0x7F7F7FFFu)) == 0x7F7F); /* just below the midpoint stays finite */
    CHECK(em_f32_to_bf16(INFINITY) == 0x7F80 && em_f32_to_bf16(-INFINITY) == 0xFF80);
    CHECK(em_f32_to_bf16(bits_f32(0x00010000u)) == 0x0001); /* subnormals keep their top bits */
    CHECK(em_f32_to_bf16(bits_f32(0x00008000u)) == 0x0000); /* tie to even: 0 */
    CHECK(em_bf16_to_f32(0x3F80) == 1.0f && em_bf16_to_f32(0x4049) == bits_f32(0x40490000u));
}

TEST(test_tensor_cast_uses_round_to_nearest_even)
{
    em_scope s = em_scope_begin();
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(3), (double[]){1 + 1.0 / 2048, 65520, 1 + 3.0 / 256});
    em_tensor *h = em_cast(x, EM_F16), *b = em_cast(x, EM_BF16);
    uint16_t hv[3], bv[3];
    memcpy(hv, em_data(h), sizeof hv);
    memcpy(bv, em_data(b), sizeof bv);
    CHECK(hv[0] == 0x3C00 && hv[1] == 0x7C00);
    CHECK(bv[2] == 0x3F82);
    em_scope_end(s);
}

/* ---- random numbers ------------------------------------------------------------ */

enum { NR = 100000 };

typedef em_tensor *(*draw_fn)(em_dtype dt, em_rng *r);
static em_tensor *draw_rand(em_dtype dt, em_rng *r) { return em_rand(dt, EM_SHAPE(NR), r); }
static em_tensor *draw_randn(em_dtype dt, em_rng *r) { return em_randn(dt, EM_SHAPE(NR), r); }
static em_tensor *draw_randint(em_dtype dt, em_rng *r) { return em_randint(-50, 1000, dt, EM_SHAPE(NR), r); }

/* the same (seed, offset) gives bitwise-identical draws with 1, 2 and 5 threads */
static void same_across_threads(draw_fn f, em_dtype dt)
{
    em_scope s = em_scope_begin();
    em_tensor *out[3];
    int threads[3] = {1, 2, 5};
    for (int k = 0; k < 3; k++) {
        CHECK_OK(em_set_num_threads(threads[k]));
        em_rng r = {77, 3};
        out[k] = f(dt, &r);
        CHECK_NOTNULL(out[k]);
        CHECK(r.offset == 3 + NR / 4);
    }
    size_t nb = (size_t)NR * em_dtype_size(dt);
    CHECK(memcmp(em_data(out[0]), em_data(out[1]), nb) == 0);
    CHECK(memcmp(em_data(out[0]), em_data(out[2]), nb) == 0);
    em_scope_end(s);
}

TEST(test_rand_is_independent_of_thread_count) { same_across_threads(draw_rand, EM_F32); }
TEST(test_randn_is_independent_of_thread_count) { same_across_threads(draw_randn, EM_F64); }
TEST(test_randint_is_independent_of_thread_count) { same_across_threads(draw_randint, EM_I32); }

TEST(test_rng_offset_advances_and_replays)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(5);
    CHECK(r.seed == 5 && r.offset == 0);
    em_tensor *a = em_rand(EM_F32, EM_SHAPE(10), &r);
    CHECK(r.offset == 3); /* ceil(10 / 4) counters */
    em_rng saved = r;
    em_tensor *b = em_rand(EM_F32, EM_SHAPE(10), &r);
    CHECK(r.offset == 6);
    CHECK(th_max_abs_diff(a, b) > 0); /* a new offset gives new numbers */
    em_tensor *c = em_rand(EM_F32, EM_SHAPE(10), &saved);
    CHECK(th_max_abs_diff(b, c) == 0); /* saving {seed, offset} saves the generator */
    em_rng other = em_rng_new(6);
    CHECK(th_max_abs_diff(a, em_rand(EM_F32, EM_SHAPE(10), &other)) > 0);
    /* a prefix of a longer draw equals a shorter draw from the same state */
    em_rng p1 = em_rng_new(9), p2 = em_rng_new(9);
    em_tensor *lng = em_randn(EM_F64, EM_SHAPE(12), &p1), *shrt = em_randn(EM_F64, EM_SHAPE(8), &p2);
    CHECK(th_max_abs_diff(em_narrow(lng, 0, 0, 8), shrt) == 0);
    em_scope_end(s);
}

TEST(test_default_rng_follows_manual_seed)
{
    em_scope s = em_scope_begin();
    em_manual_seed(42);
    CHECK(em_default_rng()->seed == 42 && em_default_rng()->offset == 0);
    em_tensor *a = em_randn(EM_F32, EM_SHAPE(6), NULL);
    CHECK(em_default_rng()->offset == 2);
    em_rng r = em_rng_new(42);
    CHECK(th_max_abs_diff(a, em_randn(EM_F32, EM_SHAPE(6), &r)) == 0);
    em_manual_seed(42);
    CHECK(th_max_abs_diff(a, em_randn(EM_F32, EM_SHAPE(6), NULL)) == 0);
    em_scope_end(s);
}

static void moments(em_tensor *t, double *mean, double *var, double *lo, double *hi)
{
    int64_t n = em_numel(t);
    static double v[NR];
    CHECK(n <= NR);
    CHECK_OK(em_to_array(t, EM_F64, v));
    double s = 0, s2 = 0;
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        *lo = fmin(*lo, v[i]);
        *hi = fmax(*hi, v[i]);
    }
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *var = s2 / (double)(n - 1);
}

TEST(test_randn_has_mean_zero_and_variance_one)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(2024);
    double m, v, lo, hi;
    moments(em_randn(EM_F32, EM_SHAPE(NR), &r), &m, &v, &lo, &hi);
    CHECK_NEAR(m, 0, 0.015); /* std error 0.003 */
    CHECK_NEAR(v, 1, 0.03);  /* std error 0.0045 */
    CHECK(lo < -3.5 && hi > 3.5 && lo > -7 && hi < 7);
    em_scope_end(s);
}

TEST(test_rand_is_uniform_in_zero_one)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(1);
    double m, v, lo, hi;
    moments(em_rand(EM_F64, EM_SHAPE(NR), &r), &m, &v, &lo, &hi);
    CHECK_NEAR(m, 0.5, 0.005);
    CHECK_NEAR(v, 1.0 / 12, 0.003);
    CHECK(lo >= 0 && hi < 1 && lo < 1e-3 && hi > 1 - 1e-3);
    em_tensor *b = em_rand(EM_BF16, EM_SHAPE(1000), &r);
    CHECK(em_dtype_of(b) == EM_BF16);
    em_scope_end(s);
}

TEST(test_randint_stays_in_range_and_hits_every_value)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(8);
    em_dtype dts[] = {EM_I32, EM_U8, EM_F32};
    int64_t lows[] = {-3, 250, -3}, highs[] = {4, 256, 4};
    for (int k = 0; k < 3; k++) {
        em_tensor *t = em_randint(lows[k], highs[k], dts[k], EM_SHAPE(5000), &r);
        CHECK(em_dtype_of(t) == dts[k]);
        static double v[5000];
        CHECK_OK(em_to_array(t, EM_F64, v));
        int seen[16] = {0};
        for (int i = 0; i < 5000; i++) {
            if (!(v[i] >= (double)lows[k] && v[i] < (double)highs[k] && v[i] == floor(v[i])))
                th_fail(__FILE__, __LINE__, "%s randint value %g outside [%lld, %lld)", em_dtype_name(dts[k]),
                        v[i], (long long)lows[k], (long long)highs[k]);
            seen[(int)(v[i] - (double)lows[k])]++;
        }
        for (int j = 0; j < highs[k] - lows[k]; j++) CHECK(seen[j] > 500);
    }
    em_scope_end(s);
}

TEST(test_random_rejects_bad_dtypes_and_ranges)
{
    em_scope s = em_scope_begin();
    CHECK_ERR(em_rand(EM_I32, EM_SHAPE(2), NULL), EM_ERR_DTYPE, "em_rand: needs a float dtype, got i32");
    CHECK_ERR(em_randn(EM_BOOL, EM_SHAPE(2), NULL), EM_ERR_DTYPE, "em_randn: needs a float dtype, got bool");
    CHECK_ERR(em_randint(0, 2, EM_BOOL, EM_SHAPE(2), NULL), EM_ERR_DTYPE,
              "em_randint: dtype bool cannot hold random integers");
    CHECK_ERR(em_randint(5, 5, EM_I32, EM_SHAPE(2), NULL), EM_ERR_ARG,
              "em_randint: empty or too wide range [5, 5)");
    CHECK_ERR(em_randint(5, 1, EM_I32, EM_SHAPE(2), NULL), EM_ERR_ARG,
              "em_randint: empty or too wide range [5, 1)");
    em_rng r = em_rng_new(0);
    CHECK(em_rand(EM_F32, EM_SHAPE(-1), &r) == NULL);
    CHECK(r.offset == 0); /* a failed draw does not advance the generator */
    em_scope_end(s);
}

TEST(test_seed_derive_gives_distinct_reproducible_streams)
{
    CHECK(em_seed_derive(1337, 1) == em_seed_derive(1337, 1));
    CHECK(em_seed_derive(1337, 1) != em_seed_derive(1337, 2));
    CHECK(em_seed_derive(1337, 1) != em_seed_derive(1338, 1));
    CHECK(em_seed_derive(1337, 0) != 1337);
    /* the streams' first numbers differ from the seed's own stream */
    uint32_t a[4], b[4];
    em_philox4x32(1337, 0, 0, a);
    em_philox4x32(em_seed_derive(1337, 1), 0, 0, b);
    CHECK(memcmp(a, b, sizeof a) != 0);
}
