// ops_nn.cu — CUDA kernels of the neural-network ops: softmax / log_softmax,
// cross-entropy, layer_norm / rms_norm, index gather / index-add (embedding,
// index_select), scatter_add and its gather along a dim, and dropout, forward
// and backward. Contracts in cuda_nn.h;
// conventions in cuda_impl.h.
//
// Row ops run one block of up to ROW_THREADS per row (a grid-stride loop over rows
// covers any count): the threads stride along the row and meet in a block
// reduction. f16/bf16 are computed in f32 (T = float), f64 in f64; every
// reduction has a fixed shape, so results do not vary from run to run —
// except the index-add, which uses atomics (see there).
#include "cuda_common.cuh"
#include "ce_math.h"
#include "cuda_nn.h"
#include "dropout_math.h"

using namespace em_cu;

namespace
{

constexpr int ROW_THREADS = 256; // a multiple of 32, at most 32 warps

__device__ __forceinline__ float ex(float v) { return expf(v); }
__device__ __forceinline__ double ex(double v) { return exp(v); }
__device__ __forceinline__ float lg(float v) { return logf(v); }
__device__ __forceinline__ double lg(double v) { return log(v); }
__device__ __forceinline__ float rsq(float v) { return 1.0f / sqrtf(v); }
__device__ __forceinline__ double rsq(double v) { return 1.0 / sqrt(v); }

template <typename T> __device__ __forceinline__ T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ __forceinline__ T warp_max(T v)
{
    for (int o = 16; o > 0; o >>= 1) {
        T u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

// The sum (MAX: the max) of every thread's v over the block, returned to
// every thread. sh: 32 T of shared memory, free to reuse after the call.
// Every thread of the block must call it (it synchronises).
template <typename T, bool MAX> __device__ T block_reduce(T v, T *sh)
{
    v = MAX ? warp_max(v) : warp_sum(v);
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); // the previous call's readers are done with sh
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : (MAX ? (T)-INFINITY : (T)0);
    return MAX ? warp_max(v) : warp_sum(v);
}

unsigned row_grid(int64_t rows) { return (unsigned)(rows < (1 << 20) ? rows : (1 << 20)); }

// threads per row block: n rounded up to a power of two, 32..ROW_THREADS, so
// a short row (a small model's width) keeps no idle warps at the reductions
unsigned row_threads(int64_t n)
{
    unsigned t = 32;
    while (t < (unsigned)ROW_THREADS && (int64_t)t < n) t *= 2;
    return t;
}

#define ROWS_LOOP for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
#define COLS_LOOP(n) for (int64_t j = threadIdx.x; j < (n); j += blockDim.x)
#define GRID_LOOP(i, n)                                                                                      \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);                                \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- softmax ---------------------------------------------------------------------- */

// softmax: y = exp(x - max) / sum exp(x - max);  log: y = x - max - log(sum)
template <typename T>
__global__ void softmax_fwd_k(em_dtype dt, const void *x, void *y, int64_t rows, int64_t n, bool log)
{
    __shared__ T sh[32];
    ROWS_LOOP
    {
        int64_t o = r * n;
        T m = (T)-INFINITY;
        COLS_LOOP(n)
        {
            T v = (T)load(dt, x, o + j);
            m = v > m ? v : m;
        }
        m = block_reduce<T, true>(m, sh);
        T s = 0;
        COLS_LOOP(n) s += ex((T)load(dt, x, o + j) - m);
        s = block_reduce<T, false>(s, sh);
        T ls = lg(s), inv = (T)1 / s;
        COLS_LOOP(n)
        {
            T v = (T)load(dt, x, o + j) - m;
            store(dt, y, o + j, (double)(log ? v - ls : ex(v) * inv));
        }
    }
}

// softmax: dx = y * (g - sum(g*y));  log_softmax: dx = g - exp(y) * sum(g)
template <typename T>
__global__ void softmax_bwd_k(em_dtype dt, const void *y, const void *g, void *dx, int64_t rows, int64_t n,
                              bool log)
{
    __shared__ T sh[32];
    ROWS_LOOP
    {
        int64_t o = r * n;
        T s = 0;
        COLS_LOOP(n)
        {
            T gv = (T)load(dt, g, o + j);
            s += log ? gv : gv * (T)load(dt, y, o + j);
        }
        s = block_reduce<T, false>(s, sh);
        COLS_LOOP(n)
        {
            T gv = (T)load(dt, g, o + j), yv = (T)load(dt, y, o + j);
            store(dt, dx, o + j, (double)(log ? gv - ex(yv) * s : yv * (gv - s)));
        }
    }
}

/* ---- cross-entropy (the per-row maths: ce_math.h) -------------------------------- */

// per row: max, lse = max + log sum exp(x - max), the loss and the gradient's s
template <typename T>
__global__ void ce_fwd_k(em_dtype dt, const void *x, const int32_t *tgt, int64_t rows, int64_t C,
                         int64_t ignore, em_dtype wdt, const void *w, double eps, em_reduction red,
                         double *stats, void *out)
{
    __shared__ T sh[32];
    __shared__ double shd[32];
    ROWS_LOOP
    {
        int64_t t = tgt[r], o = r * C;
        if (t == ignore) { // the whole block takes this branch
            if (threadIdx.x == 0) {
                stats[r] = stats[rows + r] = stats[2 * rows + r] = stats[3 * rows + r] = 0;
                if (red == EM_REDUCTION_NONE) store(dt, out, r, 0.0);
            }
            continue;
        }
        T m = (T)-INFINITY;
        COLS_LOOP(C)
        {
            T v = (T)load(dt, x, o + j);
            m = v > m ? v : m;
        }
        m = block_reduce<T, true>(m, sh);
        T s = 0;
        COLS_LOOP(C) s += ex((T)load(dt, x, o + j) - m);
        s = block_reduce<T, false>(s, sh);
        double lse = (double)m + log((double)s), wt = w ? load(wdt, w, t) : 1, S = 0, W = (double)C;
        if (eps > 0) { // S = sum_j w_j (lse - x_j), W = sum_j w_j
            double sp = 0, wp = 0;
            COLS_LOOP(C)
            {
                double wj = w ? load(wdt, w, j) : 1;
                sp += wj * (lse - load(dt, x, o + j));
                wp += wj;
            }
            S = block_reduce<double, false>(sp, shd);
            if (w) W = block_reduce<double, false>(wp, shd);
        }
        if (threadIdx.x == 0) {
            double loss = ce_row_loss(eps, (double)C, wt, lse - load(dt, x, o + t), S);
            stats[r] = (double)m;
            stats[rows + r] = lse;
            stats[2 * rows + r] = loss;
            stats[3 * rows + r] = ce_row_scale(eps, (double)C, wt, W);
            if (red == EM_REDUCTION_NONE) store(dt, out, r, loss);
        }
    }
}

// one block: the mean's denominator (the sum of w_t over the rows not
// ignored) and, unless the reduction is none, the loss, summed in a fixed
// order
__global__ void ce_total_k(em_dtype dt, const int32_t *tgt, int64_t rows, int64_t ignore, em_dtype wdt,
                           const void *w, em_reduction red, double *stats, void *out)
{
    __shared__ double sh[32];
    double loss = 0, den = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
        if (tgt[r] != ignore) {
            loss += stats[2 * rows + r];
            den += w ? load(wdt, w, tgt[r]) : 1;
        }
    loss = block_reduce<double, false>(loss, sh);
    den = block_reduce<double, false>(den, sh);
    if (threadIdx.x == 0) {
        stats[4 * rows] = den;
        // the mean: NaN when every target is ignored, as on the CPU
        if (red != EM_REDUCTION_NONE) store(dt, out, 0, red == EM_REDUCTION_MEAN ? loss / den : loss);
    }
}

// dx = a (s exp(x - max) exp(max - lse) - q_j): exp(x - lse) in two factors
// so that a large lse costs no bits in f32
template <typename T>
__global__ void ce_bwd_k(em_dtype dt, const void *x, const int32_t *tgt, int64_t rows, int64_t C,
                         int64_t ignore, em_dtype wdt, const void *w, double eps, em_reduction red,
                         const double *stats, em_dtype gdt, const void *g, void *dx)
{
    double g0 = red == EM_REDUCTION_NONE ? 0 : load(gdt, g, 0);
    double scale = red == EM_REDUCTION_MEAN ? g0 / stats[4 * rows] : g0;
    ROWS_LOOP
    {
        int64_t t = tgt[r], o = r * C;
        if (t == ignore) {
            COLS_LOOP(C) store(dt, dx, o + j, 0.0);
            continue;
        }
        double a = red == EM_REDUCTION_NONE ? load(gdt, g, r) : scale, wt = w ? load(wdt, w, t) : 1;
        T m = (T)stats[r], f = (T)(exp(stats[r] - stats[rows + r]) * a * stats[3 * rows + r]);
        COLS_LOOP(C)
        {
            T v = ex((T)load(dt, x, o + j) - m) * f;
            double q = ce_row_q(eps, (double)C, w ? load(wdt, w, j) : 1, wt, j == t);
            if (q != 0) v -= (T)(a * q);
            store(dt, dx, o + j, (double)v);
        }
    }
}

/* ---- layer_norm / rms_norm -------------------------------------------------------- */

// layer_norm: y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps) (two passes:
// the mean, then the centred squares); rms_norm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps)
template <typename T>
__global__ void norm_fwd_k(em_dtype dt, bool rms, const void *x, const void *w, const void *b, void *y,
                           T *stats, int64_t rows, int64_t C, double eps)
{
    __shared__ T sh[32];
    ROWS_LOOP
    {
        int64_t o = r * C;
        T mean = 0;
        if (!rms) {
            T s = 0;
            COLS_LOOP(C) s += (T)load(dt, x, o + j);
            mean = block_reduce<T, false>(s, sh) / (T)C;
        }
        T q = 0;
        COLS_LOOP(C)
        {
            T d = (T)load(dt, x, o + j) - mean;
            q += d * d;
        }
        T var = block_reduce<T, false>(q, sh) / (T)C;
        T rstd = rsq(var + (T)eps);
        if (threadIdx.x == 0) {
            stats[r] = mean;
            stats[rows + r] = rstd;
        }
        COLS_LOOP(C)
        {
            T v = ((T)load(dt, x, o + j) - mean) * rstd;
            if (w) v *= (T)load(dt, w, j);
            if (b) v += (T)load(dt, b, j);
            store(dt, y, o + j, (double)v);
        }
    }
}

// With xh = (x - mean)*rstd and gw = g*w:
// layer_norm: dx = rstd * (gw - mean(gw) - xh * mean(gw*xh)); rms_norm: dx = rstd * (gw - xh * mean(gw*xh))
template <typename T>
__global__ void norm_dx_k(em_dtype dt, bool rms, const void *x, const void *w, const void *g, const T *stats,
                          void *dx, int64_t rows, int64_t C)
{
    __shared__ T sh[32];
    ROWS_LOOP
    {
        int64_t o = r * C;
        T mean = stats[r], rstd = stats[rows + r], sg = 0, sgx = 0;
        COLS_LOOP(C)
        {
            T xh = ((T)load(dt, x, o + j) - mean) * rstd, gw = (T)load(dt, g, o + j);
            if (w) gw *= (T)load(dt, w, j);
            sg += gw;
            sgx += gw * xh;
        }
        sg = block_reduce<T, false>(sg, sh);
        sgx = block_reduce<T, false>(sgx, sh);
        T a = rms ? (T)0 : sg / (T)C, bb = sgx / (T)C;
        COLS_LOOP(C)
        {
            T xh = ((T)load(dt, x, o + j) - mean) * rstd, gw = (T)load(dt, g, o + j);
            if (w) gw *= (T)load(dt, w, j);
            store(dt, dx, o + j, (double)(rstd * (gw - a - xh * bb)));
        }
    }
}

// Chunk c = blockIdx.y of the rows, column j per thread: part[c, j] = sum g*xh
// (dw) and part[nchunks + c, j] = sum g (db) over the chunk's rows, in row order.
template <typename T>
__global__ void norm_part_k(em_dtype dt, const void *x, const void *g, const T *stats, T *part, bool want_w,
                            bool want_b, int64_t rows, int64_t C, int64_t nchunks)
{
    int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, c = blockIdx.y;
    if (j >= C) return;
    int64_t r0 = rows * c / nchunks, r1 = rows * (c + 1) / nchunks;
    T sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; r++) {
        T gv = (T)load(dt, g, r * C + j);
        sw += gv * (((T)load(dt, x, r * C + j) - stats[r]) * stats[rows + r]);
        sb += gv;
    }
    if (want_w) part[c * C + j] = sw;
    if (want_b) part[(nchunks + c) * C + j] = sb;
}

// out[j] = sum over the chunks of part[c, j], in chunk order
template <typename T>
__global__ void norm_sum_k(em_dtype dt, const T *part, int64_t nchunks, int64_t C, void *out)
{
    GRID_LOOP(j, C)
    {
        T s = 0;
        for (int64_t c = 0; c < nchunks; c++) s += part[c * C + j];
        store(dt, out, j, (double)s);
    }
}

/* ---- index gather / add ------------------------------------------------------------ */

// out[o,k,i] = t[o,idx[k],i], element i of out's (outer, K, inner) flat
template <typename E>
__global__ void gather_k(const E *t, const int32_t *idx, E *out, int64_t outer, int64_t S, int64_t K,
                         int64_t inner)
{
    GRID_LOOP(i, outer * K * inner)
    {
        int64_t in = i % inner, rest = i / inner, k = rest % K, o = rest / K;
        out[i] = t[(o * S + idx[k]) * inner + in];
    }
}

// acc[o,idx[k],i] += g[o,k,i]. Repeated indices meet in atomicAdd, whose order
// varies from run to run: this sum is NOT deterministic in its last bits.
template <typename A>
__global__ void index_add_k(A *acc, em_dtype gdt, const void *g, const int32_t *idx, int64_t outer, int64_t S,
                            int64_t K, int64_t inner)
{
    GRID_LOOP(i, outer * K * inner)
    {
        int64_t in = i % inner, rest = i / inner, k = rest % K, o = rest / K;
        atomicAdd(&acc[(o * S + idx[k]) * inner + in], (A)load(gdt, g, i));
    }
}

/* ---- scatter_add / gather along a dim ------------------------------------------------
 * w walks the positions of index with dim d removed: operand 0 out, 1 index,
 * 2 src (cuda_nn.h). */

// One thread per walk position r, serially along d: out[.., index[r,j], ..]
// += src[r,j] for j = 0..L-1. Different r differ in some dim other than d,
// so they never write the same element: no atomics, and each element's
// additions come in the CPU's order (j ascending), in the CPU's arithmetic.
__global__ void scatter_add_k(cu_walk w, int64_t R, int64_t L, int64_t osd, int64_t isd, int64_t ssd,
                              em_dtype dt, void *out, const int32_t *index, const void *src)
{
    GRID_LOOP(r, R)
    {
        int64_t off[3];
        walk_offsets<3>(w, r, off);
        for (int64_t j = 0; j < L; j++) {
            int64_t oo = off[0] + index[off[1] + j * isd] * osd, so = off[2] + j * ssd;
            if (dt == EM_F32)
                ((float *)out)[oo] += ((const float *)src)[so];
            else if (dt == EM_F64)
                ((double *)out)[oo] += ((const double *)src)[so];
            else
                store(dt, out, oo, load(dt, out, oo) + load(dt, src, so));
        }
    }
}

// out[r,j] = src[.., index[r,j], ..]: one thread per element of out, an
// exact copy of E-sized elements.
template <typename E>
__global__ void gather_dim_k(cu_walk w, int64_t R, int64_t L, int64_t osd, int64_t isd, int64_t ssd, E *out,
                             const int32_t *index, const E *src)
{
    GRID_LOOP(i, R * L)
    {
        int64_t r = i / L, j = i % L, off[3];
        walk_offsets<3>(w, r, off);
        out[off[0] + j * osd] = src[off[2] + index[off[1] + j * isd] * ssd];
    }
}

/* ---- dropout ------------------------------------------------------------------------ */

// one thread per counter (4 elements); the mask rule and each dtype's
// arithmetic are the CPU's (dropout_math.h), so masks and kept values are
// bit-identical
__global__ void dropout_fwd_k(em_dtype dt, const void *x, void *out, uint8_t *mask, int64_t n, uint64_t seed,
                              uint64_t offset, double p, double scale)
{
    GRID_LOOP(blk, (n + 3) / 4)
    {
        uint32_t w[4];
        philox4x32_10(seed, 0, offset + (uint64_t)blk, w);
        for (int k = 0; k < 4; k++) {
            int64_t i = blk * 4 + k;
            if (i >= n) break;
            bool keep = dropout_keeps(w[k], p);
            if (mask) mask[i] = keep;
            dropout_forward_elem(dt, x, i, out, i, keep, scale);
        }
    }
}

__global__ void dropout_bwd_k(em_dtype dt, const void *g, const uint8_t *mask, void *dx, int64_t n,
                              double scale)
{
    GRID_LOOP(i, n) dropout_backward_elem(dt, g, i, dx, i, mask[i], scale);
}

} // namespace

/* ---- entry points --------------------------------------------------------------------- */

extern "C" em_status cu_softmax_fwd(int dev, em_dtype dt, const void *x, void *y, int64_t rows, int64_t n,
                                    bool log)
{
    const char *op = log ? "log_softmax" : "softmax";
    em_status s = cu_use(dev, op);
    if (s || rows == 0) return s;
    if (dt == EM_F64)
        EM_LAUNCH(softmax_fwd_k<double>, row_grid(rows), row_threads(n), 0, stream(dev))(dt, x, y, rows, n, log);
    else
        EM_LAUNCH(softmax_fwd_k<float>, row_grid(rows), row_threads(n), 0, stream(dev))(dt, x, y, rows, n, log);
    return cu_launched(op);
}

extern "C" em_status cu_softmax_bwd(int dev, em_dtype dt, const void *y, const void *g, void *dx,
                                    int64_t rows, int64_t n, bool log)
{
    const char *op = log ? "log_softmax backward" : "softmax backward";
    em_status s = cu_use(dev, op);
    if (s || rows == 0) return s;
    if (dt == EM_F64)
        EM_LAUNCH(softmax_bwd_k<double>, row_grid(rows), row_threads(n), 0, stream(dev))(dt, y, g, dx, rows, n, log);
    else
        EM_LAUNCH(softmax_bwd_k<float>, row_grid(rows), row_threads(n), 0, stream(dev))(dt, y, g, dx, rows, n, log);
    return cu_launched(op);
}

extern "C" em_status cu_cross_entropy_fwd(int dev, em_dtype dt, const void *x, const int32_t *tgt,
                                          int64_t rows, int64_t C, int64_t ignore, em_dtype wdt, const void *w,
                                          double eps, em_reduction red, double *stats, void *out)
{
    const char *op = "cross_entropy";
    em_status s = cu_use(dev, op);
    if (s) return s;
    if (rows > 0) {
        if (dt == EM_F64)
            EM_LAUNCH(ce_fwd_k<double>, row_grid(rows), row_threads(C), 0, stream(dev))(dt, x, tgt, rows, C, ignore, wdt, w, eps, red, stats, out);
        else
            EM_LAUNCH(ce_fwd_k<float>, row_grid(rows), row_threads(C), 0, stream(dev))(dt, x, tgt, rows, C, ignore, wdt, w, eps, red, stats, out);
        if ((s = cu_launched(op))) return s;
    }
    EM_LAUNCH(ce_total_k, 1, ROW_THREADS, 0, stream(dev))(dt, tgt, rows, ignore, wdt, w, red, stats, out);
    return cu_launched(op);
}

extern "C" em_status cu_cross_entropy_bwd(int dev, em_dtype dt, const void *x, const int32_t *tgt,
                                          int64_t rows, int64_t C, int64_t ignore, em_dtype wdt, const void *w,
                                          double eps, em_reduction red, const double *stats, em_dtype gdt,
                                          const void *g, void *dx)
{
    const char *op = "cross_entropy backward";
    em_status s = cu_use(dev, op);
    if (s || rows == 0) return s;
    if (dt == EM_F64)
        EM_LAUNCH(ce_bwd_k<double>, row_grid(rows), row_threads(C), 0, stream(dev))(dt, x, tgt, rows, C, ignore, wdt, w, eps, red, stats, gdt, g, dx);
    else
        EM_LAUNCH(ce_bwd_k<float>, row_grid(rows), row_threads(C), 0, stream(dev))(dt, x, tgt, rows, C, ignore, wdt, w, eps, red, stats, gdt, g, dx);
    return cu_launched(op);
}

extern "C" em_status cu_norm_fwd(int dev, em_dtype dt, bool rms, const void *x, const void *w, const void *b,
                                 void *y, void *stats, int64_t rows, int64_t C, double eps)
{
    const char *op = rms ? "rms_norm" : "layer_norm";
    em_status s = cu_use(dev, op);
    if (s || rows == 0) return s;
    if (dt == EM_F64)
        EM_LAUNCH(norm_fwd_k<double>, row_grid(rows), row_threads(C), 0, stream(dev))(dt, rms, x, w, b, y,
                                                                            (double *)stats, rows, C, eps);
    else
        EM_LAUNCH(norm_fwd_k<float>, row_grid(rows), row_threads(C), 0, stream(dev))(dt, rms, x, w, b, y,
                                                                           (float *)stats, rows, C, eps);
    return cu_launched(op);
}

extern "C" int64_t cu_norm_chunks(int64_t rows)
{
    int64_t k = (rows + 31) / 32; // about 32 rows a chunk, at most 1024 chunks (gridDim.y)
    return k < 1 ? 1 : k > 1024 ? 1024 : k;
}

template <typename T>
static void norm_bwd_launch(int dev, em_dtype dt, bool rms, const void *x, const void *w, const void *g,
                            const void *stats, void *dx, void *dw, void *db, void *part, int64_t rows,
                            int64_t C)
{
    const T *st = (const T *)stats;
    T *pt = (T *)part;
    cudaStream_t sm = stream(dev);
    if (dx) EM_LAUNCH(norm_dx_k<T>, row_grid(rows), row_threads(C), 0, sm)(dt, rms, x, w, g, st, dx, rows, C);
    if (!dw && !db) return;
    int64_t nch = cu_norm_chunks(rows);
    dim3 grid((unsigned)((C + THREADS - 1) / THREADS), (unsigned)nch);
    EM_LAUNCH(norm_part_k<T>, grid, THREADS, 0, sm)(dt, x, g, st, pt, dw != NULL, db != NULL, rows, C, nch);
    if (dw) EM_LAUNCH(norm_sum_k<T>, blocks_for(C), THREADS, 0, sm)(dt, pt, nch, C, dw);
    if (db) EM_LAUNCH(norm_sum_k<T>, blocks_for(C), THREADS, 0, sm)(dt, pt + nch * C, nch, C, db);
}

extern "C" em_status cu_norm_bwd(int dev, em_dtype dt, bool rms, const void *x, const void *w, const void *g,
                                 const void *stats, void *dx, void *dw, void *db, void *part, int64_t rows,
                                 int64_t C)
{
    const char *op = rms ? "rms_norm backward" : "layer_norm backward";
    em_status s = cu_use(dev, op);
    if (s || rows == 0 || C == 0) return s;
    if (dt == EM_F64)
        norm_bwd_launch<double>(dev, dt, rms, x, w, g, stats, dx, dw, db, part, rows, C);
    else
        norm_bwd_launch<float>(dev, dt, rms, x, w, g, stats, dx, dw, db, part, rows, C);
    return cu_launched(op);
}

extern "C" em_status cu_index_gather(int dev, size_t esize, const void *t, const int32_t *idx, void *out,
                                     int64_t outer, int64_t S, int64_t K, int64_t inner)
{
    const char *op = "index gather";
    em_status s = cu_use(dev, op);
    int64_t n = outer * K * inner;
    if (s || n == 0) return s;
    unsigned nb = blocks_for(n);
    cudaStream_t sm = stream(dev);
    switch (esize) {
    case 1:
        EM_LAUNCH(gather_k<uint8_t>, nb, THREADS, 0, sm)((const uint8_t *)t, idx, (uint8_t *)out, outer, S, K, inner);
        break;
    case 2:
        EM_LAUNCH(gather_k<uint16_t>, nb, THREADS, 0, sm)((const uint16_t *)t, idx, (uint16_t *)out, outer, S, K, inner);
        break;
    case 4:
        EM_LAUNCH(gather_k<uint32_t>, nb, THREADS, 0, sm)((const uint32_t *)t, idx, (uint32_t *)out, outer, S, K, inner);
        break;
    default:
        EM_LAUNCH(gather_k<uint64_t>, nb, THREADS, 0, sm)((const uint64_t *)t, idx, (uint64_t *)out, outer, S, K, inner);
    }
    return cu_launched(op);
}

extern "C" em_status cu_index_add(int dev, em_dtype act, void *acc, em_dtype gdt, const void *g,
                                  const int32_t *idx, int64_t outer, int64_t S, int64_t K, int64_t inner)
{
    const char *op = "index add";
    em_status s = cu_use(dev, op);
    int64_t n = outer * K * inner;
    if (s || n == 0) return s;
    if (act == EM_F64)
        EM_LAUNCH(index_add_k<double>, blocks_for(n), THREADS, 0, stream(dev))((double *)acc, gdt, g, idx, outer, S, K, inner);
    else
        EM_LAUNCH(index_add_k<float>, blocks_for(n), THREADS, 0, stream(dev))((float *)acc, gdt, g, idx, outer, S, K, inner);
    return cu_launched(op);
}

extern "C" em_status cu_scatter_add(int dev, em_dtype dt, const cu_walk *w, int64_t L, int64_t osd,
                                    int64_t isd, int64_t ssd, void *out, const int32_t *index, const void *src)
{
    const char *op = "scatter_add";
    em_status s = cu_use(dev, op);
    int64_t R = walk_numel(*w);
    if (s || R * L == 0) return s;
    EM_LAUNCH(scatter_add_k, blocks_for(R), THREADS, 0, stream(dev))(*w, R, L, osd, isd, ssd, dt, out, index, src);
    return cu_launched(op);
}

extern "C" em_status cu_gather_dim(int dev, size_t esize, const cu_walk *w, int64_t L, int64_t osd, int64_t isd,
                                   int64_t ssd, void *out, const int32_t *index, const void *src)
{
    const char *op = "gather";
    em_status s = cu_use(dev, op);
    int64_t R = walk_numel(*w), n = R * L;
    if (s || n == 0) return s;
    unsigned nb = blocks_for(n);
    cudaStream_t sm = stream(dev);
    switch (esize) {
    case 1:
        EM_LAUNCH(gather_dim_k<uint8_t>, nb, THREADS, 0, sm)(*w, R, L, osd, isd, ssd, (uint8_t *)out, index,
                                                            (const uint8_t *)src);
        break;
    case 2:
        EM_LAUNCH(gather_dim_k<uint16_t>, nb, THREADS, 0, sm)(*w, R, L, osd, isd, ssd, (uint16_t *)out, index,
                                                             (const uint16_t *)src);
        break;
    case 4:
        EM_LAUNCH(gather_dim_k<uint32_t>, nb, THREADS, 0, sm)(*w, R, L, osd, isd, ssd, (uint32_t *)out, index,
                                                             (const uint32_t *)src);
        break;
    default:
        EM_LAUNCH(gather_dim_k<uint64_t>, nb, THREADS, 0, sm)(*w, R, L, osd, isd, ssd, (uint64_t *)out, index,
                                                             (const uint64_t *)src);
    }
    return cu_launched(op);
}

extern "C" em_status cu_dropout_fwd(int dev, em_dtype dt, const void *x, void *out, uint8_t *mask, int64_t n,
                                    uint64_t seed, uint64_t offset, double p, double scale)
{
    em_status s = cu_use(dev, "dropout");
    if (s || n == 0) return s;
    EM_LAUNCH(dropout_fwd_k, blocks_for((n + 3) / 4), THREADS, 0, stream(dev))(dt, x, out, mask, n, seed, offset, p,
                                                                        scale);
    return cu_launched("dropout");
}

extern "C" em_status cu_dropout_bwd(int dev, em_dtype dt, const void *g, const uint8_t *mask, void *dx,
                                    int64_t n, double scale)
{
    em_status s = cu_use(dev, "dropout backward");
    if (s || n == 0) return s;
    EM_LAUNCH(dropout_bwd_k, blocks_for(n), THREADS, 0, stream(dev))(dt, g, mask, dx, n, scale);
    return cu_launched("dropout backward");
}
