/* rng.h — counter-based random numbers (Philox-4x32-10).
 *
 * A value is a pure function of (key, counter): no state to carry, so any
 * rank can produce any element of any tensor, or any position of the data
 * order, without producing the ones before it (docs/design.md, invariant 1). */
#ifndef TRD_RNG_H
#define TRD_RNG_H

#include <stdint.h>

/* Four 32-bit outputs for a 128-bit counter (c0..c3) and 64-bit key. */
void rng_philox(uint32_t out[4], uint64_t counter_lo, uint64_t counter_hi, uint64_t key);

/* 64-bit FNV-1a of a string: stable across runs and machines. */
uint64_t rng_hash_str(const char *s);

/* Mix two 64-bit values into one key (splitmix64 finaliser). */
uint64_t rng_mix(uint64_t a, uint64_t b);

/* Standard normal for element `index` of the stream `key` (Box-Muller). */
float rng_normal(uint64_t key, uint64_t index);

/* Uniform 64-bit value for element `index` of the stream `key`. */
uint64_t rng_u64(uint64_t key, uint64_t index);

/* Uniform in [0, 1) with 53 random bits, from rng_u64 of the same element. */
double rng_uniform(uint64_t key, uint64_t index);

#endif
