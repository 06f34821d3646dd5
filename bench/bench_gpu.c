/* bench_gpu.c — GPT-2 124M training on one CUDA device: bf16 autocast, f32
 * master weights, AdamW, clip 1.0, T = 1024. Prints tokens/s, MFU and the
 * caching allocator's peak, one line per batch size, for bench/gpu.sh to
 * set beside PyTorch (bench/gpt_gpu_torch.py) run on the same device.
 *
 * MFU counts 6 N + 12 L C T FLOPs per token (the weights' forward and
 * backward, plus attention's QK^T and PV), N the parameters without the
 * position table, over the device's dense bf16 peak: EMBER_PEAK_TFLOPS, or
 * 989 (H100 SXM) when unset.
 *
 * usage: bench_gpu [batch ...]   (default 8 16 32; steps: EMBER_BENCH_STEPS, default 20) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "ember/ember.h"

static int run(int64_t batch, int steps, double peak_flops)
{
    const em_gpt_config cfg = {.vocab_size = 50304, .block_size = 1024, .n_layer = 12, .n_head = 12,
                               .n_embd = 768, .bias = true};
    const int64_t T = cfg.block_size;
    em_device dev = em_device_cuda(0);
    em_gpt *g = em_gpt_new(&cfg, 1);
    if (!g || em_module_to(g->m, dev) || em_module_flatten(g->m)) goto fail;
    int n = em_module_params(g->m, NULL, 0);
    em_named *named = malloc(sizeof *named * (size_t)n);
    em_tensor **params = malloc(sizeof *params * (size_t)n);
    em_module_params(g->m, named, n);
    for (int i = 0; i < n; i++) params[i] = named[i].t;
    em_optimizer *opt = em_adamw_new(n, params, &(em_adam_config){.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95,
                                                                    .eps = 1e-8, .weight_decay = 0.1});
    if (!opt) goto fail;
    em_rng rng = em_rng_new(7);
    double *t = malloc(sizeof *t * (size_t)(steps + 3));
    em_cuda_reset_peak(0);
    for (int i = 0; i < steps + 3; i++) {
        em_scope s = em_scope_begin();
        em_tensor *x = em_to(em_randint(0, cfg.vocab_size, EM_I32, EM_SHAPE(batch, T), &rng), dev);
        em_tensor *y = em_to(em_randint(0, cfg.vocab_size, EM_I32, EM_SHAPE(batch, T), &rng), dev);
        em_cuda_synchronize(0);
        double t0 = now();
        em_dtype prev = em_autocast_set(EM_BF16);
        em_tensor *l = em_gpt_loss(g, x, y);
        em_autocast_set(prev);
        em_status st = l ? em_backward(l, NULL) : em_last_status();
        if (!st) em_clip_grad_norm(n, params, 1.0, &st);
        if (!st) st = em_optim_step(opt);
        if (!st) st = em_optim_zero_grad(opt);
        if (!st) st = em_cuda_synchronize(0);
        t[i] = now() - t0;
        em_scope_end(s);
        if (st) goto fail;
    }
    double sec = median(t + 3, steps);
    int64_t np = em_module_num_params(g->m) - cfg.block_size * cfg.n_embd; /* without wpe */
    double flops_tok = 6.0 * (double)np + 12.0 * cfg.n_layer * cfg.n_embd * (double)T;
    double tok_s = (double)(batch * T) / sec;
    em_cuda_memory m;
    em_cuda_memory_stats(0, &m);
    printf("ember  B=%-3lld %8.1f ms/step %10.0f tokens/s  MFU %5.1f%%  peak %6.2f GiB\n", (long long)batch,
           sec * 1e3, tok_s, 100.0 * tok_s * flops_tok / peak_flops, (double)m.peak_allocated / (1 << 30));
    fflush(stdout);
    free(t);
    em_optim_free(opt);
    free(params);
    free(named);
    em_gpt_free(g);
    return 0;
fail:
    fprintf(stderr, "bench_gpu: B=%lld failed: %s\n", (long long)batch, em_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (em_cuda_device_count() == 0) {
        fprintf(stderr, "bench_gpu: no CUDA device visible (this ember was built %s CUDA)\n",
                em_build().cuda ? "with" : "without");
        return 1;
    }
    const char *pk = getenv("EMBER_PEAK_TFLOPS"), *st = getenv("EMBER_BENCH_STEPS");
    double peak = (pk ? atof(pk) : 989.0) * 1e12;
    int steps = st ? atoi(st) : 20;
    int64_t def[] = {8, 16, 32};
    int nb = argc > 1 ? argc - 1 : 3, rc = 0;
    for (int i = 0; i < nb; i++) rc |= run(argc > 1 ? atoll(argv[i + 1]) : def[i], steps, peak);
    return rc;
}
