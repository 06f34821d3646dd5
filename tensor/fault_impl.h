/* fault_impl.h — deterministic failure injection for the fault tests.
 * Internal: users never include it.
 *
 * Code that writes something a crash must not damage (checkpoints, weights,
 * metrics) marks its steps with fault_point("name"). The environment variable
 * EMBER_FAULT, read once per process, lists points at which the process
 * kills itself with SIGKILL, as a crash or `kill -9` would:
 *
 *   EMBER_FAULT=POINT:N[:RANK[:ATTEMPT]][,...]
 *
 * POINT is a point's name ("*" matches every point); N the 1-based count of
 * times this process reaches it (the Nth time kills); RANK, when given, the
 * only RANK (environment, as `ember launch` sets it) that dies; ATTEMPT the
 * only EMBER_RESTART_COUNT (0 when unset) on which it dies, so a job that
 * `ember launch --max-restarts` restarts does not die again. Without RANK
 * and ATTEMPT every process of every attempt dies there. Unset (the normal
 * case) a fault point costs one load and one branch. A malformed value is
 * reported once on stderr and ignored.
 *
 * The points (N counts them in the order a process reaches them):
 *   file.write      a file's temporary is partly written (file_write_atomic:
 *                   half its bytes; a safetensors file: its header)
 *   file.fsync      before the temporary's fsync
 *   file.rename     before the temporary is renamed over the file
 *   save.publish    a checkpoint complete in DIR.tmp-<id>, before the rename
 *                   that publishes it (dist/checkpoint.c)
 *   save.old        (only without RENAME_EXCHANGE) DIR moved to DIR.old-<id>,
 *                   the new one not yet in place: DIR is missing
 *   save.published  the new checkpoint is DIR; the previous one is not yet
 *                   removed
 *   train.save      `ember train` begins a save (tools/cmd_train.c)
 *   train.step      `ember train` ends a training step
 * EMBER_NO_RENAME_EXCHANGE (set, any value) makes a checkpoint publish as on
 * a file system without renameat2(RENAME_EXCHANGE): two renames. */
#ifndef EMBER_TENSOR_FAULT_IMPL_H
#define EMBER_TENSOR_FAULT_IMPL_H

void fault_point(const char *name);

#endif
