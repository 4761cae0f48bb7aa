/* decode.h - the tandem-decode process as a library: one decode node from its flags to its
 * Goodbye (ARCHITECTURE.md, docs/PROTOCOL.md section 7).
 *
 * Owns the node's parts and their order of start and stop: the shared worker start-up
 * (node/node_worker.h: model, transfer context, /health + /metrics, registration), then the page
 * pool (pool.h), the session tiers (tier.h), the sessions (sessions.h) and, once registered, the
 * scheduler (sched.h), whose loop runs on the calling thread until SIGINT or SIGTERM. Renders the
 * node's /health and /metrics pages (the tandem_decode_* and tandem_spec_* families, then
 * transfer/'s). Knows nothing of argv (main.c parses the flags into decode_node_params_t).
 */
#ifndef TANDEM_DECODE_NODE_DECODE_H
#define TANDEM_DECODE_NODE_DECODE_H

#include <stdint.h>

#include "node/node_worker.h"

/* What a decode node runs with (plain data: main.c's flag table writes it; strings borrowed). */
typedef struct {
    node_worker_cfg_t worker;  /* the flags both workers take */
    uint32_t pages;            /* --pages: KV pages in the pool */
    uint32_t max_sessions;     /* --max-sessions: sessions kept resident */
    uint32_t max_batch;        /* --max-batch: sequences per decode step */
    uint32_t fence_ms;         /* --fence-ms: an aborted or lapsed reservation keeps its pages */
    const char *spec;          /* --spec: off, dspark or ngram */
    const char *spec_accept;   /* --spec-accept: coupled or rejection */
    double spec_threshold;     /* --spec-confidence-threshold */
    int prefix_share;          /* --prefix-share: link another session's pages (off by default) */
    uint32_t drain_timeout_ms; /* --drain-timeout-ms: SIGTERM drains this long at most; 0: stop
                                  at once (as SIGINT does) */
    /* --step-token-budget: tokens of one scheduler step (decode rows first, then prefill
     * pieces); 0: no limit */
    uint32_t step_token_budget;
    /* --prefill-chunk-tokens: most delta tokens one local prefill advances per step; 0: no
     * limit */
    uint32_t prefill_chunk_tokens;
    uint64_t host_tier_mb;  /* --host-tier-mb: host store for demoted sessions; 0: none */
    const char *spill_dir;  /* --spill-dir: disk tier directory; NULL: none */
    uint64_t spill_max_mb;  /* --spill-max-mb: disk tier cap; 0: what the disk takes */
    uint32_t state_wait_ms; /* --state-wait-ms: a handoff waits this long for the prefill
                               node's state notice (notices.h) */
    int state_inband;       /* --state-inband: the record at H inline in the reservation
                               descriptor (for prefill nodes older than version 3) */
} decode_node_params_t;

/*
 * decode_node_run - start a decode node, serve until node_worker_stop_signal() is nonzero, then
 * abort what runs (Finish ABORTED), say Goodbye and free everything. SIGTERM (with
 * --drain-timeout-ms > 0) drains first (docs/DEPLOY.md "Draining a decode node"): the scheduler
 * admits nothing new (decode_sched_drain: ERROR_DRAINING), /health and the heartbeats say
 * draining, running turns and granted handoffs finish; the node leaves (Goodbye "drained") once
 * none is left, at the drain deadline (what still runs ends Finish ABORTED: the router retries
 * it elsewhere), or at a second SIGINT/SIGTERM. SIGINT stops at once.
 *
 * params: borrowed for the call (the strings must live as long). Needs node_worker_main_start
 * first (the stop flag). Returns the process exit status: NODE_EXIT_OK after a signal,
 * NODE_EXIT_USAGE (a --http, transfer or --spec flag is invalid, or --spec=dspark on a model
 * without DSpark blocks), NODE_EXIT_REFUSED (the router refused the registration) or
 * NODE_EXIT_FAILED (another start-up step failed); the reason is on stderr.
 */
int decode_node_run(const decode_node_params_t *params);

#endif
