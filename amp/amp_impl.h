/* amp_impl.h — what the ops consult under autocast (amp/autocast.c). The
 * ops call these at their entry, before their dtype checks; with autocast
 * off they return their inputs untouched at the cost of one thread-local
 * load. */
#ifndef EMBER_AMP_IMPL_H
#define EMBER_AMP_IMPL_H

#include "ember/amp.h"
#include "tensor/tensor_impl.h"

/* The ops in the policy table (amp/autocast.c keeps their names and policies). */
typedef enum amp_op {
    AMP_MATMUL,
    AMP_ATTENTION,
    AMP_SOFTMAX,
    AMP_LOG_SOFTMAX,
    AMP_LAYER_NORM,
    AMP_RMS_NORM,
    AMP_CROSS_ENTROPY,
    AMP_MSE_LOSS,
    AMP_ADD,
    AMP_SUB,
    AMP_MUL,
    AMP_DIV,
    AMP_WHERE,
    AMP_NUM_OPS
} amp_op;

/* t as op's policy wants it under autocast (LOW / F32 casts; otherwise t
 * itself); NULL (error set) if a cast fails. NULL t passes through. */
tensor *amp_in(amp_op op, tensor *t);
/* PROMOTE: casts the narrower of two float operands to the wider one when
 * they differ. false (error set) if a cast fails. */
bool amp_promote(amp_op op, tensor **a, tensor **b);

#endif
