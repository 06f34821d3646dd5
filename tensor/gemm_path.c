/* gemm_path.c — which product path each dtype's CPU matmuls take, chosen once
 * per process from the CPU's features and EMBER_F32_PATH / EMBER_BF16_PATH;
 * em_matmul_path tells users (ember env, the benchmarks).
 *
 * f32 has three paths:
 *   avx2    ember's own GEMM (tensor/gemm_widen.c: 6x16 AVX2+FMA micro-
 *           kernel, the blocking the bf16 path widens in, nothing rounded),
 *           the default on CPUs with AVX2+FMA and no AVX-512F, where it
 *           measured 0.95-1.2x OpenBLAS's sgemm at the GPT's products
 *           (Zen 3, bench/bench_f32_paths; em_gemm leaves the few where it
 *           was slower to the BLAS);
 *   avx512  the same GEMM with a 6x32 AVX-512F micro-kernel for pairs of
 *           panels: the default on AVX-512F CPUs whose BLAS runs no
 *           AVX-512 sgemm there (OpenBLAS 0.3.21 on Zen 5 picks its
 *           Haswell kernels: there this path measured 1.5-1.96x sgemm);
 *   sgemm   the BLAS, everywhere else: on AVX-512 CPUs whose OpenBLAS runs
 *           its SkylakeX/Cooperlake kernels, about as fast as the avx512
 *           path per product and 3-4% faster over a tiny GPT step (Zen 5
 *           with OPENBLAS_CORETYPE=Cooperlake, bench/bench_f32_paths,
 *           bench_train amp).
 *
 * bf16 has three paths, fastest first:
 *   amx         AMX tile products (tensor/gemm_bf16.c), where the CPU has AMX
 *               and the kernel grants this process the tile state;
 *   avx512bf16  VDPBF16PS on zmm registers (tensor/gemm_dpbf16.c), where the
 *               CPU has AVX512-BF16 (Zen 4, Cooper Lake, Sapphire Rapids);
 *   f32         everywhere else: the operands stay bf16 in memory and are
 *               widened to f32 block by block inside the GEMM, next to the
 *               sgemm that multiplies them (tensor/gemm.c), so mixed
 *               precision is never slower than f32 for want of a bf16 unit.
 * All three accumulate in f32 and round each result to bf16 once.
 * EMBER_BF16_PATH=auto|f32|avx512bf16|amx forces one (for tests and
 * comparisons); a path this CPU cannot run is an error, never a crash.
 * EMBER_NO_AMX=1 (older) keeps auto off AMX. The tests alone can run the
 * avx512bf16 path on a CPU without the instruction, on the kernel's own
 * source compiled against ember's emulation of its intrinsics
 * (gemm_dpbf16_use_kernel_for_test, tensor/gemm_dpbf16_emu.c); no setting
 * reaches that.
 *
 * Where the product is computed in f32 anyway (bf16 on the f32 path, f16
 * always), it also reads f32 operands as they are, rounding each to the low
 * dtype as it packs it (gemm_low_reads_f32): autocast then leaves a
 * matmul's f32 operands uncast (tensor/dispatch.c), so a bf16 step makes no
 * bf16 copy of the weights. On amx and avx512bf16 the kernels want bf16
 * operands, and a copy made once per step pays for itself in the faster
 * product, so autocast casts there as before. */
#include <stdlib.h>
#include <string.h>

#include "ember/runtime.h"
#include "kernel_impl.h"
#include "settings_impl.h"

static const char *const path_names[] = {
    [BF16_PATH_F32] = "f32", [BF16_PATH_AVX512BF16] = "avx512bf16", [BF16_PATH_AMX] = "amx"};

/* 0: not chosen yet; else 1 + the path */
static int resolved;

/* The path first chosen in this process (*slot holds 1 + it), p if none was. */
static int first_choice(int *slot, int p)
{
    int r = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (r == 0) {
        __atomic_compare_exchange_n(slot, &r, 1 + p, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        r = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    }
    return r - 1;
}

/* tests: the kernel the avx512bf16 path runs on a CPU without VDPBF16PS
 * (gemm_dpbf16_use_kernel_for_test); NULL in every program but the tests */
static dp_kernel test_kernel;

void gemm_dpbf16_use_kernel_for_test(dp_kernel k)
{
    __atomic_store_n(&test_kernel, k, __ATOMIC_RELEASE);
    gemm_bf16_path_reset();
}

dp_kernel gemm_dpbf16_kernel(void)
{
    dp_kernel k = __atomic_load_n(&test_kernel, __ATOMIC_ACQUIRE);
    return k ? k : dp_kernel_avx512;
}

/* The path the environment asks for on this CPU, or an error naming why not. */
static em_status resolve(bf16_path *out)
{
    bool no_amx = false;
    em_status s = setting_env_bool("EMBER_NO_AMX", &no_amx);
    if (s) return s;
    const char *v = getenv("EMBER_BF16_PATH");
    bool amx = gemm_bf16_amx_usable();
    /* a test's kernel stands in for VDPBF16PS (gemm_dpbf16_use_kernel_for_test) */
    bool dp = gemm_dpbf16_usable() || __atomic_load_n(&test_kernel, __ATOMIC_ACQUIRE) != NULL;
    if (!v || !v[0] || !strcmp(v, "auto")) {
        *out = amx && !no_amx ? BF16_PATH_AMX : dp ? BF16_PATH_AVX512BF16 : BF16_PATH_F32;
        return EM_OK;
    }
    if (!strcmp(v, "f32")) {
        *out = BF16_PATH_F32;
        return EM_OK;
    }
    if (!strcmp(v, "avx512bf16")) {
        if (!dp)
            return em_err(
                EM_ERR_UNSUPPORTED,
                "EMBER_BF16_PATH=avx512bf16: this CPU (or build) has no AVX512-BF16; use auto or f32");
        *out = BF16_PATH_AVX512BF16;
        return EM_OK;
    }
    if (!strcmp(v, "amx")) {
        if (!amx)
            return em_err(EM_ERR_UNSUPPORTED,
                          "EMBER_BF16_PATH=amx: AMX is not usable here (no AMX-BF16 on this CPU, the kernel "
                          "refused the tile state, or this build lacks it); use auto or f32");
        *out = BF16_PATH_AMX;
        return EM_OK;
    }
    return em_err(EM_ERR_ARG, "EMBER_BF16_PATH='%s' is not one of auto, f32, avx512bf16, amx", v);
}

em_status gemm_bf16_path(bf16_path *out)
{
    /* the settings are checked at every product, so a bad value set later
     * is still an error; the path chosen first stays for the process */
    bf16_path p = BF16_PATH_F32;
    em_status s = resolve(&p);
    if (s) return s;
    *out = (bf16_path)first_choice(&resolved, (int)p);
    return EM_OK;
}

void gemm_bf16_path_reset(void) { __atomic_store_n(&resolved, 0, __ATOMIC_RELEASE); }

const char *gemm_bf16_path_name(bf16_path p) { return path_names[p]; }

/* ---- f32 -------------------------------------------------------------------------------- */

static const char *const f32_names[] = {
    [F32_PATH_SGEMM] = "sgemm", [F32_PATH_AVX2] = "avx2", [F32_PATH_AVX512] = "avx512"};
static int f32_resolved; /* 0: not chosen yet; else 1 + the path */

static em_status f32_resolve(f32_path *out)
{
    const char *v = getenv("EMBER_F32_PATH");
    if (!v || !v[0] || !strcmp(v, "auto")) {
        /* ember's kernel where the BLAS has none as wide; the BLAS's AVX-512
         * kernels where it has them (see the comment at the top) */
        bool wide = gemm_wide_usable(), blas_wide = blas_sgemm_avx512();
        *out = wide && !blas_wide                                ? F32_PATH_AVX512
               : gemm_widen_usable() && !em_cpu_detect().avx512f ? F32_PATH_AVX2
                                                                 : F32_PATH_SGEMM;
        return EM_OK;
    }
    if (!strcmp(v, "sgemm")) {
        *out = F32_PATH_SGEMM;
        return EM_OK;
    }
    if (!strcmp(v, "avx2")) {
        if (!gemm_widen_usable())
            return em_err(EM_ERR_UNSUPPORTED,
                          "EMBER_F32_PATH=avx2: this CPU (or build) has no AVX2+FMA+F16C; use auto or sgemm");
        *out = F32_PATH_AVX2;
        return EM_OK;
    }
    if (!strcmp(v, "avx512")) {
        if (!gemm_wide_usable())
            return em_err(
                EM_ERR_UNSUPPORTED,
                "EMBER_F32_PATH=avx512: this CPU (or build) has no AVX-512F; use auto, avx2 or sgemm");
        *out = F32_PATH_AVX512;
        return EM_OK;
    }
    return em_err(EM_ERR_ARG, "EMBER_F32_PATH='%s' is not one of auto, sgemm, avx2, avx512", v);
}

em_status gemm_f32_path(f32_path *out)
{
    /* checked at every product, chosen once, as for bf16 */
    f32_path p = F32_PATH_SGEMM;
    em_status s = f32_resolve(&p);
    if (s) return s;
    *out = (f32_path)first_choice(&f32_resolved, (int)p);
    return EM_OK;
}

f32_path gemm_f32_path_chosen(void)
{
    int r = __atomic_load_n(&f32_resolved, __ATOMIC_ACQUIRE);
    if (r) return (f32_path)(r - 1);
    f32_path p;
    if (!gemm_f32_path(&p)) return p;
    em_clear_error(); /* a bad setting: the BLAS here; the matmul op reports it */
    return F32_PATH_SGEMM;
}

void gemm_f32_path_reset(void) { __atomic_store_n(&f32_resolved, 0, __ATOMIC_RELEASE); }

const char *em_matmul_path(em_dtype dt)
{
    bf16_path p;
    f32_path fp;
    switch (dt) {
    case EM_F32: return gemm_f32_path(&fp) ? NULL : f32_names[fp];
    case EM_F64: return "dgemm";
    case EM_F16: return "f32";
    case EM_BF16: return gemm_bf16_path(&p) ? NULL : path_names[p];
    case EM_I32:
    case EM_U8: return "dgemm";
    case EM_BOOL:
    case EM_NUM_DTYPES: break;
    }
    em_err(EM_ERR_DTYPE, "em_matmul_path: matmul takes no %s tensors", em_dtype_name(dt));
    return NULL;
}

/* The bf16 path, or -1 where the setting is bad (the product itself
 * reports it) */
static int bf16_path_or_none(void)
{
    bf16_path p;
    if (!gemm_bf16_path(&p)) return (int)p;
    em_clear_error();
    return -1;
}

bool gemm_low_reads_f32(em_dtype lo)
{
    return lo == EM_F16 || (lo == EM_BF16 && bf16_path_or_none() == BF16_PATH_F32);
}

bool gemm_low_writes_f32(em_dtype lo)
{
    if (lo == EM_F16) return true;
    int p = lo == EM_BF16 ? bf16_path_or_none() : -1;
    return p == BF16_PATH_F32 || p == BF16_PATH_AVX512BF16;
}
