/* client.c - libcurl streaming client and SSE reader; see client.h. */
#include "bench/replay/client.h"

#include "common/clock.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLIENT_URL_BYTES        2048
#define CLIENT_HEADER_BYTES     512
#define CLIENT_ERROR_BODY_BYTES 640 /* of a non-200 body kept for the error text */

struct bench_client {
    bench_client_params_t params;
    CURL *curl;
    tdm_buf_t lines;         /* SSE bytes not yet split into lines */
    tdm_buf_t err_body;      /* start of a non-200 body */
    bench_request_t *req;    /* record being filled */
    int done;                /* saw [DONE] */
    int finished;            /* saw a finish_reason */
    int stream_error;        /* saw an error event */
    int no_memory;
    int64_t chunk_count;
    char error[BENCH_CLIENT_ERR_BYTES];
};

tdm_status_t bench_client_create(const bench_client_params_t *params, bench_client_t **client_out)
{
    bench_client_t *client;

    if (params->base_url == NULL || params->base_url[0] == '\0') {
        return TDM_ERR_INVALID_ARG;
    }
    client = calloc(1, sizeof(*client));
    if (client == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    client->params = *params;
    client->curl = curl_easy_init();
    if (client->curl == NULL) {
        free(client);
        return TDM_ERR_NO_MEMORY;
    }
    *client_out = client;
    return TDM_OK;
}

void bench_client_destroy(bench_client_t *client)
{
    if (client == NULL) {
        return;
    }
    curl_easy_cleanup(client->curl);
    tdm_buf_fini(&client->lines);
    tdm_buf_fini(&client->err_body);
    free(client);
}

const char *bench_client_last_error(const bench_client_t *client)
{
    return client->error;
}

static const char *first_string(const json_t *obj, const char *key)
{
    const json_t *value = json_object_get(obj, key);
    return json_is_string(value) ? json_string_value(value) : NULL;
}

static int non_empty(const char *text)
{
    return text != NULL && text[0] != '\0';
}

/* Handles one SSE data payload (NUL-terminated) that arrived at now_ns. */
static void on_data(bench_client_t *client, const char *payload, uint64_t now_ns)
{
    bench_request_t *req = client->req;
    json_error_t jerr;
    json_t *event;
    const json_t *choice;
    const json_t *usage;
    int content = 0;

    if (strcmp(payload, "[DONE]") == 0) {
        client->done = 1;
        return;
    }
    /* A token may decode to U+0000; the server escapes it as \u0000, which is valid JSON. */
    event = json_loads(payload, JSON_ALLOW_NUL, &jerr);
    if (event == NULL) {
        client->stream_error = 1;
        snprintf(client->error, sizeof(client->error), "bad JSON in stream: %s", jerr.text);
        return;
    }
    if (json_object_get(event, "error") != NULL) {
        const char *message = first_string(json_object_get(event, "error"), "message");
        client->stream_error = 1;
        snprintf(client->error, sizeof(client->error), "error event: %s",
                 message != NULL ? message : "(no message)");
        json_decref(event);
        return;
    }
    choice = json_array_get(json_object_get(event, "choices"), 0);
    if (json_is_object(choice)) {
        const json_t *delta = json_object_get(choice, "delta");
        const json_t *tool_calls = json_object_get(delta, "tool_calls");
        content = non_empty(first_string(choice, "text")) ||
                  non_empty(first_string(delta, "content")) ||
                  non_empty(first_string(delta, "reasoning_content")) ||
                  (json_is_array(tool_calls) && json_array_size(tool_calls) > 0);
        if (first_string(choice, "finish_reason") != NULL) {
            client->finished = 1;
        }
    }
    usage = json_object_get(event, "usage");
    if (json_is_object(usage)) {
        const json_t *completion = json_object_get(usage, "completion_tokens");
        const json_t *prompt = json_object_get(usage, "prompt_tokens");
        if (json_is_integer(completion)) {
            req->usage_reported = 1;
            req->output_tokens = (int64_t)json_integer_value(completion);
        }
        if (json_is_integer(prompt)) {
            req->input_tokens = (int64_t)json_integer_value(prompt);
            req->prompt_reported = 1;
        }
    }
    if (content) {
        if (req->t_first_ns == 0) {
            req->t_first_ns = now_ns;
        } else if (bench_request_add_gap(req, (double)(now_ns - req->t_last_ns) / TDM_NS_PER_MS) !=
                   TDM_OK) {
            client->no_memory = 1;
        }
        req->t_last_ns = now_ns;
        req->n_chunks++;
    }
    json_decref(event);
}

static size_t on_write(char *bytes, size_t size, size_t n_items, void *userdata)
{
    bench_client_t *client = userdata;
    size_t n = size * n_items;
    uint64_t now_ns = tdm_clock_now_ns();
    long status = 0;
    size_t start = 0;

    curl_easy_getinfo(client->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
        if (client->err_body.n_bytes < CLIENT_ERROR_BODY_BYTES) {
            size_t room = CLIENT_ERROR_BODY_BYTES - client->err_body.n_bytes;
            tdm_buf_append(&client->err_body, bytes, n < room ? n : room);
        }
        return n;
    }
    if (tdm_buf_append(&client->lines, bytes, n) != TDM_OK) {
        client->no_memory = 1;
        return 0;
    }
    for (;;) {
        char *line = client->lines.data + start;
        char *newline = memchr(line, '\n', client->lines.n_bytes - start);
        size_t n_line;
        if (newline == NULL) {
            break;
        }
        n_line = (size_t)(newline - line);
        start += n_line + 1;
        if (n_line > 0 && line[n_line - 1] == '\r') {
            n_line--;
        }
        line[n_line] = '\0';
        if (strncmp(line, "data:", 5) == 0) {
            const char *payload = line + 5;
            while (*payload == ' ') {
                payload++;
            }
            on_data(client, payload, now_ns);
        }
    }
    tdm_buf_consume(&client->lines, start);
    return n;
}

static int on_progress(void *userdata, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    const bench_client_t *client = userdata;

    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    return client->params.abort_flag != NULL && atomic_load(client->params.abort_flag) ? 1 : 0;
}

static struct curl_slist *make_headers(const bench_client_t *client, const char *session_id)
{
    struct curl_slist *headers = NULL;
    char line[CLIENT_HEADER_BYTES];

    headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (headers == NULL) {
        return NULL;
    }
    /* No "Expect: 100-continue" round trip before large bodies: it would count in TTFT. */
    if (curl_slist_append(headers, "Accept: text/event-stream") == NULL ||
        curl_slist_append(headers, "Expect:") == NULL) {
        goto err_free;
    }
    if (client->params.api_key != NULL && client->params.api_key[0] != '\0') {
        snprintf(line, sizeof(line), "Authorization: Bearer %s", client->params.api_key);
        if (curl_slist_append(headers, line) == NULL) {
            goto err_free;
        }
    }
    if (session_id != NULL) {
        snprintf(line, sizeof(line), "X-Session-Id: %s", session_id);
        if (curl_slist_append(headers, line) == NULL) {
            goto err_free;
        }
    }
    return headers;

err_free:
    curl_slist_free_all(headers);
    return NULL;
}

tdm_status_t bench_client_stream(bench_client_t *client, bench_api_t api, const char *body,
                                 size_t n_body, const char *session_id, bench_request_t *req)
{
    char url[CLIENT_URL_BYTES];
    struct curl_slist *headers;
    CURLcode rc;
    long status = 0;

    snprintf(url, sizeof(url), "%s%s", client->params.base_url,
             api == BENCH_API_CHAT ? "/v1/chat/completions" : "/v1/completions");
    headers = make_headers(client, session_id);
    if (headers == NULL) {
        req->result = BENCH_REQ_ERR_CONNECT;
        snprintf(client->error, sizeof(client->error), "out of memory");
        return TDM_ERR_NO_MEMORY;
    }
    tdm_buf_reset(&client->lines);
    tdm_buf_reset(&client->err_body);
    client->req = req;
    client->done = 0;
    client->finished = 0;
    client->stream_error = 0;
    client->no_memory = 0;
    client->error[0] = '\0';

    curl_easy_reset(client->curl);
    curl_easy_setopt(client->curl, CURLOPT_URL, url);
    curl_easy_setopt(client->curl, CURLOPT_POST, 1L);
    curl_easy_setopt(client->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(client->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)n_body);
    curl_easy_setopt(client->curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(client->curl, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(client->curl, CURLOPT_WRITEDATA, client);
    curl_easy_setopt(client->curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(client->curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(client->curl, CURLOPT_XFERINFODATA, client);
    curl_easy_setopt(client->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(client->curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(client->curl, CURLOPT_TIMEOUT_MS, client->params.timeout_ms);
    curl_easy_setopt(client->curl, CURLOPT_CONNECTTIMEOUT_MS, client->params.connect_timeout_ms);

    req->t_send_ns = tdm_clock_now_ns();
    rc = curl_easy_perform(client->curl);
    req->t_end_ns = tdm_clock_now_ns();
    curl_slist_free_all(headers);
    curl_easy_getinfo(client->curl, CURLINFO_RESPONSE_CODE, &status);
    req->http_status = (int)status;
    client->req = NULL;

    if (client->no_memory) {
        req->result = BENCH_REQ_ERR_STREAM;
        snprintf(client->error, sizeof(client->error), "out of memory");
        return TDM_ERR_NO_MEMORY;
    }
    if (rc != CURLE_OK && status != 200) {
        req->result = BENCH_REQ_ERR_CONNECT;
        snprintf(client->error, sizeof(client->error), "%s", curl_easy_strerror(rc));
        return TDM_ERR_PEER_LOST;
    }
    if (status != 200) {
        req->result = BENCH_REQ_ERR_HTTP;
        snprintf(client->error, sizeof(client->error), "HTTP %ld: %s", status,
                 client->err_body.data != NULL ? client->err_body.data : "");
        return TDM_ERR_MISMATCH;
    }
    if (client->stream_error) {
        req->result = BENCH_REQ_ERR_STREAM;
        return TDM_ERR_FORMAT;
    }
    if (rc != CURLE_OK) {
        req->result = BENCH_REQ_ERR_CONNECT;
        snprintf(client->error, sizeof(client->error), "stream broken: %s", curl_easy_strerror(rc));
        return TDM_ERR_PEER_LOST;
    }
    if (!client->done && !client->finished) {
        req->result = BENCH_REQ_ERR_STREAM;
        snprintf(client->error, sizeof(client->error), "stream ended without [DONE]");
        return TDM_ERR_FORMAT;
    }
    if (!req->usage_reported) {
        req->output_tokens = req->n_chunks;
    }
    req->result = BENCH_REQ_OK;
    return TDM_OK;
}

static size_t on_get_write(char *bytes, size_t size, size_t n_items, void *userdata)
{
    tdm_buf_t *body = userdata;
    size_t n = size * n_items;
    return tdm_buf_append(body, bytes, n) == TDM_OK ? n : 0;
}

tdm_status_t bench_http_get(const char *url, const char *api_key, long timeout_ms,
                            tdm_buf_t *body_out, long *http_status_out)
{
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = NULL;
    char line[CLIENT_HEADER_BYTES];
    CURLcode rc;
    long status = 0;

    *http_status_out = 0;
    if (curl == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    tdm_buf_reset(body_out);
    if (api_key != NULL && api_key[0] != '\0') {
        snprintf(line, sizeof(line), "Authorization: Bearer %s", api_key);
        headers = curl_slist_append(NULL, line);
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_get_write);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, body_out);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    rc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    *http_status_out = status;
    if (rc != CURLE_OK) {
        return rc == CURLE_WRITE_ERROR ? TDM_ERR_NO_MEMORY : TDM_ERR_PEER_LOST;
    }
    return status == 200 ? TDM_OK : TDM_ERR_MISMATCH;
}
