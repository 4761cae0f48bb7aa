/* test_decode_notices.c - sequence state off the router (issue 18 item 4), the decode node's
 * half: decode-node/notices.h joins the state notice a prefill node sends straight to the decode
 * node (a transfer notice whose payload is node/node_state.h's) with the router's small
 * CompletionNotice (state_direct), whichever arrives first; a request whose notice does not come
 * within the wait fails alone and its reservation's pages go back.
 *
 * The tables are driven with explicit clocks; the scheduler part runs on the tiny preset
 * (decode-node/sched.h over a pool without UCX, the router's messages by hand, as
 * test_decode_abort.c does) with a short wait. End to end over UCX: test_cluster (both modes)
 * and test_cluster_state.c.
 */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/hash.h"
#include "decode-node/notices.h"
#include "decode-node/pool.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "forward_test_util.h"
#include "node/node_handoff.h"
#include "node/node_state.h"
#include "proto/proto.h"

#define MS         TDM_NS_PER_MS
#define MAX_MSGS   64
#define POOL_PAGES 128u
#define WAIT_MS    300u

static const uint8_t k_record[] = "a state record at T";
static uint64_t k_sums[2] = {11, 22};

/* A state as node_state_unpack makes it (packed, then unpacked: owned by the caller). */
static Tandem__CompletionNotice *make_state(uint64_t request_id, uint64_t reservation_id,
                                            uint32_t n_pages, uint64_t checksum)
{
    Tandem__CompletionNotice full = TANDEM__COMPLETION_NOTICE__INIT;
    Tandem__CompletionNotice *st = NULL;
    uint8_t *bytes = NULL;
    size_t n = 0;

    full.request_id = request_id;
    full.reservation_id = reservation_id;
    full.cached_len = 0;
    full.total_len = 300;
    full.page_checksums = k_sums;
    full.n_page_checksums = n_pages <= 2 ? n_pages : 2;
    full.state_record.data = (uint8_t *)k_record;
    full.state_record.len = sizeof(k_record);
    full.state_checksum = tdm_hash_xxh3_64(k_record, sizeof(k_record));
    assert_int_equal(node_state_pack(&full, &bytes, &n), TDM_OK);
    assert_int_equal(node_state_unpack(bytes, n, &st), TDM_OK);
    free(bytes);
    st->state_checksum = checksum != 0 ? checksum : st->state_checksum;
    return st;
}

static Tandem__DecodeRequest *make_request(uint64_t request_id, uint64_t reservation_id,
                                           Tandem__CompletionNotice *h)
{
    static Tandem__DecodeRequest dr;

    tandem__completion_notice__init(h);
    h->request_id = request_id;
    h->reservation_id = reservation_id;
    h->total_len = 300;
    h->state_direct = 1;
    h->n_pages = 2;
    h->state_checksum = tdm_hash_xxh3_64(k_record, sizeof(k_record));
    tandem__decode_request__init(&dr);
    dr.request_id = request_id;
    dr.session_id = (char *)"s";
    dr.mode = TANDEM__PREFILL_MODE__PREFILL_REMOTE;
    dr.total_len = 300;
    dr.max_tokens = 4;
    dr.handoff = h;
    return &dr;
}

/* The payload round trip and its checks. */
static void test_state_payload_round_trip_and_checks(void **state)
{
    Tandem__CompletionNotice full = TANDEM__COMPLETION_NOTICE__INIT;
    Tandem__CompletionNotice *st = NULL;
    uint8_t *bytes = NULL;
    size_t n = 0;

    (void)state;
    full.request_id = 7;
    full.reservation_id = 9;
    full.total_len = 300;
    full.page_checksums = k_sums;
    full.n_page_checksums = 2;
    full.first_token = 42; /* not part of the payload */
    full.state_record.data = (uint8_t *)k_record;
    full.state_record.len = sizeof(k_record);
    full.state_checksum = 1; /* wrong */
    assert_int_equal(node_state_pack(&full, &bytes, &n), TDM_ERR_INVALID_ARG);
    full.state_checksum = tdm_hash_xxh3_64(k_record, sizeof(k_record));
    assert_int_equal(node_state_pack(&full, &bytes, &n), TDM_OK);
    assert_int_equal(node_state_unpack(bytes, n, &st), TDM_OK);
    assert_int_equal(st->request_id, 7);
    assert_int_equal(st->reservation_id, 9);
    assert_int_equal(st->n_page_checksums, 2);
    assert_int_equal(st->n_pages, 2);
    assert_int_equal(st->page_checksums[1], 22);
    assert_int_equal(st->first_token, 0);
    assert_memory_equal(st->state_record.data, k_record, sizeof(k_record));
    node_state_free(st);
    st = NULL;
    {
        uint8_t *at = memmem(bytes, n, k_record, sizeof(k_record));
        assert_non_null(at);
        at[2] ^= 0x40; /* inside the record: the checksum catches it */
    }
    assert_int_equal(node_state_unpack(bytes, n, &st), TDM_ERR_MISMATCH);
    assert_null(st);
    assert_int_equal(node_state_unpack(bytes, 3, &st), TDM_ERR_FORMAT);
    free(bytes);
}

/* Descriptor version 3: the record at H named by staged pages, not carried; version 2 (inline)
 * when nothing is staged. */
static void test_descriptor_names_the_staged_record(void **state)
{
    uint32_t history[2] = {4, 5}, targets[3] = {7, 8, 9}, stage[2] = {30, 31};
    uint64_t digests[2] = {0x11, 0x22};
    uint8_t record[100];
    node_resv_desc_t d, back;
    uint8_t *bytes = NULL;
    size_t n = 0, n_inline = 0;

    (void)state;
    memset(&d, 0, sizeof(d));
    memset(record, 0x5a, sizeof(record));
    d.reservation_id = 77;
    d.cached_len = 128;
    d.total_len = 300;
    d.n_sources = 1;
    d.src[0].layer = 0;
    d.src[0].n_history = 2;
    d.src[0].history = history;
    d.src[0].history_digests = digests;
    d.src[0].first_target = 2;
    d.src[0].n_targets = 3;
    d.src[0].targets = targets;
    d.record = record;
    d.n_record = sizeof(record);
    assert_int_equal(node_resv_desc_encode(&d, &bytes, &n_inline), TDM_OK);
    assert_int_equal(node_resv_desc_parse(bytes, n_inline, &back), TDM_OK);
    assert_int_equal(back.n_stage, 0);
    assert_non_null(back.record);
    assert_memory_equal(back.record, record, sizeof(record));
    node_resv_desc_fini(&back);
    free(bytes);
    d.n_stage = 2;
    d.stage = stage;
    d.record_checksum = tdm_hash_xxh3_64(record, sizeof(record));
    assert_int_equal(node_resv_desc_encode(&d, &bytes, &n), TDM_OK);
    assert_true(n + sizeof(record) - 8 - 4 - 8 == n_inline); /* no record bytes: their place */
    assert_int_equal(node_resv_desc_parse(bytes, n, &back), TDM_OK);
    assert_null(back.record);
    assert_int_equal(back.n_record, sizeof(record));
    assert_int_equal(back.n_stage, 2);
    assert_int_equal(back.stage[1], 31);
    assert_int_equal(back.record_checksum, d.record_checksum);
    assert_int_equal(back.src[0].history_digests[1], 0x22); /* digests kept from version 2 */
    assert_int_equal(back.src[0].targets[2], 9);
    node_resv_desc_fini(&back);
    free(bytes);
}

/* Notice first, then the request; and the request first, then the notice. */
static void test_join_in_either_order(void **state)
{
    decode_notices_params_t p = {WAIT_MS, 1000, 8};
    decode_notices_t *n = NULL;
    decode_notices_stats_t st;
    Tandem__CompletionNotice h, *got;
    Tandem__DecodeRequest *dr_out = NULL;
    uint64_t t = 1000 * MS;

    (void)state;
    assert_int_equal(decode_notices_create(&p, &n), TDM_OK);
    /* notice first */
    assert_int_equal(decode_notices_put(n, make_state(1, 101, 2, 0), t), TDM_OK);
    assert_null(decode_notices_take(n, 999));
    got = decode_notices_take(n, 101);
    assert_non_null(got);
    assert_int_equal(got->request_id, 1);
    node_state_free(got);
    assert_null(decode_notices_take(n, 101)); /* taken once */
    /* request first */
    assert_int_equal(decode_notices_park(n, make_request(2, 102, &h), t), TDM_OK);
    assert_int_equal(decode_notices_next(n, t + 10 * MS, &dr_out, &got), DECODE_NOTICES_NONE);
    assert_int_equal(decode_notices_put(n, make_state(2, 102, 2, 0), t + 20 * MS), TDM_OK);
    assert_int_equal(decode_notices_next(n, t + 20 * MS, &dr_out, &got), DECODE_NOTICES_READY);
    assert_int_equal(dr_out->request_id, 2);
    assert_int_equal(dr_out->handoff->reservation_id, 102);
    assert_true(dr_out->handoff->state_direct);
    assert_int_equal(got->reservation_id, 102);
    tandem__decode_request__free_unpacked(dr_out, NULL);
    node_state_free(got);
    assert_int_equal(decode_notices_next(n, t + 30 * MS, &dr_out, &got), DECODE_NOTICES_NONE);
    decode_notices_stats(n, &st);
    assert_int_equal(st.arrived_total, 2);
    assert_int_equal(st.notice_first_total, 1);
    assert_int_equal(st.request_first_total, 1);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.waiting, 0);
    decode_notices_destroy(n);
}

/* A request waits wait_ms, then times out alone; unclaimed notices go after keep_ms; a
 * released reservation forgets both; the table is bounded. */
static void test_timeouts_drops_and_bounds(void **state)
{
    decode_notices_params_t p = {WAIT_MS, 1000, 2};
    decode_notices_t *n = NULL;
    decode_notices_stats_t st;
    Tandem__CompletionNotice h1, h2, h3, *got;
    Tandem__DecodeRequest *dr_out = NULL;
    uint64_t t = 1000 * MS;

    (void)state;
    assert_int_equal(decode_notices_create(&p, &n), TDM_OK);
    assert_int_equal(decode_notices_park(n, make_request(1, 101, &h1), t), TDM_OK);
    assert_int_equal(decode_notices_park(n, make_request(2, 102, &h2), t + 200 * MS), TDM_OK);
    assert_int_equal(decode_notices_park(n, make_request(3, 103, &h3), t), TDM_ERR_BUSY);
    assert_int_equal(decode_notices_next(n, t + (WAIT_MS - 1) * MS, &dr_out, &got),
                     DECODE_NOTICES_NONE);
    assert_int_equal(decode_notices_next(n, t + WAIT_MS * MS, &dr_out, &got),
                     DECODE_NOTICES_TIMEOUT);
    assert_int_equal(dr_out->request_id, 1); /* only the first: the second has time left */
    assert_null(got);
    tandem__decode_request__free_unpacked(dr_out, NULL);
    assert_int_equal(decode_notices_next(n, t + WAIT_MS * MS, &dr_out, &got), DECODE_NOTICES_NONE);
    assert_int_equal(decode_notices_drop_request(n, 2), 102); /* an Abort */
    assert_int_equal(decode_notices_drop_request(n, 2), 0);
    /* notices: bounded at 2, unclaimed ones expire, a released reservation drops its own */
    assert_int_equal(decode_notices_put(n, make_state(4, 104, 2, 0), t), TDM_OK);
    assert_int_equal(decode_notices_put(n, make_state(5, 105, 2, 0), t + 500 * MS), TDM_OK);
    assert_int_equal(decode_notices_put(n, make_state(6, 106, 2, 0), t + 600 * MS), TDM_OK);
    assert_null(decode_notices_take(n, 104)); /* the oldest made room */
    assert_int_equal(decode_notices_drop(n, 106), 0);
    assert_int_equal(decode_notices_next(n, t + 1600 * MS, &dr_out, &got), DECODE_NOTICES_NONE);
    assert_null(decode_notices_take(n, 105)); /* kept 1000 ms, then dropped */
    decode_notices_stats(n, &st);
    assert_int_equal(st.timeouts_total, 1);
    assert_int_equal(st.expired_total, 3);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.waiting, 0);
    decode_notices_destroy(n);
}

/* ---- the scheduler: a decode node without UCX, the notices fed by hand ------------------ */

typedef struct {
    ftu_engine_t engine;
    decode_pool_t *pool;
    decode_sessions_t *sessions;
    decode_notices_t *notices;
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
    decode_notices_params_t np = {WAIT_MS, 0, 0};
    decode_sched_params_t sp;
    decode_sched_out_t out = {record_send, record_load, NULL};

    if (fx == NULL || ftu_engine_open(&fx->engine, 16) != 0 ||
        decode_notices_create(&np, &fx->notices) != TDM_OK) {
        return -1;
    }
    out.arg = fx;
    memset(&sp, 0, sizeof(sp));
    sp.fence_ms = 600000; /* every page that comes back here comes back on purpose */
    sp.max_batch = 4;
    sp.chunk_tokens = 64;
    sp.n_threads = 1;
    sp.spec_drafter = ENGINE_SPEC_OFF;
    sp.notices = fx->notices;
    if (decode_pool_create(fx->engine.model, POOL_PAGES, NULL, &fx->pool) != TDM_OK ||
        decode_sessions_create(8, &fx->sessions) != TDM_OK ||
        decode_sched_create(&sp, fx->engine.model, fx->pool, fx->sessions, &out, &fx->sched) !=
            TDM_OK) {
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    int ok = decode_pool_n_free(fx->pool) == POOL_PAGES && decode_pool_n_reserved(fx->pool) == 0;

    decode_sched_destroy(fx->sched);
    decode_sessions_destroy(fx->sessions);
    decode_pool_destroy(fx->pool);
    decode_notices_destroy(fx->notices);
    for (int i = 0; i < fx->n_msgs; i++) {
        proto_envelope_free(fx->msgs[i]);
    }
    ok = ftu_engine_close(&fx->engine) == 0 && ok;
    free(fx);
    return ok ? 0 : -1;
}

static uint64_t reserve(fixture_t *fx, uint64_t request_id, const char *session,
                        uint32_t *n_pages_out)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__ReservePages rp = TANDEM__RESERVE_PAGES__INIT;
    const Tandem__Envelope *e;

    rp.request_id = request_id;
    rp.session_id = (char *)session;
    rp.total_len = 300;
    rp.timeout_ms = 600000;
    env.body_case = TANDEM__ENVELOPE__BODY_RESERVE_PAGES;
    env.reserve_pages = &rp;
    decode_sched_on_message(fx->sched, &env);
    e = fx->msgs[fx->n_msgs - 1];
    assert_int_equal(e->body_case, TANDEM__ENVELOPE__BODY_PAGE_RESERVATION);
    *n_pages_out = e->page_reservation->n_pages;
    return e->page_reservation->reservation_id;
}

static void send_direct(fixture_t *fx, uint64_t request_id, uint64_t resv, const char *session,
                        uint32_t n_pages)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__CompletionNotice h;
    Tandem__DecodeRequest *dr = make_request(request_id, resv, &h);

    dr->session_id = (char *)session;
    h.n_pages = n_pages;
    env.body_case = TANDEM__ENVELOPE__BODY_DECODE_REQUEST;
    env.decode_request = dr;
    decode_sched_on_message(fx->sched, &env);
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Count the Errors for request_id with code `code` among the recorded messages. */
static int n_errors(const fixture_t *fx, uint64_t request_id, Tandem__ErrorCode code)
{
    int k = 0;

    for (int i = 0; i < fx->n_msgs; i++) {
        const Tandem__Envelope *e = fx->msgs[i];
        k += e->body_case == TANDEM__ENVELOPE__BODY_ERROR && e->error->request_id == request_id &&
             e->error->code == code;
    }
    return k;
}

/* Two handoffs wait for their notices; the first one's never comes: after the wait it alone
 * fails (STATE_LOST, naming the notice) and its pages go back at once; the second still waits
 * with its pages reserved until its own notice arrives (a bad one here: refused, pages back). */
static void test_sched_timeout_fails_only_that_request(void **state)
{
    fixture_t *fx = *state;
    uint32_t n1, n2;
    uint64_t r1 = reserve(fx, 1, "a", &n1), r2 = reserve(fx, 2, "b", &n2);
    decode_notices_stats_t st;

    send_direct(fx, 1, r1, "a", n1);
    sleep_ms(WAIT_MS / 2);
    send_direct(fx, 2, r2, "b", n2);
    decode_sched_join_notices(fx->sched);
    decode_notices_stats(fx->notices, &st);
    assert_int_equal(st.waiting, 2);
    assert_int_equal(decode_pool_n_reserved(fx->pool), n1 + n2);
    sleep_ms(WAIT_MS / 2 + 50);
    decode_sched_join_notices(fx->sched);
    assert_int_equal(n_errors(fx, 1, TANDEM__ERROR_CODE__ERROR_STATE_LOST), 1);
    assert_int_equal(n_errors(fx, 2, TANDEM__ERROR_CODE__ERROR_STATE_LOST), 0);
    assert_int_equal(decode_pool_n_reserved(fx->pool), n2); /* request 1's pages are back */
    assert_false(decode_sessions_find(fx->sessions, "a")->busy);
    assert_true(decode_sessions_find(fx->sessions, "b")->busy);
    assert_non_null(strstr(fx->msgs[fx->n_msgs - 1]->error->message, "state notice"));
    /* request 2's notice arrives (wrong record checksum): joined, checked, refused */
    assert_int_equal(
        decode_notices_put(fx->notices, make_state(2, r2, n2, 12345), tdm_clock_now_ns()), TDM_OK);
    decode_sched_join_notices(fx->sched);
    assert_int_equal(n_errors(fx, 2, TANDEM__ERROR_CODE__ERROR_STATE_LOST), 1);
    assert_int_equal(decode_pool_n_reserved(fx->pool), 0);
    decode_notices_stats(fx->notices, &st);
    assert_int_equal(st.timeouts_total, 1);
    assert_int_equal(st.request_first_total, 1);
    assert_int_equal(st.waiting, 0);
}

/* The notice first: the DecodeRequest joins it at once (no wait); an Abort of a waiting
 * handoff frees its pages. */
static void test_sched_notice_first_and_abort_while_waiting(void **state)
{
    fixture_t *fx = *state;
    uint32_t n1, n2;
    uint64_t r1 = reserve(fx, 1, "a", &n1), r2 = reserve(fx, 2, "b", &n2);
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Abort a = TANDEM__ABORT__INIT;
    decode_notices_stats_t st;

    assert_int_equal(
        decode_notices_put(fx->notices, make_state(1, r1, n1, 54321), tdm_clock_now_ns()), TDM_OK);
    send_direct(fx, 1, r1, "a", n1); /* joined now: refused (the record does not check) */
    assert_int_equal(n_errors(fx, 1, TANDEM__ERROR_CODE__ERROR_STATE_LOST), 1);
    decode_notices_stats(fx->notices, &st);
    assert_int_equal(st.notice_first_total, 1);
    assert_int_equal(st.held, 0);
    assert_int_equal(decode_pool_n_reserved(fx->pool), n2);
    send_direct(fx, 2, r2, "b", n2); /* waits */
    a.request_id = 2;
    a.reason = (char *)"client gone";
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    decode_sched_on_message(fx->sched, &env);
    assert_int_equal(decode_pool_n_reserved(fx->pool), 0);
    assert_false(decode_sessions_find(fx->sessions, "b")->busy);
    decode_notices_stats(fx->notices, &st);
    assert_int_equal(st.waiting, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_payload_round_trip_and_checks),
        cmocka_unit_test(test_descriptor_names_the_staged_record),
        cmocka_unit_test(test_join_in_either_order),
        cmocka_unit_test(test_timeouts_drops_and_bounds),
        cmocka_unit_test_setup_teardown(test_sched_timeout_fails_only_that_request, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sched_notice_first_and_abort_while_waiting, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
