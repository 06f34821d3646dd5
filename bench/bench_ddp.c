/* bench_ddp.c — data-parallel training on this machine, two tables:
 *
 * bench_ddp [ranks] [steps] [threads per rank]   (default 2, 30, 1)
 *   throughput of the tiny GPT (4 layers, 4 heads, 128 wide, vocab 65, T=64,
 *   batch 12 per rank): 1 rank against N ranks, each rank with the same
 *   number of threads, so the ratio says what distribution costs (weak
 *   scaling: every rank does the work one rank does alone; the ideal is N
 *   times the tokens per second). One step: forward, DDP backward (bucketed
 *   all-reduce overlapping it), global clip, AdamW. The figure is the median
 *   step time over the slowest rank after warm-up; scaling efficiency =
 *   tokens/s with N ranks / (N x tokens/s with 1).
 *
 * bench_ddp zero [tiny|124m] [ranks] [steps] [threads per rank]
 *                (default tiny, 2, 30 (124m: 6), 1)
 *   ZeRO stages 0 (DDP), 1, 2 and 3 (em_zero) side by side: for each, a fresh
 *   group of N ranks runs the same steps (tiny: batch 12 x T 64 per rank;
 *   124m: GPT-2 124M, batch 4 x T 64), and the table gives the median step
 *   (slowest rank), its ratio to DDP's, the largest peak resident memory of
 *   a rank during the steps (VmHWM, reset after set-up through
 *   /proc/self/clear_refs; a fresh process per stage keeps stages apart),
 *   the optimizer state one rank holds, and the set-up's own peak (making
 *   and flattening the model briefly holds its parameters twice). Stages run in turn, twice (0 1 2 3 0 1 2 3),
 *   and the faster of each stage's two medians is reported, so a slow
 *   moment of a shared machine does not land on one stage only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_dist.h"
#include "bench_util.h"

typedef struct job {
    int steps, threads;
    em_transport tr;
    int stage;           /* ZeRO stage; 0 = DDP */
    em_gpt_config model;
    int batch;           /* per rank */
    double *ms; /* shared with the parent: rank 0 writes the median step, [1] the training steps'
                 * peak RSS (MiB, max over ranks), [2] one rank's optimizer state (MiB, max over
                 * ranks), [3] the parameter count, [4] the set-up's peak RSS (MiB, max) */
} job;

static const em_gpt_config tiny = {
    .vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = true};
static const em_gpt_config gpt2 = {
    .vocab_size = 50257, .block_size = 64, .n_layer = 12, .n_head = 12, .n_embd = 768, .bias = true};
#define BATCH 12

/* This process's peak resident memory (VmHWM), MiB; -1 if unknown. */
static double peak_rss_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb < 0 ? -1 : kb / 1024;
}

/* Resets this process's VmHWM to its current resident set (Linux 4.0+;
 * false where that is not possible), so a later peak is the training's, not
 * the set-up's (making and flattening the model holds its parameters twice). */
static bool reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* Bytes of optimizer state this rank holds. */
static double state_mib(em_optimizer *opt)
{
    int n = em_optim_state(opt, NULL, 0);
    em_named *st = calloc((size_t)n + 1, sizeof *st);
    if (!st) return -1;
    em_optim_state(opt, st, n);
    double b = 0;
    for (int i = 0; i < n; i++) b += (double)em_numel(st[i].t) * em_dtype_size(em_dtype_of(st[i].t));
    free(st);
    return b / (1 << 20);
}

static int train(em_pg *pg, void *ctx)
{
    job *j = ctx;
    em_set_num_threads(j->threads);
    const em_gpt_config *mc = &j->model;
    em_gpt *g = em_gpt_new(mc, 1);
    if (!g) goto fail;
    int n = em_module_params(g->m, NULL, 0);
    em_named *named = malloc(sizeof *named * (size_t)n);
    em_tensor **params = malloc(sizeof *params * (size_t)n);
    em_module_params(g->m, named, n);
    for (int i = 0; i < n; i++) params[i] = named[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-4;
    em_optimizer *opt = em_adamw_new(n, params, &ac);
    if (!opt) goto fail;
    em_ddp *d = NULL;
    em_zero *z = NULL;
    if (j->stage == 0)
        d = em_ddp_new(pg, g->m, NULL);
    else
        z = em_zero_new(pg, g->m, opt, &(em_zero_config){.stage = j->stage});
    if (!d && !z) goto fail;
    em_rng rng = em_rng_new(7 + (uint64_t)em_pg_rank(pg));
    double setup_peak = peak_rss_mib();
    bool reset = reset_peak();
    int warm = 3;
    double *t = calloc((size_t)j->steps, sizeof *t);
    for (int i = 0; i < warm + j->steps; i++) {
        em_scope s = em_scope_begin();
        em_tensor *x = em_randint(0, mc->vocab_size, EM_I32, EM_SHAPE(j->batch, mc->block_size), &rng);
        em_tensor *y = em_randint(0, mc->vocab_size, EM_I32, EM_SHAPE(j->batch, mc->block_size), &rng);
        if (em_barrier(pg, NULL)) goto fail;
        double t0 = now();
        em_tensor *l = em_gpt_loss(g, x, y);
        em_status st = EM_OK;
        if (d) {
            st = l ? em_ddp_backward(d, l, NULL) : em_last_status();
            if (!st) em_clip_grad_norm(n, params, 1.0, &st);
            if (!st) st = em_optim_step(opt);
            if (!st) st = em_optim_zero_grad(opt);
        } else {
            st = l ? em_zero_backward(z, l, true) : em_last_status();
            if (!st) em_zero_clip_grad_norm(z, 1.0, &st);
            if (!st) st = em_zero_step(z);
            if (!st) st = em_zero_zero_grad(z);
        }
        if (i >= warm) t[i - warm] = now() - t0;
        em_scope_end(s);
        if (st) goto fail;
    }
    int64_t ns = j->steps;
    em_tensor *times = em_from_data(EM_F64, 1, &ns, t);
    double mem[3] = {reset ? peak_rss_mib() : -1, state_mib(opt), setup_peak};
    em_tensor *mt = em_from_data(EM_F64, 1, (int64_t[]){3}, mem);
    if (!times || !mt || em_all_reduce(pg, times, EM_RED_MAX, NULL) || em_all_reduce(pg, mt, EM_RED_MAX, NULL))
        goto fail;
    if (em_pg_rank(pg) == 0) {
        j->ms[0] = 1e3 * median(em_data(times), j->steps);
        j->ms[1] = ((double *)em_data(mt))[0];
        j->ms[2] = ((double *)em_data(mt))[1];
        j->ms[3] = (double)em_module_num_params(g->m);
        j->ms[4] = ((double *)em_data(mt))[2];
    }
    em_free(times);
    em_free(mt);
    free(t);
    em_zero_free(z);
    em_ddp_free(d);
    em_optim_free(opt);
    free(params);
    free(named);
    em_gpt_free(g);
    return 0;
fail:
    fprintf(stderr, "bench_ddp: rank %d: %s\n", em_pg_rank(pg), em_last_error());
    return 1;
}

/* A group of one needs no store: run it in a child too, so both sides start alike. */
static int one_rank(job *j)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        em_pg *pg = em_pg_new(&(em_pg_config){.rank = 0, .world = 1});
        int rc = pg ? train(pg, j) : 1;
        em_pg_free(pg);
        _exit(rc);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return !WIFEXITED(st) || WEXITSTATUS(st);
}

/* The CPU's model name and core count, the first line of a table. */
static void print_machine(void)
{
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("machine: %s, %ld logical cores; transport %s\n", model, sysconf(_SC_NPROCESSORS_ONLN),
           getenv("EMBER_TRANSPORT") ? getenv("EMBER_TRANSPORT") : "auto (shm on one machine)");
}

/* The ZeRO table: stages 0-3 in turn, twice. */
static int zero_table(int argc, char **argv)
{
    bool big = argc > 2 && !strcmp(argv[2], "124m");
    if (argc > 2 && !big && strcmp(argv[2], "tiny")) {
        fprintf(stderr, "usage: bench_ddp zero [tiny|124m] [ranks] [steps] [threads per rank]\n");
        return 2;
    }
    int world = argc > 3 ? atoi(argv[3]) : 2;
    job j = {.steps = argc > 4 ? atoi(argv[4]) : big ? 6 : 30,
             .threads = argc > 5 ? atoi(argv[5]) : 1,
             .model = big ? gpt2 : tiny,
             .batch = big ? 4 : BATCH};
    if (world < 2 || world > 64 || j.steps < 1 || j.threads < 1) {
        fprintf(stderr, "usage: bench_ddp zero [tiny|124m] [ranks 2..64] [steps] [threads per rank]\n");
        return 2;
    }
    j.ms = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (j.ms == MAP_FAILED) return 1;
    double ms[4], rss[4], st[4], setup[4];
    for (int k = 0; k < 4; k++) ms[k] = 1e300;
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 4; k++) {
            j.stage = k;
            if (bench_ranks(world, EM_TRANSPORT_AUTO, "bench/zero", train, &j)) return 1;
            if (j.ms[0] < ms[k]) ms[k] = j.ms[0];
            rss[k] = j.ms[1];
            st[k] = j.ms[2];
            setup[k] = j.ms[4];
        }
    print_machine();
    printf("bench_ddp zero: %s (%.2fM parameters), %d ranks x %d thread(s), batch %d x T %d per rank; best "
           "of 2 medians of %d steps (slowest rank)\n",
           big ? "GPT-2 124M" : "tiny", j.ms[3] / 1e6, world, j.threads, j.batch, (int)j.model.block_size,
           j.steps);
    printf("%-6s %10s %9s %16s %16s %16s\n", "stage", "ms/step", "vs DDP", "step peak MiB", "opt state MiB",
           "set-up peak MiB");
    for (int k = 0; k < 4; k++)
        printf("%-6d %10.1f %8.3fx %16.0f %16.1f %16.0f\n", k, ms[k], ms[k] / ms[0], rss[k], st[k], setup[k]);
    if (rss[0] < 0) printf("(no step peak: /proc/self/clear_refs cannot reset VmHWM here)\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "zero")) return zero_table(argc, argv);
    int world = argc > 1 ? atoi(argv[1]) : 2;
    job j = {.steps = argc > 2 ? atoi(argv[2]) : 30, .threads = argc > 3 ? atoi(argv[3]) : 1, .model = tiny,
             .batch = BATCH};
    if (world < 2 || world > 64 || j.steps < 1 || j.threads < 1) {
        fprintf(stderr, "usage: bench_ddp [ranks 2..64] [steps] [threads per rank]\n");
        return 2;
    }
    j.ms = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (j.ms == MAP_FAILED) return 1;
    if (one_rank(&j)) return 1;
    double one = j.ms[0];
    if (bench_ranks(world, EM_TRANSPORT_AUTO, "bench/ddp", train, &j)) return 1;
    double many = j.ms[0];
    double tok = BATCH * tiny.block_size;
    double tps1 = tok / (one / 1e3), tpsn = world * tok / (many / 1e3);
    printf("bench_ddp: tiny GPT, batch %d x T %d per rank, %d thread(s) per rank; median of %d steps, slowest "
           "rank\n",
           BATCH, (int)tiny.block_size, j.threads, j.steps);
    printf("%8s %10s %12s\n", "ranks", "ms/step", "tokens/s");
    printf("%8d %10.1f %12.0f\n", 1, one, tps1);
    printf("%8d %10.1f %12.0f\n", world, many, tpsn);
    printf("scaling efficiency (tokens/s with %d ranks / (%d x 1 rank)): %.0f%%\n", world, world,
           100.0 * tpsn / (world * tps1));
    return 0;
}
