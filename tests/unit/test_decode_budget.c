/* test_decode_budget.c - local prefills in pieces between decode steps (issue 17 item 1;
 * decode-node/sched_prefill.c) on the tiny preset, the scheduler driven in process with a
 * recorder for its messages (as test_decode_sched.c). With 3 streams running and a 3,000-token
 * prompt arriving, the running streams keep getting tokens while the prompt prefills (many of
 * their TokenChunks come between the prompt's arrival and its first token; with no budget,
 * today's whole-prompt step, none do); chunked service streams the same tokens as unchunked
 * (greedy and seeded sampling, several prompts sharing a step's budget, a canonical-start replay
 * as a piece, pieces across the engine's passes, n choices forked on an n-gram speculative node);
 * an Abort, running out of pages, destroy and drain part way through a prefill leave
 * no page held and no half-prefilled state; a rewind runs as a piece in a step, not when the
 * request arrives, and gives the same tokens. Counts messages, never time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "decode_test_util.h"
#include "decode-node/pool.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "engine/config.h"
#include "forward_test_util.h"
#include "proto/proto.h"

#define POOL_PAGES  2048u
#define LONG_PROMPT 3000
#define MAX_STEPS   4000

typedef struct {
    ftu_engine_t engine; /* the model (its own small pool is not used here) */
} fixture_t;

/* One turn's sampling: greedy (temperature 0) or seeded. */
typedef struct {
    double temperature;
    uint64_t seed;
    int canonical_start;
} turn_t;

static uint32_t g_engine_chunk = 64; /* the engine's max_chunk_tokens (--chunk-tokens) */
static engine_spec_drafter_t g_spec = ENGINE_SPEC_OFF; /* the node's drafter (--spec) */

/* A node with the given step token budget and prefill chunk (0: no limit) over n_pages. */
static void node_open(fixture_t *fx, dtu_node_t *node, uint32_t n_pages, uint32_t budget,
                      uint32_t chunk)
{
    decode_sched_params_t sp;

    dtu_sched_params(&sp);
    sp.max_batch = 8;
    sp.chunk_tokens = g_engine_chunk;
    sp.spec_drafter = g_spec;
    if (g_spec != ENGINE_SPEC_OFF) {
        engine_spec_params_default(fx->engine.model, &sp.spec);
    }
    sp.step_token_budget = budget;
    sp.prefill_chunk_tokens = chunk;
    dtu_node_open(node, fx->engine.model, n_pages, &sp);
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));

    if (fx == NULL || ftu_engine_open(&fx->engine, 16) != 0) {
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    int ok = ftu_engine_close(&fx->engine) == 0;

    free(fx);
    return ok ? 0 : -1;
}

static void submit(dtu_node_t *node, uint64_t request_id, const char *session, uint64_t cached_len,
                   const int32_t *ids, size_t n, uint32_t max_tokens, const turn_t *t)
{
    Tandem__DecodeRequest dr;
    Tandem__SamplingParams sp;

    dtu_sampling(&sp, t != NULL ? t->temperature : 0.0, t != NULL ? t->seed : 42);
    dtu_request(&dr, request_id, session, cached_len, ids, n, max_tokens, &sp);
    dr.canonical_start = t != NULL ? t->canonical_start : 0;
    dtu_send_request(node, &dr);
}

/* Step until request_id streamed its first token; returns that chunk's message index. */
static int run_to_first_token(dtu_node_t *node, uint64_t request_id)
{
    for (int step = 0; step < MAX_STEPS; step++) {
        int i = dtu_find(node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, request_id, 0);
        if (i >= 0) {
            return i;
        }
        assert_true(dtu_find(node, TANDEM__ENVELOPE__BODY_ERROR, request_id, 0) < 0);
        decode_sched_step(node->sched);
    }
    fail_msg("request %llu got no token in %d steps", (unsigned long long)request_id, MAX_STEPS);
    return -1;
}

/* TokenChunks of requests [first_id, first_id + n_ids) in messages [from, to). */
static int chunks_between(const dtu_node_t *node, uint64_t first_id, int n_ids, int from, int to)
{
    int n = 0;

    for (int i = from; i < to; i++) {
        const Tandem__Envelope *e = node->rec.msgs[i];
        uint64_t id = dtu_request_of(e);
        n += e->body_case == TANDEM__ENVELOPE__BODY_TOKEN_CHUNK && id >= first_id &&
             id < first_id + (uint64_t)n_ids;
    }
    return n;
}

static void check_all_pages_back(dtu_node_t *node)
{
    decode_stats_t st;

    decode_sched_step(node->sched); /* publish */
    decode_sched_stats(node->sched, &st);
    assert_int_equal(st.free_pages + st.session_pages, st.total_pages);
}

/*
 * 3 streams run; a 3,000-token prompt arrives. Returns how many TokenChunks of the 3 streams went
 * out between the prompt's arrival and its first token, and checks the prompt's prefill counters.
 */
static int streams_during_long_prompt(fixture_t *fx, uint32_t budget, uint32_t chunk,
                                      int32_t *first_out)
{
    dtu_node_t node;
    int32_t short_ids[12];
    int32_t *prompt = malloc(LONG_PROMPT * sizeof(int32_t));
    decode_stats_t st;
    int mark, first, n;

    assert_non_null(prompt);
    node_open(fx, &node, POOL_PAGES, budget, chunk);
    for (uint64_t id = 1; id <= 3; id++) {
        char name[16];
        snprintf(name, sizeof(name), "run%llu", (unsigned long long)id);
        ftu_prompt(10 + id, fx->engine.V, short_ids, 12);
        submit(&node, id, name, 0, short_ids, 12, 4000, NULL);
        run_to_first_token(&node, id);
    }
    ftu_prompt(7, fx->engine.V, prompt, LONG_PROMPT);
    mark = node.rec.n_msgs;
    submit(&node, 10, "long", 0, prompt, LONG_PROMPT, 2, NULL);
    decode_sched_step(node.sched);
    decode_sched_stats(node.sched, &st);
    if (budget != 0) { /* one step ran one part: the rest is queued, in the load report too */
        assert_int_equal(st.pending_prefills, 1);
        assert_int_equal(st.queued_prefill_tokens, LONG_PROMPT - chunk);
        assert_int_equal(node.rec.load.queued_prefill_tokens, LONG_PROMPT - chunk);
    }
    first = run_to_first_token(&node, 10);
    n = chunks_between(&node, 1, 3, mark, first);
    *first_out = node.rec.msgs[first]->token_chunk->tokens[0];
    decode_sched_stats(node.sched, &st);
    assert_int_equal(st.local_prefill_tokens_total, 3 * 12 + LONG_PROMPT);
    assert_int_equal(st.queued_prefill_tokens, 0);
    if (budget != 0) {
        assert_true(st.prefill_pieces_total >= 3 + (LONG_PROMPT + chunk - 1) / chunk);
    }
    assert_int_equal(dtu_find(&node, TANDEM__ENVELOPE__BODY_ERROR, 10, 0), -1);
    assert_true(dtu_node_close(&node)); /* destroy aborts the 3 streams; every page back */
    free(prompt);
    return n;
}

static void test_running_streams_keep_streaming_while_a_long_prompt_prefills(void **state)
{
    fixture_t *fx = *state;
    int32_t first_chunked = -1, first_whole = -2;
    int chunked = streams_during_long_prompt(fx, 128, 100, &first_chunked);
    int whole = streams_during_long_prompt(fx, 0, 0, &first_whole);

    /* 3,000 tokens at <= 125 a step (128 less 3 decode rows, parts of 100): 30 steps, each
     * with a TokenChunk for every running stream; the whole-prompt step gives them none */
    print_message("running streams' TokenChunks during the prompt: chunked %d, whole %d\n", chunked,
                  whole);
    assert_true(chunked >= 3 * (LONG_PROMPT / 100 - 1));
    assert_int_equal(whole, 0);
    assert_int_equal(first_chunked, first_whole); /* the same first token either way */
}

/*
 * One scenario on a node with the given budget: a stream runs; two prompts arrive together and
 * share the step's budget; then the first session's next turn starts canonically (a canonical
 * replay as a piece). All tokens of requests 1..4 go into out[4][n_max].
 */
#define SAME_MAX 24
static void same_scenario(fixture_t *fx, uint32_t budget, uint32_t chunk, const turn_t *t,
                          int32_t out[4][SAME_MAX], int n_out[4])
{
    dtu_node_t node;
    int32_t a[20], b[150], c[230], delta[90];
    const Tandem__Finish *f;

    node_open(fx, &node, POOL_PAGES, budget, chunk);
    ftu_prompt(21, fx->engine.V, a, 20);
    ftu_prompt(22, fx->engine.V, b, 150);
    ftu_prompt(23, fx->engine.V, c, 230);
    submit(&node, 1, "a", 0, a, 20, SAME_MAX, t);
    run_to_first_token(&node, 1);
    submit(&node, 2, "b", 0, b, 150, SAME_MAX, t);
    {
        turn_t t3 = *t; /* canonical start of a new sequence: nothing to replay, ever */
        t3.canonical_start = 1;
        submit(&node, 3, "c", 0, c, 230, SAME_MAX, &t3);
    }
    f = dtu_run_to_end(&node, 2, MAX_STEPS);
    assert_non_null(f);
    n_out[1] = dtu_tokens_of(&node, 2, out[1], SAME_MAX);
    delta[0] = out[1][n_out[1] - 1];
    ftu_prompt(24, fx->engine.V, delta + 1, 89);
    {
        turn_t t2 = *t;
        t2.canonical_start = 1;
        submit(&node, 4, "b", f->cached_len, delta, 90, SAME_MAX, &t2);
    }
    assert_non_null(dtu_run_to_end(&node, 1, MAX_STEPS));
    assert_non_null(dtu_run_to_end(&node, 3, MAX_STEPS));
    assert_non_null(dtu_run_to_end(&node, 4, MAX_STEPS));
    n_out[0] = dtu_tokens_of(&node, 1, out[0], SAME_MAX);
    n_out[2] = dtu_tokens_of(&node, 3, out[2], SAME_MAX);
    n_out[3] = dtu_tokens_of(&node, 4, out[3], SAME_MAX);
    check_all_pages_back(&node);
    assert_true(dtu_node_close(&node));
}

static void test_chunked_service_gives_the_same_tokens(void **state)
{
    fixture_t *fx = *state;
    static const turn_t turns[] = {{0.0, 42, 0}, {0.9, 7, 0}};
    /* no limit (today's whole prefill), then pieces of odd sizes under a small budget, then a
     * budget smaller than the window (a replay runs alone as the step's first piece) */
    static const uint32_t budgets[][2] = {{0, 0}, {24, 7}, {64, 41}, {5, 5}};

    for (size_t t = 0; t < sizeof(turns) / sizeof(turns[0]); t++) {
        int32_t want[4][SAME_MAX], got[4][SAME_MAX];
        int n_want[4], n_got[4];

        same_scenario(fx, budgets[0][0], budgets[0][1], &turns[t], want, n_want);
        for (size_t b = 1; b < sizeof(budgets) / sizeof(budgets[0]); b++) {
            same_scenario(fx, budgets[b][0], budgets[b][1], &turns[t], got, n_got);
            for (int r = 0; r < 4; r++) {
                assert_int_equal(n_got[r], SAME_MAX);
                assert_int_equal(n_got[r], n_want[r]);
                assert_memory_equal(got[r], want[r], (size_t)n_want[r] * sizeof(int32_t));
            }
        }
    }
}

static void test_abort_mid_prefill_frees_everything(void **state)
{
    fixture_t *fx = *state;
    dtu_node_t node;
    int32_t ids[500], want[4], got[4];
    decode_stats_t st;
    const Tandem__Finish *f;
    int i;

    ftu_prompt(31, fx->engine.V, ids, 500);
    node_open(fx, &node, POOL_PAGES, 40, 40);
    submit(&node, 1, "s", 0, ids, 500, 4, NULL);
    for (int k = 0; k < 3; k++) {
        decode_sched_step(node.sched);
    }
    decode_sched_stats(node.sched, &st);
    assert_int_equal(st.pending_prefills, 1);
    assert_int_equal(st.queued_prefill_tokens, 500 - 3 * 40);
    assert_int_equal(st.resident_sessions, 1);
    assert_true(st.session_pages > 0); /* the parts so far hold pages */
    assert_int_equal(dtu_find(&node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, 1, 0), -1);
    dtu_submit_abort(&node, 1, 0);
    i = dtu_find(&node, TANDEM__ENVELOPE__BODY_FINISH, 1, 0);
    assert_true(i >= 0);
    f = node.rec.msgs[i]->finish;
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_ABORTED);
    assert_int_equal(f->cached_len, 0); /* no half-prefilled state is kept */
    decode_sched_step(node.sched);
    decode_sched_stats(node.sched, &st);
    assert_int_equal(st.pending_prefills, 0);
    assert_int_equal(st.queued_prefill_tokens, 0);
    assert_int_equal(st.resident_sessions, 0);
    assert_int_equal(st.free_pages, st.total_pages);

    /* the session serves again from 0, as a fresh one would */
    submit(&node, 2, "s", 0, ids, 500, 4, NULL);
    assert_non_null(dtu_run_to_end(&node, 2, MAX_STEPS));
    assert_int_equal(dtu_tokens_of(&node, 2, got, 4), 4);
    assert_true(dtu_node_close(&node));
    node_open(fx, &node, POOL_PAGES, 0, 0);
    submit(&node, 2, "fresh", 0, ids, 500, 4, NULL);
    assert_non_null(dtu_run_to_end(&node, 2, MAX_STEPS));
    assert_int_equal(dtu_tokens_of(&node, 2, want, 4), 4);
    assert_memory_equal(got, want, sizeof(want));
    assert_true(dtu_node_close(&node));

    /* destroyed part way: Finish ABORTED with nothing held, every page back */
    node_open(fx, &node, POOL_PAGES, 40, 40);
    submit(&node, 3, "s", 0, ids, 500, 4, NULL);
    decode_sched_step(node.sched);
    decode_sched_destroy(node.sched);
    node.sched = NULL;
    i = dtu_find(&node, TANDEM__ENVELOPE__BODY_FINISH, 3, 0);
    assert_true(i >= 0);
    assert_int_equal(node.rec.msgs[i]->finish->cached_len, 0);
    assert_int_equal(decode_sessions_n_resident(node.sessions), 0);
    assert_int_equal(decode_pool_n_free(node.pool), decode_pool_n_total(node.pool));
    assert_true(dtu_node_close(&node));
}

static void test_out_of_pages_mid_prefill_fails_cleanly(void **state)
{
    fixture_t *fx = *state;
    const uint32_t n_pages = 64;
    int64_t fits = (int64_t)engine_config_max_tokens_in_pages(fx->engine.cfg, n_pages, 1u << 20);
    int64_t n = fits + 200;
    int32_t *ids = malloc((size_t)n * sizeof(int32_t));
    int32_t small[12];
    dtu_node_t node;
    decode_stats_t st;
    const Tandem__Finish *f;

    assert_non_null(ids);
    ftu_prompt(41, fx->engine.V, ids, n);
    ftu_prompt(42, fx->engine.V, small, 12);
    node_open(fx, &node, n_pages, 64, 32);
    /* an idle session holding pages: evicted first, then the prompt still does not fit */
    submit(&node, 1, "idle", 0, small, 12, 2, NULL);
    assert_non_null(dtu_run_to_end(&node, 1, MAX_STEPS));
    submit(&node, 2, "big", 0, ids, (size_t)n, 2, NULL);
    assert_null(dtu_run_to_end(&node, 2, MAX_STEPS));
    assert_int_equal(
        node.rec.msgs[dtu_find(&node, TANDEM__ENVELOPE__BODY_ERROR, 2, 0)]->error->code,
        TANDEM__ERROR_CODE__ERROR_NO_PAGES);
    assert_int_equal(dtu_find(&node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, 2, 0), -1);
    decode_sched_step(node.sched);
    decode_sched_stats(node.sched, &st);
    assert_true(st.evictions_total >= 1);
    assert_int_equal(st.pending_prefills, 0);
    assert_int_equal(st.resident_sessions, 0); /* the half-prefilled state was dropped */
    assert_int_equal(st.free_pages, st.total_pages);

    /* the node serves on: a prompt that fits */
    submit(&node, 3, "big", 0, ids, (size_t)(fits / 2), 2, NULL);
    f = dtu_run_to_end(&node, 3, MAX_STEPS);
    assert_non_null(f);
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    check_all_pages_back(&node);
    assert_true(dtu_node_close(&node));
    free(ids);
}

static void test_drain_finishes_a_half_prefilled_turn(void **state)
{
    fixture_t *fx = *state;
    dtu_node_t node;
    int32_t ids[300];
    const Tandem__Finish *f;

    ftu_prompt(51, fx->engine.V, ids, 300);
    node_open(fx, &node, POOL_PAGES, 50, 50);
    submit(&node, 1, "s", 0, ids, 300, 3, NULL);
    decode_sched_step(node.sched);
    decode_sched_drain(node.sched);
    assert_int_equal(decode_sched_idle(node.sched), 0);
    submit(&node, 2, "t", 0, ids, 10, 3, NULL); /* refused while draining */
    assert_int_equal(
        node.rec.msgs[dtu_find(&node, TANDEM__ENVELOPE__BODY_ERROR, 2, 0)]->error->code,
        TANDEM__ERROR_CODE__ERROR_DRAINING);
    f = dtu_run_to_end(&node, 1, MAX_STEPS);
    assert_non_null(f);
    assert_int_equal(f->reason, TANDEM__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(f->n_prefilled, 300);
    assert_int_equal(decode_sched_idle(node.sched), 1);
    assert_true(dtu_node_close(&node));
}

/* Turn 1 of 40 tokens (4 generated), then a turn that shares only 30 of them: the node rewinds
 * to 30 (a piece: truncate + recovery replay of W' tokens) and prefills the new delta, while a
 * stream runs. Returns turn 2's tokens in out[6] and checks the rewind ran in a step. */
static void rewind_scenario(fixture_t *fx, uint32_t budget, uint32_t chunk, int32_t out[6])
{
    dtu_node_t node;
    int32_t ids[40], delta[25], other[12];
    decode_stats_t st;
    const Tandem__Finish *f;
    int before;

    ftu_prompt(61, fx->engine.V, ids, 40);
    ftu_prompt(62, fx->engine.V, delta, 25);
    ftu_prompt(63, fx->engine.V, other, 12);
    node_open(fx, &node, POOL_PAGES, budget, chunk);
    submit(&node, 1, "s", 0, ids, 40, 4, NULL);
    assert_int_equal(dtu_run_to_end(&node, 1, MAX_STEPS)->cached_len, 43);
    submit(&node, 2, "other", 0, other, 12, 200, NULL);
    run_to_first_token(&node, 2);
    before = node.rec.n_msgs;
    submit(&node, 3, "s", 30, delta, 25, 6, NULL);
    decode_sched_stats(node.sched, &st);
    assert_int_equal(st.rewinds_total, 0); /* not on arrival: a piece of the next step */
    assert_int_equal(node.rec.n_msgs, before);
    decode_sched_step(node.sched);
    decode_sched_stats(node.sched, &st);
    assert_int_equal(st.rewinds_total, 1);
    assert_int_equal(st.rewind_kept_tokens_total, 30);
    /* the running stream got its token in that step */
    assert_true(chunks_between(&node, 2, 1, before, node.rec.n_msgs) == 1);
    f = dtu_run_to_end(&node, 3, MAX_STEPS);
    assert_non_null(f);
    assert_int_equal(f->n_prefilled, 25);
    assert_int_equal(f->cached_len, 30 + 25 + 6 - 1);
    assert_int_equal(dtu_tokens_of(&node, 3, out, 6), 6);
    dtu_submit_abort(&node, 2, 0);
    check_all_pages_back(&node);
    assert_true(dtu_node_close(&node));
}

/* A rewind whose record reaches only 20 of the 30 shared tokens: the piece rewinds to 20, then
 * the turn ends with STATE_LOST at 20 (the router retries from there), nothing else held. */
static void test_rewind_short_of_cached_len_is_state_lost_after_the_piece(void **state)
{
    fixture_t *fx = *state;
    dtu_node_t node;
    int32_t ids[40], delta[25];
    decode_stats_t st;
    const Tandem__Error *e;
    int i;

    ftu_prompt(61, fx->engine.V, ids, 40);
    ftu_prompt(62, fx->engine.V, delta, 25);
    node_open(fx, &node, POOL_PAGES, 20, 8);
    submit(&node, 1, "s", 0, ids, 40, 4, NULL);
    assert_int_equal(dtu_run_to_end(&node, 1, MAX_STEPS)->cached_len, 43);
    decode_sessions_forget_ids_from(decode_sessions_find(node.sessions, "s"), 20);
    submit(&node, 2, "s", 30, delta, 25, 6, NULL);
    assert_int_equal(dtu_find(&node, TANDEM__ENVELOPE__BODY_ERROR, 2, 0), -1);
    decode_sched_step(node.sched);
    i = dtu_find(&node, TANDEM__ENVELOPE__BODY_ERROR, 2, 0);
    assert_true(i >= 0);
    e = node.rec.msgs[i]->error;
    assert_int_equal(e->code, TANDEM__ERROR_CODE__ERROR_STATE_LOST);
    assert_int_equal(e->cached_len, 20);
    assert_int_equal(dtu_find(&node, TANDEM__ENVELOPE__BODY_FINISH, 2, 0), -1);
    decode_sched_stats(node.sched, &st);
    assert_int_equal(st.rewinds_total, 1);
    assert_int_equal(st.state_lost_total, 1);
    assert_int_equal(st.requests_total, 1); /* refused, not counted */
    assert_int_equal(st.pending_prefills, 0);

    /* the router's retry from 20 goes on from the rewound state */
    submit(&node, 3, "s", 20, delta, 25, 3, NULL);
    assert_int_equal(dtu_run_to_end(&node, 3, MAX_STEPS)->cached_len, 20 + 25 + 3 - 1);
    check_all_pages_back(&node);
    assert_true(dtu_node_close(&node));
}

static void test_rewind_runs_as_a_piece(void **state)
{
    fixture_t *fx = *state;
    int32_t want[6], got[6];

    rewind_scenario(fx, 0, 0, want);
    rewind_scenario(fx, 20, 8, got); /* 1 decode row + a 16-token replay + a 3-token part */
    assert_memory_equal(got, want, sizeof(want));
    rewind_scenario(fx, 6, 4, got); /* the replay alone as the step's first piece */
    assert_memory_equal(got, want, sizeof(want));
}

/* A fresh 400-token prompt alone on the node (no decode rows: parts of the whole budget) with
 * the engine's default 256-token passes: pieces that do not fall on the one-shot's pass
 * boundaries give the same tokens. */
static void test_pieces_across_engine_passes_give_the_same_tokens(void **state)
{
    fixture_t *fx = *state;
    static const uint32_t budgets[] = {0, 64, 100, 7};
    int32_t ids[400], want[16], got[16];

    ftu_prompt(71, fx->engine.V, ids, 400);
    g_engine_chunk = 256;
    for (size_t b = 0; b < sizeof(budgets) / sizeof(budgets[0]); b++) {
        dtu_node_t node;

        node_open(fx, &node, POOL_PAGES, budgets[b], budgets[b]);
        submit(&node, 1, "s", 0, ids, 400, 16, NULL);
        assert_non_null(dtu_run_to_end(&node, 1, MAX_STEPS));
        assert_int_equal(dtu_tokens_of(&node, 1, b == 0 ? want : got, 16), 16);
        if (b > 0) {
            print_message("budget %u\n", budgets[b]);
            assert_memory_equal(got, want, sizeof(want));
        }
        assert_true(dtu_node_close(&node));
    }
    g_engine_chunk = 64;
}

/* The tokens of request_id's choice `choice` (at most cap). */
static int choice_tokens(const dtu_node_t *node, uint64_t request_id, uint32_t choice, int32_t *out,
                         int cap)
{
    int n = 0;

    for (int i = 0; (i = dtu_find(node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, request_id, i)) >= 0;
         i++) {
        const Tandem__TokenChunk *c = node->rec.msgs[i]->token_chunk;
        for (size_t k = 0; k < c->n_tokens && n < cap && c->choice == choice; k++) {
            out[n++] = c->tokens[k];
        }
    }
    return n;
}

/* Three choices of one seeded prompt (forked from the last part's logits) on an n-gram
 * speculative node, while a stream runs: the decode rows count each sequence's verify rows, and
 * every choice streams what the unchunked node streams. */
static void choices_on_a_spec_node(fixture_t *fx, uint32_t budget, int32_t out[3][12])
{
    dtu_node_t node;
    int32_t ids[180], other[12];
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__DecodeRequest dr = TANDEM__DECODE_REQUEST__INIT;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;

    ftu_prompt(81, fx->engine.V, ids, 180);
    ftu_prompt(82, fx->engine.V, other, 12);
    node_open(fx, &node, POOL_PAGES, budget, budget);
    submit(&node, 1, "other", 0, other, 12, 40, NULL);
    run_to_first_token(&node, 1);
    sp.temperature = 0.9;
    sp.top_p = 1.0;
    sp.seed = 99;
    sp.n_choices = 3;
    dr.request_id = 2;
    dr.session_id = (char *)"s";
    dr.n_delta_tokens = 180;
    dr.delta_tokens = ids;
    dr.mode = TANDEM__PREFILL_MODE__PREFILL_LOCAL;
    dr.sampling = &sp;
    dr.max_tokens = 12;
    dr.total_len = 180;
    env.body_case = TANDEM__ENVELOPE__BODY_DECODE_REQUEST;
    env.decode_request = &dr;
    decode_sched_on_message(node.sched, &env);
    assert_non_null(dtu_run_to_end(&node, 2, MAX_STEPS));
    for (uint32_t c = 0; c < 3; c++) {
        assert_int_equal(choice_tokens(&node, 2, c, out[c], 12), 12);
    }
    assert_non_null(dtu_run_to_end(&node, 1, MAX_STEPS));
    check_all_pages_back(&node);
    assert_true(dtu_node_close(&node));
}

static void test_choices_and_speculation_under_the_budget(void **state)
{
    fixture_t *fx = *state;
    int32_t want[3][12], got[3][12];

    g_spec = ENGINE_SPEC_NGRAM;
    choices_on_a_spec_node(fx, 0, want);
    choices_on_a_spec_node(fx, 20, got); /* 1 x (drafts + 1) verify rows leave a piece floor */
    assert_memory_equal(got, want, sizeof(want));
    choices_on_a_spec_node(fx, 64, got);
    assert_memory_equal(got, want, sizeof(want));
    g_spec = ENGINE_SPEC_OFF;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_across_engine_passes_give_the_same_tokens),
        cmocka_unit_test(test_running_streams_keep_streaming_while_a_long_prompt_prefills),
        cmocka_unit_test(test_chunked_service_gives_the_same_tokens),
        cmocka_unit_test(test_choices_and_speculation_under_the_budget),
        cmocka_unit_test(test_abort_mid_prefill_frees_everything),
        cmocka_unit_test(test_out_of_pages_mid_prefill_fails_cleanly),
        cmocka_unit_test(test_drain_finishes_a_half_prefilled_turn),
        cmocka_unit_test(test_rewind_runs_as_a_piece),
        cmocka_unit_test(test_rewind_short_of_cached_len_is_state_lost_after_the_piece),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
