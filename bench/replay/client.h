/* client.h - streaming HTTP client for the OpenAI-compatible API (libcurl easy interface).
 *
 * One client per simulated agent: it owns a curl handle (the connection is kept alive across
 * turns, as an agent's SDK would), the SSE line buffer and the last error text. It sends one
 * request body, reads the SSE stream and records timings into a bench_request_t. Not
 * thread-safe: one client per thread. Call curl_global_init once in main() before creating any
 * client. Knows nothing of traces or tokens.
 */
#ifndef TANDEM_BENCH_CLIENT_H
#define TANDEM_BENCH_CLIENT_H

#include <stdatomic.h>
#include <stddef.h>

#include "bench/replay/stats.h"
#include "common/buf.h"
#include "common/status.h"

#define BENCH_CLIENT_ERR_BYTES 768

/* Which endpoint a body goes to. */
typedef enum {
    BENCH_API_COMPLETIONS = 0, /* POST /v1/completions (token-id prompt) */
    BENCH_API_CHAT = 1,        /* POST /v1/chat/completions (messages) */
} bench_api_t;

/* Plain data; strings are borrowed and must outlive the client. */
typedef struct {
    const char *base_url;         /* "http://host:port", without /v1 */
    const char *api_key;          /* sent as "Authorization: Bearer KEY", or NULL */
    long timeout_ms;              /* whole request, 0: none */
    long connect_timeout_ms;      /* connection set-up */
    const atomic_int *abort_flag; /* when non-NULL and set, transfers stop early; may be NULL */
} bench_client_params_t;

typedef struct bench_client bench_client_t;

/*
 * bench_client_create - a client for `params` (copied; strings borrowed).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (no base_url) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t bench_client_create(const bench_client_params_t *params, bench_client_t **client_out);

/* bench_client_destroy - close the connection and free the client; accepts NULL. */
void bench_client_destroy(bench_client_t *client);

/*
 * bench_client_stream - POST `body` (n_body bytes of JSON with "stream": true) to `api`, with
 * an X-Session-Id header when session_id is non-NULL, and read the SSE stream to its end.
 *
 * Writes t_send_ns, t_first_ns, t_last_ns, t_end_ns, n_chunks, gaps_ms (appended; the record
 * must have no gaps yet), http_status, usage_reported, output_tokens (usage.completion_tokens
 * when reported, else content chunks) and input_tokens (usage.prompt_tokens, when reported, with
 * prompt_reported set; else left as the caller set it) and result. A content chunk is an SSE data
 * event whose first choice has non-empty `text` (completions) or `delta.content` /
 * `delta.reasoning_content` / `delta.tool_calls` (chat).
 *
 * Returns TDM_OK when the stream completed (200, then [DONE] or a finish_reason), else
 * TDM_ERR_PEER_LOST (connect, reset, timeout, abort), TDM_ERR_MISMATCH (HTTP status not 200),
 * TDM_ERR_FORMAT (an error event, or a stream that ended early) or TDM_ERR_NO_MEMORY; the
 * reason is in bench_client_last_error and req->result says which.
 */
tdm_status_t bench_client_stream(bench_client_t *client, bench_api_t api, const char *body,
                                 size_t n_body, const char *session_id, bench_request_t *req);

/* bench_client_last_error - why the last call failed ("" after success). Owned by the client. */
const char *bench_client_last_error(const bench_client_t *client);

/*
 * bench_http_get - GET `url` into `body_out` (reset first) with an optional bearer key.
 * *http_status_out gets the status (0 when no response). Returns TDM_OK on a 200, TDM_ERR_MISMATCH
 * on another status, TDM_ERR_PEER_LOST when no response came, TDM_ERR_NO_MEMORY.
 */
tdm_status_t bench_http_get(const char *url, const char *api_key, long timeout_ms,
                            tdm_buf_t *body_out, long *http_status_out);

#endif
