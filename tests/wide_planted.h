/* wide_planted.h — the 6x32 f32 micro-kernel's sums (tensor/gemm_wide_sums.h)
 * compiled with planted bugs (tests/wide_planted.c), for
 * tests/test_f32_path.c to show that its comparison with the 6x16 kernel
 * catches a wrong one. */
#ifndef EMBER_WIDE_PLANTED_H
#define EMBER_WIDE_PLANTED_H

#include "tensor/kernel_impl.h"

typedef struct wide_planted {
    const char *bug;
    wide_sums_fn sums;
} wide_planted;

enum { WIDE_PLANTED = 3 };
extern const wide_planted wide_planted_sums[WIDE_PLANTED];

#endif
