/* accel_track.c — the Accelerator's trackers (Accelerate's log_with,
 * init_trackers, log, end_training) over ember/tracker.h: every rank makes
 * the calls and their checks, the main process alone opens and writes the
 * files. */
#include <stdlib.h>
#include <string.h>

#include "dist/accel_impl.h"
#include "dist/tracker_impl.h"
#include "tensor/error_impl.h"

em_status accel_trackers_setup(em_accelerator *a, const em_accel_config *cfg)
{
    const char *fn = "em_accelerator_new";
    if (tracker_check_flags(cfg->log_with, fn)) return em_last_status();
    a->log_with = cfg->log_with;
    const char *env = getenv("EMBER_LOG_WITH");
    if (!a->log_with && env && *env && em_tracker_parse(env, &a->log_with))
        return em_err(EM_ERR_ARG, "%s: EMBER_LOG_WITH='%s' is not tensorboard, jsonl, all or none", fn, env);
    /* as Accelerate's ProjectConfiguration: the project directory by default */
    const char *dir = cfg->logging_dir ? cfg->logging_dir : a->project_dir[0] ? a->project_dir : NULL;
    if (dir && !(a->logging_dir = strdup(dir))) return em_err(EM_ERR_OOM, "%s: out of memory", fn);
    return EM_OK;
}

void accel_trackers_free(em_accelerator *a)
{
    em_tracker_close(a->tracker);
    a->tracker = NULL;
    a->trackers_on = false;
    free(a->logging_dir);
    a->logging_dir = NULL;
}

em_status em_accel_init_trackers(em_accelerator *a, const char *project_name, const em_tracker_config *cfg)
{
    const char *fn = "em_accel_init_trackers";
    if (!a) return em_err(EM_ERR_ARG, "%s: accelerator is NULL", fn);
    if (tracker_check_run_name(project_name, fn)) return em_last_status();
    if (cfg && tracker_check_flags(cfg->log_with, fn)) return em_last_status();
    if (a->trackers_on)
        return em_err(EM_ERR_ARG, "%s: trackers are already open; call em_accel_end_training first", fn);
    em_tracker_config c = cfg ? *cfg : (em_tracker_config){0};
    if (!c.log_with) c.log_with = a->log_with;
    if (!c.logging_dir) c.logging_dir = a->logging_dir;
    if (c.log_with && a->rank == 0 && !(a->tracker = em_tracker_open(project_name, &c)))
        return em_last_status();
    a->trackers_on = true;
    return EM_OK;
}

em_status em_accel_log(em_accelerator *a, int64_t step, int n, const em_metric *metrics)
{
    const char *fn = "em_accel_log";
    if (!a) return em_err(EM_ERR_ARG, "%s: accelerator is NULL", fn);
    if (!a->trackers_on)
        return em_err(EM_ERR_ARG,
                      "%s: no trackers: call em_accel_init_trackers first (after end_training, again)", fn);
    if (step < 0) step = a->steps;
    if (tracker_check_metrics(step, n, metrics, fn)) return em_last_status();
    return a->tracker ? em_tracker_log(a->tracker, step, n, metrics) : EM_OK;
}

em_status em_accel_end_training(em_accelerator *a)
{
    if (!a) return em_err(EM_ERR_ARG, "em_accel_end_training: accelerator is NULL");
    em_status s = em_tracker_close(a->tracker);
    a->tracker = NULL;
    a->trackers_on = false;
    return s;
}
