/* responses.h - the OpenAI Responses API (POST /v1/responses) over the chat pipeline.
 *
 * Owns the translation between the Responses API and chat completions, and the store of past
 * responses that `previous_response_id` refers to. A Responses request is rewritten into one
 * chat-completions body (input items -> messages, function tools -> chat tools, text.format ->
 * response_format, reasoning -> thinking, max_output_tokens -> max_tokens), which the router then
 * checks and serves exactly like /v1/chat/completions (router/validate.h); the chat answer (whole
 * body, or the stream of chat.completion.chunk events) is rewritten into a Response object or
 * the Responses API's typed stream events. `previous_response_id` names a stored conversation:
 * its messages (the earlier inputs and outputs, without their instructions, as the API defines)
 * are put before the new input, and its agent session (X-Session-Id) serves the new turn, so the
 * decode node's KV of the whole conversation is reused and only the new items are prefilled.
 *
 * Source of the shapes: the OpenAI API reference for Responses ("Create a model response", the
 * Response object and its streaming events; as typed by the official `openai` Node SDK v4,
 * resources/responses/responses.d.ts). Reasoning output items carry the reasoning text as
 * content [{type:"reasoning_text"}] with an empty summary (this model's reasoning is the text
 * itself, not a summary); input reasoning items are accepted with either field.
 *
 * Knows nothing of HTTP or the cluster. The store is thread-safe; a translation and a stream
 * belong to one connection thread.
 */
#ifndef TANDEM_ROUTER_RESPONSES_H
#define TANDEM_ROUTER_RESPONSES_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/apierr.h"

/* Longest response id, bytes without the NUL ("resp_" + 32 hex digits). */
#define ROUTER_RESPONSES_ID_BYTES 37
/* Default number of stored responses (least recently stored evicted first). */
#define ROUTER_RESPONSES_DEFAULT_MAX 4096

/* The store of past responses; opaque. */
typedef struct router_responses router_responses_t;

/*
 * router_responses_create - an empty store of at most max_entries (>= 1) responses. Returns
 * TDM_OK, TDM_ERR_INVALID_ARG (max_entries 0, NULL out) or TDM_ERR_NO_MEMORY; *out only on
 * success.
 */
tdm_status_t router_responses_create(size_t max_entries, router_responses_t **out);

/* router_responses_destroy - free the store and every stored conversation. Accepts NULL. */
void router_responses_destroy(router_responses_t *store);

/* router_responses_count - responses stored now. Thread-safe. */
size_t router_responses_count(router_responses_t *store);

/* One Responses request rewritten for the chat pipeline (owns every member). */
typedef struct {
    char *chat_body;     /* the chat-completions JSON body (NUL-terminated) */
    size_t n_chat_body;  /* its length */
    char *session_id;    /* the session of previous_response_id, or NULL (none given) */
    int stream;          /* 1: answer with typed stream events */
    int store;           /* 1 (default): keep this response for previous_response_id */
    uint32_t tenant;     /* the API key's tenant (0: keys off); only it can continue this */
    char id[ROUTER_RESPONSES_ID_BYTES + 1]; /* this response's id */
    void *echo;          /* internals: the request fields a Response object repeats, and the
                            conversation (messages without instructions) to store */
} router_responses_req_t;

/*
 * router_responses_request - check the Responses body (n_body bytes, borrowed) and rewrite it.
 * `id_seed` makes the response id (any value; distinct per request). `tenant` is the caller's
 * API key tenant (0: keys off): previous_response_id finds only responses stored by the same
 * tenant (another tenant's id is refused exactly as an unknown one, so ids cannot be probed), and
 * this response is stored under it. On success *req_out owns the rewritten request (release with
 * router_responses_req_fini).
 *
 * Refusals (TDM_ERR_INVALID_ARG; *err_out filled; *req_out zeroed):
 *   400 invalid_json            malformed JSON, or not an object
 *   400 missing_parameter       no "input"
 *   400 invalid_type            a field of the wrong JSON type (input, instructions, tools, ...)
 *   400 invalid_value           an input item or content part of an unknown or unsupported
 *                               type (images, files, computer/file-search/web-search items,
 *                               item references), a tool other than "function", a tool_choice
 *                               other than none/auto/required/a function, text.format other
 *                               than text/json_object/json_schema, truncation "auto",
 *                               previous_response_id not stored (evicted, never stored with
 *                               store: false, or unknown)
 *   400 unsupported_parameter   a field this deployment does not support (include with
 *                               entries, and any field the Responses API does not define
 *                               except the chat extensions seed, top_k, min_p, spec,
 *                               ignore_eos, thinking, chat_template_kwargs, which pass through)
 * Fields the chat pipeline checks (model, temperature, tool definitions, schemas, lengths) are
 * refused there with the chat error, naming the chat field. TDM_ERR_NO_MEMORY: a 500.
 */
tdm_status_t router_responses_request(router_responses_t *store, const char *body,
                                      size_t n_body, uint64_t id_seed, uint32_t tenant,
                                      router_responses_req_t *req_out, router_apierr_t *err_out);

/* router_responses_req_fini - free what the request owns and zero it. Accepts a zeroed one. */
void router_responses_req_fini(router_responses_req_t *req);

/*
 * router_responses_body - the Response object (JSON text, caller frees with free()) for the
 * whole chat.completion body `chat` (n_chat bytes) answered to req's chat body; stores the
 * conversation under req->id with `session_id` (the turn's session) when req->store. A chat
 * error body (an "error" object) is returned unchanged. NULL when out of memory or when `chat`
 * is not JSON (then the caller answers 500).
 */
char *router_responses_body(router_responses_t *store, const router_responses_req_t *req,
                            const char *chat, size_t n_chat, const char *session_id,
                            size_t *n_out);

/* The stream rewriter of one streamed response; opaque. */
typedef struct router_responses_stream router_responses_stream_t;

/*
 * router_responses_stream_create - a rewriter for req (borrowed; must outlive the stream) whose
 * turn runs on `session_id` (copied). Returns TDM_OK, TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_responses_stream_create(router_responses_t *store,
                                            const router_responses_req_t *req,
                                            const char *session_id,
                                            router_responses_stream_t **out);

/*
 * router_responses_stream_feed - take n bytes of the chat stream (server-sent events of
 * chat.completion.chunk objects, split anywhere; ": ..." comment lines are keep-alives) and
 * append the Responses events they complete ("event: <type>\ndata: <json>\n\n", every event
 * with a sequence_number) to the stream's output. At "data: [DONE]" it appends the final
 * response.completed (or response.incomplete when max_output_tokens ended it, or
 * response.failed after a chat error event) and stores the conversation (req->store).
 * Keep-alive comments are passed through. Returns TDM_OK or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_responses_stream_feed(router_responses_stream_t *s, const char *bytes,
                                          size_t n);

/*
 * router_responses_stream_take - move up to max bytes of pending output into buf; returns the
 * count (0 when nothing is pending).
 */
size_t router_responses_stream_take(router_responses_stream_t *s, char *buf, size_t max);

/* router_responses_stream_done - nonzero once the final event was appended. */
int router_responses_stream_done(const router_responses_stream_t *s);

/* router_responses_stream_destroy - free the rewriter. Accepts NULL. */
void router_responses_stream_destroy(router_responses_stream_t *s);

#endif
