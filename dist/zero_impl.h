/* zero_impl.h — ZeRO beyond its public API, for the Accelerator (never
 * included by users). */
#ifndef EMBER_DIST_ZERO_IMPL_H
#define EMBER_DIST_ZERO_IMPL_H

#include "ember/amp.h"
#include "ember/dist.h"

/* em_zero_new over a DDP the caller made (the Accelerator's, made when the
 * model was prepared): owns_ddp says whether em_zero_free frees it (on
 * failure too); offload as em_zero_config's. */
em_zero *zero_attach(em_ddp *ddp, bool owns_ddp, em_optimizer *opt, int stage, bool offload);
/* The fp16 scaler's unscale (and overflow vote over the group) on the
 * gradients this rank steps with: the shard in stage 2, all of them in
 * stage 1. */
em_status zero_unscale(em_zero *z, em_grad_scaler *sc);

#endif
