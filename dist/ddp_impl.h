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

/* ZeRO (dist/zero.c) drives the buckets through these. launch starts
 * bucket b's collective in place of the all-reduce (grads: the bucket's
 * slice of the flat gradient buffer; *work: the handle DDP waits on after
 * backward) and returns its status; finished runs once every bucket of a
 * synced backward has been waited on (its handles are gone by then).
 * NULL launch restores the all-reduce. */
typedef struct ddp_hooks {
    em_status (*launch)(void *ctx, int b, em_tensor *grads, em_work **work);
    void (*finished)(void *ctx);
    void *ctx;
} ddp_hooks;
void ddp_set_hooks(em_ddp *d, ddp_hooks h);
/* Bucket b (0 <= b < em_ddp_num_buckets): its dtype and its slice [*lo,
 * *lo + *n) of the flat buffers of that dtype. */
void ddp_bucket_span(const em_ddp *d, int b, em_dtype *dt, int64_t *lo, int64_t *n);
/* The group and the model d was made with. */
em_pg *ddp_pg(const em_ddp *d);
em_module *ddp_model(const em_ddp *d);

#endif
