/* accel_state.c — em_accel_save_state / em_accel_load_state: everything a
 * run needs to continue exactly where it stopped, on as many processes as
 * saved it or on another number.
 *
 *   DIR/model.safetensors      parameters and buffers      (rank 0 writes)
 *     or, under ZeRO stage 3, DIR/model.rank_R.safetensors: each rank's
 *     pieces of the parameters, no rank gathering the model
 *     (dist/checkpoint_model.c has the format and how a load reads it)
 *   DIR/optimizer.safetensors  em_optim_state               (rank 0 writes)
 *     or, under ZeRO, DIR/optimizer.rank_R.safetensors: each rank's shard
 *     (dist/checkpoint_optim.c has the format and how a load re-shards)
 *   DIR/rank_R.json            this rank's counters: world size, optimizer
 *                              steps, micro-step, loader position and global
 *                              batch, sampler state and batch, loss scaler,
 *                              default and registered generators, the save
 *                              id (each rank)
 *   DIR/manifest.json          written last by rank 0: every file above with
 *                              its size and crc32, the save id, world size
 *                              and steps (dist/checkpoint.c)
 *
 * Model and optimizer state are the same on every rank under DDP, so one copy
 * serves all (under ZeRO the optimizer state is not: each rank saves its
 * pieces'); the counters and generators are per rank. Numbers are written
 * as decimal strings (generator seeds are full 64-bit).
 *
 * A save is whole or absent: rank 0 makes a save id and the directory
 * DIR.tmp-<id>, every rank writes its files there, the ranks agree that all
 * succeeded, and rank 0 reads the rank files back (the ranks share the file
 * system, as a load assumes too), writes the manifest and publishes the
 * directory as DIR in one atomic rename (checkpoint.c). The previous DIR
 * stays whole until then. A load first verifies the manifest and every file
 * it names on every rank, then plans its part (below), then checks that all
 * ranks verified the same save id, and only then changes anything. Saving
 * and loading are collective: the ranks agree at the end whether every one
 * of them succeeded.
 *
 * Loading, by W' ranks, a save of W ranks (W from rank_0.json):
 *  - same on every rank, taken from rank 0's file: steps, micro-step, the
 *    window sampler (it is global: every rank advances it by the whole
 *    batch), the loss scaler. Each rank also verifies saved ranks rank,
 *    rank + W', ... against rank 0's file, so together they check every file
 *    of the save; a difference is an error naming both files.
 *  - the loader: with W' = W each rank's own position. Otherwise the
 *    position is converted through the examples consumed (batch b of epoch e
 *    = b global batches of e's order), which needs the same global batch G
 *    (else an error saying which batch_size keeps it) and, when the world
 *    changes, the same position in every saved file.
 *  - per-rank generators (the default one, registered ones such as dropout):
 *    rank r continues saved rank r % W's. A generator that was alike on
 *    every saved rank stays alike (exact); one that differed per rank cannot
 *    be mapped exactly, and its draws (dropout masks) then differ from an
 *    uninterrupted run of either size.
 *  - the models: the whole file as it is (module_load); at ZeRO stage 3
 *    this rank's chunks only, from the shards or the whole file, after
 *    which every bucket counts as not whole (the next op gathers it);
 *    below stage 3 from shards, every tensor assembled whole.
 *  - the optimizers' state: each rank assembles the state of its own
 *    pieces (ZeRO) or whole parameters from the files that hold them, the
 *    whole-state file or the shards that overlap (dist/checkpoint_optim.c),
 *    during the checks, so a bad shard fails the load before any change.
 *  - a save made mid-accumulation (micro-step != 0) resumes only at W: the
 *    window's partial gradients were summed per rank (no_sync) and cannot
 *    be shared out over another number of ranks.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist/accel_impl.h"
#include "dist/checkpoint_impl.h"
#include "dist/checkpoint_model_impl.h"
#include "dist/checkpoint_optim_impl.h"
#include "dist/zero_impl.h"
#include "nn/json_impl.h"
#include "nn/safetensors_impl.h"
#include "tensor/fileio_impl.h"
#include "tensor/kernel_impl.h"
#include "tensor/tensor_impl.h"

#define STATE_FORMAT CKPT_STATE_FORMAT
#define SAVE "em_accel_save_state"
#define LOAD "em_accel_load_state"

/* dir/file (the directories come from ckpt_dir_name, which leaves room for a file name) */
static void path_in(char *buf, size_t n, const char *dir, const char *file)
{
    if (snprintf(buf, n, "%s/%s", dir, file) >= (int)n) buf[n - 1] = '\0';
}

/* The rank file's key for field of loader k: "loader.epoch", "loader_1.epoch", ... */
static void loader_key(char *buf, size_t n, int k, const char *field)
{
    if (k == 0)
        snprintf(buf, n, "loader.%s", field);
    else
        snprintf(buf, n, "loader_%d.%s", k, field);
}

/* The rank file's key of generator `name` of model k: "module_rng.K.NAME" */
static void module_rng_key(char *buf, size_t n, int k, const char *name)
{
    if (snprintf(buf, n, "module_rng.%d.%s", k, name) >= (int)n) buf[n - 1] = '\0';
}

/* Every rank learns whether any rank failed; a local failure keeps its own
 * message, the others name the failing rank. */
em_status accel_agree(em_accelerator *a, em_status mine, const char *what)
{
    if (a->world == 1) return mine;
    held_error h;
    error_hold(&h, mine);
    int64_t one = 1;
    em_scope sc = em_scope_begin();
    em_tensor *f = em_full(EM_I32, 1, &one, mine != EM_OK ? a->rank + 1 : 0);
    em_status s = f ? em_all_reduce(a->pg, f, EM_RED_MAX, NULL) : em_last_status();
    int bad = s == EM_OK ? ((int32_t *)em_data(f))[0] : 0;
    em_scope_end(sc);
    if (mine != EM_OK) return error_restore(&h);
    if (s != EM_OK) return s;
    if (bad) return em_err(EM_ERR_DIST, "%s: rank %d failed (its error says why)", what, bad - 1);
    return EM_OK;
}

static void put_u64(jbuf *b, const char *key, uint64_t v, bool last)
{
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64, v);
    jb_puts(b, "  ");
    jb_str(b, key);
    jb_puts(b, ": ");
    jb_str(b, num);
    jb_puts(b, last ? "\n" : ",\n");
}

static void put_rng(jbuf *b, const char *name, const em_rng *r)
{
    char key[1300];
    snprintf(key, sizeof key, "%s.seed", name);
    put_u64(b, key, r->seed, false);
    snprintf(key, sizeof key, "%s.offset", name);
    put_u64(b, key, r->offset, false);
}

static em_status save_counters(em_accelerator *a, const char *dir, uint64_t id)
{
    jbuf b = {0};
    char hex[17];
    ckpt_id_hex(id, hex);
    jb_puts(&b, "{\n");
    jb_puts(&b, "  \"format\": ");
    jb_str(&b, STATE_FORMAT);
    jb_puts(&b, ",\n  \"save_id\": ");
    jb_str(&b, hex);
    jb_puts(&b, ",\n");
    put_u64(&b, "world", (uint64_t)a->world, false);
    put_u64(&b, "rank", (uint64_t)a->rank, false);
    put_u64(&b, "steps", (uint64_t)a->steps, false);
    put_u64(&b, "micro", (uint64_t)a->micro, false);
    put_u64(&b, "models", (uint64_t)a->nmodels, false);
    put_u64(&b, "optimizers", (uint64_t)a->nopts, false);
    put_u64(&b, "loaders", (uint64_t)a->nloaders, false);
    for (int k = 0; k < a->nloaders; k++) {
        em_loader_pos p = em_loader_position(a->loaders[k]);
        char key[64];
        loader_key(key, sizeof key, k, "epoch");
        put_u64(&b, key, (uint64_t)p.epoch, false);
        loader_key(key, sizeof key, k, "batch");
        put_u64(&b, key, (uint64_t)p.batch, false);
        loader_key(key, sizeof key, k, "global_batch");
        put_u64(&b, key, (uint64_t)em_loader_global_batch(a->loaders[k]), false);
    }
    if (a->sampler) {
        put_rng(&b, "sampler", &a->sampler->rng);
        put_u64(&b, "sampler.batch", (uint64_t)a->sampler->batch, false);
    }
    if (a->scaler) { /* the scale as the exact double, and its clean-step count */
        em_scaler_state ss = em_scaler_get_state(a->scaler);
        char num[40];
        snprintf(num, sizeof num, "%.17g", ss.scale);
        jb_puts(&b, "  \"scaler.scale\": ");
        jb_str(&b, num);
        jb_puts(&b, ",\n");
        put_u64(&b, "scaler.growth_tracker", (uint64_t)ss.growth_tracker, false);
    }
    put_rng(&b, "default_rng", em_default_rng());
    /* the generators the prepared models' modules own (dropout's), by name */
    for (int k = 0; k < a->nmodels && !b.oom; k++) {
        int n = em_module_rngs(a->models[k], NULL, 0);
        em_named_rng *r = calloc((size_t)n + 1, sizeof *r);
        if (!r) {
            b.oom = true;
            break;
        }
        em_module_rngs(a->models[k], r, n);
        char key[1200];
        snprintf(key, sizeof key, "module_rngs.%d", k);
        put_u64(&b, key, (uint64_t)n, false);
        for (int i = 0; i < n; i++) {
            module_rng_key(key, sizeof key, k, r[i].name);
            put_rng(&b, key, r[i].rng);
        }
        free(r);
    }
    for (int i = 0; i < a->nrngs; i++) {
        char name[32];
        snprintf(name, sizeof name, "rng.%d", i);
        put_rng(&b, name, a->rngs[i]);
    }
    put_u64(&b, "rngs", (uint64_t)a->nrngs, true);
    jb_puts(&b, "}\n");
    if (b.oom) {
        free(b.p);
        return em_err(EM_ERR_OOM, "em_accel_save_state: out of memory");
    }
    char file[64], path[4096];
    snprintf(file, sizeof file, "rank_%d.json", a->rank);
    path_in(path, sizeof path, dir, file);
    em_status s = file_write_atomic(path, b.p, b.len, "em_accel_save_state");
    free(b.p);
    return s;
}

/* Every rank gets rank 0's save id. */
static em_status share_id(em_accelerator *a, uint64_t *id)
{
    if (a->world == 1) return EM_OK;
    em_scope sc = em_scope_begin();
    em_tensor *t = em_empty(EM_I32, 1, (int64_t[]){2});
    if (t) memcpy(em_data(t), id, sizeof *id);
    em_status s = t ? em_broadcast(a->pg, t, 0, NULL) : em_last_status();
    if (!s) memcpy(id, em_data(t), sizeof *id);
    em_scope_end(sc);
    return s;
}

/* Whether the model is saved one shard per rank (ZeRO stage 3: no rank
 * holds it whole; dist/checkpoint_model.c). */
static bool model_sharded(const em_accelerator *a) { return a->zero && a->zero_stage == 3; }

/* For each tensor of model 0 (parameters, then buffers: *n): this rank's
 * share of it at ZeRO stage 3 (the part in its chunks, dist/zero.c), else
 * the whole of it; a tensor in no bucket is whole on every rank, and for a
 * save (`save`) only rank 0 writes it. */
static ckpt_range *shares_of(em_accelerator *a, bool save, int *n, const char *fn)
{
    em_module *m = a->models[0];
    int np = em_module_params(m, NULL, 0), nb = em_module_buffers(m, NULL, 0);
    em_named *v = calloc((size_t)(np + nb) + 1, sizeof *v);
    ckpt_range *r = calloc((size_t)(np + nb) + 1, sizeof *r);
    if (!v || !r) {
        free(v);
        free(r);
        return em_fail(EM_ERR_OOM, "%s: out of memory", fn);
    }
    em_module_params(m, v, np);
    em_module_buffers(m, v + np, nb);
    for (int i = 0; i < np + nb; i++) {
        if (i < np && model_sharded(a) && zero_param_share(a->zero, v[i].t, &r[i].lo, &r[i].n)) continue;
        r[i] = (ckpt_range){0, save && a->rank != 0 ? 0 : em_numel(v[i].t)};
    }
    free(v);
    *n = np + nb;
    return r;
}

/* Rank 0, once every rank wrote its files into tmp: the manifest (its own
 * files' sums as they were written; the rank files and the other ranks'
 * model and optimizer shards read back) and the publishing rename. */
static em_status finish_save(em_accelerator *a, const char *dir, const char *tmp, uint64_t id,
                             const ckpt_entry *mine, int nmine)
{
    int nsharded = model_sharded(a);
    for (int k = 0; k < a->nopts; k++) nsharded += ckpt_optim_is_sharded(a->opts[k]);
    ckpt_manifest m = {
        .id = id, .world = a->world, .steps = a->steps, .n = nmine + a->world + nsharded * (a->world - 1)};
    m.files = calloc((size_t)m.n, sizeof *m.files);
    if (!m.files) return em_err(EM_ERR_OOM, SAVE ": out of memory");
    memcpy(m.files, mine, sizeof *mine * (size_t)nmine);
    em_status s = EM_OK;
    int at = nmine;
    for (int r = 0; r < a->world && !s; r++) {
        ckpt_entry *e = &m.files[at++];
        snprintf(e->name, sizeof e->name, "rank_%d.json", r);
        char path[4096];
        path_in(path, sizeof path, tmp, e->name);
        s = file_checksum(path, &e->sum, SAVE);
    }
    for (int k = -1; k < a->nopts && !s; k++) { /* -1: the model's shards */
        if (k < 0 ? !model_sharded(a) : !ckpt_optim_is_sharded(a->opts[k])) continue;
        for (int r = 1; r < a->world && !s; r++) {
            ckpt_entry *e = &m.files[at++];
            if (k < 0)
                ckpt_model_file(e->name, sizeof e->name, 0, r);
            else
                ckpt_optim_file(e->name, sizeof e->name, k, r);
            char path[4096];
            path_in(path, sizeof path, tmp, e->name);
            s = file_checksum(path, &e->sum, SAVE);
        }
    }
    if (!s) s = ckpt_finish(dir, tmp, &m, STATE_FORMAT, SAVE);
    ckpt_manifest_free(&m);
    return s;
}

em_status em_accel_save_state(em_accelerator *a, const char *dir)
{
    if (a && !dir) return accel_save_auto(a); /* automatic naming: dist/accel_ckpt.c */
    if (!a || !dir || !*dir)
        return em_err(EM_ERR_ARG, "em_accel_save_state: %s", a ? "directory is empty" : "accelerator is NULL");
    em_status s = em_barrier(a->pg, NULL); /* every rank has finished the step */
    if (s) return s;
    char d[4096], tmp[4096], path[4096];
    if ((s = accel_agree(a, ckpt_dir_name(dir, true, d, sizeof d, SAVE), SAVE))) return s;
    uint64_t id = 0;
    if (a->rank == 0) {
        id = ckpt_new_id();
        ckpt_tmp_dir(d, id, tmp, sizeof tmp);
        s = ckpt_begin(d, tmp, SAVE);
    }
    if ((s = accel_agree(a, s, SAVE))) return s;
    if ((s = accel_agree(a, share_id(a, &id), SAVE))) {
        if (a->rank == 0) ckpt_abandon(tmp);
        return s;
    }
    ckpt_tmp_dir(d, id, tmp, sizeof tmp);
    ckpt_entry mine[2 * MAX_PREPARED];
    int nmine = 0;
    /* a model: rank 0 writes it whole; under ZeRO stage 3 each rank writes
     * its shard, and no rank gathers it (dist/checkpoint_model.c) */
    ckpt_shard_id sid = {.save_id = id, .world = a->world, .rank = a->rank, .stage = a->zero_stage};
    for (int k = 0; k < a->nmodels && !s; k++) {
        if (!model_sharded(a) && a->rank != 0) continue;
        ckpt_entry e;
        ckpt_model_file(e.name, sizeof e.name, k, model_sharded(a) ? a->rank : -1);
        path_in(path, sizeof path, tmp, e.name);
        if (model_sharded(a)) {
            int n = 0;
            ckpt_range *share = shares_of(a, true, &n, SAVE);
            s = share ? ckpt_model_save(a->models[k], share, path, &sid, &e.sum, SAVE) : em_last_status();
            free(share);
        } else {
            s = module_save(a->models[k], path, &e.sum);
        }
        if (a->rank == 0) mine[nmine++] = e;
    }
    /* an optimizer's state: rank 0 writes the whole of it; under ZeRO each
     * rank writes its shard (dist/checkpoint_optim.c) */
    for (int k = 0; k < a->nopts && !s; k++) {
        bool sharded = ckpt_optim_is_sharded(a->opts[k]);
        if (!sharded && a->rank != 0) continue;
        ckpt_entry e;
        ckpt_optim_file(e.name, sizeof e.name, k, sharded ? a->rank : -1);
        path_in(path, sizeof path, tmp, e.name);
        s = ckpt_optim_save(a->opts[k], path, sharded ? &sid : NULL, &e.sum, SAVE);
        if (a->rank == 0) mine[nmine++] = e;
    }
    if (!s) s = save_counters(a, tmp, id);
    s = accel_agree(a, s, SAVE); /* every rank's files are in tmp */
    if (a->rank == 0) {
        if (!s) s = finish_save(a, d, tmp, id, mine, nmine);
        if (s) ckpt_abandon(tmp);
    }
    return accel_agree(a, s, SAVE);
}

/* ---- loading ---------------------------------------------------------------------- */

typedef struct counters {
    char path[4096]; /* the file they came from, for messages */
    int64_t world, rank, steps, micro, nrngs;
    /* prepared models, optimizers, loaders; -1: not recorded (an older
     * ember, which prepared at most one of each) */
    int64_t nmodels, nopts, nloaders;
    int64_t sampler_batch; /* -1: not recorded (saved before world changes were allowed) */
    bool has_sampler, has_scaler;
    em_scaler_state scaler;
    em_loader_pos pos[MAX_PREPARED];
    int64_t global_batch[MAX_PREPARED]; /* -1: not recorded */
    em_rng sampler, def, rngs[MAX_RNGS];
    jval root; /* the whole file, for the modules' generators by name */
    bool has_root;
} counters;

static void counters_free(counters *c)
{
    if (c->has_root) json_free(&c->root);
    c->has_root = false;
}

static em_status get_u64(const jval *o, const char *path, const char *key, uint64_t *out)
{
    const jval *v = json_get(o, key);
    if (!v || v->kind != J_STR)
        return em_err(EM_ERR_IO, "em_accel_load_state: %s: \"%s\" is missing or not a string", path, key);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v->s, &end, 10);
    if (errno || *end || !*v->s || v->s[0] == '-')
        return em_err(EM_ERR_IO, "em_accel_load_state: %s: \"%s\" is '%s', not a count", path, key, v->s);
    *out = x;
    return EM_OK;
}

static em_status get_i64(const jval *o, const char *path, const char *key, int64_t *out)
{
    uint64_t x = 0;
    em_status s = get_u64(o, path, key, &x);
    if (s) return s;
    if (x > (uint64_t)INT64_MAX) return em_err(EM_ERR_IO, "em_accel_load_state: %s: \"%s\" is too large", path, key);
    *out = (int64_t)x;
    return EM_OK;
}

/* An optional count: -1 when the key is absent. */
static em_status get_opt_i64(const jval *o, const char *path, const char *key, int64_t *out)
{
    *out = -1;
    return json_get(o, key) ? get_i64(o, path, key, out) : EM_OK;
}

static em_status get_rng(const jval *o, const char *path, const char *name, em_rng *r)
{
    char key[1300];
    snprintf(key, sizeof key, "%s.seed", name);
    em_status s = get_u64(o, path, key, &r->seed);
    snprintf(key, sizeof key, "%s.offset", name);
    return s ? s : get_u64(o, path, key, &r->offset);
}

/* Parses one rank's counters file (any rank's: a load reads rank 0's, the
 * one whose generators this rank continues, and those it verifies) into *c,
 * checking only the file itself; what it means for this run comes later. */
static em_status read_counters(const char *path, counters *c)
{
    char *text = NULL;
    size_t n = 0;
    em_status s = file_read_all(path, 1 << 24, &text, &n, "em_accel_load_state");
    if (s) return s;
    jval root;
    char err[128];
    bool ok = json_parse(text, n, &root, err, sizeof err);
    free(text);
    if (!ok) return em_err(EM_ERR_IO, "em_accel_load_state: %s is not valid JSON: %s", path, err);
    const jval *fmt = json_get(&root, "format");
    if (root.kind != J_OBJ || !fmt || fmt->kind != J_STR || strcmp(fmt->s, STATE_FORMAT)) {
        json_free(&root);
        return em_err(EM_ERR_IO, "em_accel_load_state: %s is not an ember accelerator state (format)", path);
    }
    *c = (counters){0};
    c->root = root;
    c->has_root = true;
    snprintf(c->path, sizeof c->path, "%s", path);
    s = get_i64(&root, path, "world", &c->world);
    if (!s) s = get_i64(&root, path, "rank", &c->rank);
    if (!s) s = get_i64(&root, path, "steps", &c->steps);
    if (!s) s = get_i64(&root, path, "micro", &c->micro);
    if (!s) s = get_i64(&root, path, "rngs", &c->nrngs);
    if (!s && c->nrngs > MAX_RNGS)
        s = em_err(EM_ERR_IO,
                   "em_accel_load_state: %s: %lld generators, more than the %d an accelerator keeps", path,
                   (long long)c->nrngs, MAX_RNGS);
    if (!s) s = get_rng(&root, path, "default_rng", &c->def);
    if (!s) s = get_opt_i64(&root, path, "models", &c->nmodels);
    if (!s) s = get_opt_i64(&root, path, "optimizers", &c->nopts);
    if (!s) s = get_opt_i64(&root, path, "loaders", &c->nloaders);
    if (!s && c->nloaders < 0) c->nloaders = json_get(&root, "loader.epoch") != NULL; /* an older save */
    if (!s && (c->nmodels > MAX_PREPARED || c->nopts > MAX_PREPARED || c->nloaders > MAX_PREPARED))
        s = em_err(EM_ERR_IO, "em_accel_load_state: %s: more than %d models, optimizers or loaders", path,
                   MAX_PREPARED);
    c->has_sampler = json_get(&root, "sampler.seed") != NULL;
    const jval *sc = json_get(&root, "scaler.scale");
    c->has_scaler = sc != NULL;
    if (!s && sc) {
        char *end = NULL;
        c->scaler.scale = sc->kind == J_STR ? strtod(sc->s, &end) : 0;
        if (!end || *end || !(c->scaler.scale > 0))
            s = em_err(EM_ERR_IO, "em_accel_load_state: %s: \"scaler.scale\" is not a positive number", path);
        if (!s) s = get_i64(&root, path, "scaler.growth_tracker", &c->scaler.growth_tracker);
    }
    for (int k = 0; !s && k < c->nloaders; k++) {
        char key[64];
        loader_key(key, sizeof key, k, "epoch");
        s = get_i64(&root, path, key, &c->pos[k].epoch);
        loader_key(key, sizeof key, k, "batch");
        if (!s) s = get_i64(&root, path, key, &c->pos[k].batch);
        loader_key(key, sizeof key, k, "global_batch");
        if (!s) s = get_opt_i64(&root, path, key, &c->global_batch[k]);
        if (!s && c->global_batch[k] == 0)
            s = em_err(EM_ERR_IO, "em_accel_load_state: %s: a global batch of 0", path);
    }
    if (!s && c->has_sampler) s = get_rng(&root, path, "sampler", &c->sampler);
    if (!s) s = get_opt_i64(&root, path, "sampler.batch", &c->sampler_batch);
    if (!s && c->sampler_batch == 0)
        s = em_err(EM_ERR_IO, "em_accel_load_state: %s: a global batch of 0", path);
    for (int i = 0; !s && i < c->nrngs; i++) {
        char name[32];
        snprintf(name, sizeof name, "rng.%d", i);
        s = get_rng(&root, path, name, &c->rngs[i]);
    }
    if (s) counters_free(c);
    return s;
}

/* DIR/rank_K.json into *c; it must say it is rank k's. */
static em_status read_rank(const char *dir, int64_t k, counters *c)
{
    char file[64], path[4096];
    snprintf(file, sizeof file, "rank_%lld.json", (long long)k);
    path_in(path, sizeof path, dir, file);
    em_status s = read_counters(path, c);
    if (s) return s;
    if (c->rank != k || c->world <= k) {
        counters_free(c);
        return em_err(EM_ERR_IO, "em_accel_load_state: %s holds rank %lld of %lld's state, not rank %lld's",
                      path, (long long)c->rank, (long long)c->world, (long long)k);
    }
    return EM_OK;
}

/* The state every rank of one save holds alike must be alike in c and in the
 * reference (rank 0's file); so must the loader position when the world
 * changes (it is then converted from one rank's). A difference means the
 * files are not one save. */
static em_status check_same_save(const counters *ref, const counters *c, bool resized)
{
    struct {
        const char *what;
        int k; /* loader index, or -1 */
        int64_t x, y;
    } f[16 + 3 * MAX_PREPARED];
    int n = 0;
#define FIELD(w, kk, a, b) f[n++] = (typeof(f[0])){w, kk, a, b}
    FIELD("world size", -1, ref->world, c->world);
    FIELD("optimizer steps", -1, ref->steps, c->steps);
    FIELD("micro-step", -1, ref->micro, c->micro);
    FIELD("the number of models", -1, ref->nmodels, c->nmodels);
    FIELD("the number of optimizers", -1, ref->nopts, c->nopts);
    FIELD("the number of loaders", -1, ref->nloaders, c->nloaders);
    FIELD("having a window sampler", -1, ref->has_sampler, c->has_sampler);
    FIELD("having a loss scaler", -1, ref->has_scaler, c->has_scaler);
    FIELD("the window sampler's batch", -1, ref->sampler_batch, c->sampler_batch);
    FIELD("the loss scaler's growth tracker", -1, ref->scaler.growth_tracker, c->scaler.growth_tracker);
    for (int k = 0; k < ref->nloaders && ref->nloaders == c->nloaders; k++) {
        FIELD("global batch", k, ref->global_batch[k], c->global_batch[k]);
        FIELD("epoch", k, resized ? ref->pos[k].epoch : 0, resized ? c->pos[k].epoch : 0);
        FIELD("batch", k, resized ? ref->pos[k].batch : 0, resized ? c->pos[k].batch : 0);
    }
#undef FIELD
    for (int i = 0; i < n; i++) {
        if (f[i].x == f[i].y) continue;
        char what[96];
        if (f[i].k < 0)
            snprintf(what, sizeof what, "%s", f[i].what);
        else
            snprintf(what, sizeof what, "loader %d's %s", f[i].k, f[i].what);
        return em_err(EM_ERR_IO,
                      "em_accel_load_state: %s and %s disagree on %s (%lld vs %lld): they are not one save",
                      ref->path, c->path, what, (long long)f[i].x, (long long)f[i].y);
    }
    if (ref->sampler.seed != c->sampler.seed || ref->sampler.offset != c->sampler.offset)
        return em_err(
            EM_ERR_IO,
            "em_accel_load_state: %s and %s disagree on the window sampler ({seed %llu, offset %llu} vs "
            "{seed %llu, offset %llu}): they are not one save",
            ref->path, c->path, (unsigned long long)ref->sampler.seed,
            (unsigned long long)ref->sampler.offset, (unsigned long long)c->sampler.seed,
            (unsigned long long)c->sampler.offset);
    if (ref->scaler.scale != c->scaler.scale)
        return em_err(EM_ERR_IO,
                      "em_accel_load_state: %s and %s disagree on the loss scale (%g vs %g): they are not "
                      "one save",
                      ref->path, c->path, ref->scaler.scale, c->scaler.scale);
    return EM_OK;
}

static const char *plural(int64_t n, const char *one, const char *many) { return n == 1 ? one : many; }

/* The checkpoint's models, optimizers and loaders against this run's. A
 * save of an older ember does not count its models and optimizers (it had
 * at most one of each: its files then decide). */
static em_status check_counts(const em_accelerator *a, const counters *ref)
{
    bool legacy = ref->nmodels < 0 || ref->nopts < 0;
    if (legacy ? a->nmodels <= 1 && a->nopts <= 1 && ref->nloaders == a->nloaders
               : ref->nmodels == a->nmodels && ref->nopts == a->nopts && ref->nloaders == a->nloaders)
        return EM_OK;
    char saved[128];
    if (legacy)
        snprintf(saved, sizeof saved, "at most 1 model and 1 optimizer and %lld %s", (long long)ref->nloaders,
                 plural(ref->nloaders, "loader", "loaders"));
    else
        snprintf(saved, sizeof saved, "%lld %s, %lld %s and %lld %s", (long long)ref->nmodels,
                 plural(ref->nmodels, "model", "models"), (long long)ref->nopts,
                 plural(ref->nopts, "optimizer", "optimizers"), (long long)ref->nloaders,
                 plural(ref->nloaders, "loader", "loaders"));
    return em_err(EM_ERR_ARG,
                  "em_accel_load_state: %s was saved with %s; this run prepared %d %s, %d %s and %d %s "
                  "(prepare the same objects in the same order)",
                  ref->path, saved, a->nmodels, plural(a->nmodels, "model", "models"), a->nopts,
                  plural(a->nopts, "optimizer", "optimizers"), a->nloaders,
                  plural(a->nloaders, "loader", "loaders"));
}

/* The generators this run's models own against those own's file holds, by
 * name (from own: the saved rank this rank continues). A save without them
 * (an older ember) leaves them where they are. With `apply`, restores them
 * (after the checks passed). */
static em_status module_rngs(em_accelerator *a, const counters *own, bool apply)
{
    em_status s = EM_OK;
    for (int k = 0; k < a->nmodels && !s; k++) {
        char key[1200];
        snprintf(key, sizeof key, "module_rngs.%d", k);
        if (!json_get(&own->root, key)) continue;
        int64_t saved = 0;
        if ((s = get_i64(&own->root, own->path, key, &saved))) break;
        int n = em_module_rngs(a->models[k], NULL, 0);
        em_named_rng *r = calloc((size_t)n + 1, sizeof *r);
        if (!r) return em_err(EM_ERR_OOM, "em_accel_load_state: out of memory");
        em_module_rngs(a->models[k], r, n);
        if (saved != n)
            s = em_err(
                EM_ERR_ARG,
                "em_accel_load_state: %s holds %lld generators of model %d's modules; this run's model "
                "%d has %d (is it the same model?)",
                own->path, (long long)saved, k, k, n);
        for (int i = 0; i < n && !s; i++) {
            module_rng_key(key, sizeof key, k, r[i].name);
            char seed[1300];
            snprintf(seed, sizeof seed, "%s.seed", key);
            em_rng v;
            if (!json_get(&own->root, seed))
                s = em_err(EM_ERR_ARG,
                           "em_accel_load_state: %s has no state for generator '%s' of model %d (is it the "
                           "same model?)",
                           own->path, r[i].name, k);
            else if (!(s = get_rng(&own->root, own->path, key, &v)) && apply)
                *r[i].rng = v;
        }
        free(r);
    }
    return s;
}

static em_status check_module_rngs(em_accelerator *a, const counters *own)
{
    return module_rngs(a, own, false);
}

/* The checkpoint against this run: the same generators, loader, sampler and
 * scaler, a micro-step that fits, and, when the world size changed, a state
 * that can continue the same global batches. */
static em_status check_run(em_accelerator *a, const char *dir, const counters *ref, const counters *own)
{
    em_status s;
    if (own->nrngs != a->nrngs)
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s has %lld registered generators; this run has %d",
                      own->path, (long long)own->nrngs, a->nrngs);
    if ((s = check_counts(a, ref))) return s;
    if ((s = check_module_rngs(a, own))) return s;
    if (ref->has_sampler != (a->sampler != NULL))
        return em_err(EM_ERR_ARG,
                      "em_accel_load_state: %s was saved with%s a window sampler; this run has%s one",
                      ref->path, ref->has_sampler ? "" : "out", a->sampler ? "" : " no");
    if (ref->has_scaler != (a->scaler != NULL))
        return em_err(EM_ERR_ARG,
                      "em_accel_load_state: %s was saved %s fp16's loss scaler; this run %s (mixed "
                      "precision must match)",
                      ref->path, ref->has_scaler ? "with" : "without", a->scaler ? "has one" : "has none");
    if (ref->micro < 0 || ref->micro >= a->grad_accum)
        return em_err(EM_ERR_ARG,
                      "em_accel_load_state: %s: micro-step %lld does not fit gradient accumulation %d",
                      ref->path, (long long)ref->micro, a->grad_accum);
    if (ref->world == a->world) return EM_OK;
    long long W = ref->world;
    if (ref->micro != 0)
        return em_err(
            EM_ERR_ARG,
            "em_accel_load_state: %s was saved by %lld processes in the middle of an "
            "accumulation window (micro-step %lld of %d); this run has %d processes, and the partial "
            "gradients of a window cannot move to another world size: resume it on %lld processes, or "
            "save after an optimizer step (micro-step 0)",
            dir, W, (long long)ref->micro, a->grad_accum, a->world, W);
    for (int k = 0; k < a->nloaders; k++) {
        int64_t G = em_loader_global_batch(a->loaders[k]), old = ref->global_batch[k];
        char which[32] = "its loader", in[32] = ""; /* the training loader, or another one */
        if (k > 0) {
            snprintf(which, sizeof which, "loader %d", k);
            snprintf(in, sizeof in, " in loader %d", k);
        }
        if (old < 0)
            return em_err(
                EM_ERR_ARG,
                "em_accel_load_state: %s does not record %s's global batch (an "
                "older ember saved it), so it resumes only on the %lld processes that saved it; this "
                "run has %d",
                ref->path, which, W, a->world);
        if (G != old) {
            char fix[256];
            if (old % a->world)
                snprintf(fix, sizeof fix,
                         "%lld examples cannot be split evenly over %d processes: resume on a "
                         "number of processes that divides %lld",
                         (long long)old, a->world, (long long)old);
            else if (a->split_batches)
                snprintf(fix, sizeof fix,
                         "set the loader's batch_size to %lld (split_batches: it is the global "
                         "batch)",
                         (long long)old);
            else
                snprintf(fix, sizeof fix, "give each process a batch_size of %lld (%lld / %d)",
                         (long long)(old / a->world), (long long)old, a->world);
            return em_err(EM_ERR_ARG,
                          "em_accel_load_state: %s was saved by %lld processes with a global batch of "
                          "%lld examples (%lld each)%s; this run's %d processes make a global batch of "
                          "%lld (%lld each), which would change the data order: %s",
                          dir, W, (long long)old, (long long)(old / W), in, a->world, (long long)G,
                          (long long)(G / a->world), fix);
        }
    }
    if (a->sampler) {
        int64_t B = a->sampler->batch, old = ref->sampler_batch;
        if (old < 0)
            return em_err(
                EM_ERR_ARG,
                "em_accel_load_state: %s does not record its window sampler's batch (an "
                "older ember saved it), so it resumes only on the %lld processes that saved it; this "
                "run has %d",
                ref->path, W, a->world);
        if (B != old)
            return em_err(EM_ERR_ARG,
                          "em_accel_load_state: %s was saved with a window sampler drawing %lld "
                          "windows a batch (all processes together); this run's draws %lld: keep the global "
                          "batch at %lld",
                          dir, (long long)old, (long long)B, (long long)old);
    }
    return EM_OK;
}

/* Where this rank's loader goes on: its own saved position when the world
 * size is the same. Otherwise through the examples consumed: position {e, b}
 * of the saved run means b global batches of epoch e's order are used, b x G
 * examples, which at the same global batch G is batch b here too; at the
 * ragged end of an epoch (no even_batches) a rank that has no share of the
 * last global batch ends its epoch one batch earlier. */
static em_status loader_position(em_accelerator *a, int k, const counters *ref, const counters *own,
                                 em_loader_pos *pos)
{
    if (ref->world == a->world) {
        *pos = own->pos[k];
        return EM_OK;
    }
    em_loader *l = a->loaders[k];
    int64_t G = em_loader_global_batch(l), nb = em_loader_num_batches(l), old = ref->global_batch[k];
    int64_t consumed = ref->pos[k].batch <= INT64_MAX / old ? ref->pos[k].batch * old : -1;
    int64_t b = consumed < 0 ? -1 : consumed / G;
    if (b == nb + 1 && consumed % G == 0 && em_loader_padding(l) == 0) b = nb;
    if (b < 0 || b > nb)
        return em_err(EM_ERR_ARG,
                      "em_accel_load_state: %s: loader %d's position {epoch %lld, batch %lld} is past the "
                      "end of this run's epochs of %lld batches (has the dataset changed?)",
                      ref->path, k, (long long)ref->pos[k].epoch, (long long)ref->pos[k].batch,
                      (long long)nb);
    *pos = (em_loader_pos){ref->pos[k].epoch, b};
    return EM_OK;
}

/* Reads and checks every counters file this rank needs, before anything
 * changes: rank 0's (the reference, *ref), the saved rank whose generators
 * this rank continues (rank % W of the W that saved, *own), and the saved
 * ranks rank, rank + world, ... below W, each verified against rank 0's, so
 * that the ranks together verify every file of the save (tmp: scratch). */
static em_status read_checkpoint(em_accelerator *a, const char *dir, counters *ref, counters *own,
                                 counters *tmp)
{
    em_status s = read_rank(dir, 0, ref);
    if (s) return s;
    bool resized = ref->world != a->world;
    int64_t src = a->rank % ref->world;
    if ((s = read_rank(dir, src, own)) || (src != 0 && (s = check_same_save(ref, own, resized)))) return s;
    for (int64_t k = a->rank; k < ref->world && !s; k += a->world) {
        if (k == src || k == 0) continue;
        s = read_rank(dir, k, tmp);
        if (!s) s = check_same_save(ref, tmp, resized);
        counters_free(tmp);
    }
    return s;
}

/* The optimizers' state this rank loads, assembled and checked before
 * anything changes (dist/checkpoint_optim.c). */
typedef struct opt_states {
    em_named *st[MAX_PREPARED];
    int n[MAX_PREPARED];
} opt_states;

/* A model's tensors this rank loads from model shards (or, at ZeRO stage
 * 3, its shares from the whole model file), read and checked before
 * anything changes; NULL st: the whole file is loaded as it is
 * (module_load). */
typedef struct model_states {
    tensor **st[MAX_PREPARED]; /* per tensor of the model (parameters, then buffers) */
    ckpt_range *want[MAX_PREPARED];
    int n[MAX_PREPARED];
} model_states;

static void model_states_free(model_states *ms)
{
    for (int k = 0; k < MAX_PREPARED; k++) {
        for (int i = 0; ms->st[k] && i < ms->n[k]; i++) t_free(ms->st[k][i]);
        free(ms->st[k]);
        free(ms->want[k]);
    }
}

/* Model k's tensors against what the save holds of it (cm): the same
 * names, shapes and dtypes; idx[i] gets tensor i's place in cm. */
static em_status check_model(int k, const ckpt_model *cm, const em_named *v, int n, int *idx)
{
    for (int i = 0; i < n; i++) {
        tensor *t = t_resolve(v[i].t, LOAD);
        if (!t) return em_last_status();
        const ckpt_mtensor *c = (idx[i] = ckpt_model_find(cm, v[i].name)) < 0 ? NULL : &cm->t[idx[i]];
        if (!c)
            return em_err(EM_ERR_ARG, LOAD ": %s holds no '%s' of model %d (is it the same model?)", cm->dir,
                          v[i].name, k);
        if (c->dtype != t->dtype || c->ndim != t->ndim ||
            memcmp(c->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim))
            return em_err(EM_ERR_ARG, LOAD ": %s: '%s' of model %d is %s%s in the save but %s%s in this run",
                          cm->dir, v[i].name, k, em_dtype_name(c->dtype), shp_of(c->ndim, c->shape),
                          em_dtype_name(t->dtype), shp(t));
    }
    if (cm->nt != n)
        return em_err(EM_ERR_ARG,
                      LOAD ": %s holds %d tensors of model %d; this run's has %d (is it the same model?)",
                      cm->dir, cm->nt, k, n);
    return EM_OK;
}

/* Reads what this rank loads of model k into ms: from its shards, all of
 * every tensor (below ZeRO stage 3) or this rank's shares (stage 3; from
 * the whole model file too); else nothing (module_load reads it later). */
static em_status read_model(em_accelerator *a, const char *dir, const ckpt_manifest *m, int k,
                            model_states *ms)
{
    char whole[CKPT_NAME_MAX];
    ckpt_model_file(whole, sizeof whole, k, -1);
    if (ckpt_lists(m, whole) && !model_sharded(a)) return EM_OK;
    ckpt_model cm;
    em_status s = ckpt_model_scan(&cm, dir, m, k, LOAD);
    if (s) return s;
    int n = 0;
    em_named *v = NULL;
    int *idx = NULL;
    ckpt_range *want = NULL;
    if (model_sharded(a)) {
        want = shares_of(a, false, &n, LOAD);
    } else {
        n = em_module_params(a->models[k], NULL, 0) + em_module_buffers(a->models[k], NULL, 0);
        want = calloc((size_t)n + 1, sizeof *want);
    }
    v = calloc((size_t)n + 1, sizeof *v);
    idx = calloc((size_t)n + 1, sizeof *idx);
    ms->st[k] = calloc((size_t)n + 1, sizeof *ms->st[k]);
    ms->want[k] = calloc((size_t)cm.nt + 1, sizeof *ms->want[k]);
    void **dst = calloc((size_t)cm.nt + 1, sizeof *dst);
    ms->n[k] = n;
    if (!want || !v || !idx || !ms->st[k] || !ms->want[k] || !dst)
        s = em_err(EM_ERR_OOM, LOAD ": out of memory");
    if (!s) {
        int np = em_module_params(a->models[k], v, n);
        em_module_buffers(a->models[k], v + np, n - np);
        s = check_model(k, &cm, v, n, idx);
    }
    /* the tensors it loads whole get their own shape (and device), the
     * shares a 1-D piece; ms->want is in cm's order for the fill */
    for (int i = 0; i < n && !s; i++) {
        tensor *t = t_resolve(v[i].t, LOAD);
        if (!model_sharded(a)) want[i] = (ckpt_range){0, t_numel(t)};
        bool part = want[i].n < t_numel(t);
        ms->st[k][i] =
            part ? t_new_persistent(t->dtype, 1, &want[i].n) : t_new_persistent(t->dtype, t->ndim, t->shape);
        if (!ms->st[k][i])
            s = em_last_status();
        else {
            ms->want[k][idx[i]] = want[i];
            dst[idx[i]] = t_ptr(ms->st[k][i]);
        }
    }
    if (!s) s = ckpt_model_fill(&cm, ms->want[k], dst);
    for (int i = 0; i < n && !s; i++) { /* onto the parameter's device */
        tensor *t = t_resolve(v[i].t, LOAD), *d;
        if (em_device_equal(t->device, ms->st[k][i]->device)) continue;
        if (!(d = t_copy_to(ms->st[k][i], t->device))) s = em_last_status();
        t_free(ms->st[k][i]);
        ms->st[k][i] = d;
    }
    for (int i = 0; i < n && !s; i++) ms->want[k][i] = want[i]; /* now in the module's order */
    free(dst);
    free(idx);
    free(v);
    free(want);
    ckpt_model_free(&cm);
    return s;
}

/* Copies what read_model read into model k (it was checked there). */
static em_status apply_model(em_accelerator *a, int k, model_states *ms)
{
    int n = ms->n[k];
    em_named *v = calloc((size_t)n + 1, sizeof *v);
    if (!v) return em_err(EM_ERR_OOM, LOAD ": out of memory");
    int np = em_module_params(a->models[k], v, n);
    em_module_buffers(a->models[k], v + np, n - np);
    em_status s = EM_OK;
    for (int i = 0; i < n && !s; i++) {
        tensor *t = t_resolve(v[i].t, LOAD), *src = ms->st[k][i];
        if (ms->want[k][i].n <
            t_numel(t)) { /* a share: a contiguous part of a parameter (src on its device) */
            char *dst = (char *)t_ptr(t) + (size_t)ms->want[k][i].lo * t_esize(t);
            size_t bytes = (size_t)ms->want[k][i].n * t_esize(t);
#if EM_HAVE_CUDA
            if (t_on_cuda(t)) {
                s = cu_memcpy(dst, t->device, t_ptr(src), src->device, bytes);
                continue;
            }
#endif
            memcpy(dst, t_ptr(src), bytes);
        } else {
            copy_strided(t, src);
        }
    }
    free(v);
    if (s) return s;
    /* ZeRO-3: only this rank's chunks are right; the next use gathers the rest */
    return a->zero ? zero_params_changed(a->zero) : EM_OK;
}

/* The part of a load that changes nothing: c[0] gets rank 0's counters,
 * c[1] those whose generators this rank continues (c[2] is scratch),
 * pos[k] where loader k goes on, ms each model's tensors, o each
 * optimizer's state. */
static em_status plan_local(em_accelerator *a, const char *dir, const ckpt_manifest *m, counters *c,
                            em_loader_pos *pos, model_states *ms, opt_states *o)
{
    em_status s = read_checkpoint(a, dir, &c[0], &c[1], &c[2]);
    if (!s) s = check_run(a, dir, &c[0], &c[1]);
    for (int k = 0; k < a->nloaders && !s; k++) s = loader_position(a, k, &c[0], &c[1], &pos[k]);
    for (int k = 0; k < a->nmodels && !s; k++) s = read_model(a, dir, m, k, ms);
    for (int k = 0; k < a->nopts && !s; k++)
        s = ckpt_optim_read(a->opts[k], dir, m, k, &o->st[k], &o->n[k], LOAD);
    return s;
}

static em_status apply_local(em_accelerator *a, const char *dir, const ckpt_manifest *m, const counters *ref,
                             const counters *own, const em_loader_pos *pos, model_states *ms, opt_states *o)
{
    /* a file the manifest names was verified whole by ckpt_open: its own
     * checksum would be one more pass over the same bytes */
    char path[4096], file[CKPT_NAME_MAX];
    em_status s = EM_OK;
    for (int k = 0; k < a->nmodels && !s; k++) {
        if (ms->st[k]) {
            s = apply_model(a, k, ms);
            continue;
        }
        ckpt_model_file(file, sizeof file, k, -1);
        path_in(path, sizeof path, dir, file);
        s = module_load(a->models[k], path, true, !ckpt_lists(m, file));
    }
    for (int k = 0; k < a->nopts && !s; k++) s = ckpt_optim_load(a->opts[k], o->n[k], o->st[k]);
    for (int k = 0; k < a->nloaders && !s; k++) s = em_loader_seek(a->loaders[k], pos[k]);
    if (!s && a->scaler) s = em_scaler_set_state(a->scaler, ref->scaler);
    if (!s) s = module_rngs(a, own, true);
    if (s) return s;
    /* the same on every rank: from rank 0's file; per rank: from own's */
    if (a->sampler) a->sampler->rng = ref->sampler;
    *em_default_rng() = own->def;
    for (int i = 0; i < a->nrngs; i++) *a->rngs[i] = own->rngs[i];
    a->steps = ref->steps;
    a->micro = ref->micro;
    a->sync = false;
    a->counted = false;
    a->batch_stamp = 0; /* the seek: no batch drawn */
    return EM_OK;
}

/* Every rank verified a checkpoint; they must all be the same save (ranks
 * that see different directories under one name would mix two runs). */
static em_status same_save(em_accelerator *a, uint64_t id)
{
    if (a->world == 1) return EM_OK;
    em_scope sc = em_scope_begin();
    em_tensor *in = em_empty(EM_I32, 1, (int64_t[]){2}),
              *out = em_empty(EM_I32, 1, (int64_t[]){2 * a->world});
    if (in) memcpy(em_data(in), &id, sizeof id);
    em_status s = in && out ? em_all_gather(a->pg, out, in, NULL) : em_last_status();
    uint64_t *ids = s ? NULL : em_data(out);
    for (int r = 1; ids && r < a->world; r++) {
        if (ids[r] == ids[0]) continue;
        char h0[17], hr[17];
        ckpt_id_hex(ids[0], h0);
        ckpt_id_hex(ids[r], hr);
        s = em_err(
            EM_ERR_DIST,
            "em_accel_load_state: the ranks loaded different checkpoints: rank 0 save %s, rank %d save %s "
            "(does the directory name the same checkpoint on every machine?)",
            h0, r, hr);
        break;
    }
    em_scope_end(sc);
    return s;
}

em_status em_accel_load_state(em_accelerator *a, const char *dir)
{
    if (a && !dir) return accel_load_auto(a); /* the newest automatic checkpoint: dist/accel_ckpt.c */
    if (!a || !dir || !*dir)
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s", a ? "directory is empty" : "accelerator is NULL");
    char d[4096];
    ckpt_manifest m = {0};
    counters *c = calloc(3, sizeof *c);
    em_loader_pos pos[MAX_PREPARED] = {{0, 0}};
    opt_states o = {0};
    model_states ms = {0};
    /* nothing changes until every rank has verified every file of the
     * checkpoint and checked the counters, and all ranks saw the same save */
    em_status s =
        c ? ckpt_open(dir, STATE_FORMAT, d, sizeof d, &m, LOAD) : em_err(EM_ERR_OOM, LOAD ": out of memory");
    if (!s) s = plan_local(a, d, &m, c, pos, &ms, &o);
    s = accel_agree(a, s, LOAD);
    if (!s) s = accel_agree(a, same_save(a, m.id), LOAD);
    if (!s) s = accel_agree(a, apply_local(a, d, &m, &c[0], &c[1], pos, &ms, &o), LOAD);
    model_states_free(&ms);
    for (int k = 0; k < MAX_PREPARED; k++) ckpt_optim_state_free(o.st[k], o.n[k]);
    ckpt_manifest_free(&m);
    for (int i = 0; c && i < 3; i++) counters_free(&c[i]);
    free(c);
    return s;
}
