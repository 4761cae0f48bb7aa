/* test_router_stream.c - the router's output stream (router/stream.h: detokenizer, stop strings,
 * stop ids, max_tokens) and session table (router/session.h: history, block-hash prefix index
 * confirmed on tokens, eviction, unplacing). Uses the synthetic tokenizer, where byte b is id
 * 3 + b. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/tokenizer.h"
#include "router/session.h"
#include "router/stream.h"

#define VOCAB      1024
#define BYTE_ID(b) ((int32_t)(3 + (unsigned char)(b)))
#define EOS_ID     1
#define TEXT_BYTES 512

static int setup_tokenizer(void **state)
{
    text_tokenizer_t *tok = NULL;
    char *json = NULL;
    size_t n = 0;

    if (text_tokenizer_synthetic_hf_text(VOCAB, &json, &n, NULL, 0) != TDM_OK) {
        return -1;
    }
    if (text_tokenizer_load_hf_buffer(json, n, "synthetic", &tok, NULL, 0) != TDM_OK) {
        free(json);
        return -1;
    }
    free(json);
    *state = tok;
    return 0;
}

static int teardown_tokenizer(void **state)
{
    text_tokenizer_destroy(*state);
    return 0;
}

static uint32_t g_min_tokens; /* run()'s min_tokens (0 unless a test sets it) */

/* Push `text` byte by byte (plus EOS when eos) and collect what the stream releases. */
static router_stream_state_t run(const text_tokenizer_t *tok, const char *text, int eos,
                                 const char *stop, uint32_t max_tokens, char *out,
                                 uint32_t *n_tokens_out)
{
    router_stream_params_t params;
    router_stream_t *s = NULL;
    const char *stops[1] = {stop};
    size_t stop_bytes[1] = {stop != NULL ? strlen(stop) : 0};
    int32_t stop_ids[1] = {EOS_ID};
    const char *piece;
    size_t n;
    router_stream_state_t state;

    memset(&params, 0, sizeof(params));
    params.tok = tok;
    params.stop = stops;
    params.stop_bytes = stop_bytes;
    params.n_stop = stop != NULL ? 1 : 0;
    params.stop_ids = stop_ids;
    params.n_stop_ids = 1;
    params.max_tokens = max_tokens;
    params.min_tokens = g_min_tokens;
    assert_int_equal(router_stream_create(&params, &s), TDM_OK);
    out[0] = '\0';
    for (const char *c = text; *c != '\0'; c++) {
        assert_int_equal(router_stream_push(s, BYTE_ID(*c), &piece, &n), TDM_OK);
        strncat(out, piece, n);
    }
    if (eos) {
        assert_int_equal(router_stream_push(s, EOS_ID, &piece, &n), TDM_OK);
        strncat(out, piece, n);
    }
    assert_int_equal(router_stream_finish(s, ROUTER_STREAM_LENGTH, &piece, &n), TDM_OK);
    strncat(out, piece, n);
    piece = router_stream_text(s, &n);
    assert_int_equal(n, strlen(out));
    assert_memory_equal(piece, out, n);
    state = router_stream_state(s);
    *n_tokens_out = router_stream_n_tokens(s);
    router_stream_destroy(s);
    return state;
}

static void test_stop_string_ends_output_before_it(void **state)
{
    char out[TEXT_BYTES];
    uint32_t n_tokens;

    assert_int_equal(run(*state, "ab STO STOP cd", 1, "STOP", 100, out, &n_tokens),
                     ROUTER_STREAM_STOP);
    assert_string_equal(out, "ab STO ");
    assert_int_equal(n_tokens, 11); /* counted up to the token that completed the match */
}

static void test_held_prefix_is_released_when_the_stream_ends(void **state)
{
    char out[TEXT_BYTES];
    uint32_t n_tokens;

    assert_int_equal(run(*state, "ab ST", 1, "STOP", 100, out, &n_tokens), ROUTER_STREAM_STOP);
    assert_string_equal(out, "ab ST");
    assert_int_equal(n_tokens, 6); /* 5 bytes + EOS */
    assert_int_equal(run(*state, "ab ST", 0, "STOP", 100, out, &n_tokens), ROUTER_STREAM_LENGTH);
    assert_string_equal(out, "ab ST");
}

static void test_max_tokens_cut_inside_a_character_gives_replacement(void **state)
{
    char out[TEXT_BYTES];
    uint32_t n_tokens;

    assert_int_equal(run(*state, "x\xE2\x82\xAC", 0, NULL, 3, out, &n_tokens),
                     ROUTER_STREAM_LENGTH);
    assert_string_equal(out, "x\xEF\xBF\xBD");
    assert_int_equal(n_tokens, 3);
    assert_int_equal(run(*state, "x\xE2\x82\xAC", 0, NULL, 4, out, &n_tokens),
                     ROUTER_STREAM_LENGTH);
    assert_string_equal(out, "x\xE2\x82\xAC");
}

static void test_min_tokens_ignores_stops_within_them(void **state)
{
    char out[TEXT_BYTES];
    uint32_t n_tokens;

    /* the first STOP completes at token 7, within min_tokens 8: not a stop; the second ends */
    g_min_tokens = 8;
    assert_int_equal(run(*state, "ab STOP cd STOP ef", 1, "STOP", 100, out, &n_tokens),
                     ROUTER_STREAM_STOP);
    assert_string_equal(out, "ab STOP cd ");
    assert_int_equal(n_tokens, 15);
    /* EOS as token 3 of min_tokens 8 does not end the stream */
    assert_int_equal(run(*state, "ab", 1, NULL, 100, out, &n_tokens), ROUTER_STREAM_LENGTH);
    assert_string_equal(out, "ab");
    assert_int_equal(n_tokens, 3);
    /* without min_tokens both end at the first chance */
    g_min_tokens = 0;
    assert_int_equal(run(*state, "ab STOP cd STOP ef", 1, "STOP", 100, out, &n_tokens),
                     ROUTER_STREAM_STOP);
    assert_string_equal(out, "ab ");
    assert_int_equal(run(*state, "ab", 1, NULL, 100, out, &n_tokens), ROUTER_STREAM_STOP);
}

static void test_tokens_after_the_end_are_ignored(void **state)
{
    router_stream_params_t params;
    router_stream_t *s = NULL;
    const char *piece;
    size_t n;

    memset(&params, 0, sizeof(params));
    params.tok = *state;
    params.max_tokens = 1;
    assert_int_equal(router_stream_create(&params, &s), TDM_OK);
    assert_int_equal(router_stream_push(s, BYTE_ID('a'), &piece, &n), TDM_OK);
    assert_int_equal(router_stream_state(s), ROUTER_STREAM_LENGTH);
    assert_int_equal(router_stream_push(s, BYTE_ID('b'), &piece, &n), TDM_OK);
    assert_int_equal(n, 0);
    assert_int_equal(router_stream_n_tokens(s), 1);
    router_stream_destroy(s);
    params.max_tokens = 0;
    s = NULL;
    assert_int_equal(router_stream_create(&params, &s), TDM_ERR_INVALID_ARG);
    assert_null(s);
}

static void test_prefix_match_is_confirmed_on_tokens(void **state)
{
    router_sessions_t *t = NULL;
    router_session_t *a = NULL;
    router_session_t *b = NULL;
    int32_t ids[40];
    int32_t probe[40];
    size_t matched = 99;

    (void)state;
    for (int i = 0; i < 40; i++) {
        ids[i] = i + 10;
    }
    assert_int_equal(router_sessions_create(4, 8, &t), TDM_OK);
    assert_int_equal(router_sessions_add(t, "a", 0, 1, &a), TDM_OK);
    assert_int_equal(router_sessions_add(t, "a", 0, 1, &b), TDM_ERR_INVALID_ARG);
    assert_int_equal(router_sessions_set_history(t, a, ids, 20), TDM_OK);
    assert_int_equal(a->n_blocks, 2);
    memcpy(probe, ids, sizeof(ids));
    assert_ptr_equal(router_sessions_match_prefix(t, 0, probe, 40, &matched), a);
    assert_int_equal(matched, 16);
    probe[12] = 0; /* second block differs: only the first matches */
    assert_ptr_equal(router_sessions_match_prefix(t, 0, probe, 40, &matched), a);
    assert_int_equal(matched, 8);
    probe[0] = 0;
    assert_null(router_sessions_match_prefix(t, 0, probe, 40, &matched));
    assert_int_equal(matched, 0);
    /* History changes reindex; cached_len is clipped to the common prefix. */
    a->cached_len = 19;
    ids[5] = 999;
    assert_int_equal(router_sessions_set_history(t, a, ids, 30), TDM_OK);
    assert_int_equal(a->cached_len, 5);
    assert_int_equal(a->n_blocks, 3);
    assert_int_equal(router_sessions_append(t, a, ids + 30, 10), TDM_OK);
    assert_int_equal(a->n_blocks, 5);
    assert_ptr_equal(router_sessions_match_prefix(t, 0, ids, 40, &matched), a);
    assert_int_equal(matched, 40);
    router_sessions_destroy(t);
}

static void test_full_table_evicts_the_least_recent_idle_session(void **state)
{
    router_sessions_t *t = NULL;
    router_session_t *s[3];
    router_session_t *extra = NULL;

    (void)state;
    assert_int_equal(router_sessions_create(2, 8, &t), TDM_OK);
    assert_int_equal(router_sessions_add(t, "old", 0, 1, &s[0]), TDM_OK);
    assert_int_equal(router_sessions_add(t, "new", 0, 2, &s[1]), TDM_OK);
    s[0]->active_request = 5; /* busy: not evictable */
    assert_int_equal(router_sessions_add(t, "third", 0, 3, &s[2]), TDM_OK);
    assert_non_null(router_sessions_get(t, "old"));
    assert_null(router_sessions_get(t, "new"));
    s[2]->active_request = 6;
    assert_int_equal(router_sessions_add(t, "fourth", 0, 4, &extra), TDM_ERR_BUSY);
    assert_null(extra);
    assert_int_equal(router_sessions_count(t), 2);
    s[0]->worker_slot = 3;
    s[0]->worker_generation = 9;
    s[0]->cached_len = 7;
    assert_int_equal(router_sessions_unplace_worker(t, 3, 9), 1);
    assert_int_equal(s[0]->worker_slot, -1);
    assert_int_equal(s[0]->cached_len, 0);
    router_sessions_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_string_ends_output_before_it),
        cmocka_unit_test(test_held_prefix_is_released_when_the_stream_ends),
        cmocka_unit_test(test_max_tokens_cut_inside_a_character_gives_replacement),
        cmocka_unit_test(test_min_tokens_ignores_stops_within_them),
        cmocka_unit_test(test_tokens_after_the_end_are_ignored),
        cmocka_unit_test(test_prefix_match_is_confirmed_on_tokens),
        cmocka_unit_test(test_full_table_evicts_the_least_recent_idle_session),
    };
    return cmocka_run_group_tests(tests, setup_tokenizer, teardown_tokenizer);
}
