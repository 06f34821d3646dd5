// selftest_exec.cu — the execution model's own test (see
// stub_runtime_for_exec_tests.c; build and run: tests/cusim/selftest_exec.sh).
// Correct kernels must give the right answer with no report under every
// schedule; deliberately broken ones must be caught, each by its checker.
// Each test is one behaviour; the program exits non-zero if any fails.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <fenv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EM_LAUNCH(kernel, grid, block, smem, stream)                                                         \
    ::cusim::launcher(kernel, #kernel, grid, block, smem, stream)
#define EM_DYNAMIC_SHARED(type, name) type *name = (type *)::cusim::dynamic_shared()

// ---- kernels that are right -----------------------------------------------------------------------

__device__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// out[b] = sum of x over block b's grid-stride share, by shuffles and shared memory
__global__ void block_sum(const float *x, int n, float *out)
{
    __shared__ float part[32];
    float v = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i];
    v = warp_sum(v);
    unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        v = l < blockDim.x / 32 ? part[l] : 0.0f;
        v = warp_sum(v);
        if (l == 0) out[blockIdx.x] = v;
    }
}

__global__ void scale2(const float *x, float *y, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = 2 * x[i];
}

// a histogram of 16 bins: per block in shared memory, then into global
__global__ void histogram(const int *v, int n, int *bins)
{
    __shared__ int local[16];
    int t = (int)(threadIdx.y * blockDim.x + threadIdx.x), nt = (int)(blockDim.x * blockDim.y);
    if (t < 16) local[t] = 0;
    __syncthreads();
    for (int i = blockIdx.x * nt + t; i < n; i += gridDim.x * nt) atomicAdd(&local[v[i] & 15], 1);
    __syncthreads();
    if (t < 16) atomicAdd(&bins[t], local[t]);
}

// lanes exchange through shared memory, ordered by __syncwarp (not a race)
__global__ void warp_exchange(int *out, bool sync)
{
    __shared__ int sh[64];
    sh[threadIdx.x] = (int)threadIdx.x * 10;
    if (sync) __syncwarp();
    out[threadIdx.x] = sh[threadIdx.x ^ 1];
}

// shuffles with offsets and widths, ballots and votes
__global__ void warp_ops(int *out)
{
    int l = (int)threadIdx.x;
    out[l] = __shfl_up_sync(0xffffffffu, l, 3);
    out[32 + l] = __shfl_down_sync(0xffffffffu, l, 5, 16);
    out[64 + l] = __shfl_sync(0xffffffffu, l, 7, 8);
    out[96 + l] = (int)__ballot_sync(0xffffffffu, l % 3 == 0);
    out[128 + l] = __any_sync(0xffffffffu, l == 31) + 2 * __all_sync(0xffffffffu, l < 31);
    out[160 + l] = __shfl_xor_sync(0xffffffffu, l, 20, 16);
    double d = __shfl_sync(0xffffffffu, (double)l * 0.5, 31 - l);
    out[192 + l] = (int)(d * 2);
}

// tree reduction in dynamic shared memory, with or without the barrier
__global__ void tree_sum(const float *x, float *out, bool barrier)
{
    EM_DYNAMIC_SHARED(float, sh);
    unsigned t = threadIdx.x;
    sh[t] = x[t];
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        if (barrier) __syncthreads();
    }
    if (t == 0) *out = sh[0];
}

__global__ void float_atomics(float *acc, const float *x, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        atomicAdd(acc, x[i]);
}

__global__ void use_smem(float *out)
{
    EM_DYNAMIC_SHARED(float, sh);
    sh[threadIdx.x] = 1;
    __syncthreads();
    out[threadIdx.x] = sh[(threadIdx.x + 1) % blockDim.x];
}

// thread 0 rounds down: each fiber keeps its own (MXCSR is saved per switch)
__global__ void rounding_modes(float *out, volatile float *three)
{
    if (threadIdx.x == 0) fesetround(FE_DOWNWARD);
    __syncthreads();
    out[threadIdx.x] = 1.0f / *three;
    __syncthreads();
    if (threadIdx.x == 0) fesetround(FE_TONEAREST);
}

// ---- kernels that are wrong -----------------------------------------------------------------------

__global__ void divergent_barrier(int *out)
{
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void early_exit_barrier(int *out)
{
    if (threadIdx.x >= 16) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void write_past_end(int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = i; // <= : one too many
}

__global__ void read_past_smem(float *out)
{
    EM_DYNAMIC_SHARED(float, sh);
    sh[threadIdx.x] = 1;
    __syncthreads();
    out[threadIdx.x] = sh[threadIdx.x + 1]; // the last thread reads past the end
}

__global__ void last_writer_wins(int *out) { *out = (int)(blockIdx.x * blockDim.x + threadIdx.x); }

__global__ void half_warp_shuffle(int *out)
{
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}

__global__ void mask_without_self(int *out) { out[threadIdx.x] = __shfl_sync(0x1u, (int)threadIdx.x, 0); }

__global__ void shuffle_then_barrier(int *out)
{
    // warp 0 lane 0 goes to the barrier, its warp mates to a shuffle that needs it
    if (threadIdx.x == 0)
        __syncthreads();
    else if (threadIdx.x < 32)
        out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
    else
        __syncthreads();
}

__global__ void traps(int *out)
{
    if (threadIdx.x == 3) __trap();
    out[threadIdx.x] = 1;
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static unsigned short f16c_convert(float f)
{
    return (unsigned short)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#endif

// ---- the tests ----------------------------------------------------------------------------------------

static int failures;
static const char *schedule;

#define EXPECT(cond, ...)                                                                                    \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            printf("FAIL %s:%d: ", __func__, __LINE__);                                                      \
            printf(__VA_ARGS__);                                                                             \
            printf("\n");                                                                                    \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)

// expects no report since `before`, or one whose text contains `want`
static void expect_reports(int before, const char *want, const char *test)
{
    int now = cusim_report_count();
    if (!want)
        EXPECT(now == before, "%s: %d unexpected report(s): %s", test, now - before, cusim_last_message());
    else
        EXPECT(now > before && strstr(cusim_last_message(), want),
               "%s: wanted a report with \"%s\", got %d: %s", test, want, now - before,
               now > before ? cusim_last_message() : "(none)");
}

template <class T> static T *dev(size_t n)
{
    void *p = NULL;
    cudaMalloc(&p, n * sizeof(T));
    return (T *)p;
}

static void test_block_sum_with_shuffles_is_exact(void)
{
    int n = 10000, blocks = 8;
    float *x = dev<float>(n), *out = dev<float>(blocks);
    for (int i = 0; i < n; i++) x[i] = (float)(i % 7);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(block_sum, blocks, 256, 0, 0)(x, n, out) == cudaSuccess, "launch failed");
    double total = 0;
    for (int b = 0; b < blocks; b++) total += out[b];
    double want = 0;
    for (int i = 0; i < n; i++) want += i % 7;
    EXPECT(total == want, "sum %g, want %g", total, want);
    expect_reports(before, NULL, __func__);
}

static void test_grid_stride_loop_covers_every_element(void)
{
    long long n = 100003;
    float *x = dev<float>(n), *y = dev<float>(n);
    for (long long i = 0; i < n; i++) x[i] = (float)i;
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(scale2, 40, 128, 0, 0)(x, y, n) == cudaSuccess, "launch failed");
    long long bad = 0;
    for (long long i = 0; i < n; i++) bad += y[i] != 2.0f * (float)i;
    EXPECT(bad == 0, "%lld wrong elements", bad);
    expect_reports(before, NULL, __func__);
}

static void test_atomic_histogram_counts_everything(void)
{
    int n = 5000;
    int *v = dev<int>(n), *bins = dev<int>(16);
    for (int i = 0; i < n; i++) v[i] = i * 7;
    memset(bins, 0, 16 * sizeof(int));
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(histogram, 6, dim3(64, 2), 0, 0)(v, n, bins) == cudaSuccess, "launch failed");
    int want[16] = {0};
    for (int i = 0; i < n; i++) want[(i * 7) & 15]++;
    EXPECT(!memcmp(want, bins, sizeof want), "histogram differs (bin 0: %d, want %d)", bins[0], want[0]);
    expect_reports(before, NULL, __func__);
}

static void test_warp_operations_give_cuda_results(void)
{
    int *out = dev<int>(224);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(warp_ops, 1, 32, 0, 0)(out) == cudaSuccess, "launch failed");
    unsigned ballot = 0;
    for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        EXPECT(out[l] == (l >= 3 ? l - 3 : l), "shfl_up lane %d: %d", l, out[l]);
        EXPECT(out[32 + l] == (l % 16 + 5 < 16 ? l + 5 : l), "shfl_down lane %d: %d", l, out[32 + l]);
        EXPECT(out[64 + l] == (l & ~7) + 7, "shfl width 8 lane %d: %d", l, out[64 + l]);
        EXPECT(out[96 + l] == (int)ballot, "ballot lane %d", l);
        EXPECT(out[128 + l] == 1, "any/all lane %d: %d", l, out[128 + l]);
        int x = l ^ 20;
        EXPECT(out[160 + l] == (x < (l & ~15) + 16 ? x : l), "shfl_xor width 16 lane %d: %d", l,
               out[160 + l]);
        EXPECT(out[192 + l] == 31 - l, "double shuffle lane %d: %d", l, out[192 + l]);
    }
    expect_reports(before, NULL, __func__);
}

static void test_syncwarp_orders_lanes_of_a_warp(void)
{
    int *out = dev<int>(64);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(warp_exchange, 1, 64, 0, 0)(out, true) == cudaSuccess, "launch failed");
    for (int t = 0; t < 64; t++) EXPECT(out[t] == (t ^ 1) * 10, "thread %d read %d", t, out[t]);
    expect_reports(before, NULL, __func__);
}

static void test_race_without_syncwarp_is_reported(void)
{
    int *out = dev<int>(64);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(warp_exchange, 1, 64, 0, 0)(out, false) == cudaErrorLaunchFailure,
           "launch did not fail");
    expect_reports(before, "race on shared memory", __func__);
}

static void test_tree_reduction_with_barriers_is_exact(void)
{
    float *x = dev<float>(256), *out = dev<float>(1);
    for (int i = 0; i < 256; i++) x[i] = (float)i;
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(tree_sum, 1, 256, 256 * sizeof(float), 0)(x, out, true) == cudaSuccess, "launch failed");
    EXPECT(*out == 255 * 256 / 2, "sum %g", *out);
    expect_reports(before, NULL, __func__);
}

static void test_missing_syncthreads_is_a_race(void)
{
    float *x = dev<float>(256), *out = dev<float>(1);
    for (int i = 0; i < 256; i++) x[i] = (float)i;
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(tree_sum, 1, 256, 256 * sizeof(float), 0)(x, out, false) == cudaErrorLaunchFailure,
           "launch did not fail");
    expect_reports(before, "race on shared memory in kernel tree_sum", __func__);
}

static void test_barrier_in_divergent_branch_is_reported(void)
{
    int *out = dev<int>(64);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(divergent_barrier, 1, 64, 0, 0)(out) == cudaErrorLaunchFailure, "launch did not fail");
    expect_reports(before, "barrier divergence", __func__);
}

static void test_exit_while_others_wait_is_reported(void)
{
    int *out = dev<int>(64);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(early_exit_barrier, 1, 64, 0, 0)(out) == cudaErrorLaunchFailure, "launch did not fail");
    expect_reports(before, "exited while thread", __func__);
}

static void test_out_of_bounds_global_write_is_reported(void)
{
    int n = 100;
    int *out = dev<int>(n);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(write_past_end, 1, 128, 0, 0)(out, n) == cudaErrorLaunchFailure, "launch did not fail");
    expect_reports(before, "out of bounds of device allocation", __func__);
    EXPECT(strstr(cusim_last_message(), "thread (100,0,0)"), "the report names thread 100: %s",
           cusim_last_message());
}

static void test_freed_memory_access_is_reported(void)
{
    int *out = dev<int>(64);
    cudaFree(out);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(divergent_barrier, 1, 1, 0, 0)(out) == cudaErrorLaunchFailure, "launch did not fail");
    expect_reports(before, "write of 4 bytes", __func__);
}

static void test_host_pointer_in_kernel_is_reported(void)
{
    int *host = (int *)malloc(64 * sizeof(int));
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(last_writer_wins, 1, 1, 0, 0)(host) == cudaErrorLaunchFailure, "launch did not fail");
    expect_reports(before, "not device memory nor shared memory", __func__);
    free(host);
}

static void test_dynamic_shared_overrun_is_reported(void)
{
    float *out = dev<float>(64);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(read_past_smem, 1, 64, 64 * sizeof(float), 0)(out) == cudaErrorLaunchFailure,
           "launch did not fail");
    expect_reports(before, "out of bounds of dynamic shared memory", __func__);
}

static void test_order_dependent_result_is_reported_by_compare(void)
{
    int *out = dev<int>(1);
    int before = cusim_report_count();
    cudaError_t e = EM_LAUNCH(last_writer_wins, 4, 64, 0, 0)(out);
    if (!strcmp(schedule, "compare")) {
        EXPECT(e == cudaErrorLaunchFailure, "launch did not fail");
        expect_reports(before, "depends on the order", __func__);
    } else {
        EXPECT(e == cudaSuccess, "launch failed");
        expect_reports(before, NULL, __func__);
    }
}

static void test_float_atomics_are_exempt_from_compare(void)
{
    int n = 1000;
    float *acc = dev<float>(1), *x = dev<float>(n);
    for (int i = 0; i < n; i++) x[i] = 0.1f * (float)i;
    *acc = 0;
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(float_atomics, 4, 64, 0, 0)(acc, x, n) == cudaSuccess, "launch failed");
    EXPECT(*acc > 49900 && *acc < 50000, "sum %g", *acc);
    expect_reports(before, NULL, __func__);
}

static void test_half_warp_at_full_mask_shuffle_is_reported(void)
{
    int *out = dev<int>(32);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(half_warp_shuffle, 1, 32, 0, 0)(out) == cudaErrorLaunchFailure, "launch did not fail");
    expect_reports(before, "exited", __func__);
}

static void test_mask_without_the_caller_is_reported(void)
{
    int *out = dev<int>(32);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(mask_without_self, 1, 32, 0, 0)(out) == cudaErrorLaunchFailure, "launch did not fail");
    expect_reports(before, "does not name the calling lane", __func__);
}

static void test_deadlock_names_who_waits_where(void)
{
    int *out = dev<int>(64);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(shuffle_then_barrier, 1, 64, 0, 0)(out) == cudaErrorLaunchFailure,
           "launch did not fail");
    expect_reports(before, "deadlock", __func__);
    EXPECT(strstr(cusim_last_message(), "__syncthreads") && strstr(cusim_last_message(), "__shfl_sync"),
           "the report says where: %s", cusim_last_message());
}

static void test_trap_fails_the_launch(void)
{
    int *out = dev<int>(64);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(traps, 1, 64, 0, 0)(out) == cudaErrorLaunchFailure, "launch did not fail");
    expect_reports(before, "__trap()", __func__);
}

static void test_each_thread_keeps_its_floating_point_mode(void)
{
    float *out = dev<float>(2), *three = dev<float>(1);
    *three = 3.0f;
    EXPECT(EM_LAUNCH(rounding_modes, 1, 2, 0, 0)(out, three) == cudaSuccess, "launch failed");
    EXPECT(out[0] < out[1], "thread 0 rounds down (%a), thread 1 to nearest (%a)", out[0], out[1]);
    EXPECT(fegetround() == FE_TONEAREST, "the host's rounding mode is untouched");
}

static void test_launch_limits_are_sm90s(void)
{
    float *out = dev<float>(2048);
    int before = cusim_report_count();
    EXPECT(EM_LAUNCH(use_smem, 1, 1025, 0, 0)(out) == cudaErrorInvalidConfiguration, "1025 threads");
    EXPECT(EM_LAUNCH(use_smem, 1, dim3(1, 1, 65), 0, 0)(out) == cudaErrorInvalidConfiguration,
           "blockDim.z 65");
    EXPECT(EM_LAUNCH(use_smem, dim3(1, 65536), 1, 0, 0)(out) == cudaErrorInvalidConfiguration,
           "gridDim.y 65536");
    EXPECT(EM_LAUNCH(use_smem, 0, 32, 0, 0)(out) == cudaErrorInvalidConfiguration, "an empty grid");
    EXPECT(EM_LAUNCH(use_smem, 1, 64, 64 * 1024, 0)(out) == cudaErrorInvalidValue,
           "64 KiB without the attribute");
    EXPECT(strstr(cusim_launch_error_message(), "cudaFuncSetAttribute"), "message: %s",
           cusim_launch_error_message());
    EXPECT(cudaFuncSetAttribute(use_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) ==
               cudaSuccess,
           "attribute");
    EXPECT(EM_LAUNCH(use_smem, 1, 64, 64 * 1024, 0)(out) == cudaSuccess, "64 KiB with the attribute");
    EXPECT(EM_LAUNCH(use_smem, 1, 64, 228 * 1024, 0)(out) == cudaErrorInvalidValue, "228 KiB");
    EXPECT(EM_LAUNCH(use_smem, 1, 1024, 4096, 0)(out) == cudaSuccess, "1024 threads");
    expect_reports(before, NULL, __func__); // a bad configuration is an error, not a report
}

static void test_half_and_bfloat16_conversions_are_exact(void)
{
    // every half round-trips through float (NaNs become the canonical NaN)
    int bad = 0;
    for (unsigned h = 0; h < 65536; h++) {
        float f = __half2float(__ushort_as_half((unsigned short)h));
        unsigned short back = __half_as_ushort(__float2half_rn(f));
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        bad += nan ? back != 0x7fff : back != h;
    }
    EXPECT(bad == 0, "%d halves do not round-trip", bad);
#if defined(__x86_64__)
    // float -> half against the CPU's own conversion (F16C), over a sweep of
    // every float's bit pattern in steps of a prime (NaNs aside: F16C keeps
    // their payload, a GPU gives the canonical NaN)
    if (__builtin_cpu_supports("f16c")) {
        bad = 0;
        for (uint64_t u = 0; u < (1ull << 32); u += 251) {
            uint32_t b = (uint32_t)u;
            float f;
            memcpy(&f, &b, 4);
            if (f != f) continue;
            unsigned short want = f16c_convert(f), got = __half_as_ushort(__float2half_rn(f));
            if (want != got && bad++ < 5) printf("  %08x: %04x, F16C %04x\n", b, got, want);
        }
        EXPECT(bad == 0, "%d floats convert differently from F16C", bad);
    }
#endif
    EXPECT(__half2float(__float2half_rn(65519.0f)) == 65504.0f, "65519 rounds to 65504");
    EXPECT(__half_as_ushort(__float2half_rn(65520.0f)) == 0x7c00, "65520 rounds to infinity");
    EXPECT(__half_as_ushort(__float2half_rn(0x1p-25f)) == 0, "2^-25 ties to zero");
    EXPECT(__half_as_ushort(__float2half_rn(0x1.000002p-25f)) == 1, "just above 2^-25 rounds up");
    EXPECT(__half_as_ushort(__float2half_rn(-0.0f)) == 0x8000, "-0");
    EXPECT(__bfloat16_as_ushort(__float2bfloat16_rn(1.00390625f)) == 0x3f80, "bf16 tie to even");
    EXPECT(__bfloat16_as_ushort(__float2bfloat16_rn(__uint_as_float(0xff800001u))) == 0xffc0,
           "bf16 NaN stays NaN");
}

int main(void)
{
    schedule = getenv("EMBER_CUSIM_SCHEDULE");
    if (!schedule) schedule = "compare";
    test_block_sum_with_shuffles_is_exact();
    test_grid_stride_loop_covers_every_element();
    test_atomic_histogram_counts_everything();
    test_warp_operations_give_cuda_results();
    test_syncwarp_orders_lanes_of_a_warp();
    test_race_without_syncwarp_is_reported();
    test_tree_reduction_with_barriers_is_exact();
    test_missing_syncthreads_is_a_race();
    test_barrier_in_divergent_branch_is_reported();
    test_exit_while_others_wait_is_reported();
    test_out_of_bounds_global_write_is_reported();
    test_freed_memory_access_is_reported();
    test_host_pointer_in_kernel_is_reported();
    test_dynamic_shared_overrun_is_reported();
    test_order_dependent_result_is_reported_by_compare();
    test_float_atomics_are_exempt_from_compare();
    test_half_warp_at_full_mask_shuffle_is_reported();
    test_mask_without_the_caller_is_reported();
    test_deadlock_names_who_waits_where();
    test_trap_fails_the_launch();
    test_each_thread_keeps_its_floating_point_mode();
    test_launch_limits_are_sm90s();
    test_half_and_bfloat16_conversions_are_exact();
    printf("selftest_exec (schedule %s): %s\n", schedule, failures ? "FAILED" : "ok");
    return failures != 0;
}
