/* ember/profile.h — where a program's time goes.
 *
 * While profiling is on, ember records, on the thread that does the work:
 *   op          every op's forward call (the dispatcher's op_begin..op_end:
 *               autocast casts, the kernel, recording on the tape)
 *   backward    every backward node the autograd walk runs ("matmul_backward")
 *   collective  every collective and send/recv of a process group, on the
 *               thread that runs it: asynchronous ones (DDP's bucket
 *               all-reduces) on the group's communication thread, so they
 *               show as their own track overlapping backward; and
 *               "work_wait", the time em_work_wait blocked
 *   loader      "loader_wait" (em_loader_next waiting for the prefetch
 *               thread), "loader_fetch" (reading a batch, on whichever thread
 *               does it), "window_sampler" (em_window_sampler_next)
 *   optimizer   "sgd.step" / "adam.step" / "adamw.step" (em_optim_step),
 *               "zero_grad" (em_optim_zero_grad), "clip_grad_norm",
 *               "scaler.unscale" (em_scaler_unscale, fp16's loss scaler)
 *   range       named ranges: em_profile_range_begin/end, and those ember
 *               sets itself ("backward" in em_accel_backward; `ember train`'s
 *               "step" and "forward")
 * Each record is a time interval; records nest (an op called inside a
 * backward node is its child), and a record's self time is its time less
 * its children's. CUDA ops are asynchronous: their time is the launch.
 *
 * Turning it on: EMBER_PROFILE=1 in the environment (read once, when the
 * library loads; any boolean spelling, see em_profile_env) starts profiling
 * at load and, at exit, prints the table to stderr and writes the trace to
 * EMBER_PROFILE_DIR (default: the current directory) as
 * trace.rank<R>.json, R being this process's rank in its process group
 * (RANK from the environment until a group is joined; 0 alone). Or from code:
 * em_profile_start ... em_profile_stop, then em_profile_print and
 * em_profile_write_trace.
 *
 * Cost: off, each hook is one predictable branch on a global flag. On, a
 * record is two clock reads and an append to the calling thread's own
 * buffer, under that thread's own lock, which only a reader of the table or
 * the trace contends for. Each thread keeps its first 1,048,576
 * records for the trace; past that the table still counts everything and
 * the trace says how many it left out ("dropped_events").
 *
 * Thread safety: every function may be called from any thread at any time;
 * ranges belong to the thread that opened them. */
#ifndef EMBER_PROFILE_H
#define EMBER_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

/* Starts recording, on every thread (calling it again while on does
 * nothing). What was recorded before stays: em_profile_reset drops it. */
void em_profile_start(void);
/* Stops recording; what was recorded stays for print and write_trace. A
 * record already begun when profiling stops is still kept. */
void em_profile_stop(void);
/* Whether profiling is on. */
bool em_profile_enabled(void);
/* Drops everything recorded so far (tables and traces), on every thread.
 * Open ranges stay open. */
void em_profile_reset(void);

/* The state of EMBER_PROFILE as read when the library loaded: EM_OK when
 * it is unset, empty or a boolean (true, 1, yes, on / false, 0, no, off, any
 * case); EM_ERR_ARG "EMBER_PROFILE='x' is not a boolean (...)" when it is
 * anything else, in which case profiling stayed off. The `ember` command
 * and em_accelerator_new fail with this error; a program of its own may
 * call it first thing to do the same. */
em_status em_profile_env(void);

/* One row of the table: everything recorded under one name and category,
 * over every thread. name and category are the library's (they live as
 * long as the process). */
typedef struct em_profile_row {
    const char *name;     /* "matmul", "matmul_backward", "all_reduce", ... */
    const char *category; /* "op", "backward", "collective", "loader", "optimizer", "range" */
    int64_t calls;
    double total_ms; /* wall time inside the records, children included */
    double self_ms;  /* total_ms less the time of records nested inside them */
} em_profile_row;

/* Fills rows[0..min(n, cap)) with the table sorted by total time (largest
 * first; ties by name) and returns n, the number of rows there are (rows
 * may be NULL when cap is 0, to count). -1 + EM_ERR_ARG when cap < 0 or
 * rows is NULL with cap > 0; -1 + EM_ERR_OOM. */
int64_t em_profile_rows(em_profile_row *rows, int64_t cap);

/* Writes the table to f (stdout, stderr or a file): a title line (rank,
 * threads, records, the time they cover), then one line per row sorted by
 * total time: name, category, calls, total ms, self ms, average ms per call,
 * total % and self % (of the self time of all rows, which is the time the
 * records cover, summed over threads). Works while profiling is on or off.
 * EM_ERR_ARG when f is NULL; EM_ERR_IO when writing fails. */
em_status em_profile_print(FILE *f);

/* Writes the trace: Chrome's Trace Event Format (JSON object form), which
 * Perfetto (ui.perfetto.dev, "Open trace file") and chrome://tracing open.
 * One "X" (complete) event per record, ts and dur in microseconds (three
 * decimals: nanoseconds) on CLOCK_MONOTONIC, so the traces of ranks on one
 * machine line up; pid = the rank, tid = the OS thread id, "M" events name
 * the process ("rank R") and each thread ("main", "pg comm", "loader",
 * ...); collectives carry their bytes and dtype in args. path NULL: the
 * default, EMBER_PROFILE_DIR/trace.rank<R>.json (or ./trace.rank<R>.json).
 * The file is written beside its final name and renamed into place, so a
 * reader never sees half of it. EM_ERR_IO naming the path when it cannot be
 * written. */
em_status em_profile_write_trace(const char *path);

/* A named range on the calling thread, recorded (category "range") from
 * begin to the matching end; ranges nest, up to 64 deep, and the records
 * made inside a range are its children. name is copied. Ranges are kept
 * balanced whether profiling is on or not, so begin/end pairs may be left in
 * code that runs unprofiled. EM_ERR_ARG when name is NULL or empty, or 64
 * ranges are already open on this thread (begin), or none is (end). */
em_status em_profile_range_begin(const char *name);
em_status em_profile_range_end(void);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif
