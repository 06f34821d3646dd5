// cusim_device.h — what CUDA device code needs to compile with the host C++
// compiler and run on the CPU under ember's emulator (meson -Dcuda=sim):
// the function qualifiers, dim3 and the built-in indices, barriers, warp
// operations, atomics, the intrinsics ember's kernels use, and the launch.
// Included by cuda_runtime.h from C++; the calls it makes go to exec.c and
// warp.c (declared in ../cusim_impl.h).
//
// How it maps: a kernel is an ordinary function; threadIdx and friends are
// calls that read the running GPU thread's coordinates; __shared__ is
// `static` (blocks run one after another on one OS thread, so one copy is
// the block's shared memory); a launch copies the arguments, converted to
// the kernel's parameter types as a real launch converts them, and queues
// a cusim_launch on the stream.
#pragma once

#ifndef __cplusplus
#error "cusim_device.h is C++ (device code)"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../cusim_impl.h"
#include "cuda_runtime_api.h"

// Device code carries nvcc's pragmas (#pragma unroll): g++ is told to let them
// be. (g++ before 13 ignores this for pragmas, GCC bug 53431: the build passes
// -Wno-unknown-pragmas to the kernels' files.)
#pragma GCC diagnostic ignored "-Wunknown-pragmas"

// ---- qualifiers ---------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
// __restrict__ is already a keyword of g++

// ---- dimensions and the built-in indices ----------------------------------------------------------

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

static constexpr int warpSize = 32;

namespace cusim
{
inline uint3 thread_idx()
{
    cusim_uint3 u = cusim_thread_idx();
    return uint3{u.x, u.y, u.z};
}
inline uint3 block_idx()
{
    cusim_uint3 u = cusim_block_idx();
    return uint3{u.x, u.y, u.z};
}
inline dim3 block_dim()
{
    cusim_uint3 u = cusim_block_dim();
    return dim3(u.x, u.y, u.z);
}
inline dim3 grid_dim()
{
    cusim_uint3 u = cusim_grid_dim();
    return dim3(u.x, u.y, u.z);
}
inline void *dynamic_shared() { return cusim_dynamic_shared(); }
} // namespace cusim

#define threadIdx (::cusim::thread_idx())
#define blockIdx (::cusim::block_idx())
#define blockDim (::cusim::block_dim())
#define gridDim (::cusim::grid_dim())

// ---- synchronisation ----------------------------------------------------------------------------------
// The defaults name the call site (file, line, column), which identifies a
// barrier for the divergence check and appears in every report.

#if defined(__has_builtin)
#if __has_builtin(__builtin_COLUMN)
#define CUSIM_COLUMN() __builtin_COLUMN()
#endif
#endif
#ifndef CUSIM_COLUMN
#define CUSIM_COLUMN() 0 /* g++ before 14: barriers are told apart by file and line */
#endif
#define CUSIM_SITE                                                                                           \
    const char *cusim_file = __builtin_FILE(), int cusim_line = __builtin_LINE(),                            \
               int cusim_col = CUSIM_COLUMN()

inline void __syncthreads(CUSIM_SITE) { cusim_syncthreads(cusim_file, cusim_line, cusim_col); }

inline void __syncwarp(unsigned mask = 0xffffffffu, CUSIM_SITE)
{
    cusim_warp_op(CUSIM_SYNCWARP, mask, 0, 0, 32, cusim_file, cusim_line, cusim_col);
}

// one thread runs at a time: every access is already visible to the next
inline void __threadfence() {}
inline void __threadfence_block() {}

namespace cusim
{
// a shuffle of any value of up to 8 bytes, as bits
template <class T>
inline T shuffle(int kind, unsigned mask, T v, int arg, int width, const char *file, int line, int col)
{
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                  "shuffles move trivially copyable values of at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = cusim_warp_op(kind, mask, bits, arg, width, file, line, col);
    T r;
    std::memcpy(&r, &bits, sizeof(T));
    return r;
}
} // namespace cusim

template <class T> inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, CUSIM_SITE)
{
    return ::cusim::shuffle(CUSIM_SHFL, mask, var, src_lane, width, cusim_file, cusim_line, cusim_col);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, CUSIM_SITE)
{
    return ::cusim::shuffle(CUSIM_SHFL_UP, mask, var, (int)delta, width, cusim_file, cusim_line, cusim_col);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, CUSIM_SITE)
{
    return ::cusim::shuffle(CUSIM_SHFL_DOWN, mask, var, (int)delta, width, cusim_file, cusim_line, cusim_col);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, CUSIM_SITE)
{
    return ::cusim::shuffle(CUSIM_SHFL_XOR, mask, var, lane_mask, width, cusim_file, cusim_line, cusim_col);
}

inline unsigned __ballot_sync(unsigned mask, int pred, CUSIM_SITE)
{
    return (unsigned)cusim_warp_op(CUSIM_BALLOT, mask, pred != 0, 0, 32, cusim_file, cusim_line, cusim_col);
}
inline int __any_sync(unsigned mask, int pred, CUSIM_SITE)
{
    return (int)cusim_warp_op(CUSIM_ANY, mask, pred != 0, 0, 32, cusim_file, cusim_line, cusim_col);
}
inline int __all_sync(unsigned mask, int pred, CUSIM_SITE)
{
    return (int)cusim_warp_op(CUSIM_ALL, mask, pred != 0, 0, 32, cusim_file, cusim_line, cusim_col);
}
// the lanes of the caller's warp that have not exited (the emulator does
// not model which lanes a branch has split off)
inline unsigned __activemask() { return cusim_activemask(); }

[[noreturn]] inline void __trap(const char *cusim_file = __builtin_FILE(), int cusim_line = __builtin_LINE())
{
    cusim_trap(cusim_file, cusim_line);
}

// ---- atomics --------------------------------------------------------------------------------------------

namespace cusim
{
template <class T> inline uint64_t to_bits(T v)
{
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T> inline T from_bits(uint64_t b)
{
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}
template <class T> struct atomic_type;
template <> struct atomic_type<int> {
    static constexpr int id = CUSIM_AT_I32;
};
template <> struct atomic_type<unsigned> {
    static constexpr int id = CUSIM_AT_U32;
};
template <> struct atomic_type<long long> {
    static constexpr int id = CUSIM_AT_I64;
};
template <> struct atomic_type<unsigned long long> {
    static constexpr int id = CUSIM_AT_U64;
};
template <> struct atomic_type<float> {
    static constexpr int id = CUSIM_AT_F32;
};
template <> struct atomic_type<double> {
    static constexpr int id = CUSIM_AT_F64;
};
template <class T> inline T atomic(int op, T *p, T a, T b = T())
{
    return from_bits<T>(cusim_atomic(op, atomic_type<T>::id, (void *)p, to_bits(a), to_bits(b)));
}
} // namespace cusim

#define CUSIM_ATOMIC_FN(name, op, T)                                                                         \
    inline T name(T *p, T v) { return ::cusim::atomic<T>(op, p, v); }
CUSIM_ATOMIC_FN(atomicAdd, CUSIM_AT_ADD, int)
CUSIM_ATOMIC_FN(atomicAdd, CUSIM_AT_ADD, unsigned)
CUSIM_ATOMIC_FN(atomicAdd, CUSIM_AT_ADD, unsigned long long)
CUSIM_ATOMIC_FN(atomicAdd, CUSIM_AT_ADD, float)
CUSIM_ATOMIC_FN(atomicAdd, CUSIM_AT_ADD, double)
CUSIM_ATOMIC_FN(atomicSub, CUSIM_AT_SUB, int)
CUSIM_ATOMIC_FN(atomicSub, CUSIM_AT_SUB, unsigned)
CUSIM_ATOMIC_FN(atomicMax, CUSIM_AT_MAX, int)
CUSIM_ATOMIC_FN(atomicMax, CUSIM_AT_MAX, unsigned)
CUSIM_ATOMIC_FN(atomicMax, CUSIM_AT_MAX, long long)
CUSIM_ATOMIC_FN(atomicMax, CUSIM_AT_MAX, unsigned long long)
CUSIM_ATOMIC_FN(atomicMin, CUSIM_AT_MIN, int)
CUSIM_ATOMIC_FN(atomicMin, CUSIM_AT_MIN, unsigned)
CUSIM_ATOMIC_FN(atomicMin, CUSIM_AT_MIN, long long)
CUSIM_ATOMIC_FN(atomicMin, CUSIM_AT_MIN, unsigned long long)
CUSIM_ATOMIC_FN(atomicExch, CUSIM_AT_EXCH, int)
CUSIM_ATOMIC_FN(atomicExch, CUSIM_AT_EXCH, unsigned)
CUSIM_ATOMIC_FN(atomicExch, CUSIM_AT_EXCH, unsigned long long)
CUSIM_ATOMIC_FN(atomicExch, CUSIM_AT_EXCH, float)
#undef CUSIM_ATOMIC_FN
inline int atomicCAS(int *p, int cmp, int v) { return ::cusim::atomic<int>(CUSIM_AT_CAS, p, cmp, v); }
inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned v)
{
    return ::cusim::atomic<unsigned>(CUSIM_AT_CAS, p, cmp, v);
}
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp, unsigned long long v)
{
    return ::cusim::atomic<unsigned long long>(CUSIM_AT_CAS, p, cmp, v);
}

// ---- intrinsics -----------------------------------------------------------------------------------------

inline unsigned __float_as_uint(float f) { return (unsigned)::cusim::to_bits(f); }
inline float __uint_as_float(unsigned u) { return ::cusim::from_bits<float>(u); }
inline int __float_as_int(float f) { return (int)(unsigned)::cusim::to_bits(f); }
inline float __int_as_float(int i) { return ::cusim::from_bits<float>((unsigned)i); }
inline long long __double_as_longlong(double d) { return (long long)::cusim::to_bits(d); }
inline double __longlong_as_double(long long i) { return ::cusim::from_bits<double>((uint64_t)i); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }

// The _rn forms are one correctly rounded operation each, never fused into
// a multiply-add with their neighbours: the empty asm hides the value from
// the optimiser, which cannot contract across it.
#if defined(__x86_64__) || defined(__i386__)
#define CUSIM_OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define CUSIM_OPAQUE(v) __asm__("" : "+w"(v))
#else
#define CUSIM_OPAQUE(v) __asm__("" : "+m"(v))
#endif
inline float __fadd_rn(float a, float b)
{
    float r = a + b;
    CUSIM_OPAQUE(r);
    return r;
}
inline float __fmul_rn(float a, float b)
{
    float r = a * b;
    CUSIM_OPAQUE(r);
    return r;
}
inline double __dadd_rn(double a, double b)
{
    double r = a + b;
    CUSIM_OPAQUE(r);
    return r;
}
inline double __dmul_rn(double a, double b)
{
    double r = a * b;
    CUSIM_OPAQUE(r);
    return r;
}

// the fast approximations, computed exactly here (a GPU's differ in the last bits)
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }

// min/max over any two arithmetic types, in their common type, as CUDA's
// headers provide them (floating point: fmin/fmax, a NaN loses)
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> min(A a, B b)
{
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point<C>::value)
        return std::fmin((C)a, (C)b);
    else
        return (C)b < (C)a ? (C)b : (C)a;
}
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> max(A a, B b)
{
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point<C>::value)
        return std::fmax((C)a, (C)b);
    else
        return (C)a < (C)b ? (C)b : (C)a;
}

// ---- the launch
// --------------------------------------------------------------------------------------------

namespace cusim
{

// a launch's arguments: the kernel and its parameters' values
template <class... P> struct kernel_args {
    void (*kernel)(P...);
    std::tuple<P...> values;
};

// Runs the kernel body for the current GPU thread. The arguments are first
// copied onto the thread's own stack without instrumentation: every thread
// reads them, and the race checker has no business with them.
template <class Box> void run_kernel(void *args)
{
    alignas(Box) unsigned char copy[sizeof(Box)];
    cusim_copy_args(copy, args, sizeof(Box));
    Box *b = std::launder(reinterpret_cast<Box *>(copy));
    std::apply(b->kernel, b->values);
}

template <class Box> void free_args(void *args) { delete static_cast<Box *>(args); }

template <class... P> class launcher_t
{
  public:
    launcher_t(void (*k)(P...), const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream)
        : k_(k), name_(name), grid_(grid), block_(block), smem_(smem), stream_(stream)
    {
    }

    // Converts args to the kernel's parameter types, as a real launch does,
    // and queues the launch: the error of an invalid configuration, else 0.
    template <class... A> cudaError_t operator()(A &&...args) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        static_assert((std::is_trivially_copyable<P>::value && ...),
                      "kernel parameters must be trivially copyable");
        using Box = kernel_args<P...>;
        Box *box = new (std::nothrow) Box{k_, std::tuple<P...>(static_cast<P>(std::forward<A>(args))...)};
        cusim_launch *l = (cusim_launch *)std::calloc(1, sizeof *l);
        if (!box || !l) {
            delete box;
            std::free(l);
            return cudaErrorMemoryAllocation;
        }
        l->func = (const void *)k_;
        l->name = name_;
        l->grid[0] = grid_.x, l->grid[1] = grid_.y, l->grid[2] = grid_.z;
        l->block[0] = block_.x, l->block[1] = block_.y, l->block[2] = block_.z;
        l->smem = smem_;
        l->run = &run_kernel<Box>;
        l->args = box;
        l->free_args = &free_args<Box>;
        return (cudaError_t)cusim_launch_kernel(l, (void *)stream_);
    }

  private:
    void (*k_)(P...);
    const char *name_;
    dim3 grid_, block_;
    size_t smem_;
    cudaStream_t stream_;
};

// launcher(kernel, "name", grid, block, smem, stream)(args...): the
// emulator's kernel<<<grid, block, smem, stream>>>(args...)
template <class... P>
launcher_t<P...> launcher(void (*k)(P...), const char *name, dim3 grid, dim3 block, size_t smem = 0,
                          cudaStream_t stream = 0)
{
    return launcher_t<P...>(k, name, grid, block, smem, stream);
}

} // namespace cusim

// C++ callers pass the kernel itself, as with the real runtime
template <class F> inline cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value)
{
    return ::cudaFuncSetAttribute((const void *)func, attr, value);
}
