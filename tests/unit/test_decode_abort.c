/* test_decode_abort.c - the decode node's side of page ownership (docs/PROTOCOL.md 4), driven in
 * process on the tiny preset (decode-node/sched.h over a pool without UCX; the router's messages
 * by hand). The timer fence here is long (10 minutes), so every page that comes back in these
 * tests came back on the writer's word, never on a timer: an Abort of a reservation whose writer
 * has not answered keeps the pages; the router's forwarded acknowledgement (Abort.writer_fenced)
 * frees them at once, ACTIVE or FENCED; a late reservation the router never handed to a writer
 * (the orphan of a paused decode node) is freed at once by the router's Abort; a request-wide
 * Abort of a turn still reserving frees its reservation, and never one the router aborted by id
 * before whose writer is still silent. A PageReservation names the attempt it answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "decode-node/pool.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "forward_test_util.h"
#include "proto/proto.h"

#define MAX_MSGS   64
#define POOL_PAGES 128u
#define FENCE_MS   600000u /* the last-resort timer: never reached in these tests */

typedef struct {
    ftu_engine_t engine;
    decode_pool_t *pool;
    decode_sessions_t *sessions;
    decode_sched_t *sched;
    Tandem__Envelope *msgs[MAX_MSGS];
    int n_msgs;
} fixture_t;

static void record_send(void *arg, const Tandem__Envelope *env)
{
    fixture_t *fx = arg;
    uint8_t *buf = NULL;
    size_t n = 0;
    Tandem__Envelope *copy = NULL;

    assert_true(fx->n_msgs < MAX_MSGS);
    assert_int_equal(proto_pack(env, &buf, &n), TDM_OK);
    assert_int_equal(proto_unpack(buf, n, 0, &copy, NULL, 0), TDM_OK);
    free(buf);
    fx->msgs[fx->n_msgs++] = copy;
}

static void record_load(void *arg, const node_load_t *load)
{
    (void)arg;
    (void)load;
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    decode_sched_params_t sp;
    decode_sched_out_t out = {record_send, record_load, NULL};

    if (fx == NULL || ftu_engine_open(&fx->engine, 16) != 0) {
        return -1;
    }
    out.arg = fx;
    memset(&sp, 0, sizeof(sp));
    sp.fence_ms = FENCE_MS;
    sp.max_batch = 4;
    sp.chunk_tokens = 64;
    sp.n_threads = 1;
    sp.spec_drafter = ENGINE_SPEC_OFF;
    if (decode_pool_create(fx->engine.model, POOL_PAGES, NULL, &fx->pool) != TDM_OK ||
        decode_sessions_create(8, &fx->sessions) != TDM_OK ||
        decode_sched_create(&sp, fx->engine.model, fx->pool, fx->sessions, &out, &fx->sched) !=
            TDM_OK) {
        return -1;
    }
    *state = fx;
    return 0;
}

/* Every page free and no reservation left when the test ends. */
static int teardown(void **state)
{
    fixture_t *fx = *state;
    int ok = decode_pool_n_free(fx->pool) == POOL_PAGES && decode_pool_n_reserved(fx->pool) == 0;

    decode_sched_destroy(fx->sched);
    decode_sessions_destroy(fx->sessions);
    decode_pool_destroy(fx->pool);
    for (int i = 0; i < fx->n_msgs; i++) {
        proto_envelope_free(fx->msgs[i]);
    }
    ok = ftu_engine_close(&fx->engine) == 0 && ok;
    free(fx);
    return ok ? 0 : -1;
}

/* ReservePages for a fresh session; returns the PageReservation's id and pages. */
static uint64_t reserve(fixture_t *fx, uint64_t request_id, const char *session,
                        uint32_t *n_pages_out)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__ReservePages rp = TANDEM__RESERVE_PAGES__INIT;
    const Tandem__Envelope *e;

    rp.request_id = request_id;
    rp.session_id = (char *)session;
    rp.total_len = 300;
    rp.timeout_ms = FENCE_MS;
    rp.attempt = 3;
    env.body_case = TANDEM__ENVELOPE__BODY_RESERVE_PAGES;
    env.reserve_pages = &rp;
    decode_sched_on_message(fx->sched, &env);
    assert_true(fx->n_msgs > 0);
    e = fx->msgs[fx->n_msgs - 1];
    assert_int_equal(e->body_case, TANDEM__ENVELOPE__BODY_PAGE_RESERVATION);
    assert_int_equal(e->page_reservation->request_id, request_id);
    assert_true(e->page_reservation->n_pages > 0);
    assert_int_equal(e->page_reservation->attempt, 3); /* echoed: the router matches its try */
    *n_pages_out = e->page_reservation->n_pages;
    return e->page_reservation->reservation_id;
}

static void abort_msg(fixture_t *fx, uint64_t request_id, uint64_t reservation_id, int fenced)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Abort a = TANDEM__ABORT__INIT;

    a.request_id = request_id;
    a.reservation_id = reservation_id;
    a.attempt = 1;
    a.writer_fenced = fenced != 0;
    a.reason = (char *)"test";
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    decode_sched_on_message(fx->sched, &env);
    decode_sched_step(fx->sched); /* expiry runs here: the timer must not free anything */
}

/* Old code: the pages came back only on the timer, whatever the writer said. */
static void test_pages_wait_for_the_writer_and_return_on_its_ack(void **state)
{
    fixture_t *fx = *state;
    uint32_t n_pages;
    uint64_t id = reserve(fx, 10, "a", &n_pages);

    abort_msg(fx, 10, id, 0); /* the writer was told to stop; it has not answered */
    assert_int_equal(decode_pool_n_reserved(fx->pool), n_pages);
    assert_int_equal(decode_pool_n_free(fx->pool), POOL_PAGES - n_pages);
    assert_false(decode_sessions_find(fx->sessions, "a")->busy); /* the session moves on */
    abort_msg(fx, 10, id, 1); /* the router forwards the writer's AbortAck */
    assert_int_equal(decode_pool_n_reserved(fx->pool), 0);
    assert_int_equal(decode_pool_n_free(fx->pool), POOL_PAGES);
}

/* The orphan of issue 16: a paused node answers ReservePages late; the router, whose turn moved
 * on, releases it with writer_fenced (nobody ever got the descriptor): free at once. */
static void test_late_reservation_is_freed_at_once(void **state)
{
    fixture_t *fx = *state;
    uint32_t n_pages;
    uint64_t id = reserve(fx, 20, "b", &n_pages);

    assert_int_equal(decode_pool_n_reserved(fx->pool), n_pages);
    abort_msg(fx, 20, id, 1);
    assert_int_equal(decode_pool_n_reserved(fx->pool), 0);
    assert_int_equal(decode_pool_n_free(fx->pool), POOL_PAGES);
    assert_false(decode_sessions_find(fx->sessions, "b")->busy);
}

static void test_request_wide_abort_frees_only_unseen_reservations(void **state)
{
    fixture_t *fx = *state;
    uint32_t n_first, n_second;
    uint64_t first = reserve(fx, 30, "c", &n_first);
    uint64_t second;

    abort_msg(fx, 30, first, 0);              /* attempt 1's writer is still silent: FENCED */
    second = reserve(fx, 30, "c", &n_second); /* attempt 2 reserves again */
    assert_int_equal(decode_pool_n_reserved(fx->pool), n_first + n_second);
    abort_msg(fx, 30, 0, 1); /* attempt 2 aborted while reserving */
    assert_int_equal(decode_pool_n_reserved(fx->pool), n_first);
    assert_null(decode_pool_find(fx->pool, second));
    assert_non_null(decode_pool_find(fx->pool, first));
    abort_msg(fx, 30, first, 1);
    assert_int_equal(decode_pool_n_reserved(fx->pool), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pages_wait_for_the_writer_and_return_on_its_ack, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_late_reservation_is_freed_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_wide_abort_frees_only_unseen_reservations,
                                        setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
