/* cuda_util.c — what the CUDA tests share (declared in cuda_test.h): the
 * per-dtype tolerance, moving tensors between cuda:0 and the host, and the
 * CPU-against-CUDA comparison of an op's forward values and gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_test.h"

const em_dtype CT_FLOAT_DTYPES[4] = {EM_F32, EM_F64, EM_F16, EM_BF16};

double ct_tol(em_dtype dt)
{
    switch (dt) {
    case EM_F64: return 1e-10;
    case EM_F32: return 2e-5;
    case EM_F16: return 4e-3;
    default: return 3e-2;
    }
}

em_tensor *ct_on_cuda(em_tensor *t) { return em_to(t, em_device_cuda(0)); }
em_tensor *ct_on_cpu(em_tensor *t) { return em_to(t, em_device_cpu()); }

em_tensor *ct_randn(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    em_rng r = em_rng_new(seed);
    return em_cast(em_randn(EM_F64, ndim, shape, &r), dt);
}

double ct_max_abs(em_tensor *t)
{
    int64_t n = em_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1)), m = 0;
    em_to_array(t, EM_F64, v);
    for (int64_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
    free(v);
    return m;
}

void ct_check_close(const char *file, int line, const char *what, em_tensor *got, em_tensor *want, double tol)
{
    if (!got || !want) th_fail(file, line, "%s: NULL result: %s", what, em_last_error());
    em_tensor *g = ct_on_cpu(got);
    double scale = ct_max_abs(want), d = th_max_abs_diff(g, want);
    if (!(d <= tol * (scale > 1 ? scale : 1)))
        th_fail(file, line, "%s: max |cuda - cpu| = %g (max |cpu| %g, tol %g)", what, d, scale, tol);
}

void ct_cpu_vs_cuda(const char *file, int line, const char *what, ct_graph f, void *ctx, int n, em_tensor **in,
                    double tol)
{
    em_tensor *cin[8], *gin[8];
    for (int i = 0; i < n; i++) {
        bool fl = em_dtype_is_float(em_dtype_of(in[i]));
        cin[i] = em_detach(in[i]);
        gin[i] = ct_on_cuda(in[i]);
        if (!cin[i] || !gin[i]) th_fail(file, line, "%s: input %d: %s", what, i, em_last_error());
        if (fl && (em_set_requires_grad(cin[i], true) || em_set_requires_grad(gin[i], true)))
            th_fail(file, line, "%s: %s", what, em_last_error());
    }
    em_tensor *yc = f(cin, ctx), *yg = f(gin, ctx);
    if (!yc || !yg) th_fail(file, line, "%s: forward failed: %s", what, em_last_error());
    if (em_device_of(yg).type != EM_CUDA) th_fail(file, line, "%s: the CUDA result is not on the device", what);
    ct_check_close(file, line, what, yg, yc, tol);
    em_rng r = em_rng_new(99);
    int64_t shape[EM_MAX_DIMS];
    int nd = em_ndim(yc);
    for (int d = 0; d < nd; d++) shape[d] = em_size(yc, d);
    em_tensor *cot = em_randn(em_dtype_of(yc), nd, shape, &r);
    if (em_backward(yc, cot) || em_backward(yg, ct_on_cuda(cot)))
        th_fail(file, line, "%s: backward failed: %s", what, em_last_error());
    for (int i = 0; i < n; i++) {
        if (!em_dtype_is_float(em_dtype_of(in[i])) || !em_grad(cin[i])) continue;
        char buf[96];
        snprintf(buf, sizeof buf, "%s: gradient of input %d", what, i);
        ct_check_close(file, line, buf, em_grad(gin[i]), em_grad(cin[i]), tol);
    }
}
