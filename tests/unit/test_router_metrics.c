/* test_router_metrics.c - the router's prompt counters (router/metrics.h) that tandem-bench reads:
 * tandem_prefill_tokens_computed_total, tandem_prefill_tokens_reused_total and
 * tandem_kv_bytes_moved_total, fed with the control messages a turn exchanges (DecodeRequest out;
 * CompletionNotice, TokenChunk, Finish, Error in), checked on the rendered Prometheus text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router/metrics.h"

#define PAGE_BYTES 3456u

typedef struct {
    double computed;
    double reused;
    double kv_bytes;
} counts_t;

/* The value of the sample line "name value" in text; fails the test when absent. */
static double sample(const char *text, const char *name)
{
    size_t n = strlen(name);

    for (const char *line = text; line != NULL && *line != '\0';) {
        const char *nl = strchr(line, '\n');
        if (strncmp(line, name, n) == 0 && line[n] == ' ') {
            return atof(line + n + 1);
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    fail_msg("metric %s not rendered", name);
    return -1.0;
}

static counts_t counts(router_metrics_t *m)
{
    router_metrics_gauges_t gauges;
    counts_t c;
    char *text = NULL;
    size_t n_bytes = 0;

    memset(&gauges, 0, sizeof(gauges));
    assert_int_equal(router_metrics_render(m, &gauges, &text, &n_bytes), TDM_OK);
    c.computed = sample(text, "tandem_prefill_tokens_computed_total");
    c.reused = sample(text, "tandem_prefill_tokens_reused_total");
    c.kv_bytes = sample(text, "tandem_kv_bytes_moved_total");
    free(text);
    return c;
}

static void send_decode(router_metrics_t *m, uint64_t id, Tandem__PrefillMode mode,
                        uint64_t cached_len, uint64_t total_len)
{
    Tandem__DecodeRequest dr = TANDEM__DECODE_REQUEST__INIT;

    dr.request_id = id;
    dr.mode = mode;
    dr.cached_len = cached_len;
    dr.total_len = total_len;
    router_metrics_decode_request(m, &dr);
}

static void receive_tokens(router_metrics_t *m, uint64_t id, size_t n_tokens)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__TokenChunk chunk = TANDEM__TOKEN_CHUNK__INIT;
    int32_t tokens[4] = {5, 6, 7, 8};

    chunk.request_id = id;
    chunk.tokens = tokens;
    chunk.n_tokens = n_tokens;
    env.body_case = TANDEM__ENVELOPE__BODY_TOKEN_CHUNK;
    env.token_chunk = &chunk;
    router_metrics_worker_message(m, &env, PAGE_BYTES);
}

static void receive_notice(router_metrics_t *m, uint64_t id, uint64_t cached_len,
                           uint64_t total_len, size_t n_pages)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__CompletionNotice notice = TANDEM__COMPLETION_NOTICE__INIT;
    uint64_t checksums[8] = {0};

    notice.request_id = id;
    notice.cached_len = cached_len;
    notice.total_len = total_len;
    notice.page_checksums = checksums;
    notice.n_page_checksums = n_pages;
    env.body_case = TANDEM__ENVELOPE__BODY_COMPLETION;
    env.completion = &notice;
    router_metrics_worker_message(m, &env, PAGE_BYTES);
}

static void receive_state_lost(router_metrics_t *m, uint64_t id)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Error e = TANDEM__ERROR__INIT;

    e.request_id = id;
    e.code = TANDEM__ERROR_CODE__ERROR_STATE_LOST;
    e.message = "session state not held at cached_len";
    env.body_case = TANDEM__ENVELOPE__BODY_ERROR;
    env.error = &e;
    router_metrics_worker_message(m, &env, PAGE_BYTES);
}

/* Issue 18 item 4: a CompletionNotice whose page checksums went to the decode node directly
 * (state_direct) counts its n_pages; the control socket's byte counters render by direction. */
static void test_direct_state_notice_counts_its_pages_and_control_bytes_render(void **state)
{
    router_metrics_t *m = NULL;
    router_metrics_gauges_t gauges;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__CompletionNotice notice = TANDEM__COMPLETION_NOTICE__INIT;
    char *text = NULL;
    size_t n_bytes = 0;

    (void)state;
    assert_int_equal(router_metrics_create(&m), TDM_OK);
    notice.request_id = 9;
    notice.total_len = 300;
    notice.state_direct = 1;
    notice.n_pages = 5;
    env.body_case = TANDEM__ENVELOPE__BODY_COMPLETION;
    env.completion = &notice;
    router_metrics_worker_message(m, &env, PAGE_BYTES);
    assert_true(counts(m).kv_bytes == 5.0 * PAGE_BYTES);
    router_metrics_count(m, ROUTER_METRIC_CONTROL_BYTES_IN, 1200);
    router_metrics_count(m, ROUTER_METRIC_CONTROL_BYTES_OUT, 345);
    router_metrics_count(m, ROUTER_METRIC_CONTROL_BYTES_IN, 34);
    memset(&gauges, 0, sizeof(gauges));
    assert_int_equal(router_metrics_render(m, &gauges, &text, &n_bytes), TDM_OK);
    assert_true(sample(text, "tandem_router_control_bytes_total{direction=\"in\"}") == 1234);
    assert_true(sample(text, "tandem_router_control_bytes_total{direction=\"out\"}") == 345);
    free(text);
    router_metrics_destroy(m);
}

static void test_local_turn_counts_at_its_first_token(void **state)
{
    router_metrics_t *m = NULL;
    counts_t c;

    (void)state;
    assert_int_equal(router_metrics_create(&m), TDM_OK);
    send_decode(m, 7, TANDEM__PREFILL_MODE__PREFILL_LOCAL, 107, 168);
    c = counts(m);
    assert_true(c.computed == 0 && c.reused == 0); /* nothing before the node answers */
    receive_tokens(m, 7, 0);                       /* an empty chunk is no first token */
    receive_tokens(m, 7, 2);
    receive_tokens(m, 7, 3); /* later chunks add nothing */
    c = counts(m);
    assert_true(c.computed == 61);
    assert_true(c.reused == 107);
    assert_true(c.kv_bytes == 0);
    router_metrics_destroy(m);
}

static void test_refused_attempt_adds_nothing_and_its_retry_counts_once(void **state)
{
    router_metrics_t *m = NULL;
    counts_t c;

    (void)state;
    assert_int_equal(router_metrics_create(&m), TDM_OK);
    /* The node holds another length than asked: STATE_LOST, then the router resends from 0. */
    send_decode(m, 9, TANDEM__PREFILL_MODE__PREFILL_LOCAL, 40, 52);
    receive_state_lost(m, 9);
    receive_tokens(m, 9, 1); /* a stray chunk of the refused attempt */
    c = counts(m);
    assert_true(c.computed == 0 && c.reused == 0);
    send_decode(m, 9, TANDEM__PREFILL_MODE__PREFILL_LOCAL, 0, 52);
    receive_tokens(m, 9, 1);
    c = counts(m);
    assert_true(c.computed == 52);
    assert_true(c.reused == 0);
    router_metrics_destroy(m);
}

static void test_remote_turn_counts_its_notice_and_its_reuse(void **state)
{
    router_metrics_t *m = NULL;
    counts_t c;

    (void)state;
    assert_int_equal(router_metrics_create(&m), TDM_OK);
    receive_notice(m, 11, 175, 226, 3); /* the prefill node finished: computed, pages put */
    c = counts(m);
    assert_true(c.computed == 51);
    assert_true(c.kv_bytes == 3.0 * PAGE_BYTES);
    assert_true(c.reused == 0);
    send_decode(m, 11, TANDEM__PREFILL_MODE__PREFILL_REMOTE, 175, 226);
    receive_tokens(m, 11, 1);
    c = counts(m);
    assert_true(c.computed == 51); /* not counted twice: the notice did */
    assert_true(c.reused == 175);
    router_metrics_destroy(m);
}

static void test_finish_without_tokens_counts_no_reuse(void **state)
{
    router_metrics_t *m = NULL;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Finish fin = TANDEM__FINISH__INIT;
    counts_t c;

    (void)state;
    assert_int_equal(router_metrics_create(&m), TDM_OK);
    send_decode(m, 13, TANDEM__PREFILL_MODE__PREFILL_LOCAL, 10, 50);
    fin.request_id = 13;
    fin.reason = TANDEM__FINISH_REASON__FINISH_ABORTED;
    env.body_case = TANDEM__ENVELOPE__BODY_FINISH;
    env.finish = &fin;
    router_metrics_worker_message(m, &env, PAGE_BYTES);
    receive_tokens(m, 13, 1);
    c = counts(m);
    assert_true(c.computed == 0 && c.reused == 0);
    /* A request in the same table slot replaces one that never got a token. */
    send_decode(m, 14, TANDEM__PREFILL_MODE__PREFILL_LOCAL, 0, 30);
    send_decode(m, 14 + ROUTER_METRICS_PENDING, TANDEM__PREFILL_MODE__PREFILL_LOCAL, 5, 25);
    receive_tokens(m, 14, 1);
    receive_tokens(m, 14 + ROUTER_METRICS_PENDING, 1);
    c = counts(m);
    assert_true(c.computed == 20);
    assert_true(c.reused == 5);
    router_metrics_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_turn_counts_at_its_first_token),
        cmocka_unit_test(test_direct_state_notice_counts_its_pages_and_control_bytes_render),
        cmocka_unit_test(test_refused_attempt_adds_nothing_and_its_retry_counts_once),
        cmocka_unit_test(test_remote_turn_counts_its_notice_and_its_reuse),
        cmocka_unit_test(test_finish_without_tokens_counts_no_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
