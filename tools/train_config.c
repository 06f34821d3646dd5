/* train_config.c — reads and writes DIR/config (see train_config.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/fileio_impl.h"
#include "tensor/settings_impl.h"
#include "train_config.h"

/* The last line ember writes: the crc32 of every byte before it. */
#define CRC_LINE "# ember.crc32: "
enum { CRC_LINE_LEN = sizeof CRC_LINE - 1 + 8 + 1 };

/* A file whose last line is CRC_LINE + 8 hex digits must match them (a
 * config written by hand has no such line and is not checked). */
static em_status check_crc(const char *path, const char *text, size_t n)
{
    if (n < CRC_LINE_LEN || text[n - 1] != '\n') return EM_OK;
    const char *line = text + n - CRC_LINE_LEN;
    if ((line > text && line[-1] != '\n') || strncmp(line, CRC_LINE, sizeof CRC_LINE - 1)) return EM_OK;
    const char *hex = line + sizeof CRC_LINE - 1;
    char want[9];
    memcpy(want, hex, 8);
    want[8] = 0;
    char got[9];
    snprintf(got, sizeof got, "%08x", file_crc32(0, text, (size_t)(line - text)));
    if (strcmp(got, want))
        return em_set_error(
            EM_ERR_IO,
            "config: %s: the checksum does not match: its last line says crc32 %s but the lines "
            "above it give %s (the file is damaged)",
            path, want, got);
    return EM_OK;
}

em_status run_config_write(const char *path, const em_gpt_config *m, const em_vocab *vocab)
{
    char *vs = em_vocab_to_string(vocab);
    if (!vs) return em_last_status();
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len); /* built in memory, written in one crash-safe step */
    if (!f) {
        free(vs);
        return em_set_error(EM_ERR_OOM, "config: out of memory");
    }
    fprintf(f, "# ember GPT config, written by `ember train`\n");
    fprintf(f, "vocab_size: %lld\nblock_size: %lld\nn_layer: %lld\nn_head: %lld\nn_embd: %lld\n",
            (long long)m->vocab_size, (long long)m->block_size, (long long)m->n_layer, (long long)m->n_head,
            (long long)m->n_embd);
    fprintf(f, "dropout: %.17g\nbias: %s\ngelu: %s\nvocab: \"", m->dropout, m->bias ? "true" : "false",
            m->gelu_tanh ? "tanh" : "exact");
    for (const char *p = vs; *p; p++) { /* inside YAML double quotes a backslash is written twice */
        if (*p == '\\')
            fputs("\\\\", f);
        else
            fputc(*p, f);
    }
    fprintf(f, "\"\n");
    free(vs);
    bool ok = fflush(f) == 0;
    if (ok) fprintf(f, CRC_LINE "%08x\n", file_crc32(0, text, len)); /* of everything above it */
    ok = fclose(f) == 0 && ok;
    em_status s = ok ? file_write_atomic(path, text, len, "config") : em_set_error(EM_ERR_OOM, "config: out of memory");
    free(text);
    return s;
}

static em_status bad(const char *path, int line, const char *what, const char *key)
{
    return em_set_error(EM_ERR_IO, "config: %s line %d: %s '%s'", path, line, what, key);
}

em_status run_config_read(const char *path, em_gpt_config *m, em_vocab *vocab)
{
    char *text; /* a FIFO is refused, not waited on */
    size_t n;
    if (file_read_all(path, (size_t)1 << 24, &text, &n, "config")) return em_last_status();
    if (check_crc(path, text, n)) {
        free(text);
        return em_last_status();
    }
    FILE *f = fmemopen(text, n ? n : 1, "r");
    if (!f) {
        free(text);
        return em_set_error(EM_ERR_OOM, "config: out of memory reading %s", path);
    }
    *m = (em_gpt_config){0};
    char line[2048];
    int ln = 0, seen = 0;
    em_status s = EM_OK;
    while (!s && fgets(line, sizeof line, f)) {
        ln++;
        line[strcspn(line, "\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        char *colon = strstr(line, ": ");
        if (!colon) {
            s = bad(path, ln, "expected `key: value`, got", line);
            break;
        }
        *colon = 0;
        const char *key = line, *val = colon + 2;
        char *end;
        long iv = strtol(val, &end, 10);
        bool is_int = end != val && !*end && iv > 0 && iv < (1L << 30);
        int64_t *ifield = !strcmp(key, "vocab_size")   ? &m->vocab_size
                          : !strcmp(key, "block_size") ? &m->block_size
                          : !strcmp(key, "n_layer")    ? &m->n_layer
                          : !strcmp(key, "n_head")     ? &m->n_head
                          : !strcmp(key, "n_embd")     ? &m->n_embd
                                                       : NULL;
        if (ifield) {
            if (!is_int)
                s = bad(path, ln, "needs a positive integer:", key);
            else
                *ifield = (int)iv, seen++;
        } else if (!strcmp(key, "dropout")) {
            m->dropout = strtod(val, &end);
            if (*end || !(m->dropout >= 0 && m->dropout < 1))
                s = bad(path, ln, "needs a number in [0,1):", key);
            else
                seen++;
        } else if (!strcmp(key, "bias")) {
            if (!setting_bool_parse(val, &m->bias))
                s = em_set_error(EM_ERR_IO, "config: %s line %d: bias '%.64s' is not " SETTING_BOOL_WANT,
                                 path, ln, val);
            else
                seen++;
        } else if (!strcmp(key, "gelu")) {
            if (strcmp(val, "exact") && strcmp(val, "tanh"))
                s = bad(path, ln, "needs exact or tanh:", key);
            else
                m->gelu_tanh = !strcmp(val, "tanh"), seen++;
        } else if (!strcmp(key, "vocab")) {
            size_t n = strlen(val);
            if (n < 2 || val[0] != '"' || val[n - 1] != '"') {
                s = bad(path, ln, "needs a double-quoted string:", key);
                break;
            }
            char *txt = malloc(n), *o = txt;
            for (const char *p = val + 1; p < val + n - 1; p++) {
                if (*p == '\\' && p[1] == '\\') p++; /* YAML "\\" is one backslash */
                *o++ = *p;
            }
            *o = 0;
            s = em_vocab_from_string(txt, vocab);
            free(txt);
            if (s)
                s = bad(path, ln, em_last_error(), key);
            else
                seen++;
        } else {
            s = bad(path, ln, "unknown key", key);
        }
    }
    fclose(f);
    free(text);
    if (!s && seen != 9)
        s = em_set_error(EM_ERR_IO, "config: %s is missing keys (found %d of 9)", path, seen);
    if (!s && vocab->size != m->vocab_size)
        s = em_set_error(EM_ERR_IO, "config: %s: vocab_size %lld but the vocabulary has %d entries", path,
                         (long long)m->vocab_size, vocab->size);
    return s;
}
