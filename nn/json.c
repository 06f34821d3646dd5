/* json.c — the strict JSON reader behind the safetensors header, and the
 * escaping writer used to produce one. See json_impl.h for what is taken
 * and what is rejected. Recursive descent over a byte range; every value
 * records where it started so callers can say where a bad entry is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_impl.h"

#define JSON_MAX_DEPTH 16

typedef struct jparser {
    const unsigned char *p;
    size_t n, i;
    int depth;
    char *err;
    size_t errlen;
} jparser;

static bool jp_fail(jparser *j, const char *what)
{
    if (j->i >= j->n) snprintf(j->err, j->errlen, "%s at byte %zu (end of input)", what, j->i);
    else if (j->p[j->i] >= 0x20 && j->p[j->i] < 0x7f)
        snprintf(j->err, j->errlen, "%s at byte %zu ('%c')", what, j->i, j->p[j->i]);
    else snprintf(j->err, j->errlen, "%s at byte %zu (byte 0x%02x)", what, j->i, j->p[j->i]);
    return false;
}

static void skip_ws(jparser *j)
{
    while (j->i < j->n && (j->p[j->i] == ' ' || j->p[j->i] == '\t' || j->p[j->i] == '\n' || j->p[j->i] == '\r'))
        j->i++;
}

/* Length of the UTF-8 sequence at s (at most n bytes), 0 if malformed. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
    else return 0;
    if (len > n) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
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

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Four hex digits at j->i into *cp. */
static bool hex4(jparser *j, unsigned *cp)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++, j->i++) {
        if (j->i >= j->n) return jp_fail(j, "truncated \\u escape");
        unsigned c = j->p[j->i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return jp_fail(j, "bad hex digit in \\u escape");
        v = v << 4 | d;
    }
    *cp = v;
    return true;
}

/* A string literal at j->i (on the opening quote) into a new C string. The
 * decoded form is never longer than the literal, so one allocation does. */
static bool parse_string(jparser *j, char **out)
{
    size_t start = ++j->i, end = start;
    while (end < j->n && j->p[end] != '"') end += j->p[end] == '\\' ? 2 : 1;
    char *o = malloc((end > j->n ? j->n : end) - start + 1);
    if (!o) return jp_fail(j, "out of memory");
    size_t k = 0;
    for (;;) {
        if (j->i >= j->n) {
            free(o);
            return jp_fail(j, "unterminated string");
        }
        unsigned c = j->p[j->i];
        if (c == '"') break;
        if (c < 0x20) {
            free(o);
            return jp_fail(j, "control character in string");
        }
        if (c != '\\') {
            size_t len = utf8_len(j->p + j->i, j->n - j->i);
            if (!len) {
                free(o);
                return jp_fail(j, "invalid UTF-8 in string");
            }
            memcpy(o + k, j->p + j->i, len);
            k += len;
            j->i += len;
            continue;
        }
        j->i++;
        if (j->i >= j->n) {
            free(o);
            return jp_fail(j, "unterminated string");
        }
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
            size_t at = j->i - 1;
            j->i++;
            if (!hex4(j, &cp)) {
                free(o);
                return false;
            }
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                j->i = at;
                free(o);
                return jp_fail(j, "unpaired low surrogate in \\u escape");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                unsigned lo = 0;
                if (j->i + 1 >= j->n || j->p[j->i] != '\\' || j->p[j->i + 1] != 'u') {
                    j->i = at;
                    free(o);
                    return jp_fail(j, "high surrogate without its low half");
                }
                j->i += 2;
                if (!hex4(j, &lo)) {
                    free(o);
                    return false;
                }
                if (lo < 0xdc00 || lo > 0xdfff) {
                    j->i = at;
                    free(o);
                    return jp_fail(j, "high surrogate without its low half");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (cp == 0) {
                j->i = at;
                free(o);
                return jp_fail(j, "\\u0000 is not allowed in a string");
            }
            k += put_utf8(o + k, cp);
            continue; /* j->i is already past the escape */
        }
        default: free(o); return jp_fail(j, "bad escape in string");
        }
        o[k++] = (char)cp;
        j->i++;
    }
    j->i++; /* closing quote */
    o[k] = '\0';
    *out = o;
    return true;
}

static bool parse_int(jparser *j, int64_t *out)
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

static bool parse_value(jparser *j, jval *v);

/* Appends a member to an object or array (keys NULL for arrays). */
static bool add_member(jparser *j, jval *v, int *cap, char *key)
{
    if (v->n == *cap) {
        int c = *cap ? 2 * *cap : 4;
        jval *nv = realloc(v->v, sizeof *nv * (size_t)c);
        if (!nv) return jp_fail(j, "out of memory");
        v->v = nv;
        if (v->kind == J_OBJ) {
            char **nk = realloc(v->keys, sizeof *nk * (size_t)c);
            if (!nk) return jp_fail(j, "out of memory");
            v->keys = nk;
        }
        *cap = c;
    }
    memset(&v->v[v->n], 0, sizeof v->v[0]);
    if (v->kind == J_OBJ) v->keys[v->n] = key;
    v->n++;
    return true;
}

static _Thread_local const jval *sort_base;
static int cmp_key(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    int c = strcmp(sort_base->keys[x], sort_base->keys[y]);
    return c ? c : (x > y) - (x < y);
}

/* Duplicate keys are found by sorting (a header may hold many thousands);
 * the error points at the value of the later duplicate. */
static bool unique_keys(jparser *j, const jval *v)
{
    if (v->n < 2) return true;
    int *ix = malloc(sizeof *ix * (size_t)v->n);
    if (!ix) return jp_fail(j, "out of memory");
    for (int k = 0; k < v->n; k++) ix[k] = k;
    sort_base = v;
    qsort(ix, (size_t)v->n, sizeof *ix, cmp_key);
    for (int k = 1; k < v->n; k++)
        if (!strcmp(v->keys[ix[k - 1]], v->keys[ix[k]])) {
            const char *key = v->keys[ix[k]];
            j->i = v->v[ix[k]].pos;
            free(ix);
            snprintf(j->err, j->errlen, "duplicate key '%.80s' (second value at byte %zu)", key, j->i);
            return false;
        }
    free(ix);
    return true;
}

static bool parse_container(jparser *j, jval *v)
{
    bool obj = j->p[j->i] == '{';
    char close = obj ? '}' : ']';
    v->kind = obj ? J_OBJ : J_ARR;
    if (++j->depth > JSON_MAX_DEPTH) return jp_fail(j, "nesting deeper than 16 levels");
    j->i++;
    skip_ws(j);
    int cap = 0;
    if (j->i < j->n && j->p[j->i] == close) {
        j->i++;
        j->depth--;
        return true;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(j);
        if (obj) {
            if (j->i >= j->n || j->p[j->i] != '"') return jp_fail(j, "expected a string key");
            if (!parse_string(j, &key)) return false;
            skip_ws(j);
            if (j->i >= j->n || j->p[j->i] != ':') {
                free(key);
                return jp_fail(j, "expected ':'");
            }
            j->i++;
        }
        if (!add_member(j, v, &cap, key)) {
            free(key);
            return false;
        }
        if (!parse_value(j, &v->v[v->n - 1])) return false;
        skip_ws(j);
        if (j->i < j->n && j->p[j->i] == ',') {
            j->i++;
            continue;
        }
        if (j->i < j->n && j->p[j->i] == close) break;
        return jp_fail(j, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    j->i++;
    j->depth--;
    return obj ? unique_keys(j, v) : true;
}

static bool parse_value(jparser *j, jval *v)
{
    skip_ws(j);
    v->pos = j->i;
    if (j->i >= j->n) return jp_fail(j, "expected a value");
    unsigned c = j->p[j->i];
    if (c == '{' || c == '[') return parse_container(j, v);
    if (c == '"') {
        v->kind = J_STR;
        return parse_string(j, &v->s);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        v->kind = J_INT;
        return parse_int(j, &v->i);
    }
    return jp_fail(j, "expected a value");
}

bool json_parse(const char *text, size_t len, jval *out, char *err, size_t errlen)
{
    jparser j = {(const unsigned char *)text, len, 0, 0, err, errlen};
    memset(out, 0, sizeof *out);
    out->kind = J_INT;
    if (!parse_value(&j, out)) {
        json_free(out);
        return false;
    }
    skip_ws(&j);
    if (j.i != j.n) {
        json_free(out);
        return jp_fail(&j, "unexpected characters after the JSON value");
    }
    return true;
}

void json_free(jval *v)
{
    if (!v) return;
    if (v->kind == J_OBJ || v->kind == J_ARR) {
        for (int k = 0; k < v->n; k++) {
            json_free(&v->v[k]);
            if (v->keys) free(v->keys[k]);
        }
        free(v->v);
        free(v->keys);
    }
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
