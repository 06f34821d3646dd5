/* bench_ops.c — CPU throughput of ember's core ops against the hardware's
 * reference points, in one run:
 *   (a) em_matmul vs raw cblas_sgemm on GPT-2 124M's and the tiny GPT's Linear
 *       shapes, GFLOP/s;
 *   (b) elementwise ops and layer_norm, and the backward of gelu_tanh and
 *       layer_norm, vs memcpy of the same bytes, GB/s;
 *   (c) whether OpenBLAS's threads and ember's pool get in each other's way:
 *       em_matmul and em_add alone and alternating, per thread setting;
 *   (d) the fixed cost of one op call (handles, the dispatcher's autocast,
 *       device and recording steps, allocation in the scope): ops on 4-element
 *       tensors, ns per call, with grad mode off and recording on the tape.
 *       Before/after a change to the op path, run this binary against each
 *       build's libember.so (LD_LIBRARY_PATH) in one session;
 *   (e) bf16 and f16 matmuls against f32 ones on the tiny GPT's and GPT-2
 *       124M's Linear products (forward x @ W^T, backward g @ W and g^T @ x),
 *       ms, with the product path each dtype took (em_matmul_path), and the
 *       f32 operands under bf16 autocast (what a bf16 training step runs).
 * Every number is the median over repetitions after a warm-up; ember and the
 * reference are timed interleaved in the same run. Each ember repetition runs
 * in its own step scope, so the arena is reused and nothing grows.
 * Usage: bench_ops [reps] [low]   (default 9, at least 7; "low": only (e)) */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ember/ember.h"

/* OpenBLAS's thread controls (absent from other BLAS libraries): resolved
 * when present. */
#pragma weak openblas_set_num_threads
#pragma weak openblas_get_num_threads

static void die(const char *what)
{
    fprintf(stderr, "bench_ops: %s failed: %s\n", what, em_last_error());
    exit(1);
}

static void blas_threads(int n)
{
    if (openblas_set_num_threads) openblas_set_num_threads(n);
}

static int blas_thread_count(void) { return openblas_get_num_threads ? openblas_get_num_threads() : -1; }

enum { MAX_REPS = 128 };

/* ---- (a) GEMM ------------------------------------------------------------------ */

static void bench_matmul(int reps)
{
    /* (M, K, N): GPT-2 124M's Linear shapes at 256-1024 rows, then the tiny
     * GPT's (B*T = 768 rows: qkv, proj, fc, fc proj, head) */
    static const int64_t shapes[][3] = {
        {256, 768, 768},   {512, 768, 768},  {1024, 768, 768}, {256, 768, 3072},  {512, 768, 3072},
        {1024, 768, 3072}, {256, 3072, 768}, {512, 3072, 768}, {1024, 3072, 768}, {768, 128, 384},
        {768, 128, 128},   {768, 128, 512},  {768, 512, 128},  {768, 128, 65}};
    const char *path = em_matmul_path(EM_F32);
    printf("\n(a) matmul f32, (M,K) @ (K,N), median of 3 rounds x %d, GFLOP/s; ember (f32 path %s, split\n"
           "    over ember's pool%s) vs raw cblas_sgemm with OpenBLAS's own %d threads\n",
           reps, path ? path : "none", path && !strcmp(path, "sgemm") ? ", OpenBLAS 1 thread per part" : "",
           em_num_threads());
    printf("%6s %6s %6s  %10s %10s %8s\n", "M", "K", "N", "ember", "sgemm", "ratio");
    em_rng rng = em_rng_new(1);
    /* half a second of GEMMs first: a new pool worker can share the caller's
     * core until the scheduler moves it, which would land on the first shape */
    em_tensor *wa = em_randn(EM_F32, EM_SHAPE(512, 768), &rng),
              *wb = em_randn(EM_F32, EM_SHAPE(768, 768), &rng);
    for (double t_end = now() + 0.5; now() < t_end;) {
        em_scope sc = em_scope_begin();
        if (!em_matmul(wa, wb)) die("em_matmul warm-up");
        em_scope_end(sc);
    }
    em_free(wa);
    em_free(wb);
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        int64_t M = shapes[sh][0], K = shapes[sh][1], N = shapes[sh][2];
        em_tensor *a = em_randn(EM_F32, EM_SHAPE(M, K), &rng), *b = em_randn(EM_F32, EM_SHAPE(K, N), &rng);
        float *c = malloc(sizeof(float) * (size_t)(M * N));
        if (!a || !b || !c) die("matmul setup");
        const float *ap = em_data(a), *bp = em_data(b);
        /* Rounds of blocks, ember's then the reference's, each with a warm-up;
         * the median runs over every round. Interleaving call by call would
         * time ember while the reference's OpenBLAS workers still spin, and a
         * single block can land in a stretch where the VM runs both threads
         * on one core (seen here with plain pthreads and OpenBLAS too). */
        enum { ROUNDS = 3 };
        double te[MAX_REPS * ROUNDS], tr[MAX_REPS * ROUNDS];
        int ne = 0, nr = 0;
        for (int round = 0; round < ROUNDS; round++) {
            blas_threads(1);    /* ember's setting: its pool splits the GEMM */
            usleep(100 * 1000); /* let the reference's OpenBLAS workers go idle */
            for (int i = -1; i < reps; i++) {
                em_scope sc = em_scope_begin();
                double t0 = now();
                if (!em_matmul(a, b)) die("em_matmul");
                double t1 = now();
                em_scope_end(sc);
                if (i >= 0) te[ne++] = t1 - t0;
            }
            /* the reference: OpenBLAS with its own threads, as many as ember's pool */
            blas_threads(em_num_threads());
            for (int i = -1; i < reps; i++) {
                double t2 = now();
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, ap,
                            (int)K, bp, (int)N, 0.0f, c, (int)N);
                double t3 = now();
                if (i >= 0) tr[nr++] = t3 - t2;
            }
        }
        blas_threads(1);
        double flop = 2.0 * (double)M * (double)K * (double)N;
        double ge = flop / median(te, ne) * 1e-9, gr = flop / median(tr, nr) * 1e-9;
        printf("%6lld %6lld %6lld  %10.1f %10.1f %8.3f\n", (long long)M, (long long)K, (long long)N, ge, gr,
               ge / gr);
        fflush(stdout);
        free(c);
        em_free(a);
        em_free(b);
    }
}

/* ---- (b) memory-bound ops ------------------------------------------------------ */

typedef struct copy_part {
    char *dst;
    const char *src;
    size_t n;
} copy_part;

static void *copy_main(void *p)
{
    copy_part *c = p;
    memcpy(c->dst, c->src, c->n);
    return NULL;
}

/* memcpy split over nt threads (the caller takes the first part), the same
 * thread count ember's pool uses. */
static void par_memcpy(char *dst, const char *src, size_t n, int nt)
{
    enum { MAX_PARTS = 64 };
    pthread_t th[MAX_PARTS];
    copy_part parts[MAX_PARTS];
    if (nt > MAX_PARTS) nt = MAX_PARTS;
    for (int i = 0; i < nt; i++) {
        size_t lo = n * (size_t)i / (size_t)nt, hi = n * (size_t)(i + 1) / (size_t)nt;
        parts[i] = (copy_part){dst + lo, src + lo, hi - lo};
    }
    int started = 1;
    for (; started < nt; started++)
        if (pthread_create(&th[started], NULL, copy_main, &parts[started])) break;
    copy_main(&parts[0]);
    for (int i = started; i < nt; i++) copy_main(&parts[i]); /* parts no thread took */
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
}

typedef enum {
    EW_ADD,
    EW_MUL_SCALAR,
    EW_GELU_TANH,
    EW_LAYER_NORM,
    EW_GELU_TANH_BWD,
    EW_LAYER_NORM_BWD
} ew_op;

enum { N_EW = 6 };

static em_tensor *run_ew(ew_op op, em_tensor *x, em_tensor *y, em_tensor *w, em_tensor *bias)
{
    switch (op) {
    case EW_ADD: return em_add(x, y);
    case EW_MUL_SCALAR: return em_mul_scalar(x, 1.5);
    case EW_GELU_TANH:
    case EW_GELU_TANH_BWD: return em_gelu_tanh(x);
    case EW_LAYER_NORM:
    case EW_LAYER_NORM_BWD: return em_layer_norm(x, w, bias, 1e-5);
    }
    return NULL;
}

/* The backward rows time em_backward(out, g) alone, the forward run
 * untimed before it; x is a leaf, so the time includes delivering its
 * gradient (added into its zeroed buffer). */
static void bench_elementwise(int reps)
{
    const int64_t R = 8192, C = 768; /* (B*T, C) of GPT-2 small, 24 MiB in f32 */
    size_t nbytes = sizeof(float) * (size_t)(R * C);
    printf("\n(b) memory-bound ops, f32 (%lld,%lld), median of %d; GB/s counts bytes read + written\n",
           (long long)R, (long long)C, reps);
    int nt = em_num_threads();
    printf("memcpy: one thread, and split over %d threads (ember's pool size); ratio = op / memcpy(%d)\n", nt,
           nt);
    printf("%-14s %10s %10s %10s %8s\n", "op", "GB/s", "memcpy(1)", "memcpy(n)", "ratio");
    em_rng rng = em_rng_new(2);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(R, C), &rng), *y = em_randn(EM_F32, EM_SHAPE(R, C), &rng);
    em_tensor *w = em_ones(EM_F32, EM_SHAPE(C)), *bias = em_zeros(EM_F32, EM_SHAPE(C));
    char *src = malloc(nbytes), *dst = malloc(nbytes);
    if (!x || !y || !w || !bias || !src || !dst) die("elementwise setup");
    memset(src, 1, nbytes);
    memset(dst, 2, nbytes);
    static const char *names[N_EW] = {"add",        "mul_scalar",    "gelu_tanh",
                                      "layer_norm", "gelu_tanh bwd", "layer_norm bwd"};
    /* tensors read per op besides the one written (backward: x, out and g;
     * x and g) */
    static const double reads[N_EW] = {2, 1, 1, 1, 3, 2};
    for (int op = 0; op < N_EW; op++) {
        bool bwd = op == EW_GELU_TANH_BWD || op == EW_LAYER_NORM_BWD;
        if (em_set_requires_grad(x, bwd)) die("requires_grad");
        double to[MAX_REPS], tm[MAX_REPS], tp[MAX_REPS];
        for (int i = -2; i < reps; i++) {
            em_scope sc = em_scope_begin();
            em_tensor *out = bwd ? run_ew((ew_op)op, x, y, w, bias) : NULL;
            if (bwd && !out) die(names[op]);
            double t0 = now();
            if (bwd ? em_backward(out, y) != EM_OK : !run_ew((ew_op)op, x, y, w, bias)) die(names[op]);
            double t1 = now();
            if (bwd && em_zero_grad(x)) die("zero_grad");
            em_scope_end(sc);
            double t2 = now();
            memcpy(dst, src, nbytes);
            double t3 = now();
            par_memcpy(dst, src, nbytes, nt);
            double t4 = now();
            if (i >= 0) {
                to[i] = t1 - t0;
                tm[i] = t3 - t2;
                tp[i] = t4 - t3;
            }
        }
        double go = (reads[op] + 1) * (double)nbytes / median(to, reps) * 1e-9;
        double gm = 2.0 * (double)nbytes / median(tm, reps) * 1e-9;
        double gp = 2.0 * (double)nbytes / median(tp, reps) * 1e-9;
        printf("%-14s %10.2f %10.2f %10.2f %8.3f\n", names[op], go, gm, gp, go / gp);
        fflush(stdout);
    }
    if (em_set_requires_grad(x, false)) die("requires_grad");
    free(src);
    free(dst);
    em_free(x);
    em_free(y);
    em_free(w);
    em_free(bias);
}

/* ---- (c) OpenBLAS threads vs ember's pool -------------------------------------- */

/* Median milliseconds of em_matmul(a, b) and of em_add(x, x) per iteration,
 * each either run alone in a loop (alt false) or alternating with the other. */
static void mix_time(bool alt, em_tensor *a, em_tensor *b, em_tensor *x, int iters, double *mm_ms,
                     double *add_ms)
{
    double tm[MAX_REPS], ta[MAX_REPS];
    for (int pass = 0; pass < (alt ? 1 : 2); pass++)
        for (int i = -3; i < iters; i++) {
            em_scope sc = em_scope_begin();
            double t0 = now();
            if ((alt || pass == 0) && !em_matmul(a, b)) die("em_matmul");
            double t1 = now();
            if ((alt || pass == 1) && !em_add(x, x)) die("em_add");
            double t2 = now();
            em_scope_end(sc);
            if (i >= 0 && (alt || pass == 0)) tm[i] = t1 - t0;
            if (i >= 0 && (alt || pass == 1)) ta[i] = t2 - t1;
        }
    *mm_ms = median(tm, iters) * 1e3;
    *add_ms = median(ta, iters) * 1e3;
}

/* The four settings are measured round-robin (ROUNDS rounds of `iters`
 * iterations each) and the median over rounds reported, so that drift in the
 * machine's speed hits every setting alike. */
static void bench_interference(int iters)
{
    enum { ROUNDS = 5, NCFG = 4 };
    printf("\n(c) OpenBLAS threads vs ember pool: em_matmul (512,768)@(768,768) and em_add (4096,768),\n"
           "    each timed alone (in a loop of itself) and alternating (matmul, add, matmul, ...);\n"
           "    ms, median over %d interleaved rounds of the median of %d iterations\n",
           ROUNDS, iters);
    printf("%8s %8s  %9s %9s %6s  %9s %9s %6s  %8s\n", "blas_thr", "pool_thr", "mm alone", "mm alt", "slow",
           "add alone", "add alt", "slow", "alt sum");
    if (!openblas_set_num_threads) {
        printf("    (BLAS is not OpenBLAS: thread count not settable)\n");
        return;
    }
    em_rng rng = em_rng_new(3);
    em_tensor *a = em_randn(EM_F32, EM_SHAPE(512, 768), &rng),
              *b = em_randn(EM_F32, EM_SHAPE(768, 768), &rng);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(4096, 768), &rng);
    if (!a || !b || !x) die("interference setup");
    int blas0 = blas_thread_count(), pool0 = em_num_threads();
    double res[NCFG][4][ROUNDS]; /* mm alone, mm alt, add alone, add alt */
    for (int r = 0; r < ROUNDS; r++)
        for (int c = 0; c < NCFG; c++) {
            blas_threads(c / 2 + 1);
            em_set_num_threads(c % 2 + 1);
            mix_time(false, a, b, x, iters, &res[c][0][r], &res[c][2][r]);
            mix_time(true, a, b, x, iters, &res[c][1][r], &res[c][3][r]);
        }
    for (int c = 0; c < NCFG; c++) {
        double m[4];
        for (int k = 0; k < 4; k++) m[k] = median(res[c][k], ROUNDS);
        printf("%8d %8d  %9.3f %9.3f %5.2fx  %9.3f %9.3f %5.2fx  %8.3f\n", c / 2 + 1, c % 2 + 1, m[0], m[1],
               m[1] / m[0], m[2], m[3], m[3] / m[2], m[1] + m[3]);
    }
    blas_threads(blas0 > 0 ? blas0 : 1);
    em_set_num_threads(pool0);
    em_free(a);
    em_free(b);
    em_free(x);
}

/* ns per call of `which` on 4-element f32 tensors: calls made in scopes of
 * 1000, the median over reps rounds (the fastest in *best: on a VM whose
 * speed jumps between runs the best is the steadier figure). record: inputs
 * require grad, so each call records a node. */
static double call_ns(int which, bool record, int reps, double *best)
{
    enum { CALLS = 1000, ROUNDS_PER_REP = 20 };
    em_tensor *a = em_full(EM_F32, EM_SHAPE(2, 2), 0.5), *b = em_full(EM_F32, EM_SHAPE(2, 2), 1.5);
    if (!a || !b) die("call setup");
    if (record && (em_set_requires_grad(a, true) || em_set_requires_grad(b, true))) die("requires_grad");
    bool prev = em_set_grad_enabled(record);
    double t[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int k = 0; k < ROUNDS_PER_REP; k++) {
            em_scope s = em_scope_begin();
            for (int i = 0; i < CALLS; i++) {
                em_tensor *y = which == 0 ? em_add(a, b) : which == 1 ? em_gelu(a) : em_matmul(a, b);
                if (!y) die("op call");
            }
            em_scope_end(s);
        }
        t[r] = (now() - t0) / (CALLS * ROUNDS_PER_REP) * 1e9;
    }
    em_set_grad_enabled(prev);
    em_free(a);
    em_free(b);
    *best = t[0];
    for (int r = 1; r < reps; r++)
        if (t[r] < *best) *best = t[r];
    return median(t, reps);
}

static void bench_call_cost(int reps)
{
    const char *names[] = {"add", "gelu", "matmul"};
    printf("\n(d) the fixed cost of an op call on (2,2) f32 tensors, ns per call over %d rounds of 20000:\n"
           "    median (best)\n",
           reps);
    printf("%8s %16s %16s\n", "op", "no grad", "recorded");
    for (int w = 0; w < 3; w++) {
        double bn, br, mn = call_ns(w, false, reps, &bn), mr = call_ns(w, true, reps, &br);
        printf("%8s %8.0f (%5.0f) %8.0f (%5.0f)\n", names[w], mn, bn, mr, br);
    }
}

/* ---- (e) low-precision products ---------------------------------------------------- */

/* median ms of em_matmul(a, b) under autocast ac (EM_F32: off) over `reps`
 * runs after one warm-up */
static double matmul_ms(em_tensor *a, em_tensor *b, em_dtype ac, int reps)
{
    double t[MAX_REPS];
    for (int i = -1; i < reps; i++) {
        em_scope sc = em_scope_begin();
        em_dtype prev = em_autocast_set(ac);
        double t0 = now();
        em_tensor *y = em_matmul(a, b);
        double t1 = now();
        em_autocast_set(prev);
        if (!y) die("em_matmul");
        em_scope_end(sc);
        if (i >= 0) t[i] = t1 - t0;
    }
    return 1e3 * median(t, reps);
}

static void bench_low(int reps)
{
    const char *pb = em_matmul_path(EM_BF16);
    if (!pb) die("em_matmul_path(bf16)");
    printf("\n(e) low-precision matmul vs f32 on the tiny and 124M Linear products, ms (median of %d, dtypes "
           "in turn, 3 "
           "rounds);\n    paths: f32 %s, bf16 %s, f16 %s; ratio = f32 ms / low ms (>= 1: not slower); "
           "bf16 ac: the f32\n    operands under bf16 autocast, as the training step multiplies them\n",
           reps, em_matmul_path(EM_F32), pb, em_matmul_path(EM_F16));
    printf("%-26s %9s %9s %9s %9s %8s %8s %8s\n", "product (M x K x N)", "f32", "bf16", "bf16 ac", "f16",
           "f32/bf16", "f32/ac", "f32/f16");
    /* (rows, K, N) as the Linear's x (rows,K) and W (N,K) meet in each
     * product: the tiny GPT's (B*T = 768), then GPT-2 124M's (B*T = 256) */
    static const int64_t lin[][3] = {{768, 128, 384},  {768, 128, 128},  {768, 128, 512}, {768, 512, 128},
                                     {768, 128, 65},   {256, 768, 2304}, {256, 768, 768}, {256, 768, 3072},
                                     {256, 3072, 768}, {256, 768, 50257}};
    em_rng rng = em_rng_new(3);
    for (size_t l = 0; l < sizeof lin / sizeof lin[0]; l++) {
        int64_t M = lin[l][0], K = lin[l][1], N = lin[l][2];
        em_tensor *x = em_randn(EM_F32, EM_SHAPE(M, K), &rng), *w = em_randn(EM_F32, EM_SHAPE(N, K), &rng),
                  *g = em_randn(EM_F32, EM_SHAPE(M, N), &rng);
        if (!x || !w || !g) die("low setup");
        const em_dtype dts[3] = {EM_F32, EM_BF16, EM_F16};
        em_tensor *xs[3], *ws[3], *gs[3];
        for (int d = 0; d < 3; d++) {
            xs[d] = d ? em_cast(x, dts[d]) : x;
            ws[d] = d ? em_cast(w, dts[d]) : w;
            gs[d] = d ? em_cast(g, dts[d]) : g;
            if (!xs[d] || !ws[d] || !gs[d]) die("low cast");
        }
        const char *names[3] = {"x @ W^T", "g @ W", "g^T @ x"};
        int r = N > 10000 ? (reps + 2) / 3 : reps; /* the vocabulary's product is 20 GFLOP */
        for (int p = 0; p < 3; p++) {
            /* f32, bf16, f16 stored, then f32 operands under bf16 autocast */
            double ms[4][3];
            for (int round = 0; round < 3; round++)
                for (int d = 0; d < 4; d++) {
                    int sd = d == 3 ? 0 : d;
                    em_tensor *wt = em_transpose(ws[sd], 0, 1), *gt = em_transpose(gs[sd], 0, 1);
                    em_tensor *as[3] = {xs[sd], gs[sd], gt}, *bs[3] = {wt, ws[sd], xs[sd]};
                    ms[d][round] = matmul_ms(as[p], bs[p], d == 3 ? EM_BF16 : EM_F32, r);
                    em_free(wt);
                    em_free(gt);
                }
            double m[4];
            for (int d = 0; d < 4; d++) m[d] = median(ms[d], 3);
            char label[64];
            snprintf(label, sizeof label, "%s %lldx%lldx%lld", names[p], (long long)M, (long long)K,
                     (long long)N);
            printf("%-26s %9.2f %9.2f %9.2f %9.2f %8.3f %8.3f %8.3f\n", label, m[0], m[1], m[3], m[2],
                   m[0] / m[1], m[0] / m[3], m[0] / m[2]);
            fflush(stdout);
        }
        for (int d = 1; d < 3; d++) {
            em_free(xs[d]);
            em_free(ws[d]);
            em_free(gs[d]);
        }
        em_free(x);
        em_free(w);
        em_free(g);
    }
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 7) reps = 7;
    if (reps > MAX_REPS / 2) reps = MAX_REPS / 2;
    const char *eb = getenv("OPENBLAS_NUM_THREADS"), *ee = getenv("EMBER_NUM_THREADS");
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("ember bench_ops: %s; ember pool threads %d (EMBER_NUM_THREADS=%s), OpenBLAS threads %d "
           "(OPENBLAS_NUM_THREADS=%s)\n",
           model, em_num_threads(), ee ? ee : "unset", blas_thread_count(), eb ? eb : "unset");
    double t0 = now();
    if (argc > 2 && !strcmp(argv[2], "low")) {
        bench_low(reps);
        printf("\ntotal %.1f s\n", now() - t0);
        return 0;
    }
    bench_matmul(reps);
    bench_elementwise(reps);
    bench_interference(reps * 2);
    bench_call_cost(reps);
    bench_low(reps);
    printf("\ntotal %.1f s\n", now() - t0);
    return 0;
}
