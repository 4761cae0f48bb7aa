/* tandem-router - the cluster's front door: OpenAI-compatible HTTP API, session table, placement
 * and the control plane to prefill and decode workers (ARCHITECTURE.md, docs/PROTOCOL.md).
 * Runs until SIGINT or SIGTERM, then stops cleanly.
 */
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/flags.h"
#include "common/log.h"
#include "common/startup.h"
#include "router/router.h"

#define ROUTER_ERR_BYTES  512
#define ROUTER_HOST_BYTES 256
#define ROUTER_MIB        (1024ull * 1024ull)

typedef struct {
    const char *model_dir;
    const char *served_name;
    const char *http;
    const char *control;
    uint32_t max_context;
    uint32_t local_prefill_tokens;
    uint32_t heartbeat_interval_ms;
    uint32_t heartbeat_timeout_ms;
    uint32_t stall_grace_ms;
    uint32_t max_sessions;
    uint32_t max_attempts;
    uint32_t reservation_timeout_ms;
    uint32_t prefill_timeout_ms;
    uint32_t request_timeout_ms;
    uint32_t max_body_mib;
    uint32_t max_connections;
    uint32_t max_connections_per_ip;
    uint32_t http_idle_timeout_s;
    uint32_t http_header_timeout_s;
    uint32_t http_body_timeout_s;
    const char *api_keys_file;
    const char *api_keys;
    uint32_t api_key_concurrency;
    uint32_t api_key_rpm;
    const char *curve_secret_key;
    const char *curve_workers;
    const char *router_id;
    const char *peers;
    uint32_t relearn_warmup_ms;
    const char *log_level;
} router_cfg_t;

static const tdm_flag_t router_flags[] = {
    {"model", TDM_FLAG_PATH, NULL, offsetof(router_cfg_t, model_dir),
     "model directory (config.json, tokenizer.json, safetensors)", 0, 0, 1},
    {"served-model-name", TDM_FLAG_STRING, NULL, offsetof(router_cfg_t, served_name),
     "the \"model\" clients send (default: the model directory's name)", 0, 0, 0},
    {"http", TDM_FLAG_STRING, "127.0.0.1:8000", offsetof(router_cfg_t, http),
     "HOST:PORT of the OpenAI-compatible HTTP API (port 0: any free port)", 0, 0, 0},
    {"control", TDM_FLAG_STRING, "tcp://127.0.0.1:5557", offsetof(router_cfg_t, control),
     "ZeroMQ endpoint workers connect to (bound here)", 0, 0, 0},
    {"max-context", TDM_FLAG_U32, "0", offsetof(router_cfg_t, max_context),
     "prompt + completion token limit (0: config max_position_embeddings)", 0, 4294967295.0, 0},
    {"local-prefill-tokens", TDM_FLAG_U32, "512", offsetof(router_cfg_t, local_prefill_tokens),
     "deltas shorter than this prefill on the decode node (MODEL.md 6(d))", 1, 4294967295.0, 0},
    {"heartbeat-interval-ms", TDM_FLAG_U32, "250", offsetof(router_cfg_t, heartbeat_interval_ms),
     "heartbeat period announced to workers, ms", 10, 60000, 0},
    {"heartbeat-timeout-ms", TDM_FLAG_U32, "1500", offsetof(router_cfg_t, heartbeat_timeout_ms),
     "silence after which a worker is lost, ms (counted only while the router runs)", 50, 600000,
     0},
    {"stall-grace-ms", TDM_FLAG_U32, "10000", offsetof(router_cfg_t, stall_grace_ms),
     "a worker reporting itself stalled (work pending, no progress) this long is lost, ms; "
     "new work skips it at once",
     100, 3600000, 0},
    {"max-sessions", TDM_FLAG_U32, "65536", offsetof(router_cfg_t, max_sessions),
     "sessions kept (least recently used idle ones are evicted)", 1, 16777216, 0},
    {"max-attempts", TDM_FLAG_U32, "4", offsetof(router_cfg_t, max_attempts),
     "tries per turn when workers are lost", 1, 100, 0},
    {"reservation-timeout-ms", TDM_FLAG_U32, "10000",
     offsetof(router_cfg_t, reservation_timeout_ms), "deadline for a page reservation, ms", 100,
     3600000, 0},
    {"prefill-timeout-ms", TDM_FLAG_U32, "600000", offsetof(router_cfg_t, prefill_timeout_ms),
     "deadline for a prefill job's completion notice, ms", 100, 86400000, 0},
    {"request-timeout-ms", TDM_FLAG_U32, "600000", offsetof(router_cfg_t, request_timeout_ms),
     "longest wait for a request's next token, ms", 100, 86400000, 0},
    {"max-body-mib", TDM_FLAG_U32, "64", offsetof(router_cfg_t, max_body_mib),
     "largest request body, MiB", 1, 4096, 0},
    {"max-connections", TDM_FLAG_U32, "1024", offsetof(router_cfg_t, max_connections),
     "concurrent HTTP connections", 1, 65536, 0},
    {"max-connections-per-ip", TDM_FLAG_U32, "0", offsetof(router_cfg_t, max_connections_per_ip),
     "concurrent HTTP connections from one client address (0: no limit; behind a proxy every "
     "client shares its address)",
     0, 65536, 0},
    {"http-idle-timeout-s", TDM_FLAG_U32, "30", offsetof(router_cfg_t, http_idle_timeout_s),
     "close an HTTP connection silent this long (not while a generation runs), s", 1, 86400, 0},
    {"http-header-timeout-s", TDM_FLAG_U32, "30", offsetof(router_cfg_t, http_header_timeout_s),
     "a request's headers must be complete within this, s", 1, 86400, 0},
    {"http-body-timeout-s", TDM_FLAG_U32, "30", offsetof(router_cfg_t, http_body_timeout_s),
     "a request's body must be complete this long after its headers, s", 1, 86400, 0},
    {"api-keys-file", TDM_FLAG_PATH, NULL, offsetof(router_cfg_t, api_keys_file),
     "API key file: one 'KEY [name=N] [concurrency=N] [rpm=N]' per line (docs/DEPLOY.md)", 0, 0, 0},
    {"api-keys", TDM_FLAG_STRING, NULL, offsetof(router_cfg_t, api_keys),
     "API key entries separated by commas (prefer the env TANDEM_API_KEYS or the file); none "
     "given anywhere: the API is open",
     0, 0, 0},
    {"api-key-concurrency", TDM_FLAG_U32, "0", offsetof(router_cfg_t, api_key_concurrency),
     "requests in flight per API key unless its entry says (0: unlimited)", 0, 4294967295.0, 0},
    {"api-key-rpm", TDM_FLAG_U32, "0", offsetof(router_cfg_t, api_key_rpm),
     "requests per minute per API key unless its entry says (0: unlimited)", 0, 4294967295.0, 0},
    {"curve-secret-key", TDM_FLAG_PATH, NULL, offsetof(router_cfg_t, curve_secret_key),
     "CurveZMQ key file of the router (tandem keygen): the control plane is encrypted and "
     "workers must present an allowed key (needs --curve-workers)",
     0, 0, 0},
    {"curve-workers", TDM_FLAG_PATH, NULL, offsetof(router_cfg_t, curve_workers),
     "file of the worker public keys allowed to connect (one Z85 key per line)", 0, 0, 0},
    {"router-id", TDM_FLAG_STRING, NULL, offsetof(router_cfg_t, router_id),
     "this router's id among its --peers (default: router-PID-RANDOM, a fleet of one)", 0, 0, 0},
    {"peers", TDM_FLAG_STRING, NULL, offsetof(router_cfg_t, peers),
     "the fleet's routers as ID=ENDPOINT,... (control endpoints; this router's own entry is "
     "skipped): sessions are owned by consistent hashing and replicated to the owner and the next "
     "router after each turn (docs/ROUTERS.md)",
     0, 0, 0},
    {"relearn-warmup-ms", TDM_FLAG_U32, "0", offsetof(router_cfg_t, relearn_warmup_ms),
     "for this long after start, a named session that no decode node reports yet waits for "
     "their heartbeats (workers registering again after a restart) before it starts over, ms "
     "(0: never waits; docs/ROUTERS.md)",
     0, 600000, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(router_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

/* Split "HOST:PORT" (HOST may be [v6]) into host and port. */
static int parse_host_port(const char *text, char *host, size_t host_bytes, uint16_t *port_out)
{
    const char *colon = strrchr(text, ':');
    size_t n;
    char *end;
    unsigned long port;

    if (colon == NULL || colon == text) {
        return -1;
    }
    port = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] == '\0' || port > 65535) {
        return -1;
    }
    n = (size_t)(colon - text);
    if (text[0] == '[' && n >= 2 && text[n - 1] == ']') {
        text++;
        n -= 2;
    }
    if (n == 0 || n >= host_bytes) {
        return -1;
    }
    memcpy(host, text, n);
    host[n] = '\0';
    *port_out = (uint16_t)port;
    return 0;
}

int main(int argc, char **argv)
{
    static const char summary[] =
        "OpenAI-compatible router of a Tandem prefill/decode cluster (docs/PROTOCOL.md)";
    static const tdm_main_spec_t spec = {"tandem-router", summary, router_flags,
                                         sizeof(router_flags) / sizeof(router_flags[0]),
                                         offsetof(router_cfg_t, log_level)};
    router_cfg_t cfg;
    router_params_t params;
    tdm_flags_action_t action;
    char host[ROUTER_HOST_BYTES];
    char err[ROUTER_ERR_BYTES] = "";
    router_t *router;
    sigset_t signals;
    int sig = 0;

    memset(&cfg, 0, sizeof(cfg));
    if (tdm_main_start(&spec, argc, argv, &cfg, &action) != TDM_OK) {
        return 2;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    router_params_default(&params);
    if (parse_host_port(cfg.http, host, sizeof(host), &params.http.port) != 0) {
        fprintf(stderr,
                "tandem-router: --http=%s is invalid: expected HOST:PORT with PORT in "
                "[0, 65535]\n",
                cfg.http);
        return 2;
    }
    if (cfg.heartbeat_timeout_ms <= cfg.heartbeat_interval_ms) {
        fprintf(stderr,
                "tandem-router: --heartbeat-timeout-ms=%u must exceed "
                "--heartbeat-interval-ms=%u\n",
                cfg.heartbeat_timeout_ms, cfg.heartbeat_interval_ms);
        return 2;
    }
    params.model.model_dir = cfg.model_dir;
    params.model.served_name = cfg.served_name;
    params.model.max_context = cfg.max_context;
    params.http.host = host;
    params.http.max_body_bytes = (size_t)cfg.max_body_mib * ROUTER_MIB;
    params.http.max_connections = cfg.max_connections;
    params.http.max_connections_per_ip = cfg.max_connections_per_ip;
    params.http.turn.timeout_ms = cfg.request_timeout_ms;
    params.http.idle_timeout_s = cfg.http_idle_timeout_s;
    params.http.header_timeout_s = cfg.http_header_timeout_s;
    params.http.body_timeout_s = cfg.http_body_timeout_s;
    params.http.api_keys_file = cfg.api_keys_file;
    params.http.api_keys = cfg.api_keys;
    params.http.key_limits.max_concurrency = cfg.api_key_concurrency;
    params.http.key_limits.rpm = cfg.api_key_rpm;
    if ((cfg.curve_secret_key == NULL) != (cfg.curve_workers == NULL)) {
        fprintf(stderr, "tandem-router: --curve-secret-key and --curve-workers go together\n");
        return 2;
    }
    params.control.curve_secret_key = cfg.curve_secret_key;
    params.control.curve_workers = cfg.curve_workers;
    params.control.endpoint = cfg.control;
    params.control.router_id = cfg.router_id;
    params.control.peers = cfg.peers;
    params.control.relearn_warmup_ms = cfg.relearn_warmup_ms;
    params.control.heartbeat_interval_ms = cfg.heartbeat_interval_ms;
    params.control.heartbeat_timeout_ms = cfg.heartbeat_timeout_ms;
    params.control.stall_grace_ms = cfg.stall_grace_ms;
    params.control.max_sessions = cfg.max_sessions;
    params.control.dispatch.local_prefill_tokens = cfg.local_prefill_tokens;
    params.control.dispatch.max_attempts = cfg.max_attempts;
    params.control.dispatch.reservation_timeout_ms = cfg.reservation_timeout_ms;
    params.control.dispatch.prefill_timeout_ms = cfg.prefill_timeout_ms;

    /* Every thread inherits the blocked mask; main waits for the signals synchronously. */
    if (tdm_signals_block(TDM_SIGNALS_IGNORE_PIPE, &signals) != TDM_OK) {
        return 1;
    }

    if (router_create(&params, &router, err, sizeof(err)) != TDM_OK) {
        fprintf(stderr, "tandem-router: cannot start: %s\n", err);
        return 1;
    }
    sigwait(&signals, &sig);
    tdm_log(TDM_LOG_INFO, "router", "stopping: signal=%d", sig);
    router_destroy(router);
    return 0;
}
