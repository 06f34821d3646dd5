/* checkpoint.c — a checkpoint directory that is whole or absent, and
 * checksummed (checkpoint_impl.h).
 *
 *   DIR/manifest.json   written last: format, save id, world size, optimizer
 *                       steps, and each file's name, size and crc32; its own
 *                       "crc32" (last key) covers the manifest with those 8
 *                       digits read as '0'
 *   DIR/...             the files it names (accel_state.c says which)
 *
 * Saving (rank 0 does the directory work; every rank writes its files):
 *   1. DIR.tmp-<id> is made beside DIR (same parent, so renames are atomic);
 *      stale DIR.tmp-* of interrupted saves are removed first.
 *   2. every file is written there (temporary + fsync + rename, fsync of the
 *      directory: tensor/fileio.c, nn/safetensors.c).
 *   3. manifest.json is written the same way, last.
 *   4. publish: renameat2(RENAME_EXCHANGE) swaps DIR.tmp-<id> and DIR in one
 *      step (plain rename when there is no DIR yet); the parent is fsync'd;
 *      the previous checkpoint, now at DIR.tmp-<id>, is removed. A file
 *      system without RENAME_EXCHANGE (EINVAL/ENOSYS; the environment
 *      variable EMBER_NO_RENAME_EXCHANGE pretends so, for tests) gets two
 *      renames: DIR -> DIR.old-<id>, DIR.tmp-<id> -> DIR; between them DIR
 *      is missing and a load takes the newest complete DIR.old-*.
 * So at every instant DIR is the previous complete checkpoint or the new
 * one. A kill at any point leaves at worst a DIR.tmp-* or DIR.old-* that
 * the next save removes. Fault points (fault_impl.h): "save.publish" before
 * the publishing rename, "save.old" between the two renames of the
 * fallback, "save.published" before the previous copy is removed, plus the
 * writers' "file.write", "file.fsync" and "file.rename".
 *
 * Loading verifies before anything is used: the manifest's own checksum and
 * format, then every file it names (size, crc32; a .json file must carry
 * the manifest's save id). Any difference is an error naming the file.
 *
 * DIR is replaced whole, so a save refuses a DIR that holds anything but
 * checkpoint files. Two runs saving into one DIR at once are not supported.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/checkpoint_impl.h"
#include "nn/json_impl.h"
#include "tensor/error_impl.h"
#include "tensor/fault_impl.h"
#include "tensor/settings_impl.h"

#define MANIFEST_MAX ((size_t)1 << 24)
#define JSON_MAX ((size_t)1 << 24) /* a rank file */

/* dir/name into buf; false (buf truncated) when it does not fit. */
static bool join(char *buf, size_t n, const char *dir, const char *name)
{
    return snprintf(buf, n, "%s/%s", dir, name) < (int)n;
}

void ckpt_manifest_free(ckpt_manifest *m)
{
    free(m->files);
    *m = (ckpt_manifest){0};
}

uint64_t ckpt_new_id(void)
{
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) { /* no entropy yet: time and pid */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    }
    return id ? id : 1;
}

void ckpt_id_hex(uint64_t id, char *hex) { snprintf(hex, 17, "%016" PRIx64, id); }

static bool is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

em_status ckpt_dir_name(const char *dir, bool follow, char *out, size_t n, const char *fn)
{
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    if (len == 0 || (len == 1 && dir[0] == '/'))
        return em_err(EM_ERR_ARG, "%s: '%s' cannot be a checkpoint directory", fn, dir);
    if (len + 64 > n) return em_err(EM_ERR_IO, "%s: path too long: %.64s...", fn, dir);
    memcpy(out, dir, len);
    out[len] = '\0';
    const char *slash = strrchr(out, '/'), *last = slash ? slash + 1 : out;
    if (!strcmp(last, ".") || !strcmp(last, ".."))
        return em_err(EM_ERR_ARG, "%s: '%s': name the checkpoint directory itself, not . or ..", fn, dir);
    struct stat st;
    if (follow && lstat(out, &st) == 0 && S_ISLNK(st.st_mode)) {
        char *real = realpath(out, NULL);
        if (!real) return em_err(EM_ERR_IO, "%s: cannot follow the link %s: %s", fn, out, strerror(errno));
        bool fits = strlen(real) + 64 <= n;
        if (fits) snprintf(out, n, "%s", real);
        free(real);
        if (!fits) return em_err(EM_ERR_IO, "%s: path too long: %.64s...", fn, dir);
    }
    return EM_OK;
}

void ckpt_tmp_dir(const char *dir, uint64_t id, char *out, size_t n)
{
    char hex[17];
    ckpt_id_hex(id, hex);
    snprintf(out, n, "%s.tmp-%s", dir, hex);
}

/* dir's parent ("." when it has none) and last component. */
static void split_dir(const char *dir, char *parent, size_t n, const char **base)
{
    const char *slash = strrchr(dir, '/');
    if (!slash) {
        snprintf(parent, n, ".");
        *base = dir;
    } else {
        snprintf(parent, n, "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
        *base = slash + 1;
    }
}

/* Unlinks the files in path, then path itself (best effort; a directory
 * inside, never made by a save, stays). */
static void remove_flat_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) (void)unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    (void)rmdir(path);
}

void ckpt_abandon(const char *tmp) { remove_flat_dir(tmp); }

/* Calls fn(path) for each directory beside dir named DIR<tag><16 hex digits>
 * (exactly; links and files are left alone). */
static void each_sibling(const char *dir, const char *tag, void (*fn)(const char *path, void *ctx), void *ctx)
{
    char parent[PATH_MAX], path[PATH_MAX];
    const char *base;
    split_dir(dir, parent, sizeof parent, &base);
    size_t nb = strlen(base), nt = strlen(tag);
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strlen(nm) != nb + nt + 16 || strncmp(nm, base, nb) || strncmp(nm + nb, tag, nt) ||
            !is_hex(nm + nb + nt, 16))
            continue;
        struct stat st;
        if (!join(path, sizeof path, parent, nm)) continue;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) fn(path, ctx);
    }
    closedir(d);
}

static void remove_one(const char *path, void *ctx)
{
    (void)ctx;
    remove_flat_dir(path);
}

/* em_accel_save_model's sharded files: model-NNNNN-of-NNNNN.safetensors (5
 * or more digits each, as Hugging Face names them) and the index. */
static bool model_shard_file(const char *name)
{
    if (!strcmp(name, "model.safetensors.index.json")) return true;
    const char *p = name;
    if (strncmp(p, "model-", 6)) return false;
    p += 6;
    size_t k = strspn(p, "0123456789");
    if (k < 5 || strncmp(p + k, "-of-", 4)) return false;
    p += k + 4;
    k = strspn(p, "0123456789");
    return k >= 5 && !strcmp(p + k, ".safetensors");
}

/* p at n digits (at least one): past them, else NULL. */
static const char *digits(const char *p)
{
    size_t k = strspn(p, "0123456789");
    return k ? p + k : NULL;
}

/* A prepared object's file (accel_state.c, checkpoint_optim.c,
 * checkpoint_model.c): KIND[_K].safetensors, and a ZeRO rank's shard
 * KIND[_K].rank_R.safetensors. */
static bool object_file(const char *name, const char *kind)
{
    size_t n = strlen(kind);
    if (strncmp(name, kind, n)) return false;
    const char *p = name + n;
    if (*p == '_' && !(p = digits(p + 1))) return false;
    if (!strncmp(p, ".rank_", 6) && !(p = digits(p + 6))) return false;
    return !strcmp(p, ".safetensors");
}

/* A name a checkpoint directory may hold: its files, and the temporaries
 * of the writers (NAME.tmp, NAME.tmp.XXXXXX) an older ember left behind. */
static bool checkpoint_file(const char *name)
{
    char base[CKPT_NAME_MAX];
    if (strlen(name) >= sizeof base) return false;
    snprintf(base, sizeof base, "%s", name);
    char *t = strstr(base, ".tmp");
    if (t && (t[4] == '\0' || t[4] == '.')) *t = '\0';
    if (!strcmp(base, CKPT_MANIFEST) || object_file(base, "model") || object_file(base, "optimizer"))
        return true;
    if (model_shard_file(base)) return true; /* em_accel_save_model's */
    size_t n = strlen(base);
    if (n < 11 || strncmp(base, "rank_", 5) || strcmp(base + n - 5, ".json")) return false;
    for (size_t i = 5; i < n - 5; i++)
        if (base[i] < '0' || base[i] > '9') return false;
    return true;
}

em_status ckpt_begin(const char *dir, const char *tmp, const char *fn)
{
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return em_err(EM_ERR_IO, "%s: %s exists and is not a directory", fn, dir);
        DIR *d = opendir(dir);
        if (!d) return em_err(EM_ERR_IO, "%s: cannot read directory %s: %s", fn, dir, strerror(errno));
        struct dirent *e;
        char other[CKPT_NAME_MAX + 16] = "";
        while (!other[0] && (e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !checkpoint_file(e->d_name))
                snprintf(other, sizeof other, "%.60s", e->d_name);
        closedir(d);
        if (other[0])
            return em_err(
                EM_ERR_IO,
                "%s: %s holds '%s', which is not a checkpoint file; a save replaces the whole directory, "
                "so it must be new or hold only a checkpoint",
                fn, dir, other);
    } else if (errno != ENOENT) {
        return em_err(EM_ERR_IO, "%s: cannot use %s: %s", fn, dir, strerror(errno));
    }
    each_sibling(dir, ".tmp-", remove_one, NULL); /* interrupted saves */
    if (mkdir(tmp, 0755) != 0)
        return em_err(EM_ERR_IO, "%s: cannot create directory %s: %s", fn, tmp, strerror(errno));
    return EM_OK;
}

/* ---- removing a checkpoint (total_limit) ------------------------------------------- */

em_status ckpt_check_removable(const char *dir, const char *fn)
{
    struct stat st;
    if (lstat(dir, &st) != 0) return em_err(EM_ERR_IO, "%s: cannot look at %s: %s", fn, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return em_err(EM_ERR_IO, "%s: %s is not a directory, so not a checkpoint: it is left alone", fn, dir);
    DIR *d = opendir(dir);
    if (!d) return em_err(EM_ERR_IO, "%s: cannot read directory %s: %s", fn, dir, strerror(errno));
    struct dirent *e;
    char other[CKPT_NAME_MAX + 16] = "", path[PATH_MAX];
    while (!other[0] && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        bool file = join(path, sizeof path, dir, e->d_name) && lstat(path, &st) == 0 && S_ISREG(st.st_mode);
        if (!file || !checkpoint_file(e->d_name)) snprintf(other, sizeof other, "%.60s", e->d_name);
    }
    closedir(d);
    if (other[0])
        return em_err(EM_ERR_IO, "%s: %s holds '%s', which is not a checkpoint file, so it is not removed",
                      fn, dir, other);
    return EM_OK;
}

em_status ckpt_remove(const char *dir, const char *fn)
{
    em_status s = ckpt_check_removable(dir, fn);
    if (s) return s;
    char path[PATH_MAX];
    /* the manifest first: from then on no load takes it for complete */
    if (join(path, sizeof path, dir, CKPT_MANIFEST) && unlink(path) != 0 && errno != ENOENT)
        return em_err(EM_ERR_IO, "%s: cannot remove %s: %s", fn, path, strerror(errno));
    file_sync_dir(path);
    remove_flat_dir(dir);
    if (access(dir, F_OK) == 0) return em_err(EM_ERR_IO, "%s: cannot remove %s completely", fn, dir);
    file_sync_dir(dir);
    return EM_OK;
}

/* ---- the manifest ----------------------------------------------------------------- */

static void put_kv(jbuf *b, const char *key, const char *val, const char *after)
{
    jb_puts(b, "  ");
    jb_str(b, key);
    jb_puts(b, ": ");
    jb_str(b, val);
    jb_puts(b, after);
}

static em_status write_manifest(const char *tmp, const ckpt_manifest *m, const char *format, const char *fn)
{
    char num[32], hex[17];
    jbuf b = {0};
    jb_puts(&b, "{\n");
    put_kv(&b, "format", format, ",\n");
    ckpt_id_hex(m->id, hex);
    put_kv(&b, "save_id", hex, ",\n");
    snprintf(num, sizeof num, "%" PRId64, m->world);
    put_kv(&b, "world", num, ",\n");
    snprintf(num, sizeof num, "%" PRId64, m->steps);
    put_kv(&b, "steps", num, ",\n");
    jb_puts(&b, "  \"files\": [\n");
    for (int i = 0; i < m->n; i++) {
        jb_puts(&b, "    {\"name\": ");
        jb_str(&b, m->files[i].name);
        snprintf(num, sizeof num, "%" PRIu64, m->files[i].sum.size);
        jb_puts(&b, ", \"size\": ");
        jb_str(&b, num);
        snprintf(num, sizeof num, "%08x", m->files[i].sum.crc);
        jb_puts(&b, ", \"crc32\": ");
        jb_str(&b, num);
        jb_puts(&b, i + 1 < m->n ? "},\n" : "}\n");
    }
    jb_puts(&b, "  ],\n  \"crc32\": \"");
    size_t at = b.len;
    jb_puts(&b, "00000000\"\n}\n");
    if (b.oom) {
        free(b.p);
        return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    }
    snprintf(num, sizeof num, "%08x", file_crc32(0, b.p, b.len));
    memcpy(b.p + at, num, 8);
    char path[PATH_MAX];
    em_status s =
        join(path, sizeof path, tmp, CKPT_MANIFEST) ? EM_OK : em_err(EM_ERR_IO, "%s: path too long", fn);
    if (!s) s = file_write_atomic(path, b.p, b.len, fn);
    free(b.p);
    return s;
}

static bool get_str(const jval *o, const char *key, const char **out)
{
    const jval *v = json_get(o, key);
    if (!v || v->kind != J_STR) return false;
    *out = v->s;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    if (!*s || *s == '-' || *s == '+' || *s == ' ') return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = x;
    return true;
}

static bool parse_crc(const char *s, uint32_t *out)
{
    if (strlen(s) != 8 || !is_hex(s, 8)) return false;
    *out = (uint32_t)strtoul(s, NULL, 16);
    return true;
}

/* A file name a manifest may use: plain, inside the directory. */
static bool plain_name(const char *s)
{
    size_t n = strlen(s);
    return n > 0 && n < CKPT_NAME_MAX && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..") &&
           strcmp(s, CKPT_MANIFEST);
}

/* The manifest's own checksum: its "crc32" value with the digits read as '0'. */
static em_status check_manifest_crc(char *text, size_t n, const jval *root, const char *path, const char *fn)
{
    const jval *v = json_get(root, "crc32");
    size_t at = v ? v->pos : 0;
    if (!v || v->kind != J_STR || strlen(v->s) != 8 || !is_hex(v->s, 8) || at + 9 >= n || text[at] != '"' ||
        memcmp(text + at + 1, v->s, 8) || text[at + 9] != '"')
        return em_err(EM_ERR_IO,
                      "%s: %s has no valid \"crc32\" of its own (8 hex digits): the manifest is damaged", fn,
                      path);
    char want[9], got[9];
    memcpy(want, text + at + 1, 8);
    want[8] = '\0';
    memset(text + at + 1, '0', 8);
    snprintf(got, sizeof got, "%08x", file_crc32(0, text, n));
    memcpy(text + at + 1, want, 8);
    if (strcmp(want, got))
        return em_err(
            EM_ERR_IO,
            "%s: %s: the checksum does not match (crc32 %s in the file, its bytes give %s): the manifest "
            "is damaged",
            fn, path, want, got);
    return EM_OK;
}

static em_status bad_manifest(const char *path, const char *what, const char *fn)
{
    return em_err(EM_ERR_IO, "%s: %s: %s", fn, path, what);
}

/* Reads and checks dir/manifest.json into *m. */
static em_status read_manifest(const char *dir, const char *format, ckpt_manifest *m, const char *fn)
{
    char path[PATH_MAX];
    if (!join(path, sizeof path, dir, CKPT_MANIFEST)) return em_err(EM_ERR_IO, "%s: path too long", fn);
    char *text = NULL;
    size_t n = 0;
    em_status s = file_read_all(path, MANIFEST_MAX, &text, &n, fn);
    if (s) return s;
    jval root;
    char err[160];
    if (!json_parse(text, n, &root, err, sizeof err)) {
        free(text);
        return em_err(EM_ERR_IO, "%s: %s is not valid JSON (%s): the manifest is damaged", fn, path, err);
    }
    if (root.kind != J_OBJ) s = bad_manifest(path, "not a JSON object: the manifest is damaged", fn);
    if (!s) s = check_manifest_crc(text, n, &root, path, fn);
    free(text);
    const char *fmt = NULL, *id = NULL, *world = NULL, *steps = NULL;
    if (!s && (!get_str(&root, "format", &fmt) || strcmp(fmt, format))) {
        s = em_err(EM_ERR_IO, "%s: %s: format '%.60s', but this ember reads '%s'", fn, path,
                   fmt ? fmt : "(none)", format);
    }
    *m = (ckpt_manifest){0};
    if (!s && (!get_str(&root, "save_id", &id) || strlen(id) != 16 || !is_hex(id, 16)))
        s = bad_manifest(path, "\"save_id\" is missing or not 16 hex digits", fn);
    if (!s) m->id = strtoull(id, NULL, 16);
    uint64_t w = 0, st = 0;
    if (!s && (!get_str(&root, "world", &world) || !parse_u64(world, &w) || w < 1 || w > INT32_MAX ||
               !get_str(&root, "steps", &steps) || !parse_u64(steps, &st) || st > INT64_MAX))
        s = bad_manifest(path, "\"world\" or \"steps\" is missing or not a count", fn);
    m->world = (int64_t)w;
    m->steps = (int64_t)st;
    const jval *files = s ? NULL : json_get(&root, "files");
    if (!s && (!files || files->kind != J_ARR))
        s = bad_manifest(path, "\"files\" is missing or not a list", fn);
    if (!s && !(m->files = calloc((size_t)files->n + 1, sizeof *m->files)))
        s = em_err(EM_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; !s && i < files->n; i++) {
        const jval *f = &files->v[i];
        const char *name = NULL, *size = NULL, *crc = NULL;
        ckpt_entry *e = &m->files[i];
        if (f->kind != J_OBJ || !get_str(f, "name", &name) || !plain_name(name) ||
            !get_str(f, "size", &size) || !parse_u64(size, &e->sum.size) || !get_str(f, "crc32", &crc) ||
            !parse_crc(crc, &e->sum.crc)) {
            s = em_err(EM_ERR_IO, "%s: %s: file entry %d is not {\"name\", \"size\", \"crc32\"}", fn, path,
                       i);
            break;
        }
        snprintf(e->name, sizeof e->name, "%s", name);
        for (int k = 0; k < i && !s; k++)
            if (!strcmp(m->files[k].name, name))
                s = em_err(EM_ERR_IO, "%s: %s names %s twice", fn, path, name);
        m->n = i + 1;
    }
    json_free(&root);
    if (s) ckpt_manifest_free(m);
    return s;
}

/* A .json file of the save must carry the manifest's save id. */
static em_status check_save_id(const char *text, size_t n, const char *path, uint64_t id, const char *fn)
{
    jval root;
    char err[160];
    if (!json_parse(text, n, &root, err, sizeof err))
        return em_err(EM_ERR_IO, "%s: %s is not valid JSON: %s", fn, path, err);
    const char *got = NULL;
    char want[17];
    ckpt_id_hex(id, want);
    em_status s = EM_OK;
    if (root.kind != J_OBJ || !get_str(&root, "save_id", &got) || strcmp(got, want))
        s = em_err(EM_ERR_IO,
                   "%s: %s belongs to save %.20s but the manifest is of save %s (files of two saves mixed)",
                   fn, path, got ? got : "(none)", want);
    json_free(&root);
    return s;
}

/* Every file m names: its size and crc32, and a .json file's save id. */
static em_status verify_files(const char *dir, const ckpt_manifest *m, const char *fn)
{
    for (int i = 0; i < m->n; i++) {
        const ckpt_entry *e = &m->files[i];
        char path[PATH_MAX];
        if (!join(path, sizeof path, dir, e->name)) return em_err(EM_ERR_IO, "%s: path too long", fn);
        size_t nl = strlen(e->name);
        bool json = nl > 5 && !strcmp(e->name + nl - 5, ".json");
        char *text = NULL;
        file_sum got = {0};
        em_status s;
        if (json && e->sum.size <= JSON_MAX) {
            size_t n = 0;
            s = file_read_all(path, JSON_MAX, &text, &n, fn);
            got = (file_sum){.size = n, .crc = s ? 0 : file_crc32(0, text, n)};
        } else {
            s = file_checksum(path, &got, fn);
        }
        if (!s && got.size != e->sum.size)
            s = em_err(EM_ERR_IO,
                       "%s: %s is %" PRIu64 " bytes but the manifest says %" PRIu64 ": the file is damaged",
                       fn, path, got.size, e->sum.size);
        if (!s && got.crc != e->sum.crc)
            s = em_err(
                EM_ERR_IO,
                "%s: %s: the checksum does not match the manifest (crc32 %08x, the manifest says %08x): the "
                "file is damaged",
                fn, path, got.crc, e->sum.crc);
        if (!s && json) s = check_save_id(text, got.size, path, m->id, fn);
        free(text);
        if (s) return s;
    }
    return EM_OK;
}

bool ckpt_lists(const ckpt_manifest *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->files[i].name, name)) return true;
    return false;
}

static em_status open_verified(const char *dir, const char *format, ckpt_manifest *m, const char *fn)
{
    em_status s = read_manifest(dir, format, m, fn);
    if (!s && (s = verify_files(dir, m, fn))) ckpt_manifest_free(m);
    return s;
}

/* The newest complete DIR.old-*, for a DIR that an interrupted fallback
 * publish left missing. */
typedef struct old_pick {
    const char *format, *fn;
    char *real;
    size_t n;
    ckpt_manifest *m;
    bool found;
} old_pick;

static void try_old(const char *path, void *ctx)
{
    old_pick *p = ctx;
    ckpt_manifest m;
    if (open_verified(path, p->format, &m, p->fn) == EM_OK) {
        if (!p->found || m.steps > p->m->steps) {
            ckpt_manifest_free(p->m);
            *p->m = m;
            snprintf(p->real, p->n, "%s", path);
            p->found = true;
        } else {
            ckpt_manifest_free(&m);
        }
    } /* a damaged candidate is passed over: the caller reports DIR missing */
}

static void count_one(const char *path, void *ctx)
{
    (void)path;
    (*(int *)ctx)++;
}

bool ckpt_has_old(const char *dir)
{
    int n = 0;
    each_sibling(dir, ".old-", count_one, &n);
    return n > 0;
}

/* Why dir (a directory) has no manifest: an older ember's checkpoint, or an
 * incomplete one. */
static em_status no_manifest(const char *dir, const char *format, const char *fn)
{
    char path[PATH_MAX], *text = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/rank_0.json", dir);
    const char *old = NULL;
    jval root = {0};
    bool parsed = false;
    if (file_read_all(path, JSON_MAX, &text, &n, fn) == EM_OK) {
        char err[160];
        parsed = json_parse(text, n, &root, err, sizeof err);
        if (parsed && root.kind == J_OBJ && get_str(&root, "format", &old) && !strcmp(old, format))
            old = NULL;
    }
    em_status s =
        old ? em_err(EM_ERR_IO,
                     "%s: %s was saved by an older version of ember (format '%.60s'); this version reads "
                     "'%s' (with a manifest.json) and cannot load it",
                     fn, dir, old, format)
            : em_err(EM_ERR_IO,
                     "%s: %s is not a complete checkpoint: no %s (an interrupted save, or not a "
                     "checkpoint?)",
                     fn, dir, CKPT_MANIFEST);
    if (parsed) json_free(&root);
    free(text);
    return s;
}

em_status ckpt_open(const char *dir, const char *format, char *real, size_t n, ckpt_manifest *m,
                    const char *fn)
{
    *m = (ckpt_manifest){0};
    em_status s = ckpt_dir_name(dir, false, real, n, fn);
    if (s) return s;
    struct stat st;
    if (stat(real, &st) != 0) {
        int e = errno;
        char d[PATH_MAX];
        snprintf(d, sizeof d, "%s", real);
        if (e == ENOENT) {
            old_pick p = {.format = format, .fn = fn, .real = real, .n = n, .m = m};
            each_sibling(d, ".old-", try_old, &p);
            if (p.found) return EM_OK;
        }
        return em_err(EM_ERR_IO, "%s: no checkpoint at %s: %s", fn, d, strerror(e));
    }
    if (!S_ISDIR(st.st_mode)) return em_err(EM_ERR_IO, "%s: %s is not a directory", fn, real);
    char path[PATH_MAX];
    if (!join(path, sizeof path, real, CKPT_MANIFEST)) return em_err(EM_ERR_IO, "%s: path too long", fn);
    if (access(path, F_OK) != 0 && errno == ENOENT) return no_manifest(real, format, fn);
    return open_verified(real, format, m, fn);
}

/* ---- publishing -------------------------------------------------------------------- */

static em_status publish(const char *dir, const char *tmp, uint64_t id, const char *fn)
{
    fault_point("save.publish");
    bool no_exchange = false;
    em_status st = setting_env_bool("EMBER_NO_RENAME_EXCHANGE", &no_exchange);
    if (st) return st;
    bool exchange = !no_exchange;
    if (exchange && renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        file_sync_dir(dir);
        fault_point("save.published");
        remove_flat_dir(tmp); /* the previous checkpoint */
        return EM_OK;
    }
    int e = exchange ? errno : EINVAL;
    if (e == ENOENT || (access(dir, F_OK) != 0 && errno == ENOENT)) { /* the first save: nothing to replace */
        if (rename(tmp, dir) != 0)
            return em_err(EM_ERR_IO, "%s: cannot rename %s to %s: %s", fn, tmp, dir, strerror(errno));
        file_sync_dir(dir);
        return EM_OK;
    }
    if (e != EINVAL && e != ENOSYS && e != ENOTSUP)
        return em_err(EM_ERR_IO, "%s: cannot swap %s and %s: %s", fn, tmp, dir, strerror(e));
    /* no atomic swap on this file system: the previous checkpoint aside, the new one in */
    char old[PATH_MAX], hex[17];
    ckpt_id_hex(id, hex);
    snprintf(old, sizeof old, "%s.old-%s", dir, hex);
    if (rename(dir, old) != 0)
        return em_err(EM_ERR_IO, "%s: cannot rename %s to %s: %s", fn, dir, old, strerror(errno));
    file_sync_dir(dir);
    fault_point("save.old");
    if (rename(tmp, dir) != 0) {
        e = errno;
        (void)rename(old, dir);
        return em_err(EM_ERR_IO, "%s: cannot rename %s to %s: %s", fn, tmp, dir, strerror(e));
    }
    file_sync_dir(dir);
    fault_point("save.published");
    remove_flat_dir(old);
    return EM_OK;
}

em_status ckpt_finish(const char *dir, const char *tmp, const ckpt_manifest *m, const char *format,
                      const char *fn)
{
    em_status s = write_manifest(tmp, m, format, fn);
    if (!s) s = publish(dir, tmp, m->id, fn);
    if (s) return s;
    each_sibling(dir, ".old-", remove_one, NULL); /* copies an interrupted publish left */
    return EM_OK;
}

/* ---- ZeRO's shard files ---------------------------------------------------------------- */

void ckpt_shard_meta(jbuf *b, const char *format, const ckpt_shard_id *id)
{
    char hex[17], num[96];
    ckpt_id_hex(id->save_id, hex);
    jb_puts(b, "{\"format\":");
    jb_str(b, format);
    jb_puts(b, ",\"save_id\":");
    jb_str(b, hex);
    snprintf(num, sizeof num, ",\"world\":\"%d\",\"rank\":\"%d\",\"zero_stage\":\"%d\"", id->world, id->rank,
             id->stage);
    jb_puts(b, num);
}

em_status ckpt_meta_count(const em_safetensors *f, const char *path, const char *key, int64_t *out,
                          const char *fn)
{
    const char *v = em_safetensors_metadata(f, key);
    char *end = NULL;
    long long x = v && *v >= '0' && *v <= '9' ? strtoll(v, &end, 10) : -1;
    if (x < 0 || !end || *end)
        return em_err(EM_ERR_IO, "%s: %s: metadata \"%s\" is %s%s%s, not a count", fn, path, key,
                      v ? "'" : "", v ? v : "missing", v ? "'" : "");
    *out = x;
    return EM_OK;
}

em_status ckpt_shard_check(const em_safetensors *f, const char *path, const char *format, const char *what,
                           const ckpt_manifest *m, int world, int rank, const char *fn)
{
    const char *fmt = em_safetensors_metadata(f, "format"), *id = em_safetensors_metadata(f, "save_id");
    if (!fmt || strcmp(fmt, format))
        return em_err(EM_ERR_IO, "%s: %s is not %s (metadata \"format\" '%.40s', want '%s')", fn, path, what,
                      fmt ? fmt : "(none)", format);
    char want[17];
    ckpt_id_hex(m->id, want);
    if (!id || strcmp(id, want))
        return em_err(EM_ERR_IO,
                      "%s: %s belongs to save %.20s but the manifest is of save %s (a shard of another save)",
                      fn, path, id ? id : "(none)", want);
    int64_t w, r, stage;
    em_status s = ckpt_meta_count(f, path, "world", &w, fn);
    if (!s) s = ckpt_meta_count(f, path, "rank", &r, fn);
    if (!s) s = ckpt_meta_count(f, path, "zero_stage", &stage, fn);
    if (s) return s;
    if (w != world || r != rank)
        return em_err(
            EM_ERR_IO,
            "%s: %s holds rank %lld of %lld's shard; the save has %d ranks and this is rank %d's file", fn,
            path, (long long)r, (long long)w, world, rank);
    return EM_OK;
}

em_status ckpt_find_files(const ckpt_manifest *m, const char *dir, void (*file)(char *, size_t, int, int),
                          int k, const char *what, int *nfiles, bool *sharded, const char *fn)
{
    char whole[CKPT_NAME_MAX], name[CKPT_NAME_MAX];
    file(whole, sizeof whole, k, -1);
    file(name, sizeof name, k, 0);
    *nfiles = 1;
    *sharded = false;
    if (ckpt_lists(m, whole)) return EM_OK;
    if (!ckpt_lists(m, name))
        return em_err(EM_ERR_IO, "%s: %s holds no %s: its manifest names neither %s nor %s", fn, dir, what,
                      whole, name);
    *sharded = true;
    *nfiles = (int)m->world;
    for (int r = 1; r < *nfiles; r++) {
        file(name, sizeof name, k, r);
        if (!ckpt_lists(m, name))
            return em_err(
                EM_ERR_IO,
                "%s: %s was saved by %d ZeRO ranks but its manifest does not name rank %d's shard %s: "
                "the checkpoint is incomplete",
                fn, dir, *nfiles, r, name);
    }
    return EM_OK;
}

em_status ckpt_room(void **p, int *cap, int n, size_t size, const char *fn)
{
    if (n < *cap) return EM_OK;
    int c = *cap ? 2 * *cap : 64;
    void *q = realloc(*p, size * (size_t)c);
    if (!q) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    *p = q;
    *cap = c;
    return EM_OK;
}

void ckpt_object_file(char *buf, size_t n, const char *kind, int k, int rank)
{
    char base[32];
    if (k > 0)
        snprintf(base, sizeof base, "%s_%d", kind, k);
    else
        snprintf(base, sizeof base, "%s", kind);
    if (rank < 0)
        snprintf(buf, n, "%s.safetensors", base);
    else
        snprintf(buf, n, "%s.rank_%d.safetensors", base, rank);
}
