/* turn.h - the HTTP side of one generation: from the request's mailbox to the response body.
 *
 * Owns what one response needs: a reference to the request, its output (router_output_t:
 * detokenizer, stop strings, max_tokens, log-probability entries, reasoning and tool calls),
 * usage counts, and for streaming the server-sent-event bytes not yet handed to the HTTP server.
 * When the output ends (stop string, stop token, length) or the client leaves, it releases the
 * request to the control plane, which aborts the workers if they are still generating. Knows
 * nothing of libmicrohttpd: whether the client is still there is asked through a caller-supplied
 * callback. One turn belongs to one HTTP connection thread; it may block waiting for tokens.
 */
#ifndef TANDEM_ROUTER_TURN_H
#define TANDEM_ROUTER_TURN_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/apierr.h"
#include "router/control.h"
#include "router/metrics.h"
#include "router/model.h"
#include "router/request.h"

/* Timing of a turn (plain data). */
typedef struct {
    uint32_t timeout_ms;   /* longest wait for the next token (first token included) */
    uint32_t keepalive_ms; /* idle SSE streams get a comment line this often */
} router_turn_params_t;

/* The turn; opaque. */
typedef struct router_turn router_turn_t;

/* Asks whether the client has gone away (connection closed); nonzero when it has. Never blocks. */
typedef int (*router_turn_gone_fn_t)(void *ctx);

/*
 * router_turn_create - take over `request` (takes a reference; it must already be submitted).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY. model, control and metrics are
 * borrowed and must outlive the turn.
 */
tdm_status_t router_turn_create(const router_turn_params_t *params, const router_model_t *model,
                                router_control_t *control, router_metrics_t *metrics,
                                router_request_t *request, router_turn_t **turn_out);

/*
 * router_turn_destroy - release the request (as a client abort when the output had not ended)
 * and free the turn. Accepts NULL.
 */
void router_turn_destroy(router_turn_t *turn);

/*
 * router_turn_watch_client - while router_turn_wait_first or router_turn_body wait for tokens, ask
 * gone(ctx) about every ROUTER_TURN_WATCH_MS (and between batches); once it answers nonzero the
 * turn releases the request as a client abort and those calls return TDM_ERR_PEER_LOST. NULL gone
 * stops the watch (streamed turns: the HTTP server notices a closed connection when it writes).
 * ctx is borrowed and must stay valid while watched.
 */
void router_turn_watch_client(router_turn_t *turn, router_turn_gone_fn_t gone, void *ctx);

/* How often a watched turn asks whether its client is gone while no token arrives. */
#define ROUTER_TURN_WATCH_MS 100

/*
 * router_turn_wait_first - block until the first event: tokens, the end, or an error. Returns
 * TDM_OK when the response can start, or TDM_ERR_UNSUPPORTED with *err_out filled when the
 * request failed before any output (the caller answers with err_out's status), or
 * TDM_ERR_TIMEOUT (*err_out is a 504), or TDM_ERR_PEER_LOST when the watched client left (the
 * request is already released as a client abort; *err_out untouched; nothing to answer).
 */
tdm_status_t router_turn_wait_first(router_turn_t *turn, router_apierr_t *err_out);

/*
 * router_turn_session - the session id serving the turn (for the X-Session-Id response header);
 * valid after router_turn_wait_first. Borrowed from the turn.
 */
const char *router_turn_session(const router_turn_t *turn);

/*
 * router_turn_body - run the turn to its end and return the whole JSON response (non-streamed).
 * *body_out: caller frees with free(); *status_out: 200, or the error's HTTP status when the turn
 * failed before any token (body is then the error JSON). Returns TDM_OK, TDM_ERR_NO_MEMORY, or
 * TDM_ERR_PEER_LOST when the watched client left first (the request is already released as a
 * client abort; no body).
 */
tdm_status_t router_turn_body(router_turn_t *turn, char **body_out, size_t *n_body_out,
                              int *status_out);

/*
 * router_turn_sse_read - copy up to max_bytes of the event stream into buf, blocking until some
 * are ready. Returns the byte count; 0 when the stream is complete ("data: [DONE]" sent).
 */
size_t router_turn_sse_read(router_turn_t *turn, char *buf, size_t max_bytes);

#endif
