/* stats.c - percentiles and level figures; see stats.h for the definitions. */
#include "bench/replay/stats.h"
#include "common/buf.h"
#include "common/clock.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void bench_request_fini(bench_request_t *req)
{
    free(req->gaps_ms);
    req->gaps_ms = NULL;
    req->n_gaps = 0;
    req->gaps_capacity = 0;
}

tdm_status_t bench_request_add_gap(bench_request_t *req, double gap_ms)
{
    if (req->n_gaps == req->gaps_capacity) {
        double *grown =
            tdm_array_grow(req->gaps_ms, sizeof(*grown), req->n_gaps + 1, 64, &req->gaps_capacity);
        if (grown == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        req->gaps_ms = grown;
    }
    req->gaps_ms[req->n_gaps++] = gap_ms;
    return TDM_OK;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_percentile(double *values, size_t n, double p)
{
    double rank;
    size_t lo;
    double frac;

    if (n == 0) {
        return -1.0;
    }
    qsort(values, n, sizeof(double), compare_doubles);
    if (p <= 0.0) {
        return values[0];
    }
    if (p >= 100.0) {
        return values[n - 1];
    }
    rank = p / 100.0 * (double)(n - 1);
    lo = (size_t)floor(rank);
    frac = rank - (double)lo;
    if (lo + 1 >= n) {
        return values[n - 1];
    }
    return values[lo] + frac * (values[lo + 1] - values[lo]);
}

tdm_status_t bench_request_gap_stats(const bench_request_t *req, double *scratch,
                                     double *median_ms_out, double *max_ms_out)
{
    if (req->n_gaps == 0) {
        return TDM_ERR_NOT_FOUND;
    }
    memcpy(scratch, req->gaps_ms, req->n_gaps * sizeof(double));
    *median_ms_out = bench_percentile(scratch, req->n_gaps, 50.0);
    *max_ms_out = scratch[req->n_gaps - 1]; /* sorted by bench_percentile */
    return TDM_OK;
}

/* Per-stream gap figures of the successful records into *stats. */
static tdm_status_t stream_gap_stats(const bench_request_t *reqs, size_t n_reqs,
                                     bench_level_stats_t *stats)
{
    size_t most_gaps = 0;
    double *scratch;
    double *medians;
    size_t n_streams = 0;
    double max_ms = -1.0;

    for (size_t i = 0; i < n_reqs; i++) {
        most_gaps = reqs[i].n_gaps > most_gaps ? reqs[i].n_gaps : most_gaps;
    }
    scratch = malloc((most_gaps + 1) * sizeof(double));
    medians = malloc((n_reqs + 1) * sizeof(double));
    if (scratch == NULL || medians == NULL) {
        free(scratch);
        free(medians);
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n_reqs; i++) {
        double median;
        double longest;
        if (reqs[i].result != BENCH_REQ_OK ||
            bench_request_gap_stats(&reqs[i], scratch, &median, &longest) != TDM_OK) {
            continue;
        }
        medians[n_streams++] = median;
        max_ms = longest > max_ms ? longest : max_ms;
    }
    stats->itl_median_ms = bench_percentile(medians, n_streams, 50.0);
    stats->itl_max_ms = max_ms;
    /* A median of 0 (chunks that arrived together) leaves the ratio undefined. */
    stats->itl_max_over_median =
        stats->itl_median_ms > 0.0 ? stats->itl_max_ms / stats->itl_median_ms : -1.0;
    stats->n_itl_streams = n_streams;
    free(scratch);
    free(medians);
    return TDM_OK;
}

tdm_status_t bench_level_stats_compute(const bench_request_t *reqs, size_t n_reqs,
                                       uint64_t t_start_ns, uint64_t t_end_ns,
                                       bench_level_stats_t *stats_out)
{
    bench_level_stats_t stats;
    double *ttft = NULL;
    double *speed = NULL;
    double *itl = NULL;
    size_t n_ttft = 0;
    size_t n_speed = 0;
    size_t n_itl = 0;
    size_t n_gaps = 0;
    double speed_sum = 0.0;

    if (t_end_ns < t_start_ns) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&stats, 0, sizeof(stats));
    for (size_t i = 0; i < n_reqs; i++) {
        n_gaps += reqs[i].result == BENCH_REQ_OK ? reqs[i].n_gaps : 0;
    }
    ttft = malloc((n_reqs + 1) * sizeof(double));
    speed = malloc((n_reqs + 1) * sizeof(double));
    itl = malloc((n_gaps + 1) * sizeof(double));
    if (ttft == NULL || speed == NULL || itl == NULL) {
        free(ttft);
        free(speed);
        free(itl);
        return TDM_ERR_NO_MEMORY;
    }

    stats.n_requests = n_reqs;
    for (size_t i = 0; i < n_reqs; i++) {
        const bench_request_t *req = &reqs[i];
        if (req->result != BENCH_REQ_OK) {
            stats.n_errors++;
            continue;
        }
        stats.n_ok++;
        stats.output_tokens += req->output_tokens > 0 ? (uint64_t)req->output_tokens : 0;
        stats.input_tokens += req->input_tokens > 0 ? (uint64_t)req->input_tokens : 0;
        if (req->t_first_ns != 0 && req->t_first_ns >= req->t_send_ns) {
            ttft[n_ttft++] = (double)(req->t_first_ns - req->t_send_ns) / TDM_NS_PER_MS;
        }
        if (req->output_tokens >= 2 && req->t_first_ns != 0 && req->t_last_ns > req->t_first_ns) {
            double span_s = (double)(req->t_last_ns - req->t_first_ns) / TDM_NS_PER_S;
            speed[n_speed] = (double)(req->output_tokens - 1) / span_s;
            speed_sum += speed[n_speed];
            n_speed++;
        }
        for (size_t g = 0; g < req->n_gaps; g++) {
            itl[n_itl++] = req->gaps_ms[g];
        }
    }
    stats.wall_s = (double)(t_end_ns - t_start_ns) / TDM_NS_PER_S;
    stats.output_tok_s = stats.wall_s > 0.0 ? (double)stats.output_tokens / stats.wall_s : 0.0;
    stats.speed_p50_tok_s = bench_percentile(speed, n_speed, 50.0);
    stats.speed_p10_tok_s = bench_percentile(speed, n_speed, 10.0);
    stats.speed_mean_tok_s = n_speed > 0 ? speed_sum / (double)n_speed : -1.0;
    stats.ttft_p50_ms = bench_percentile(ttft, n_ttft, 50.0);
    stats.ttft_p90_ms = bench_percentile(ttft, n_ttft, 90.0);
    stats.ttft_p99_ms = bench_percentile(ttft, n_ttft, 99.0);
    stats.itl_p50_ms = bench_percentile(itl, n_itl, 50.0);
    stats.itl_p99_ms = bench_percentile(itl, n_itl, 99.0);
    stats.n_speed_samples = n_speed;
    stats.n_itl_samples = n_itl;
    free(ttft);
    free(speed);
    free(itl);
    if (stream_gap_stats(reqs, n_reqs, &stats) != TDM_OK) {
        return TDM_ERR_NO_MEMORY;
    }
    *stats_out = stats;
    return TDM_OK;
}
