/* bench_ids.h - the benchmarks' seeded token ids (tandem-bench-engine, its --devices mode and
 * tandem-bench-prefill-batch): the same xorshift64 stream as tests/unit/forward_test_util.h's
 * ftu_prompt, so a benchmark's prompts are reproducible from their seed alone. */
#ifndef TANDEM_BENCH_BENCH_IDS_H
#define TANDEM_BENCH_BENCH_IDS_H

#include <stdint.h>

/* ids[0..n) in [3, V - 3): no BOS/EOS/PAD, image or DSpark noise token (V > 6). Xorshift64
 * (Marsaglia, "Xorshift RNGs", J. Stat. Softw. 8(14), 2003; shifts 13, 7, 17) from
 * seed * 0x9E3779B97F4A7C15 + 1. */
static inline void bench_seeded_ids(uint64_t seed, int64_t V, int32_t *ids, int64_t n)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = (int32_t)(3 + s % (uint64_t)(V - 6));
    }
}

#endif
