/* test_router_agent.c - router/validate.c with router/validate_agent.c: the agent-protocol
 * fields of a chat request (tools, tool_choice, parallel_tool_calls, thinking,
 * chat_template_kwargs, messages' tool_calls / tool_call_id / reasoning_content). Every golden
 * conversation of tests/fixtures/chat_dsv4 sent as a request body gives the ids of the
 * reference encoder's text; each refusal of validate_agent.h is a 400 naming its field; the
 * chat bodies POST /v1/responses writes pass the same checks.
 * Builds a tiny model with tandem-mkmodel (its synthetic tokenizer has the DSML token). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <jansson.h>

#include "router/model.h"
#include "router/responses.h"
#include "router/validate.h"
#include "text/tokenizer.h"

#define PATH_BYTES  4096
#define ERR_BYTES   512
#define FIXTURE_DIR "tests/fixtures/chat_dsv4"

typedef struct {
    router_model_t *model;
    const text_tokenizer_t *tok;
} fixture_t;

static int run_shell(const char *command)
{
    int rc = system(command);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int setup(void **state)
{
    const char *bin = getenv("TANDEM_BIN_DIR");
    const char *tmp = getenv("TANDEM_TEST_TMP");
    char dir[PATH_BYTES], command[PATH_BYTES * 4], err[ERR_BYTES] = "";
    router_model_params_t mp = {0};
    fixture_t *fx;

    if (bin == NULL || tmp == NULL) {
        print_message("TANDEM_BIN_DIR / TANDEM_TEST_TMP not set (run through ctest)\n");
        return -1;
    }
    snprintf(dir, sizeof(dir), "%s/router-agent-model", tmp);
    /* a model made before the synthetic vocabulary had the DSML token is made again */
    snprintf(command, sizeof(command),
             "grep -q DSML %s/tokenizer.json 2>/dev/null || { rm -rf %s && %s/tandem-mkmodel "
             "--log-level warn --preset tiny --seed 1 --out %s >/dev/null; }",
             dir, dir, bin, dir);
    if (run_shell(command) != 0) {
        return -1;
    }
    fx = calloc(1, sizeof(*fx));
    mp.model_dir = dir;
    mp.served_name = "tiny";
    if (fx == NULL || router_model_load(&mp, &fx->model, err, sizeof(err)) != TDM_OK) {
        print_message("router_model_load(%s): %s\n", dir, err);
        free(fx);
        return -1;
    }
    fx->tok = router_model_tokenizer(fx->model);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;

    router_model_destroy(fx->model);
    free(fx);
    return 0;
}

static tdm_status_t validate(const fixture_t *fx, router_api_t api, const char *body,
                             router_gen_request_t *req, router_apierr_t *err)
{
    return router_validate_request(fx->model, api, "application/json", body, strlen(body), 7, req,
                                   err);
}

/* A chat body with `fields` (JSON members, may be empty) and `messages` (a JSON array). */
static char *chat_body(const char *fields, const char *messages)
{
    size_t n = strlen(fields) + strlen(messages) + 64;
    char *body = malloc(n);

    assert_non_null(body);
    snprintf(body, n, "{\"model\":\"tiny\",\"max_tokens\":4%s%s,\"messages\":%s}",
             fields[0] != '\0' ? "," : "", fields, messages);
    return body;
}

static const char USER_ONLY[] = "[{\"role\":\"user\",\"content\":\"hi\"}]";
static const char WEATHER_TOOL[] =
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}";

/* ---- fixtures through the router ---------------------------------------------------------- */

/* Each fixture conversation, sent as a chat body, gives the ids of its golden text (encoded with
 * special tokens parsed). The thinking switch is sent in its three spellings in turn. */
static void test_fixture_requests_give_the_reference_ids(void **state)
{
    fixture_t *fx = *state;
    const char *src = getenv("TANDEM_SOURCE_DIR");
    char dir[PATH_BYTES], path[PATH_BYTES + 256];
    DIR *d;
    struct dirent *e;
    size_t n_cases = 0, n_refused = 0;

    snprintf(dir, sizeof(dir), "%s/%s", src != NULL ? src : ".", FIXTURE_DIR);
    d = opendir(dir);
    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        json_t *body;
        char *text, *body_text;
        json_error_t jerr;
        FILE *f;
        long n_text;
        int32_t *want = NULL;
        size_t n_want = 0;
        router_gen_request_t req;
        router_apierr_t err;
        tdm_status_t status;
        int thinking;
        if (len <= 5 || strcmp(e->d_name + len - 5, ".json") != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        body = json_load_file(path, 0, &jerr);
        assert_non_null(body);
        thinking = json_is_true(json_object_get(body, "thinking"));
        json_object_del(body, "note");
        json_object_del(body, "source");
        json_object_del(body, "thinking");
        switch (n_cases % 3) {
        case 0:
            json_object_set_new(body, "thinking",
                                json_pack("{s:s}", "type", thinking ? "enabled" : "disabled"));
            break;
        case 1:
            json_object_set_new(body, "chat_template_kwargs",
                                json_pack("{s:b}", "thinking", thinking));
            break;
        default:
            if (thinking) {
                json_object_set_new(body, "chat_template_kwargs",
                                    json_pack("{s:b}", "enable_thinking", 1));
            }
            break;
        }
        json_object_set_new(body, "model", json_string("tiny"));
        json_object_set_new(body, "max_tokens", json_integer(4));
        body_text = json_dumps(body, 0);
        assert_non_null(body_text);
        status = validate(fx, ROUTER_API_CHAT, body_text, &req, &err);
        if (strstr(e->d_name, "fallback_arguments") != NULL) {
            /* arguments that are not JSON render in the encoder but are refused at the door */
            assert_int_equal(status, TDM_ERR_INVALID_ARG);
            assert_string_equal(err.param, "messages");
            assert_non_null(strstr(err.message, "arguments"));
            n_refused++;
        } else {
            if (status != TDM_OK) {
                fail_msg("%s: %s", e->d_name, err.message);
            }
            assert_int_equal(req.thinking, thinking);
            snprintf(path + strlen(path) - 5, 6, ".txt");
            f = fopen(path, "rb");
            assert_non_null(f);
            fseek(f, 0, SEEK_END);
            n_text = ftell(f);
            fseek(f, 0, SEEK_SET);
            text = malloc((size_t)n_text + 1);
            assert_non_null(text);
            assert_int_equal(fread(text, 1, (size_t)n_text, f), (size_t)n_text);
            fclose(f);
            assert_int_equal(text_tokenizer_encode(fx->tok, text, (size_t)n_text,
                                                   TEXT_TOKENIZE_PARSE_SPECIAL, &want, &n_want),
                             TDM_OK);
            if (req.n_prompt_ids != n_want ||
                memcmp(req.prompt_ids, want, n_want * sizeof(*want)) != 0) {
                fail_msg("%s: %zu prompt ids, the reference text has %zu", e->d_name,
                         req.n_prompt_ids, n_want);
            }
            text_tokens_free(want);
            free(text);
            router_gen_request_fini(&req);
        }
        free(body_text);
        json_decref(body);
        n_cases++;
    }
    closedir(d);
    assert_true(n_cases >= 12);
    assert_int_equal(n_refused, 1);
}

/* ---- accepted fields ----------------------------------------------------------------------- */

static void test_fields_are_parsed_into_the_request(void **state)
{
    fixture_t *fx = *state;
    char *body;
    router_gen_request_t req;
    router_apierr_t err;
    json_t *tools;

    /* defaults: no tools, auto, parallel, not thinking */
    body = chat_body("", USER_ONLY);
    assert_int_equal(validate(fx, ROUTER_API_CHAT, body, &req, &err), TDM_OK);
    assert_int_equal(req.thinking, 0);
    assert_null(req.tools_json);
    assert_int_equal(req.n_tools, 0);
    assert_int_equal(req.tool_choice, ROUTER_TOOL_CHOICE_AUTO);
    assert_null(req.tool_choice_name);
    assert_int_equal(req.parallel_tool_calls, 1);
    router_gen_request_fini(&req);
    free(body);

    /* everything set; nulls dropped from the function, strict kept, order kept */
    body = chat_body(
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"run\",\"strict\":true,"
        "\"description\":null,\"parameters\":{\"type\":\"object\",\"properties\":{}}}},"
        "{\"function\":{\"name\":\"b-2\"},\"type\":\"function\"}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b-2\"}},"
        "\"parallel_tool_calls\":false,\"thinking\":{\"type\":\"enabled\"}",
        USER_ONLY);
    assert_int_equal(validate(fx, ROUTER_API_CHAT, body, &req, &err), TDM_OK);
    assert_int_equal(req.thinking, 1);
    assert_int_equal(req.n_tools, 2);
    assert_string_equal(req.tools_json,
                        "[{\"type\":\"function\",\"function\":{\"name\":\"run\",\"strict\":true,"
                        "\"parameters\":{\"type\":\"object\",\"properties\":{}}}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"b-2\"}}]");
    tools = json_loads(req.tools_json, 0, NULL);
    assert_true(json_is_array(tools));
    json_decref(tools);
    assert_int_equal(req.tool_choice, ROUTER_TOOL_CHOICE_NAMED);
    assert_string_equal(req.tool_choice_name, "b-2");
    assert_int_equal(req.parallel_tool_calls, 0);
    router_gen_request_fini(&req);
    free(body);

    /* string tool_choice values; "auto" and "none" need no tools */
    {
        static const struct {
            const char *fields;
            router_tool_choice_t choice;
        } cases[] = {
            {"\"tool_choice\":\"auto\"", ROUTER_TOOL_CHOICE_AUTO},
            {"\"tool_choice\":\"none\"", ROUTER_TOOL_CHOICE_NONE},
            {"\"tool_choice\":null", ROUTER_TOOL_CHOICE_AUTO},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            body = chat_body(cases[i].fields, USER_ONLY);
            assert_int_equal(validate(fx, ROUTER_API_CHAT, body, &req, &err), TDM_OK);
            assert_int_equal(req.tool_choice, cases[i].choice);
            router_gen_request_fini(&req);
            free(body);
        }
    }
    {
        char fields[1024];
        snprintf(fields, sizeof(fields), "\"tools\":[%s],\"tool_choice\":\"required\"",
                 WEATHER_TOOL);
        body = chat_body(fields, USER_ONLY);
        assert_int_equal(validate(fx, ROUTER_API_CHAT, body, &req, &err), TDM_OK);
        assert_int_equal(req.tool_choice, ROUTER_TOOL_CHOICE_REQUIRED);
        assert_int_equal(req.n_tools, 1);
        router_gen_request_fini(&req);
        free(body);
    }
}

/* The thinking switch changes the last prompt token (<think> vs </think>); the default is off. */
static void test_thinking_spellings_and_default(void **state)
{
    static const struct {
        const char *fields;
        int thinking;
    } cases[] = {
        {"", 0},
        {"\"thinking\":{\"type\":\"enabled\"}", 1},
        {"\"thinking\":{\"type\":\"disabled\"}", 0},
        {"\"chat_template_kwargs\":{\"thinking\":true}", 1},
        {"\"chat_template_kwargs\":{\"enable_thinking\":true}", 1},
        {"\"chat_template_kwargs\":{\"thinking\":false,\"enable_thinking\":false}", 0},
        {"\"thinking\":{\"type\":\"enabled\"},\"chat_template_kwargs\":{\"thinking\":true}", 1},
        {"\"thinking\":null,\"chat_template_kwargs\":{}", 0},
    };
    fixture_t *fx = *state;
    int32_t think = -1, end_think = -1;

    assert_int_equal(text_tokenizer_find_special(fx->tok, "<think>", &think), TDM_OK);
    assert_int_equal(text_tokenizer_find_special(fx->tok, "</think>", &end_think), TDM_OK);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *body = chat_body(cases[i].fields, USER_ONLY);
        router_gen_request_t req;
        router_apierr_t err;
        if (validate(fx, ROUTER_API_CHAT, body, &req, &err) != TDM_OK) {
            fail_msg("%s: %s", cases[i].fields, err.message);
        }
        assert_int_equal(req.thinking, cases[i].thinking);
        assert_int_equal(req.prompt_ids[req.n_prompt_ids - 1],
                         cases[i].thinking ? think : end_think);
        router_gen_request_fini(&req);
        free(body);
    }
}

/* ---- refusals ------------------------------------------------------------------------------ */

typedef struct {
    router_api_t api;
    const char *fields;   /* request members */
    const char *messages; /* NULL: USER_ONLY */
    const char *code;
    const char *param;
    const char *says; /* a piece of the message */
} refusal_t;

#define TOOL_A "{\"type\":\"function\",\"function\":{\"name\":\"a\"}}"
#define CALL_A(id, args)                                                                           \
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"" id "\",\"type\":"        \
    "\"function\",\"function\":{\"name\":\"a\",\"arguments\":" args "}}]}"

static void test_refusals_name_their_field(void **state)
{
    static const refusal_t cases[] = {
        /* tools */
        {ROUTER_API_CHAT, "\"tools\":{}", NULL, "invalid_type", "tools", "array"},
        {ROUTER_API_CHAT, "\"tools\":[]", NULL, "invalid_value", "tools", "1 to 128"},
        {ROUTER_API_CHAT, "\"tools\":[1]", NULL, "invalid_type", "tools", "object"},
        {ROUTER_API_CHAT, "\"tools\":[{\"type\":\"code_interpreter\"}]", NULL, "invalid_value",
         "tools", "\"function\""},
        {ROUTER_API_CHAT, "\"tools\":[{\"type\":\"function\"}]", NULL, "invalid_type", "tools",
         "'function' object"},
        {ROUTER_API_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]",
         NULL, "invalid_value", "tools", "name"},
        {ROUTER_API_CHAT, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]", NULL,
         "invalid_value", "tools", "name"},
        {ROUTER_API_CHAT,
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":[]}}]",
         NULL, "invalid_type", "tools", "parameters"},
        {ROUTER_API_CHAT,
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"description\":5}}]",
         NULL, "invalid_type", "tools", "description"},
        {ROUTER_API_CHAT,
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"strict\":\"yes\"}}]",
         NULL, "invalid_type", "tools", "strict"},
        {ROUTER_API_CHAT,
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"examples\":[]}}]", NULL,
         "unsupported_parameter", "tools", "examples"},
        {ROUTER_API_CHAT,
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"},\"cache\":true}]", NULL,
         "unsupported_parameter", "tools", "cache"},
        {ROUTER_API_CHAT, "\"tools\":[" TOOL_A "," TOOL_A "]", NULL, "invalid_value", "tools",
         "two tools"},
        /* tool_choice */
        {ROUTER_API_CHAT, "\"tool_choice\":\"any\"", NULL, "invalid_value", "tool_choice", "any"},
        {ROUTER_API_CHAT, "\"tool_choice\":3", NULL, "invalid_type", "tool_choice", "string"},
        {ROUTER_API_CHAT, "\"tool_choice\":\"required\"", NULL, "invalid_value", "tool_choice",
         "needs 'tools'"},
        {ROUTER_API_CHAT, "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"a\"}}",
         NULL, "invalid_value", "tool_choice", "needs 'tools'"},
        {ROUTER_API_CHAT,
         "\"tools\":[" TOOL_A "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
         "\"b\"}}",
         NULL, "invalid_value", "tool_choice", "not one of"},
        {ROUTER_API_CHAT, "\"tools\":[" TOOL_A "],\"tool_choice\":{\"type\":\"function\"}", NULL,
         "invalid_value", "tool_choice", "named"},
        {ROUTER_API_CHAT,
         "\"tools\":[" TOOL_A "],\"tool_choice\":{\"type\":\"allowed_tools\",\"function\":"
         "{\"name\":\"a\"}}",
         NULL, "invalid_value", "tool_choice", "named"},
        /* parallel_tool_calls */
        {ROUTER_API_CHAT, "\"parallel_tool_calls\":1", NULL, "invalid_type", "parallel_tool_calls",
         "boolean"},
        /* thinking */
        {ROUTER_API_CHAT, "\"thinking\":true", NULL, "invalid_type", "thinking", "object"},
        {ROUTER_API_CHAT, "\"thinking\":{\"type\":\"on\"}", NULL, "invalid_value", "thinking",
         "enabled"},
        {ROUTER_API_CHAT, "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":100}", NULL,
         "invalid_value", "thinking", "budget_tokens"},
        {ROUTER_API_CHAT, "\"chat_template_kwargs\":[]", NULL, "invalid_type",
         "chat_template_kwargs", "object"},
        {ROUTER_API_CHAT, "\"chat_template_kwargs\":{\"thinking\":\"yes\"}", NULL, "invalid_type",
         "chat_template_kwargs", "boolean"},
        {ROUTER_API_CHAT, "\"chat_template_kwargs\":{\"reasoning_effort\":\"max\"}", NULL,
         "invalid_value", "chat_template_kwargs", "reasoning_effort"},
        {ROUTER_API_CHAT,
         "\"thinking\":{\"type\":\"disabled\"},\"chat_template_kwargs\":{\"thinking\":true}", NULL,
         "invalid_value", "chat_template_kwargs", "disagree"},
        /* reasoning_effort */
        {ROUTER_API_CHAT, "\"reasoning_effort\":\"medium\"", NULL, "invalid_value",
         "reasoning_effort", "medium"},
        {ROUTER_API_CHAT, "\"reasoning_effort\":5", NULL, "invalid_type", "reasoning_effort",
         "string"},
        {ROUTER_API_COMPLETIONS, "\"reasoning_effort\":\"max\"", NULL, "unsupported_parameter",
         "reasoning_effort", "chat"},
        /* deprecated function calling, and chat-only fields on completions */
        {ROUTER_API_CHAT, "\"functions\":[{\"name\":\"a\"}]", NULL, "unsupported_parameter",
         "functions", "tools"},
        {ROUTER_API_CHAT, "\"function_call\":\"auto\"", NULL, "unsupported_parameter",
         "function_call", "tools"},
        {ROUTER_API_COMPLETIONS, "\"tools\":[" TOOL_A "]", NULL, "unsupported_parameter", "tools",
         "chat"},
        {ROUTER_API_COMPLETIONS, "\"thinking\":{\"type\":\"enabled\"}", NULL,
         "unsupported_parameter", "thinking", "chat"},
        /* messages */
        {ROUTER_API_CHAT, "", "[{\"role\":\"user\",\"content\":\"q\",\"tool_calls\":[]}]",
         "invalid_value", "messages", "only assistant"},
        {ROUTER_API_CHAT, "", "[{\"role\":\"user\",\"content\":\"q\"}," CALL_A("c", "5") "]",
         "invalid_type", "messages", "arguments"},
        {ROUTER_API_CHAT, "", "[{\"role\":\"user\",\"content\":\"q\"}," CALL_A("c", "\"[1]\"") "]",
         "invalid_value", "messages", "JSON text of an object"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"}," CALL_A("c", "\"{oops\"") "]", "invalid_value",
         "messages", "JSON text of an object"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":{}}]",
         "invalid_type", "messages", "array"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"type\":"
         "\"function\",\"function\":{\"name\":\"a<b\",\"arguments\":\"{}\"}}]}]",
         "invalid_value", "messages", "name"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"type\":"
         "\"custom\",\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}}]}]",
         "invalid_value", "messages", "\"function\""},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":"
         "1,\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}}]}]",
         "invalid_type", "messages", "id"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"function_call\":{"
         "\"name\":\"a\",\"arguments\":\"{}\"}}]",
         "unsupported_parameter", "messages", "function_call"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"}," CALL_A("c", "\"{}\"") ",{\"role\":\"tool\","
                                                                         "\"content\":\"r\"}]",
         "missing_parameter", "messages", "tool_call_id"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"}," CALL_A(
             "c", "\"{}\"") ",{\"role\":\"tool\",\"tool_call_id\":\"d\",\"content\":\"r\"}]",
         "invalid_value", "messages", "does not answer"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"tool\",\"tool_call_id\":\"c\","
         "\"content\":\"r\"}]",
         "invalid_value", "messages", "does not answer"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"}," CALL_A(
             "c", "\"{}\"") ",{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\","
                            "\"tool_call_id\":\"c\",\"content\":\"r\"}]",
         "invalid_value", "messages", "does not answer"},
        {ROUTER_API_CHAT, "", "[{\"role\":\"user\",\"content\":\"q\",\"tool_call_id\":\"c\"}]",
         "invalid_value", "messages", "only tool messages"},
        {ROUTER_API_CHAT, "",
         "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\","
         "\"reasoning_content\":1}]",
         "invalid_type", "messages", "reasoning_content"},
    };
    fixture_t *fx = *state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const refusal_t *c = &cases[i];
        char *body;
        router_gen_request_t req;
        router_apierr_t err;
        if (c->api == ROUTER_API_CHAT) {
            body = chat_body(c->fields, c->messages != NULL ? c->messages : USER_ONLY);
        } else {
            size_t n = strlen(c->fields) + 64;
            body = malloc(n);
            assert_non_null(body);
            snprintf(body, n, "{\"model\":\"tiny\",\"prompt\":\"x\",%s}", c->fields);
        }
        if (validate(fx, c->api, body, &req, &err) != TDM_ERR_INVALID_ARG) {
            fail_msg("case %zu accepted: %s", i, body);
        }
        if (err.http_status != 400 || strcmp(err.code, c->code) != 0 || err.param == NULL ||
            strcmp(err.param, c->param) != 0 || strstr(err.message, c->says) == NULL) {
            fail_msg("case %zu (%s): got %d %s param=%s: %s", i, body, err.http_status, err.code,
                     err.param != NULL ? err.param : "(null)", err.message);
        }
        /* a refused request owns nothing */
        assert_null(req.tools_json);
        assert_null(req.prompt_ids);
        free(body);
    }
}

/* Tool results answer the calls of the assistant message right before them, in any order, and
 * arguments may come as an object (passed on as its JSON text). */
static void test_tool_rounds_are_accepted(void **state)
{
    static const char messages[] =
        "[{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
        "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":{\"city\":\"Oslo\"}}},"
        "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\": \\\"Rome\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"20 C\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":[{\"type\":\"text\",\"text\":"
        "\"-3 C\"}]}]";
    fixture_t *fx = *state;
    char fields[1024], *body, *text = NULL;
    router_gen_request_t req;
    router_apierr_t err;
    size_t n_text = 0;

    snprintf(fields, sizeof(fields), "\"tools\":[%s]", WEATHER_TOOL);
    body = chat_body(fields, messages);
    if (validate(fx, ROUTER_API_CHAT, body, &req, &err) != TDM_OK) {
        fail_msg("%s", err.message);
    }
    assert_int_equal(
        text_detok_decode(fx->tok, req.prompt_ids, req.n_prompt_ids, 0, &text, &n_text), TDM_OK);
    /* results sorted by call order: Oslo's (c1) first */
    assert_non_null(strstr(text, "<tool_result>-3 C</tool_result>\n\n<tool_result>20 C"
                                 "</tool_result><｜Assistant｜></think>"));
    assert_non_null(strstr(text, "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo"
                                 "</｜DSML｜parameter>"));
    assert_non_null(strstr(text, "{\"name\": \"get_weather\", \"description\": \"Weather\""));
    free(text);
    router_gen_request_fini(&req);
    free(body);
}

/* Chat bodies that POST /v1/responses writes (router/responses.c) pass these checks: function
 * tools, a named tool_choice, reasoning -> thinking, function calls and their outputs. */
static void test_responses_rewrites_pass_the_chat_checks(void **state)
{
    static const char *const bodies[] = {
        "{\"model\":\"tiny\",\"instructions\":\"be brief\",\"input\":\"hi\","
        "\"max_output_tokens\":9,\"reasoning\":{\"effort\":\"high\"},\"tools\":[{\"type\":"
        "\"function\",\"name\":\"ls\",\"description\":\"list\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{}},\"strict\":true}],\"tool_choice\":{\"type\":"
        "\"function\",\"name\":\"ls\"}}",
        "{\"model\":\"tiny\",\"max_output_tokens\":9,\"tools\":[{\"type\":\"function\","
        "\"name\":\"ls\"},{\"type\":\"function\",\"name\":\"cat\"}],\"input\":[{\"role\":"
        "\"developer\",\"content\":\"d\"},{\"type\":\"message\",\"role\":\"user\","
        "\"content\":[{\"type\":\"input_text\",\"text\":\"a\"}]},{\"type\":\"reasoning\","
        "\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":"
        "\"think\"}]},{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"ls\","
        "\"arguments\":\"{}\"},{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":"
        "\"cat\",\"arguments\":\"{\\\"p\\\":1}\"},{\"type\":\"function_call_output\","
        "\"call_id\":\"c2\",\"output\":\"x\"},{\"type\":\"function_call_output\","
        "\"call_id\":\"c1\",\"output\":\"x.c\"}]}",
    };
    fixture_t *fx = *state;
    router_responses_t *store = NULL;

    assert_int_equal(router_responses_create(4, &store), TDM_OK);
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        router_responses_req_t rreq;
        router_gen_request_t req;
        router_apierr_t err;
        if (router_responses_request(store, bodies[i], strlen(bodies[i]), i + 1, 0, &rreq, &err) !=
            TDM_OK) {
            fail_msg("responses %zu: %s", i, err.message);
        }
        if (validate(fx, ROUTER_API_CHAT, rreq.chat_body, &req, &err) != TDM_OK) {
            fail_msg("chat body %zu refused (%s): %s", i, err.message, rreq.chat_body);
        }
        assert_non_null(req.tools_json);
        if (i == 0) {
            assert_int_equal(req.thinking, 1);
            assert_int_equal(req.tool_choice, ROUTER_TOOL_CHOICE_NAMED);
            assert_string_equal(req.tool_choice_name, "ls");
        } else {
            assert_int_equal(req.n_tools, 2);
        }
        router_gen_request_fini(&req);
        router_responses_req_fini(&rreq);
    }
    router_responses_destroy(store);
}

/* The router's own output may hold U+0000 (a model can sample the NUL byte; the stream sends it
 * as "\u0000"): an agent that sends that text back in its history is served, and the character
 * is kept, not cut (issue 16, scripts/chaos seed 11: such next turns got 400 "malformed JSON
 * body: \u0000 is not allowed"). */
static void test_a_nul_character_sent_back_is_accepted_and_kept(void **state)
{
    fixture_t *fx = *state;
    router_gen_request_t req;
    router_apierr_t err;
    size_t n_with, n_without;
    char *body;

    body = chat_body("", "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
                         "\"content\":\"!F\\u0000X\"},{\"role\":\"user\",\"content\":\"go\"}]");
    if (validate(fx, ROUTER_API_CHAT, body, &req, &err) != TDM_OK) {
        fail_msg("refused: %s", err.message);
    }
    free(body);
    n_with = req.n_prompt_ids;
    router_gen_request_fini(&req);
    body = chat_body("", "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
                         "\"content\":\"!FX\"},{\"role\":\"user\",\"content\":\"go\"}]");
    assert_int_equal(validate(fx, ROUTER_API_CHAT, body, &req, &err), TDM_OK);
    free(body);
    n_without = req.n_prompt_ids;
    router_gen_request_fini(&req);
    assert_true(n_with > n_without); /* the NUL is a token of the prompt, not the end of it */
    /* completions: the same */
    assert_int_equal(validate(fx, ROUTER_API_COMPLETIONS,
                              "{\"model\":\"tiny\",\"prompt\":\"a\\u0000b\",\"max_tokens\":2}",
                              &req, &err),
                     TDM_OK);
    assert_true(req.n_prompt_ids >= 3);
    router_gen_request_fini(&req);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_requests_give_the_reference_ids),
        cmocka_unit_test(test_fields_are_parsed_into_the_request),
        cmocka_unit_test(test_thinking_spellings_and_default),
        cmocka_unit_test(test_refusals_name_their_field),
        cmocka_unit_test(test_tool_rounds_are_accepted),
        cmocka_unit_test(test_responses_rewrites_pass_the_chat_checks),
        cmocka_unit_test(test_a_nul_character_sent_back_is_accepted_and_kept),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
