/* constrain.h - the router's side of constrained decoding (docs/PROTOCOL.md, "Constrained
 * decoding"): a request's response_format and its forced tool call (tool_choice "required" or a
 * named function) are compiled here with text/constrain.h only to refuse what the sampling node
 * could not enforce, with a 400 naming the field or schema keyword; what passes travels as JSON
 * text in SamplingParams (response_format, tool_calls) to the node that samples. Knows nothing of
 * tokens, masks or transport. Thread-safe.
 */
#ifndef TANDEM_ROUTER_CONSTRAIN_H
#define TANDEM_ROUTER_CONSTRAIN_H

#include <jansson.h>

#include "common/status.h"
#include "router/apierr.h"
#include "router/model.h"
#include "router/validate.h"

/*
 * router_response_format_parse - read "response_format" of the request body `root` into
 * req->response_format_json: absent, null or {"type":"text"}: NULL (no constraint);
 * {"type":"json_object"} and {"type":"json_schema",...}: their compact JSON (malloc'ed, owned by
 * req) once text_constraint_compile accepts them.
 * Refusals (TDM_ERR_INVALID_ARG, *err filled, req unchanged): 400 invalid_type on
 * response_format (not an object); 400 unsupported_parameter on response_format (another type, a
 * schema keyword or field text/constrain.h does not support: the message names its path, e.g.
 * "response_format.json_schema.schema.properties.age.minimum: unsupported keyword"); 400
 * unsupported_parameter on ignore_eos (with a constraint: the completion ends where its JSON
 * does, so EOS must stay a stop token; also when the model names no EOS). TDM_ERR_NO_MEMORY: 500.
 */
tdm_status_t router_response_format_parse(const router_model_info_t *info, const json_t *root,
                                          router_gen_request_t *req, router_apierr_t *err);

/*
 * router_tool_constraint_build - the constraint of a request whose tool_choice is REQUIRED or
 * NAMED (text/constrain.h's tool-call language): {"thinking": req->thinking, "parallel":
 * req->parallel_tool_calls (always false for NAMED), "tools": [{"name", "parameters"}]} of every
 * tool in req->tools_json (REQUIRED) or of the one named req->tool_choice_name (NAMED), checked by
 * compiling it. *json_out: malloc'ed compact JSON (caller frees), or NULL when the request asks
 * for no forced call (AUTO, NONE, or no tools).
 * Refusals (TDM_ERR_INVALID_ARG, *err_out filled, *json_out NULL): 400 invalid_value on
 * tool_choice (no tool of that name); 400 unsupported_parameter on tools (a parameters schema
 * keyword the constraint does not support, named by path, e.g.
 * "tools[0].parameters.properties.x.pattern"); 400 unsupported_parameter on response_format
 * or ignore_eos (with a forced call); 400 unsupported_parameter on min_tokens (with a
 * response_format or a forced call: the stop id is the only token once the constraint is met). TDM_ERR_NO_MEMORY: a 500. Thread-safe.
 */
tdm_status_t router_tool_constraint_build(const router_gen_request_t *req, char **json_out,
                                          router_apierr_t *err_out);

#endif
