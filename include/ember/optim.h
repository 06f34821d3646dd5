/* ember/optim.h — optimizers (SGD, Adam, AdamW) with parameter groups and
 * saveable state, gradient clipping, and learning-rate schedules.
 *
 * Semantics are torch.optim's (PyTorch 1.13 / 2.x, single-tensor CPU path,
 * zero_grad(set_to_none=True) by default). Per parameter p with gradient g,
 * learning rate lr and weight decay wd of p's group:
 *
 *   SGD:    g = -g if maximize;  g += wd * p
 *           momentum != 0:  buf = g on p's first step, else
 *                           buf = momentum * buf + (1 - dampening) * g
 *                           g = nesterov ? g + momentum * buf : buf
 *           p -= lr * g
 *   Adam:   t += 1 (p's own step count);  g = -g if maximize
 *           g += wd * p   (L2 into the gradient)
 *           m = beta1 * m + (1 - beta1) * g
 *           v = beta2 * v + (1 - beta2) * g^2
 *           amsgrad: vmax = max(vmax, v), and vmax stands for v below
 *           p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *   AdamW:  p *= 1 - lr * wd   (decoupled decay, before the update), then the
 *           Adam update with no wd in the gradient.
 *
 * A step updates only the parameters that have a gradient (em_has_grad,
 * ember/autograd.h): one produced since the last set-to-none
 * em_optim_zero_grad. The others are skipped whole, as torch skips a
 * parameter whose .grad is None: no weight decay, no momentum, their step
 * count t stays.
 *
 * Parameters are persistent float leaf tensors that require grad (f32, f64,
 * f16, bf16). The optimizer keeps their handles (it does not own them) and
 * updates their data in place with plain loops, recording nothing on the tape.
 * f32/f16/bf16 parameters are computed in f32 (f16/bf16 rounded back to
 * nearest even on store) with f32 state; f64 parameters in f64 with f64 state.
 * State is persistent, allocated on a parameter's first step, owned by the
 * optimizer.
 */
#ifndef EMBER_OPTIM_H
#define EMBER_OPTIM_H

#include "nn.h"
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

typedef struct em_optimizer em_optimizer;
typedef struct em_lr_schedule em_lr_schedule; /* a learning-rate schedule (below) */

/* ---- configurations --------------------------------------------------------
 * Fill one from its defaults function and change fields. Every constructor
 * validates the values (EM_ERR_ARG naming the function, field and value,
 * e.g. "em_adam_new: beta1 must be in [0, 1), got 1"). */
typedef struct em_sgd_config {
    double lr;           /* required: >= 0 (the default is NAN = not set) */
    double momentum;     /* >= 0; 0 = no momentum buffer */
    double dampening;    /* any value; must be 0 with nesterov */
    double weight_decay; /* >= 0; L2 added to the gradient */
    bool nesterov;       /* needs momentum > 0 and dampening == 0 */
    bool maximize;       /* ascend: the gradient's sign is flipped first */
} em_sgd_config;

typedef struct em_adam_config {
    double lr;           /* >= 0 */
    double beta1, beta2; /* each in [0, 1) */
    double eps;          /* >= 0 */
    double weight_decay; /* >= 0; Adam: L2 into the gradient; AdamW: decoupled */
    bool amsgrad;        /* divide by the running maximum of v (one more state tensor) */
    bool maximize;       /* ascend: the gradient's sign is flipped first */
} em_adam_config;

/* torch's defaults: SGD lr NAN (must be set), momentum 0, dampening 0, wd 0,
 * nesterov false. Adam: lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0. AdamW:
 * the same with wd 1e-2. amsgrad and maximize false. */
em_sgd_config em_sgd_defaults(void);
em_adam_config em_adam_defaults(void);
em_adam_config em_adamw_defaults(void);

/* ---- constructors -----------------------------------------------------------
 * n >= 1 parameter handles, which become group 0 with cfg's lr and
 * weight_decay; their index in the optimizer is their position (later groups
 * continue the numbering). Each must be alive (EM_ERR_SCOPE if stale), a
 * float dtype (EM_ERR_DTYPE), a leaf that requires grad (EM_ERR_ARG),
 * persistent (EM_ERR_SCOPE for a tensor of a step scope), and appear once
 * (EM_ERR_ARG). cfg NULL means the defaults (an error for SGD: lr is
 * required). Returns NULL with the error set on failure; nothing is kept.
 * The caller frees the optimizer with em_optim_free, and keeps the
 * parameters alive for as long as it steps. */
em_optimizer *em_sgd_new(int n, em_tensor *const *params, const em_sgd_config *cfg);
em_optimizer *em_adam_new(int n, em_tensor *const *params, const em_adam_config *cfg);
em_optimizer *em_adamw_new(int n, em_tensor *const *params, const em_adam_config *cfg);

/* Frees the optimizer and its state (not the parameters). NULL is a no-op. */
void em_optim_free(em_optimizer *o);

/* ---- parameter groups ------------------------------------------------------
 * Adds n >= 1 parameters as a new group with its own lr and weight_decay
 * (other hyperparameters come from the constructor's config). Same checks as
 * the constructors; a parameter already in any group is EM_ERR_ARG. Returns
 * the group's index (1, 2, ...), or -1 with the error set (the optimizer is
 * unchanged). Typical use: weight matrices with decay in group 0, biases and
 * norm gains (1-D) in a group with weight_decay 0, or a lower lr for a
 * pretrained body than for a new head.
 *
 * Each group has a base lr and a current lr. The base lr is the lr it was
 * made with (the constructor's cfg.lr for group 0, add_group's lr for the
 * others; torch's initial_lr): schedules scale it (em_optim_apply_schedule,
 * and the schedule em_accel_prepare takes), so groups at 0.1 and 0.01 under
 * a step decay go 0.1, 0.1, 0.05, ... and 0.01, 0.01, 0.005, ..., as a torch
 * LRScheduler does. The current lr is what the next step uses. */
int em_optim_add_group(em_optimizer *o, int n, em_tensor *const *params, double lr, double weight_decay);
int em_optim_num_groups(const em_optimizer *o);
/* Sets the current lr of one group, or of every group when group is -1
 * (lr >= 0), to an explicit value: an override until the next
 * em_optim_apply_schedule (the base lr does not change). EM_ERR_ARG for a
 * group out of range or a bad lr. */
em_status em_optim_set_lr(em_optimizer *o, int group, double lr);
/* The current lr of a group; NAN with EM_ERR_ARG if group is out of range. */
double em_optim_get_lr(const em_optimizer *o, int group);
/* Sets the base lr of one group, or of every group when group is -1 (lr >=
 * 0); the current lr is left until the next em_optim_apply_schedule.
 * EM_ERR_ARG for a group out of range or a bad lr. */
em_status em_optim_set_base_lr(em_optimizer *o, int group, double lr);
/* The base lr of a group; NAN with EM_ERR_ARG if group is out of range. */
double em_optim_get_base_lr(const em_optimizer *o, int group);
/* Sets every group's current lr to the schedule's value at step (the step
 * about to be taken) for that group's base lr: em_lr_at of s with base_lr
 * replaced by the group's base lr (EM_LR_COSINE's min_lr scaled by the same
 * ratio, so min_lr / base_lr is a fraction every group keeps). A group whose
 * base lr equals s->base_lr gets exactly em_lr_at(s, step). So s->base_lr
 * matters here only as the reference of min_lr; the optimizer's groups say
 * where each starts.
 *     em_optim_apply_schedule(o, &sched, step);  em_optim_step(o);
 * Errors (nothing changed): em_lr_at's (a bad schedule or step, a custom
 * fn's bad multiplier), EM_ERR_ARG for a NULL optimizer. */
em_status em_optim_apply_schedule(em_optimizer *o, const em_lr_schedule *s, int64_t step);

/* ---- stepping ----------------------------------------------------------------
 * One update of every parameter that has a gradient (em_has_grad);
 * parameters without one are skipped and their state is untouched. Every
 * handle is checked first: a freed parameter is EM_ERR_SCOPE and nothing is
 * modified. Records nothing on the tape. EM_ERR_OOM if state cannot be
 * allocated (the parameters are then unchanged). */
em_status em_optim_step(em_optimizer *o);

/* What em_optim_zero_grad does (torch's zero_grad(set_to_none=...)):
 *   EM_ZERO_GRAD_SET_TO_NONE (the default, torch 2's): every parameter is
 *     left without a gradient (em_has_grad false), so the next step skips a
 *     parameter no backward reached since. The buffers stay allocated and
 *     are zeroed (flat gradient buffers and DDP's buckets read them whole),
 *     and em_grad still returns them.
 *   EM_ZERO_GRAD_IN_PLACE: the gradients are zeroed and a parameter that
 *     had one keeps it (a zero gradient the next step applies: weight decay
 *     and momentum act on it), torch's set_to_none=False. A parameter that
 *     never had one stays without. */
typedef enum em_zero_grad_mode { EM_ZERO_GRAD_SET_TO_NONE = 0, EM_ZERO_GRAD_IN_PLACE } em_zero_grad_mode;
/* Chooses the optimizer's zero_grad mode (em_optim_zero_grad's, which the
 * Accelerator calls, and em_zero_zero_grad's). EM_ERR_ARG for NULL or an
 * unknown mode. */
em_status em_optim_set_zero_grad_mode(em_optimizer *o, em_zero_grad_mode mode);
/* Zeroes the gradients of all parameters (keeps their storage, so flat
 * gradient buffers stay in use) and, in the default mode, marks them as
 * having none (above); parameters without a buffer are left so. */
em_status em_optim_zero_grad(em_optimizer *o);
/* Number of successful em_optim_step calls (restored by em_optim_load_state). */
int64_t em_optim_step_count(const em_optimizer *o);

/* ---- state (for checkpoints) -----------------------------------------------
 * The optimizer's state as named tensors, without files (write them with
 * em_safetensors_save). Names, for parameter index i (constructor order, then
 * each added group's order):
 *   "step"                       0-dim f64: em_optim_step_count
 *   "state.<i>.step"             0-dim f64: Adam/AdamW, p_i's own step count
 *   "state.<i>.exp_avg"          Adam/AdamW, p_i's shape: m
 *   "state.<i>.exp_avg_sq"       Adam/AdamW, p_i's shape: v
 *   "state.<i>.max_exp_avg_sq"   Adam/AdamW with amsgrad, p_i's shape: vmax
 *   "state.<i>.momentum_buffer"  SGD with momentum, p_i's shape
 * State tensors are f32 (f64 for f64 parameters). A parameter appears only
 * once it has state (after its first step with a gradient), with all of its
 * entries. Learning rates and other hyperparameters are not state (the
 * program sets them; schedules are functions of the step, and base lrs are
 * what the program made the groups with).
 * Writes min(count, max) entries to out (out may be NULL with max 0) and
 * returns the count (-1 on a NULL optimizer). The tensors and names are owned
 * by the optimizer: valid until the next em_optim_load_state or em_optim_free;
 * em_optim_step updates their values in place. */
int em_optim_state(const em_optimizer *o, em_named *out, int max);
/* Replaces the whole state with n named tensors in the format above (any
 * order; any float dtype, converted; exact when it is the state's dtype;
 * EM_ERR_DTYPE for another dtype; step counts must be non-negative integers).
 * "step" is required; a parameter's entries must all be present or all
 * absent (absent: the parameter starts fresh). EM_ERR_ARG for an unknown,
 * duplicate or missing name or a parameter index out of range, EM_ERR_SHAPE
 * for a shape that is not the parameter's; nothing is modified unless every
 * check passes. Saving, loading into a fresh optimizer over the same
 * parameter values and stepping gives bitwise the same parameters as never
 * stopping. */
em_status em_optim_load_state(em_optimizer *o, int n, const em_named *state);

/* ---- gradient clipping -------------------------------------------------------
 * torch.nn.utils.clip_grad_norm_: total = the norm_type-norm of all the
 * gradients of the n parameters together (parameters without a gradient,
 * em_has_grad false, are left out), accumulated in double:
 *   p finite:  total = (sum over every element g of |g|^p)^(1/p)
 *              (p = 2: sqrt of the sum of squares; p = 1: the sum of |g|)
 *   p = inf:   total = max |g|
 * then every gradient is multiplied in place by min(1, max_norm / (total +
 * 1e-6)), so gradients change only when total + 1e-6 > max_norm. Returns
 * total (0 when no parameter has a gradient; inf/nan pass through as in
 * torch, unless error_if_nonfinite). On failure returns NAN and modifies
 * nothing; status (may be NULL) receives EM_OK or the code:
 *   EM_ERR_ARG    max_norm < 0 or NaN; norm_type not > 0 (nor inf); with
 *                 error_if_nonfinite, a total that is inf or NaN (the
 *                 message names the norm and the first parameter whose
 *                 gradient is not finite; torch's RuntimeError)
 *   EM_ERR_SCOPE  a stale handle. */
typedef struct em_clip_config {
    double max_norm;         /* >= 0 */
    double norm_type;        /* p > 0, or INFINITY; 0 means 2 (so {.max_norm = 1} is torch's default) */
    bool error_if_nonfinite; /* refuse an inf/NaN total instead of scaling by it */
} em_clip_config;
double em_clip_grad_norm_with(int n, em_tensor *const *params, const em_clip_config *cfg, em_status *status);
/* em_clip_grad_norm_with with norm_type 2 and error_if_nonfinite false. */
double em_clip_grad_norm(int n, em_tensor *const *params, double max_norm, em_status *status);

/* ---- learning-rate schedules (optim/schedule.c) ------------------------------
 * The lr for step s = 0, 1, 2, ... (the step about to be taken) of a
 * parameter group whose base lr is base_lr (em_optim_apply_schedule gives
 * each group its own; em_lr_at evaluates the schedule's base_lr):
 *   EM_LR_CONSTANT:  base_lr
 *   EM_LR_WARMUP:    s < warmup: base_lr * (s + 1) / warmup;  else base_lr
 *   EM_LR_COSINE:    s < warmup: base_lr * (s + 1) / warmup;
 *                    warmup <= s < total:
 *                        r = (s - warmup) / (total - warmup)
 *                        min_lr + 0.5 * (1 + cos(pi * r)) * (base_lr - min_lr)
 *                    s >= total: min_lr
 *   EM_LR_STEP:      base_lr * gamma ^ floor(s / step_size)  (torch StepLR)
 *   EM_LR_LINEAR_HF (also spelled EM_LR_LINEAR, its first name):
 *                    s < warmup: base_lr * (s / warmup)  (warm-up starts at 0)
 *                    warmup <= s < total: base_lr * ((total - s) / (total - warmup))
 *                    s >= total: 0
 *                    This is transformers' get_linear_schedule_with_warmup
 *                    (LambdaLR, the schedule Hugging Face scripts use most):
 *                    its lr for the optimizer's step s, step for step —
 *                    including lr 0 for step 0 when warmup > 0, where
 *                    EM_LR_WARMUP and EM_LR_COSINE (nanoGPT's) start at
 *                    base_lr / warmup.
 *   EM_LR_COSINE_HF: transformers' get_cosine_schedule_with_warmup
 *                    (num_cycles 0.5): s < warmup: base_lr * (s / warmup);
 *                    else with r = (s - warmup) / (total - warmup):
 *                    base_lr * max(0, 0.5 * (1 + cos(pi * r))). Like
 *                    transformers, no floor (min_lr is not used), and past
 *                    total r > 1 keeps going: the lr climbs back up from 0
 *                    (stop at total, or use EM_LR_COSINE, which holds min_lr).
 *   EM_LR_CUSTOM:    base_lr * fn(s, ctx): fn returns a multiplier of base_lr,
 *                    as torch's LambdaLR lr_lambda does (so a Hugging Face
 *                    lambda ports as is, and base_lr stays the one knob).
 *                    fn must be a pure function of s (and ctx): the
 *                    Accelerator calls it with its optimizer-step count, so a
 *                    resumed run continues the schedule. A multiplier that is
 *                    NaN, infinite or negative is an error of em_lr_at naming
 *                    the step and the value.
 * Use:  em_optim_apply_schedule(o, &sched, step) before each step (each
 * group scaled from its own base lr, as torch), or em_optim_set_lr(o, -1,
 * em_lr_at(&sched, step)) for one value in every group. */
typedef enum em_lr_kind {
    EM_LR_CONSTANT = 0,
    EM_LR_WARMUP,
    EM_LR_COSINE,
    EM_LR_STEP,
    EM_LR_LINEAR,
    EM_LR_CUSTOM,
    EM_LR_COSINE_HF,
    EM_LR_LINEAR_HF = EM_LR_LINEAR /* the same schedule under the name that says whose */
} em_lr_kind;

/* EM_LR_CUSTOM's function: the multiplier of base_lr for step (>= 0). It may
 * be called any number of times for the same step, from the thread that
 * calls em_lr_at. */
typedef double (*em_lr_fn)(int64_t step, void *ctx);

struct em_lr_schedule {
    em_lr_kind kind;
    double base_lr;    /* >= 0 */
    double min_lr;     /* COSINE: the floor, 0 <= min_lr <= base_lr */
    int64_t warmup;    /* WARMUP: >= 1; COSINE, LINEAR, COSINE_HF: >= 0 */
    int64_t total;     /* COSINE: step where min_lr is reached; LINEAR,
                          COSINE_HF: step where the lr reaches 0; > warmup */
    int64_t step_size; /* STEP: >= 1 */
    double gamma;      /* STEP: >= 0 */
    /* CUSTOM: fn (not NULL) and its ctx (borrowed: it must outlive every
     * copy of the schedule, e.g. the one an Accelerator keeps). */
    em_lr_fn fn;
    void *ctx;
};

/* EM_OK, or EM_ERR_ARG naming the field and value that is out of range for
 * the kind (fields the kind does not use are ignored). */
em_status em_lr_schedule_check(const em_lr_schedule *s);
/* The lr at step (>= 0). NAN with EM_ERR_ARG for a bad schedule, step < 0,
 * or (EM_LR_CUSTOM) a multiplier that is not finite and >= 0. */
double em_lr_at(const em_lr_schedule *s, int64_t step);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
