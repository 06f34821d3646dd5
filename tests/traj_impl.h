/* traj_impl.h — the training run that tests/test_gpt_trajectory.c compares
 * with PyTorch: a small GPT trained exactly as `ember train` trains
 * (AdamW with decay on matrices only, warm-up + cosine, clipping at 1.0)
 * on windows of a fixed text. Shared by the test and tests/traj_dump.c. */
#ifndef EMBER_TESTS_TRAJ_IMPL_H
#define EMBER_TESTS_TRAJ_IMPL_H

#include <stdlib.h>
#include <string.h>

#include "ember/ember.h"

enum { TRAJ_STEPS = 40, TRAJ_B = 4, TRAJ_T = 32 };

static const char traj_text[] =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it "
    "was the season of Darkness, it was the spring of hope, it was the winter of despair.\n";

/* Runs the training; loss[s] gets step s's loss. If dump_dir is not NULL,
 * writes dump_dir/init.safetensors and dump_dir/batches.bin. */
static em_status traj_run(const char *dump_dir, double *loss)
{
    em_text *text = em_text_from_memory(traj_text, sizeof traj_text - 1, EM_TEXT_CHARS);
    if (!text) return em_last_status();
    em_gpt_config cfg = {.vocab_size = text->vocab.size,
                         .block_size = TRAJ_T,
                         .n_layer = 2,
                         .n_head = 2,
                         .n_embd = 32,
                         .bias = true};
    em_gpt *g = em_gpt_new(&cfg, 1337);
    em_status s = g ? em_module_flatten(g->m) : em_last_status();
    char path[512];
    FILE *bf = NULL;
    if (!s && dump_dir) {
        snprintf(path, sizeof path, "%s/init.safetensors", dump_dir);
        s = em_module_save(g->m, path);
        snprintf(path, sizeof path, "%s/batches.bin", dump_dir);
        bf = s ? NULL : fopen(path, "wb");
        if (!s && !bf) s = em_set_error(EM_ERR_IO, "cannot write %s", path);
    }
    int n = g ? em_module_params(g->m, NULL, 0) : 0, nd = 0;
    em_named *all = malloc(sizeof *all * (size_t)(n + 1));
    em_tensor **p = malloc(sizeof *p * (size_t)(n + 1));
    if (!s) {
        em_module_params(g->m, all, n);
        for (int i = 0; i < n; i++) /* matrices first (decayed), then vectors */
            if (em_ndim(all[i].t) >= 2) p[nd++] = all[i].t;
        for (int i = 0, k = nd; i < n; i++)
            if (em_ndim(all[i].t) < 2) p[k++] = all[i].t;
    }
    em_adam_config ac = em_adamw_defaults();
    ac.lr = 3e-3, ac.beta2 = 0.99, ac.weight_decay = 0.1;
    em_optimizer *o = s ? NULL : em_adamw_new(nd, p, &ac);
    if (!s && (!o || em_optim_add_group(o, n - nd, p + nd, 3e-3, 0.0) < 0)) s = em_last_status();
    em_lr_schedule sched = {
        .kind = EM_LR_COSINE, .base_lr = 3e-3, .min_lr = 3e-4, .warmup = 5, .total = TRAJ_STEPS};
    em_window_sampler ws;
    if (!s) s = em_window_sampler_init(&ws, &text->tokens, TRAJ_B, TRAJ_T, 7);
    for (int step = 0; step < TRAJ_STEPS && !s; step++) {
        s = em_optim_set_lr(o, -1, em_lr_at(&sched, step));
        em_scope sc = em_scope_begin();
        em_batch b;
        if (!s) s = em_window_sampler_next(&ws, &b);
        if (!s && bf) {
            fwrite(em_data(b.x), sizeof(int32_t), TRAJ_B * TRAJ_T, bf);
            fwrite(em_data(b.y), sizeof(int32_t), TRAJ_B * TRAJ_T, bf);
        }
        em_tensor *l = s ? NULL : em_gpt_loss(g, b.x, b.y);
        if (!s && !l) s = em_last_status();
        if (!s) {
            loss[step] = em_item(l);
            s = em_backward(l, NULL);
        }
        em_scope_end(sc);
        if (!s) em_clip_grad_norm(n, p, 1.0, &s);
        if (!s) s = em_optim_step(o);
        if (!s) s = em_optim_zero_grad(o);
    }
    if (bf) fclose(bf);
    em_optim_free(o);
    free(p);
    free(all);
    em_gpt_free(g);
    em_text_free(text);
    return s;
}

#endif
