/* dispatch_impl.h - what router/dispatch.c, dispatch_abort.c and dispatch_session.c share: the
 * turn table's types and the helpers the three files call across. Private to the dispatcher (no
 * other module includes it); the public contract is router/dispatch.h. Same threading rule: the
 * control thread, under its state lock.
 */
#ifndef TANDEM_ROUTER_DISPATCH_IMPL_H
#define TANDEM_ROUTER_DISPATCH_IMPL_H

#include <stdint.h>

#include "proto/proto.h"
#include "router/dispatch.h"
#include "router/fence.h"

#define INFLIGHT_BUCKETS 1024u

_Static_assert(ROUTER_MAX_CHOICES <= PROTO_MAX_CHOICES,
               "a request's choices must fit the protocol");

typedef enum {
    STAGE_RESERVING = 0,  /* ReservePages sent to the decode worker */
    STAGE_PREFILLING = 1, /* PrefillJob sent to a prefill worker */
    STAGE_DECODING = 2,   /* DecodeRequest sent; tokens stream */
} stage_t;

/* One turn in flight. */
typedef struct inflight {
    router_request_t *req; /* one reference, owned */
    uint64_t id;
    router_session_t *session; /* kept alive by session->active_request == id */
    stage_t stage;
    int decode_slot; /* counted in that worker's n_active; -1 none */
    uint64_t decode_gen;
    int prefill_slot; /* counted in n_active / n_assigned_tokens; -1 none */
    uint64_t prefill_gen;
    uint64_t prefill_tokens; /* tokens assigned to the prefill worker */
    uint64_t reservation_id;
    size_t cached_len;                            /* H of this attempt */
    size_t total_len;                             /* T of this attempt */
    uint32_t n_generated;                         /* tokens of choice 0 posted to the request */
    uint32_t n_fork_generated[PROTO_MAX_CHOICES]; /* choices 1.. (n > 1): tokens posted */
    uint32_t attempts;        /* tries ended; the running one is number attempts + 1 */
    uint32_t prefill_attempt; /* PrefillJob.attempt of the job sent in this try; 0 none */
    uint64_t deadline_ns;     /* stage deadline (RESERVING, PREFILLING) */
    uint64_t t_last_token_ns;
    char prefix_session[ROUTER_SESSION_ID_BYTES + 1];
    struct inflight *next;
} inflight_t;

/* Workers whose send failed, queued between two dispatch entry points; more in one burst are
 * found lost by their heartbeat timeout instead. */
#define DISPATCH_MAX_LOST 1024

struct router_dispatch {
    router_dispatch_params_t params;
    const router_model_t *model;
    const router_model_info_t *info;
    router_registry_t *registry;
    router_sessions_t *sessions;
    router_metrics_t *metrics;
    router_send_fn *send;
    void *send_ctx;
    inflight_t *buckets[INFLIGHT_BUCKETS];
    router_fences_t *fences; /* aborted jobs whose writer has not answered (fence.h) */
    uint64_t n_inflight;
    int lost[DISPATCH_MAX_LOST]; /* slots whose send failed, for drain_lost */
    int n_lost;
    int draining;
    uint64_t session_counter;
    uint64_t session_salt;
};

/* ---- dispatch.c ---- */

/* dispatch_find - the turn in flight with request id `id`, or NULL. */
inflight_t *dispatch_find(router_dispatch_t *d, uint64_t id);

/* dispatch_send_to - send env to worker (slot, gen). TDM_ERR_PEER_LOST when that incarnation is
 * gone (the slot is then queued for dispatch's worker-lost handling); env is borrowed. */
tdm_status_t dispatch_send_to(router_dispatch_t *d, int slot, uint64_t gen,
                              const Tandem__Envelope *env);

/* dispatch_fail - end f with an OpenAI-shaped error (http_status, type, code, printf message):
 * aborts its workers, posts the error to the request, frees f. */
void dispatch_fail(router_dispatch_t *d, inflight_t *f, int http_status, const char *type,
                   const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* ---- dispatch_abort.c: aborts and writer fences (docs/PROTOCOL.md 4, 4a) ---- */

/* dispatch_send_abort - Abort{request_id, reservation_id, attempt, writer_fenced} to worker
 * (slot, gen); nothing when that incarnation is gone. reason is borrowed. */
void dispatch_send_abort(router_dispatch_t *d, int slot, uint64_t gen, uint64_t request_id,
                         uint64_t reservation_id, uint32_t attempt, int writer_fenced,
                         const char *reason);

/* dispatch_writer_answered - the writer on `slot` answered (request_id, attempt) (what: the
 * answer's name, for the log). When the router was waiting for that answer (fence.h) the decode
 * node is told its reservation is fenced and 1 is returned: the caller drops the answer as
 * stale. 0 otherwise. */
int dispatch_writer_answered(router_dispatch_t *d, int slot, uint64_t request_id, uint32_t attempt,
                             const char *what);

/* dispatch_abort_workers - tell the workers of f's current stage to stop (a running prefill job
 * by its attempt, its reservation fenced once the writer answers); writer_done: the writer has
 * answered already. Clears f->reservation_id. */
void dispatch_abort_workers(router_dispatch_t *d, inflight_t *f, const char *reason,
                            int writer_done);

/* dispatch_release_fences_of - worker `slot` is going: end the fences it is part of (a writer
 * that left with a Goodbye fences its reservations; a lost one leaves them to the timer). */
void dispatch_release_fences_of(router_dispatch_t *d, int slot, router_registry_removal_t removal);

/* ---- dispatch_session.c ---- */

/* dispatch_resolve_session - find or make f's session (named, or new with an optional same-tenant
 * prefix share: "share pages, not sessions", docs/PROTOCOL.md 6). On failure f has been failed
 * (and freed) and the status is returned. */
tdm_status_t dispatch_resolve_session(router_dispatch_t *d, inflight_t *f, uint64_t now_ns);

#endif
