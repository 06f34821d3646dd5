/* autocast.c — the public face of autocast (ember/amp.h): the per-thread
 * switch and the per-op policy (ops.def's, overridable with
 * em_amp_set_policy). The state and the casting belong to the dispatcher
 * (tensor/dispatch.c), which applies each op's policy at op_begin; the
 * casts it makes are ordinary cast ops on the tape, so the gradient of a
 * bf16 copy of an f32 weight arrives at the weight in f32. */
#include "amp/amp_impl.h"
#include "tensor/dispatch.h"

_Static_assert(EM_AMP_NONE == (int)POL_NONE && EM_AMP_LOW == (int)POL_LOW && EM_AMP_F32 == (int)POL_F32 &&
                   EM_AMP_PROMOTE == (int)POL_PROMOTE,
               "autocast: the public policies are the op list's");

em_dtype em_autocast_set(em_dtype dt)
{
    em_dtype prev = op_autocast();
    if (dt != EM_F32 && dt != EM_BF16 && dt != EM_F16) {
        em_set_error(EM_ERR_DTYPE, "em_autocast_set: %s is not bf16, f16 or f32 (off)",
                     (unsigned)dt < EM_NUM_DTYPES ? em_dtype_name(dt) : "an unknown dtype");
        return prev;
    }
    return op_set_autocast(dt);
}

em_dtype em_autocast_dtype(void) { return op_autocast(); }

/* The op called `name` if it consults autocast (its ops.def policy is not
 * NONE: the dispatcher casts only those ops' inputs), else -1. */
static int find(const char *name)
{
    int i = op_find(name);
    return i >= 0 && op_table[i].amp != POL_NONE ? i : -1;
}

em_status em_amp_set_policy(const char *op, em_amp_policy p)
{
    int i = find(op);
    if (i < 0) return em_err(EM_ERR_ARG, "em_amp_set_policy: '%s' is not an op of the autocast table", op ? op : "(null)");
    if (p < EM_AMP_NONE || p > EM_AMP_PROMOTE) return em_err(EM_ERR_ARG, "em_amp_set_policy: %d is not a policy", (int)p);
    op_set_policy((op_id)i, (op_policy)p);
    return EM_OK;
}

em_amp_policy em_amp_policy_of(const char *op)
{
    int i = find(op);
    return i < 0 ? EM_AMP_NONE : (em_amp_policy)op_policy_of((op_id)i);
}
