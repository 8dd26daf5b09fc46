/* Philox against the published known-answer vectors, and the normal
 * sampler's moments. */
#include <stdint.h>

#include "check.h"
#include "core/rng.h"

int main(void)
{
    /* Known-answer tests from Random123 (kat_vectors): philox4x32-10. */
    uint32_t r[4];
    rng_philox(r, 0, 0, 0);
    CHECK(r[0] == 0x6627e8d5u && r[1] == 0xe169c58du && r[2] == 0xbc57ac4cu && r[3] == 0x9b00dbd8u,
          "zero vector: %08x %08x %08x %08x", r[0], r[1], r[2], r[3]);
    rng_philox(r, 0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull);
    CHECK(r[0] == 0x408f276du && r[1] == 0x41c83b0eu && r[2] == 0xa20bc7c6u && r[3] == 0x6d5451fdu,
          "ones vector: %08x %08x %08x %08x", r[0], r[1], r[2], r[3]);
    /* counter words (0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344),
     * key (0xa4093822, 0x299f31d0) */
    rng_philox(r, 0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull);
    CHECK(r[0] == 0xd16cfe09u && r[1] == 0x94fdccebu && r[2] == 0x5001e420u && r[3] == 0x24126ea1u,
          "pi vector: %08x %08x %08x %08x", r[0], r[1], r[2], r[3]);

    /* The normal stream: mean ~0, variance ~1 over 1e6 draws. */
    double s = 0, s2 = 0;
    const int n = 1000000;
    for (int i = 0; i < n; i++) {
        double x = rng_normal(12345, (uint64_t)i);
        s += x;
        s2 += x * x;
    }
    CHECK_CLOSE(s / n, 0.0, 0, 5e-3, "normal mean");
    CHECK_CLOSE(s2 / n, 1.0, 0, 5e-3, "normal variance");
    CHECK(rng_normal(1, 7) == rng_normal(1, 7), "pure function");
    CHECK(rng_hash_str("a") != rng_hash_str("b"), "hash separates names");
    return check_summary("rng");
}
