/* attention_avx2.c — one head of f32 causal attention, forward and
 * backward, with AVX2+FMA register blocking (tensor/ops_attention.c runs
 * it per head, or per block of query rows for a single head, and keeps
 * its GEMM-per-product path as the portable one beside it).
 *
 * Every product of the op is one tile loop (mm_tiles): C (mr,nc) =
 * alpha * sum_k a(r,k) b(k,0:nc), a block of 6 rows and 16 columns of C in
 * 12 ymm registers, a(r,k) broadcast from memory through two strides (so
 * P, dS and their transposes are read where they lie) and b a row-major
 * operand whose rows hold at least round8(nc) readable floats.
 * Per head, with T query/key positions and D channels (scale s):
 *   forward, per block of 6 query rows [i0,i1):
 *     S = s q k^T over keys j < round16(i1) only (k^T packed (D,Tp), Tp =
 *     round16(T), into a (6,Tp) strip); P = softmax over j <= i, 0 above
 *     the diagonal (written to P, (T,T)); O = P[:, 0:i1] v.
 *   backward:
 *     per block of query rows: dP = dO V^T (V^T packed like k^T), dS =
 *     P (dP - rowsum(dP P)) s, 0 above the diagonal (into a (T,Tp)
 *     scratch), dQ = dS[:, 0:i1] K;
 *     then per block of key rows [j0,j1): dV = P[j0:, j0:j1]^T dO[j0:],
 *     dK = dS[j0:, j0:j1]^T Q[j0:] (rows i < j0 have P = dS = 0 there).
 * So the masked upper triangle is skipped to within a 6x16 tile, and each
 * element of every result is one k loop in a fixed order: the bits do not
 * depend on how heads or row blocks are split over threads. Operands whose
 * rows D is not a multiple of 8 are copied with rows padded to round8(D)
 * (the tiles read whole vectors); P keeps the portable path's (T,T) layout.
 * Results go where the caller's row strides put them (o, gq, gk, gv rows of
 * a (B,T,C) or (B,T,3C) tensor for the fused-QKV op), each row's D columns
 * only: a tile's last vector is stored through a lane mask. */
#include "kernel_impl.h"
#include "vmath_impl.h"

#include "ember/runtime.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define EM_ATTN_BUILD 1
#include "avx2_impl.h"
#else
#define EM_ATTN_BUILD 0
#endif

static bool fused_off; /* tests: the portable path everywhere */

void attention_fused_disable(bool off) { fused_off = off; }

bool attention_fused_usable(int64_t T, int64_t D)
{
    em_cpu_features f = em_cpu_detect();
    return EM_ATTN_BUILD && !fused_off && f.avx2 && f.fma && T >= 1 && T <= ATTN_FUSED_MAX_T && D >= 1 &&
           D <= ATTN_FUSED_MAX_D;
}

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* The scratch (floats) the head needs: the packed operands (the same for
 * forward and backward: (D,Tp) + 3 (T,round8(D)) + (T,Tp)). */
size_t attention_fused_scratch(int64_t T, int64_t D)
{
    int64_t Tp = round_up(T, 16), Dp = round_up(D, 8);
    return (size_t)(D * Tp + 3 * T * Dp + T * Tp + 16);
}

#if EM_ATTN_BUILD

#define TARGET __attribute__((target("avx2,fma")))

enum { MR = ATTN_ROWS, NR = 16 };

/* lanes [0,n) set, for n in [0,8] */
TARGET static inline __m256i lanes(int64_t n)
{
    static const int32_t src[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(src + 8 - n));
}

/* the vector of C at d, alpha x, its first nc lanes (all when nc >= 8) */
TARGET static inline void put(float *d, __m256 x, __m256 alpha, int64_t nc)
{
    if (nc >= 8)
        _mm256_storeu_ps(d, _mm256_mul_ps(x, alpha));
    else
        _mm256_maskstore_ps(d, lanes(nc), _mm256_mul_ps(x, alpha));
}

/* C (mr,nc) = alpha * sum_{k<K} a[r ars + k aks] b[k ldb + 0:nc), nv =
 * ceil(nc/8) vectors of b read per k (fma_block); mr and nv are constants
 * where it is inlined. */
TARGET static inline __attribute__((always_inline)) void tile(int mr, int nv, int64_t K, const float *a,
                                                              int64_t ars, int64_t aks, const float *b,
                                                              int64_t ldb, float alpha, float *c, int64_t ldc,
                                                              int64_t nc)
{
    __m256 r[12];
    fma_block(mr, nv, K, a, ars, aks, b, ldb, r);
    __m256 al = _mm256_set1_ps(alpha);
    for (int i = 0; i < mr; i++) {
        put(c + i * ldc, r[2 * i], al, nc);
        if (nv > 1) put(c + i * ldc + 8, r[2 * i + 1], al, nc - 8);
    }
}

typedef void (*tile_fn)(int64_t K, const float *a, int64_t ars, int64_t aks, const float *b, int64_t ldb,
                        float alpha, float *c, int64_t ldc, int64_t nc);
#define TILE(M, V)                                                                                           \
    TARGET static void tile_##M##_##V(int64_t K, const float *a, int64_t ars, int64_t aks, const float *b,   \
                                      int64_t ldb, float alpha, float *c, int64_t ldc, int64_t nc)           \
    {                                                                                                        \
        tile(M, V, K, a, ars, aks, b, ldb, alpha, c, ldc, nc);                                               \
    }
TILE(1, 1)
TILE(2, 1)
TILE(3, 1)
TILE(4, 1)
TILE(5, 1)
TILE(6, 1)
TILE(1, 2)
TILE(2, 2)
TILE(3, 2)
TILE(4, 2)
TILE(5, 2)
TILE(6, 2)
#undef TILE
static const tile_fn tiles[MR][2] = {{tile_1_1, tile_1_2}, {tile_2_1, tile_2_2}, {tile_3_1, tile_3_2},
                                     {tile_4_1, tile_4_2}, {tile_5_1, tile_5_2}, {tile_6_1, tile_6_2}};

/* Rows [0,mr) of C, columns [0,n) in tiles of 16: C = alpha a b with a
 * as tile() reads it and b's columns from 0 (b's rows readable to
 * round8(n)). */
TARGET static void row_tiles(int mr, int64_t n, int64_t K, const float *a, int64_t ars, int64_t aks,
                             const float *b, int64_t ldb, float alpha, float *c, int64_t ldc)
{
    for (int64_t j = 0; j < n; j += NR) {
        int64_t nc = n - j < NR ? n - j : NR;
        tiles[mr - 1][nc > 8](K, a, ars, aks, b + j, ldb, alpha, c + j, ldc, nc);
    }
}

TARGET static inline float hsum(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

TARGET static inline float hmax(__m256 x)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* the n <= 8 floats at p, lanes from n on set to fill (nothing past p+n read) */
TARGET static inline __m256 load_part(const float *p, int64_t n, float fill)
{
    __m256i m = lanes(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}

/* p[0:T) = softmax(s[0:n)) then 0: row i of P, n = i+1 */
TARGET static void softmax_row(const float *s, int64_t n, int64_t T, float *p)
{
    __m256 mx = _mm256_set1_ps(-INFINITY), sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    if (j < n) mx = _mm256_max_ps(mx, load_part(s + j, n - j, -INFINITY));
    __m256 m = _mm256_set1_ps(hmax(mx));
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 e = vexpf8_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
        sum = _mm256_add_ps(sum, e);
        _mm256_storeu_ps(p + j, e);
    }
    if (j < n) {
        __m256 e = vexpf8_avx2(_mm256_sub_ps(load_part(s + j, n - j, -INFINITY), m)); /* exp(-inf) = 0 */
        sum = _mm256_add_ps(sum, e);
        _mm256_maskstore_ps(p + j, lanes(n - j), e);
    }
    __m256 inv = _mm256_set1_ps(1.0f / hsum(sum));
    for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(p + j, _mm256_mul_ps(_mm256_loadu_ps(p + j), inv));
    if (j < n) _mm256_maskstore_ps(p + j, lanes(n - j), _mm256_mul_ps(load_part(p + j, n - j, 0.0f), inv));
    for (j = n; j < T; j++) p[j] = 0.0f; /* inline: a memset call per row was 1.5% of the op */
}

/* d[0:n) = p (d - sum(d p)) * scale over j < n = i+1, then 0 to Tp: row i
 * of dS from dP (in d) and P */
TARGET static void dsoftmax_row(const float *p, int64_t n, int64_t Tp, float scale, float *d)
{
    __m256 r8 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) r8 = _mm256_fmadd_ps(_mm256_loadu_ps(d + j), _mm256_loadu_ps(p + j), r8);
    if (j < n) r8 = _mm256_fmadd_ps(load_part(d + j, n - j, 0.0f), load_part(p + j, n - j, 0.0f), r8);
    __m256 r = _mm256_set1_ps(hsum(r8)), sc = _mm256_set1_ps(scale);
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 x = _mm256_sub_ps(_mm256_loadu_ps(d + j), r);
        _mm256_storeu_ps(d + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(p + j), x), sc));
    }
    if (j < n) {
        __m256 x = _mm256_sub_ps(load_part(d + j, n - j, 0.0f), r);
        _mm256_maskstore_ps(d + j, lanes(n - j),
                            _mm256_mul_ps(_mm256_mul_ps(load_part(p + j, n - j, 0.0f), x), sc));
    }
    for (j = n; j < Tp; j++) d[j] = 0.0f;
}

/* dst[c ldd + 0:8) = src[0:8 rows, c] for c < 8: an 8x8 block transposed */
TARGET static void transpose8x8(const float *src, int64_t ld, float *dst, int64_t ldd)
{
    __m256 r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * ld);
    transpose8(r);
    for (int c = 0; c < 8; c++) _mm256_storeu_ps(dst + c * ldd, r[c]);
}

/* dst (D,Tp) = src (T,D)^T, rows ld apart, columns [T,Tp) zero: 8x8
 * blocks, the edges one by one */
TARGET static void pack_transposed(const float *src, int64_t ld, int64_t T, int64_t D, int64_t Tp, float *dst)
{
    int64_t T8 = T / 8 * 8, D8 = D / 8 * 8;
    for (int64_t t = 0; t < T8; t += 8)
        for (int64_t d = 0; d < D8; d += 8) transpose8x8(src + t * ld + d, ld, dst + d * Tp + t, Tp);
    for (int64_t d = 0; d < D; d++) {
        float *row = dst + d * Tp;
        for (int64_t t = d < D8 ? T8 : 0; t < T; t++) row[t] = src[t * ld + d];
        for (int64_t t = T; t < Tp; t++) row[t] = 0.0f;
    }
}

/* src (T,D), rows *ld apart, as the tiles' b: itself when D is a whole
 * number of vectors, else a copy in dst with rows padded to round8(D)
 * (*ld set to that) */
static const float *rows_operand(const float *src, int64_t *ld, int64_t T, int64_t D, float *dst)
{
    if (D % 8 == 0) return src;
    int64_t Dp = round_up(D, 8);
    for (int64_t t = 0; t < T; t++) {
        memcpy(dst + t * Dp, src + t * *ld, sizeof(float) * (size_t)D);
        memset(dst + t * Dp + D, 0, sizeof(float) * (size_t)(Dp - D));
    }
    *ld = Dp;
    return dst;
}

/* The scratch's parts: kv_t (D,Tp), three (T,Dp) row operands, ds (T,Tp)
 * (the forward's (6,Tp) strip is ds's first rows) */
typedef struct parts {
    int64_t Tp, Dp;
    float *kv_t, *r0, *r1, *r2, *ds;
} parts;

static parts split(int64_t T, int64_t D, float *scratch)
{
    parts p = {.Tp = round_up(T, 16), .Dp = round_up(D, 8)};
    p.kv_t = scratch;
    p.r0 = p.kv_t + D * p.Tp;
    p.r1 = p.r0 + T * p.Dp;
    p.r2 = p.r1 + T * p.Dp;
    p.ds = p.r2 + T * p.Dp;
    return p;
}

void attention_fused_prepare(attn_head_f32 *h, bool backward, float *scratch)
{
    parts p = split(h->T, h->D, scratch);
    int64_t T = h->T, D = h->D;
    if (!backward) {
        pack_transposed(h->k, h->lk, T, D, p.Tp, p.kv_t);
        h->v = rows_operand(h->v, &h->lv, T, D, p.r0);
        return;
    }
    pack_transposed(h->v, h->lv, T, D, p.Tp, p.kv_t);
    h->k = rows_operand(h->k, &h->lk, T, D, p.r0);
    h->q = rows_operand(h->q, &h->lq, T, D, p.r1);
    h->go = rows_operand(h->go, &h->lg, T, D, p.r2);
}

TARGET void attention_fused_forward_rows(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch,
                                         float *strip)
{
    parts p = split(h->T, h->D, scratch);
    int64_t T = h->T, D = h->D;
    for (int64_t i0 = b0 * MR; i0 < b1 * MR && i0 < T; i0 += MR) {
        int mr = (int)(T - i0 < MR ? T - i0 : MR);
        int64_t i1 = i0 + mr;
        row_tiles(mr, i1, D, h->q + i0 * h->lq, h->lq, 1, p.kv_t, p.Tp, h->scale, strip, p.Tp);
        for (int r = 0; r < mr; r++) softmax_row(strip + r * p.Tp, i0 + r + 1, T, h->P + (i0 + r) * T);
        row_tiles(mr, D, i1, h->P + i0 * T, T, 1, h->v, h->lv, 1.0f, h->o + i0 * h->lo, h->lo);
    }
}

TARGET void attention_fused_backward_rows(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch)
{
    parts p = split(h->T, h->D, scratch);
    int64_t T = h->T, D = h->D;
    for (int64_t i0 = b0 * MR; i0 < b1 * MR && i0 < T; i0 += MR) {
        int mr = (int)(T - i0 < MR ? T - i0 : MR);
        int64_t i1 = i0 + mr;
        float *ds = p.ds + i0 * p.Tp;
        row_tiles(mr, i1, D, h->go + i0 * h->lg, h->lg, 1, p.kv_t, p.Tp, 1.0f, ds, p.Tp);
        for (int r = 0; r < mr; r++)
            dsoftmax_row(h->P + (i0 + r) * T, i0 + r + 1, p.Tp, h->scale, ds + r * p.Tp);
        row_tiles(mr, D, i1, ds, p.Tp, 1, h->k, h->lk, 1.0f, h->gq + i0 * h->lgq, h->lgq);
    }
}

TARGET void attention_fused_backward_keys(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch)
{
    parts p = split(h->T, h->D, scratch);
    int64_t T = h->T, D = h->D;
    for (int64_t j0 = b0 * MR; j0 < b1 * MR && j0 < T; j0 += MR) {
        int mr = (int)(T - j0 < MR ? T - j0 : MR);
        row_tiles(mr, D, T - j0, h->P + j0 * T + j0, 1, T, h->go + j0 * h->lg, h->lg, 1.0f,
                  h->gv + j0 * h->lgv, h->lgv);
        row_tiles(mr, D, T - j0, p.ds + j0 * p.Tp + j0, 1, p.Tp, h->q + j0 * h->lq, h->lq, 1.0f,
                  h->gk + j0 * h->lgk, h->lgk);
    }
}

#else /* no AVX2 build: attention_fused_usable is false, so these never run */

void attention_fused_prepare(attn_head_f32 *h, bool backward, float *scratch)
{
    (void)h, (void)backward, (void)scratch;
}
void attention_fused_forward_rows(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch,
                                  float *strip)
{
    (void)h, (void)b0, (void)b1, (void)scratch, (void)strip;
}
void attention_fused_backward_rows(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch)
{
    (void)h, (void)b0, (void)b1, (void)scratch;
}
void attention_fused_backward_keys(const attn_head_f32 *h, int64_t b0, int64_t b1, float *scratch)
{
    (void)h, (void)b0, (void)b1, (void)scratch;
}
#endif
