/* json_impl.h — a small, strict JSON reader and writer helpers, for the
 * safetensors header and ember's own small JSON files (nn/, dist/).
 *
 * It reads the subset a safetensors header uses: objects, arrays, strings
 * (every escape, \uXXXX with surrogate pairs, raw UTF-8 validated) and
 * integers (no fraction or exponent, within int64). true/false/null and
 * non-integer numbers are rejected, as are duplicate keys, control
 * characters in strings, \u0000, nesting deeper than 16, anything after
 * the top-level value except whitespace, and texts over 2 GiB. Every error
 * says what is wrong and at which byte of the input.
 *
 * Memory is bounded by the text, whatever the text holds:
 *   json_check   validates without building anything; it keeps 4 bytes per
 *                key of the objects it is inside (to find duplicates), less
 *                than the text itself.
 *   jcur         walks text json_check accepted, one value at a time, with
 *                no allocation (the safetensors reader builds only its own
 *                result this way).
 *   json_parse   builds a tree in one allocation sized by a validating pass:
 *                32 bytes a value, 8 a key and the decoded strings: at most
 *                16 bytes per byte of text (an array of 0s), for small files.
 */
#ifndef EMBER_NN_JSON_IMPL_H
#define EMBER_NN_JSON_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum jkind { J_OBJ, J_ARR, J_STR, J_INT } jkind;

/* One value of a tree from json_parse. Everything below a root lives in one
 * block that json_free releases. */
typedef struct jval {
    jkind kind;
    int n;      /* J_OBJ / J_ARR: number of members */
    size_t pos; /* byte offset of the value in the input */
    union {
        int64_t i; /* J_INT */
        char *s;   /* J_STR: UTF-8, NUL-terminated, no embedded NUL */
        struct {
            char **keys;    /* J_OBJ: n keys (NULL for J_ARR) */
            struct jval *v; /* J_OBJ / J_ARR: n values */
        };
    };
} jval;

/* Checks that text[0..len) is one JSON value of the subset above. On
 * failure returns false with a message ("expected ':' at byte 57") in err. */
bool json_check(const char *text, size_t len, char *err, size_t errlen);
/* Parses text[0..len) into *out. On failure returns false, writes a message
 * into err (as json_check) and leaves *out empty. */
bool json_parse(const char *text, size_t len, jval *out, char *err, size_t errlen);
/* Frees the tree json_parse built under the root v (not v itself). */
void json_free(jval *v);
/* The member of object o named key, or NULL. */
const jval *json_get(const jval *o, const char *key);
/* True when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code
 * points above U+10FFFF). */
bool json_utf8_ok(const unsigned char *s, size_t n);

/* A cursor over text that json_check accepted: read a value where it stands,
 * or step into a container and over its members. Nothing is allocated. On
 * text json_check refused the calls stay within the text but their results
 * mean nothing.
 *
 *   jcur c = jc_start(text, len);
 *   if (jc_kind(&c) == J_OBJ) {
 *       jc_enter(&c);
 *       while (jc_more(&c)) {
 *           char key[32];
 *           jc_key(&c, key, sizeof key);  // then the member's value:
 *           jc_skip(&c);                  // read (jc_int, jc_str, ...) or skip it
 *       }
 *   }
 */
typedef struct jcur {
    const unsigned char *p;
    size_t n, i;
    char *err; /* where a validating pass writes its message; NULL for a cursor */
    size_t errlen;
} jcur;
jcur jc_start(const char *text, size_t len);
/* The kind and the byte offset of the value at the cursor. */
jkind jc_kind(jcur *c);
size_t jc_pos(jcur *c);
/* Steps into the object or array at the cursor. */
void jc_enter(jcur *c);
/* True when another member follows (the cursor is then on its key, or on
 * its value in an array); false past the closing bracket. */
bool jc_more(jcur *c);
/* The string at the cursor (a value, or a key with its ':' for jc_key)
 * decoded into out[0..cap), truncated and NUL-terminated; returns the whole
 * decoded length. out may be NULL (cap 0) to skip it. */
size_t jc_str(jcur *c, char *out, size_t cap);
size_t jc_key(jcur *c, char *out, size_t cap);
/* The decoded length of the string at the cursor, which stays where it is. */
size_t jc_strlen(jcur *c);
/* The integer at the cursor. */
int64_t jc_int(jcur *c);
/* Steps over the value at the cursor. */
void jc_skip(jcur *c);

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
