/* metrics.h - the router's counters and latency histograms, rendered as Prometheus text
 * (common/prom.h).
 *
 * Owns request and error counters (errors by API error code), token counters, prefill-dispatch
 * counters (local and remote delta tokens: what a turn really prefilled), the prompt counters
 * tandem-bench reads (tokens computed, tokens reused from cached KV, KV bytes moved: counted
 * from the control messages, bench/replay/metrics.h) and the TTFT and
 * inter-token latency histograms. Gauges that describe the cluster (workers, sessions, prefill
 * backlog, KV occupancy) are passed in at render time. Thread-safe: one internal mutex; every
 * call is short.
 */
#ifndef TANDEM_ROUTER_METRICS_H
#define TANDEM_ROUTER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/registry.h"

/* One live worker's per-worker gauges (plain data), each rendered with labels worker, role and
 * rack (issue 18: the rack of every per-worker metric). */
typedef struct {
    char id[ROUTER_WORKER_ID_BYTES + 1];
    char rack[ROUTER_WORKER_ID_BYTES + 1];
    Tandem__Role role;
    int placeable;                  /* router_registry_placeable */
    uint32_t n_active;              /* requests or jobs the router has in flight on it */
    uint64_t n_assigned_tokens;     /* prefill tokens handed to it, not yet done */
    uint64_t queued_prefill_tokens; /* its last Load */
    uint32_t running_sequences;     /* its last Load */
    double kv_occupancy;            /* 1 - free / total pages, [0, 1] */
} router_worker_gauge_t;

/* Cluster gauges for router_metrics_render (plain data but for worker_rows). */
typedef struct {
    router_registry_stats_t workers;
    uint64_t n_sessions;
    uint64_t n_inflight;                /* requests being served */
    router_worker_gauge_t *worker_rows; /* [n_worker_rows], owned (router_metrics_gauges_fini);
                                           NULL: no per-worker gauges */
    size_t n_worker_rows;
    /* multi-router sessions (issue 18 item 3, router/relearn.h, router/peers.h): since start */
    uint64_t n_session_queries;        /* SessionQuery sent to decode nodes */
    uint64_t n_sessions_learned;       /* sessions installed from a SessionHistory */
    uint64_t n_session_query_timeouts; /* queries unanswered in time (turn went on unlearned) */
    uint64_t n_replicas_applied;       /* peers' SessionReplica written into the table */
    uint64_t n_replicas_sent;          /* SessionReplica sent to peers */
    uint64_t n_replica_send_failures;  /* replicas whose peer was unreachable */
    uint64_t n_resident_indexed;       /* (session, decode node) pairs the nodes' last reports
                                          list (router/residents.h): what a SessionQuery can
                                          find; a new session appears within a report cycle */
} router_metrics_gauges_t;

/*
 * router_metrics_gauges_fill_workers - one row per live worker of `registry` (borrowed; the
 * caller holds the lock that serialises it) into gauges->worker_rows. Returns TDM_OK or
 * TDM_ERR_NO_MEMORY (no rows: per-worker gauges are left out of the render).
 */
tdm_status_t router_metrics_gauges_fill_workers(router_metrics_gauges_t *gauges,
                                                router_registry_t *registry);

/* router_metrics_gauges_fini - free the rows. Accepts a zeroed struct. */
void router_metrics_gauges_fini(router_metrics_gauges_t *gauges);

/* Counters of router_metrics_count. */
typedef enum {
    ROUTER_METRIC_REQUESTS_CHAT = 0,     /* POST /v1/chat/completions accepted for validation */
    ROUTER_METRIC_REQUESTS_COMPLETIONS,  /* POST /v1/completions */
    ROUTER_METRIC_REQUESTS_RESPONSES,    /* POST /v1/responses */
    ROUTER_METRIC_PROMPT_TOKENS,         /* prompt tokens of served requests */
    ROUTER_METRIC_COMPLETION_TOKENS,     /* tokens sent to clients' usage */
    ROUTER_METRIC_PREFILL_LOCAL_TOKENS,  /* delta tokens prefilled on decode nodes */
    ROUTER_METRIC_PREFILL_REMOTE_TOKENS, /* delta tokens sent to prefill nodes */
    ROUTER_METRIC_PREFIX_HITS,           /* requests matched to a session by prefix */
    ROUTER_METRIC_RETRIES,               /* turn attempts repeated (worker lost, state lost) */
    ROUTER_METRIC_CLIENT_ABORTS,         /* clients gone before the end */
    ROUTER_METRIC_TOKENS_COMPUTED,       /* prompt tokens workers prefilled (see below) */
    ROUTER_METRIC_TOKENS_REUSED,         /* prompt tokens served from cached KV */
    ROUTER_METRIC_KV_BYTES_MOVED,        /* bytes of pages prefill nodes put into decode nodes */
    /* remote prefills that became local (issue 16), by why no prefill worker could take them */
    ROUTER_METRIC_PREFILL_FALLBACK_TRANSPORT, /* none shares a transport with the decode node */
    ROUTER_METRIC_PREFILL_FALLBACK_CAPACITY,  /* none holds the sequence (Capacity.max_tokens) */
    ROUTER_METRIC_PREFILL_FALLBACK_STALLED,   /* every one stalled or draining */
    /* bytes of the frames (identity + body) on the router's ZeroMQ control socket (issue 18
     * item 4: tandem_router_control_bytes_total{direction="in|out"}) */
    ROUTER_METRIC_CONTROL_BYTES_IN,
    ROUTER_METRIC_CONTROL_BYTES_OUT,
    /* prefill jobs placed outside the decode worker's rack (its rack saturated or without a
     * usable prefill worker): their KV crosses racks over RDMA, not NVLink (issue 18) */
    ROUTER_METRIC_PREFILL_CROSS_RACK,
    ROUTER_METRIC_COUNT
} router_metric_t;

/* The registry of counters; opaque. */
typedef struct router_metrics router_metrics_t;

/* router_metrics_create - zeroed counters. TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t router_metrics_create(router_metrics_t **metrics_out);

/* router_metrics_destroy - free. Accepts NULL. */
void router_metrics_destroy(router_metrics_t *metrics);

/* router_metrics_count - add `n` to counter `which`. */
void router_metrics_count(router_metrics_t *metrics, router_metric_t which, uint64_t n);

/*
 * router_metrics_error - count one API error with its code (e.g. "invalid_json") and status.
 * The code should be a static string; at most ROUTER_METRICS_MAX_CODES distinct codes are kept
 * (later ones count under "other").
 */
#define ROUTER_METRICS_MAX_CODES 48
void router_metrics_error(router_metrics_t *metrics, const char *code, int http_status);

/* router_metrics_ttft - observe one time to first token, seconds. */
void router_metrics_ttft(router_metrics_t *metrics, double seconds);

/* router_metrics_itl - observe one inter-token latency, seconds. */
void router_metrics_itl(router_metrics_t *metrics, double seconds);

/*
 * The prompt counters tandem-bench reads (bench/replay/metrics.h), counted from the control
 * messages themselves, so that they say what the workers did, not what the router asked:
 *   tandem_prefill_tokens_computed_total: total_len - cached_len of every CompletionNotice (a
 *       prefill job finished, whether or not its handoff is then used), plus the local delta of
 *       every PREFILL_LOCAL DecodeRequest whose first token arrived (the decode node prefilled
 *       it); a job on a worker that died, or a request refused with STATE_LOST, adds nothing;
 *   tandem_prefill_tokens_reused_total: cached_len of every DecodeRequest whose first token
 *       arrived (prompt tokens served from KV the decode node already held or shared);
 *   tandem_kv_bytes_moved_total: pages of every CompletionNotice (one checksum per page put
 *       into the decode node's reservation, or its n_pages when the checksums went to the
 *       decode node directly: state_direct) x page_bytes.
 * A turn served without waste adds its prompt length to computed + reused exactly.
 */

/*
 * router_metrics_decode_request - note a DecodeRequest the router has sent to a decode node:
 * its cached_len and (PREFILL_LOCAL) its delta are counted when its first token arrives
 * (router_metrics_worker_message). Remembered per request id in a table of
 * ROUTER_METRICS_PENDING slots (a newer request in the same slot replaces an older one that never
 * got a token). Thread-safe.
 */
#define ROUTER_METRICS_PENDING 4096
void router_metrics_decode_request(router_metrics_t *metrics, const Tandem__DecodeRequest *dr);

/*
 * router_metrics_worker_message - count what a message from a registered worker says: a
 * CompletionNotice (computed delta, page_bytes x pages moved), the first TokenChunk of a noted
 * DecodeRequest (its reused and local computed tokens), a Finish or Error (the noted request is
 * forgotten uncounted if no token came). Other messages are ignored. page_bytes: bytes of one KV
 * page (router_model_info()->page_bytes, MODEL.md 7). Thread-safe.
 */
void router_metrics_worker_message(router_metrics_t *metrics, const Tandem__Envelope *env,
                                   uint32_t page_bytes);

/* router_metrics_get - the current value of counter `which` (tests, /health). */
uint64_t router_metrics_get(router_metrics_t *metrics, router_metric_t which);

/*
 * router_metrics_render - the Prometheus text exposition (version 0.0.4) of every counter,
 * histogram and the gauges. *text_out: NUL-terminated, caller frees with free(). Returns TDM_OK
 * or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_metrics_render(router_metrics_t *metrics, const router_metrics_gauges_t *gauges,
                                   char **text_out, size_t *n_bytes_out);

#endif
