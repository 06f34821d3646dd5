// cuda_core.cu — the kernels the engine's plumbing needs on a CUDA device:
// strided copy with conversion (views made contiguous, casts), fill, and
// gradient accumulation. See cuda_impl.h for the contract.
#include "cuda_common.cuh"

using namespace em_cu;

namespace {

__global__ void copy_kernel(cu_walk w, int64_t n, em_dtype to, void *dst, em_dtype from, const void *src)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        walk_offsets<2>(w, i, off);
        store(to, dst, off[0], load(from, src, off[1]));
    }
}

// same dtype, both contiguous: raw 4-byte words where the size allows
__global__ void copy_words(int64_t n, uint32_t *dst, const uint32_t *src)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

__global__ void fill_kernel(em_dtype dt, void *p, int64_t n, double v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        store(dt, p, i, v);
}

// dst += src in f32 (f64 when dst is f64), rounded once into dst's dtype
__global__ void add_kernel(cu_walk w, int64_t n, em_dtype dd, void *dst, em_dtype ds, const void *src)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        walk_offsets<2>(w, i, off);
        if (dd == EM_F64)
            ((double *)dst)[off[0]] += load(ds, src, off[1]);
        else
            store(dd, dst, off[0], (double)((float)load(dd, dst, off[0]) + (float)load(ds, src, off[1])));
    }
}

bool contiguous(const cu_walk &w, int k)
{
    int64_t want = 1;
    for (int d = w.ndim - 1; d >= 0; d--) {
        if (w.shape[d] != 1 && w.stride[k][d] != want) return false;
        want *= w.shape[d];
    }
    return true;
}

} // namespace

extern "C" em_status cu_copy(int dev, const cu_walk *w, em_dtype to, void *dst, em_dtype from, const void *src)
{
    em_status s = cu_use(dev, "copy");
    if (s) return s;
    int64_t n = walk_numel(*w);
    if (n == 0) return EM_OK;
    if (to == from && contiguous(*w, 0) && contiguous(*w, 1)) {
        size_t bytes = (size_t)n * em_dtype_size(to);
        if (bytes % 4 == 0 && ((uintptr_t)dst | (uintptr_t)src) % 4 == 0) {
            EM_LAUNCH(copy_words, blocks_for((int64_t)bytes / 4), THREADS, 0, stream(dev))
            ((int64_t)bytes / 4, (uint32_t *)dst, (const uint32_t *)src);
            return cu_launched("copy");
        }
        return cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(dev)), "copy");
    }
    EM_LAUNCH(copy_kernel, blocks_for(n), THREADS, 0, stream(dev))(*w, n, to, dst, from, src);
    return cu_launched("copy");
}

extern "C" em_status cu_fill(int dev, em_dtype dt, void *p, int64_t n, double v)
{
    em_status s = cu_use(dev, "fill");
    if (s || n == 0) return s;
    if (v == 0.0 && !signbit(v)) return cu_check(cudaMemsetAsync(p, 0, (size_t)n * em_dtype_size(dt), stream(dev)), "fill");
    EM_LAUNCH(fill_kernel, blocks_for(n), THREADS, 0, stream(dev))(dt, p, n, v);
    return cu_launched("fill");
}

extern "C" em_status cu_add_into(int dev, const cu_walk *w, em_dtype dt_dst, void *dst, em_dtype dt_src,
                                 const void *src)
{
    em_status s = cu_use(dev, "gradient accumulation");
    if (s) return s;
    int64_t n = walk_numel(*w);
    if (n == 0) return EM_OK;
    EM_LAUNCH(add_kernel, blocks_for(n), THREADS, 0, stream(dev))(*w, n, dt_dst, dst, dt_src, src);
    return cu_launched("gradient accumulation");
}
