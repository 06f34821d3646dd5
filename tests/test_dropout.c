/* test_dropout.c — dropout: the mask depends only on (seed, offset) (not on
 * thread count), about p of the elements are zeroed, kept values are scaled
 * by 1/(1-p), eval mode is the identity, gradients, and errors. */
#include <stdlib.h>

#include "harness.h"

/* Fraction of zeros in t (any dtype). */
static double zero_fraction(em_tensor *t)
{
    int64_t n = em_numel(t);
    double *v = malloc(sizeof(double) * (size_t)n);
    em_to_array(t, EM_F64, v);
    int64_t z = 0;
    for (int64_t i = 0; i < n; i++) z += v[i] == 0;
    free(v);
    return (double)z / (double)n;
}

TEST(test_dropout_mask_is_the_same_for_one_and_two_threads)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(1000, 37)); /* 9250 counters: split across threads */
    em_rng r1 = {42, 5}, r2 = {42, 5};
    CHECK_OK(em_set_num_threads(1));
    em_tensor *y1 = em_dropout(x, 0.4, true, &r1);
    CHECK_OK(em_set_num_threads(2));
    em_tensor *y2 = em_dropout(x, 0.4, true, &r2);
    CHECK_NOTNULL(y1);
    CHECK_NOTNULL(y2);
    CHECK(th_max_abs_diff(y1, y2) == 0);
    /* offset advances by ceil(n/4) counters */
    CHECK(r1.offset == 5 + 9250 && r2.offset == r1.offset);
    /* the next draw (new offset) gives a different mask */
    CHECK(th_max_abs_diff(em_dropout(x, 0.4, true, &r2), y1) > 0);
    em_scope_end(s);
}

TEST(test_dropout_mask_matches_uniform_draw_of_same_generator)
{
    em_scope s = em_scope_begin();
    em_rng a = em_rng_new(9), b = em_rng_new(9);
    em_tensor *x = em_ones(EM_F64, EM_SHAPE(3, 11)); /* 33 elements: a partial last counter */
    em_tensor *y = em_dropout(x, 0.5, true, &a);
    em_tensor *u = em_rand(EM_F64, EM_SHAPE(3, 11), &b);
    double yv[33], uv[33];
    em_to_array(y, EM_F64, yv);
    em_to_array(u, EM_F64, uv);
    for (int i = 0; i < 33; i++) CHECK_NEAR(yv[i], uv[i] >= 0.5 ? 2.0 : 0.0, 0);
    CHECK(a.offset == b.offset && a.offset == 9);
    em_scope_end(s);
}

TEST(test_dropout_zeroes_about_p_and_scales_kept_values)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(123);
    em_tensor *x = em_full(EM_F32, EM_SHAPE(200, 500), 2.0);
    em_tensor *y = em_dropout(x, 0.3, true, &r);
    CHECK_NEAR(zero_fraction(y), 0.3, 0.01); /* sd is 0.0015 */
    /* every nonzero is 2 / 0.7; the mean stays about 2 */
    double *v = malloc(sizeof(double) * 100000);
    em_to_array(y, EM_F64, v);
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        if (v[i] != 0 && fabs(v[i] - 2.0 / 0.7) > 1e-6) {
            double bad = v[i];
            free(v);
            CHECK_NEAR(bad, 2.0 / 0.7, 1e-6);
        }
        sum += v[i];
    }
    free(v);
    CHECK_NEAR(sum / 100000, 2.0, 0.03);
    em_scope_end(s);
}

TEST(test_dropout_eval_mode_and_p_zero_are_identity)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(1);
    em_tensor *x = th_tensor(EM_F32, EM_SHAPE(4), (double[]){1, -2, 3, 4});
    em_tensor *y = em_dropout(x, 0.5, false, &r);
    CHECK(y == x);
    CHECK_VALUES(y, 0, 1, -2, 3, 4);
    CHECK(em_dropout(x, 0.0, true, &r) == x);
    CHECK(r.offset == 0); /* no numbers drawn */
    em_scope_end(s);
}

TEST(test_dropout_p_one_zeroes_everything)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(2);
    em_tensor *x = em_ones(EM_F64, EM_SHAPE(5));
    CHECK_VALUES(em_dropout(x, 1.0, true, &r), 0, 0, 0, 0, 0, 0);
    em_scope_end(s);
}

TEST(test_dropout_half_precision_and_default_generator)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(64));
    em_manual_seed(77);
    em_tensor *a = em_dropout(x, 0.25, true, NULL);
    CHECK(em_default_rng()->offset == 16);
    em_manual_seed(77);
    em_tensor *b = em_dropout(em_cast(x, EM_BF16), 0.25, true, NULL);
    em_manual_seed(77);
    em_tensor *c = em_dropout(em_cast(x, EM_F16), 0.25, true, NULL);
    CHECK(em_dtype_of(b) == EM_BF16 && em_dtype_of(c) == EM_F16);
    /* same mask; 4/3 rounds to 1.3359375 in bf16 and 1.333008 in f16 */
    CHECK(th_max_abs_diff(a, b) < 4e-3);
    CHECK(th_max_abs_diff(a, c) < 4e-4);
    em_scope_end(s);
}

static em_tensor *f_dropout(em_tensor **x, void *ctx)
{
    em_rng r = em_rng_new(*(uint64_t *)ctx); /* the same mask on every call */
    return em_dropout(x[0], 0.4, true, &r);
}

TEST(test_dropout_gradient_matches_finite_difference)
{
    em_scope s = em_scope_begin();
    uint64_t seed = 31;
    em_rng r = em_rng_new(5);
    em_tensor *in[1] = {em_randn(EM_F64, EM_SHAPE(3, 7), &r)};
    GRADCHECK("dropout", f_dropout, &seed, 1, in);
    F32_MATCHES_F64("dropout", f_dropout, &seed, 1, in, 1e-6);
    em_tensor *nc[1] = {th_noncontig(in[0])};
    CHECK(!em_is_contiguous(nc[0]));
    GRADCHECK("dropout noncontig", f_dropout, &seed, 1, nc);
    /* a non-contiguous input gets the same mask as its contiguous copy */
    CHECK(th_max_abs_diff(f_dropout(nc, &seed), f_dropout(in, &seed)) == 0);
    em_scope_end(s);
}

TEST(test_dropout_backward_uses_the_forward_mask)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(8);
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(50));
    CHECK_OK(em_set_requires_grad(x, true));
    em_tensor *y = em_dropout(x, 0.5, true, &r);
    CHECK_OK(em_backward(em_sum(y, 0, NULL, false), NULL));
    /* y = x * mask * 2 with x = 1, so dy/dx = y */
    CHECK(th_max_abs_diff(em_grad(x), y) == 0);
    em_scope_end(s);
}

TEST(test_dropout_rejects_bad_p_and_integer_input)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(1);
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(4));
    CHECK_ERR(em_dropout(x, 1.5, true, &r), EM_ERR_ARG, "dropout: p = 1.5 is not in [0, 1]");
    CHECK_ERR(em_dropout(x, -0.1, true, &r), EM_ERR_ARG, "dropout: p = -0.1 is not in [0, 1]");
    CHECK_ERR(em_dropout(x, NAN, false, &r), EM_ERR_ARG, "dropout: p = nan");
    CHECK_ERR(em_dropout(em_ones(EM_I32, EM_SHAPE(4)), 0.5, true, &r), EM_ERR_DTYPE,
              "dropout: needs a float tensor, got i32(4,)");
    em_scope_end(s);
}

/* A contiguous f32 input takes a fast loop (the Philox words of 64
 * counters drawn first, then each element's rule): its output and gradient
 * have the bits the general path gives a strided view of the same values
 * with the same generator, over a size the pool splits, a length that is
 * not a multiple of 4, and several values of p. */
TEST(test_dropout_contiguous_f32_gives_the_strided_paths_bits)
{
    const double ps[] = {0.2, 0.5, 0.9};
    const int64_t R = 301, C = 223; /* 67123 elements */
    for (int k = 0; k < 3; k++) {
        th_case("p %g", ps[k]);
        em_scope s = em_scope_begin();
        em_rng r = em_rng_new(5);
        em_tensor *x = em_detach(em_randn(EM_F32, EM_SHAPE(R, C), &r));
        em_tensor *xs = em_detach(em_transpose(em_contiguous(em_transpose(x, 0, 1)), 0, 1)); /* strided */
        em_tensor *g = em_randn(EM_F32, EM_SHAPE(R, C), &r);
        CHECK_OK(em_set_requires_grad(x, true));
        CHECK_OK(em_set_requires_grad(xs, true));
        em_rng d1 = em_rng_new(77), d2 = em_rng_new(77);
        em_tensor *y = em_dropout(x, ps[k], true, &d1), *ys = em_dropout(xs, ps[k], true, &d2);
        CHECK(y && ys && d1.offset == d2.offset);
        size_t bytes = (size_t)(R * C) * 4;
        if (y && ys) CHECK(!memcmp(em_data(y), em_data(ys), bytes));
        CHECK_OK(em_backward(y, g));
        CHECK_OK(em_backward(ys, em_transpose(em_contiguous(em_transpose(g, 0, 1)), 0, 1)));
        CHECK(!memcmp(em_data(em_grad(x)), em_data(em_contiguous(em_grad(xs))), bytes));
        em_scope_end(s);
    }
}
