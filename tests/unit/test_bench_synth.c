/* test_bench_synth.c - tandem-bench synth: same seed same bytes, and the coding-agent shape
 * (sessions by session_id, growing contexts with kept prefixes, ~110-token replies,
 * multi-second pauses, a median near 14K input tokens, contexts past 100K). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/replay/synth.h"
#include "bench/replay/trace.h"

#define ERR_BYTES 512

/* The synth output for (n_sessions, seed) in a heap string (caller frees). */
static char *synth_text(uint64_t n_sessions, uint64_t seed, size_t *n_out,
                        bench_synth_summary_t *summary_out)
{
    bench_synth_params_t params;
    char *text = NULL;
    size_t n = 0;
    FILE *out = open_memstream(&text, &n);

    assert_non_null(out);
    params.n_sessions = n_sessions;
    params.seed = seed;
    assert_int_equal(bench_synth_write(&params, out, summary_out), TDM_OK);
    assert_int_equal(fclose(out), 0);
    *n_out = n;
    return text;
}

static void test_same_seed_same_bytes(void **state)
{
    size_t n1;
    size_t n2;
    size_t n3;
    char *a = synth_text(20, 7, &n1, NULL);
    char *b = synth_text(20, 7, &n2, NULL);
    char *c = synth_text(20, 8, &n3, NULL);
    (void)state;

    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    assert_true(n1 != n3 || memcmp(a, c, n1) != 0);
    free(a);
    free(b);
    free(c);
}

static int compare_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x;
    int64_t b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static void test_shape_is_coding_agent_like(void **state)
{
    const uint64_t n_sessions = 200;
    bench_synth_summary_t summary;
    bench_trace_t *trace = NULL;
    char err[ERR_BYTES] = "";
    size_t n = 0;
    char *text = synth_text(n_sessions, 1, &n, &summary);
    int64_t *pauses;
    size_t n_pauses = 0;
    int64_t prev_ts = -1;
    (void)state;

    print_message("synth: %llu requests, input p50 %lld max %lld (%llu > 100K), output p50 "
                  "%lld, pause p50 %lld ms\n",
                  (unsigned long long)summary.n_requests, (long long)summary.input_p50,
                  (long long)summary.input_max, (unsigned long long)summary.n_over_100k,
                  (long long)summary.output_p50, (long long)summary.pause_p50_ms);
    assert_true(summary.input_p50 >= 10000 && summary.input_p50 <= 20000);
    assert_true(summary.input_max > 100000);
    assert_true(summary.input_max <= BENCH_SYNTH_MAX_CONTEXT);
    assert_true(summary.n_over_100k > 0);
    assert_true(summary.output_p50 >= 90 && summary.output_p50 <= 130);
    assert_true(summary.pause_p50_ms >= 2000 && summary.pause_p50_ms <= 4500);

    assert_int_equal(bench_trace_parse_mooncake(text, n, "synth", &trace, err, sizeof(err)),
                     TDM_OK);
    assert_int_equal(trace->n_sessions, n_sessions);
    assert_int_equal(trace->n_requests, summary.n_requests);
    assert_int_equal(trace->n_rebuilt_sessions, 0);
    pauses = calloc(trace->n_requests, sizeof(int64_t));
    assert_non_null(pauses);
    for (size_t s = 0; s < trace->n_sessions; s++) {
        const bench_session_t *session = &trace->sessions[s];
        assert_true(session->n_turns >= 1);
        assert_true(session->turns[0].delay_ms == -1);
        for (size_t t = 0; t < session->n_turns; t++) {
            const bench_turn_t *turn = &session->turns[t];
            /* Mooncake's convention: one id per 512-token block, the last one partial. */
            assert_int_equal(turn->n_hash_ids, (size_t)((turn->input_length + 511) / 512));
            /* Every session starts with the shared system prompt blocks 0..6. */
            for (int64_t b = 0; b < BENCH_SYNTH_SHARED_TOKENS / 512; b++) {
                assert_int_equal(turn->hash_ids[b], b);
            }
            if (t > 0) {
                const bench_turn_t *prev = &session->turns[t - 1];
                size_t kept = (size_t)(prev->input_length / 512);
                assert_true(turn->input_length > prev->input_length + prev->output_length);
                assert_memory_equal(turn->hash_ids, prev->hash_ids, kept * sizeof(int64_t));
                assert_true(turn->delay_ms >= 200 && turn->delay_ms <= 120000);
                assert_true(turn->timestamp_ms >= prev->timestamp_ms + turn->delay_ms);
                pauses[n_pauses++] = turn->delay_ms;
            }
        }
    }
    /* Lines are in timestamp order, as a recorded trace. */
    for (const char *line = text; line != NULL && *line != '\0';) {
        const char *ts = strstr(line, "\"timestamp\":");
        const char *next = strchr(line, '\n');
        int64_t value;
        assert_non_null(ts);
        value = strtoll(ts + 12, NULL, 10);
        assert_true(value >= prev_ts);
        prev_ts = value;
        line = next != NULL ? next + 1 : NULL;
    }
    qsort(pauses, n_pauses, sizeof(int64_t), compare_i64);
    assert_true(pauses[n_pauses / 2] >= 1000); /* multi-second tool pauses */
    free(pauses);
    bench_trace_destroy(trace);
    free(text);
}

static void test_zero_sessions_is_refused(void **state)
{
    bench_synth_params_t params = {0, 1};
    bench_synth_summary_t summary;
    char *text = NULL;
    size_t n = 0;
    FILE *out = open_memstream(&text, &n);
    (void)state;

    memset(&summary, 0x5a, sizeof(summary));
    assert_int_equal(bench_synth_write(&params, out, &summary), TDM_ERR_INVALID_ARG);
    fclose(out);
    assert_int_equal(n, 0);
    assert_int_equal(summary.n_requests, 0x5a5a5a5a5a5a5a5aULL);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_bytes),
        cmocka_unit_test(test_shape_is_coding_agent_like),
        cmocka_unit_test(test_zero_sessions_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
