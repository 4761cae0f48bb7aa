/* dispatch_abort.c - the dispatcher's aborts and writer fences (docs/PROTOCOL.md 4, 4a):
 * every abort names one attempt; a reservation a writer holds is released only once that writer
 * answered (fence.h) or left. Split from dispatch.c; shares its types through dispatch_impl.h.
 */
#include "router/dispatch_impl.h"

#include "common/log.h"

/* Abort of (request_id, attempt) and/or reservation_id; writer_fenced: no put into the
 * reservation can land any more (docs/PROTOCOL.md 4). */
void dispatch_send_abort(router_dispatch_t *d, int slot, uint64_t gen, uint64_t request_id,
                         uint64_t reservation_id, uint32_t attempt, int writer_fenced,
                         const char *reason)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Abort abort_msg = TANDEM__ABORT__INIT;

    if (router_registry_worker(d->registry, slot, gen) == NULL) {
        return;
    }
    abort_msg.request_id = request_id;
    abort_msg.reservation_id = reservation_id;
    abort_msg.reason = (char *)reason;
    abort_msg.attempt = attempt;
    abort_msg.writer_fenced = writer_fenced != 0;
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT;
    env.abort = &abort_msg;
    dispatch_send_to(d, slot, gen, &env);
}

/* The writer of an aborted job answered (request_id, attempt) from `slot`: when the router was
 * waiting for that word (fence.h), tell the decode node its reservation is fenced. Returns 1
 * when the answer was such a word (the caller drops it: it is stale). */
int dispatch_writer_answered(router_dispatch_t *d, int slot, uint64_t request_id, uint32_t attempt,
                             const char *what)
{
    router_fence_t fe;

    if (attempt == 0 || !router_fences_take(d->fences, slot, request_id, attempt, &fe)) {
        return 0;
    }
    tdm_log(TDM_LOG_DEBUG, "dispatch",
            "writer fenced: request=%llu attempt=%u reservation=%llu answer=%s",
            (unsigned long long)request_id, attempt, (unsigned long long)fe.reservation_id, what);
    dispatch_send_abort(d, fe.decode_slot, fe.decode_gen, fe.request_id, fe.reservation_id,
                        fe.attempt, 1, "writer fenced");
    return 1;
}

/*
 * Tell the workers of f's current stage to stop. A prefill job still running is aborted by its
 * attempt (a retry has another number, so it is never cancelled by this) and its reservation
 * waits for the writer's answer (fence.h); writer_done: the writer has answered already (its
 * Error or notice is in hand). A reservation no writer was given (still reserving, or after the
 * handoff) is released at once.
 */
void dispatch_abort_workers(router_dispatch_t *d, inflight_t *f, const char *reason,
                            int writer_done)
{
    uint32_t attempt = f->attempts + 1;

    if (f->stage == STAGE_PREFILLING && !writer_done &&
        router_registry_worker(d->registry, f->prefill_slot, f->prefill_gen) != NULL) {
        router_fence_t fe = {f->id,          f->prefill_attempt, f->reservation_id, f->prefill_slot,
                             f->prefill_gen, f->decode_slot,     f->decode_gen};
        dispatch_send_abort(d, f->prefill_slot, f->prefill_gen, f->id, f->reservation_id,
                            f->prefill_attempt, 0, reason);
        if (router_fences_add(d->fences, &fe)) {
            tdm_log(TDM_LOG_WARN, "dispatch", "fence table full: oldest left to the timer");
        }
        dispatch_send_abort(d, f->decode_slot, f->decode_gen, f->id, f->reservation_id, attempt, 0,
                            reason);
    } else {
        /* reserving: the router has not seen the reservation, no writer has it; decoding or an
         * answered writer: nothing can write any more. Lost writer (no prefill worker): timer. */
        int fenced = f->stage == STAGE_RESERVING ||
                     (f->reservation_id != 0 && (f->stage == STAGE_DECODING || writer_done));
        dispatch_send_abort(d, f->decode_slot, f->decode_gen, f->id, f->reservation_id, attempt,
                            fenced, reason);
    }
    f->reservation_id = 0;
}

/* Worker `slot` is going: the fences it is part of end. A writer that said Goodbye has answered
 * and flushed every job (its reservations are fenced); one lost without a word, or a reservation
 * owner that is gone, leaves them to the timer (or to nobody). */
void dispatch_release_fences_of(router_dispatch_t *d, int slot, router_registry_removal_t removal)
{
    router_fence_t fe;

    while (router_fences_take_slot(d->fences, slot, &fe)) {
        if (fe.prefill_slot == slot && removal == ROUTER_REGISTRY_LEFT) {
            dispatch_send_abort(d, fe.decode_slot, fe.decode_gen, fe.request_id, fe.reservation_id,
                                fe.attempt, 1, "writer left");
        } else if (fe.prefill_slot == slot) {
            tdm_log(TDM_LOG_INFO, "dispatch",
                    "writer lost before answering an abort: request=%llu attempt=%u "
                    "reservation=%llu (pages wait for the decode node's timer fence)",
                    (unsigned long long)fe.request_id, fe.attempt,
                    (unsigned long long)fe.reservation_id);
        }
    }
}
