#include "transfer/metrics.h"

#include "common/clock.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds, seconds: 10 us (one small page over shm) to 30 s (a 100K-token history over a
 * slow lane). */
static const double BUCKETS_S[XFER_METRICS_N_BUCKETS] = {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
                                                         1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1,
                                                         0.5,  1.0,    5.0,  30.0};

static const char *const OP_NAMES[XFER_OP_N] = {"put", "get"};

struct xfer_metrics {
    pthread_mutex_t lock;
    xfer_metrics_snapshot_t counts;
    uint64_t buckets[XFER_OP_N][XFER_METRICS_N_BUCKETS + 1]; /* last: +Inf only */
};

tdm_status_t xfer_metrics_create(xfer_metrics_t **metrics_out)
{
    xfer_metrics_t *metrics = calloc(1, sizeof(*metrics));

    if (metrics == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&metrics->lock, NULL);
    *metrics_out = metrics;
    return TDM_OK;
}

void xfer_metrics_destroy(xfer_metrics_t *metrics)
{
    if (metrics == NULL) {
        return;
    }
    pthread_mutex_destroy(&metrics->lock);
    free(metrics);
}

void xfer_metrics_batch(xfer_metrics_t *metrics, xfer_op_t op, tdm_status_t status,
                        uint64_t n_pages, uint64_t n_bytes, xfer_lane_class_t lane,
                        uint64_t latency_ns)
{
    double latency_s = (double)latency_ns / (double)TDM_NS_PER_S;
    unsigned bucket = 0;

    if ((unsigned)op >= XFER_OP_N) {
        return;
    }
    if ((unsigned)lane >= XFER_LANE_N_CLASSES) {
        lane = XFER_LANE_UNKNOWN;
    }
    while (bucket < XFER_METRICS_N_BUCKETS && latency_s > BUCKETS_S[bucket]) {
        bucket++;
    }
    pthread_mutex_lock(&metrics->lock);
    metrics->counts.n_batches[op]++;
    if (status == TDM_OK) {
        metrics->counts.n_pages[op] += n_pages;
        metrics->counts.n_bytes[op] += n_bytes;
    } else {
        metrics->counts.n_batches_failed[op]++;
    }
    metrics->counts.n_lane_batches[lane]++;
    metrics->counts.latency_count[op]++;
    metrics->counts.latency_sum_s[op] += latency_s;
    metrics->buckets[op][bucket]++;
    pthread_mutex_unlock(&metrics->lock);
}

void xfer_metrics_event(xfer_metrics_t *metrics, xfer_event_t event)
{
    uint64_t *counter = NULL;

    switch (event) {
    case XFER_EVENT_NOTICE_SENT:
        counter = &metrics->counts.n_notices_sent;
        break;
    case XFER_EVENT_NOTICE_RECEIVED:
        counter = &metrics->counts.n_notices_received;
        break;
    case XFER_EVENT_NOTICE_MISMATCH:
        counter = &metrics->counts.n_notice_mismatches;
        break;
    case XFER_EVENT_NOTICE_MALFORMED:
        counter = &metrics->counts.n_notices_malformed;
        break;
    case XFER_EVENT_PEER_FAILURE:
        counter = &metrics->counts.n_peer_failures;
        break;
    case XFER_EVENT_PEER_REFUSED:
        counter = &metrics->counts.n_peers_refused;
        break;
    case XFER_EVENT_LANE_REFUSAL:
        counter = &metrics->counts.n_lane_refusals;
        break;
    }
    if (counter == NULL) {
        return;
    }
    pthread_mutex_lock(&metrics->lock);
    (*counter)++;
    pthread_mutex_unlock(&metrics->lock);
}

void xfer_metrics_get(xfer_metrics_t *metrics, xfer_metrics_snapshot_t *snapshot_out)
{
    pthread_mutex_lock(&metrics->lock);
    *snapshot_out = metrics->counts;
    pthread_mutex_unlock(&metrics->lock);
}

static void render_op_counter(tdm_prom_t *p, const char *name, const char *help,
                              const uint64_t values[XFER_OP_N])
{
    tdm_prom_family(p, name, TDM_PROM_COUNTER, help);
    for (unsigned op = 0; op < XFER_OP_N; op++) {
        const tdm_prom_label_t label = {"op", OP_NAMES[op]};

        tdm_prom_sample_u64(p, &label, 1, values[op]);
    }
}

static void render(tdm_prom_t *p, const xfer_metrics_snapshot_t *c,
                   const uint64_t buckets[XFER_OP_N][XFER_METRICS_N_BUCKETS + 1])
{
    render_op_counter(p, "tandem_xfer_batches_total", "Transfer batches completed (any status).",
                      c->n_batches);
    render_op_counter(p, "tandem_xfer_batch_failures_total",
                      "Transfer batches completed with an error.", c->n_batches_failed);
    render_op_counter(p, "tandem_xfer_pages_total", "KV pages moved by successful batches.",
                      c->n_pages);
    render_op_counter(p, "tandem_xfer_bytes_total", "Bytes moved by successful batches.",
                      c->n_bytes);

    tdm_prom_family(p, "tandem_xfer_lane_batches_total", TDM_PROM_COUNTER,
                    "Batches by the transport lane UCX used.");
    for (unsigned lane = 0; lane < XFER_LANE_N_CLASSES; lane++) {
        const tdm_prom_label_t label = {"lane", xfer_lane_class_name((xfer_lane_class_t)lane)};

        tdm_prom_sample_u64(p, &label, 1, c->n_lane_batches[lane]);
    }
    tdm_prom_counter(p, "tandem_xfer_lane_refusals_total",
                     "Batches refused because UCX chose a lane outside --require-transport.",
                     c->n_lane_refusals);
    tdm_prom_counter(p, "tandem_xfer_notices_sent_total", "Completion notices sent.",
                     c->n_notices_sent);
    tdm_prom_counter(p, "tandem_xfer_notices_received_total",
                     "Well-formed completion notices received.", c->n_notices_received);
    tdm_prom_counter(p, "tandem_xfer_notice_mismatches_total",
                     "Received notices whose page checksums disagreed with the pages.",
                     c->n_notice_mismatches);
    tdm_prom_counter(p, "tandem_xfer_notices_malformed_total",
                     "Received notices dropped as malformed.", c->n_notices_malformed);
    tdm_prom_counter(p, "tandem_xfer_peer_failures_total", "Peers (remote pools) lost.",
                     c->n_peer_failures);
    tdm_prom_counter(p, "tandem_xfer_peer_refusals_total",
                     "Connects or batches refused because they named an old incarnation.",
                     c->n_peers_refused);

    tdm_prom_family(p, "tandem_xfer_batch_latency_seconds", TDM_PROM_HISTOGRAM,
                    "Batch latency, post to completion.");
    for (unsigned op = 0; op < XFER_OP_N; op++) {
        const tdm_prom_label_t label = {"op", OP_NAMES[op]};
        const tdm_prom_histogram_t hist = {BUCKETS_S, XFER_METRICS_N_BUCKETS, buckets[op],
                                           c->latency_sum_s[op]};

        tdm_prom_histogram(p, &label, 1, &hist);
    }
}

void xfer_metrics_render_to(xfer_metrics_t *metrics, tdm_prom_t *prom)
{
    xfer_metrics_snapshot_t counts;
    uint64_t buckets[XFER_OP_N][XFER_METRICS_N_BUCKETS + 1];

    pthread_mutex_lock(&metrics->lock);
    counts = metrics->counts;
    memcpy(buckets, metrics->buckets, sizeof(buckets));
    pthread_mutex_unlock(&metrics->lock);
    render(prom, &counts, (const uint64_t(*)[XFER_METRICS_N_BUCKETS + 1]) buckets);
}

tdm_status_t xfer_metrics_render(xfer_metrics_t *metrics, char **text_out, size_t *n_bytes_out)
{
    tdm_prom_t *prom;

    if (tdm_prom_create(&prom) != TDM_OK) {
        return TDM_ERR_NO_MEMORY;
    }
    xfer_metrics_render_to(metrics, prom);
    return tdm_prom_finish(prom, text_out, n_bytes_out);
}
