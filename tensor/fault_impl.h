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
 * reported once on stderr and ignored. */
#ifndef EMBER_TENSOR_FAULT_IMPL_H
#define EMBER_TENSOR_FAULT_IMPL_H

void fault_point(const char *name);

#endif
