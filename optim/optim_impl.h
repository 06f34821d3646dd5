/* optim_impl.h — the inside of an optimizer, shared by optim/optim.c
 * (construction, groups, the update kernels) and optim/optim_state.c (state
 * save/load, gradient clipping). */
#ifndef EMBER_OPTIM_IMPL_H
#define EMBER_OPTIM_IMPL_H

#include "../tensor/tensor_impl.h"
#include "ember/optim.h"

typedef enum opt_kind { OPT_SGD = 0, OPT_ADAM, OPT_ADAMW } opt_kind;

/* Per-parameter state fields, in the order em_optim_state lists them, and
 * their names there ("state.<i>.<name>": torch's state_dict keys). */
enum { F_STEP = 0, F_EXP_AVG, F_EXP_AVG_SQ, F_MAX_EXP_AVG_SQ, F_MOMENTUM, F_COUNT };
extern const char *const opt_field_name[F_COUNT];

typedef struct oparam {
    em_tensor *h; /* the caller's handle (not owned) */
    int group;
    bool started;       /* has state (stepped once, or loaded) */
    tensor *f[F_COUNT]; /* state tensors, persistent, NULL until needed; on the
                         * parameter's device (F_STEP, a host scalar, on the CPU) */
    tensor *host[F_COUNT]; /* host copies of CUDA state handed out by em_optim_state */
    char name[F_COUNT][48];
    /* ZeRO (optim_set_piece): this rank updates only elements [lo, lo + n)
     * of the parameter (row-major; n may be 0), and its state fields other
     * than F_STEP have shape (n). The piece's gradient is gpiece (n
     * elements, the rank's reduced shard) or, when NULL, the parameter's
     * own gradient from element lo. */
    bool sharded;
    int64_t lo, n;
    tensor *gpiece;
    /* ZeRO offload: the piece's values, n elements on the host, which the
     * step updates (on the CPU, its state beside them) in place of the
     * parameter's own elements; the engine copies them in and out. NULL:
     * the parameter's elements from lo. */
    tensor *ppiece;
} oparam;

typedef struct ogroup {
    double lr, wd;
    double base_lr; /* the lr the group was made with (torch's initial_lr): what schedules scale */
} ogroup;

struct em_optimizer {
    opt_kind kind;
    em_sgd_config sgd;   /* OPT_SGD */
    em_adam_config adam; /* OPT_ADAM, OPT_ADAMW */
    int np, cap_p;
    oparam *p;
    int ng, cap_g;
    ogroup *g;
    tensor *step; /* 0-dim f64: completed em_optim_step calls */
    em_zero_grad_mode zero_grad_mode;
};

/* Which state fields a parameter of o has once started (F_STEP is the
 * per-parameter step of Adam, not the global "step"). */
static inline bool opt_has_field(const em_optimizer *o, int f)
{
    if (o->kind == OPT_SGD) return f == F_MOMENTUM && o->sgd.momentum != 0;
    return f == F_STEP || f == F_EXP_AVG || f == F_EXP_AVG_SQ || (f == F_MAX_EXP_AVG_SQ && o->adam.amsgrad);
}

/* The dtype state of a parameter of dtype dt is kept in: f64 for f64, else f32. */
static inline em_dtype opt_state_dtype(em_dtype dt) { return dt == EM_F64 ? EM_F64 : EM_F32; }

/* The shape of parameter i's state fields (other than F_STEP), whose
 * tensor is t: t's own, or (n) for a sharded parameter. */
static inline int opt_state_shape(const oparam *p, const tensor *t, int64_t *shape)
{
    if (p->sharded) {
        shape[0] = p->n;
        return 1;
    }
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    return t->ndim;
}

/* ZeRO (dist/zero.c): from now on this rank updates only elements [lo, lo +
 * n) of parameter i (a contiguous f32/f64 parameter, on the CPU or a CUDA
 * device; n may be 0), its gradient read from gpiece (a contiguous tensor
 * of n elements, the parameter's dtype and device, borrowed: it must
 * outlive the optimizer's use of it) or, when gpiece is NULL, from the
 * parameter's gradient at lo. Drops the parameter's state (it starts
 * fresh, shape (n) beside the parameter; em_optim_load_state gives it back
 * in the piece's shape). A CUDA piece is one launch of the fused update
 * (pieces are not fused with their neighbours). ppiece (offload; NULL
 * otherwise): the step updates ppiece (n contiguous elements of the
 * parameter's dtype, borrowed, usually on the host) instead of the
 * parameter's elements, with gpiece (required then, on ppiece's device)
 * as the gradient and the state allocated on ppiece's device. EM_ERR_ARG
 * for an index or range out of bounds, a gpiece or ppiece of another size,
 * dtype or device, or a ppiece without gpiece; EM_ERR_UNSUPPORTED for a
 * non-contiguous parameter. */
em_status optim_set_piece(em_optimizer *o, int i, int64_t lo, int64_t n, tensor *gpiece, tensor *ppiece);

/* The gradients of o's parameters were just zeroed (em_optim_zero_grad, or
 * ZeRO's zero_grad, which zeroes them its own way): in the set-to-none mode
 * they count as none from now on (em_has_grad false), else they stay. */
void optim_grads_zeroed(em_optimizer *o);

/* The checks em_optim_load_state makes of state (names, dtypes, shapes,
 * every field of a parameter that has one), without changing o: for a
 * caller that must know a load will succeed before it changes anything
 * else. Errors name fn. */
em_status optim_check_state(const em_optimizer *o, int n, const em_named *state, const char *fn);

/* em_optim_load_state, taking instead of copying each entry that can be
 * the optimizer's state as it is (a contiguous CPU tensor, persistent, of
 * the dtype and shape the state has, beside a CPU parameter): the
 * optimizer owns it from then on and its entry's t becomes NULL; the rest
 * is copied. So a loader that built the state itself does not hold it
 * twice. The same checks and errors; on failure nothing is taken. */
em_status optim_load_state_taking(em_optimizer *o, int n, em_named *state);

/* Allocates (zeroed) the missing state tensors of parameter i, whose tensor
 * is t. EM_ERR_OOM on failure (what was allocated stays, unused). */
em_status opt_alloc_state(em_optimizer *o, int i, tensor *t);

/* The lr schedule s gives at step for a parameter group whose base lr is
 * base (em_lr_at's value with base_lr := base, and COSINE's min_lr scaled
 * by base / s->base_lr; exactly em_lr_at's when base == s->base_lr). NAN
 * with the error set as em_lr_at. (optim/schedule.c) */
double lr_at_base(const em_lr_schedule *s, double base, int64_t step);

/* Gradient clipping's checks of cfg (EM_ERR_ARG naming fn): *p gets its
 * norm type (0 read as 2). And the refusal of a non-finite total under
 * error_if_nonfinite; where: "" or " (what is not finite)". For
 * em_clip_grad_norm_with and ZeRO's sharded clip (dist/zero.c). */
em_status opt_clip_check(const char *fn, const em_clip_config *cfg, double *p);
em_status opt_clip_refuse(const char *fn, double total, double p, const char *where);

/* gs[0,n) (CPU gradients; NULL entries skipped) *= c, each element by
 * grad_scale_elem (optim/update_math.h), over the pool: a contiguous
 * gradient of a float dtype of at most 64K elements one per task, a larger
 * one split by elements, any other (strided) CHUNK elements at a time
 * through buf (2048 doubles of scratch; unused, and may be NULL, when
 * every gradient is contiguous) on the calling thread. Each element is
 * scaled alone, so the bits do not depend on the split. Returns whether
 * any product was inf or NaN. Gradient clipping's scaling and the loss
 * scaler's unscale (amp/scaler.c). */
bool opt_scale_grads(tensor *const *gs, int n, double c, double *buf);
/* opt_scale_grads by c, then (c2 != 1: every gradient a contiguous f32
 * one) each product by c2 the same way in the same pass: the bits of two
 * calls (the loss scaler's unscale, then the clip's factor). */
bool opt_scale_grads2(tensor *const *gs, int n, double c, double c2, double *buf);

/* *acc = the p-norm's accumulation (update_math.h's norm_acc, joined by
 * norm_join) of n contiguous values at x (f64, else f32 each times pre in
 * f32, the product the loss scaler's unscale stores; pre 1: the values as
 * they are): fixed blocks of 64K values over the pool, 8 lanes a block
 * for p = 2, the blocks joined in order, so the bits do not depend on the
 * thread count; what clipping sums per gradient. ZeRO's gradient shard
 * (dist/zero.c). EM_ERR_OOM. */
em_status opt_norm_acc(const void *x, bool f64, int64_t n, double p, float pre, double *acc);

/* The loss scaler's unscale and gradient clipping in two passes over the
 * gradients instead of four (amp/scaler.c, em_scaler_unscale_clip): the
 * p-norm of the gradients times inv (the f32 products the unscale would
 * store, grad_scale_elem's) read in one pass, then every gradient
 * multiplied by inv and, where clipping scales, by the clip's factor in
 * another, each product as the two calls round it: the bits of
 * opt_scale_grads by inv, then em_clip_grad_norm_with. A total that is not
 * finite (some product is inf or NaN: f32 values' squares cannot sum past
 * a double's range) is found_inf: the gradients are only unscaled and
 * INFINITY is returned. vote (NULL: none) is called with ctx and that
 * finding between the passes, and may make it true (a collective every
 * rank makes). Takes (*taken) only p = 2 with every gradient a contiguous
 * f32 one on the CPU, or none; else touches nothing and returns NAN with
 * *status EM_OK, for the caller to unscale and clip the usual way. Errors
 * (*status): em_clip_grad_norm_with's, or vote's (the gradients then
 * untouched). */
typedef em_status (*opt_vote_fn)(void *ctx, bool *bad);
double opt_unscale_clip(int n, em_tensor *const *params, const em_clip_config *cfg, double inv,
                        opt_vote_fn vote, void *ctx, bool *taken, bool *found_inf, em_status *status);

/* Copies src (any device, dtype and strides, dst's shape) into contiguous
 * dst (any device): through the host when the devices differ. */
em_status opt_copy(tensor *dst, tensor *src);

/* Elements [lo, lo+n) of t (row-major order) into / out of a contiguous
 * array of dtype dt (converted; f16/bf16 rounded to nearest even on store). */
void opt_gather(const tensor *t, int64_t lo, int64_t n, em_dtype dt, void *dst);
void opt_scatter(tensor *t, int64_t lo, int64_t n, em_dtype dt, const void *src);

#endif
