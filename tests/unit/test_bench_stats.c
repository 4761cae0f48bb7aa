/* test_bench_stats.c - tandem-bench arithmetic: percentiles, level figures from hand-made
 * records, Prometheus parsing and the router-name fallbacks, RAPL energy with wrap-around,
 * tool-pause rules, and reading the headline off the curve. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "bench/replay/metrics.h"
#include "bench/replay/power.h"
#include "bench/replay/replay.h"
#include "bench/replay/report.h"
#include "bench/replay/stats.h"

#define MS         1000000ULL
#define PATH_BYTES 4096

static void test_percentile_interpolates_between_ranks(void **state)
{
    double v[] = {40, 10, 30, 20, 50};
    double one[] = {7};
    double two[] = {1, 3};
    (void)state;

    assert_true(bench_percentile(v, 5, 50) == 30.0);
    assert_true(bench_percentile(v, 5, 0) == 10.0);
    assert_true(bench_percentile(v, 5, 100) == 50.0);
    assert_true(bench_percentile(v, 5, 90) == 46.0); /* rank 3.6: 40 + 0.6 * 10 */
    assert_true(bench_percentile(v, 5, 10) == 14.0); /* rank 0.4 */
    assert_true(bench_percentile(v, 5, 99) > 49.59 && bench_percentile(v, 5, 99) < 49.61);
    assert_true(bench_percentile(one, 1, 99) == 7.0);
    assert_true(bench_percentile(two, 2, 50) == 2.0);
    assert_true(bench_percentile(NULL, 0, 50) == -1.0);
}

/* A successful record: sent at t0, first token after ttft, then n_out - 1 gaps of gap_ms. */
static void make_record(bench_request_t *req, uint64_t t0_ms, uint64_t ttft_ms, int64_t n_out,
                        uint64_t gap_ms)
{
    memset(req, 0, sizeof(*req));
    req->t_send_ns = t0_ms * MS;
    req->t_first_ns = (t0_ms + ttft_ms) * MS;
    req->t_last_ns = req->t_first_ns + (uint64_t)(n_out - 1) * gap_ms * MS;
    req->t_end_ns = req->t_last_ns + MS;
    req->output_tokens = n_out;
    req->input_tokens = 1000;
    req->n_chunks = (uint32_t)n_out;
    req->result = BENCH_REQ_OK;
    for (int64_t i = 1; i < n_out; i++) {
        assert_int_equal(bench_request_add_gap(req, (double)gap_ms), TDM_OK);
    }
}

static void test_level_figures_from_known_records(void **state)
{
    bench_request_t reqs[4];
    bench_level_stats_t s;
    (void)state;

    make_record(&reqs[0], 0, 100, 11, 10); /* speed 10 / 0.1 s = 100 tok/s */
    make_record(&reqs[1], 0, 200, 21, 20); /* 20 / 0.4 s = 50 tok/s */
    make_record(&reqs[2], 500, 300, 5, 5); /* 4 / 0.02 s = 200 tok/s */
    memset(&reqs[3], 0, sizeof(reqs[3]));  /* a failed request counts only as an error */
    reqs[3].result = BENCH_REQ_ERR_HTTP;
    reqs[3].http_status = 500;
    reqs[3].output_tokens = 999;

    assert_int_equal(bench_level_stats_compute(reqs, 4, 0, 2000 * MS, &s), TDM_OK);
    assert_int_equal(s.n_requests, 4);
    assert_int_equal(s.n_ok, 3);
    assert_int_equal(s.n_errors, 1);
    assert_int_equal(s.output_tokens, 37);
    assert_int_equal(s.input_tokens, 3000);
    assert_true(s.wall_s == 2.0);
    assert_true(s.output_tok_s == 18.5);
    assert_true(s.ttft_p50_ms == 200.0);
    assert_true(s.ttft_p90_ms > 279.99 && s.ttft_p90_ms < 280.01);
    assert_int_equal(s.n_speed_samples, 3);
    assert_true(s.speed_p50_tok_s > 99.99 && s.speed_p50_tok_s < 100.01);
    assert_true(s.speed_p10_tok_s > 59.99 && s.speed_p10_tok_s < 60.01); /* 50 + 0.2 * 50 */
    assert_true(s.speed_mean_tok_s > 116.66 && s.speed_mean_tok_s < 116.67);
    /* ITL samples: 10 x 10 ms, 20 x 20 ms, 4 x 5 ms: 34 samples, median 20, p99 20. */
    assert_int_equal(s.n_itl_samples, 34);
    assert_true(s.itl_p50_ms == 20.0);
    assert_true(s.itl_p99_ms == 20.0);
    for (int i = 0; i < 4; i++) {
        bench_request_fini(&reqs[i]);
    }
}

static void test_level_without_samples_marks_figures_absent(void **state)
{
    bench_level_stats_t s;
    bench_request_t one;
    (void)state;

    assert_int_equal(bench_level_stats_compute(NULL, 0, 5, 5, &s), TDM_OK);
    assert_true(s.output_tok_s == 0.0);
    assert_true(s.ttft_p50_ms == -1.0);
    assert_true(s.speed_p50_tok_s == -1.0);
    assert_true(s.itl_p99_ms == -1.0);
    /* One token: a TTFT but no speed and no ITL. */
    make_record(&one, 0, 50, 1, 10);
    assert_int_equal(bench_level_stats_compute(&one, 1, 0, MS * 100, &s), TDM_OK);
    assert_true(s.ttft_p50_ms == 50.0);
    assert_true(s.speed_p50_tok_s == -1.0);
    assert_int_equal(s.n_itl_samples, 0);
    bench_request_fini(&one);
    memset(&s, 0x5a, sizeof(s));
    assert_int_equal(bench_level_stats_compute(NULL, 0, 10, 5, &s), TDM_ERR_INVALID_ARG);
    assert_int_equal(s.n_requests, 0x5a5a5a5a5a5a5a5aULL); /* untouched */
}

/* Per-stream gaps: a stream that runs at 20 ms and stalls once for 1 s (a whole prompt prefilled
 * between its decode steps), one that runs evenly at 10 ms, a failed one (ignored) and one with a
 * single token (no gap). */
static void test_stream_gaps_give_median_longest_and_ratio(void **state)
{
    static const double stalled[] = {20.0, 20.0, 30.0, 20.0, 1000.0, 20.0};
    bench_request_t reqs[4];
    bench_level_stats_t s;
    double scratch[8];
    double median = -1.0;
    double longest = -1.0;
    (void)state;

    make_record(&reqs[0], 0, 100, 1, 0);
    for (size_t i = 0; i < sizeof(stalled) / sizeof(stalled[0]); i++) {
        assert_int_equal(bench_request_add_gap(&reqs[0], stalled[i]), TDM_OK);
    }
    make_record(&reqs[1], 0, 100, 5, 10);
    make_record(&reqs[2], 0, 100, 4, 5000); /* would be the longest, but it failed */
    reqs[2].result = BENCH_REQ_ERR_STREAM;
    make_record(&reqs[3], 0, 100, 1, 0);

    assert_int_equal(bench_request_gap_stats(&reqs[0], scratch, &median, &longest), TDM_OK);
    assert_true(median == 20.0);
    assert_true(longest == 1000.0);
    assert_true(reqs[0].gaps_ms[4] == 1000.0); /* the record's own order is kept */
    median = -7.0;
    assert_int_equal(bench_request_gap_stats(&reqs[3], scratch, &median, &longest),
                     TDM_ERR_NOT_FOUND);
    assert_true(median == -7.0);

    assert_int_equal(bench_level_stats_compute(reqs, 4, 0, 2000 * MS, &s), TDM_OK);
    assert_int_equal(s.n_itl_streams, 2);
    assert_true(s.itl_median_ms == 15.0); /* median of the medians 20 and 10 */
    assert_true(s.itl_max_ms == 1000.0);
    assert_true(s.itl_max_over_median > 66.66 && s.itl_max_over_median < 66.67); /* 1000 / 15 */
    /* p99 over every gap (10 samples) stays far below the stall the ratio shows */
    assert_true(s.itl_p99_ms < 1000.0);

    /* No stream with a gap: the figures are absent. */
    assert_int_equal(bench_level_stats_compute(&reqs[3], 1, 0, 2000 * MS, &s), TDM_OK);
    assert_int_equal(s.n_itl_streams, 0);
    assert_true(s.itl_median_ms == -1.0);
    assert_true(s.itl_max_ms == -1.0);
    assert_true(s.itl_max_over_median == -1.0);
    for (int i = 0; i < 4; i++) {
        bench_request_fini(&reqs[i]);
    }
}

static const char *prom_text =
    "# HELP tandem_prefill_tokens_computed_total computed\n"
    "# TYPE tandem_prefill_tokens_computed_total counter\n"
    "tandem_prefill_tokens_computed_total{node=\"p0\",rack=\"a}b\"} 100\n"
    "tandem_prefill_tokens_computed_total{node=\"p1\"} 2.5e2\n"
    "tandem_prefill_tokens_computed_total_extra 7\n"
    "tandem_prefill_tokens_computed_totalx{a=\"b\"} 9\n"
    "tandem_kv_bytes_moved_total 1e6 1700000000000\n"
    "tandem_router_prompt_tokens_total 900\n"
    "tandem_router_prefill_tokens_total{mode=\"local\"} 30\n"
    "tandem_router_prefill_tokens_total{mode=\"remote\"} 270\n";

static void test_prometheus_sums_samples_of_exact_name(void **state)
{
    double sum = -1.0;
    (void)state;

    assert_int_equal(
        bench_metrics_sum(prom_text, strlen(prom_text), BENCH_METRIC_PREFILL_COMPUTED, &sum),
        TDM_OK);
    assert_true(sum == 350.0);
    assert_int_equal(
        bench_metrics_sum(prom_text, strlen(prom_text), BENCH_METRIC_KV_BYTES_MOVED, &sum), TDM_OK);
    assert_true(sum == 1e6);
    sum = -1.0;
    assert_int_equal(
        bench_metrics_sum(prom_text, strlen(prom_text), BENCH_METRIC_PREFILL_REUSED, &sum),
        TDM_ERR_NOT_FOUND);
    assert_true(sum == -1.0);
}

static void test_metrics_resolve_prefers_tandem_names_then_router_counters(void **state)
{
    bench_metrics_snapshot_t snap;
    const char *router_only = "tandem_router_prompt_tokens_total 900\n"
                              "tandem_router_prefill_tokens_total{mode=\"local\"} 30\n"
                              "tandem_router_prefill_tokens_total{mode=\"remote\"} 270\n";
    (void)state;

    memset(&snap, 0, sizeof(snap));
    bench_metrics_add_text(prom_text, strlen(prom_text), &snap);
    bench_metrics_resolve(&snap);
    assert_true(snap.present[BENCH_METRIC_COMPUTED] && snap.values[BENCH_METRIC_COMPUTED] == 350);
    assert_true(snap.present[BENCH_METRIC_REUSED] && snap.values[BENCH_METRIC_REUSED] == 600);
    assert_true(snap.present[BENCH_METRIC_KV_BYTES] && snap.values[BENCH_METRIC_KV_BYTES] == 1e6);

    memset(&snap, 0, sizeof(snap));
    bench_metrics_add_text(router_only, strlen(router_only), &snap);
    bench_metrics_add_text(router_only, strlen(router_only), &snap); /* two endpoints sum */
    bench_metrics_resolve(&snap);
    assert_true(snap.values[BENCH_METRIC_COMPUTED] == 600);
    assert_true(snap.values[BENCH_METRIC_REUSED] == 1200);
    assert_false(snap.present[BENCH_METRIC_KV_BYTES]);
    assert_string_equal(bench_metric_name(BENCH_METRIC_REUSED),
                        "tandem_prefill_tokens_reused_total");
}

/* Writes text as the file root/rel, or makes the directory root/rel when text is NULL. */
static void put_under(const char *root, const char *rel, const char *text)
{
    char path[PATH_BYTES];
    FILE *file;

    snprintf(path, sizeof(path), "%s/%s", root, rel);
    if (text == NULL) {
        mkdir(path, 0755);
        return;
    }
    file = fopen(path, "w");
    assert_non_null(file);
    fputs(text, file);
    assert_int_equal(fclose(file), 0);
}

/* A fake powercap tree: package zone 0 with a dram subzone, a core subzone (not counted). */
static void test_rapl_energy_counts_packages_and_dram_across_wrap(void **state)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    /* Directories (text NULL) before the files in them. */
    static const struct {
        const char *rel;
        const char *text;
    } tree[] = {
        {"intel-rapl:0", NULL},
        {"intel-rapl:0/intel-rapl:0:0", NULL},
        {"intel-rapl:0/intel-rapl:0:1", NULL},
        {"intel-rapl:0/name", "package-0\n"},
        {"intel-rapl:0/max_energy_range_uj", "1000000\n"},
        {"intel-rapl:0/energy_uj", "900000\n"},
        {"intel-rapl:0/intel-rapl:0:0/name", "core\n"},
        {"intel-rapl:0/intel-rapl:0:0/energy_uj", "5\n"},
        {"intel-rapl:0/intel-rapl:0:1/name", "dram\n"},
        {"intel-rapl:0/intel-rapl:0:1/energy_uj", "100\n"},
    };
    char root[PATH_BYTES / 2];
    bench_power_t *power = NULL;
    bench_power_reading_t r;
    (void)state;

    snprintf(root, sizeof(root), "%s/bench-powercap", tmp != NULL ? tmp : "/tmp");
    mkdir(root, 0755);
    for (size_t i = 0; i < sizeof(tree) / sizeof(tree[0]); i++) {
        put_under(root, tree[i].rel, tree[i].text);
    }

    assert_int_equal(bench_power_create(root, NULL, &power), TDM_OK);
    assert_true(bench_power_available(power));
    assert_string_equal(bench_power_sources(power), "rapl:package-0,dram");
    bench_power_begin(power);
    /* The package counter wraps: 900000 -> (1000000) -> 200000 is 300000 uJ. */
    put_under(root, "intel-rapl:0/energy_uj", "200000\n");
    put_under(root, "intel-rapl:0/intel-rapl:0:1/energy_uj", "50100\n");
    r = bench_power_end(power);
    assert_true(r.measured);
    assert_true(r.energy_j > 0.34999 && r.energy_j < 0.35001);
    bench_power_destroy(power);

    /* No readable source: nothing measured, never a number. */
    assert_int_equal(bench_power_create("/nonexistent-powercap", "libno-such-nvml.so.1", &power),
                     TDM_OK);
    assert_false(bench_power_available(power));
    assert_string_equal(bench_power_sources(power), "none");
    bench_power_begin(power);
    r = bench_power_end(power);
    assert_false(r.measured);
    assert_true(r.energy_j == 0.0 && r.average_w == 0.0);
    bench_power_destroy(power);
}

static void test_pause_rules(void **state)
{
    bench_replay_params_t p;
    bench_turn_t turn;
    double a;
    double b;
    (void)state;

    bench_replay_params_default(&p);
    memset(&turn, 0, sizeof(turn));
    turn.delay_ms = 2500;
    turn.gap_ms = 99999;
    assert_true(bench_replay_pause_ms(&p, BENCH_TRACE_MOONCAKE, &turn, 0, 1, 100.0) == 2500.0);
    turn.delay_ms = -1;
    turn.gap_ms = 4000;
    assert_true(bench_replay_pause_ms(&p, BENCH_TRACE_MOONCAKE, &turn, 0, 1, 1500.0) == 2500.0);
    assert_true(bench_replay_pause_ms(&p, BENCH_TRACE_MOONCAKE, &turn, 0, 1, 5000.0) == 0.0);
    turn.gap_ms = 600000; /* capped at max_pause_s (10 s) */
    assert_true(bench_replay_pause_ms(&p, BENCH_TRACE_MOONCAKE, &turn, 0, 1, 0.0) == 10000.0);
    p.pause_scale = 0.5;
    turn.gap_ms = 4000;
    assert_true(bench_replay_pause_ms(&p, BENCH_TRACE_MOONCAKE, &turn, 0, 1, 0.0) == 2000.0);
    turn.gap_ms = -1;
    assert_true(bench_replay_pause_ms(&p, BENCH_TRACE_MOONCAKE, &turn, 0, 1, 0.0) == 0.0);
    /* SWE-agent: a deterministic lognormal draw inside its clamp. */
    p.pause_scale = 1.0;
    p.max_pause_s = 1000.0;
    a = bench_replay_pause_ms(&p, BENCH_TRACE_SWE_AGENT, &turn, 3, 2, 0.0);
    b = bench_replay_pause_ms(&p, BENCH_TRACE_SWE_AGENT, &turn, 3, 2, 0.0);
    assert_true(a == b);
    assert_true(a >= BENCH_SWE_PAUSE_MIN_MS && a <= BENCH_SWE_PAUSE_MAX_MS);
    assert_true(bench_replay_pause_ms(&p, BENCH_TRACE_SWE_AGENT, &turn, 3, 3, 0.0) != a);
}

static void test_headline_is_interpolated_between_bracketing_levels(void **state)
{
    bench_run_result_t run;
    bench_replay_params_t params;
    bench_report_meta_t meta;
    double value = -1.0;
    (void)state;

    memset(&run, 0, sizeof(run));
    memset(&meta, 0, sizeof(meta));
    bench_replay_params_default(&params);
    meta.params = &params;
    meta.n_cores = 4;
    run.n_levels = 3;
    run.levels[0].stats.speed_p50_tok_s = 150.0;
    run.levels[0].stats.output_tok_s = 100.0; /* 25 per core */
    run.levels[1].stats.speed_p50_tok_s = 120.0;
    run.levels[1].stats.output_tok_s = 200.0; /* 50 */
    run.levels[2].stats.speed_p50_tok_s = 80.0;
    run.levels[2].stats.output_tok_s = 360.0; /* 90 */
    assert_true(bench_report_efficiency(&meta, &run.levels[0]) == 25.0);
    assert_int_equal(bench_report_at_speed(&meta, &run, 100.0, &value), TDM_OK);
    assert_true(value == 70.0); /* halfway from 80 (90) to 120 (50) */
    value = -1.0;
    assert_int_equal(bench_report_at_speed(&meta, &run, 200.0, &value), TDM_ERR_NOT_FOUND);
    assert_true(value == -1.0);
    /* With power measured the unit is tok/s per MW: 360 tok/s at 1.2 kW = 300,000. */
    meta.power_available = 1;
    run.levels[2].power.measured = 1;
    run.levels[2].power.average_w = 1200.0;
    assert_true(bench_report_efficiency(&meta, &run.levels[2]) == 300000.0);
    assert_true(bench_report_efficiency(&meta, &run.levels[1]) == -1.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_percentile_interpolates_between_ranks),
        cmocka_unit_test(test_level_figures_from_known_records),
        cmocka_unit_test(test_level_without_samples_marks_figures_absent),
        cmocka_unit_test(test_stream_gaps_give_median_longest_and_ratio),
        cmocka_unit_test(test_prometheus_sums_samples_of_exact_name),
        cmocka_unit_test(test_metrics_resolve_prefers_tandem_names_then_router_counters),
        cmocka_unit_test(test_rapl_energy_counts_packages_and_dram_across_wrap),
        cmocka_unit_test(test_pause_rules),
        cmocka_unit_test(test_headline_is_interpolated_between_bracketing_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
