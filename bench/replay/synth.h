/* synth.h - synthetic coding-agent sessions written as Mooncake JSONL with session_id.
 *
 * Shapes (docs/BENCH.md has the table; every draw is lognormal, clamped):
 *   - every session starts with the same BENCH_SYNTH_SHARED_TOKENS-token system prompt and tool
 *     definitions (shared hash ids 0..6), then a task of median 1,200 tokens;
 *   - turns per session: median 12, sigma 1.1, 2..400; a session ends early when its context
 *     would pass BENCH_SYNTH_MAX_CONTEXT tokens;
 *   - each reply: median 110 output tokens (sigma 0.9, 4..4096);
 *   - each tool result appended to the context: 90% small (median 100 tokens, sigma 1.0),
 *     10% large file reads (median 2,000, sigma 0.8); the context grows by reply + result;
 *   - tool pause before the next turn: median 3 s (sigma 1.0, 0.2..120 s), written as `delay`;
 *   - sessions arrive as a Poisson process, mean gap 5 s; a turn's timestamp is the previous
 *     turn's plus an assumed service time (250 ms + 20 ms per output token) plus the pause.
 * Hash ids: a turn keeps the previous turn's full blocks and gets new ids for the rest (the
 * last, partial block changes as the context grows), as in Mooncake traces.
 * Output: requests sorted by timestamp. Same params, same bytes. Owns nothing.
 */
#ifndef TANDEM_BENCH_SYNTH_H
#define TANDEM_BENCH_SYNTH_H

#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

#define BENCH_SYNTH_SHARED_TOKENS 3584
#define BENCH_SYNTH_MAX_CONTEXT   200000

/* Plain data. */
typedef struct {
    uint64_t n_sessions; /* >= 1 */
    uint64_t seed;
} bench_synth_params_t;

/* What was written. Plain data. */
typedef struct {
    uint64_t n_requests;
    uint64_t n_sessions;
    int64_t input_p50; /* tokens, median over requests */
    int64_t input_max;
    int64_t output_p50;
    int64_t pause_p50_ms; /* over turns after the first */
    uint64_t n_over_100k; /* requests with input above 100,000 tokens */
} bench_synth_summary_t;

/*
 * bench_synth_write - write the trace to `out` and, when summary_out is non-NULL, its summary.
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (n_sessions 0; nothing written), TDM_ERR_NO_MEMORY or
 * TDM_ERR_IO (a write failed).
 */
tdm_status_t bench_synth_write(const bench_synth_params_t *params, FILE *out,
                               bench_synth_summary_t *summary_out);

#endif
