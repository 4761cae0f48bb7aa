#include "router/router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

struct router {
    router_model_t *model;
    router_metrics_t *metrics;
    router_control_t *control;
    router_http_t *http;
};

void router_params_default(router_params_t *params)
{
    memset(params, 0, sizeof(*params));
    router_control_params_default(&params->control);
    router_http_params_default(&params->http);
}

tdm_status_t router_create(const router_params_t *params, router_t **router_out, char *err,
                           size_t err_bytes)
{
    router_t *r;
    tdm_status_t status;

    if (params == NULL || router_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    status = router_model_load(&params->model, &r->model, err, err_bytes);
    if (status != TDM_OK) {
        goto err_free;
    }
    status = router_metrics_create(&r->metrics);
    if (status != TDM_OK) {
        goto err_model;
    }
    status = router_control_create(&params->control, r->model, r->metrics, &r->control);
    if (status != TDM_OK) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "control endpoint %s: %s", params->control.endpoint,
                     tdm_status_message(status));
        }
        goto err_metrics;
    }
    status = router_http_create(&params->http, r->model, r->control, r->metrics, &r->http);
    if (status != TDM_OK) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "http %s:%u: %s", params->http.host, params->http.port,
                     tdm_status_message(status));
        }
        goto err_control;
    }
    tdm_log(TDM_LOG_INFO, "router",
            "router serving: model=%s max_context=%u http_port=%u "
            "control=%s fingerprint=0x%016llx",
            router_model_info(r->model)->name, router_model_info(r->model)->max_context,
            router_http_port(r->http), router_control_endpoint(r->control),
            (unsigned long long)router_model_info(r->model)->fingerprint);
    *router_out = r;
    return TDM_OK;

err_control:
    router_control_destroy(r->control);
err_metrics:
    router_metrics_destroy(r->metrics);
err_model:
    router_model_destroy(r->model);
err_free:
    free(r);
    return status;
}

void router_destroy(router_t *router)
{
    if (router == NULL) {
        return;
    }
    /* Fail the turns in flight first so HTTP threads blocked on tokens finish, then drain HTTP,
     * then free the control plane they released their requests to. */
    router_control_stop(router->control);
    router_http_destroy(router->http);
    router_control_destroy(router->control);
    router_metrics_destroy(router->metrics);
    router_model_destroy(router->model);
    tdm_log(TDM_LOG_INFO, "router", "router stopped");
    free(router);
}

uint16_t router_http_port_bound(const router_t *router)
{
    return router_http_port(router->http);
}

const char *router_control_endpoint_bound(const router_t *router)
{
    return router_control_endpoint(router->control);
}

const router_model_t *router_model(const router_t *router)
{
    return router->model;
}

router_metrics_t *router_metrics(const router_t *router)
{
    return router->metrics;
}
