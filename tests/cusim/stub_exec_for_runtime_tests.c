/* stub_exec_for_runtime_tests.c — a stand-in for exec.c so the runtime and
 * cuBLAS can be tested on their own (selftest_runtime.c); NOT part of the
 * emulator's build. A launch is valid when its grid and block are non-zero;
 * running it calls l->run(l->args) once, and a run function may fail the
 * launch by calling stub_exec_fail() (to test sticky errors). */
#include "cuda_runtime_api.h"
#include "cusim_impl.h"

static _Thread_local int failing;

void stub_exec_fail(void) { failing = 1; }

int cusim_check_launch(const cusim_launch *l, size_t max_dynamic_smem)
{
    for (int i = 0; i < 3; i++)
        if (l->grid[i] == 0 || l->block[i] == 0) return cudaErrorInvalidConfiguration;
    if (l->smem > max_dynamic_smem) return cudaErrorInvalidValue;
    return 0;
}

int cusim_exec(const cusim_launch *l)
{
    failing = 0;
    l->run(l->args);
    if (failing) {
        cusim_report("stub exec: kernel %s failed", l->name);
        return cudaErrorLaunchFailure;
    }
    return 0;
}
