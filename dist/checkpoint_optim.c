/* checkpoint_optim.c — an optimizer's state in a checkpoint, whole or in
 * ZeRO's shards, and re-sharding on load (checkpoint_optim_impl.h).
 *
 *   DIR/optimizer.safetensors         the whole state, em_optim_state's
 *                                     entries (DDP or one process: rank 0
 *                                     writes it; every rank holds the same)
 *   DIR/optimizer.rank_R.safetensors  under ZeRO, rank R's shard (each rank
 *                                     writes its own): "step", and for each
 *                                     parameter i of which rank R holds a
 *                                     non-empty piece [lo, lo + n), that
 *                                     piece's entries ("state.i.exp_avg" of
 *                                     shape (n), "state.i.step", ...)
 *
 * (optimizer_K.* for the K-th prepared optimizer.) A shard's metadata says
 * which save it belongs to and where its pieces lie:
 *   "format": "ember-optimizer-shard", "save_id": 16 hex digits (the
 *   manifest's), "world", "rank", "zero_stage", and "pieces": "i:lo:n:numel"
 *   for each piece, comma-separated.
 * A whole-state file holds, for each parameter it has entries of, the piece
 * [0, numel).
 *
 * Loading (any save into any run): this rank needs, for each parameter the
 * save has state of, its fields over its own piece [lo', lo' + n') (ZeRO at
 * this run's world size) or over [0, numel) (no ZeRO). The rule: the saved
 * pieces of a parameter tile [0, numel) exactly, and element e of the
 * parameter comes from the one saved piece that holds e. So a ZeRO save
 * loads at its own world size (each rank reads its own shard: bitwise),
 * at another (each rank reads the shards that overlap its pieces), without
 * ZeRO (every shard), and a whole-state save loads under ZeRO (each rank
 * slices the one file). Per-parameter step counts and the global "step"
 * must agree in every file that has them.
 *
 * Memory: the headers are read first, every file's pieces kept (a few
 * integers a parameter); then the state of this rank's pieces is allocated
 * and the files that overlap it are read one at a time, one entry at a
 * time: this rank's own state plus one entry of one file. Everything is
 * checked before anything changes; once every rank has checked its part,
 * ckpt_optim_load hands the tensors to the optimizer as its state (no
 * second copy: optim_load_state_taking).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/checkpoint_optim_impl.h"
#include "nn/json_impl.h"
#include "nn/safetensors_impl.h"
#include "optim/optim_impl.h"
#include "tensor/tensor_impl.h"

#define SHARD_FORMAT "ember-optimizer-shard"

void ckpt_optim_file(char *buf, size_t n, int k, int rank) { ckpt_object_file(buf, n, "optimizer", k, rank); }

bool ckpt_optim_is_sharded(const em_optimizer *o)
{
    for (int i = 0; o && i < o->np; i++)
        if (o->p[i].sharded) return true;
    return false;
}

/* The fields a started parameter of o has, as a bit mask (1 << F_...). */
static int all_fields(const em_optimizer *o)
{
    int full = 0;
    for (int f = 0; f < F_COUNT; f++)
        if (opt_has_field(o, f)) full |= 1 << f;
    return full;
}

/* Which parameter and field the entry `name` is ("state.I.FIELD", as o
 * names them); false for "step" and for names that are no state of o. */
static bool entry_of(const em_optimizer *o, const char *name, int *param, int *field)
{
    if (strncmp(name, "state.", 6) || name[6] < '0' || name[6] > '9') return false;
    char *end;
    long i = strtol(name + 6, &end, 10);
    if (*end != '.' || i < 0 || i >= o->np) return false;
    for (int f = 0; f < F_COUNT; f++)
        if (opt_has_field(o, f) && !strcmp(name, o->p[i].name[f])) {
            *param = (int)i;
            *field = f;
            return true;
        }
    return false;
}

/* The optimizer's parameter i, whose shape, dtype and size are read here
 * (it may be on a CUDA device: the name given to t_resolve is one that
 * takes device tensors, tensor/device.c). */
static tensor *param_of(const em_optimizer *o, int i) { return t_resolve(o->p[i].h, "em_optim_load_state"); }

/* Parameter i's numel in this run. */
static int64_t numel_of(const em_optimizer *o, int i)
{
    tensor *t = param_of(o, i);
    return t ? t_numel(t) : -1;
}

/* ---- saving ------------------------------------------------------------------------- */

em_status ckpt_optim_save(const em_optimizer *o, const char *path, const ckpt_shard_id *id, file_sum *sum,
                          const char *fn)
{
    int n = em_optim_state(o, NULL, 0);
    if (n < 0) return em_last_status();
    em_named *st = calloc((size_t)n + 1, sizeof *st);
    if (!st) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    if (em_optim_state(o, st, n) < 0) {
        free(st);
        return em_last_status();
    }
    if (!id) {
        em_status s = st_save(path, n, st, "{\"format\":\"ember-optimizer\"}", sum);
        free(st);
        return s;
    }
    /* the shard: "step" and the entries of non-empty pieces; each such
     * piece once in "pieces" */
    int kept = 0, last = -1;
    jbuf pieces = {0};
    for (int e = 0; e < n; e++) {
        int i, f;
        if (!entry_of(o, st[e].name, &i, &f)) { /* "step" */
            st[kept++] = st[e];
            continue;
        }
        const oparam *p = &o->p[i];
        int64_t lo = p->sharded ? p->lo : 0, len = p->sharded ? p->n : numel_of(o, i);
        if (len <= 0) continue;
        st[kept++] = st[e];
        if (i == last) continue; /* em_optim_state lists a parameter's fields together */
        last = i;
        char one[96];
        snprintf(one, sizeof one, "%s%d:%" PRId64 ":%" PRId64 ":%" PRId64, pieces.len ? "," : "", i, lo, len,
                 numel_of(o, i));
        jb_puts(&pieces, one);
    }
    jbuf meta = {0};
    ckpt_shard_meta(&meta, SHARD_FORMAT, id);
    jb_puts(&meta, ",\"pieces\":");
    jb_str(&meta, pieces.len ? pieces.p : "");
    jb_puts(&meta, "}");
    em_status s = pieces.oom || meta.oom ? em_err(EM_ERR_OOM, "%s: out of memory", fn)
                                         : st_save(path, kept, st, meta.p, sum);
    free(pieces.p);
    free(meta.p);
    free(st);
    return s;
}

/* ---- loading: what the files hold --------------------------------------------------- */

typedef struct piece {
    int file, param;
    int64_t lo, n;
    int fields; /* the fields the file holds for it (1 << F_...) */
} piece;

typedef struct plan {
    const em_optimizer *o;
    const ckpt_manifest *m;
    const char *dir, *fn;
    int k;
    bool sharded; /* the save's: shard files (else one whole-state file) */
    int nfiles;   /* 1, or the saved world size */
    piece *pc;    /* every file's pieces, file after file */
    int npc, cap;
    double step;   /* the global "step" */
    double *pstep; /* per parameter: its step count, once seen */
    bool *has_pstep;
} plan;

static void file_path(const plan *p, int file, char *path, size_t n, char *name, size_t nn)
{
    ckpt_optim_file(name, nn, p->k, p->sharded ? file : -1);
    if (snprintf(path, n, "%s/%s", p->dir, name) >= (int)n) path[n - 1] = '\0';
}

static em_status add_piece(plan *p, piece pc)
{
    em_status s = ckpt_room((void **)&p->pc, &p->cap, p->npc, sizeof pc, p->fn);
    if (!s) p->pc[p->npc++] = pc;
    return s;
}

/* Which files hold optimizer k's state: the whole-state file, or one shard
 * per rank of the save; each must be in the manifest (so it was verified). */
static em_status find_files(plan *p)
{
    char what[48];
    snprintf(what, sizeof what, "state of optimizer %d", p->k);
    return ckpt_find_files(p->m, p->dir, ckpt_optim_file, p->k, what, &p->nfiles, &p->sharded, p->fn);
}

/* A shard's metadata: its save, world and rank, and its pieces. */
static em_status shard_meta(plan *p, const em_safetensors *f, int file, const char *path)
{
    const char *fn = p->fn, *pcs = em_safetensors_metadata(f, "pieces");
    em_status s = ckpt_shard_check(f, path, SHARD_FORMAT, "an optimizer shard", p->m, p->nfiles, file, fn);
    if (s) return s;
    if (!pcs) return em_err(EM_ERR_IO, "%s: %s: metadata \"pieces\" is missing", fn, path);
    int first = p->npc;
    for (const char *c = pcs; *c && !s;) {
        long long v[4];
        int got = 0;
        for (int k = 0; k < 4; k++) {
            char *end;
            if (*c < '0' || *c > '9') break;
            v[k] = strtoll(c, &end, 10);
            c = end;
            got++;
            if (k < 3 && *c++ != ':') break;
        }
        if (got != 4 || (*c && *c != ','))
            return em_err(EM_ERR_IO, "%s: %s: metadata \"pieces\" is not a list of i:lo:n:numel", fn, path);
        if (*c == ',') c++;
        int i = (int)v[0];
        if (v[0] >= p->o->np)
            return em_err(
                EM_ERR_ARG,
                "%s: %s holds state of parameter %lld; this run's optimizer %d has %d parameters (is it "
                "the same model?)",
                fn, path, v[0], p->k, p->o->np);
        int64_t numel = numel_of(p->o, i);
        if (v[3] != numel)
            return em_err(
                EM_ERR_ARG,
                "%s: %s: parameter %d had %lld elements when saved; this run's has %lld (is it the same "
                "model?)",
                fn, path, i, v[3], (long long)numel);
        if (v[2] < 1 || v[1] + v[2] > numel)
            return em_err(EM_ERR_IO,
                          "%s: %s: piece [%lld, %lld) of parameter %d (%lld elements) is out of bounds", fn,
                          path, v[1], v[1] + v[2], i, (long long)numel);
        for (int q = first; q < p->npc; q++)
            if (p->pc[q].param == i)
                return em_err(EM_ERR_IO, "%s: %s: parameter %d has two pieces", fn, path, i);
        s = add_piece(p, (piece){file, i, v[1], v[2], 0});
    }
    return s;
}

/* A 0-dim count entry's value (a step count). */
static em_status read_count(const em_safetensors *f, const char *path, const char *name, double *v,
                            const char *fn)
{
    em_tensor *t = em_safetensors_get(f, name);
    if (!t) return em_last_status();
    em_status s = EM_OK;
    if (em_numel(t) != 1 || em_ndim(t) > 1)
        s = em_err(EM_ERR_IO, "%s: %s: '%s' has %lld elements; a step count has one", fn, path, name,
                   (long long)em_numel(t));
    else
        *v = em_item(t);
    em_free(t);
    return s;
}

/* The entries of one file (opened: f): whose they are, the counts' values. */
static em_status scan_entries(plan *p, const em_safetensors *f, int file, int first, const char *path)
{
    const char *fn = p->fn;
    bool has_step = false;
    em_status s = EM_OK;
    for (int e = 0; e < em_safetensors_count(f) && !s; e++) {
        const char *name = em_safetensors_name(f, e);
        int i, fld;
        double v = 0;
        if (!strcmp(name, "step")) {
            if ((s = read_count(f, path, name, &v, fn))) break;
            if (file > 0 && v != p->step)
                s = em_err(EM_ERR_IO,
                           "%s: %s says %g optimizer steps but rank 0's shard says %g: not one save", fn,
                           path, v, p->step);
            p->step = v;
            has_step = true;
            continue;
        }
        if (!entry_of(p->o, name, &i, &fld))
            return em_err(EM_ERR_ARG,
                          "%s: %s holds '%s', which is no state of this run's optimizer %d (%d parameters)",
                          fn, path, name, p->k, p->o->np);
        piece *pc = NULL;
        for (int q = first; q < p->npc && !pc; q++)
            if (p->pc[q].param == i) pc = &p->pc[q];
        if (!pc && p->sharded)
            return em_err(EM_ERR_IO, "%s: %s holds '%s' but no piece of parameter %d", fn, path, name, i);
        if (!pc) { /* the whole state: the piece is the whole parameter */
            if ((s = add_piece(p, (piece){file, i, 0, numel_of(p->o, i), 0}))) break;
            pc = &p->pc[p->npc - 1];
        }
        pc->fields |= 1 << fld;
        if (fld != F_STEP) continue;
        if ((s = read_count(f, path, name, &v, fn))) break;
        if (p->has_pstep[i] && v != p->pstep[i])
            s = em_err(EM_ERR_IO, "%s: %s says '%s' is %g but another shard says %g: not one save", fn, path,
                       name, v, p->pstep[i]);
        p->pstep[i] = v;
        p->has_pstep[i] = true;
    }
    if (!s && !has_step) s = em_err(EM_ERR_IO, "%s: %s has no 'step' (optimizer steps)", fn, path);
    return s;
}

/* Every file's header: its metadata, pieces and entries; then whether each
 * piece has every field. */
static em_status scan(plan *p)
{
    int full = all_fields(p->o);
    em_status s = EM_OK;
    for (int file = 0; file < p->nfiles && !s; file++) {
        char path[4096], name[CKPT_NAME_MAX];
        file_path(p, file, path, sizeof path, name, sizeof name);
        em_safetensors *f = st_open(path, false); /* its bytes were verified against the manifest */
        if (!f) return em_last_status();
        int first = p->npc;
        if (p->sharded) s = shard_meta(p, f, file, path);
        if (!s) s = scan_entries(p, f, file, first, path);
        for (int q = first; q < p->npc && !s; q++) {
            int miss = full & ~p->pc[q].fields;
            for (int fld = 0; fld < F_COUNT && miss; fld++)
                if (miss & (1 << fld))
                    s = em_err(EM_ERR_IO, "%s: %s holds state of parameter %d but not '%s'", p->fn, path,
                               p->pc[q].param, p->o->p[p->pc[q].param].name[fld]);
        }
        em_safetensors_close(f);
    }
    return s;
}

static int by_param_then_lo(const void *a, const void *b)
{
    const piece *x = a, *y = b;
    if (x->param != y->param) return x->param < y->param ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The pieces of every parameter tile it: from 0, each where the last ended,
 * to numel (pc sorted by parameter, then lo). */
static em_status check_cover(plan *p)
{
    char a[CKPT_NAME_MAX], b[CKPT_NAME_MAX], path[4096];
    for (int q = 0; q < p->npc;) {
        int i = p->pc[q].param;
        int64_t numel = numel_of(p->o, i), at = 0;
        for (; q < p->npc && p->pc[q].param == i; q++) {
            const piece *pc = &p->pc[q];
            if (pc->lo > at)
                return em_err(
                    EM_ERR_IO,
                    "%s: %s: elements [%lld, %lld) of parameter %d (%lld elements) are in no shard of "
                    "optimizer %d: the shards do not cover it",
                    p->fn, p->dir, (long long)at, (long long)pc->lo, i, (long long)numel, p->k);
            if (pc->lo < at) {
                file_path(p, p->pc[q - 1].file, path, sizeof path, a, sizeof a);
                file_path(p, pc->file, path, sizeof path, b, sizeof b);
                return em_err(EM_ERR_IO,
                              "%s: %s: elements [%lld, %lld) of parameter %d are in both %s and %s", p->fn,
                              p->dir, (long long)pc->lo, (long long)at, i, a, b);
            }
            at = pc->lo + pc->n;
        }
        if (at != numel)
            return em_err(EM_ERR_IO,
                          "%s: %s: elements [%lld, %lld) of parameter %d (%lld elements) are in no shard of "
                          "optimizer %d: the shards do not cover it",
                          p->fn, p->dir, (long long)at, (long long)numel, i, (long long)numel, p->k);
    }
    return EM_OK;
}

/* ---- loading: this rank's state ------------------------------------------------------ */

/* The part of parameter i this run's optimizer keeps state for. */
static void target_of(const em_optimizer *o, int i, int64_t *lo, int64_t *n)
{
    *lo = o->p[i].sharded ? o->p[i].lo : 0;
    *n = o->p[i].sharded ? o->p[i].n : numel_of(o, i);
}

em_status ckpt_optim_load(em_optimizer *o, int n, em_named *st) { return optim_load_state_taking(o, n, st); }

void ckpt_optim_state_free(em_named *st, int n)
{
    for (int e = 0; st && e < n; e++) em_free(st[e].t);
    free(st);
}

/* A persistent 0-dim f64 holding v. */
static em_tensor *count_tensor(double v)
{
    tensor *t = t_new_persistent(EM_F64, 0, NULL);
    if (t) *(double *)t_ptr(t) = v;
    return t_handle(t);
}

/* The entries of this rank's state, allocated (values from the counts; the
 * elements come next): "step", then each covered parameter's fields. */
static em_status make_state(plan *p, em_named **out, int *n)
{
    const em_optimizer *o = p->o;
    int full = all_fields(o), nf = __builtin_popcount((unsigned)full), cap = 1;
    for (int q = 0; q < p->npc; q++) cap += q == 0 || p->pc[q].param != p->pc[q - 1].param ? nf : 0;
    em_named *st = calloc((size_t)cap, sizeof *st);
    if (!st) return em_err(EM_ERR_OOM, "%s: out of memory", p->fn);
    int k = 0;
    st[k++] = (em_named){"step", count_tensor(p->step)};
    em_status s = st[0].t ? EM_OK : em_last_status();
    for (int q = 0; q < p->npc && !s; q++) {
        int i = p->pc[q].param;
        if (q > 0 && p->pc[q - 1].param == i) continue;
        tensor *t = param_of(o, i);
        int64_t lo, len, shape[EM_MAX_DIMS];
        target_of(o, i, &lo, &len);
        int nd = opt_state_shape(&o->p[i], t, shape);
        for (int f = 0; f < F_COUNT && !s; f++) {
            if (!(full & (1 << f))) continue;
            em_tensor *h = f == F_STEP ? count_tensor(p->pstep[i])
                                       : t_handle(t_new_persistent(opt_state_dtype(t->dtype), nd, shape));
            st[k++] = (em_named){o->p[i].name[f], h};
            if (!h) s = em_last_status();
        }
    }
    if (s) {
        ckpt_optim_state_free(st, k);
        return s;
    }
    *out = st;
    *n = k;
    return EM_OK;
}

/* The entry of st for field f of parameter i. */
static tensor *state_entry(const plan *p, em_named *st, int n, int i, int f)
{
    for (int e = 0; e < n; e++)
        if (st[e].name == p->o->p[i].name[f]) return t_resolve(st[e].t, p->fn);
    return NULL;
}

/* The elements of st that file's pieces hold: for each of its pieces that
 * overlaps this rank's part of the parameter, each field's overlap, read
 * one entry at a time. */
static em_status copy_from(plan *p, int file, em_named *st, int n)
{
    const em_optimizer *o = p->o;
    bool any = false;
    for (int q = 0; q < p->npc && !any; q++) {
        int64_t lo, len;
        target_of(o, p->pc[q].param, &lo, &len);
        any = p->pc[q].file == file && p->pc[q].lo < lo + len && lo < p->pc[q].lo + p->pc[q].n;
    }
    if (!any) return EM_OK;
    char path[4096], name[CKPT_NAME_MAX];
    file_path(p, file, path, sizeof path, name, sizeof name);
    em_safetensors *f = st_open(path, false);
    if (!f) return em_last_status();
    em_status s = EM_OK;
    for (int q = 0; q < p->npc && !s; q++) {
        const piece *pc = &p->pc[q];
        int i = pc->param;
        int64_t lo, len;
        target_of(o, i, &lo, &len);
        int64_t a = pc->lo > lo ? pc->lo : lo, b = pc->lo + pc->n < lo + len ? pc->lo + pc->n : lo + len;
        if (pc->file != file || a >= b) continue;
        tensor *param = param_of(o, i);
        for (int fld = 0; fld < F_COUNT && !s; fld++) {
            if (fld == F_STEP || !(pc->fields & (1 << fld))) continue;
            tensor *dst = state_entry(p, st, n, i, fld);
            em_tensor *h = em_safetensors_get(f, o->p[i].name[fld]);
            tensor *src = h ? t_resolve(h, p->fn) : NULL;
            if (!src) {
                s = em_last_status();
            } else if (t_numel(src) != pc->n ||
                       (!p->sharded &&
                        (src->ndim != param->ndim ||
                         memcmp(src->shape, param->shape, sizeof(int64_t) * (size_t)src->ndim)))) {
                char want[64];
                if (p->sharded)
                    snprintf(want, sizeof want, "(%lld)", (long long)pc->n);
                else
                    snprintf(want, sizeof want, "%s", shp(param));
                s = em_err(EM_ERR_IO, "%s: %s: '%s' is %s; parameter %d's piece there is %s", p->fn, path,
                           o->p[i].name[fld], shp(src), i, want);
            } else if (!em_dtype_is_float(src->dtype)) {
                s = em_err(EM_ERR_IO, "%s: %s: '%s' is %s; state tensors are float", p->fn, path,
                           o->p[i].name[fld], em_dtype_name(src->dtype));
            } else {
                opt_gather(src, a - pc->lo, b - a, dst->dtype,
                           (char *)t_ptr(dst) + (size_t)(a - lo) * t_esize(dst));
            }
            em_free(h);
        }
    }
    em_safetensors_close(f);
    return s;
}

em_status ckpt_optim_read(const em_optimizer *o, const char *dir, const ckpt_manifest *m, int k,
                          em_named **out, int *n, const char *fn)
{
    plan p = {.o = o, .m = m, .dir = dir, .fn = fn, .k = k};
    p.pstep = calloc((size_t)o->np + 1, sizeof *p.pstep);
    p.has_pstep = calloc((size_t)o->np + 1, sizeof *p.has_pstep);
    em_status s = p.pstep && p.has_pstep ? EM_OK : em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; i < o->np && !s; i++)
        if (numel_of(o, i) < 0) s = em_last_status();
    if (!s) s = find_files(&p);
    if (!s) s = scan(&p);
    if (!s) {
        if (p.npc) qsort(p.pc, (size_t)p.npc, sizeof *p.pc, by_param_then_lo);
        s = check_cover(&p);
    }
    em_named *st = NULL;
    int nst = 0;
    if (!s) s = make_state(&p, &st, &nst);
    for (int file = 0; file < p.nfiles && !s; file++) s = copy_from(&p, file, st, nst);
    if (!s) s = optim_check_state(o, nst, st, "em_optim_load_state"); /* its messages, as the load's */
    free(p.pc);
    free(p.pstep);
    free(p.has_pstep);
    if (s) {
        ckpt_optim_state_free(st, nst);
        return s;
    }
    *out = st;
    *n = nst;
    return EM_OK;
}
