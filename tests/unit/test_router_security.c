/* test_router_security.c - issue 16's "nothing leaked, no one let in" on an in-process router
 * (router_create) with fake workers (test_router_fake.h) and libcurl / raw sockets as clients:
 * a request without X-Session-Id gets its own session, never another's found by prefix; API keys
 * (401 in OpenAI's shape, /health and /metrics open, per-key rate and concurrency limits as 429
 * with Retry-After, metrics labelled by key name, never the key); sessions, stored responses and
 * the prefix index belong to the key that made them; slow clients (slowloris) are cut by the
 * idle, header and body timeouts while a long first-token wait and a stream are not; CurveZMQ on
 * the control plane lets in only workers whose public key is allowed. Waits are polls with
 * deadlines. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "common/clock.h"
#include "common/curve.h"
#include "common/log.h"
#include "router/apikeys.h"
#include "router/router.h"
#include "test_router_fake.h"

#define PATH_BYTES 4096
#define BYTE_ID(b) ((int32_t)(3 + (unsigned char)(b)))
#define KEY_ALICE  "alice-secret-key-0123456789"
#define KEY_BOB    "bob-secret-key-9876543210xyz"
#define KEY_SLOW   "slow-secret-key-aaaaaaaaaaaa"
#define KEY_ONE    "one-at-a-time-key-bbbbbbbbbb"

static char g_model_dir[PATH_BYTES];
static char g_tmp[PATH_BYTES / 2];

typedef struct {
    router_t *router;
    int port;
    const proto_compat_t *compat;
    const char *endpoint;
} fixture_t;

typedef struct {
    const char *api_keys;
    uint32_t max_connections_per_ip;
    uint32_t idle_timeout_s;
    uint32_t header_timeout_s;
    uint32_t body_timeout_s;
    const char *curve_secret_key;
    const char *curve_workers;
} options_t;

typedef struct {
    long status;
    char *body;
    size_t n_body;
    char session[160];
    char retry_after[32];
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

/* Copy header `name` (lower case, with the colon) of `data` into out. */
static void take_header(const char *data, size_t len, const char *name, char *out, size_t cap)
{
    size_t n_name = strlen(name);
    size_t start = n_name;
    size_t end = len;

    if (len <= n_name || strncasecmp(data, name, n_name) != 0) {
        return;
    }
    while (start < end && data[start] == ' ') {
        start++;
    }
    while (end > start && (data[end - 1] == '\r' || data[end - 1] == '\n')) {
        end--;
    }
    snprintf(out, cap, "%.*s", (int)(end - start), data + start);
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    http_resp_t *r = arg;

    take_header(data, size * n, "x-session-id:", r->session, sizeof(r->session));
    take_header(data, size * n, "retry-after:", r->retry_after, sizeof(r->retry_after));
    return size * n;
}

/* One request; key (NULL: no Authorization) and session (NULL: no X-Session-Id). */
static void http_do(const fixture_t *fx, const char *method, const char *path, const char *body,
                    const char *key, const char *session, http_resp_t *out)
{
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = NULL;
    char url[256];
    char line[256];

    memset(out, 0, sizeof(*out));
    assert_non_null(curl);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", fx->port, path);
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
        headers = curl_slist_append(headers, "Content-Type: application/json");
    }
    if (key != NULL) {
        snprintf(line, sizeof(line), "Authorization: Bearer %s", key);
        headers = curl_slist_append(headers, line);
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

static void assert_error(const http_resp_t *r, long status, const char *type, const char *code)
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
    assert_string_equal(json_string_value(json_object_get(err, "type")), type);
    assert_string_equal(json_string_value(json_object_get(err, "code")), code);
    json_decref(root);
}

/* The text of a whole chat or completions answer (caller frees). */
static char *answer_text(const http_resp_t *r)
{
    json_error_t jerr;
    json_t *root = json_loads(r->body, 0, &jerr);
    json_t *choice = json_array_get(json_object_get(root, "choices"), 0);
    json_t *text = json_object_get(choice, "text");
    char *out;

    if (text == NULL) {
        text = json_object_get(json_object_get(choice, "message"), "content");
    }
    assert_true(json_is_string(text));
    out = strdup(json_string_value(text));
    json_decref(root);
    return out;
}

/* ---- fixture ---------------------------------------------------------------------------- */

static int run_shell(const char *command)
{
    int rc = system(command);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int group_setup(void **state)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char command[PATH_BYTES * 4];

    (void)state;
    if (bin == NULL || tmp == NULL) {
        print_message("TANDEM_BIN_DIR / TANDEM_TEST_TMP not set (run through ctest)\n");
        return -1;
    }
    snprintf(g_tmp, sizeof(g_tmp), "%s", tmp);
    snprintf(g_model_dir, sizeof(g_model_dir), "%s/router-model", tmp);
    snprintf(command, sizeof(command),
             "[ %s/config.json -nt %s/tandem-mkmodel ] || %s/tandem-mkmodel --log-level warn "
             "--preset tiny --seed 1 --out %s >/dev/null",
             g_model_dir, bin, bin, g_model_dir);
    return run_shell(command) == 0 ? 0 : -1;
}

static fixture_t *start_router(const options_t *o)
{
    router_params_t params;
    char err[512] = "";
    fixture_t *fx = calloc(1, sizeof(*fx));

    assert_non_null(fx);
    router_params_default(&params);
    params.model.model_dir = g_model_dir;
    params.model.served_name = "tiny";
    params.http.host = "127.0.0.1";
    params.http.port = 0;
    params.http.turn.timeout_ms = 10000;
    params.http.turn.keepalive_ms = 300;
    params.http.api_keys = o->api_keys;
    params.http.max_connections_per_ip = o->max_connections_per_ip;
    if (o->idle_timeout_s > 0) {
        params.http.idle_timeout_s = o->idle_timeout_s;
    }
    if (o->header_timeout_s > 0) {
        params.http.header_timeout_s = o->header_timeout_s;
    }
    if (o->body_timeout_s > 0) {
        params.http.body_timeout_s = o->body_timeout_s;
    }
    params.control.endpoint = "tcp://127.0.0.1:*";
    params.control.heartbeat_interval_ms = FAKE_HEARTBEAT_MS;
    params.control.heartbeat_timeout_ms = 5000;
    params.control.curve_secret_key = o->curve_secret_key;
    params.control.curve_workers = o->curve_workers;
    params.control.dispatch.local_prefill_tokens = 100000; /* no prefill workers here */
    if (router_create(&params, &fx->router, err, sizeof(err)) != TDM_OK) {
        print_message("router_create: %s\n", err);
        free(fx);
        return NULL;
    }
    fx->port = router_http_port_bound(fx->router);
    fx->compat = router_model_compat(router_model(fx->router));
    fx->endpoint = router_control_endpoint_bound(fx->router);
    return fx;
}

static void stop_router(fixture_t *fx)
{
    router_destroy(fx->router);
    free(fx);
}

static void start_decode(const fixture_t *fx, fake_worker_t *w, const char *id, const char *text)
{
    fake_init(w, id, TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat, fx->endpoint);
    for (const char *c = text; *c != '\0'; c++) {
        w->script[w->n_script++] = BYTE_ID(*c);
    }
    w->chunk_tokens = 2;
    fake_start(w);
    assert_int_equal(fake_wait_registered(w, 5000), 1);
}

static void stop_decode(fake_worker_t *w)
{
    fake_kill(w);
    fake_fini(w);
}

/* A /v1/completions body of prompt ids [n] with max_tokens, temperature 0 and a seed. */
static char *ids_body(const int32_t *ids, size_t n, int max_tokens)
{
    char *body = malloc(n * 8 + 160);
    size_t used = (size_t)sprintf(body,
                                  "{\"model\":\"tiny\",\"max_tokens\":%d,\"temperature\":0,"
                                  "\"seed\":7,\"prompt\":[",
                                  max_tokens);

    for (size_t i = 0; i < n; i++) {
        used += (size_t)sprintf(body + used, "%s%d", i > 0 ? "," : "", ids[i]);
    }
    sprintf(body + used, "]}");
    return body;
}

static void fill_prompt(int32_t *ids, size_t n, int salt)
{
    for (size_t i = 0; i < n; i++) {
        ids[i] = (int32_t)(100 + ((i + (size_t)salt) * 37) % 800);
    }
}

/* ---- sessions: share pages, not sessions ------------------------------------------------ */

static void test_same_request_twice_gets_its_own_session_and_the_same_text(void **state)
{
    options_t o = {0};
    fixture_t *fx = start_router(&o);
    uint32_t block;
    fake_worker_t dec;
    fake_record_t first;
    fake_record_t second;
    int32_t prompt[600];
    size_t n;
    http_resp_t a;
    http_resp_t b;
    char *text_a;
    char *text_b;
    char *body;

    (void)state;
    assert_non_null(fx);
    block = fx->compat->tokens_per_block;
    n = 3 * block + 11;
    assert_true(n <= sizeof(prompt) / sizeof(prompt[0]));
    start_decode(fx, &dec, "decode-same", "same words");
    fill_prompt(prompt, n, 0);
    body = ids_body(prompt, n, 10);
    http_do(fx, "POST", "/v1/completions", body, NULL, NULL, &a);
    assert_int_equal(a.status, 200);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &first));
    http_do(fx, "POST", "/v1/completions", body, NULL, NULL, &b);
    free(body);
    assert_int_equal(b.status, 200);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &second));
    assert_int_equal(fake_n_records(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST), 2);

    /* A session of its own (the old router attached it to the first request's session and
     * continued from a rewind of it). */
    assert_true(a.session[0] != '\0' && b.session[0] != '\0');
    assert_string_not_equal(a.session, b.session);
    assert_string_equal(second.session_id, b.session);
    assert_string_not_equal(second.session_id, first.session_id);
    /* Pages may be shared (whole blocks), the output is a fresh run's. */
    assert_int_equal(second.cached_len % block, 0);
    assert_true(second.cached_len <= n - 1);
    text_a = answer_text(&a);
    text_b = answer_text(&b);
    assert_string_equal(text_a, text_b);
    free(text_a);
    free(text_b);
    free(a.body);
    free(b.body);
    stop_decode(&dec);
    stop_router(fx);
}

/* ---- API keys --------------------------------------------------------------------------- */

static void test_api_keys_refuse_with_openai_401_and_keep_health_and_metrics_open(void **state)
{
    options_t o = {0};
    fixture_t *fx;
    fake_worker_t dec;
    http_resp_t r;
    static const char body[] = "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":4}";

    (void)state;
    o.api_keys = KEY_ALICE " name=alice," KEY_BOB " name=bob";
    fx = start_router(&o);
    assert_non_null(fx);
    start_decode(fx, &dec, "decode-keys", "ok");

    http_do(fx, "POST", "/v1/completions", body, NULL, NULL, &r);
    assert_error(&r, 401, "invalid_request_error", "invalid_api_key");
    free(r.body);
    http_do(fx, "POST", "/v1/completions", body, "alice-secret-key-0123456780", NULL, &r);
    assert_error(&r, 401, "invalid_request_error", "invalid_api_key");
    free(r.body);
    http_do(fx, "GET", "/v1/models", NULL, "short", NULL, &r);
    assert_error(&r, 401, "invalid_request_error", "invalid_api_key");
    free(r.body);
    http_do(fx, "GET", "/v1/nope", NULL, NULL, NULL, &r); /* no probing of paths either */
    assert_int_equal(r.status, 401);
    free(r.body);

    http_do(fx, "POST", "/v1/completions", body, KEY_ALICE, NULL, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    http_do(fx, "GET", "/v1/models", NULL, KEY_BOB, NULL, &r);
    assert_int_equal(r.status, 200);
    free(r.body);

    http_do(fx, "GET", "/health", NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    http_do(fx, "GET", "/metrics", NULL, NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "tandem_router_api_key_requests_total{key=\"alice\"} 1"));
    assert_non_null(strstr(r.body, "tandem_router_api_key_requests_total{key=\"bob\"} 1"));
    assert_non_null(strstr(r.body, "tandem_router_api_auth_failures_total 4"));
    assert_null(strstr(r.body, KEY_ALICE));
    assert_null(strstr(r.body, KEY_BOB));
    free(r.body);
    stop_decode(&dec);
    stop_router(fx);
}

static void test_api_key_table_parses_limits_and_refuses_bad_entries(void **state)
{
    router_apikeys_limits_t defaults = {3, 0};
    router_apikeys_t *keys = NULL;
    char err[256];
    uint32_t retry = 0;
    uint64_t t0 = 1000000000ull;

    (void)state;
    assert_int_equal(router_apikeys_create(NULL,
                                           "# comment\n" KEY_ALICE " name=alice rpm=2\n\n" KEY_BOB
                                           " concurrency=1",
                                           &defaults, &keys, err, sizeof(err)),
                     TDM_OK);
    assert_int_equal(router_apikeys_count(keys), 2);
    assert_int_equal(router_apikeys_authenticate(keys, "Bearer " KEY_ALICE), 1);
    assert_int_equal(router_apikeys_authenticate(keys, "bearer  " KEY_BOB " "), 2);
    assert_int_equal(router_apikeys_authenticate(keys, KEY_BOB), 0);
    assert_int_equal(router_apikeys_authenticate(keys, NULL), 0);
    assert_string_equal(router_apikeys_name(keys, 1), "alice");
    assert_string_equal(router_apikeys_name(keys, 2), "key2");
    /* rpm=2: two now, the third waits about 30 s; a minute later there is room again. */
    assert_int_equal(router_apikeys_acquire(keys, 1, t0, &retry), ROUTER_APIKEY_ADMITTED);
    assert_int_equal(router_apikeys_acquire(keys, 1, t0, &retry), ROUTER_APIKEY_ADMITTED);
    assert_int_equal(router_apikeys_acquire(keys, 1, t0, &retry), ROUTER_APIKEY_RATE_LIMITED);
    assert_true(retry >= 29 && retry <= 31);
    assert_int_equal(router_apikeys_acquire(keys, 1, t0 + 60ull * 1000000000ull, &retry),
                     ROUTER_APIKEY_ADMITTED);
    /* concurrency=1 */
    assert_int_equal(router_apikeys_acquire(keys, 2, t0, &retry), ROUTER_APIKEY_ADMITTED);
    assert_int_equal(router_apikeys_acquire(keys, 2, t0, &retry), ROUTER_APIKEY_CONCURRENCY_CAP);
    router_apikeys_release(keys, 2);
    assert_int_equal(router_apikeys_acquire(keys, 2, t0, &retry), ROUTER_APIKEY_ADMITTED);
    router_apikeys_destroy(keys);

    keys = NULL;
    assert_int_equal(router_apikeys_create(NULL, "short", &defaults, &keys, err, sizeof(err)),
                     TDM_ERR_FORMAT);
    assert_null(keys);
    assert_int_equal(
        router_apikeys_create(NULL, KEY_ALICE "," KEY_ALICE, &defaults, &keys, err, sizeof(err)),
        TDM_ERR_FORMAT);
    assert_null(strstr(err, KEY_ALICE)); /* the reason never repeats a key */
    assert_int_equal(
        router_apikeys_create(NULL, KEY_ALICE " rpm=x", &defaults, &keys, err, sizeof(err)),
        TDM_ERR_FORMAT);
    assert_int_equal(
        router_apikeys_create(NULL, KEY_ALICE " name=a/b", &defaults, &keys, err, sizeof(err)),
        TDM_ERR_FORMAT);
    assert_int_equal(
        router_apikeys_create("/nonexistent/keys", NULL, &defaults, &keys, err, sizeof(err)),
        TDM_ERR_NOT_FOUND);
    assert_int_equal(router_apikeys_create(NULL, NULL, &defaults, &keys, err, sizeof(err)), TDM_OK);
    assert_int_equal(router_apikeys_count(keys), 0);
    router_apikeys_destroy(keys);
}

static void test_rate_and_concurrency_limits_answer_429_with_retry_after(void **state)
{
    options_t o = {0};
    fixture_t *fx;
    fake_worker_t dec;
    http_resp_t r;
    static const char body[] = "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":4}";
    static const char held[] =
        "{\"model\":\"tiny\",\"prompt\":\"hold\",\"max_tokens\":40,\"stream\":true}";
    CURLM *multi;
    CURL *stream;
    struct curl_slist *headers = NULL;
    http_resp_t sr;
    char url[128];
    int running = 1;
    uint64_t end;

    (void)state;
    o.api_keys = KEY_SLOW " name=slow rpm=2," KEY_ONE " name=one concurrency=1";
    fx = start_router(&o);
    assert_non_null(fx);
    start_decode(fx, &dec, "decode-limits", "abcdefgh");

    http_do(fx, "POST", "/v1/completions", body, KEY_SLOW, NULL, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    http_do(fx, "POST", "/v1/completions", body, KEY_SLOW, NULL, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    http_do(fx, "POST", "/v1/completions", body, KEY_SLOW, NULL, &r);
    assert_error(&r, 429, "requests", "rate_limit_exceeded");
    assert_true(atoi(r.retry_after) >= 1);
    free(r.body);

    /* One stream held open by key "one": its second request is refused until it ends. */
    dec.hold_after = 2;
    memset(&sr, 0, sizeof(sr));
    multi = curl_multi_init();
    stream = curl_easy_init();
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/completions", fx->port);
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Authorization: Bearer " KEY_ONE);
    curl_easy_setopt(stream, CURLOPT_URL, url);
    curl_easy_setopt(stream, CURLOPT_POSTFIELDS, held);
    curl_easy_setopt(stream, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(stream, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(stream, CURLOPT_WRITEDATA, &sr);
    curl_easy_setopt(stream, CURLOPT_NOSIGNAL, 1L);
    curl_multi_add_handle(multi, stream);
    end = tdm_clock_now_ns() + 5000 * TDM_NS_PER_MS;
    while (running && (sr.body == NULL || strstr(sr.body, "data:") == NULL) &&
           tdm_clock_now_ns() < end) {
        curl_multi_perform(multi, &running);
        curl_multi_poll(multi, NULL, 0, 20, NULL);
    }
    assert_non_null(sr.body);
    http_do(fx, "POST", "/v1/completions", body, KEY_ONE, NULL, &r);
    assert_error(&r, 429, "requests", "concurrency_limit_exceeded");
    assert_string_equal(r.retry_after, "1");
    free(r.body);
    curl_multi_remove_handle(multi, stream);
    curl_easy_cleanup(stream); /* the client leaves: the router aborts the turn */
    curl_multi_cleanup(multi);
    curl_slist_free_all(headers);
    free(sr.body);
    dec.hold_after = 0;
    end = tdm_clock_now_ns() + 5000 * TDM_NS_PER_MS;
    do {
        http_do(fx, "POST", "/v1/completions", body, KEY_ONE, NULL, &r);
        free(r.body);
        if (r.status == 200) {
            break;
        }
        zmq_poll(NULL, 0, 20);
    } while (tdm_clock_now_ns() < end);
    assert_int_equal(r.status, 200);
    assert_true(fake_n_aborts(&dec) >= 1);
    stop_decode(&dec);
    stop_router(fx);
}

static void test_sessions_responses_and_prefixes_belong_to_their_key(void **state)
{
    options_t o = {0};
    fixture_t *fx;
    fake_worker_t dec;
    fake_record_t rec;
    http_resp_t r;
    int32_t prompt[600];
    size_t n;
    char *body;
    char request[512];
    char resp_id[128];
    json_error_t jerr;
    json_t *root;

    (void)state;
    o.api_keys = KEY_ALICE " name=alice," KEY_BOB " name=bob";
    fx = start_router(&o);
    assert_non_null(fx);
    start_decode(fx, &dec, "decode-tenants", "mine");
    n = 3 * fx->compat->tokens_per_block + 5;
    fill_prompt(prompt, n, 3);
    body = ids_body(prompt, n, 4);

    /* Alice's named session: Bob cannot use it, whatever he sends. */
    http_do(fx, "POST", "/v1/completions", body, KEY_ALICE, "alice-s1", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.session, "alice-s1");
    free(r.body);
    http_do(fx, "POST", "/v1/completions", body, KEY_BOB, "alice-s1", &r);
    assert_error(&r, 404, "not_found_error", "session_not_found");
    free(r.body);
    http_do(fx, "POST", "/v1/completions", body, KEY_ALICE, "alice-s1", &r);
    assert_int_equal(r.status, 200);
    free(r.body);

    /* Bob's identical prompt without a session id: no page sharing across keys. */
    http_do(fx, "POST", "/v1/completions", body, KEY_BOB, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_not_equal(r.session, "alice-s1");
    free(r.body);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_int_equal(rec.cached_len, 0);
    /* Alice's identical prompt without a session id: a new session sharing her own pages. */
    http_do(fx, "POST", "/v1/completions", body, KEY_ALICE, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_not_equal(r.session, "alice-s1");
    free(r.body);
    assert_true(fake_last(&dec, TANDEM__ENVELOPE__BODY_DECODE_REQUEST, &rec));
    assert_true(rec.cached_len > 0);
    free(body);

    /* A stored response continues only for the key that made it. */
    http_do(fx, "POST", "/v1/responses",
            "{\"model\":\"tiny\",\"input\":\"hello\",\"max_output_tokens\":4}", KEY_ALICE, NULL,
            &r);
    assert_int_equal(r.status, 200);
    root = json_loads(r.body, 0, &jerr);
    assert_non_null(root);
    snprintf(resp_id, sizeof(resp_id), "%s", json_string_value(json_object_get(root, "id")));
    json_decref(root);
    free(r.body);
    snprintf(request, sizeof(request),
             "{\"model\":\"tiny\",\"input\":\"more\",\"max_output_tokens\":4,"
             "\"previous_response_id\":\"%s\"}",
             resp_id);
    http_do(fx, "POST", "/v1/responses", request, KEY_BOB, NULL, &r);
    assert_error(&r, 400, "invalid_request_error", "invalid_value"); /* as an unknown id */
    free(r.body);
    http_do(fx, "POST", "/v1/responses", request, KEY_ALICE, NULL, &r);
    assert_int_equal(r.status, 200);
    free(r.body);
    stop_decode(&dec);
    stop_router(fx);
}

/* ---- slow clients ----------------------------------------------------------------------- */

static int connect_raw(int port)
{
    struct sockaddr_in addr;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    return fd;
}

/* Milliseconds until the server closed fd (reads and drops what it sent), or -1 when it is
 * still open after limit_ms. Sends drip[i] every drip_ms meanwhile when drip is not NULL. */
static long wait_closed(int fd, long limit_ms, const char *drip, long drip_ms)
{
    uint64_t t0 = tdm_clock_now_ns();
    uint64_t next_drip = t0 + (uint64_t)drip_ms * TDM_NS_PER_MS;
    size_t at = 0;

    for (;;) {
        uint64_t now = tdm_clock_now_ns();
        long elapsed = (long)((now - t0) / TDM_NS_PER_MS);
        struct pollfd pfd = {fd, POLLIN, 0};
        char buf[512];
        if (elapsed > limit_ms) {
            return -1;
        }
        if (drip != NULL && drip[at] != '\0' && now >= next_drip) {
            if (send(fd, drip + at, 1, MSG_NOSIGNAL) != 1) {
                return elapsed;
            }
            at++;
            next_drip = now + (uint64_t)drip_ms * TDM_NS_PER_MS;
        }
        if (poll(&pfd, 1, 20) > 0) {
            ssize_t got = recv(fd, buf, sizeof(buf), 0);
            if (got <= 0) {
                return elapsed;
            }
        }
    }
}

static void test_slow_clients_are_cut_by_the_idle_header_and_body_timeouts(void **state)
{
    options_t o = {0};
    fixture_t *fx;
    static const char head[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                               "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n";
    char drip[64];
    long ms;
    int fd;

    (void)state;
    o.idle_timeout_s = 1;
    o.header_timeout_s = 2;
    o.body_timeout_s = 2;
    o.max_connections_per_ip = 2;
    fx = start_router(&o);
    assert_non_null(fx);

    /* Two silent connections from one address are all it may hold: a third is closed at once. */
    {
        int a = connect_raw(fx->port);
        int b = connect_raw(fx->port);
        int third;
        zmq_poll(NULL, 0, 100); /* both accepted */
        third = connect_raw(fx->port);
        ms = wait_closed(third, 500, NULL, 0);
        print_message("third connection from one address: closed after %ld ms\n", ms);
        assert_true(ms >= 0);
        close(third);
        close(a);
        close(b);
        zmq_poll(NULL, 0, 200); /* the server sees them go */
    }

    /* The slowloris: 9 of 100 body bytes, then silence. */
    fd = connect_raw(fx->port);
    assert_int_equal(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    assert_int_equal(send(fd, "{\"model\":", 9, MSG_NOSIGNAL), 9);
    ms = wait_closed(fd, 6000, NULL, 0);
    print_message("silent body: closed after %ld ms\n", ms);
    assert_true(ms >= 0);
    close(fd);

    /* Silence before any header. */
    fd = connect_raw(fx->port);
    ms = wait_closed(fd, 6000, NULL, 0);
    assert_true(ms >= 0);
    close(fd);

    /* A body dripped a byte per 300 ms (never idle for a second): the body deadline. */
    fd = connect_raw(fx->port);
    assert_int_equal(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    memset(drip, 'x', sizeof(drip) - 1);
    drip[sizeof(drip) - 1] = '\0';
    ms = wait_closed(fd, 8000, drip, 300);
    print_message("dripped body: closed after %ld ms\n", ms);
    assert_true(ms >= 0);
    close(fd);

    /* Headers dripped a byte per 300 ms: the header deadline (when they complete). */
    fd = connect_raw(fx->port);
    ms = wait_closed(
        fd, 8000,
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n\r\n",
        300);
    print_message("dripped headers: closed after %ld ms\n", ms);
    assert_true(ms >= 0);
    close(fd);
    stop_router(fx);
}

static void test_long_first_token_wait_and_streams_outlive_the_idle_timeout(void **state)
{
    options_t o = {0};
    fixture_t *fx;
    fake_worker_t dec;
    http_resp_t r;
    char *text;

    (void)state;
    o.idle_timeout_s = 1;
    fx = start_router(&o);
    assert_non_null(fx);
    start_decode(fx, &dec, "decode-slow", "patience");
    dec.decode_delay_ms = 2500;
    http_do(fx, "POST", "/v1/completions",
            "{\"model\":\"tiny\",\"prompt\":\"wait\",\"max_tokens\":8}", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    text = answer_text(&r);
    assert_string_equal(text, "patience");
    free(text);
    free(r.body);
    http_do(fx, "POST", "/v1/completions",
            "{\"model\":\"tiny\",\"prompt\":\"wait\",\"max_tokens\":8,\"stream\":true}", NULL, NULL,
            &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "data: [DONE]"));
    free(r.body);
    stop_decode(&dec);
    stop_router(fx);
}

/* ---- CurveZMQ ----------------------------------------------------------------------------- */

static void keypair(const char *name, tdm_curve_keypair_t *keys)
{
    char path[PATH_BYTES];

    memset(keys, 0, sizeof(*keys));
    assert_int_equal(zmq_curve_keypair(keys->public_z85, keys->secret_z85), 0);
    snprintf(path, sizeof(path), "%s/%s.key", g_tmp, name);
    assert_int_equal(tdm_curve_keyfile_write(path, keys, 1), TDM_OK);
    snprintf(path, sizeof(path), "%s/%s.pub", g_tmp, name);
    assert_int_equal(tdm_curve_keyfile_write(path, keys, 0), TDM_OK);
}

static void test_curve_lets_in_only_allowed_workers(void **state)
{
    tdm_curve_keypair_t router_keys;
    tdm_curve_keypair_t good;
    tdm_curve_keypair_t bad;
    tdm_curve_keypair_t loaded;
    char secret_path[PATH_BYTES];
    char list_path[PATH_BYTES];
    char good_pub[PATH_BYTES];
    FILE *list;
    options_t o = {0};
    fixture_t *fx;
    fake_worker_t w_good;
    fake_worker_t w_bad;
    fake_worker_t w_plain;

    (void)state;
    if (!zmq_has("curve")) {
        skip(); /* libzmq without libsodium */
    }
    keypair("sec-router", &router_keys);
    keypair("sec-good", &good);
    keypair("sec-bad", &bad);
    snprintf(secret_path, sizeof(secret_path), "%s/sec-router.key", g_tmp);
    snprintf(good_pub, sizeof(good_pub), "%s/sec-good.pub", g_tmp);
    assert_int_equal(tdm_curve_keyfile_load(good_pub, &loaded, NULL, 0), TDM_OK);
    assert_string_equal(loaded.public_z85, good.public_z85);
    assert_string_equal(loaded.secret_z85, "");
    snprintf(list_path, sizeof(list_path), "%s/sec-workers", g_tmp);
    list = fopen(list_path, "w");
    assert_non_null(list);
    fprintf(list, "# allowed workers\n%s\n", good.public_z85);
    fclose(list);
    o.curve_secret_key = secret_path;
    o.curve_workers = list_path;
    fx = start_router(&o);
    assert_non_null(fx);

    fake_init(&w_bad, "decode-bad-key", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat,
              fx->endpoint);
    memcpy(w_bad.curve_server, router_keys.public_z85, 41);
    memcpy(w_bad.curve_public, bad.public_z85, 41);
    memcpy(w_bad.curve_secret, bad.secret_z85, 41);
    fake_start(&w_bad);
    fake_init(&w_plain, "decode-no-curve", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat,
              fx->endpoint);
    fake_start(&w_plain);
    fake_init(&w_good, "decode-good-key", TANDEM__ROLE__ROLE_DECODE, "rack0", fx->compat,
              fx->endpoint);
    memcpy(w_good.curve_server, router_keys.public_z85, 41);
    memcpy(w_good.curve_public, good.public_z85, 41);
    memcpy(w_good.curve_secret, good.secret_z85, 41);
    fake_start(&w_good);

    assert_int_equal(fake_wait_registered(&w_good, 5000), 1);
    assert_int_equal(fake_wait_registered(&w_bad, 1500), 0);
    assert_int_equal(fake_wait_registered(&w_plain, 500), 0);
    fake_kill(&w_bad);
    fake_kill(&w_plain);
    fake_kill(&w_good);
    fake_fini(&w_bad);
    fake_fini(&w_plain);
    fake_fini(&w_good);
    stop_router(fx);

    /* Only one of the two files, or a public file as the router's key: refused at start. */
    o.curve_workers = NULL;
    assert_null(start_router(&o));
    o.curve_workers = list_path;
    o.curve_secret_key = good_pub;
    assert_null(start_router(&o));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_request_twice_gets_its_own_session_and_the_same_text),
        cmocka_unit_test(test_api_key_table_parses_limits_and_refuses_bad_entries),
        cmocka_unit_test(test_api_keys_refuse_with_openai_401_and_keep_health_and_metrics_open),
        cmocka_unit_test(test_rate_and_concurrency_limits_answer_429_with_retry_after),
        cmocka_unit_test(test_sessions_responses_and_prefixes_belong_to_their_key),
        cmocka_unit_test(test_slow_clients_are_cut_by_the_idle_header_and_body_timeouts),
        cmocka_unit_test(test_long_first_token_wait_and_streams_outlive_the_idle_timeout),
        cmocka_unit_test(test_curve_lets_in_only_allowed_workers),
    };

    curl_global_init(CURL_GLOBAL_DEFAULT);
    tdm_log_set_level(TDM_LOG_WARN);
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
