/* fleet.h - this router's part in a fleet of routers (issue 18 item 3, docs/ROUTERS.md).
 *
 * Owns the three pieces a router needs to be one of several: the index of the sessions the
 * decode nodes report (router/residents.h), the relearning of sessions it has no record of
 * (router/relearn.h: parked turns, SessionQuery, peers' replicas) and the peer routers
 * (router/peers.h: ring ownership, SessionReplica after each turn). The control plane calls it
 * at five points: a heartbeat, a SessionReplica / SessionHistory frame, a submitted turn, a
 * released turn, and each loop pass; so control.c stays the socket and the loop. With no peers
 * it still learns sessions from the decode nodes (a restarted router). Not thread-safe: the
 * control thread under its state lock.
 */
#ifndef TANDEM_ROUTER_FLEET_H
#define TANDEM_ROUTER_FLEET_H

#include <stdint.h>

#include "common/curve.h"
#include "common/status.h"
#include "proto/proto.h"
#include "router/dispatch.h"
#include "router/metrics.h"
#include "router/registry.h"
#include "router/relearn.h"
#include "router/request.h"
#include "router/session.h"

/* What the fleet part needs (plain data; strings and objects borrowed, outliving the fleet). */
typedef struct {
    void *zctx;                       /* the control plane's ZeroMQ context (peers' sockets) */
    const char *router_id;            /* this router's id on the ring */
    const char *peers;                /* --peers: "ID=ENDPOINT,..." or NULL */
    const tdm_curve_keypair_t *curve; /* the router's CURVE key pair (peers share it), or NULL */
    uint32_t query_timeout_ms;        /* 0: ROUTER_RELEARN_QUERY_TIMEOUT_MS */
    uint32_t warmup_ms;               /* after start, unknown named sessions wait this long for
                                         the nodes' reports (relearn.h); 0: none */
    router_registry_t *registry;
    router_sessions_t *sessions;
    router_send_fn *send; /* to a worker (SessionQuery) */
    void *send_ctx;
    router_relearn_submit_fn *submit; /* a parked turn resumes: router_dispatch_submit */
    void *submit_ctx;
} router_fleet_params_t;

/* The fleet part; opaque. */
typedef struct router_fleet router_fleet_t;

/*
 * router_fleet_create - the index, the relearning and the peers' links. Returns TDM_OK,
 * TDM_ERR_INVALID_ARG (a bad --peers or id: logged) or TDM_ERR_NO_MEMORY / TDM_ERR_IO.
 */
tdm_status_t router_fleet_create(const router_fleet_params_t *params, router_fleet_t **fleet_out);

/* router_fleet_stop - resume every parked turn (before the dispatcher fails what is in flight).
 * Idempotent; later submits are not parked. */
void router_fleet_stop(router_fleet_t *fleet, uint64_t now_ns);

/* router_fleet_destroy - router_fleet_stop, close the peers' sockets, free. Accepts NULL. */
void router_fleet_destroy(router_fleet_t *fleet, uint64_t now_ns);

/* router_fleet_on_heartbeat - index the sessions decode node `worker_id` reports. */
void router_fleet_on_heartbeat(router_fleet_t *fleet, const char *worker_id,
                               const Tandem__Heartbeat *heartbeat);

/* router_fleet_worker_gone - forget what node `worker_id` reported (it left or was lost). */
void router_fleet_worker_gone(router_fleet_t *fleet, const char *worker_id);

/*
 * router_fleet_on_message - a SessionReplica (from a peer router, routing id "peer:<id>") or a
 * SessionHistory (from a registered worker); other bodies are ignored. Returns 1 when it took
 * the frame, 0 when the sender was not entitled to send it (dropped).
 */
int router_fleet_on_message(router_fleet_t *fleet, const char *sender_id,
                            const Tandem__Envelope *env, uint64_t now_ns);

/* router_fleet_submit - a new turn: 1 when parked behind a SessionQuery (it resumes through
 * submit), 0 when the caller dispatches it now. */
int router_fleet_submit(router_fleet_t *fleet, router_request_t *request, uint64_t now_ns);

/* router_fleet_release - the HTTP side released `request`: a parked turn is dropped; a finished
 * one's session is replicated to its owner and replica routers. */
void router_fleet_release(router_fleet_t *fleet, router_request_t *request);

/* router_fleet_tick - time out unanswered queries; drop what peers sent back. */
void router_fleet_tick(router_fleet_t *fleet, uint64_t now_ns);

/* router_fleet_gauges - fill the multi-router counters and the resident index's size of
 * `gauges` (metrics.h). */
void router_fleet_gauges(const router_fleet_t *fleet, router_metrics_gauges_t *gauges);

#endif
