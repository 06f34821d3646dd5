/* loader_impl.h — what the Accelerator (dist/) asks a loader beyond the
 * public API (never included by users). */
#ifndef EMBER_DATA_LOADER_IMPL_H
#define EMBER_DATA_LOADER_IMPL_H

#include <stdint.h>

#include "ember/data.h"

/* The stamp of the batch em_loader_next last returned: stamps grow with
 * every batch any loader of the process returns, so of several loaders the
 * one with the largest stamp returned a batch last, and a stamp that changed
 * means a batch was returned in between. 0 when none was returned since the
 * loader was made, sharded or seeked (and for NULL). */
uint64_t loader_last_stamp(const em_loader *l);

#endif
