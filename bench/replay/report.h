/* report.h - tandem-bench output: the table on stdout, results.json, requests.csv and the
 * throughput-versus-speed chart (gnuplot PNG), one point per concurrency level.
 *
 * Efficiency is aggregate output tok/s per megawatt when power was measured, else per CPU core
 * of this host (never invented watts). Owns nothing; borrows the run and its description.
 */
#ifndef TANDEM_BENCH_REPORT_H
#define TANDEM_BENCH_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "bench/replay/replay.h"
#include "bench/replay/trace.h"
#include "common/status.h"

/* Speed at which the headline throughput is read off the curve (AgentPerf's point). */
#define BENCH_HEADLINE_SPEED_TOK_S 100.0

/* What was run, for the report header and JSON. Plain data; everything borrowed. */
typedef struct {
    const char *trace_path;
    const bench_trace_t *trace;
    const bench_replay_params_t *params;
    const bench_server_info_t *server;
    const char *power_sources; /* bench_power_sources(), or "none" */
    int power_available;
    uint32_t n_cores; /* CPU cores the per-core figure divides by */
} bench_report_meta_t;

/* bench_report_efficiency - output tok/s per MW (power measured) or per core; -1 if neither. */
double bench_report_efficiency(const bench_report_meta_t *meta, const bench_level_result_t *level);

/*
 * bench_report_at_speed - efficiency at per-agent speed `speed_tok_s`, interpolated linearly
 * between the two levels whose p50 speeds bracket it. Returns TDM_OK with *value_out, or
 * TDM_ERR_NOT_FOUND when no two levels bracket the speed.
 */
tdm_status_t bench_report_at_speed(const bench_report_meta_t *meta, const bench_run_result_t *run,
                                   double speed_tok_s, double *value_out);

/* bench_report_table - the human table (header, one row per level, headline line) to `out`. */
void bench_report_table(FILE *out, const bench_report_meta_t *meta, const bench_run_result_t *run);

/*
 * bench_report_write_json - every figure of every level, plus the run's settings, to `path`.
 * Absent figures are null. Returns TDM_OK, TDM_ERR_NO_MEMORY or TDM_ERR_IO (logged).
 */
tdm_status_t bench_report_write_json(const char *path, const bench_report_meta_t *meta,
                                     const bench_run_result_t *run);

/* bench_report_write_csv - one row per request. TDM_OK or TDM_ERR_IO (logged). */
tdm_status_t bench_report_write_csv(const char *path, const bench_run_result_t *run);

/*
 * bench_report_plot - write DIR/throughput.dat and DIR/throughput.gp and run gnuplot to make
 * DIR/throughput.png. Returns TDM_OK, TDM_ERR_IO (files), TDM_ERR_NOT_FOUND (no gnuplot, or no
 * level with a speed figure) or TDM_ERR_INTERNAL (gnuplot failed); logged.
 */
tdm_status_t bench_report_plot(const char *dir, const bench_report_meta_t *meta,
                               const bench_run_result_t *run);

#endif
