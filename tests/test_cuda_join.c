/* test_cuda_join.c — the CUDA paths of expand, concat / stack / split /
 * chunk, scatter_add, the value accessors (em_to_array, em_item,
 * em_copy_into, em_ones_like) and the GPT's KV-cache sampler, against the
 * CPU: the same inputs through both, forward values and gradients compared
 * per float dtype, with non-contiguous inputs. Every test skips where no
 * CUDA device is visible. */
#include <math.h>
#include <string.h>

#include "cuda_test.h"

/* ---- expand ----------------------------------------------------------------------- */

/* x (5,1,3) seen transposed as (3,1,5), expanded to (2,3,4,5) */
static em_tensor *expand_graph(em_tensor **in, void *ctx)
{
    (void)ctx;
    return em_expand(em_transpose(in[0], 0, 2), 4, (int64_t[]){2, 3, 4, 5});
}

TEST(test_cuda_expand_matches_the_cpu_and_its_gradient_sums_the_broadcast_dims)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        em_dtype dt = CT_FLOAT_DTYPES[k];
        em_tensor *x = ct_randn(dt, EM_SHAPE(5, 1, 3), 1);
        CPU_VS_CUDA("expand", expand_graph, NULL, 1, &x, ct_tol(dt));
        em_scope_end(s);
    }
}

/* ---- concat / stack / split / chunk ----------------------------------------------------- */

/* concat along dim 1 of a (2,3,4), b (2,4,5) seen transposed as (2,5,4), and c (2,1,4) */
static em_tensor *concat_graph(em_tensor **in, void *ctx)
{
    (void)ctx;
    em_tensor *parts[3] = {in[0], em_transpose(in[1], 1, 2), in[2]};
    return em_concat(3, parts, 1);
}

/* three (3,4) tensors, the middle one a transposed (4,3), stacked at dim 1 */
static em_tensor *stack_graph(em_tensor **in, void *ctx)
{
    int dim = *(int *)ctx;
    em_tensor *parts[3] = {in[0], em_transpose(in[1], 0, 1), in[2]};
    return em_stack(3, parts, dim);
}

TEST(test_cuda_concat_and_stack_match_the_cpu_with_strided_inputs)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        em_dtype dt = CT_FLOAT_DTYPES[k];
        em_tensor *cin[3] = {ct_randn(dt, EM_SHAPE(2, 3, 4), 2), ct_randn(dt, EM_SHAPE(2, 4, 5), 3),
                             ct_randn(dt, EM_SHAPE(2, 1, 4), 4)};
        CPU_VS_CUDA("concat dim 1", concat_graph, NULL, 3, cin, ct_tol(dt));
        em_tensor *sin[3] = {ct_randn(dt, EM_SHAPE(3, 4), 5), ct_randn(dt, EM_SHAPE(4, 3), 6),
                             ct_randn(dt, EM_SHAPE(3, 4), 7)};
        for (int dim = 0; dim <= 2; dim++) CPU_VS_CUDA("stack", stack_graph, &dim, 3, sin, ct_tol(dt));
        em_scope_end(s);
    }
}

/* x (3,7,4): split into pieces of 2 along dim 1 (the last of size 1) and
 * chunked into 3 along dim 1, the pieces combined so each gets a gradient */
static em_tensor *split_graph(em_tensor **in, void *ctx)
{
    (void)ctx;
    em_tensor *p[8], *q[8];
    if (em_split(in[0], 2, 1, p, 8) != 4 || em_chunk(in[0], 3, 1, q, 8) != 3) return NULL;
    em_tensor *a = em_add(em_mul_scalar(p[0], 2.0), p[1]); /* (3,2,4) */
    a = em_sub(a, em_expand(p[3], 3, (int64_t[]){3, 2, 4}));
    em_tensor *b = em_mul(q[0], q[1]); /* (3,3,4) */
    return em_concat(3, (em_tensor *[]){a, b, q[2]}, 1);
}

TEST(test_cuda_split_and_chunk_views_carry_gradients_like_the_cpu)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        em_dtype dt = CT_FLOAT_DTYPES[k];
        em_tensor *x = ct_randn(dt, EM_SHAPE(3, 7, 4), 8);
        CPU_VS_CUDA("split and chunk", split_graph, NULL, 1, &x, 2 * ct_tol(dt));
        em_scope_end(s);
    }
}

TEST(test_cuda_concat_refuses_inputs_on_two_devices)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *a = em_zeros(EM_F32, EM_SHAPE(2, 3)), *b = ct_on_cuda(a);
    CHECK_ERR(em_concat(2, (em_tensor *[]){a, b}, 0), EM_ERR_DEVICE, "concat");
    CHECK_ERR(em_stack(2, (em_tensor *[]){b, a}, 0), EM_ERR_DEVICE, "stack");
    em_scope_end(s);
}

/* ---- scatter_add ------------------------------------------------------------------- */

typedef struct scat_case {
    int dim;
    bool strided_src; /* src given transposed: (L, rows) seen as (rows, L) */
} scat_case;

static em_tensor *scatter_graph(em_tensor **in, void *ctx)
{
    scat_case *c = ctx;
    em_tensor *src = c->strided_src ? em_transpose(in[2], 0, 1) : in[2];
    return em_scatter_add(in[0], c->dim, in[1], src);
}

/* i32 indices of shape (r, c) in [0, limit), with repeats: every third is 0 */
static em_tensor *scatter_index(int64_t r, int64_t c, int64_t limit, uint64_t seed)
{
    em_rng g = em_rng_new(seed);
    em_tensor *t = em_randint(0, limit, EM_I32, EM_SHAPE(r, c), &g);
    int32_t *p = em_data(t);
    for (int64_t i = 0; i < r * c; i += 3) p[i] = 0;
    return t;
}

TEST(test_cuda_scatter_add_matches_the_cpu_with_repeated_indices)
{
    CUDA_OR_SKIP();
    for (int k = 0; k < 4; k++) {
        em_scope s = em_scope_begin();
        em_dtype dt = CT_FLOAT_DTYPES[k];
        /* dim 1: t (4,6), index and src (4,5): each row scatters 5 values into 6 slots */
        scat_case d1 = {1, false}, d1s = {1, true}, d0 = {0, false};
        em_tensor *a[3] = {ct_randn(dt, EM_SHAPE(4, 6), 10), scatter_index(4, 5, 6, 11),
                           ct_randn(dt, EM_SHAPE(4, 5), 12)};
        CPU_VS_CUDA("scatter_add dim 1", scatter_graph, &d1, 3, a, ct_tol(dt));
        em_tensor *b[3] = {a[0], a[1], ct_randn(dt, EM_SHAPE(5, 4), 13)};
        CPU_VS_CUDA("scatter_add dim 1, strided src", scatter_graph, &d1s, 3, b, ct_tol(dt));
        /* dim 0: t (3,5), index and src (7,4): many rows land on the same slot */
        em_tensor *c[3] = {ct_randn(dt, EM_SHAPE(3, 5), 14), scatter_index(7, 4, 3, 15),
                           ct_randn(dt, EM_SHAPE(7, 4), 16)};
        CPU_VS_CUDA("scatter_add dim 0", scatter_graph, &d0, 3, c, ct_tol(dt));
        em_scope_end(s);
    }
}

TEST(test_cuda_scatter_add_is_exact_and_repeats_bit_for_bit)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    /* i32: exact on both devices; f32: the CPU's order of additions, so equal bits */
    em_tensor *idx = scatter_index(50, 40, 9, 20);
    em_rng r = em_rng_new(23);
    em_tensor *ti = em_randint(-100, 100, EM_I32, EM_SHAPE(50, 9), &r);
    em_tensor *si = em_randint(-100, 100, EM_I32, EM_SHAPE(50, 40), &r);
    em_tensor *want = em_scatter_add(ti, 1, idx, si);
    em_tensor *got = ct_on_cpu(em_scatter_add(ct_on_cuda(ti), 1, ct_on_cuda(idx), ct_on_cuda(si)));
    CHECK(want && got && memcmp(em_data(got), em_data(want), 50 * 9 * sizeof(int32_t)) == 0);
    em_tensor *tf = ct_randn(EM_F32, EM_SHAPE(50, 9), 21), *sf = ct_randn(EM_F32, EM_SHAPE(50, 40), 22);
    em_tensor *wf = em_scatter_add(tf, 1, idx, sf);
    em_tensor *g1 = ct_on_cpu(em_scatter_add(ct_on_cuda(tf), 1, ct_on_cuda(idx), ct_on_cuda(sf)));
    em_tensor *g2 = ct_on_cpu(em_scatter_add(ct_on_cuda(tf), 1, ct_on_cuda(idx), ct_on_cuda(sf)));
    CHECK(wf && g1 && g2);
    CHECK(memcmp(em_data(g1), em_data(wf), 50 * 9 * sizeof(float)) == 0);
    CHECK(memcmp(em_data(g1), em_data(g2), 50 * 9 * sizeof(float)) == 0);
    em_scope_end(s);
}

TEST(test_cuda_scatter_add_rejects_an_index_out_of_range)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *idx = scatter_index(2, 3, 4, 30);
    ((int32_t *)em_data(idx))[4] = 4;
    em_tensor *t = ct_on_cuda(em_zeros(EM_F32, EM_SHAPE(2, 4)));
    em_tensor *src = ct_on_cuda(em_ones(EM_F32, EM_SHAPE(2, 3)));
    CHECK_ERR(em_scatter_add(t, 1, ct_on_cuda(idx), src), EM_ERR_INDEX, "out of range");
    CHECK_ERR(em_scatter_add(t, 1, idx, src), EM_ERR_DEVICE, "scatter_add");
    em_scope_end(s);
}

/* ---- values in and out of the device ------------------------------------------------ */

TEST(test_cuda_values_come_off_the_device_converted)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *x = ct_randn(EM_F32, EM_SHAPE(6, 5), 40), *d = em_transpose(ct_on_cuda(x), 0, 1);
    double want[30], got[30];
    CHECK_OK(em_to_array(em_transpose(x, 0, 1), EM_F64, want));
    CHECK_OK(em_to_array(d, EM_F64, got));
    CHECK(memcmp(want, got, sizeof want) == 0);
    CHECK(em_item(em_narrow(em_narrow(d, 0, 2, 1), 1, 3, 1)) == ((float *)em_data(x))[3 * 5 + 2]);
    em_tensor *ones = em_ones_like(d);
    CHECK(ones && em_device_of(ones).type == EM_CUDA);
    CHECK(em_item(em_sum(ones, 0, NULL, false)) == 30.0);
    /* copy_into within the device, and a refusal across devices */
    em_tensor *dst = ct_on_cuda(em_zeros(EM_BF16, EM_SHAPE(5, 6)));
    CHECK_OK(em_copy_into(dst, d));
    CHECK(th_max_abs_diff(ct_on_cpu(dst), em_cast(em_transpose(x, 0, 1), EM_BF16)) == 0);
    CHECK_ERR(em_copy_into(x, dst), EM_ERR_DEVICE, "em_copy_into");
    em_scope_end(s);
}

/* ---- the GPT's KV-cache sampler ------------------------------------------------------- */

static const em_gpt_config tiny = {.vocab_size = 17, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16,
                                   .bias = true};

TEST(test_cuda_gpt_cached_forward_and_sampling_match_the_cpu)
{
    CUDA_OR_SKIP();
    em_gpt *gc = em_gpt_new(&tiny, 7), *gg = em_gpt_new(&tiny, 7);
    CHECK(gc && gg);
    CHECK_OK(em_module_to(gg->m, em_device_cuda(0)));
    em_gpt_cache *cc = em_gpt_cache_new(gc, 1), *cg = em_gpt_cache_new(gg, 1);
    CHECK(cc && cg);
    em_scope s = em_scope_begin();
    const int32_t prompt[5] = {3, 1, 4, 1, 5};
    em_tensor *idx = em_from_data(EM_I32, EM_SHAPE(1, 5), prompt);
    /* a prompt of 5, then one token at a time: idx on the host, then on the device */
    em_tensor *lc = em_gpt_forward_cached(gc, cc, idx), *lg = em_gpt_forward_cached(gg, cg, idx);
    CHECK(lc && lg && em_device_of(lg).type == EM_CUDA);
    ct_check_close(__FILE__, __LINE__, "cached forward, prompt", lg, lc, 1e-4);
    em_tensor *next = em_narrow(idx, 1, 2, 1);
    lc = em_gpt_forward_cached(gc, cc, next);
    lg = em_gpt_forward_cached(gg, cg, ct_on_cuda(next));
    ct_check_close(__FILE__, __LINE__, "cached forward, one more", lg, lc, 1e-4);
    CHECK(em_gpt_cache_len(cg) == 6);
    em_scope_end(s);
    em_gpt_cache_free(cc);
    em_gpt_cache_free(cg);
    /* sampling past block_size (8): the window slides and the cache is recomputed */
    int32_t a[16], b[16];
    em_rng r1 = em_rng_new(11), r2 = em_rng_new(11);
    CHECK(em_gpt_sample(gc, prompt, 3, 12, 0.8, 5, &r1, a) == 15);
    CHECK(em_gpt_sample(gg, prompt, 3, 12, 0.8, 5, &r2, b) == 15);
    CHECK(memcmp(a, b, 15 * sizeof(int32_t)) == 0);
    em_gpt_free(gc);
    em_gpt_free(gg);
}
