/* batch.h - non-blocking batches of page puts and gets to one peer, with completion callbacks.
 *
 * A batch moves n pages between local pool slots and the peer's pool slots, one UCX operation
 * per page, or per run of pages consecutive on both sides up to the context's max_run_pages. The
 * lane: under the v2 protocols the first batch of each op to a peer also posts its first page
 * once more as a probe that UCX must describe (ucp_request_query), which names the protocol and
 * transport UCX chose for that endpoint; under v1 (XFER_CONTEXT_PROTO_V1), which describes no
 * request, it is read from the endpoint's configuration (ucp_ep_print_info) and the peer's rkey
 * (xfer_lane_parse_ep_info). Either way it is cached for the endpoint's life (UCX fixes its
 * choice per endpoint and size), recorded in every batch's result and checked against the
 * context's transport requirement before anything else is posted. A put batch flushes the endpoint,
 * so its completion means the bytes are in the peer's memory; with XFER_BATCH_NOTICE it then sends
 * the completion notice (notice.h) and completes when the notice has been handed to UCX. Owns
 * nothing past the callback; the caller keeps the pages unchanged until then.
 */
#ifndef TANDEM_TRANSFER_BATCH_H
#define TANDEM_TRANSFER_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "transfer/lane.h"
#include "transfer/metrics.h"
#include "transfer/peer.h"
#include "transfer/pool.h"

/* Flags of xfer_batch_params_t. */
typedef enum {
    XFER_BATCH_NOTICE = 1u << 0, /* put only: send a completion notice once the pages landed */
} xfer_batch_flags_t;

/* What a finished batch reports. Plain data, valid during the callback. */
typedef struct {
    tdm_status_t status; /* TDM_OK, or:
                            TDM_ERR_PEER_LOST    the peer failed or was retired meanwhile
                            TDM_ERR_UNSUPPORTED  UCX chose a lane outside the requirement (only
                                                 the one-page probe was moved)
                            TDM_ERR_IO           UCX reported another transport error (logged) */
    xfer_op_t op;
    uint64_t job_id;
    uint32_t n_pages;
    uint64_t n_bytes;    /* pages * page size (also on failure: what was asked) */
    uint64_t latency_ns; /* post to completion (before the callback) */
    xfer_lane_t lane;    /* the lane UCX used (XFER_LANE_UNKNOWN if the batch failed first) */
} xfer_batch_result_t;

/* Called once per posted batch, from xfer_context_progress (or xfer_context_destroy). */
typedef void xfer_batch_done_fn(void *arg, const xfer_batch_result_t *result);

/* Parameters of xfer_batch_post. Plain data; arrays borrowed during the call only. */
typedef struct {
    xfer_op_t op;
    uint32_t flags;               /* xfer_batch_flags_t */
    uint64_t job_id;              /* echoed in the result and the notice */
    xfer_pool_t *local_pool;      /* same page size as the peer's pool */
    const uint32_t *local_pages;  /* [n_pages] slots in local_pool (put: sources; get: targets) */
    const uint32_t *remote_pages; /* [n_pages] slots in the peer's pool */
    uint32_t n_pages;             /* 1..XFER_NOTICE_MAX_PAGES; 0 only with XFER_BATCH_NOTICE
                                     (a notice that carries just a payload) */
    const uint64_t *checksums;    /* notice: [n_pages] XXH3-64 of each local page, or NULL to
                                     have them computed here from the local pages */
    const void *payload;          /* notice payload, copied at post; may be NULL when 0 bytes */
    size_t payload_bytes;         /* <= XFER_NOTICE_MAX_PAYLOAD_BYTES */
    xfer_batch_done_fn *done;     /* required */
    void *done_arg;
} xfer_batch_params_t;

/*
 * xfer_batch_post - start a batch. Returns TDM_IN_PROGRESS when posted: `done` runs exactly
 * once, later, from xfer_context_progress. Otherwise nothing was posted, `done` never runs, and
 * the return says why:
 *   TDM_ERR_INVALID_ARG  bad op, flags, counts, NULL arrays or callback, a page index outside
 *                        either pool, a notice on a get, or a local pool of another context
 *   TDM_ERR_MISMATCH     local and remote page sizes differ
 *   TDM_ERR_PEER_LOST    the peer's incarnation failed or was retired (refused)
 *   TDM_ERR_UNSUPPORTED  the peer already used a lane outside the transport requirement
 *   TDM_ERR_BUSY         max_batches are in flight; progress and retry
 *   TDM_ERR_NO_MEMORY
 * Not thread-safe (the context's thread). Notice checksums of device pools are computed
 * through a host staging copy of each page.
 */
tdm_status_t xfer_batch_post(xfer_peer_t *peer, const xfer_batch_params_t *params);

#endif
