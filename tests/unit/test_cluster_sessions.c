/* test_cluster_sessions.c - issue 16's "same seed, different text" on a real local cluster
 * (tools/tandem local: router, one prefill node, one decode node, tiny model): a long request
 * without X-Session-Id, sent again, used to be attached to the first request's session by prefix
 * and continued from a rewind of its state (approximate past the sliding window W = 16 of the
 * tiny model), so the text differed even at temperature 0. Now each gets its own session (pages
 * may be shared, the output is a fresh run's): the same request twice at temperature 0, and
 * twice with a seed at temperature 1, gives the same text as a fresh named session, on the local
 * prefill path (delta below --local-prefill-tokens) and on the remote one. Pages back at
 * baseline.
 */
#define T_MODEL_PREFIX "cluster-sessions"
#include "test_cluster_harness.h"

/* POST `body` to /v1/completions without a session id (session NULL) or with one; the text. */
static char *complete_body(unsigned port, const char *session, const char *body)
{
    char *resp = malloc(T_BODY);
    char *text;
    long status;

    assert_non_null(resp);
    status = http(port, "/v1/completions", body, session, 0, 120000, resp);
    if (status != 200) {
        fail_msg("completion failed: status=%ld body=%s", status, resp);
    }
    text = response_text(resp);
    assert_non_null(text);
    free(resp);
    return text;
}

/* The same request twice without a session id, then in a fresh named session: equal texts. */
static void same_request_twice(const cluster_t *c, const char *name, int n_ids, int seeded)
{
    char *ids = malloc(T_BODY);
    char *body = malloc(T_BODY);
    char fresh_id[64];
    char *t1;
    char *t2;
    char *fresh;

    assert_non_null(ids);
    assert_non_null(body);
    make_ids(ids, T_BODY, n_ids, 13, 7 + n_ids);
    snprintf(body, T_BODY,
             "{\"model\":\"%s\",\"prompt\":[%s],\"max_tokens\":12,\"ignore_eos\":true,%s}",
             T_MODEL_NAME, ids, seeded ? "\"temperature\":1.0,\"seed\":1234" : "\"temperature\":0");
    t1 = complete_body(c->http_port, NULL, body);
    t2 = complete_body(c->http_port, NULL, body);
    snprintf(fresh_id, sizeof(fresh_id), "%s-fresh", name);
    fresh = complete_body(c->http_port, fresh_id, body);
    print_message("%s: %d prompt ids%s: first \"%s\", again \"%s\", fresh \"%s\"\n", name, n_ids,
                  seeded ? " (seeded)" : "", t1, t2, fresh);
    assert_string_equal(t1, fresh);
    assert_string_equal(t2, fresh);
    free(t1);
    free(t2);
    free(fresh);
    free(ids);
    free(body);
}

static void test_same_request_without_session_gives_the_same_text(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */

    (void)state;
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    /* 28 ids: prefilled on the decode node (< 32); the others on the prefill node. All past
     * W = 16, where a rewound state is approximate; the old router's second answer differed
     * from the first at 300 ids (greedy), measured with this test. */
    same_request_twice(&c, "local-greedy", 28, 0);
    same_request_twice(&c, "remote-greedy", 48, 0);
    same_request_twice(&c, "long-greedy", 300, 0);
    same_request_twice(&c, "longer-greedy", 700, 0);
    same_request_twice(&c, "local-seeded", 28, 1);
    same_request_twice(&c, "long-seeded", 300, 1);
    cluster_check_pages(&c, "sessions");
    cluster_stop(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_same_request_without_session_gives_the_same_text,
                                  stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
