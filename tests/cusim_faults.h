/* cusim_faults.h — the entry points of tests/cusim_faults.cu: kernels with
 * planted bugs and their correct twins, for tests/test_cusim.c (sim build
 * only). Each launches one kernel on the current device's default stream
 * and returns the launch call's cudaError_t (0, or the error of a
 * configuration the device refuses); a checker's finding surfaces at the
 * next call that runs the launch. Pointers are device memory. */
#ifndef EMBER_TESTS_CUSIM_FAULTS_H
#define EMBER_TESTS_CUSIM_FAULTS_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* kernel reduce_in_shared, one block of n threads (a power of two):
 * out[0] = sum x[0..n); without the barrier in its loop, a race */
int cf_reduce_in_shared(const float *x, float *out, int n, bool barrier);
/* kernel barrier_in_branch, one block of n threads: out[t] = t; divergent:
 * threads below 16 wait at one __syncthreads, the others at another */
int cf_barrier_in_branch(int *out, int n, bool divergent);
/* kernel exit_before_barrier, one block of n threads: out[t] = t;
 * early_exit: threads 16 and up return before the barrier */
int cf_exit_before_barrier(int *out, int n, bool early_exit);
/* kernel shuffle_after_exit, one warp: lanes 16..31 return, lanes 0..15
 * set out[lane] = 100 (lane 0's value) through __shfl_sync(mask, ...) */
int cf_shuffle_after_exit(int *out, unsigned mask);
/* kernel write_indices: out[i] = i for i < n; one_past: also out[n] */
int cf_write_indices(int *out, int n, bool one_past);
/* kernel load_doubles: out[i] = the double at byte offset + 8 i of in */
int cf_load_doubles(double *out, const void *in, int offset, int n);
/* kernel last_writer_wins, blocks x threads: every thread stores its global
 * index into out[0]; atomic: atomicMax instead (the largest index) */
int cf_last_writer_wins(int *out, int blocks, int threads, bool atomic);
/* kernel through_shared, one block: out[t] = t through smem_bytes of
 * dynamic shared memory */
int cf_through_shared(int *out, int threads, size_t smem_bytes);
/* cudaFuncSetAttribute(through_shared, MaxDynamicSharedMemorySize, bytes) */
int cf_allow_dynamic_shared(int bytes);

/* kernel warp_exchange, two warps: out[t] = 10 * (t ^ 1) through static
 * shared memory, ordered by __syncwarp or (sync false) not: a race */
int cf_warp_exchange(int *out, bool sync);
/* kernel shuffle_then_barrier, two warps: lane 0 waits at __syncthreads
 * while its warp mates wait for it in __shfl_sync: a deadlock */
int cf_shuffle_then_barrier(int *out);
/* kernel traps, 64 threads: thread 3 calls __trap() */
int cf_trap(int *out);
/* kernel float_atomics, 4 x 64 threads: *acc += x[i] for i < n by atomicAdd */
int cf_float_atomics(float *acc, const float *x, int n);
/* kernel warp_ops, one warp: the results of shuffles and votes, out 7 x 32
 * ints (see cusim_faults.cu) */
int cf_warp_ops(int *out);
/* kernel rounding_modes, two threads: thread 0 rounds down, thread 1 to
 * nearest; out[t] = 1 / *three */
int cf_rounding_modes(float *out, const float *three);

/* kernel histogram, 4 x 128 threads: bins[b] += count of v[i] & 15 == b,
 * through shared-memory atomics */
int cf_histogram(const int *v, int n, int *bins);

/* the emulator's __float2half_rn, __half2float, __float2bfloat16_rn, on bits */
unsigned short cf_float2half_rn(float f);
float cf_half2float(unsigned short h);
unsigned short cf_float2bfloat16_rn(float f);

#ifdef __cplusplus
}
#endif
#endif
