/* np_random.c - numpy's SeedSequence, PCG64 and bounded integers (see np_random.h). Constants and
 * steps follow numpy/random/bit_generator.pyx (SeedSequence), numpy/random/src/pcg64/pcg64.h
 * (PCG64 XSL-RR) and numpy/random/src/distributions/distributions.c (Lemire bounded draws). */
#include "engine/np_random.h"

#include <string.h>

__extension__ typedef unsigned __int128 u128_t;

/* SeedSequence hashing constants (bit_generator.pyx). */
#define NP_SS_POOL_WORDS 4
#define NP_SS_INIT_A     0x43b0d7e5u
#define NP_SS_MULT_A     0x931e8875u
#define NP_SS_INIT_B     0x8b51f9ddu
#define NP_SS_MULT_B     0x58f38dedu
#define NP_SS_MIX_MULT_L 0xca01f9ddu
#define NP_SS_MIX_MULT_R 0x4973f715u
#define NP_SS_XSHIFT     16

/* PCG_DEFAULT_MULTIPLIER_128 (pcg64.h). */
#define NP_PCG_MULT_HI 0x2360ed051fc65da4ull
#define NP_PCG_MULT_LO 0x4385df649fccf645ull

static uint32_t hashmix(uint32_t value, uint32_t *hash_const)
{
    value ^= *hash_const;
    *hash_const *= NP_SS_MULT_A;
    value *= *hash_const;
    value ^= value >> NP_SS_XSHIFT;
    return value;
}

static uint32_t mix(uint32_t x, uint32_t y)
{
    uint32_t result = NP_SS_MIX_MULT_L * x - NP_SS_MIX_MULT_R * y;
    return result ^ (result >> NP_SS_XSHIFT);
}

/* SeedSequence(seed).generate_state(4, np.uint64) into words_out. */
static void seed_sequence_state(uint64_t seed, uint64_t words_out[4])
{
    uint32_t entropy[2];
    size_t n_entropy = 0;
    uint32_t pool[NP_SS_POOL_WORDS];
    uint32_t hash_const = NP_SS_INIT_A;
    uint32_t state32[8];

    /* _int_to_uint32_array: little-endian 32-bit words, [0] for 0 */
    do {
        entropy[n_entropy++] = (uint32_t)(seed & 0xffffffffu);
        seed >>= 32;
    } while (seed != 0);

    for (size_t i = 0; i < NP_SS_POOL_WORDS; i++) {
        pool[i] = hashmix(i < n_entropy ? entropy[i] : 0u, &hash_const);
    }
    for (size_t src = 0; src < NP_SS_POOL_WORDS; src++) {
        for (size_t dst = 0; dst < NP_SS_POOL_WORDS; dst++) {
            if (src != dst) {
                pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
            }
        }
    }
    /* entropy longer than the pool is mixed in afterwards; two words never are */

    hash_const = NP_SS_INIT_B;
    for (size_t i = 0; i < 8; i++) {
        uint32_t value = pool[i % NP_SS_POOL_WORDS];
        value ^= hash_const;
        hash_const *= NP_SS_MULT_B;
        value *= hash_const;
        value ^= value >> NP_SS_XSHIFT;
        state32[i] = value;
    }
    for (size_t i = 0; i < 4; i++) {
        words_out[i] = (uint64_t)state32[2 * i] | ((uint64_t)state32[2 * i + 1] << 32);
    }
}

static u128_t join(uint64_t hi, uint64_t lo)
{
    return ((u128_t)hi << 64) | lo;
}

static void pcg_step(engine_np_rng_t *rng)
{
    u128_t state = join(rng->state_hi, rng->state_lo);
    state = state * join(NP_PCG_MULT_HI, NP_PCG_MULT_LO) + join(rng->inc_hi, rng->inc_lo);
    rng->state_hi = (uint64_t)(state >> 64);
    rng->state_lo = (uint64_t)state;
}

void engine_np_rng_seed(uint64_t seed, engine_np_rng_t *rng_out)
{
    uint64_t words[4];
    u128_t inc;
    u128_t state;
    engine_np_rng_t rng;

    seed_sequence_state(seed, words);
    memset(&rng, 0, sizeof(rng));
    inc = (join(words[2], words[3]) << 1) | 1u;
    rng.inc_hi = (uint64_t)(inc >> 64);
    rng.inc_lo = (uint64_t)inc;
    pcg_step(&rng);
    state = join(rng.state_hi, rng.state_lo) + join(words[0], words[1]);
    rng.state_hi = (uint64_t)(state >> 64);
    rng.state_lo = (uint64_t)state;
    pcg_step(&rng);
    *rng_out = rng;
}

uint64_t engine_np_rng_next_u64(engine_np_rng_t *rng)
{
    uint64_t x;
    unsigned rot;

    pcg_step(rng);
    x = rng->state_hi ^ rng->state_lo;
    rot = (unsigned)(rng->state_hi >> 58);
    return (x >> rot) | (x << ((64u - rot) & 63u));
}

static uint32_t next_u32(engine_np_rng_t *rng)
{
    uint64_t next;

    if (rng->has_u32) {
        rng->has_u32 = 0;
        return rng->u32;
    }
    next = engine_np_rng_next_u64(rng);
    rng->has_u32 = 1;
    rng->u32 = (uint32_t)(next >> 32);
    return (uint32_t)next;
}

/* The next draw of `bits` (32 or 64) random bits: a whole u64, or the buffered half of one. */
static uint64_t next_bits(engine_np_rng_t *rng, unsigned bits)
{
    return bits == 64 ? engine_np_rng_next_u64(rng) : next_u32(rng);
}

/*
 * A draw in [0, range] by Lemire's method on `bits`-bit draws: bits 64 is numpy's
 * bounded_lemire_uint64 (range < 2^64 - 1), bits 32 its buffered_bounded_lemire_uint32
 * (range < 2^32 - 1). The same draws and rejections as numpy for either width.
 */
static uint64_t lemire(engine_np_rng_t *rng, uint64_t range, unsigned bits)
{
    const uint64_t mask = bits == 64 ? UINT64_MAX : UINT32_MAX;
    const uint64_t range_excl = range + 1;
    u128_t m = (u128_t)next_bits(rng, bits) * range_excl;
    uint64_t leftover = (uint64_t)m & mask;

    if (leftover < range_excl) {
        const uint64_t threshold = (mask - range) % range_excl;
        while (leftover < threshold) {
            m = (u128_t)next_bits(rng, bits) * range_excl;
            leftover = (uint64_t)m & mask;
        }
    }
    return (uint64_t)(m >> bits);
}

tdm_status_t engine_np_rng_integers_i64(engine_np_rng_t *rng, int64_t low, int64_t high, size_t n,
                                        int64_t *values_out)
{
    uint64_t range;

    if ((n > 0 && (rng == NULL || values_out == NULL)) || high <= low) {
        return TDM_ERR_INVALID_ARG;
    }
    range = (uint64_t)high - (uint64_t)low - 1u;
    for (size_t i = 0; i < n; i++) {
        uint64_t draw;
        if (range == 0) {
            draw = 0;
        } else if (range < UINT32_MAX) {
            draw = lemire(rng, range, 32);
        } else if (range == UINT32_MAX) {
            draw = next_u32(rng);
        } else {
            draw = lemire(rng, range, 64); /* range <= 2^64 - 2 for int64 bounds */
        }
        values_out[i] = (int64_t)((uint64_t)low + draw);
    }
    return TDM_OK;
}
