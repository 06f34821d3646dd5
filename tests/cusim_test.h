/* cusim_test.h — what the tests of ember's CUDA emulator share
 * (tests/test_cusim.c, tests/test_cusim_runtime.c; defined in
 * tests/cusim_test.c): the emulator's settings for a test, stderr captured
 * to check its reports, the CHECK macros for reports and failed launches,
 * and small device-memory helpers.
 *
 * Sim build only (meson -Dcuda=sim): include it inside `#if EM_CUDA_SIM`. */
#ifndef EMBER_TESTS_CUSIM_TEST_H
#define EMBER_TESTS_CUSIM_TEST_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "cusim_impl.h"
#include "harness.h"

/* Sets the emulator's environment for this test (before the first CUDA
 * call: the settings are read once): schedule, and no abort at a report
 * whatever the caller's environment says. */
void emulator(const char *schedule);

/* stderr from here on goes to a file read back by captured_stderr(): the
 * reports the test provokes are checked there instead of cluttering the log */
void capture_stderr(void);
const char *captured_stderr(void);

#define CUDA_OK(call)                                                                                        \
    do {                                                                                                     \
        cudaError_t th_e = (cudaError_t)(call);                                                              \
        if (th_e != cudaSuccess) th_fail(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorName(th_e));       \
    } while (0)

/* the last report contains every one of the NULL-terminated strings, and
 * so does what reached stderr */
void check_report(const char *file, int line, int before, ...);
#define CHECK_REPORT(before, ...) check_report(__FILE__, __LINE__, (before), __VA_ARGS__, (const char *)NULL)
#define CHECK_NO_REPORT(before)                                                                              \
    do {                                                                                                     \
        if (cusim_report_count() != (before))                                                                \
            th_fail(__FILE__, __LINE__, "unexpected: %s", cusim_last_message());                             \
    } while (0)

/* a failed launch's error, as the program sees it: sticky, every call */
void check_launch_failed(const char *file, int line, cudaError_t at_sync);
#define CHECK_LAUNCH_FAILED(sync_call) check_launch_failed(__FILE__, __LINE__, (sync_call))

/* Runs fn(ctx) in a forked child whose stderr goes to a file; returns its
 * wait status and stderr (err, cap bytes, NUL-terminated). */
int run_child(void (*fn)(void *), void *ctx, char *err, size_t cap);

/* n bytes of device memory (cudaMalloc; a failure fails the test) */
void *device_alloc(size_t n);

/* p as "%p" prints it, in a static buffer (overwritten by the next call) */
char *address(const void *p);

/* the input of the reduction kernel (cf_reduce_in_shared): RED_N floats
 * 0, 1, ..., RED_N - 1 in device memory */
enum { RED_N = 64 };
float *reduction_input(void);

#endif
