/* cublas_api.h — the cuBLAS calls ember makes, reached through a table
 * loaded on first use (tensor/cuda_blas.c), built only with CUDA; C only
 * (in C++ cuBLAS overloads some of these names).
 *
 * Why not link libcublas: loading libcublasLt (which libcublas needs) maps
 * and relocates about 150 MB, resident in every process that links it even
 * where no GPU exists: `ember --version` peaked at 225 MB against 6 MB
 * without CUDA (issue 16). So the library is opened with dlopen when a
 * device first runs a product (cu_blas), and a CPU-only process never maps
 * it. Under the CUDA emulator (-Dcuda=sim) the table points at the
 * emulator's own functions. The entries' types are the header's own
 * (typeof), so a signature cannot drift from the toolkit's. */
#ifndef EMBER_CUBLAS_API_H
#define EMBER_CUBLAS_API_H

#include <cublas_v2.h>

#include "ember/tensor.h"

#define CUBLAS_FN(f) __typeof__(&f)

typedef struct cublas_api {
    CUBLAS_FN(cublasCreate) create;
    CUBLAS_FN(cublasSetStream) set_stream;
    CUBLAS_FN(cublasSetMathMode) set_math_mode;
    CUBLAS_FN(cublasGemmStridedBatchedEx) gemm_strided_batched_ex;
    CUBLAS_FN(cublasGetStatusString) status_string;
} cublas_api;

/* The table, loaded on the first call (thread-safe; later calls return the
 * same table at no cost). NULL + EM_ERR_DEVICE naming each library file
 * tried and the loader's reason, or the missing symbol; a failed load is
 * not retried. */
const cublas_api *cublas_get(void);

/* Whether this process has opened cuBLAS (the tests check a CPU-only
 * process never does). */
bool cublas_loaded(void);

/* For the tests: loads the table from the library file `name` (a soname
 * searched as dlopen searches, or a path) into *out, leaving the process's
 * table alone. EM_ERR_DEVICE naming `name` and the loader's reason, or the
 * symbol it lacks. The library stays open on success. */
em_status cublas_load_for_test(const char *name, cublas_api *out);

#endif
