/* ddp_impl.h — DDP beyond its public API, for the Accelerator (never
 * included by users). */
#ifndef EMBER_DIST_DDP_IMPL_H
#define EMBER_DIST_DDP_IMPL_H

#include "ember/dist.h"

/* One backward of loss through the n DDP-wrapped models ds (all in one
 * group), synced (averaging every model that took part: see ddp.c) or
 * no_sync (gradients accumulate locally). n == 1 is em_ddp_backward. Errors
 * of backward, of the collectives, and EM_ERR_DIST naming a parameter of a
 * model that took part but got no gradient (unless find_unused_parameters). */
em_status ddp_backward_many(em_ddp *const *ds, int n, em_tensor *loss, bool sync);

#endif
