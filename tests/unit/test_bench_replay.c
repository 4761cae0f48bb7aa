/* test_bench_replay.c - tandem-bench end to end against the in-process fake server: timings
 * with known delays, prefill and KV counters from /metrics, errors, session budgets, context
 * cuts, durations, SWE-agent chat replay, the client's failure paths and the report files. */
#include <curl/curl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "bench/replay/client.h"
#include "bench/replay/fake_server.h"
#include "bench/replay/replay.h"
#include "bench/replay/report.h"
#include "bench/replay/trace.h"

#define ERR_BYTES  512
#define URL_BYTES  256
#define PATH_BYTES 2048

/* Two sessions of two turns; scale 1/32 makes 16-token blocks: prompts 32, 48 (a) and 16,
 * 32 (b) tokens; outputs 20, 20, 10, 10 tokens. No pauses (delay 0). */
static const char *two_sessions =
    "{\"session_id\": \"a\", \"timestamp\": 0, \"input_length\": 1024, \"output_length\": 640, "
    "\"hash_ids\": [1, 2]}\n"
    "{\"session_id\": \"b\", \"timestamp\": 0, \"input_length\": 512, \"output_length\": 320, "
    "\"hash_ids\": [7]}\n"
    "{\"session_id\": \"a\", \"delay\": 0, \"input_length\": 1536, \"output_length\": 640, "
    "\"hash_ids\": [1, 2, 3]}\n"
    "{\"session_id\": \"b\", \"delay\": 0, \"input_length\": 1024, \"output_length\": 320, "
    "\"hash_ids\": [7, 8]}\n";

typedef struct {
    bench_fake_t *fake;
    bench_trace_t *trace;
    char url[URL_BYTES];
    char metrics_url[URL_BYTES + 16];
} fixture_t;

static int start(void **state, const bench_fake_params_t *fp)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    char err[ERR_BYTES] = "";

    assert_non_null(fx);
    assert_int_equal(bench_fake_create(fp, &fx->fake), TDM_OK);
    snprintf(fx->url, sizeof(fx->url), "http://127.0.0.1:%u", bench_fake_port(fx->fake));
    snprintf(fx->metrics_url, sizeof(fx->metrics_url), "%s/metrics", fx->url);
    assert_int_equal(bench_trace_parse_mooncake(two_sessions, strlen(two_sessions), "two",
                                                &fx->trace, err, sizeof(err)),
                     TDM_OK);
    *state = fx;
    return 0;
}

static int setup_default(void **state)
{
    bench_fake_params_t fp;
    bench_fake_params_default(&fp);
    fp.ttft_ms = 40.0;
    fp.itl_ms = 10.0;
    fp.vocab_size = 1000;
    fp.kv_bytes_per_token = 100;
    fp.disagg_min_tokens = 16;
    return start(state, &fp);
}

static int setup_failing(void **state)
{
    bench_fake_params_t fp;
    bench_fake_params_default(&fp);
    fp.ttft_ms = 1.0;
    fp.itl_ms = 1.0;
    fp.vocab_size = 1000;
    fp.fail_every = 3;
    return start(state, &fp);
}

static int setup_fast(void **state)
{
    bench_fake_params_t fp;
    bench_fake_params_default(&fp);
    fp.ttft_ms = 2.0;
    fp.itl_ms = 2.0;
    fp.vocab_size = 1000;
    fp.tokens_per_chunk = 4;
    return start(state, &fp);
}

/* A server with a 4,096-token context: the bundled SWE-agent session (about 10K tokens a
 * prompt as the fake counts them) does not fit unscaled. */
static int setup_small_context(void **state)
{
    bench_fake_params_t fp;
    bench_fake_params_default(&fp);
    fp.ttft_ms = 1.0;
    fp.itl_ms = 1.0;
    fp.vocab_size = 1000;
    fp.max_model_len = 4096;
    return start(state, &fp);
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    bench_fake_destroy(fx->fake);
    bench_trace_destroy(fx->trace);
    free(fx);
    return 0;
}

static void params_for(const fixture_t *fx, bench_replay_params_t *p)
{
    bench_replay_params_default(p);
    p->base_url = fx->url;
    p->model = "tandem-fake";
    p->metrics_urls[0] = fx->metrics_url;
    p->n_metrics_urls = 1;
    p->scale = 1.0 / 32.0;
    p->vocab_size = 1000;
    p->duration_s = 0.0;
    p->n_sessions = 0; /* every trace session once */
    p->timeout_s = 30.0;
}

static void test_discover_reads_models(void **state)
{
    fixture_t *fx = *state;
    bench_server_info_t info;

    assert_int_equal(bench_replay_discover(fx->url, NULL, &info), TDM_OK);
    assert_string_equal(info.model, "tandem-fake");
    assert_int_equal(info.vocab_size, 1000);
    assert_int_equal(info.max_model_len, 1048576);
    assert_int_equal(bench_replay_discover("http://127.0.0.1:1", NULL, &info), TDM_ERR_PEER_LOST);
    assert_int_equal(info.vocab_size, -1);
}

/* Known delays: TTFT >= 40 ms, chunk gaps ~10 ms; exact token and prefill arithmetic. */
static void test_levels_match_known_timings_and_counters(void **state)
{
    fixture_t *fx = *state;
    bench_replay_params_t p;
    bench_run_result_t run;
    bench_fake_counters_t c;

    params_for(fx, &p);
    p.concurrency[0] = 1;
    p.concurrency[1] = 2;
    p.n_levels = 2;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_OK);
    assert_int_equal(run.n_levels, 2);
    for (size_t l = 0; l < 2; l++) {
        const bench_level_result_t *level = &run.levels[l];
        const bench_level_stats_t *s = &level->stats;
        double recomputed = (double)s->output_tokens / s->wall_s;

        print_message("c=%u: %.1f tok/s ttft p50 %.1f p99 %.1f ms itl p50 %.2f p99 %.2f ms "
                      "speed p50 %.1f p10 %.1f\n",
                      level->concurrency, s->output_tok_s, s->ttft_p50_ms, s->ttft_p99_ms,
                      s->itl_p50_ms, s->itl_p99_ms, s->speed_p50_tok_s, s->speed_p10_tok_s);
        assert_int_equal(level->concurrency, l == 0 ? 1 : 2);
        assert_string_equal(level->stop_reason, "trace");
        assert_int_equal(s->n_requests, 4);
        assert_int_equal(s->n_errors, 0);
        assert_int_equal(level->n_sessions_started, 2);
        assert_int_equal(level->n_sessions_completed, 2);
        assert_int_equal(s->output_tokens, 60);
        assert_int_equal(s->input_tokens, 32 + 48 + 16 + 32);
        assert_true(s->output_tok_s > recomputed * 0.999999 &&
                    s->output_tok_s < recomputed * 1.000001);
        /* Every request's first token waits at least the fake's 40 ms. */
        assert_true(s->ttft_p50_ms >= 40.0 && s->ttft_p50_ms < 40.0 + 400.0);
        assert_true(s->ttft_p99_ms >= s->ttft_p50_ms);
        assert_int_equal(s->n_itl_samples, 19 + 19 + 9 + 9);
        assert_true(s->itl_p50_ms >= 8.0 && s->itl_p50_ms < 40.0);
        assert_int_equal(s->n_speed_samples, 4);
        assert_true(s->speed_p50_tok_s > 25.0 && s->speed_p50_tok_s < 125.0);
        assert_true(s->speed_p10_tok_s <= s->speed_p50_tok_s);
        /* Session a: 32 computed, then 32 reused + 16 computed; b: 16, then 16 + 16. */
        assert_true(level->metrics_available);
        assert_true(level->metrics_delta.values[BENCH_METRIC_COMPUTED] == 80.0);
        assert_true(level->metrics_delta.values[BENCH_METRIC_REUSED] == 48.0);
        assert_true(level->metrics_delta.values[BENCH_METRIC_KV_BYTES] == 8000.0);
        for (size_t r = 0; r < level->n_requests; r++) {
            assert_int_equal(level->requests[r].usage_reported, 1);
            assert_int_equal(level->requests[r].http_status, 200);
        }
    }
    bench_fake_counters(fx->fake, &c);
    assert_int_equal(c.n_requests, 8);
    assert_int_equal(c.n_failed, 0); /* every prompt id was a plain id of the vocabulary */
    assert_int_equal(c.n_session_headers, 8);
    assert_int_equal(c.output_tokens, 120);
    bench_run_result_fini(&run);
}

/* Every third request fails: at concurrency 1, b's first turn (request 3) fails and ends b. */
static void test_failed_requests_are_counted_and_end_their_session(void **state)
{
    fixture_t *fx = *state;
    bench_replay_params_t p;
    bench_run_result_t run;
    const bench_level_result_t *level;

    params_for(fx, &p);
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_OK);
    level = &run.levels[0];
    assert_int_equal(level->stats.n_requests, 3);
    assert_int_equal(level->stats.n_ok, 2);
    assert_int_equal(level->stats.n_errors, 1);
    assert_int_equal(level->n_sessions_completed, 1);
    assert_int_equal(level->requests[2].result, BENCH_REQ_ERR_HTTP);
    assert_int_equal(level->requests[2].http_status, 500);
    assert_int_equal(level->stats.output_tokens, 40);
    bench_run_result_fini(&run);

    /* An error budget of 1 stops the level at the first failure. */
    params_for(fx, &p);
    p.max_errors = 1;
    p.n_sessions = 50;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_OK);
    assert_string_equal(run.levels[0].stop_reason, "errors");
    assert_int_equal(run.levels[0].stats.n_errors, 1);
    bench_run_result_fini(&run);
}

static void test_max_context_ends_sessions_before_the_turn(void **state)
{
    fixture_t *fx = *state;
    bench_replay_params_t p;
    bench_run_result_t run;

    params_for(fx, &p);
    p.max_context = 60; /* a's second turn needs 48 + 20 */
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_OK);
    assert_int_equal(run.levels[0].stats.n_requests, 3);
    assert_int_equal(run.levels[0].n_context_cut, 1);
    assert_int_equal(run.levels[0].n_sessions_completed, 1);
    assert_string_equal(run.context_hint, ""); /* a chosen limit is no misfit */
    bench_run_result_fini(&run);

    /* The server's own limit: Mooncake counts are exact, so the hint comes before the run. */
    p.server_context = 60;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_OK);
    assert_int_equal(run.levels[0].stats.n_requests, 3);
    assert_int_equal(run.levels[0].stats.n_errors, 0);
    assert_non_null(strstr(run.context_hint, "turn 2 of session a needs 68 tokens at --scale "
                                             "0.03125, the server takes 60"));
    /* 0.03125 * 0.9 * 60 / 68 = 0.0248 */
    assert_non_null(strstr(run.context_hint, "use --scale 0.024 or a larger preset"));
    bench_run_result_fini(&run);
}

/* A session budget beyond the trace wraps around with fresh tokens (nothing reused across). */
static void test_session_budget_wraps_the_trace(void **state)
{
    fixture_t *fx = *state;
    bench_replay_params_t p;
    bench_run_result_t run;
    const bench_level_result_t *level;

    params_for(fx, &p);
    p.n_sessions = 6;
    p.concurrency[0] = 3;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_OK);
    level = &run.levels[0];
    assert_string_equal(level->stop_reason, "sessions");
    assert_int_equal(level->n_sessions_started, 6);
    assert_int_equal(level->stats.n_requests, 12);
    assert_int_equal(level->stats.n_errors, 0);
    assert_true(level->metrics_delta.values[BENCH_METRIC_COMPUTED] == 240.0);
    assert_true(level->metrics_delta.values[BENCH_METRIC_REUSED] == 144.0);
    /* Multi-token chunks: output counts come from usage, not chunk counts. */
    assert_int_equal(level->stats.output_tokens, 180);
    assert_true(level->requests[0].n_chunks < (uint32_t)level->requests[0].output_tokens);
    bench_run_result_fini(&run);
}

static void test_duration_stops_new_turns(void **state)
{
    fixture_t *fx = *state;
    bench_replay_params_t p;
    bench_run_result_t run;
    const bench_level_result_t *level;

    params_for(fx, &p);
    p.duration_s = 0.3;
    p.concurrency[0] = 2;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_OK);
    level = &run.levels[0];
    assert_string_equal(level->stop_reason, "duration");
    assert_true(level->stats.wall_s >= 0.3);
    assert_true(level->stats.n_requests > 4); /* the 2-session trace wrapped */
    assert_int_equal(level->stats.n_errors, 0);
    bench_run_result_fini(&run);
}

static void test_tool_pauses_are_waited(void **state)
{
    fixture_t *fx = *state;
    const char *text = "{\"session_id\": \"s\", \"input_length\": 512, \"output_length\": 64}\n"
                       "{\"session_id\": \"s\", \"delay\": 250, \"input_length\": 1024, "
                       "\"output_length\": 64}\n";
    bench_trace_t *trace = NULL;
    bench_replay_params_t p;
    bench_run_result_t run;
    char err[ERR_BYTES];
    const bench_request_t *r;

    assert_int_equal(
        bench_trace_parse_mooncake(text, strlen(text), "pause", &trace, err, sizeof(err)), TDM_OK);
    params_for(fx, &p);
    assert_int_equal(bench_replay_run(&p, trace, NULL, &run), TDM_OK);
    assert_int_equal(run.levels[0].stats.n_requests, 2);
    r = run.levels[0].requests;
    assert_true(r[1].t_send_ns - r[0].t_end_ns >= 250000000ULL);
    assert_true(run.levels[0].pause_total_s >= 0.25);
    bench_run_result_fini(&run);
    bench_trace_destroy(trace);
}

static void test_swe_agent_trace_replays_as_chat(void **state)
{
    fixture_t *fx = *state;
    const char *root = getenv("TANDEM_SOURCE_DIR");
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    bench_trace_t *trace = NULL;
    bench_replay_params_t p;
    bench_run_result_t run;
    bench_fake_counters_t before;
    bench_fake_counters_t after;

    snprintf(path, sizeof(path), "%s/bench/traces/swe-agent__test-repo-i1.traj",
             root != NULL ? root : ".");
    assert_int_equal(bench_trace_load_swe_agent(path, &trace, err, sizeof(err)), TDM_OK);
    params_for(fx, &p);
    p.scale = 0.1;
    p.max_pause_s = 0.0;
    p.n_sessions = 2;
    p.concurrency[0] = 2;
    bench_fake_counters(fx->fake, &before);
    assert_int_equal(bench_replay_run(&p, trace, NULL, &run), TDM_OK);
    bench_fake_counters(fx->fake, &after);
    assert_int_equal(run.levels[0].stats.n_requests, 10);
    assert_int_equal(run.levels[0].stats.n_errors, 0);
    assert_int_equal(after.n_requests - before.n_requests, 10);
    /* The system prompt and demo are shared by both copies and by each session's turns. */
    assert_true(after.prompt_reused - before.prompt_reused >
                after.prompt_computed - before.prompt_computed);
    for (size_t r = 0; r < run.levels[0].n_requests; r++) {
        assert_true(run.levels[0].requests[r].input_tokens > 10000); /* usage.prompt_tokens */
    }
    bench_run_result_fini(&run);
    bench_trace_destroy(trace);
}

/* The table's error block and results.json name the cause of the refusals. */
static void check_report_names_the_cause(const fixture_t *fx, const bench_trace_t *trace,
                                         const bench_replay_params_t *p,
                                         const bench_run_result_t *run)
{
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char path[PATH_BYTES];
    char *table = NULL;
    size_t n_table = 0;
    FILE *out = open_memstream(&table, &n_table);
    bench_report_meta_t meta;
    bench_server_info_t server;
    json_t *root;
    json_error_t jerr;
    const json_t *level;

    assert_non_null(out);
    assert_int_equal(bench_replay_discover(fx->url, NULL, &server), TDM_OK);
    memset(&meta, 0, sizeof(meta));
    meta.trace_path = "swe";
    meta.trace = trace;
    meta.params = p;
    meta.server = &server;
    meta.power_sources = "none";
    meta.n_cores = 2;
    bench_report_table(out, &meta, run);
    fclose(out);
    assert_non_null(strstr(table, "errors:\n"));
    assert_non_null(strstr(table, "refused as longer than the server's context"));
    assert_non_null(strstr(table, "cause: the trace does not fit the server's context: turn 1"));
    free(table);
    snprintf(path, sizeof(path), "%s/bench-fit-results.json", tmp != NULL ? tmp : "/tmp");
    assert_int_equal(bench_report_write_json(path, &meta, run), TDM_OK);
    root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    assert_non_null(
        strstr(json_string_value(json_object_get(root, "context_hint")), "use --scale"));
    level = json_array_get(json_object_get(root, "levels"), 0);
    assert_int_equal(json_integer_value(json_object_get(level, "errors_context_length")),
                     json_integer_value(json_object_get(level, "errors")));
    assert_true(json_is_string(json_object_get(level, "first_error")));
    assert_true(json_is_null(json_object_get(level, "itl_max_over_median"))); /* no stream */
    json_decref(root);
}

/* Unscaled, every session's first turn is too long: the first refusal gives the run's one hint
 * (with a --scale), the level's errors are all counted as context refusals, and once the server
 * has counted a prompt the remaining sessions end before sending. At the hinted scale (text cut
 * by bench_trace_scale_text) the same trace replays without an error. */
static void test_too_long_chat_trace_gets_one_hint_and_fits_at_its_scale(void **state)
{
    fixture_t *fx = *state;
    const char *root = getenv("TANDEM_SOURCE_DIR");
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    bench_trace_t *trace = NULL;
    bench_replay_params_t p;
    bench_run_result_t run;
    const bench_level_result_t *level;
    const char *at;
    double hinted = 0.0;

    snprintf(path, sizeof(path), "%s/bench/traces/swe-agent__test-repo-i1.traj",
             root != NULL ? root : ".");
    assert_int_equal(bench_trace_load_swe_agent(path, &trace, err, sizeof(err)), TDM_OK);
    params_for(fx, &p);
    p.scale = 1.0;
    p.max_context = 4096; /* what /v1/models says */
    p.max_pause_s = 0.0;
    p.n_sessions = 6;
    p.concurrency[0] = 2;
    assert_int_equal(bench_replay_run(&p, trace, NULL, &run), TDM_OK);
    level = &run.levels[0];
    print_message("unscaled: %llu requests, %llu errors, %llu cut; hint: %s\n",
                  (unsigned long long)level->stats.n_requests,
                  (unsigned long long)level->stats.n_errors,
                  (unsigned long long)level->n_context_cut, run.context_hint);
    assert_true(level->stats.n_errors >= 1 && level->stats.n_errors <= 2); /* one per agent */
    assert_int_equal(level->stats.n_requests, level->stats.n_errors);
    assert_int_equal(level->n_context_errors, level->stats.n_errors);
    assert_int_equal(level->n_context_cut + level->stats.n_errors, 6);
    assert_non_null(strstr(level->first_error, "context"));
    assert_non_null(strstr(run.context_hint, "turn 1 of session swe-agent__test-repo-i1.traj"));
    assert_non_null(strstr(run.context_hint, "the server takes 4,096"));
    at = strstr(run.context_hint, "use --scale ");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "use --scale %lf", &hinted), 1);
    assert_true(hinted > 0.0 && hinted < 1.0);
    check_report_names_the_cause(fx, trace, &p, &run);
    bench_run_result_fini(&run);

    /* at the hinted scale */
    assert_int_equal(bench_trace_scale_text(trace, hinted), TDM_OK);
    p.scale = hinted;
    p.n_sessions = 2;
    assert_int_equal(bench_replay_run(&p, trace, NULL, &run), TDM_OK);
    level = &run.levels[0];
    assert_int_equal(level->stats.n_errors, 0);
    assert_int_equal(level->stats.n_requests, 10);
    assert_int_equal(level->n_context_cut, 0);
    assert_string_equal(run.context_hint, "");
    assert_string_equal(level->first_error, "");
    bench_run_result_fini(&run);
    bench_trace_destroy(trace);
}

static void test_client_reports_connection_and_http_failures(void **state)
{
    fixture_t *fx = *state;
    bench_client_params_t cp;
    bench_client_t *client = NULL;
    bench_request_t req;
    const char *bad = "{\"model\":\"m\",\"prompt\":[0,1],\"max_tokens\":2,\"stream\":true}";

    memset(&cp, 0, sizeof(cp));
    cp.base_url = fx->url;
    cp.timeout_ms = 10000;
    cp.connect_timeout_ms = 2000;
    assert_int_equal(bench_client_create(&cp, &client), TDM_OK);
    memset(&req, 0, sizeof(req));
    /* Special token ids are refused by the fake (HTTP 400). */
    assert_int_equal(
        bench_client_stream(client, BENCH_API_COMPLETIONS, bad, strlen(bad), NULL, &req),
        TDM_ERR_MISMATCH);
    assert_int_equal(req.result, BENCH_REQ_ERR_HTTP);
    assert_int_equal(req.http_status, 400);
    assert_non_null(strstr(bench_client_last_error(client), "HTTP 400"));
    bench_client_destroy(client);

    cp.base_url = "http://127.0.0.1:1";
    assert_int_equal(bench_client_create(&cp, &client), TDM_OK);
    memset(&req, 0, sizeof(req));
    assert_int_equal(
        bench_client_stream(client, BENCH_API_COMPLETIONS, bad, strlen(bad), NULL, &req),
        TDM_ERR_PEER_LOST);
    assert_int_equal(req.result, BENCH_REQ_ERR_CONNECT);
    bench_request_fini(&req);
    bench_client_destroy(client);
    cp.base_url = NULL;
    client = NULL;
    assert_int_equal(bench_client_create(&cp, &client), TDM_ERR_INVALID_ARG);
    assert_null(client);
}

static void test_bad_params_are_refused(void **state)
{
    fixture_t *fx = *state;
    bench_replay_params_t p;
    bench_run_result_t run;

    params_for(fx, &p);
    p.concurrency[0] = 0;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_ERR_INVALID_ARG);
    assert_int_equal(run.n_levels, 0);
    params_for(fx, &p);
    p.vocab_size = 8;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_ERR_INVALID_ARG);
    params_for(fx, &p);
    p.scale = 2.0;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_ERR_INVALID_ARG);
}

static int file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int)st.st_size : -1;
}

static void test_report_files_are_written(void **state)
{
    fixture_t *fx = *state;
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char dir[PATH_BYTES / 2];
    char path[PATH_BYTES];
    bench_replay_params_t p;
    bench_run_result_t run;
    bench_report_meta_t meta;
    bench_server_info_t server;
    json_t *root;
    json_error_t jerr;
    tdm_status_t plot;
    FILE *devnull = fopen("/dev/null", "w");

    snprintf(dir, sizeof(dir), "%s/bench-report", tmp != NULL ? tmp : "/tmp");
    mkdir(dir, 0755);
    params_for(fx, &p);
    p.concurrency[0] = 1;
    p.concurrency[1] = 2;
    p.n_levels = 2;
    assert_int_equal(bench_replay_run(&p, fx->trace, NULL, &run), TDM_OK);
    assert_int_equal(bench_replay_discover(fx->url, NULL, &server), TDM_OK);
    memset(&meta, 0, sizeof(meta));
    meta.trace_path = "two";
    meta.trace = fx->trace;
    meta.params = &p;
    meta.server = &server;
    meta.power_sources = "none";
    meta.n_cores = 2;
    bench_report_table(devnull, &meta, &run);
    fclose(devnull);
    snprintf(path, sizeof(path), "%s/results.json", dir);
    assert_int_equal(bench_report_write_json(path, &meta, &run), TDM_OK);
    root = json_load_file(path, 0, &jerr);
    assert_non_null(root);
    assert_int_equal(json_array_size(json_object_get(root, "levels")), 2);
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(json_object_get(root, "levels"), 1), "concurrency")),
                     2);
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(root, "levels"), 0),
                                             "output_tok_s_per_mw")));
    assert_true(json_is_real(json_object_get(json_array_get(json_object_get(root, "levels"), 0),
                                             "output_tok_s_per_core")));
    assert_string_equal(json_string_value(json_object_get(root, "efficiency_unit")), "tok/s/core");
    {
        const json_t *level = json_array_get(json_object_get(root, "levels"), 0);
        /* per-stream gaps (fake: 2 ms a chunk) */
        assert_true(json_real_value(json_object_get(level, "itl_median_ms")) >= 1.0);
        assert_true(json_real_value(json_object_get(level, "itl_max_ms")) >=
                    json_real_value(json_object_get(level, "itl_median_ms")));
        assert_true(json_real_value(json_object_get(level, "itl_max_over_median")) >= 1.0);
        assert_true(json_is_null(json_object_get(root, "context_hint")));
        assert_true(json_is_null(json_object_get(level, "first_error")));
    }
    json_decref(root);
    snprintf(path, sizeof(path), "%s/requests.csv", dir);
    assert_int_equal(bench_report_write_csv(path, &run), TDM_OK);
    assert_true(file_size(path) > 100);
    plot = bench_report_plot(dir, &meta, &run);
    if (plot == TDM_ERR_NOT_FOUND) {
        print_message("gnuplot not installed: chart not checked\n");
    } else {
        assert_int_equal(plot, TDM_OK);
        snprintf(path, sizeof(path), "%s/throughput.png", dir);
        assert_true(file_size(path) > 1000);
    }
    bench_run_result_fini(&run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_discover_reads_models, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_levels_match_known_timings_and_counters, setup_default,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_failed_requests_are_counted_and_end_their_session,
                                        setup_failing, teardown),
        cmocka_unit_test_setup_teardown(test_max_context_ends_sessions_before_the_turn, setup_fast,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_session_budget_wraps_the_trace, setup_fast, teardown),
        cmocka_unit_test_setup_teardown(test_duration_stops_new_turns, setup_fast, teardown),
        cmocka_unit_test_setup_teardown(test_tool_pauses_are_waited, setup_fast, teardown),
        cmocka_unit_test_setup_teardown(test_swe_agent_trace_replays_as_chat, setup_fast, teardown),
        cmocka_unit_test_setup_teardown(
            test_too_long_chat_trace_gets_one_hint_and_fits_at_its_scale, setup_small_context,
            teardown),
        cmocka_unit_test_setup_teardown(test_client_reports_connection_and_http_failures,
                                        setup_fast, teardown),
        cmocka_unit_test_setup_teardown(test_bad_params_are_refused, setup_fast, teardown),
        cmocka_unit_test_setup_teardown(test_report_files_are_written, setup_fast, teardown),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
