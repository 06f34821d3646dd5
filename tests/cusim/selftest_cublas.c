/* selftest_cublas.c — the emulator's cuBLAS (cublas.c) tested on its own,
 * with the runtime and stub_exec_for_runtime_tests.c: every argument rule,
 * products of every type against a naive column-major reference
 * (transposes, padded leading dimensions, batch strides, broadcast), the
 * roundings (f16, bf16, TF32) against independent references, and stream
 * order. Built and run (also under ASan/UBSan) by tests/cusim/selftest.sh. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_v2.h"
#include "cusim_impl.h"

static int failures;
#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                                  \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)
#define OK(call) CHECK((call) == 0)

static cublasHandle_t handle;

/* ---- helpers -------------------------------------------------------------------------- */

static void *upload(const void *host, size_t bytes)
{
    void *d = NULL;
    OK(cudaMalloc(&d, bytes));
    OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void download(void *host, const void *d, size_t bytes)
{
    OK(cudaDeviceSynchronize());
    OK(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost));
}

static unsigned long long rng = 88172645463325252ull;
static double uniform(void) /* in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

/* an independent f16 encoder for the references: the compiler's _Float16 */
static uint16_t f16_bits(double v)
{
    _Float16 h = (_Float16)v;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
static double f16_value(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, sizeof h);
    return (double)h;
}
static double bf16_value(uint16_t u)
{
    uint32_t w = (uint32_t)u << 16;
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}
/* an independent TF32 rounding: the significand to 11 bits, ties to even */
static double tf32_ref(float f)
{
    if (f == 0 || !isfinite(f)) return f;
    int e;
    frexp(f, &e);
    return ldexp(nearbyint(ldexp(f, 11 - e)), e - 11);
}

/* C = alpha op(A) op(B) + beta C for one matrix, column-major, in double */
static void reference(bool ta, bool tb, int m, int n, int k, double alpha, const double *a, int lda,
                      const double *b, int ldb, double beta, double *c, int ldc)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int l = 0; l < k; l++)
                s += (ta ? a[i * lda + l] : a[l * lda + i]) * (tb ? b[l * ldb + j] : b[j * ldb + l]);
            c[j * ldc + i] = alpha * s + (beta != 0 ? beta * c[j * ldc + i] : 0);
        }
}

/* ---- argument rules ------------------------------------------------------------------- */

static void test_gemm_rejects_bad_arguments(void)
{
    float one = 1, zero = 0, *d;
    OK(cudaMalloc((void **)&d, 64 * sizeof *d));
    const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
    const cudaDataType F = CUDA_R_32F;
    const cublasComputeType_t C32 = CUBLAS_COMPUTE_32F;
#define GEMM(h, ta, tb, m, n, k, al, at, lda, bt, ldb, be, ct, ldc, ctype, algo)                             \
    cublasGemmEx(h, ta, tb, m, n, k, al, d, at, lda, d, bt, ldb, be, d, ct, ldc, ctype, algo)
    CHECK(GEMM(NULL, N, N, 2, 2, 2, &one, F, 2, F, 2, &zero, F, 2, C32, -1) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(GEMM(handle, 7, N, 2, 2, 2, &one, F, 2, F, 2, &zero, F, 2, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, N, CUBLAS_OP_CONJG, 2, 2, 2, &one, F, 2, F, 2, &zero, F, 2, C32, -1) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, N, N, -1, 2, 2, &one, F, 2, F, 2, &zero, F, 2, C32, -1) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, N, N, 2, -1, 2, &one, F, 2, F, 2, &zero, F, 2, C32, -1) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, N, N, 2, 2, -1, &one, F, 2, F, 2, &zero, F, 2, C32, -1) ==
          CUBLAS_STATUS_INVALID_VALUE);
    /* lda >= max(1, transa == N ? m : k) */
    CHECK(GEMM(handle, N, N, 3, 2, 2, &one, F, 2, F, 2, &zero, F, 3, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, T, N, 2, 2, 3, &one, F, 2, F, 3, &zero, F, 2, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, N, N, 0, 2, 2, &one, F, 0, F, 2, &zero, F, 1, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    /* ldb >= max(1, transb == N ? k : n) */
    CHECK(GEMM(handle, N, N, 2, 2, 3, &one, F, 2, F, 2, &zero, F, 2, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, N, T, 2, 3, 2, &one, F, 2, F, 2, &zero, F, 2, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    /* ldc >= max(1, m) */
    CHECK(GEMM(handle, N, N, 3, 2, 2, &one, F, 3, F, 2, &zero, F, 2, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, N, N, 2, 2, 2, NULL, F, 2, F, 2, &zero, F, 2, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, F, 2, F, 2, NULL, F, 2, C32, -1) == CUBLAS_STATUS_INVALID_VALUE);
    /* the type table */
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, F, 2, F, 2, &zero, CUDA_R_16F, 2, C32, -1) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, F, 2, CUDA_R_16F, 2, &zero, F, 2, C32, -1) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, CUDA_R_64F, 2, CUDA_R_64F, 2, &zero, CUDA_R_64F, 2, C32, -1) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, F, 2, F, 2, &zero, F, 2, CUBLAS_COMPUTE_64F, -1) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, CUDA_R_16F, 2, CUDA_R_16F, 2, &zero, CUDA_R_16F, 2,
               CUBLAS_COMPUTE_32F_FAST_TF32, -1) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, CUDA_R_16BF, 2, CUDA_R_16BF, 2, &zero, CUDA_R_16F, 2, C32, -1) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, F, 2, F, 2, &zero, F, 2, 12345, -1) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(handle, N, N, 2, 2, 2, &one, F, 2, F, 2, &zero, F, 2, C32, 50) == CUBLAS_STATUS_NOT_SUPPORTED);
    /* batchCount >= 0 */
    CHECK(cublasGemmStridedBatchedEx(handle, N, N, 2, 2, 2, &one, d, F, 2, 4, d, F, 2, 4, &zero, d, F, 2, 4,
                                     -1, C32, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
    /* an empty product returns at once */
    CHECK(GEMM(handle, N, N, 0, 2, 2, &one, F, 1, F, 2, &zero, F, 1, C32, -1) == CUBLAS_STATUS_SUCCESS);
    /* the emulator's own: alignment, device memory, extents */
    CHECK(cublasGemmEx(handle, N, N, 2, 2, 2, &one, (char *)d + 2, F, 2, d, F, 2, &zero, d, F, 2, C32, -1) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(strstr(cusim_last_message(), "not aligned"));
    float host[4] = {0};
    CHECK(cublasGemmEx(handle, N, N, 2, 2, 2, &one, host, F, 2, d, F, 2, &zero, d, F, 2, C32, -1) ==
          CUBLAS_STATUS_EXECUTION_FAILED);
    CHECK(strstr(cusim_last_message(), "not device memory"));
    CHECK(GEMM(handle, N, N, 9, 9, 9, &one, F, 9, F, 9, &zero, F, 9, C32, -1) ==
          CUBLAS_STATUS_EXECUTION_FAILED);
    CHECK(strstr(cusim_last_message(), "runs outside its allocation"));
    CHECK(cublasSetMathMode(handle, (cublasMath_t)7) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(!strcmp(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED"));
    CHECK(strlen(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) > 0);
#undef GEMM
    OK(cudaFree(d));
}

/* ---- products ------------------------------------------------------------------------- */

/* a batched f64 or f32 product with every transpose combination, padded
 * leading dimensions, strides and (B) broadcast, against the reference */
static void check_batched(cudaDataType type, cublasComputeType_t compute, double tol)
{
    const int m = 5, n = 4, k = 3, batch = 3;
    for (int ta = 0; ta < 3; ta++)
        for (int tb = 0; tb < 3; tb++) {
            int rows_a = ta ? k : m, cols_a = ta ? m : k, rows_b = tb ? n : k, cols_b = tb ? k : n;
            int lda = rows_a + 2, ldb = rows_b + 1, ldc = m + 3;
            long long sa = (long long)lda * cols_a + 5, sb = 0 /* broadcast */, sc = (long long)ldc * n + 1;
            size_t na = (size_t)(sa * batch), nb = (size_t)ldb * cols_b, nc = (size_t)(sc * batch);
            double *a = malloc(na * 8), *b = malloc(nb * 8), *c = malloc(nc * 8), *want = malloc(nc * 8);
            for (size_t i = 0; i < na; i++) a[i] = uniform();
            for (size_t i = 0; i < nb; i++) b[i] = uniform();
            for (size_t i = 0; i < nc; i++) want[i] = c[i] = uniform();
            size_t es = type == CUDA_R_64F ? 8 : 4;
            void *ha = malloc(na * es), *hb = malloc(nb * es), *hc = malloc(nc * es);
            for (size_t i = 0; i < na; i++) /* the inputs as the type holds them */
                if (es == 4)
                    a[i] = ((float *)ha)[i] = (float)a[i];
                else
                    ((double *)ha)[i] = a[i];
            for (size_t i = 0; i < nb; i++)
                if (es == 4)
                    b[i] = ((float *)hb)[i] = (float)b[i];
                else
                    ((double *)hb)[i] = b[i];
            for (size_t i = 0; i < nc; i++)
                if (es == 4)
                    want[i] = c[i] = ((float *)hc)[i] = (float)c[i];
                else
                    ((double *)hc)[i] = c[i];
            void *da = upload(ha, na * es), *db = upload(hb, nb * es), *dc = upload(hc, nc * es);
            double alpha = 0.75, beta = -0.5;
            float alpha_f = 0.75f, beta_f = -0.5f;
            const void *al = es == 4 ? (const void *)&alpha_f : &alpha,
                       *be = es == 4 ? (const void *)&beta_f : &beta;
            OK(cublasGemmStridedBatchedEx(handle, (cublasOperation_t)ta, (cublasOperation_t)tb, m, n, k, al,
                                          da, type, lda, sa, db, type, ldb, sb, be, dc, type, ldc, sc, batch,
                                          compute, CUBLAS_GEMM_DEFAULT));
            download(hc, dc, nc * es);
            for (int p = 0; p < batch; p++)
                reference(ta, tb, m, n, k, alpha, a + p * sa, lda, b, ldb, beta, want + p * sc, ldc);
            double worst = 0;
            for (size_t i = 0; i < nc; i++) {
                double got = es == 4 ? ((float *)hc)[i] : ((double *)hc)[i];
                double w = es == 4 ? (double)(float)want[i] : want[i];
                if (fabs(got - w) > worst) worst = fabs(got - w);
            }
            CHECK(worst <= tol);
            if (worst > tol) fprintf(stderr, "  type %d ta %d tb %d: off by %g\n", (int)type, ta, tb, worst);
            cudaFree(da);
            cudaFree(db);
            cudaFree(dc);
            free(a), free(b), free(c), free(want), free(ha), free(hb), free(hc);
        }
}

static void test_f64_products_match_reference(void) { check_batched(CUDA_R_64F, CUBLAS_COMPUTE_64F, 1e-15); }
static void test_f32_products_match_reference(void) { check_batched(CUDA_R_32F, CUBLAS_COMPUTE_32F, 0); }

/* half-precision inputs (exact in double), f16 or bf16 or f32 output */
static void check_half(cudaDataType in, cudaDataType out)
{
    const int m = 6, n = 5, k = 7;
    uint16_t ha[m * k], hb[k * n];
    double a[m * k], b[k * n], c[m * n];
    for (int i = 0; i < m * k; i++) {
        double v = uniform() * 4;
        if (in == CUDA_R_16F)
            a[i] = f16_value(ha[i] = f16_bits(v));
        else {
            float f = (float)v;
            uint32_t w;
            memcpy(&w, &f, 4);
            a[i] = bf16_value(ha[i] = (uint16_t)(w >> 16)); /* truncated: any bf16 will do */
        }
    }
    for (int i = 0; i < k * n; i++) {
        double v = uniform() * 4;
        if (in == CUDA_R_16F)
            b[i] = f16_value(hb[i] = f16_bits(v));
        else {
            float f = (float)v;
            uint32_t w;
            memcpy(&w, &f, 4);
            b[i] = bf16_value(hb[i] = (uint16_t)(w >> 16));
        }
    }
    reference(false, true, m, n, k, 1.0, a, m, b, n, 0, c, m); /* B is stored n x k: op(B) = B^T */
    void *da = upload(ha, sizeof ha), *db = upload(hb, sizeof hb), *dc;
    size_t es = out == CUDA_R_32F ? 4 : 2;
    OK(cudaMalloc(&dc, (size_t)m * n * es));
    float one = 1, zero = 0;
    OK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &one, da, in, m, db, in, n, &zero, dc, out, m,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    unsigned char got[m * n * 4];
    download(got, dc, (size_t)m * n * es);
    int bad = 0;
    for (int i = 0; i < m * n; i++) {
        if (out == CUDA_R_32F)
            bad += ((float *)got)[i] != (float)c[i];
        else if (out == CUDA_R_16F)
            bad += ((uint16_t *)got)[i] != f16_bits(c[i]);
        else { /* bf16: the nearest, ties to even, of the double result */
            double v = bf16_value(((uint16_t *)got)[i]);
            uint16_t u = ((uint16_t *)got)[i];
            double up = bf16_value((uint16_t)(u + 1)), down = bf16_value((uint16_t)(u - 1));
            double gap_up = fabs(up - v) / 2, gap_down = fabs(v - down) / 2, d = fabs(c[i] - v);
            bad += d > gap_up || d > gap_down || ((d == gap_up || d == gap_down) && (u & 1));
        }
    }
    CHECK(bad == 0);
    if (bad) fprintf(stderr, "  in %d out %d: %d elements off\n", (int)in, (int)out, bad);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
}

static void test_f16_products_match_reference(void)
{
    check_half(CUDA_R_16F, CUDA_R_16F);
    check_half(CUDA_R_16F, CUDA_R_32F);
}

static void test_bf16_products_match_reference(void)
{
    check_half(CUDA_R_16BF, CUDA_R_16BF);
    check_half(CUDA_R_16BF, CUDA_R_32F);
}

/* alpha v times a 1x1 product of ones, into f16 or bf16: the output rounding of v */
static uint16_t rounded(double v, cudaDataType t, void *d_one, void *d_out)
{
    float alpha = (float)v, zero = 0;
    OK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, d_one, t, 1, d_one, t, 1, &zero, d_out,
                    t, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    uint16_t u;
    download(&u, d_out, 2);
    return u;
}

static void test_half_output_rounding_is_ieee(void)
{
    uint16_t one16 = 0x3c00, one_bf = 0x3f80;
    void *d16 = upload(&one16, 2), *dbf = upload(&one_bf, 2), *out;
    OK(cudaMalloc(&out, 2));
    /* f16: overflow, the largest finite, subnormal ties to even, NaN */
    CHECK(rounded(70000, CUDA_R_16F, d16, out) == 0x7c00);
    CHECK(rounded(65519, CUDA_R_16F, d16, out) == 0x7bff);
    CHECK(rounded(65520, CUDA_R_16F, d16, out) == 0x7c00);
    CHECK(rounded(-0x1p-25, CUDA_R_16F, d16, out) == 0x8000);  /* half the smallest subnormal: to even 0 */
    CHECK(rounded(0x1.8p-24, CUDA_R_16F, d16, out) == 0x0002); /* 1.5 subnormal ulps: to even 2 */
    CHECK(rounded(NAN, CUDA_R_16F, d16, out) == 0x7e00);
    CHECK(rounded(INFINITY, CUDA_R_16BF, dbf, out) == 0x7f80);
    CHECK((rounded(NAN, CUDA_R_16BF, dbf, out) & 0x7fc0) == 0x7fc0); /* NaN kept */
    CHECK(rounded(0x1.01p0, CUDA_R_16BF, dbf, out) == 0x3f80);       /* tie: to even */
    CHECK(rounded(0x1.03p0, CUDA_R_16BF, dbf, out) == 0x3f82);       /* tie: to even (up) */
    CHECK(rounded(0x1.fep127 * 1.0, CUDA_R_16BF, dbf, out) == 0x7f7f);
    /* f16 against the compiler's conversion: values across the range, and
     * every midpoint between neighbouring f16 values (ties) */
    int bad = 0;
    for (uint32_t u = 0; u < 0x7c00; u += 37) {
        double lo = f16_value((uint16_t)u), hi = f16_value((uint16_t)(u + 1)), mid = (lo + hi) / 2;
        double tries[3] = {mid, nextafterf((float)mid, 0), nextafterf((float)mid, INFINITY)};
        for (int t = 0; t < 3; t++)
            bad += rounded(tries[t], CUDA_R_16F, d16, out) != f16_bits((float)tries[t]);
    }
    CHECK(bad == 0);
    cudaFree(d16);
    cudaFree(dbf);
    cudaFree(out);
}

/* ---- TF32 ----------------------------------------------------------------------------- */

/* (1 x 1) * (1 x 1) with A = a, B = 1 in f32 under the given compute type */
static float product_of(float a, cublasComputeType_t compute, float *da, float *db, float *dc)
{
    float one = 1, zero = 0, got;
    OK(cudaMemcpy(da, &a, 4, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(db, &one, 4, cudaMemcpyHostToDevice));
    OK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, CUDA_R_32F, 1, db, CUDA_R_32F, 1,
                    &zero, dc, CUDA_R_32F, 1, compute, CUBLAS_GEMM_DEFAULT));
    download(&got, dc, 4);
    return got;
}

static void test_tf32_rounds_inputs(void)
{
    float *da, *db, *dc;
    OK(cudaMalloc((void **)&da, 4));
    OK(cudaMalloc((void **)&db, 4));
    OK(cudaMalloc((void **)&dc, 4));
    const cublasComputeType_t FAST = CUBLAS_COMPUTE_32F_FAST_TF32, C32 = CUBLAS_COMPUTE_32F;
    CHECK(product_of(1 + 0x1p-12f, C32, da, db, dc) == 1 + 0x1p-12f);
    CHECK(product_of(1 + 0x1p-12f, FAST, da, db, dc) == 1.0f);
    CHECK(product_of(1 + 0x1p-11f, FAST, da, db, dc) == 1.0f);            /* a tie: to even */
    CHECK(product_of(1 + 3 * 0x1p-11f, FAST, da, db, dc) == 1 + 0x1p-9f); /* a tie: to even (up) */
    CHECK(product_of(1 + 0x1.8p-11f, FAST, da, db, dc) == 1 + 0x1p-10f);  /* past the tie */
    /* the math mode applies TF32 to CUBLAS_COMPUTE_32F (and cublasSgemm), not to PEDANTIC */
    OK(cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH));
    CHECK(product_of(1 + 0x1p-12f, C32, da, db, dc) == 1.0f);
    CHECK(product_of(1 + 0x1p-12f, CUBLAS_COMPUTE_32F_PEDANTIC, da, db, dc) == 1 + 0x1p-12f);
    float a = 1 + 0x1p-12f, one = 1, zero = 0, got;
    OK(cudaMemcpy(da, &a, 4, cudaMemcpyHostToDevice));
    OK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, 1, db, 1, &zero, dc, 1));
    download(&got, dc, 4);
    CHECK(got == 1.0f);
    OK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    OK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, 1, db, 1, &zero, dc, 1));
    download(&got, dc, 4);
    CHECK(got == a);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);

    /* a whole product against inputs rounded by an independent TF32 rounding */
    enum { M = 9, N = 7, K = 33 };
    float ha[M * K], hb[K * N], hc[M * N];
    double ra[M * K], rb[K * N], want[M * N];
    for (int i = 0; i < M * K; i++) ra[i] = tf32_ref(ha[i] = (float)uniform());
    for (int i = 0; i < K * N; i++) rb[i] = tf32_ref(hb[i] = (float)uniform());
    reference(false, false, M, N, K, 1, ra, M, rb, K, 0, want, M);
    void *pa = upload(ha, sizeof ha), *pb = upload(hb, sizeof hb), *pc;
    OK(cudaMalloc(&pc, sizeof hc));
    OK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, pa, CUDA_R_32F, M, pb, CUDA_R_32F, K,
                    &zero, pc, CUDA_R_32F, M, FAST, CUBLAS_GEMM_DEFAULT));
    download(hc, pc, sizeof hc);
    int bad = 0;
    for (int i = 0; i < M * N; i++) bad += hc[i] != (float)want[i];
    CHECK(bad == 0);
    cudaFree(pa);
    cudaFree(pb);
    cudaFree(pc);
}

/* ---- as ember calls it ---------------------------------------------------------------- */

/* ops_matmul.cu: row-major C (M,N) = A (M,K) B (K,N), batched, as the
 * column-major product C^T = B^T A^T (B first, M and N swapped) */
static void test_row_major_call_as_ember_makes_it(void)
{
    enum { B = 2, M = 3, K = 4, N = 5 };
    float a[B * M * K], b[K * N], c[B * M * N];
    for (int i = 0; i < B * M * K; i++) a[i] = (float)(i % 7) - 3;
    for (int i = 0; i < K * N; i++) b[i] = (float)(i % 5) - 2;
    void *da = upload(a, sizeof a), *db = upload(b, sizeof b), *dc;
    OK(cudaMalloc(&dc, sizeof c));
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cublasSetStream(handle, s));
    float one = 1, zero = 0, *pinned;
    OK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, db, CUDA_R_32F, N, 0, da,
                                  CUDA_R_32F, K, M * K, &zero, dc, CUDA_R_32F, N, M * N, B,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    /* queued on s: a copy into pinned memory shows it only after the sync */
    OK(cudaMallocHost((void **)&pinned, sizeof c));
    memset(pinned, 0, sizeof c);
    OK(cudaMemcpyAsync(pinned, dc, sizeof c, cudaMemcpyDeviceToHost, s));
    CHECK(pinned[0] == 0 && pinned[1] == 0);
    OK(cudaStreamSynchronize(s));
    int bad = 0;
    for (int p = 0; p < B; p++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float want = 0;
                for (int l = 0; l < K; l++) want += a[p * M * K + i * K + l] * b[l * N + j];
                bad += pinned[p * M * N + i * N + j] != want;
            }
    CHECK(bad == 0);
    OK(cublasSetStream(handle, NULL));
    OK(cudaStreamDestroy(s));
    OK(cudaFreeHost(pinned));
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
}

static void test_zero_scalars_do_not_read_operands(void)
{
    double nan = NAN, a = 2, c[1] = {NAN}, one = 1, zero = 0, got;
    void *dn = upload(&nan, 8), *da = upload(&a, 8), *dc = upload(c, 8);
    OK(cublasDgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, 1, da, 1, &zero, dc,
                   1)); /* beta 0: C unread */
    download(&got, dc, 8);
    CHECK(got == 4);
    OK(cublasDgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &zero, dn, 1, dn, 1, &one, dc,
                   1)); /* alpha 0 */
    download(&got, dc, 8);
    CHECK(got == 4);
    cudaFree(dn);
    cudaFree(da);
    cudaFree(dc);
}

int main(void)
{
    OK(cublasCreate(&handle));
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
#define T(f) {#f, f}
        T(test_gemm_rejects_bad_arguments),
        T(test_f64_products_match_reference),
        T(test_f32_products_match_reference),
        T(test_f16_products_match_reference),
        T(test_bf16_products_match_reference),
        T(test_half_output_rounding_is_ieee),
        T(test_tf32_rounds_inputs),
        T(test_row_major_call_as_ember_makes_it),
        T(test_zero_scalars_do_not_read_operands),
#undef T
    };
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        int before = failures;
        tests[i].fn();
        printf("%s %s\n", failures == before ? "ok  " : "FAIL", tests[i].name);
    }
    OK(cublasDestroy(handle));
    printf("%s: %d failure%s\n", failures ? "FAILED" : "passed", failures, failures == 1 ? "" : "s");
    return failures != 0;
}
