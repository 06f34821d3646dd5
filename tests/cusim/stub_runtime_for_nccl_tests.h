/* stub_runtime_for_nccl_tests.h — what selftest_nccl.c asks of the stand-in
 * runtime (stub_runtime_for_nccl_tests.c): device buffers and the current
 * device, without the CUDA runtime API. */
#ifndef EMBER_CUSIM_STUB_RUNTIME_FOR_NCCL_TESTS_H
#define EMBER_CUSIM_STUB_RUNTIME_FOR_NCCL_TESTS_H

#include <stddef.h>

/* n bytes the emulator treats as device memory (freed with stub_dev_free). */
void *stub_dev_alloc(size_t n);
void stub_dev_free(void *p);
/* The calling thread's current device (cudaSetDevice). */
void stub_set_device(int dev);

#endif
