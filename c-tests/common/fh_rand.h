/* The C tests' one seeded random generator: splitmix64 (Steele, Lea and Flood, "Fast Splittable
 * Pseudorandom Number Generators", OOPSLA 2014). Any seed, 0 included, gives a full-period
 * sequence whose every output bit is usable (no `>> 8` of a weak LCG); one uint64_t of state a
 * stream, so a run is reproduced from its seeds. No lock, no allocation: safe in workers,
 * around fork and in signal handlers. */
#ifndef FH_RAND_H
#define FH_RAND_H

#include <stdint.h>

static inline uint64_t fh_rand(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
