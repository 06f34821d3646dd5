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

/* A transformer-shaped step: embedding, layer_norm, attention, matmul,
 * gelu, cross-entropy, backward. After two warm-up steps the arena asks the
 * system for nothing more and no tensor outlives its step. */
TEST(test_steady_state_step_does_not_allocate)
{
    enum { B = 2, T = 8, C = 16, H = 2, V = 11 };
    em_rng r = em_rng_new(3);
    em_tensor *wte = em_randn(EM_F32, EM_SHAPE(V, C), &r), *wqkv = em_randn(EM_F32, EM_SHAPE(C, 3 * C), &r);
    em_tensor *ln_w = em_ones(EM_F32, EM_SHAPE(C)), *ln_b = em_zeros(EM_F32, EM_SHAPE(C));
    em_tensor *params[] = {wte, wqkv, ln_w, ln_b};
    for (int i = 0; i < 4; i++) CHECK_OK(em_set_requires_grad(params[i], true));
    uint64_t allocs = 0;
    int64_t live = 0;
    for (int step = 0; step < 6; step++) {
        if (step == 2) {
            allocs = em_arena_system_allocs();
            live = em_live_tensors();
        }
        em_scope s = em_scope_begin();
        em_tensor *idx = em_randint(0, V, EM_I32, EM_SHAPE(B, T), &r);
        em_tensor *tgt = em_randint(0, V, EM_I32, EM_SHAPE(B, T), &r);
        em_tensor *x = em_layer_norm(em_embedding(wte, idx), ln_w, ln_b, 1e-5); /* (B,T,C) */
        em_tensor *qkv = em_matmul(x, wqkv);                                    /* (B,T,3C) */
        em_tensor *parts[3];
        CHECK(em_split(qkv, C, 2, parts, 3) == 3);
        for (int i = 0; i < 3; i++) /* (B,T,C) -> (B,H,T,C/H) */
            parts[i] = em_transpose(em_reshape(parts[i], EM_SHAPE(B, T, H, C / H)), 1, 2);
        em_tensor *att = em_attention_causal(parts[0], parts[1], parts[2], 0);
        em_tensor *y = em_gelu_tanh(em_reshape(em_transpose(att, 1, 2), EM_SHAPE(B, T, C)));
        em_tensor *logits = em_matmul(y, em_transpose(wte, 0, 1)); /* (B,T,V) */
        em_tensor *loss = em_cross_entropy(logits, tgt, -100);
        CHECK_NOTNULL(loss);
        CHECK_OK(em_backward(loss, NULL));
        em_scope_end(s);
        for (int i = 0; i < 4; i++) CHECK_OK(em_zero_grad(params[i]));
    }
    CHECK(allocs > 0); /* the step did use the arena */
    CHECK(em_arena_system_allocs() == allocs);
    CHECK(em_live_tensors() == live);
    for (int i = 0; i < 4; i++) em_free(params[i]);
    CHECK(em_live_tensors() == 0);
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
