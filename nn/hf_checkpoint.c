/* hf_checkpoint.c — Hugging Face's checkpoint layout (hf_checkpoint_impl.h):
 * the sharded index written and read, and a checkpoint's tensors found by
 * name across its shards.
 *
 * Opening a sharded checkpoint reads the index whole (json_parse), opens
 * each distinct shard once (em_safetensors_open: headers only, no tensor
 * data), and builds one table of every name with its shard, sorted for
 * lookup. The index and the shards must agree exactly: a tensor the index
 * maps to a shard that lacks it, one a shard holds that the index does not
 * list or maps elsewhere, and one held by two shards are each refused by
 * name, so a damaged or mixed-up checkpoint never loads in part. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "nn/hf_checkpoint_impl.h"
#include "nn/json_impl.h"
#include "tensor/error_impl.h"

/* ---- the index, written --------------------------------------------------------- */

typedef struct name_file {
    const char *name, *file;
} name_file;

static int cmp_name_file(const void *x, const void *y)
{
    return strcmp(((const name_file *)x)->name, ((const name_file *)y)->name);
}

em_status hf_index_write(const char *path, int n, const char *const *names, const char *const *files,
                         uint64_t total, file_sum *sum, const char *fn)
{
    name_file *p = malloc(sizeof *p * (size_t)(n + 1));
    if (!p) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; i < n; i++) p[i] = (name_file){names[i], files[i]};
    qsort(p, (size_t)n, sizeof *p, cmp_name_file);
    jbuf b = {0};
    char num[64];
    snprintf(num, sizeof num, "%" PRIu64, total);
    jb_puts(&b, "{\n  \"metadata\": {\n    \"total_size\": ");
    jb_puts(&b, num);
    jb_puts(&b, "\n  },\n  \"weight_map\": {\n");
    for (int i = 0; i < n; i++) {
        jb_puts(&b, "    ");
        jb_str(&b, p[i].name);
        jb_puts(&b, ": ");
        jb_str(&b, p[i].file);
        jb_puts(&b, i + 1 < n ? ",\n" : "\n");
    }
    jb_puts(&b, "  }\n}\n");
    free(p);
    em_status s =
        b.oom ? em_err(EM_ERR_OOM, "%s: out of memory", fn) : file_write_atomic(path, b.p, b.len, fn);
    if (!s && sum) *sum = (file_sum){.size = b.len, .crc = file_crc32(0, b.p, b.len)};
    free(b.p);
    return s;
}

/* ---- a checkpoint, read ------------------------------------------------------------ */

typedef struct entry {
    const char *name; /* owned by its shard's em_safetensors */
    int shard;
} entry;

struct hf_ckpt {
    int nshard, n;
    em_safetensors **shard;
    char **shard_path;
    entry *e; /* n, sorted by name */
};

static int cmp_entry(const void *x, const void *y)
{
    return strcmp(((const entry *)x)->name, ((const entry *)y)->name);
}

void hf_ckpt_close(hf_ckpt *c)
{
    if (!c) return;
    for (int k = 0; k < c->nshard; k++) {
        em_safetensors_close(c->shard[k]);
        free(c->shard_path[k]);
    }
    free(c->shard);
    free(c->shard_path);
    free(c->e);
    free(c);
}

int hf_ckpt_count(const hf_ckpt *c) { return c ? c->n : 0; }
const char *hf_ckpt_name(const hf_ckpt *c, int i) { return c && i >= 0 && i < c->n ? c->e[i].name : NULL; }
int hf_ckpt_shards(const hf_ckpt *c) { return c ? c->nshard : 0; }

int hf_ckpt_find(const hf_ckpt *c, const char *name)
{
    if (!c || !name) return -1;
    entry key = {name, 0};
    const entry *hit = bsearch(&key, c->e, (size_t)c->n, sizeof *c->e, cmp_entry);
    return hit ? (int)(hit - c->e) : -1;
}

em_tensor *hf_ckpt_get(const hf_ckpt *c, int i)
{
    if (!c || i < 0 || i >= c->n) return em_fail(EM_ERR_INDEX, "hf_ckpt_get: tensor %d out of range", i);
    return em_safetensors_get(c->shard[c->e[i].shard], c->e[i].name);
}

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Adds shard file `path` (opened) to c; its index in c->shard. -1 + error. */
static int add_shard(hf_ckpt *c, const char *path)
{
    em_safetensors *f = em_safetensors_open(path);
    char *p = f ? strdup(path) : NULL;
    em_safetensors **ns = p ? realloc(c->shard, sizeof *ns * (size_t)(c->nshard + 1)) : NULL;
    if (ns) c->shard = ns;
    char **np = ns ? realloc(c->shard_path, sizeof *np * (size_t)(c->nshard + 1)) : NULL;
    if (np) c->shard_path = np;
    if (!np) {
        if (f && !p) em_err(EM_ERR_OOM, "out of memory");
        em_safetensors_close(f);
        free(p);
        return -1;
    }
    c->shard[c->nshard] = f;
    c->shard_path[c->nshard] = p;
    return c->nshard++;
}

/* Every tensor of every shard into c->e, sorted; a name in two shards is
 * refused naming both. */
static em_status build_table(hf_ckpt *c, const char *fn)
{
    int n = 0;
    for (int k = 0; k < c->nshard; k++) n += em_safetensors_count(c->shard[k]);
    c->e = malloc(sizeof *c->e * (size_t)(n + 1));
    if (!c->e) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int k = 0; k < c->nshard; k++)
        for (int i = 0; i < em_safetensors_count(c->shard[k]); i++)
            c->e[c->n++] = (entry){em_safetensors_name(c->shard[k], i), k};
    qsort(c->e, (size_t)c->n, sizeof *c->e, cmp_entry);
    for (int i = 1; i < c->n; i++)
        if (!strcmp(c->e[i - 1].name, c->e[i].name))
            return em_err(EM_ERR_ARG, "%s: tensor '%s' is in two shards, '%s' and '%s'", fn, c->e[i].name,
                          c->shard_path[c->e[i - 1].shard], c->shard_path[c->e[i].shard]);
    return EM_OK;
}

/* The shard of a weight_map entry: dir/file, opened once. */
static int shard_of(hf_ckpt *c, const char *dir, const char *file)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s%s%s", dir, *dir ? "/" : "", file);
    for (int k = 0; k < c->nshard; k++)
        if (!strcmp(c->shard_path[k], p)) return k;
    return add_shard(c, p);
}

/* Opens the shards the index at path names and checks that they hold
 * exactly what it maps to them. */
static em_status open_sharded(hf_ckpt *c, const char *path, const char *fn)
{
    char *text = NULL, err[200];
    size_t len = 0;
    em_status s = file_read_all(path, (size_t)1 << 28, &text, &len, fn);
    if (s) return s;
    jval root;
    bool parsed = json_parse(text, len, &root, err, sizeof err);
    free(text);
    if (!parsed) return em_err(EM_ERR_IO, "%s: '%s' is not a safetensors index: %s", fn, path, err);
    const jval *map = root.kind == J_OBJ ? json_get(&root, "weight_map") : NULL;
    if (!map || map->kind != J_OBJ || map->n == 0)
        s = em_err(EM_ERR_IO, "%s: '%s' is not a safetensors index: no \"weight_map\" object naming tensors",
                   fn, path);
    for (int i = 0; !s && i < map->n; i++)
        if (map->v[i].kind != J_STR || !*map->v[i].s)
            s = em_err(EM_ERR_IO, "%s: '%s': weight_map's \"%s\" is not a file name", fn, path, map->keys[i]);
    /* the shards, in the directory of the index */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash == dir ? (void)(dir[1] = 0) : (void)(*slash = 0);
    else
        dir[0] = 0;
    int *where = s ? NULL : malloc(sizeof *where * (size_t)(map->n + 1));
    if (!s && !where) s = em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; !s && i < map->n; i++) {
        if ((where[i] = shard_of(c, dir, map->v[i].s)) >= 0) continue;
        s = em_err(em_last_status() ? em_last_status() : EM_ERR_IO,
                   "%s: shard '%s' of '%s' (holding '%s'): %s", fn, map->v[i].s, path, map->keys[i],
                   em_last_error());
    }
    if (!s) s = build_table(c, fn);
    /* the index and the shards agree: every listed tensor where it says, nothing unlisted */
    for (int i = 0; !s && i < map->n; i++) {
        int k = hf_ckpt_find(c, map->keys[i]);
        if (k < 0)
            s = em_err(EM_ERR_ARG,
                       "%s: '%s' maps tensor '%s' to '%s', which does not hold it (no shard does)", fn, path,
                       map->keys[i], c->shard_path[where[i]]);
        else if (c->e[k].shard != where[i])
            s = em_err(EM_ERR_ARG, "%s: '%s' maps tensor '%s' to '%s', but it is in '%s'", fn, path,
                       map->keys[i], c->shard_path[where[i]], c->shard_path[c->e[k].shard]);
    }
    if (!s && c->n != map->n)
        for (int i = 0; i < c->n; i++)
            if (!json_get(map, c->e[i].name)) {
                s = em_err(EM_ERR_ARG, "%s: shard '%s' holds tensor '%s', which '%s' does not list", fn,
                           c->shard_path[c->e[i].shard], c->e[i].name, path);
                break;
            }
    free(where);
    json_free(&root);
    return s;
}

/* true when path's file name is model-0000k-of-0000K.safetensors */
static bool looks_like_shard(const char *path, int *k, int *of)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char tail[32];
    return sscanf(base, "model-%5d-of-%5d%31s", k, of, tail) == 3 && !strcmp(tail, ".safetensors");
}

hf_ckpt *hf_ckpt_open(const char *path, const char *fn)
{
    if (!path) return em_fail(EM_ERR_ARG, "%s: path is NULL", fn);
    hf_ckpt *c = calloc(1, sizeof *c);
    if (!c) return em_fail(EM_ERR_OOM, "%s: out of memory", fn);
    char p[PATH_MAX];
    em_status s = EM_OK;
    int k, of;
    if (is_dir(path)) {
        snprintf(p, sizeof p, "%s/" HF_INDEX_NAME, path);
        if (!exists(p)) snprintf(p, sizeof p, "%s/" HF_SINGLE_NAME, path);
        if (!exists(p))
            s = em_err(EM_ERR_IO, "%s: '%s' holds neither " HF_INDEX_NAME " nor " HF_SINGLE_NAME, fn, path);
    } else {
        snprintf(p, sizeof p, "%s", path);
    }
    if (!s && ends_with(p, ".json")) {
        s = open_sharded(c, p, fn);
    } else if (!s && looks_like_shard(p, &k, &of) && of > 1) {
        s = em_err(
            EM_ERR_ARG,
            "%s: '%s' is shard %d of %d of a sharded checkpoint: pass its directory or its " HF_INDEX_NAME,
            fn, p, k, of);
    } else if (!s) {
        s = add_shard(c, p) < 0 ? em_last_status() : build_table(c, fn);
    }
    if (!s) return c;
    hf_ckpt_close(c);
    return NULL;
}
