/* test_zero_checkpoint.c — em_accel_save_state / em_accel_load_state under
 * ZeRO (dist/checkpoint_optim.c): every rank writes its optimizer shard,
 * the manifest lists each with its checksum, and a load refuses a shard
 * that is missing, damaged, of another save, or that leaves part of a
 * parameter uncovered, naming the file or the parameter, before anything
 * changes. (The resumes themselves, bitwise and re-sharded: test_ddp.c.) */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dist_util.h"
#include "harness.h"
#include "accel_rig.h"
#include "optim/optim_impl.h"

enum { VOCAB = RIG_VOCAB, T = RIG_T };

/* rig_new_at (accel_rig.h) with buckets of 2 KB: many buckets, so every rank
 * has pieces of several parameters, and parameters cut between ranks. */
static rig *rig_new(void) { return rig_new_at(1, 0.002, 16); }

/* A checksum of everything a load would change here: the flat parameters
 * and every optimizer state entry (names and values). */
static uLong rig_sum(rig *r)
{
    em_tensor *flat = em_module_flat_params(r->g->m, EM_F32);
    CHECK_NOTNULL(flat);
    uLong c = crc32(0, em_data(flat), (uInt)(em_numel(flat) * (int64_t)sizeof(float)));
    int n = em_optim_state(r->opt, NULL, 0);
    CHECK(n > 1 && n <= 128);
    em_named st[128];
    CHECK(em_optim_state(r->opt, st, n) == n);
    for (int i = 0; i < n; i++) {
        c = crc32(c, (const Bytef *)st[i].name, (uInt)strlen(st[i].name));
        c = crc32(c, em_data(st[i].t),
                  (uInt)(em_numel(st[i].t) * (int64_t)em_dtype_size(em_dtype_of(st[i].t))));
    }
    return c;
}

static void make_dir(char *dir, size_t n)
{
    char base[PATH_MAX];
    th_tmpdir(base, sizeof base, "ember-zckpt");
    th_pathf(dir, n, "%s/state", base);
}

/* ---- what a save writes ------------------------------------------------------------ */

/* The manifest text m lists dir/name with its size and crc32. */
static void check_listed(const char *m, const char *dir, const char *name)
{
    size_t len;
    char *body = th_slurp(th_path(dir, name), &len);
    char want[200];
    snprintf(want, sizeof want, "{\"name\": \"%s\", \"size\": \"%zu\", \"crc32\": \"%08lx\"}", name, len,
             crc32(0, (const Bytef *)body, (uInt)len));
    if (!strstr(m, want)) th_fail(__FILE__, __LINE__, "manifest lacks %s:\n%s", want, m);
    free(body);
}

static void saves_shards(int rank, int world, void *ctx)
{
    (void)world;
    const char *dir = ctx;
    rig *r = rig_new();
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, dir));
    if (rank == 0) {
        size_t n;
        char *m = th_slurp(th_path(dir, "manifest.json"), &n);
        const char *at = strstr(m, "\"save_id\": \"");
        CHECK(at != NULL);
        char id[17];
        memcpy(id, at + 12, 16);
        id[16] = '\0';
        CHECK(access(th_path(dir, "optimizer.safetensors"), F_OK) != 0); /* no whole state under ZeRO */
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "optimizer.rank_%d.safetensors", k);
            check_listed(m, dir, name);
            em_safetensors *f = em_safetensors_open(th_path(dir, name));
            CHECK_NOTNULL(f);
            char rk[8];
            snprintf(rk, sizeof rk, "%d", k);
            CHECK(!strcmp(em_safetensors_metadata(f, "save_id"), id));
            CHECK(!strcmp(em_safetensors_metadata(f, "world"), "2"));
            CHECK(!strcmp(em_safetensors_metadata(f, "rank"), rk));
            CHECK(!strcmp(em_safetensors_metadata(f, "zero_stage"), "1"));
            CHECK(strlen(em_safetensors_metadata(f, "pieces")) > 0);
            em_safetensors_close(f);
        }
        free(m);
    }
    rig_free(r);
}

TEST(test_zero_save_state_writes_every_ranks_optimizer_shard_and_the_manifest_lists_each)
{
    char dir[PATH_MAX];
    make_dir(dir, sizeof dir);
    TH_RANKS_ENV(2, saves_shards, dir);
}

static void saves_twice(int rank, int world, void *ctx)
{
    (void)rank, (void)world;
    const char *dir = ctx;
    rig *r = rig_new();
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, dir));
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, dir)); /* the shards are checkpoint files: DIR is replaced */
    uLong saved = rig_sum(r);
    rig_step(r);
    CHECK_OK(em_accel_load_state(r->a, dir));
    CHECK(rig_sum(r) == saved);
    rig_free(r);
}

TEST(test_zero_save_state_replaces_a_previous_zero_checkpoint_and_loads_it_back)
{
    char dir[PATH_MAX];
    make_dir(dir, sizeof dir);
    TH_RANKS_ENV(2, saves_twice, dir);
}

/* ---- refused loads ------------------------------------------------------------------- */

typedef struct spoil {
    char dir[PATH_MAX], other[PATH_MAX]; /* other: a second save (the shard of another save) */
    void (*fn)(const struct spoil *sp); /* rank 0 spoils dir with it */
    const char *want;                   /* what the error must say (besides the file) */
    const char *names;                  /* the file or directory the error must name */
    int stage;                          /* the ZeRO stage (0: 1) */
} spoil;

/* Saves (twice when sp->other is set), steps on, lets rank 0 spoil the
 * save, then checks that the load fails on every rank (each verifies every
 * file and reads every shard's header) saying sp->want and naming
 * sp->names, and that nothing changed. */
static void load_spoiled(int rank, int world, void *ctx)
{
    (void)world;
    const spoil *sp = ctx;
    rig *r = rig_new_at(sp->stage ? sp->stage : 1, 0.002, 16);
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, sp->dir));
    if (sp->other[0]) {
        rig_step(r);
        CHECK_OK(em_accel_save_state(r->a, sp->other));
    }
    rig_step(r); /* the state moves on: a load that changed it would show */
    uLong before = rig_sum(r);
    CHECK_OK(em_accel_wait_for_everyone(r->a));
    if (rank == 0) sp->fn(sp);
    CHECK_OK(em_accel_wait_for_everyone(r->a));
    em_status s = em_accel_load_state(r->a, sp->dir);
    if (s == EM_OK) th_fail(__FILE__, __LINE__, "rank %d: the spoiled save loaded", rank);
    const char *msg = em_last_error();
    if (s != EM_ERR_IO || !strstr(msg, sp->want) || !strstr(msg, sp->names))
        th_fail(__FILE__, __LINE__, "rank %d: status %d '%s' does not say '%s' naming %s", rank, s, msg,
                sp->want, sp->names);
    CHECK(rig_sum(r) == before);
    rig_free(r);
}

static void shard_1_path(const spoil *sp, char *path, size_t n)
{
    snprintf(path, n, "%s", th_path(sp->dir, "optimizer.rank_1.safetensors"));
}

static void remove_shard_1(const spoil *sp)
{
    char path[PATH_MAX];
    shard_1_path(sp, path, sizeof path);
    CHECK(unlink(path) == 0);
}

static void run_spoiled(spoil *sp, void (*fn)(const spoil *), const char *want, bool named_file)
{
    make_dir(sp->dir, sizeof sp->dir);
    sp->fn = fn;
    sp->want = want;
    static char shard[PATH_MAX];
    shard_1_path(sp, shard, sizeof shard);
    sp->names = named_file ? shard : sp->dir;
    TH_RANKS_ENV(2, load_spoiled, sp);
}

TEST(test_zero_load_state_refuses_a_missing_shard_naming_it_and_changes_nothing)
{
    spoil sp = {0};
    run_spoiled(&sp, remove_shard_1, "cannot open", true);
}

static void flip_shard_1(const spoil *sp)
{
    char path[PATH_MAX];
    shard_1_path(sp, path, sizeof path);
    size_t n;
    char *b = th_slurp(path, &n);
    b[n - 5] ^= 0x10; /* inside the last entry's values */
    th_write_file(path, b, n);
    free(b);
}

TEST(test_zero_load_state_refuses_a_corrupted_shard_naming_it_and_changes_nothing)
{
    spoil sp = {0};
    run_spoiled(&sp, flip_shard_1, "the checksum does not match the manifest", true);
}

static void shard_of_other_save(const spoil *sp)
{
    char path[PATH_MAX];
    shard_1_path(sp, path, sizeof path);
    size_t n;
    char *b = th_slurp(th_path(sp->other, "optimizer.rank_1.safetensors"), &n);
    th_write_file(path, b, n);
    free(b);
    th_reseal_checkpoint(sp->dir); /* the manifest as a writer mixing two saves would make it */
}

TEST(test_zero_load_state_refuses_a_shard_of_another_save_even_with_a_matching_checksum)
{
    spoil sp = {0};
    make_dir(sp.other, sizeof sp.other);
    run_spoiled(&sp, shard_of_other_save, "belongs to save", true);
}

/* Rewrites rank 1's shard without its first piece (the piece's entries and
 * its place in "pieces"), and reseals the manifest. */
static void drop_a_piece(const spoil *sp)
{
    char path[PATH_MAX];
    shard_1_path(sp, path, sizeof path);
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    const char *pieces = em_safetensors_metadata(f, "pieces");
    CHECK(pieces && strchr(pieces, ','));
    char prefix[32];
    snprintf(prefix, sizeof prefix, "state.%d.", atoi(pieces)); /* the first piece's parameter */
    int n = em_safetensors_count(f), k = 0;
    em_named *keep = calloc((size_t)n, sizeof *keep);
    CHECK(keep != NULL);
    for (int i = 0; i < n; i++) {
        const char *name = em_safetensors_name(f, i);
        if (!strncmp(name, prefix, strlen(prefix))) continue;
        keep[k].name = name;
        keep[k].t = em_safetensors_get(f, name);
        CHECK_NOTNULL(keep[k].t);
        k++;
    }
    CHECK(k < n);
    char meta[4096];
    snprintf(meta, sizeof meta,
             "{\"format\":\"%s\",\"save_id\":\"%s\",\"world\":\"2\",\"rank\":\"1\",\"zero_stage\":\"1\","
             "\"pieces\":\"%s\"}",
             em_safetensors_metadata(f, "format"), em_safetensors_metadata(f, "save_id"),
             strchr(pieces, ',') + 1);
    CHECK_OK(em_safetensors_save(path, k, keep, meta));
    for (int i = 0; i < k; i++) em_free(keep[i].t);
    free(keep);
    em_safetensors_close(f);
    th_reseal_checkpoint(sp->dir);
}

TEST(test_zero_load_state_refuses_shards_that_do_not_cover_a_parameter)
{
    spoil sp = {0};
    run_spoiled(&sp, drop_a_piece, "are in no shard of optimizer 0: the shards do not cover it", false);
}

/* ---- ZeRO stage 3: the model's shards (dist/checkpoint_model.c) --------------------------- */

/* The elements of this rank's flat parameters that read as zero (stage 3
 * gives back the pages outside its chunks: they read as zeros). */
static int64_t zeros_in_params(rig *r, int64_t *total)
{
    em_tensor *flat = em_module_flat_params(r->g->m, EM_F32);
    CHECK_NOTNULL(flat);
    const float *p = em_data(flat);
    int64_t z = 0;
    *total = em_numel(flat);
    for (int64_t i = 0; i < *total; i++) z += p[i] == 0.0f;
    return z;
}

static void saves_model_shards(int rank, int world, void *ctx)
{
    (void)world;
    const char *dir = ctx;
    rig *r = rig_new_at(3, 0, 64); /* one bucket: each rank's chunk is half the model (~100 KB) */
    rig_step(r);
    int64_t total, before = zeros_in_params(r, &total);
    CHECK(before > total / 4); /* most of the other rank's half was given back */
    CHECK_OK(em_accel_save_state(r->a, dir));
    int64_t after = zeros_in_params(r, &total);
    if (after != before) /* a gather would have filled the other half */
        th_fail(__FILE__, __LINE__, "rank %d: save_state made %lld parameter elements resident", rank,
                (long long)(before - after));
    if (rank == 0) {
        size_t n;
        char *m = th_slurp(th_path(dir, "manifest.json"), &n);
        CHECK(access(th_path(dir, "model.safetensors"), F_OK) != 0); /* no whole model under stage 3 */
        int64_t pieces = 0;
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "model.rank_%d.safetensors", k);
            check_listed(m, dir, name);
            em_safetensors *f = em_safetensors_open(th_path(dir, name));
            CHECK_NOTNULL(f);
            CHECK(!strcmp(em_safetensors_metadata(f, "format"), "ember-model-shard"));
            CHECK(!strcmp(em_safetensors_metadata(f, "zero_stage"), "3"));
            char key[300];
            snprintf(key, sizeof key, "piece.%s", em_safetensors_name(f, 0));
            CHECK(em_safetensors_metadata(f, key) != NULL);
            for (int e = 0; e < em_safetensors_count(f); e++) {
                int64_t shape[EM_MAX_DIMS], numel = 1;
                int nd = em_safetensors_shape(f, em_safetensors_name(f, e), shape);
                for (int d = 0; d < nd; d++) numel *= shape[d];
                pieces += numel;
            }
            em_safetensors_close(f);
        }
        CHECK(pieces == total); /* every element once: the two halves */
        free(m);
    }
    rig_free(r);
}

TEST(test_zero_3_save_state_writes_each_ranks_model_shard_without_gathering_the_model)
{
    char dir[PATH_MAX];
    make_dir(dir, sizeof dir);
    TH_RANKS_ENV(2, saves_model_shards, dir);
}

/* The whole flat parameters (gathered: collective), copied. */
static float *gathered_params(rig *r, int64_t *n)
{
    CHECK_OK(em_accel_gather_params(r->a));
    em_tensor *flat = em_module_flat_params(r->g->m, EM_F32);
    *n = em_numel(flat);
    float *p = malloc(sizeof *p * (size_t)*n);
    CHECK(p != NULL);
    memcpy(p, em_data(flat), sizeof *p * (size_t)*n);
    return p;
}

/* A load writes only this rank's chunks; buckets gathered before it must
 * not count as whole after it, or the next use would read the old values
 * of the other ranks' chunks. */
static void loads_over_gathered(int rank, int world, void *ctx)
{
    (void)rank, (void)world;
    const char *dir = ctx;
    rig *r = rig_new_at(3, 0.002, 16);
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, dir));
    int64_t n, m;
    float *saved = gathered_params(r, &n);
    rig_step(r);
    free(gathered_params(r, &m)); /* every bucket whole, with the new values */
    CHECK_OK(em_accel_load_state(r->a, dir));
    float *loaded = gathered_params(r, &m);
    CHECK(m == n && !memcmp(saved, loaded, sizeof *saved * (size_t)n));
    free(saved);
    free(loaded);
    rig_free(r);
}

TEST(test_zero_3_load_state_over_gathered_parameters_gives_the_saved_ones)
{
    char dir[PATH_MAX];
    make_dir(dir, sizeof dir);
    TH_RANKS_ENV(2, loads_over_gathered, dir);
}

/* Rewrites rank 1's model shard without its first entry (and that entry's
 * "piece." key), and reseals the manifest. */
static void drop_a_model_piece(const spoil *sp)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", th_path(sp->dir, "model.rank_1.safetensors"));
    em_safetensors *f = em_safetensors_open(path);
    CHECK_NOTNULL(f);
    int n = em_safetensors_count(f);
    CHECK(n > 1);
    em_named *keep = calloc((size_t)n, sizeof *keep);
    CHECK(keep != NULL);
    char meta[8192];
    int at = snprintf(meta, sizeof meta,
                      "{\"format\":\"%s\",\"save_id\":\"%s\",\"world\":\"2\",\"rank\":\"1\","
                      "\"zero_stage\":\"3\",\"tensors\":\"%s\"",
                      em_safetensors_metadata(f, "format"), em_safetensors_metadata(f, "save_id"),
                      em_safetensors_metadata(f, "tensors"));
    for (int i = 1; i < n; i++) {
        keep[i - 1].name = em_safetensors_name(f, i);
        keep[i - 1].t = em_safetensors_get(f, keep[i - 1].name);
        CHECK_NOTNULL(keep[i - 1].t);
        char key[300];
        snprintf(key, sizeof key, "piece.%s", keep[i - 1].name);
        at += snprintf(meta + at, sizeof meta - (size_t)at, ",\"%s\":\"%s\"", key,
                       em_safetensors_metadata(f, key));
    }
    snprintf(meta + at, sizeof meta - (size_t)at, "}");
    CHECK_OK(em_safetensors_save(path, n - 1, keep, meta));
    for (int i = 0; i < n - 1; i++) em_free(keep[i].t);
    free(keep);
    em_safetensors_close(f);
    th_reseal_checkpoint(sp->dir);
}

TEST(test_zero_3_load_state_refuses_model_shards_that_do_not_cover_a_parameter)
{
    spoil sp = {.stage = 3};
    run_spoiled(&sp, drop_a_model_piece, "are in no shard of model 0: the shards do not cover it", false);
}

/* ---- the assembled state is not held twice ------------------------------------------
 * A load builds this rank's state, then hands it to the optimizer
 * (optim_load_state_taking): the tensors that fit become the optimizer's
 * state as they are, so a rank never holds its state twice; one that does
 * not fit (here an f64 moment for an f32 parameter) is copied and stays
 * the caller's. */
TEST(test_optim_load_state_taking_keeps_fitting_state_tensors_instead_of_copying_them)
{
    em_tensor *w = em_full(EM_F32, 1, (int64_t[]){4}, 1.0);
    CHECK_NOTNULL(w);
    CHECK_OK(em_set_requires_grad(w, true));
    em_adam_config ac = em_adamw_defaults();
    em_optimizer *o = em_adamw_new(1, &w, &ac);
    CHECK_NOTNULL(o);
    em_tensor *step = em_full(EM_F64, 0, NULL, 3), *pstep = em_full(EM_F64, 0, NULL, 3),
              *m = em_full(EM_F32, 1, (int64_t[]){4}, 0.5), *v = em_full(EM_F64, 1, (int64_t[]){4}, 0.25);
    CHECK(step && pstep && m && v);
    em_named st[] = {
        {"step", step}, {"state.0.step", pstep}, {"state.0.exp_avg", m}, {"state.0.exp_avg_sq", v}};
    CHECK_OK(optim_load_state_taking(o, 4, st));
    CHECK(st[0].t == step && st[1].t == NULL && st[2].t == NULL &&
          st[3].t == v); /* taken: the fitting ones */
    em_named got[4];
    CHECK(em_optim_state(o, got, 4) == 4);
    CHECK(got[1].t == pstep && got[2].t == m); /* the optimizer's state is the tensors given */
    CHECK(got[3].t != v && em_dtype_of(got[3].t) == EM_F32 && ((float *)em_data(got[3].t))[2] == 0.25f);
    CHECK(em_item(got[0].t) == 3);
    em_free(step);
    em_free(v);
    em_optim_free(o);
    em_free(w);
}
