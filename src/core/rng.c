#include "core/rng.h"
#include "core/philox.h"

#include <math.h>

/* The steps are philox.h's, which the CUDA kernels compile too. */
void rng_philox(uint32_t out[4], uint64_t counter_lo, uint64_t counter_hi, uint64_t key)
{
    trd_philox4x32(out, counter_lo, counter_hi, key);
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

double rng_uniform(uint64_t key, uint64_t index)
{
    return (double)(rng_u64(key, index) >> 11) * 0x1.0p-53;
}
