/* test_router_placement.c - router/placement.h over a registry filled by hand (no sockets): a
 * decode or prefill worker whose heartbeat says draining (issue 16 item 9) gets no new work,
 * the others still do, and with every worker draining there is no placement (-1: the router
 * answers 503); a prefill worker that keeps a session's history pages (Load.history_sessions,
 * issue 17) gets that session's jobs unless it is much more loaded than the best. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/proto.h"
#include "proto/proto_hash.h"
#include "router/placement.h"
#include "router/registry.h"

static const char *const kv_formats[2] = {PROTO_KV_FORMAT_MAIN, PROTO_KV_FORMAT_INDEX};

static const proto_compat_t compat = {
    .model_fingerprint = 0x1234,
    .page_format_version = 1,
    .page_rows = 64,
    .page_bytes = 4096,
    .tokens_per_block = 64,
    .kv_formats = kv_formats,
    .n_kv_formats = 2,
    .max_context = 1024,
    .protocol_version = PROTO_VERSION,
};

static int add_worker(router_registry_t *reg, const char *id, Tandem__Role role)
{
    Tandem__Register r = TANDEM__REGISTER__INIT;
    Tandem__PageFormat pf = TANDEM__PAGE_FORMAT__INIT;
    Tandem__Capacity cap = TANDEM__CAPACITY__INIT;
    char reason[256] = "";
    int slot = -1;

    pf.version = compat.page_format_version;
    pf.rows_per_page = compat.page_rows;
    pf.page_bytes = compat.page_bytes;
    pf.tokens_per_block = compat.tokens_per_block;
    cap.total_pages = role == TANDEM__ROLE__ROLE_DECODE ? 1000 : 0;
    cap.max_sequences = 8;
    r.role = role;
    r.incarnation_id = (char *)id;
    r.rack = (char *)"rack0";
    r.node = (char *)"localhost";
    r.model_fingerprint = compat.model_fingerprint;
    r.page_format = &pf;
    r.kv_formats = (char **)kv_formats;
    r.n_kv_formats = 2;
    r.max_context = compat.max_context;
    r.protocol_version = PROTO_VERSION;
    r.capacity = &cap;
    if (router_registry_register(reg, id, &r, 1, &slot, reason, sizeof(reason)) != TDM_OK) {
        fail_msg("register %s: %s", id, reason);
    }
    return slot;
}

/* A heartbeat of `id`: busy (many running sequences: scored last) and/or draining. */
static void beat(router_registry_t *reg, const char *id, uint32_t running, int draining)
{
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    Tandem__Load load = TANDEM__LOAD__INIT;

    load.running_sequences = running;
    load.free_pages = 1000;
    load.total_pages = 1000;
    load.draining = draining;
    hb.seq = 1;
    hb.load = &load;
    assert_int_equal(router_registry_heartbeat(reg, id, &hb, 2), TDM_OK);
}

static void test_draining_workers_get_no_new_work(void **state)
{
    router_registry_t *reg = NULL;
    int d0, d1, p0, p1;
    uint64_t gen = 0;

    (void)state;
    assert_int_equal(router_registry_create(&compat, 1500, &reg), TDM_OK);
    d0 = add_worker(reg, "decode-0", TANDEM__ROLE__ROLE_DECODE);
    d1 = add_worker(reg, "decode-1", TANDEM__ROLE__ROLE_DECODE);
    p0 = add_worker(reg, "prefill-0", TANDEM__ROLE__ROLE_PREFILL);
    p1 = add_worker(reg, "prefill-1", TANDEM__ROLE__ROLE_PREFILL);

    /* decode-0 idle, decode-1 busy: decode-0 wins ... until it drains */
    beat(reg, "decode-0", 0, 0);
    beat(reg, "decode-1", 7, 0);
    assert_int_equal(router_place_decode(reg, 0, &gen, NULL, NULL), d0);
    beat(reg, "decode-0", 0, 1);
    assert_int_equal(router_place_decode(reg, 0, &gen, NULL, NULL), d1);
    assert_int_equal(gen, router_registry_worker(reg, d1, 0)->generation);
    /* draining is sticky: a later heartbeat without the flag does not undo it */
    beat(reg, "decode-0", 0, 0);
    assert_int_equal(router_place_decode(reg, 0, &gen, NULL, NULL), d1);
    beat(reg, "decode-1", 7, 1);
    assert_int_equal(router_place_decode(reg, 0, &gen, NULL, NULL), -1);

    /* the same for prefill workers */
    assert_true(router_place_prefill(reg, NULL, 0, &gen, NULL) == p0 ||
                router_place_prefill(reg, NULL, 0, &gen, NULL) == p1);
    beat(reg, "prefill-0", 0, 1);
    assert_int_equal(router_place_prefill(reg, NULL, 0, &gen, NULL), p1);
    beat(reg, "prefill-1", 0, 1);
    assert_int_equal(router_place_prefill(reg, NULL, 0, &gen, NULL), -1);
    router_registry_destroy(reg);
}

/* A prefill heartbeat: `queued` tokens waiting at 1,000 tok/s, holding sessions keys[n]. */
static void beat_prefill(router_registry_t *reg, const char *id, uint64_t queued,
                         const uint64_t *keys, size_t n)
{
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    Tandem__Load load = TANDEM__LOAD__INIT;

    load.queued_prefill_tokens = queued;
    load.recent_tokens_per_s = 1000.0;
    load.history_sessions = (uint64_t *)keys;
    load.n_history_sessions = n;
    hb.seq = 1;
    hb.load = &load;
    assert_int_equal(router_registry_heartbeat(reg, id, &hb, 2), TDM_OK);
}

static void test_prefill_prefers_the_worker_holding_the_session(void **state)
{
    router_registry_t *reg = NULL;
    int p0, p1;
    uint64_t gen = 0;
    uint64_t s1 = proto_session_hash("session-1"), s2 = proto_session_hash("session-2");
    uint64_t held[3] = {proto_session_hash("x"), s1, proto_session_hash("y")};

    (void)state;
    assert_int_equal(router_registry_create(&compat, 1500, &reg), TDM_OK);
    add_worker(reg, "decode-0", TANDEM__ROLE__ROLE_DECODE);
    p0 = add_worker(reg, "prefill-0", TANDEM__ROLE__ROLE_PREFILL);
    p1 = add_worker(reg, "prefill-1", TANDEM__ROLE__ROLE_PREFILL);
    /* p1 holds session-1 and is a little busier (0.5 s of backlog): it still gets session-1 */
    beat_prefill(reg, "prefill-0", 0, NULL, 0);
    beat_prefill(reg, "prefill-1", 500, held, 3);
    assert_true(router_worker_holds_session(router_registry_worker(reg, p1, 0), s1));
    assert_false(router_worker_holds_session(router_registry_worker(reg, p0, 0), s1));
    assert_false(router_worker_holds_session(router_registry_worker(reg, p1, 0), 0));
    assert_int_equal(router_place_prefill_session(reg, NULL, 0, s1, &gen, NULL), p1);
    assert_int_equal(gen, router_registry_worker(reg, p1, 0)->generation);
    /* other sessions and no session go to the least loaded worker */
    assert_int_equal(router_place_prefill_session(reg, NULL, 0, s2, &gen, NULL), p0);
    assert_int_equal(router_place_prefill_session(reg, NULL, 0, 0, &gen, NULL), p0);
    assert_int_equal(router_place_prefill(reg, NULL, 0, &gen, NULL), p0);
    /* much more loaded (3 s over the best, > ROUTER_PLACE_HISTORY_SLACK_S): the best wins */
    beat_prefill(reg, "prefill-1", 3000, held, 3);
    assert_int_equal(router_place_prefill_session(reg, NULL, 0, s1, &gen, NULL), p0);
    /* a later heartbeat without the session drops the hint */
    beat_prefill(reg, "prefill-1", 500, NULL, 0);
    assert_false(router_worker_holds_session(router_registry_worker(reg, p1, 0), s1));
    assert_int_equal(router_place_prefill_session(reg, NULL, 0, s1, &gen, NULL), p0);
    /* a draining holder gets nothing */
    beat_prefill(reg, "prefill-1", 0, held, 3);
    assert_int_equal(router_place_prefill_session(reg, NULL, 0, s1, &gen, NULL), p1);
    beat(reg, "prefill-1", 0, 1);
    assert_int_equal(router_place_prefill_session(reg, NULL, 0, s1, &gen, NULL), p0);
    router_registry_destroy(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draining_workers_get_no_new_work),
        cmocka_unit_test(test_prefill_prefers_the_worker_holding_the_session),
    };

    return cmocka_run_group_tests(tests, NULL, NULL) == 0 ? 0 : 1;
}
