/* collate.c — the ready-made padding collate: variable-length examples
 * (em_dataset.lengths) padded to the longest in the batch, with a mask of
 * the real positions. Built on the public API only (em_full, em_data), as
 * a user's own collate would be. */
#include <string.h>

#include "ember/data.h"

/* Bytes of one row of f: an element of each dim after the first. */
static size_t row_bytes(const em_field *f)
{
    size_t n = em_dtype_size(f->dtype);
    for (int d = 1; d < f->ndim; d++) n *= (size_t)f->shape[d];
    return n;
}

/* (B, L, f->shape[1..]) of f's dtype filled with pad, each example's first
 * len rows copied from its buffer (is_y picks y and y_len). */
static em_tensor *padded(const em_field *f, int64_t B, int64_t L, double pad, const em_example *ex, bool is_y)
{
    int64_t shape[EM_MAX_DIMS];
    shape[0] = B;
    shape[1] = L;
    for (int d = 1; d < f->ndim; d++) shape[d + 1] = f->shape[d];
    em_tensor *t = em_full(f->dtype, f->ndim + 1, shape, pad);
    if (!t) return NULL;
    size_t row = row_bytes(f);
    uint8_t *p = em_data(t);
    for (int64_t b = 0; b < B; b++) {
        int64_t len = is_y ? ex[b].y_len : ex[b].x_len;
        memcpy(p + (size_t)(b * L) * row, is_y ? ex[b].y : ex[b].x, (size_t)len * row);
    }
    return t;
}

/* y stacked at its full field shape (B, y_field...). */
static em_tensor *stacked(const em_field *f, int64_t B, const em_example *ex)
{
    int64_t shape[EM_MAX_DIMS];
    shape[0] = B;
    for (int d = 0; d < f->ndim; d++) shape[d + 1] = f->shape[d];
    em_tensor *t = em_empty(f->dtype, f->ndim + 1, shape);
    if (!t) return NULL;
    size_t bytes = em_field_bytes(f);
    for (int64_t b = 0; b < B; b++) memcpy((uint8_t *)em_data(t) + (size_t)b * bytes, ex[b].y, bytes);
    return t;
}

em_pad_config em_pad_defaults(void)
{
    return (em_pad_config){.y_pad = EM_IGNORE_INDEX, .mask_dtype = EM_F32};
}

em_status em_collate_pad(void *ctx, const em_dataset *ds, int64_t n, const em_example *ex, em_batch *out)
{
    const char *fn = "em_collate_pad";
    em_pad_config cfg = ctx ? *(const em_pad_config *)ctx : em_pad_defaults();
    if (!ds || !ex || !out || n < 1)
        return em_set_error(EM_ERR_ARG, "%s: dataset, examples and batch must be set and n >= 1, got n %lld",
                            fn, (long long)n);
    if (cfg.multiple < 0)
        return em_set_error(EM_ERR_ARG, "%s: multiple must be >= 0, got %lld", fn, (long long)cfg.multiple);
    if ((unsigned)cfg.mask_dtype >= EM_NUM_DTYPES)
        return em_set_error(EM_ERR_ARG, "%s: unknown mask_dtype %d", fn, (int)cfg.mask_dtype);
    const em_field *xf = &ds->x_field, *yf = &ds->y_field;
    if (xf->ndim < 1 || (cfg.pad_y && yf->ndim < 1))
        return em_set_error(
            EM_ERR_SHAPE, "%s: %s is 0-dim: padding needs a field with a dim 0 to pad (x ndim %d, y ndim %d)",
            fn, xf->ndim < 1 ? "x" : "y", xf->ndim, yf->ndim);
    /* L = the longest in the batch, rounded up to a multiple */
    int64_t L = 0;
    for (int64_t b = 0; b < n; b++) {
        if (ex[b].x_len > L) L = ex[b].x_len;
        if (cfg.pad_y && ex[b].y_len > L) L = ex[b].y_len;
        if (!cfg.pad_y && yf->ndim >= 1 && ex[b].y_len != yf->shape[0])
            return em_set_error(
                EM_ERR_SHAPE,
                "%s: example %lld (batch row %lld) has y length %lld, not y_field's %lld: set "
                "pad_y to pad y like x",
                fn, (long long)ex[b].index, (long long)b, (long long)ex[b].y_len, (long long)yf->shape[0]);
    }
    if (cfg.multiple > 1 && L % cfg.multiple) L += cfg.multiple - L % cfg.multiple;

    out->x = padded(xf, n, L, cfg.x_pad, ex, false);
    out->y = !out->x ? NULL : cfg.pad_y ? padded(yf, n, L, cfg.y_pad, ex, true) : stacked(yf, n, ex);
    out->mask = out->y ? em_zeros(cfg.mask_dtype, 2, (int64_t[]){n, L}) : NULL;
    em_tensor *one = out->mask ? em_scalar(cfg.mask_dtype, 1.0) : NULL;
    if (!one) return em_last_status(); /* the loader frees what was made */
    size_t es = em_dtype_size(cfg.mask_dtype);
    uint8_t *m = em_data(out->mask);
    for (int64_t b = 0; b < n; b++)
        for (int64_t t = 0; t < ex[b].x_len; t++) memcpy(m + (size_t)(b * L + t) * es, em_data(one), es);
    if (em_scope_depth() == 0) em_free(one);
    return EM_OK;
}
