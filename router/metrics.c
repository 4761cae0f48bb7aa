#include "router/metrics.h"

#include "common/prom.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_BUCKETS 14

/* Upper bounds, seconds: from 1 ms to 60 s. */
static const double BUCKETS_S[N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 60.0};

typedef struct {
    uint64_t counts[N_BUCKETS + 1]; /* last: +Inf */
    uint64_t n;
    double sum_s;
} histogram_t;

typedef struct {
    const char *code;
    int http_status;
    uint64_t n;
} error_count_t;

/* A DecodeRequest sent and not yet answered by a token (request_id 0: free slot). */
typedef struct {
    uint64_t request_id;
    uint64_t cached_len; /* prompt tokens the decode node continues from */
    uint64_t n_local;    /* PREFILL_LOCAL: delta the decode node prefills; else 0 */
} pending_t;

struct router_metrics {
    pthread_mutex_t lock;
    pending_t pending[ROUTER_METRICS_PENDING]; /* by request_id mod ROUTER_METRICS_PENDING */
    uint64_t counters[ROUTER_METRIC_COUNT];
    error_count_t errors[ROUTER_METRICS_MAX_CODES + 1];
    int n_errors;
    histogram_t ttft;
    histogram_t itl;
};

tdm_status_t router_metrics_create(router_metrics_t **metrics_out)
{
    router_metrics_t *m = calloc(1, sizeof(*m));

    if (m == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&m->lock, NULL);
    *metrics_out = m;
    return TDM_OK;
}

void router_metrics_destroy(router_metrics_t *metrics)
{
    if (metrics == NULL) {
        return;
    }
    pthread_mutex_destroy(&metrics->lock);
    free(metrics);
}

void router_metrics_count(router_metrics_t *metrics, router_metric_t which, uint64_t n)
{
    if (which >= ROUTER_METRIC_COUNT) {
        return;
    }
    pthread_mutex_lock(&metrics->lock);
    metrics->counters[which] += n;
    pthread_mutex_unlock(&metrics->lock);
}

uint64_t router_metrics_get(router_metrics_t *metrics, router_metric_t which)
{
    uint64_t value = 0;

    if (which < ROUTER_METRIC_COUNT) {
        pthread_mutex_lock(&metrics->lock);
        value = metrics->counters[which];
        pthread_mutex_unlock(&metrics->lock);
    }
    return value;
}

void router_metrics_decode_request(router_metrics_t *metrics, const Tandem__DecodeRequest *dr)
{
    pending_t *p = &metrics->pending[dr->request_id & (ROUTER_METRICS_PENDING - 1)];

    pthread_mutex_lock(&metrics->lock);
    p->request_id = dr->request_id;
    p->cached_len = dr->cached_len;
    p->n_local = dr->mode == TANDEM__PREFILL_MODE__PREFILL_LOCAL && dr->total_len > dr->cached_len
                     ? dr->total_len - dr->cached_len
                     : 0;
    pthread_mutex_unlock(&metrics->lock);
}

/* The noted DecodeRequest of request_id, or NULL. Called with the lock held. */
static pending_t *pending_of(router_metrics_t *metrics, uint64_t request_id)
{
    pending_t *p = &metrics->pending[request_id & (ROUTER_METRICS_PENDING - 1)];

    return request_id != 0 && p->request_id == request_id ? p : NULL;
}

void router_metrics_worker_message(router_metrics_t *metrics, const Tandem__Envelope *env,
                                   uint32_t page_bytes)
{
    uint64_t *c = metrics->counters;
    const Tandem__CompletionNotice *notice;
    pending_t *p;

    pthread_mutex_lock(&metrics->lock);
    switch (env->body_case) {
    case TANDEM__ENVELOPE__BODY_COMPLETION:
        notice = env->completion;
        if (notice->total_len > notice->cached_len) {
            c[ROUTER_METRIC_TOKENS_COMPUTED] += notice->total_len - notice->cached_len;
        }
        c[ROUTER_METRIC_KV_BYTES_MOVED] +=
            (uint64_t)(notice->n_page_checksums > 0 ? notice->n_page_checksums : notice->n_pages) *
            page_bytes;
        break;
    case TANDEM__ENVELOPE__BODY_TOKEN_CHUNK:
        p = pending_of(metrics, env->token_chunk->request_id);
        if (p != NULL && env->token_chunk->n_tokens > 0) {
            c[ROUTER_METRIC_TOKENS_REUSED] += p->cached_len;
            c[ROUTER_METRIC_TOKENS_COMPUTED] += p->n_local;
            p->request_id = 0;
        }
        break;
    case TANDEM__ENVELOPE__BODY_FINISH:
        p = pending_of(metrics, env->finish->request_id);
        if (p != NULL) {
            p->request_id = 0;
        }
        break;
    case TANDEM__ENVELOPE__BODY_ERROR:
        p = pending_of(metrics, env->error->request_id);
        if (p != NULL) {
            p->request_id = 0;
        }
        break;
    default:
        break;
    }
    pthread_mutex_unlock(&metrics->lock);
}

void router_metrics_error(router_metrics_t *metrics, const char *code, int http_status)
{
    int i;

    if (code == NULL) {
        code = "unknown";
    }
    pthread_mutex_lock(&metrics->lock);
    for (i = 0; i < metrics->n_errors; i++) {
        if (strcmp(metrics->errors[i].code, code) == 0 &&
            metrics->errors[i].http_status == http_status) {
            break;
        }
    }
    if (i == metrics->n_errors) {
        if (metrics->n_errors < ROUTER_METRICS_MAX_CODES) {
            metrics->errors[i].code = code;
            metrics->errors[i].http_status = http_status;
            metrics->n_errors++;
        } else {
            i = ROUTER_METRICS_MAX_CODES;
            metrics->errors[i].code = "other";
            metrics->errors[i].http_status = 0;
        }
    }
    metrics->errors[i].n++;
    pthread_mutex_unlock(&metrics->lock);
}

static void observe(histogram_t *h, double seconds)
{
    int b = 0;

    while (b < N_BUCKETS && seconds > BUCKETS_S[b]) {
        b++;
    }
    h->counts[b]++;
    h->n++;
    h->sum_s += seconds;
}

void router_metrics_ttft(router_metrics_t *metrics, double seconds)
{
    pthread_mutex_lock(&metrics->lock);
    observe(&metrics->ttft, seconds);
    pthread_mutex_unlock(&metrics->lock);
}

void router_metrics_itl(router_metrics_t *metrics, double seconds)
{
    pthread_mutex_lock(&metrics->lock);
    observe(&metrics->itl, seconds);
    pthread_mutex_unlock(&metrics->lock);
}

static void render_histogram(tdm_prom_t *p, const char *name, const char *help,
                             const histogram_t *h)
{
    const tdm_prom_histogram_t hist = {BUCKETS_S, N_BUCKETS, h->counts, h->sum_s};

    tdm_prom_family(p, name, TDM_PROM_HISTOGRAM, help);
    tdm_prom_histogram(p, NULL, 0, &hist);
}

/* One labelled counter sample: label `name`="value". */
static void count1(tdm_prom_t *p, const char *name, const char *value, uint64_t v)
{
    const tdm_prom_label_t label = {name, value};

    tdm_prom_sample_u64(p, &label, 1, v);
}

/* One labelled gauge sample. */
static void sample1(tdm_prom_t *p, const char *name, const char *value, double v)
{
    const tdm_prom_label_t label = {name, value};

    tdm_prom_sample(p, &label, 1, v);
}

tdm_status_t router_metrics_gauges_fill_workers(router_metrics_gauges_t *gauges,
                                                router_registry_t *registry)
{
    uint32_t n = router_registry_count(registry);
    router_worker_gauge_t *rows;
    size_t i = 0;

    gauges->worker_rows = NULL;
    gauges->n_worker_rows = 0;
    if (n == 0) {
        return TDM_OK;
    }
    rows = calloc(n, sizeof(*rows));
    if (rows == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (int s = router_registry_next(registry, -1); s >= 0 && i < n;
         s = router_registry_next(registry, s)) {
        const router_worker_t *w = router_registry_worker(registry, s, 0);
        router_worker_gauge_t *row = &rows[i++];
        snprintf(row->id, sizeof(row->id), "%s", w->id);
        snprintf(row->rack, sizeof(row->rack), "%s", w->rack);
        row->role = w->role;
        row->placeable = router_registry_placeable(w);
        row->n_active = w->n_active;
        row->n_assigned_tokens = w->n_assigned_tokens;
        row->queued_prefill_tokens = w->queued_prefill_tokens;
        row->running_sequences = w->running_sequences;
        if (w->total_pages > 0) {
            uint32_t free_pages = w->free_pages < w->total_pages ? w->free_pages : w->total_pages;
            row->kv_occupancy = 1.0 - (double)free_pages / (double)w->total_pages;
        }
    }
    gauges->worker_rows = rows;
    gauges->n_worker_rows = i;
    return TDM_OK;
}

void router_metrics_gauges_fini(router_metrics_gauges_t *gauges)
{
    free(gauges->worker_rows);
    gauges->worker_rows = NULL;
    gauges->n_worker_rows = 0;
}

/* One per-worker gauge family: a sample per row, labelled worker, role and rack. */
typedef double worker_value_fn(const router_worker_gauge_t *row);

static double row_in_flight(const router_worker_gauge_t *row)
{
    return (double)row->n_active;
}

static double row_assigned(const router_worker_gauge_t *row)
{
    return (double)row->n_assigned_tokens;
}

static double row_queued(const router_worker_gauge_t *row)
{
    return (double)row->queued_prefill_tokens;
}

static double row_running(const router_worker_gauge_t *row)
{
    return (double)row->running_sequences;
}

static double row_occupancy(const router_worker_gauge_t *row)
{
    return row->kv_occupancy;
}

static double row_placeable(const router_worker_gauge_t *row)
{
    return row->placeable ? 1.0 : 0.0;
}

static void render_worker_family(tdm_prom_t *p, const router_metrics_gauges_t *g, const char *name,
                                 const char *help, worker_value_fn *value)
{
    tdm_prom_family(p, name, TDM_PROM_GAUGE, help);
    for (size_t i = 0; i < g->n_worker_rows; i++) {
        const router_worker_gauge_t *row = &g->worker_rows[i];
        const tdm_prom_label_t labels[] = {
            {"worker", row->id}, {"role", proto_role_name(row->role)}, {"rack", row->rack}};
        tdm_prom_sample(p, labels, 3, value(row));
    }
}

static void render_workers(tdm_prom_t *p, const router_metrics_gauges_t *g)
{
    if (g->n_worker_rows == 0) {
        return;
    }
    render_worker_family(p, g, "tandem_router_worker_placeable",
                         "1 while the worker takes new work (live, not stalled or draining)",
                         row_placeable);
    render_worker_family(p, g, "tandem_router_worker_inflight",
                         "requests or jobs the router has in flight on the worker", row_in_flight);
    render_worker_family(p, g, "tandem_router_worker_assigned_prefill_tokens",
                         "prefill tokens the router handed the worker, not yet done", row_assigned);
    render_worker_family(p, g, "tandem_router_worker_queued_prefill_tokens",
                         "tokens waiting for prefill on the worker (its last heartbeat)",
                         row_queued);
    render_worker_family(p, g, "tandem_router_worker_running_sequences",
                         "sequences in the worker's decode batch (its last heartbeat)",
                         row_running);
    render_worker_family(p, g, "tandem_router_worker_kv_occupancy",
                         "fraction of the worker's KV pages in use (its last heartbeat)",
                         row_occupancy);
}

tdm_status_t router_metrics_render(router_metrics_t *metrics, const router_metrics_gauges_t *gauges,
                                   char **text_out, size_t *n_bytes_out)
{
    tdm_prom_t *p;
    const uint64_t *c = metrics->counters;
    const router_registry_stats_t *w = &gauges->workers;

    if (tdm_prom_create(&p) != TDM_OK) {
        return TDM_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&metrics->lock);
    tdm_prom_family(p, "tandem_router_requests_total", TDM_PROM_COUNTER,
                    "generation requests received, by endpoint");
    count1(p, "endpoint", "chat", c[ROUTER_METRIC_REQUESTS_CHAT]);
    count1(p, "endpoint", "completions", c[ROUTER_METRIC_REQUESTS_COMPLETIONS]);
    count1(p, "endpoint", "responses", c[ROUTER_METRIC_REQUESTS_RESPONSES]);
    tdm_prom_family(p, "tandem_router_errors_total", TDM_PROM_COUNTER,
                    "API errors answered, by code and HTTP status");
    for (int i = 0; i <= ROUTER_METRICS_MAX_CODES; i++) {
        if (metrics->errors[i].n > 0) {
            char status[16];
            snprintf(status, sizeof(status), "%d", metrics->errors[i].http_status);
            const tdm_prom_label_t labels[] = {{"code", metrics->errors[i].code},
                                               {"status", status}};
            tdm_prom_sample_u64(p, labels, 2, metrics->errors[i].n);
        }
    }
    tdm_prom_counter(p, "tandem_router_prompt_tokens_total", "prompt tokens of served requests",
                     c[ROUTER_METRIC_PROMPT_TOKENS]);
    tdm_prom_counter(p, "tandem_router_completion_tokens_total", "completion tokens returned",
                     c[ROUTER_METRIC_COMPLETION_TOKENS]);
    tdm_prom_family(p, "tandem_router_prefill_tokens_total", TDM_PROM_COUNTER,
                    "delta tokens dispatched for prefill, by where they ran");
    count1(p, "mode", "local", c[ROUTER_METRIC_PREFILL_LOCAL_TOKENS]);
    count1(p, "mode", "remote", c[ROUTER_METRIC_PREFILL_REMOTE_TOKENS]);
    /* The names tandem-bench reads (bench/replay/metrics.h); only the router exports them, so a
     * scrape of the router and its workers sums each once. */
    tdm_prom_counter(p, "tandem_prefill_tokens_computed_total",
                     "prompt tokens prefilled: the delta of every completed prefill job and of "
                     "every local prefill that produced a first token",
                     c[ROUTER_METRIC_TOKENS_COMPUTED]);
    tdm_prom_counter(p, "tandem_prefill_tokens_reused_total",
                     "prompt tokens served from cached KV: the cached length of every decode "
                     "request that produced a first token",
                     c[ROUTER_METRIC_TOKENS_REUSED]);
    tdm_prom_counter(p, "tandem_kv_bytes_moved_total",
                     "bytes of KV pages prefill nodes put into decode nodes (pages of every "
                     "completed prefill job times the page size)",
                     c[ROUTER_METRIC_KV_BYTES_MOVED]);
    {
        const tdm_prom_label_t in = {"direction", "in"}, out = {"direction", "out"};
        tdm_prom_family(p, "tandem_router_control_bytes_total", TDM_PROM_COUNTER,
                        "bytes of the frames received (in) and sent (out) on the control socket");
        tdm_prom_sample_u64(p, &in, 1, c[ROUTER_METRIC_CONTROL_BYTES_IN]);
        tdm_prom_sample_u64(p, &out, 1, c[ROUTER_METRIC_CONTROL_BYTES_OUT]);
    }
    tdm_prom_counter(p, "tandem_router_prefix_hits_total",
                     "requests without a session id matched to a session by cached prefix",
                     c[ROUTER_METRIC_PREFIX_HITS]);
    tdm_prom_counter(p, "tandem_router_retries_total",
                     "turn attempts repeated after a lost worker or lost state",
                     c[ROUTER_METRIC_RETRIES]);
    tdm_prom_counter(p, "tandem_router_client_aborts_total", "clients gone before the end",
                     c[ROUTER_METRIC_CLIENT_ABORTS]);
    tdm_prom_family(p, "tandem_router_prefill_fallbacks_total", TDM_PROM_COUNTER,
                    "remote prefills done on the decode node instead because no prefill worker "
                    "could take them, by reason");
    sample1(p, "reason", "transport", (double)c[ROUTER_METRIC_PREFILL_FALLBACK_TRANSPORT]);
    sample1(p, "reason", "capacity", (double)c[ROUTER_METRIC_PREFILL_FALLBACK_CAPACITY]);
    sample1(p, "reason", "stalled", (double)c[ROUTER_METRIC_PREFILL_FALLBACK_STALLED]);
    tdm_prom_counter(p, "tandem_router_prefill_cross_rack_total",
                     "prefill jobs placed outside the decode worker's rack (NVLink domain): "
                     "their KV pages cross racks over RDMA",
                     c[ROUTER_METRIC_PREFILL_CROSS_RACK]);
    render_histogram(p, "tandem_router_ttft_seconds", "time to first token", &metrics->ttft);
    render_histogram(p, "tandem_router_itl_seconds", "inter-token latency", &metrics->itl);
    pthread_mutex_unlock(&metrics->lock);

    tdm_prom_gauge(p, "tandem_router_sessions", "sessions in the table",
                   (double)gauges->n_sessions);
    tdm_prom_gauge(p, "tandem_router_inflight_requests", "requests being served",
                   (double)gauges->n_inflight);
    tdm_prom_counter(p, "tandem_router_session_queries_total",
                     "SessionQuery sent to decode nodes for sessions this router had no record of",
                     gauges->n_session_queries);
    tdm_prom_counter(p, "tandem_router_sessions_learned_total",
                     "sessions learned from a decode node's SessionHistory",
                     gauges->n_sessions_learned);
    tdm_prom_counter(p, "tandem_router_session_query_timeouts_total",
                     "SessionQuery unanswered in time (the turn went on without the record)",
                     gauges->n_session_query_timeouts);
    tdm_prom_counter(p, "tandem_router_replicas_applied_total",
                     "session replicas from peer routers written into the table",
                     gauges->n_replicas_applied);
    tdm_prom_counter(p, "tandem_router_replicas_sent_total", "session replicas sent to peers",
                     gauges->n_replicas_sent);
    tdm_prom_counter(p, "tandem_router_replica_send_failures_total",
                     "session replicas whose peer router was unreachable",
                     gauges->n_replica_send_failures);
    tdm_prom_gauge(p, "tandem_router_resident_sessions_indexed",
                   "(session, decode node) pairs the decode nodes' last reports list: the "
                   "sessions this router can learn from them",
                   (double)gauges->n_resident_indexed);
    tdm_prom_family(p, "tandem_router_workers", TDM_PROM_GAUGE, "live workers, by role");
    sample1(p, "role", "prefill", w->n_prefill);
    sample1(p, "role", "decode", w->n_decode);
    tdm_prom_counter(p, "tandem_router_workers_lost_total", "workers declared lost",
                     w->n_lost_total);
    tdm_prom_counter(p, "tandem_router_registrations_refused_total",
                     "registrations refused as incompatible", w->n_refused_total);
    tdm_prom_counter(p, "tandem_router_transport_mismatch_pairs_total",
                     "prefill/decode worker pairs that share no transport (never paired)",
                     w->n_transport_mismatch_total);
    tdm_prom_gauge(p, "tandem_router_workers_stalled",
                   "live workers reporting stalled (work pending, no progress): not placed on",
                   (double)w->n_stalled);
    tdm_prom_family(p, "tandem_router_own_stall_seconds_total", TDM_PROM_COUNTER,
                    "time the router's own control loop did not run, not counted against "
                    "workers' heartbeats");
    tdm_prom_sample(p, NULL, 0, (double)w->router_stall_ms_total / 1e3);
    tdm_prom_family(p, "tandem_router_prefill_backlog_seconds", TDM_PROM_GAUGE,
                    "queued prefill tokens over measured prefill throughput, by role");
    sample1(p, "role", "prefill", w->prefill_backlog_s);
    tdm_prom_family(p, "tandem_router_queued_prefill_tokens", TDM_PROM_GAUGE,
                    "tokens waiting for prefill, by role");
    sample1(p, "role", "prefill", (double)w->queued_prefill_tokens);
    tdm_prom_family(p, "tandem_router_kv_occupancy", TDM_PROM_GAUGE,
                    "fraction of KV pages in use, by role");
    sample1(p, "role", "decode", w->decode_kv_occupancy);
    tdm_prom_family(p, "tandem_router_running_sequences", TDM_PROM_GAUGE,
                    "sequences in decode batches, by role");
    sample1(p, "role", "decode", w->running_sequences);
    render_workers(p, gauges);
    return tdm_prom_finish(p, text_out, n_bytes_out);
}
