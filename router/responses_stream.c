/* responses_stream.c - chat.completion.chunk events rewritten into the Responses API's typed
 * stream events (responses.h). Order of events per response: response.created,
 * response.in_progress; per output item output_item.added, then its deltas
 * (reasoning_text.delta; content_part.added + output_text.delta ... output_text.done +
 * content_part.done; function_call_arguments.delta ... .done), output_item.done; finally
 * response.completed / response.incomplete / response.failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "router/responses_impl.h"
#include "router/session.h"

/* Most tool calls one streamed response can carry. */
#define MAX_CALLS 64

/* One output item being streamed. */
typedef struct {
    int output_index; /* -1: not open */
    char id[96];
    tdm_buf_t text; /* reasoning or message text, or the arguments of a call */
} open_item_t;

struct router_responses_stream {
    router_responses_t *store;
    const router_responses_req_t *req;
    char session[ROUTER_SESSION_ID_BYTES + 1];
    tdm_buf_t in;  /* bytes of the chat stream not yet a whole line */
    tdm_buf_t out; /* events not yet taken */
    uint64_t seq;  /* sequence_number of the next event */
    int started, done;
    json_t *error;  /* the chat error event, when one came */
    resp_result_t result;
    open_item_t reasoning, message;
    open_item_t calls[MAX_CALLS]; /* by the chat tool_calls index */
    json_t *call_meta;            /* [MAX_CALLS] call_id and name of each call (array) */
    int n_outputs;
};

/* Append one event: "event: TYPE\ndata: JSON\n\n" with its sequence_number. Steals `data`. */
static tdm_status_t emit(router_responses_stream_t *s, const char *type, json_t *data)
{
    char *text;
    tdm_status_t st;

    if (data == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    json_object_set_new(data, "type", json_string(type));
    json_object_set_new(data, "sequence_number", json_integer((json_int_t)s->seq++));
    text = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    if (text == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = tdm_buf_printf(&s->out, "event: %s\ndata: %s\n\n", type, text);
    free(text);
    return st;
}

/* The response as it stands: status and the items so far. */
static json_t *snapshot(router_responses_stream_t *s, const char *status)
{
    return resp_object(s->req, status, &s->result, s->error);
}

static tdm_status_t start(router_responses_stream_t *s)
{
    tdm_status_t st;

    if (s->started) {
        return TDM_OK;
    }
    s->started = 1;
    st = emit(s, "response.created", json_pack("{s:o}", "response", snapshot(s, "in_progress")));
    if (st == TDM_OK) {
        st = emit(s, "response.in_progress",
                  json_pack("{s:o}", "response", snapshot(s, "in_progress")));
    }
    return st;
}

/* Open an output item: record it in result.output and announce it. Steals `item`. */
static tdm_status_t open_item(router_responses_stream_t *s, open_item_t *it, const char *prefix,
                              size_t n, json_t *item)
{
    if (item == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    it->output_index = s->n_outputs++;
    resp_item_id(s->req, prefix, n, it->id, sizeof(it->id));
    json_object_set_new(item, "id", json_string(it->id));
    json_object_set_new(item, "status", json_string("in_progress"));
    json_array_append(s->result.output, item);
    return emit(s, "response.output_item.added",
                json_pack("{s:i, s:o}", "output_index", it->output_index, "item", item));
}

static json_t *text_of(const open_item_t *it)
{
    return json_stringn(it->text.data != NULL ? it->text.data : "", it->text.n_bytes);
}

/* Close an open item: its final form in result.output, the done events. */
static tdm_status_t close_item(router_responses_stream_t *s, open_item_t *it)
{
    json_t *item;
    const char *type;
    tdm_status_t st = TDM_OK;

    if (it->output_index < 0) {
        return TDM_OK;
    }
    item = json_array_get(s->result.output, (size_t)it->output_index);
    type = json_string_value(json_object_get(item, "type"));
    json_object_set_new(item, "status",
                        json_string(s->result.finish != NULL &&
                                            strcmp(s->result.finish, "length") == 0 &&
                                            strcmp(type, "function_call") != 0
                                        ? "incomplete"
                                        : "completed"));
    if (strcmp(type, "message") == 0) {
        json_t *part = json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", text_of(it),
                                 "annotations");
        json_object_set_new(item, "content", json_pack("[O]", part));
        st = emit(s, "response.output_text.done",
                  json_pack("{s:s, s:i, s:i, s:o}", "item_id", it->id, "output_index",
                            it->output_index, "content_index", 0, "text", text_of(it)));
        if (st == TDM_OK) {
            st = emit(s, "response.content_part.done",
                      json_pack("{s:s, s:i, s:i, s:O}", "item_id", it->id, "output_index",
                                it->output_index, "content_index", 0, "part", part));
        }
        json_decref(part);
    } else if (strcmp(type, "reasoning") == 0) {
        json_object_set_new(item, "content",
                            json_pack("[{s:s, s:o}]", "type", "reasoning_text", "text",
                                      text_of(it)));
        st = emit(s, "response.reasoning_text.done",
                  json_pack("{s:s, s:i, s:i, s:o}", "item_id", it->id, "output_index",
                            it->output_index, "content_index", 0, "text", text_of(it)));
    } else {
        json_object_set_new(item, "arguments", text_of(it));
        st = emit(s, "response.function_call_arguments.done",
                  json_pack("{s:s, s:i, s:o}", "item_id", it->id, "output_index",
                            it->output_index, "arguments", text_of(it)));
    }
    if (st == TDM_OK) {
        st = emit(s, "response.output_item.done",
                  json_pack("{s:i, s:O}", "output_index", it->output_index, "item", item));
    }
    it->output_index = -1;
    return st;
}

static tdm_status_t on_reasoning(router_responses_stream_t *s, const char *delta, size_t n)
{
    tdm_status_t st = TDM_OK;

    if (s->reasoning.output_index < 0) {
        st = open_item(s, &s->reasoning, "rs", 0,
                       json_pack("{s:s, s:[], s:[]}", "type", "reasoning", "summary", "content"));
    }
    if (st == TDM_OK) {
        st = tdm_buf_append(&s->reasoning.text, delta, n);
    }
    if (st == TDM_OK) {
        st = emit(s, "response.reasoning_text.delta",
                  json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->reasoning.id, "output_index",
                            s->reasoning.output_index, "content_index", 0, "delta", delta, n));
    }
    return st;
}

static tdm_status_t on_content(router_responses_stream_t *s, const char *delta, size_t n)
{
    tdm_status_t st = close_item(s, &s->reasoning);

    if (st == TDM_OK && s->message.output_index < 0) {
        st = open_item(s, &s->message, "msg", 0,
                       json_pack("{s:s, s:s, s:[]}", "type", "message", "role", "assistant",
                                 "content"));
        if (st == TDM_OK) {
            st = emit(s, "response.content_part.added",
                      json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", s->message.id,
                                "output_index", s->message.output_index, "content_index", 0,
                                "part", "type", "output_text", "text", "", "annotations"));
        }
    }
    if (st == TDM_OK) {
        st = tdm_buf_append(&s->message.text, delta, n);
    }
    if (st == TDM_OK) {
        st = emit(s, "response.output_text.delta",
                  json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->message.id, "output_index",
                            s->message.output_index, "content_index", 0, "delta", delta, n));
    }
    return st;
}

/* One delta.tool_calls entry: the first of an index opens the call (id and name), the rest
 * carry argument fragments. */
static tdm_status_t on_tool_call(router_responses_stream_t *s, const json_t *tc)
{
    json_int_t index = json_integer_value(json_object_get(tc, "index"));
    const json_t *fn = json_object_get(tc, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    open_item_t *it;
    tdm_status_t st = TDM_OK;

    if (index < 0 || index >= MAX_CALLS) {
        return TDM_OK; /* beyond what one response lists; the chat side never sends these */
    }
    it = &s->calls[index];
    if (it->output_index < 0 && it->id[0] == '\0') {
        const char *call_id = json_string_value(json_object_get(tc, "id"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        st = close_item(s, &s->reasoning);
        if (st == TDM_OK) {
            st = close_item(s, &s->message);
        }
        if (st == TDM_OK) {
            st = open_item(s, it, "fc", (size_t)index,
                           json_pack("{s:s, s:s, s:s, s:s}", "type", "function_call", "call_id",
                                     call_id != NULL ? call_id : "", "name",
                                     name != NULL ? name : "", "arguments", ""));
        }
        if (st == TDM_OK) {
            json_array_append_new(s->call_meta,
                                  json_pack("{s:s, s:s, s:{s:s, s:s}}", "id",
                                            call_id != NULL ? call_id : "", "type", "function",
                                            "function", "name", name != NULL ? name : "",
                                            "arguments", ""));
        }
    }
    if (st == TDM_OK && args != NULL && args[0] != '\0' && it->output_index >= 0) {
        st = tdm_buf_append(&it->text, args, strlen(args));
        if (st == TDM_OK) {
            st = emit(s, "response.function_call_arguments.delta",
                      json_pack("{s:s, s:i, s:s}", "item_id", it->id, "output_index",
                                it->output_index, "delta", args));
        }
    }
    return st;
}

/* The stored assistant message from what streamed. */
static tdm_status_t build_assistant(router_responses_stream_t *s)
{
    json_t *a = json_pack("{s:s, s:n}", "role", "assistant", "content");
    size_t i;
    json_t *call;

    if (a == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (s->message.text.n_bytes > 0) {
        json_object_set_new(a, "content", text_of(&s->message));
    }
    if (s->reasoning.text.n_bytes > 0) {
        json_object_set_new(a, "reasoning_content", text_of(&s->reasoning));
    }
    json_array_foreach(s->call_meta, i, call) {
        json_object_set_new(json_object_get(call, "function"), "arguments",
                            text_of(&s->calls[i]));
    }
    if (json_array_size(s->call_meta) > 0) {
        json_object_set(a, "tool_calls", s->call_meta);
    }
    s->result.assistant = a;
    return TDM_OK;
}

static tdm_status_t finish(router_responses_stream_t *s)
{
    const char *status;
    tdm_status_t st = start(s);

    if (st == TDM_OK) {
        st = close_item(s, &s->reasoning);
    }
    if (st == TDM_OK) {
        st = close_item(s, &s->message);
    }
    for (int i = 0; i < MAX_CALLS && st == TDM_OK; i++) {
        st = close_item(s, &s->calls[i]);
    }
    if (st != TDM_OK) {
        return st;
    }
    s->done = 1;
    if (s->error != NULL) {
        return emit(s, "response.failed", json_pack("{s:o}", "response", snapshot(s, "failed")));
    }
    status = resp_status(&s->result);
    st = build_assistant(s);
    if (st == TDM_OK) {
        st = resp_store_result(s->store, s->req, &s->result, s->session);
    }
    if (st == TDM_OK) {
        st = emit(s,
                  strcmp(status, "incomplete") == 0 ? "response.incomplete"
                                                    : "response.completed",
                  json_pack("{s:o}", "response", snapshot(s, status)));
    }
    return st;
}

/* One chat event's JSON text. */
static tdm_status_t on_chunk(router_responses_stream_t *s, const char *data, size_t n)
{
    json_t *root = json_loadb(data, n, JSON_ALLOW_NUL, NULL); /* output may hold U+0000 */
    json_t *choice;
    json_t *delta;
    const char *finish_reason;
    const char *t;
    tdm_status_t st;

    if (root == NULL) {
        return TDM_OK; /* not a chunk (the chat side writes only JSON events) */
    }
    st = start(s);
    if (json_object_get(root, "error") != NULL) {
        json_decref(s->error);
        s->error = json_incref(json_object_get(root, "error"));
        json_decref(root);
        return st;
    }
    resp_take_usage(json_object_get(root, "usage"), &s->result);
    choice = json_array_get(json_object_get(root, "choices"), 0);
    delta = json_object_get(choice, "delta");
    t = json_string_value(json_object_get(delta, "reasoning_content"));
    if (st == TDM_OK && t != NULL && t[0] != '\0') {
        st = on_reasoning(s, t, json_string_length(json_object_get(delta, "reasoning_content")));
    }
    t = json_string_value(json_object_get(delta, "content"));
    if (st == TDM_OK && t != NULL && t[0] != '\0') {
        st = on_content(s, t, json_string_length(json_object_get(delta, "content")));
    }
    if (st == TDM_OK) {
        size_t i;
        json_t *tc;
        json_array_foreach(json_object_get(delta, "tool_calls"), i, tc) {
            st = on_tool_call(s, tc);
            if (st != TDM_OK) {
                break;
            }
        }
    }
    finish_reason = json_string_value(json_object_get(choice, "finish_reason"));
    if (finish_reason != NULL) {
        s->result.finish = resp_finish(finish_reason);
    }
    json_decref(root);
    return st;
}

tdm_status_t router_responses_stream_create(router_responses_t *store,
                                            const router_responses_req_t *req,
                                            const char *session_id,
                                            router_responses_stream_t **out)
{
    router_responses_stream_t *s;

    if (store == NULL || req == NULL || req->echo == NULL || out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    s->store = store;
    s->req = req;
    snprintf(s->session, sizeof(s->session), "%s", session_id != NULL ? session_id : "");
    s->reasoning.output_index = -1;
    s->message.output_index = -1;
    for (int i = 0; i < MAX_CALLS; i++) {
        s->calls[i].output_index = -1;
    }
    s->result.output = json_array();
    s->call_meta = json_array();
    if (s->result.output == NULL || s->call_meta == NULL) {
        router_responses_stream_destroy(s);
        return TDM_ERR_NO_MEMORY;
    }
    *out = s;
    return TDM_OK;
}

tdm_status_t router_responses_stream_feed(router_responses_stream_t *s, const char *bytes,
                                          size_t n)
{
    tdm_status_t st = tdm_buf_append(&s->in, bytes, n);
    char *line;
    char *nl;

    while (st == TDM_OK && s->in.n_bytes > 0 &&
           (nl = memchr(s->in.data, '\n', s->in.n_bytes)) != NULL) {
        size_t len = (size_t)(nl - s->in.data);
        line = s->in.data;
        if (len > 0 && line[0] == ':') {
            st = tdm_buf_append(&s->out, line, len + 1); /* keep-alive comment */
            if (st == TDM_OK) {
                st = tdm_buf_append(&s->out, "\n", 1);
            }
        } else if (len >= 6 && memcmp(line, "data: ", 6) == 0) {
            if (len - 6 == 6 && memcmp(line + 6, "[DONE]", 6) == 0) {
                if (!s->done) {
                    st = finish(s);
                }
            } else if (!s->done) {
                st = on_chunk(s, line + 6, len - 6);
            }
        }
        tdm_buf_consume(&s->in, len + 1);
    }
    return st;
}

size_t router_responses_stream_take(router_responses_stream_t *s, char *buf, size_t max)
{
    size_t n = s->out.n_bytes < max ? s->out.n_bytes : max;

    if (n > 0) {
        memcpy(buf, s->out.data, n);
        tdm_buf_consume(&s->out, n);
    }
    return n;
}

int router_responses_stream_done(const router_responses_stream_t *s)
{
    return s->done;
}

void router_responses_stream_destroy(router_responses_stream_t *s)
{
    if (s == NULL) {
        return;
    }
    tdm_buf_fini(&s->in);
    tdm_buf_fini(&s->out);
    tdm_buf_fini(&s->reasoning.text);
    tdm_buf_fini(&s->message.text);
    for (int i = 0; i < MAX_CALLS; i++) {
        tdm_buf_fini(&s->calls[i].text);
    }
    json_decref(s->error);
    json_decref(s->result.output);
    json_decref(s->result.assistant);
    json_decref(s->call_meta);
    free(s);
}
