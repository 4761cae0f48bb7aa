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
#include "decode-node/pool.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "engine/kv_cache.h"
#include "engine/seq_state.h"
#include "forward_test_util.h"
#include "kernels/kv_page.h"
#include "node/node_handoff.h"
#include "proto/proto.h"

#define MAX_MSGS      512
#define MAX_STEPS     64
#define POOL_PAGES    256u
#define MAX_IDS       400
#define N_OWN         20
#define MAX_GEN       6

/* The router's side: every envelope the scheduler sent (copies), and its load reports. */
typedef struct {
    Tandem__Envelope *msgs[MAX_MSGS];
    int n_msgs;
    int n_loads;
    node_load_t load;
} recorder_t;

/* One decode node's parts over the fixture's model. */
typedef struct {
    decode_pool_t *pool;
    decode_sessions_t *sessions;
    decode_sched_t *sched;
    recorder_t rec;
} node_t;

typedef struct {
    ftu_engine_t engine; /* the model (its own small pool is not used here) */
    node_t node;
} fixture_t;

static void record_send(void *arg, const Tandem__Envelope *env)
{
    recorder_t *rec = arg;
    uint8_t *buf = NULL;
    size_t n = 0;
    Tandem__Envelope *copy = NULL;

    assert_true(rec->n_msgs < MAX_MSGS);
    assert_int_equal(proto_pack(env, &buf, &n), TDM_OK);
    assert_int_equal(proto_unpack(buf, n, 0, &copy, NULL, 0), TDM_OK);
    free(buf);
    rec->msgs[rec->n_msgs++] = copy;
}

static void record_load(void *arg, const node_load_t *load)
{
    recorder_t *rec = arg;

    rec->n_loads++;
    rec->load = *load;
}

static void node_open(fixture_t *fx, node_t *node, uint32_t n_pages, int no_share)
{
    decode_sched_params_t sp;
    decode_sched_out_t out = {record_send, record_load, &node->rec};

    memset(node, 0, sizeof(*node));
    memset(&sp, 0, sizeof(sp));
    sp.fence_ms = 0; /* an aborted reservation's pages come back at the next step */
    sp.max_batch = 4;
    sp.chunk_tokens = 64;
    sp.n_threads = 2;
    sp.spec_drafter = ENGINE_SPEC_OFF;
    sp.prefix_share = !no_share;
    assert_int_equal(decode_pool_create(fx->engine.model, n_pages, NULL, &node->pool), TDM_OK);
    assert_int_equal(decode_sessions_create(8, &node->sessions), TDM_OK);
    assert_int_equal(
        decode_sched_create(&sp, fx->engine.model, node->pool, node->sessions, &out, &node->sched),
        TDM_OK);
}

/* Close the node; returns 1 when every page was free before the pool went. */
static int node_close(node_t *node)
{
    int all_back;

    decode_sched_destroy(node->sched);
    decode_sessions_destroy(node->sessions);
    all_back = engine_kv_pool_n_shared(decode_pool_engine(node->pool)) == 0 &&
               decode_pool_n_free(node->pool) == decode_pool_n_total(node->pool) &&
               decode_pool_n_reserved(node->pool) == 0;
    decode_pool_destroy(node->pool);
    for (int i = 0; i < node->rec.n_msgs; i++) {
        proto_envelope_free(node->rec.msgs[i]);
    }
    return all_back;
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));

    if (fx == NULL || ftu_engine_open(&fx->engine, 16) != 0) {
        return -1;
    }
    node_open(fx, &fx->node, POOL_PAGES, 0);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    int ok = node_close(&fx->node);

    ok = ftu_engine_close(&fx->engine) == 0 && ok;
    free(fx);
    return ok ? 0 : -1;
}

/* Hand the scheduler one DecodeRequest with local prefill of ids[0..n) at cached_len, sharing
 * prefix_session's first cached_len tokens (prefix_ids) when prefix_session is not NULL. */
static void submit_local(node_t *node, uint64_t request_id, const char *session,
                         uint64_t cached_len, const int32_t *ids, size_t n, uint32_t max_tokens,
                         const char *prefix_session, const int32_t *prefix_ids, size_t n_prefix)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__DecodeRequest dr = TANDEM__DECODE_REQUEST__INIT;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;

    sp.temperature = 0.0; /* greedy */
    sp.top_p = 1.0;
    sp.seed = 42;
    sp.n_logprobs = 0;
    dr.request_id = request_id;
    dr.session_id = (char *)session;
    dr.cached_len = cached_len;
    dr.n_delta_tokens = n;
    dr.delta_tokens = (int32_t *)ids;
    dr.mode = TANDEM__PREFILL_MODE__PREFILL_LOCAL;
    dr.sampling = &sp;
    dr.max_tokens = max_tokens;
    dr.total_len = cached_len + n;
    dr.prefix_session_id = (char *)(prefix_session != NULL ? prefix_session : "");
    dr.prefix_ids = (int32_t *)prefix_ids;
    dr.n_prefix_ids = n_prefix;
    env.body_case = TANDEM__ENVELOPE__BODY_DECODE_REQUEST;
    env.decode_request = &dr;
    decode_sched_on_message(node->sched, &env);
}


static void submit_abort(node_t *node, uint64_t request_id, uint64_t reservation_id)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Abort a = TANDEM__ABORT__INIT;

    a.request_id = request_id;
    a.reservation_id = reservation_id;
    a.reason = (char *)"test";
    env.body_case = TANDEM__ENVELOPE__BODY_ABORT;
    env.abort = &a;
    decode_sched_on_message(node->sched, &env);
}

/* The first recorded message of `type` for request_id at or after index *from (advanced past
 * it), or NULL. */
static const Tandem__Envelope *next_of(const node_t *node, Tandem__Envelope__BodyCase type,
                                       uint64_t request_id, int *from)
{
    for (int i = *from; i < node->rec.n_msgs; i++) {
        const Tandem__Envelope *e = node->rec.msgs[i];
        uint64_t id = type == TANDEM__ENVELOPE__BODY_FINISH        ? e->finish->request_id
                      : type == TANDEM__ENVELOPE__BODY_TOKEN_CHUNK ? e->token_chunk->request_id
                      : type == TANDEM__ENVELOPE__BODY_ERROR       ? e->error->request_id
                                                             : e->page_reservation->request_id;
        if (e->body_case == type && id == request_id) {
            *from = i + 1;
            return e;
        }
    }
    return NULL;
}

/* request_id got an Error with `code`; returns it. */
static const Tandem__Error *expect_error(const node_t *node, uint64_t request_id,
                                         Tandem__ErrorCode code)
{
    int from = 0;
    const Tandem__Envelope *e = next_of(node, TANDEM__ENVELOPE__BODY_ERROR, request_id, &from);

    assert_non_null(e);
    assert_int_equal(e->error->code, code);
    return e->error;
}



/* Step until request_id's Finish or Error is out; returns the Finish (NULL after an Error). */
static const Tandem__Finish *run_to_end(node_t *node, uint64_t request_id)
{
    for (int step = 0; step < MAX_STEPS; step++) {
        int from = 0, efrom = 0;
        const Tandem__Envelope *f = next_of(node, TANDEM__ENVELOPE__BODY_FINISH, request_id, &from);
        if (f != NULL) {
            return f->finish;
        }
        if (next_of(node, TANDEM__ENVELOPE__BODY_ERROR, request_id, &efrom) != NULL) {
            return NULL;
        }
        decode_sched_step(node->sched);
    }
    fail_msg("request %llu did not end in %d steps", (unsigned long long)request_id, MAX_STEPS);
    return NULL;
}

/* The tokens request_id streamed, into out (at most n_max); returns how many. */
static int tokens_of(const node_t *node, uint64_t request_id, int32_t *out, int n_max)
{
    int from = 0, n = 0;
    const Tandem__Envelope *e;

    while ((e = next_of(node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, request_id, &from)) != NULL) {
        for (size_t i = 0; i < e->token_chunk->n_tokens && n < n_max; i++) {
            out[n++] = e->token_chunk->tokens[i];
        }
    }
    return n;
}

/* 64 * max ratio of the tiny preset (128). */
static int64_t unit_of(const fixture_t *fx)
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
    fixture_t *fx = *state;
    node_t *node = &fx->node;
    int64_t p = unit_of(fx);
    int32_t prompt[MAX_IDS], own[N_OWN], first[MAX_IDS], t_shared[MAX_GEN], t_rewound[MAX_GEN];
    const Tandem__Finish *f;
    decode_stats_t st;
    int from = 0;

    assert_true(p + 10 + N_OWN <= MAX_IDS);
    ftu_prompt(21, fx->engine.V, prompt, p + 10); /* the donor: P = prefix + 10 more ids */
    ftu_prompt(22, fx->engine.V, own, N_OWN);
    submit_local(node, 1, "donor", 0, prompt, (size_t)p + 10, 2, NULL, NULL, 0);
    assert_non_null(run_to_end(node, 1));

    /* the new session: prefix p of the donor's, own delta */
    submit_local(node, 2, "new", (uint64_t)p, own, N_OWN, MAX_GEN, "donor", prompt, (size_t)p);
    f = run_to_end(node, 2);
    assert_non_null(f);
    assert_int_equal(f->n_prefilled, N_OWN); /* only its own part */
    assert_int_equal(tokens_of(node, 2, t_shared, MAX_GEN), MAX_GEN);
    assert_null(next_of(node, TANDEM__ENVELOPE__BODY_ERROR, 2, &from));
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
    assert_non_null(run_to_end(node, 3));
    submit_local(node, 4, "ref", (uint64_t)p, own, N_OWN, MAX_GEN, NULL, NULL, 0);
    assert_non_null(run_to_end(node, 4));
    assert_int_equal(tokens_of(node, 4, t_rewound, MAX_GEN), MAX_GEN);
    assert_memory_equal(t_shared, t_rewound, sizeof(t_shared));

    /* the donor goes first: the new session keeps the pages, and continues */
    decode_sessions_remove(node->sessions, decode_sessions_find(node->sessions, "donor"));
    submit_local(node, 5, "new", f->cached_len, own, 3, 2, NULL, NULL, 0);
    assert_non_null(run_to_end(node, 5));
    decode_sched_step(node->sched);
    decode_sched_stats(node->sched, &st);
    assert_int_equal(accounted(&st), POOL_PAGES);
}

/* Every refusal: STATE_LOST, nothing shared, nothing held by the new session. */
static void expect_refused(node_t *node, uint64_t id, const char *session, uint64_t cached_len,
                           const int32_t *own, const char *donor, const int32_t *ids, size_t n_ids)
{
    decode_stats_t before, after;
    decode_session_t *s;

    decode_sched_stats(node->sched, &before);
    submit_local(node, id, session, cached_len, own, N_OWN, 2, donor, ids, n_ids);
    assert_null(run_to_end(node, id));
    expect_error(node, id, TANDEM__ERROR_CODE__ERROR_STATE_LOST);
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
    fixture_t *fx = *state;
    node_t *node = &fx->node;
    int64_t p = unit_of(fx);
    int32_t prompt[MAX_IDS], own[N_OWN], wrong[MAX_IDS];

    ftu_prompt(31, fx->engine.V, prompt, p + 10);
    ftu_prompt(32, fx->engine.V, own, N_OWN);
    submit_local(node, 10, "donor", 0, prompt, (size_t)p + 10, 2, NULL, NULL, 0);
    assert_non_null(run_to_end(node, 10));
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
    fixture_t *fx = *state;
    node_t off;
    int64_t p = unit_of(fx);
    int32_t prompt[MAX_IDS], own[N_OWN];

    node_open(fx, &off, POOL_PAGES, 1);
    ftu_prompt(41, fx->engine.V, prompt, p + 10);
    ftu_prompt(42, fx->engine.V, own, N_OWN);
    submit_local(&off, 20, "donor", 0, prompt, (size_t)p + 10, 2, NULL, NULL, 0);
    assert_non_null(run_to_end(&off, 20));
    expect_refused(&off, 21, "n", (uint64_t)p, own, "donor", prompt, (size_t)p);
    assert_true(node_close(&off));
}

/* ReservePages for a new session sharing the donor's prefix: the reservation says cached_len p
 * (the prefill node continues from the shared pages), and the refused one says 0. */
static void test_reservation_starts_at_the_shared_prefix(void **state)
{
    fixture_t *fx = *state;
    node_t *node = &fx->node;
    int64_t p = unit_of(fx);
    int32_t prompt[MAX_IDS], wrong[MAX_IDS];
    const int32_t *ids[2];

    ftu_prompt(51, fx->engine.V, prompt, p + 10);
    memcpy(wrong, prompt, sizeof(wrong));
    wrong[3] = (wrong[3] + 1) % (int32_t)fx->engine.V;
    ids[0] = prompt;
    ids[1] = wrong;
    submit_local(node, 30, "donor", 0, prompt, (size_t)p + 10, 2, NULL, NULL, 0);
    assert_non_null(run_to_end(node, 30));
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
        e = next_of(node, TANDEM__ENVELOPE__BODY_PAGE_RESERVATION, rp.request_id, &from);
        assert_non_null(e);
        assert_int_equal(e->page_reservation->cached_len, k == 0 ? (uint64_t)p : 0);
        submit_abort(node, rp.request_id, e->page_reservation->reservation_id);
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
                                        teardown),
        cmocka_unit_test_setup_teardown(test_refusals_answer_state_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_prefix_share_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reservation_starts_at_the_shared_prefix, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
