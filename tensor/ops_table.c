/* ops_table.c — the op list (tensor/ops.def) as data: op_table and the
 * sub-op → op id maps of ops.h, and finding an op by name. */
#include <string.h>

#include "ops.h"

const op_info op_table[] = {
#define DEF_OP(id, name, kind, arity, amp, be) [OP_##id] = {name, OPK_##kind, arity, POL_##amp, OPB_##be},
#include "ops.def"
};

const op_id unop_ops[] = {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_UNARY(id, name, amp, be) OP_##id,
#include "ops.def"
};

const op_id binop_ops[] = {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_BINARY(id, name, amp, be) OP_##id,
#include "ops.def"
};

const op_id cmpop_ops[] = {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_COMPARE(id, name, amp, be) OP_##id,
#include "ops.def"
};

const op_id redop_ops[] = {
#define DEF_OP(id, name, kind, arity, amp, be)
#define DEF_REDUCE(id, name, amp, be) OP_##id,
#include "ops.def"
};

/* Each table has exactly one entry per op of its enum (the enums and the
 * tables are expanded from ops.def separately). */
_Static_assert(sizeof op_table / sizeof op_table[0] == OP_COUNT, "op_table: one entry per op");
_Static_assert(sizeof unop_ops / sizeof unop_ops[0] == UN_COUNT, "unop_ops: one entry per unary op");
_Static_assert(sizeof binop_ops / sizeof binop_ops[0] == BIN_COUNT, "binop_ops: one entry per binary op");
_Static_assert(sizeof cmpop_ops / sizeof cmpop_ops[0] == CMP_COUNT, "cmpop_ops: one entry per compare op");
_Static_assert(sizeof redop_ops / sizeof redop_ops[0] == RED_COUNT, "redop_ops: one entry per reduction");

int op_find(const char *name)
{
    for (int i = 0; name && i < OP_COUNT; i++)
        if (!strcmp(op_table[i].name, name)) return i;
    return -1;
}
