/* tandem-bench - AgentPerf-style replay of coding-agent sessions against Tandem's OpenAI API,
 * synthetic coding-agent traces, and a fake server for trying it without a cluster.
 *
 *   tandem-bench replay --url URL [--trace FILE] [--concurrency 1,2,4] ...
 *   tandem-bench synth --sessions N [--seed N] --out FILE
 *   tandem-bench fake-server [--port 8000] [--ttft-ms 20] [--itl-ms 5] ...
 *
 * docs/BENCH.md describes the method, every figure and the /metrics names it reads.
 */
#include "bench/replay/fake_server.h"
#include "bench/replay/replay.h"
#include "bench/replay/report.h"
#include "bench/replay/synth.h"
#include "bench/replay/tokens.h"
#include "bench/replay/trace.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/startup.h"

#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef TANDEM_BENCH_TRACE_DIR
#define TANDEM_BENCH_TRACE_DIR "bench/traces"
#endif
#define BENCH_DEFAULT_TRACE      TANDEM_BENCH_TRACE_DIR "/mooncake-conversation-slice.jsonl"
#define BENCH_DEFAULT_DURATION_S 60.0
#define BENCH_ERR_BYTES          1024
#define BENCH_PATH_BYTES         4096
#define BENCH_LIST_BYTES         4096
#define BENCH_EXIT_USAGE         2

/* The one process-wide flag a signal handler may touch (C11 7.14.1.1): set on SIGINT/SIGTERM. */
static atomic_int bench_interrupted;

static void on_signal(int signo)
{
    (void)signo;
    atomic_store(&bench_interrupted, 1);
}

/* ---- replay ---- */

typedef struct {
    const char *url;
    const char *trace;
    const char *format;
    const char *concurrency;
    double duration_s;
    uint64_t sessions;
    double scale;
    uint64_t max_context;
    uint64_t seed;
    uint32_t vocab;
    const char *model;
    const char *metrics_url;
    double pause_scale;
    double max_pause_s;
    double timeout_s;
    uint64_t max_errors;
    int session_header;
    const char *api_key;
    const char *out_dir;
    uint32_t cores;
    int progress;
    const char *powercap;
    const char *nvml;
    const char *log_level;
} replay_cfg_t;

static const tdm_flag_t replay_flags[] = {
    {"url", TDM_FLAG_STRING, NULL, offsetof(replay_cfg_t, url),
     "server base URL, e.g. http://127.0.0.1:8000 (the router)", 0, 0, 1},
    {"trace", TDM_FLAG_PATH, BENCH_DEFAULT_TRACE, offsetof(replay_cfg_t, trace),
     "Mooncake JSONL, SWE-agent .traj file, or a folder of .traj files", 0, 0, 0},
    {"format", TDM_FLAG_STRING, "auto", offsetof(replay_cfg_t, format),
     "mooncake, swe-agent or auto (.traj or folder: swe-agent)", 0, 0, 0},
    {"concurrency", TDM_FLAG_STRING, "1,2,4", offsetof(replay_cfg_t, concurrency),
     "comma-separated agent counts, one level each, run in order", 0, 0, 0},
    {"duration", TDM_FLAG_F64, "0", offsetof(replay_cfg_t, duration_s),
     "seconds per level (0: none; with --sessions 0 too, 60 s)", 0, 86400, 0},
    {"sessions", TDM_FLAG_U64, "0", offsetof(replay_cfg_t, sessions),
     "sessions started per level (0: no limit)", 0, 1e12, 0},
    {"scale", TDM_FLAG_F64, "1", offsetof(replay_cfg_t, scale),
     "multiply Mooncake lengths and blocks, and SWE-agent message text and output, by this, for "
     "CPU runs",
     1e-4, 1, 0},
    {"max-context", TDM_FLAG_U64, "0", offsetof(replay_cfg_t, max_context),
     "end a session before a turn whose prompt + output exceeds this (0: server's max)", 0, 1e12,
     0},
    {"seed", TDM_FLAG_U64, "1", offsetof(replay_cfg_t, seed), "token salt and pause draws", 0, 0,
     0},
    {"vocab", TDM_FLAG_U32, "0", offsetof(replay_cfg_t, vocab),
     "vocabulary size for token ids (0: from GET /v1/models)", 0, 1e9, 0},
    {"model", TDM_FLAG_STRING, NULL, offsetof(replay_cfg_t, model),
     "model name to send (default: first of GET /v1/models, else tandem)", 0, 0, 0},
    {"metrics-url", TDM_FLAG_STRING, NULL, offsetof(replay_cfg_t, metrics_url),
     "comma-separated /metrics URLs summed (default URL/metrics; none: skip)", 0, 0, 0},
    {"pause-scale", TDM_FLAG_F64, "1", offsetof(replay_cfg_t, pause_scale),
     "multiply every tool pause by this", 0, 1000, 0},
    {"max-pause", TDM_FLAG_F64, "10", offsetof(replay_cfg_t, max_pause_s),
     "cap on one tool pause, seconds", 0, 86400, 0},
    {"timeout", TDM_FLAG_F64, "600", offsetof(replay_cfg_t, timeout_s),
     "per-request timeout, seconds", 1, 86400, 0},
    {"max-errors", TDM_FLAG_U64, "100", offsetof(replay_cfg_t, max_errors),
     "stop a level after this many failed requests", 1, 1e12, 0},
    {"session-header", TDM_FLAG_BOOL, "true", offsetof(replay_cfg_t, session_header),
     "send X-Session-Id with every request", 0, 0, 0},
    {"api-key", TDM_FLAG_STRING, NULL, offsetof(replay_cfg_t, api_key),
     "bearer token for the server", 0, 0, 0},
    {"out", TDM_FLAG_PATH, "tandem-bench-out", offsetof(replay_cfg_t, out_dir),
     "folder for results.json, requests.csv and throughput.png (created)", 0, 0, 0},
    {"cores", TDM_FLAG_U32, "0", offsetof(replay_cfg_t, cores),
     "cores for tok/s per core when power is not measured (0: this host's online CPUs)", 0, 1e6, 0},
    {"progress", TDM_FLAG_BOOL, "true", offsetof(replay_cfg_t, progress),
     "live progress line on stderr", 0, 0, 0},
    {"powercap", TDM_FLAG_PATH, "/sys/class/powercap", offsetof(replay_cfg_t, powercap),
     "RAPL powercap root", 0, 0, 0},
    {"nvml", TDM_FLAG_STRING, "libnvidia-ml.so.1", offsetof(replay_cfg_t, nvml),
     "NVML library to dlopen (none: skip)", 0, 0, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(replay_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

/* Splits "1,2,4" into levels. Returns 0 and prints why on a bad list. */
static int parse_concurrency(const char *text, bench_replay_params_t *params)
{
    const char *p = text;

    params->n_levels = 0;
    while (*p != '\0') {
        char *end;
        unsigned long value;
        errno = 0;
        value = strtoul(p, &end, 10);
        if (end == p || errno != 0 || value == 0 || value > 100000 ||
            (*end != ',' && *end != '\0') || params->n_levels == BENCH_MAX_LEVELS) {
            fprintf(stderr,
                    "tandem-bench replay: --concurrency=%s: expected up to %d "
                    "comma-separated integers 1..100000\n",
                    text, BENCH_MAX_LEVELS);
            return 0;
        }
        params->concurrency[params->n_levels++] = (uint32_t)value;
        p = *end == ',' ? end + 1 : end;
    }
    if (params->n_levels == 0) {
        fprintf(stderr, "tandem-bench replay: --concurrency is empty\n");
        return 0;
    }
    return 1;
}

/* Splits the metrics list into `storage` (kept for the run). */
static int parse_metrics_urls(const char *text, const char *base_url, char *storage,
                              size_t storage_bytes, bench_replay_params_t *params)
{
    char *save = NULL;
    char *item;

    params->n_metrics_urls = 0;
    if (text == NULL) {
        snprintf(storage, storage_bytes, "%s/metrics", base_url);
        params->metrics_urls[0] = storage;
        params->n_metrics_urls = 1;
        return 1;
    }
    if (strcmp(text, "none") == 0) {
        return 1;
    }
    snprintf(storage, storage_bytes, "%s", text);
    for (item = strtok_r(storage, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        if (params->n_metrics_urls == BENCH_MAX_METRICS_URLS) {
            fprintf(stderr, "tandem-bench replay: --metrics-url: at most %d URLs\n",
                    BENCH_MAX_METRICS_URLS);
            return 0;
        }
        params->metrics_urls[params->n_metrics_urls++] = item;
    }
    return 1;
}

static int make_dir(const char *path)
{
    char partial[BENCH_PATH_BYTES];
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof(partial)) {
        return 0;
    }
    memcpy(partial, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (partial[i] == '/' || partial[i] == '\0') {
            char saved = partial[i];
            partial[i] = '\0';
            if (mkdir(partial, 0755) != 0 && errno != EEXIST) {
                fprintf(stderr, "tandem-bench replay: mkdir %s: %s\n", partial, strerror(errno));
                return 0;
            }
            partial[i] = saved;
        }
    }
    return 1;
}

static int cmd_replay(int argc, char **argv)
{
    static const tdm_main_spec_t replay_spec = {
        "tandem-bench replay",
        "Replay agent sessions (Mooncake JSONL or SWE-agent .traj) against an OpenAI-compatible "
        "streaming server at each concurrency level; print a table, write results.json, "
        "requests.csv and throughput.png.",
        replay_flags, sizeof(replay_flags) / sizeof(replay_flags[0]),
        offsetof(replay_cfg_t, log_level)};
    replay_cfg_t cfg;
    tdm_flags_action_t action;
    bench_replay_params_t params;
    bench_trace_format_t format;
    bench_trace_t *trace = NULL;
    bench_server_info_t server;
    bench_power_t *power = NULL;
    bench_run_result_t run;
    bench_report_meta_t meta;
    char base_url[BENCH_URL_BYTES];
    char metrics_storage[BENCH_LIST_BYTES];
    char path[BENCH_PATH_BYTES];
    char err[BENCH_ERR_BYTES] = "";
    tdm_status_t status;
    uint64_t n_errors = 0;
    uint64_t n_ok = 0;
    size_t n_url;
    int exit_code = 1;

    memset(&cfg, 0, sizeof(cfg));
    memset(&run, 0, sizeof(run));
    if (tdm_main_start(&replay_spec, argc, argv, &cfg, &action) != TDM_OK) {
        return BENCH_EXIT_USAGE;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    bench_replay_params_default(&params);
    if (!parse_concurrency(cfg.concurrency, &params)) {
        return BENCH_EXIT_USAGE;
    }
    if (bench_trace_format_parse(cfg.format, cfg.trace, &format) != TDM_OK) {
        fprintf(stderr, "tandem-bench replay: --format=%s: expected mooncake, swe-agent or auto\n",
                cfg.format);
        return BENCH_EXIT_USAGE;
    }
    n_url = strlen(cfg.url);
    if (strncmp(cfg.url, "http://", 7) != 0 && strncmp(cfg.url, "https://", 8) != 0) {
        fprintf(stderr, "tandem-bench replay: --url=%s: expected http://host:port\n", cfg.url);
        return BENCH_EXIT_USAGE;
    }
    snprintf(base_url, sizeof(base_url), "%s", cfg.url);
    while (n_url > 0 && base_url[n_url - 1] == '/') {
        base_url[--n_url] = '\0';
    }
    if (n_url >= 3 && strcmp(base_url + n_url - 3, "/v1") == 0) {
        base_url[n_url - 3] = '\0';
    }

    if (tdm_signals_install(on_signal, TDM_SIGNALS_DEFAULT) != TDM_OK) {
        return 1;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    status = bench_trace_load(cfg.trace, format, &trace, err, sizeof(err));
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-bench replay: %s\n", err);
        exit_code = BENCH_EXIT_USAGE;
        goto cleanup_curl;
    }
    status = bench_trace_scale_text(trace, cfg.scale);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-bench replay: scaling the trace's text: %s\n",
                tdm_status_message(status));
        goto destroy_trace;
    }
    tdm_log(TDM_LOG_INFO, "bench",
            "trace loaded: path=%s format=%s sessions=%zu requests=%zu "
            "rebuilt=%zu",
            cfg.trace, bench_trace_format_name(format), trace->n_sessions, trace->n_requests,
            trace->n_rebuilt_sessions);

    status = bench_replay_discover(base_url, cfg.api_key, &server);
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "bench", "GET /v1/models failed: url=%s status=%s", base_url,
                tdm_status_name(status));
    }
    params.base_url = base_url;
    params.model = cfg.model != NULL         ? cfg.model
                   : server.model[0] != '\0' ? server.model
                                             : "tandem";
    params.api_key = cfg.api_key;
    params.duration_s = cfg.duration_s;
    params.n_sessions = cfg.sessions;
    if (params.duration_s <= 0.0 && params.n_sessions == 0) {
        params.duration_s = BENCH_DEFAULT_DURATION_S;
    }
    params.scale = cfg.scale;
    params.seed = cfg.seed;
    params.server_context = server.max_model_len > 0 ? (uint64_t)server.max_model_len : 0;
    params.max_context = cfg.max_context > 0        ? cfg.max_context
                         : server.max_model_len > 0 ? (uint64_t)server.max_model_len
                                                    : 0;
    params.vocab_size = cfg.vocab > 0           ? cfg.vocab
                        : server.vocab_size > 0 ? (uint32_t)server.vocab_size
                                                : 0;
    if (format == BENCH_TRACE_MOONCAKE && params.vocab_size < BENCH_TOKEN_MIN_VOCAB) {
        fprintf(stderr,
                "tandem-bench replay: vocabulary size unknown (GET %s/v1/models gave no "
                "vocab_size): pass --vocab N (>= %d)\n",
                base_url, BENCH_TOKEN_MIN_VOCAB);
        exit_code = BENCH_EXIT_USAGE;
        goto destroy_trace;
    }
    params.pause_scale = cfg.pause_scale;
    params.max_pause_s = cfg.max_pause_s;
    params.timeout_s = cfg.timeout_s;
    params.max_errors = cfg.max_errors;
    params.send_session_header = cfg.session_header;
    params.progress = cfg.progress ? stderr : NULL;
    params.progress_is_tty = isatty(STDERR_FILENO);
    params.abort_flag = &bench_interrupted;
    if (!parse_metrics_urls(cfg.metrics_url, base_url, metrics_storage, sizeof(metrics_storage),
                            &params)) {
        exit_code = BENCH_EXIT_USAGE;
        goto destroy_trace;
    }
    if (!make_dir(cfg.out_dir)) {
        goto destroy_trace;
    }
    status =
        bench_power_create(cfg.powercap, strcmp(cfg.nvml, "none") == 0 ? NULL : cfg.nvml, &power);
    if (status != TDM_OK) {
        goto destroy_trace;
    }

    status = bench_replay_run(&params, trace, power, &run);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-bench replay: run failed: %s\n", tdm_status_message(status));
        if (run.n_levels == 0) {
            goto destroy_power;
        }
    }
    memset(&meta, 0, sizeof(meta));
    meta.trace_path = cfg.trace;
    meta.trace = trace;
    meta.params = &params;
    meta.server = &server;
    meta.power_sources = bench_power_sources(power);
    meta.power_available = bench_power_available(power);
    meta.n_cores = cfg.cores > 0 ? cfg.cores : (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
    bench_report_table(stdout, &meta, &run);
    snprintf(path, sizeof(path), "%s/results.json", cfg.out_dir);
    if (bench_report_write_json(path, &meta, &run) == TDM_OK) {
        fprintf(stdout, "results: %s\n", path);
    }
    snprintf(path, sizeof(path), "%s/requests.csv", cfg.out_dir);
    bench_report_write_csv(path, &run);
    if (bench_report_plot(cfg.out_dir, &meta, &run) == TDM_OK) {
        fprintf(stdout, "chart: %s/throughput.png\n", cfg.out_dir);
    }
    for (size_t l = 0; l < run.n_levels; l++) {
        n_errors += run.levels[l].stats.n_errors;
        n_ok += run.levels[l].stats.n_ok;
    }
    exit_code = status == TDM_OK && n_errors == 0 && n_ok > 0 ? 0 : 1;

destroy_power:
    bench_run_result_fini(&run);
    bench_power_destroy(power);
destroy_trace:
    bench_trace_destroy(trace);
cleanup_curl:
    curl_global_cleanup();
    return exit_code;
}

/* ---- synth ---- */

typedef struct {
    uint64_t sessions;
    uint64_t seed;
    const char *out;
    const char *log_level;
} synth_cfg_t;

static const tdm_flag_t synth_flags[] = {
    {"sessions", TDM_FLAG_U64, NULL, offsetof(synth_cfg_t, sessions), "sessions to write", 1, 1e7,
     1},
    {"seed", TDM_FLAG_U64, "1", offsetof(synth_cfg_t, seed), "random seed", 0, 0, 0},
    {"out", TDM_FLAG_PATH, NULL, offsetof(synth_cfg_t, out), "JSONL file to write ('-': stdout)", 0,
     0, 1},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(synth_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

static int cmd_synth(int argc, char **argv)
{
    static const tdm_main_spec_t synth_spec = {
        "tandem-bench synth",
        "Write coding-agent-shaped sessions as Mooncake JSONL with session_id and delay "
        "(distributions: docs/BENCH.md).",
        synth_flags, sizeof(synth_flags) / sizeof(synth_flags[0]),
        offsetof(synth_cfg_t, log_level)};
    synth_cfg_t cfg;
    tdm_flags_action_t action;
    bench_synth_params_t params;
    bench_synth_summary_t summary;
    FILE *out;
    tdm_status_t status;

    memset(&cfg, 0, sizeof(cfg));
    if (tdm_main_start(&synth_spec, argc, argv, &cfg, &action) != TDM_OK) {
        return BENCH_EXIT_USAGE;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    out = strcmp(cfg.out, "-") == 0 ? stdout : fopen(cfg.out, "w");
    if (out == NULL) {
        fprintf(stderr, "tandem-bench synth: %s: %s\n", cfg.out, strerror(errno));
        return 1;
    }
    params.n_sessions = cfg.sessions;
    params.seed = cfg.seed;
    status = bench_synth_write(&params, out, &summary);
    if (out != stdout && fclose(out) != 0 && status == TDM_OK) {
        status = TDM_ERR_IO;
    }
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-bench synth: %s: %s\n", cfg.out, tdm_status_message(status));
        return 1;
    }
    fprintf(stderr,
            "synth: %llu sessions, %llu requests; input tokens p50 %lld max %lld (%llu above "
            "100K); output p50 %lld; tool pause p50 %lld ms -> %s\n",
            (unsigned long long)summary.n_sessions, (unsigned long long)summary.n_requests,
            (long long)summary.input_p50, (long long)summary.input_max,
            (unsigned long long)summary.n_over_100k, (long long)summary.output_p50,
            (long long)summary.pause_p50_ms, cfg.out);
    return 0;
}

/* ---- fake-server ---- */

typedef struct {
    uint32_t port;
    double ttft_ms;
    double itl_ms;
    double itl_per_stream_ms;
    double prefill_us_per_token;
    uint32_t tokens_per_chunk;
    uint32_t vocab;
    uint64_t max_model_len;
    uint32_t fail_every;
    const char *model;
    const char *log_level;
} fake_cfg_t;

static const tdm_flag_t fake_flags[] = {
    {"port", TDM_FLAG_U32, "8000", offsetof(fake_cfg_t, port), "TCP port on 127.0.0.1", 0, 65535,
     0},
    {"ttft-ms", TDM_FLAG_F64, "20", offsetof(fake_cfg_t, ttft_ms), "first-token delay, ms", 0,
     600000, 0},
    {"itl-ms", TDM_FLAG_F64, "5", offsetof(fake_cfg_t, itl_ms), "delay between chunks, ms", 0,
     60000, 0},
    {"itl-per-stream-ms", TDM_FLAG_F64, "0", offsetof(fake_cfg_t, itl_per_stream_ms),
     "added to the chunk delay for every other open stream, ms", 0, 60000, 0},
    {"prefill-us-per-token", TDM_FLAG_F64, "0", offsetof(fake_cfg_t, prefill_us_per_token),
     "first-token delay added per computed (uncached) prompt token, us", 0, 1e6, 0},
    {"tokens-per-chunk", TDM_FLAG_U32, "1", offsetof(fake_cfg_t, tokens_per_chunk),
     "tokens in each SSE chunk", 1, 1024, 0},
    {"vocab", TDM_FLAG_U32, "129280", offsetof(fake_cfg_t, vocab),
     "vocab_size reported by /v1/models", 16, 1e9, 0},
    {"max-model-len", TDM_FLAG_U64, "1048576", offsetof(fake_cfg_t, max_model_len),
     "max_model_len reported by /v1/models", 1, 1e12, 0},
    {"fail-every", TDM_FLAG_U32, "0", offsetof(fake_cfg_t, fail_every),
     "answer every n-th request with HTTP 500 (0: never)", 0, 1e9, 0},
    {"model", TDM_FLAG_STRING, "tandem-fake", offsetof(fake_cfg_t, model), "model id", 0, 0, 0},
    {"log-level", TDM_FLAG_STRING, "info", offsetof(fake_cfg_t, log_level),
     "trace, debug, info, warn or error", 0, 0, 0},
};

static int cmd_fake_server(int argc, char **argv)
{
    static const tdm_main_spec_t fake_spec = {
        "tandem-bench fake-server",
        "Serve a fake OpenAI-compatible streaming API with controlled timing and Tandem's /metrics "
        "counters, until SIGINT or SIGTERM.",
        fake_flags, sizeof(fake_flags) / sizeof(fake_flags[0]), offsetof(fake_cfg_t, log_level)};
    fake_cfg_t cfg;
    tdm_flags_action_t action;
    bench_fake_params_t params;
    bench_fake_t *fake = NULL;
    sigset_t set;
    int signo;
    tdm_status_t status;

    memset(&cfg, 0, sizeof(cfg));
    if (tdm_main_start(&fake_spec, argc, argv, &cfg, &action) != TDM_OK) {
        return BENCH_EXIT_USAGE;
    }
    if (action == TDM_FLAGS_HELP) {
        return 0;
    }
    bench_fake_params_default(&params);
    params.port = (uint16_t)cfg.port;
    params.ttft_ms = cfg.ttft_ms;
    params.itl_ms = cfg.itl_ms;
    params.itl_per_stream_ms = cfg.itl_per_stream_ms;
    params.prefill_us_per_token = cfg.prefill_us_per_token;
    params.tokens_per_chunk = cfg.tokens_per_chunk;
    params.vocab_size = cfg.vocab;
    params.max_model_len = cfg.max_model_len;
    params.fail_every = cfg.fail_every;
    params.model = cfg.model;

    /* The daemon's threads inherit the mask. */
    if (tdm_signals_block(TDM_SIGNALS_DEFAULT, &set) != TDM_OK) {
        return 1;
    }
    status = bench_fake_create(&params, &fake);
    if (status != TDM_OK) {
        fprintf(stderr, "tandem-bench fake-server: %s\n", tdm_status_message(status));
        return 1;
    }
    fprintf(stdout, "listening on http://127.0.0.1:%u\n", bench_fake_port(fake));
    fflush(stdout);
    sigwait(&set, &signo);
    tdm_log(TDM_LOG_INFO, "bench", "fake server stopping: signal=%d", signo);
    bench_fake_destroy(fake);
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: tandem-bench COMMAND [flags]\n\n"
                 "commands:\n"
                 "  replay       replay agent sessions against an OpenAI-compatible server\n"
                 "  synth        write a synthetic coding-agent trace (Mooncake JSONL)\n"
                 "  fake-server  serve a fake streaming API with Tandem's /metrics\n\n"
                 "'tandem-bench COMMAND --help' lists a command's flags. Method: docs/BENCH.md.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return BENCH_EXIT_USAGE;
    }
    if (strcmp(argv[1], "replay") == 0) {
        return cmd_replay(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "synth") == 0) {
        return cmd_synth(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "fake-server") == 0) {
        return cmd_fake_server(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "tandem-bench: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return BENCH_EXIT_USAGE;
}
