/* sched_impl.h - the decode scheduler's state and the helpers its two files share (private to
 * decode-node/sched.c, which steps the batch, and decode-node/sched_handoff.c, which takes a
 * remote prefill's pages: reservations, the CompletionNotice's import, aborts and lapses).
 *
 * Everything here runs on the scheduler's thread (the decode node's main thread, sched.h); only
 * `shared` is read by other threads, under stats_lock.
 */
#ifndef TANDEM_DECODE_NODE_SCHED_IMPL_H
#define TANDEM_DECODE_NODE_SCHED_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "common/arena.h"
#include "decode-node/sched.h"
#include "engine/constrain.h"
#include "engine/forward.h"
#include "engine/sampler.h"
#include "engine/spec.h"

typedef enum {
    REQ_PREFILL = 0, /* local delta waiting for its pieces (sched_prefill.c) */
    REQ_RUNNING = 1, /* in the decode batch */
} req_phase_t;

/*
 * The choices of one request with SamplingParams.n_choices > 1 (sched_fork.c): they share the
 * request id; one Finish goes out when the last ends (choice 0's reason and cached_len, the
 * summed n_generated), none after an Error was sent for the request.
 */
typedef struct req_group {
    uint32_t n_live;             /* choices not yet ended */
    uint64_t n_generated;        /* summed over the ended choices */
    Tandem__FinishReason reason; /* choice 0's, once it ended */
    uint64_t cached_len;         /* choice 0's session length when it ended */
    uint64_t n_prefilled;
    int failed; /* an Error was sent for the request: no Finish */
} req_group_t;

typedef struct req {
    uint64_t id;
    decode_session_t *session;
    engine_sampler_params_t sp;
    uint32_t max_tokens;
    uint32_t n_generated;
    int32_t last_token; /* sampled and sent, not yet fed */
    req_phase_t phase;
    int32_t *delta;
    int64_t n_delta;
    int canonical; /* a canonical-start replay (MODEL.md 6(d)(1)) is still to run */
    uint64_t n_prefilled;
    /* A local prefill in pieces (sched_prefill.c): first the rewind, then the canonical replay,
     * then the delta in parts of at most prefill_chunk_tokens, under the step's token budget. */
    int64_t rewind_to;     /* > 0: cut the session back to this length and replay (a piece) */
    int rewind_lost;       /* after the rewind: Error STATE_LOST(rewind_to), the turn ends */
    int64_t prefill_start; /* H of the delta's prefill (the length when its first part ran) */
    int64_t n_done;        /* delta tokens prefilled so far (the cursor) */
    int mid_prefill;       /* the sequence is part way through this turn's prefill (or its
                              canonical replay): a turn that ends now drops the session's state */
    engine_spec_drafter_t drafter; /* OFF when the node has no speculative context */
    int32_t *history;              /* n-gram only: make_history's ids, then every emitted id */
    int64_t n_history;
    uint32_t min_tokens;   /* stop ids are masked while n_generated < min_tokens */
    uint32_t n_choices;    /* SamplingParams.n_choices (>= 1) */
    uint32_t choice;       /* 0: the session's own; > 0: a fork on `own` */
    req_group_t *group;    /* NULL for one choice */
    decode_session_t *own; /* forks: a private session (not in the table) holding the copy */
    engine_constraint_t *constraint; /* response_format's, advanced by every emitted token; NULL:
                                        unconstrained */
    struct req *next;
} req_t;

struct decode_sched {
    decode_sched_params_t params;
    const engine_model_t *model;
    const engine_config_t *cfg;
    decode_pool_t *pool;
    decode_sessions_t *sessions;
    decode_sched_out_t out; /* the router's messages and the load report */
    engine_fwd_t *fwd;
    engine_spec_t *spec;                /* NULL with --spec off */
    engine_spec_result_t *spec_results; /* [max_batch] */
    float *logits;                      /* [max_batch, V] */
    int32_t *ids;                       /* replay ids, W + N - 1 */
    int64_t n_ids_cap;
    tdm_arena_t arena;
    req_t *reqs;
    uint64_t rate_t0_ns;
    uint64_t rate_tokens;
    decode_stats_t stats; /* the compute thread's counters */
    pthread_mutex_t stats_lock;
    decode_stats_t shared; /* the last published copy, guarded by stats_lock */
    int draining;          /* decode_sched_drain: new work is answered ERROR_DRAINING */
};

/* ---- shared by sched.c and sched_handoff.c (defined in sched.c) ---------------------- */

/* An Error for request_id to the router (with the session's cached_len). */
void sched_send_error(decode_sched_t *s, uint64_t request_id, Tandem__ErrorCode code,
                      uint64_t cached_len, const char *message);

/* The running or pending request with this id, or NULL. */
req_t *sched_find_req(decode_sched_t *s, uint64_t id);

/* After an operation that returned `status`: 1 when it ran out of pages and an idle session was
 * evicted (run it again; counted), else 0. */
int sched_evicted_for_retry(decode_sched_t *s, tdm_status_t status);

/* End r's turn with `reason`: r leaves the batch, the counters are published, then the Finish. */
void sched_finish_req(decode_sched_t *s, req_t *r, Tandem__FinishReason reason);

/* Send a freshly chosen token of r at `position` (ends the turn when it should: returns 1, r
 * freed). sample may be NULL. */
int sched_emit_one(decode_sched_t *s, req_t *r, uint64_t position, int32_t token,
                   const engine_sample_t *sample, float logprob);

/* A new request of the batch for dr on session (NULL after an Error was sent). */
req_t *sched_new_req(decode_sched_t *s, const Tandem__DecodeRequest *dr, decode_session_t *session);

/* Cut the session's sequence back to p and replay its recorded ids (MODEL.md 6(d)(2)). */
tdm_status_t sched_rewind_session(decode_sched_t *s, decode_session_t *session, int64_t p);

/* The prefix the session can keep for a turn that shares `want` tokens with it. */
int64_t sched_rewind_target(const decode_session_t *session, int64_t want);

/* Fail r: one Error for the request, r leaves (its session's state dropped unless the status
 * is TDM_ERR_NO_PAGES and the sequence is whole). */
void sched_fail_req(decode_sched_t *s, req_t *r, tdm_status_t status);

/* Forget r without a Finish (after an Error was sent for it); its session becomes idle. */
void sched_end_req(decode_sched_t *s, req_t *r);

/* The n-gram drafter's history of r (before r first decodes). */
tdm_status_t sched_make_history(decode_sched_t *s, req_t *r);

/* Put the compute thread's counters where /metrics and the link's load report read them. */
void sched_publish(decode_sched_t *s);

/* Set r->sp.suppress_stop for the token r chooses next (min_tokens). */
void sched_note_min_tokens(req_t *r);

/* ---- defined in sched_fork.c ------------------------------------------------------------- */

/*
 * sched_start_choices - r's first token (at position T = its sequence length: `token`, `sample`
 * (may be NULL) and `logprob`) and, when r->n_choices > 1, its sibling choices: each copies r's
 * sequence at T (engine_seq_export with pages, engine_seq_import: KV pages copied, nothing
 * recomputed), samples its first token with proto_choice_seed from `logits` (the prefill's last
 * row, local prefill) or takes it from h->choice_first (remote prefill, h non-NULL), joins the
 * batch, and is emitted after r. Out of pages or memory for a copy: an Error for the request and
 * every choice ends (nothing emitted).
 */
void sched_start_choices(decode_sched_t *s, req_t *r, int32_t token, const engine_sample_t *sample,
                         float logprob, const float *logits, const Tandem__CompletionNotice *h);

/* sched_group_end - r (a grouped choice) ended with `reason`; 1 when it was the group's last
 * (the caller then sends the group's Finish with sched_group_finish), else 0. */
int sched_group_end(req_t *r, Tandem__FinishReason reason, uint64_t cached_len);

/* sched_free_fork - destroy a fork's private session (its sequence's pages go back). */
void sched_free_fork(req_t *r);

/* ---- defined in sched_prefill.c ---------------------------------------------------------- */

/* Most prompt tokens the oldest pending prefill advances by in a step whose decode rows leave
 * less of the budget (a prompt is never starved by a full batch). */
#define SCHED_MIN_PIECE_TOKENS 16

/*
 * sched_prefill_step - advance the pending local prefills (REQ_PREFILL, oldest first) by pieces
 * under the step's token budget, params.step_token_budget less decode_rows (the rows the step's
 * decode runs; 0 budget: no limit): a rewind (truncate + recovery replay) or a canonical-start
 * replay is one piece of W' = min(W, length) tokens; a part of the delta is at most
 * params.prefill_chunk_tokens tokens; the parts of one step run in one engine_fwd_prefill_parts
 * call. The first piece of a step runs even when the decode rows leave less than it (a part then
 * of at most SCHED_MIN_PIECE_TOKENS). A request whose last part ran samples its first token
 * (sched_start_choices) and joins the batch. Out of pages: evict an idle session and retry, else
 * the request fails (Error NO_PAGES; a half-prefilled sequence is dropped).
 */
void sched_prefill_step(decode_sched_t *s, int64_t decode_rows);

/* sched_prefill_abandon - r ends before its prefill is whole: drop its session's state when the
 * turn changed the sequence (mid_prefill), so no half-prefilled sequence stays resident. */
void sched_prefill_abandon(req_t *r);

/* ---- defined in sched_tier.c ------------------------------------------------------------- */

/*
 * sched_tier_evict - free pages for a retry: the idle session with the highest eviction score
 * goes down to the tiers (params.tier), or is dropped when none is configured or none takes it
 * (logged). Returns 1 when a session left the pool, 0 when no idle session holds pages.
 */
int sched_tier_evict(decode_sched_t *s);

/*
 * sched_tier_on_turn - a turn of `session` starts (a local DecodeRequest, or ReservePages for a
 * remote prefill), after its busy check: count it for the eviction score and, when its state was
 * demoted, promote it back into the pool (sequence and recorded ids). A state that cannot come
 * back (gone, damaged, refused by the import, no pages) is dropped with a log line: the turn then
 * finds nothing held and the router rebuilds it from history (ERROR_STATE_LOST).
 */
void sched_tier_on_turn(decode_sched_t *s, decode_session_t *session);

/* ---- defined in sched_prefix.c ----------------------------------------------------------- */

/*
 * sched_prefix_share - start the new session `session` (no state, or length 0) from the first
 * cached_len tokens of the resident session `prefix_session_id` (issue 17 item 2): when the node
 * allows it (--prefix-share), the donor is resident, of the same tenant (a hook), holds at
 * least cached_len tokens whose recorded ids equal prefix_ids [n_prefix_ids = cached_len], and
 * cached_len is a whole-page prefix (64 * max ratio) of at least W tokens, the session links the
 * donor's pages below cached_len (engine_seq_share_prefix: shared, copy-on-write), is replayed
 * (MODEL.md 6(d)(2) recovery) and records the ids; the caller then continues it at cached_len
 * like any held session. Counted in prefix_shares_total and prefix_shared_tokens_total.
 * Returns TDM_OK, TDM_ERR_UNSUPPORTED (not such a request, or refused: logged, nothing changed)
 * or the engine's status (the session's state is dropped). Either way on failure the caller
 * answers as without sharing (ERROR_STATE_LOST / a reservation from 0).
 */
tdm_status_t sched_prefix_share(decode_sched_t *s, decode_session_t *session,
                                const char *prefix_session_id, uint64_t cached_len,
                                const int32_t *prefix_ids, size_t n_prefix_ids);

/*
 * sched_prefix_hold - before a handoff drops the session's old sequence: each of the first
 * n_sources KV sources gets in held[i] (initialised here) one more reference to the session's
 * leading history pages below first_target[i] that other sessions share too, so that they
 * survive the import. sched_prefix_relink then makes the imported sequence `seq` link them
 * instead of its private copies (equal bytes only; seq NULL: just let go) and releases held[].
 * Counted in the shared-pages gauge; a failure only leaves the copies private.
 */
void sched_prefix_hold(decode_sched_t *s, const decode_session_t *session, uint32_t n_sources,
                       const uint32_t *first_target, engine_kv_table_t *held);
void sched_prefix_relink(decode_sched_t *s, engine_seq_t *seq, engine_kv_table_t *held);

/* ---- defined in sched_handoff.c ---------------------------------------------------------- */

/* A DecodeRequest with remote prefill: adopt the reservation's pages (its CompletionNotice). */
void sched_on_remote(decode_sched_t *s, const Tandem__DecodeRequest *dr);

/* ReservePages: reserve pages for a remote prefill, answer with the PageReservation. */
void sched_on_reserve(decode_sched_t *s, const Tandem__ReservePages *rp);

/* decode_pool_expire's callback: a reservation lapsed without its handoff. arg: the sched. */
void sched_on_lapse(void *arg, decode_resv_t *resv);

/* Abort of a request and/or reservation: a reservation named by id (or, with id 0, the request's
 * active ones) is released at once when the Abort says its writer is fenced, else fenced by the
 * timer (fence_ms) until the router forwards the writer's acknowledgement (docs/PROTOCOL.md 4). */
void sched_on_abort(decode_sched_t *s, const Tandem__Abort *a);

#endif
