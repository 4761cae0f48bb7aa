/* test_decode_sessions.c - the sessions resident on a decode node (decode-node/sessions.h), in
 * process on the tiny preset: the table's lookups and its size limit (a full table evicts its
 * least recently used idle entry, never a busy one), eviction of idle sessions' state under page
 * pressure (busy sessions and sessions without state are skipped, pages go back to the pool; the
 * victim by score, not LRU: a session due back by its rhythm stays), and the recorded token
 * history a rewind and a canonical-start replay read (an imported sequence keeps only its state
 * record's last N - 1 ids). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "decode-node/sessions.h"
#include "forward_test_util.h"

#define POOL_PAGES    256u
#define PROMPT_TOKENS 40

typedef ftu_engine_t fixture_t;

static int setup(void **state)
{
    return ftu_fixture_setup(state, POOL_PAGES);
}

static int teardown(void **state)
{
    return ftu_fixture_teardown(state); /* fails when a pool page did not come back */
}

/* Give `session` a sequence holding a prefilled prompt (its pages come from the pool). */
static void give_state(fixture_t *fx, decode_session_t *session, uint64_t seed)
{
    int32_t ids[PROMPT_TOKENS];
    float *logits = malloc((size_t)fx->V * sizeof(float));

    assert_non_null(logits);
    ftu_prompt(seed, fx->V, ids, PROMPT_TOKENS);
    session->seq = ftu_new_seq(fx);
    assert_int_equal(engine_fwd_prefill(fx->fwd, session->seq, ids, PROMPT_TOKENS,
                                        ENGINE_PREFILL_DEFAULT, logits, NULL),
                     TDM_OK);
    assert_true(engine_seq_n_pages(session->seq) > 0);
    free(logits);
}

static void test_create_with_no_room_is_invalid(void **state)
{
    decode_sessions_t *t = NULL;

    (void)state;
    assert_int_equal(decode_sessions_create(0, &t), TDM_ERR_INVALID_ARG);
    assert_null(t);
    decode_sessions_destroy(NULL);
}

static void test_get_creates_once_and_find_finds_it(void **state)
{
    decode_sessions_t *t = NULL;
    decode_session_t *a;

    (void)state;
    assert_int_equal(decode_sessions_create(4, &t), TDM_OK);
    assert_null(decode_sessions_find(t, "a"));
    a = decode_sessions_get(t, "a");
    assert_non_null(a);
    assert_string_equal(a->id, "a");
    assert_null(a->seq);
    assert_int_equal(a->busy, 0);
    assert_ptr_equal(decode_sessions_get(t, "a"), a);
    assert_ptr_equal(decode_sessions_find(t, "a"), a);
    assert_null(decode_sessions_find(t, "b"));
    assert_int_equal(decode_sessions_n_resident(t), 0); /* known, holding no state */
    decode_sessions_remove(t, a);
    assert_null(decode_sessions_find(t, "a"));
    decode_sessions_destroy(t);
}

static void test_full_table_replaces_its_least_recently_used_idle_entry(void **state)
{
    decode_sessions_t *t = NULL;
    decode_session_t *a;
    decode_session_t *b;
    decode_session_t *c;

    (void)state;
    assert_int_equal(decode_sessions_create(2, &t), TDM_OK);
    a = decode_sessions_get(t, "a");
    b = decode_sessions_get(t, "b");
    assert_non_null(a);
    assert_non_null(b);
    a->last_used_ns = 200;
    b->last_used_ns = 100; /* b is older */

    /* both busy: no room, nothing changes */
    a->busy = 1;
    b->busy = 1;
    assert_null(decode_sessions_get(t, "c"));
    assert_ptr_equal(decode_sessions_find(t, "a"), a);
    assert_ptr_equal(decode_sessions_find(t, "b"), b);

    /* b busy, a idle: a goes although b is older */
    a->busy = 0;
    c = decode_sessions_get(t, "c");
    assert_non_null(c);
    assert_null(decode_sessions_find(t, "a"));
    assert_ptr_equal(decode_sessions_find(t, "b"), b);
    assert_ptr_equal(decode_sessions_find(t, "c"), c);
    decode_sessions_destroy(t);
}

static void test_evict_lru_drops_idle_state_oldest_first(void **state)
{
    fixture_t *fx = *state;
    decode_sessions_t *t = NULL;
    decode_session_t *s[4];
    const char *names[4] = {"old", "busy-oldest", "new", "stateless"};
    const uint64_t used_ns[4] = {200, 100, 300, 50};
    uint32_t free_before = engine_kv_pool_n_free(fx->pool);
    uint32_t held;

    assert_int_equal(decode_sessions_create(8, &t), TDM_OK);
    for (int i = 0; i < 4; i++) {
        s[i] = decode_sessions_get(t, names[i]);
        assert_non_null(s[i]);
        if (i < 3) {
            give_state(fx, s[i], 10 + (uint64_t)i);
        }
        s[i]->last_used_ns = used_ns[i];
    }
    s[1]->busy = 1;
    held = decode_sessions_n_pages(t);
    assert_int_equal(decode_sessions_n_resident(t), 3);
    assert_int_equal(free_before - engine_kv_pool_n_free(fx->pool), held);

    /* "old" first: "busy-oldest" is busy and "stateless" holds nothing */
    assert_int_equal(decode_sessions_evict_lru(t), 1);
    assert_null(s[0]->seq);
    assert_non_null(s[1]->seq);
    assert_non_null(s[2]->seq);
    assert_ptr_equal(decode_sessions_find(t, "old"), s[0]); /* the entry stays */
    assert_int_equal(decode_sessions_n_resident(t), 2);
    assert_int_equal(free_before - engine_kv_pool_n_free(fx->pool), decode_sessions_n_pages(t));
    assert_true(decode_sessions_n_pages(t) < held);

    /* then "new" */
    assert_int_equal(decode_sessions_evict_lru(t), 1);
    assert_null(s[2]->seq);
    assert_non_null(s[1]->seq);

    /* only the busy one holds state: nothing more can go */
    assert_int_equal(decode_sessions_evict_lru(t), 0);
    assert_non_null(s[1]->seq);
    assert_int_equal(decode_sessions_n_resident(t), 1);

    decode_sessions_destroy(t); /* the busy one's pages go back too (teardown checks) */
}

static void test_note_ids_records_a_true_prefix(void **state)
{
    decode_sessions_t *t = NULL;
    decode_session_t *a;
    const int32_t first[4] = {1, 2, 3, 4};
    const int32_t later[2] = {8, 9};

    (void)state;
    assert_int_equal(decode_sessions_create(1, &t), TDM_OK);
    a = decode_sessions_get(t, "a");
    assert_non_null(a);
    assert_int_equal(decode_sessions_note_ids(a, 0, first, 4), TDM_OK);
    assert_int_equal(a->n_ids, 4);

    /* a gap past what the node saw: nothing recorded */
    assert_int_equal(decode_sessions_note_ids(a, 6, later, 2), TDM_OK);
    assert_int_equal(a->n_ids, 4);

    /* an overwrite at 2 forgets what followed */
    assert_int_equal(decode_sessions_note_ids(a, 2, later, 2), TDM_OK);
    assert_int_equal(a->n_ids, 4);
    assert_int_equal(a->ids[1], 2);
    assert_int_equal(a->ids[2], 8);
    assert_int_equal(a->ids[3], 9);
    assert_int_equal(decode_sessions_note_ids(a, 1, later, 1), TDM_OK);
    assert_int_equal(a->n_ids, 2);

    decode_sessions_forget_ids_from(a, 5); /* beyond: unchanged */
    assert_int_equal(a->n_ids, 2);
    decode_sessions_forget_ids_from(a, 1);
    assert_int_equal(a->n_ids, 1);
    assert_int_equal(a->ids[0], 1);

    decode_sessions_drop_state(a); /* no state held: only the ids go */
    assert_int_equal(a->n_ids, 0);
    assert_null(a->seq);
    decode_sessions_destroy(t);
}

/* The ids a canonical-start replay reads: an imported sequence (a handoff, a tier promotion)
 * holds only its state record's last N - 1 ids; the session's recorded history gives all of
 * them. Without a history that covers the sequence, the sequence's own ids; without one, none. */
static void test_last_ids_come_from_the_history_of_an_imported_sequence(void **state)
{
    fixture_t *fx = *state;
    decode_sessions_t *t = NULL;
    decode_session_t *a;
    int32_t prompt[PROMPT_TOKENS], got[PROMPT_TOKENS], seq_ids[PROMPT_TOKENS];
    const int64_t n_want = 24; /* > N - 1, < PROMPT_TOKENS */
    engine_seq_t *imported = NULL;
    uint8_t *blob;
    size_t n_blob, n_written = 0;
    int64_t n;
    int differs = 0;

    assert_int_equal(decode_sessions_create(1, &t), TDM_OK);
    a = decode_sessions_get(t, "a");
    assert_non_null(a);
    assert_int_equal(decode_sessions_last_ids(a, got, n_want), 0); /* no sequence */
    give_state(fx, a, 31);
    ftu_prompt(31, fx->V, prompt, PROMPT_TOKENS);
    /* a sequence that ran every position here: its own ids, with or without a history */
    assert_int_equal(decode_sessions_last_ids(a, got, n_want), n_want);
    assert_memory_equal(got, prompt + PROMPT_TOKENS - n_want, (size_t)n_want * sizeof(int32_t));
    assert_int_equal(decode_sessions_note_ids(a, 0, prompt, PROMPT_TOKENS), TDM_OK);

    /* the sequence replaced by its export's import, as a handoff or a promotion does */
    n_blob = engine_seq_export_bytes(a->seq, ENGINE_SEQ_EXPORT_PAGES);
    blob = malloc(n_blob);
    assert_non_null(blob);
    assert_int_equal(engine_seq_export(a->seq, ENGINE_SEQ_EXPORT_PAGES, blob, n_blob, &n_written),
                     TDM_OK);
    engine_seq_destroy(a->seq);
    a->seq = NULL;
    assert_int_equal(engine_seq_import(fx->model, fx->pool, blob, n_written, &imported), TDM_OK);
    free(blob);
    a->seq = imported;
    assert_int_equal(engine_seq_length(imported), PROMPT_TOKENS);
    n = engine_seq_last_ids(imported, seq_ids, n_want);
    assert_int_equal(n, n_want);
    for (int64_t i = 0; i < n; i++) {
        differs |= seq_ids[i] != prompt[PROMPT_TOKENS - n_want + i];
    }
    assert_true(differs); /* what the decode node used to replay from */
    assert_int_equal(decode_sessions_last_ids(a, got, n_want), n_want);
    assert_memory_equal(got, prompt + PROMPT_TOKENS - n_want, (size_t)n_want * sizeof(int32_t));
    /* a history that stops short of the sequence: the sequence's own ids */
    decode_sessions_forget_ids_from(a, PROMPT_TOKENS - 1);
    assert_int_equal(decode_sessions_last_ids(a, got, n_want), n_want);
    assert_memory_equal(got, seq_ids, (size_t)n_want * sizeof(int32_t));
    decode_sessions_destroy(t);
}

/* Issue 17: the victim is session-aware, not the least recently used. "regular" (idle longer)
 * returns every 10 s and is due back now; "once" had one turn, 5 s ago: "once" goes first, where
 * LRU would take "regular". Turn accounting folds each pause into the mean. */
static void test_victim_keeps_a_session_due_back(void **state)
{
    fixture_t *fx = *state;
    decode_sessions_t *t = NULL;
    decode_session_t *regular, *once;
    const uint64_t s_ns = 1000000000ull;
    uint64_t now = 1000 * s_ns;

    assert_int_equal(decode_sessions_create(8, &t), TDM_OK);
    regular = decode_sessions_get(t, "regular");
    once = decode_sessions_get(t, "once");
    give_state(fx, regular, 21);
    give_state(fx, once, 22);
    /* regular: turns at 960 s, 970 s, 980 s (each ended at once), idle since 990 s */
    regular->last_used_ns = 950 * s_ns;
    for (uint64_t at = 960; at <= 990; at += 10) {
        decode_sessions_note_turn(regular, at * s_ns);
        regular->last_used_ns = at * s_ns;
    }
    assert_int_equal(regular->n_turns, 4);
    assert_true(regular->gap_mean_ns == 10 * s_ns); /* the first turn has no pause before it */
    decode_sessions_note_turn(once, 994 * s_ns);
    once->last_used_ns = 995 * s_ns;
    assert_true(regular->last_used_ns < once->last_used_ns);

    assert_ptr_equal(decode_sessions_victim(t, now), once);
    /* two regulars: the one overdue (idle 30 s for its 10 s rhythm) goes before the one due */
    once->n_turns = regular->n_turns;
    once->gap_mean_ns = regular->gap_mean_ns;
    once->last_used_ns = now - 30 * s_ns;
    assert_ptr_equal(decode_sessions_victim(t, now), once);
    once->last_used_ns = now - 11 * s_ns;
    regular->last_used_ns = now - 40 * s_ns;
    assert_ptr_equal(decode_sessions_victim(t, now), regular);
    /* busy sessions are never victims */
    once->busy = 1;
    assert_ptr_equal(decode_sessions_victim(t, now), regular);
    regular->busy = 1;
    assert_null(decode_sessions_victim(t, now));
    decode_sessions_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_with_no_room_is_invalid),
        cmocka_unit_test(test_get_creates_once_and_find_finds_it),
        cmocka_unit_test(test_full_table_replaces_its_least_recently_used_idle_entry),
        cmocka_unit_test(test_evict_lru_drops_idle_state_oldest_first),
        cmocka_unit_test(test_note_ids_records_a_true_prefix),
        cmocka_unit_test(test_last_ids_come_from_the_history_of_an_imported_sequence),
        cmocka_unit_test(test_victim_keeps_a_session_due_back),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
