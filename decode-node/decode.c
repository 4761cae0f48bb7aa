/* decode.c - one decode node from its flags to its Goodbye (decode.h). */
#include "decode-node/decode.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/prom.h"
#include "decode-node/notices.h"
#include "decode-node/pool.h"
#include "decode-node/report.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "decode-node/tier.h"
#include "engine/model.h"
#include "engine/spec.h"
#include "transfer/context.h"

#define DECODE_FIELDS_BYTES 256
#define DECODE_XFER_POLL_MS 5u
#define DECODE_REPORT_MS    250u /* the held-sessions list is refreshed this often (report.h) */

/* Process state, made in decode_node_run and passed down. */
typedef struct {
    const decode_node_params_t *params;
    node_worker_t worker; /* model, transfer context, /health + /metrics, link */
    decode_pool_t *pool;
    uint64_t router_registrations[NODE_LINK_MAX_ROUTERS]; /* per router, seen by the compute
                                                             thread */
    uint64_t *report_keys; /* [NODE_MAX_RESIDENT_SESSIONS] Load.resident_session_keys */
    uint64_t *report_lens; /* [NODE_MAX_RESIDENT_SESSIONS] Load.resident_cached_lens */
    uint64_t next_report_ns;
    decode_tier_t *tier;
    decode_sessions_t *sessions;
    decode_notices_t *notices; /* state notices from prefill nodes (the transfer callback's) */
    decode_sched_t *sched;     /* NULL until registered; /health says "starting" */
    uint64_t registrations;    /* node_link_registrations seen by the compute thread */
} decode_node_t;

/* The speculative decoding families, one sample per drafter a node can run. */
static void render_spec(const decode_stats_t *st, tdm_prom_t *p)
{
    static const engine_spec_drafter_t drafters[] = {ENGINE_SPEC_OFF, ENGINE_SPEC_DSPARK,
                                                     ENGINE_SPEC_NGRAM};
    static const struct {
        const char *name;
        tdm_prom_type_t type;
        const char *help;
    } families[] = {
        {"tandem_spec_steps_total", TDM_PROM_COUNTER, "sequence-steps that used the drafter"},
        {"tandem_spec_drafted_tokens_total", TDM_PROM_COUNTER, "draft tokens proposed"},
        {"tandem_spec_verified_tokens_total", TDM_PROM_COUNTER, "draft tokens verified"},
        {"tandem_spec_accepted_tokens_total", TDM_PROM_COUNTER, "draft tokens accepted"},
        {"tandem_spec_emitted_tokens_total", TDM_PROM_COUNTER,
         "tokens emitted by speculative steps"},
        {"tandem_spec_acceptance_rate", TDM_PROM_GAUGE,
         "accepted over verified draft tokens (0 without verifies)"},
        {"tandem_spec_mean_accepted_length", TDM_PROM_GAUGE, "draft tokens accepted per step"},
    };

    for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
        tdm_prom_family(p, families[f].name, families[f].type, families[f].help);
        for (size_t i = 0; i < sizeof(drafters) / sizeof(drafters[0]); i++) {
            const engine_spec_metrics_t *m = &st->spec[drafters[i]];
            const tdm_prom_label_t label = {"drafter", engine_spec_drafter_name(drafters[i])};
            const uint64_t counts[] = {m->n_steps, m->drafted, m->verified, m->accepted,
                                       m->emitted};

            if (families[f].type == TDM_PROM_COUNTER) {
                tdm_prom_sample_u64(p, &label, 1, counts[f]);
            } else {
                const double rates[] = {m->acceptance_rate, m->mean_accepted_length};

                tdm_prom_sample(p, &label, 1, rates[f - sizeof(counts) / sizeof(counts[0])]);
            }
        }
    }
}

/* The node's /metrics families (node_worker_families_fn); arg: a decode_stats_t snapshot. */
static void render_families(void *arg, tdm_prom_t *p)
{
    const decode_stats_t *st = arg;

    tdm_prom_counter(p, "tandem_decode_requests_total", "decode requests accepted",
                     st->requests_total);
    tdm_prom_counter(p, "tandem_decode_generated_tokens_total", "tokens generated",
                     st->generated_tokens_total);
    tdm_prom_counter(p, "tandem_decode_local_prefill_tokens_total",
                     "prompt tokens prefilled on this node", st->local_prefill_tokens_total);
    tdm_prom_counter(p, "tandem_decode_handoffs_total",
                     "prefill handoffs adopted (pages put by a prefill node)", st->handoffs_total);
    tdm_prom_counter(p, "tandem_decode_handoff_failures_total", "prefill handoffs that failed",
                     st->handoff_failures_total);
    tdm_prom_counter(p, "tandem_decode_reservations_total", "page reservations granted",
                     st->reservations_total);
    tdm_prom_counter(p, "tandem_decode_reservations_lapsed_total",
                     "page reservations that lapsed unused", st->reservations_lapsed_total);
    tdm_prom_counter(p, "tandem_decode_aborts_total", "requests and reservations aborted",
                     st->aborts_total);
    tdm_prom_counter(p, "tandem_decode_state_lost_total",
                     "requests refused because the session's state was gone", st->state_lost_total);
    tdm_prom_counter(p, "tandem_decode_rewinds_total",
                     "sessions cut back to a shorter prefix and replayed", st->rewinds_total);
    tdm_prom_counter(p, "tandem_decode_rewind_kept_tokens_total",
                     "positions rewinds kept (not prefilled again)", st->rewind_kept_tokens_total);
    tdm_prom_counter(p, "tandem_decode_prefix_shares_total",
                     "new sessions started from another session's KV pages (prefix_session_id)",
                     st->prefix_shares_total);
    tdm_prom_counter(p, "tandem_decode_prefix_shared_tokens_total",
                     "prompt positions reused by prefix sharing (not prefilled)",
                     st->prefix_shared_tokens_total);
    tdm_prom_counter(p, "tandem_decode_evictions_total", "idle sessions evicted for pages",
                     st->evictions_total);
    tdm_prom_counter(p, "tandem_decode_greedy_steps_total",
                     "decode steps whose sampled tokens alone left the kernel backend (all greedy "
                     "without logprobs, constraints or a min_tokens stop mask: no logits copied)",
                     st->greedy_steps_total);
    tdm_prom_counter(p, "tandem_decode_prefill_pieces_total",
                     "local prefill parts, rewinds and canonical replays run between decode steps",
                     st->prefill_pieces_total);
    tdm_prom_gauge(p, "tandem_decode_running_sequences", "sequences in the decode batch",
                   st->running_sequences);
    tdm_prom_gauge(p, "tandem_decode_pending_prefills", "local prefills waiting",
                   st->pending_prefills);
    tdm_prom_gauge(p, "tandem_decode_queued_prefill_tokens",
                   "delta tokens of pending local prefills not yet prefilled",
                   st->queued_prefill_tokens);
    tdm_prom_gauge(p, "tandem_decode_free_pages", "KV pages free", st->free_pages);
    tdm_prom_gauge(p, "tandem_decode_total_pages", "KV pages in the pool", st->total_pages);
    tdm_prom_gauge(p, "tandem_decode_reserved_pages", "KV pages reserved for incoming prefills",
                   st->reserved_pages);
    tdm_prom_gauge(p, "tandem_decode_resident_sessions", "sessions holding KV pages",
                   st->resident_sessions);
    tdm_prom_gauge(p, "tandem_decode_session_pages", "KV pages held by resident sessions",
                   st->session_pages);
    tdm_prom_gauge(p, "tandem_decode_shared_pages",
                   "KV pages linked by two or more sessions (shared prefixes)", st->shared_pages);
    tdm_prom_counter(p, "tandem_decode_staged_pages_total",
                     "KV pages copied from the device into their host staging copies (history "
                     "pages a reservation offers; 0 with --device cpu: docs/GPU.md 7)",
                     st->staged_pages_total);
    tdm_prom_gauge(p, "tandem_decode_shared_page_refs",
                   "links to shared pages beyond each page's first: session_pages minus this is "
                   "the distinct pages sessions hold",
                   (double)st->shared_page_refs);
    tdm_prom_gauge(p, "tandem_decode_recent_tokens_per_second",
                   "recent generation throughput, tokens per second", st->recent_tokens_per_s);
    tdm_prom_counter(p, "tandem_decode_state_notices_total",
                     "state records received straight from prefill nodes (transfer notices)",
                     st->notices.arrived_total);
    tdm_prom_counter(p, "tandem_decode_state_notice_bytes_total",
                     "bytes of those state records and page checksums (not relayed by the router)",
                     st->notices.state_bytes_total);
    tdm_prom_counter(p, "tandem_decode_state_notice_timeouts_total",
                     "remote handoffs failed because their state notice did not arrive in time",
                     st->notices.timeouts_total);
    tdm_prom_counter(p, "tandem_decode_state_notices_refused_total",
                     "state notices refused (malformed payload, checksum) or dropped unclaimed",
                     st->notices.bad_total + st->notices.expired_total);
    render_spec(st, p);
    decode_tier_render(&st->tier, p);
}

static int render(void *arg, node_http_page_t page, char **body_out)
{
    decode_node_t *n = arg;
    decode_stats_t st;
    char fields[DECODE_FIELDS_BYTES];
    int ready = __atomic_load_n(&n->sched, __ATOMIC_ACQUIRE) != NULL;

    memset(&st, 0, sizeof(st));
    if (ready) {
        decode_sched_stats(n->sched, &st);
    }
    snprintf(fields, sizeof(fields),
             "\"free_pages\":%u,\"total_pages\":%u,\"running_sequences\":%u", st.free_pages,
             st.total_pages, st.running_sequences);
    return node_worker_render(&n->worker, page, ready, fields, render_families, &st, body_out);
}

/* The flags only the decode node has; their values go into the scheduler's params. */
static int parse_spec(const decode_node_params_t *params, decode_sched_params_t *sp)
{
    if (engine_spec_drafter_parse(params->spec, &sp->spec_drafter) != TDM_OK) {
        fprintf(stderr, "tandem-decode: --spec=%s is invalid: expected off, dspark or ngram\n",
                params->spec);
        return NODE_EXIT_USAGE;
    }
    if (engine_spec_accept_parse(params->spec_accept, &sp->spec.accept) != TDM_OK) {
        fprintf(stderr,
                "tandem-decode: --spec-accept=%s is invalid: expected coupled or "
                "rejection\n",
                params->spec_accept);
        return NODE_EXIT_USAGE;
    }
    return NODE_EXIT_OK;
}

static int setup(decode_node_t *n)
{
    const decode_node_params_t *cfg = n->params;
    node_worker_t *w = &n->worker;
    decode_sched_params_t sp;
    decode_sched_out_t out;
    node_worker_join_t join;
    decode_sched_t *sched = NULL;
    int rc;
    tdm_status_t status;

    rc = node_worker_open(w, &cfg->worker, "tandem-decode", "decode", TANDEM__ROLE__ROLE_DECODE);
    memset(&sp, 0, sizeof(sp));
    if (rc == NODE_EXIT_OK) {
        rc = parse_spec(cfg, &sp);
    }
    if (rc == NODE_EXIT_OK) {
        /* before the transfer context exists: it delivers the prefill nodes' state notices
         * here (sequence state off the router, docs/PROTOCOL.md 3b) */
        decode_notices_params_t np = {cfg->state_wait_ms, 0, 0};
        if (decode_notices_create(&np, &n->notices) != TDM_OK) {
            fprintf(stderr, "tandem-decode: setup failed: out of memory\n");
            return NODE_EXIT_FAILED;
        }
        w->xfer_params.on_notice = decode_notices_on_xfer;
        w->xfer_params.on_notice_arg = n->notices;
        rc = node_worker_load(w);
    }
    if (rc != NODE_EXIT_OK) {
        return rc;
    }
    if (sp.spec_drafter == ENGINE_SPEC_DSPARK && w->config->n_blocks == 0) {
        fprintf(stderr, "tandem-decode: --spec=dspark: %s has no DSpark blocks\n",
                cfg->worker.model_dir);
        return NODE_EXIT_USAGE;
    }
    {
        engine_spec_accept_t accept = sp.spec.accept;
        engine_spec_params_default(w->model, &sp.spec);
        sp.spec.accept = accept;
        sp.spec.confidence_threshold = cfg->spec_threshold;
    }
    status = decode_pool_create(w->model, cfg->pages, w->xfer, &n->pool);
    if (status == TDM_OK) {
        decode_tier_params_t tp;
        tp.host_max_bytes = cfg->host_tier_mb << 20;
        tp.spill_dir = cfg->spill_dir;
        tp.spill_max_bytes = cfg->spill_max_mb << 20;
        status = decode_tier_create(&tp, &n->tier);
    }
    if (status == TDM_OK) {
        status = decode_sessions_create(cfg->max_sessions, &n->sessions);
    }
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-decode: setup failed: %s\n", tdm_status_message(status));
        return NODE_EXIT_FAILED;
    }
    memset(&join, 0, sizeof(join));
    join.render = render;
    join.render_arg = n;
    decode_pool_descriptor(n->pool, &join.transfer_descriptor, &join.n_transfer_descriptor);
    join.total_pages = cfg->pages;
    join.max_sequences = cfg->max_batch;
    rc = node_worker_join(w, &join);
    if (rc != NODE_EXIT_OK) {
        return rc;
    }
    sp.fence_ms = cfg->fence_ms;
    sp.max_batch = cfg->max_batch;
    sp.chunk_tokens = cfg->worker.chunk_tokens;
    sp.step_token_budget = cfg->step_token_budget;
    sp.prefill_chunk_tokens = cfg->prefill_chunk_tokens;
    sp.n_threads = w->n_threads;
    sp.constrain_vocab = w->constrain_vocab;
    sp.tier = n->tier;
    sp.prefix_share = cfg->prefix_share;
    sp.notices = n->notices;
    sp.state_inband = cfg->state_inband;
    decode_sched_out_link(w->link, &out);
    status = decode_sched_create(&sp, w->model, n->pool, n->sessions, &out, &sched);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-decode: scheduler: %s\n", tdm_status_message(status));
        return NODE_EXIT_FAILED;
    }
    __atomic_store_n(&n->sched, sched, __ATOMIC_RELEASE);
    tdm_log(TDM_LOG_INFO, "decode",
            "serving: id=%s http=%s device=%s kv_pages=%s pages=%u page_bytes=%u threads=%d "
            "step_token_budget=%u prefill_chunk_tokens=%u",
            w->id, w->endpoint, w->ops->name,
            node_pages_staged(decode_pool_pages(n->pool)) ? "staged" : "host", cfg->pages,
            w->page_bytes, w->n_threads, cfg->step_token_budget, cfg->prefill_chunk_tokens);
    return NODE_EXIT_OK;
}

/*
 * Whether the loop goes on after a stop signal: SIGTERM with --drain-timeout-ms starts a drain
 * (*drain_deadline_ns set), which ends when nothing runs or is reserved, at the deadline, or at
 * a second signal; anything else stops at once. *reason_out: the Goodbye's.
 */
static int keep_serving(decode_node_t *n, uint64_t *drain_deadline_ns, const char **reason_out)
{
    int sig = node_worker_stop_signal();
    uint64_t now = tdm_clock_now_ns();

    if (sig == 0) {
        return 1;
    }
    if (*drain_deadline_ns == 0) {
        if (sig != SIGTERM || n->params->drain_timeout_ms == 0) {
            return 0;
        }
        *drain_deadline_ns = now + (uint64_t)n->params->drain_timeout_ms * TDM_NS_PER_MS;
        decode_sched_drain(n->sched);
        node_progress_set_draining(&n->worker.progress);
        tdm_log(TDM_LOG_INFO, "decode", "SIGTERM: draining for at most %u ms",
                n->params->drain_timeout_ms);
    }
    if (node_worker_signal_count() > 1) {
        tdm_log(TDM_LOG_WARN, "decode", "second signal while draining: stopping now");
        return 0;
    }
    if (decode_sched_idle(n->sched)) {
        tdm_log(TDM_LOG_INFO, "decode", "drained: no turn runs and no page is reserved");
        *reason_out = "drained";
        return 0;
    }
    if (now >= *drain_deadline_ns) {
        tdm_log(TDM_LOG_WARN, "decode",
                "drain timeout after %u ms: what still runs ends aborted (the router retries it)",
                n->params->drain_timeout_ms);
        return 0;
    }
    return 1;
}

/* Does `resv` (decode_pool_lapse_if) or the request `id` (decode_sched_abort_where) belong to
 * router pick->router? One whose request is not known to the link (a route forgotten) counts as
 * any router's. */
typedef struct {
    node_link_t *link;
    uint32_t router;
} lapse_pick_t;

static int request_of_router(void *arg, uint64_t id)
{
    const lapse_pick_t *pick = arg;
    int r = node_link_request_router(pick->link, id);

    return r < 0 || (uint32_t)r == pick->router;
}

static int resv_of_router(void *arg, const decode_resv_t *resv)
{
    return request_of_router(arg, resv->request_id);
}

/* A router registered us again (it restarted, declared this node lost, or was unreachable past
 * its heartbeat timeout): what it reserved lapses now. With one router, decode_sched_router_changed
 * (every reservation); with several, only that router's reservations lapse and its running turns
 * end (nobody reads them: the router that takes the sessions over must find them idle); the
 * other routers' turns go on. */
static void note_registrations(decode_node_t *n)
{
    node_link_t *link = n->worker.link;
    uint32_t n_routers = node_link_n_routers(link);
    uint64_t total = node_link_registrations(link);

    if (total == n->registrations) {
        return; /* no router registered us again since the last look */
    }
    n->registrations = total;
    for (uint32_t r = 0; r < n_routers; r++) {
        uint64_t seen = node_link_router_registrations(link, r);
        lapse_pick_t pick = {link, r};
        uint32_t n_lapsed, n_aborted;

        if (seen == n->router_registrations[r]) {
            continue;
        }
        n->router_registrations[r] = seen;
        if (n_routers == 1) {
            decode_sched_router_changed(n->sched);
            continue;
        }
        n_lapsed = decode_pool_lapse_if(n->pool, tdm_clock_now_ns(), resv_of_router, &pick);
        n_aborted = decode_sched_abort_where(n->sched, request_of_router, &pick);
        tdm_log(n_lapsed + n_aborted > 0 ? TDM_LOG_WARN : TDM_LOG_INFO, "decode",
                "router %u of %u lost this node's registration: %u of its reservation(s) lapse "
                "now, %u of its turn(s) aborted",
                r + 1, n_routers, n_lapsed, n_aborted);
    }
}

/* Every DECODE_REPORT_MS: the held sessions the heartbeats carry (report.h). */
static void report_sessions(decode_node_t *n)
{
    uint64_t now = tdm_clock_now_ns();
    uint32_t n_held;

    if (now < n->next_report_ns || n->report_keys == NULL || n->report_lens == NULL) {
        return;
    }
    n->next_report_ns = now + (uint64_t)DECODE_REPORT_MS * TDM_NS_PER_MS;
    n_held = decode_report_resident(n->sessions, n->report_keys, n->report_lens,
                                    NODE_MAX_RESIDENT_SESSIONS);
    node_link_set_resident_sessions(n->worker.link, n->report_keys, n->report_lens, n_held);
}

static void run(decode_node_t *n, const char **reason_out)
{
    uint64_t drain_deadline_ns = 0;

    while (keep_serving(n, &drain_deadline_ns, reason_out)) {
        uint32_t wait_ms = decode_sched_step(n->sched);
        Tandem__Envelope *env = NULL;
        decode_stats_t st;

        /* liveness from progress: the link's heartbeats and /health read it (node_progress.h) */
        decode_sched_stats(n->sched, &st);
        node_progress_step(&n->worker.progress, st.running_sequences + st.pending_prefills);

        if (decode_pool_n_reserved(n->pool) > 0 && wait_ms > DECODE_XFER_POLL_MS) {
            wait_ms = DECODE_XFER_POLL_MS; /* keep UCX progressing while peers write */
        }
        xfer_context_progress(n->worker.xfer);
        decode_sched_join_notices(n->sched); /* handoffs whose state notice just arrived */
        while (node_link_recv(n->worker.link, wait_ms, &env) == TDM_OK) {
            decode_sched_on_message(n->sched, env);
            proto_envelope_free(env);
            wait_ms = 0;
        }
        note_registrations(n);
        report_sessions(n);
    }
}

static void teardown(decode_node_t *n, const char *reason)
{
    decode_sched_t *sched = n->sched;

    node_worker_stop_http(&n->worker);
    __atomic_store_n(&n->sched, NULL, __ATOMIC_RELEASE);
    decode_sched_destroy(sched);
    node_worker_leave(&n->worker, node_worker_stop_signal() != 0 ? reason : NULL);
    decode_sessions_destroy(n->sessions);
    decode_tier_destroy(n->tier);
    decode_pool_destroy(n->pool);
    node_worker_close(&n->worker); /* the transfer context, which delivered into notices */
    decode_notices_destroy(n->notices);
}

int decode_node_run(const decode_node_params_t *params)
{
    decode_node_t node;
    const char *reason = "shutting down";
    int rc;

    memset(&node, 0, sizeof(node));
    node.params = params;
    node.report_keys = calloc(NODE_MAX_RESIDENT_SESSIONS, sizeof(uint64_t));
    node.report_lens = calloc(NODE_MAX_RESIDENT_SESSIONS, sizeof(uint64_t));
    if (node.report_keys == NULL || node.report_lens == NULL) {
        tdm_log(TDM_LOG_WARN, "decode", "out of memory: heartbeats go without the held sessions");
    }
    rc = setup(&node);
    if (rc == NODE_EXIT_OK) {
        run(&node, &reason);
        tdm_log(TDM_LOG_INFO, "decode", "stopping: signal=%d reason=%s", node_worker_stop_signal(),
                reason);
    }
    teardown(&node, reason);
    free(node.report_keys);
    free(node.report_lens);
    return rc;
}
