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
    uint32_t running_jobs;
    uint32_t free_pages;          /* local page pool */
    uint64_t staged_pages_total;  /* node_pages_n_downloaded: device -> host staging copies */
    uint64_t steps_total;         /* batched prefill steps (engine calls) */
    uint64_t step_jobs_total;     /* jobs those steps carried, summed (mean batch = / steps) */
    double compute_seconds_total; /* time in the steps' engine calls */
    double busy_seconds_total;    /* wall time with at least one job started */
    double start_seconds_total;   /* job starts: pull, import, replay */
    double finish_seconds_total;  /* job finishes: sampling, last puts, record, notice */
} prefill_stats_t;

typedef struct prefill_node prefill_node_t;

/* One job the node has taken off the queue (started or starting), oldest first in the node's
 * slot list. */
typedef struct {
    prefill_node_t *node;
    Tandem__Envelope *env; /* owned: its PrefillJob is borrowed by `job` */
    uint64_t epoch;        /* the link's lease epoch the job arrived in (node_link.h) */
    prefill_job_t *job;    /* NULL while starting */
    uint64_t t0;
    int aborted;  /* an Abort named it (seen at its next layer boundary) */
    int answered; /* its one answer (CompletionNotice, Error or AbortAck) is sent */
} prefill_slot_t;

/* Process state, made in prefill_node_run and passed down. */
struct prefill_node {
    const prefill_node_params_t *params;
    node_worker_t worker; /* model, transfer context, /health + /metrics, link */
    xfer_pool_t *xpool;   /* node_pages_xfer(pages) */
    node_pages_t *pages;  /* the engine pool and its transfer pages */
    engine_kv_pool_t *kv;
    engine_fwd_t *fwd;
    prefill_history_t *history;
    uint64_t *history_keys; /* [PREFILL_HISTORY_MAX_SESSIONS] scratch for the heartbeat hint */
    prefill_queue_t *queue;
    prefill_job_env_t je; /* what every job borrows */
    int ready;
    pthread_mutex_t lock;
    prefill_stats_t stats;
    uint64_t running_tokens;
    /* The jobs taken (compute thread only), oldest first: each steps until its delta is
     * computed, then finishes and leaves. */
    prefill_slot_t *slots[ENGINE_FWD_MAX_BATCH];
    int n_slots;
};

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
                   "prefill throughput of the last step (all its jobs), tokens per second",
                   st->recent_tokens_per_s);
    tdm_prom_gauge(p, "tandem_prefill_running_jobs", "prefill jobs started and not finished",
                   st->running_jobs);
    tdm_prom_counter(p, "tandem_prefill_staged_pages_total",
                     "KV pages copied from the device into their host staging copies (put, or "
                     "kept in the history cache; 0 with --device cpu: docs/GPU.md 7)",
                     st->staged_pages_total);
    tdm_prom_gauge(p, "tandem_prefill_free_pages",
                   "pages free in the local pool (all of --pages when no job runs)",
                   st->free_pages);
    tdm_prom_counter(p, "tandem_prefill_steps_total",
                     "prefill steps (one batched engine call over the running jobs)",
                     st->steps_total);
    tdm_prom_counter(p, "tandem_prefill_step_jobs_total",
                     "jobs the prefill steps carried, summed over the steps", st->step_jobs_total);
    tdm_prom_family(p, "tandem_prefill_compute_seconds_total", TDM_PROM_COUNTER,
                    "time in the prefill steps' engine calls");
    tdm_prom_sample(p, NULL, 0, st->compute_seconds_total);
    tdm_prom_family(p, "tandem_prefill_busy_seconds_total", TDM_PROM_COUNTER,
                    "wall time with at least one prefill job started (tokens_total / this = "
                    "the node's prefill tokens per busy second)");
    tdm_prom_sample(p, NULL, 0, st->busy_seconds_total);
    tdm_prom_family(p, "tandem_prefill_start_seconds_total", TDM_PROM_COUNTER,
                    "time in job starts (history pull, import, ring replay)");
    tdm_prom_sample(p, NULL, 0, st->start_seconds_total);
    tdm_prom_family(p, "tandem_prefill_finish_seconds_total", TDM_PROM_COUNTER,
                    "time in job finishes (sampling, last puts, state record, notice)");
    tdm_prom_sample(p, NULL, 0, st->finish_seconds_total);
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
    n->stats.running_jobs = (uint32_t)n->n_slots;
    n->stats.free_pages = n->kv != NULL ? engine_kv_pool_n_free(n->kv) : 0;
    n->stats.staged_pages_total = n->pages != NULL ? node_pages_n_downloaded(n->pages) : 0;
    load.queued_prefill_tokens = n->stats.queued_tokens;
    load.running_sequences = (uint32_t)n->n_slots;
    load.recent_tokens_per_s = n->stats.recent_tokens_per_s;
    pthread_mutex_unlock(&n->lock);
    node_link_set_load(n->worker.link, &load);
    /* a loop pass or a job's phase boundary completed: liveness from progress (node_progress.h) */
    node_progress_step(&n->worker.progress, n->stats.queued_jobs + (uint32_t)n->n_slots);
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

/* A taken job stopped (an Abort named it, its lease ended, or the node is stopping) and has
 * nothing in flight: its one answer, AbortAck for an abort, ERROR_ABORTED for a lost lease,
 * ERROR_DRAINING for a stop signal. */
static void answer_stopped(prefill_node_t *n, prefill_slot_t *slot, uint64_t pages_put)
{
    const Tandem__PrefillJob *job = slot->env->prefill_job;

    if (slot->answered) {
        return;
    }
    slot->answered = 1;
    if (slot->aborted || prefill_queue_is_aborted(n->queue, job)) {
        send_abort_ack(n, job, pages_put);
    } else if (!node_link_lease_valid(n->worker.link, slot->epoch)) {
        send_error(n, job, TDM_ERR_TIMEOUT, TANDEM__ERROR_CODE__ERROR_ABORTED,
                   "the prefill node stood still past the router's heartbeat timeout: its job "
                   "may have been retried elsewhere");
    } else {
        send_error(n, job, TDM_ERR_TIMEOUT, TANDEM__ERROR_CODE__ERROR_DRAINING,
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
        int n_named = 0;
        for (int i = 0; i < n->n_slots; i++) {
            prefill_slot_t *slot = n->slots[i];
            if (!slot->answered && prefill_abort_names(&a, slot->env->prefill_job)) {
                slot->aborted = 1; /* seen at its next layer boundary */
                n_named++;
            }
        }
        if (n_dropped == 0 && n_named == 0) {
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

static int job_aborted(void *arg, void *job_user)
{
    prefill_node_t *n = arg;
    prefill_slot_t *slot = job_user;

    drain(n, 0);
    return node_worker_stop_signal() != 0 || slot->aborted ||
           prefill_queue_is_aborted(n->queue, slot->env->prefill_job) ||
           !node_link_lease_valid(n->worker.link, slot->epoch);
}

/* A job stopped putting mid-compute: answer now, before the rest of its compute. */
static void job_fenced(void *arg, void *job_user, uint32_t pages_put)
{
    answer_stopped(arg, job_user, pages_put);
}

static void set_running_tokens(prefill_node_t *n)
{
    uint64_t tokens = 0;

    for (int i = 0; i < n->n_slots; i++) {
        tokens += n->slots[i]->env->prefill_job->n_delta_tokens;
    }
    pthread_mutex_lock(&n->lock);
    n->running_tokens = tokens;
    pthread_mutex_unlock(&n->lock);
}

/* Take slot i out of the list (the order of the others kept) and free it. */
static void slot_remove(prefill_node_t *n, int i)
{
    prefill_slot_t *slot = n->slots[i];

    memmove(&n->slots[i], &n->slots[i + 1], (size_t)(n->n_slots - i - 1) * sizeof(n->slots[0]));
    n->n_slots--;
    prefill_job_destroy(slot->job); /* its pages back to the pool */
    proto_envelope_free(slot->env);
    free(slot);
    set_running_tokens(n);
}

/* The one answer of a job that ended with `status` (finish or a failed start). The counters
 * first, then the notice: the router starts the decode on the notice, so a client whose turn has
 * ended reads this job on /metrics (sent first, the counters lagged behind the whole decode
 * whenever this thread lost the CPU right after the send). */
static void answer_job(prefill_node_t *n, prefill_slot_t *slot, tdm_status_t status,
                       Tandem__CompletionNotice *notice, const prefill_job_report_t *rep,
                       const char *err)
{
    const Tandem__PrefillJob *job = slot->env->prefill_job;
    Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
    double ms = (double)(tdm_clock_now_ns() - slot->t0) / TDM_NS_PER_MS;

    pthread_mutex_lock(&n->lock);
    n->stats.jobs_total++;
    n->stats.jobs_failed_total += status != TDM_OK && status != TDM_ERR_TIMEOUT;
    n->stats.jobs_aborted_total += status == TDM_ERR_TIMEOUT;
    prefill_history_stats(n->history, &n->stats.history);
    n->stats.history_bytes_pulled_total += (uint64_t)rep->n_pulled * n->worker.page_bytes;
    n->stats.history_bytes_total += (uint64_t)rep->n_history * n->worker.page_bytes;
    if (status == TDM_OK) {
        n->stats.prefilled_tokens_total += rep->n_prefilled;
        n->stats.pulled_pages_total += rep->n_pulled;
        n->stats.put_pages_total += rep->n_put;
        n->stats.chunk_puts_total += rep->n_chunk_puts;
        n->stats.early_put_pages_total += rep->n_put_early;
        n->stats.last_job_s = ms / 1e3;
        n->stats.last_compute_s = (double)rep->compute_ns / TDM_NS_PER_S;
    }
    pthread_mutex_unlock(&n->lock);
    if (n->history != NULL) { /* the router prefers this node for the sessions it holds */
        node_link_set_history_sessions(
            n->worker.link, n->history_keys,
            prefill_history_sessions(n->history, n->history_keys, PREFILL_HISTORY_MAX_SESSIONS));
    }
    if (status == TDM_OK && slot->answered) {
        prefill_job_notice_fini(notice); /* stopped mid-compute and acknowledged already */
    } else if (status == TDM_OK) {
        slot->answered = 1;
        notice->attempt = job->attempt;
        out.body_case = TANDEM__ENVELOPE__BODY_COMPLETION;
        out.completion = notice;
        send_env(n, &out);
        prefill_job_notice_fini(notice);
        tdm_log(TDM_LOG_DEBUG, "prefill",
                "job done: request=%llu H=%llu tokens=%llu pulled=%u put=%u job_ms=%.1f "
                "compute_ms=%.1f",
                (unsigned long long)job->request_id, (unsigned long long)job->cached_len,
                (unsigned long long)rep->n_prefilled, rep->n_pulled, rep->n_put, ms,
                (double)rep->compute_ns / TDM_NS_PER_MS);
    } else if (status == TDM_ERR_TIMEOUT) {
        tdm_log(TDM_LOG_INFO, "prefill", "job aborted: request=%llu attempt=%u pages_put=%u",
                (unsigned long long)job->request_id, job->attempt, rep->n_put);
        answer_stopped(n, slot, rep->n_put);
    } else {
        tdm_log(TDM_LOG_ERROR, "prefill", "job failed: request=%llu status=%s reason=\"%s\"",
                (unsigned long long)job->request_id, tdm_status_name(status), err);
        if (!slot->answered) {
            slot->answered = 1;
            send_error(n, job, status, TANDEM__ERROR_CODE__ERROR_UNSPECIFIED, err);
        }
    }
}

/* Finish the job of slot i (computed, failed or stopped), answer it and free the slot. */
static void slot_end(prefill_node_t *n, int i)
{
    prefill_slot_t *slot = n->slots[i];
    Tandem__CompletionNotice notice;
    prefill_job_report_t rep;
    char err[PREFILL_ERR_BYTES] = "";
    tdm_status_t status;

    uint64_t t0 = tdm_clock_now_ns();

    memset(&rep, 0, sizeof(rep));
    status = prefill_job_finish(slot->job, &notice, &rep, err, sizeof(err));
    pthread_mutex_lock(&n->lock);
    n->stats.finish_seconds_total += (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_S;
    pthread_mutex_unlock(&n->lock);
    answer_job(n, slot, status, &notice, &rep, err);
    slot_remove(n, i);
}

/* Take the oldest queued job: a slot, then its start (pull, import, replay). A job whose start
 * fails is answered at once. */
static void slot_start(prefill_node_t *n, Tandem__Envelope *env, uint64_t epoch)
{
    prefill_slot_t *slot = calloc(1, sizeof(*slot));
    prefill_job_report_t rep;
    char err[PREFILL_ERR_BYTES] = "";
    tdm_status_t status;

    if (slot == NULL) {
        send_error(n, env->prefill_job, TDM_ERR_NO_MEMORY, TANDEM__ERROR_CODE__ERROR_BUSY,
                   "out of memory starting the job");
        proto_envelope_free(env);
        return;
    }
    slot->node = n;
    slot->env = env;
    slot->epoch = epoch;
    slot->t0 = tdm_clock_now_ns();
    n->slots[n->n_slots++] = slot; /* an Abort during the pull finds it */
    set_running_tokens(n);
    publish(n);
    memset(&rep, 0, sizeof(rep));
    if (!node_link_lease_valid(n->worker.link, epoch)) {
        /* it came before a pause that may have cost this node its registration */
        tdm_log(TDM_LOG_WARN, "prefill", "job void (lease lost): request=%llu attempt=%u",
                (unsigned long long)env->prefill_job->request_id, env->prefill_job->attempt);
        status = TDM_ERR_TIMEOUT;
    } else {
        status = prefill_job_start(&n->je, env->prefill_job, slot, &slot->job, err, sizeof(err));
        pthread_mutex_lock(&n->lock);
        n->stats.start_seconds_total += (double)(tdm_clock_now_ns() - slot->t0) / TDM_NS_PER_S;
        pthread_mutex_unlock(&n->lock);
    }
    if (status != TDM_OK) {
        answer_job(n, slot, status, NULL, &rep, err);
        slot_remove(n, n->n_slots - 1);
    }
}

/* Pages free for a new job beside what the running ones will still reserve. */
static uint32_t pages_for_new(const prefill_node_t *n)
{
    uint32_t free_pages = engine_kv_pool_n_free(n->kv);
    uint32_t to_come = 0;

    for (int i = 0; i < n->n_slots; i++) {
        to_come += prefill_job_pages_to_come(n->slots[i]->job);
    }
    return free_pages > to_come ? free_pages - to_come : 0;
}

/* Start queued jobs, oldest first, while there is a slot and, beside the running jobs, room in
 * the page pool for the whole job (a job alone always starts: it fails NO_PAGES if the pool is
 * too small, as one job at a time did). */
static void admit(prefill_node_t *n)
{
    uint32_t max_jobs = n->params->max_jobs > 0 ? n->params->max_jobs : 1;

    while ((uint32_t)n->n_slots < max_jobs && node_worker_stop_signal() == 0) {
        const Tandem__Envelope *next = prefill_queue_peek(n->queue);
        uint64_t epoch = 0;
        Tandem__Envelope *env;

        if (next == NULL ||
            (n->n_slots > 0 && prefill_job_pages_needed(next->prefill_job) > pages_for_new(n))) {
            return;
        }
        env = prefill_queue_pop(n->queue, &epoch);
        slot_start(n, env, epoch);
    }
}

/* One step over every started job (one batched engine call), then the jobs that are done leave:
 * finished, answered, freed. */
static void step(prefill_node_t *n)
{
    prefill_job_t *jobs[ENGINE_FWD_MAX_BATCH];
    int64_t n_tokens = 0;
    uint64_t t0 = tdm_clock_now_ns(), dt;
    int n_jobs = 0, n_stepping = 0;

    for (int i = 0; i < n->n_slots; i++) {
        jobs[n_jobs++] = n->slots[i]->job;
        n_stepping += prefill_job_rows_left(n->slots[i]->job) > 0;
    }
    if (n_stepping > 0) {
        uint32_t budget =
            n->params->batch_tokens > 0 ? n->params->batch_tokens : n->params->worker.chunk_tokens;
        prefill_jobs_step(&n->je, jobs, n_jobs, budget, n->params->worker.chunk_tokens, &n_tokens);
        dt = tdm_clock_now_ns() - t0;
        pthread_mutex_lock(&n->lock);
        n->stats.steps_total++;
        n->stats.step_jobs_total += (uint64_t)n_stepping;
        n->stats.compute_seconds_total += (double)dt / TDM_NS_PER_S;
        n->stats.recent_tokens_per_s =
            dt > 0 ? (double)n_tokens * TDM_NS_PER_S / (double)dt : n->stats.recent_tokens_per_s;
        pthread_mutex_unlock(&n->lock);
    }
    for (int i = 0; i < n->n_slots;) {
        if (prefill_job_rows_left(n->slots[i]->job) == 0) {
            slot_end(n, i);
        } else {
            i++;
        }
    }
}

static int setup(prefill_node_t *n)
{
    const prefill_node_params_t *cfg = n->params;
    node_worker_t *w = &n->worker;
    engine_fwd_params_t fp;
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
    /* page i of the engine pool is page i of the xfer pool: in place over UCX's memory on the
     * CPU, a staging copy of it when the engine runs on a device (node/node_pages.h) */
    status = node_pages_create(w->model, cfg->pages, w->xfer, &n->pages);
    if (status == TDM_OK) {
        n->kv = node_pages_engine(n->pages);
        n->xpool = node_pages_xfer(n->pages);
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
    n->je = (prefill_job_env_t){
        w->model,         n->kv, w->xfer,    n->xpool,           n->pages,     n->fwd,
        job_aborted,      n,     job_fenced, w->constrain_vocab, &w->progress, n->history,
        cfg->state_inband};
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-prefill: setup failed: %s\n", tdm_status_message(status));
        return NODE_EXIT_FAILED;
    }
    memset(&join, 0, sizeof(join));
    join.render = render;
    join.render_arg = n;
    join.max_sequences = cfg->max_jobs > 0 ? cfg->max_jobs : 1; /* jobs batched at once */
    join.kv_pages = cfg->pages; /* one job's history and new pages: Capacity.max_tokens */
    rc = node_worker_join(w, &join);
    if (rc != NODE_EXIT_OK) {
        return rc;
    }
    pthread_mutex_lock(&n->lock);
    n->ready = 1;
    pthread_mutex_unlock(&n->lock);
    tdm_log(TDM_LOG_INFO, "prefill",
            "serving: id=%s http=%s device=%s kv_pages=%s pages=%u threads=%d max_jobs=%u "
            "batch_tokens=%u history_cache_mb=%u state=%s",
            w->id, w->endpoint, w->ops->name, node_pages_staged(n->pages) ? "staged" : "host",
            cfg->pages, w->n_threads, join.max_sequences,
            cfg->batch_tokens > 0 ? cfg->batch_tokens : cfg->worker.chunk_tokens,
            cfg->history_cache_mb, cfg->state_inband ? "inband" : "direct");
    return NODE_EXIT_OK;
}

static void run(prefill_node_t *n)
{
    uint64_t last = tdm_clock_now_ns();

    while (node_worker_stop_signal() == 0) {
        uint64_t now;
        int busy;

        admit(n);
        busy = n->n_slots > 0;
        if (busy) {
            step(n);
            drain(n, 0);
        } else {
            xfer_context_progress(n->worker.xfer);
            drain(n, PREFILL_IDLE_MS);
        }
        now = tdm_clock_now_ns();
        if (busy) {
            pthread_mutex_lock(&n->lock);
            n->stats.busy_seconds_total += (double)(now - last) / TDM_NS_PER_S;
            pthread_mutex_unlock(&n->lock);
        }
        last = now;
    }
    /* Every job taken is answered: the started ones stop (the stop signal is their abort), the
     * queued ones go back to the router for another node. */
    while (n->n_slots > 0) {
        slot_end(n, 0);
    }
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
    node_pages_destroy(node.pages);
    node_worker_close(&node.worker);
    pthread_mutex_destroy(&node.lock);
    return rc;
}
