/* test_memory.c — lifetimes: persistent tensors, step scopes, stale handles,
 * keep, and no system allocation in a steady-state step. */
#include "harness.h"

TEST(test_tensor_used_after_scope_is_an_error)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_ones(EM_F32, EM_SHAPE(4, 5));
    em_scope_end(s);
    CHECK(!em_is_alive(a));
    em_scope s2 = em_scope_begin();
    em_tensor *b = em_ones(EM_F32, EM_SHAPE(4, 5)); /* likely reuses a's slot */
    CHECK_ERR(em_add(a, b), EM_ERR_SCOPE, "add: tensor handle");
    CHECK_ERR(em_add(a, b), EM_ERR_SCOPE, "stale");
    CHECK(em_is_alive(b));
    em_scope_end(s2);
}

TEST(test_scope_end_out_of_order_is_rejected)
{
    em_scope outer = em_scope_begin();
    em_scope inner = em_scope_begin();
    CHECK_ERR(em_scope_end(outer), EM_ERR_SCOPE, "not the innermost");
    CHECK_OK(em_scope_end(inner));
    CHECK_OK(em_scope_end(outer));
    CHECK(em_scope_depth() == 0);
}

TEST(test_keep_copies_out_of_scope)
{
    em_tensor *kept;
    em_scope s = em_scope_begin();
    em_tensor *a = em_arange(0, 6, 1, EM_F32);
    kept = em_keep(em_mul_scalar(a, 2));
    em_scope_end(s);
    CHECK(em_is_alive(kept));
    CHECK_VALUES(kept, 0, 0, 2, 4, 6, 8, 10);
    CHECK_OK(em_free(kept));
    CHECK(!em_is_alive(kept));
}

TEST(test_free_rejects_scoped_tensor)
{
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(3));
    CHECK_ERR(em_free(a), EM_ERR_SCOPE, "em_free: f32(3,) belongs to step scope");
    em_scope_end(s);
}

TEST(test_view_of_persistent_keeps_storage_alive)
{
    em_tensor *a = em_arange(0, 4, 1, EM_F64);
    em_tensor *v = em_narrow(a, 0, 1, 2);
    CHECK_OK(em_free(a));
    CHECK_VALUES(v, 0, 1, 2);
    CHECK_OK(em_free(v));
}

TEST(test_steady_state_step_does_not_allocate)
{
    em_tensor *w = em_randn(EM_F32, EM_SHAPE(64, 64), NULL);
    em_set_requires_grad(w, true);
    uint64_t before = 0;
    for (int step = 0; step < 5; step++) {
        if (step == 2) before = em_arena_system_allocs();
        em_scope s = em_scope_begin();
        em_tensor *x = em_randn(EM_F32, EM_SHAPE(16, 64), NULL);
        em_tensor *y = em_mul(em_add(x, em_sum(w, 1, (int[]){0}, true)), x);
        CHECK_OK(em_backward(em_sum(y, 0, NULL, false), NULL));
        em_scope_end(s);
    }
    CHECK(em_arena_system_allocs() == before);
    em_free(w);
}

/* Ops run with no scope open make persistent results; whatever they make for
 * their own use must not outlive them. */
TEST(test_ops_outside_scope_leave_only_their_result)
{
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(4, 6), NULL);
    em_tensor *xt = em_transpose(x, 0, 1);
    int64_t base = em_live_tensors();
    em_tensor *r = em_reshape(xt, EM_SHAPE(24)); /* needs a copy */
    CHECK(em_live_tensors() == base + 1);
    em_free(r);
    em_tensor *h = em_cast(x, EM_F16);
    base = em_live_tensors();
    em_tensor *img = em_reshape(h, EM_SHAPE(1, 1, 4, 6));
    em_tensor *w = em_ones(EM_F16, EM_SHAPE(2, 1, 3, 3));
    base = em_live_tensors();
    em_tensor *c = em_conv2d(img, w, NULL, 1, 1);
    em_tensor *p = em_max_pool2d(img, 2, 2, 0);
    CHECK_NOTNULL(c);
    CHECK_NOTNULL(p);
    CHECK(em_live_tensors() == base + 2);
    em_free(c);
    em_free(p);
    /* a failed recording (no scope) drops the op's output */
    em_set_requires_grad(x, true);
    base = em_live_tensors();
    CHECK(em_mul(x, x) == NULL);
    CHECK(em_narrow(x, 0, 0, 1) == NULL);
    CHECK(em_live_tensors() == base);
    em_free(w);
    em_free(img);
    em_free(h);
    em_free(xt);
    em_free(x);
    CHECK(em_live_tensors() == 0);
}
