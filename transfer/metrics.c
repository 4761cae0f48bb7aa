#include "transfer/metrics.h"

#include <pthread.h>
#include <stdio.h>
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
    double latency_s = (double)latency_ns * 1e-9;
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

static void render_op_counter(FILE *out, const char *name, const char *help,
                              const uint64_t values[XFER_OP_N])
{
    fprintf(out, "# HELP tandem_xfer_%s %s\n# TYPE tandem_xfer_%s counter\n", name, help, name);
    for (unsigned op = 0; op < XFER_OP_N; op++) {
        fprintf(out, "tandem_xfer_%s{op=\"%s\"} %llu\n", name, OP_NAMES[op],
                (unsigned long long)values[op]);
    }
}

static void render_counter(FILE *out, const char *name, const char *help, uint64_t value)
{
    fprintf(out, "# HELP tandem_xfer_%s %s\n# TYPE tandem_xfer_%s counter\ntandem_xfer_%s %llu\n",
            name, help, name, name, (unsigned long long)value);
}

static void render(FILE *out, const xfer_metrics_snapshot_t *c,
                   const uint64_t buckets[XFER_OP_N][XFER_METRICS_N_BUCKETS + 1])
{
    render_op_counter(out, "batches_total", "Transfer batches completed (any status).",
                      c->n_batches);
    render_op_counter(out, "batch_failures_total", "Transfer batches completed with an error.",
                      c->n_batches_failed);
    render_op_counter(out, "pages_total", "KV pages moved by successful batches.", c->n_pages);
    render_op_counter(out, "bytes_total", "Bytes moved by successful batches.", c->n_bytes);

    fprintf(out, "# HELP tandem_xfer_lane_batches_total Batches by the transport lane UCX used."
                 "\n# TYPE tandem_xfer_lane_batches_total counter\n");
    for (unsigned lane = 0; lane < XFER_LANE_N_CLASSES; lane++) {
        fprintf(out, "tandem_xfer_lane_batches_total{lane=\"%s\"} %llu\n",
                xfer_lane_class_name((xfer_lane_class_t)lane),
                (unsigned long long)c->n_lane_batches[lane]);
    }
    render_counter(out, "lane_refusals_total",
                   "Batches refused because UCX chose a lane outside --require-transport.",
                   c->n_lane_refusals);
    render_counter(out, "notices_sent_total", "Completion notices sent.", c->n_notices_sent);
    render_counter(out, "notices_received_total", "Well-formed completion notices received.",
                   c->n_notices_received);
    render_counter(out, "notice_mismatches_total",
                   "Received notices whose page checksums disagreed with the pages.",
                   c->n_notice_mismatches);
    render_counter(out, "notices_malformed_total", "Received notices dropped as malformed.",
                   c->n_notices_malformed);
    render_counter(out, "peer_failures_total", "Peers (remote pools) lost.", c->n_peer_failures);
    render_counter(out, "peer_refusals_total",
                   "Connects or batches refused because they named an old incarnation.",
                   c->n_peers_refused);

    fprintf(out, "# HELP tandem_xfer_batch_latency_seconds Batch latency, post to completion."
                 "\n# TYPE tandem_xfer_batch_latency_seconds histogram\n");
    for (unsigned op = 0; op < XFER_OP_N; op++) {
        uint64_t cumulative = 0;

        for (unsigned b = 0; b < XFER_METRICS_N_BUCKETS; b++) {
            cumulative += buckets[op][b];
            fprintf(out, "tandem_xfer_batch_latency_seconds_bucket{op=\"%s\",le=\"%g\"} %llu\n",
                    OP_NAMES[op], BUCKETS_S[b], (unsigned long long)cumulative);
        }
        cumulative += buckets[op][XFER_METRICS_N_BUCKETS];
        fprintf(out, "tandem_xfer_batch_latency_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n",
                OP_NAMES[op], (unsigned long long)cumulative);
        fprintf(out, "tandem_xfer_batch_latency_seconds_sum{op=\"%s\"} %.9g\n", OP_NAMES[op],
                c->latency_sum_s[op]);
        fprintf(out, "tandem_xfer_batch_latency_seconds_count{op=\"%s\"} %llu\n", OP_NAMES[op],
                (unsigned long long)c->latency_count[op]);
    }
}

tdm_status_t xfer_metrics_render(xfer_metrics_t *metrics, char **text_out, size_t *n_bytes_out)
{
    xfer_metrics_snapshot_t counts;
    uint64_t buckets[XFER_OP_N][XFER_METRICS_N_BUCKETS + 1];
    char *text = NULL;
    size_t n_bytes = 0;
    FILE *out;

    pthread_mutex_lock(&metrics->lock);
    counts = metrics->counts;
    memcpy(buckets, metrics->buckets, sizeof(buckets));
    pthread_mutex_unlock(&metrics->lock);

    out = open_memstream(&text, &n_bytes);
    if (out == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    render(out, &counts, (const uint64_t(*)[XFER_METRICS_N_BUCKETS + 1]) buckets);
    if (ferror(out) != 0) {
        fclose(out);
        free(text);
        return TDM_ERR_NO_MEMORY;
    }
    if (fclose(out) != 0) {
        free(text);
        return TDM_ERR_NO_MEMORY;
    }
    *text_out = text;
    *n_bytes_out = n_bytes;
    return TDM_OK;
}
