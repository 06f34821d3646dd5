/* gemm.c — every matrix multiply in ember goes through em_gemm: one BLAS
 * GEMM (or, for f32 on the avx2 path, ember's own kernel: gemm_f32_own in
 * tensor/gemm_widen.c), split into row or column blocks that ember's pool
 * runs in parallel, with OpenBLAS itself kept single-threaded. A bias
 * (em_gemm_bias, gemm_low_dtypes.bias: linear's) is added to each part's
 * block as soon as its product is done: by ember's kernel as it stores the
 * block, else right after the part's BLAS call, while the block is in cache.
 *
 * Why: with OpenBLAS's own threads, its idle workers spin in sched_yield
 * after each call and take the second core from the pool's next kernel; in a
 * GPT training step that was a third of all CPU time (perf, docs/
 * ARCHITECTURE.md "Threads"). One pool for everything removes the fight. */
#include <cblas.h>

#include "dtype_math.h"
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
    em_dtype dt; /* f32 or f64 (em_gemm) */
    bool low;    /* em_gemm_low: a product in ldt.lo */
    bool own;    /* an f32 product on ember's own kernel (gemm_f32_own), else BLAS */
    gemm_low_dtypes ldt;
    bf16_path path; /* dt bf16 and low: the process's bf16 path */
    bool ta, tb, split_rows;
    int64_t M, N, K, lda, ldb, ldc;
    double alpha, beta;
    const char *A, *B;
    char *C;
    const char *bias; /* N values added to every row of C (gemm_add_bias), or NULL */
    int64_t parts;
    /* split_rows on ember's own kernel: op(B) packed once for every part
     * (gemm_shared_b), or NULL */
    const gemm_shared_b *shb;
    int failed; /* a part ran out of scratch memory (set atomically) */
} gemm_job;

/* ---- f32 from bf16/f16 storage, without AVX2+FMA ----------------------------------------
 * (CPUs with them widen in the GEMM's packing instead: tensor/gemm_widen.c.)
 * Where no bf16 (or f16) multiplier exists, a low-precision product widens
 * its operands to f32 one cache-sized block at a time, multiplies the
 * blocks with sgemm into an f32 block of C, and rounds that block to the
 * low dtype while it is still in cache. Each operand element is widened
 * once per block of the other side (MC rows / NC columns: at most a few %
 * of the multiply's work) and no whole-operand f32 copy is ever made, so
 * the product moves half the bytes of an f32 one and costs the same
 * multiplies. A transposed operand is widened in memory order and handed
 * to sgemm transposed. An f32 operand is rounded to the low dtype as it
 * is copied into its block. */
enum { WMC = 256, WKC = 512, WNC = 1024 }; /* block sizes (rows, depth, columns) */

/* x as dtype lo (bf16 or f16) holds it: rounded once, widened back */
static inline float keep(em_dtype lo, float x)
{
    return lo == EM_F16 ? f16_bits_to_f32(f32_to_f16_bits(x)) : bf16_bits_to_f32(f32_to_bf16_bits(x));
}

/* the (r x c) block at (r0, c0) of a matrix stored in dtype xt (lo, or f32
 * rounded to lo) with row stride ld, widened to f32 into dst with row
 * stride c */
static void widen_block(em_dtype lo, em_dtype xt, const void *X, int64_t ld, int64_t r0, int64_t c0,
                        int64_t r, int64_t c, float *dst)
{
    for (int64_t i = 0; i < r; i++) {
        size_t off = (size_t)((r0 + i) * ld + c0);
        if (xt == EM_F32)
            for (int64_t j = 0; j < c; j++) dst[i * c + j] = keep(lo, ((const float *)X)[off + (size_t)j]);
        else
            convert_n(EM_F32, dst + i * c, lo, (const uint16_t *)X + off, c);
    }
}

bool gemm_widen_sgemm(gemm_low_dtypes dt, bool ta, bool tb, int64_t m, int64_t n, int64_t K, const void *A,
                      int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc)
{
    em_dtype lo = dt.lo;
    int64_t kc_max = K <= WKC + WKC / 2 ? K : WKC; /* a K a little past one block stays one */
    int64_t mc_max = m < WMC ? m : WMC, nc_max = n < WNC ? n : WNC;
    size_t mark = tmp_mark();
    float *a = tmp_alloc((size_t)(mc_max * kc_max) * 4), *b = tmp_alloc((size_t)(kc_max * nc_max) * 4),
          *c = tmp_alloc((size_t)(mc_max * nc_max) * 4);
    if (!a || !b || !c) {
        tmp_release(mark);
        return false;
    }
    CBLAS_TRANSPOSE cta = ta ? CblasTrans : CblasNoTrans, ctb = tb ? CblasTrans : CblasNoTrans;
    for (int64_t n0 = 0; n0 < n; n0 += nc_max) {
        int64_t nc = n - n0 < nc_max ? n - n0 : nc_max;
        for (int64_t m0 = 0; m0 < m; m0 += mc_max) {
            int64_t mc = m - m0 < mc_max ? m - m0 : mc_max;
            for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
                int64_t kc = K - k0 < kc_max ? K - k0 : kc_max;
                /* op(A)[m0.., k0..]: A (m,K) rows, or A (K,m) when transposed */
                if (ta)
                    widen_block(lo, dt.a, A, lda, k0, m0, kc, mc, a);
                else
                    widen_block(lo, dt.a, A, lda, m0, k0, mc, kc, a);
                if (tb)
                    widen_block(lo, dt.b, B, ldb, n0, k0, nc, kc, b);
                else
                    widen_block(lo, dt.b, B, ldb, k0, n0, kc, nc, b);
                cblas_sgemm(CblasRowMajor, cta, ctb, (int)mc, (int)nc, (int)kc, 1.0f, a, (int)(ta ? mc : kc),
                            b, (int)(tb ? kc : nc), k0 ? 1.0f : 0.0f, c, (int)nc);
            }
            for (int64_t i = 0; i < mc; i++) {
                size_t off = (size_t)((m0 + i) * ldc + n0);
                float *cf = (float *)C + off;
                if (dt.add)
                    for (int64_t j = 0; j < nc; j++) cf[j] += keep(lo, c[i * nc + j]);
                else if (dt.c == EM_F32)
                    for (int64_t j = 0; j < nc; j++) cf[j] = keep(lo, c[i * nc + j]);
                else
                    convert_n(lo, (uint16_t *)C + off, EM_F32, c + i * nc, nc);
            }
        }
    }
    tmp_release(mark);
    return true;
}

/* the bytes of one element of a matrix stored in dtype dt */
static size_t esize(em_dtype dt) { return em_dtype_size(dt); }

void gemm_add_bias(em_dtype ct, const void *bias, void *C, int64_t ldc, int64_t m, int64_t n)
{
    size_t es = esize(ct);
    for (int64_t i = 0; i < m; i++) {
        char *row = (char *)C + (size_t)(i * ldc) * es;
        if (ct == EM_F32) {
            float *r = (float *)row;
            const float *b = bias;
            for (int64_t j = 0; j < n; j++) r[j] += b[j];
        } else if (ct == EM_F64) {
            double *r = (double *)row;
            const double *b = bias;
            for (int64_t j = 0; j < n; j++) r[j] += b[j];
        } else {
            const float *b = bias;
            for (int64_t j = 0; j < n; j++) st(ct, row + (size_t)j * es, ld(ct, row + (size_t)j * es) + b[j]);
        }
    }
}

/* whether j's parts run on ember's own kernel (tensor/gemm_widen.c):
 * gemm_call's choice, which gemm_run also needs before the parts start */
static bool on_own_kernel(const gemm_job *j)
{
    if (!j->low) return j->own;
    return gemm_widen_usable() && (j->ldt.lo == EM_F16 || j->path == BF16_PATH_F32);
}

/* part's block of C: rows m0..m1, columns n0..n1 */
static void gemm_call(gemm_job *j, int64_t part, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    /* where the part starts claiming a shared op(B)'s groups: spread out */
    int64_t first = j->shb ? part * j->shb->groups / j->parts : 0;
    size_t ea = esize(j->low ? j->ldt.a : j->dt), eb = esize(j->low ? j->ldt.b : j->dt),
           ec = esize(j->low ? j->ldt.c : j->dt);
    /* op(A) rows m0..m1: A is (M,K) with ld lda, or (K,M) when transposed */
    const char *a = j->A + (size_t)(j->ta ? m0 : m0 * j->lda) * ea;
    /* op(B) columns n0..n1: B is (K,N), or (N,K) when transposed */
    const char *b = j->B + (size_t)(j->tb ? n0 * j->ldb : n0) * eb;
    char *c = j->C + (size_t)(m0 * j->ldc + n0) * ec;
    int m = (int)(m1 - m0), n = (int)(n1 - n0);
    /* the bias of columns n0..n1: added to this part's block below as soon
     * as its product is done, unless the kernel adds it as it stores */
    const char *bias = j->bias ? j->bias + (size_t)n0 * (j->low ? 4 : esize(j->dt)) : NULL;
    if (j->low) { /* a product in ldt.lo: f32 accumulation, each result rounded once */
        bool ok;
        const uint16_t *a16 = (const uint16_t *)a, *b16 = (const uint16_t *)b;
        em_dtype lo = j->ldt.lo;
        gemm_low_dtypes ldt = j->ldt;
        ldt.bias = NULL;
        if (lo == EM_BF16 && j->path == BF16_PATH_AMX)
            ok = gemm_bf16_amx(j->ta, j->tb, m, n, j->K, a16, j->lda, b16, j->ldb, c, true, j->ldc);
        else if (lo == EM_BF16 && j->path == BF16_PATH_AVX512BF16)
            ok = gemm_dpbf16_low(gemm_dpbf16_kernel(), ldt, j->ta, j->tb, m, n, j->K, a16, j->lda, b16,
                                 j->ldb, c, j->ldc);
        else if (on_own_kernel(j)) {
            if (ldt.c == EM_F32) { /* the kernel adds it to an f32 C as it stores */
                ldt.bias = (const float *)bias;
                bias = NULL;
            }
            ok = gemm_widen(ldt, j->ta, j->tb, m, n, j->K, a, j->lda, b, j->ldb, c, j->ldc, j->shb, first);
        } else {
            ok = gemm_widen_sgemm(ldt, j->ta, j->tb, m, n, j->K, a, j->lda, b, j->ldb, c, j->ldc);
        }
        if (!ok)
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        else if (bias)
            gemm_add_bias(j->ldt.c, bias, c, j->ldc, m, n);
        return;
    }
    /* (scratch memory that runs out leaves the part to the BLAS) */
    if (on_own_kernel(j) &&
        gemm_f32_own(j->ta, j->tb, m, n, j->K, (float)j->alpha, (const float *)a, j->lda, (const float *)b,
                     j->ldb, j->beta != 0.0, (float *)c, j->ldc, (const float *)bias, j->shb, first))
        return;
    CBLAS_TRANSPOSE ta = j->ta ? CblasTrans : CblasNoTrans, tb = j->tb ? CblasTrans : CblasNoTrans;
    if (j->dt == EM_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, (int)j->K, (float)j->alpha, (const float *)a, (int)j->lda,
                    (const float *)b, (int)j->ldb, (float)j->beta, (float *)c, (int)j->ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, m, n, (int)j->K, j->alpha, (const double *)a, (int)j->lda,
                    (const double *)b, (int)j->ldb, j->beta, (double *)c, (int)j->ldc);
    if (bias) gemm_add_bias(j->dt, bias, c, j->ldc, m, n);
}

static void gemm_part(void *p, int64_t lo, int64_t hi)
{
    gemm_job *j = p;
    for (int64_t part = lo; part < hi; part++) {
        int64_t total = j->split_rows ? j->M : j->N;
        /* block edges on multiples of 16 keep BLAS's packed panels whole */
        int64_t b0 = total * part / j->parts / 16 * 16,
                b1 = part + 1 == j->parts ? total : total * (part + 1) / j->parts / 16 * 16;
        if (b0 >= b1) continue;
        if (j->split_rows)
            gemm_call(j, part, b0, b1, 0, j->N);
        else
            gemm_call(j, part, 0, j->M, b0, b1);
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
    if (parts <= 1) {
        gemm_call(j, 0, 0, M, 0, N);
        return;
    }
    /* parts of C's rows on ember's own kernel each multiply by all of
     * op(B): packed once, together (when its scratch is to be had) */
    size_t mark = tmp_mark();
    gemm_shared_b shb;
    if (j->split_rows && on_own_kernel(j)) {
        size_t nf = gemm_shared_b_size(N, j->K, &shb.groups);
        shb.buf = nf ? tmp_alloc(nf * sizeof(float)) : NULL;
        shb.state = shb.buf ? tmp_alloc((size_t)shb.groups * sizeof(int)) : NULL;
        if (shb.state) {
            memset(shb.state, 0, (size_t)shb.groups * sizeof(int));
            j->shb = &shb;
        } /* (no scratch for it: each part packs its own) */
    }
    parallel_for(parts, 1, gemm_part, j);
    j->shb = NULL;
    tmp_release(mark);
}

em_status em_gemm_low(gemm_low_dtypes dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A,
                      int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc)
{
    em_dtype lo = dt.lo;
    bool lo_or_f32 =
        (dt.a == lo || dt.a == EM_F32) && (dt.b == lo || dt.b == EM_F32) && (dt.c == lo || dt.c == EM_F32);
    /* a caller's bug: ops_matmul.c casts for a path that wants lo operands */
    bool f32_ab = dt.a == EM_F32 || dt.b == EM_F32;
    if ((lo != EM_BF16 && lo != EM_F16) || !lo_or_f32 || (f32_ab && !gemm_low_reads_f32(lo)) ||
        (dt.c == EM_F32 && !gemm_low_writes_f32(lo)) || (dt.add && (dt.c != EM_F32 || dt.bias)))
        return em_err(EM_ERR_ARG,
                      "em_gemm_low: a %s product on this path takes %s operands only (got %s, %s -> %s%s)",
                      em_dtype_name(lo), em_dtype_name(lo), em_dtype_name(dt.a), em_dtype_name(dt.b),
                      em_dtype_name(dt.c), dt.add ? (dt.bias ? ", added, with a bias" : ", added") : "");
    if (M <= 0 || N <= 0) return EM_OK;
    if (K <= 0) { /* an empty sum: +0 */
        for (int64_t i = 0; i < M && !dt.add; i++)
            memset((char *)C + (size_t)(i * ldc) * esize(dt.c), 0, (size_t)N * esize(dt.c));
        if (dt.bias) gemm_add_bias(dt.c, dt.bias, C, ldc, M, N);
        return EM_OK;
    }
    gemm_job j = {.low = true,
                  .ldt = dt,
                  .ta = ta,
                  .tb = tb,
                  .M = M,
                  .N = N,
                  .K = K,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .alpha = 1,
                  .beta = 0,
                  .A = A,
                  .B = B,
                  .C = C,
                  .bias = (const char *)dt.bias};
    if (lo == EM_BF16) {
        em_status s = gemm_bf16_path(&j.path);
        if (s) return s;
    }
    gemm_run(&j);
    if (j.failed)
        return em_err(EM_ERR_OOM,
                      "matmul: out of scratch memory for a %s product of (%lld,%lld) @ (%lld,%lld)",
                      em_dtype_name(lo), (long long)M, (long long)K, (long long)K, (long long)N);
    return EM_OK;
}

/* em_gemm, and (beta 0) em_gemm_bias */
static void gemm_f(em_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                   const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc,
                   const void *bias)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* C = beta C */
        size_t es = em_dtype_size(dt);
        for (int64_t i = 0; i < M; i++) {
            char *row = (char *)C + (size_t)(i * ldc) * es;
            if (beta == 0.0)
                memset(row, 0, (size_t)N * es);
            else
                for (int64_t k = 0; k < N; k++)
                    st(dt, row + (size_t)k * es, beta * ld(dt, row + (size_t)k * es));
        }
        if (bias) gemm_add_bias(dt, bias, C, ldc, M, N);
        return;
    }
    gemm_job j = {.dt = dt,
                  .ta = ta,
                  .tb = tb,
                  .M = M,
                  .N = N,
                  .K = K,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .alpha = alpha,
                  .beta = beta,
                  .A = A,
                  .B = B,
                  .C = C,
                  .bias = bias};
    /* f32 on ember's kernel where the path says so (a bad setting: the
     * BLAS; the matmul op reports it), for C = alpha AB or C + alpha AB and
     * products of at least 16 rows and columns (smaller ones waste most of
     * its 6x16 register block). A K past 1024 with neither operand
     * transposed (GPT-2 124M's dX = g @ W of fc, qkv and the head) stays on
     * the BLAS on the avx2 path: there its kernel measured 0.94-1.0x sgemm
     * (bench_f32_paths); the avx512 one measured 1.56-1.86x (Zen 5, the
     * BLAS on Haswell's kernels) and takes them */
    f32_path fp = dt == EM_F32 ? gemm_f32_path_chosen() : F32_PATH_SGEMM;
    j.own = fp != F32_PATH_SGEMM && (beta == 0.0 || beta == 1.0) && M >= 16 && N >= 16 &&
            (K <= 1024 || ta || tb || fp == F32_PATH_AVX512);
    gemm_run(&j);
}

void em_gemm(em_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
             int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc)
{
    gemm_f(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

void em_gemm_bias(em_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                  int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc, const void *bias)
{
    gemm_f(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0, C, ldc, bias);
}
