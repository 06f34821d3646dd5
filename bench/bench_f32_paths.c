/* bench_f32_paths.c — the two f32 product paths side by side (issue 16):
 * em_gemm on the sgemm path (OpenBLAS, one thread per part of ember's pool
 * split) and on the avx2 path (ember's own kernel, tensor/gemm_widen.c),
 * alternating call by call in one process on the same operands, so a noisy
 * machine slows both alike, each path first in every other pair: with
 * sgemm always first, the avx2 path read 1.07-1.09x at 384x128x768^T on
 * one thread where both orders give 0.96-0.97x (one path in both seats
 * reads 0.99-1.03x either way: the bias is in which path follows which;
 * its cause was not isolated). Shapes: every product of the tiny GPT's step
 * (each Linear's forward x @ W^T, dX = g @ W and dW = g^T @ x; one
 * attention head's q @ k^T and P @ v), and GPT-2 124M's qkv, fc and head
 * (tied to the embedding) at B*T = 256.
 * Prints the median of each path (and of avx512, ember's own kernel with
 * its 6x32 AVX-512 block, where the CPU has AVX-512F) and sgemm / each
 * (above 1: ember's kernel faster).
 * Uses ember's internals (gemm_f32_path_reset), like the tests.
 * usage: bench_f32_paths [reps] [M N K ta tb]   (default 41, 7..201; a shape
 * given: that product alone) */
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "ember/ember.h"
#include "tensor/kernel_impl.h"

static void use(const char *path)
{
    setenv("EMBER_F32_PATH", path, 1);
    gemm_f32_path_reset();
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 41;
    if (reps < 7 || reps > 201) {
        fprintf(stderr, "bench_f32_paths: reps must be 7..201, got '%s'\n", argv[1]);
        return 2;
    }
    if (!gemm_widen_usable()) {
        printf("bench_f32_paths: this CPU has no AVX2+FMA+F16C: only the sgemm path exists here\n");
        return 0;
    }
    settle_blas_threads();
    /* M, N, K, ta, tb as em_gemm takes them */
    static const int shapes[][5] = {
        {768, 384, 128, 0, 1},  {768, 128, 384, 0, 0},  {384, 128, 768, 1, 0},  /* qkv */
        {768, 128, 128, 0, 1},  {768, 128, 128, 0, 0},  {128, 128, 768, 1, 0},  /* proj */
        {768, 512, 128, 0, 1},  {768, 128, 512, 0, 0},  {512, 128, 768, 1, 0},  /* fc */
        {768, 128, 512, 0, 1},  {768, 512, 128, 0, 0},  {128, 512, 768, 1, 0},  /* fc proj */
        {768, 65, 128, 0, 1},   {768, 128, 65, 0, 0},   {65, 128, 768, 1, 0},   /* head */
        {64, 64, 32, 0, 1},     {64, 32, 64, 0, 0},                             /* one head's attention */
        {256, 2304, 768, 0, 1}, {256, 768, 2304, 0, 0}, {2304, 768, 256, 1, 0}, /* 124M qkv */
        {256, 3072, 768, 0, 1}, {256, 768, 3072, 0, 0}, {3072, 768, 256, 1, 0}, /* 124M fc */
        {256, 50257, 768, 0, 1}, {256, 768, 50257, 0, 0}, {50257, 768, 256, 1, 0}, /* 124M head */
    };
    const int(*list)[5] = shapes;
    size_t nshapes = sizeof shapes / sizeof shapes[0];
    int one[1][5];
    if (argc == 7) { /* one shape of the caller's */
        for (int i = 0; i < 5; i++) one[0][i] = atoi(argv[2 + i]);
        if (one[0][0] < 1 || one[0][1] < 1 || one[0][2] < 1 || (unsigned)one[0][3] > 1 ||
            (unsigned)one[0][4] > 1) {
            fprintf(stderr, "bench_f32_paths: M N K must be positive and ta tb 0 or 1\n");
            return 2;
        }
        list = (const int(*)[5])one, nshapes = 1;
    } else if (argc > 2) {
        fprintf(stderr, "usage: bench_f32_paths [reps] [M N K ta tb]\n");
        return 2;
    }
    /* the paths this CPU has: sgemm, avx2 and, with AVX-512F, avx512 */
    static const char *const paths[] = {"sgemm", "avx2", "avx512"};
    int np = gemm_wide_usable() ? 3 : 2;
    use("auto");
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("bench_f32_paths: %s, %d threads, AVX-512F %s (auto picks %s); median of %d calls each, "
           "the paths in turn\nBLAS: %s (its sgemm %s AVX-512 kernels here)\n",
           model, em_num_threads(), np == 3 ? "yes" : "no", em_matmul_path(EM_F32), reps, em_blas_config(),
           blas_sgemm_avx512() ? "runs" : "has no");
    printf("%5s %5s %5s %3s %3s", "M", "N", "K", "ta", "tb");
    for (int p = 0; p < np; p++) printf(" %9s ms", paths[p]);
    for (int p = 1; p < np; p++) printf(" sgemm/%-6s", paths[p]);
    printf("\n");
    double lo[3] = {1e9, 1e9, 1e9}, hi[3] = {0, 0, 0};
    for (size_t s = 0; s < nshapes; s++) {
        int M = list[s][0], N = list[s][1], K = list[s][2];
        bool ta = list[s][3], tb = list[s][4];
        int lda = ta ? M : K, ldb = tb ? K : N;
        float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N),
              *C = malloc(sizeof(float) * (size_t)M * N);
        if (!A || !B || !C) return 1;
        for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
        double t[3][201], ms[3];
        for (int r = -2; r < reps; r++)
            for (int q = 0; q < np; q++) {
                int p = (q + (r < 0 ? 0 : r)) % np; /* each path first in turn */
                use(paths[p]);
                double t0 = now();
                em_gemm(EM_F32, ta, tb, M, N, K, 1.0, A, lda, B, ldb, 0.0, C, N);
                if (r >= 0) t[p][r] = now() - t0;
            }
        printf("%5d %5d %5d %3d %3d", M, N, K, ta, tb);
        for (int p = 0; p < np; p++) printf(" %12.3f", ms[p] = 1e3 * median(t[p], reps));
        for (int p = 1; p < np; p++) {
            double x = ms[0] / ms[p];
            printf(" %12.3f", x);
            lo[p] = x < lo[p] ? x : lo[p];
            hi[p] = x > hi[p] ? x : hi[p];
        }
        printf("\n");
        free(A), free(B), free(C);
    }
    for (int p = 1; p < np; p++) printf("sgemm / %s over these shapes: %.2f-%.2fx\n", paths[p], lo[p], hi[p]);
    unsetenv("EMBER_F32_PATH");
    gemm_f32_path_reset();
    return 0;
}
