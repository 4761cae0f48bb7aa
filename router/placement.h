/* placement.h - where a new session decodes and where a prefill job runs.
 *
 * Pure policy over the registry's live workers (no state of its own): a new session goes to the
 * decode worker with the lowest score = KV occupancy + batch load (heartbeat running sequences
 * plus the router's own in-flight count, over max sequences) + a rack term that prefers racks
 * whose prefill workers are idle (their backlog in seconds, capped; a rack without prefill
 * workers pays ROUTER_PLACE_NO_PREFILL_PENALTY when another rack has some). Prefill jobs go to
 * a prefill worker in the decode worker's rack when there is one (KV puts stay on NVLink),
 * shortest queue first (queued tokens from heartbeats plus tokens the router has handed it
 * since). Ties break by fewer in-flight items, then lower slot, so placement is deterministic.
 * A draining worker (router_worker_t.draining) gets nothing new.
 * Not thread-safe: called under the router's control state lock.
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

/*
 * router_place_decode - the slot of the best live decode worker (its generation in
 * *generation_out), or -1 when there is none.
 */
int router_place_decode(router_registry_t *registry, uint64_t *generation_out);

/*
 * router_place_prefill - the slot of the best live prefill worker for a decode worker in
 * `rack` (may be NULL), its generation in *generation_out; -1 when there is none.
 */
int router_place_prefill(router_registry_t *registry, const char *rack, uint64_t *generation_out);

#endif
