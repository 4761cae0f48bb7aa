/* queue.h - the prefill node's job queue: PrefillJob envelopes waiting, oldest first, and the
 * request ids the router aborted (a queued job is dropped; a running one stops at its next
 * phase boundary). Owns the queued envelopes. Not thread-safe (the compute thread).
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

/* prefill_queue_abort - drop a queued job of request_id (freed) and remember the id. Returns 1
 * when a queued job was dropped. */
int prefill_queue_abort(prefill_queue_t *queue, uint64_t request_id);

/* prefill_queue_is_aborted - nonzero when request_id was aborted. */
int prefill_queue_is_aborted(const prefill_queue_t *queue, uint64_t request_id);

/* prefill_queue_n_jobs / n_tokens - queued jobs and their delta tokens. */
uint32_t prefill_queue_n_jobs(const prefill_queue_t *queue);
uint64_t prefill_queue_n_tokens(const prefill_queue_t *queue);

#endif
