/* test_cuda_nn.c — the CUDA kernels of softmax, cross-entropy, the norms,
 * embedding / index_select and dropout against the CPU ops: the same random
 * inputs through both, forward values and gradients compared per dtype
 * (dropout exactly). Every test skips where no CUDA device is visible. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"

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
            em_tensor *x = em_mul(ct_randn(CT_FLOAT_DTYPES[k], EM_SHAPE(3, 37, 5), 1),
                                  em_full(CT_FLOAT_DTYPES[k], 0, NULL, 3.0));
            sm_case last = {-1, log}, mid = {1, log};
            CPU_VS_CUDA("softmax dim -1", sm_graph, &last, 1, &x, ct_tol(CT_FLOAT_DTYPES[k]));
            CPU_VS_CUDA("softmax dim 1", sm_graph, &mid, 1, &x, ct_tol(CT_FLOAT_DTYPES[k]));
            em_tensor *wide =
                ct_randn(CT_FLOAT_DTYPES[k], EM_SHAPE(4, 3001), 2); /* rows longer than a block */
            CPU_VS_CUDA("softmax of wide rows", sm_graph, &last, 1, &wide, ct_tol(CT_FLOAT_DTYPES[k]));
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
        em_tensor *in[2] = {ct_randn(CT_FLOAT_DTYPES[k], EM_SHAPE(3, 7, 50), 3),
                            targets(EM_SHAPE(3, 7), 50, 4, ignore, 4)};
        CPU_VS_CUDA("cross_entropy", ce_graph, &ignore, 2, in, ct_tol(CT_FLOAT_DTYPES[k]));
        em_tensor *big[2] = {ct_randn(CT_FLOAT_DTYPES[k], EM_SHAPE(5, 5000), 5),
                             targets(EM_SHAPE(5), 5000, 0, 0, 6)};
        CPU_VS_CUDA("cross_entropy, many classes", ce_graph, &ignore, 2, big, ct_tol(CT_FLOAT_DTYPES[k]));
        em_scope_end(s);
    }
}

/* em_cross_entropy_loss's options on the device: the weights live on each
 * side's device, chosen by the logits' */
typedef struct ce_opts {
    em_cross_entropy_config c;
    em_tensor *w_cpu, *w_cuda;
} ce_opts;

static em_tensor *ce_opts_graph(em_tensor **in, void *ctx)
{
    ce_opts *o = ctx;
    em_cross_entropy_config c = o->c;
    if (c.weight) c.weight = em_device_of(in[0]).type == EM_CUDA ? o->w_cuda : o->w_cpu;
    return em_cross_entropy_loss(in[0], in[1], &c);
}

TEST(test_cuda_cross_entropy_options_match_the_cpu)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_dtype dt = CT_FLOAT_DTYPES[k];
        em_scope s = em_scope_begin();
        em_tensor *w = em_add_scalar(em_abs(ct_randn(dt, EM_SHAPE(40), 11)), 0.1);
        em_tensor *in[2] = {ct_randn(dt, EM_SHAPE(3, 40, 5), 12), targets(EM_SHAPE(3, 5), 40, 3, -100, 13)};
        em_reduction reds[3] = {EM_REDUCTION_MEAN, EM_REDUCTION_SUM, EM_REDUCTION_NONE};
        for (int r = 0; r < 3; r++)
            for (int opt = 0; opt < 4; opt++) { /* weights and smoothing, each on or off */
                ce_opts o = {em_cross_entropy_defaults(), w, ct_on_cuda(w)};
                o.c.reduction = reds[r];
                o.c.weight = opt & 1 ? w : NULL;
                o.c.label_smoothing = opt & 2 ? 0.15 : 0;
                char what[64];
                snprintf(what, sizeof what, "cross_entropy %s, reduction %d, options %d", em_dtype_name(dt),
                         r, opt);
                CPU_VS_CUDA(what, ce_opts_graph, &o, 2, in, ct_tol(dt));
            }
        em_scope_end(s);
    }
}

TEST(test_cuda_cross_entropy_rejects_a_target_out_of_range)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *x = ct_on_cuda(ct_randn(EM_F32, EM_SHAPE(4, 10), 7));
    em_tensor *t = targets(EM_SHAPE(4), 10, 0, 0, 8);
    ((int32_t *)em_data(t))[2] = 10;
    CHECK_ERR(em_cross_entropy(x, ct_on_cuda(t), -100), EM_ERR_INDEX, "out of range");
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
        em_tensor *in[2] = {ct_randn(CT_FLOAT_DTYPES[k], EM_SHAPE(6, 33), 40),
                            ct_randn(CT_FLOAT_DTYPES[k], EM_SHAPE(6, 33), 41)};
        CPU_VS_CUDA("mse_loss", mse_graph, NULL, 2, in, ct_tol(CT_FLOAT_DTYPES[k]));
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
    const norm_case cases[] = {{false, true, true},
                               {false, false, true},
                               {false, false, false},
                               {true, true, false},
                               {true, false, false}};
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < 5; c++) {
            em_scope s = em_scope_begin();
            em_dtype dt = CT_FLOAT_DTYPES[k];
            /* an offset mean, and enough rows (300) for several dweight chunks */
            em_tensor *x = em_add(ct_randn(dt, EM_SHAPE(3, 100, 70), 10), em_full(dt, 0, NULL, 4.0));
            em_tensor *in[3] = {x, ct_randn(dt, EM_SHAPE(70), 11), ct_randn(dt, EM_SHAPE(70), 12)};
            CPU_VS_CUDA(cases[c].rms ? "rms_norm" : "layer_norm", norm_graph, (void *)&cases[c], 3, in,
                        4 * ct_tol(dt));
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
        em_dtype dt = CT_FLOAT_DTYPES[k];
        /* 3*7 lookups into 5 rows: every row repeats */
        em_tensor *emb[2] = {ct_randn(dt, EM_SHAPE(5, 16), 20), targets(EM_SHAPE(3, 7), 5, 0, 0, 21)};
        CPU_VS_CUDA("embedding", emb_graph, NULL, 2, emb, ct_tol(dt));
        int dim = 1;
        em_tensor *sel[2] = {ct_randn(dt, EM_SHAPE(4, 10, 3), 22), targets(EM_SHAPE(12), 10, 0, 0, 23)};
        CPU_VS_CUDA("index_select dim 1", sel_graph, &dim, 2, sel, ct_tol(dt));
        em_scope_end(s);
    }
}

TEST(test_cuda_embedding_rejects_an_index_out_of_range)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *w = ct_on_cuda(ct_randn(EM_F32, EM_SHAPE(5, 4), 24));
    em_tensor *idx = targets(EM_SHAPE(6), 5, 0, 0, 25);
    ((int32_t *)em_data(idx))[3] = 5;
    CHECK_ERR(em_embedding(w, ct_on_cuda(idx)), EM_ERR_INDEX, "out of range");
    em_scope_end(s);
}

/* ---- dropout ---------------------------------------------------------------------------- */

TEST(test_cuda_dropout_draws_the_cpu_mask_exactly)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        em_dtype dt = CT_FLOAT_DTYPES[k];
        /* 1001 elements (not a multiple of 4), transposed (not contiguous) */
        em_tensor *x = em_transpose(ct_randn(dt, EM_SHAPE(7, 143), 30), 0, 1);
        em_tensor *xc = em_detach(x), *xg = ct_on_cuda(x);
        CHECK_OK(em_set_requires_grad(xc, true));
        CHECK_OK(em_set_requires_grad(xg, true));
        em_rng rc = em_rng_new(31), rg = em_rng_new(31);
        rc.offset = rg.offset = 5;
        em_tensor *yc = em_dropout(xc, 0.3, true, &rc), *yg = em_dropout(xg, 0.3, true, &rg);
        CHECK(yc && yg);
        CHECK(rc.offset == rg.offset);
        em_tensor *got = ct_on_cpu(yg);
        size_t bytes = (size_t)em_numel(yc) * em_dtype_size(dt);
        CHECK(got && memcmp(em_data(got), em_data(em_contiguous(yc)), bytes) == 0);
        em_tensor *cot = ct_randn(dt, EM_SHAPE(143, 7), 32);
        CHECK_OK(em_backward(yc, cot));
        CHECK_OK(em_backward(yg, ct_on_cuda(cot)));
        em_tensor *gc = em_contiguous(em_grad(xc)), *gg = ct_on_cpu(em_contiguous(em_grad(xg)));
        CHECK(gc && gg && memcmp(em_data(gg), em_data(gc), bytes) == 0);
        em_scope_end(s);
    }
}
