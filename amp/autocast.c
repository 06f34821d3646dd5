/* autocast.c — the mixed-precision policy: which ops run in the low dtype,
 * which in f32, and which promote (per op, from the op list tensor/ops.def,
 * overridable with em_amp_set_policy), plus the per-thread switch. The ops
 * themselves (tensor/ops_*.c) ask amp_in / amp_promote at their entry; the
 * casts they make are ordinary cast ops on the tape, so the gradient of a
 * bf16 copy of an f32 weight arrives at the weight in f32. */
#include "amp/amp_impl.h"

#pragma GCC diagnostic error "-Wswitch-enum" /* a switch over the policies names each */

/* The policy of every op, by op id: ops.def's, until em_amp_set_policy. */
static em_amp_policy policy[] = {
#define DEF_OP(id, name, kind, arity, amp, be) [OP_##id] = EM_AMP_##amp,
#include "tensor/ops.def"
};
_Static_assert(sizeof policy / sizeof policy[0] == OP_COUNT, "autocast: one policy per op");

static _Thread_local em_dtype current = EM_F32; /* EM_F32: off */

em_dtype em_autocast_set(em_dtype dt)
{
    em_dtype prev = current;
    if (dt != EM_F32 && dt != EM_BF16 && dt != EM_F16) {
        em_set_error(EM_ERR_DTYPE, "em_autocast_set: %s is not bf16, f16 or f32 (off)",
                     (unsigned)dt < EM_NUM_DTYPES ? em_dtype_name(dt) : "an unknown dtype");
        return prev;
    }
    current = dt;
    return prev;
}

em_dtype em_autocast_dtype(void) { return current; }

/* The op called `name` if it consults autocast (its ops.def policy is not
 * NONE: only those ops call amp_in / amp_promote), else -1. */
static int find(const char *name)
{
    int i = op_find(name);
    return i >= 0 && op_table[i].amp != EM_AMP_NONE ? i : -1;
}

em_status em_amp_set_policy(const char *op, em_amp_policy p)
{
    int i = find(op);
    if (i < 0) return em_err(EM_ERR_ARG, "em_amp_set_policy: '%s' is not an op of the autocast table", op ? op : "(null)");
    if (p < EM_AMP_NONE || p > EM_AMP_PROMOTE) return em_err(EM_ERR_ARG, "em_amp_set_policy: %d is not a policy", (int)p);
    policy[i] = p;
    return EM_OK;
}

em_amp_policy em_amp_policy_of(const char *op)
{
    int i = find(op);
    return i < 0 ? EM_AMP_NONE : policy[i];
}

/* A cast that keeps a transposed matrix transposed (W^T in a Linear): the
 * copy then runs along memory instead of across it, and the matmul still
 * sees a BLAS layout. */
static tensor *cast_keeping_layout(tensor *t, em_dtype dt)
{
    if (t->ndim >= 2 && !t_is_contig(t)) {
        tensor *tt = t_transpose(t, -1, -2);
        if (!tt) return NULL;
        if (t_is_contig(tt)) {
            tensor *c = t_cast(tt, dt);
            return c ? t_transpose(c, -1, -2) : NULL;
        }
    }
    return t_cast(t, dt);
}

tensor *amp_in(op_id op, tensor *t)
{
    if (current == EM_F32 || !t || !em_dtype_is_float(t->dtype)) return t;
    switch (policy[op]) {
    case EM_AMP_LOW: return t->dtype == EM_F32 || t->dtype == EM_F64 ? cast_keeping_layout(t, current) : t;
    case EM_AMP_F32: return t->dtype == EM_F16 || t->dtype == EM_BF16 ? cast_keeping_layout(t, EM_F32) : t;
    case EM_AMP_NONE: return t;
    case EM_AMP_PROMOTE: return t; /* two operands: amp_promote */
    }
    return t;
}

/* f64 > f32 > bf16, f16; bf16 against f16 meets at f32 */
static em_dtype wider(em_dtype a, em_dtype b)
{
    if (a == EM_F64 || b == EM_F64) return EM_F64;
    if (a == EM_F32 || b == EM_F32 || a != b) return EM_F32;
    return a;
}

bool amp_promote(op_id op, tensor **a, tensor **b)
{
    if (current == EM_F32 || policy[op] != EM_AMP_PROMOTE || !*a || !*b) return true;
    em_dtype da = (*a)->dtype, db = (*b)->dtype;
    if (da == db || !em_dtype_is_float(da) || !em_dtype_is_float(db)) return true;
    em_dtype w = wider(da, db);
    if (da != w && !(*a = t_cast(*a, w))) return false;
    if (db != w && !(*b = t_cast(*b, w))) return false;
    return true;
}
