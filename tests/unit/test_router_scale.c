/* test_router_scale.c - the registry without a worker cap and its placement indexes (issue 18):
 * more than 256 workers register, are found by id and iterated; after random sequences of
 * register, heartbeat, lost, assign/release, drain and capacity limits the indexed placement
 * picks exactly what a linear scan of the policy picks (router_place_ref.h); with several racks a
 * prefill job stays in its decode worker's rack, and spills to the least loaded rack once that
 * rack is saturated (ROUTER_PLACE_RACK_SATURATED_S); the session table evicts the least
 * recently used idle session through its heap and matches prefixes after its block index grew. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "proto/proto.h"
#include "router/placement.h"
#include "router/registry.h"
#include "router/session.h"
#include "router_place_ref.h"

static const char *const kv_formats[2] = {PROTO_KV_FORMAT_MAIN, PROTO_KV_FORMAT_INDEX};

static const proto_compat_t compat = {
    .model_fingerprint = 0x1234,
    .page_format_version = 1,
    .page_rows = 64,
    .page_bytes = 4096,
    .tokens_per_block = 64,
    .kv_formats = kv_formats,
    .n_kv_formats = 2,
    .max_context = 1 << 20,
    .protocol_version = PROTO_VERSION,
};

static int add_worker(router_registry_t *reg, const char *id, Tandem__Role role, const char *rack,
                      uint64_t max_tokens, const char *transport)
{
    Tandem__Register r = TANDEM__REGISTER__INIT;
    Tandem__PageFormat pf = TANDEM__PAGE_FORMAT__INIT;
    Tandem__Capacity cap = TANDEM__CAPACITY__INIT;
    char *transports[1] = {(char *)transport};
    char reason[256] = "";
    int slot = -1;

    pf.version = compat.page_format_version;
    pf.rows_per_page = compat.page_rows;
    pf.page_bytes = compat.page_bytes;
    pf.tokens_per_block = compat.tokens_per_block;
    cap.total_pages = role == TANDEM__ROLE__ROLE_DECODE ? 1000 : 0;
    cap.max_sequences = 16;
    cap.max_tokens = max_tokens;
    r.role = role;
    r.incarnation_id = (char *)id;
    r.rack = (char *)rack;
    r.node = (char *)"host";
    r.model_fingerprint = compat.model_fingerprint;
    r.page_format = &pf;
    r.kv_formats = (char **)kv_formats;
    r.n_kv_formats = 2;
    r.max_context = compat.max_context;
    r.protocol_version = PROTO_VERSION;
    r.capacity = &cap;
    if (transport != NULL) {
        r.transports = transports;
        r.n_transports = 1;
    }
    if (router_registry_register(reg, id, &r, 1, &slot, reason, sizeof(reason)) != TDM_OK) {
        fail_msg("register %s: %s", id, reason);
    }
    return slot;
}

static void beat(router_registry_t *reg, const char *id, uint32_t running, uint32_t free_pages,
                 uint64_t queued, double rate, int stalled, int draining)
{
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    Tandem__Load load = TANDEM__LOAD__INIT;

    load.running_sequences = running;
    load.free_pages = free_pages;
    load.total_pages = 1000;
    load.queued_prefill_tokens = queued;
    load.recent_tokens_per_s = rate;
    load.stalled = stalled;
    load.draining = draining;
    hb.seq = 1;
    hb.load = &load;
    assert_int_equal(router_registry_heartbeat(reg, id, &hb, 2), TDM_OK);
}

static void test_more_than_256_workers_register(void **state)
{
    router_registry_t *reg = NULL;
    enum { N = 1000 };
    int slots[N];
    char id[32];
    uint32_t n = 0;
    uint64_t gen = 0;

    (void)state;
    assert_int_equal(router_registry_create(&compat, 1500, &reg), TDM_OK);
    for (int i = 0; i < N; i++) {
        char rack[16];
        snprintf(id, sizeof(id), "w-%d", i);
        snprintf(rack, sizeof(rack), "nvl-%d", i % 150); /* past the first rack table size */
        slots[i] =
            add_worker(reg, id, i % 4 == 0 ? TANDEM__ROLE__ROLE_PREFILL : TANDEM__ROLE__ROLE_DECODE,
                       rack, 0, NULL);
        assert_true(slots[i] >= 0);
    }
    assert_int_equal(router_registry_count(reg), N);
    assert_true(router_registry_capacity(reg) >= N);
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof(id), "w-%d", i);
        assert_int_equal(router_registry_find(reg, id), slots[i]);
    }
    for (int s = router_registry_next(reg, -1); s >= 0; s = router_registry_next(reg, s)) {
        n++;
    }
    assert_int_equal(n, N);
    /* a lost worker's slot is reused by a new incarnation with a new generation; the old
     * reference no longer matches */
    gen = router_registry_worker(reg, slots[300], 0)->generation;
    router_registry_remove(reg, slots[300], ROUTER_REGISTRY_LOST, "test");
    assert_int_equal(router_registry_find(reg, "w-300"), -1);
    assert_int_equal(router_registry_count(reg), N - 1);
    assert_int_equal(add_worker(reg, "w-300b", TANDEM__ROLE__ROLE_DECODE, "nvl-0", 0, NULL),
                     slots[300]);
    assert_null(router_registry_worker(reg, slots[300], gen));
    assert_non_null(router_registry_worker(reg, slots[300], 0));
    assert_true(router_place_decode(reg, 10, &gen, NULL, NULL) >= 0);
    for (int i = 0; i < 150; i++) {
        char rack[16];
        snprintf(rack, sizeof(rack), "nvl-%d", i);
        assert_non_null(router_registry_rack_named(reg, rack));
    }
    assert_null(router_registry_rack_named(reg, "nvl-150"));
    router_registry_destroy(reg);
}

/* Compare the indexed decisions with the reference scan for a few job shapes. */
static void check_against_reference(router_registry_t *reg, uint64_t *rng)
{
    static const uint64_t lengths[] = {10, 3000, 9000};
    uint64_t gen = 0;

    for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++) {
        int got = router_place_decode(reg, lengths[l], &gen, NULL, NULL);
        assert_int_equal(got, ref_place_decode(reg, lengths[l]));
    }
    for (int d = router_registry_next(reg, -1); d >= 0; d = router_registry_next(reg, d)) {
        const router_worker_t *dw = router_registry_worker(reg, d, 0);
        uint64_t key;
        int got;
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        if (dw->role != TANDEM__ROLE__ROLE_DECODE || (*rng >> 60) > 3) {
            continue;
        }
        key = (*rng >> 33) % 4; /* some workers hold sessions 1..3 */
        got = router_place_prefill_session(reg, dw, lengths[(*rng >> 20) % 3], key, &gen, NULL);
        if (!ref_prefill_ok(reg, dw, lengths[(*rng >> 20) % 3], key, got)) {
            fail_msg("prefill for decode slot %d chose %d, not what the scan allows", d, got);
        }
    }
}

static void test_index_matches_reference_scan(void **state)
{
    enum { N_IDS = 120, N_STEPS = 3000, N_RACKS = 5 };
    router_registry_t *reg = NULL;
    uint64_t rng = 12345;
    int live[N_IDS] = {0};
    int slot_of[N_IDS];
    uint64_t assigned[N_IDS] = {0};
    char id[32], rack[16];

    (void)state;
    assert_int_equal(router_registry_create(&compat, 1500, &reg), TDM_OK);
    for (int step = 0; step < N_STEPS; step++) {
        int i, op;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        i = (int)((rng >> 33) % N_IDS);
        op = (int)((rng >> 20) % 10);
        snprintf(id, sizeof(id), "w-%d", i);
        snprintf(rack, sizeof(rack), "r%d", (int)((rng >> 45) % N_RACKS));
        if (!live[i]) {
            /* register: roles by id; a few limit max_tokens or speak only "tcp" */
            slot_of[i] = add_worker(
                reg, id, i % 3 == 0 ? TANDEM__ROLE__ROLE_PREFILL : TANDEM__ROLE__ROLE_DECODE, rack,
                i % 7 == 0 ? 5000 : 0, i % 11 == 0 ? "tcp" : "rdma");
            live[i] = 1;
            assigned[i] = 0;
        } else if (op <= 4) {
            beat(reg, id, (uint32_t)((rng >> 8) % 16), (uint32_t)((rng >> 12) % 1001),
                 (rng >> 24) % 20000, (double)((rng >> 40) % 4) * 1500.0, (rng >> 50) % 13 == 0,
                 (rng >> 54) % 29 == 0);
            if ((rng >> 30) % 3 == 0) {
                /* history sessions are set by the heartbeat: give some workers keys 1..3 */
                Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
                Tandem__Load load = TANDEM__LOAD__INIT;
                uint64_t keys[1] = {1 + (rng >> 5) % 3};
                load.free_pages = 1000;
                load.total_pages = 1000;
                load.queued_prefill_tokens = (rng >> 24) % 3000;
                load.recent_tokens_per_s = 2000.0;
                load.history_sessions = keys;
                load.n_history_sessions = 1;
                hb.load = &load;
                assert_int_equal(router_registry_heartbeat(reg, id, &hb, 3), TDM_OK);
            }
        } else if (op == 5) {
            router_registry_remove(reg, slot_of[i], ROUTER_REGISTRY_LOST, "test");
            live[i] = 0;
        } else if (op <= 7) {
            uint64_t t = (rng >> 10) % 4000;
            router_registry_note_assigned(reg, slot_of[i], 0, t);
            assigned[i] += t;
        } else if (op == 8) {
            uint64_t t = assigned[i] / 2;
            router_registry_note_released(reg, slot_of[i], 0, t);
            assigned[i] -= t;
        } else if ((rng >> 58) % 4 == 0) {
            router_registry_set_draining(reg, slot_of[i]);
        } else {
            router_registry_limit_max_tokens(reg, slot_of[i], 0, 2000 + (rng >> 7) % 8000);
        }
        if (step % 7 == 0) {
            check_against_reference(reg, &rng);
        }
    }
    check_against_reference(reg, &rng);
    router_registry_destroy(reg);
}

/* Two racks of one decode and two prefill workers each. */
typedef struct {
    router_registry_t *reg;
    int d[2], p[2][2];
} racks_t;

static void make_racks(racks_t *k)
{
    char id[32], rack[16];

    assert_int_equal(router_registry_create(&compat, 1500, &k->reg), TDM_OK);
    for (int r = 0; r < 2; r++) {
        snprintf(rack, sizeof(rack), "nvl-%d", r);
        snprintf(id, sizeof(id), "decode-%d", r);
        k->d[r] = add_worker(k->reg, id, TANDEM__ROLE__ROLE_DECODE, rack, 0, NULL);
        beat(k->reg, id, 0, 1000, 0, 0.0, 0, 0);
        for (int j = 0; j < 2; j++) {
            snprintf(id, sizeof(id), "prefill-%d-%d", r, j);
            k->p[r][j] = add_worker(k->reg, id, TANDEM__ROLE__ROLE_PREFILL, rack, 0, NULL);
        }
    }
}

static void test_prefill_stays_in_rack_until_saturated(void **state)
{
    racks_t k;
    const router_worker_t *d1;
    uint64_t gen = 0;
    int got;

    (void)state;
    make_racks(&k);
    d1 = router_registry_worker(k.reg, k.d[1], 0);
    /* rack nvl-1 busier than nvl-0 but under 2 s (3,000 tokens at 2 x 1,000 tok/s = 1.5 s):
     * the job stays in the decode worker's rack */
    beat(k.reg, "prefill-1-0", 1500, 0, 1500, 1000.0, 0, 0);
    beat(k.reg, "prefill-1-1", 1500, 0, 1500, 1000.0, 0, 0);
    got = router_place_prefill(k.reg, d1, 100, &gen, NULL);
    assert_true(got == k.p[1][0] || got == k.p[1][1]);
    assert_false(router_place_rack_saturated(k.reg, router_registry_rack_named(k.reg, "nvl-1")));
    /* jobs handed to it push it past 2 s: the next one spills to the idle rack */
    router_registry_note_assigned(k.reg, got, 0, 1200);
    assert_true(router_place_rack_saturated(k.reg, router_registry_rack_named(k.reg, "nvl-1")));
    got = router_place_prefill(k.reg, d1, 100, &gen, NULL);
    assert_true(got == k.p[0][0] || got == k.p[0][1]);
    assert_string_equal(router_registry_worker(k.reg, got, 0)->rack, "nvl-0");
    /* every rack saturated: the least loaded one, here the decode worker's own again */
    beat(k.reg, "prefill-0-0", 0, 0, 9000, 1000.0, 0, 0);
    beat(k.reg, "prefill-0-1", 0, 0, 9000, 1000.0, 0, 0);
    got = router_place_prefill(k.reg, d1, 100, &gen, NULL);
    assert_string_equal(router_registry_worker(k.reg, got, 0)->rack, "nvl-1");
    /* released work brings it back under the threshold */
    router_registry_note_released(k.reg, k.p[1][0], 0, 1200);
    router_registry_note_released(k.reg, k.p[1][1], 0, 1200);
    assert_false(router_place_rack_saturated(k.reg, router_registry_rack_named(k.reg, "nvl-1")));
    router_registry_destroy(k.reg);
}

static void test_rack_without_prefill_spills_and_decode_prefers_idle_racks(void **state)
{
    racks_t k;
    uint64_t gen = 0;
    int got;

    (void)state;
    make_racks(&k);
    /* both prefill workers of nvl-0 draining: its jobs go to nvl-1 */
    beat(k.reg, "prefill-0-0", 0, 0, 0, 1000.0, 0, 1);
    beat(k.reg, "prefill-0-1", 0, 0, 0, 1000.0, 0, 1);
    got = router_place_prefill(k.reg, router_registry_worker(k.reg, k.d[0], 0), 100, &gen, NULL);
    assert_string_equal(router_registry_worker(k.reg, got, 0)->rack, "nvl-1");
    /* and a new session prefers the decode worker whose rack has prefill workers */
    assert_int_equal(router_place_decode(k.reg, 100, &gen, NULL, NULL), k.d[1]);
    router_registry_destroy(k.reg);
}

static router_session_t *add_session(router_sessions_t *t, const char *id, uint64_t now_ns)
{
    router_session_t *s = NULL;

    assert_int_equal(router_sessions_add(t, id, 0, now_ns, &s), TDM_OK);
    return s;
}

/* The eviction heap takes the least recently used idle session, sees last_used_ns written after
 * the session was added, skips active ones, and answers BUSY (nothing changed) when every
 * session is active. */
static void test_session_eviction_takes_least_recently_used_idle(void **state)
{
    router_sessions_t *t = NULL;
    router_session_t *s0, *s1, *s6, *s7, *s8;
    router_session_t *out = NULL;

    (void)state;
    assert_int_equal(router_sessions_create(4, 16, &t), TDM_OK);
    s0 = add_session(t, "s0", 1);
    s1 = add_session(t, "s1", 2);
    add_session(t, "s2", 3);
    add_session(t, "s3", 4);
    s0->last_used_ns = 10; /* used again (dispatch writes it directly) */
    s1->active_request = 7;
    add_session(t, "s4", 11); /* evicts s2 (3) */
    assert_null(router_sessions_get(t, "s2"));
    add_session(t, "s5", 12); /* evicts s3 (4) */
    assert_null(router_sessions_get(t, "s3"));
    s6 = add_session(t, "s6", 13); /* evicts s0 (10); s1 is older but active */
    assert_null(router_sessions_get(t, "s0"));
    assert_non_null(router_sessions_get(t, "s1"));
    assert_int_equal(router_sessions_count(t), 4);
    s7 = add_session(t, "s4b", 14); /* evicts s4 (11) */
    assert_null(router_sessions_get(t, "s4"));
    s8 = router_sessions_get(t, "s5");
    s6->active_request = 1;
    s7->active_request = 2;
    s8->active_request = 3;
    assert_int_equal(router_sessions_add(t, "s9", 0, 15, &out), TDM_ERR_BUSY);
    assert_null(out);
    assert_int_equal(router_sessions_count(t), 4);
    s1->active_request = 0;
    add_session(t, "s9", 16); /* the one idle session goes */
    assert_null(router_sessions_get(t, "s1"));
    router_sessions_destroy(t);
}

/* Prefix matches stay right after the block index grew past its first size (2,000 sessions of
 * 80 one-token blocks = 160,000 entries). */
static void test_prefix_match_after_block_index_growth(void **state)
{
    enum { N = 2000, LEN = 80 };
    router_sessions_t *t = NULL;
    int32_t tokens[LEN];
    char id[32];
    size_t matched = 0;
    router_session_t *hit;

    (void)state;
    assert_int_equal(router_sessions_create(N, 1, &t), TDM_OK);
    for (int i = 0; i < N; i++) {
        router_session_t *s;
        snprintf(id, sizeof(id), "p%d", i);
        s = add_session(t, id, (uint64_t)i + 1);
        tokens[0] = i;
        for (int k = 1; k < LEN; k++) {
            tokens[k] = i * 131 + k;
        }
        assert_int_equal(router_sessions_set_history(t, s, tokens, LEN), TDM_OK);
    }
    tokens[0] = 1234;
    for (int k = 1; k < LEN; k++) {
        tokens[k] = 1234 * 131 + k;
    }
    tokens[LEN - 10] = -5; /* differs from the 70th token on */
    hit = router_sessions_match_prefix(t, 0, tokens, LEN, &matched);
    assert_non_null(hit);
    assert_string_equal(hit->id, "p1234");
    assert_int_equal(matched, LEN - 10);
    router_sessions_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_more_than_256_workers_register),
        cmocka_unit_test(test_index_matches_reference_scan),
        cmocka_unit_test(test_prefill_stays_in_rack_until_saturated),
        cmocka_unit_test(test_rack_without_prefill_spills_and_decode_prefers_idle_racks),
        cmocka_unit_test(test_session_eviction_takes_least_recently_used_idle),
        cmocka_unit_test(test_prefix_match_after_block_index_growth),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
