/* node_worker.h - the start-up and shutdown both worker executables share (tandem-decode and
 * tandem-prefill), written once: the flags they share and their one --help table, SIGINT and
 * SIGTERM, the model load and KV page geometry, the KV-transfer context, the /health + /metrics
 * endpoint and the registration with the router.
 *
 * Owns, between node_worker_open and node_worker_close: the engine model, the transfer context,
 * the HTTP endpoint and the control link (the node_worker_t fields below), plus the process's
 * stop flag, which the signal handler sets. The worker makes its own parts (the decode node's
 * pool, sessions and scheduler; the prefill node's pools, queue and forward context) between
 * node_worker_load and node_worker_join, and frees them between node_worker_leave and
 * node_worker_close. The steps print their failures on stderr prefixed with the program name and
 * return the process exit status (node_exit_t). Knows nothing of decoding, prefilling or what the
 * worker reports on its pages. Runs on the worker's main thread.
 */
#ifndef TANDEM_NODE_WORKER_H
#define TANDEM_NODE_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "common/flags.h"
#include "common/prom.h"
#include "engine/constrain.h"
#include "engine/model.h"
#include "node/node_http.h"
#include "node/node_link.h"
#include "node/node_progress.h"
#include "node/node_xfer.h"
#include "transfer/context.h"

/* A worker's exit status: what each step below returns, and what main() returns. */
typedef enum {
    NODE_EXIT_OK = 0,      /* served until SIGINT/SIGTERM (or --help was printed) */
    NODE_EXIT_FAILED = 1,  /* a start-up step failed (model, transfer, HTTP, link) */
    NODE_EXIT_USAGE = 2,   /* a flag is invalid; nothing was started */
    NODE_EXIT_REFUSED = 3, /* the router refused the registration (tools/tandem reads this) */
} node_exit_t;

/* Longest HOST of --http, bytes with the NUL. */
#define NODE_WORKER_HOST_BYTES 256u

/* Most flags a worker adds to the shared ones (node_worker_main_start). */
#define NODE_WORKER_MAX_OWN_FLAGS 24u

/* The flags both workers take (plain data; strings point into argv, the environment or the flag
 * table, and live as long as the process). A worker's config struct holds one as a member. */
typedef struct {
    const char *model_dir;         /* --model: the checkpoint directory */
    const char *router;            /* --router: the router's ZeroMQ control endpoint, or a comma
                                      list of every router of the fleet (node_link.h) */
    const char *http;              /* --http: HOST:PORT of /health and /metrics (port 0: any) */
    const char *rack;              /* --rack: NVLink domain id, sent at registration */
    uint32_t threads;              /* --threads: kernel threads (0: every online CPU) */
    const char *device;            /* --device: cpu, cuda or cuda:N (kernels/device.h) */
    int map_weights;               /* --map-weights: engine_model_params_t.map_weights */
    uint32_t chunk_tokens;         /* --chunk-tokens: most tokens one prefill layer pass takes */
    uint32_t register_timeout_ms;  /* --register-timeout-ms: wait for the RegisterAck */
    const char *transports;        /* --transports: UCX_TLS syntax, NULL: UCX's choice */
    const char *ucx_protocols;     /* --ucx-protocols: v1 or v2 */
    const char *require_transport; /* --require-transport: lane classes, NULL: any */
    uint32_t http_timeout_s;       /* --http-timeout-s: idle timeout of /health, /metrics */
    const char *curve_key;         /* --curve-key: this worker's CurveZMQ key file, or NULL */
    const char *curve_router_key;  /* --curve-router-key: the router's public key file */
    uint32_t stall_timeout_ms;     /* --stall-timeout-ms: pending work and no compute step for
                                      this long is a stall (/health 503, Load.stalled); 0: off */
    const char *log_level;         /* --log-level */
} node_worker_cfg_t;

/* What one worker executable parses (the shared flags come from this module). */
typedef struct {
    const char *program;      /* "tandem-decode": --help's usage line and every error prefix */
    const char *summary;      /* --help's paragraph */
    const tdm_flag_t *flags;  /* the worker's own flags; offsets into the worker's config struct */
    size_t n_flags;           /* at most NODE_WORKER_MAX_OWN_FLAGS */
    size_t worker_cfg_offset; /* offsetof(the worker's config struct, its node_worker_cfg_t) */
} node_worker_main_t;

/*
 * node_worker_main_start - main()'s first step: one flag table (the shared flags, the worker's
 * own, then --log-level), parsed from argv, TANDEM_* variables and defaults into `cfg`; --help
 * printed from it; the log level set; then SIGINT and SIGTERM set the stop flag
 * (node_worker_stop_signal) and SIGPIPE is ignored.
 *
 * spec: borrowed for the call. cfg: the worker's zeroed config struct.
 * action_out: TDM_FLAGS_RUN (go on) or TDM_FLAGS_HELP (help printed: exit 0).
 * Returns NODE_EXIT_OK, NODE_EXIT_USAGE (a bad flag, named on stderr; or more than
 * NODE_WORKER_MAX_OWN_FLAGS own flags) or NODE_EXIT_FAILED (signals could not be installed).
 * Call before any thread starts.
 */
int node_worker_main_start(const node_worker_main_t *spec, int argc, char **argv, void *cfg,
                           tdm_flags_action_t *action_out);

/* node_worker_stop_signal - the SIGINT or SIGTERM received since node_worker_main_start, or 0
 * while the worker should keep serving. Any thread. */
int node_worker_stop_signal(void);

/* node_worker_signal_count - SIGINT/SIGTERM received so far, capped at 2 (a draining worker
 * stops at once on the second). Any thread. */
int node_worker_signal_count(void);

/* A worker's shared start-up state. Fields are read-only for the worker; the model, xfer, http
 * and link are owned here (set by the steps below, NULL before). */
typedef struct {
    const node_worker_cfg_t *cfg;      /* borrowed: must outlive the worker */
    const char *program;               /* borrowed: the stderr prefix, e.g. "tandem-decode" */
    const char *role;                  /* borrowed: "decode" or "prefill" (id prefix, log module) */
    Tandem__Role proto_role;           /* what the link registers as */
    char id[NODE_ID_BYTES + 1];        /* this incarnation's id (node_link_make_id) */
    char host[NODE_WORKER_HOST_BYTES]; /* --http's HOST */
    uint16_t port;                     /* --http's PORT (0: any) */
    char node[PROTO_MAX_ID_BYTES + 1]; /* the host name (Register.node), printable */
    char endpoint[NODE_WORKER_HOST_BYTES + 8]; /* HOST:bound-port, once serving */
    int n_threads;                             /* kernel threads (--threads, or online CPUs) */
    const kern_ops_t *ops; /* node_worker_open: --device's kernel table (kernels/device.h) */
    xfer_context_params_t xfer_params;         /* from the transfer flags */
    node_xfer_transports_t transports; /* lane classes declared at registration (node_xfer.h) */
    engine_model_t *model;             /* node_worker_load */
    const engine_config_t *config;     /* the model's (borrowed from it) */
    uint32_t page_bytes;               /* one KV page (kern_kv_geometry of the model) */
    uint32_t tokens_per_block;         /* kern_kv_geometry: KERN_KV_PAGE_ROWS times the largest KV
                                          source ratio, the router's block hash granularity */
    uint64_t weights_digest; /* node_worker_load: tdm_weights_digest of --model (cached) */
    char kv_layout[ENGINE_CONFIG_KV_LAYOUT_BYTES]; /* engine_config_kv_layout of the model */
    xfer_context_t *xfer;                          /* node_worker_load */
    engine_constrain_vocab_t *constrain_vocab;     /* node_worker_load: the byte tries of the
                                                      model's tokenizer.json for constrained
                                                      decoding; NULL when the checkpoint has none */
    node_http_t *http;                             /* node_worker_join */
    node_link_t *link;                             /* node_worker_join */
    node_progress_t progress; /* node_worker_open: the compute thread's progress (the worker
                                 calls node_progress_step); read by the link's heartbeats and
                                 by /health */
} node_worker_t;

/*
 * node_worker_open - check the flags that need no model (--http's HOST:PORT and the transfer
 * flags, so a typo fails in milliseconds, before a model load of minutes on a real fleet), open
 * --device (its kernel table in w->ops; a CUDA device becomes this thread's current one, and a
 * device that does not exist or a build without CUDA exits 2 naming it), count the kernel
 * threads and make the incarnation id "ROLE-HOST-PID-RANDOM".
 *
 * w: zeroed here, then filled. cfg, program and role: borrowed until node_worker_close.
 * Returns NODE_EXIT_OK or NODE_EXIT_USAGE (the reason on stderr).
 */
int node_worker_open(node_worker_t *w, const node_worker_cfg_t *cfg, const char *program,
                     const char *role, Tandem__Role proto_role);

/*
 * node_worker_load - load the model (--model, with n_threads), derive its page geometry
 * (kern_kv_geometry: page_bytes, tokens_per_block) and KV layout name, compute the weights digest
 * (tdm_weights_digest: every tensor byte once, read from the cache beside the checkpoint when
 * its shards are unchanged; progress logged for big checkpoints) and create the KV-transfer
 * context named after the id. Returns NODE_EXIT_OK or NODE_EXIT_FAILED (the reason on stderr; what
 * was made stays for node_worker_close).
 */
int node_worker_load(node_worker_t *w);

/* What a worker serves and tells the router at registration beyond the shared fields (plain
 * data; the descriptor bytes are borrowed for the call). */
typedef struct {
    node_http_render_fn *render; /* the worker's /health and /metrics pages (with render_arg),
                                    called on the HTTP thread; borrowed until node_worker_leave */
    void *render_arg;
    const uint8_t *transfer_descriptor; /* the page pool's xfer descriptor, or NULL */
    size_t n_transfer_descriptor;
    uint32_t total_pages;
    uint32_t max_sequences;
    uint32_t kv_pages; /* KV pages one sequence may use, which bounds Capacity.max_tokens
                          (engine_config_max_tokens_in_pages); 0: total_pages */
} node_worker_join_t;

/*
 * node_worker_join - go live: start /health and /metrics on --http (w->endpoint becomes
 * HOST:bound-port), then register with the router (node_link_create: --router, --rack, the id,
 * the model fingerprint engine_model_fingerprint and the weights digest that the router checks
 * (docs/PROTOCOL.md), the KV layout, the transports (node_xfer_transports of the transfer flags),
 * the HTTP endpoint, page geometry, max_position_embeddings, Capacity.max_tokens (the longest
 * sequence join->kv_pages hold, at most max_position_embeddings; 0 pages: not declared),
 * --chunk-tokens as the batch token limit, --register-timeout-ms) and start the link thread. Call
 * after node_worker_load and once the worker's own parts exist (the pages may be asked for at
 * once). Returns NODE_EXIT_OK, NODE_EXIT_REFUSED (the router refused: its reason logged and on
 * stderr) or NODE_EXIT_FAILED (cannot bind, or the link failed: on stderr).
 */
int node_worker_join(node_worker_t *w, const node_worker_join_t *join);

/* Adds the worker's own /metrics families to `p` (tdm_prom_counter, tdm_prom_gauge, ...). arg: the
 * worker's, borrowed for the call. Called on the HTTP thread. */
typedef void node_worker_families_fn(void *arg, tdm_prom_t *p);

/*
 * node_worker_render - one page of a worker's endpoint; the worker's node_http_render_fn calls it
 * with what it read under its own lock.
 *
 * NODE_HTTP_METRICS: the worker's families (families(arg, p)), its progress
 * (tandem_worker_compute_steps_total, _pending_work, _seconds_since_compute_step, _stalled,
 * _draining: node_progress.h), then transfer/'s
 * (xfer_metrics_render_to, once w->xfer exists), as Prometheus text.
 * NODE_HTTP_HEALTH: {"status":S,"role":ROLE,"id":ID,"steps_completed":N,"pending_work":N,
 * FIELDS}, one line, where health_fields is the worker's own JSON members without braces (e.g.
 * "\"queued_jobs\":0") and S is "ok" (200), "starting" (not ready: 503), "stalled" (w->progress
 * says work is pending and no compute step completed for --stall-timeout-ms: 503, with a
 * "reason" member saying so) or "draining" (SIGTERM seen, finishing its work: 200, so that a
 * liveness probe lets the drain finish; the router learns it from the heartbeats).
 * *body_out: malloc'ed NUL-terminated text (the daemon frees it), or NULL with 500.
 * Returns the HTTP status: 200, 503 (health while not ready or stalled) or 500 (out of memory).
 */
int node_worker_render(const node_worker_t *w, node_http_page_t page, int ready,
                       const char *health_fields, node_worker_families_fn *families, void *arg,
                       char **body_out);

/* node_worker_stop_http - stop /health and /metrics (waits for a running render). Idempotent. */
void node_worker_stop_http(node_worker_t *w);

/* node_worker_leave - node_worker_stop_http, then say Goodbye{reason} (NULL: none) and close the
 * link. Idempotent. The worker frees what uses the model or the transfer context after this. */
void node_worker_leave(node_worker_t *w, const char *reason);

/* node_worker_close - free the transfer context, the constraint vocabulary and the model.
 * Accepts a zeroed worker. */
void node_worker_close(node_worker_t *w);

#endif
