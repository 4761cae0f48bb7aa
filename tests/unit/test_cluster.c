/* test_cluster.c - end-to-end tests of a local cluster (tools/tandem local: tandem-router,
 * tandem-prefill, tandem-decode as separate processes on loopback) on the tiny preset:
 * disaggregated turns token-identical to tandem-generate --schedule ced and to colocated service,
 * the second turn of a session prefilling only its new tokens, a cancelled turn giving its
 * reserved pages back, a SIGKILLed decode node detected and its session rebuilt elsewhere, a
 * worker of another model refused at registration, a decode node with --spec ngram giving the
 * same greedy tokens as one without and counting its drafts on /metrics. No sleeps as
 * synchronisation: every wait is a poll of /health or /metrics against a deadline, or a blocking
 * read of the launcher's output.
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"

#define T_PATH 1024
#define T_BODY (1u << 20)
#define T_MAX_WORKERS 8
#define T_NS_PER_MS 1000000ull
#define T_THRESHOLD 32 /* --local-prefill-tokens in these tests */

typedef struct {
    pid_t launcher;
    FILE *out;
    unsigned http_port;
    pid_t decode_pid[T_MAX_WORKERS];
    unsigned decode_port[T_MAX_WORKERS];
    int n_decode;
    unsigned prefill_port[T_MAX_WORKERS];
    int n_prefill;
} cluster_t;

/* Clusters started and not yet stopped: a failed assertion jumps out of a test, so the group
 * teardown stops whatever is left (never a leaked process tree). */
static cluster_t *g_running[4];
static char g_bin[T_PATH];
static char g_model[T_PATH];
static char g_model2[T_PATH];

static void run_or_fail(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0) {
        fail_msg("command failed (%d): %s", rc, cmd);
    }
}

static int setup_models(void **state)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char cmd[3 * T_PATH];

    (void)state;
    if (bin == NULL || tmp == NULL) {
        return -1;
    }
    snprintf(g_bin, sizeof(g_bin), "%s", bin);
    snprintf(g_model, sizeof(g_model), "%s/cluster-tiny-1", tmp);
    snprintf(g_model2, sizeof(g_model2), "%s/cluster-tiny-2", tmp);
    snprintf(cmd, sizeof(cmd),
             "%s/tandem-mkmodel --preset tiny --seed 1 --out %s >/dev/null 2>&1 && "
             "%s/tandem-mkmodel --preset tiny --seed 2 --out %s >/dev/null 2>&1",
             bin, g_model, bin, g_model2);
    run_or_fail(cmd);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static void cluster_stop(cluster_t *c);

/* After each test: stop any cluster a failed assertion left running. */
static int stop_leftovers(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++) {
        if (g_running[i] != NULL) {
            cluster_stop(g_running[i]);
        }
    }
    return 0;
}

static int teardown_models(void **state)
{
    (void)state;
    curl_global_cleanup();
    return 0;
}

/* Start `tandem local`; returns 0 when it printed "ready:", else its exit status (> 0). A
 * non-NULL spec reaches the decode nodes as TANDEM_SPEC (their --spec flag). */
static int cluster_start_spec(cluster_t *c, int n_prefill, int n_decode, const char *worker_model,
                              int quiet_stderr, const char *spec)
{
    int fds[2];
    char line[512];
    char exe[T_PATH + 16], np[16], nd[16], lpt[16];

    memset(c, 0, sizeof(*c));
    snprintf(exe, sizeof(exe), "%s/tandem", g_bin);
    snprintf(np, sizeof(np), "%d", n_prefill);
    snprintf(nd, sizeof(nd), "%d", n_decode);
    snprintf(lpt, sizeof(lpt), "%d", T_THRESHOLD);
    assert_int_equal(pipe(fds), 0);
    c->launcher = fork();
    assert_true(c->launcher >= 0);
    if (c->launcher == 0) {
        char *argv[] = {"tandem", "local", "--model", g_model, "--prefill", np, "--decode", nd,
                        "--http", "127.0.0.1:0", "--threads", "1", "--pages", "1024",
                        "--local-prefill-tokens", lpt, "--log-level", "warn",
                        worker_model != NULL ? "--worker-model" : NULL, (char *)worker_model,
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
    for (int i = 0; i < 4; i++) {
        if (g_running[i] == NULL) {
            g_running[i] = c;
            break;
        }
    }
    while (fgets(line, sizeof(line), c->out) != NULL) {
        int pid;
        unsigned port;
        if (sscanf(line, "started: role=decode pid=%d health=127.0.0.1:%u", &pid, &port) == 2) {
            c->decode_pid[c->n_decode] = pid;
            c->decode_port[c->n_decode++] = port;
        } else if (sscanf(line, "started: role=prefill pid=%d health=127.0.0.1:%u", &pid,
                          &port) == 2) {
            c->prefill_port[c->n_prefill++] = port;
        } else if (sscanf(line, "ready: http://127.0.0.1:%u", &port) == 1) {
            c->http_port = port;
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

static int cluster_start(cluster_t *c, int n_prefill, int n_decode, const char *worker_model,
                         int quiet_stderr)
{
    return cluster_start_spec(c, n_prefill, n_decode, worker_model, quiet_stderr, NULL);
}

static void cluster_stop(cluster_t *c)
{
    int status = 0;

    for (int i = 0; i < 4; i++) {
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

typedef struct {
    char *buf;
    size_t n;
    size_t abort_after; /* > 0: fail the transfer once this many bytes arrived (client leaves) */
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
    if (b->abort_after > 0 && b->n >= b->abort_after) {
        return 0;
    }
    return n;
}

/* HTTP request to 127.0.0.1:port; returns the status (0: transfer cut). body_out: T_BODY. */
static long http(unsigned port, const char *path, const char *post, const char *session,
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

/* The value of metric `name` (a line "name value") at 127.0.0.1:port/metrics; -1 if absent. */
static double metric(unsigned port, const char *name)
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
static double await_metric(unsigned port, const char *name, double want, uint64_t deadline_ms)
{
    uint64_t end = tdm_clock_now_ns() + deadline_ms * T_NS_PER_MS;
    double v;

    do {
        v = metric(port, name);
    } while (v != want && tdm_clock_now_ns() < end);
    return v;
}

/* "a,b,c" of n deterministic ids from `seed`. */
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
             "{\"model\":\"cluster-tiny-1\",\"prompt\":[%s],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true}",
             ids, max_tokens);
    status = http(port, "/v1/completions", body, session, 0, 120000, resp);
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

/* Two turns of one session; the texts go to text1/text2 (caller frees). */
static void two_turns(unsigned port, const char *session, char **text1, char **text2,
                      char *ids1, char *ids2, size_t ids_bytes)
{
    char gen[4096], more[4096];

    make_ids(ids1, ids_bytes, 100, 7, 3);
    *text1 = complete(port, session, ids1, 8);
    generate_ids(ids1, 8, gen, sizeof(gen));
    make_ids(more, sizeof(more), 60, 13, 5);
    snprintf(ids2, ids_bytes, "%s,%s,%s", ids1, gen, more);
    *text2 = complete(port, session, ids2, 8);
}

static void test_disaggregated_turns_match_generate_and_colocated(void **state)
{
    char *ids1 = malloc(T_BODY), *ids2 = malloc(T_BODY);
    char *d1, *d2, *c1, *c2;
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    double prefilled, local_tokens;
    uint64_t t0;

    (void)state;
    /* Disaggregated: 1 prefill + 1 decode; both deltas (100, then 61 new) exceed the threshold. */
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    t0 = tdm_clock_now_ns();
    two_turns(c.http_port, "dis-1", &d1, &d2, ids1, ids2, T_BODY);
    print_message("disaggregated two turns: %.1f ms\n",
                  (double)(tdm_clock_now_ns() - t0) / T_NS_PER_MS);
    prefilled = metric(c.prefill_port[0], "tandem_prefill_tokens_total");
    local_tokens = metric(c.decode_port[0], "tandem_decode_local_prefill_tokens_total");
    assert_true(metric(c.prefill_port[0], "tandem_prefill_pulled_pages_total") > 0);
    assert_true(metric(c.decode_port[0], "tandem_decode_handoffs_total") == 2);
    cluster_stop(&c);
    /* The second turn prefilled only its new tokens: 100 + (8 generated - 1 cached + 60). */
    assert_true(prefilled == 100 + 61);
    assert_true(local_tokens == 0);
    /* Colocated: no prefill node; the decode node prefills both deltas (canonical start). */
    assert_int_equal(cluster_start(&c, 0, 1, NULL, 0), 0);
    two_turns(c.http_port, "col-1", &c1, &c2, ids1, ids2, T_BODY);
    assert_true(metric(c.decode_port[0], "tandem_decode_local_prefill_tokens_total") == 100 + 61);
    cluster_stop(&c);
    assert_string_equal(d1, c1);
    assert_string_equal(d2, c2);
    free(d1);
    free(d2);
    free(c1);
    free(c2);
    free(ids1);
    free(ids2);
}

static void test_first_turn_matches_generate_ced(void **state)
{
    char ids[4096], gen[4096], want[4096];
    char *text;
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */

    (void)state;
    /* Token ids come back through the detokenizer: compare via a second greedy request whose
     * prompt is the first prompt plus tandem-generate's ids; identical ids give identical text. */
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    make_ids(ids, sizeof(ids), 80, 11, 9);
    generate_ids(ids, 6, gen, sizeof(gen));
    text = complete(c.http_port, "ced-1", ids, 6);
    snprintf(want, sizeof(want), "%s", text);
    free(text);
    text = complete(c.http_port, "ced-2", ids, 6);
    assert_string_equal(text, want);
    free(text);
    cluster_stop(&c);
    assert_true(strlen(gen) > 0);
}

static void test_cancelled_turn_returns_reserved_pages(void **state)
{
    char ids[16384], *body = malloc(T_BODY), *resp = malloc(T_BODY);
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    double base_free, free_after, reserved_after;

    (void)state;
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    base_free = metric(c.decode_port[0], "tandem_decode_free_pages");
    assert_true(metric(c.decode_port[0], "tandem_decode_session_pages") == 0);
    make_ids(ids, sizeof(ids), 600, 17, 1);
    snprintf(body, T_BODY,
             "{\"model\":\"cluster-tiny-1\",\"prompt\":[%s],\"max_tokens\":64,\"temperature\":0,"
             "\"stream\":true}",
             ids);
    /* The client leaves during the prefill: curl gives up after 150 ms. */
    http(c.http_port, "/v1/completions", body, "cancel-1", 0, 150, resp);
    /* Reserved pages come back after the fence; a session that got its handoff before the
     * client left stays resident (its pages are the session's, not a leak). */
    reserved_after = await_metric(c.decode_port[0], "tandem_decode_reserved_pages", 0, 20000);
    free_after = metric(c.decode_port[0], "tandem_decode_free_pages") +
                 metric(c.decode_port[0], "tandem_decode_session_pages");
    print_message("free pages: baseline %.0f, after the cancelled turn (free + session) %.0f\n", base_free,
                  free_after);
    cluster_stop(&c);
    assert_true(reserved_after == 0);
    assert_true(free_after == base_free);
    free(body);
    free(resp);
}

static void test_killed_decode_node_is_detected_and_session_rebuilt(void **state)
{
    char ids[4096], gen[4096], ids2[16384], *resp = malloc(T_BODY);
    char *text;
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    int victim = -1;
    uint64_t t_kill, end;
    double lost_ms = -1;

    (void)state;
    assert_int_equal(cluster_start(&c, 0, 2, NULL, 0), 0);
    make_ids(ids, sizeof(ids), 40, 3, 7);
    text = complete(c.http_port, "kill-1", ids, 4);
    free(text);
    for (int i = 0; i < c.n_decode; i++) {
        if (metric(c.decode_port[i], "tandem_decode_resident_sessions") == 1) {
            victim = i;
        }
    }
    assert_true(victim >= 0);
    kill(c.decode_pid[victim], SIGKILL);
    t_kill = tdm_clock_now_ns();
    end = t_kill + 10000 * T_NS_PER_MS;
    while (tdm_clock_now_ns() < end) {
        http(c.http_port, "/health", NULL, NULL, 0, 2000, resp);
        if (strstr(resp, "\"workers_lost_total\":1") != NULL) {
            lost_ms = (double)(tdm_clock_now_ns() - t_kill) / T_NS_PER_MS;
            break;
        }
    }
    print_message("decode node loss reported after %.0f ms\n", lost_ms);
    assert_true(lost_ms >= 0 && lost_ms < 3000);
    generate_ids(ids, 4, gen, sizeof(gen));
    snprintf(ids2, sizeof(ids2), "%s,%s,5,6,7,8", ids, gen);
    text = complete(c.http_port, "kill-1", ids2, 4);
    assert_true(metric(c.decode_port[1 - victim], "tandem_decode_resident_sessions") == 1);
    free(text);
    cluster_stop(&c);
    free(resp);
}

/* Two greedy turns, texts into t1/t2 (caller frees): the first prompt is P, its greedy
 * continuation G, then P again (the model continues the second P as it did the first, so the
 * n-gram drafter has drafts to offer once the prompt is in its history); the second has 20 ids
 * (below the threshold: prefilled on the decode node). */
static void spec_turns(const cluster_t *c, char **t1, char **t2)
{
    char p[2048], g[2048], ids[6144];

    make_ids(p, sizeof(p), 100, 100, 7);
    generate_ids(p, 24, g, sizeof(g));
    snprintf(ids, sizeof(ids), "%s,%s,%s", p, g, p);
    *t1 = complete(c->http_port, "spec-1", ids, 24);
    make_ids(ids, sizeof(ids), 20, 17, 1);
    *t2 = complete(c->http_port, "spec-2", ids, 24);
}

static void test_spec_ngram_decode_node_matches_spec_off(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *off1, *off2, *ng1, *ng2;
    char *col1, *col2;
    double steps, drafted, verified, accepted, emitted;

    (void)state;
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, "off"), 0);
    spec_turns(&c, &off1, &off2);
    assert_true(metric(c.decode_port[0], "tandem_spec_steps_total{drafter=\"ngram\"}") == 0);
    cluster_stop(&c);
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, "ngram"), 0);
    spec_turns(&c, &ng1, &ng2);
    steps = metric(c.decode_port[0], "tandem_spec_steps_total{drafter=\"ngram\"}");
    drafted = metric(c.decode_port[0], "tandem_spec_drafted_tokens_total{drafter=\"ngram\"}");
    verified = metric(c.decode_port[0], "tandem_spec_verified_tokens_total{drafter=\"ngram\"}");
    accepted = metric(c.decode_port[0], "tandem_spec_accepted_tokens_total{drafter=\"ngram\"}");
    emitted = metric(c.decode_port[0], "tandem_spec_emitted_tokens_total{drafter=\"ngram\"}");
    print_message("ngram: steps=%.0f drafted=%.0f verified=%.0f accepted=%.0f emitted=%.0f "
                  "rate=%.3f mean_len=%.3f\n",
                  steps, drafted, verified, accepted, emitted,
                  metric(c.decode_port[0], "tandem_spec_acceptance_rate{drafter=\"ngram\"}"),
                  metric(c.decode_port[0], "tandem_spec_mean_accepted_length{drafter=\"ngram\"}"));
    cluster_stop(&c);
    /* Disaggregated: the first turn's prompt came from the prefill node, so the drafter saw only
     * the ids the sequence keeps. Both turns decode 23 tokens after the first (sampled by the
     * prefill): every one came out of a speculative step, and the counters are consistent. */
    assert_true(emitted == 2 * 23);
    assert_true(steps > 0 && steps <= emitted);
    assert_true(verified <= drafted && accepted <= verified);
    assert_true(emitted == steps + accepted);
    assert_string_equal(ng1, off1);
    assert_string_equal(ng2, off2);
    /* Colocated: the decode node prefills the whole prompt, the drafter looks it up and drafts. */
    assert_int_equal(cluster_start_spec(&c, 0, 1, NULL, 0, "ngram"), 0);
    spec_turns(&c, &col1, &col2);
    drafted = metric(c.decode_port[0], "tandem_spec_drafted_tokens_total{drafter=\"ngram\"}");
    verified = metric(c.decode_port[0], "tandem_spec_verified_tokens_total{drafter=\"ngram\"}");
    accepted = metric(c.decode_port[0], "tandem_spec_accepted_tokens_total{drafter=\"ngram\"}");
    print_message("ngram colocated: drafted=%.0f verified=%.0f accepted=%.0f\n", drafted,
                  verified, accepted);
    cluster_stop(&c);
    assert_true(drafted > 0 && accepted > 0);
    assert_true(verified <= drafted && accepted <= verified);
    assert_string_equal(col1, off1);
    assert_string_equal(col2, off2);
    free(col1);
    free(col2);
    free(off1);
    free(off2);
    free(ng1);
    free(ng2);
}

static void test_worker_of_another_model_is_refused(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */

    (void)state;
    assert_int_equal(cluster_start(&c, 0, 1, g_model2, 1), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_worker_of_another_model_is_refused, stop_leftovers),
        cmocka_unit_test_teardown(test_first_turn_matches_generate_ced, stop_leftovers),
        cmocka_unit_test_teardown(test_disaggregated_turns_match_generate_and_colocated, stop_leftovers),
        cmocka_unit_test_teardown(test_cancelled_turn_returns_reserved_pages, stop_leftovers),
        cmocka_unit_test_teardown(test_spec_ngram_decode_node_matches_spec_off, stop_leftovers),
        cmocka_unit_test_teardown(test_killed_decode_node_is_detected_and_session_rebuilt, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
