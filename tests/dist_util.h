/* dist_util.h — multi-process tests: run a function as every rank of a
 * group, each rank a forked child of the test, with a rendezvous store
 * hosted by the test process itself.
 *
 *   static void body(em_pg *pg, int rank, int world, void *ctx) { ... CHECK(...); }
 *   TEST(test_x) { TH_RANKS(3, EM_TRANSPORT_AUTO, body, NULL); }
 *
 * TH_RANKS gives each child a joined em_pg (timeout 10 s); TH_RANKS_ENV only
 * sets the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, EMBER_STORE_TOKEN, a fresh
 * EMBER_RESTART_COUNT per call so groups never collide, EMBER_TIMEOUT=30)
 * for code that joins by itself (em_pg_from_env, the Accelerator), and
 * notes each rank's exit in the store as `ember launch` does
 * (r<EMBER_RESTART_COUNT>/exited/<rank>). A CHECK
 * failing in a child reports its own message; the parent then fails the
 * test naming the rank. Children never outlive the call: after the first
 * failure the others get 10 s to finish (they should fail too, not hang),
 * and anything left after 60 s in all is killed and reported. */
#ifndef EMBER_TESTS_DIST_UTIL_H
#define EMBER_TESTS_DIST_UTIL_H

#include "ember/ember.h"

typedef void (*th_rank_fn)(em_pg *pg, int rank, int world, void *ctx);
typedef void (*th_env_fn)(int rank, int world, void *ctx);

/* The groups' collective timeout in TH_RANKS (seconds; default 10). */
extern double th_ranks_timeout;

void th_ranks(const char *file, int line, int world, em_transport tr, th_rank_fn fn, void *ctx);
void th_ranks_env(const char *file, int line, int world, th_env_fn fn, void *ctx);
#define TH_RANKS(world, tr, fn, ctx) th_ranks(__FILE__, __LINE__, (world), (tr), (fn), (ctx))
#define TH_RANKS_ENV(world, fn, ctx) th_ranks_env(__FILE__, __LINE__, (world), (fn), (ctx))

/* AdamW (torch's defaults, lr = lr unless NAN) over every parameter of m, in
 * registration order: the optimizer the training tests share. NULL + error. */
em_optimizer *th_adamw_of(em_module *m, double lr);

#endif
