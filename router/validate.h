/* validate.h - turn an OpenAI-style request body into a checked generation request.
 *
 * Owns the rules of what the router accepts on POST /v1/chat/completions and /v1/completions:
 * content type, JSON shape, model name, sampling parameters, stop strings, logprobs, prompt
 * forms (chat messages, text, token ids) and limits (vocabulary, image content, context). It
 * tokenizes (chat template or plain text) so the prompt length is checked here, before any page
 * is reserved anywhere. Every refusal is an OpenAI-shaped router_apierr_t with the HTTP status.
 * Knows nothing of sessions, workers or transport. Thread-safe (the model is read-only).
 */
#ifndef TANDEM_ROUTER_VALIDATE_H
#define TANDEM_ROUTER_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/apierr.h"
#include "router/model.h"

/* Most stop strings per request (OpenAI's limit). */
#define ROUTER_MAX_STOP_STRINGS 4
/* Longest stop string, bytes. */
#define ROUTER_MAX_STOP_BYTES 256
/* Most log-probability alternatives per token (chat top_logprobs). */
#define ROUTER_MAX_TOP_LOGPROBS 20
/* Most alternatives of the legacy completions "logprobs" integer. */
#define ROUTER_MAX_COMPLETION_LOGPROBS 5
/* max_tokens of /v1/completions when the client sends none (OpenAI's default). */
#define ROUTER_COMPLETIONS_DEFAULT_MAX_TOKENS 16
/* Most choices of one request ("n"; each decodes its own copy of the prompt's KV). */
#define ROUTER_MAX_CHOICES 8
/* Largest temperature accepted (OpenAI's range is [0, 2]). */
#define ROUTER_MAX_TEMPERATURE 2.0
/* Temperatures below this are accepted and sent on as 0, greedy: the limit of sampling as the
 * temperature goes to 0 (1e-310 would overflow logit / tau). The same line as the engine's
 * ENGINE_SAMPLER_GREEDY_BELOW, which tandem-generate applies (docs/PROTOCOL.md 3c). */
#define ROUTER_GREEDY_BELOW_TEMPERATURE 1e-5

/* The two generation endpoints. */
typedef enum {
    ROUTER_API_CHAT = 0,        /* POST /v1/chat/completions */
    ROUTER_API_COMPLETIONS = 1, /* POST /v1/completions */
} router_api_t;

/*
 * The drafter a request asks the decode node for (Tandem extension field "spec"; MODEL.md 8).
 * Speculative decoding never changes the tokens (coupled acceptance), only how fast they come.
 */
typedef enum {
    ROUTER_SPEC_DEFAULT = 0, /* field absent or null: the decode node's own --spec */
    ROUTER_SPEC_OFF = 1,     /* "off": plain decoding */
    ROUTER_SPEC_DSPARK = 2,  /* "dspark": the model's DSpark drafter */
    ROUTER_SPEC_NGRAM = 3,   /* "ngram": prompt-lookup drafter */
} router_spec_t;

/*
 * router_spec_name - the DecodeRequest.spec string of `spec` (tandem.proto): "" for
 * ROUTER_SPEC_DEFAULT (the node decides), else "off", "dspark" or "ngram". Static storage.
 */
const char *router_spec_name(router_spec_t spec);

/* tool_choice of a chat request (OpenAI; issue 15). */
typedef enum {
    ROUTER_TOOL_CHOICE_AUTO = 0,     /* absent or "auto": the model may call a tool */
    ROUTER_TOOL_CHOICE_NONE = 1,     /* "none": no call (tools still rendered, as the encoder does) */
    ROUTER_TOOL_CHOICE_REQUIRED = 2, /* "required": at least one call, forced by the constraint */
    ROUTER_TOOL_CHOICE_NAMED = 3,    /* {"type":"function","function":{"name":...}}: that call */
} router_tool_choice_t;

/*
 * A checked generation request (plain data; owns prompt_ids and the stop strings, released by
 * router_gen_request_fini). Sampling fields follow MODEL.md section 8.
 */
typedef struct {
    router_api_t api;
    int stream;          /* 1: answer as server-sent events */
    int include_usage;   /* stream_options.include_usage: a final usage chunk */
    int32_t *prompt_ids; /* [n_prompt_ids], each in [0, V), no image token */
    size_t n_prompt_ids; /* >= 1 and < max context */
    uint32_t max_tokens; /* >= 1; prompt + max_tokens <= max context */
    double temperature;  /* 0 or [1e-5, 2] (tiny values become 0); default 1 */
    int32_t top_k;       /* 0 off */
    double top_p;        /* (0, 1]; default 1 */
    double min_p;        /* [0, 1]; default 0 */
    uint64_t seed;       /* the client's seed, else a fresh random one */
    int n_logprobs;      /* -1 off; 0 chosen token only; 1..20 alternatives too */
    int ignore_eos;      /* 1: EOS does not end the completion */
    int n_stop;          /* stop strings */
    char *stop[ROUTER_MAX_STOP_STRINGS];
    size_t stop_bytes[ROUTER_MAX_STOP_STRINGS];
    router_spec_t spec; /* "spec": the drafter; DEFAULT when absent or null */
    /* ---- agent protocol (issue 15; docs/PROTOCOL.md). All zero/NULL = plain chat. ---- */
    int thinking;                     /* 1: thinking mode (the prompt opens <think>, output
                                         before </think> is reasoning_content) */
    char *tools_json;                 /* owned: compact JSON array of the request's function tools
                                         as [{"type":"function","function":{name, description,
                                         parameters}}], or NULL when none */
    size_t n_tools;                   /* entries in tools_json */
    router_tool_choice_t tool_choice; /* AUTO when absent */
    char *tool_choice_name;           /* owned: NAMED only, the function's name; else NULL */
    int parallel_tool_calls;          /* 1 (default): several calls may come in one turn */
    char *response_format_json;       /* owned: compact JSON of response_format when it is
                                         json_object or json_schema; NULL for absent or "text" */
    uint32_t n_choices;               /* "n": choices forked from one prefilled prompt (>= 1) */
    uint32_t min_tokens;              /* EOS and stop strings do not end before this many */
    char *tool_constraint_json;       /* owned: tool_choice REQUIRED or NAMED with tools: the
                                         router_tool_constraint_build JSON the sampling node
                                         forces a DSML call with (SamplingParams.tool_calls);
                                         else NULL */
} router_gen_request_t;

/*
 * router_validate_request - check `body` (n_body bytes, borrowed) sent to `api` with header
 * Content-Type `content_type` (NULL when absent) and fill *req_out.
 *
 * Refusals (TDM_ERR_INVALID_ARG; *err_out filled, *req_out zeroed):
 *   415 unsupported_media_type   content type other than application/json
 *   400 invalid_json             malformed JSON, or not an object
 *   400 invalid_type / invalid_value / missing_parameter / unsupported_parameter
 *                                a field of the wrong type or out of range (max_tokens not a
 *                                positive integer, temperature or top_p NaN, infinite or out
 *                                of range, n outside [1, ROUTER_MAX_CHOICES], min_tokens
 *                                negative or over max_tokens, penalties, "spec" not one of "off",
 *                                "dspark", "ngram", or "dspark" for a model without DSpark
 *                                blocks, ...)
 *   404 model_not_found          "model" is not the served model
 *   400 empty_prompt             no messages, or an empty prompt
 *   400 unsupported_input        image content, or the image token id in a prompt
 *   400 unsupported_parameter    response_format: a type other than text, json_object and
 *                                json_schema, or a schema keyword text/constrain.h does not
 *                                support (the message names its path, e.g.
 *                                "response_format.json_schema.schema.properties.x.pattern");
 *                                ignore_eos with a response_format
 *   400 invalid_token_id         a prompt id outside [0, V)
 *   400 context_length_exceeded  prompt (plus max_tokens) over the max context
 *   400 invalid_type / invalid_value / missing_parameter / unsupported_parameter
 *                                the agent-protocol fields (tools, tool_choice,
 *                                parallel_tool_calls, thinking, chat_template_kwargs, the
 *                                messages' tool_calls, tool_call_id, reasoning_content; the
 *                                deprecated functions / function_call): each refusal is listed
 *                                in router/validate_agent.h
 * TDM_ERR_NO_MEMORY: *err_out is a 500. `seed_fallback` is the seed used when the client sends
 * none. Thread-safe.
 */
tdm_status_t router_validate_request(const router_model_t *model, router_api_t api,
                                     const char *content_type, const char *body, size_t n_body,
                                     uint64_t seed_fallback, router_gen_request_t *req_out,
                                     router_apierr_t *err_out);

/* router_gen_request_fini - free what the request owns and zero it. Accepts a zeroed struct. */
void router_gen_request_fini(router_gen_request_t *req);

#endif
