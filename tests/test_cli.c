/* test_cli.c — the `ember` command as a user meets it: runs the built binary
 * (EMBER_BUILD_DIR/ember) and checks exit codes, stdout and stderr; plus the
 * runtime queries behind `ember env` (CPU features, version, build info). */
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "tensor/kernel_impl.h"

#define EMBER_BIN EMBER_BUILD_DIR "/ember"

/* Runs the ember binary with the NULL-terminated arguments. */
#define run_ember(...) th_run(EMBER_BIN, __VA_ARGS__)

/* true if some line of text starts with `prefix` */
static bool has_line(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, n)) return true;
    return false;
}

TEST(test_cli_env_exits_zero)
{
    th_run_result *r = run_ember("env", NULL);
    CHECK_EXIT(r, 0);
}

TEST(test_cli_env_prints_version_line)
{
    th_run_result *r = run_ember("env", NULL);
    CHECK(has_line(r->out, "version"));
    CHECK(strstr(r->out, em_version()) != NULL);
}

TEST(test_cli_env_prints_avx2_blas_and_cuda_lines)
{
    th_run_result *r = run_ember("env", NULL);
    CHECK_EXIT(r, 0);
    CHECK(has_line(r->out, "cpu features"));
    CHECK(strstr(r->out, "AVX2 ") != NULL);
    CHECK(has_line(r->out, "BLAS "));
    CHECK(has_line(r->out, "CUDA "));
}

TEST(test_cli_env_says_the_matmul_path_of_each_dtype)
{
    unsetenv("EMBER_BF16_PATH");
    unsetenv("EMBER_F32_PATH");
    th_run_result *r = run_ember("env", NULL);
    CHECK_EXIT(r, 0);
    char want[128];
    snprintf(want, sizeof want, "matmul bf16    %s: ", em_matmul_path(EM_BF16));
    CHECK(has_line(r->out, want));
    /* f32: the path this process takes (auto's rule is tested in
     * tests/test_f32_path.c) */
    const char *f32 = em_matmul_path(EM_F32);
    snprintf(want, sizeof want, "matmul f32     %s: ", f32);
    CHECK(has_line(r->out, want));
    CHECK(has_line(r->out, "matmul f16     f32: "));
    r = run_ember("env", "--json", NULL);
    snprintf(want, sizeof want, "\"matmul_paths\": {\"f32\": \"%s\", \"bf16\": \"%s\", \"f16\": \"f32\"}",
             f32, em_matmul_path(EM_BF16));
    CHECK(strstr(r->out, want) != NULL);
}

TEST(test_cli_env_follows_and_names_a_bad_f32_path_setting)
{
    setenv("EMBER_F32_PATH", "sgemm", 1);
    th_run_result *r = run_ember("env", NULL);
    CHECK(has_line(r->out, "matmul f32     sgemm: BLAS sgemm"));
    setenv("EMBER_F32_PATH", "diagonal", 1);
    r = run_ember("env", NULL);
    CHECK_EXIT(r, 0);
    CHECK(has_line(r->out,
                   "matmul f32     none: EMBER_F32_PATH='diagonal' is not one of auto, sgemm, avx2, avx512"));
    r = run_ember("env", "--json", NULL);
    CHECK(strstr(r->out, "\"f32\": null, \"f32_error\": \"EMBER_F32_PATH='diagonal'") != NULL);
    unsetenv("EMBER_F32_PATH");
}

/* auto's f32 rule follows the BLAS's kernels: OpenBLAS (a DYNAMIC_ARCH
 * build) told to run its Haswell (AVX2) kernels leaves f32 products to
 * ember's AVX-512 kernel; told to run SkylakeX's, to the BLAS */
TEST(test_cli_env_takes_the_avx512_kernel_only_where_the_blas_runs_no_avx512_sgemm)
{
    if (!em_cpu_detect().avx512f || !gemm_widen_usable()) SKIP("this CPU has no AVX-512F");
    unsetenv("EMBER_F32_PATH");
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    th_run_result *r = run_ember("env", NULL);
    if (!strstr(r->out, " Haswell ")) {
        unsetenv("OPENBLAS_CORETYPE");
        SKIP("the BLAS does not take OPENBLAS_CORETYPE (not OpenBLAS built with DYNAMIC_ARCH)");
    }
    CHECK(has_line(r->out, "matmul f32     avx512: ember's 6x32 AVX-512F kernel"));
    CHECK(strstr(r->out, "on its 6x32 AVX-512F kernel") != NULL); /* f16 */
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    r = run_ember("env", NULL);
    CHECK(strstr(r->out, " SkylakeX ") != NULL);
    CHECK(has_line(r->out, "matmul f32     sgemm: BLAS sgemm"));
    unsetenv("OPENBLAS_CORETYPE");
}

TEST(test_cli_env_follows_and_names_a_bad_bf16_path_setting)
{
    setenv("EMBER_BF16_PATH", "f32", 1);
    th_run_result *r = run_ember("env", NULL);
    CHECK(has_line(r->out, "matmul bf16    f32: kept in bf16, widened to f32"));
    /* and which rule autocast follows there (tests/test_amp_products.c) */
    CHECK(strstr(r->out, "autocast's f32 operands rounded to bf16 there, never copied") != NULL);
    setenv("EMBER_BF16_PATH", "sideways", 1);
    r = run_ember("env", NULL);
    CHECK_EXIT(r, 0);
    CHECK(has_line(r->out, "matmul bf16    none: EMBER_BF16_PATH='sideways' is not one of"));
    r = run_ember("env", "--json", NULL);
    CHECK(strstr(r->out, "\"bf16\": null, \"bf16_error\": \"EMBER_BF16_PATH='sideways'") != NULL);
    unsetenv("EMBER_BF16_PATH");
}

TEST(test_cli_env_reports_cuda_as_built_or_not)
{
    th_run_result *r = run_ember("env", NULL);
    CHECK(strstr(r->out, em_build().cuda ? "CUDA           built in; driver " : "CUDA           not built") !=
          NULL);
    /* one line per visible device, with its compute capability */
    int n = em_cuda_device_count();
    for (int i = 0; i < n && i < 8; i++) {
        char want[32];
        snprintf(want, sizeof want, "cuda:%d ", i);
        CHECK(strstr(r->out, want) != NULL);
    }
    if (n > 0) CHECK(strstr(r->out, "compute capability") != NULL);
}

TEST(test_cli_env_json_is_one_object_with_version)
{
    th_run_result *r = run_ember("env", "--json", NULL);
    CHECK_EXIT(r, 0);
    size_t n = strlen(r->out);
    while (n > 0 && r->out[n - 1] == '\n') n--;
    CHECK(n > 2 && r->out[0] == '{' && r->out[n - 1] == '}');
    CHECK(memchr(r->out, '\n', n) == NULL); /* one line: one object */
    CHECK(strstr(r->out, "\"version\": \"") != NULL);
    CHECK(strstr(r->out, em_version()) != NULL);
}

/* braces balance outside strings and the outer object closes only at the end */
TEST(test_cli_env_json_braces_balance)
{
    th_run_result *r = run_ember("env", "--json", NULL);
    size_t n = strlen(r->out);
    while (n > 0 && r->out[n - 1] == '\n') n--;
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = r->out[i];
        if (in_str && c == '\\')
            i++;
        else if (c == '"')
            in_str = !in_str;
        else if (!in_str && c == '{')
            depth++;
        else if (!in_str && c == '}' && --depth == 0 && i != n - 1)
            th_fail(__FILE__, __LINE__, "JSON object ends at %zu of %zu: %s", i, n, r->out);
    }
    CHECK(!in_str);
    CHECK(depth == 0);
}

TEST(test_cli_unknown_command_exits_2_naming_it)
{
    th_run_result *r = run_ember("nosuchcmd", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "nosuchcmd") != NULL);
    CHECK(strstr(r->err, "usage:") != NULL);
}

TEST(test_cli_unknown_top_level_flag_exits_2_naming_it)
{
    th_run_result *r = run_ember("--frobnicate", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--frobnicate") != NULL);
}

TEST(test_cli_env_unknown_flag_exits_2_naming_it)
{
    th_run_result *r = run_ember("env", "--bogus", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--bogus") != NULL);
    CHECK(r->out[0] == '\0');
}

TEST(test_cli_no_arguments_exits_2_with_usage)
{
    th_run_result *r = run_ember(NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "usage:") != NULL);
}

TEST(test_cli_help_exits_0_listing_subcommands)
{
    const char *forms[] = {"--help", "help", "-h"};
    for (int i = 0; i < 3; i++) {
        th_run_result *r = run_ember(forms[i], NULL);
        CHECK_EXIT(r, 0);
        CHECK(strstr(r->out, "usage:") != NULL);
        const char *cmds[] = {"env", "test", "demo", "version", "help"};
        for (int j = 0; j < 5; j++) {
            char want[32];
            snprintf(want, sizeof want, "\n  %s", cmds[j]);
            if (!strstr(r->out, want))
                th_fail(__FILE__, __LINE__, "ember %s does not list '%s'", forms[i], cmds[j]);
        }
    }
}

TEST(test_cli_version_prints_library_version)
{
    th_run_result *r = run_ember("version", NULL);
    CHECK_EXIT(r, 0);
    char want[64];
    snprintf(want, sizeof want, "ember %s\n", em_version());
    CHECK(!strcmp(r->out, want));
}

TEST(test_cli_test_rejects_unknown_arguments)
{
    th_run_result *r = run_ember("test", "--bogus", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--bogus") != NULL);
}

TEST(test_cli_test_suite_runs_selected_tests_of_its_build)
{
    /* runs this very suite, filtered to one test that does not recurse */
    th_run_result *r = run_ember("test", "--suite", "test_cli_version_prints_library_version", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "ok   test_cli_version_prints_library_version") != NULL);
    CHECK(strstr(r->out, "1 passed, 0 failed, 0 skipped") != NULL);
}

/* ---- runtime queries ------------------------------------------------------ */

TEST(test_cpu_detect_wider_features_imply_avx)
{
    em_cpu_features f = em_cpu_detect();
    CHECK(!f.avx2 || f.avx);
    CHECK(!f.fma || f.avx);
    CHECK(!f.f16c || f.avx);
    CHECK(!f.avx512f || f.avx);
    CHECK(!f.avx512bf16 || f.avx512f);
}

TEST(test_cpu_detect_is_stable_across_calls)
{
    em_cpu_features a = em_cpu_detect(), b = em_cpu_detect();
    CHECK(!memcmp(&a, &b, sizeof a));
}

/* The kernel lists a vector feature in /proc/cpuinfo only when the CPU has it
 * and the kernel saves its registers: the same rule em_cpu_detect applies. */
TEST(test_cpu_detect_agrees_with_proc_cpuinfo)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) SKIP("no /proc/cpuinfo");
    static char line[65536];
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            found = true;
            break;
        }
    fclose(f);
    if (!found) SKIP("/proc/cpuinfo has no x86 flags line");
    em_cpu_features c = em_cpu_detect();
    struct {
        const char *flag;
        bool have;
    } want[] = {{"avx", c.avx},   {"avx2", c.avx2},       {"fma", c.fma},
                {"f16c", c.f16c}, {"avx512f", c.avx512f}, {"avx512_bf16", c.avx512bf16}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char pat[32];
        snprintf(pat, sizeof pat, " %s", want[i].flag);
        bool listed = false;
        for (char *p = strstr(line, pat); p; p = strstr(p + 1, pat)) {
            char end = p[strlen(pat)];
            if (end == ' ' || end == '\n' || end == '\0') listed = true;
        }
        if (listed != want[i].have)
            th_fail(__FILE__, __LINE__, "%s: /proc/cpuinfo says %s, em_cpu_detect says %s", want[i].flag,
                    listed ? "yes" : "no", want[i].have ? "yes" : "no");
    }
}

TEST(test_version_is_dotted_numbers)
{
    int a, b, c;
    char tail;
    CHECK(sscanf(em_version(), "%d.%d.%d%c", &a, &b, &c, &tail) == 3);
}

TEST(test_build_info_names_buildtype_compiler_and_blas)
{
    em_build_info b = em_build();
    CHECK(b.buildtype && b.buildtype[0]);
    CHECK(b.compiler && b.compiler[0]);
    CHECK(b.blas && b.blas[0]);
    CHECK(!b.nccl || b.cuda); /* NCCL is only looked for with CUDA */
}

TEST(test_blas_reports_config_and_threads)
{
    CHECK(em_blas_config() && em_blas_config()[0]);
    if (!strcmp(em_build().blas, "openblas")) {
        CHECK(strstr(em_blas_config(), "OpenBLAS") != NULL);
        CHECK(em_blas_threads() >= 1);
    }
}

TEST(test_cuda_device_count_is_zero_without_cuda)
{
    int n = em_cuda_device_count();
    CHECK(n >= 0);
    if (!em_build().cuda) CHECK(n == 0);
}

TEST(test_cli_demo_loss_falls)
{
    th_run_result *r = run_ember("demo", "--steps", "100", NULL);
    CHECK_EXIT(r, 0);
    const char *p = strstr(r->out, "\nloss ");
    CHECK(p != NULL);
    double first = 0, last = 0;
    CHECK(sscanf(p + 1, "loss %lf -> %lf", &first, &last) == 2);
    CHECK(first > 1.0);        /* about ln 3 at the start */
    CHECK(last < 0.5 * first); /* and clearly lower after 100 steps */
}

TEST(test_cli_demo_rejects_bad_flag_and_value)
{
    th_run_result *r = run_ember("demo", "--bogus", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--bogus") != NULL);
    r = run_ember("demo", "--steps", "0", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--steps") != NULL);
}

/* ---- ember train / ember sample ---------------------------------------------- */

static bool file_nonempty(const char *dir, const char *name)
{
    char p[PATH_MAX];
    th_pathf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) return false;
    bool ok = fgetc(f) != EOF;
    fclose(f);
    return ok;
}

#define TINY_MODEL "--layers", "1", "--heads", "2", "--embd", "32", "--block", "16", "--batch", "8"
/* smaller still for the runs on the emulated device (about 1 µs a GPU thread) */
#define DEVICE_MODEL "--layers", "1", "--heads", "2", "--embd", "16", "--block", "8", "--batch", "4"

TEST(test_cli_train_writes_model_config_metrics_and_loss_falls)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_run_result *r =
        run_ember("train", "--data", txt, "--out", out, TINY_MODEL, "--iters", "80", "--eval-every", "40",
                  "--eval-iters", "4", "--lr", "3e-3", "--warmup", "5", "--log-every", "20", NULL);
    CHECK_EXIT(r, 0);
    double tl0, vl0, tl1, vl1;
    const char *e0 = strstr(r->out, "eval step=0 "), *e1 = strstr(r->out, "eval step=80 ");
    CHECK(e0 && e1);
    CHECK(sscanf(e0, "eval step=0 train_loss=%lf val_loss=%lf", &tl0, &vl0) == 2);
    CHECK(sscanf(e1, "eval step=80 train_loss=%lf val_loss=%lf", &tl1, &vl1) == 2);
    CHECK(tl0 > 2.5);       /* about ln(vocab) at the start */
    CHECK(tl1 < tl0 - 1.0); /* and clearly learned */
    CHECK(vl1 < vl0 - 1.0);
    CHECK(strstr(r->out, "step 20/80 loss") != NULL); /* not a terminal: one line per log step */
    CHECK(file_nonempty(out, "model.safetensors") && file_nonempty(out, "config") &&
          file_nonempty(out, "metrics.jsonl"));
    char p[PATH_MAX];
    th_pathf(p, sizeof p, "%s/metrics.jsonl", out);
    FILE *f = fopen(p, "r");
    char line[512];
    int evals = 0, logs = 0;
    while (fgets(line, sizeof line, f)) {
        CHECK(line[0] == '{' && strstr(line, "\"step\": "));
        evals += strstr(line, "\"val_loss\": ") != NULL;
        logs += strstr(line, "\"tokens_per_s\": ") != NULL;
    }
    fclose(f);
    CHECK(evals == 3 && logs == 4);
    /* the weights are a real safetensors file with the GPT's names */
    th_pathf(p, sizeof p, "%s/model.safetensors", out);
    em_safetensors *st = em_safetensors_open(p);
    CHECK_NOTNULL(st);
    em_tensor *wte = em_safetensors_get(st, "wte.weight");
    CHECK_NOTNULL(wte);
    CHECK(em_size(wte, 1) == 32);
    em_free(wte);
    em_safetensors_close(st);

    /* --init starts a new run from those weights: its first eval equals the last */
    char init[PATH_MAX], out2[PATH_MAX];
    th_pathf(init, sizeof init, "%s/model.safetensors", out);
    th_pathf(out2, sizeof out2, "%s/again", dir);
    r = run_ember("train", "--data", txt, "--out", out2, TINY_MODEL, "--iters", "0", "--eval-iters", "4", "--init",
                  init, NULL);
    CHECK_EXIT(r, 0);
    double tl2, vl2;
    const char *e2 = strstr(r->out, "eval step=0 ");
    CHECK(e2 && sscanf(e2, "eval step=0 train_loss=%lf val_loss=%lf", &tl2, &vl2) == 2);
    CHECK(tl2 < tl0 - 1.0); /* trained weights, not a fresh init */
    r = run_ember("train", "--data", txt, "--out", out2, "--init", txt, NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, txt) != NULL);
    r = run_ember("train", "--data", txt, "--out", txt, TINY_MODEL, "--iters", "1", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "is not a directory") != NULL);

    /* sample continues the prompt with characters of the corpus */
    r = run_ember("sample", "--ckpt", out, "--prompt", "the ", "--tokens", "40", "--seed", "3", NULL);
    CHECK_EXIT(r, 0);
    CHECK(!strncmp(r->out, "the ", 4));
    CHECK(strlen(r->out) >= 44);
    for (const char *c = r->out; *c; c++) CHECK(strchr("the catsondgml.\n", *c) != NULL);
    th_run_result copy = *r;
    r = run_ember("sample", "--ckpt", out, "--prompt", "the ", "--tokens", "40", "--seed", "3", NULL);
    CHECK(!strcmp(copy.out, r->out)); /* same seed, same text */
    r = run_ember("sample", "--ckpt", out, "--prompt", "xyz", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "'x'") != NULL);
}

TEST(test_cli_train_rejects_bad_flags_and_files)
{
    th_run_result *r = run_ember("train", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--data") != NULL);
    r = run_ember("train", "--data", "/nonexistent/corpus.txt", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "/nonexistent/corpus.txt") != NULL);
    r = run_ember("train", "--data", "x", "--lr", "fast", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--lr") != NULL && strstr(r->err, "fast") != NULL);
    r = run_ember("train", "--data", "x", "--embd", "10", "--heads", "3", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--embd 10") != NULL);
    r = run_ember("train", "--data", "x", "--frobnicate", "1", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--frobnicate") != NULL);
    r = run_ember("sample", "--ckpt", "/nonexistent/run", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "/nonexistent/run/config") != NULL);
    r = run_ember("sample", NULL);
    CHECK_EXIT(r, 2);
    r = run_ember("sample", "--ckpt", "x", "--tokens", "1e15", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--tokens") != NULL);
    r = run_ember("sample", "--ckpt", "x", "--temperature", "0", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--temperature") != NULL);
}

TEST(test_cli_train_rejects_text_shorter_than_a_window)
{
    char dir[PATH_MAX], txt[PATH_MAX];
    th_tmpdir(dir, sizeof dir, "ember-cli");
    th_pathf(txt, sizeof txt, "%s/short.txt", dir);
    FILE *f = fopen(txt, "w");
    fputs("tiny", f);
    fclose(f);
    th_run_result *r = run_ember("train", "--data", txt, "--out", dir, NULL);
    CHECK_EXIT(r, 1);
    CHECK(r->err[0] != '\0');
}

/* ---- ember train on a CUDA device (the emulator's in CI) -------------------------- */

/* The "step N/M loss X" lines of a non-terminal run (prefixed "[rank 0] "
 * under ember launch), into loss[0..max). */
static int step_losses(const char *out, double *loss, int max)
{
    int n = 0;
    for (const char *p = strstr(out, "step "); p && n < max; p = strstr(p + 1, "step ")) {
        long long step, total;
        double l;
        if (sscanf(p, "step %lld/%lld loss %lf", &step, &total, &l) == 3 && step == n + 1) loss[n++] = l;
    }
    return n;
}

/* `ember [launch -n N] train --device DEV --mixed-precision PREC` for 50
 * steps of the tiny model, losses into loss[]; the count of them is returned. */
static int train_losses(int nproc, const char *device, const char *prec, double *loss, char *out, size_t nout)
{
    char dir[PATH_MAX], txt[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, nout, "%s/run", dir);
    th_run_result *r;
    if (nproc == 1)
        r = run_ember("train", "--data", txt, "--out", out, DEVICE_MODEL, "--iters", "50", "--eval-every", "50",
                      "--eval-iters", "1", "--lr", "3e-3", "--warmup", "5", "--log-every", "1", "--device", device,
                      "--mixed-precision", prec, NULL);
    else
        r = run_ember("launch", "-n", "2", "--master-port", "0", EMBER_BIN, "train", "--data", txt, "--out", out,
                      DEVICE_MODEL, "--iters", "50", "--eval-every", "50", "--eval-iters", "1", "--lr", "3e-3",
                      "--warmup", "5", "--log-every", "1", "--device", device, "--mixed-precision", prec, NULL);
    if (r->status != 0) th_fail(__FILE__, __LINE__, "train on %s exited %d: %s", device, r->status, r->err);
    return step_losses(r->out, loss, 64);
}

/* The same run on both devices; the device sums its products in another
 * order (see test_ddp.c's CUDA section for the tolerances' reasoning): f32
 * within 1e-4, bf16 2e-3 and fp16 1e-3 of the CPU's loss at every step
 * (measured on the emulator: f32 equal to the 4 printed decimals, bf16
 * 2.4e-4, fp16 5e-5). */
static void check_train_follows_cpu(int nproc, const char *prec, double tol)
{
    double gpu[64], cpu[64];
    char gout[PATH_MAX], cout[PATH_MAX];
    int ng = train_losses(nproc, "cuda", prec, gpu, gout, sizeof gout),
        nc = train_losses(nproc, "cpu", prec, cpu, cout, sizeof cout);
    CHECK(ng == 50 && nc == 50);
    for (int i = 0; i < 50; i++) {
        double rel = fabs(gpu[i] - cpu[i]) / cpu[i];
        if (!(rel < tol))
            th_fail(__FILE__, __LINE__, "%s step %d: cuda loss %.6f, cpu %.6f (rel %.2g)", prec, i + 1, gpu[i], cpu[i],
                    rel);
    }
    CHECK(gpu[49] < gpu[0] - 0.5);
    if (nproc > 1 || strcmp(prec, "no")) return;
    /* the weights trained on the device sample on the device (KV cache there)
     * the text the CPU samples from them */
    th_run_result *r = run_ember("sample", "--ckpt", gout, "--prompt", "the ", "--tokens", "40", "--seed", "3",
                                 "--device", "cuda", NULL);
    CHECK_EXIT(r, 0);
    th_run_result on_gpu = *r;
    r = run_ember("sample", "--ckpt", gout, "--prompt", "the ", "--tokens", "40", "--seed", "3", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strlen(on_gpu.out) >= 44);
    if (strcmp(on_gpu.out, r->out)) th_fail(__FILE__, __LINE__, "cuda sampled '%s', cpu '%s'", on_gpu.out, r->out);
}

TEST(test_cli_train_on_cuda_follows_the_cpu_losses)
{
    if (em_cuda_device_count() < 1) SKIP("no CUDA device visible (GPU test)");
    check_train_follows_cpu(1, "no", 1e-4);
}

TEST(test_cli_train_on_cuda_bf16_follows_the_cpu_bf16_losses)
{
    if (em_cuda_device_count() < 1) SKIP("no CUDA device visible (GPU test)");
    check_train_follows_cpu(1, "bf16", 2e-3);
}

TEST(test_cli_train_on_cuda_fp16_follows_the_cpu_fp16_losses)
{
    if (em_cuda_device_count() < 1) SKIP("no CUDA device visible (GPU test)");
    check_train_follows_cpu(1, "fp16", 1e-3);
}

TEST(test_cli_launch_two_ranks_train_on_cuda_follows_the_cpu_ddp_losses)
{
    if (em_cuda_device_count() < 2) SKIP("needs 2 CUDA devices (GPU test)");
    check_train_follows_cpu(2, "no", 1e-4);
}

/* `ember launch -n 2 ember train --device cuda --zero 3` runs (the estimate
 * no longer refuses stage 3 on a device) and ends saying what the device
 * held: its peak in use and the parameters' mapped granules. */
TEST(test_cli_launch_two_ranks_train_on_cuda_at_zero_stage_3_says_what_the_device_held)
{
    if (em_cuda_device_count() < 2) SKIP("needs 2 CUDA devices (GPU test)");
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_run_result *r =
        run_ember("launch", "-n", "2", "--master-port", "0", EMBER_BIN, "train", "--data", txt, "--out", out,
                  DEVICE_MODEL, "--iters", "2", "--eval-iters", "1", "--device", "cuda", "--zero", "3", NULL);
    CHECK_EXIT(r, 0);
    if (!strstr(r->out, "ZeRO stage 3") || !strstr(r->out, "cuda:0 peak") ||
        !strstr(r->out, "+ parameters mapped"))
        th_fail(__FILE__, __LINE__, "stdout: %s", r->out);
}

TEST(test_cli_train_rejects_a_bad_device)
{
    th_run_result *r = run_ember("train", "--data", "x.txt", "--device", "gpu", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--device") && strstr(r->err, "'gpu'"));
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    r = run_ember("train", "--data", txt, "--out", out, TINY_MODEL, "--iters", "1", "--device", "cuda:7", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "cuda:7") != NULL);
}

/* --zero-offload reaches the ZeRO engine, which keeps a CUDA model's
 * optimizer state on the host: a CPU run is refused naming why. */
TEST(test_cli_train_zero_offload_of_a_cpu_model_is_refused_naming_why)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_run_result *r =
        run_ember("launch", "-n", "2", "--master-port", "0", EMBER_BIN, "train", "--data", txt, "--out", out,
                  TINY_MODEL, "--iters", "1", "--zero", "1", "--zero-offload", "--cpu", NULL);
    CHECK(r->status != 0);
    if (!strstr(r->err, "offload keeps a CUDA model's optimizer state"))
        th_fail(__FILE__, __LINE__, "stderr: %s", r->err);
}

TEST(test_cli_launch_more_ranks_than_cuda_devices_fails_naming_the_shortage)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], n[16];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    snprintf(n, sizeof n, "%d", em_cuda_device_count() + 1); /* one rank more than there are devices */
    th_run_result *r = run_ember("launch", "-n", n, "--master-port", "0", EMBER_BIN, "train", "--data", txt, "--out",
                                 out, DEVICE_MODEL, "--iters", "1", "--device", "cuda", NULL);
    CHECK(r->status != 0);
    CHECK(strstr(r->err, "not enough GPUs available") != NULL);
}

/* Runs a long `ember train` of a tiny model on txt into out (checkpoints at
 * step 0 only) and kills it (-9) as soon as its stdout shows a line starting
 * with `until`; fails the test if no such line came. */
static void train_then_kill(const char *txt, const char *out, const char *until)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl(EMBER_BIN, EMBER_BIN, "train", "--data", txt, "--out", out, "--layers", "1", "--heads", "2", "--embd",
              "16", "--block", "8", "--batch", "4", "--iters", "1000000", "--eval-every", "100000", "--eval-iters",
              "1", "--log-every", "1", "--cpu", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *o = fdopen(fds[0], "r");
    char line[512];
    bool reached = false;
    while (!reached && fgets(line, sizeof line, o)) reached = !strncmp(line, until, strlen(until));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fclose(o);
    if (!reached) th_fail(__FILE__, __LINE__, "ember train never printed '%s'", until);
}

/* Every metrics record is flushed as it is written: a run killed (-9) right
 * after printing "step 3/..." has steps 1, 2 and 3 in DIR/metrics.jsonl. */
TEST(test_cli_train_killed_keeps_every_metrics_record_it_printed)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], metrics[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_pathf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    train_then_kill(txt, out, "step 3/");
    char line[512];
    FILE *f = fopen(metrics, "r");
    CHECK(f != NULL);
    bool seen[4] = {false};
    while (fgets(line, sizeof line, f)) {
        long long step;
        if (sscanf(line, "{\"step\": %lld, \"loss\"", &step) == 1 && step >= 1 && step <= 3) seen[step] = true;
    }
    fclose(f);
    CHECK(seen[1] && seen[2] && seen[3]);
}

/* Integer flags never wrap, and a model that cannot fit is refused before
 * anything is allocated (and before --out is touched). */
TEST(test_cli_train_refuses_out_of_range_integers_and_models_that_cannot_fit)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_run_result *r = run_ember("train", "--data", txt, "--out", out, "--layers", "4294967297", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--layers") && strstr(r->err, "4294967297") && strstr(r->err, "1024"));
    r = run_ember("train", "--data", txt, "--out", out, "--block", "2147483648", NULL);
    CHECK_EXIT(r, 2);
    CHECK(strstr(r->err, "--block") && strstr(r->err, "2147483648"));
    r = run_ember("train", "--data", txt, "--out", out, "--batch", "-3", NULL);
    CHECK_EXIT(r, 2);
    r = run_ember("train", "--data", txt, "--out", out, "--layers", "1000", "--embd", "8192", "--iters", "1", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, "cannot fit") && strstr(r->err, "GiB"));
    CHECK(access(out, F_OK) != 0); /* nothing written */
}

/* A run killed (-9) past its checkpoint (saved at step 0 with --eval-every
 * 100000), resumed to a few steps past where it died: metrics.jsonl has
 * every training step exactly once and the evaluations at 0 and at the end
 * once each (the records the killed run wrote after its checkpoint are not
 * repeated). */
TEST(test_cli_train_resumed_after_a_kill_has_every_metrics_step_exactly_once)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], state[PATH_MAX], metrics[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_pathf(state, sizeof state, "%s/state", out);
    th_pathf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    train_then_kill(txt, out, "step 15/");
    char line[512];
    /* where the killed run got to */
    long long died = 0, step;
    FILE *f = fopen(metrics, "r");
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "{\"step\": %lld", &step) == 1 && step > died) died = step;
    fclose(f);
    CHECK(died >= 15);
    long long end = died + 5;
    char iters[32];
    snprintf(iters, sizeof iters, "%lld", end);
    th_run_result *r = run_ember("train", "--data", txt, "--out", out, "--layers", "1", "--heads", "2", "--embd", "16",
                                 "--block", "8", "--batch", "4", "--iters", iters, "--eval-every", "100000",
                                 "--eval-iters", "1", "--log-every", "1", "--cpu", "--resume", state, NULL);
    CHECK_EXIT(r, 0);
    int *logs = calloc((size_t)end + 1, sizeof *logs), evals0 = 0, evals_end = 0;
    f = fopen(metrics, "r");
    CHECK(f != NULL && logs != NULL);
    while (fgets(line, sizeof line, f)) {
        CHECK(sscanf(line, "{\"step\": %lld", &step) == 1 && step >= 0 && step <= end);
        if (strstr(line, "\"val_loss\""))
            step == 0 ? evals0++ : step == end ? evals_end++ : 0;
        else
            logs[step]++;
    }
    fclose(f);
    for (long long k = 1; k <= end; k++)
        if (logs[k] != 1) th_fail(__FILE__, __LINE__, "step %lld is in metrics.jsonl %d times", k, logs[k]);
    free(logs);
    CHECK(evals0 == 1 && evals_end == 1);
}

/* ---- resuming on another number of processes, and restarts that resume ------------------- */

/* 12 steps of the tiny model with a checkpoint every 6 (and at 0 and 12). */
#define RESUME_RUN                                                                                           \
    "--layers", "1", "--heads", "2", "--embd", "32", "--block", "16", "--batch", "8", "--iters", "12",       \
        "--eval-every", "6", "--eval-iters", "2", "--log-every", "1", "--lr", "3e-3", "--warmup", "2",       \
        "--cpu"

/* `ember launch -n N [--max-restarts R] ember train RESUME_RUN --out OUT [--resume RESUME]`, with EMBER_FAULT
 * set to fault (NULL: unset) */
static th_run_result *launch_train(const char *n, const char *restarts, const char *fault, const char *txt,
                                   const char *out, const char *resume)
{
    if (fault) setenv("EMBER_FAULT", fault, 1);
    th_run_result *r;
    if (resume)
        r = run_ember("launch", "-n", n, "--master-port", "0", "--max-restarts", restarts, EMBER_BIN, "train",
                      "--data", txt, "--out", out, RESUME_RUN, "--resume", resume, NULL);
    else
        r = run_ember("launch", "-n", n, "--master-port", "0", "--max-restarts", restarts, EMBER_BIN, "train",
                      "--data", txt, "--out", out, RESUME_RUN, NULL);
    unsetenv("EMBER_FAULT");
    return r;
}

/* max |a - b| over every tensor of two safetensors files with the same names */
static double weights_diff(const char *dir_a, const char *dir_b)
{
    char pa[PATH_MAX], pb[PATH_MAX];
    th_pathf(pa, sizeof pa, "%s/model.safetensors", dir_a);
    th_pathf(pb, sizeof pb, "%s/model.safetensors", dir_b);
    em_safetensors *a = em_safetensors_open(pa), *b = em_safetensors_open(pb);
    CHECK_NOTNULL(a);
    CHECK_NOTNULL(b);
    CHECK(em_safetensors_count(a) == em_safetensors_count(b) && em_safetensors_count(a) > 0);
    double d = 0;
    for (int i = 0; i < em_safetensors_count(a); i++) {
        em_tensor *ta = em_safetensors_get(a, em_safetensors_name(a, i));
        em_tensor *tb = em_safetensors_get(b, em_safetensors_name(a, i));
        CHECK_NOTNULL(ta);
        CHECK_NOTNULL(tb);
        d = fmax(d, th_max_abs_diff(ta, tb));
        em_free(ta);
        em_free(tb);
    }
    em_safetensors_close(a);
    em_safetensors_close(b);
    return d;
}

/* DIR/metrics.jsonl without the timings (ms_per_step, tokens_per_s: they
 * differ between any two runs), into buf */
static void metrics_values(const char *dir, char *buf, size_t n)
{
    char p[PATH_MAX], line[512];
    th_pathf(p, sizeof p, "%s/metrics.jsonl", dir);
    FILE *f = fopen(p, "r");
    CHECK(f != NULL);
    size_t len = 0;
    buf[0] = 0;
    while (fgets(line, sizeof line, f)) {
        char *cut = strstr(line, ", \"ms_per_step\"");
        if (cut) strcpy(cut, "}\n");
        CHECK(len + strlen(line) < n);
        strcpy(buf + len, line);
        len += strlen(line);
    }
    fclose(f);
}

/* The numbers of two metrics texts (as metrics_values gives them) agree: the
 * same records in the same order, steps equal, values within rel. */
static void check_metrics_within(const char *a, const char *b, double rel)
{
    const char *p = a, *q = b;
    int nums = 0;
    for (;;) {
        p = strchr(p, ':');
        q = strchr(q, ':');
        if (!p || !q) break;
        double x = strtod(p + 1, NULL), y = strtod(q + 1, NULL);
        if (!(fabs(x - y) <= rel * fabs(y)))
            th_fail(__FILE__, __LINE__, "metrics differ: %.6f vs %.6f at number %d of\n%s\nvs\n%s", x, y,
                    nums, a, b);
        p++, q++, nums++;
    }
    if (p || q) th_fail(__FILE__, __LINE__, "metrics have different records:\n%s\nvs\n%s", a, b);
    CHECK(nums > 40);
}

/* A straight run of 2 processes into DIR/straight, and one killed after its
 * checkpoint at step 6 into DIR/saved (EMBER_FAULT kills every process at
 * the end of step 7). */
static void straight_and_saved(char *dir, size_t n, char *txt, size_t tn, char *straight, char *saved)
{
    th_rhyme_corpus(dir, n, txt, tn);
    th_pathf(straight, PATH_MAX, "%s/straight", dir);
    th_pathf(saved, PATH_MAX, "%s/saved", dir);
    th_run_result *r = launch_train("2", "0", NULL, txt, straight, NULL);
    CHECK_EXIT(r, 0);
    r = launch_train("2", "0", "train.step:7", txt, saved, NULL);
    CHECK(r->status != 0);
}

/* The resumed run at `world` processes, against the straight 2-process
 * run: max |weight difference|; its metrics within rel 1e-4. */
static double resumed_on(const char *world, int shift_windows)
{
    char dir[PATH_MAX], txt[PATH_MAX], straight[PATH_MAX], saved[PATH_MAX], state[PATH_MAX];
    straight_and_saved(dir, sizeof dir, txt, sizeof txt, straight, saved);
    th_pathf(state, sizeof state, "%s/state", saved);
    for (int r = 0; r < 2 && shift_windows; r++) { /* a wrong data position: the sampler some windows on */
        char p[PATH_MAX], text[4096];
        th_pathf(p, sizeof p, "%s/rank_%d.json", state, r);
        FILE *f = fopen(p, "r");
        CHECK(f != NULL);
        size_t k = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[k] = 0;
        char *at = strstr(text, "\"sampler.offset\": \"");
        CHECK(at != NULL);
        at += strlen("\"sampler.offset\": \"");
        long long off = strtoll(at, NULL, 10);
        f = fopen(p, "w");
        fprintf(f, "%.*s%lld%s", (int)(at - text), text, off + shift_windows, strchr(at, '"'));
        fclose(f);
    }
    if (shift_windows) th_reseal_checkpoint(state); /* past the checksums, to the trajectory */
    th_run_result *r = launch_train(world, "0", NULL, txt, saved, state);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "resuming at step 6") != NULL);
    double d = weights_diff(straight, saved);
    if (!shift_windows) {
        static char ma[1 << 16], mb[1 << 16];
        metrics_values(saved, ma, sizeof ma);
        metrics_values(straight, mb, sizeof mb);
        check_metrics_within(ma, mb, 1e-4);
    }
    return d;
}

/* Measured: 1.0e-6 for 2 -> 1 and 2 -> 4; the sampler one batch (8
 * windows) off gives 3.7e-3, a single window off 1.9e-3. */
#define CLI_RESIZE_TOL 1e-4

TEST(test_cli_train_saved_by_two_processes_resumes_on_one_within_reassociation)
{
    double d = resumed_on("1", 0);
    if (!(d < CLI_RESIZE_TOL)) th_fail(__FILE__, __LINE__, "2 -> 1: max |weight diff| %.3g", d);
}

TEST(test_cli_train_saved_by_two_processes_resumes_on_four_within_reassociation)
{
    double d = resumed_on("4", 0);
    if (!(d < CLI_RESIZE_TOL)) th_fail(__FILE__, __LINE__, "2 -> 4: max |weight diff| %.3g", d);
}

/* The tolerance means something: the same resume with the windows one batch
 * on (a wrong data position) lands far outside it. */
TEST(test_cli_train_resumed_on_another_world_with_wrong_windows_exceeds_the_tolerance)
{
    double d = resumed_on("1", 8);
    if (!(d > 10 * CLI_RESIZE_TOL))
        th_fail(__FILE__, __LINE__, "windows one batch off: max |weight diff| %.3g", d);
}

/* The same number of processes resumes exactly, as before. */
TEST(test_cli_train_saved_by_two_processes_resumes_on_two_bitwise)
{
    double d = resumed_on("2", 0);
    if (d != 0) th_fail(__FILE__, __LINE__, "2 -> 2: max |weight diff| %.3g, want 0", d);
}

static bool same_file(const char *dir_a, const char *dir_b, const char *name)
{
    char pa[PATH_MAX], pb[PATH_MAX];
    th_pathf(pa, sizeof pa, "%s/%s", dir_a, name);
    th_pathf(pb, sizeof pb, "%s/%s", dir_b, name);
    FILE *a = fopen(pa, "rb"), *b = fopen(pb, "rb");
    CHECK(a && b);
    int ca, cb;
    long n = 0;
    do {
        ca = fgetc(a);
        cb = fgetc(b);
        n++;
    } while (ca == cb && ca != EOF);
    fclose(a);
    fclose(b);
    return ca == cb && n > 1;
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

/* `ember launch -n 2 --max-restarts 2 ember train --resume auto` with
 * EMBER_FAULT=fault (a worker dies once, on the first attempt) finishes, and
 * its weights and metrics (every step once, same values) are bitwise those
 * of the run that was never interrupted. `resumed` is what the restart
 * prints: "resuming at step N" or "starting fresh". */
static void check_restarted_job_ends_as_the_straight_one(const char *fault, const char *resumed)
{
    char dir[PATH_MAX], txt[PATH_MAX], straight[PATH_MAX], out[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(straight, sizeof straight, "%s/straight", dir);
    th_pathf(out, sizeof out, "%s/restarted", dir);
    th_run_result *r = launch_train("2", "0", NULL, txt, straight, "auto");
    CHECK_EXIT(r, 0);
    CHECK(count_of(r->out, "no checkpoint in") == 1 && strstr(r->out, "starting fresh"));
    r = launch_train("2", "2", fault, txt, out, "auto");
    CHECK_EXIT(r, 0);
    CHECK(count_of(r->err, "restarting the group") == 1);
    CHECK(strstr(r->err, "EMBER_FAULT: killed at") != NULL);
    if (!strstr(r->out, resumed))
        th_fail(__FILE__, __LINE__, "the restart did not print '%s':\n%s", resumed, r->out);
    if (!same_file(straight, out, "model.safetensors"))
        th_fail(__FILE__, __LINE__, "%s: the restarted job's weights differ from the straight run's", fault);
    static char ma[1 << 16], mb[1 << 16];
    metrics_values(out, ma, sizeof ma);
    metrics_values(straight, mb, sizeof mb);
    if (strcmp(ma, mb))
        th_fail(__FILE__, __LINE__, "%s: metrics differ:\n%s\nvs the straight run's\n%s", fault, ma, mb);
}

/* Rank 1 is killed once at the end of a random step K of 12 (checkpoints at
 * 0, 6, 12): the group restarts from the newest checkpoint before K. The
 * step is printed; EMBER_TEST_KILL_STEP=K repeats a run. */
TEST(test_cli_launch_restarts_train_resume_auto_after_a_kill_at_a_random_step)
{
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int k = 1 + rand() % 12;
    const char *want = getenv("EMBER_TEST_KILL_STEP");
    if (want && atoi(want) >= 1 && atoi(want) <= 12) k = atoi(want);
    printf("     rank 1 killed at the end of step %d (EMBER_FAULT=train.step:%d:1:0)\n", k, k);
    fflush(stdout);
    char fault[64], resumed[64];
    snprintf(fault, sizeof fault, "train.step:%d:1:0", k);
    snprintf(resumed, sizeof resumed, "resuming at step %d from", (k - 1) / 6 * 6);
    check_restarted_job_ends_as_the_straight_one(fault, resumed);
}

/* Rank 1 is killed as the first save begins, before any checkpoint exists:
 * the restart starts fresh, and the metrics file starts over empty. */
TEST(test_cli_launch_restarts_train_resume_auto_after_a_kill_before_any_checkpoint)
{
    check_restarted_job_ends_as_the_straight_one("train.save:1:1:0", "starting fresh");
}

/* --resume auto never trains over a checkpoint it cannot load: it fails
 * with the load's error and leaves the files as they were. */
TEST(test_cli_train_resume_auto_refuses_a_damaged_checkpoint)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], p[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_run_result *r = run_ember("train", "--data", txt, "--out", out, RESUME_RUN, NULL);
    CHECK_EXIT(r, 0);
    th_pathf(p, sizeof p, "%s/state/rank_0.json", out);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    fputs("{\"format\": \"ember-accel", f); /* torn */
    fclose(f);
    static char before[1 << 16], after[1 << 16];
    metrics_values(out, before, sizeof before);
    r = run_ember("train", "--data", txt, "--out", out, RESUME_RUN, "--resume", "auto", NULL);
    CHECK_EXIT(r, 1);
    CHECK(strstr(r->err, p) != NULL);
    CHECK(strstr(r->out, "starting fresh") == NULL);
    metrics_values(out, after, sizeof after);
    CHECK(!strcmp(before, after));
}

/* An empty state directory (a save that died before writing anything) holds
 * no checkpoint: auto starts fresh. */
TEST(test_cli_train_resume_auto_starts_fresh_over_an_empty_state_directory)
{
    char dir[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], state[PATH_MAX];
    th_rhyme_corpus(dir, sizeof dir, txt, sizeof txt);
    th_pathf(out, sizeof out, "%s/run", dir);
    th_pathf(state, sizeof state, "%s/state", out);
    CHECK(mkdir(out, 0755) == 0 && mkdir(state, 0755) == 0);
    th_run_result *r = run_ember("train", "--data", txt, "--out", out, RESUME_RUN, "--resume", "auto", NULL);
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "starting fresh") != NULL);
    CHECK(file_nonempty(state, "rank_0.json"));
}
