/* test_gpt_hf.c — em_gpt_load_hf: a Hugging Face GPT-2 file (written here,
 * Conv1D weights stored (in, out), "transformer." prefix, mask buffers)
 * loaded into a module tree with ember's GPT names, built by hand for a tiny
 * config; every value checked, and every error leaves the model untouched. */
#include <stdlib.h>

#include "harness.h"
#include "st_util.h"

enum { V = 11, BLOCK = 5, C = 4, L = 2 };

/* ember's parameters of one block, names relative to h.{i} */
static const struct {
    const char *name;
    int64_t r, c; /* ember's shape; c == 0 for 1-D */
} block_params[] = {
    {"ln_1.weight", C, 0},          {"ln_1.bias", C, 0},        {"attn.c_attn.weight", 3 * C, C},
    {"attn.c_attn.bias", 3 * C, 0}, {"attn.c_proj.weight", C, C}, {"attn.c_proj.bias", C, 0},
    {"ln_2.weight", C, 0},          {"ln_2.bias", C, 0},        {"mlp.c_fc.weight", 4 * C, C},
    {"mlp.c_fc.bias", 4 * C, 0},    {"mlp.c_proj.weight", C, 4 * C}, {"mlp.c_proj.bias", C, 0},
};
#define NBLOCK ((int)(sizeof block_params / sizeof block_params[0]))
#define NPARAMS (4 + L * NBLOCK)

static em_tensor *zeros(int64_t r, int64_t c)
{
    return c ? em_zeros(EM_F32, EM_SHAPE(r, c)) : em_zeros(EM_F32, EM_SHAPE(r));
}

/* The model tree with ember's names, zero-initialised, in GPT order. */
static em_module *ember_gpt(void)
{
    em_module *root = em_module_new(NULL, NULL);
    em_module *wte = em_module_new(root, "wte"), *wpe = em_module_new(root, "wpe"), *h = em_module_new(root, "h");
    CHECK_OK(em_module_add_param(wte, "weight", zeros(V, C)));
    CHECK_OK(em_module_add_param(wpe, "weight", zeros(BLOCK, C)));
    for (int i = 0; i < L; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "%d", i);
        em_module *b = em_module_new(h, nm);
        em_module *mods[6];
        mods[0] = em_module_new(b, "ln_1");
        em_module *attn = em_module_new(b, "attn");
        mods[1] = em_module_new(attn, "c_attn");
        mods[2] = em_module_new(attn, "c_proj");
        mods[3] = em_module_new(b, "ln_2");
        em_module *mlp = em_module_new(b, "mlp");
        mods[4] = em_module_new(mlp, "c_fc");
        mods[5] = em_module_new(mlp, "c_proj");
        for (int k = 0; k < NBLOCK; k++)
            CHECK_OK(em_module_add_param(mods[k / 2], k % 2 ? "bias" : "weight",
                                         zeros(block_params[k].r, block_params[k].c)));
    }
    em_module *lnf = em_module_new(root, "ln_f");
    CHECK_OK(em_module_add_param(lnf, "weight", zeros(C, 0)));
    CHECK_OK(em_module_add_param(lnf, "bias", zeros(C, 0)));
    return root;
}

/* What to write into the Hugging Face file. */
typedef struct hf_opts {
    const char *prefix;   /* "transformer." or "" */
    const char *skip;     /* an ember name left out */
    const char *no_tr;    /* an ember Conv1D name stored untransposed */
    int64_t v, block;     /* wte/wpe rows */
    int layers;
    bool buffers;         /* h.i.attn.bias / masked_bias */
    int head;             /* 0: no lm_head, 1: equal to wte, 2: different */
    const char *extra;    /* an unexpected tensor */
} hf_opts;

static hf_opts defaults(void) { return (hf_opts){"transformer.", NULL, NULL, V, BLOCK, L, true, 1, NULL}; }

static bool conv1d(const char *n) { return strstr(n, "c_attn.weight") || strstr(n, "c_proj.weight") || strstr(n, "c_fc.weight"); }

/* The value HF stores at flat index k of tensor number id. */
static double hf_val(int id, int64_t k) { return id * 1000 + k * 0.5; }

/* An f32 tensor of (r, c) holding hf_val(id, .), persistent. */
static em_tensor *hf_tensor(int id, int64_t r, int64_t c)
{
    int64_t n = r * (c ? c : 1);
    double *x = malloc(sizeof(double) * (size_t)n);
    for (int64_t k = 0; k < n; k++) x[k] = hf_val(id, k);
    em_tensor *t = c ? st_tensor(EM_F32, EM_SHAPE(r, c), x) : st_tensor(EM_F32, EM_SHAPE(r), x);
    free(x);
    return t;
}

/* ember's name of parameter number id (the order of ember_gpt). */
static void ember_name(int id, char *out, size_t n, int64_t *r, int64_t *c)
{
    if (id == 0) snprintf(out, n, "wte.weight"), *r = V, *c = C;
    else if (id == 1) snprintf(out, n, "wpe.weight"), *r = BLOCK, *c = C;
    else if (id == NPARAMS - 2) snprintf(out, n, "ln_f.weight"), *r = C, *c = 0;
    else if (id == NPARAMS - 1) snprintf(out, n, "ln_f.bias"), *r = C, *c = 0;
    else {
        int i = (id - 2) / NBLOCK, k = (id - 2) % NBLOCK;
        snprintf(out, n, "h.%d.%s", i, block_params[k].name);
        *r = block_params[k].r, *c = block_params[k].c;
    }
}

static void write_hf(const char *path, hf_opts o)
{
    em_named v[128];
    char names[128][96];
    int n = 0;
    int total = NPARAMS + (o.layers - L) * NBLOCK;
    for (int id = 0; id < total; id++) {
        int64_t r, c;
        char en[64];
        if (id >= NPARAMS - 2 && id < total - 2) { /* layers beyond the model's */
            int i = L + (id - (NPARAMS - 2)) / NBLOCK, k = (id - (NPARAMS - 2)) % NBLOCK;
            snprintf(en, sizeof en, "h.%d.%s", i, block_params[k].name);
            r = block_params[k].r, c = block_params[k].c;
        } else {
            ember_name(id < NPARAMS - 2 ? id : id - (total - NPARAMS), en, sizeof en, &r, &c);
        }
        if (o.skip && !strcmp(en, o.skip)) continue;
        if (id == 0) r = o.v;
        if (id == 1) r = o.block;
        bool tr = conv1d(en) && !(o.no_tr && !strcmp(en, o.no_tr));
        snprintf(names[n], sizeof names[0], "%s%s", o.prefix, en);
        v[n] = (em_named){names[n], tr ? hf_tensor(id, c, r) : hf_tensor(id, r, c)};
        n++;
    }
    for (int i = 0; o.buffers && i < o.layers; i++) {
        snprintf(names[n], sizeof names[0], "%sh.%d.attn.bias", o.prefix, i);
        v[n] = (em_named){names[n], em_ones(EM_F32, EM_SHAPE(1, 1, BLOCK, BLOCK))};
        n++;
        snprintf(names[n], sizeof names[0], "%sh.%d.attn.masked_bias", o.prefix, i);
        v[n] = (em_named){names[n], em_scalar(EM_F32, -1e4)};
        n++;
    }
    if (o.head) {
        em_tensor *h = hf_tensor(0, o.v, C);
        if (o.head == 2) CHECK_OK(em_set(h, (int64_t[]){1, 2}, 7.0));
        v[n++] = (em_named){"lm_head.weight", h};
    }
    if (o.extra) v[n++] = (em_named){o.extra, em_zeros(EM_F32, EM_SHAPE(1))};
    CHECK_OK(em_safetensors_save(path, n, v, "{\"format\":\"pt\"}"));
    for (int i = 0; i < n; i++) em_free(v[i].t);
}

/* Every parameter equals the file's value, transposed for Conv1D weights. */
static void check_loaded(em_module *gpt)
{
    for (int id = 0; id < NPARAMS; id++) {
        char nm[96];
        int64_t r, c;
        ember_name(id, nm, sizeof nm, &r, &c);
        em_tensor *t = em_module_find(gpt, nm);
        CHECK_NOTNULL(t);
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < (c ? c : 1); j++) {
                /* ember (out=r, in=c) element [i][j] is HF (in, out) element [j][i] */
                int64_t k = conv1d(nm) ? j * r + i : i * (c ? c : 1) + j;
                double got = c ? em_get(t, (int64_t[]){i, j}) : em_get(t, (int64_t[]){i});
                if (got != hf_val(id, k))
                    th_fail(__FILE__, __LINE__, "%s[%lld][%lld] = %g, want %g", nm, (long long)i, (long long)j, got,
                            hf_val(id, k));
            }
    }
}

static void check_untouched(em_module *gpt)
{
    em_named v[NPARAMS];
    CHECK(em_module_params(gpt, v, NPARAMS) == NPARAMS);
    em_scope s = em_scope_begin();
    for (int i = 0; i < NPARAMS; i++) CHECK(em_item(em_sum(em_abs(v[i].t), 0, NULL, false)) == 0);
    em_scope_end(s);
}

TEST(test_gpt_load_hf_transposes_conv1d_weights_and_fills_every_parameter)
{
    st_tmpdir();
    em_module *gpt = ember_gpt();
    const char *path = st_path("gpt2.safetensors");
    write_hf(path, defaults());
    CHECK_OK(em_gpt_load_hf(gpt, path));
    check_loaded(gpt);
    em_module_free(gpt);
    CHECK(em_live_tensors() == 0);
}

TEST(test_gpt_load_hf_accepts_names_without_the_transformer_prefix)
{
    st_tmpdir();
    em_module *gpt = ember_gpt();
    CHECK_OK(em_module_flatten(gpt)); /* and parameters living in a flat buffer */
    hf_opts o = defaults();
    o.prefix = "";
    o.buffers = false;
    o.head = 0;
    const char *path = st_path("gpt2.safetensors");
    write_hf(path, o);
    CHECK_OK(em_gpt_load_hf(gpt, path));
    check_loaded(gpt);
    em_module_free(gpt);
}

/* Runs the loader on a file written with o and checks the error and that
 * nothing changed. */
static void expect_fail(hf_opts o, em_status want, const char *sub)
{
    em_module *gpt = ember_gpt();
    const char *path = st_path("bad.safetensors");
    write_hf(path, o);
    CHECK_ERR(em_gpt_load_hf(gpt, path), want, sub);
    CHECK(strstr(em_last_error(), "em_gpt_load_hf") && strstr(em_last_error(), path));
    check_untouched(gpt);
    em_module_free(gpt);
    CHECK(em_live_tensors() == 0);
}

TEST(test_gpt_load_hf_names_a_missing_tensor)
{
    st_tmpdir();
    hf_opts o = defaults();
    o.skip = "h.1.mlp.c_fc.bias";
    expect_fail(o, EM_ERR_ARG, "missing tensor 'transformer.h.1.mlp.c_fc.bias' (for the model's 'h.1.mlp.c_fc.bias', "
                               "expected (16,))");
    o.skip = "h.1.attn.c_proj.weight";
    expect_fail(o, EM_ERR_ARG, "missing tensor 'transformer.h.1.attn.c_proj.weight'");
}

TEST(test_gpt_load_hf_names_a_wrong_shape_with_the_expected_one)
{
    st_tmpdir();
    hf_opts o = defaults();
    o.no_tr = "h.1.attn.c_attn.weight"; /* stored (out, in) by mistake */
    expect_fail(o, EM_ERR_SHAPE,
                "'transformer.h.1.attn.c_attn.weight' is (12,4) in the file but (4,12) is expected for the "
                "model's 'h.1.attn.c_attn.weight' (12,4) (Conv1D weights are stored (in, out)");
}

TEST(test_gpt_load_hf_names_vocab_block_and_layer_mismatches)
{
    st_tmpdir();
    hf_opts o = defaults();
    o.v = 12;
    o.head = 0;
    expect_fail(o, EM_ERR_SHAPE, "vocab size mismatch: the file has 12 tokens, the model 11");
    o = defaults();
    o.block = 6;
    expect_fail(o, EM_ERR_SHAPE, "block size mismatch: the file has 6 positions, the model 5");
    o = defaults();
    o.layers = 3;
    expect_fail(o, EM_ERR_SHAPE, "layer count mismatch: the file has 3 layers, the model 2");
}

TEST(test_gpt_load_hf_rejects_an_untied_head_and_unknown_tensors)
{
    st_tmpdir();
    hf_opts o = defaults();
    o.head = 2;
    expect_fail(o, EM_ERR_ARG, "lm_head.weight (11,4) differs from wte.weight (11,4)");
    o = defaults();
    o.extra = "transformer.h.0.attn.rotary";
    expect_fail(o, EM_ERR_ARG, "unexpected tensor 'transformer.h.0.attn.rotary'");
    em_module *gpt = ember_gpt();
    CHECK_ERR(em_gpt_load_hf(gpt, st_path("absent.safetensors")), EM_ERR_IO, "cannot open");
    em_tensor *t = em_ones(EM_F32, EM_SHAPE(2));
    CHECK_OK(em_safetensors_save(st_path("other.safetensors"), 1, &(em_named){"w", t}, NULL));
    CHECK_ERR(em_gpt_load_hf(gpt, st_path("other.safetensors")), EM_ERR_ARG, "not a GPT-2 checkpoint");
    em_free(t);
    em_module_free(gpt);
}
