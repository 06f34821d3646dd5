/* elementwise_formulas.h — every elementwise op's per-element maths, once:
 * forward f(x), backward g * f'(x, y), binary arithmetic and x*m + s.
 *
 * Not a header to include directly: elementwise_math.h includes it once per
 * flavour, with EW_T the number type, EW_FN(name) the flavoured function
 * name, and EW_EXP, EW_TANH, EW_NORMAL, EW_SIGMOID, EW_POW, EW_LOG, EW_SQRT,
 * EW_ABS, EW_MUL_ADD the primitives (see there; EW_NORMAL(x, &pdf) returns
 * the normal distribution function Phi(x) and puts its density phi(x) in
 * pdf, from one exponential where the flavour can). Constants are written as
 * EW_C(v), v converted to EW_T, so one text is the same arithmetic as the
 * double and the float formulas written out by hand.
 *
 * Adding a unary op: its case in ew_unary and in ew_unary_grad. A switch
 * has no default: -Wswitch-enum (on for this file) makes a missing case a
 * compile error. */
#define EW_C(v) ((EW_T)(v))

#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch-enum"

/* gelu (k UN_GELU) or gelu_tanh (else) of x, and into *slope its dy/dx
 * at x, from one Phi (or one exponential): ew_unary's and ew_gelu_slope's
 * formulas, which call this and keep the half they need (the compiler
 * drops the other). The CPU's recording forward keeps both
 * (tensor/ops_unary.c); backward then multiplies by the slope with the
 * bits ew_unary_grad's g * slope would have. */
static EM_HD inline EW_T EW_FN(ew_gelu_both)(unop k, EW_T x, EW_T *slope)
{
    if (k == UN_GELU) {
        /* x Phi(x); x held at -40 below, where Phi is 0 (in f32 and f64), so gelu(-inf) = -0 */
        EW_T pdf, cdf = EW_NORMAL(x, &pdf);
        /* Phi(x) + x phi(x); x phi(x) is 0 where phi is, so the infinities give 0 and 1 */
        *slope = cdf + (pdf == EW_C(0) ? EW_C(0) : x * pdf);
        return (x < EW_C(-40) ? EW_C(-40) : x) * cdf;
    }
    /* x (1 + tanh u)/2 with u = k(x + c x^3), written as x sigma(2u) = x / (1 + e^-2u): one exp and one
     * division, no tanh (e^-2u = inf gives x/inf = 0, as tanh = -1 does); the slope, with s = sigma(2u) =
     * (1 + tanh u)/2: s + 2 x s (1 - s) u' */
    EW_T e = EW_EXP(EW_C(-2) * EW_C(EW_GELU_K) * (x + EW_C(EW_GELU_C) * x * x * x));
    EW_T s = EW_C(1) / (EW_C(1) + e);
    *slope =
        s + EW_C(2) * x * s * (EW_C(1) - s) * EW_C(EW_GELU_K) * (EW_C(1) + EW_C(3) * EW_C(EW_GELU_C) * x * x);
    return x / (EW_C(1) + e);
}

/* gelu's or gelu_tanh's dy/dx at x (k one of the two) */
static EM_HD inline EW_T EW_FN(ew_gelu_slope)(unop k, EW_T x)
{
    EW_T slope;
    (void)EW_FN(ew_gelu_both)(k, x, &slope);
    return slope;
}

/* f(x); p is pow_scalar's power */
static EM_HD inline EW_T EW_FN(ew_unary)(unop k, EW_T x, EW_T p)
{
    switch (k) {
    case UN_POW_SCALAR: return EW_POW(x, p);
    case UN_EXP: return EW_EXP(x);
    case UN_LOG: return EW_LOG(x);
    case UN_SQRT: return EW_SQRT(x);
    case UN_RSQRT: return EW_C(1) / EW_SQRT(x);
    case UN_ABS: return EW_ABS(x);
    case UN_TANH: return EW_TANH(x);
    case UN_SIGMOID: return EW_SIGMOID(x);
    case UN_RELU: return x > 0 ? x : EW_C(0);
    case UN_GELU:
    case UN_GELU_TANH: {
        EW_T slope; /* unused: the compiler drops its arithmetic */
        return EW_FN(ew_gelu_both)(k, x, &slope);
    }
    case UN_SILU: return x * EW_SIGMOID(x);
    }
    return (EW_T)NAN; /* not reached: every op has its case */
}

/* g * dy/dx, from the input x and the output y (whichever the derivative
 * is cheaper from); p is pow_scalar's power. g multiplies last, except
 * where the order below is the one the CPU's fast loops always had. */
static EM_HD inline EW_T EW_FN(ew_unary_grad)(unop k, EW_T x, EW_T y, EW_T g, EW_T p)
{
    switch (k) {
    case UN_POW_SCALAR: return g * (p == 0 ? EW_C(0) : p * EW_POW(x, p - 1)); /* d x^p = p x^(p-1) */
    case UN_EXP: return g * y;                                                /* d e^x = e^x */
    case UN_LOG: return g * (EW_C(1) / x);                                    /* d log x = 1/x */
    case UN_SQRT: return g * (EW_C(0.5) / y);                                 /* 1/(2 sqrt x) */
    case UN_RSQRT: return g * (EW_C(-0.5) * y * y * y);                       /* -x^-3/2 / 2 */
    case UN_ABS: return g * (x > 0 ? EW_C(1) : x < 0 ? EW_C(-1) : EW_C(0));   /* sign(x), 0 at 0 */
    case UN_TANH: return g * (EW_C(1) - y * y);                               /* 1 - tanh^2 */
    case UN_SIGMOID: return g * y * (EW_C(1) - y);                            /* s (1 - s) */
    case UN_RELU: return x > 0 ? g : EW_C(0);                                 /* 0 at 0 */
    case UN_GELU:
    case UN_GELU_TANH: return g * EW_FN(ew_gelu_slope)(k, x);
    case UN_SILU: { /* d x s(x) = s (1 + x (1 - s)) */
        EW_T s = EW_SIGMOID(x);
        return g * s * (EW_C(1) + x * (EW_C(1) - s));
    }
    }
    return (EW_T)NAN; /* not reached: every op has its case */
}

/* x <op> y */
static EM_HD inline EW_T EW_FN(ew_binary)(binop k, EW_T x, EW_T y)
{
    switch (k) {
    case BIN_ADD: return x + y;
    case BIN_SUB: return x - y;
    case BIN_MUL: return x * y;
    case BIN_DIV: return x / y;
    }
    return (EW_T)NAN; /* not reached: every op has its case */
}

/* x*m + s: add_scalar (m = 1), mul_scalar (s = 0), neg (m = -1) */
static EM_HD inline EW_T EW_FN(ew_affine)(EW_T x, EW_T m, EW_T s) { return EW_MUL_ADD(x, m, s); }

#pragma GCC diagnostic pop

#undef EW_C
#undef EW_T
#undef EW_FN
#undef EW_EXP
#undef EW_TANH
#undef EW_NORMAL
#undef EW_SIGMOID
#undef EW_POW
#undef EW_LOG
#undef EW_SQRT
#undef EW_ABS
#undef EW_MUL_ADD
