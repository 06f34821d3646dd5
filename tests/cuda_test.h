/* cuda_test.h — shared by the CUDA tests: skip without a device, and
 * compare a CUDA result with the CPU's. */
#ifndef EMBER_CUDA_TEST_H
#define EMBER_CUDA_TEST_H

#include "ember/ember.h"
#include "harness.h"

/* Skips the test, visibly, where no CUDA device is visible (CI has none). */
#define CUDA_OR_SKIP()                                                                                            \
    do {                                                                                                          \
        if (em_cuda_device_count() == 0) SKIP("no CUDA device visible (GPU test)");                              \
    } while (0)

/* ---- shared helpers (tests/cuda_util.c) ---------------------------------- */

/* the float dtypes, f32 first */
extern const em_dtype CT_FLOAT_DTYPES[4];
/* relative tolerance per dtype: the CPU and the device sum in different orders */
double ct_tol(em_dtype dt);
em_tensor *ct_on_cuda(em_tensor *t); /* em_to cuda:0 */
em_tensor *ct_on_cpu(em_tensor *t);  /* em_to the host */
/* standard normal values (drawn in f64 from seed), cast to dt, on the host */
em_tensor *ct_randn(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed);
/* max |t| over t's elements (t on any device) */
double ct_max_abs(em_tensor *t);
/* got (any device) agrees with want (host) within tol * max(1, max |want|) */
void ct_check_close(const char *file, int line, const char *what, em_tensor *got, em_tensor *want, double tol);

typedef em_tensor *(*ct_graph)(em_tensor **in, void *ctx);
/* Runs f on in[0..n) (host tensors, n <= 8; the float ones become leaves
 * requiring a gradient) on the CPU and on cuda:0, backpropagates one random
 * cotangent through both, and compares the outputs and every float input's
 * gradient (those the CPU gives one). */
void ct_cpu_vs_cuda(const char *file, int line, const char *what, ct_graph f, void *ctx, int n, em_tensor **in,
                    double tol);
#define CPU_VS_CUDA(what, f, ctx, n, in, tol) ct_cpu_vs_cuda(__FILE__, __LINE__, (what), (f), (ctx), (n), (in), (tol))

#endif
