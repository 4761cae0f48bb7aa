/* constrain.h - constrained decoding: the token mask of a byte-level constraint
 * (text/constrain.h) over a model's vocabulary.
 *
 * engine_constrain_vocab_t is built once per vocabulary: every ordinary token's byte string in a
 * byte trie laid out in depth-first order (each node knows where its subtree ends); for the two
 * free states of text/constrain.h (inside a JSON string; inside raw text) the bitset of the
 * tokens every such state accepts (text_constraint_string_class, _is_plain_raw_bytes) and a trie
 * of only the tokens whose fate depends on what follows (those that close the string; those
 * with a '<' or not plain in raw text). The mask of a state walks the trie once, stepping the
 * automaton along shared prefixes and skipping a whole subtree at the first byte the automaton
 * refuses; in a free state it starts from the precomputed bitset and walks only the small
 * trie of the rest. Control tokens (chat markers, EOS; not the DSML marker) are never in a trie:
 * the stop ids of the request are allowed exactly when the text so far is complete
 * (text_constraint_accepting) and nothing else is then allowed.
 *
 * engine_constraint_t is one request's constraint: the compiled automaton, its current state,
 * the mask of that state (computed on demand, cached until the state moves) and a walk scratch
 * sized at create. The sampling node masks the logits (-inf outside the mask) before
 * engine_sampler_sample, so temperature, top-k, top-p and min-p all act on the allowed tokens
 * only and greedy stays greedy over them; the reported log-probabilities are then those of the
 * masked logits. The caller advances the state by every emitted token.
 *
 * Knows nothing of the forward pass, the scheduler or the transport. Not thread-safe per
 * engine_constraint_t; a vocabulary is read-only after create and may be shared.
 */
#ifndef TANDEM_ENGINE_CONSTRAIN_H
#define TANDEM_ENGINE_CONSTRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "text/constrain.h"
#include "text/tokenizer.h"

/* A vocabulary's tries and plain-string set; opaque. */
typedef struct engine_constrain_vocab engine_constrain_vocab_t;

/* One request's constraint; opaque. */
typedef struct engine_constraint engine_constraint_t;

/* A saved state of an engine_constraint_t (engine_constraint_mark / _rewind). Plain data. */
typedef struct {
    text_constraint_state_t state;
    int finished;
} engine_constraint_mark_t;

/*
 * engine_constrain_vocab_create - the tries of a vocabulary given as byte strings.
 *
 * n_vocab:  ids [0, n_vocab), n_vocab in [1, INT32_MAX].
 * bytes:    [n_vocab] token byte strings; lens [n_vocab] their lengths. A token with length 0
 *           (or a NULL entry), or longer than 4096 bytes, is never allowed by a mask (control
 *           tokens, ids the tokenizer lacks). Copied: borrowed for the call only.
 * Returns TDM_OK and *vocab_out (engine_constrain_vocab_destroy frees it), TDM_ERR_INVALID_ARG
 * (NULL, n_vocab out of range), TDM_ERR_NO_MEMORY.
 * Cost: a sort of the byte strings and one pass (about 0.1-0.3 s at 129,280 tokens).
 */
tdm_status_t engine_constrain_vocab_create(int64_t n_vocab, const uint8_t *const *bytes,
                                           const size_t *lens,
                                           engine_constrain_vocab_t **vocab_out);

/*
 * engine_constrain_vocab_from_tokenizer - engine_constrain_vocab_create over `tok` (borrowed):
 * NORMAL tokens with their decoded bytes, USER_DEFINED (added, non-special) tokens and the DSML
 * markup token "｜DSML｜" (special in DeepSeek-V4's vocabulary, written by the model inside its
 * tool-call markup) with their text (text_tokenizer_token_bytes); other CONTROL tokens, UNUSED
 * tokens and ids in [tokenizer vocab, n_vocab) are never allowed. Same returns.
 */
tdm_status_t engine_constrain_vocab_from_tokenizer(const text_tokenizer_t *tok, int64_t n_vocab,
                                                   engine_constrain_vocab_t **vocab_out);

/* engine_constrain_vocab_destroy - free; accepts NULL. */
void engine_constrain_vocab_destroy(engine_constrain_vocab_t *vocab);

/* Sizes of a vocabulary's tries (for benchmarks and logs). */
typedef struct {
    uint32_t all_tokens, all_nodes;       /* every token with bytes */
    uint32_t string_tokens, string_nodes; /* tokens walked inside a free JSON string */
    uint32_t raw_tokens, raw_nodes;       /* tokens walked inside free raw text */
} engine_constrain_vocab_stats_t;

/* engine_constrain_vocab_stats - the sizes of the vocabulary's tries. */
void engine_constrain_vocab_stats(const engine_constrain_vocab_t *vocab,
                                  engine_constrain_vocab_stats_t *stats_out);

/* engine_constrain_vocab_n - ids of the vocabulary (n_vocab at create). */
int64_t engine_constrain_vocab_n(const engine_constrain_vocab_t *vocab);

/*
 * engine_constraint_create - a request's constraint from its response_format JSON
 * (text_constraint_compile; n_json bytes, borrowed) over `vocab` (borrowed; must outlive it).
 * stop_ids [n_stop_ids]: the ids that end the completion (EOS); allowed only where the text is
 * complete. n_stop_ids >= 1: without a stop id the completion could never end.
 *
 * Returns TDM_OK and *out (engine_constraint_destroy frees it); TDM_ERR_INVALID_ARG (a schema
 * text_constraint_compile refuses: err says which keyword; no stop id; a stop id out of range);
 * TDM_ERR_NO_MEMORY. Does not log.
 */
tdm_status_t engine_constraint_create(const engine_constrain_vocab_t *vocab, const char *json,
                                      size_t n_json, const int32_t *stop_ids, int n_stop_ids,
                                      engine_constraint_t **out, char *err, size_t err_bytes);

/*
 * engine_constraint_create_compiled - as engine_constraint_create, taking ownership of an
 * already compiled automaton `compiled` (freed with the constraint, also on failure).
 */
tdm_status_t engine_constraint_create_compiled(const engine_constrain_vocab_t *vocab,
                                               text_constraint_t *compiled, const int32_t *stop_ids,
                                               int n_stop_ids, engine_constraint_t **out);

/*
 * engine_constraint_create_tool_calls - as engine_constraint_create for the tool-call language
 * (text_constraint_compile_tool_calls: a DSML block calling the allowed tools with arguments
 * that satisfy their parameter schemas).
 */
tdm_status_t engine_constraint_create_tool_calls(const engine_constrain_vocab_t *vocab,
                                                 const char *json, size_t n_json,
                                                 const int32_t *stop_ids, int n_stop_ids,
                                                 engine_constraint_t **out, char *err,
                                                 size_t err_bytes);

/*
 * engine_constraint_create_request - the constraint of a request's SamplingParams: from
 * `response_format` when it is non-empty, else from `tool_calls` when that is, else none
 * (*out = NULL, TDM_OK). Both non-empty: TDM_ERR_INVALID_ARG. vocab NULL with a constraint asked
 * for: TDM_ERR_UNSUPPORTED (err names tokenizer.json). Other returns as the two creates.
 */
tdm_status_t engine_constraint_create_request(const engine_constrain_vocab_t *vocab,
                                              const char *response_format, const char *tool_calls,
                                              const int32_t *stop_ids, int n_stop_ids,
                                              engine_constraint_t **out, char *err,
                                              size_t err_bytes);

/*
 * engine_constraint_clone - a new constraint of the same language and vocabulary in the same state
 * as `c` (the choices forked from one prompt each advance their own). Only for constraints made by
 * engine_constraint_create_request (TDM_ERR_INVALID_ARG otherwise); TDM_ERR_NO_MEMORY.
 */
tdm_status_t engine_constraint_clone(const engine_constraint_t *c, engine_constraint_t **out);

/* engine_constraint_destroy - free; accepts NULL. */
void engine_constraint_destroy(engine_constraint_t *c);

/*
 * engine_constraint_mask - the allowed tokens of the current state: bit x of word x / 64 is set
 * when token x keeps the text inside the language (or is a stop id and the text is complete).
 * *mask_out is borrowed: valid until the next advance, rewind or destroy; (n_vocab + 63) / 64
 * words. After a stop id was taken nothing is allowed. Computed once per state (cached).
 */
const uint64_t *engine_constraint_mask(engine_constraint_t *c);

/*
 * engine_constraint_apply - logits[x] = -inf for every token the mask refuses (n_vocab must be
 * the vocabulary's). Returns TDM_OK; TDM_ERR_INVALID_ARG (n_vocab differs; logits unchanged);
 * TDM_ERR_INTERNAL when no token is allowed at all (logits unchanged; the caller fails the
 * request: a state no token of this vocabulary continues).
 */
tdm_status_t engine_constraint_apply(engine_constraint_t *c, float *logits, int64_t n_vocab);

/*
 * engine_constraint_advance - move the state by `token`. Returns TDM_OK, or TDM_ERR_INVALID_ARG
 * when the mask refuses it (state unchanged).
 */
tdm_status_t engine_constraint_advance(engine_constraint_t *c, int32_t token);

/* engine_constraint_allows - nonzero when the current mask allows `token`. */
int engine_constraint_allows(engine_constraint_t *c, int32_t token);

/* engine_constraint_finished - nonzero once a stop id was taken. */
int engine_constraint_finished(const engine_constraint_t *c);

/* engine_constraint_mark / engine_constraint_rewind - save and restore the state (speculative
 * verification advances along drafts, then the caller rewinds and advances by what it emits). */
void engine_constraint_mark(const engine_constraint_t *c, engine_constraint_mark_t *mark_out);
void engine_constraint_rewind(engine_constraint_t *c, const engine_constraint_mark_t *mark);

#endif
