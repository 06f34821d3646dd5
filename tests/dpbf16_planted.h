/* dpbf16_planted.h — the VDPBF16PS micro-kernel's source compiled with
 * planted bugs (tests/dpbf16_planted.c), for tests/test_bf16_path.c to
 * show that its comparison with the model catches a wrong kernel. */
#ifndef EMBER_DPBF16_PLANTED_H
#define EMBER_DPBF16_PLANTED_H

#include "tensor/kernel_impl.h"

typedef struct dp_planted {
    const char *bug;
    dp_kernel kernel;
} dp_planted;

enum { DP_PLANTED = 3 };
extern const dp_planted dp_planted_kernels[DP_PLANTED];

#endif
