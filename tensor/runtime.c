/* runtime.c — what this build and this machine are: version, build options
 * (from the generated ember_config.h), CPU features (cpuid + xgetbv), the BLAS
 * library in use and the CUDA devices visible. Backs `ember env`. */
#include <strings.h>

#include "ember/runtime.h"
#include "ember_config.h"
#include "kernel_impl.h"
#include "tensor_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define EM_X86 1
#else
#define EM_X86 0
#endif

#if EM_HAVE_CUDA
#include <dlfcn.h>
#if EM_CUDA_SIM
#include <cuda_runtime_api.h>
#endif
#endif

const char *em_version(void) { return EM_VERSION; }

#if EM_X86
/* The OS-enabled register state (XCR0): which vector registers the kernel
 * saves on a context switch. A feature the CPU has but the OS does not save
 * cannot be used. */
static uint64_t xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* The CPU's features, read with cpuid (a trap to the hypervisor in a VM). */
static em_cpu_features detect(void)
{
    em_cpu_features f = {0};
#if EM_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    bool osxsave = c & (1u << 27);
    /* XCR0 bits 1,2: SSE and AVX (YMM) state; bits 5,6,7: opmask, ZMM0-15 hi, ZMM16-31 */
    uint64_t xcr = osxsave ? xcr0() : 0;
    bool os_avx = (xcr & 0x6) == 0x6;
    bool os_avx512 = (xcr & 0xe6) == 0xe6;
    f.avx = os_avx && (c & (1u << 28));
    f.fma = f.avx && (c & (1u << 12));
    f.f16c = f.avx && (c & (1u << 29));
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        unsigned max_sub = a;
        f.avx2 = f.avx && (b & (1u << 5));
        f.avx512f = os_avx512 && (b & (1u << 16));
        if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
            f.avx512bf16 = f.avx512f && (a & (1u << 5));
    }
#endif
    return f;
}

em_cpu_features em_cpu_detect(void)
{
    /* asked once: the kernels' dispatch calls this at every product. The
     * answer is kept as bits in one int (bit 0: known), so threads that
     * race on the first call store the same value without a data race. */
    static int bits;
    int b = __atomic_load_n(&bits, __ATOMIC_RELAXED);
    if (!b) {
        em_cpu_features f = detect();
        b = 1 | f.avx << 1 | f.avx2 << 2 | f.fma << 3 | f.avx512f << 4 | f.avx512bf16 << 5 | f.f16c << 6;
        __atomic_store_n(&bits, b, __ATOMIC_RELAXED);
    }
    return (em_cpu_features){.avx = b >> 1 & 1,
                             .avx2 = b >> 2 & 1,
                             .fma = b >> 3 & 1,
                             .avx512f = b >> 4 & 1,
                             .avx512bf16 = b >> 5 & 1,
                             .f16c = b >> 6 & 1};
}

em_build_info em_build(void)
{
    return (em_build_info){
        .buildtype = EM_BUILDTYPE,
        .compiler = EM_COMPILER,
        .sanitizers = EM_SANITIZED,
        .cuda = EM_HAVE_CUDA,
        .nccl = EM_HAVE_NCCL,
        .mpi = EM_HAVE_MPI,
        .blas = EM_BLAS_NAME,
    };
}

#if EM_BLAS_OPENBLAS
/* OpenBLAS's own entry points (cblas.h declares them, but not every
 * distribution installs that header beside the library's .pc file). */
char *openblas_get_config(void);
char *openblas_get_corename(void);
int openblas_get_num_threads(void);
#endif

bool blas_sgemm_avx512(void)
{
#if EM_BLAS_OPENBLAS
    /* the kernels OpenBLAS chose for this CPU (OPENBLAS_CORETYPE can force
     * them); 0.3.21 does not know Zen 5 and runs Haswell's AVX2 ones there */
    static const char *const wide[] = {"skylakex", "cooperlake", "sapphirerapids"};
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof wide / sizeof wide[0]; i++)
        if (!strcasecmp(core, wide[i])) return true;
    return false;
#else
    return true; /* cannot say: taken to have them */
#endif
}

/* OpenBLAS's build description ("OpenBLAS 0.3.21 DYNAMIC_ARCH ..."), or a note
 * saying the BLAS in use cannot describe itself. */
const char *em_blas_config(void)
{
#if EM_BLAS_OPENBLAS
    const char *s = openblas_get_config();
    return s ? s : "unknown";
#else
    return "unknown (not OpenBLAS)";
#endif
}

/* The threads BLAS uses inside one call; 0 when the library cannot say. */
int em_blas_threads(void)
{
#if EM_BLAS_OPENBLAS
    return openblas_get_num_threads();
#else
    return 0;
#endif
}

/* Asks the CUDA driver (libcuda, loaded at run time so that a machine with
 * the toolkit but no driver or GPU still runs) how many devices it sees. */
int em_cuda_device_count(void)
{
#if EM_CUDA_SIM
    /* the emulator's devices (EMBER_CUSIM_DEVICES of them) */
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    return n;
#elif EM_HAVE_CUDA
    static int cached = -1;
    if (cached >= 0) return cached;
    int n = 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
        int (*count)(int *) = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
        if (!init || !count || init(0) != 0 || count(&n) != 0) n = 0;
        /* libcuda stays loaded: unloading a driver library that started threads is unsafe */
    }
    cached = n;
    return n;
#else
    return 0;
#endif
}
