/* test_cuda_conv.c — conv2d, max_pool2d and avg_pool2d on CUDA against the
 * CPU ops: the same random inputs through both, forward values and the
 * gradients of input, weight and bias compared for every float dtype, with
 * strides, padding, 1x1 kernels and non-contiguous inputs. Every test skips
 * where no CUDA device is visible. */
#include <string.h>

#include "cuda_test.h"

typedef struct conv_case {
    int stride, padding;
    bool bias, strided_x; /* x given as (N,C,W,H) and transposed into (N,C,H,W) */
} conv_case;

static em_tensor *conv_graph(em_tensor **in, void *ctx)
{
    conv_case *c = ctx;
    em_tensor *x = c->strided_x ? em_transpose(in[0], 2, 3) : in[0];
    return em_conv2d(x, in[1], c->bias ? in[2] : NULL, c->stride, c->padding);
}

TEST(test_cuda_conv2d_matches_the_cpu_forward_and_backward)
{
    CUDA_OR_SKIP();
    const struct {
        conv_case c;
        int64_t kh, kw;
    } cases[] = {
        {{1, 1, true, false}, 3, 3},  /* same-size 3x3 */
        {{2, 0, true, true}, 3, 2},   /* strided, rectangular kernel, non-contiguous x */
        {{1, 0, false, false}, 1, 1}, /* 1x1: the image is its own column matrix on the CPU */
        {{2, 2, false, true}, 5, 5},  /* padding wider than a stride */
    };
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            em_scope s = em_scope_begin();
            em_dtype dt = CT_FLOAT_DTYPES[k];
            const conv_case *c = &cases[i].c;
            /* N=2, C=3, H=9, W=7 (given as (2,3,7,9) when strided), O=4 */
            em_tensor *x = c->strided_x ? ct_randn(dt, EM_SHAPE(2, 3, 7, 9), 1) : ct_randn(dt, EM_SHAPE(2, 3, 9, 7), 1);
            em_tensor *in[3] = {x, ct_randn(dt, EM_SHAPE(4, 3, cases[i].kh, cases[i].kw), 2),
                                ct_randn(dt, EM_SHAPE(4), 3)};
            char what[64];
            snprintf(what, sizeof what, "conv2d case %zu", i);
            CPU_VS_CUDA(what, conv_graph, (void *)c, c->bias ? 3 : 2, in, 8 * ct_tol(dt));
            em_scope_end(s);
        }
}

TEST(test_cuda_conv2d_refuses_a_weight_on_another_device)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *x = ct_on_cuda(em_zeros(EM_F32, EM_SHAPE(1, 2, 5, 5))), *w = em_zeros(EM_F32, EM_SHAPE(3, 2, 3, 3));
    CHECK_ERR(em_conv2d(x, w, NULL, 1, 0), EM_ERR_DEVICE, "conv2d");
    em_scope_end(s);
}

typedef struct pool_case {
    bool is_max, strided_x;
    int kernel, stride, padding;
} pool_case;

static em_tensor *pool_graph(em_tensor **in, void *ctx)
{
    pool_case *c = ctx;
    em_tensor *x = c->strided_x ? em_transpose(in[0], 2, 3) : in[0];
    return c->is_max ? em_max_pool2d(x, c->kernel, c->stride, c->padding)
                     : em_avg_pool2d(x, c->kernel, c->stride, c->padding);
}

TEST(test_cuda_max_and_avg_pool2d_match_the_cpu_forward_and_backward)
{
    CUDA_OR_SKIP();
    const pool_case cases[] = {
        {true, false, 2, 2, 0}, {true, true, 3, 2, 1}, {true, false, 3, 1, 1}, /* overlapping windows */
        {false, false, 2, 2, 0}, {false, true, 3, 2, 1}, {false, false, 3, 1, 1},
    };
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            em_scope s = em_scope_begin();
            em_dtype dt = CT_FLOAT_DTYPES[k];
            em_tensor *x = ct_randn(dt, EM_SHAPE(2, 3, 9, 8), 10 + i);
            char what[64];
            snprintf(what, sizeof what, "%s case %zu", cases[i].is_max ? "max_pool2d" : "avg_pool2d", i);
            CPU_VS_CUDA(what, pool_graph, (void *)&cases[i], 1, &x, 2 * ct_tol(dt));
            em_scope_end(s);
        }
}

TEST(test_cuda_max_pool2d_picks_the_first_of_ties_like_the_cpu)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    /* a constant image: every window ties; the gradient goes to its first element */
    em_tensor *x = em_full(EM_F32, EM_SHAPE(1, 1, 4, 4), 2.0), *xg = ct_on_cuda(x);
    CHECK_OK(em_set_requires_grad(x, true));
    CHECK_OK(em_set_requires_grad(xg, true));
    em_tensor *yc = em_max_pool2d(x, 2, 1, 0), *yg = em_max_pool2d(xg, 2, 1, 0);
    CHECK_OK(em_backward(yc, em_ones_like(yc)));
    CHECK_OK(em_backward(yg, em_ones_like(yg)));
    em_tensor *gg = ct_on_cpu(em_grad(xg));
    CHECK(gg && memcmp(em_data(gg), em_data(em_grad(x)), 16 * sizeof(float)) == 0);
    em_scope_end(s);
}
