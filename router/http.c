#include "router/http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/http_status.h"
#include "common/log.h"
#include "router/apierr.h"
#include "router/openai.h"
#include "router/request.h"
#include "router/responses.h"
#include "router/validate.h"

#define SSE_BLOCK_BYTES  (16u * 1024u)
#define MIB              (1024u * 1024u)
#define REAPER_PERIOD_MS 200L

struct router_http {
    router_http_params_t params;
    const router_model_t *model;
    router_control_t *control;
    router_metrics_t *metrics;
    struct MHD_Daemon *daemon;
    uint16_t port;
    atomic_uint_fast64_t next_request_id;
    uint64_t seed_salt;
    router_responses_t *responses; /* stored responses of POST /v1/responses */
    router_apikeys_t *keys;        /* API keys (none: the API is open) */
    pthread_mutex_t socks_lock;    /* guards socks and every sock_t's phase */
    pthread_cond_t reaper_wake;
    struct sock *socks; /* open connections */
    pthread_t reaper;   /* closes connections past their header or body deadline */
    int stopping;       /* guarded by socks_lock */
};

/* Per-request state of one HTTP request (MHD's con_cls). */
typedef struct {
    tdm_buf_t body; /* the request body so far */
    int too_large;
    uint32_t tenant;       /* the API key's tenant (0: keys off or an open path) */
    int admitted;          /* counted in the key's in-flight requests: release when done */
    int untimed;           /* a generation runs: the idle timeout is off until the request ends */
    uint64_t t_headers_ns; /* monotonic time the headers were complete */
} conn_t;

/* What a connection is doing, for the header and body deadlines. */
typedef enum {
    SOCK_HEADERS = 0, /* waiting for a request's headers (opened, or the previous request ended) */
    SOCK_BODY = 1,    /* headers in, reading the body */
    SOCK_SERVING = 2, /* answering: no deadline (a generation may run for minutes) */
} sock_phase_t;

/* Per-connection state (MHD's socket context), in the front end's list while open. */
typedef struct sock {
    int fd;
    sock_phase_t phase;
    uint64_t t_phase_ns; /* monotonic start of the phase */
    struct sock *prev;
    struct sock *next;
} sock_t;

void router_http_params_default(router_http_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->host = "127.0.0.1";
    params->port = 8000;
    params->max_body_bytes = 64u * MIB;
    params->max_connections = 1024;
    params->turn.timeout_ms = 600000;
    params->turn.keepalive_ms = 5000;
    params->idle_timeout_s = 30;
    params->header_timeout_s = 30;
    params->body_timeout_s = 30;
}

/* ---- responses -------------------------------------------------------------------------- */

/* Queue `body` (taken over) with its type, the session header (session_id non-empty) and
 * Retry-After (retry_after_s > 0). */
static enum MHD_Result respond_with(struct MHD_Connection *conn, int status,
                                    const char *content_type, char *body, size_t n_body,
                                    const char *session_id, uint32_t retry_after_s)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;
    char retry[16];

    resp = MHD_create_response_from_buffer(n_body, body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (session_id != NULL && session_id[0] != '\0') {
        MHD_add_response_header(resp, "X-Session-Id", session_id);
    }
    if (retry_after_s > 0) {
        snprintf(retry, sizeof(retry), "%u", retry_after_s);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, retry);
    }
    if (status == TDM_HTTP_UNAUTHORIZED) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    }
    ret = MHD_queue_response(conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result respond(struct MHD_Connection *conn, int status, const char *content_type,
                               char *body, size_t n_body, const char *session_id)
{
    return respond_with(conn, status, content_type, body, n_body, session_id, 0);
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, int status,
                                    const char *content_type, const char *text)
{
    char *copy = strdup(text);

    if (copy == NULL) {
        return MHD_NO;
    }
    return respond(conn, status, content_type, copy, strlen(copy), NULL);
}

static enum MHD_Result respond_error_retry(router_http_t *h, struct MHD_Connection *conn,
                                           const router_apierr_t *err, uint32_t retry_after_s)
{
    char *body = router_apierr_json(err);

    router_metrics_error(h->metrics, err->code, err->http_status);
    tdm_log(TDM_LOG_DEBUG, "http", "request refused: status=%d code=%s", err->http_status,
            err->code != NULL ? err->code : "");
    if (body == NULL) {
        return MHD_NO;
    }
    return respond_with(conn, err->http_status, "application/json", body, strlen(body), NULL,
                        retry_after_s);
}

static enum MHD_Result respond_error(router_http_t *h, struct MHD_Connection *conn,
                                     const router_apierr_t *err)
{
    return respond_error_retry(h, conn, err, 0);
}

/* ---- GET endpoints ---------------------------------------------------------------------- */

static enum MHD_Result serve_health(router_http_t *h, struct MHD_Connection *conn)
{
    router_metrics_gauges_t g;
    char body[512];
    int healthy;

    router_control_snapshot(h->control, &g);
    router_metrics_gauges_fini(&g); /* the per-worker rows are for /metrics */
    healthy = g.workers.n_decode > 0;
    snprintf(body, sizeof(body),
             "{\"status\":\"%s\",\"workers\":{\"prefill\":%u,\"decode\":%u,\"stalled\":%u},"
             "\"workers_lost_total\":%llu,\"sessions\":%llu,\"inflight\":%llu}",
             healthy ? "ok" : "no_decode_workers", g.workers.n_prefill, g.workers.n_decode,
             g.workers.n_stalled, (unsigned long long)g.workers.n_lost_total,
             (unsigned long long)g.n_sessions, (unsigned long long)g.n_inflight);
    return respond_text(conn, healthy ? TDM_HTTP_OK : TDM_HTTP_UNAVAILABLE, "application/json",
                        body);
}

static enum MHD_Result serve_metrics(router_http_t *h, struct MHD_Connection *conn)
{
    router_metrics_gauges_t g;
    tdm_status_t status;
    char *text;
    size_t n;

    char *keys_text;
    size_t n_keys_text;
    char *both;

    router_control_snapshot(h->control, &g);
    status = router_metrics_render(h->metrics, &g, &text, &n);
    router_metrics_gauges_fini(&g);
    if (status != TDM_OK) {
        return MHD_NO;
    }
    if (router_apikeys_render(h->keys, &keys_text, &n_keys_text) != TDM_OK) {
        free(text);
        return MHD_NO;
    }
    both = realloc(text, n + n_keys_text + 1);
    if (both == NULL) {
        free(text);
        free(keys_text);
        return MHD_NO;
    }
    memcpy(both + n, keys_text, n_keys_text + 1);
    free(keys_text);
    return respond(conn, TDM_HTTP_OK, "text/plain; version=0.0.4", both, n + n_keys_text, NULL);
}

static enum MHD_Result serve_models(router_http_t *h, struct MHD_Connection *conn)
{
    const router_model_info_t *info = router_model_info(h->model);
    char *body = router_openai_models(info->name, info->max_context, info->n_vocab);

    if (body == NULL) {
        return MHD_NO;
    }
    return respond(conn, TDM_HTTP_OK, "application/json", body, strlen(body), NULL);
}

/* GET /v1/models/{id}: the served model's object, or a 404 model_not_found (OpenAI's shape). */
static enum MHD_Result serve_model(router_http_t *h, struct MHD_Connection *conn, const char *id)
{
    const router_model_info_t *info = router_model_info(h->model);
    router_apierr_t err;
    char *body;

    if (strcmp(id, info->name) != 0) {
        router_apierr_set(&err, TDM_HTTP_NOT_FOUND, ROUTER_APIERR_NOT_FOUND, "model_not_found",
                          "model", "the model '%.200s' does not exist; this deployment serves '%s'",
                          id, info->name);
        return respond_error(h, conn, &err);
    }
    body = router_openai_model(info->name, info->max_context, info->n_vocab);
    if (body == NULL) {
        return MHD_NO;
    }
    return respond(conn, TDM_HTTP_OK, "application/json", body, strlen(body), NULL);
}

/* ---- generation ------------------------------------------------------------------------- */

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    size_t n = router_turn_sse_read(cls, buf, max);

    (void)pos;
    return n > 0 ? (ssize_t)n : (ssize_t)MHD_CONTENT_READER_END_OF_STREAM;
}

static void sse_free(void *cls)
{
    router_turn_destroy(cls);
}

/* A streamed /v1/responses answer: the turn's chat events rewritten into typed events. */
typedef struct {
    router_turn_t *turn;
    router_responses_req_t req;
    router_responses_stream_t *rs;
    int eof; /* the turn's stream ended */
} resp_sse_t;

static ssize_t resp_sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    resp_sse_t *r = cls;
    char chat[SSE_BLOCK_BYTES];

    (void)pos;
    for (;;) {
        size_t n = router_responses_stream_take(r->rs, buf, max);
        if (n > 0) {
            return (ssize_t)n;
        }
        if (r->eof) {
            return (ssize_t)MHD_CONTENT_READER_END_OF_STREAM;
        }
        n = router_turn_sse_read(r->turn, chat, sizeof(chat));
        if (n == 0) {
            r->eof = 1;
        } else if (router_responses_stream_feed(r->rs, chat, n) != TDM_OK) {
            return (ssize_t)MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void resp_sse_free(void *cls)
{
    resp_sse_t *r = cls;

    router_turn_destroy(r->turn);
    router_responses_stream_destroy(r->rs);
    router_responses_req_fini(&r->req);
    free(r);
}

/*
 * The turn's client watch (router_turn_gone_fn_t; ctx is the MHD connection): nonzero once the
 * client closed or reset its connection. The request is fully read and this thread is the only
 * reader while the turn runs, so a readable socket means end of file, a reset, or (rarely) a
 * pipelined next request, which a peek tells apart.
 */
static int client_gone(void *ctx)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(ctx, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct pollfd pfd;
    char byte;
    ssize_t n;

    if (info == NULL) {
        return 0;
    }
    pfd.fd = info->connect_fd;
    pfd.events = POLLIN | POLLRDHUP;
    pfd.revents = 0;
    if (poll(&pfd, 1, 0) <= 0) {
        return 0;
    }
    if ((pfd.revents & (POLLHUP | POLLERR)) != 0) {
        return 1;
    }
    if ((pfd.revents & (POLLIN | POLLRDHUP)) == 0) {
        return 0;
    }
    n = recv(pfd.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int session_id_ok(const char *id)
{
    size_t n = strlen(id);

    if (n == 0 || n > ROUTER_SESSION_ID_BYTES) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c <= 0x20 || c >= 0x7f) {
            return 0;
        }
    }
    return 1;
}

/*
 * Answer with a server-sent event stream read by `reader` from `cls` (released by free_cls, also
 * when the response cannot be made), with the session header.
 */
static enum MHD_Result queue_sse(struct MHD_Connection *conn, MHD_ContentReaderCallback reader,
                                 MHD_ContentReaderFreeCallback free_cls, void *cls,
                                 const char *session_id)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK_BYTES, reader, cls, free_cls);
    enum MHD_Result ret;

    if (resp == NULL) {
        free_cls(cls);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Session-Id", session_id);
    ret = MHD_queue_response(conn, TDM_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* A streamed /v1/responses turn: hand the turn and the rewritten request to the SSE reader. */
static enum MHD_Result queue_responses_stream(router_http_t *h, struct MHD_Connection *conn,
                                              router_turn_t *turn, router_responses_req_t *rreq)
{
    resp_sse_t *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        router_turn_destroy(turn);
        return MHD_NO;
    }
    r->turn = turn;
    r->req = *rreq;
    memset(rreq, 0, sizeof(*rreq));
    if (router_responses_stream_create(h->responses, &r->req, router_turn_session(turn), &r->rs) !=
        TDM_OK) {
        resp_sse_free(r);
        return MHD_NO;
    }
    return queue_sse(conn, resp_sse_reader, resp_sse_free, r, router_turn_session(r->turn));
}

/*
 * Serve one generation: /v1/chat/completions and /v1/completions with rreq NULL (the body is the
 * client's), or /v1/responses with rreq the rewritten request (its chat body is served as a chat
 * request and the answer rewritten back). rreq stays the caller's, except that a streamed answer
 * takes its contents over (leaving it zeroed), so the caller always finishes it.
 */
static enum MHD_Result serve_generate(router_http_t *h, struct MHD_Connection *conn,
                                      router_api_t api, conn_t *cc, router_responses_req_t *rreq)
{
    const char *content_type;
    const char *session_id;
    const char *body_in = rreq != NULL ? rreq->chat_body : cc->body.data;
    size_t n_body_in = rreq != NULL ? rreq->n_chat_body : cc->body.n_bytes;
    router_gen_request_t gen;
    router_request_t *request = NULL;
    router_turn_t *turn = NULL;
    router_apierr_t err;
    uint64_t id;
    uint64_t now_ns = tdm_clock_now_ns();
    enum MHD_Result ret;
    tdm_status_t tstatus;
    int stream;
    char *body;
    size_t n_body;
    int status;

    if (rreq == NULL) {
        router_metrics_count(h->metrics,
                             api == ROUTER_API_CHAT ? ROUTER_METRIC_REQUESTS_CHAT
                                                    : ROUTER_METRIC_REQUESTS_COMPLETIONS,
                             1);
    }
    if (cc->too_large) {
        router_apierr_set(&err, TDM_HTTP_TOO_LARGE, ROUTER_APIERR_INVALID_REQUEST,
                          "request_too_large", NULL, "the request body exceeds %zu bytes",
                          h->params.max_body_bytes);
        return respond_error(h, conn, &err);
    }
    session_id = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Session-Id");
    if (session_id != NULL && !session_id_ok(session_id)) {
        router_apierr_set(&err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                          "invalid_session_id", NULL,
                          "X-Session-Id must be 1..%d printable ASCII bytes without spaces",
                          ROUTER_SESSION_ID_BYTES);
        return respond_error(h, conn, &err);
    }
    if (session_id == NULL && rreq != NULL) {
        session_id = rreq->session_id; /* previous_response_id's session */
    }
    content_type = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    id = atomic_fetch_add(&h->next_request_id, 1);
    if (router_validate_request(h->model, api, content_type, body_in, n_body_in,
                                tdm_hash_splitmix64(h->seed_salt ^ id), &gen, &err) != TDM_OK) {
        return respond_error(h, conn, &err);
    }
    stream = gen.stream;
    if (router_request_create(&gen, session_id, id, now_ns, &request) != TDM_OK) {
        router_gen_request_fini(&gen);
        return MHD_NO;
    }
    router_request_set_tenant(request, cc->tenant);
    /* From here the connection waits on the cluster, not on the client: the idle timeout would
     * cut a long first-token wait or a stream. It comes back when the request ends. */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    cc->untimed = 1;
    if (router_control_submit(h->control, request) != TDM_OK) {
        router_request_unref(request);
        router_apierr_set(&err, TDM_HTTP_UNAVAILABLE, ROUTER_APIERR_OVERLOADED, "shutting_down",
                          NULL, "the router is shutting down");
        return respond_error(h, conn, &err);
    }
    if (router_turn_create(&h->params.turn, h->model, h->control, h->metrics, request, &turn) !=
        TDM_OK) {
        router_control_release(h->control, request, 1);
        router_request_unref(request);
        return MHD_NO;
    }
    router_request_unref(request);
    /* Nothing is written until the first token (or the whole body): watch for the client leaving.
     * A client gone is released as a client abort; the connection is then just closed. */
    router_turn_watch_client(turn, client_gone, conn);
    tstatus = router_turn_wait_first(turn, &err);
    if (tstatus == TDM_ERR_PEER_LOST) {
        router_turn_destroy(turn);
        return MHD_NO;
    }
    if (tstatus != TDM_OK) {
        ret = respond_error(h, conn, &err);
        router_turn_destroy(turn);
        return ret;
    }
    if (!stream) {
        if (router_turn_body(turn, &body, &n_body, &status) != TDM_OK) {
            router_turn_destroy(turn);
            return MHD_NO;
        }
        if (rreq != NULL) {
            char *chat = body;
            body = router_responses_body(h->responses, rreq, chat, n_body,
                                         router_turn_session(turn), &n_body);
            free(chat);
            if (body == NULL) {
                router_turn_destroy(turn);
                return MHD_NO;
            }
        }
        ret = respond(conn, status, "application/json", body, n_body, router_turn_session(turn));
        router_turn_destroy(turn);
        return ret;
    }
    if (rreq != NULL) {
        router_turn_watch_client(turn, NULL, NULL);
        return queue_responses_stream(h, conn, turn, rreq);
    }
    /* Streamed: the HTTP server notices a closed connection at its next write (sse_free). */
    router_turn_watch_client(turn, NULL, NULL);
    return queue_sse(conn, sse_reader, sse_free, turn, router_turn_session(turn));
}

/* POST /v1/responses: rewrite into a chat request (responses.h), then serve it as one. */
static enum MHD_Result serve_responses(router_http_t *h, struct MHD_Connection *conn, conn_t *cc)
{
    router_responses_req_t rreq;
    router_apierr_t err;
    enum MHD_Result ret;

    router_metrics_count(h->metrics, ROUTER_METRIC_REQUESTS_RESPONSES, 1);
    if (cc->too_large) {
        router_apierr_set(&err, TDM_HTTP_TOO_LARGE, ROUTER_APIERR_INVALID_REQUEST,
                          "request_too_large", NULL, "the request body exceeds %zu bytes",
                          h->params.max_body_bytes);
        return respond_error(h, conn, &err);
    }
    if (router_responses_request(h->responses, cc->body.data, cc->body.n_bytes,
                                 h->seed_salt ^ atomic_fetch_add(&h->next_request_id, 1),
                                 cc->tenant, &rreq, &err) != TDM_OK) {
        return respond_error(h, conn, &err);
    }
    ret = serve_generate(h, conn, ROUTER_API_CHAT, cc, &rreq);
    router_responses_req_fini(&rreq); /* zeroed when a stream took it over */
    return ret;
}

/* ---- routing ---------------------------------------------------------------------------- */

static enum MHD_Result wrong_method(router_http_t *h, struct MHD_Connection *conn,
                                    const char *allowed)
{
    router_apierr_t err;

    router_apierr_set(&err, TDM_HTTP_METHOD_NOT_ALLOWED, ROUTER_APIERR_INVALID_REQUEST,
                      "method_not_allowed", NULL, "use %s for this path", allowed);
    return respond_error(h, conn, &err);
}

static enum MHD_Result route(router_http_t *h, struct MHD_Connection *conn, const char *url,
                             const char *method, conn_t *cc)
{
    int get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    int post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    router_apierr_t err;

    if (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0) {
        if (!post) {
            return wrong_method(h, conn, "POST");
        }
        return serve_generate(
            h, conn, url[4] == 'c' && url[5] == 'h' ? ROUTER_API_CHAT : ROUTER_API_COMPLETIONS, cc,
            NULL);
    }
    if (strcmp(url, "/v1/responses") == 0) {
        if (!post) {
            return wrong_method(h, conn, "POST");
        }
        return serve_responses(h, conn, cc);
    }
    if (strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0 ||
        strcmp(url, "/v1/models") == 0) {
        if (!get) {
            return wrong_method(h, conn, "GET");
        }
        if (url[1] == 'h') {
            return serve_health(h, conn);
        }
        return url[1] == 'm' ? serve_metrics(h, conn) : serve_models(h, conn);
    }
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11] != '\0') {
        if (!get) {
            return wrong_method(h, conn, "GET");
        }
        return serve_model(h, conn, url + 11); /* the id may hold '/' (org/name) */
    }
    router_apierr_set(&err, TDM_HTTP_NOT_FOUND, ROUTER_APIERR_NOT_FOUND, "not_found", NULL,
                      "no such endpoint: %.200s %.200s", method, url);
    return respond_error(h, conn, &err);
}

/*
 * Move conn's connection to `phase` at now_ns (under the lock the reaper reads it with); returns
 * how long the previous phase lasted, ns (0 without a socket context).
 */
static uint64_t set_phase(router_http_t *h, struct MHD_Connection *conn, sock_phase_t phase,
                          uint64_t now_ns)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    sock_t *sc = info != NULL ? info->socket_context : NULL;
    uint64_t lasted = 0;

    if (sc == NULL) {
        return 0;
    }
    pthread_mutex_lock(&h->socks_lock);
    lasted = now_ns > sc->t_phase_ns ? now_ns - sc->t_phase_ns : 0;
    sc->phase = phase;
    sc->t_phase_ns = now_ns;
    pthread_mutex_unlock(&h->socks_lock);
    return lasted;
}

/* Whether `url` is served without an API key. */
static int open_path(const char *url)
{
    return strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0;
}

/*
 * The first call of a request (headers complete): enforce the header deadline, then, with API
 * keys configured, authenticate and admit it. A refusal is queued now, before any body is read.
 */
static enum MHD_Result on_headers(router_http_t *h, struct MHD_Connection *conn, const char *url,
                                  const char *method, void **con_cls)
{
    uint64_t now_ns = tdm_clock_now_ns();
    router_apikey_verdict_t verdict;
    router_apierr_t err;
    uint32_t retry_after_s = 0;
    conn_t *cc;

    (void)method;
    if (set_phase(h, conn, SOCK_BODY, now_ns) >
        (uint64_t)h->params.header_timeout_s * TDM_NS_PER_S) {
        tdm_log(TDM_LOG_INFO, "http", "request headers too slow: closed after %u s",
                h->params.header_timeout_s);
        return MHD_NO;
    }
    cc = calloc(1, sizeof(*cc));
    if (cc == NULL) {
        return MHD_NO;
    }
    *con_cls = cc;
    if (router_apikeys_count(h->keys) == 0 || open_path(url)) {
        cc->t_headers_ns = now_ns;
        return MHD_YES;
    }
    set_phase(h, conn, SOCK_SERVING, now_ns); /* a refusal is answered now */
    cc->tenant = router_apikeys_authenticate(
        h->keys, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION));
    if (cc->tenant == 0) {
        router_apierr_set(&err, TDM_HTTP_UNAUTHORIZED, ROUTER_APIERR_INVALID_REQUEST,
                          "invalid_api_key", NULL, "%s",
                          MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                      MHD_HTTP_HEADER_AUTHORIZATION) == NULL
                              ? "no API key given: send 'Authorization: Bearer KEY'"
                              : "incorrect API key provided");
        return respond_error(h, conn, &err);
    }
    verdict = router_apikeys_acquire(h->keys, cc->tenant, now_ns, &retry_after_s);
    if (verdict != ROUTER_APIKEY_ADMITTED) {
        int rate = verdict == ROUTER_APIKEY_RATE_LIMITED;
        router_apierr_set(&err, TDM_HTTP_TOO_MANY_REQUESTS, ROUTER_APIERR_RATE_LIMIT,
                          rate ? "rate_limit_exceeded" : "concurrency_limit_exceeded", NULL,
                          "%s for API key '%s'; retry after %u s",
                          rate ? "requests-per-minute limit reached"
                               : "too many requests in flight",
                          router_apikeys_name(h->keys, cc->tenant), retry_after_s);
        return respond_error_retry(h, conn, &err, retry_after_s);
    }
    cc->admitted = 1;
    set_phase(h, conn, SOCK_BODY, now_ns);
    cc->t_headers_ns = now_ns;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    router_http_t *h = cls;
    conn_t *cc = *con_cls;

    (void)version;
    if (cc == NULL) {
        return on_headers(h, conn, url, method, con_cls);
    }
    if (cc->t_headers_ns == 0) {
        *upload_data_size = 0; /* answered at the headers (401, 429): the body is dropped */
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        if (tdm_clock_now_ns() - cc->t_headers_ns >
            (uint64_t)h->params.body_timeout_s * TDM_NS_PER_S) {
            tdm_log(TDM_LOG_INFO, "http", "request body too slow: closed after %u s",
                    h->params.body_timeout_s);
            return MHD_NO;
        }
        if (!cc->too_large && cc->body.n_bytes + n > h->params.max_body_bytes) {
            cc->too_large = 1;
            tdm_buf_fini(&cc->body);
        }
        if (!cc->too_large && tdm_buf_append(&cc->body, upload_data, n) != TDM_OK) {
            return MHD_NO;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    set_phase(h, conn, SOCK_SERVING, tdm_clock_now_ns());
    return route(h, conn, url, method, cc);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    router_http_t *h = cls;
    conn_t *cc = *con_cls;

    (void)toe;
    set_phase(h, conn, SOCK_HEADERS, tdm_clock_now_ns());
    if (cc != NULL) {
        if (cc->admitted) {
            router_apikeys_release(h->keys, cc->tenant);
        }
        if (cc->untimed) {
            MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                      (unsigned int)h->params.idle_timeout_s);
        }
        tdm_buf_fini(&cc->body);
        free(cc);
        *con_cls = NULL;
    }
}

/*
 * Opened and closed connections: the socket context the reaper times. MHD reports a connection
 * closed before it closes the socket, so the reaper (which holds the lock while it shuts a
 * socket down) never touches a descriptor that was closed and reused.
 */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    router_http_t *h = cls;
    sock_t *sc = *socket_context;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        sc = calloc(1, sizeof(*sc));
        if (sc == NULL || info == NULL) {
            free(sc);
            return; /* no deadlines for this one; the idle timeout still applies */
        }
        sc->fd = info->connect_fd;
        sc->phase = SOCK_HEADERS;
        sc->t_phase_ns = tdm_clock_now_ns();
        pthread_mutex_lock(&h->socks_lock);
        sc->next = h->socks;
        if (h->socks != NULL) {
            h->socks->prev = sc;
        }
        h->socks = sc;
        pthread_mutex_unlock(&h->socks_lock);
        *socket_context = sc;
        return;
    }
    if (sc == NULL) {
        return;
    }
    pthread_mutex_lock(&h->socks_lock);
    if (sc->prev != NULL) {
        sc->prev->next = sc->next;
    } else {
        h->socks = sc->next;
    }
    if (sc->next != NULL) {
        sc->next->prev = sc->prev;
    }
    pthread_mutex_unlock(&h->socks_lock);
    free(sc);
    *socket_context = NULL;
}

/*
 * The reaper: every REAPER_PERIOD_MS, shut down the socket of every connection whose headers or
 * body are late (a client that sends a byte now and then never trips the idle timeout). MHD's
 * thread of that connection then sees the end of the stream and closes it.
 */
static void *reaper_main(void *arg)
{
    router_http_t *h = arg;
    uint64_t header_ns = (uint64_t)h->params.header_timeout_s * TDM_NS_PER_S;
    uint64_t body_ns = (uint64_t)h->params.body_timeout_s * TDM_NS_PER_S;

    pthread_mutex_lock(&h->socks_lock);
    while (!h->stopping) {
        struct timespec until;
        uint64_t now_ns = tdm_clock_now_ns();
        for (sock_t *sc = h->socks; sc != NULL; sc = sc->next) {
            uint64_t lasted = now_ns > sc->t_phase_ns ? now_ns - sc->t_phase_ns : 0;
            if ((sc->phase == SOCK_HEADERS && lasted > header_ns) ||
                (sc->phase == SOCK_BODY && lasted > body_ns)) {
                tdm_log(TDM_LOG_INFO, "http", "slow client cut: %s not complete after %u s",
                        sc->phase == SOCK_HEADERS ? "headers" : "body",
                        sc->phase == SOCK_HEADERS ? h->params.header_timeout_s
                                                  : h->params.body_timeout_s);
                shutdown(sc->fd, SHUT_RDWR);
                sc->phase = SOCK_SERVING; /* once */
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += REAPER_PERIOD_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->reaper_wake, &h->socks_lock, &until);
    }
    pthread_mutex_unlock(&h->socks_lock);
    return NULL;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

static void stop_reaper(router_http_t *h)
{
    pthread_mutex_lock(&h->socks_lock);
    h->stopping = 1;
    pthread_cond_signal(&h->reaper_wake);
    pthread_mutex_unlock(&h->socks_lock);
    pthread_join(h->reaper, NULL);
}

tdm_status_t router_http_create(const router_http_params_t *params, const router_model_t *model,
                                router_control_t *control, router_metrics_t *metrics,
                                router_http_t **http_out)
{
    struct addrinfo hints;
    struct addrinfo *addr = NULL;
    const union MHD_DaemonInfo *info;
    /* poll(), not select(): a select() loop closes every socket numbered 1024 or above unanswered,
       so about 1,000 idle connections cut off everyone else (scripts/chaos --soak) */
    unsigned int flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                         MHD_USE_POLL | MHD_USE_ERROR_LOG;
    char port_text[8];
    router_http_t *h;
    int rc;

    char key_err[256];
    pthread_condattr_t cond_attr;
    tdm_status_t status;

    if (params == NULL || params->host == NULL || model == NULL || control == NULL ||
        metrics == NULL || http_out == NULL || params->max_body_bytes == 0 ||
        params->idle_timeout_s == 0 || params->header_timeout_s == 0 ||
        params->body_timeout_s == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(port_text, sizeof(port_text), "%u", params->port);
    rc = getaddrinfo(params->host, port_text, &hints, &addr);
    if (rc != 0 || addr == NULL) {
        tdm_log(TDM_LOG_ERROR, "http", "cannot resolve listen address: host=%s error=\"%s\"",
                params->host, gai_strerror(rc));
        return TDM_ERR_INVALID_ARG;
    }
    h = calloc(1, sizeof(*h));
    if (h == NULL) {
        freeaddrinfo(addr);
        return TDM_ERR_NO_MEMORY;
    }
    h->params = *params;
    h->model = model;
    h->control = control;
    h->metrics = metrics;
    {
        /* a restarted router must not reuse the ids its workers still hold (request.h) */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        atomic_init(&h->next_request_id,
                    router_request_first_id((uint64_t)now.tv_sec * TDM_NS_PER_S ^
                                            (uint64_t)now.tv_nsec ^ tdm_clock_now_ns() ^
                                            ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)h));
    }
    h->seed_salt = tdm_hash_splitmix64(tdm_clock_now_ns() ^ (uint64_t)(uintptr_t)h);
    status = router_apikeys_create(params->api_keys_file, params->api_keys, &params->key_limits,
                                   &h->keys, key_err, sizeof(key_err));
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "http", "API keys refused: %s", key_err);
        goto err_free;
    }
    status = TDM_ERR_NO_MEMORY;
    if (router_responses_create(ROUTER_RESPONSES_DEFAULT_MAX, &h->responses) != TDM_OK) {
        goto err_keys;
    }
    pthread_condattr_init(&cond_attr);
    pthread_condattr_setclock(&cond_attr, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&h->reaper_wake, &cond_attr);
    pthread_condattr_destroy(&cond_attr);
    if (rc != 0) {
        goto err_responses;
    }
    if (pthread_mutex_init(&h->socks_lock, NULL) != 0) {
        goto err_cond;
    }
    if (pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
        goto err_mutex;
    }
    if (addr->ai_family == AF_INET6) {
        flags |= MHD_USE_IPv6;
    }
    h->daemon = MHD_start_daemon(
        flags, params->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, addr->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)params->max_connections,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        h, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)params->idle_timeout_s,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)params->max_connections_per_ip,
        MHD_OPTION_END);
    if (h->daemon == NULL) {
        tdm_log(TDM_LOG_ERROR, "http", "cannot listen: host=%s port=%u", params->host,
                params->port);
        status = TDM_ERR_IO;
        goto err_reaper;
    }
    freeaddrinfo(addr);
    info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info != NULL ? info->port : params->port;
    tdm_log(TDM_LOG_INFO, "http",
            "http listening: host=%s port=%u api_keys=%zu idle_timeout_s=%u header_timeout_s=%u "
            "body_timeout_s=%u",
            params->host, h->port, router_apikeys_count(h->keys), params->idle_timeout_s,
            params->header_timeout_s, params->body_timeout_s);
    if (router_apikeys_count(h->keys) == 0) {
        tdm_log(TDM_LOG_WARN, "http",
                "no API keys configured: the API is open to anyone who can reach port %u "
                "(--api-keys-file or TANDEM_API_KEYS; docs/DEPLOY.md Security)",
                h->port);
    }
    *http_out = h;
    return TDM_OK;

err_reaper:
    stop_reaper(h);
err_mutex:
    pthread_mutex_destroy(&h->socks_lock);
err_cond:
    pthread_cond_destroy(&h->reaper_wake);
err_responses:
    router_responses_destroy(h->responses);
err_keys:
    router_apikeys_destroy(h->keys);
err_free:
    freeaddrinfo(addr);
    free(h);
    return status;
}

uint16_t router_http_port(const router_http_t *http)
{
    return http->port;
}

void router_http_destroy(router_http_t *http)
{
    if (http == NULL) {
        return;
    }
    MHD_stop_daemon(http->daemon); /* every connection closed: the list is empty */
    stop_reaper(http);
    pthread_mutex_destroy(&http->socks_lock);
    pthread_cond_destroy(&http->reaper_wake);
    router_responses_destroy(http->responses);
    router_apikeys_destroy(http->keys);
    free(http);
}
