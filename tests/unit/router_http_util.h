/* router_http_util.h - the HTTP client side of the router tests (header-only test code): one
 * request to a router's OpenAI/metrics port through libcurl, and one metric read from /metrics.
 * The caller has called curl_global_init.
 */
#ifndef TANDEM_TESTS_ROUTER_HTTP_UTIL_H
#define TANDEM_TESTS_ROUTER_HTTP_UTIL_H

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of a response body rhu_http keeps (the rest is dropped). */
#define RHU_BODY_BYTES 65536

/* libcurl write callback: appends to the NUL-terminated buffer arg (RHU_BODY_BYTES). */
static inline size_t rhu_on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    char *buf = arg;
    size_t have = strlen(buf);
    size_t n = size * nmemb;

    if (have + n < RHU_BODY_BYTES) {
        memcpy(buf + have, data, n);
        buf[have + n] = '\0';
    }
    return n;
}

/*
 * rhu_http - GET path (body NULL) or POST body as JSON to http://127.0.0.1:port, with an
 * X-Session-Id header when session is non-NULL, within timeout_ms. Returns the HTTP status, 0
 * when the request was cut or timed out. body_out [RHU_BODY_BYTES]: the response body, truncated.
 */
static inline long rhu_http(int port, const char *path, const char *body, const char *session,
                            long timeout_ms, char *body_out)
{
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = NULL;
    char url[256];
    char line[256];
    long status = 0;

    body_out[0] = '\0';
    if (curl == NULL) {
        return 0;
    }
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, rhu_on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, body_out);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (body != NULL) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
        headers = curl_slist_append(headers, "Content-Type: application/json");
    }
    if (session != NULL) {
        snprintf(line, sizeof(line), "X-Session-Id: %s", session);
        headers = curl_slist_append(headers, line);
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    if (curl_easy_perform(curl) == CURLE_OK) {
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    }
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    return status;
}

/* rhu_metric - the value of the unlabelled sample `name` on port's /metrics (30 s timeout); -1
 * when the page cannot be read or has no such line. Not thread-safe (one static page buffer). */
static inline double rhu_metric(int port, const char *name)
{
    static char page[RHU_BODY_BYTES];
    const char *at;
    char key[160];

    if (rhu_http(port, "/metrics", NULL, NULL, 30000, page) != 200) {
        return -1;
    }
    snprintf(key, sizeof(key), "\n%s ", name);
    at = strstr(page, key);
    return at != NULL ? atof(at + strlen(key)) : -1;
}

#endif
