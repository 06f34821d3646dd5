/* library_types.h — the data-type enum the CUDA math libraries share
 * (cudaDataType), as ember's CUDA emulator serves it: the real names and
 * values, the real types only (no complex arithmetic is emulated). C and
 * C++. */
#ifndef EMBER_CUSIM_LIBRARY_TYPES_H
#define EMBER_CUSIM_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
    CUDA_R_16F = 2,
    CUDA_C_16F = 6,
    CUDA_R_16BF = 14,
    CUDA_C_16BF = 15,
    CUDA_R_32F = 0,
    CUDA_C_32F = 4,
    CUDA_R_64F = 1,
    CUDA_C_64F = 5,
    CUDA_R_8I = 3,
    CUDA_C_8I = 7,
    CUDA_R_8U = 8,
    CUDA_C_8U = 9,
    CUDA_R_32I = 10,
    CUDA_C_32I = 11
} cudaDataType;
typedef enum cudaDataType_t cudaDataType_t;

#endif
