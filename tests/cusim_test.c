/* cusim_test.c — the helpers the tests of ember's CUDA emulator share
 * (declared in cusim_test.h): the emulator's settings, stderr captured,
 * the checks of reports and failed launches, device memory. Sim build only:
 * elsewhere this file is empty. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ember_config.h"
#include "harness.h"

#if EM_CUDA_SIM

#include "cusim_test.h"

void emulator(const char *schedule)
{
    setenv("EMBER_CUSIM_SCHEDULE", schedule, 1);
    unsetenv("EMBER_CUSIM_FATAL");
    setenv("EMBER_CUSIM_RACECHECK", "1", 1);
    setenv("EMBER_CUSIM_NCCL_TIMEOUT", "20", 1);
}

static char capture_path[PATH_MAX];
void capture_stderr(void)
{
    int fd = th_tmpfile(capture_path, sizeof capture_path, "ember-cusim-err");
    unlink(capture_path);
    CHECK(dup2(fd, STDERR_FILENO) == STDERR_FILENO);
    close(fd);
}

const char *captured_stderr(void)
{
    static char text[16384];
    ssize_t n = pread(STDERR_FILENO, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = 0;
    return text;
}

void check_report(const char *file, int line, int before, ...)
{
    if (cusim_report_count() <= before) th_fail(file, line, "no report; stderr: %s", captured_stderr());
    const char *msg = cusim_last_message();
    va_list ap;
    va_start(ap, before);
    for (const char *want; (want = va_arg(ap, const char *));) {
        if (!strstr(msg, want)) th_fail(file, line, "the report lacks \"%s\": %s", want, msg);
        if (!strstr(captured_stderr(), want)) th_fail(file, line, "stderr lacks \"%s\"", want);
    }
    va_end(ap);
}

void check_launch_failed(const char *file, int line, cudaError_t at_sync)
{
    if (at_sync != cudaErrorLaunchFailure)
        th_fail(file, line, "the sync returned %s, want cudaErrorLaunchFailure", cudaGetErrorName(at_sync));
    if (cudaGetLastError() != cudaErrorLaunchFailure)
        th_fail(file, line, "cudaGetLastError does not return the kernel's failure");
}

/* Runs fn(ctx) in a child whose stderr goes to a file; returns its wait
 * status and stderr (err, cap bytes). */
int run_child(void (*fn)(void *), void *ctx, char *err, size_t cap)
{
    char path[PATH_MAX];
    int fd = th_tmpfile(path, sizeof path, "ember-cusim-child");
    unlink(path);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fd, STDERR_FILENO);
        fn(ctx);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    ssize_t n = pread(fd, err, cap - 1, 0);
    err[n > 0 ? n : 0] = 0;
    close(fd);
    return status;
}

void *device_alloc(size_t n)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, n));
    return p;
}

char *address(const void *p)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "%p", p);
    return buf;
}

float *reduction_input(void)
{
    float x[RED_N];
    for (int i = 0; i < RED_N; i++) x[i] = (float)i;
    float *d = device_alloc(sizeof x);
    CUDA_OK(cudaMemcpy(d, x, sizeof x, cudaMemcpyHostToDevice));
    return d;
}

#endif
