/* responses_impl.h - internals shared by responses.c (store, request, whole body) and
 * responses_stream.c (typed stream events). Not part of the module's interface. */
#ifndef TANDEM_ROUTER_RESPONSES_IMPL_H
#define TANDEM_ROUTER_RESPONSES_IMPL_H

#include <jansson.h>

#include "router/responses.h"

/* What router_responses_req_t.echo points to. */
typedef struct {
    json_t *conversation; /* chat messages without instructions: stored ones + this input */
    json_t *fields;       /* the request fields a Response object repeats */
    int64_t created_at;   /* Unix seconds (display only) */
} resp_echo_t;

/* The output collected from a chat answer: what a Response lists and the store keeps. */
typedef struct {
    json_t *output;         /* array of Response output items (owned) */
    json_t *assistant;      /* the chat assistant message to store (owned) */
    const char *finish;     /* chat finish_reason (static string), NULL when unknown */
    json_int_t prompt_tokens, completion_tokens, cached_tokens;
    int have_usage;
} resp_result_t;

/* resp_item_id - "<prefix>_<hex of the response id>_<n>" into out (>= 64 bytes). */
void resp_item_id(const router_responses_req_t *req, const char *prefix, size_t n, char *out,
                  size_t cap);

/*
 * resp_object - a Response object: req's id and echoed fields, `status`, result's output items
 * and usage (borrowed), incomplete_details when status is "incomplete", error when `error` is
 * non-NULL (borrowed). New reference or NULL.
 */
json_t *resp_object(const router_responses_req_t *req, const char *status,
                    const resp_result_t *result, const json_t *error);

/*
 * resp_store_result - keep req's conversation plus result->assistant under req->id with
 * session_id, when req->store. Returns TDM_OK or TDM_ERR_NO_MEMORY.
 */
tdm_status_t resp_store_result(router_responses_t *store, const router_responses_req_t *req,
                               const resp_result_t *result, const char *session_id);

/* resp_take_usage - a chat "usage" object's counts into result (have_usage set); a non-object
 * changes nothing. */
void resp_take_usage(const json_t *usage, resp_result_t *result);

/* resp_finish - the chat finish_reason as a static string: "stop", "length" or "tool_calls"
 * (any other reason counts as "stop"); NULL for NULL. */
const char *resp_finish(const char *finish);

/* resp_status - "incomplete" when the chat finish_reason was "length", else "completed". */
const char *resp_status(const resp_result_t *result);

#endif
