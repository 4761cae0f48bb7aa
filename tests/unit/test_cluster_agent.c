/* test_cluster_agent.c - the agent-facing fields of issue 15 items 5-7 on a local cluster
 * (`tandem local`: router, one prefill node, one decode node, tiny preset):
 *   - "n": n = 3 choices with a seed, whole and streamed, on the local-prefill path (prompt
 *     under --local-prefill-tokens) and the remote one: 3 choices indexed 0..2, usage sums them,
 *     the same seed gives the same set on a new session, choice 0 equals the n = 1 answer, the
 *     stream's per-index texts equal the whole answer's, and the prompt was prefilled once
 *     (router, prefill-node and decode-node counters move by the prompt length, not 3 times it);
 *     every forked page is back afterwards; with an n-gram drafter the choices keep their tokens;
 *   - usage.prompt_tokens_details.cached_tokens: 0 on a session's first turn, the reused prefix
 *     (= the router's reused-token counter's move) on its second, whole and streamed;
 *   - top_logprobs of a remotely prefilled first token (the prefill node samples it), whole and
 *     streamed; streamed log-probabilities: one entry per counted token, text_offset cumulative;
 *   - min_tokens: a stop string found within the first min_tokens tokens does not end the output;
 *   - GET /v1/models/{id}: the model object, or a 404 model_not_found in OpenAI's error shape.
 */
#define T_MODEL_PREFIX "cluster-agent"
#include "test_cluster_harness.h"

#include <jansson.h>

#define N_CHOICES 3
#define GEN       6

/* POST `body` (a JSON object, taken) to path; returns the parsed response (asserts 200). */
static json_t *post_json(unsigned port, const char *path, json_t *body, const char *session,
                         char *resp)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_t *root;
    long status;

    assert_non_null(text);
    json_decref(body);
    status = http(port, path, text, session, 0, 120000, resp);
    free(text);
    if (status != 200) {
        fail_msg("%s failed: status=%ld body=%s", path, status, resp);
    }
    root = json_loads(resp, 0, NULL);
    assert_non_null(root);
    return root;
}

/* A completions body of token ids `ids` ("a,b,c"): GEN tokens, temperature 1, seed, n. */
static json_t *ids_body(const char *ids, int n, uint64_t seed, int stream)
{
    json_t *prompt = json_array();
    const char *p = ids;

    while (*p != '\0') {
        json_array_append_new(prompt, json_integer(strtol(p, (char **)&p, 10)));
        if (*p == ',') {
            p++;
        }
    }
    return json_pack("{s:s, s:o, s:i, s:f, s:I, s:i, s:b, s:b}", "model", T_MODEL_NAME, "prompt",
                     prompt, "max_tokens", GEN, "temperature", 1.0, "seed", (json_int_t)seed, "n",
                     n, "ignore_eos", 1, "stream", stream);
}

static json_int_t usage_field(const json_t *root, const char *key)
{
    json_t *usage = json_object_get(root, "usage");

    assert_non_null(usage);
    return json_integer_value(json_object_get(usage, key));
}

static json_int_t cached_tokens(const json_t *usage_holder)
{
    json_t *details =
        json_object_get(json_object_get(usage_holder, "usage"), "prompt_tokens_details");

    assert_non_null(details);
    return json_integer_value(json_object_get(details, "cached_tokens"));
}

/* Texts of a whole completions response's choices (asserted indexed 0 .. n - 1). */
static void whole_texts(const json_t *root, int n, char texts[][512])
{
    json_t *choices = json_object_get(root, "choices");

    assert_int_equal(json_array_size(choices), n);
    for (int i = 0; i < n; i++) {
        json_t *c = json_array_get(choices, i);
        assert_int_equal(json_integer_value(json_object_get(c, "index")), i);
        assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
        snprintf(texts[i], 512, "%s", json_string_value(json_object_get(c, "text")));
    }
}

/* Parse an SSE body: per-index text and finish chunks, and the usage chunk (new ref or NULL). */
static json_t *stream_texts(char *sse, int n, char texts[][512], int *n_finish)
{
    json_t *usage = NULL;

    for (int i = 0; i < n; i++) {
        texts[i][0] = '\0';
        n_finish[i] = 0;
    }
    for (char *line = strtok(sse, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        json_t *chunk;
        json_t *choices;
        if (strncmp(line, "data: {", 7) != 0) {
            continue;
        }
        chunk = json_loads(line + 6, 0, NULL);
        assert_non_null(chunk);
        choices = json_object_get(chunk, "choices");
        if (json_object_get(chunk, "usage") != NULL && json_array_size(choices) == 0) {
            usage = json_incref(chunk);
        }
        for (size_t k = 0; k < json_array_size(choices); k++) {
            json_t *c = json_array_get(choices, k);
            json_int_t index = json_integer_value(json_object_get(c, "index"));
            assert_true(index >= 0 && index < n);
            strncat(texts[index], json_string_value(json_object_get(c, "text")),
                    511 - strlen(texts[index]));
            if (json_is_string(json_object_get(c, "finish_reason"))) {
                n_finish[index]++;
            }
        }
        json_decref(chunk);
    }
    return usage;
}

typedef struct {
    double computed;     /* router: tandem_prefill_tokens_computed_total */
    double reused;       /* router: tandem_prefill_tokens_reused_total */
    double prefill_node; /* prefill node 0: tandem_prefill_tokens_total */
    double local;        /* decode node 0: tandem_decode_local_prefill_tokens_total */
} counters_t;

static void read_counters(const cluster_t *c, counters_t *out)
{
    out->computed = metric(c->http_port, "tandem_prefill_tokens_computed_total");
    out->reused = metric(c->http_port, "tandem_prefill_tokens_reused_total");
    out->prefill_node = metric(c->prefill_port[0], "tandem_prefill_tokens_total");
    out->local = metric(c->decode_port[0], "tandem_decode_local_prefill_tokens_total");
}

/* n = 3 on a prompt of n_prompt ids (remote when >= T_THRESHOLD). */
static void n_choices_case(const cluster_t *c, const char *tag, int n_prompt)
{
    char ids[4096], session[64], *resp = malloc(T_BODY);
    char a[N_CHOICES][512], b[N_CHOICES][512], s[N_CHOICES][512], one[1][512];
    int n_finish[N_CHOICES];
    int remote = n_prompt >= T_THRESHOLD;
    counters_t before, after;
    json_t *root, *usage;

    assert_non_null(resp);
    make_ids(ids, sizeof(ids), n_prompt, 17, 9 + n_prompt);
    read_counters(c, &before);
    snprintf(session, sizeof(session), "%s-a", tag);
    root =
        post_json(c->http_port, "/v1/completions", ids_body(ids, N_CHOICES, 99, 0), session, resp);
    read_counters(c, &after);
    whole_texts(root, N_CHOICES, a);
    assert_int_equal(usage_field(root, "prompt_tokens"), n_prompt);
    assert_int_equal(usage_field(root, "completion_tokens"), N_CHOICES * GEN);
    assert_int_equal(cached_tokens(root), 0);
    json_decref(root);
    print_message("%s (%s, %d prompt ids): n=3 -> \"%s\" | \"%s\" | \"%s\"; prefill counters: "
                  "router computed %.0f, prefill node %.0f, decode local %.0f\n",
                  tag, remote ? "remote" : "local", n_prompt, a[0], a[1], a[2],
                  after.computed - before.computed, after.prefill_node - before.prefill_node,
                  after.local - before.local);
    /* the prompt was prefilled once, on the path its length picks */
    assert_true(after.computed - before.computed == n_prompt);
    assert_true(after.prefill_node - before.prefill_node == (remote ? n_prompt : 0));
    assert_true(after.local - before.local == (remote ? 0 : n_prompt));
    /* the choices differ (each its own sampling stream) */
    assert_true(strcmp(a[0], a[1]) != 0 || strcmp(a[1], a[2]) != 0);

    /* the same seed on a new session: the same set */
    snprintf(session, sizeof(session), "%s-b", tag);
    root =
        post_json(c->http_port, "/v1/completions", ids_body(ids, N_CHOICES, 99, 0), session, resp);
    whole_texts(root, N_CHOICES, b);
    json_decref(root);
    for (int i = 0; i < N_CHOICES; i++) {
        assert_string_equal(a[i], b[i]);
    }

    /* streamed, with include_usage: the same texts, one finish per index, usage sums them */
    snprintf(session, sizeof(session), "%s-c", tag);
    root = ids_body(ids, N_CHOICES, 99, 1);
    json_object_set_new(root, "stream_options", json_pack("{s:b}", "include_usage", 1));
    {
        char *text = json_dumps(root, JSON_COMPACT);
        assert_int_equal(http(c->http_port, "/v1/completions", text, session, 0, 120000, resp),
                         200);
        free(text);
        json_decref(root);
    }
    usage = stream_texts(resp, N_CHOICES, s, n_finish);
    assert_non_null(usage);
    assert_int_equal(usage_field(usage, "completion_tokens"), N_CHOICES * GEN);
    json_decref(usage);
    for (int i = 0; i < N_CHOICES; i++) {
        assert_string_equal(s[i], a[i]);
        assert_int_equal(n_finish[i], 1);
    }

    /* choice 0 is the n = 1 answer of the same seed */
    snprintf(session, sizeof(session), "%s-d", tag);
    root = post_json(c->http_port, "/v1/completions", ids_body(ids, 1, 99, 0), session, resp);
    whole_texts(root, 1, one);
    json_decref(root);
    assert_string_equal(one[0], a[0]);
    free(resp);
}

static void test_n_choices_fork_one_prefill(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */

    (void)state;
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    n_choices_case(&c, "n-local", 12);
    n_choices_case(&c, "n-remote", 40);
    cluster_check_pages(&c, "n choices");
    cluster_stop(&c);
}

/* n = 3 with a drafter: the forks speculate on their own copies and keep the same tokens
 * (coupled acceptance, MODEL.md 8) as plain decoding. */
static void test_n_choices_under_speculation(void **state)
{
    static cluster_t c;
    char ids[1024], *resp = malloc(T_BODY);
    char plain[N_CHOICES][512], spec[N_CHOICES][512];
    json_t *body, *root;
    double steps;

    (void)state;
    assert_non_null(resp);
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, "ngram"), 0);
    make_ids(ids, sizeof(ids), 12, 5, 21);
    for (int with = 0; with < 2; with++) {
        body = ids_body(ids, N_CHOICES, 4242, 0);
        json_object_set_new(body, "spec", json_string(with ? "ngram" : "off"));
        root =
            post_json(c.http_port, "/v1/completions", body, with ? "spec-ngram" : "spec-off", resp);
        whole_texts(root, N_CHOICES, with ? spec : plain);
        json_decref(root);
    }
    steps = metric(c.decode_port[0], "tandem_spec_steps_total{drafter=\"ngram\"}");
    for (int i = 0; i < N_CHOICES; i++) {
        assert_string_equal(spec[i], plain[i]);
    }
    print_message("n=3 with ngram speculation (%.0f drafter sequence-steps) equals plain: "
                  "\"%s\" | \"%s\" | \"%s\"\n",
                  steps, spec[0], spec[1], spec[2]);
    /* the ngram turn's choices decoded through the drafter: at least one step each */
    assert_true(steps >= N_CHOICES);
    cluster_check_pages(&c, "n choices, speculation");
    cluster_stop(&c);
    free(resp);
}

/* A streamed completions answer's log-probabilities (issue 16): one entry per token counted in
 * usage, the first (remotely prefilled) token with alternatives, text_offset cumulative. */
static void check_streamed_logprobs(char *sse)
{
    json_int_t n_entries = 0, completion = -1, offset = 0;
    json_int_t n_first_top = -1;

    for (char *line = strtok(sse, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        json_t *chunk, *lp;
        if (strncmp(line, "data: {", 7) != 0) {
            continue;
        }
        chunk = json_loads(line + 6, 0, NULL);
        assert_non_null(chunk);
        if (json_object_get(chunk, "usage") != NULL &&
            !json_is_null(json_object_get(chunk, "usage"))) {
            completion = usage_field(chunk, "completion_tokens");
        }
        lp = json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "logprobs");
        for (size_t i = 0; lp != NULL && i < json_array_size(json_object_get(lp, "tokens")); i++) {
            const json_t *token = json_array_get(json_object_get(lp, "tokens"), i);
            if (n_entries == 0) {
                n_first_top = (json_int_t)json_object_size(
                    json_array_get(json_object_get(lp, "top_logprobs"), 0));
            }
            assert_int_equal(
                json_integer_value(json_array_get(json_object_get(lp, "text_offset"), i)), offset);
            offset += (json_int_t)json_string_length(token);
            n_entries++;
        }
        json_decref(chunk);
    }
    print_message("streamed logprobs: %lld entries, usage %lld tokens, first token %lld "
                  "alternatives\n",
                  (long long)n_entries, (long long)completion, (long long)n_first_top);
    assert_int_equal(n_entries, completion);
    assert_true(n_first_top > 0);
}

static void test_usage_cached_tokens_and_first_token_logprobs(void **state)
{
    static cluster_t c;
    char ids1[4096], ids2[8192], gen[1024], more[1024], *resp = malloc(T_BODY);
    counters_t before, after;
    json_t *root, *body, *lp;
    json_int_t cached;

    (void)state;
    assert_non_null(resp);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    /* turn 1 (remote): nothing cached; the prefill node's first token carries its top 3 */
    make_ids(ids1, sizeof(ids1), 40, 7, 3);
    body = ids_body(ids1, 1, 5, 0);
    json_object_set_new(body, "temperature", json_real(0.0));
    json_object_set_new(body, "logprobs", json_integer(3));
    root = post_json(c.http_port, "/v1/completions", body, "cached", resp);
    assert_int_equal(cached_tokens(root), 0);
    lp = json_object_get(json_array_get(json_object_get(root, "choices"), 0), "logprobs");
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), GEN);
    /* before issue 15 the remote first token had no alternatives (an empty map); the map is
     * keyed by token text, so two alternatives with one text count once */
    print_message("remote first token: %zu top alternatives, second token %zu\n",
                  json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)),
                  json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 1)));
    assert_true(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)) > 0);
    assert_true(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 1)) > 0);
    json_decref(root);

    /* turn 2: the first turn's prompt and output, then more ids: the session's prefix reused */
    generate_ids(ids1, GEN, gen, sizeof(gen));
    make_ids(more, sizeof(more), 6, 13, 5);
    snprintf(ids2, sizeof(ids2), "%s,%s,%s", ids1, gen, more);
    read_counters(&c, &before);
    body = ids_body(ids2, 1, 5, 1);
    json_object_set_new(body, "temperature", json_real(0.0));
    json_object_set_new(body, "stream_options", json_pack("{s:b}", "include_usage", 1));
    {
        char *text = json_dumps(body, JSON_COMPACT);
        char s[1][512];
        int n_finish[1];
        json_t *usage;
        assert_int_equal(http(c.http_port, "/v1/completions", text, "cached", 0, 120000, resp),
                         200);
        free(text);
        usage = stream_texts(resp, 1, s, n_finish);
        assert_non_null(usage);
        cached = cached_tokens(usage);
        json_decref(usage);
    }
    json_decref(body);
    read_counters(&c, &after);
    print_message("cached_tokens: turn 2 of %d prompt ids reused %lld (router reused counter "
                  "moved %.0f, computed %.0f)\n",
                  40 + GEN + 6, (long long)cached, after.reused - before.reused,
                  after.computed - before.computed);
    assert_true(cached > 0);
    assert_true((double)cached == after.reused - before.reused);
    assert_true((double)cached + (after.computed - before.computed) == 40 + GEN + 6);
    /* the same streamed, on a new session (remote prefill): every token's entry, in order */
    {
        char *text;
        make_ids(ids1, sizeof(ids1), 40, 11, 5);
        body = ids_body(ids1, 1, 9, 1);
        json_object_set_new(body, "temperature", json_real(0.0));
        json_object_set_new(body, "logprobs", json_integer(3));
        json_object_set_new(body, "stream_options", json_pack("{s:b}", "include_usage", 1));
        text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        assert_int_equal(http(c.http_port, "/v1/completions", text, "stream-lp", 0, 120000, resp),
                         200);
        free(text);
        check_streamed_logprobs(resp);
    }
    cluster_check_pages(&c, "cached tokens");
    cluster_stop(&c);
    free(resp);
}

static void test_min_tokens_and_model_object(void **state)
{
    static cluster_t c;
    char ids[1024], *resp = malloc(T_BODY), stop[8];
    const char *text;
    size_t n_stop;
    json_t *root, *body;
    char full[512];

    (void)state;
    assert_non_null(resp);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);

    /* GET /v1/models/{id}: the model object; an unknown id is OpenAI's 404 */
    assert_int_equal(http(c.http_port, "/v1/models/" T_MODEL_NAME, NULL, NULL, 0, 5000, resp), 200);
    root = json_loads(resp, 0, NULL);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "id")), T_MODEL_NAME);
    assert_string_equal(json_string_value(json_object_get(root, "object")), "model");
    json_decref(root);
    assert_int_equal(http(c.http_port, "/v1/models/gpt-4o", NULL, NULL, 0, 5000, resp), 404);
    root = json_loads(resp, 0, NULL);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "error"), "code")),
                        "model_not_found");
    assert_non_null(json_object_get(json_object_get(root, "error"), "message"));
    json_decref(root);

    /* min_tokens: greedy output T; its first character as a stop string ends the output at
     * once, unless min_tokens covers the whole output */
    make_ids(ids, sizeof(ids), 10, 3, 11);
    body = ids_body(ids, 1, 1, 0);
    json_object_set_new(body, "temperature", json_real(0.0));
    root = post_json(c.http_port, "/v1/completions", body, NULL, resp);
    text = json_string_value(
        json_object_get(json_array_get(json_object_get(root, "choices"), 0), "text"));
    snprintf(full, sizeof(full), "%s", text);
    json_decref(root);
    n_stop = (unsigned char)full[0] < 0x80   ? 1
             : (unsigned char)full[0] < 0xE0 ? 2
             : (unsigned char)full[0] < 0xF0 ? 3
                                             : 4;
    assert_true(strlen(full) >= n_stop);
    memcpy(stop, full, n_stop);
    stop[n_stop] = '\0';
    for (int min = 0; min <= GEN; min += GEN) {
        const char *want_finish = min == 0 ? "stop" : "length";
        json_t *choice;
        body = ids_body(ids, 1, 1, 0);
        json_object_set_new(body, "temperature", json_real(0.0));
        json_object_set_new(body, "stop", json_string(stop));
        json_object_set_new(body, "min_tokens", json_integer(min));
        root = post_json(c.http_port, "/v1/completions", body, NULL, resp);
        choice = json_array_get(json_object_get(root, "choices"), 0);
        print_message("min_tokens %d, stop \"%s\": \"%s\" (%s)\n", min, stop,
                      json_string_value(json_object_get(choice, "text")),
                      json_string_value(json_object_get(choice, "finish_reason")));
        assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")),
                            want_finish);
        if (min == 0) {
            assert_string_equal(json_string_value(json_object_get(choice, "text")), "");
        } else {
            assert_string_equal(json_string_value(json_object_get(choice, "text")), full);
        }
        json_decref(root);
    }
    cluster_stop(&c);
    free(resp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_n_choices_fork_one_prefill, stop_leftovers),
        cmocka_unit_test_teardown(test_n_choices_under_speculation, stop_leftovers),
        cmocka_unit_test_teardown(test_usage_cached_tokens_and_first_token_logprobs,
                                  stop_leftovers),
        cmocka_unit_test_teardown(test_min_tokens_and_model_object, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
