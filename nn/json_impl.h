/* json_impl.h — a small, strict JSON reader and writer helpers, for the
 * safetensors header (nn/ only).
 *
 * It reads the subset a safetensors header uses: objects, arrays, strings
 * (every escape, \uXXXX with surrogate pairs, raw UTF-8 validated) and
 * integers (no fraction or exponent, within int64). true/false/null and
 * non-integer numbers are rejected, as are duplicate keys, control
 * characters in strings, \u0000, nesting deeper than 16 and anything after
 * the top-level value except whitespace. Every error says what is wrong and
 * at which byte of the input.
 */
#ifndef EMBER_NN_JSON_IMPL_H
#define EMBER_NN_JSON_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum jkind { J_OBJ, J_ARR, J_STR, J_INT } jkind;

typedef struct jval {
    jkind kind;
    size_t pos;       /* byte offset of the value in the input */
    int64_t i;        /* J_INT */
    char *s;          /* J_STR: UTF-8, NUL-terminated, no embedded NUL */
    int n;            /* J_OBJ / J_ARR: number of members */
    char **keys;      /* J_OBJ: n keys */
    struct jval *v;   /* J_OBJ / J_ARR: n values */
} jval;

/* Parses text[0..len) into *out. On failure returns false, writes a message
 * ("expected ':' at byte 57") into err and leaves *out empty. */
bool json_parse(const char *text, size_t len, jval *out, char *err, size_t errlen);
/* Frees what json_parse allocated inside v (not v itself). */
void json_free(jval *v);
/* The member of object o named key, or NULL. */
const jval *json_get(const jval *o, const char *key);
/* True when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code
 * points above U+10FFFF). */
bool json_utf8_ok(const unsigned char *s, size_t n);

/* A growable byte buffer for writing JSON. */
typedef struct jbuf {
    char *p;
    size_t len, cap;
    bool oom;
} jbuf;
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
/* Appends s as a JSON string literal with its quotes (escaping '"', '\\'
 * and control characters). */
void jb_str(jbuf *b, const char *s);

#endif
