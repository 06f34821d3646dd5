/* hd.h — EM_HD, the mark of a function that runs on the host and on a CUDA
 * device: the per-element maths that the C files and the .cu files share
 * (tensor/dtype_math.h, tensor/philox.h, optim/update_math.h, ...) is
 * written once as `static inline EM_HD` functions in headers both include.
 *
 *   nvcc:                    __host__ __device__
 *   ember's CUDA emulator:   __host__ __device__ (the .cu files build as C++
 *                            against tests/cusim/include, where both are empty)
 *   C:                       nothing
 *
 * C++ in ember is only ever the .cu files built for the emulator, so a C++
 * translation unit that is not nvcc's gets the emulator's cuda_runtime.h,
 * whichever header it included first. */
#ifndef EMBER_HD_H
#define EMBER_HD_H

#if defined(__CUDACC__)
#define EM_HD __host__ __device__
#elif defined(__cplusplus)
#include <cuda_runtime.h>
#define EM_HD __host__ __device__
#else
#define EM_HD
#endif

#endif
