/* test_chat_dsv4.c - text/tokenizer.h DeepSeek-V4 chat rendering with tools, DSML tool calls,
 * tool results and thinking modes: the golden fixtures of tests/fixtures/chat_dsv4 (rendered
 * by the release's encoding_dsv4.py; source in that folder's README.md) byte for byte, the same
 * conversations as ids through the synthetic tokenizer (the DSML marker is one special token),
 * and the refusals. Needs no shared data. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "text/tokenizer.h"

#define FIXTURE_DIR "tests/fixtures/chat_dsv4"
#define MAX_CASES   64
#define VOCAB       4096u
#define DSML        "｜DSML｜"

/* A fixture conversation as the renderer's plain data (strings borrowed from `root`). */
typedef struct {
    json_t *root;
    text_chat_message_t *msgs;
    text_chat_tool_call_t *calls;
    size_t n_msgs;
    char *tools_json;
    text_chat_params_t params;
} conv_t;

static char *read_file(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n >= 0);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *n_out = (size_t)n;
    return buf;
}

static text_chat_role_t role_of(const char *name)
{
    if (strcmp(name, "system") == 0) {
        return TEXT_CHAT_SYSTEM;
    }
    if (strcmp(name, "user") == 0) {
        return TEXT_CHAT_USER;
    }
    if (strcmp(name, "assistant") == 0) {
        return TEXT_CHAT_ASSISTANT;
    }
    assert_string_equal(name, "tool");
    return TEXT_CHAT_TOOL;
}

static void set_str(const json_t *s, const char **text, size_t *n)
{
    if (json_is_string(s)) {
        *text = json_string_value(s);
        *n = json_string_length(s);
    }
}

/* Load fixture `path` (.json) into *c. */
static void load_conv(const char *path, conv_t *c)
{
    json_error_t jerr;
    json_t *messages, *tools, *item, *effort;
    size_t i, n_calls = 0, next_call = 0;

    memset(c, 0, sizeof(*c));
    c->root = json_load_file(path, 0, &jerr);
    if (c->root == NULL) {
        fail_msg("%s: %s", path, jerr.text);
    }
    messages = json_object_get(c->root, "messages");
    assert_true(json_is_array(messages));
    c->n_msgs = json_array_size(messages);
    json_array_foreach(messages, i, item)
    {
        n_calls += json_array_size(json_object_get(item, "tool_calls"));
    }
    c->msgs = calloc(c->n_msgs, sizeof(*c->msgs));
    c->calls = calloc(n_calls + 1, sizeof(*c->calls));
    assert_non_null(c->msgs);
    assert_non_null(c->calls);
    json_array_foreach(messages, i, item)
    {
        text_chat_message_t *m = &c->msgs[i];
        json_t *calls = json_object_get(item, "tool_calls");
        size_t k;
        json_t *call;
        m->role = role_of(json_string_value(json_object_get(item, "role")));
        set_str(json_object_get(item, "content"), &m->content, &m->content_bytes);
        set_str(json_object_get(item, "reasoning_content"), &m->reasoning, &m->reasoning_bytes);
        set_str(json_object_get(item, "tool_call_id"), &m->tool_call_id, &m->tool_call_id_bytes);
        m->tool_calls = c->calls + next_call;
        m->n_tool_calls = json_array_size(calls);
        json_array_foreach(calls, k, call)
        {
            text_chat_tool_call_t *tc = &c->calls[next_call++];
            json_t *fn = json_object_get(call, "function");
            set_str(json_object_get(call, "id"), &tc->id, &tc->id_bytes);
            set_str(json_object_get(fn, "name"), &tc->name, &tc->name_bytes);
            set_str(json_object_get(fn, "arguments"), &tc->arguments, &tc->arguments_bytes);
        }
    }
    text_chat_params_default(&c->params);
    if (json_is_true(json_object_get(c->root, "thinking"))) {
        c->params.flags |= TEXT_CHAT_THINKING;
    }
    effort = json_object_get(c->root, "reasoning_effort");
    if (json_is_string(effort) && strcmp(json_string_value(effort), "max") == 0) {
        c->params.flags |= TEXT_CHAT_REASONING_MAX;
    }
    tools = json_object_get(c->root, "tools");
    if (tools != NULL) {
        /* as the router passes them: compact JSON, key order kept */
        c->tools_json = json_dumps(tools, JSON_COMPACT);
        assert_non_null(c->tools_json);
        c->params.tools_json = c->tools_json;
        c->params.tools_json_bytes = strlen(c->tools_json);
    }
}

static void free_conv(conv_t *c)
{
    free(c->msgs);
    free(c->calls);
    free(c->tools_json);
    json_decref(c->root);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The fixture base names (without extension), sorted; returns the count. */
static size_t list_cases(char dir[1024], char *names[MAX_CASES])
{
    const char *src = getenv("TANDEM_SOURCE_DIR");
    DIR *d;
    struct dirent *e;
    size_t n = 0;

    snprintf(dir, 1024, "%s/%s", src != NULL ? src : ".", FIXTURE_DIR);
    d = opendir(dir);
    if (d == NULL) {
        fail_msg("cannot open %s (TANDEM_SOURCE_DIR=%s)", dir, src != NULL ? src : "unset");
    }
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 5 && strcmp(e->d_name + len - 5, ".json") == 0) {
            assert_true(n < MAX_CASES);
            names[n] = malloc(len - 4);
            assert_non_null(names[n]);
            memcpy(names[n], e->d_name, len - 5);
            names[n][len - 5] = '\0';
            n++;
        }
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]), by_name);
    return n;
}

/* Print where two byte strings first differ. */
static void show_difference(const char *name, const char *got, size_t n_got, const char *want,
                            size_t n_want)
{
    size_t i = 0;

    while (i < n_got && i < n_want && got[i] == want[i]) {
        i++;
    }
    print_message("%s: differs at byte %zu (got %zu bytes, want %zu)\n  got:  ...%.80s\n  want: "
                  "...%.80s\n",
                  name, i, n_got, n_want, got + (i > 20 ? i - 20 : 0),
                  want + (i > 20 ? i - 20 : 0));
}

static void test_fixtures_render_byte_for_byte(void **state)
{
    char dir[1024], path[1200];
    char *names[MAX_CASES];
    size_t n_cases, n_tools_cases = 0, n_thinking_cases = 0;

    (void)state;
    n_cases = list_cases(dir, names);
    assert_true(n_cases >= 12);
    for (size_t i = 0; i < n_cases; i++) {
        conv_t c;
        char *want, *got = NULL;
        size_t n_want, n_got = 0;
        snprintf(path, sizeof(path), "%s/%s.json", dir, names[i]);
        load_conv(path, &c);
        snprintf(path, sizeof(path), "%s/%s.txt", dir, names[i]);
        want = read_file(path, &n_want);
        assert_int_equal(text_chat_render(&c.params, c.msgs, c.n_msgs, &got, &n_got), TDM_OK);
        if (n_got != n_want || memcmp(got, want, n_want) != 0) {
            show_difference(names[i], got, n_got, want, n_want);
            fail_msg("fixture %s does not match", names[i]);
        }
        n_tools_cases += c.tools_json != NULL;
        n_thinking_cases += (c.params.flags & TEXT_CHAT_THINKING) != 0;
        free(got);
        free(want);
        free_conv(&c);
        free(names[i]);
    }
    /* the set covers both modes, with and without tools */
    assert_true(n_tools_cases >= 4 && n_tools_cases <= n_cases - 3);
    assert_true(n_thinking_cases >= 4 && n_thinking_cases <= n_cases - 4);
}

static text_tokenizer_t *load_synthetic(void)
{
    text_tokenizer_t *tok = NULL;
    char *json = NULL, err[256] = "";
    size_t n = 0;

    assert_int_equal(text_tokenizer_synthetic_hf_text(VOCAB, &json, &n, err, sizeof(err)), TDM_OK);
    assert_int_equal(text_tokenizer_load_hf_buffer(json, n, "synthetic", &tok, err, sizeof(err)),
                     TDM_OK);
    free(json);
    return tok;
}

/* Every fixture as ids equals its rendered text encoded with special tokens parsed, and the DSML
 * marker is the one special token at vocab-26. */
static void test_fixtures_encode_like_their_text(void **state)
{
    char dir[1024], path[1200];
    char *names[MAX_CASES];
    size_t n_cases, n_dsml_total = 0;
    text_tokenizer_t *tok = load_synthetic();
    int32_t dsml = -1;
    text_tokenizer_info_t info;

    (void)state;
    assert_int_equal(text_tokenizer_find_special(tok, DSML, &dsml), TDM_OK);
    assert_int_equal(dsml, (int32_t)VOCAB - 26);
    text_tokenizer_get_info(tok, &info);
    n_cases = list_cases(dir, names);
    for (size_t i = 0; i < n_cases; i++) {
        conv_t c;
        char *text = NULL;
        size_t n_text = 0, n_a = 0, n_b = 0, n_dsml = 0;
        int32_t *a = NULL, *b = NULL;
        snprintf(path, sizeof(path), "%s/%s.json", dir, names[i]);
        load_conv(path, &c);
        assert_int_equal(text_chat_render(&c.params, c.msgs, c.n_msgs, &text, &n_text), TDM_OK);
        assert_int_equal(text_chat_encode(tok, &c.params, c.msgs, c.n_msgs, &a, &n_a), TDM_OK);
        assert_int_equal(
            text_tokenizer_encode(tok, text, n_text, TEXT_TOKENIZE_PARSE_SPECIAL, &b, &n_b),
            TDM_OK);
        assert_int_equal(n_a, n_b);
        assert_memory_equal(a, b, n_a * sizeof(*a));
        for (size_t k = 0; k < n_a; k++) {
            n_dsml += a[k] == dsml;
        }
        /* one DSML token per occurrence of its text */
        for (const char *p = strstr(text, DSML); p != NULL; p = strstr(p + 1, DSML)) {
            n_dsml_total++;
            assert_true(n_dsml > 0);
            n_dsml--;
        }
        assert_int_equal(n_dsml, 0);
        text_tokens_free(a);
        text_tokens_free(b);
        free(text);
        free_conv(&c);
        free(names[i]);
    }
    assert_true(n_dsml_total > 100);
    text_tokenizer_destroy(tok);
}

/* DSML text inside content stays text: it cannot open a tool-call block. */
static void test_dsml_in_content_is_not_a_marker(void **state)
{
    static const char content[] = "<" DSML "tool_calls>";
    text_chat_message_t m = {
        .role = TEXT_CHAT_USER, .content = content, .content_bytes = sizeof(content) - 1};
    text_chat_params_t params;
    text_tokenizer_t *tok = load_synthetic();
    int32_t *ids = NULL, dsml = -1;
    size_t n_ids = 0;

    (void)state;
    text_chat_params_default(&params);
    assert_int_equal(text_tokenizer_find_special(tok, DSML, &dsml), TDM_OK);
    assert_int_equal(text_chat_encode(tok, &params, &m, 1, &ids, &n_ids), TDM_OK);
    for (size_t k = 0; k < n_ids; k++) {
        assert_int_not_equal(ids[k], dsml);
    }
    text_tokens_free(ids);
    text_tokenizer_destroy(tok);
}

static tdm_status_t render_status(const text_chat_params_t *params, const text_chat_message_t *m,
                                  size_t n)
{
    char *text = (char *)"untouched";
    size_t n_text = 0;
    tdm_status_t status = text_chat_render(params, m, n, &text, &n_text);

    if (status == TDM_OK) {
        free(text);
    } else {
        assert_string_equal(text, "untouched");
    }
    return status;
}

static void test_refusals(void **state)
{
    static const char *const bad_tools[] = {
        "{}",
        "[1]",
        "[{\"type\":\"function\"}]",
        "[{\"type\":\"retrieval\",\"function\":{\"name\":\"a\"}}]",
        "[{\"function\":{\"name\":\"a\"}}]",
        "[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}",
    };
    text_chat_tool_call_t call = {
        .name = "f", .name_bytes = 1, .arguments = "[1, 2]", .arguments_bytes = 6};
    text_chat_message_t msgs[2] = {
        {.role = TEXT_CHAT_USER, .content = "hi", .content_bytes = 2},
        {.role = TEXT_CHAT_ASSISTANT, .tool_calls = &call, .n_tool_calls = 1},
    };
    text_chat_params_t params;

    (void)state;
    text_chat_params_default(&params);
    /* arguments that are JSON but not an object */
    assert_int_equal(render_status(&params, msgs, 2), TDM_ERR_INVALID_ARG);
    /* ...while text that is not JSON is the encoder's {"arguments": raw} */
    call.arguments = "x=1";
    call.arguments_bytes = 3;
    assert_int_equal(render_status(&params, msgs, 2), TDM_OK);
    /* tool calls only on assistant messages, and only in the DSV4 format */
    msgs[1].role = TEXT_CHAT_USER;
    assert_int_equal(render_status(&params, msgs, 2), TDM_ERR_INVALID_ARG);
    msgs[1].role = TEXT_CHAT_ASSISTANT;
    params.format = TEXT_CHAT_FORMAT_DSV31;
    assert_int_equal(render_status(&params, msgs, 2), TDM_ERR_INVALID_ARG);
    msgs[1].n_tool_calls = 0;
    assert_int_equal(render_status(&params, msgs, 2), TDM_OK);
    params.tools_json = "[]";
    params.tools_json_bytes = 2;
    assert_int_equal(render_status(&params, msgs, 2), TDM_ERR_INVALID_ARG);
    /* malformed tools */
    text_chat_params_default(&params);
    for (size_t i = 0; i < sizeof(bad_tools) / sizeof(bad_tools[0]); i++) {
        params.tools_json = bad_tools[i];
        params.tools_json_bytes = strlen(bad_tools[i]);
        assert_int_equal(render_status(&params, msgs, 2), TDM_ERR_INVALID_ARG);
    }
    /* an empty tool list renders nothing, as the encoder's falsy `tools` */
    params.tools_json = "[]";
    params.tools_json_bytes = 2;
    assert_int_equal(render_status(&params, msgs, 2), TDM_OK);
    /* NULL pointers with lengths */
    params.tools_json = NULL;
    assert_int_equal(render_status(&params, msgs, 2), TDM_ERR_INVALID_ARG);
    params.tools_json_bytes = 0;
    msgs[0].role = TEXT_CHAT_TOOL;
    msgs[0].tool_call_id_bytes = 3;
    assert_int_equal(render_status(&params, msgs, 2), TDM_ERR_INVALID_ARG);
}

/* Tool definitions: "strict" and null members are not rendered; everything else is, in the
 * client's order, with Python's float repr. */
static void test_tool_schema_rendering(void **state)
{
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"x\":{\"type\":\"number\",\"maximum\":1e16,\"minimum\":0.1}}},\"strict\":true,"
        "\"name\":\"f\",\"description\":null}}]";
    static const char want[] = "{\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": "
                               "{\"type\": \"number\", \"maximum\": 1e+16, \"minimum\": 0.1}}}, "
                               "\"name\": \"f\"}\n";
    text_chat_message_t m = {.role = TEXT_CHAT_USER, .content = "q", .content_bytes = 1};
    text_chat_params_t params;
    char *text = NULL;
    size_t n_text = 0;

    (void)state;
    text_chat_params_default(&params);
    params.tools_json = tools;
    params.tools_json_bytes = sizeof(tools) - 1;
    assert_int_equal(text_chat_render(&params, &m, 1, &text, &n_text), TDM_OK);
    if (strstr(text, want) == NULL) {
        print_message("rendered: %s\n", text);
    }
    assert_non_null(strstr(text, want));
    assert_null(strstr(text, "\"strict\""));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_render_byte_for_byte),
        cmocka_unit_test(test_fixtures_encode_like_their_text),
        cmocka_unit_test(test_dsml_in_content_is_not_a_marker),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_tool_schema_rendering),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
