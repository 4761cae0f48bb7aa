/* responses.c - the Responses API: the store of past responses, the request rewrite into a chat
 * body, and the whole (non-streamed) Response object. See responses.h. */
#include "router/responses.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/hash.h"
#include "common/http_status.h"
#include "router/responses_impl.h"
#include "router/session.h"

/* ---- the store --------------------------------------------------------------------------- */

typedef struct {
    char id[ROUTER_RESPONSES_ID_BYTES + 1];
    char session[ROUTER_SESSION_ID_BYTES + 1];
    uint32_t tenant;  /* who stored it; only the same tenant finds it */
    json_t *messages; /* the conversation after this response (no instructions) */
} resp_entry_t;

struct router_responses {
    pthread_mutex_t lock;
    resp_entry_t *entries; /* ring of max_entries; entries[(head + i) % max] for i < n */
    size_t max_entries;
    size_t head;
    size_t n;
};

tdm_status_t router_responses_create(size_t max_entries, router_responses_t **out)
{
    router_responses_t *store;

    if (out == NULL || max_entries == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    store = calloc(1, sizeof(*store));
    if (store == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    store->entries = calloc(max_entries, sizeof(*store->entries));
    if (store->entries == NULL) {
        goto fail_store;
    }
    if (pthread_mutex_init(&store->lock, NULL) != 0) {
        goto fail_entries;
    }
    store->max_entries = max_entries;
    *out = store;
    return TDM_OK;

fail_entries:
    free(store->entries);
fail_store:
    free(store);
    return TDM_ERR_NO_MEMORY;
}

void router_responses_destroy(router_responses_t *store)
{
    if (store == NULL) {
        return;
    }
    for (size_t i = 0; i < store->n; i++) {
        json_decref(store->entries[(store->head + i) % store->max_entries].messages);
    }
    pthread_mutex_destroy(&store->lock);
    free(store->entries);
    free(store);
}

size_t router_responses_count(router_responses_t *store)
{
    size_t n;

    pthread_mutex_lock(&store->lock);
    n = store->n;
    pthread_mutex_unlock(&store->lock);
    return n;
}

/* Keep `messages` (a new reference is taken) under id; the oldest entry goes when full. */
static void store_put(router_responses_t *store, const char *id, uint32_t tenant,
                      const char *session, json_t *messages)
{
    resp_entry_t *e;

    pthread_mutex_lock(&store->lock);
    if (store->n == store->max_entries) {
        e = &store->entries[store->head];
        json_decref(e->messages);
        store->head = (store->head + 1) % store->max_entries;
        store->n--;
    }
    e = &store->entries[(store->head + store->n) % store->max_entries];
    snprintf(e->id, sizeof(e->id), "%s", id);
    snprintf(e->session, sizeof(e->session), "%s", session != NULL ? session : "");
    e->tenant = tenant;
    e->messages = json_incref(messages);
    store->n++;
    pthread_mutex_unlock(&store->lock);
}

/* The stored conversation of `id` stored by `tenant` (a new reference) and its session (copied),
 * or NULL. */
static json_t *store_get(router_responses_t *store, const char *id, uint32_t tenant,
                         char *session_out, size_t cap)
{
    json_t *found = NULL;

    pthread_mutex_lock(&store->lock);
    for (size_t i = store->n; i-- > 0;) {
        const resp_entry_t *e = &store->entries[(store->head + i) % store->max_entries];
        if (e->tenant == tenant && strcmp(e->id, id) == 0) {
            found = json_incref(e->messages);
            snprintf(session_out, cap, "%s", e->session);
            break;
        }
    }
    pthread_mutex_unlock(&store->lock);
    return found;
}

/* ---- request rewrite ---------------------------------------------------------------------- */

static tdm_status_t bad(router_apierr_t *err, const char *code, const char *param,
                        const char *fmt, const char *a, const char *b)
{
    router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, code, param, fmt,
                      a != NULL ? a : "", b != NULL ? b : "");
    return TDM_ERR_INVALID_ARG;
}


/* The text of a message's content: a string, or the concatenated text of input_text /
 * output_text parts. Anything else (images, files, audio) is refused. New reference. */
static tdm_status_t content_text(const json_t *content, size_t item, json_t **out,
                                 router_apierr_t *err)
{
    char where[32];
    tdm_buf_t text = {0};
    size_t i;
    json_t *part;

    snprintf(where, sizeof(where), "%zu", item);
    if (json_is_string(content)) {
        *out = json_string(json_string_value(content));
        return *out != NULL ? TDM_OK : router_apierr_no_memory(err);
    }
    if (!json_is_array(content)) {
        return bad(err, "invalid_type", "input",
                   "input[%s].content must be a string or an array of content parts%s", where,
                   NULL);
    }
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const char *t = json_string_value(json_object_get(part, "text"));
        if (type == NULL || t == NULL ||
            (strcmp(type, "input_text") != 0 && strcmp(type, "output_text") != 0 &&
             strcmp(type, "text") != 0)) {
            tdm_buf_fini(&text);
            return bad(err, "invalid_value", "input",
                       "input[%s].content: only text parts (input_text, output_text) are "
                       "supported; got '%s'",
                       where, type != NULL ? type : "(no type)");
        }
        if (tdm_buf_append(&text, t, strlen(t)) != TDM_OK) {
            tdm_buf_fini(&text);
            return router_apierr_no_memory(err);
        }
    }
    *out = json_stringn(text.data != NULL ? text.data : "", text.n_bytes);
    tdm_buf_fini(&text);
    return *out != NULL ? TDM_OK : router_apierr_no_memory(err);
}

/* The reasoning text of a reasoning item: content[].text, else summary[].text. */
static json_t *reasoning_text(const json_t *item)
{
    const char *keys[2] = {"content", "summary"};
    tdm_buf_t text = {0};
    json_t *out;

    for (int k = 0; k < 2 && text.n_bytes == 0; k++) {
        size_t i;
        json_t *part;
        json_array_foreach(json_object_get(item, keys[k]), i, part) {
            const char *t = json_string_value(json_object_get(part, "text"));
            if (t != NULL && tdm_buf_append(&text, t, strlen(t)) != TDM_OK) {
                tdm_buf_fini(&text);
                return NULL;
            }
        }
    }
    out = json_stringn(text.data != NULL ? text.data : "", text.n_bytes);
    tdm_buf_fini(&text);
    return out;
}

/* The last message of msgs when it is an assistant message (function calls attach to it). */
static json_t *open_assistant(json_t *msgs)
{
    size_t n = json_array_size(msgs);
    json_t *last = n > 0 ? json_array_get(msgs, n - 1) : NULL;
    const char *role = json_string_value(json_object_get(last, "role"));

    return role != NULL && strcmp(role, "assistant") == 0 ? last : NULL;
}

/* Append one function_call item to msgs as an assistant tool call. */
static tdm_status_t add_function_call(json_t *msgs, const json_t *item, json_t **reasoning,
                                      size_t i, router_apierr_t *err)
{
    const char *call_id = json_string_value(json_object_get(item, "call_id"));
    const char *name = json_string_value(json_object_get(item, "name"));
    const char *args = json_string_value(json_object_get(item, "arguments"));
    char where[32];
    json_t *msg = *reasoning == NULL ? open_assistant(msgs) : NULL;
    json_t *calls;

    snprintf(where, sizeof(where), "%zu", i);
    if (call_id == NULL || name == NULL || args == NULL) {
        return bad(err, "invalid_value", "input",
                   "input[%s]: a function_call item needs string call_id, name and "
                   "arguments%s",
                   where, NULL);
    }
    if (msg == NULL) {
        msg = json_pack("{s:s, s:n}", "role", "assistant", "content");
        if (msg == NULL || json_array_append_new(msgs, msg) != 0) {
            return router_apierr_no_memory(err);
        }
        if (*reasoning != NULL) {
            json_object_set_new(msg, "reasoning_content", *reasoning);
            *reasoning = NULL;
        }
    }
    calls = json_object_get(msg, "tool_calls");
    if (calls == NULL) {
        calls = json_array();
        if (calls == NULL || json_object_set_new(msg, "tool_calls", calls) != 0) {
            return router_apierr_no_memory(err);
        }
    }
    if (json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", call_id, "type",
                                               "function", "function", "name", name,
                                               "arguments", args)) != 0) {
        return router_apierr_no_memory(err);
    }
    return TDM_OK;
}

/* Append one message item (user, system, developer or assistant) to msgs. */
static tdm_status_t add_message(json_t *msgs, const json_t *item, json_t **reasoning, size_t i,
                                router_apierr_t *err)
{
    const char *role = json_string_value(json_object_get(item, "role"));
    char where[32];
    json_t *text = NULL;
    json_t *msg;
    tdm_status_t st;

    snprintf(where, sizeof(where), "%zu", i);
    if (role == NULL || (strcmp(role, "user") != 0 && strcmp(role, "system") != 0 &&
                         strcmp(role, "developer") != 0 && strcmp(role, "assistant") != 0)) {
        return bad(err, "invalid_value", "input",
                   "input[%s].role must be user, system, developer or assistant (got '%s')",
                   where, role != NULL ? role : "(none)");
    }
    st = content_text(json_object_get(item, "content"), i, &text, err);
    if (st != TDM_OK) {
        return st;
    }
    msg = json_pack("{s:s, s:o}", "role", strcmp(role, "developer") == 0 ? "system" : role,
                    "content", text);
    if (msg == NULL || json_array_append_new(msgs, msg) != 0) {
        return router_apierr_no_memory(err);
    }
    if (strcmp(role, "assistant") == 0 && *reasoning != NULL) {
        json_object_set_new(msg, "reasoning_content", *reasoning);
        *reasoning = NULL;
    }
    return TDM_OK;
}

/* Append the input (a string or an array of items) to msgs as chat messages. A reasoning item
 * is attached to the assistant message that follows it; one with none after it is dropped. */
static tdm_status_t add_input(json_t *msgs, const json_t *input, router_apierr_t *err)
{
    json_t *reasoning = NULL;
    json_t *item;
    size_t i;
    tdm_status_t st = TDM_OK;

    if (json_is_string(input)) {
        return json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content",
                                                     json_string_value(input))) == 0
                   ? TDM_OK
                   : router_apierr_no_memory(err);
    }
    if (!json_is_array(input)) {
        return bad(err, "invalid_type", "input",
                   "'input' must be a string or an array of input items%s%s", NULL, NULL);
    }
    json_array_foreach(input, i, item) {
        const char *type = json_string_value(json_object_get(item, "type"));
        char where[32];

        snprintf(where, sizeof(where), "%zu", i);
        if (!json_is_object(item)) {
            st = bad(err, "invalid_type", "input", "input[%s] must be an object%s", where, NULL);
        } else if (type == NULL || strcmp(type, "message") == 0) {
            st = add_message(msgs, item, &reasoning, i, err);
        } else if (strcmp(type, "function_call") == 0) {
            st = add_function_call(msgs, item, &reasoning, i, err);
        } else if (strcmp(type, "function_call_output") == 0) {
            const char *call_id = json_string_value(json_object_get(item, "call_id"));
            const char *output = json_string_value(json_object_get(item, "output"));
            if (call_id == NULL || output == NULL) {
                st = bad(err, "invalid_value", "input",
                         "input[%s]: a function_call_output item needs string call_id and "
                         "output%s",
                         where, NULL);
            } else if (json_array_append_new(msgs, json_pack("{s:s, s:s, s:s}", "role", "tool",
                                                             "tool_call_id", call_id, "content",
                                                             output)) != 0) {
                st = router_apierr_no_memory(err);
            }
        } else if (strcmp(type, "reasoning") == 0) {
            json_decref(reasoning);
            reasoning = reasoning_text(item);
            st = reasoning != NULL ? TDM_OK : router_apierr_no_memory(err);
        } else {
            st = bad(err, "invalid_value", "input",
                     "input[%s].type '%s' is not supported (message, function_call, "
                     "function_call_output and reasoning items are)",
                     where, type);
        }
        if (st != TDM_OK) {
            break;
        }
    }
    json_decref(reasoning);
    return st;
}

/* tools: function tools only, rewritten to the chat form. */
static tdm_status_t chat_tools(const json_t *tools, json_t *chat, router_apierr_t *err)
{
    json_t *out;
    json_t *tool;
    size_t i;

    if (tools == NULL || json_is_null(tools)) {
        return TDM_OK;
    }
    if (!json_is_array(tools)) {
        return bad(err, "invalid_type", "tools", "'tools' must be an array%s%s", NULL, NULL);
    }
    out = json_array();
    if (out == NULL || json_object_set_new(chat, "tools", out) != 0) {
        return router_apierr_no_memory(err);
    }
    json_array_foreach(tools, i, tool) {
        const char *type = json_string_value(json_object_get(tool, "type"));
        json_t *fn;
        char where[32];

        snprintf(where, sizeof(where), "%zu", i);
        if (type == NULL || strcmp(type, "function") != 0) {
            return bad(err, "invalid_value", "tools",
                       "tools[%s].type '%s' is not supported: only function tools are", where,
                       type != NULL ? type : "(none)");
        }
        fn = json_object();
        if (fn == NULL || json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function",
                                                               "function", fn)) != 0) {
            return router_apierr_no_memory(err);
        }
        /* name, description and parameters move into "function"; the chat checks them. */
        const char *keys[3] = {"name", "description", "parameters"};
        for (int k = 0; k < 3; k++) {
            json_t *v = json_object_get(tool, keys[k]);
            if (v != NULL && !json_is_null(v)) {
                json_object_set(fn, keys[k], v);
            }
        }
    }
    return TDM_OK;
}

/* tool_choice: the strings pass; {"type":"function","name":N} becomes the chat form. */
static tdm_status_t chat_tool_choice(const json_t *choice, json_t *chat, router_apierr_t *err)
{
    const char *type;
    const char *name;

    if (choice == NULL || json_is_null(choice)) {
        return TDM_OK;
    }
    if (json_is_string(choice)) {
        json_object_set(chat, "tool_choice", (json_t *)choice);
        return TDM_OK;
    }
    type = json_string_value(json_object_get(choice, "type"));
    name = json_string_value(json_object_get(choice, "name"));
    if (type == NULL || strcmp(type, "function") != 0 || name == NULL) {
        return bad(err, "invalid_value", "tool_choice",
                   "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                   "{\"type\": \"function\", \"name\": ...}%s%s",
                   NULL, NULL);
    }
    json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:s}}", "type", "function",
                                                       "function", "name", name));
    return TDM_OK;
}

/* text.format -> response_format. */
static tdm_status_t chat_format(const json_t *text, json_t *chat, router_apierr_t *err)
{
    const json_t *format = json_object_get(text, "format");
    const char *type = json_string_value(json_object_get(format, "type"));
    json_t *schema;

    if (text == NULL || json_is_null(text) || format == NULL || json_is_null(format)) {
        return TDM_OK;
    }
    if (type != NULL && strcmp(type, "text") == 0) {
        return TDM_OK;
    }
    if (type != NULL && strcmp(type, "json_object") == 0) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        return TDM_OK;
    }
    if (type == NULL || strcmp(type, "json_schema") != 0) {
        return bad(err, "invalid_value", "text",
                   "text.format.type must be text, json_object or json_schema (got '%s')%s",
                   type != NULL ? type : "(none)", NULL);
    }
    schema = json_object();
    if (schema == NULL ||
        json_object_set_new(chat, "response_format",
                            json_pack("{s:s, s:o}", "type", "json_schema", "json_schema",
                                      schema)) != 0) {
        return router_apierr_no_memory(err);
    }
    const char *keys[4] = {"name", "schema", "strict", "description"};
    for (int k = 0; k < 4; k++) {
        json_t *v = json_object_get(format, keys[k]);
        if (v != NULL && !json_is_null(v)) {
            json_object_set(schema, keys[k], v);
        }
    }
    return TDM_OK;
}

/* Fields passed to the chat body as they are (sampling and Tandem extensions). */
static const char *const PASS[] = {"model", "temperature", "top_p", "parallel_tool_calls",
                                   "seed", "top_k", "min_p", "spec", "ignore_eos", "thinking",
                                   "chat_template_kwargs"};
/* Fields a Response object repeats. */
static const char *const ECHO[] = {"instructions", "max_output_tokens", "metadata",
                                   "parallel_tool_calls", "previous_response_id", "reasoning",
                                   "temperature", "text", "tool_choice", "tools", "top_p",
                                   "truncation", "user", "model"};
/* Every field accepted at the top level (besides PASS). */
static const char *const KNOWN[] = {"input", "instructions", "max_output_tokens", "metadata",
                                    "previous_response_id", "reasoning", "service_tier", "store",
                                    "stream", "text", "tool_choice", "tools", "truncation",
                                    "user", "include"};

static int listed(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(key, list[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Field-by-field checks that are the Responses API's own (not the chat pipeline's). */
static tdm_status_t check_fields(const json_t *root, router_apierr_t *err)
{
    const char *key;
    json_t *v;

    json_object_foreach((json_t *)root, key, v) {
        if (!listed(key, KNOWN, N_OF(KNOWN)) && !listed(key, PASS, N_OF(PASS))) {
            router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                              "unsupported_parameter", NULL,
                              "'%.100s' is not supported by this deployment's /v1/responses",
                              key);
            return TDM_ERR_INVALID_ARG;
        }
    }
    v = json_object_get(root, "include");
    if (v != NULL && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0)) {
        return bad(err, "unsupported_parameter", "include",
                   "'include' is not supported by this deployment%s%s", NULL, NULL);
    }
    v = json_object_get(root, "truncation");
    if (v != NULL && !json_is_null(v) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "disabled") == 0)) {
        return bad(err, "invalid_value", "truncation",
                   "'truncation' must be \"disabled\": the context is never truncated here%s%s",
                   NULL, NULL);
    }
    v = json_object_get(root, "service_tier");
    if (v != NULL && !json_is_null(v) &&
        !(json_is_string(v) && (strcmp(json_string_value(v), "auto") == 0 ||
                                strcmp(json_string_value(v), "default") == 0))) {
        return bad(err, "invalid_value", "service_tier",
                   "'service_tier' must be \"auto\" or \"default\"%s%s", NULL, NULL);
    }
    const char *bools[2] = {"store", "stream"};
    for (int k = 0; k < 2; k++) {
        v = json_object_get(root, bools[k]);
        if (v != NULL && !json_is_null(v) && !json_is_boolean(v)) {
            return bad(err, "invalid_type", bools[k], "'%s' must be a boolean%s", bools[k],
                       NULL);
        }
    }
    const char *strings[2] = {"instructions", "previous_response_id"};
    for (int k = 0; k < 2; k++) {
        v = json_object_get(root, strings[k]);
        if (v != NULL && !json_is_null(v) && !json_is_string(v)) {
            return bad(err, "invalid_type", strings[k], "'%s' must be a string%s", strings[k],
                       NULL);
        }
    }
    v = json_object_get(root, "reasoning");
    if (v != NULL && !json_is_null(v) && !json_is_object(v)) {
        return bad(err, "invalid_type", "reasoning", "'reasoning' must be an object%s%s", NULL,
                   NULL);
    }
    if (json_object_get(root, "input") == NULL) {
        return bad(err, "missing_parameter", "input", "'input' is required%s%s", NULL, NULL);
    }
    return TDM_OK;
}

/* The chat body and conversation of a checked Responses request. */
static tdm_status_t rewrite(router_responses_t *store, const json_t *root,
                            router_responses_req_t *req, resp_echo_t *echo, json_t *chat,
                            router_apierr_t *err)
{
    const char *prev = json_string_value(json_object_get(root, "previous_response_id"));
    const char *instructions = json_string_value(json_object_get(root, "instructions"));
    const json_t *reasoning = json_object_get(root, "reasoning");
    const json_t *max_out = json_object_get(root, "max_output_tokens");
    json_t *messages;
    tdm_status_t st;

    if (prev != NULL) {
        char session[ROUTER_SESSION_ID_BYTES + 1];
        json_t *stored = store_get(store, prev, req->tenant, session, sizeof(session));
        if (stored == NULL) {
            return bad(err, "invalid_value", "previous_response_id",
                       "previous response '%.64s' is not stored here (unknown, evicted, or "
                       "made with store: false)%s",
                       prev, NULL);
        }
        json_array_extend(echo->conversation, stored);
        json_decref(stored);
        if (session[0] != '\0') {
            req->session_id = strdup(session);
            if (req->session_id == NULL) {
                return router_apierr_no_memory(err);
            }
        }
    }
    st = add_input(echo->conversation, json_object_get(root, "input"), err);
    if (st != TDM_OK) {
        return st;
    }
    messages = json_array();
    if (messages == NULL || json_object_set_new(chat, "messages", messages) != 0) {
        return router_apierr_no_memory(err);
    }
    if (instructions != NULL &&
        json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "system", "content",
                                                  instructions)) != 0) {
        return router_apierr_no_memory(err);
    }
    json_array_extend(messages, echo->conversation);
    for (size_t k = 0; k < N_OF(PASS); k++) {
        json_t *v = json_object_get(root, PASS[k]);
        if (v != NULL && !json_is_null(v)) {
            json_object_set(chat, PASS[k], v);
        }
    }
    if (max_out != NULL && !json_is_null(max_out)) {
        json_object_set(chat, "max_tokens", (json_t *)max_out);
    }
    if (json_is_object(reasoning) && json_object_get(root, "thinking") == NULL &&
        json_object_get(root, "chat_template_kwargs") == NULL) {
        json_object_set_new(chat, "thinking", json_pack("{s:s}", "type", "enabled"));
    }
    if (req->stream) {
        json_object_set_new(chat, "stream", json_true());
        json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    st = chat_tools(json_object_get(root, "tools"), chat, err);
    if (st == TDM_OK) {
        st = chat_tool_choice(json_object_get(root, "tool_choice"), chat, err);
    }
    if (st == TDM_OK) {
        st = chat_format(json_object_get(root, "text"), chat, err);
    }
    return st;
}

tdm_status_t router_responses_request(router_responses_t *store, const char *body,
                                      size_t n_body, uint64_t id_seed, uint32_t tenant,
                                      router_responses_req_t *req_out, router_apierr_t *err_out)
{
    router_responses_req_t req;
    resp_echo_t *echo;
    json_error_t jerr;
    json_t *root;
    json_t *chat = NULL;
    tdm_status_t st;

    memset(&req, 0, sizeof(req));
    memset(req_out, 0, sizeof(*req_out));
    req.tenant = tenant;
    root = json_loadb(body, n_body, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (root == NULL || !json_is_object(root)) {
        json_decref(root);
        router_apierr_set(err_out, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                          "invalid_json", NULL, "the body must be a JSON object (%.200s)",
                          root == NULL ? jerr.text : "not an object");
        return TDM_ERR_INVALID_ARG;
    }
    st = check_fields(root, err_out);
    if (st != TDM_OK) {
        json_decref(root);
        return st;
    }
    echo = calloc(1, sizeof(*echo));
    if (echo == NULL) {
        json_decref(root);
        return router_apierr_no_memory(err_out);
    }
    req.echo = echo;
    echo->conversation = json_array();
    echo->fields = json_object();
    chat = json_object();
    echo->created_at = (int64_t)time(NULL);
    req.stream = json_is_true(json_object_get(root, "stream"));
    req.store = !json_is_false(json_object_get(root, "store"));
    snprintf(req.id, sizeof(req.id), "resp_%016" PRIx64 "%016" PRIx64,
             tdm_hash_splitmix64(id_seed), tdm_hash_splitmix64(id_seed ^ 0x9e3779b97f4a7c15ULL));
    if (echo->conversation == NULL || echo->fields == NULL || chat == NULL) {
        st = router_apierr_no_memory(err_out);
    } else {
        st = rewrite(store, root, &req, echo, chat, err_out);
    }
    if (st == TDM_OK) {
        for (size_t k = 0; k < N_OF(ECHO); k++) {
            json_t *v = json_object_get(root, ECHO[k]);
            json_object_set(echo->fields, ECHO[k], v != NULL ? v : json_null());
        }
        req.chat_body = json_dumps(chat, JSON_COMPACT);
        if (req.chat_body == NULL) {
            st = router_apierr_no_memory(err_out);
        } else {
            req.n_chat_body = strlen(req.chat_body);
        }
    }
    json_decref(chat);
    json_decref(root);
    if (st != TDM_OK) {
        router_responses_req_fini(&req);
        return st;
    }
    *req_out = req;
    return TDM_OK;
}

void router_responses_req_fini(router_responses_req_t *req)
{
    resp_echo_t *echo;

    if (req == NULL) {
        return;
    }
    echo = req->echo;
    if (echo != NULL) {
        json_decref(echo->conversation);
        json_decref(echo->fields);
        free(echo);
    }
    free(req->chat_body);
    free(req->session_id);
    memset(req, 0, sizeof(*req));
}

/* ---- the Response object ------------------------------------------------------------------ */

void resp_item_id(const router_responses_req_t *req, const char *prefix, size_t n, char *out,
                  size_t cap)
{
    snprintf(out, cap, "%s_%s_%zu", prefix, req->id + 5, n);
}

const char *resp_status(const resp_result_t *result)
{
    return result->finish != NULL && strcmp(result->finish, "length") == 0 ? "incomplete"
                                                                           : "completed";
}

json_t *resp_object(const router_responses_req_t *req, const char *status,
                    const resp_result_t *result, const json_t *error)
{
    const resp_echo_t *echo = req->echo;
    json_t *obj = json_copy(echo->fields);
    tdm_buf_t text = {0};
    size_t i;
    json_t *item;

    if (obj == NULL) {
        return NULL;
    }
    json_object_set_new(obj, "id", json_string(req->id));
    json_object_set_new(obj, "object", json_string("response"));
    json_object_set_new(obj, "created_at", json_integer(echo->created_at));
    json_object_set_new(obj, "status", json_string(status));
    json_object_set_new(obj, "error", error != NULL ? json_copy((json_t *)error) : json_null());
    json_object_set_new(obj, "incomplete_details",
                        strcmp(status, "incomplete") == 0
                            ? json_pack("{s:s}", "reason", "max_output_tokens")
                            : json_null());
    if (json_is_null(json_object_get(obj, "parallel_tool_calls"))) {
        json_object_set_new(obj, "parallel_tool_calls", json_true());
    }
    if (json_is_null(json_object_get(obj, "tool_choice"))) {
        json_object_set_new(obj, "tool_choice", json_string("auto"));
    }
    if (json_is_null(json_object_get(obj, "tools"))) {
        json_object_set_new(obj, "tools", json_array());
    }
    json_object_set(obj, "output", result->output);
    /* output_text: the SDK computes it too; plain HTTP clients get it here. */
    json_array_foreach(result->output, i, item) {
        size_t j;
        json_t *part;
        json_array_foreach(json_object_get(item, "content"), j, part) {
            const char *t = json_string_value(json_object_get(part, "text"));
            const char *type = json_string_value(json_object_get(part, "type"));
            if (t != NULL && type != NULL && strcmp(type, "output_text") == 0) {
                tdm_buf_append(&text, t, strlen(t));
            }
        }
    }
    json_object_set_new(obj, "output_text",
                        json_stringn(text.data != NULL ? text.data : "", text.n_bytes));
    tdm_buf_fini(&text);
    if (result->have_usage) {
        json_object_set_new(
            obj, "usage",
            json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", result->prompt_tokens,
                      "input_tokens_details", "cached_tokens", result->cached_tokens,
                      "output_tokens", result->completion_tokens, "output_tokens_details",
                      "reasoning_tokens", (json_int_t)0, "total_tokens",
                      result->prompt_tokens + result->completion_tokens));
    }
    return obj;
}

tdm_status_t resp_store_result(router_responses_t *store, const router_responses_req_t *req,
                               const resp_result_t *result, const char *session_id)
{
    const resp_echo_t *echo = req->echo;
    json_t *messages;

    if (!req->store) {
        return TDM_OK;
    }
    messages = json_copy(echo->conversation);
    if (messages == NULL ||
        (result->assistant != NULL && json_array_append(messages, result->assistant) != 0)) {
        json_decref(messages);
        return TDM_ERR_NO_MEMORY;
    }
    store_put(store, req->id, req->tenant, session_id, messages);
    json_decref(messages);
    return TDM_OK;
}

void resp_take_usage(const json_t *usage, resp_result_t *result)
{
    if (!json_is_object(usage)) {
        return;
    }
    result->have_usage = 1;
    result->prompt_tokens = json_integer_value(json_object_get(usage, "prompt_tokens"));
    result->completion_tokens = json_integer_value(json_object_get(usage, "completion_tokens"));
    result->cached_tokens = json_integer_value(
        json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens"));
}

const char *resp_finish(const char *finish)
{
    static const char *const NAMES[] = {"stop", "length", "tool_calls"};

    for (size_t i = 0; finish != NULL && i < N_OF(NAMES); i++) {
        if (strcmp(finish, NAMES[i]) == 0) {
            return NAMES[i];
        }
    }
    return finish != NULL ? "stop" : NULL;
}

/* The output items of one chat choice's message. */
static tdm_status_t result_of_message(const router_responses_req_t *req, const json_t *message,
                                      const char *finish, resp_result_t *result)
{
    const char *item_status = finish != NULL && strcmp(finish, "length") == 0 ? "incomplete"
                                                                              : "completed";
    const json_t *reasoning = json_object_get(message, "reasoning_content");
    const json_t *content = json_object_get(message, "content");
    const json_t *calls = json_object_get(message, "tool_calls");
    char id[96];
    size_t i;
    json_t *call;

    result->output = json_array();
    result->assistant = json_pack("{s:s, s:O}", "role", "assistant", "content",
                                  content != NULL ? content : json_null());
    if (result->output == NULL || result->assistant == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (json_is_string(reasoning) && json_string_length(reasoning) > 0) {
        resp_item_id(req, "rs", 0, id, sizeof(id));
        json_array_append_new(result->output,
                              json_pack("{s:s, s:s, s:[], s:[{s:s, s:O}], s:s}", "type",
                                        "reasoning", "id", id, "summary", "content", "type",
                                        "reasoning_text", "text", reasoning, "status",
                                        item_status));
        json_object_set(result->assistant, "reasoning_content", (json_t *)reasoning);
    }
    if (json_is_string(content) && json_string_length(content) > 0) {
        resp_item_id(req, "msg", 0, id, sizeof(id));
        json_array_append_new(result->output,
                              json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:O, s:[]}]}", "type",
                                        "message", "id", id, "role", "assistant", "status",
                                        item_status, "content", "type", "output_text", "text",
                                        content, "annotations"));
    }
    json_array_foreach(calls, i, call) {
        const json_t *fn = json_object_get(call, "function");
        resp_item_id(req, "fc", i, id, sizeof(id));
        json_array_append_new(
            result->output,
            json_pack("{s:s, s:s, s:O, s:O, s:O, s:s}", "type", "function_call", "id", id,
                      "call_id", json_object_get(call, "id"), "name", json_object_get(fn, "name"),
                      "arguments", json_object_get(fn, "arguments"), "status", "completed"));
    }
    if (json_array_size(calls) > 0) {
        json_object_set(result->assistant, "tool_calls", (json_t *)calls);
    }
    return TDM_OK;
}

char *router_responses_body(router_responses_t *store, const router_responses_req_t *req,
                            const char *chat, size_t n_chat, const char *session_id,
                            size_t *n_out)
{
    resp_result_t result;
    json_t *root = json_loadb(chat, n_chat, JSON_ALLOW_NUL, NULL); /* output may hold U+0000 */
    json_t *choice;
    json_t *obj = NULL;
    char *text = NULL;

    memset(&result, 0, sizeof(result));
    if (root == NULL) {
        return NULL;
    }
    if (json_object_get(root, "error") != NULL) {
        text = json_dumps(root, JSON_COMPACT);
        goto done;
    }
    choice = json_array_get(json_object_get(root, "choices"), 0);
    result.finish = resp_finish(json_string_value(json_object_get(choice, "finish_reason")));
    resp_take_usage(json_object_get(root, "usage"), &result);
    if (result_of_message(req, json_object_get(choice, "message"), result.finish, &result) !=
        TDM_OK) {
        goto done;
    }
    obj = resp_object(req, resp_status(&result), &result, NULL);
    if (obj == NULL || resp_store_result(store, req, &result, session_id) != TDM_OK) {
        goto done;
    }
    text = json_dumps(obj, JSON_COMPACT);
done:
    json_decref(obj);
    json_decref(result.output);
    json_decref(result.assistant);
    json_decref(root);
    if (text != NULL && n_out != NULL) {
        *n_out = strlen(text);
    }
    return text;
}
