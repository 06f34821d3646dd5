// optim.cu — CUDA kernels of optim/ and amp/ (see tensor/cuda_impl.h for the
// conventions and optim/cuda_optim.h for the contracts): the fused SGD /
// Adam / AdamW update, the norm and scaling of gradient clipping,
// and the loss scaler's unscale with its inf/NaN flag. The per-element maths
// is the CPU's: optim/update_math.h.
#include "../tensor/cuda_common.cuh"
#include "cuda_optim.h"

using namespace em_cu;

namespace {

// Element i as the compute type T (f32 for every dtype but f64), and back.
template <typename T> __device__ __forceinline__ T get(em_dtype dt, const void *p, int64_t i)
{
    if (dt == EM_F32) return (T)((const float *)p)[i];
    if (dt == EM_F64) return (T)((const double *)p)[i];
    return (T)load(dt, p, i); // f16 / bf16: exact in f32
}
template <typename T> __device__ __forceinline__ void put(em_dtype dt, void *p, int64_t i, T v)
{
    if (dt == EM_F32)
        ((float *)p)[i] = (float)v;
    else if (dt == EM_F64)
        ((double *)p)[i] = (double)v;
    else
        store(dt, p, i, (double)(float)v); // rounds from f32, as the CPU
}

// update_math.h's element functions by compute type
__device__ __forceinline__ float sgd_elem(const opt_k_f32 *k, float p, float g, float *buf, bool momentum,
                                          bool decay, bool first, bool nesterov, bool maximize)
{
    return sgd_elem_f32(k, p, g, buf, momentum, decay, first, nesterov, maximize);
}
__device__ __forceinline__ double sgd_elem(const opt_k_f64 *k, double p, double g, double *buf, bool momentum,
                                           bool decay, bool first, bool nesterov, bool maximize)
{
    return sgd_elem_f64(k, p, g, buf, momentum, decay, first, nesterov, maximize);
}
__device__ __forceinline__ float adam_elem(const opt_k_f32 *k, float p, float g, float *m, float *v,
                                           float *vmax, bool l2, bool decoupled, bool amsgrad, bool maximize)
{
    return adam_elem_f32(k, p, g, m, v, vmax, l2, decoupled, amsgrad, maximize);
}
__device__ __forceinline__ double adam_elem(const opt_k_f64 *k, double p, double g, double *m, double *v,
                                            double *vmax, bool l2, bool decoupled, bool amsgrad,
                                            bool maximize)
{
    return adam_elem_f64(k, p, g, m, v, vmax, l2, decoupled, amsgrad, maximize);
}

// One SGD / Adam / AdamW step (optim/update_math.h) over n elements in the
// compute type T of the coefficients K: float (opt_k_f32, rounded from u on
// the host as optim.c's f32 loops round them) or double (opt_k_f64).
template <typename T, typename K>
__global__ void update_kernel(opt_coef u, K k, em_dtype pdt, void *p, em_dtype gdt, const void *g, T *s1,
                              T *s2, T *s3, int64_t n)
{
    const bool decay = u.wd != 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T pi = get<T>(pdt, p, i), gi = get<T>(gdt, g, i);
        if (u.sgd)
            pi = sgd_elem(&k, pi, gi, s1 ? &s1[i] : nullptr, s1 != nullptr, decay, u.first, u.nesterov,
                          u.maximize);
        else
            pi = adam_elem(&k, pi, gi, &s1[i], &s2[i], u.amsgrad ? &s3[i] : nullptr, u.l2, u.decoupled,
                           u.amsgrad, u.maximize);
        put<T>(pdt, p, i, pi);
    }
}

// Block b's partial accumulation of the p-norm (update_math.h's norm_acc;
// grid-stride, then a tree in shared memory: the order depends only on n
// and the grid, so the bits are fixed).
__global__ void norm_parts(em_dtype dt, const void *x, int64_t n, double p, double *part)
{
    __shared__ double sh[THREADS];
    double acc = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double v = dt == EM_F64 ? ((const double *)x)[i] : (double)get<float>(dt, x, i);
        acc = norm_acc(acc, v, p);
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = norm_join(sh[threadIdx.x], sh[threadIdx.x + s], p);
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

// *out = the nparts partials joined, one block, fixed order
__global__ void join_parts(const double *part, int nparts, double p, double *out)
{
    __shared__ double sh[THREADS];
    double acc = 0;
    for (int i = threadIdx.x; i < nparts; i += THREADS) acc = norm_join(acc, part[i], p);
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = norm_join(sh[threadIdx.x], sh[threadIdx.x + s], p);
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

__global__ void scale_kernel(em_dtype dt, void *x, int64_t n, double c)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        grad_scale_elem(dt, x, i, c);
}

__global__ void unscale_kernel(em_dtype dt, void *x, int64_t n, double inv, int *found)
{
    bool bad = false;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        bad |= !grad_scale_elem(dt, x, i, inv);
    if (bad) *found = 1; // every writer writes the same value
}

constexpr unsigned MAX_PARTS = 1024;

} // namespace

extern "C" em_status cu_optim_update(int dev, const opt_coef *u, em_dtype pdt, void *p, em_dtype gdt,
                                     const void *g, em_dtype sdt, void *const *st, int64_t n)
{
    em_status s = cu_use(dev, "em_optim_step");
    if (s || n == 0) return s;
    if (sdt == EM_F64) {
        const opt_k_f64 k = opt_k_of_f64(u);
        EM_LAUNCH((update_kernel<double, opt_k_f64>), blocks_for(n), THREADS, 0, stream(dev))
        (*u, k, pdt, p, gdt, g, (double *)st[0], (double *)st[1], (double *)st[2], n);
    } else {
        const opt_k_f32 k = opt_k_of_f32(u);
        EM_LAUNCH((update_kernel<float, opt_k_f32>), blocks_for(n), THREADS, 0, stream(dev))
        (*u, k, pdt, p, gdt, g, (float *)st[0], (float *)st[1], (float *)st[2], n);
    }
    return cu_launched("em_optim_step");
}

extern "C" em_status cu_norm_acc(int dev, em_dtype dt, const void *x, int64_t n, double p, double *out)
{
    em_status s = cu_use(dev, "em_clip_grad_norm");
    if (s) return s;
    unsigned parts = blocks_for(n) < MAX_PARTS ? blocks_for(n) : MAX_PARTS;
    double *part = (double *)cu_alloc(dev, parts * sizeof(double));
    if (!part) return em_last_status();
    EM_LAUNCH(norm_parts, parts, THREADS, 0, stream(dev))(dt, x, n, p, part);
    EM_LAUNCH(join_parts, 1, THREADS, 0, stream(dev))(part, (int)parts, p, out);
    s = cu_launched("em_clip_grad_norm");
    cu_free(dev, part); // stream order: reused only by later work
    return s;
}

extern "C" em_status cu_scale(int dev, em_dtype dt, void *x, int64_t n, double c)
{
    em_status s = cu_use(dev, "em_clip_grad_norm");
    if (s || n == 0) return s;
    EM_LAUNCH(scale_kernel, blocks_for(n), THREADS, 0, stream(dev))(dt, x, n, c);
    return cu_launched("em_clip_grad_norm");
}

extern "C" em_status cu_unscale(int dev, em_dtype dt, void *x, int64_t n, double inv, int *found)
{
    em_status s = cu_use(dev, "em_scaler_unscale");
    if (s || n == 0) return s;
    EM_LAUNCH(unscale_kernel, blocks_for(n), THREADS, 0, stream(dev))(dt, x, n, inv, found);
    return cu_launched("em_scaler_unscale");
}
