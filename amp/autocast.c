/* autocast.c — the mixed-precision policy: one table of which ops run in the
 * low dtype, which in f32, and which promote, plus the per-thread switch.
 * The ops themselves (tensor/ops_*.c) ask amp_in / amp_promote at their
 * entry; the casts they make are ordinary cast ops on the tape, so the
 * gradient of a bf16 copy of an f32 weight arrives at the weight in f32. */
#include <string.h>

#include "amp/amp_impl.h"

static struct {
    const char *name;
    em_amp_policy policy;
} table[AMP_NUM_OPS] = {
    [AMP_MATMUL] = {"matmul", EM_AMP_LOW},
    [AMP_ATTENTION] = {"attention", EM_AMP_F32},
    [AMP_SOFTMAX] = {"softmax", EM_AMP_F32},
    [AMP_LOG_SOFTMAX] = {"log_softmax", EM_AMP_F32},
    [AMP_LAYER_NORM] = {"layer_norm", EM_AMP_F32},
    [AMP_RMS_NORM] = {"rms_norm", EM_AMP_F32},
    [AMP_CROSS_ENTROPY] = {"cross_entropy", EM_AMP_F32},
    [AMP_MSE_LOSS] = {"mse_loss", EM_AMP_F32},
    [AMP_ADD] = {"add", EM_AMP_PROMOTE},
    [AMP_SUB] = {"sub", EM_AMP_PROMOTE},
    [AMP_MUL] = {"mul", EM_AMP_PROMOTE},
    [AMP_DIV] = {"div", EM_AMP_PROMOTE},
    [AMP_WHERE] = {"where", EM_AMP_PROMOTE},
};

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

static int find(const char *op)
{
    for (int i = 0; op && i < AMP_NUM_OPS; i++)
        if (!strcmp(table[i].name, op)) return i;
    return -1;
}

em_status em_amp_set_policy(const char *op, em_amp_policy p)
{
    int i = find(op);
    if (i < 0) return em_err(EM_ERR_ARG, "em_amp_set_policy: '%s' is not an op of the autocast table", op ? op : "(null)");
    if (p < EM_AMP_NONE || p > EM_AMP_PROMOTE) return em_err(EM_ERR_ARG, "em_amp_set_policy: %d is not a policy", (int)p);
    table[i].policy = p;
    return EM_OK;
}

em_amp_policy em_amp_policy_of(const char *op)
{
    int i = find(op);
    return i < 0 ? EM_AMP_NONE : table[i].policy;
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

tensor *amp_in(amp_op op, tensor *t)
{
    if (current == EM_F32 || !t || !em_dtype_is_float(t->dtype)) return t;
    switch (table[op].policy) {
    case EM_AMP_LOW: return t->dtype == EM_F32 || t->dtype == EM_F64 ? cast_keeping_layout(t, current) : t;
    case EM_AMP_F32: return t->dtype == EM_F16 || t->dtype == EM_BF16 ? cast_keeping_layout(t, EM_F32) : t;
    default: return t;
    }
}

/* f64 > f32 > bf16, f16; bf16 against f16 meets at f32 */
static em_dtype wider(em_dtype a, em_dtype b)
{
    if (a == EM_F64 || b == EM_F64) return EM_F64;
    if (a == EM_F32 || b == EM_F32 || a != b) return EM_F32;
    return a;
}

bool amp_promote(amp_op op, tensor **a, tensor **b)
{
    if (current == EM_F32 || table[op].policy != EM_AMP_PROMOTE || !*a || !*b) return true;
    em_dtype da = (*a)->dtype, db = (*b)->dtype;
    if (da == db || !em_dtype_is_float(da) || !em_dtype_is_float(db)) return true;
    em_dtype w = wider(da, db);
    if (da != w && !(*a = t_cast(*a, w))) return false;
    if (db != w && !(*b = t_cast(*b, w))) return false;
    return true;
}
