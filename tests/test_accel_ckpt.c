/* test_accel_ckpt.c — checkpoint management (dist/accel_ckpt.c): automatic
 * naming under a project directory (checkpoints/checkpoint_N), total_limit
 * rotation that removes only checkpoints, loading the newest, and
 * em_accel_save_model's weights-only safetensors in Hugging Face's sharded
 * layout, checked here against the format's rules as Python's safetensors
 * applies them (not through ember's own reader). */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist_util.h"
#include "harness.h"
#include "nn/json_impl.h"

static void clean_env(void)
{
    th_no_user_config();
    unsetenv("EMBER_PROJECT_DIR");
    unsetenv("EMBER_AUTOMATIC_CHECKPOINT_NAMING");
    unsetenv("EMBER_SAVE_TOTAL_LIMIT");
    unsetenv("EMBER_NO_RENAME_EXCHANGE");
}

static void make_base(char *base, size_t n) { th_tmpdir(base, n, "ember-acc-ckpt"); }

/* ---- a small model: several tensors of different sizes and dtypes ----------- */

/* Parameters emb (64,16), big (100,20), a.weight (10,16), a.bias (10),
 * b.weight (30,10) and an i32 buffer count (4): 4096, 8000, 640, 40, 1200
 * and 16 bytes, in that order. Values from seed. */
static em_module *make_model(uint64_t seed)
{
    em_rng rng = em_rng_new(seed);
    em_module *root = em_module_new(NULL, "");
    CHECK_NOTNULL(root);
    em_module *a = em_module_new(root, "a"), *b = em_module_new(root, "b");
    CHECK(a && b);
    CHECK_OK(em_module_add_param(root, "emb", em_randn(EM_F32, EM_SHAPE(64, 16), &rng)));
    CHECK_OK(em_module_add_param(root, "big", em_randn(EM_F32, EM_SHAPE(100, 20), &rng)));
    CHECK_OK(em_module_add_param(a, "weight", em_randn(EM_F32, EM_SHAPE(10, 16), &rng)));
    CHECK_OK(em_module_add_param(a, "bias", em_randn(EM_F32, EM_SHAPE(10), &rng)));
    CHECK_OK(em_module_add_param(b, "weight", em_randn(EM_F32, EM_SHAPE(30, 10), &rng)));
    em_tensor *cnt = em_randint(0, 1000, EM_I32, EM_SHAPE(4), &rng);
    CHECK_OK(em_module_add_buffer(root, "count", cnt));
    return root;
}

/* An Accelerator with the model prepared (no optimizer) under a project. */
static em_accelerator *project_acc(const char *project, int limit, em_module *model)
{
    em_accelerator *a = em_accelerator_new(&(em_accel_config){
        .project_dir = project, .automatic_checkpoint_naming = true, .total_limit = limit});
    CHECK_NOTNULL(a);
    if (model) CHECK_OK(em_accel_prepare(a, model, NULL, NULL, NULL));
    return a;
}

/* Marks the model's state as "save k": emb[0] = k. */
static void mark(em_module *m, float k) { ((float *)em_data(em_module_find(m, "emb")))[0] = k; }
static float marked(em_module *m) { return ((float *)em_data(em_module_find(m, "emb")))[0]; }

/* The sorted names in dir, joined by spaces ("" when empty or missing). */
static void listing(const char *dir, char *out, size_t n)
{
    char names[32][64];
    int k = 0;
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && k < 32)
            snprintf(names[k++], 64, "%.63s", e->d_name);
    closedir(d);
    for (int i = 0; i < k; i++)
        for (int j = i + 1; j < k; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char t[64];
                memcpy(t, names[i], 64);
                memcpy(names[i], names[j], 64);
                memcpy(names[j], t, 64);
            }
    for (int i = 0; i < k; i++) {
        size_t len = strlen(out);
        snprintf(out + len, n - len, "%s%s", i ? " " : "", names[i]);
    }
}

#define CHECK_LISTING(dir, want)                                                                             \
    do {                                                                                                     \
        char th_l[1024];                                                                                     \
        listing((dir), th_l, sizeof th_l);                                                                   \
        if (strcmp(th_l, (want)))                                                                            \
            th_fail(__FILE__, __LINE__, "%s holds \"%s\", want \"%s\"", (dir), th_l, (want));                \
    } while (0)

/* ---- automatic naming and total_limit ----------------------------------------- */

TEST(test_total_limit_keeps_the_newest_checkpoints_and_numbering_continues_in_a_new_accelerator)
{
    clean_env();
    char base[PATH_MAX], root[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(root, sizeof root, "%s/checkpoints", base);
    em_module *m = make_model(1);
    em_accelerator *a = project_acc(base, 2, m);
    for (int k = 0; k < 5; k++) {
        mark(m, (float)k);
        CHECK_OK(em_accel_save_state(a, NULL));
    }
    CHECK_LISTING(root, "checkpoint_3 checkpoint_4");
    CHECK_LISTING(base, "checkpoints"); /* nothing left beside it: no temporaries */
    em_accelerator_free(a);
    em_module_free(m);

    /* a new run on the same project: loads the newest, then goes on counting */
    m = make_model(2);
    a = project_acc(base, 2, m);
    CHECK_OK(em_accel_load_state(a, NULL));
    CHECK(marked(m) == 4.0f);
    mark(m, 5.0f);
    CHECK_OK(em_accel_save_state(a, NULL));
    CHECK_LISTING(root, "checkpoint_4 checkpoint_5");
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_rotation_leaves_entries_that_are_not_named_checkpoint_n_alone)
{
    clean_env();
    char base[PATH_MAX], root[PATH_MAX], path[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(root, sizeof root, "%s/checkpoints", base);
    CHECK(mkdir(root, 0777) == 0);
    th_pathf(path, sizeof path, "%s/notes", root);
    CHECK(mkdir(path, 0777) == 0);
    th_write_file(th_path(root, "checkpoint_01"), "x", 1); /* not a name automatic naming writes */
    th_write_file(th_path(root, "checkpoint_2.txt"), "x", 1);
    em_module *m = make_model(1);
    em_accelerator *a = project_acc(base, 1, m);
    for (int k = 0; k < 3; k++) CHECK_OK(em_accel_save_state(a, NULL));
    CHECK_LISTING(root, "checkpoint_01 checkpoint_2 checkpoint_2.txt notes");
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_total_limit_refuses_to_remove_a_directory_holding_a_foreign_file_and_saves_nothing)
{
    clean_env();
    char base[PATH_MAX], root[PATH_MAX], old[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(root, sizeof root, "%s/checkpoints", base);
    em_module *m = make_model(1);
    em_accelerator *a = project_acc(base, 1, m);
    CHECK_OK(em_accel_save_state(a, NULL));
    th_pathf(old, sizeof old, "%s/checkpoint_0", root);
    th_write_file(th_path(old, "notes.txt"), "mine", 4);
    CHECK_ERR(em_accel_save_state(a, NULL), EM_ERR_IO, "notes.txt");
    CHECK(strstr(em_last_error(), "checkpoint_0") && strstr(em_last_error(), "nothing was saved"));
    CHECK_LISTING(root, "checkpoint_0");
    CHECK_LISTING(old, "manifest.json model.safetensors notes.txt rank_0.json");
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_total_limit_refuses_to_remove_a_file_named_like_a_checkpoint)
{
    clean_env();
    char base[PATH_MAX], root[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(root, sizeof root, "%s/checkpoints", base);
    CHECK(mkdir(root, 0777) == 0);
    th_write_file(th_path(root, "checkpoint_0"), "x", 1);
    em_module *m = make_model(1);
    em_accelerator *a = project_acc(base, 1, m);
    CHECK_ERR(em_accel_save_state(a, NULL), EM_ERR_IO, "is not a directory");
    CHECK_LISTING(root, "checkpoint_0");
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_load_state_null_takes_the_newest_checkpoint_with_a_manifest)
{
    clean_env();
    char base[PATH_MAX], root[PATH_MAX], path[PATH_MAX], got[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(root, sizeof root, "%s/checkpoints", base);
    em_module *m = make_model(1);
    em_accelerator *a = project_acc(base, 0, m);
    for (int k = 0; k < 2; k++) {
        mark(m, (float)k + 10);
        CHECK_OK(em_accel_save_state(a, NULL));
    }
    th_pathf(path, sizeof path, "%s/checkpoint_7", root); /* no manifest: not complete */
    CHECK(mkdir(path, 0777) == 0);
    CHECK(em_accel_latest_checkpoint(a, got, sizeof got) == 1);
    th_pathf(path, sizeof path, "%s/checkpoint_1", root);
    CHECK(!strcmp(got, path));
    mark(m, 0);
    CHECK_OK(em_accel_load_state(a, NULL));
    CHECK(marked(m) == 11.0f);
    /* and the next save counts past every checkpoint_N name, complete or not */
    CHECK_OK(em_accel_save_state(a, NULL));
    CHECK_LISTING(root, "checkpoint_0 checkpoint_1 checkpoint_7 checkpoint_8");
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_load_state_null_without_a_checkpoint_names_the_directory)
{
    clean_env();
    char base[PATH_MAX], root[PATH_MAX], got[PATH_MAX] = "x";
    make_base(base, sizeof base);
    th_pathf(root, sizeof root, "%s/checkpoints", base);
    em_module *m = make_model(1);
    em_accelerator *a = project_acc(base, 0, m);
    CHECK(em_accel_latest_checkpoint(a, got, sizeof got) == 0 && got[0] == '\0');
    CHECK_ERR(em_accel_load_state(a, NULL), EM_ERR_IO, root);
    em_accelerator_free(a);
    em_module_free(m);
}

/* A checkpoints directory that cannot be read is named whole, 1,000
 * characters deep: rank 0's message is kept across the ranks' agreement in
 * a buffer as long as the thread's error (it was cut at 512 characters) */
TEST(test_load_state_null_names_a_long_unreadable_checkpoints_directory_whole)
{
    clean_env();
    char base[PATH_MAX], deep[PATH_MAX], root[PATH_MAX], want[PATH_MAX + 64];
    make_base(base, sizeof base);
    snprintf(deep, sizeof deep, "%s", base);
    while (strlen(deep) < 1000) {
        strcat(deep, "/deeper");
        CHECK(mkdir(deep, 0755) == 0);
    }
    th_pathf(root, sizeof root, "%s/checkpoints", deep);
    th_write_file(root, "x", 1); /* a file where the directory should be */
    snprintf(want, sizeof want, "cannot read directory %s: Not a directory", root);
    em_module *m = make_model(1);
    em_accelerator *a = project_acc(deep, 0, m);
    CHECK_ERR(em_accel_load_state(a, NULL), EM_ERR_IO, want);
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_save_state_null_without_automatic_naming_is_refused)
{
    clean_env();
    em_module *m = make_model(1);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_prepare(a, m, NULL, NULL, NULL));
    CHECK_ERR(em_accel_save_state(a, NULL), EM_ERR_ARG, "automatic_checkpoint_naming is off");
    CHECK_ERR(em_accel_load_state(a, NULL), EM_ERR_ARG, "automatic_checkpoint_naming is off");
    char buf[64];
    CHECK(em_accel_latest_checkpoint(a, buf, sizeof buf) == -1 && em_last_status() == EM_ERR_ARG);
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_accelerator_new_refuses_automatic_naming_without_a_project_dir)
{
    clean_env();
    CHECK_ERR(em_accelerator_new(&(em_accel_config){.automatic_checkpoint_naming = true}), EM_ERR_ARG,
              "project_dir");
    CHECK_ERR(em_accelerator_new(&(em_accel_config){.total_limit = -1}), EM_ERR_ARG, "total_limit -1");
    setenv("EMBER_SAVE_TOTAL_LIMIT", "two", 1);
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "EMBER_SAVE_TOTAL_LIMIT='two'");
    unsetenv("EMBER_SAVE_TOTAL_LIMIT");
    setenv("EMBER_AUTOMATIC_CHECKPOINT_NAMING", "maybe", 1); /* the shared boolean parser's words only */
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "EMBER_AUTOMATIC_CHECKPOINT_NAMING='maybe'");
    setenv("EMBER_AUTOMATIC_CHECKPOINT_NAMING", "yes", 1); /* a boolean, as everywhere: needs a project dir */
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "project_dir");
}

TEST(test_project_settings_come_from_the_environment)
{
    clean_env();
    char base[PATH_MAX], root[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(root, sizeof root, "%s/checkpoints", base);
    setenv("EMBER_PROJECT_DIR", base, 1);
    setenv("EMBER_AUTOMATIC_CHECKPOINT_NAMING", "true", 1);
    setenv("EMBER_SAVE_TOTAL_LIMIT", "1", 1);
    em_module *m = make_model(1);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_prepare(a, m, NULL, NULL, NULL));
    for (int k = 0; k < 3; k++) CHECK_OK(em_accel_save_state(a, NULL));
    CHECK_LISTING(root, "checkpoint_2");
    em_accelerator_free(a);
    em_module_free(m);
}

/* Two ranks: rank 0 names and removes, every rank saves and loads the same. */
static void two_rank_rotation(int rank, int world, void *ctx)
{
    (void)world;
    const char *base = ctx;
    em_module *m = make_model(1);
    em_accelerator *a = project_acc(base, 2, m);
    for (int k = 0; k < 3; k++) {
        mark(m, (float)k);
        CHECK_OK(em_accel_save_state(a, NULL));
    }
    CHECK_OK(em_accel_wait_for_everyone(a));
    char root[PATH_MAX];
    th_pathf(root, sizeof root, "%s/checkpoints", base);
    CHECK_LISTING(root, "checkpoint_1 checkpoint_2");
    CHECK_LISTING(th_path(root, "checkpoint_2"), "manifest.json model.safetensors rank_0.json rank_1.json");
    mark(m, -1);
    CHECK_OK(em_accel_load_state(a, NULL));
    CHECK(marked(m) == 2.0f);
    (void)rank;
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_automatic_naming_on_two_ranks_saves_rotates_and_loads_one_sequence)
{
    clean_env();
    char base[PATH_MAX];
    make_base(base, sizeof base);
    TH_RANKS_ENV(2, two_rank_rotation, base);
}

/* ---- save_model: the safetensors format, as Python's safetensors checks it ---- */

static size_t dtype_bytes(const char *dt)
{
    static const struct {
        const char *n;
        size_t b;
    } t[] = {{"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
             {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2},  {"U32", 4}, {"U64", 8}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].n, dt)) return t[i].b;
    return 0;
}

typedef struct span {
    int64_t begin, end;
} span;

static int cmp_span(const void *x, const void *y)
{
    const span *a = x, *b = y;
    return (a->begin > b->begin) - (a->begin < b->begin);
}

/* Checks path against the format's rules; returns the parsed header (the
 * caller json_frees it) and the data's offset in the file in *data_at, and
 * adds the tensors' bytes to *total. */
static jval check_safetensors(const char *path, int64_t *data_at, int64_t *total)
{
    size_t n;
    unsigned char *f = (unsigned char *)th_slurp(path, &n);
    CHECK(n >= 8);
    uint64_t hl = 0;
    for (int k = 0; k < 8; k++) hl |= (uint64_t)f[k] << (8 * k); /* little-endian u64 */
    CHECK(hl <= ((uint64_t)100 << 20) && 8 + hl <= n);
    CHECK((8 + hl) % 8 == 0); /* ember pads the header so the data is 8-byte aligned */
    CHECK(f[8] == '{');       /* the reader's "header starts with {" rule */
    size_t end = 8 + hl;      /* the padding is spaces after the JSON */
    while (end > 8 && f[end - 1] == ' ') end--;
    CHECK(f[end - 1] == '}');
    jval h;
    char err[160];
    if (!json_parse((const char *)f + 8, hl, &h, err, sizeof err))
        th_fail(__FILE__, __LINE__, "%s: %s", path, err);
    CHECK(h.kind == J_OBJ);
    int64_t buf = (int64_t)(n - 8 - hl);
    span *sp = calloc((size_t)h.n + 1, sizeof *sp);
    int ns = 0;
    for (int i = 0; i < h.n; i++) {
        const jval *v = &h.v[i];
        CHECK(v->kind == J_OBJ);
        if (!strcmp(h.keys[i], "__metadata__")) {
            for (int k = 0; k < v->n; k++) CHECK(v->v[k].kind == J_STR); /* string to string */
            const jval *fmt = json_get(v, "format");
            CHECK(fmt && fmt->kind == J_STR && !strcmp(fmt->s, "pt"));
            continue;
        }
        const jval *dt = json_get(v, "dtype"), *shape = json_get(v, "shape"),
                   *off = json_get(v, "data_offsets");
        CHECK(dt && dt->kind == J_STR && dtype_bytes(dt->s) > 0);
        CHECK(shape && shape->kind == J_ARR && off && off->kind == J_ARR && off->n == 2);
        int64_t numel = 1;
        for (int d = 0; d < shape->n; d++) {
            CHECK(shape->v[d].kind == J_INT && shape->v[d].i >= 0);
            numel *= shape->v[d].i;
        }
        CHECK(off->v[0].kind == J_INT && off->v[1].kind == J_INT);
        sp[ns] = (span){off->v[0].i, off->v[1].i};
        CHECK(sp[ns].end - sp[ns].begin == numel * (int64_t)dtype_bytes(dt->s)); /* size matches */
        *total += sp[ns].end - sp[ns].begin;
        ns++;
    }
    /* sorted by offset, they tile the data exactly: from 0, no gap, no overlap, to the end */
    qsort(sp, (size_t)ns, sizeof *sp, cmp_span);
    int64_t at = 0;
    for (int i = 0; i < ns; i++) {
        CHECK(sp[i].begin == at);
        at = sp[i].end;
    }
    CHECK(at == buf);
    free(sp);
    free(f);
    *data_at = (int64_t)(8 + hl);
    return h;
}

/* The bytes of tensor name in the file at path (data_at from the check). */
static void check_values(const char *path, const jval *h, int64_t data_at, const char *name, em_tensor *want)
{
    const jval *e = json_get(h, name);
    CHECK(e != NULL);
    const jval *off = json_get(e, "data_offsets");
    size_t n;
    char *f = th_slurp(path, &n);
    int64_t len = off->v[1].i - off->v[0].i;
    CHECK(len == em_numel(want) * (int64_t)em_dtype_size(em_dtype_of(want)));
    CHECK(memcmp(f + data_at + off->v[0].i, em_data(want), (size_t)len) == 0); /* bitwise */
    free(f);
}

static const char *const model_names[] = {"emb", "big", "a.weight", "a.bias", "b.weight", "count"};
enum { NMODEL = 6 };

TEST(test_save_model_shards_follow_the_safetensors_rules_and_the_hugging_face_index)
{
    clean_env();
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/model", base);
    em_module *m = make_model(3);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    /* 4096 | 8000 (over the limit: a file of its own) | 640 + 40 + 1200 + 16 */
    CHECK_OK(em_accel_save_model(a, m, dir, &(em_save_model_config){.max_shard_size = 5000}));
    CHECK_LISTING(dir, "manifest.json model-00001-of-00003.safetensors model-00002-of-00003.safetensors "
                       "model-00003-of-00003.safetensors model.safetensors.index.json");
    CHECK_LISTING(base, "model");

    size_t n;
    char *text = th_slurp(th_path(dir, "model.safetensors.index.json"), &n);
    jval idx;
    char err[160];
    if (!json_parse(text, n, &idx, err, sizeof err)) th_fail(__FILE__, __LINE__, "index: %s", err);
    free(text);
    const jval *meta = json_get(&idx, "metadata"), *map = json_get(&idx, "weight_map");
    CHECK(idx.kind == J_OBJ && idx.n == 2 && meta && meta->kind == J_OBJ && map && map->kind == J_OBJ);
    const jval *ts = json_get(meta, "total_size");
    CHECK(ts && ts->kind == J_INT);
    /* every tensor exactly once (json_parse refuses duplicate keys), and nothing else */
    CHECK(map->n == NMODEL);
    for (int i = 0; i < NMODEL; i++) CHECK(json_get(map, model_names[i]) != NULL);
    for (int i = 1; i < map->n; i++) CHECK(strcmp(map->keys[i - 1], map->keys[i]) < 0); /* sorted */

    int64_t total = 0;
    int in_file[3] = {0};
    for (int k = 0; k < 3; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-00003.safetensors", k + 1);
        const char *path = th_path(dir, name);
        int64_t data_at = 0, bytes = 0;
        jval h = check_safetensors(path, &data_at, &bytes);
        total += bytes;
        CHECK(bytes <= 5000 || h.n == 2); /* within the limit, or one tensor (+ __metadata__) alone */
        /* the index and the file agree on which tensors it holds, with the model's bytes */
        for (int i = 0; i < NMODEL; i++) {
            const jval *fv = json_get(map, model_names[i]);
            CHECK(fv->kind == J_STR);
            struct stat st;
            CHECK(stat(th_path(dir, fv->s), &st) == 0); /* every named file exists */
            if (strcmp(fv->s, name)) {
                CHECK(json_get(&h, model_names[i]) == NULL);
                continue;
            }
            in_file[k]++;
            check_values(path, &h, data_at, model_names[i], em_module_find(m, model_names[i]));
        }
        CHECK(in_file[k] == h.n - 1);
        json_free(&h);
    }
    CHECK(in_file[0] == 1 && in_file[1] == 1 && in_file[2] == 4);
    CHECK(ts->i == total && total == 4096 + 8000 + 640 + 40 + 1200 + 16);
    json_free(&idx);
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_save_model_without_max_shard_size_writes_one_model_safetensors_that_loads_back)
{
    clean_env();
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/model", base);
    em_module *m = make_model(3), *back = make_model(4);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_save_model(a, m, dir, NULL));
    CHECK_LISTING(dir, "manifest.json model.safetensors");
    int64_t at = 0, total = 0;
    jval h = check_safetensors(th_path(dir, "model.safetensors"), &at, &total);
    json_free(&h);
    CHECK_OK(em_module_load(back, th_path(dir, "model.safetensors"), true));
    for (int i = 0; i < NMODEL; i++) {
        em_tensor *x = em_module_find(m, model_names[i]), *y = em_module_find(back, model_names[i]);
        CHECK(!memcmp(em_data(x), em_data(y), (size_t)em_numel(x) * em_dtype_size(em_dtype_of(x))));
    }
    /* a second save replaces the first whole: one shard layout, never both */
    CHECK_OK(em_accel_save_model(a, m, dir, &(em_save_model_config){.max_shard_size = 5000}));
    CHECK_LISTING(dir, "manifest.json model-00001-of-00003.safetensors model-00002-of-00003.safetensors "
                       "model-00003-of-00003.safetensors model.safetensors.index.json");
    CHECK_OK(em_accel_save_model(a, m, dir, NULL));
    CHECK_LISTING(dir, "manifest.json model.safetensors");
    em_accelerator_free(a);
    em_module_free(m);
    em_module_free(back);
}

TEST(test_save_model_gives_every_tensor_over_max_shard_size_a_file_of_its_own)
{
    clean_env();
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/model", base);
    em_module *m = make_model(3);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_save_model(a, m, dir, &(em_save_model_config){.max_shard_size = 16}));
    for (int k = 0; k < NMODEL; k++) { /* in the model's order, one each (count is exactly 16 bytes) */
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, NMODEL);
        int64_t at = 0, total = 0;
        jval h = check_safetensors(th_path(dir, name), &at, &total);
        CHECK(h.n == 2 && json_get(&h, model_names[k]) != NULL);
        json_free(&h);
    }
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_save_model_writes_bf16_when_asked_and_leaves_integer_buffers_alone)
{
    clean_env();
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/model", base);
    em_module *m = make_model(3);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_save_model(a, m, dir, &(em_save_model_config){.dtype = EM_BF16}));
    int64_t at = 0, total = 0;
    const char *path = th_path(dir, "model.safetensors");
    jval h = check_safetensors(path, &at, &total);
    CHECK(total == (4096 + 8000 + 640 + 40 + 1200) / 2 + 16);
    CHECK(!strcmp(json_get(json_get(&h, "emb"), "dtype")->s, "BF16"));
    CHECK(!strcmp(json_get(json_get(&h, "count"), "dtype")->s, "I32"));
    em_scope sc = em_scope_begin();
    check_values(path, &h, at, "big", em_cast(em_module_find(m, "big"), EM_BF16));
    check_values(path, &h, at, "count", em_module_find(m, "count"));
    em_scope_end(sc);
    json_free(&h);
    CHECK_ERR(em_accel_save_model(a, m, dir, &(em_save_model_config){.dtype = EM_I32}), EM_ERR_ARG,
              "dtype i32");
    CHECK_ERR(em_accel_save_model(a, m, dir, &(em_save_model_config){.max_shard_size = -1}), EM_ERR_ARG,
              "max_shard_size -1");
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_save_model_under_bf16_mixed_precision_writes_the_f32_master_weights)
{
    clean_env();
    char base[PATH_MAX], dir[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(dir, sizeof dir, "%s/model", base);
    em_module *m = make_model(3);
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.mixed_precision = EM_PREC_BF16});
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_prepare(a, m, NULL, NULL, NULL)); /* autocast on in this thread from here */
    CHECK_OK(em_accel_save_model(a, m, dir, NULL));
    int64_t at = 0, total = 0;
    const char *path = th_path(dir, "model.safetensors");
    jval h = check_safetensors(path, &at, &total);
    CHECK(!strcmp(json_get(json_get(&h, "big"), "dtype")->s, "F32"));
    check_values(path, &h, at, "big", em_module_find(m, "big"));
    json_free(&h);
    em_accelerator_free(a);
    em_module_free(m);
}

TEST(test_save_model_refuses_a_directory_holding_other_files)
{
    clean_env();
    char base[PATH_MAX];
    make_base(base, sizeof base);
    th_write_file(th_path(base, "config.json"), "{}", 2);
    em_module *m = make_model(3);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK_ERR(em_accel_save_model(a, m, base, NULL), EM_ERR_IO, "config.json");
    CHECK_LISTING(base, "config.json");
    em_accelerator_free(a);
    em_module_free(m);
}

/* Every rank holds other values: the file must hold rank 0's. */
static void two_rank_save_model(int rank, int world, void *ctx)
{
    (void)world;
    const char *base = ctx;
    char dir[PATH_MAX];
    /* only the main process uses dir: rank 1's must stay unwritten */
    th_pathf(dir, sizeof dir, "%s/%s", base, rank == 0 ? "model" : "rank1");
    em_module *m = make_model(10 + (uint64_t)rank), *rank0 = make_model(10);
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_save_model(a, m, dir, &(em_save_model_config){.max_shard_size = 5000}));
    CHECK_OK(em_accel_wait_for_everyone(a));
    CHECK_LISTING(base, "model");
    for (int k = 0; k < 3; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-00003.safetensors", k + 1);
        em_safetensors *f = em_safetensors_open(th_path(th_path(base, "model"), name));
        CHECK_NOTNULL(f);
        for (int i = 0; i < em_safetensors_count(f); i++) {
            const char *nm = em_safetensors_name(f, i);
            em_tensor *t = em_safetensors_get(f, nm), *want = em_module_find(rank0, nm);
            CHECK(t && want);
            CHECK(!memcmp(em_data(t), em_data(want), (size_t)em_numel(t) * em_dtype_size(em_dtype_of(t))));
            em_free(t);
        }
        em_safetensors_close(f);
    }
    /* a failure on the main process fails every rank: a file where the directory goes */
    CHECK_ERR(em_accel_save_model(a, m, th_path(base, "model/model.safetensors.index.json"), NULL),
              rank == 0 ? EM_ERR_IO : EM_ERR_DIST, rank == 0 ? "not a directory" : "rank 0 failed");
    em_accelerator_free(a);
    em_module_free(m);
    em_module_free(rank0);
}

TEST(test_save_model_on_two_ranks_writes_the_main_process_model_once)
{
    clean_env();
    char base[PATH_MAX];
    make_base(base, sizeof base);
    TH_RANKS_ENV(2, two_rank_save_model, base);
}

/* ---- ember train --save-total-limit ---------------------------------------------- */

TEST(test_train_save_total_limit_keeps_the_newest_checkpoints_and_resume_auto_takes_the_newest)
{
    clean_env();
    char base[PATH_MAX], txt[PATH_MAX], out[PATH_MAX], root[PATH_MAX];
    make_base(base, sizeof base);
    th_pathf(txt, sizeof txt, "%s/corpus.txt", base);
    FILE *f = fopen(txt, "w");
    CHECK(f != NULL);
    for (int i = 0; i < 200; i++) fputs("the cat sat on the mat. the dog sat on the log.\n", f);
    fclose(f);
    th_pathf(out, sizeof out, "%s/run", base);
    th_pathf(root, sizeof root, "%s/checkpoints", out);
#define TRAIN(iters)                                                                                         \
    th_run(EMBER_BUILD_DIR "/ember", "train", "--data", txt, "--out", out, "--layers", "1", "--heads", "2",  \
           "--embd", "16", "--block", "8", "--batch", "4", "--iters", iters, "--eval-every", "2",            \
           "--eval-iters", "1", "--warmup", "1", "--save-total-limit", "2", "--resume", "auto", NULL)
    th_run_result *r = TRAIN("6"); /* saves at steps 0, 2, 4, 6 */
    CHECK_EXIT(r, 0);
    CHECK(strstr(r->out, "no checkpoint in") != NULL);
    CHECK_LISTING(root, "checkpoint_2 checkpoint_3");
    CHECK_LISTING(out, "checkpoints config metrics.jsonl model.safetensors");
    r = TRAIN("8");
    CHECK_EXIT(r, 0);
    char want[PATH_MAX];
    th_pathf(want, sizeof want, "resuming at step 6 from %s/checkpoint_3", root);
    if (!strstr(r->out, want)) th_fail(__FILE__, __LINE__, "output lacks \"%s\":\n%s", want, r->out);
    CHECK_LISTING(root, "checkpoint_3 checkpoint_4");
#undef TRAIN
}
