/* fence.h - the writer fences the router still owes decode nodes (docs/PROTOCOL.md 4).
 *
 * A decode node keeps the pages of an aborted reservation until no put of its writer can land.
 * When the router aborts a prefill job that holds a reservation, it tells the decode node to wait
 * (Abort.writer_fenced false) and remembers the abort here: the job's (request id, attempt), its
 * prefill worker, the reservation and its decode worker. Once the prefill worker answers that
 * attempt (AbortAck, Error or CompletionNotice: each is sent only when the job has nothing in
 * flight) or leaves with a Goodbye, the entry is taken and the router forwards
 * Abort{reservation_id, writer_fenced=true}, so the pages come back at once. A worker lost
 * without a word leaves its entries to the decode node's timer fence (the last resort).
 *
 * Owns a fixed table (ROUTER_FENCES entries; when full the oldest is dropped, its pages then wait
 * for the timer). Knows nothing of sockets or the registry's state. Not thread-safe (the control
 * thread, under its state lock).
 */
#ifndef TANDEM_ROUTER_FENCE_H
#define TANDEM_ROUTER_FENCE_H

#include <stdint.h>

#include "common/status.h"

/* Entries kept at most. */
#define ROUTER_FENCES 1024u

/* One abort awaiting its writer's answer (plain data). */
typedef struct {
    uint64_t request_id;
    uint32_t attempt; /* PrefillJob.attempt of the aborted job (>= 1) */
    uint64_t reservation_id;
    int prefill_slot; /* the writer */
    uint64_t prefill_gen;
    int decode_slot; /* the reservation's owner */
    uint64_t decode_gen;
} router_fence_t;

typedef struct router_fences router_fences_t;

/* router_fences_create - an empty table. TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t router_fences_create(router_fences_t **fences_out);

/* router_fences_destroy - free the table. Accepts NULL. */
void router_fences_destroy(router_fences_t *fences);

/* router_fences_add - remember `fence` (copied). Returns 1 when the table was full and its oldest
 * entry was dropped to make room, else 0. */
int router_fences_add(router_fences_t *fences, const router_fence_t *fence);

/* router_fences_take - remove the entry of (request_id, attempt) whose writer is prefill_slot
 * into *fence_out; returns 1, or 0 when there is none (nothing changed). */
int router_fences_take(router_fences_t *fences, int prefill_slot, uint64_t request_id,
                       uint32_t attempt, router_fence_t *fence_out);

/* router_fences_take_slot - remove one entry whose writer (prefill_slot) or reservation owner
 * (decode_slot) is `slot` into *fence_out; returns 1, or 0 when there is none. */
int router_fences_take_slot(router_fences_t *fences, int slot, router_fence_t *fence_out);

/* router_fences_n - entries held. */
uint32_t router_fences_n(const router_fences_t *fences);

#endif
