/* prefill.h - the tandem-prefill process as a library: one prefill node from its flags to its
 * Goodbye (ARCHITECTURE.md, docs/PROTOCOL.md section 7).
 *
 * Owns the node's parts and their order of start and stop: the shared worker start-up
 * (node/node_worker.h: model, transfer context, /health + /metrics, registration), then the
 * local page pool (node/node_pages.h: registered with UCX as one xfer pool, page i of the engine
 * pool is xfer page i: the same bytes on the CPU, a host staging copy with --device cuda), the
 * forward context, the history page cache (history.h; the sessions it holds go to the
 * router in every heartbeat, Load.history_sessions) and the job queue (queue.h). Its loop, on the
 * calling thread until SIGINT or SIGTERM, queues the router's PrefillJobs, applies aborts (each
 * names one attempt of one request, queue.h), starts up to --max-jobs jobs, oldest first, while the
 * page pool has room for each whole job beside the running ones' (job.h: pull, import, replay), and
 * steps them together: each step takes up to --batch-tokens delta tokens of the started jobs,
 * oldest first, in one batched engine call (an abort reaches a job at its next layer boundary and
 * stops only that job); a job whose delta is computed finishes (sample, last puts, notice) and
 * leaves. It answers every job it took exactly once: CompletionNotice, Error (ERROR_DRAINING for
 * the jobs a stop signal ends) or AbortAck (docs/PROTOCOL.md 4a). Renders the node's /health and
 * /metrics pages (the tandem_prefill_* families, then transfer/'s). Knows nothing of argv (main.c
 * parses the flags into prefill_node_params_t).
 */
#ifndef TANDEM_PREFILL_NODE_PREFILL_H
#define TANDEM_PREFILL_NODE_PREFILL_H

#include <stdint.h>

#include "node/node_worker.h"

/* What a prefill node runs with (plain data: main.c's flag table writes it; strings borrowed). */
typedef struct {
    node_worker_cfg_t worker; /* the flags both workers take */
    uint32_t pages;           /* --pages: local KV pages (a job's history plus its sequence at T) */
    uint32_t max_jobs;        /* --max-jobs: jobs started at once, batched (1: one at a time) */
    uint32_t batch_tokens;    /* --batch-tokens: delta tokens one step takes over its jobs (0:
                                 --chunk-tokens) */
    uint32_t history_cache_mb; /* --history-cache-mb: budget of the history page cache
                                  (history.h), MiB; 0 disables it */
    int state_inband;          /* --state-inband (TANDEM_STATE_INBAND): the state record and page
                                  checksums ride through the router, as before issue 18 (job.h) */
} prefill_node_params_t;

/*
 * prefill_node_run - start a prefill node, serve until node_worker_stop_signal() is nonzero
 * (a running job stops at its next phase boundary), then say Goodbye and free everything.
 *
 * params: borrowed for the call (the strings must live as long). Needs node_worker_main_start
 * first (the stop flag). Returns the process exit status: NODE_EXIT_OK after a signal,
 * NODE_EXIT_USAGE (a --http or transfer flag is invalid), NODE_EXIT_REFUSED (the router refused
 * the registration) or NODE_EXIT_FAILED (another start-up step failed); the reason is on stderr.
 */
int prefill_node_run(const prefill_node_params_t *params);

#endif
