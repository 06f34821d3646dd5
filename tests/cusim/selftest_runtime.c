/* selftest_runtime.c — the emulator's runtime (runtime.c, memory.c) tested
 * on its own, with stub_exec_for_runtime_tests.c standing in for exec.c:
 * a "kernel" here is a host function the stub calls once, with device
 * memory open. Each test is one behaviour; the death tests run in a forked
 * child and check its signal and stderr. Built and run (also under
 * ASan/UBSan, and with the mprotect fallback) by tests/cusim/selftest.sh.
 *
 * `selftest_runtime bench` measures what a drain costs with 200 live
 * allocations (the protection toggling). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "cusim_impl.h"

void stub_exec_fail(void);

static int failures;
#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                                  \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)
#define OK(call) CHECK((call) == cudaSuccess)

/* ---- helpers ------------------------------------------------------------------------- */

/* queues run(args) as a one-thread "kernel" on s */
static int launch(const char *name, void (*run)(void *), void *args, cudaStream_t s)
{
    cusim_launch *l = calloc(1, sizeof *l);
    l->func = (const void *)run;
    l->name = name;
    for (int i = 0; i < 3; i++) l->grid[i] = l->block[i] = 1;
    l->run = run;
    l->args = args;
    return cusim_launch_kernel(l, s);
}

typedef struct {
    int *p;
    int v;
} store_args;
static void store_kernel(void *a)
{
    store_args *s = a;
    *s->p = s->v;
}
typedef struct {
    int *dst;
    const int *src;
} move_args;
static void move_kernel(void *a)
{
    move_args *m = a;
    *m->dst = *m->src;
}

/* runs fn in a child; its stderr into out (cap bytes); returns the wait status */
static int in_child(void (*fn)(void), char *out, size_t cap)
{
    int pipefd[2];
    if (pipe(pipefd)) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        fn();
        _exit(0);
    }
    close(pipefd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = read(pipefd[0], out + got, cap - 1 - got)) > 0) got += (size_t)r;
    out[got] = 0;
    close(pipefd[0]);
    int status;
    waitpid(pid, &status, 0);
    return status;
}

static bool died_saying(void (*fn)(void), const char *want, const char *also)
{
    char err[4096];
    int status = in_child(fn, err, sizeof err);
    bool ok = WIFSIGNALED(status) && strstr(err, want) && (!also || strstr(err, also));
    if (!ok) fprintf(stderr, "  child status %#x, stderr:\n%s\n", status, err);
    return ok;
}

/* ---- memory and copies ---------------------------------------------------------------- */

static void test_copies_round_trip(void)
{
    int host[256], back[256];
    for (int i = 0; i < 256; i++) host[i] = i * 7;
    int *a, *b;
    OK(cudaMalloc((void **)&a, sizeof host));
    OK(cudaMalloc((void **)&b, sizeof host));
    CHECK((uintptr_t)a % 256 == 0);
    OK(cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(b, a, sizeof host, cudaMemcpyDeviceToDevice));
    OK(cudaMemcpy(back, b, sizeof host, cudaMemcpyDefault));
    CHECK(!memcmp(host, back, sizeof host));
    OK(cudaMemset(b, 0, 16));
    OK(cudaMemcpy(back, b, sizeof host, cudaMemcpyDeviceToHost));
    CHECK(back[0] == 0 && back[3] == 0 && back[4] == 28);
    OK(cudaFree(a));
    OK(cudaFree(b));
}

static void test_lookup_names_allocations(void)
{
    char *p;
    OK(cudaMalloc((void **)&p, 1000));
    cusim_alloc_info info;
    CHECK(cusim_mem_lookup(p + 10, 100, &info) == CUSIM_MEM_DEVICE && info.base == p && info.size == 1000);
    CHECK(cusim_mem_lookup(p + 990, 20, &info) == CUSIM_MEM_INVALID && !info.freed);
    CHECK(cusim_mem_lookup(&info, sizeof info, NULL) == CUSIM_MEM_OTHER);
    OK(cudaFree(p));
    CHECK(cusim_mem_lookup(p, 4, &info) == CUSIM_MEM_INVALID && info.freed);
}

static void test_copy_rejects_range_past_allocation(void)
{
    char *p, host[64];
    OK(cudaMalloc((void **)&p, 32));
    CHECK(cudaMemcpy(host, p, 64, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK(strstr(cusim_last_message(), "runs 32 bytes past the end of a 32-byte allocation"));
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaMemcpy(host, p, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue); /* wrong direction */
    cudaGetLastError();
    OK(cudaFree(p));
    CHECK(cudaFree(p) == cudaErrorInvalidValue);
    CHECK(strstr(cusim_last_message(), "double free"));
    cudaGetLastError();
}

static void oom_child(void)
{
    void *p, *q;
    if (cudaMalloc(&p, (9ull << 30)) != cudaErrorMemoryAllocation) _exit(1);
    if (cudaGetLastError() != cudaErrorMemoryAllocation) _exit(2);
    if (cudaMalloc(&p, (5ull << 30)) != cudaSuccess) _exit(3);
    if (cudaMalloc(&q, (4ull << 30)) != cudaErrorMemoryAllocation) _exit(4);
    cudaGetLastError();
    if (cudaSetDevice(1) || cudaMalloc(&q, (4ull << 30))) _exit(5); /* the other device has its own 8 GiB */
    if (cudaFree(p) || cudaFree(q)) _exit(6);
    _exit(0);
}

static void test_malloc_beyond_device_memory_fails(void)
{
    char err[1024];
    int status =
        in_child(oom_child, err, sizeof err); /* a child: it must not see this process's allocations */
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) fprintf(stderr, "  status %#x: %s\n", status, err);
}

/* ---- protection ----------------------------------------------------------------------- */

static void host_reads_device(void)
{
    char *p;
    cudaMalloc((void **)&p, 100);
    volatile char c = p[10];
    (void)c;
}

static void test_host_dereference_dies_with_message(void)
{
    CHECK(
        died_saying(host_reads_device, "host code dereferenced device memory at",
                    "(10 bytes into a 100-byte allocation on cuda:0); copy it to the host with cudaMemcpy"));
}

static void oob_kernel(void *a)
{
    volatile char *p = a;
    p[1024 + 64] = 1;
}
static void kernel_runs_past_end(void)
{
    char *p;
    cudaMalloc((void **)&p, 1024);
    launch("oob_kernel", oob_kernel, p, NULL);
    cudaDeviceSynchronize();
}

static void test_kernel_past_end_dies_with_message(void)
{
    CHECK(died_saying(kernel_runs_past_end, "kernel oob_kernel accessed",
                      "64 bytes past the end of a 1024-byte allocation"));
}

static void uaf_kernel(void *a) { *(volatile int *)a = 1; }
static void kernel_uses_freed(void)
{
    int *p;
    cudaMalloc((void **)&p, 64);
    cudaFree(p);
    launch("uaf_kernel", uaf_kernel, p, NULL);
    cudaDeviceSynchronize();
}

static void test_use_after_free_dies_with_message(void)
{
    CHECK(died_saying(kernel_uses_freed, "kernel uaf_kernel accessed", "that was freed"));
}

/* ---- stream order --------------------------------------------------------------------- */

static void test_d2h_into_pinned_lands_at_sync(void)
{
    int *d, *pinned, v = 42;
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudaMalloc((void **)&d, sizeof v));
    OK(cudaMallocHost((void **)&pinned, sizeof v));
    *pinned = -1;
    OK(cudaMemcpyAsync(d, &v, sizeof v, cudaMemcpyHostToDevice, s));
    OK(cudaMemcpyAsync(pinned, d, sizeof v, cudaMemcpyDeviceToHost, s));
    CHECK(*pinned == -1); /* not yet: a read before the sync is a bug the emulator shows */
    OK(cudaStreamSynchronize(s));
    CHECK(*pinned == 42);
    OK(cudaFreeHost(pinned));
    OK(cudaFree(d));
    OK(cudaStreamDestroy(s));
}

static void test_d2h_into_pageable_completes_before_return(void)
{
    int *d, v = 5, out = 0; /* CUDA: "returns only once the copy has completed" */
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudaMalloc((void **)&d, sizeof v));
    OK(cudaMemcpyAsync(d, &v, sizeof v, cudaMemcpyHostToDevice, s));
    OK(cudaMemcpyAsync(&out, d, sizeof v, cudaMemcpyDeviceToHost, s));
    CHECK(out == 5);
    OK(cudaFree(d));
    OK(cudaStreamDestroy(s));
}

static void test_h2d_reads_pinned_source_when_it_runs(void)
{
    int *d, *pinned, pageable = 1, out;
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudaMalloc((void **)&d, 2 * sizeof(int)));
    OK(cudaMallocHost((void **)&pinned, sizeof(int)));
    *pinned = 1;
    OK(cudaMemcpyAsync(d, pinned, sizeof(int), cudaMemcpyHostToDevice, s));
    OK(cudaMemcpyAsync(d + 1, &pageable, sizeof(int), cudaMemcpyHostToDevice, s));
    *pinned = 2;  /* overwritten before the copy ran: the device gets 2 */
    pageable = 2; /* pageable memory was staged at the call: the device keeps 1 */
    OK(cudaStreamSynchronize(s));
    OK(cudaMemcpy(&out, d, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(out == 2);
    OK(cudaMemcpy(&out, d + 1, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(out == 1);
    OK(cudaFreeHost(pinned));
    OK(cudaFree(d));
    OK(cudaStreamDestroy(s));
}

static void test_second_stream_needs_wait_event(void)
{
    cudaStream_t a, b;
    cudaEvent_t e;
    OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    int *x, *y, out;
    OK(cudaMalloc((void **)&x, sizeof(int)));
    OK(cudaMalloc((void **)&y, sizeof(int)));
    OK(cudaMemset(x, 0, sizeof(int)));
    OK(cudaDeviceSynchronize());
    store_args st = {x, 7};
    move_args mv = {y, x};
    /* forgotten wait: b reads x before a wrote it */
    OK(launch("store", store_kernel, &st, a));
    OK(launch("move", move_kernel, &mv, b));
    OK(cudaStreamSynchronize(b));
    OK(cudaMemcpy(&out, y, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(out == 0);
    OK(cudaStreamSynchronize(a));
    /* with the wait: b sees a's write */
    st.v = 9;
    OK(launch("store", store_kernel, &st, a));
    OK(cudaEventRecord(e, a));
    OK(cudaStreamWaitEvent(b, e, 0));
    OK(cudaEventDestroy(e)); /* allowed while the wait is pending */
    OK(launch("move", move_kernel, &mv, b));
    OK(cudaStreamSynchronize(b));
    OK(cudaMemcpy(&out, y, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(out == 9);
    OK(cudaFree(x));
    OK(cudaFree(y));
    OK(cudaStreamDestroy(a));
    OK(cudaStreamDestroy(b));
}

static void test_queries_say_not_ready_then_finish(void)
{
    cudaStream_t s;
    cudaEvent_t e;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudaEventCreate(&e));
    CHECK(cudaEventQuery(e) == cudaSuccess); /* never recorded */
    int *x, out = 0;
    OK(cudaMalloc((void **)&x, sizeof(int)));
    store_args st = {x, 3};
    OK(launch("store", store_kernel, &st, s));
    OK(cudaEventRecord(e, s));
    CHECK(cudaEventQuery(e) == cudaErrorNotReady);
    CHECK(cudaGetLastError() == cudaSuccess); /* NotReady is not an error */
    CHECK(cudaEventQuery(e) == cudaSuccess);
    OK(cudaMemcpy(&out, x, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(out == 3);
    OK(launch("store", store_kernel, &st, s));
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    CHECK(cudaStreamQuery(s) == cudaSuccess);
    CHECK(cudaStreamQuery(s) == cudaSuccess);
    OK(cudaEventDestroy(e));
    OK(cudaStreamDestroy(s));
    OK(cudaFree(x));
}

static void test_destroyed_stream_still_runs_its_work(void)
{
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *x, out = 0;
    OK(cudaMalloc((void **)&x, sizeof(int)));
    store_args st = {x, 11};
    OK(launch("store", store_kernel, &st, s));
    OK(cudaStreamDestroy(s));
    CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    OK(cudaDeviceSynchronize());
    OK(cudaMemcpy(&out, x, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(out == 11);
    OK(cudaFree(x));
}

static void test_event_of_other_device_is_rejected(void)
{
    cudaEvent_t e;
    cudaStream_t s;
    OK(cudaSetDevice(0));
    OK(cudaEventCreate(&e));
    OK(cudaSetDevice(1));
    OK(cudaStreamCreate(&s));
    CHECK(cudaEventRecord(e, s) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    OK(cudaStreamDestroy(s));
    OK(cudaSetDevice(0));
    OK(cudaEventDestroy(e));
}

static void test_peer_copy_between_devices(void)
{
    int *d0, *d1, v = 77, out = 0;
    OK(cudaSetDevice(0));
    OK(cudaMalloc((void **)&d0, sizeof v));
    OK(cudaMemcpy(d0, &v, sizeof v, cudaMemcpyHostToDevice));
    OK(cudaSetDevice(1));
    OK(cudaMalloc((void **)&d1, sizeof v));
    OK(cudaMemcpyPeerAsync(d1, 1, d0, 0, sizeof v, NULL));
    CHECK(cudaMemcpyPeerAsync(d1, 0, d0, 0, sizeof v, NULL) == cudaErrorInvalidValue); /* d1 is on cuda:1 */
    cudaGetLastError();
    OK(cudaMemcpy(&out, d1, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(out == 77);
    OK(cudaFree(d1));
    OK(cudaSetDevice(0));
    OK(cudaFree(d0));
}

static void test_invalid_launch_sets_last_error(void)
{
    cusim_launch *l = calloc(1, sizeof *l);
    l->func = (const void *)store_kernel;
    l->name = "empty grid";
    l->block[0] = l->block[1] = l->block[2] = 1; /* grid stays 0 */
    l->run = store_kernel;
    CHECK(cusim_launch_kernel(l, NULL) == cudaErrorInvalidConfiguration);
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);
}

static void test_dynamic_smem_attribute(void)
{
    cusim_launch *l = calloc(1, sizeof *l);
    int x;
    store_args st = {&x, 1};
    for (int i = 0; i < 3; i++) l->grid[i] = l->block[i] = 1;
    l->func = (const void *)move_kernel;
    l->name = "big smem";
    l->run = store_kernel;
    l->args = &st;
    l->smem = 100 * 1024;
    CHECK(cusim_launch_kernel(l, NULL) == cudaErrorInvalidValue); /* over the default 48 KiB */
    cudaGetLastError();
    CHECK(cudaFuncSetAttribute((const void *)move_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               232449) == cudaErrorInvalidValue);
    cudaGetLastError();
    OK(cudaFuncSetAttribute((const void *)move_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
    l = calloc(1, sizeof *l);
    for (int i = 0; i < 3; i++) l->grid[i] = l->block[i] = 1;
    l->func = (const void *)move_kernel;
    l->name = "big smem";
    l->run = store_kernel;
    l->args = &st;
    l->smem = 100 * 1024;
    OK(cusim_launch_kernel(l, NULL));
    OK(cudaDeviceSynchronize());
    CHECK(x == 1);
}

static void failing_kernel(void *a)
{
    (void)a;
    stub_exec_fail();
}
static void sticky_child(void)
{
    int *x, out;
    cudaMalloc((void **)&x, 4);
    launch("failing", failing_kernel, NULL, NULL);
    if (cudaDeviceSynchronize() != cudaErrorLaunchFailure) _exit(1);
    if (cudaGetLastError() != cudaErrorLaunchFailure) _exit(2);
    if (cudaGetLastError() != cudaErrorLaunchFailure) _exit(3); /* cannot be cleared */
    if (cudaMemcpy(&out, x, 4, cudaMemcpyDeviceToHost) != cudaErrorLaunchFailure) _exit(4);
    if (launch("after", failing_kernel, NULL, NULL) != cudaErrorLaunchFailure) _exit(5);
    _exit(0);
}

static void test_failed_kernel_error_is_sticky(void)
{
    char err[1024];
    int status = in_child(sticky_child, err, sizeof err);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) fprintf(stderr, "  status %#x: %s\n", status, err);
}

static void test_device_properties(void)
{
    struct cudaDeviceProp p;
    int n, v;
    OK(cudaGetDeviceCount(&n));
    CHECK(n == 2);
    OK(cudaGetDeviceProperties(&p, 1));
    CHECK(p.major == 9 && p.minor == 0 && p.sharedMemPerBlock == 48 * 1024 &&
          p.sharedMemPerBlockOptin == 232448);
    CHECK(p.totalGlobalMem == (8ull << 30) && p.multiProcessorCount == 132 && p.maxThreadsPerBlock == 1024);
    CHECK(!strcmp(p.name, "ember cusim sm_90 (emulated)"));
    CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice);
    cudaGetLastError();
    OK(cudaDriverGetVersion(&v));
    CHECK(v == 13000);
    CHECK(!strcmp(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady"));
    CHECK(!strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory"));
}

/* ---- host threads --------------------------------------------------------------------- */

static void add_one(void *ctx) { (*(int *)ctx)++; }

/* each thread: its device, its stream, copies and queued work, many times */
static void *thread_body(void *arg)
{
    long t = (long)arg;
    int bad = 0;
    if (cudaSetDevice((int)(t % 2))) return (void *)1;
    cudaStream_t s;
    int *d, v, out;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMalloc((void **)&d, sizeof v))
        return (void *)1;
    for (int i = 0; i < 300; i++) {
        v = (int)t * 1000 + i;
        bad += cudaMemcpyAsync(d, &v, sizeof v, cudaMemcpyHostToDevice, s) != cudaSuccess;
        bad += cusim_enqueue_host_fn(s, add_one, d, NULL) != 0;
        bad += cudaMemcpyAsync(&out, d, sizeof out, cudaMemcpyDeviceToHost, s) != cudaSuccess;
        bad += out != v + 1;
    }
    bad += cudaFree(d) != cudaSuccess;
    bad += cudaStreamDestroy(s) != cudaSuccess;
    return (void *)(long)bad;
}

static void test_host_threads_work_concurrently(void)
{
    pthread_t th[6];
    for (long t = 0; t < 6; t++) pthread_create(&th[t], NULL, thread_body, (void *)t);
    for (int t = 0; t < 6; t++) {
        void *bad;
        pthread_join(th[t], &bad);
        CHECK(bad == NULL);
    }
}

/* ---- the cost of a drain -------------------------------------------------------------- */

typedef struct touch_args {
    char **p;
    int n;
} touch_args;

/* device work touching the first n allocations */
static void touch(void *ctx)
{
    touch_args *t = ctx;
    for (int i = 0; i < t->n; i++) t->p[i][0]++;
}

static void bench(void)
{
    enum { ALLOCS = 200, ROUNDS = 2000 };
    char *p[ALLOCS];
    for (int i = 0; i < ALLOCS; i++) cudaMalloc((void **)&p[i], 4096 + 64 * (size_t)i);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    const char *mode = getenv("EMBER_CUSIM_PROTECT");
    for (int touched = 0; touched <= 16; touched += 8) {
        touch_args t = {p, touched};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int r = 0; r < ROUNDS; r++) {
            cusim_enqueue_host_fn(s, touch, &t, NULL);
            cudaStreamSynchronize(s);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / ROUNDS;
        printf("EMBER_CUSIM_PROTECT=%s, %d live allocations, work touching %2d of them: %8.2f us per drain\n",
               mode ? mode : "(default)", ALLOCS, touched, ns / 1000);
    }
    for (int i = 0; i < ALLOCS; i++) cudaFree(p[i]);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        bench();
        return 0;
    }
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
#define T(f) {#f, f}
        T(test_device_properties),
        T(test_copies_round_trip),
        T(test_lookup_names_allocations),
        T(test_copy_rejects_range_past_allocation),
        T(test_malloc_beyond_device_memory_fails),
        T(test_host_dereference_dies_with_message),
        T(test_kernel_past_end_dies_with_message),
        T(test_use_after_free_dies_with_message),
        T(test_d2h_into_pinned_lands_at_sync),
        T(test_d2h_into_pageable_completes_before_return),
        T(test_h2d_reads_pinned_source_when_it_runs),
        T(test_second_stream_needs_wait_event),
        T(test_queries_say_not_ready_then_finish),
        T(test_destroyed_stream_still_runs_its_work),
        T(test_event_of_other_device_is_rejected),
        T(test_peer_copy_between_devices),
        T(test_invalid_launch_sets_last_error),
        T(test_dynamic_smem_attribute),
        T(test_failed_kernel_error_is_sticky),
        T(test_host_threads_work_concurrently),
#undef T
    };
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        int before = failures;
        tests[i].fn();
        printf("%s %s\n", failures == before ? "ok  " : "FAIL", tests[i].name);
    }
    printf("%s: %d failure%s\n", failures ? "FAILED" : "passed", failures, failures == 1 ? "" : "s");
    return failures != 0;
}
