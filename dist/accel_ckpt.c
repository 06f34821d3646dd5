/* accel_ckpt.c — checkpoint management around em_accel_save_state, as
 * Accelerate's ProjectConfiguration and save_model:
 *
 *   PROJECT/checkpoints/checkpoint_0, checkpoint_1, ...   em_accel_save_state(a, NULL)
 *
 * Automatic naming: rank 0 lists PROJECT/checkpoints, takes N = 1 + the
 * highest N of any entry named checkpoint_N (so a resumed run continues the
 * numbering), checks that what total_limit will remove afterwards is all
 * checkpoint directories (else nothing is saved), and tells every rank N;
 * then every rank calls em_accel_save_state(a, ".../checkpoint_N"), which
 * writes and publishes the directory whole (accel_state.c, checkpoint.c).
 * Only after that succeeded does rank 0 remove the oldest, manifest first
 * (ckpt_remove). "The newest complete checkpoint" is the highest N whose
 * directory has a manifest.json: a publish is atomic, so such a directory
 * is whole (ckpt_open still verifies every byte before a load uses it).
 *
 * em_accel_save_model: weights only, Hugging Face's file layout (one
 * model.safetensors, or model-0000k-of-0000K.safetensors shards and
 * model.safetensors.index.json), written by rank 0 into DIR.tmp-<id> and
 * published with the same manifest-and-swap as a checkpoint, so DIR never
 * holds shards of two saves. The other ranks wait in the final agreement.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include "dist/accel_impl.h"
#include "dist/checkpoint_impl.h"
#include "nn/hf_checkpoint_impl.h"
#include "nn/safetensors_impl.h"
#include "tensor/error_impl.h"
#include "tensor/fileio_impl.h"
#include "tensor/settings_impl.h"

#define SAVE "em_accel_save_state"
#define LOAD "em_accel_load_state"
#define MODEL "em_accel_save_model"
#define MODEL_FORMAT "ember-model-1"
#define SUBDIR "checkpoints"
#define PREFIX "checkpoint_"

/* ---- configuration ------------------------------------------------------------ */

em_status accel_ckpt_init(em_accelerator *a, const em_accel_config *cfg)
{
    const char *dir = cfg->project_dir, *src = "project_dir";
    if (!dir) {
        dir = getenv("EMBER_PROJECT_DIR");
        src = "EMBER_PROJECT_DIR";
    }
    if (dir && *dir) {
        /* room for /checkpoints/checkpoint_N and what a save puts beside it */
        if (strlen(dir) + 128 > sizeof a->project_dir)
            return em_err(EM_ERR_ARG, "em_accelerator_new: %s is too long (%zu bytes)", src, strlen(dir));
        snprintf(a->project_dir, sizeof a->project_dir, "%s", dir);
    }
    a->auto_naming = cfg->automatic_checkpoint_naming;
    em_status s;
    if (!a->auto_naming && (s = setting_env_bool("EMBER_AUTOMATIC_CHECKPOINT_NAMING", &a->auto_naming)))
        return s;
    if (cfg->total_limit < 0)
        return em_err(EM_ERR_ARG,
                      "em_accelerator_new: total_limit %d must be >= 0 (0 keeps every checkpoint)",
                      cfg->total_limit);
    a->total_limit = cfg->total_limit;
    const char *v = getenv("EMBER_SAVE_TOTAL_LIMIT");
    if (!a->total_limit && v && *v) {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end || x < 0 || x > INT_MAX)
            return em_err(EM_ERR_ARG,
                          "em_accelerator_new: EMBER_SAVE_TOTAL_LIMIT='%.64s' is not an integer >= 0", v);
        a->total_limit = (int)x;
    }
    if (a->auto_naming && !a->project_dir[0])
        return em_err(EM_ERR_ARG,
                      "em_accelerator_new: automatic_checkpoint_naming needs a project directory (set "
                      "em_accel_config.project_dir or EMBER_PROJECT_DIR)");
    return EM_OK;
}

/* ---- collectives ------------------------------------------------------------------ */

/* Every rank gets rank 0's v[0..2) (its decision). */
static em_status from_rank0(em_accelerator *a, int64_t v[2])
{
    if (a->world == 1) return EM_OK;
    em_scope sc = em_scope_begin();
    em_tensor *t = em_empty(EM_I32, 1, (int64_t[]){4});
    if (t) memcpy(em_data(t), v, 2 * sizeof *v);
    em_status s = t ? em_broadcast(a->pg, t, 0, NULL) : em_last_status();
    if (!s) memcpy(v, em_data(t), 2 * sizeof *v);
    em_scope_end(sc);
    return s;
}

/* ---- the checkpoints directory ---------------------------------------------------- */

/* (accel_ckpt_init leaves room in the project directory's name for these) */
static void root_dir(const em_accelerator *a, char *buf, size_t n)
{
    if (snprintf(buf, n, "%s/" SUBDIR, a->project_dir) >= (int)n) buf[n - 1] = '\0';
}

static void numbered(char *buf, size_t n, const char *root, int64_t k)
{
    if (snprintf(buf, n, "%s/" PREFIX "%" PRId64, root, k) >= (int)n) buf[n - 1] = '\0';
}

/* dir/name (dir from ckpt_dir_name, which leaves room for a file name) */
static void path_in(char *buf, size_t n, const char *dir, const char *name)
{
    if (snprintf(buf, n, "%s/%s", dir, name) >= (int)n) buf[n - 1] = '\0';
}

/* N of a name checkpoint_N (decimal, no sign, no leading zero, at most 18
 * digits), or -1. */
static int64_t checkpoint_number(const char *name)
{
    size_t np = strlen(PREFIX);
    if (strncmp(name, PREFIX, np)) return -1;
    const char *d = name + np;
    size_t k = strspn(d, "0123456789");
    if (k == 0 || d[k] || k > 18 || (k > 1 && d[0] == '0')) return -1;
    return strtoll(d, NULL, 10);
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* The N of every entry of root named checkpoint_N, ascending (malloc'd; a
 * missing root has none). */
static em_status list_numbers(const char *root, int64_t **out, int *count, const char *fn)
{
    *out = NULL;
    *count = 0;
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return EM_OK;
        return em_err(EM_ERR_IO, "%s: cannot read directory %s: %s", fn, root, strerror(errno));
    }
    int cap = 0;
    em_status s = EM_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        int64_t k = checkpoint_number(e->d_name);
        if (k < 0) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *p = realloc(*out, sizeof *p * (size_t)cap);
            if (!p) {
                s = em_err(EM_ERR_OOM, "%s: out of memory", fn);
                break;
            }
            *out = p;
        }
        (*out)[(*count)++] = k;
    }
    closedir(d);
    if (s) {
        free(*out);
        *out = NULL;
        *count = 0;
        return s;
    }
    if (*count) qsort(*out, (size_t)*count, sizeof **out, cmp_i64);
    return EM_OK;
}

/* The highest N whose checkpoint_N is a directory with a manifest: 1 and
 * *k, 0 when there is none, -1 on error. */
static int latest_number(const char *root, int64_t *k, const char *fn)
{
    int64_t *nums;
    int count;
    if (list_numbers(root, &nums, &count, fn)) return -1;
    int found = 0;
    for (int i = count - 1; i >= 0 && !found; i--) {
        char path[PATH_MAX], man[PATH_MAX + 32];
        numbered(path, sizeof path, root, nums[i]);
        snprintf(man, sizeof man, "%s/" CKPT_MANIFEST, path);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && access(man, F_OK) == 0) {
            *k = nums[i];
            found = 1;
        }
    }
    free(nums);
    return found;
}

/* mkdir -p path. */
static em_status make_dirs(const char *path, const char *fn)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c != '\0') continue;
        char keep = *c;
        *c = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return em_err(EM_ERR_IO, "%s: cannot create directory %s: %s", fn, p, strerror(errno));
        *c = keep;
        if (!keep) break;
    }
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        return em_err(EM_ERR_IO, "%s: %s exists and is not a directory", fn, p);
    return EM_OK;
}

int em_accel_latest_checkpoint(const em_accelerator *a, char *buf, size_t n)
{
    if (!a || !buf || n == 0) {
        em_err(EM_ERR_ARG, "em_accel_latest_checkpoint: %s is NULL", a ? "buf" : "accelerator");
        return -1;
    }
    buf[0] = '\0';
    if (!a->project_dir[0]) {
        em_err(EM_ERR_ARG, "em_accel_latest_checkpoint: no project directory (em_accel_config.project_dir or "
                           "EMBER_PROJECT_DIR)");
        return -1;
    }
    char root[PATH_MAX], path[PATH_MAX];
    root_dir(a, root, sizeof root);
    int64_t k = 0;
    int r = latest_number(root, &k, "em_accel_latest_checkpoint");
    if (r <= 0) return r;
    numbered(path, sizeof path, root, k);
    if (strlen(path) >= n) {
        em_err(EM_ERR_ARG, "em_accel_latest_checkpoint: %s needs %zu bytes, the buffer has %zu", path,
               strlen(path) + 1, n);
        return -1;
    }
    snprintf(buf, n, "%s", path);
    return 1;
}

static em_status naming_off(const char *fn)
{
    return em_err(
        EM_ERR_ARG,
        "%s: the directory is NULL and automatic_checkpoint_naming is off (name a directory, or set "
        "project_dir and automatic_checkpoint_naming in em_accel_config)",
        fn);
}

/* Rank 0's plan for a save: the next N, and how many of the oldest go once
 * it is published (each checked to be a checkpoint now, before anything is
 * written). */
static em_status plan_save(em_accelerator *a, const char *root, int64_t **nums, int *count, int64_t *next,
                           int *nremove)
{
    em_status s = make_dirs(root, SAVE);
    if (!s) s = list_numbers(root, nums, count, SAVE);
    if (s) return s;
    *next = *count ? (*nums)[*count - 1] + 1 : 0;
    if (*next > 999999999999999999LL)
        return em_err(EM_ERR_IO, "%s: %s: checkpoint numbers are exhausted", SAVE, root);
    *nremove = a->total_limit > 0 && *count + 1 > a->total_limit ? *count + 1 - a->total_limit : 0;
    for (int i = 0; i < *nremove && !s; i++) {
        char path[PATH_MAX];
        numbered(path, sizeof path, root, (*nums)[i]);
        if ((s = ckpt_check_removable(path, SAVE)))
            s = em_err(
                EM_ERR_IO,
                "%s; total_limit %d would remove it after this save, so nothing was saved (move it out "
                "of %s)",
                em_last_error(), a->total_limit, root);
    }
    return s;
}

em_status accel_save_auto(em_accelerator *a)
{
    if (!a->auto_naming) return naming_off(SAVE);
    char root[PATH_MAX], path[PATH_MAX];
    root_dir(a, root, sizeof root);
    int64_t *nums = NULL, next = 0;
    int count = 0, nremove = 0;
    em_status s = EM_OK;
    if (a->rank == 0) s = plan_save(a, root, &nums, &count, &next, &nremove);
    int64_t plan[2] = {s != EM_OK, next};
    if (!(s = accel_agree(a, s, SAVE))) s = from_rank0(a, plan);
    if (!s) {
        numbered(path, sizeof path, root, plan[1]);
        s = em_accel_save_state(a, path); /* collective; whole or absent */
    }
    /* the new checkpoint is published: now the oldest may go */
    for (int i = 0; !s && a->rank == 0 && i < nremove; i++) {
        numbered(path, sizeof path, root, nums[i]);
        s = ckpt_remove(path, SAVE);
    }
    free(nums);
    return accel_agree(a, s, SAVE);
}

em_status accel_load_auto(em_accelerator *a)
{
    if (!a->auto_naming) return naming_off(LOAD);
    char root[PATH_MAX], path[PATH_MAX];
    root_dir(a, root, sizeof root);
    int64_t plan[2] = {0, 0}; /* {1 found / 0 none / -1 failed, N} */
    if (a->rank == 0) plan[0] = latest_number(root, &plan[1], LOAD);
    held_error h;
    error_hold(&h, EM_ERR_IO);
    em_status s = from_rank0(a, plan);
    if (s) return s;
    if (plan[0] < 0)
        return a->rank == 0
                   ? error_restore(&h)
                   : em_err(EM_ERR_DIST, "%s: rank 0 cannot read %s (its error says why)", LOAD, root);
    if (plan[0] == 0)
        return em_err(EM_ERR_IO,
                      "%s: no complete checkpoint in %s (automatic naming loads the newest checkpoint_N "
                      "directory holding a " CKPT_MANIFEST ")",
                      LOAD, root);
    numbered(path, sizeof path, root, plan[1]);
    return em_accel_load_state(a, path);
}

/* ---- save_model ------------------------------------------------------------------- */

static bool is_float(em_dtype dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16; }

/* The files of the save into tmp (rank 0): shards of the n tensors v (bytes[i]
 * each) and, when there are several, the index. m->files gets their sums. */
static em_status write_files(const char *tmp, int n, const em_named *v, const uint64_t *bytes, int64_t max,
                             ckpt_manifest *m)
{
    int *shard = malloc(sizeof *shard * (size_t)(n + 1));
    char(*file)[CKPT_NAME_MAX] = malloc(sizeof *file * (size_t)(n + 1));
    em_status s = shard && file ? EM_OK : em_err(EM_ERR_OOM, MODEL ": out of memory");
    int nshard = 1, in_shard = 0;
    uint64_t cur = 0, total = 0;
    for (int i = 0; !s && i < n; i++) { /* a new file when the next tensor would overflow a non-empty one */
        if (max > 0 && in_shard > 0 && cur + bytes[i] > (uint64_t)max) nshard++, cur = 0, in_shard = 0;
        shard[i] = nshard - 1;
        cur += bytes[i];
        total += bytes[i];
        in_shard++;
    }
    if (!s && !(m->files = calloc((size_t)nshard + 1, sizeof *m->files)))
        s = em_err(EM_ERR_OOM, MODEL ": out of memory");
    char path[PATH_MAX];
    for (int k = 0, first = 0; !s && k < nshard; k++) {
        int end = first;
        while (end < n && shard[end] == k) end++;
        ckpt_entry *e = &m->files[m->n];
        if (nshard == 1)
            snprintf(e->name, sizeof e->name, HF_SINGLE_NAME);
        else
            snprintf(e->name, sizeof e->name, "model-%05d-of-%05d.safetensors", k + 1, nshard);
        for (int i = first; i < end; i++) snprintf(file[i], CKPT_NAME_MAX, "%s", e->name);
        path_in(path, sizeof path, tmp, e->name);
        s = st_save(path, end - first, v + first, "{\"format\":\"pt\"}", &e->sum);
        if (!s) m->n++;
        first = end;
    }
    if (!s && nshard > 1) { /* HF's index (nn/hf_checkpoint.c) */
        ckpt_entry *e = &m->files[m->n];
        const char **names = malloc(sizeof *names * (size_t)(2 * n + 1));
        for (int i = 0; names && i < n; i++) names[i] = v[i].name, names[n + i] = file[i];
        snprintf(e->name, sizeof e->name, HF_INDEX_NAME);
        path_in(path, sizeof path, tmp, e->name);
        s = names ? hf_index_write(path, n, names, names + n, total, &e->sum, MODEL)
                  : em_err(EM_ERR_OOM, MODEL ": out of memory");
        free(names);
        if (!s) m->n++;
    }
    free(shard);
    free(file);
    return s;
}

/* Rank 0's whole save: the tensors (converted to the dtype asked for), the
 * files into DIR.tmp-<id>, the manifest and the publishing swap. */
static em_status save_model_main(em_accelerator *a, em_module *model, const char *dir,
                                 const em_save_model_config *c)
{
    int np = em_module_params(model, NULL, 0), nb = em_module_buffers(model, NULL, 0);
    if (np < 0 || nb < 0) return em_last_status();
    int n = np + nb;
    em_named *v = malloc(sizeof *v * (size_t)(n + 1));
    uint64_t *bytes = malloc(sizeof *bytes * (size_t)(n + 1));
    if (!v || !bytes) {
        free(v);
        free(bytes);
        return em_err(EM_ERR_OOM, MODEL ": out of memory");
    }
    em_module_params(model, v, np);
    em_module_buffers(model, v + np, nb);
    em_scope sc = em_scope_begin();
    bool grad = em_set_grad_enabled(false);
    em_status s = EM_OK;
    for (int i = 0; i < n && !s; i++) {
        em_dtype dt = em_dtype_of(v[i].t);
        if (c->dtype != EM_F32 && is_float(dt) && dt != c->dtype && !(v[i].t = em_cast(v[i].t, c->dtype)))
            s = em_last_status();
        if (!s) bytes[i] = (uint64_t)em_numel(v[i].t) * em_dtype_size(em_dtype_of(v[i].t));
    }
    char d[PATH_MAX], tmp[PATH_MAX];
    ckpt_manifest m = {.id = ckpt_new_id(), .world = a->world, .steps = a->steps};
    bool begun = false;
    if (!s) s = ckpt_dir_name(dir, true, d, sizeof d, MODEL);
    if (!s) {
        ckpt_tmp_dir(d, m.id, tmp, sizeof tmp);
        begun = !(s = ckpt_begin(d, tmp, MODEL));
    }
    if (!s) s = write_files(tmp, n, v, bytes, c->max_shard_size, &m);
    if (!s) s = ckpt_finish(d, tmp, &m, MODEL_FORMAT, MODEL);
    if (s && begun) ckpt_abandon(tmp);
    ckpt_manifest_free(&m);
    em_set_grad_enabled(grad);
    em_scope_end(sc);
    free(v);
    free(bytes);
    return s;
}

em_status em_accel_save_model(em_accelerator *a, em_module *model, const char *dir,
                              const em_save_model_config *cfg)
{
    if (!a) return em_err(EM_ERR_ARG, MODEL ": accelerator is NULL");
    em_save_model_config c = cfg ? *cfg : (em_save_model_config){0};
    em_status s = EM_OK;
    if (!model || !dir || !*dir)
        s = em_err(EM_ERR_ARG, MODEL ": %s",
                   !model ? "model is NULL"
                   : !dir ? "dir is NULL"
                          : "dir is empty");
    else if (c.max_shard_size < 0)
        s = em_err(EM_ERR_ARG, MODEL ": max_shard_size %" PRId64 " must be >= 0 (0 = one file)",
                   c.max_shard_size);
    else if (c.dtype != EM_F32 && c.dtype != EM_F16 && c.dtype != EM_BF16)
        s = em_err(EM_ERR_ARG, MODEL ": dtype %s: want f32 (as held), f16 or bf16", em_dtype_name(c.dtype));
    /* ZeRO-3: every rank first makes the parameters whole (collective) */
    em_status g = em_accel_gather_params(a);
    if (!s) s = g;
    if (!s && a->rank == 0) s = save_model_main(a, model, dir, &c);
    return accel_agree(a, s, MODEL); /* the other ranks wait here for the main process */
}
