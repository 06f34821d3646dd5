/* gpt.c — a small GPT built by hand from ember's layers and trained on the
 * characters of a text.
 *
 * What it shows, in the order the code does it:
 *   1. data: a text as character tokens (em_text_open, or em_text_from_memory
 *      for the built-in paragraph), split 90/10 into train and validation, and
 *      random windows of it as (input, target) batches (em_window_sampler);
 *   2. a model as a tree of modules: token and position embeddings, a stack of
 *      pre-LN transformer blocks (layer norm, a qkv projection, causal
 *      attention, an output projection, an MLP), a final layer norm, and an
 *      output projection tied to the token embedding (logits = x @ wte^T);
 *   3. a training step: a step scope, forward, cross-entropy, backward,
 *      gradient clipping, AdamW with a cosine learning-rate schedule, and
 *      weight decay on matrices only (1-D parameters in a second group);
 *   4. evaluation with autograd off, and sampling: the model run on its own
 *      output, one character at a time.
 *
 * ember has this model built in (em_gpt_new, `ember train`); here every piece
 * is written out so it can be read.
 *
 * On the built-in paragraph (812 characters) the model soon learns its
 * training part by heart: the training loss keeps falling while the
 * validation loss turns up after about 100 steps. That is overfitting, left
 * visible on purpose; give it a longer text (--data FILE) and both fall.
 *
 *   ./build/examples/gpt [--data FILE] [--steps N] [--every N] [--sample N]
 *                        [--temperature T] [--prompt TEXT] [--seed S]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/ember.h"

/* The model's size: tiny, so that it trains in seconds on a CPU. */
enum { N_LAYER = 2, N_HEAD = 4, N_EMBD = 64, BLOCK = 32, BATCH = 16 };

static const char default_text[] =
    "An ember is what a fire leaves behind when the flames are gone. It is small and quiet, and it "
    "looks like nothing much, but it is still hot inside, and a little air is enough to wake it. "
    "People who kept fires before matches carried embers from one hearth to the next in a clay pot, "
    "feeding them dry moss so they would last the walk. A village could share one fire that way for "
    "years. The trick was patience: blow too hard and the ember scatters into sparks, too softly and "
    "it goes grey. Hold it close, give it a little to eat, breathe on it slowly, and the flame comes "
    "back. Learning is like that too. A small model trained for a few seconds knows almost nothing, "
    "but it has begun to glow: it has seen which letters follow which, where the spaces fall, and "
    "that a sentence ends with a full stop and starts again.\n";

/* ---- the model -------------------------------------------------------------- */

typedef struct block {
    em_nn_layer_norm *ln_1, *ln_2;
    em_nn_linear *qkv;  /* C -> 3C: queries, keys and values side by side */
    em_nn_linear *proj; /* C -> C: the heads mixed back together */
    em_nn_mlp *mlp;     /* C -> 4C -> gelu -> C */
} block;

typedef struct model {
    em_module *root; /* owns every parameter below */
    em_nn_embedding *wte, *wpe;
    block h[N_LAYER];
    em_nn_layer_norm *ln_f;
} model;

/* Multiplies a parameter's values by s in place (parameters are contiguous
 * f32 and live in the module, so their data can be written directly). */
static void scale_param(em_tensor *w, float s)
{
    float *p = em_data(w);
    for (int64_t i = 0; i < em_numel(w); i++) p[i] *= s;
}

static em_status model_init(model *g, int64_t vocab, em_rng *rng)
{
    g->root = em_module_new(NULL, "gpt");
    g->wte = em_nn_embedding_new(g->root, "wte", vocab, N_EMBD, rng);
    g->wpe = em_nn_embedding_new(g->root, "wpe", BLOCK, N_EMBD, rng);
    em_module *h = em_module_new(g->root, "h");
    for (int l = 0; l < N_LAYER; l++) {
        char name[16];
        snprintf(name, sizeof name, "%d", l);
        em_module *m = em_module_new(h, name); /* parameters named h.0.ln_1.weight, ... */
        block *b = &g->h[l];
        b->ln_1 = em_nn_layer_norm_new(m, "ln_1", N_EMBD, true);
        b->qkv = em_nn_linear_new(m, "qkv", N_EMBD, 3 * N_EMBD, true, rng);
        b->proj = em_nn_linear_new(m, "proj", N_EMBD, N_EMBD, true, rng);
        b->ln_2 = em_nn_layer_norm_new(m, "ln_2", N_EMBD, true);
        b->mlp = em_nn_mlp_new(m, "mlp", N_EMBD, true, 0.0, rng);
    }
    g->ln_f = em_nn_layer_norm_new(g->root, "ln_f", N_EMBD, true);
    if (!g->ln_f || em_last_status() != EM_OK) return em_last_status();
    /* Embeddings start as N(0,1); GPT-2 uses N(0, 0.02). It matters here
     * because wte is also the output layer: N(0,1) would start with huge
     * logits and a loss far above log(vocab). */
    scale_param(g->wte->weight, 0.02f);
    scale_param(g->wpe->weight, 0.02f);
    return EM_OK;
}

/* Causal self-attention: x (B,T,C) -> (B,T,C). */
static em_tensor *attention(block *b, em_tensor *x, int64_t B, int64_t T)
{
    const int64_t C = N_EMBD, H = N_HEAD, D = N_EMBD / N_HEAD;
    em_tensor *qkv = em_nn_linear_forward(b->qkv, x); /* (B,T,3C) */
    em_tensor *qkv_heads[3];
    for (int i = 0; i < 3; i++) {                                  /* q, k, v */
        em_tensor *part = em_narrow(qkv, 2, i * C, C);             /* (B,T,C) */
        em_tensor *split = em_reshape(part, EM_SHAPE(B, T, H, D)); /* (B,T,H,D) */
        qkv_heads[i] = em_transpose(split, 1, 2);                  /* (B,H,T,D) */
    }
    /* softmax(q k^T / sqrt(D)) v, position t seeing positions <= t */
    em_tensor *y = em_attention_causal(qkv_heads[0], qkv_heads[1], qkv_heads[2], 0); /* (B,H,T,D) */
    y = em_reshape(em_transpose(y, 1, 2), EM_SHAPE(B, T, C)); /* heads side by side again */
    return em_nn_linear_forward(b->proj, y);
}

/* A pre-LN block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)). */
static em_tensor *block_forward(block *b, em_tensor *x, int64_t B, int64_t T)
{
    x = em_add(x, attention(b, em_nn_layer_norm_forward(b->ln_1, x), B, T));
    return em_add(x, em_nn_mlp_forward(b->mlp, em_nn_layer_norm_forward(b->ln_2, x)));
}

/* idx (B,T) i32 tokens -> logits (B,T,V). Every tensor made here lives in the
 * caller's step scope, so nothing is freed by hand. A failing op returns NULL
 * and the NULL flows through the rest, so one check at the end is enough. */
static em_tensor *forward(model *g, em_tensor *idx)
{
    int64_t B = em_size(idx, 0), T = em_size(idx, 1);
    em_tensor *pos = em_arange(0, (double)T, 1, EM_I32);         /* 0, 1, ..., T-1 */
    em_tensor *x = em_add(em_nn_embedding_forward(g->wte, idx),  /* (B,T,C) */
                          em_nn_embedding_forward(g->wpe, pos)); /* (T,C), broadcast over B */
    for (int l = 0; l < N_LAYER; l++) x = block_forward(&g->h[l], x, B, T);
    x = em_nn_layer_norm_forward(g->ln_f, x);
    return em_matmul(x, em_transpose(g->wte->weight, 0, 1)); /* tied: (B,T,C) @ (C,V) */
}

/* Mean loss over `batches` validation batches, with autograd off. A copy of
 * the sampler is used, so every call sees the same windows. */
static double evaluate(model *g, const em_window_sampler *val, int batches)
{
    em_window_sampler s = *val;
    bool prev = em_set_grad_enabled(false);
    double sum = 0;
    for (int i = 0; i < batches; i++) {
        em_scope sc = em_scope_begin();
        em_batch b;
        em_tensor *loss = NULL;
        if (em_window_sampler_next(&s, &b) == EM_OK)
            loss = em_cross_entropy(forward(g, b.x), b.y, EM_IGNORE_INDEX);
        sum += loss ? em_item(loss) : NAN;
        em_scope_end(sc);
    }
    em_set_grad_enabled(prev);
    return sum / batches;
}

/* Appends n_new tokens to buf[0..n): each time the model sees the last BLOCK
 * tokens and the logits of the last position pick the next one: the most
 * likely (temperature 0) or a draw from softmax(logits / temperature). */
static em_status generate(model *g, int32_t *buf, int n, int n_new, double temperature, int64_t vocab,
                          em_rng *rng)
{
    bool prev = em_set_grad_enabled(false);
    em_status st = EM_OK;
    for (; n_new > 0 && st == EM_OK; n_new--, n++) {
        int start = n > BLOCK ? n - BLOCK : 0;
        em_scope sc = em_scope_begin();
        em_tensor *idx = em_from_data(EM_I32, EM_SHAPE(1, n - start), buf + start);
        em_tensor *logits = forward(g, idx);                      /* (1,t,V) */
        em_tensor *last = em_narrow(logits, 1, n - start - 1, 1); /* (1,1,V) */
        if (temperature <= 0) {
            double next = em_item(em_argmax(last, -1, false));
            buf[n] = (int32_t)next;
            if (isnan(next)) st = em_last_status();
        } else {
            float p[256];
            st = em_to_array(em_softmax(em_mul_scalar(last, 1.0 / temperature), -1), EM_F32, p);
            double u = em_item(em_rand(EM_F32, EM_SHAPE(1), rng)), acc = 0;
            int k = 0;
            while (k < vocab - 1 && (acc += p[k]) <= u) k++; /* the first k with cumulative p > u */
            buf[n] = k;
        }
        em_scope_end(sc);
    }
    em_set_grad_enabled(prev);
    return st;
}

/* ---- the program ------------------------------------------------------------ */

static int usage(const char *bad)
{
    if (bad) fprintf(stderr, "gpt: unknown flag or missing value: '%s'\n", bad);
    fprintf(stderr, "usage: gpt [--data FILE] [--steps N] [--every N] [--sample N] [--temperature T] "
                    "[--prompt TEXT] [--seed S]\n");
    return 2;
}

/* s as an integer >= min, or -1 after saying what is wrong. */
static long parse_int(const char *flag, const char *s, long min)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < min) {
        fprintf(stderr, "gpt: %s must be an integer >= %ld, got '%s'\n", flag, min, s);
        return -1;
    }
    return v;
}

static int fail(const char *what)
{
    fprintf(stderr, "gpt: %s: %s\n", what, em_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const char *data = NULL, *prompt = NULL;
    long steps = 300, every = 50, n_sample = 120, seed = 1;
    double temperature = 0.8;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage(f);
        i++;
        if (!strcmp(f, "--data"))
            data = v;
        else if (!strcmp(f, "--prompt"))
            prompt = v;
        else if (!strcmp(f, "--steps"))
            steps = parse_int(f, v, 1);
        else if (!strcmp(f, "--every"))
            every = parse_int(f, v, 1);
        else if (!strcmp(f, "--sample"))
            n_sample = parse_int(f, v, 0);
        else if (!strcmp(f, "--seed"))
            seed = parse_int(f, v, 0);
        else if (!strcmp(f, "--temperature")) {
            char *end;
            temperature = strtod(v, &end);
            if (*end || !(temperature >= 0)) {
                fprintf(stderr, "gpt: --temperature must be a number >= 0, got '%s'\n", v);
                return 2;
            }
        } else
            return usage(f);
        if (steps < 0 || every < 0 || n_sample < 0 || seed < 0) return 2;
    }

    /* 1. data: characters -> tokens, 90% to train on, 10% to validate */
    em_text *text = data ? em_text_open(data, EM_TEXT_CHARS)
                         : em_text_from_memory(default_text, strlen(default_text), EM_TEXT_CHARS);
    if (!text) return fail("cannot read the text");
    em_tokens train, val;
    em_window_sampler train_batches, val_batches;
    if (em_tokens_split(&text->tokens, 0.9, &train, &val) != EM_OK ||
        em_window_sampler_init(&train_batches, &train, BATCH, BLOCK, (uint64_t)seed) != EM_OK ||
        em_window_sampler_init(&val_batches, &val, BATCH, BLOCK, (uint64_t)seed + 1) != EM_OK) {
        em_text_free(text);
        return fail("text too short");
    }
    int64_t vocab = text->vocab.size;
    printf("data: %s, %lld characters, vocabulary of %lld\n", data ? data : "built-in paragraph",
           (long long)text->tokens.n, (long long)vocab);
    /* the prompt to continue after training (default: the text's first 8
     * characters), checked now rather than after the training */
    int n_prompt = prompt ? (int)strlen(prompt) : (int)(text->tokens.n < 8 ? text->tokens.n : 8);
    int32_t *tokens = malloc(sizeof *tokens * (size_t)(n_prompt + n_sample));
    if (prompt &&
        (n_prompt == 0 || em_vocab_encode(&text->vocab, prompt, (size_t)n_prompt, tokens) != EM_OK)) {
        fprintf(stderr, "gpt: bad --prompt: %s\n", n_prompt ? em_last_error() : "it is empty");
        free(tokens);
        em_text_free(text);
        return 2;
    }
    for (int i = 0; i < n_prompt && !prompt; i++) tokens[i] = (int32_t)em_tokens_at(&text->tokens, i);

    /* 2. the model */
    model g = {0};
    em_rng rng = em_rng_new((uint64_t)seed);
    if (model_init(&g, vocab, &rng) != EM_OK) {
        em_module_free(g.root);
        free(tokens);
        em_text_free(text);
        return fail("cannot build the model");
    }
    printf("model: %d layers, %d heads, %d channels, context %d: %lld parameters\n", N_LAYER, N_HEAD, N_EMBD,
           BLOCK, (long long)em_module_num_params(g.root));

    /* 3. the optimizer: AdamW. Matrices decay; 1-D parameters (biases and
     * norm gains) do not, so they go in a second group with weight_decay 0. */
    int n_params = em_module_params(g.root, NULL, 0);
    em_named *named = malloc(sizeof *named * (size_t)n_params);
    em_module_params(g.root, named, n_params);
    em_tensor **all = malloc(sizeof *all * (size_t)n_params * 3);
    em_tensor **decay = all + n_params, **no_decay = all + 2 * n_params;
    int n_decay = 0, n_no_decay = 0;
    for (int i = 0; i < n_params; i++) {
        all[i] = named[i].t;
        if (em_ndim(named[i].t) >= 2)
            decay[n_decay++] = named[i].t;
        else
            no_decay[n_no_decay++] = named[i].t;
    }
    free(named);
    em_adam_config cfg = em_adamw_defaults();
    cfg.lr = 3e-3;
    cfg.beta2 = 0.99;
    cfg.weight_decay = 0.1;
    em_optimizer *opt = em_adamw_new(n_decay, decay, &cfg);
    if (opt && em_optim_add_group(opt, n_no_decay, no_decay, cfg.lr, 0.0) < 0) {
        em_optim_free(opt);
        opt = NULL;
    }
    /* warm up over the first 10% of the steps, then a cosine down to lr/10 */
    em_lr_schedule sched = {
        .kind = EM_LR_COSINE, .base_lr = cfg.lr, .min_lr = cfg.lr / 10, .warmup = steps / 10, .total = steps};

    int rc = opt ? 0 : fail("cannot make the optimizer");
    for (long step = 0; step < steps && !rc; step++) {
        em_optim_apply_schedule(opt, &sched, step); /* every group, from its own base lr */
        em_scope s = em_scope_begin();              /* this step's tensors live here */
        em_batch b;
        em_tensor *loss = NULL;
        if (em_window_sampler_next(&train_batches, &b) == EM_OK)
            loss = em_cross_entropy(forward(&g, b.x), b.y,
                                    EM_IGNORE_INDEX); /* x (B,T), y (B,T) = x shifted by one */
        double value = loss ? em_item(loss) : NAN;
        em_status st = loss ? em_backward(loss, NULL) : em_last_status();
        em_scope_end(s); /* gradients live on in the parameters */
        if (st != EM_OK) {
            rc = fail("training step failed");
            break;
        }
        double norm = em_clip_grad_norm(n_params, all, 1.0, NULL);
        em_optim_step(opt);
        em_optim_zero_grad(opt);
        if (step % every == 0 || step == steps - 1)
            printf("step %4ld | loss %.4f | val loss %.4f | lr %.2e | grad norm %.2f\n", step, value,
                   evaluate(&g, &val_batches, 4), em_optim_get_lr(opt, 0), norm);
    }

    /* 4. sampling: the prompt, continued one character at a time */
    if (!rc && n_sample > 0) {
        char *out = malloc((size_t)(n_prompt + n_sample) + 1);
        em_status st = generate(&g, tokens, n_prompt, (int)n_sample, temperature, vocab, &rng);
        if (st == EM_OK) st = em_vocab_decode(&text->vocab, tokens, (size_t)(n_prompt + n_sample), out);
        if (st == EM_OK)
            printf("sample (temperature %g):\n%s\n", temperature, out);
        else
            rc = fail("sampling failed");
        free(out);
    }
    free(tokens);
    free(all);
    em_optim_free(opt);
    em_module_free(g.root);
    em_text_free(text);
    return rc;
}
