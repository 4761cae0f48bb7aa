/* relearn.h - a router learning sessions it has no record of (issue 18 item 3).
 *
 * A session the router has never served, or whose decode node it does not know (it restarted,
 * or another router served the previous turns), is learned before its turn is dispatched:
 *  - from a SessionReplica a peer router sent after a turn (router_relearn_on_replica: the
 *    history, tenant and decode node are written into the session table at once), and
 *  - from the decode node that reports the session in Load.resident_session_keys
 *    (router/residents.h): the turn is parked, a SessionQuery goes to that node, and its
 *    SessionHistory installs the session placed on that node with its cached_len, so the turn
 *    continues there and prefills only the new tokens. In the first warmup_ms after the router
 *    started (its workers still registering again after a restart), a named session no node
 *    reports yet waits for the nodes' heartbeats instead of starting over at once; past the
 *    warmup it starts over. A node that does not answer within the
 *    query timeout, or answers found=false, lets the turn go on unlearned (a full prefill, as
 *    before issue 18): nothing waits past the deadline.
 * Owns the parked turns (one request reference each) and the counters. Knows nothing of sockets:
 * queries leave through the caller's send function, parked turns resume through its submit
 * function. Not thread-safe: the control thread under its state lock.
 */
#ifndef TANDEM_ROUTER_RELEARN_H
#define TANDEM_ROUTER_RELEARN_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"
#include "router/dispatch.h"
#include "router/registry.h"
#include "router/request.h"
#include "router/residents.h"
#include "router/session.h"

/* Default wait for a SessionHistory, ms. */
#define ROUTER_RELEARN_QUERY_TIMEOUT_MS 2000u

/* Resume a turn (router_dispatch_submit); the callee takes its own reference. */
typedef void router_relearn_submit_fn(void *ctx, router_request_t *request, uint64_t now_ns);

/* What the relearning did since start (read under the state lock). */
typedef struct {
    uint64_t n_queries;          /* SessionQuery sent */
    uint64_t n_learned;          /* sessions installed from a SessionHistory */
    uint64_t n_not_found;        /* answers found=false (or unusable) */
    uint64_t n_timeouts;         /* queries unanswered within the timeout */
    uint64_t n_warmup_waits;     /* turns that waited for the nodes' reports after start */
    uint64_t n_replicas_applied; /* SessionReplica written into the table */
    uint64_t n_replicas_ignored; /* replicas of a busy session or another tenant */
} router_relearn_stats_t;

/* The relearning state; opaque. */
typedef struct router_relearn router_relearn_t;

/*
 * router_relearn_create - over borrowed registry, sessions and residents (outliving it); queries
 * go through send(send_ctx, node_id, env), parked turns resume through submit(submit_ctx, ...).
 * query_timeout_ms 0: ROUTER_RELEARN_QUERY_TIMEOUT_MS; warmup_ms 0: no warmup (counted from
 * this call). Returns TDM_OK, TDM_ERR_INVALID_ARG or
 * TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_relearn_create(router_registry_t *registry, router_sessions_t *sessions,
                                   router_residents_t *residents, uint32_t query_timeout_ms,
                                   uint32_t warmup_ms, router_send_fn *send, void *send_ctx,
                                   router_relearn_submit_fn *submit, void *submit_ctx,
                                   router_relearn_t **relearn_out);

/* router_relearn_destroy - resume every parked turn (submit), then free. Accepts NULL. */
void router_relearn_destroy(router_relearn_t *relearn, uint64_t now_ns);

/*
 * router_relearn_submit - a new turn. Returns 1 when it was parked behind a SessionQuery (its
 * reference taken; it resumes through submit), 0 when the caller dispatches it now (the
 * session is known and placed, unnamed, busy, or no live node reports it).
 */
int router_relearn_submit(router_relearn_t *relearn, router_request_t *request, uint64_t now_ns);

/* router_relearn_on_history - decode node `node_id` answered; resumes the turns it parked. */
void router_relearn_on_history(router_relearn_t *relearn, const char *node_id,
                               const Tandem__SessionHistory *history, uint64_t now_ns);

/* router_relearn_on_replica - a peer router's replica: written into the session table unless
 * the session is busy here or belongs to another tenant. */
void router_relearn_on_replica(router_relearn_t *relearn, const Tandem__SessionReplica *replica,
                               uint64_t now_ns);

/*
 * router_relearn_cancel - the HTTP side released `request` (its client left) while it may be
 * parked: if it is, it is dropped (never resumed) and 1 is returned; else 0.
 */
int router_relearn_cancel(router_relearn_t *relearn, router_request_t *request);

/* router_relearn_tick - ask for sessions that a node reported meanwhile (warmup); resume turns
 * whose query timed out or whose warmup ended. */
void router_relearn_tick(router_relearn_t *relearn, uint64_t now_ns);

/* router_relearn_stats - the counters. */
void router_relearn_stats(const router_relearn_t *relearn, router_relearn_stats_t *stats_out);

/*
 * router_relearn_make_replica - fill `replica` from `session` (borrowed pointers into it; valid
 * until the session changes). The decode node's id is looked up in the registry ("" when
 * unplaced or its node is gone, and cached_len 0 then).
 */
void router_relearn_make_replica(router_relearn_t *relearn, const router_session_t *session,
                                 Tandem__SessionReplica *replica);

#endif
