/* context.h - the process's one UCX context and worker for KV page transfer.
 *
 * Owns the UCP context and worker (single-threaded), this process's incarnation id, the
 * worker's wakeup fd, the table of peers and of retired peer incarnations, the registry of
 * local pools (so a notice can be checked against its pages), the queues of finished batches
 * and received notices, and the transfer metrics. Every callback (batch done, notice) runs
 * from xfer_context_progress on the caller's thread, never from inside a post. Knows nothing of
 * ZeroMQ, HTTP, sessions or page ownership: the caller decides which pages move.
 *
 * Typical loop (a ZeroMQ poller adds xfer_context_efd to its poll set):
 *
 *     for (;;) {
 *         xfer_context_progress(ctx);               // runs callbacks
 *         if (xfer_context_arm(ctx) == TDM_ERR_BUSY) {
 *             continue;                             // more work is ready
 *         }
 *         poll(... efd ..., xfer_context_max_sleep_ms(ctx));
 *     }
 */
#ifndef TANDEM_TRANSFER_CONTEXT_H
#define TANDEM_TRANSFER_CONTEXT_H

#include <stdint.h>

#include "common/status.h"
#include "transfer/lane.h"
#include "transfer/metrics.h"
#include "transfer/notice.h"

typedef struct xfer_context xfer_context_t;

/* Flags of xfer_context_params_t. */
typedef enum {
    /* Keep UCX 1.13's default v1 protocols instead of the v2 ones the context asks for. v1
     * describes no request, so batches learn their lane from the endpoint's configuration
     * (ucp_ep_print_info) and the peer's rkey instead of a probe (batch.h); the transport
     * requirement applies the same way. */
    XFER_CONTEXT_PROTO_V1 = 1u << 0,
} xfer_context_flags_t;

#define XFER_DEFAULT_KEEPALIVE_MS       1000u
#define XFER_DEFAULT_MAX_BATCHES        1024u
#define XFER_DEFAULT_CLOSE_TIMEOUT_MS   2000u
#define XFER_DEFAULT_CONNECT_TIMEOUT_MS 5000u

/* Parameters of xfer_context_create. Plain data; strings are copied. */
typedef struct {
    const char *name;       /* this worker's name, unique in the cluster ("decode-3"),
                               1..63 characters; peers key their caches by it */
    const char *transports; /* UCX transport list (UCX_TLS syntax: "shm", "tcp", "rc,cuda_ipc");
                               NULL: UCX's own choice (its environment, else all) */
    xfer_lane_mask_t required_lanes; /* --require-transport: a batch whose lane UCX chose outside
                                        this set fails with TDM_ERR_UNSUPPORTED; 0: any */
    uint32_t keepalive_interval_ms;  /* UCX keepalive round, and the period of the same-host
                                        liveness check (proc.h): a dead shm peer is noticed
                                        within about one to two intervals; 0: UCX default
                                        (20 s) */
    uint32_t max_batches;            /* batches in flight at once (posted, callback not yet run) */
    uint32_t close_timeout_ms;       /* graceful endpoint close budget in xfer_context_destroy */
    uint32_t connect_timeout_ms;     /* a new endpoint must finish UCX wireup within this, else
                                        the peer fails (TDM_ERR_PEER_LOST): a peer that dies
                                        before answering is otherwise never noticed */
    uint32_t max_run_pages;          /* pages consecutive on both sides that may go as one UCX
                                        operation; 1 (default): one operation per page, the
                                        message size ucx_perftest is compared at. Larger runs
                                        mean fewer, larger operations (puts on shm lanes stay a
                                        direct copy at any size: batch.h) */
    uint32_t flags;                  /* xfer_context_flags_t */
    xfer_notice_fn *on_notice;       /* receives notices; NULL: notices are checked, counted and
                                        dropped */
    void *on_notice_arg;
} xfer_context_params_t;

/* xfer_context_params_default - name "tandem", UCX default transports, no lane requirement,
 * keepalive 1 s, 1024 batches, close timeout 2 s, connect timeout 5 s, runs of 1 page, no
 * flags, no notice callback. */
void xfer_context_params_default(xfer_context_params_t *params);

/*
 * xfer_context_create - initialise UCP (features RMA, AM, WAKEUP) and one worker, and draw a
 * random nonzero incarnation id. UCX configuration applied on top of UCX's environment: TLS =
 * params->transports, PROTO_ENABLE=y (v2 protocols, unless XFER_CONTEXT_PROTO_V1),
 * MM_ERROR_HANDLING=y when the transports may include shm (UCX 1.13 refuses shm lanes to
 * endpoints in peer error handling mode without it), KEEPALIVE_INTERVAL.
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (name empty or too long, max_batches 0; logged),
 * TDM_ERR_NO_MEMORY, or TDM_ERR_UNSUPPORTED when UCX cannot start with these transports (UCX's
 * reason logged). *ctx_out written only on success. Create it after fork(), never before: UCX
 * state does not survive fork. Not thread-safe: one thread uses a context.
 */
tdm_status_t xfer_context_create(const xfer_context_params_t *params, xfer_context_t **ctx_out);

/*
 * xfer_context_destroy - flush every live endpoint (within close_timeout_ms), then force-close
 * all of them: batches still in flight complete with TDM_ERR_PEER_LOST (their callbacks run
 * here), peers see us go, every xfer_peer_t handle becomes invalid. Drops undelivered notices
 * and releases UCX. Destroy pools first; a pool left over is unregistered here (logged) and
 * its later xfer_pool_destroy only frees it. Accepts NULL.
 */
void xfer_context_destroy(xfer_context_t *ctx);

/* xfer_context_incarnation_id - this process's incarnation id (nonzero, random per create). */
uint64_t xfer_context_incarnation_id(const xfer_context_t *ctx);

/* xfer_context_name - the name given at create (owned by the context). */
const char *xfer_context_name(const xfer_context_t *ctx);

/*
 * xfer_context_efd - the worker's wakeup file descriptor (ucp_worker_get_efd). Readable when
 * UCX has events after a successful xfer_context_arm. Owned by the context: poll it, never read
 * or close it.
 */
int xfer_context_efd(const xfer_context_t *ctx);

/*
 * xfer_context_progress - drive UCX until it has nothing left to do now, then close failed
 * endpoints and run the callbacks of finished batches and received notices. Returns the number
 * of events handled (0: nothing happened). Callbacks may post new batches.
 */
unsigned xfer_context_progress(xfer_context_t *ctx);

/*
 * xfer_context_arm - prepare the efd for sleeping. Returns TDM_OK (safe to poll the efd) or
 * TDM_ERR_BUSY (events or callbacks are pending: call xfer_context_progress again), or
 * TDM_ERR_INTERNAL if UCX failed (logged).
 */
tdm_status_t xfer_context_arm(xfer_context_t *ctx);

/*
 * xfer_context_max_sleep_ms - the longest a caller should sleep on the efd: UCX's keepalive
 * (dead-peer detection) runs only inside progress and does not signal the efd.
 */
uint32_t xfer_context_max_sleep_ms(const xfer_context_t *ctx);

/*
 * xfer_context_wait - progress; if nothing happened, arm and poll the efd for up to timeout_ms
 * (capped at xfer_context_max_sleep_ms per sleep), then progress again. Returns TDM_OK when
 * something was handled, TDM_ERR_TIMEOUT when timeout_ms passed idle, TDM_ERR_INTERNAL or
 * TDM_ERR_IO (poll failed; logged). For callers without their own poller (tests, benchmarks).
 */
tdm_status_t xfer_context_wait(xfer_context_t *ctx, uint32_t timeout_ms);

/* xfer_context_metrics - the context's counters (owned by the context; valid until destroy;
 * xfer_metrics_render and xfer_metrics_get may be called from any thread). */
xfer_metrics_t *xfer_context_metrics(xfer_context_t *ctx);

/* xfer_context_n_peers - peer objects alive: connected (cached, even unreferenced) or still
 * referenced after failing. Tests check it returns to baseline. */
uint32_t xfer_context_n_peers(const xfer_context_t *ctx);

/* xfer_context_n_inflight - batches posted whose callback has not run yet. */
uint32_t xfer_context_n_inflight(const xfer_context_t *ctx);

#endif
