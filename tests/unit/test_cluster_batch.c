/* test_cluster_batch.c - the prefill node running several jobs at once (prefill-node/job.h:
 * steps of the started jobs in one batched engine call), end to end on a local cluster of the
 * tiny preset (tools/tandem local: router, 1 prefill node, 1 decode node), with small chunks
 * (TANDEM_CHUNK_TOKENS=32) and a small step budget (TANDEM_BATCH_TOKENS=96: three jobs' chunks
 * per step) so that every job's delta spans many steps shared with the others:
 *  - batched equals one at a time: six concurrent sessions (deltas of 40 to 600 tokens, two
 *    turns each) served with --max-jobs 8 give the texts they get with --max-jobs 1 (one job at
 *    a time: the old node), so every CompletionNotice (page checksums, first token, state record
 *    at T, all checked by the decode node) carried the same bits; the steps did carry several
 *    jobs (tandem_prefill_step_jobs_total > tandem_prefill_steps_total) and the decode node's
 *    pages are back at their baseline;
 *  - an abort in a batch: a client leaves while its job is stepping together with three others;
 *    the node stops that job alone (AbortAck, tandem_prefill_jobs_aborted_total), the three give
 *    their one-at-a-time texts, and no page is left behind (the decode node's, and every local
 *    page of the prefill node: tandem_prefill_free_pages back to --pages).
 * Old code ran one job at a time: no step ever carried two jobs.
 */
#define T_MODEL_PREFIX "cluster-batch"
#include "test_cluster_harness.h"

#define T_N_SESSIONS 6
#define T_MAX_TOKENS 6
#define T_FIND_MS    60000

static const int g_first[T_N_SESSIONS] = {40, 600, 130, 75, 300, 220}; /* first-turn prompts */
static const int g_more[T_N_SESSIONS] = {90, 50, 260, 45, 120, 33};    /* second-turn deltas */

/* Group setup: the harness's checkpoints; small chunks and steps for every process started. */
static int setup_batch_models(void **state)
{
    if (setenv("TANDEM_CHUNK_TOKENS", "32", 1) != 0 ||
        setenv("TANDEM_BATCH_TOKENS", "96", 1) != 0) {
        return -1;
    }
    return setup_models(state);
}

/* A cluster whose prefill node starts up to max_jobs jobs at once (TANDEM_MAX_JOBS). */
static void start_with_jobs(cluster_t *c, const char *max_jobs)
{
    assert_int_equal(setenv("TANDEM_MAX_JOBS", max_jobs, 1), 0);
    assert_int_equal(cluster_start(c, 1, 1, NULL, 0), 0);
    assert_int_equal(unsetenv("TANDEM_MAX_JOBS"), 0);
}

/* Session i's prompt of turn 1 (turn 2: turn 1's prompt, its 6 generated ids, g_more new). */
static void prompt_ids(int i, int turn, const char *gen, char *out, size_t out_bytes)
{
    make_ids(out, out_bytes, g_first[i], 7 + 2 * i, 3 + i);
    if (turn == 2) {
        size_t used = strlen(out);
        snprintf(out + used, out_bytes - used, ",%s,", gen);
        used = strlen(out);
        make_ids(out + used, out_bytes - used, g_more[i], 13 + i, 5 + 3 * i);
    }
}

/* Two turns of every session, the sessions' turns concurrent; texts into text[i][turn - 1]. */
static void serve_all(const cluster_t *c, char *text[T_N_SESSIONS][2])
{
    static async_completion_t req[T_N_SESSIONS];
    static char gen[T_N_SESSIONS][1024];
    static char session[T_N_SESSIONS][32];
    char *ids = malloc(T_BODY);

    assert_non_null(ids);
    for (int i = 0; i < T_N_SESSIONS; i++) {
        snprintf(session[i], sizeof(session[i]), "batch-%d", i);
        prompt_ids(i, 1, NULL, ids, T_BODY);
        generate_ids(ids, T_MAX_TOKENS, gen[i], sizeof(gen[i])); /* turn 2 extends the history */
    }
    for (int turn = 1; turn <= 2; turn++) {
        for (int i = 0; i < T_N_SESSIONS; i++) {
            prompt_ids(i, turn, gen[i], ids, T_BODY);
            complete_start(&req[i], c->http_port, session[i], ids, T_MAX_TOKENS);
        }
        for (int i = 0; i < T_N_SESSIONS; i++) {
            text[i][turn - 1] = complete_join(&req[i]);
        }
    }
    free(ids);
}

static void test_batched_jobs_equal_one_at_a_time(void **state)
{
    static cluster_t c; /* static: the teardown may stop it after a failed assertion */
    char *one[T_N_SESSIONS][2], *many[T_N_SESSIONS][2];
    double steps, step_jobs, steps1, step_jobs1, prefilled, prefilled1;

    (void)state;
    start_with_jobs(&c, "1");
    serve_all(&c, one);
    steps1 = metric(c.prefill_port[0], "tandem_prefill_steps_total");
    step_jobs1 = metric(c.prefill_port[0], "tandem_prefill_step_jobs_total");
    prefilled1 = metric(c.prefill_port[0], "tandem_prefill_tokens_total");
    cluster_check_pages(&c, "one at a time");
    cluster_stop(&c);

    start_with_jobs(&c, "8");
    serve_all(&c, many);
    steps = metric(c.prefill_port[0], "tandem_prefill_steps_total");
    step_jobs = metric(c.prefill_port[0], "tandem_prefill_step_jobs_total");
    prefilled = metric(c.prefill_port[0], "tandem_prefill_tokens_total");
    print_message("one at a time: %.0f steps carried %.0f jobs (%.0f tokens); batched: %.0f steps "
                  "carried %.0f jobs (%.0f tokens)\n",
                  steps1, step_jobs1, prefilled1, steps, step_jobs, prefilled);
    assert_true(await_metric(c.prefill_port[0], "tandem_prefill_free_pages", T_PAGES, 20000) ==
                T_PAGES);
    cluster_check_pages(&c, "batched");
    cluster_stop(&c);
    assert_true(step_jobs1 == steps1); /* --max-jobs 1: one job per step */
    assert_true(step_jobs > steps);    /* some steps carried several jobs */
    assert_true(prefilled == prefilled1);
    for (int i = 0; i < T_N_SESSIONS; i++) {
        assert_string_equal(one[i][0], many[i][0]);
        assert_string_equal(one[i][1], many[i][1]);
        free(one[i][0]);
        free(one[i][1]);
        free(many[i][0]);
        free(many[i][1]);
    }
}

/* Wait until the prefill node runs at least n jobs; returns 0, or -1 after T_FIND_MS. */
static int await_running(const cluster_t *c, double n)
{
    uint64_t end = tdm_clock_now_ns() + T_FIND_MS * TDM_NS_PER_MS;

    while (tdm_clock_now_ns() < end) {
        if (metric(c->prefill_port[0], "tandem_prefill_running_jobs") >= n) {
            return 0;
        }
    }
    return -1;
}

static void test_abort_of_one_job_in_a_batch_leaves_the_others_correct(void **state)
{
    static cluster_t c;
    static async_completion_t req[3];
    static const int n_ids[3] = {300, 170, 420};
    char *ids = malloc(T_BODY), *leaving = malloc(T_BODY);
    char *want[3], *got[3];
    char session[3][32];
    double aborted, completed;
    int fd;

    (void)state;
    assert_non_null(ids);
    assert_non_null(leaving);
    /* the three survivors' texts, one job at a time */
    start_with_jobs(&c, "1");
    for (int k = 0; k < 3; k++) {
        snprintf(session[k], sizeof(session[k]), "abort-ref-%d", k);
        make_ids(ids, T_BODY, n_ids[k], 11 + k, 7 * k + 1);
        want[k] = complete(c.http_port, session[k], ids, T_MAX_TOKENS);
    }
    cluster_stop(&c);

    start_with_jobs(&c, "8");
    make_ids(ids, T_BODY, 2000, 17, 29);
    snprintf(leaving, T_BODY,
             "{\"model\":\"%s\",\"prompt\":[%s],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true}",
             T_MODEL_NAME, ids, T_MAX_TOKENS);
    fd = cluster_leaving_client(&c, "abort-leaving", leaving);
    assert_int_equal(await_running(&c, 1), 0); /* the long job runs */
    for (int k = 0; k < 3; k++) {
        snprintf(session[k], sizeof(session[k]), "abort-%d", k);
        make_ids(ids, T_BODY, n_ids[k], 11 + k, 7 * k + 1);
        complete_start(&req[k], c.http_port, session[k], ids, T_MAX_TOKENS);
    }
    assert_int_equal(await_running(&c, 2), 0); /* others step beside it */
    close(fd); /* the long job's client leaves: the router aborts its job */
    for (int k = 0; k < 3; k++) {
        got[k] = complete_join(&req[k]);
    }
    aborted = await_metric(c.prefill_port[0], "tandem_prefill_jobs_aborted_total", 1, 20000);
    completed = metric(c.prefill_port[0], "tandem_prefill_jobs_total") - aborted;
    print_message("abort in a batch: prefill jobs aborted %.0f, others %.0f; mean jobs per step "
                  "%.2f\n",
                  aborted, completed,
                  metric(c.prefill_port[0], "tandem_prefill_step_jobs_total") /
                      metric(c.prefill_port[0], "tandem_prefill_steps_total"));
    assert_true(await_metric(c.prefill_port[0], "tandem_prefill_running_jobs", 0, 20000) == 0);
    /* every job's local pages, the aborted one's too, are back in the prefill node's pool */
    assert_true(await_metric(c.prefill_port[0], "tandem_prefill_free_pages", T_PAGES, 20000) ==
                T_PAGES);
    cluster_check_pages(&c, "abort in a batch");
    cluster_stop(&c);
    assert_true(aborted == 1);
    for (int k = 0; k < 3; k++) {
        assert_string_equal(want[k], got[k]);
        free(want[k]);
        free(got[k]);
    }
    free(ids);
    free(leaving);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_batched_jobs_equal_one_at_a_time, stop_leftovers),
        cmocka_unit_test_teardown(test_abort_of_one_job_in_a_batch_leaves_the_others_correct,
                                  stop_leftovers),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, setup_batch_models, teardown_models);
}
