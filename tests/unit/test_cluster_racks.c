/* test_cluster_racks.c - rack-aware placement end to end (issue 18): `tandem local --racks 2`
 * with two decode and two prefill nodes (one of each per rack, separate processes on loopback,
 * tiny preset) serves a short replay of sessions whose turns prefill remotely; no rack is
 * saturated, so every prefill job stays in its decode node's rack
 * (tandem_router_prefill_cross_rack_total stays 0) while remote prefill did happen, and the
 * router's per-worker metrics carry each worker's rack label (rack0 and rack1 both present). */
#define T_MODEL_PREFIX "cluster-racks"
#include "test_cluster_harness.h"

#define N_SESSIONS 6

/* Whether the router's /metrics has a per-worker sample with role and rack labels. */
static int has_worker_sample(unsigned port, const char *role, const char *rack, int *n_out)
{
    char *body = malloc(T_BODY);
    char needle[128];
    int n = 0;

    assert_non_null(body);
    assert_int_equal(http(port, "/metrics", NULL, NULL, 0, 5000, body), 200);
    snprintf(needle, sizeof(needle), "role=\"%s\",rack=\"%s\"}", role, rack);
    for (char *line = body; (line = strstr(line, "tandem_router_worker_inflight{")) != NULL;
         line++) {
        char *end = strchr(line, '\n');
        char *hit = strstr(line, needle);
        if (hit != NULL && (end == NULL || hit < end)) {
            n++;
        }
    }
    free(body);
    *n_out = n;
    return n > 0;
}

static void test_prefill_stays_in_the_decode_nodes_rack(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char ids[8192], session[32];
    int n = 0;

    (void)state;
    g_racks = 2;
    assert_int_equal(cluster_start(&c, 2, 2, NULL, 0), 0);
    for (int s = 0; s < N_SESSIONS; s++) {
        char *text;
        snprintf(session, sizeof(session), "racks-%d", s);
        /* two turns each: the prompts are over --local-prefill-tokens, so prefill is remote */
        make_ids(ids, sizeof(ids), 120 + 10 * s, 7 + s, 3);
        text = complete(c.http_port, session, ids, 3);
        free(text);
        make_ids(ids, sizeof(ids), 200 + 10 * s, 7 + s, 3);
        text = complete(c.http_port, session, ids, 3);
        free(text);
    }
    assert_true(metric(c.http_port, "tandem_router_prefill_tokens_total{mode=\"remote\"}") > 0);
    assert_true(metric(c.http_port, "tandem_router_prefill_cross_rack_total") == 0);
    for (int r = 0; r < 2; r++) {
        char rack[16];
        snprintf(rack, sizeof(rack), "rack%d", r);
        assert_true(has_worker_sample(c.http_port, "decode", rack, &n));
        assert_int_equal(n, 1);
        assert_true(has_worker_sample(c.http_port, "prefill", rack, &n));
        assert_int_equal(n, 1);
    }
    cluster_check_pages(&c, "racks");
    cluster_stop(&c);
    g_racks = 1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_prefill_stays_in_the_decode_nodes_rack, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
