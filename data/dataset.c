/* dataset.c — the dataset interface (a table of functions over a user
 * pointer), token arrays and token files (flat little-endian uint16), and the
 * sequence dataset that cuts a token array into (x, y = x shifted) blocks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "../tensor/tensor_impl.h"
#include "data_impl.h"
#include "ember/data.h"

/* ---- the dataset interface ---------------------------------------------------- */

static bool field_ok(const em_field *f)
{
    if ((unsigned)f->dtype >= EM_NUM_DTYPES || f->ndim < 0 || f->ndim >= EM_MAX_DIMS) return false;
    for (int d = 0; d < f->ndim; d++)
        if (f->shape[d] < 0) return false;
    return true;
}

size_t em_field_bytes(const em_field *f)
{
    if (!f || !field_ok(f)) return 0;
    return (size_t)shape_numel(f->ndim, f->shape) * em_dtype_size(f->dtype);
}

em_dataset *em_dataset_new(const em_dataset *def)
{
    if (!def) return em_fail(EM_ERR_ARG, "em_dataset_new: definition is NULL");
    if (!def->len || !def->get)
        return em_fail(EM_ERR_ARG, "em_dataset_new: len and get must be set (len %s, get %s)",
                       def->len ? "set" : "NULL", def->get ? "set" : "NULL");
    if (!field_ok(&def->x_field))
        return em_fail(EM_ERR_ARG, "em_dataset_new: bad x field: dtype %d, ndim %d (need 0..%d, dims >= 0)",
                       (int)def->x_field.dtype, def->x_field.ndim, EM_MAX_DIMS - 1);
    if (!field_ok(&def->y_field))
        return em_fail(EM_ERR_ARG, "em_dataset_new: bad y field: dtype %d, ndim %d (need 0..%d, dims >= 0)",
                       (int)def->y_field.dtype, def->y_field.ndim, EM_MAX_DIMS - 1);
    em_dataset *ds = malloc(sizeof *ds);
    if (!ds) return em_fail(EM_ERR_OOM, "em_dataset_new: out of memory");
    *ds = *def;
    return ds;
}

void em_dataset_free(em_dataset *ds)
{
    if (!ds) return;
    if (ds->free) ds->free(ds->user);
    free(ds);
}

int64_t em_dataset_len(const em_dataset *ds)
{
    if (!ds || !ds->len) {
        em_err(EM_ERR_ARG, "em_dataset_len: dataset is NULL or has no len");
        return -1;
    }
    return ds->len(ds->user);
}

em_status dataset_lengths(const em_dataset *ds, int64_t i, int64_t *x_len, int64_t *y_len, const char *fn)
{
    int64_t xmax = ds->x_field.ndim ? ds->x_field.shape[0] : 0;
    int64_t ymax = ds->y_field.ndim ? ds->y_field.shape[0] : 0;
    *x_len = xmax;
    *y_len = ymax;
    if (!ds->lengths) return EM_OK;
    em_status s = ds->lengths(ds->user, i, x_len, y_len);
    if (s != EM_OK) {
        if (em_last_status() == EM_OK) em_err(s, "%s: dataset lengths(%lld) failed", fn, (long long)i);
        return s;
    }
    if (*x_len < 0 || *x_len > xmax || *y_len < 0 || *y_len > ymax)
        return em_err(EM_ERR_ARG,
                      "%s: example %lld has lengths x %lld, y %lld; its fields allow x in [0, %lld], y in "
                      "[0, %lld] (a field's shape[0] is the largest length)",
                      fn, (long long)i, (long long)*x_len, (long long)*y_len, (long long)xmax,
                      (long long)ymax);
    return EM_OK;
}

/* f with dim 0 set to len (a field with lengths; a 0-dim field stays so). */
static void field_at_len(const em_field *f, int64_t len, int *ndim, int64_t *shape)
{
    *ndim = f->ndim;
    for (int d = 0; d < f->ndim; d++) shape[d] = f->shape[d];
    if (f->ndim) shape[0] = len;
}

em_status em_dataset_get(const em_dataset *ds, int64_t i, em_tensor **x, em_tensor **y)
{
    if (x) *x = NULL;
    if (y) *y = NULL;
    if (!ds || !ds->get || !ds->len || !x || !y)
        return em_err(EM_ERR_ARG, "em_dataset_get: dataset, get, x and y must not be NULL");
    int64_t n = ds->len(ds->user);
    if (i < 0 || i >= n)
        return em_err(EM_ERR_INDEX, "em_dataset_get: index %lld out of range [0, %lld)", (long long)i,
                      (long long)n);
    em_clear_error();
    int64_t xl, yl;
    em_status s = dataset_lengths(ds, i, &xl, &yl, "em_dataset_get");
    if (s != EM_OK) return s;
    /* get writes full-size buffers; with lengths it writes a heap buffer of
     * the largest example and the tensors take the first rows */
    size_t xb = em_field_bytes(&ds->x_field), yb = em_field_bytes(&ds->y_field);
    uint8_t *buf = NULL;
    if (ds->lengths && !(buf = malloc(xb + yb + 1)))
        return em_err(EM_ERR_OOM, "em_dataset_get: out of memory for example %lld", (long long)i);
    int xn, yn;
    int64_t xs[EM_MAX_DIMS], ys[EM_MAX_DIMS];
    field_at_len(&ds->x_field, xl, &xn, xs);
    field_at_len(&ds->y_field, yl, &yn, ys);
    tensor *tx = t_new(ds->x_field.dtype, xn, xs);
    tensor *ty = tx ? t_new(ds->y_field.dtype, yn, ys) : NULL;
    if (!tx || !ty) {
        t_drop(tx);
        free(buf);
        return em_last_status();
    }
    s = ds->get(ds->user, i, buf ? buf : t_ptr(tx), buf ? buf + xb : t_ptr(ty));
    if (s != EM_OK) {
        if (em_last_status() == EM_OK) em_err(s, "em_dataset_get: get(%lld) failed", (long long)i);
        t_drop(tx);
        t_drop(ty);
        free(buf);
        return s;
    }
    if (buf) {
        memcpy(t_ptr(tx), buf, (size_t)t_numel(tx) * em_dtype_size(ds->x_field.dtype));
        memcpy(t_ptr(ty), buf + xb, (size_t)t_numel(ty) * em_dtype_size(ds->y_field.dtype));
        free(buf);
    }
    *x = t_handle(tx);
    *y = t_handle(ty);
    return EM_OK;
}

/* ---- token arrays --------------------------------------------------------------- */

em_tokens em_tokens_view(const void *data, int64_t n, em_token_type type)
{
    return (em_tokens){data, n, type, NULL};
}

int64_t em_tokens_at(const em_tokens *t, int64_t i)
{
    return t->type == EM_TOK_U16 ? (int64_t)((const uint16_t *)t->data)[i]
                                 : (int64_t)((const int32_t *)t->data)[i];
}

/* Copies tokens [start, start+n) of t into out as i32. */
static void tokens_to_i32(const em_tokens *t, int64_t start, int64_t n, int32_t *out)
{
    if (t->type == EM_TOK_U16) {
        const uint16_t *p = (const uint16_t *)t->data + start;
        for (int64_t i = 0; i < n; i++) out[i] = p[i];
    } else {
        memcpy(out, (const int32_t *)t->data + start, (size_t)n * sizeof(int32_t));
    }
}

em_status em_tokens_load(const char *path, em_tokens *out)
{
    if (!out) return em_err(EM_ERR_ARG, "em_tokens_load: out is NULL");
    *out = (em_tokens){0};
    if (!path) return em_err(EM_ERR_ARG, "em_tokens_load: path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return em_err(EM_ERR_IO, "em_tokens_load: cannot open %s: %s", path, strerror(errno));
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return em_err(EM_ERR_IO, "em_tokens_load: cannot find the size of %s", path);
    }
    if (size % 2) {
        fclose(f);
        return em_err(EM_ERR_ARG,
                      "em_tokens_load: %s has odd size %ld bytes; a token file holds 2-byte tokens", path,
                      size);
    }
    uint8_t *buf = malloc(size ? (size_t)size : 1);
    if (!buf) {
        fclose(f);
        return em_err(EM_ERR_OOM, "em_tokens_load: out of memory for %ld bytes of %s", size, path);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(buf);
        return em_err(EM_ERR_IO, "em_tokens_load: read %zu of %ld bytes of %s", got, size, path);
    }
    /* little-endian on disk, host order in memory (in place: token i reads bytes 2i, 2i+1) */
    uint16_t *tok = (uint16_t *)buf;
    int64_t n = size / 2;
    for (int64_t i = 0; i < n; i++) tok[i] = (uint16_t)(buf[2 * i] | (buf[2 * i + 1] << 8));
    *out = (em_tokens){tok, n, EM_TOK_U16, tok};
    return EM_OK;
}

em_status em_tokens_save(const char *path, const em_tokens *t)
{
    if (!path || !t || (!t->data && t->n > 0))
        return em_err(EM_ERR_ARG, "em_tokens_save: path and tokens must not be NULL");
    for (int64_t i = 0; i < t->n; i++) {
        int64_t v = em_tokens_at(t, i);
        if (v < 0 || v > 65535)
            return em_err(EM_ERR_ARG, "em_tokens_save: token %lld is %lld, outside the uint16 range 0..65535",
                          (long long)i, (long long)v);
    }
    FILE *f = fopen(path, "wb");
    if (!f) return em_err(EM_ERR_IO, "em_tokens_save: cannot create %s: %s", path, strerror(errno));
    uint8_t chunk[4096];
    bool ok = true;
    for (int64_t i = 0; i < t->n && ok;) {
        size_t k = 0;
        for (; k < sizeof chunk / 2 && i < t->n; k++, i++) {
            uint16_t v = (uint16_t)em_tokens_at(t, i);
            chunk[2 * k] = (uint8_t)(v & 0xff);
            chunk[2 * k + 1] = (uint8_t)(v >> 8);
        }
        ok = fwrite(chunk, 2, k, f) == k;
    }
    if (fclose(f) != 0) ok = false;
    if (!ok) return em_err(EM_ERR_IO, "em_tokens_save: write to %s failed", path);
    return EM_OK;
}

void em_tokens_free(em_tokens *t)
{
    if (!t) return;
    free(t->owned);
    *t = (em_tokens){0};
}

em_tokens em_tokens_slice(const em_tokens *t, int64_t start, int64_t n)
{
    if (!t || start < 0 || n < 0 || start > t->n || n > t->n - start) {
        em_err(t ? EM_ERR_INDEX : EM_ERR_ARG, "em_tokens_slice: range [%lld, %lld) outside %lld tokens",
               (long long)start, (long long)(start + n), (long long)(t ? t->n : 0));
        return (em_tokens){0};
    }
    size_t es = t->type == EM_TOK_U16 ? 2 : 4;
    return (em_tokens){(const char *)t->data + (size_t)start * es, n, t->type, NULL};
}

em_tensor *em_tokens_tensor(const em_tokens *t, int64_t start, int64_t n)
{
    if (!t) return em_fail(EM_ERR_ARG, "em_tokens_tensor: tokens is NULL");
    if (start < 0 || n < 0 || start > t->n || n > t->n - start)
        return em_fail(EM_ERR_INDEX, "em_tokens_tensor: range [%lld, %lld) outside %lld tokens",
                       (long long)start, (long long)(start + n), (long long)t->n);
    tensor *out = t_new(EM_I32, 1, (int64_t[]){n});
    if (!out) return NULL;
    tokens_to_i32(t, start, n, t_ptr(out));
    return t_handle(out);
}

/* ---- the sequence dataset --------------------------------------------------------- */

typedef struct seq_data {
    em_tokens tokens;
    int64_t T;
} seq_data;

static int64_t seq_len(void *user)
{
    seq_data *s = user;
    return (s->tokens.n - 1) / s->T;
}

/* example i: x = tokens[iT .. iT+T), y = tokens[iT+1 .. iT+T+1) */
static em_status seq_get(void *user, int64_t i, void *x, void *y)
{
    seq_data *s = user;
    tokens_to_i32(&s->tokens, i * s->T, s->T, x);
    tokens_to_i32(&s->tokens, i * s->T + 1, s->T, y);
    return EM_OK;
}

static void seq_free(void *user) { free(user); }

em_dataset *em_sequence_dataset(const em_tokens *tokens, int64_t T)
{
    if (!tokens || (!tokens->data && tokens->n > 0))
        return em_fail(EM_ERR_ARG, "em_sequence_dataset: tokens is NULL");
    if (T < 1)
        return em_fail(EM_ERR_ARG, "em_sequence_dataset: block size T must be >= 1, got %lld", (long long)T);
    if (tokens->n < T + 1)
        return em_fail(EM_ERR_ARG, "em_sequence_dataset: %lld tokens, need at least T + 1 = %lld",
                       (long long)tokens->n, (long long)(T + 1));
    seq_data *s = malloc(sizeof *s);
    if (!s) return em_fail(EM_ERR_OOM, "em_sequence_dataset: out of memory");
    *s = (seq_data){em_tokens_view(tokens->data, tokens->n, tokens->type), T};
    em_field f = {EM_I32, 1, {T}};
    em_dataset *ds = em_dataset_new(&(em_dataset){seq_len, seq_get, seq_free, s, f, f, NULL});
    if (!ds) free(s);
    return ds;
}
