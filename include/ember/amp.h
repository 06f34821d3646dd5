/* ember/amp.h — mixed precision: autocast (which ops run in bf16/f16 and which
 * stay in f32) and the dynamic loss scaler fp16 training needs.
 *
 * The model's parameters stay f32: they are the master weights the optimizer
 * updates. Under autocast a matmul multiplies its operands rounded to the
 * low dtype, with f32 accumulation, and returns the low dtype; numerically
 * delicate ops cast back to f32; gradients reach the f32 parameters in f32.
 * How the operands get rounded depends on where the product runs:
 *   - where the CPU computes low-precision products in f32 anyway (no
 *     AMX or AVX512-BF16: em_matmul_path(EM_BF16) is "f32"; f16 always),
 *     the matmul reads an f32 operand as it is and rounds each value to the
 *     low dtype as its GEMM packs it. No low-precision copy of a weight is
 *     made, forward or backward, and the results have the same bits as
 *     casting first would give. Arithmetic ops (add, sub, mul, div) read a
 *     low-precision input beside an f32 one as they are (the result is f32,
 *     as promoting first gives), so a product's output meets its bias
 *     without a cast either, and the f32 gradient goes back to the product
 *     without a narrowing pass;
 *   - where a fast bf16 product wants bf16 operands (AMX, AVX512-BF16, a
 *     GPU), f32 operands are cast first: the cast is an op on the tape, so
 *     each step makes fresh low-precision copies from the masters.
 *
 *   em_dtype prev = em_autocast_set(EM_BF16);
 *   em_tensor *loss = em_gpt_loss(g, x, y);      forward under the policy
 *   em_autocast_set(prev);
 *   em_backward(loss, NULL);                     (backward never autocasts)
 *
 * The Accelerator does all of this (and the scaling below) when its
 * mixed_precision is bf16 or fp16. */
#ifndef EMBER_AMP_H
#define EMBER_AMP_H

#include <stdbool.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is the exported API of libember.so, which
 * builds with hidden visibility (meson.build): nothing else leaves it. (nvcc
 * is left out: no .cu file defines a public function.) */
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

/* ---- autocast (amp/autocast.c) ---------------------------------------------------
 * The policy comes from the op list (tensor/ops.def, one line per op):
 *   LOW      matmul (and so Linear): f32/f64 operands are multiplied as
 *            the autocast dtype (cast to it, or on the CPU's f32 product
 *            path rounded to it inside the product: above); the result is
 *            in that dtype.
 *   F32      softmax, log_softmax, layer_norm, rms_norm, cross_entropy,
 *            mse_loss, attention, attention_qkv: f16/bf16 inputs are cast
 *            to f32; the result is f32.
 *   PROMOTE  add, sub, mul, div, where: when the two float operands'
 *            dtypes differ, the narrower is cast to the wider (bf16 with
 *            f16 goes to f32).
 * Every other op runs in its inputs' dtype, as without autocast. */
typedef enum em_amp_policy { EM_AMP_NONE = 0, EM_AMP_LOW, EM_AMP_F32, EM_AMP_PROMOTE } em_amp_policy;

/* Turns autocast on for the calling thread (dt = EM_BF16 or EM_F16) or off
 * (dt = EM_F32), returning the previous setting (EM_F32 when it was off), so
 * regions nest. Any other dt: EM_ERR_DTYPE is set and the setting is kept
 * (the current one is returned). Backward (em_backward) always runs with
 * autocast off. */
em_dtype em_autocast_set(em_dtype dt);
/* EM_BF16 / EM_F16 while autocast is on in this thread, else EM_F32. */
em_dtype em_autocast_dtype(void);
/* Overrides one op's policy for the whole process (set it before threads
 * start training). EM_ERR_ARG naming op when it is not one of the ops above
 * (an op whose policy is NONE does not consult autocast), or when p is not
 * a policy. */
em_status em_amp_set_policy(const char *op, em_amp_policy p);
/* The op's policy; EM_AMP_NONE for an op not in the table. */
em_amp_policy em_amp_policy_of(const char *op);

/* ---- the loss scaler (amp/scaler.c) ----------------------------------------------
 * torch.amp.GradScaler's dynamic scaling. f16 has 5 exponent bits: small
 * gradients underflow to zero unless the loss is scaled up before backward;
 * the scaler finds the largest scale that does not overflow. Per optimizer
 * step: scale the loss, backward, unscale the gradients once (before any
 * clipping), and if any gradient is inf/NaN skip the step; then update:
 * after an overflow the scale is multiplied by backoff_factor, after
 * growth_interval clean steps in a row by growth_factor. */
typedef struct em_scaler_config {
    double init_scale;      /* 0 = 65536 (2^16) */
    double growth_factor;   /* 0 = 2 */
    double backoff_factor;  /* 0 = 0.5 */
    int growth_interval;    /* 0 = 2000 */
} em_scaler_config;

typedef struct em_grad_scaler em_grad_scaler;
typedef struct em_pg em_pg;
typedef struct em_clip_config em_clip_config;

/* NULL cfg = the defaults. NULL + EM_ERR_ARG when a value is out of range
 * (scale and growth > 0 and finite, growth >= 1, 0 < backoff <= 1,
 * interval >= 1). */
em_grad_scaler *em_grad_scaler_new(const em_scaler_config *cfg);
void em_grad_scaler_free(em_grad_scaler *s); /* NULL is a no-op */
/* loss * scale, a new tensor in the caller's scope (recorded on the tape). */
em_tensor *em_scaler_scale(em_grad_scaler *s, em_tensor *loss);
/* Divides the gradients of the n params by the scale, in place, and finds
 * whether any is inf or NaN. With a process group (not NULL) the finding is
 * reduced over it (max), so every rank skips the same steps. Only the first
 * call after an update does anything (unscaling is once per step). Params
 * without a gradient are skipped. On the CPU the gradients are split over
 * the thread pool (small ones one per task, large ones by elements; each
 * element scaled alone, so the result does not depend on the split).
 * Errors: EM_ERR_ARG (NULL scaler, a gradient that is not f32/f64/f16/bf16
 * contiguous: then no gradient is touched), EM_ERR_OOM, the collective's. */
em_status em_scaler_unscale(em_grad_scaler *s, int n, em_tensor *const *params, em_pg *pg);
/* em_scaler_unscale, then, unless it found an inf or NaN, the clipping of
 * em_clip_grad_norm_with (optim.h): the same gradients to the bit and the
 * same norm, in two passes over the gradients instead of four when every
 * gradient is a contiguous f32 one on the CPU and cfg's norm is the
 * 2-norm (the norm of the unscaled values read in one pass, then each
 * gradient divided by the scale and, where clipping scales, by its factor
 * in another; else the two calls themselves). Returns the total norm of
 * the unscaled gradients, INFINITY when an inf or NaN was found (the
 * gradients are then only unscaled: skip the step), NAN on an error.
 * Already unscaled this step: only the clipping. Errors (*status, which
 * may be NULL): those of the two calls. */
double em_scaler_unscale_clip(em_grad_scaler *s, int n, em_tensor *const *params, const em_clip_config *cfg,
                              em_pg *pg, em_status *status);
/* Whether this step's gradients overflowed (valid after em_scaler_unscale). */
bool em_scaler_found_inf(const em_grad_scaler *s);
/* Ends the step: backs the scale off after an overflow, grows it after
 * growth_interval clean steps, and makes the next em_scaler_unscale act.
 * A step that was never unscaled leaves the scale alone. */
void em_scaler_update(em_grad_scaler *s);
double em_scaler_get_scale(const em_grad_scaler *s);

/* What save_state keeps: the scale and the count of clean steps since the
 * last change. set_state: EM_ERR_ARG for a non-positive or non-finite scale
 * or a negative tracker. */
typedef struct em_scaler_state {
    double scale;
    int64_t growth_tracker;
} em_scaler_state;
em_scaler_state em_scaler_get_state(const em_grad_scaler *s);
em_status em_scaler_set_state(em_grad_scaler *s, em_scaler_state st);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
