/* prefill.c - one prefill node from its flags to its Goodbye (prefill.h). */
#include "prefill-node/prefill.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/prom.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "prefill-node/history.h"
#include "prefill-node/job.h"
#include "prefill-node/queue.h"
#include "transfer/context.h"
#include "transfer/pool.h"

#define PREFILL_ERR_BYTES    512
#define PREFILL_FIELDS_BYTES 64
#define PREFILL_IDLE_MS      100u

/* Counters for /metrics (written by the compute thread under `lock`). */
typedef struct {
    uint64_t jobs_total;
    uint64_t jobs_failed_total;
    uint64_t jobs_aborted_total;
    uint64_t prefilled_tokens_total;
    uint64_t pulled_pages_total;
    uint64_t history_bytes_pulled_total; /* history page bytes got from decode nodes */
    uint64_t history_bytes_total;        /* history page bytes the jobs needed (pulled + cached) */
    prefill_history_stats_t history;     /* the cache's counters and sizes */
    uint64_t put_pages_total;
    uint64_t chunk_puts_total;      /* put batches posted while a prefill computed */
    uint64_t early_put_pages_total; /* pages they carried */
    uint32_t queued_jobs;
    uint64_t queued_tokens;
    double last_job_s;
    double last_compute_s;
    double recent_tokens_per_s;
} prefill_stats_t;

/* Process state, made in prefill_node_run and passed down. */
typedef struct {
    const prefill_node_params_t *params;
    node_worker_t worker; /* model, transfer context, /health + /metrics, link */
    xfer_pool_t *xpool;
    engine_kv_pool_t *kv;
    engine_fwd_t *fwd;
    prefill_history_t *history;
    uint64_t *history_keys; /* [PREFILL_HISTORY_MAX_SESSIONS] scratch for the heartbeat hint */
    prefill_queue_t *queue;
    int ready;
    pthread_mutex_t lock;
    prefill_stats_t stats;
    uint64_t running_tokens;
    /* The running job (compute thread only): an Abort naming it sets running_aborted; once its
     * one answer (CompletionNotice, Error or AbortAck) is sent, running_answered. */
    const Tandem__PrefillJob *running;
    uint64_t running_epoch; /* the link's lease epoch the job arrived in (node_link.h) */
    int running_aborted;
    int running_answered;
} prefill_node_t;

/* The node's /metrics families (node_worker_families_fn); arg: a prefill_stats_t snapshot. */
static void render_families(void *arg, tdm_prom_t *p)
{
    const prefill_stats_t *st = arg;

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
    tdm_prom_counter(p, "tandem_prefill_history_bytes_pulled_total",
                     "history page bytes pulled from decode nodes (pages below H not in the "
                     "history cache)",
                     st->history_bytes_pulled_total);
    tdm_prom_counter(p, "tandem_prefill_history_bytes_total",
                     "history page bytes the jobs needed (pulled or from the history cache: what "
                     "a node without the cache pulls)",
                     st->history_bytes_total);
    tdm_prom_counter(p, "tandem_prefill_history_cache_hits_total",
                     "history pages taken from the history cache", st->history.hit_pages_total);
    tdm_prom_counter(p, "tandem_prefill_history_cache_misses_total",
                     "history pages pulled (not held, changed on the decode node, or not checked)",
                     st->history.miss_pages_total);
    tdm_prom_counter(p, "tandem_prefill_history_cache_evictions_total",
                     "sessions evicted from the history cache for room",
                     st->history.evictions_total);
    tdm_prom_gauge(p, "tandem_prefill_history_cache_bytes", "page bytes in the history cache",
                   (double)st->history.bytes);
    tdm_prom_gauge(p, "tandem_prefill_history_cache_sessions",
                   "sessions whose pages the history cache holds", st->history.sessions);
    tdm_prom_gauge(p, "tandem_prefill_history_cache_max_bytes",
                   "history cache budget (--history-cache-mb; 0: off)",
                   (double)st->history.max_bytes);
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
}

static int render(void *arg, node_http_page_t page, char **body_out)
{
    prefill_node_t *n = arg;
    prefill_stats_t st;
    char fields[PREFILL_FIELDS_BYTES];
    int ready;

    pthread_mutex_lock(&n->lock);
    st = n->stats;
    ready = n->ready;
    pthread_mutex_unlock(&n->lock);
    snprintf(fields, sizeof(fields), "\"queued_jobs\":%u", st.queued_jobs);
    return node_worker_render(&n->worker, page, ready, fields, render_families, &st, body_out);
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
    node_link_set_load(n->worker.link, &load);
    /* a loop pass or a job's phase boundary completed: liveness from progress (node_progress.h) */
    node_progress_step(&n->worker.progress,
                       n->stats.queued_jobs + (n->running_tokens > 0 ? 1u : 0u));
}

static void send_env(prefill_node_t *n, Tandem__Envelope *env)
{
    if (node_link_send(n->worker.link, env) != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "prefill", "answer not sent: type=%s",
                proto_type_name(env->body_case));
    }
}

/* The answer of a job that stopped after an Abort: it puts nothing more (docs/PROTOCOL.md 4a). */
static void send_abort_ack(prefill_node_t *n, const Tandem__PrefillJob *job, uint64_t pages_put)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__AbortAck ack = TANDEM__ABORT_ACK__INIT;

    ack.request_id = job->request_id;
    ack.reservation_id = job->reservation_id;
    ack.attempt = job->attempt;
    ack.pages_put = pages_put;
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT_ACK;
    env.abort_ack = &ack;
    send_env(n, &env);
    tdm_log(TDM_LOG_DEBUG, "prefill", "abort acknowledged: request=%llu attempt=%u pages_put=%llu",
            (unsigned long long)job->request_id, job->attempt, (unsigned long long)pages_put);
}

static void send_error(prefill_node_t *n, const Tandem__PrefillJob *job, tdm_status_t status,
                       Tandem__ErrorCode code, const char *message)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Error e = TANDEM__ERROR__INIT;

    e.request_id = job->request_id;
    e.attempt = job->attempt;
    e.code = code != TANDEM__ERROR_CODE__ERROR_UNSPECIFIED ? code
             : status == TDM_ERR_PEER_LOST                 ? TANDEM__ERROR_CODE__ERROR_PEER_LOST
             : status == TDM_ERR_NO_PAGES                  ? TANDEM__ERROR_CODE__ERROR_NO_PAGES
             : status == TDM_ERR_FORMAT                    ? TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE
                                                           : TANDEM__ERROR_CODE__ERROR_INTERNAL;
    e.message = (char *)message;
    env.body_case = TANDEM__ENVELOPE__BODY_ERROR;
    env.error = &e;
    send_env(n, &env);
}

static void count_aborted(prefill_node_t *n, uint64_t n_jobs)
{
    pthread_mutex_lock(&n->lock);
    n->stats.jobs_aborted_total += n_jobs;
    pthread_mutex_unlock(&n->lock);
}

/* A queued job an Abort dropped: acknowledged (it never put anything). */
static void on_dropped(void *arg, const Tandem__PrefillJob *job)
{
    prefill_node_t *n = arg;

    send_abort_ack(n, job, 0);
    count_aborted(n, 1);
}

/* The running job stopped (an Abort named it, its lease ended, or the node is stopping) and has
 * nothing in flight: its one answer, AbortAck for an abort, ERROR_ABORTED for a lost lease,
 * ERROR_DRAINING for a stop signal. */
static void answer_stopped(prefill_node_t *n, uint64_t pages_put)
{
    if (n->running == NULL || n->running_answered) {
        return;
    }
    n->running_answered = 1;
    if (n->running_aborted || prefill_queue_is_aborted(n->queue, n->running)) {
        send_abort_ack(n, n->running, pages_put);
    } else if (!node_link_lease_valid(n->worker.link, n->running_epoch)) {
        send_error(n, n->running, TDM_ERR_TIMEOUT, TANDEM__ERROR_CODE__ERROR_ABORTED,
                   "the prefill node stood still past the router's heartbeat timeout: its job "
                   "may have been retried elsewhere");
    } else {
        send_error(n, n->running, TDM_ERR_TIMEOUT, TANDEM__ERROR_CODE__ERROR_DRAINING,
                   "the prefill node is stopping");
    }
}

/* Take one message: queue jobs, apply aborts. Every job taken is answered exactly once. */
static void on_message(prefill_node_t *n, Tandem__Envelope *env)
{
    if (env->body_case == TANDEM__ENVELOPE__BODY_PREFILL_JOB) {
        if (prefill_queue_is_aborted(n->queue, env->prefill_job)) {
            on_dropped(n, env->prefill_job); /* its abort came first */
        } else if (prefill_queue_push(n->queue, env, node_link_recv_epoch(n->worker.link)) ==
                   TDM_OK) {
            return; /* the queue owns it */
        } else {
            send_error(n, env->prefill_job, TDM_ERR_NO_MEMORY, TANDEM__ERROR_CODE__ERROR_BUSY,
                       "out of memory queueing the job");
        }
    } else if (env->body_case == TANDEM__ENVELOPE__BODY_ABORT) {
        prefill_abort_t a = {env->abort->request_id, env->abort->reservation_id,
                             env->abort->attempt};
        int n_dropped = prefill_queue_abort(n->queue, &a, on_dropped, n);
        if (n->running != NULL && !n->running_answered && prefill_abort_names(&a, n->running)) {
            n->running_aborted = 1; /* seen at its next layer boundary */
        } else if (n_dropped == 0) {
            tdm_log(TDM_LOG_DEBUG, "prefill",
                    "abort names no job here (answered already): request=%llu attempt=%u",
                    (unsigned long long)a.request_id, a.attempt);
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

    while (node_link_recv(n->worker.link, wait_ms, &env) == TDM_OK) {
        on_message(n, env);
        wait_ms = 0;
    }
    publish(n);
}

static int job_aborted(void *arg, uint64_t request_id)
{
    prefill_node_t *n = arg;

    (void)request_id; /* the running job's keys are n->running's */
    drain(n, 0);
    return node_worker_stop_signal() != 0 || n->running_aborted ||
           (n->running != NULL && prefill_queue_is_aborted(n->queue, n->running)) ||
           !node_link_lease_valid(n->worker.link, n->running_epoch);
}

/* The job stopped putting mid-compute: answer now, before the rest of its compute. */
static void job_fenced(void *arg, uint32_t pages_put)
{
    answer_stopped(arg, pages_put);
}

static void run_one(prefill_node_t *n, Tandem__Envelope *env, uint64_t epoch)
{
    const Tandem__PrefillJob *job = env->prefill_job;
    prefill_job_env_t je = {n->worker.model,
                            n->kv,
                            n->worker.xfer,
                            n->xpool,
                            n->fwd,
                            job_aborted,
                            n,
                            job_fenced,
                            n->worker.constrain_vocab,
                            &n->worker.progress,
                            n->history};
    Tandem__CompletionNotice notice;
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
    prefill_job_report_t rep;
    char err[PREFILL_ERR_BYTES] = "";
    uint64_t t0 = tdm_clock_now_ns();
    tdm_status_t status;
    double ms;

    pthread_mutex_lock(&n->lock);
    n->running_tokens = job->n_delta_tokens;
    pthread_mutex_unlock(&n->lock);
    n->running = job;
    n->running_epoch = epoch;
    n->running_aborted = 0;
    n->running_answered = 0;
    if (!node_link_lease_valid(n->worker.link, epoch)) {
        /* it came before a pause that may have cost this node its registration */
        tdm_log(TDM_LOG_WARN, "prefill", "job void (lease lost): request=%llu attempt=%u",
                (unsigned long long)job->request_id, job->attempt);
        pthread_mutex_lock(&n->lock);
        n->running_tokens = 0;
        n->stats.jobs_total++;
        n->stats.jobs_aborted_total++;
        pthread_mutex_unlock(&n->lock);
        answer_stopped(n, 0);
        n->running = NULL;
        return;
    }
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
    prefill_history_stats(n->history, &n->stats.history);
    n->stats.history_bytes_pulled_total += (uint64_t)rep.n_pulled * n->worker.page_bytes;
    n->stats.history_bytes_total += (uint64_t)rep.n_history * n->worker.page_bytes;
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
    if (n->history != NULL) { /* the router prefers this node for the sessions it holds */
        node_link_set_history_sessions(
            n->worker.link, n->history_keys,
            prefill_history_sessions(n->history, n->history_keys, PREFILL_HISTORY_MAX_SESSIONS));
    }
    if (status == TDM_OK && n->running_answered) {
        prefill_job_notice_fini(&notice); /* stopped mid-compute and acknowledged already */
    } else if (status == TDM_OK) {
        n->running_answered = 1;
        notice.attempt = job->attempt;
        out.body_case = TANDEM__ENVELOPE__BODY_COMPLETION;
        out.completion = &notice;
        send_env(n, &out);
        prefill_job_notice_fini(&notice);
        tdm_log(TDM_LOG_DEBUG, "prefill",
                "job done: request=%llu H=%llu tokens=%llu pulled=%u put=%u job_ms=%.1f "
                "compute_ms=%.1f",
                (unsigned long long)job->request_id, (unsigned long long)job->cached_len,
                (unsigned long long)rep.n_prefilled, rep.n_pulled, rep.n_put, ms,
                (double)rep.compute_ns / TDM_NS_PER_MS);
    } else if (status == TDM_ERR_TIMEOUT) {
        tdm_log(TDM_LOG_INFO, "prefill", "job aborted: request=%llu attempt=%u pages_put=%u",
                (unsigned long long)job->request_id, job->attempt, rep.n_put);
        answer_stopped(n, rep.n_put);
    } else {
        tdm_log(TDM_LOG_ERROR, "prefill", "job failed: request=%llu status=%s reason=\"%s\"",
                (unsigned long long)job->request_id, tdm_status_name(status), err);
        if (!n->running_answered) {
            n->running_answered = 1;
            send_error(n, job, status, TANDEM__ERROR_CODE__ERROR_UNSPECIFIED, err);
        }
    }
    n->running = NULL;
}

static int setup(prefill_node_t *n)
{
    const prefill_node_params_t *cfg = n->params;
    node_worker_t *w = &n->worker;
    engine_fwd_params_t fp;
    xfer_pool_params_t pp;
    node_worker_join_t join;
    int rc;
    tdm_status_t status;

    rc = node_worker_open(w, &cfg->worker, "tandem-prefill", "prefill", TANDEM__ROLE__ROLE_PREFILL);
    if (rc == NODE_EXIT_OK) {
        rc = node_worker_load(w);
    }
    if (rc != NODE_EXIT_OK) {
        return rc;
    }
    pp.page_size_bytes = w->page_bytes;
    pp.n_pages = cfg->pages;
    pp.mem_type = XFER_MEM_HOST;
    pp.base = NULL;
    status = xfer_pool_create(w->xfer, &pp, &n->xpool);
    if (status == TDM_OK) {
        status = engine_kv_pool_create_in(w->config, engine_model_fingerprint(w->model), cfg->pages,
                                          xfer_pool_page(n->xpool, 0), &n->kv);
    }
    if (status == TDM_OK) {
        engine_fwd_params_default(w->model, &fp);
        fp.n_threads = w->n_threads;
        fp.max_chunk_tokens = cfg->worker.chunk_tokens;
        status = engine_fwd_create(w->model, n->kv, &fp, &n->fwd);
    }
    if (status == TDM_OK && cfg->history_cache_mb > 0) {
        status = prefill_history_create(w->config, engine_model_fingerprint(w->model),
                                        engine_kv_pool_page_bytes(n->kv),
                                        (uint64_t)cfg->history_cache_mb << 20, &n->history);
        n->history_keys =
            status == TDM_OK ? malloc(PREFILL_HISTORY_MAX_SESSIONS * sizeof(uint64_t)) : NULL;
        status = status == TDM_OK && n->history_keys == NULL ? TDM_ERR_NO_MEMORY : status;
    }
    if (status == TDM_OK) {
        status = prefill_queue_create(&n->queue);
    }
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-prefill: setup failed: %s\n", tdm_status_message(status));
        return NODE_EXIT_FAILED;
    }
    memset(&join, 0, sizeof(join));
    join.render = render;
    join.render_arg = n;
    join.max_sequences = 1;
    join.kv_pages = cfg->pages; /* one job's history and new pages: Capacity.max_tokens */
    rc = node_worker_join(w, &join);
    if (rc != NODE_EXIT_OK) {
        return rc;
    }
    pthread_mutex_lock(&n->lock);
    n->ready = 1;
    pthread_mutex_unlock(&n->lock);
    tdm_log(TDM_LOG_INFO, "prefill",
            "serving: id=%s http=%s pages=%u threads=%d history_cache_mb=%u", w->id, w->endpoint,
            cfg->pages, w->n_threads, cfg->history_cache_mb);
    return NODE_EXIT_OK;
}

static void run(prefill_node_t *n)
{
    while (node_worker_stop_signal() == 0) {
        uint64_t epoch = 0;
        Tandem__Envelope *env = prefill_queue_pop(n->queue, &epoch);

        if (env != NULL) {
            publish(n);
            run_one(n, env, epoch);
            proto_envelope_free(env);
            continue;
        }
        xfer_context_progress(n->worker.xfer);
        drain(n, PREFILL_IDLE_MS);
    }
    /* Every job taken is answered: the queued ones go back to the router for another node. */
    for (Tandem__Envelope *env; (env = prefill_queue_pop(n->queue, NULL)) != NULL;) {
        send_error(n, env->prefill_job, TDM_ERR_TIMEOUT, TANDEM__ERROR_CODE__ERROR_DRAINING,
                   "the prefill node is stopping");
        proto_envelope_free(env);
    }
    publish(n);
}

int prefill_node_run(const prefill_node_params_t *params)
{
    prefill_node_t node;
    int rc;

    memset(&node, 0, sizeof(node));
    node.params = params;
    pthread_mutex_init(&node.lock, NULL);
    rc = setup(&node);
    if (rc == NODE_EXIT_OK) {
        run(&node);
        tdm_log(TDM_LOG_INFO, "prefill", "stopping: signal=%d", node_worker_stop_signal());
    }
    node_worker_leave(&node.worker, rc == NODE_EXIT_OK ? "shutting down" : NULL);
    prefill_queue_destroy(node.queue);
    prefill_history_destroy(node.history);
    free(node.history_keys);
    engine_fwd_destroy(node.fwd);
    engine_kv_pool_destroy(node.kv);
    xfer_pool_destroy(node.xpool);
    node_worker_close(&node.worker);
    pthread_mutex_destroy(&node.lock);
    return rc;
}
