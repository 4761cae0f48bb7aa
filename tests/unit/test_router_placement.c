/* test_router_placement.c - router/placement.h over a registry filled by hand (no sockets): a
 * decode or prefill worker whose heartbeat says draining (issue 16 item 9) gets no new work,
 * the others still do, and with every worker draining there is no placement (-1: the router
 * answers 503). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proto/proto.h"
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draining_workers_get_no_new_work),
    };

    return cmocka_run_group_tests(tests, NULL, NULL) == 0 ? 0 : 1;
}
