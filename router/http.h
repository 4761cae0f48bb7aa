/* http.h - the router's HTTP front end on libmicrohttpd.
 *
 * Owns the daemon (one thread per connection, so a streaming response may block waiting for
 * tokens) and the routing of: POST /v1/chat/completions and /v1/completions (validated by
 * validate.h before anything reaches the cluster; answered whole or as server-sent events by
 * turn.h), GET /v1/models, GET /health (200 while a decode worker is registered, else 503, with
 * worker counts) and GET /metrics (Prometheus text). Every error is OpenAI-shaped JSON with the
 * right status (404 unknown path, 405 wrong method, 413 body too large, 400/404/415 from
 * validation, 409/503/504 from serving) and is counted by code. Knows nothing of ZeroMQ.
 *
 * Security (docs/DEPLOY.md "Security"): with API keys configured (apikeys.h) every path except
 * GET /health and GET /metrics needs "Authorization: Bearer KEY" (else 401 invalid_api_key,
 * answered before the body is read); each request runs as its key's tenant and is admitted
 * against the key's rate and concurrency limits (else 429 with Retry-After). Every connection
 * has an idle timeout (no byte for idle_timeout_s closes it), a header deadline (the request's
 * headers must be complete header_timeout_s after the connection opened or the previous request
 * ended) and a body deadline (the body must be complete body_timeout_s after its headers). A
 * generation in progress is exempt: neither the wait for the first token nor a stream (kept
 * alive by SSE comments) is cut.
 */
#ifndef TANDEM_ROUTER_HTTP_H
#define TANDEM_ROUTER_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/apikeys.h"
#include "router/control.h"
#include "router/metrics.h"
#include "router/model.h"
#include "router/turn.h"

/* Parameters of the front end (plain data; strings borrowed for create). */
typedef struct {
    const char *host;          /* address to bind, e.g. 127.0.0.1 or 0.0.0.0 */
    uint16_t port;             /* 0 picks a free port (router_http_port tells which) */
    size_t max_body_bytes;     /* larger request bodies get 413 */
    uint32_t max_connections;  /* concurrent connections (threads) */
    uint32_t max_connections_per_ip; /* concurrent connections from one address (0: no limit) */
    router_turn_params_t turn; /* token timeout and SSE keep-alive */
    uint32_t idle_timeout_s;   /* close a connection silent this long (>= 1) */
    uint32_t header_timeout_s; /* headers complete within this (>= 1) */
    uint32_t body_timeout_s;   /* body complete within this after the headers (>= 1) */
    const char *api_keys_file; /* key file (apikeys.h format), or NULL */
    const char *api_keys;      /* key entries (comma or newline separated), or NULL */
    router_apikeys_limits_t key_limits; /* each key's limits unless its entry sets them */
} router_http_params_t;

/*
 * router_http_params_default - 127.0.0.1:8000, 64 MiB bodies, 1024 connections, 600 s / 5 s,
 * 30 s idle, header and body timeouts, no API keys (open), unlimited keys.
 */
void router_http_params_default(router_http_params_t *params);

/* The front end; opaque. */
typedef struct router_http router_http_t;

/*
 * router_http_create - load the API keys and start serving. model, control and metrics are
 * borrowed and must outlive the front end. Returns TDM_OK, TDM_ERR_INVALID_ARG (bad host or
 * timeouts), TDM_ERR_FORMAT / TDM_ERR_NOT_FOUND / TDM_ERR_IO (bad or unreadable API key file:
 * the reason, never a key, is logged) or TDM_ERR_IO (could not listen: the address and reason
 * are logged). Without keys it logs a warning that the API is open.
 */
tdm_status_t router_http_create(const router_http_params_t *params, const router_model_t *model,
                                router_control_t *control, router_metrics_t *metrics,
                                router_http_t **http_out);

/* router_http_port - the bound TCP port. */
uint16_t router_http_port(const router_http_t *http);

/*
 * router_http_destroy - stop accepting, wait for every connection thread (turns in flight end
 * when the control plane fails them) and free. Accepts NULL.
 */
void router_http_destroy(router_http_t *http);

#endif
