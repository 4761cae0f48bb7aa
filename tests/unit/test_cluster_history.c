/* test_cluster_history.c - the prefill node's history page cache in a real cluster (issue 17,
 * item 6; prefill-node/history.h): `tandem local` with one prefill and one decode node, one
 * session of four remote turns (every delta >= the local-prefill threshold):
 *   1. ids A (600 tokens): H = 0, nothing pulled;
 *   2. A + its 8 generated ids + 64 new ids: the prefill node keeps the session's pages after
 *      turn 1, so it pulls only the pages the decode changed (each source's last page) - at
 *      least 80 % fewer history bytes than the whole history;
 *   3. the same again one turn later;
 *   4. a rewind: the first 300 ids of A + 64 other ids: the decode node cuts the session back,
 *      so its cut page differs from the kept copy and must be pulled (never the stale copy).
 * The same four turns on a cluster whose prefill node runs with TANDEM_HISTORY_CACHE_MB=0
 * (the --history-cache-mb flag's environment fallback) pull the whole history every turn and
 * give the same text on every turn. Pages back at baseline.
 */
#define T_MODEL_PREFIX "cluster-history"
#include "test_cluster_harness.h"

#define N_TURNS 4

typedef struct {
    char *text[N_TURNS];
    double pulled[N_TURNS]; /* tandem_prefill_history_bytes_pulled_total, per turn */
    double needed[N_TURNS]; /* tandem_prefill_history_bytes_total, per turn */
    double hits;            /* tandem_prefill_history_cache_hits_total after the run */
} run_t;

static char *turn(const cluster_t *c, const char *session, const char *ids, run_t *r, int t)
{
    double p0 = metric(c->prefill_port[0], "tandem_prefill_history_bytes_pulled_total");
    double n0 = metric(c->prefill_port[0], "tandem_prefill_history_bytes_total");
    char *text = complete(c->http_port, session, ids, 8);

    r->pulled[t] = metric(c->prefill_port[0], "tandem_prefill_history_bytes_pulled_total") - p0;
    r->needed[t] = metric(c->prefill_port[0], "tandem_prefill_history_bytes_total") - n0;
    print_message("turn %d: history bytes pulled %.0f of %.0f\n", t + 1, r->pulled[t],
                  r->needed[t]);
    return text;
}

static void session_run(const cluster_t *c, run_t *r)
{
    char *a = malloc(T_BODY), *p = malloc(T_BODY), *q = malloc(T_BODY), *more = malloc(T_BODY);
    char *gen = malloc(T_BODY);

    assert_non_null(a);
    assert_non_null(p);
    assert_non_null(q);
    assert_non_null(more);
    assert_non_null(gen);
    make_ids(a, T_BODY, 600, 7, 3);
    r->text[0] = turn(c, "hist", a, r, 0);
    generate_ids(a, 8, gen, T_BODY);
    make_ids(more, T_BODY, 64, 13, 5);
    snprintf(p, T_BODY, "%s,%s,%s", a, gen, more);
    r->text[1] = turn(c, "hist", p, r, 1);
    generate_ids(p, 8, gen, T_BODY);
    make_ids(more, T_BODY, 64, 17, 11);
    snprintf(q, T_BODY, "%s,%s,%s", p, gen, more);
    r->text[2] = turn(c, "hist", q, r, 2);
    /* the rewind: A's first 300 ids, then 64 others */
    make_ids(p, T_BODY, 300, 7, 3);
    make_ids(more, T_BODY, 64, 19, 23);
    snprintf(q, T_BODY, "%s,%s", p, more);
    r->text[3] = turn(c, "hist", q, r, 3);
    r->hits = metric(c->prefill_port[0], "tandem_prefill_history_cache_hits_total");
    free(a);
    free(p);
    free(q);
    free(more);
    free(gen);
}

static void test_history_cache_pulls_only_changed_pages(void **state)
{
    static cluster_t on, off; /* static: the teardown may stop them after a failed assertion */
    run_t a, b;

    (void)state;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    assert_int_equal(cluster_start(&on, 1, 1, NULL, 0), 0);
    session_run(&on, &a);
    cluster_check_pages(&on, "history cache on");
    cluster_stop(&on);
    assert_int_equal(setenv("TANDEM_HISTORY_CACHE_MB", "0", 1), 0);
    assert_int_equal(cluster_start(&off, 1, 1, NULL, 0), 0);
    unsetenv("TANDEM_HISTORY_CACHE_MB");
    session_run(&off, &b);
    cluster_check_pages(&off, "history cache off");
    cluster_stop(&off);

    /* turn 1 starts from H = 0 on both */
    assert_true(a.needed[0] == 0 && b.needed[0] == 0);
    for (int t = 1; t < N_TURNS; t++) {
        /* same history either way; without the cache all of it is pulled */
        assert_true(a.needed[t] > 0);
        assert_true(a.needed[t] == b.needed[t]);
        assert_true(b.pulled[t] == b.needed[t]);
        assert_string_equal(a.text[t], b.text[t]);
    }
    assert_string_equal(a.text[0], b.text[0]);
    /* turns 2 and 3: >= 80 % fewer history bytes */
    assert_true(a.pulled[1] * 5 <= a.needed[1]);
    assert_true(a.pulled[2] * 5 <= a.needed[2]);
    /* the rewind: the cut pages are pulled again, the pages before the cut are not */
    assert_true(a.pulled[3] > 0 && a.pulled[3] < a.needed[3]);
    assert_true(a.hits > 0 && b.hits == 0);
    for (int t = 0; t < N_TURNS; t++) {
        free(a.text[t]);
        free(b.text[t]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_history_cache_pulls_only_changed_pages, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
