/* router.h - the tandem-router process as a library: model, metrics, control plane, HTTP.
 *
 * Owns the four parts and their order of start and stop: the model (tokenizer, limits,
 * fingerprint) first, then metrics, the control plane (ZeroMQ ROUTER, registry, sessions,
 * dispatcher) and last the HTTP front end; stopping fails the turns in flight, drains the HTTP
 * threads, then frees in reverse. main() and the tests both use it. Knows nothing of flags or
 * signals (main.c does).
 */
#ifndef TANDEM_ROUTER_ROUTER_H
#define TANDEM_ROUTER_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/control.h"
#include "router/http.h"
#include "router/metrics.h"
#include "router/model.h"

/* Everything a router needs (plain data; fill with router_params_default, then override). */
typedef struct {
    router_model_params_t model;
    router_control_params_t control;
    router_http_params_t http;
} router_params_t;

/* router_params_default - the defaults of each part (model_dir is left NULL). */
void router_params_default(router_params_t *params);

/* The router; opaque. */
typedef struct router router_t;

/*
 * router_create - load the model, bind the control endpoint and the HTTP port, start serving.
 * Returns TDM_OK with *router_out, or the failing part's status with a reason in err
 * (err_bytes, may be 0); nothing is left running on failure.
 */
tdm_status_t router_create(const router_params_t *params, router_t **router_out, char *err,
                           size_t err_bytes);

/* router_destroy - stop and free everything (see the header comment for the order). Accepts NULL.
 */
void router_destroy(router_t *router);

/* router_http_port_bound - the HTTP port in use. */
uint16_t router_http_port_bound(const router_t *router);

/* router_control_endpoint_bound - the ZeroMQ endpoint in use (borrowed). */
const char *router_control_endpoint_bound(const router_t *router);

/* router_model - the loaded model (borrowed). */
const router_model_t *router_model(const router_t *router);

/* router_metrics - the metrics (borrowed; tests read counters). */
router_metrics_t *router_metrics(const router_t *router);

#endif
