// ops_conv.cu — CUDA kernels of conv2d (im2col / col2im around cuBLAS
// products, which tensor/ops_conv.c makes through cu_matmul) and of
// max_pool2d / avg_pool2d, forward and backward. Contracts in cuda_conv.h;
// conventions in cuda_impl.h.
//
// Every kernel gives each output element to one thread, which computes it
// with plain loops in the CPU kernels' order: no atomics, no shared memory,
// results repeat bit for bit. T is the compute type (float, or double for
// f64 tensors); loads and stores go through cuda_common.cuh's load/store, so
// any float dtype is read exactly and rounded as the CPU rounds.
#include "cuda_common.cuh"
#include "cuda_conv.h"

using namespace em_cu;

namespace
{

#define GRID_LOOP(i, n)                                                                                      \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);                                \
         i += (int64_t)gridDim.x * blockDim.x)

// one thread per element of col (C*KH*KW, N*OH*OW)
template <typename T>
__global__ void im2col_k(cu_conv_geom g, em_dtype xdt, const void *x, T *col)
{
    int64_t ncols = g.N * g.OH * g.OW;
    GRID_LOOP(i, g.C * g.KH * g.KW * ncols)
    {
        int64_t r = i / ncols, q = i % ncols;
        int64_t ch = r / (g.KH * g.KW), kh = (r / g.KW) % g.KH, kw = r % g.KW;
        int64_t n = q / (g.OH * g.OW), oh = (q / g.OW) % g.OH, ow = q % g.OW;
        int64_t ih = oh * g.s - g.p + kh, iw = ow * g.s - g.p + kw;
        bool in = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
        col[i] = in ? (T)load(xdt, x, ((n * g.C + ch) * g.H + ih) * g.W + iw) : (T)0;
    }
}

// one thread per element of dx (N,C,H,W): the column entries that im2col
// copied from it, (kh,kw) ascending
template <typename T>
__global__ void col2im_k(cu_conv_geom g, const T *dcol, em_dtype xdt, void *dx)
{
    int64_t ncols = g.N * g.OH * g.OW;
    GRID_LOOP(i, g.N * g.C * g.H * g.W)
    {
        int64_t iw = i % g.W, ih = (i / g.W) % g.H, ch = (i / (g.W * g.H)) % g.C, n = i / (g.W * g.H * g.C);
        T a = 0;
        for (int64_t kh = 0; kh < g.KH; kh++) {
            int64_t th = ih + g.p - kh; // = oh * s
            if (th < 0 || th % g.s) continue;
            int64_t oh = th / g.s;
            if (oh >= g.OH) continue;
            for (int64_t kw = 0; kw < g.KW; kw++) {
                int64_t tw = iw + g.p - kw;
                if (tw < 0 || tw % g.s) continue;
                int64_t ow = tw / g.s;
                if (ow >= g.OW) continue;
                int64_t r = (ch * g.KH + kh) * g.KW + kw;
                a += dcol[r * ncols + (n * g.OH + oh) * g.OW + ow];
            }
        }
        store(xdt, dx, i, (double)a);
    }
}

// one thread per output element (plane, oh, ow)
__global__ void pool_fwd_k(bool is_max, cu_conv_geom g, em_dtype dt, const void *x, void *y, int32_t *arg)
{
    int64_t ohw = g.OH * g.OW;
    GRID_LOOP(i, g.N * g.C * ohw)
    {
        int64_t pl = i / ohw, oh = (i % ohw) / g.OW, ow = i % g.OW, xb = pl * g.H * g.W;
        double best = -INFINITY, s = 0;
        int64_t bi = -1;
        for (int64_t kh = 0; kh < g.KH; kh++) {
            int64_t ih = oh * g.s - g.p + kh;
            if (ih < 0 || ih >= g.H) continue;
            for (int64_t kw = 0; kw < g.KW; kw++) {
                int64_t iw = ow * g.s - g.p + kw;
                if (iw < 0 || iw >= g.W) continue;
                double v = load(dt, x, xb + ih * g.W + iw);
                if (!is_max) {
                    s += v;
                } else if (bi < 0 || v > best || (v != v && best == best)) { // first max; NaN wins
                    best = v;
                    bi = ih * g.W + iw;
                }
            }
        }
        double out = is_max ? best : s * (1.0 / (double)(g.KH * g.KW));
        store(dt, y, i, out); // through f32 unless f64, as the CPU's f32 scratch
        if (arg) arg[i] = (int32_t)bi;
    }
}

// one thread per input element: the windows covering it, in ascending order
template <typename T>
__global__ void pool_bwd_k(bool is_max, cu_conv_geom g, em_dtype gdt, const void *gy, const int32_t *arg,
                           em_dtype dt, void *dx)
{
    int64_t ohw = g.OH * g.OW;
    double inv = 1.0 / (double)(g.KH * g.KW);
    GRID_LOOP(i, g.N * g.C * g.H * g.W)
    {
        int64_t iw = i % g.W, ih = (i / g.W) % g.H, pl = i / (g.W * g.H), me = ih * g.W + iw;
        // oh with oh*s - p <= ih <= oh*s - p + KH-1, within [0, OH)
        int64_t lo_h = ih + g.p - (g.KH - 1), lo_w = iw + g.p - (g.KW - 1);
        int64_t oh0 = lo_h <= 0 ? 0 : (lo_h + g.s - 1) / g.s, oh1 = (ih + g.p) / g.s;
        int64_t ow0 = lo_w <= 0 ? 0 : (lo_w + g.s - 1) / g.s, ow1 = (iw + g.p) / g.s;
        if (oh1 > g.OH - 1) oh1 = g.OH - 1;
        if (ow1 > g.OW - 1) ow1 = g.OW - 1;
        T a = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                int64_t j = pl * ohw + oh * g.OW + ow;
                if (is_max) {
                    if (arg[j] == me) a += (T)load(gdt, gy, j);
                } else {
                    a += (T)(load(gdt, gy, j) * inv);
                }
            }
        store(dt, dx, i, (double)a);
    }
}

} // namespace

extern "C" em_status cu_im2col(int dev, const cu_conv_geom *g, em_dtype xdt, const void *x, em_dtype ct, void *col)
{
    const char *op = "conv2d";
    em_status s = cu_use(dev, op);
    int64_t n = g->C * g->KH * g->KW * g->N * g->OH * g->OW;
    if (s || n == 0) return s;
    if (ct == EM_F64)
        EM_LAUNCH(im2col_k<double>, blocks_for(n), THREADS, 0, stream(dev))(*g, xdt, x, (double *)col);
    else
        EM_LAUNCH(im2col_k<float>, blocks_for(n), THREADS, 0, stream(dev))(*g, xdt, x, (float *)col);
    return cu_launched(op);
}

extern "C" em_status cu_col2im(int dev, const cu_conv_geom *g, em_dtype ct, const void *dcol, em_dtype xdt, void *dx)
{
    const char *op = "conv2d backward";
    em_status s = cu_use(dev, op);
    int64_t n = g->N * g->C * g->H * g->W;
    if (s || n == 0) return s;
    if (ct == EM_F64)
        EM_LAUNCH(col2im_k<double>, blocks_for(n), THREADS, 0, stream(dev))(*g, (const double *)dcol, xdt, dx);
    else
        EM_LAUNCH(col2im_k<float>, blocks_for(n), THREADS, 0, stream(dev))(*g, (const float *)dcol, xdt, dx);
    return cu_launched(op);
}

extern "C" em_status cu_pool_fwd(int dev, bool is_max, const cu_conv_geom *g, em_dtype dt, const void *x, void *y,
                                 int32_t *arg)
{
    const char *op = is_max ? "max_pool2d" : "avg_pool2d";
    em_status s = cu_use(dev, op);
    int64_t n = g->N * g->C * g->OH * g->OW;
    if (s || n == 0) return s;
    EM_LAUNCH(pool_fwd_k, blocks_for(n), THREADS, 0, stream(dev))(is_max, *g, dt, x, y, arg);
    return cu_launched(op);
}

extern "C" em_status cu_pool_bwd(int dev, bool is_max, const cu_conv_geom *g, em_dtype gdt, const void *gy,
                                 const int32_t *arg, em_dtype dt, void *dx)
{
    const char *op = is_max ? "max_pool2d backward" : "avg_pool2d backward";
    em_status s = cu_use(dev, op);
    int64_t n = g->N * g->C * g->H * g->W;
    if (s || n == 0) return s;
    if (dt == EM_F64)
        EM_LAUNCH(pool_bwd_k<double>, blocks_for(n), THREADS, 0, stream(dev))(is_max, *g, gdt, gy, arg, dt, dx);
    else
        EM_LAUNCH(pool_bwd_k<float>, blocks_for(n), THREADS, 0, stream(dev))(is_max, *g, gdt, gy, arg, dt, dx);
    return cu_launched(op);
}
