/* test_autograd.c — the tape: accumulation, zero_grad, detach, no-grad mode,
 * backward with a given gradient, hooks fired when a leaf's gradient is
 * final, and the errors backward gives. */
#include "harness.h"

/* y = sum(a*a + a*b) ; dy/da = 2a + b, dy/db = a */
static em_tensor *quad(em_tensor *a, em_tensor *b)
{
    return em_sum(em_add(em_mul(a, a), em_mul(a, b)), 0, NULL, false);
}

TEST(test_backward_computes_leaf_gradients)
{
    em_tensor *a = th_tensor(EM_F32, EM_SHAPE(3), (double[]){1, 2, 3});
    em_tensor *b = th_tensor(EM_F32, EM_SHAPE(3), (double[]){4, 5, 6});
    CHECK_OK(em_set_requires_grad(a, true));
    CHECK_OK(em_set_requires_grad(b, true));
    em_scope s = em_scope_begin();
    em_tensor *y = quad(a, b);
    CHECK_NEAR(em_item(y), (1 + 4 + 9) + (4 + 10 + 18), 1e-5);
    CHECK_OK(em_backward(y, NULL));
    em_scope_end(s);
    CHECK_VALUES(em_grad(a), 0, 6, 9, 12);
    CHECK_VALUES(em_grad(b), 0, 1, 2, 3);
    em_free(a);
    em_free(b);
}

/* A residual stream: h = x * 1 (a non-leaf) feeds y = h + relu(h) * u.
 * h's gradient adopts the add's g first; the second contribution (relu's
 * path) is summed with it in one pass (autograd/tape.c's sums_at_once):
 * exactly g + g * u * (h > 0), in f32 and f64, large enough for the pool */
TEST(test_second_gradient_of_a_residual_stream_is_the_exact_sum)
{
    for (int d = 0; d < 2; d++) {
        em_dtype dt = d ? EM_F64 : EM_F32;
        int64_t n = 100000;
        em_scope s = em_scope_begin();
        em_rng r = em_rng_new(4);
        em_tensor *x = em_randn(dt, EM_SHAPE(n), &r), *u = em_randn(dt, EM_SHAPE(n), &r),
                  *g = em_randn(dt, EM_SHAPE(n), &r);
        CHECK_OK(em_set_requires_grad(x, true));
        em_tensor *h = em_mul_scalar(x, 1.0);
        em_tensor *y = em_add(h, em_mul(em_relu(h), u));
        CHECK_OK(em_backward(y, g));
        em_tensor *gx = em_grad(x);
        int bad = 0;
        for (int64_t i = 0; i < n && !bad; i++) {
            double xi = em_get(x, (int64_t[]){i}), ui = em_get(u, (int64_t[]){i}),
                   gi = em_get(g, (int64_t[]){i});
            /* (volatile: the product rounded alone, never fused into an FMA with the add) */
            volatile float p32 = (float)gi * (float)ui;
            volatile double p64 = gi * ui;
            double want = d ? gi + (xi > 0 ? p64 : 0.0) : (double)((float)gi + (xi > 0 ? p32 : 0.0f));
            if (em_get(gx, (int64_t[]){i}) != want) bad = 1;
        }
        CHECK(!bad);
        em_scope_end(s);
    }
}

TEST(test_gradients_accumulate_across_backward_calls)
{
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(2), (double[]){1, -1});
    em_set_requires_grad(a, true);
    for (int i = 0; i < 3; i++) {
        em_scope s = em_scope_begin();
        CHECK_OK(em_backward(em_sum(em_mul_scalar(a, 2.0), 0, NULL, false), NULL));
        em_scope_end(s);
    }
    CHECK_VALUES(em_grad(a), 0, 6, 6);
    CHECK_OK(em_zero_grad(a));
    CHECK_VALUES(em_grad(a), 0, 0, 0);
    em_free(a);
}

TEST(test_backward_twice_on_same_graph_doubles_gradient)
{
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(2), (double[]){3, 4});
    em_set_requires_grad(a, true);
    em_scope s = em_scope_begin();
    em_tensor *y = em_sum(em_mul(a, a), 0, NULL, false);
    CHECK_OK(em_backward(y, NULL));
    CHECK_OK(em_backward(y, NULL));
    em_scope_end(s);
    CHECK_VALUES(em_grad(a), 0, 12, 16);
    em_free(a);
}

TEST(test_backward_with_given_gradient)
{
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(3), (double[]){1, 2, 3});
    em_set_requires_grad(a, true);
    em_scope s = em_scope_begin();
    em_tensor *y = em_mul(a, a);
    em_tensor *g = th_tensor(EM_F64, EM_SHAPE(3), (double[]){1, 0, -1});
    CHECK_OK(em_backward(y, g));
    em_scope_end(s);
    CHECK_VALUES(em_grad(a), 0, 2, 0, -6);
    em_free(a);
}

TEST(test_backward_rejects_nonscalar_root_without_gradient)
{
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2, 2));
    em_set_requires_grad(a, true);
    em_scope s = em_scope_begin();
    CHECK_ERR(em_backward(em_mul(a, a), NULL), EM_ERR_SHAPE, "pass grad_output");
    em_scope_end(s);
    em_free(a);
}

TEST(test_backward_rejects_root_without_grad)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2));
    CHECK_ERR(em_backward(em_sum(a, 0, NULL, false), NULL), EM_ERR_AUTOGRAD, "does not require grad");
    em_scope_end(s);
}

TEST(test_no_grad_mode_records_nothing)
{
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2));
    em_set_requires_grad(a, true);
    em_scope s = em_scope_begin();
    bool prev = em_set_grad_enabled(false);
    CHECK(prev == true);
    int64_t before = em_tape_length();
    em_tensor *y = em_mul(a, a);
    CHECK(em_tape_length() == before);
    CHECK(!em_requires_grad(y));
    em_set_grad_enabled(prev);
    CHECK(em_is_grad_enabled());
    CHECK(em_requires_grad(em_mul(a, a)));
    em_scope_end(s);
    em_free(a);
}

TEST(test_recording_outside_a_scope_is_an_error)
{
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2));
    em_set_requires_grad(a, true);
    CHECK_ERR(em_mul(a, a), EM_ERR_SCOPE, "mul: recording a gradient needs an open step scope");
    bool prev = em_set_grad_enabled(false);
    em_tensor *y = em_mul(a, a); /* fine without grad: persistent result */
    CHECK_VALUES(y, 0, 1, 1);
    em_set_grad_enabled(prev);
    em_free(y);
    em_free(a);
}

TEST(test_detach_stops_gradient_and_shares_storage)
{
    em_tensor *a = th_tensor(EM_F64, EM_SHAPE(2), (double[]){2, 3});
    em_set_requires_grad(a, true);
    em_scope s = em_scope_begin();
    em_tensor *d = em_detach(a);
    CHECK(!em_requires_grad(d) && em_is_leaf(d) && em_shares_storage(a, d));
    /* y = a * detach(a): dy/da = detach(a) only */
    CHECK_OK(em_backward(em_sum(em_mul(a, d), 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK_VALUES(em_grad(a), 0, 2, 3);
    em_free(a);
}

TEST(test_requires_grad_rejects_non_leaf_and_integers)
{
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2));
    em_set_requires_grad(a, true);
    em_scope s = em_scope_begin();
    em_tensor *y = em_mul(a, a);
    CHECK_ERR(em_set_requires_grad(y, true), EM_ERR_AUTOGRAD, "only leaves");
    em_tensor *i = em_zeros(EM_I32, EM_SHAPE(2));
    CHECK_ERR(em_set_requires_grad(i, true), EM_ERR_DTYPE, "needs a float tensor, got i32(2,)");
    em_scope_end(s);
    em_free(a);
}

typedef struct {
    int calls;
    int order[8];
    int64_t tape_at_call[8];
    double grad_sum_at_call;
    int id;
    int *log;
    int *nlog;
} hook_rec;

static em_status record_hook(em_tensor *t, em_tensor *grad, void *ctx)
{
    (void)t;
    hook_rec *r = ctx;
    r->calls++;
    r->log[(*r->nlog)++] = r->id;
    bool prev = em_set_grad_enabled(false);
    em_scope s = em_scope_begin();
    r->grad_sum_at_call = em_item(em_sum(grad, 0, NULL, false));
    em_scope_end(s);
    em_set_grad_enabled(prev);
    return EM_OK;
}

/* w1 is used twice, early in the forward; w2 once, late. Backward reaches w2
 * first; w1's hook must fire once, only after both uses contributed. */
TEST(test_grad_hook_fires_once_when_leaf_gradient_is_final)
{
    em_tensor *w1 = th_tensor(EM_F64, EM_SHAPE(2), (double[]){1, 2});
    em_tensor *w2 = th_tensor(EM_F64, EM_SHAPE(2), (double[]){3, 4});
    em_set_requires_grad(w1, true);
    em_set_requires_grad(w2, true);
    int log[8], nlog = 0;
    hook_rec r1 = {.id = 1, .log = log, .nlog = &nlog}, r2 = {.id = 2, .log = log, .nlog = &nlog};
    CHECK_OK(em_register_grad_hook(w1, record_hook, &r1));
    CHECK_OK(em_register_grad_hook(w2, record_hook, &r2));
    em_scope s = em_scope_begin();
    em_tensor *h = em_add(em_mul(w1, w1), w1); /* two uses of w1 */
    em_tensor *y = em_sum(em_mul(h, w2), 0, NULL, false);
    CHECK_OK(em_backward(y, NULL));
    em_scope_end(s);
    CHECK(r1.calls == 1 && r2.calls == 1);
    CHECK(nlog == 2 && log[0] == 2 && log[1] == 1);
    /* d/dw1 = (2 w1 + 1) * w2 = (3*3, 5*4); the hook saw the complete value */
    CHECK_NEAR(r1.grad_sum_at_call, 9 + 20, 1e-12);
    CHECK_NEAR(r2.grad_sum_at_call, (1 + 1) + (4 + 2), 1e-12);
    em_free(w1);
    em_free(w2);
}

TEST(test_grad_hook_not_fired_for_unreached_leaf)
{
    em_tensor *a = em_ones(EM_F64, EM_SHAPE(2)), *b = em_ones(EM_F64, EM_SHAPE(2));
    em_set_requires_grad(a, true);
    em_set_requires_grad(b, true);
    int log[8], nlog = 0;
    hook_rec rb = {.id = 2, .log = log, .nlog = &nlog};
    em_register_grad_hook(b, record_hook, &rb);
    em_scope s = em_scope_begin();
    em_tensor *unused = em_mul(b, b);
    (void)unused;
    CHECK_OK(em_backward(em_sum(em_mul(a, a), 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK(rb.calls == 0);
    CHECK(em_grad(b) == NULL);
    em_free(a);
    em_free(b);
}

static em_status failing_hook(em_tensor *t, em_tensor *g, void *ctx)
{
    (void)t, (void)g, (void)ctx;
    return em_set_error(EM_ERR_ARG, "hook refused");
}

TEST(test_failing_hook_stops_backward_with_its_status)
{
    em_tensor *a = em_ones(EM_F64, EM_SHAPE(2));
    em_set_requires_grad(a, true);
    em_register_grad_hook(a, failing_hook, NULL);
    em_scope s = em_scope_begin();
    CHECK_ERR(em_backward(em_sum(a, 0, NULL, false), NULL), EM_ERR_ARG, "hook refused");
    em_scope_end(s);
    em_free(a);
}

TEST(test_grad_buffer_receives_gradient_in_place)
{
    em_tensor *flat = em_zeros(EM_F32, EM_SHAPE(6));
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2, 2)), *b = em_ones(EM_F32, EM_SHAPE(2));
    em_set_requires_grad(a, true);
    em_set_requires_grad(b, true);
    em_tensor *va = em_view(em_narrow(flat, 0, 0, 4), EM_SHAPE(2, 2)), *vb = em_narrow(flat, 0, 4, 2);
    CHECK_OK(em_set_grad_buffer(a, va));
    CHECK_OK(em_set_grad_buffer(b, vb));
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(em_sum(em_add(em_mul_scalar(a, 3), b), 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK_VALUES(flat, 0, 3, 3, 3, 3, 2, 2);
    CHECK(em_shares_storage(em_grad(a), flat));
    em_free(a);
    em_free(b);
    em_free(va);
    em_free(vb);
    em_free(flat);
}

TEST(test_leaf_root_backward_sets_its_own_gradient)
{
    em_tensor *a = em_scalar(EM_F64, 5);
    em_set_requires_grad(a, true);
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(a, NULL));
    em_scope_end(s);
    CHECK_VALUES(em_grad(a), 0, 1);
    em_free(a);
}

TEST(test_scope_end_drops_tape)
{
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(2));
    em_set_requires_grad(a, true);
    int64_t base = em_tape_length();
    em_scope s = em_scope_begin();
    em_mul(a, a);
    em_mul(a, a);
    CHECK(em_tape_length() == base + 2);
    em_scope_end(s);
    CHECK(em_tape_length() == base);
    em_free(a);
}
