/* queue.h - the prefill node's job queue: PrefillJob envelopes waiting, oldest first, and the
 * jobs the router aborted (docs/PROTOCOL.md 4a). An abort names one job: (request id, attempt),
 * the router's number of the turn's try (PrefillJob.attempt, Abort.attempt). A retried turn
 * keeps its request id but gets a new attempt number (and a new reservation), so an abort of
 * one attempt never stops another, earlier or later. From a PROTO_VERSION 2 router (attempt 0)
 * an abort names the job of its reservation id, or (reservation 0) the request's jobs that are
 * queued or running when it arrives; such an abort is never remembered for later jobs.
 * Owns the queued envelopes. Not thread-safe (the compute thread).
 */
#ifndef TANDEM_PREFILL_QUEUE_H
#define TANDEM_PREFILL_QUEUE_H

#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"

/* Aborted (request id, attempt) pairs remembered (newest replace oldest). */
#define PREFILL_QUEUE_ABORTS 256u

/* What one Abort names (plain data; mirrors tandem.Abort's job keys). */
typedef struct {
    uint64_t request_id;
    uint64_t reservation_id; /* 0: not given */
    uint32_t attempt;        /* 0: not given (PROTO_VERSION 2 router) */
} prefill_abort_t;

/* Called for each queued job an abort drops, before its envelope is freed (the caller answers
 * it: AbortAck). `job` is borrowed for the call. */
typedef void prefill_queue_dropped_fn(void *arg, const Tandem__PrefillJob *job);

typedef struct prefill_queue prefill_queue_t;

/* prefill_queue_create - an empty queue. TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t prefill_queue_create(prefill_queue_t **queue_out);

/* prefill_queue_destroy - free the queue and every queued envelope. Accepts NULL. */
void prefill_queue_destroy(prefill_queue_t *queue);

/* prefill_queue_push - take ownership of `env` (a PrefillJob) with the lease epoch it arrived in
 * (node_link_recv_epoch; kept with it, unread here). TDM_OK or TDM_ERR_NO_MEMORY (then the caller
 * still owns env). */
tdm_status_t prefill_queue_push(prefill_queue_t *queue, Tandem__Envelope *env, uint64_t epoch);

/* prefill_queue_pop - the oldest job (caller frees with proto_envelope_free) and its epoch into
 * *epoch_out (may be NULL), or NULL. */
Tandem__Envelope *prefill_queue_pop(prefill_queue_t *queue, uint64_t *epoch_out);

/* prefill_queue_peek - the oldest job, still the queue's (valid until the next pop, abort or
 * destroy), or NULL. */
const Tandem__Envelope *prefill_queue_peek(const prefill_queue_t *queue);

/* prefill_abort_names - nonzero when `abort` names `job` (the rules at the top). */
int prefill_abort_names(const prefill_abort_t *abort, const Tandem__PrefillJob *job);

/*
 * prefill_queue_abort - drop the queued jobs `abort` names, calling dropped(arg, job) for each
 * (may be NULL), and remember the abort when it names one attempt or one reservation (a job
 * pushed later with that key is still aborted: prefill_queue_is_aborted). Returns the number of
 * jobs dropped (freed).
 */
int prefill_queue_abort(prefill_queue_t *queue, const prefill_abort_t *abort,
                        prefill_queue_dropped_fn *dropped, void *arg);

/* prefill_queue_is_aborted - nonzero when a remembered abort names `job` (same request and
 * attempt, or same request and reservation). An abort without attempt and reservation is never
 * remembered, so it never covers a retry. */
int prefill_queue_is_aborted(const prefill_queue_t *queue, const Tandem__PrefillJob *job);

/* prefill_queue_n_jobs / n_tokens - queued jobs and their delta tokens. */
uint32_t prefill_queue_n_jobs(const prefill_queue_t *queue);
uint64_t prefill_queue_n_tokens(const prefill_queue_t *queue);

#endif
