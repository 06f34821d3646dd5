/* cuda_matmul.h — the CUDA entry points of matmul (cuBLAS, in
 * tensor/cuda_blas.c) and of the fused causal attention
 * (tensor/ops_matmul.cu), called from tensor/ops_matmul.c, tensor/ops_conv.c
 * and tensor/ops_attention.c. Built only with CUDA.
 *
 * The conventions of cuda_impl.h hold: `dev` is made current, the work is
 * queued on its compute stream and the call returns without waiting;
 * pointers are device pointers to element 0; the result is EM_OK or an
 * error naming the op. */
#ifndef EMBER_CUDA_MATMUL_H
#define EMBER_CUDA_MATMUL_H

#include "cuda_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One strided-batched row-major product: for each b < batch,
 *     C_b (M,N) = op(A_b) (M,K) @ op(B_b) (K,N)
 * with X_b = x + b * stride_x (elements; a stride of 0 repeats the matrix).
 * op(X) is X stored row-major with row stride ld (trans false), or the
 * transpose of a row-major matrix of row stride ld (trans true), as in
 * BLAS. C is row-major with row stride ldc. A, B and C all have dtype dt:
 * f32 (TF32 tensor cores when tf32), f64, or f16/bf16 accumulated in f32
 * and rounded once into C. M, N, K, the lds and batch fit in an int, M, N,
 * K >= 1. */
typedef struct cu_gemm {
    em_dtype dt;
    bool tf32;
    int64_t M, N, K, batch;
    const void *a;
    bool ta;
    int64_t lda, stride_a;
    const void *b;
    bool tb;
    int64_t ldb, stride_b;
    void *c;
    int64_t ldc, stride_c;
} cu_gemm;
em_status cu_matmul(int dev, const cu_gemm *g);

/* The largest head dim the attention kernels take. */
enum { CU_ATTENTION_MAX_D = 128 };

/* Causal attention over BH heads, each a contiguous (T,D) block of q, k, v
 * (dtype dt: f32, f64, f16 or bf16; heads one after another):
 *     o_i = sum_{j<=i} softmax_j(s_ij) v_j,   s_ij = scale q_i . k_j
 * o (BH,T,D) of dtype dt; lse (BH,T) the log-sum-exp of each row's scores
 * (f64 for f64 inputs, else f32), which the backward needs. D <= 128. */
em_status cu_attention_forward(int dev, em_dtype dt, int64_t BH, int64_t T, int64_t D, double scale,
                               const void *q, const void *k, const void *v, void *o, void *lse);

/* The gradients of the forward above, from its inputs, its output o, its lse
 * and the output's gradient dout (all contiguous, (BH,T,D), dtype dt):
 * dq, dk, dv (contiguous, dtype dt) are written, not accumulated. */
em_status cu_attention_backward(int dev, em_dtype dt, int64_t BH, int64_t T, int64_t D, double scale,
                                const void *q, const void *k, const void *v, const void *o, const void *dout,
                                const void *lse, void *dq, void *dk, void *dv);

#ifdef __cplusplus
}
#endif
#endif
