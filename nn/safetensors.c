/* safetensors.c — state dicts in the safetensors format, read and written.
 *
 * Layout of a file: u64 little-endian N, N bytes of UTF-8 JSON (the header),
 * then the data buffer. The header maps each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * buffer) plus an optional "__metadata__" object of strings. We write the
 * header padded with spaces so the buffer starts 8-byte aligned, and the
 * file goes to PATH.tmp, is fsync'd and renamed over PATH (fault points
 * "file.write" after the header, "file.fsync", "file.rename").
 *
 * Every file ember writes carries its own checksum: "ember.crc32" in
 * __metadata__, 8 lowercase hex digits, the zlib crc32 of the whole file
 * read with those 8 digits as '0' (so the header is covered too, not only
 * the data). The digits are written as zeros, the data streamed through the
 * crc, and the digits patched in before the fsync. A string value, so other
 * readers (Python's safetensors) load the file as before.
 *
 * Opening validates everything before returning: the header length against
 * the file size, the JSON (json.c), every entry's keys, dtype, shape and
 * offsets, offsets that tile the buffer exactly (no gap, no overlap), and
 * the metadata; a file that has "ember.crc32" is then read once through
 * and refused when the checksum differs (files from other tools have none
 * and open as before). Tensor data is read later with pread, one tensor at
 * a time.
 * Dtypes that the format names but ember lacks (I64, U16, F8_...) open fine
 * and fail on get with EM_ERR_DTYPE, except I64 whose values fit in i32.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tensor/fault_impl.h"
#include "../tensor/fileio_impl.h"
#include "../tensor/kernel_impl.h"
#include "../tensor/tensor_impl.h"
#include "ember/nn.h"
#include "json_impl.h"
#include "safetensors_impl.h"

#define ST_MAX_HEADER ((uint64_t)100 << 20) /* as the reference implementation */
#define ST_SUPPORTED "F32, F64, F16, BF16, I32, U8, BOOL; I64 when its values fit in i32"

/* Every dtype the format names; ember's dtype or -1 where ember has none. */
static const struct {
    const char *name;
    int dt;
    int size;
} st_dtypes[] = {
    {"F32", EM_F32, 4},  {"F64", EM_F64, 8},  {"F16", EM_F16, 2},     {"BF16", EM_BF16, 2},   {"I32", EM_I32, 4},
    {"U8", EM_U8, 1},    {"BOOL", EM_BOOL, 1}, {"I64", -1, 8},         {"I8", -1, 1},          {"I16", -1, 2},
    {"U16", -1, 2},      {"U32", -1, 4},       {"U64", -1, 8},         {"F8_E4M3", -1, 1},     {"F8_E5M2", -1, 1},
};
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))
#define ST_I64 7

static const char *st_name_of(em_dtype dt)
{
    for (int k = 0; k < ST_NDTYPES; k++)
        if (st_dtypes[k].dt == (int)dt) return st_dtypes[k].name;
    return "?";
}

typedef struct st_entry {
    char *name; /* in the file's name block */
    int sdt;    /* index into st_dtypes */
    int ndim;
    int64_t *shape;      /* in the file's shape block; NULL when ndim > EM_MAX_DIMS (ember cannot read it) */
    uint64_t begin, end; /* relative to the data buffer */
} st_entry;

/* An open file. What the header holds lives in four blocks, each allocated
 * once at the size a first walk over the header counted, so opening costs
 * memory in proportion to what the file declares, never to how its JSON is
 * written (tests/st_hostile.h shows the headers that cost most). */
struct em_safetensors {
    char *path;
    int fd;
    uint64_t data_start, data_len;
    int n;
    st_entry *e;
    char *names;     /* the tensor names, NUL-terminated, one after another */
    int64_t *shapes; /* the shapes of tensors with at most EM_MAX_DIMS dims */
    int nmeta;
    char *meta; /* the metadata as key NUL value NUL, nmeta times */
    bool has_crc;   /* the header has "ember.crc32" */
    bool trusted;   /* opened by st_open(path, false): the caller verified the bytes */
    size_t crc_pos; /* where its value's opening quote is in the header */
};

static bool host_le(void)
{
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* Reverses the bytes of each of n elements of size es (file <-> big-endian host). */
static void swap_bytes(void *p, int64_t n, size_t es)
{
    unsigned char *b = p;
    for (int64_t i = 0; i < n; i++, b += es)
        for (size_t k = 0; k < es / 2; k++) {
            unsigned char c = b[k];
            b[k] = b[es - 1 - k];
            b[es - 1 - k] = c;
        }
}

/* ---- reading --------------------------------------------------------------- */

static bool read_at(int fd, void *dst, size_t n, uint64_t off)
{
    char *p = dst;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return true;
}

void em_safetensors_close(em_safetensors *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->e);
    free(f->names);
    free(f->shapes);
    free(f->meta);
    free(f->path);
    free(f);
}

/* What a header holds: counted by the first walk over it, which checks
 * everything and stores nothing; the blocks get exactly these sizes and the
 * second walk fills them. */
typedef struct st_sizes {
    int entries;
    size_t names; /* bytes of the tensor names with their NULs */
    size_t dims;  /* shape entries of tensors with at most EM_MAX_DIMS dims */
    int nmeta;
    size_t meta; /* bytes of the metadata keys and values with their NULs */
} st_sizes;

typedef struct st_walk {
    em_safetensors *f;
    bool fill;    /* false: check and count; true: store into f's blocks */
    st_sizes at;  /* how much of each has been met */
    st_sizes cap; /* the blocks' sizes (fill) */
    char *err;
    size_t en;
} st_walk;

/* Checks the tensor entry at the cursor and fills e from it (the shape
 * into f's shape block when filling); false with a message. Keys are
 * checked first, then presence, dtype, shape, offsets, sizes. */
static bool parse_entry(st_walk *w, jcur *c, const char *name, st_entry *e)
{
    char *err = w->err;
    size_t en = w->en;
    size_t pos = jc_pos(c);
    if (jc_kind(c) != J_OBJ) {
        snprintf(err, en, "tensor '%.100s': entry is not an object (header byte %zu)", name, pos);
        return false;
    }
    jcur dt = {0}, sh = {0}, of = {0}; /* cursors on each known key's value */
    jc_enter(c);
    while (jc_more(c)) {
        char key[41];
        size_t kl = jc_key(c, key, sizeof key);
        jcur *slot = kl == 5 && !strcmp(key, "dtype")           ? &dt
                     : kl == 5 && !strcmp(key, "shape")         ? &sh
                     : kl == 12 && !strcmp(key, "data_offsets") ? &of
                                                                : NULL;
        if (!slot) {
            snprintf(err, en, "tensor '%.100s': unknown key '%.40s' (header byte %zu)", name, key, jc_pos(c));
            return false;
        }
        *slot = *c;
        jc_skip(c);
    }
    if (!dt.p || !sh.p || !of.p) {
        snprintf(err, en, "tensor '%.100s': missing \"%s\" (header byte %zu)", name,
                 !dt.p   ? "dtype"
                 : !sh.p ? "shape"
                         : "data_offsets",
                 pos);
        return false;
    }
    if (jc_kind(&dt) != J_STR) {
        snprintf(err, en, "tensor '%.100s': dtype is not a string (header byte %zu)", name, jc_pos(&dt));
        return false;
    }
    size_t dpos = jc_pos(&dt);
    char dname[21];
    size_t dl = jc_str(&dt, dname, sizeof dname);
    e->sdt = -1;
    for (int k = 0; k < ST_NDTYPES; k++)
        if (dl == strlen(st_dtypes[k].name) && !strcmp(dname, st_dtypes[k].name)) e->sdt = k;
    if (e->sdt < 0) {
        snprintf(err, en, "tensor '%.100s': unknown dtype '%.20s' (header byte %zu)", name, dname, dpos);
        return false;
    }
    if (jc_kind(&sh) != J_ARR) {
        snprintf(err, en, "tensor '%.100s': shape is not an array (header byte %zu)", name, jc_pos(&sh));
        return false;
    }
    int64_t shape[EM_MAX_DIMS];
    uint64_t numel = 1; /* saturates at UINT64_MAX, which matches no offsets */
    bool zero = false;
    int d = 0;
    for (jc_enter(&sh); jc_more(&sh); d++) {
        size_t xpos = jc_pos(&sh);
        int64_t x = jc_kind(&sh) == J_INT ? jc_int(&sh) : -1;
        if (x < 0) {
            snprintf(err, en,
                     "tensor '%.100s': shape entry %d is not a non-negative integer (header byte %zu)", name,
                     d, xpos);
            return false;
        }
        if (d < EM_MAX_DIMS) shape[d] = x;
        if (x == 0)
            zero = true;
        else
            numel = numel > UINT64_MAX / (uint64_t)x ? UINT64_MAX : numel * (uint64_t)x;
    }
    if (zero) numel = 0;
    e->ndim = d;
    size_t opos = jc_pos(&of);
    int64_t off[2] = {-1, -1};
    int noff = 0;
    bool ints = jc_kind(&of) == J_ARR;
    for (jc_enter(&of); ints && jc_more(&of); noff++) {
        if (jc_kind(&of) != J_INT)
            ints = false;
        else if (noff < 2)
            off[noff] = jc_int(&of);
        else
            jc_skip(&of);
    }
    if (!ints || noff != 2 || off[0] < 0 || off[1] < off[0]) {
        snprintf(
            err, en,
            "tensor '%.100s': data_offsets must be [begin, end] with 0 <= begin <= end (header byte %zu)",
            name, opos);
        return false;
    }
    e->begin = (uint64_t)off[0];
    e->end = (uint64_t)off[1];
    if (e->end > w->f->data_len) {
        snprintf(err, en, "tensor '%.100s': data_offsets [%llu, %llu] go beyond the data buffer (%llu bytes)",
                 name, (unsigned long long)e->begin, (unsigned long long)e->end,
                 (unsigned long long)w->f->data_len);
        return false;
    }
    uint64_t es = (uint64_t)st_dtypes[e->sdt].size;
    uint64_t want = numel > UINT64_MAX / es ? UINT64_MAX : numel * es;
    if (want != e->end - e->begin) {
        snprintf(err, en, "tensor '%.100s': %s %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                 name, st_dtypes[e->sdt].name, e->ndim <= EM_MAX_DIMS ? shp_of(e->ndim, shape) : "(>8 dims)",
                 (unsigned long long)want, (unsigned long long)e->begin, (unsigned long long)e->end,
                 (unsigned long long)(e->end - e->begin));
        return false;
    }
    e->shape = NULL;
    if (e->ndim <= EM_MAX_DIMS) {
        if (w->fill) {
            assert(w->at.dims + (size_t)e->ndim <= w->cap.dims);
            e->shape = w->f->shapes + w->at.dims;
            memcpy(e->shape, shape, sizeof(int64_t) * (size_t)e->ndim);
        }
        w->at.dims += (size_t)e->ndim;
    }
    return true;
}

/* The "__metadata__" object at the cursor: string values only. */
static bool parse_metadata(st_walk *w, jcur *c)
{
    size_t pos = jc_pos(c);
    if (jc_kind(c) != J_OBJ) {
        snprintf(w->err, w->en, "__metadata__ is not an object (header byte %zu)", pos);
        return false;
    }
    for (jc_enter(c); jc_more(c);) {
        size_t kl = jc_strlen(c);
        jcur v = *c;
        char key[61];
        jc_key(&v, key, sizeof key);
        if (jc_kind(&v) != J_STR) {
            snprintf(w->err, w->en, "__metadata__ value of '%.60s' is not a string (header byte %zu)", key,
                     jc_pos(&v));
            return false;
        }
        size_t vl = jc_strlen(&v);
        if (w->fill) {
            assert(w->at.meta + kl + vl + 2 <= w->cap.meta);
            char *o = w->f->meta + w->at.meta;
            jc_key(c, o, kl + 1);
            if (!strcmp(o, ST_CRC_KEY)) {
                w->f->has_crc = true;
                w->f->crc_pos = jc_pos(c);
            }
            jc_str(c, o + kl + 1, vl + 1);
        } else {
            *c = v;
            jc_skip(c);
        }
        w->at.meta += kl + vl + 2;
        w->at.nmeta++;
    }
    return true;
}

/* One walk over a header json_check accepted (see st_sizes). */
static bool walk_header(st_walk *w, const char *h, size_t n)
{
    jcur c = jc_start(h, n);
    if (jc_kind(&c) != J_OBJ) {
        snprintf(w->err, w->en, "header JSON is not an object");
        return false;
    }
    for (jc_enter(&c); jc_more(&c);) {
        size_t kl = jc_strlen(&c);
        char small[101]; /* the name as messages show it */
        jcur k = c;
        jc_key(&k, small, sizeof small);
        if (kl == 12 && !strcmp(small, "__metadata__")) {
            c = k;
            if (!parse_metadata(w, &c)) return false;
            continue;
        }
        st_entry tmp = {0}, *e = &tmp;
        char *name = small;
        if (w->fill) {
            assert(w->at.entries < w->cap.entries && w->at.names + kl + 1 <= w->cap.names);
            e = &w->f->e[w->at.entries];
            name = w->f->names + w->at.names;
            jc_key(&c, name, kl + 1);
        } else {
            c = k;
        }
        e->name = name;
        w->at.entries++;
        w->at.names += kl + 1;
        if (!kl) {
            snprintf(w->err, w->en, "a tensor has an empty name (header byte %zu)", jc_pos(&c));
            return false;
        }
        if (!parse_entry(w, &c, name, e)) return false;
    }
    return true;
}

static _Thread_local const st_entry *cmp_base;
static int cmp_begin(const void *a, const void *b)
{
    const st_entry *x = &cmp_base[*(const int *)a], *y = &cmp_base[*(const int *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* The entries must tile [0, data_len) exactly, in some order. */
static bool check_tiling(const em_safetensors *f, char *err, size_t en)
{
    int *ix = malloc(sizeof *ix * (size_t)(f->n ? f->n : 1));
    if (!ix) {
        snprintf(err, en, "out of memory");
        return false;
    }
    for (int i = 0; i < f->n; i++) ix[i] = i;
    cmp_base = f->e;
    qsort(ix, (size_t)f->n, sizeof *ix, cmp_begin);
    uint64_t at = 0;
    bool ok = true;
    for (int k = 0; k < f->n && ok; k++) {
        const st_entry *e = &f->e[ix[k]];
        if (e->begin < at) {
            const st_entry *p = &f->e[ix[k - 1]];
            snprintf(err, en, "tensors '%.80s' [%llu, %llu] and '%.80s' [%llu, %llu] overlap", p->name,
                     (unsigned long long)p->begin, (unsigned long long)p->end, e->name,
                     (unsigned long long)e->begin, (unsigned long long)e->end);
            ok = false;
        } else if (e->begin > at) {
            snprintf(err, en, "bytes [%llu, %llu) of the data buffer belong to no tensor", (unsigned long long)at,
                     (unsigned long long)e->begin);
            ok = false;
        }
        at = e->end;
    }
    if (ok && at != f->data_len) {
        snprintf(err, en, "the data buffer has %llu bytes but the tensors cover %llu", (unsigned long long)f->data_len,
                 (unsigned long long)at);
        ok = false;
    }
    free(ix);
    return ok;
}

/* Checks "ember.crc32": the crc of the 8-byte length, the header h[0..n)
 * with the checksum's digits read as '0', and the data buffer. */
static bool verify_crc(em_safetensors *f, const unsigned char *lenb, char *h, uint64_t n, char *err,
                       size_t en)
{
    const char *want = em_safetensors_metadata(f, ST_CRC_KEY);
    size_t at = f->crc_pos;
    bool hex =
        strlen(want) == 8 && at + 9 < n && h[at] == '"' && h[at + 9] == '"' && !memcmp(h + at + 1, want, 8);
    for (int k = 0; hex && k < 8; k++)
        hex = (want[k] >= '0' && want[k] <= '9') || (want[k] >= 'a' && want[k] <= 'f');
    if (!hex) {
        snprintf(err, en,
                 "__metadata__ \"" ST_CRC_KEY "\" is '%.20s', not 8 lowercase hex digits (header byte %zu)",
                 want, at);
        return false;
    }
    char digits[8];
    memcpy(digits, h + at + 1, 8);
    memset(h + at + 1, '0', 8);
    uint32_t crc = file_crc32(file_crc32(0, lenb, 8), h, n);
    memcpy(h + at + 1, digits, 8);
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(f->data_len < CHUNK ? f->data_len + 1 : CHUNK);
    if (!buf) {
        snprintf(err, en, "out of memory");
        return false;
    }
    for (uint64_t off = 0; off < f->data_len;) {
        size_t k = f->data_len - off < CHUNK ? (size_t)(f->data_len - off) : CHUNK;
        errno = 0;
        if (!read_at(f->fd, buf, k, f->data_start + off)) {
            free(buf);
            snprintf(err, en, "cannot read the data buffer to check its checksum: %s",
                     errno ? strerror(errno) : "file shrank");
            return false;
        }
        crc = file_crc32(crc, buf, k);
        off += k;
    }
    free(buf);
    char got[9];
    snprintf(got, sizeof got, "%08x", crc);
    if (strcmp(got, want)) {
        snprintf(err, en,
                 "the checksum does not match: the header says " ST_CRC_KEY " %s but the file's bytes "
                 "give %s (the file is damaged, or was changed by a tool that kept ember's metadata)",
                 want, got);
        return false;
    }
    return true;
}

/* Reads and validates the header of an open file into f: the JSON is
 * checked whole (json_check, no tree), walked once to check the entries and
 * count what they hold, then once more into blocks of exactly that size. */
static bool read_header(em_safetensors *f, char *err, size_t en)
{
    struct stat sb;
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, en, "not a regular file");
        return false;
    }
    uint64_t size = (uint64_t)sb.st_size;
    unsigned char lenb[8];
    if (size < 8 || !read_at(f->fd, lenb, 8, 0)) {
        snprintf(err, en, "file is too short (%llu bytes) for the 8-byte header length", (unsigned long long)size);
        return false;
    }
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = n << 8 | lenb[k];
    if (n > size - 8) {
        snprintf(err, en, "header length %llu is larger than the file (%llu bytes)", (unsigned long long)n,
                 (unsigned long long)size);
        return false;
    }
    if (n > ST_MAX_HEADER) {
        snprintf(err, en, "header length %llu is over the 100 MiB limit", (unsigned long long)n);
        return false;
    }
    char *h = malloc(n ? n : 1);
    if (!h || !read_at(f->fd, h, n, 8)) {
        free(h);
        snprintf(err, en, h ? "cannot read the header" : "out of memory");
        return false;
    }
    f->data_start = 8 + n;
    f->data_len = size - 8 - n;
    char jerr[160];
    if (!json_check(h, n, jerr, sizeof jerr)) {
        free(h);
        snprintf(err, en, "header JSON: %s", jerr);
        return false;
    }
    st_walk w = {f, false, {0}, {0}, err, en};
    bool ok = walk_header(&w, h, n);
    if (ok) {
        st_sizes sz = w.at;
        f->e = calloc((size_t)(sz.entries ? sz.entries : 1), sizeof *f->e);
        f->names = malloc(sz.names ? sz.names : 1);
        f->shapes = malloc(sizeof(int64_t) * (sz.dims ? sz.dims : 1));
        f->meta = malloc(sz.meta ? sz.meta : 1);
        if (!f->e || !f->names || !f->shapes || !f->meta) {
            snprintf(err, en, "out of memory");
            ok = false;
        }
        if (ok) {
            w = (st_walk){f, true, {0}, sz, err, en};
            ok = walk_header(&w, h, n);
            assert(!ok || (w.at.entries == sz.entries && w.at.names == sz.names && w.at.dims == sz.dims &&
                           w.at.nmeta == sz.nmeta && w.at.meta == sz.meta)); /* the two walks agree */
            f->n = w.at.entries;
            f->nmeta = w.at.nmeta;
        }
    }
    ok = ok && check_tiling(f, err, en) && (!f->has_crc || f->trusted || verify_crc(f, lenb, h, n, err, en));
    free(h);
    return ok;
}

em_safetensors *em_safetensors_open(const char *path) { return st_open(path, true); }

em_safetensors *st_open(const char *path, bool verify)
{
    if (!path) return em_fail(EM_ERR_ARG, "em_safetensors_open: path is NULL");
    em_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return em_fail(EM_ERR_OOM, "em_safetensors_open: out of memory");
    }
    f->trusted = !verify;
    f->fd = file_open_regular(path, "em_safetensors_open"); /* a FIFO is refused, not waited on */
    if (f->fd < 0) {
        held_error h;
        error_hold(&h, em_last_status());
        em_safetensors_close(f);
        error_restore(&h);
        return NULL;
    }
    char err[400];
    if (!read_header(f, err, sizeof err)) {
        em_safetensors_close(f);
        return em_fail(EM_ERR_IO, "em_safetensors_open: '%s': %s", path, err);
    }
    return f;
}

int em_safetensors_count(const em_safetensors *f) { return f ? f->n : 0; }

const char *em_safetensors_name(const em_safetensors *f, int i)
{
    if (!f) return em_fail(EM_ERR_ARG, "em_safetensors_name: file is NULL");
    if (i < 0 || i >= f->n)
        return em_fail(EM_ERR_INDEX, "em_safetensors_name: index %d out of range for %d tensors", i, f->n);
    return f->e[i].name;
}

const char *em_safetensors_metadata(const em_safetensors *f, const char *key)
{
    if (!f || !key) return NULL;
    const char *p = f->meta;
    for (int k = 0; k < f->nmeta; k++) {
        const char *v = p + strlen(p) + 1;
        if (!strcmp(p, key)) return v;
        p = v + strlen(v) + 1;
    }
    return NULL;
}

static const st_entry *find_entry(const em_safetensors *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name)) return &f->e[i];
    return NULL;
}

int em_safetensors_shape(const em_safetensors *f, const char *name, int64_t shape[EM_MAX_DIMS])
{
    if (!f || !name || !shape)
        return (em_fail(EM_ERR_ARG, "em_safetensors_shape: file, name or shape is NULL"), -1);
    const st_entry *e = find_entry(f, name);
    if (!e) return (em_fail(EM_ERR_ARG, "em_safetensors_shape: %s has no tensor '%s'", f->path, name), -1);
    if (!e->shape)
        return (em_fail(EM_ERR_SHAPE,
                        "em_safetensors_shape: '%s' in %s has %d dims; at most %d are supported", name,
                        f->path, e->ndim, EM_MAX_DIMS),
                -1);
    memcpy(shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
    return e->ndim;
}

/* ember's dtype for entry e (I64 reads as i32), or an EM_ERR_DTYPE/SHAPE
 * error naming op; -1 then. */
static int entry_dtype(const em_safetensors *f, const st_entry *e, const char *op)
{
    if (e->ndim > EM_MAX_DIMS) {
        em_err(EM_ERR_SHAPE, "%s: '%s': tensor '%s' has %d dims; ember supports at most %d", op, f->path, e->name,
               e->ndim, EM_MAX_DIMS);
        return -1;
    }
    if (e->sdt == ST_I64) return EM_I32;
    if (st_dtypes[e->sdt].dt < 0) {
        em_err(EM_ERR_DTYPE, "%s: '%s': tensor '%s' has dtype %s, which ember does not read (it reads " ST_SUPPORTED ")",
               op, f->path, e->name, st_dtypes[e->sdt].name);
        return -1;
    }
    return st_dtypes[e->sdt].dt;
}

/* Reads entry e into a new persistent tensor. */
static tensor *read_entry(const em_safetensors *f, const st_entry *e, const char *op)
{
    int dt = entry_dtype(f, e, op);
    if (dt < 0) return NULL;
    tensor *t = t_new_persistent((em_dtype)dt, e->ndim, e->shape);
    if (!t) return NULL;
    int64_t n = t_numel(t);
    size_t es = (size_t)st_dtypes[e->sdt].size;
    void *buf = e->sdt == ST_I64 ? malloc((size_t)n * 8 + 1) : t_ptr(t);
    if (!buf) {
        t_free(t);
        return em_fail(EM_ERR_OOM, "%s: out of memory reading '%s'", op, e->name);
    }
    errno = 0;
    if (!read_at(f->fd, buf, (size_t)(e->end - e->begin), f->data_start + e->begin)) {
        if (buf != t_ptr(t)) free(buf);
        t_free(t);
        return em_fail(EM_ERR_IO, "%s: '%s': cannot read tensor '%s' (%llu bytes at offset %llu): %s", op, f->path,
                       e->name, (unsigned long long)(e->end - e->begin),
                       (unsigned long long)(f->data_start + e->begin), errno ? strerror(errno) : "file shrank");
    }
    if (!host_le()) swap_bytes(buf, n, es);
    if (e->sdt == ST_I64) {
        int32_t *o = t_ptr(t);
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, (char *)buf + i * 8, 8);
            if (v < INT32_MIN || v > INT32_MAX) {
                free(buf);
                t_free(t);
                return em_fail(EM_ERR_DTYPE, "%s: '%s': tensor '%s' is I64 and element %lld = %lld does not fit in i32",
                               op, f->path, e->name, (long long)i, (long long)v);
            }
            o[i] = (int32_t)v;
        }
        free(buf);
    } else if (dt == EM_BOOL) {
        uint8_t *b = t_ptr(t);
        for (int64_t i = 0; i < n; i++) b[i] = b[i] != 0;
    }
    return t;
}

em_tensor *em_safetensors_get(const em_safetensors *f, const char *name)
{
    if (!f || !name) return em_fail(EM_ERR_ARG, "em_safetensors_get: %s is NULL", f ? "name" : "file");
    const st_entry *e = find_entry(f, name);
    if (!e) return em_fail(EM_ERR_ARG, "em_safetensors_get: '%s' has no tensor named '%s'", f->path, name);
    return t_handle(read_entry(f, e, "em_safetensors_get"));
}

int st_dtype(const em_safetensors *f, const char *name)
{
    const st_entry *e = find_entry(f, name);
    if (!e)
        return (em_fail(EM_ERR_ARG, "em_safetensors_get: '%s' has no tensor named '%s'", f->path, name), -1);
    return entry_dtype(f, e, "em_safetensors_get");
}

/* ---- writing --------------------------------------------------------------- */

static _Thread_local const em_named *name_base;
static int cmp_name(const void *a, const void *b)
{
    return strcmp(name_base[*(const int *)a].name, name_base[*(const int *)b].name);
}

/* Checks names (non-empty, UTF-8, not "__metadata__", unique) and handles. */
static em_status check_tensors(int n, const em_named *v)
{
    for (int i = 0; i < n; i++) {
        const char *nm = v[i].name;
        if (!nm || !nm[0])
            return em_err(EM_ERR_ARG, "em_safetensors_save: tensor %d has %s name", i, nm ? "an empty" : "a NULL");
        if (!strcmp(nm, "__metadata__"))
            return em_err(EM_ERR_ARG, "em_safetensors_save: '__metadata__' is reserved and cannot name a tensor");
        if (!json_utf8_ok((const unsigned char *)nm, strlen(nm)))
            return em_err(EM_ERR_ARG, "em_safetensors_save: tensor %d: name is not valid UTF-8", i);
        tensor *t = t_resolve(v[i].t, "em_safetensors_save");
        if (!t) return em_last_status(); /* a device tensor is written through a host copy */
    }
    int *ix = malloc(sizeof *ix * (size_t)(n > 0 ? n : 1));
    if (!ix) return em_err(EM_ERR_OOM, "em_safetensors_save: out of memory");
    for (int i = 0; i < n; i++) ix[i] = i;
    name_base = v;
    qsort(ix, (size_t)n, sizeof *ix, cmp_name);
    for (int k = 1; k < n; k++)
        if (!strcmp(v[ix[k - 1]].name, v[ix[k]].name)) {
            const char *nm = v[ix[k]].name;
            free(ix);
            return em_err(EM_ERR_ARG, "em_safetensors_save: two tensors are named '%s'", nm);
        }
    free(ix);
    return EM_OK;
}

/* The header JSON, padded with spaces so that 8 + its length is a multiple of
 * 8. meta: the parsed metadata object or NULL; its "ember.crc32", if any, is
 * replaced by ours, written as "00000000" at b->p + *crc_at. */
static bool build_header(jbuf *b, int n, const em_named *v, const jval *meta, size_t *crc_at)
{
    char num[64];
    uint64_t off = 0;
    jb_puts(b, "{\"__metadata__\":{");
    for (int k = 0; meta && k < meta->n; k++) {
        if (!strcmp(meta->keys[k], ST_CRC_KEY)) continue;
        jb_str(b, meta->keys[k]);
        jb_puts(b, ":");
        jb_str(b, meta->v[k].s);
        jb_puts(b, ",");
    }
    jb_puts(b, "\"" ST_CRC_KEY "\":\"");
    *crc_at = b->len;
    jb_puts(b, "00000000\"}");
    for (int i = 0; i < n; i++) {
        tensor *t = t_resolve(v[i].t, "em_safetensors_save");
        uint64_t bytes = (uint64_t)t_numel(t) * t_esize(t);
        jb_puts(b, ",");
        jb_str(b, v[i].name);
        jb_puts(b, ":{\"dtype\":\"");
        jb_puts(b, st_name_of(t->dtype));
        jb_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->shape[d]);
            jb_puts(b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + bytes));
        jb_puts(b, num);
        off += bytes;
    }
    jb_puts(b, "}");
    while ((8 + b->len) % 8) jb_puts(b, " ");
    return !b->oom;
}

/* Writes p[0..n) and continues *crc over it. */
static bool write_all(FILE *fp, const void *p, size_t n, uint32_t *crc)
{
    if (n == 0) return true;
    *crc = file_crc32(*crc, p, n);
    return fwrite(p, 1, n, fp) == n;
}

/* Writes t's elements, contiguous and little-endian. */
static bool write_tensor(FILE *fp, tensor *t, uint32_t *crc)
{
    int64_t n = t_numel(t);
    size_t nbytes = (size_t)n * t_esize(t);
    if (!t_on_cuda(t) && t_is_contig(t) && host_le()) return write_all(fp, t_ptr(t), nbytes, crc);
    tensor *c = t_new_persistent(t->dtype, t->ndim, t->shape);
    if (!c) return false;
    if (t_on_cuda(t)) { /* the device's values through a host copy */
        if (em_to_array(t_handle(t), t->dtype, t_ptr(c))) {
            t_free(c);
            return false;
        }
    } else {
        copy_strided(c, t);
    }
    if (!host_le()) swap_bytes(t_ptr(c), n, t_esize(c));
    bool ok = write_all(fp, t_ptr(c), nbytes, crc);
    t_free(c);
    return ok;
}

em_status em_safetensors_save(const char *path, int n, const em_named *tensors, const char *metadata_json)
{
    return st_save(path, n, tensors, metadata_json, NULL);
}

em_status st_save(const char *path, int n, const em_named *tensors, const char *metadata_json, file_sum *sum)
{
    if (!path || !path[0]) return em_err(EM_ERR_ARG, "em_safetensors_save: path is %s", path ? "empty" : "NULL");
    if (n < 0 || (n > 0 && !tensors))
        return em_err(EM_ERR_ARG, "em_safetensors_save: '%s': n = %d with tensors %s", path, n,
                      tensors ? "given" : "NULL");
    em_status s = check_tensors(n, tensors);
    if (s) return s;
    jval meta;
    bool have_meta = metadata_json != NULL;
    if (have_meta) {
        char jerr[160];
        if (!json_parse(metadata_json, strlen(metadata_json), &meta, jerr, sizeof jerr))
            return em_err(EM_ERR_ARG, "em_safetensors_save: metadata: %s", jerr);
        bool flat = meta.kind == J_OBJ;
        for (int k = 0; flat && k < meta.n; k++) flat = meta.v[k].kind == J_STR;
        if (!flat) {
            json_free(&meta);
            return em_err(EM_ERR_ARG, "em_safetensors_save: metadata must be a flat JSON object of string values");
        }
    }
    jbuf hb = {0};
    size_t crc_at = 0;
    bool built = build_header(&hb, n, tensors, have_meta ? &meta : NULL, &crc_at);
    if (have_meta) json_free(&meta);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!built || !tmp) {
        free(hb.p);
        free(tmp);
        return em_err(EM_ERR_OOM, "em_safetensors_save: out of memory");
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);

    const char *step = "create";
    int err = 0;
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        err = errno;
        free(hb.p);
        s = em_err(EM_ERR_IO, "em_safetensors_save: cannot create '%s': %s", tmp, strerror(err));
        free(tmp);
        return s;
    }
    unsigned char lenb[8];
    for (int k = 0; k < 8; k++) lenb[k] = (unsigned char)((uint64_t)hb.len >> (8 * k));
    uint32_t head = 0, data = 0; /* crc of the length + header (digits '0'), of the data */
    bool ok = write_all(fp, lenb, 8, &head) && write_all(fp, hb.p, hb.len, &head);
    if (ok) fault_point("file.write"); /* a temporary with its header only */
    uint64_t data_len = 0;
    for (int i = 0; ok && i < n; i++) {
        tensor *t = t_resolve(tensors[i].t, "em_safetensors_save");
        ok = write_tensor(fp, t, &data);
        data_len += (uint64_t)t_numel(t) * t_esize(t);
    }
    if (!ok) step = "write";
    if (ok && fflush(fp) != 0) ok = false, step = "flush";
    if (ok) { /* the checksum's digits into the header */
        char hex[9];
        snprintf(hex, sizeof hex, "%08x", file_crc32_combine(head, data, data_len));
        memcpy(hb.p + crc_at, hex, 8);
        if (pwrite(fileno(fp), hex, 8, (off_t)(8 + crc_at)) != 8) ok = false, step = "write";
    }
    if (ok) fault_point("file.fsync");
    if (ok && fsync(fileno(fp)) != 0) ok = false, step = "fsync";
    if (!ok) err = errno;
    if (fclose(fp) != 0 && ok) ok = false, step = "close", err = errno;
    if (ok) fault_point("file.rename");
    if (ok && rename(tmp, path) != 0) ok = false, step = "rename", err = errno;
    if (ok && sum) {
        sum->size = 8 + hb.len + data_len;
        sum->crc = file_crc32_combine(file_crc32(file_crc32(0, lenb, 8), hb.p, hb.len), data, data_len);
    }
    free(hb.p);
    if (!ok) {
        unlink(tmp);
        s = em_err(EM_ERR_IO, "em_safetensors_save: cannot %s '%s': %s", step,
                   strcmp(step, "rename") ? tmp : path, err ? strerror(err) : "failed");
        free(tmp);
        return s;
    }
    free(tmp);
    file_sync_dir(path);
    return EM_OK;
}

/* ---- modules ----------------------------------------------------------------- */

/* Parameters then buffers of m, names relative to m (malloc'd array). */
static em_named *module_tensors(const em_module *m, int *count)
{
    int np = em_module_params(m, NULL, 0), nb = em_module_buffers(m, NULL, 0);
    em_named *v = malloc(sizeof *v * (size_t)(np + nb + 1));
    if (!v) return em_fail(EM_ERR_OOM, "module state: out of memory");
    em_module_params(m, v, np);
    em_module_buffers(m, v + np, nb);
    *count = np + nb;
    return v;
}

em_status em_module_save(const em_module *m, const char *path) { return module_save(m, path, NULL); }

em_status module_save(const em_module *m, const char *path, file_sum *sum)
{
    if (!m) return em_err(EM_ERR_ARG, "em_module_save: module is NULL");
    int n = 0;
    em_named *v = module_tensors(m, &n);
    if (!v) return em_last_status();
    /* "format":"pt" tells Hugging Face loaders the tensors follow PyTorch's
     * layout conventions, which ember's do. */
    em_status s = st_save(path, n, v, "{\"format\":\"pt\"}", sum);
    free(v);
    return s;
}

/* Appends "'name'" to a list of at most 3 names in buf. */
static void list_name(char *buf, size_t cap, int *count, const char *name)
{
    if (*count < 3) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s'%.60s'", *count ? ", " : "", name);
    } else if (*count == 3) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, ", ...");
    }
    (*count)++;
}

em_status em_module_load(em_module *m, const char *path, bool strict) { return module_load(m, path, strict, true); }

em_status module_load(em_module *m, const char *path, bool strict, bool verify)
{
    if (!m || !path) return em_err(EM_ERR_ARG, "em_module_load: %s is NULL", m ? "path" : "module");
    em_safetensors *f = st_open(path, verify);
    if (!f) return em_last_status();
    int n = 0;
    em_named *v = module_tensors(m, &n);
    const st_entry **src = v ? calloc((size_t)(n + 1), sizeof *src) : NULL;
    tensor **staged = v ? calloc((size_t)(n + 1), sizeof *staged) : NULL;
    bool *used = calloc((size_t)(f->n + 1), sizeof *used);
    em_status s = EM_OK;
    if (!v || !src || !staged || !used) {
        s = em_err(EM_ERR_OOM, "em_module_load: out of memory");
        goto done;
    }
    /* 1. names: what the module lacks in the file and what the file has extra */
    char missing[240] = "", extra[240] = "";
    int nmiss = 0, nextra = 0;
    for (int i = 0; i < n; i++) {
        src[i] = find_entry(f, v[i].name);
        if (src[i]) used[src[i] - f->e] = true;
        else list_name(missing, sizeof missing, &nmiss, v[i].name);
    }
    for (int k = 0; k < f->n; k++)
        if (!used[k]) list_name(extra, sizeof extra, &nextra, f->e[k].name);
    if (strict && (nmiss || nextra)) {
        s = em_err(EM_ERR_ARG, "em_module_load: '%s': %d missing tensor(s)%s%s; %d unexpected%s%s", path, nmiss,
                   nmiss ? ": " : "", missing, nextra, nextra ? ": " : "", extra);
        goto done;
    }
    /* 2. shapes and readable dtypes */
    for (int i = 0; i < n; i++) {
        if (!src[i]) continue;
        tensor *t = t_resolve(v[i].t, "em_module_load");
        if (!t) {
            s = em_last_status();
            goto done;
        }
        if (entry_dtype(f, src[i], "em_module_load") < 0) {
            s = em_last_status();
            goto done;
        }
        if (src[i]->ndim != t->ndim || memcmp(src[i]->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim)) {
            s = em_err(EM_ERR_SHAPE, "em_module_load: '%s': '%s' is %s in the file but %s in the module", path,
                       v[i].name, shp_of(src[i]->ndim, src[i]->shape), shp(t));
            goto done;
        }
    }
    /* 3. read everything (onto the parameter's device), then 4. copy (cannot
     * fail), so a failed load changes nothing */
    for (int i = 0; i < n; i++) {
        if (src[i] && !(staged[i] = read_entry(f, src[i], "em_module_load"))) {
            s = em_last_status();
            goto done;
        }
        tensor *t = staged[i] ? t_resolve(v[i].t, "em_module_load") : NULL;
        if (t && !em_device_equal(t->device, staged[i]->device)) { /* onto the parameter's device */
            tensor *d = t_copy_to(staged[i], t->device);
            t_free(staged[i]);
            if (!(staged[i] = d)) {
                s = em_last_status();
                goto done;
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (staged[i]) copy_strided(t_resolve(v[i].t, "em_module_load"), staged[i]);
done:
    for (int i = 0; staged && i < n; i++) t_drop(staged[i]); /* a device copy may be the open scope's */
    free(staged);
    free(src);
    free(used);
    free(v);
    em_safetensors_close(f);
    return s;
}
