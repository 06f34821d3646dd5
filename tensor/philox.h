/* philox.h — Philox4x32-10, the counter-based generator behind every random
 * number ember draws, written once for the CPU (tensor/rng.c's
 * em_philox4x32 and em_rand/randn/randint, tensor/ops_dropout.c) and for
 * CUDA devices (tensor/ops_nn.cu's dropout kernel): the same (key, counter)
 * gives the same four words on either, so a mask drawn on a device is the
 * CPU's, bit for bit.
 *
 * Ten rounds over four 32-bit words (c0..c3): each round multiplies c0 and
 * c2 by fixed odd constants, swaps the products' halves in with c1 and c3
 * and the key, then bumps the two key words by Weyl constants. */
#ifndef EMBER_PHILOX_H
#define EMBER_PHILOX_H

#include <stdint.h>

#include "hd.h"

/* out = Philox4x32-10 of the 128-bit counter (counter_hi, counter_lo) under
 * the 64-bit key. */
static inline EM_HD void philox4x32_10(uint64_t key, uint64_t counter_hi, uint64_t counter_lo,
                                       uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* A word's uniform number in [0,1): its top 24 bits (the f32 resolution), so
 * every float dtype draws the same numbers. */
static inline EM_HD double philox_u01(uint32_t w) { return (double)(w >> 8) * (1.0 / 16777216.0); }

#endif
