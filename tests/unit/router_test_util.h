/* router_test_util.h - the in-process router that the router tests start (header-only test code).
 *
 * rtu_router_start makes (or reuses) a tiny random-weight checkpoint under $TANDEM_TEST_TMP with
 * $TANDEM_BIN_DIR/tandem-mkmodel (--preset tiny --seed 1; made again when tandem-mkmodel is
 * newer than it), then starts a router on it: HTTP on a free loopback port, control on a free
 * loopback tcp port, "tiny" as the served name, 10 s turn timeout, 5 s reservation and prefill
 * deadlines. Both variables are set by ctest (tests/CMakeLists.txt).
 */
#ifndef TANDEM_TESTS_ROUTER_TEST_UTIL_H
#define TANDEM_TESTS_ROUTER_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "router/model.h"
#include "router/router.h"

#define RTU_PATH_BYTES 4096

/* A started router (owned by the test; rtu_router_stop frees it). */
typedef struct {
    char model_dir[RTU_PATH_BYTES];
    router_t *router;
    int port;                     /* bound HTTP port */
    const proto_compat_t *compat; /* what a worker must match to register (borrowed) */
    const char *endpoint;         /* bound control endpoint (borrowed) */
} rtu_router_t;

/* rtu_run_shell - run `command` with /bin/sh; its exit status, or -1 when it did not exit. */
static inline int rtu_run_shell(const char *command)
{
    int rc = system(command);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/*
 * rtu_router_start - the checkpoint $TANDEM_TEST_TMP/<model_name> and a router on it with the
 * given heartbeat interval and timeout (ms) and local-prefill threshold (tokens). Returns the
 * router (caller stops it with rtu_router_stop), or NULL with the reason printed.
 */
static inline rtu_router_t *rtu_router_start(const char *model_name, uint32_t heartbeat_interval_ms,
                                             uint32_t heartbeat_timeout_ms,
                                             uint32_t local_prefill_tokens)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char command[RTU_PATH_BYTES * 4];
    char err[512] = "";
    router_params_t params;
    rtu_router_t *fx;

    if (bin == NULL || tmp == NULL) {
        fprintf(stderr, "TANDEM_BIN_DIR / TANDEM_TEST_TMP not set (run through ctest)\n");
        return NULL;
    }
    fx = calloc(1, sizeof(*fx));
    if (fx == NULL) {
        return NULL;
    }
    snprintf(fx->model_dir, sizeof(fx->model_dir), "%s/%s", tmp, model_name);
    /* under an exclusive flock on <model>.lock, as ftu_make_model: parallel tests share it */
    snprintf(command, sizeof(command),
             "flock %s.lock -c '[ %s/config.json -nt %s/tandem-mkmodel ] || %s/tandem-mkmodel "
             "--log-level warn --preset tiny --seed 1 --out %s >/dev/null'",
             fx->model_dir, fx->model_dir, bin, bin, fx->model_dir);
    if (rtu_run_shell(command) != 0) {
        free(fx);
        return NULL;
    }
    router_params_default(&params);
    params.model.model_dir = fx->model_dir;
    params.model.served_name = "tiny";
    params.http.host = "127.0.0.1";
    params.http.port = 0;
    params.http.turn.timeout_ms = 10000;
    params.http.turn.keepalive_ms = 1000;
    params.control.endpoint = "tcp://127.0.0.1:*";
    params.control.heartbeat_interval_ms = heartbeat_interval_ms;
    params.control.heartbeat_timeout_ms = heartbeat_timeout_ms;
    params.control.dispatch.local_prefill_tokens = local_prefill_tokens;
    params.control.dispatch.reservation_timeout_ms = 5000;
    params.control.dispatch.prefill_timeout_ms = 5000;
    if (router_create(&params, &fx->router, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "router_create: %s\n", err);
        free(fx);
        return NULL;
    }
    fx->port = router_http_port_bound(fx->router);
    fx->compat = router_model_compat(router_model(fx->router));
    fx->endpoint = router_control_endpoint_bound(fx->router);
    return fx;
}

/* rtu_router_stop - stop the router and free fx. Accepts NULL. */
static inline void rtu_router_stop(rtu_router_t *fx)
{
    if (fx != NULL) {
        router_destroy(fx->router);
        free(fx);
    }
}

#endif
