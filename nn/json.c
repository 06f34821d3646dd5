/* json.c — the strict JSON reader behind the safetensors header, and the
 * escaping writer used to produce one. See json_impl.h for what is taken
 * and what is rejected.
 *
 * One recursive-descent validator (json_check) reads every byte; it builds
 * nothing, so its memory does not grow with the values it meets, only with
 * the keys of the objects it is inside, kept as 4-byte offsets and sorted at
 * each object's end to find duplicates. Everything else reads text the
 * validator accepted: the cursor (jc_*) decodes a value where it stands, and
 * json_parse's tree is built in one block whose size the validating pass
 * counted. All of them decode strings with the same function (str_step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_impl.h"

#define JSON_MAX_DEPTH 16
#define JSON_MAX_LEN ((size_t)INT32_MAX) /* key offsets are 4 bytes, member counts an int */

static bool jp_fail(jcur *j, const char *what)
{
    if (!j->err) return false;
    if (j->i >= j->n)
        snprintf(j->err, j->errlen, "%s at byte %zu (end of input)", what, j->i);
    else if (j->p[j->i] >= 0x20 && j->p[j->i] < 0x7f)
        snprintf(j->err, j->errlen, "%s at byte %zu ('%c')", what, j->i, j->p[j->i]);
    else
        snprintf(j->err, j->errlen, "%s at byte %zu (byte 0x%02x)", what, j->i, j->p[j->i]);
    return false;
}

static void skip_ws(jcur *j)
{
    while (j->i < j->n &&
           (j->p[j->i] == ' ' || j->p[j->i] == '\t' || j->p[j->i] == '\n' || j->p[j->i] == '\r'))
        j->i++;
}

/* Length of the UTF-8 sequence at s (at most n bytes), 0 if malformed. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, cp = c & 0x07;
    else
        return 0;
    if (len > n) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

bool json_utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = utf8_len(s + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

static int put_utf8(unsigned char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Four hex digits at j->i into *cp. (tests/fuzz/fuzz_json_planted.c builds
 * this file with EMBER_FUZZ_PLANTED_BUG, which drops the bounds check below,
 * to show its fuzzer finds the overread of a truncated escape.) */
static bool hex4(jcur *j, unsigned *cp)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++, j->i++) {
#ifndef EMBER_FUZZ_PLANTED_BUG
        if (j->i >= j->n) return jp_fail(j, "truncated \\u escape");
#endif
        unsigned c = j->p[j->i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return jp_fail(j, "bad hex digit in \\u escape");
        v = v << 4 | d;
    }
    *cp = v;
    return true;
}

/* One character of a string literal at j->i (inside the quotes): its UTF-8
 * bytes into o[0..4) and their count; 0 at the closing quote (stepped over),
 * -1 on an error (reported). */
static int str_step(jcur *j, unsigned char *o)
{
    if (j->i >= j->n) return jp_fail(j, "unterminated string"), -1;
    unsigned c = j->p[j->i];
    if (c == '"') {
        j->i++;
        return 0;
    }
    if (c < 0x20) return jp_fail(j, "control character in string"), -1;
    if (c != '\\') {
        size_t len = utf8_len(j->p + j->i, j->n - j->i);
        if (!len) return jp_fail(j, "invalid UTF-8 in string"), -1;
        memcpy(o, j->p + j->i, len);
        j->i += len;
        return (int)len;
    }
    size_t at = j->i++;
    if (j->i >= j->n) return jp_fail(j, "unterminated string"), -1;
    unsigned cp = 0;
    switch (j->p[j->i]) {
    case '"': cp = '"'; break;
    case '\\': cp = '\\'; break;
    case '/': cp = '/'; break;
    case 'b': cp = '\b'; break;
    case 'f': cp = '\f'; break;
    case 'n': cp = '\n'; break;
    case 'r': cp = '\r'; break;
    case 't': cp = '\t'; break;
    case 'u': {
        j->i++;
        if (!hex4(j, &cp)) return -1;
        if (cp >= 0xdc00 && cp <= 0xdfff) {
            j->i = at;
            return jp_fail(j, "unpaired low surrogate in \\u escape"), -1;
        }
        if (cp >= 0xd800 && cp <= 0xdbff) {
            unsigned lo = 0;
            if (j->i + 1 >= j->n || j->p[j->i] != '\\' || j->p[j->i + 1] != 'u') {
                j->i = at;
                return jp_fail(j, "high surrogate without its low half"), -1;
            }
            j->i += 2;
            if (!hex4(j, &lo)) return -1;
            if (lo < 0xdc00 || lo > 0xdfff) {
                j->i = at;
                return jp_fail(j, "high surrogate without its low half"), -1;
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp == 0) {
            j->i = at;
            return jp_fail(j, "\\u0000 is not allowed in a string"), -1;
        }
        return put_utf8(o, cp); /* j->i is already past the escape */
    }
    default: return jp_fail(j, "bad escape in string"), -1;
    }
    j->i++;
    o[0] = (unsigned char)cp;
    return 1;
}

/* The string literal at j->i (on its opening quote), checked and stepped
 * over; decoded into o[0..cap) (truncated, NUL-terminated) unless o is NULL.
 * *len is the whole decoded length. */
static bool scan_string(jcur *j, char *o, size_t cap, size_t *len)
{
    j->i++;
    size_t k = 0;
    unsigned char b[4];
    int nb;
    while ((nb = str_step(j, b)) > 0)
        for (int x = 0; x < nb; x++, k++)
            if (o && k + 1 < cap) o[k] = (char)b[x];
    if (nb < 0) return false;
    if (o && cap) o[k < cap ? k : cap - 1] = '\0';
    *len = k;
    return true;
}

static bool parse_int(jcur *j, int64_t *out)
{
    bool neg = j->p[j->i] == '-';
    if (neg) j->i++;
    if (j->i >= j->n || j->p[j->i] < '0' || j->p[j->i] > '9') return jp_fail(j, "expected a digit");
    if (j->p[j->i] == '0' && j->i + 1 < j->n && j->p[j->i + 1] >= '0' && j->p[j->i + 1] <= '9')
        return jp_fail(j, "leading zero in number");
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    while (j->i < j->n && j->p[j->i] >= '0' && j->p[j->i] <= '9') {
        unsigned d = j->p[j->i] - '0';
        if (v > (lim - d) / 10) return jp_fail(j, "integer out of range");
        v = v * 10 + d;
        j->i++;
    }
    if (j->i < j->n && (j->p[j->i] == '.' || j->p[j->i] == 'e' || j->p[j->i] == 'E'))
        return jp_fail(j, "numbers must be integers");
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* ---- validating -------------------------------------------------------------- */

typedef struct jparser {
    jcur c;
    int depth;
    uint32_t *keys; /* offsets of the keys of every object being read */
    size_t nkeys, capkeys;
    size_t values, members, strbytes; /* what json_parse's tree needs */
} jparser;

/* The decoded bytes of a checked string literal, one at a time. */
typedef struct kiter {
    jcur c;
    unsigned char b[4];
    int nb, at;
} kiter;

static kiter kiter_at(const unsigned char *p, size_t n, size_t quote)
{
    return (kiter){.c = {p, n, quote + 1, NULL, 0}};
}

/* The next byte, or -1 at the end. */
static int kiter_next(kiter *k)
{
    if (k->at == k->nb) {
        k->nb = str_step(&k->c, k->b);
        k->at = 0;
        if (k->nb <= 0) {
            k->nb = 0;
            return -1;
        }
    }
    return k->b[k->at++];
}

static _Thread_local const jcur *sort_text;
/* Keys by their decoded bytes (as strcmp orders them), then by position. */
static int cmp_key(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    kiter kx = kiter_at(sort_text->p, sort_text->n, x), ky = kiter_at(sort_text->p, sort_text->n, y);
    for (;;) {
        int cx = kiter_next(&kx), cy = kiter_next(&ky);
        if (cx != cy) return cx < cy ? -1 : 1;
        if (cx < 0) return (x > y) - (x < y);
    }
}

/* Duplicates among the keys of the object just read (keys[base..]): the
 * error points at the value of the later duplicate. */
static bool unique_keys(jparser *j, size_t base)
{
    size_t m = j->nkeys - base;
    if (m < 2) return true;
    uint32_t *k = j->keys + base;
    sort_text = &j->c;
    qsort(k, m, sizeof *k, cmp_key);
    for (size_t x = 1; x < m; x++) {
        kiter a = kiter_at(j->c.p, j->c.n, k[x - 1]), b = kiter_at(j->c.p, j->c.n, k[x]);
        int ca, cb;
        do ca = kiter_next(&a), cb = kiter_next(&b);
        while (ca == cb && ca >= 0);
        if (ca != cb) continue;
        char key[81];
        jcur at = {j->c.p, j->c.n, k[x], NULL, 0};
        size_t len;
        scan_string(&at, key, sizeof key, &len);
        skip_ws(&at);
        at.i++; /* ':' */
        skip_ws(&at);
        snprintf(j->c.err, j->c.errlen, "duplicate key '%s' (second value at byte %zu)", key, at.i);
        j->c.i = at.i;
        return false;
    }
    return true;
}

static bool push_key(jparser *j, size_t at)
{
    if (j->nkeys == j->capkeys) {
        size_t c = j->capkeys ? 2 * j->capkeys : 64;
        uint32_t *nk = realloc(j->keys, sizeof *nk * c);
        if (!nk) return jp_fail(&j->c, "out of memory");
        j->keys = nk;
        j->capkeys = c;
    }
    j->keys[j->nkeys++] = (uint32_t)at;
    return true;
}

static bool check_value(jparser *j);

static bool check_container(jparser *j)
{
    jcur *c = &j->c;
    bool obj = c->p[c->i] == '{';
    char close = obj ? '}' : ']';
    if (++j->depth > JSON_MAX_DEPTH) return jp_fail(c, "nesting deeper than 16 levels");
    c->i++;
    skip_ws(c);
    size_t base = j->nkeys;
    if (c->i < c->n && c->p[c->i] == close) {
        c->i++;
        j->depth--;
        return true;
    }
    for (;;) {
        skip_ws(c);
        if (obj) {
            if (c->i >= c->n || c->p[c->i] != '"') return jp_fail(c, "expected a string key");
            size_t at = c->i, len;
            if (!scan_string(c, NULL, 0, &len) || !push_key(j, at)) return false;
            j->members++;
            j->strbytes += len + 1;
            skip_ws(c);
            if (c->i >= c->n || c->p[c->i] != ':') return jp_fail(c, "expected ':'");
            c->i++;
        }
        if (!check_value(j)) return false;
        skip_ws(c);
        if (c->i < c->n && c->p[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->i < c->n && c->p[c->i] == close) break;
        return jp_fail(c, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    c->i++;
    j->depth--;
    bool ok = !obj || unique_keys(j, base);
    j->nkeys = base;
    return ok;
}

static bool check_value(jparser *j)
{
    jcur *c = &j->c;
    skip_ws(c);
    j->values++;
    if (c->i >= c->n) return jp_fail(c, "expected a value");
    unsigned ch = c->p[c->i];
    if (ch == '{' || ch == '[') return check_container(j);
    if (ch == '"') {
        size_t len;
        if (!scan_string(c, NULL, 0, &len)) return false;
        j->strbytes += len + 1;
        return true;
    }
    int64_t v;
    if (ch == '-' || (ch >= '0' && ch <= '9')) return parse_int(c, &v);
    return jp_fail(c, "expected a value");
}

/* Validates the text, counting in j what a tree of it needs. */
static bool validate(jparser *j, const char *text, size_t len, char *err, size_t errlen)
{
    *j = (jparser){.c = {(const unsigned char *)text, len, 0, err, errlen}};
    if (len > JSON_MAX_LEN) {
        snprintf(err, errlen, "the text is %zu bytes, over the 2 GiB this reader takes", len);
        return false;
    }
    bool ok = check_value(j);
    free(j->keys);
    j->keys = NULL;
    if (!ok) return false;
    skip_ws(&j->c);
    if (j->c.i != j->c.n) return jp_fail(&j->c, "unexpected characters after the JSON value");
    return true;
}

bool json_check(const char *text, size_t len, char *err, size_t errlen)
{
    jparser j;
    return validate(&j, text, len, err, errlen);
}

/* ---- the cursor ---------------------------------------------------------------- */

jcur jc_start(const char *text, size_t len) { return (jcur){(const unsigned char *)text, len, 0, NULL, 0}; }

jkind jc_kind(jcur *c)
{
    skip_ws(c);
    if (c->i >= c->n) return J_INT;
    switch (c->p[c->i]) {
    case '{': return J_OBJ;
    case '[': return J_ARR;
    case '"': return J_STR;
    default: return J_INT;
    }
}

size_t jc_pos(jcur *c)
{
    skip_ws(c);
    return c->i;
}

void jc_enter(jcur *c)
{
    skip_ws(c);
    if (c->i < c->n) c->i++;
}

bool jc_more(jcur *c)
{
    skip_ws(c);
    if (c->i >= c->n) return false;
    if (c->p[c->i] == '}' || c->p[c->i] == ']') {
        c->i++;
        return false;
    }
    if (c->p[c->i] == ',') {
        c->i++;
        skip_ws(c);
    }
    return true;
}

size_t jc_str(jcur *c, char *out, size_t cap)
{
    skip_ws(c);
    size_t len = 0;
    if (out && cap) out[0] = '\0';
    if (c->i < c->n && c->p[c->i] == '"') scan_string(c, out, cap, &len);
    return len;
}

size_t jc_key(jcur *c, char *out, size_t cap)
{
    size_t len = jc_str(c, out, cap);
    skip_ws(c);
    if (c->i < c->n && c->p[c->i] == ':') c->i++;
    return len;
}

size_t jc_strlen(jcur *c)
{
    jcur at = *c;
    return jc_str(&at, NULL, 0);
}

int64_t jc_int(jcur *c)
{
    skip_ws(c);
    int64_t v = 0;
    if (c->i < c->n && !parse_int(c, &v)) return 0;
    return v;
}

/* Past the string literal at c->i (on its opening quote), unchecked. */
static void skip_string(jcur *c)
{
    for (c->i++; c->i < c->n && c->p[c->i] != '"'; c->i++)
        if (c->p[c->i] == '\\') c->i++;
    if (c->i < c->n) c->i++;
}

void jc_skip(jcur *c)
{
    skip_ws(c);
    if (c->i >= c->n) return;
    unsigned ch = c->p[c->i];
    if (ch == '"') return skip_string(c);
    if (ch != '{' && ch != '[') {
        size_t at = c->i;
        jc_int(c);
        if (c->i == at) c->i++; /* not a value (unchecked text): still make progress */
        return;
    }
    /* a container: to its matching bracket, counting depth (no recursion) */
    size_t depth = 0;
    while (c->i < c->n) {
        ch = c->p[c->i];
        if (ch == '"') {
            skip_string(c);
            continue;
        }
        c->i++;
        if (ch == '{' || ch == '[')
            depth++;
        else if ((ch == '}' || ch == ']') && --depth == 0)
            return;
    }
}

/* ---- the tree ------------------------------------------------------------------ */

typedef struct jbuild {
    jcur c;
    jval *nodes; /* the next free node, key slot and string byte of the block */
    char **keys;
    char *str;
} jbuild;

/* Members of the container at c->i (on its bracket). */
static int count_members(const jcur *c)
{
    jcur at = *c;
    jc_enter(&at);
    int n = 0;
    while (jc_more(&at)) {
        if (c->p[c->i] == '{') jc_key(&at, NULL, 0);
        jc_skip(&at);
        n++;
    }
    return n;
}

static void build_value(jbuild *b, jval *v)
{
    jcur *c = &b->c;
    memset(v, 0, sizeof *v);
    v->pos = jc_pos(c);
    v->kind = jc_kind(c);
    if (v->kind == J_INT) {
        v->i = jc_int(c);
        return;
    }
    if (v->kind == J_STR) {
        v->s = b->str;
        b->str += jc_str(c, v->s, SIZE_MAX) + 1;
        return;
    }
    v->n = count_members(c);
    if (!v->n) {
        jc_skip(c);
        return;
    }
    v->v = b->nodes;
    b->nodes += v->n;
    if (v->kind == J_OBJ) {
        v->keys = b->keys;
        b->keys += v->n;
    }
    jc_enter(c);
    for (int k = 0; jc_more(c); k++) {
        if (v->kind == J_OBJ) {
            v->keys[k] = b->str;
            b->str += jc_key(c, b->str, SIZE_MAX) + 1;
        }
        build_value(b, &v->v[k]);
    }
}

bool json_parse(const char *text, size_t len, jval *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->kind = J_INT;
    jparser j;
    if (!validate(&j, text, len, err, errlen)) return false;
    /* one block: the nodes (the root's members first), the key pointers,
     * the strings; the root's first pointer is the block */
    size_t nodes = j.values - 1, bytes = nodes * sizeof(jval) + j.members * sizeof(char *) + j.strbytes;
    char *block = bytes ? malloc(bytes) : NULL;
    if (bytes && !block) {
        snprintf(err, errlen, "out of memory (%zu bytes for the tree of %zu values)", bytes, j.values);
        return false;
    }
    jbuild b = {jc_start(text, len), NULL, NULL, NULL}; /* no block: a number or an empty container */
    if (block) {
        b.nodes = (jval *)block;
        b.keys = (char **)(block + nodes * sizeof(jval));
        b.str = block + nodes * sizeof(jval) + j.members * sizeof(char *);
    }
    build_value(&b, out);
    return true;
}

void json_free(jval *v)
{
    if (!v) return;
    if (v->kind == J_OBJ || v->kind == J_ARR)
        free(v->v);
    else if (v->kind == J_STR)
        free(v->s);
    memset(v, 0, sizeof *v);
    v->kind = J_INT;
}

const jval *json_get(const jval *o, const char *key)
{
    if (!o || o->kind != J_OBJ) return NULL;
    for (int k = 0; k < o->n; k++)
        if (!strcmp(o->keys[k], key)) return &o->v[k];
    return NULL;
}

/* ---- writing ------------------------------------------------------------------- */

void jb_put(jbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1) c *= 2;
        char *p = realloc(b->p, c);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

void jb_str(jbuf *b, const char *s)
{
    jb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*c;
            jb_put(b, esc, 2);
        } else if (*c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *c);
            jb_put(b, esc, 6);
        } else {
            jb_put(b, (const char *)c, 1);
        }
    }
    jb_put(b, "\"", 1);
}
