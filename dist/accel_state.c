/* accel_state.c — em_accel_save_state / em_accel_load_state: everything a
 * run needs to continue exactly where it stopped.
 *
 *   DIR/model.safetensors      parameters and buffers      (rank 0 writes)
 *   DIR/optimizer.safetensors  em_optim_state               (rank 0 writes)
 *   DIR/rank_R.json            this rank's counters: optimizer steps,
 *                              micro-step, loader position, sampler and
 *                              generator states, the save id (each rank)
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
 * it names on every rank, then checks that all ranks see the same save id,
 * and only then changes anything. Saving and loading are collective: the
 * ranks agree at the end whether every one of them succeeded.
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
    }
    if (a->sampler) put_rng(&b, "sampler", &a->sampler->rng);
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
    int64_t world, rank, steps, micro, nrngs;
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

static em_status get_rng(const jval *o, const char *path, const char *name, em_rng *r)
{
    char key[64];
    snprintf(key, sizeof key, "%s.seed", name);
    em_status s = get_u64(o, path, key, &r->seed);
    snprintf(key, sizeof key, "%s.offset", name);
    return s ? s : get_u64(o, path, key, &r->offset);
}

static em_status read_counters(em_accelerator *a, const char *dir, counters *c)
{
    char file[64], path[4096];
    snprintf(file, sizeof file, "rank_%d.json", a->rank);
    path_in(path, sizeof path, dir, file);
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
    s = get_i64(&root, path, "world", &c->world);
    if (!s) s = get_i64(&root, path, "rank", &c->rank);
    if (!s) s = get_i64(&root, path, "steps", &c->steps);
    if (!s) s = get_i64(&root, path, "micro", &c->micro);
    if (!s) s = get_i64(&root, path, "rngs", &c->nrngs);
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
    if (!s && c->has_sampler) s = get_rng(&root, path, "sampler", &c->sampler);
    for (int i = 0; !s && i < c->nrngs && i < MAX_RNGS; i++) {
        char name[32];
        snprintf(name, sizeof name, "rng.%d", i);
        s = get_rng(&root, path, name, &c->rngs[i]);
    }
    json_free(&root);
    if (s) return s;
    if (c->world != a->world)
        return em_err(EM_ERR_DIST, "em_accel_load_state: %s was saved by a run of %lld processes; this run has %d",
                      path, (long long)c->world, a->world);
    if (c->rank != a->rank)
        return em_err(EM_ERR_IO, "em_accel_load_state: %s holds rank %lld's state", path, (long long)c->rank);
    if (c->nrngs != a->nrngs)
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s has %lld registered generators; this run has %d", path,
                      (long long)c->nrngs, a->nrngs);
    if (c->has_loader != (a->loader != NULL) || c->has_sampler != (a->sampler != NULL))
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s was saved with%s a loader and with%s a sampler; this "
                      "run has%s a loader and%s a sampler", path, c->has_loader ? "" : "out",
                      c->has_sampler ? "" : "out", a->loader ? "" : " no", a->sampler ? "" : " no");
    if (c->has_scaler != (a->scaler != NULL))
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s was saved %s fp16's loss scaler; this run %s (mixed "
                      "precision must match)", path, c->has_scaler ? "with" : "without", a->scaler ? "has one" : "has none");
    if (c->micro < 0 || c->micro >= a->grad_accum)
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s: micro-step %lld does not fit gradient accumulation %d",
                      path, (long long)c->micro, a->grad_accum);
    return EM_OK;
}

/* Reads the optimizer file into named tensors (persistent; freed by the caller). */
static em_status read_optimizer(const char *path, em_named **out, int *n)
{
    em_safetensors *f = em_safetensors_open(path);
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

static em_status load_local(em_accelerator *a, const char *dir)
{
    counters c;
    em_status s = read_counters(a, dir, &c);
    if (s) return s;
    char path[4096];
    em_named *opt_state = NULL;
    int nopt = 0;
    if (a->opt) {
        path_in(path, sizeof path, dir, "optimizer.safetensors");
        if ((s = read_optimizer(path, &opt_state, &nopt))) return s;
    }
    if (a->model) {
        path_in(path, sizeof path, dir, "model.safetensors");
        s = em_module_load(a->model, path, true);
    }
    if (!s && a->opt) s = em_optim_load_state(a->opt, nopt, opt_state);
    free_named(opt_state, nopt);
    if (!s && a->loader) s = em_loader_seek(a->loader, c.pos);
    if (s) return s;
    if (a->sampler) a->sampler->rng = c.sampler;
    if (a->scaler && (s = em_scaler_set_state(a->scaler, c.scaler))) return s;
    *em_default_rng() = c.def;
    for (int i = 0; i < a->nrngs; i++) *a->rngs[i] = c.rngs[i];
    a->steps = c.steps;
    a->micro = c.micro;
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
    if (!a || !dir || !*dir)
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s", a ? "directory is empty" : "accelerator is NULL");
    char d[4096];
    ckpt_manifest m;
    /* nothing is changed until every rank has verified every file */
    em_status s = agree(a, ckpt_open(dir, STATE_FORMAT, d, sizeof d, &m, LOAD), LOAD);
    if (!s) s = same_save(a, m.id);
    if (!s) s = load_local(a, d);
    ckpt_manifest_free(&m);
    return agree(a, s, LOAD);
}
