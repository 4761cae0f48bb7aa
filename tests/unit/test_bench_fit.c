/* test_bench_fit.c - tandem-bench context fit: reading context refusals, the --scale to suggest,
 * the one hint per run, the learned ratio of server tokens to estimated tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bench/replay/fit.h"

static void test_context_refusals_are_read(void **state)
{
    int64_t prompt = 0;
    int64_t max = 0;
    (void)state;

    /* Tandem's router, the three ways it refuses (router/validate.c, router/dispatch.c) */
    assert_int_equal(bench_fit_parse_error("HTTP 400: {\"error\":{\"message\":\"the prompt has "
                                           "17735 tokens; this model's maximum context is 8192 "
                                           "tokens\",\"code\":\"context_length_exceeded\"}}",
                                           &prompt, &max),
                     1);
    assert_int_equal(prompt, 17735);
    assert_int_equal(max, 8192);
    assert_int_equal(bench_fit_parse_error("the prompt (7000 tokens) plus max_tokens (2000) "
                                           "exceeds this model's maximum context of 8192 tokens",
                                           &prompt, &max),
                     1);
    assert_int_equal(prompt, 7000);
    assert_int_equal(max, 8192);
    assert_int_equal(bench_fit_parse_error("{\"message\":\"the conversation is 9000 tokens; the "
                                           "largest decode worker holds 4096 (its declared "
                                           "Capacity.max_tokens)\",\"code\":"
                                           "\"context_length_exceeded\"}",
                                           &prompt, &max),
                     1);
    assert_int_equal(prompt, 9000);
    assert_int_equal(max, 4096);
    assert_int_equal(bench_fit_parse_error("{\"message\":\"the decode worker cannot hold 9001 "
                                           "tokens: no pages\",\"code\":"
                                           "\"context_length_exceeded\"}",
                                           &prompt, &max),
                     1);
    assert_int_equal(prompt, 9001);
    assert_int_equal(max, -1);
    /* vLLM */
    assert_int_equal(bench_fit_parse_error("This model's maximum context length is 4096 tokens. "
                                           "However, you requested 5000 tokens (4800 in the "
                                           "messages, 200 in the completion).",
                                           &prompt, &max),
                     1);
    assert_int_equal(prompt, 4800);
    assert_int_equal(max, 4096);
    /* not a context refusal */
    assert_int_equal(bench_fit_parse_error("HTTP 500: {\"error\":{\"message\":\"injected "
                                           "failure\"}}",
                                           &prompt, &max),
                     0);
    assert_int_equal(prompt, -1);
    assert_int_equal(max, -1);
    assert_int_equal(bench_fit_parse_error(NULL, &prompt, &max), 0);
}

static void test_suggested_scale_fits_with_margin(void **state)
{
    (void)state;

    /* 0.9 * 8192 / 17735 = 0.4157: 0.4 */
    assert_true(bench_fit_suggest_scale(1.0, 17735.0, 8192) == 0.4);
    /* from a run already at 0.5 that needed 8,900 */
    assert_true(bench_fit_suggest_scale(0.5, 8900.0, 8192) == 0.4);
    /* below 0.1: two significant digits, rounded down */
    {
        double s = bench_fit_suggest_scale(1.0, 121924.0, 8192); /* 0.06047 */
        assert_true(s > 0.05999 && s < 0.06001);
    }
    assert_true(bench_fit_suggest_scale(1.0, 100.0, 8192) == 1.0); /* capped at 1 */
    assert_true(bench_fit_suggest_scale(1.0, 1e12, 8192) == -1.0); /* below --scale's floor */
    assert_true(bench_fit_suggest_scale(1.0, 100.0, 0) == -1.0);
    assert_true(bench_fit_suggest_scale(1.0, 0.0, 8192) == -1.0);
}

static void test_hint_names_turn_tokens_limit_and_flags(void **state)
{
    bench_fit_case_t c;
    char hint[BENCH_FIT_HINT_BYTES];
    (void)state;

    memset(&c, 0, sizeof(c));
    c.session_id = "swe-agent__test-repo-i1.traj";
    c.turn_index = 0;
    c.needed_tokens = 17735;
    c.max_context = 8192;
    c.scale = 1.0;
    c.longest_factor = 1.0;
    bench_fit_hint_format(&c, hint, sizeof(hint));
    assert_non_null(strstr(hint, "turn 1 of session swe-agent__test-repo-i1.traj needs 17,735 "
                                 "tokens"));
    assert_non_null(strstr(hint, "the server takes 8,192"));
    assert_non_null(strstr(hint, "use --scale 0.4 or a larger preset"));

    /* the longest turn decides the scale */
    c.longest_factor = 1.2; /* 21,282 tokens: 0.9 * 8192 / 21282 = 0.346 */
    bench_fit_hint_format(&c, hint, sizeof(hint));
    assert_non_null(strstr(hint, "longest turn needs about 21,282"));
    assert_non_null(strstr(hint, "use --scale 0.3 or"));

    /* no scale fits */
    c.longest_factor = 1.0;
    c.needed_tokens = 1000000000000LL;
    bench_fit_hint_format(&c, hint, sizeof(hint));
    assert_non_null(strstr(hint, "use a larger preset (no --scale fits)"));
    /* the limit unknown (a refusal that does not name it) */
    c.needed_tokens = 17735;
    c.max_context = 0;
    bench_fit_hint_format(&c, hint, sizeof(hint));
    assert_non_null(strstr(hint, "the server refused it as too long"));
    assert_non_null(strstr(hint, "use a smaller --scale or a larger preset"));
}

/* The function that decides the hint: the first case is the run's hint, later ones change
 * nothing (said once, whatever the number of refusals or agents). */
static void test_hint_is_given_once(void **state)
{
    bench_fit_t *fit = NULL;
    bench_fit_case_t first;
    bench_fit_case_t later;
    char hint[BENCH_FIT_HINT_BYTES];
    (void)state;

    assert_int_equal(bench_fit_create(0, 1, &fit), TDM_OK);
    bench_fit_hint_copy(fit, hint, sizeof(hint));
    assert_string_equal(hint, "");
    memset(&first, 0, sizeof(first));
    first.session_id = "a";
    first.needed_tokens = 17735;
    first.max_context = 8192;
    first.scale = 1.0;
    first.longest_factor = 1.0;
    later = first;
    later.session_id = "b";
    later.turn_index = 3;
    assert_int_equal(bench_fit_offer(fit, &first), 1);
    assert_int_equal(bench_fit_offer(fit, &later), 0);
    assert_int_equal(bench_fit_offer(fit, &first), 0);
    bench_fit_hint_copy(fit, hint, sizeof(hint));
    assert_non_null(strstr(hint, "turn 1 of session a needs 17,735 tokens"));
    bench_fit_destroy(fit);
    bench_fit_destroy(NULL);
}

static void test_server_counts_calibrate_estimates(void **state)
{
    bench_fit_t *exact = NULL;
    bench_fit_t *chat = NULL;
    (void)state;

    assert_int_equal(bench_fit_create(1, 0, &exact), TDM_ERR_INVALID_ARG);
    assert_int_equal(bench_fit_create(1, 2, &exact), TDM_OK);
    assert_int_equal(bench_fit_tokens(exact, 0, 5000), 5000);
    bench_fit_learn(exact, 0, 5000, 9000); /* token ids are exact: nothing to learn */
    assert_int_equal(bench_fit_tokens(exact, 0, 5000), 5000);

    assert_int_equal(bench_fit_create(0, 2, &chat), TDM_OK);
    assert_int_equal(bench_fit_tokens(chat, 0, 5000), -1); /* unknown until the server counts */
    bench_fit_learn(chat, 0, 9893, 17735);
    assert_int_equal(bench_fit_tokens(chat, 0, 9893), 17735);
    assert_int_equal(bench_fit_tokens(chat, 0, 1000), 1793); /* ceil(1000 * 1.7927) */
    /* per trace session: another session's text may tokenize otherwise */
    assert_int_equal(bench_fit_tokens(chat, 1, 1000), -1);
    bench_fit_learn(chat, 1, 1000, 3000);
    assert_int_equal(bench_fit_tokens(chat, 1, 1000), 3000);
    assert_int_equal(bench_fit_tokens(chat, 0, 1000), 1793);
    bench_fit_learn(chat, 2, 1000, 3000); /* no such session: ignored */
    assert_int_equal(bench_fit_tokens(chat, 2, 1000), -1);
    bench_fit_learn(chat, 0, 100, 400); /* a smaller prompt (mostly template) does not override */
    assert_int_equal(bench_fit_tokens(chat, 0, 9893), 17735);
    bench_fit_learn(chat, 0, 0, 400);
    bench_fit_learn(chat, 0, 20000, -1);
    assert_int_equal(bench_fit_tokens(chat, 0, 9893), 17735);
    bench_fit_learn(chat, 0, 20000, 30000); /* a larger one does */
    assert_int_equal(bench_fit_tokens(chat, 0, 1000), 1500);
    bench_fit_destroy(exact);
    bench_fit_destroy(chat);
}

static void test_longest_turn_of_a_trace(void **state)
{
    bench_turn_t turns_a[2];
    bench_turn_t turns_b[1];
    bench_session_t sessions[2];
    bench_trace_t trace;
    size_t s = 9;
    size_t t = 9;
    int64_t tokens = 0;
    (void)state;

    memset(turns_a, 0, sizeof(turns_a));
    memset(turns_b, 0, sizeof(turns_b));
    memset(sessions, 0, sizeof(sessions));
    memset(&trace, 0, sizeof(trace));
    turns_a[0].input_length = 1000;
    turns_a[0].output_length = 100;
    turns_a[1].input_length = 3000;
    turns_a[1].output_length = 100;
    turns_b[0].input_length = 2000;
    turns_b[0].output_length = 2000;
    sessions[0].turns = turns_a;
    sessions[0].n_turns = 2;
    sessions[1].turns = turns_b;
    sessions[1].n_turns = 1;
    trace.sessions = sessions;
    trace.n_sessions = 2;
    trace.format = BENCH_TRACE_MOONCAKE;
    bench_fit_longest(&trace, 1.0, &s, &t, &tokens);
    assert_int_equal(s, 1);
    assert_int_equal(t, 0);
    assert_int_equal(tokens, 4000);
    bench_fit_longest(&trace, 0.5, &s, &t, &tokens); /* Mooncake prompts scale here */
    assert_int_equal(tokens, 2000);
    trace.format = BENCH_TRACE_SWE_AGENT; /* chat: the text was cut already, replies scale */
    bench_fit_longest(&trace, 0.5, &s, &t, &tokens);
    assert_int_equal(s, 0);
    assert_int_equal(t, 1);
    assert_int_equal(tokens, 3050); /* 3000 + 100 * 0.5 beats 2000 + 2000 * 0.5 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context_refusals_are_read),
        cmocka_unit_test(test_suggested_scale_fits_with_margin),
        cmocka_unit_test(test_hint_names_turn_tokens_limit_and_flags),
        cmocka_unit_test(test_hint_is_given_once),
        cmocka_unit_test(test_server_counts_calibrate_estimates),
        cmocka_unit_test(test_longest_turn_of_a_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
