/* test_router.c - tandem-router end to end on loopback: an in-process router (router_create), fake
 * prefill/decode workers speaking tandem.proto over ZeroMQ DEALER sockets (test_router_fake.h),
 * and libcurl as the HTTP client. Covers the validation matrix, streamed and whole responses of
 * both endpoints, stop strings across chunks, UTF-8 split across tokens, registration refusal,
 * worker death and re-placement, stickiness and prefix matching, disaggregated handoff, a prefill
 * worker lost mid-job, and that failed requests never take the router down. Waits are polls with
 * deadlines, never sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "common/clock.h"
#include "common/log.h"
#include "router/model.h"
#include "router/router.h"
#include "router/validate.h"
#include "router_test_util.h"
#include "test_router_fake.h"

#define PATH_BYTES           4096
#define ERR_BYTES            512
#define BYTE_ID(b)           ((int32_t)(3 + (unsigned char)(b))) /* synthetic tokenizer: byte b is id 3+b */
#define EOS_ID               1
#define IMAGE_ID             1022
#define LOCAL_PREFILL_TOKENS 64
#define HEALTH_DEADLINE_MS   3000

typedef rtu_router_t fixture_t; /* router_test_util.h */

typedef struct {
    long status;
    char *body;
    size_t n_body;
    char session[160];
} http_resp_t;

/* ---- HTTP client ------------------------------------------------------------------------ */

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    http_resp_t *r = arg;
    char *grown = realloc(r->body, r->n_body + size * n + 1);

    if (grown == NULL) {
        return 0;
    }
    r->body = grown;
    memcpy(r->body + r->n_body, data, size * n);
    r->n_body += size * n;
    r->body[r->n_body] = '\0';
    return size * n;
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    http_resp_t *r = arg;
    static const char NAME[] = "x-session-id:";
    size_t len = size * n;

    if (len > sizeof(NAME) && strncasecmp(data, NAME, sizeof(NAME) - 1) == 0) {
        size_t start = sizeof(NAME) - 1;
        size_t end = len;
        while (start < end && data[start] == ' ') {
            start++;
        }
        while (end > start && (data[end - 1] == '\r' || data[end - 1] == '\n')) {
            end--;
        }
        snprintf(r->session, sizeof(r->session), "%.*s", (int)(end - start), data + start);
    }
    return len;
}

static void http_do(int port, const char *method, const char *path, const char *content_type,
                    const char *body, const char *session, http_resp_t *out)
{
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = NULL;
    char url[256];
    char line[256];

    memset(out, 0, sizeof(*out));
    assert_non_null(curl);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, out);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (body != NULL) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    }
    if (content_type != NULL) {
        snprintf(line, sizeof(line), "Content-Type: %s", content_type);
        headers = curl_slist_append(headers, line);
    } else if (body != NULL) {
        headers = curl_slist_append(headers, "Content-Type:");
    }
    if (session != NULL) {
        snprintf(line, sizeof(line), "X-Session-Id: %s", session);
        headers = curl_slist_append(headers, line);
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    assert_int_equal(curl_easy_perform(curl), CURLE_OK);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (out->body == NULL) {
        out->body = calloc(1, 1);
    }
}

static void post(const fixture_t *fx, const char *path, const char *body, const char *session,
                 http_resp_t *out)
{
    http_do(fx->port, "POST", path, "application/json", body, session, out);
}

/* The generated text, finish reason and completion tokens of a whole or streamed response. */
typedef struct {
    char text[4096];
    char finish[32];
    long completion_tokens;
    int saw_done;
    int n_chunks;
    int error;
} result_t;

static void parse_whole(const char *body, result_t *res)
{
    json_error_t jerr;
    json_t *root = json_loads(body, 0, &jerr);
    json_t *choice;
    json_t *text;

    memset(res, 0, sizeof(*res));
    assert_non_null(root);
    choice = json_array_get(json_object_get(root, "choices"), 0);
    text = json_object_get(choice, "text");
    if (text == NULL) {
        text = json_object_get(json_object_get(choice, "message"), "content");
    }
    assert_true(json_is_string(text));
    snprintf(res->text, sizeof(res->text), "%s", json_string_value(text));
    snprintf(res->finish, sizeof(res->finish), "%s",
             json_string_value(json_object_get(choice, "finish_reason")));
    res->completion_tokens = (long)json_integer_value(
        json_object_get(json_object_get(root, "usage"), "completion_tokens"));
    json_decref(root);
}

static void parse_sse(const char *body, result_t *res)
{
    const char *line = body;

    memset(res, 0, sizeof(*res));
    while (line != NULL && *line != '\0') {
        const char *end = strstr(line, "\n");
        size_t n = end != NULL ? (size_t)(end - line) : strlen(line);
        if (n > 6 && strncmp(line, "data: ", 6) == 0) {
            if (n == 12 && strncmp(line + 6, "[DONE]", 6) == 0) {
                res->saw_done = 1;
            } else {
                json_error_t jerr;
                json_t *root = json_loadb(line + 6, n - 6, 0, &jerr);
                json_t *choice;
                json_t *text;
                json_t *finish;
                assert_non_null(root);
                assert_false(res->saw_done);
                if (json_object_get(root, "error") != NULL) {
                    res->error = 1;
                }
                choice = json_array_get(json_object_get(root, "choices"), 0);
                text = json_object_get(choice, "text");
                if (text == NULL) {
                    text = json_object_get(json_object_get(choice, "delta"), "content");
                }
                if (json_is_string(text)) {
                    strncat(res->text, json_string_value(text),
                            sizeof(res->text) - strlen(res->text) - 1);
                    res->n_chunks += json_string_length(text) > 0;
                }
                finish = json_object_get(choice, "finish_reason");
                if (json_is_string(finish)) {
                    snprintf(res->finish, sizeof(res->finish), "%s", json_string_value(finish));
                }
                if (json_object_get(root, "usage") != NULL) {
                    res->completion_tokens = (long)json_integer_value(
                        json_object_get(json_object_get(root, "usage"), "completion_tokens"));
                }
                json_decref(root);
            }
        }
        line = end != NULL ? end + 1 : NULL;
    }
}

/* ---- fixture ---------------------------------------------------------------------------- */

static int setup(void **state)
{
    fixture_t *fx = rtu_router_start("router-model", FAKE_HEARTBEAT_MS, 600, LOCAL_PREFILL_TOKENS);

    if (fx == NULL) {
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;

    rtu_router_stop(fx);
    return 0;
}

static void set_script(fake_worker_t *w, const char *text, int eos, size_t chunk_tokens)
{
    w->n_script = 0;
    for (const char *c = text; *c != '\0'; c++) {
        w->script[w->n_script++] = BYTE_ID(*c);
    }
    if (eos) {
        w->script[w->n_script++] = EOS_ID;
    }
    w->chunk_tokens = chunk_tokens;
}

static void start_worker(const fixture_t *fx, fake_worker_t *w, const char *id, Tandem__Role role,
                         const char *rack)
{
    fake_init(w, id, role, rack, fx->compat, fx->endpoint);
    fake_start(w);
    assert_int_equal(fake_wait_registered(w, 5000), 1);
}

/* Poll /health until it reports n_decode decode workers or the deadline passes. */
static int wait_decode_workers(const fixture_t *fx, int n_decode, uint32_t deadline_ms)
{
    uint64_t end = tdm_clock_now_ns() + (uint64_t)deadline_ms * TDM_NS_PER_MS;
    char want[64];

    snprintf(want, sizeof(want), "\"decode\":%d", n_decode);
    while (tdm_clock_now_ns() < end) {
        http_resp_t r;
        int ok;
        http_do(fx->port, "GET", "/health", NULL, NULL, NULL, &r);
        ok = strstr(r.body, want) != NULL;
        free(r.body);
        if (ok) {
            return 1;
        }
        zmq_poll(NULL, 0, 10);
    }
    return 0;
}

static void assert_error(const http_resp_t *r, long status, const char *code)
{
    json_error_t jerr;
    json_t *root = json_loads(r->body, 0, &jerr);
    json_t *err;

    if (r->status != status) {
        print_message("expected %ld %s, got %ld: %s\n", status, code, r->status, r->body);
    }
    assert_int_equal(r->status, status);
    assert_non_null(root);
    err = json_object_get(root, "error");
    assert_true(json_is_object(err));
    assert_true(json_is_string(json_object_get(err, "message")));
    assert_true(json_is_string(json_object_get(err, "type")));
    assert_string_equal(json_string_value(json_object_get(err, "code")), code);
    json_decref(root);
}

/* ---- tests ------------------------------------------------------------------------------ */

typedef struct {
    const fixture_t *fx;
    atomic_int stop;
    int n_ok;
    int n_bad;
} background_t;

static void *background_requests(void *arg)
{
    background_t *bg = arg;

    while (!atomic_load(&bg->stop) || bg->n_ok == 0) {
        http_resp_t r;
        result_t res;
        post(bg->fx, "/v1/completions",
             "{\"model\":\"tiny\",\"prompt\":\"background\",\"max_tokens\":20,\"stream\":true}",
             NULL, &r);
        parse_sse(r.body, &res);
        if (r.status == 200 && res.saw_done && strcmp(res.text, "Hello, world!") == 0) {
            bg->n_ok++;
        } else {
            bg->n_bad++;
        }
        free(r.body);
    }
    return NULL;
}

static void test_validation_matrix_answers_openai_errors_while_others_complete(void **state)
{
    fixture_t *fx = *state;
    static const struct {
        const char *path;
        const char *content_type;
        const char *body;
        long status;
        const char *code;
    } cases[] = {
        {"/v1/chat/completions", "application/json", "{\"model\":", 400, "invalid_json"},
        {"/v1/chat/completions", "application/json", "[1,2]", 400, "invalid_json"},
        {"/v1/chat/completions", "text/plain", "{\"model\":\"tiny\"}", 415,
         "unsupported_media_type"},
        {"/v1/completions", NULL, "{\"model\":\"tiny\",\"prompt\":\"x\"}", 415,
         "unsupported_media_type"},
        {"/v1/completions", "application/json", "{\"model\":\"tiny\",\"prompt\":\"\"}", 400,
         "empty_prompt"},
        {"/v1/completions", "application/json", "{\"model\":\"tiny\",\"prompt\":[]}", 400,
         "empty_prompt"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"tiny\",\"messages\":[]}", 400,
         "empty_prompt"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":0}", 400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":-3}", 400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":2.5}", 400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":\"10\"}", 400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":9000}", 400,
         "context_length_exceeded"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":NaN}", 400, "invalid_json"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":Infinity}", 400, "invalid_json"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":1e999}", 400, "invalid_json"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":2.5}", 400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":-0.1}", 400, "invalid_value"},
        {"/v1/completions", "application/json", "{\"model\":\"tiny\",\"prompt\":\"x\",\"top_p\":0}",
         400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"top_p\":1.01}", 400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"top_p\":\"high\"}", 400, "invalid_type"},
        {"/v1/completions", "application/json", "{\"model\":\"tiny\",\"prompt\":\"x\",\"n\":9}",
         400, "invalid_value"},
        {"/v1/completions", "application/json", "{\"model\":\"tiny\",\"prompt\":\"x\",\"n\":0}",
         400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"n\":\"two\"}", 400, "invalid_type"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"min_tokens\":-1}", 400, "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":4,\"min_tokens\":5}", 400,
         "invalid_value"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"min_tokens\":1.5}", 400, "invalid_type"},
        {"/v1/completions", "application/json",
         "{\"model\":\"tiny\",\"prompt\":\"x\",\"presence_penalty\":0.5}", 400,
         "unsupported_parameter"},
        {"/v1/completions", "application/json", "{\"model\":\"gpt-4\",\"prompt\":\"x\"}", 404,
         "model_not_found"},
        {"/v1/completions", "application/json", "{\"prompt\":\"x\"}", 400, "missing_parameter"},
        {"/v1/chat/completions", "application/json",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
         "\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AA==\"}}]}]}",
         400, "unsupported_input"},
        {"/v1/completions", "application/json", "{\"model\":\"tiny\",\"prompt\":[5,1022,6]}", 400,
         "unsupported_input"},
        {"/v1/completions", "application/json", "{\"model\":\"tiny\",\"prompt\":[5,1024]}", 400,
         "invalid_token_id"},
        {"/v1/completions", "application/json", "{\"model\":\"tiny\",\"prompt\":[5,-1]}", 400,
         "invalid_token_id"},
        {"/v1/chat/completions", "application/json",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
         "invalid_value"},
        {"/v1/nothing", "application/json", "{}", 404, "not_found"},
    };
    fake_worker_t dec;
    background_t bg;
    pthread_t bg_thread;
    http_resp_t r;
    char *long_prompt;
    size_t used;

    start_worker(fx, &dec, "decode-validation", TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script(&dec, "Hello, world!", 1, 2);
    memset(&bg, 0, sizeof(bg));
    bg.fx = fx;
    pthread_create(&bg_thread, NULL, background_requests, &bg);

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        http_do(fx->port, "POST", cases[i].path, cases[i].content_type, cases[i].body, NULL, &r);
        assert_error(&r, cases[i].status, cases[i].code);
        free(r.body);
    }
    /* The image refusal carries MODEL.md section 1's exact message. */
    post(fx, "/v1/chat/completions",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
         "\"text\":\"look\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
         NULL, &r);
    assert_non_null(strstr(r.body, "image inputs are not supported by this deployment"));
    free(r.body);
    /* A prompt of max-context ids is over the limit. */
    long_prompt = malloc(8192 * 4 + 64);
    used = (size_t)sprintf(long_prompt, "{\"model\":\"tiny\",\"prompt\":[");
    for (int i = 0; i < 8192; i++) {
        used += (size_t)sprintf(long_prompt + used, "%s7", i > 0 ? "," : "");
    }
    sprintf(long_prompt + used, "]}");
    post(fx, "/v1/completions", long_prompt, NULL, &r);
    assert_error(&r, 400, "context_length_exceeded");
    free(r.body);
    free(long_prompt);
    http_do(fx->port, "GET", "/v1/completions", NULL, NULL, NULL, &r);
    assert_error(&r, 405, "method_not_allowed");
    free(r.body);
    post(fx, "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\"}", "bad id", &r);
    assert_error(&r, 400, "invalid_session_id");
    free(r.body);

    atomic_store(&bg.stop, 1);
    pthread_join(bg_thread, NULL);
    assert_true(bg.n_ok >= 1);
    assert_int_equal(bg.n_bad, 0);
    /* The router is still healthy and serving; every refusal is counted by code. */
    http_do(fx->port, "GET", "/health", NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    http_do(fx->port, "GET", "/metrics", NULL, NULL, NULL, &r);
    assert_non_null(
        strstr(r.body, "tandem_router_errors_total{code=\"invalid_json\",status=\"400\"} 5"));
    assert_non_null(strstr(r.body, "tandem_router_errors_total{code=\"unsupported_input\""));
    assert_non_null(strstr(r.body, "tandem_router_ttft_seconds_bucket"));
    assert_non_null(strstr(r.body, "tandem_router_kv_occupancy{role=\"decode\"}"));
    assert_non_null(strstr(r.body, "tandem_router_prefill_backlog_seconds{role=\"prefill\"}"));
    free(r.body);
    fake_kill(&dec);
    fake_fini(&dec);
}

static void check_both_forms(const fixture_t *fx, const char *path, const char *body_fmt,
                             const char *want_text, const char *want_finish)
{
    char body[1024];
    http_resp_t r;
    result_t whole;
    result_t streamed;

    snprintf(body, sizeof(body), body_fmt, "false");
    post(fx, path, body, NULL, &r);
    assert_int_equal(r.status, 200);
    parse_whole(r.body, &whole);
    free(r.body);
    snprintf(body, sizeof(body), body_fmt, "true");
    post(fx, path, body, NULL, &r);
    assert_int_equal(r.status, 200);
    parse_sse(r.body, &streamed);
    free(r.body);
    assert_true(streamed.saw_done);
    assert_false(streamed.error);
    assert_string_equal(whole.text, want_text);
    assert_string_equal(streamed.text, want_text);
    assert_string_equal(whole.finish, want_finish);
    assert_string_equal(streamed.finish, want_finish);
}

static void test_chat_and_completions_streamed_equal_whole(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec;
    http_resp_t r;
    result_t res;

    start_worker(fx, &dec, "decode-forms", TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script(&dec, "Hello, world!", 1, 3);
    check_both_forms(fx, "/v1/chat/completions",
                     "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"be "
                     "brief\"},{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":%s}",
                     "Hello, world!", "stop");
    check_both_forms(fx, "/v1/completions",
                     "{\"model\":\"tiny\",\"prompt\":\"Say hello\",\"max_tokens\":50,"
                     "\"stream\":%s}",
                     "Hello, world!", "stop");
    check_both_forms(fx, "/v1/completions",
                     "{\"model\":\"tiny\",\"prompt\":[10,11,12],\"max_tokens\":5,\"stream\":%s}",
                     "Hello", "length");
    /* Usage: whole responses always, streams when asked. */
    post(fx, "/v1/chat/completions",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", NULL, &r);
    parse_whole(r.body, &res);
    assert_int_equal(res.completion_tokens, 14); /* 13 bytes + EOS */
    assert_non_null(strstr(r.body, "\"object\":\"chat.completion\""));
    assert_non_null(strstr(r.body, "\"prompt_tokens\":"));
    assert_true(strlen(r.session) > 0);
    free(r.body);
    post(fx, "/v1/chat/completions",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
         "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
         NULL, &r);
    parse_sse(r.body, &res);
    assert_int_equal(res.completion_tokens, 14);
    assert_non_null(strstr(r.body, "\"role\":\"assistant\""));
    assert_non_null(strstr(r.body, "chat.completion.chunk"));
    free(r.body);
    http_do(fx->port, "GET", "/v1/models", NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"id\":\"tiny\""));
    {
        char want[64];
        snprintf(want, sizeof(want), "\"vocab_size\":%u",
                 router_model_info(router_model(fx->router))->n_vocab);
        assert_non_null(strstr(r.body, want));
    }
    free(r.body);
    fake_kill(&dec);
    fake_fini(&dec);
}

static void test_stop_strings_cut_across_chunks_and_tokens(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec;
    static const size_t chunk_sizes[] = {1, 2, 3, 5, 64};

    start_worker(fx, &dec, "decode-stop", TANDEM__ROLE__ROLE_DECODE, "rack0");
    for (size_t i = 0; i < sizeof(chunk_sizes) / sizeof(chunk_sizes[0]); i++) {
        set_script(&dec, "xx ST yy STOP zz", 1, chunk_sizes[i]);
        check_both_forms(fx, "/v1/completions",
                         "{\"model\":\"tiny\",\"prompt\":\"go\",\"stop\":[\"STOP\",\"never\"],"
                         "\"max_tokens\":100,\"stream\":%s}",
                         "xx ST yy ", "stop");
        /* A stop string that is a prefix match at the very end is released when the stream
         * ends for another reason. */
        check_both_forms(fx, "/v1/completions",
                         "{\"model\":\"tiny\",\"prompt\":\"go\",\"stop\":\"STOPPED\","
                         "\"max_tokens\":100,\"stream\":%s}",
                         "xx ST yy STOP zz", "stop");
        check_both_forms(fx, "/v1/completions",
                         "{\"model\":\"tiny\",\"prompt\":\"go\",\"stop\":\"y S\","
                         "\"max_tokens\":100,\"stream\":%s}",
                         "xx ST y", "stop");
    }
    fake_kill(&dec);
    fake_fini(&dec);
}

static void test_utf8_split_across_tokens_streams_whole_characters(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec;

    start_worker(fx, &dec, "decode-utf8", TANDEM__ROLE__ROLE_DECODE, "rack0");
    /* "café ok": é is C3 A9, two byte tokens; the emoji is four. */
    set_script(&dec, "caf\xC3\xA9 ok \xF0\x9F\x98\x80!", 1, 1);
    check_both_forms(fx, "/v1/completions",
                     "{\"model\":\"tiny\",\"prompt\":\"go\",\"max_tokens\":100,\"stream\":%s}",
                     "caf\xC3\xA9 ok \xF0\x9F\x98\x80!", "stop");
    /* Cut inside é by max_tokens: the dangling lead byte becomes U+FFFD, never raw. */
    check_both_forms(fx, "/v1/completions",
                     "{\"model\":\"tiny\",\"prompt\":\"go\",\"max_tokens\":4,\"stream\":%s}",
                     "caf\xEF\xBF\xBD", "length");
    /* A stop string made of the second half of a character never matches a partial one. */
    check_both_forms(fx, "/v1/completions",
                     "{\"model\":\"tiny\",\"prompt\":\"go\",\"max_tokens\":100,\"stop\":\"\xC3\xA9 "
                     "o\",\"stream\":%s}",
                     "caf", "stop");
    fake_kill(&dec);
    fake_fini(&dec);
}

static void test_registration_mismatch_is_refused_with_reason(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t bad_fp;
    fake_worker_t bad_ctx;
    fake_worker_t bad_page;
    http_resp_t r;

    fake_init(&bad_fp, "decode-wrong-model", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat,
              fx->endpoint);
    bad_fp.fingerprint ^= 1;
    fake_start(&bad_fp);
    assert_int_equal(fake_wait_registered(&bad_fp, 5000), -1);
    assert_non_null(strstr(bad_fp.refuse_reason, "model fingerprint mismatch"));

    fake_init(&bad_ctx, "decode-short-ctx", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat,
              fx->endpoint);
    bad_ctx.max_context = fx->compat->max_context / 2;
    fake_start(&bad_ctx);
    assert_int_equal(fake_wait_registered(&bad_ctx, 5000), -1);
    assert_non_null(strstr(bad_ctx.refuse_reason, "max context mismatch"));

    fake_init(&bad_page, "prefill-bad-page", TANDEM__ROLE__ROLE_PREFILL, "rack0", fx->compat,
              fx->endpoint);
    bad_page.page_bytes += 16;
    fake_start(&bad_page);
    assert_int_equal(fake_wait_registered(&bad_page, 5000), -1);
    assert_non_null(strstr(bad_page.refuse_reason, "page format mismatch"));

    http_do(fx->port, "GET", "/health", NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "\"prefill\":0,\"decode\":0"));
    free(r.body);
    http_do(fx->port, "GET", "/metrics", NULL, NULL, NULL, &r);
    assert_non_null(strstr(r.body, "tandem_router_registrations_refused_total 3"));
    free(r.body);
    fake_kill(&bad_fp);
    fake_kill(&bad_ctx);
    fake_kill(&bad_page);
    fake_fini(&bad_fp);
    fake_fini(&bad_ctx);
    fake_fini(&bad_page);
}

static fake_worker_t *holder_of(fake_worker_t *a, fake_worker_t *b, uint64_t request_count_a,
                                uint64_t request_count_b)
{
    if ((uint64_t)fake_n_records(a, TANDEM__ENVELOPE__BODY_DECODE_REQUEST) > request_count_a) {
        return a;
    }
    if ((uint64_t)fake_n_records(b, TANDEM__ENVELOPE__BODY_DECODE_REQUEST) > request_count_b) {
        return b;
    }
    return NULL;
}

static void test_sessions_stick_and_move_when_their_worker_dies(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t a;
    fake_worker_t b;
    fake_worker_t *first;
    fake_worker_t *other;
    fake_record_t rec;
    http_resp_t r;
    int na;
    int nb;
    uint64_t t_kill_ns;

    start_worker(fx, &a, "decode-a", TANDEM__ROLE__ROLE_DECODE, "rack0");
    start_worker(fx, &b, "decode-b", TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script(&a, "one", 1, 1);
    set_script(&b, "one", 1, 1);

    post(fx, "/v1/completions", "{\"model\":\"tiny\",\"prompt\":[10,11,12,13],\"max_tokens\":8}",
         "agent-7", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.session, "agent-7");
    free(r.body);
    first = holder_of(&a, &b, 0, 0);
    assert_non_null(first);
    other = first == &a ? &b : &a;
    assert_true(fake_last(first, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.cached_len, 0);
    assert_int_equal(rec.n_delta, 4);
    assert_string_equal(rec.session_id, "agent-7");

    /* Turn 2: prompt = turn 1 + its output + new tokens: same worker, only the delta. */
    na = fake_n_records(first, TANDEM__ENVELOPE__BODY_DECODE_REQUEST);
    nb = fake_n_records(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST);
    post(fx, "/v1/completions",
         "{\"model\":\"tiny\",\"prompt\":[10,11,12,13,114,113,104,1,20,21],\"max_tokens\":8}",
         "agent-7", &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(first, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), na + 1);
    assert_int_equal(fake_n_records(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), nb);
    assert_true(fake_last(first, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.cached_len, 7); /* 4 prompt + 3 generated whose KV exist */
    assert_int_equal(rec.n_delta, 3);

    /* Kill the session's worker: /health reports the loss within 3 s. */
    t_kill_ns = tdm_clock_now_ns();
    fake_kill(first);
    assert_true(wait_decode_workers(fx, 1, HEALTH_DEADLINE_MS));
    assert_true(tdm_clock_now_ns() - t_kill_ns < HEALTH_DEADLINE_MS * TDM_NS_PER_MS);

    /* Turn 3 is rebuilt on the surviving worker from the router's history. */
    nb = fake_n_records(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST);
    post(fx, "/v1/completions",
         "{\"model\":\"tiny\",\"prompt\":[10,11,12,13,114,113,104,1,20,21,114,113,104,1,30],"
         "\"max_tokens\":8}",
         "agent-7", &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), nb + 1);
    assert_true(fake_last(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.cached_len, 0);
    assert_int_equal(rec.n_delta, 15);
    assert_string_equal(rec.session_id, "agent-7");
    http_do(fx->port, "GET", "/metrics", NULL, NULL, NULL, &r);
    assert_non_null(strstr(r.body, "tandem_router_workers_lost_total 1"));
    free(r.body);
    fake_kill(other);
    fake_fini(&a);
    fake_fini(&b);
}

/* Issue 16 item 9: a decode worker that answers ERROR_DRAINING (before its heartbeats say so)
 * gets the turn taken back: the router marks it draining, rebuilds the session on the other
 * worker from its history (cached_len 0) and places nothing new on it. */
static void test_draining_worker_hands_its_turns_elsewhere(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t a;
    fake_worker_t b;
    fake_worker_t *first;
    fake_worker_t *other;
    fake_record_t rec;
    http_resp_t r;
    int n_first;
    int n_other;

    start_worker(fx, &a, "decode-a", TANDEM__ROLE__ROLE_DECODE, "rack0");
    start_worker(fx, &b, "decode-b", TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script(&a, "one", 1, 1);
    set_script(&b, "one", 1, 1);
    post(fx, "/v1/completions", "{\"model\":\"tiny\",\"prompt\":[10,11,12,13],\"max_tokens\":8}",
         "agent-d", &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    first = holder_of(&a, &b, 0, 0);
    assert_non_null(first);
    other = first == &a ? &b : &a;

    atomic_store(&first->draining, 1);
    n_first = fake_n_records(first, TANDEM__ENVELOPE__BODY_DECODE_REQUEST);
    n_other = fake_n_records(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST);
    post(fx, "/v1/completions",
         "{\"model\":\"tiny\",\"prompt\":[10,11,12,13,114,113,104,1,20,21],\"max_tokens\":8}",
         "agent-d", &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(first, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), n_first + 1);
    assert_int_equal(fake_n_records(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), n_other + 1);
    assert_true(fake_last(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.cached_len, 0);
    assert_int_equal(rec.n_delta, 10);
    assert_string_equal(rec.session_id, "agent-d");

    /* new sessions skip the draining worker */
    for (int i = 0; i < 3; i++) {
        char sid[32];

        snprintf(sid, sizeof(sid), "agent-new-%d", i);
        post(fx, "/v1/completions", "{\"model\":\"tiny\",\"prompt\":[40,41,42],\"max_tokens\":8}",
             sid, &r);
        assert_int_equal(r.status, 200);
        free(r.body);
    }
    assert_int_equal(fake_n_records(first, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), n_first + 1);
    assert_int_equal(fake_n_records(other, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), n_other + 4);
    fake_kill(first);
    fake_kill(other);
    fake_fini(&a);
    fake_fini(&b);
}

static char *ids_body(const int32_t *ids, size_t n, int max_tokens)
{
    char *body = malloc(n * 8 + 128);
    size_t used =
        (size_t)sprintf(body, "{\"model\":\"tiny\",\"max_tokens\":%d,\"prompt\":[", max_tokens);

    for (size_t i = 0; i < n; i++) {
        used += (size_t)sprintf(body + used, "%s%d", i > 0 ? "," : "", ids[i]);
    }
    sprintf(body + used, "]}");
    return body;
}

static void test_prefix_match_finds_the_session_without_an_id(void **state)
{
    fixture_t *fx = *state;
    uint32_t block = fx->compat->tokens_per_block;
    fake_worker_t dec;
    fake_record_t rec;
    int32_t prompt[1024];
    size_t n1 = 2 * block + 44;
    char session1[160];
    http_resp_t r;
    char *body;

    start_worker(fx, &dec, "decode-prefix", TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script(&dec, "abcde", 0, 2);
    for (size_t i = 0; i < sizeof(prompt) / sizeof(prompt[0]); i++) {
        prompt[i] = (int32_t)(100 + (i * 37) % 800);
    }
    body = ids_body(prompt, n1, 5);
    post(fx, "/v1/completions", body, NULL, &r);
    free(body);
    assert_int_equal(r.status, 200);
    snprintf(session1, sizeof(session1), "%s", r.session);
    free(r.body);

    /* Next turn without the session id: the previous prompt, its 5 generated tokens, and new
     * ones. It is never attached to session1 (that would continue another conversation's state;
     * issue 16): a new session on the same worker that may share session1's whole blocks. */
    for (size_t i = 0; i < 5; i++) {
        prompt[n1 + i] = BYTE_ID("abcde"[i]);
    }
    body = ids_body(prompt, n1 + 5 + 20, 5);
    post(fx, "/v1/completions", body, NULL, &r);
    free(body);
    assert_int_equal(r.status, 200);
    assert_string_not_equal(r.session, session1);
    free(r.body);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.cached_len, ((n1 + 4) / block) * block);
    assert_int_equal(rec.n_delta, n1 + 25 - rec.cached_len);

    /* Another agent sharing only the first block: a new session on the worker that holds
     * the prefix, starting from the shared block. */
    prompt[block + 3] = 999;
    body = ids_body(prompt, block + 50, 5);
    post(fx, "/v1/completions", body, NULL, &r);
    free(body);
    assert_int_equal(r.status, 200);
    assert_string_not_equal(r.session, session1);
    free(r.body);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.cached_len, block);
    assert_int_equal(rec.n_delta, 50);
    assert_true(router_metrics_get(router_metrics(fx->router), ROUTER_METRIC_PREFIX_HITS) >= 2);
    fake_kill(&dec);
    fake_fini(&dec);
}

static void test_large_delta_is_prefilled_remotely_small_locally(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec;
    fake_worker_t pre;
    fake_record_t rec;
    int32_t prompt[200];
    http_resp_t r;
    result_t res;
    char *body;

    start_worker(fx, &dec, "decode-disagg", TANDEM__ROLE__ROLE_DECODE, "rack0");
    start_worker(fx, &pre, "prefill-disagg", TANDEM__ROLE__ROLE_PREFILL, "rack0");
    set_script(&dec, "Hi!", 1, 1);
    set_script(&pre, "Hi!", 1, 1);
    for (size_t i = 0; i < 200; i++) {
        prompt[i] = (int32_t)(50 + i);
    }
    body = ids_body(prompt, 200, 10);
    post(fx, "/v1/completions", body, "big-1", &r);
    free(body);
    assert_int_equal(r.status, 200);
    parse_whole(r.body, &res);
    assert_string_equal(res.text, "Hi!");
    free(r.body);
    assert_int_equal(fake_n_records(&dec, TANDEM__ENVELOPE__BODY_RESERVE_PAGES), 1);
    assert_true(fake_last(&pre, TANDEM__ENVELOPE__BODY_PREFILL_JOB, &rec));
    assert_int_equal(rec.n_delta, 200);
    assert_int_equal(rec.cached_len, 0);
    assert_true(rec.canonical_start);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.mode, TANDEM__PREFILL_MODE__PREFILL_REMOTE);

    /* A small delta on the same session stays on the decode node. */
    {
        int32_t next[210];
        memcpy(next, prompt, sizeof(prompt));
        next[200] = BYTE_ID('H');
        next[201] = BYTE_ID('i');
        next[202] = BYTE_ID('!');
        next[203] = EOS_ID;
        for (size_t i = 204; i < 210; i++) {
            next[i] = 7;
        }
        body = ids_body(next, 210, 10);
    }
    post(fx, "/v1/completions", body, "big-1", &r);
    free(body);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.mode, TANDEM__PREFILL_MODE__PREFILL_LOCAL);
    assert_int_equal(rec.cached_len, 203); /* 200 prefilled + 3 of the 4 generated */
    assert_int_equal(rec.n_delta, 7);
    assert_false(rec.canonical_start);
    assert_int_equal(fake_n_records(&pre, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
    http_do(fx->port, "GET", "/metrics", NULL, NULL, NULL, &r);
    assert_non_null(strstr(r.body, "tandem_router_prefill_tokens_total{mode=\"remote\"} 200"));
    assert_non_null(strstr(r.body, "tandem_router_prefill_tokens_total{mode=\"local\"} 7"));
    free(r.body);
    fake_kill(&dec);
    fake_kill(&pre);
    fake_fini(&dec);
    fake_fini(&pre);
}

/* Rack-aware placement through the router (issue 18): a decode worker whose rack has no prefill
 * worker gets its prefill from the other rack, counted in tandem_router_prefill_cross_rack_total;
 * once its own rack has one, the next session's job stays there and the counter holds. */
static void test_prefill_from_another_rack_is_counted_cross_rack(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec, far, near;
    int32_t prompt[200];
    http_resp_t r;
    char *body;

    start_worker(fx, &dec, "decode-rack-a", TANDEM__ROLE__ROLE_DECODE, "rack-a");
    start_worker(fx, &far, "prefill-rack-b", TANDEM__ROLE__ROLE_PREFILL, "rack-b");
    set_script(&dec, "Hi!", 1, 1);
    for (size_t i = 0; i < 200; i++) {
        prompt[i] = (int32_t)(60 + i);
    }
    body = ids_body(prompt, 200, 10);
    post(fx, "/v1/completions", body, "rack-1", &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(&far, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
    assert_int_equal(
        router_metrics_get(router_metrics(fx->router), ROUTER_METRIC_PREFILL_CROSS_RACK), 1);
    http_do(fx->port, "GET", "/metrics", NULL, NULL, NULL, &r);
    assert_non_null(strstr(r.body, "tandem_router_prefill_cross_rack_total 1"));
    assert_non_null(strstr(r.body, "tandem_router_worker_inflight{worker=\"decode-rack-a\","
                                   "role=\"decode\",rack=\"rack-a\"}"));
    free(r.body);

    start_worker(fx, &near, "prefill-rack-a", TANDEM__ROLE__ROLE_PREFILL, "rack-a");
    post(fx, "/v1/completions", body, "rack-2", &r);
    free(body);
    assert_int_equal(r.status, 200);
    free(r.body);
    assert_int_equal(fake_n_records(&near, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
    assert_int_equal(fake_n_records(&far, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
    assert_int_equal(
        router_metrics_get(router_metrics(fx->router), ROUTER_METRIC_PREFILL_CROSS_RACK), 1);
    fake_kill(&dec);
    fake_kill(&far);
    fake_kill(&near);
    fake_fini(&dec);
    fake_fini(&far);
    fake_fini(&near);
}

typedef struct {
    const fixture_t *fx;
    char *body;
    http_resp_t resp;
} async_post_t;

static void *async_post(void *arg)
{
    async_post_t *p = arg;

    post(p->fx, "/v1/completions", p->body, "rerun-1", &p->resp);
    return NULL;
}

static void test_prefill_worker_lost_mid_job_reruns_elsewhere(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec;
    fake_worker_t stuck;
    fake_worker_t good;
    async_post_t req;
    pthread_t thread;
    int32_t prompt[150];
    uint64_t end;
    result_t res;

    start_worker(fx, &dec, "decode-rerun", TANDEM__ROLE__ROLE_DECODE, "rack0");
    start_worker(fx, &stuck, "prefill-stuck", TANDEM__ROLE__ROLE_PREFILL, "rack0");
    stuck.hang_jobs = 1;
    set_script(&dec, "done", 1, 1);
    for (size_t i = 0; i < 150; i++) {
        prompt[i] = (int32_t)(300 + i);
    }
    memset(&req, 0, sizeof(req));
    req.fx = fx;
    req.body = ids_body(prompt, 150, 10);
    pthread_create(&thread, NULL, async_post, &req);
    /* Wait for the stuck worker to accept the job, then bring a good one and kill it. */
    end = tdm_clock_now_ns() + 5000000000ull;
    while (fake_n_records(&stuck, TANDEM__ENVELOPE__BODY_PREFILL_JOB) == 0 &&
           tdm_clock_now_ns() < end) {
        zmq_poll(NULL, 0, 2);
    }
    assert_int_equal(fake_n_records(&stuck, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
    start_worker(fx, &good, "prefill-good", TANDEM__ROLE__ROLE_PREFILL, "rack0");
    fake_kill(&stuck);
    pthread_join(thread, NULL);
    assert_int_equal(req.resp.status, 200);
    parse_whole(req.resp.body, &res);
    assert_string_equal(res.text, "done");
    free(req.resp.body);
    free(req.body);
    assert_int_equal(fake_n_records(&good, TANDEM__ENVELOPE__BODY_PREFILL_JOB), 1);
    assert_int_equal(fake_n_records(&dec, TANDEM__ENVELOPE__BODY_RESERVE_PAGES), 2);
    {
        /* every try has its number: the retry is attempt 2, so no abort of attempt 1 stops it */
        fake_record_t first, second;
        assert_true(fake_last(&stuck, TANDEM__ENVELOPE__BODY_PREFILL_JOB, &first));
        assert_true(fake_last(&good, TANDEM__ENVELOPE__BODY_PREFILL_JOB, &second));
        assert_int_equal(first.attempt, 1);
        assert_int_equal(second.attempt, 2);
        assert_true(second.reservation_id != first.reservation_id);
    }
    pthread_mutex_lock(&dec.lock);
    assert_true(dec.n_aborts >= 1); /* the first reservation was released */
    pthread_mutex_unlock(&dec.lock);
    fake_kill(&dec);
    fake_kill(&good);
    fake_fini(&dec);
    fake_fini(&stuck);
    fake_fini(&good);
}

static size_t hang_up_after_first_data(char *data, size_t size, size_t n, void *arg)
{
    int *n_calls = arg;

    (void)data;
    (*n_calls)++;
    return *n_calls >= 2 ? 0 : size * n; /* the role chunk, then the first text: hang up */
}

/* After a client left: within 5 s the worker got exactly one Abort, /health shows nothing in
 * flight, and the router counted one client abort. */
static void assert_client_abort_reached_the_worker(fixture_t *fx, fake_worker_t *dec)
{
    uint64_t end = tdm_clock_now_ns() + 5000000000ull;
    http_resp_t r;

    while (fake_n_aborts(dec) == 0 && tdm_clock_now_ns() < end) {
        zmq_poll(NULL, 0, 5);
    }
    assert_int_equal(fake_n_aborts(dec), 1);
    end = tdm_clock_now_ns() + 5000000000ull;
    do {
        http_do(fx->port, "GET", "/health", NULL, NULL, NULL, &r);
        if (strstr(r.body, "\"inflight\":0") != NULL) {
            break;
        }
        free(r.body);
        r.body = NULL;
        zmq_poll(NULL, 0, 5);
    } while (tdm_clock_now_ns() < end);
    assert_non_null(r.body);
    assert_non_null(strstr(r.body, "\"inflight\":0"));
    free(r.body);
    assert_int_equal(router_metrics_get(router_metrics(fx->router), ROUTER_METRIC_CLIENT_ABORTS),
                     1);
}

/*
 * A client that leaves a chat completion (body) on a decode worker scripted with `script` that
 * holds after 3 tokens: a streamed one hangs up after the first text (curl: CURLE_WRITE_ERROR),
 * a non-streamed one gives up after 500 ms (CURLE_OPERATION_TIMEDOUT). Then the abort reaches
 * the worker (assert_client_abort_reached_the_worker).
 */
static void client_leaves(fixture_t *fx, const char *name, const char *script, const char *body,
                          int streamed)
{
    fake_worker_t dec;
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    char url[128];
    int n_calls = 0;

    start_worker(fx, &dec, name, TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script(&dec, script, 1, 1);
    dec.hold_after = 3;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/chat/completions", fx->port);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (streamed) {
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, hang_up_after_first_data);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &n_calls);
        assert_int_equal(curl_easy_perform(curl), CURLE_WRITE_ERROR);
    } else {
        /* The worker holds after a few tokens, so the body never completes. */
        curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 500L);
        assert_int_equal(curl_easy_perform(curl), CURLE_OPERATION_TIMEDOUT);
    }
    curl_easy_cleanup(curl);
    curl_slist_free_all(headers);
    assert_client_abort_reached_the_worker(fx, &dec);
    fake_kill(&dec);
    fake_fini(&dec);
}

static void test_client_leaving_mid_stream_aborts_the_worker(void **state)
{
    /* The router notices at its next write (keep-alive) and aborts the turn on the worker. */
    client_leaves(*state, "decode-leave", "a long answer nobody reads",
                  "{\"model\":\"tiny\",\"stream\":true,\"messages\":[{\"role\":\"user\","
                  "\"content\":\"talk\"}]}",
                  1);
}

static void test_client_leaving_a_non_streamed_request_aborts_the_worker(void **state)
{
    /* Well before the router's own 10 s token timeout, the router notices and aborts the turn. */
    client_leaves(*state, "decode-leave-body", "a long answer nobody waits for",
                  "{\"model\":\"tiny\",\"stream\":false,"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"talk\"}]}",
                  0);
}

/* The "param" of an OpenAI-shaped error body, copied into out ("" when absent). */
static void error_param(const char *body, char *out, size_t out_bytes)
{
    json_error_t jerr;
    json_t *root = json_loads(body, 0, &jerr);
    json_t *param = json_object_get(json_object_get(root, "error"), "param");

    snprintf(out, out_bytes, "%s", json_is_string(param) ? json_string_value(param) : "");
    json_decref(root);
}

static void test_spec_field_selects_the_drafter_and_bad_values_are_refused(void **state)
{
    fixture_t *fx = *state;
    static const struct {
        const char *path;
        const char *body;
        const char *want_spec; /* DecodeRequest.spec the worker must see */
    } good[] = {
        {"/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"a\",\"stream\":%s}", ""},
        {"/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"b\",\"stream\":%s,\"spec\":null}",
         ""},
        {"/v1/completions",
         "{\"model\":\"tiny\",\"prompt\":\"c\",\"stream\":%s,\"spec\":\"ngram\"}", "ngram"},
        {"/v1/chat/completions",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"d\"}],"
         "\"stream\":%s,\"spec\":\"dspark\"}",
         "dspark"},
        {"/v1/chat/completions",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"e\"}],"
         "\"stream\":%s,\"spec\":\"off\"}",
         "off"},
    };
    static const struct {
        const char *body;
        const char *code;
    } bad[] = {
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"spec\":\"medusa\"}", "invalid_value"},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"spec\":\"NGRAM\"}", "invalid_value"},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"spec\":\"\"}", "invalid_value"},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"spec\":true}", "invalid_type"},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"spec\":{\"drafter\":\"ngram\"}}", "invalid_type"},
    };
    fake_worker_t dec;
    fake_record_t rec;
    http_resp_t r;
    char body[512];
    char param[32];
    int n_before;
    int n_reserve_before;

    start_worker(fx, &dec, "decode-spec", TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script(&dec, "ok", 1, 1);
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        for (int streamed = 0; streamed <= 1; streamed++) {
            result_t res;
            snprintf(body, sizeof(body), good[i].body, streamed ? "true" : "false");
            n_before = fake_n_records(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST);
            post(fx, good[i].path, body, NULL, &r);
            assert_int_equal(r.status, 200);
            if (streamed) {
                parse_sse(r.body, &res);
                assert_true(res.saw_done);
            } else {
                parse_whole(r.body, &res);
            }
            assert_string_equal(res.text, "ok");
            free(r.body);
            assert_int_equal(fake_n_records(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST),
                             n_before + 1);
            assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
            assert_string_equal(rec.spec, good[i].want_spec);
        }
    }
    /* A bad value is an OpenAI-shaped 400 naming the parameter; nothing reaches a worker. */
    n_before = fake_n_records(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST);
    n_reserve_before = fake_n_records(&dec, TANDEM__ENVELOPE__BODY_RESERVE_PAGES);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        post(fx, "/v1/completions", bad[i].body, NULL, &r);
        assert_error(&r, 400, bad[i].code);
        error_param(r.body, param, sizeof(param));
        assert_string_equal(param, "spec");
        free(r.body);
    }
    post(fx, "/v1/chat/completions",
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"spec\":\"eagle\"}",
         NULL, &r);
    assert_error(&r, 400, "invalid_value");
    assert_non_null(strstr(r.body, "eagle"));
    free(r.body);
    assert_int_equal(fake_n_records(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), n_before);
    assert_int_equal(fake_n_records(&dec, TANDEM__ENVELOPE__BODY_RESERVE_PAGES), n_reserve_before);
    fake_kill(&dec);
    fake_fini(&dec);
}

static void test_no_decode_worker_is_a_503_not_a_hang(void **state)
{
    fixture_t *fx = *state;
    http_resp_t r;

    post(fx, "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\"}", NULL, &r);
    assert_error(&r, 503, "no_decode_workers");
    free(r.body);
    post(fx, "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"stream\":true}", NULL, &r);
    assert_error(&r, 503, "no_decode_workers");
    free(r.body);
}

static void test_executable_prints_help_and_rejects_bad_flags(void **state)
{
    char command[PATH_BYTES];
    const char *bin = getenv("TANDEM_BIN_DIR");

    (void)state;
    snprintf(command, sizeof(command),
             "%s/tandem-router --help | grep -q -- --local-prefill-tokens", bin);
    assert_int_equal(rtu_run_shell(command), 0);
    snprintf(command, sizeof(command),
             "%s/tandem-router --model /nonexistent --http nonsense 2>/dev/null", bin);
    assert_int_equal(rtu_run_shell(command), 2);
    snprintf(command, sizeof(command),
             "TANDEM_LOCAL_PREFILL_TOKENS=0 %s/tandem-router --model /x 2>/dev/null", bin);
    assert_int_equal(rtu_run_shell(command), 2);
    snprintf(command, sizeof(command),
             "%s/tandem-router --model /nonexistent --http 127.0.0.1:0 --control "
             "tcp://127.0.0.1:* --log-level error 2>/dev/null",
             bin);
    assert_int_equal(rtu_run_shell(command), 1);
}

/* "spec": "dspark" for a checkpoint without DSpark blocks (num_nextn_predict_layers 0) is a 400
 * naming the field, before any worker; "ngram" is still accepted for it. */
/* Issue 16: temperature 1e-310 passed validation and went on the wire as a divisor that overflows
 * logit / tau (every token BOS). Tiny temperatures are accepted and become 0 (greedy), the rule
 * of the engine's ENGINE_SAMPLER_GREEDY_BELOW; the line itself and the OpenAI range still hold. */
static void test_tiny_temperature_is_accepted_as_greedy(void **state)
{
    fixture_t *fx = *state;
    const router_model_t *model = router_model(fx->router);
    static const struct {
        const char *body;
        double temperature;
    } cases[] = {
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":1e-310}", 0.0},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":5e-324}", 0.0},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":1e-6}", 0.0},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":0}", 0.0},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":1e-5}", 1e-5},
        {"{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":0.7}", 0.7},
    };
    static const char too_hot[] = "{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":2.01}";
    router_gen_request_t req;
    router_apierr_t apierr;

    assert_true(ROUTER_GREEDY_BELOW_TEMPERATURE == 1e-5); /* == ENGINE_SAMPLER_GREEDY_BELOW */
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memset(&req, 0, sizeof(req));
        assert_int_equal(router_validate_request(model, ROUTER_API_COMPLETIONS, "application/json",
                                                 cases[i].body, strlen(cases[i].body), 1, &req,
                                                 &apierr),
                         TDM_OK);
        assert_true(req.temperature == cases[i].temperature);
        router_gen_request_fini(&req);
    }
    assert_int_equal(router_validate_request(model, ROUTER_API_COMPLETIONS, "application/json",
                                             too_hot, strlen(too_hot), 1, &req, &apierr),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(apierr.http_status, 400);
    assert_string_equal(apierr.param, "temperature");
}

static void test_dspark_refused_for_a_model_without_dspark_blocks(void **state)
{
    fixture_t *fx = *state;
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char dir[PATH_BYTES], command[PATH_BYTES * 8], err[ERR_BYTES] = "";
    static const char body_dspark[] =
        "{\"model\":\"nodspark\",\"prompt\":\"x\",\"spec\":\"dspark\"}";
    static const char body_ngram[] = "{\"model\":\"nodspark\",\"prompt\":\"x\",\"spec\":\"ngram\"}";
    router_model_params_t mp = {0};
    router_model_t *model = NULL;
    router_gen_request_t req;
    router_apierr_t apierr;
    json_t *config, *text;
    json_int_t n_layers;

    assert_non_null(tmp);
    snprintf(dir, sizeof(dir), "%s/router-model-nodspark", tmp);
    snprintf(command, sizeof(command), "rm -rf %s && mkdir -p %s && cp %s/tokenizer.json %s/", dir,
             dir, fx->model_dir, dir);
    assert_int_equal(rtu_run_shell(command), 0);
    /* The tiny config without its DSpark blocks: n_d = 0 and one compress ratio per layer. */
    snprintf(command, sizeof(command), "%s/config.json", fx->model_dir);
    config = json_load_file(command, 0, NULL);
    assert_non_null(config);
    text = json_object_get(config, "text_config");
    assert_non_null(text);
    n_layers = json_integer_value(json_object_get(text, "num_hidden_layers"));
    assert_true(n_layers > 0);
    assert_int_equal(json_object_set_new(text, "num_nextn_predict_layers", json_integer(0)), 0);
    assert_int_equal(json_array_size(json_object_get(text, "compress_ratios")) > (size_t)n_layers,
                     1);
    while (json_array_size(json_object_get(text, "compress_ratios")) > (size_t)n_layers) {
        json_array_remove(json_object_get(text, "compress_ratios"),
                          json_array_size(json_object_get(text, "compress_ratios")) - 1);
    }
    snprintf(command, sizeof(command), "%s/config.json", dir);
    assert_int_equal(json_dump_file(config, command, JSON_INDENT(2)), 0);
    json_decref(config);
    mp.model_dir = dir;
    mp.served_name = "nodspark";
    if (router_model_load(&mp, &model, err, sizeof(err)) != TDM_OK) {
        fail_msg("router_model_load(%s): %s", dir, err);
    }
    assert_int_equal(router_model_info(model)->n_dspark_blocks, 0);
    assert_int_equal(router_validate_request(model, ROUTER_API_COMPLETIONS, "application/json",
                                             body_dspark, strlen(body_dspark), 1, &req, &apierr),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(apierr.http_status, 400);
    assert_string_equal(apierr.param, "spec");
    assert_non_null(strstr(apierr.message, "no DSpark blocks"));
    assert_int_equal(router_validate_request(model, ROUTER_API_COMPLETIONS, "application/json",
                                             body_ngram, strlen(body_ngram), 1, &req, &apierr),
                     TDM_OK);
    assert_int_equal(req.spec, ROUTER_SPEC_NGRAM);
    router_gen_request_fini(&req);
    router_model_destroy(model);
}

/* ---- agent output over HTTP (PROTOCOL.md 6d) --------------------------------------------- */

#define AG_DSML                                                                                    \
    "\xEF\xBD\x9C"                                                                                 \
    "DSML"                                                                                         \
    "\xEF\xBD\x9C"

/* Script text as token ids: "｜DSML｜" as the vocabulary's special token (when it has one), other
 * bytes as bytes; then EOS. */
static void set_script_dsml(const fixture_t *fx, fake_worker_t *w, const char *text)
{
    const text_tokenizer_t *tok = router_model_tokenizer(router_model(fx->router));
    size_t n_dsml = strlen(AG_DSML);
    int32_t dsml_id;

    if (text_tokenizer_find_special(tok, AG_DSML, &dsml_id) != TDM_OK) {
        dsml_id = -1; /* a model written before the vocabulary had it: bytes */
    }
    w->n_script = 0;
    for (size_t i = 0; text[i] != '\0';) {
        assert_true(w->n_script + 1 < FAKE_MAX_SCRIPT);
        if (dsml_id >= 0 && strncmp(text + i, AG_DSML, n_dsml) == 0) {
            w->script[w->n_script++] = dsml_id;
            i += n_dsml;
        } else {
            w->script[w->n_script++] = BYTE_ID(text[i++]);
        }
    }
    w->script[w->n_script++] = EOS_ID;
    w->chunk_tokens = 3;
}

/* What an agent answer said, whole or folded from its chunks. */
typedef struct {
    char reasoning[512];
    char content[512];
    int content_null;
    int n_calls;
    char id[64];
    char name[64];
    char args[512];
    char finish[32];
} agent_result_t;

static void agent_whole(const char *body, agent_result_t *r)
{
    json_t *root = json_loads(body, 0, NULL);
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    json_t *calls = json_object_get(msg, "tool_calls");
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");

    memset(r, 0, sizeof(*r));
    assert_non_null(root);
    snprintf(r->reasoning, sizeof(r->reasoning), "%s",
             json_string_value(json_object_get(msg, "reasoning_content")));
    r->content_null = json_is_null(json_object_get(msg, "content"));
    if (!r->content_null) {
        snprintf(r->content, sizeof(r->content), "%s",
                 json_string_value(json_object_get(msg, "content")));
    }
    r->n_calls = (int)json_array_size(calls);
    snprintf(r->id, sizeof(r->id), "%s",
             json_string_value(json_object_get(json_array_get(calls, 0), "id")));
    snprintf(r->name, sizeof(r->name), "%s", json_string_value(json_object_get(fn, "name")));
    snprintf(r->args, sizeof(r->args), "%s", json_string_value(json_object_get(fn, "arguments")));
    snprintf(r->finish, sizeof(r->finish), "%s",
             json_string_value(json_object_get(choice, "finish_reason")));
    json_decref(root);
}

static void agent_sse(const char *body, agent_result_t *r)
{
    memset(r, 0, sizeof(*r));
    for (const char *line = strstr(body, "data: {"); line != NULL;
         line = strstr(line + 1, "\ndata: {")) {
        const char *start = line[0] == '\n' ? line + 7 : line + 6;
        json_t *root = json_loadb(start, (size_t)(strstr(start, "\n") - start), 0, NULL);
        json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
        json_t *delta = json_object_get(choice, "delta");
        json_t *tc = json_array_get(json_object_get(delta, "tool_calls"), 0);
        json_t *fn = json_object_get(tc, "function");
        json_t *v;

        assert_non_null(root);
        if ((v = json_object_get(delta, "reasoning_content")) != NULL) {
            strncat(r->reasoning, json_string_value(v),
                    sizeof(r->reasoning) - 1 - strlen(r->reasoning));
        }
        if ((v = json_object_get(delta, "content")) != NULL) {
            strncat(r->content, json_string_value(v), sizeof(r->content) - 1 - strlen(r->content));
        }
        if (json_object_get(tc, "id") != NULL) {
            r->n_calls++;
            snprintf(r->id, sizeof(r->id), "%s", json_string_value(json_object_get(tc, "id")));
            snprintf(r->name, sizeof(r->name), "%s",
                     json_string_value(json_object_get(fn, "name")));
        }
        if ((v = json_object_get(fn, "arguments")) != NULL) {
            strncat(r->args, json_string_value(v), sizeof(r->args) - 1 - strlen(r->args));
        }
        if (json_is_string(v = json_object_get(choice, "finish_reason"))) {
            snprintf(r->finish, sizeof(r->finish), "%s", json_string_value(v));
        }
        json_decref(root);
    }
}

static const char RESPONSES_BODY[] =
    "{\"model\":\"tiny\",\"input\":\"weather in Oslo?\",\"max_output_tokens\":200,"
    "\"reasoning\":{},\"tools\":[{\"type\":\"function\",\"name\":\"w\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"string\"}}}}]}";

/* A /v1/responses body for the same answer as `chat` (the whole chat result): its output items
 * are the reasoning and the one function call with the same name and arguments. */
static void responses_items(const char *body, const agent_result_t *chat)
{
    json_t *root = json_loads(body, 0, NULL);
    json_t *output = json_object_get(root, "output");
    json_t *reasoning = json_array_get(output, 0);
    json_t *call = json_array_get(output, 1);

    assert_non_null(root);
    assert_int_equal(json_array_size(output), 2);
    assert_string_equal(json_string_value(json_object_get(reasoning, "type")), "reasoning");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(reasoning, "content"), 0), "text")),
                        chat->reasoning);
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function_call");
    assert_string_equal(json_string_value(json_object_get(call, "name")), chat->name);
    assert_string_equal(json_string_value(json_object_get(call, "arguments")), chat->args);
    /* a response of its own: a call id of the same form, not the same id */
    assert_memory_equal(json_string_value(json_object_get(call, "call_id")), "call_", 5);
    assert_string_not_equal(json_string_value(json_object_get(call, "call_id")), chat->id);
    json_decref(root);
}

static void test_tool_calls_and_reasoning_whole_and_streamed(void **state)
{
    fixture_t *fx = *state;
    static const char script[] =
        "Hm.</think>\n\n<" AG_DSML "tool_calls>\n<" AG_DSML "invoke name=\"w\">\n<" AG_DSML
        "parameter name=\"c\" string=\"true\">Oslo</" AG_DSML "parameter>\n<" AG_DSML
        "parameter name=\"d\" string=\"false\">2</" AG_DSML "parameter>\n</" AG_DSML
        "invoke>\n</" AG_DSML "tool_calls>";
    static const char fields[] =
        "\"model\":\"tiny\",\"max_tokens\":200,\"thinking\":{\"type\":\"enabled\"},"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"string\"},"
        "\"d\":{\"type\":\"integer\"}}}}}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"weather in Oslo?\"}]";
    char body[1024];
    fake_worker_t dec;
    agent_result_t whole;
    agent_result_t streamed;
    http_resp_t resp;

    start_worker(fx, &dec, "dec-agent", TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script_dsml(fx, &dec, script);
    snprintf(body, sizeof(body), "{%s}", fields);
    post(fx, "/v1/chat/completions", body, NULL, &resp);
    assert_int_equal(resp.status, 200);
    agent_whole(resp.body, &whole);
    free(resp.body);
    assert_string_equal(whole.reasoning, "Hm.");
    assert_true(whole.content_null);
    assert_int_equal(whole.n_calls, 1);
    assert_string_equal(whole.name, "w");
    assert_string_equal(whole.args, "{\"c\": \"Oslo\", \"d\": 2}");
    assert_memory_equal(whole.id, "call_", 5);
    assert_string_equal(whole.finish, "tool_calls");
    snprintf(body, sizeof(body), "{\"stream\":true,%s}", fields);
    post(fx, "/v1/chat/completions", body, NULL, &resp);
    assert_int_equal(resp.status, 200);
    assert_null(strstr(resp.body, "DSML"));
    agent_sse(resp.body, &streamed);
    free(resp.body);
    assert_string_equal(streamed.reasoning, whole.reasoning);
    assert_string_equal(streamed.content, "");
    assert_int_equal(streamed.n_calls, 1);
    assert_string_equal(streamed.name, whole.name);
    assert_string_equal(streamed.args, whole.args);
    assert_string_equal(streamed.finish, "tool_calls");
    /* the Responses API reads the same answer: a reasoning item, then the function call */
    post(fx, "/v1/responses", RESPONSES_BODY, NULL, &resp);
    assert_int_equal(resp.status, 200);
    responses_items(resp.body, &whole);
    free(resp.body);
    /* and streamed: the call's arguments arrive whole in function_call_arguments.done */
    snprintf(body, sizeof(body), "%.*s,\"stream\":true}", (int)strlen(RESPONSES_BODY) - 1,
             RESPONSES_BODY);
    post(fx, "/v1/responses", body, NULL, &resp);
    assert_int_equal(resp.status, 200);
    assert_null(strstr(resp.body, "DSML"));
    assert_non_null(strstr(resp.body, "event: response.function_call_arguments.done"));
    assert_non_null(strstr(resp.body, "\"arguments\":\"{\\\"c\\\": \\\"Oslo\\\", \\\"d\\\": 2}\""));
    assert_non_null(strstr(resp.body, "event: response.completed"));
    free(resp.body);
    fake_kill(&dec);
    fake_fini(&dec);
}

/* Two incarnations of a router (a restart) number their requests apart: workers keep request
 * ids beyond a router's life (a prefill node's aborts, a decode node's turns), so a restarted
 * router that started at 1 again had its jobs taken for the old ones (issue 16, chaos seed 4:
 * prefill jobs "aborted" on arrival, turns ending in 504). */
static void test_a_restarted_router_numbers_its_requests_apart(void **state)
{
    uint64_t first[2];

    (void)state;
    for (int k = 0; k < 2; k++) {
        void *st = NULL;
        fixture_t *fx;
        fake_worker_t dec;
        fake_record_t rec = {0};
        http_resp_t r;

        assert_int_equal(setup(&st), 0);
        fx = st;
        start_worker(fx, &dec, k == 0 ? "decode-life-1" : "decode-life-2",
                     TANDEM__ROLE__ROLE_DECODE, "rack0");
        set_script(&dec, "ok", 1, 1);
        assert_true(wait_decode_workers(fx, 1, 5000));
        post(fx, "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":4}", NULL,
             &r);
        assert_int_equal(r.status, 200);
        free(r.body);
        assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
        first[k] = rec.request_id;
        fake_kill(&dec);
        fake_fini(&dec);
        teardown(&st);
    }
    print_message("first request ids of two router lives: %llu, %llu\n",
                  (unsigned long long)first[0], (unsigned long long)first[1]);
    assert_true(first[0] != 0 && first[1] != 0);
    assert_true(first[0] != first[1]);
}

/* Idle connections that push the router's sockets past descriptor 1023 must not cost anyone an
 * answer: with libmicrohttpd's select() loop every later connection was reset unanswered
 * (issue 16, scripts/chaos --soak: 2,048 idle SSE connections, every live request lost). The
 * test process holds both ends, so 600 idle clients put the router's next socket far past 1023. */
static void test_requests_are_served_beside_many_idle_connections(void **state)
{
    enum { N_IDLE = 600 };
    fixture_t *fx = *state;
    fake_worker_t dec;
    struct rlimit lim;
    struct sockaddr_in addr;
    int socks[N_IDLE];
    int n_open = 0;
    http_resp_t r;

    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_max < 2 * N_IDLE + 256) {
        skip(); /* the hard limit leaves no room for the idle connections */
    }
    if (lim.rlim_cur < 2 * N_IDLE + 256) {
        lim.rlim_cur = 2 * N_IDLE + 256;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    }
    start_worker(fx, &dec, "decode-idle", TANDEM__ROLE__ROLE_DECODE, "rack0");
    set_script(&dec, "ok", 1, 1);
    assert_true(wait_decode_workers(fx, 1, 5000));
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)fx->port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < N_IDLE; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(fd >= 0);
        assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
        socks[n_open++] = fd;
    }
    zmq_poll(NULL, 0, 500); /* the router accepts them */
    post(fx, "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":4}", NULL, &r);
    print_message("a request beside %d idle connections: HTTP %ld\n", n_open, r.status);
    assert_int_equal(r.status, 200);
    free(r.body);
    for (int i = 0; i < n_open; i++) {
        close(socks[i]);
    }
    fake_kill(&dec);
    fake_fini(&dec);
}

/* Poll until `w` recorded n messages of `type` or 5 s passed; returns the count. */
static int await_records(fake_worker_t *w, Tandem__Envelope__BodyCase type, int n)
{
    uint64_t end = tdm_clock_now_ns() + 5000000000ull;

    while (fake_n_records(w, type) < n && tdm_clock_now_ns() < end) {
        zmq_poll(NULL, 0, 5);
    }
    return fake_n_records(w, type);
}

/*
 * A client leaves while its prompt is prefilled remotely: the router aborts the job by its attempt
 * and tells the decode node to keep the reservation (writer_fenced false); only when the prefill
 * node acknowledges (AbortAck) does the router forward writer_fenced, so the pages come back on
 * the writer's word (docs/PROTOCOL.md 4). Old code: no attempt, no fence, pages back on a timer.
 */
static void test_aborted_prefill_job_fences_its_writer_before_the_pages_return(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec, pre;
    fake_record_t job, to_pre, first, second;
    int32_t prompt[150];
    char *body;
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    char url[128];

    start_worker(fx, &dec, "decode-fence", TANDEM__ROLE__ROLE_DECODE, "rack0");
    start_worker(fx, &pre, "prefill-fence", TANDEM__ROLE__ROLE_PREFILL, "rack0");
    pre.hang_jobs = 1;
    pre.ack_aborts = 1;
    for (size_t i = 0; i < 150; i++) {
        prompt[i] = (int32_t)(400 + i);
    }
    body = ids_body(prompt, 150, 10);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/completions", fx->port);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 1000L); /* the job hangs: the client leaves */
    assert_int_equal(curl_easy_perform(curl), CURLE_OPERATION_TIMEDOUT);
    curl_easy_cleanup(curl);
    curl_slist_free_all(headers);
    free(body);
    assert_int_equal(await_records(&pre, TANDEM__ENVELOPE__BODY_PREFILL_JOB, 1), 1);
    assert_int_equal(await_records(&pre, TANDEM__ENVELOPE__BODY_ABORT, 1), 1);
    assert_int_equal(await_records(&dec, TANDEM__ENVELOPE__BODY_ABORT, 2), 2);
    assert_true(fake_last(&pre, TANDEM__ENVELOPE__BODY_PREFILL_JOB, &job));
    assert_true(fake_last(&pre, TANDEM__ENVELOPE__BODY_ABORT, &to_pre));
    assert_int_equal(job.attempt, 1);
    assert_int_equal(to_pre.attempt, 1); /* the abort names the job's attempt */
    assert_int_equal(to_pre.request_id, job.request_id);
    assert_true(fake_nth(&dec, TANDEM__ENVELOPE__BODY_ABORT, 0, &first));
    assert_true(fake_nth(&dec, TANDEM__ENVELOPE__BODY_ABORT, 1, &second));
    assert_int_equal(first.reservation_id, job.reservation_id);
    assert_false(first.writer_fenced); /* the writer has not answered yet: keep the pages */
    assert_int_equal(second.reservation_id, job.reservation_id);
    assert_true(second.writer_fenced); /* its AbortAck, forwarded */
    fake_kill(&dec);
    fake_kill(&pre);
    fake_fini(&dec);
    fake_fini(&pre);
}

/*
 * A decode node answers a ReservePages only after the router's reservation deadline, just before
 * its answer to the retry's ReservePages: the late one names attempt 1 and is released at once
 * (writer_fenced), the prefill job gets the retry's reservation. Old code: the late reservation
 * was taken for the retry's, whose own was then aborted as unwanted.
 */
static void test_late_reservation_is_never_taken_for_the_retry(void **state)
{
    fixture_t *fx = *state;
    fake_worker_t dec, pre;
    fake_record_t job, rel;
    async_post_t req;
    pthread_t thread;
    int32_t prompt[150];
    int found = 0;
    int n_reserve;

    start_worker(fx, &dec, "decode-late", TANDEM__ROLE__ROLE_DECODE, "rack0");
    start_worker(fx, &pre, "prefill-late", TANDEM__ROLE__ROLE_PREFILL, "rack0");
    dec.late_first_reservation = 1;
    set_script(&dec, "done", 1, 1);
    for (size_t i = 0; i < 150; i++) {
        prompt[i] = (int32_t)(500 + i);
    }
    memset(&req, 0, sizeof(req));
    req.fx = fx;
    req.body = ids_body(prompt, 150, 10);
    pthread_create(&thread, NULL, async_post, &req); /* waits out the 5 s reservation deadline */
    pthread_join(thread, NULL);
    assert_int_equal(req.resp.status, 200);
    free(req.resp.body);
    free(req.body);
    /* Normally 2 tries; on a loaded box (the fixture's 600 ms heartbeat timeout) a later try may
     * be needed too: the served job must then be the last try's, never the late reservation. */
    n_reserve = fake_n_records(&dec, TANDEM__ENVELOPE__BODY_RESERVE_PAGES);
    assert_true(n_reserve >= 2);
    assert_true(fake_n_records(&pre, TANDEM__ENVELOPE__BODY_PREFILL_JOB) >= 1);
    assert_true(fake_last(&pre, TANDEM__ENVELOPE__BODY_PREFILL_JOB, &job));
    assert_int_equal(job.reservation_id, n_reserve); /* the last try's own reservation */
    assert_int_equal(job.attempt, n_reserve);
    for (int i = 0; fake_nth(&dec, TANDEM__ENVELOPE__BODY_ABORT, i, &rel); i++) {
        if (rel.reservation_id == 1) {
            assert_true(rel.writer_fenced); /* no writer ever saw it */
            found = 1;
        }
        assert_true(rel.reservation_id != job.reservation_id ||
                    rel.writer_fenced); /* the served reservation is never aborted unfenced */
    }
    assert_true(found);
    fake_kill(&dec);
    fake_kill(&pre);
    fake_fini(&dec);
    fake_fini(&pre);
}

/* A PageReservation from a worker the router does not know (a decode node declared lost while
 * paused, then resumed) is answered with an Abort of that reservation, writer_fenced (nobody
 * ever got it), so its pages come back at once; then ERROR_NOT_REGISTERED. Old code: dropped
 * silently, the pages held until the reservation's timeout (~610 s). */
static void test_late_reservation_from_an_unknown_worker_is_released(void **state)
{
    fixture_t *fx = *state;
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__PageReservation pr = TANDEM__PAGE_RESERVATION__INIT;
    uint64_t end = tdm_clock_now_ns() + 5000000000ull;
    int zero = 0, got_abort = 0, got_error = 0;

    zmq_setsockopt(sock, ZMQ_ROUTING_ID, "ghost-decode", 12);
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    assert_int_equal(zmq_connect(sock, fx->endpoint), 0);
    pr.request_id = 77;
    pr.reservation_id = 99;
    pr.n_pages = 4;
    pr.descriptor.data = (uint8_t *)"late";
    pr.descriptor.len = 4;
    env.body_case = TANDEM__ENVELOPE__BODY_PAGE_RESERVATION;
    env.page_reservation = &pr;
    fake_send(sock, &env);
    while (!(got_abort && got_error) && tdm_clock_now_ns() < end) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        zmq_msg_t msg;
        Tandem__Envelope *in = NULL;

        if (zmq_poll(&item, 1, 50) <= 0) {
            continue;
        }
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, 0) >= 0 &&
            proto_unpack(zmq_msg_data(&msg), zmq_msg_size(&msg), 0, &in, NULL, 0) == TDM_OK) {
            if (in->body_case == TANDEM__ENVELOPE__BODY_ABORT) {
                assert_false(got_error); /* the release comes first */
                assert_int_equal(in->abort->request_id, 77);
                assert_int_equal(in->abort->reservation_id, 99);
                assert_true(in->abort->writer_fenced);
                got_abort = 1;
            } else if (in->body_case == TANDEM__ENVELOPE__BODY_ERROR) {
                assert_int_equal(in->error->code, TANDEM__ERROR_CODE__ERROR_NOT_REGISTERED);
                got_error = 1;
            }
            proto_envelope_free(in);
        }
        zmq_msg_close(&msg);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    assert_true(got_abort);
    assert_true(got_error);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            test_validation_matrix_answers_openai_errors_while_others_complete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chat_and_completions_streamed_equal_whole, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stop_strings_cut_across_chunks_and_tokens, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_utf8_split_across_tokens_streams_whole_characters,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_registration_mismatch_is_refused_with_reason, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sessions_stick_and_move_when_their_worker_dies, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_prefix_match_finds_the_session_without_an_id, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_large_delta_is_prefilled_remotely_small_locally, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_prefill_from_another_rack_is_counted_cross_rack, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_prefill_worker_lost_mid_job_reruns_elsewhere, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_client_leaving_mid_stream_aborts_the_worker, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_client_leaving_a_non_streamed_request_aborts_the_worker, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_spec_field_selects_the_drafter_and_bad_values_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tiny_temperature_is_accepted_as_greedy, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_draining_worker_hands_its_turns_elsewhere, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_dspark_refused_for_a_model_without_dspark_blocks,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_decode_worker_is_a_503_not_a_hang, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tool_calls_and_reasoning_whole_and_streamed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_aborted_prefill_job_fences_its_writer_before_the_pages_return, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_reservation_from_an_unknown_worker_is_released,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_reservation_is_never_taken_for_the_retry, setup,
                                        teardown),
        cmocka_unit_test(test_executable_prints_help_and_rejects_bad_flags),
        cmocka_unit_test(test_a_restarted_router_numbers_its_requests_apart),
        cmocka_unit_test_setup_teardown(test_requests_are_served_beside_many_idle_connections,
                                        setup, teardown),
    };
    int rc;

    tdm_log_set_level(TDM_LOG_ERROR);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
