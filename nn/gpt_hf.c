/* gpt_hf.c — loads a Hugging Face GPT-2 checkpoint (model.safetensors, or
 * the shards of model.safetensors.index.json: nn/hf_checkpoint.c finds each
 * tensor in its shard) into a module tree that uses ember's GPT parameter
 * names.
 *
 * The names are the same up to an optional "transformer." prefix. The four
 * projection weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are
 * Conv1D in Hugging Face, stored (in, out); ember's are Linear, (out, in),
 * so they are transposed on the way in: W_ember = W_hf^T. The causal-mask
 * buffers (h.i.attn.bias, h.i.attn.masked_bias) are ignored; lm_head.weight
 * is tied to wte and, when present, must equal it.
 *
 * Everything is read and checked into staging tensors first; the model's
 * parameters are written only once every check has passed.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../tensor/kernel_impl.h"
#include "../tensor/tensor_impl.h"
#include "ember/nn.h"
#include "nn/hf_checkpoint_impl.h"

#define OP "em_gpt_load_hf"

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The Conv1D weights that HF stores transposed. */
static bool is_conv1d(const char *name)
{
    return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
           ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

/* Layer index of "h.{i}.rest" (after prefix), or -1. */
static long layer_of(const char *name, const char *prefix)
{
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) || strncmp(name + pl, "h.", 2)) return -1;
    const char *p = name + pl + 2;
    char *end;
    if (*p < '0' || *p > '9') return -1;
    long i = strtol(p, &end, 10);
    return *end == '.' && i < 1000000 ? i : -1;
}

/* Tensors of the file that no ember parameter takes: the mask buffers. */
static bool ignored(const char *name, const char *prefix)
{
    return layer_of(name, prefix) >= 0 && (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"));
}

static int file_index(const hf_ckpt *f, const char *name) { return hf_ckpt_find(f, name); }

/* Number of layers: 1 + the largest h.{i} among names (0 if none). */
static long count_layers(int n, const char *const *names, const char *prefix)
{
    long top = -1;
    for (int i = 0; i < n; i++) {
        long l = layer_of(names[i], prefix);
        if (l > top) top = l;
    }
    return top + 1;
}

/* Says which GPT size disagrees when the embeddings do not fit. */
static em_status embedding_mismatch(const char *path, const char *pname, const tensor *got, const tensor *want)
{
    bool wte = !strcmp(pname, "wte.weight");
    if (got->ndim == 2 && want->ndim == 2 && got->shape[0] != want->shape[0])
        return em_err(EM_ERR_SHAPE, OP ": '%s': %s size mismatch: the file has %lld %s, the model %lld", path,
                      wte ? "vocab" : "block", (long long)got->shape[0], wte ? "tokens" : "positions",
                      (long long)want->shape[0]);
    if (got->ndim == 2 && want->ndim == 2)
        return em_err(EM_ERR_SHAPE, OP ": '%s': embedding width mismatch: the file has n_embd %lld, the model %lld",
                      path, (long long)got->shape[1], (long long)want->shape[1]);
    return em_err(EM_ERR_SHAPE, OP ": '%s': '%s' is %s in the file, the model's is %s", path, pname, shp(got),
                  shp(want));
}

/* Reads and checks the file tensor for parameter (pname, dst); returns the
 * staging tensor in ember's layout (a transposed view for Conv1D weights). */
static tensor *stage(const hf_ckpt *f, const char *path, const char *prefix, const char *pname, tensor *dst)
{
    char hf[512];
    snprintf(hf, sizeof hf, "%s%s", prefix, pname);
    if (!strcmp(pname, "lm_head.weight")) { /* an untied head, if the model has one */
        snprintf(hf, sizeof hf, "lm_head.weight");
        if (file_index(f, hf) < 0) snprintf(hf, sizeof hf, "%swte.weight", prefix);
    }
    bool tr = is_conv1d(pname) && dst->ndim == 2;
    int64_t want[EM_MAX_DIMS];
    memcpy(want, dst->shape, sizeof(int64_t) * (size_t)dst->ndim);
    if (tr) want[0] = dst->shape[1], want[1] = dst->shape[0];
    int k = file_index(f, hf);
    if (k < 0) {
        char where[64] = "";
        if (hf_ckpt_shards(f) > 1)
            snprintf(where, sizeof where, "; none of its %d shards has it", hf_ckpt_shards(f));
        return em_fail(EM_ERR_ARG, OP ": '%s': missing tensor '%s' (for the model's '%s', expected %s)%s",
                       path, hf, pname, shp_of(dst->ndim, want), where);
    }
    tensor *t = t_resolve(hf_ckpt_get(f, k), OP);
    if (!t) return NULL;
    if (t->ndim != dst->ndim || memcmp(t->shape, want, sizeof(int64_t) * (size_t)t->ndim)) {
        if (!strcmp(pname, "wte.weight") || !strcmp(pname, "wpe.weight")) embedding_mismatch(path, pname, t, dst);
        else
            em_err(EM_ERR_SHAPE, OP ": '%s': '%s' is %s in the file but %s is expected for the model's '%s' %s%s", path,
                   hf, shp(t), shp_of(dst->ndim, want), pname, shp(dst),
                   tr ? " (Conv1D weights are stored (in, out) and transposed on load)" : "");
        t_free(t);
        return NULL;
    }
    if (!tr) return t;
    /* (in, out) seen as (out, in): W_ember = W_hf^T */
    tensor *v = t_view_of(t, 2, dst->shape, (const int64_t[]){1, t->shape[1]}, 0);
    t_free(t); /* the view keeps the storage */
    return v;
}

/* max |a - b| > 0 for two tensors of the same shape, read as doubles. */
static bool differ(const tensor *a, const tensor *b)
{
    int64_t n = t_numel(a);
    if (n != t_numel(b) || !t_is_contig(a) || !t_is_contig(b)) return true;
    for (int64_t i = 0; i < n; i++)
        if (ld(a->dtype, (const char *)t_ptr(a) + i * (int64_t)t_esize(a)) !=
            ld(b->dtype, (const char *)t_ptr(b) + i * (int64_t)t_esize(b)))
            return true;
    return false;
}

/* Checks lm_head.weight (when the file has one and the model ties it) against
 * the staged wte. */
static em_status check_tied_head(const hf_ckpt *f, const char *path, const tensor *wte)
{
    int k = file_index(f, "lm_head.weight");
    if (k < 0) return EM_OK;
    tensor *h = t_resolve(hf_ckpt_get(f, k), OP);
    if (!h) return em_last_status();
    bool bad = differ(h, wte);
    char got[64];
    snprintf(got, sizeof got, "%s", shp(h));
    t_free(h);
    if (bad)
        return em_err(EM_ERR_ARG,
                      OP ": '%s': lm_head.weight %s differs from wte.weight %s; ember's GPT ties the head to wte",
                      path, got, shp(wte));
    return EM_OK;
}

em_status em_gpt_load_hf(em_module *gpt_root, const char *path)
{
    if (!gpt_root || !path) return em_err(EM_ERR_ARG, OP ": %s is NULL", gpt_root ? "path" : "module");
    hf_ckpt *f = hf_ckpt_open(path, OP);
    if (!f) return em_last_status();
    int nf = hf_ckpt_count(f), np = em_module_params(gpt_root, NULL, 0);
    em_named *p = malloc(sizeof *p * (size_t)(np + 1));
    tensor **staged = calloc((size_t)np + 1, sizeof *staged);
    const char **fnames = malloc(sizeof *fnames * (size_t)(nf + 1));
    const char **pnames = malloc(sizeof *pnames * (size_t)(np + 1));
    bool *taken = calloc((size_t)nf + 1, sizeof *taken);
    em_status s = EM_OK;
    if (!p || !staged || !fnames || !pnames || !taken) {
        s = em_err(EM_ERR_OOM, OP ": out of memory");
        goto done;
    }
    em_module_params(gpt_root, p, np);
    for (int i = 0; i < np; i++) pnames[i] = p[i].name;
    for (int k = 0; k < nf; k++) fnames[k] = hf_ckpt_name(f, k);

    const char *prefix = file_index(f, "transformer.wte.weight") >= 0 ? "transformer." : "";
    if (!prefix[0] && file_index(f, "wte.weight") < 0) {
        s = em_err(EM_ERR_ARG, OP ": '%s': no 'transformer.wte.weight' or 'wte.weight': not a GPT-2 checkpoint", path);
        goto done;
    }
    long lf = count_layers(nf, fnames, prefix), lm = count_layers(np, pnames, "");
    if (lf != lm) {
        s = em_err(EM_ERR_SHAPE, OP ": '%s': layer count mismatch: the file has %ld layers, the model %ld", path, lf,
                   lm);
        goto done;
    }
    /* every parameter found with the right shape, read into staging */
    bool has_head = false;
    const tensor *wte = NULL;
    for (int i = 0; i < np; i++) {
        tensor *dst = t_resolve(p[i].t, OP);
        if (!dst || !(staged[i] = stage(f, path, prefix, p[i].name, dst))) {
            s = em_last_status();
            goto done;
        }
        char hf[512];
        snprintf(hf, sizeof hf, "%s%s", strcmp(p[i].name, "lm_head.weight") ? prefix : "", p[i].name);
        int k = file_index(f, hf);
        if (k >= 0) taken[k] = true;
        if (!strcmp(p[i].name, "wte.weight")) wte = staged[i];
        if (!strcmp(p[i].name, "lm_head.weight")) has_head = true;
    }
    /* nothing in the file that the model would silently drop */
    for (int k = 0; k < nf; k++) {
        if (taken[k] || ignored(fnames[k], prefix)) continue;
        if (!strcmp(fnames[k], "lm_head.weight") && !has_head && wte) {
            if ((s = check_tied_head(f, path, wte))) goto done;
            continue;
        }
        s = em_err(EM_ERR_ARG, OP ": '%s': unexpected tensor '%s' (no parameter of the model takes it)", path,
                   fnames[k]);
        goto done;
    }
    /* all checks passed: write the parameters */
    for (int i = 0; i < np; i++) copy_strided(t_resolve(p[i].t, OP), staged[i]);
done:
    for (int i = 0; staged && i < np; i++) t_free(staged[i]);
    free(staged);
    free(p);
    free(fnames);
    free(pnames);
    free(taken);
    hf_ckpt_close(f);
    return s;
}
