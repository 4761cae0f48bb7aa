/* test_cluster_drain.c - draining a decode node (issue 16 item 9, docs/DEPLOY.md "Draining a
 * decode node") on a local cluster (tools/tandem local, tiny preset, two decode nodes, local
 * prefill): SIGTERM lands while the node streams a long greedy completion; the node says
 * draining on /health (still 200) and in its heartbeats, a new session meanwhile goes to the other
 * node, the stream completes with the text of an undisturbed run, then the node says Goodbye
 * and exits 0; the drained session's next turn is rebuilt on the other node from the router's
 * history, and the other node's pages come back to their baseline. The harness is
 * test_cluster_harness.h.
 */
#define T_MODEL_PREFIX "cluster-drain"
#include "test_cluster_harness.h"

#define T_DRAIN_TOKENS  1000  /* long enough that SIGTERM lands mid-stream */
#define T_DRAIN_WAIT_MS 60000 /* the stream shows up running on a node within this */

/* Read the launcher's lines until "exited: role=decode pid=PID status=S"; returns S, or -1 when
 * its output ends first. */
static int await_exit(cluster_t *c, pid_t pid)
{
    char line[512];

    while (fgets(line, sizeof(line), c->out) != NULL) {
        int p, status;

        if (sscanf(line, "exited: role=decode pid=%d status=%d", &p, &status) == 2 && p == pid) {
            return status;
        }
    }
    return -1;
}

static void test_sigterm_drains_a_decode_node_mid_stream(void **state)
{
    static cluster_t c;            /* static: the teardown may stop it after a failed assertion */
    static async_completion_t run; /* static: outlives a failed assertion's jump */
    char ids[4096], ids2[4200];
    char *want, *text, *resp = malloc(T_BODY);
    int victim = -1, other, draining_seen = 0;
    double other_requests, victim_requests;
    uint64_t end;

    (void)state;
    assert_non_null(resp);
    assert_int_equal(setenv("TANDEM_DRAIN_TIMEOUT_MS", "240000", 1), 0);
    assert_int_equal(cluster_start(&c, 0, 2, NULL, 0), 0);
    assert_int_equal(unsetenv("TANDEM_DRAIN_TIMEOUT_MS"), 0);
    assert_int_equal(c.n_decode, 2);
    make_ids(ids, sizeof(ids), 40, 3, 11);
    want = complete(c.http_port, "drain-ref", ids, T_DRAIN_TOKENS); /* the undisturbed run */

    complete_start(&run, c.http_port, "drain-1", ids, T_DRAIN_TOKENS);
    end = tdm_clock_now_ns() + T_DRAIN_WAIT_MS * TDM_NS_PER_MS;
    while (victim < 0 && tdm_clock_now_ns() < end) {
        for (int i = 0; i < c.n_decode && victim < 0; i++) {
            if (metric(c.decode_port[i], "tandem_decode_running_sequences") == 1) {
                victim = i;
            }
        }
    }
    assert_true(victim >= 0);
    other = 1 - victim;
    victim_requests = metric(c.decode_port[victim], "tandem_decode_requests_total");
    other_requests = metric(c.decode_port[other], "tandem_decode_requests_total");
    assert_int_equal(kill(c.decode_pid[victim], SIGTERM), 0);
    c.decode_killed[victim] = 1; /* gone after the drain: its pages are not checked */

    /* /health says draining (200: alive, finishing) while the stream runs on */
    end = tdm_clock_now_ns() + 10000 * TDM_NS_PER_MS;
    while (!draining_seen && tdm_clock_now_ns() < end) {
        long status = http(c.decode_port[victim], "/health", NULL, NULL, 0, 2000, resp);
        draining_seen = status == 200 && strstr(resp, "\"status\":\"draining\"") != NULL;
        if (status == 0) {
            break; /* already gone: the stream ended first */
        }
    }
    print_message("decode node %d draining seen on /health: %d\n", victim, draining_seen);
    assert_true(draining_seen);

    /* a new session meanwhile goes to the other node */
    text = complete(c.http_port, "drain-2", ids, 4);
    free(text);
    assert_true(metric(c.decode_port[other], "tandem_decode_requests_total") == other_requests + 1);

    /* the stream completes as if nothing happened, then the node leaves with status 0 */
    text = complete_join(&run);
    assert_string_equal(text, want);
    free(text);
    assert_int_equal(await_exit(&c, c.decode_pid[victim]), 0);
    /* it admitted nothing after SIGTERM: drain-2 went to the other node */
    print_message("drained node's requests: %.0f before SIGTERM\n", victim_requests);
    assert_true(await_health(c.http_port, "\"decode\":1", 10000, resp) >= 0);

    /* the drained session's next turn: rebuilt on the other node from the router's history */
    snprintf(ids2, sizeof(ids2), "%s,5,6,7", ids);
    text = complete(c.http_port, "drain-1", ids2, 4);
    free(text);
    assert_true(metric(c.decode_port[other], "tandem_decode_requests_total") == other_requests + 2);
    cluster_check_pages(&c, "drained decode node");
    cluster_stop(&c);
    free(want);
    free(resp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_sigterm_drains_a_decode_node_mid_stream, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
