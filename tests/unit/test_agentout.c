/* test_agentout.c - the agent output parser (text/agentout.h): reasoning, content and DSML tool
 * calls out of detokenized text, fed split at every byte (inside markers and inside UTF-8
 * characters), byte by byte and in random three-way splits; the transcript must not depend on
 * the split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/agentout.h"

#define DSML                                                                                       \
    "\xEF\xBD\x9C"                                                                                 \
    "DSML"                                                                                         \
    "\xEF\xBD\x9C"
#define BLOCK     "<" DSML "tool_calls>"
#define BLOCK_E   "</" DSML "tool_calls>"
#define INV(n)    "<" DSML "invoke name=\"" n "\">"
#define INV_E     "</" DSML "invoke>"
#define PAR(n, s) "<" DSML "parameter name=\"" n "\" string=\"" s "\">"
#define PAR_E     "</" DSML "parameter>"

#define T_BYTES 4096
#define T_CALLS 8
#define T_NAME  128

/* Everything a parser released for one output, folded. */
typedef struct {
    char reasoning[T_BYTES];
    size_t n_reasoning;
    char content[T_BYTES];
    size_t n_content;
    int n_calls;
    char ids[T_CALLS][40];
    char names[T_CALLS][T_NAME];
    char args[T_CALLS][T_BYTES];
    size_t n_args[T_CALLS];
    int n_fragments[T_CALLS];
    int ended[T_CALLS];
    int order_ok;    /* begin, fragments, end, in index order */
    int split_chars; /* a non-final text event ended inside a UTF-8 character */
    int unfinished;
    uint32_t n_calls_api;
} transcript_t;

/* Whether s[0, n) ends inside a UTF-8 character. */
static int ends_inside_char(const char *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        size_t need;
        if ((c & 0xC0) == 0x80) {
            continue;
        }
        need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back;
    }
    return 0;
}

static void fold(transcript_t *t, const text_agent_event_t *ev, size_t n_ev, int final)
{
    for (size_t i = 0; i < n_ev; i++) {
        const text_agent_event_t *e = &ev[i];
        switch (e->kind) {
        case TEXT_AGENT_REASONING:
        case TEXT_AGENT_CONTENT: {
            char *dst = e->kind == TEXT_AGENT_REASONING ? t->reasoning : t->content;
            size_t *n = e->kind == TEXT_AGENT_REASONING ? &t->n_reasoning : &t->n_content;
            assert_true(e->n_text > 0);
            assert_true(*n + e->n_text < T_BYTES);
            memcpy(dst + *n, e->text, e->n_text);
            *n += e->n_text;
            if (!final && ends_inside_char(e->text, e->n_text)) {
                t->split_chars = 1;
            }
            break;
        }
        case TEXT_AGENT_CALL_BEGIN:
            if ((int)e->index != t->n_calls || t->n_calls == T_CALLS) {
                t->order_ok = 0;
                break;
            }
            assert_non_null(e->id);
            snprintf(t->ids[t->n_calls], sizeof(t->ids[0]), "%s", e->id);
            assert_true(e->n_text < T_NAME);
            memcpy(t->names[t->n_calls], e->text, e->n_text);
            t->names[t->n_calls][e->n_text] = '\0';
            t->n_calls++;
            break;
        case TEXT_AGENT_CALL_ARGS:
            if ((int)e->index != t->n_calls - 1 || t->ended[e->index]) {
                t->order_ok = 0;
                break;
            }
            memcpy(t->args[e->index] + t->n_args[e->index], e->text, e->n_text);
            t->n_args[e->index] += e->n_text;
            t->n_fragments[e->index]++;
            break;
        case TEXT_AGENT_CALL_END:
            if ((int)e->index != t->n_calls - 1 || t->ended[e->index]) {
                t->order_ok = 0;
                break;
            }
            t->ended[e->index] = 1;
            break;
        }
    }
}

/* Feed text split at the given cut points (ascending, n_cuts of them), then finish. */
static void run_cuts(uint32_t flags, const char *text, const size_t *cuts, size_t n_cuts,
                     transcript_t *t)
{
    text_agentout_t *p = NULL;
    const text_agent_event_t *ev;
    size_t n_ev;
    size_t n = strlen(text);
    size_t from = 0;

    memset(t, 0, sizeof(*t));
    t->order_ok = 1;
    assert_int_equal(text_agentout_create(flags, 42, &p), TDM_OK);
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : n;
        assert_int_equal(text_agentout_push(p, text + from, to - from, &ev, &n_ev), TDM_OK);
        fold(t, ev, n_ev, 0);
        from = to;
    }
    assert_int_equal(text_agentout_finish(p, &ev, &n_ev), TDM_OK);
    fold(t, ev, n_ev, 1);
    t->unfinished = text_agentout_unfinished(p);
    t->n_calls_api = text_agentout_n_calls(p);
    /* a second finish releases nothing; a push after it is refused */
    assert_int_equal(text_agentout_finish(p, &ev, &n_ev), TDM_OK);
    assert_int_equal(n_ev, 0);
    assert_int_equal(text_agentout_push(p, "x", 1, &ev, &n_ev), TDM_ERR_INVALID_ARG);
    text_agentout_destroy(p);
}

static void assert_same(const transcript_t *a, const transcript_t *b)
{
    assert_int_equal(a->n_reasoning, b->n_reasoning);
    assert_memory_equal(a->reasoning, b->reasoning, a->n_reasoning);
    assert_int_equal(a->n_content, b->n_content);
    assert_memory_equal(a->content, b->content, a->n_content);
    assert_int_equal(a->n_calls, b->n_calls);
    for (int i = 0; i < a->n_calls; i++) {
        assert_string_equal(a->ids[i], b->ids[i]);
        assert_string_equal(a->names[i], b->names[i]);
        assert_int_equal(a->n_args[i], b->n_args[i]);
        assert_memory_equal(a->args[i], b->args[i], a->n_args[i]);
        assert_int_equal(a->ended[i], b->ended[i]);
    }
    assert_int_equal(a->unfinished, b->unfinished);
    assert_true(b->order_ok);
    assert_false(b->split_chars);
}

/* The whole text in one push is the reference; every two-way split, byte-by-byte feeding and 300
 * pseudo-random three-way splits must give the same transcript. Returns the reference. */
static void check_all_splits(uint32_t flags, const char *text, transcript_t *ref)
{
    size_t n = strlen(text);
    transcript_t *t = malloc(sizeof(*t));
    size_t *cuts = malloc((n + 1) * sizeof(*cuts));
    uint64_t lcg = 12345;

    assert_non_null(t);
    assert_non_null(cuts);
    run_cuts(flags, text, NULL, 0, ref);
    assert_true(ref->order_ok);
    for (size_t i = 0; i <= n; i++) {
        cuts[0] = i;
        run_cuts(flags, text, cuts, 1, t);
        assert_same(ref, t);
    }
    for (size_t i = 0; i < n; i++) {
        cuts[i] = i + 1;
    }
    run_cuts(flags, text, cuts, n > 0 ? n - 1 : 0, t);
    assert_same(ref, t);
    for (int r = 0; r < 300; r++) {
        size_t a;
        size_t b;
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        a = (size_t)(lcg >> 33) % (n + 1);
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        b = (size_t)(lcg >> 33) % (n + 1);
        cuts[0] = a < b ? a : b;
        cuts[1] = a < b ? b : a;
        run_cuts(flags, text, cuts, 2, t);
        assert_same(ref, t);
    }
    free(cuts);
    free(t);
}

static void assert_text(const char *got, size_t n_got, const char *want)
{
    assert_int_equal(n_got, strlen(want));
    assert_memory_equal(got, want, n_got);
}

static void test_reasoning_content_and_two_calls_at_every_split(void **state)
{
    static const char text[] =
        "Let me check caf\xC3\xA9 weather.</think>Sure \xE2\x80\x94 \xE6\x9D\xB1\xE4\xBA\xAC too."
        "\n\n" BLOCK "\n" INV("get_weather") "\n" PAR(
            "city",
            "true") "New \"York\"\n\xE6\x9D\xB1\xE4\xBA\xAC\\" PAR_E
                    "\n" PAR("days", "false") " 3 " PAR_E "\n" INV_E "\n" INV(
                        "list_files") "\n" PAR("opts",
                                               "false") "{\"deep\": [1, -2.5e3, null, true]}" PAR_E
                                                        "\n" INV_E "\n" BLOCK_E;
    transcript_t *ref = malloc(sizeof(*ref));

    (void)state;
    assert_non_null(ref);
    check_all_splits(TEXT_AGENT_THINKING | TEXT_AGENT_TOOLS, text, ref);
    assert_text(ref->reasoning, ref->n_reasoning, "Let me check caf\xC3\xA9 weather.");
    assert_text(ref->content, ref->n_content, "Sure \xE2\x80\x94 \xE6\x9D\xB1\xE4\xBA\xAC too.");
    assert_int_equal(ref->n_calls, 2);
    assert_int_equal(ref->n_calls_api, 2);
    assert_string_equal(ref->names[0], "get_weather");
    assert_text(ref->args[0], ref->n_args[0],
                "{\"city\": \"New \\\"York\\\"\\n\xE6\x9D\xB1\xE4\xBA\xAC\\\\\", \"days\": 3}");
    assert_int_equal(ref->n_fragments[0], 2); /* one per parameter */
    assert_string_equal(ref->names[1], "list_files");
    assert_text(ref->args[1], ref->n_args[1], "{\"opts\": {\"deep\": [1, -2.5e3, null, true]}}");
    assert_true(ref->ended[0] && ref->ended[1]);
    assert_false(ref->unfinished);
    /* ids: "call_" + 24 hex digits, distinct */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(strlen(ref->ids[i]), 29);
        assert_memory_equal(ref->ids[i], "call_", 5);
        assert_int_equal(strspn(ref->ids[i] + 5, "0123456789abcdef"), 24);
    }
    assert_string_not_equal(ref->ids[0], ref->ids[1]);
    free(ref);
}

static void test_markup_that_is_not_a_call_is_released_as_content(void **state)
{
    /* Each is text that looks like DSML but is no call: it must come out as content, unchanged. */
    static const char *const texts[] = {
        "Use " BLOCK " blocks, e.g. " INV("x") " (see docs)." BLOCK_E " done",
        "a\n\n" BLOCK "\n<" DSML "invoke>\n" INV_E "\n" BLOCK_E, /* invoke without name */
        "b\n\n" BLOCK "\n" INV("f") "\n" PAR("k", "maybe") "v" PAR_E "\n" INV_E "\n" BLOCK_E,
        "c\n\n" BLOCK "\n" INV("f") "\n" PAR("n", "false") "not json" PAR_E "\n" INV_E "\n" BLOCK_E,
        "d\n\n" BLOCK "\n" INV("f") "\n" PAR("k", "true") "1" PAR_E PAR(
            "k", "true") "2" PAR_E "\n" INV_E "\n" BLOCK_E,     /* repeated parameter */
        "e " INV("f") INV_E " and " BLOCK_E " outside a block", /* no opener */
        "f\n\n" BLOCK "\n" INV("f") "\n<" DSML "param name=\"k\">1" INV_E "\n" BLOCK_E,
    };
    transcript_t *ref = malloc(sizeof(*ref));

    (void)state;
    assert_non_null(ref);
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        check_all_splits(TEXT_AGENT_TOOLS, texts[i], ref);
        assert_text(ref->content, ref->n_content, texts[i]);
        assert_int_equal(ref->n_calls, 0);
        assert_int_equal(ref->n_reasoning, 0);
    }
    free(ref);
}

static void test_unfinished_call_becomes_content_and_sets_unfinished(void **state)
{
    static const char head[] =
        "Writing it.\n\n" BLOCK "\n" INV("read") "\n" PAR("path", "true") "a.c" PAR_E "\n" INV_E;
    static const char tail[] =
        "\n" INV("write") "\n" PAR("path", "true") "b.c" PAR_E "\n" PAR("body", "true") "int ma";
    char text[1024];
    char want[1024];
    transcript_t *ref = malloc(sizeof(*ref));

    (void)state;
    assert_non_null(ref);
    /* no complete call: the whole block is content */
    snprintf(text, sizeof(text), "Working.\n\n" BLOCK "\n" INV("w") "\n" PAR("p", "true") "x");
    check_all_splits(TEXT_AGENT_TOOLS, text, ref);
    assert_text(ref->content, ref->n_content, text);
    assert_int_equal(ref->n_calls, 0);
    assert_true(ref->unfinished);
    /* a complete call, then one cut off: the call stands, the rest is content */
    snprintf(text, sizeof(text), "%s%s", head, tail);
    check_all_splits(TEXT_AGENT_TOOLS, text, ref);
    assert_int_equal(ref->n_calls, 1);
    assert_string_equal(ref->names[0], "read");
    assert_text(ref->args[0], ref->n_args[0], "{\"path\": \"a.c\"}");
    snprintf(want, sizeof(want), "Writing it.%s", tail);
    assert_text(ref->content, ref->n_content, want);
    assert_true(ref->unfinished);
    /* only the block opener at the end */
    check_all_splits(TEXT_AGENT_TOOLS, "x\n\n" BLOCK "\n", ref);
    assert_text(ref->content, ref->n_content, "x\n\n" BLOCK "\n");
    assert_true(ref->unfinished);
    /* complete calls and a missing closing tag: the calls stand, nothing is unfinished */
    check_all_splits(TEXT_AGENT_TOOLS, head, ref);
    assert_int_equal(ref->n_calls, 1);
    assert_text(ref->content, ref->n_content, "Writing it.");
    assert_false(ref->unfinished);
    check_all_splits(TEXT_AGENT_TOOLS, "Done.\n\n" BLOCK "\n" INV("f") INV_E "\n</" DSML "tool",
                     ref);
    assert_int_equal(ref->n_calls, 1);
    assert_text(ref->args[0], ref->n_args[0], "{}");
    assert_text(ref->content, ref->n_content, "Done.");
    assert_false(ref->unfinished);
    free(ref);
}

static void test_text_after_a_block_is_content_and_may_open_another(void **state)
{
    static const char text[] =
        BLOCK "\n" INV("a") "\n" INV_E "\n" BLOCK_E "\nthen\n\n" BLOCK
                            "\n" INV("b") "\n" PAR("q", "false") "[]" PAR_E "\n" INV_E "\n" BLOCK_E;
    transcript_t *ref = malloc(sizeof(*ref));

    (void)state;
    assert_non_null(ref);
    check_all_splits(TEXT_AGENT_TOOLS, text, ref);
    assert_int_equal(ref->n_calls, 2);
    assert_string_equal(ref->names[1], "b");
    assert_text(ref->args[1], ref->n_args[1], "{\"q\": []}");
    assert_text(ref->content, ref->n_content, "\nthen");
    free(ref);
}

static void test_without_tools_dsml_is_content_and_without_thinking_think_is_content(void **state)
{
    static const char text[] = "r</think>c\n\n" BLOCK "\n" INV("f") "\n" INV_E "\n" BLOCK_E;
    transcript_t *ref = malloc(sizeof(*ref));

    (void)state;
    assert_non_null(ref);
    check_all_splits(TEXT_AGENT_THINKING, text, ref);
    assert_text(ref->reasoning, ref->n_reasoning, "r");
    assert_text(ref->content, ref->n_content, text + 9);
    assert_int_equal(ref->n_calls, 0);
    check_all_splits(0, text, ref);
    assert_text(ref->content, ref->n_content, text);
    assert_int_equal(ref->n_reasoning, 0);
    /* thinking that never ends: all reasoning */
    check_all_splits(TEXT_AGENT_THINKING | TEXT_AGENT_TOOLS, "still </thi", ref);
    assert_text(ref->reasoning, ref->n_reasoning, "still </thi");
    assert_int_equal(ref->n_content, 0);
    free(ref);
}

/* DeepSeek-V4.1's tags: a leading space in each name. */
#define B41       "<" DSML " calls>"
#define B41_E     "</" DSML " calls>"
#define I41(n)    "<" DSML " invoke name=\"" n "\">"
#define I41_E     "</" DSML " invoke>"
#define P41(n, s) "<" DSML " parameter name=\"" n "\" string=\"" s "\">"
#define P41_E     "</" DSML " parameter>"

static void test_v41_spaced_tags_are_calls_and_each_block_keeps_its_dialect(void **state)
{
    static const char text[] =
        "ok</think>Both.\n\n" B41 "\n" I41("edit") "\n" P41("path", "true") "a.c" P41_E "\n" P41(
            "line", "false") "12" P41_E "\n" I41_E "\n" B41_E "\n\n" BLOCK
                             "\n" INV("run") "\n" PAR("cmd", "true") "make" PAR_E "\n" INV_E
                                                                     "\n" BLOCK_E;
    /* a V4.1 block holding a V4 invoke is not a call */
    static const char mixed[] = "m\n\n" B41 "\n" INV("f") "\n" INV_E "\n" B41_E;
    transcript_t *ref = malloc(sizeof(*ref));

    (void)state;
    assert_non_null(ref);
    check_all_splits(TEXT_AGENT_THINKING | TEXT_AGENT_TOOLS, text, ref);
    assert_text(ref->reasoning, ref->n_reasoning, "ok");
    assert_text(ref->content, ref->n_content, "Both.");
    assert_int_equal(ref->n_calls, 2);
    assert_string_equal(ref->names[0], "edit");
    assert_text(ref->args[0], ref->n_args[0], "{\"path\": \"a.c\", \"line\": 12}");
    assert_string_equal(ref->names[1], "run");
    assert_text(ref->args[1], ref->n_args[1], "{\"cmd\": \"make\"}");
    assert_false(ref->unfinished);
    check_all_splits(TEXT_AGENT_TOOLS, mixed, ref);
    assert_text(ref->content, ref->n_content, mixed);
    assert_int_equal(ref->n_calls, 0);
    free(ref);
}

/* Feed one chunk; return the released text of `kind` (concatenated) in out. */
static size_t push_text(text_agentout_t *p, const char *chunk, text_agent_event_kind_t kind,
                        char *out, size_t n_out)
{
    const text_agent_event_t *ev;
    size_t n_ev;
    size_t n = 0;

    assert_int_equal(text_agentout_push(p, chunk, strlen(chunk), &ev, &n_ev), TDM_OK);
    for (size_t i = 0; i < n_ev; i++) {
        assert_int_equal(ev[i].kind, kind);
        assert_true(n + ev[i].n_text < n_out);
        memcpy(out + n, ev[i].text, ev[i].n_text);
        n += ev[i].n_text;
    }
    out[n] = '\0';
    return n;
}

static void test_only_a_possible_marker_start_is_held_back(void **state)
{
    text_agentout_t *p = NULL;
    char out[256];

    (void)state;
    assert_int_equal(text_agentout_create(TEXT_AGENT_TOOLS, 1, &p), TDM_OK);
    push_text(p, "abc\n", TEXT_AGENT_CONTENT, out, sizeof(out));
    assert_string_equal(out, "abc"); /* "\n" could open "\n\n<｜DSML｜tool_calls>" */
    push_text(p, "\n<\xEF\xBD", TEXT_AGENT_CONTENT, out, sizeof(out));
    assert_string_equal(out, "");
    push_text(p,
              "\x9C"
              "DSx",
              TEXT_AGENT_CONTENT, out, sizeof(out));
    assert_string_equal(out, "\n\n<\xEF\xBD\x9C"
                             "DSx");
    push_text(p, "caf\xC3", TEXT_AGENT_CONTENT, out, sizeof(out));
    assert_string_equal(out, "caf"); /* the half character waits */
    push_text(p, "\xA9!", TEXT_AGENT_CONTENT, out, sizeof(out));
    assert_string_equal(out, "\xC3\xA9!");
    text_agentout_destroy(p);
    assert_int_equal(text_agentout_create(TEXT_AGENT_THINKING, 1, &p), TDM_OK);
    push_text(p, "hmm <", TEXT_AGENT_REASONING, out, sizeof(out));
    assert_string_equal(out, "hmm ");
    push_text(p, "b>", TEXT_AGENT_REASONING, out, sizeof(out));
    assert_string_equal(out, "<b>");
    text_agentout_destroy(p);
}

static void test_call_ids_follow_the_seed(void **state)
{
    static const char text[] = BLOCK INV("f") INV_E BLOCK_E;
    text_agentout_t *a = NULL;
    text_agentout_t *b = NULL;
    const text_agent_event_t *ev;
    size_t n_ev;
    char id_a[40];

    (void)state;
    assert_int_equal(text_agentout_create(TEXT_AGENT_TOOLS, 1, &a), TDM_OK);
    assert_int_equal(text_agentout_create(TEXT_AGENT_TOOLS, 2, &b), TDM_OK);
    assert_int_equal(text_agentout_push(a, text, strlen(text), &ev, &n_ev), TDM_OK);
    assert_int_equal(n_ev, 3);
    assert_int_equal(ev[0].kind, TEXT_AGENT_CALL_BEGIN);
    snprintf(id_a, sizeof(id_a), "%s", ev[0].id);
    assert_int_equal(text_agentout_push(b, text, strlen(text), &ev, &n_ev), TDM_OK);
    assert_int_equal(n_ev, 3);
    assert_string_not_equal(id_a, ev[0].id);
    text_agentout_destroy(a);
    text_agentout_destroy(b);
}

static void test_bad_arguments_are_refused(void **state)
{
    text_agentout_t *p = NULL;
    const text_agent_event_t *ev;
    size_t n_ev;

    (void)state;
    assert_int_equal(text_agentout_create(1u << 5, 0, &p), TDM_ERR_INVALID_ARG);
    assert_null(p);
    assert_int_equal(text_agentout_create(0, 0, NULL), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_agentout_create(0, 0, &p), TDM_OK);
    assert_int_equal(text_agentout_push(p, NULL, 3, &ev, &n_ev), TDM_ERR_INVALID_ARG);
    assert_int_equal(text_agentout_push(p, NULL, 0, &ev, &n_ev), TDM_OK);
    assert_int_equal(n_ev, 0);
    text_agentout_destroy(p);
    text_agentout_destroy(NULL);
}

static void test_json_values_are_checked_by_the_grammar(void **state)
{
    static const char *const good[] = {
        "0",
        "-0",
        "3",
        " 12.5e-3 ",
        "1E+9",
        "123456789012345678901234567890",
        "true",
        "null",
        "\"a\\\"b\\u00e9\\n\"",
        "[]",
        "{}",
        "[1, [2, {\"a\": [false]}]]",
        "{\"a\":1,\"b\":\"x\"}",
        "\"\xE6\x9D\xB1\"",
    };
    static const char *const bad[] = {
        "",    " ",           "01",         "1.",       ".5",   "-",        "1e",    "+1",
        "tru", "nul",         "\"abc",      "\"a\\x\"", "[1,]", "{\"a\"}",  "{a:1}", "[1 2]",
        "1 2", "\"\\u12g4\"", "{\"a\":1,}", "NaN",      "'x'",  "\"a\nb\"",
    };
    char deep[200];

    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        assert_true(text_agentout_json_valid(good[i], strlen(good[i])));
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_false(text_agentout_json_valid(bad[i], strlen(bad[i])));
    }
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    assert_false(text_agentout_json_valid(deep, 200)); /* deeper than 64 */
    assert_true(text_agentout_json_valid(deep + 40, 120));
    assert_false(text_agentout_json_valid(NULL, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reasoning_content_and_two_calls_at_every_split),
        cmocka_unit_test(test_markup_that_is_not_a_call_is_released_as_content),
        cmocka_unit_test(test_unfinished_call_becomes_content_and_sets_unfinished),
        cmocka_unit_test(test_text_after_a_block_is_content_and_may_open_another),
        cmocka_unit_test(test_without_tools_dsml_is_content_and_without_thinking_think_is_content),
        cmocka_unit_test(test_v41_spaced_tags_are_calls_and_each_block_keeps_its_dialect),
        cmocka_unit_test(test_only_a_possible_marker_start_is_held_back),
        cmocka_unit_test(test_call_ids_follow_the_seed),
        cmocka_unit_test(test_bad_arguments_are_refused),
        cmocka_unit_test(test_json_values_are_checked_by_the_grammar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
