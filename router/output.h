/* output.h - one response's output: generated token ids in, OpenAI chunks and bodies out.
 *
 * Owns the output stream (router_stream_t: detokenizer, stop strings, stop id, max_tokens), the
 * log-probability entries, and for agent requests the output parser (text/agentout.h) that splits
 * the text into reasoning_content, content and tool_calls (docs/PROTOCOL.md, "Agent output").
 * The parser runs for chat requests with thinking on, or with tools and a tool_choice other than
 * "none"; every other request is answered exactly as before it existed (content only).
 * Stop strings are matched on the generated text before it is parsed (as vLLM does): a stop
 * string ends the output wherever it occurs, in reasoning or inside markup too; markup cut off by
 * it is content. Knows nothing of the cluster, HTTP or SSE framing. One output, one thread.
 */
#ifndef TANDEM_ROUTER_OUTPUT_H
#define TANDEM_ROUTER_OUTPUT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/openai.h"
#include "router/stream.h"
#include "router/validate.h"
#include "text/tokenizer.h"

/* Parameters of router_output_create (plain data; all borrowed, must outlive the output). */
typedef struct {
    const text_tokenizer_t *tok;
    const router_gen_request_t *gen; /* stop strings, max_tokens, api, thinking, tools */
    const router_openai_ctx_t *octx; /* id, model, created of every body */
    int32_t stop_id;                 /* the token id that ends the output (EOS), or -1 */
    uint32_t index;                  /* the choice ("n") this output is: chunks carry it */
    uint64_t call_id_seed;           /* tool call ids derive from it: unique per response */
} router_output_params_t;

/* The output; opaque. */
typedef struct router_output router_output_t;

/* Receives one chunk's compact JSON text; takes ownership (free()). */
typedef void (*router_output_emit_fn_t)(void *ctx, char *json);

/*
 * router_output_create - a new output. Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL params or
 * fields, a stream parameter out of range) or TDM_ERR_NO_MEMORY; *output_out only on success.
 */
tdm_status_t router_output_create(const router_output_params_t *params,
                                  router_output_t **output_out);

/* router_output_destroy - free the output. Accepts NULL. */
void router_output_destroy(router_output_t *output);

/*
 * router_output_push - feed generated token `id` with its log-probability entry (a
 * router_openai_logprob_entry result; taken; NULL when logprobs are off). A token after the end
 * is ignored (its entry freed). Returns TDM_OK, TDM_ERR_INVALID_ARG (id outside the vocabulary:
 * nothing changed) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_output_push(router_output_t *output, int32_t id, json_t *logprob_entry);

/*
 * router_output_finish - the generator ended the output: if still running it ends with
 * `state_if_running` (ROUTER_STREAM_STOP or _LENGTH) and held text is released. Returns TDM_OK
 * or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_output_finish(router_output_t *output, router_stream_state_t state_if_running);

/* router_output_state - RUNNING until a stop id, stop string, max_tokens or finish ends it. */
router_stream_state_t router_output_state(const router_output_t *output);

/* router_output_n_tokens - tokens counted (usage completion_tokens). */
uint32_t router_output_n_tokens(const router_output_t *output);

/*
 * router_output_finish_reason - "stop" or "length" from the stream; for agent requests
 * "tool_calls" when at least one call was made and no call was left unfinished by max_tokens.
 */
const char *router_output_finish_reason(const router_output_t *output);

/*
 * router_output_drain - the streaming chunks for what was released since the last drain, in
 * order, each handed to emit(ctx, json): chat {"delta":{"content"}} (as before), for agent
 * requests also {"delta":{"reasoning_content"}}, {"delta":{"tool_calls":[{"index","id","type":
 * "function","function":{"name","arguments":""}}]}} when a call begins and
 * {"delta":{"tool_calls":[{"index","function":{"arguments":fragment}}]}} for its arguments;
 * completions {"text"}. The log-probabilities of the tokens since the last chunk ride on the first
 * chunk (completions' text_offset counts from the start of the output, not of the chunk); those of
 * tokens that released no text wait for the next chunk or the final one. No finish_reason
 * (router_output_final_chunk). Returns TDM_OK or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_output_drain(router_output_t *output, router_output_emit_fn_t emit, void *ctx);

/*
 * router_output_final_chunk - the choice's last chunk: an empty delta with the finish reason and
 * the log-probabilities of every token not streamed yet (tokens that released no text: a stop
 * id, a CONTROL token, a token a stop string cut at its start), so the chunks together carry one
 * entry per token counted in usage, in order, as the whole body does. Call after the last
 * router_output_drain. free(); NULL when out of memory.
 */
char *router_output_final_chunk(router_output_t *output);

/*
 * router_output_choice - *choice_out = this output as one choice of the whole response
 * (router_openai_response): its text, finish reason, folded log-probabilities and, for agent chat
 * requests, the message: content is null when the output is only tool calls (else the content
 * text), reasoning_content is present with thinking on, tool_calls when calls were made. What
 * choice_out points to is owned by the output and valid until the next call or destroy.
 * Returns TDM_OK or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_output_choice(router_output_t *output, router_openai_choice_t *choice_out);

#endif
