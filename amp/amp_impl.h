/* amp_impl.h — what the ops consult under autocast (amp/autocast.c). The
 * ops call these at their entry, before their dtype checks, with their op
 * id (tensor/ops.h; the policy comes from the op list, tensor/ops.def); with
 * autocast off they return their inputs untouched at the cost of one
 * thread-local load. */
#ifndef EMBER_AMP_IMPL_H
#define EMBER_AMP_IMPL_H

#include "ember/amp.h"
#include "tensor/ops.h"
#include "tensor/tensor_impl.h"

/* t as op's policy wants it under autocast (LOW / F32 casts; otherwise t
 * itself); NULL (error set) if a cast fails. NULL t passes through. */
tensor *amp_in(op_id op, tensor *t);
/* PROMOTE: casts the narrower of two float operands to the wider one when
 * they differ. false (error set) if a cast fails. */
bool amp_promote(op_id op, tensor **a, tensor **b);

/* em_scaler_unscale's agreement across ranks: *bad becomes true on every rank
 * of pg when it is true on any (a collective: every rank calls it). amp
 * sits below dist, so dist registers the function (dist/collectives.c, when
 * the library loads) instead of amp calling up into it. */
typedef em_status (*amp_vote_fn)(em_pg *pg, bool *bad);
void amp_set_overflow_vote(amp_vote_fn fn);

#endif
