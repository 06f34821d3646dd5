/* bench_zero_clip.c — the fp16 loss scaler's unscale and the gradient clip
 * of ZeRO stages 2-3, fused (zero_unscale_clip: two passes over the
 * gradient shard and one all-reduce) against the two calls it replaces
 * (zero_unscale, then em_zero_clip_grad_norm_with: four passes and two
 * all-reduces), side by side in one group.
 *
 * usage: bench_zero_clip [tiny|124m] [ranks] [reps] [stage] [threads per rank]
 *        (default 124m, 2, 8 of each, stage 2, the CPUs / ranks or 1)
 *
 * Every rank makes the GPT (124m: GPT-2 124M; tiny: 4 layers, 128 wide),
 * an em_zero of the stage over plain SGD and a loss scaler at 65536; each
 * round runs a backward of one batch (1 x 16 tokens) scaled by the scaler,
 * then times one of the two ways (slowest rank, after a barrier), the ways
 * alternating round by round, max_norm 0.01 so that the clip scales. The
 * figures are each way's median over its rounds after one warm-up round
 * each, and their ratio. Both ways give the same bits
 * (tests/test_ddp.c, test_zero_fp16_clip_...). Uses internals
 * (dist/zero_impl.h), so it links the static library. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_dist.h"
#include "bench_util.h"
#include "dist/zero_impl.h"

typedef struct job {
    em_gpt_config model;
    int reps, stage, threads;
    double *ms; /* shared with the parent: [0] fused, [1] the two calls (median ms, slowest rank) */
} job;

static int measure(em_pg *pg, void *ctx)
{
    job *j = ctx;
    em_set_num_threads(j->threads);
    em_gpt *g = em_gpt_new(&j->model, 1);
    if (!g) goto fail;
    int np = em_module_params(g->m, NULL, 0);
    em_named *ps = calloc((size_t)np, sizeof *ps);
    em_tensor **pt = calloc((size_t)np, sizeof *pt);
    double *t[2] = {calloc((size_t)j->reps + 1, sizeof(double)), calloc((size_t)j->reps + 1, sizeof(double))};
    if (!ps || !pt || !t[0] || !t[1]) {
        fprintf(stderr, "bench_zero_clip: out of memory\n");
        return 1;
    }
    em_module_params(g->m, ps, np);
    for (int i = 0; i < np; i++) pt[i] = ps[i].t;
    em_sgd_config sc = em_sgd_defaults();
    sc.lr = 1e-3;
    em_optimizer *o = em_sgd_new(np, pt, &sc);
    em_zero *z = o ? em_zero_new(pg, g->m, o, &(em_zero_config){.stage = j->stage}) : NULL;
    em_grad_scaler *s = z ? em_grad_scaler_new(NULL) : NULL;
    if (!s) goto fail;
    int n[2] = {0, 0};
    for (int r = 0; r < 2 * (j->reps + 1); r++) {
        em_scope sco = em_scope_begin();
        int32_t tok[16];
        for (int i = 0; i < 16; i++) tok[i] = (i * 7 + r) % j->model.vocab_size;
        em_tensor *x = em_from_data(EM_I32, EM_SHAPE(1, 16), tok);
        em_status st = em_zero_backward(z, em_scaler_scale(s, em_gpt_loss(g, x, x)), true);
        em_scope_end(sco);
        if (st) goto fail;
        em_clip_config cfg = {.max_norm = 0.01};
        int way = r & 1; /* 0: fused, 1: the two calls */
        if (em_barrier(pg, NULL)) goto fail;
        double t0 = now();
        if (way == 0)
            (void)zero_unscale_clip(z, s, &cfg, &st);
        else if (!(st = zero_unscale(z, s)) && !em_scaler_found_inf(s))
            (void)em_zero_clip_grad_norm_with(z, &cfg, &st);
        double dt = now() - t0;
        if (st) goto fail;
        if (r >= 2) t[way][n[way]++] = dt;
        em_scaler_update(s);
        if (em_zero_zero_grad(z)) goto fail;
    }
    for (int w = 0; w < 2; w++) {
        int64_t nr = n[w];
        em_tensor *v = em_from_data(EM_F64, 1, &nr, t[w]);
        if (!v || em_all_reduce(pg, v, EM_RED_MAX, NULL)) goto fail; /* the slowest rank's */
        memcpy(t[w], em_data(v), sizeof(double) * (size_t)n[w]);
        em_free(v);
        if (em_pg_rank(pg) == 0) j->ms[w] = 1e3 * median(t[w], n[w]);
    }
    em_grad_scaler_free(s);
    em_zero_free(z);
    em_optim_free(o);
    em_gpt_free(g);
    free(ps);
    free(pt);
    free(t[0]);
    free(t[1]);
    return 0;
fail:
    fprintf(stderr, "bench_zero_clip: rank %d: %s\n", em_pg_rank(pg), em_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const em_gpt_config tiny = {
        .vocab_size = 65, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .bias = true};
    const em_gpt_config gpt2 = {
        .vocab_size = 50257, .block_size = 64, .n_layer = 12, .n_head = 12, .n_embd = 768, .bias = true};
    const char *which = argc > 1 ? argv[1] : "124m";
    int world = argc > 2 ? atoi(argv[2]) : 2, reps = argc > 3 ? atoi(argv[3]) : 8,
        stage = argc > 4 ? atoi(argv[4]) : 2;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = argc > 5 ? atoi(argv[5]) : world > 0 && cpus / world > 1 ? (int)(cpus / world) : 1;
    if ((strcmp(which, "tiny") && strcmp(which, "124m")) || world < 1 || world > 64 || reps < 1 ||
        reps > 10000 || stage < 2 || stage > 3 || threads < 1 || threads > 256) {
        fprintf(stderr, "usage: bench_zero_clip [tiny|124m] [ranks 1-64] [reps >= 1] [stage 2|3] "
                        "[threads per rank 1-256]\n");
        return 2;
    }
    double *ms = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ms == MAP_FAILED) return 1;
    job j = {.model = strcmp(which, "tiny") ? gpt2 : tiny,
             .reps = reps,
             .stage = stage,
             .threads = threads,
             .ms = ms};
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("bench_zero_clip: %s, ZeRO stage %d, %d ranks x %d thread(s), fp16 scaler + clip (max_norm "
           "0.01); %d rounds of each way, alternating; median, slowest rank\ncpu: %s\n",
           which, stage, world, threads, reps, model);
    if (bench_ranks(world, EM_TRANSPORT_AUTO, "bench/zero-clip", measure, &j)) return 1;
    printf("fused (zero_unscale_clip)             %8.2f ms\n"
           "unscale, then clip (the two calls)    %8.2f ms\n"
           "fused / two calls                     %8.3fx the time\n",
           ms[0], ms[1], ms[0] / ms[1]);
    return 0;
}
