/* update_math_t.h — the body of update_math.h for one compute type: UM_T
 * (float or double), UM_K the name of its coefficient struct, UM_SQRT its
 * square root, UM_(name) a name with the type's suffix. Include
 * update_math.h, never this. */

/* The coefficients of a step in UM_T, each rounded once from opt_coef. */
typedef struct UM_K {
    UM_T lr, wd;        /* all */
    UM_T mom, omd;      /* SGD: momentum, 1 - dampening */
    UM_T b1, omb1;      /* Adam/AdamW: beta1, 1 - beta1 */
    UM_T b2, omb2, eps; /* beta2, 1 - beta2, eps */
    UM_T ss, bc2s;      /* step_size, bc2_sqrt */
    UM_T decay;         /* AdamW: 1 - lr wd */
    UM_T gsign;         /* maximize: -1, else 1 */
} UM_K;

static inline EM_HD UM_K UM_(opt_k_of)(const opt_coef *c)
{
    UM_K k;
    k.lr = (UM_T)c->lr;
    k.wd = (UM_T)c->wd;
    k.mom = (UM_T)c->mom;
    k.omd = (UM_T)(1.0 - c->damp);
    k.b1 = (UM_T)c->b1;
    k.omb1 = (UM_T)(1.0 - c->b1);
    k.b2 = (UM_T)c->b2;
    k.omb2 = (UM_T)(1.0 - c->b2);
    k.eps = (UM_T)c->eps;
    k.ss = (UM_T)c->step_size;
    k.bc2s = (UM_T)c->bc2_sqrt;
    k.decay = (UM_T)c->decay;
    k.gsign = c->maximize ? (UM_T)-1 : (UM_T)1;
    return k;
}

/* SGD on one element: the new p. momentum: buf is the element's momentum
 * buffer (read unless first, written; not touched otherwise, so it may be
 * NULL); decay: wd != 0 (decided in double, from opt_coef); maximize: -g,
 * as g times gsign (a value the compiler does not know, so it cannot fold
 * the sign into a fused multiply-add one way here and another way in a
 * vectorised loop: every build rounds alike). */
static inline EM_HD UM_T UM_(sgd_elem)(const UM_K *k, UM_T p, UM_T g, UM_T *buf, bool momentum, bool decay,
                                       bool first, bool nesterov, bool maximize)
{
    UM_T d = maximize ? g * k->gsign : g;
    if (decay) d += k->wd * p;
    if (momentum) {
        UM_T b = first ? d : k->mom * *buf + k->omd * d;
        *buf = b;
        d = nesterov ? d + k->mom * b : b;
    }
    return p - k->lr * d;
}

/* Adam / AdamW on one element: the new p; *m and *v advanced, and under
 * amsgrad *vmax (NULL otherwise) := max(*vmax, v), NaN winning as in
 * torch.maximum; maximize: -g (as sgd_elem). */
static inline EM_HD UM_T UM_(adam_elem)(const UM_K *k, UM_T p, UM_T g, UM_T *m, UM_T *v, UM_T *vmax, bool l2,
                                        bool decoupled, bool amsgrad, bool maximize)
{
    if (maximize) g *= k->gsign;
    if (decoupled) p *= k->decay;
    if (l2) g += k->wd * p;
    UM_T mi = k->b1 * *m + k->omb1 * g;
    UM_T vi = k->b2 * *v + k->omb2 * g * g;
    *m = mi, *v = vi;
    if (amsgrad) {
        UM_T mx = *vmax;
        vi = mx > vi || mx != mx ? mx : vi;
        *vmax = vi;
    }
    return p - k->ss * (mi / (UM_SQRT(vi) / k->bc2s + k->eps));
}
