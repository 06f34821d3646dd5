// optim.cu — CUDA kernels of optim/ and amp/ (see tensor/cuda_impl.h for the
// conventions and optim/cuda_optim.h for the contracts): the fused SGD /
// Adam / AdamW update, the sum of squares and scaling of gradient clipping,
// and the loss scaler's unscale with its inf/NaN flag.
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

// SGD:  d = g + wd p;  buf = first ? d : mom buf + (1-damp) d;
//       p -= lr (nesterov ? d + mom buf : buf)   (no buffer: p -= lr d)
// Adam: m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//       p -= step_size m / (sqrt(v) / sqrt(bc2) + eps)
//       with g += wd p (Adam) or p *= 1 - lr wd first (AdamW).
// T is float (coefficients rounded to f32 once, as optim.c's f32 kernels) or double.
template <typename T>
__global__ void update_kernel(cu_upd u, em_dtype pdt, void *p, em_dtype gdt, const void *g, T *s1, T *s2,
                              int64_t n)
{
    const T lr = (T)u.lr, wd = (T)u.wd, mom = (T)u.mom, omd = (T)(1.0 - u.damp);
    const T b1 = (T)u.b1, omb1 = (T)(1.0 - u.b1), b2 = (T)u.b2, omb2 = (T)(1.0 - u.b2);
    const T eps = (T)u.eps, ss = (T)u.step_size, bc2s = (T)u.bc2_sqrt, decay = (T)u.decay;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T pi = get<T>(pdt, p, i), gi = get<T>(gdt, g, i);
        if (u.sgd) {
            T d = gi;
            if (u.wd != 0) d += wd * pi;
            if (u.has_buf) {
                T b = u.first ? d : mom * s1[i] + omd * d;
                s1[i] = b;
                d = u.nesterov ? d + mom * b : b;
            }
            pi -= lr * d;
        } else {
            if (u.decoupled) pi *= decay;
            if (u.l2) gi += wd * pi;
            T mi = b1 * s1[i] + omb1 * gi;
            T vi = b2 * s2[i] + omb2 * gi * gi;
            s1[i] = mi, s2[i] = vi;
            pi = pi - ss * (mi / (sqrt(vi) / bc2s + eps));
        }
        put<T>(pdt, p, i, pi);
    }
}

// Block b's partial sum of squares (grid-stride, then a tree in shared
// memory: the order depends only on n and the grid, so the bits are fixed).
__global__ void sumsq_parts(em_dtype dt, const void *x, int64_t n, double *part)
{
    __shared__ double sh[THREADS];
    double acc = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double v = dt == EM_F64 ? ((const double *)x)[i] : (double)get<float>(dt, x, i);
        acc += v * v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

// *out = the sum of nparts partials, one block, fixed order
__global__ void sum_parts(const double *part, int nparts, double *out)
{
    __shared__ double sh[THREADS];
    double acc = 0;
    for (int i = threadIdx.x; i < nparts; i += THREADS) acc += part[i];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

__global__ void scale_kernel(em_dtype dt, void *x, int64_t n, double c)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (dt == EM_F64)
            ((double *)x)[i] *= c;
        else if (dt == EM_F32)
            ((float *)x)[i] *= (float)c;
        else // f16/bf16: as optim_state.c, through double with c rounded to f32
            store(dt, x, i, load(dt, x, i) * (double)(float)c);
    }
}

__global__ void unscale_kernel(em_dtype dt, void *x, int64_t n, double inv, int *found)
{
    bool bad = false;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (dt == EM_F64) {
            double v = ((double *)x)[i] * inv;
            ((double *)x)[i] = v;
            bad |= !isfinite(v);
        } else {
            float v = get<float>(dt, x, i) * (float)inv;
            put<float>(dt, x, i, v);
            bad |= !isfinite(v);
        }
    }
    if (bad) *found = 1; // every writer writes the same value
}

constexpr unsigned MAX_PARTS = 1024;

} // namespace

extern "C" em_status cu_optim_update(int dev, const cu_upd *u, em_dtype pdt, void *p, em_dtype gdt, const void *g,
                                     em_dtype sdt, void *s1, void *s2, int64_t n)
{
    em_status s = cu_use(dev, "em_optim_step");
    if (s || n == 0) return s;
    if (sdt == EM_F64)
        EM_LAUNCH(update_kernel<double>, blocks_for(n), THREADS, 0, stream(dev))
        (*u, pdt, p, gdt, g, (double *)s1, (double *)s2, n);
    else
        EM_LAUNCH(update_kernel<float>, blocks_for(n), THREADS, 0, stream(dev))
        (*u, pdt, p, gdt, g, (float *)s1, (float *)s2, n);
    return cu_launched("em_optim_step");
}

extern "C" em_status cu_sumsq(int dev, em_dtype dt, const void *x, int64_t n, double *out)
{
    em_status s = cu_use(dev, "em_clip_grad_norm");
    if (s) return s;
    unsigned parts = blocks_for(n) < MAX_PARTS ? blocks_for(n) : MAX_PARTS;
    double *part = (double *)cu_alloc(dev, parts * sizeof(double));
    if (!part) return em_last_status();
    EM_LAUNCH(sumsq_parts, parts, THREADS, 0, stream(dev))(dt, x, n, part);
    EM_LAUNCH(sum_parts, 1, THREADS, 0, stream(dev))(part, (int)parts, out);
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
