/* test_cluster_chunks.c - the prefill node's per-chunk puts (prefill-node/job.c) end to end, on
 * a local cluster of the tiny preset (tools/tandem local: router, 1 prefill node, 1 decode node
 * as separate processes on loopback) with small prefill chunks (TANDEM_CHUNK_TOKENS=32, the
 * --chunk-tokens fallback every node and tandem-generate read), so that a delta of a few hundred
 * tokens completes pages chunk after chunk:
 *  - two disaggregated turns of one session (the second's first reserved page is partly filled
 *    from the history) put most of their pages while the prefill still computes
 *    (tandem_prefill_chunk_puts_total, tandem_prefill_chunk_put_pages_total), the rest (each
 *    source's last page) after it, and give text identical to tandem-generate --schedule ced and
 *    to colocated service; the decode node's pages are all back (free + session = baseline, none
 *    reserved);
 *  - a client that leaves during such a prefill leaves no reserved page behind, and the prefill
 *    node serves the next request.
 * No sleeps as synchronisation: every wait is a poll of /metrics against a deadline, or a
 * blocking read of the launcher's output.
 */
#include <curl/curl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"

#define T_PATH 1024
#define T_BODY (1u << 20)
#define T_MAX_WORKERS 4
#define T_NS_PER_MS 1000000ull
#define T_THRESHOLD "32" /* --local-prefill-tokens */
#define T_CHUNK "32"     /* TANDEM_CHUNK_TOKENS: prefill chunk of every node and of generate */
#define T_MODEL "cluster-chunks-tiny"

typedef struct {
    pid_t launcher;
    FILE *out;
    unsigned http_port;
    unsigned decode_port[T_MAX_WORKERS];
    int n_decode;
    unsigned prefill_port[T_MAX_WORKERS];
    int n_prefill;
} cluster_t;

static cluster_t *g_running; /* the cluster a failed assertion may leave running */
static char g_bin[T_PATH];
static char g_model[T_PATH];

static void cluster_stop(cluster_t *c)
{
    int status = 0;

    if (g_running == c) {
        g_running = NULL;
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

static int setup_models(void **state)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char cmd[3 * T_PATH];

    (void)state;
    if (bin == NULL || tmp == NULL || setenv("TANDEM_CHUNK_TOKENS", T_CHUNK, 1) != 0) {
        return -1;
    }
    snprintf(g_bin, sizeof(g_bin), "%s", bin);
    snprintf(g_model, sizeof(g_model), "%s/%s", tmp, T_MODEL);
    snprintf(cmd, sizeof(cmd), "%s/tandem-mkmodel --preset tiny --seed 3 --out %s >/dev/null 2>&1",
             bin, g_model);
    if (system(cmd) != 0) {
        return -1;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static int teardown_models(void **state)
{
    (void)state;
    curl_global_cleanup();
    return 0;
}

/* After each test: stop a cluster a failed assertion left running. */
static int stop_leftovers(void **state)
{
    (void)state;
    if (g_running != NULL) {
        cluster_stop(g_running);
    }
    return 0;
}

/* Start `tandem local` with n_prefill prefill nodes and one decode node; 0 once "ready:". */
static int cluster_start(cluster_t *c, int n_prefill)
{
    int fds[2];
    char line[512];
    char exe[T_PATH + 16], np[16];

    memset(c, 0, sizeof(*c));
    snprintf(exe, sizeof(exe), "%s/tandem", g_bin);
    snprintf(np, sizeof(np), "%d", n_prefill);
    assert_int_equal(pipe(fds), 0);
    c->launcher = fork();
    assert_true(c->launcher >= 0);
    if (c->launcher == 0) {
        char *argv[] = {"tandem", "local", "--model", g_model, "--prefill", np, "--decode", "1",
                        "--http", "127.0.0.1:0", "--threads", "1", "--pages", "1024",
                        "--local-prefill-tokens", T_THRESHOLD, "--log-level", "warn", NULL};
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execv(exe, argv);
        _exit(127);
    }
    close(fds[1]);
    c->out = fdopen(fds[0], "r");
    g_running = c;
    while (fgets(line, sizeof(line), c->out) != NULL) {
        int pid;
        unsigned port;
        if (sscanf(line, "started: role=decode pid=%d health=127.0.0.1:%u", &pid, &port) == 2 &&
            c->n_decode < T_MAX_WORKERS) {
            c->decode_port[c->n_decode++] = port;
        } else if (sscanf(line, "started: role=prefill pid=%d health=127.0.0.1:%u", &pid,
                          &port) == 2 &&
                   c->n_prefill < T_MAX_WORKERS) {
            c->prefill_port[c->n_prefill++] = port;
        } else if (sscanf(line, "ready: http://127.0.0.1:%u", &port) == 1) {
            c->http_port = port;
            return 0;
        }
    }
    cluster_stop(c);
    return 1;
}

typedef struct {
    char *buf;
    size_t n;
} body_t;

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    body_t *b = arg;
    size_t n = size * nmemb;

    if (b->n + n >= T_BODY) {
        return 0;
    }
    memcpy(b->buf + b->n, data, n);
    b->n += n;
    b->buf[b->n] = '\0';
    return n;
}

/* HTTP request to 127.0.0.1:port; returns the status (0: transfer cut or timed out). */
static long http(unsigned port, const char *path, const char *post, const char *session,
                 long timeout_ms, char *body_out)
{
    CURL *h = curl_easy_init();
    struct curl_slist *hdr = NULL;
    char url[256], sid[200];
    body_t b = {body_out, 0};
    long status = 0;

    body_out[0] = '\0';
    snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
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

/* The value of metric `name` at 127.0.0.1:port/metrics; -1 if absent. */
static double metric(unsigned port, const char *name)
{
    char *body = malloc(T_BODY);
    double v = -1.0;
    size_t n = strlen(name);

    assert_non_null(body);
    if (http(port, "/metrics", NULL, NULL, 5000, body) == 200) {
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
static double await_metric(unsigned port, const char *name, double want, uint64_t deadline_ms)
{
    uint64_t end = tdm_clock_now_ns() + deadline_ms * T_NS_PER_MS;
    double v;

    do {
        v = metric(port, name);
    } while (v != want && tdm_clock_now_ns() < end);
    return v;
}

/* "a,b,c" of n deterministic ids. */
static void make_ids(char *out, size_t out_bytes, int n, int mul, int add)
{
    size_t used = 0;

    out[0] = '\0';
    for (int i = 0; i < n && used + 16 < out_bytes; i++) {
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%d", i > 0 ? "," : "",
                                 (i * mul + add) % 1000 + 3);
    }
}

/* Greedy continuation ids of tandem-generate --schedule ced for `ids`, as "a,b,c". */
static void generate_ids(const char *ids, int n, char *out, size_t out_bytes)
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

/* POST a greedy completion of token ids; returns the "text" value (malloc'ed). */
static char *complete(unsigned port, const char *session, const char *ids, int max_tokens)
{
    char *body = malloc(T_BODY), *resp = malloc(T_BODY), *text, *end;
    long status;

    assert_non_null(body);
    assert_non_null(resp);
    snprintf(body, T_BODY,
             "{\"model\":\"" T_MODEL "\",\"prompt\":[%s],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true}",
             ids, max_tokens);
    status = http(port, "/v1/completions", body, session, 300000, resp);
    if (status != 200) {
        fail_msg("completion failed: status=%ld body=%s", status, resp);
    }
    text = strstr(resp, "\"text\":\"");
    assert_non_null(text);
    text += 8;
    end = strstr(text, "\",\"");
    assert_non_null(end);
    *end = '\0';
    text = strdup(text);
    free(body);
    free(resp);
    return text;
}

/*
 * Two turns of one session (texts into t1/t2, caller frees): 400 prompt ids (tiny: 200 rows of
 * the ratio-2 source, 3 full pages and one of 8 rows; 400 rows of the ratio-1 source, 6 full
 * pages and one of 16 rows), 8 generated, then the history, tandem-generate's 8 ids and 300
 * more (the ratio-2 source's first reserved page starts at row 203 and fills at 256).
 */
static void two_turns(unsigned port, const char *session, char **t1, char **t2, char *ids2,
                      size_t ids2_bytes)
{
    char ids1[8192], gen[1024], more[8192];

    make_ids(ids1, sizeof(ids1), 400, 7, 3);
    *t1 = complete(port, session, ids1, 8);
    generate_ids(ids1, 8, gen, sizeof(gen));
    make_ids(more, sizeof(more), 300, 13, 5);
    snprintf(ids2, ids2_bytes, "%s,%s,%s", ids1, gen, more);
    *t2 = complete(port, session, ids2, 8);
}

static void test_chunk_puts_overlap_and_match_colocated(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *ids2 = malloc(T_BODY);
    char *d1, *d2, *c1, *c2;
    double base_free, free_after, reserved_after, chunk_puts, early_pages, put_pages;
    double prefilled, handoffs;

    (void)state;
    assert_non_null(ids2);
    /* Disaggregated. */
    assert_int_equal(cluster_start(&c, 1), 0);
    base_free = metric(c.decode_port[0], "tandem_decode_free_pages");
    two_turns(c.http_port, "chunks-dis", &d1, &d2, ids2, T_BODY);
    chunk_puts = metric(c.prefill_port[0], "tandem_prefill_chunk_puts_total");
    early_pages = metric(c.prefill_port[0], "tandem_prefill_chunk_put_pages_total");
    put_pages = metric(c.prefill_port[0], "tandem_prefill_put_pages_total");
    prefilled = metric(c.prefill_port[0], "tandem_prefill_tokens_total");
    handoffs = metric(c.decode_port[0], "tandem_decode_handoffs_total");
    reserved_after = await_metric(c.decode_port[0], "tandem_decode_reserved_pages", 0, 20000);
    free_after = metric(c.decode_port[0], "tandem_decode_free_pages") +
                 metric(c.decode_port[0], "tandem_decode_session_pages");
    print_message("chunk puts: batches=%.0f pages during compute=%.0f of %.0f put; "
                  "prefilled=%.0f handoffs=%.0f; free pages: baseline %.0f, after %.0f\n",
                  chunk_puts, early_pages, put_pages, prefilled, handoffs, base_free, free_after);
    cluster_stop(&c);
    assert_true(handoffs == 2);
    /* The second prompt carries tandem-generate's 8 ids after the first: the decode node's
     * cached history (the prompt and the first 7 generated tokens; the 8th was sampled, never
     * run) matches it, and the second delta is the 8th plus the 300 new tokens, only if the
     * first turn's tokens were generate's --schedule ced tokens. */
    assert_true(prefilled == 400 + 301);
    /* Turn 1 completes 3 + 6 pages before its last chunk (6 batches, at tokens 64, 128, ..,
     * 384); turn 2 (T = 708) completes 2 + 5 (its partly filled first pages among them; 5
     * batches). Every batch posted mid-compute carries a page, and each source's last page of
     * each turn is put only after the compute (2 + 2). */
    assert_true(chunk_puts >= 4);
    assert_true(early_pages >= chunk_puts);
    assert_true(early_pages >= 9 + 4);
    assert_true(put_pages >= early_pages + 4);
    assert_true(reserved_after == 0);
    assert_true(free_after == base_free);
    /* Colocated: the decode node prefills both deltas (canonical start, same chunk size). */
    assert_int_equal(cluster_start(&c, 0), 0);
    two_turns(c.http_port, "chunks-col", &c1, &c2, ids2, T_BODY);
    cluster_stop(&c);
    assert_string_equal(d1, c1);
    assert_string_equal(d2, c2);
    free(d1);
    free(d2);
    free(c1);
    free(c2);
    free(ids2);
}

static void test_client_leaving_mid_prefill_returns_reserved_pages(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char ids[8192], *body = malloc(T_BODY), *resp = malloc(T_BODY), *text;
    double base_free, free_after, reserved_after;

    (void)state;
    assert_non_null(body);
    assert_non_null(resp);
    assert_int_equal(cluster_start(&c, 1), 0);
    base_free = metric(c.decode_port[0], "tandem_decode_free_pages");
    make_ids(ids, sizeof(ids), 900, 17, 1);
    snprintf(body, T_BODY,
             "{\"model\":\"" T_MODEL "\",\"prompt\":[%s],\"max_tokens\":64,\"temperature\":0,"
             "\"stream\":true}",
             ids);
    /* The client leaves during the prefill (a 900-token delta in 29 chunks of 32). */
    http(c.http_port, "/v1/completions", body, "chunks-cancel", 300, resp);
    reserved_after = await_metric(c.decode_port[0], "tandem_decode_reserved_pages", 0, 30000);
    free_after = metric(c.decode_port[0], "tandem_decode_free_pages") +
                 metric(c.decode_port[0], "tandem_decode_session_pages");
    print_message("client left mid-prefill: free pages baseline %.0f, after (free + session) "
                  "%.0f; jobs=%.0f aborted=%.0f chunk put pages=%.0f\n",
                  base_free, free_after, metric(c.prefill_port[0], "tandem_prefill_jobs_total"),
                  metric(c.prefill_port[0], "tandem_prefill_jobs_aborted_total"),
                  metric(c.prefill_port[0], "tandem_prefill_chunk_put_pages_total"));
    assert_true(reserved_after == 0);
    assert_true(free_after == base_free);
    /* The prefill node still serves: a fresh 200-token turn is handed off. */
    make_ids(ids, sizeof(ids), 200, 5, 2);
    text = complete(c.http_port, "chunks-after", ids, 4);
    assert_true(metric(c.decode_port[0], "tandem_decode_handoffs_total") >= 1);
    free(text);
    cluster_stop(&c);
    free(body);
    free(resp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_chunk_puts_overlap_and_match_colocated, stop_leftovers),
        cmocka_unit_test_teardown(test_client_leaving_mid_prefill_returns_reserved_pages,
                                  stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
