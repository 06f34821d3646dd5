/* cublas.c — the cuBLAS calls ember makes, for the CUDA emulator
 * (include/cublas_v2.h): handles, streams, math modes, and the GEMM family
 * (cublasSgemm, cublasDgemm, cublasGemmEx, cublasGemmStridedBatchedEx),
 * all through one core.
 *
 * Arguments are checked as the real library checks them, in its order:
 *   NOT_INITIALIZED  no handle
 *   INVALID_VALUE    transa/transb not N/T/C; m, n, k or batchCount < 0;
 *                    lda < max(1, transa == N ? m : k),
 *                    ldb < max(1, transb == N ? k : n), ldc < max(1, m);
 *                    alpha or beta NULL
 *   NOT_SUPPORTED    (Atype, Btype, Ctype, computeType) not a row of
 *                    cublasGemmEx's table, or an unknown algo
 * and then by the emulator's own rules (each reported): A, B, C aligned to
 * their element size (INVALID_VALUE); every element a product touches
 * inside one live allocation of the stream's device (EXECUTION_FAILED;
 * a GPU would fault). C matrices of a batch that overlap are reported
 * (the GPU would race on them) but computed.
 *
 * The product is queued on the handle's stream (it runs when the stream
 * is ordered, with device memory open) and computed in double: C =
 * alpha op(A) op(B) + beta C, C not read when beta == 0 and A, B not read
 * when alpha == 0 or k == 0, as BLAS specifies; then rounded once to the
 * output type (f16 and bf16 to nearest even, with subnormals, infinities,
 * NaN kept). Reduced-precision compute types round the inputs first:
 * CUBLAS_COMPUTE_32F_FAST_TF32 (and CUBLAS_COMPUTE_32F on f32 matrices or
 * cublasSgemm when the handle's math mode is CUBLAS_TF32_TENSOR_OP_MATH,
 * which is how cuBLAS applies that mode) round A and B to TF32 (10-bit
 * mantissa, nearest even), FAST_16F / FAST_16BF to f16 / bf16. So TF32
 * tolerances in ember's tests are real ones. Complex and integer products
 * are not emulated (NOT_SUPPORTED, reported). alpha and beta are host
 * pointers read at the call (the pointer mode is always HOST). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_v2.h"
#include "cusim_impl.h"
#include "runtime_impl.h"

enum { HANDLE_MAGIC = 0x6c427553 };

struct cublasContext {
    unsigned magic;
    int device;
    cudaStream_t stream;
    cublasMath_t mode;
};

/* what happens to an input element before the multiply */
typedef enum { ROUND_NONE, ROUND_TF32, ROUND_F16, ROUND_BF16 } input_rounding;

/* one queued product (owns nothing but itself) */
typedef struct gemm {
    bool ta, tb; /* op(A) = A^T, op(B) = B^T */
    int m, n, k, batch;
    double alpha, beta;
    const void *a, *b;
    void *c;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
    long long sa, sb, sc;
    input_rounding round;
} gemm;

/* ---- number formats --------------------------------------------------------------------- */

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h >> 15 ? -v : v;
}

/* to the nearest f16, ties to even, straight from double (one rounding) */
static uint16_t double_to_half(double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (isnan(x)) return sign | 0x7e00;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);                        /* a in [2^(e-1), 2^e) */
    int q = e - 11 < -24 ? -24 : e - 11; /* the exponent of a's f16 ulp */
    double v = ldexp(nearbyint(ldexp(a, -q)), q);
    if (v > 65504) return sign | 0x7c00;
    if (v < 0x1p-14) return sign | (uint16_t)ldexp(v, 24); /* subnormal */
    frexp(v, &e);
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)(ldexp(v, 11 - e) - 1024);
}

static double bf16_to_double(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* to the nearest bf16, ties to even, straight from double; NaN stays NaN */
static uint16_t double_to_bf16(double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (isnan(x)) return sign | 0x7fc0;
    if (a == 0) return sign;
    if (isinf(a)) return sign | 0x7f80;
    int e;
    frexp(a, &e);
    int q = e - 8 < -133 ? -133 : e - 8; /* the exponent of a's bf16 ulp */
    double v = ldexp(nearbyint(ldexp(a, -q)), q);
    if (v >= 0x1p128) return sign | 0x7f80;
    float f = (float)v; /* exact: v has at most 8 significant bits */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return sign | (uint16_t)(u >> 16);
}

/* f rounded to TF32 (f32 with a 10-bit mantissa), to nearest even */
static float to_tf32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000) == 0x7f800000) return f; /* inf, NaN */
    u += 0x0fff + ((u >> 13) & 1);
    u &= 0xffffe000;
    memcpy(&f, &u, sizeof f);
    return f;
}

static size_t type_size(cudaDataType t)
{
    switch (t) {
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_8I: return 1;
    default: return 0; /* not emulated */
    }
}

static double load(cudaDataType t, const void *p, long long i)
{
    switch (t) {
    case CUDA_R_16F: return half_to_double(((const uint16_t *)p)[i]);
    case CUDA_R_16BF: return bf16_to_double(((const uint16_t *)p)[i]);
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_8I: return ((const int8_t *)p)[i];
    default: return NAN;
    }
}

static void store(cudaDataType t, void *p, long long i, double v)
{
    switch (t) {
    case CUDA_R_16F: ((uint16_t *)p)[i] = double_to_half(v); break;
    case CUDA_R_16BF: ((uint16_t *)p)[i] = double_to_bf16(v); break;
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    default: break;
    }
}

static double round_input(double v, input_rounding r)
{
    switch (r) {
    case ROUND_NONE: return v;
    case ROUND_TF32: return to_tf32((float)v);
    case ROUND_F16: return half_to_double(double_to_half(v));
    case ROUND_BF16: return bf16_to_double(double_to_bf16(v));
    }
    return v;
}

/* ---- the product ------------------------------------------------------------------------ */

/* runs g (queued: device memory is open). Per batch, op(A) is unpacked
 * into rows of k doubles and op(B) into columns of k doubles, so the inner
 * loop walks both contiguously. */
static void run_gemm(void *ctx)
{
    const gemm *g = ctx;
    size_t ka = (size_t)g->k ? (size_t)g->k : 1;
    double *a = malloc(ka * (size_t)g->m * sizeof *a), *b = malloc(ka * (size_t)g->n * sizeof *b);
    if (!a || !b) {
        cusim_report("cublas: out of host memory for a %dx%dx%d product", g->m, g->n, g->k);
        free(a);
        free(b);
        return;
    }
    bool reads_ab = g->alpha != 0 && g->k > 0;
    for (int p = 0; p < g->batch; p++) {
        const char *A = (const char *)g->a + (long long)p * g->sa * (long long)type_size(g->at);
        const char *B = (const char *)g->b + (long long)p * g->sb * (long long)type_size(g->bt);
        char *C = (char *)g->c + (long long)p * g->sc * (long long)type_size(g->ct);
        if (reads_ab) {
            for (int i = 0; i < g->m; i++) /* op(A)(i, l) */
                for (int l = 0; l < g->k; l++) {
                    long long at = g->ta ? (long long)i * g->lda + l : (long long)l * g->lda + i;
                    a[(size_t)i * ka + (size_t)l] = round_input(load(g->at, A, at), g->round);
                }
            for (int j = 0; j < g->n; j++) /* op(B)(l, j) */
                for (int l = 0; l < g->k; l++) {
                    long long at = g->tb ? (long long)l * g->ldb + j : (long long)j * g->ldb + l;
                    b[(size_t)j * ka + (size_t)l] = round_input(load(g->bt, B, at), g->round);
                }
        }
        for (int j = 0; j < g->n; j++)
            for (int i = 0; i < g->m; i++) {
                double sum = 0;
                if (reads_ab)
                    for (int l = 0; l < g->k; l++)
                        sum += a[(size_t)i * ka + (size_t)l] * b[(size_t)j * ka + (size_t)l];
                long long at = (long long)j * g->ldc + i;
                double v = g->alpha * sum;
                if (g->beta != 0) v += g->beta * load(g->ct, C, at);
                store(g->ct, C, at, v);
            }
    }
    free(a);
    free(b);
}

/* the scale type of a compute type (what alpha and beta point to) and
 * whether (at, bt, ct) is a row of cublasGemmEx's table for it */
static bool supported(cublasComputeType_t ct, cudaDataType at, cudaDataType bt, cudaDataType c,
                      cudaDataType *scale)
{
    if (at != bt) return false;
    switch (ct) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC: *scale = CUDA_R_16F; return at == CUDA_R_16F && c == CUDA_R_16F;
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
        *scale = CUDA_R_32F;
        return (at == CUDA_R_16BF && (c == CUDA_R_16BF || c == CUDA_R_32F)) ||
               (at == CUDA_R_16F && (c == CUDA_R_16F || c == CUDA_R_32F)) ||
               (at == CUDA_R_8I && c == CUDA_R_32F) || (at == CUDA_R_32F && c == CUDA_R_32F);
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32: *scale = CUDA_R_32F; return at == CUDA_R_32F && c == CUDA_R_32F;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC: *scale = CUDA_R_64F; return at == CUDA_R_64F && c == CUDA_R_64F;
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: return false; /* integer products: not emulated */
    }
    return false;
}

static double scalar(cudaDataType scale, const void *p)
{
    return scale == CUDA_R_16F ? half_to_double(*(const uint16_t *)p) : load(scale, p, 0);
}

/* operand X (rows x cols as stored, leading dim ld, batch matrices stride
 * apart) lies in one live allocation of device dev; else reported */
static bool operand_ok(const char *api, const char *name, const void *p, cudaDataType t, int rows, int cols,
                       int ld, long long stride, int batch, int dev)
{
    if (rows == 0 || cols == 0 || batch == 0) return true;
    long long es = (long long)type_size(t), lo = 0, hi = (long long)(cols - 1) * ld + (rows - 1);
    long long span = stride * (batch - 1);
    if (span < 0)
        lo += span;
    else
        hi += span;
    const char *start = (const char *)p + lo * es;
    size_t bytes = (size_t)((hi - lo + 1) * es);
    cusim_alloc_info info;
    cusim_mem_kind kind = cusim_mem_lookup(start, bytes, &info);
    if (kind == CUSIM_MEM_DEVICE && info.device == dev) return true;
    if (kind == CUSIM_MEM_OTHER) {
        cusim_report(
            "%s: %s (%d x %d, ld %d, %d matrices %lld elements apart) spans %zu bytes at %p, which is not "
            "device memory",
            api, name, rows, cols, ld, batch, stride, bytes, (const void *)start);
        return false;
    }
    const char *why = kind == CUSIM_MEM_DEVICE ? "on another device than the handle's stream"
                      : info.freed             ? "in an allocation that was freed"
                      : info.unmapped          ? "touching an unmapped part of a reserved range"
                                               : "which runs outside its allocation";
    cusim_report(
        "%s: %s (%d x %d, ld %d, %d matrices %lld elements apart) spans %zu bytes at %p, %s (%zu bytes at "
        "%p on cuda:%d)",
        api, name, rows, cols, ld, batch, stride, bytes, (const void *)start, why, info.size, info.base,
        info.device);
    return false;
}

/* the one core every GEMM entry point calls */
static cublasStatus_t gemm_core(const char *api, cublasHandle_t h, cublasOperation_t transa,
                                cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                const void *A, cudaDataType at, int lda, long long sa, const void *B,
                                cudaDataType bt, int ldb, long long sb, const void *beta, void *C,
                                cudaDataType ct, int ldc, long long sc, int batch,
                                cublasComputeType_t compute, int algo)
{
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    bool op_ok = (transa == CUBLAS_OP_N || transa == CUBLAS_OP_T || transa == CUBLAS_OP_C) &&
                 (transb == CUBLAS_OP_N || transb == CUBLAS_OP_T || transb == CUBLAS_OP_C);
    int rows_a = transa == CUBLAS_OP_N ? m : k, rows_b = transb == CUBLAS_OP_N ? k : n;
    if (!op_ok || m < 0 || n < 0 || k < 0 || batch < 0 || lda < (rows_a > 1 ? rows_a : 1) ||
        ldb < (rows_b > 1 ? rows_b : 1) || ldc < (m > 1 ? m : 1) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    cudaDataType scale;
    if (!supported(compute, at, bt, ct, &scale)) {
        if (compute == CUBLAS_COMPUTE_32I || compute == CUBLAS_COMPUTE_32I_PEDANTIC || type_size(at) == 0)
            cusim_report("%s: compute type %d with types (%d, %d, %d): complex and integer products are not "
                         "emulated",
                         api, (int)compute, (int)at, (int)bt, (int)ct);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!(algo == CUBLAS_GEMM_DEFAULT || (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
          (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP)))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;

    const void *ops[3] = {A, B, C};
    cudaDataType types[3] = {at, bt, ct};
    for (int i = 0; i < 3; i++)
        if ((uintptr_t)ops[i] % type_size(types[i])) {
            cusim_report("%s: %c at %p is not aligned to its %zu-byte elements", api, "ABC"[i], ops[i],
                         type_size(types[i]));
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    if (cusim_current_device() != h->device) {
        cusim_report("%s: the handle belongs to cuda:%d but cuda:%d is current", api, h->device,
                     cusim_current_device());
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    int dev = rt_stream_device(h->stream);
    if (dev < 0) return CUBLAS_STATUS_EXECUTION_FAILED; /* reported: the stream was destroyed */
    gemm *g = malloc(sizeof *g);
    if (!g) return CUBLAS_STATUS_ALLOC_FAILED;
    *g = (gemm){transa != CUBLAS_OP_N,
                transb != CUBLAS_OP_N,
                m,
                n,
                k,
                batch,
                scalar(scale, alpha),
                scalar(scale, beta),
                A,
                B,
                C,
                at,
                bt,
                ct,
                lda,
                ldb,
                ldc,
                sa,
                sb,
                sc,
                ROUND_NONE};
    bool reads_ab = g->alpha != 0 && k > 0;
    if ((reads_ab &&
         (!operand_ok(api, "A", A, at, rows_a, transa == CUBLAS_OP_N ? k : m, lda, sa, batch, dev) ||
          !operand_ok(api, "B", B, bt, rows_b, transb == CUBLAS_OP_N ? n : k, ldb, sb, batch, dev))) ||
        !operand_ok(api, "C", C, ct, m, n, ldc, sc, batch, dev)) {
        free(g);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if (batch > 1 && llabs(sc) < (long long)ldc * (n - 1) + m)
        cusim_report(
            "%s: the %d C matrices (%d x %d, ld %d) are %lld elements apart: they overlap and the GPU "
            "would race on them",
            api, batch, m, n, ldc, sc);
    bool tf32_mode = (h->mode & 15) == CUBLAS_TF32_TENSOR_OP_MATH;
    if (compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
        (compute == CUBLAS_COMPUTE_32F && tf32_mode && at == CUDA_R_32F))
        g->round = ROUND_TF32;
    else if (compute == CUBLAS_COMPUTE_32F_FAST_16F)
        g->round = ROUND_F16;
    else if (compute == CUBLAS_COMPUTE_32F_FAST_16BF)
        g->round = ROUND_BF16;
    int e = cusim_enqueue_host_fn(h->stream, run_gemm, g, free);
    return e ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                          const void *A, cudaDataType Atype, int lda, long long int strideA,
                                          const void *B, cudaDataType Btype, int ldb, long long int strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm_core("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda,
                     strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType,
                     algo);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
                            const void *B, cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    return gemm_core("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb,
                     0, beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                           int n, int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc)
{
    return gemm_core("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B,
                     CUDA_R_32F, ldb, 0, beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                           int n, int k, const double *alpha, const double *A, int lda, const double *B,
                           int ldb, const double *beta, double *C, int ldc)
{
    return gemm_core("cublasDgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_64F, lda, 0, B,
                     CUDA_R_64F, ldb, 0, beta, C, CUDA_R_64F, ldc, 0, 1, CUBLAS_COMPUTE_64F,
                     CUBLAS_GEMM_DEFAULT);
}

/* ---- handles ---------------------------------------------------------------------------- */

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    if (rt_begin() != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasHandle_t h = malloc(sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    *h = (struct cublasContext){HANDLE_MAGIC, cusim_current_device(), NULL, CUBLAS_DEFAULT_MATH};
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->magic = 0; /* queued products own their parameters: nothing waits for them */
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream)
{
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (rt_stream_device(stream) < 0) return CUBLAS_STATUS_INVALID_VALUE; /* reported */
    h->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *stream)
{
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base > CUBLAS_TF32_TENSOR_OP_MATH) return CUBLAS_STATUS_INVALID_VALUE;
    h->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *mode)
{
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = h->mode;
    return CUBLAS_STATUS_SUCCESS;
}

#define STATUS(code, text)                                                                                   \
    {                                                                                                        \
        code, #code, text                                                                                    \
    }
static const struct {
    cublasStatus_t code;
    const char *name, *text;
} statuses[] = {
    STATUS(CUBLAS_STATUS_SUCCESS, "the operation completed successfully"),
    STATUS(CUBLAS_STATUS_NOT_INITIALIZED, "the library was not initialized"),
    STATUS(CUBLAS_STATUS_ALLOC_FAILED, "the resource allocation failed"),
    STATUS(CUBLAS_STATUS_INVALID_VALUE, "an invalid numeric value was used as an argument"),
    STATUS(CUBLAS_STATUS_ARCH_MISMATCH, "an absent device architectural feature is required"),
    STATUS(CUBLAS_STATUS_MAPPING_ERROR, "an access to GPU memory space failed"),
    STATUS(CUBLAS_STATUS_EXECUTION_FAILED, "the GPU program failed to execute"),
    STATUS(CUBLAS_STATUS_INTERNAL_ERROR, "an internal operation failed"),
    STATUS(CUBLAS_STATUS_NOT_SUPPORTED, "the functionality requested is not supported"),
    STATUS(CUBLAS_STATUS_LICENSE_ERROR, "error detected trying to check the license"),
};
#undef STATUS

const char *cublasGetStatusString(cublasStatus_t s)
{
    for (size_t i = 0; i < sizeof statuses / sizeof *statuses; i++)
        if (statuses[i].code == s) return statuses[i].text;
    return "unknown error";
}

const char *cublasGetStatusName(cublasStatus_t s)
{
    for (size_t i = 0; i < sizeof statuses / sizeof *statuses; i++)
        if (statuses[i].code == s) return statuses[i].name;
    return "CUBLAS_STATUS_UNKNOWN";
}
