/* test_cuda_nn.c — CUDA kernels against the CPU (skip without a device). */
#include "cuda_test.h"
