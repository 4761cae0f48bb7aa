/* test_decode_report.c - what a decode node tells routers about its sessions (decode-node/
 * report.h, issue 18 item 3), in process on the tiny preset through the scheduler
 * (decode_test_util.h): a turn's tenant, prompt length and token history are kept with the
 * session and come back in a SessionHistory (the prompt's ids, then the generated ones, up to the
 * KV positions held; found=false for a session the node holds nothing of); the held-sessions
 * list of the heartbeats is most recently used first, keyed by proto_session_hash, with the
 * positions held, and cut at its cap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "decode-node/report.h"
#include "decode_test_util.h"
#include "proto/proto_hash.h"

#define POOL_PAGES    128u
#define PROMPT_TOKENS 24
#define MAX_NEW       5
#define MAX_STEPS     200

static int setup(void **state)
{
    decode_sched_params_t sp;

    dtu_sched_params(&sp);
    return dtu_fixture_setup(state, POOL_PAGES, &sp);
}

static int teardown(void **state)
{
    return dtu_fixture_teardown(state);
}

/* One greedy turn of `session` (tenant) from 0 with a prompt of `seed`; returns its Finish. */
static const Tandem__Finish *run_turn(dtu_fixture_t *fx, uint64_t request_id, const char *session,
                                      uint32_t tenant, uint64_t seed, int32_t *prompt_out)
{
    Tandem__DecodeRequest dr;
    Tandem__SamplingParams sp;
    const Tandem__Finish *fin;

    ftu_prompt(seed, fx->engine.V, prompt_out, PROMPT_TOKENS);
    dtu_sampling(&sp, 0.0, seed);
    dtu_request(&dr, request_id, session, 0, prompt_out, PROMPT_TOKENS, MAX_NEW, &sp);
    dr.tenant = tenant;
    dtu_send_request(&fx->node, &dr);
    fin = dtu_run_to_end(&fx->node, request_id, MAX_STEPS);
    assert_non_null(fin);
    return fin;
}

/* Ask the node about `session`; returns the recorded answer (checked by proto on the way). */
static const Tandem__SessionHistory *query(dtu_fixture_t *fx, uint64_t query_id,
                                           const char *session)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__SessionQuery q = TANDEM__SESSION_QUERY__INIT;
    int before = fx->node.rec.n_msgs;
    const Tandem__Envelope *last;

    q.query_id = query_id;
    q.session_id = (char *)session;
    env.body_case = TANDEM__ENVELOPE__BODY_SESSION_QUERY;
    env.session_query = &q;
    decode_sched_on_message(fx->node.sched, &env);
    assert_int_equal(fx->node.rec.n_msgs, before + 1); /* one answer, at once */
    last = fx->node.rec.msgs[before];
    assert_int_equal(last->body_case, TANDEM__ENVELOPE__BODY_SESSION_HISTORY);
    assert_int_equal(last->session_history->query_id, query_id);
    assert_string_equal(last->session_history->session_id, session);
    return last->session_history;
}

static void test_session_history_answers_with_what_the_node_holds(void **state)
{
    dtu_fixture_t *fx = *state;
    int32_t prompt_a[PROMPT_TOKENS], prompt_b[PROMPT_TOKENS];
    int32_t generated[MAX_NEW + 4];
    const Tandem__Finish *fin;
    const Tandem__SessionHistory *h;
    int n_gen;

    fin = run_turn(fx, 1, "agent-a", 7, 11, prompt_a);
    assert_true(fin->cached_len >= PROMPT_TOKENS);
    n_gen = dtu_tokens_of(&fx->node, 1, generated, MAX_NEW + 4);
    assert_true(n_gen >= 1);

    h = query(fx, 100, "agent-a");
    assert_true(h->found);
    assert_int_equal(h->cached_len, fin->cached_len); /* the positions whose KV it holds */
    assert_int_equal(h->n_tokens, h->cached_len);
    assert_int_equal(h->tenant, 7);
    assert_int_equal(h->prompt_len, PROMPT_TOKENS);
    for (int i = 0; i < PROMPT_TOKENS; i++) {
        assert_int_equal(h->tokens[i], prompt_a[i]);
    }
    for (uint64_t p = PROMPT_TOKENS; p < h->cached_len; p++) {
        assert_int_equal(h->tokens[p], generated[p - PROMPT_TOKENS]);
    }

    (void)run_turn(fx, 2, "agent-b", 9, 12, prompt_b);
    h = query(fx, 101, "agent-b");
    assert_true(h->found);
    assert_int_equal(h->tenant, 9);
    assert_int_equal(h->tokens[0], prompt_b[0]);

    /* nothing held: a session never seen, and one known but without state */
    h = query(fx, 102, "nobody");
    assert_false(h->found);
    assert_int_equal(h->cached_len, 0);
    assert_int_equal(h->n_tokens, 0);
    decode_sessions_drop_state(decode_sessions_find(fx->node.sessions, "agent-b"));
    h = query(fx, 103, "agent-b");
    assert_false(h->found);
}

static void test_held_sessions_are_listed_most_recently_used_first(void **state)
{
    dtu_fixture_t *fx = *state;
    int32_t prompt[PROMPT_TOKENS];
    const char *names[3] = {"s-old", "s-new", "s-mid"};
    const uint64_t used_ns[3] = {1000, 3000, 2000};
    uint64_t keys[4], lens[4];
    decode_session_t *s;

    for (int i = 0; i < 3; i++) {
        (void)run_turn(fx, 10 + (uint64_t)i, names[i], 1, 20 + (uint64_t)i, prompt);
        decode_sessions_find(fx->node.sessions, names[i])->last_used_ns = used_ns[i];
    }
    assert_non_null(decode_sessions_get(fx->node.sessions, "s-empty")); /* holds nothing */

    assert_int_equal(decode_report_resident(fx->node.sessions, keys, lens, 4), 3);
    assert_true(keys[0] == proto_session_hash("s-new"));
    assert_true(keys[1] == proto_session_hash("s-mid"));
    assert_true(keys[2] == proto_session_hash("s-old"));
    s = decode_sessions_find(fx->node.sessions, "s-mid");
    assert_int_equal(lens[1], decode_report_held(s));
    assert_int_equal(lens[1], engine_seq_length(s->seq));

    /* the cap keeps the newest */
    assert_int_equal(decode_report_resident(fx->node.sessions, keys, lens, 2), 2);
    assert_true(keys[0] == proto_session_hash("s-new"));
    assert_true(keys[1] == proto_session_hash("s-mid"));
    assert_int_equal(decode_report_resident(fx->node.sessions, keys, lens, 0), 0);

    /* fewer ids recorded than KV held: only what a router can continue from with them */
    s->n_ids = PROMPT_TOKENS - 4;
    assert_int_equal(decode_report_held(s), PROMPT_TOKENS - 4);
    assert_int_equal(decode_report_resident(fx->node.sessions, keys, lens, 4), 3);
    assert_int_equal(lens[1], PROMPT_TOKENS - 4);

    /* a session whose state was dropped leaves the list */
    decode_sessions_drop_state(decode_sessions_find(fx->node.sessions, "s-new"));
    assert_int_equal(decode_report_resident(fx->node.sessions, keys, lens, 4), 2);
    assert_true(keys[0] == proto_session_hash("s-mid"));
}

static int pick_31(void *arg, uint64_t id)
{
    (void)arg;
    return id == 31;
}

/* The turns of a router that is gone end (Finish ABORTED) and free their session; the others go
 * on. */
static void test_abort_where_ends_only_the_picked_turns(void **state)
{
    dtu_fixture_t *fx = *state;
    int32_t px[PROMPT_TOKENS], py[PROMPT_TOKENS];
    Tandem__DecodeRequest dx, dy;
    Tandem__SamplingParams sx, sy;
    const Tandem__Finish *fin;

    ftu_prompt(31, fx->engine.V, px, PROMPT_TOKENS);
    ftu_prompt(32, fx->engine.V, py, PROMPT_TOKENS);
    dtu_sampling(&sx, 0.0, 1);
    dtu_sampling(&sy, 0.0, 2);
    dtu_request(&dx, 31, "gone-router-session", 0, px, PROMPT_TOKENS, 64, &sx);
    dtu_request(&dy, 32, "live-router-session", 0, py, PROMPT_TOKENS, 3, &sy);
    dtu_send_request(&fx->node, &dx);
    dtu_send_request(&fx->node, &dy);
    decode_sched_step(fx->node.sched);

    assert_int_equal(decode_sched_abort_where(fx->node.sched, pick_31, NULL), 1);
    fin = dtu_run_to_end(&fx->node, 31, 1);
    assert_non_null(fin);
    assert_int_equal(fin->reason, TANDEM__FINISH_REASON__FINISH_ABORTED);
    assert_false(decode_sessions_find(fx->node.sessions, "gone-router-session")->busy);
    fin = dtu_run_to_end(&fx->node, 32, MAX_STEPS);
    assert_non_null(fin);
    assert_int_equal(fin->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(decode_sched_abort_where(fx->node.sched, pick_31, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_session_history_answers_with_what_the_node_holds,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_sessions_are_listed_most_recently_used_first,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_where_ends_only_the_picked_turns, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL) == 0 ? 0 : 1;
}
