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
 * copies, cuBLAS handles), tensor/cuda_vmm.c (address ranges whose memory
 * is mapped granule by granule), tensor/cuda_core.cu (strided copy/convert, fill,
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

/* Physical memory mapped into address ranges (tensor/cuda_vmm.c) changed
 * by delta bytes on dev: em_cuda_memory_stats' mapped and peak_mapped. */
void cu_note_mapped(int dev, int64_t delta);

/* ---- address ranges whose memory comes and goes (tensor/cuda_vmm.c) -----------
 * CUDA's virtual memory management: a range of device addresses reserved
 * once, cut into granules (cu_vrange_granule bytes, 2 MiB on current GPUs),
 * each mapped to memory of its own or not. Pointers into the range stay
 * valid while granules are unmapped and mapped again; only the bytes of an
 * unmapped granule are gone (and the device memory they held). */
typedef struct cu_vrange cu_vrange;
/* Moves the nbytes of device memory at *data (a cu_alloc block of dev)
 * into a range reserved for them, every granule mapped, and points *data
 * at it (same offsets); the block goes back to the caching allocator in
 * stream order. NULL + error (EM_ERR_UNSUPPORTED: the driver lacks the
 * calls; EM_ERR_OOM; EM_ERR_DEVICE naming the driver call), *data as it was. */
cu_vrange *cu_vrange_adopt(int dev, void **data, size_t nbytes);
size_t cu_vrange_granule(const cu_vrange *r);
/* Maps every granule that meets bytes [lo, hi) of the range and is not
 * mapped (one whose unmap is still pending just stays). A newly mapped
 * granule's bytes are undefined until written. EM_ERR_OOM when the device
 * has no memory left for it. */
em_status cu_vrange_map(cu_vrange *r, size_t lo, size_t hi);
/* Unmaps every granule wholly inside bytes [lo, hi) once the work queued
 * on dev's compute stream so far has run (it may still read them): at a
 * later call on r that finds it done, or at cu_vrange_settle. */
em_status cu_vrange_unmap(cu_vrange *r, size_t lo, size_t hi);
/* Whether byte off of the range lies in a mapped granule (pending unmaps
 * count as mapped). */
bool cu_vrange_mapped(const cu_vrange *r, size_t off);
/* The range's bytes back into a new cu_alloc block (an unmapped granule's
 * part reads zeros), *data pointed at it, the range released. Waits for
 * the device. NULL r: EM_OK. */
em_status cu_vrange_return(cu_vrange *r, void **data);
/* Waits for dev's pending unmaps and does them (em_cuda_empty_cache). */
void cu_vrange_settle(int dev);

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
