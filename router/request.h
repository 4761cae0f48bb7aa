/* request.h - one in-flight generation request, shared by its HTTP thread and the control thread.
 *
 * Owns the checked request (router_gen_request_t), the session id it asked for and the one it
 * got, and a mailbox of events the control thread posts (token ids with log-probabilities, the
 * end of the turn, or an API error) for the HTTP thread to take. Reference counted: the HTTP
 * side and the control side each hold a reference; the last unref frees it. Thread-safe: one
 * mutex and condition variable per request; the control thread never blocks on it for long.
 */
#ifndef TANDEM_ROUTER_REQUEST_H
#define TANDEM_ROUTER_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"
#include "router/apierr.h"
#include "router/session.h"
#include "router/validate.h"

/* Most alternatives kept per token (ROUTER_MAX_TOP_LOGPROBS). */
#define ROUTER_REQUEST_MAX_TOP ROUTER_MAX_TOP_LOGPROBS

/* How a request ended (plain values of router_request_batch_t.end). */
typedef enum {
    ROUTER_REQUEST_OPEN = 0,     /* more events may come */
    ROUTER_REQUEST_FINISHED = 1, /* the worker finished the turn (finish_reason below) */
    ROUTER_REQUEST_FAILED = 2,   /* error holds the API error */
} router_request_end_t;

/* Why the worker finished (router_request_batch_t.finish). */
typedef enum {
    ROUTER_FINISH_STOP = 0,   /* stop token */
    ROUTER_FINISH_LENGTH = 1, /* max_tokens or the context limit */
} router_request_finish_t;

/*
 * What router_request_take hands the HTTP thread (plain data; the caller owns the arrays, which
 * take grows; zero it before first use and free it with router_request_batch_fini).
 * Per token i: ids[i], choice[i] (which of the request's n choices), logprobs[i] (NaN when the
 * worker sent none), n_top[i] alternatives in top_ids / top_logprobs [i * ROUTER_REQUEST_MAX_TOP,
 * ...).
 */
typedef struct {
    int32_t *ids;
    uint8_t *choice; /* choice index of token i (0 .. n_choices - 1) */
    float *logprobs;
    uint8_t *n_top;
    int32_t *top_ids;
    float *top_logprobs;
    size_t n;
    size_t cap;
    router_request_end_t end;
    router_request_finish_t finish;
    router_apierr_t error;
} router_request_batch_t;

/* The request; opaque. */
typedef struct router_request router_request_t;

/*
 * router_request_create - a request with one reference, taking ownership of *gen (zeroed on
 * success). session_id: the client's X-Session-Id (copied), or NULL. Returns TDM_OK,
 * TDM_ERR_INVALID_ARG (session id too long) or TDM_ERR_NO_MEMORY (*gen untouched on failure).
 */
tdm_status_t router_request_create(router_gen_request_t *gen, const char *session_id, uint64_t id,
                                   uint64_t t_start_ns, router_request_t **request_out);

/* router_request_ref - take another reference; returns the request. */
router_request_t *router_request_ref(router_request_t *request);

/* router_request_unref - drop a reference; the last one frees everything. Accepts NULL. */
void router_request_unref(router_request_t *request);

/* router_request_gen - the checked request (borrowed; immutable while in flight). */
const router_gen_request_t *router_request_gen(const router_request_t *request);

/*
 * router_request_first_id - the id a router incarnation gives its first request (the next ones
 * count up from it): a value in [1, 2^62) drawn from `entropy` (the caller mixes the wall clock,
 * its pid and an address). Workers keep request ids beyond a router's life (a prefill node's
 * aborts, a decode node's running turns and reservations), so a restarted router must not start
 * at 1 again, or its requests collide with the old incarnation's; 2^62 leaves room to count up.
 */
uint64_t router_request_first_id(uint64_t entropy);

/* router_request_id - the router-wide request id (never 0). */
uint64_t router_request_id(const router_request_t *request);

/* router_request_t_start_ns - monotonic time the request arrived. */
uint64_t router_request_t_start_ns(const router_request_t *request);

/* router_request_asked_session - the X-Session-Id the client sent, or NULL. */
const char *router_request_asked_session(const router_request_t *request);

/*
 * router_request_set_tenant - the tenant (API key id; 0 when keys are off) the request runs as:
 * it may only use that tenant's sessions. Set by the HTTP thread before router_control_submit;
 * router_request_tenant reads it (0 until set).
 */
void router_request_set_tenant(router_request_t *request, uint32_t tenant);
uint32_t router_request_tenant(const router_request_t *request);

/*
 * router_request_set_session - record the session serving the request (control thread, before
 * the first event). router_request_session copies it into out (out_bytes >= 1); "" before.
 */
void router_request_set_session(router_request_t *request, const char *session_id);
void router_request_session(router_request_t *request, char *out, size_t out_bytes);

/*
 * router_request_set_cached_tokens - the prompt tokens the serving attempt reused from the
 * session instead of prefilling (its H; usage.prompt_tokens_details.cached_tokens). Control
 * thread, before the first token; router_request_cached_tokens reads it (any thread).
 */
void router_request_set_cached_tokens(router_request_t *request, uint64_t n);
uint64_t router_request_cached_tokens(router_request_t *request);

/*
 * router_request_post_tokens - append n tokens of choice `choice` (control thread). logprobs may be
 * NULL; top may be NULL or hold n entries with up to ROUTER_REQUEST_MAX_TOP alternatives each
 * (extra ones dropped). Ignored after the request ended. Returns TDM_OK or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_request_post_tokens(router_request_t *request, uint32_t choice,
                                        const int32_t *ids, const float *logprobs,
                                        Tandem__TopLogprobs *const *top, size_t n);

/* router_request_post_finish - the worker ended the turn (control thread). First end wins. */
void router_request_post_finish(router_request_t *request, router_request_finish_t finish);

/* router_request_post_error - the request failed (control thread). First end wins. */
void router_request_post_error(router_request_t *request, const router_apierr_t *error);

/*
 * router_request_take - wait until tokens or the end are available or deadline_ns (monotonic)
 * passes, then move pending tokens into *batch (replacing its contents) and copy the end state.
 * Returns TDM_OK, TDM_ERR_TIMEOUT (nothing new; batch->n = 0) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_request_take(router_request_t *request, uint64_t deadline_ns,
                                 router_request_batch_t *batch);

/* router_request_batch_fini - free the batch's arrays and zero it. */
void router_request_batch_fini(router_request_batch_t *batch);

#endif
