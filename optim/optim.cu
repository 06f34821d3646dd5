// optim.cu — CUDA kernels (see tensor/cuda_impl.h for the conventions).
#include "../tensor/cuda_common.cuh"
