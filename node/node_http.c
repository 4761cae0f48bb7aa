/* node_http.c - /health and /metrics of a worker (node_http.h). */
#include "node/node_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_status.h"
#include "common/log.h"

struct node_http {
    struct MHD_Daemon *daemon;
    node_http_render_fn *render;
    void *arg;
    uint16_t port;
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    node_http_t *h = cls;
    struct MHD_Response *resp;
    char *body = NULL;
    int status;
    enum MHD_Result ret;
    const char *type = "text/plain; version=0.0.4";

    (void)version;
    (void)upload_data;
    if (*req_cls != NULL) {
        *upload_data_size = 0; /* answered at the headers: a body is dropped */
        return MHD_YES;
    }
    *req_cls = h; /* headers complete: answer now, never buffer a body */
    if (strcmp(url, "/health") != 0 && strcmp(url, "/metrics") != 0) {
        status = TDM_HTTP_NOT_FOUND;
        body = strdup("not found\n");
    } else if (strcmp(method, "GET") != 0) {
        status = TDM_HTTP_METHOD_NOT_ALLOWED;
        body = strdup("method not allowed\n");
    } else if (strcmp(url, "/health") == 0) {
        status = h->render(h->arg, NODE_HTTP_HEALTH, &body);
        type = "application/json";
    } else {
        status = h->render(h->arg, NODE_HTTP_METRICS, &body);
    }
    if (body == NULL) {
        return MHD_NO;
    }
    resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    ret = MHD_queue_response(conn, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

int node_http_parse_host_port(const char *text, char *host, size_t host_bytes, uint16_t *port_out)
{
    const char *colon = text != NULL ? strrchr(text, ':') : NULL;
    char *end;
    unsigned long port;
    size_t n;

    if (colon == NULL || colon == text || colon[1] == '\0') {
        return -1;
    }
    port = strtoul(colon + 1, &end, 10);
    n = (size_t)(colon - text);
    if (*end != '\0' || port > 65535 || n >= host_bytes) {
        return -1;
    }
    memcpy(host, text, n);
    host[n] = '\0';
    *port_out = (uint16_t)port;
    return 0;
}

tdm_status_t node_http_create(const char *host, uint16_t port, uint32_t timeout_s,
                              node_http_render_fn *render, void *arg, node_http_t **http_out)
{
    node_http_t *h;
    struct sockaddr_in addr;
    const union MHD_DaemonInfo *info;

    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    if (host == NULL || render == NULL || http_out == NULL || timeout_s == 0 ||
        inet_pton(AF_INET, strcmp(host, "localhost") == 0 ? "127.0.0.1" : host,
                  &addr.sin_addr) != 1) {
        tdm_log(TDM_LOG_ERROR, "http", "bad listen address: host=%s", host != NULL ? host : "");
        return TDM_ERR_INVALID_ARG;
    }
    h = calloc(1, sizeof(*h));
    if (h == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    h->render = render;
    h->arg = arg;
    h->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, port, NULL,
                                 NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned int)timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned int)NODE_HTTP_MAX_CONNECTIONS, MHD_OPTION_END);
    if (h->daemon == NULL) {
        tdm_log(TDM_LOG_ERROR, "http", "cannot listen: address=%s:%u", host, (unsigned)port);
        free(h);
        return TDM_ERR_IO;
    }
    info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info != NULL ? info->port : port;
    *http_out = h;
    return TDM_OK;
}

uint16_t node_http_port(const node_http_t *http)
{
    return http->port;
}

void node_http_destroy(node_http_t *http)
{
    if (http == NULL) {
        return;
    }
    MHD_stop_daemon(http->daemon);
    free(http);
}
