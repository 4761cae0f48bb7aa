/* report.c - table, JSON, CSV and gnuplot chart; see report.h. */
#include "bench/replay/report.h"

#include "common/clock.h"
#include "common/log.h"

#include <errno.h>
#include <jansson.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define REPORT_PATH_BYTES   4096
#define REPORT_W_PER_MW     1e6
#define REPORT_BYTES_PER_MB 1e6

extern char **environ;

double bench_report_efficiency(const bench_report_meta_t *meta, const bench_level_result_t *level)
{
    if (level->power.measured && level->power.average_w > 0.0) {
        return level->stats.output_tok_s / (level->power.average_w / REPORT_W_PER_MW);
    }
    if (!meta->power_available && meta->n_cores > 0) {
        return level->stats.output_tok_s / (double)meta->n_cores;
    }
    return -1.0;
}

static const char *efficiency_unit(const bench_report_meta_t *meta)
{
    return meta->power_available ? "tok/s/MW" : "tok/s/core";
}

tdm_status_t bench_report_at_speed(const bench_report_meta_t *meta, const bench_run_result_t *run,
                                   double speed_tok_s, double *value_out)
{
    int found = 0;
    double best_span = 0.0;
    double value = 0.0;

    for (size_t i = 0; i < run->n_levels; i++) {
        for (size_t j = 0; j < run->n_levels; j++) {
            const bench_level_result_t *a = &run->levels[i];
            const bench_level_result_t *b = &run->levels[j];
            double sa = a->stats.speed_p50_tok_s;
            double sb = b->stats.speed_p50_tok_s;
            double ea = bench_report_efficiency(meta, a);
            double eb = bench_report_efficiency(meta, b);
            if (sa < 0.0 || sb < 0.0 || ea < 0.0 || eb < 0.0 || !(sa <= speed_tok_s) ||
                !(speed_tok_s <= sb) || (i != j && sa == sb)) {
                continue;
            }
            /* The closest bracketing pair (a single level exactly at the speed is span 0). */
            if (!found || sb - sa < best_span) {
                best_span = sb - sa;
                value = sb == sa ? ea : ea + (eb - ea) * (speed_tok_s - sa) / (sb - sa);
                found = 1;
            }
        }
    }
    if (!found) {
        return TDM_ERR_NOT_FOUND;
    }
    *value_out = value;
    return TDM_OK;
}

/* Writes `value` with `decimals` into a column of `width`, or "-" when value < 0. */
static void cell(FILE *out, int width, int decimals, double value)
{
    if (value < 0.0) {
        fprintf(out, " %*s", width, "-");
    } else {
        fprintf(out, " %*.*f", width, decimals, value);
    }
}

/* The per-stream inter-token gap block (stats.h: stream gaps). */
static void table_stream_gaps(FILE *out, const bench_run_result_t *run)
{
    fprintf(out, "\nper-stream inter-token gaps (each stream's median and longest gap):\n");
    fprintf(out, "%5s %8s %10s %11s %15s\n", "conc", "streams", "median ms", "longest ms",
            "longest/median");
    for (size_t l = 0; l < run->n_levels; l++) {
        const bench_level_stats_t *s = &run->levels[l].stats;
        fprintf(out, "%5u %8llu", run->levels[l].concurrency, (unsigned long long)s->n_itl_streams);
        cell(out, 10, 2, s->itl_median_ms);
        cell(out, 11, 2, s->itl_max_ms);
        cell(out, 15, 1, s->itl_max_over_median);
        fprintf(out, "\n");
    }
}

/* The error block: per level, how many failed and why; then the run's context hint. Nothing
 * when every request succeeded and no hint was given (sessions cut by a chosen --max-context
 * alone are in results.json). */
static void table_errors(FILE *out, const bench_run_result_t *run)
{
    int any = run->context_hint[0] != '\0';

    for (size_t l = 0; l < run->n_levels; l++) {
        any |= run->levels[l].stats.n_errors > 0;
    }
    if (!any) {
        return;
    }
    fprintf(out, "\nerrors:\n");
    for (size_t l = 0; l < run->n_levels; l++) {
        const bench_level_result_t *level = &run->levels[l];
        const bench_level_stats_t *s = &level->stats;
        if (s->n_errors == 0 && level->n_context_cut == 0) {
            fprintf(out, "  c=%u: none\n", level->concurrency);
            continue;
        }
        fprintf(out, "  c=%u: %llu of %llu requests failed (%.1f %%)", level->concurrency,
                (unsigned long long)s->n_errors, (unsigned long long)s->n_requests,
                s->n_requests > 0 ? 100.0 * (double)s->n_errors / (double)s->n_requests : 0.0);
        if (level->n_context_errors > 0) {
            fprintf(out, ", %llu of them refused as longer than the server's context",
                    (unsigned long long)level->n_context_errors);
        }
        if (level->n_context_cut > 0) {
            fprintf(out, "; %llu session(s) ended before a turn longer than the context",
                    (unsigned long long)level->n_context_cut);
        }
        fprintf(out, "\n");
        if (level->first_error[0] != '\0') {
            fprintf(out, "    first: %s\n", level->first_error);
        }
    }
    if (run->context_hint[0] != '\0') {
        fprintf(out, "  cause: the trace does not fit the server's context: %s\n",
                run->context_hint);
    }
}

void bench_report_table(FILE *out, const bench_report_meta_t *meta, const bench_run_result_t *run)
{
    const bench_replay_params_t *p = meta->params;
    double headline;

    fprintf(out, "tandem-bench replay: %s (%s, %zu sessions, %zu requests%s)\n", meta->trace_path,
            bench_trace_format_name(meta->trace->format), meta->trace->n_sessions,
            meta->trace->n_requests,
            meta->trace->n_rebuilt_sessions > 0 ? ", sessions rebuilt from hash-id chains" : "");
    fprintf(out, "server %s model %s, scale %g, seed %llu, ", p->base_url, p->model, p->scale,
            (unsigned long long)p->seed);
    if (p->duration_s > 0.0) {
        fprintf(out, "%.0f s per level", p->duration_s);
    }
    if (p->n_sessions > 0) {
        fprintf(out, "%s%llu sessions per level", p->duration_s > 0.0 ? ", " : "",
                (unsigned long long)p->n_sessions);
    }
    if (p->duration_s <= 0.0 && p->n_sessions == 0) {
        fprintf(out, "every trace session once per level");
    }
    fprintf(out, "\n");
    if (meta->power_available) {
        fprintf(out, "power: %s (energy of this host's measured parts during each level)\n",
                meta->power_sources);
    } else {
        fprintf(out,
                "power not measured (no readable RAPL or NVML): throughput per core, %u "
                "cores\n",
                meta->n_cores);
    }
    fprintf(out, "\n%5s %6s %4s %9s %11s %8s %8s %8s %8s %8s %7s %7s %10s %10s %9s %8s\n", "conc",
            "reqs", "err", "out tok/s", efficiency_unit(meta), "spd p50", "spd p10", "TTFT p50",
            "TTFT p90", "TTFT p99", "ITL p50", "ITL p99", "pf comp", "pf reused", "KV MB", "avg W");
    fprintf(out, "%5s %6s %4s %9s %11s %8s %8s %8s %8s %8s %7s %7s %10s %10s %9s %8s\n", "", "", "",
            "", "", "tok/s", "tok/s", "ms", "ms", "ms", "ms", "ms", "tokens", "tokens", "moved",
            "");
    for (size_t l = 0; l < run->n_levels; l++) {
        const bench_level_result_t *level = &run->levels[l];
        const bench_level_stats_t *s = &level->stats;
        const bench_metrics_snapshot_t *m = &level->metrics_delta;
        int have = level->metrics_available;

        fprintf(out, "%5u %6llu %4llu", level->concurrency, (unsigned long long)s->n_requests,
                (unsigned long long)s->n_errors);
        cell(out, 9, 1, s->output_tok_s);
        cell(out, 11, meta->power_available ? 0 : 2, bench_report_efficiency(meta, level));
        cell(out, 8, 1, s->speed_p50_tok_s);
        cell(out, 8, 1, s->speed_p10_tok_s);
        cell(out, 8, 1, s->ttft_p50_ms);
        cell(out, 8, 1, s->ttft_p90_ms);
        cell(out, 8, 1, s->ttft_p99_ms);
        cell(out, 7, 2, s->itl_p50_ms);
        cell(out, 7, 2, s->itl_p99_ms);
        cell(out, 10, 0,
             have && m->present[BENCH_METRIC_COMPUTED] ? m->values[BENCH_METRIC_COMPUTED] : -1.0);
        cell(out, 10, 0,
             have && m->present[BENCH_METRIC_REUSED] ? m->values[BENCH_METRIC_REUSED] : -1.0);
        cell(out, 9, 2,
             have && m->present[BENCH_METRIC_KV_BYTES]
                 ? m->values[BENCH_METRIC_KV_BYTES] / REPORT_BYTES_PER_MB
                 : -1.0);
        cell(out, 8, 1, level->power.measured ? level->power.average_w : -1.0);
        fprintf(out, "\n");
    }
    table_stream_gaps(out, run);
    table_errors(out, run);
    if (bench_report_at_speed(meta, run, BENCH_HEADLINE_SPEED_TOK_S, &headline) == TDM_OK) {
        fprintf(out, "\nat %.0f output tok/s per agent: %.2f %s (interpolated)\n",
                BENCH_HEADLINE_SPEED_TOK_S, headline, efficiency_unit(meta));
    } else {
        fprintf(out, "\nat %.0f output tok/s per agent: not bracketed by these levels\n",
                BENCH_HEADLINE_SPEED_TOK_S);
    }
    fflush(out);
}

/* A number, or null when negative (no samples). */
static json_t *num_or_null(double value)
{
    return value < 0.0 ? json_null() : json_real(value);
}

/* A JSON string of `text`, or null when it is empty or not UTF-8 (an error body cut mid-character).
 */
static json_t *text_or_null(const char *text)
{
    json_t *value = text[0] != '\0' ? json_string(text) : NULL;
    return value != NULL ? value : json_null();
}

static json_t *level_json(const bench_report_meta_t *meta, const bench_level_result_t *level)
{
    const bench_level_stats_t *s = &level->stats;
    const bench_metrics_snapshot_t *m = &level->metrics_delta;
    double per_core = meta->n_cores > 0 ? s->output_tok_s / (double)meta->n_cores : -1.0;
    double per_mw = level->power.measured && level->power.average_w > 0.0
                        ? s->output_tok_s / (level->power.average_w / REPORT_W_PER_MW)
                        : -1.0;
    json_t *obj = json_object();
    json_t *power = json_object();
    json_t *metrics = json_object();

    if (obj == NULL || power == NULL || metrics == NULL) {
        json_decref(obj);
        json_decref(power);
        json_decref(metrics);
        return NULL;
    }
    json_object_set_new(obj, "concurrency", json_integer(level->concurrency));
    json_object_set_new(obj, "stop_reason", json_string(level->stop_reason));
    json_object_set_new(obj, "wall_s", json_real(s->wall_s));
    json_object_set_new(obj, "requests", json_integer((json_int_t)s->n_requests));
    json_object_set_new(obj, "requests_ok", json_integer((json_int_t)s->n_ok));
    json_object_set_new(obj, "errors", json_integer((json_int_t)s->n_errors));
    json_object_set_new(obj, "output_tokens", json_integer((json_int_t)s->output_tokens));
    json_object_set_new(obj, "input_tokens", json_integer((json_int_t)s->input_tokens));
    json_object_set_new(obj, "output_tok_s", json_real(s->output_tok_s));
    json_object_set_new(obj, "output_tok_s_per_core", num_or_null(per_core));
    json_object_set_new(obj, "output_tok_s_per_mw", num_or_null(per_mw));
    json_object_set_new(obj, "speed_p50_tok_s", num_or_null(s->speed_p50_tok_s));
    json_object_set_new(obj, "speed_p10_tok_s", num_or_null(s->speed_p10_tok_s));
    json_object_set_new(obj, "speed_mean_tok_s", num_or_null(s->speed_mean_tok_s));
    json_object_set_new(obj, "speed_samples", json_integer((json_int_t)s->n_speed_samples));
    json_object_set_new(obj, "ttft_p50_ms", num_or_null(s->ttft_p50_ms));
    json_object_set_new(obj, "ttft_p90_ms", num_or_null(s->ttft_p90_ms));
    json_object_set_new(obj, "ttft_p99_ms", num_or_null(s->ttft_p99_ms));
    json_object_set_new(obj, "itl_p50_ms", num_or_null(s->itl_p50_ms));
    json_object_set_new(obj, "itl_p99_ms", num_or_null(s->itl_p99_ms));
    json_object_set_new(obj, "itl_samples", json_integer((json_int_t)s->n_itl_samples));
    json_object_set_new(obj, "itl_median_ms", num_or_null(s->itl_median_ms));
    json_object_set_new(obj, "itl_max_ms", num_or_null(s->itl_max_ms));
    json_object_set_new(obj, "itl_max_over_median", num_or_null(s->itl_max_over_median));
    json_object_set_new(obj, "itl_streams", json_integer((json_int_t)s->n_itl_streams));
    json_object_set_new(obj, "errors_context_length",
                        json_integer((json_int_t)level->n_context_errors));
    json_object_set_new(obj, "first_error", text_or_null(level->first_error));
    json_object_set_new(obj, "sessions_started",
                        json_integer((json_int_t)level->n_sessions_started));
    json_object_set_new(obj, "sessions_completed",
                        json_integer((json_int_t)level->n_sessions_completed));
    json_object_set_new(obj, "sessions_cut_by_max_context",
                        json_integer((json_int_t)level->n_context_cut));
    json_object_set_new(obj, "tool_pause_total_s", json_real(level->pause_total_s));
    for (int i = 0; i < BENCH_N_METRICS; i++) {
        json_object_set_new(metrics, bench_metric_name((bench_metric_t)i),
                            level->metrics_available && m->present[i] ? json_real(m->values[i])
                                                                      : json_null());
    }
    json_object_set_new(obj, "metrics_delta", metrics);
    json_object_set_new(obj, "prefill_tokens_computed",
                        level->metrics_available && m->present[BENCH_METRIC_COMPUTED]
                            ? json_real(m->values[BENCH_METRIC_COMPUTED])
                            : json_null());
    json_object_set_new(obj, "prefill_tokens_reused",
                        level->metrics_available && m->present[BENCH_METRIC_REUSED]
                            ? json_real(m->values[BENCH_METRIC_REUSED])
                            : json_null());
    json_object_set_new(obj, "kv_bytes_moved",
                        level->metrics_available && m->present[BENCH_METRIC_KV_BYTES]
                            ? json_real(m->values[BENCH_METRIC_KV_BYTES])
                            : json_null());
    json_object_set_new(power, "measured", json_boolean(level->power.measured));
    json_object_set_new(power, "energy_j",
                        level->power.measured ? json_real(level->power.energy_j) : json_null());
    json_object_set_new(power, "average_w",
                        level->power.measured ? json_real(level->power.average_w) : json_null());
    json_object_set_new(power, "seconds",
                        level->power.measured ? json_real(level->power.seconds) : json_null());
    json_object_set_new(obj, "power", power);
    return obj;
}

tdm_status_t bench_report_write_json(const char *path, const bench_report_meta_t *meta,
                                     const bench_run_result_t *run)
{
    const bench_replay_params_t *p = meta->params;
    json_t *root = json_object();
    json_t *settings = json_object();
    json_t *levels = json_array();
    json_t *concurrency = json_array();
    json_t *metrics_urls = json_array();
    double headline;
    tdm_status_t status = TDM_OK;

    if (root == NULL || settings == NULL || levels == NULL || concurrency == NULL ||
        metrics_urls == NULL) {
        json_decref(root);
        json_decref(settings);
        json_decref(levels);
        json_decref(concurrency);
        json_decref(metrics_urls);
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t l = 0; l < p->n_levels; l++) {
        json_array_append_new(concurrency, json_integer(p->concurrency[l]));
    }
    for (size_t u = 0; u < p->n_metrics_urls; u++) {
        json_array_append_new(metrics_urls, json_string(p->metrics_urls[u]));
    }
    json_object_set_new(settings, "url", json_string(p->base_url));
    json_object_set_new(settings, "model", json_string(p->model));
    json_object_set_new(settings, "trace", json_string(meta->trace_path));
    json_object_set_new(settings, "format",
                        json_string(bench_trace_format_name(meta->trace->format)));
    json_object_set_new(settings, "trace_sessions",
                        json_integer((json_int_t)meta->trace->n_sessions));
    json_object_set_new(settings, "trace_requests",
                        json_integer((json_int_t)meta->trace->n_requests));
    json_object_set_new(settings, "trace_rebuilt_sessions",
                        json_integer((json_int_t)meta->trace->n_rebuilt_sessions));
    json_object_set_new(settings, "concurrency", concurrency);
    json_object_set_new(settings, "duration_s", json_real(p->duration_s));
    json_object_set_new(settings, "sessions_per_level", json_integer((json_int_t)p->n_sessions));
    json_object_set_new(settings, "scale", json_real(p->scale));
    json_object_set_new(settings, "max_context", json_integer((json_int_t)p->max_context));
    json_object_set_new(settings, "seed", json_integer((json_int_t)p->seed));
    json_object_set_new(settings, "vocab_size", json_integer(p->vocab_size));
    json_object_set_new(settings, "pause_scale", json_real(p->pause_scale));
    json_object_set_new(settings, "max_pause_s", json_real(p->max_pause_s));
    json_object_set_new(settings, "timeout_s", json_real(p->timeout_s));
    json_object_set_new(settings, "session_header", json_boolean(p->send_session_header));
    json_object_set_new(settings, "metrics_urls", metrics_urls);
    json_object_set_new(settings, "server_vocab_size",
                        meta->server->vocab_size >= 0 ? json_integer(meta->server->vocab_size)
                                                      : json_null());
    json_object_set_new(settings, "server_max_model_len",
                        meta->server->max_model_len >= 0 ? json_integer(meta->server->max_model_len)
                                                         : json_null());
    json_object_set_new(settings, "cores", json_integer(meta->n_cores));
    json_object_set_new(settings, "power_sources", json_string(meta->power_sources));
    json_object_set_new(settings, "power_measured", json_boolean(meta->power_available));
    json_object_set_new(root, "tool", json_string("tandem-bench"));
    json_object_set_new(root, "settings", settings);
    for (size_t l = 0; l < run->n_levels; l++) {
        json_t *level = level_json(meta, &run->levels[l]);
        if (level == NULL || json_array_append_new(levels, level) != 0) {
            status = TDM_ERR_NO_MEMORY;
            break;
        }
    }
    json_object_set_new(root, "levels", levels);
    json_object_set_new(root, "context_hint", text_or_null(run->context_hint));
    json_object_set_new(root, "efficiency_unit", json_string(efficiency_unit(meta)));
    json_object_set_new(root, "headline_speed_tok_s", json_real(BENCH_HEADLINE_SPEED_TOK_S));
    json_object_set_new(root, "headline_efficiency",
                        bench_report_at_speed(meta, run, BENCH_HEADLINE_SPEED_TOK_S, &headline) ==
                                TDM_OK
                            ? json_real(headline)
                            : json_null());
    if (status == TDM_OK &&
        json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10)) != 0) {
        tdm_log(TDM_LOG_ERROR, "bench", "write failed: path=%s err=%s", path, strerror(errno));
        status = TDM_ERR_IO;
    }
    json_decref(root);
    return status;
}

tdm_status_t bench_report_write_csv(const char *path, const bench_run_result_t *run)
{
    FILE *out = fopen(path, "w");
    int failed;

    if (out == NULL) {
        tdm_log(TDM_LOG_ERROR, "bench", "open failed: path=%s err=%s", path, strerror(errno));
        return TDM_ERR_IO;
    }
    fprintf(out, "level,concurrency,agent,session,turn,result,http_status,t_send_ms,ttft_ms,"
                 "duration_ms,input_tokens,output_tokens,max_tokens,chunks,usage_reported,"
                 "itl_median_ms,itl_max_ms\n");
    for (size_t l = 0; l < run->n_levels; l++) {
        const bench_level_result_t *level = &run->levels[l];
        uint64_t t0 = UINT64_MAX;
        for (size_t r = 0; r < level->n_requests; r++) {
            t0 = level->requests[r].t_send_ns < t0 ? level->requests[r].t_send_ns : t0;
        }
        for (size_t r = 0; r < level->n_requests; r++) {
            const bench_request_t *req = &level->requests[r];
            double gap_median = -1.0;
            double gap_max = -1.0;
            double ttft = req->t_first_ns != 0
                              ? (double)(req->t_first_ns - req->t_send_ns) / TDM_NS_PER_MS
                              : -1.0;
            if (req->n_gaps > 0) {
                double *scratch = malloc(req->n_gaps * sizeof(double));
                if (scratch != NULL) {
                    bench_request_gap_stats(req, scratch, &gap_median, &gap_max);
                    free(scratch);
                }
            }
            fprintf(out, "%zu,%u,%u,%llu,%u,%d,%d,%.3f,%.3f,%.3f,%lld,%lld,%lld,%u,%d,%.3f,%.3f\n",
                    l, level->concurrency, req->agent, (unsigned long long)req->session, req->turn,
                    (int)req->result, req->http_status,
                    (double)(req->t_send_ns - t0) / TDM_NS_PER_MS, ttft,
                    (double)(req->t_end_ns - req->t_send_ns) / TDM_NS_PER_MS,
                    (long long)req->input_tokens, (long long)req->output_tokens,
                    (long long)req->max_tokens, req->n_chunks, req->usage_reported, gap_median,
                    gap_max);
        }
    }
    failed = ferror(out);
    if (fclose(out) != 0 || failed) {
        tdm_log(TDM_LOG_ERROR, "bench", "write failed: path=%s", path);
        return TDM_ERR_IO;
    }
    return TDM_OK;
}

/* Runs `gnuplot script`; returns its exit status, or -1 when it could not start. */
static int run_gnuplot(const char *script)
{
    char *argv[] = {"gnuplot", (char *)script, NULL};
    pid_t pid;
    int wstatus;

    if (posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ) != 0) {
        return -1;
    }
    if (waitpid(pid, &wstatus, 0) < 0 || !WIFEXITED(wstatus)) {
        return -1;
    }
    return WEXITSTATUS(wstatus);
}

tdm_status_t bench_report_plot(const char *dir, const bench_report_meta_t *meta,
                               const bench_run_result_t *run)
{
    char dat[REPORT_PATH_BYTES];
    char gp[REPORT_PATH_BYTES];
    char png[REPORT_PATH_BYTES];
    FILE *out;
    size_t n_points = 0;
    int rc;

    snprintf(dat, sizeof(dat), "%s/throughput.dat", dir);
    snprintf(gp, sizeof(gp), "%s/throughput.gp", dir);
    snprintf(png, sizeof(png), "%s/throughput.png", dir);
    out = fopen(dat, "w");
    if (out == NULL) {
        tdm_log(TDM_LOG_ERROR, "bench", "open failed: path=%s err=%s", dat, strerror(errno));
        return TDM_ERR_IO;
    }
    fprintf(out, "# speed_p50_tok_s efficiency_%s concurrency output_tok_s\n",
            meta->power_available ? "tok_s_per_mw" : "tok_s_per_core");
    for (size_t l = 0; l < run->n_levels; l++) {
        const bench_level_result_t *level = &run->levels[l];
        double eff = bench_report_efficiency(meta, level);
        if (level->stats.speed_p50_tok_s < 0.0 || eff < 0.0) {
            continue;
        }
        fprintf(out, "%.6f %.6f %u %.6f\n", level->stats.speed_p50_tok_s, eff, level->concurrency,
                level->stats.output_tok_s);
        n_points++;
    }
    fclose(out);
    if (n_points == 0) {
        tdm_log(TDM_LOG_WARN, "bench", "no chart: no level has a per-agent speed figure");
        return TDM_ERR_NOT_FOUND;
    }
    out = fopen(gp, "w");
    if (out == NULL) {
        tdm_log(TDM_LOG_ERROR, "bench", "open failed: path=%s err=%s", gp, strerror(errno));
        return TDM_ERR_IO;
    }
    fprintf(out,
            "# tandem-bench chart: gnuplot %s\n"
            "set terminal pngcairo size 1000,650 font 'sans,11'\n"
            "set output '%s'\n"
            "set title 'tandem-bench: aggregate output throughput vs per-agent output speed'\n"
            "set xlabel 'per-agent output speed, p50 (output tok/s after the first token)'\n"
            "set ylabel 'aggregate output throughput (%s)'\n"
            "set grid\n"
            "set key top right\n"
            "set xrange [0:*]\n"
            "set yrange [0:*]\n"
            "set arrow from %g, graph 0 to %g, graph 1 nohead dashtype 2 lc rgb '#888888'\n"
            "plot '%s' using 1:2 with linespoints pt 7 ps 1.5 lw 2 title '%s', \\\n"
            "     '' using 1:2:(sprintf('c=%%d', $3)) with labels offset 1.5,1 notitle\n",
            gp, png, efficiency_unit(meta), BENCH_HEADLINE_SPEED_TOK_S, BENCH_HEADLINE_SPEED_TOK_S,
            dat,
            meta->power_available ? "tok/s per MW (measured power)"
                                  : "tok/s per core (power not measured)");
    if (fclose(out) != 0) {
        tdm_log(TDM_LOG_ERROR, "bench", "write failed: path=%s", gp);
        return TDM_ERR_IO;
    }
    rc = run_gnuplot(gp);
    if (rc == -1 || rc == 127) {
        tdm_log(TDM_LOG_WARN, "bench", "no chart: gnuplot not found (install gnuplot-nox)");
        return TDM_ERR_NOT_FOUND;
    }
    if (rc != 0) {
        tdm_log(TDM_LOG_ERROR, "bench", "gnuplot failed: script=%s exit=%d", gp, rc);
        return TDM_ERR_INTERNAL;
    }
    return TDM_OK;
}
