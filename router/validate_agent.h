/* validate_agent.h - the agent-protocol fields of a chat request (issue 15): tools, tool_choice,
 * parallel_tool_calls, thinking mode, and the tool calls, tool results and reasoning that
 * messages carry. Internal to router/validate.c (not used elsewhere).
 *
 * Request fields (OpenAI chat completions, plus DeepSeek's "thinking" and vLLM/SGLang's
 * "chat_template_kwargs"):
 *   tools                 array of {"type": "function", "function": {"name", "description",
 *                         "parameters", "strict"}}; null or absent = none
 *   tool_choice           "auto" (default), "none", "required", or
 *                         {"type": "function", "function": {"name": ...}}
 *   parallel_tool_calls   boolean, default true
 *   thinking              {"type": "enabled" | "disabled"}; default disabled
 *   chat_template_kwargs  {"thinking": bool, "enable_thinking": bool}; the same switch
 *   reasoning_effort      "high" or "max" (encoding_dsv4.py's values; "max" adds the release's
 *                         maximum-effort instruction in thinking mode, "high" changes nothing)
 * Message fields: assistant "tool_calls" ([{"id", "type": "function", "function": {"name",
 * "arguments"}}]), "reasoning_content" (string), tool "tool_call_id".
 *
 * Refusals (TDM_ERR_INVALID_ARG, HTTP 400, type invalid_request_error; code, param):
 *   invalid_type, tools                 tools not an array; an entry or its "function" not an
 *                                       object; name/description not strings; parameters not an
 *                                       object; strict not a boolean
 *   invalid_value, tools                empty array; more than ROUTER_MAX_TOOLS; "type" other
 *                                       than "function"; a name outside [A-Za-z0-9_-]{1,64};
 *                                       two tools with one name
 *   unsupported_parameter, tools        a member of a tool or function object other than the
 *                                       above (named in the message)
 *   invalid_type / invalid_value, tool_choice
 *                                       not a string or object; an unknown string; an object
 *                                       that is not {"type": "function", "function": {"name"}};
 *                                       "required" or a named function without tools; a name
 *                                       that is not one of the tools
 *   invalid_type, parallel_tool_calls   not a boolean
 *   invalid_type / invalid_value, thinking
 *                                       not an object; "type" not "enabled" or "disabled";
 *                                       another member (e.g. budget_tokens)
 *   invalid_type / invalid_value, chat_template_kwargs
 *                                       not an object; a known key not a boolean; an unknown key
 *                                       (named); a value that contradicts "thinking" or the
 *                                       other key
 *   invalid_type / invalid_value, reasoning_effort
 *                                       not a string; not "high" or "max"
 *   unsupported_parameter, functions / function_call
 *                                       the deprecated function-calling fields (use tools)
 *   unsupported_parameter, tools / tool_choice / parallel_tool_calls / thinking /
 *                          chat_template_kwargs / reasoning_effort   on /v1/completions
 *   invalid_type / invalid_value, messages
 *                                       tool_calls on a message that is not the assistant's, not
 *                                       an array, an entry not an object, "type" not "function",
 *                                       "id" not a string, a bad function name, arguments not a
 *                                       string or object or not the JSON text of an object;
 *                                       function_call on a message; tool_call_id missing on a
 *                                       tool message, not a string, or on another role; a tool
 *                                       message that does not follow an assistant message with
 *                                       tool_calls, or names an id none of those calls has;
 *                                       reasoning_content not a string
 */
#ifndef TANDEM_ROUTER_VALIDATE_AGENT_H
#define TANDEM_ROUTER_VALIDATE_AGENT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/apierr.h"
#include "router/validate.h"
#include "text/tokenizer.h"

/* Most tools per request (OpenAI's limit). */
#define ROUTER_MAX_TOOLS 128

/* What the parsed messages borrow beyond the request JSON: their tool calls, and the JSON text
 * of arguments sent as objects. Zero-initialise; release with router_agent_scratch_fini. */
typedef struct {
    text_chat_tool_call_t *calls;
    size_t n_calls;
    char **texts;
    size_t n_texts;
} router_agent_scratch_t;

/*
 * router_agent_fields - parse the request-level agent fields of `root` (the body object) into
 * req: thinking, tools_json / n_tools, tool_choice / tool_choice_name, parallel_tool_calls
 * (req must hold their defaults: 0, NULL, AUTO, 1). On /v1/completions (api) any of them is
 * refused. Returns TDM_OK, TDM_ERR_INVALID_ARG (*err filled, see above) or TDM_ERR_NO_MEMORY
 * (*err a 500). What was set in req before a failure is freed by router_gen_request_fini.
 */
tdm_status_t router_agent_fields(const json_t *root, router_api_t api, router_gen_request_t *req,
                                 router_apierr_t *err);

/*
 * router_agent_chat_flags - the text_chat_flags_t bits the request asks for, after
 * router_agent_fields accepted it: TEXT_CHAT_THINKING (req->thinking) and
 * TEXT_CHAT_REASONING_MAX (reasoning_effort "max").
 */
uint32_t router_agent_chat_flags(const json_t *root, const router_gen_request_t *req);

/*
 * router_agent_messages - fill the tool calls, tool_call_id and reasoning of msgs[i] from
 * messages[i] (the request's "messages" array, n entries; roles already set), and check that
 * every tool result answers a call of the assistant message before it. Strings are borrowed
 * from `messages` and `scratch`. Returns TDM_OK, TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_agent_messages(const json_t *messages, text_chat_message_t *msgs, size_t n,
                                   router_agent_scratch_t *scratch, router_apierr_t *err);

/* router_agent_scratch_fini - free the scratch and zero it. Accepts a zeroed one. */
void router_agent_scratch_fini(router_agent_scratch_t *scratch);

#endif
