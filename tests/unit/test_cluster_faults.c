/* test_cluster_faults.c - a local cluster (tools/tandem local, tiny preset) losing or refusing
 * workers: a SIGKILLed decode node is reported on /health within 3 s and its session's next turn
 * is rebuilt on another decode node from the router's history; a prefill node SIGKILLed in the
 * middle of a prefill job is reported on /health, the job reruns on the other prefill node and
 * the request completes with the text of an undisturbed run; a worker of another model is
 * refused at registration; a prefill node held to a lane UCX does not offer (--require-transport)
 * fails its jobs and the request ends in a 503, not a hang. Every test ends with the surviving decode nodes' pages back at their
 * baseline (printed). The harness is test_cluster_harness.h.
 */
#define T_MODEL_PREFIX "cluster-faults"
#include "test_cluster_harness.h"

/* Prompt of the prefill-kill test: long enough that its prefill job is still running when the
 * test sees it queued and kills the node (tiny preset under ASan: seconds). */
#define T_KILL_PROMPT_TOKENS 1500
#define T_LOSS_REPORT_MS     3000 /* /health reports a SIGKILLed worker within this */

static void test_killed_decode_node_is_detected_and_session_rebuilt(void **state)
{
    char ids[4096], gen[4096], ids2[16384], *resp = malloc(T_BODY);
    char *text;
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    int victim = -1;
    double lost_ms;

    (void)state;
    assert_non_null(resp);
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
    c.decode_killed[victim] = 1;
    lost_ms = await_health(c.http_port, "\"workers_lost_total\":1", 10000, resp);
    print_message("decode node loss reported after %.0f ms: %s\n", lost_ms, resp);
    assert_true(lost_ms >= 0 && lost_ms < T_LOSS_REPORT_MS);
    assert_non_null(strstr(resp, "\"decode\":1"));
    generate_ids(ids, 4, gen, sizeof(gen));
    snprintf(ids2, sizeof(ids2), "%s,%s,5,6,7,8", ids, gen);
    text = complete(c.http_port, "kill-1", ids2, 4);
    assert_true(metric(c.decode_port[1 - victim], "tandem_decode_resident_sessions") == 1);
    free(text);
    cluster_check_pages(&c, "killed decode node");
    cluster_stop(&c);
    free(resp);
}

static void test_killed_prefill_node_mid_job_reruns_elsewhere(void **state)
{
    static cluster_t c;            /* static: the teardown may stop it after a failed assertion */
    static async_completion_t run; /* static: outlives a failed assertion's jump */
    char *ids = malloc(T_BODY), *resp = malloc(T_BODY);
    char *want, *text;
    double tokens_before[2], retries_before, computed_before, lost_ms, ref_ms, seen_ms = -1;
    uint64_t t0, end;
    int victim = -1, survivor;

    (void)state;
    assert_non_null(ids);
    assert_non_null(resp);
    assert_int_equal(cluster_start(&c, 2, 1, NULL, 0), 0);
    assert_int_equal(c.n_prefill, 2);
    make_ids(ids, T_BODY, T_KILL_PROMPT_TOKENS, 7, 11);
    /* The undisturbed run: another session, same prompt. */
    t0 = tdm_clock_now_ns();
    want = complete(c.http_port, "pkill-ref", ids, 8);
    ref_ms = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
    for (int i = 0; i < 2; i++) {
        tokens_before[i] = metric(c.prefill_port[i], "tandem_prefill_tokens_total");
        /* A node publishes its queue on its next idle poll: wait for both to read 0 so that the
         * poll below cannot mistake the finished job's figure for the new one. */
        assert_true(await_metric(c.prefill_port[i], "tandem_prefill_queued_tokens", 0, 10000) == 0);
    }
    assert_true(tokens_before[0] + tokens_before[1] == T_KILL_PROMPT_TOKENS);
    retries_before = metric(c.http_port, "tandem_router_retries_total");
    computed_before = metric(c.http_port, "tandem_prefill_tokens_computed_total");

    /* The run to disturb: find the prefill node holding its job (queued or running tokens on
     * its /metrics) and SIGKILL it there. */
    t0 = tdm_clock_now_ns();
    complete_start(&run, c.http_port, "pkill-1", ids, 8);
    end = t0 + 60000 * TDM_NS_PER_MS;
    while (victim < 0 && tdm_clock_now_ns() < end) {
        for (int i = 0; i < 2 && victim < 0; i++) {
            if (metric(c.prefill_port[i], "tandem_prefill_queued_tokens") > 0) {
                victim = i;
                seen_ms = (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS;
            }
        }
    }
    assert_true(victim >= 0);
    kill(c.prefill_pid[victim], SIGKILL);
    survivor = 1 - victim;
    lost_ms = await_health(c.http_port, "\"workers_lost_total\":1", 10000, resp);
    print_message("prefill node %d killed %.0f ms into the run (undisturbed run: %.0f ms); loss "
                  "reported after %.0f ms: %s\n",
                  victim, seen_ms, ref_ms, lost_ms, resp);
    assert_true(lost_ms >= 0 && lost_ms < T_LOSS_REPORT_MS);
    assert_non_null(strstr(resp, "\"prefill\":1"));
    text = complete_join(&run);
    print_message("disturbed run done %.0f ms after it started\n",
                  (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS);
    print_message("after the run: survivor prefilled %.0f tokens, router retries %.0f, router "
                  "computed %.0f tokens\n",
                  metric(c.prefill_port[survivor], "tandem_prefill_tokens_total") -
                      tokens_before[survivor],
                  metric(c.http_port, "tandem_router_retries_total") - retries_before,
                  metric(c.http_port, "tandem_prefill_tokens_computed_total") - computed_before);
    assert_string_equal(text, want);
    /* The job ran again, whole, on the survivor; the router retried the turn once and counts
     * only the job that completed (the killed one sent no notice). */
    assert_true(metric(c.prefill_port[survivor], "tandem_prefill_tokens_total") -
                    tokens_before[survivor] ==
                T_KILL_PROMPT_TOKENS);
    assert_true(metric(c.http_port, "tandem_router_retries_total") - retries_before == 1);
    assert_true(metric(c.http_port, "tandem_prefill_tokens_computed_total") - computed_before ==
                T_KILL_PROMPT_TOKENS);
    assert_true(metric(c.http_port, "tandem_prefill_tokens_reused_total") == 0);
    cluster_check_pages(&c, "killed prefill node");
    cluster_stop(&c);
    free(text);
    free(want);
    free(ids);
    free(resp);
}

static void test_worker_of_another_model_is_refused(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */

    (void)state;
    assert_int_equal(cluster_start(&c, 0, 1, g_model2, 1), 1);
}

/* --require-transport: a prefill node that may only use a lane this host lacks (rc) refuses every
 * put instead of falling back to shm; each attempt fails with its reason (an abort of one attempt
 * never stops the next), the request ends in a 503 rather than hanging, and no page stays
 * reserved. Requiring the lane UCX does use here (shm) serves the same request. */
static void test_required_transport_refuses_weaker_lane(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char ids[4096];
    char *body, *resp = malloc(T_BODY);
    long status;

    (void)state;
    assert_non_null(resp);
    make_ids(ids, sizeof(ids), 200, 17, 5);
    body = completion_body(ids, 4);
    assert_int_equal(setenv("TANDEM_REQUIRE_TRANSPORT", "shm", 1), 0);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 1), 0);
    status = http(c.http_port, "/v1/completions", body, "lane-shm", 0, 120000, resp);
    print_message("require shm: HTTP %ld\n", status);
    assert_int_equal(status, 200);
    assert_true(metric(c.prefill_port[0], "tandem_prefill_jobs_failed_total") == 0);
    cluster_check_pages(&c, "require shm");
    cluster_stop(&c);

    assert_int_equal(setenv("TANDEM_REQUIRE_TRANSPORT", "rc", 1), 0);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 1), 0);
    assert_int_equal(unsetenv("TANDEM_REQUIRE_TRANSPORT"), 0);
    status = http(c.http_port, "/v1/completions", body, "lane-rc", 0, 120000, resp);
    print_message("require rc: HTTP %ld %s\n", status, resp);
    assert_int_equal(status, 503);
    assert_non_null(strstr(resp, "retries_exhausted"));
    assert_true(metric(c.prefill_port[0], "tandem_prefill_jobs_failed_total") >= 2);
    cluster_check_pages(&c, "require rc");
    cluster_stop(&c);
    free(body);
    free(resp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_worker_of_another_model_is_refused, stop_leftovers),
        cmocka_unit_test_teardown(test_required_transport_refuses_weaker_lane, stop_leftovers),
        cmocka_unit_test_teardown(test_killed_prefill_node_mid_job_reruns_elsewhere,
                                  stop_leftovers),
        cmocka_unit_test_teardown(test_killed_decode_node_is_detected_and_session_rebuilt,
                                  stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
