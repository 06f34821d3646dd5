/* cuda_impl.h — the CUDA side of the engine, as the C code sees it.
 *
 * Included from C (tensor_impl.h) and from the .cu files, so it names CUDA
 * types only as `void *` (a cudaStream_t, a cublasHandle_t) and holds no
 * CUDA headers. Everything here exists only when EM_HAVE_CUDA; a build
 * without CUDA never makes a CUDA tensor, so the C code guards its device
 * branches with `#if EM_HAVE_CUDA`.
 *
 * Conventions every kernel entry point follows:
 *   - `dev` is the device index; the entry point makes it current.
 *   - Work is queued on that device's compute stream (cu_stream) and the
 *     call returns without waiting; the order of the stream is the order of
 *     the calls, so buffers can be reused as soon as the call returns.
 *   - Pointers are device pointers to the first element; shapes and strides
 *     are in elements, like tensor's.
 *   - The return value is EM_OK, or an error (cu_launched) naming the op and
 *     CUDA's own message. Nothing here calls exit().
 *
 * Files: tensor/cuda_runtime.c (devices, streams, the caching allocator,
 * copies, cuBLAS handles), tensor/cuda_core.cu (strided copy/convert, fill,
 * add: what views, casts and gradient accumulation need), and one .cu beside
 * each family of ops (ops_*.cu) with that family's kernels. */
#ifndef EMBER_CUDA_IMPL_H
#define EMBER_CUDA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime (tensor/cuda_runtime.c) ----------------------------------------- */

/* Makes dev current; an error naming `op` when dev is not a usable device. */
em_status cu_use(int dev, const char *op);
/* The device's compute stream (a cudaStream_t), created on first use. */
void *cu_stream(int dev);
/* The device's cuBLAS handle (a cublasHandle_t) bound to the compute stream,
 * with TF32 on or off as em_cuda_set_tf32 says; NULL + error on failure. */
void *cu_blas(int dev);
/* After a kernel launch: EM_OK, or EM_ERR_DEVICE naming `op` with CUDA's
 * message (cudaGetLastError). */
em_status cu_launched(const char *op);
/* Turns a CUDA runtime status (cudaError_t as int) into EM_OK or an
 * EM_ERR_DEVICE error naming `what`. */
em_status cu_check(int cuda_status, const char *what);
/* Device memory from the caching allocator: sizes are rounded up (512 B
 * below 1 MiB, 2 MiB above) and a freed block goes back to a per-device
 * free list, so a training loop stops calling cudaMalloc after its first
 * step. NULL + EM_ERR_OOM (after emptying the cache once and retrying). */
void *cu_alloc(int dev, size_t nbytes);
void cu_free(int dev, void *p);
/* Copies nbytes between any two places (host or device), in stream order on
 * the device involved; returns when the data is at dst for a host dst. */
em_status cu_memcpy(void *dst, em_device ddev, const void *src, em_device sdev, size_t nbytes);
/* Waits for everything queued on dev's compute stream. */
em_status cu_sync(int dev);

/* ---- the core kernels (tensor/cuda_core.cu) -------------------------------------
 * A strided walk: `ndim` dims of `shape`; for each operand k its element
 * strides stride[k]. Operand 0 is the output. */
typedef struct cu_walk {
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t stride[3][EM_MAX_DIMS];
} cu_walk;

/* dst (dtype to) = src (dtype from), element by element over w (operand 0
 * dst, operand 1 src), converting with the CPU's rounding rules (bf16
 * round-to-nearest-even, NaN stays NaN; f16 IEEE). */
em_status cu_copy(int dev, const cu_walk *w, em_dtype to, void *dst, em_dtype from, const void *src);
/* n contiguous elements of dtype dt at p set to v. */
em_status cu_fill(int dev, em_dtype dt, void *p, int64_t n, double v);
/* dst[i] += src[i] over w (operand 0 dst, 1 src), both float dtypes:
 * summed in f32 (f64 when dst is f64) and rounded once into dst's dtype
 * (gradient accumulation). */
em_status cu_add_into(int dev, const cu_walk *w, em_dtype dt_dst, void *dst, em_dtype dt_src, const void *src);

#ifdef __cplusplus
}
#endif
#endif
