/* philox.h — the one Philox-4x32-10 (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11): ten rounds of multiply-xor with a
 * Weyl key schedule.  Inline and header-only so that the CPU (rng.c's
 * rng_philox) and the CUDA kernels (kernels/vector.cu's dropout masks)
 * compile the same steps and draw the same words by construction. */
#ifndef TRD_PHILOX_H
#define TRD_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define TRD_PHILOX_FN __host__ __device__ static inline
#else
#define TRD_PHILOX_FN static inline
#endif

/* Four 32-bit words for the 128-bit counter (lo, hi) and the 64-bit key. */
TRD_PHILOX_FN void trd_philox4x32(uint32_t out[4], uint64_t lo, uint64_t hi, uint64_t key)
{
    uint32_t c0 = (uint32_t)lo, c1 = (uint32_t)(lo >> 32);
    uint32_t c2 = (uint32_t)hi, c3 = (uint32_t)(hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
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

#endif
