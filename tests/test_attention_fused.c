/* test_attention_fused.c — the fused f32 attention head (tensor/attention_avx2.c)
 * against an f64 reference and against the portable per-head GEMM path: odd
 * T and D, D not a multiple of 8, the strided q/k/v of a fused QKV
 * projection, a single head split by rows over the pool, and the same bits
 * at 1 and 2 threads. */
#include <stdlib.h>

#include "harness.h"
#include "tensor/kernel_impl.h"

static bool fused_here(void) { return attention_fused_usable(64, 32); }

/* o and the gradients of sum(o * g) for q, k, v (B,H,T,D) in dtype dt,
 * computed from the f64 values x[0..4) (q, k, v, g); out[0] = o, out[1..4) =
 * dq, dk, dv, as f64 tensors */
static void run(em_dtype dt, em_tensor *const x[4], em_tensor *out[4])
{
    em_tensor *in[4];
    for (int i = 0; i < 4; i++) in[i] = em_cast(x[i], dt);
    for (int i = 0; i < 3; i++) CHECK_OK(em_set_requires_grad(in[i], true));
    em_tensor *o = em_attention_causal(in[0], in[1], in[2], 0.0);
    CHECK_NOTNULL(o);
    CHECK_OK(em_backward(o, in[3]));
    out[0] = em_cast(o, EM_F64);
    for (int i = 0; i < 3; i++) out[i + 1] = em_cast(em_grad(in[i]), EM_F64);
}

/* max |a - b| / (max |b| + 1) */
static double rel_diff(em_tensor *a, em_tensor *b)
{
    return th_max_abs_diff(a, b) / (em_item(em_max(em_abs(b), 0, NULL, false)) + 1.0);
}

static void randn4(int64_t B, int64_t H, int64_t T, int64_t D, uint64_t seed, em_tensor *x[4])
{
    em_rng r = em_rng_new(seed);
    for (int i = 0; i < 4; i++) x[i] = em_randn(EM_F64, EM_SHAPE(B, H, T, D), &r);
}

TEST(test_attention_f32_matches_f64_at_odd_lengths_and_head_dims)
{
    if (!fused_here()) SKIP("this CPU has no AVX2+FMA: the fused attention head cannot run here");
    static const int64_t sizes[] = {1, 3, 8, 17, 63, 65, 129};
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 7; b++) {
            int64_t T = sizes[a], D = sizes[b];
            th_case("T=%lld D=%lld", (long long)T, (long long)D);
            em_scope s = em_scope_begin();
            em_tensor *x[4], *want[4], *got[4];
            randn4(1, 2, T, D, (uint64_t)(T * 1000 + D), x);
            run(EM_F64, x, want);
            run(EM_F32, x, got);
            for (int i = 0; i < 4; i++) CHECK(rel_diff(got[i], want[i]) < 4e-6);
            em_scope_end(s);
        }
    th_case(NULL);
}

/* The fused head against the per-head GEMMs it replaced, both in f32. */
static void fused_matches_portable(int64_t B, int64_t H, int64_t T, int64_t D)
{
    th_case("B=%lld H=%lld T=%lld D=%lld", (long long)B, (long long)H, (long long)T, (long long)D);
    em_scope s = em_scope_begin();
    em_tensor *x[4], *fused[4], *portable[4];
    randn4(B, H, T, D, (uint64_t)(B + 10 * H + 100 * T + 1000 * D), x);
    run(EM_F32, x, fused);
    attention_fused_disable(true);
    run(EM_F32, x, portable);
    attention_fused_disable(false);
    for (int i = 0; i < 4; i++) CHECK(rel_diff(fused[i], portable[i]) < 3e-6);
    em_scope_end(s);
    th_case(NULL);
}

TEST(test_attention_fused_head_matches_the_portable_path_at_the_gpt_shapes)
{
    if (!fused_here()) SKIP("this CPU has no AVX2+FMA: the fused attention head cannot run here");
    fused_matches_portable(2, 4, 64, 32);   /* the tiny GPT's heads */
    fused_matches_portable(1, 12, 64, 64);  /* GPT-2 124M's */
    fused_matches_portable(1, 2, 256, 128); /* the largest the fused head takes */
    fused_matches_portable(2, 3, 21, 12);   /* D not a multiple of 8 */
}

/* q, k, v (B,H,T,D) narrowed from one (B,T,3HD) tensor and permuted, as
 * the fused QKV projection makes them: rows 3HD apart, heads D apart */
static void qkv_views(em_tensor *qkv, int64_t H, int64_t D, em_tensor *v[3])
{
    const int64_t *sh = em_shape(qkv);
    for (int i = 0; i < 3; i++)
        v[i] = em_permute(em_reshape(em_narrow(qkv, 2, i * H * D, H * D), EM_SHAPE(sh[0], sh[1], H, D)),
                          (int[]){0, 2, 1, 3});
}

static void strided_views_give_same_bits(int64_t T, int64_t D)
{
    th_case("T=%lld D=%lld", (long long)T, (long long)D);
    em_scope s = em_scope_begin();
    enum { B = 2, H = 3 };
    em_rng r = em_rng_new((uint64_t)(T + D));
    em_tensor *qkv = em_randn(EM_F32, EM_SHAPE(B, T, 3 * H * D), &r),
              *g = em_randn(EM_F32, EM_SHAPE(B, H, T, D), &r);
    em_tensor *view[3], *copy[3];
    CHECK_OK(em_set_requires_grad(qkv, true));
    qkv_views(qkv, H, D, view);
    for (int i = 0; i < 3; i++) {
        CHECK(!em_is_contiguous(view[i]));
        copy[i] = em_contiguous(em_detach(view[i]));
        CHECK_OK(em_set_requires_grad(copy[i], true));
    }
    em_tensor *o = em_attention_causal(view[0], view[1], view[2], 0.0);
    em_tensor *oc = em_attention_causal(copy[0], copy[1], copy[2], 0.0);
    CHECK(th_max_abs_diff(o, oc) == 0);
    CHECK_OK(em_backward(o, g));
    CHECK_OK(em_backward(oc, g));
    em_tensor *gv[3];
    qkv_views(em_grad(qkv), H, D, gv);
    for (int i = 0; i < 3; i++) CHECK(th_max_abs_diff(gv[i], em_grad(copy[i])) == 0);
    em_scope_end(s);
    th_case(NULL);
}

TEST(test_attention_fused_head_reads_strided_qkv_views_as_contiguous_copies)
{
    if (!fused_here()) SKIP("this CPU has no AVX2+FMA: the fused attention head cannot run here");
    strided_views_give_same_bits(64, 32); /* read in place */
    strided_views_give_same_bits(17, 12); /* rows copied, padded to 16 */
}

/* o and gradients at n threads, as f32 bytes compared by the caller */
static void run_at(int threads, em_tensor *const x[4], em_tensor *out[4])
{
    CHECK_OK(em_set_num_threads(threads));
    em_tensor *f[4];
    for (int i = 0; i < 4; i++) f[i] = em_cast(x[i], EM_F32);
    for (int i = 0; i < 3; i++) CHECK_OK(em_set_requires_grad(f[i], true));
    out[0] = em_attention_causal(f[0], f[1], f[2], 0.0);
    CHECK_NOTNULL(out[0]);
    CHECK_OK(em_backward(out[0], f[3]));
    for (int i = 0; i < 3; i++) out[i + 1] = em_grad(f[i]);
}

static void same_bits_at_1_and_2_threads(int64_t B, int64_t H, int64_t T, int64_t D)
{
    th_case("B=%lld H=%lld T=%lld D=%lld", (long long)B, (long long)H, (long long)T, (long long)D);
    int before = em_num_threads();
    em_scope s = em_scope_begin();
    em_tensor *x[4], *one[4], *two[4];
    randn4(B, H, T, D, (uint64_t)(T * D + H), x);
    run_at(1, x, one);
    run_at(2, x, two);
    CHECK_OK(em_set_num_threads(before));
    for (int i = 0; i < 4; i++) CHECK(th_max_abs_diff(one[i], two[i]) == 0);
    em_scope_end(s);
    th_case(NULL);
}

TEST(test_attention_fused_head_gives_the_same_bits_at_1_and_2_threads)
{
    if (!fused_here()) SKIP("this CPU has no AVX2+FMA: the fused attention head cannot run here");
    same_bits_at_1_and_2_threads(3, 4, 64, 32); /* whole heads per thread */
    same_bits_at_1_and_2_threads(1, 1, 65, 17); /* one head, its rows split */
}

/* A single head is split by blocks of rows over the pool; each element is
 * computed as it is when the head runs whole among others. */
TEST(test_attention_fused_single_head_equals_the_same_head_in_a_batch)
{
    if (!fused_here()) SKIP("this CPU has no AVX2+FMA: the fused attention head cannot run here");
    em_scope s = em_scope_begin();
    em_tensor *x[4], *batch[4], *single[4], *head[4];
    randn4(1, 3, 129, 40, 5, x);
    run(EM_F32, x, batch);
    for (int i = 0; i < 4; i++) head[i] = em_narrow(x[i], 1, 1, 1);
    run(EM_F32, head, single);
    for (int i = 0; i < 4; i++) CHECK(th_max_abs_diff(single[i], em_narrow(batch[i], 1, 1, 1)) == 0);
    em_scope_end(s);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include "tensor/vmath_impl.h"

__attribute__((target("avx2,fma"))) static void exp8(const float *x, float *y)
{
    _mm256_storeu_ps(y, vexpf8_avx2(_mm256_loadu_ps(x)));
}

/* The softmax rows' exp: vexpf's bounds against expf (tests/test_unary.c)
 * hold for it, over [-100, 100] and the special values. */
TEST(test_vexpf8_is_within_2_ulp_of_expf_and_keeps_vexpf_limits)
{
    if (!fused_here()) SKIP("this CPU has no AVX2+FMA: vexpf8_avx2 cannot run here");
    enum { N = 200000 };
    for (int i = 0; i < N; i += 8) {
        float x[8], y[8];
        for (int l = 0; l < 8; l++) x[l] = -100.0f + 200.0f * (float)(i + l) / N;
        exp8(x, y);
        for (int l = 0; l < 8; l++) {
            float e = expf(x[l]);
            int ex;
            frexpf(e, &ex);
            double ulp = ldexp(1.0, ex - 24);
            /* as for vexpf: 0 only where expf is under 1.7e-38, inf only where it is
             * within 0.3% of FLT_MAX, else within 2 ulp */
            bool ok = y[l] == 0     ? e < 1.7e-38f
                      : isinf(y[l]) ? e > 3.39e38f
                                    : fabs((double)y[l] - e) <= 2 * ulp;
            if (!ok) th_fail(__FILE__, __LINE__, "vexpf8(%.9g) = %.9g, expf %.9g", x[l], y[l], e);
        }
    }
    float x[8] = {NAN, -INFINITY, INFINITY, -87.5f, 89.0f, 0.0f, -0.0f, 1.0f}, y[8];
    exp8(x, y);
    CHECK(isnan(y[0]) && y[1] == 0 && isinf(y[2]) && y[3] == 0 && isinf(y[4]) && y[5] == 1 && y[6] == 1);
    CHECK_NEAR(y[7], expf(1.0f), 2 * 0x1p-23);
}
#endif
