/* metrics.c - Prometheus text parsing and scraping; see metrics.h. */
#include "bench/replay/metrics.h"

#include "bench/replay/client.h"
#include "common/buf.h"
#include "common/log.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char *const metric_names[BENCH_N_METRICS] = {
    BENCH_METRIC_PREFILL_COMPUTED,
    BENCH_METRIC_PREFILL_REUSED,
    BENCH_METRIC_KV_BYTES_MOVED,
};

static const char *const raw_names[BENCH_N_RAW] = {
    BENCH_METRIC_PREFILL_COMPUTED, BENCH_METRIC_PREFILL_REUSED, BENCH_METRIC_KV_BYTES_MOVED,
    BENCH_METRIC_ROUTER_PROMPT,    BENCH_METRIC_ROUTER_PREFILL,
};

const char *bench_metric_name(bench_metric_t metric)
{
    return (unsigned)metric < BENCH_N_METRICS ? metric_names[metric] : "unknown";
}

/* Value of one sample line if its metric name is `name`; returns 1 and sets *value_out. */
static int sample_value(const char *line, size_t n_line, const char *name, size_t n_name,
                        double *value_out)
{
    size_t pos = n_name;
    char number[64];
    size_t n_number = 0;
    char *end;
    double value;

    if (n_line <= n_name || memcmp(line, name, n_name) != 0) {
        return 0;
    }
    if (line[pos] == '{') {
        int in_quotes = 0;
        for (pos++; pos < n_line; pos++) {
            if (in_quotes && line[pos] == '\\') {
                pos++;
            } else if (line[pos] == '"') {
                in_quotes = !in_quotes;
            } else if (!in_quotes && line[pos] == '}') {
                break;
            }
        }
        if (pos >= n_line) {
            return 0;
        }
        pos++;
    }
    if (pos >= n_line || (line[pos] != ' ' && line[pos] != '\t')) {
        return 0;
    }
    while (pos < n_line && (line[pos] == ' ' || line[pos] == '\t')) {
        pos++;
    }
    while (pos < n_line && !isspace((unsigned char)line[pos]) && n_number + 1 < sizeof(number)) {
        number[n_number++] = line[pos++];
    }
    number[n_number] = '\0';
    value = strtod(number, &end);
    if (n_number == 0 || *end != '\0') {
        return 0;
    }
    *value_out = value;
    return 1;
}

tdm_status_t bench_metrics_sum(const char *text, size_t n_bytes, const char *name, double *sum_out)
{
    size_t n_name = strlen(name);
    size_t pos = 0;
    double sum = 0.0;
    int found = 0;

    while (pos < n_bytes) {
        const char *line = text + pos;
        const char *newline = memchr(line, '\n', n_bytes - pos);
        size_t n_line = newline != NULL ? (size_t)(newline - line) : n_bytes - pos;
        double value;

        pos += n_line + 1;
        if (n_line == 0 || line[0] == '#') {
            continue;
        }
        if (sample_value(line, n_line, name, n_name, &value)) {
            sum += value;
            found = 1;
        }
    }
    if (!found) {
        return TDM_ERR_NOT_FOUND;
    }
    *sum_out = sum;
    return TDM_OK;
}

void bench_metrics_add_text(const char *text, size_t n_bytes, bench_metrics_snapshot_t *snapshot)
{
    for (int m = 0; m < BENCH_N_RAW; m++) {
        double value;
        if (bench_metrics_sum(text, n_bytes, raw_names[m], &value) == TDM_OK) {
            snapshot->raw[m] += value;
            snapshot->raw_present[m] = 1;
        }
    }
}

void bench_metrics_resolve(bench_metrics_snapshot_t *snapshot)
{
    const double *raw = snapshot->raw;
    const int *have = snapshot->raw_present;

    memset(snapshot->values, 0, sizeof(snapshot->values));
    memset(snapshot->present, 0, sizeof(snapshot->present));
    if (have[BENCH_RAW_COMPUTED]) {
        snapshot->values[BENCH_METRIC_COMPUTED] = raw[BENCH_RAW_COMPUTED];
        snapshot->present[BENCH_METRIC_COMPUTED] = 1;
    } else if (have[BENCH_RAW_ROUTER_PREFILL]) {
        snapshot->values[BENCH_METRIC_COMPUTED] = raw[BENCH_RAW_ROUTER_PREFILL];
        snapshot->present[BENCH_METRIC_COMPUTED] = 1;
    }
    if (have[BENCH_RAW_REUSED]) {
        snapshot->values[BENCH_METRIC_REUSED] = raw[BENCH_RAW_REUSED];
        snapshot->present[BENCH_METRIC_REUSED] = 1;
    } else if (have[BENCH_RAW_ROUTER_PROMPT] && have[BENCH_RAW_ROUTER_PREFILL]) {
        snapshot->values[BENCH_METRIC_REUSED] =
            raw[BENCH_RAW_ROUTER_PROMPT] - raw[BENCH_RAW_ROUTER_PREFILL];
        snapshot->present[BENCH_METRIC_REUSED] = 1;
    }
    if (have[BENCH_RAW_KV_BYTES]) {
        snapshot->values[BENCH_METRIC_KV_BYTES] = raw[BENCH_RAW_KV_BYTES];
        snapshot->present[BENCH_METRIC_KV_BYTES] = 1;
    }
}

tdm_status_t bench_metrics_scrape(const char *const *urls, size_t n_urls, long timeout_ms,
                                  bench_metrics_snapshot_t *snapshot_out)
{
    tdm_buf_t body = {0};

    memset(snapshot_out, 0, sizeof(*snapshot_out));
    for (size_t i = 0; i < n_urls; i++) {
        long http_status = 0;
        tdm_status_t status = bench_http_get(urls[i], NULL, timeout_ms, &body, &http_status);
        if (status != TDM_OK) {
            tdm_log(TDM_LOG_DEBUG, "bench", "metrics scrape failed: url=%s http_status=%ld",
                    urls[i], http_status);
            continue;
        }
        snapshot_out->n_endpoints_ok++;
        bench_metrics_add_text(body.data, body.n_bytes, snapshot_out);
    }
    tdm_buf_fini(&body);
    bench_metrics_resolve(snapshot_out);
    return snapshot_out->n_endpoints_ok > 0 ? TDM_OK : TDM_ERR_NOT_FOUND;
}
