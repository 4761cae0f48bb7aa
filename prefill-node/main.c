/* tandem-prefill - a prefill node: takes prefill jobs from the router, pulls the session's
 * pages from the decode node, runs the CED prefill and puts the new pages into the decode node's
 * reservation, then sends the completion notice (ARCHITECTURE.md, docs/PROTOCOL.md section 7).
 * Runs until SIGINT or SIGTERM, then says Goodbye and stops.
 */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/flags.h"
#include "common/http_status.h"
#include "common/log.h"
#include "common/prom.h"
#include "common/startup.h"
#include "node/node_http.h"
#include "node/node_link.h"
#include "node/node_xfer.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "kernels/kv_page.h"
#include "prefill-node/job.h"
#include "prefill-node/queue.h"
#include "transfer/context.h"
#include "transfer/metrics.h"
#include "transfer/pool.h"

#define PREFILL_ERR_BYTES 512
#define PREFILL_HOST_BYTES 256
#define PREFILL_BODY_BYTES 4096
#define PREFILL_IDLE_MS 100u
#define PREFILL_EXIT_REFUSED 3

typedef struct {
    const char *model_dir;
    const char *router;
    const char *http;
    const char *rack;
    uint32_t pages;
    uint32_t threads;
    uint32_t chunk_tokens;
    uint32_t register_timeout_ms;
    const char *transports;
    const char *ucx_protocols;
    const char *require_transport;
    const char *log_level;
} prefill_cfg_t;

static const tdm_flag_t prefill_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(prefill_cfg_t, model_dir), "model directory", 0, 0,
     1},
    {"router", TDM_FLAG_STRING, "tcp://127.0.0.1:5557", offsetof(prefill_cfg_t, router),
     "the router's control endpoint", 0, 0, 0},
    {"http", TDM_FLAG_STRING, "127.0.0.1:0", offsetof(prefill_cfg_t, http),
     "HOST:PORT of /health and /metrics (port 0: any free port)", 0, 0, 0},
    {"rack", TDM_FLAG_STRING, "rack0", offsetof(prefill_cfg_t, rack), "NVLink domain id", 0, 0,
     0},
    {"pages", TDM_FLAG_U32, "4096", offsetof(prefill_cfg_t, pages),
     "local KV pages (a job's history plus its sequence at T)", 16, 16777216, 0},
    {"threads", TDM_FLAG_U32, "0", offsetof(prefill_cfg_t, threads),
     "kernel threads (0: every online CPU)", 0, 1024, 0},
    {"chunk-tokens", TDM_FLAG_U32, "256", offsetof(prefill_cfg_t, chunk_tokens),
     "prefill chunk: most tokens one layer pass takes", 1, 65536, 0},
    {"register-timeout-ms", TDM_FLAG_U32, "10000", offsetof(prefill_cfg_t, register_timeout_ms),
     "how long to wait for the router's RegisterAck", 100, 600000, 0},
    {"transports", TDM_FLAG_STRING, NULL, offsetof(prefill_cfg_t, transports),
     "UCX transports (UCX_TLS syntax; default: UCX's choice)", 0, 0, 0},
    {"ucx-protocols", TDM_FLAG_STRING, "v1", offsetof(prefill_cfg_t, ucx_protocols),
     "UCX protocol generation: v1 (UCX 1.13's default; lanes read from the endpoint "
     "configuration) or v2 (lanes described by UCX per request)", 0, 0, 0},
    {"require-transport", TDM_FLAG_STRING, NULL, offsetof(prefill_cfg_t, require_transport),
     "lanes KV transfers may use (tcp,shm,rc,dc,ud,cuda_ipc,cuda_copy,gdr_copy; default "
     "any): a transfer over another lane fails instead of falling back", 0, 0, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(prefill_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

/* Counters for /metrics (written by the compute thread under `lock`). */
typedef struct {
    uint64_t jobs_total;
    uint64_t jobs_failed_total;
    uint64_t jobs_aborted_total;
    uint64_t prefilled_tokens_total;
    uint64_t pulled_pages_total;
    uint64_t put_pages_total;
    uint64_t chunk_puts_total;       /* put batches posted while a prefill computed */
    uint64_t early_put_pages_total;  /* pages they carried */
    uint32_t queued_jobs;
    uint64_t queued_tokens;
    double last_job_s;
    double last_compute_s;
    double recent_tokens_per_s;
} prefill_stats_t;

/* Process state, made in main() and passed down. */
typedef struct {
    prefill_cfg_t cfg;
    char id[NODE_ID_BYTES + 1];
    engine_model_t *model;
    xfer_context_t *xfer;
    xfer_pool_t *xpool;
    engine_kv_pool_t *kv;
    engine_fwd_t *fwd;
    prefill_queue_t *queue;
    node_http_t *http;
    node_link_t *link;
    int ready;
    pthread_mutex_t lock;
    prefill_stats_t stats;
    uint64_t running_tokens;
    uint64_t running_reservation_id; /* the running job's reservation (its abort key) */
} prefill_node_t;

static volatile sig_atomic_t g_stop_signal;

static void on_signal(int sig)
{
    g_stop_signal = sig;
}

/* The /metrics page: the node's families, then transfer/'s. NULL when out of memory. */
static char *render_metrics(prefill_node_t *n, const prefill_stats_t *st)
{
    tdm_prom_t *p;
    char *text = NULL;
    size_t n_bytes = 0;

    if (tdm_prom_create(&p) != TDM_OK) {
        return NULL;
    }
    tdm_prom_counter(p, "tandem_prefill_jobs_total", "prefill jobs finished (any status)",
                     st->jobs_total);
    tdm_prom_counter(p, "tandem_prefill_jobs_failed_total", "prefill jobs failed",
                     st->jobs_failed_total);
    tdm_prom_counter(p, "tandem_prefill_jobs_aborted_total", "prefill jobs aborted or timed out",
                     st->jobs_aborted_total);
    tdm_prom_counter(p, "tandem_prefill_tokens_total", "prompt tokens prefilled by this node",
                     st->prefilled_tokens_total);
    tdm_prom_counter(p, "tandem_prefill_pulled_pages_total",
                     "KV pages pulled from decode nodes (cached prefix)", st->pulled_pages_total);
    tdm_prom_counter(p, "tandem_prefill_put_pages_total", "KV pages put into decode nodes",
                     st->put_pages_total);
    tdm_prom_counter(p, "tandem_prefill_chunk_puts_total",
                     "put batches posted while a later chunk computed", st->chunk_puts_total);
    tdm_prom_counter(p, "tandem_prefill_chunk_put_pages_total", "KV pages those batches carried",
                     st->early_put_pages_total);
    tdm_prom_gauge(p, "tandem_prefill_queued_jobs", "prefill jobs waiting", st->queued_jobs);
    tdm_prom_gauge(p, "tandem_prefill_queued_tokens", "tokens queued or running for prefill",
                   (double)st->queued_tokens);
    tdm_prom_gauge(p, "tandem_prefill_last_job_seconds", "duration of the last successful job",
                   st->last_job_s);
    tdm_prom_gauge(p, "tandem_prefill_last_compute_seconds",
                   "compute time of the last successful job", st->last_compute_s);
    tdm_prom_gauge(p, "tandem_prefill_recent_tokens_per_second",
                   "prefill throughput of the last job, tokens per second",
                   st->recent_tokens_per_s);
    if (n->xfer != NULL) {
        xfer_metrics_render_to(xfer_context_metrics(n->xfer), p);
    }
    return tdm_prom_finish(p, &text, &n_bytes) == TDM_OK ? text : NULL;
}

static int render(void *arg, node_http_page_t page, char **body_out)
{
    prefill_node_t *n = arg;
    prefill_stats_t st;
    char *body;
    int ready;

    pthread_mutex_lock(&n->lock);
    st = n->stats;
    ready = n->ready;
    pthread_mutex_unlock(&n->lock);
    if (page == NODE_HTTP_METRICS) {
        body = render_metrics(n, &st);
        *body_out = body;
        return body != NULL ? TDM_HTTP_OK : TDM_HTTP_INTERNAL;
    }
    body = malloc(PREFILL_BODY_BYTES);
    if (body == NULL) {
        return TDM_HTTP_INTERNAL;
    }
    snprintf(body, PREFILL_BODY_BYTES,
             "{\"status\":\"%s\",\"role\":\"prefill\",\"id\":\"%s\",\"queued_jobs\":%u}\n",
             ready ? "ok" : "starting", n->id, st.queued_jobs);
    *body_out = body;
    return ready ? TDM_HTTP_OK : TDM_HTTP_UNAVAILABLE;
}

static void publish(prefill_node_t *n)
{
    node_load_t load;

    memset(&load, 0, sizeof(load));
    pthread_mutex_lock(&n->lock);
    n->stats.queued_jobs = prefill_queue_n_jobs(n->queue);
    n->stats.queued_tokens = prefill_queue_n_tokens(n->queue) + n->running_tokens;
    load.queued_prefill_tokens = n->stats.queued_tokens;
    load.running_sequences = n->running_tokens > 0;
    load.recent_tokens_per_s = n->stats.recent_tokens_per_s;
    pthread_mutex_unlock(&n->lock);
    node_link_set_load(n->link, &load);
}

/* Take one message: queue jobs, note aborts. */
static void on_message(prefill_node_t *n, Tandem__Envelope *env)
{
    if (env->body_case == TANDEM__ENVELOPE__BODY_PREFILL_JOB) {
        if (prefill_queue_push(n->queue, env) == TDM_OK) {
            return; /* the queue owns it */
        }
    } else if (env->body_case == TANDEM__ENVELOPE__BODY_ABORT) {
        int n_dropped =
            prefill_queue_abort(n->queue, env->abort->request_id, env->abort->reservation_id);
        if (n_dropped > 0) {
            pthread_mutex_lock(&n->lock);
            n->stats.jobs_aborted_total += (uint64_t)n_dropped;
            pthread_mutex_unlock(&n->lock);
        }
    } else {
        tdm_log(TDM_LOG_WARN, "prefill", "unexpected message: type=%s",
                proto_type_name(env->body_case));
    }
    proto_envelope_free(env);
}

static void drain(prefill_node_t *n, uint32_t wait_ms)
{
    Tandem__Envelope *env = NULL;

    while (node_link_recv(n->link, wait_ms, &env) == TDM_OK) {
        on_message(n, env);
        wait_ms = 0;
    }
    publish(n);
}

static int job_aborted(void *arg, uint64_t request_id)
{
    prefill_node_t *n = arg;

    drain(n, 0);
    return g_stop_signal != 0 ||
           prefill_queue_is_aborted(n->queue, request_id, n->running_reservation_id);
}

static void send_error(prefill_node_t *n, uint64_t request_id, tdm_status_t status,
                       const char *message)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Error e = TANDEM__ERROR__INIT;

    e.request_id = request_id;
    e.code = status == TDM_ERR_PEER_LOST    ? TANDEM__ERROR_CODE__ERROR_PEER_LOST
             : status == TDM_ERR_NO_PAGES   ? TANDEM__ERROR_CODE__ERROR_NO_PAGES
             : status == TDM_ERR_FORMAT     ? TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE
                                            : TANDEM__ERROR_CODE__ERROR_INTERNAL;
    e.message = (char *)message;
    env.body_case = TANDEM__ENVELOPE__BODY_ERROR;
    env.error = &e;
    node_link_send(n->link, &env);
}

static void run_one(prefill_node_t *n, Tandem__Envelope *env)
{
    const Tandem__PrefillJob *job = env->prefill_job;
    prefill_job_env_t je = {n->model, n->kv, n->xfer, n->xpool, n->fwd, job_aborted, n};
    Tandem__CompletionNotice notice;
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
    prefill_job_report_t rep;
    char err[PREFILL_ERR_BYTES] = "";
    uint64_t t0 = tdm_clock_now_ns();
    tdm_status_t status;
    double ms;

    pthread_mutex_lock(&n->lock);
    n->running_tokens = job->n_delta_tokens;
    n->running_reservation_id = job->reservation_id;
    pthread_mutex_unlock(&n->lock);
    status = prefill_job_run(&je, job, &notice, &rep, err, sizeof(err));
    ms = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
    /* The counters first, then the notice: the router starts the decode on the notice, so a
     * client whose turn has ended reads this job on /metrics (sent first, the counters lagged
     * behind the whole decode whenever this thread lost the CPU right after the send). */
    pthread_mutex_lock(&n->lock);
    n->running_tokens = 0;
    n->stats.jobs_total++;
    n->stats.jobs_failed_total += status != TDM_OK && status != TDM_ERR_TIMEOUT;
    n->stats.jobs_aborted_total += status == TDM_ERR_TIMEOUT;
    if (status == TDM_OK) {
        n->stats.prefilled_tokens_total += rep.n_prefilled;
        n->stats.pulled_pages_total += rep.n_pulled;
        n->stats.put_pages_total += rep.n_put;
        n->stats.chunk_puts_total += rep.n_chunk_puts;
        n->stats.early_put_pages_total += rep.n_put_early;
        n->stats.last_job_s = ms / 1e3;
        n->stats.last_compute_s = (double)rep.compute_ns / TDM_NS_PER_S;
        n->stats.recent_tokens_per_s =
            rep.compute_ns > 0 ? (double)rep.n_prefilled * TDM_NS_PER_S / (double)rep.compute_ns
                               : 0.0;
    }
    pthread_mutex_unlock(&n->lock);
    if (status == TDM_OK) {
        out.body_case = TANDEM__ENVELOPE__BODY_COMPLETION;
        out.completion = &notice;
        node_link_send(n->link, &out);
        prefill_job_notice_fini(&notice);
        tdm_log(TDM_LOG_DEBUG, "prefill",
                "job done: request=%llu H=%llu tokens=%llu pulled=%u put=%u job_ms=%.1f "
                "compute_ms=%.1f",
                (unsigned long long)job->request_id, (unsigned long long)job->cached_len,
                (unsigned long long)rep.n_prefilled, rep.n_pulled, rep.n_put, ms,
                (double)rep.compute_ns / TDM_NS_PER_MS);
    } else if (status == TDM_ERR_TIMEOUT) {
        tdm_log(TDM_LOG_INFO, "prefill", "job aborted: request=%llu",
                (unsigned long long)job->request_id);
    } else {
        tdm_log(TDM_LOG_ERROR, "prefill", "job failed: request=%llu status=%s reason=\"%s\"",
                (unsigned long long)job->request_id, tdm_status_name(status), err);
        send_error(n, job->request_id, status, err);
    }
}

static int setup(prefill_node_t *n)
{
    char err[PREFILL_ERR_BYTES] = "";
    char host[PREFILL_HOST_BYTES];
    char endpoint[PREFILL_HOST_BYTES + 8];
    uint16_t port;
    engine_model_params_t mp;
    engine_fwd_params_t fp;
    xfer_context_params_t xp;
    xfer_pool_params_t pp;
    node_link_params_t lp;
    const engine_config_t *c;
    kern_kv_geometry_t geometry;
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = n->cfg.threads > 0 ? (int)n->cfg.threads : (n_cpu > 0 ? (int)n_cpu : 1);
    tdm_status_t status;

    if (node_http_parse_host_port(n->cfg.http, host, sizeof(host), &port) != 0) {
        fprintf(stderr, "tandem-prefill: --http=%s is invalid: expected HOST:PORT\n", n->cfg.http);
        return 2;
    }
    /* Checked before the model loads (minutes on a real fleet). */
    if (node_xfer_params("tandem-prefill", n->cfg.transports, n->cfg.ucx_protocols,
                         n->cfg.require_transport, &xp) != TDM_OK) {
        return 2;
    }
    node_link_make_id("prefill", n->id, sizeof(n->id));
    engine_model_params_default(&mp);
    mp.n_threads = threads;
    status = engine_model_load(n->cfg.model_dir, &mp, &n->model, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-prefill: loading %s: %s\n", n->cfg.model_dir, err);
        return 1;
    }
    c = engine_model_config(n->model);
    status =
        kern_kv_geometry((uint32_t)c->head_dim, (uint32_t)c->index_head_dim,
                         engine_config_max_kv_ratio(c), &geometry); /* valid: the model loaded */
    xp.name = n->id + (strlen(n->id) > 63 ? strlen(n->id) - 63 : 0);
    if (status == TDM_OK) {
        status = xfer_context_create(&xp, &n->xfer);
    }
    if (status == TDM_OK) {
        pp.page_size_bytes = geometry.page_bytes;
        pp.n_pages = n->cfg.pages;
        pp.mem_type = XFER_MEM_HOST;
        pp.base = NULL;
        status = xfer_pool_create(n->xfer, &pp, &n->xpool);
    }
    if (status == TDM_OK) {
        status = engine_kv_pool_create_in(c, engine_model_fingerprint(n->model), n->cfg.pages,
                                          xfer_pool_page(n->xpool, 0), &n->kv);
    }
    if (status == TDM_OK) {
        engine_fwd_params_default(n->model, &fp);
        fp.n_threads = threads;
        fp.max_chunk_tokens = n->cfg.chunk_tokens;
        status = engine_fwd_create(n->model, n->kv, &fp, &n->fwd);
    }
    if (status == TDM_OK) {
        status = prefill_queue_create(&n->queue);
    }
    if (status == TDM_OK) {
        status = node_http_create(host, port, render, n, &n->http);
    }
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-prefill: setup failed: %s\n", tdm_status_message(status));
        return 1;
    }
    snprintf(endpoint, sizeof(endpoint), "%s:%u", host, (unsigned)node_http_port(n->http));
    memset(&lp, 0, sizeof(lp));
    lp.model_fingerprint = engine_model_fingerprint(n->model); /* = the router's (PROTOCOL.md) */
    lp.router_endpoint = n->cfg.router;
    lp.role = TANDEM__ROLE__ROLE_PREFILL;
    lp.incarnation_id = n->id;
    lp.rack = n->cfg.rack;
    lp.node = host;
    lp.page_bytes = geometry.page_bytes;
    lp.tokens_per_block = geometry.tokens_per_block;
    lp.max_context = (uint32_t)c->max_position_embeddings;
    lp.max_sequences = 1;
    lp.max_batch_tokens = n->cfg.chunk_tokens;
    lp.http_endpoint = endpoint;
    lp.register_timeout_ms = n->cfg.register_timeout_ms;
    status = node_link_create(&lp, &n->link, err, sizeof(err));
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "prefill", "cannot join the cluster: %s", err);
        fprintf(stderr, "tandem-prefill: %s\n", err);
        return status == TDM_ERR_MISMATCH ? PREFILL_EXIT_REFUSED : 1;
    }
    pthread_mutex_lock(&n->lock);
    n->ready = 1;
    pthread_mutex_unlock(&n->lock);
    tdm_log(TDM_LOG_INFO, "prefill", "serving: id=%s http=%s pages=%u threads=%d", n->id,
            endpoint, n->cfg.pages, threads);
    return 0;
}

static void run(prefill_node_t *n)
{
    while (g_stop_signal == 0) {
        Tandem__Envelope *env = prefill_queue_pop(n->queue);

        if (env != NULL) {
            publish(n);
            run_one(n, env);
            proto_envelope_free(env);
            continue;
        }
        xfer_context_progress(n->xfer);
        drain(n, PREFILL_IDLE_MS);
    }
}

int main(int argc, char **argv)
{
    static const char summary[] = "Tandem prefill node: CED prefill jobs with UCX page transfer";
    prefill_node_t node;
    const tdm_main_spec_t spec = {"tandem-prefill", summary, prefill_flags,
                                  sizeof(prefill_flags) / sizeof(prefill_flags[0]),
                                  offsetof(prefill_cfg_t, log_level)};
    tdm_flags_action_t action;
    int rc;

    memset(&node, 0, sizeof(node));
    pthread_mutex_init(&node.lock, NULL);
    if (tdm_main_start(&spec, argc, argv, &node.cfg, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    if (tdm_signals_install(on_signal, TDM_SIGNALS_IGNORE_PIPE) != TDM_OK) {
        return 1;
    }
    rc = setup(&node);
    if (rc == 0) {
        run(&node);
        tdm_log(TDM_LOG_INFO, "prefill", "stopping: signal=%d", (int)g_stop_signal);
    }
    node_http_destroy(node.http);
    node_link_destroy(node.link, rc == 0 ? "shutting down" : NULL);
    prefill_queue_destroy(node.queue);
    engine_fwd_destroy(node.fwd);
    engine_kv_pool_destroy(node.kv);
    xfer_pool_destroy(node.xpool);
    xfer_context_destroy(node.xfer);
    engine_model_destroy(node.model);
    pthread_mutex_destroy(&node.lock);
    return rc;
}
