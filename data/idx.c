/* idx.c — the IDX image/label dataset (MNIST), read with zlib straight from
 * .gz (or uncompressed) files. Header integers are big-endian: a magic
 * (0x00000803 for u8 images (N,H,W), 0x00000801 for u8 labels (N)) and one
 * size per dim. Example i: x = image i as f32 (1,H,W) / 255, y = label (i32). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../tensor/error_impl.h"
#include "ember/data.h"

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u

typedef struct idx_data {
    int64_t n, h, w;
    uint8_t *images; /* (N,H,W) */
    uint8_t *labels; /* (N) */
} idx_data;

/* Reads exactly n bytes; EM_ERR_IO naming what was being read on a short read. */
static em_status read_exact(gzFile f, const char *path, void *buf, size_t n, const char *what)
{
    size_t done = 0;
    while (done < n) {
        unsigned chunk = n - done > (1u << 30) ? (1u << 30) : (unsigned)(n - done);
        int got = gzread(f, (char *)buf + done, chunk);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            return em_err(EM_ERR_IO, "em_idx_dataset_open: %s: read error in %s: %s", path, what, msg);
        }
        if (got == 0)
            return em_err(EM_ERR_IO,
                          "em_idx_dataset_open: %s: truncated: %s needs %zu bytes, the file has %zu", path,
                          what, n, done);
        done += (size_t)got;
    }
    return EM_OK;
}

/* Opens path and reads its magic and `ndim` big-endian sizes into dims. */
static gzFile read_header(const char *path, uint32_t magic, int ndim, int64_t *dims)
{
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        em_err(EM_ERR_IO, "em_idx_dataset_open: cannot open %s: %s", path,
               errno ? strerror(errno) : "zlib error");
        return NULL;
    }
    uint8_t hdr[4 * 4];
    if (read_exact(f, path, hdr, 4 * (size_t)(1 + ndim), "the header") != EM_OK) {
        gzclose(f);
        return NULL;
    }
    uint32_t v[4];
    for (int k = 0; k <= ndim; k++)
        v[k] = (uint32_t)hdr[4 * k] << 24 | (uint32_t)hdr[4 * k + 1] << 16 | (uint32_t)hdr[4 * k + 2] << 8 |
               hdr[4 * k + 3];
    if (v[0] != magic) {
        em_err(EM_ERR_ARG, "em_idx_dataset_open: %s: bad magic 0x%08x, want 0x%08x (%s)", path, v[0], magic,
               magic == IDX_MAGIC_IMAGES ? "u8 images (N,H,W)" : "u8 labels (N)");
        gzclose(f);
        return NULL;
    }
    for (int k = 0; k < ndim; k++) {
        dims[k] = v[k + 1];
        if (dims[k] == 0) {
            em_err(EM_ERR_ARG, "em_idx_dataset_open: %s: dim %d has size 0", path, k);
            gzclose(f);
            return NULL;
        }
    }
    return f;
}

static int64_t idx_len(void *user) { return ((idx_data *)user)->n; }

/* x (1,H,W) = pixels / 255; y = label */
static em_status idx_get(void *user, int64_t i, void *x, void *y)
{
    idx_data *d = user;
    int64_t hw = d->h * d->w;
    const uint8_t *px = d->images + i * hw;
    float *out = x;
    for (int64_t k = 0; k < hw; k++) out[k] = (float)px[k] * (1.0f / 255.0f);
    *(int32_t *)y = d->labels[i];
    return EM_OK;
}

static void idx_free(void *user)
{
    idx_data *d = user;
    if (!d) return;
    free(d->images);
    free(d->labels);
    free(d);
}

em_dataset *em_idx_dataset_open(const char *images_path, const char *labels_path)
{
    if (!images_path || !labels_path) return em_fail(EM_ERR_ARG, "em_idx_dataset_open: a path is NULL");
    int64_t idims[3], ldims[1];
    gzFile fi = read_header(images_path, IDX_MAGIC_IMAGES, 3, idims);
    if (!fi) return NULL;
    gzFile fl = read_header(labels_path, IDX_MAGIC_LABELS, 1, ldims);
    if (!fl) {
        gzclose(fi);
        return NULL;
    }
    if (idims[0] != ldims[0]) {
        gzclose(fi);
        gzclose(fl);
        return em_fail(EM_ERR_ARG, "em_idx_dataset_open: %s has %lld images but %s has %lld labels",
                       images_path, (long long)idims[0], labels_path, (long long)ldims[0]);
    }
    size_t hw, nimg;
    if (__builtin_mul_overflow((size_t)idims[1], (size_t)idims[2], &hw) ||
        __builtin_mul_overflow(hw, (size_t)idims[0], &nimg) || nimg > ((size_t)1 << 40)) {
        gzclose(fi);
        gzclose(fl);
        return em_fail(EM_ERR_ARG, "em_idx_dataset_open: %s: %lld images of %lldx%lld is too large",
                       images_path, (long long)idims[0], (long long)idims[1], (long long)idims[2]);
    }
    idx_data *d = calloc(1, sizeof *d);
    if (d) {
        *d = (idx_data){idims[0], idims[1], idims[2], malloc(nimg), malloc((size_t)ldims[0])};
    }
    em_dataset *ds = NULL;
    if (!d || !d->images || !d->labels) {
        em_fail(EM_ERR_OOM, "em_idx_dataset_open: out of memory for %lld images of %lldx%lld",
                (long long)idims[0], (long long)idims[1], (long long)idims[2]);
    } else if (read_exact(fi, images_path, d->images, nimg, "the images") == EM_OK &&
               read_exact(fl, labels_path, d->labels, (size_t)ldims[0], "the labels") == EM_OK) {
        em_field fx = {EM_F32, 3, {1, idims[1], idims[2]}};
        em_field fy = {EM_I32, 0, {0}};
        ds = em_dataset_new(&(em_dataset){idx_len, idx_get, idx_free, d, fx, fy, NULL});
    }
    gzclose(fi);
    gzclose(fl);
    if (!ds) idx_free(d);
    return ds;
}
