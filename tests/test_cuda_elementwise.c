/* test_cuda_elementwise.c — CUDA kernels against the CPU (skip without a device). */
#include "cuda_test.h"
