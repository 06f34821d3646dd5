/* bench_ddp.c — data-parallel training throughput of the tiny GPT (4 layers,
 * 4 heads, 128 wide, vocab 65, T=64, batch 12 per rank): 1 rank against N
 * ranks on this machine, each rank with the same number of threads, so the
 * ratio says what distribution costs (weak scaling: every rank does the work
 * one rank does alone; the ideal is N times the tokens per second).
 *
 * One step: forward, DDP backward (bucketed all-reduce overlapping it), global
 * clip, AdamW. The figure is the median step time over the slowest rank after
 * warm-up; scaling efficiency = tokens/s with N ranks / (N x tokens/s with 1).
 *
 * usage: bench_ddp [ranks] [steps] [threads per rank]   (default 2, 30, 1) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_dist.h"
#include "bench_util.h"

typedef struct job {
    int steps, threads;
    em_transport tr;
    double *ms; /* shared with the parent: rank 0 writes the median step */
} job;

static const em_gpt_config tiny = {
    .vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = true};
#define BATCH 12

static int train(em_pg *pg, void *ctx)
{
    job *j = ctx;
    em_set_num_threads(j->threads);
    em_gpt *g = em_gpt_new(&tiny, 1);
    em_ddp *d = g ? em_ddp_new(pg, g->m, NULL) : NULL;
    if (!d) goto fail;
    int n = em_module_params(g->m, NULL, 0);
    em_named *named = malloc(sizeof *named * (size_t)n);
    em_tensor **params = malloc(sizeof *params * (size_t)n);
    em_module_params(g->m, named, n);
    for (int i = 0; i < n; i++) params[i] = named[i].t;
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 1e-4;
    em_optimizer *opt = em_adamw_new(n, params, &ac);
    if (!opt) goto fail;
    em_rng rng = em_rng_new(7 + (uint64_t)em_pg_rank(pg));
    int warm = 3;
    double *t = calloc((size_t)j->steps, sizeof *t);
    for (int i = 0; i < warm + j->steps; i++) {
        em_scope s = em_scope_begin();
        em_tensor *x = em_randint(0, tiny.vocab_size, EM_I32, EM_SHAPE(BATCH, tiny.block_size), &rng);
        em_tensor *y = em_randint(0, tiny.vocab_size, EM_I32, EM_SHAPE(BATCH, tiny.block_size), &rng);
        if (em_barrier(pg, NULL)) goto fail;
        double t0 = now();
        em_tensor *l = em_gpt_loss(g, x, y);
        em_status st = l ? em_ddp_backward(d, l, NULL) : em_last_status();
        if (!st) em_clip_grad_norm(n, params, 1.0, &st);
        if (!st) st = em_optim_step(opt);
        if (!st) st = em_optim_zero_grad(opt);
        if (i >= warm) t[i - warm] = now() - t0;
        em_scope_end(s);
        if (st) goto fail;
    }
    int64_t ns = j->steps;
    em_tensor *times = em_from_data(EM_F64, 1, &ns, t);
    if (!times || em_all_reduce(pg, times, EM_RED_MAX, NULL)) goto fail;
    if (em_pg_rank(pg) == 0) j->ms[0] = 1e3 * median(em_data(times), j->steps);
    em_free(times);
    free(t);
    em_optim_free(opt);
    free(params);
    free(named);
    em_ddp_free(d);
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

int main(int argc, char **argv)
{
    int world = argc > 1 ? atoi(argv[1]) : 2;
    job j = {.steps = argc > 2 ? atoi(argv[2]) : 30, .threads = argc > 3 ? atoi(argv[3]) : 1};
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
