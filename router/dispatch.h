/* dispatch.h - turns accepted requests into protocol traffic and worker replies into events.
 *
 * Owns the table of turns in flight. For each request it finds the session (X-Session-Id, else
 * the longest cached prefix), places it (sticky; new sessions by placement.h), computes the
 * delta the decode worker lacks, and either asks the decode worker to prefill it locally (delta
 * below the local-prefill threshold, or no prefill worker) or runs the disaggregated handoff:
 * ReservePages -> PageReservation -> PrefillJob -> CompletionNotice -> DecodeRequest(REMOTE).
 * Token chunks extend the session history and go to the request's mailbox; Finish ends the
 * turn. A lost worker's turns are retried elsewhere from the history (decode: the whole context
 * so far, positions unchanged, so a seeded stream continues identically; prefill: a new
 * reservation), a lost state (ERROR_STATE_LOST) restarts from what the worker still holds.
 * docs/PROTOCOL.md describes the flows.
 *
 * Knows nothing of sockets: messages leave through the caller's send function. Not
 * thread-safe: every call runs on the control thread under its state lock.
 */
#ifndef TANDEM_ROUTER_DISPATCH_H
#define TANDEM_ROUTER_DISPATCH_H

#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"
#include "router/metrics.h"
#include "router/model.h"
#include "router/registry.h"
#include "router/request.h"
#include "router/session.h"

/* Tunables of the dispatcher (plain data; router_dispatch_params_default fills it). */
typedef struct {
    uint32_t local_prefill_tokens;   /* deltas shorter than this prefill on the decode node */
    uint32_t max_attempts;           /* tries per turn (worker lost, state lost) */
    uint32_t reservation_timeout_ms; /* deadline for a PageReservation */
    uint32_t prefill_timeout_ms;     /* deadline for a CompletionNotice; ReservePages.timeout_ms
                                        is the sum of both (the pages wait for the prefill) */
} router_dispatch_params_t;

/* router_dispatch_params_default - 512 tokens, 4 attempts, 10 s reservation, 600 s prefill. */
void router_dispatch_params_default(router_dispatch_params_t *params);

/*
 * The transport: send `env` to the worker with routing id `worker_id`. Returns TDM_OK, or
 * TDM_ERR_PEER_LOST when it cannot be delivered (unknown peer, queue full), in which case the
 * dispatcher declares the worker lost.
 */
typedef tdm_status_t router_send_fn(void *ctx, const char *worker_id, const Tandem__Envelope *env);

/* The dispatcher; opaque. */
typedef struct router_dispatch router_dispatch_t;

/*
 * router_dispatch_create - a dispatcher over borrowed model, registry, sessions and metrics
 * (all must outlive it) sending through send(send_ctx, ...). Returns TDM_OK,
 * TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_dispatch_create(const router_dispatch_params_t *params,
                                    const router_model_t *model, router_registry_t *registry,
                                    router_sessions_t *sessions, router_metrics_t *metrics,
                                    router_send_fn *send, void *send_ctx,
                                    router_dispatch_t **dispatch_out);

/*
 * router_dispatch_destroy - fail every turn still in flight ("router shutting down", 503) and
 * free the table. Accepts NULL.
 */
void router_dispatch_destroy(router_dispatch_t *dispatch);

/*
 * router_dispatch_submit - start serving `request` (takes a reference). Errors (session busy,
 * no decode worker, ...) are posted to the request's mailbox, never returned.
 */
void router_dispatch_submit(router_dispatch_t *dispatch, router_request_t *request,
                            uint64_t now_ns);

/*
 * router_dispatch_release - the HTTP side is done with `request` (its output ended, or the client
 * left): if the turn is still running, tell its workers to abort; drop the dispatcher's
 * reference. `client_gone`: counts a client abort.
 */
void router_dispatch_release(router_dispatch_t *dispatch, router_request_t *request,
                             int client_gone, uint64_t now_ns);

/*
 * router_dispatch_on_message - a checked message from live worker `slot` (PageReservation,
 * CompletionNotice, TokenChunk, Finish, Error). Messages for unknown requests are dropped
 * (a reservation nobody wants is aborted so its pages are released).
 */
void router_dispatch_on_message(router_dispatch_t *dispatch, int slot, const Tandem__Envelope *env,
                                uint64_t now_ns);

/*
 * router_dispatch_worker_gone - the worker in `slot` left or was lost: its sessions become
 * unplaced, its turns are retried elsewhere, and it is removed from the registry.
 */
void router_dispatch_worker_gone(router_dispatch_t *dispatch, int slot,
                                 router_registry_removal_t removal, const char *why,
                                 uint64_t now_ns);

/* router_dispatch_tick - enforce stage deadlines (reservation, prefill). */
void router_dispatch_tick(router_dispatch_t *dispatch, uint64_t now_ns);

/* router_dispatch_n_inflight - turns in flight. */
uint64_t router_dispatch_n_inflight(const router_dispatch_t *dispatch);

#endif
