/* test_memory_estimate.c — em_estimate_memory against what ember really
 * takes: its parameter count against em_gpt_new's model, its activations
 * against the step scope a training step leaves (em_arena_in_use), its total
 * against the measured peak resident set of `ember train` (alone and under
 * `ember launch -n 2`), the stage arithmetic, and its argument checks; plus
 * `ember estimate-memory` and the check `ember train` makes before it
 * allocates a model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_test.h"
#include "harness.h"
#include "path_test.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"
#define run_ember(...) th_run(EMBER_BIN, __VA_ARGS__)

static em_mem_estimate estimate_of(const em_mem_config *c)
{
    em_mem_estimate e;
    em_status s = em_estimate_memory(c, &e);
    if (s) th_fail(__FILE__, __LINE__, "em_estimate_memory: %s", em_last_error());
    return e;
}

TEST(test_estimate_memory_counts_the_parameters_of_em_gpt_new)
{
    for (int bias = 0; bias < 2; bias++) {
        em_mem_config c = em_mem_config_defaults();
        c.model = (em_gpt_config){
            .vocab_size = 67, .block_size = 24, .n_layer = 3, .n_head = 2, .n_embd = 40, .bias = bias};
        em_gpt *g = em_gpt_new(&c.model, 1);
        CHECK(g != NULL);
        CHECK(estimate_of(&c).n_params == em_module_num_params(g->m));
        em_gpt_free(g);
    }
}

/* One row per configuration whose step scope is measured. */
typedef struct scope_case {
    const char *name;
    em_gpt_config model;
    int64_t batch, context;
    em_precision_kind precision;
} scope_case;

/* the tiny GPT (4 layers) and a 2-layer one, vocab 65, context 64, 128 wide */
#define TINY_GPT                                                                                             \
    {                                                                                                        \
        .vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = true           \
    }
#define TWO_LAYERS(b, p)                                                                                     \
    {                                                                                                        \
        .vocab_size = 65, .block_size = 64, .n_layer = 2, .n_head = 4, .n_embd = 128, .bias = (b),           \
        .dropout = (p)                                                                                       \
    }

static const scope_case scope_cases[] = {
    {"tiny f32", TINY_GPT, 12, 64, EM_PREC_NO},
    {"tiny bf16", TINY_GPT, 12, 64, EM_PREC_BF16},
    {"tiny fp16", TINY_GPT, 12, 64, EM_PREC_FP16},
    {"dropout", TWO_LAYERS(true, 0.1), 8, 64, EM_PREC_NO},
    {"no bias", TWO_LAYERS(false, 0), 8, 64, EM_PREC_NO},
    {"no bias bf16", TWO_LAYERS(false, 0), 8, 64, EM_PREC_BF16},
    {"dropout, no bias, bf16", TWO_LAYERS(false, 0.1), 8, 64, EM_PREC_BF16},
    {"short context, more heads, wide vocab",
     {.vocab_size = 500, .block_size = 64, .n_layer = 2, .n_head = 8, .n_embd = 64, .bias = true},
     6,
     32,
     EM_PREC_NO},
    {"wide vocab bf16",
     {.vocab_size = 500, .block_size = 64, .n_layer = 2, .n_head = 2, .n_embd = 64, .bias = true},
     6,
     48,
     EM_PREC_BF16},
};

/* What one step (forward, loss, backward) of sc's model leaves: in the step
 * scope's arena (em_arena_in_use), or on cuda:0 asked for from the caching
 * allocator (em_cuda_memory.requested). The second of two steps: it runs on
 * the first one's chunks and blocks. */
static size_t step_bytes(const scope_case *sc, bool cuda)
{
    em_dtype low = sc->precision == EM_PREC_BF16 ? EM_BF16 : sc->precision == EM_PREC_FP16 ? EM_F16 : EM_F32;
    em_device dev = cuda ? em_device_cuda(0) : em_device_cpu();
    em_gpt *g = em_gpt_new(&sc->model, 1);
    CHECK(g != NULL);
    if (cuda) CHECK_OK(em_module_to(g->m, dev));
    CHECK_OK(em_module_flatten(g->m));
    em_rng rng = em_rng_new(7);
    size_t used = 0;
    for (int step = 0; step < 2; step++) {
        em_scope s = em_scope_begin();
        int64_t shape[2] = {sc->batch, sc->context};
        em_tensor *x = em_to(em_randint(0, sc->model.vocab_size, EM_I32, 2, shape, &rng), dev);
        em_tensor *y = em_to(em_randint(0, sc->model.vocab_size, EM_I32, 2, shape, &rng), dev);
        em_cuda_memory m0 = {0}, m1 = {0};
        if (cuda) CHECK_OK(em_cuda_memory_stats(0, &m0));
        size_t before = em_arena_in_use();
        em_autocast_set(low);
        em_tensor *loss = em_gpt_loss(g, x, y);
        em_autocast_set(EM_F32);
        CHECK(loss != NULL);
        CHECK_OK(em_backward(loss, NULL));
        if (cuda) {
            CHECK_OK(em_cuda_memory_stats(0, &m1));
            CHECK(m1.requested <= m1.allocated);
            used = m1.requested - m0.requested;
        } else {
            used = em_arena_in_use() - before;
        }
        em_scope_end(s);
    }
    em_gpt_free(g);
    return used;
}

/* The estimate's activations for sc (on a CUDA device or the CPU) */
static double activations_of(const scope_case *sc, bool cuda)
{
    em_mem_config c = em_mem_config_defaults();
    c.model = sc->model;
    c.batch = sc->batch;
    c.context = sc->context;
    c.precision = sc->precision;
    c.cuda = cuda;
    return (double)estimate_of(&c).bytes[EM_MEM_ACTIVATIONS];
}

/* The step scope is the estimate's activations within 1%, for every case;
 * the bf16 ones on both kinds of bf16 product: the f32 path (no casts) and
 * the avx512bf16 path (autocast casts each product's f32 operands), the
 * latter on ember's emulation of VDPBF16PS where the CPU has none. */
TEST(test_estimate_memory_activations_match_the_step_scope_of_a_gpt_step)
{
    static const char *const bf16_paths[] = {"f32", "avx512bf16"};
    em_cpu_features f = em_cpu_detect();
    if (!f.avx512bf16) gemm_dpbf16_use_kernel_for_test(dp_kernel_emulated);
    for (size_t k = 0; k < sizeof scope_cases / sizeof scope_cases[0]; k++) {
        const scope_case *sc = &scope_cases[k];
        bool bf16 = sc->precision == EM_PREC_BF16;
        for (size_t p = 0; p < (bf16 ? 2u : 1u); p++) {
            use_bf16_path(bf16 ? bf16_paths[p] : NULL);
            size_t used = step_bytes(sc, false);
            double est = activations_of(sc, false);
            if (!(fabs(est - (double)used) <= 0.01 * (double)used))
                th_fail(__FILE__, __LINE__,
                        "%s%s%s: the step scope holds %zu bytes, the estimate says %.0f (%+.2f%%)", sc->name,
                        bf16 ? ", bf16 path " : "", bf16 ? bf16_paths[p] : "", used, est,
                        100 * (est / (double)used - 1));
        }
    }
    use_bf16_path(NULL);
    gemm_dpbf16_use_kernel_for_test(NULL);
}

/* On a CUDA device a step's tensors are in the caching allocator, not the
 * arena: what one step leaves asked for on cuda:0 (em_cuda_memory's
 * requested: the tensors' bytes; allocated adds the allocator's rounding
 * and block reuse) is the estimate's activations (c.cuda) within 2%, in
 * f32 and under bf16 autocast (which casts the products' operands there),
 * with and without biases. Under the emulator in every CI run. The tape's
 * nodes are host memory there; the estimate counts them anyway (under
 * 0.5% of these). */
TEST(test_estimate_memory_activations_match_a_cuda_step)
{
    CUDA_OR_SKIP();
    /* 2 layers, 2 heads, 64 wide, context 32: the emulator runs every GPU thread */
#define EMULATED_GPT(b)                                                                                      \
    {                                                                                                        \
        .vocab_size = 65, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 64, .bias = (b)             \
    }
    static const scope_case cases[] = {
        {"f32", EMULATED_GPT(true), 4, 32, EM_PREC_NO},
        {"bf16", EMULATED_GPT(true), 4, 32, EM_PREC_BF16},
        {"bf16, no bias", EMULATED_GPT(false), 4, 32, EM_PREC_BF16},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const scope_case *sc = &cases[k];
        size_t used = step_bytes(sc, true);
        double est = activations_of(sc, true);
        if (!(fabs(est - (double)used) <= 0.02 * (double)used))
            th_fail(
                __FILE__, __LINE__,
                "cuda, %s: the step left %zu bytes asked for on the device, the estimate says %.0f (%+.2f%%)",
                sc->name, used, est, 100 * (est / (double)used - 1));
    }
}

/* The stage arithmetic of em_estimate_memory's contract, P parameters over
 * W = 4 ranks, with AdamW (8 bytes), SGD with momentum (4) and SGD (0). */
TEST(test_estimate_memory_splits_params_grads_and_optimizer_by_stage)
{
    em_mem_config c = em_mem_config_defaults();
    c.world = 4;
    c.bucket_mb = 1;
    const double bucket = 1 << 20;
    struct {
        em_mem_optimizer opt;
        bool momentum;
        double per_param;
    } opts[] = {
        {EM_MEM_ADAMW, false, 8}, {EM_MEM_ADAM, false, 8}, {EM_MEM_SGD, true, 4}, {EM_MEM_SGD, false, 0}};
    double P = 0, unit = 0;
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        c.optimizer = opts[k].opt;
        c.momentum = opts[k].momentum;
        em_mem_estimate e[4];
        for (int z = 0; z < 4; z++) {
            c.zero_stage = z;
            e[z] = estimate_of(&c);
        }
        P = (double)e[0].n_params;
        /* stages 2-3 hold the largest parameter's bucket and 2 more: c_fc's
         * (4C, C) or wte's (V, C) when bigger than a bucket */
        double C = 128, big = 4 * (4 * C * C > 65 * C ? 4 * C * C : 65 * C);
        double held = big > bucket ? big + 2 * bucket : 3 * bucket;
        double grads2 = 4 * P / 4 + (held < 4 * P ? held : 4 * P);
        unit = held < 4 * P - P ? held : 4 * P - P; /* stage 3's whole buckets; never more than 4P in all */
        double opt = opts[k].per_param * P;
        CHECK((double)e[0].bytes[EM_MEM_PARAMS] == 4 * P && (double)e[0].bytes[EM_MEM_GRADS] == 4 * P);
        CHECK((double)e[0].bytes[EM_MEM_OPTIMIZER] == opt);
        CHECK((double)e[1].bytes[EM_MEM_PARAMS] == 4 * P && (double)e[1].bytes[EM_MEM_GRADS] == 4 * P);
        CHECK((double)e[1].bytes[EM_MEM_OPTIMIZER] == opt / 4);
        CHECK((double)e[2].bytes[EM_MEM_PARAMS] == 4 * P && (double)e[2].bytes[EM_MEM_GRADS] == grads2);
        CHECK((double)e[2].bytes[EM_MEM_OPTIMIZER] == opt / 4);
        CHECK((double)e[3].bytes[EM_MEM_PARAMS] == 4 * P / 4 + unit);
        CHECK((double)e[3].bytes[EM_MEM_GRADS] == grads2 && (double)e[3].bytes[EM_MEM_OPTIMIZER] == opt / 4);
        for (int z = 0; z < 4; z++) {
            uint64_t sum = 0;
            for (int i = 0; i < EM_MEM_NCATEGORIES; i++) sum += e[z].bytes[i];
            CHECK(e[z].total == sum);
            CHECK(e[z].bytes[EM_MEM_ACTIVATIONS] == e[0].bytes[EM_MEM_ACTIVATIONS]);
        }
    }
}

/* On a CUDA device stage 2 keeps the full gradient buffer beside its shard
 * (dist/zero.c: the gradients are not given back in part there). */
TEST(test_estimate_memory_on_cuda_counts_stage_2s_full_gradient_buffer)
{
    em_mem_config c = em_mem_config_defaults();
    c.world = 4;
    c.bucket_mb = 0.1; /* on the CPU, two buckets in flight: less than the whole buffer */
    c.zero_stage = 2;
    c.cuda = true;
    em_mem_estimate e = estimate_of(&c), host;
    double P = (double)e.n_params;
    CHECK((double)e.bytes[EM_MEM_GRADS] == 4 * P + 4 * P / 4);
    c.zero_stage = 1;
    CHECK(estimate_of(&c).bytes[EM_MEM_GRADS] == (uint64_t)(4 * P)); /* stage 1 as on the CPU */
    c.cuda = false;
    c.zero_stage = 2;
    host = estimate_of(&c);
    CHECK(host.bytes[EM_MEM_GRADS] < e.bytes[EM_MEM_GRADS]);
    CHECK(host.bytes[EM_MEM_OPTIMIZER] == e.bytes[EM_MEM_OPTIMIZER]);
}

/* Stage 3 on a CUDA device: the gradients as stage 2 there, and the
 * parameters as on the CPU (the share and the 3 buckets kept whole) plus
 * the 2 MiB granules each bucket's chunk may straddle: GPT-2 124M at world
 * 8: 19 buckets of 25 MiB, 76 MiB more. */
TEST(test_estimate_memory_on_cuda_stage_3_adds_two_granules_per_bucket_to_the_parameters)
{
    em_mem_config c = em_mem_config_defaults();
    c.model = (em_gpt_config){
        .vocab_size = 50257, .block_size = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768, .bias = true};
    c.world = 8;
    c.batch = 1;
    c.zero_stage = 3;
    em_mem_estimate host = estimate_of(&c);
    c.cuda = true;
    em_mem_estimate dev = estimate_of(&c);
    double P = (double)dev.n_params, buckets = ceil(4 * P / (25 << 20));
    CHECK(buckets == 19);
    CHECK((double)dev.bytes[EM_MEM_PARAMS] == (double)host.bytes[EM_MEM_PARAMS] + 2 * buckets * (2 << 20));
    CHECK((double)dev.bytes[EM_MEM_PARAMS] < 4 * P); /* below the whole model: not capped */
    CHECK((double)dev.bytes[EM_MEM_GRADS] == 4 * P + 4 * P / 8);
    CHECK(dev.bytes[EM_MEM_OPTIMIZER] == host.bytes[EM_MEM_OPTIMIZER]);
}

TEST(test_estimate_memory_rejects_bad_fields_naming_them)
{
    em_mem_estimate e;
    em_mem_config c = em_mem_config_defaults();
    c.world = 0;
    CHECK_ERR(em_estimate_memory(&c, &e), EM_ERR_ARG, "world = 0");
    c = em_mem_config_defaults();
    c.zero_stage = 4;
    CHECK_ERR(em_estimate_memory(&c, &e), EM_ERR_ARG, "zero_stage = 4");
    c = em_mem_config_defaults();
    c.model.n_embd = 0;
    CHECK_ERR(em_estimate_memory(&c, &e), EM_ERR_ARG, "model.n_embd = 0");
    c = em_mem_config_defaults();
    c.batch = -2;
    CHECK_ERR(em_estimate_memory(&c, &e), EM_ERR_ARG, "batch = -2");
    c = em_mem_config_defaults();
    c.context = 65;
    CHECK_ERR(em_estimate_memory(&c, &e), EM_ERR_ARG, "context = 65");
    c = em_mem_config_defaults();
    c.momentum = true; /* AdamW */
    CHECK_ERR(em_estimate_memory(&c, &e), EM_ERR_ARG, "momentum");
    c = em_mem_config_defaults();
    c.model.n_head = 3;
    CHECK_ERR(em_estimate_memory(&c, &e), EM_ERR_ARG, "n_head = 3");
    c = em_mem_config_defaults();
    c.model.n_layer = 1 << 30;
    c.model.n_embd = 1 << 30;
    c.model.n_head = 1;
    CHECK_ERR(em_estimate_memory(&c, &e), EM_ERR_ARG, "2^62");
    CHECK_ERR(em_estimate_memory(NULL, &e), EM_ERR_ARG, "config is NULL");
    CHECK_ERR(em_estimate_memory(&c, NULL), EM_ERR_ARG, "out is NULL");
}

/* ---- measured against `ember train` --------------------------------------------- */

/* A character corpus big enough for the tiny GPT's windows. */
static void make_corpus(char *dir, size_t n, char *txt, size_t tn)
{
    th_tmpdir(dir, n, "ember-mem");
    th_pathf(txt, tn, "%s/corpus.txt", dir);
    FILE *f = fopen(txt, "w");
    for (int i = 0; i < 400; i++)
        fprintf(f, "line %d: the quick brown fox jumps over the lazy dog, %d times.\n", i, i * 7);
    fclose(f);
}

/* A measured configuration of the tiny GPT (ember train's default model,
 * L4 H4 C128, global batch 12 x 64), ZeRO stage given to ember train --zero. */
typedef struct peak_case {
    int world;
    int zero;
    const char *precision;
} peak_case;

static const peak_case peak_cases[] = {
    {1, 0, "no"},
    {1, 0, "bf16"},
    {2, 0, "no"},
    {2, 0, "bf16"},
    {2, 1, "no"},
    {2, 2, "no"},
    {2, 3, "no"},
    {2, 3, "bf16"},
};

/* "peak memory X MiB on process 0 (estimated Y MiB per process)" */
static bool parse_peak(const char *out, double *peak, double *est)
{
    const char *p = strstr(out, "peak memory ");
    char u1[8], u2[8];
    if (!p || sscanf(p, "peak memory %lf %7s on process 0 (estimated %lf %7s", peak, u1, est, u2) != 4)
        return false;
    *peak *= strcmp(u1, "GiB") ? 1 : 1024;
    *est *= strncmp(u2, "GiB", 3) ? 1 : 1024;
    return true;
}

TEST(test_estimate_memory_total_is_within_10_percent_of_the_measured_peak_of_ember_train)
{
#if defined(__SANITIZE_ADDRESS__)
    SKIP("AddressSanitizer's shadow memory and quarantine inflate the resident set: the estimate is for "
         "release builds");
#endif
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], world[8], zero[8];
    make_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    for (size_t k = 0; k < sizeof peak_cases / sizeof peak_cases[0]; k++) {
        const peak_case *pc = &peak_cases[k];
        snprintf(world, sizeof world, "%d", pc->world);
        snprintf(zero, sizeof zero, "%d", pc->zero);
        const char *train[] = {"train",       "--data",       txt, "--out",
                               out,           "--iters",      "3", "--eval-every",
                               "1000",        "--eval-iters", "1", "--mixed-precision",
                               pc->precision, "--zero",        zero};
        th_run_result *r;
        if (pc->world == 1)
            r = run_ember(train[0], train[1], train[2], train[3], train[4], train[5], train[6], train[7],
                          train[8], train[9], train[10], train[11], train[12], train[13], train[14], NULL);
        else
            r = run_ember("launch", "-n", world, "--master-port", "0", EMBER_BIN, train[0], train[1],
                          train[2], train[3], train[4], train[5], train[6], train[7], train[8], train[9],
                          train[10], train[11], train[12], train[13], train[14], NULL);
        CHECK_EXIT(r, 0);
        double peak, est;
        if (!parse_peak(r->out, &peak, &est))
            th_fail(__FILE__, __LINE__, "world %d, %s: no peak line in: %s", pc->world, pc->precision,
                    r->out);
        if (!(fabs(est - peak) <= 0.10 * peak))
            th_fail(__FILE__, __LINE__, "world %d, stage %s, %s: peak %.1f MiB, estimate %.1f MiB (%+.1f%%)",
                    pc->world, zero, pc->precision, peak, est, 100 * (est / peak - 1));
    }
}

/* ---- the commands ------------------------------------------------------------- */

TEST(test_cli_estimate_memory_prints_every_category_and_stage_and_the_total)
{
    th_run_result *r = run_ember("estimate-memory", "--n-layer", "12", "--n-head", "12", "--n-embd", "768",
                                 "--vocab", "50257", "--block-size", "1024", "--world", "4", NULL);
    CHECK_EXIT(r, 0);
    for (int i = 0; i < EM_MEM_NCATEGORIES; i++) CHECK(strstr(r->out, em_mem_category_name(i)) != NULL);
    CHECK(strstr(r->out, "ZeRO stage 0") && strstr(r->out, "ZeRO stage 3") && strstr(r->out, "total"));
    CHECK(strstr(r->out, "124.44M parameters") != NULL);
    r = run_ember("estimate-memory", "--zero", "2", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "ZeRO stage 2") && !strstr(r->out, "ZeRO stage 0"));
}

TEST(test_cli_estimate_memory_rejects_bad_flags_naming_them)
{
    struct {
        const char *flag, *value, *want;
    } bad[] = {{"--world", "0", "--world"},
               {"--zero", "4", "--zero"},
               {"--precision", "f8", "--precision"},
               {"--optimizer", "lion", "--optimizer"},
               {"--n-embd", "-1", "--n-embd"},
               {"--batch", "x", "--batch"},
               {"--bucket-mb", "-2", "--bucket-mb"},
               {"--frobnicate", "1", "--frobnicate"},
               {"--model", "/nonexistent/m", "/nonexistent/m"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        th_run_result *r = run_ember("estimate-memory", bad[k].flag, bad[k].value, NULL);
        CHECK_EXIT(r, 2);
        if (!strstr(r->err, bad[k].want))
            th_fail(__FILE__, __LINE__, "%s %s: stderr %s", bad[k].flag, bad[k].value, r->err);
    }
    th_run_result *r = run_ember("estimate-memory", "--n-head", "5", NULL); /* 128 wide */
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--n-head") != NULL);
    r = run_ember("estimate-memory", "--momentum", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--momentum") != NULL);
}

/* The table without its runtime and total rows: those hold this process's
 * resident baseline (rounded to a MiB), which two runs under ASan need not
 * share (seen: one failed run of the test below). */
static void shape_rows(const char *out, char *dst, size_t n)
{
    size_t k = 0;
    for (const char *line = out; *line && k + 1 < n;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) + 1 : strlen(line);
        if (strncmp(line, "runtime ", 8) && strncmp(line, "total ", 6)) {
            size_t c = len < n - 1 - k ? len : n - 1 - k;
            memcpy(dst + k, line, c);
            k += c;
        }
        line += len;
    }
    dst[k] = '\0';
}

/* The shape comes from a safetensors file's header: the same table as the
 * flags give (every row but the runtime's and the total); a file without a
 * GPT's tensors is refused naming it. */
TEST(test_cli_estimate_memory_reads_the_model_shape_from_a_safetensors_header)
{
    char dir[PATH_MAX], path[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-mem");
    th_pathf(path, sizeof path, "%s/model.safetensors", dir);
    em_gpt_config m = {
        .vocab_size = 50, .block_size = 32, .n_layer = 3, .n_head = 2, .n_embd = 16, .bias = false};
    em_gpt *g = em_gpt_new(&m, 1);
    CHECK(g != NULL);
    CHECK_OK(em_module_save(g->m, path));
    em_gpt_free(g);
    th_run_result *r = run_ember("estimate-memory", "--n-layer", "3", "--n-head", "2", "--n-embd", "16",
                                 "--vocab", "50", "--block-size", "32", "--no-bias", NULL);
    CHECK_EXIT(r, 0);
    char want[sizeof r->out], got[sizeof r->out];
    shape_rows(r->out, want, sizeof want);
    CHECK(strstr(want, "activations") && strstr(want, "0.01M parameters"));
    r = run_ember("estimate-memory", "--model", path, "--n-head", "2", NULL);
    CHECK_EXIT(r, 0);
    shape_rows(r->out, got, sizeof got);
    if (strcmp(got, want)) th_fail(__FILE__, __LINE__, "from the file:\n%s\nfrom the flags:\n%s", got, want);
    r = run_ember("estimate-memory", "--model", dir, "--n-head", "2", NULL); /* DIR/model.safetensors */
    CHECK_EXIT(r, 0);
    shape_rows(r->out, got, sizeof got);
    if (strcmp(got, want)) th_fail(__FILE__, __LINE__, "from the file:\n%s\nfrom the flags:\n%s", got, want);
    r = run_ember("estimate-memory", "--model", path, NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--n-head") != NULL);
    em_named one = {"w", em_zeros(EM_F32, 1, (int64_t[]){4})};
    CHECK_OK(em_safetensors_save(path, 1, &one, NULL));
    em_free(one.t);
    r = run_ember("estimate-memory", "--model", path, "--n-head", "2", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, path) && strstr(r->err, "wte.weight"));
}

/* A model whose estimate exceeds the machine is refused before anything big
 * is allocated: fast, naming the estimate, the memory available and the
 * biggest category. */
TEST(test_cli_train_refuses_a_run_that_cannot_fit_before_allocating)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    make_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* 48 x (12 x 16384^2) parameters: about 2.5 TB of f32 weights, gradients and moments */
    th_run_result *r = run_ember("train", "--data", txt, "--out", out, "--layers", "48", "--heads", "16",
                                 "--embd", "16384", "--iters", "1", NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "cannot fit") && strstr(r->err, "estimated") && strstr(r->err, "available"));
    CHECK(strstr(r->err, "optimizer state") != NULL); /* the biggest category */
    CHECK(strstr(r->err, "--no-memory-check") != NULL);
    CHECK((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) < 1.0);
    CHECK(access(out, F_OK) != 0); /* nothing written */
}
