/* test_cusim.c — ember's CUDA emulator (tests/cusim) checked by the suite:
 * each checker shown catching a deliberately broken program, with the real
 * emulated runtime, and passing the broken program's correct twin; and the
 * runtime's own behaviours ember relies on (lazy stream order, the sticky
 * error, cuBLAS's argument rules and TF32, NCCL across processes, ember's
 * collectives and DDP over NCCL).
 *
 * The kernels are tests/cusim_faults.cu. A finding reaches the program two
 * ways, and the tests check both: the report (stderr "cusim: ...", kept for
 * cusim_last_message) names the kernel, the threads, the address or
 * allocation; and the CUDA call that runs the launch returns the sticky
 * cudaErrorLaunchFailure. Each test runs in its own process (the runner
 * forks), so the emulator's settings, read once at the first launch, are
 * set at each test's start, and a sticky error ends with the test.
 *
 * Only the sim build (meson -Dcuda=sim) has the emulator: elsewhere every
 * test skips, saying so. */
#include <stdint.h>
#include <stdlib.h>

#include "ember_config.h"
#include "harness.h"

/* every test of this file, for the builds without the emulator */
#define CUSIM_TESTS(X)                                                                                       \
    X(test_cusim_reduction_missing_syncthreads_is_reported_as_a_shared_memory_race)                          \
    X(test_cusim_reduction_with_syncthreads_sums_exactly_without_a_report)                                   \
    X(test_cusim_syncthreads_in_a_divergent_branch_is_reported)                                              \
    X(test_cusim_syncthreads_outside_the_branch_passes)                                                      \
    X(test_cusim_thread_exiting_while_others_wait_at_a_barrier_is_reported)                                  \
    X(test_cusim_every_thread_reaching_the_barrier_passes)                                                   \
    X(test_cusim_shuffle_whose_mask_names_exited_lanes_is_reported)                                          \
    X(test_cusim_shuffle_whose_mask_names_only_live_lanes_passes)                                            \
    X(test_cusim_global_write_one_past_the_end_is_reported)                                                  \
    X(test_cusim_global_writes_within_the_allocation_pass)                                                   \
    X(test_cusim_misaligned_double_load_is_reported)                                                         \
    X(test_cusim_aligned_double_loads_pass)                                                                  \
    X(test_cusim_kernel_using_freed_memory_is_reported)                                                      \
    X(test_cusim_last_writer_wins_is_reported_by_the_schedule_comparison)                                    \
    X(test_cusim_last_writer_wins_goes_unseen_in_one_in_order_run)                                           \
    X(test_cusim_atomic_max_twin_of_last_writer_wins_passes_the_comparison)                                  \
    X(test_cusim_lanes_exchanging_through_shared_memory_without_syncwarp_race)                               \
    X(test_cusim_lanes_exchanging_after_syncwarp_pass)                                                       \
    X(test_cusim_shuffle_whose_mask_omits_the_caller_is_reported)                                            \
    X(test_cusim_lane_at_a_barrier_while_its_warp_waits_in_a_shuffle_is_a_deadlock)                          \
    X(test_cusim_trap_fails_the_launch_naming_the_thread)                                                    \
    X(test_cusim_warp_operations_give_cudas_results)                                                         \
    X(test_cusim_host_pointer_passed_to_a_kernel_is_reported)                                                \
    X(test_cusim_dynamic_shared_memory_overrun_is_reported)                                                  \
    X(test_cusim_float_atomics_are_exempt_from_the_comparison)                                               \
    X(test_cusim_shared_memory_atomics_on_one_address_are_not_a_race)                                        \
    X(test_cusim_each_gpu_thread_keeps_its_rounding_mode)                                                    \
    X(test_cusim_half_and_bfloat16_conversions_match_the_cpus)                                               \
    X(test_cusim_block_of_1025_threads_is_an_invalid_configuration)                                          \
    X(test_cusim_64_kib_dynamic_shared_memory_needs_the_attribute)                                           \
    X(test_cusim_256_kib_dynamic_shared_memory_is_refused_even_with_the_attribute)                           \
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
    X(test_cusim_ddp_over_nccl_at_world_4_averages_cuda_gradients)                                          \
    X(test_cusim_nccl_selftest_passes_every_collective_dtype_world_and_failure)

#if !EM_CUDA_SIM

#define SKIPPED(name)                                                                                        \
    TEST(name) { SKIP("the CUDA emulator's test: needs the sim build (meson -Dcuda=sim)"); }
CUSIM_TESTS(SKIPPED)

#else

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <fenv.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cusim_faults.h"
#include "cusim_impl.h"
#include "dist_util.h"

/* ---- helpers ------------------------------------------------------------------------- */

/* Sets the emulator's environment for this test (before the first CUDA
 * call: the settings are read once): schedule, and no abort at a report
 * whatever the caller's environment says. */
static void emulator(const char *schedule)
{
    setenv("EMBER_CUSIM_SCHEDULE", schedule, 1);
    unsetenv("EMBER_CUSIM_FATAL");
    setenv("EMBER_CUSIM_RACECHECK", "1", 1);
    setenv("EMBER_CUSIM_NCCL_TIMEOUT", "20", 1);
}

/* stderr from here on goes to a file read back by captured_stderr(): the
 * reports the test provokes are checked there instead of cluttering the log */
static char capture_path[64];
static void capture_stderr(void)
{
    snprintf(capture_path, sizeof capture_path, "/tmp/ember-cusim-err-XXXXXX");
    int fd = mkstemp(capture_path);
    CHECK(fd >= 0);
    unlink(capture_path);
    CHECK(dup2(fd, STDERR_FILENO) == STDERR_FILENO);
    close(fd);
}

static const char *captured_stderr(void)
{
    static char text[16384];
    ssize_t n = pread(STDERR_FILENO, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = 0;
    return text;
}

#define CUDA_OK(call)                                                                                        \
    do {                                                                                                     \
        cudaError_t th_e = (cudaError_t)(call);                                                              \
        if (th_e != cudaSuccess) th_fail(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorName(th_e));       \
    } while (0)

/* the last report contains every one of the NULL-terminated strings, and
 * so does what reached stderr */
static void check_report(const char *file, int line, int before, ...)
{
    if (cusim_report_count() <= before) th_fail(file, line, "no report; stderr: %s", captured_stderr());
    const char *msg = cusim_last_message();
    va_list ap;
    va_start(ap, before);
    for (const char *want; (want = va_arg(ap, const char *));) {
        if (!strstr(msg, want)) th_fail(file, line, "the report lacks \"%s\": %s", want, msg);
        if (!strstr(captured_stderr(), want)) th_fail(file, line, "stderr lacks \"%s\"", want);
    }
    va_end(ap);
}
#define CHECK_REPORT(before, ...) check_report(__FILE__, __LINE__, (before), __VA_ARGS__, (const char *)NULL)
#define CHECK_NO_REPORT(before)                                                                              \
    do {                                                                                                     \
        if (cusim_report_count() != (before))                                                                \
            th_fail(__FILE__, __LINE__, "unexpected: %s", cusim_last_message());                             \
    } while (0)

/* a failed launch's error, as the program sees it: sticky, every call */
static void check_launch_failed(const char *file, int line, cudaError_t at_sync)
{
    if (at_sync != cudaErrorLaunchFailure)
        th_fail(file, line, "the sync returned %s, want cudaErrorLaunchFailure", cudaGetErrorName(at_sync));
    if (cudaGetLastError() != cudaErrorLaunchFailure)
        th_fail(file, line, "cudaGetLastError does not return the kernel's failure");
}
#define CHECK_LAUNCH_FAILED(sync_call) check_launch_failed(__FILE__, __LINE__, (sync_call))

static void *device_alloc(size_t n)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, n));
    return p;
}

static char *address(const void *p)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "%p", p);
    return buf;
}

/* ---- racecheck: shared memory ---------------------------------------------------------- */

enum { RED_N = 64 };

static float *reduction_input(void)
{
    float x[RED_N];
    for (int i = 0; i < RED_N; i++) x[i] = (float)i;
    float *d = device_alloc(sizeof x);
    CUDA_OK(cudaMemcpy(d, x, sizeof x, cudaMemcpyHostToDevice));
    return d;
}

TEST(test_cusim_reduction_missing_syncthreads_is_reported_as_a_shared_memory_race)
{
    emulator("in-order");
    capture_stderr();
    float *x = reduction_input(), *out = device_alloc(sizeof(float));
    int before = cusim_report_count();
    CUDA_OK(cf_reduce_in_shared(x, out, RED_N, false));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "race on shared memory in kernel reduce_in_shared block (0,0,0) thread (",
                 "while thread (", "dynamic shared memory + ");
}

TEST(test_cusim_reduction_with_syncthreads_sums_exactly_without_a_report)
{
    emulator("compare");
    float *x = reduction_input(), *out = device_alloc(sizeof(float));
    int before = cusim_report_count();
    CUDA_OK(cf_reduce_in_shared(x, out, RED_N, true));
    float sum = 0;
    CUDA_OK(cudaMemcpy(&sum, out, sizeof sum, cudaMemcpyDeviceToHost));
    CHECK(sum == RED_N * (RED_N - 1) / 2);
    CHECK_NO_REPORT(before);
}

/* ---- barriers ------------------------------------------------------------------------------ */

TEST(test_cusim_syncthreads_in_a_divergent_branch_is_reported)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(64 * sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_barrier_in_branch(out, 64, true));
    CHECK_LAUNCH_FAILED(cudaStreamSynchronize(NULL));
    CHECK_REPORT(before, "barrier divergence in kernel barrier_in_branch block (0,0,0) thread (",
                 "waits at __syncthreads", "cusim_faults.cu:");
}

TEST(test_cusim_syncthreads_outside_the_branch_passes)
{
    emulator("compare");
    int *out = device_alloc(64 * sizeof(int)), got[64];
    int before = cusim_report_count();
    CUDA_OK(cf_barrier_in_branch(out, 64, false));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    for (int t = 0; t < 64; t++) CHECK(got[t] == t);
    CHECK_NO_REPORT(before);
}

TEST(test_cusim_thread_exiting_while_others_wait_at_a_barrier_is_reported)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(64 * sizeof(int)), got[64];
    int before = cusim_report_count();
    CUDA_OK(cf_exit_before_barrier(out, 64, true));
    /* a blocking copy runs the queue first: it returns the kernel's failure */
    CHECK_LAUNCH_FAILED(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    CHECK_REPORT(before, "kernel exit_before_barrier block (0,0,0) thread (", "exited while thread (",
                 "waits at __syncthreads");
}

TEST(test_cusim_every_thread_reaching_the_barrier_passes)
{
    emulator("compare");
    int *out = device_alloc(64 * sizeof(int)), got[64];
    int before = cusim_report_count();
    CUDA_OK(cf_exit_before_barrier(out, 64, false));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    for (int t = 0; t < 64; t++) CHECK(got[t] == t);
    CHECK_NO_REPORT(before);
}

/* ---- warp masks ---------------------------------------------------------------------------- */

TEST(test_cusim_shuffle_whose_mask_names_exited_lanes_is_reported)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(32 * sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_shuffle_after_exit(out, 0xffffffffu));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    /* in order, lanes 0..15 wait in the shuffle when lane 16 exits */
    CHECK_REPORT(before,
                 "kernel shuffle_after_exit block (0,0,0) thread (16,0,0) exited while lanes 0x0000ffff",
                 "__shfl_sync(mask 0xffffffff)");
}

TEST(test_cusim_shuffle_whose_mask_names_only_live_lanes_passes)
{
    emulator("compare");
    int *out = device_alloc(32 * sizeof(int)), got[16];
    int before = cusim_report_count();
    CUDA_OK(cf_shuffle_after_exit(out, 0x0000ffffu));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    for (int l = 0; l < 16; l++) CHECK(got[l] == 100);
    CHECK_NO_REPORT(before);
}

/* ---- memcheck: global memory --------------------------------------------------------------- */

enum { WRITE_N = 100 };

TEST(test_cusim_global_write_one_past_the_end_is_reported)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(WRITE_N * sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_write_indices(out, WRITE_N, true));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    /* thread 100 = block 1, thread 36 of 64; the element past the end is out + 100 */
    char at[64];
    snprintf(at, sizeof at, "write of 4 bytes at %p", (void *)(out + WRITE_N));
    CHECK_REPORT(before, "kernel write_indices block (1,0,0) thread (36,0,0)", at,
                 "out of bounds of device allocation", address(out), "(400 bytes)");
}

TEST(test_cusim_misaligned_double_load_is_reported)
{
    emulator("in-order");
    capture_stderr();
    double *out = device_alloc(8 * sizeof(double));
    char *in = device_alloc(80);
    int before = cusim_report_count();
    CUDA_OK(cf_load_doubles(out, in, 4, 8)); /* 4-byte aligned doubles */
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    char at[64];
    snprintf(at, sizeof at, "read of 8 bytes at %p", (void *)(in + 4));
    CHECK_REPORT(before, "kernel load_doubles block (0,0,0) thread (0,0,0)", at, "misaligned");
}

TEST(test_cusim_aligned_double_loads_pass)
{
    emulator("compare");
    double *out = device_alloc(8 * sizeof(double)), want[8], got[8];
    char *in = device_alloc(80);
    for (int i = 0; i < 8; i++) want[i] = 0.5 * i;
    CUDA_OK(cudaMemcpy(in + 8, want, sizeof want, cudaMemcpyHostToDevice));
    int before = cusim_report_count();
    CUDA_OK(cf_load_doubles(out, in, 8, 8));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(memcmp(got, want, sizeof got) == 0);
    CHECK_NO_REPORT(before);
}

TEST(test_cusim_global_writes_within_the_allocation_pass)
{
    emulator("compare");
    int *out = device_alloc(WRITE_N * sizeof(int)), got[WRITE_N];
    int before = cusim_report_count();
    CUDA_OK(cf_write_indices(out, WRITE_N, false));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    for (int i = 0; i < WRITE_N; i++) CHECK(got[i] == i);
    CHECK_NO_REPORT(before);
}

TEST(test_cusim_kernel_using_freed_memory_is_reported)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(WRITE_N * sizeof(int));
    CUDA_OK(cudaFree(out));
    int before = cusim_report_count();
    CUDA_OK(cf_write_indices(out, WRITE_N, false));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "kernel write_indices block (0,0,0) thread (0,0,0)", "write of 4 bytes",
                 address(out), "was freed");
}

/* ---- schedule comparison ------------------------------------------------------------------- */

TEST(test_cusim_last_writer_wins_is_reported_by_the_schedule_comparison)
{
    emulator("compare");
    capture_stderr();
    int *out = device_alloc(sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_last_writer_wins(out, 4, 64, false));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "kernel last_writer_wins: the result depends on the order threads run in",
                 address(out), "(4 bytes)");
}

TEST(test_cusim_last_writer_wins_goes_unseen_in_one_in_order_run)
{
    emulator("in-order"); /* what the comparison adds: one order alone looks fine */
    int *out = device_alloc(sizeof(int)), got = -1;
    int before = cusim_report_count();
    CUDA_OK(cf_last_writer_wins(out, 4, 64, false));
    CUDA_OK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got == 4 * 64 - 1);
    CHECK_NO_REPORT(before);
}

TEST(test_cusim_atomic_max_twin_of_last_writer_wins_passes_the_comparison)
{
    emulator("compare");
    int *out = device_alloc(sizeof(int)), got = -1;
    CUDA_OK(cudaMemset(out, 0, sizeof(int)));
    int before = cusim_report_count();
    CUDA_OK(cf_last_writer_wins(out, 4, 64, true));
    CUDA_OK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got == 4 * 64 - 1);
    CHECK_NO_REPORT(before);
}

/* ---- more of the execution model ----------------------------------------------------------- */

TEST(test_cusim_lanes_exchanging_through_shared_memory_without_syncwarp_race)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(64 * sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_warp_exchange(out, false));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "race on shared memory in kernel warp_exchange block (0,0,0) thread (",
                 "static shared memory", "nor a warp operation for lanes of one warp");
}

TEST(test_cusim_lanes_exchanging_after_syncwarp_pass)
{
    emulator("compare");
    int *out = device_alloc(64 * sizeof(int)), got[64];
    int before = cusim_report_count();
    CUDA_OK(cf_warp_exchange(out, true));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    for (int t = 0; t < 64; t++) CHECK(got[t] == (t ^ 1) * 10);
    CHECK_NO_REPORT(before);
}

TEST(test_cusim_shuffle_whose_mask_omits_the_caller_is_reported)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(32 * sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_shuffle_after_exit(out, 0x1u)); /* lanes 1..15 call with a mask naming lane 0 only */
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "kernel shuffle_after_exit block (0,0,0) thread (1,0,0): __shfl_sync at",
                 "mask 0x00000001 does not name the calling lane");
}

TEST(test_cusim_lane_at_a_barrier_while_its_warp_waits_in_a_shuffle_is_a_deadlock)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(64 * sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_shuffle_then_barrier(out));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "deadlock in kernel shuffle_then_barrier block (0,0,0)", "__syncthreads",
                 "__shfl_sync(mask 0xffffffff)");
}

TEST(test_cusim_trap_fails_the_launch_naming_the_thread)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(64 * sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_trap(out));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "kernel traps block (0,0,0) thread (3,0,0): __trap() at", "cusim_faults.cu:");
}

TEST(test_cusim_warp_operations_give_cudas_results)
{
    emulator("compare");
    int *out = device_alloc(224 * sizeof(int)), got[224];
    int before = cusim_report_count();
    CUDA_OK(cf_warp_ops(out));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    unsigned ballot = 0;
    for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        CHECK(got[l] == (l >= 3 ? l - 3 : l));                           /* up: the low lanes keep theirs */
        CHECK(got[32 + l] == (l % 16 + 5 < 16 ? l + 5 : l));             /* down, within 16-lane segments */
        CHECK(got[64 + l] == (l & ~7) + 7);                              /* lane 7 of each 8-lane segment */
        CHECK(got[96 + l] == (int)ballot);                               /* every lane gets the ballot */
        CHECK(got[128 + l] == 1);                                        /* any: yes; all: no */
        CHECK(got[160 + l] == ((l ^ 20) < (l & ~15) + 16 ? l ^ 20 : l)); /* xor past the segment: own */
        CHECK(got[192 + l] == 31 - l);                                   /* 8-byte values shuffle whole */
    }
    CHECK_NO_REPORT(before);
}

TEST(test_cusim_host_pointer_passed_to_a_kernel_is_reported)
{
    emulator("in-order");
    capture_stderr();
    int *host = malloc(WRITE_N * sizeof(int));
    CHECK_NOTNULL(host);
    int before = cusim_report_count();
    CUDA_OK(cf_write_indices(host, WRITE_N, false));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "kernel write_indices block (0,0,0) thread (0,0,0): write of 4 bytes", address(host),
                 "not device memory nor shared memory (a host pointer passed to a kernel?)");
    free(host);
}

TEST(test_cusim_dynamic_shared_memory_overrun_is_reported)
{
    emulator("in-order");
    capture_stderr();
    int *out = device_alloc(64 * sizeof(int));
    int before = cusim_report_count();
    CUDA_OK(cf_through_shared(out, 64, 63 * sizeof(int))); /* thread 63's element is past the end */
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "kernel through_shared block (0,0,0) thread (63,0,0): write of 4 bytes",
                 "out of bounds of dynamic shared memory (offset 252 of 252 bytes)");
}

TEST(test_cusim_float_atomics_are_exempt_from_the_comparison)
{
    emulator("compare");
    capture_stderr();
    enum { N = 1000 };
    float x[N], sum = 0;
    for (int i = 0; i < N; i++) x[i] = 0.1f * (float)i;
    float *dx = device_alloc(sizeof x), *acc = device_alloc(sizeof(float));
    CUDA_OK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(acc, 0, sizeof(float)));
    int before = cusim_report_count();
    CUDA_OK(cf_float_atomics(acc, dx, N));
    CUDA_OK(cudaMemcpy(&sum, acc, sizeof sum, cudaMemcpyDeviceToHost));
    CHECK_NEAR(sum, 0.1 * N * (N - 1) / 2, 1.0); /* the order changes the rounding, as on a GPU */
    CHECK_NO_REPORT(before);
    CHECK(strstr(captured_stderr(), "cusim: note: kernel float_atomics used floating-point atomics"));
    CHECK(strstr(captured_stderr(), "its launches are not compared across schedules"));
}

TEST(test_cusim_shared_memory_atomics_on_one_address_are_not_a_race)
{
    emulator("compare");
    enum { N = 5000 };
    static int v[N];
    int want[16] = {0}, got[16];
    for (int i = 0; i < N; i++) want[(v[i] = i * 7) & 15]++;
    int *dv = device_alloc(sizeof v), *bins = device_alloc(sizeof got);
    CUDA_OK(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(bins, 0, sizeof got));
    int before = cusim_report_count();
    CUDA_OK(cf_histogram(dv, N, bins));
    CUDA_OK(cudaMemcpy(got, bins, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(memcmp(got, want, sizeof got) == 0);
    CHECK_NO_REPORT(before);
}

TEST(test_cusim_each_gpu_thread_keeps_its_rounding_mode)
{
    emulator("in-order");
    float three = 3, got[2];
    float *d3 = device_alloc(sizeof three), *out = device_alloc(sizeof got);
    CUDA_OK(cudaMemcpy(d3, &three, sizeof three, cudaMemcpyHostToDevice));
    CUDA_OK(cf_rounding_modes(out, d3));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got[0] < got[1]); /* thread 0 rounded down, thread 1 to nearest */
    CHECK(fegetround() == FE_TONEAREST);
}

TEST(test_cusim_half_and_bfloat16_conversions_match_the_cpus)
{
    /* every half round-trips through float (a NaN becomes the canonical 0x7fff) */
    int bad = 0;
    for (unsigned h = 0; h < 65536; h++) {
        unsigned short back = cf_float2half_rn(cf_half2float((unsigned short)h));
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        bad += nan ? back != 0x7fff : back != h;
    }
    CHECK(bad == 0);
    /* float -> half and -> bfloat16 agree with ember's CPU conversions over
     * every float's bits in steps of a prime (NaN payloads aside) */
    for (uint64_t u = 0; u < (1ull << 32); u += 251) {
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, sizeof f);
        if (f != f) continue;
        if (cf_float2half_rn(f) != em_f32_to_f16(f) || cf_float2bfloat16_rn(f) != em_f32_to_bf16(f))
            th_fail(__FILE__, __LINE__, "float bits %08x: half %04x (CPU %04x), bfloat16 %04x (CPU %04x)", b,
                    cf_float2half_rn(f), em_f32_to_f16(f), cf_float2bfloat16_rn(f), em_f32_to_bf16(f));
    }
    CHECK(cf_float2half_rn(65520.0f) == 0x7c00);   /* the midpoint above the largest half ties to infinity */
    CHECK(cf_float2half_rn(0x1p-25f) == 0);        /* half the smallest subnormal ties to zero */
    CHECK(cf_float2half_rn(0x1.000002p-25f) == 1); /* just above it rounds up */
    CHECK(cf_float2bfloat16_rn(1.00390625f) == 0x3f80); /* bfloat16 ties to even */
}

/* ---- sm_90 launch limits: the caller's error, not a checker report ------------------------- */

TEST(test_cusim_block_of_1025_threads_is_an_invalid_configuration)
{
    emulator("in-order");
    int *out = device_alloc(1025 * sizeof(int)), got[1024];
    int before = cusim_report_count();
    CHECK(cf_through_shared(out, 1025, 0) == cudaErrorInvalidConfiguration);
    CHECK(strstr(
        cusim_launch_error_message(),
        "launch of through_shared with grid (1,1,1) block (1025,1,1): blockDim.x is above sm_90's limit"));
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess); /* not sticky: the next launch runs */
    CUDA_OK(cf_through_shared(out, 1024, 1024 * sizeof(int)));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got[1023] == 1023);
    CHECK_NO_REPORT(before);
}

TEST(test_cusim_64_kib_dynamic_shared_memory_needs_the_attribute)
{
    emulator("in-order");
    int *out = device_alloc(64 * sizeof(int)), got[64];
    CHECK(cf_through_shared(out, 64, 64 * 1024) == cudaErrorInvalidValue);
    CHECK(strstr(cusim_launch_error_message(), "launch of through_shared"));
    CHECK(strstr(cusim_launch_error_message(), "cudaFuncSetAttribute"));
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CUDA_OK(cf_allow_dynamic_shared(64 * 1024));
    CUDA_OK(cf_through_shared(out, 64, 64 * 1024));
    CUDA_OK(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got[63] == 63);
}

TEST(test_cusim_256_kib_dynamic_shared_memory_is_refused_even_with_the_attribute)
{
    emulator("in-order");
    int *out = device_alloc(64 * sizeof(int));
    CHECK(cf_allow_dynamic_shared(256 * 1024) == cudaErrorInvalidValue); /* above what sm_90 can opt in to */
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CUDA_OK(cf_allow_dynamic_shared(227 * 1024)); /* the most there is */
    CHECK(cf_through_shared(out, 64, 256 * 1024) == cudaErrorInvalidValue);
    CHECK(strstr(cusim_launch_error_message(), "262144 bytes of dynamic shared memory, above sm_90's limit"));
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
}

/* ---- device memory from host code ---------------------------------------------------------- */

/* Runs fn(ctx) in a child whose stderr goes to a file; returns its wait
 * status and stderr (err, cap bytes). */
static int run_child(void (*fn)(void *), void *ctx, char *err, size_t cap)
{
    char path[] = "/tmp/ember-cusim-child-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fd, STDERR_FILENO);
        fn(ctx);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    ssize_t n = pread(fd, err, cap - 1, 0);
    err[n > 0 ? n : 0] = 0;
    close(fd);
    return status;
}

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
        char path[] = "/tmp/ember-cusim-rank-XXXXXX";
        fd[r] = mkstemp(path);
        CHECK(fd[r] >= 0);
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
