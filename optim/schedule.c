/* schedule.c — learning-rate schedules as pure functions of the step:
 * constant, linear warm-up, warm-up then cosine decay (nanoGPT's get_lr),
 * step decay (torch StepLR), transformers' linear and cosine warm-up then
 * decay (get_linear_schedule_with_warmup, get_cosine_schedule_with_warmup)
 * and a user's function of the step (torch LambdaLR), each for any base lr
 * (a parameter group's: lr_at_base). Formulas in include/ember/optim.h. */
#include <math.h>

#include "optim_impl.h"

em_status em_lr_schedule_check(const em_lr_schedule *s)
{
    const char *fn = "em_lr_schedule";
    if (!s) return em_err(EM_ERR_ARG, "%s: schedule is NULL", fn);
    if (!(s->base_lr >= 0)) return em_err(EM_ERR_ARG, "%s: base_lr must be >= 0, got %g", fn, s->base_lr);
    switch (s->kind) {
    case EM_LR_CONSTANT: return EM_OK;
    case EM_LR_WARMUP:
        if (s->warmup < 1)
            return em_err(EM_ERR_ARG, "%s: warmup must be >= 1 for EM_LR_WARMUP, got %lld", fn,
                          (long long)s->warmup);
        return EM_OK;
    case EM_LR_COSINE:
        if (s->warmup < 0)
            return em_err(EM_ERR_ARG, "%s: warmup must be >= 0, got %lld", fn, (long long)s->warmup);
        if (s->total <= s->warmup)
            return em_err(EM_ERR_ARG, "%s: total must be > warmup, got total=%lld warmup=%lld", fn,
                          (long long)s->total, (long long)s->warmup);
        if (!(s->min_lr >= 0 && s->min_lr <= s->base_lr))
            return em_err(EM_ERR_ARG, "%s: min_lr must be in [0, base_lr=%g], got %g", fn, s->base_lr,
                          s->min_lr);
        return EM_OK;
    case EM_LR_STEP:
        if (s->step_size < 1)
            return em_err(EM_ERR_ARG, "%s: step_size must be >= 1, got %lld", fn, (long long)s->step_size);
        if (!(s->gamma >= 0)) return em_err(EM_ERR_ARG, "%s: gamma must be >= 0, got %g", fn, s->gamma);
        return EM_OK;
    case EM_LR_LINEAR:
    case EM_LR_COSINE_HF:
        if (s->warmup < 0)
            return em_err(EM_ERR_ARG, "%s: warmup must be >= 0, got %lld", fn, (long long)s->warmup);
        if (s->total <= s->warmup)
            return em_err(EM_ERR_ARG, "%s: total must be > warmup, got total=%lld warmup=%lld", fn,
                          (long long)s->total, (long long)s->warmup);
        return EM_OK;
    case EM_LR_CUSTOM:
        if (!s->fn) return em_err(EM_ERR_ARG, "%s: fn must be set for EM_LR_CUSTOM, got NULL", fn);
        return EM_OK;
    }
    return em_err(EM_ERR_ARG, "%s: unknown kind %d", fn, (int)s->kind);
}

/* The lr of checked schedule s at step >= 0 for base lr `base` and cosine
 * floor min_lr. Where transformers' LambdaLR computes base * lambda(s), so
 * does this, lambda first (its rounding). */
static double eval(const em_lr_schedule *s, double base, double min_lr, int64_t step)
{
    switch (s->kind) {
    case EM_LR_CONSTANT: return base;
    case EM_LR_WARMUP: /* lr = base (s+1)/warmup, then base */
        return step < s->warmup ? base * (double)(step + 1) / (double)s->warmup : base;
    case EM_LR_COSINE: { /* lr = min + (1 + cos(pi r))/2 (base - min), r = (s - warmup)/(total - warmup) */
        if (step < s->warmup) return base * (double)(step + 1) / (double)s->warmup;
        if (step >= s->total) return min_lr;
        double r = (double)(step - s->warmup) / (double)(s->total - s->warmup);
        return min_lr + 0.5 * (1.0 + cos(M_PI * r)) * (base - min_lr);
    }
    case EM_LR_STEP: /* lr = base gamma^floor(s / step_size) */
        return base * pow(s->gamma, (double)(step / s->step_size));
    case EM_LR_LINEAR: /* lr = base s/warmup, then base (total - s)/(total - warmup), then 0 */
        if (step < s->warmup) return base * ((double)step / (double)s->warmup);
        if (step >= s->total) return 0.0;
        return base * ((double)(s->total - step) / (double)(s->total - s->warmup));
    case EM_LR_COSINE_HF: { /* lr = base s/warmup, then base max(0, (1 + cos(pi r))/2), no floor */
        if (step < s->warmup) return base * ((double)step / (double)s->warmup);
        double r = (double)(step - s->warmup) / (double)(s->total - s->warmup);
        double f = 0.5 * (1.0 + cos(M_PI * r));
        return base * (f > 0 ? f : 0.0);
    }
    case EM_LR_CUSTOM: { /* lr = base fn(s) */
        double m = s->fn(step, s->ctx);
        if (!(isfinite(m) && m >= 0))
            return em_err(EM_ERR_ARG,
                          "em_lr_at: the schedule's fn returned %g for step %lld (a multiplier of base_lr "
                          "must be finite and >= 0)",
                          m, (long long)step),
                   NAN;
        return base * m;
    }
    }
    return NAN; /* unreachable: the check rejects unknown kinds */
}

double lr_at_base(const em_lr_schedule *s, double base, int64_t step)
{
    if (em_lr_schedule_check(s)) return NAN;
    if (step < 0) return em_err(EM_ERR_ARG, "em_lr_at: step must be >= 0, got %lld", (long long)step), NAN;
    /* min_lr keeps its fraction of the base: exactly s's own for s's base */
    double min_lr = base == s->base_lr ? s->min_lr : s->base_lr > 0 ? base * (s->min_lr / s->base_lr) : 0.0;
    return eval(s, base, min_lr, step);
}

double em_lr_at(const em_lr_schedule *s, int64_t step) { return lr_at_base(s, s ? s->base_lr : 0.0, step); }
