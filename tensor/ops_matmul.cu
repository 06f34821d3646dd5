// ops_matmul.cu — CUDA kernels of the product ops: the fused causal
// attention as flash-attention style kernels (matmul itself is one cuBLAS
// call, in tensor/cuda_blas.c, host code in C) (the
// (T,T) score matrix is never stored). Contract: tensor/cuda_matmul.h;
// conventions: tensor/cuda_impl.h.
//
// Attention tiling. A block owns BR = 16 rows of one head (4 warps of 4
// rows each) and streams the other side's rows through shared memory in
// tiles of BC (32 for f32/f16/bf16, 16 for f64). Within a tile, lane c of a
// warp computes the score of the warp's row against tile row c (so BC <=
// 32); the D-vectors a warp accumulates are spread over its lanes (lane l
// holds elements l, l+32, l+64, l+96: D <= 128). All arithmetic is in f32
// (f64 for f64 inputs).
//   forward:    block = 16 query rows; key/value tiles 0 .. the block's last
//               row (tiles above the diagonal are never loaded); online
//               softmax per row (running max m and sum l, the accumulator
//               rescaled by exp(m_old - m_new)); writes o = acc / l and
//               lse = m + log l.
//   backward:   delta_i = dout_i . o_i (one warp per row); then
//     dk, dv:   block = 16 key rows; query tiles from the block's first key
//               to T. Recompute p_ij = exp(s_ij - lse_i), ds_ij = p_ij
//               (dout_i . v_j - delta_i); dv_j += p_ij dout_i, dk_j += ds_ij
//               scale q_i.
//     dq:       block = 16 query rows; key tiles as in forward; dq_i +=
//               ds_ij k_j, times scale at the end.
//   Two backward kernels instead of one with atomics: each gradient row is
//   owned by one warp, so the result is deterministic.
// Scores are always computed as sum_d (scale q_i[d]) k_j[d] in the same
// order, so backward recomputes exactly the forward's s.
#include <limits.h>
#include <math.h>

#include "cuda_common.cuh"
#include "cuda_matmul.h"

// from tensor/error.c (tensor_impl.h is C only)
extern "C" em_status em_err(em_status s, const char *fmt, ...);

using namespace em_cu;

// ---- attention ------------------------------------------------------------------------------

namespace
{

constexpr unsigned FULL = 0xffffffffu;
constexpr int WARPS = 4;                      // warps per block
constexpr int RPW = 4;                        // rows each warp owns
constexpr int BR = WARPS * RPW;               // rows per block
constexpr int MAXV = CU_ATTENTION_MAX_D / 32; // elements of a D-vector per lane

// the other side's rows per tile: one per lane, and a tile of f64 half as long
template <typename A> constexpr int tile_rows() { return sizeof(A) == 8 ? 16 : 32; }

// f16 and bf16 as their bits (the conversions are the CPU's, tensor/dtype_math.h)
struct f16 {
    uint16_t bits;
};
struct bf16 {
    uint16_t bits;
};

template <typename T> struct acc_of {
    using type = float;
};
template <> struct acc_of<double> {
    using type = double;
};

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(f16 x) { return f16_bits_to_f32(x.bits); }
__device__ __forceinline__ float to_acc(bf16 x) { return bf16_bits_to_f32(x.bits); }
__device__ __forceinline__ void put(float *p, float v) { *p = v; }
__device__ __forceinline__ void put(double *p, double v) { *p = v; }
__device__ __forceinline__ void put(f16 *p, float v) { p->bits = f32_to_f16_bits(v); }
__device__ __forceinline__ void put(bf16 *p, float v) { p->bits = f32_to_bf16_bits(v); }
__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }
__device__ __forceinline__ float lg(float x) { return logf(x); }
__device__ __forceinline__ double lg(double x) { return log(x); }

template <typename A> __device__ __forceinline__ A warp_max(A x)
{
    for (int o = 16; o > 0; o >>= 1) {
        A y = __shfl_xor_sync(FULL, x, o);
        x = y > x ? y : x;
    }
    return x;
}

template <typename A> __device__ __forceinline__ A warp_sum(A x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}

template <typename A> __device__ __forceinline__ A dot(const A *x, const A *y, int D)
{
    A s = 0;
    for (int d = 0; d < D; d++) s += x[d] * y[d];
    return s;
}

// Forward. Grid: BH * nqb blocks (nqb = ceil(L/BR)), the last query blocks
// (the most keys) first. Shared: qs (BR,D), ks (BC,D+1), vs (BC,D).
template <typename T, typename A>
__global__ void __launch_bounds__(WARPS * 32)
    attn_forward(const T *q, const T *k, const T *v, T *o, A *lse, int64_t L, int D, A scale, int64_t nqb)
{
    constexpr int BC = tile_rows<A>();
    EM_DYNAMIC_SHARED(unsigned char, smem);
    A *qs = (A *)smem;         // this block's query rows, times scale
    A *ks = qs + BR * D;       // the key tile, rows padded by one against bank conflicts
    A *vs = ks + BC * (D + 1); // the value tile
    const int64_t bh = blockIdx.x / nqb, q0 = (nqb - 1 - blockIdx.x % nqb) * BR;
    q += bh * L * D, k += bh * L * D, v += bh * L * D, o += bh * L * D, lse += bh * L;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    for (int x = threadIdx.x; x < BR * D; x += blockDim.x) {
        int64_t i = q0 + x / D;
        qs[x] = i < L ? to_acc(q[i * D + x % D]) * scale : A(0);
    }
    A m[RPW], l[RPW], acc[RPW][MAXV];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
#pragma unroll
        for (int t = 0; t < MAXV; t++) acc[r][t] = 0;
    }
    // keys past the block's last row are masked for all its rows: not loaded
    const int64_t kend = min(L, q0 + BR);
    for (int64_t k0 = 0; k0 < kend; k0 += BC) {
        __syncthreads(); // the previous tile is used up (and qs written)
        for (int x = threadIdx.x; x < BC * D; x += blockDim.x) {
            int c = x / D, d = x % D;
            int64_t j = k0 + c;
            ks[c * (D + 1) + d] = j < L ? to_acc(k[j * D + d]) : A(0);
            vs[x] = j < L ? to_acc(v[j * D + d]) : A(0);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int row = warp * RPW + r;
            const int64_t i = q0 + row;
            if (i >= L || k0 > i) continue; // the whole tile is masked for this row (warp-uniform)
            // tile rows 0..n-1 are keys <= i (so < L); lane 0's always is
            const int n = (int)min((int64_t)BC, i - k0 + 1);
            const A s = lane < n ? dot(qs + row * D, ks + lane * (D + 1), D) : A(-INFINITY);
            const A mnew = max(m[r], warp_max(s));
            const A p = lane < n ? ex(s - mnew) : A(0);
            const A corr = ex(m[r] - mnew); // 0 on the first tile, where m = -inf
            l[r] = l[r] * corr + warp_sum(p);
            m[r] = mnew;
#pragma unroll
            for (int t = 0; t < MAXV; t++) acc[r][t] *= corr;
            for (int c = 0; c < n; c++) {
                const A pc = __shfl_sync(FULL, p, c);
#pragma unroll
                for (int t = 0; t < MAXV; t++)
                    if (lane + 32 * t < D) acc[r][t] += pc * vs[c * D + lane + 32 * t];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int64_t i = q0 + warp * RPW + r;
        if (i >= L) continue;
        const A inv = A(1) / l[r];
#pragma unroll
        for (int t = 0; t < MAXV; t++)
            if (lane + 32 * t < D) put(o + i * D + lane + 32 * t, acc[r][t] * inv);
        if (lane == 0) lse[i] = m[r] + lg(l[r]);
    }
}

// delta_i = dout_i . o_i, one warp per row of all heads
template <typename T, typename A>
__global__ void attn_delta(const T *o, const T *dout, A *delta, int64_t rows, int D)
{
    const int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return; // the whole warp
    A s = 0;
    for (int d = lane; d < D; d += 32) s += to_acc(o[row * D + d]) * to_acc(dout[row * D + d]);
    s = warp_sum(s);
    if (lane == 0) delta[row] = s;
}

// dk, dv. Grid: BH * nkb blocks of BR key rows. Shared: ks, vs (BR,D);
// qs, gs (BC,D+1) a tile of query rows (times scale) and of dout; ls, es
// (BC) their lse and delta.
template <typename T, typename A>
__global__ void __launch_bounds__(WARPS * 32)
    attn_backward_kv(const T *q, const T *k, const T *v, const T *dout, const A *lse, const A *delta, T *dk,
                     T *dv, int64_t L, int D, A scale, int64_t nkb)
{
    constexpr int BC = tile_rows<A>();
    EM_DYNAMIC_SHARED(unsigned char, smem);
    A *ks = (A *)smem;
    A *vs = ks + BR * D;
    A *qs = vs + BR * D;
    A *gs = qs + BC * (D + 1);
    A *ls = gs + BC * (D + 1);
    A *es = ls + BC;
    const int64_t bh = blockIdx.x / nkb, j0 = (blockIdx.x % nkb) * BR;
    const int64_t off = bh * L * D;
    q += off, k += off, v += off, dout += off, dk += off, dv += off, lse += bh * L, delta += bh * L;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    for (int x = threadIdx.x; x < BR * D; x += blockDim.x) {
        int64_t j = j0 + x / D;
        ks[x] = j < L ? to_acc(k[j * D + x % D]) : A(0);
        vs[x] = j < L ? to_acc(v[j * D + x % D]) : A(0);
    }
    A gk[RPW][MAXV], gv[RPW][MAXV];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < MAXV; t++) gk[r][t] = gv[r][t] = 0;
    // queries before j0 see none of these keys
    for (int64_t i0 = j0; i0 < L; i0 += BC) {
        __syncthreads();
        for (int x = threadIdx.x; x < BC * D; x += blockDim.x) {
            int c = x / D, d = x % D;
            int64_t i = i0 + c;
            qs[c * (D + 1) + d] = i < L ? to_acc(q[i * D + d]) * scale : A(0);
            gs[c * (D + 1) + d] = i < L ? to_acc(dout[i * D + d]) : A(0);
        }
        for (int x = threadIdx.x; x < BC; x += blockDim.x) {
            ls[x] = i0 + x < L ? lse[i0 + x] : A(0);
            es[x] = i0 + x < L ? delta[i0 + x] : A(0);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int row = warp * RPW + r;
            const int64_t j = j0 + row;
            if (j >= L || i0 + BC <= j) continue; // every query of the tile is before key j
            // tile rows first..last-1 are queries i with j <= i < L
            const int first = (int)max((int64_t)0, j - i0), last = (int)min((int64_t)BC, L - i0);
            A p = 0, ds = 0;
            if (lane >= first && lane < last) {
                p = ex(dot(qs + lane * (D + 1), ks + row * D, D) - ls[lane]);
                ds = p * (dot(gs + lane * (D + 1), vs + row * D, D) - es[lane]);
            }
            for (int c = first; c < last; c++) {
                const A pc = __shfl_sync(FULL, p, c), dc = __shfl_sync(FULL, ds, c);
#pragma unroll
                for (int t = 0; t < MAXV; t++)
                    if (lane + 32 * t < D) {
                        gv[r][t] += pc * gs[c * (D + 1) + lane + 32 * t];
                        gk[r][t] += dc * qs[c * (D + 1) + lane + 32 * t]; // qs holds scale q: ds/dk = scale q
                    }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int64_t j = j0 + warp * RPW + r;
        if (j >= L) continue;
#pragma unroll
        for (int t = 0; t < MAXV; t++)
            if (lane + 32 * t < D) {
                put(dk + j * D + lane + 32 * t, gk[r][t]);
                put(dv + j * D + lane + 32 * t, gv[r][t]);
            }
    }
}

// dq. Grid as forward. Shared: qs (times scale), gs (BR,D) the block's
// query and dout rows; ks, vs (BC,D+1) the key and value tile.
template <typename T, typename A>
__global__ void __launch_bounds__(WARPS * 32)
    attn_backward_q(const T *q, const T *k, const T *v, const T *dout, const A *lse, const A *delta, T *dq,
                    int64_t L, int D, A scale, int64_t nqb)
{
    constexpr int BC = tile_rows<A>();
    EM_DYNAMIC_SHARED(unsigned char, smem);
    A *qs = (A *)smem;
    A *gs = qs + BR * D;
    A *ks = gs + BR * D;
    A *vs = ks + BC * (D + 1);
    const int64_t bh = blockIdx.x / nqb, q0 = (nqb - 1 - blockIdx.x % nqb) * BR;
    const int64_t off = bh * L * D;
    q += off, k += off, v += off, dout += off, dq += off, lse += bh * L, delta += bh * L;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    for (int x = threadIdx.x; x < BR * D; x += blockDim.x) {
        int64_t i = q0 + x / D;
        qs[x] = i < L ? to_acc(q[i * D + x % D]) * scale : A(0);
        gs[x] = i < L ? to_acc(dout[i * D + x % D]) : A(0);
    }
    A gq[RPW][MAXV], lrow[RPW], erow[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int64_t i = q0 + warp * RPW + r;
        lrow[r] = i < L ? lse[i] : A(0);
        erow[r] = i < L ? delta[i] : A(0);
#pragma unroll
        for (int t = 0; t < MAXV; t++) gq[r][t] = 0;
    }
    const int64_t kend = min(L, q0 + BR);
    for (int64_t k0 = 0; k0 < kend; k0 += BC) {
        __syncthreads();
        for (int x = threadIdx.x; x < BC * D; x += blockDim.x) {
            int c = x / D, d = x % D;
            int64_t j = k0 + c;
            ks[c * (D + 1) + d] = j < L ? to_acc(k[j * D + d]) : A(0);
            vs[c * (D + 1) + d] = j < L ? to_acc(v[j * D + d]) : A(0);
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int row = warp * RPW + r;
            const int64_t i = q0 + row;
            if (i >= L || k0 > i) continue;
            const int n = (int)min((int64_t)BC, i - k0 + 1);
            A ds = 0;
            if (lane < n) {
                A p = ex(dot(qs + row * D, ks + lane * (D + 1), D) - lrow[r]);
                ds = p * (dot(gs + row * D, vs + lane * (D + 1), D) - erow[r]);
            }
            for (int c = 0; c < n; c++) {
                const A dc = __shfl_sync(FULL, ds, c);
#pragma unroll
                for (int t = 0; t < MAXV; t++)
                    if (lane + 32 * t < D) gq[r][t] += dc * ks[c * (D + 1) + lane + 32 * t];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int64_t i = q0 + warp * RPW + r;
        if (i >= L) continue;
#pragma unroll
        for (int t = 0; t < MAXV; t++)
            if (lane + 32 * t < D) put(dq + i * D + lane + 32 * t, gq[r][t] * scale);
    }
}

// lets kernel f take `bytes` of dynamic shared memory (beyond the default 48 KiB)
template <typename F> em_status allow_smem(F f, size_t bytes)
{
    if (bytes <= 48 * 1024) return EM_OK;
    return cu_check(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                    "attention");
}

template <typename T>
em_status forward(int dev, int64_t BH, int64_t L, int D, double scale, const void *q, const void *k,
                  const void *v, void *o, void *lse)
{
    using A = typename acc_of<T>::type;
    constexpr int BC = tile_rows<A>();
    const int64_t nqb = (L + BR - 1) / BR;
    const size_t smem = sizeof(A) * (size_t)(BR * D + BC * (D + 1) + BC * D);
    em_status s = allow_smem(attn_forward<T, A>, smem);
    if (s) return s;
    EM_LAUNCH((attn_forward<T, A>), (unsigned)(BH * nqb), WARPS * 32, smem, stream(dev))(
        (const T *)q, (const T *)k, (const T *)v, (T *)o, (A *)lse, L, D, (A)scale, nqb);
    return cu_launched("attention");
}

template <typename T>
em_status backward(int dev, int64_t BH, int64_t L, int D, double scale, const void *q, const void *k,
                   const void *v, const void *o, const void *dout, const void *lse, void *dq, void *dk,
                   void *dv)
{
    using A = typename acc_of<T>::type;
    constexpr int BC = tile_rows<A>();
    const int64_t nb = (L + BR - 1) / BR, rows = BH * L;
    A *delta = (A *)cu_alloc(dev, sizeof(A) * (size_t)rows);
    if (!delta) return EM_ERR_OOM; /* cu_alloc set the message */
    EM_LAUNCH((attn_delta<T, A>), (unsigned)((rows + THREADS / 32 - 1) / (THREADS / 32)), THREADS, 0, stream(dev))(
        (const T *)o, (const T *)dout, delta, rows, D);
    em_status s = cu_launched("attention backward");
    const size_t smem_kv = sizeof(A) * (size_t)(2 * BR * D + 2 * BC * (D + 1) + 2 * BC);
    if (!s) s = allow_smem(attn_backward_kv<T, A>, smem_kv);
    if (!s) {
        EM_LAUNCH((attn_backward_kv<T, A>), (unsigned)(BH * nb), WARPS * 32, smem_kv, stream(dev))(
            (const T *)q, (const T *)k, (const T *)v, (const T *)dout, (const A *)lse, delta, (T *)dk,
            (T *)dv, L, D, (A)scale, nb);
        s = cu_launched("attention backward");
    }
    const size_t smem_q = sizeof(A) * (size_t)(2 * BR * D + 2 * BC * (D + 1));
    if (!s) s = allow_smem(attn_backward_q<T, A>, smem_q);
    if (!s) {
        EM_LAUNCH((attn_backward_q<T, A>), (unsigned)(BH * nb), WARPS * 32, smem_q, stream(dev))(
            (const T *)q, (const T *)k, (const T *)v, (const T *)dout, (const A *)lse, delta, (T *)dq, L, D,
            (A)scale, nb);
        s = cu_launched("attention backward");
    }
    cu_free(dev, delta); /* stream order: reused only by work queued after these kernels */
    return s;
}

// EM_OK when the sizes suit the kernels, else an error naming what is wrong
em_status check_sizes(const char *op, em_dtype dt, int64_t BH, int64_t L, int64_t D)
{
    if (dt != EM_F32 && dt != EM_F64 && dt != EM_F16 && dt != EM_BF16)
        return em_err(EM_ERR_DTYPE, "%s: no CUDA kernel for %s (f32, f64, f16, bf16)", op, em_dtype_name(dt));
    if (D > CU_ATTENTION_MAX_D)
        return em_err(EM_ERR_UNSUPPORTED, "%s: head dim %lld is beyond the CUDA kernel's %d", op,
                      (long long)D, (int)CU_ATTENTION_MAX_D);
    if (BH * ((L + BR - 1) / BR) > INT_MAX || BH * L > (int64_t)INT_MAX * (THREADS / 32))
        return em_err(EM_ERR_UNSUPPORTED, "%s: %lld heads of %lld rows are beyond the CUDA grid", op,
                      (long long)BH, (long long)L);
    return EM_OK;
}

} // namespace

extern "C" em_status cu_attention_forward(int dev, em_dtype dt, int64_t BH, int64_t T, int64_t D,
                                          double scale, const void *q, const void *k, const void *v, void *o,
                                          void *lse)
{
    em_status s = cu_use(dev, "attention");
    if (!s) s = check_sizes("attention", dt, BH, T, D);
    if (s || BH == 0 || T == 0 || D == 0) return s;
    switch (dt) {
    case EM_F32: return forward<float>(dev, BH, T, (int)D, scale, q, k, v, o, lse);
    case EM_F64: return forward<double>(dev, BH, T, (int)D, scale, q, k, v, o, lse);
    case EM_F16: return forward<f16>(dev, BH, T, (int)D, scale, q, k, v, o, lse);
    case EM_BF16: return forward<bf16>(dev, BH, T, (int)D, scale, q, k, v, o, lse);
    case EM_I32:
    case EM_U8:
    case EM_BOOL:
    case EM_NUM_DTYPES: break; // refused by check_sizes
    }
    return em_err(EM_ERR_DTYPE, "attention: no CUDA kernel for %s", em_dtype_name(dt));
}

extern "C" em_status cu_attention_backward(int dev, em_dtype dt, int64_t BH, int64_t T, int64_t D,
                                           double scale, const void *q, const void *k, const void *v,
                                           const void *o, const void *dout, const void *lse, void *dq,
                                           void *dk, void *dv)
{
    em_status s = cu_use(dev, "attention backward");
    if (!s) s = check_sizes("attention backward", dt, BH, T, D);
    if (s || BH == 0 || T == 0 || D == 0) return s;
    switch (dt) {
    case EM_F32: return backward<float>(dev, BH, T, (int)D, scale, q, k, v, o, dout, lse, dq, dk, dv);
    case EM_F64: return backward<double>(dev, BH, T, (int)D, scale, q, k, v, o, dout, lse, dq, dk, dv);
    case EM_F16: return backward<f16>(dev, BH, T, (int)D, scale, q, k, v, o, dout, lse, dq, dk, dv);
    case EM_BF16: return backward<bf16>(dev, BH, T, (int)D, scale, q, k, v, o, dout, lse, dq, dk, dv);
    case EM_I32:
    case EM_U8:
    case EM_BOOL:
    case EM_NUM_DTYPES: break; // refused by check_sizes
    }
    return em_err(EM_ERR_DTYPE, "attention backward: no CUDA kernel for %s", em_dtype_name(dt));
}
