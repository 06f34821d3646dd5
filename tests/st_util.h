/* st_util.h — helpers for the safetensors tests: a scratch directory per
 * test, raw file writing/reading, little-endian packing, a sample file. */
#ifndef EMBER_TEST_ST_UTIL_H
#define EMBER_TEST_ST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static char st_dir[PATH_MAX];

/* A persistent tensor of dtype dt with the given values (no leftovers). */
static inline em_tensor *st_tensor(em_dtype dt, int ndim, const int64_t *shape, const double *vals)
{
    em_tensor *t = em_from_data(EM_F64, ndim, shape, vals);
    if (dt == EM_F64) return t;
    em_tensor *c = em_cast(t, dt);
    em_free(t);
    return c;
}

/* A fresh directory for this test (each test runs in its own process). */
static inline void st_tmpdir(void) { th_tmpdir(st_dir, sizeof st_dir, "ember-st"); }

/* dir/name, in one of 8 rotating buffers. */
static inline const char *st_path(const char *name)
{
    static char bufs[8][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 8];
    th_pathf(b, sizeof bufs[0], "%s/%s", st_dir, name);
    return b;
}

/* Little-endian packing of the low n bytes of v. */
static inline void st_le(unsigned char *p, uint64_t v, int n)
{
    for (int k = 0; k < n; k++) p[k] = (unsigned char)(v >> (8 * k));
}

static inline uint64_t st_get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--) v = v << 8 | p[k];
    return v;
}

static inline void st_write_raw(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(b, 1, n, f) != n) || fclose(f)) th_fail(__FILE__, __LINE__, "cannot write %s", path);
}

/* A safetensors file per the format: u64 LE header length, the header
 * exactly as given (no padding), the data. */
static inline void st_write_file(const char *path, const char *header, const void *data, size_t dlen)
{
    size_t hl = strlen(header);
    unsigned char *b = malloc(8 + hl + dlen);
    st_le(b, hl, 8);
    memcpy(b + 8, header, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    st_write_raw(path, b, 8 + hl + dlen);
    free(b);
}

static inline unsigned char *st_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) th_fail(__FILE__, __LINE__, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) th_fail(__FILE__, __LINE__, "short read of %s", path);
    fclose(f);
    *size = (size_t)n;
    return b;
}

/* A small valid file written by ember: three tensors and metadata. */
static inline void st_write_sample(const char *path)
{
    em_tensor *a = st_tensor(EM_F32, EM_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    em_tensor *b = st_tensor(EM_I32, EM_SHAPE(3), (double[]){-1, 0, 9});
    em_tensor *c = st_tensor(EM_BF16, EM_SHAPE(1), (double[]){0.5});
    em_named v[3] = {{"layer.weight", a}, {"ids", b}, {"h", c}};
    CHECK_OK(em_safetensors_save(path, 3, v, "{\"format\":\"pt\"}"));
    em_free(a);
    em_free(b);
    em_free(c);
}

#endif
