/* test_linear.c — the linear op (em_linear, tensor/ops_matmul.c): y = x @
 * W^T + b with the bias added as the GEMM stores its result. Its output and
 * every gradient hold the bits of the composition it replaces,
 * add(matmul(x, W^T), b), on every CPU product path (the f32 avx2 kernel,
 * sgemm, the bf16/f16 widening kernel under autocast, the AVX512-BF16 path
 * on its emulated kernel), at sizes that leave edge blocks and with a K deep
 * enough for the kernel's several KC steps; bad shapes fail naming them; a
 * CUDA tensor (the emulator) gives the CPU's values; nn.Linear is the op. */
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"
#include "harness.h"
#include "path_test.h"
#include "tensor/kernel_impl.h"

/* one case: x (rows, in) or (2, rows/2, in) when three_d; w (out, in); b
 * (out) unless no_bias; all in dt (leaves); the products under autocast ac
 * (EM_F32: off) */
typedef struct lcase {
    int64_t rows, in, out;
    bool three_d, no_bias;
    em_dtype dt, ac;
} lcase;

/* got and want hold the same bits */
static bool same_bits(em_tensor *got, em_tensor *want)
{
    if (!got || !want || em_dtype_of(got) != em_dtype_of(want) || em_numel(got) != em_numel(want))
        return false;
    size_t n = (size_t)em_numel(got) * em_dtype_size(em_dtype_of(got));
    return !memcmp(em_data(em_contiguous(got)), em_data(em_contiguous(want)), n);
}

/* The output of two steps (forward, then backward from a random
 * cotangent, the gradients accumulating in the leaves' buffers) by em_linear
 * (fused) or by the composition, and the leaves: x, w, b. */
static em_tensor *two_steps(const lcase *c, bool fused, em_tensor *leaf[3])
{
    em_rng r = em_rng_new((uint64_t)(c->rows * 131 + c->in * 7 + c->out));
    int64_t xs3[3] = {2, c->rows / 2, c->in}, xs2[2] = {c->rows, c->in};
    leaf[0] = em_cast(em_randn(EM_F32, c->three_d ? 3 : 2, c->three_d ? xs3 : xs2, &r), c->dt);
    leaf[1] = em_cast(em_randn(EM_F32, EM_SHAPE(c->out, c->in), &r), c->dt);
    leaf[2] = c->no_bias ? NULL : em_cast(em_randn(EM_F32, EM_SHAPE(c->out), &r), c->dt);
    for (int i = 0; i < 3; i++)
        if (leaf[i]) em_set_requires_grad(leaf[i], true);
    em_tensor *y = NULL;
    for (int step = 0; step < 2; step++) {
        em_dtype prev = em_autocast_set(c->ac);
        if (fused) {
            y = em_linear(leaf[0], leaf[1], leaf[2]);
        } else {
            y = em_matmul(leaf[0], em_transpose(leaf[1], 0, 1));
            if (leaf[2]) y = em_add(y, leaf[2]);
        }
        em_autocast_set(prev);
        CHECK_NOTNULL(y);
        if (!y) return NULL;
        em_tensor *g = em_cast(em_randn(EM_F32, em_ndim(y), em_shape(y), &r), em_dtype_of(y));
        CHECK_OK(em_backward(y, g));
    }
    return y;
}

/* em_linear and the composition agree bit for bit: y, dx, dW, db */
static void matches_composition(const char *what, lcase c)
{
    em_scope s = em_scope_begin();
    em_tensor *lf[3], *lc[3];
    em_tensor *yf = two_steps(&c, true, lf), *yc = two_steps(&c, false, lc);
    const char *names[3] = {"dx", "dW", "db"};
    if (!same_bits(yf, yc)) th_fail(__FILE__, __LINE__, "%s: y differs from add(matmul(x, W^T), b)", what);
    for (int i = 0; i < 3; i++)
        if (lf[i] && !same_bits(em_grad(lf[i]), em_grad(lc[i])))
            th_fail(__FILE__, __LINE__, "%s: %s differs from the composition's", what, names[i]);
    em_scope_end(s);
}

/* every shape of a case list in dt under autocast ac */
static void all_shapes_match(const char *path, em_dtype dt, em_dtype ac)
{
    static const lcase shapes[] = {
        {.rows = 5, .in = 7, .out = 33},                     /* edge blocks only */
        {.rows = 300, .in = 7, .out = 33, .three_d = true},  /* 3-D x, many row blocks */
        {.rows = 24, .in = 64, .out = 48},                   /* whole 6x16 blocks from the registers */
        {.rows = 36, .in = 300, .out = 40},                  /* K past one KC step (the deep path), edges */
        {.rows = 12, .in = 520, .out = 32, .three_d = true}, /* deep K, whole blocks */
        {.rows = 18, .in = 40, .out = 20, .no_bias = true},
        {.rows = 12, .in = 300, .out = 32, .three_d = true, .no_bias = true},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        lcase c = shapes[i];
        c.dt = dt;
        c.ac = ac;
        char what[160];
        snprintf(what, sizeof what, "%s, %s%s%s, x (%lld,%lld) w (%lld,%lld)%s", path, em_dtype_name(dt),
                 ac != EM_F32 ? " under autocast " : "", ac != EM_F32 ? em_dtype_name(ac) : "",
                 (long long)c.rows, (long long)c.in, (long long)c.out, (long long)c.in,
                 c.no_bias ? " no bias" : "");
        matches_composition(what, c);
    }
}

TEST(test_linear_f32_is_bitwise_add_of_matmul_on_the_default_path)
{
    use_f32_path(NULL);
    all_shapes_match("f32 path auto", EM_F32, EM_F32);
}

TEST(test_linear_f32_is_bitwise_add_of_matmul_on_the_avx2_kernel)
{
    if (!gemm_widen_usable()) SKIP("no AVX2+FMA on this CPU");
    use_f32_path("avx2");
    all_shapes_match("f32 path avx2", EM_F32, EM_F32);
    use_f32_path(NULL);
}

TEST(test_linear_f32_is_bitwise_add_of_matmul_on_sgemm)
{
    use_f32_path("sgemm");
    all_shapes_match("f32 path sgemm", EM_F32, EM_F32);
    use_f32_path(NULL);
}

TEST(test_linear_f64_is_bitwise_add_of_matmul) { all_shapes_match("dgemm", EM_F64, EM_F32); }

TEST(test_linear_under_bf16_autocast_is_bitwise_add_of_matmul)
{
    use_bf16_path("f32");
    all_shapes_match("bf16 path f32", EM_F32, EM_BF16);
    use_bf16_path(NULL);
}

TEST(test_linear_under_f16_autocast_is_bitwise_add_of_matmul)
{
    all_shapes_match("f16 widened", EM_F32, EM_F16);
}

TEST(test_linear_of_bf16_and_f16_tensors_is_bitwise_add_of_matmul)
{
    all_shapes_match("bf16 tensors", EM_BF16, EM_F32);
    all_shapes_match("f16 tensors", EM_F16, EM_F32);
}

/* the AVX512-BF16 path (its kernel's own source on ember's emulation of its
 * intrinsics): autocast casts x and W, and the bias is added after the GEMM */
TEST(test_linear_under_autocast_on_the_emulated_avx512bf16_path_is_bitwise_add_of_matmul)
{
    gemm_dpbf16_use_kernel_for_test(dp_kernel_emulated);
    use_bf16_path("avx512bf16");
    all_shapes_match("bf16 path avx512bf16 (emulated)", EM_F32, EM_BF16);
    use_bf16_path(NULL);
    gemm_dpbf16_use_kernel_for_test(NULL);
}

TEST(test_linear_under_autocast_gives_an_f32_output_with_a_bias_and_a_low_one_without)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(4, 8)), *w = em_ones(EM_F32, EM_SHAPE(3, 8)),
              *b = em_ones(EM_F32, EM_SHAPE(3));
    em_dtype prev = em_autocast_set(EM_BF16);
    em_tensor *yb = em_linear(x, w, b), *y = em_linear(x, w, NULL);
    em_autocast_set(prev);
    CHECK(yb && em_dtype_of(yb) == EM_F32);
    CHECK(y && em_dtype_of(y) == EM_BF16);
    em_scope_end(s);
}

TEST(test_linear_takes_a_vector_x)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(3);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(7), &r), *w = em_randn(EM_F32, EM_SHAPE(5, 7), &r),
              *b = em_randn(EM_F32, EM_SHAPE(5), &r);
    em_tensor *y = em_linear(x, w, b);
    em_tensor *want = em_add(em_squeeze(em_matmul(em_unsqueeze(x, 0), em_transpose(w, 0, 1)), 0), b);
    CHECK(y && em_ndim(y) == 1 && em_shape(y)[0] == 5);
    CHECK(same_bits(y, want));
    em_scope_end(s);
}

TEST(test_linear_rejects_bad_shapes_naming_them)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(4, 8)), *w = em_ones(EM_F32, EM_SHAPE(3, 8)),
              *b = em_ones(EM_F32, EM_SHAPE(3));
    CHECK_ERR(em_linear(x, em_ones(EM_F32, EM_SHAPE(3, 9)), b), EM_ERR_SHAPE, "x is (4,8), w is (3,9)");
    CHECK_ERR(em_linear(x, em_ones(EM_F32, EM_SHAPE(3, 8, 1)), b), EM_ERR_SHAPE, "w is (3,8,1)");
    CHECK_ERR(em_linear(x, w, em_ones(EM_F32, EM_SHAPE(4))), EM_ERR_SHAPE, "b is (4,)");
    CHECK_ERR(em_linear(x, w, em_ones(EM_F32, EM_SHAPE(1, 3))), EM_ERR_SHAPE, "b is (1,3)");
    CHECK_ERR(em_linear(em_scalar(EM_F32, 1.0), w, b), EM_ERR_SHAPE, "x is ()");
    em_scope_end(s);
}

TEST(test_linear_rejects_mixed_and_integer_dtypes_naming_them)
{
    em_scope s = em_scope_begin();
    em_tensor *x = em_ones(EM_F32, EM_SHAPE(4, 8)), *w = em_ones(EM_F32, EM_SHAPE(3, 8)),
              *b = em_ones(EM_F32, EM_SHAPE(3));
    CHECK_ERR(em_linear(x, em_ones(EM_F64, EM_SHAPE(3, 8)), b), EM_ERR_DTYPE, "f64");
    CHECK_ERR(em_linear(x, w, em_ones(EM_BF16, EM_SHAPE(3))), EM_ERR_DTYPE, "b is bf16");
    CHECK_ERR(em_linear(em_ones(EM_I32, EM_SHAPE(4, 8)), em_ones(EM_I32, EM_SHAPE(3, 8)), NULL), EM_ERR_DTYPE,
              "float");
    em_scope_end(s);
}

/* nn.Linear's forward is one linear op: no matmul, no separate add */
TEST(test_nn_linear_forward_is_one_linear_op)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(1);
    em_module *root = em_module_new(NULL, "root");
    em_nn_linear *l = em_nn_linear_new(root, "fc", 8, 5, true, &r);
    CHECK_NOTNULL(l);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(2, 3, 8), &r);
    em_profile_reset();
    em_profile_start();
    em_tensor *y = em_nn_linear_forward(l, x);
    em_profile_stop();
    CHECK(y && em_ndim(y) == 3 && em_shape(y)[2] == 5);
    em_profile_row rows[64];
    int64_t n = em_profile_rows(rows, 64);
    int64_t linear = 0, other = 0;
    for (int64_t i = 0; i < n && i < 64; i++) {
        if (strcmp(rows[i].category, "op")) continue;
        if (!strcmp(rows[i].name, "linear"))
            linear += rows[i].calls;
        else if (!strcmp(rows[i].name, "matmul") || !strcmp(rows[i].name, "add"))
            other += rows[i].calls;
    }
    CHECK(linear == 1 && other == 0);
    em_scope_end(s);
    em_module_free(root);
}

/* ---- CUDA (the emulator under -Dcuda=sim) ------------------------------------------------- */

static em_tensor *linear_graph(em_tensor **in, void *ctx)
{
    (void)ctx;
    return em_linear(in[0], in[1], in[2]);
}

static em_tensor *linear_graph_no_bias(em_tensor **in, void *ctx)
{
    (void)ctx;
    return em_linear(in[0], in[1], NULL);
}

TEST(test_linear_on_cuda_matches_the_cpu)
{
    CUDA_OR_SKIP();
    for (int d = 0; d < 4; d++) {
        em_dtype dt = CT_FLOAT_DTYPES[d];
        em_scope s = em_scope_begin();
        em_tensor *in[3] = {ct_randn(dt, EM_SHAPE(2, 5, 7), 1), ct_randn(dt, EM_SHAPE(33, 7), 2),
                            ct_randn(dt, EM_SHAPE(33), 3)};
        char what[64];
        snprintf(what, sizeof what, "linear %s", em_dtype_name(dt));
        CPU_VS_CUDA(what, linear_graph, NULL, 3, in, ct_tol(dt));
        CPU_VS_CUDA(what, linear_graph_no_bias, NULL, 2, in, ct_tol(dt));
        em_scope_end(s);
    }
}

/* under bf16 autocast the device casts x and W, keeps the f32 bias, and
 * gives an f32 output as the CPU does */
static em_tensor *linear_autocast_graph(em_tensor **in, void *ctx)
{
    (void)ctx;
    em_dtype prev = em_autocast_set(EM_BF16);
    em_tensor *y = em_linear(in[0], in[1], in[2]);
    em_autocast_set(prev);
    return y;
}

TEST(test_linear_on_cuda_under_autocast_matches_the_cpu)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    em_tensor *in[3] = {ct_randn(EM_F32, EM_SHAPE(2, 5, 40), 4), ct_randn(EM_F32, EM_SHAPE(24, 40), 5),
                        ct_randn(EM_F32, EM_SHAPE(24), 6)};
    CPU_VS_CUDA("linear under bf16 autocast", linear_autocast_graph, NULL, 3, in, ct_tol(EM_BF16));
    em_tensor *y =
        linear_autocast_graph((em_tensor *[]){ct_on_cuda(in[0]), ct_on_cuda(in[1]), ct_on_cuda(in[2])}, NULL);
    CHECK(y && em_dtype_of(y) == EM_F32);
    em_scope_end(s);
}
