/* amp_impl.h — amp's internals shared with the layers above it. (Autocast
 * itself is applied by the dispatcher, tensor/dispatch.h; amp/autocast.c is
 * its public switch and policy table.) */
#ifndef EMBER_AMP_IMPL_H
#define EMBER_AMP_IMPL_H

#include "ember/amp.h"
#include "tensor/tensor_impl.h"

/* em_scaler_unscale's agreement across ranks: *bad becomes true on every rank
 * of pg when it is true on any (a collective: every rank calls it). amp
 * sits below dist, so dist registers the function (dist/collectives.c, when
 * the library loads) instead of amp calling up into it. */
typedef em_status (*amp_vote_fn)(em_pg *pg, bool *bad);
void amp_set_overflow_vote(amp_vote_fn fn);

/* em_scaler_unscale on n gradient tensors themselves (contiguous floats;
 * NULL entries skipped) rather than on parameters' gradients: ZeRO's
 * gradient shard (dist/zero.c). */
em_status amp_unscale_grads(em_grad_scaler *s, int n, tensor *const *grads, em_pg *pg);

/* For a caller that unscales gradients itself, fused with its clip (ZeRO's
 * shard, dist/zero.c): amp_unscale_due says whether this step's unscale is
 * still to do (false for NULL, or once done), and then *inv = 1/scale;
 * amp_unscaled records it done, with found_inf as every rank agreed it. */
bool amp_unscale_due(const em_grad_scaler *s, double *inv);
void amp_unscaled(em_grad_scaler *s, bool found_inf);

#endif
