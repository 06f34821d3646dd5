/* bench_ab.c — two builds of libember side by side in one process: whole
 * GPT training steps (forward, backward, clip, AdamW), alternating between
 * the two libraries in blocks, so the machine's drift reaches both alike.
 *
 * Why: on the 2-core VM this project measures on, the same step took 37 to
 * 56 ms within ten minutes, and two runs of bench_train a minute apart
 * cannot tell a 2% change from noise. Here each library runs a block of
 * steps (after one unmeasured step, which wakes its thread pool), then the
 * other; a block's figure is its median step, and the figure printed is
 * the median over blocks of B's time / A's in the same round, with the
 * rounds' range. Run a library against a copy of itself to see this
 * machine's noise (the ratio's range around 1.00).
 *
 * The library loaded second ran about 2% faster than the first, either
 * way round (a copy against itself: 0.963 one run), so two processes each
 * run the rounds, one loading A first and one B, and the figure is the
 * median over both.
 *
 * Each library is loaded with dlopen(RTLD_LOCAL): its own thread pool,
 * arena and settings, nothing shared but the process. Between blocks the
 * program sleeps 2 ms, so the other library's workers stop spinning first.
 *
 * Making a library to compare with: copy build/libember.so aside before a
 * change (cp build/libember.so /tmp/before.so), or build a commit in a
 * worktree (git worktree add /tmp/base COMMIT && meson setup /tmp/base/b
 * /tmp/base && ninja -C /tmp/base/b).
 *
 * usage: bench_ab LIB_A LIB_B [tiny|124m] [rounds] [f32|bf16|f16]
 *   (defaults: tiny, 10 rounds per load order, blocks of 5 steps (3 for 124m), f32: autocast
 *   off; bf16/f16: the forward under autocast, as bench_train amp; f16
 *   with the loss scaler: the loss scaled, the gradients unscaled and
 *   clipped by em_scaler_unscale_clip where the library has it, else by
 *   em_scaler_unscale and em_clip_grad_norm, the step skipped on an
 *   overflow) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "ember/ember.h"

/* The public functions a step calls, from one library. */
typedef struct lib {
    const char *path;
    void *h;
    __typeof__(&em_scope_begin) scope_begin;
    __typeof__(&em_scope_end) scope_end;
    __typeof__(&em_rng_new) rng_new;
    __typeof__(&em_randint) randint;
    __typeof__(&em_gpt_new) gpt_new;
    __typeof__(&em_gpt_free) gpt_free;
    __typeof__(&em_gpt_loss) gpt_loss;
    __typeof__(&em_module_params) module_params;
    __typeof__(&em_module_flatten) module_flatten;
    __typeof__(&em_adamw_defaults) adamw_defaults;
    __typeof__(&em_adamw_new) adamw_new;
    __typeof__(&em_optim_free) optim_free;
    __typeof__(&em_optim_step) optim_step;
    __typeof__(&em_optim_zero_grad) optim_zero_grad;
    __typeof__(&em_clip_grad_norm) clip_grad_norm;
    __typeof__(&em_backward) backward;
    __typeof__(&em_autocast_set) autocast_set;
    __typeof__(&em_last_error) last_error;
    __typeof__(&em_grad_scaler_new) scaler_new;
    __typeof__(&em_grad_scaler_free) scaler_free;
    __typeof__(&em_scaler_scale) scaler_scale;
    __typeof__(&em_scaler_unscale) scaler_unscale;
    __typeof__(&em_scaler_found_inf) scaler_found_inf;
    __typeof__(&em_scaler_update) scaler_update;
    __typeof__(&em_scaler_unscale_clip) scaler_unscale_clip; /* NULL in a library before it */
} lib;

/* One model in training on one library. */
typedef struct run {
    lib *l;
    em_gpt *g;
    em_optimizer *opt;
    em_tensor **params;
    int n;
    em_rng rng;
    em_grad_scaler *scaler; /* f16 */
} run;

static int load(lib *l, const char *path)
{
    l->path = path;
    l->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!l->h) {
        fprintf(stderr, "bench_ab: cannot load %s: %s\n", path, dlerror());
        return 1;
    }
#define SYM(field, name)                                                                                     \
    if (!(*(void **)&l->field = dlsym(l->h, name))) {                                                        \
        fprintf(stderr, "bench_ab: %s has no %s\n", path, name);                                             \
        return 1;                                                                                            \
    }
    SYM(scope_begin, "em_scope_begin")
    SYM(scope_end, "em_scope_end")
    SYM(rng_new, "em_rng_new")
    SYM(randint, "em_randint")
    SYM(gpt_new, "em_gpt_new")
    SYM(gpt_free, "em_gpt_free")
    SYM(gpt_loss, "em_gpt_loss")
    SYM(module_params, "em_module_params")
    SYM(module_flatten, "em_module_flatten")
    SYM(adamw_defaults, "em_adamw_defaults")
    SYM(adamw_new, "em_adamw_new")
    SYM(optim_free, "em_optim_free")
    SYM(optim_step, "em_optim_step")
    SYM(optim_zero_grad, "em_optim_zero_grad")
    SYM(clip_grad_norm, "em_clip_grad_norm")
    SYM(backward, "em_backward")
    SYM(autocast_set, "em_autocast_set")
    SYM(last_error, "em_last_error")
    SYM(scaler_new, "em_grad_scaler_new")
    SYM(scaler_free, "em_grad_scaler_free")
    SYM(scaler_scale, "em_scaler_scale")
    SYM(scaler_unscale, "em_scaler_unscale")
    SYM(scaler_found_inf, "em_scaler_found_inf")
    SYM(scaler_update, "em_scaler_update")
#undef SYM
    *(void **)&l->scaler_unscale_clip = dlsym(l->h, "em_scaler_unscale_clip");
    return 0;
}

static const em_gpt_config tiny = {
    .vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = true};
static const em_gpt_config gpt2 = {
    .vocab_size = 50257, .block_size = 64, .n_layer = 12, .n_head = 12, .n_embd = 768, .bias = true};

static int run_init(run *r, lib *l, const em_gpt_config *cfg, em_dtype prec)
{
    *r = (run){.l = l, .rng = l->rng_new(7)};
    if (prec == EM_F16 && !(r->scaler = l->scaler_new(NULL))) return 1;
    r->g = l->gpt_new(cfg, 1);
    if (!r->g || l->module_flatten(r->g->m)) return 1;
    r->n = l->module_params(r->g->m, NULL, 0);
    em_named *named = malloc(sizeof *named * (size_t)r->n);
    r->params = malloc(sizeof *r->params * (size_t)r->n);
    if (!named || !r->params) {
        free(named);
        return 1;
    }
    l->module_params(r->g->m, named, r->n);
    for (int i = 0; i < r->n; i++) r->params[i] = named[i].t;
    free(named);
    em_adam_config ac = l->adamw_defaults();
    ac.lr = 1e-4;
    ac.weight_decay = 0.1;
    r->opt = l->adamw_new(r->n, r->params, &ac);
    return r->opt ? 0 : 1;
}

/* One training step of batch B; its seconds in *sec. */
static int run_step(run *r, const em_gpt_config *cfg, int64_t B, em_dtype prec, double *sec)
{
    lib *l = r->l;
    em_scope s = l->scope_begin();
    em_tensor *x = l->randint(0, cfg->vocab_size, EM_I32, EM_SHAPE(B, cfg->block_size), &r->rng);
    em_tensor *y = l->randint(0, cfg->vocab_size, EM_I32, EM_SHAPE(B, cfg->block_size), &r->rng);
    double t0 = now();
    em_dtype prev = l->autocast_set(prec);
    em_tensor *loss = l->gpt_loss(r->g, x, y);
    l->autocast_set(prev);
    if (loss && r->scaler) loss = l->scaler_scale(r->scaler, loss);
    em_status st = loss ? l->backward(loss, NULL) : EM_ERR_ARG;
    if (!st && r->scaler && l->scaler_unscale_clip)
        l->scaler_unscale_clip(r->scaler, r->n, r->params, &(em_clip_config){.max_norm = 1.0}, NULL, &st);
    else if (!st && r->scaler && !(st = l->scaler_unscale(r->scaler, r->n, r->params, NULL)) &&
             !l->scaler_found_inf(r->scaler))
        l->clip_grad_norm(r->n, r->params, 1.0, &st);
    else if (!st && !r->scaler)
        l->clip_grad_norm(r->n, r->params, 1.0, &st);
    if (!st && !(r->scaler && l->scaler_found_inf(r->scaler))) st = l->optim_step(r->opt);
    if (r->scaler) l->scaler_update(r->scaler);
    if (!st) st = l->optim_zero_grad(r->opt);
    *sec = now() - t0;
    l->scope_end(s);
    if (st) fprintf(stderr, "bench_ab: a step on %s failed: %s\n", l->path, l->last_error());
    return st ? 1 : 0;
}

/* The median of a block of `steps` steps after one unmeasured step. */
static int block(run *r, const em_gpt_config *cfg, int64_t B, em_dtype prec, int steps, double *med)
{
    double t[16], s;
    if (run_step(r, cfg, B, prec, &s)) return 1;
    for (int i = 0; i < steps; i++)
        if (run_step(r, cfg, B, prec, &t[i])) return 1;
    *med = median(t, steps);
    return 0;
}

/* The measurements of one load order, in a child process: loads first
 * then second (libs[0] is A, libs[1] B in the user's naming; order 1 loads
 * B first), runs `rounds` rounds and writes each round's "A_ms B_ms" to fd. */
static int one_order(char **libs, int order, const em_gpt_config *cfg, int64_t B, em_dtype prec, int steps,
                     int rounds, int fd)
{
    lib L[2] = {{0}};
    run R[2] = {{0}};
    for (int j = 0; j < 2; j++) {
        int i = (j + order) % 2; /* the library loaded j-th */
        if (load(&L[i], libs[i]) || run_init(&R[i], &L[i], cfg, prec)) {
            fprintf(stderr, "bench_ab: setting up the model on %s failed\n", libs[i]);
            return 1;
        }
    }
    for (int k = 0; k < rounds; k++) {
        double ms[2];
        for (int j = 0; j < 2; j++) {
            int i = (k + j) % 2;
            usleep(2000);
            if (block(&R[i], cfg, B, prec, steps, &ms[i])) return 1;
        }
        printf("%5d %6s %10.2f %10.2f %8.3f\n", k + 1, order ? "B, A" : "A, B", 1e3 * ms[0], 1e3 * ms[1],
               ms[1] / ms[0]);
        fflush(stdout);
        dprintf(fd, "%.9f %.9f\n", ms[0], ms[1]);
    }
    for (int i = 0; i < 2; i++) {
        L[i].optim_free(R[i].opt);
        L[i].scaler_free(R[i].scaler);
        L[i].gpt_free(R[i].g);
        free(R[i].params);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_ab LIB_A LIB_B [tiny|124m] [rounds] [f32|bf16|f16]\n");
        return 2;
    }
    bool big = argc > 3 && !strcmp(argv[3], "124m");
    if (argc > 3 && !big && strcmp(argv[3], "tiny")) {
        fprintf(stderr, "bench_ab: the model is tiny or 124m, got '%s'\n", argv[3]);
        return 2;
    }
    int rounds = argc > 4 ? atoi(argv[4]) : 10;
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "bench_ab: rounds must be 1 to 1000, got '%s'\n", argv[4]);
        return 2;
    }
    const char *pn = argc > 5 ? argv[5] : "f32";
    em_dtype prec = !strcmp(pn, "f32")    ? EM_F32
                    : !strcmp(pn, "bf16") ? EM_BF16
                    : !strcmp(pn, "f16")  ? EM_F16
                                          : EM_BOOL;
    if (prec == EM_BOOL) {
        fprintf(stderr, "bench_ab: the precision is f32, bf16 or f16, got '%s'\n", pn);
        return 2;
    }
    const em_gpt_config *cfg = big ? &gpt2 : &tiny;
    int64_t B = big ? 4 : 12;
    int steps = big ? 3 : 5;
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf(
        "bench_ab: %s GPT training steps (B=%lld, T=%lld, %s) on %s; in each of two processes (one loads A "
        "first, the other B) %d rounds of a block of %d steps on each library in turn\n  A = %s\n  B = "
        "%s\n%5s %6s %10s %10s %8s\n",
        big ? "124M" : "tiny", (long long)B, (long long)cfg->block_size, pn, model, rounds, steps, argv[1],
        argv[2], "round", "loaded", "A ms", "B ms", "B/A");
    fflush(stdout);
    double *ratio = malloc(sizeof(double) * (size_t)(2 * rounds)), half[2] = {0, 0};
    int n = 0;
    for (int order = 0; order < 2 && ratio; order++) {
        int fds[2];
        if (pipe(fds)) return 1;
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            close(fds[0]);
            _exit(one_order(argv + 1, order, cfg, B, prec, steps, rounds, fds[1]));
        }
        close(fds[1]);
        FILE *f = fdopen(fds[0], "r");
        double a, b;
        int n0 = n;
        while (f && n < 2 * rounds && fscanf(f, "%lf %lf", &a, &b) == 2) ratio[n++] = b / a;
        if (f) fclose(f);
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) || n - n0 != rounds) {
            fprintf(stderr, "bench_ab: the process that loads %s first failed\n", order ? "B" : "A");
            return 1;
        }
        half[order] = median(ratio + n0, rounds);
    }
    if (!ratio) return 1;
    double r = median(ratio, n);
    printf(
        "B/A %.3f (median of all %d rounds' ratios, %.3f-%.3f; A loaded first %.3f, B loaded first %.3f)\n",
        r, n, ratio[0], ratio[n - 1], half[0], half[1]);
    free(ratio);
    return 0;
}
