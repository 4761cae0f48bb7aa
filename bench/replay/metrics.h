/* metrics.h - the cluster counters tandem-bench reads from Prometheus /metrics endpoints.
 *
 * Names are the contract with the router and workers (docs/BENCH.md): each is a counter, summed
 * over every sample of that name (any labels) and over every endpoint scraped; the benchmark
 * reports the difference between a scrape before and after each concurrency level. Tandem's
 * router exports the three BENCH_METRIC_* names below (router/metrics.c, counted from the
 * DecodeRequests it sends) and its workers export none of them, so scraping the router and every
 * worker (scripts/demo) counts each once. Owns nothing beyond the snapshots callers hold. Knows
 * nothing of traces or requests.
 */
#ifndef TANDEM_BENCH_METRICS_H
#define TANDEM_BENCH_METRICS_H

#include <stddef.h>

#include "common/status.h"

/* Prompt tokens that went through prefill compute (not found in any KV cache). Tandem: the
 * delta of every turn attempt that reached a decode node (prefilled remotely or locally). */
#define BENCH_METRIC_PREFILL_COMPUTED "tandem_prefill_tokens_computed_total"
/* Prompt tokens served from cached KV (prefix reuse), never recomputed. Tandem: the cached
 * length each decode request continued from. */
#define BENCH_METRIC_PREFILL_REUSED "tandem_prefill_tokens_reused_total"
/* KV bytes moved between workers (prefill-to-decode puts, history pulls, offload returns).
 * Tandem counts the pages prefill nodes put into decode nodes (handoffs x page bytes). */
#define BENCH_METRIC_KV_BYTES_MOVED "tandem_kv_bytes_moved_total"

typedef enum {
    BENCH_METRIC_COMPUTED = 0,
    BENCH_METRIC_REUSED = 1,
    BENCH_METRIC_KV_BYTES = 2,
    BENCH_N_METRICS = 3,
} bench_metric_t;

/* The router's own counters, used when the names above are absent (router/metrics.c). */
#define BENCH_METRIC_ROUTER_PROMPT  "tandem_router_prompt_tokens_total"
#define BENCH_METRIC_ROUTER_PREFILL "tandem_router_prefill_tokens_total"

/* Every name read from the text; resolved into bench_metric_t values. */
typedef enum {
    BENCH_RAW_COMPUTED = 0,
    BENCH_RAW_REUSED = 1,
    BENCH_RAW_KV_BYTES = 2,
    BENCH_RAW_ROUTER_PROMPT = 3,
    BENCH_RAW_ROUTER_PREFILL = 4,
    BENCH_N_RAW = 5,
} bench_metric_raw_t;

/*
 * Summed counters. raw[] are sums of each name over samples and endpoints; values[] are the
 * resolved figures (bench_metrics_resolve): computed = tandem_prefill_tokens_computed_total,
 * else tandem_router_prefill_tokens_total (local + remote delta tokens); reused =
 * tandem_prefill_tokens_reused_total, else router prompt tokens minus router prefill tokens;
 * KV bytes = tandem_kv_bytes_moved_total only. present[i] says whether values[i] is known.
 * Plain data.
 */
typedef struct {
    double raw[BENCH_N_RAW];
    int raw_present[BENCH_N_RAW];
    double values[BENCH_N_METRICS];
    int present[BENCH_N_METRICS];
    size_t n_endpoints_ok; /* endpoints that answered 200 */
} bench_metrics_snapshot_t;

/* bench_metric_name - the exported name of `metric` (one of the macros above). Static. */
const char *bench_metric_name(bench_metric_t metric);

/*
 * bench_metrics_sum - the sum of every sample named exactly `name` (with or without labels) in
 * Prometheus text exposition `text` (n_bytes). Returns TDM_OK with *sum_out set, or
 * TDM_ERR_NOT_FOUND when no sample has that name (*sum_out untouched).
 */
tdm_status_t bench_metrics_sum(const char *text, size_t n_bytes, const char *name, double *sum_out);

/* bench_metrics_add_text - add every raw name found in `text` to snapshot->raw (not resolved). */
void bench_metrics_add_text(const char *text, size_t n_bytes, bench_metrics_snapshot_t *snapshot);

/* bench_metrics_resolve - fill values[] and present[] from raw[] (rules above). */
void bench_metrics_resolve(bench_metrics_snapshot_t *snapshot);

/*
 * bench_metrics_scrape - GET each of n_urls URLs (timeout_ms each) and sum what they export
 * into *snapshot_out (zeroed first, resolved at the end). Endpoints that fail are skipped (debug
 * log). Returns TDM_OK when at least one endpoint answered, else TDM_ERR_NOT_FOUND.
 */
tdm_status_t bench_metrics_scrape(const char *const *urls, size_t n_urls, long timeout_ms,
                                  bench_metrics_snapshot_t *snapshot_out);

#endif
