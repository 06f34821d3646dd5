/* accel_state.c — em_accel_save_state / em_accel_load_state: everything a
 * run needs to continue exactly where it stopped.
 *
 *   DIR/model.safetensors      parameters and buffers      (rank 0 writes)
 *   DIR/optimizer.safetensors  em_optim_state               (rank 0 writes)
 *   DIR/rank_R.json            this rank's counters: optimizer steps,
 *                              micro-step, loader position, sampler and
 *                              generator states            (each rank)
 *
 * Model and optimizer state are the same on every rank under DDP, so one copy
 * serves all; the counters and generators are per rank. Numbers are written
 * as decimal strings (generator seeds are full 64-bit). Every file goes to a
 * temporary name and is renamed once complete, so a crash mid-save leaves
 * the previous files whole. Saving and loading are collective: the ranks
 * agree at the end whether every one of them succeeded.
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
#include "nn/json_impl.h"
#include "tensor/fileio_impl.h"
#include "tensor/tensor_impl.h"

#define STATE_FORMAT "ember-accelerator-state-1"

static void path_in(char *buf, size_t n, const char *dir, const char *file) { snprintf(buf, n, "%s/%s", dir, file); }

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

static em_status save_counters(em_accelerator *a, const char *dir)
{
    jbuf b = {0};
    jb_puts(&b, "{\n");
    jb_puts(&b, "  \"format\": ");
    jb_str(&b, STATE_FORMAT);
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

static em_status save_optimizer(em_accelerator *a, const char *path)
{
    int n = em_optim_state(a->opt, NULL, 0);
    if (n < 0) return em_last_status();
    em_named *st = calloc((size_t)n + 1, sizeof *st);
    if (!st) return em_err(EM_ERR_OOM, "em_accel_save_state: out of memory");
    em_optim_state(a->opt, st, n);
    em_status s = em_safetensors_save(path, n, st, "{\"format\":\"ember-optimizer\"}");
    free(st);
    return s;
}

em_status em_accel_save_state(em_accelerator *a, const char *dir)
{
    if (!a || !dir || !*dir)
        return em_err(EM_ERR_ARG, "em_accel_save_state: %s", a ? "directory is empty" : "accelerator is NULL");
    em_status s = em_barrier(a->pg, NULL); /* every rank has finished the step */
    if (s) return s;
    if (a->rank == 0 && mkdir(dir, 0755) != 0 && errno != EEXIST)
        s = em_err(EM_ERR_IO, "em_accel_save_state: cannot create directory %s: %s", dir, strerror(errno));
    if ((s = agree(a, s, "em_accel_save_state"))) return s;
    char path[4096];
    if (a->rank == 0 && a->model) {
        path_in(path, sizeof path, dir, "model.safetensors");
        s = em_module_save(a->model, path);
    }
    if (!s && a->rank == 0 && a->opt) {
        path_in(path, sizeof path, dir, "optimizer.safetensors");
        s = save_optimizer(a, path);
    }
    if (!s) s = save_counters(a, dir);
    return agree(a, s, "em_accel_save_state");
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

em_status em_accel_load_state(em_accelerator *a, const char *dir)
{
    if (!a || !dir || !*dir)
        return em_err(EM_ERR_ARG, "em_accel_load_state: %s", a ? "directory is empty" : "accelerator is NULL");
    return agree(a, load_local(a, dir), "em_accel_load_state");
}
