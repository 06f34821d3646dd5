/* text.c — text as tokens: the character vocabulary (sorted distinct bytes,
 * as nanoGPT's shakespeare_char) or raw bytes, encode/decode, the vocabulary
 * as a printable string, and the train/validation split of a token array. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "../tensor/fileio_impl.h"
#include "../tensor/kernel_impl.h"
#include "../tensor/tensor_impl.h"
#include "ember/data.h"

/* ---- vocabulary ---------------------------------------------------------------- */

/* The vocabulary holding exactly the bytes marked in `present`, in byte order. */
static em_vocab vocab_of(const bool present[256])
{
    em_vocab v;
    memset(&v, 0, sizeof v);
    for (int c = 0; c < 256; c++) {
        v.index[c] = -1;
        if (present[c]) {
            v.index[c] = (int16_t)v.size;
            v.chars[v.size++] = (uint8_t)c;
        }
    }
    return v;
}

em_vocab em_vocab_from_text(const char *text, size_t n)
{
    bool present[256] = {0};
    for (size_t i = 0; i < n; i++) present[(uint8_t)text[i]] = true;
    return vocab_of(present);
}

em_vocab em_vocab_bytes(void)
{
    bool present[256];
    for (int c = 0; c < 256; c++) present[c] = true;
    em_vocab v = vocab_of(present);
    v.bytes = true;
    return v;
}

/* A readable name for byte c: 'a', '\n', or 0xHH. */
static const char *char_name(uint8_t c, char buf[16])
{
    if (c == '\n') return "'\\n'";
    if (c == '\t') return "'\\t'";
    if (c == '\r') return "'\\r'";
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 16, "'%c'", c);
    else
        snprintf(buf, 16, "byte 0x%02x", c);
    return buf;
}

em_status em_vocab_encode(const em_vocab *v, const char *s, size_t n, int32_t *out)
{
    if (!v || (!s && n) || (!out && n))
        return em_err(EM_ERR_ARG, "em_vocab_encode: vocab, text or out is NULL");
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (v->index[c] < 0) {
            char buf[16];
            return em_err(EM_ERR_ARG,
                          "em_vocab_encode: character %s (0x%02x) at position %zu is not in the "
                          "vocabulary (%d characters)",
                          char_name(c, buf), c, i, v->size);
        }
        out[i] = v->index[c];
    }
    return EM_OK;
}

em_tensor *em_vocab_encode_tensor(const em_vocab *v, const char *s)
{
    if (!v || !s) return em_fail(EM_ERR_ARG, "em_vocab_encode_tensor: vocab or text is NULL");
    size_t n = strlen(s);
    size_t m = tmp_mark();
    int32_t *ids = tmp_alloc((n ? n : 1) * sizeof(int32_t));
    if (!ids || em_vocab_encode(v, s, n, ids) != EM_OK) {
        tmp_release(m);
        return NULL;
    }
    tensor *t = t_new(EM_I32, 1, (int64_t[]){(int64_t)n});
    if (t) memcpy(t_ptr(t), ids, n * sizeof(int32_t));
    tmp_release(m);
    return t_handle(t);
}

em_status em_vocab_decode(const em_vocab *v, const int32_t *tokens, size_t n, char *out)
{
    if (!v || (!tokens && n) || !out)
        return em_err(EM_ERR_ARG, "em_vocab_decode: vocab, tokens or out is NULL");
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= v->size)
            return em_err(EM_ERR_INDEX,
                          "em_vocab_decode: token %d at position %zu outside the vocabulary [0, %d)",
                          tokens[i], i, v->size);
        out[i] = (char)v->chars[tokens[i]];
    }
    out[n] = '\0';
    return EM_OK;
}

/* ---- vocabulary as a string ------------------------------------------------------ */

static const char CHARS_PREFIX[] = "chars:";

char *em_vocab_to_string(const em_vocab *v)
{
    if (!v) return em_fail(EM_ERR_ARG, "em_vocab_to_string: vocab is NULL");
    char *s = malloc(sizeof CHARS_PREFIX + 4 * (size_t)v->size + 1); /* \xHH is the longest escape */
    if (!s) return em_fail(EM_ERR_OOM, "em_vocab_to_string: out of memory");
    if (v->bytes) {
        strcpy(s, "bytes");
        return s;
    }
    char *p = s + (sizeof CHARS_PREFIX - 1);
    memcpy(s, CHARS_PREFIX, sizeof CHARS_PREFIX - 1);
    for (int k = 0; k < v->size; k++) {
        uint8_t c = v->chars[k];
        if (c == '\\')
            p += sprintf(p, "\\\\");
        else if (c == '\n')
            p += sprintf(p, "\\n");
        else if (c == '\t')
            p += sprintf(p, "\\t");
        else if (c == '\r')
            p += sprintf(p, "\\r");
        else if (c >= 0x20 && c < 0x7f && c != '"')
            *p++ = (char)c;
        else
            p += sprintf(p, "\\x%02x", c);
    }
    *p = '\0';
    return s;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

em_status em_vocab_from_string(const char *s, em_vocab *v)
{
    if (!s || !v) return em_err(EM_ERR_ARG, "em_vocab_from_string: string or vocab is NULL");
    if (strcmp(s, "bytes") == 0) {
        *v = em_vocab_bytes();
        return EM_OK;
    }
    if (strncmp(s, CHARS_PREFIX, sizeof CHARS_PREFIX - 1) != 0)
        return em_err(EM_ERR_ARG, "em_vocab_from_string: want \"bytes\" or \"chars:...\", got \"%.20s\"", s);
    bool present[256] = {0};
    int last = -1, count = 0;
    for (const char *p = s + sizeof CHARS_PREFIX - 1; *p;) {
        size_t at = (size_t)(p - s);
        int c;
        if (*p != '\\') {
            c = (uint8_t)*p++;
        } else if (p[1] == '\\' || p[1] == 'n' || p[1] == 't' || p[1] == 'r') {
            c = p[1] == '\\' ? '\\' : p[1] == 'n' ? '\n' : p[1] == 't' ? '\t' : '\r';
            p += 2;
        } else if (p[1] == 'x' && hexval(p[2]) >= 0 && hexval(p[3]) >= 0) {
            c = hexval(p[2]) * 16 + hexval(p[3]);
            p += 4;
        } else {
            return em_err(EM_ERR_ARG, "em_vocab_from_string: bad escape at offset %zu", at);
        }
        if (c <= last)
            return em_err(EM_ERR_ARG,
                          "em_vocab_from_string: byte 0x%02x at offset %zu is not after 0x%02x "
                          "(characters must be distinct and sorted)",
                          c, at, last);
        present[c] = true;
        last = c;
        count++;
    }
    if (count == 0) return em_err(EM_ERR_ARG, "em_vocab_from_string: empty character vocabulary");
    *v = vocab_of(present);
    return EM_OK;
}

/* ---- text ---------------------------------------------------------------------------- */

em_text *em_text_from_memory(const char *data, size_t n, em_text_mode mode)
{
    if (!data && n) return em_fail(EM_ERR_ARG, "em_text_from_memory: data is NULL");
    if (mode != EM_TEXT_CHARS && mode != EM_TEXT_BYTES)
        return em_fail(EM_ERR_ARG, "em_text_from_memory: unknown mode %d", (int)mode);
    if (n == 0) return em_fail(EM_ERR_ARG, "em_text_from_memory: text is empty");
    em_text *t = malloc(sizeof *t);
    int32_t *tok = malloc(n * sizeof(int32_t));
    if (!t || !tok) {
        free(t);
        free(tok);
        return em_fail(EM_ERR_OOM, "em_text_from_memory: out of memory for %zu tokens", n);
    }
    t->vocab = mode == EM_TEXT_BYTES ? em_vocab_bytes() : em_vocab_from_text(data, n);
    em_vocab_encode(&t->vocab, data, n, tok); /* cannot fail: every byte is in the vocabulary */
    t->tokens = (em_tokens){tok, (int64_t)n, EM_TOK_I32, tok};
    return t;
}

em_text *em_text_open(const char *path, em_text_mode mode)
{
    if (!path) return em_fail(EM_ERR_ARG, "em_text_open: path is NULL");
    char *buf = NULL;
    size_t size = 0;
    if (file_read_all(path, (size_t)1 << 40, &buf, &size, "em_text_open")) return NULL;
    if (size == 0) {
        free(buf);
        return em_fail(EM_ERR_ARG, "em_text_open: %s is empty", path);
    }
    em_text *t = em_text_from_memory(buf, size, mode);
    free(buf);
    return t;
}

void em_text_free(em_text *text)
{
    if (!text) return;
    em_tokens_free(&text->tokens);
    free(text);
}

em_status em_tokens_split(const em_tokens *tokens, double train_frac, em_tokens *train, em_tokens *val)
{
    if (train) *train = (em_tokens){0};
    if (val) *val = (em_tokens){0};
    if (!tokens || !train || !val)
        return em_err(EM_ERR_ARG, "em_tokens_split: tokens, train and val must be set");
    if (!(train_frac > 0 && train_frac < 1))
        return em_err(EM_ERR_ARG, "em_tokens_split: train_frac must be in (0, 1), got %g", train_frac);
    int64_t n_train = (int64_t)(train_frac * (double)tokens->n); /* int(0.9 * n), as nanoGPT */
    if (n_train < 1 || n_train >= tokens->n)
        return em_err(EM_ERR_ARG,
                      "em_tokens_split: %lld tokens at train_frac %g leave %lld for train and %lld "
                      "for validation; both must be non-empty",
                      (long long)tokens->n, train_frac, (long long)n_train, (long long)(tokens->n - n_train));
    *train = em_tokens_slice(tokens, 0, n_train);
    *val = em_tokens_slice(tokens, n_train, tokens->n - n_train);
    return EM_OK;
}
