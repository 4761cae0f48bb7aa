/* test_cluster_rewind.c - a session whose next prompt diverges inside the positions the decode
 * node holds keeps the common prefix (MODEL.md 6(d)(2), docs/PROTOCOL.md 3c): turn 1 = ids A
 * (local, or remote: the router sends the delta's ids either way and the node records them),
 * turn 2 = A + ids D that are not the generated tokens, so the prompt shares only |A| tokens with
 * the node's state. The node cuts its sequence back to |A| and replays the rings instead of
 * answering ERROR_STATE_LOST: the router and the node count only |D| tokens prefilled, |A|
 * reused, one rewind. With |A| <= W the replay runs from 0 and the text equals a fresh session
 * given A + D (both then start layers > c from empty rings at T - W since |D| > W); beyond W the
 * rewound state is approximate (MODEL.md 6(e)): the counters are asserted and both texts
 * printed. Pages back at baseline.
 */
#define T_MODEL_PREFIX "cluster-rewind"
#include "test_cluster_harness.h"

/* Counters around one turn. */
typedef struct {
    double prefill_node; /* tandem_prefill_tokens_total of prefill node 0 */
    double local;        /* tandem_decode_local_prefill_tokens_total of decode node 0 */
    double computed;     /* router: tandem_prefill_tokens_computed_total */
    double reused;       /* router: tandem_prefill_tokens_reused_total */
    double rewinds;      /* decode node 0: tandem_decode_rewinds_total */
    double kept;         /* decode node 0: tandem_decode_rewind_kept_tokens_total */
    double lost;         /* decode node 0: tandem_decode_state_lost_total */
} counters_t;

static void read_counters(const cluster_t *c, counters_t *out)
{
    out->prefill_node = metric(c->prefill_port[0], "tandem_prefill_tokens_total");
    out->local = metric(c->decode_port[0], "tandem_decode_local_prefill_tokens_total");
    out->computed = metric(c->http_port, "tandem_prefill_tokens_computed_total");
    out->reused = metric(c->http_port, "tandem_prefill_tokens_reused_total");
    out->rewinds = metric(c->decode_port[0], "tandem_decode_rewinds_total");
    out->kept = metric(c->decode_port[0], "tandem_decode_rewind_kept_tokens_total");
    out->lost = metric(c->decode_port[0], "tandem_decode_state_lost_total");
}

/* One case: |A| = n_a, |D| = n_d; want_equal: assert the text equals a fresh session's. */
static void rewind_case(const cluster_t *c, const char *session, int n_a, int n_d, int want_equal)
{
    const int n_gen = 8;
    char *a = malloc(T_BODY), *ad = malloc(T_BODY), d[4096], gen[4096], fresh_id[160];
    char *t1, *t2, *fresh;
    counters_t before, after;
    int remote = n_d >= T_THRESHOLD;

    assert_non_null(a);
    assert_non_null(ad);
    make_ids(a, T_BODY, n_a, 7, 3 + n_a);
    /* D: ids that are not the greedy continuation of A (checked below) */
    make_ids(d, sizeof(d), n_d, 11, 501 + n_d);
    generate_ids(a, 1, gen, sizeof(gen));
    assert_true(atoi(gen) != atoi(d)); /* the prompts diverge right after A */
    snprintf(ad, T_BODY, "%s,%s", a, d);
    t1 = complete(c->http_port, session, a, n_gen);
    read_counters(c, &before);
    t2 = complete(c->http_port, session, ad, n_gen);
    read_counters(c, &after);
    print_message(
        "%s: |A| %d |D| %d (%s): prefill node %.0f, decode local %.0f, router computed "
        "%.0f reused %.0f, rewinds %.0f kept %.0f, state lost %.0f\n",
        session, n_a, n_d, remote ? "remote" : "local", after.prefill_node - before.prefill_node,
        after.local - before.local, after.computed - before.computed, after.reused - before.reused,
        after.rewinds - before.rewinds, after.kept - before.kept, after.lost - before.lost);
    /* before the rewind the node answered STATE_LOST and the router re-prefilled |A| + |D| */
    assert_true(after.rewinds - before.rewinds == 1);
    assert_true(after.kept - before.kept == n_a);
    assert_true(after.lost - before.lost == 0);
    assert_true(after.computed - before.computed == n_d);
    assert_true(after.reused - before.reused == n_a);
    assert_true(after.prefill_node - before.prefill_node == (remote ? n_d : 0));
    assert_true(after.local - before.local == (remote ? 0 : n_d));
    snprintf(fresh_id, sizeof(fresh_id), "%s-fresh", session);
    fresh = complete(c->http_port, fresh_id, ad, n_gen);
    print_message("%s: rewound turn 2 \"%s\", fresh A + D \"%s\"%s\n", session, t2, fresh,
                  want_equal ? "" : " (|A| > W: approximate, not compared)");
    if (want_equal) {
        assert_string_equal(t2, fresh);
    }
    free(t1);
    free(t2);
    free(fresh);
    free(a);
    free(ad);
}

static void test_diverging_turn_keeps_common_prefix(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */

    (void)state;
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    /* tiny: W = 16. |A| <= W: exact replay; |D| > W on both paths (local < 32 <= remote) */
    rewind_case(&c, "rw-local", 12, 24, 1);
    rewind_case(&c, "rw-remote", 12, 40, 1);
    /* |A| > W: approximate; counters only */
    rewind_case(&c, "rw-long", 28, 20, 0);
    /* turn 1 remote (|A| >= 32): the router also sends the remote delta's ids to the decode
     * node, which records them; turn 2 rewinds into what the prefill node computed */
    rewind_case(&c, "rw-after-remote", 40, 24, 0);
    cluster_check_pages(&c, "rewind");
    cluster_stop(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_diverging_turn_keeps_common_prefix, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
