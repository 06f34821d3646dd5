/* cmd_env.c — `ember env [--json]`: what this build is and what this machine
 * offers it: version, build options, CPU model and vector features, threads,
 * BLAS, the product path each dtype's matmuls take, CUDA/NCCL. The first
 * thing to paste into a bug report. */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "ember/ember.h"
#include "ember_config.h"
#include "tensor/kernel_impl.h"

static const char env_usage[] =
    "usage: ember env [--json]\n"
    "Prints ember's version and build options, the CPU model and its vector features,\n"
    "logical cores and ember's thread count, the BLAS library, the product path\n"
    "matmuls of each dtype take on the CPU (f32: avx2 or sgemm, EMBER_F32_PATH forces one;\n"
    "bf16: amx, avx512bf16 or f32, EMBER_BF16_PATH forces one), and CUDA/NCCL status.\n"
    "  --json   the same as one JSON object\n";

typedef struct env_info {
    const char *version;
    em_build_info build;
    const char *sanitize; /* meson b_sanitize, e.g. "address,undefined" or "none" */
    bool native;          /* compiled with -march=native */
    char cpu_model[256];
    em_cpu_features feat;
    int cores_online, cores_usable;
    int threads;
    const char *blas_config;
    int blas_threads;
    /* em_matmul_path; path_f32 or path_bf16 NULL: f32_error or bf16_error says why */
    const char *path_f32, *path_f16, *path_bf16;
    char f32_error[512], bf16_error[512];
    int cuda_devices;
    int cuda_driver, cuda_runtime, nccl_version; /* 0 where absent */
    em_cuda_device_info dev[8];                  /* the first min(cuda_devices, 8) */
} env_info;

/* "12.4" from CUDA's 12040 (NCCL: "2.19.5" from 21905), or "none" */
static const char *cuda_ver(int v, bool nccl, char *buf, size_t n)
{
    if (v <= 0)
        snprintf(buf, n, "none");
    else if (nccl)
        snprintf(buf, n, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else
        snprintf(buf, n, "%d.%d", v / 1000, v / 10 % 100);
    return buf;
}

/* "model name" from /proc/cpuinfo; else the cpuid brand string; else "unknown" */
static void cpu_model(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *s = colon + 1;
        while (*s == ' ' || *s == '\t') s++;
        size_t n = strcspn(s, "\n");
        while (n > 0 && s[n - 1] == ' ') n--;
        snprintf(out, cap, "%.*s", (int)n, s);
        break;
    }
    fclose(f);
}

static void gather(env_info *e)
{
    e->version = em_version();
    e->build = em_build();
    e->sanitize = EM_SANITIZE;
    e->native = EM_NATIVE;
    cpu_model(e->cpu_model, sizeof e->cpu_model);
    e->feat = em_cpu_detect();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    e->cores_online = online > 0 ? (int)online : 1;
    cpu_set_t set;
    e->cores_usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : e->cores_online;
    e->threads = em_num_threads();
    e->blas_config = em_blas_config();
    e->blas_threads = em_blas_threads();
    e->path_f32 = em_matmul_path(EM_F32);
    snprintf(e->f32_error, sizeof e->f32_error, "%s", e->path_f32 ? "" : em_last_error());
    e->path_f16 = em_matmul_path(EM_F16);
    e->path_bf16 = em_matmul_path(EM_BF16);
    snprintf(e->bf16_error, sizeof e->bf16_error, "%s", e->path_bf16 ? "" : em_last_error());
    e->cuda_devices = em_cuda_device_count();
    em_cuda_versions(&e->cuda_driver, &e->cuda_runtime, &e->nccl_version);
    for (int i = 0; i < e->cuda_devices && i < 8; i++)
        if (em_cuda_device_info_of(i, &e->dev[i])) snprintf(e->dev[i].name, sizeof e->dev[i].name, "(unreadable)");
    em_clear_error();
}

static const char *yes_no(bool b) { return b ? "yes" : "no"; }

/* what a path name means, for the text form */
static const char *path_says(const char *path, const char *dtype)
{
    if (!strcmp(path, "sgemm")) return "BLAS sgemm, split over ember's pool";
    if (!strcmp(path, "avx2"))
        return "ember's 6x16 AVX2+FMA kernel, split over ember's pool (EMBER_F32_PATH=sgemm: the BLAS)";
    if (!strcmp(path, "avx512"))
        return "ember's 6x32 AVX-512F kernel (auto takes it where the BLAS runs no AVX-512 sgemm), split "
               "over ember's pool "
               "(EMBER_F32_PATH=sgemm: the BLAS)";
    if (!strcmp(path, "amx")) return "AMX tiles, f32 accumulation; autocast casts f32 operands to bf16 first";
    if (!strcmp(path, "avx512bf16"))
        return "AVX512-BF16 (VDPBF16PS), f32 accumulation; autocast casts f32 operands to bf16 first";
    if (!strcmp(path, "f32"))
        return !strcmp(dtype, "bf16")
                   ? "kept in bf16, widened to f32 block by block inside ember's GEMM; autocast's "
                     "f32 operands rounded to bf16 there, never copied"
                   : "kept in f16, widened to f32 block by block inside ember's GEMM; autocast's "
                     "f32 operands rounded to f16 there, never copied";
    return "";
}

/* ", on <kernel>" for a low-precision path that runs on ember's own GEMM
 * ("f32"): the micro-kernel it takes here (tensor/gemm_widen.c), else "" */
static const char *low_kernel(const char *path)
{
    if (!path || strcmp(path, "f32") || !gemm_widen_usable()) return "";
    return gemm_wide_now() ? ", on its 6x32 AVX-512F kernel" : ", on its 6x16 AVX2 kernel";
}

static void print_text(const env_info *e)
{
    const em_cpu_features *f = &e->feat;
    printf("version        %s\n", e->version);
    printf("build          %s, %s, sanitizers: %s, -march=native: %s\n", e->build.buildtype,
           e->build.compiler, e->sanitize, yes_no(e->native));
    printf("cpu            %s\n", e->cpu_model);
    printf("cpu features   AVX %s, AVX2 %s, FMA %s, F16C %s, AVX-512F %s, AVX512-BF16 %s\n", yes_no(f->avx),
           yes_no(f->avx2), yes_no(f->fma), yes_no(f->f16c), yes_no(f->avx512f), yes_no(f->avx512bf16));
    if (e->cores_usable != e->cores_online)
        printf("cores          %d logical (%d usable by this process)\n", e->cores_online, e->cores_usable);
    else
        printf("cores          %d logical\n", e->cores_online);
    printf("threads        %d (ember's pool; set EMBER_NUM_THREADS to change)\n", e->threads);
    printf("BLAS           %s: %s\n", e->build.blas, e->blas_config);
    if (e->blas_threads > 0)
        printf("BLAS threads   %d per call (ember splits each GEMM over its own pool instead)\n", e->blas_threads);
    else
        printf("BLAS threads   unknown\n");
    if (e->path_f32)
        printf("matmul f32     %s: %s\n", e->path_f32, path_says(e->path_f32, "f32"));
    else
        printf("matmul f32     none: %s\n", e->f32_error);
    if (e->path_bf16)
        printf("matmul bf16    %s: %s%s\n", e->path_bf16, path_says(e->path_bf16, "bf16"),
               low_kernel(e->path_bf16));
    else
        printf("matmul bf16    none: %s\n", e->bf16_error);
    printf("matmul f16     %s: %s%s\n", e->path_f16, path_says(e->path_f16, "f16"), low_kernel(e->path_f16));
    char a[32], b[32];
    if (e->build.cuda)
        printf("CUDA           built in; driver %s, runtime %s; %d device%s visible\n",
               cuda_ver(e->cuda_driver, false, a, sizeof a), cuda_ver(e->cuda_runtime, false, b, sizeof b),
               e->cuda_devices, e->cuda_devices == 1 ? "" : "s");
    else
        printf("CUDA           not built (no toolkit found, or -Dcuda=disabled)\n");
    for (int i = 0; i < e->cuda_devices && i < 8; i++)
        printf("cuda:%d         %s, compute capability %d.%d, %d SMs, %.1f GiB\n", i, e->dev[i].name,
               e->dev[i].major, e->dev[i].minor, e->dev[i].multiprocessors,
               (double)e->dev[i].total_memory / (1 << 30));
    if (e->build.nccl)
        printf("NCCL           built in, version %s%s\n", cuda_ver(e->nccl_version, true, a, sizeof a),
               e->cuda_devices > 0 ? "" : " (no CUDA device to use it)");
    else
        printf("NCCL           not built\n");
    if (e->build.mpi)
        printf("MPI            transport built in (EMBER_TRANSPORT=mpi; chosen by itself under mpirun/srun "
               "--mpi)\n");
    else
        printf("MPI            transport not built (install openmpi-bin and libopenmpi-dev, then "
               "reconfigure)\n");
}

/* s as a JSON string literal */
static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static const char *tf(bool b) { return b ? "true" : "false"; }

static void print_json(const env_info *e)
{
    const em_cpu_features *f = &e->feat;
    printf("{\"version\": ");
    json_str(e->version);
    printf(", \"build\": {\"buildtype\": ");
    json_str(e->build.buildtype);
    printf(", \"compiler\": ");
    json_str(e->build.compiler);
    printf(", \"sanitizers\": ");
    json_str(e->sanitize);
    printf(", \"march_native\": %s, \"cuda\": %s, \"nccl\": %s}", tf(e->native), tf(e->build.cuda),
           tf(e->build.nccl));
    printf(", \"cpu\": {\"model\": ");
    json_str(e->cpu_model);
    printf(", \"features\": {\"avx\": %s, \"avx2\": %s, \"fma\": %s, \"f16c\": %s, \"avx512f\": %s, "
           "\"avx512bf16\": %s}",
           tf(f->avx), tf(f->avx2), tf(f->fma), tf(f->f16c), tf(f->avx512f), tf(f->avx512bf16));
    printf(", \"logical_cores\": %d, \"usable_cores\": %d}", e->cores_online, e->cores_usable);
    printf(", \"threads\": %d", e->threads);
    printf(", \"blas\": {\"name\": ");
    json_str(e->build.blas);
    printf(", \"config\": ");
    json_str(e->blas_config);
    printf(", \"threads\": %d}", e->blas_threads);
    printf(", \"matmul_paths\": {\"f32\": ");
    if (e->path_f32)
        json_str(e->path_f32);
    else
        printf("null, \"f32_error\": "), json_str(e->f32_error);
    printf(", \"bf16\": ");
    if (e->path_bf16)
        json_str(e->path_bf16);
    else
        printf("null, \"bf16_error\": "), json_str(e->bf16_error);
    printf(", \"f16\": ");
    json_str(e->path_f16);
    printf("}");
    printf(", \"cuda\": {\"built\": %s, \"driver\": %d, \"runtime\": %d, \"devices\": [", tf(e->build.cuda),
           e->cuda_driver, e->cuda_runtime);
    for (int i = 0; i < e->cuda_devices && i < 8; i++) {
        printf("%s{\"name\": ", i ? ", " : "");
        json_str(e->dev[i].name);
        printf(", \"capability\": \"%d.%d\", \"multiprocessors\": %d, \"memory_bytes\": %zu}", e->dev[i].major,
               e->dev[i].minor, e->dev[i].multiprocessors, e->dev[i].total_memory);
    }
    printf("]}");
    printf(", \"nccl\": {\"built\": %s, \"version\": %d}, \"mpi\": {\"built\": %s}}\n", tf(e->build.nccl),
           e->nccl_version, tf(e->build.mpi));
}

int cmd_env(int argc, char **argv)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(env_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "ember env: unknown %s '%s'\n\n", argv[i][0] == '-' ? "flag" : "argument",
                    argv[i]);
            fputs(env_usage, stderr);
            return 2;
        }
    }
    env_info e;
    gather(&e);
    if (json)
        print_json(&e);
    else
        print_text(&e);
    return 0;
}
