/* accel_impl.h — the Accelerator's state, shared by dist/accelerator.c (the
 * loop) and dist/accel_state.c (save_state / load_state). */
#ifndef EMBER_DIST_ACCEL_IMPL_H
#define EMBER_DIST_ACCEL_IMPL_H

#include "ember/amp.h"
#include "ember/dist.h"

#define MAX_RNGS 256
#define MAX_PREPARED 16 /* models, optimizers, loaders: each */
#define MAX_REGIONS 64  /* nested em_accel_autocast_begin */

struct em_accelerator {
    em_pg *pg;
    int rank, world, local_rank, local_world;
    int grad_accum;
    em_device device; /* where the model, optimizer state and batches live */
    bool split_batches, even_batches;
    double bucket_mb;
    bool find_unused;
    /* mixed precision */
    em_dtype amp;              /* EM_BF16 / EM_F16 under mixed precision, else EM_F32 */
    em_grad_scaler *scaler;    /* fp16 only */
    bool skipped;              /* the last sync step's optimizer step was skipped (overflow) */
    /* prepared objects (borrowed) */
    em_window_sampler *sampler;
    em_rng *rngs[MAX_RNGS];
    int nrngs;
    /* the loop's state */
    int64_t micro;     /* micro-steps since the last sync */
    int64_t steps;     /* optimizer steps taken */
    bool sync;         /* sync_gradients of the current micro-step */
    bool trigger;
    /* several models, optimizers, loaders, schedules (acc-loop): each
     * em_accel_prepare adds what it is given, in order */
    em_module *models[MAX_PREPARED];
    em_ddp *ddps[MAX_PREPARED]; /* world > 1: models[i]'s DDP */
    int nmodels;
    em_tensor **params; /* every prepared model's parameters, in order */
    int nparams;
    em_optimizer *opts[MAX_PREPARED];
    em_lr_schedule scheds[MAX_PREPARED]; /* opts[i]'s schedule, when has_sched[i] */
    bool has_sched[MAX_PREPARED];
    int nopts;
    em_loader *loaders[MAX_PREPARED]; /* loaders[0] is the training loader (em_accel_next) */
    int nloaders;
    /* the micro-step (acc-loop): whether em_accel_accumulate counted it, and
     * the training loader's batch stamp at the last backward (a new stamp:
     * the micro-step's batch has been drawn) */
    bool counted;
    uint64_t batch_stamp;
    /* autocast regions (acc-loop): the thread's setting before each open
     * em_accel_autocast_begin, and the micro-step's automatic region */
    em_dtype region_prev[MAX_REGIONS];
    int regions;
    bool auto_region;
    em_dtype auto_prev;
    int auto_depth; /* regions open when the automatic one began */
};

#endif
