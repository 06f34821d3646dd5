/* accel_rig.h — a small training rig for the checkpoint tests: a 1-layer
 * GPT, AdamW over all of it, a window sampler over a fixed token stream, an
 * Accelerator (optionally under ZeRO), and one-step / free helpers.
 * Header-only: each test file that includes it gets its own copy. */
#ifndef EMBER_TESTS_ACCEL_RIG_H
#define EMBER_TESTS_ACCEL_RIG_H

#include <stdlib.h>

#include "dist_util.h"
#include "harness.h"

enum { RIG_VOCAB = 12, RIG_T = 8, RIG_NTOK = 2000 };

typedef struct rig {
    em_accelerator *a;
    em_gpt *g;
    em_optimizer *opt;
    em_window_sampler sampler;
    int32_t tok[RIG_NTOK];
    em_tokens tokens;
} rig;

/* A GPT of width embd under ZeRO `stage` (0: none) with DDP buckets of
 * bucket_mb (0: the default), batch 4 x RIG_T. */
static inline rig *rig_new_at(int stage, double bucket_mb, int64_t embd)
{
    th_no_user_config();
    rig *r = calloc(1, sizeof *r);
    CHECK(r != NULL);
    r->a = em_accelerator_new(&(em_accel_config){.zero_stage = stage, .bucket_mb = bucket_mb});
    CHECK_NOTNULL(r->a);
    for (int i = 0; i < RIG_NTOK; i++) r->tok[i] = (int32_t)((i * 7 + i / 5) % RIG_VOCAB);
    r->tokens = em_tokens_view(r->tok, RIG_NTOK, EM_TOK_I32);
    CHECK_OK(em_window_sampler_init(&r->sampler, &r->tokens, 4, RIG_T, 5));
    em_gpt_config c = {
        .vocab_size = RIG_VOCAB, .block_size = RIG_T, .n_layer = 1, .n_head = 2, .n_embd = embd, .bias = true};
    r->g = em_gpt_new(&c, 99);
    CHECK_NOTNULL(r->g);
    r->opt = th_adamw_of(r->g->m, 1e-2);
    CHECK_NOTNULL(r->opt);
    CHECK_OK(em_accel_prepare(r->a, r->g->m, r->opt, NULL, NULL));
    CHECK_OK(em_accel_prepare_sampler(r->a, &r->sampler));
    return r;
}

/* One optimizer step of one micro-batch. */
static inline void rig_step(rig *r)
{
    em_scope s = em_scope_begin();
    em_accel_accumulate(r->a);
    em_batch b;
    CHECK_OK(em_window_sampler_next(&r->sampler, &b));
    em_tensor *loss = em_gpt_loss(r->g, b.x, b.y);
    CHECK_NOTNULL(loss);
    CHECK_OK(em_accel_backward(r->a, loss));
    CHECK_OK(em_accel_step(r->a));
    CHECK_OK(em_accel_zero_grad(r->a));
    em_scope_end(s);
}

static inline void rig_free(rig *r)
{
    em_accelerator_free(r->a);
    em_optim_free(r->opt);
    em_gpt_free(r->g);
    free(r);
}

#endif
