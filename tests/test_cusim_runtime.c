/* test_cusim_runtime.c — ember's CUDA emulator (tests/cusim) checked by the
 * suite: the runtime's own behaviours ember relies on. Host code reading
 * device memory dies naming the allocation; lazy stream order (pinned
 * copies, a second stream with and without cudaStreamWaitEvent, event
 * queries); the sticky error; cuBLAS's argument rules and TF32; NCCL across
 * processes; ember's collectives and DDP over NCCL; and the NCCL
 * emulation's own selftest. The execution model's checkers are
 * tests/test_cusim.c.
 *
 * Each test runs in its own process (the runner forks), so the emulator's
 * settings, read once at the first CUDA call, are set at each test's start,
 * and a sticky error ends with the test.
 *
 * Only the sim build (meson -Dcuda=sim) has the emulator: elsewhere every
 * test skips, saying so. */
#include <stdint.h>
#include <stdlib.h>

#include "ember_config.h"
#include "harness.h"

/* every test of this file, for the builds without the emulator */
#define CUSIM_RUNTIME_TESTS(X)                                                                               \
    X(test_cusim_host_code_reading_device_memory_dies_naming_the_allocation)                                 \
    X(test_cusim_copy_into_pinned_memory_lands_only_at_the_sync)                                             \
    X(test_cusim_second_stream_without_wait_event_reads_stale_data)                                          \
    X(test_cusim_second_stream_after_wait_event_reads_the_new_data)                                          \
    X(test_cusim_event_query_says_not_ready_then_ready)                                                      \
    X(test_cusim_failed_kernel_error_is_sticky)                                                              \
    X(test_cusim_cublas_rejects_a_leading_dimension_below_the_rows)                                          \
    X(test_cusim_cublas_rejects_an_unsupported_type_combination)                                             \
    X(test_cusim_cublas_tf32_product_rounds_its_inputs)                                                      \
    X(test_cusim_nccl_all_reduce_gives_both_ranks_identical_bits)                                            \
    X(test_cusim_nccl_all_reduce_meeting_a_broadcast_fails_on_both_ranks_naming_both)                        \
    X(test_cusim_nccl_peer_that_dies_is_named)                                                               \
    X(test_cusim_ember_all_reduce_of_cuda_tensors_gives_both_ranks_identical_bits)                           \
    X(test_cusim_ember_gather_of_cuda_tensors_concatenates_at_the_root)                                      \
    X(test_cusim_ddp_over_nccl_at_world_4_averages_cuda_gradients)                                           \
    X(test_cusim_nccl_selftest_passes_every_collective_dtype_world_and_failure)

#if !EM_CUDA_SIM

#define SKIPPED(name)                                                                                        \
    TEST(name) { SKIP("the CUDA emulator's test: needs the sim build (meson -Dcuda=sim)"); }
CUSIM_RUNTIME_TESTS(SKIPPED)

#else

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cusim_faults.h"
#include "cusim_test.h"
#include "dist_util.h"

/* ---- device memory from host code ---------------------------------------------------------- */

static void read_device_memory_from_host(void *ctx)
{
    int **where = ctx;
    int *d = device_alloc(256 * sizeof(int));
    *where = d; /* shared with the parent: the address the message must name */
    CUDA_OK(cudaMemset(d, 0, 256 * sizeof(int)));
    CUDA_OK(cudaDeviceSynchronize());
    volatile int *p = d + 10;
    printf("%d\n", *p); /* the bug: a device pointer dereferenced on the host */
}

/* the child dies by a signal, its last words naming the address and the allocation */
static void check_host_read_dies(const char *file, int line, const char *protect)
{
    setenv("EMBER_CUSIM_PROTECT", protect, 1);
    int **where = mmap(NULL, sizeof *where, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(where != MAP_FAILED);
    char err[4096];
    int status = run_child(read_device_memory_from_host, where, err, sizeof err);
    if (!WIFSIGNALED(status))
        th_fail(file, line, "EMBER_CUSIM_PROTECT=%s: the child lived: %s", protect, err);
    char want[160];
    snprintf(
        want, sizeof want,
        "cusim: host code dereferenced device memory at %p (40 bytes into a 1024-byte allocation on cuda:0); "
        "copy it to the host with cudaMemcpy",
        (void *)(*where + 10));
    if (!strstr(err, want))
        th_fail(file, line, "EMBER_CUSIM_PROTECT=%s: stderr lacks \"%s\": %s", protect, want, err);
}

TEST(test_cusim_host_code_reading_device_memory_dies_naming_the_allocation)
{
    emulator("in-order");
    check_host_read_dies(__FILE__, __LINE__, "1");        /* protection keys where the CPU has them */
    check_host_read_dies(__FILE__, __LINE__, "mprotect"); /* the fallback */
}

/* ---- stream order -------------------------------------------------------------------------- */

static cudaStream_t new_stream(void)
{
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}

TEST(test_cusim_copy_into_pinned_memory_lands_only_at_the_sync)
{
    emulator("in-order");
    int src[4] = {1, 2, 3, 4}, *d = device_alloc(sizeof src), *h = NULL;
    CUDA_OK(cudaMemcpy(d, src, sizeof src, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMallocHost((void **)&h, sizeof src));
    memset(h, 0, sizeof src);
    cudaStream_t s = new_stream();
    CUDA_OK(cudaMemcpyAsync(h, d, sizeof src, cudaMemcpyDeviceToHost, s));
    CHECK(h[0] == 0 && h[3] == 0); /* read before the sync: the old data */
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK(h[0] == 1 && h[3] == 4);
    CUDA_OK(cudaFreeHost(h));
    CUDA_OK(cudaStreamDestroy(s));
}

/* stream a fills d with 0x7f; stream b copies d into pinned host memory,
 * ordered after a by an event or not; returns the first byte b copied */
static unsigned char read_on_second_stream(bool wait_event)
{
    enum { N = 64 };
    unsigned char *d = device_alloc(N), *h = NULL;
    CUDA_OK(cudaMemset(d, 0, N));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMallocHost((void **)&h, N));
    cudaStream_t a = new_stream(), b = new_stream();
    cudaEvent_t written;
    CUDA_OK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    CUDA_OK(cudaMemsetAsync(d, 0x7f, N, a));
    CUDA_OK(cudaEventRecord(written, a));
    if (wait_event) CUDA_OK(cudaStreamWaitEvent(b, written, 0));
    CUDA_OK(cudaMemcpyAsync(h, d, N, cudaMemcpyDeviceToHost, b));
    CUDA_OK(cudaStreamSynchronize(b));
    unsigned char first = h[0];
    CHECK(h[N - 1] == first);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaEventDestroy(written));
    CUDA_OK(cudaStreamDestroy(a));
    CUDA_OK(cudaStreamDestroy(b));
    CUDA_OK(cudaFreeHost(h));
    CUDA_OK(cudaFree(d));
    return first;
}

TEST(test_cusim_second_stream_without_wait_event_reads_stale_data)
{
    CHECK(read_on_second_stream(false) == 0);
}

TEST(test_cusim_second_stream_after_wait_event_reads_the_new_data)
{
    CHECK(read_on_second_stream(true) == 0x7f);
}

TEST(test_cusim_event_query_says_not_ready_then_ready)
{
    emulator("in-order");
    int *d = device_alloc(sizeof(int)), got = 0;
    cudaStream_t s = new_stream();
    cudaEvent_t e;
    CUDA_OK(cudaEventCreate(&e));
    CUDA_OK(cudaMemsetAsync(d, 0x01, sizeof(int), s));
    CUDA_OK(cudaEventRecord(e, s));
    CHECK(cudaEventQuery(e) == cudaErrorNotReady);
    CHECK(cudaGetLastError() == cudaSuccess); /* not ready is an answer, not an error */
    CHECK(cudaEventQuery(e) == cudaSuccess);
    CUDA_OK(cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got == 0x01010101);
    CUDA_OK(cudaEventDestroy(e));
    CUDA_OK(cudaStreamDestroy(s));
}

TEST(test_cusim_failed_kernel_error_is_sticky)
{
    emulator("in-order");
    capture_stderr();
    float *x = reduction_input(), *out = device_alloc(sizeof(float));
    CUDA_OK(cf_reduce_in_shared(x, out, RED_N, false));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    /* cudaGetLastError does not clear it, and every later call returns it */
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 16) == cudaErrorLaunchFailure);
    CHECK(cf_reduce_in_shared(x, out, RED_N, true) == cudaErrorLaunchFailure);
    float sum = 0;
    CHECK(cudaMemcpy(&sum, out, sizeof sum, cudaMemcpyDeviceToHost) == cudaErrorLaunchFailure);
    CHECK(cudaStreamSynchronize(NULL) == cudaErrorLaunchFailure);
}

/* ---- cuBLAS -------------------------------------------------------------------------------- */

/* C (m,n) = A (m,k) B (k,n), column-major f32, leading dimensions as given */
static cublasStatus_t gemm(cublasHandle_t h, int m, int n, int k, const float *a, int lda, const float *b,
                           int ldb, cudaDataType ctype, float *c, int ldc, cublasComputeType_t compute)
{
    float one = 1, zero = 0;
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb,
                        &zero, c, ctype, ldc, compute, CUBLAS_GEMM_DEFAULT);
}

TEST(test_cusim_cublas_rejects_a_leading_dimension_below_the_rows)
{
    emulator("in-order");
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    float *d = device_alloc(64 * sizeof(float));
    CHECK(gemm(h, 4, 4, 4, d, 3, d, 4, CUDA_R_32F, d, 4, CUBLAS_COMPUTE_32F) ==
          CUBLAS_STATUS_INVALID_VALUE); /* lda */
    CHECK(gemm(h, 4, 4, 4, d, 4, d, 3, CUDA_R_32F, d, 4, CUBLAS_COMPUTE_32F) ==
          CUBLAS_STATUS_INVALID_VALUE); /* ldb */
    CHECK(gemm(h, 4, 4, 4, d, 4, d, 4, CUDA_R_32F, d, 3, CUBLAS_COMPUTE_32F) ==
          CUBLAS_STATUS_INVALID_VALUE); /* ldc */
    CHECK(gemm(h, 4, 4, 4, d, 4, d, 4, CUDA_R_32F, d, 4, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
}

TEST(test_cusim_cublas_rejects_an_unsupported_type_combination)
{
    emulator("in-order");
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    float *d = device_alloc(64 * sizeof(float));
    /* f32 inputs into an f16 output is not a row of cublasGemmEx's table */
    CHECK(gemm(h, 4, 4, 4, d, 4, d, 4, CUDA_R_16F, d, 4, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_NOT_SUPPORTED);
    /* nor f32 matrices under a 64-bit compute type */
    CHECK(gemm(h, 4, 4, 4, d, 4, d, 4, CUDA_R_32F, d, 4, CUBLAS_COMPUTE_64F) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
}

TEST(test_cusim_cublas_tf32_product_rounds_its_inputs)
{
    emulator("in-order");
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    /* A (2,2) = 1 + 2^-12 everywhere (TF32 keeps 10 bits: it rounds to 1), B = ones */
    float a[4], b[4] = {1, 1, 1, 1}, c32[4], ctf[4];
    for (int i = 0; i < 4; i++) a[i] = 1 + 0x1p-12f;
    float *da = device_alloc(sizeof a), *db = device_alloc(sizeof b), *dc = device_alloc(sizeof a);
    CUDA_OK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
    CHECK(gemm(h, 2, 2, 2, da, 2, db, 2, CUDA_R_32F, dc, 2, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS);
    CUDA_OK(cudaMemcpy(c32, dc, sizeof c32, cudaMemcpyDeviceToHost));
    CHECK(gemm(h, 2, 2, 2, da, 2, db, 2, CUDA_R_32F, dc, 2, CUBLAS_COMPUTE_32F_FAST_TF32) ==
          CUBLAS_STATUS_SUCCESS);
    CUDA_OK(cudaMemcpy(ctf, dc, sizeof ctf, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4; i++) {
        CHECK(c32[i] == 2 + 0x1p-11f); /* f32: exact */
        CHECK(ctf[i] == 2.0f);         /* TF32: the inputs rounded first */
    }
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
}

/* ---- NCCL across processes ----------------------------------------------------------------- */

enum { NCCL_N = 1000, MAX_RANKS = 4 };

/* what the ranks tell the parent (shared memory) */
typedef struct nccl_shared {
    ncclUniqueId id;
    int pid[MAX_RANKS];
    uint32_t bits[MAX_RANKS][NCCL_N];
} nccl_shared;

static nccl_shared *shared_page(void)
{
    nccl_shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(s != MAP_FAILED);
    memset(s, 0, sizeof *s);
    return s;
}

typedef void (*rank_body)(int rank, nccl_shared *s);

/* Runs body as ranks 0..world-1, forked processes on cuda:rank with their
 * stderr kept in err[rank]; a CHECK failing in a rank fails the test. */
static void nccl_ranks(int world, rank_body body, nccl_shared *s, char err[][4096], const int *want_exit)
{
    CHECK(ncclGetUniqueId(&s->id) == ncclSuccess);
    pid_t pid[MAX_RANKS];
    int fd[MAX_RANKS];
    for (int r = 0; r < world; r++) {
        char path[PATH_MAX];
        fd[r] = th_tmpfile(path, sizeof path, "ember-cusim-rank");
        unlink(path);
        fflush(stdout);
        fflush(stderr);
        pid[r] = fork();
        CHECK(pid[r] >= 0);
        if (pid[r] == 0) {
            dup2(fd[r], STDERR_FILENO);
            s->pid[r] = getpid();
            CUDA_OK(cudaSetDevice(r));
            body(r, s);
            exit(0);
        }
    }
    for (int r = 0; r < world; r++) {
        int st = 0;
        CHECK(waitpid(pid[r], &st, 0) == pid[r]);
        ssize_t n = pread(fd[r], err[r], 4095, 0);
        err[r][n > 0 ? n : 0] = 0;
        close(fd[r]);
        int want = want_exit ? want_exit[r] : 0;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != want)
            th_fail(__FILE__, __LINE__, "rank %d ended with status 0x%x, want exit %d; stderr: %s", r, st,
                    want, err[r]);
    }
}

static float nccl_value(int rank, int i)
{
    return 0.1f * (float)(i + 1) * (float)(rank + 1) + 1e-3f * (float)rank;
}

static ncclComm_t join(int rank, int world, nccl_shared *s)
{
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRank(&c, world, s->id, rank);
    if (r != ncclSuccess)
        th_fail(__FILE__, __LINE__, "rank %d: ncclCommInitRank: %s", rank, ncclGetErrorString(r));
    return c;
}

static float *upload_values(int rank)
{
    float v[NCCL_N];
    for (int i = 0; i < NCCL_N; i++) v[i] = nccl_value(rank, i);
    float *d = device_alloc(sizeof v);
    CUDA_OK(cudaMemcpy(d, v, sizeof v, cudaMemcpyHostToDevice));
    return d;
}

static void all_reduce_rank(int rank, nccl_shared *s)
{
    ncclComm_t c = join(rank, 2, s);
    float *d = upload_values(rank);
    CHECK(ncclAllReduce(d, d, NCCL_N, ncclFloat32, ncclSum, c, NULL) == ncclSuccess);
    CUDA_OK(cudaMemcpy(s->bits[rank], d, sizeof s->bits[rank], cudaMemcpyDeviceToHost));
    CHECK(ncclCommDestroy(c) == ncclSuccess);
    CUDA_OK(cudaFree(d));
}

TEST(test_cusim_nccl_all_reduce_gives_both_ranks_identical_bits)
{
    emulator("in-order");
    nccl_shared *s = shared_page();
    char err[2][4096];
    nccl_ranks(2, all_reduce_rank, s, err, NULL);
    CHECK(memcmp(s->bits[0], s->bits[1], sizeof s->bits[0]) == 0);
    for (int i = 0; i < NCCL_N; i++) {
        float want = nccl_value(0, i) + nccl_value(1, i), got;
        memcpy(&got, &s->bits[0][i], sizeof got);
        CHECK(got == want);
    }
}

static void mismatched_rank(int rank, nccl_shared *s)
{
    ncclComm_t c = join(rank, 2, s);
    float *d = upload_values(rank);
    ncclResult_t r = rank == 0 ? ncclAllReduce(d, d, NCCL_N, ncclFloat32, ncclSum, c, NULL)
                               : ncclBroadcast(d, d, NCCL_N, ncclFloat32, 0, c, NULL);
    CHECK(r == ncclInvalidUsage);
    const char *msg = ncclGetLastError(c);
    if (!strstr(msg, "ranks called different collectives") || !strstr(msg, "all_reduce(count=1000") ||
        !strstr(msg, "broadcast(count=1000"))
        th_fail(__FILE__, __LINE__, "rank %d: the error names both calls? %s", rank, msg);
    /* the communicator stays broken: every later call fails the same way */
    CHECK(ncclAllReduce(d, d, NCCL_N, ncclFloat32, ncclSum, c, NULL) != ncclSuccess);
    CHECK(ncclCommDestroy(c) == ncclSuccess);
}

TEST(test_cusim_nccl_all_reduce_meeting_a_broadcast_fails_on_both_ranks_naming_both)
{
    emulator("in-order");
    nccl_shared *s = shared_page();
    char err[2][4096];
    nccl_ranks(2, mismatched_rank, s, err, NULL);
    for (int r = 0; r < 2; r++)
        CHECK(strstr(err[r], "cusim: nccl: ") && strstr(err[r], "broadcast(count=1000"));
}

static void dying_peer_rank(int rank, nccl_shared *s)
{
    ncclComm_t c = join(rank, 2, s);
    if (rank == 1) _exit(3); /* the bug: a rank that dies with its peers waiting */
    float *d = upload_values(rank);
    CHECK(ncclAllReduce(d, d, NCCL_N, ncclFloat32, ncclSum, c, NULL) == ncclRemoteError);
    char want[96];
    snprintf(want, sizeof want, "rank 1 (pid %d) exited while rank 0 waited for it", s->pid[1]);
    const char *msg = ncclGetLastError(c);
    if (!strstr(msg, want)) th_fail(__FILE__, __LINE__, "the error lacks \"%s\": %s", want, msg);
    ncclCommAbort(c);
}

TEST(test_cusim_nccl_peer_that_dies_is_named)
{
    emulator("in-order");
    nccl_shared *s = shared_page();
    char err[2][4096];
    nccl_ranks(2, dying_peer_rank, s, err, (const int[]){0, 3});
}

/* ---- ember's collectives and DDP over NCCL -------------------------------------------------- */

static void ember_all_reduce(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    nccl_shared *s = ctx;
    em_scope sc = em_scope_begin();
    float v[NCCL_N];
    for (int i = 0; i < NCCL_N; i++) v[i] = nccl_value(rank, i);
    em_tensor *t = em_to(em_from_data(EM_F32, 1, (int64_t[]){NCCL_N}, v), em_device_cuda(rank));
    CHECK_NOTNULL(t);
    CHECK_OK(em_all_reduce(pg, t, EM_RED_SUM, NULL));
    em_tensor *back = em_to(t, em_device_cpu());
    CHECK_NOTNULL(back);
    memcpy(s->bits[rank], em_data(back), sizeof s->bits[rank]);
    em_scope_end(sc);
}

TEST(test_cusim_ember_all_reduce_of_cuda_tensors_gives_both_ranks_identical_bits)
{
    emulator("in-order");
    nccl_shared *s = shared_page();
    TH_RANKS(2, EM_TRANSPORT_AUTO, ember_all_reduce, s);
    CHECK(memcmp(s->bits[0], s->bits[1], sizeof s->bits[0]) == 0);
    for (int i = 0; i < NCCL_N; i++) {
        float want = nccl_value(0, i) + nccl_value(1, i), got;
        memcpy(&got, &s->bits[1][i], sizeof got);
        CHECK(got == want);
    }
}

/* em_gather of CUDA tensors over NCCL: the root gets rank 0's values, then
 * rank 1's; the other rank passes no output. */
static void ember_gather(em_pg *pg, int rank, int world, void *ctx)
{
    nccl_shared *s = ctx;
    em_scope sc = em_scope_begin();
    float v[NCCL_N];
    for (int i = 0; i < NCCL_N; i++) v[i] = nccl_value(rank, i);
    em_tensor *in = em_to(em_from_data(EM_F32, 1, (int64_t[]){NCCL_N}, v), em_device_cuda(rank));
    em_tensor *out = rank == 0 ? em_to(em_zeros(EM_F32, 1, (int64_t[]){world * NCCL_N}), em_device_cuda(rank)) : NULL;
    CHECK_NOTNULL(in);
    CHECK_OK(em_gather(pg, out, in, 0, NULL));
    if (rank == 0) {
        em_tensor *back = em_to(out, em_device_cpu());
        CHECK_NOTNULL(back);
        memcpy(s->bits, em_data(back), sizeof(float) * (size_t)(world * NCCL_N));
    }
    em_scope_end(sc);
}

TEST(test_cusim_ember_gather_of_cuda_tensors_concatenates_at_the_root)
{
    emulator("in-order");
    nccl_shared *s = shared_page();
    TH_RANKS(2, EM_TRANSPORT_AUTO, ember_gather, s);
    const float *got = (const float *)s->bits;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NCCL_N; i++) CHECK(got[r * NCCL_N + i] == nccl_value(r, i));
}

/* CUDA calls go through the group's check before NCCL sees them (NCCL would
 * hang on a mismatch): a CUDA all_reduce meeting a CPU all_reduce, or a CUDA
 * broadcast, and a CUDA send meeting a recv of another dtype, fail both
 * ranks at once naming both calls. */
typedef struct cuda_case {
    int which;
    const char *want[2];
} cuda_case;

static void ember_cuda_mismatch(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    const cuda_case *k = ctx;
    em_scope sc = em_scope_begin();
    em_tensor *cpu = em_zeros(EM_F32, 1, (int64_t[]){4}), *gpu = em_to(cpu, em_device_cuda(rank));
    em_tensor *gpu64 = em_to(em_zeros(EM_F64, 1, (int64_t[]){4}), em_device_cuda(rank));
    CHECK_NOTNULL(gpu);
    CHECK_NOTNULL(gpu64);
    em_status s = EM_OK;
    switch (k->which) {
    case 0: s = em_all_reduce(pg, rank == 0 ? gpu : cpu, EM_RED_SUM, NULL); break;
    case 1: s = rank == 0 ? em_all_reduce(pg, gpu, EM_RED_SUM, NULL) : em_broadcast(pg, gpu, 0, NULL); break;
    default: s = rank == 0 ? em_send(pg, gpu, 1, NULL) : em_recv(pg, gpu64, 0, NULL); break;
    }
    if (s != EM_ERR_DIST)
        th_fail(__FILE__, __LINE__, "case %d, rank %d: returned %s: %s", k->which, rank, em_status_name(s),
                em_last_error());
    for (int i = 0; i < 2; i++)
        if (!strstr(em_last_error(), k->want[i]))
            th_fail(__FILE__, __LINE__, "case %d, rank %d: the message lacks \"%s\": %s", k->which, rank,
                    k->want[i], em_last_error());
    em_scope_end(sc);
}

TEST(test_cusim_ember_cuda_calls_meeting_other_calls_fail_on_both_ranks_naming_both)
{
    emulator("in-order");
    static const cuda_case cases[] = {
        {0,
         {"rank 0 called all_reduce(f32, 4 elements, sum, cuda)",
          "rank 1 called all_reduce(f32, 4 elements, sum)"}},
        {1,
         {"rank 0 called all_reduce(f32, 4 elements, sum, cuda)",
          "rank 1 called broadcast(f32, 4 elements, root 0, cuda)"}},
        {2,
         {"rank 0 called send(f32, 4 elements, to rank 1, cuda)",
          "rank 1 called recv(f64, 4 elements, from rank 0, cuda)"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        th_ranks_timeout = 5;
        TH_RANKS(2, EM_TRANSPORT_AUTO, ember_cuda_mismatch, (void *)&cases[i]);
    }
}

/* send/recv of CUDA tensors, checked, then moved by NCCL */
static void ember_cuda_send_recv(em_pg *pg, int rank, int world, void *ctx)
{
    (void)world;
    (void)ctx;
    em_scope sc = em_scope_begin();
    em_tensor *t =
        em_to(em_full(EM_F32, 1, (int64_t[]){NCCL_N}, rank == 0 ? 7.0 : 0.0), em_device_cuda(rank));
    CHECK_NOTNULL(t);
    if (rank == 0) CHECK_OK(em_send(pg, t, 1, NULL));
    if (rank == 1) CHECK_OK(em_recv(pg, t, 0, NULL));
    CHECK_OK(em_all_reduce(pg, t, EM_RED_SUM, NULL));
    em_tensor *back = em_to(t, em_device_cpu());
    CHECK_NOTNULL(back);
    CHECK(((float *)em_data(back))[NCCL_N - 1] == 14.0f);
    em_scope_end(sc);
}

TEST(test_cusim_ember_send_recv_of_cuda_tensors_then_all_reduce)
{
    emulator("in-order");
    TH_RANKS(2, EM_TRANSPORT_AUTO, ember_cuda_send_recv, NULL);
}

/* rank r's loss is sum(w * (r + 1)) + sum(v * 2(r + 1)) on cuda:r: DDP's
 * averaged gradients are the mean of 1..world (and twice that) everywhere */
static void ddp_on_cuda(em_pg *pg, int rank, int world, void *ctx)
{
    (void)ctx;
    em_module *m = em_module_new(NULL, NULL);
    CHECK_NOTNULL(m);
    CHECK_OK(em_module_add_param(m, "w", em_zeros(EM_F32, 1, (int64_t[]){5})));
    CHECK_OK(em_module_add_param(m, "v", em_zeros(EM_F32, 1, (int64_t[]){3})));
    CHECK_OK(em_module_to(m, em_device_cuda(rank)));
    em_ddp *d = em_ddp_new(pg, m, &(em_ddp_config){.bucket_mb = 1e-5}); /* one parameter per bucket */
    CHECK_NOTNULL(d);
    em_scope s = em_scope_begin();
    em_tensor *w = em_module_find(m, "w"), *v = em_module_find(m, "v");
    em_tensor *loss = em_add(em_sum(em_mul_scalar(w, rank + 1), 0, NULL, false),
                             em_sum(em_mul_scalar(v, 2.0 * (rank + 1)), 0, NULL, false));
    CHECK_OK(em_ddp_backward(d, loss, NULL));
    double mean = (world + 1) / 2.0;
    em_tensor *gw = em_to(em_grad(w), em_device_cpu()), *gv = em_to(em_grad(v), em_device_cpu());
    CHECK_NOTNULL(gw);
    CHECK_NOTNULL(gv);
    for (int i = 0; i < 5; i++) CHECK(((float *)em_data(gw))[i] == (float)mean);
    for (int i = 0; i < 3; i++) CHECK(((float *)em_data(gv))[i] == (float)(2 * mean));
    em_scope_end(s);
    em_ddp_free(d);
    em_module_free(m);
}

/* The NCCL emulation's own test program (tests/cusim/selftest_nccl.c, built
 * beside the emulator against a stand-in runtime): every collective, dtype
 * and reduction at worlds 1-4, groups, send/recv, mismatched calls and
 * counts, dead and silent peers, two ranks as threads. */
TEST(test_cusim_nccl_selftest_passes_every_collective_dtype_world_and_failure)
{
    th_run_result *r = th_run(EMBER_BUILD_DIR "/tests/cusim/cusim-nccl-selftest", NULL);
    if (r->status != 0) th_fail(__FILE__, __LINE__, "cusim-nccl-selftest exited %d:\n%s%s", r->status, r->out, r->err);
    CHECK(strstr(r->out, "ok: 0 failed") != NULL);
    CHECK(strstr(r->out, "all_reduce_every_type_and_op (4 ranks)") != NULL);
}

TEST(test_cusim_ddp_over_nccl_at_world_4_averages_cuda_gradients)
{
    emulator("in-order");
    setenv("EMBER_CUSIM_DEVICES", "4", 1); /* before anything touches CUDA: one device per rank */
    TH_RANKS(4, EM_TRANSPORT_AUTO, ddp_on_cuda, NULL);
}

#endif
