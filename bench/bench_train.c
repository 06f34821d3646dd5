/* bench_train.c — one full GPT training step (forward, backward, global-norm
 * clip, AdamW) in ember, side by side with PyTorch in the same run.
 *
 * Configurations (issue 3): "tiny" — 4 layers, 4 heads, 128 wide, vocab 65,
 * B=12, T=64; "124m" — GPT-2 small: 12 layers, 12 heads, 768 wide, vocab
 * 50257, B=4, T=64. Each configuration runs in a child process, so its peak
 * resident memory is its own. PyTorch runs bench/train_step_torch.py with 1
 * and with 2 threads and the better of the two is the reference (when
 * /usr/bin/python3 has torch; otherwise only ember's figures are printed).
 *
 * `bench_train amp` instead times ember's step in f32, bf16 and fp16 (autocast
 * forward with f32 master weights; fp16 adds the loss scaler's scale, unscale
 * and update) and reports each against f32 measured in the same run.
 *
 * usage: bench_train [tiny|124m|all] [steps]   (default all; 20 steps tiny, 5 for 124m)
 *        bench_train amp [tiny|124m|all] [steps] [dtypes]   (dtypes, e.g. "bf16" or "f32,bf16": run only
 *        those; a ratio whose side was not run prints nan) */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ember/ember.h"

typedef struct bench_cfg {
    const char *name;
    em_gpt_config model;
    int64_t batch;
    int steps;
} bench_cfg;

static const bench_cfg configs[] = {
    {"tiny",
     {.vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = true},
     12,
     20},
    {"124m",
     {.vocab_size = 50257, .block_size = 64, .n_layer = 12, .n_head = 12, .n_embd = 768, .bias = true},
     4,
     5},
};

static em_dtype precision = EM_F32; /* autocast dtype of ember's steps (EM_F32: off) */

/* Runs `steps` timed steps after 2 warm-up steps; writes the median seconds to *median_s. */
static int ember_steps(const bench_cfg *c, int steps, double *median_s, double *loss)
{
    em_grad_scaler *scaler = precision == EM_F16 ? em_grad_scaler_new(NULL) : NULL;
    em_gpt *g = em_gpt_new(&c->model, 1);
    if (!g || em_module_flatten(g->m)) return 1;
    int n = em_module_params(g->m, NULL, 0);
    em_named *named = malloc(sizeof *named * (size_t)n);
    em_tensor **params = malloc(sizeof *params * (size_t)n);
    em_module_params(g->m, named, n);
    for (int i = 0; i < n; i++) params[i] = named[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-4;
    ac.beta2 = 0.99;
    ac.weight_decay = 0.1;
    em_optimizer *opt = em_adamw_new(n, params, &ac);
    if (!opt) return 1;
    em_rng rng = em_rng_new(7);
    double *t = malloc(sizeof *t * (size_t)(steps + 2));
    for (int i = 0; i < steps + 2; i++) {
        em_scope s = em_scope_begin();
        em_tensor *x =
            em_randint(0, c->model.vocab_size, EM_I32, EM_SHAPE(c->batch, c->model.block_size), &rng);
        em_tensor *y =
            em_randint(0, c->model.vocab_size, EM_I32, EM_SHAPE(c->batch, c->model.block_size), &rng);
        double t0 = now();
        em_dtype prev = em_autocast_set(precision);
        em_tensor *l = em_gpt_loss(g, x, y);
        em_autocast_set(prev);
        em_tensor *scaled = l && scaler ? em_scaler_scale(scaler, l) : l;
        em_status st = scaled ? em_backward(scaled, NULL) : em_last_status();
        if (!st && scaler) st = em_scaler_unscale(scaler, n, params, NULL);
        if (!st) em_clip_grad_norm(n, params, 1.0, &st);
        if (!st && !em_scaler_found_inf(scaler)) st = em_optim_step(opt);
        em_scaler_update(scaler);
        if (!st) st = em_optim_zero_grad(opt);
        t[i] = now() - t0;
        if (l) *loss = em_item(l);
        em_scope_end(s);
        if (st) {
            fprintf(stderr, "bench_train: step failed: %s\n", em_last_error());
            return 1;
        }
    }
    *median_s = median(t + 2, steps);
    free(t);
    em_grad_scaler_free(scaler);
    em_optim_free(opt);
    free(params);
    free(named);
    em_gpt_free(g);
    return 0;
}

/* Runs ember's measurement in a child; reads back "ms rss loss". */
static int ember_child(const bench_cfg *c, int steps, double *ms, double *rss_mb, double *loss)
{
    int fd[2];
    if (pipe(fd)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        double med = 0, l = 0;
        int rc = ember_steps(c, steps, &med, &l);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        dprintf(fd[1], "%f %f %f\n", 1e3 * med, (double)ru.ru_maxrss / 1024.0, l);
        _exit(rc);
    }
    close(fd[1]);
    char buf[256] = {0};
    ssize_t got = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got <= 0 || !WIFEXITED(status) || WEXITSTATUS(status)) return 1;
    return sscanf(buf, "%lf %lf %lf", ms, rss_mb, loss) == 3 ? 0 : 1;
}

/* PyTorch's ms/step and peak RSS with `threads` threads, or -1. */
static double torch_ms(const char *cfg, int threads, int steps, double *rss_mb)
{
    char cmd[512];
    snprintf(
        cmd, sizeof cmd,
        "/usr/bin/python3 %s/train_step_torch.py --config %s --threads %d --steps %d --warmup 2 2>/dev/null",
        EMBER_BENCH_DIR, cfg, threads, steps);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[1024] = {0};
    char *ok = fgets(line, sizeof line, p);
    int rc = pclose(p);
    const char *m = ok ? strstr(line, "\"ms_per_step\": ") : NULL,
               *r = ok ? strstr(line, "\"peak_rss_mb\": ") : NULL;
    if (rc != 0 || !m || !r) return -1;
    *rss_mb = atof(r + 15);
    return atof(m + 15);
}

/* whether the comma-separated `list` holds `name` as a whole item */
static bool list_has(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

/* ember alone in f32, bf16 and fp16, each in its own child */
static int amp_table(const char *which, int steps_arg, const char *only)
{
    printf("bench_train amp: ember's training step under autocast (f32 master weights); median over steps after 2 "
           "warm-up; threads %d\n",
           em_num_threads());
    const char *pb = em_matmul_path(EM_BF16);
    printf("product paths (em_matmul_path): f32 %s, bf16 %s, fp16 %s\n", em_matmul_path(EM_F32),
           pb ? pb : em_last_error(), em_matmul_path(EM_F16));
    printf("%-6s %10s %10s %10s %12s %12s\n", "config", "f32 ms", "bf16 ms", "fp16 ms", "f32/bf16", "f32/fp16");
    int rc = 0;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const bench_cfg *c = &configs[i];
        if (strcmp(which, "all") && strcmp(which, c->name)) continue;
        int steps = steps_arg > 0 ? steps_arg : c->steps;
        double ms[3], mb, loss;
        const em_dtype dts[3] = {EM_F32, EM_BF16, EM_F16};
        for (int d = 0; d < 3; d++) {
            precision = dts[d];
            ms[d] = 0.0 / 0.0;
            if (only && !list_has(only, em_dtype_name(dts[d]))) continue;
            if (ember_child(c, steps, &ms[d], &mb, &loss)) {
                fprintf(stderr, "bench_train: ember %s in %s failed\n", c->name, em_dtype_name(dts[d]));
                return 1;
            }
        }
        printf("%-6s %10.1f %10.1f %10.1f %11.2fx %11.2fx\n", c->name, ms[0], ms[1], ms[2], ms[0] / ms[1],
               ms[0] / ms[2]);
        fflush(stdout);
    }
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "amp")) return amp_table(argc > 2 ? argv[2] : "all", argc > 3 ? atoi(argv[3]) : 0, argc > 4 ? argv[4] : NULL);
    const char *which = argc > 1 ? argv[1] : "all";
    int steps_arg = argc > 2 ? atoi(argv[2]) : 0;
    printf("bench_train: one training step = forward + backward + clip + AdamW; median over steps after 2 "
           "warm-up; ember threads %d\n",
           em_num_threads());
    printf("product path (em_matmul_path): f32 %s\n", em_matmul_path(EM_F32));
    printf("%-6s %12s %12s %10s %14s %14s %10s\n", "config", "ember ms", "torch ms", "ratio", "ember tok/s",
           "ember MB", "torch MB");
    int rc = 0;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const bench_cfg *c = &configs[i];
        if (strcmp(which, "all") && strcmp(which, c->name)) continue;
        int steps = steps_arg > 0 ? steps_arg : c->steps;
        double ms, mb, loss;
        if (ember_child(c, steps, &ms, &mb, &loss)) {
            fprintf(stderr, "bench_train: ember %s failed\n", c->name);
            rc = 1;
            continue;
        }
        double tmb1 = 0, tmb2 = 0;
        double t1 = torch_ms(c->name, 1, steps, &tmb1), t2 = torch_ms(c->name, 2, steps, &tmb2);
        double tbest = t1 < 0 ? t2 : t2 < 0 ? t1 : (t1 < t2 ? t1 : t2);
        double tmb = tbest == t1 ? tmb1 : tmb2;
        double tokens = (double)(c->batch * c->model.block_size);
        if (tbest > 0)
            printf("%-6s %12.1f %12.1f %10.2f %14.0f %14.0f %10.0f   (torch 1 thr %.1f, 2 thr %.1f; loss "
                   "%.3f)\n",
                   c->name, ms, tbest, ms / tbest, tokens / (ms / 1e3), mb, tmb, t1, t2, loss);
        else
            printf("%-6s %12.1f %12s %10s %14.0f %14.0f %10s   (torch not available; loss %.3f)\n", c->name,
                   ms, "-", "-", tokens / (ms / 1e3), mb, "-", loss);
        fflush(stdout);
    }
    return rc;
}
