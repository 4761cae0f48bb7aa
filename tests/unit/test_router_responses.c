/* test_router_responses.c - POST /v1/responses rewritten onto the chat pipeline
 * (router/responses.h): the request rewrite and its refusals, the whole Response object, the
 * typed stream events (split at every byte), and previous_response_id chaining through the
 * store. Pure translation: no router, no workers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "router/responses.h"

static json_t *chat_of(const router_responses_req_t *req)
{
    json_t *chat = json_loadb(req->chat_body, req->n_chat_body, 0, NULL);
    assert_non_null(chat);
    return chat;
}

static void rewrite_ok(router_responses_t *store, const char *body, router_responses_req_t *req)
{
    router_apierr_t err;
    tdm_status_t st = router_responses_request(store, body, strlen(body), 7, 0, req, &err);
    if (st != TDM_OK) {
        fail_msg("refused: %s", err.message);
    }
}

static void test_request_rewrite(void **state)
{
    router_responses_t *store;
    router_responses_req_t req;
    json_t *chat;
    json_t *msgs;
    (void)state;

    assert_int_equal(router_responses_create(8, &store), TDM_OK);
    rewrite_ok(store,
               "{\"model\":\"m\",\"instructions\":\"be brief\",\"input\":\"hi\","
               "\"max_output_tokens\":9,\"temperature\":0,\"seed\":3,\"reasoning\":{\"effort\":"
               "\"high\"},\"tools\":[{\"type\":\"function\",\"name\":\"ls\",\"description\":"
               "\"list\",\"parameters\":{\"type\":\"object\",\"properties\":{}},\"strict\":true}],"
               "\"tool_choice\":{\"type\":\"function\",\"name\":\"ls\"},\"text\":{\"format\":{"
               "\"type\":\"json_schema\",\"name\":\"x\",\"schema\":{\"type\":\"object\"}}},"
               "\"stream\":true,\"store\":false}",
               &req);
    assert_true(req.stream);
    assert_false(req.store);
    assert_null(req.session_id);
    assert_memory_equal(req.id, "resp_", 5);
    assert_int_equal(strlen(req.id), ROUTER_RESPONSES_ID_BYTES);
    chat = chat_of(&req);
    msgs = json_object_get(chat, "messages");
    assert_int_equal(json_array_size(msgs), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "role")),
                        "system");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "content")),
                        "be brief");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
                        "hi");
    assert_int_equal(json_integer_value(json_object_get(chat, "max_tokens")), 9);
    assert_int_equal(json_integer_value(json_object_get(chat, "seed")), 3);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(chat, "thinking"), "type")), "enabled");
    assert_true(json_is_true(
        json_object_get(json_object_get(chat, "stream_options"), "include_usage")));
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(json_object_get(chat, "tools"), 0),
                                            "function"),
                            "name")),
                        "ls");
    assert_null(json_object_get(json_object_get(json_array_get(json_object_get(chat, "tools"), 0),
                                                "function"),
                                "strict"));
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(chat, "tool_choice"), "function"),
                            "name")),
                        "ls");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(chat, "response_format"),
                                            "json_schema"),
                            "name")),
                        "x");
    json_decref(chat);
    router_responses_req_fini(&req);

    /* Items: a reasoning item attaches to the assistant call after it; a call's output is a
     * tool message; developer is system. */
    rewrite_ok(store,
               "{\"model\":\"m\",\"input\":[{\"role\":\"developer\",\"content\":\"d\"},"
               "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
               "\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
               "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":"
               "\"reasoning_text\",\"text\":\"think\"}]},"
               "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"ls\",\"arguments\":"
               "\"{}\"},{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"cat\","
               "\"arguments\":\"{\\\"p\\\":1}\"},"
               "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"x.c\"}]}",
               &req);
    chat = chat_of(&req);
    msgs = json_object_get(chat, "messages");
    assert_int_equal(json_array_size(msgs), 4);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "role")),
                        "system");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
                        "ab");
    {
        json_t *a = json_array_get(msgs, 2);
        json_t *calls = json_object_get(a, "tool_calls");
        assert_string_equal(json_string_value(json_object_get(a, "role")), "assistant");
        assert_true(json_is_null(json_object_get(a, "content")));
        assert_string_equal(json_string_value(json_object_get(a, "reasoning_content")), "think");
        assert_int_equal(json_array_size(calls), 2);
        assert_string_equal(json_string_value(json_object_get(json_array_get(calls, 1), "id")),
                            "c2");
        assert_string_equal(
            json_string_value(json_object_get(
                json_object_get(json_array_get(calls, 1), "function"), "arguments")),
            "{\"p\":1}");
    }
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 3), "role")),
                        "tool");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(msgs, 3), "tool_call_id")), "c1");
    json_decref(chat);
    router_responses_req_fini(&req);
    router_responses_destroy(store);
}

static void refused(router_responses_t *store, const char *body, const char *code,
                    const char *param)
{
    router_responses_req_t req;
    router_apierr_t err;

    memset(&err, 0, sizeof(err));
    assert_int_equal(router_responses_request(store, body, strlen(body), 1, 0, &req, &err),
                     TDM_ERR_INVALID_ARG);
    assert_int_equal(err.http_status, 400);
    assert_string_equal(err.code, code);
    if (param != NULL) {
        assert_non_null(err.param);
        assert_string_equal(err.param, param);
    }
    assert_null(req.chat_body);
}

static void test_refusals_name_the_field(void **state)
{
    router_responses_t *store;
    (void)state;

    assert_int_equal(router_responses_create(8, &store), TDM_OK);
    refused(store, "[1]", "invalid_json", NULL);
    refused(store, "{\"model\":\"m\"}", "missing_parameter", "input");
    refused(store, "{\"model\":\"m\",\"input\":\"x\",\"frobnicate\":1}", "unsupported_parameter",
            NULL);
    refused(store, "{\"model\":\"m\",\"input\":\"x\",\"include\":[\"a\"]}",
            "unsupported_parameter", "include");
    refused(store, "{\"model\":\"m\",\"input\":\"x\",\"truncation\":\"auto\"}", "invalid_value",
            "truncation");
    refused(store, "{\"model\":\"m\",\"input\":5}", "invalid_type", "input");
    refused(store,
            "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
            "\"input_image\",\"image_url\":\"x\"}]}]}",
            "invalid_value", "input");
    refused(store, "{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}",
            "invalid_value", "input");
    refused(store,
            "{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}",
            "invalid_value", "input");
    refused(store, "{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"web_search_preview\"}]}",
            "invalid_value", "tools");
    refused(store, "{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":{\"type\":\"file_search\"}}",
            "invalid_value", "tool_choice");
    refused(store,
            "{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}",
            "invalid_value", "text");
    refused(store, "{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":\"resp_nope\"}",
            "invalid_value", "previous_response_id");
    refused(store, "{\"model\":\"m\",\"input\":\"x\",\"stream\":\"yes\"}", "invalid_type",
            "stream");
    assert_int_equal(router_responses_count(store), 0);
    router_responses_destroy(store);
}

/* A chat answer with reasoning, text and two tool calls, ended by the calls. */
static const char CHAT_WHOLE[] =
    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,"
    "\"message\":{\"role\":\"assistant\",\"reasoning_content\":\"plan\",\"content\":\"ok\","
    "\"tool_calls\":[{\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"ls\","
    "\"arguments\":\"{\\\"d\\\":\\\"/\\\"}\"}},{\"id\":\"call_b\",\"type\":\"function\","
    "\"function\":{\"name\":\"pwd\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}],"
    "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,\"total_tokens\":15,"
    "\"prompt_tokens_details\":{\"cached_tokens\":4}}}";

/* The same answer as chat chunks (with a keep-alive comment). */
static const char CHAT_SSE[] =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"reasoning_content\":"
    "\"pl\"},\"finish_reason\":null}]}\n\n"
    ": keep-alive\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"an\"},"
    "\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\","
    "\"type\":\"function\",\"function\":{\"name\":\"ls\",\"arguments\":\"\"}}]},"
    "\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{"
    "\"arguments\":\"{\\\"d\\\":\"}}]},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{"
    "\"arguments\":\"\\\"/\\\"}\"}}]},\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\","
    "\"type\":\"function\",\"function\":{\"name\":\"pwd\",\"arguments\":\"{}\"}}]},"
    "\"finish_reason\":null}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,"
    "\"total_tokens\":15,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n"
    "data: [DONE]\n\n";

static void check_output(const json_t *output)
{
    assert_int_equal(json_array_size(output), 4);
    const char *types[4] = {"reasoning", "message", "function_call", "function_call"};
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(json_string_value(json_object_get(json_array_get(output, i), "type")),
                            types[i]);
    }
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(json_array_get(output, 0), "content"),
                                           0),
                            "text")),
                        "plan");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(json_array_get(output, 1), "content"),
                                           0),
                            "text")),
                        "ok");
    assert_string_equal(json_string_value(json_object_get(json_array_get(output, 2), "call_id")),
                        "call_a");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(output, 2), "arguments")),
        "{\"d\":\"/\"}");
    assert_string_equal(json_string_value(json_object_get(json_array_get(output, 3), "name")),
                        "pwd");
}

static void test_whole_response_and_chain(void **state)
{
    router_responses_t *store;
    router_responses_req_t req;
    router_responses_req_t next;
    size_t n = 0;
    char *body;
    json_t *obj;
    json_t *chat;
    json_t *msgs;
    (void)state;

    assert_int_equal(router_responses_create(2, &store), TDM_OK);
    rewrite_ok(store, "{\"model\":\"m\",\"instructions\":\"sys\",\"input\":\"go\"}", &req);
    body = router_responses_body(store, &req, CHAT_WHOLE, strlen(CHAT_WHOLE), "sess-1", &n);
    assert_non_null(body);
    assert_int_equal(n, strlen(body));
    obj = json_loads(body, 0, NULL);
    assert_non_null(obj);
    assert_string_equal(json_string_value(json_object_get(obj, "object")), "response");
    assert_string_equal(json_string_value(json_object_get(obj, "id")), req.id);
    assert_string_equal(json_string_value(json_object_get(obj, "status")), "completed");
    assert_string_equal(json_string_value(json_object_get(obj, "instructions")), "sys");
    assert_string_equal(json_string_value(json_object_get(obj, "output_text")), "ok");
    check_output(json_object_get(obj, "output"));
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(obj, "usage"), "total_tokens")), 15);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(json_object_get(obj, "usage"), "input_tokens_details"),
                         "cached_tokens")),
                     4);
    assert_int_equal(router_responses_count(store), 1);

    /* Chained: the stored conversation (without the old instructions) comes first, the turn
     * runs on the stored session, and the call outputs follow as tool messages. */
    char chain[512];
    snprintf(chain, sizeof(chain),
             "{\"model\":\"m\",\"previous_response_id\":\"%s\",\"instructions\":\"new\","
             "\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"call_a\",\"output\":"
             "\"bin\"},{\"type\":\"function_call_output\",\"call_id\":\"call_b\",\"output\":"
             "\"/\"}]}",
             req.id);
    rewrite_ok(store, chain, &next);
    assert_non_null(next.session_id);
    assert_string_equal(next.session_id, "sess-1");
    chat = chat_of(&next);
    msgs = json_object_get(chat, "messages");
    assert_int_equal(json_array_size(msgs), 5);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "content")),
                        "new");
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
                        "go");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(msgs, 2), "reasoning_content")),
        "plan");
    assert_int_equal(json_array_size(json_object_get(json_array_get(msgs, 2), "tool_calls")),
                     2);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(msgs, 4), "tool_call_id")), "call_b");
    json_decref(chat);
    router_responses_req_fini(&next);

    /* A length-ended answer is incomplete, and a chat error passes through unchanged. */
    free(body);
    json_decref(obj);
    {
        const char *cut = "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                          "\"content\":\"par\"},\"finish_reason\":\"length\"}]}";
        body = router_responses_body(store, &req, cut, strlen(cut), "s", NULL);
        obj = json_loads(body, 0, NULL);
        assert_string_equal(json_string_value(json_object_get(obj, "status")), "incomplete");
        assert_string_equal(json_string_value(json_object_get(
                                json_object_get(obj, "incomplete_details"), "reason")),
                            "max_output_tokens");
        free(body);
        json_decref(obj);
        const char *e = "{\"error\":{\"message\":\"m\",\"type\":\"t\",\"code\":\"c\"}}";
        body = router_responses_body(store, &req, e, strlen(e), "s", NULL);
        obj = json_loads(body, 0, NULL);
        assert_non_null(json_object_get(obj, "error"));
        assert_null(json_object_get(obj, "output"));
        free(body);
        json_decref(obj);
    }
    /* The error was not stored; the store holds at most 2 (the oldest goes first). */
    assert_int_equal(router_responses_count(store), 2);
    {
        router_responses_req_t other;
        rewrite_ok(store, "{\"model\":\"m\",\"input\":\"x\"}", &other);
        other.id[6] ^= 1;
        body = router_responses_body(store, &other, CHAT_WHOLE, strlen(CHAT_WHOLE), "s", NULL);
        assert_non_null(body);
        free(body);
        assert_int_equal(router_responses_count(store), 2);
        router_responses_req_fini(&other);
    }
    router_responses_req_fini(&req);
    router_responses_destroy(store);
}

/* Parse the typed events of a stream: returns the array of data objects, checks event names
 * match each data's type and sequence numbers count up from 0. */
static json_t *parse_events(const char *text)
{
    json_t *events = json_array();
    const char *p = text;
    json_int_t seq = 0;

    while (*p != '\0') {
        const char *end = strstr(p, "\n\n");
        char name[128];
        const char *data;
        json_t *obj;
        assert_non_null(end);
        if (p[0] == ':') {
            p = end + 2;
            continue;
        }
        assert_memory_equal(p, "event: ", 7);
        data = strstr(p, "\ndata: ");
        assert_true(data != NULL && data < end);
        snprintf(name, sizeof(name), "%.*s", (int)(data - p - 7), p + 7);
        obj = json_loadb(data + 7, (size_t)(end - data - 7), 0, NULL);
        assert_non_null(obj);
        assert_string_equal(json_string_value(json_object_get(obj, "type")), name);
        assert_int_equal(json_integer_value(json_object_get(obj, "sequence_number")), seq++);
        json_array_append_new(events, obj);
        p = end + 2;
    }
    return events;
}

static char *run_stream(router_responses_t *store, const router_responses_req_t *req,
                        size_t split)
{
    router_responses_stream_t *s;
    char *out = calloc(1, 65536);
    size_t n_out = 0;
    size_t n = strlen(CHAT_SSE);

    assert_int_equal(router_responses_stream_create(store, req, "sess-2", &s), TDM_OK);
    for (size_t at = 0; at < n; at += split) {
        size_t step = n - at < split ? n - at : split;
        assert_int_equal(router_responses_stream_feed(s, CHAT_SSE + at, step), TDM_OK);
        n_out += router_responses_stream_take(s, out + n_out, 65535 - n_out);
    }
    assert_true(router_responses_stream_done(s));
    assert_int_equal(router_responses_stream_take(s, out + n_out, 65535 - n_out), 0);
    router_responses_stream_destroy(s);
    return out;
}

static void test_stream_events_at_every_split(void **state)
{
    router_responses_t *store;
    router_responses_req_t req;
    char *whole;
    json_t *events;
    json_t *last;
    (void)state;

    assert_int_equal(router_responses_create(4, &store), TDM_OK);
    rewrite_ok(store, "{\"model\":\"m\",\"input\":\"go\",\"stream\":true}", &req);
    whole = run_stream(store, &req, strlen(CHAT_SSE));
    events = parse_events(whole);
    assert_string_equal(json_string_value(json_object_get(json_array_get(events, 0), "type")),
                        "response.created");
    assert_string_equal(json_string_value(json_object_get(json_array_get(events, 1), "type")),
                        "response.in_progress");
    last = json_array_get(events, json_array_size(events) - 1);
    assert_string_equal(json_string_value(json_object_get(last, "type")), "response.completed");
    check_output(json_object_get(json_object_get(last, "response"), "output"));
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(json_object_get(last, "response"), "usage"),
                         "output_tokens")),
                     5);
    /* Deltas add up to the items; each item is added before its deltas and done after. */
    {
        size_t i;
        json_t *ev;
        char args[64] = "";
        int added = 0, done = 0;
        json_array_foreach(events, i, ev) {
            const char *t = json_string_value(json_object_get(ev, "type"));
            if (strcmp(t, "response.function_call_arguments.delta") == 0 &&
                json_integer_value(json_object_get(ev, "output_index")) == 2) {
                strncat(args, json_string_value(json_object_get(ev, "delta")),
                        sizeof(args) - strlen(args) - 1);
            }
            added += strcmp(t, "response.output_item.added") == 0;
            done += strcmp(t, "response.output_item.done") == 0;
            assert_true(done <= added);
        }
        assert_string_equal(args, "{\"d\":\"/\"}");
        assert_int_equal(added, 4);
        assert_int_equal(done, 4);
    }
    /* Every split of the chat stream gives the same events, byte for byte. */
    for (size_t split = 1; split < 64; split += 7) {
        router_responses_req_t again;
        rewrite_ok(store, "{\"model\":\"m\",\"input\":\"go\",\"stream\":true}", &again);
        memcpy(again.id, req.id, sizeof(req.id)); /* the same ids, so the same bytes */
        char *out = run_stream(store, &again, split);
        assert_string_equal(out, whole);
        free(out);
        router_responses_req_fini(&again);
    }
    json_decref(events);
    free(whole);

    /* The streamed response was stored with its session: chaining finds it. */
    {
        char chain[256];
        router_responses_req_t next;
        snprintf(chain, sizeof(chain),
                 "{\"model\":\"m\",\"previous_response_id\":\"%s\",\"input\":\"more\"}", req.id);
        rewrite_ok(store, chain, &next);
        assert_string_equal(next.session_id, "sess-2");
        router_responses_req_fini(&next);
    }
    /* A chat error event fails the response. */
    {
        router_responses_stream_t *s;
        const char *err_sse = "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}"
                              "\n\ndata: [DONE]\n\n";
        char out[8192];
        size_t n;
        assert_int_equal(router_responses_stream_create(store, &req, "s", &s), TDM_OK);
        assert_int_equal(router_responses_stream_feed(s, err_sse, strlen(err_sse)), TDM_OK);
        n = router_responses_stream_take(s, out, sizeof(out) - 1);
        out[n] = '\0';
        assert_non_null(strstr(out, "event: response.failed"));
        assert_non_null(strstr(out, "\"boom\""));
        router_responses_stream_destroy(s);
    }
    router_responses_req_fini(&req);
    router_responses_destroy(store);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_rewrite),
        cmocka_unit_test(test_refusals_name_the_field),
        cmocka_unit_test(test_whole_response_and_chain),
        cmocka_unit_test(test_stream_events_at_every_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
