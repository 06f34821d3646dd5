/* ember/runtime.h — what this build and machine are: version, build options,
 * CPU features, BLAS, devices. Backs `ember env`. */
#ifndef EMBER_RUNTIME_H
#define EMBER_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is the exported API of libember.so, which
 * builds with hidden visibility (meson.build): nothing else leaves it. (nvcc
 * is left out: no .cu file defines a public function.) */
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility push(default)
#endif

const char *em_version(void); /* "0.1.0" */

typedef struct em_cpu_features {
    bool avx, avx2, fma, avx512f, avx512bf16, f16c;
} em_cpu_features;
/* The vector features this CPU has and the OS enables; read once per
 * process (cpuid is slow in a VM), then returned from memory. */
em_cpu_features em_cpu_detect(void);

typedef struct em_build_info {
    const char *buildtype; /* meson buildtype */
    const char *compiler;  /* e.g. "gcc 12.2.0" */
    bool sanitizers;       /* built with ASan/UBSan */
    bool cuda;             /* CUDA kernels compiled in */
    bool nccl;             /* NCCL collectives compiled in */
    bool mpi;              /* the MPI transport (EM_TRANSPORT_MPI) compiled in */
    const char *blas;      /* BLAS library name */
} em_build_info;
em_build_info em_build(void);

/* The product path CPU matmuls of dtype dt take in this process, as a
 * short name: f32 "avx2" (ember's own GEMM on its AVX2+FMA kernel: the
 * default on CPUs with AVX2+FMA and no AVX-512F), "avx512" (the same GEMM
 * on its AVX-512F kernel: the default on AVX-512F CPUs whose BLAS runs no
 * AVX-512 sgemm there) or "sgemm" (the BLAS; EMBER_F32_PATH=auto, sgemm,
 * avx2 or avx512 chooses), each split over ember's pool; f64 and the
 * integers "dgemm"; bf16 "amx" (AMX tiles), "avx512bf16" (VDPBF16PS) or
 * "f32" (operands kept in bf16, widened to f32 block by block inside the
 * GEMM; under autocast f32 operands are read as they are and rounded to
 * bf16 there, with no bf16 copy: ember/amp.h); f16 "f32" likewise. bf16 takes the
 * fastest path the CPU has unless EMBER_BF16_PATH (auto, f32, avx512bf16,
 * amx) names one; every path accumulates in f32 and rounds each result
 * once. A static string; NULL with EM_ERR_ARG when EMBER_F32_PATH or
 * EMBER_BF16_PATH (or EMBER_NO_AMX) is not a valid value,
 * EM_ERR_UNSUPPORTED when it names a path this CPU cannot run (a matmul of
 * that dtype then fails the same way), and EM_ERR_DTYPE for bool. */
const char *em_matmul_path(em_dtype dt);

/* BLAS's own description (openblas_get_config) and its thread count. */
const char *em_blas_config(void);
int em_blas_threads(void);
/* CUDA devices visible at run time; 0 when not built with CUDA or none. */
int em_cuda_device_count(void);

/* One CUDA device, for `ember env` and bug reports. */
typedef struct em_cuda_device_info {
    char name[256];
    int major, minor;       /* compute capability */
    int multiprocessors;
    size_t total_memory;    /* bytes */
} em_cuda_device_info;
/* Fills *out for device `index`; EM_ERR_DEVICE when CUDA is not built in
 * or there is no such device. */
em_status em_cuda_device_info_of(int index, em_cuda_device_info *out);
/* Driver and runtime versions as CUDA writes them (12040 = 12.4), and
 * NCCL's (21905 = 2.19.5); 0 for what is not there. */
void em_cuda_versions(int *driver, int *runtime, int *nccl);
/* Waits for all work queued on device `index` (a no-op without CUDA). */
em_status em_cuda_synchronize(int index);
/* The caching allocator's figures for device `index`, in bytes: in use by
 * tensors (the blocks' sizes: a request is rounded up, and may be given a
 * cached block of up to twice its size), held from CUDA (in use + cached),
 * the peak in use since start or the last reset, and how many times it
 * called cudaMalloc. Beside them, memory mapped into address ranges ember
 * reserved (CUDA's virtual memory management: ZeRO stage 3's flat
 * parameters, dist/zero.c), counted in neither figure above: mapped now
 * (granules whose unmap waits for queued work included), and its peak
 * since start or the last reset. Last, what the blocks in use were asked
 * for (the tensors' own bytes, before rounding; PyTorch's
 * requested_bytes). */
typedef struct em_cuda_memory {
    size_t allocated, reserved, peak_allocated;
    uint64_t device_mallocs;
    size_t mapped, peak_mapped;
    size_t requested;
} em_cuda_memory;
em_status em_cuda_memory_stats(int index, em_cuda_memory *out);
/* Both peaks back to what is in use / mapped now. */
void em_cuda_reset_peak(int index);
/* Waits for device `index`, then returns its cached blocks to CUDA and
 * does the unmaps that were waiting for its work. */
void em_cuda_empty_cache(int index);
/* TF32 for f32 matmuls on the device (off by default, as in PyTorch). */
void em_cuda_set_tf32(bool on);
bool em_cuda_tf32(void);

#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
