/* constrain.c - the router's side of constrained decoding: response_format and forced tool
 * calls checked (text/constrain.h compiles them) and turned into what the sampling node gets
 * (see constrain.h). */
#include "router/constrain.h"

#include <stdlib.h>
#include <string.h>

#include "common/http_status.h"
#include "text/constrain.h"



tdm_status_t router_response_format_parse(const router_model_info_t *info, const json_t *root,
                                          router_gen_request_t *req, router_apierr_t *err)
{
    json_t *rf = json_object_get(root, "response_format");
    const char *type;
    text_constraint_t *c = NULL;
    char reason[256] = "";
    char *text;
    tdm_status_t status;

    if (rf == NULL || json_is_null(rf)) {
        return TDM_OK;
    }
    if (!json_is_object(rf)) {
        return router_apierr_bad(err, "invalid_type", "response_format", "'response_format' must be an object");
    }
    type = json_string_value(json_object_get(rf, "type"));
    if (type != NULL && strcmp(type, "text") == 0 && json_object_size(rf) == 1) {
        return TDM_OK;
    }
    text = json_dumps(rf, JSON_COMPACT);
    if (text == NULL) {
        return router_apierr_no_memory(err);
    }
    status = text_constraint_compile(text, strlen(text), &c, reason, sizeof(reason));
    text_constraint_destroy(c);
    if (status == TDM_ERR_NO_MEMORY) {
        free(text);
        return router_apierr_no_memory(err);
    }
    if (status != TDM_OK) {
        free(text);
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                          "unsupported_parameter", "response_format", "%s", reason);
        return TDM_ERR_INVALID_ARG;
    }
    if (req->ignore_eos || info->eos_id < 0) {
        free(text);
        return router_apierr_bad(err, "unsupported_parameter", "ignore_eos",
                   "'ignore_eos' cannot be combined with 'response_format': a constrained "
                   "completion ends where its JSON value does");
    }
    req->response_format_json = text;
    return TDM_OK;
}

tdm_status_t router_tool_constraint_build(const router_gen_request_t *req, char **json_out,
                                          router_apierr_t *err)
{
    int named = req->tool_choice == ROUTER_TOOL_CHOICE_NAMED;
    json_t *tools;
    json_t *picked = NULL;
    json_t *spec = NULL;
    json_t *tool;
    text_constraint_t *c = NULL;
    char reason[256] = "";
    char *text = NULL;
    size_t i;
    tdm_status_t status = TDM_OK;

    *json_out = NULL;
    if (req->min_tokens > 0 &&
        (req->response_format_json != NULL ||
         ((req->tool_choice == ROUTER_TOOL_CHOICE_REQUIRED || named) && req->tools_json != NULL))) {
        return router_apierr_bad(err, "unsupported_parameter", "min_tokens",
                   "'min_tokens' cannot be combined with a constrained output (response_format or "
                   "a forced tool call): the completion ends where the constraint does");
    }
    if ((req->tool_choice != ROUTER_TOOL_CHOICE_REQUIRED && !named) || req->tools_json == NULL) {
        return TDM_OK;
    }
    if (req->ignore_eos) {
        return router_apierr_bad(err, "unsupported_parameter", "ignore_eos",
                   "'ignore_eos' cannot be combined with a forced tool call: the completion ends "
                   "with its tool-call block");
    }
    if (req->response_format_json != NULL) {
        return router_apierr_bad(err, "unsupported_parameter", "response_format",
                   "'response_format' cannot be combined with a forced tool call (tool_choice "
                   "\"required\" or a named function)");
    }
    tools = json_loads(req->tools_json, JSON_ALLOW_NUL, NULL); /* as the request was read */
    picked = json_array();
    if (tools == NULL || picked == NULL) {
        json_decref(tools);
        json_decref(picked);
        return router_apierr_no_memory(err);
    }
    json_array_foreach(tools, i, tool)
    {
        const json_t *fn = json_object_get(tool, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *entry;

        if (name == NULL || (named && (req->tool_choice_name == NULL ||
                                       strcmp(name, req->tool_choice_name) != 0))) {
            continue;
        }
        entry = json_pack("{s:s}", "name", name);
        if (entry == NULL) {
            status = router_apierr_no_memory(err);
            break;
        }
        if (json_object_get(fn, "parameters") != NULL) {
            json_object_set(entry, "parameters", json_object_get(fn, "parameters"));
        }
        json_array_append_new(picked, entry);
    }
    if (status == TDM_OK && json_array_size(picked) == 0) {
        status = router_apierr_bad(err, "invalid_value", "tool_choice",
                     named ? "tool_choice names a function that is not among the tools"
                           : "tool_choice \"required\" needs at least one function tool");
    }
    if (status == TDM_OK) {
        spec = json_pack("{s:b,s:b,s:O}", "thinking", req->thinking != 0, "parallel",
                         !named && req->parallel_tool_calls != 0, "tools", picked);
        text = spec == NULL ? NULL : json_dumps(spec, JSON_COMPACT);
        status = text == NULL ? router_apierr_no_memory(err) : TDM_OK;
    }
    if (status == TDM_OK) {
        status = text_constraint_compile_tool_calls(text, strlen(text), &c, reason, sizeof(reason));
        text_constraint_destroy(c);
        if (status == TDM_ERR_NO_MEMORY) {
            status = router_apierr_no_memory(err);
        } else if (status != TDM_OK) {
            router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                              "unsupported_parameter", "tools", "%s", reason);
        }
    }
    json_decref(spec);
    json_decref(picked);
    json_decref(tools);
    if (status != TDM_OK) {
        free(text);
        return status;
    }
    *json_out = text;
    return TDM_OK;
}
