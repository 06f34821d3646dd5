/* test_cuda_blas.c — cuBLAS is opened only when a device multiplies
 * (tensor/cuda_blas.c, cublas_api.h): a CPU-only process never maps it,
 * a library that cannot be loaded is an error naming it, and the table
 * resolves every call ember makes. Each test runs in its own process, so
 * "not loaded yet" is this test's own state. */
#include <stdio.h>
#include <string.h>

#include "cuda_test.h"
#include "ember_config.h"

#if EM_HAVE_CUDA
#include "tensor/cublas_api.h"

/* whether a file whose name contains `name` is mapped into this process */
static bool mapped(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
    fclose(f);
    return found;
}

TEST(test_cublas_is_not_opened_by_cpu_work)
{
    em_scope s = em_scope_begin();
    em_rng r = em_rng_new(1);
    em_tensor *x = em_randn(EM_F32, EM_SHAPE(64, 32), &r), *w = em_randn(EM_F32, EM_SHAPE(32, 48), &r);
    CHECK_OK(em_set_requires_grad(w, true));
    CHECK_OK(em_backward(em_sum(em_matmul(x, w), 0, NULL, false), NULL));
    (void)em_cuda_device_count(); /* asking for devices loads the runtime, not cuBLAS */
    CHECK(!cublas_loaded());
    CHECK(!mapped("libcublas")); /* neither linked nor opened: no libcublasLt's 150 MB */
    em_scope_end(s);
}

TEST(test_cublas_is_opened_by_a_device_product)
{
    CUDA_OR_SKIP();
    em_scope s = em_scope_begin();
    CHECK(!cublas_loaded());
    em_tensor *a = ct_on_cuda(em_full(EM_F32, EM_SHAPE(4, 3), 1.0)),
              *b = ct_on_cuda(em_full(EM_F32, EM_SHAPE(3, 2), 2.0));
    em_tensor *c = ct_on_cpu(em_matmul(a, b));
    CHECK(c != NULL);
    CHECK(((float *)em_data(c))[0] == 6.0f);
    CHECK(cublas_loaded());
    em_scope_end(s);
}

TEST(test_cublas_load_names_a_library_that_is_missing)
{
    cublas_api t;
    CHECK_ERR(cublas_load_for_test("libcublas_absent_for_test.so.99", &t), EM_ERR_DEVICE,
              "libcublas_absent_for_test.so.99");
}

TEST(test_cublas_load_names_the_symbol_a_library_lacks)
{
    cublas_api t;
    CHECK_ERR(cublas_load_for_test("libm.so.6", &t), EM_ERR_DEVICE, "libm.so.6 has no symbol cublasCreate");
}

TEST(test_cublas_load_resolves_every_call_of_the_toolkit_library)
{
#if EM_CUDA_SIM
    SKIP("the CUDA emulator build has no cuBLAS library to open (its table is the emulator's)");
#else
    cublas_api t;
    memset(&t, 0, sizeof t);
    char soname[64];
    snprintf(soname, sizeof soname, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    CHECK_OK(cublas_load_for_test(soname, &t));
    CHECK(t.create && t.set_stream && t.set_math_mode && t.gemm_strided_batched_ex && t.status_string);
    CHECK(strlen(t.status_string(CUBLAS_STATUS_SUCCESS)) > 0); /* callable without a device */
#endif
}

#else

TEST(test_cublas_is_not_opened_by_cpu_work) { SKIP("built without CUDA"); }

#endif
