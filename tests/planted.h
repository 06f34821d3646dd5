/* planted.h — micro-kernels' sources compiled with planted bugs, for the
 * tests to show that their comparisons catch a wrong kernel: the VDPBF16PS
 * kernel (tests/dpbf16_planted.c; its comparison with the model,
 * tests/test_bf16_path.c) and the 6x32 f32 kernel's sums
 * (tests/wide_planted.c; its comparison with the 6x16 kernel,
 * tests/test_f32_path.c). */
#ifndef EMBER_PLANTED_H
#define EMBER_PLANTED_H

#include "tensor/kernel_impl.h"

/* one planted bug: what it is and the kernel that has it (kernel for the
 * VDPBF16PS lists, sums for the 6x32 one) */
typedef struct planted {
    const char *bug;
    dp_kernel kernel;
    wide_sums_fn sums;
} planted;

enum { DP_PLANTED = 3, WIDE_PLANTED = 3 };
extern const planted dp_planted_kernels[DP_PLANTED];
extern const planted wide_planted_sums[WIDE_PLANTED];

#endif
