// cuda_common.cuh — what every .cu file of ember shares: element loads and
// stores for each dtype (with the CPU's rounding rules, so a CUDA op and its
// CPU twin agree bit for bit where the arithmetic does), strided-walk
// offsets, launch sizes and the stream of a device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_impl.h"

// A kernel launch and a kernel's dynamic shared memory, written once for both
// compilers: nvcc's own syntax, or under the emulator (tests/cusim, meson
// -Dcuda=sim: the host C++ compiler builds this file) its launcher. A
// template kernel whose name has a comma goes in parentheses:
//   EM_LAUNCH((attn_forward<T, A>), grid, block, smem, stream)(args...);
// The dynamic shared buffer is 16-byte aligned under both.
#ifdef __CUDACC__
#define EM_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define EM_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#else
#define EM_LAUNCH(kernel, grid, block, smem, stream)                                                         \
    ::cusim::launcher(kernel, #kernel, grid, block, smem, stream)
#define EM_DYNAMIC_SHARED(type, name) type *name = (type *)::cusim::dynamic_shared()
#endif

namespace em_cu {

constexpr int THREADS = 256;

// blocks for n elements at THREADS per block, capped (grid-stride loops cover the rest)
inline unsigned blocks_for(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b < 1) b = 1;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
}

inline cudaStream_t stream(int dev) { return (cudaStream_t)cu_stream(dev); }

// f32 -> bf16 bits: round to nearest even, a NaN stays a quiet NaN (the same
// rule as tensor/tensor_impl.h's bf16_round)
__device__ __forceinline__ uint16_t bf16_bits(float x)
{
    uint32_t u = __float_as_uint(x);
    uint32_t r = u + 0x7fffu + ((u >> 16) & 1), q = u | 0x400000u;
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u ? q : r) >> 16);
}
__device__ __forceinline__ float bf16_value(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// element i of a buffer of dtype dt, as double (exact for every dtype)
__device__ __forceinline__ double load(em_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case EM_F32: return ((const float *)p)[i];
    case EM_F64: return ((const double *)p)[i];
    case EM_F16: return __half2float(((const __half *)p)[i]);
    case EM_BF16: return bf16_value(((const uint16_t *)p)[i]);
    case EM_I32: return ((const int32_t *)p)[i];
    case EM_U8: return ((const uint8_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0;
    }
}

// v into element i of dtype dt, as the CPU's st() does: f16/bf16 round from
// f32, integers truncate toward zero and saturate (NaN to 0), bool is v != 0
__device__ __forceinline__ void store(em_dtype dt, void *p, int64_t i, double v)
{
    switch (dt) {
    case EM_F32: ((float *)p)[i] = (float)v; break;
    case EM_F64: ((double *)p)[i] = v; break;
    case EM_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case EM_BF16: ((uint16_t *)p)[i] = bf16_bits((float)v); break;
    case EM_I32:
        ((int32_t *)p)[i] = v != v ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
        break;
    case EM_U8: ((uint8_t *)p)[i] = v != v || v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v; break;
    default: ((uint8_t *)p)[i] = v != 0;
    }
}

// the element offsets of operands 0..nops-1 for the linear (row-major)
// position i of walk w
template <int NOPS>
__device__ __forceinline__ void walk_offsets(const cu_walk &w, int64_t i, int64_t *off)
{
    for (int k = 0; k < NOPS; k++) off[k] = 0;
    for (int d = w.ndim - 1; d >= 0; d--) {
        int64_t n = w.shape[d], c = n > 0 ? i % n : 0;
        i = n > 0 ? i / n : 0;
        for (int k = 0; k < NOPS; k++) off[k] += c * w.stride[k][d];
    }
}

inline int64_t walk_numel(const cu_walk &w)
{
    int64_t n = 1;
    for (int d = 0; d < w.ndim; d++) n *= w.shape[d];
    return n;
}

} // namespace em_cu
