/* test_bench_trace.c - tandem-bench traces: Mooncake parsing and its errors, session rebuilding
 * from hash-id chains, session_id grouping, SWE-agent .traj loading, the bundled traces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench/replay/trace.h"

#define ERR_BYTES  512
#define PATH_BYTES 4096

static bench_trace_t *parse_ok(const char *text)
{
    bench_trace_t *trace = NULL;
    char err[ERR_BYTES] = "";
    tdm_status_t status =
        bench_trace_parse_mooncake(text, strlen(text), "t.jsonl", &trace, err, sizeof(err));
    if (status != TDM_OK) {
        print_message("unexpected parse error: %s\n", err);
    }
    assert_int_equal(status, TDM_OK);
    assert_non_null(trace);
    return trace;
}

static void expect_error(const char *text, const char *want)
{
    bench_trace_t *trace = (bench_trace_t *)0x1;
    char err[ERR_BYTES] = "";

    assert_int_equal(
        bench_trace_parse_mooncake(text, strlen(text), "t.jsonl", &trace, err, sizeof(err)),
        TDM_ERR_FORMAT);
    assert_ptr_equal(trace, (bench_trace_t *)0x1); /* untouched */
    if (strstr(err, want) == NULL) {
        print_message("error \"%s\" lacks \"%s\"\n", err, want);
    }
    assert_non_null(strstr(err, want));
}

static void test_parse_reads_every_field(void **state)
{
    bench_trace_t *trace;
    const bench_turn_t *turn;
    (void)state;

    trace = parse_ok("{\"timestamp\": 5, \"input_length\": 700, \"output_length\": 9, "
                     "\"hash_ids\": [4, 8]}\n");
    assert_int_equal(trace->format, BENCH_TRACE_MOONCAKE);
    assert_int_equal(trace->n_sessions, 1);
    assert_int_equal(trace->n_requests, 1);
    turn = &trace->sessions[0].turns[0];
    assert_int_equal(turn->timestamp_ms, 5);
    assert_int_equal(turn->input_length, 700);
    assert_int_equal(turn->output_length, 9);
    assert_int_equal(turn->n_hash_ids, 2);
    assert_int_equal(turn->hash_ids[1], 8);
    assert_int_equal(turn->delay_ms, -1);
    assert_int_equal(turn->gap_ms, -1);
    assert_int_equal(turn->line, 1);
    assert_null(turn->messages);
    assert_string_equal(trace->sessions[0].id, "r1");
    bench_trace_destroy(trace);
}

static void test_parse_skips_blank_lines_and_crlf(void **state)
{
    bench_trace_t *trace;
    (void)state;

    trace = parse_ok("\n  \r\n{\"input_length\": 1, \"output_length\": 1}\r\n\n");
    assert_int_equal(trace->n_requests, 1);
    assert_int_equal(trace->sessions[0].turns[0].line, 3);
    assert_int_equal(trace->sessions[0].turns[0].timestamp_ms, -1);
    bench_trace_destroy(trace);
}

static void test_malformed_lines_give_line_numbered_errors(void **state)
{
    const char *good = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2}\n";
    char text[1024];
    (void)state;

    snprintf(text, sizeof(text), "%s%s{\"timestamp\": 1, \"input_length\": 10,\n", good, good);
    expect_error(text, "t.jsonl:3: bad JSON");
    snprintf(text, sizeof(text), "%s{\"timestamp\": 1, \"output_length\": 2}\n", good);
    expect_error(text, "t.jsonl:2: missing \"input_length\"");
    snprintf(text, sizeof(text), "%s%s{\"input_length\": 0, \"output_length\": 2}\n", good, good);
    expect_error(text, "t.jsonl:3: \"input_length\" is 0; must be >= 1");
    snprintf(text, sizeof(text), "{\"input_length\": 3, \"output_length\": \"2\"}\n");
    expect_error(text, "t.jsonl:1: \"output_length\" is not an integer");
    snprintf(text, sizeof(text),
             "%s{\"input_length\": 3, \"output_length\": 2, "
             "\"hash_ids\": [1, -2]}\n",
             good);
    expect_error(text, "t.jsonl:2: \"hash_ids\"[1] is not an integer >= 0");
    snprintf(text, sizeof(text), "%s{\"input_length\": 3, \"output_length\": 2, \"hash_ids\": 7}\n",
             good);
    expect_error(text, "t.jsonl:2: \"hash_ids\" is not an array");
    snprintf(text, sizeof(text), "[1, 2]\n");
    expect_error(text, "t.jsonl:1: not a JSON object");
    snprintf(text, sizeof(text),
             "{\"input_length\": 3, \"output_length\": 2, \"session_id\": [1]}");
    expect_error(text, "t.jsonl:1: \"session_id\" is not a string or integer");
    snprintf(text, sizeof(text), "{\"input_length\": 3, \"output_length\": 2, \"delay\": -5}");
    expect_error(text, "t.jsonl:1: \"delay\" is -5; must be >= 0");
    expect_error("\n\n", "t.jsonl: no requests");
}

/*
 * Hand-made: A = [0,1,2] then [0,1,2,3,4] (extends all of A's blocks), then [0,1,2,3,5,6]
 * (replaces A's last partial block 4); B = [0,10] shares only the system block 0 (first seen in
 * A) and must not join A; C = [0,20,21] must not join B through B's trimmed prefix [0] either;
 * D repeats A's first request exactly (no growth): a new session; E extends an older turn of A
 * (a branch): a new session.
 */
static void test_rebuild_sessions_from_prefix_chains(void **state)
{
    const char *text =
        "{\"timestamp\": 0, \"input_length\": 1200, \"output_length\": 5, \"hash_ids\": [0,1,2]}\n"
        "{\"timestamp\": 100, \"input_length\": 900, \"output_length\": 5, \"hash_ids\": [0,10]}\n"
        "{\"timestamp\": 3000, \"input_length\": 2400, \"output_length\": 5, "
        "\"hash_ids\": [0,1,2,3,4]}\n"
        "{\"timestamp\": 3500, \"input_length\": 1100, \"output_length\": 5, "
        "\"hash_ids\": [0,20,21]}\n"
        "{\"timestamp\": 4000, \"input_length\": 1200, \"output_length\": 5, \"hash_ids\": "
        "[0,1,2]}\n"
        "{\"timestamp\": 9000, \"input_length\": 2900, \"output_length\": 5, "
        "\"hash_ids\": [0,1,2,3,5,6]}\n"
        "{\"timestamp\": 9500, \"input_length\": 1500, \"output_length\": 5, "
        "\"hash_ids\": [0,1,2,30]}\n";
    bench_trace_t *trace;
    const bench_session_t *a;
    (void)state;

    trace = parse_ok(text);
    assert_int_equal(trace->n_requests, 7);
    assert_int_equal(trace->n_sessions, 5);
    assert_int_equal(trace->n_rebuilt_sessions, 5);
    a = &trace->sessions[0];
    assert_string_equal(a->id, "r1");
    assert_int_equal(a->n_turns, 3);
    assert_int_equal(a->turns[0].line, 1);
    assert_int_equal(a->turns[1].line, 3);
    assert_int_equal(a->turns[2].line, 6);
    assert_int_equal(a->turns[1].gap_ms, 3000);
    assert_int_equal(a->turns[2].gap_ms, 6000);
    assert_int_equal(trace->sessions[1].n_turns, 1); /* B */
    assert_string_equal(trace->sessions[1].id, "r2");
    assert_int_equal(trace->sessions[2].n_turns, 1); /* C */
    assert_int_equal(trace->sessions[3].n_turns, 1); /* D */
    assert_string_equal(trace->sessions[3].id, "r5");
    assert_int_equal(trace->sessions[4].n_turns, 1); /* E */
    assert_string_equal(trace->sessions[4].id, "r7");
    bench_trace_destroy(trace);
}

/* Two sessions interleaved in time keep their own chains. */
static void test_rebuild_interleaved_sessions(void **state)
{
    const char *text =
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1,2]}\n"
        "{\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [5,6]}\n"
        "{\"timestamp\": 2, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [5,6,7]}\n"
        "{\"timestamp\": 3, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [1,2,3]}\n"
        "{\"timestamp\": 4, \"input_length\": 2000, \"output_length\": 5, \"hash_ids\": "
        "[1,2,3,4]}\n"
        "{\"timestamp\": 5, \"input_length\": 2000, \"output_length\": 5, "
        "\"hash_ids\": [5,6,7,8]}\n";
    bench_trace_t *trace;
    (void)state;

    trace = parse_ok(text);
    assert_int_equal(trace->n_sessions, 2);
    assert_int_equal(trace->sessions[0].n_turns, 3);
    assert_int_equal(trace->sessions[1].n_turns, 3);
    assert_int_equal(trace->sessions[0].turns[2].hash_ids[3], 4);
    assert_int_equal(trace->sessions[1].turns[2].hash_ids[3], 8);
    bench_trace_destroy(trace);
}

static void test_session_ids_group_turns_and_keep_delay(void **state)
{
    const char *text =
        "{\"session_id\": \"x\", \"timestamp\": 0, \"input_length\": 10, \"output_length\": 2}\n"
        "{\"session_id\": 42, \"timestamp\": 5, \"input_length\": 10, \"output_length\": 2}\n"
        "{\"session_id\": \"x\", \"delay\": 1500, \"input_length\": 20, \"output_length\": 2}\n"
        "{\"session_id\": \"42\", \"timestamp\": 9, \"input_length\": 30, \"output_length\": 2}\n";
    bench_trace_t *trace;
    (void)state;

    trace = parse_ok(text);
    assert_int_equal(trace->n_sessions, 2);
    assert_int_equal(trace->n_rebuilt_sessions, 0);
    assert_string_equal(trace->sessions[0].id, "x");
    assert_int_equal(trace->sessions[0].n_turns, 2);
    assert_int_equal(trace->sessions[0].turns[1].delay_ms, 1500);
    assert_int_equal(trace->sessions[0].turns[1].gap_ms, -1); /* no timestamp on turn 2 */
    assert_string_equal(trace->sessions[1].id, "42");
    assert_int_equal(trace->sessions[1].n_turns, 2);
    assert_int_equal(trace->sessions[1].turns[1].gap_ms, 4);
    bench_trace_destroy(trace);
}

static void test_format_parse(void **state)
{
    bench_trace_format_t format = BENCH_TRACE_MOONCAKE;
    (void)state;

    assert_int_equal(bench_trace_format_parse("swe-agent", "x", &format), TDM_OK);
    assert_int_equal(format, BENCH_TRACE_SWE_AGENT);
    assert_int_equal(bench_trace_format_parse("auto", "a/b.jsonl", &format), TDM_OK);
    assert_int_equal(format, BENCH_TRACE_MOONCAKE);
    assert_int_equal(bench_trace_format_parse("auto", "a/b.traj", &format), TDM_OK);
    assert_int_equal(format, BENCH_TRACE_SWE_AGENT);
    assert_int_equal(bench_trace_format_parse("csv", "x", &format), TDM_ERR_INVALID_ARG);
    assert_int_equal(format, BENCH_TRACE_SWE_AGENT);
    assert_string_equal(bench_trace_format_name(BENCH_TRACE_MOONCAKE), "mooncake");
}

static const char *tmp_dir(void)
{
    const char *dir = getenv("TANDEM_TEST_TMP");
    return dir != NULL ? dir : "/tmp";
}

static void write_file(const char *path, const char *text)
{
    FILE *file = fopen(path, "w");
    assert_non_null(file);
    assert_int_equal(fputs(text, file) >= 0, 1);
    assert_int_equal(fclose(file), 0);
}

static void test_swe_agent_traj_becomes_chat_turns(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    bench_trace_t *trace = NULL;
    const bench_session_t *session;
    const json_t *last;
    (void)state;

    snprintf(path, sizeof(path), "%s/bench_small.traj", tmp_dir());
    write_file(path,
               "{\"history\": ["
               "{\"role\": \"system\", \"content\": \"You are an agent.\"},"
               "{\"role\": \"user\", \"content\": \"demo\", \"is_demo\": true},"
               "{\"role\": \"user\", \"content\": \"Fix the bug.\"},"
               "{\"role\": \"assistant\", \"content\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\", "
               "\"thought\": \"t\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", "
               "\"function\": {\"name\": \"ls\", \"arguments\": \"{}\"}}]},"
               "{\"role\": \"tool\", \"content\": \"file.py\", \"tool_call_ids\": [\"c1\"]},"
               "{\"role\": \"assistant\", \"content\": \"bbbbbbbbbb\"}],"
               "\"info\": {\"model_stats\": {\"tokens_received\": 80, \"api_calls\": 2}}}");
    assert_int_equal(bench_trace_load_swe_agent(path, &trace, err, sizeof(err)), TDM_OK);
    assert_int_equal(trace->format, BENCH_TRACE_SWE_AGENT);
    assert_int_equal(trace->n_sessions, 1);
    assert_int_equal(trace->n_requests, 2);
    session = &trace->sessions[0];
    assert_string_equal(session->id, "bench_small.traj");
    assert_int_equal(session->tag_message, 2); /* first user message that is not a demo */
    assert_int_equal(session->n_turns, 2);
    assert_int_equal(json_array_size(session->turns[0].messages), 3);
    assert_int_equal(json_array_size(session->turns[1].messages), 5);
    /* tokens_received 80 split 30:10 by reply characters */
    assert_int_equal(session->turns[0].output_length, 60);
    assert_int_equal(session->turns[1].output_length, 20);
    last = json_array_get(session->turns[1].messages, 4);
    assert_string_equal(json_string_value(json_object_get(last, "role")), "tool");
    assert_string_equal(json_string_value(json_object_get(last, "tool_call_id")), "c1");
    assert_null(json_object_get(last, "tool_call_ids"));
    assert_non_null(json_object_get(json_array_get(session->turns[1].messages, 3), "tool_calls"));
    assert_null(json_object_get(json_array_get(session->turns[1].messages, 3), "thought"));
    assert_null(json_object_get(json_array_get(session->turns[1].messages, 1), "is_demo"));
    bench_trace_destroy(trace);

    write_file(path, "{\"history\": [{\"role\": \"user\", \"content\": \"hi\"}]}");
    trace = NULL;
    assert_int_equal(bench_trace_load_swe_agent(path, &trace, err, sizeof(err)), TDM_ERR_FORMAT);
    assert_null(trace);
    assert_non_null(strstr(err, "no assistant reply"));
    snprintf(path, sizeof(path), "%s/no-such.traj", tmp_dir());
    assert_int_equal(bench_trace_load_swe_agent(path, &trace, err, sizeof(err)), TDM_ERR_NOT_FOUND);
}

static void source_path(char *out, size_t out_bytes, const char *rel)
{
    const char *root = getenv("TANDEM_SOURCE_DIR");
    snprintf(out, out_bytes, "%s/%s", root != NULL ? root : ".", rel);
}

/* The bundled slice: 298 lines of 53 whole sessions of 3+ turns (bench/traces/SOURCE.md). */
static void test_bundled_mooncake_slice_rebuilds_its_sessions(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    bench_trace_t *trace = NULL;
    size_t max_turns = 0;
    size_t n_single = 0;
    (void)state;

    source_path(path, sizeof(path), "bench/traces/mooncake-conversation-slice.jsonl");
    assert_int_equal(bench_trace_load(path, BENCH_TRACE_MOONCAKE, &trace, err, sizeof(err)),
                     TDM_OK);
    assert_int_equal(trace->n_requests, 298);
    assert_true(trace->n_requests <= 300);
    assert_int_equal(trace->n_sessions, 53);
    for (size_t s = 0; s < trace->n_sessions; s++) {
        const bench_session_t *session = &trace->sessions[s];
        max_turns = session->n_turns > max_turns ? session->n_turns : max_turns;
        n_single += session->n_turns == 1;
        for (size_t t = 1; t < session->n_turns; t++) {
            assert_true(session->turns[t].input_length > session->turns[t - 1].input_length);
            assert_true(session->turns[t].gap_ms >= 0);
        }
    }
    assert_int_equal(max_turns, 43);
    assert_int_equal(n_single, 0);
    bench_trace_destroy(trace);
}

static void test_bundled_swe_agent_trajectory_loads(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    bench_trace_t *trace = NULL;
    int64_t total_output = 0;
    (void)state;

    source_path(path, sizeof(path), "bench/traces/swe-agent__test-repo-i1.traj");
    assert_int_equal(bench_trace_load(path, BENCH_TRACE_SWE_AGENT, &trace, err, sizeof(err)),
                     TDM_OK);
    assert_int_equal(trace->n_sessions, 1);
    assert_int_equal(trace->sessions[0].n_turns, 5); /* model_stats.api_calls */
    for (size_t t = 0; t < 5; t++) {
        total_output += trace->sessions[0].turns[t].output_length;
    }
    assert_true(total_output >= 324 && total_output <= 328); /* tokens_received 326, rounded */
    bench_trace_destroy(trace);
}

/* Cuts keep round(chars * scale) characters and never end inside a UTF-8 sequence. */
static void test_text_cut_is_utf8_safe_and_proportional(void **state)
{
    /* 1 + 2 + 3 + 4 bytes: a, e-acute, check mark, an emoji; then 6 ASCII */
    static const char text[] = "a\xc3\xa9\xe2\x9c\x93\xf0\x9f\x98\x80"
                               "bcdefg";
    size_t n = strlen(text);
    (void)state;

    assert_int_equal(bench_trace_text_chars(text, n), 10);
    assert_int_equal(bench_trace_text_cut(text, n, 1.0), n);
    assert_int_equal(bench_trace_text_cut(text, n, 0.5), 1 + 2 + 3 + 4 + 1); /* 5 characters */
    assert_int_equal(bench_trace_text_cut(text, n, 0.2), 3);                 /* a, e-acute */
    assert_int_equal(bench_trace_text_cut(text, n, 0.001), 1); /* a non-empty text keeps one */
    assert_int_equal(bench_trace_text_cut("", 0, 0.5), 0);
    for (int k = 1; k <= 100; k++) {
        size_t cut = bench_trace_text_cut(text, n, k / 100.0);
        assert_true(cut >= 1 && cut <= n);
        assert_true(cut == n || (text[cut] & 0xC0) != 0x80); /* never inside a character */
    }
}

/* A session's messages at turn t equal the first messages of turn t + 1 (the cut of a message
 * does not depend on the turn that carries it). */
static void assert_turns_extend(const bench_session_t *session)
{
    for (size_t t = 0; t + 1 < session->n_turns; t++) {
        const json_t *now = session->turns[t].messages;
        const json_t *next = session->turns[t + 1].messages;
        assert_true(json_array_size(next) > json_array_size(now));
        for (size_t m = 0; m < json_array_size(now); m++) {
            assert_true(json_equal(json_array_get(now, m), json_array_get(next, m)));
        }
    }
}

static void test_scale_text_keeps_structure_and_prefixes(void **state)
{
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    bench_trace_t *full = NULL;
    bench_trace_t *half = NULL;
    const bench_session_t *session;
    const json_t *full_msgs;
    const json_t *half_msgs;
    (void)state;

    snprintf(path, sizeof(path), "%s/bench_scale.traj", tmp_dir());
    write_file(
        path,
        "{\"history\": ["
        "{\"role\": \"system\", \"content\": \"You are an agent \u00e9\u2713 twenty.\"},"
        "{\"role\": \"user\", \"content\": \"Fix the bug in \u65e5\u672c\u8a9e.py now.\"},"
        "{\"role\": \"assistant\", \"content\": \"Let me look at the file first.\", "
        "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", "
        "\"function\": {\"name\": \"open\", \"arguments\": \"{\\\"path\\\": \\\"a.py\\\"}\"}}]},"
        "{\"role\": \"tool\", \"content\": \"1: def f():\\n2:     return 1\\n\", "
        "\"tool_call_ids\": [\"c1\"]},"
        "{\"role\": \"assistant\", \"content\": [{\"type\": \"text\", "
        "\"text\": \"The bug is on line two.\"}]},"
        "{\"role\": \"user\", \"content\": \"ok\"},"
        "{\"role\": \"assistant\", \"content\": \"done\"}]}");
    assert_int_equal(bench_trace_load_swe_agent(path, &full, err, sizeof(err)), TDM_OK);
    assert_int_equal(bench_trace_load_swe_agent(path, &half, err, sizeof(err)), TDM_OK);
    assert_int_equal(bench_trace_scale_text(half, 0.0), TDM_ERR_INVALID_ARG);
    assert_int_equal(bench_trace_scale_text(half, 1.5), TDM_ERR_INVALID_ARG);
    assert_int_equal(bench_trace_scale_text(half, 0.5), TDM_OK);
    assert_int_equal(half->n_requests, full->n_requests);
    session = &half->sessions[0];
    assert_int_equal(session->n_turns, 3);
    assert_turns_extend(session);
    assert_true(session->turns[2].input_length < full->sessions[0].turns[2].input_length);
    assert_int_equal(session->turns[2].output_length, full->sessions[0].turns[2].output_length);

    full_msgs = full->sessions[0].turns[2].messages;
    half_msgs = session->turns[2].messages;
    assert_int_equal(json_array_size(half_msgs), json_array_size(full_msgs));
    for (size_t m = 0; m < json_array_size(full_msgs); m++) {
        const json_t *a = json_array_get(full_msgs, m);
        const json_t *b = json_array_get(half_msgs, m);
        const json_t *ca = json_object_get(a, "content");
        const json_t *cb = json_object_get(b, "content");
        /* roles, tool calls and tool_call_id as recorded */
        assert_true(json_equal(json_object_get(a, "role"), json_object_get(b, "role")));
        assert_true(
            json_equal(json_object_get(a, "tool_calls"), json_object_get(b, "tool_calls")) ||
            json_object_get(a, "tool_calls") == NULL);
        assert_true(
            json_equal(json_object_get(a, "tool_call_id"), json_object_get(b, "tool_call_id")) ||
            json_object_get(a, "tool_call_id") == NULL);
        if (json_is_array(ca)) {
            ca = json_object_get(json_array_get(ca, 0), "text");
            cb = json_object_get(json_array_get(cb, 0), "text");
        }
        /* the cut is a prefix, about half the characters, never empty */
        assert_true(json_string_length(cb) >= 1);
        assert_true(json_string_length(cb) <= json_string_length(ca));
        assert_memory_equal(json_string_value(cb), json_string_value(ca), json_string_length(cb));
        {
            size_t chars_a = bench_trace_text_chars(json_string_value(ca), json_string_length(ca));
            size_t chars_b = bench_trace_text_chars(json_string_value(cb), json_string_length(cb));
            assert_true(chars_b * 2 + 1 >= chars_a && chars_b * 2 <= chars_a + 1);
        }
    }
    /* the tool call's arguments and the tool message's id stay whole */
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(
                json_array_get(json_object_get(json_array_get(half_msgs, 2), "tool_calls"), 0),
                "function"),
            "arguments")),
        "{\"path\": \"a.py\"}");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(half_msgs, 3), "tool_call_id")), "c1");
    bench_trace_destroy(full);
    bench_trace_destroy(half);
}

/* Every .traj of a folder, scaled: turns still extend each other and the prompts shrink. */
static void check_scaled_folder(const char *path, double scale)
{
    char err[ERR_BYTES] = "";
    bench_trace_t *full = NULL;
    bench_trace_t *cut = NULL;

    assert_int_equal(bench_trace_load_swe_agent(path, &full, err, sizeof(err)), TDM_OK);
    assert_int_equal(bench_trace_load_swe_agent(path, &cut, err, sizeof(err)), TDM_OK);
    assert_int_equal(bench_trace_scale_text(cut, scale), TDM_OK);
    for (size_t s = 0; s < cut->n_sessions; s++) {
        const bench_session_t *a = &full->sessions[s];
        const bench_session_t *b = &cut->sessions[s];
        assert_int_equal(a->n_turns, b->n_turns);
        assert_turns_extend(b);
        for (size_t t = 0; t < b->n_turns; t++) {
            double ratio = (double)b->turns[t].input_length / (double)a->turns[t].input_length;
            assert_int_equal(json_array_size(a->turns[t].messages),
                             json_array_size(b->turns[t].messages));
            assert_true(ratio > scale * 0.8 && ratio < scale * 1.2);
        }
        print_message("%s: turn 1 estimate %lld -> %lld at scale %g\n", a->id,
                      (long long)a->turns[0].input_length, (long long)b->turns[0].input_length,
                      scale);
    }
    bench_trace_destroy(full);
    bench_trace_destroy(cut);
}

static void test_bundled_swe_agent_trajectory_scales(void **state)
{
    char path[PATH_BYTES];
    (void)state;

    source_path(path, sizeof(path), "bench/traces/swe-agent__test-repo-i1.traj");
    check_scaled_folder(path, 0.35);
    check_scaled_folder(path, 0.05);
}

/* Every SWE-agent session in ../shared/data, when present. */
static void test_shared_swe_agent_trajectories_scale(void **state)
{
    const char *data = getenv("TANDEM_SHARED_DATA");
    char path[PATH_BYTES];
    FILE *probe;
    (void)state;

    if (data == NULL) {
        print_message("TANDEM_SHARED_DATA not set: skipping\n");
        skip();
    }
    snprintf(path, sizeof(path), "%s/swe-agent-trajectories/SOURCE.md", data);
    probe = fopen(path, "r");
    if (probe == NULL) {
        print_message("%s absent: skipping\n", path);
        skip();
    }
    fclose(probe);
    snprintf(path, sizeof(path), "%s/swe-agent-trajectories", data);
    check_scaled_folder(path, 0.4);
}

/* The whole Mooncake conversation trace from ../shared/data, when present. */
static void test_shared_conversation_trace_parses(void **state)
{
    const char *data = getenv("TANDEM_SHARED_DATA");
    char path[PATH_BYTES];
    char err[ERR_BYTES] = "";
    bench_trace_t *trace = NULL;
    FILE *probe;
    (void)state;

    if (data == NULL) {
        print_message("TANDEM_SHARED_DATA not set: skipping\n");
        skip();
    }
    snprintf(path, sizeof(path), "%s/mooncake-traces/conversation_trace.jsonl", data);
    probe = fopen(path, "r");
    if (probe == NULL) {
        print_message("%s absent: skipping\n", path);
        skip();
    }
    fclose(probe);
    assert_int_equal(bench_trace_load(path, BENCH_TRACE_MOONCAKE, &trace, err, sizeof(err)),
                     TDM_OK);
    assert_int_equal(trace->n_requests, 12031);
    print_message("conversation trace: %zu sessions rebuilt\n", trace->n_sessions);
    assert_int_equal(trace->n_sessions, 8208);
    bench_trace_destroy(trace);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_reads_every_field),
        cmocka_unit_test(test_parse_skips_blank_lines_and_crlf),
        cmocka_unit_test(test_malformed_lines_give_line_numbered_errors),
        cmocka_unit_test(test_rebuild_sessions_from_prefix_chains),
        cmocka_unit_test(test_rebuild_interleaved_sessions),
        cmocka_unit_test(test_session_ids_group_turns_and_keep_delay),
        cmocka_unit_test(test_format_parse),
        cmocka_unit_test(test_swe_agent_traj_becomes_chat_turns),
        cmocka_unit_test(test_bundled_mooncake_slice_rebuilds_its_sessions),
        cmocka_unit_test(test_bundled_swe_agent_trajectory_loads),
        cmocka_unit_test(test_shared_conversation_trace_parses),
        cmocka_unit_test(test_text_cut_is_utf8_safe_and_proportional),
        cmocka_unit_test(test_scale_text_keeps_structure_and_prefixes),
        cmocka_unit_test(test_bundled_swe_agent_trajectory_scales),
        cmocka_unit_test(test_shared_swe_agent_trajectories_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
