#include "router/metrics.h"

#include <pthread.h>
#include <stdarg.h>
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
        c[ROUTER_METRIC_KV_BYTES_MOVED] += (uint64_t)notice->n_page_checksums * page_bytes;
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

/* A growing text buffer; `failed` sticks after an allocation failure. */
typedef struct {
    char *text;
    size_t n;
    size_t cap;
    int failed;
} out_t;

static void emit(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void emit(out_t *o, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (o->failed) {
        return;
    }
    for (;;) {
        va_start(ap, fmt);
        n = vsnprintf(o->text + o->n, o->cap - o->n, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->failed = 1;
            return;
        }
        if ((size_t)n < o->cap - o->n) {
            o->n += (size_t)n;
            return;
        }
        char *grown = realloc(o->text, o->cap * 2 + (size_t)n);
        if (grown == NULL) {
            o->failed = 1;
            return;
        }
        o->text = grown;
        o->cap = o->cap * 2 + (size_t)n;
    }
}

static void emit_histogram(out_t *o, const char *name, const char *help, const histogram_t *h)
{
    uint64_t cumulative = 0;

    emit(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int b = 0; b < N_BUCKETS; b++) {
        cumulative += h->counts[b];
        emit(o, "%s_bucket{le=\"%g\"} %llu\n", name, BUCKETS_S[b], (unsigned long long)cumulative);
    }
    cumulative += h->counts[N_BUCKETS];
    emit(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cumulative);
    emit(o, "%s_sum %.9g\n%s_count %llu\n", name, h->sum_s, name, (unsigned long long)h->n);
}

static void emit_counter(out_t *o, const char *name, const char *help, uint64_t value)
{
    emit(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
         (unsigned long long)value);
}

static void emit_gauge(out_t *o, const char *name, const char *help, double value)
{
    emit(o, "# HELP %s %s\n# TYPE %s gauge\n%s %.9g\n", name, help, name, name, value);
}

tdm_status_t router_metrics_render(router_metrics_t *metrics, const router_metrics_gauges_t *gauges,
                                   char **text_out, size_t *n_bytes_out)
{
    out_t o = {0};
    const uint64_t *c = metrics->counters;
    const router_registry_stats_t *w = &gauges->workers;

    o.cap = 8192;
    o.text = malloc(o.cap);
    if (o.text == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&metrics->lock);
    emit(&o,
         "# HELP tandem_router_requests_total generation requests received, by endpoint\n"
         "# TYPE tandem_router_requests_total counter\n"
         "tandem_router_requests_total{endpoint=\"chat\"} %llu\n"
         "tandem_router_requests_total{endpoint=\"completions\"} %llu\n",
         (unsigned long long)c[ROUTER_METRIC_REQUESTS_CHAT],
         (unsigned long long)c[ROUTER_METRIC_REQUESTS_COMPLETIONS]);
    emit(&o, "# HELP tandem_router_errors_total API errors answered, by code and HTTP status\n"
             "# TYPE tandem_router_errors_total counter\n");
    for (int i = 0; i <= ROUTER_METRICS_MAX_CODES; i++) {
        if (metrics->errors[i].n > 0) {
            emit(&o, "tandem_router_errors_total{code=\"%s\",status=\"%d\"} %llu\n",
                 metrics->errors[i].code, metrics->errors[i].http_status,
                 (unsigned long long)metrics->errors[i].n);
        }
    }
    emit_counter(&o, "tandem_router_prompt_tokens_total", "prompt tokens of served requests",
                 c[ROUTER_METRIC_PROMPT_TOKENS]);
    emit_counter(&o, "tandem_router_completion_tokens_total", "completion tokens returned",
                 c[ROUTER_METRIC_COMPLETION_TOKENS]);
    emit(&o,
         "# HELP tandem_router_prefill_tokens_total delta tokens dispatched for prefill, "
         "by where they ran\n"
         "# TYPE tandem_router_prefill_tokens_total counter\n"
         "tandem_router_prefill_tokens_total{mode=\"local\"} %llu\n"
         "tandem_router_prefill_tokens_total{mode=\"remote\"} %llu\n",
         (unsigned long long)c[ROUTER_METRIC_PREFILL_LOCAL_TOKENS],
         (unsigned long long)c[ROUTER_METRIC_PREFILL_REMOTE_TOKENS]);
    /* The names tandem-bench reads (bench/replay/metrics.h); only the router exports them, so a
     * scrape of the router and its workers sums each once. */
    emit_counter(&o, "tandem_prefill_tokens_computed_total",
                 "prompt tokens prefilled: the delta of every completed prefill job and of every "
                 "local prefill that produced a first token",
                 c[ROUTER_METRIC_TOKENS_COMPUTED]);
    emit_counter(&o, "tandem_prefill_tokens_reused_total",
                 "prompt tokens served from cached KV: the cached length of every decode request "
                 "that produced a first token",
                 c[ROUTER_METRIC_TOKENS_REUSED]);
    emit_counter(&o, "tandem_kv_bytes_moved_total",
                 "bytes of KV pages prefill nodes put into decode nodes (pages of every completed "
                 "prefill job times the page size)",
                 c[ROUTER_METRIC_KV_BYTES_MOVED]);
    emit_counter(&o, "tandem_router_prefix_hits_total",
                 "requests without a session id matched to a session by cached prefix",
                 c[ROUTER_METRIC_PREFIX_HITS]);
    emit_counter(&o, "tandem_router_retries_total",
                 "turn attempts repeated after a lost worker or lost state",
                 c[ROUTER_METRIC_RETRIES]);
    emit_counter(&o, "tandem_router_client_aborts_total", "clients gone before the end",
                 c[ROUTER_METRIC_CLIENT_ABORTS]);
    emit_histogram(&o, "tandem_router_ttft_seconds", "time to first token", &metrics->ttft);
    emit_histogram(&o, "tandem_router_itl_seconds", "inter-token latency", &metrics->itl);
    pthread_mutex_unlock(&metrics->lock);

    emit_gauge(&o, "tandem_router_sessions", "sessions in the table", (double)gauges->n_sessions);
    emit_gauge(&o, "tandem_router_inflight_requests", "requests being served",
               (double)gauges->n_inflight);
    emit(&o,
         "# HELP tandem_router_workers live workers, by role\n"
         "# TYPE tandem_router_workers gauge\n"
         "tandem_router_workers{role=\"prefill\"} %u\n"
         "tandem_router_workers{role=\"decode\"} %u\n",
         w->n_prefill, w->n_decode);
    emit_counter(&o, "tandem_router_workers_lost_total", "workers declared lost", w->n_lost_total);
    emit_counter(&o, "tandem_router_registrations_refused_total",
                 "registrations refused as incompatible", w->n_refused_total);
    emit(&o,
         "# HELP tandem_router_prefill_backlog_seconds queued prefill tokens over measured "
         "prefill throughput, by role\n"
         "# TYPE tandem_router_prefill_backlog_seconds gauge\n"
         "tandem_router_prefill_backlog_seconds{role=\"prefill\"} %.9g\n",
         w->prefill_backlog_s);
    emit(&o,
         "# HELP tandem_router_queued_prefill_tokens tokens waiting for prefill, by role\n"
         "# TYPE tandem_router_queued_prefill_tokens gauge\n"
         "tandem_router_queued_prefill_tokens{role=\"prefill\"} %llu\n",
         (unsigned long long)w->queued_prefill_tokens);
    emit(&o,
         "# HELP tandem_router_kv_occupancy fraction of KV pages in use, by role\n"
         "# TYPE tandem_router_kv_occupancy gauge\n"
         "tandem_router_kv_occupancy{role=\"decode\"} %.9g\n",
         w->decode_kv_occupancy);
    emit(&o,
         "# HELP tandem_router_running_sequences sequences in decode batches, by role\n"
         "# TYPE tandem_router_running_sequences gauge\n"
         "tandem_router_running_sequences{role=\"decode\"} %u\n",
         w->running_sequences);
    if (o.failed) {
        free(o.text);
        return TDM_ERR_NO_MEMORY;
    }
    *text_out = o.text;
    *n_bytes_out = o.n;
    return TDM_OK;
}
