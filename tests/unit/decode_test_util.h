/* decode_test_util.h - one decode node driven in process, as the decode scheduler tests
 * (test_decode_sched.c, test_decode_prefix.c, test_decode_tier.c, test_decode_budget.c,
 * test_decode_device.c) drive it
 * (header-only test code): no sockets, no router, no UCX.
 *
 * dtu_node_open makes a page pool, a session table (8 sessions) and a scheduler over a model the
 * test opened (forward_test_util.h's ftu_engine_open); the scheduler's messages go to a recorder
 * (dtu_recorder_t: a decode_sched_out_t that keeps a copy of each envelope, growing as needed,
 * and the last load report) and the test feeds it the router's messages by hand (dtu_send_request,
 * dtu_submit_abort). dtu_node_close frees it all and says whether every page came back.
 * dtu_sched_params gives the parameters the tests start from; dtu_fixture_setup and
 * dtu_fixture_teardown make a cmocka fixture of the model and one node; dtu_find, dtu_next_of,
 * dtu_expect_error, dtu_run_to_end and dtu_tokens_of read the recorded messages; dtu_remote_turn
 * plays a prefill node's part of a remote turn. Failures are cmocka assertions.
 */
#ifndef TANDEM_TESTS_DECODE_TEST_UTIL_H
#define TANDEM_TESTS_DECODE_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/hash.h"
#include "decode-node/pool.h"
#include "decode-node/sched.h"
#include "decode-node/sessions.h"
#include "decode-node/tier.h"
#include "engine/kv_cache.h"
#include "engine/seq_state.h"
#include "forward_test_util.h"
#include "kernels/kv_page.h"
#include "node/node_handoff.h"
#include "node/node_pages.h"
#include "proto/proto.h"

/* The router's side: every envelope the scheduler sent (copies, owned), and its load reports. */
typedef struct {
    Tandem__Envelope **msgs; /* msgs[0..n_msgs) in the order sent */
    int n_msgs;
    int cap;          /* slots in msgs */
    int n_loads;      /* load reports seen */
    node_load_t load; /* the last load report */
} dtu_recorder_t;

/* One decode node's parts (owned by the test; dtu_node_close frees them). */
typedef struct {
    decode_pool_t *pool;
    decode_sessions_t *sessions;
    decode_tier_t *tier; /* the params' tier (owned), or NULL */
    decode_sched_t *sched;
    dtu_recorder_t rec;
} dtu_node_t;

/* dtu_record_send - decode_sched_out_t.send: keep a copy (packed and unpacked again). */
static inline void dtu_record_send(void *arg, const Tandem__Envelope *env)
{
    dtu_recorder_t *rec = arg;
    uint8_t *buf = NULL;
    size_t n = 0;
    Tandem__Envelope *copy = NULL;

    if (rec->n_msgs == rec->cap) {
        rec->cap = rec->cap == 0 ? 1024 : rec->cap * 2;
        rec->msgs = realloc(rec->msgs, (size_t)rec->cap * sizeof(*rec->msgs));
        assert_non_null(rec->msgs);
    }
    assert_int_equal(proto_pack(env, &buf, &n), TDM_OK);
    assert_int_equal(proto_unpack(buf, n, 0, &copy, NULL, 0), TDM_OK);
    free(buf);
    rec->msgs[rec->n_msgs++] = copy;
}

/* dtu_record_load - decode_sched_out_t.set_load: count it and keep the last one. */
static inline void dtu_record_load(void *arg, const node_load_t *load)
{
    dtu_recorder_t *rec = arg;

    rec->n_loads++;
    rec->load = *load;
}

/* dtu_sched_params - the tests' starting parameters: all zero (fence_ms 0: an aborted
 * reservation's pages come back at the next step; no budget, no tier, no prefix sharing) but
 * max_batch 4, chunk_tokens 64, n_threads 2, no speculation. */
static inline void dtu_sched_params(decode_sched_params_t *sp)
{
    memset(sp, 0, sizeof(*sp));
    sp->fence_ms = 0;
    sp->max_batch = 4;
    sp->chunk_tokens = 64;
    sp->n_threads = 2;
    sp->spec_drafter = ENGINE_SPEC_OFF;
}

/* dtu_node_open - a node of n_pages pages over model with scheduler parameters sp; the node takes
 * ownership of sp->tier (may be NULL). */
static inline void dtu_node_open(dtu_node_t *node, const engine_model_t *model, uint32_t n_pages,
                                 const decode_sched_params_t *sp)
{
    decode_sched_out_t out = {dtu_record_send, dtu_record_load, &node->rec};

    memset(node, 0, sizeof(*node));
    node->tier = sp->tier;
    assert_int_equal(decode_pool_create(model, n_pages, NULL, &node->pool), TDM_OK);
    assert_int_equal(decode_sessions_create(8, &node->sessions), TDM_OK);
    assert_int_equal(decode_sched_create(sp, model, node->pool, node->sessions, &out, &node->sched),
                     TDM_OK);
}

/* dtu_node_close - close the node (destroy aborts what runs) and free the recorded messages;
 * returns 1 when every page was free, none reserved and none shared before the pool went. */
static inline int dtu_node_close(dtu_node_t *node)
{
    int all_back;

    decode_sched_destroy(node->sched);
    decode_sessions_destroy(node->sessions);
    decode_tier_destroy(node->tier);
    all_back = engine_kv_pool_n_shared(decode_pool_engine(node->pool)) == 0 &&
               decode_pool_n_free(node->pool) == decode_pool_n_total(node->pool) &&
               decode_pool_n_reserved(node->pool) == 0;
    decode_pool_destroy(node->pool);
    for (int i = 0; i < node->rec.n_msgs; i++) {
        proto_envelope_free(node->rec.msgs[i]);
    }
    free(node->rec.msgs);
    return all_back;
}

/* A cmocka fixture: the tiny preset (ftu_engine_open with 16 pages of its own, not used here)
 * and one node over it. */
typedef struct {
    ftu_engine_t engine;
    dtu_node_t node;
} dtu_fixture_t;

/* dtu_fixture_setup - cmocka setup: *state a new dtu_fixture_t whose node has n_pages pages and
 * scheduler parameters sp. Returns 0, or -1 when the model did not load. */
static inline int dtu_fixture_setup(void **state, uint32_t n_pages, const decode_sched_params_t *sp)
{
    dtu_fixture_t *fx = calloc(1, sizeof(*fx));

    if (fx == NULL || ftu_engine_open(&fx->engine, 16) != 0) {
        if (fx != NULL) {
            ftu_engine_close(&fx->engine);
        }
        free(fx);
        return -1;
    }
    dtu_node_open(&fx->node, fx->engine.model, n_pages, sp);
    *state = fx;
    return 0;
}

/* dtu_fixture_teardown - cmocka teardown: free *state; returns 0 when the node gave every page
 * back (dtu_node_close) and the model closed cleanly, else -1. */
static inline int dtu_fixture_teardown(void **state)
{
    dtu_fixture_t *fx = *state;
    int ok = dtu_node_close(&fx->node);

    ok = ftu_engine_close(&fx->engine) == 0 && ok;
    free(fx);
    return ok ? 0 : -1;
}

/* dtu_sampling - sp reset, with temperature, top_p 1 and seed. */
static inline void dtu_sampling(Tandem__SamplingParams *sp, double temperature, uint64_t seed)
{
    tandem__sampling_params__init(sp);
    sp->temperature = temperature;
    sp->top_p = 1.0;
    sp->seed = seed;
}

/* dtu_request - dr reset to a DecodeRequest with local prefill of ids[0..n) (borrowed) at
 * cached_len (total_len cached_len + n) for session, with sampling sp (borrowed); the test may
 * set more fields before dtu_send_request. */
static inline void dtu_request(Tandem__DecodeRequest *dr, uint64_t request_id, const char *session,
                               uint64_t cached_len, const int32_t *ids, size_t n,
                               uint32_t max_tokens, Tandem__SamplingParams *sp)
{
    tandem__decode_request__init(dr);
    dr->request_id = request_id;
    dr->session_id = (char *)session;
    dr->cached_len = cached_len;
    dr->n_delta_tokens = n;
    dr->delta_tokens = (int32_t *)ids;
    dr->mode = TANDEM__PREFILL_MODE__PREFILL_LOCAL;
    dr->sampling = sp;
    dr->max_tokens = max_tokens;
    dr->total_len = cached_len + n;
}

/* dtu_send_request - hand the node's scheduler dr as the router would. */
static inline void dtu_send_request(dtu_node_t *node, Tandem__DecodeRequest *dr)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;

    env.body_case = TANDEM__ENVELOPE__BODY_DECODE_REQUEST;
    env.decode_request = dr;
    decode_sched_on_message(node->sched, &env);
}

/* dtu_submit_abort - hand the node's scheduler an Abort of request_id / reservation_id (0:
 * none). */
static inline void dtu_submit_abort(dtu_node_t *node, uint64_t request_id, uint64_t reservation_id)
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

/* dtu_request_of - the request a TokenChunk, Finish, Error or PageReservation is about (0 for
 * other types). */
static inline uint64_t dtu_request_of(const Tandem__Envelope *e)
{
    switch (e->body_case) {
    case TANDEM__ENVELOPE__BODY_TOKEN_CHUNK:
        return e->token_chunk->request_id;
    case TANDEM__ENVELOPE__BODY_FINISH:
        return e->finish->request_id;
    case TANDEM__ENVELOPE__BODY_ERROR:
        return e->error->request_id;
    case TANDEM__ENVELOPE__BODY_PAGE_RESERVATION:
        return e->page_reservation->request_id;
    default:
        return 0;
    }
}

/* dtu_find - index of the first recorded message of `type` for request_id at or after `from`, or
 * -1. */
static inline int dtu_find(const dtu_node_t *node, Tandem__Envelope__BodyCase type,
                           uint64_t request_id, int from)
{
    for (int i = from; i < node->rec.n_msgs; i++) {
        if (node->rec.msgs[i]->body_case == type &&
            dtu_request_of(node->rec.msgs[i]) == request_id) {
            return i;
        }
    }
    return -1;
}

/* dtu_next_of - the first recorded message of `type` for request_id at or after index *from
 * (advanced past it), or NULL. */
static inline const Tandem__Envelope *
dtu_next_of(const dtu_node_t *node, Tandem__Envelope__BodyCase type, uint64_t request_id, int *from)
{
    int i = dtu_find(node, type, request_id, *from);

    if (i < 0) {
        return NULL;
    }
    *from = i + 1;
    return node->rec.msgs[i];
}

/* dtu_expect_error - request_id got an Error with `code`; returns it. */
static inline const Tandem__Error *dtu_expect_error(const dtu_node_t *node, uint64_t request_id,
                                                    Tandem__ErrorCode code)
{
    int i = dtu_find(node, TANDEM__ENVELOPE__BODY_ERROR, request_id, 0);

    assert_true(i >= 0);
    assert_int_equal(node->rec.msgs[i]->error->code, code);
    return node->rec.msgs[i]->error;
}

/* dtu_run_to_end - step until request_id's Finish or Error is out (fails after max_steps steps);
 * returns the Finish, or NULL after an Error. */
static inline const Tandem__Finish *dtu_run_to_end(dtu_node_t *node, uint64_t request_id,
                                                   int max_steps)
{
    for (int step = 0; step < max_steps; step++) {
        int f = dtu_find(node, TANDEM__ENVELOPE__BODY_FINISH, request_id, 0);
        if (f >= 0) {
            return node->rec.msgs[f]->finish;
        }
        if (dtu_find(node, TANDEM__ENVELOPE__BODY_ERROR, request_id, 0) >= 0) {
            return NULL;
        }
        decode_sched_step(node->sched);
    }
    fail_msg("request %llu did not end in %d steps", (unsigned long long)request_id, max_steps);
    return NULL;
}

/* dtu_tokens_of - the tokens request_id streamed, into out (at most cap), checked to follow on
 * at consecutive positions; returns how many. */
static inline int dtu_tokens_of(const dtu_node_t *node, uint64_t request_id, int32_t *out, int cap)
{
    int n = 0;
    uint64_t first = 0;

    for (int i = 0; (i = dtu_find(node, TANDEM__ENVELOPE__BODY_TOKEN_CHUNK, request_id, i)) >= 0;
         i++) {
        const Tandem__TokenChunk *c = node->rec.msgs[i]->token_chunk;
        if (n == 0) {
            first = c->first_position;
        }
        assert_int_equal(c->first_position, first + (uint64_t)n);
        for (size_t k = 0; k < c->n_tokens && n < cap; k++) {
            out[n++] = c->tokens[k];
        }
    }
    return n;
}

/* Most page checksums one dtu_remote_turn carries. */
#define DTU_MAX_SUMS 256

/* dtu_desc_fn - what a test checks of a reservation's descriptor before its pages are put. */
typedef void dtu_desc_fn(void *arg, dtu_node_t *node, const node_resv_desc_t *desc);

/*
 * dtu_remote_turn - a remote prefill's turn by hand, as a prefill node does it: ReservePages for
 * [cached_len, T) of ids (borrowed) for `session`; on_desc(arg, ...) (may be NULL) sees the
 * reservation's descriptor; what `pre` (a sequence of `src`, the prefill side's engine over host
 * pages) lacks of ids[0..T) is prefilled on it; the pages the reservation names are sealed and
 * copied where a prefill node's puts land (node_pages_host: the engine's pages, or their staging
 * copies); then the DecodeRequest with its CompletionNotice (greedy, max_tokens). Returns 0, or
 * -1 when the reservation was refused (its Error recorded; nothing prefilled).
 */
static inline int dtu_remote_turn(ftu_engine_t *src, engine_seq_t *pre, dtu_node_t *node,
                                  uint64_t request_id, const char *session, uint64_t cached_len,
                                  const int32_t *ids, uint64_t T, uint32_t max_tokens,
                                  dtu_desc_fn *on_desc, void *arg)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__ReservePages rp = TANDEM__RESERVE_PAGES__INIT;
    Tandem__DecodeRequest dr = TANDEM__DECODE_REQUEST__INIT;
    Tandem__CompletionNotice h = TANDEM__COMPLETION_NOTICE__INIT;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    node_pages_t *pages = decode_pool_pages(node->pool);
    size_t page_bytes = engine_kv_pool_page_bytes(decode_pool_engine(node->pool));
    int64_t have = engine_seq_length(pre);
    const Tandem__Envelope *e;
    node_resv_desc_t desc;
    uint64_t sums[DTU_MAX_SUMS];
    uint32_t n_sums = 0;
    float *logits;
    uint8_t *record;
    size_t n_record;
    int from = 0;

    rp.request_id = request_id;
    rp.session_id = (char *)session;
    rp.cached_len = cached_len;
    rp.total_len = T;
    rp.timeout_ms = 60000;
    env.body_case = TANDEM__ENVELOPE__BODY_RESERVE_PAGES;
    env.reserve_pages = &rp;
    decode_sched_on_message(node->sched, &env);
    e = dtu_next_of(node, TANDEM__ENVELOPE__BODY_PAGE_RESERVATION, request_id, &from);
    if (e == NULL) {
        return -1;
    }
    assert_int_equal(node_resv_desc_parse(e->page_reservation->descriptor.data,
                                          e->page_reservation->descriptor.len, &desc),
                     TDM_OK);
    if (on_desc != NULL) {
        on_desc(arg, node, &desc);
    }
    logits = malloc((size_t)src->V * sizeof(float));
    assert_non_null(logits);
    assert_int_equal(engine_fwd_prefill(src->fwd, pre, ids + have, (int64_t)T - have,
                                        ENGINE_PREFILL_DEFAULT, logits, NULL),
                     TDM_OK);
    for (uint32_t i = 0; i < desc.n_sources; i++) {
        const engine_kv_table_t *t = engine_seq_table(pre, desc.src[i].layer);
        assert_int_equal(desc.src[i].first_target + desc.src[i].n_targets, t->n_pages);
        for (uint32_t j = 0; j < desc.src[i].n_targets; j++) {
            uint8_t *from_page =
                engine_kv_pool_page(src->pool, t->page_ids[desc.src[i].first_target + j]);
            uint8_t *to_page = node_pages_host(pages, desc.src[i].targets[j]);

            assert_non_null(to_page);
            kern_kv_page_seal(from_page);
            memcpy(to_page, from_page, page_bytes); /* the prefill node's put */
            assert_true(n_sums < DTU_MAX_SUMS);
            sums[n_sums++] = tdm_hash_xxh3_64(to_page, page_bytes);
        }
    }
    n_record = engine_seq_export_bytes(pre, ENGINE_SEQ_EXPORT_RECORD);
    record = malloc(n_record);
    assert_non_null(record);
    assert_int_equal(engine_seq_export(pre, ENGINE_SEQ_EXPORT_RECORD, record, n_record, &n_record),
                     TDM_OK);
    h.request_id = request_id;
    h.reservation_id = desc.reservation_id;
    h.cached_len = desc.cached_len;
    h.total_len = T;
    h.page_checksums = sums;
    h.n_page_checksums = n_sums;
    h.sampler_counter = T;
    h.state_record.data = record;
    h.state_record.len = n_record;
    h.state_checksum = tdm_hash_xxh3_64(record, n_record);
    h.first_token = (int32_t)ftu_argmax(logits, src->V);
    sp.temperature = 0.0;
    sp.top_p = 1.0;
    dr.request_id = request_id;
    dr.session_id = (char *)session;
    dr.mode = TANDEM__PREFILL_MODE__PREFILL_REMOTE;
    dr.handoff = &h;
    dr.sampling = &sp;
    dr.max_tokens = max_tokens;
    dr.cached_len = desc.cached_len;
    dr.total_len = T;
    dr.n_delta_tokens = T - desc.cached_len;
    dr.delta_tokens = (int32_t *)ids + desc.cached_len;
    env.body_case = TANDEM__ENVELOPE__BODY_DECODE_REQUEST;
    env.decode_request = &dr;
    decode_sched_on_message(node->sched, &env);
    free(record);
    free(logits);
    node_resv_desc_fini(&desc);
    return 0;
}

#endif /* TANDEM_TESTS_DECODE_TEST_UTIL_H */
