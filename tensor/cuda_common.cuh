// cuda_common.cuh — what every .cu file of ember shares: element loads and
// stores for each dtype (the CPU's own conversions, tensor/dtype_math.h, so
// a CUDA op and its CPU twin agree bit for bit where the arithmetic does),
// strided-walk offsets, launch sizes and the stream of a device; and the two
// macros that let the same kernels build for a GPU (nvcc) or for the host,
// where ember's CUDA emulator (tests/cusim, meson -Dcuda=sim) runs them.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_impl.h"
#include "dtype_math.h"

// EM_LAUNCH(kernel, grid, block, smem, stream)(args...): a kernel launch.
// nvcc: the <<<...>>> launch. Host compiler: the emulator queues it on the
// stream (tests/cusim/include/cusim_device.h). A template kernel is written
// in parentheses: EM_LAUNCH((attn_forward<T, A>), ...).
// EM_DYNAMIC_SHARED(type, name): `name` points at the block's dynamic shared
// memory (the launch's smem bytes), 16-byte aligned.
#ifdef __CUDACC__
#define EM_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define EM_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#else
#define EM_LAUNCH(kernel, grid, block, smem, stream) ::cusim::launcher(kernel, #kernel, grid, block, smem, stream)
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

// element i of a buffer of dtype dt, as double (exact for every dtype), and
// v into element i of dtype dt with the CPU's rounding rules: the CPU's own
// functions (tensor/dtype_math.h, which tensor/dtype.c's ld/st use too)
__device__ __forceinline__ double load(em_dtype dt, const void *p, int64_t i) { return elem_load(dt, p, i); }
__device__ __forceinline__ void store(em_dtype dt, void *p, int64_t i, double v) { elem_store(dt, p, i, v); }

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
