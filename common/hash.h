/* hash.h - hashing used by Tandem's formats: XXH3-64 (via libxxhash) and SplitMix64.
 *
 * XXH3-64 with seed 0 is the KV page checksum (MODEL.md section 7) and the block-hash chain;
 * SplitMix64 derives Engram multipliers of random checkpoints (MODEL.md 9.2, 12.8).
 */
#ifndef TANDEM_COMMON_HASH_H
#define TANDEM_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

/* tdm_hash_xxh3_64 - XXH3-64 (seed 0) of `n_bytes` at `data` (may be NULL when n_bytes is 0).
 * Source: xxHash specification, XXH3. */
uint64_t tdm_hash_xxh3_64(const void *data, size_t n_bytes);

/* tdm_hash_xxh3_64_seeded - XXH3-64 with a seed (chains: seed = previous block's hash). */
uint64_t tdm_hash_xxh3_64_seeded(const void *data, size_t n_bytes, uint64_t seed);

/*
 * tdm_hash_splitmix64 - the first output of a SplitMix64 generator whose state is `x`
 * (MODEL.md 12.8): z = x + 0x9E3779B97F4A7C15, two xor-shift-multiply rounds, final xor-shift.
 * Source: Steele, Lea & Flood 2014, "Fast splittable pseudorandom number generators".
 */
uint64_t tdm_hash_splitmix64(uint64_t x);

#endif
