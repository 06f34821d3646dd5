/* ops.h — the op list (tensor/ops.def) as C: op ids, what each op is (name,
 * kind, arity, autocast policy, backends), and the sub-enums of the
 * elementwise and reduction kinds that their kernels switch on. Every table
 * here is generated from ops.def, so a fact about an op lives in one line.
 *
 * The kernels' own switches over unop / binop / cmpop / redop have no
 * `default:` (-Wswitch, in -Wall, and -Wswitch-enum in the op files), so an
 * op added to ops.def without its case in a kernel is a compile error, never
 * a silent wrong result. C and C++ (the .cu files) both include this header. */
#ifndef EMBER_OPS_H
#define EMBER_OPS_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* every op: OP_ADD, OP_SUB, ... in the order of ops.def */
typedef enum op_id {
#define DEF_OP(id, name, kind, arity, amp, be) OP_##id,
#include "ops.def"
} op_id;

/* The counts are kept out of the enums, so that a switch over one names
 * exactly its ops (-Wswitch-enum). */
enum {
    OP_COUNT = 0
#define DEF_OP(id, name, kind, arity, amp, be) +1
#include "ops.def"
};

/* what sort of op it is: what a dispatcher could check alike for all ops of a kind */
typedef enum op_kind {
    OPK_UNARY,     /* elementwise maths on one tensor (unop) */
    OPK_AFFINE,    /* x*m + s with scalars */
    OPK_BINARY,    /* elementwise arithmetic, broadcasting (binop) */
    OPK_COMPARE,   /* elementwise comparison to bool, broadcasting (cmpop) */
    OPK_SELECT,    /* choose by a bool mask */
    OPK_REDUCE,    /* over some dims of one tensor (redop) */
    OPK_VIEW,      /* new geometry over the same storage */
    OPK_COPY,      /* a new contiguous copy (maybe of another dtype) */
    OPK_JOIN,      /* several tensors into one, or one into several */
    OPK_MATMUL,    /* matrix products */
    OPK_ATTENTION, /* fused causal attention */
    OPK_CONV,      /* convolution */
    OPK_POOL,      /* pooling windows */
    OPK_SOFTMAX,   /* along one dim */
    OPK_NORM,      /* normalisation over the last dim */
    OPK_LOSS,      /* to a scalar loss */
    OPK_INDEX,     /* gathers and scatters by i32 indices */
    OPK_DROPOUT,   /* random masks */
    OPK_COMPOSITE, /* built from other ops, no kernel of its own */
} op_kind;

/* autocast policy (ops.def's amp column): what the dispatcher does to an
 * op's float inputs while autocast is on. The public names are ember/amp.h's
 * em_amp_policy, EM_AMP_<same>; amp/autocast.c checks the values agree. */
typedef enum op_policy {
    POL_NONE,    /* untouched (the op does not consult autocast) */
    POL_LOW,     /* f32/f64 inputs cast to the autocast dtype */
    POL_F32,     /* f16/bf16 inputs cast to f32 */
    POL_PROMOTE, /* float inputs of different dtypes cast to the widest */
} op_policy;

/* backends with the op's forward and backward, as bits */
enum { OPB_CPU = 1, OPB_CUDA = 2, OPB_CPU_CUDA = OPB_CPU | OPB_CUDA };

typedef struct op_info {
    const char *name;
    op_kind kind;
    int arity;         /* tensor inputs; -1: a list */
    op_policy amp;     /* the policy ops.def gives (em_amp_set_policy may override it) */
    unsigned backends; /* OPB_* bits */
} op_info;

/* the op list, indexed by op_id (tensor/ops_table.c) */
extern const op_info op_table[];

static inline const char *op_name(op_id op) { return op_table[op].name; }
/* The op called `name`, or -1 (NULL: -1). */
int op_find(const char *name);

/* ---- the kinds with their own kernels' op codes -----------------------------------
 * Numbered in ops.def order within the kind; *_ops[k] is sub-op k's op id. */
typedef enum unop {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_UNARY(id, name, amp, be) UN_##id,
#include "ops.def"
} unop;
enum {
    UN_COUNT = 0
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_UNARY(id, name, amp, be) +1
#include "ops.def"
};

typedef enum binop {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_BINARY(id, name, amp, be) BIN_##id,
#include "ops.def"
} binop;
enum {
    BIN_COUNT = 0
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_BINARY(id, name, amp, be) +1
#include "ops.def"
};

typedef enum cmpop {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_COMPARE(id, name, amp, be) CMP_##id,
#include "ops.def"
} cmpop;
enum {
    CMP_COUNT = 0
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_COMPARE(id, name, amp, be) +1
#include "ops.def"
};

typedef enum redop {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_REDUCE(id, name, amp, be) RED_##id,
#include "ops.def"
} redop;
enum {
    RED_COUNT = 0
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_REDUCE(id, name, amp, be) +1
#include "ops.def"
};

extern const op_id unop_ops[], binop_ops[], cmpop_ops[], redop_ops[];

static inline const char *unop_name(unop k) { return op_table[unop_ops[k]].name; }
static inline const char *binop_name(binop k) { return op_table[binop_ops[k]].name; }
static inline const char *cmpop_name(cmpop k) { return op_table[cmpop_ops[k]].name; }
static inline const char *redop_name(redop k) { return op_table[redop_ops[k]].name; }

#ifdef __cplusplus
}
#endif
#endif
