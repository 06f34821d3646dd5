// ops_elementwise.cu — CUDA kernels of the elementwise, compare and reduction
// families: one strided kernel per family, driven by an op code (see
// tensor/cuda_elementwise.h for the contract, tensor/cuda_impl.h for the
// conventions). The op codes are the op list's (tensor/ops.h). The
// per-element maths is the CPU kernels' own, tensor/elementwise_formulas.h,
// in its exact flavours (_f32 with expf/tanhf/erfcf, _f64) where the CPU's
// floats use vectorisable approximations that tests/test_unary.c holds to
// them; the same precision per dtype and the same rounding on store as the
// CPU kernels in ops_binary.c, ops_unary.c, ops_compare.c and ops_reduce.c.
#include "cuda_common.cuh"
#include "cuda_elementwise.h"
#include "elementwise_math.h"

using namespace em_cu;

namespace
{

// ---- binary and compare ---------------------------------------------------------------

// out = a op b: f32 in float, every other dtype in double (as the CPU)
__global__ void binary_kernel(cu_walk w, int64_t n, binop op, em_dtype dt, void *out, const void *a,
                              const void *b)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3];
        walk_offsets<3>(w, i, off);
        double x = load(dt, a, off[1]), y = load(dt, b, off[2]);
        if (dt == EM_F32)
            ((float *)out)[off[0]] = ew_binary_f32(op, (float)x, (float)y);
        else
            store(dt, out, off[0], ew_binary_f64(op, x, y));
    }
}

// out = a op b as bool, compared in double (exact for every dtype)
__global__ void compare_kernel(cu_walk w, int64_t n, cmpop op, em_dtype dt, uint8_t *out, const void *a,
                               const void *b)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3];
        walk_offsets<3>(w, i, off);
        out[off[0]] = ew_compare(op, load(dt, a, off[1]), load(dt, b, off[2]));
    }
}

// ---- unary --------------------------------------------------------------------------

// out = f(x). Precision as the CPU: float for f32, f16 and bf16, double for
// f64 and integers (abs)
__global__ void unary_kernel(cu_walk w, int64_t n, unop op, em_dtype dt, void *out, const void *x, double p)
{
    bool flt = dt == EM_F32 || dt == EM_F16 || dt == EM_BF16;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        walk_offsets<2>(w, i, off);
        double v = load(dt, x, off[1]);
        v = flt ? (double)ew_unary_f32(op, (float)v, (float)p) : ew_unary_f64(op, v, p);
        store(dt, out, off[0], v);
    }
}

// out = x*m + s: float for f32 only (the CPU's f16/bf16 affine runs in double)
__global__ void affine_kernel(cu_walk w, int64_t n, em_dtype dt, void *out, const void *x, double m, double s)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[2];
        walk_offsets<2>(w, i, off);
        double v = load(dt, x, off[1]);
        v = dt == EM_F32 ? (double)ew_affine_f32((float)v, (float)m, (float)s) : ew_affine_f64(v, m, s);
        store(dt, out, off[0], v);
    }
}

// gx = g * f'(x, y); gx and y contiguous, so y's offset is gx's
__global__ void unary_bw_kernel(cu_walk w, int64_t n, unop op, em_dtype dt, void *gx, const void *x,
                                const void *y, em_dtype gdt, const void *g, double p)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3];
        walk_offsets<3>(w, i, off);
        double xv = load(dt, x, off[1]), yv = load(dt, y, off[0]), gv = load(gdt, g, off[2]);
        double d = dt == EM_F64 ? ew_unary_grad_f64(op, xv, yv, gv, p)
                                : (double)ew_unary_grad_f32(op, (float)xv, (float)yv, (float)gv, (float)p);
        store(dt, gx, off[0], d);
    }
}

// ---- select (where, masked_fill, their gradients) -----------------------------------------

// where (cond != 0) == keep: out = x (a bit copy of esize bytes), or fill
__global__ void select_kernel(cu_walk w, int64_t n, em_dtype dt, int esize, void *out, const uint8_t *cond,
                              const void *x, bool keep, double fill)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[3];
        walk_offsets<3>(w, i, off);
        if ((cond[off[1]] != 0) != keep) continue;
        if (!x)
            store(dt, out, off[0], fill);
        else if (esize == 8)
            ((uint64_t *)out)[off[0]] = ((const uint64_t *)x)[off[2]];
        else if (esize == 4)
            ((uint32_t *)out)[off[0]] = ((const uint32_t *)x)[off[2]];
        else if (esize == 2)
            ((uint16_t *)out)[off[0]] = ((const uint16_t *)x)[off[2]];
        else
            ((uint8_t *)out)[off[0]] = ((const uint8_t *)x)[off[2]];
    }
}

// ---- reductions ---------------------------------------------------------------------------

// Whether candidate (v at position j) beats the best so far (m at position
// at) in a max/min: the first NaN wins, else the larger (smaller) value,
// else on a tie the earlier position; position -1 is "nothing yet". The rule
// is associative, so the tree gives what the CPU's left-to-right scan gives.
__device__ __forceinline__ bool beats(redop op, double v, int64_t j, double m, int64_t at)
{
    if (j < 0) return false;
    if (at < 0) return true;
    bool vn = v != v, mn = m != m;
    if (vn || mn) return vn && mn ? j < at : vn;
    if (v == m) return j < at;
    return op == RED_MIN ? v < m : v > m;
}

// One block per output element (grid-stride over them): each thread walks
// positions threadIdx.x, +blockDim.x, ... of the reduction, then a tree in
// shared memory combines the threads. blockDim.x is a power of two; shared
// memory holds blockDim.x doubles then blockDim.x positions.
__global__ void reduce_kernel(cu_walk kw, cu_walk rw, int64_t kn, int64_t rn, redop op, em_dtype it,
                              const void *in, em_dtype ot, void *out, double scale)
{
    bool sum = false; // else the max/min rule of beats(), argmax writing the position
    switch (op) {     // no default: a new reduction is a compile error here until it has its case
    case RED_SUM:
    case RED_MEAN: sum = true; break;
    case RED_MAX:
    case RED_MIN:
    case RED_ARGMAX: break;
    }
    EM_DYNAMIC_SHARED(double, sh_v);
    int64_t *sh_at = (int64_t *)(sh_v + blockDim.x);
    unsigned t = threadIdx.x;
    for (int64_t k = blockIdx.x; k < kn; k += gridDim.x) {
        int64_t ko[2];
        walk_offsets<2>(kw, k, ko);
        double v = 0;
        int64_t at = -1;
        for (int64_t j = t; j < rn; j += blockDim.x) {
            int64_t ro[2];
            walk_offsets<2>(rw, j, ro);
            double x = load(it, in, ko[1] + ro[1]);
            if (sum) {
                v += x;
            } else if (beats(op, x, j, v, at)) {
                v = x;
                at = j;
            }
        }
        sh_v[t] = v;
        sh_at[t] = at;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (t < s) {
                if (sum) {
                    sh_v[t] += sh_v[t + s];
                } else if (beats(op, sh_v[t + s], sh_at[t + s], sh_v[t], sh_at[t])) {
                    sh_v[t] = sh_v[t + s];
                    sh_at[t] = sh_at[t + s];
                }
            }
            __syncthreads();
        }
        if (t == 0) {
            if (sum)
                store(ot, out, ko[0], sh_v[0] * scale);
            else if (op == RED_ARGMAX)
                ((int32_t *)out)[ko[0]] = (int32_t)sh_at[0];
            else
                store(ot, out, ko[0], sh_v[0]);
        }
        __syncthreads(); // shared memory is reused by the next output
    }
}

// Backward of max/min, one block per output element: count the ties with y
// (a tree as above), then give each tie g/count and every other element 0.
__global__ void extreme_bw_kernel(cu_walk kw, cu_walk rw, int64_t kn, int64_t rn, em_dtype xdt, const void *x,
                                  em_dtype ydt, const void *y, em_dtype gdt, const void *g, void *gx)
{
    EM_DYNAMIC_SHARED(double, sh_v);
    int64_t *sh_n = (int64_t *)(sh_v + blockDim.x);
    unsigned t = threadIdx.x;
    for (int64_t k = blockIdx.x; k < kn; k += gridDim.x) {
        int64_t ko[3];
        walk_offsets<3>(kw, k, ko);
        double yv = load(ydt, y, k);
        int64_t cnt = 0;
        for (int64_t j = t; j < rn; j += blockDim.x) {
            int64_t ro[3];
            walk_offsets<3>(rw, j, ro);
            cnt += load(xdt, x, ko[1] + ro[1]) == yv;
        }
        sh_n[t] = cnt;
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (t < s) sh_n[t] += sh_n[t + s];
            __syncthreads();
        }
        cnt = sh_n[0];
        double share = cnt ? load(gdt, g, ko[0]) / (double)cnt : 0.0;
        for (int64_t j = t; j < rn; j += blockDim.x) {
            int64_t ro[3];
            walk_offsets<3>(rw, j, ro);
            bool hit = load(xdt, x, ko[1] + ro[1]) == yv;
            store(xdt, gx, ko[2] + ro[2], hit ? share : 0.0);
        }
        __syncthreads(); // everyone has read sh_n[0] before the next output writes it
    }
}

// threads per block for a reduction of rn elements: a power of two, 32..256
unsigned red_threads(int64_t rn)
{
    unsigned t = 32;
    while (t < (unsigned)THREADS && (int64_t)t < rn) t *= 2;
    return t;
}

unsigned red_blocks(int64_t kn) { return (unsigned)(kn < (1 << 20) ? kn : (1 << 20)); }

} // namespace

extern "C" em_status cu_binary(int dev, binop op, const cu_walk *w, em_dtype dt, void *out, const void *a,
                               const void *b)
{
    em_status s = cu_use(dev, binop_name(op));
    if (s) return s;
    int64_t n = walk_numel(*w);
    if (n == 0) return EM_OK;
    EM_LAUNCH(binary_kernel, blocks_for(n), THREADS, 0, stream(dev))(*w, n, op, dt, out, a, b);
    return cu_launched(binop_name(op));
}

extern "C" em_status cu_compare(int dev, cmpop op, const cu_walk *w, em_dtype dt, void *out, const void *a,
                                const void *b)
{
    em_status s = cu_use(dev, cmpop_name(op));
    if (s) return s;
    int64_t n = walk_numel(*w);
    if (n == 0) return EM_OK;
    EM_LAUNCH(compare_kernel, blocks_for(n), THREADS, 0, stream(dev))(*w, n, op, dt, (uint8_t *)out, a, b);
    return cu_launched(cmpop_name(op));
}

extern "C" em_status cu_unary(int dev, unop op, const cu_walk *w, em_dtype dt, void *out, const void *x,
                              double p)
{
    em_status s = cu_use(dev, unop_name(op));
    if (s) return s;
    int64_t n = walk_numel(*w);
    if (n == 0) return EM_OK;
    EM_LAUNCH(unary_kernel, blocks_for(n), THREADS, 0, stream(dev))(*w, n, op, dt, out, x, p);
    return cu_launched(unop_name(op));
}

extern "C" em_status cu_affine(int dev, op_id op, const cu_walk *w, em_dtype dt, void *out, const void *x,
                               double m, double s)
{
    em_status rc = cu_use(dev, op_name(op));
    if (rc) return rc;
    int64_t n = walk_numel(*w);
    if (n == 0) return EM_OK;
    EM_LAUNCH(affine_kernel, blocks_for(n), THREADS, 0, stream(dev))(*w, n, dt, out, x, m, s);
    return cu_launched(op_name(op));
}

extern "C" em_status cu_unary_backward(int dev, unop op, const cu_walk *w, em_dtype dt, void *gx,
                                       const void *x, const void *y, em_dtype gdt, const void *g, double p)
{
    em_status s = cu_use(dev, unop_name(op));
    if (s) return s;
    int64_t n = walk_numel(*w);
    if (n == 0) return EM_OK;
    EM_LAUNCH(unary_bw_kernel, blocks_for(n), THREADS, 0, stream(dev))(*w, n, op, dt, gx, x, y, gdt, g, p);
    return cu_launched(unop_name(op));
}

extern "C" em_status cu_select(int dev, const cu_walk *w, em_dtype dt, void *out, const void *cond,
                               const void *x, bool keep, double fill)
{
    em_status s = cu_use(dev, "where");
    if (s) return s;
    int64_t n = walk_numel(*w);
    if (n == 0) return EM_OK;
    EM_LAUNCH(select_kernel, blocks_for(n), THREADS, 0, stream(dev))(*w, n, dt, (int)em_dtype_size(dt), out,
                                                              (const uint8_t *)cond, x, keep, fill);
    return cu_launched("where");
}

extern "C" em_status cu_reduce(int dev, redop op, const cu_walk *kw, const cu_walk *rw, em_dtype in_dt,
                               const void *in, em_dtype out_dt, void *out, double scale)
{
    em_status s = cu_use(dev, redop_name(op));
    if (s) return s;
    int64_t kn = walk_numel(*kw), rn = walk_numel(*rw);
    if (kn == 0) return EM_OK;
    unsigned nt = red_threads(rn);
    EM_LAUNCH(reduce_kernel, red_blocks(kn), nt, nt *(sizeof(double) + sizeof(int64_t)), stream(dev))(
        *kw, *rw, kn, rn, op, in_dt, in, out_dt, out, scale);
    return cu_launched(redop_name(op));
}

extern "C" em_status cu_extreme_backward(int dev, const cu_walk *kw, const cu_walk *rw, em_dtype xdt,
                                         const void *x, em_dtype ydt, const void *y, em_dtype gdt,
                                         const void *g, void *gx)
{
    em_status s = cu_use(dev, "max/min backward");
    if (s) return s;
    int64_t kn = walk_numel(*kw), rn = walk_numel(*rw);
    if (kn == 0) return EM_OK;
    unsigned nt = red_threads(rn);
    EM_LAUNCH(extreme_bw_kernel, red_blocks(kn), nt, nt *(sizeof(double) + sizeof(int64_t)), stream(dev))(
        *kw, *rw, kn, rn, xdt, x, ydt, y, gdt, g, gx);
    return cu_launched("max/min backward");
}
