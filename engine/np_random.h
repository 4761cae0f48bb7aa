/* np_random.h - numpy's default_rng(seed).integers(low, high, dtype=int64), reproduced bit for bit.
 *
 * MODEL.md 9.2 defines a real checkpoint's Engram multipliers by a numpy call:
 * `default_rng(10007*l).integers(0, b_mu, size=N, dtype=int64)`. This module reproduces that
 * generator in C: SeedSequence (numpy/random/bit_generator.pyx: entropy mixing and
 * generate_state), PCG64 (XSL-RR 128/64, numpy/random/src/pcg64) seeded from four 64-bit state
 * words, and Generator.integers' bounded draws (Lemire's nearly divisionless method,
 * numpy/random/src/distributions/distributions.c random_bounded_uint64_fill, unmasked). Only
 * integer seeds (numpy's SeedSequence(int)) without spawn keys are covered. Owns nothing on the
 * heap; knows nothing of models. Checked against numpy 1.24 in tests/unit/test_convert.c.
 */
#ifndef TANDEM_ENGINE_NP_RANDOM_H
#define TANDEM_ENGINE_NP_RANDOM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/*
 * A numpy PCG64 bit generator (plain data; copy it to fork the stream).
 *
 * state_hi/lo, inc_hi/lo: the 128-bit LCG state and odd increment, as high and low 64 bits.
 * has_u32 / u32: numpy's buffered upper half of a 64-bit draw for 32-bit requests (PCG64's
 * next_uint32 returns the low half first, then the buffered high half).
 */
typedef struct {
    uint64_t state_hi;
    uint64_t state_lo;
    uint64_t inc_hi;
    uint64_t inc_lo;
    int has_u32;
    uint32_t u32;
} engine_np_rng_t;

/*
 * engine_np_rng_seed - *rng_out = numpy.random.default_rng(seed)'s PCG64: SeedSequence(seed)
 * (entropy = seed as little-endian 32-bit words, one word for seed < 2^32, pool of 4 words)
 * generates four uint64 words w0..w3; PCG64 seeds with initstate = w0:w1, initseq = w2:w3
 * (high:low), i.e. state = 0, inc = initseq*2+1, step, state += initstate, step.
 * Pure function.
 */
void engine_np_rng_seed(uint64_t seed, engine_np_rng_t *rng_out);

/* engine_np_rng_next_u64 - the next 64-bit output (step, then XSL-RR output). */
uint64_t engine_np_rng_next_u64(engine_np_rng_t *rng);

/*
 * engine_np_rng_integers_i64 - Generator.integers(low, high, size=n, dtype=np.int64) with the
 * default endpoint=False: n values in [low, high), written to values_out ([n] int64). Uses the
 * same draws numpy does: rng = high-low-1; rng == 0 gives low without a draw; rng < 2^32-1
 * Lemire 32-bit on 32-bit draws; rng == 2^32-1 raw 32-bit draws; otherwise Lemire 64-bit.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (rng or values_out NULL with n > 0, or high <= low;
 * nothing drawn).
 */
tdm_status_t engine_np_rng_integers_i64(engine_np_rng_t *rng, int64_t low, int64_t high, size_t n,
                                        int64_t *values_out);

#endif
