/* tokens.h - deterministic prompt token ids for Mooncake turns.
 *
 * A Mooncake request names the 512-token blocks of its prompt by hash id. Each id becomes the
 * same block of token ids every time (a SplitMix64 stream keyed by the id and a run salt), so two
 * prompts that share hash ids share a real token prefix and the server's prefix cache sees the
 * reuse the trace recorded. `scale` shrinks every block and length for CPU runs. Ids stay in
 * [BENCH_TOKEN_FIRST_ID, vocab_size - BENCH_TOKEN_TOP_RESERVED): 0..2 and the top two ids are
 * special tokens in most vocabularies. Owns nothing; pure functions, thread-safe.
 */
#ifndef TANDEM_BENCH_TOKENS_H
#define TANDEM_BENCH_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "bench/replay/trace.h"
#include "common/status.h"

#define BENCH_TOKEN_FIRST_ID     3  /* ids 0, 1, 2 are never emitted */
#define BENCH_TOKEN_TOP_RESERVED 2  /* neither are vocab_size - 2 and vocab_size - 1 */
#define BENCH_TOKEN_MIN_VOCAB    16 /* smallest vocabulary accepted */

/* How tokens are made for one run. Plain data. */
typedef struct {
    uint32_t vocab_size; /* >= BENCH_TOKEN_MIN_VOCAB */
    double scale;        /* (0, 1]: lengths and the block size are multiplied by it */
    uint64_t salt;       /* mixed into every block: a new salt gives unrelated tokens */
} bench_token_params_t;

/*
 * bench_tokens_check - TDM_OK when vocab_size >= BENCH_TOKEN_MIN_VOCAB and 0 < scale <= 1,
 * else TDM_ERR_INVALID_ARG.
 */
tdm_status_t bench_tokens_check(const bench_token_params_t *params);

/* bench_tokens_block_size - tokens per scaled block: max(1, round(512 * scale)). */
size_t bench_tokens_block_size(double scale);

/* bench_tokens_scaled - max(1, round(n_tokens * scale)): a scaled input or output length. */
size_t bench_tokens_scaled(int64_t n_tokens, double scale);

/*
 * bench_tokens_block - write the `n_tokens` first ids of block `hash_id` to tokens_out
 * (n_tokens <= bench_tokens_block_size(scale) for the prompt to match; any n works).
 * Same params and id, same tokens. Not checked: call bench_tokens_check first.
 */
void bench_tokens_block(const bench_token_params_t *params, int64_t hash_id, uint32_t *tokens_out,
                        size_t n_tokens);

/*
 * bench_tokens_prompt - the scaled prompt of `turn`: its hash-id blocks in order, each
 * bench_tokens_block_size(scale) tokens, cut to bench_tokens_scaled(input_length, scale).
 * Blocks the trace does not name (no hash_ids, or input longer than its blocks) get ids unique
 * to the turn's line and block position. `tokens_out` holds n_max entries; *n_out gets the
 * prompt length. Returns TDM_OK, or TDM_ERR_INVALID_ARG when n_max is too small (nothing
 * written to *n_out) or the params fail bench_tokens_check.
 */
tdm_status_t bench_tokens_prompt(const bench_token_params_t *params, const bench_turn_t *turn,
                                 uint32_t *tokens_out, size_t n_max, size_t *n_out);

#endif
