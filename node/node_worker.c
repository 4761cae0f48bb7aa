/* node_worker.c - the workers' shared start-up and shutdown (node_worker.h). */
#include "node/node_worker.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fingerprint.h"
#include "common/http_status.h"
#include "common/log.h"
#include "common/startup.h"
#include "kernels/device.h"
#include "kernels/kv_page.h"
#include "text/tokenizer.h"
#include "node/node_xfer.h"
#include "transfer/metrics.h"

#define WORKER_ERR_BYTES       512
#define WORKER_HEALTH_BYTES    8192
#define WORKER_XFER_NAME_BYTES 63u /* the transfer context's name keeps the id's tail */

/* The flags both workers take; --log-level (the last) goes after the worker's own. */
static const tdm_flag_t shared_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(node_worker_cfg_t, model_dir), "model directory", 0, 0,
     1},
    {"router", TDM_FLAG_STRING, "tcp://127.0.0.1:5557", offsetof(node_worker_cfg_t, router),
     "the router's control endpoint, or a comma list of every router of the fleet (one link "
     "each; the node serves while any of them is up)",
     0, 0, 0},
    {"http", TDM_FLAG_STRING, "127.0.0.1:0", offsetof(node_worker_cfg_t, http),
     "HOST:PORT of /health and /metrics (port 0: any free port)", 0, 0, 0},
    {"rack", TDM_FLAG_STRING, "rack0", offsetof(node_worker_cfg_t, rack), "NVLink domain id", 0, 0,
     0},
    {"threads", TDM_FLAG_U32, "0", offsetof(node_worker_cfg_t, threads),
     "kernel threads (0: every online CPU)", 0, 1024, 0},
    {"device", TDM_FLAG_STRING, "cpu", offsetof(node_worker_cfg_t, device),
     "where the kernels, weights and KV pages live: cpu, cuda or cuda:N (pages cross to and "
     "from peers through a host staging copy registered with UCX: docs/GPU.md 7; guard: the "
     "checking backend of kernels/guard.h)",
     0, 0, 0},
    {"map-weights", TDM_FLAG_BOOL, "false", offsetof(node_worker_cfg_t, map_weights),
     "cpu: keep the weights in the mapped checkpoint files (page cache shared by every process "
     "on the host, 4 KiB pages) instead of a private copy in 2 MiB pages (faster decode: "
     "docs/BENCHMARKS.md); for hosts running several nodes of one checkpoint",
     0, 0, 0},
    {"chunk-tokens", TDM_FLAG_U32, "256", offsetof(node_worker_cfg_t, chunk_tokens),
     "prefill chunk: most tokens one layer pass takes", 1, 65536, 0},
    {"register-timeout-ms", TDM_FLAG_U32, "10000", offsetof(node_worker_cfg_t, register_timeout_ms),
     "how long to wait for the router's RegisterAck", 100, 600000, 0},
    {"transports", TDM_FLAG_STRING, NULL, offsetof(node_worker_cfg_t, transports),
     "UCX transports (UCX_TLS syntax; default: UCX's choice)", 0, 0, 0},
    {"ucx-protocols", TDM_FLAG_STRING, "v1", offsetof(node_worker_cfg_t, ucx_protocols),
     "UCX protocol generation: v1 (UCX 1.13's default; lanes read from the endpoint "
     "configuration) or v2 (lanes described by UCX per request)",
     0, 0, 0},
    {"require-transport", TDM_FLAG_STRING, NULL, offsetof(node_worker_cfg_t, require_transport),
     "lanes KV transfers may use (tcp,shm,rc,dc,ud,cuda_ipc,cuda_copy,gdr_copy; default "
     "any): a transfer over another lane fails instead of falling back",
     0, 0, 0},
    {"http-timeout-s", TDM_FLAG_U32, "30", offsetof(node_worker_cfg_t, http_timeout_s),
     "close an idle /health or /metrics connection after this many seconds", 1, 86400, 0},
    {"curve-key", TDM_FLAG_PATH, NULL, offsetof(node_worker_cfg_t, curve_key),
     "this worker's CurveZMQ key file (tandem keygen); its public key must be on the router's "
     "--curve-workers list",
     0, 0, 0},
    {"curve-router-key", TDM_FLAG_PATH, NULL, offsetof(node_worker_cfg_t, curve_router_key),
     "the router's CurveZMQ public key file (with --curve-key)", 0, 0, 0},
    {"stall-timeout-ms", TDM_FLAG_U32, "30000", offsetof(node_worker_cfg_t, stall_timeout_ms),
     "liveness from progress: with work pending and no compute step completed for this long "
     "(monotonic clock) the worker reports stalled (/health 503, heartbeat Load.stalled); 0: off",
     0, 3600000, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(node_worker_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

#define N_SHARED_FLAGS (sizeof(shared_flags) / sizeof(shared_flags[0]))

/* The process's stop flag: written only by on_signal (signal context), read by every thread. */
static volatile sig_atomic_t g_stop_signal;
/* Signals received (a draining decode node stops at once on the second). */
static volatile sig_atomic_t g_n_signals;

static void on_signal(int sig)
{
    g_stop_signal = sig;
    if (g_n_signals < 2) {
        g_n_signals = g_n_signals + 1;
    }
}

int node_worker_stop_signal(void)
{
    return (int)g_stop_signal;
}

int node_worker_signal_count(void)
{
    return (int)g_n_signals;
}

/* A shared flag moved to its place in the worker's config struct. */
static tdm_flag_t placed(const tdm_flag_t *flag, size_t worker_cfg_offset)
{
    tdm_flag_t f = *flag;

    f.offset += worker_cfg_offset;
    return f;
}

int node_worker_main_start(const node_worker_main_t *spec, int argc, char **argv, void *cfg,
                           tdm_flags_action_t *action_out)
{
    tdm_flag_t flags[N_SHARED_FLAGS + NODE_WORKER_MAX_OWN_FLAGS];
    size_t n = 0;
    tdm_main_spec_t main_spec;

    if (spec->n_flags > NODE_WORKER_MAX_OWN_FLAGS) {
        fprintf(stderr, "%s: %zu flags of its own, at most %u\n", spec->program, spec->n_flags,
                NODE_WORKER_MAX_OWN_FLAGS);
        return NODE_EXIT_USAGE;
    }
    for (size_t i = 0; i + 1 < N_SHARED_FLAGS; i++) {
        flags[n++] = placed(&shared_flags[i], spec->worker_cfg_offset);
    }
    for (size_t i = 0; i < spec->n_flags; i++) {
        flags[n++] = spec->flags[i];
    }
    flags[n++] = placed(&shared_flags[N_SHARED_FLAGS - 1], spec->worker_cfg_offset);
    main_spec.program = spec->program;
    main_spec.summary = spec->summary;
    main_spec.flags = flags;
    main_spec.n_flags = n;
    main_spec.log_level_offset = spec->worker_cfg_offset + offsetof(node_worker_cfg_t, log_level);
    if (tdm_main_start(&main_spec, argc, argv, cfg, action_out) != TDM_OK) {
        return NODE_EXIT_USAGE;
    }
    if (*action_out == TDM_FLAGS_HELP) {
        return NODE_EXIT_OK;
    }
    if (tdm_signals_install(on_signal, TDM_SIGNALS_IGNORE_PIPE) != TDM_OK) {
        return NODE_EXIT_FAILED;
    }
    return NODE_EXIT_OK;
}

/*
 * --device: opened before anything is loaded (kernels/device.h: a CUDA device becomes the
 * calling thread's current device; the node's scheduler and compute run on this thread), so a
 * bad value or a missing device exits 2 with one line naming it. The node's KV pages then live
 * where its kernels run (node/node_pages.h).
 */
static int node_worker_open_device(node_worker_t *w, const char *program)
{
    char err[WORKER_ERR_BYTES] = "";
    const char *text = w->cfg->device != NULL ? w->cfg->device : "cpu";

    if (kern_device_open(text, NULL, &w->ops, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "%s: --device: %s\n", program, err);
        return NODE_EXIT_USAGE;
    }
    return NODE_EXIT_OK;
}

int node_worker_open(node_worker_t *w, const node_worker_cfg_t *cfg, const char *program,
                     const char *role, Tandem__Role proto_role)
{
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);

    memset(w, 0, sizeof(*w));
    w->cfg = cfg;
    w->program = program;
    w->role = role;
    w->proto_role = proto_role;
    if (node_worker_open_device(w, program) != NODE_EXIT_OK) {
        return NODE_EXIT_USAGE;
    }
    if (node_http_parse_host_port(cfg->http, w->host, sizeof(w->host), &w->port) != 0) {
        fprintf(stderr, "%s: --http=%s is invalid: expected HOST:PORT\n", program, cfg->http);
        return NODE_EXIT_USAGE;
    }
    if (node_xfer_params(program, cfg->transports, cfg->ucx_protocols, cfg->require_transport,
                         &w->xfer_params) != TDM_OK) {
        return NODE_EXIT_USAGE;
    }
    node_xfer_transports(cfg->transports, w->xfer_params.required_lanes, &w->transports);
    /* Register.node: the host name (shared memory reaches only workers of the same one) */
    if (gethostname(w->node, sizeof(w->node) - 1) != 0 || w->node[0] == '\0') {
        snprintf(w->node, sizeof(w->node), "%.128s", w->host);
    }
    w->node[sizeof(w->node) - 1] = '\0';
    for (char *p = w->node; *p != '\0'; p++) {
        if (*p <= ' ' || *p > '~') {
            *p = '_';
        }
    }
    w->n_threads = cfg->threads > 0 ? (int)cfg->threads : (n_cpu > 0 ? (int)n_cpu : 1);
    node_progress_init(&w->progress, cfg->stall_timeout_ms);
    node_link_make_id(role, w->id, sizeof(w->id));
    return NODE_EXIT_OK;
}

/*
 * The byte tries of the checkpoint's tokenizer.json (engine/constrain.h), built once so that a
 * request with a response_format can be masked; a checkpoint without the file serves every other
 * request (constrained ones are refused with a message naming the file).
 */
static int load_constrain_vocab(node_worker_t *w)
{
    char path[PATH_MAX];
    char err[WORKER_ERR_BYTES] = "";
    text_tokenizer_t *tok = NULL;
    uint64_t t0 = tdm_clock_now_ns();
    tdm_status_t status;

    snprintf(path, sizeof(path), "%s/tokenizer.json", w->cfg->model_dir);
    if (access(path, R_OK) != 0) {
        tdm_log(TDM_LOG_INFO, w->role, "no tokenizer.json: constrained decoding off: path=%s",
                path);
        return NODE_EXIT_OK;
    }
    status = text_tokenizer_load_hf(path, &tok, err, sizeof(err));
    if (status == TDM_OK) {
        status =
            engine_constrain_vocab_from_tokenizer(tok, w->config->vocab_size, &w->constrain_vocab);
        snprintf(err, sizeof(err), "%s", tdm_status_message(status));
    }
    text_tokenizer_destroy(tok);
    if (status != TDM_OK) {
        fprintf(stderr, "%s: constrained decoding: %s: %s\n", w->program, path, err);
        return NODE_EXIT_FAILED;
    }
    tdm_log(TDM_LOG_INFO, w->role, "constrained decoding ready: vocab=%lld build_ms=%.0f",
            (long long)w->config->vocab_size, tdm_clock_elapsed_ms(t0));
    return NODE_EXIT_OK;
}

int node_worker_load(node_worker_t *w)
{
    char err[WORKER_ERR_BYTES] = "";
    engine_model_params_t mp;
    kern_kv_geometry_t geometry;
    const engine_config_t *c;
    size_t n_id = strlen(w->id);
    tdm_status_t status;

    engine_model_params_default(&mp);
    mp.n_threads = w->n_threads;
    mp.ops = w->ops;
    mp.map_weights = w->cfg->map_weights;
    status = engine_model_load(w->cfg->model_dir, &mp, &w->model, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "%s: loading %s: %s\n", w->program, w->cfg->model_dir, err);
        return NODE_EXIT_FAILED;
    }
    c = engine_model_config(w->model);
    w->config = c;
    engine_config_kv_layout(c, w->kv_layout, sizeof(w->kv_layout));
    status = tdm_weights_digest(w->cfg->model_dir, 0, &w->weights_digest, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "%s: weights digest of %s: %s\n", w->program, w->cfg->model_dir, err);
        return NODE_EXIT_FAILED;
    }
    tdm_log(TDM_LOG_INFO, w->role,
            "model identity: fingerprint=0x%016llx weights=0x%016llx "
            "kv_layout=%s",
            (unsigned long long)engine_model_fingerprint(w->model),
            (unsigned long long)w->weights_digest, w->kv_layout);
    status =
        kern_kv_geometry((uint32_t)c->head_dim, (uint32_t)c->index_head_dim,
                         engine_config_max_kv_ratio(c), &geometry); /* valid: the model loaded */
    if (status == TDM_OK) {
        w->page_bytes = geometry.page_bytes;
        w->tokens_per_block = geometry.tokens_per_block;
        w->xfer_params.name =
            w->id + (n_id > WORKER_XFER_NAME_BYTES ? n_id - WORKER_XFER_NAME_BYTES : 0);
        status = xfer_context_create(&w->xfer_params, &w->xfer);
    }
    if (status != TDM_OK) {
        fprintf(stderr, "%s: setup failed: %s\n", w->program, tdm_status_message(status));
        return NODE_EXIT_FAILED;
    }
    return load_constrain_vocab(w);
}

/* Start /health and /metrics on --http; w->endpoint = HOST:bound-port. */
static int serve(node_worker_t *w, node_http_render_fn *render, void *arg)
{
    tdm_status_t status =
        node_http_create(w->host, w->port, w->cfg->http_timeout_s, render, arg, &w->http);

    if (status != TDM_OK) {
        fprintf(stderr, "%s: setup failed: %s\n", w->program, tdm_status_message(status));
        return NODE_EXIT_FAILED;
    }
    snprintf(w->endpoint, sizeof(w->endpoint), "%s:%u", w->host, (unsigned)node_http_port(w->http));
    return NODE_EXIT_OK;
}

int node_worker_join(node_worker_t *w, const node_worker_join_t *join)
{
    char err[WORKER_ERR_BYTES] = "";
    node_link_params_t lp;
    const char *transports[NODE_XFER_MAX_TRANSPORTS];
    node_link_t *link = NULL;
    uint32_t kv_pages = join->kv_pages > 0 ? join->kv_pages : join->total_pages;
    tdm_status_t status;
    int rc = serve(w, join->render, join->render_arg);

    if (rc != NODE_EXIT_OK) {
        return rc;
    }
    memset(&lp, 0, sizeof(lp));
    lp.model_fingerprint = engine_model_fingerprint(w->model); /* = the router's (PROTOCOL.md) */
    lp.weights_digest = w->weights_digest;
    lp.kv_layout = w->kv_layout;
    for (uint32_t i = 0; i < w->transports.n_names; i++) {
        transports[i] = w->transports.names[i];
    }
    lp.transports = transports;
    lp.n_transports = w->transports.n_names;
    /* what this worker's pages really hold for one sequence (issue 16) */
    lp.max_tokens = kv_pages > 0
                        ? engine_config_max_tokens_in_pages(
                              w->config, kv_pages, (uint64_t)w->config->max_position_embeddings)
                        : 0;
    lp.router_endpoint = w->cfg->router;
    lp.role = w->proto_role;
    lp.incarnation_id = w->id;
    lp.rack = w->cfg->rack;
    lp.node = w->node;
    lp.page_bytes = w->page_bytes;
    lp.tokens_per_block = w->tokens_per_block;
    lp.max_context = (uint32_t)w->config->max_position_embeddings;
    lp.transfer_descriptor = join->transfer_descriptor;
    lp.n_transfer_descriptor = join->n_transfer_descriptor;
    lp.total_pages = join->total_pages;
    lp.max_sequences = join->max_sequences;
    lp.max_batch_tokens = w->cfg->chunk_tokens;
    lp.http_endpoint = w->endpoint;
    lp.register_timeout_ms = w->cfg->register_timeout_ms;
    lp.curve_key = w->cfg->curve_key;
    lp.curve_router_key = w->cfg->curve_router_key;
    lp.progress = &w->progress;
    tdm_log(TDM_LOG_INFO, w->role, "declared: max_tokens=%llu pages=%u transports=%u",
            (unsigned long long)lp.max_tokens, kv_pages, lp.n_transports);
    status = node_link_create(&lp, &link, err, sizeof(err));
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, w->role, "cannot join the cluster: %s", err);
        fprintf(stderr, "%s: %s\n", w->program, err);
        return status == TDM_ERR_MISMATCH ? NODE_EXIT_REFUSED : NODE_EXIT_FAILED;
    }
    __atomic_store_n(&w->link, link, __ATOMIC_RELEASE); /* /metrics reads it */
    return NODE_EXIT_OK;
}

/* The /metrics text: the worker's families, then transfer/'s. NULL when out of memory. */
static char *render_metrics(const node_worker_t *w, node_worker_families_fn *families, void *arg)
{
    tdm_prom_t *p;
    char *text = NULL;
    size_t n_bytes = 0;
    node_progress_view_t v;
    node_link_t *link;

    if (tdm_prom_create(&p) != TDM_OK) {
        return NULL;
    }
    families(arg, p);
    node_progress_read(&w->progress, tdm_clock_now_ns(), &v);
    tdm_prom_counter(p, "tandem_worker_compute_steps_total",
                     "compute-thread steps completed (liveness from progress)", v.steps_completed);
    tdm_prom_gauge(p, "tandem_worker_pending_work",
                   "requests, jobs and messages waiting on the compute thread", v.pending_work);
    tdm_prom_gauge(p, "tandem_worker_seconds_since_compute_step",
                   "seconds since the compute thread last completed a step",
                   (double)v.since_step_ms / 1000.0);
    tdm_prom_gauge(p, "tandem_worker_stalled",
                   "1 while work is pending and no step completed for --stall-timeout-ms",
                   v.stalled ? 1.0 : 0.0);
    tdm_prom_gauge(p, "tandem_worker_draining", "1 once SIGTERM started a drain",
                   v.draining ? 1.0 : 0.0);
    link = __atomic_load_n(&w->link, __ATOMIC_ACQUIRE); /* set by node_worker_join */
    if (link != NULL) {
        tdm_prom_gauge(p, "tandem_worker_routers", "routers this worker links to (--router)",
                       node_link_n_routers(link));
        tdm_prom_gauge(p, "tandem_worker_routers_registered",
                       "routers that accept this worker now (registered)",
                       node_link_n_registered(link));
    }
    if (w->xfer != NULL) {
        xfer_metrics_render_to(xfer_context_metrics(w->xfer), p);
    }
    return tdm_prom_finish(p, &text, &n_bytes) == TDM_OK ? text : NULL;
}

int node_worker_render(const node_worker_t *w, node_http_page_t page, int ready,
                       const char *health_fields, node_worker_families_fn *families, void *arg,
                       char **body_out)
{
    char *body;
    char reason[160] = "";
    const char *status_text = ready ? "ok" : "starting";
    node_progress_view_t v;

    if (page == NODE_HTTP_METRICS) {
        body = render_metrics(w, families, arg);
        *body_out = body;
        return body != NULL ? TDM_HTTP_OK : TDM_HTTP_INTERNAL;
    }
    body = malloc(WORKER_HEALTH_BYTES);
    *body_out = body;
    if (body == NULL) {
        return TDM_HTTP_INTERNAL;
    }
    node_progress_read(&w->progress, tdm_clock_now_ns(), &v);
    if (ready && v.stalled) {
        status_text = "stalled";
        snprintf(reason, sizeof(reason),
                 "\"reason\":\"%u pending and no compute step for %llu ms (limit %u ms)\",",
                 v.pending_work, (unsigned long long)v.since_step_ms, w->progress.stall_ms);
    } else if (ready && v.draining) {
        status_text = "draining";
    }
    snprintf(body, WORKER_HEALTH_BYTES,
             "{\"status\":\"%s\",%s\"role\":\"%s\",\"id\":\"%s\",\"steps_completed\":%llu,"
             "\"pending_work\":%u,%s}\n",
             status_text, reason, w->role, w->id, (unsigned long long)v.steps_completed,
             v.pending_work, health_fields);
    /* draining stays 200: the node is alive and finishing its streams (a liveness probe must not
     * kill it); the router learns of the drain from its heartbeats */
    return strcmp(status_text, "ok") == 0 || strcmp(status_text, "draining") == 0
               ? TDM_HTTP_OK
               : TDM_HTTP_UNAVAILABLE;
}

void node_worker_stop_http(node_worker_t *w)
{
    node_http_destroy(w->http);
    w->http = NULL;
}

void node_worker_leave(node_worker_t *w, const char *reason)
{
    node_worker_stop_http(w);
    node_link_destroy(w->link, reason);
    w->link = NULL;
}

void node_worker_close(node_worker_t *w)
{
    xfer_context_destroy(w->xfer);
    w->xfer = NULL;
    engine_constrain_vocab_destroy(w->constrain_vocab);
    w->constrain_vocab = NULL;
    engine_model_destroy(w->model);
    w->model = NULL;
    w->config = NULL;
}
