/* test_cluster_metrics.c - every process's /metrics page is Prometheus text exposition 0.0.4
 * with HELP and TYPE for every family (common/prom.h) and passes Prometheus' own linter:
 * a local cluster of the tiny preset (tools/tandem local: router, 1 prefill node, 1 decode node
 * as separate processes on loopback) serves a disaggregated turn, a local turn and one refused
 * request (so counters, labelled error counters and the TTFT, ITL and transfer latency
 * histograms all have samples); then the pages of the router, the prefill node and the decode
 * node (each with transfer/'s families) are checked by tests/unit/prom_check.h and, when
 * promtool is on PATH, by `promtool check metrics`, which must print nothing (without promtool
 * that part is skipped and the reason printed).
 */
#define T_MODEL_PREFIX "cluster-metrics"
#include "test_cluster_harness.h"

#include "prom_check.h"

/* Check one page: structure, then promtool. */
static void check_page(unsigned port, const char *what)
{
    char *body = malloc(T_BODY);
    char err[1024], out[8192], path[T_PATH];
    const char *tmp = getenv("TANDEM_TEST_TMP");
    int status = 0, ran;

    assert_non_null(body);
    assert_int_equal(http(port, "/metrics", NULL, NULL, 0, 5000, body), 200);
    if (prom_check_text(body, err, sizeof(err)) != NULL) {
        fail_msg("%s /metrics: %s", what, err);
    }
    snprintf(path, sizeof(path), "%s/cluster-metrics-%s.txt", tmp != NULL ? tmp : "/tmp", what);
    ran = prom_check_promtool(body, path, out, sizeof(out), &status);
    assert_true(ran >= 0);
    if (ran == 0) {
        print_message("skip: promtool over %s /metrics: %s\n", what, out);
    } else {
        print_message("promtool check metrics over %s /metrics: status %d, %zu bytes of "
                      "output%s%s\n",
                      what, status, strlen(out), out[0] != '\0' ? ":\n" : "", out);
        assert_int_equal(status, 0);
        assert_string_equal(out, "");
    }
    free(body);
}

static void test_every_page_passes_the_format_and_promtool(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char ids[8192];
    char *text;
    char *bad = malloc(T_BODY);

    (void)state;
    assert_non_null(bad);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    /* A disaggregated turn (prompt over --local-prefill-tokens), then a short local one. */
    make_ids(ids, sizeof(ids), 200, 7, 3);
    text = complete(c.http_port, "metrics-remote", ids, 4);
    free(text);
    make_ids(ids, sizeof(ids), 8, 5, 1);
    text = complete(c.http_port, "metrics-local", ids, 4);
    free(text);
    /* A refused request: an error counter with code and status labels. */
    assert_int_equal(http(c.http_port, "/v1/completions", "{not json", NULL, 0, 5000, bad), 400);
    assert_true(metric(c.decode_port[0], "tandem_decode_handoffs_total") >= 1);
    check_page(c.http_port, "router");
    check_page(c.prefill_port[0], "prefill");
    check_page(c.decode_port[0], "decode");
    cluster_stop(&c);
    free(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_every_page_passes_the_format_and_promtool, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
