/* optim_porting_rig.h — the parameters of tests/fixtures/optim_porting_ref.h
 * as a flattened module, gradients made by a real backward, and checks
 * against torch's trajectories; for test_optim_porting.c and
 * test_optim_porting_dist.c. Static functions of a test file (included
 * once per file). */
#ifndef EMBER_TESTS_OPTIM_PORTING_RIG_H
#define EMBER_TESTS_OPTIM_PORTING_RIG_H

#include <math.h>

#include "fixtures/optim_porting_ref.h"
#include "harness.h"

/* p0 (2,3), p1 (4), p2 (3) with PT_P0..2's values, parameters of m in that
 * order (flattened unless told: the flat gradient buffer gives every one a
 * gradient buffer, zeros, and no gradient: em_has_grad false). */
typedef struct prig {
    em_module *m;
    em_tensor *p[3];
    em_dtype dt;
} prig;

static inline em_tensor *pr_values(em_dtype dt, int ndim, const int64_t *shape, const double *v, double scale)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    double buf[16];
    for (int64_t i = 0; i < n; i++) buf[i] = v[i] * scale;
    em_tensor *t = em_from_data(EM_F64, ndim, shape, buf);
    if (dt == EM_F64 || !t) return t;
    em_tensor *c = em_cast(t, dt);
    if (!em_scope_depth()) em_free(t);
    return c;
}

static const int64_t pr_shape[3][2] = {{2, 3}, {4, 0}, {3, 0}};
static const int pr_ndim[3] = {2, 1, 1};
static const int pr_numel[3] = {6, 4, 3};

static inline void prig_init(prig *r, em_dtype dt, bool flatten)
{
    const double *v[3] = {PT_P0, PT_P1, PT_P2};
    static const char *names[3] = {"p0", "p1", "p2"};
    r->dt = dt;
    r->m = em_module_new(NULL, NULL);
    CHECK_NOTNULL(r->m);
    for (int i = 0; i < 3; i++) {
        r->p[i] = pr_values(dt, pr_ndim[i], pr_shape[i], v[i], 1.0);
        CHECK_NOTNULL(r->p[i]);
        CHECK_OK(em_module_add_param(r->m, names[i], r->p[i]));
    }
    if (flatten) CHECK_OK(em_module_flatten(r->m));
}

static inline void prig_free(prig *r) { em_module_free(r->m); }

/* loss = sum(p0 * g0 * scale) (+ sum(p1 * g1 * scale) when g1 is not
 * NULL): a backward gives p0 the gradient g0 * scale, p1 g1 * scale. In the
 * current scope. */
static inline em_tensor *prig_loss(prig *r, const double *g0, const double *g1, double scale)
{
    em_tensor *c0 = pr_values(r->dt, pr_ndim[0], pr_shape[0], g0, scale);
    em_tensor *loss = em_sum(em_mul(r->p[0], c0), 0, NULL, false);
    if (g1) {
        em_tensor *c1 = pr_values(r->dt, pr_ndim[1], pr_shape[1], g1, scale);
        loss = em_add(loss, em_sum(em_mul(r->p[1], c1), 0, NULL, false));
    }
    CHECK_NOTNULL(loss);
    return loss;
}

static inline void prig_backward(prig *r, const double *g0, const double *g1, double scale)
{
    em_scope s = em_scope_begin();
    CHECK_OK(em_backward(prig_loss(r, g0, g1, scale), NULL));
    em_scope_end(s);
}

/* The first n parameters' values (in order) against want within tol *
 * max(1, |want|). */
static inline void prig_check(prig *r, int n, const double *want, double tol, const char *what, int k)
{
    double got[13];
    int at = 0;
    for (int i = 0; i < n; i++) {
        CHECK_OK(em_to_array(r->p[i], EM_F64, got + at));
        at += pr_numel[i];
    }
    for (int i = 0; i < at; i++)
        if (!(fabs(got[i] - want[i]) <= tol * fmax(1.0, fabs(want[i]))))
            th_fail(__FILE__, __LINE__, "%s: after step %d, element %d = %.12g, want %.12g (tol %g)", what, k,
                    i, got[i], want[i], tol);
}

static inline double pr_tol(em_dtype dt) { return dt == EM_F64 ? 1e-12 : 1e-6; }

#endif
