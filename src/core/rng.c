#include "core/rng.h"

#include <math.h>

/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11): ten rounds of multiply-xor with a Weyl key schedule. */
void rng_philox(uint32_t out[4], uint64_t counter_lo, uint64_t counter_hi, uint64_t key)
{
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
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

uint64_t rng_hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t rng_mix(uint64_t a, uint64_t b)
{
    uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float rng_normal(uint64_t key, uint64_t index)
{
    uint32_t r[4];
    rng_philox(r, index, 0, key);
    /* u1 in (0,1], u2 in [0,1): 32-bit resolution is plenty for init. */
    double u1 = ((double)r[0] + 1.0) / 4294967296.0;
    double u2 = (double)r[1] / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t rng_u64(uint64_t key, uint64_t index)
{
    uint32_t r[4];
    rng_philox(r, index, 0, key);
    return ((uint64_t)r[0] << 32) | r[1];
}
