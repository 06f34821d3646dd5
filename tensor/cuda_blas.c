/* cuda_blas.c — ember's products on a CUDA device: cu_matmul, the one
 * cuBLAS call ember makes, and the loading of cuBLAS itself, opened when a
 * device first multiplies (cublas_api.h says why) or, under the CUDA
 * emulator, the emulator's functions. Host code only, so it is C (the
 * kernels' .cu files never call cuBLAS). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cublas_api.h"
#include "cuda_matmul.h"
#include "ember_config.h"
#include "tensor_impl.h"

#define STR_(x) #x
#define STR(x) STR_(x) /* the name after macro expansion: cublasCreate -> "cublasCreate_v2" */

static cublas_api api;
static bool loaded;
static em_status load_status;
static char load_error[1200];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* err (n bytes) = the message, cut short if it does not fit */
static void say(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* *slot = symbol `sym` of library h; false (and why, in err) when absent */
static bool resolve(void *h, const char *name, const char *sym, void **slot, char *err, size_t n)
{
    *slot = dlsym(h, sym);
    if (*slot) return true;
    say(err, n, "%s has no symbol %s", name, sym);
    return false;
}

/* the table from library file `name` into *out; false and why in err */
static bool load_from(const char *name, cublas_api *out, char *err, size_t n)
{
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        say(err, n, "%s", why ? why : name);
        return false;
    }
    cublas_api t;
    bool ok =
        resolve(h, name, STR(cublasCreate), (void **)&t.create, err, n) &&
        resolve(h, name, STR(cublasSetStream), (void **)&t.set_stream, err, n) &&
        resolve(h, name, STR(cublasSetMathMode), (void **)&t.set_math_mode, err, n) &&
        resolve(h, name, STR(cublasGemmStridedBatchedEx), (void **)&t.gemm_strided_batched_ex, err, n) &&
        resolve(h, name, STR(cublasGetStatusString), (void **)&t.status_string, err, n);
    if (!ok) {
        dlclose(h);
        return false;
    }
    *out = t;
    return true;
}

#if EM_CUDA_SIM
static void load_once(void)
{
    api = (cublas_api){cublasCreate, cublasSetStream, cublasSetMathMode, cublasGemmStridedBatchedEx,
                       cublasGetStatusString};
    __atomic_store_n(&loaded, true, __ATOMIC_RELEASE);
}
#else
/* The toolkit's soname first (found as the dynamic loader finds it: the
 * library's run path, which the build sets to the toolkit's lib64,
 * LD_LIBRARY_PATH, ldconfig's cache), then the file in the toolkit the
 * build used. */
static void load_once(void)
{
    const char *soname = "libcublas.so." STR(CUBLAS_VER_MAJOR);
    char path[512], why[2][512];
    say(path, sizeof path, "%s/%s", EM_CUDA_LIBDIR, soname);
    const char *names[2] = {soname, path};
    for (int i = 0; i < 2; i++)
        if (load_from(names[i], &api, why[i], sizeof why[i])) {
            __atomic_store_n(&loaded, true, __ATOMIC_RELEASE);
            return;
        }
    say(load_error, sizeof load_error, "cuBLAS could not be loaded: %s; %s", why[0], why[1]);
    load_status = EM_ERR_DEVICE;
}
#endif

const cublas_api *cublas_get(void)
{
    pthread_once(&once, load_once);
    if (cublas_loaded()) return &api;
    return em_fail(load_status, "%s", load_error);
}

bool cublas_loaded(void) { return __atomic_load_n(&loaded, __ATOMIC_ACQUIRE); }

em_status cublas_load_for_test(const char *name, cublas_api *out)
{
    char err[512];
    if (load_from(name, out, err, sizeof err)) return EM_OK;
    return em_err(EM_ERR_DEVICE, "cuBLAS could not be loaded: %s", err);
}

/* ---- the product ---------------------------------------------------------------------- */

/* cuBLAS's element and compute types for a product in dt */
static bool gemm_types(em_dtype dt, bool tf32, cudaDataType_t *type, cublasComputeType_t *compute)
{
    switch (dt) {
    case EM_F32:
        *type = CUDA_R_32F;
        *compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        return true;
    case EM_F64:
        *type = CUDA_R_64F;
        *compute = CUBLAS_COMPUTE_64F;
        return true;
    case EM_F16:
        *type = CUDA_R_16F;
        *compute = CUBLAS_COMPUTE_32F;
        return true;
    case EM_BF16:
        *type = CUDA_R_16BF;
        *compute = CUBLAS_COMPUTE_32F;
        return true;
    default: return false;
    }
}

/* cuBLAS is column-major: a row-major (R,C) matrix with row stride ld is, to
 * cuBLAS, its (C,R) transpose with leading dim ld. So C = op(A) op(B) in
 * row-major is C^T = op(B)^T op(A)^T in column-major: B goes first, A
 * second, M and N swap, and each operand keeps its own transpose flag. */
em_status cu_matmul(int dev, const cu_gemm *g)
{
    em_status s = cu_use(dev, "matmul");
    if (s) return s;
    cudaDataType_t type;
    cublasComputeType_t compute;
    if (!gemm_types(g->dt, g->tf32, &type, &compute))
        return em_err(EM_ERR_DTYPE, "matmul: no CUDA product for %s", em_dtype_name(g->dt));
    cublasHandle_t h = (cublasHandle_t)cu_blas(dev); /* opens cuBLAS on first use */
    if (!h) return em_last_status();
    const cublas_api *blas = cublas_get();
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    bool f64 = g->dt == EM_F64;
    cublasStatus_t st = blas->gemm_strided_batched_ex(
        h, g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->N, (int)g->M,
        (int)g->K, f64 ? (const void *)&one_d : (const void *)&one_f, g->b, type, (int)g->ldb,
        (long long)g->stride_b, g->a, type, (int)g->lda, (long long)g->stride_a,
        f64 ? (const void *)&zero_d : (const void *)&zero_f, g->c, type, (int)g->ldc, (long long)g->stride_c,
        (int)g->batch, compute, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return em_err(EM_ERR_DEVICE, "matmul: cuBLAS error %d (%s) on (%lld,%lld)@(%lld,%lld) x %lld, %s",
                      (int)st, blas->status_string(st), (long long)g->M, (long long)g->K, (long long)g->K,
                      (long long)g->N, (long long)g->batch, em_dtype_name(g->dt));
    return cu_launched("matmul");
}
