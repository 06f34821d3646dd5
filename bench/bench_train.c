/* bench_train.c — one full GPT training step (forward, backward, global-norm
 * clip, AdamW) in ember, side by side with PyTorch in the same run.
 *
 * Configurations (issue 3): "tiny" — 4 layers, 4 heads, 128 wide, vocab 65,
 * B=12, T=64; "124m" — GPT-2 small: 12 layers, 12 heads, 768 wide, vocab
 * 50257, B=4, T=64.
 *
 * The reference is PyTorch 2 (issue 16): bench/train_step_torch.py runs the
 * same step eager, eager with AdamW(fused=True), and under torch.compile,
 * each with 1 and with 2 threads. It runs in rounds (3 by default); in a
 * round every PyTorch run comes right after an ember run of its own; a
 * round's speed-up is its fastest PyTorch run over the median of its ember
 * runs, and the figure printed is the median of the rounds', with their
 * range; then, like for like, the best configuration's median over the
 * rounds over ember's (the fastest of several runs against a median lands
 * low when the machine's speed varies). On a VM whose speed drifts by 15% within a minute, ember
 * measured once against the best of six runs spread over that minute
 * moved more with the drift than with the code (rounds of one ember run
 * and six PyTorch runs gave 1.29x, 1.44x and 1.58x within three minutes).
 * A mode the installed PyTorch lacks, or a compile that fails, is printed
 * with the reason and the others go on. Which python runs it:
 * EMBER_BENCH_PYTHON, else bench/.venv (bash bench/setup_torch.sh), else
 * /usr/bin/python3 (Debian's PyTorch 1.13: a fallback, printed as such);
 * bench/bench_python.h. Without torch only ember's figures are printed.
 *
 * Every run — ember's and each PyTorch one — is its own child process and
 * its peak memory is that child's ru_maxrss from wait4, so both sides are
 * measured the same way. The output starts with `ember env` (CPU model and
 * features, BLAS, threads, the product paths it reports).
 *
 * `bench_train amp` instead times ember's step in f32, bf16 and fp16 (autocast
 * forward with f32 master weights; fp16 adds the loss scaler's scale, unscale
 * and update) and reports each against f32: one child process holds a model
 * per precision and steps them in turn, so a noisy machine slows all alike.
 * It also runs "tiny-nobias", the tiny GPT without biases: there autocast's
 * products give bf16/f16 outputs (an f32 bias makes them f32), so the step's
 * elementwise ops, residual adds and attention input are low-precision
 * tensors too. Where bf16 has a product of its own (avx512bf16, amx), a
 * row "<name> f32p" follows each config's: f32 and bf16 again, from the
 * program run afresh with EMBER_BF16_PATH=f32, the bf16 path of a CPU
 * without a bf16 product (issue 16: never slower than f32 there).
 *
 * After ember's row, "GEMM bound" is the time of the step's matrix products
 * alone in raw cblas_sgemm (gemm_bound_ms): no step, in any framework using
 * that BLAS, is faster, so best PyTorch / bound is the largest speed-up
 * that BLAS allows. "FMA peak" is the same flops at the CPU's measured
 * multiply-add peak on ember's threads (bench_peak.h): the hardware's own
 * ceiling, which a GEMM faster than the BLAS's could approach.
 *
 * usage: bench_train [tiny|124m|all] [steps] [modes] [rounds]   (default all; 20 steps tiny, 5 for
 *          124m; modes, e.g. "eager,fused": only those PyTorch modes of eager, fused, compile, or
 *          "all"; rounds: 3 by default, each ember then every PyTorch run, see torch_table)
 *        bench_train amp [tiny|tiny-nobias|124m|all] [steps] [dtypes]   (dtypes, e.g. "bf16" or "f32,bf16":
 * run only those; a ratio whose side was not run prints nan) */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "bench_peak.h"
#include "bench_python.h"
#include "bench_util.h"
#include "ember/ember.h"

typedef struct bench_cfg {
    const char *name;
    em_gpt_config model;
    int64_t batch;
    int steps;
    bool amp_only; /* in the amp table only (no PyTorch script for it) */
} bench_cfg;

static const bench_cfg configs[] = {
    {"tiny",
     {.vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = true},
     12,
     20,
     false},
    /* tiny without biases: under autocast a Linear's output is then bf16/f16
     * (with an f32 bias it is f32), so the MLP's GELU, the residual adds and
     * the attention's input run on low-precision tensors */
    {"tiny-nobias",
     {.vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = false},
     12,
     20,
     true},
    {"124m",
     {.vocab_size = 50257, .block_size = 64, .n_layer = 12, .n_head = 12, .n_embd = 768, .bias = true},
     4,
     5,
     false},
};

static em_dtype precision = EM_F32; /* autocast dtype of ember's steps (EM_F32: off) */

/* One model in training: its optimizer, scaler (fp16), data and precision. */
typedef struct trainer {
    const bench_cfg *c;
    em_dtype precision;
    em_gpt *g;
    em_optimizer *opt;
    em_grad_scaler *scaler;
    em_named *named;
    em_tensor **params;
    int n;
    em_rng rng;
    double loss;
} trainer;

static void trainer_free(trainer *t)
{
    em_grad_scaler_free(t->scaler);
    em_optim_free(t->opt);
    free(t->params);
    free(t->named);
    em_gpt_free(t->g);
}

static int trainer_init(trainer *t, const bench_cfg *c, em_dtype prec)
{
    *t = (trainer){.c = c, .precision = prec, .rng = em_rng_new(7)};
    t->scaler = prec == EM_F16 ? em_grad_scaler_new(NULL) : NULL;
    t->g = em_gpt_new(&c->model, 1);
    if (!t->g || em_module_flatten(t->g->m)) return 1;
    t->n = em_module_params(t->g->m, NULL, 0);
    t->named = malloc(sizeof *t->named * (size_t)t->n);
    t->params = malloc(sizeof *t->params * (size_t)t->n);
    if (!t->named || !t->params) return 1;
    em_module_params(t->g->m, t->named, t->n);
    for (int i = 0; i < t->n; i++) t->params[i] = t->named[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-4;
    ac.beta2 = 0.99;
    ac.weight_decay = 0.1;
    t->opt = em_adamw_new(t->n, t->params, &ac);
    return t->opt ? 0 : 1;
}

/* One training step; its wall seconds in *sec. */
static int trainer_step(trainer *t, double *sec)
{
    const bench_cfg *c = t->c;
    em_scope s = em_scope_begin();
    em_tensor *x =
        em_randint(0, c->model.vocab_size, EM_I32, EM_SHAPE(c->batch, c->model.block_size), &t->rng);
    em_tensor *y =
        em_randint(0, c->model.vocab_size, EM_I32, EM_SHAPE(c->batch, c->model.block_size), &t->rng);
    double t0 = now();
    em_dtype prev = em_autocast_set(t->precision);
    em_tensor *l = em_gpt_loss(t->g, x, y);
    em_autocast_set(prev);
    em_tensor *scaled = l && t->scaler ? em_scaler_scale(t->scaler, l) : l;
    em_status st = scaled ? em_backward(scaled, NULL) : em_last_status();
    if (!st && t->scaler)
        em_scaler_unscale_clip(t->scaler, t->n, t->params, &(em_clip_config){.max_norm = 1.0}, NULL, &st);
    else if (!st)
        em_clip_grad_norm(t->n, t->params, 1.0, &st);
    if (!st && !em_scaler_found_inf(t->scaler)) st = em_optim_step(t->opt);
    em_scaler_update(t->scaler);
    if (!st) st = em_optim_zero_grad(t->opt);
    *sec = now() - t0;
    if (l) t->loss = em_item(l);
    em_scope_end(s);
    if (st) fprintf(stderr, "bench_train: step failed: %s\n", em_last_error());
    return st ? 1 : 0;
}

/* Runs `steps` timed steps after 2 warm-up steps in `precision`; writes the median seconds to *median_s. */
static int ember_steps(const bench_cfg *c, int steps, double *median_s, double *loss)
{
    trainer t = {0};
    double *sec = malloc(sizeof *sec * (size_t)(steps + 2));
    int rc = !sec || trainer_init(&t, c, precision);
    for (int i = 0; i < steps + 2 && !rc; i++) rc = trainer_step(&t, &sec[i]);
    if (!rc) {
        *median_s = median(sec + 2, steps);
        *loss = t.loss;
    }
    free(sec);
    trainer_free(&t);
    return rc;
}

/* ---- the GEMM bound ------------------------------------------------------------------- */

/* OpenBLAS's thread control (absent from other BLAS libraries): resolved when present. */
#pragma weak openblas_set_num_threads

/* Median seconds of cblas_sgemm C(M,N) = op(A) op(B) over 5 runs after one warm-up. */
static double sgemm_s(bool ta, bool tb, int M, int N, int K)
{
    float *a = calloc((size_t)M * (size_t)K, sizeof *a), *b = calloc((size_t)K * (size_t)N, sizeof *b);
    float *c = calloc((size_t)M * (size_t)N, sizeof *c);
    double t[5];
    for (int i = -1; i < 5 && a && b && c; i++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                    1.0f, a, ta ? M : K, b, tb ? K : N, 0.0f, c, N);
        if (i >= 0) t[i] = now() - t0;
    }
    double r = a && b && c ? median(t, 5) : 0;
    free(a);
    free(b);
    free(c);
    return r;
}

/* The fastest a step could be if it did nothing but its matrix products,
 * each in raw cblas_sgemm (OpenBLAS with 1 thread or as many as ember's
 * pool, whichever is faster for the shape):
 * every Linear's forward x W^T, backward dx = dy W and dW = dy^T x, timed at
 * the step's own shapes; the attention products (QK^T and PV, forward and
 * backward: six per layer and head, over the causal half of the (T,T)
 * scores) at the rate the Linears reached. Writes the step's product FLOPs to *gflop. */
static double gemm_bound_ms(const bench_cfg *c, double *gflop)
{
    int M = (int)(c->batch * c->model.block_size), C = (int)c->model.n_embd;
    const int shapes[5][3] = {{C, 3 * C, (int)c->model.n_layer}, /* K, N, how many */
                              {C, C, (int)c->model.n_layer},
                              {C, 4 * C, (int)c->model.n_layer},
                              {4 * C, C, (int)c->model.n_layer},
                              {C, (int)c->model.vocab_size, 1}}; /* the head, tied to the embedding */
    double s = 0, flop = 0;
    for (int i = 0; i < 5; i++) {
        int K = shapes[i][0], N = shapes[i][1];
        double one = 0;
        for (int th = 1; th <= em_num_threads(); th += em_num_threads() > 1 ? em_num_threads() - 1 : 1) {
            if (openblas_set_num_threads) openblas_set_num_threads(th);
            double t = sgemm_s(false, true, M, N, K) + sgemm_s(false, false, M, K, N) +
                       sgemm_s(true, false, N, K, M);
            one = one && one < t ? one : t;
        }
        s += one * shapes[i][2];
        flop += 3 * 2.0 * M * K * N * shapes[i][2];
    }
    double T = (double)c->model.block_size, attn = 6 * 2.0 * (double)c->batch * (double)c->model.n_layer *
                                                   (double)c->model.n_embd * T * (T + 1) / 2;
    s += attn * (s / flop);
    if (openblas_set_num_threads) openblas_set_num_threads(1);
    *gflop = (flop + attn) * 1e-9;
    return s * 1e3;
}

typedef struct ember_job {
    const bench_cfg *c;
    int steps;
} ember_job;

/* In the child: runs ember's steps and writes "ms loss" to fd. */
static int ember_job_run(void *arg, int fd)
{
    const ember_job *j = arg;
    double med = 0, l = 0;
    if (ember_steps(j->c, j->steps, &med, &l)) return 1;
    dprintf(fd, "%f %f\n", 1e3 * med, l);
    return 0;
}

/* Runs ember's measurement in a child (only ember in it, for its peak RSS). */
static int ember_child(const bench_cfg *c, int steps, double *ms, double *rss_mb, double *loss)
{
    ember_job j = {c, steps};
    bench_child ch;
    if (bench_run_child(NULL, ember_job_run, &j, &ch)) return 1;
    *rss_mb = ch.rss_mb;
    return sscanf(ch.out, "%lf %lf", ms, loss) == 2 ? 0 : 1;
}

/* One PyTorch run: its mode, threads and what it measured (ms < 0: failed, see err). */
typedef struct torch_run {
    const char *mode;
    int threads;
    double ms, rss_mb, loss, first_s;
    double import_mb; /* peak RSS right after `import torch` */
    double ember_ms;  /* bench_train: ember's step in the run right before this one */
    char err[400];
} torch_run;

/* Runs train_step_torch.py in a child with `py`; fills r (r->ms = -1 and r->err when it fails). */
static void torch_child(const bench_python *py, const char *cfg, int steps, torch_run *r)
{
    char script[1024], threads[16], nsteps[16];
    snprintf(script, sizeof script, "%s/train_step_torch.py", EMBER_BENCH_DIR);
    snprintf(threads, sizeof threads, "%d", r->threads);
    snprintf(nsteps, sizeof nsteps, "%d", steps);
    char *argv[] = {(char *)py->path, script,      "--config", (char *)cfg, "--mode",
                    (char *)r->mode,  "--threads", threads,    "--steps",   nsteps,
                    "--warmup",       "2",         NULL};
    bench_child ch;
    int rc = bench_run_child(argv, NULL, NULL, &ch);
    r->ms = bench_json_num(ch.out, "ms_per_step");
    r->rss_mb = ch.rss_mb;
    r->loss = bench_json_num(ch.out, "loss");
    r->first_s = bench_json_num(ch.out, "first_step_s");
    r->import_mb = bench_json_num(ch.out, "import_rss_mb");
    if (rc || r->ms <= 0) {
        r->ms = -1;
        bench_json_str(ch.out, "error", r->err, sizeof r->err);
        if (!r->err[0]) {
            if (WIFSIGNALED(ch.status))
                snprintf(r->err, sizeof r->err, "killed by signal %d; %s", WTERMSIG(ch.status), ch.err);
            else
                snprintf(r->err, sizeof r->err, "exit status %d; %s", WEXITSTATUS(ch.status), ch.err);
        }
    }
}

/* Prints what the machine and build are: `ember env` (CPU model and features,
 * BLAS, threads, and whatever else it reports about the product paths),
 * else the CPU model and the features ember detects. */
static void print_machine(void)
{
    char *argv[] = {EMBER_BENCH_EMBER, "env", NULL};
    bench_child ch;
    if (!bench_run_child(argv, NULL, NULL, &ch)) {
        printf("machine and build (`ember env`):\n");
        for (char *line = strtok(ch.out, "\n"); line; line = strtok(NULL, "\n")) printf("  %s\n", line);
        return;
    }
    char model[256];
    bench_cpu_model(model, sizeof model);
    em_cpu_features ft = em_cpu_detect();
    printf("machine (`ember env` did not run: %s):\n  cpu %s; AVX2 %s, FMA %s, AVX-512F %s, AVX512-BF16 %s; "
           "BLAS %s\n",
           ch.err[0] ? ch.err : EMBER_BENCH_EMBER, model, ft.avx2 ? "yes" : "no", ft.fma ? "yes" : "no",
           ft.avx512f ? "yes" : "no", ft.avx512bf16 ? "yes" : "no", em_build().blas);
}

/* whether the comma-separated `list` holds `name` as a whole item */
static bool list_has(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

/* The amp table's child: one trainer per precision asked for, stepped in
 * turn (f32, bf16, fp16, f32, ...), so the machine's drifts reach every
 * precision alike; writes each precision's median ms and the median over
 * rounds of f32's step time over the other's in that round. */
typedef struct amp_job {
    const bench_cfg *c;
    int steps;
    bool want[3];
} amp_job;

static const em_dtype amp_dtypes[3] = {EM_F32, EM_BF16, EM_F16};

static int amp_job_run(void *arg, int fd)
{
    const amp_job *j = arg;
    trainer t[3] = {{0}};
    double *sec[3] = {NULL, NULL, NULL}, *ratio = malloc(sizeof *ratio * (size_t)(j->steps + 2));
    int rc = !ratio;
    for (int d = 0; d < 3 && !rc; d++)
        if (j->want[d])
            rc = !(sec[d] = malloc(sizeof *sec[d] * (size_t)(j->steps + 2))) ||
                 trainer_init(&t[d], j->c, amp_dtypes[d]);
    for (int i = 0; i < j->steps + 2 && !rc; i++)
        for (int d = 0; d < 3 && !rc; d++)
            if (j->want[d]) rc = trainer_step(&t[d], &sec[d][i]);
    double ms[3] = {NAN, NAN, NAN}, r[3] = {NAN, NAN, NAN};
    for (int d = 0; d < 3 && !rc; d++) {
        if (!j->want[d]) continue;
        ms[d] = 1e3 * median(sec[d] + 2, j->steps);
        if (d == 0 || !j->want[0]) continue;
        for (int i = 0; i < j->steps; i++) ratio[i] = sec[0][i + 2] / sec[d][i + 2];
        r[d] = median(ratio, j->steps);
    }
    if (!rc) dprintf(fd, "%f %f %f %f %f\n", ms[0], ms[1], ms[2], r[1], r[2]);
    for (int d = 0; d < 3; d++) {
        trainer_free(&t[d]);
        free(sec[d]);
    }
    free(ratio);
    return rc;
}

/* The f32 and bf16 columns again with bf16 on the f32 path (EMBER_BF16_PATH=f32: what a CPU without a
 * bf16 product runs; issue 16 asks that it never be slower than f32), from this program run afresh (the
 * path is chosen once per process), as the row "<name> f32p". */
static int amp_f32_path_row(const char *name, int steps)
{
    char st[16], prog[] = "/proc/self/exe", amp[] = "amp", which[32], dts[] = "f32,bf16";
    snprintf(st, sizeof st, "%d", steps);
    snprintf(which, sizeof which, "%s", name);
    char *argv[] = {prog, amp, which, st, dts, NULL};
    const char *old = getenv("EMBER_BF16_PATH");
    char *keep = old ? strdup(old) : NULL;
    setenv("EMBER_BF16_PATH", "f32", 1);
    bench_child ch;
    int bad = bench_run_child(argv, NULL, NULL, &ch);
    if (keep)
        setenv("EMBER_BF16_PATH", keep, 1);
    else
        unsetenv("EMBER_BF16_PATH");
    free(keep);
    size_t n = strlen(ch.out);
    while (n > 0 && ch.out[n - 1] == '\n') ch.out[--n] = '\0';
    const char *nl = strrchr(ch.out, '\n'), *line = nl ? nl + 1 : ch.out; /* its table's row */
    double f, b, r;
    if (bad || sscanf(line, "%*s %lf %lf %*s %lfx", &f, &b, &r) != 3) {
        fprintf(stderr, "bench_train: ember %s with bf16 on the f32 path failed: %s\n", name, ch.err);
        return 1;
    }
    char label[32];
    snprintf(label, sizeof label, "%s f32p", name);
    printf(
        "%-16s %10.1f %10.1f %10s %11.2fx %12s   (bf16 on the f32 path: EMBER_BF16_PATH=f32, run afresh)\n",
        label, f, b, "", r, "");
    fflush(stdout);
    return 0;
}

/* ember alone in f32, bf16 and fp16, stepped in turn in one child */
static int amp_table(const char *which, int steps_arg, const char *only)
{
    printf("bench_train amp: ember's training step under autocast (f32 master weights); one process steps a "
           "model per precision in turn (f32, bf16, fp16, f32, ...); median over steps after 2 warm-up; "
           "f32/x = median over rounds of f32's time / x's in that round; threads %d\n",
           em_num_threads());
    print_machine();
    const char *pb = em_matmul_path(EM_BF16);
    printf("product paths (em_matmul_path): f32 %s, bf16 %s, fp16 %s\n", em_matmul_path(EM_F32),
           pb ? pb : em_last_error(), em_matmul_path(EM_F16));
    printf("%-16s %10s %10s %10s %12s %12s\n", "config", "f32 ms", "bf16 ms", "fp16 ms", "f32/bf16",
           "f32/fp16");
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const bench_cfg *c = &configs[i];
        if (strcmp(which, "all") && strcmp(which, c->name)) continue;
        amp_job j = {.c = c, .steps = steps_arg > 0 ? steps_arg : c->steps};
        for (int d = 0; d < 3; d++) j.want[d] = !only || list_has(only, em_dtype_name(amp_dtypes[d]));
        bench_child ch;
        double ms[3], r[3] = {NAN, NAN, NAN};
        if (bench_run_child(NULL, amp_job_run, &j, &ch) ||
            sscanf(ch.out, "%lf %lf %lf %lf %lf", &ms[0], &ms[1], &ms[2], &r[1], &r[2]) != 5) {
            fprintf(stderr, "bench_train: ember %s under autocast failed\n", c->name);
            return 1;
        }
        printf("%-16s %10.1f %10.1f %10.1f %11.2fx %11.2fx\n", c->name, ms[0], ms[1], ms[2], r[1], r[2]);
        fflush(stdout);
        if (pb && strcmp(pb, "f32") && j.want[0] && j.want[1] && amp_f32_path_row(c->name, j.steps)) return 1;
    }
    return 0;
}

/* The label of a PyTorch mode in the table. */
static const char *mode_label(const bench_python *py, const char *mode)
{
    if (!strcmp(mode, "eager")) return "torch eager";
    if (!strcmp(mode, "fused")) return "torch fused AdamW";
    return strcmp(py->fused, "yes") ? "torch.compile" : "torch.compile+fused";
}

/* Why this PyTorch cannot run `mode` (from its --info), or NULL. */
static const char *mode_unavailable(const bench_python *py, const char *mode)
{
    if (!strcmp(mode, "fused") && strcmp(py->fused, "yes")) return py->fused;
    if (!strcmp(mode, "compile") && strcmp(py->compile, "yes")) return py->compile;
    return NULL;
}

/* What one round measured: ember's step and every PyTorch run. */
typedef struct torch_round {
    double ms, mb, loss; /* ember's */
    torch_run runs[6];
    int nruns;
} torch_round;

/* The lowest and highest of v[0..n) in *lo, *hi. */
static void span(const double *v, int n, double *lo, double *hi)
{
    *lo = *hi = v[0];
    for (int i = 1; i < n; i++) {
        *lo = v[i] < *lo ? v[i] : *lo;
        *hi = v[i] > *hi ? v[i] : *hi;
    }
}

/* ember's step beside every PyTorch mode with 1 and 2 threads, per
 * configuration, in `rounds` rounds: in each, every PyTorch run right after
 * an ember run (the round's first ember run serves the first PyTorch run),
 * so both sides are sampled over the same minute of a machine whose speed
 * drifts (a VM). A round's speed-up is its fastest PyTorch run over the
 * median of its ember runs (the median: one ember run in twenty here took
 * 1.45x the others, right after a torch.compile run); the figure is the
 * median of the rounds' (their range beside it). */
static int torch_table(const char *which, int steps_arg, const char *modes, int rounds)
{
    static const char *const all_modes[] = {"eager", "fused", "compile"};
    char script[1024];
    snprintf(script, sizeof script, "%s/train_step_torch.py", EMBER_BENCH_DIR);
    bench_python py;
    bool have_torch = !bench_find_python(EMBER_BENCH_DIR, script, &py);
    printf(
        "bench_train: one training step = forward + backward + clip to norm 1.0 + AdamW, the same in ember\n"
        "and PyTorch; median over steps after 2 warm-up steps; each run in its own child process,\n"
        "peak MB = that child's ru_maxrss (wait4); %d round%s, each ember then every PyTorch run\n",
        rounds, rounds == 1 ? "" : "s");
    print_machine();
    printf("ember: %d threads; product path (em_matmul_path): f32 %s\n", em_num_threads(),
           em_matmul_path(EM_F32));
    if (have_torch) {
        printf("reference: PyTorch %s (%s), python %s (found by: %s)%s\n", py.version, py.build, py.path,
               py.how,
               py.fallback ? "\n  FALLBACK: this is not PyTorch 2; get it with `bash bench/setup_torch.sh` "
                             "(its --help)"
                           : "");
        printf("  fused AdamW on the CPU: %s\n  torch.compile: %s\n", py.fused, py.compile);
    } else {
        printf("reference: none (%s%s)\n  get PyTorch 2 with `bash bench/setup_torch.sh` (its --help)\n",
               strcmp(py.how, "EMBER_BENCH_PYTHON") ? "tried " : "EMBER_BENCH_PYTHON=", py.why);
    }
    printf("%s\n",
           have_torch
               ? "speed-up = fastest PyTorch run / ember's median, per round (above 1: ember is faster)\n"
               : "");
    int rc = 0;
    torch_round *rd = calloc((size_t)rounds, sizeof *rd);
    if (!rd) return 1;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const bench_cfg *c = &configs[i];
        if (c->amp_only || (strcmp(which, "all") && strcmp(which, c->name))) continue;
        int steps = steps_arg > 0 ? steps_arg : c->steps;
        double tokens = (double)(c->batch * c->model.block_size);
        double bound = 0, gflop = 0, peak_ms = NAN;
        int done = 0; /* rounds whose ember run and at least one PyTorch run finished (or no PyTorch) */
        double su[64], ems[64];
        printf("%-6s %3s %-21s %3s %10s %10s %9s %7s %12s\n", "config", "rnd", "run", "thr", "ms/step",
               "tokens/s", "peak MB", "loss", "first step s");
        for (int k = 0; k < rounds; k++) {
            torch_round *r = &rd[k];
            *r = (torch_round){0};
            if (ember_child(c, steps, &r->ms, &r->mb, &r->loss)) {
                fprintf(stderr, "bench_train: ember %s failed\n", c->name);
                rc = 1;
                break;
            }
            printf("%-6s %3d %-21s %3d %10.1f %10.0f %9.0f %7.3f\n", c->name, k + 1, "ember",
                   em_num_threads(), r->ms, tokens / (r->ms / 1e3), r->mb, r->loss);
            if (k == 0) {
                bound = gemm_bound_ms(c, &gflop);
                printf("%-6s %3s %-21s %3d %10.1f %10.0f   (the step's %.2f GFLOP of products alone in raw "
                       "cblas_sgemm)\n",
                       c->name, "", "GEMM bound", em_num_threads(), bound, tokens / (bound / 1e3), gflop);
                double peak = fma_peak_gflops(em_num_threads());
                peak_ms = peak > 0 ? gflop / peak * 1e3 : NAN;
                printf("%-6s %3s %-21s %3d %10.1f %10.0f   (the same GFLOP at this CPU's multiply-add peak, "
                       "measured: %.0f GFLOP/s)\n",
                       c->name, "", "FMA peak", em_num_threads(), peak_ms, tokens / (peak_ms / 1e3), peak);
            }
            fflush(stdout);
            const torch_run *best = NULL; /* the run fastest against the ember run beside it */
            double pair_ms[6], pair_first = r->ms;
            int npair = 0;
            for (int m = 0; m < 3 && have_torch; m++) {
                if (modes && !list_has(modes, all_modes[m])) continue;
                for (int th = 1; th <= 2; th++) {
                    torch_run *t = &r->runs[r->nruns++];
                    *t = (torch_run){.mode = all_modes[m], .threads = th, .ms = -1};
                    const char *why = mode_unavailable(&py, t->mode);
                    if (why)
                        snprintf(t->err, sizeof t->err, "not in this PyTorch: %s",
                                 why + (strncmp(why, "no: ", 4) ? 0 : 4));
                    else if (npair > 0 && ember_child(c, steps, &pair_first, &(double){0}, &(double){0})) {
                        /* a fresh ember run right before each PyTorch run but the first (the round's) */
                        fprintf(stderr, "bench_train: ember %s failed\n", c->name);
                        rc = 1;
                        break;
                    } else {
                        t->ember_ms = pair_first;
                        torch_child(&py, c->name, steps, t);
                    }
                    if (t->ms < 0) {
                        if (k == 0 || !why)
                            printf("%-6s %3d %-21s %3d   %s: %s\n", c->name, k + 1, mode_label(&py, t->mode),
                                   th, why ? "not run" : "failed", t->err);
                        fflush(stdout);
                        continue;
                    }
                    printf(
                        "%-6s %3d %-21s %3d %10.1f %10.0f %9.0f %7.3f %12.1f   ember beside it %.1f: %.2fx\n",
                        c->name, k + 1, mode_label(&py, t->mode), th, t->ms, tokens / (t->ms / 1e3),
                        t->rss_mb, t->loss, t->first_s, t->ember_ms, t->ms / t->ember_ms);
                    fflush(stdout);
                    pair_ms[npair++] = t->ember_ms;
                    if (!best || t->ms < best->ms) best = t;
                }
            }
            if (rc) break;
            if (have_torch && !best) continue; /* no PyTorch run finished: no ratio this round */
            ems[done] = npair ? median(pair_ms, npair) : r->ms;
            su[done] = best ? best->ms / ems[done] : NAN;
            if (best)
                printf(
                    "%-6s %3d round speed-up %.2fx (fastest PyTorch run: %s, %d thr, %.1f ms; ember's median "
                    "over the round's %d runs %.1f ms)\n",
                    c->name, k + 1, su[done], mode_label(&py, best->mode), best->threads, best->ms, npair,
                    ems[done]);
            done++;
        }
        if (!done) continue;
        double e_lo, e_hi, e_med = median(ems, done);
        span(ems, done, &e_lo, &e_hi);
        printf(
            "%-6s ember %.1f ms (median of %d rounds, %.1f-%.1f); the step runs at %.0f GFLOP/s, %.0f%% of "
            "the FMA peak; raw sgemm at %.0f%%; ember reaches %.0f%% of the GEMM bound\n",
            c->name, e_med, done, e_lo, e_hi, gflop / e_med * 1e3, 100 * peak_ms / e_med,
            100 * peak_ms / bound, 100 * bound / e_med);
        if (!have_torch) continue;
        /* every PyTorch run's median over the rounds, and the fastest of those */
        int nruns = rd[0].nruns, bi = -1;
        double bmed = 0, mb_lo = 0, mb_hi = 0, bmb = 0, import_mb = 0;
        for (int t = 0; t < nruns; t++) {
            double v[64], mb[64];
            int n = 0;
            for (int k = 0; k < rounds; k++)
                if (t < rd[k].nruns && rd[k].runs[t].ms > 0) {
                    mb[n] = rd[k].runs[t].rss_mb;
                    import_mb = rd[k].runs[t].import_mb;
                    v[n++] = rd[k].runs[t].ms;
                }
            if (!n) continue;
            double med = median(v, n), lo, hi;
            span(mb, n, &lo, &hi);
            mb_lo = mb_lo && mb_lo < lo ? mb_lo : lo;
            mb_hi = mb_hi > hi ? mb_hi : hi;
            if (bi < 0 || med < bmed) {
                bi = t;
                bmed = med;
                bmb = median(mb, n);
            }
        }
        if (bi < 0) continue;
        double s_lo, s_hi, s_med = median(su, done);
        span(su, done, &s_lo, &s_hi);
        printf("%-6s the GEMM bound is %.2fx the best PyTorch (%s, %d thr: median %.1f ms), the FMA peak "
               "%.2fx\n",
               c->name, bmed / bound, mode_label(&py, rd[0].runs[bi].mode), rd[0].runs[bi].threads, bmed,
               bmed / peak_ms);
        printf(
            "%-6s speed-up %.2fx (median of %d rounds' fastest PyTorch / ember; rounds %.2f-%.2fx); peak MB "
            "ember %.0f / PyTorch %.0f = %.2f (PyTorch runs %.0f-%.0f; `import torch` alone %.0f)\n",
            c->name, s_med, done, s_lo, s_hi, rd[0].mb, bmb, rd[0].mb / bmb, mb_lo, mb_hi, import_mb);
        /* The figure above sets each round's single fastest PyTorch run, of
         * whichever configuration, against ember's median: when the machine's
         * speed varies within a round, that minimum of several runs lands
         * lower than a median would. Like for like, medians on both sides: */
        printf("%-6s like for like: the best PyTorch configuration's median %.1f ms / ember's median %.1f ms "
               "= %.2fx\n",
               c->name, bmed, e_med, bmed / e_med);
        fflush(stdout);
    }
    free(rd);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "amp"))
        return amp_table(argc > 2 ? argv[2] : "all", argc > 3 ? atoi(argv[3]) : 0, argc > 4 ? argv[4] : NULL);
    int rounds = argc > 4 ? atoi(argv[4]) : 3;
    if (rounds < 1 || rounds > 64) {
        fprintf(stderr, "bench_train: rounds must be 1 to 64, got '%s'\n", argv[4]);
        return 2;
    }
    return torch_table(argc > 1 ? argv[1] : "all", argc > 2 ? atoi(argv[2]) : 0,
                       argc > 3 && strcmp(argv[3], "all") ? argv[3] : NULL, rounds);
}
