/* test_binary.c — add, sub, mul, div: values, broadcasting, gradients, errors. */
#include "harness.h"

TEST(test_add_broadcasts_row_over_matrix)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(2, 3), (double[]){1, 2, 3, 4, 5, 6});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(3), (double[]){10, 20, 30});
    CHECK_VALUES(em_add(a, b), 0, 11, 22, 33, 14, 25, 36);
    em_scope_end(s);
}

/* A (T,C) table under (B,T,C) (the GPT's positions), with and without a
 * leading 1, and widths that leave a tail after the 8-wide loop: each
 * element is a[b,t,c] <op> table[t,c], as the f64 strided path computes it. */
TEST(test_binary_ops_broadcast_a_trailing_block_over_leading_dims)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(50);
    const int64_t widths[] = {3, 13, 40};
    for (int k = 0; k < 3; k++) {
        int64_t C = widths[k];
        em_tensor *a = em_randn(EM_F32, EM_SHAPE(4, 5, C), &r), *t = em_randn(EM_F32, EM_SHAPE(5, C), &r);
        em_tensor *t1 = em_reshape(t, EM_SHAPE(1, 5, C));
        em_tensor *a64 = em_cast(a, EM_F64), *t64 = em_cast(t, EM_F64);
        CHECK(th_max_abs_diff(em_add(a, t), em_add(a64, t64)) < 1e-6);
        CHECK(th_max_abs_diff(em_sub(t1, a), em_sub(t64, a64)) < 1e-6);
        CHECK(th_max_abs_diff(em_mul(a, t1), em_mul(a64, t64)) < 1e-5);
        CHECK(th_max_abs_diff(em_div(a, t1), em_div(a64, t64)) <
              1e-3 * th_max_abs_diff(em_div(a64, t64), em_zeros(EM_F64, EM_SHAPE(1))));
    }
    em_scope_end(s);
}

static em_tensor *f_add(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_add(x[0], x[1]);
}
static em_tensor *f_sub(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_sub(x[0], x[1]);
}
static em_tensor *f_mul(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_mul(x[0], x[1]);
}
static em_tensor *f_div(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_div(x[0], x[1]);
}
static em_tensor *f_scalars(em_tensor **x, void *ctx)
{
    (void)ctx;
    return em_neg(em_add_scalar(em_mul_scalar(x[0], 3.0), -1.5));
}

/* Inputs: a (2,3) and a broadcasting b (3), both persistent f64 leaves. */
static void grad_case(const char *what, th_graph_fn f, bool positive_b)
{
    em_rng r = em_rng_new(7);
    em_tensor *in[2] = {em_randn(EM_F64, EM_SHAPE(2, 3), &r), em_randn(EM_F64, EM_SHAPE(3), &r)};
    if (positive_b) {
        em_tensor *b = em_add_scalar(em_mul(in[1], in[1]), 0.5);
        em_free(in[1]);
        in[1] = b;
    }
    GRADCHECK(what, f, NULL, 2, in);
    F32_MATCHES_F64(what, f, NULL, 2, in, 1e-6);
    /* non-contiguous inputs give the same gradients */
    em_tensor *nc[2] = {th_noncontig(in[0]), th_noncontig(in[1])};
    CHECK(!em_is_contiguous(nc[0]));
    GRADCHECK(what, f, NULL, 2, nc);
    for (int i = 0; i < 2; i++) {
        em_free(in[i]);
        em_free(nc[i]);
    }
}

TEST(test_add_gradient_matches_finite_difference) { grad_case("add", f_add, false); }
TEST(test_sub_gradient_matches_finite_difference) { grad_case("sub", f_sub, false); }
TEST(test_mul_gradient_matches_finite_difference) { grad_case("mul", f_mul, false); }
TEST(test_div_gradient_matches_finite_difference) { grad_case("div", f_div, true); }
TEST(test_scalar_ops_gradient_matches_finite_difference) { grad_case("scalars", f_scalars, false); }

TEST(test_binary_ops_values)
{
    em_scope s = em_scope_begin();
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(2, 1), (double[]){1, 2});
    em_tensor *b = th_tensor(EM_F64, EM_SHAPE(1, 3), (double[]){4, 5, 8});
    CHECK_VALUES(em_sub(a, b), 0, -3, -4, -7, -2, -3, -6);
    CHECK_VALUES(em_mul(a, b), 0, 4, 5, 8, 8, 10, 16);
    CHECK_VALUES(em_div(a, b), 1e-15, 0.25, 0.2, 0.125, 0.5, 0.4, 0.25);
    CHECK_VALUES(em_add_scalar(a, 1.5), 0, 2.5, 3.5);
    CHECK_VALUES(em_neg(a), 0, -1, -2);
    em_tensor *i = th_tensor(EM_I32, EM_SHAPE(3), (double[]){1, -2, 3});
    CHECK_VALUES(em_mul(i, i), 0, 1, 4, 9);
    CHECK(em_dtype_of(em_add(i, i)) == EM_I32);
    em_scope_end(s);
}

TEST(test_add_rejects_broadcast_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3)), *b = em_zeros(EM_F32, EM_SHAPE(4));
    CHECK_ERR(em_add(a, b), EM_ERR_SHAPE, "add: shapes (2,3) and (4,) do not broadcast");
    em_scope_end(s);
}

TEST(test_mul_rejects_dtype_mismatch)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2)), *b = em_zeros(EM_F64, EM_SHAPE(2));
    CHECK_ERR(em_mul(a, b), EM_ERR_DTYPE, "mul: dtypes differ: f32(2,) and f64(2,)");
    em_scope_end(s);
}

TEST(test_ops_propagate_null_and_keep_first_error)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3)), *b = em_zeros(EM_F32, EM_SHAPE(4));
    em_clear_error();
    em_tensor *r = em_neg(em_mul_scalar(em_add(a, b), 2.0));
    CHECK(r == NULL);
    CHECK(em_last_status() == EM_ERR_SHAPE);
    CHECK(strstr(em_last_error(), "add:") != NULL);
    em_scope_end(s);
}

/* element i of a contiguous f16/bf16 tensor, widened */
static float low_at(em_tensor *t, int64_t i)
{
    uint16_t h = ((const uint16_t *)em_data(t))[i];
    return em_dtype_of(t) == EM_BF16 ? em_bf16_to_f32(h) : em_f16_to_f32(h);
}

/* v rounded to dt (f16 or bf16), as bits */
static uint16_t low_round(em_dtype dt, float v)
{
    return dt == EM_BF16 ? em_f32_to_bf16(v) : em_f32_to_f16(v);
}

/* f16 and bf16 operands of one dtype are read and written a block at a
 * time where contiguous (run_mixed): add, sub, mul and div give, element
 * for element, the op computed in double on the widened values and rounded
 * to float, then to the dtype (what the element-by-element path computes),
 * for same-shape operands, a row broadcast over a matrix (a bias), and
 * strided views; infinities, NaN, zeros and overflow among the values.
 * The scalar forms give the strided path's bits too. */
TEST(test_binary_ops_on_f16_bf16_give_the_rounded_exact_result)
{
    const em_dtype dts[] = {EM_F16, EM_BF16};
    const int64_t R = 67, C = 517; /* 34639 elements: over 1 << 15, and runs past one 512 block */
    em_tensor *(*fs[4])(em_tensor *, em_tensor *) = {em_add, em_sub, em_mul, em_div};
    const char *names[4] = {"add", "sub", "mul", "div"};
    for (int d = 0; d < 2; d++) {
        em_scope s = em_scope_begin();
        em_rng r = em_rng_new(77 + (uint64_t)d);
        em_tensor *a32 = em_contiguous(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(R, C), &r), 300.0));
        em_tensor *b32 = em_contiguous(em_mul_scalar(em_randn(EM_F32, EM_SHAPE(R, C), &r), 300.0));
        const float sa[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 60000.0f, 3e38f, 1.0f};
        const float sb[] = {1.0f, -INFINITY, -INFINITY, 0.0f, 0.0f, 60000.0f, 3e38f, NAN};
        for (int i = 0; i < 8; i++) {
            ((float *)em_data(a32))[i * 1009] = sa[i];
            ((float *)em_data(b32))[i * 1009] = sb[i];
        }
        em_tensor *a = em_cast(a32, dts[d]), *b = em_cast(b32, dts[d]);
        em_tensor *row = em_contiguous(em_narrow(b, 0, 5, 1)); /* (1,C): b's row 5 */
        em_tensor *as = em_transpose(em_contiguous(em_transpose(a, 0, 1)), 0, 1);
        for (int k = 0; k < 4; k++)
            for (int form = 0; form < 3; form++) { /* same shape, row broadcast, strided */
                th_case("%s %s, form %d", names[k], em_dtype_name(dts[d]), form);
                em_tensor *y = form == 0 ? fs[k](a, b) : form == 1 ? fs[k](a, row) : fs[k](as, b);
                CHECK(y && em_dtype_of(y) == dts[d]);
                if (!y) continue;
                for (int64_t i = 0; i < R * C; i++) {
                    double x = low_at(a, i), z = low_at(form == 1 ? row : b, form == 1 ? i % C : i);
                    double v = k == 0 ? x + z : k == 1 ? x - z : k == 2 ? x * z : x / z;
                    uint16_t want = low_round(dts[d], (float)v), got = ((const uint16_t *)em_data(y))[i];
                    if (got != want) {
                        th_fail(__FILE__, __LINE__, "element %lld: %g %s %g: bits 0x%04x, want 0x%04x",
                                (long long)i, x, names[k], z, got, want);
                        break;
                    }
                }
            }
        /* the scalar forms (x*m + s in double, rounded): contiguous as strided */
        th_case("scalar ops %s", em_dtype_name(dts[d]));
        size_t bytes = (size_t)(R * C) * 2;
        CHECK(!memcmp(em_data(em_mul_scalar(a, 0.1)), em_data(em_mul_scalar(as, 0.1)), bytes));
        CHECK(!memcmp(em_data(em_add_scalar(a, 1.0 / 3)), em_data(em_add_scalar(as, 1.0 / 3)), bytes));
        CHECK(!memcmp(em_data(em_neg(a)), em_data(em_neg(as)), bytes));
        em_scope_end(s);
    }
}

/* A bf16/f16 leaf used twice: its two gradients (each rounded to its
 * dtype) are summed in f32 and rounded once (add_par's low path), element
 * for element. */
TEST(test_f16_bf16_gradients_accumulate_rounded_once)
{
    const em_dtype dts[] = {EM_F16, EM_BF16};
    const int64_t R = 300, C = 257; /* over 1 << 16 elements: add_par splits it */
    for (int d = 0; d < 2; d++) {
        th_case("%s", em_dtype_name(dts[d]));
        em_scope s = em_scope_begin();
        em_rng r = em_rng_new(91);
        em_tensor *x = em_detach(em_cast(em_randn(EM_F32, EM_SHAPE(R, C), &r), dts[d]));
        em_tensor *p = em_cast(em_randn(EM_F32, EM_SHAPE(R, C), &r), dts[d]);
        em_tensor *q = em_cast(em_randn(EM_F32, EM_SHAPE(R, C), &r), dts[d]);
        em_tensor *g = em_cast(em_randn(EM_F32, EM_SHAPE(R, C), &r), dts[d]);
        CHECK_OK(em_set_requires_grad(x, true));
        CHECK_OK(em_backward(em_add(em_mul(x, p), em_mul(x, q)), g));
        em_tensor *gx = em_grad(x);
        CHECK(gx && em_dtype_of(gx) == dts[d]);
        for (int64_t i = 0; gx && i < R * C; i++) {
            float gp = low_at(g, i) * low_at(p, i), gq = low_at(g, i) * low_at(q, i);
            /* each product exact in f32, rounded to the dtype as mul's gradient is */
            uint16_t rp = low_round(dts[d], gp), rq = low_round(dts[d], gq);
            float wp = dts[d] == EM_BF16 ? em_bf16_to_f32(rp) : em_f16_to_f32(rp);
            float wq = dts[d] == EM_BF16 ? em_bf16_to_f32(rq) : em_f16_to_f32(rq);
            uint16_t want = low_round(dts[d], wp + wq), got = ((const uint16_t *)em_data(gx))[i];
            if (got != want) {
                th_fail(__FILE__, __LINE__, "element %lld: bits 0x%04x, want 0x%04x", (long long)i, got,
                        want);
                break;
            }
        }
        em_scope_end(s);
    }
}

/* The same with one gradient broadcast (a sum's, expanded over the summed
 * dim: not contiguous), in either order of arrival; and casts between f32
 * and f16/bf16 of views whose rows are contiguous but not the whole (copied
 * a row at a time, convert_n), of transposed and of expanded tensors (a run
 * of the last dim at a time, convert_strided): element for element as the
 * scalar conversions. */
TEST(test_f16_bf16_strided_gradients_and_row_casts_keep_their_bits)
{
    const int64_t R = 64, C = 96;
    for (int order = 0; order < 2; order++) {
        th_case("bf16, order %d", order);
        em_scope s = em_scope_begin();
        em_rng r = em_rng_new(93);
        em_tensor *x = em_detach(em_cast(em_randn(EM_F32, EM_SHAPE(R, C), &r), EM_BF16));
        em_tensor *p = em_cast(em_randn(EM_F32, EM_SHAPE(R, C), &r), EM_BF16);
        em_tensor *gs = em_cast(em_randn(EM_F32, EM_SHAPE(R), &r), EM_BF16); /* the row sums' gradient */
        em_tensor *g = em_cast(em_randn(EM_F32, EM_SHAPE(R, C), &r), EM_BF16);
        CHECK_OK(em_set_requires_grad(x, true));
        /* loss = <gs, sum(x, 1)> + <g, x*p>, as two backward calls on one graph each */
        em_tensor *a = em_sum(x, 1, (int[]){1}, false), *b = em_mul(x, p);
        CHECK_OK(em_backward(order ? b : a, order ? g : gs));
        CHECK_OK(em_backward(order ? a : b, order ? gs : g));
        em_tensor *gx = em_grad(x);
        for (int64_t i = 0; gx && i < R * C; i++) {
            float gp = em_bf16_to_f32(em_f32_to_bf16(low_at(g, i) * low_at(p, i)));
            uint16_t want = em_f32_to_bf16(gp + low_at(gs, i / C)), got = ((const uint16_t *)em_data(gx))[i];
            if (got != want) {
                th_fail(__FILE__, __LINE__, "element %lld: bits 0x%04x, want 0x%04x", (long long)i, got,
                        want);
                break;
            }
        }
        em_scope_end(s);
    }
    th_case("row casts");
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(94);
    em_tensor *x32 = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(R, C), &r), 1e3);
    ((float *)em_data(x32))[5] = NAN;
    em_tensor *v32 = em_narrow(x32, 1, 3, 40), *v16 = em_narrow(em_cast(x32, EM_BF16), 1, 3, 40);
    em_tensor *to16 = em_cast(v32, EM_BF16), *to32 = em_cast(v16, EM_F32);
    CHECK(to16 && to32);
    for (int64_t i = 0; to16 && to32 && i < R * 40; i++) {
        float v = ((const float *)em_data(x32))[(i / 40) * C + 3 + i % 40];
        uint16_t h = em_f32_to_bf16(v);
        CHECK(((const uint16_t *)em_data(to16))[i] == h);
        float w = em_bf16_to_f32(h), got = ((const float *)em_data(to32))[i];
        CHECK(!memcmp(&got, &w, sizeof got));
    }
    /* transposed (every stride but 1) and expanded (stride 0) sources, over
     * more than one pool range (a range starts mid-row) */
    th_case("strided casts");
    em_tensor *big = em_mul_scalar(em_randn(EM_F32, EM_SHAPE(300, 77), &r), 1e4);
    ((float *)em_data(big))[7] = INFINITY;
    ((float *)em_data(big))[8] = -NAN;
    em_tensor *bt = em_transpose(big, 0, 1); /* (77,300), strides (1,77) */
    const em_dtype lows[] = {EM_F16, EM_BF16};
    for (int d = 0; d < 2; d++) {
        em_tensor *lo = em_cast(bt, lows[d]); /* f32 -> low, strided source */
        em_tensor *back = em_cast(em_transpose(em_contiguous(em_transpose(lo, 0, 1)), 0, 1), EM_F32);
        CHECK(lo && back);
        for (int64_t i = 0; lo && back && i < 77 * 300; i++) {
            float v = ((const float *)em_data(big))[(i % 300) * 77 + i / 300];
            uint16_t h = low_round(lows[d], v);
            CHECK(((const uint16_t *)em_data(lo))[i] == h);
            float w = lows[d] == EM_BF16 ? em_bf16_to_f32(h) : em_f16_to_f32(h),
                  got = ((const float *)em_data(back))[i];
            CHECK(!memcmp(&got, &w, sizeof got));
        }
        /* into a transposed view of another dtype (strided stores) */
        em_tensor *dst32 = em_zeros(EM_F32, EM_SHAPE(300, 77));
        CHECK_OK(em_copy_into(em_transpose(dst32, 0, 1), lo));
        for (int64_t i = 0; lo && i < 77 * 300; i++) {
            uint16_t h = ((const uint16_t *)em_data(lo))[i];
            float w = lows[d] == EM_BF16 ? em_bf16_to_f32(h) : em_f16_to_f32(h),
                  got = ((const float *)em_data(dst32))[(i % 300) * 77 + i / 300];
            CHECK(!memcmp(&got, &w, sizeof got));
        }
        em_tensor *dstl = em_zeros(lows[d], EM_SHAPE(300, 77));
        CHECK_OK(em_copy_into(em_transpose(dstl, 0, 1), bt));
        for (int64_t i = 0; i < 77 * 300; i++)
            CHECK(((const uint16_t *)em_data(dstl))[i] ==
                  low_round(lows[d], ((const float *)em_data(big))[i]));
        em_tensor *one = em_expand(em_scalar(EM_F32, 1.0 / 3), 2, (int64_t[]){300, 77});
        em_tensor *ol = em_cast(one, lows[d]);
        for (int64_t i = 0; ol && i < 300 * 77; i++)
            CHECK(((const uint16_t *)em_data(ol))[i] == low_round(lows[d], 1.0f / 3));
    }
    em_scope_end(s);
}
