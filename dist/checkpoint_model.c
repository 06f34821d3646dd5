/* checkpoint_model.c — a model in a checkpoint as ZeRO stage 3 keeps it,
 * one shard per rank, and any model file of a save read back, whole or in
 * part (checkpoint_model_impl.h).
 *
 *   DIR/model.safetensors         the whole model (em_module_save's file:
 *                                 below stage 3, rank 0 writes it)
 *   DIR/model.rank_R.safetensors  under ZeRO stage 3, rank R's shard (each
 *                                 rank writes its own, no rank gathers the
 *                                 model): for each tensor of which rank R
 *                                 holds a non-empty piece [lo, lo + n), an
 *                                 entry named as the tensor of n elements
 *
 * (model_K.* for the K-th prepared model.) Rank R's piece of a parameter is
 * the part of it in R's chunk of its bucket (dist/zero.c), stored 1-D;
 * buffers and parameters in no bucket (the same on every rank) go whole,
 * in their own shape, in rank 0's shard. A shard's metadata: the save
 * (ckpt_shard_meta: "format": "ember-model-shard", "save_id", "world",
 * "rank", "zero_stage"), "tensors": how many tensors the model has, and for
 * each entry "piece.NAME": "K:LO:N:SHAPE", K the tensor's place in
 * em_module_save's order (parameters, then buffers), SHAPE its full shape
 * (dims comma-separated, empty for a scalar).
 *
 * Reading (a load, any world and stage; `ember merge-weights`): first every
 * file's header, kept as a few integers a piece; the pieces of a tensor
 * must tile [0, numel) exactly, and the files must agree on its name, shape
 * and dtype. A whole model file is one file whose entries are whole pieces
 * (K: the entry's place in the file). Then ckpt_model_fill copies the
 * elements a caller wants (a rank's share, or everything) out of the files
 * that hold them, one file and one entry at a time.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/checkpoint_model_impl.h"
#include "nn/safetensors_impl.h"
#include "tensor/tensor_impl.h"

#define SHARD_FORMAT "ember-model-shard"

void ckpt_model_file(char *buf, size_t n, int k, int rank) { ckpt_object_file(buf, n, "model", k, rank); }

/* ---- saving --------------------------------------------------------------------------- */

/* The model's tensors, parameters then buffers (malloc'd; *n of them). */
static em_named *tensors_of(const em_module *m, int *n, const char *fn)
{
    int np = em_module_params(m, NULL, 0), nb = em_module_buffers(m, NULL, 0);
    em_named *v = calloc((size_t)(np + nb) + 1, sizeof *v);
    if (!v) return em_fail(EM_ERR_OOM, "%s: out of memory", fn);
    em_module_params(m, v, np);
    em_module_buffers(m, v + np, nb);
    *n = np + nb;
    return v;
}

em_status ckpt_model_save(const em_module *m, const ckpt_range *share, const char *path,
                          const ckpt_shard_id *id, file_sum *sum, const char *fn)
{
    int n = 0, kept = 0;
    em_named *v = tensors_of(m, &n, fn);
    if (!v) return em_last_status();
    tensor **views = calloc((size_t)n + 1, sizeof *views);
    jbuf meta = {0};
    ckpt_shard_meta(&meta, SHARD_FORMAT, id);
    char num[64];
    snprintf(num, sizeof num, ",\"tensors\":\"%d\"", n);
    jb_puts(&meta, num);
    em_status s = views ? EM_OK : em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; i < n && !s; i++) {
        tensor *t = t_resolve(v[i].t, fn);
        if (!t) {
            s = em_last_status();
            break;
        }
        ckpt_range r = share[i];
        if (r.n <= 0 && !(t_numel(t) == 0 && id->rank == 0)) continue; /* an empty tensor: rank 0 names it */
        if (r.lo < 0 || r.lo + r.n > t_numel(t) || (r.n < t_numel(t) && !t_is_contig(t))) {
            s = em_err(EM_ERR_ARG, "%s: '%s' %s: share [%lld, %lld) is not a contiguous part of it", fn,
                       v[i].name, shp(t), (long long)r.lo, (long long)(r.lo + r.n));
            break;
        }
        em_tensor *entry = v[i].t; /* whole: as it is; a part: a 1-D view of it */
        if (r.n < t_numel(t)) {
            views[i] = t_view_persistent(t, 1, &r.n, (int64_t[]){1}, t->offset + r.lo);
            if (!views[i]) {
                s = em_last_status();
                break;
            }
            entry = t_handle(views[i]);
        }
        jb_puts(&meta, ",");
        char key[1100];
        snprintf(key, sizeof key, "piece.%s", v[i].name);
        jb_str(&meta, key);
        char val[64 + 24 * EM_MAX_DIMS];
        int at = snprintf(val, sizeof val, "%d:%" PRId64 ":%" PRId64 ":", i, r.lo, r.n);
        for (int d = 0; d < t->ndim; d++)
            at += snprintf(val + at, sizeof val - (size_t)at, "%s%" PRId64, d ? "," : "", t->shape[d]);
        jb_puts(&meta, ":");
        jb_str(&meta, val);
        v[kept++] = (em_named){v[i].name, entry};
    }
    jb_puts(&meta, "}");
    if (!s && meta.oom) s = em_err(EM_ERR_OOM, "%s: out of memory", fn);
    if (!s) s = st_save(path, kept, v, meta.p, sum);
    for (int i = 0; views && i < n; i++) t_free(views[i]);
    free(views);
    free(meta.p);
    free(v);
    return s;
}

/* ---- reading: what the files hold ------------------------------------------------------ */

void ckpt_model_free(ckpt_model *cm)
{
    for (int i = 0; cm->t && i < cm->nt; i++) free(cm->t[i].name);
    free(cm->t);
    free(cm->pc);
    *cm = (ckpt_model){0};
}

int ckpt_model_find(const ckpt_model *cm, const char *name)
{
    for (int i = 0; i < cm->nt; i++)
        if (!strcmp(cm->t[i].name, name)) return i;
    return -1;
}

static void file_path(const ckpt_model *cm, int file, char *path, size_t n)
{
    char name[CKPT_NAME_MAX];
    ckpt_model_file(name, sizeof name, cm->k, cm->sharded ? file : -1);
    if (snprintf(path, n, "%s/%s", cm->dir, name) >= (int)n) path[n - 1] = '\0';
}

/* The tensor count: every shard says the same. */
static em_status set_count(ckpt_model *cm, int64_t nt, const char *path)
{
    if (cm->t) {
        if (nt == cm->nt) return EM_OK;
        return em_err(EM_ERR_IO,
                      "%s: %s says the model has %lld tensors; rank 0's shard says %d: not one save", cm->fn,
                      path, (long long)nt, cm->nt);
    }
    if (nt > (1 << 24))
        return em_err(EM_ERR_IO, "%s: %s: %lld tensors is not a model", cm->fn, path, (long long)nt);
    cm->t = calloc((size_t)nt + 1, sizeof *cm->t);
    if (!cm->t) return em_err(EM_ERR_OOM, "%s: out of memory", cm->fn);
    cm->nt = (int)nt;
    return EM_OK;
}

/* Tensor k is name, dtype, shape: the first file to hold it says so, the
 * others must agree. */
static em_status describe(ckpt_model *cm, int k, const char *name, int dt, int nd, const int64_t *shape,
                          const char *path)
{
    ckpt_mtensor *t = &cm->t[k];
    if (!t->name) {
        if (!(t->name = strdup(name))) return em_err(EM_ERR_OOM, "%s: out of memory", cm->fn);
        t->dtype = (em_dtype)dt;
        t->ndim = nd;
        t->numel = 1;
        for (int d = 0; d < nd; d++) t->numel *= (t->shape[d] = shape[d]);
        return EM_OK;
    }
    if (!strcmp(t->name, name) && t->dtype == (em_dtype)dt && t->ndim == nd &&
        !memcmp(t->shape, shape, sizeof(int64_t) * (size_t)nd))
        return EM_OK;
    return em_err(EM_ERR_IO,
                  "%s: %s holds '%s' %s%s as tensor %d; another shard has '%s' %s%s there: not one save",
                  cm->fn, path, name, em_dtype_name((em_dtype)dt), shp_of(nd, shape), k, t->name,
                  em_dtype_name(t->dtype), shp_of(t->ndim, t->shape));
}

static em_status add_piece(ckpt_model *cm, ckpt_mpiece pc)
{
    em_status s = ckpt_room((void **)&cm->pc, &cm->cap, cm->npc, sizeof pc, cm->fn);
    if (!s) cm->pc[cm->npc++] = pc;
    return s;
}

/* "K:LO:N:D0,D1,..." into its numbers; false when it is not that. */
static bool parse_piece(const char *s, int64_t v[3], int *nd, int64_t *shape)
{
    char *end;
    for (int k = 0; k < 3; k++) {
        if (*s < '0' || *s > '9') return false;
        v[k] = strtoll(s, &end, 10);
        if (*end != ':') return false;
        s = end + 1;
    }
    for (*nd = 0; *s; (*nd)++) {
        if (*nd == EM_MAX_DIMS || *s < '0' || *s > '9') return false;
        shape[*nd] = strtoll(s, &end, 10);
        s = *end == ',' && end[1] ? end + 1 : end;
        if (*s && *end != ',') return false;
    }
    return true;
}

/* One entry of a shard: its "piece.NAME" against the entry itself. */
static em_status shard_entry(ckpt_model *cm, const em_safetensors *f, int file, const char *name,
                             const char *path)
{
    char key[1100];
    snprintf(key, sizeof key, "piece.%s", name);
    const char *val = em_safetensors_metadata(f, key);
    int64_t v[3], shape[EM_MAX_DIMS], es[EM_MAX_DIMS], numel = 1, got = 1;
    int nd = 0, dt = st_dtype(f, name), end = em_safetensors_shape(f, name, es);
    if (dt < 0 || end < 0) return em_last_status();
    for (int d = 0; d < end; d++) got *= es[d];
    if (!val || !parse_piece(val, v, &nd, shape))
        return em_err(EM_ERR_IO, "%s: %s: metadata \"%s\" is %s%.60s%s, not K:LO:N:SHAPE", cm->fn, path, key,
                      val ? "'" : "", val ? val : "missing", val ? "'" : "");
    for (int d = 0; d < nd; d++) numel *= shape[d];
    if (v[0] >= cm->nt || v[2] != got || v[1] + v[2] > numel || (v[2] == 0 && numel != 0))
        return em_err(
            EM_ERR_IO,
            "%s: %s: '%s' (%lld elements) as piece [%lld, %lld) of tensor %lld of %d (%lld elements) "
            "does not fit",
            cm->fn, path, name, (long long)got, (long long)v[1], (long long)(v[1] + v[2]), (long long)v[0],
            cm->nt, (long long)numel);
    em_status s = describe(cm, (int)v[0], name, dt, nd, shape, path);
    return s ? s : add_piece(cm, (ckpt_mpiece){file, (int)v[0], v[1], v[2]});
}

/* One file's header: a shard's metadata and pieces, or a whole model's entries. */
static em_status scan_file(ckpt_model *cm, const ckpt_manifest *m, int file)
{
    char path[4096];
    file_path(cm, file, path, sizeof path);
    em_safetensors *f = st_open(path, false); /* its bytes were verified against the manifest */
    if (!f) return em_last_status();
    int n = em_safetensors_count(f);
    int64_t nt = n;
    em_status s = EM_OK;
    if (cm->sharded) {
        s = ckpt_shard_check(f, path, SHARD_FORMAT, "a model shard", m, cm->nfiles, file, cm->fn);
        if (!s) s = ckpt_meta_count(f, path, "tensors", &nt, cm->fn);
    }
    if (!s) s = set_count(cm, nt, path);
    for (int e = 0; e < n && !s; e++) {
        const char *name = em_safetensors_name(f, e);
        if (cm->sharded) {
            s = shard_entry(cm, f, file, name, path);
            continue;
        }
        int64_t shape[EM_MAX_DIMS];
        int dt = st_dtype(f, name), nd = em_safetensors_shape(f, name, shape);
        s = dt < 0 || nd < 0 ? em_last_status() : describe(cm, e, name, dt, nd, shape, path);
        if (!s) s = add_piece(cm, (ckpt_mpiece){0, e, 0, cm->t[e].numel});
    }
    em_safetensors_close(f);
    return s;
}

static int by_tensor_then_lo(const void *a, const void *b)
{
    const ckpt_mpiece *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Every tensor is described, and its pieces (sorted) tile it: each starts
 * where the last ended, the last ends at numel. */
static em_status check_tiling(const ckpt_model *cm)
{
    int q = 0;
    for (int i = 0; i < cm->nt; i++) {
        const ckpt_mtensor *t = &cm->t[i];
        if (!t->name)
            return em_err(EM_ERR_IO,
                          "%s: %s: tensor %d of model %d's %d is in no shard: the shards do not cover it",
                          cm->fn, cm->dir, i, cm->k, cm->nt);
        int64_t at = 0;
        for (; q < cm->npc && cm->pc[q].t == i; q++) {
            if (cm->pc[q].lo == at) {
                at += cm->pc[q].n;
                continue;
            }
            char other[4096], here[4096];
            file_path(cm, cm->pc[q].file, here, sizeof here);
            file_path(cm, q > 0 ? cm->pc[q - 1].file : 0, other, sizeof other);
            if (cm->pc[q].lo > at) break;
            return em_err(EM_ERR_IO, "%s: elements [%lld, %lld) of '%s' are in both %s and %s", cm->fn,
                          (long long)cm->pc[q].lo, (long long)at, t->name, other, here);
        }
        if (at != t->numel)
            return em_err(
                EM_ERR_IO,
                "%s: %s: elements [%lld, %lld) of '%s' (%lld elements) are in no shard of model %d: the "
                "shards do not cover it",
                cm->fn, cm->dir, (long long)at,
                (long long)(q < cm->npc && cm->pc[q].t == i ? cm->pc[q].lo : t->numel), t->name,
                (long long)t->numel, cm->k);
    }
    return EM_OK;
}

em_status ckpt_model_scan(ckpt_model *cm, const char *dir, const ckpt_manifest *m, int k, const char *fn)
{
    *cm = (ckpt_model){.dir = dir, .fn = fn, .k = k};
    char what[32];
    snprintf(what, sizeof what, "model %d", k);
    em_status s = ckpt_find_files(m, dir, ckpt_model_file, k, what, &cm->nfiles, &cm->sharded, fn);
    for (int file = 0; file < cm->nfiles && !s; file++) s = scan_file(cm, m, file);
    if (!s && cm->npc) qsort(cm->pc, (size_t)cm->npc, sizeof *cm->pc, by_tensor_then_lo);
    if (!s) s = check_tiling(cm);
    if (s) ckpt_model_free(cm);
    return s;
}

/* ---- reading: the elements --------------------------------------------------------------- */

/* The part of piece pc that want covers: [*a, *b), false when none. */
static bool overlap(const ckpt_mpiece *pc, const ckpt_range *want, int64_t *a, int64_t *b)
{
    *a = pc->lo > want->lo ? pc->lo : want->lo;
    *b = pc->lo + pc->n < want->lo + want->n ? pc->lo + pc->n : want->lo + want->n;
    return *a < *b;
}

em_status ckpt_model_fill(const ckpt_model *cm, const ckpt_range *want, void *const *dst)
{
    em_status s = EM_OK;
    for (int file = 0; file < cm->nfiles && !s; file++) {
        em_safetensors *f = NULL;
        for (int q = 0; q < cm->npc && !s; q++) {
            const ckpt_mpiece *pc = &cm->pc[q];
            const ckpt_mtensor *t = &cm->t[pc->t];
            int64_t a, b;
            if (pc->file != file || !overlap(pc, &want[pc->t], &a, &b)) continue;
            if (!f) { /* opened only when it holds something wanted */
                char path[4096];
                file_path(cm, file, path, sizeof path);
                if (!(f = st_open(path, false))) return em_last_status();
            }
            em_tensor *h = em_safetensors_get(f, t->name);
            tensor *src = h ? t_resolve(h, cm->fn) : NULL;
            if (!src) {
                s = em_last_status();
            } else {
                size_t es = em_dtype_size(t->dtype);
                memcpy((char *)dst[pc->t] + (size_t)(a - want[pc->t].lo) * es,
                       (const char *)t_ptr(src) + (size_t)(a - pc->lo) * es, (size_t)(b - a) * es);
            }
            em_free(h);
        }
        em_safetensors_close(f);
    }
    return s;
}

/* ---- merging ------------------------------------------------------------------------------- */

em_status ckpt_merge_model(const char *dir, int k, const char *out, int *ntensors, int64_t *bytes,
                           const char *fn)
{
    char real[4096];
    ckpt_manifest m;
    ckpt_model cm = {0};
    em_status s = ckpt_open(dir, CKPT_STATE_FORMAT, real, sizeof real, &m, fn);
    if (!s) s = ckpt_model_scan(&cm, real, &m, k, fn);
    em_named *v = s ? NULL : calloc((size_t)cm.nt + 1, sizeof *v);
    ckpt_range *want = s ? NULL : calloc((size_t)cm.nt + 1, sizeof *want);
    void **dst = s ? NULL : calloc((size_t)cm.nt + 1, sizeof *dst);
    if (!s && (!v || !want || !dst)) s = em_err(EM_ERR_OOM, "%s: out of memory", fn);
    int64_t total = 0;
    for (int i = 0; i < cm.nt && !s; i++) {
        const ckpt_mtensor *t = &cm.t[i];
        tensor *h = t_new_persistent(t->dtype, t->ndim, t->shape);
        if (!h) {
            s = em_last_status();
            break;
        }
        v[i] = (em_named){t->name, t_handle(h)};
        want[i] = (ckpt_range){0, t->numel};
        dst[i] = t_ptr(h);
        total += t->numel * (int64_t)em_dtype_size(t->dtype);
    }
    if (!s) s = ckpt_model_fill(&cm, want, dst);
    if (!s) s = st_save(out, cm.nt, v, "{\"format\":\"pt\"}", NULL);
    if (!s && ntensors) *ntensors = cm.nt;
    if (!s && bytes) *bytes = total;
    for (int i = 0; v && i < cm.nt; i++) em_free(v[i].t);
    free(v);
    free(want);
    free(dst);
    ckpt_model_free(&cm);
    ckpt_manifest_free(&m);
    return s;
}
