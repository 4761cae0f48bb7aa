/* test_transfer_peer.c - peers of transfer/ between processes on loopback: a receiver killed
 * mid-transfer fails only its own peer, a restarted peer is reached through its new descriptor
 * while the old one is refused, --require-transport refuses other lanes, and connect and create
 * errors change nothing. Harness: test_transfer_harness.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_transfer_harness.h"

static void test_receiver_killed_mid_transfer_fails_only_that_peer(void **state)
{
    fixture_t *fx = *state;
    remote_t victim;
    remote_t bystander;
    xfer_peer_t *victim_peer = NULL;
    xfer_peer_t *bystander_peer = NULL;
    uint32_t *pages = malloc(4096 * sizeof(*pages));
    batch_wait_t big;
    batch_wait_t probe;
    xfer_metrics_snapshot_t snap;
    uint64_t t_start_ns;
    tdm_status_t status;

    assert_non_null(pages);
    spawn("decode-victim", &victim);
    spawn("decode-bystander", &bystander);
    assert_int_equal(xfer_peer_connect(fx->ctx, &victim.desc, &victim_peer), TDM_OK);
    assert_int_equal(xfer_peer_connect(fx->ctx, &bystander.desc, &bystander_peer), TDM_OK);

    /* Both connections are up and in use. */
    assert_int_equal(post_put(fx, victim_peer, 7, pages, &probe), TDM_IN_PROGRESS);
    await_batch(fx, &probe);
    assert_int_equal(probe.result.status, TDM_OK);

    /* A large put is posted, and the receiver dies before we drive it any further. The receiver
     * is stopped before the put is posted: an emulated put completes only through the
     * receiver's progress, and a receiver still running between the post and the kill could
     * finish it first (seen once in CI on tcp). */
    {
        int wstatus = 0;
        assert_int_equal(kill(victim.pid, SIGSTOP), 0);
        assert_int_equal(waitpid(victim.pid, &wstatus, WUNTRACED), victim.pid);
        assert_true(WIFSTOPPED(wstatus));
    }
    assert_int_equal(post_put(fx, victim_peer, 4096, pages, &big), TDM_IN_PROGRESS);
    kill_remote(&victim);
    await_batch(fx, &big);
    if (big.result.lane.flags & XFER_LANE_EMULATED) {
        /* The receiver's progress moves emulated puts: this batch cannot have finished. */
        assert_int_equal(big.result.status, TDM_ERR_PEER_LOST);
    } else {
        /* Direct shm copies may all land before the kill; either way, no hang. */
        assert_true(big.result.status == TDM_OK || big.result.status == TDM_ERR_PEER_LOST);
    }

    /* Keep writing until UCX (keepalive on shm, the socket on tcp) declares the peer lost. */
    t_start_ns = tdm_clock_now_ns();
    while (xfer_peer_status(victim_peer) == TDM_OK) {
        assert_true(tdm_clock_elapsed_ms(t_start_ns) < DEADLINE_MS);
        status = post_put(fx, victim_peer, 64, pages, &probe);
        if (status == TDM_IN_PROGRESS) {
            await_batch(fx, &probe);
        }
        xfer_context_wait(fx->ctx, KEEPALIVE_MS);
    }
    assert_int_equal(xfer_peer_status(victim_peer), TDM_ERR_PEER_LOST);
    assert_int_equal(post_put(fx, victim_peer, 64, pages, &probe), TDM_ERR_PEER_LOST);
    assert_false(probe.done);

    /* The other peer is untouched. */
    assert_int_equal(xfer_peer_status(bystander_peer), TDM_OK);
    assert_int_equal(post_put(fx, bystander_peer, 64, pages, &probe), TDM_IN_PROGRESS);
    await_batch(fx, &probe);
    assert_int_equal(probe.result.status, TDM_OK);

    xfer_metrics_get(xfer_context_metrics(fx->ctx), &snap);
    assert_int_equal(snap.n_peer_failures, 1);

    /* The dead peer is freed once unreferenced. */
    assert_int_equal(xfer_context_n_peers(fx->ctx), 2);
    xfer_peer_close(victim_peer);
    await_n_peers(fx, 1);
    xfer_peer_close(bystander_peer);
    finish(&victim);
    finish(&bystander);
    free(pages);
}

static void test_restarted_peer_reached_by_new_descriptor_old_refused(void **state)
{
    fixture_t *fx = *state;
    remote_t first;
    remote_t second;
    xfer_peer_t *old_peer = NULL;
    xfer_peer_t *new_peer = NULL;
    xfer_peer_t *again = NULL;
    uint32_t pages[7];
    batch_wait_t wait;
    xfer_metrics_snapshot_t snap;

    spawn("decode-restart", &first);
    assert_int_equal(xfer_peer_connect(fx->ctx, &first.desc, &old_peer), TDM_OK);
    assert_int_equal(post_put(fx, old_peer, 7, pages, &wait), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);

    kill_remote(&first);
    spawn("decode-restart", &second);
    assert_true(second.desc.incarnation_id != first.desc.incarnation_id);

    /* The new descriptor reaches the new process and retires the old incarnation. */
    assert_int_equal(xfer_peer_connect(fx->ctx, &second.desc, &new_peer), TDM_OK);
    assert_int_equal(xfer_peer_status(old_peer), TDM_ERR_PEER_LOST);
    assert_int_equal(post_put(fx, new_peer, 7, pages, &wait), TDM_IN_PROGRESS);
    await_batch(fx, &wait);
    assert_int_equal(wait.result.status, TDM_OK);

    /* The old descriptor and the old handle are refused, never executed. */
    assert_int_equal(xfer_peer_connect(fx->ctx, &first.desc, &again), TDM_ERR_PEER_LOST);
    assert_null(again);
    assert_int_equal(post_put(fx, old_peer, 7, pages, &wait), TDM_ERR_PEER_LOST);
    assert_false(wait.done);
    xfer_metrics_get(xfer_context_metrics(fx->ctx), &snap);
    assert_int_equal(snap.n_peers_refused, 2);

    /* The same descriptor again gives the cached peer. */
    assert_int_equal(xfer_peer_connect(fx->ctx, &second.desc, &again), TDM_OK);
    assert_ptr_equal(again, new_peer);
    xfer_peer_close(again);

    xfer_peer_close(old_peer);
    await_n_peers(fx, 1); /* the new one stays cached */
    xfer_peer_close(new_peer);
    finish(&first);
    finish(&second);
}

static void test_required_transport_refuses_other_lanes(void **state)
{
    remote_t remote;
    xfer_context_t *strict = NULL;
    xfer_pool_t *pool = NULL;
    xfer_peer_t *peer = NULL;
    xfer_peer_t *ok_peer = NULL;
    xfer_batch_params_t params;
    batch_wait_t wait = {0};
    uint32_t pages[4] = {0, 1, 2, 3};
    xfer_lane_mask_t other;
    xfer_metrics_snapshot_t snap;

    (void)state;
    /* Requiring the lane in use is fine: puts and gets go through and report it. */
    spawn("decode-lane", &remote);
    {
        xfer_context_t *ok_ctx = NULL;
        xfer_pool_t *ok_pool = NULL;

        assert_int_equal(
            make_context("prefill-lane-ok", XFER_LANE_BIT(expected_lane()), 8, NULL, NULL, &ok_ctx),
            TDM_OK);
        assert_int_equal(make_pool(ok_ctx, PAGE_BYTES, &ok_pool), TDM_OK);
        assert_int_equal(xfer_peer_connect(ok_ctx, &remote.desc, &ok_peer), TDM_OK);
        for (int op = XFER_OP_PUT; op <= XFER_OP_GET; op++) {
            params = batch_params((xfer_op_t)op, ok_pool, pages, pages, 4, &wait);
            assert_int_equal(xfer_batch_post(ok_peer, &params), TDM_IN_PROGRESS);
            await_batch_on(ok_ctx, &wait);
            assert_int_equal(wait.result.status, TDM_OK);
            assert_int_equal(wait.result.lane.cls, expected_lane());
            assert_int_equal(wait.result.lane.classes, XFER_LANE_BIT(expected_lane()));
            print_message("required %s, %s: lane %s (%s)\n", xfer_lane_class_name(expected_lane()),
                          op == XFER_OP_PUT ? "put" : "get",
                          xfer_lane_class_name(wait.result.lane.cls), wait.result.lane.text);
        }
        assert_int_equal(xfer_peer_status(ok_peer), TDM_OK);
        xfer_peer_close(ok_peer);
        xfer_pool_destroy(ok_pool);
        xfer_context_destroy(ok_ctx);
        memset(&wait, 0, sizeof(wait));
    }

    /* A context whose transports cannot reach the peer at all: refused at connect. */
    {
        xfer_context_params_t params_other;
        xfer_context_t *other = NULL;
        xfer_peer_t *none = NULL;

        xfer_context_params_default(&params_other);
        params_other.name = "prefill-other";
        params_other.transports = strcmp(test_tls(), "tcp") == 0 ? "shm" : "tcp";
        params_other.flags = test_context_flags();
        assert_int_equal(xfer_context_create(&params_other, &other), TDM_OK);
        assert_int_equal(xfer_peer_connect(other, &remote.desc, &none), TDM_ERR_UNSUPPORTED);
        assert_null(none);
        assert_int_equal(xfer_context_n_peers(other), 0);
        xfer_context_destroy(other);
    }

    /* A context that accepts only rc (and cuda_ipc) must refuse shm and tcp. */
    assert_int_equal(xfer_lane_mask_parse("rc,cuda_ipc", &other), TDM_OK);
    assert_int_equal(make_context("prefill-strict", other, 8, NULL, NULL, &strict), TDM_OK);
    assert_int_equal(make_pool(strict, PAGE_BYTES, &pool), TDM_OK);
    assert_int_equal(xfer_peer_connect(strict, &remote.desc, &peer), TDM_OK);
    params = batch_params(XFER_OP_PUT, pool, pages, pages, 4, &wait);
    assert_int_equal(xfer_batch_post(peer, &params), TDM_IN_PROGRESS);
    await_batch_on(strict, &wait);
    assert_int_equal(wait.result.status, TDM_ERR_UNSUPPORTED);
    assert_int_equal(wait.result.lane.cls, expected_lane());
    assert_int_equal(xfer_peer_status(peer), TDM_ERR_UNSUPPORTED);
    memset(&wait, 0, sizeof(wait));
    assert_int_equal(xfer_batch_post(peer, &params), TDM_ERR_UNSUPPORTED);
    assert_false(wait.done);
    xfer_metrics_get(xfer_context_metrics(strict), &snap);
    assert_int_equal(snap.n_lane_refusals, 1);

    xfer_peer_close(peer);
    xfer_pool_destroy(pool);
    xfer_context_destroy(strict);
    finish(&remote);
}

static void test_create_and_connect_errors_change_nothing(void **state)
{
    fixture_t *fx = *state;
    xfer_context_params_t params;
    xfer_context_t *ctx = NULL;
    xfer_pool_params_t pool_params;
    xfer_pool_t *pool = NULL;
    xfer_peer_t *peer = NULL;
    xfer_desc_t own;
    const uint8_t *bytes;
    size_t n_bytes;
    char long_name[80];

    xfer_context_params_default(&params);
    params.name = "";
    assert_int_equal(xfer_context_create(&params, &ctx), TDM_ERR_INVALID_ARG);
    memset(long_name, 'w', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    params.name = long_name;
    assert_int_equal(xfer_context_create(&params, &ctx), TDM_ERR_INVALID_ARG);
    params.name = "ok";
    params.max_batches = 0;
    assert_int_equal(xfer_context_create(&params, &ctx), TDM_ERR_INVALID_ARG);
    xfer_context_params_default(&params);
    params.transports = "no_such_transport";
    assert_int_equal(xfer_context_create(&params, &ctx), TDM_ERR_UNSUPPORTED);
    assert_null(ctx);

    memset(&pool_params, 0, sizeof(pool_params));
    pool_params.page_size_bytes = 0;
    pool_params.n_pages = 4;
    assert_int_equal(xfer_pool_create(fx->ctx, &pool_params, &pool), TDM_ERR_INVALID_ARG);
    pool_params.page_size_bytes = PAGE_BYTES;
    pool_params.mem_type = (xfer_mem_type_t)7;
    assert_int_equal(xfer_pool_create(fx->ctx, &pool_params, &pool), TDM_ERR_INVALID_ARG);
    if (!xfer_pool_device_memory_available()) {
        pool_params.mem_type = XFER_MEM_CUDA; /* no CUDA in the build, or no device */
        assert_int_equal(xfer_pool_create(fx->ctx, &pool_params, &pool), TDM_ERR_UNSUPPORTED);
    }
    assert_null(pool);

    /* Our own descriptor is not a peer. */
    xfer_pool_descriptor(fx->pool, &bytes, &n_bytes);
    assert_int_equal(xfer_desc_parse(bytes, n_bytes, &own), TDM_OK);
    assert_true(own.incarnation_id == xfer_context_incarnation_id(fx->ctx));
    assert_string_equal(own.name, xfer_context_name(fx->ctx));
    assert_int_equal(xfer_peer_connect(fx->ctx, &own, &peer), TDM_ERR_INVALID_ARG);
    assert_null(peer);
    assert_int_equal(xfer_context_n_peers(fx->ctx), 0);

    /* Nothing to do: waiting times out; arming succeeds. */
    assert_int_equal(xfer_context_wait(fx->ctx, 20), TDM_ERR_TIMEOUT);
    xfer_context_progress(fx->ctx);
    assert_int_equal(xfer_context_arm(fx->ctx), TDM_OK);
    xfer_context_destroy(NULL);
    xfer_pool_destroy(NULL);
    xfer_peer_close(NULL);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_receiver_killed_mid_transfer_fails_only_that_peer,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_restarted_peer_reached_by_new_descriptor_old_refused,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_required_transport_refuses_other_lanes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_create_and_connect_errors_change_nothing, setup,
                                        teardown),
    };

    if (harness_is_child(argc, argv)) {
        return child_main(argc, argv);
    }
    harness_prepare();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
