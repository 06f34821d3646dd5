/* test_checkpoint.c — em_accel_save_state's directory as a whole
 * (dist/checkpoint.c): a manifest naming every file with its size and
 * crc32, verification of every file and of the save id before a load
 * changes anything, and how a save replaces the previous checkpoint.
 * (Kill -9 in the middle of a save: test_checkpoint_cli.c.) */
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dist_util.h"
#include "harness.h"
#include "accel_rig.h"

/* ---- a small training rig: GPT, AdamW, sampler, Accelerator ---------------------- */

enum { VOCAB = RIG_VOCAB, T = RIG_T };

static rig *rig_new(void)
{
    unsetenv("EMBER_NO_RENAME_EXCHANGE");
    return rig_new_at(0, 0, 16);
}

/* A copy of the flat parameters (malloc'd, *n floats). */
static float *rig_params(rig *r, int64_t *n)
{
    em_tensor *flat = em_module_flat_params(r->g->m, EM_F32);
    CHECK_NOTNULL(flat);
    *n = em_numel(flat);
    float *p = malloc(sizeof *p * (size_t)*n);
    memcpy(p, em_data(flat), sizeof *p * (size_t)*n);
    return p;
}


/* ---- files ------------------------------------------------------------------------ */

/* The value of "key": "..." in a JSON text (first occurrence), into out. */
static void json_value(const char *text, const char *key, char *out, size_t n)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = strstr(text, pat);
    if (!p) th_fail(__FILE__, __LINE__, "no \"%s\" in %s", key, text);
    p += strlen(pat);
    size_t k = strcspn(p, "\"");
    CHECK(k < n);
    memcpy(out, p, k);
    out[k] = '\0';
}

/* How many entries of dir's parent are named like dir + tag + something. */
static int siblings(const char *dir, const char *tag)
{
    char parent[PATH_MAX], prefix[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    *slash = '\0';
    snprintf(prefix, sizeof prefix, "%s%s", slash + 1, tag);
    DIR *d = opendir(parent);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

static void make_base(char *base, size_t n) { th_tmpdir(base, n, "ember-ckpt"); }

/* ---- the manifest ------------------------------------------------------------------ */

static void manifest_body(int rank, int world, void *ctx)
{
    const char *dir = ctx;
    rig *r = rig_new();
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, dir));
    if (rank == 0) {
        size_t n;
        char *m = th_slurp(th_path(dir, "manifest.json"), &n);
        CHECK(strstr(m, "\"format\": \"ember-accelerator-state-2\"") != NULL);
        CHECK(strstr(m, "\"world\": \"2\"") && strstr(m, "\"steps\": \"1\""));
        char id[32];
        json_value(m, "save_id", id, sizeof id);
        CHECK(strlen(id) == 16);
        const char *files[] = {"model.safetensors", "optimizer.safetensors", "rank_0.json", "rank_1.json"};
        for (int i = 0; i < 4; i++) {
            size_t len;
            char *body = th_slurp(th_path(dir, files[i]), &len);
            char want[200];
            snprintf(want, sizeof want, "{\"name\": \"%s\", \"size\": \"%zu\", \"crc32\": \"%08lx\"}",
                     files[i], len, crc32(0, (const Bytef *)body, (uInt)len));
            if (!strstr(m, want)) th_fail(__FILE__, __LINE__, "manifest lacks %s:\n%s", want, m);
            if (i >= 2) { /* every rank file carries the save id */
                char got[32];
                json_value(body, "save_id", got, sizeof got);
                CHECK(!strcmp(got, id));
            }
            free(body);
        }
        free(m);
        CHECK(siblings(dir, ".tmp-") == 0 && siblings(dir, ".old-") == 0); /* nothing left beside it */
    }
    (void)world;
    rig_free(r);
}

TEST(test_save_state_writes_a_manifest_with_every_files_size_crc32_and_the_save_id)
{
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/state", base);
    TH_RANKS_ENV(2, manifest_body, dir);
}

/* ---- verification ---------------------------------------------------------------- */

/* Flips byte pos of path (XOR with a non-zero mask); returns the old byte. */
static unsigned char flip(const char *path, size_t pos, unsigned char mask)
{
    size_t n;
    char *b = th_slurp(path, &n);
    CHECK(pos < n);
    unsigned char old = (unsigned char)b[pos];
    b[pos] = (char)(old ^ mask);
    th_write_file(path, b, n);
    free(b);
    return old;
}

static void put_byte(const char *path, size_t pos, unsigned char v)
{
    size_t n;
    char *b = th_slurp(path, &n);
    b[pos] = (char)v;
    th_write_file(path, b, n);
    free(b);
}

static void flipped_body(int rank, int world, void *ctx)
{
    (void)world;
    const char *dir = ctx;
    rig *r = rig_new();
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, dir));
    rig_step(r); /* the parameters move on: a load that changed them would show */
    int64_t np;
    float *before = rig_params(r, &np);
    const char *files[] = {"model.safetensors", "optimizer.safetensors", "rank_0.json", "rank_1.json",
                           "manifest.json"};
    uint64_t x = 12345;
    for (int i = 0; i < 5; i++) {
        struct stat st;
        CHECK(stat(th_path(dir, files[i]), &st) == 0);
        size_t size = (size_t)st.st_size;
        for (int k = 0; k < 8; k++) {
            /* the first and last byte, then random ones (the same on every rank) */
            x = x * 6364136223846793005u + 1442695040888963407u;
            size_t pos = k == 0 ? 0 : k == 1 ? size - 1 : (size_t)(x >> 33) % size;
            unsigned char mask = (unsigned char)(1 + (x >> 20) % 255), old = 0;
            CHECK_OK(em_accel_wait_for_everyone(r->a));
            if (rank == 0) old = flip(th_path(dir, files[i]), pos, mask);
            CHECK_OK(em_accel_wait_for_everyone(r->a));
            em_status s = em_accel_load_state(r->a, dir);
            if (s != EM_OK && s != EM_ERR_IO)
                th_fail(__FILE__, __LINE__, "%s byte %zu: status %d: %s", files[i], pos, s, em_last_error());
            if (s == EM_OK || !strstr(em_last_error(), th_path(dir, files[i])))
                th_fail(__FILE__, __LINE__, "%s byte %zu flipped: load %s", files[i], pos,
                        s ? em_last_error() : "succeeded");
            CHECK_OK(em_accel_wait_for_everyone(r->a));
            if (rank == 0) put_byte(th_path(dir, files[i]), pos, old);
        }
    }
    int64_t n2;
    float *after = rig_params(r, &n2);
    CHECK(n2 == np && !memcmp(before, after, sizeof *before * (size_t)np)); /* nothing changed */
    CHECK_OK(em_accel_wait_for_everyone(r->a));
    CHECK_OK(em_accel_load_state(r->a, dir)); /* every byte restored: loads again */
    free(before);
    free(after);
    rig_free(r);
}

TEST(test_load_state_refuses_a_flipped_byte_in_any_checkpoint_file_naming_it_and_changes_nothing)
{
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/state", base);
    TH_RANKS_ENV(2, flipped_body, dir);
}

static void one_rank_save(int rank, int world, void *ctx)
{
    (void)rank, (void)world;
    rig *r = rig_new();
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, ctx));
    rig_free(r);
}

static void one_rank_load_fails(const char *dir, em_status want, const char *sub)
{
    rig *r = rig_new();
    CHECK_ERR(em_accel_load_state(r->a, dir), want, sub);
    rig_free(r);
}

TEST(test_load_state_refuses_a_directory_without_a_manifest)
{
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/state", base);
    TH_RANKS_ENV(1, one_rank_save, dir);
    CHECK(unlink(th_path(dir, "manifest.json")) == 0);
    one_rank_load_fails(dir, EM_ERR_IO,
                        "is not a complete checkpoint: no manifest.json (an interrupted save");
    one_rank_load_fails(dir, EM_ERR_IO, dir);
}

TEST(test_load_state_says_a_checkpoint_is_from_an_older_version)
{
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/state", base);
    CHECK(mkdir(dir, 0755) == 0);
    const char *v1 =
        "{\n  \"format\": \"ember-accelerator-state-1\",\n  \"world\": \"1\",\n  \"rank\": \"0\"\n}\n";
    th_write_file(th_path(dir, "rank_0.json"), v1, strlen(v1));
    one_rank_load_fails(dir, EM_ERR_IO, "older version of ember (format 'ember-accelerator-state-1')");
}

/* Rank 0 loads one checkpoint, rank 1 another (as if DIR named different
 * directories on two machines): every rank fails naming both save ids. */
typedef struct two_dirs {
    char a[PATH_MAX], b[PATH_MAX];
} two_dirs;

static void two_saves(int rank, int world, void *ctx)
{
    (void)rank, (void)world;
    two_dirs *d = ctx;
    rig *r = rig_new();
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, d->a));
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, d->b));
    rig_free(r);
}

static void load_different(int rank, int world, void *ctx)
{
    (void)world;
    two_dirs *d = ctx;
    size_t n;
    char *ma = th_slurp(th_path(d->a, "manifest.json"), &n), *mb = th_slurp(th_path(d->b, "manifest.json"), &n);
    char ida[32], idb[32];
    json_value(ma, "save_id", ida, sizeof ida);
    json_value(mb, "save_id", idb, sizeof idb);
    rig *r = rig_new();
    em_status s = em_accel_load_state(r->a, rank == 0 ? d->a : d->b);
    CHECK(s == EM_ERR_DIST);
    const char *msg = em_last_error();
    if (!strstr(msg, ida) || !strstr(msg, idb) || !strstr(msg, "different checkpoints"))
        th_fail(__FILE__, __LINE__, "rank %d: '%s' does not name both saves %s and %s", rank, msg, ida, idb);
    free(ma);
    free(mb);
    rig_free(r);
}

TEST(test_load_state_fails_on_every_rank_naming_both_ids_when_ranks_load_different_saves)
{
    char base[PATH_MAX];
    two_dirs d;
    make_base(base, sizeof base);
    th_pathf(d.a, sizeof d.a, "%s/a", base);
    th_pathf(d.b, sizeof d.b, "%s/b", base);
    TH_RANKS_ENV(2, two_saves, &d);
    TH_RANKS_ENV(2, load_different, &d);
}

static void load_fails_naming(int rank, int world, void *ctx)
{
    (void)rank, (void)world;
    const char *dir = ctx;
    rig *r = rig_new();
    CHECK_ERR(em_accel_load_state(r->a, dir), EM_ERR_IO, "rank_1.json belongs to save");
    CHECK_ERR(em_accel_load_state(r->a, dir), EM_ERR_IO, "files of two saves mixed");
    rig_free(r);
}

TEST(test_load_state_refuses_a_rank_file_of_another_save_even_with_a_matching_checksum)
{
    char base[PATH_MAX];
    two_dirs d;
    make_base(base, sizeof base);
    th_pathf(d.a, sizeof d.a, "%s/a", base);
    th_pathf(d.b, sizeof d.b, "%s/b", base);
    TH_RANKS_ENV(2, two_saves, &d);
    size_t n;
    char *b1 = th_slurp(th_path(d.b, "rank_1.json"), &n);
    th_write_file(th_path(d.a, "rank_1.json"), b1, n);
    free(b1);
    th_reseal_checkpoint(d.a); /* the manifest as a writer mixing two saves would make it */
    TH_RANKS_ENV(2, load_fails_naming, d.a);
}

/* ---- replacing the previous checkpoint ------------------------------------------- */

TEST(test_save_state_removes_stale_temporaries_of_interrupted_saves_and_nothing_else)
{
    char base[PATH_MAX], dir[PATH_MAX], stale[PATH_MAX], other[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/state", base);
    th_pathf(stale, sizeof stale, "%s.tmp-0123456789abcdef", dir);
    th_pathf(other, sizeof other, "%s.tmp-mine", dir);
    CHECK(mkdir(stale, 0755) == 0 && mkdir(other, 0755) == 0);
    th_write_file(th_path(stale, "model.safetensors"), "x", 1);
    TH_RANKS_ENV(1, one_rank_save, dir);
    CHECK(access(stale, F_OK) != 0);
    CHECK(access(other, F_OK) == 0);
    TH_RANKS_ENV(1, one_rank_save, dir); /* over the previous one: still only the 4 files */
    DIR *d = opendir(dir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) files += e->d_name[0] != '.';
    closedir(d);
    CHECK(files == 4);
    CHECK(siblings(dir, ".tmp-") == 1 && siblings(dir, ".old-") == 0); /* only "mine" */
}

TEST(test_save_state_refuses_to_replace_a_directory_holding_other_files)
{
    char base[PATH_MAX];
    make_base(base, sizeof base);
    th_write_file(th_path(base, "notes.txt"), "keep me", 7);
    rig *r = rig_new();
    CHECK_ERR(em_accel_save_state(r->a, base), EM_ERR_IO,
              "holds 'notes.txt', which is not a checkpoint file");
    CHECK_ERR(em_accel_save_state(r->a, "."), EM_ERR_ARG, "name the checkpoint directory itself");
    rig_free(r);
    size_t n;
    char *kept = th_slurp(th_path(base, "notes.txt"), &n);
    CHECK(n == 7 && !memcmp(kept, "keep me", 7));
    free(kept);
    CHECK(siblings(base, ".tmp-") == 0);
}

static void save_load_without_exchange(int rank, int world, void *ctx)
{
    (void)rank, (void)world;
    const char *dir = ctx;
    rig *r = rig_new();
    setenv("EMBER_NO_RENAME_EXCHANGE", "1", 1);
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, dir));
    CHECK(access(th_path(dir, "manifest.json"), F_OK) == 0);
    rig_step(r);
    CHECK_OK(em_accel_save_state(r->a, dir)); /* over the first: DIR aside, the new one in, DIR.old removed */
    size_t n;
    char *m = th_slurp(th_path(dir, "manifest.json"), &n);
    CHECK(strstr(m, "\"steps\": \"2\"") != NULL);
    free(m);
    CHECK(siblings(dir, ".tmp-") == 0 && siblings(dir, ".old-") == 0);
    CHECK(em_accel_step_count(r->a) == 2);
    rig_free(r);
    r = rig_new();
    CHECK_OK(em_accel_load_state(r->a, dir));
    CHECK(em_accel_step_count(r->a) == 2);
    rig_free(r);
}

TEST(test_save_state_without_rename_exchange_publishes_by_two_renames)
{
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/state", base);
    TH_RANKS_ENV(1, save_load_without_exchange, dir);
}

static void load_gives_steps(int rank, int world, void *ctx)
{
    (void)rank, (void)world;
    rig *r = rig_new();
    CHECK_OK(em_accel_load_state(r->a, ctx));
    CHECK(em_accel_step_count(r->a) == 1);
    rig_free(r);
}

/* Between the two renames of the fallback DIR is missing; a load takes the
 * complete DIR.old-* (a damaged one is passed over). */
TEST(test_load_state_takes_the_complete_old_copy_when_a_publish_was_interrupted)
{
    char base[PATH_MAX], dir[PATH_MAX], old[PATH_MAX], bad[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/state", base);
    th_pathf(old, sizeof old, "%s.old-00000000000000aa", dir);
    th_pathf(bad, sizeof bad, "%s.old-00000000000000bb", dir);
    TH_RANKS_ENV(1, one_rank_save, dir);
    CHECK(rename(dir, old) == 0);
    TH_RANKS_ENV(1, load_gives_steps, dir);
    CHECK(mkdir(bad, 0755) == 0); /* an incomplete copy: no manifest */
    TH_RANKS_ENV(1, load_gives_steps, dir);
    flip(th_path(old, "model.safetensors"), 100, 1);
    one_rank_load_fails(dir, EM_ERR_IO, "no checkpoint at");
}
