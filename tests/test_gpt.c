/* test_gpt.c — the GPT of nn/gpt.c: parameter names and count, GPT-2 init,
 * the tied output projection, logits/loss/every gradient against PyTorch
 * (fixtures from tests/fixtures/gen_gpt.py), the key/value cache against the
 * full forward, sampling (determinism, range, cropping past block_size),
 * flattening, freeing, and a steady-state training step. */
#include <stdlib.h>
#include <time.h>

#include "harness.h"

#include "fixtures/gpt_ref.h"

static em_gpt_config ref_config(void)
{
    /* the fixture model uses GPT-2's tanh GELU */
    return (em_gpt_config){GPT_REF_V, GPT_REF_BLOCK, GPT_REF_LAYERS, GPT_REF_HEADS, GPT_REF_C, 0.0, true, true};
}

/* The reference model: the fixture's weights copied into an em_gpt. */
static em_gpt *ref_model(void)
{
    em_gpt_config cfg = ref_config();
    em_gpt *g = em_gpt_new(&cfg, 1);
    CHECK_NOTNULL(g);
    const float *w = gpt_ref_weights;
    for (int i = 0; i < GPT_REF_NPARAMS; i++) {
        em_tensor *p = em_module_find(g->m, gpt_ref_names[i]);
        CHECK_NOTNULL(p);
        CHECK(em_numel(p) == gpt_ref_numel[i]);
        em_tensor *src = em_from_data(EM_F32, em_ndim(p), em_shape(p), w);
        CHECK_OK(em_copy_into(p, src));
        em_free(src);
        w += gpt_ref_numel[i];
    }
    return g;
}

static em_tensor *ref_batch(const int32_t *v)
{
    return em_from_data(EM_I32, EM_SHAPE(GPT_REF_B, GPT_REF_T), v);
}

/* max |got - want| / max |want| */
static double rel_err(em_tensor *got, const double *want)
{
    int64_t n = em_numel(got);
    double *g = malloc(sizeof *g * (size_t)n), d = 0, s = 1e-30;
    em_to_array(got, EM_F64, g);
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs(g[i] - want[i]));
        s = fmax(s, fabs(want[i]));
    }
    free(g);
    return d / s;
}

/* ---- structure ------------------------------------------------------------------ */

TEST(test_gpt_param_names_follow_nanogpt_and_count_matches_formula)
{
    em_gpt_config cfg = ref_config();
    em_gpt *g = em_gpt_new(&cfg, 1);
    CHECK_NOTNULL(g);
    em_named v[64];
    CHECK(em_module_params(g->m, v, 64) == GPT_REF_NPARAMS);
    for (int i = 0; i < GPT_REF_NPARAMS; i++) {
        if (strcmp(v[i].name, gpt_ref_names[i])) th_fail(__FILE__, __LINE__, "param %d is %s", i, v[i].name);
        CHECK(em_numel(v[i].t) == gpt_ref_numel[i]);
    }
    int64_t V = 11, B = 8, L = 2, C = 16;
    CHECK(em_module_num_params(g->m) == V * C + B * C + L * (12 * C * C + 13 * C) + 2 * C);
    CHECK(em_size(em_module_find(g->m, "h.1.attn.c_attn.weight"), 0) == 3 * C);
    CHECK(em_size(em_module_find(g->m, "h.1.mlp.c_proj.weight"), 1) == 4 * C);
    em_gpt_free(g);
    cfg.bias = false;
    g = em_gpt_new(&cfg, 1);
    CHECK(em_module_params(g->m, v, 64) == 2 + L * 6 + 1);
    CHECK(em_module_find(g->m, "h.0.attn.c_attn.bias") == NULL && em_module_find(g->m, "ln_f.bias") == NULL);
    CHECK(em_module_num_params(g->m) == V * C + B * C + L * (12 * C * C + 2 * C) + C);
    em_gpt_free(g);
    CHECK(em_live_tensors() == 0);
}

TEST(test_gpt_new_rejects_bad_config_naming_the_field)
{
    em_gpt_config c = ref_config();
    c.n_head = 3;
    CHECK_ERR(em_gpt_new(&c, 0), EM_ERR_ARG, "n_embd = 16 is not a multiple of n_head = 3");
    const char *fields[] = {"vocab_size", "block_size", "n_layer", "n_head", "n_embd"};
    for (int i = 0; i < 5; i++) {
        c = ref_config();
        int64_t *f[] = {&c.vocab_size, &c.block_size, &c.n_layer, &c.n_head, &c.n_embd};
        *f[i] = 0;
        char want[64];
        snprintf(want, sizeof want, "em_gpt_new: %s = 0 must be > 0", fields[i]);
        CHECK_ERR(em_gpt_new(&c, 0), EM_ERR_ARG, want);
    }
    c = ref_config();
    c.dropout = 1;
    CHECK_ERR(em_gpt_new(&c, 0), EM_ERR_ARG, "dropout = 1 is not in [0, 1)");
    CHECK_ERR(em_gpt_new(NULL, 0), EM_ERR_ARG, "config is NULL");
    CHECK(em_live_tensors() == 0);
}

static double sd_of(em_tensor *t, double *mean)
{
    int64_t n = em_numel(t);
    double *v = malloc(sizeof *v * (size_t)n), s = 0, s2 = 0;
    em_to_array(t, EM_F64, v);
    for (int64_t i = 0; i < n; i++) s += v[i];
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - s / n) * (v[i] - s / n);
    free(v);
    *mean = s / n;
    return sqrt(s2 / n);
}

TEST(test_gpt_init_is_gpt2_normal_002_with_scaled_residual_projections)
{
    em_gpt_config cfg = {2000, 64, 8, 4, 64, 0.0, true, false};
    em_gpt *g = em_gpt_new(&cfg, 42);
    double mean;
    CHECK_NEAR(sd_of(g->wte->weight, &mean), 0.02, 0.0005);
    CHECK_NEAR(mean, 0, 0.0005);
    CHECK_NEAR(sd_of(em_module_find(g->m, "h.3.mlp.c_fc.weight"), &mean), 0.02, 0.001);
    double small = 0.02 / sqrt(16.0);
    CHECK_NEAR(sd_of(em_module_find(g->m, "h.3.mlp.c_proj.weight"), &mean), small, 0.0003);
    CHECK_NEAR(sd_of(em_module_find(g->m, "h.0.attn.c_proj.weight"), &mean), small, 0.0005);
    CHECK(sd_of(em_module_find(g->m, "h.2.attn.c_attn.bias"), &mean) == 0 && mean == 0);
    CHECK(sd_of(em_module_find(g->m, "h.2.ln_2.weight"), &mean) == 0 && mean == 1);
    CHECK(sd_of(em_module_find(g->m, "ln_f.bias"), &mean) == 0 && mean == 0);
    /* the same seed gives the same model */
    em_gpt *g2 = em_gpt_new(&cfg, 42);
    CHECK(th_max_abs_diff(em_module_find(g->m, "h.7.mlp.c_proj.weight"),
                          em_module_find(g2->m, "h.7.mlp.c_proj.weight")) == 0);
    em_gpt_free(g2);
    em_gpt_free(g);
}

/* ---- against PyTorch --------------------------------------------------------------- */

TEST(test_gpt_logits_loss_and_every_gradient_match_torch)
{
    em_gpt *g = ref_model();
    em_scope s = em_scope_begin();
    em_tensor *idx = ref_batch(gpt_ref_idx), *tgt = ref_batch(gpt_ref_targets);
    em_tensor *logits = em_gpt_forward(g, idx);
    CHECK(em_ndim(logits) == 3 && em_size(logits, 0) == 2 && em_size(logits, 1) == 8 &&
          em_size(logits, 2) == 11);
    CHECK(rel_err(logits, gpt_ref_logits) < 1e-5);
    em_tensor *loss = em_gpt_loss(g, idx, tgt);
    CHECK_NEAR(em_item(loss), gpt_ref_loss, 1e-5 * gpt_ref_loss);
    CHECK_OK(em_backward(loss, NULL));
    em_scope_end(s);
    const double *want = gpt_ref_grads;
    for (int i = 0; i < GPT_REF_NPARAMS; i++) {
        double e = rel_err(em_grad(em_module_find(g->m, gpt_ref_names[i])), want);
        if (!(e < 1e-5))
            th_fail(__FILE__, __LINE__, "gradient of %s: relative error %g", gpt_ref_names[i], e);
        want += gpt_ref_numel[i];
    }
    em_gpt_free(g);
    CHECK(em_live_tensors() == 0);
}

TEST(test_gpt_output_projection_is_tied_to_wte)
{
    em_gpt *g = ref_model();
    CHECK(em_module_find(g->m, "lm_head.weight") == NULL);
    em_scope s = em_scope_begin();
    int32_t ids[] = {0, 1, 2, 1}; /* tokens 3..10 never looked up */
    em_tensor *idx = em_from_data(EM_I32, EM_SHAPE(1, 4), ids);
    em_tensor *logits = em_gpt_forward(g, idx);
    /* logits = ln_f(x) @ wte^T: token 7's logit moves with row 7 of wte */
    double before = em_get(logits, (int64_t[]){0, 3, 7});
    CHECK_OK(em_backward(em_gpt_loss(g, idx, idx), NULL));
    em_tensor *gw = em_grad(g->wte->weight);
    CHECK(fabs(em_get(gw, (int64_t[]){7, 0})) > 0); /* only the output projection reaches row 7 */
    em_scope_end(s);
    s = em_scope_begin();
    CHECK_OK(em_copy_into(em_narrow(g->wte->weight, 0, 7, 1), em_zeros(EM_F32, EM_SHAPE(1, 16))));
    CHECK(before != 0 &&
          em_get(em_gpt_forward(g, em_from_data(EM_I32, EM_SHAPE(1, 4), ids)), (int64_t[]){0, 3, 7}) == 0);
    em_scope_end(s);
    em_gpt_free(g);
}

TEST(test_gpt_forward_rejects_bad_idx)
{
    em_gpt *g = ref_model();
    em_scope s = em_scope_begin();
    CHECK_ERR(em_gpt_forward(g, em_zeros(EM_I32, EM_SHAPE(1, 9))), EM_ERR_SHAPE,
              "em_gpt_forward: idx is (1,9), expected (B,T) with 1 <= T <= block_size = 8");
    CHECK_ERR(em_gpt_forward(g, em_zeros(EM_I32, EM_SHAPE(8))), EM_ERR_SHAPE, "idx is (8,)");
    CHECK_ERR(em_gpt_forward(g, em_zeros(EM_F32, EM_SHAPE(1, 8))), EM_ERR_DTYPE,
              "idx must be i32, got f32(1,8)");
    CHECK_ERR(em_gpt_forward(g, em_full(EM_I32, EM_SHAPE(1, 2), 11)), EM_ERR_INDEX, "11");
    CHECK_ERR(em_gpt_loss(g, em_zeros(EM_I32, EM_SHAPE(2, 8)), em_zeros(EM_I32, EM_SHAPE(2, 7))),
              EM_ERR_SHAPE, "em_gpt_loss: targets are i32(2,7), expected i32 of idx's shape (2,8)");
    em_scope_end(s);
    em_gpt_free(g);
}

TEST(test_gpt_dropout_acts_in_training_only)
{
    em_gpt_config cfg = ref_config();
    cfg.dropout = 0.2;
    em_gpt *g = em_gpt_new(&cfg, 3);
    em_scope s = em_scope_begin();
    em_tensor *idx = ref_batch(gpt_ref_idx);
    CHECK(th_max_abs_diff(em_gpt_forward(g, idx), em_gpt_forward(g, idx)) > 1e-4);
    em_module_train(g->m, false);
    CHECK(th_max_abs_diff(em_gpt_forward(g, idx), em_gpt_forward(g, idx)) == 0);
    em_scope_end(s);
    em_gpt_free(g);
}

/* ---- the key/value cache and sampling ------------------------------------------------- */

TEST(test_gpt_cached_forward_matches_full_forward_position_by_position)
{
    em_gpt *g = ref_model();
    em_gpt_cache *c = em_gpt_cache_new(g, 2);
    em_scope s = em_scope_begin();
    em_tensor *idx = ref_batch(gpt_ref_idx);
    em_tensor *full = em_gpt_forward(g, idx);
    int64_t chunks[] = {3, 1, 2, 1, 1}, pos = 0;
    for (int k = 0; k < 5; k++) {
        em_tensor *lg = em_gpt_forward_cached(g, c, em_narrow(idx, 1, pos, chunks[k]));
        CHECK(em_size(lg, 1) == chunks[k] && !em_requires_grad(lg));
        CHECK(th_max_abs_diff(lg, em_narrow(full, 1, pos, chunks[k])) < 2e-5);
        pos += chunks[k];
        CHECK(em_gpt_cache_len(c) == pos);
    }
    CHECK(em_is_grad_enabled());
    CHECK_ERR(em_gpt_forward_cached(g, c, em_narrow(idx, 1, 0, 1)), EM_ERR_SHAPE,
              "8 cached + 1 new positions exceed block_size = 8");
    CHECK(em_gpt_cache_len(c) == 8);
    CHECK_ERR(em_gpt_forward_cached(g, c, em_zeros(EM_I32, EM_SHAPE(1, 1))), EM_ERR_SHAPE,
              "idx is (1,1), expected (2,t)");
    em_gpt_cache_reset(c);
    CHECK(th_max_abs_diff(em_gpt_forward_cached(g, c, idx), full) < 2e-5); /* all at once */
    em_scope_end(s);
    em_gpt_cache_free(c);
    em_gpt_free(g);
    CHECK(em_live_tensors() == 0);
}

TEST(test_gpt_sample_is_deterministic_for_a_seed_and_in_range)
{
    em_gpt *g = ref_model();
    em_module_train(g->m, false);
    int32_t prompt[] = {1, 2, 3}, a[3 + 5], b[3 + 5], d[3 + 5];
    em_rng r1 = em_rng_new(99), r2 = em_rng_new(99), r3 = em_rng_new(100);
    CHECK(em_gpt_sample(g, prompt, 3, 5, 1.0, 0, &r1, a) == 8);
    CHECK(em_gpt_sample(g, prompt, 3, 5, 1.0, 0, &r2, b) == 8);
    CHECK(!memcmp(a, b, sizeof a) && !memcmp(a, prompt, sizeof prompt));
    for (int i = 0; i < 8; i++) CHECK(a[i] >= 0 && a[i] < GPT_REF_V);
    bool differs = false;
    for (int k = 0; k < 4 && !differs; k++) {
        CHECK(em_gpt_sample(g, prompt, 3, 5, 1.0, 0, &r3, d) == 8);
        differs = memcmp(a, d, sizeof a) != 0;
    }
    CHECK(differs);
    /* top_k 1 is greedy: the argmax of the full forward's last logits */
    CHECK(em_gpt_sample(g, prompt, 3, 1, 0.7, 1, &r1, d) == 4);
    em_scope s = em_scope_begin();
    em_tensor *lg = em_gpt_forward(g, em_from_data(EM_I32, EM_SHAPE(1, 3), prompt));
    CHECK(d[3] == (int32_t)em_item(em_argmax(em_narrow(lg, 1, 2, 1), -1, false)));
    em_scope_end(s);
    CHECK_ERR(em_gpt_sample(g, prompt, 3, 1, 0.0, 0, NULL, d), EM_ERR_ARG, "temperature = 0 must be > 0");
    CHECK_ERR(em_gpt_sample(g, (int32_t[]){11}, 1, 1, 1.0, 0, NULL, d), EM_ERR_INDEX, "prompt[0] = 11");
    CHECK(em_gpt_sample(g, prompt, 3, 1, 1.0, 0, NULL, d) == 4); /* default generator */
    em_gpt_free(g);
    CHECK(em_live_tensors() == 0);
}

typedef struct token_log {
    int calls, last_done, n_new;
    const int32_t *out;
    int32_t seen[16];
} token_log;

static void log_token(void *ctx, int done, int n_new)
{
    token_log *l = ctx;
    CHECK(done == l->last_done + 1 && n_new == l->n_new);
    l->seen[done - 1] = l->out[3 + done - 1]; /* the token just made is in out already */
    l->last_done = done;
    l->calls++;
}

/* once per token, after it is written; the tokens are em_gpt_sample's */
TEST(test_gpt_sample_progress_calls_its_hook_once_per_new_token)
{
    em_gpt *g = ref_model();
    em_module_train(g->m, false);
    int32_t prompt[3] = {1, 2, 3}, a[3 + 12], b[3 + 12];
    em_rng r1 = em_rng_new(9), r2 = em_rng_new(9);
    token_log l = {.n_new = 12, .out = b};
    CHECK(em_gpt_sample(g, prompt, 3, 12, 1.0, 0, &r1, a) == 15);
    CHECK(em_gpt_sample_progress(g, prompt, 3, 12, 1.0, 0, &r2, b, log_token, &l) == 15);
    CHECK(l.calls == 12 && !memcmp(a, b, sizeof a) && !memcmp(l.seen, b + 3, 12 * sizeof(int32_t)));
    em_gpt_free(g);
}

TEST(test_gpt_sample_crops_the_context_to_block_size)
{
    em_gpt *g = ref_model();
    em_module_train(g->m, false);
    enum { NP = 5, NN = 9 }; /* 14 tokens > block_size 8 */
    int32_t prompt[NP] = {4, 10, 7, 4, 4}, out[NP + NN], want[NP + NN];
    CHECK(em_gpt_sample(g, prompt, NP, NN, 1.0, 1, NULL, out) == NP + NN);
    /* greedy reference: the full forward on the last <= 8 tokens */
    memcpy(want, prompt, sizeof prompt);
    for (int n = NP; n < NP + NN; n++) {
        int start = n > GPT_REF_BLOCK ? n - GPT_REF_BLOCK : 0;
        em_scope s = em_scope_begin();
        em_tensor *lg = em_gpt_forward(g, em_from_data(EM_I32, EM_SHAPE(1, n - start), want + start));
        want[n] = (int32_t)em_item(em_argmax(em_narrow(lg, 1, n - start - 1, 1), -1, false));
        em_scope_end(s);
    }
    CHECK(!memcmp(out, want, sizeof out));
    /* a prompt longer than block_size is cropped too */
    int32_t long_prompt[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, o2[13];
    CHECK(em_gpt_sample(g, long_prompt, 12, 1, 1.0, 1, NULL, o2) == 13);
    em_scope s = em_scope_begin();
    em_tensor *lg = em_gpt_forward(g, em_from_data(EM_I32, EM_SHAPE(1, 8), long_prompt + 4));
    CHECK(o2[12] == (int32_t)em_item(em_argmax(em_narrow(lg, 1, 7, 1), -1, false)));
    em_scope_end(s);
    em_gpt_free(g);
}

/* ---- lifetime, flattening, steady state ---------------------------------------------- */

TEST(test_gpt_free_returns_live_tensors_to_start)
{
    int64_t live = em_live_tensors();
    em_gpt_config cfg = ref_config();
    em_gpt *g = em_gpt_new(&cfg, 5);
    em_gpt_cache *c = em_gpt_cache_new(g, 1);
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(em_gpt_loss(g, ref_batch(gpt_ref_idx), ref_batch(gpt_ref_targets)), NULL));
    em_scope_end(s);
    CHECK_ERR(em_gpt_cache_new(g, 0), EM_ERR_ARG, "batch = 0 must be >= 1");
    /* with no scope open the cached forward's logits are persistent and all else is gone */
    em_tensor *idx = em_from_data(EM_I32, EM_SHAPE(1, 3), gpt_ref_idx);
    int64_t before = em_live_tensors();
    em_tensor *lg = em_gpt_forward_cached(g, c, idx);
    CHECK(em_size(lg, 2) == GPT_REF_V && em_live_tensors() == before + 1);
    em_free(lg);
    em_free(idx);
    em_gpt_cache_free(c);
    CHECK_OK(em_module_flatten(g->m));
    em_gpt_free(g);
    em_gpt_free(NULL);
    CHECK(em_live_tensors() == live);
}

TEST(test_gpt_flattened_gives_the_same_gradients)
{
    em_gpt *g = ref_model();
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(em_gpt_loss(g, ref_batch(gpt_ref_idx), ref_batch(gpt_ref_targets)), NULL));
    em_scope_end(s);
    em_named v[GPT_REF_NPARAMS];
    em_tensor *before[GPT_REF_NPARAMS];
    em_module_params(g->m, v, GPT_REF_NPARAMS);
    for (int i = 0; i < GPT_REF_NPARAMS; i++) before[i] = em_keep(em_grad(v[i].t));
    CHECK_OK(em_module_flatten(g->m));
    CHECK_NOTNULL(em_module_flat_grads(g->m, EM_F32));
    CHECK_OK(em_module_zero_grad(g->m)); /* flatten keeps the gradients it finds */
    s = em_scope_begin();
    double loss = em_item(em_gpt_loss(g, ref_batch(gpt_ref_idx), ref_batch(gpt_ref_targets)));
    CHECK_NEAR(loss, gpt_ref_loss, 1e-5 * gpt_ref_loss);
    CHECK_OK(em_backward(em_gpt_loss(g, ref_batch(gpt_ref_idx), ref_batch(gpt_ref_targets)), NULL));
    em_scope_end(s);
    for (int i = 0; i < GPT_REF_NPARAMS; i++) {
        CHECK(em_shares_storage(em_grad(v[i].t), em_module_flat_grads(g->m, EM_F32)));
        CHECK(th_max_abs_diff(em_grad(v[i].t), before[i]) == 0);
        em_free(before[i]);
    }
    em_gpt_free(g);
    CHECK(em_live_tensors() == 0);
}

/* nanoGPT's "tiny" config at B=12: forward + backward (no optimizer) asks the
 * arena for no memory after warm-up and leaves no tensor behind. */
TEST(test_gpt_training_step_allocates_nothing_in_steady_state)
{
    em_gpt_config cfg = {65, 64, 4, 4, 128, 0.0, true, false};
    em_gpt *g = em_gpt_new(&cfg, 7);
    em_rng r = em_rng_new(8);
    uint64_t allocs = 0;
    int64_t live = 0;
    enum { WARM = 2, STEPS = 3 };
    for (int step = 0; step < STEPS; step++) {
        if (step == WARM) {
            allocs = em_arena_system_allocs();
            live = em_live_tensors();
        }
        em_scope s = em_scope_begin();
        em_tensor *idx = em_randint(0, 65, EM_I32, EM_SHAPE(12, 64), &r);
        em_tensor *tgt = em_randint(0, 65, EM_I32, EM_SHAPE(12, 64), &r);
        em_tensor *loss = em_gpt_loss(g, idx, tgt);
        CHECK_NOTNULL(loss);
        CHECK_OK(em_backward(loss, NULL));
        em_scope_end(s);
        CHECK_OK(em_module_zero_grad(g->m));
    }
    CHECK(allocs > 0);
    CHECK(em_arena_system_allocs() == allocs);
    CHECK(em_live_tensors() == live);
    em_gpt_free(g);
    CHECK(em_live_tensors() == 0);
}
