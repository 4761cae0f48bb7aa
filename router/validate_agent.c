/* validate_agent.c - the agent-protocol fields of a chat request (router/validate_agent.h).
 *
 * Field shapes follow the OpenAI chat-completions reference (tools, tool_choice,
 * parallel_tool_calls, assistant tool_calls, tool tool_call_id), DeepSeek's API
 * (thinking: {"type": "enabled" | "disabled"}, reasoning_content) and vLLM / SGLang
 * (chat_template_kwargs.thinking, .enable_thinking). How they reach the prompt:
 * text/chat_dsv4.c.
 */
#include "router/validate_agent.h"

#include <stdlib.h>
#include <string.h>

#include "common/http_status.h"

static tdm_status_t bad(router_apierr_t *err, const char *code, const char *param, const char *fmt,
                        const char *detail)
{
    router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, code, param, fmt,
                      detail);
    return TDM_ERR_INVALID_ARG;
}


/* A present, non-null member, or NULL. */
static json_t *member(const json_t *obj, const char *key)
{
    json_t *value = json_object_get(obj, key);
    return json_is_null(value) ? NULL : value;
}

/* OpenAI's function-name rule: 1..64 of [A-Za-z0-9_-]. */
static int valid_name(const json_t *name)
{
    const char *s;
    size_t n;

    if (!json_is_string(name)) {
        return 0;
    }
    s = json_string_value(name);
    n = json_string_length(name);
    if (n == 0 || n > 64) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-')) {
            return 0;
        }
    }
    return 1;
}

/* ---- thinking ------------------------------------------------------------------------------ */

/* One boolean chat_template_kwargs key; *value_out -1 when absent. */
static tdm_status_t kwarg_bool(const json_t *kwargs, const char *key, int *value_out,
                               router_apierr_t *err)
{
    json_t *value = member(kwargs, key);

    *value_out = -1;
    if (value == NULL) {
        return TDM_OK;
    }
    if (!json_is_boolean(value)) {
        return bad(err, "invalid_type", "chat_template_kwargs",
                   "'chat_template_kwargs.%s' must be a boolean", key);
    }
    *value_out = json_is_true(value);
    return TDM_OK;
}

static tdm_status_t get_thinking(const json_t *root, router_gen_request_t *req,
                                 router_apierr_t *err)
{
    json_t *thinking = member(root, "thinking");
    json_t *kwargs = member(root, "chat_template_kwargs");
    int from_thinking = -1, from_kwarg = -1, from_enable = -1;
    const char *key;
    json_t *value;
    tdm_status_t status;

    if (thinking != NULL) {
        json_t *type = json_object_get(thinking, "type");
        if (!json_is_object(thinking)) {
            return bad(err, "invalid_type", "thinking", "%s",
                       "'thinking' must be an object: {\"type\": \"enabled\" | \"disabled\"}");
        }
        json_object_foreach(thinking, key, value)
        {
            if (strcmp(key, "type") != 0) {
                return bad(err, "invalid_value", "thinking",
                           "'thinking.%.64s' is not supported (only 'type')", key);
            }
        }
        if (json_is_string(type) && strcmp(json_string_value(type), "enabled") == 0) {
            from_thinking = 1;
        } else if (json_is_string(type) && strcmp(json_string_value(type), "disabled") == 0) {
            from_thinking = 0;
        } else {
            return bad(err, "invalid_value", "thinking", "%s",
                       "'thinking.type' must be \"enabled\" or \"disabled\"");
        }
    }
    if (kwargs != NULL) {
        if (!json_is_object(kwargs)) {
            return bad(err, "invalid_type", "chat_template_kwargs", "%s",
                       "'chat_template_kwargs' must be an object");
        }
        json_object_foreach(kwargs, key, value)
        {
            if (strcmp(key, "thinking") != 0 && strcmp(key, "enable_thinking") != 0) {
                return bad(err, "invalid_value", "chat_template_kwargs",
                           "'chat_template_kwargs.%.64s' is not supported (only 'thinking' and "
                           "'enable_thinking')",
                           key);
            }
        }
        status = kwarg_bool(kwargs, "thinking", &from_kwarg, err);
        if (status == TDM_OK) {
            status = kwarg_bool(kwargs, "enable_thinking", &from_enable, err);
        }
        if (status != TDM_OK) {
            return status;
        }
    }
    req->thinking = 0; /* the default: DeepSeek's API, vLLM and SGLang all start non-thinking */
    for (int i = 0; i < 3; i++) {
        int v = i == 0 ? from_thinking : i == 1 ? from_kwarg : from_enable;
        if (v < 0) {
            continue;
        }
        if ((from_thinking >= 0 && v != from_thinking) || (from_kwarg >= 0 && v != from_kwarg) ||
            (from_enable >= 0 && v != from_enable)) {
            return bad(err, "invalid_value", "chat_template_kwargs", "%s",
                       "'thinking', 'chat_template_kwargs.thinking' and "
                       "'chat_template_kwargs.enable_thinking' disagree");
        }
        req->thinking = v;
    }
    return TDM_OK;
}

/* ---- tools --------------------------------------------------------------------------------- */

/* The function object as rendered and passed on: the client's members in its order, nulls
 * dropped. *fn_out gets a new reference. */
static tdm_status_t check_function(const json_t *fn, json_t **fn_out, router_apierr_t *err)
{
    json_t *copy;
    const char *key;
    json_t *value;

    if (!json_is_object(fn)) {
        return bad(err, "invalid_type", "tools", "%s",
                   "each tool needs a 'function' object: {\"name\", \"description\", "
                   "\"parameters\"}");
    }
    if (!valid_name(json_object_get(fn, "name"))) {
        return bad(err, "invalid_value", "tools", "%s",
                   "'tools[].function.name' must be 1 to 64 characters of a-z, A-Z, 0-9, _ "
                   "and -");
    }
    copy = json_object();
    if (copy == NULL) {
        return router_apierr_no_memory(err);
    }
    json_object_foreach((json_t *)fn, key, value)
    {
        const char *wrong = NULL;
        if (json_is_null(value)) {
            continue;
        }
        if (strcmp(key, "description") == 0) {
            wrong =
                json_is_string(value) ? NULL : "'tools[].function.description' must be a string";
        } else if (strcmp(key, "parameters") == 0) {
            wrong = json_is_object(value) ? NULL
                                          : "'tools[].function.parameters' must be a JSON "
                                            "Schema object";
        } else if (strcmp(key, "strict") == 0) {
            wrong = json_is_boolean(value) ? NULL : "'tools[].function.strict' must be a boolean";
        } else if (strcmp(key, "name") != 0) {
            json_decref(copy);
            return bad(err, "unsupported_parameter", "tools",
                       "'tools[].function.%.64s' is not supported", key);
        }
        if (wrong != NULL) {
            json_decref(copy);
            return bad(err, "invalid_type", "tools", "%s", wrong);
        }
        if (json_object_set(copy, key, value) != 0) {
            json_decref(copy);
            return router_apierr_no_memory(err);
        }
    }
    *fn_out = copy;
    return TDM_OK;
}

static tdm_status_t get_tools(const json_t *root, router_gen_request_t *req, router_apierr_t *err)
{
    json_t *tools = member(root, "tools");
    json_t *out;
    tdm_status_t status = TDM_OK;

    if (tools == NULL) {
        return TDM_OK;
    }
    if (!json_is_array(tools)) {
        return bad(err, "invalid_type", "tools", "%s", "'tools' must be an array of tools");
    }
    if (json_array_size(tools) == 0 || json_array_size(tools) > ROUTER_MAX_TOOLS) {
        return bad(err, "invalid_value", "tools", "%s",
                   "'tools' must hold 1 to 128 tools (omit it for none)");
    }
    out = json_array();
    if (out == NULL) {
        return router_apierr_no_memory(err);
    }
    for (size_t i = 0; i < json_array_size(tools) && status == TDM_OK; i++) {
        json_t *tool = json_array_get(tools, i);
        json_t *type = json_object_get(tool, "type");
        json_t *fn = NULL, *entry;
        const char *key;
        json_t *value;
        if (!json_is_object(tool)) {
            status = bad(err, "invalid_type", "tools", "%s", "each tool must be an object");
            break;
        }
        json_object_foreach(tool, key, value)
        {
            if (strcmp(key, "type") != 0 && strcmp(key, "function") != 0) {
                status = bad(err, "unsupported_parameter", "tools",
                             "'tools[].%.64s' is not supported", key);
                break;
            }
        }
        if (status != TDM_OK) {
            break;
        }
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0) {
            status = bad(err, "invalid_value", "tools", "%s",
                         "only tools of \"type\": \"function\" are supported");
            break;
        }
        status = check_function(json_object_get(tool, "function"), &fn, err);
        if (status != TDM_OK) {
            break;
        }
        for (size_t k = 0; k < json_array_size(out); k++) {
            json_t *other = json_object_get(json_array_get(out, k), "function");
            if (json_equal(json_object_get(other, "name"), json_object_get(fn, "name"))) {
                status = bad(err, "invalid_value", "tools", "two tools are named '%s'",
                             json_string_value(json_object_get(fn, "name")));
                break;
            }
        }
        entry =
            status == TDM_OK ? json_pack("{s:s, s:O}", "type", "function", "function", fn) : NULL;
        json_decref(fn);
        if (status == TDM_OK && (entry == NULL || json_array_append_new(out, entry) != 0)) {
            status = router_apierr_no_memory(err);
        }
    }
    if (status == TDM_OK) {
        req->tools_json = json_dumps(out, JSON_COMPACT);
        req->n_tools = json_array_size(out);
        if (req->tools_json == NULL) {
            req->n_tools = 0;
            status = router_apierr_no_memory(err);
        }
    }
    json_decref(out);
    return status;
}

/* Whether `name` is one of the request's tools (tools_json as get_tools wrote it). */
static int has_tool(const router_gen_request_t *req, const char *name)
{
    json_t *tools = req->tools_json != NULL ? json_loads(req->tools_json, 0, NULL) : NULL;
    int found = 0;

    for (size_t i = 0; i < json_array_size(tools) && !found; i++) {
        json_t *fn = json_object_get(json_array_get(tools, i), "function");
        found = strcmp(json_string_value(json_object_get(fn, "name")), name) == 0;
    }
    json_decref(tools);
    return found;
}

static tdm_status_t get_tool_choice(const json_t *root, router_gen_request_t *req,
                                    router_apierr_t *err)
{
    static const char NEEDS_TOOLS[] = "'tool_choice' %s needs 'tools'";
    json_t *choice = member(root, "tool_choice");
    json_t *type, *fn, *name;
    const char *key;
    json_t *value;

    req->tool_choice = ROUTER_TOOL_CHOICE_AUTO;
    if (choice == NULL) {
        return TDM_OK;
    }
    if (json_is_string(choice)) {
        const char *s = json_string_value(choice);
        if (strcmp(s, "auto") == 0) {
            return TDM_OK;
        }
        if (strcmp(s, "none") == 0) {
            req->tool_choice = ROUTER_TOOL_CHOICE_NONE;
            return TDM_OK;
        }
        if (strcmp(s, "required") == 0) {
            if (req->n_tools == 0) {
                return bad(err, "invalid_value", "tool_choice", NEEDS_TOOLS, "\"required\"");
            }
            req->tool_choice = ROUTER_TOOL_CHOICE_REQUIRED;
            return TDM_OK;
        }
        return bad(err, "invalid_value", "tool_choice",
                   "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": "
                   "\"function\", \"function\": {\"name\": ...}} (got '%.64s')",
                   s);
    }
    if (!json_is_object(choice)) {
        return bad(err, "invalid_type", "tool_choice", "%s",
                   "'tool_choice' must be a string or an object");
    }
    type = json_object_get(choice, "type");
    fn = json_object_get(choice, "function");
    name = json_object_get(fn, "name");
    json_object_foreach(choice, key, value)
    {
        if (strcmp(key, "type") != 0 && strcmp(key, "function") != 0) {
            return bad(err, "invalid_value", "tool_choice", "'tool_choice.%.64s' is not supported",
                       key);
        }
    }
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
        !json_is_object(fn) || json_object_size(fn) != 1 || !json_is_string(name)) {
        return bad(err, "invalid_value", "tool_choice", "%s",
                   "a named 'tool_choice' must be {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}");
    }
    if (req->n_tools == 0) {
        return bad(err, "invalid_value", "tool_choice", NEEDS_TOOLS, "naming a function");
    }
    if (!has_tool(req, json_string_value(name))) {
        return bad(err, "invalid_value", "tool_choice",
                   "'tool_choice' names '%.64s', which is not one of the 'tools'",
                   json_string_value(name));
    }
    req->tool_choice_name = strdup(json_string_value(name));
    if (req->tool_choice_name == NULL) {
        return router_apierr_no_memory(err);
    }
    req->tool_choice = ROUTER_TOOL_CHOICE_NAMED;
    return TDM_OK;
}

/* reasoning_effort: the values DeepSeek-V4's encoder takes ("high" renders as no effort). */
static tdm_status_t check_effort(const json_t *root, router_apierr_t *err)
{
    json_t *effort = member(root, "reasoning_effort");

    if (effort == NULL) {
        return TDM_OK;
    }
    if (!json_is_string(effort)) {
        return bad(err, "invalid_type", "reasoning_effort", "%s",
                   "'reasoning_effort' must be a string: \"high\" or \"max\"");
    }
    if (strcmp(json_string_value(effort), "high") != 0 &&
        strcmp(json_string_value(effort), "max") != 0) {
        return bad(err, "invalid_value", "reasoning_effort",
                   "'reasoning_effort' must be \"high\" or \"max\" (DeepSeek-V4 has no "
                   "'%.32s')",
                   json_string_value(effort));
    }
    return TDM_OK;
}

uint32_t router_agent_chat_flags(const json_t *root, const router_gen_request_t *req)
{
    json_t *effort = member(root, "reasoning_effort");
    uint32_t flags = 0;

    if (req->thinking) {
        flags |= TEXT_CHAT_THINKING;
    }
    if (json_is_string(effort) && strcmp(json_string_value(effort), "max") == 0) {
        flags |= TEXT_CHAT_REASONING_MAX;
    }
    return flags;
}

tdm_status_t router_agent_fields(const json_t *root, router_api_t api, router_gen_request_t *req,
                                 router_apierr_t *err)
{
    static const char *const CHAT_ONLY[] = {
        "tools",    "tool_choice",          "parallel_tool_calls",
        "thinking", "chat_template_kwargs", "reasoning_effort"};
    static const char *const DEPRECATED[] = {"functions", "function_call"};
    json_t *parallel;
    tdm_status_t status;

    for (size_t i = 0; i < sizeof(DEPRECATED) / sizeof(DEPRECATED[0]); i++) {
        if (member(root, DEPRECATED[i]) != NULL) {
            return bad(err, "unsupported_parameter", DEPRECATED[i],
                       "'%s' (deprecated function calling) is not supported; use 'tools'",
                       DEPRECATED[i]);
        }
    }
    if (api != ROUTER_API_CHAT) {
        for (size_t i = 0; i < sizeof(CHAT_ONLY) / sizeof(CHAT_ONLY[0]); i++) {
            if (member(root, CHAT_ONLY[i]) != NULL) {
                return bad(err, "unsupported_parameter", CHAT_ONLY[i],
                           "'%s' is only supported on /v1/chat/completions", CHAT_ONLY[i]);
            }
        }
        return TDM_OK;
    }
    status = get_thinking(root, req, err);
    if (status == TDM_OK) {
        status = check_effort(root, err);
    }
    if (status == TDM_OK) {
        status = get_tools(root, req, err);
    }
    if (status == TDM_OK) {
        status = get_tool_choice(root, req, err);
    }
    if (status != TDM_OK) {
        return status;
    }
    parallel = member(root, "parallel_tool_calls");
    if (parallel != NULL) {
        if (!json_is_boolean(parallel)) {
            return bad(err, "invalid_type", "parallel_tool_calls", "%s",
                       "'parallel_tool_calls' must be a boolean");
        }
        req->parallel_tool_calls = json_is_true(parallel);
    }
    return TDM_OK;
}

/* ---- messages ------------------------------------------------------------------------------ */

static tdm_status_t keep_text(router_agent_scratch_t *scratch, char *text, router_apierr_t *err)
{
    char **texts = realloc(scratch->texts, (scratch->n_texts + 1) * sizeof(*texts));

    if (texts == NULL) {
        free(text);
        return router_apierr_no_memory(err);
    }
    scratch->texts = texts;
    scratch->texts[scratch->n_texts++] = text;
    return TDM_OK;
}

/* One assistant tool call into *call. */
static tdm_status_t parse_call(const json_t *item, text_chat_tool_call_t *call,
                               router_agent_scratch_t *scratch, router_apierr_t *err)
{
    json_t *id = member(item, "id");
    json_t *type = member(item, "type");
    json_t *fn = json_object_get(item, "function");
    json_t *name = json_object_get(fn, "name");
    json_t *args = json_object_get(fn, "arguments");
    json_t *parsed;

    if (!json_is_object(item) || !json_is_object(fn)) {
        return bad(err, "invalid_type", "messages", "%s",
                   "each 'tool_calls' entry must be an object with a 'function' object");
    }
    if (type != NULL &&
        (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)) {
        return bad(err, "invalid_value", "messages", "%s",
                   "'tool_calls[].type' must be \"function\"");
    }
    if (id != NULL && !json_is_string(id)) {
        return bad(err, "invalid_type", "messages", "%s", "'tool_calls[].id' must be a string");
    }
    if (!valid_name(name)) {
        return bad(err, "invalid_value", "messages", "%s",
                   "'tool_calls[].function.name' must be 1 to 64 characters of a-z, A-Z, 0-9, "
                   "_ and -");
    }
    if (json_is_object(args)) {
        /* some clients send the object itself: pass its JSON text on, key order kept */
        char *text = json_dumps(args, JSON_COMPACT);
        if (text == NULL || keep_text(scratch, text, err) != TDM_OK) {
            return router_apierr_no_memory(err);
        }
        call->arguments = text;
        call->arguments_bytes = strlen(text);
    } else if (json_is_string(args)) {
        parsed = json_loadb(json_string_value(args), json_string_length(args),
                            JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (!json_is_object(parsed)) {
            json_decref(parsed);
            return bad(err, "invalid_value", "messages", "%s",
                       "'tool_calls[].function.arguments' must be the JSON text of an object");
        }
        json_decref(parsed);
        call->arguments = json_string_value(args);
        call->arguments_bytes = json_string_length(args);
    } else {
        return bad(err, "invalid_type", "messages", "%s",
                   "'tool_calls[].function.arguments' must be a string (JSON of an object)");
    }
    if (id != NULL) {
        call->id = json_string_value(id);
        call->id_bytes = json_string_length(id);
    }
    call->name = json_string_value(name);
    call->name_bytes = json_string_length(name);
    return TDM_OK;
}

/* Whether `caller` made a call with id `id`. */
static int answers(const text_chat_message_t *caller, const text_chat_message_t *result)
{
    for (size_t k = 0; k < caller->n_tool_calls; k++) {
        const text_chat_tool_call_t *c = &caller->tool_calls[k];
        if (c->id_bytes == result->tool_call_id_bytes &&
            memcmp(c->id, result->tool_call_id, c->id_bytes) == 0) {
            return 1;
        }
    }
    return 0;
}

tdm_status_t router_agent_messages(const json_t *messages, text_chat_message_t *msgs, size_t n,
                                   router_agent_scratch_t *scratch, router_apierr_t *err)
{
    size_t n_calls = 0, next = 0;
    const text_chat_message_t *caller = NULL;
    tdm_status_t status = TDM_OK;

    for (size_t i = 0; i < n; i++) {
        json_t *calls = member(json_array_get(messages, i), "tool_calls");
        n_calls += json_is_array(calls) ? json_array_size(calls) : 0;
    }
    scratch->calls = calloc(n_calls + 1, sizeof(*scratch->calls));
    if (scratch->calls == NULL) {
        return router_apierr_no_memory(err);
    }
    scratch->n_calls = n_calls;
    for (size_t i = 0; i < n && status == TDM_OK; i++) {
        json_t *msg = json_array_get(messages, i);
        json_t *calls = member(msg, "tool_calls");
        json_t *call_id = member(msg, "tool_call_id");
        json_t *reasoning = member(msg, "reasoning_content");
        text_chat_message_t *m = &msgs[i];
        if (member(msg, "function_call") != NULL) {
            return bad(err, "unsupported_parameter", "messages", "%s",
                       "'function_call' in messages is not supported; use 'tool_calls'");
        }
        if (reasoning != NULL) {
            if (!json_is_string(reasoning)) {
                return bad(err, "invalid_type", "messages", "%s",
                           "'reasoning_content' must be a string");
            }
            m->reasoning = json_string_value(reasoning);
            m->reasoning_bytes = json_string_length(reasoning);
        }
        if (calls != NULL) {
            if (m->role != TEXT_CHAT_ASSISTANT) {
                return bad(err, "invalid_value", "messages", "%s",
                           "only assistant messages carry 'tool_calls'");
            }
            if (!json_is_array(calls)) {
                return bad(err, "invalid_type", "messages", "%s", "'tool_calls' must be an array");
            }
            m->tool_calls = scratch->calls + next;
            m->n_tool_calls = json_array_size(calls);
            for (size_t k = 0; k < m->n_tool_calls && status == TDM_OK; k++) {
                status =
                    parse_call(json_array_get(calls, k), &scratch->calls[next++], scratch, err);
            }
        }
        if (status != TDM_OK) {
            break;
        }
        if (m->role == TEXT_CHAT_ASSISTANT) {
            caller = m;
        } else if (m->role == TEXT_CHAT_TOOL) {
            if (call_id == NULL || !json_is_string(call_id)) {
                return bad(err, call_id == NULL ? "missing_parameter" : "invalid_type", "messages",
                           "%s", "a tool message needs a string 'tool_call_id'");
            }
            m->tool_call_id = json_string_value(call_id);
            m->tool_call_id_bytes = json_string_length(call_id);
            if (caller == NULL || caller->n_tool_calls == 0 || !answers(caller, m)) {
                return bad(err, "invalid_value", "messages",
                           "the tool message for '%.64s' does not answer a tool call of the "
                           "assistant message before it",
                           m->tool_call_id);
            }
        } else {
            if (call_id != NULL) {
                return bad(err, "invalid_value", "messages", "%s",
                           "only tool messages carry 'tool_call_id'");
            }
            caller = NULL; /* a user or system message ends the round of tool results */
        }
    }
    return status;
}

void router_agent_scratch_fini(router_agent_scratch_t *scratch)
{
    if (scratch == NULL) {
        return;
    }
    for (size_t i = 0; i < scratch->n_texts; i++) {
        free(scratch->texts[i]);
    }
    free(scratch->texts);
    free(scratch->calls);
    memset(scratch, 0, sizeof(*scratch));
}
