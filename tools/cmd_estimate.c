/* cmd_estimate.c — `ember estimate-memory`: the memory per rank of training
 * a GPT (em_estimate_memory), as a table by category, for one ZeRO stage or
 * for stages 0..3 side by side. The model comes from flags, from a run
 * directory (DIR/config, as `ember train` writes it) or from a safetensors
 * file's header (the data is never read). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "ember/ember.h"
#include "mem_check.h"
#include "nn/safetensors_impl.h"
#include "train_config.h"

static const char est_usage[] =
    "usage: ember estimate-memory [options]\n"
    "Prints the memory per rank of training a GPT: parameters, gradients, optimizer state,\n"
    "activations (what a step keeps for backward and what backward makes), communication\n"
    "buffers, the runtime, and the total; ZeRO stages 0..3 side by side unless --zero is given.\n"
    "  --n-layer N --n-head N --n-embd N --vocab N --block-size N\n"
    "                              the model (default 4 4 128 65 64: `ember train`'s tiny GPT)\n"
    "  --model DIR|FILE.safetensors  take the shape from DIR/config (ember train's run directory)\n"
    "                              or DIR/model.safetensors, or a safetensors file's header (its\n"
    "                              data is not read; the head count is not in it: --n-head)\n"
    "  --no-bias                   no biases in Linear and LayerNorm\n"
    "  --dropout X                 dropout probability (default 0)\n"
    "  --world N                   ranks (default 1)\n"
    "  --zero 0|1|2|3              one ZeRO stage (default: all four side by side)\n"
    "  --precision no|bf16|fp16    autocast (default no); parameters stay f32\n"
    "  --batch N --context N       sequences per rank and tokens each (default 12, the block size)\n"
    "  --optimizer adamw|adam|sgd  (default adamw); --momentum: SGD with momentum\n"
    "  --bucket-mb X               gradient bucket size in MiB (default 25)\n"
    "  --threads N                 ember's thread pool (default: this machine's, EMBER_NUM_THREADS)\n";

typedef struct est_opts {
    em_mem_config c;
    int zero; /* -1: all stages */
    const char *model_path;
    bool set_layer, set_head, set_embd, set_vocab, set_block, set_bias;
} est_opts;

static bool parse_int(const char *flag, const char *s, long long min, long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < min || v > max) {
        fprintf(stderr, "ember estimate-memory: %s needs an integer from %lld to %lld, got '%s'\n", flag, min,
                max, s);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_real(const char *flag, const char *s, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= 0) || v > max) {
        fprintf(stderr, "ember estimate-memory: %s needs a number from 0 to %g, got '%s'\n", flag, max, s);
        return false;
    }
    *out = v;
    return true;
}

/* n layers: one past the highest N of the names "h.N." (with any prefix) */
static int64_t count_layers(const em_safetensors *f)
{
    int64_t n = 0;
    for (int i = 0; i < em_safetensors_count(f); i++) {
        const char *h = strstr(em_safetensors_name(f, i), "h.");
        if (!h || (h != em_safetensors_name(f, i) && h[-1] != '.')) continue;
        char *end;
        long long k = strtoll(h + 2, &end, 10);
        if (end != h + 2 && *end == '.' && k + 1 > n) n = k + 1;
    }
    return n;
}

/* The GPT's shape from a safetensors header: wte (V,C), wpe (block,C), the
 * layers h.N, biases if h.0.attn.c_attn.bias is there; names as ember saves
 * them or with Hugging Face's "transformer." prefix. */
static bool shape_from_safetensors(const char *path, est_opts *o)
{
    em_safetensors *f = st_open(path, false); /* the header only: no checksum pass over the data */
    if (!f) {
        fprintf(stderr, "ember estimate-memory: --model: %s\n", em_last_error());
        return false;
    }
    const char *prefix = "";
    int64_t wte[EM_MAX_DIMS], wpe[EM_MAX_DIMS], bias[EM_MAX_DIMS];
    int nt = em_safetensors_shape(f, "wte.weight", wte);
    if (nt < 0) {
        prefix = "transformer.";
        nt = em_safetensors_shape(f, "transformer.wte.weight", wte);
    }
    char name[64];
    snprintf(name, sizeof name, "%swpe.weight", prefix);
    int np = nt == 2 ? em_safetensors_shape(f, name, wpe) : -1;
    snprintf(name, sizeof name, "%sh.0.attn.c_attn.bias", prefix);
    bool has_bias = em_safetensors_shape(f, name, bias) >= 0;
    int64_t layers = count_layers(f);
    em_safetensors_close(f);
    if (nt != 2 || np != 2 || wpe[1] != wte[1] || layers < 1) {
        fprintf(stderr,
                "ember estimate-memory: --model %s is not a GPT ember knows: it needs wte.weight (V,C), "
                "wpe.weight "
                "(block,C) and layers h.0, h.1, ... (optionally under 'transformer.')\n",
                path);
        return false;
    }
    em_gpt_config *m = &o->c.model;
    if (!o->set_vocab) m->vocab_size = wte[0];
    if (!o->set_embd) m->n_embd = wte[1];
    if (!o->set_block) m->block_size = wpe[0];
    if (!o->set_layer) m->n_layer = layers;
    if (!o->set_bias) m->bias = has_bias;
    if (!o->set_head) {
        fprintf(stderr,
                "ember estimate-memory: --model %s: a safetensors file does not say the number of heads; "
                "give --n-head\n",
                path);
        return false;
    }
    return true;
}

/* --model: DIR/config (every field of the shape), else DIR/model.safetensors,
 * else the path as a safetensors file. Flags given on the command line win. */
static bool load_model_shape(est_opts *o)
{
    const char *p = o->model_path;
    struct stat sb;
    if (stat(p, &sb) != 0) {
        fprintf(stderr, "ember estimate-memory: --model %s: %s\n", p, strerror(errno));
        return false;
    }
    if (!S_ISDIR(sb.st_mode)) return shape_from_safetensors(p, o);
    char path[4200];
    snprintf(path, sizeof path, "%s/config", p);
    if (stat(path, &sb) != 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", p);
        return shape_from_safetensors(path, o);
    }
    em_gpt_config m;
    em_vocab vocab;
    if (run_config_read(path, &m, &vocab)) {
        fprintf(stderr, "ember estimate-memory: --model: %s\n", em_last_error());
        return false;
    }
    em_gpt_config *c = &o->c.model;
    if (!o->set_vocab) c->vocab_size = m.vocab_size;
    if (!o->set_embd) c->n_embd = m.n_embd;
    if (!o->set_block) c->block_size = m.block_size;
    if (!o->set_layer) c->n_layer = m.n_layer;
    if (!o->set_head) c->n_head = m.n_head;
    if (!o->set_bias) c->bias = m.bias;
    return true;
}

static int parse_args(int argc, char **argv, est_opts *o)
{
    o->c = em_mem_config_defaults();
    o->zero = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(est_usage, stdout);
            return -1;
        }
        if (!strcmp(f, "--no-bias")) {
            o->c.model.bias = false;
            o->set_bias = true;
            continue;
        }
        if (!strcmp(f, "--momentum")) {
            o->c.momentum = true;
            continue;
        }
        if (strncmp(f, "--", 2) != 0) {
            fprintf(stderr, "ember estimate-memory: unexpected argument '%s'\n", f);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "ember estimate-memory: %s needs a value\n", f);
            return 2;
        }
        const char *v = argv[++i];
        long long n = 0;
        bool ok = true;
        em_gpt_config *m = &o->c.model;
        if (!strcmp(f, "--n-layer"))
            ok = parse_int(f, v, 1, 1 << 20, &n) && ((m->n_layer = n), (o->set_layer = true));
        else if (!strcmp(f, "--n-head"))
            ok = parse_int(f, v, 1, 1 << 20, &n) && ((m->n_head = n), (o->set_head = true));
        else if (!strcmp(f, "--n-embd"))
            ok = parse_int(f, v, 1, 1 << 24, &n) && ((m->n_embd = n), (o->set_embd = true));
        else if (!strcmp(f, "--vocab"))
            ok = parse_int(f, v, 1, 1 << 30, &n) && ((m->vocab_size = n), (o->set_vocab = true));
        else if (!strcmp(f, "--block-size"))
            ok = parse_int(f, v, 1, 1 << 24, &n) && ((m->block_size = n), (o->set_block = true));
        else if (!strcmp(f, "--world"))
            ok = parse_int(f, v, 1, 1 << 20, &n) && ((o->c.world = (int)n), true);
        else if (!strcmp(f, "--zero"))
            ok = parse_int(f, v, 0, 3, &n) && ((o->zero = (int)n), true);
        else if (!strcmp(f, "--batch"))
            ok = parse_int(f, v, 1, 1 << 24, &n) && ((o->c.batch = n), true);
        else if (!strcmp(f, "--context"))
            ok = parse_int(f, v, 1, 1 << 24, &n) && ((o->c.context = n), true);
        else if (!strcmp(f, "--threads"))
            ok = parse_int(f, v, 1, 4096, &n) && ((o->c.threads = (int)n), true);
        else if (!strcmp(f, "--bucket-mb"))
            ok = parse_real(f, v, 1e6, &o->c.bucket_mb);
        else if (!strcmp(f, "--dropout"))
            ok = parse_real(f, v, 0.999999, &m->dropout);
        else if (!strcmp(f, "--model"))
            o->model_path = v;
        else if (!strcmp(f, "--precision")) {
            ok = em_precision_parse(v, &o->c.precision) == EM_OK;
            if (!ok)
                fprintf(stderr, "ember estimate-memory: --precision needs no, bf16 or fp16, got '%s'\n", v);
        } else if (!strcmp(f, "--optimizer")) {
            ok = true;
            if (!strcmp(v, "adamw"))
                o->c.optimizer = EM_MEM_ADAMW;
            else if (!strcmp(v, "adam"))
                o->c.optimizer = EM_MEM_ADAM;
            else if (!strcmp(v, "sgd"))
                o->c.optimizer = EM_MEM_SGD;
            else {
                ok = false;
                fprintf(stderr, "ember estimate-memory: --optimizer needs adamw, adam or sgd, got '%s'\n", v);
            }
        } else {
            fprintf(stderr, "ember estimate-memory: unknown flag '%s'\n", f);
            fputs(est_usage, stderr);
            return 2;
        }
        if (!ok) return 2;
    }
    if (o->model_path && !load_model_shape(o)) return 2;
    if (o->c.momentum && o->c.optimizer != EM_MEM_SGD) {
        fprintf(stderr, "ember estimate-memory: --momentum is for --optimizer sgd\n");
        return 2;
    }
    em_gpt_config *m = &o->c.model;
    if (m->n_embd % m->n_head) {
        fprintf(stderr, "ember estimate-memory: --n-embd %lld is not a multiple of --n-head %lld\n",
                (long long)m->n_embd, (long long)m->n_head);
        return 2;
    }
    if (o->c.context > m->block_size) {
        fprintf(stderr, "ember estimate-memory: --context %lld is longer than --block-size %lld\n",
                (long long)o->c.context, (long long)m->block_size);
        return 2;
    }
    return 0;
}

int cmd_estimate_memory(int argc, char **argv)
{
    /* the runtime's baseline: what this process (the binary and libraries a
     * training run loads, CUDA's in a CUDA build) holds before it reads
     * anything, rounded up to a MiB so the table does not move with pages */
    double base = mem_rss();
    est_opts o = {0};
    int rc = parse_args(argc, argv, &o);
    o.c.base_bytes = (size_t)(ceil(base / (1 << 20)) * (1 << 20));
    if (rc) return rc < 0 ? 0 : rc;
    int first = o.zero < 0 ? 0 : o.zero, last = o.zero < 0 ? 3 : o.zero;
    em_mem_estimate e[4];
    for (int z = first; z <= last; z++) {
        o.c.zero_stage = z;
        if (em_estimate_memory(&o.c, &e[z])) {
            fprintf(stderr, "ember estimate-memory: %s\n", em_last_error());
            return 1;
        }
    }
    const em_mem_config *c = &o.c;
    const em_gpt_config *m = &c->model;
    static const char *opt_names[] = {"AdamW", "Adam", "SGD"};
    printf("GPT: %lld layers, %lld heads, %lld wide, vocab %lld, block %lld%s (%.2fM parameters)\n",
           (long long)m->n_layer, (long long)m->n_head, (long long)m->n_embd, (long long)m->vocab_size,
           (long long)m->block_size, m->bias ? "" : ", no bias", (double)e[first].n_params / 1e6);
    printf("per rank: batch %lld x context %lld, world %d, %s, %s%s, buckets of %g MiB\n\n",
           (long long)c->batch, (long long)(c->context ? c->context : m->block_size), c->world,
           c->precision == EM_PREC_BF16   ? "bf16 autocast"
           : c->precision == EM_PREC_FP16 ? "fp16 autocast"
                                          : "f32",
           opt_names[c->optimizer], c->momentum ? " with momentum" : "",
           c->bucket_mb > 0 ? c->bucket_mb : 25);
    printf("%-18s", "bytes per rank");
    for (int z = first; z <= last; z++) printf("%14s%d", "ZeRO stage ", z);
    printf("\n");
    char buf[32];
    for (int k = 0; k <= EM_MEM_NCATEGORIES; k++) {
        printf("%-18s", k < EM_MEM_NCATEGORIES ? em_mem_category_name(k) : "total");
        for (int z = first; z <= last; z++)
            printf("%15s", mem_human(k < EM_MEM_NCATEGORIES ? (double)e[z].bytes[k] : (double)e[z].total, buf,
                                     sizeof buf));
        printf("\n");
    }
    return 0;
}
