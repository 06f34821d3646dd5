/* gemm.c — every matrix multiply in ember goes through em_gemm: one BLAS
 * GEMM, split into row or column blocks that ember's pool runs in parallel,
 * with OpenBLAS itself kept single-threaded.
 *
 * Why: with OpenBLAS's own threads, its idle workers spin in sched_yield
 * after each call and take the second core from the pool's next kernel; in a
 * GPT training step that was a third of all CPU time (perf, docs/
 * ARCHITECTURE.md "Threads"). One pool for everything removes the fight. */
#include <cblas.h>

#include "kernel_impl.h"
#include "tensor_impl.h"

/* OpenBLAS's thread control; absent from other BLAS libraries. */
#pragma weak openblas_set_num_threads
void openblas_set_num_threads(int n);

__attribute__((constructor)) static void blas_single_threaded(void)
{
    if (openblas_set_num_threads) openblas_set_num_threads(1);
}

typedef struct gemm_job {
    em_dtype dt;
    bool c_bf16; /* dt bf16 only: C is bf16 rather than f32 */
    bool ta, tb, split_rows;
    int64_t M, N, K, lda, ldb, ldc;
    double alpha, beta;
    const char *A, *B;
    char *C;
    int64_t parts;
} gemm_job;

static void gemm_call(const gemm_job *j, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    size_t es = em_dtype_size(j->dt);
    if (j->dt == EM_BF16) { /* bf16 operands, f32 or bf16 result (gemm_bf16.c) */
        const uint16_t *a = (const uint16_t *)j->A + (j->ta ? m0 : m0 * j->lda);
        const uint16_t *b = (const uint16_t *)j->B + (j->tb ? n0 * j->ldb : n0);
        char *c = j->C + (size_t)(m0 * j->ldc + n0) * (j->c_bf16 ? 2 : 4);
        gemm_bf16(j->ta, j->tb, m1 - m0, n1 - n0, j->K, a, j->lda, b, j->ldb, c, j->c_bf16, j->ldc);
        return;
    }
    /* op(A) rows m0..m1: A is (M,K) with ld lda, or (K,M) when transposed */
    const char *a = j->A + (size_t)(j->ta ? m0 : m0 * j->lda) * es;
    /* op(B) columns n0..n1: B is (K,N), or (N,K) when transposed */
    const char *b = j->B + (size_t)(j->tb ? n0 * j->ldb : n0) * es;
    char *c = j->C + (size_t)(m0 * j->ldc + n0) * es;
    CBLAS_TRANSPOSE ta = j->ta ? CblasTrans : CblasNoTrans, tb = j->tb ? CblasTrans : CblasNoTrans;
    int m = (int)(m1 - m0), n = (int)(n1 - n0);
    if (j->dt == EM_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, (int)j->K, (float)j->alpha, (const float *)a, (int)j->lda,
                    (const float *)b, (int)j->ldb, (float)j->beta, (float *)c, (int)j->ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, m, n, (int)j->K, j->alpha, (const double *)a, (int)j->lda,
                    (const double *)b, (int)j->ldb, j->beta, (double *)c, (int)j->ldc);
}

static void gemm_part(void *p, int64_t lo, int64_t hi)
{
    const gemm_job *j = p;
    for (int64_t part = lo; part < hi; part++) {
        int64_t total = j->split_rows ? j->M : j->N;
        /* block edges on multiples of 16 keep BLAS's packed panels whole */
        int64_t b0 = total * part / j->parts / 16 * 16,
                b1 = part + 1 == j->parts ? total : total * (part + 1) / j->parts / 16 * 16;
        if (b0 >= b1) continue;
        if (j->split_rows)
            gemm_call(j, b0, b1, 0, j->N);
        else
            gemm_call(j, 0, j->M, b0, b1);
    }
}

/* j with A, B, C, shapes and scalars set: runs it, split over the pool */
static void gemm_run(gemm_job *j)
{
    int64_t M = j->M, N = j->N;
    /* rows when every part still gets a good block of them (measured faster
     * than column blocks of the same size), else the longer side */
    j->split_rows = M >= N || M >= 256 * (int64_t)em_num_threads();
    int64_t span = j->split_rows ? M : N;
    /* below ~2 MFLOP a thread's wake-up costs more than it saves */
    int64_t parts = M * N * j->K < (1 << 20) ? 1 : em_num_threads();
    if (parts > span / 16) parts = span / 16 > 0 ? span / 16 : 1;
    j->parts = parts;
    if (parts <= 1)
        gemm_call(j, 0, M, 0, N);
    else
        parallel_for(parts, 1, gemm_part, j);
}

void em_gemm_bf16_out(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, void *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty sum: +0 */
        for (int64_t i = 0; i < M; i++) memset((uint16_t *)C + i * ldc, 0, (size_t)N * 2);
        return;
    }
    gemm_job j = {.dt = EM_BF16, .c_bf16 = true, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda,
                  .ldb = ldb, .ldc = ldc, .alpha = 1, .beta = 0, .A = A, .B = B, .C = C};
    gemm_run(&j);
}

void em_gemm(em_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
             int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* C = beta C */
        if (dt == EM_BF16) dt = EM_F32; /* the result is f32 */
        size_t es = em_dtype_size(dt);
        for (int64_t i = 0; i < M; i++) {
            char *row = (char *)C + (size_t)(i * ldc) * es;
            if (beta == 0.0)
                memset(row, 0, (size_t)N * es);
            else
                for (int64_t k = 0; k < N; k++)
                    st(dt, row + (size_t)k * es, beta * ld(dt, row + (size_t)k * es));
        }
        return;
    }
    gemm_job j = {.dt = dt, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                  .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C};
    gemm_run(&j);
}
