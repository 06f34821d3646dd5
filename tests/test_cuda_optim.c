/* test_cuda_optim.c — CUDA kernels against the CPU (skip without a device). */
#include "cuda_test.h"
