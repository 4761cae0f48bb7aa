/* openai.h - OpenAI-compatible JSON bodies: responses, stream chunks, usage, models, logprobs.
 *
 * Builds the JSON the generation endpoints answer with (chat.completion, chat.completion.chunk,
 * text_completion) from text, finish reasons, usage counts and per-token log-probabilities.
 * Owns the per-request log-probability accumulator. Knows nothing of HTTP, SSE framing or the
 * cluster. Thread-safe given distinct objects (the tokenizer is read-only).
 */
#ifndef TANDEM_ROUTER_OPENAI_H
#define TANDEM_ROUTER_OPENAI_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "text/tokenizer.h"
#include "router/validate.h"

/* Identity shared by every body of one response (plain data; strings borrowed). */
typedef struct {
    router_api_t api;
    const char *id;    /* "chatcmpl-..." or "cmpl-..." */
    const char *model; /* served model name */
    int64_t created_s; /* Unix time of the request (wall clock: display only) */
} router_openai_ctx_t;

/* Token counts of a response's "usage" (plain data). completion_tokens sums every choice;
 * cached_tokens: prompt tokens reused from the session's KV instead of prefilled
 * (usage.prompt_tokens_details.cached_tokens). */
typedef struct {
    uint64_t prompt_tokens;
    uint64_t completion_tokens;
    uint64_t cached_tokens;
} router_openai_usage_t;

/* One choice of a whole response (plain data; borrowed). */
typedef struct {
    const char *text; /* [n_text] bytes of valid UTF-8 */
    size_t n_text;
    const char *finish_reason; /* "stop", "length" or "tool_calls" */
    const json_t *logprobs;    /* folded value (router_openai_logprobs_fold) or NULL */
    const json_t *message;     /* chat: the whole message object (agent output: content,
                                  reasoning_content, tool_calls) used instead of text; or NULL */
} router_openai_choice_t;

/*
 * router_openai_logprob_entry - the log-probability JSON of one generated token in the
 * endpoint's format (chat: {"token","logprob","bytes","top_logprobs"}; completions: the token
 * text plus its logprob and top map, as a small object the caller folds with
 * router_openai_logprobs_fold). top: [n_top] ids and log-probabilities. New reference, or NULL
 * when out of memory.
 */
json_t *router_openai_logprob_entry(router_api_t api, const text_tokenizer_t *tok, int32_t id,
                                    float logprob, const int32_t *top_ids,
                                    const float *top_logprobs, size_t n_top);

/*
 * router_openai_logprobs_fold - the "logprobs" value of a choice from `entries` (an array of
 * router_openai_logprob_entry results; borrowed): chat {"content": entries}; completions
 * {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, where text_offset counts bytes of
 * the whole output from `first_offset` (0 for a whole body; a streamed chunk passes the bytes of
 * the tokens streamed before it, so offsets never restart). New reference or NULL.
 */
json_t *router_openai_logprobs_fold(router_api_t api, const json_t *entries, size_t first_offset);

/* router_openai_logprobs_text_bytes - the bytes entries[0, n) add to text_offset (the sum of
 * their token texts' lengths); n is clamped to the array's size. */
size_t router_openai_logprobs_text_bytes(const json_t *entries, size_t n);

/*
 * router_openai_chunk - one streaming chunk of choice `index` as compact JSON text (caller frees
 * with free()). text: [n_text] bytes of new output (valid UTF-8). role_first: chat only, the
 * choice's first chunk carries delta.role. finish_reason: "stop", "length", "tool_calls" or NULL.
 * logprobs: a folded value or NULL (borrowed). NULL when out of memory.
 */
char *router_openai_chunk(const router_openai_ctx_t *ctx, uint32_t index, const char *text,
                          size_t n_text, int role_first, const char *finish_reason,
                          const json_t *logprobs);

/*
 * router_openai_chunk_delta - a chat.completion.chunk of choice `index` with `delta` (taken; an
 * object such as {"reasoning_content": ...} or {"tool_calls": [...]}); finish_reason and logprobs
 * as router_openai_chunk. Compact JSON text (free()), NULL when out of memory.
 */
char *router_openai_chunk_delta(const router_openai_ctx_t *ctx, uint32_t index, json_t *delta,
                                const char *finish_reason, const json_t *logprobs);

/*
 * router_openai_string - text[0, n_text) as a JSON string; "\uFFFD" when it is not valid UTF-8
 * (never NULL unless out of memory). New reference.
 */
json_t *router_openai_string(const char *text, size_t n_text);

/* router_openai_usage_chunk - the final usage-only chunk (choices [], stream_options
 * include_usage). free() the text; NULL when out of memory. */
char *router_openai_usage_chunk(const router_openai_ctx_t *ctx, const router_openai_usage_t *u);

/*
 * router_openai_response - the whole non-streamed response as JSON text (free()): choices[i] has
 * index i, then usage. NULL when out of memory.
 */
char *router_openai_response(const router_openai_ctx_t *ctx, const router_openai_choice_t *choices,
                             uint32_t n_choices, const router_openai_usage_t *u);

/* router_openai_models - the GET /v1/models body for one served model (free()): its id,
 * max_model_len (tokens, prompt + completion) and vocab_size (valid token ids are 0 .. n_vocab-1,
 * for clients that send token-id prompts, e.g. tandem-bench). NULL when out of memory. */
char *router_openai_models(const char *model, uint32_t max_context, uint32_t n_vocab);

/* router_openai_model - the GET /v1/models/{id} body: the one model object of that list
 * (free()). NULL when out of memory. */
char *router_openai_model(const char *model, uint32_t max_context, uint32_t n_vocab);

#endif
