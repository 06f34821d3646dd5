/* test_cusim.c — ember's CUDA emulator (tests/cusim) checked by the suite:
 * its execution model. Each checker is shown catching a deliberately broken
 * program, with the real emulated runtime, and passing the broken program's
 * correct twin: shared-memory races, barriers, warp masks, memcheck of
 * global and shared memory, the schedule comparison; then the warp
 * operations' results, rounding modes, the half/bfloat16 conversions and
 * the sm_90 launch limits. The runtime's own behaviours (host code reading
 * device memory, streams and events, the sticky error, cuBLAS, NCCL) are
 * tests/test_cusim_runtime.c.
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
    X(test_cusim_256_kib_dynamic_shared_memory_is_refused_even_with_the_attribute)

#if !EM_CUDA_SIM

#define SKIPPED(name)                                                                                        \
    TEST(name) { SKIP("the CUDA emulator's test: needs the sim build (meson -Dcuda=sim)"); }
CUSIM_TESTS(SKIPPED)

#else

#include <cuda_runtime_api.h>
#include <fenv.h>

#include "cusim_faults.h"
#include "cusim_test.h"

/* ---- racecheck: shared memory ---------------------------------------------------------- */

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

#endif
