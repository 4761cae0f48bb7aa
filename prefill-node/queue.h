/* queue.h - the prefill node's job queue: PrefillJob envelopes waiting, oldest first, and the
 * (request id, reservation id) pairs the router aborted (a queued job is dropped; a running one
 * stops at its next phase boundary). A retried turn keeps its request id but gets a new
 * reservation, so an abort of one attempt never stops the next. Owns the queued envelopes. Not thread-safe (the compute thread).
 */
#ifndef TANDEM_PREFILL_QUEUE_H
#define TANDEM_PREFILL_QUEUE_H

#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"

/* Aborted ids remembered (newest replace oldest). */
#define PREFILL_QUEUE_ABORTS 256u

typedef struct prefill_queue prefill_queue_t;

/* prefill_queue_create - an empty queue. TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t prefill_queue_create(prefill_queue_t **queue_out);

/* prefill_queue_destroy - free the queue and every queued envelope. Accepts NULL. */
void prefill_queue_destroy(prefill_queue_t *queue);

/* prefill_queue_push - take ownership of `env` (a PrefillJob). */
tdm_status_t prefill_queue_push(prefill_queue_t *queue, Tandem__Envelope *env);

/* prefill_queue_pop - the oldest job (caller frees with proto_envelope_free), or NULL. */
Tandem__Envelope *prefill_queue_pop(prefill_queue_t *queue);

/* prefill_queue_abort - drop the queued jobs of request_id whose reservation is reservation_id
 * (0: every attempt of the request) and remember the pair. Returns the number of queued jobs
 * dropped (freed). */
int prefill_queue_abort(prefill_queue_t *queue, uint64_t request_id, uint64_t reservation_id);

/* prefill_queue_is_aborted - nonzero when the job (request_id, reservation_id) was aborted: an
 * abort of the same request with the same reservation id, or with reservation id 0. */
int prefill_queue_is_aborted(const prefill_queue_t *queue, uint64_t request_id,
                             uint64_t reservation_id);

/* prefill_queue_n_jobs / n_tokens - queued jobs and their delta tokens. */
uint32_t prefill_queue_n_jobs(const prefill_queue_t *queue);
uint64_t prefill_queue_n_tokens(const prefill_queue_t *queue);

#endif
