/* tokens.c - deterministic token ids from hash ids; see tokens.h. */
#include "bench/replay/tokens.h"

#include "common/hash.h"

#include <math.h>

/* Mixes the salt into the id so salts give unrelated streams. */
#define TOKENS_SALT_MIX 0xD6E8FEB86659FD93ULL
/* Pseudo hash ids for blocks a trace does not name: top bit set, so never a trace id. */
#define TOKENS_PSEUDO_ID_BIT (1ULL << 63)

tdm_status_t bench_tokens_check(const bench_token_params_t *params)
{
    if (params->vocab_size < BENCH_TOKEN_MIN_VOCAB || !(params->scale > 0.0) ||
        params->scale > 1.0) {
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

size_t bench_tokens_block_size(double scale)
{
    double n = round((double)BENCH_TRACE_BLOCK_TOKENS * scale);
    return n < 1.0 ? 1 : (size_t)n;
}

size_t bench_tokens_scaled(int64_t n_tokens, double scale)
{
    double n = round((double)n_tokens * scale);
    return n < 1.0 ? 1 : (size_t)n;
}

static void block_of_key(const bench_token_params_t *params, uint64_t key, uint32_t *tokens_out,
                         size_t n_tokens)
{
    uint64_t state = tdm_hash_splitmix64(key ^ (params->salt * TOKENS_SALT_MIX));
    uint32_t n_ids = params->vocab_size - BENCH_TOKEN_FIRST_ID - BENCH_TOKEN_TOP_RESERVED;

    for (size_t i = 0; i < n_tokens; i++) {
        uint64_t x = tdm_hash_splitmix64(state + i);
        tokens_out[i] = BENCH_TOKEN_FIRST_ID + (uint32_t)(x % n_ids);
    }
}

void bench_tokens_block(const bench_token_params_t *params, int64_t hash_id, uint32_t *tokens_out,
                        size_t n_tokens)
{
    block_of_key(params, (uint64_t)hash_id, tokens_out, n_tokens);
}

tdm_status_t bench_tokens_prompt(const bench_token_params_t *params, const bench_turn_t *turn,
                                 uint32_t *tokens_out, size_t n_max, size_t *n_out)
{
    size_t n_prompt;
    size_t block;
    size_t n_done = 0;

    if (bench_tokens_check(params) != TDM_OK) {
        return TDM_ERR_INVALID_ARG;
    }
    n_prompt = bench_tokens_scaled(turn->input_length, params->scale);
    if (n_prompt > n_max) {
        return TDM_ERR_INVALID_ARG;
    }
    block = bench_tokens_block_size(params->scale);
    for (size_t b = 0; n_done < n_prompt; b++) {
        size_t n = n_prompt - n_done < block ? n_prompt - n_done : block;
        uint64_t key;
        if (b < turn->n_hash_ids) {
            key = (uint64_t)turn->hash_ids[b];
        } else {
            key =
                TOKENS_PSEUDO_ID_BIT | (tdm_hash_splitmix64(((uint64_t)turn->line << 24) ^ b) >> 1);
        }
        block_of_key(params, key, tokens_out + n_done, n);
        n_done += n;
    }
    *n_out = n_prompt;
    return TDM_OK;
}
