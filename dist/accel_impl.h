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
    /* checkpoint management (dist/accel_ckpt.c) */
    char project_dir[4096]; /* "" = none */
    bool auto_naming;
    int total_limit; /* 0 = keep every automatic checkpoint */
    /* trackers (dist/accel_track.c) */
    int log_with;        /* em_accel_config's, else EMBER_LOG_WITH */
    char *logging_dir;   /* owned; NULL = the trackers' default */
    em_tracker *tracker; /* main process, between init_trackers and end_training */
    bool trackers_on;    /* every rank: init_trackers was called, end_training not yet */
    /* main_process_first (dist/accel_objects.c): between _begin and _end */
    bool main_first_open;
    /* several models, optimizers, loaders, schedules (acc-loop): each
     * em_accel_prepare adds what it is given, in order */
    em_module *models[MAX_PREPARED];
    em_ddp *ddps[MAX_PREPARED]; /* world > 1: models[i]'s DDP */
    int nmodels;
    /* ZeRO (dist/zero.c): the resolved stage, and with world > 1 and a
     * stage, the engine over ddps[0] sharding opts[0] */
    int zero_stage;
    bool zero_offload; /* em_accel_config's */
    em_zero *zero;
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

/* dist/accel_state.c: every rank learns whether any rank failed (an
 * all-reduce; world 1 returns mine); a local failure keeps its own
 * message, the other ranks get EM_ERR_DIST "WHAT: rank R failed". */
em_status accel_agree(em_accelerator *a, em_status mine, const char *what);

/* ---- dist/accel_ckpt.c ---- */
/* a's project_dir, automatic naming and total_limit from cfg and the
 * environment (em_accel_config says how). EM_ERR_ARG naming the setting. */
em_status accel_ckpt_init(em_accelerator *a, const em_accel_config *cfg);
/* em_accel_save_state / em_accel_load_state with a NULL dir: the next /
 * the newest PROJECT/checkpoints/checkpoint_N (collective). */
em_status accel_save_auto(em_accelerator *a);
em_status accel_load_auto(em_accelerator *a);

/* dist/accel_track.c: em_accelerator_new's part (the config's log_with /
 * logging_dir, EMBER_LOG_WITH; EM_ERR_ARG naming a bad one) and
 * em_accelerator_free's (closes what is open). */
em_status accel_trackers_setup(em_accelerator *a, const em_accel_config *cfg);
void accel_trackers_free(em_accelerator *a);

#endif
