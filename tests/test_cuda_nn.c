/* test_cuda_nn.c — the CUDA kernels of softmax, cross-entropy, the norms,
 * embedding / index_select and dropout against the CPU ops: the same random
 * inputs through both, forward values and gradients compared per dtype
 * (dropout exactly). Every test skips where no CUDA device is visible. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"

static const em_dtype DTYPES[] = {EM_F32, EM_F64, EM_F16, EM_BF16};

/* relative tolerance per dtype: the CPU and the device sum in different orders */
static double tol_of(em_dtype dt)
{
    switch (dt) {
    case EM_F64: return 1e-10;
    case EM_F32: return 2e-5;
    case EM_F16: return 4e-3;
    default: return 3e-2;
    }
}

static em_tensor *on_cuda(em_tensor *t) { return em_to(t, em_device_cuda(0)); }
static em_tensor *on_cpu(em_tensor *t) { return em_to(t, em_device_cpu()); }

static double max_abs(em_tensor *t)
{
    int64_t n = em_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1)), m = 0;
    em_to_array(t, EM_F64, v);
    for (int64_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
    free(v);
    return m;
}

/* got (any device) agrees with want (CPU) within tol * max(1, max |want|) */
static void check_close(const char *file, int line, const char *what, em_tensor *got, em_tensor *want,
                        double tol)
{
    if (!got || !want) th_fail(file, line, "%s: NULL result: %s", what, em_last_error());
    em_tensor *g = on_cpu(got);
    double scale = max_abs(want), d = th_max_abs_diff(g, want);
    if (!(d <= tol * (scale > 1 ? scale : 1)))
        th_fail(file, line, "%s: max |cuda - cpu| = %g (max |cpu| %g, tol %g)", what, d, scale, tol);
}

typedef em_tensor *(*nn_fn)(em_tensor **in, void *ctx);

/* Runs f on in[0..n) (CPU tensors; the float ones become leaves requiring a
 * gradient) on the CPU and on cuda:0, backpropagates one random cotangent
 * through both, and compares the outputs and every float input's gradient. */
static void cpu_vs_cuda(const char *file, int line, const char *what, nn_fn f, void *ctx, int n,
                        em_tensor **in, double tol)
{
    em_tensor *cin[8], *gin[8];
    for (int i = 0; i < n; i++) {
        bool fl = em_dtype_is_float(em_dtype_of(in[i]));
        cin[i] = em_detach(in[i]);
        gin[i] = on_cuda(in[i]);
        if (!cin[i] || !gin[i]) th_fail(file, line, "%s: input %d: %s", what, i, em_last_error());
        if (fl && (em_set_requires_grad(cin[i], true) || em_set_requires_grad(gin[i], true)))
            th_fail(file, line, "%s: %s", what, em_last_error());
    }
    em_tensor *yc = f(cin, ctx), *yg = f(gin, ctx);
    if (!yc || !yg) th_fail(file, line, "%s: forward failed: %s", what, em_last_error());
    if (em_device_of(yg).type != EM_CUDA)
        th_fail(file, line, "%s: the CUDA result is not on the device", what);
    check_close(file, line, what, yg, yc, tol);
    em_rng r = em_rng_new(99);
    int64_t shape[EM_MAX_DIMS];
    int nd = em_ndim(yc);
    for (int d = 0; d < nd; d++) shape[d] = em_size(yc, d);
    em_tensor *cot = em_randn(em_dtype_of(yc), nd, shape, &r);
    if (em_backward(yc, cot) || em_backward(yg, on_cuda(cot)))
        th_fail(file, line, "%s: backward failed: %s", what, em_last_error());
    for (int i = 0; i < n; i++) {
        if (!em_dtype_is_float(em_dtype_of(in[i]))) continue;
        char buf[96];
        snprintf(buf, sizeof buf, "%s: gradient of input %d", what, i);
        check_close(file, line, buf, em_grad(gin[i]), em_grad(cin[i]), tol);
    }
}
#define CPU_VS_CUDA(what, f, ctx, n, in, tol)                                                                \
    cpu_vs_cuda(__FILE__, __LINE__, (what), (f), (ctx), (n), (in), (tol))

static em_tensor *randn(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    return em_cast(em_randn(EM_F64, ndim, shape, &r), dt);
}

/* n i32 values in [0, C), every `every`-th one replaced by `ignore` (every 0: none) */
static em_tensor *targets(int ndim, const int64_t *shape, int64_t C, int every, int ignore, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    em_tensor *t = em_randint(0, C, EM_I32, ndim, shape, &r);
    int32_t *p = em_data(t);
    for (int64_t i = 0; every && i < em_numel(t); i += every) p[i] = ignore;
    return t;
}

/* ---- softmax ------------------------------------------------------------------- */

typedef struct sm_case {
    int dim;
    bool log;
} sm_case;

static em_tensor *sm_graph(em_tensor **in, void *ctx)
{
    sm_case *c = ctx;
    return c->log ? em_log_softmax(in[0], c->dim) : em_softmax(in[0], c->dim);
}

TEST(test_cuda_softmax_and_log_softmax_match_the_cpu_along_any_dim)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++)
        for (int log = 0; log < 2; log++) {
            em_scope s = em_scope_begin();
            em_tensor *x = em_mul(randn(DTYPES[k], EM_SHAPE(3, 37, 5), 1), em_full(DTYPES[k], 0, NULL, 3.0));
            sm_case last = {-1, log}, mid = {1, log};
            CPU_VS_CUDA("softmax dim -1", sm_graph, &last, 1, &x, tol_of(DTYPES[k]));
            CPU_VS_CUDA("softmax dim 1", sm_graph, &mid, 1, &x, tol_of(DTYPES[k]));
            em_tensor *wide = randn(DTYPES[k], EM_SHAPE(4, 3001), 2); /* rows longer than a block */
            CPU_VS_CUDA("softmax of wide rows", sm_graph, &last, 1, &wide, tol_of(DTYPES[k]));
            em_scope_end(s);
        }
}

/* ---- cross-entropy ------------------------------------------------------------------ */

static em_tensor *ce_graph(em_tensor **in, void *ctx) { return em_cross_entropy(in[0], in[1], *(int *)ctx); }

TEST(test_cuda_cross_entropy_matches_the_cpu_with_ignored_targets)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        int ignore = -100;
        em_tensor *in[2] = {randn(DTYPES[k], EM_SHAPE(3, 7, 50), 3),
                            targets(EM_SHAPE(3, 7), 50, 4, ignore, 4)};
        CPU_VS_CUDA("cross_entropy", ce_graph, &ignore, 2, in, tol_of(DTYPES[k]));
        em_tensor *big[2] = {randn(DTYPES[k], EM_SHAPE(5, 5000), 5), targets(EM_SHAPE(5), 5000, 0, 0, 6)};
        CPU_VS_CUDA("cross_entropy, many classes", ce_graph, &ignore, 2, big, tol_of(DTYPES[k]));
        em_scope_end(s);
    }
}

TEST(test_cuda_cross_entropy_rejects_a_target_out_of_range)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *x = on_cuda(randn(EM_F32, EM_SHAPE(4, 10), 7));
    em_tensor *t = targets(EM_SHAPE(4), 10, 0, 0, 8);
    ((int32_t *)em_data(t))[2] = 10;
    CHECK_ERR(em_cross_entropy(x, on_cuda(t), -100), EM_ERR_INDEX, "out of range");
    CHECK_ERR(em_cross_entropy(x, t, -100), EM_ERR_DEVICE, "cross_entropy");
    em_scope_end(s);
}

static em_tensor *mse_graph(em_tensor **in, void *ctx)
{
    (void)ctx;
    return em_mse_loss(in[0], in[1]);
}

TEST(test_cuda_mse_loss_matches_the_cpu)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        em_tensor *in[2] = {randn(DTYPES[k], EM_SHAPE(6, 33), 40), randn(DTYPES[k], EM_SHAPE(6, 33), 41)};
        CPU_VS_CUDA("mse_loss", mse_graph, NULL, 2, in, tol_of(DTYPES[k]));
        em_scope_end(s);
    }
}

/* ---- layer_norm / rms_norm ------------------------------------------------------------- */

typedef struct norm_case {
    bool rms, weight, bias;
} norm_case;

static em_tensor *norm_graph(em_tensor **in, void *ctx)
{
    norm_case *c = ctx;
    em_tensor *w = c->weight ? in[1] : NULL, *b = c->bias ? in[2] : NULL;
    return c->rms ? em_rms_norm(in[0], w, 1e-5) : em_layer_norm(in[0], w, b, 1e-5);
}

TEST(test_cuda_layer_norm_and_rms_norm_match_the_cpu_with_and_without_affine)
{
    CUDA_OR_SKIP();
    const norm_case cases[] = {
        {false, true, true}, {false, false, false}, {true, true, false}, {true, false, false}};
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < 4; c++) {
            em_scope s = em_scope_begin();
            em_dtype dt = DTYPES[k];
            /* an offset mean, and enough rows (300) for several dweight chunks */
            em_tensor *x = em_add(randn(dt, EM_SHAPE(3, 100, 70), 10), em_full(dt, 0, NULL, 4.0));
            em_tensor *in[3] = {x, randn(dt, EM_SHAPE(70), 11), randn(dt, EM_SHAPE(70), 12)};
            CPU_VS_CUDA(cases[c].rms ? "rms_norm" : "layer_norm", norm_graph, (void *)&cases[c], 3, in,
                        4 * tol_of(dt));
            em_scope_end(s);
        }
}

/* ---- embedding / index_select ------------------------------------------------------ */

static em_tensor *emb_graph(em_tensor **in, void *ctx)
{
    (void)ctx;
    return em_embedding(in[0], in[1]);
}

static em_tensor *sel_graph(em_tensor **in, void *ctx) { return em_index_select(in[0], *(int *)ctx, in[1]); }

TEST(test_cuda_embedding_and_index_select_match_the_cpu_with_repeated_indices)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        em_dtype dt = DTYPES[k];
        /* 3*7 lookups into 5 rows: every row repeats */
        em_tensor *emb[2] = {randn(dt, EM_SHAPE(5, 16), 20), targets(EM_SHAPE(3, 7), 5, 0, 0, 21)};
        CPU_VS_CUDA("embedding", emb_graph, NULL, 2, emb, tol_of(dt));
        int dim = 1;
        em_tensor *sel[2] = {randn(dt, EM_SHAPE(4, 10, 3), 22), targets(EM_SHAPE(12), 10, 0, 0, 23)};
        CPU_VS_CUDA("index_select dim 1", sel_graph, &dim, 2, sel, tol_of(dt));
        em_scope_end(s);
    }
}

TEST(test_cuda_embedding_rejects_an_index_out_of_range)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *w = on_cuda(randn(EM_F32, EM_SHAPE(5, 4), 24));
    em_tensor *idx = targets(EM_SHAPE(6), 5, 0, 0, 25);
    ((int32_t *)em_data(idx))[3] = 5;
    CHECK_ERR(em_embedding(w, on_cuda(idx)), EM_ERR_INDEX, "out of range");
    em_scope_end(s);
}

/* ---- dropout ---------------------------------------------------------------------------- */

TEST(test_cuda_dropout_draws_the_cpu_mask_exactly)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        em_dtype dt = DTYPES[k];
        /* 1001 elements (not a multiple of 4), transposed (not contiguous) */
        em_tensor *x = em_transpose(randn(dt, EM_SHAPE(7, 143), 30), 0, 1);
        em_tensor *xc = em_detach(x), *xg = on_cuda(x);
        CHECK_OK(em_set_requires_grad(xc, true));
        CHECK_OK(em_set_requires_grad(xg, true));
        em_rng rc = em_rng_new(31), rg = em_rng_new(31);
        rc.offset = rg.offset = 5;
        em_tensor *yc = em_dropout(xc, 0.3, true, &rc), *yg = em_dropout(xg, 0.3, true, &rg);
        CHECK(yc && yg);
        CHECK(rc.offset == rg.offset);
        em_tensor *got = on_cpu(yg);
        size_t bytes = (size_t)em_numel(yc) * em_dtype_size(dt);
        CHECK(got && memcmp(em_data(got), em_data(em_contiguous(yc)), bytes) == 0);
        em_tensor *cot = randn(dt, EM_SHAPE(143, 7), 32);
        CHECK_OK(em_backward(yc, cot));
        CHECK_OK(em_backward(yg, on_cuda(cot)));
        em_tensor *gc = em_contiguous(em_grad(xc)), *gg = on_cpu(em_contiguous(em_grad(xg)));
        CHECK(gc && gg && memcmp(em_data(gg), em_data(gc), bytes) == 0);
        em_scope_end(s);
    }
}
