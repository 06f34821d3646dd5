// cusim_faults.cu — kernels with planted bugs, each beside its correct twin,
// for tests/test_cusim.c: the emulator's checkers must catch every broken
// one (with ember's real emulated runtime, not a stub) and pass every twin.
// Built only in the sim build (tests/meson.build), like ember's own kernels:
// as C++ with -fsanitize=thread's instrumentation answered by the
// emulator's hooks in libember.
//
// Every entry point launches one kernel on the default stream of the
// current device and returns what the launch call returned: 0, or the error
// of a configuration the device refuses. A checker's finding does not show
// there: the launch runs when something orders it (cudaDeviceSynchronize,
// a blocking copy), and that call returns the sticky cudaErrorLaunchFailure.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tensor/cuda_common.cuh"

#include "tests/cusim_faults.h"
#include <fenv.h>

// ---- shared memory: a tree reduction, with and without its barrier -------------------------

// out[0] = sum of x[0..blockDim.x) (blockDim.x a power of two), in dynamic shared memory
__global__ void reduce_in_shared(const float *x, float *out, bool barrier)
{
    EM_DYNAMIC_SHARED(float, sh);
    unsigned t = threadIdx.x;
    sh[t] = x[t];
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        if (barrier) __syncthreads(); // the planted bug: without it, t reads sh[t + s] while t + s writes it
    }
    if (t == 0) *out = sh[0];
}

extern "C" int cf_reduce_in_shared(const float *x, float *out, int n, bool barrier)
{
    return EM_LAUNCH(reduce_in_shared, 1, n, (size_t)n * sizeof(float), 0)(x, out, barrier);
}

// ---- barriers -------------------------------------------------------------------------------

// divergent: the two halves of the block wait at two different __syncthreads
__global__ void barrier_in_branch(int *out, bool divergent)
{
    unsigned t = threadIdx.x;
    if (divergent) {
        if (t < 16)
            __syncthreads();
        else
            __syncthreads();
    } else {
        __syncthreads();
    }
    out[t] = (int)t;
}

extern "C" int cf_barrier_in_branch(int *out, int n, bool divergent)
{
    return EM_LAUNCH(barrier_in_branch, 1, n, 0, 0)(out, divergent);
}

// early_exit: threads 16 and up return before the barrier the others wait at
__global__ void exit_before_barrier(int *out, bool early_exit)
{
    unsigned t = threadIdx.x;
    if (early_exit && t >= 16) return;
    __syncthreads();
    out[t] = (int)t;
}

extern "C" int cf_exit_before_barrier(int *out, int n, bool early_exit)
{
    return EM_LAUNCH(exit_before_barrier, 1, n, 0, 0)(out, early_exit);
}

// ---- warps ----------------------------------------------------------------------------------

// Lanes 16..31 have returned; lanes 0..15 broadcast lane 0's value. The
// full mask names the exited lanes (the bug); 0x0000ffff names the live ones.
__global__ void shuffle_after_exit(int *out, unsigned mask)
{
    unsigned t = threadIdx.x;
    if (t >= 16) return;
    out[t] = __shfl_sync(mask, (int)t + 100, 0);
}

extern "C" int cf_shuffle_after_exit(int *out, unsigned mask)
{
    return EM_LAUNCH(shuffle_after_exit, 1, 32, 0, 0)(out, mask);
}

// ---- global memory --------------------------------------------------------------------------

// out[i] = i for i < n, or (one_past) for i <= n: one element past the end
__global__ void write_indices(int *out, int n, bool one_past)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n || (one_past && i == n)) out[i] = i;
}

extern "C" int cf_write_indices(int *out, int n, bool one_past)
{
    return EM_LAUNCH(write_indices, (n + 64) / 64, 64, 0, 0)(out, n, one_past);
}

// Every thread stores its global index into out[0]: which one lands last
// depends on the order threads and blocks run (the bug). The twin takes the
// maximum atomically, which no order changes.
__global__ void last_writer_wins(int *out, bool atomic)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (atomic)
        atomicMax(out, i);
    else
        *out = i;
}

extern "C" int cf_last_writer_wins(int *out, int blocks, int threads, bool atomic)
{
    return EM_LAUNCH(last_writer_wins, blocks, threads, 0, 0)(out, atomic);
}

// ---- launch limits --------------------------------------------------------------------------

// out[t] = t, through this block's dynamic shared memory (whatever its size)
__global__ void through_shared(int *out)
{
    EM_DYNAMIC_SHARED(int, sh);
    unsigned t = threadIdx.x;
    sh[t] = (int)t;
    out[t] = sh[t];
}

extern "C" int cf_through_shared(int *out, int threads, size_t smem_bytes)
{
    return EM_LAUNCH(through_shared, 1, threads, smem_bytes, 0)(out);
}

extern "C" int cf_allow_dynamic_shared(int bytes)
{
    return cudaFuncSetAttribute(through_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// ---- more of the execution model's checks ----------------------------------------------------

// Lanes of a warp exchange values through shared memory: ordered by
// __syncwarp (sync), or not (the bug: a race between lanes).
__global__ void warp_exchange(int *out, bool sync)
{
    __shared__ int sh[64];
    unsigned t = threadIdx.x;
    sh[t] = (int)t * 10;
    if (sync) __syncwarp();
    out[t] = sh[t ^ 1];
}

extern "C" int cf_warp_exchange(int *out, bool sync)
{
    return EM_LAUNCH(warp_exchange, 1, 64, 0, 0)(out, sync);
}

// Lane 0 of warp 0 goes to __syncthreads; its warp mates wait for it in a
// shuffle; warp 1 waits at the barrier: no thread can go on.
__global__ void shuffle_then_barrier(int *out)
{
    unsigned t = threadIdx.x;
    if (t == 0)
        __syncthreads();
    else if (t < 32)
        out[t] = __shfl_sync(0xffffffffu, 1, 0);
    else
        __syncthreads();
}

extern "C" int cf_shuffle_then_barrier(int *out) { return EM_LAUNCH(shuffle_then_barrier, 1, 64, 0, 0)(out); }

// thread 3 traps; the others write out[t] = 1
__global__ void traps(int *out)
{
    if (threadIdx.x == 3) __trap();
    out[threadIdx.x] = 1;
}

extern "C" int cf_trap(int *out) { return EM_LAUNCH(traps, 1, 64, 0, 0)(out); }

// *acc += x[i] for every i, by float atomics (the sum's rounding depends on the order on a GPU too)
__global__ void float_atomics(float *acc, const float *x, int n)
{
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x))
        atomicAdd(acc, x[i]);
}

extern "C" int cf_float_atomics(float *acc, const float *x, int n)
{
    return EM_LAUNCH(float_atomics, 4, 64, 0, 0)(acc, x, n);
}

// The warp operations' results, one warp (out: 7 x 32 ints): shfl_up by 3,
// shfl_down by 5 in segments of 16, shfl from lane 7 in segments of 8, a
// ballot of lanes divisible by 3, any + 2 * all, shfl_xor 20 in segments of
// 16, and a double shuffled from lane 31 - l (times 2, as int).
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

extern "C" int cf_warp_ops(int *out) { return EM_LAUNCH(warp_ops, 1, 32, 0, 0)(out); }

// Thread 0 rounds down, thread 1 to nearest: out[t] = 1 / *three. Each
// GPU thread keeps its own floating-point mode (the fiber switch saves it).
__global__ void rounding_modes(float *out, const float *three)
{
    if (threadIdx.x == 0) fesetround(FE_DOWNWARD);
    __syncthreads();
    out[threadIdx.x] = 1.0f / *three;
    __syncthreads();
    if (threadIdx.x == 0) fesetround(FE_TONEAREST);
}

extern "C" int cf_rounding_modes(float *out, const float *three)
{
    return EM_LAUNCH(rounding_modes, 1, 2, 0, 0)(out, three);
}

// ---- the emulator's half and bfloat16 conversions (cuda_fp16.h, cuda_bf16.h) ----------------

extern "C" unsigned short cf_float2half_rn(float f) { return __half_as_ushort(__float2half_rn(f)); }
extern "C" float cf_half2float(unsigned short h) { return __half2float(__ushort_as_half(h)); }
extern "C" unsigned short cf_float2bfloat16_rn(float f)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// A histogram of 16 bins: per block in static shared memory by atomics
// (many threads on one bin between two barriers: not a race), then added
// into bins atomically.
__global__ void histogram(const int *v, int n, int *bins)
{
    __shared__ int local[16];
    int t = (int)threadIdx.x;
    if (t < 16) local[t] = 0;
    __syncthreads();
    for (int i = (int)(blockIdx.x * blockDim.x) + t; i < n; i += (int)(gridDim.x * blockDim.x))
        atomicAdd(&local[v[i] & 15], 1);
    __syncthreads();
    if (t < 16) atomicAdd(&bins[t], local[t]);
}

extern "C" int cf_histogram(const int *v, int n, int *bins)
{
    return EM_LAUNCH(histogram, 4, 128, 0, 0)(v, n, bins);
}

// out[i] = the double at byte offset `offset` of in + 8 i: an 8-byte load that
// is misaligned unless offset is a multiple of 8
__global__ void load_doubles(double *out, const char *in, int offset, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = *(const double *)(in + offset + 8 * i);
}

extern "C" int cf_load_doubles(double *out, const void *in, int offset, int n)
{
    return EM_LAUNCH(load_doubles, 1, 32, 0, 0)(out, (const char *)in, offset, n);
}
