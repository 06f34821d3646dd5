/* cuda_test.h — shared by the CUDA tests: skip without a device, and
 * compare a CUDA result with the CPU's. */
#ifndef EMBER_CUDA_TEST_H
#define EMBER_CUDA_TEST_H

#include "ember/ember.h"
#include "harness.h"

/* Skips the test, visibly, where no CUDA device is visible (CI has none). */
#define CUDA_OR_SKIP()                                                                                            \
    do {                                                                                                          \
        if (em_cuda_device_count() == 0) SKIP("no CUDA device visible (GPU test)");                              \
    } while (0)

#endif
