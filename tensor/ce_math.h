/* ce_math.h — cross-entropy's per-row rules, written once for the CPU
 * (tensor/ops_loss.c) and CUDA devices (tensor/ops_nn.cu).
 *
 * A row has logits x (C), target t and log-sum-exp lse; w_j are the class
 * weights (1 without), W = sum_j w_j, e the label smoothing. The row's loss
 * (torch.nn.functional.cross_entropy's for class-index targets) is
 *   loss = (1-e) w_t (lse - x_t) + (e/C) S,   S = sum_j w_j (lse - x_j)
 * and, with a the row's share of the incoming gradient (g / the sum of w_t
 * over the rows not ignored for the mean, g for the sum, g_r for none),
 *   d loss / d x_j = a (s p_j - q_j),   p_j = exp(x_j - lse),
 *   s = (1-e) w_t + (e/C) W,   q_j = (e/C) w_j + [j == t] (1-e) w_t.
 * Without weights and smoothing s = 1 and q = onehot(t) exactly, so the
 * plain loss keeps its old values bit for bit. */
#ifndef EMBER_CE_MATH_H
#define EMBER_CE_MATH_H

#include <stdbool.h>

#include "hd.h"

/* lse_xt = lse - x_t; S as above (unused when e == 0) */
static inline EM_HD double ce_row_loss(double e, double C, double wt, double lse_xt, double S)
{
    double l = (1 - e) * wt * lse_xt;
    return e > 0 ? l + e / C * S : l;
}

/* s: the factor of p_j in the row's gradient */
static inline EM_HD double ce_row_scale(double e, double C, double wt, double W)
{
    return e > 0 ? (1 - e) * wt + e / C * W : wt;
}

/* q_j: what the row's gradient takes away from s p_j at class j */
static inline EM_HD double ce_row_q(double e, double C, double wj, double wt, bool is_t)
{
    double q = e > 0 ? e / C * wj : 0;
    return is_t ? q + (1 - e) * wt : q;
}

#endif
