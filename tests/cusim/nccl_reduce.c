/* nccl_reduce.c — the element arithmetic of the emulator's NCCL: sizes and
 * names of ncclDataType_t, and the reduction of the ranks' contributions in
 * rank order, so that every rank, reducing the same pieces the same way,
 * gets the same bits. f16 and bf16 are converted to float, reduced there and
 * rounded once (to nearest, ties to even); integers wrap. */
#include <stdlib.h>
#include <string.h>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "nccl_impl.h"

size_t cusim_nccl_dtype_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    case ncclNumTypes: break;
    }
    return 0;
}

const char *cusim_nccl_dtype_name(int t)
{
    static const char *names[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                  "uint64", "float16", "float32", "float64", "bfloat16"};
    return t >= 0 && t < ncclNumTypes ? names[t] : "(bad type)";
}

const char *cusim_nccl_red_name(int r)
{
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return r >= 0 && r < ncclNumOps ? names[r] : "(bad op)";
}

/* ---- reductions: dst = src[0] op src[1] op ... in rank order ------------------------ */

/* In T's arithmetic; sums and products in U (the unsigned type for integers,
 * so they wrap). Avg: the sum divided by the number of ranks (integers
 * truncate). dst never overlaps a source. */
#define DEFINE_REDUCE(NAME, T, U)                                                                            \
    static void NAME(void *dst, const void *const *src, int nsrc, size_t m, ncclRedOp_t op)                  \
    {                                                                                                        \
        T *d = dst;                                                                                          \
        memcpy(d, src[0], m * sizeof(T));                                                                    \
        for (int q = 1; q < nsrc; q++) {                                                                     \
            const T *s = src[q];                                                                             \
            if (op == ncclSum || op == ncclAvg)                                                              \
                for (size_t i = 0; i < m; i++) d[i] = (T)((U)d[i] + (U)s[i]);                                \
            else if (op == ncclProd)                                                                         \
                for (size_t i = 0; i < m; i++) d[i] = (T)((U)d[i] * (U)s[i]);                                \
            else if (op == ncclMax)                                                                          \
                for (size_t i = 0; i < m; i++) d[i] = s[i] > d[i] ? s[i] : d[i];                             \
            else                                                                                             \
                for (size_t i = 0; i < m; i++) d[i] = s[i] < d[i] ? s[i] : d[i];                             \
        }                                                                                                    \
        if (op == ncclAvg)                                                                                   \
            for (size_t i = 0; i < m; i++) d[i] = (T)(d[i] / (T)nsrc);                                       \
    }

DEFINE_REDUCE(reduce_i8, int8_t, uint8_t)
DEFINE_REDUCE(reduce_u8, uint8_t, uint8_t)
DEFINE_REDUCE(reduce_i32, int32_t, uint32_t)
DEFINE_REDUCE(reduce_u32, uint32_t, uint32_t)
DEFINE_REDUCE(reduce_i64, int64_t, uint64_t)
DEFINE_REDUCE(reduce_u64, uint64_t, uint64_t)
DEFINE_REDUCE(reduce_f32, float, float)
DEFINE_REDUCE(reduce_f64, double, double)

/* f16 and bf16 convert as the device does (include/cuda_fp16.h, cuda_bf16.h). */
static float f16_to_f32(uint16_t h) { return cusim_f16_bits_to_f32(h); }
static uint16_t f32_to_f16(float f) { return cusim_f32_to_f16_bits(f); }
static float bf16_to_f32(uint16_t h) { return cusim_bf16_bits_to_f32(h); }
static uint16_t f32_to_bf16(float f) { return cusim_f32_to_bf16_bits(f); }

/* f16 and bf16: converted to float, reduced in rank order, rounded once. */
static void reduce_half(void *dst, const void *const *src, int nsrc, size_t m, ncclRedOp_t op, bool bf)
{
    enum { BLOCK = 256 };
    float acc[BLOCK];
    uint16_t *d = dst;
    for (size_t b = 0; b < m; b += BLOCK) {
        size_t k = m - b < BLOCK ? m - b : BLOCK;
        for (int q = 0; q < nsrc; q++) {
            const uint16_t *s = (const uint16_t *)src[q] + b;
            for (size_t i = 0; i < k; i++) {
                float v = bf ? bf16_to_f32(s[i]) : f16_to_f32(s[i]);
                if (q == 0)
                    acc[i] = v;
                else if (op == ncclSum || op == ncclAvg)
                    acc[i] += v;
                else if (op == ncclProd)
                    acc[i] *= v;
                else if (op == ncclMax)
                    acc[i] = v > acc[i] ? v : acc[i];
                else
                    acc[i] = v < acc[i] ? v : acc[i];
            }
        }
        for (size_t i = 0; i < k; i++) {
            float v = op == ncclAvg ? acc[i] / (float)nsrc : acc[i];
            d[b + i] = bf ? f32_to_bf16(v) : f32_to_f16(v);
        }
    }
}

void cusim_nccl_reduce(ncclDataType_t t, ncclRedOp_t op, void *dst, const void *const *src, int nsrc,
                       size_t m)
{
    switch (t) {
    case ncclInt8: reduce_i8(dst, src, nsrc, m, op); return;
    case ncclUint8: reduce_u8(dst, src, nsrc, m, op); return;
    case ncclInt32: reduce_i32(dst, src, nsrc, m, op); return;
    case ncclUint32: reduce_u32(dst, src, nsrc, m, op); return;
    case ncclInt64: reduce_i64(dst, src, nsrc, m, op); return;
    case ncclUint64: reduce_u64(dst, src, nsrc, m, op); return;
    case ncclFloat16: reduce_half(dst, src, nsrc, m, op, false); return;
    case ncclFloat32: reduce_f32(dst, src, nsrc, m, op); return;
    case ncclFloat64: reduce_f64(dst, src, nsrc, m, op); return;
    case ncclBfloat16: reduce_half(dst, src, nsrc, m, op, true); return;
    case ncclNumTypes: break;
    }
    abort(); /* checked at the API */
}
