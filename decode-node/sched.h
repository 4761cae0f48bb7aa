/* sched.h - the decode node's turns: local prefill, handoff adoption, continuous batching.
 *
 * Owns the requests in flight and the forward context. Handles the router's DecodeRequest
 * (PREFILL_LOCAL: prefill the delta here, with the canonical start of MODEL.md 6(d)(1) when asked;
 * PREFILL_REMOTE: check the pages a prefill node put into a reservation against the notice's
 * checksums, adopt them with the state record, emit the notice's first token), ReservePages
 * (reserve pages, describe them with the session's pages and state at H) and Abort. Each step
 * advances the pending local prefills by pieces under a token budget (rewinds and canonical-start
 * replays are pieces too; decode rows count first, sched_prefill_step), then runs one
 * engine_fwd_decode over every running sequence, samples each (MODEL.md 8, position = sequence
 * position) and streams the tokens as TokenChunks,
 * then Finish. With a drafter (--spec, or the request's spec field on such a node) the decode
 * step is one engine_spec_step instead: each sequence drafts (DSpark, or n-gram lookup over the
 * turn's local delta or else the last W + N - 1 committed ids, plus the tokens generated since;
 * a remotely prefilled prompt is not on this node), the target verifies every
 * sequence's drafts in one pass, and each accepted token is streamed in order. Borrows the
 * model, pool and sessions; its messages and load go out through a decode_sched_out_t (the
 * node's link in tandem-decode, a recorder in tests), so it runs in-process without sockets.
 * Single-threaded (the compute thread); decode_sched_stats may be called from any thread.
 */
#ifndef TANDEM_DECODE_SCHED_H
#define TANDEM_DECODE_SCHED_H

#include <stdint.h>

#include "common/status.h"
#include "decode-node/notices.h"
#include "decode-node/pool.h"
#include "decode-node/sessions.h"
#include "decode-node/tier.h"
#include "engine/model.h"
#include "engine/spec.h"
#include "node/node_link.h"
#include "proto/proto.h"

/* How the scheduler runs (from the decode node's flags; plain data, copied at create). */
typedef struct {
    uint32_t fence_ms;     /* pages of an aborted or lapsed reservation wait this long */
    uint32_t max_batch;    /* sequences per decode step (<= ENGINE_FWD_MAX_BATCH) */
    uint32_t chunk_tokens; /* prefill chunk (engine max_chunk_tokens) */
    int n_threads;         /* kernel threads */
    /* The token budget of one step (issue 17, like vLLM's max_num_batched_tokens): the decode
     * rows of the running batch count first, local prefill pieces fill the rest (docs/
     * ARCHITECTURE.md "The decode node's step"). 0: no limit (every pending prefill runs whole
     * in the next step). */
    uint32_t step_token_budget;
    /* Most delta tokens one request advances per step (0: no limit). */
    uint32_t prefill_chunk_tokens;
    /* Speculative decoding (MODEL.md 8). spec_drafter is the node's default drafter (--spec);
     * ENGINE_SPEC_OFF makes no speculative context, and every request then decodes plainly
     * whatever its DecodeRequest.spec says (the output is the same either way). spec holds the
     * acceptance rule and threshold; the scheduler sets its max_batch to max_batch. */
    engine_spec_drafter_t spec_drafter;
    engine_spec_params_t spec;
    /* Constrained decoding: the vocabulary's byte tries (borrowed; must outlive the scheduler),
     * or NULL: a DecodeRequest with a response_format or tool_calls constraint is then refused
     * (ERROR_BAD_MESSAGE). */
    const engine_constrain_vocab_t *constrain_vocab;
    /* Session tiers (tier.h; borrowed, must outlive the scheduler), or NULL: under page pressure
     * an idle session's state is dropped (the router rebuilds it) instead of demoted. */
    decode_tier_t *tier;
    /* --prefix-share: a new session may link another session's pages (prefix_session_id); 0 (the
     * default): it is answered as without it, ERROR_STATE_LOST, and the router sends the whole
     * prompt, so a request's text never depends on what else is cached (docs/PROTOCOL.md 6) */
    int prefix_share;
    /* The state notices prefill nodes send here directly (notices.h; borrowed, must outlive the
     * scheduler; the transfer context's notice callback fills it), or NULL: a handoff whose
     * CompletionNotice says state_direct is then refused (ERROR_STATE_LOST). */
    decode_notices_t *notices;
    /* --state-inband (TANDEM_STATE_INBAND): the state record at H rides inline in the
     * reservation descriptor the router relays (version 2), as before issue 18; 0: it is staged
     * in pages of the reservation that the prefill node gets (version 3, node_handoff.h). */
    int state_inband;
} decode_sched_params_t;

/* Counters and gauges for /metrics and heartbeats (plain data snapshot). */
typedef struct {
    uint64_t requests_total;
    uint64_t generated_tokens_total;
    uint64_t local_prefill_tokens_total;
    uint64_t handoffs_total;
    uint64_t handoff_failures_total;
    uint64_t reservations_total;
    uint64_t reservations_lapsed_total;
    uint64_t aborts_total;
    uint64_t state_lost_total;
    uint64_t rewinds_total;            /* sessions cut back to a shorter prefix and replayed */
    uint64_t rewind_kept_tokens_total; /* positions those rewinds kept (not prefilled again) */
    uint64_t evictions_total;
    uint64_t prefill_pieces_total; /* local prefill parts and replays run between decode steps */
    uint64_t prefix_shares_total;  /* new sessions started from another's pages */
    uint64_t prefix_shared_tokens_total; /* prompt positions those shares did not prefill */
    uint64_t greedy_steps_total;         /* decode steps whose tokens alone left the backend (every
                                            sequence greedy, no logprobs, no constraint, no stop mask:
                                            engine_fwd_decode_greedy) */
    uint32_t running_sequences;
    uint32_t pending_prefills;
    uint64_t queued_prefill_tokens; /* delta tokens of pending local prefills not yet prefilled */
    uint32_t free_pages;
    uint32_t total_pages;
    uint32_t reserved_pages;
    uint32_t resident_sessions;
    uint32_t session_pages;    /* pages held by resident sessions (a shared page once per holder) */
    uint32_t shared_pages;     /* pages linked by two or more sequences (engine_kv_pool_n_shared) */
    uint64_t staged_pages_total; /* pages copied from the engine (a device) into their host
                                    staging copies (node_pages_n_downloaded; 0 on the CPU) */
    uint64_t shared_page_refs; /* links beyond a page's first (engine_kv_pool_n_extra_refs):
                                  session_pages - shared_page_refs = distinct session pages */
    double recent_tokens_per_s;
    engine_spec_metrics_t spec[ENGINE_SPEC_N_DRAFTERS]; /* per drafter; zero without --spec */
    decode_tier_stats_t tier;                           /* session tiers; zero without them */
    decode_notices_stats_t notices; /* direct state notices; zero without them */
} decode_stats_t;

/* Where the scheduler's messages to the router and its load report go (plain data, copied at
 * create). Both are called on the scheduler's thread with borrowed arguments that live only for
 * the call: copy what is kept. tandem-decode passes its link (decode_sched_out_link). */
typedef struct {
    void (*send)(void *arg, const Tandem__Envelope *env); /* a message for the router */
    void (*set_load)(void *arg, const node_load_t *load); /* the load heartbeats carry */
    void *arg;                                            /* passed to both */
} decode_sched_out_t;

/* decode_sched_out_link - a decode_sched_out_t that sends with node_link_send and publishes with
 * node_link_set_load on `link` (borrowed; must outlive the scheduler). */
void decode_sched_out_link(node_link_t *link, decode_sched_out_t *out);

typedef struct decode_sched decode_sched_t;

/* decode_sched_create - borrows the model, pool and sessions (they must outlive the scheduler);
 * copies *out. Returns TDM_OK, TDM_ERR_INVALID_ARG (out has no send or set_load), TDM_ERR_NO_MEMORY
 * or the engine's status. */
tdm_status_t decode_sched_create(const decode_sched_params_t *params, const engine_model_t *model,
                                 decode_pool_t *pool, decode_sessions_t *sessions,
                                 const decode_sched_out_t *out, decode_sched_t **sched_out);

/* decode_sched_destroy - abort what runs (Finish ABORTED) and free. Accepts NULL. */
void decode_sched_destroy(decode_sched_t *sched);

/* decode_sched_on_message - handle one message from the router (borrowed). */
void decode_sched_on_message(decode_sched_t *sched, const Tandem__Envelope *env);

/*
 * decode_sched_step - expire reservations, advance the pending prefills by the step's pieces
 * (sched_prefill_step) and run one decode step. Returns
 * the longest the caller may wait for messages before calling again, ms (0: work is ready).
 */
uint32_t decode_sched_step(decode_sched_t *sched);

/*
 * decode_sched_join_notices - the handoffs that waited for their state notice (params.notices):
 * each whose notice has arrived is adopted now; each that waited past the notices' wait_ms fails
 * alone (Error ERROR_STATE_LOST naming the missing notice, with the length the session still
 * holds) and its reservation's pages go back at once (the writer answered the router, so no put
 * of it is in flight). decode_sched_step calls it; the node also calls it right after the
 * transfer context progressed, so an arrived notice does not wait for the next step.
 */
void decode_sched_join_notices(decode_sched_t *sched);

/*
 * decode_sched_drain - stop admitting (SIGTERM, docs/DEPLOY.md "Draining a decode node"): from now
 * on every ReservePages and every DecodeRequest that does not complete a reservation granted
 * before is answered Error{ERROR_DRAINING}; running turns, pending local prefills and reserved
 * handoffs go on. Aborts are handled as ever. Idempotent; compute thread only.
 */
void decode_sched_drain(decode_sched_t *sched);

/*
 * decode_sched_router_changed - the control link registered again (the router restarted, or it
 * declared this node lost): every reservation made for the old registration lapses now (fenced,
 * then freed after --fence-ms; its session is idle again) instead of holding pages and its
 * session busy until ReservePages.timeout_ms (610 s by default). Compute thread only.
 */
void decode_sched_router_changed(decode_sched_t *sched);

/*
 * decode_sched_abort_where - end every running or pending request whose id pick(arg, id) selects
 * as if its router had sent Abort{request_id} (Finish ABORTED; its active reservations fenced):
 * the turns of one router of several that is gone (restarted, or unreachable past its heartbeat
 * timeout: node_link.h), which nobody reads any more, so that they do not keep their sessions
 * busy for the router that takes the sessions over (issue 18 item 3). Returns how many requests
 * ended. Compute thread only.
 */
uint32_t decode_sched_abort_where(decode_sched_t *sched, int (*pick)(void *arg, uint64_t id),
                                  void *arg);

/* decode_sched_idle - 1 when no request runs or waits and no reservation holds pages (a drain is
 * done), else 0. Compute thread only. */
int decode_sched_idle(const decode_sched_t *sched);

/* decode_sched_stats - a consistent snapshot of the counters (thread-safe). Published at the end
 * of every step and before every Finish, so it counts each turn whose Finish has gone out. */
void decode_sched_stats(decode_sched_t *sched, decode_stats_t *stats_out);

#endif
