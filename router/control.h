/* control.h - the control plane thread: the ZeroMQ ROUTER socket, the worker registry, the
 * session table and the dispatcher, behind one state lock.
 *
 * Owns the socket (bound to the --control endpoint; ZMQ_ROUTER_MANDATORY, every send
 * non-blocking: an unreachable or backed-up worker is declared lost instead of stalling the
 * router), the registry, the session table, the dispatcher and a command queue through which
 * HTTP threads submit and release requests (woken by an eventfd polled next to the socket). The
 * thread unpacks and checks each frame (proto_unpack), answers Register with RegisterAck
 * (refusing incompatible workers with the reason), records heartbeats, tells unknown senders to
 * register, expires silent workers on the monotonic clock (never counting the router's own loop
 * stalls against them: router_registry_tick) and workers stalled past their grace, and hands the
 * rest to the
 * dispatcher. Its part in a fleet of routers (issue 18 item 3, docs/ROUTERS.md: the sessions
 * the decode nodes report, relearning unknown sessions, replicas to peer routers) is
 * router/fleet.h, called from a few points of the loop.
 * Knows nothing of HTTP.
 *
 * Threading: create/destroy from one thread; submit, release and snapshot from any thread.
 */
#ifndef TANDEM_ROUTER_CONTROL_H
#define TANDEM_ROUTER_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/dispatch.h"
#include "router/metrics.h"
#include "router/model.h"
#include "router/request.h"

/* Longest endpoint string, bytes. */
#define ROUTER_ENDPOINT_BYTES 256

/* Parameters of the control plane (plain data; strings borrowed for create). */
typedef struct {
    const char *endpoint;           /* ZeroMQ bind endpoint, e.g. tcp://127.0.0.1:5557 (port *
                                       picks a free one) */
    uint32_t heartbeat_interval_ms; /* announced to workers */
    uint32_t heartbeat_timeout_ms;  /* silence before a worker is lost (counted only while the
                                       router's own loop runs: router_registry_tick) */
    uint32_t stall_grace_ms;        /* a worker reporting Load.stalled this long is lost; 0:
                                       ROUTER_REGISTRY_STALL_GRACE_MS */
    uint32_t max_sessions;          /* session table size */
    const char *curve_secret_key;   /* router's CurveZMQ key file (common/curve.h), or NULL */
    const char *curve_workers;      /* allow-list of worker public keys; set with the above */
    const char *router_id;          /* this router's id on the peer ring (router/peers.h); NULL:
                                       "router-<pid>-<random>", a ring of one */
    const char *peers;              /* the fleet's other routers, "ID=ENDPOINT,..." (peers.h);
                                       NULL or "": none */
    uint32_t relearn_warmup_ms;     /* after start, a named session no decode node reports yet
                                       waits this long for their heartbeats (relearn.h); 0 none */
    router_dispatch_params_t dispatch;
} router_control_params_t;

/* router_control_params_default - tcp://127.0.0.1:5557, 250 ms / 1500 ms, 10 s stall grace,
 * 65536 sessions. */
void router_control_params_default(router_control_params_t *params);

/* The control plane; opaque. */
typedef struct router_control router_control_t;

/*
 * router_control_create - bind the socket and start the thread. model and metrics are borrowed
 * and must outlive the control plane. With curve_secret_key and curve_workers the socket is a
 * CURVE server (encrypted, and only workers whose public key is on the allow-list complete the
 * handshake: router/zap.h); with neither it is plain TCP and a warning is logged. Returns TDM_OK,
 * TDM_ERR_INVALID_ARG (bad parameters, or only one of the CURVE files), TDM_ERR_FORMAT /
 * TDM_ERR_NOT_FOUND / TDM_ERR_IO (a CURVE file unreadable or malformed: logged), TDM_ERR_IO
 * (bind failed: the endpoint and zmq_strerror are logged) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_control_create(const router_control_params_t *params,
                                   const router_model_t *model, router_metrics_t *metrics,
                                   router_control_t **control_out);

/*
 * router_control_stop - stop the thread and fail requests still in flight (503 shutting_down);
 * later submits fail and releases are ignored, so HTTP threads can finish safely. Idempotent.
 */
void router_control_stop(router_control_t *control);

/*
 * router_control_destroy - router_control_stop, then close the socket and free everything.
 * Accepts NULL. No other thread may use the control plane any more.
 */
void router_control_destroy(router_control_t *control);

/* router_control_endpoint - the endpoint actually bound (port resolved); borrowed. */
const char *router_control_endpoint(const router_control_t *control);

/*
 * router_control_submit - queue `request` for the dispatcher (takes a reference). Returns TDM_OK
 * or TDM_ERR_NO_MEMORY / TDM_ERR_UNSUPPORTED (shutting down); on failure no reference is kept.
 */
tdm_status_t router_control_submit(router_control_t *control, router_request_t *request);

/*
 * router_control_release - queue the release of `request` (router_dispatch_release); the HTTP
 * side's output ended (client_gone 0) or its client left (1). Best effort; never fails.
 */
void router_control_release(router_control_t *control, router_request_t *request, int client_gone);

/* router_control_snapshot - the gauges /metrics and /health need, under the state lock; the
 * caller frees them with router_metrics_gauges_fini. */
void router_control_snapshot(router_control_t *control, router_metrics_gauges_t *gauges_out);

#endif
