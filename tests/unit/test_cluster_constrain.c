/* test_cluster_constrain.c - constrained decoding end to end on a local cluster (tiny preset):
 * a completion with a json_schema response_format whose prompt is prefilled by the prefill node
 * (its first token sampled there, under the mask) and one prefilled by the decode node itself;
 * both texts parse and satisfy the schema and finish with "stop"; a decode node with --spec ngram
 * gives the same texts as one with --spec off; n = 3 choices each satisfy it; a chat turn with
 * tool_choice "required" or a named function answers with one call whose arguments follow the
 * tool's schema (finish_reason tool_calls). */
#define T_MODEL_PREFIX "constrain"
#include "test_cluster_harness.h"

#include <jansson.h>

/* Bounded by construction (no free string, number or array), so every completion ends. */
#define RF                                                                                         \
    "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"strict\":true,\"schema\":{"       \
    "\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"alpha\",\"beta\"]},"                \
    "\"ok\":{\"type\":\"boolean\"},\"none\":{\"type\":\"null\"},\"sub\":{\"type\":\"object\","     \
    "\"properties\":{\"x\":{\"enum\":[\"p\",\"q\"]}},\"required\":[\"x\"],"                        \
    "\"additionalProperties\":false}},\"required\":[\"kind\",\"ok\",\"none\",\"sub\"],"            \
    "\"additionalProperties\":false}}}"

/* POST a seeded constrained completion of `ids` with n choices; returns choice 0's text after
 * checking that every choice finished with "stop" and its text satisfies the schema
 * (malloc'ed). */
static char *constrained_n(unsigned port, const char *session, const char *ids, int n)
{
    char *body = malloc(T_BODY);
    char *resp = malloc(T_BODY);
    json_t *root, *choice, *doc;
    json_error_t jerr;
    const char *text;
    char *out;
    long status;

    assert_non_null(body);
    assert_non_null(resp);
    snprintf(body, T_BODY,
             "{\"model\":\"%s\",\"prompt\":[%s],\"max_tokens\":400,\"temperature\":0.8,"
             "\"seed\":7,\"n\":%d,\"response_format\":%s}",
             T_MODEL_NAME, ids, n, RF);
    status = http(port, "/v1/completions", body, session, 0, 120000, resp);
    if (status != 200) {
        fail_msg("completion failed: status=%ld body=%s", status, resp);
    }
    root = json_loads(resp, 0, &jerr);
    assert_non_null(root);
    assert_int_equal(json_array_size(json_object_get(root, "choices")), n);
    for (int i = 0; i < n; i++) {
        choice = json_array_get(json_object_get(root, "choices"), (size_t)i);
        assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
        text = json_string_value(json_object_get(choice, "text"));
        assert_non_null(text);
        doc = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
        if (doc == NULL) {
            fail_msg("choice %d not JSON (%s): %s", i, jerr.text, text);
        }
        assert_int_equal(json_object_size(doc), 4);
        assert_non_null(json_string_value(json_object_get(doc, "kind")));
        assert_true(json_is_boolean(json_object_get(doc, "ok")));
        assert_true(json_is_null(json_object_get(doc, "none")));
        assert_non_null(json_string_value(json_object_get(json_object_get(doc, "sub"), "x")));
        json_decref(doc);
    }
    text = json_string_value(
        json_object_get(json_array_get(json_object_get(root, "choices"), 0), "text"));
    print_message("constrained completion: %s\n", text);
    out = strdup(text);
    json_decref(root);
    free(body);
    free(resp);
    return out;
}

static char *constrained(unsigned port, const char *session, const char *ids)
{
    return constrained_n(port, session, ids, 1);
}

static void two_requests(cluster_t *c, char **remote_out, char **local_out)
{
    char ids[4096];

    make_ids(ids, sizeof(ids), 100, 37, 11); /* > T_THRESHOLD: the prefill node samples first */
    *remote_out = constrained(c->http_port, "rf-remote", ids);
    make_ids(ids, sizeof(ids), 12, 53, 5); /* < T_THRESHOLD: the decode node prefills */
    *local_out = constrained(c->http_port, "rf-local", ids);
}

/* POST a chat turn whose tool_choice forces a call (`choice`: "\"required\"" or a named
 * function object); checks the answer is one call with arguments of the tool's schema and
 * finish_reason tool_calls (the router's output parser read the forced DSML block). */
static void forced_tool_call(unsigned port, const char *choice, const char *want_name)
{
    char *body = malloc(T_BODY);
    char *resp = malloc(T_BODY);
    json_t *root, *choice0, *calls, *fn, *args;
    json_error_t jerr;
    const char *name;
    long status;

    assert_non_null(body);
    assert_non_null(resp);
    snprintf(body, T_BODY,
             "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"set it\"}],"
             "\"max_tokens\":400,\"temperature\":0.8,\"seed\":5,\"tool_choice\":%s,\"tools\":["
             "{\"type\":\"function\",\"function\":{\"name\":\"set_mode\",\"parameters\":{"
             "\"type\":\"object\",\"properties\":{\"unit\":{\"enum\":[\"c\",\"f\"]},"
             "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"unit\",\"ok\"]}}},"
             "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]}",
             T_MODEL_NAME, choice);
    status = http(port, "/v1/chat/completions", body, NULL, 0, 120000, resp);
    if (status != 200) {
        fail_msg("chat failed: status=%ld body=%s", status, resp);
    }
    root = json_loads(resp, 0, &jerr);
    assert_non_null(root);
    choice0 = json_array_get(json_object_get(root, "choices"), 0);
    if (strcmp(json_string_value(json_object_get(choice0, "finish_reason")), "tool_calls") != 0) {
        fail_msg("not a tool call: %s", resp);
    }
    calls = json_object_get(json_object_get(choice0, "message"), "tool_calls");
    /* "required" with parallel_tool_calls (default true) may call several times; named: once */
    assert_true(json_array_size(calls) >= 1);
    if (want_name != NULL) {
        assert_int_equal(json_array_size(calls), 1);
    }
    for (size_t i = 0; i < json_array_size(calls); i++) {
        fn = json_object_get(json_array_get(calls, i), "function");
        name = json_string_value(json_object_get(fn, "name"));
        assert_non_null(name);
        args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, &jerr);
        assert_non_null(args);
        print_message("forced call %zu: %s(%s)\n", i, name,
                      json_string_value(json_object_get(fn, "arguments")));
        if (want_name != NULL) {
            assert_string_equal(name, want_name);
        }
        if (strcmp(name, "set_mode") == 0) {
            const char *unit = json_string_value(json_object_get(args, "unit"));

            assert_non_null(unit);
            assert_true(strcmp(unit, "c") == 0 || strcmp(unit, "f") == 0);
            assert_true(json_is_boolean(json_object_get(args, "ok")));
            assert_int_equal(json_object_size(args), 2);
        } else {
            assert_string_equal(name, "ping");
            assert_int_equal(json_object_size(args), 0);
        }
        json_decref(args);
    }
    json_decref(root);
    free(body);
    free(resp);
}

static void test_response_format_across_nodes_and_spec(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *off_remote, *off_local, *ng_remote, *ng_local;

    (void)state;
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, "off"), 0);
    two_requests(&c, &off_remote, &off_local);
    assert_true(metric(c.prefill_port[0], "tandem_prefill_tokens_total") == 100);
    {
        char ids[4096];

        /* n = 3: the choices forked after the first token each walk their own constraint, on the
         * prefill node's first tokens (disaggregated) and on the decode node's */
        make_ids(ids, sizeof(ids), 90, 41, 17);
        free(constrained_n(c.http_port, "rf-n-remote", ids, 3));
        make_ids(ids, sizeof(ids), 10, 43, 9);
        free(constrained_n(c.http_port, "rf-n-local", ids, 3));
    }
    cluster_check_pages(&c, "constrained, spec off");
    cluster_stop(&c);
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, "ngram"), 0);
    two_requests(&c, &ng_remote, &ng_local);
    forced_tool_call(c.http_port, "\"required\"", NULL);
    forced_tool_call(c.http_port, "{\"type\":\"function\",\"function\":{\"name\":\"set_mode\"}}",
                     "set_mode");
    /* every token after the first came out of a speculative step */
    assert_true(metric(c.decode_port[0], "tandem_spec_steps_total{drafter=\"ngram\"}") > 0);
    cluster_check_pages(&c, "constrained, spec ngram");
    cluster_stop(&c);
    assert_string_equal(ng_remote, off_remote);
    assert_string_equal(ng_local, off_local);
    free(off_remote);
    free(off_local);
    free(ng_remote);
    free(ng_local);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_response_format_across_nodes_and_spec, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
