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
/* The Accelerator's clip under fp16: zero_unscale, then (unless the step
 * is to be skipped: INFINITY) em_zero_clip_grad_norm_with, with its
 * result, errors (*status, NULL not allowed) and found_inf. In stages 2-3
 * with an f32 shard on the CPU and p = 2 these run as two passes over the
 * shard instead of four and one all-reduce instead of two (the norm's
 * all-reduce doubles as the overflow vote), with the same bits. */
double zero_unscale_clip(em_zero *z, em_grad_scaler *sc, const em_clip_config *cfg, em_status *status);

/* Where this rank's share of a parameter of z's model lies: *lo, *n
 * elements of param (in its element order) inside this rank's chunk of the
 * bucket param lies in (*n may be 0). false when param lies in no bucket
 * (it is then whole on every rank). */
bool zero_param_share(const em_zero *z, const em_tensor *param, int64_t *lo, int64_t *n);
/* Stage 3: the parameters were written outside the dispatcher (a load
 * filled this rank's shares): every bucket counts as not whole, so the
 * next use gathers it. Collective only in that it waits for a running
 * prefetch; EM_OK below stage 3. */
em_status zero_params_changed(em_zero *z);

#endif
