/* test_decode_prefix.c - the decode node's shared prefixes (decode-node/sched_prefix.c, issue 17
 * item 2) driven in process on the tiny preset, as test_decode_sched.c drives the scheduler (a
 * recorder for its messages, the router's messages by hand). A new session naming a resident
 * session in prefix_session_id with the ids of [0, cached_len) links that session's pages and
 * prefills only its delta, with the tokens of a session cut back to cached_len and replayed;
 * every refusal (ids that differ, no ids, an unknown or too short donor, a cached_len that is not
 * whole pages, no --prefix-share) is answered ERROR_STATE_LOST with nothing shared; a
 * reservation for a shared prefix says the shared cached_len; pages and shared counts come back
 * to baseline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/hash.h"
#include "decode_test_util.h"
#include "decode-node/pool.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "engine/kv_cache.h"
#include "engine/seq_state.h"
#include "forward_test_util.h"
#include "kernels/kv_page.h"
#include "node/node_handoff.h"
#include "proto/proto.h"

#define MAX_STEPS  64
#define POOL_PAGES 256u
#define MAX_IDS    400
#define N_OWN      20
#define MAX_GEN    6

/* A node of n_pages with the tests' scheduler parameters (fence_ms 0: an aborted reservation's
 * pages come back at the next step), prefix sharing on unless no_share. */
static void node_open(dtu_fixture_t *fx, dtu_node_t *node, uint32_t n_pages, int no_share)
{
    decode_sched_params_t sp;

    dtu_sched_params(&sp);
    sp.prefix_share = !no_share;
    dtu_node_open(node, fx->engine.model, n_pages, &sp);
}

static int setup(void **state)
{
    decode_sched_params_t sp;

    dtu_sched_params(&sp);
    sp.prefix_share = 1;
    return dtu_fixture_setup(state, POOL_PAGES, &sp);
}

/* Hand the scheduler one DecodeRequest with local prefill of ids[0..n) at cached_len, sharing
 * prefix_session's first cached_len tokens (prefix_ids) when prefix_session is not NULL. */
static void submit_local(dtu_node_t *node, uint64_t request_id, const char *session,
                         uint64_t cached_len, const int32_t *ids, size_t n, uint32_t max_tokens,
                         const char *prefix_session, const int32_t *prefix_ids, size_t n_prefix)
{
    Tandem__DecodeRequest dr;
    Tandem__SamplingParams sp;

    dtu_sampling(&sp, 0.0, 42); /* greedy */
    dtu_request(&dr, request_id, session, cached_len, ids, n, max_tokens, &sp);
    dr.prefix_session_id = (char *)(prefix_session != NULL ? prefix_session : "");
    dr.prefix_ids = (int32_t *)prefix_ids;
    dr.n_prefix_ids = n_prefix;
    dtu_send_request(node, &dr);
}

/* 64 * max ratio of the tiny preset (128). */
static int64_t unit_of(const dtu_fixture_t *fx)
{
    int64_t unit = KERN_KV_PAGE_ROWS;
    for (int s = 0; s < fx->engine.cfg->n_kv_source_layer_ids; s++) {
        int layer = (int)fx->engine.cfg->kv_source_layer_ids[s];
        int64_t u = KERN_KV_PAGE_ROWS * (int64_t)fx->engine.cfg->roles[layer].ratio;
        unit = u > unit ? u : unit;
    }
    return unit;
}

/* Pages free plus distinct pages in sessions: the pool's total when nothing leaked. */
static uint32_t accounted(const decode_stats_t *st)
{
    return st->free_pages + st->session_pages - (uint32_t)st->shared_page_refs;
}

static void test_new_session_shares_then_equals_rewound_session(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int64_t p = unit_of(fx);
    int32_t prompt[MAX_IDS], own[N_OWN], first[MAX_IDS], t_shared[MAX_GEN], t_rewound[MAX_GEN];
    const Tandem__Finish *f;
    decode_stats_t st;
    int from = 0;

    assert_true(p + 10 + N_OWN <= MAX_IDS);
    ftu_prompt(21, fx->engine.V, prompt, p + 10); /* the donor: P = prefix + 10 more ids */
    ftu_prompt(22, fx->engine.V, own, N_OWN);
    submit_local(node, 1, "donor", 0, prompt, (size_t)p + 10, 2, NULL, NULL, 0);
    assert_non_null(dtu_run_to_end(node, 1, MAX_STEPS));

    /* the new session: prefix p of the donor's, own delta */
    submit_local(node, 2, "new", (uint64_t)p, own, N_OWN, MAX_GEN, "donor", prompt, (size_t)p);
    f = dtu_run_to_end(node, 2, MAX_STEPS);
    assert_non_null(f);
    assert_int_equal(f->n_prefilled, N_OWN); /* only its own part */
    assert_int_equal(dtu_tokens_of(node, 2, t_shared, MAX_GEN), MAX_GEN);
    assert_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_ERROR, 2, &from));
    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.prefix_shares_total, 1);
    assert_int_equal(st.prefix_shared_tokens_total, p);
    assert_true(st.shared_pages > 0);
    assert_int_equal(st.state_lost_total, 0);
    assert_int_equal(accounted(&st), POOL_PAGES);

    /* unshared, same schedule: a session that computed prefix + X itself, then is cut back to p
     * (rewind: truncate + recovery replay) and prefills the same delta */
    memcpy(first, prompt, (size_t)p * sizeof(int32_t));
    ftu_prompt(23, fx->engine.V, first + p, 9);
    first[p] = (prompt[p] + 1) % (int32_t)fx->engine.V; /* diverges at p */
    submit_local(node, 3, "ref", 0, first, (size_t)p + 9, 2, NULL, NULL, 0);
    assert_non_null(dtu_run_to_end(node, 3, MAX_STEPS));
    submit_local(node, 4, "ref", (uint64_t)p, own, N_OWN, MAX_GEN, NULL, NULL, 0);
    assert_non_null(dtu_run_to_end(node, 4, MAX_STEPS));
    assert_int_equal(dtu_tokens_of(node, 4, t_rewound, MAX_GEN), MAX_GEN);
    assert_memory_equal(t_shared, t_rewound, sizeof(t_shared));

    /* the donor goes first: the new session keeps the pages, and continues */
    decode_sessions_remove(node->sessions, decode_sessions_find(node->sessions, "donor"));
    submit_local(node, 5, "new", f->cached_len, own, 3, 2, NULL, NULL, 0);
    assert_non_null(dtu_run_to_end(node, 5, MAX_STEPS));
    decode_sched_step(node->sched);
    decode_sched_stats(node->sched, &st);
    assert_int_equal(accounted(&st), POOL_PAGES);
}

/* Every refusal: STATE_LOST, nothing shared, nothing held by the new session. */
static void expect_refused(dtu_node_t *node, uint64_t id, const char *session, uint64_t cached_len,
                           const int32_t *own, const char *donor, const int32_t *ids, size_t n_ids)
{
    decode_stats_t before, after;
    decode_session_t *s;

    decode_sched_stats(node->sched, &before);
    submit_local(node, id, session, cached_len, own, N_OWN, 2, donor, ids, n_ids);
    assert_null(dtu_run_to_end(node, id, MAX_STEPS));
    dtu_expect_error(node, id, TANDEM__ERROR_CODE__ERROR_STATE_LOST);
    decode_sched_step(node->sched);
    decode_sched_stats(node->sched, &after);
    assert_int_equal(after.prefix_shares_total, before.prefix_shares_total);
    assert_int_equal(after.shared_pages, before.shared_pages);
    s = decode_sessions_find(node->sessions, session);
    assert_true(s == NULL || s->seq == NULL);
    assert_int_equal(accounted(&after), POOL_PAGES);
}

static void test_refusals_answer_state_lost(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int64_t p = unit_of(fx);
    int32_t prompt[MAX_IDS], own[N_OWN], wrong[MAX_IDS];

    ftu_prompt(31, fx->engine.V, prompt, p + 10);
    ftu_prompt(32, fx->engine.V, own, N_OWN);
    submit_local(node, 10, "donor", 0, prompt, (size_t)p + 10, 2, NULL, NULL, 0);
    assert_non_null(dtu_run_to_end(node, 10, MAX_STEPS));
    memcpy(wrong, prompt, sizeof(wrong));
    wrong[p / 2] = (wrong[p / 2] + 1) % (int32_t)fx->engine.V;
    /* one id differs: never matched on anything but the ids */
    expect_refused(node, 11, "n1", (uint64_t)p, own, "donor", wrong, (size_t)p);
    /* no ids (a router before prefix_ids) */
    expect_refused(node, 12, "n2", (uint64_t)p, own, "donor", NULL, 0);
    /* unknown donor, the session itself */
    expect_refused(node, 13, "n3", (uint64_t)p, own, "nobody", prompt, (size_t)p);
    expect_refused(node, 14, "n4", (uint64_t)p, own, "n4", prompt, (size_t)p);
    /* not whole pages */
    expect_refused(node, 15, "n5", (uint64_t)p - 2, own, "donor", prompt, (size_t)p - 2);
    /* beyond what the donor holds */
    ftu_prompt(33, fx->engine.V, prompt + p + 10, p);
    expect_refused(node, 16, "n6", (uint64_t)(2 * p), own, "donor", prompt, (size_t)(2 * p));
}

static void test_no_prefix_share_refuses(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t off;
    int64_t p = unit_of(fx);
    int32_t prompt[MAX_IDS], own[N_OWN];

    node_open(fx, &off, POOL_PAGES, 1);
    ftu_prompt(41, fx->engine.V, prompt, p + 10);
    ftu_prompt(42, fx->engine.V, own, N_OWN);
    submit_local(&off, 20, "donor", 0, prompt, (size_t)p + 10, 2, NULL, NULL, 0);
    assert_non_null(dtu_run_to_end(&off, 20, MAX_STEPS));
    expect_refused(&off, 21, "n", (uint64_t)p, own, "donor", prompt, (size_t)p);
    assert_true(dtu_node_close(&off));
}

/* ReservePages for a new session sharing the donor's prefix: the reservation says cached_len p
 * (the prefill node continues from the shared pages), and the refused one says 0. */
static void test_reservation_starts_at_the_shared_prefix(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int64_t p = unit_of(fx);
    int32_t prompt[MAX_IDS], wrong[MAX_IDS];
    const int32_t *ids[2];

    ftu_prompt(51, fx->engine.V, prompt, p + 10);
    memcpy(wrong, prompt, sizeof(wrong));
    wrong[3] = (wrong[3] + 1) % (int32_t)fx->engine.V;
    ids[0] = prompt;
    ids[1] = wrong;
    submit_local(node, 30, "donor", 0, prompt, (size_t)p + 10, 2, NULL, NULL, 0);
    assert_non_null(dtu_run_to_end(node, 30, MAX_STEPS));
    for (int k = 0; k < 2; k++) {
        Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
        Tandem__ReservePages rp = TANDEM__RESERVE_PAGES__INIT;
        const Tandem__Envelope *e;
        decode_stats_t st;
        int from = 0;

        rp.request_id = 31 + (uint64_t)k;
        rp.session_id = (char *)(k == 0 ? "r-shared" : "r-refused");
        rp.cached_len = (uint64_t)p;
        rp.total_len = (uint64_t)p + 100;
        rp.timeout_ms = 60000;
        rp.prefix_session_id = (char *)"donor";
        rp.prefix_ids = (int32_t *)ids[k];
        rp.n_prefix_ids = (size_t)p;
        env.body_case = TANDEM__ENVELOPE__BODY_RESERVE_PAGES;
        env.reserve_pages = &rp;
        decode_sched_on_message(node->sched, &env);
        e = dtu_next_of(node, TANDEM__ENVELOPE__BODY_PAGE_RESERVATION, rp.request_id, &from);
        assert_non_null(e);
        assert_int_equal(e->page_reservation->cached_len, k == 0 ? (uint64_t)p : 0);
        dtu_submit_abort(node, rp.request_id, e->page_reservation->reservation_id);
        decode_sched_step(node->sched); /* fence_ms 0 */
        decode_sched_stats(node->sched, &st);
        assert_int_equal(st.prefix_shares_total, 1);
        assert_int_equal(st.reserved_pages, 0);
        assert_int_equal(accounted(&st), POOL_PAGES);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_new_session_shares_then_equals_rewound_session, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_refusals_answer_state_lost, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_no_prefix_share_refuses, setup, dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_reservation_starts_at_the_shared_prefix, setup,
                                        dtu_fixture_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
