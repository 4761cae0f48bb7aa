/* test_cluster_fallback.c - MODEL.md 6(d)(1) on a real local cluster (tools/tandem local: router,
 * one prefill node, one decode node, tiny preset, --local-prefill-tokens 32): a delta longer than
 * the threshold starts from rings of layers 0..c replayed at H "on whichever node runs it", so the
 * same turn gives the same tokens whether a prefill node runs it (PrefillJob + handoff) or the
 * decode node does (PREFILL_LOCAL with canonical_start, the router's fallback when no prefill node
 * can take the job). Two sessions have a first turn of 100 prompt ids prefilled remotely (one
 * generated token: H = 100 for the next turn, the decode node's sequence comes from the handoff's
 * state record), a third one of 20 ids prefilled on the decode node; their second turns (the
 * first turn, its token and 60 new ids: delta 61 > 32) run
 *  - remotely in one cluster (the prefill node is up),
 *  - on the decode node in another (the prefill node was SIGKILLed after the first turns: the
 *    router places the delta locally, canonical start),
 *  - on the decode node of a colocated cluster (--prefill 0: every turn local),
 * at temperature 0, and one at temperature 1 with a seed; the texts must be equal; and so with
 * the decode nodes' --spec ngram and dspark. The decode node used to replay the canonical start
 * from its sequence's ids, of which a handed-off sequence holds only the last N - 1 (the state
 * record's), not the W before H: the fallback's greedy text differed from the remote one.
 */
#define T_MODEL_PREFIX "cluster-fallback"
#include "test_cluster_harness.h"

#define T_FIRST 100 /* prompt ids of the first turn (> T_THRESHOLD: remote) */
#define T_SHORT 20  /* prompt ids of a first turn below T_THRESHOLD (local) */
#define T_MORE  60  /* new ids of the second turn: delta 61 > T_THRESHOLD */
#define T_SEED  1234

/* POST a completion (greedy, or temperature 1 with T_SEED) of ids; the text (malloc'ed). */
static char *complete_as(unsigned port, const char *session, const char *ids, int max_tokens,
                         int seeded)
{
    char *body = malloc(T_BODY), *resp = malloc(T_BODY), *text;
    long status;

    assert_non_null(body);
    assert_non_null(resp);
    snprintf(body, T_BODY,
             "{\"model\":\"%s\",\"prompt\":[%s],\"max_tokens\":%d,\"ignore_eos\":true,"
             "\"temperature\":%s,\"seed\":%d}",
             T_MODEL_NAME, ids, max_tokens, seeded ? "1.0" : "0", T_SEED);
    status = http(port, "/v1/completions", body, session, 0, 120000, resp);
    if (status != 200) {
        fail_msg("completion failed: status=%ld body=%s", status, resp);
    }
    text = response_text(resp);
    assert_non_null(text);
    free(body);
    free(resp);
    return text;
}

/* The sessions of one cluster: first-turn prompt ids and whether the second turn is seeded.
 * "short" starts below the threshold (its first turn runs on the decode node everywhere, exact
 * state; its second turn is a large delta: remote where a prefill node is up). */
static const struct {
    const char *name;
    int n_first;
    int seeded;
} k_sessions[] = {{"greedy", T_FIRST, 0}, {"seeded", T_FIRST, 1}, {"short", T_SHORT, 0}};
#define N_SESSIONS 3

/* The second turns' texts of one cluster, in k_sessions' order. */
typedef struct {
    char *text[N_SESSIONS];
} second_turns_t;

/*
 * Serve every session's first turn (greedy, one token), then, when kill_prefill, SIGKILL the
 * prefill node and wait until the router counts none; then the second turns. prefix names the
 * sessions (each cluster its own).
 */
static void serve(cluster_t *c, const char *prefix, int kill_prefill, second_turns_t *out)
{
    char *ids1 = malloc(T_BODY), *ids2[N_SESSIONS], *more = malloc(T_BODY);
    char *health = malloc(T_BODY);
    char gen[64], sid[N_SESSIONS][64];
    char *first;

    assert_non_null(ids1);
    assert_non_null(more);
    assert_non_null(health);
    for (int k = 0; k < N_SESSIONS; k++) {
        make_ids(more, T_BODY, T_MORE, 13, 5 + 100 * k);
        ids2[k] = malloc(T_BODY);
        assert_non_null(ids2[k]);
        make_ids(ids1, T_BODY, k_sessions[k].n_first, 7, 3);
        generate_ids(ids1, 1, gen, sizeof(gen));
        snprintf(ids2[k], T_BODY, "%s,%s,%s", ids1, gen, more);
        snprintf(sid[k], sizeof(sid[k]), "%s-%s", prefix, k_sessions[k].name);
        first = complete_as(c->http_port, sid[k], ids1, 1, 0);
        free(first);
    }
    if (c->n_prefill > 0) {
        /* the long first turns were handed off: those sequences on the decode node are imported */
        assert_true(metric(c->decode_port[0], "tandem_decode_handoffs_total") == 2);
    }
    if (kill_prefill) {
        kill(c->prefill_pid[0], SIGKILL);
        assert_true(await_health(c->http_port, "\"prefill\":0,", 20000, health) >= 0);
    }
    for (int k = 0; k < N_SESSIONS; k++) {
        out->text[k] = complete_as(c->http_port, sid[k], ids2[k], 8, k_sessions[k].seeded);
        print_message("%s-%s: \"%s\"\n", prefix, k_sessions[k].name, out->text[k]);
        free(ids2[k]);
    }
    print_message("%s: handoffs %.0f, local prefill tokens %.0f\n", prefix,
                  metric(c->decode_port[0], "tandem_decode_handoffs_total"),
                  metric(c->decode_port[0], "tandem_decode_local_prefill_tokens_total"));
    free(health);
    free(more);
    free(ids1);
}

/* The three ways, each cluster's decode node with --spec `spec` (NULL: the default, off). */
static void three_ways(const char *spec)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    second_turns_t remote, fallback, colocated;
    double local;

    print_message("decode nodes' --spec: %s\n", spec != NULL ? spec : "default");
    /* Remote: every turn through the prefill node. */
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, spec), 0);
    serve(&c, "remote", 0, &remote);
    assert_true(metric(c.decode_port[0], "tandem_decode_handoffs_total") == 2 + N_SESSIONS);
    assert_true(metric(c.decode_port[0], "tandem_decode_local_prefill_tokens_total") == T_SHORT);
    cluster_check_pages(&c, "remote second turns");
    cluster_stop(&c);
    /* Fallback: the first turns remote, the second ones on the decode node (canonical start). */
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, spec), 0);
    serve(&c, "fallback", 1, &fallback);
    local = metric(c.decode_port[0], "tandem_decode_local_prefill_tokens_total");
    assert_true(metric(c.decode_port[0], "tandem_decode_handoffs_total") == 2);
    assert_true(local == T_SHORT + N_SESSIONS * (1 + T_MORE));
    cluster_check_pages(&c, "fallback second turns");
    cluster_stop(&c);
    /* Colocated: every turn on the decode node. */
    assert_int_equal(cluster_start_spec(&c, 0, 1, NULL, 0, spec), 0);
    serve(&c, "colocated", 0, &colocated);
    cluster_check_pages(&c, "colocated second turns");
    cluster_stop(&c);
    for (int k = 0; k < N_SESSIONS; k++) {
        assert_string_equal(remote.text[k], colocated.text[k]);
        assert_string_equal(fallback.text[k], remote.text[k]);
        free(remote.text[k]);
        free(fallback.text[k]);
        free(colocated.text[k]);
    }
}

static void test_fallback_second_turn_matches_remote_and_colocated(void **state)
{
    (void)state;
    three_ways(NULL);
}

/* The same with speculative decoding: the n-gram drafter's history of a turn is the session's
 * last ids too (drafts change only speed), and DSpark's taps come from the prefill's tail. */
static void test_fallback_matches_with_ngram_drafts(void **state)
{
    (void)state;
    three_ways("ngram");
}

static void test_fallback_matches_with_dspark_drafts(void **state)
{
    (void)state;
    three_ways("dspark");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_fallback_second_turn_matches_remote_and_colocated,
                                  stop_leftovers),
        cmocka_unit_test_teardown(test_fallback_matches_with_ngram_drafts, stop_leftovers),
        cmocka_unit_test_teardown(test_fallback_matches_with_dspark_drafts, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
