#include "router/validate.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/http_status.h"
#include "common/json.h"
#include "router/constrain.h"
#include "router/validate_agent.h"
#include "text/tokenizer.h"

static const char IMAGE_MESSAGE[] = "image inputs are not supported by this deployment";



static tdm_status_t image_refused(router_apierr_t *err, const char *param)
{
    return router_apierr_bad(err, "unsupported_input", param, IMAGE_MESSAGE);
}

static int content_type_is_json(const char *content_type)
{
    static const char JSON_TYPE[] = "application/json";
    size_t n = sizeof(JSON_TYPE) - 1;
    const char *rest;

    if (content_type == NULL) {
        return 0;
    }
    while (*content_type == ' ' || *content_type == '\t') {
        content_type++;
    }
    if (strncasecmp(content_type, JSON_TYPE, n) != 0) {
        return 0;
    }
    rest = content_type + n;
    while (*rest == ' ' || *rest == '\t') {
        rest++;
    }
    return *rest == '\0' || *rest == ';';
}

/* A present, non-null member, or NULL. */
static json_t *member(const json_t *root, const char *key)
{
    json_t *value = json_object_get(root, key);
    return json_is_null(value) ? NULL : value;
}

/* A finite number within [lo, hi] (lo_open: excludes lo). */
static tdm_status_t get_number(const json_t *root, const char *key, double lo, int lo_open,
                               double hi, double *value_out, router_apierr_t *err)
{
    json_t *value = member(root, key);
    double x;

    if (value == NULL) {
        return TDM_OK;
    }
    if (!json_is_number(value)) {
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, "invalid_type",
                          key, "'%s' must be a number", key);
        return TDM_ERR_INVALID_ARG;
    }
    x = json_number_value(value);
    if (!isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) {
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, "invalid_value",
                          key, "'%s' must be a finite number in %s%g, %g]", key,
                          lo_open ? "(" : "[", lo, hi);
        return TDM_ERR_INVALID_ARG;
    }
    *value_out = x;
    return TDM_OK;
}

/* An integer (an integral real is accepted) within [lo, hi]. *present_out set when given. */
static tdm_status_t get_int(const json_t *root, const char *key, int64_t lo, int64_t hi,
                            int64_t *value_out, int *present_out, router_apierr_t *err)
{
    json_t *value = member(root, key);
    int64_t x;

    if (value == NULL) {
        return TDM_OK;
    }
    if (!json_is_number(value) || tdm_json_int_exact(value, &x) != TDM_OK) {
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, "invalid_type",
                          key, "'%s' must be an integer", key);
        return TDM_ERR_INVALID_ARG;
    }
    if (x < lo || x > hi) {
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, "invalid_value",
                          key, "'%s' must be an integer in [%lld, %lld]", key, (long long)lo,
                          (long long)hi);
        return TDM_ERR_INVALID_ARG;
    }
    *value_out = x;
    if (present_out != NULL) {
        *present_out = 1;
    }
    return TDM_OK;
}

static tdm_status_t get_bool(const json_t *root, const char *key, int *value_out,
                             router_apierr_t *err)
{
    json_t *value = member(root, key);

    if (value == NULL) {
        return TDM_OK;
    }
    if (!json_is_boolean(value)) {
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, "invalid_type",
                          key, "'%s' must be a boolean", key);
        return TDM_ERR_INVALID_ARG;
    }
    *value_out = json_is_true(value);
    return TDM_OK;
}

/* Parameters this deployment does not implement: refused when set to a non-default value. */
static tdm_status_t check_unsupported(const json_t *root, router_apierr_t *err)
{
    static const char *const PENALTIES[] = {"presence_penalty", "frequency_penalty",
                                            "repetition_penalty"};
    json_t *value;

    for (size_t i = 0; i < sizeof(PENALTIES) / sizeof(PENALTIES[0]); i++) {
        value = member(root, PENALTIES[i]);
        if (value == NULL) {
            continue;
        }
        if (!json_is_number(value) || !isfinite(json_number_value(value))) {
            router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                              "invalid_type", PENALTIES[i], "'%s' must be a finite number",
                              PENALTIES[i]);
            return TDM_ERR_INVALID_ARG;
        }
        if (json_number_value(value) !=
            (strcmp(PENALTIES[i], "repetition_penalty") == 0 ? 1.0 : 0.0)) {
            router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                              "unsupported_parameter", PENALTIES[i],
                              "'%s' is not supported by this deployment", PENALTIES[i]);
            return TDM_ERR_INVALID_ARG;
        }
    }
    value = member(root, "logit_bias");
    if (value != NULL && (!json_is_object(value) || json_object_size(value) > 0)) {
        return router_apierr_bad(err, "unsupported_parameter", "logit_bias",
                   "'logit_bias' is not supported by this deployment");
    }
    value = member(root, "echo");
    if (value != NULL && !json_is_false(value)) {
        return router_apierr_bad(err, "unsupported_parameter", "echo",
                   "'echo' is not supported by this deployment");
    }
    value = member(root, "suffix");
    if (value != NULL && !(json_is_string(value) && json_string_length(value) == 0)) {
        return router_apierr_bad(err, "unsupported_parameter", "suffix",
                   "'suffix' is not supported by this deployment");
    }
    return TDM_OK;
}

static tdm_status_t get_sampling(const json_t *root, router_gen_request_t *req,
                                 router_apierr_t *err)
{
    int64_t top_k = 0;
    int64_t seed = 0;
    int64_t n = 1;
    int64_t min_tokens = 0;
    int64_t best_of = 1;
    int seed_given = 0;
    tdm_status_t status;

    req->temperature = 1.0;
    req->top_p = 1.0;
    req->min_p = 0.0;
    status =
        get_number(root, "temperature", 0.0, 0, ROUTER_MAX_TEMPERATURE, &req->temperature, err);
    if (status == TDM_OK) {
        status = get_number(root, "top_p", 0.0, 1, 1.0, &req->top_p, err);
    }
    if (status == TDM_OK) {
        status = get_number(root, "min_p", 0.0, 0, 1.0, &req->min_p, err);
    }
    if (status == TDM_OK) {
        status = get_int(root, "top_k", -1, INT32_MAX, &top_k, NULL, err);
    }
    if (status == TDM_OK) {
        status = get_int(root, "seed", INT64_MIN, INT64_MAX, &seed, &seed_given, err);
    }
    if (status == TDM_OK) {
        status = get_int(root, "n", 1, ROUTER_MAX_CHOICES, &n, NULL, err);
    }
    if (status == TDM_OK) {
        status = get_int(root, "min_tokens", 0, UINT32_MAX, &min_tokens, NULL, err);
    }
    if (status == TDM_OK) {
        status = get_int(root, "best_of", 1, 1, &best_of, NULL, err);
    }
    if (status == TDM_OK) {
        status = get_bool(root, "ignore_eos", &req->ignore_eos, err);
    }
    if (status == TDM_OK) {
        status = check_unsupported(root, err);
    }
    if (status != TDM_OK) {
        return status;
    }
    if (req->temperature < ROUTER_GREEDY_BELOW_TEMPERATURE) {
        req->temperature = 0.0; /* the greedy limit; never a tiny divisor on the wire */
    }
    req->top_k = top_k < 0 ? 0 : (int32_t)top_k;
    req->n_choices = (uint32_t)n;
    req->min_tokens = (uint32_t)min_tokens;
    if (seed_given) {
        req->seed = (uint64_t)seed;
    }
    return TDM_OK;
}

/* The names of router_spec_t, indexed by value; DEFAULT is the empty string. */
static const char *const SPEC_NAMES[] = {"", "off", "dspark", "ngram"};

const char *router_spec_name(router_spec_t spec)
{
    return (size_t)spec < sizeof(SPEC_NAMES) / sizeof(SPEC_NAMES[0]) ? SPEC_NAMES[spec] : "";
}

/* The Tandem extension "spec": absent or null (the decode node's default), or a drafter name;
 * "dspark" only when the checkpoint has DSpark blocks. */
static tdm_status_t get_spec(const router_model_info_t *info, const json_t *root,
                             router_gen_request_t *req, router_apierr_t *err)
{
    json_t *value = member(root, "spec");

    req->spec = ROUTER_SPEC_DEFAULT;
    if (value == NULL) {
        return TDM_OK;
    }
    if (!json_is_string(value)) {
        return router_apierr_bad(err, "invalid_type", "spec",
                   "'spec' must be a string: \"off\", \"dspark\" or \"ngram\"");
    }
    for (size_t i = ROUTER_SPEC_OFF; i < sizeof(SPEC_NAMES) / sizeof(SPEC_NAMES[0]); i++) {
        if (strcmp(json_string_value(value), SPEC_NAMES[i]) == 0) {
            if (i == ROUTER_SPEC_DSPARK && info->n_dspark_blocks == 0) {
                router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                                  "invalid_value", "spec",
                                  "'spec' is \"dspark\" but model '%s' has no DSpark blocks "
                                  "(num_nextn_predict_layers = 0); use \"ngram\" or \"off\"",
                                  info->name);
                return TDM_ERR_INVALID_ARG;
            }
            req->spec = (router_spec_t)i;
            return TDM_OK;
        }
    }
    router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, "invalid_value",
                      "spec", "'spec' must be \"off\", \"dspark\" or \"ngram\" (got '%.64s')",
                      json_string_value(value));
    return TDM_ERR_INVALID_ARG;
}

static tdm_status_t get_stream(const json_t *root, router_gen_request_t *req, router_apierr_t *err)
{
    json_t *options;
    tdm_status_t status;

    status = get_bool(root, "stream", &req->stream, err);
    if (status != TDM_OK) {
        return status;
    }
    options = member(root, "stream_options");
    if (options == NULL) {
        return TDM_OK;
    }
    if (!json_is_object(options)) {
        return router_apierr_bad(err, "invalid_type", "stream_options", "'stream_options' must be an object");
    }
    if (!req->stream) {
        return router_apierr_bad(err, "invalid_value", "stream_options",
                   "'stream_options' is only allowed when 'stream' is true");
    }
    return get_bool(options, "include_usage", &req->include_usage, err);
}

static tdm_status_t get_stop(const json_t *root, router_gen_request_t *req, router_apierr_t *err)
{
    json_t *stop = member(root, "stop");
    json_t *items[ROUTER_MAX_STOP_STRINGS];
    size_t n_items = 0;

    if (stop == NULL) {
        return TDM_OK;
    }
    if (json_is_string(stop)) {
        items[n_items++] = stop;
    } else if (json_is_array(stop)) {
        if (json_array_size(stop) > ROUTER_MAX_STOP_STRINGS) {
            return router_apierr_bad(err, "invalid_value", "stop", "'stop' holds at most 4 strings");
        }
        for (size_t i = 0; i < json_array_size(stop); i++) {
            items[n_items++] = json_array_get(stop, i);
        }
    } else {
        return router_apierr_bad(err, "invalid_type", "stop", "'stop' must be a string or an array of strings");
    }
    for (size_t i = 0; i < n_items; i++) {
        size_t n;
        if (!json_is_string(items[i])) {
            return router_apierr_bad(err, "invalid_type", "stop", "'stop' entries must be strings");
        }
        n = json_string_length(items[i]);
        if (n == 0 || n > ROUTER_MAX_STOP_BYTES) {
            return router_apierr_bad(err, "invalid_value", "stop", "'stop' strings must be 1..256 bytes");
        }
        req->stop[req->n_stop] = malloc(n + 1);
        if (req->stop[req->n_stop] == NULL) {
            return router_apierr_no_memory(err);
        }
        memcpy(req->stop[req->n_stop], json_string_value(items[i]), n + 1);
        req->stop_bytes[req->n_stop] = n;
        req->n_stop++;
    }
    return TDM_OK;
}

static tdm_status_t get_logprobs(const json_t *root, router_api_t api, router_gen_request_t *req,
                                 router_apierr_t *err)
{
    int64_t n = -1;
    int64_t top = 0;
    int top_given = 0;
    int enabled = 0;
    tdm_status_t status;

    req->n_logprobs = -1;
    if (api == ROUTER_API_COMPLETIONS) {
        status = get_int(root, "logprobs", 0, ROUTER_MAX_COMPLETION_LOGPROBS, &n, NULL, err);
        if (status == TDM_OK) {
            req->n_logprobs = (int)n;
        }
        return status;
    }
    status = get_bool(root, "logprobs", &enabled, err);
    if (status == TDM_OK) {
        status = get_int(root, "top_logprobs", 0, ROUTER_MAX_TOP_LOGPROBS, &top, &top_given, err);
    }
    if (status != TDM_OK) {
        return status;
    }
    if (top_given && !enabled) {
        return router_apierr_bad(err, "invalid_value", "top_logprobs",
                   "'top_logprobs' requires 'logprobs' to be true");
    }
    req->n_logprobs = enabled ? (int)top : -1;
    return TDM_OK;
}

/* Move ids from the tokenizer (text_tokens_free) into req (free): one allocator per field. */
static tdm_status_t adopt_ids(int32_t *ids, size_t n_ids, router_gen_request_t *req,
                              router_apierr_t *err)
{
    int32_t *copy = malloc((n_ids > 0 ? n_ids : 1) * sizeof(*copy));

    if (copy == NULL) {
        text_tokens_free(ids);
        return router_apierr_no_memory(err);
    }
    if (n_ids > 0) {
        memcpy(copy, ids, n_ids * sizeof(*copy));
    }
    text_tokens_free(ids);
    req->prompt_ids = copy;
    req->n_prompt_ids = n_ids;
    return TDM_OK;
}

/* ---- prompts ---------------------------------------------------------------------------- */

static int part_is_image(const char *type)
{
    return strcmp(type, "image_url") == 0 || strcmp(type, "input_image") == 0 ||
           strcmp(type, "image") == 0 || strcmp(type, "image_file") == 0;
}

/*
 * The text of a message's content: a string, null, or an array of parts. Text parts are joined
 * into `joined_out` (caller frees) when the content is an array.
 */
static tdm_status_t content_text(const json_t *content, const char **text_out, size_t *n_out,
                                 char **joined_out, router_apierr_t *err)
{
    size_t total = 0;
    char *joined;

    *joined_out = NULL;
    if (content == NULL || json_is_null(content)) {
        *text_out = "";
        *n_out = 0;
        return TDM_OK;
    }
    if (json_is_string(content)) {
        *text_out = json_string_value(content);
        *n_out = json_string_length(content);
        return TDM_OK;
    }
    if (!json_is_array(content)) {
        return router_apierr_bad(err, "invalid_type", "messages",
                   "message 'content' must be a string or an array of content parts");
    }
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *part = json_array_get(content, i);
        json_t *type = json_object_get(part, "type");
        json_t *text;
        if (!json_is_object(part) || !json_is_string(type)) {
            return router_apierr_bad(err, "invalid_type", "messages",
                       "content parts must be objects with a string 'type'");
        }
        if (part_is_image(json_string_value(type))) {
            return image_refused(err, "messages");
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            return router_apierr_bad(err, "invalid_value", "messages", "content part 'type' must be 'text'");
        }
        text = json_object_get(part, "text");
        if (!json_is_string(text)) {
            return router_apierr_bad(err, "invalid_type", "messages", "text parts need a string 'text'");
        }
        total += json_string_length(text);
    }
    joined = malloc(total + 1);
    if (joined == NULL) {
        return router_apierr_no_memory(err);
    }
    total = 0;
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *text = json_object_get(json_array_get(content, i), "text");
        memcpy(joined + total, json_string_value(text), json_string_length(text));
        total += json_string_length(text);
    }
    joined[total] = '\0';
    *joined_out = joined;
    *text_out = joined;
    *n_out = total;
    return TDM_OK;
}

static tdm_status_t message_role(const json_t *msg, text_chat_role_t *role_out,
                                 router_apierr_t *err)
{
    json_t *role = json_object_get(msg, "role");
    const char *name;

    if (!json_is_string(role)) {
        return router_apierr_bad(err, "invalid_type", "messages", "every message needs a string 'role'");
    }
    name = json_string_value(role);
    if (strcmp(name, "system") == 0 || strcmp(name, "developer") == 0) {
        *role_out = TEXT_CHAT_SYSTEM;
    } else if (strcmp(name, "user") == 0) {
        *role_out = TEXT_CHAT_USER;
    } else if (strcmp(name, "assistant") == 0) {
        *role_out = TEXT_CHAT_ASSISTANT;
    } else if (strcmp(name, "tool") == 0) {
        *role_out = TEXT_CHAT_TOOL;
    } else {
        return router_apierr_bad(err, "invalid_value", "messages",
                   "message 'role' must be system, developer, user, assistant or tool");
    }
    return TDM_OK;
}

static tdm_status_t chat_prompt(const router_model_t *model, const json_t *root,
                                router_gen_request_t *req, router_apierr_t *err)
{
    json_t *messages = member(root, "messages");
    text_chat_message_t *msgs = NULL;
    router_agent_scratch_t scratch = {0};
    char **joined = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    text_chat_params_t params;
    size_t n_msgs;
    tdm_status_t status = TDM_OK;

    if (messages == NULL) {
        return router_apierr_bad(err, "missing_parameter", "messages", "'messages' is required");
    }
    if (!json_is_array(messages)) {
        return router_apierr_bad(err, "invalid_type", "messages", "'messages' must be an array");
    }
    n_msgs = json_array_size(messages);
    if (n_msgs == 0) {
        return router_apierr_bad(err, "empty_prompt", "messages", "'messages' must not be empty");
    }
    msgs = calloc(n_msgs, sizeof(*msgs));
    joined = calloc(n_msgs, sizeof(*joined));
    if (msgs == NULL || joined == NULL) {
        status = router_apierr_no_memory(err);
        goto out;
    }
    for (size_t i = 0; i < n_msgs && status == TDM_OK; i++) {
        json_t *msg = json_array_get(messages, i);
        if (!json_is_object(msg)) {
            status = router_apierr_bad(err, "invalid_type", "messages", "every message must be an object");
            break;
        }
        status = message_role(msg, &msgs[i].role, err);
        if (status == TDM_OK) {
            status = content_text(json_object_get(msg, "content"), &msgs[i].content,
                                  &msgs[i].content_bytes, &joined[i], err);
        }
    }
    if (status == TDM_OK) {
        /* tool calls, tool results and reasoning (router/validate_agent.c) */
        status = router_agent_messages(messages, msgs, n_msgs, &scratch, err);
    }
    if (status != TDM_OK) {
        goto out;
    }
    text_chat_params_default(&params);
    params.flags |= router_agent_chat_flags(root, req);
    if (req->tools_json != NULL) {
        params.tools_json = req->tools_json;
        params.tools_json_bytes = strlen(req->tools_json);
    }
    status = text_chat_encode(router_model_tokenizer(model), &params, msgs, n_msgs, &ids, &n_ids);
    if (status == TDM_OK) {
        status = adopt_ids(ids, n_ids, req, err);
    } else if (status == TDM_ERR_NO_MEMORY) {
        router_apierr_no_memory(err);
    } else if (status != TDM_OK) {
        router_apierr_set(err, TDM_HTTP_INTERNAL, ROUTER_APIERR_SERVER, "internal_error", NULL,
                          "chat template failed: %s", tdm_status_message(status));
    }
out:
    for (size_t i = 0; joined != NULL && i < n_msgs; i++) {
        free(joined[i]);
    }
    free(joined);
    free(msgs);
    router_agent_scratch_fini(&scratch);
    return status;
}

static tdm_status_t ids_prompt(const json_t *array, router_gen_request_t *req, router_apierr_t *err)
{
    size_t n = json_array_size(array);
    int32_t *ids;

    if (n == 0) {
        return router_apierr_bad(err, "empty_prompt", "prompt", "'prompt' must not be empty");
    }
    ids = malloc(n * sizeof(*ids));
    if (ids == NULL) {
        return router_apierr_no_memory(err);
    }
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        json_t *item = json_array_get(array, i);
        if (!json_is_number(item) || tdm_json_int_exact(item, &id) != TDM_OK || id < 0 ||
            id > INT32_MAX) {
            free(ids);
            return router_apierr_bad(err, "invalid_token_id", "prompt",
                       "token-id prompts must hold integers in [0, vocab_size)");
        }
        ids[i] = (int32_t)id;
    }
    req->prompt_ids = ids;
    req->n_prompt_ids = n;
    return TDM_OK;
}

static tdm_status_t completion_prompt(const router_model_t *model, const json_t *root,
                                      router_gen_request_t *req, router_apierr_t *err)
{
    json_t *prompt = member(root, "prompt");
    text_tokenizer_info_t tok_info;
    uint32_t flags = TEXT_TOKENIZE_PARSE_SPECIAL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tdm_status_t status;

    if (prompt == NULL) {
        return router_apierr_bad(err, "missing_parameter", "prompt", "'prompt' is required");
    }
    if (json_is_array(prompt) && json_array_size(prompt) == 1 &&
        (json_is_string(json_array_get(prompt, 0)) || json_is_array(json_array_get(prompt, 0)))) {
        prompt = json_array_get(prompt, 0);
    }
    if (json_is_array(prompt)) {
        if (json_array_size(prompt) > 0 && !json_is_number(json_array_get(prompt, 0))) {
            return router_apierr_bad(err, "unsupported_parameter", "prompt",
                       "batched prompts are not supported: send one prompt per request");
        }
        return ids_prompt(prompt, req, err);
    }
    if (!json_is_string(prompt)) {
        return router_apierr_bad(err, "invalid_type", "prompt",
                   "'prompt' must be a string, an array of token ids, or a one-element array");
    }
    if (json_string_length(prompt) == 0) {
        return router_apierr_bad(err, "empty_prompt", "prompt", "'prompt' must not be empty");
    }
    text_tokenizer_get_info(router_model_tokenizer(model), &tok_info);
    if (tok_info.bos_id >= 0) {
        flags |= TEXT_TOKENIZE_ADD_BOS;
    }
    status = text_tokenizer_encode(router_model_tokenizer(model), json_string_value(prompt),
                                   json_string_length(prompt), flags, &ids, &n_ids);
    if (status == TDM_OK) {
        return adopt_ids(ids, n_ids, req, err);
    }
    if (status == TDM_ERR_NO_MEMORY) {
        return router_apierr_no_memory(err);
    }
    if (status != TDM_OK) {
        router_apierr_set(err, TDM_HTTP_INTERNAL, ROUTER_APIERR_SERVER, "internal_error", NULL,
                          "tokenizer failed: %s", tdm_status_message(status));
    }
    return status;
}

static tdm_status_t check_prompt_ids(const router_model_info_t *info, router_api_t api,
                                     const router_gen_request_t *req, router_apierr_t *err)
{
    const char *param = api == ROUTER_API_CHAT ? "messages" : "prompt";

    if (req->n_prompt_ids == 0) {
        return router_apierr_bad(err, "empty_prompt", param, "the prompt is empty");
    }
    for (size_t i = 0; i < req->n_prompt_ids; i++) {
        if (req->prompt_ids[i] < 0 || (uint32_t)req->prompt_ids[i] >= info->n_vocab) {
            router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                              "invalid_token_id", param,
                              "token id %d at position %zu is outside [0, %u)", req->prompt_ids[i],
                              i, info->n_vocab);
            return TDM_ERR_INVALID_ARG;
        }
        if (req->prompt_ids[i] == info->image_token_id) {
            return image_refused(err, param);
        }
    }
    if (req->n_prompt_ids >= info->max_context) {
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                          "context_length_exceeded", param,
                          "the prompt has %zu tokens; this model's maximum context is %u tokens",
                          req->n_prompt_ids, info->max_context);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

static tdm_status_t get_max_tokens(const json_t *root, const router_model_info_t *info,
                                   router_gen_request_t *req, router_apierr_t *err)
{
    const char *key = "max_tokens";
    uint64_t room = info->max_context - req->n_prompt_ids;
    int64_t max_tokens = 0;
    int given = 0;
    tdm_status_t status;

    if (req->api == ROUTER_API_CHAT && member(root, "max_completion_tokens") != NULL) {
        key = "max_completion_tokens";
    }
    status = get_int(root, key, 1, INT64_MAX, &max_tokens, &given, err);
    if (status != TDM_OK) {
        err->code = "invalid_value";
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, "invalid_value",
                          key, "'%s' must be a positive integer", key);
        return status;
    }
    if (!given) {
        req->max_tokens = (uint32_t)(req->api == ROUTER_API_COMPLETIONS &&
                                             room > ROUTER_COMPLETIONS_DEFAULT_MAX_TOKENS
                                         ? ROUTER_COMPLETIONS_DEFAULT_MAX_TOKENS
                                         : room);
        return TDM_OK;
    }
    if ((uint64_t)max_tokens > room) {
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                          "context_length_exceeded", key,
                          "the prompt (%zu tokens) plus %s (%lld) exceeds this model's maximum "
                          "context of %u tokens",
                          req->n_prompt_ids, key, (long long)max_tokens, info->max_context);
        return TDM_ERR_INVALID_ARG;
    }
    req->max_tokens = (uint32_t)max_tokens;
    return TDM_OK;
}

static tdm_status_t check_model(const router_model_info_t *info, const json_t *root,
                                router_apierr_t *err)
{
    json_t *name = member(root, "model");

    if (name == NULL) {
        return router_apierr_bad(err, "missing_parameter", "model", "'model' is required");
    }
    if (!json_is_string(name)) {
        return router_apierr_bad(err, "invalid_type", "model", "'model' must be a string");
    }
    if (strcmp(json_string_value(name), info->name) != 0 ||
        json_string_length(name) != strlen(info->name)) {
        router_apierr_set(err, TDM_HTTP_NOT_FOUND, ROUTER_APIERR_NOT_FOUND, "model_not_found",
                          "model", "the model '%.200s' does not exist; this deployment serves '%s'",
                          json_string_value(name), info->name);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

static tdm_status_t parse_body(const char *body, size_t n_body, json_t **root_out,
                               router_apierr_t *err)
{
    json_error_t jerr;
    json_t *root;

    /* "\u0000" is valid JSON and the router's own output may hold it (a model can sample the NUL
       byte): an agent sends that text back. Every text field is read by its length. */
    root = json_loadb(body != NULL ? body : "", n_body, JSON_ALLOW_NUL, &jerr);
    if (root == NULL) {
        router_apierr_set(err, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST, "invalid_json",
                          NULL, "malformed JSON body: line %d column %d: %s", jerr.line,
                          jerr.column, jerr.text);
        return TDM_ERR_INVALID_ARG;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return router_apierr_bad(err, "invalid_json", NULL, "the request body must be a JSON object");
    }
    *root_out = root;
    return TDM_OK;
}

tdm_status_t router_validate_request(const router_model_t *model, router_api_t api,
                                     const char *content_type, const char *body, size_t n_body,
                                     uint64_t seed_fallback, router_gen_request_t *req_out,
                                     router_apierr_t *err_out)
{
    const router_model_info_t *info = router_model_info(model);
    router_gen_request_t req;
    json_t *root = NULL;
    tdm_status_t status;

    memset(&req, 0, sizeof(req));
    memset(req_out, 0, sizeof(*req_out));
    req.api = api;
    req.seed = seed_fallback;
    req.n_choices = 1;
    req.parallel_tool_calls = 1;
    if (!content_type_is_json(content_type)) {
        router_apierr_set(err_out, TDM_HTTP_UNSUPPORTED_MEDIA_TYPE, ROUTER_APIERR_INVALID_REQUEST,
                          "unsupported_media_type", NULL,
                          "Content-Type must be application/json (got '%.100s')",
                          content_type != NULL ? content_type : "");
        return TDM_ERR_INVALID_ARG;
    }
    status = parse_body(body, n_body, &root, err_out);
    if (status != TDM_OK) {
        return status;
    }
    status = check_model(info, root, err_out);
    if (status == TDM_OK) {
        status = get_stream(root, &req, err_out);
    }
    if (status == TDM_OK) {
        status = get_sampling(root, &req, err_out);
    }
    if (status == TDM_OK) {
        status = get_spec(info, root, &req, err_out);
    }
    if (status == TDM_OK) {
        status = router_response_format_parse(info, root, &req, err_out);
    }
    if (status == TDM_OK) {
        status = get_stop(root, &req, err_out);
    }
    if (status == TDM_OK) {
        status = get_logprobs(root, api, &req, err_out);
    }
    if (status == TDM_OK) {
        status = router_agent_fields(root, api, &req, err_out);
    }
    if (status == TDM_OK) {
        status = api == ROUTER_API_CHAT ? chat_prompt(model, root, &req, err_out)
                                        : completion_prompt(model, root, &req, err_out);
    }
    if (status == TDM_OK) {
        status = check_prompt_ids(info, api, &req, err_out);
    }
    if (status == TDM_OK) {
        status = get_max_tokens(root, info, &req, err_out);
    }
    if (status == TDM_OK && req.min_tokens > req.max_tokens) {
        router_apierr_set(err_out, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                          "invalid_value", "min_tokens",
                          "'min_tokens' (%u) must not exceed max_tokens (%u)", req.min_tokens,
                          req.max_tokens);
        status = TDM_ERR_INVALID_ARG;
    }
    if (status == TDM_OK) {
        status = router_tool_constraint_build(&req, &req.tool_constraint_json, err_out);
    }
    json_decref(root);
    if (status != TDM_OK) {
        router_gen_request_fini(&req);
        return status;
    }
    *req_out = req;
    return TDM_OK;
}

void router_gen_request_fini(router_gen_request_t *req)
{
    if (req == NULL) {
        return;
    }
    free(req->prompt_ids);
    for (int i = 0; i < req->n_stop; i++) {
        free(req->stop[i]);
    }
    free(req->tools_json);
    free(req->tool_choice_name);
    free(req->response_format_json);
    free(req->tool_constraint_json);
    memset(req, 0, sizeof(*req));
}
