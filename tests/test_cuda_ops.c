/* test_cuda_ops.c — every op on every backend: one table of cases, each an
 * op the op list (tensor/ops.def) gives a CUDA backend, with its inputs,
 * run on the CPU and on cuda:0 for every float dtype it takes; the outputs
 * and the gradients of sum(out * r) for a random r must agree within the
 * dtype's tolerance. Adding an op's CUDA path adds a row here (a unary op
 * adds its row to tests/unary_cases.h, which this file shares). Two last
 * tests check the other direction (every such op has a row) and that each
 * name lives once (ops and the non-op CUDA entry points of tensor/device.c).
 *
 * Tolerances are relative to max(1, max |cpu|): f64 1e-10, f32 2e-5, f16
 * 4e-3, bf16 3e-2 (one rounding of the dtype plus a different order of
 * summation: the device reduces in trees, the CPU in blocks); gradients
 * get 4x that, having gone through one more op. Without a device (CI's
 * nvcc build) every case skips; under the emulator (-Dcuda=sim) all run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test.h"
#include "tensor/ops.h"
#include "unary_cases.h"

/* from tensor/device.c: whether a name takes CUDA tensors, and the API
 * functions that are not ops but do */
bool cuda_op_ok(const char *name);
size_t cuda_entry_count(void);
const char *cuda_entry_name(size_t i);

typedef enum {
    IN_NORMAL,   /* N(0,1) */
    IN_POSITIVE, /* |N(0,1)| + 0.5: log, sqrt, pow */
    IN_WHOLE,    /* small whole numbers: ties for compares and max/min */
    IN_INDEX,    /* i32 in [0, hi) */
    IN_MASK,     /* bool, about half set */
} in_kind;

typedef struct in_spec {
    in_kind kind;
    int ndim;
    int64_t shape[4];
    int64_t hi;      /* IN_INDEX: the range */
    bool transposed; /* made as the transpose of its last two dims: a non-contiguous input */
} in_spec;

typedef em_tensor *(*op_run)(em_tensor *const *in);

typedef struct op_case {
    const char *op; /* its name in the op list */
    op_run run;
    int nin;
    in_spec in[4];
    bool no_grad;         /* an output that is not differentiable (compares, argmax) */
    bool exact;           /* the device must give the CPU's bits (copies, views, dropout masks) */
    const unary_case *un; /* a unary op: run is NULL, uc_apply runs it */
} op_case;

#define S(...) {__VA_ARGS__}
#define N(nd, ...) {IN_NORMAL, nd, S(__VA_ARGS__), 0, false}
#define NT(nd, ...) {IN_NORMAL, nd, S(__VA_ARGS__), 0, true}
#define P(nd, ...) {IN_POSITIVE, nd, S(__VA_ARGS__), 0, false}
#define W(nd, ...) {IN_WHOLE, nd, S(__VA_ARGS__), 0, false}
#define IDX(hi, nd, ...) {IN_INDEX, nd, S(__VA_ARGS__), hi, false}
#define MASK(nd, ...) {IN_MASK, nd, S(__VA_ARGS__), 0, false}

/* ---- the runners: one line each ----------------------------------------------------- */
#define UN(name, expr)                                                                                       \
    static em_tensor *run_##name(em_tensor *const *in) { return (expr); }
UN(add, em_add(in[0], in[1]))
UN(sub, em_sub(in[0], in[1]))
UN(mul, em_mul(in[0], in[1]))
UN(div, em_div(in[0], in[1]))
UN(add_scalar, em_add_scalar(in[0], 0.75))
UN(mul_scalar, em_mul_scalar(in[0], -1.25))
UN(neg, em_neg(in[0]))
UN(eq, em_eq(in[0], in[1]))
UN(ne, em_ne(in[0], in[1]))
UN(lt, em_lt(in[0], in[1]))
UN(le, em_le(in[0], in[1]))
UN(gt, em_gt(in[0], in[1]))
UN(ge, em_ge(in[0], in[1]))
UN(where, em_where(in[0], in[1], in[2]))
UN(masked_fill, em_masked_fill(in[0], in[1], -1.5))
UN(sum, em_sum(in[0], 1, (int[]){1}, false))
UN(sum_all, em_sum(in[0], 0, NULL, false))
UN(mean, em_mean(in[0], 2, (int[]){0, 2}, true))
UN(max, em_max(in[0], 1, (int[]){1}, false))
UN(min, em_min(in[0], 1, (int[]){0}, true))
UN(argmax, em_argmax(in[0], 1, false))
UN(matmul, em_matmul(in[0], in[1]))
UN(linear, em_linear(in[0], in[1], in[2]))
UN(attention, em_attention_causal(in[0], in[1], in[2], 0.35))
UN(attention_qkv, em_attention_causal_qkv(in[0], 2, 0.35))
UN(softmax, em_softmax(in[0], -1))
UN(log_softmax, em_log_softmax(in[0], -1))
UN(cross_entropy, em_cross_entropy(in[0], in[1], -100))
UN(mse_loss, em_mse_loss(in[0], in[1]))
UN(layer_norm, em_layer_norm(in[0], in[1], in[2], 1e-5))
UN(rms_norm, em_rms_norm(in[0], in[1], 1e-5))
UN(embedding, em_embedding(in[0], in[1]))
UN(index_select, em_index_select(in[0], 0, in[1]))
UN(reshape, em_reshape(in[0], EM_SHAPE(5, 12)))
UN(view, em_view(in[0], EM_SHAPE(12, 5)))
UN(flatten, em_flatten(in[0]))
UN(transpose, em_transpose(in[0], 0, 2))
UN(permute, em_permute(in[0], (int[]){2, 0, 1}))
UN(squeeze, em_squeeze(in[0], 1))
UN(unsqueeze, em_unsqueeze(in[0], 1))
UN(slice, em_slice(in[0], 1, 1, 7, 2))
UN(narrow, em_narrow(in[0], 0, 1, 3))
UN(contiguous, em_contiguous(in[0]))
UN(copy, em_copy(in[0]))
UN(cast, em_cast(em_cast(in[0], EM_F64), em_dtype_of(in[0])))
/* to the CPU and back: on the device two moves, on the CPU none */
UN(to, em_to(em_to(in[0], em_device_cpu()), em_device_of(in[0])))
UN(expand, em_expand(in[0], EM_SHAPE(3, 4, 5)))
UN(concat, em_concat(2, (em_tensor *[]){in[0], in[1]}, 1))
UN(stack, em_stack(2, (em_tensor *[]){in[0], in[1]}, 0))
UN(scatter_add, em_scatter_add(in[0], 0, in[1], in[2]))

/* split / chunk: views, combined so that every piece gets a gradient */
static em_tensor *run_split(em_tensor *const *in)
{
    em_tensor *p[4];
    return em_split(in[0], 2, 1, p, 4) == 3 ? em_sub(em_mul_scalar(p[0], 2.0), p[2]) : NULL;
}
static em_tensor *run_chunk(em_tensor *const *in)
{
    em_tensor *p[4];
    return em_chunk(in[0], 2, 0, p, 4) == 2 ? em_add(p[0], em_mul_scalar(p[1], -0.5)) : NULL;
}
UN(conv2d, em_conv2d(in[0], in[1], in[2], 1, 1))
UN(conv2d_stride2, em_conv2d(in[0], in[1], NULL, 2, 0))
UN(max_pool2d, em_max_pool2d(in[0], 2, 2, 0))
UN(avg_pool2d, em_avg_pool2d(in[0], 3, 2, 1))

/* dropout: the same generator state on both devices gives the same mask */
static em_tensor *run_dropout(em_tensor *const *in)
{
    em_rng r = em_rng_new(99);
    return em_dropout(in[0], 0.3, true, &r);
}

/* ---- the table ------------------------------------------------------------------------
 * Rows leave no_grad / exact out when false (hence the pragma). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const op_case cases[] = {
    /* binary, with broadcasting and a transposed operand */
    {"add", run_add, 2, {N(3, 3, 4, 5), NT(2, 4, 5)}},
    {"sub", run_sub, 2, {NT(2, 6, 7), N(2, 6, 7)}},
    {"mul", run_mul, 2, {N(3, 2, 3, 4), N(1, 4)}},
    {"div", run_div, 2, {N(2, 5, 6), P(2, 5, 6)}},
    {"add_scalar", run_add_scalar, 1, {NT(2, 7, 9)}},
    {"mul_scalar", run_mul_scalar, 1, {N(2, 7, 9)}},
    {"neg", run_neg, 1, {N(1, 31)}},
    /* unary maths: a row per line of tests/unary_cases.h, added by with_unary_cases */
    /* compares: exact */
    {"eq", run_eq, 2, {W(2, 9, 8), W(2, 9, 8)}, true, true},
    {"ne", run_ne, 2, {W(2, 9, 8), W(1, 8)}, true, true},
    {"lt", run_lt, 2, {W(2, 9, 8), W(2, 9, 8)}, true, true},
    {"le", run_le, 2, {W(2, 9, 8), W(2, 9, 8)}, true, true},
    {"gt", run_gt, 2, {W(2, 9, 8), W(2, 9, 8)}, true, true},
    {"ge", run_ge, 2, {W(2, 9, 8), W(2, 9, 8)}, true, true},
    {"where", run_where, 3, {MASK(2, 6, 5), N(2, 6, 5), N(1, 5)}},
    {"masked_fill", run_masked_fill, 2, {N(2, 6, 5), MASK(2, 6, 5)}},
    /* reductions */
    {"sum", run_sum, 1, {N(3, 4, 70, 3)}},
    {"sum", run_sum_all, 1, {NT(2, 33, 17)}},
    {"mean", run_mean, 1, {N(3, 4, 5, 6)}},
    {"max", run_max, 1, {W(3, 4, 9, 3)}},
    {"min", run_min, 1, {W(2, 9, 4)}},
    {"argmax", run_argmax, 1, {W(2, 9, 7)}, true, true},
    /* products */
    {"matmul", run_matmul, 2, {N(3, 2, 5, 7), NT(2, 7, 3)}},
    {"linear", run_linear, 3, {N(3, 2, 5, 7), NT(2, 3, 7), N(1, 3)}},
    {"attention", run_attention, 3, {N(4, 2, 2, 9, 8), N(4, 2, 2, 9, 8), N(4, 2, 2, 9, 8)}},
    {"attention_qkv", run_attention_qkv, 1, {N(3, 2, 9, 48)}},
    /* neural-network ops */
    {"softmax", run_softmax, 1, {N(2, 4, 37)}},
    {"log_softmax", run_log_softmax, 1, {N(2, 4, 37)}},
    {"cross_entropy", run_cross_entropy, 2, {N(2, 6, 11), IDX(11, 1, 6)}},
    {"mse_loss", run_mse_loss, 2, {N(2, 5, 4), N(2, 5, 4)}},
    {"layer_norm", run_layer_norm, 3, {N(2, 5, 24), N(1, 24), N(1, 24)}},
    {"rms_norm", run_rms_norm, 2, {N(3, 2, 5, 24), N(1, 24)}},
    {"embedding", run_embedding, 2, {N(2, 10, 6), IDX(10, 2, 3, 4)}},
    {"index_select", run_index_select, 2, {N(2, 7, 5), IDX(7, 1, 4)}},
    {"dropout", run_dropout, 1, {N(2, 9, 13)}, false, true},
    /* views and copies: the CPU's bits */
    {"reshape", run_reshape, 1, {N(3, 3, 4, 5)}, false, true},
    {"view", run_view, 1, {N(2, 6, 10)}, false, true},
    {"flatten", run_flatten, 1, {NT(2, 6, 10)}, false, true},
    {"transpose", run_transpose, 1, {N(3, 3, 4, 5)}, false, true},
    {"permute", run_permute, 1, {N(3, 3, 4, 5)}, false, true},
    {"squeeze", run_squeeze, 1, {N(3, 3, 1, 5)}, false, true},
    {"unsqueeze", run_unsqueeze, 1, {NT(2, 3, 5)}, false, true},
    {"slice", run_slice, 1, {N(2, 4, 9)}, false, true},
    {"narrow", run_narrow, 1, {NT(2, 5, 6)}, false, true},
    {"contiguous", run_contiguous, 1, {NT(2, 5, 6)}, false, true},
    {"copy", run_copy, 1, {NT(2, 5, 6)}, false, true},
    {"cast", run_cast, 1, {N(2, 5, 6)}, false, true},
    {"to", run_to, 1, {NT(2, 5, 6)}, false, true},
    {"expand", run_expand, 1, {N(3, 1, 4, 1)}},
    {"concat", run_concat, 2, {N(2, 3, 4), NT(2, 3, 2)}, false, true},
    {"stack", run_stack, 2, {N(2, 3, 4), NT(2, 3, 4)}, false, true},
    {"split", run_split, 1, {NT(2, 5, 6)}},
    {"chunk", run_chunk, 1, {N(2, 6, 5)}},
    {"scatter_add", run_scatter_add, 3, {N(2, 5, 3), IDX(5, 2, 7, 3), N(2, 7, 3)}},
    {"conv2d", run_conv2d, 3, {N(4, 2, 3, 7, 6), N(4, 4, 3, 3, 3), N(1, 4)}},
    {"conv2d", run_conv2d_stride2, 2, {N(4, 1, 2, 9, 8), N(4, 3, 2, 3, 3)}},
    {"max_pool2d", run_max_pool2d, 1, {N(4, 2, 3, 8, 6)}},
    {"avg_pool2d", run_avg_pool2d, 1, {N(4, 2, 3, 7, 7)}},
};
#pragma GCC diagnostic pop
enum { NCASES = sizeof cases / sizeof cases[0], NALL = NCASES + N_UNARY_CASES };

/* cases, then a case per row of the unary test table (normal inputs, every
 * other one transposed; positive ones where the op needs them) */
static const op_case *with_unary_cases(void)
{
    static op_case all[NALL];
    memcpy(all, cases, sizeof cases);
    for (int k = 0; k < N_UNARY_CASES; k++) {
        const unary_case *u = &unary_cases[k];
        in_spec in = {u->domain == UC_POS ? IN_POSITIVE : IN_NORMAL, 2, S(7, 33), 0, k % 2 == 1};
        all[NCASES + k] = (op_case){.op = u->op, .nin = 1, .in = {in}, .un = u};
    }
    return all;
}

static em_tensor *run_op(const op_case *c, em_tensor *const *in)
{
    return c->un ? uc_apply(c->un, in[0]) : c->run(in);
}

/* ---- running a case ------------------------------------------------------------------- */

/* input k of case c in dtype dt (float inputs; indices and masks keep theirs) */
static em_tensor *make_input(const in_spec *sp, em_dtype dt, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    int64_t shape[4];
    memcpy(shape, sp->shape, sizeof shape);
    if (sp->transposed) { /* made with the last two dims swapped, then transposed back */
        int64_t t = shape[sp->ndim - 1];
        shape[sp->ndim - 1] = shape[sp->ndim - 2];
        shape[sp->ndim - 2] = t;
    }
    em_tensor *x;
    switch (sp->kind) {
    case IN_INDEX: return em_randint(0, sp->hi, EM_I32, sp->ndim, shape, &r);
    case IN_MASK: return em_gt(em_randn(EM_F32, sp->ndim, shape, &r), em_scalar(EM_F32, 0.0));
    case IN_POSITIVE: x = em_add_scalar(em_abs(em_randn(EM_F32, sp->ndim, shape, &r)), 0.5); break;
    case IN_WHOLE:
        x = em_cast(em_cast(em_mul_scalar(em_randn(EM_F32, sp->ndim, shape, &r), 2.0), EM_I32), EM_F32);
        break;
    default: x = em_randn(EM_F32, sp->ndim, shape, &r);
    }
    x = em_contiguous(em_cast(x, dt));
    return sp->transposed ? em_transpose(x, sp->ndim - 2, sp->ndim - 1) : x;
}

/* got (on cuda:0) against want (CPU): same shape and dtype; bits when
 * exact, else within tol * max(1, max |want|). NULL: the message. */
static const char *compare(em_tensor *got, em_tensor *want, bool exact, double tol, char *msg, size_t n)
{
    if (!got || !want) return snprintf(msg, n, "NULL result (%s)", em_last_error()), msg;
    if (em_device_of(got).type != EM_CUDA) return snprintf(msg, n, "the result is not on the device"), msg;
    em_tensor *g = em_to(got, em_device_cpu());
    if (!g) return snprintf(msg, n, "em_to cpu: %s", em_last_error()), msg;
    if (em_ndim(g) != em_ndim(want) ||
        memcmp(em_shape(g), em_shape(want), sizeof(int64_t) * (size_t)em_ndim(g)))
        return snprintf(msg, n, "shapes differ"), msg;
    if (em_dtype_of(g) != em_dtype_of(want)) return snprintf(msg, n, "dtypes differ"), msg;
    if (exact) {
        em_tensor *a = em_contiguous(g), *b = em_contiguous(want);
        size_t bytes = (size_t)em_numel(a) * em_dtype_size(em_dtype_of(a));
        if (memcmp(em_data(a), em_data(b), bytes)) return snprintf(msg, n, "bits differ"), msg;
        return NULL;
    }
    double scale = ct_max_abs(want), d = th_max_abs_diff(g, want);
    if (!(d <= tol * (scale > 1 ? scale : 1)))
        return snprintf(msg, n, "max |cuda - cpu| = %g (max |cpu| %g, tol %g)", d, scale, tol), msg;
    return NULL;
}

/* Runs case c in dtype dt on both devices; NULL or what went wrong. */
static const char *run_case(const op_case *c, em_dtype dt, char *msg, size_t n)
{
    em_tensor *cin[4], *gin[4];
    for (int k = 0; k < c->nin; k++) {
        em_tensor *x = make_input(&c->in[k], dt, 1000 + (uint64_t)k);
        bool fl = em_dtype_is_float(em_dtype_of(x)) && !c->no_grad;
        cin[k] = x;
        gin[k] = em_to(x, em_device_cuda(0));
        if (!gin[k]) return snprintf(msg, n, "em_to cuda: %s", em_last_error()), msg;
        if (fl && (em_set_requires_grad(cin[k], true) || em_set_requires_grad(gin[k], true)))
            return snprintf(msg, n, "requires_grad: %s", em_last_error()), msg;
    }
    em_tensor *yc = run_op(c, cin);
    if (!yc) return snprintf(msg, n, "the CPU op failed: %s", em_last_error()), msg;
    em_tensor *yg = run_op(c, gin);
    const char *bad = compare(yg, yc, c->exact, ct_tol(dt), msg, n);
    if (bad) return bad;
    if (c->no_grad || !em_dtype_is_float(em_dtype_of(yc)) || !em_requires_grad(yc)) return NULL;
    em_rng r = em_rng_new(77);
    em_tensor *cot = em_cast(em_randn(EM_F32, em_ndim(yc), em_shape(yc), &r), em_dtype_of(yc));
    if (em_backward(em_sum(em_mul(yc, cot), 0, NULL, false), NULL))
        return snprintf(msg, n, "CPU backward: %s", em_last_error()), msg;
    if (em_backward(em_sum(em_mul(yg, em_to(cot, em_device_cuda(0))), 0, NULL, false), NULL))
        return snprintf(msg, n, "cuda backward: %s", em_last_error()), msg;
    for (int k = 0; k < c->nin; k++) {
        if (!em_requires_grad(cin[k])) continue;
        char inner[200];
        if ((bad = compare(em_grad(gin[k]), em_grad(cin[k]), false, 4 * ct_tol(dt), inner, sizeof inner)))
            return snprintf(msg, n, "gradient of input %d: %s", k, inner), msg;
    }
    return NULL;
}

TEST(test_cuda_every_op_matches_the_cpu_forward_and_backward_in_every_float_dtype)
{
    CUDA_OR_SKIP();
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    int failures = 0;
    const op_case *all = with_unary_cases();
    for (int i = 0; i < NALL; i++) {
        const op_case *c = &all[i];
        if (!cuda_op_ok(c->op)) {
            fprintf(stderr, "  %s: not a CUDA op of the op list (tensor/ops.def)\n", c->op);
            failures++;
            continue;
        }
        for (int d = 0; d < 4; d++) {
            em_scope s = em_scope_begin();
            char msg[512];
            const char *bad = run_case(c, dts[d], msg, sizeof msg);
            if (bad) {
                fprintf(stderr, "  case %d (%s, %s): %s\n", i, c->op, em_dtype_name(dts[d]), bad);
                failures++;
            }
            em_scope_end(s);
            em_clear_error();
        }
    }
    if (failures)
        th_fail(__FILE__, __LINE__, "%d op/dtype case(s) differ from the CPU (listed above)", failures);
}

TEST(test_cuda_every_op_with_a_cuda_backend_has_a_row_in_the_all_backends_table)
{
    int missing = 0;
    const op_case *all = with_unary_cases();
    for (int op = 0; op < OP_COUNT; op++) {
        if (!(op_table[op].backends & OPB_CUDA)) continue;
        bool found = false;
        for (int k = 0; k < NALL && !found; k++) found = !strcmp(all[k].op, op_table[op].name);
        if (!found) {
            fprintf(stderr,
                    "  '%s' has a CUDA backend (tensor/ops.def) but no case in tests/test_cuda_ops.c or "
                    "tests/unary_cases.h\n",
                    op_table[op].name);
            missing++;
        }
    }
    CHECK(missing == 0);
}

TEST(test_every_op_name_is_unique_and_no_cuda_entry_point_is_an_op)
{
    int dup = 0;
    for (int i = 0; i < OP_COUNT; i++) {
        if (op_find(op_table[i].name) == i) continue;
        fprintf(stderr, "  op '%s' is listed twice\n", op_table[i].name);
        dup++;
    }
    for (size_t i = 0; i < cuda_entry_count(); i++) {
        const char *name = cuda_entry_name(i);
        bool twice = false;
        for (size_t j = 0; j < i; j++) twice |= !strcmp(cuda_entry_name(j), name);
        if (op_find(name) < 0 && !twice) continue;
        fprintf(stderr, "  '%s' is %s\n", name, twice ? "listed twice" : "an op and a CUDA entry point");
        dup++;
    }
    CHECK(dup == 0);
}
