/* cmd_sample.c — `ember sample`: loads what `ember train` wrote (DIR/config
 * and DIR/model.safetensors) and prints text generated from a prompt, one
 * token at a time through the GPT's KV cache. A long generation shows a
 * progress bar on stderr when that is a terminal (tools/progress.c). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ember/ember.h"
#include "progress.h"
#include "train_config.h"

static int usage(FILE *f)
{
    fprintf(
        f,
        "usage: ember sample --ckpt DIR [--prompt S] [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
        "                    [--device cpu|cuda|cuda:N]\n"
        "  DIR holds config and model.safetensors from `ember train --out DIR`\n"
        "  defaults: prompt \"\\n\", 500 tokens, temperature 0.8, top-k 200, seed 1337\n");
    return f == stderr ? 2 : 0;
}

/* Generations of at least this many tokens show the bar. */
enum { BAR_MIN_TOKENS = 256 };

typedef struct bar_ctx {
    progress bar;
    double t0;
} bar_ctx;

/* em_gpt_sample_progress's hook: the bar after each token */
static void on_token(void *ctx, int done, int n_new)
{
    bar_ctx *b = ctx;
    double rate = (double)done / (progress_now() - b->t0);
    progress_draw(&b->bar, done, n_new, " tokens", NAN, rate, (double)(n_new - done) / rate);
}

static bool num(const char *flag, const char *s, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo) || v > 1e12) {
        fprintf(stderr, "ember sample: %s needs a number >= %g, got '%s'\n", flag, lo, s);
        return false;
    }
    *out = v;
    return true;
}

int cmd_sample(int argc, char **argv)
{
    const char *ckpt = NULL, *prompt = "\n";
    em_device dev = em_device_cpu();
    double tokens = 500, temperature = 0.8, top_k = 200, seed = 1337;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return usage(stdout);
        if (i + 1 >= argc) {
            fprintf(stderr, "ember sample: unknown flag or missing value: '%s'\n", f);
            return usage(stderr);
        }
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(f, "--ckpt"))
            ckpt = v;
        else if (!strcmp(f, "--prompt"))
            prompt = v;
        else if (!strcmp(f, "--tokens")) {
            ok = num(f, v, 0, &tokens);
            if (ok && tokens > 10000000) {
                fprintf(stderr, "ember sample: --tokens %s is more than 10000000\n", v);
                return 2;
            }
        } else if (!strcmp(f, "--temperature"))
            ok = num(f, v, 1e-6, &temperature);
        else if (!strcmp(f, "--top-k"))
            ok = num(f, v, 0, &top_k);
        else if (!strcmp(f, "--seed"))
            ok = num(f, v, 0, &seed);
        else if (!strcmp(f, "--device")) {
            ok = em_device_parse(v, 0, &dev) == EM_OK;
            if (!ok) fprintf(stderr, "ember sample: --device needs cpu, cuda or cuda:N, got '%s'\n", v);
        }
        else {
            fprintf(stderr, "ember sample: unknown flag '%s'\n", f);
            return usage(stderr);
        }
        if (!ok) return 2;
    }
    if (!ckpt) {
        fprintf(stderr, "ember sample: --ckpt DIR is required\n");
        return usage(stderr);
    }
    char path[4096];
    em_gpt_config cfg;
    em_vocab vocab;
    snprintf(path, sizeof path, "%s/config", ckpt);
    if (run_config_read(path, &cfg, &vocab)) {
        fprintf(stderr, "ember sample: %s\n", em_last_error());
        return 1;
    }
    size_t np = strlen(prompt);
    if (np == 0) {
        fprintf(stderr, "ember sample: --prompt must not be empty\n");
        return 2;
    }
    int32_t *ids = malloc(sizeof *ids * (np + (size_t)tokens));
    char *text = malloc(np + (size_t)tokens + 1);
    em_gpt *g = ids && text ? em_gpt_new(&cfg, 0) : NULL;
    int rc = 1;
    if (!ids || !text) em_set_error(EM_ERR_OOM, "out of memory for %zu tokens", np + (size_t)tokens);
    if (!g) {
        fprintf(stderr, "ember sample: %s\n", em_last_error());
        goto done;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    if (em_module_load(g->m, path, true) || em_module_to(g->m, dev) || em_vocab_encode(&vocab, prompt, np, ids)) {
        fprintf(stderr, "ember sample: %s\n", em_last_error());
        rc = em_last_status() == EM_ERR_ARG ? 2 : 1;
        goto done;
    }
    em_module_train(g->m, false);
    em_rng rng = em_rng_new((uint64_t)seed);
    bar_ctx bc = {progress_on(stderr, 0.1), progress_now()};
    bool bar = bc.bar.tty && tokens >= BAR_MIN_TOKENS;
    int n = em_gpt_sample_progress(g, ids, (int)np, (int)tokens, temperature, (int)top_k, &rng, ids,
                                   bar ? on_token : NULL, &bc);
    progress_clear(&bc.bar);
    if (n < 0 || em_vocab_decode(&vocab, ids, (size_t)n, text)) {
        fprintf(stderr, "ember sample: %s\n", em_last_error());
        goto done;
    }
    fwrite(text, 1, (size_t)n, stdout);
    printf("\n");
    rc = 0;
done:
    if (g) em_gpt_free(g);
    free(ids);
    free(text);
    return rc;
}
