/* ops_unary.c — elementwise maths on one tensor: pow_scalar, exp, log, sqrt,
 * rsqrt, abs, tanh, sigmoid, relu, gelu (exact and tanh form), silu.
 *
 * One driver serves every op: a kernel with a contiguous-f32 fast path and a
 * general strided path (ld/st; f16/bf16 computed in f32, f64 in f64), and one
 * backward kernel gx = g * f'(x, y) that reads the saved input x and output y
 * (whichever the derivative is cheaper from). On a CUDA device both run
 * through tensor/ops_elementwise.cu with the same formulas. */
#include "tensor_impl.h"
#include "vmath_impl.h"
#if EM_HAVE_CUDA
#include "cuda_elementwise.h"
#endif

typedef enum {
    U_POW,
    U_EXP,
    U_LOG,
    U_SQRT,
    U_RSQRT,
    U_ABS,
    U_TANH,
    U_SIGMOID,
    U_RELU,
    U_GELU,
    U_GELU_TANH,
    U_SILU
} unop;
static const char *unop_name[] = {"pow_scalar", "exp",     "log",  "sqrt", "rsqrt",     "abs",
                                  "tanh",       "sigmoid", "relu", "gelu", "gelu_tanh", "silu"};

#define GELU_K 0.7978845608028654 /* sqrt(2/pi) */
#define GELU_C 0.044715
#define INV_SQRT2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

/* ---- scalar maths, in double (f64) and float (everything else) ------------------ */

/* sigmoid(x) = 1/(1+e^-x), written so that exp never overflows */
static inline double sigm(double x)
{
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
static inline float sigmf(float x) { return vsigmoidf(x); }

static inline double fwd(unop k, double x, double p)
{
    switch (k) {
    case U_POW: return pow(x, p);
    case U_EXP: return exp(x);
    case U_LOG: return log(x);
    case U_SQRT: return sqrt(x);
    case U_RSQRT: return 1.0 / sqrt(x);
    case U_ABS: return fabs(x);
    case U_TANH: return tanh(x);
    case U_SIGMOID: return sigm(x);
    case U_RELU: return x > 0 ? x : 0.0;
    case U_GELU: return 0.5 * x * (1.0 + erf(x * INV_SQRT2)); /* x Phi(x) */
    case U_GELU_TANH: return 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_C * x * x * x)));
    default: return x * sigm(x); /* silu */
    }
}

static inline float fwdf(unop k, float x, float p)
{
    switch (k) {
    case U_POW: return powf(x, p);
    case U_EXP: return vexpf(x);
    case U_LOG: return logf(x);
    case U_SQRT: return sqrtf(x);
    case U_RSQRT: return 1.0f / sqrtf(x);
    case U_ABS: return fabsf(x);
    case U_TANH: return vtanhf(x);
    case U_SIGMOID: return sigmf(x);
    case U_RELU: return x > 0 ? x : 0.0f;
    case U_GELU: return 0.5f * x * (1.0f + verff(x * (float)INV_SQRT2));
    case U_GELU_TANH: return 0.5f * x * (1.0f + vtanhf((float)GELU_K * (x + (float)GELU_C * x * x * x)));
    default: return x * sigmf(x);
    }
}

/* dy/dx from the input x and the output y (p: the power of pow_scalar) */
static inline double deriv(unop k, double x, double y, double p)
{
    switch (k) {
    case U_POW: return p == 0 ? 0.0 : p * pow(x, p - 1); /* d x^p = p x^(p-1) */
    case U_EXP: return y;                                /* d e^x = e^x */
    case U_LOG: return 1.0 / x;                          /* d log x = 1/x */
    case U_SQRT: return 0.5 / y;                         /* d sqrt x = 1/(2 sqrt x) */
    case U_RSQRT: return -0.5 * y * y * y;               /* d x^-1/2 = -x^-3/2 / 2 */
    case U_ABS: return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; /* sign(x), 0 at 0 */
    case U_TANH: return 1.0 - y * y;                     /* d tanh = 1 - y^2 */
    case U_SIGMOID: return y * (1.0 - y);                /* d sigma = y (1 - y) */
    case U_RELU: return x > 0 ? 1.0 : 0.0;               /* 0 at 0 */
    case U_GELU:                                         /* Phi(x) + x phi(x) */
        return 0.5 * (1.0 + erf(x * INV_SQRT2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x);
    case U_GELU_TANH: { /* u = k(x + c x^3), t = tanh u */
        double t = tanh(GELU_K * (x + GELU_C * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
    }
    default: { /* d x s(x) = s (1 + x (1 - s)) */ double s = sigm(x); return s * (1.0 + x * (1.0 - s));
    }
    }
}

static inline float derivf(unop k, float x, float y, float p)
{
    switch (k) {
    case U_POW: return p == 0 ? 0.0f : p * powf(x, p - 1);
    case U_EXP: return y;
    case U_LOG: return 1.0f / x;
    case U_SQRT: return 0.5f / y;
    case U_RSQRT: return -0.5f * y * y * y;
    case U_ABS: return x > 0 ? 1.0f : x < 0 ? -1.0f : 0.0f;
    case U_TANH: return 1.0f - y * y;
    case U_SIGMOID: return y * (1.0f - y);
    case U_RELU: return x > 0 ? 1.0f : 0.0f;
    case U_GELU:
        return 0.5f * (1.0f + verff(x * (float)INV_SQRT2)) + x * (float)INV_SQRT_2PI * vexpf(-0.5f * x * x);
    case U_GELU_TANH: {
        float t = vtanhf((float)GELU_K * (x + (float)GELU_C * x * x * x));
        return 0.5f * (1.0f + t) +
               0.5f * x * (1.0f - t * t) * (float)GELU_K * (1.0f + 3.0f * (float)GELU_C * x * x);
    }
    default: {
        float s = sigmf(x);
        return s * (1.0f + x * (1.0f - s));
    }
    }
}

/* ---- kernels ----------------------------------------------------------------------- */

typedef struct un_ctx {
    unop k;
    double p;
    tensor *out, *x; /* forward: out = f(x) */
    tensor *g, *y;   /* backward: out = g * f'(x, y); y is contiguous */
} un_ctx;

/* Contiguous f32: one loop per op, so each inner loop is branch-free. */
static void fwd_flat_f32(unop k, const float *x, float *o, int64_t lo, int64_t hi, float p)
{
    switch (k) {
    case U_POW:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_POW, x[i], p);
        break;
    case U_EXP:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_EXP, x[i], p);
        break;
    case U_LOG:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_LOG, x[i], p);
        break;
    case U_SQRT:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_SQRT, x[i], p);
        break;
    case U_RSQRT:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_RSQRT, x[i], p);
        break;
    case U_ABS:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_ABS, x[i], p);
        break;
    case U_TANH:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_TANH, x[i], p);
        break;
    case U_SIGMOID:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_SIGMOID, x[i], p);
        break;
    case U_RELU:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_RELU, x[i], p);
        break;
    case U_GELU:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_GELU, x[i], p);
        break;
    case U_GELU_TANH:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_GELU_TANH, x[i], p);
        break;
    case U_SILU:
        for (int64_t i = lo; i < hi; i++) o[i] = fwdf(U_SILU, x[i], p);
        break;
    }
}

static void fwd_range(void *ctx, int64_t lo, int64_t hi)
{
    un_ctx *c = ctx;
    tensor *x = c->x;
    em_dtype dt = x->dtype;
    if (dt == EM_F32 && t_is_contig(x)) {
        fwd_flat_f32(c->k, t_ptr(x), t_ptr(c->out), lo, hi, (float)c->p);
        return;
    }
    size_t es = t_esize(x);
    char *o = t_ptr(c->out);
    const char *xp = t_ptr(x);
    nditer it;
    nditer_init(&it, x->ndim, x->shape, 1, (const int64_t *[]){x->stride});
    nditer_seek(&it, lo);
    bool dbl = dt == EM_F64 || !em_dtype_is_float(dt); /* f64 and integers (abs) in double */
    for (int64_t i = lo; i < hi; i++) {
        double v = ld(dt, xp + it.off[0] * (int64_t)es);
        v = dbl ? fwd(c->k, v, c->p) : fwdf(c->k, (float)v, (float)c->p);
        st(dt, o + i * (int64_t)es, v);
        nditer_next(&it);
    }
}

/* out (contiguous, x's dtype) = g * f'(x, y) */
/* Contiguous f32 backward, o = g * f'(x, y): the switch sits outside the
 * loops so each loop vectorises (gelu_tanh, the GPT's, is the hot one). */
static void bwd_flat_f32(unop k, const float *x, const float *y, const float *g, float *o, int64_t lo,
                         int64_t hi, float p)
{
    switch (k) {
    case U_GELU_TANH:
        for (int64_t i = lo; i < hi; i++) {
            float v = x[i], t = vtanhf((float)GELU_K * (v + (float)GELU_C * v * v * v));
            o[i] = g[i] * (0.5f * (1.0f + t) +
                           0.5f * v * (1.0f - t * t) * (float)GELU_K * (1.0f + 3.0f * (float)GELU_C * v * v));
        }
        break;
    case U_GELU: /* Phi(x) + x phi(x) */
        for (int64_t i = lo; i < hi; i++) {
            float v = x[i];
            o[i] = g[i] * (0.5f * (1.0f + verff(v * (float)INV_SQRT2)) +
                           v * (float)INV_SQRT_2PI * vexpf(-0.5f * v * v));
        }
        break;
    case U_RELU:
        for (int64_t i = lo; i < hi; i++) o[i] = x[i] > 0 ? g[i] : 0.0f;
        break;
    case U_TANH:
        for (int64_t i = lo; i < hi; i++) o[i] = g[i] * (1.0f - y[i] * y[i]);
        break;
    case U_SIGMOID:
        for (int64_t i = lo; i < hi; i++) o[i] = g[i] * y[i] * (1.0f - y[i]);
        break;
    case U_EXP:
        for (int64_t i = lo; i < hi; i++) o[i] = g[i] * y[i];
        break;
    case U_SILU:
        for (int64_t i = lo; i < hi; i++) {
            float sg = vsigmoidf(x[i]);
            o[i] = g[i] * sg * (1.0f + x[i] * (1.0f - sg));
        }
        break;
    default:
        for (int64_t i = lo; i < hi; i++) o[i] = g[i] * derivf(k, x[i], y[i], p);
    }
}

static void bwd_range(void *ctx, int64_t lo, int64_t hi)
{
    un_ctx *c = ctx;
    tensor *x = c->x, *g = c->g, *y = c->y;
    em_dtype dt = x->dtype;
    if (dt == EM_F32 && g->dtype == EM_F32 && t_is_contig(x) && t_is_contig(g)) {
        const float *xv = t_ptr(x), *gv = t_ptr(g), *yv = t_ptr(y);
        float *o = t_ptr(c->out), p = (float)c->p;
        bwd_flat_f32(c->k, xv, yv, gv, o, lo, hi, p);
        return;
    }
    size_t es = t_esize(x), gs = t_esize(g);
    char *o = t_ptr(c->out);
    const char *xp = t_ptr(x), *gp = t_ptr(g), *yp = t_ptr(y);
    nditer it;
    nditer_init(&it, x->ndim, x->shape, 2, (const int64_t *[]){x->stride, g->stride});
    nditer_seek(&it, lo);
    for (int64_t i = lo; i < hi; i++) {
        double xv = ld(dt, xp + it.off[0] * (int64_t)es), yv = ld(dt, yp + i * (int64_t)es);
        double gv = ld(g->dtype, gp + it.off[1] * (int64_t)gs);
        double d = dt == EM_F64 ? deriv(c->k, xv, yv, c->p) : derivf(c->k, (float)xv, (float)yv, (float)c->p);
        st(dt, o + i * (int64_t)es, gv * d);
        nditer_next(&it);
    }
}

#if EM_HAVE_CUDA
static const cu_unop cu_of[] = {[U_POW] = CU_POW,
                                [U_EXP] = CU_EXP,
                                [U_LOG] = CU_LOG,
                                [U_SQRT] = CU_SQRT,
                                [U_RSQRT] = CU_RSQRT,
                                [U_ABS] = CU_ABS,
                                [U_TANH] = CU_TANH,
                                [U_SIGMOID] = CU_SIGMOID,
                                [U_RELU] = CU_RELU,
                                [U_GELU] = CU_GELU,
                                [U_GELU_TANH] = CU_GELU_TANH,
                                [U_SILU] = CU_SILU};
#endif

static em_status unary_backward(node *n, tensor *g)
{
    tensor *x = n->in[0];
    tensor *gx = t_new_like(x);
    if (!gx) return em_last_status();
    unop k = (unop)n->ip[0];
#if EM_HAVE_CUDA
    if (t_on_cuda(x)) {
        em_status s = t_same_device(unop_name[k], 2, (tensor *[]){x, g}, NULL);
        if (s) return s;
        cu_walk w;
        cu_walk_of(&w, gx, 3, (const tensor *[]){gx, x, g});
        s = cu_unary_backward(x->device.index, cu_of[k], &w, x->dtype, t_ptr(gx), t_ptr(x), t_ptr(n->out),
                              g->dtype, t_ptr(g), n->dp[0]);
        return s ? s : ag_accum(x, gx);
    }
#endif
    un_ctx c = {.k = k, .p = n->dp[0], .out = gx, .x = x, .g = g, .y = n->out};
    parallel_for(t_numel(x), 1 << 13, bwd_range, &c);
    return ag_accum(x, gx);
}

/* out (contiguous, x's shape) = f(x), on x's device */
static em_status unary_run(unop k, double p, tensor *out, tensor *x)
{
#if EM_HAVE_CUDA
    if (t_on_cuda(x)) {
        cu_walk w;
        cu_walk_of(&w, out, 2, (const tensor *[]){out, x});
        return cu_unary(x->device.index, cu_of[k], &w, x->dtype, t_ptr(out), t_ptr(x), p, 0.0);
    }
#endif
    un_ctx c = {.k = k, .p = p, .out = out, .x = x};
    parallel_for(t_numel(x), 1 << 13, fwd_range, &c);
    return EM_OK;
}

static tensor *unary(unop k, tensor *x, double p)
{
    const char *name = unop_name[k];
    if (!x) return NULL;
    if (k == U_ABS) {
        if (x->dtype == EM_BOOL)
            return em_fail(EM_ERR_DTYPE, "abs: does not take bool tensors, got bool%s", shp(x));
    } else if (!chk_float(name, x)) {
        return NULL;
    }
    tensor *out = t_new_like(x);
    if (!out) return NULL;
    if (unary_run(k, p, out, x)) return NULL;
    if (ag_needed(1, &x)) {
        node *n = ag_record(name, unary_backward, out, 1, &x);
        if (!n) return NULL;
        n->ip[0] = k;
        n->dp[0] = p;
    }
    return out;
}

/* ---- public wrappers ------------------------------------------------------------------ */

static em_tensor *pub1(unop k, em_tensor *h, double p)
{
    tensor *x = t_resolve(h, unop_name[k]);
    return x ? t_handle(unary(k, x, p)) : NULL;
}

em_tensor *em_pow_scalar(em_tensor *a, double p) { return pub1(U_POW, a, p); }
em_tensor *em_exp(em_tensor *a) { return pub1(U_EXP, a, 0); }
em_tensor *em_log(em_tensor *a) { return pub1(U_LOG, a, 0); }
em_tensor *em_sqrt(em_tensor *a) { return pub1(U_SQRT, a, 0); }
em_tensor *em_rsqrt(em_tensor *a) { return pub1(U_RSQRT, a, 0); }
em_tensor *em_abs(em_tensor *a) { return pub1(U_ABS, a, 0); }
em_tensor *em_tanh(em_tensor *a) { return pub1(U_TANH, a, 0); }
em_tensor *em_sigmoid(em_tensor *a) { return pub1(U_SIGMOID, a, 0); }
em_tensor *em_relu(em_tensor *a) { return pub1(U_RELU, a, 0); }
em_tensor *em_gelu(em_tensor *a) { return pub1(U_GELU, a, 0); }
em_tensor *em_gelu_tanh(em_tensor *a) { return pub1(U_GELU_TANH, a, 0); }
em_tensor *em_silu(em_tensor *a) { return pub1(U_SILU, a, 0); }
