/* metrics.h - transfer/'s counters and latency histograms, rendered as Prometheus text
 * (common/prom.h).
 *
 * Owns per-operation counters (batches, pages, bytes, failures), notice counters (sent,
 * received, checksum mismatches, malformed), peer failures, batches per lane class, and
 * histograms of batch latency (post to completion) per operation. One instance per transfer
 * context. Thread-safe: one internal mutex, so a /metrics thread may render while the transfer
 * thread counts; every call is short. Knows nothing of UCX.
 */
#ifndef TANDEM_TRANSFER_METRICS_H
#define TANDEM_TRANSFER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/prom.h"
#include "common/status.h"
#include "transfer/lane.h"

/* The two data operations. */
typedef enum {
    XFER_OP_PUT = 0, /* local pages -> remote page slots */
    XFER_OP_GET = 1, /* remote pages -> local page slots */
    XFER_OP_N = 2,
} xfer_op_t;

/* Latency histogram bucket upper bounds, seconds (Prometheus `le`), +Inf implied. */
#define XFER_METRICS_N_BUCKETS 16

/* Snapshot of every counter (tests, /health, benchmarks). Plain data. */
typedef struct {
    uint64_t n_batches[XFER_OP_N];                /* batches completed, any status */
    uint64_t n_batches_failed[XFER_OP_N];         /* batches completed with an error */
    uint64_t n_pages[XFER_OP_N];                  /* pages moved by successful batches */
    uint64_t n_bytes[XFER_OP_N];                  /* bytes moved by successful batches */
    uint64_t n_lane_batches[XFER_LANE_N_CLASSES]; /* batches by the lane UCX used */
    uint64_t n_lane_refusals;                     /* batches refused by the transport requirement */
    uint64_t n_notices_sent;
    uint64_t n_notices_received;       /* well-formed notices delivered */
    uint64_t n_notice_mismatches;      /* delivered notices whose page checksums disagreed */
    uint64_t n_notices_malformed;      /* dropped: bad magic, version, length or checksum */
    uint64_t n_peer_failures;          /* peers (remote pools) lost */
    uint64_t n_peers_refused;          /* connects or batches refused: old incarnation */
    uint64_t latency_count[XFER_OP_N]; /* observations in the latency histograms */
    double latency_sum_s[XFER_OP_N];
} xfer_metrics_snapshot_t;

/* The registry; opaque. */
typedef struct xfer_metrics xfer_metrics_t;

/* xfer_metrics_create - zeroed counters. Returns TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t xfer_metrics_create(xfer_metrics_t **metrics_out);

/* xfer_metrics_destroy - free. Accepts NULL. */
void xfer_metrics_destroy(xfer_metrics_t *metrics);

/*
 * xfer_metrics_batch - count one completed batch: op, status (TDM_OK or an error), pages and
 * bytes (counted only on success), the lane class UCX used (XFER_LANE_UNKNOWN when none was
 * learnt) and the post-to-completion latency in nanoseconds (observed for every batch).
 */
void xfer_metrics_batch(xfer_metrics_t *metrics, xfer_op_t op, tdm_status_t status,
                        uint64_t n_pages, uint64_t n_bytes, xfer_lane_class_t lane,
                        uint64_t latency_ns);

/* Events without a payload, for xfer_metrics_event. */
typedef enum {
    XFER_EVENT_NOTICE_SENT = 0,
    XFER_EVENT_NOTICE_RECEIVED,
    XFER_EVENT_NOTICE_MISMATCH,
    XFER_EVENT_NOTICE_MALFORMED,
    XFER_EVENT_PEER_FAILURE,
    XFER_EVENT_PEER_REFUSED,
    XFER_EVENT_LANE_REFUSAL,
} xfer_event_t;

/* xfer_metrics_event - add one to the counter of `event`. */
void xfer_metrics_event(xfer_metrics_t *metrics, xfer_event_t event);

/* xfer_metrics_get - copy every counter into *snapshot_out. */
void xfer_metrics_get(xfer_metrics_t *metrics, xfer_metrics_snapshot_t *snapshot_out);

/*
 * xfer_metrics_render - the Prometheus text exposition (version 0.0.4) of every counter and
 * histogram, metric names prefixed "tandem_xfer_". *text_out: NUL-terminated, caller frees with
 * free(); *n_bytes_out excludes the NUL. Returns TDM_OK or TDM_ERR_NO_MEMORY (outputs untouched).
 */
tdm_status_t xfer_metrics_render(xfer_metrics_t *metrics, char **text_out, size_t *n_bytes_out);

/* xfer_metrics_render_to - the same families written into a page being built (common/prom.h),
 * so a worker serves them on its own /metrics beside its other families. */
void xfer_metrics_render_to(xfer_metrics_t *metrics, tdm_prom_t *prom);

#endif
