/* ember/tracker.h — experiment trackers: scalars (loss, learning rate, ...)
 * against the training step, written as TensorBoard event files and/or
 * JSON lines, as Accelerate's `log_with` trackers write them.
 *
 *   em_tracker *t = em_tracker_open("run1", &(em_tracker_config){
 *       .log_with = EM_TRACK_TENSORBOARD | EM_TRACK_JSONL, .logging_dir = "runs"});
 *   em_tracker_log(t, step, 2, (em_metric[]){{"loss", loss}, {"lr", lr}});
 *   em_tracker_close(t);
 *
 * writes runs/run1/events.out.tfevents.<unix time>.<host>.<pid>.<n> (open it
 * with `tensorboard --logdir runs`) and runs/run1/metrics.jsonl, one line
 * per call: {"step": 10, "loss": 2.3456, "lr": 0.001}. Every call reaches
 * the files before it returns (one write(2) per record, no user-space
 * buffer), so a crashed process loses nothing it logged; close fsyncs.
 *
 * A tracker is not locked: one thread at a time uses it.
 *
 * With an Accelerator, em_accel_init_trackers / em_accel_log /
 * em_accel_end_training (ember/dist.h) do the same on the main process only.
 *
 * The event files are TFRecord files of tensorflow.Event protocol buffers:
 * a first Event holding file_version "brain.Event:2", then one Event per
 * call (wall_time, step, and a Summary with one simple_value per metric,
 * stored as float32). `ember plot` draws metrics.jsonl as an SVG. */
#ifndef EMBER_TRACKER_H
#define EMBER_TRACKER_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

/* What a tracker writes (flags, combined with |). */
enum {
    EM_TRACK_TENSORBOARD = 1, /* LOGDIR/RUN/events.out.tfevents.* */
    EM_TRACK_JSONL = 2,       /* LOGDIR/RUN/metrics.jsonl (or jsonl_path) */
    EM_TRACK_ALL = 3
};

/* One scalar: tag (NUL-terminated, non-empty, not "step") and its value. */
typedef struct em_metric {
    const char *tag;
    double value;
} em_metric;

typedef struct em_tracker_config {
    int log_with;            /* EM_TRACK_* flags; at least one */
    const char *logging_dir; /* NULL or "": "runs"; created (with parents) if missing */
    /* The JSONL file to write instead of LOGDIR/RUN/metrics.jsonl (its
     * directory must exist). */
    const char *jsonl_path;
    /* This run continues an earlier one (a resumed run). JSONL: the records
     * the file holds stay and new ones follow them (a last line without its
     * newline, a record cut by a crash, is dropped first); otherwise the
     * file starts empty. TensorBoard: the first record logged is preceded
     * by a SessionLog START event at its step, so TensorBoard discards what
     * the run's earlier event files hold from that step on (what a killed
     * run logged after the checkpoint this one resumes from). */
    bool append;
} em_tracker_config;

typedef struct em_tracker em_tracker;

/* Opens the trackers cfg->log_with names for the run `run_name` (a single
 * path component: non-empty, no '/', not "." or ".."), creating
 * LOGDIR/RUN/ and its files. The TensorBoard file is always new (a unique
 * name, never an existing file); the JSONL file is truncated unless
 * cfg->append. NULL with EM_ERR_ARG (NULL or bad run_name / cfg, unknown
 * flags, no flag) or EM_ERR_IO naming the path that cannot be created or
 * is not a regular file; nothing is left open then. Free with
 * em_tracker_close. */
em_tracker *em_tracker_open(const char *run_name, const em_tracker_config *cfg);
/* Writes one record holding metrics[0..n) at `step` (>= 0) to every file
 * of the tracker, before returning. n == 0 writes nothing. EM_ERR_ARG (and
 * nothing written) for a NULL tracker, n < 0, metrics NULL with n > 0, a
 * NULL, empty or "step" tag, or a tag given twice; EM_ERR_IO naming the file
 * when a write fails (the file is cut back to its last whole record, so
 * it stays readable). In JSONL a NaN or infinite value is written as null
 * (JSON has no such numbers); TensorBoard stores it as is. Values are
 * written in full in JSONL (the shortest text that reads back as the same
 * double) and as float32 in TensorBoard. */
em_status em_tracker_log(em_tracker *t, int64_t step, int n, const em_metric *metrics);
/* fsync of every file (what was logged survives a machine crash, not only a
 * process crash). EM_ERR_IO naming the file. */
em_status em_tracker_flush(em_tracker *t);
/* Flushes and closes every file and frees t (NULL is fine: EM_OK). Returns
 * the first error; t is freed whatever happens. */
em_status em_tracker_close(em_tracker *t);
/* The path of the file t writes for one kind (EM_TRACK_TENSORBOARD or
 * EM_TRACK_JSONL), borrowed until em_tracker_close; NULL if t does not write
 * that kind. */
const char *em_tracker_path(const em_tracker *t, int kind);
/* Reads a log_with setting: "tensorboard", "jsonl", "all", "none" (0), or
 * a comma-separated list of the first two. EM_ERR_ARG naming s otherwise
 * (*log_with unchanged). */
em_status em_tracker_parse(const char *s, int *log_with);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
