/* test_cluster_harness.h - the local-cluster harness of the test_cluster*.c files: start
 * `tandem local` (tandem-router, tandem-prefill, tandem-decode as separate processes on
 * loopback, tiny preset), talk to it over HTTP (libcurl), read /metrics and /health, compare
 * with tandem-generate, and check each decode node's pages against the baseline it had when the
 * cluster came up. No sleeps as synchronisation: every wait is a poll of /health or /metrics
 * against a deadline, or a blocking read of the launcher's output. Header-only (static inline)
 * so each test binary carries its own copy.
 *
 * Environment (tests/CMakeLists.txt): TANDEM_BIN_DIR (built executables), TANDEM_TEST_TMP.
 * Each test binary defines T_MODEL_PREFIX before including this header: its checkpoints are
 * TANDEM_TEST_TMP/<prefix>-tiny-1 and -2, so binaries that ctest runs in parallel never write
 * a checkpoint another one is serving.
 */
#ifndef TANDEM_TESTS_TEST_CLUSTER_HARNESS_H
#define TANDEM_TESTS_TEST_CLUSTER_HARNESS_H

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"

#define T_PATH          1024
#define T_BODY          (1u << 20)
#define T_MAX_WORKERS   8
#define T_MAX_CLUSTERS  4
#define T_MAX_ROUTERS   4
#define T_THRESHOLD     32    /* --local-prefill-tokens in these tests */
#define T_PAGES         1024  /* --pages of every worker */
#define T_PAGES_WAIT_MS 20000 /* reservations come back after their fence within this */
#ifndef T_MODEL_PREFIX
#define T_MODEL_PREFIX "cluster"
#endif
#define T_MODEL_NAME T_MODEL_PREFIX "-tiny-1" /* the model the router serves (directory name) */

typedef struct {
    pid_t launcher;
    FILE *out;
    unsigned http_port;
    pid_t decode_pid[T_MAX_WORKERS];
    unsigned decode_port[T_MAX_WORKERS];
    double decode_base_free[T_MAX_WORKERS]; /* free pages when the cluster came up */
    int decode_killed[T_MAX_WORKERS];       /* SIGKILLed by the test: not checked */
    int n_decode;
    pid_t prefill_pid[T_MAX_WORKERS];
    unsigned prefill_port[T_MAX_WORKERS];
    int n_prefill;
    pid_t router_pid[T_MAX_ROUTERS]; /* the first serves http_port */
    unsigned router_port[T_MAX_ROUTERS];
    int n_routers;
    int stray_exits; /* "exited:" lines before "ready:" naming no announced process */
} cluster_t;

/* Whether pid was announced on a "started:" line of c. */
static inline int cluster_announced(const cluster_t *c, int pid)
{
    for (int i = 0; i < c->n_routers; i++) {
        if (c->router_pid[i] == pid) {
            return 1;
        }
    }
    for (int i = 0; i < c->n_decode; i++) {
        if (c->decode_pid[i] == pid) {
            return 1;
        }
    }
    for (int i = 0; i < c->n_prefill; i++) {
        if (c->prefill_pid[i] == pid) {
            return 1;
        }
    }
    return 0;
}

/* Clusters started and not yet stopped: a failed assertion jumps out of a test, so the test
 * teardown stops whatever is left (never a leaked process tree). */
static cluster_t *g_running[T_MAX_CLUSTERS];
static char g_bin[T_PATH];
static char g_model[T_PATH];
static char g_model2[T_PATH];
/* --pages of every worker of the clusters started next (a test may lower it for page pressure) */
static int g_pages = T_PAGES;
/* --racks of the clusters started next (tandem local spreads the workers over them) */
static int g_racks = 1;
/* --routers of the clusters started next (one fleet of routers, docs/ROUTERS.md) */
static int g_routers = 1;

static inline void run_or_fail(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0) {
        fail_msg("command failed (%d): %s", rc, cmd);
    }
}

/* Group setup: two tiny checkpoints (seeds 1 and 2: different model fingerprints). */
static inline int setup_models(void **state)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char cmd[3 * T_PATH];

    (void)state;
    if (bin == NULL || tmp == NULL) {
        return -1;
    }
    snprintf(g_bin, sizeof(g_bin), "%s", bin);
    snprintf(g_model, sizeof(g_model), "%s/%s", tmp, T_MODEL_NAME);
    snprintf(g_model2, sizeof(g_model2), "%s/%s-tiny-2", tmp, T_MODEL_PREFIX);
    snprintf(cmd, sizeof(cmd),
             "%s/tandem-mkmodel --preset tiny --seed 1 --out %s >/dev/null 2>&1 && "
             "%s/tandem-mkmodel --preset tiny --seed 2 --out %s >/dev/null 2>&1",
             bin, g_model, bin, g_model2);
    run_or_fail(cmd);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static inline void cluster_stop(cluster_t *c)
{
    int status = 0;

    for (int i = 0; i < T_MAX_CLUSTERS; i++) {
        if (g_running[i] == c) {
            g_running[i] = NULL;
        }
    }
    if (c->launcher <= 0) {
        return;
    }
    kill(c->launcher, SIGTERM);
    waitpid(c->launcher, &status, 0);
    fclose(c->out);
    c->launcher = 0;
    assert_true(WIFEXITED(status));
}

/* Test teardown: stop any cluster a failed assertion left running. */
static inline int stop_leftovers(void **state)
{
    (void)state;
    for (int i = 0; i < T_MAX_CLUSTERS; i++) {
        if (g_running[i] != NULL) {
            cluster_stop(g_running[i]);
        }
    }
    return 0;
}

static inline int teardown_models(void **state)
{
    (void)state;
    curl_global_cleanup();
    return 0;
}

typedef struct {
    char *buf;
    size_t n;
    size_t abort_after; /* > 0: fail the transfer once this many bytes arrived (client leaves) */
} body_t;

static inline size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    body_t *b = arg;
    size_t n = size * nmemb;

    if (b->n + n >= T_BODY) {
        return 0;
    }
    memcpy(b->buf + b->n, data, n);
    b->n += n;
    b->buf[b->n] = '\0';
    if (b->abort_after > 0 && b->n >= b->abort_after) {
        return 0;
    }
    return n;
}

/* HTTP request to 127.0.0.1:port; returns the status (0: transfer cut). body_out: T_BODY.
 * Thread-safe (one curl handle per call). */
static inline long http(unsigned port, const char *path, const char *post, const char *session,
                        size_t abort_after, long timeout_ms, char *body_out)
{
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = NULL;
    char url[256], sid[200];
    body_t b = {body_out, 0, abort_after};
    long status = 0;

    body_out[0] = '\0';
    snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (post != NULL) {
        hdr = curl_slist_append(hdr, "Content-Type: application/json");
        if (session != NULL) {
            snprintf(sid, sizeof(sid), "X-Session-Id: %s", session);
            hdr = curl_slist_append(hdr, sid);
        }
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, post);
    }
    if (curl_easy_perform(h) == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    }
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return status;
}

/* The value of metric `name` (a line "name value"; labels are part of the name) at
 * 127.0.0.1:port/metrics; -1 if absent or the node does not answer. */
static inline double metric(unsigned port, const char *name)
{
    char *body = malloc(T_BODY);
    double v = -1.0;
    size_t n = strlen(name);

    assert_non_null(body);
    if (http(port, "/metrics", NULL, NULL, 0, 5000, body) == 200) {
        for (char *line = body; line != NULL && *line != '\0';) {
            char *nl = strchr(line, '\n');
            if (strncmp(line, name, n) == 0 && line[n] == ' ') {
                v = atof(line + n + 1);
                break;
            }
            line = nl != NULL ? nl + 1 : NULL;
        }
    }
    free(body);
    return v;
}

/* Poll metric until it equals want or deadline_ms passes; returns the last value. */
static inline double await_metric(unsigned port, const char *name, double want,
                                  uint64_t deadline_ms)
{
    uint64_t end = tdm_clock_now_ns() + deadline_ms * TDM_NS_PER_MS;
    double v;

    do {
        v = metric(port, name);
    } while (v != want && tdm_clock_now_ns() < end);
    return v;
}

/* Start `tandem local`; returns 0 when it printed "ready:", else its exit status (> 0). A
 * non-NULL spec reaches the decode nodes as TANDEM_SPEC (their --spec flag). On success each
 * decode node's free-page count is recorded as its baseline (cluster_check_pages). */
static inline int cluster_start_spec(cluster_t *c, int n_prefill, int n_decode,
                                     const char *worker_model, int quiet_stderr, const char *spec)
{
    int fds[2];
    char line[512];
    char exe[T_PATH + 16], np[16], nd[16], lpt[16], pages[16], racks[16], routers[16];

    memset(c, 0, sizeof(*c));
    snprintf(exe, sizeof(exe), "%s/tandem", g_bin);
    snprintf(np, sizeof(np), "%d", n_prefill);
    snprintf(nd, sizeof(nd), "%d", n_decode);
    snprintf(lpt, sizeof(lpt), "%d", T_THRESHOLD);
    snprintf(pages, sizeof(pages), "%d", g_pages);
    snprintf(racks, sizeof(racks), "%d", g_racks);
    snprintf(routers, sizeof(routers), "%d", g_routers);
    assert_int_equal(pipe(fds), 0);
    c->launcher = fork();
    assert_true(c->launcher >= 0);
    if (c->launcher == 0) {
        char *argv[] = {"tandem",
                        "local",
                        "--model",
                        g_model,
                        "--prefill",
                        np,
                        "--decode",
                        nd,
                        "--http",
                        "127.0.0.1:0",
                        "--threads",
                        "1",
                        "--pages",
                        pages,
                        "--local-prefill-tokens",
                        lpt,
                        "--log-level",
                        "warn",
                        "--racks",
                        racks,
                        "--routers",
                        routers,
                        worker_model != NULL ? "--worker-model" : NULL,
                        (char *)worker_model,
                        NULL};
        if (spec != NULL && setenv("TANDEM_SPEC", spec, 1) != 0) {
            _exit(126);
        }
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        if (quiet_stderr) {
            if (freopen("/dev/null", "w", stderr) == NULL) {
                _exit(126);
            }
        }
        execv(exe, argv);
        _exit(127);
    }
    close(fds[1]);
    c->out = fdopen(fds[0], "r");
    for (int i = 0; i < T_MAX_CLUSTERS; i++) {
        if (g_running[i] == NULL) {
            g_running[i] = c;
            break;
        }
    }
    while (fgets(line, sizeof(line), c->out) != NULL) {
        int pid;
        unsigned port;
        if (sscanf(line, "started: role=router pid=%d health=127.0.0.1:%u", &pid, &port) == 2 &&
            c->n_routers < T_MAX_ROUTERS) {
            c->router_pid[c->n_routers] = pid;
            c->router_port[c->n_routers++] = port;
        } else if (sscanf(line, "started: role=decode pid=%d health=127.0.0.1:%u", &pid, &port) ==
                       2 &&
                   c->n_decode < T_MAX_WORKERS) {
            c->decode_pid[c->n_decode] = pid;
            c->decode_port[c->n_decode++] = port;
        } else if (sscanf(line, "started: role=prefill pid=%d health=127.0.0.1:%u", &pid, &port) ==
                       2 &&
                   c->n_prefill < T_MAX_WORKERS) {
            c->prefill_pid[c->n_prefill] = pid;
            c->prefill_port[c->n_prefill++] = port;
        } else if (sscanf(line, "exited: role=%*s pid=%d", &pid) == 1 &&
                   !cluster_announced(c, pid)) {
            c->stray_exits++; /* an exit named before (or without) its start */
        } else if (sscanf(line, "ready: http://127.0.0.1:%u", &port) == 1) {
            c->http_port = port;
            for (int i = 0; i < c->n_decode; i++) {
                c->decode_base_free[i] = metric(c->decode_port[i], "tandem_decode_free_pages");
            }
            return 0;
        }
    }
    {
        int status = 0;
        waitpid(c->launcher, &status, 0);
        fclose(c->out);
        c->launcher = 0;
        cluster_stop(c);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    }
}

static inline int cluster_start(cluster_t *c, int n_prefill, int n_decode, const char *worker_model,
                                int quiet_stderr)
{
    return cluster_start_spec(c, n_prefill, n_decode, worker_model, quiet_stderr, NULL);
}

/* Poll the router's /health until its body contains `needle`; returns the milliseconds that
 * took, or -1 when deadline_ms passed first. The last body goes to body_out (T_BODY). */
static inline double await_health(unsigned port, const char *needle, uint64_t deadline_ms,
                                  char *body_out)
{
    uint64_t t0 = tdm_clock_now_ns();
    uint64_t end = t0 + deadline_ms * TDM_NS_PER_MS;

    while (tdm_clock_now_ns() < end) {
        http(port, "/health", NULL, NULL, 0, 2000, body_out);
        if (strstr(body_out, needle) != NULL) {
            return (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
        }
    }
    return -1.0;
}

/*
 * cluster_check_pages - every decode node the test did not kill is back at its baseline: no
 * reservation left (awaited: a cancelled or orphaned reservation comes back after its fence)
 * and every page it had free when the cluster came up is free again or linked into a session
 * that stays resident after its turn (sessions are kept for their next turn; their pages are
 * the session's, not a leak). Prints the counts for the record, then asserts.
 */
static inline void cluster_check_pages(const cluster_t *c, const char *test)
{
    for (int i = 0; i < c->n_decode; i++) {
        uint64_t end = tdm_clock_now_ns() + T_PAGES_WAIT_MS * TDM_NS_PER_MS;
        unsigned port = c->decode_port[i];
        double reserved, n_free, n_session, n_sessions, extra;

        if (c->decode_killed[i]) {
            continue;
        }
        do {
            reserved = metric(port, "tandem_decode_reserved_pages");
            n_free = metric(port, "tandem_decode_free_pages");
            n_session = metric(port, "tandem_decode_session_pages");
            /* a page shared by k sessions counts k times in session_pages (issue 17) */
            extra = metric(port, "tandem_decode_shared_page_refs");
            n_session -= extra > 0 ? extra : 0;
        } while ((reserved != 0 || n_free + n_session != c->decode_base_free[i]) &&
                 tdm_clock_now_ns() < end);
        n_sessions = metric(port, "tandem_decode_resident_sessions");
        print_message("free pages: %s: decode node %d: before %.0f, after %.0f free + %.0f in "
                      "%.0f resident sessions = %.0f, reserved %.0f\n",
                      test, i, c->decode_base_free[i], n_free, n_session, n_sessions,
                      n_free + n_session, reserved);
        assert_true(c->decode_base_free[i] == g_pages);
        assert_true(reserved == 0);
        assert_true(n_free + n_session == c->decode_base_free[i]);
    }
}

/* "a,b,c" of n deterministic ids: (i * mul + add) % 1000 + 3. */
static inline void make_ids(char *out, size_t out_bytes, int n, int mul, int add)
{
    size_t used = 0;

    out[0] = '\0';
    for (int i = 0; i < n && used + 16 < out_bytes; i++) {
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%d", i > 0 ? "," : "",
                                 (i * mul + add) % 1000 + 3);
    }
}

/* Greedy continuation ids of tandem-generate --schedule ced for `ids`, as "a,b,c". */
static inline void generate_ids(const char *ids, int n, char *out, size_t out_bytes)
{
    char *cmd = malloc(T_BODY);
    FILE *p;
    size_t used = 0;
    int id;

    assert_non_null(cmd);
    snprintf(cmd, T_BODY,
             "%s/tandem-generate --model %s --prompt-ids %s --max-tokens %d --threads 1 "
             "--ignore-eos --output ids --schedule ced 2>/dev/null",
             g_bin, g_model, ids, n);
    p = popen(cmd, "r");
    assert_non_null(p);
    out[0] = '\0';
    while (fscanf(p, "%d", &id) == 1) {
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%d", used > 0 ? "," : "", id);
    }
    assert_int_equal(pclose(p), 0);
    free(cmd);
}

/* The body of a greedy completion of token ids (malloc'ed, T_BODY bytes). */
static inline char *completion_body(const char *ids, int max_tokens)
{
    char *body = malloc(T_BODY);

    assert_non_null(body);
    snprintf(body, T_BODY,
             "{\"model\":\"%s\",\"prompt\":[%s],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true}",
             T_MODEL_NAME, ids, max_tokens);
    return body;
}

/* A completion body (POST /v1/completions, X-Session-Id `session`) sent to the HTTP port `port`
 * on a plain socket, with "Connection: close" when close_after (the server then ends the
 * connection with its response, which marks the end of a stream); returns the socket, which the
 * caller reads and closes. */
static inline int post_on_socket(unsigned port, const char *session, const char *body,
                                 int close_after)
{
    struct sockaddr_in addr;
    char head[512];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    size_t n = strlen(body);
    int n_head;

    assert_true(fd >= 0);
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    n_head = snprintf(head, sizeof(head),
                      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Content-Type: application/json\r\nX-Session-Id: %s\r\n"
                      "%sContent-Length: %zu\r\n\r\n",
                      session, close_after ? "Connection: close\r\n" : "", n);
    assert_int_equal(write(fd, head, (size_t)n_head), n_head);
    assert_int_equal(write(fd, body, n), (ssize_t)n);
    return fd;
}

/* A client that sends a completion body (POST /v1/completions, X-Session-Id `session`) to the
 * router on a plain socket and leaves when the caller closes it: returns the socket. */
static inline int cluster_leaving_client(const cluster_t *c, const char *session, const char *body)
{
    return post_on_socket(c->http_port, session, body, 0);
}

/* The "text" value of a completion response (malloc'ed), or NULL when it has none. */
static inline char *response_text(const char *resp)
{
    const char *text = strstr(resp, "\"text\":\"");
    const char *end;
    char *out;

    if (text == NULL) {
        return NULL;
    }
    text += 8;
    end = strstr(text, "\",\"");
    if (end == NULL) {
        return NULL;
    }
    out = malloc((size_t)(end - text) + 1);
    assert_non_null(out);
    memcpy(out, text, (size_t)(end - text));
    out[end - text] = '\0';
    return out;
}

/* POST a greedy completion of token ids; returns the "text" value (malloc'ed). */
static inline char *complete(unsigned port, const char *session, const char *ids, int max_tokens)
{
    char *body = completion_body(ids, max_tokens), *resp = malloc(T_BODY), *text;
    long status;

    assert_non_null(resp);
    status = http(port, "/v1/completions", body, session, 0, 120000, resp);
    if (status != 200) {
        fail_msg("completion failed: status=%ld body=%s", status, resp);
    }
    text = response_text(resp);
    assert_non_null(text);
    free(body);
    free(resp);
    return text;
}

/*
 * Two greedy turns of one session, 8 tokens each (texts into *text1_out and *text2_out; caller
 * frees): n_first prompt ids, then that prompt, tandem-generate's 8 ids after it and n_more new
 * ids.
 */
static inline void two_turns(unsigned port, const char *session, int n_first, int n_more,
                             char **text1_out, char **text2_out)
{
    char *ids1 = malloc(T_BODY), *ids2 = malloc(T_BODY), *more = malloc(T_BODY);
    char gen[4096];

    assert_non_null(ids1);
    assert_non_null(ids2);
    assert_non_null(more);
    make_ids(ids1, T_BODY, n_first, 7, 3);
    *text1_out = complete(port, session, ids1, 8);
    generate_ids(ids1, 8, gen, sizeof(gen));
    make_ids(more, T_BODY, n_more, 13, 5);
    snprintf(ids2, T_BODY, "%s,%s,%s", ids1, gen, more);
    *text2_out = complete(port, session, ids2, 8);
    free(more);
    free(ids2);
    free(ids1);
}

/* Asserts that two runs of two_turns gave the same texts (a1 as b1, a2 as b2); frees all four. */
static inline void expect_same_turns(char *a1, char *a2, char *b1, char *b2)
{
    assert_string_equal(a1, b1);
    assert_string_equal(a2, b2);
    free(a1);
    free(a2);
    free(b1);
    free(b2);
}

/* POSTs a streamed greedy completion of 64 tokens after ids and leaves after leave_ms (curl gives
 * up); resp (T_BODY bytes) gets what came before. */
static inline void leave_streamed_completion(unsigned port, const char *session, const char *ids,
                                             long leave_ms, char *resp)
{
    char *body = malloc(T_BODY);

    assert_non_null(body);
    snprintf(body, T_BODY,
             "{\"model\":\"%s\",\"prompt\":[%s],\"max_tokens\":64,\"temperature\":0,"
             "\"stream\":true}",
             T_MODEL_NAME, ids);
    http(port, "/v1/completions", body, session, 0, leave_ms, resp);
    free(body);
}

/* A completion running on its own thread (complete_start .. complete_join). */
typedef struct {
    unsigned port;
    const char *session;
    char *body; /* request, owned */
    char *resp; /* response, owned */
    long status;
    pthread_t thread;
} async_completion_t;

static inline void *async_completion_run(void *arg)
{
    async_completion_t *a = arg;

    a->status = http(a->port, "/v1/completions", a->body, a->session, 0, 300000, a->resp);
    return NULL;
}

/* Start a greedy completion of `ids` on a thread; session is borrowed until the join. */
static inline void complete_start(async_completion_t *a, unsigned port, const char *session,
                                  const char *ids, int max_tokens)
{
    memset(a, 0, sizeof(*a));
    a->port = port;
    a->session = session;
    a->body = completion_body(ids, max_tokens);
    a->resp = malloc(T_BODY);
    assert_non_null(a->resp);
    assert_int_equal(pthread_create(&a->thread, NULL, async_completion_run, a), 0);
}

/* Wait for the completion; returns its text (malloc'ed) after asserting status 200. */
static inline char *complete_join(async_completion_t *a)
{
    char *text;

    assert_int_equal(pthread_join(a->thread, NULL), 0);
    if (a->status != 200) {
        fail_msg("completion failed: status=%ld body=%s", a->status, a->resp);
    }
    text = response_text(a->resp);
    assert_non_null(text);
    free(a->body);
    free(a->resp);
    return text;
}

#endif
