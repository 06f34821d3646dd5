/* gemm_bf16.c — bf16 x bf16 -> f32 matrix products on AMX tiles.
 *
 * Why AMX and not AVX512-BF16: on this project's Xeon (Sapphire Rapids) a
 * loop of independent VDPBF16PS runs at 120 GFLOP/s per core, half of what
 * plain f32 FMAs reach (239); one AMX TDPBF16PS tile product (16x16 outputs
 * x 32 deep) sustains 3.4 TFLOP/s per core. So bf16 products use AMX where
 * the CPU and kernel allow it (detected once, at first use) and otherwise
 * go through f32 and sgemm like f16 (tensor/ops_matmul.c).
 *
 * One call computes C (m x n, row stride ldc) = op(A) (m x K) @ op(B)
 * (K x n) for one thread; em_gemm splits bigger products over the pool. C is
 * f32, or bf16 rounded from the f32 tile as it leaves the accumulators (so a
 * bf16 matmul needs no f32 copy of its result).
 *   A is packed row-major into 32-row blocks, K padded with zeros to a
 *     multiple of 32: a tile row is 32 consecutive k of one output row.
 *   B is packed, NC columns at a time, into the pair-interleaved ("VNNI")
 *     layout a B tile needs: tile row p holds, for 16 columns, the pairs
 *     (B[2p][j], B[2p+1][j]).
 *   The kernel keeps a 32x32 block of C in four accumulator tiles and
 *     streams two A tiles and two B tiles per 32 steps of k. */
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dtype_math.h"
#include "ember/runtime.h"
#include "kernel_impl.h"
#include "tensor_impl.h"

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#define EM_AMX_BUILD 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define EM_AMX_BUILD 0
#endif

/* one entry of the layout: op(B)(2p, j) | op(B)(2p+1, j) << 16, zero past K
 * and past cols */
static uint32_t pair_at(bool tb, const uint16_t *B, int64_t ldb, int64_t c0, int64_t cols, int64_t K,
                        int64_t p, int64_t j)
{
    int64_t k = 2 * p;
    if (j >= cols || k >= K) return 0;
    /* op(B)(k, j) = B[k][c0 + j], or B[c0 + j][k] when B is stored transposed */
    uint32_t lo = tb ? B[(c0 + j) * ldb + k] : B[k * ldb + c0 + j];
    uint32_t hi = k + 1 >= K ? 0 : tb ? B[(c0 + j) * ldb + k + 1] : B[(k + 1) * ldb + c0 + j];
    return lo | hi << 16;
}

/* Where the layout's entries (p, j) for groups [g0, g1) and pairs [p0, p1)
 * are left to pair_at: everything but the whole groups' whole pairs that
 * the vector code below writes. */
static void pack_rest(bool tb, const uint16_t *B, int64_t ldb, int64_t c0, int64_t cols, int64_t K,
                      int64_t pairs, int64_t g0, int64_t g1, int64_t p0, int64_t p1, uint32_t *dst)
{
    for (int64_t g = g0; g < g1; g++)
        for (int64_t p = p0; p < p1; p++)
            for (int64_t jj = 0; jj < 16; jj++)
                dst[g * pairs * 16 + p * 16 + jj] = pair_at(tb, B, ldb, c0, cols, K, p, g * 16 + jj);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx2_impl.h"
#define PACK_AVX2 __attribute__((target("avx2")))

/* gemm_bf16_pack_pairs with AVX2: whole groups of 16 columns, and pairs
 * whole in K (8 at a time when B is stored transposed), by vectors; the
 * rest by pair_at */
PACK_AVX2 static void pack_pairs_avx2(bool tb, const uint16_t *B, int64_t ldb, int64_t c0, int64_t cols,
                                      int64_t K, int64_t Kp, uint32_t *dst)
{
    int64_t groups = (cols + 31) / 32 * 2, pairs = Kp / 2, whole_g = cols / 16;
    int64_t whole_p = tb ? K / 16 * 8 : K / 2; /* pairs the vectors write */
    for (int64_t g = 0; g < whole_g; g++) {
        uint32_t *d = dst + g * pairs * 16;
        if (!tb) { /* rows 2p and 2p+1 of B, 16 columns each, interleaved */
            for (int64_t p = 0; p < whole_p; p++) {
                const uint16_t *r0 = B + 2 * p * ldb + c0 + g * 16;
                __m256i a = _mm256_loadu_si256((const __m256i *)r0),
                        b = _mm256_loadu_si256((const __m256i *)(r0 + ldb));
                __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
                _mm256_storeu_si256((__m256i *)(d + p * 16), _mm256_permute2x128_si256(lo, hi, 0x20));
                _mm256_storeu_si256((__m256i *)(d + p * 16 + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
            }
            continue;
        }
        /* B stored transposed: a pair is one uint32 of column j's row; 8
         * pairs of 16 rows at a time, transposed as two 8 x 8 blocks */
        for (int64_t p = 0; p < whole_p; p += 8)
            for (int h = 0; h < 2; h++) {
                __m256i x[8];
                for (int i = 0; i < 8; i++)
                    x[i] = _mm256_loadu_si256((const __m256i *)(B + (c0 + g * 16 + h * 8 + i) * ldb + 2 * p));
                transpose8_u32(x);
                for (int q = 0; q < 8; q++) _mm256_storeu_si256((__m256i *)(d + (p + q) * 16 + h * 8), x[q]);
            }
    }
    pack_rest(tb, B, ldb, c0, cols, K, pairs, 0, whole_g, whole_p, pairs, dst);
    pack_rest(tb, B, ldb, c0, cols, K, pairs, whole_g, groups, 0, pairs, dst);
}
#define PACK_HAVE_AVX2 1
#else
#define PACK_HAVE_AVX2 0
#endif

/* columns c0..c0+cols of op(B) into groups of 16 columns, each Kp/2 pair-rows
 * of 16 pairs (64 bytes), zero padded to a multiple of 32 columns; the AMX
 * and the AVX512-BF16 kernels both read this layout (kernel_impl.h) */
void gemm_bf16_pack_pairs(bool tb, const uint16_t *B, int64_t ldb, int64_t c0, int64_t cols, int64_t K,
                          int64_t Kp, uint32_t *dst)
{
#if PACK_HAVE_AVX2
    if (em_cpu_detect().avx2) {
        pack_pairs_avx2(tb, B, ldb, c0, cols, K, Kp, dst);
        return;
    }
#endif
    pack_rest(tb, B, ldb, c0, cols, K, Kp / 2, 0, (cols + 31) / 32 * 2, 0, Kp / 2, dst);
}

#if EM_AMX_BUILD

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
enum { NC = 512 }; /* columns of B packed at a time (K x 512 bf16: 768 KiB for K = 768) */

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

static int amx_state; /* 0 unknown, 1 usable, -1 not */

static bool amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    bool tile = d & (1u << 24), bf16 = d & (1u << 22);
    if (!tile || !bf16) return false;
    /* the kernel must let this process use the tile data state */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

bool gemm_bf16_amx_usable(void)
{
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = amx_probe() ? 1 : -1;
        __atomic_store_n(&amx_state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

/* rows r0.. of op(A), all K: into dst (32 rows x Kp, zero padded) */
static void pack_a(bool ta, const uint16_t *A, int64_t lda, int64_t r0, int64_t rows, int64_t K, int64_t Kp,
                   uint16_t *dst)
{
    memset(dst, 0, (size_t)(32 * Kp) * 2);
    if (!ta) {
        for (int64_t i = 0; i < rows; i++) memcpy(dst + i * Kp, A + (r0 + i) * lda, (size_t)K * 2);
        return;
    }
    for (int64_t k = 0; k < K; k++) { /* A stored (K, m): read along its rows */
        const uint16_t *s = A + k * lda + r0;
        for (int64_t i = 0; i < rows; i++) dst[i * Kp + k] = s[i];
    }
}

/* one 16x16 f32 tile in t (row stride 16) into C rows [0,r), cols [0,c);
 * C holds f32, or bf16 when c_bf16 */
static void store_part(const float *t, void *C, bool c_bf16, int64_t ldc, int64_t r, int64_t c)
{
    if (!c_bf16) {
        for (int64_t i = 0; i < r; i++) memcpy((float *)C + i * ldc, t + i * 16, (size_t)c * 4);
        return;
    }
    uint32_t u[16 * 16];
    memcpy(u, t, sizeof u);
    for (int64_t i = 0; i < r; i++) {
        uint16_t *d = (uint16_t *)C + i * ldc;
        for (int64_t k = 0; k < c; k++) d[k] = bf16_round(u[i * 16 + k]);
    }
}

__attribute__((target("amx-tile,amx-bf16"))) static void block_32x32(const uint16_t *ap, int64_t Kp, const uint32_t *bp0,
                                                                      const uint32_t *bp1, void *C, bool c_bf16,
                                                                      int64_t ldc, int64_t rows, int64_t cols,
                                                                      float *tmp)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < Kp; k += 32) {
        _tile_loadd(4, ap + k, Kp * 2);
        _tile_loadd(5, ap + 16 * Kp + k, Kp * 2);
        _tile_loadd(6, bp0 + (k / 2) * 16, 64);
        _tile_loadd(7, bp1 + (k / 2) * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (rows >= 32 && cols >= 32 && !c_bf16) {
        float *c = C;
        _tile_stored(0, c, ldc * 4);
        _tile_stored(1, c + 16, ldc * 4);
        _tile_stored(2, c + 16 * ldc, ldc * 4);
        _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
        return;
    }
    /* bf16 or an edge block: through a scratch tile, keeping what is in range */
    size_t es = c_bf16 ? 2 : 4;
    for (int q = 0; q < 4; q++) {
        int64_t r0 = q >= 2 ? 16 : 0, c0 = q & 1 ? 16 : 0;
        if (r0 >= rows || c0 >= cols) continue;
        switch (q) {
        case 0: _tile_stored(0, tmp, 64); break;
        case 1: _tile_stored(1, tmp, 64); break;
        case 2: _tile_stored(2, tmp, 64); break;
        default: _tile_stored(3, tmp, 64);
        }
        store_part(tmp, (char *)C + (size_t)(r0 * ldc + c0) * es, c_bf16, ldc, rows - r0 < 16 ? rows - r0 : 16,
                   cols - c0 < 16 ? cols - c0 : 16);
    }
}

__attribute__((target("amx-tile,amx-bf16"))) static void tiles_on(void)
{
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) static void tiles_off(void) { _tile_release(); }

bool gemm_bf16_amx(bool ta, bool tb, int64_t m, int64_t n, int64_t K, const uint16_t *A, int64_t lda,
                   const uint16_t *B, int64_t ldb, void *C, bool c_bf16, int64_t ldc)
{
    if (!gemm_bf16_amx_usable()) return false;
    size_t es = c_bf16 ? 2 : 4;
    int64_t Kp = (K + 31) / 32 * 32, mblocks = (m + 31) / 32;
    uint16_t *ap = aligned_alloc(64, (size_t)(mblocks * 32 * Kp) * 2);
    uint32_t *bp = aligned_alloc(64, (size_t)(NC * Kp / 2) * 4);
    float *tmp = aligned_alloc(64, 16 * 16 * 4);
    if (!ap || !bp || !tmp) {
        free(ap);
        free(bp);
        free(tmp);
        return false;
    }
    for (int64_t i = 0; i < mblocks; i++) {
        int64_t r = m - i * 32 < 32 ? m - i * 32 : 32;
        pack_a(ta, A, lda, i * 32, r, K, Kp, ap + i * 32 * Kp);
    }
    tiles_on();
    for (int64_t c0 = 0; c0 < n; c0 += NC) {
        int64_t cols = n - c0 < NC ? n - c0 : NC;
        gemm_bf16_pack_pairs(tb, B, ldb, c0, cols, K, Kp, bp);
        for (int64_t i = 0; i < mblocks; i++) {
            int64_t rows = m - i * 32;
            for (int64_t j = 0; j < cols; j += 32) {
                const uint32_t *b0 = bp + (j / 16) * (Kp / 2) * 16, *b1 = b0 + (Kp / 2) * 16;
                block_32x32(ap + i * 32 * Kp, Kp, b0, b1, (char *)C + (size_t)(i * 32 * ldc + c0 + j) * es, c_bf16,
                            ldc, rows, cols - j, tmp);
            }
        }
    }
    tiles_off();
    free(ap);
    free(bp);
    free(tmp);
    return true;
}

#else

bool gemm_bf16_amx_usable(void) { return false; }
bool gemm_bf16_amx(bool ta, bool tb, int64_t m, int64_t n, int64_t K, const uint16_t *A, int64_t lda,
                   const uint16_t *B, int64_t ldb, void *C, bool c_bf16, int64_t ldc)
{
    (void)ta, (void)tb, (void)m, (void)n, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)c_bf16,
        (void)ldc;
    return false;
}

#endif
