/* test_cusim_vmm.c — the emulator's CUDA virtual memory management
 * (tests/cusim/vmm.c): reserved address ranges, physical memory mapped into
 * them granule by granule. A kernel or a copy touching an unmapped part is
 * reported (the planted bug beside its correct twin), host code reading a
 * mapping dies naming it, the driver's argument rules are kept, memory
 * counts from cuMemCreate until released and unmapped, and contents live
 * in the allocation (surviving an unmap), 0xff bytes when new. ember's own
 * use of it (ZeRO stage 3 on a device) is tests/test_ddp.c's.
 *
 * Each test runs in its own process, so the emulator's settings are set at
 * each test's start; the granularity is the host page (4 KiB here), so a
 * few kilobytes make several granules. Sim build only. */
#include <stdint.h>
#include <stdlib.h>

#include "ember_config.h"
#include "harness.h"

#define CUSIM_VMM_TESTS(X)                                                                                   \
    X(test_cusim_vmm_kernel_writing_into_an_unmapped_part_of_a_reserved_range_is_reported)                   \
    X(test_cusim_vmm_kernel_writing_into_mapped_granules_passes)                                             \
    X(test_cusim_vmm_copy_into_an_unmapped_part_is_reported)                                                 \
    X(test_cusim_vmm_host_code_reading_a_mapping_dies_naming_it)                                             \
    X(test_cusim_vmm_calls_breaking_the_drivers_rules_fail_and_are_reported)                                 \
    X(test_cusim_vmm_memory_counts_until_released_and_unmapped)                                              \
    X(test_cusim_vmm_contents_survive_an_unmap_and_are_0xff_when_new)                                        \
    X(test_cusim_vmm_driver_entry_points_come_through_the_runtime)

#if !EM_CUDA_SIM

#define SKIPPED(name)                                                                                        \
    TEST(name) { SKIP("the CUDA emulator's test: needs the sim build (meson -Dcuda=sim)"); }
CUSIM_VMM_TESTS(SKIPPED)

#else

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cusim_faults.h"
#include "cusim_test.h"

#define CU_OK(call)                                                                                          \
    do {                                                                                                     \
        CUresult th_r = (call);                                                                              \
        if (th_r != CUDA_SUCCESS) th_fail(__FILE__, __LINE__, "%s: CUresult %d", #call, (int)th_r);          \
    } while (0)

static size_t G; /* the granularity */

/* The emulator for a VMM test: in-order schedule, granules of one host page. */
static void vmm_emulator(void)
{
    emulator("in-order");
    char g[32];
    snprintf(g, sizeof g, "%ld", sysconf(_SC_PAGESIZE));
    setenv("EMBER_CUSIM_VMM_GRANULARITY", g, 1);
    G = (size_t)sysconf(_SC_PAGESIZE);
}

static CUmemAllocationProp device0(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

/* Granule k of the range at base gets memory of its own, read-write; its
 * handle is released at once (the memory goes with the unmap). */
static void map_granule(char *base, size_t k)
{
    CUmemAllocationProp p = device0();
    CUmemGenericAllocationHandle h;
    CU_OK(cuMemCreate(&h, G, &p, 0));
    CU_OK(cuMemMap((CUdeviceptr)(uintptr_t)(base + k * G), G, 0, h, 0));
    CU_OK(cuMemRelease(h));
    CUmemAccessDesc a = {p.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU_OK(cuMemSetAccess((CUdeviceptr)(uintptr_t)(base + k * G), G, &a, 1));
}

/* A range of n granules reserved, granules 0 and 2 mapped, 1 (and the
 * rest) not. */
static char *reserve_with_a_hole(size_t n)
{
    size_t g = 0;
    CUmemAllocationProp p = device0();
    CU_OK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(g == G);
    CUdeviceptr base = 0;
    CU_OK(cuMemAddressReserve(&base, n * G, G, 0, 0));
    char *b = (char *)(uintptr_t)base;
    CHECK((uintptr_t)b % G == 0);
    map_granule(b, 0);
    map_granule(b, 2);
    return b;
}

/* ---- the checkers see what is mapped ---------------------------------------------------- */

TEST(test_cusim_vmm_kernel_writing_into_an_unmapped_part_of_a_reserved_range_is_reported)
{
    vmm_emulator();
    capture_stderr();
    char *b = reserve_with_a_hole(3);
    int before = cusim_report_count();
    /* the bug: the kernel runs on from granule 0 into granule 1, never mapped */
    CUDA_OK(cf_write_indices((int *)b, (int)(G / sizeof(int)) + 4, false));
    CHECK_LAUNCH_FAILED(cudaDeviceSynchronize());
    CHECK_REPORT(before, "kernel write_indices", "write of 4 bytes", address(b + G),
                 "an unmapped part of the range reserved at", address(b));
}

TEST(test_cusim_vmm_kernel_writing_into_mapped_granules_passes)
{
    vmm_emulator();
    char *b = reserve_with_a_hole(3);
    int n = (int)(G / sizeof(int)), *got = malloc(G);
    CHECK(got != NULL);
    int before = cusim_report_count();
    CUDA_OK(cf_write_indices((int *)(b + 2 * G), n, false)); /* granule 2 whole */
    CUDA_OK(cudaMemcpy(got, b + 2 * G, G, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) CHECK(got[i] == i);
    CHECK_NO_REPORT(before);
    free(got);
}

TEST(test_cusim_vmm_copy_into_an_unmapped_part_is_reported)
{
    vmm_emulator();
    capture_stderr();
    char *b = reserve_with_a_hole(3), host[64] = {0};
    int before = cusim_report_count();
    CHECK(cudaMemcpy(b + G - 32, host, sizeof host, cudaMemcpyHostToDevice) != cudaSuccess);
    CHECK_REPORT(before, "cudaMemcpy", "touches an unmapped part of the", address(b));
}

static void read_mapping_from_host(void *ctx)
{
    char **where = ctx;
    char *b = reserve_with_a_hole(3);
    *where = b;
    CUDA_OK(cudaMemset(b + 2 * G, 0, G));
    CUDA_OK(cudaDeviceSynchronize());
    volatile char *p = b + 2 * G + 8;
    printf("%d\n", *p); /* the bug: device memory dereferenced on the host */
}

TEST(test_cusim_vmm_host_code_reading_a_mapping_dies_naming_it)
{
    vmm_emulator();
    char **where = mmap(NULL, sizeof *where, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(where != MAP_FAILED);
    static const char *protect[] = {"1",
                                    "mprotect"}; /* protection keys where the CPU has them; the fallback */
    for (int k = 0; k < 2; k++) {
        setenv("EMBER_CUSIM_PROTECT", protect[k], 1);
        char err[4096];
        int status = run_child(read_mapping_from_host, where, err, sizeof err);
        if (!WIFSIGNALED(status))
            th_fail(__FILE__, __LINE__, "EMBER_CUSIM_PROTECT=%s: the child lived: %s", protect[k], err);
        char want[200];
        snprintf(want, sizeof want,
                 "host code dereferenced device memory at %p (8 bytes into a %zu-byte mapping in "
                 "the range reserved at %p on cuda:0)",
                 (void *)(*where + 2 * G + 8), G, (void *)*where);
        if (!strstr(err, want))
            th_fail(__FILE__, __LINE__, "EMBER_CUSIM_PROTECT=%s: stderr lacks \"%s\": %s", protect[k], want,
                    err);
    }
}

/* ---- the driver's rules ------------------------------------------------------------------- */

/* call returns want and the last report says why */
#define CHECK_REFUSED(call, want, why)                                                                       \
    do {                                                                                                     \
        int th_before = cusim_report_count();                                                                \
        CUresult th_r = (call);                                                                              \
        if (th_r != (want)) th_fail(__FILE__, __LINE__, "%s gave CUresult %d", #call, (int)th_r);            \
        CHECK_REPORT(th_before, why);                                                                        \
    } while (0)

TEST(test_cusim_vmm_calls_breaking_the_drivers_rules_fail_and_are_reported)
{
    vmm_emulator();
    capture_stderr();
    char *b = reserve_with_a_hole(4);
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)b;
    CUmemAllocationProp p = device0();
    CUmemGenericAllocationHandle h, h2;
    CUdeviceptr r;
    CHECK_REFUSED(cuMemAddressReserve(&r, G + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE, "host page");
    CHECK_REFUSED(cuMemAddressReserve(&r, G, 3 * G, 0, 0), CUDA_ERROR_INVALID_VALUE, "power of two");
    CHECK_REFUSED(cuMemCreate(&h, G / 2, &p, 0), CUDA_ERROR_INVALID_VALUE, "multiple of the granularity");
    CU_OK(cuMemCreate(&h, 2 * G, &p, 0));
    CHECK_REFUSED(cuMemMap(at + G, G, G, h, 0), CUDA_ERROR_INVALID_VALUE, "offset");
    CHECK_REFUSED(cuMemMap(at + G, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE,
                  "overlaps the mapping"); /* granule 2 */
    CHECK_REFUSED(cuMemMap(at + 3 * G, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE,
                  "not inside one reserved range");
    CHECK_REFUSED(cuMemMap(at + G + 8, G, 0, h, 0), CUDA_ERROR_INVALID_VALUE, "multiples of the granularity");
    CU_OK(cuMemUnmap(at + 2 * G, G));
    CU_OK(cuMemMap(at + G, 2 * G, 0, h, 0)); /* granules 1-2 as one mapping */
    CU_OK(cuMemRelease(h));
    CHECK_REFUSED(cuMemUnmap(at + G, G), CUDA_ERROR_INVALID_VALUE, "cannot be unmapped in part");
    CUmemAccessDesc a = {p.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK_REFUSED(cuMemSetAccess(at + G, 3 * G, &a, 1), CUDA_ERROR_INVALID_VALUE, "fully mapped");
    CHECK_REFUSED(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE, "not a live allocation");
    CU_OK(cuMemCreate(&h2, G, &p, 0));
    CU_OK(cuMemRelease(h2));
    CHECK_REFUSED(cuMemMap(at + 3 * G, G, 0, h2, 0), CUDA_ERROR_INVALID_VALUE, "not a live allocation");
    CHECK_REFUSED(cuMemAddressFree(at, 4 * G), CUDA_ERROR_INVALID_VALUE, "still has 2 mappings");
    CHECK_REFUSED(cuMemAddressFree(at, 3 * G), CUDA_ERROR_INVALID_VALUE, "differs from the");
    CU_OK(cuMemUnmap(at, 3 * G)); /* several whole mappings at once */
    CU_OK(cuMemAddressFree(at, 4 * G));
}

/* ---- memory and contents ------------------------------------------------------------------ */

TEST(test_cusim_vmm_memory_counts_until_released_and_unmapped)
{
    vmm_emulator();
    char mem[32];
    snprintf(mem, sizeof mem, "%zu", 3 * (size_t)sysconf(_SC_PAGESIZE)); /* a device of three granules */
    setenv("EMBER_CUSIM_MEMORY", mem, 1);
    capture_stderr();
    CUmemAllocationProp p = device0();
    CUmemGenericAllocationHandle h1, h2, h3;
    CUdeviceptr base;
    CU_OK(cuMemAddressReserve(&base, 2 * G, 0, 0, 0));
    CU_OK(cuMemCreate(&h1, 2 * G, &p, 0));
    CHECK(cuMemCreate(&h2, 2 * G, &p, 0) == CUDA_ERROR_OUT_OF_MEMORY); /* 4 granules > 3 */
    CU_OK(cuMemMap(base, 2 * G, 0, h1, 0));
    CU_OK(cuMemRelease(h1)); /* mapped: still held */
    CHECK(cuMemCreate(&h2, 2 * G, &p, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    void *d = NULL;
    CHECK(cudaMalloc(&d, 2 * G) == cudaErrorMemoryAllocation); /* one count for both kinds */
    cudaGetLastError();
    CU_OK(cuMemUnmap(base, 2 * G)); /* released and unmapped: gone */
    CU_OK(cuMemCreate(&h2, 2 * G, &p, 0));
    CU_OK(cuMemCreate(&h3, G, &p, 0));
    CU_OK(cuMemRelease(h2));
    CU_OK(cuMemRelease(h3));
    CU_OK(cuMemAddressFree(base, 2 * G));
}

TEST(test_cusim_vmm_contents_survive_an_unmap_and_are_0xff_when_new)
{
    vmm_emulator();
    CUmemAllocationProp p = device0();
    CUmemAccessDesc a = {p.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUmemGenericAllocationHandle h;
    CUdeviceptr r1, r2;
    CU_OK(cuMemAddressReserve(&r1, G, 0, 0, 0));
    CU_OK(cuMemAddressReserve(&r2, G, 0, 0, 0));
    CU_OK(cuMemCreate(&h, G, &p, 0));
    CU_OK(cuMemMap(r1, G, 0, h, 0));
    CU_OK(cuMemSetAccess(r1, G, &a, 1));
    unsigned char got[16];
    CUDA_OK(cudaMemcpy(got, (void *)(uintptr_t)r1, sizeof got, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sizeof got; i++) CHECK(got[i] == 0xff); /* undefined on a GPU: NaN here */
    CUDA_OK(cudaMemset((void *)(uintptr_t)r1, 7, G));
    CUDA_OK(cudaDeviceSynchronize());
    CU_OK(cuMemUnmap(r1, G));
    CU_OK(cuMemMap(r2, G, 0, h, 0)); /* the same memory at another address */
    CU_OK(cuMemSetAccess(r2, G, &a, 1));
    CUDA_OK(cudaMemcpy(got, (void *)(uintptr_t)r2, sizeof got, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sizeof got; i++) CHECK(got[i] == 7);
    CU_OK(cuMemUnmap(r2, G));
    CU_OK(cuMemRelease(h));
    CU_OK(cuMemAddressFree(r1, G));
    CU_OK(cuMemAddressFree(r2, G));
}

TEST(test_cusim_vmm_driver_entry_points_come_through_the_runtime)
{
    vmm_emulator();
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    CUDA_OK(cudaGetDriverEntryPointByVersion("cuMemMap", &fn, 12000, cudaEnableDefault, &q));
    CHECK(fn == (void *)cuMemMap && q == cudaDriverEntryPointSuccess);
    CUDA_OK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 12000, cudaEnableDefault, &q));
    CHECK(fn == NULL && q == cudaDriverEntryPointSymbolNotFound); /* not served */
    CHECK(cudaGetDriverEntryPointByVersion("cuMemMap", &fn, 99000, cudaEnableDefault, &q) ==
          cudaErrorInvalidValue);
}

#endif
