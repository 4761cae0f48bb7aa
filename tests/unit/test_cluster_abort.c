/* test_cluster_abort.c - page ownership against a writer that is slow or paused (docs/PROTOCOL.md
 * 4 and 4a), on a local cluster (tools/tandem local, tiny preset: one prefill node, one decode
 * node). A prompt's prefill job is caught running on the prefill node, then
 *  - slow writer: its client leaves once the node has computed the job's first step (read off
 *    the node, not timed: the job's speed varies with the machine and its load); the router aborts
 *    the job by its attempt, the prefill node stops putting at its next layer and acknowledges,
 *    the decode node frees the reservation on that word (its timer fence is set far past the
 *    test), and a request racing for the pages right after gives the text of a clean run;
 *  - paused writer: the prefill node is SIGSTOPped mid-job until the router has declared it lost,
 *    retried the turn on the decode node and the reservation's pages went back to the pool; a
 *    second request then takes pages while the writer is resumed (SIGCONT): the writer's lease
 *    has lapsed, so it puts nothing more, and both requests give the text of a clean run, at
 *    temperature 0 and at temperature 0.8 with a seed; the same when the writer is paused before
 *    its job arrives (the job waits in its socket: work received across a pause is void).
 * Each test ends with the decode node's pages back at their baseline (printed). Old code: the
 * resumed writer went on putting into pages that were no longer its reservation's.
 */
#define T_MODEL_PREFIX "cluster-abort"
#include "test_cluster_harness.h"

#define T_PROMPT_TOKENS                                                                            \
    1500 /* long enough that a prefill job is caught running (ASan: seconds)                       \
          */
/* A's prompt in the slow-writer test: 24 prefill steps of 256 tokens (--chunk-tokens). The
 * router asks a waiting turn whether its client is gone only every ROUTER_TURN_WATCH_MS (100 ms),
 * so the abort reaches the node up to ~100 ms after the client leaves: the 23 steps left after
 * the first outlast that ten times over (1.1 s of the 1.15 s job on an idle 2-core AVX-512 box,
 * 2026-12-04; more under load or ASan). A 1500-token job left by a clean run's clock had one
 * step, ~30 ms, to go when the clean run had been slower, and finished before the abort came. */
#define T_SLOW_PROMPT_TOKENS 6144
#define T_MAX_TOKENS         24
#define T_FIND_MS            60000

/* A completion body of token ids; temperature 0 (greedy) or 0.8 with seed 7. */
static char *body_of(const char *ids, int max_tokens, int sampled)
{
    char *body = malloc(T_BODY);

    assert_non_null(body);
    snprintf(body, T_BODY,
             "{\"model\":\"%s\",\"prompt\":[%s],\"max_tokens\":%d,\"temperature\":%s,"
             "\"seed\":7,\"ignore_eos\":true}",
             T_MODEL_NAME, ids, max_tokens, sampled ? "0.8" : "0");
    return body;
}

/* POST body on session; returns the text (malloc'ed), asserting 200. */
static char *run_body(const cluster_t *c, const char *session, const char *body)
{
    char *resp = malloc(T_BODY), *text;
    long status;

    assert_non_null(resp);
    status = http(c->http_port, "/v1/completions", body, session, 0, 300000, resp);
    if (status != 200) {
        fail_msg("completion failed: status=%ld body=%s", status, resp);
    }
    text = response_text(resp);
    assert_non_null(text);
    free(resp);
    return text;
}

/* A completion of body on its own thread (joined by join_text). */
typedef struct {
    unsigned port;
    const char *session;
    const char *body;
    long timeout_ms;
    char *resp;
    long status;
    pthread_t thread;
} req_t;

static void *req_run(void *arg)
{
    req_t *r = arg;

    r->status = http(r->port, "/v1/completions", r->body, r->session, 0, r->timeout_ms, r->resp);
    return NULL;
}

static void req_start(req_t *r, const cluster_t *c, const char *session, const char *body,
                      long timeout_ms)
{
    memset(r, 0, sizeof(*r));
    r->port = c->http_port;
    r->session = session;
    r->body = body;
    r->timeout_ms = timeout_ms;
    r->resp = malloc(T_BODY);
    assert_non_null(r->resp);
    assert_int_equal(pthread_create(&r->thread, NULL, req_run, r), 0);
}

/* Join; returns the text (malloc'ed) after asserting 200, or NULL when want_ok is 0. */
static char *req_join(req_t *r, int want_ok)
{
    char *text = NULL;

    assert_int_equal(pthread_join(r->thread, NULL), 0);
    if (want_ok) {
        if (r->status != 200) {
            fail_msg("completion failed: status=%ld body=%s", r->status, r->resp);
        }
        text = response_text(r->resp);
        assert_non_null(text);
    }
    free(r->resp);
    return text;
}

/* Wait until the prefill node shows a job queued or running; returns the ms that took. */
static double await_prefill_job(const cluster_t *c)
{
    uint64_t t0 = tdm_clock_now_ns(), end = t0 + T_FIND_MS * TDM_NS_PER_MS;

    while (tdm_clock_now_ns() < end) {
        if (metric(c->prefill_port[0], "tandem_prefill_queued_tokens") > 0) {
            return (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
        }
    }
    fail_msg("no prefill job seen within %d ms", T_FIND_MS);
    return -1;
}

/* Wait until the prefill node, idle before, has computed the first step of its job and the job
 * still runs (n_steps_before: tandem_prefill_steps_total before the job); returns the ms that
 * took. Fails when the job ended first: it was too short to be caught running. */
static double await_prefill_step(const cluster_t *c, double n_steps_before)
{
    uint64_t t0 = tdm_clock_now_ns(), end = t0 + T_FIND_MS * TDM_NS_PER_MS;

    while (tdm_clock_now_ns() < end) {
        if (metric(c->prefill_port[0], "tandem_prefill_steps_total") > n_steps_before) {
            if (metric(c->prefill_port[0], "tandem_prefill_queued_tokens") <= 0) {
                fail_msg("the prefill job ended before it was seen running after its first step");
            }
            return (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
        }
    }
    fail_msg("no prefill step seen within %d ms", T_FIND_MS);
    return -1;
}

static void test_slow_writer_acknowledges_and_a_racing_request_is_clean(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    static req_t racing;
    char *ids_a = malloc(T_BODY), *ids_b = malloc(T_BODY);
    char *body_a, *body_b, *want_b, *got_b;
    double steps_ms, left_ms, aborted_ms, n_steps, n_steps_done, n_steps_aborted, aborted;
    uint64_t t0, t_left;
    int fd;

    (void)state;
    assert_non_null(ids_a);
    assert_non_null(ids_b);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    make_ids(ids_a, T_BODY, T_SLOW_PROMPT_TOKENS, 7, 11);
    make_ids(ids_b, T_BODY, T_PROMPT_TOKENS, 13, 17);
    body_a = body_of(ids_a, T_MAX_TOKENS, 0);
    body_b = body_of(ids_b, T_MAX_TOKENS, 0);
    /* B's clean run, on a cluster of its own (the next one holds no prefix of it, so the racing
     * run prefills its whole prompt on the prefill node again). */
    want_b = run_body(&c, "slow-ref-b", body_b);
    cluster_stop(&c);
    /* The timer fence far beyond the test (TANDEM_FENCE_MS is the decode node's --fence-ms):
     * pages that come back came back on the writer's acknowledgement. */
    assert_int_equal(setenv("TANDEM_FENCE_MS", "600000", 1), 0);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    assert_int_equal(unsetenv("TANDEM_FENCE_MS"), 0);

    /* A's client leaves once the node has computed the first step of A's job, with 23 to go, so
     * the abort reaches it between layers; B asks for pages right after. */
    n_steps = metric(c.prefill_port[0], "tandem_prefill_steps_total");
    assert_true(n_steps >= 0);
    t0 = tdm_clock_now_ns();
    fd = cluster_leaving_client(&c, "slow-a", body_a);
    steps_ms = await_prefill_step(&c, n_steps);
    n_steps_done = metric(c.prefill_port[0], "tandem_prefill_steps_total") - n_steps;
    close(fd);
    t_left = tdm_clock_now_ns();
    left_ms = (double)(t_left - t0) / TDM_NS_PER_MS;
    req_start(&racing, &c, "slow-b", body_b, 300000);
    aborted = await_metric(c.prefill_port[0], "tandem_prefill_jobs_aborted_total", 1, 20000);
    aborted_ms = (double)(tdm_clock_now_ns() - t_left) / TDM_NS_PER_MS;
    n_steps_aborted = metric(c.prefill_port[0], "tandem_prefill_steps_total") - n_steps;
    got_b = req_join(&racing, 1);
    print_message("slow writer: A's job (%d tokens) computed its first step %.0f ms after it was "
                  "sent; the client left at %.0f ms, after step %.0f; prefill jobs aborted %.0f, "
                  "counted %.0f ms after the client left, after step %.0f\n",
                  T_SLOW_PROMPT_TOKENS, steps_ms, left_ms, n_steps_done, aborted, aborted_ms,
                  n_steps_aborted);
    assert_string_equal(got_b, want_b);
    assert_true(aborted == 1); /* the abort reached the running job, which acknowledged */
    cluster_check_pages(&c, "slow writer");
    cluster_stop(&c);
    free(got_b);
    free(want_b);
    free(body_a);
    free(body_b);
    free(ids_a);
    free(ids_b);
}

/* One paused-writer round at temperature 0 or 0.8 (seeded); before_job: the writer is paused
 * before A is sent, so A's PrefillJob waits in its socket and arrives only after the resume. */
static void paused_writer_round(int sampled, int before_job)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    static req_t first, racing;
    char *ids_a = malloc(T_BODY), *ids_b = malloc(T_BODY), *resp = malloc(T_BODY);
    char *body_a, *body_b, *body_b2, *want_a, *want_b, *want_b2, *got_a, *got_b, *got_b2;
    double seen_ms, lost_ms, n_reserved, n_free;
    uint64_t end;
    int stopped = 0;

    assert_non_null(ids_a);
    assert_non_null(ids_b);
    assert_non_null(resp);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    make_ids(ids_a, T_BODY, T_PROMPT_TOKENS, 7, 11);
    make_ids(ids_b, T_BODY, T_PROMPT_TOKENS, 13, 17);
    body_a = body_of(ids_a, T_MAX_TOKENS, sampled);
    body_b = body_of(ids_b, T_MAX_TOKENS, sampled);
    /* B's next turn: its prompt and 8 more ids (it reads every page B's first turn left) */
    strcat(ids_b, ",5,6,7,8,9,10,11,12");
    body_b2 = body_of(ids_b, T_MAX_TOKENS, sampled);
    /* The clean runs, on a cluster of their own (no prefix of them on the next one). */
    want_a = run_body(&c, "pause-ref-a", body_a);
    want_b = run_body(&c, "pause-ref-b", body_b);
    want_b2 = run_body(&c, "pause-ref-b", body_b2);
    cluster_stop(&c);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);

    if (before_job) {
        assert_int_equal(kill(c.prefill_pid[0], SIGSTOP), 0);
        stopped = 1;
        req_start(&first, &c, "pause-a", body_a, 300000);
        end = tdm_clock_now_ns() + 20000 * TDM_NS_PER_MS;
        while (metric(c.decode_port[0], "tandem_decode_reserved_pages") <= 0 &&
               tdm_clock_now_ns() < end) {
        }
        assert_true(metric(c.decode_port[0], "tandem_decode_reserved_pages") > 0);
        seen_ms = 0;
    } else {
        req_start(&first, &c, "pause-a", body_a, 300000);
        seen_ms = await_prefill_job(&c);
        assert_int_equal(kill(c.prefill_pid[0], SIGSTOP), 0);
        stopped = 1;
    }
    n_reserved = metric(c.decode_port[0], "tandem_decode_reserved_pages");
    lost_ms = await_health(c.http_port, "\"workers_lost_total\":1", 20000, resp);
    assert_true(lost_ms >= 0);
    /* The retry of A runs on the decode node. The timer fence (--fence-ms, 1 s) passes and the
     * reservation's pages go back on top of the pool's free stack; B then takes pages (the
     * freed ones first) and the writer resumes while B runs. */
    assert_true(await_metric(c.decode_port[0], "tandem_decode_reserved_pages", 0, 20000) == 0);
    n_free = metric(c.decode_port[0], "tandem_decode_free_pages");
    req_start(&racing, &c, "pause-b", body_b, 300000);
    end = tdm_clock_now_ns() + 20000 * TDM_NS_PER_MS;
    while (metric(c.decode_port[0], "tandem_decode_free_pages") > n_free - n_reserved &&
           tdm_clock_now_ns() < end) {
    }
    assert_int_equal(kill(c.prefill_pid[0], SIGCONT), 0);
    stopped = 0;
    got_a = req_join(&first, 1);
    got_b = req_join(&racing, 1);
    print_message(
        "paused writer (%s%s): job seen after %.0f ms, %.0f pages reserved, loss reported "
        "%.0f ms after the pause, resumed with %.0f pages free (%.0f at the fence)\n",
        sampled ? "temperature 0.8, seed 7" : "temperature 0",
        before_job ? ", paused before its job arrived" : "", seen_ms, n_reserved, lost_ms,
        metric(c.decode_port[0], "tandem_decode_free_pages"), n_free);
    assert_string_equal(got_a, want_a);
    assert_string_equal(got_b, want_b);
    /* the resumed node registers again and serves; once its stale job has ended, B's next turn
     * reads the pages the writer would have hit */
    assert_true(await_health(c.http_port, "\"prefill\":1", 20000, resp) >= 0);
    assert_true(await_metric(c.prefill_port[0], "tandem_prefill_jobs_total", 1, T_FIND_MS) == 1);
    got_b2 = run_body(&c, "pause-b", body_b2);
    assert_string_equal(got_b2, want_b2);
    print_message("after the resume: prefill node put %.0f pages, jobs %.0f, aborted %.0f, "
                  "failed %.0f\n",
                  metric(c.prefill_port[0], "tandem_prefill_put_pages_total"),
                  metric(c.prefill_port[0], "tandem_prefill_jobs_total"),
                  metric(c.prefill_port[0], "tandem_prefill_jobs_aborted_total"),
                  metric(c.prefill_port[0], "tandem_prefill_jobs_failed_total"));
    cluster_check_pages(&c, sampled ? "paused writer, sampled" : "paused writer, greedy");
    if (stopped) {
        kill(c.prefill_pid[0], SIGCONT);
    }
    cluster_stop(&c);
    free(got_a);
    free(got_b);
    free(got_b2);
    free(want_a);
    free(want_b);
    free(want_b2);
    free(body_a);
    free(body_b);
    free(body_b2);
    free(ids_a);
    free(ids_b);
    free(resp);
}

/* The late-reservation test's buffers: freed by its teardown too (a failed assertion leaves the
 * test by longjmp, and LeakSanitizer would then report them over the real failure). */
static struct {
    char *ids, *resp, *body;
} g_late;

static int late_teardown(void **state)
{
    free(g_late.ids);
    free(g_late.resp);
    free(g_late.body);
    memset(&g_late, 0, sizeof(g_late));
    return stop_leftovers(state);
}

/*
 * The orphaned reservation of issue 16: a decode node paused with a ReservePages waiting is
 * declared lost (the request fails over and, with no other decode node, ends in a 503); resumed,
 * it reserves and answers with a PageReservation the router no longer wants. The router answers
 * it with an Abort of that reservation (writer_fenced: nobody ever got it), so the pages come back
 * at once, not after the reservation's timeout (~610 s); the node registers again and serves.
 * Under load the router's ERROR_NOT_REGISTERED can reach the node before its PageReservation
 * left: the link drops it unsent and releases it the same way (node_link_impl.h
 * link_release_unsent); before that fix its 36 pages stayed reserved for the fence.
 */
static void test_late_reservation_of_a_resumed_decode_node_is_released(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *ids = g_late.ids = malloc(T_BODY), *resp = g_late.resp = malloc(T_BODY), *body, *text;
    long status;

    (void)state;
    assert_non_null(ids);
    assert_non_null(resp);
    /* the timer fence far out of reach: only the router's release can free the pages */
    assert_int_equal(setenv("TANDEM_FENCE_MS", "600000", 1), 0);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    assert_int_equal(unsetenv("TANDEM_FENCE_MS"), 0);
    make_ids(ids, T_BODY, T_PROMPT_TOKENS, 7, 11);
    body = g_late.body = body_of(ids, 4, 0);
    assert_int_equal(kill(c.decode_pid[0], SIGSTOP), 0);
    status = http(c.http_port, "/v1/completions", body, "orphan-1", 0, 60000, resp);
    print_message("request to the paused decode node: HTTP %ld %.200s\n", status, resp);
    assert_int_equal(status, 503);
    assert_int_equal(kill(c.decode_pid[0], SIGCONT), 0);
    assert_true(await_health(c.http_port, "\"decode\":1", 20000, resp) >= 0);
    cluster_check_pages(&c, "late reservation");
    text = complete(c.http_port, "orphan-2", ids, 4); /* the node serves again */
    free(text);
    cluster_stop(&c);
    late_teardown(state);
}

static void test_paused_writer_puts_nothing_after_its_lease_greedy(void **state)
{
    (void)state;
    paused_writer_round(0, 0);
}

static void test_paused_writer_puts_nothing_after_its_lease_sampled(void **state)
{
    (void)state;
    paused_writer_round(1, 0);
}

static void test_writer_paused_before_its_job_arrives_puts_nothing(void **state)
{
    (void)state;
    paused_writer_round(0, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_slow_writer_acknowledges_and_a_racing_request_is_clean,
                                  stop_leftovers),
        cmocka_unit_test_teardown(test_late_reservation_of_a_resumed_decode_node_is_released,
                                  late_teardown),
        cmocka_unit_test_teardown(test_paused_writer_puts_nothing_after_its_lease_greedy,
                                  stop_leftovers),
        cmocka_unit_test_teardown(test_paused_writer_puts_nothing_after_its_lease_sampled,
                                  stop_leftovers),
        cmocka_unit_test_teardown(test_writer_paused_before_its_job_arrives_puts_nothing,
                                  stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
