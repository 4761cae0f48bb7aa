/* test_transfer_metrics.c - transfer counters, latency histograms and their Prometheus text
 * (transfer/metrics.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transfer/metrics.h"

static void test_batches_and_events_are_counted(void **state)
{
    xfer_metrics_t *metrics = NULL;
    xfer_metrics_snapshot_t snap;

    (void)state;
    assert_int_equal(xfer_metrics_create(&metrics), TDM_OK);
    xfer_metrics_batch(metrics, XFER_OP_PUT, TDM_OK, 256, 256 * 22848, XFER_LANE_SHM, 2000000);
    xfer_metrics_batch(metrics, XFER_OP_PUT, TDM_ERR_PEER_LOST, 64, 64 * 22848, XFER_LANE_SHM,
                       5000);
    xfer_metrics_batch(metrics, XFER_OP_GET, TDM_OK, 1, 22848, XFER_LANE_TCP, 100000);
    xfer_metrics_batch(metrics, (xfer_op_t)5, TDM_OK, 1, 1, XFER_LANE_TCP, 1); /* ignored */
    xfer_metrics_event(metrics, XFER_EVENT_NOTICE_SENT);
    xfer_metrics_event(metrics, XFER_EVENT_NOTICE_MISMATCH);
    xfer_metrics_event(metrics, XFER_EVENT_PEER_FAILURE);
    xfer_metrics_event(metrics, XFER_EVENT_PEER_FAILURE);
    xfer_metrics_get(metrics, &snap);
    assert_int_equal(snap.n_batches[XFER_OP_PUT], 2);
    assert_int_equal(snap.n_batches_failed[XFER_OP_PUT], 1);
    assert_int_equal(snap.n_pages[XFER_OP_PUT], 256); /* failures move no pages */
    assert_int_equal(snap.n_bytes[XFER_OP_PUT], 256 * 22848);
    assert_int_equal(snap.n_batches[XFER_OP_GET], 1);
    assert_int_equal(snap.n_lane_batches[XFER_LANE_SHM], 2);
    assert_int_equal(snap.n_lane_batches[XFER_LANE_TCP], 1);
    assert_int_equal(snap.n_notices_sent, 1);
    assert_int_equal(snap.n_notice_mismatches, 1);
    assert_int_equal(snap.n_peer_failures, 2);
    assert_int_equal(snap.latency_count[XFER_OP_PUT], 2);
    assert_true(snap.latency_sum_s[XFER_OP_PUT] > 0.0020049 &&
                snap.latency_sum_s[XFER_OP_PUT] < 0.0020051);
    xfer_metrics_destroy(metrics);
    xfer_metrics_destroy(NULL);
}

static void test_render_is_prometheus_text(void **state)
{
    xfer_metrics_t *metrics = NULL;
    char *text = NULL;
    size_t n_bytes = 0;

    (void)state;
    assert_int_equal(xfer_metrics_create(&metrics), TDM_OK);
    xfer_metrics_batch(metrics, XFER_OP_PUT, TDM_OK, 16, 16 * 22848, XFER_LANE_RC, 30000);
    xfer_metrics_batch(metrics, XFER_OP_PUT, TDM_OK, 16, 16 * 22848, XFER_LANE_RC, 3000000000ULL);
    assert_int_equal(xfer_metrics_render(metrics, &text, &n_bytes), TDM_OK);
    assert_int_equal(strlen(text), n_bytes);
    assert_non_null(strstr(text, "# HELP tandem_xfer_batches_total "));
    assert_non_null(strstr(text, "# TYPE tandem_xfer_batches_total counter\n"));
    assert_non_null(strstr(text, "tandem_xfer_batches_total{op=\"put\"} 2\n"));
    assert_non_null(strstr(text, "tandem_xfer_batches_total{op=\"get\"} 0\n"));
    assert_non_null(strstr(text, "tandem_xfer_bytes_total{op=\"put\"} 731136\n"));
    assert_non_null(strstr(text, "tandem_xfer_lane_batches_total{lane=\"rc\"} 2\n"));
    assert_non_null(strstr(text, "# TYPE tandem_xfer_batch_latency_seconds histogram\n"));
    /* 30 us falls in le=5e-05; 3 s in le=5; buckets are cumulative. */
    assert_non_null(
        strstr(text, "tandem_xfer_batch_latency_seconds_bucket{op=\"put\",le=\"2.5e-05\"} 0\n"));
    assert_non_null(
        strstr(text, "tandem_xfer_batch_latency_seconds_bucket{op=\"put\",le=\"5e-05\"} 1\n"));
    assert_non_null(
        strstr(text, "tandem_xfer_batch_latency_seconds_bucket{op=\"put\",le=\"1\"} 1\n"));
    assert_non_null(
        strstr(text, "tandem_xfer_batch_latency_seconds_bucket{op=\"put\",le=\"5\"} 2\n"));
    assert_non_null(
        strstr(text, "tandem_xfer_batch_latency_seconds_bucket{op=\"put\",le=\"+Inf\"} 2\n"));
    assert_non_null(strstr(text, "tandem_xfer_batch_latency_seconds_count{op=\"put\"} 2\n"));
    assert_non_null(strstr(text, "tandem_xfer_batch_latency_seconds_sum{op=\"put\"} 3.00003\n"));
    free(text);
    xfer_metrics_destroy(metrics);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batches_and_events_are_counted),
        cmocka_unit_test(test_render_is_prometheus_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
