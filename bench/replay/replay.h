/* replay.h - closed-loop replay of agent sessions at a series of concurrency levels.
 *
 * At level C, C simulated agents run at once. Each takes the next session from the trace (after
 * the last one, the trace starts again with a fresh token salt), sends every turn with its whole
 * context over a streaming request, waits out the tool pause, and sends the next turn. A level
 * ends when its duration has passed (turns in flight finish; no new turns start), when its
 * session budget is spent, or when its error budget is. Per level it keeps every request's
 * timings, the change in the cluster's /metrics counters and the energy measured. Owns the
 * agent threads while a level runs and the results it returns. Knows nothing of output formats
 * (report.h) or of how traces are parsed (trace.h).
 */
#ifndef TANDEM_BENCH_REPLAY_H
#define TANDEM_BENCH_REPLAY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bench/replay/fit.h"
#include "bench/replay/metrics.h"
#include "bench/replay/power.h"
#include "bench/replay/stats.h"
#include "bench/replay/trace.h"
#include "common/status.h"

#define BENCH_MAX_LEVELS       32
#define BENCH_MAX_METRICS_URLS 16
#define BENCH_MODEL_BYTES      256
#define BENCH_URL_BYTES        1024

/* SWE-agent tool pauses (the .traj files record none): lognormal, clamped. docs/BENCH.md. */
#define BENCH_SWE_PAUSE_MEDIAN_MS 4000.0
#define BENCH_SWE_PAUSE_SIGMA     0.9
#define BENCH_SWE_PAUSE_MIN_MS    500.0
#define BENCH_SWE_PAUSE_MAX_MS    60000.0

/* What the server says about itself (GET /v1/models). Plain data. */
typedef struct {
    char model[BENCH_MODEL_BYTES]; /* first model id, "" when none */
    int64_t vocab_size;            /* data[0].vocab_size, or -1 */
    int64_t max_model_len;         /* data[0].max_model_len (or context_length), or -1 */
} bench_server_info_t;

/* Everything a replay needs. Plain data; bench_replay_params_default fills it. */
typedef struct {
    const char *base_url;                             /* "http://host:port" (no /v1) */
    const char *model;                                /* sent as "model" */
    const char *api_key;                              /* bearer key, or NULL */
    const char *metrics_urls[BENCH_MAX_METRICS_URLS]; /* /metrics endpoints summed */
    size_t n_metrics_urls;
    uint32_t concurrency[BENCH_MAX_LEVELS]; /* agents per level, in run order */
    size_t n_levels;
    double duration_s;       /* per level; 0: no time limit */
    uint64_t n_sessions;     /* sessions started per level; 0: no limit (see bench_replay_run) */
    double scale;            /* (0, 1]: Mooncake lengths; SWE-agent output length (main.c cuts
                                the trace's text with bench_trace_scale_text) */
    uint64_t max_context;    /* prompt + output tokens allowed; 0: unlimited */
    uint64_t server_context; /* the server's own limit (/v1/models max_model_len); 0: unknown */
    uint64_t seed;           /* token salt and SWE-agent pause draws */
    uint32_t vocab_size;     /* Mooncake token ids (tokens.h) */
    double pause_scale;      /* every tool pause is multiplied by this ... */
    double max_pause_s;      /* ... then capped at this */
    double timeout_s;        /* per request */
    uint64_t max_errors;     /* a level stops after this many failed requests */
    int send_session_header; /* 1: X-Session-Id on every request */
    FILE *progress;          /* live progress line; NULL: none */
    int progress_is_tty;     /* 1: rewrite one line with \r; 0: a line every few seconds */
    const atomic_int *abort_flag; /* set (e.g. by SIGINT) to stop at once; may be NULL */
} bench_replay_params_t;

/* One concurrency level's outcome. Owns `requests`. */
typedef struct {
    uint32_t concurrency;
    bench_level_stats_t stats;
    bench_metrics_snapshot_t metrics_delta; /* after minus before */
    int metrics_available;                  /* both scrapes answered */
    bench_power_reading_t power;
    uint64_t n_sessions_started;
    uint64_t n_sessions_completed;          /* every turn sent and answered */
    uint64_t n_context_cut;                 /* sessions ended early by max_context */
    uint64_t n_context_errors;              /* failed requests the server refused as too long */
    char first_error[BENCH_FIT_HINT_BYTES]; /* the level's first failure, "" when none */
    double pause_total_s;                   /* tool pauses waited, summed over agents */
    const char *stop_reason;   /* "duration", "sessions", "trace", "errors", "aborted" */
    bench_request_t *requests; /* n_requests records, in completion order per agent */
    size_t n_requests;
} bench_level_result_t;

/* A whole run. Free with bench_run_result_fini. */
typedef struct {
    bench_level_result_t levels[BENCH_MAX_LEVELS];
    size_t n_levels;
    char context_hint[BENCH_FIT_HINT_BYTES]; /* the run's one fit hint (fit.h), "" when none */
} bench_run_result_t;

/*
 * bench_replay_params_default - duration 60 s, no session limit, scale 1, no context limit,
 * seed 1, pause scale 1, pauses capped at 10 s, 600 s request timeout, 100 errors a level,
 * session header on, one level of concurrency 1, no progress output.
 */
void bench_replay_params_default(bench_replay_params_t *params);

/*
 * bench_replay_discover - GET base_url/v1/models into *info_out.
 * Returns TDM_OK, TDM_ERR_PEER_LOST (no answer), TDM_ERR_MISMATCH (not 200) or
 * TDM_ERR_FORMAT (no "data" list); *info_out is always written (empty on failure).
 */
tdm_status_t bench_replay_discover(const char *base_url, const char *api_key,
                                   bench_server_info_t *info_out);

/*
 * bench_replay_run - run every level of `params` over `trace` (borrowed) and fill *result_out.
 * With neither duration_s nor n_sessions set, each level replays every session of the trace
 * once. `power` (borrowed) may be NULL.
 *
 * Context fit (fit.h): with max_context set, a turn whose prompt + output exceeds it ends its
 * session before it is sent when its count is known (Mooncake: exact; chat: the estimate times
 * the ratio learned from the server's usage.prompt_tokens or refusals; until then a chat turn is
 * sent and the server decides). A Mooncake trace whose longest turn does not fit server_context
 * (a smaller max_context is the caller's choice, not a misfit) gets the run's hint before the
 * first level; otherwise the first request the server refuses as too long
 * (bench_fit_parse_error on its error) gets it. The hint is logged once and kept in
 * result_out->context_hint; each level counts those refusals in n_context_errors.
 *
 * Returns TDM_OK (failed requests are counted, not fatal), TDM_ERR_INVALID_ARG (no levels, a
 * level of 0 agents, a Mooncake trace with vocab_size < BENCH_TOKEN_MIN_VOCAB, scale outside
 * (0, 1]; nothing run), TDM_ERR_NO_MEMORY, or TDM_ERR_INTERNAL (a thread could not start).
 * Levels that finished stay in *result_out on error; free it with bench_run_result_fini.
 */
tdm_status_t bench_replay_run(const bench_replay_params_t *params, const bench_trace_t *trace,
                              bench_power_t *power, bench_run_result_t *result_out);

/* bench_run_result_fini - free every level's records; accepts a zeroed result. */
void bench_run_result_fini(bench_run_result_t *result);

/*
 * bench_replay_pause_ms - the tool pause before `turn` (index turn_index > 0) of a session: the
 * trace's delay; else its timestamp gap minus prev_service_ms (floored at 0); else for
 * SWE-agent a lognormal draw keyed by (seed, session_seq, turn_index); else 0. Then multiplied
 * by pause_scale and capped at max_pause_s. Pure.
 */
double bench_replay_pause_ms(const bench_replay_params_t *params, bench_trace_format_t format,
                             const bench_turn_t *turn, uint64_t session_seq, size_t turn_index,
                             double prev_service_ms);

#endif
