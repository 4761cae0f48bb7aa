/* placement.h - where a new session decodes and where a prefill job runs.
 *
 * Pure policy over the registry's live workers (no state of its own): a new session goes to the
 * decode worker with the lowest score = KV occupancy + batch load (heartbeat running sequences
 * plus the router's own in-flight count, over max sequences) + a rack term that prefers racks
 * whose prefill workers are idle (their backlog in seconds, capped; a rack without prefill
 * workers pays ROUTER_PLACE_NO_PREFILL_PENALTY when another rack has some). Prefill jobs go to
 * a prefill worker in the decode worker's rack when there is one (KV puts stay on NVLink),
 * shortest queue first (queued tokens from heartbeats plus tokens the router has handed it
 * since), except that a prefill worker that keeps the session's history pages
 * (Load.history_sessions, prefill-node/history.h) wins when its backlog is at most
 * ROUTER_PLACE_HISTORY_SLACK_S above the best one's in the same rack class: it pulls only the
 * pages that changed instead of the whole history. Ties break by fewer in-flight items, then lower
 * slot, so placement is deterministic. Only what a worker declared it can do is placed on it (issue
 * 16): never a stalled or draining worker, never a sequence longer than its Capacity.max_tokens,
 * never a prefill worker that shares no transport with the decode worker its pages go to. Not
 * thread-safe: called under the router's control state lock.
 */
#ifndef TANDEM_ROUTER_PLACEMENT_H
#define TANDEM_ROUTER_PLACEMENT_H

#include <stdint.h>

#include "router/registry.h"

/* Score added to a decode worker whose rack has no prefill worker while another rack has. */
#define ROUTER_PLACE_NO_PREFILL_PENALTY 0.5
/* Weight of a rack's prefill backlog (per second) in the decode score, and its cap. */
#define ROUTER_PLACE_BACKLOG_WEIGHT_PER_S 0.05
#define ROUTER_PLACE_BACKLOG_CAP_S        10.0

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
 * router_worker_holds_session - whether prefill worker `w` said (Load.history_sessions) that it
 * keeps the history pages of the session with key `session_key` (proto_session_hash; 0: none).
 */
int router_worker_holds_session(const router_worker_t *w, uint64_t session_key);

/*
 * router_place_prefill_session - router_place_prefill for a job of the session with key
 * `session_key` (proto_session_hash of its id; 0: no preference): among the placeable workers,
 * one that holds the session (router_worker_holds_session) in the best worker's rack class with
 * a backlog at most ROUTER_PLACE_HISTORY_SLACK_S above the best's is chosen (the least loaded
 * such one); otherwise the best.
 */
int router_place_prefill_session(router_registry_t *registry, const router_worker_t *decode,
                                 uint64_t n_tokens, uint64_t session_key, uint64_t *generation_out,
                                 router_place_miss_t *miss_out);

#endif
