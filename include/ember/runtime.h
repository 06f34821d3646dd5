/* ember/runtime.h — what this build and machine are: version, build options,
 * CPU features, BLAS, devices. Backs `ember env`. */
#ifndef EMBER_RUNTIME_H
#define EMBER_RUNTIME_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

const char *em_version(void); /* "0.1.0" */

typedef struct em_cpu_features {
    bool avx, avx2, fma, avx512f, avx512bf16, f16c;
} em_cpu_features;
em_cpu_features em_cpu_detect(void);

typedef struct em_build_info {
    const char *buildtype; /* meson buildtype */
    const char *compiler;  /* e.g. "gcc 12.2.0" */
    bool sanitizers;       /* built with ASan/UBSan */
    bool cuda;             /* CUDA kernels compiled in */
    bool nccl;             /* NCCL collectives compiled in */
    const char *blas;      /* BLAS library name */
} em_build_info;
em_build_info em_build(void);

/* BLAS's own description (openblas_get_config) and its thread count. */
const char *em_blas_config(void);
int em_blas_threads(void);
/* CUDA devices visible at run time; 0 when not built with CUDA or none. */
int em_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
