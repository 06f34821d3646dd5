/* kernel_impl.h — what a CPU kernel works with: element loads and stores
 * across dtypes, bulk conversions and copies, strided iteration,
 * broadcasting, scratch memory, the thread pool and the matrix multiply.
 * Kernels see plain tensors (tensor_impl.h); they know neither the tape nor
 * autocast (tensor/dispatch.h runs them). */
#ifndef EMBER_KERNEL_IMPL_H
#define EMBER_KERNEL_IMPL_H

#include "tensor_impl.h"

/* ---- element access ------------------------------------------------------- */
double ld(em_dtype dt, const void *p);
void st(em_dtype dt, void *p, double v);
/* Converts n contiguous elements between dtypes. */
void convert_n(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n);
/* convert_n over n elements spaced dstride and sstride elements apart (any
 * strides, 0 included for src): the bits of st(to, ld(from)) per element,
 * a block at a time through floats where both dtypes are f32, f16 or bf16. */
void convert_strided(em_dtype to, void *dst, int64_t dstride, em_dtype from, const void *src, int64_t sstride,
                     int64_t n);
/* convert_n split over the pool when n is large. */
void convert_par(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n);
/* Zeroes `bytes` bytes at dst, split over the pool when large. */
void zero_par(void *dst, size_t bytes);
/* dst[i] += src[i] for n contiguous elements, split over the pool when large:
 * dst f32 or f64, src any float dtype no wider than dst (so the conversion
 * is exact and the sum is rounded once); or dst f16/bf16, src f32, f16 or
 * bf16 (each sum in f32, then rounded into dst). */
void add_par(em_dtype to, void *dst, em_dtype from, const void *src, int64_t n);
/* dst = a + b, n contiguous elements, all of dt (f32 or f64); over the pool
 * when large. The bits of copying a to dst, then add_par(dt, dst, dt, b). */
void sum_par(em_dtype dt, void *dst, const void *a, const void *b, int64_t n);
/* Fills n contiguous elements of dtype dt with v. */
void fill_n(em_dtype dt, void *dst, double v, int64_t n);
/* Copies src into dst elementwise with dtype conversion; shapes must already
 * match (src may have stride-0 dims). Both on one device: on CUDA the copy
 * is queued and a launch error is left as the thread's last error. */
void copy_strided(tensor *dst, const tensor *src);
/* dst += src elementwise, each sum rounded once: same shape, both f32 or
 * both f64, any strides (dst's elements distinct, not overlapping src), on
 * the CPU; rows (the last dim) split over the pool. */
void add_strided(tensor *dst, const tensor *src);
/* dst = 0 elementwise, any strides and dtype, on the CPU. */
void zero_strided(tensor *dst);
#if EM_HAVE_CUDA
/* w over t's shape with the strides of ops[0..nops) */
void cu_walk_of(cu_walk *w, const tensor *t, int nops, const tensor *const *ops);
#endif

/* ---- strided iteration -----------------------------------------------------
 * Walks `numel(shape)` positions in row-major order, tracking an element
 * offset for each of nop operands (each with its own strides, 0 where it
 * broadcasts). Usage:
 *     nditer it; nditer_init(&it, ndim, shape, 2, (const int64_t *[]){sa, sb});
 *     nditer_seek(&it, start);
 *     for (i = start; i < end; i++) { use it.off[0], it.off[1]; nditer_next(&it); }
 */
typedef struct nditer {
    int ndim, nop;
    int64_t shape[EM_MAX_DIMS];
    int64_t stride[4][EM_MAX_DIMS];
    int64_t idx[EM_MAX_DIMS];
    int64_t off[4];
} nditer;
void nditer_init(nditer *it, int ndim, const int64_t *shape, int nop, const int64_t *const *strides);
void nditer_seek(nditer *it, int64_t linear);
static inline void nditer_next(nditer *it)
{
    for (int d = it->ndim - 1; d >= 0; d--) {
        for (int k = 0; k < it->nop; k++) it->off[k] += it->stride[k][d];
        if (++it->idx[d] < it->shape[d]) return;
        for (int k = 0; k < it->nop; k++) it->off[k] -= it->stride[k][d] * it->shape[d];
        it->idx[d] = 0;
    }
}

/* ---- broadcasting ----------------------------------------------------------
 * The broadcast shape of a and b into (ndim, shape); EM_ERR_SHAPE naming op
 * and both shapes when they do not fit. */
em_status bcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb, int *ndim,
                      int64_t *shape);
/* t's strides seen from an output of (ndim, shape): stride 0 where t
 * broadcasts (t must broadcast to it). */
void bcast_strides(const tensor *t, int ndim, const int64_t *shape, int64_t *stride);

/* ---- temp arena: scratch memory inside one op -----------------------------
 * Stack discipline: m = tmp_mark(); p = tmp_alloc(n); ...; tmp_release(m).
 * 64-byte aligned. NULL + EM_ERR_OOM on failure. */
size_t tmp_mark(void);
void *tmp_alloc(size_t nbytes);
void tmp_release(size_t mark);

/* ---- thread pool ------------------------------------------------------------
 * Runs fn(ctx, lo, hi) over [0, n) split into contiguous ranges of at least
 * `grain` items, on the pool's threads and the caller's. Returns when all are
 * done. Nested calls run serially. */
typedef void (*range_fn)(void *ctx, int64_t lo, int64_t hi);
void parallel_for(int64_t n, int64_t grain, range_fn fn, void *ctx);

/* ---- matrix multiply (tensor/gemm.c) ----------------------------------------
 * C (M,N) = alpha op(A) @ op(B) + beta C, row-major, f32 or f64; op(X) is X
 * or its transpose (ta/tb); lda/ldb/ldc are the row strides of A, B, C as
 * stored. Split over ember's pool; each part is f32 on the avx2 path
 * (gemm_f32_path: beta 0 or 1, at least 16 rows and columns, K <= 1024
 * unless an operand is transposed) ember's own kernel, else the BLAS,
 * single-threaded inside. */
void em_gemm(em_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
             int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
/* em_gemm with beta 0 and a bias: C = alpha op(A) @ op(B), then bias (N
 * values of dt, NULL: none) added to every row of C as gemm_add_bias says,
 * each part's block as soon as its product is done (in the avx2 kernel's
 * registers as it stores them; after the BLAS call, while the block is in
 * cache): a Linear's y = x W^T + b with the bits of the product followed
 * by the add. */
void em_gemm_bias(em_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                  int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc, const void *bias);
/* C (m,n) (row stride ldc, dtype ct) gets bias (n values: f64 for an f64
 * C, else f32) added to every row, with the bits of ember's add: f32 and
 * f64 in their dtype; a bf16/f16 C widened, added in double and rounded
 * back as st() rounds (ops_binary.c's add on two such tensors). */
void gemm_add_bias(em_dtype ct, const void *bias, void *C, int64_t ldc, int64_t m, int64_t n);
/* The dtypes of a low-precision product: lo (bf16 or f16) is the product's
 * (its operands rounded to lo, f32 accumulation, each result rounded once
 * to lo); a, b and c say how A, B and C are stored: in lo, or in f32 where
 * gemm_low_reads_f32(lo) (an f32 operand is rounded to lo as the GEMM reads
 * it: the values a cast would make, without the cast's pass; an f32 C
 * holds the rounded results). */
typedef struct gemm_low_dtypes {
    em_dtype lo, a, b, c;
    /* C (f32, where gemm_low_reads_f32(lo)) += the product, each result
     * rounded to lo before it is added: a weight's gradient accumulated
     * where it lies, the bits of adding a rounded product to it */
    bool add;
    /* NULL, or N f32 values added to every row of C once it holds the
     * rounded product (gemm_add_bias's rule; not with add) */
    const float *bias;
} gemm_low_dtypes;

/* C (M,N) = op(A) @ op(B) as a product in dt.lo (above). bf16 runs on the
 * process's bf16 path (gemm_bf16_path, which must have succeeded); f16, and
 * bf16 on the f32 path, are widened to f32 inside the GEMM: in its packing
 * step on AVX2+FMA CPUs (gemm_widen), else a cache-sized block at a time
 * next to sgemm calls; no operand or result is ever copied whole. An f32 A
 * or B where !gemm_low_reads_f32(dt.lo), or an f32 C where
 * !gemm_low_writes_f32(dt.lo), is a bug (asserted). EM_ERR_OOM
 * when scratch memory runs out (C is then undefined). */
em_status em_gemm_low(gemm_low_dtypes dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A,
                      int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc);

/* Whether products in lo (bf16 or f16) on the CPU take f32 operands and
 * results as they are (gemm_low_dtypes): true where they are computed in
 * f32 anyway (f16 always; bf16 on the f32 path), false where the product
 * wants its operands in lo (bf16 on AMX or AVX512-BF16) or the bf16 path
 * setting is invalid (the product then reports it). */
bool gemm_low_reads_f32(em_dtype lo);
/* Whether products in lo on the CPU write an f32 C (the rounded results,
 * or added: gemm_low_dtypes) themselves: where they read f32 operands, and
 * bf16 on AVX512-BF16 (which takes bf16 operands only) */
bool gemm_low_writes_f32(em_dtype lo);

/* op(B) packed once for every part of a product split by C's rows
 * (tensor/gemm.c): each part multiplies by all of op(B), so instead of each
 * packing all of it, the parts pack it together into one buffer. Its
 * panels are packed in groups; a part claims each group no part has
 * claimed yet, packs it and marks it packed, then waits for the groups the
 * others claimed (being packed: a packer waits on nothing, and a part that
 * never starts claims nothing). The caller sizes it with gemm_shared_b_size
 * for the whole product's n and K, zeroes state, and passes the same one to
 * every part, with first (where the part starts claiming) spread over
 * [0, groups); NULL: the part packs its own. */
typedef struct gemm_shared_b {
    float *buf; /* gemm_shared_b_size's floats */
    int *state; /* groups of them: 0 unclaimed, 1 being packed, 2 packed (atomic) */
    int64_t groups;
} gemm_shared_b;
/* The floats of a shared op(B) for a product of n columns and depth K
 * (its groups into *groups); 0 where the parts had better pack their own
 * (a K summed in several steps) */
size_t gemm_shared_b_size(int64_t n, int64_t K, int64_t *groups);
/* Tests: hook (or NULL) is called by the part that claimed group q of a
 * shared op(B), with the n floats its panels take at dst, before it packs
 * them (a hook that fills them with NaN and sleeps shows the other parts
 * wait for the packing). Set it between products. */
typedef void (*gemm_shared_b_hook)(int64_t q, int64_t groups, float *dst, size_t n);
void gemm_shared_b_hook_for_test(gemm_shared_b_hook hook);
/* The f32 path on AVX2+FMA+F16C CPUs (tensor/gemm_widen.c): whether this
 * CPU has them, and one thread's C (m,n) = op(A) @ op(B) as a product in
 * dt.lo, its operands widened to f32 (or, stored in f32, rounded to dt.lo)
 * in the GEMM's packing, accumulated in f32 and rounded once, dt.bias
 * added as the kernel stores them (an f32 C only); false (nothing written)
 * when !gemm_widen_usable() or scratch runs out. */
bool gemm_widen_usable(void);
/* Whether the CPU (and build) also has AVX-512F, for the GEMM's 6x32
 * micro-kernel (the "avx512" f32 path; low products take it too unless
 * EMBER_F32_PATH=avx2), or the tests emulate it (below). */
bool gemm_wide_usable(void);
/* Whether this process's products on ember's GEMM take the 6x32 kernel
 * for pairs of panels: where gemm_wide_usable(), unless EMBER_F32_PATH=avx2
 * asks for the 6x16 kernel alone (ember env says it for the low paths). */
bool gemm_wide_now(void);
/* The micro-kernels' rows and panel width (tensor/gemm_widen.c) */
enum { WIDEN_MR = 6, WIDEN_NR = 16 };
/* The 6x32 kernel's sums (tensor/gemm_wide_sums.h) for six rows of A,
 * a(r,k) = a[r ars + k aks] (a packed panel: ars 1, aks WIDEN_MR), and the
 * two packed B panels from b, over kc: out[2r] holds row r's 16 columns of
 * the first panel, out[2r+1] its 16 of the second. */
typedef void (*wide_sums_fn)(int64_t kc, const float *a, int64_t ars, int64_t aks, const float *b,
                             float out[2 * WIDEN_MR][16]);
/* The same text compiled on ember's emulation of the intrinsics
 * (tensor/gemm_wide_emu.c): runs on any CPU, with the native one's bits. */
void gemm_wide_sums_emulated(int64_t kc, const float *a, int64_t ars, int64_t aks, const float *b,
                             float out[2 * WIDEN_MR][16]);
/* Tests only: the 6x32 kernel takes its sums from fn (NULL: the native
 * ones again), and gemm_wide_usable() is true on any AVX2+FMA+F16C CPU
 * while it is set; forgets the f32 path chosen. */
void gemm_wide_emulate_for_test(wide_sums_fn fn);
bool gemm_widen(gemm_low_dtypes dt, bool ta, bool tb, int64_t m, int64_t n, int64_t K, const void *A,
                int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc, const gemm_shared_b *shb,
                int64_t first);
/* One thread's f32 product on the same blocking and micro-kernels (the
 * "avx2" and "avx512" f32 paths, gemm_f32_path): C (m,n) = alpha op(A) @ op(B), or (add)
 * C + that, nothing rounded, then bias (n values, or NULL; not with add)
 * added to each row as the kernel stores it; false (nothing written) when
 * !gemm_widen_usable() or scratch runs out. */
bool gemm_f32_own(bool ta, bool tb, int64_t m, int64_t n, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, bool add, float *C, int64_t ldc, const float *bias,
                  const gemm_shared_b *shb, int64_t first);
/* The path f32 products take in this process (tensor/gemm_path.c):
 * EMBER_F32_PATH (auto, sgemm, avx2, avx512) on this CPU, read once; auto's
 * rule is gemm_path.c's. avx2 and avx512 are ember's own GEMM
 * (gemm_f32_own) on its 6x16 AVX2 kernel, or with its 6x32 AVX-512 one.
 * EM_ERR_ARG for an unknown value, EM_ERR_UNSUPPORTED for a path this CPU
 * lacks (read at every call, like EMBER_BF16_PATH). */
typedef enum f32_path { F32_PATH_SGEMM, F32_PATH_AVX2, F32_PATH_AVX512 } f32_path;
/* Whether the BLAS's sgemm runs AVX-512 kernels on this CPU
 * (tensor/runtime.c): OpenBLAS's chosen core is SkylakeX, Cooperlake or
 * SapphireRapids; true for a BLAS that cannot say. */
bool blas_sgemm_avx512(void);
em_status gemm_f32_path(f32_path *out);
/* The path already chosen, without reading the environment again (em_gemm
 * asks at every product, attention's per-head ones included); the first
 * call chooses it, and a bad setting gives sgemm (the matmul op, which
 * calls gemm_f32_path, reports it). */
f32_path gemm_f32_path_chosen(void);
/* Forgets the f32 path read (tests that set EMBER_F32_PATH). */
void gemm_f32_path_reset(void);
/* The same product on any CPU (tensor/gemm.c): blocks of the operands
 * widened next to sgemm calls on them (dt.bias is em_gemm_low's to add);
 * false when scratch runs out. */
bool gemm_widen_sgemm(gemm_low_dtypes dt, bool ta, bool tb, int64_t m, int64_t n, int64_t K, const void *A,
                      int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc);

/* ---- causal attention's heads on the CPU (tensor/attention_heads.c) -----------
 * The CPU kernels of tensor/ops_attention.c's ops. q, k, v, g (the
 * output's gradient) and the results o, d[0..3) = dq, dk, dv are (B,H,T,D)
 * tensors of any strides; they are read and written where they lie when
 * in the compute dtype (attention_compute_dtype) with unit stride along D,
 * else through contiguous temp copies (a result rounded once to its
 * dtype). P (B,H,T,T), compute dtype: the forward writes it (NULL: temp
 * memory for the call), the backward reads it. A result's elements are
 * set by their head alone, whatever was there before (no zeroing pass
 * over the result; the portable path clears its own dk, dv rows before
 * it adds the row blocks' products). op names the op in errors:
 * EM_ERR_OOM when temp memory runs out. */
static inline em_dtype attention_compute_dtype(em_dtype dt) { return dt == EM_F64 ? EM_F64 : EM_F32; }
em_status attention_heads_forward(const char *op, double scale, void *P, tensor *q, tensor *k, tensor *v,
                                  tensor *o);
em_status attention_heads_backward(const char *op, double scale, const void *P, tensor *q, tensor *k,
                                   tensor *v, tensor *g, tensor *const d[3]);

/* ---- causal attention's fused f32 head (tensor/attention_avx2.c) ---------------
 * One head of tensor/ops_attention.c's ops on AVX2+FMA CPUs: q, k, v, go
 * (T,D) with rows lq.. apart and unit stride along D; P (T,T); o, gq, gk,
 * gv (T,D) with rows lo, lgq, lgk, lgv apart and unit stride along D (only
 * their D columns are written: a neighbouring head's channels may lie
 * between their rows); scratch attention_fused_scratch(T,D) floats per head
 * (its packed operands; a head's scratch is shared by all row blocks of
 * that head). Row blocks are of ATTN_ROWS rows; [b0,b1) is a range of
 * them. Forward: attention_fused_prepare(h, false, scratch), then
 * forward_rows over all blocks (each range with its own (ATTN_ROWS,
 * round16(T)) strip) writes P and o. Backward: prepare(h, true, scratch),
 * then backward_rows over all blocks (dS into the scratch, gq), then
 * backward_keys over all blocks (gk, gv). Each result element is computed
 * the same way however the blocks are split. */
enum { ATTN_FUSED_MAX_T = 256, ATTN_FUSED_MAX_D = 128, ATTN_ROWS = 6 };
typedef struct attn_head_f32 {
    int64_t T, D;
    float scale;
    const float *q, *k, *v, *go;
    int64_t lq, lk, lv, lg;
    float *P, *o, *gq, *gk, *gv;
    int64_t lo, lgq, lgk, lgv;
} attn_head_f32;
/* Whether the fused head runs here: f32 on an AVX2+FMA CPU, 1 <= T <=
 * ATTN_FUSED_MAX_T, 1 <= D <= ATTN_FUSED_MAX_D, not turned off. */
bool attention_fused_usable(int64_t T, int64_t D);
/* Tests: true runs the portable path (per-head GEMMs) everywhere. */
void attention_fused_disable(bool off);
size_t attention_fused_scratch(int64_t T, int64_t D);
/* Packs the head's operands into scratch; points h's k/q/v/go at the
 * packed copies where it made them. */
void attention_fused_prepare(attn_head_f32 *h, bool backward, float *scratch);
void attention_fused_forward_rows(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch,
                                  float *strip);
void attention_fused_backward_rows(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch);
void attention_fused_backward_keys(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch);

/* ---- bf16 product paths (tensor/gemm_path.c) ------------------------------------ */
typedef enum bf16_path { BF16_PATH_F32, BF16_PATH_AVX512BF16, BF16_PATH_AMX } bf16_path;
/* The path bf16 products take in this process: EMBER_BF16_PATH (auto, f32,
 * avx512bf16, amx) or, by default, the fastest this CPU can run; chosen at
 * the first call and kept, the settings checked at every call. EM_ERR_ARG naming the variable and its value
 * when it is not one of those (or EMBER_NO_AMX is not a boolean), EM_ERR_UNSUPPORTED when it names a path
 * this CPU or build cannot run. */
em_status gemm_bf16_path(bf16_path *out);
/* Forgets the path read, so the next gemm_bf16_path reads the environment
 * again (tests). */
void gemm_bf16_path_reset(void);
/* "f32", "avx512bf16" or "amx" */
const char *gemm_bf16_path_name(bf16_path p);

/* AMX (tensor/gemm_bf16.c): whether AMX-BF16 tiles are usable by this
 * process (the CPU has them and the kernel grants the tile state; probed
 * once). */
bool gemm_bf16_amx_usable(void);
/* One thread's C (m,n) = op(A) @ op(B) on bf16 operands with AMX tiles, C
 * f32 or (c_bf16) bf16; false (nothing written) when AMX is not usable or
 * memory runs out. */
bool gemm_bf16_amx(bool ta, bool tb, int64_t m, int64_t n, int64_t K, const uint16_t *A, int64_t lda,
                   const uint16_t *B, int64_t ldb, void *C, bool c_bf16, int64_t ldc);
/* Packs columns c0..c0+cols of op(B) (K rows) pair-interleaved ("VNNI"):
 * groups of 16 columns, each Kp/2 rows of 16 pairs (B[2p][j], B[2p+1][j])
 * as uint32 (low half the even k); zero past K and past cols up to a
 * multiple of 32 columns. Kp even, >= K. */
void gemm_bf16_pack_pairs(bool tb, const uint16_t *B, int64_t ldb, int64_t c0, int64_t cols, int64_t K,
                          int64_t Kp, uint32_t *dst);

/* AVX512-BF16 (tensor/gemm_dpbf16.c): whether this CPU and build have
 * VDPBF16PS. */
bool gemm_dpbf16_usable(void);
/* A micro-kernel of the VDPBF16PS GEMM: acc (DP_MR rows x 32 f32, row
 * stride ldacc) = (accumulate ? acc : 0) + the sum over `pairs` k-pairs of
 * ap[p*DP_MR + i] (row i's bf16 pair, the even k in the low half) times
 * bp's pair-interleaved 32 columns (two groups of 16 as
 * gemm_bf16_pack_pairs lays them, the second gstride uint32s after the
 * first), each pair as VDPBF16PS computes it. */
enum { DP_MR = 8 };
typedef void (*dp_kernel)(const uint32_t *ap, const uint32_t *bp, int64_t gstride, int64_t pairs, float *acc,
                          int64_t ldacc, bool accumulate);
/* Three kernels of that contract:
 *   dp_kernel_avx512: the AVX512-BF16 kernel (tensor/gemm_dpbf16_kernel.h
 *     compiled with the real intrinsics; NULL where the build cannot make
 *     it; never call it where !gemm_dpbf16_usable());
 *   dp_kernel_model: a scalar model of it that runs anywhere and computes
 *     the same bits: lane j of VDPBF16PS adds a[2j+1]*b[2j+1] then
 *     a[2j]*b[2j] to the f32 accumulator, each add rounded to nearest even,
 *     bf16 subnormal inputs read as zero and subnormal results flushed to
 *     zero (Intel SDM);
 *   dp_kernel_emulated: dp_kernel_avx512's own source compiled against
 *     ember's emulation of its intrinsics (tensor/gemm_dpbf16_emu.c), which
 *     runs anywhere; its VDPBF16PS computes each lane with the model's
 *     arithmetic, so it gives the model's bits exactly when the kernel
 *     moves its data right (what it verifies: tensor/avx512_emu.h). */
extern const dp_kernel dp_kernel_avx512, dp_kernel_model, dp_kernel_emulated;
/* One VDPBF16PS lane: acc + a1*b1 + a0*b0 as above (the model's step). */
float dpbf16_lane(float acc, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1);
/* The kernel the avx512bf16 path runs (tensor/gemm_path.c):
 * dp_kernel_avx512, or the one gemm_dpbf16_use_kernel_for_test set. */
dp_kernel gemm_dpbf16_kernel(void);
/* Tests only: the avx512bf16 path becomes available on this CPU, running
 * kernel k (dp_kernel_emulated, dp_kernel_model) in place of VDPBF16PS, as
 * if the CPU had the instruction (auto then picks it where there is no
 * AMX); NULL undoes it. Forgets the path read (gemm_bf16_path_reset). No
 * setting reaches it, and it is internal (not exported): for users,
 * EMBER_BF16_PATH=avx512bf16 on a CPU without the instruction stays
 * EM_ERR_UNSUPPORTED. */
void gemm_dpbf16_use_kernel_for_test(dp_kernel k);
/* One thread's C (m,n) = op(A) @ op(B) on bf16 operands with kernel k, C
 * f32 or (c_bf16) bf16 rounded once; false (nothing written) when memory
 * runs out. */
bool gemm_dpbf16(dp_kernel k, bool ta, bool tb, int64_t m, int64_t n, int64_t K, const uint16_t *A,
                 int64_t lda, const uint16_t *B, int64_t ldb, void *C, bool c_bf16, int64_t ldc);
/* One thread's part of em_gemm_low (dt.lo bf16, A and B in bf16, bias
 * not taken: the caller adds it) with kernel k: C in bf16, or in f32
 * holding the rounded results (dt.add: added to C); false (nothing
 * written) when memory runs out. */
bool gemm_dpbf16_low(dp_kernel k, gemm_low_dtypes dt, bool ta, bool tb, int64_t m, int64_t n, int64_t K,
                     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, void *C, int64_t ldc);

/* Whether every value of dtype `from` is exactly a value of float dtype `to`
 * (f16/bf16 -> f32 -> f64, and any dtype to itself). tensor/dtype.c */
bool widens_exactly(em_dtype from, em_dtype to);
/* Sums g (which broadcasts from (ndim, shape)) back down to (ndim, shape):
 * the gradient of a broadcast. g itself when the shapes agree. */
tensor *t_sum_to(tensor *g, int ndim, const int64_t *shape);

#endif
