/* node_http.h - a worker's /health and /metrics endpoint (libmicrohttpd, its own thread).
 *
 * Owns the HTTP daemon. The page bodies come from the owner's callback, called on the daemon's
 * thread: the owner renders from state it guards itself. Serves exactly GET /health and
 * GET /metrics: every other path is 404 whatever the method (a worker port exposes nothing
 * else), another method on those two is 405, and no request body is kept. Every connection has
 * an idle timeout (no byte for timeout_s closes it) and at most NODE_HTTP_MAX_CONNECTIONS are
 * open at once, so a slow client cannot hold the endpoint. Knows nothing of what is reported.
 * Shared by tandem-decode and tandem-prefill (library tandem_node).
 */
#ifndef TANDEM_NODE_HTTP_H
#define TANDEM_NODE_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Which page is asked for. */
typedef enum {
    NODE_HTTP_HEALTH = 0,  /* GET /health: JSON, 200 when healthy, else 503 */
    NODE_HTTP_METRICS = 1, /* GET /metrics: Prometheus text 0.0.4 */
} node_http_page_t;

/*
 * Render `page`: *body_out is a malloc'ed NUL-terminated string the daemon frees; return the HTTP
 * status (200, 503). Called from the daemon's thread.
 */
typedef int node_http_render_fn(void *arg, node_http_page_t page, char **body_out);

typedef struct node_http node_http_t;

/* Most connections a worker's HTTP endpoint keeps open; default idle timeout, s. */
#define NODE_HTTP_MAX_CONNECTIONS 64u
#define NODE_HTTP_TIMEOUT_S       30u

/*
 * node_http_create - listen on host:port (port 0: any free port; node_http_port says which),
 * closing connections idle for timeout_s (>= 1) seconds. Returns TDM_OK, TDM_ERR_INVALID_ARG
 * (bad host, timeout_s 0), TDM_ERR_IO (cannot bind: logged with the address) or
 * TDM_ERR_NO_MEMORY. render/arg are borrowed until node_http_destroy.
 */
tdm_status_t node_http_create(const char *host, uint16_t port, uint32_t timeout_s,
                              node_http_render_fn *render, void *arg, node_http_t **http_out);

/* node_http_port - the bound port. */
uint16_t node_http_port(const node_http_t *http);

/* node_http_destroy - stop the daemon (waits for running callbacks). Accepts NULL. */
void node_http_destroy(node_http_t *http);

/* node_http_parse_host_port - split "HOST:PORT"; returns 0, or -1 when malformed. */
int node_http_parse_host_port(const char *text, char *host, size_t host_bytes, uint16_t *port_out);

#endif
