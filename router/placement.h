/* placement.h - where a new session decodes and where a prefill job runs.
 *
 * Pure policy over the registry's placement indexes (registry.h; no state of its own), O(log N)
 * per decision (issue 18). A new session goes to the decode worker with the lowest score = KV
 * occupancy + batch load (heartbeat running sequences plus the router's own in-flight count, over
 * max sequences) + a rack term that prefers racks whose prefill workers are idle (the rack's
 * prefill backlog in seconds x ROUTER_PLACE_BACKLOG_WEIGHT_PER_S, capped; a rack without prefill
 * workers pays ROUTER_PLACE_NO_PREFILL_PENALTY when another rack has some); scores are fixed
 * point (ROUTER_SCORE_ONE), ties break by fewer in-flight items, then lower slot. Prefill jobs
 * stay in the decode worker's rack (NVLink domain: KV puts stay on NVLink) unless that rack is
 * saturated (its prefill backlog, queued + assigned tokens over the sum of its workers' measured
 * rates, exceeds ROUTER_PLACE_RACK_SATURATED_S) or has no usable prefill worker; then they go to
 * the least loaded rack (by that backlog), an RDMA transfer (the caller counts it). Inside the
 * rack: the shortest backlog first (ties: lower slot), except that a worker that keeps the
 * session's history pages (Load.history_sessions, prefill-node/history.h) wins when its backlog
 * is at most ROUTER_PLACE_HISTORY_SLACK_S above the best one's: it pulls only the pages that
 * changed instead of the whole history. Only what a worker declared it can do is placed on it
 * (issue 16): never a stalled or draining worker, never a sequence longer than its
 * Capacity.max_tokens, never a prefill worker that shares no transport with the decode worker its
 * pages go to. Not thread-safe: called under the router's control state lock.
 */
#ifndef TANDEM_ROUTER_PLACEMENT_H
#define TANDEM_ROUTER_PLACEMENT_H

#include <stdint.h>

#include "router/registry.h"

/* ROUTER_PLACE_NO_PREFILL_PENALTY, ROUTER_PLACE_BACKLOG_WEIGHT_PER_S and _CAP_S: registry.h
 * (the placement indexes key on them). */

/* A rack is saturated when its prefill backlog (queued + assigned tokens of its placeable prefill
 * workers) would take more than this many seconds at the rack's measured rate (the sum of their
 * rates): its jobs then go to the least loaded rack, an RDMA (cross-rack) transfer. */
#define ROUTER_PLACE_RACK_SATURATED_S 2.0

/* Extra prefill backlog (seconds) a worker that keeps the session's history pages may have over
 * the least loaded one and still get the job. */
#define ROUTER_PLACE_HISTORY_SLACK_S 1.0

/* Why no worker was found (router_place_*'s *miss_out): the first reason that ruled out a live
 * worker of the role, in this order of precedence (capacity beats transport beats stalled). */
typedef enum {
    ROUTER_PLACE_MISS_NONE = 0,      /* no live worker of the role at all */
    ROUTER_PLACE_MISS_STALLED = 1,   /* every one stalled or draining */
    ROUTER_PLACE_MISS_TRANSPORT = 2, /* prefill: none shares a transport with the decode worker */
    ROUTER_PLACE_MISS_CAPACITY = 3,  /* none declared it can hold n_tokens */
} router_place_miss_t;

/* router_place_miss_name - one line for logs, e.g. "no prefill worker shares a transport with
 * the decode worker". Static. */
const char *router_place_miss_name(router_place_miss_t miss);

/*
 * router_worker_holds - whether `w` declared it can hold a sequence of n_tokens tokens
 * (Capacity.max_tokens; a worker that declared 0 holds anything its max_context allows).
 */
int router_worker_holds(const router_worker_t *w, uint64_t n_tokens);

/*
 * router_place_decode - the slot of the best placeable decode worker that holds n_tokens (its
 * generation in *generation_out), or -1 when there is none; then *miss_out (may be NULL) says
 * why and *largest_out (may be NULL) gets the largest max_tokens a placeable decode worker
 * declared (0 when none declared a limit).
 */
int router_place_decode(router_registry_t *registry, uint64_t n_tokens, uint64_t *generation_out,
                        router_place_miss_t *miss_out, uint64_t *largest_out);

/*
 * router_place_prefill - the slot of the best placeable prefill worker for decode worker
 * `decode` (borrowed; its rack is preferred, and the prefill worker must share one of its
 * transports) that holds n_tokens (history + delta), its generation in *generation_out; -1 when
 * there is none, and then *miss_out (may be NULL) says why.
 */
int router_place_prefill(router_registry_t *registry, const router_worker_t *decode,
                         uint64_t n_tokens, uint64_t *generation_out,
                         router_place_miss_t *miss_out);

/*
 * router_place_rack_saturated - whether `rack`'s prefill backlog exceeds
 * ROUTER_PLACE_RACK_SATURATED_S (its jobs then spill to the least loaded rack).
 */
int router_place_rack_saturated(const router_registry_t *registry, const router_rack_t *rack);

/*
 * router_worker_holds_session - whether prefill worker `w` said (Load.history_sessions) that it
 * keeps the history pages of the session with key `session_key` (proto_session_hash; 0: none).
 */
int router_worker_holds_session(const router_worker_t *w, uint64_t session_key);

/*
 * router_place_prefill_session - router_place_prefill for a job of the session with key
 * `session_key` (proto_session_hash of its id; 0: no preference): in the chosen rack, the least
 * loaded worker that holds the session (router_worker_holds_session) with a backlog at most
 * ROUTER_PLACE_HISTORY_SLACK_S above the best's is chosen; otherwise the best.
 */
int router_place_prefill_session(router_registry_t *registry, const router_worker_t *decode,
                                 uint64_t n_tokens, uint64_t session_key, uint64_t *generation_out,
                                 router_place_miss_t *miss_out);

#endif
