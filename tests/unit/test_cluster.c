/* test_cluster.c - end-to-end tests of a local cluster (tools/tandem local: tandem-router,
 * tandem-prefill, tandem-decode as separate processes on loopback) on the tiny preset:
 * disaggregated turns token-identical to colocated service, a three-turn session whose every turn
 * prefills only its new tokens (prefill node and router counters, exactly, per turn), a
 * cancelled turn giving its reserved pages back, a decode node with --spec ngram giving the same
 * greedy tokens as one without and counting its drafts on /metrics, a role's --device typo refused
 * by the launcher, a child's port lost to another process (the launcher starts again on fresh
 * ports). Every test ends with each
 * decode node's pages back at the baseline it had when the cluster came up (printed). Counters
 * are read as soon as a response ends, without waiting: a worker counts a turn or job on /metrics
 * before it sends the Finish or CompletionNotice that ends it (docs/PROTOCOL.md section 7).
 * Failures of workers are in test_cluster_faults.c; the harness is test_cluster_harness.h.
 */
#define T_MODEL_PREFIX "cluster"
#include "test_cluster_harness.h"

#include <sys/stat.h>

static void test_disaggregated_turns_match_colocated(void **state)
{
    char *d1, *d2, *c1, *c2;
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    double prefilled, local_tokens;
    uint64_t t0;

    (void)state;
    /* Disaggregated: 1 prefill + 1 decode; both deltas (100, then 61 new) exceed the threshold. */
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    t0 = tdm_clock_now_ns();
    two_turns(c.http_port, "dis-1", 100, 60, &d1, &d2);
    print_message("disaggregated two turns: %.1f ms\n",
                  (double)(tdm_clock_now_ns() - t0) / TDM_NS_PER_MS);
    prefilled = metric(c.prefill_port[0], "tandem_prefill_tokens_total");
    local_tokens = metric(c.decode_port[0], "tandem_decode_local_prefill_tokens_total");
    assert_true(metric(c.prefill_port[0], "tandem_prefill_pulled_pages_total") > 0);
    assert_true(metric(c.decode_port[0], "tandem_decode_handoffs_total") == 2);
    cluster_check_pages(&c, "disaggregated two turns");
    cluster_stop(&c);
    /* The second turn prefilled only its new tokens: 100 + (8 generated - 1 cached + 60). */
    assert_true(prefilled == 100 + 61);
    assert_true(local_tokens == 0);
    /* Colocated: no prefill node; the decode node prefills both deltas (canonical start). */
    assert_int_equal(cluster_start(&c, 0, 1, NULL, 0), 0);
    two_turns(c.http_port, "col-1", 100, 60, &c1, &c2);
    assert_true(metric(c.decode_port[0], "tandem_decode_local_prefill_tokens_total") == 100 + 61);
    /* The router counts the local prefills too (from their first tokens), and the reuse. */
    assert_true(metric(c.http_port, "tandem_prefill_tokens_computed_total") == 100 + 61);
    assert_true(metric(c.http_port, "tandem_prefill_tokens_reused_total") == 0 + 107);
    assert_true(metric(c.http_port, "tandem_kv_bytes_moved_total") == 0);
    cluster_check_pages(&c, "colocated two turns");
    cluster_stop(&c);
    expect_same_turns(d1, d2, c1, c2);
}

/* The router's prompt counters (tandem-bench reads them: bench/replay/metrics.h). */
typedef struct {
    double prefill_node; /* tandem_prefill_tokens_total of prefill node 0 */
    double local;        /* tandem_decode_local_prefill_tokens_total of decode node 0 */
    double computed;     /* router: tandem_prefill_tokens_computed_total */
    double reused;       /* router: tandem_prefill_tokens_reused_total */
    double kv_bytes;     /* router: tandem_kv_bytes_moved_total */
    double put_bytes;    /* prefill node 0: tandem_xfer_bytes_total{op="put"} */
} prompt_counters_t;

static void read_prompt_counters(const cluster_t *c, prompt_counters_t *out)
{
    out->prefill_node = metric(c->prefill_port[0], "tandem_prefill_tokens_total");
    out->local = metric(c->decode_port[0], "tandem_decode_local_prefill_tokens_total");
    out->computed = metric(c->http_port, "tandem_prefill_tokens_computed_total");
    out->reused = metric(c->http_port, "tandem_prefill_tokens_reused_total");
    out->kv_bytes = metric(c->http_port, "tandem_kv_bytes_moved_total");
    out->put_bytes = metric(c->prefill_port[0], "tandem_xfer_bytes_total{op=\"put\"}");
}

/* Three turns of one session, each prompt = the previous prompt + its 8 greedy tokens (from
 * tandem-generate) + new ids. The decode node keeps the KV of every position but the last
 * sampled token, so turn t prefills exactly n_new[t] + 1 tokens (turn 0: its prompt) and reuses
 * the rest. If the cluster's greedy ids differed from tandem-generate's, the router would find the
 * session's history diverging inside the generated tokens and prefill more: the exact counts
 * also check token identity with tandem-generate --schedule ced. */
static void test_three_turn_session_prefills_only_new_tokens(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    static const int n_new[3] = {100, 60, 50};
    const int n_gen = 8;
    char *ids = malloc(T_BODY), *next = malloc(T_BODY), gen[4096], more[4096];
    int n_prompt = 0, n_cached = 0;
    prompt_counters_t before, after;
    char *text;

    (void)state;
    assert_non_null(ids);
    assert_non_null(next);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    ids[0] = '\0';
    for (int t = 0; t < 3; t++) {
        double computed, reused, kv, put;
        make_ids(more, sizeof(more), n_new[t], 13 + 4 * t, 5 + t);
        if (t == 0) {
            snprintf(next, T_BODY, "%s", more);
            n_cached = 0;
        } else {
            generate_ids(ids, n_gen, gen, sizeof(gen));
            snprintf(next, T_BODY, "%s,%s,%s", ids, gen, more);
            n_cached = n_prompt + n_gen - 1;
        }
        n_prompt = (t == 0 ? 0 : n_prompt + n_gen) + n_new[t];
        snprintf(ids, T_BODY, "%s", next);
        read_prompt_counters(&c, &before);
        text = complete(c.http_port, "three-1", ids, n_gen);
        free(text);
        read_prompt_counters(&c, &after);
        computed = after.computed - before.computed;
        reused = after.reused - before.reused;
        kv = after.kv_bytes - before.kv_bytes;
        put = after.put_bytes - before.put_bytes;
        print_message("turn %d: prompt %d tokens, %d cached: prefill node computed %.0f, router "
                      "computed %.0f reused %.0f, KV bytes moved %.0f (prefill node put %.0f)\n",
                      t + 1, n_prompt, n_cached, after.prefill_node - before.prefill_node, computed,
                      reused, kv, put);
        assert_true(after.prefill_node - before.prefill_node == n_prompt - n_cached);
        assert_true(after.local - before.local == 0);
        assert_true(computed == n_prompt - n_cached);
        assert_true(reused == n_cached);
        assert_true(kv > 0);
        assert_true(kv == put);
    }
    cluster_check_pages(&c, "three-turn session");
    cluster_stop(&c);
    free(ids);
    free(next);
}

/* The cluster's greedy continuation equals tandem-generate --schedule ced's: a second turn
 * whose prompt is the first prompt + tandem-generate's ids + 40 ids reuses every cached
 * position (the router confirms a session's history on tokens, so one differing id would cut
 * the reuse there), and two sessions with the same prompt give the same text. */
static void test_first_turn_matches_generate_ced(void **state)
{
    char ids[4096], gen[4096], more[4096], ids2[12288], want[4096];
    char *text;
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    double reused0;

    (void)state;
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    make_ids(ids, sizeof(ids), 80, 11, 9);
    generate_ids(ids, 6, gen, sizeof(gen));
    text = complete(c.http_port, "ced-1", ids, 6);
    snprintf(want, sizeof(want), "%s", text);
    free(text);
    text = complete(c.http_port, "ced-2", ids, 6);
    assert_string_equal(text, want);
    free(text);
    make_ids(more, sizeof(more), 40, 19, 2);
    snprintf(ids2, sizeof(ids2), "%s,%s,%s", ids, gen, more);
    reused0 = metric(c.http_port, "tandem_prefill_tokens_reused_total");
    text = complete(c.http_port, "ced-1", ids2, 2);
    free(text);
    assert_true(metric(c.http_port, "tandem_prefill_tokens_reused_total") - reused0 == 80 + 6 - 1);
    cluster_check_pages(&c, "first turn vs tandem-generate");
    cluster_stop(&c);
}

static void test_cancelled_turn_returns_reserved_pages(void **state)
{
    char ids[16384], *resp = malloc(T_BODY);
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */

    (void)state;
    assert_non_null(resp);
    assert_int_equal(cluster_start(&c, 1, 1, NULL, 0), 0);
    assert_true(metric(c.decode_port[0], "tandem_decode_session_pages") == 0);
    make_ids(ids, sizeof(ids), 600, 17, 1);
    /* The client leaves during the prefill: curl gives up after 150 ms. Reserved pages come
     * back after the fence; a session that got its handoff before the client left stays
     * resident (cluster_check_pages). */
    leave_streamed_completion(c.http_port, "cancel-1", ids, 150, resp);
    cluster_check_pages(&c, "cancelled turn");
    cluster_stop(&c);
    free(resp);
}

/* Two greedy turns, texts into t1/t2 (caller frees): the first prompt is P, its greedy
 * continuation G, then P again (the model continues the second P as it did the first, so the
 * n-gram drafter has drafts to offer once the prompt is in its history); the second has 20 ids
 * (below the threshold: prefilled on the decode node). */
static void spec_turns(const cluster_t *c, char **t1, char **t2)
{
    char p[2048], g[2048], ids[6144];

    make_ids(p, sizeof(p), 100, 100, 7);
    generate_ids(p, 24, g, sizeof(g));
    snprintf(ids, sizeof(ids), "%s,%s,%s", p, g, p);
    *t1 = complete(c->http_port, "spec-1", ids, 24);
    make_ids(ids, sizeof(ids), 20, 17, 1);
    *t2 = complete(c->http_port, "spec-2", ids, 24);
}

static void test_spec_ngram_decode_node_matches_spec_off(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *off1, *off2, *ng1, *ng2;
    char *col1, *col2;
    double steps, drafted, verified, accepted, emitted;

    (void)state;
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, "off"), 0);
    spec_turns(&c, &off1, &off2);
    assert_true(metric(c.decode_port[0], "tandem_spec_steps_total{drafter=\"ngram\"}") == 0);
    cluster_check_pages(&c, "spec off");
    cluster_stop(&c);
    assert_int_equal(cluster_start_spec(&c, 1, 1, NULL, 0, "ngram"), 0);
    spec_turns(&c, &ng1, &ng2);
    steps = metric(c.decode_port[0], "tandem_spec_steps_total{drafter=\"ngram\"}");
    drafted = metric(c.decode_port[0], "tandem_spec_drafted_tokens_total{drafter=\"ngram\"}");
    verified = metric(c.decode_port[0], "tandem_spec_verified_tokens_total{drafter=\"ngram\"}");
    accepted = metric(c.decode_port[0], "tandem_spec_accepted_tokens_total{drafter=\"ngram\"}");
    emitted = metric(c.decode_port[0], "tandem_spec_emitted_tokens_total{drafter=\"ngram\"}");
    print_message("ngram: steps=%.0f drafted=%.0f verified=%.0f accepted=%.0f emitted=%.0f "
                  "rate=%.3f mean_len=%.3f\n",
                  steps, drafted, verified, accepted, emitted,
                  metric(c.decode_port[0], "tandem_spec_acceptance_rate{drafter=\"ngram\"}"),
                  metric(c.decode_port[0], "tandem_spec_mean_accepted_length{drafter=\"ngram\"}"));
    cluster_check_pages(&c, "spec ngram disaggregated");
    cluster_stop(&c);
    /* Disaggregated: the first turn's prompt came from the prefill node, so the drafter saw only
     * the ids the sequence keeps. Both turns decode 23 tokens after the first (sampled by the
     * prefill): every one came out of a speculative step, and the counters are consistent. */
    assert_true(emitted == 2 * 23);
    assert_true(steps > 0 && steps <= emitted);
    assert_true(verified <= drafted && accepted <= verified);
    assert_true(emitted == steps + accepted);
    assert_string_equal(ng1, off1);
    assert_string_equal(ng2, off2);
    /* Colocated: the decode node prefills the whole prompt, the drafter looks it up and drafts. */
    assert_int_equal(cluster_start_spec(&c, 0, 1, NULL, 0, "ngram"), 0);
    spec_turns(&c, &col1, &col2);
    drafted = metric(c.decode_port[0], "tandem_spec_drafted_tokens_total{drafter=\"ngram\"}");
    verified = metric(c.decode_port[0], "tandem_spec_verified_tokens_total{drafter=\"ngram\"}");
    accepted = metric(c.decode_port[0], "tandem_spec_accepted_tokens_total{drafter=\"ngram\"}");
    print_message("ngram colocated: drafted=%.0f verified=%.0f accepted=%.0f\n", drafted, verified,
                  accepted);
    cluster_check_pages(&c, "spec ngram colocated");
    cluster_stop(&c);
    assert_true(drafted > 0 && accepted > 0);
    assert_true(verified <= drafted && accepted <= verified);
    assert_string_equal(col1, off1);
    assert_string_equal(col2, off2);
    free(col1);
    free(col2);
    free(off1);
    free(off2);
    free(ng1);
    free(ng2);
}

/* A role's --device that does not parse stops the launcher at once with exit 2 naming the flag,
 * before anything starts (tandem local --prefill-device / --decode-device). */
static void test_bad_role_device_is_refused_up_front(void **state)
{
    char cmd[3 * T_PATH];
    int rc;

    (void)state;
    snprintf(cmd, sizeof(cmd),
             "%s/tandem local --model %s --decode-device gpu 2>&1 | grep -q -- '--decode-device'",
             g_bin, g_model);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "%s/tandem local --model %s --prefill-device cuda:x >/dev/null 2>&1",
             g_bin, g_model);
    rc = system(cmd);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 2);
}

/* A child that loses the port the launcher picked for it (another process binds it between the
 * pick and the child's bind: "address already in use") makes the launcher start the cluster
 * again on fresh ports, and only the last attempt's processes are named on stdout (no "exited:"
 * line for the given-up attempt's). Forced here: the
 * launcher runs from a directory whose tandem-router, the first time, lets a listener (python3,
 * no HTTP) take its --http port and exits 1 as a router does when its bind fails. */
static void test_lost_port_starts_again_on_fresh_ports(void **state)
{
    char dir[T_PATH], path[T_PATH + 32], cmd[8 * T_PATH], real_bin[T_PATH];
    const char *tmp = getenv("TANDEM_TEST_TMP");
    unsigned stolen = 0;
    int holder = 0;
    cluster_t c;
    FILE *f;

    (void)state;
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        printf("skip: python3 (the port holder of this test) is not installed\n");
        skip();
    }
    /* one directory per process: ctest runs this binary under several environments at once */
    snprintf(dir, sizeof(dir), "%s/cluster-lost-port-%d", tmp != NULL ? tmp : "/tmp",
             (int)getpid());
    snprintf(real_bin, sizeof(real_bin), "%s", g_bin);
    snprintf(cmd, sizeof(cmd),
             "rm -rf %s && mkdir -p %s && cp %s/tandem %s/tandem && "
             "ln -s %s/tandem-decode %s/tandem-prefill %s/",
             dir, dir, real_bin, dir, real_bin, real_bin, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof(path), "%s/tandem-router", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(
        f,
        "#!/bin/sh\n"
        "if [ ! -e %s/stolen ]; then\n"
        "  for a; do [ \"$prev\" = --http ] && port=\"${a##*:}\"; prev=\"$a\"; done\n"
        "  python3 -c 'import os, socket, sys, time\n"
        "s = socket.socket(); s.bind((\"127.0.0.1\", int(sys.argv[1]))); s.listen()\n"
        "open(sys.argv[2] + \".tmp\", \"w\").write(\"%%d %%s\" %% (os.getpid(), sys.argv[1]))\n"
        "os.rename(sys.argv[2] + \".tmp\", sys.argv[2]); time.sleep(120)' \"$port\" %s/stolen &\n"
        "  n=0; while [ ! -e %s/stolen ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n + 1)); done\n"
        "  echo 'tandem-router (test): cannot listen: address already in use' >&2\n"
        "  exit 1\n"
        "fi\n"
        "exec %s/tandem-router \"$@\"\n",
        dir, dir, dir, real_bin);
    fclose(f);
    assert_int_equal(chmod(path, 0755), 0);

    snprintf(g_bin, sizeof(g_bin), "%s", dir);
    int rc = cluster_start(&c, 1, 1, NULL, 0);
    snprintf(g_bin, sizeof(g_bin), "%s", real_bin);
    snprintf(path, sizeof(path), "%s/stolen", dir);
    f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%d %u", &holder, &stolen) != 2) {
            holder = 0;
        }
        fclose(f);
    }
    if (holder > 0) {
        kill(holder, SIGKILL); /* the listener this test made (by PID) */
    }
    assert_int_equal(rc, 0);
    assert_true(holder > 0 && stolen > 0);
    /* one router announced (the second attempt's), not on the port it lost */
    assert_int_equal(c.n_routers, 1);
    assert_true(c.router_port[0] != stolen && c.http_port != stolen);
    assert_int_equal(c.n_decode, 1);
    assert_int_equal(c.n_prefill, 1);
    /* the given-up attempt's processes (its router exited 1) are not named on stdout */
    assert_int_equal(c.stray_exits, 0);
    char *text = complete(c.http_port, "lost-port-1", "1,2,3,4,5", 4);
    assert_non_null(text);
    free(text);
    cluster_stop(&c);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_first_turn_matches_generate_ced, stop_leftovers),
        cmocka_unit_test_teardown(test_disaggregated_turns_match_colocated, stop_leftovers),
        cmocka_unit_test_teardown(test_three_turn_session_prefills_only_new_tokens, stop_leftovers),
        cmocka_unit_test_teardown(test_cancelled_turn_returns_reserved_pages, stop_leftovers),
        cmocka_unit_test_teardown(test_spec_ngram_decode_node_matches_spec_off, stop_leftovers),
        cmocka_unit_test(test_bad_role_device_is_refused_up_front),
        cmocka_unit_test_teardown(test_lost_port_starts_again_on_fresh_ports, stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_models, teardown_models);
}
