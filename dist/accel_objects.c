/* accel_objects.c — the Accelerator's calls for work that is not tensors:
 * main_process_first (Accelerate's `with accelerator.main_process_first():`,
 * as two calls around the block) and gather_object (bytes of any length per
 * rank, gathered on every rank in rank order).
 *
 * main_process_first is one barrier per rank, met at different places: the
 * other ranks wait in _begin, the main process arrives in _end, so their
 * blocks start once the main process has finished its own.
 *
 * gather_object is two all-gathers: of the lengths (f64, exact below 2^53),
 * then of every rank's bytes zero-padded to the longest, carried as i32
 * words (a gather moves words without arithmetic, so bytes pass unchanged). */
#include <stdlib.h>
#include <string.h>

#include "dist/accel_impl.h"
#include "tensor/tensor_impl.h"

em_status em_accel_main_process_first_begin(em_accelerator *a)
{
    const char *fn = "em_accel_main_process_first_begin";
    if (!a) return em_err(EM_ERR_ARG, "%s: accelerator is NULL", fn);
    if (a->main_first_open)
        return em_err(EM_ERR_ARG, "%s: a main_process_first block is already open on rank %d (end it first)",
                      fn, a->rank);
    if (a->rank != 0) { /* wait for the main process to finish its block */
        em_status s = em_barrier(a->pg, NULL);
        if (s != EM_OK) return s;
    }
    a->main_first_open = true;
    return EM_OK;
}

em_status em_accel_main_process_first_end(em_accelerator *a)
{
    const char *fn = "em_accel_main_process_first_end";
    if (!a) return em_err(EM_ERR_ARG, "%s: accelerator is NULL", fn);
    if (!a->main_first_open)
        return em_err(EM_ERR_ARG, "%s: no main_process_first block is open on rank %d (call %s_begin first)",
                      fn, a->rank, "em_accel_main_process_first");
    a->main_first_open = false;
    return a->rank == 0 ? em_barrier(a->pg, NULL) : EM_OK; /* releases the others */
}

/* All ranks' lengths into sizes (world entries). */
static em_status gather_sizes(em_accelerator *a, size_t n, size_t *sizes)
{
    em_tensor *mine = em_full(EM_F64, 1, (int64_t[]){1}, (double)n);
    em_tensor *all = em_empty(EM_F64, 1, (int64_t[]){a->world});
    if (!mine || !all) return em_last_status();
    em_status s = em_all_gather(a->pg, all, mine, NULL);
    if (s != EM_OK) return s;
    const double *v = em_data(all);
    for (int r = 0; r < a->world; r++) sizes[r] = (size_t)v[r];
    return EM_OK;
}

/* Every rank's bytes, each padded to `words` i32 words, into one buffer of
 * sum(sizes) + 1 bytes (*out). */
static em_status gather_bytes(em_accelerator *a, const void *data, size_t n, const size_t *sizes,
                              int64_t words, void **out)
{
    em_tensor *mine = em_zeros(EM_I32, 1, (int64_t[]){words});
    em_tensor *all = em_empty(EM_I32, 1, (int64_t[]){words * a->world});
    if (!mine || !all) return em_last_status();
    if (n) memcpy(em_data(mine), data, n);
    em_status s = em_all_gather(a->pg, all, mine, NULL);
    if (s != EM_OK) return s;
    size_t total = 0;
    for (int r = 0; r < a->world; r++) total += sizes[r];
    uint8_t *buf = malloc(total + 1);
    if (!buf) return em_err(EM_ERR_OOM, "em_accel_gather_object: out of memory for %zu bytes", total);
    const uint8_t *src = em_data(all);
    size_t at = 0;
    for (int r = 0; r < a->world; r++) {
        memcpy(buf + at, src + (size_t)r * (size_t)words * 4, sizes[r]);
        at += sizes[r];
    }
    buf[total] = 0;
    *out = buf;
    return EM_OK;
}

em_status em_accel_gather_object(em_accelerator *a, const void *data, size_t n, void **out, size_t *sizes)
{
    const char *fn = "em_accel_gather_object";
    if (out) *out = NULL;
    if (!a || !out || !sizes || (!data && n > 0))
        return em_err(EM_ERR_ARG, "%s: accelerator, out and sizes must not be NULL, nor data with n %zu > 0",
                      fn, n);
    if (n > ((size_t)1 << 53))
        return em_err(EM_ERR_ARG, "%s: %zu bytes is more than gather_object carries (2^53)", fn, n);
    em_scope sc = em_scope_begin(); /* the collectives' tensors */
    em_status s = gather_sizes(a, n, sizes);
    size_t longest = 0;
    for (int r = 0; s == EM_OK && r < a->world; r++)
        if (sizes[r] > longest) longest = sizes[r];
    if (s == EM_OK) {
        /* at least one word, so that every rank makes the same call even when all send nothing */
        int64_t words = (int64_t)((longest + 3) / 4);
        s = gather_bytes(a, data, n, sizes, words ? words : 1, out);
    }
    em_scope_end(sc);
    return s;
}
