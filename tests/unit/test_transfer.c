/* test_transfer.c - the data path of transfer/ between two processes on loopback: put and
 * get batches bit-exact (1, 7, 64, 4096 pages), completion notices (checksum mismatch, unknown
 * pool, a 2.9 MB state record, wakeup through the efd), batch errors, metrics, device memory.
 * Harness: test_transfer_harness.h. Peer failure and restarts: test_transfer_peer.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "test_transfer_harness.h"

static void put_pages_bit_exact(fixture_t *fx, remote_t *remote, xfer_peer_t *peer, uint32_t n)
{
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    notice_report_t report;
    uint32_t *local = malloc(n * sizeof(*local));
    uint32_t *slots = malloc(n * sizeof(*slots));
    uint8_t *payload;
    size_t payload_bytes = 0;

    assert_non_null(local);
    assert_non_null(slots);
    make_layout(n, local, slots);
    for (uint32_t i = 0; i < n; i++) {
        fill_pattern(xfer_pool_page(fx->pool, local[i]), fx->seed, local[i]);
    }
    payload = pattern_payload(fx->seed, local, n, &payload_bytes);
    assert_non_null(payload);

    params = batch_params(XFER_OP_PUT, fx->pool, local, slots, n, &wait);
    params.flags = XFER_BATCH_NOTICE;
    params.job_id = 1000 + n;
    params.payload = payload;
    params.payload_bytes = payload_bytes;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    free(payload);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    assert_int_equal(wait.result.n_pages, n);
    assert_int_equal(wait.result.n_bytes, (uint64_t)n * PAGE_BYTES);
    assert_int_equal(wait.result.lane.cls, expected_lane());
    print_message("put %u pages: lane %s (%s) in %.3f ms\n", n,
                  xfer_lane_class_name(wait.result.lane.cls), wait.result.lane.text,
                  (double)wait.result.latency_ns * 1e-6);

    await_msg(fx, remote, MSG_NOTICE, &report, sizeof(report));
    assert_int_equal(report.job_id, 1000 + n);
    assert_int_equal(report.status, TDM_OK);
    assert_int_equal(report.n_pages, n);
    assert_int_equal(report.n_bad_pages, 0);
    assert_int_equal(report.n_exact_bad, 0);
    free(local);
    free(slots);
}

static void get_pages_bit_exact(fixture_t *fx, xfer_peer_t *peer, uint64_t seed, uint32_t n)
{
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    uint32_t *local = malloc(n * sizeof(*local));
    uint32_t *slots = malloc(n * sizeof(*slots));
    uint32_t n_bad = 0;

    assert_non_null(local);
    assert_non_null(slots);
    make_layout(n, local, slots);
    memset(xfer_pool_page(fx->pool, 0), 0, (size_t)PAGE_BYTES * POOL_PAGES);

    params = batch_params(XFER_OP_GET, fx->pool, local, slots, n, &wait);
    params.job_id = 2000 + n;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    assert_int_equal(wait.result.lane.cls, expected_lane());
    for (uint32_t i = 0; i < n; i++) {
        if (!pattern_matches(xfer_pool_page(fx->pool, local[i]), seed, slots[i])) {
            n_bad++;
        }
    }
    assert_int_equal(n_bad, 0);
    print_message("get %u pages: lane %s (%s) in %.3f ms\n", n,
                  xfer_lane_class_name(wait.result.lane.cls), wait.result.lane.text,
                  (double)wait.result.latency_ns * 1e-6);
    free(local);
    free(slots);
}

static void test_put_1_7_64_4096_pages_bit_exact(void **state)
{
    fixture_t *fx = *state;
    static const uint32_t sizes[] = {1, 7, 64, 4096};
    remote_t remote;
    xfer_peer_t *peer = NULL;

    spawn("decode-put", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        put_pages_bit_exact(fx, &remote, peer, sizes[i]);
    }
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_get_1_7_64_4096_pages_bit_exact(void **state)
{
    fixture_t *fx = *state;
    static const uint32_t sizes[] = {1, 7, 64, 4096};
    remote_t remote;
    xfer_peer_t *peer = NULL;
    uint64_t seed = fx->seed ^ 0x6e7;

    spawn("decode-get", &remote);
    command(fx, &remote, MSG_FILL, &seed, sizeof(seed), TDM_OK);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        get_pages_bit_exact(fx, peer, seed, sizes[i]);
    }
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_notice_checksum_mismatch_is_detected(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    notice_report_t report;
    uint32_t local[8];
    uint32_t slots[8];
    uint64_t checksums[8];
    uint8_t *payload;
    size_t payload_bytes = 0;
    xfer_metrics_snapshot_t snap;

    spawn("decode-sum", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    make_layout(8, local, slots);
    for (uint32_t i = 0; i < 8; i++) {
        fill_pattern(xfer_pool_page(fx->pool, local[i]), fx->seed, local[i]);
        checksums[i] = tdm_hash_xxh3_64(xfer_pool_page(fx->pool, local[i]), PAGE_BYTES);
    }
    checksums[3] ^= 1; /* one page's checksum disagrees with the page that lands */
    payload = pattern_payload(fx->seed, local, 8, &payload_bytes);
    assert_non_null(payload);
    params = batch_params(XFER_OP_PUT, fx->pool, local, slots, 8, &wait);
    params.flags = XFER_BATCH_NOTICE;
    params.job_id = 77;
    params.checksums = checksums;
    params.payload = payload;
    params.payload_bytes = payload_bytes;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    await_msg(fx, &remote, MSG_NOTICE, &report, sizeof(report));
    assert_int_equal(report.job_id, 77);
    assert_int_equal(report.status, TDM_ERR_MISMATCH);
    assert_int_equal(report.n_bad_pages, 1);
    assert_int_equal(report.first_bad_index, 3);
    assert_int_equal(report.n_exact_bad, 0); /* the bytes are right; the notice is not */

    xfer_metrics_get(xfer_context_metrics(fx->ctx), &snap);
    assert_int_equal(snap.n_notices_sent, 1);
    xfer_peer_close(peer);

    /* A notice naming a pool the receiver does not have is delivered as NOT_FOUND. */
    {
        xfer_desc_t wrong_pool = remote.desc;

        wrong_pool.pool_id += 100;
        assert_int_equal(xfer_peer_connect(fx->ctx, &wrong_pool, &peer), TDM_OK);
        memset(&wait, 0, sizeof(wait));
        params.checksums = NULL;
        params.job_id = 78;
        assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
        await_batch(fx, &wait);
        assert_int_equal(wait.result.status, TDM_OK);
        await_msg(fx, &remote, MSG_NOTICE, &report, sizeof(report));
        assert_int_equal(report.job_id, 78);
        assert_int_equal(report.status, TDM_ERR_NOT_FOUND);
        xfer_peer_close(peer);
    }
    free(payload);
    finish(&remote);
}

static void test_state_record_payload_arrives_whole(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    notice_report_t report;
    uint8_t *record = malloc(STATE_RECORD_BYTES);
    uint32_t kind = PAYLOAD_BLOB;

    assert_non_null(record);
    for (uint32_t i = 0; i < STATE_RECORD_BYTES; i++) {
        record[i] = (uint8_t)(i * 131u + 7u);
    }
    memcpy(record, &kind, 4);
    spawn("decode-rec", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    params = batch_params(XFER_OP_PUT, fx->pool, NULL, NULL, 0, &wait);
    params.flags = XFER_BATCH_NOTICE; /* no pages: the notice carries only the record */
    params.job_id = 99;
    params.payload = record;
    params.payload_bytes = STATE_RECORD_BYTES;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    await_msg(fx, &remote, MSG_NOTICE, &report, sizeof(report));
    assert_int_equal(report.job_id, 99);
    assert_int_equal(report.status, TDM_OK);
    assert_int_equal(report.n_pages, 0);
    assert_int_equal(report.payload_bytes, STATE_RECORD_BYTES);
    assert_true(report.payload_hash == tdm_hash_xxh3_64(record, STATE_RECORD_BYTES));
    free(record);
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_notice_into_parent_wakes_efd_poller(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    const uint8_t *desc;
    size_t desc_bytes;
    put_to_t cmd;
    uint8_t *body;
    uint64_t t_start_ns;
    int32_t status = -100;

    spawn("decode-writer", &remote);
    xfer_pool_descriptor(fx->pool, &desc, &desc_bytes);
    body = malloc(sizeof(cmd) + desc_bytes);
    assert_non_null(body);
    memset(&cmd, 0, sizeof(cmd));
    cmd.seed = fx->seed ^ 0xabc;
    cmd.n_pages = 64;
    memcpy(body, &cmd, sizeof(cmd));
    memcpy(body + sizeof(cmd), desc, desc_bytes);
    assert_int_equal(send_msg(remote.sock, MSG_PUT_TO, body, (uint32_t)(sizeof(cmd) + desc_bytes)),
                     0);
    free(body);

    /* Sleep on the efd (armed) until the notice arrives; the child's reply comes after. */
    t_start_ns = tdm_clock_now_ns();
    while (fx->n_notices == 0) {
        struct pollfd pfd = {xfer_context_efd(fx->ctx), POLLIN, 0};

        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        xfer_context_progress(fx->ctx);
        if (fx->n_notices > 0 || xfer_context_arm(fx->ctx) == TDM_ERR_BUSY) {
            continue;
        }
        poll(&pfd, 1, (int)xfer_context_max_sleep_ms(fx->ctx));
    }
    assert_int_equal(fx->last_notice.status, TDM_OK);
    assert_int_equal(fx->last_notice.n_pages, 64);
    assert_int_equal(fx->last_notice.job_id, cmd.seed);
    assert_string_equal(fx->last_notice.sender_name, "decode-writer");
    assert_int_equal(fx->last_notice.pool_id, xfer_pool_id(fx->pool));
    assert_int_equal(fx->last_n_exact_bad, 0);
    await_msg(fx, &remote, MSG_OK, &status, sizeof(status));
    assert_int_equal(status, TDM_OK);
    finish(&remote);
}

static void test_post_errors_change_nothing(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    xfer_pool_t *odd_pool = NULL;
    xfer_context_t *small = NULL;
    xfer_pool_t *small_pool = NULL;
    xfer_peer_t *small_peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    batch_wait_t wait2 = {0};
    uint32_t pages[2] = {0, 1};
    uint32_t bad[2] = {0, POOL_PAGES};
    xfer_metrics_snapshot_t before;
    xfer_metrics_snapshot_t after;

    spawn("decode-err", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    xfer_metrics_get(xfer_context_metrics(fx->ctx), &before);
    params = batch_params(XFER_OP_PUT, fx->pool, pages, bad, 2, &wait);
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* remote index */
    params.remote_pages = pages;
    params.local_pages = bad;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* local index */
    params.local_pages = pages;
    params.done = NULL;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* no callback */
    params.done = batch_done;
    params.op = XFER_OP_GET;
    params.flags = XFER_BATCH_NOTICE;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* notice on get */
    params.op = XFER_OP_PUT;
    params.flags = 0;
    params.n_pages = 0;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_INVALID_ARG); /* empty, no notice */
    params.n_pages = 2;

    assert_int_equal(make_pool(fx->ctx, PAGE_BYTES * 2, &odd_pool), TDM_OK);
    params.local_pool = odd_pool;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_MISMATCH); /* page sizes */
    params.local_pool = fx->pool;
    xfer_pool_destroy(odd_pool);

    assert_int_equal(xfer_context_n_inflight(fx->ctx), 0);
    assert_false(wait.done);
    xfer_metrics_get(xfer_context_metrics(fx->ctx), &after);
    assert_memory_equal(&before, &after, sizeof(before));

    /* A full context says busy until progress delivers a finished batch. */
    assert_int_equal(make_context("prefill-small", 0, 1, NULL, NULL, &small), TDM_OK);
    assert_int_equal(make_pool(small, PAGE_BYTES, &small_pool), TDM_OK);
    assert_int_equal(xfer_peer_connect(small, &remote.desc, &small_peer), TDM_OK);
    params.local_pool = small_pool;
    assert_int_equal(xfer_batch_post(small_peer, &params), TDM_IN_PROGRESS);
    params.done_arg = &wait2;
    assert_int_equal(xfer_batch_post(small_peer, &params), TDM_ERR_BUSY);
    await_batch_on(small, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    assert_int_equal(xfer_batch_post(small_peer, &params), TDM_IN_PROGRESS);
    await_batch_on(small, &wait2);
    assert_int_equal(wait2.result.status, TDM_OK);
    xfer_peer_close(small_peer);
    xfer_pool_destroy(small_pool);
    xfer_context_destroy(small);

    /* Bad descriptors never reach UCX. */
    {
        uint8_t *copy = malloc(remote.desc_n_bytes);
        xfer_desc_t parsed;

        assert_non_null(copy);
        memcpy(copy, remote.desc_bytes, remote.desc_n_bytes);
        copy[remote.desc_n_bytes / 2] ^= 0x40;
        assert_int_equal(xfer_desc_parse(copy, remote.desc_n_bytes, &parsed), TDM_ERR_MISMATCH);
        free(copy);
    }
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_metrics_render_as_prometheus_text(void **state)
{
    fixture_t *fx = *state;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    uint32_t pages[7];
    batch_wait_t wait;
    char *text = NULL;
    size_t n_bytes = 0;
    char expect[160];

    spawn("decode-metrics", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    assert_int_equal(post_put(fx, peer, 7, pages, &wait), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    assert_int_equal(xfer_metrics_render(xfer_context_metrics(fx->ctx), &text, &n_bytes), TDM_OK);
    assert_int_equal(strlen(text), n_bytes);
    assert_non_null(strstr(text, "# TYPE tandem_xfer_pages_total counter\n"));
    assert_non_null(strstr(text, "tandem_xfer_pages_total{op=\"put\"} 7\n"));
    snprintf(expect, sizeof(expect), "tandem_xfer_bytes_total{op=\"put\"} %u\n", 7 * PAGE_BYTES);
    assert_non_null(strstr(text, expect));
    snprintf(expect, sizeof(expect), "tandem_xfer_lane_batches_total{lane=\"%s\"} 1\n",
             xfer_lane_class_name(expected_lane()));
    assert_non_null(strstr(text, expect));
    assert_non_null(
        strstr(text, "tandem_xfer_batch_latency_seconds_bucket{op=\"put\",le=\"+Inf\"} 1\n"));
    assert_non_null(strstr(text, "tandem_xfer_batch_latency_seconds_count{op=\"put\"} 1\n"));
    free(text);
    xfer_peer_close(peer);
    finish(&remote);
}

static void test_device_pool_put_and_get(void **state)
{
#ifndef TANDEM_HAVE_CUDA
    (void)state;
    print_message("built without CUDA (TANDEM_HAVE_CUDA off): skipping\n");
    skip();
#else
    fixture_t *fx = *state;
    xfer_pool_params_t pool_params;
    xfer_pool_t *device_pool = NULL;
    remote_t remote;
    xfer_peer_t *peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    notice_report_t report;
    uint32_t pages[64];
    uint8_t host[PAGE_BYTES];
    uint8_t *payload;
    size_t payload_bytes = 0;
    uint64_t seed = fx->seed ^ 0xd;
    tdm_status_t status;
    uint32_t n_bad = 0;

    if (!xfer_pool_device_memory_available()) {
        print_message("no CUDA device: skipping\n");
        skip();
    }
    memset(&pool_params, 0, sizeof(pool_params));
    pool_params.page_size_bytes = PAGE_BYTES;
    pool_params.n_pages = 64;
    pool_params.mem_type = XFER_MEM_CUDA;
    status = xfer_pool_create(fx->ctx, &pool_params, &device_pool);
    if (status == TDM_ERR_UNSUPPORTED) {
        print_message("UCX cannot register CUDA memory (libucx built without CUDA): skipping\n");
        skip();
    }
    assert_int_equal(status, TDM_OK);
    for (uint32_t i = 0; i < 64; i++) {
        pages[i] = i;
        fill_pattern(host, seed, i);
        assert_int_equal(
            cudaMemcpy(xfer_pool_page(device_pool, i), host, PAGE_BYTES, cudaMemcpyHostToDevice),
            cudaSuccess);
    }

    /* Device pages -> the child's host pool, with a notice (checksums via staging copies). */
    spawn("decode-device", &remote);
    assert_int_equal(xfer_peer_connect(fx->ctx, &remote.desc, &peer), TDM_OK);
    payload = pattern_payload(seed, pages, 64, &payload_bytes);
    assert_non_null(payload);
    params = batch_params(XFER_OP_PUT, device_pool, pages, pages, 64, &wait);
    params.flags = XFER_BATCH_NOTICE;
    params.job_id = 64;
    params.payload = payload;
    params.payload_bytes = payload_bytes;
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    free(payload);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    print_message("device put: lane %s (%s)\n", xfer_lane_class_name(wait.result.lane.cls),
                  wait.result.lane.text);
    await_msg(fx, &remote, MSG_NOTICE, &report, sizeof(report));
    assert_int_equal(report.status, TDM_OK);
    assert_int_equal(report.n_exact_bad, 0);

    /* The child's host pages -> device pages. */
    seed ^= 0x77;
    command(fx, &remote, MSG_FILL, &seed, sizeof(seed), TDM_OK);
    params = batch_params(XFER_OP_GET, device_pool, pages, pages, 64, &wait);
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);
    for (uint32_t i = 0; i < 64; i++) {
        assert_int_equal(
            cudaMemcpy(host, xfer_pool_page(device_pool, i), PAGE_BYTES, cudaMemcpyDeviceToHost),
            cudaSuccess);
        if (!pattern_matches(host, seed, i)) {
            n_bad++;
        }
    }
    assert_int_equal(n_bad, 0);
    xfer_peer_close(peer);
    finish(&remote);
    xfer_pool_destroy(device_pool);
#endif
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_1_7_64_4096_pages_bit_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_1_7_64_4096_pages_bit_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notice_checksum_mismatch_is_detected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_record_payload_arrives_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notice_into_parent_wakes_efd_poller, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_errors_change_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_render_as_prometheus_text, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_pool_put_and_get, setup, teardown),
    };

    if (harness_is_child(argc, argv)) {
        return child_main(argc, argv);
    }
    harness_prepare();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
