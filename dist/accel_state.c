/* accel_state.c — em_accel_save_state / em_accel_load_state: everything a
 * run needs to continue exactly where it stopped, on as many processes as
 * saved it or on another number.
 *
 *   DIR/model.safetensors      parameters and buffers      (rank 0 writes)
 *   DIR/optimizer.safetensors  em_optim_state               (rank 0 writes)
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
 * serves all; the counters and generators are per rank. Numbers are written
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
#include "nn/json_impl.h"
#include "nn/safetensors_impl.h"
#include "tensor/fileio_impl.h"
#include "tensor/tensor_impl.h"

#define STATE_FORMAT "ember-accelerator-state-2"
#define SAVE "em_accel_save_state"
#define LOAD "em_accel_load_state"

/* dir/file (the directories come from ckpt_dir_name, which leaves room for a file name) */
static void path_in(char *buf, size_t n, const char *dir, const char *file)
{
    if (snprintf(buf, n, "%s/%s", dir, file) >= (int)n) buf[n - 1] = '\0';
}

/* Every rank learns whether any rank failed; a local failure keeps its own
 * message, the others name the failing rank. */
static em_status agree(em_accelerator *a, em_status mine, const char *what)
{
    if (a->world == 1) return mine;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    int64_t one = 1;
    em_scope sc = em_scope_begin();
    em_tensor *f = em_full(EM_I32, 1, &one, mine != EM_OK ? a->rank + 1 : 0);
    em_status s = f ? em_all_reduce(a->pg, f, EM_RED_MAX, NULL) : em_last_status();
    int bad = s == EM_OK ? ((int32_t *)em_data(f))[0] : 0;
    em_scope_end(sc);
    if (mine != EM_OK) return em_set_error(mine, "%s", msg);
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
    char key[64];
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
    if (a->loader) {
        em_loader_pos p = em_loader_position(a->loader);
        put_u64(&b, "loader.epoch", (uint64_t)p.epoch, false);
        put_u64(&b, "loader.batch", (uint64_t)p.batch, false);
        put_u64(&b, "loader.global_batch", (uint64_t)em_loader_global_batch(a->loader), false);
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

static em_status save_optimizer(em_accelerator *a, const char *path, file_sum *sum)
{
    int n = em_optim_state(a->opt, NULL, 0);
    if (n < 0) return em_last_status();
    em_named *st = calloc((size_t)n + 1, sizeof *st);
    if (!st) return em_err(EM_ERR_OOM, "em_accel_save_state: out of memory");
    em_optim_state(a->opt, st, n);
    em_status s = st_save(path, n, st, "{\"format\":\"ember-optimizer\"}", sum);
    free(st);
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

/* Rank 0, once every rank wrote its files into tmp: the manifest (its own
 * files' sums as they were written, the rank files' read back) and the
 * publishing rename. */
static em_status finish_save(em_accelerator *a, const char *dir, const char *tmp, uint64_t id,
                             const ckpt_entry *mine, int nmine)
{
    ckpt_manifest m = {.id = id, .world = a->world, .steps = a->steps, .n = nmine + a->world};
    m.files = calloc((size_t)m.n, sizeof *m.files);
    if (!m.files) return em_err(EM_ERR_OOM, SAVE ": out of memory");
    memcpy(m.files, mine, sizeof *mine * (size_t)nmine);
    em_status s = EM_OK;
    for (int r = 0; r < a->world && !s; r++) {
        ckpt_entry *e = &m.files[nmine + r];
        snprintf(e->name, sizeof e->name, "rank_%d.json", r);
        char path[4096];
        path_in(path, sizeof path, tmp, e->name);
        s = file_checksum(path, &e->sum, SAVE);
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
    if ((s = agree(a, ckpt_dir_name(dir, true, d, sizeof d, SAVE), SAVE))) return s;
    uint64_t id = 0;
    if (a->rank == 0) {
        id = ckpt_new_id();
        ckpt_tmp_dir(d, id, tmp, sizeof tmp);
        s = ckpt_begin(d, tmp, SAVE);
    }
    if ((s = agree(a, s, SAVE))) return s;
    if ((s = agree(a, share_id(a, &id), SAVE))) {
        if (a->rank == 0) ckpt_abandon(tmp);
        return s;
    }
    ckpt_tmp_dir(d, id, tmp, sizeof tmp);
    ckpt_entry mine[2] = {{.name = "model.safetensors"}, {.name = "optimizer.safetensors"}};
    int nmine = 0;
    if (a->rank == 0 && a->model) {
        path_in(path, sizeof path, tmp, mine[0].name);
        s = module_save(a->model, path, &mine[nmine++].sum);
    }
    if (!s && a->rank == 0 && a->opt) {
        if (nmine == 0) mine[0] = mine[1];
        path_in(path, sizeof path, tmp, mine[nmine].name);
        s = save_optimizer(a, path, &mine[nmine++].sum);
    }
    if (!s) s = save_counters(a, tmp, id);
    s = agree(a, s, SAVE); /* every rank's files are in tmp */
    if (a->rank == 0) {
        if (!s) s = finish_save(a, d, tmp, id, mine, nmine);
        if (s) ckpt_abandon(tmp);
    }
    return agree(a, s, SAVE);
}

/* ---- loading ---------------------------------------------------------------------- */

typedef struct counters {
    char path[4096]; /* the file they came from, for messages */
    int64_t world, rank, steps, micro, nrngs;
    int64_t global_batch, sampler_batch; /* -1: not recorded (saved before world changes were allowed) */
    bool has_loader, has_sampler, has_scaler;
    em_scaler_state scaler;
    em_loader_pos pos;
    em_rng sampler, def, rngs[MAX_RNGS];
} counters;

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
    char key[64];
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
    c->has_loader = json_get(&root, "loader.epoch") != NULL;
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
    if (!s && c->has_loader) s = get_i64(&root, path, "loader.epoch", &c->pos.epoch);
    if (!s && c->has_loader) s = get_i64(&root, path, "loader.batch", &c->pos.batch);
    if (!s) s = get_opt_i64(&root, path, "loader.global_batch", &c->global_batch);
    if (!s && c->has_sampler) s = get_rng(&root, path, "sampler", &c->sampler);
    if (!s) s = get_opt_i64(&root, path, "sampler.batch", &c->sampler_batch);
    if (!s && (c->global_batch == 0 || c->sampler_batch == 0))
        s = em_err(EM_ERR_IO, "em_accel_load_state: %s: a global batch of 0", path);
    for (int i = 0; !s && i < c->nrngs; i++) {
        char name[32];
        snprintf(name, sizeof name, "rng.%d", i);
        s = get_rng(&root, path, name, &c->rngs[i]);
    }
    json_free(&root);
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
    if (c->rank != k || c->world <= k)
        return em_err(EM_ERR_IO, "em_accel_load_state: %s holds rank %lld of %lld's state, not rank %lld's",
                      path, (long long)c->rank, (long long)c->world, (long long)k);
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
        int64_t x, y;
    } f[] = {
        {"world size", ref->world, c->world},
        {"optimizer steps", ref->steps, c->steps},
        {"micro-step", ref->micro, c->micro},
        {"having a loader", ref->has_loader, c->has_loader},
        {"having a window sampler", ref->has_sampler, c->has_sampler},
        {"having a loss scaler", ref->has_scaler, c->has_scaler},
        {"the loader's global batch", ref->global_batch, c->global_batch},
        {"the window sampler's batch", ref->sampler_batch, c->sampler_batch},
        {"the loss scaler's growth tracker", ref->scaler.growth_tracker, c->scaler.growth_tracker},
        {"the loader's epoch", resized ? ref->pos.epoch : 0, resized ? c->pos.epoch : 0},
        {"the loader's batch", resized ? ref->pos.batch : 0, resized ? c->pos.batch : 0},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].x != f[i].y)
            return em_err(
                EM_ERR_IO,
                "em_accel_load_state: %s and %s disagree on %s (%lld vs %lld): they are not one save",
                ref->path, c->path, f[i].what, (long long)f[i].x, (long long)f[i].y);
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

/* The checkpoint against this run: the same generators, loader, sampler and
 * scaler, a micro-step that fits, and, when the world size changed, a state
 * that can continue the same global batches. */
static em_status check_run(em_accelerator *a, const char *dir, const counters *ref, const counters *own)
{
    if (own->nrngs != a->nrngs)
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s has %lld registered generators; this run has %d",
                      own->path, (long long)own->nrngs, a->nrngs);
    if (ref->has_loader != (a->loader != NULL) || ref->has_sampler != (a->sampler != NULL))
        return em_err(EM_ERR_ARG,
                      "em_accel_load_state: %s was saved with%s a loader and with%s a sampler; this "
                      "run has%s a loader and%s a sampler",
                      ref->path, ref->has_loader ? "" : "out", ref->has_sampler ? "" : "out",
                      a->loader ? "" : " no", a->sampler ? "" : " no");
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
    if (a->loader) {
        int64_t G = em_loader_global_batch(a->loader), old = ref->global_batch;
        if (old < 0)
            return em_err(
                EM_ERR_ARG,
                "em_accel_load_state: %s does not record its loader's global batch (an "
                "older ember saved it), so it resumes only on the %lld processes that saved it; this "
                "run has %d",
                ref->path, W, a->world);
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
            return em_err(
                EM_ERR_ARG,
                "em_accel_load_state: %s was saved by %lld processes with a global batch "
                "of %lld examples (%lld each); this run's %d processes make a global batch of %lld (%lld "
                "each), which would change the data order: %s",
                dir, W, (long long)old, (long long)(old / W), a->world, (long long)G,
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
static em_status loader_position(em_accelerator *a, const counters *ref, const counters *own,
                                 em_loader_pos *pos)
{
    if (ref->world == a->world) {
        *pos = own->pos;
        return EM_OK;
    }
    int64_t G = em_loader_global_batch(a->loader), nb = em_loader_num_batches(a->loader);
    int64_t consumed =
        ref->pos.batch <= INT64_MAX / ref->global_batch ? ref->pos.batch * ref->global_batch : -1;
    int64_t b = consumed < 0 ? -1 : consumed / G;
    if (b == nb + 1 && consumed % G == 0 && em_loader_padding(a->loader) == 0) b = nb;
    if (b < 0 || b > nb)
        return em_err(EM_ERR_ARG,
                      "em_accel_load_state: %s: loader position {epoch %lld, batch %lld} is past the "
                      "end of this run's epochs of %lld batches (has the dataset changed?)",
                      ref->path, (long long)ref->pos.epoch, (long long)ref->pos.batch, (long long)nb);
    *pos = (em_loader_pos){ref->pos.epoch, b};
    return EM_OK;
}

/* Reads the optimizer file into named tensors (persistent; freed by the caller). */
static em_status read_optimizer(const char *path, bool verify, em_named **out, int *n)
{
    em_safetensors *f = st_open(path, verify);
    if (!f) return em_last_status();
    int k = em_safetensors_count(f);
    em_named *st = calloc((size_t)k + 1, sizeof *st);
    char **names = calloc((size_t)k + 1, sizeof *names);
    em_status s = st && names ? EM_OK : em_err(EM_ERR_OOM, "em_accel_load_state: out of memory");
    for (int i = 0; i < k && !s; i++) {
        names[i] = strdup(em_safetensors_name(f, i));
        st[i].name = names[i];
        st[i].t = names[i] ? em_safetensors_get(f, names[i]) : NULL;
        if (!st[i].t) s = names[i] ? em_last_status() : em_err(EM_ERR_OOM, "em_accel_load_state: out of memory");
    }
    em_safetensors_close(f);
    if (s) {
        for (int i = 0; i < k && st; i++) {
            em_free(st[i].t);
            free(names ? names[i] : NULL);
        }
        free(st);
        free(names);
        return s;
    }
    free(names); /* st[i].name now owns each string */
    *out = st;
    *n = k;
    return EM_OK;
}

static void free_named(em_named *st, int n)
{
    for (int i = 0; i < n; i++) {
        em_free(st[i].t);
        free((char *)st[i].name);
    }
    free(st);
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
    if (src == 0)
        *own = *ref;
    else if ((s = read_rank(dir, src, own)) || (s = check_same_save(ref, own, resized)))
        return s;
    for (int64_t k = a->rank; k < ref->world && !s; k += a->world) {
        if (k == src || k == 0) continue;
        s = read_rank(dir, k, tmp);
        if (!s) s = check_same_save(ref, tmp, resized);
    }
    return s;
}

/* The counters' part of a load, which changes nothing: c[0] gets rank 0's
 * counters, c[1] those whose generators this rank continues (c[2] is
 * scratch), *pos where its loader goes on. */
static em_status plan_local(em_accelerator *a, const char *dir, counters *c, em_loader_pos *pos)
{
    em_status s = read_checkpoint(a, dir, &c[0], &c[1], &c[2]);
    if (!s) s = check_run(a, dir, &c[0], &c[1]);
    if (!s && a->loader) s = loader_position(a, &c[0], &c[1], pos);
    return s;
}

static em_status apply_local(em_accelerator *a, const char *dir, const ckpt_manifest *m, const counters *ref,
                             const counters *own, em_loader_pos pos)
{
    /* a file the manifest names was verified whole by ckpt_open: its own
     * checksum would be one more pass over the same bytes */
    char path[4096];
    em_named *opt_state = NULL;
    int nopt = 0;
    em_status s = EM_OK;
    if (a->opt) {
        path_in(path, sizeof path, dir, "optimizer.safetensors");
        if ((s = read_optimizer(path, !ckpt_lists(m, "optimizer.safetensors"), &opt_state, &nopt))) return s;
    }
    if (a->model) {
        path_in(path, sizeof path, dir, "model.safetensors");
        s = module_load(a->model, path, true, !ckpt_lists(m, "model.safetensors"));
    }
    if (!s && a->opt) s = em_optim_load_state(a->opt, nopt, opt_state);
    free_named(opt_state, nopt);
    if (!s && a->loader) s = em_loader_seek(a->loader, pos);
    if (!s && a->scaler) s = em_scaler_set_state(a->scaler, ref->scaler);
    if (s) return s;
    /* the same on every rank: from rank 0's file; per rank: from own's */
    if (a->sampler) a->sampler->rng = ref->sampler;
    *em_default_rng() = own->def;
    for (int i = 0; i < a->nrngs; i++) *a->rngs[i] = own->rngs[i];
    a->steps = ref->steps;
    a->micro = ref->micro;
    a->sync = false;
    a->end_of_data = false;
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
    em_loader_pos pos = {0, 0};
    /* nothing changes until every rank has verified every file of the
     * checkpoint and checked the counters, and all ranks saw the same save */
    em_status s =
        c ? ckpt_open(dir, STATE_FORMAT, d, sizeof d, &m, LOAD) : em_err(EM_ERR_OOM, LOAD ": out of memory");
    if (!s) s = plan_local(a, d, c, &pos);
    s = agree(a, s, LOAD);
    if (!s) s = agree(a, same_save(a, m.id), LOAD);
    if (!s) s = agree(a, apply_local(a, d, &m, &c[0], &c[1], pos), LOAD);
    ckpt_manifest_free(&m);
    free(c);
    return s;
}
