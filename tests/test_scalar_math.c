/* test_scalar_math.c — the per-element maths the CPU and the CUDA kernels
 * share (tensor/dtype_math.h, optim/update_math.h) against the CPU's fast
 * paths, which must give the same bits: the F16C and vectorised f16/bf16
 * conversions behind em_cast, and the vectorised SGD/Adam/AdamW loops
 * behind em_optim_step. The inputs reach far: every exponent with the
 * mantissas around each rounding point, ties, subnormals, infinities and
 * NaNs with payloads. And a CUDA device (the emulator in CI) stores f16 and
 * bf16 with the CPU's bits, NaNs included. */
#include <stdlib.h>

#include "cuda_test.h"
#include "harness.h"
#include "optim/update_math.h"
#include "tensor/dtype_math.h"

/* ---- inputs ----------------------------------------------------------------------------- */

/* f32 bit patterns: both signs of every exponent with the mantissas at and
 * around each rounding point of f16 (the 13 dropped bits, and each
 * subnormal shift) and bf16 (16 dropped bits), NaN payloads, then a sweep of
 * all 2^32 patterns in steps of a prime. *n gets the count; free() it. */
static uint32_t *f32_patterns(int64_t *n)
{
    static const uint32_t mant[] = {
        0,        1,        0x7fffff, 0x400000, 0x3fffff, 0x000fff, 0x001000, 0x001001, 0x002000,
        0x003000, 0x001fff, 0x005000, 0x007fff, 0x008000, 0x008001, 0x010000, 0x018000, 0x017fff,
        0x7f8000, 0x7fe000, 0x7ff000, 0x7fefff, 0x000200, 0x3ff000, 0x123456, 0x654321, 0x0001ff,
    };
    int nm = (int)(sizeof mant / sizeof mant[0]);
    int64_t cap = 2 * 256 * (nm + 2 * 24) + ((int64_t)1 << 32) / 4099 + 2;
    uint32_t *u = malloc((size_t)cap * sizeof *u);
    CHECK_NOTNULL(u);
    int64_t k = 0;
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t e = 0; e < 256; e++) {
            uint32_t top = s << 31 | e << 23;
            for (int i = 0; i < nm; i++) u[k++] = top | mant[i];
            for (int b = 0; b < 23; b++) { /* a half unit of every shift, and just above it */
                u[k++] = top | 1u << b;
                u[k++] = top | (1u << b | 1u);
            }
        }
    for (uint64_t x = 0; x < ((uint64_t)1 << 32); x += 4099) u[k++] = (uint32_t)x;
    *n = k;
    return u;
}

/* every 16-bit pattern */
static uint16_t *all_u16(void)
{
    uint16_t *h = malloc(65536 * sizeof *h);
    CHECK_NOTNULL(h);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    return h;
}

/* em_cast of n contiguous elements of dtype from (at src) to dtype to: the
 * bulk path (convert_n: F16C for f16 where the CPU has it, a vectorised loop
 * for bf16). */
static em_tensor *cast_n(const void *src, em_dtype from, em_dtype to, int64_t n)
{
    em_tensor *t = em_from_data(from, EM_SHAPE(n), src);
    CHECK_NOTNULL(t);
    em_tensor *c = em_cast(t, to);
    CHECK_NOTNULL(c);
    return c;
}

/* ---- f16 / bf16 conversions ------------------------------------------------------------------ */

static void f32_to_16_bits_match(em_dtype to)
{
    em_scope s = em_scope_begin();
    int64_t n;
    uint32_t *u = f32_patterns(&n);
    const uint16_t *got = em_data(cast_n(u, EM_F32, to, n));
    for (int64_t i = 0; i < n; i++) {
        float f = bits_as_f32(u[i]);
        uint16_t want = to == EM_F16 ? f32_to_f16_bits(f) : f32_to_bf16_bits(f);
        if (got[i] != want)
            th_fail(__FILE__, __LINE__, "f32 %08x -> %s: cast gives %04x, the formula %04x (F16C %s)", u[i],
                    em_dtype_name(to), got[i], want, em_cpu_detect().f16c ? "on" : "off");
    }
    free(u);
    em_scope_end(s);
}

static void from_16_bits_match(em_dtype from)
{
    em_scope s = em_scope_begin();
    uint16_t *h = all_u16();
    const float *got = em_data(cast_n(h, from, EM_F32, 65536));
    for (int i = 0; i < 65536; i++) {
        uint32_t want = f32_as_bits(from == EM_F16 ? f16_bits_to_f32(h[i]) : bf16_bits_to_f32(h[i]));
        if (f32_as_bits(got[i]) != want)
            th_fail(__FILE__, __LINE__, "%s %04x -> f32: cast gives %08x, the formula %08x (F16C %s)",
                    em_dtype_name(from), h[i], f32_as_bits(got[i]), want,
                    em_cpu_detect().f16c ? "on" : "off");
    }
    free(h);
    em_scope_end(s);
}

TEST(test_f32_to_f16_cast_gives_the_shared_formulas_bits) { f32_to_16_bits_match(EM_F16); }
TEST(test_f16_to_f32_cast_gives_the_shared_formulas_bits) { from_16_bits_match(EM_F16); }
TEST(test_f32_to_bf16_cast_gives_the_shared_formulas_bits) { f32_to_16_bits_match(EM_BF16); }
TEST(test_bf16_to_f32_cast_gives_the_shared_formulas_bits) { from_16_bits_match(EM_BF16); }

TEST(test_f16_nan_keeps_sign_and_payload_and_turns_quiet)
{
    CHECK(f32_to_f16_bits(bits_as_f32(0x7fc00000u)) == 0x7e00); /* the default quiet NaN */
    CHECK(f32_to_f16_bits(bits_as_f32(0xff800001u)) == 0xfe00); /* a signalling NaN, low payload: quiet */
    CHECK(f32_to_f16_bits(bits_as_f32(0x7fa02000u)) == 0x7f01); /* the payload's top bits kept */
    CHECK(f32_as_bits(f16_bits_to_f32(0x7c01)) == 0x7fc02000u); /* back: quiet, payload kept */
    CHECK(f32_as_bits(f16_bits_to_f32(0xfe00)) == 0xffc00000u);
    CHECK(f32_to_bf16_bits(bits_as_f32(0x7f800001u)) == 0x7fc0); /* bf16: the same rule */
    CHECK(f32_to_bf16_bits(bits_as_f32(0xffa10000u)) == 0xffe1);
}

/* ---- optimizer updates --------------------------------------------------------------------- */

enum { NP = 40000 }; /* enough for the pool to split the update over its threads */

/* Values across the f32 range: zeros, subnormals, tiny to huge magnitudes of
 * both signs, and (when special) infinities and NaN among them. */
static void wide_values(float *x, int64_t n, uint64_t seed, bool special)
{
    em_rng r = em_rng_new(seed);
    for (int64_t i = 0; i < n; i += 4) {
        uint32_t w[4];
        em_philox4x32(r.seed, 0, (uint64_t)i, w);
        for (int j = 0; j < 4 && i + j < n; j++) {
            float mag = ldexpf(1.0f + (float)(w[j] & 0xffff) / 65536.0f, (int)(w[j] >> 16) % 80 - 60);
            x[i + j] = w[j] >> 31 ? -mag : mag;
        }
    }
    x[0] = 0, x[1] = -0.0f, x[2] = bits_as_f32(1), x[3] = bits_as_f32(0x807fffffu), x[4] = 3e38f;
    if (special) x[5] = INFINITY, x[6] = -INFINITY, x[7] = NAN;
}

/* The reference: one element at a time, never vectorised. The variant's
 * flags are constants, as in optim.c's loops: f32 arithmetic may contract a
 * multiply and an add into an FMA (-ffp-contract=fast, gcc's default for
 * C), and the same expression contracts the same way, scalar or vector. */
__attribute__((optimize("no-tree-vectorize"))) static void
adam_ref(const opt_coef *c, float *p, const float *g, float *m, float *v, float *vmax, int64_t n)
{
    opt_k_f32 k = opt_k_of_f32(c);
    if (c->amsgrad && c->maximize && c->decoupled)
        for (int64_t i = 0; i < n; i++)
            p[i] = adam_elem_f32(&k, p[i], g[i], &m[i], &v[i], &vmax[i], false, true, true, true);
    else if (c->decoupled)
        for (int64_t i = 0; i < n; i++)
            p[i] = adam_elem_f32(&k, p[i], g[i], &m[i], &v[i], NULL, false, true, false, false);
    else if (c->l2)
        for (int64_t i = 0; i < n; i++)
            p[i] = adam_elem_f32(&k, p[i], g[i], &m[i], &v[i], NULL, true, false, false, false);
    else
        for (int64_t i = 0; i < n; i++)
            p[i] = adam_elem_f32(&k, p[i], g[i], &m[i], &v[i], NULL, false, false, false, false);
}

__attribute__((optimize("no-tree-vectorize"))) static void sgd_ref(const opt_coef *c, float *p,
                                                                   const float *g, float *buf, int64_t n)
{
    opt_k_f32 k = opt_k_of_f32(c);
    for (int64_t i = 0; i < n; i++)
        p[i] = sgd_elem_f32(&k, p[i], g[i], &buf[i], true, c->wd != 0, c->first, c->nesterov, false);
}

/* a persistent f32 leaf of NP elements with values x, and its gradient
 * buffer holding g */
static em_tensor *leaf_with_grad(const float *x, const float *g)
{
    em_tensor *p = em_from_data(EM_F32, EM_SHAPE(NP), x), *gb = em_from_data(EM_F32, EM_SHAPE(NP), g);
    CHECK(p && gb);
    CHECK_OK(em_set_requires_grad(p, true));
    CHECK_OK(em_set_grad_buffer(p, gb));
    return p;
}

static void check_same_bits(const char *what, int step, const float *got, const float *want)
{
    for (int64_t i = 0; i < NP; i++)
        if (f32_as_bits(got[i]) != f32_as_bits(want[i]))
            th_fail(__FILE__, __LINE__, "%s step %d element %lld: %a from em_optim_step, %a from the formula",
                    what, step, (long long)i, (double)got[i], (double)want[i]);
}

/* kind 0 Adam, 1 Adam with L2 weight decay, 2 AdamW, 3 AdamW with amsgrad
 * and maximize: three steps, each compared bit for bit with adam_elem_f32 */
static void adam_matches(int kind)
{
    float *x = malloc(NP * sizeof *x), *g = malloc(NP * sizeof *g), *m = calloc(NP, sizeof *m),
          *v = calloc(NP, sizeof *v), *vmax = calloc(NP, sizeof *vmax), *want = malloc(NP * sizeof *want);
    CHECK(x && g && m && v && vmax && want);
    wide_values(x, NP, 1, false);
    wide_values(g, NP, 2, true);
    memcpy(want, x, NP * sizeof *x);
    em_tensor *p = leaf_with_grad(x, g);
    bool adamw = kind >= 2;
    em_adam_config cfg = adamw ? em_adamw_defaults() : em_adam_defaults();
    cfg.lr = 0.01, cfg.weight_decay = kind == 0 ? 0 : 0.05;
    cfg.amsgrad = cfg.maximize = kind == 3;
    em_optimizer *o = adamw ? em_adamw_new(1, &p, &cfg) : em_adam_new(1, &p, &cfg);
    CHECK_NOTNULL(o);
    for (int t = 1; t <= 3; t++) {
        if (kind == 3) { /* v falls at step 3: the maximum is not v there */
            for (int64_t i = 0; i < NP; i++) g[i] *= t == 3 ? 0.01f : 1.5f;
            memcpy(em_data(em_grad(p)), g, NP * sizeof *g);
        }
        CHECK_OK(em_optim_step(o));
        opt_coef c = {.l2 = kind == 1,
                      .decoupled = adamw,
                      .amsgrad = kind == 3,
                      .maximize = kind == 3,
                      .lr = cfg.lr,
                      .wd = cfg.weight_decay,
                      .b1 = cfg.beta1,
                      .b2 = cfg.beta2,
                      .eps = cfg.eps,
                      .step_size = cfg.lr / (1.0 - pow(cfg.beta1, t)),
                      .bc2_sqrt = sqrt(1.0 - pow(cfg.beta2, t)),
                      .decay = 1.0 - cfg.lr * cfg.weight_decay};
        adam_ref(&c, want, g, m, v, vmax, NP);
        check_same_bits(kind == 3   ? "AdamW (amsgrad, maximize)"
                        : kind == 2 ? "AdamW"
                        : kind == 1 ? "Adam (L2)"
                                    : "Adam",
                        t, em_data(p), want);
    }
    em_optim_free(o);
    em_free(em_grad(p));
    em_free(p);
    free(x), free(g), free(m), free(v), free(vmax), free(want);
}

TEST(test_adam_step_gives_the_shared_formulas_bits) { adam_matches(0); }
TEST(test_adam_l2_step_gives_the_shared_formulas_bits) { adam_matches(1); }
TEST(test_adamw_step_gives_the_shared_formulas_bits) { adam_matches(2); }
TEST(test_adamw_amsgrad_maximize_step_gives_the_shared_formulas_bits) { adam_matches(3); }

/* SGD with momentum, dampening and weight decay, then Nesterov: three
 * steps each, the first filling the buffer */
static void sgd_matches(bool nesterov)
{
    float *x = malloc(NP * sizeof *x), *g = malloc(NP * sizeof *g), *buf = malloc(NP * sizeof *buf),
          *want = malloc(NP * sizeof *want);
    CHECK(x && g && buf && want);
    wide_values(x, NP, 3, false);
    wide_values(g, NP, 4, true);
    memcpy(want, x, NP * sizeof *x);
    em_tensor *p = leaf_with_grad(x, g);
    em_sgd_config cfg = em_sgd_defaults();
    cfg.lr = 0.1, cfg.momentum = 0.9, cfg.dampening = nesterov ? 0 : 0.25, cfg.weight_decay = 0.01;
    cfg.nesterov = nesterov;
    em_optimizer *o = em_sgd_new(1, &p, &cfg);
    CHECK_NOTNULL(o);
    for (int t = 1; t <= 3; t++) {
        CHECK_OK(em_optim_step(o));
        opt_coef c = {.sgd = true,
                      .nesterov = nesterov,
                      .first = t == 1,
                      .lr = cfg.lr,
                      .wd = cfg.weight_decay,
                      .mom = cfg.momentum,
                      .damp = cfg.dampening};
        sgd_ref(&c, want, g, buf, NP);
        check_same_bits(nesterov ? "SGD (Nesterov)" : "SGD", t, em_data(p), want);
    }
    em_optim_free(o);
    em_free(em_grad(p));
    em_free(p);
    free(x), free(g), free(buf), free(want);
}

TEST(test_sgd_momentum_step_gives_the_shared_formulas_bits) { sgd_matches(false); }
TEST(test_sgd_nesterov_step_gives_the_shared_formulas_bits) { sgd_matches(true); }

/* ---- CUDA: the device stores with the CPU's bits ------------------------------------------------ */

static void cuda_cast_matches(em_dtype to)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    int64_t n;
    uint32_t *u = f32_patterns(&n);
    n = n < 200000 ? n : 200000; /* every special pattern, and the start of the sweep */
    em_tensor *x = em_from_data(EM_F32, EM_SHAPE(n), u);
    em_tensor *want = em_cast(x, to), *got = ct_on_cpu(em_cast(ct_on_cuda(x), to));
    CHECK(want && got);
    const uint16_t *a = em_data(got), *b = em_data(want);
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i])
            th_fail(__FILE__, __LINE__, "f32 %08x -> %s: the device stores %04x, the CPU %04x", u[i],
                    em_dtype_name(to), a[i], b[i]);
    free(u);
    em_scope_end(s);
}

TEST(test_cuda_f32_to_f16_cast_gives_the_cpus_bits_nan_included) { cuda_cast_matches(EM_F16); }
TEST(test_cuda_f32_to_bf16_cast_gives_the_cpus_bits_nan_included) { cuda_cast_matches(EM_BF16); }
