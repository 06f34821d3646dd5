/* test_grad_memory.c — backward adds a parameter's gradient where it lies
 * (op_grad_acc): a weight's gradient is never made a second time in the
 * step scope and then added, which is what held most of a GPT-2 124M step's
 * peak memory (a matmul's dW, the embedding's dense (V,C) gradient, three
 * zero-padded slices of qkv). Each memory test measures what backward left
 * in the scope arena (em_arena_in_use) against the size of the gradient it
 * must not have made, and checks the gradient's values. The rest check the
 * autograd engine's side: a leaf's hooks fire once however its uses
 * delivered, through a view or not. */
#include "harness.h"

static size_t bytes_f32(int64_t n) { return (size_t)n * sizeof(float); }

/* x (B,K) integer-valued, so every gradient below is exact */
static em_tensor *int_matrix(int64_t rows, int64_t cols, int mod)
{
    em_tensor *t = em_zeros(EM_F32, EM_SHAPE(rows, cols));
    float *p = em_data(t);
    for (int64_t i = 0; i < rows * cols; i++) p[i] = (float)((i * 7 + i / cols) % mod) - (float)(mod / 2);
    return t;
}

/* column sums of x (B,K) times s: the gradient of sum(x @ W^T) * s for W (N,K), row by row */
static bool rows_are_colsum(em_tensor *gw, em_tensor *x, double s)
{
    int64_t N = em_shape(gw)[0], K = em_shape(gw)[1], B = em_shape(x)[0];
    const float *g = em_data(gw), *xp = em_data(x);
    for (int64_t k = 0; k < K; k++) {
        double want = 0;
        for (int64_t b = 0; b < B; b++) want += xp[b * K + k];
        for (int64_t n = 0; n < N; n++)
            if (g[n * K + k] != (float)(want * s)) return false;
    }
    return true;
}

static em_status count_hook(em_tensor *t, em_tensor *grad, void *ctx)
{
    (void)t, (void)grad;
    ++*(int *)ctx;
    return EM_OK;
}

/* x @ W^T: dW goes through the transpose's view into W's gradient; the
 * transpose's node then only counts the use, so W's hook still fires once
 * per backward */
TEST(test_linear_backward_adds_dw_into_the_weight_gradient_without_a_copy)
{
    enum { B = 4, K = 1024, N = 512 };
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(N, K)), *x = int_matrix(B, K, 9);
    CHECK_OK(em_set_requires_grad(w, true));
    int fired = 0;
    CHECK_OK(em_register_grad_hook(w, count_hook, &fired));
    for (int pass = 1; pass <= 2; pass++) { /* the first makes the gradient, the second adds (beta 1) */
        em_scope s = em_scope_begin();
        em_tensor *loss = em_sum(em_matmul(x, em_transpose(w, 0, 1)), 0, NULL, false);
        CHECK_NOTNULL(loss);
        size_t before = em_arena_in_use();
        CHECK_OK(em_backward(loss, NULL));
        size_t left = em_arena_in_use() - before;
        if (left >= bytes_f32(N * K))
            th_fail(__FILE__, __LINE__, "pass %d: backward left %zu bytes in the scope; W's gradient is %zu",
                    pass, left, bytes_f32(N * K));
        em_scope_end(s);
        CHECK(fired == pass);
        CHECK(rows_are_colsum(em_grad(w), x, pass));
    }
    em_free(w);
    em_free(x);
}

TEST(test_embedding_backward_adds_rows_into_the_weight_gradient_without_a_dense_copy)
{
    enum { V = 4096, C = 128, P = 24 };
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(V, C)), *m = int_matrix(P, C, 5);
    CHECK_OK(em_set_requires_grad(w, true));
    int32_t idx[P];
    for (int p = 0; p < P; p++) idx[p] = (int32_t)((p * 5) % 7 * 600); /* 7 rows, each used 3 or 4 times */
    em_tensor *ix = em_from_data(EM_I32, EM_SHAPE(P), idx);
    for (int pass = 1; pass <= 2; pass++) { /* the second adds into a gradient that holds the first */
        em_scope s = em_scope_begin();
        em_tensor *loss = em_sum(em_mul(em_embedding(w, ix), m), 0, NULL, false);
        CHECK_NOTNULL(loss);
        size_t before = em_arena_in_use();
        CHECK_OK(em_backward(loss, NULL));
        size_t left = em_arena_in_use() - before;
        if (left >= bytes_f32(V * C))
            th_fail(__FILE__, __LINE__, "pass %d: backward left %zu bytes in the scope; W's gradient is %zu",
                    pass, left, bytes_f32(V * C));
        em_scope_end(s);
        /* dW[r] = pass * the sum of m's rows p with idx[p] = r; other rows 0 */
        const float *g = em_data(em_grad(w)), *mp = em_data(m);
        bool ok = true;
        for (int64_t r = 0; r < V && ok; r++)
            for (int64_t c = 0; c < C; c++) {
                double want = 0;
                for (int p = 0; p < P; p++)
                    if (idx[p] == r) want += mp[p * C + c];
                if (g[r * C + c] != (float)(want * pass)) {
                    th_fail(__FILE__, __LINE__, "pass %d: dW[%lld][%lld] = %g, want %g", pass, (long long)r,
                            (long long)c, g[r * C + c], want * pass);
                    ok = false;
                    break;
                }
            }
    }
    em_free(w);
    em_free(m);
    em_free(ix);
}

/* q, k, v narrowed from one (T,3C) tensor, as attention's input is: their
 * gradients fill one (T,3C) gradient, not three zero-padded ones and a sum */
TEST(test_slices_of_one_tensor_fill_one_gradient)
{
    enum { T = 64, C = 1024 };
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(T, 3 * C));
    CHECK_OK(em_set_requires_grad(a, true));
    em_scope s = em_scope_begin();
    em_tensor *qkv = em_mul_scalar(a, 1.0); /* a non-leaf, as a matmul's output is */
    em_tensor *loss = NULL;
    for (int i = 0; i < 3; i++) {
        em_tensor *part = em_sum(em_mul_scalar(em_narrow(qkv, 1, i * C, C), i + 1), 0, NULL, false);
        loss = loss ? em_add(loss, part) : part;
    }
    CHECK_NOTNULL(loss);
    size_t before = em_arena_in_use();
    CHECK_OK(em_backward(loss, NULL));
    size_t left = em_arena_in_use() - before;
    /* the one gradient of qkv, and the slices' own (T,C) gradients */
    if (left >= 2 * bytes_f32(T * 3 * C))
        th_fail(__FILE__, __LINE__, "backward left %zu bytes in the scope; qkv's gradient is %zu", left,
                bytes_f32(T * 3 * C));
    em_scope_end(s);
    const float *g = em_data(em_grad(a));
    bool ok = true;
    for (int64_t i = 0; i < T * 3 * C && ok; i++) ok = g[i] == (float)(i % (3 * C) / C + 1);
    CHECK(ok);
    em_free(a);
}

/* The GPT's tied embedding: the lm head's dW and the embedding's rows both
 * land in the (flat) wte gradient; backward leaves less than that gradient
 * in the scope. */
TEST(test_gpt_backward_makes_no_copy_of_the_tied_embedding_gradient)
{
    em_gpt_config c = {
        .vocab_size = 2048, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 64, .bias = true};
    em_gpt *g = em_gpt_new(&c, 5);
    CHECK_NOTNULL(g);
    CHECK_OK(em_module_flatten(g->m));
    em_rng r = em_rng_new(1);
    em_scope s = em_scope_begin();
    em_tensor *x = em_randint(0, c.vocab_size, EM_I32, EM_SHAPE(2, 8), &r);
    em_tensor *y = em_randint(0, c.vocab_size, EM_I32, EM_SHAPE(2, 8), &r);
    em_tensor *loss = em_gpt_loss(g, x, y);
    CHECK_NOTNULL(loss);
    size_t before = em_arena_in_use();
    CHECK_OK(em_backward(loss, NULL));
    size_t left = em_arena_in_use() - before, wte = bytes_f32(c.vocab_size * c.n_embd);
    if (left >= wte)
        th_fail(__FILE__, __LINE__, "backward left %zu bytes in the scope; wte's gradient is %zu", left, wte);
    em_scope_end(s);
    em_gpt_free(g);
}

/* W^T used by two matmuls (each adds into W's gradient through the view) and
 * by an elementwise op (which hands its gradient to the view's node): W's
 * gradient is the sum of the three and its hook fires once. */
TEST(test_weight_seen_through_one_transpose_by_three_consumers_gets_each_once)
{
    enum { B = 3, K = 16, N = 8 };
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(N, K)), *x1 = int_matrix(B, K, 7), *x2 = int_matrix(B, K, 5);
    CHECK_OK(em_set_requires_grad(w, true));
    int fired = 0;
    CHECK_OK(em_register_grad_hook(w, count_hook, &fired));
    em_scope s = em_scope_begin();
    em_tensor *wt = em_transpose(w, 0, 1); /* (K,N) */
    em_tensor *l1 = em_sum(em_matmul(x1, wt), 0, NULL, false),
              *l2 = em_sum(em_matmul(x2, wt), 0, NULL, false);
    em_tensor *l3 = em_sum(em_mul_scalar(wt, 2.0), 0, NULL, false);
    CHECK_OK(em_backward(em_add(em_add(l1, l2), l3), NULL));
    em_scope_end(s);
    CHECK(fired == 1);
    const float *g = em_data(em_grad(w)), *a = em_data(x1), *b = em_data(x2);
    bool ok = true;
    for (int64_t k = 0; k < K; k++) {
        double want = 2;
        for (int64_t i = 0; i < B; i++) want += a[i * K + k] + b[i * K + k];
        for (int64_t n = 0; n < N; n++) ok = ok && g[n * K + k] == (float)want;
    }
    CHECK(ok);
    em_free(w);
    em_free(x1);
    em_free(x2);
}

/* The transposed weight is itself made by an op (W * 3): its gradient is
 * written through the view into a new one, which the multiply's node then
 * takes back to W. */
TEST(test_transpose_of_a_computed_weight_passes_its_gradient_back)
{
    enum { B = 4, K = 32, N = 16 };
    em_tensor *w = em_zeros(EM_F32, EM_SHAPE(N, K)), *x = int_matrix(B, K, 9);
    CHECK_OK(em_set_requires_grad(w, true));
    int fired = 0;
    CHECK_OK(em_register_grad_hook(w, count_hook, &fired));
    em_scope s = em_scope_begin();
    em_tensor *w3 = em_mul_scalar(w, 3.0);
    CHECK_OK(em_backward(em_sum(em_matmul(x, em_transpose(w3, 0, 1)), 0, NULL, false), NULL));
    em_scope_end(s);
    CHECK(fired == 1);
    CHECK(rows_are_colsum(em_grad(w), x, 3.0));
    em_free(w);
    em_free(x);
}
