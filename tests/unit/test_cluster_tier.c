/* test_cluster_tier.c - tool-pause tiering through a real cluster (tandem local, tiny preset,
 * remote prefill): a decode pool too small for two sessions, the host tier off and a
 * spill directory on (TANDEM_HOST_TIER_MB=0, TANDEM_SPILL_DIR). Session a's first turn, then
 * session b's (a goes to disk), then a's second turn: a ReservePages promotes a from its spill
 * file, the prefill node pulls a's history pages from the decode node, and the turn reuses a's
 * whole history (no STATE_LOST, no router retry) with the texts of a cluster with a roomy pool.
 * Pages back at baseline; the spill directory empty once the cluster stopped.
 */
#define T_MODEL_PREFIX "cluster-tier"
#include "test_cluster_harness.h"

#include <dirent.h>

#define N_FIRST 600/* turn 1 prompt ids (>= T_THRESHOLD: remote prefill) */
#define N_MORE  32 /* turn 2: the 8 generated ids and these (a remote delta too) */
#define N_B     840 /* session b's prompt: longer than a's (see the pool below) */

/* The ids of turn 1 (n_first) and turn 2 of a session whose ids are made with (mul, add). */
static void turn_ids(int n_first, int mul, int add, char *ids1, char *ids2)
{
    char gen[4096], more[4096];

    make_ids(ids1, T_BODY, n_first, mul, add);
    generate_ids(ids1, 8, gen, sizeof(gen));
    make_ids(more, sizeof(more), N_MORE, 13, 5);
    snprintf(ids2, T_BODY, "%s,%s,%s", ids1, gen, more);
}

static int n_spill_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        n += strstr(e->d_name, ".tdspill") != NULL;
    }
    closedir(d);
    return n;
}

static void test_paused_session_comes_back_from_disk(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *a1 = malloc(T_BODY), *a2 = malloc(T_BODY), *b1 = malloc(T_BODY), *b2 = malloc(T_BODY);
    char *ref1, *ref2, *t1, *t2, *tb;
    char dir[T_PATH];
    const char *tmp = getenv("TANDEM_TEST_TMP");
    double one_session, reused0, reused1, retries0, lost0, remote0;
    int pages;

    (void)state;
    assert_non_null(a1);
    assert_non_null(a2);
    assert_non_null(b1);
    assert_non_null(b2); /* unused: b has one turn */
    turn_ids(N_FIRST, 7, 3, a1, a2);
    make_ids(b1, T_BODY, N_B, 11, 501);

    /* the reference: a roomy pool; how many pages a's first turn keeps */
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    ref1 = complete(c.http_port, "ref-a", a1, 8);
    one_session = metric(c.decode_port[0], "tandem_decode_session_pages");
    ref2 = complete(c.http_port, "ref-a", a2, 8);
    cluster_stop(&c);
    print_message("one session of %d + 7 tokens: %.0f pages\n", N_FIRST, one_session);
    assert_true(one_session >= 4);

    /* the pool: 2 x a's pages + 2. The prefill node gets the same --pages and must hold a's
     * second turn (a's history pages and its new ones, about that many), or the router prefills
     * it on the decode node (another path: this test checks the remote one; test_cluster_fallback
     * shows both give the same text). b (N_B tokens) is larger than the room a leaves, so b's
     * turn sends a down and a's second turn sends b down. Disk tier only. */
    pages = 2 * (int)one_session + 2;
    g_pages = pages < 16 ? 16 : pages;
    snprintf(dir, sizeof(dir), "%s/cluster-tier-spill-%d", tmp != NULL ? tmp : "/tmp",
             (int)getpid());
    assert_int_equal(setenv("TANDEM_HOST_TIER_MB", "0", 1), 0);
    assert_int_equal(setenv("TANDEM_SPILL_DIR", dir, 1), 0);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    unsetenv("TANDEM_HOST_TIER_MB");
    unsetenv("TANDEM_SPILL_DIR");

    t1 = complete(c.http_port, "a", a1, 8);
    tb = complete(c.http_port, "b", b1, 8); /* needs a's pages: a goes to disk */
    assert_true(metric(c.decode_port[0], "tandem_decode_tier_demotions_total{tier=\"disk\"}") >= 1);
    assert_true(metric(c.decode_port[0], "tandem_decode_tier_sessions{tier=\"disk\"}") >= 1);
    assert_true(n_spill_files(dir) >= 1);
    reused0 = metric(c.http_port, "tandem_prefill_tokens_reused_total");
    remote0 = metric(c.prefill_port[0], "tandem_prefill_tokens_total");
    retries0 = metric(c.http_port, "tandem_router_retries_total");
    lost0 = metric(c.decode_port[0], "tandem_decode_state_lost_total");

    t2 = complete(c.http_port, "a", a2, 8); /* promoted from disk by its ReservePages */
    reused1 = metric(c.http_port, "tandem_prefill_tokens_reused_total");
    print_message("pool %d pages (one session %.0f); a's second turn reused %.0f tokens; "
                  "disk promotions %.0f, restore %.3f ms\n",
                  pages, one_session, reused1 - reused0,
                  metric(c.decode_port[0], "tandem_decode_tier_promotions_total{tier=\"disk\"}"),
                  1000 *
                      metric(c.decode_port[0],
                             "tandem_decode_tier_restore_seconds_sum{tier=\"disk\"}"));
    assert_true(metric(c.decode_port[0], "tandem_decode_tier_promotions_total{tier=\"disk\"}") ==
                1);
    assert_true(metric(c.decode_port[0], "tandem_decode_tier_misses_total{tier=\"disk\"}") == 0);
    assert_true(metric(c.decode_port[0], "tandem_decode_state_lost_total") == lost0);
    assert_true(metric(c.http_port, "tandem_router_retries_total") == retries0);
    assert_true(reused1 - reused0 == N_FIRST + 8 - 1); /* a's whole history */
    /* computed on the prefill node: the ReservePages path promoted a */
    assert_true(metric(c.prefill_port[0], "tandem_prefill_tokens_total") - remote0 ==
                8 + N_MORE - 7);
    assert_string_equal(t1, ref1);
    assert_string_equal(t2, ref2);
    cluster_check_pages(&c, "tier");
    cluster_stop(&c);
    g_pages = T_PAGES;
    assert_int_equal(n_spill_files(dir), 0); /* the node removed its files when it stopped */
    rmdir(dir);
    free(ref1);
    free(ref2);
    free(t1);
    free(t2);
    free(tb);
    free(a1);
    free(a2);
    free(b1);
    free(b2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_paused_session_comes_back_from_disk, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
