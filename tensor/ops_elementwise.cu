// ops_elementwise.cu — CUDA kernels (see tensor/cuda_impl.h for the conventions).
#include "cuda_common.cuh"
