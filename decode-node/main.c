/* tandem-decode - a decode node: holds sessions' KV pages, takes page writes from prefill
 * nodes, decodes in continuous batches and streams tokens to the router (ARCHITECTURE.md,
 * docs/PROTOCOL.md section 7). Runs until SIGINT or SIGTERM, then says Goodbye and stops.
 */
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/flags.h"
#include "common/http_status.h"
#include "common/log.h"
#include "common/prom.h"
#include "common/startup.h"
#include "node/node_http.h"
#include "node/node_link.h"
#include "node/node_xfer.h"
#include "decode-node/pool.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "engine/model.h"
#include "engine/spec.h"
#include "kernels/kv_page.h"
#include "transfer/context.h"
#include "transfer/metrics.h"

#define DECODE_ERR_BYTES 512
#define DECODE_HOST_BYTES 256
#define DECODE_BODY_BYTES 8192
#define DECODE_XFER_POLL_MS 5u
#define DECODE_EXIT_REFUSED 3

typedef struct {
    const char *model_dir;
    const char *router;
    const char *http;
    const char *rack;
    uint32_t pages;
    uint32_t max_sessions;
    uint32_t max_batch;
    uint32_t threads;
    uint32_t chunk_tokens;
    uint32_t fence_ms;
    uint32_t register_timeout_ms;
    const char *transports;
    const char *ucx_protocols;
    const char *require_transport;
    const char *spec;
    const char *spec_accept;
    double spec_threshold;
    const char *log_level;
} decode_cfg_t;

static const tdm_flag_t decode_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(decode_cfg_t, model_dir), "model directory", 0, 0, 1},
    {"router", TDM_FLAG_STRING, "tcp://127.0.0.1:5557", offsetof(decode_cfg_t, router),
     "the router's control endpoint", 0, 0, 0},
    {"http", TDM_FLAG_STRING, "127.0.0.1:0", offsetof(decode_cfg_t, http),
     "HOST:PORT of /health and /metrics (port 0: any free port)", 0, 0, 0},
    {"rack", TDM_FLAG_STRING, "rack0", offsetof(decode_cfg_t, rack), "NVLink domain id", 0, 0, 0},
    {"pages", TDM_FLAG_U32, "4096", offsetof(decode_cfg_t, pages), "KV pages in the pool", 16,
     16777216, 0},
    {"max-sessions", TDM_FLAG_U32, "1024", offsetof(decode_cfg_t, max_sessions),
     "sessions kept resident (idle ones evicted least recently used first)", 1, 1048576, 0},
    {"max-batch", TDM_FLAG_U32, "64", offsetof(decode_cfg_t, max_batch),
     "sequences per decode step", 1, 64, 0},
    {"threads", TDM_FLAG_U32, "0", offsetof(decode_cfg_t, threads),
     "kernel threads (0: every online CPU)", 0, 1024, 0},
    {"chunk-tokens", TDM_FLAG_U32, "256", offsetof(decode_cfg_t, chunk_tokens),
     "prefill chunk: most tokens one layer pass takes", 1, 65536, 0},
    {"fence-ms", TDM_FLAG_U32, "1000", offsetof(decode_cfg_t, fence_ms),
     "an aborted or lapsed reservation keeps its pages this long (remote writes stop by then)", 0,
     600000, 0},
    {"register-timeout-ms", TDM_FLAG_U32, "10000", offsetof(decode_cfg_t, register_timeout_ms),
     "how long to wait for the router's RegisterAck", 100, 600000, 0},
    {"transports", TDM_FLAG_STRING, NULL, offsetof(decode_cfg_t, transports),
     "UCX transports (UCX_TLS syntax; default: UCX's choice)", 0, 0, 0},
    {"ucx-protocols", TDM_FLAG_STRING, "v1", offsetof(decode_cfg_t, ucx_protocols),
     "UCX protocol generation: v1 (UCX 1.13's default; lanes read from the endpoint "
     "configuration) or v2 (lanes described by UCX per request)", 0, 0, 0},
    {"require-transport", TDM_FLAG_STRING, NULL, offsetof(decode_cfg_t, require_transport),
     "lanes KV transfers may use (tcp,shm,rc,dc,ud,cuda_ipc,cuda_copy,gdr_copy; default "
     "any): a transfer over another lane fails instead of falling back", 0, 0, 0},
    {"spec", TDM_FLAG_STRING, "off", offsetof(decode_cfg_t, spec),
     "speculative decoding drafter: off, dspark or ngram (MODEL.md 8; output unchanged); a "
     "request's spec field overrides it unless it is off", 0, 0, 0},
    {"spec-accept", TDM_FLAG_STRING, "coupled", offsetof(decode_cfg_t, spec_accept),
     "acceptance: coupled (token-identical to --spec off) or rejection (same distribution)", 0, 0,
     0},
    {"spec-confidence-threshold", TDM_FLAG_F64, "0.3", offsetof(decode_cfg_t, spec_threshold),
     "DSpark verify length: drafts while the confidence product stays above this", 0, 1, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(decode_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

/* Process state, made in main() and passed down. */
typedef struct {
    decode_cfg_t cfg;
    char id[NODE_ID_BYTES + 1];
    engine_model_t *model;
    xfer_context_t *xfer;
    decode_pool_t *pool;
    decode_sessions_t *sessions;
    node_http_t *http;
    node_link_t *link;
    decode_sched_t *sched; /* NULL until registered; /health says "starting" */
} decode_node_t;

static volatile sig_atomic_t g_stop_signal;

static void on_signal(int sig)
{
    g_stop_signal = sig;
}

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

/* The /metrics page: the node's families, then transfer/'s. NULL when out of memory. */
static char *render_metrics(decode_node_t *n, const decode_stats_t *st)
{
    tdm_prom_t *p;
    char *text = NULL;
    size_t n_bytes = 0;

    if (tdm_prom_create(&p) != TDM_OK) {
        return NULL;
    }
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
    tdm_prom_counter(p, "tandem_decode_evictions_total", "idle sessions evicted for pages",
                     st->evictions_total);
    tdm_prom_gauge(p, "tandem_decode_running_sequences", "sequences in the decode batch",
                   st->running_sequences);
    tdm_prom_gauge(p, "tandem_decode_pending_prefills", "local prefills waiting",
                   st->pending_prefills);
    tdm_prom_gauge(p, "tandem_decode_free_pages", "KV pages free", st->free_pages);
    tdm_prom_gauge(p, "tandem_decode_total_pages", "KV pages in the pool", st->total_pages);
    tdm_prom_gauge(p, "tandem_decode_reserved_pages", "KV pages reserved for incoming prefills",
                   st->reserved_pages);
    tdm_prom_gauge(p, "tandem_decode_resident_sessions", "sessions holding KV pages",
                   st->resident_sessions);
    tdm_prom_gauge(p, "tandem_decode_session_pages", "KV pages held by resident sessions",
                   st->session_pages);
    tdm_prom_gauge(p, "tandem_decode_recent_tokens_per_second",
                   "recent generation throughput, tokens per second", st->recent_tokens_per_s);
    render_spec(st, p);
    if (n->xfer != NULL) {
        xfer_metrics_render_to(xfer_context_metrics(n->xfer), p);
    }
    return tdm_prom_finish(p, &text, &n_bytes) == TDM_OK ? text : NULL;
}

static int render(void *arg, node_http_page_t page, char **body_out)
{
    decode_node_t *n = arg;
    decode_stats_t st;
    char *body;
    int ready = __atomic_load_n(&n->sched, __ATOMIC_ACQUIRE) != NULL;

    memset(&st, 0, sizeof(st));
    if (ready) {
        decode_sched_stats(n->sched, &st);
    }
    if (page == NODE_HTTP_METRICS) {
        body = render_metrics(n, &st);
        *body_out = body;
        return body != NULL ? TDM_HTTP_OK : TDM_HTTP_INTERNAL;
    }
    body = malloc(DECODE_BODY_BYTES);
    if (body == NULL) {
        return TDM_HTTP_INTERNAL;
    }
    snprintf(body, DECODE_BODY_BYTES,
             "{\"status\":\"%s\",\"role\":\"decode\",\"id\":\"%s\",\"free_pages\":%u,"
             "\"total_pages\":%u,\"running_sequences\":%u}\n",
             ready ? "ok" : "starting", n->id, st.free_pages, st.total_pages, st.running_sequences);
    *body_out = body;
    return ready ? TDM_HTTP_OK : TDM_HTTP_UNAVAILABLE;
}

static int setup(decode_node_t *n)
{
    char err[DECODE_ERR_BYTES] = "";
    char host[DECODE_HOST_BYTES];
    char endpoint[DECODE_HOST_BYTES + 8];
    uint16_t port;
    engine_model_params_t mp;
    xfer_context_params_t xp;
    node_link_params_t lp;
    decode_sched_params_t sp;
    const engine_config_t *c;
    kern_kv_geometry_t geometry;
    const uint8_t *desc;
    size_t n_desc;
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = n->cfg.threads > 0 ? (int)n->cfg.threads : (n_cpu > 0 ? (int)n_cpu : 1);
    tdm_status_t status;

    if (node_http_parse_host_port(n->cfg.http, host, sizeof(host), &port) != 0) {
        fprintf(stderr, "tandem-decode: --http=%s is invalid: expected HOST:PORT\n", n->cfg.http);
        return 2;
    }
    /* Checked before the model loads (minutes on a real fleet). */
    if (node_xfer_params("tandem-decode", n->cfg.transports, n->cfg.ucx_protocols,
                         n->cfg.require_transport, &xp) != TDM_OK) {
        return 2;
    }
    memset(&sp, 0, sizeof(sp));
    if (engine_spec_drafter_parse(n->cfg.spec, &sp.spec_drafter) != TDM_OK) {
        fprintf(stderr, "tandem-decode: --spec=%s is invalid: expected off, dspark or ngram\n",
                n->cfg.spec);
        return 2;
    }
    if (engine_spec_accept_parse(n->cfg.spec_accept, &sp.spec.accept) != TDM_OK) {
        fprintf(stderr, "tandem-decode: --spec-accept=%s is invalid: expected coupled or "
                        "rejection\n", n->cfg.spec_accept);
        return 2;
    }
    node_link_make_id("decode", n->id, sizeof(n->id));
    engine_model_params_default(&mp);
    mp.n_threads = threads;
    status = engine_model_load(n->cfg.model_dir, &mp, &n->model, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-decode: loading %s: %s\n", n->cfg.model_dir, err);
        return 1;
    }
    c = engine_model_config(n->model);
    if (sp.spec_drafter == ENGINE_SPEC_DSPARK && c->n_blocks == 0) {
        fprintf(stderr, "tandem-decode: --spec=dspark: %s has no DSpark blocks\n",
                n->cfg.model_dir);
        return 2;
    }
    {
        engine_spec_accept_t accept = sp.spec.accept;
        engine_spec_params_default(n->model, &sp.spec);
        sp.spec.accept = accept;
        sp.spec.confidence_threshold = n->cfg.spec_threshold;
    }
    xp.name = n->id + (strlen(n->id) > 63 ? strlen(n->id) - 63 : 0);
    status = xfer_context_create(&xp, &n->xfer);
    if (status == TDM_OK) {
        status = decode_pool_create(n->model, n->cfg.pages, n->xfer, &n->pool);
    }
    if (status == TDM_OK) {
        status = decode_sessions_create(n->cfg.max_sessions, &n->sessions);
    }
    if (status == TDM_OK) {
        status = node_http_create(host, port, render, n, &n->http);
    }
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-decode: setup failed: %s\n", tdm_status_message(status));
        return 1;
    }
    kern_kv_geometry((uint32_t)c->head_dim, (uint32_t)c->index_head_dim,
                     engine_config_max_kv_ratio(c), &geometry); /* the pool was laid out with it */
    decode_pool_descriptor(n->pool, &desc, &n_desc);
    snprintf(endpoint, sizeof(endpoint), "%s:%u", host, (unsigned)node_http_port(n->http));
    memset(&lp, 0, sizeof(lp));
    lp.router_endpoint = n->cfg.router;
    lp.role = TANDEM__ROLE__ROLE_DECODE;
    lp.incarnation_id = n->id;
    lp.rack = n->cfg.rack;
    lp.node = host;
    lp.model_fingerprint = engine_model_fingerprint(n->model); /* = the router's (PROTOCOL.md) */
    lp.page_bytes = geometry.page_bytes;
    lp.tokens_per_block = geometry.tokens_per_block;
    lp.max_context = (uint32_t)c->max_position_embeddings;
    lp.transfer_descriptor = desc;
    lp.n_transfer_descriptor = n_desc;
    lp.total_pages = n->cfg.pages;
    lp.max_sequences = n->cfg.max_batch;
    lp.max_batch_tokens = n->cfg.chunk_tokens;
    lp.http_endpoint = endpoint;
    lp.register_timeout_ms = n->cfg.register_timeout_ms;
    status = node_link_create(&lp, &n->link, err, sizeof(err));
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "decode", "cannot join the cluster: %s", err);
        fprintf(stderr, "tandem-decode: %s\n", err);
        return status == TDM_ERR_MISMATCH ? DECODE_EXIT_REFUSED : 1;
    }
    sp.fence_ms = n->cfg.fence_ms;
    sp.max_batch = n->cfg.max_batch;
    sp.chunk_tokens = n->cfg.chunk_tokens;
    sp.n_threads = threads;
    {
        decode_sched_t *sched = NULL;
        status = decode_sched_create(&sp, n->model, n->pool, n->sessions, n->link, &sched);
        if (status != TDM_OK) {
            fprintf(stderr, "tandem-decode: scheduler: %s\n", tdm_status_message(status));
            return 1;
        }
        __atomic_store_n(&n->sched, sched, __ATOMIC_RELEASE);
    }
    tdm_log(TDM_LOG_INFO, "decode", "serving: id=%s http=%s pages=%u page_bytes=%u threads=%d",
            n->id, endpoint, n->cfg.pages, lp.page_bytes, threads);
    return 0;
}

static void run(decode_node_t *n)
{
    while (g_stop_signal == 0) {
        uint32_t wait_ms = decode_sched_step(n->sched);
        Tandem__Envelope *env = NULL;

        if (decode_pool_n_reserved(n->pool) > 0 && wait_ms > DECODE_XFER_POLL_MS) {
            wait_ms = DECODE_XFER_POLL_MS; /* keep UCX progressing while peers write */
        }
        xfer_context_progress(n->xfer);
        while (node_link_recv(n->link, wait_ms, &env) == TDM_OK) {
            decode_sched_on_message(n->sched, env);
            proto_envelope_free(env);
            wait_ms = 0;
        }
    }
}

static void teardown(decode_node_t *n)
{
    decode_sched_t *sched = n->sched;

    node_http_destroy(n->http);
    __atomic_store_n(&n->sched, NULL, __ATOMIC_RELEASE);
    decode_sched_destroy(sched);
    node_link_destroy(n->link, g_stop_signal != 0 ? "shutting down" : NULL);
    decode_sessions_destroy(n->sessions);
    decode_pool_destroy(n->pool);
    xfer_context_destroy(n->xfer);
    engine_model_destroy(n->model);
}

int main(int argc, char **argv)
{
    static const char summary[] =
        "Tandem decode node: KV page pool, continuous batching, token streaming";
    decode_node_t node;
    const tdm_main_spec_t spec = {"tandem-decode", summary, decode_flags,
                                  sizeof(decode_flags) / sizeof(decode_flags[0]),
                                  offsetof(decode_cfg_t, log_level)};
    tdm_flags_action_t action;
    int rc;

    memset(&node, 0, sizeof(node));
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
        tdm_log(TDM_LOG_INFO, "decode", "stopping: signal=%d", (int)g_stop_signal);
    }
    teardown(&node);
    return rc;
}
