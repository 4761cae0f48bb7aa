#include "common/hash.h"

#include <xxhash.h>

uint64_t tdm_hash_xxh3_64(const void *data, size_t n_bytes)
{
    return (uint64_t)XXH3_64bits(data, n_bytes);
}

uint64_t tdm_hash_xxh3_64_seeded(const void *data, size_t n_bytes, uint64_t seed)
{
    return (uint64_t)XXH3_64bits_withSeed(data, n_bytes, (XXH64_hash_t)seed);
}

uint64_t tdm_hash_splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
