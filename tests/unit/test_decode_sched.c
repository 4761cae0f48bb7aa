/* test_decode_sched.c - the decode node's scheduler (decode-node/sched.h) driven in process on
 * the tiny preset: no sockets, no router, no UCX. Its messages go to a recorder (a
 * decode_sched_out_t that keeps a copy of each envelope) and the test feeds it the router's
 * messages by hand. A local turn streams exactly max_tokens tokens at consecutive positions and
 * finishes LENGTH with the right cached_len; the next turn continues at that cached_len; a turn
 * whose cached_len the node does not hold gets ERROR_STATE_LOST; bad input gets ERROR_BAD_MESSAGE;
 * an Abort ends a running turn; an aborted reservation's pages come back after the fence; under
 * page pressure the one evict-and-retry rule evicts the idle session and the turn goes on; every
 * page comes back. min_tokens masks the stop ids for the first tokens; n_choices > 1 prefills
 * once and forks the sequence: each choice's tokens equal a one-choice turn with its derived
 * seed (proto_choice_seed), one Finish sums them, an Abort ends them all, every fork's pages come
 * back. A greedy turn without logprobs takes its tokens from the backend's argmax; a row of it
 * without a finite logit fails its request alone. */
#include <math.h>
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
#include "engine/seq_state.h"
#include "forward_test_util.h"
#include "kernels/kv_page.h"
#include "kernels/ops.h"
#include "kernels/sample.h"
#include "node/node_handoff.h"
#include "proto/proto.h"

#define MAX_STEPS     64
#define POOL_PAGES    256u
#define PROMPT_TOKENS 12
#define MAX_TOKENS    4

/* A node of n_pages with the tests' scheduler parameters (fence_ms 0: an aborted reservation's
 * pages come back at the next step). */
static void node_open(dtu_fixture_t *fx, dtu_node_t *node, uint32_t n_pages)
{
    decode_sched_params_t sp;

    dtu_sched_params(&sp);
    dtu_node_open(node, fx->engine.model, n_pages, &sp);
}

static int setup(void **state)
{
    decode_sched_params_t sp;

    dtu_sched_params(&sp);
    return dtu_fixture_setup(state, POOL_PAGES, &sp);
}

/* Hand the scheduler one DecodeRequest with local prefill of ids[0..n) at cached_len. */
static void submit_local(dtu_node_t *node, uint64_t request_id, const char *session,
                         uint64_t cached_len, const int32_t *ids, size_t n, uint32_t max_tokens)
{
    Tandem__DecodeRequest dr;
    Tandem__SamplingParams sp;

    dtu_sampling(&sp, 0.0, 42); /* greedy */
    dtu_request(&dr, request_id, session, cached_len, ids, n, max_tokens, &sp);
    dtu_send_request(node, &dr);
}

/* submit_local with the caller's sampling (min_tokens, n_choices, stop ids, seed ...). */
static void submit_local_sp(dtu_node_t *node, uint64_t request_id, const char *session,
                            const int32_t *ids, size_t n, uint32_t max_tokens,
                            Tandem__SamplingParams *sp)
{
    Tandem__DecodeRequest dr;

    dtu_request(&dr, request_id, session, 0, ids, n, max_tokens, sp);
    dtu_send_request(node, &dr);
}

/* Step until request_id's Finish is out (at most MAX_STEPS steps); returns it. */
static const Tandem__Finish *run_to_finish(dtu_node_t *node, uint64_t request_id)
{
    for (int step = 0; step < MAX_STEPS; step++) {
        int from = 0;
        const Tandem__Envelope *f =
            dtu_next_of(node, TANDEM__ENVELOPE__BODY_FINISH, request_id, &from);
        if (f != NULL) {
            return f->finish;
        }
        decode_sched_step(node->sched);
    }
    fail_msg("request %llu did not finish in %d steps", (unsigned long long)request_id, MAX_STEPS);
    return NULL;
}

/* The tokens request_id streamed, checked to start at `first` and follow on; returns the count
 * and the last token in *last_out. */
static int streamed(const dtu_node_t *node, uint64_t request_id, uint64_t first, int32_t *last_out)
{
    int from = 0;
    int n = 0;
    const Tandem__Envelope *e;

    while ((e = dtu_next_of(node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, request_id, &from)) != NULL) {
        const Tandem__TokenChunk *c = e->token_chunk;
        assert_int_equal(c->first_position, first + (uint64_t)n);
        assert_true(c->n_tokens > 0);
        assert_int_equal(c->n_logprobs, c->n_tokens);
        n += (int)c->n_tokens;
        *last_out = c->tokens[c->n_tokens - 1];
    }
    return n;
}

static void test_local_turn_streams_max_tokens_then_finishes(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int32_t ids[PROMPT_TOKENS];
    int32_t last = -1;
    const Tandem__Finish *f;
    decode_stats_t st;
    int from = 0;

    ftu_prompt(3, fx->engine.V, ids, PROMPT_TOKENS);
    submit_local(node, 1, "s", 0, ids, PROMPT_TOKENS, MAX_TOKENS);
    f = run_to_finish(node, 1);
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(f->n_generated, MAX_TOKENS);
    assert_int_equal(f->n_prefilled, PROMPT_TOKENS);
    /* the last token is sent, not yet fed: the node holds the prompt and all but it */
    assert_int_equal(f->cached_len, PROMPT_TOKENS + MAX_TOKENS - 1);
    assert_int_equal(streamed(node, 1, PROMPT_TOKENS, &last), MAX_TOKENS);
    assert_true(last >= 0 && last < fx->engine.V);
    assert_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_ERROR, 1, &from));

    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.requests_total, 1);
    assert_int_equal(st.generated_tokens_total, MAX_TOKENS);
    assert_int_equal(st.local_prefill_tokens_total, PROMPT_TOKENS);
    assert_int_equal(st.running_sequences, 0);
    assert_int_equal(st.resident_sessions, 1);
    assert_true(st.session_pages > 0);
    assert_int_equal(st.free_pages + st.session_pages, POOL_PAGES);
    assert_true(node->rec.n_loads > 0); /* the load went to the link's heartbeats */
    assert_int_equal(node->rec.load.running_sequences, 0);
    assert_int_equal(node->rec.load.resident_sessions, 1);
}

static void test_next_turn_continues_at_cached_len(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int32_t ids[PROMPT_TOKENS];
    int32_t delta[3];
    int32_t last = -1;
    const Tandem__Finish *f;
    int from = 0;

    ftu_prompt(4, fx->engine.V, ids, PROMPT_TOKENS);
    submit_local(node, 1, "s", 0, ids, PROMPT_TOKENS, MAX_TOKENS);
    f = run_to_finish(node, 1);
    assert_int_equal(streamed(node, 1, PROMPT_TOKENS, &last), MAX_TOKENS);

    /* the router's next delta starts with the token the node sent last (not yet fed) */
    delta[0] = last;
    ftu_prompt(5, fx->engine.V, delta + 1, 2);
    submit_local(node, 2, "s", f->cached_len, delta, 3, 2);
    f = run_to_finish(node, 2);
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(f->n_prefilled, 3);
    assert_int_equal(f->cached_len, PROMPT_TOKENS + MAX_TOKENS - 1 + 3 + 2 - 1);
    assert_int_equal(streamed(node, 2, PROMPT_TOKENS + MAX_TOKENS - 1 + 3, &last), 2);
    assert_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_ERROR, 2, &from));
}

static void test_unheld_cached_len_is_state_lost(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int32_t ids[4] = {1, 2, 3, 4};
    decode_stats_t st;
    int from = 0;

    submit_local(node, 9, "fresh", 10, ids, 4, MAX_TOKENS);
    assert_int_equal(dtu_expect_error(node, 9, TANDEM__ERROR_CODE__ERROR_STATE_LOST)->cached_len,
                     0);
    decode_sched_step(node->sched);
    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.state_lost_total, 1);
    assert_int_equal(st.requests_total, 0);
    assert_int_equal(st.running_sequences + st.pending_prefills, 0);
    assert_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, 9, &from));

    /* the session is not left busy: a turn from 0 now runs */
    submit_local(node, 10, "fresh", 0, ids, 4, 1);
    assert_int_equal(run_to_finish(node, 10)->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
}

static void test_bad_requests_are_refused(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int32_t ids[PROMPT_TOKENS];
    int32_t outside[2] = {1, (int32_t)fx->engine.V};
    decode_stats_t st;

    submit_local(node, 20, "v", 0, outside, 2, MAX_TOKENS); /* a token outside the vocabulary */
    dtu_expect_error(node, 20, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE);
    submit_local(node, 21, "z", 0, outside, 1, 0); /* max_tokens 0 */
    dtu_expect_error(node, 21, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE);

    ftu_prompt(6, fx->engine.V, ids, PROMPT_TOKENS);
    submit_local(node, 22, "w", 0, ids, PROMPT_TOKENS, MAX_TOKENS);
    submit_local(node, 22, "w2", 0, ids, PROMPT_TOKENS, MAX_TOKENS); /* same id again */
    dtu_expect_error(node, 22, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE);
    assert_null(decode_sessions_find(node->sessions, "w2"));
    assert_int_equal(run_to_finish(node, 22)->n_generated, MAX_TOKENS); /* the first one runs */
    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.requests_total, 1);
}

static void test_abort_ends_a_running_turn(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int32_t ids[PROMPT_TOKENS];
    const Tandem__Finish *f;
    decode_stats_t st;

    ftu_prompt(7, fx->engine.V, ids, PROMPT_TOKENS);
    submit_local(node, 30, "a", 0, ids, PROMPT_TOKENS, 1000);
    decode_sched_step(node->sched); /* prefill and the first tokens */
    dtu_submit_abort(node, 30, 0);
    f = run_to_finish(node, 30);
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_ABORTED);
    assert_true(f->n_generated >= 1 && f->n_generated < 1000);
    decode_sched_step(node->sched);
    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.aborts_total, 1);
    assert_int_equal(st.running_sequences, 0);
}

static void test_aborted_reservation_returns_its_pages_after_the_fence(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__ReservePages rp = TANDEM__RESERVE_PAGES__INIT;
    const Tandem__Envelope *e;
    uint64_t reservation_id;
    decode_stats_t st;
    int from = 0;

    rp.request_id = 40;
    rp.session_id = (char *)"r";
    rp.cached_len = 0;
    rp.total_len = 300;
    rp.timeout_ms = 60000;
    env.body_case = TANDEM__ENVELOPE__BODY_RESERVE_PAGES;
    env.reserve_pages = &rp;
    decode_sched_on_message(node->sched, &env);
    e = dtu_next_of(node, TANDEM__ENVELOPE__BODY_PAGE_RESERVATION, 40, &from);
    assert_non_null(e);
    reservation_id = e->page_reservation->reservation_id;
    assert_true(e->page_reservation->n_pages > 0);
    assert_int_equal(e->page_reservation->cached_len, 0);
    assert_true(e->page_reservation->descriptor.len > 0);
    assert_int_equal(decode_pool_n_reserved(node->pool), e->page_reservation->n_pages);
    assert_true(decode_sessions_find(node->sessions, "r")->busy);

    dtu_submit_abort(node, 40, reservation_id);
    assert_false(decode_sessions_find(node->sessions, "r")->busy);
    assert_int_equal(decode_pool_n_reserved(node->pool), e->page_reservation->n_pages);
    decode_sched_step(node->sched); /* fence_ms 0: freed at the next expiry */
    assert_int_equal(decode_pool_n_reserved(node->pool), 0);
    assert_int_equal(decode_pool_n_free(node->pool), POOL_PAGES);
    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.reservations_total, 1);
    assert_int_equal(st.reserved_pages, 0);
}

static void test_page_pressure_evicts_the_idle_session_and_retries(void **state)
{
    dtu_fixture_t *fx = *state;
    int32_t ids[2][PROMPT_TOKENS * 4];
    dtu_node_t small;
    uint32_t one_session;
    decode_stats_t st;

    /* how many pages one finished turn keeps, measured on the fixture's roomy node */
    ftu_prompt(8, fx->engine.V, ids[0], PROMPT_TOKENS * 4);
    ftu_prompt(9, fx->engine.V, ids[1], PROMPT_TOKENS * 4);
    submit_local(&fx->node, 50, "probe", 0, ids[0], PROMPT_TOKENS * 4, MAX_TOKENS);
    run_to_finish(&fx->node, 50);
    one_session = decode_sessions_n_pages(fx->node.sessions);
    assert_true(one_session > 1);

    /* a node with room for one such session and a half: the second turn needs the first's pages */
    node_open(fx, &small, one_session + one_session / 2);
    submit_local(&small, 1, "first", 0, ids[0], PROMPT_TOKENS * 4, MAX_TOKENS);
    assert_int_equal(run_to_finish(&small, 1)->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    submit_local(&small, 2, "second", 0, ids[1], PROMPT_TOKENS * 4, MAX_TOKENS);
    assert_int_equal(run_to_finish(&small, 2)->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    decode_sched_stats(small.sched, &st);
    assert_int_equal(st.evictions_total, 1);
    assert_int_equal(st.resident_sessions, 1);
    assert_null(decode_sessions_find(small.sessions, "first")->seq);
    assert_non_null(decode_sessions_find(small.sessions, "second")->seq);
    assert_true(dtu_node_close(&small));
}

/* Issue 16, "a request that must evict gets 503": under steady pressure (a pool for about one
 * and a half sessions, every earlier session idle) each new session's turn evicts the least
 * recently used one and succeeds; no Error, every page back. */
static void test_steady_pressure_every_new_local_session_succeeds(void **state)
{
    dtu_fixture_t *fx = *state;
    int32_t ids[PROMPT_TOKENS * 4];
    dtu_node_t small;
    uint32_t one_session;
    decode_stats_t st;
    char name[32];

    ftu_prompt(20, fx->engine.V, ids, PROMPT_TOKENS * 4);
    submit_local(&fx->node, 60, "probe", 0, ids, PROMPT_TOKENS * 4, MAX_TOKENS);
    run_to_finish(&fx->node, 60);
    one_session = decode_sessions_n_pages(fx->node.sessions);

    node_open(fx, &small, one_session + one_session / 2);
    for (uint64_t i = 0; i < 6; i++) {
        int from = 0;

        snprintf(name, sizeof(name), "pressure-%llu", (unsigned long long)i);
        ftu_prompt(30 + i, fx->engine.V, ids, PROMPT_TOKENS * 4);
        submit_local(&small, 100 + i, name, 0, ids, PROMPT_TOKENS * 4, MAX_TOKENS);
        assert_int_equal(run_to_finish(&small, 100 + i)->reason,
                         TANDEM__FINISH_REASON__FINISH_LENGTH);
        assert_null(dtu_next_of(&small, TANDEM__ENVELOPE__BODY_ERROR, 100 + i, &from));
    }
    decode_sched_stats(small.sched, &st);
    assert_int_equal(st.evictions_total, 5);
    assert_int_equal(st.resident_sessions, 1);
    assert_true(dtu_node_close(&small));
}

/* A remote prefill's handoff of ids[0..n) by hand (dtu_remote_turn), prefilled on the
 * fixture's own engine. Returns 0, or -1 when the reservation was refused (its Error recorded). */
static int submit_remote(dtu_fixture_t *fx, dtu_node_t *node, uint64_t request_id,
                         const char *session, const int32_t *ids, size_t n, uint32_t max_tokens)
{
    engine_seq_t *seq = ftu_new_seq(&fx->engine);
    int rc = dtu_remote_turn(&fx->engine, seq, node, request_id, session, 0, ids, n, max_tokens,
                             NULL, NULL);

    engine_seq_destroy(seq);
    return rc;
}

/* The same steady pressure through remote prefills: the import needs no pages beyond the
 * reservation (it used to need as many again, evict the idle session for them, and fail every
 * second new session as a failed "import check"). */
static void test_steady_pressure_every_new_remote_session_succeeds(void **state)
{
    dtu_fixture_t *fx = *state;
    int32_t ids[PROMPT_TOKENS * 4];
    dtu_node_t small;
    uint32_t one_session;
    decode_stats_t st;
    char name[32];

    ftu_prompt(21, fx->engine.V, ids, PROMPT_TOKENS * 4);
    assert_int_equal(submit_remote(fx, &fx->node, 70, "probe", ids, PROMPT_TOKENS * 4, 1), 0);
    run_to_finish(&fx->node, 70);
    one_session = decode_sessions_n_pages(fx->node.sessions);
    assert_true(one_session > 1);

    node_open(fx, &small, one_session + one_session / 2);
    for (uint64_t i = 0; i < 6; i++) {
        int from = 0;

        snprintf(name, sizeof(name), "remote-%llu", (unsigned long long)i);
        ftu_prompt(40 + i, fx->engine.V, ids, PROMPT_TOKENS * 4);
        assert_int_equal(submit_remote(fx, &small, 200 + i, name, ids, PROMPT_TOKENS * 4, 1), 0);
        assert_null(dtu_next_of(&small, TANDEM__ENVELOPE__BODY_ERROR, 200 + i, &from));
        run_to_finish(&small, 200 + i);
    }
    decode_sched_stats(small.sched, &st);
    assert_int_equal(st.handoffs_total, 6);
    assert_int_equal(st.handoff_failures_total, 0);
    assert_int_equal(st.resident_sessions, 1);
    assert_true(dtu_node_close(&small));
}

/* Drain (issue 16 item 9): a draining scheduler answers new turns and reservations with
 * ERROR_DRAINING while the running turn streams to its end; then it is idle. */
static void test_drain_refuses_new_work_and_finishes_the_running_turn(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    int32_t ids[PROMPT_TOKENS];
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__ReservePages rp = TANDEM__RESERVE_PAGES__INIT;
    const Tandem__Error *e;
    int32_t last;

    ftu_prompt(50, fx->engine.V, ids, PROMPT_TOKENS);
    submit_local(node, 80, "running", 0, ids, PROMPT_TOKENS, MAX_TOKENS);
    decode_sched_step(node->sched); /* prefilled, first token out */
    assert_false(decode_sched_idle(node->sched));

    decode_sched_drain(node->sched);
    decode_sched_drain(node->sched); /* idempotent */
    submit_local(node, 81, "new", 0, ids, PROMPT_TOKENS, MAX_TOKENS);
    e = dtu_expect_error(node, 81, TANDEM__ERROR_CODE__ERROR_DRAINING);
    assert_non_null(strstr(e->message, "draining"));
    rp.request_id = 82;
    rp.session_id = (char *)"remote";
    rp.total_len = 300;
    rp.timeout_ms = 60000;
    env.body_case = TANDEM__ENVELOPE__BODY_RESERVE_PAGES;
    env.reserve_pages = &rp;
    decode_sched_on_message(node->sched, &env);
    dtu_expect_error(node, 82, TANDEM__ERROR_CODE__ERROR_DRAINING);
    assert_int_equal(decode_pool_n_reserved(node->pool), 0);
    /* the session of the next turn was not even created */
    assert_null(decode_sessions_find(node->sessions, "new"));

    assert_int_equal(run_to_finish(node, 80)->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(streamed(node, 80, PROMPT_TOKENS, &last), MAX_TOKENS);
    assert_true(decode_sched_idle(node->sched));
}

static void test_create_without_an_output_is_invalid(void **state)
{
    dtu_fixture_t *fx = *state;
    decode_sched_params_t sp;
    decode_sched_out_t out = {dtu_record_send, NULL, &fx->node.rec};
    decode_sched_t *sched = NULL;

    memset(&sp, 0, sizeof(sp));
    assert_int_equal(
        decode_sched_create(&sp, fx->engine.model, fx->node.pool, fx->node.sessions, &out, &sched),
        TDM_ERR_INVALID_ARG);
    assert_null(sched);
    assert_int_equal(
        decode_sched_create(&sp, fx->engine.model, fx->node.pool, fx->node.sessions, NULL, &sched),
        TDM_ERR_INVALID_ARG);
    assert_null(sched);
    decode_sched_destroy(NULL);
}

/* The tokens of request_id's choice `choice` in order (at most max), checked to start at
 * position `first` and follow on; returns the count. */
static int choice_tokens(const dtu_node_t *node, uint64_t request_id, uint32_t choice,
                         uint64_t first, int32_t *out, int max)
{
    int from = 0;
    int n = 0;
    const Tandem__Envelope *e;

    while ((e = dtu_next_of(node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, request_id, &from)) != NULL) {
        const Tandem__TokenChunk *c = e->token_chunk;
        if (c->choice != choice) {
            continue;
        }
        assert_int_equal(c->first_position, first + (uint64_t)n);
        for (size_t i = 0; i < c->n_tokens && n < max; i++) {
            out[n++] = c->tokens[i];
        }
    }
    return n;
}

static void test_min_tokens_masks_the_stop_ids(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    int32_t ids[PROMPT_TOKENS], plain[8], masked[8], stop[1];
    const Tandem__Finish *f;

    ftu_prompt(5, fx->engine.V, ids, PROMPT_TOKENS);
    sp.temperature = 0.0;
    sp.top_p = 1.0;
    sp.n_logprobs = -1;
    /* greedy without stop ids: the first token is the one we then make a stop id */
    submit_local_sp(node, 1, "plain", ids, PROMPT_TOKENS, 6, &sp);
    assert_int_equal(run_to_finish(node, 1)->n_generated, 6);
    assert_int_equal(choice_tokens(node, 1, 0, PROMPT_TOKENS, plain, 8), 6);
    stop[0] = plain[0];
    sp.stop_token_ids = stop;
    sp.n_stop_token_ids = 1;
    /* min_tokens 0: that id ends the turn at once */
    submit_local_sp(node, 2, "stop", ids, PROMPT_TOKENS, 6, &sp);
    f = run_to_finish(node, 2);
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_STOP_TOKEN);
    assert_int_equal(f->n_generated, 1);
    /* min_tokens 3: the id is masked for the first three tokens; the turn goes on */
    sp.min_tokens = 3;
    submit_local_sp(node, 3, "min", ids, PROMPT_TOKENS, 6, &sp);
    f = run_to_finish(node, 3);
    assert_true(f->n_generated >= 4);
    assert_int_equal(choice_tokens(node, 3, 0, PROMPT_TOKENS, masked, 8), (int)f->n_generated);
    for (int i = 0; i < 3; i++) {
        assert_true(masked[i] != stop[0]);
    }
    print_message("min_tokens: plain first %d; with min_tokens 3: %d %d %d ... (%llu tokens)\n",
                  plain[0], masked[0], masked[1], masked[2], (unsigned long long)f->n_generated);
}

static void test_n_choices_fork_one_prefill(void **state)
{
    enum { N = 3, T = 5 };
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    int32_t ids[PROMPT_TOKENS], got[N][8], alone[8];
    const Tandem__Finish *f;
    decode_stats_t before, after;
    int from = 0;

    ftu_prompt(9, fx->engine.V, ids, PROMPT_TOKENS);
    sp.temperature = 1.0;
    sp.top_p = 1.0;
    sp.seed = 1234;
    sp.n_logprobs = 0;
    sp.n_choices = N;
    decode_sched_stats(node->sched, &before);
    submit_local_sp(node, 7, "forked", ids, PROMPT_TOKENS, T, &sp);
    f = run_to_finish(node, 7);
    decode_sched_stats(node->sched, &after);
    /* one Finish for the request, summing the choices; the prompt prefilled once */
    assert_non_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_FINISH, 7, &from));
    assert_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_FINISH, 7, &from)); /* only one */
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(f->n_generated, N * T);
    assert_int_equal(f->n_prefilled, PROMPT_TOKENS);
    assert_int_equal(f->cached_len, PROMPT_TOKENS + T - 1);
    assert_int_equal(after.local_prefill_tokens_total - before.local_prefill_tokens_total,
                     PROMPT_TOKENS);
    assert_int_equal(after.requests_total - before.requests_total, 1);
    assert_int_equal(after.running_sequences, 0);
    /* the forks' pages are back: only the session keeps pages */
    assert_int_equal(after.free_pages + after.session_pages, POOL_PAGES);
    for (uint32_t c = 0; c < N; c++) {
        assert_int_equal(choice_tokens(node, 7, c, PROMPT_TOKENS, got[c], 8), T);
    }
    /* each choice = a one-choice turn on a fresh session with the derived seed */
    sp.n_choices = 0;
    for (uint32_t c = 0; c < N; c++) {
        char session[16];
        snprintf(session, sizeof(session), "alone-%u", c);
        sp.seed = proto_choice_seed(1234, c);
        submit_local_sp(node, 100 + c, session, ids, PROMPT_TOKENS, T, &sp);
        run_to_finish(node, 100 + c);
        assert_int_equal(choice_tokens(node, 100 + c, 0, PROMPT_TOKENS, alone, 8), T);
        assert_memory_equal(alone, got[c], T * sizeof(int32_t));
    }
    assert_int_equal(proto_choice_seed(1234, 0), 1234);
    /* max_tokens 1: every choice ends on its first token; the last one sends the one Finish */
    sp.n_choices = N;
    sp.seed = 1234;
    submit_local_sp(node, 200, "one-token", ids, PROMPT_TOKENS, 1, &sp);
    f = run_to_finish(node, 200);
    assert_int_equal(f->n_generated, N);
    assert_int_equal(f->cached_len, PROMPT_TOKENS);
    from = 0;
    assert_non_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_FINISH, 200, &from));
    assert_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_FINISH, 200, &from));
    for (uint32_t c = 0; c < N; c++) {
        assert_int_equal(choice_tokens(node, 200, c, PROMPT_TOKENS, alone, 8), 1);
        assert_int_equal(alone[0], got[c][0]);
    }
    assert_true(memcmp(got[0], got[1], T * sizeof(int32_t)) != 0 ||
                memcmp(got[1], got[2], T * sizeof(int32_t)) != 0);
    print_message("n=3 forked: %d %d %d | %d %d %d | %d %d %d ...\n", got[0][0], got[0][1],
                  got[0][2], got[1][0], got[1][1], got[1][2], got[2][0], got[2][1], got[2][2]);
}

static void test_abort_ends_every_choice(void **state)
{
    dtu_fixture_t *fx = *state;
    dtu_node_t *node = &fx->node;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    int32_t ids[PROMPT_TOKENS];
    const Tandem__Finish *f;
    decode_stats_t st;
    int from = 0;

    ftu_prompt(11, fx->engine.V, ids, PROMPT_TOKENS);
    sp.temperature = 0.7;
    sp.top_p = 1.0;
    sp.seed = 5;
    sp.n_logprobs = -1;
    sp.n_choices = 4;
    submit_local_sp(node, 9, "aborted", ids, PROMPT_TOKENS, 40, &sp);
    decode_sched_step(node->sched);
    decode_sched_step(node->sched);
    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.running_sequences, 4);
    dtu_submit_abort(node, 9, 0);
    f = run_to_finish(node, 9);
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_ABORTED);
    assert_non_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_FINISH, 9, &from));
    assert_null(dtu_next_of(node, TANDEM__ENVELOPE__BODY_FINISH, 9, &from)); /* only one */
    decode_sched_step(node->sched);
    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.running_sequences, 0);
    assert_int_equal(st.free_pages + st.session_pages, POOL_PAGES);
}

/* A greedy turn without logprobs (what the router sends for temperature 0 and no logprobs) takes
 * its tokens from the backend's argmax (engine_fwd_decode_greedy: no logits leave it) and streams
 * the same tokens as the same turn with the chosen token's logprob asked for (the logits and the
 * sampler); a min_tokens mask or logprobs keep a step on the logits path. */
static void test_greedy_without_logprobs_takes_the_argmax_path(void **state)
{
    dtu_fixture_t *fx = *state;
    int32_t ids[PROMPT_TOKENS], plain[MAX_TOKENS * 2], with_lp[MAX_TOKENS * 2];
    Tandem__SamplingParams sp;
    decode_stats_t st0, st1, st2;

    ftu_prompt(77, fx->engine.V, ids, PROMPT_TOKENS);
    decode_sched_stats(fx->node.sched, &st0);
    dtu_sampling(&sp, 0.0, 1);
    sp.n_logprobs = 0; /* the chosen token's logprob: the logits path */
    submit_local_sp(&fx->node, 91, "lp", ids, PROMPT_TOKENS, MAX_TOKENS * 2, &sp);
    run_to_finish(&fx->node, 91);
    decode_sched_stats(fx->node.sched, &st1);
    assert_int_equal(st1.greedy_steps_total, st0.greedy_steps_total);

    dtu_sampling(&sp, 0.0, 1);
    sp.n_logprobs = -1; /* off */
    submit_local_sp(&fx->node, 92, "plain", ids, PROMPT_TOKENS, MAX_TOKENS * 2, &sp);
    run_to_finish(&fx->node, 92);
    decode_sched_stats(fx->node.sched, &st2);
    /* the first token comes from the prefill's logits; every later one from a decode step */
    assert_int_equal(st2.greedy_steps_total - st1.greedy_steps_total, MAX_TOKENS * 2 - 1);
    assert_int_equal(dtu_tokens_of(&fx->node, 91, with_lp, MAX_TOKENS * 2), MAX_TOKENS * 2);
    assert_int_equal(dtu_tokens_of(&fx->node, 92, plain, MAX_TOKENS * 2), MAX_TOKENS * 2);
    assert_memory_equal(plain, with_lp, sizeof(plain));

    /* min_tokens over the whole turn masks the stop ids at every step: the logits path */
    dtu_sampling(&sp, 0.0, 1);
    sp.n_logprobs = -1;
    sp.min_tokens = MAX_TOKENS * 2;
    submit_local_sp(&fx->node, 93, "masked", ids, PROMPT_TOKENS, MAX_TOKENS * 2, &sp);
    run_to_finish(&fx->node, 93);
    decode_sched_stats(fx->node.sched, &st1);
    assert_int_equal(st1.greedy_steps_total, st2.greedy_steps_total);
}

/* The CPU argmax after poisoning row 1 of its logits (a NaN): the second sequence of a batch. */
static tdm_status_t poisoned_argmax(kern_ctx_t *ctx, const float *logits, int64_t ld,
                                    int64_t n_rows, int64_t n_vocab, int32_t *ids_out)
{
    if (n_rows > 1) {
        ((float *)logits)[ld + n_vocab / 3] = NAN; /* host memory: a CPU table */
    }
    return kern_argmax_cpu(ctx, logits, ld, n_rows, n_vocab, ids_out);
}

/* A greedy step whose argmax finds no finite logit in one row fails that request alone: the
 * other request of the batch streams the tokens it streams on a clean node and finishes. */
static void test_greedy_bad_row_fails_its_request_alone(void **state)
{
    dtu_fixture_t *fx = *state;
    kern_ops_t table = *kern_ops_cpu();
    int32_t ids[2][PROMPT_TOKENS], got[MAX_TOKENS * 2], want[MAX_TOKENS * 2];
    const Tandem__Finish *f[2];
    Tandem__SamplingParams sp;
    decode_sched_params_t p;
    ftu_engine_t bad;
    dtu_node_t node;
    int ok;

    table.argmax = poisoned_argmax;
    memset(&bad, 0, sizeof(bad));
    assert_int_equal(ftu_engine_open_on(&bad, 16, &table, 0), 0);
    dtu_sched_params(&p);
    dtu_node_open(&node, bad.model, POOL_PAGES, &p);
    dtu_sampling(&sp, 0.0, 1);
    sp.n_logprobs = -1;
    /* both prefill first, then decode as a batch of two: one of them is row 1 */
    for (int i = 0; i < 2; i++) {
        ftu_prompt(61 + (uint64_t)i, fx->engine.V, ids[i], PROMPT_TOKENS);
        submit_local_sp(&node, 1 + (uint64_t)i, i == 0 ? "a" : "b", ids[i], PROMPT_TOKENS,
                        MAX_TOKENS * 2, &sp);
    }
    f[0] = dtu_run_to_end(&node, 1, MAX_STEPS);
    f[1] = dtu_run_to_end(&node, 2, MAX_STEPS);
    assert_true((f[0] == NULL) != (f[1] == NULL)); /* exactly one failed */
    ok = f[0] != NULL ? 0 : 1;
    assert_non_null(dtu_expect_error(&node, 2 - (uint64_t)ok, TANDEM__ERROR_CODE__ERROR_INTERNAL));
    assert_int_equal(dtu_tokens_of(&node, 1 + (uint64_t)ok, got, MAX_TOKENS * 2), MAX_TOKENS * 2);
    /* the survivor's turn alone on the clean fixture node: the same tokens */
    submit_local_sp(&fx->node, 3, "clean", ids[ok], PROMPT_TOKENS, MAX_TOKENS * 2, &sp);
    run_to_finish(&fx->node, 3);
    assert_int_equal(dtu_tokens_of(&fx->node, 3, want, MAX_TOKENS * 2), MAX_TOKENS * 2);
    assert_memory_equal(got, want, sizeof(want));
    assert_true(dtu_node_close(&node));
    assert_int_equal(ftu_engine_close(&bad), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_greedy_without_logprobs_takes_the_argmax_path, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_greedy_bad_row_fails_its_request_alone, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_local_turn_streams_max_tokens_then_finishes, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_next_turn_continues_at_cached_len, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_unheld_cached_len_is_state_lost, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_bad_requests_are_refused, setup, dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_abort_ends_a_running_turn, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_aborted_reservation_returns_its_pages_after_the_fence,
                                        setup, dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_steady_pressure_every_new_local_session_succeeds,
                                        setup, dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_steady_pressure_every_new_remote_session_succeeds,
                                        setup, dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_drain_refuses_new_work_and_finishes_the_running_turn,
                                        setup, dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_page_pressure_evicts_the_idle_session_and_retries,
                                        setup, dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_create_without_an_output_is_invalid, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_min_tokens_masks_the_stop_ids, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_n_choices_fork_one_prefill, setup,
                                        dtu_fixture_teardown),
        cmocka_unit_test_setup_teardown(test_abort_ends_every_choice, setup, dtu_fixture_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
