/* stats.h - per-request timing records and the per-concurrency-level figures made from them.
 *
 * Owns each record's inter-chunk gap array. The arithmetic is plain and documented here so the
 * figures can be checked by hand (docs/BENCH.md repeats it):
 *   TTFT        t_first_ns - t_send_ns, per successful request with at least one token.
 *   ITL         every gap between consecutive content chunks of a stream (one sample per gap).
 *   stream gaps per stream (request) with at least one gap: its median gap and its longest gap;
 *               per level itl_median_ms is the median of the streams' medians, itl_max_ms the
 *               longest gap of any stream, and itl_max_over_median = itl_max_ms / itl_median_ms
 *               (the worst stall of the running streams in units of their usual pace; a p99
 *               over all gaps hides one whole-prompt stall per stream).
 *   speed       (output_tokens - 1) / (t_last_ns - t_first_ns): output tokens after the first
 *               over the time after the first token, per request with >= 2 tokens and a
 *               non-zero span ("per-agent output speed", tok/s).
 *   throughput  sum of output_tokens over successful requests / (t_end - t_start) of the level.
 *   percentiles linear interpolation between closest ranks (numpy's default): rank
 *               p/100 * (n - 1) of the sorted samples.
 * Knows nothing of HTTP or of where the records come from.
 */
#ifndef TANDEM_BENCH_STATS_H
#define TANDEM_BENCH_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* How a request ended. */
typedef enum {
    BENCH_REQ_OK = 0,          /* stream completed with [DONE] or a finish_reason */
    BENCH_REQ_ERR_HTTP = 1,    /* HTTP status other than 200 */
    BENCH_REQ_ERR_CONNECT = 2, /* connection failed, reset or timed out */
    BENCH_REQ_ERR_STREAM = 3,  /* error event in the stream, or a stream that ended early */
} bench_req_result_t;

/* One request's timings. The record owns gaps_ms (free with bench_request_fini). */
typedef struct {
    uint32_t agent;       /* simulated agent index */
    uint32_t turn;        /* turn index within its session */
    uint64_t session;     /* session sequence number within the level */
    uint64_t t_send_ns;   /* tdm_clock_now_ns() just before the request was sent */
    uint64_t t_first_ns;  /* first content chunk, or 0 */
    uint64_t t_last_ns;   /* last content chunk, or 0 */
    uint64_t t_end_ns;    /* stream closed */
    int64_t input_tokens; /* usage.prompt_tokens when reported, else the tokens we sent/estimated */
    int64_t output_tokens; /* usage.completion_tokens when reported, else content chunks */
    int64_t max_tokens;    /* what the request asked for */
    uint32_t n_chunks;     /* SSE events that carried content */
    int usage_reported;    /* 1 when the server sent usage */
    int prompt_reported;   /* 1 when input_tokens is the server's usage.prompt_tokens */
    int http_status;       /* 0 when no response */
    bench_req_result_t result;
    double *gaps_ms; /* n_gaps inter-chunk gaps, ms (owned) */
    size_t n_gaps;
    size_t gaps_capacity;
} bench_request_t;

/* bench_request_fini - free the gap array; accepts a zeroed record. */
void bench_request_fini(bench_request_t *req);

/* bench_request_add_gap - append one gap. TDM_OK or TDM_ERR_NO_MEMORY (record unchanged). */
tdm_status_t bench_request_add_gap(bench_request_t *req, double gap_ms);

/*
 * bench_request_gap_stats - the median and the longest of req's gaps, ms. `scratch` holds at
 * least req->n_gaps doubles (overwritten). Returns TDM_OK, or TDM_ERR_NOT_FOUND when the record
 * has no gap (outputs untouched).
 */
tdm_status_t bench_request_gap_stats(const bench_request_t *req, double *scratch,
                                     double *median_ms_out, double *max_ms_out);

/* Figures for one concurrency level. Plain data; -1 marks a figure with no samples. */
typedef struct {
    uint64_t n_requests;    /* records given */
    uint64_t n_ok;          /* BENCH_REQ_OK */
    uint64_t n_errors;      /* everything else */
    uint64_t output_tokens; /* over successful requests */
    uint64_t input_tokens;  /* over successful requests */
    double wall_s;          /* t_end - t_start */
    double output_tok_s;    /* output_tokens / wall_s, or 0 */
    double speed_p50_tok_s; /* per-request output speed, median */
    double speed_p10_tok_s; /* 10th percentile (the slow tail) */
    double speed_mean_tok_s;
    double ttft_p50_ms;
    double ttft_p90_ms;
    double ttft_p99_ms;
    double itl_p50_ms;
    double itl_p99_ms;
    uint64_t n_speed_samples;
    uint64_t n_itl_samples;
    double itl_median_ms;       /* median over streams of each stream's median gap */
    double itl_max_ms;          /* longest gap of any stream */
    double itl_max_over_median; /* itl_max_ms / itl_median_ms */
    uint64_t n_itl_streams;     /* successful streams with at least one gap */
} bench_level_stats_t;

/*
 * bench_percentile - the p-th percentile (0..100) of n values by linear interpolation between
 * closest ranks; `values` is sorted in place. Returns -1 when n is 0.
 */
double bench_percentile(double *values, size_t n, double p);

/*
 * bench_level_stats_compute - fill *stats_out from n_reqs records of one level that ran from
 * t_start_ns to t_end_ns (monotonic). Records are only read.
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (t_end_ns < t_start_ns; nothing written) or
 * TDM_ERR_NO_MEMORY.
 */
tdm_status_t bench_level_stats_compute(const bench_request_t *reqs, size_t n_reqs,
                                       uint64_t t_start_ns, uint64_t t_end_ns,
                                       bench_level_stats_t *stats_out);

#endif
