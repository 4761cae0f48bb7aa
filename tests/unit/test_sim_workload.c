/* test_sim_workload.c - sim/workload.h: the bundled Mooncake slice becomes its 53 sessions and
 * 298 turns with shared prefixes that never exceed the prompt or the previous prompt + reply and
 * pauses capped; the bundled SWE-agent session's turns share the whole previous history; the
 * synthetic workload is deterministic for a seed; append keeps session offsets right. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sim/workload.h"

static void trace_path(const char *name, char *buf, size_t n)
{
    const char *root = getenv("TANDEM_SOURCE_DIR");

    snprintf(buf, n, "%s/bench/traces/%s", root != NULL ? root : ".", name);
}

/* Invariants every workload keeps. */
static void check_invariants(const sim_workload_t *wl, uint32_t max_pause_ms)
{
    size_t turns = 0;

    for (size_t s = 0; s < wl->n_sessions; s++) {
        const sim_session_t *ss = &wl->sessions[s];

        assert_true(ss->n_turns >= 1);
        assert_int_equal(ss->first_turn, turns);
        for (uint32_t k = 0; k < ss->n_turns; k++) {
            const sim_turn_t *t = &wl->turns[ss->first_turn + k];

            assert_true(t->input_tokens >= 1);
            assert_true(t->output_tokens >= 1);
            assert_true(t->shared_tokens <= t->input_tokens);
            if (k == 0) {
                assert_int_equal(t->shared_tokens, 0);
                assert_int_equal(t->pause_ms, 0);
            } else {
                assert_true(t->shared_tokens <= (uint64_t)t[-1].input_tokens + t[-1].output_tokens);
                assert_true(t->pause_ms <= max_pause_ms);
            }
        }
        turns += ss->n_turns;
    }
    assert_int_equal(turns, wl->n_turns);
}

static void test_mooncake_slice(void **state)
{
    char path[1024], err[256] = "";
    sim_workload_opts_t opts;
    sim_workload_t *wl = NULL;
    uint64_t in = 0, shared = 0, out = 0;

    (void)state;
    sim_workload_opts_default(&opts);
    trace_path("mooncake-conversation-slice.jsonl", path, sizeof(path));
    assert_int_equal(sim_workload_load(path, &opts, &wl, err, sizeof(err)), TDM_OK);
    assert_int_equal(wl->n_sessions, 53);
    assert_int_equal(wl->n_turns, 298);
    check_invariants(wl, opts.max_pause_ms);
    sim_workload_totals(wl, &in, &shared, &out);
    /* later turns of a chat repeat most of the earlier prompt */
    assert_true(shared > in / 2);
    assert_true(out > 298);
    /* the first line of the file: 2,290 prompt tokens, 316 reply tokens */
    assert_int_equal(wl->turns[0].input_tokens, 2290);
    assert_int_equal(wl->turns[0].output_tokens, 316);
    assert_non_null(strstr(wl->source, "mooncake"));
    sim_workload_destroy(wl);
}

static void test_swe_agent_session(void **state)
{
    char path[1024], err[256] = "";
    sim_workload_opts_t opts;
    sim_workload_t *wl = NULL;

    (void)state;
    sim_workload_opts_default(&opts);
    trace_path("swe-agent__test-repo-i1.traj", path, sizeof(path));
    assert_int_equal(sim_workload_load(path, &opts, &wl, err, sizeof(err)), TDM_OK);
    assert_int_equal(wl->n_sessions, 1);
    assert_int_equal(wl->n_turns, 5);
    check_invariants(wl, opts.tool_pause_ms * 2);
    for (size_t k = 1; k < wl->n_turns; k++) {
        const sim_turn_t *t = &wl->turns[k];
        uint64_t prev = (uint64_t)t[-1].input_tokens + t[-1].output_tokens;

        assert_int_equal(t->shared_tokens, prev < t->input_tokens ? prev : t->input_tokens);
        assert_true(t->pause_ms > 0);
    }
    sim_workload_destroy(wl);
}

static void test_missing_trace(void **state)
{
    char err[256] = "";
    sim_workload_opts_t opts;
    sim_workload_t *wl = NULL;

    (void)state;
    sim_workload_opts_default(&opts);
    assert_int_equal(sim_workload_load("/nonexistent/trace.jsonl", &opts, &wl, err, sizeof(err)),
                     TDM_ERR_NOT_FOUND);
    assert_null(wl);
}

static void test_synthetic_deterministic_and_append(void **state)
{
    sim_workload_opts_t opts;
    sim_workload_t *a = NULL, *b = NULL, *c = NULL, *none = NULL;
    size_t n_a;

    (void)state;
    sim_workload_opts_default(&opts);
    assert_int_equal(sim_workload_synthetic(7, 20, &opts, &a), TDM_OK);
    assert_int_equal(sim_workload_synthetic(7, 20, &opts, &b), TDM_OK);
    assert_int_equal(sim_workload_synthetic(8, 20, &opts, &c), TDM_OK);
    assert_int_equal(a->n_turns, b->n_turns);
    assert_memory_equal(a->turns, b->turns, a->n_turns * sizeof(*a->turns));
    assert_true(a->n_turns != c->n_turns ||
                memcmp(a->turns, c->turns, a->n_turns * sizeof(*a->turns)) != 0);
    check_invariants(a, opts.tool_pause_ms * 2);
    assert_int_equal(sim_workload_synthetic(7, 0, &opts, &none), TDM_ERR_INVALID_ARG);
    assert_null(none);
    n_a = a->n_turns;
    assert_int_equal(sim_workload_append(a, c), TDM_OK);
    assert_int_equal(a->n_sessions, 40);
    assert_int_equal(a->sessions[20].first_turn, n_a);
    check_invariants(a, opts.tool_pause_ms * 2);
    sim_workload_destroy(a);
    sim_workload_destroy(b);
    sim_workload_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mooncake_slice),
        cmocka_unit_test(test_swe_agent_session),
        cmocka_unit_test(test_missing_trace),
        cmocka_unit_test(test_synthetic_deterministic_and_append),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
