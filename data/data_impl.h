/* data_impl.h — what data/dataset.c shares with data/loader.c: reading and
 * checking an example's lengths (em_dataset.lengths). */
#ifndef EMBER_DATA_IMPL_H
#define EMBER_DATA_IMPL_H

#include "ember/data.h"

/* Example i's lengths along dim 0 of x and y: the fields' shape[0] (0 for a
 * 0-dim field) unless ds->lengths says otherwise, then checked to lie in
 * [0, shape[0]]. lengths' status on failure (with a message naming fn and i
 * if it set none), EM_ERR_ARG naming fn, i and the values for a length out
 * of range. Safe on any thread (makes no tensor). */
em_status dataset_lengths(const em_dataset *ds, int64_t i, int64_t *x_len, int64_t *y_len, const char *fn);

#endif
