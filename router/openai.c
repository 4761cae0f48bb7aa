#include "router/openai.h"

#include <string.h>

/* Token text as JSON: its bytes when they are valid UTF-8, else U+FFFD per invalid piece is
 * left to the "bytes" field and the string is "" (OpenAI does the same for partial chars). */
static json_t *token_text(const text_tokenizer_t *tok, int32_t id, json_t **bytes_out)
{
    const uint8_t *bytes = NULL;
    size_t n = 0;
    json_t *text;

    if (text_tokenizer_token_bytes(tok, id, &bytes, &n) != TDM_OK) {
        n = 0;
    }
    if (bytes_out != NULL) {
        *bytes_out = json_array();
        for (size_t i = 0; i < n && *bytes_out != NULL; i++) {
            json_array_append_new(*bytes_out, json_integer(bytes[i]));
        }
    }
    text = json_stringn((const char *)bytes, n);
    return text != NULL ? text : json_string("");
}

json_t *router_openai_logprob_entry(router_api_t api, const text_tokenizer_t *tok, int32_t id,
                                    float logprob, const int32_t *top_ids,
                                    const float *top_logprobs, size_t n_top)
{
    json_t *entry = json_object();
    json_t *bytes = NULL;
    json_t *top;

    if (entry == NULL) {
        return NULL;
    }
    json_object_set_new(entry, "token",
                        token_text(tok, id, api == ROUTER_API_CHAT ? &bytes : NULL));
    json_object_set_new(entry, "logprob", logprob == logprob ? json_real(logprob) : json_null());
    if (api == ROUTER_API_CHAT) {
        json_object_set_new(entry, "bytes", bytes);
        top = json_array();
        for (size_t i = 0; i < n_top; i++) {
            json_t *alt = json_object();
            json_t *alt_bytes = NULL;
            json_object_set_new(alt, "token", token_text(tok, top_ids[i], &alt_bytes));
            json_object_set_new(alt, "logprob", json_real(top_logprobs[i]));
            json_object_set_new(alt, "bytes", alt_bytes);
            json_array_append_new(top, alt);
        }
    } else {
        top = json_object();
        for (size_t i = 0; i < n_top; i++) {
            json_t *key = token_text(tok, top_ids[i], NULL);
            json_object_set_new(top, json_string_value(key), json_real(top_logprobs[i]));
            json_decref(key);
        }
    }
    json_object_set_new(entry, "top_logprobs", top);
    return entry;
}

size_t router_openai_logprobs_text_bytes(const json_t *entries, size_t n)
{
    size_t bytes = 0;

    for (size_t i = 0; i < n && i < json_array_size(entries); i++) {
        bytes += json_string_length(json_object_get(json_array_get(entries, i), "token"));
    }
    return bytes;
}

json_t *router_openai_logprobs_fold(router_api_t api, const json_t *entries, size_t first_offset)
{
    json_t *out = json_object();
    json_t *tokens;
    json_t *lps;
    json_t *tops;
    json_t *offsets;
    size_t offset = first_offset;

    if (out == NULL) {
        return NULL;
    }
    if (api == ROUTER_API_CHAT) {
        json_object_set_new(out, "content", json_deep_copy(entries));
        return out;
    }
    tokens = json_array();
    lps = json_array();
    tops = json_array();
    offsets = json_array();
    for (size_t i = 0; i < json_array_size(entries); i++) {
        json_t *e = json_array_get(entries, i);
        json_t *token = json_object_get(e, "token");
        json_array_append(tokens, token);
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append(tops, json_object_get(e, "top_logprobs"));
        json_array_append_new(offsets, json_integer((json_int_t)offset));
        offset += json_string_length(token);
    }
    json_object_set_new(out, "tokens", tokens);
    json_object_set_new(out, "token_logprobs", lps);
    json_object_set_new(out, "top_logprobs", tops);
    json_object_set_new(out, "text_offset", offsets);
    return out;
}

static json_t *base(const router_openai_ctx_t *ctx, const char *object)
{
    json_t *root = json_object();

    if (root == NULL) {
        return NULL;
    }
    json_object_set_new(root, "id", json_string(ctx->id));
    json_object_set_new(root, "object", json_string(object));
    json_object_set_new(root, "created", json_integer(ctx->created_s));
    json_object_set_new(root, "model", json_string(ctx->model));
    return root;
}

static json_t *usage(const router_openai_usage_t *u)
{
    json_t *out = json_object();
    json_t *details = json_object();

    json_object_set_new(out, "prompt_tokens", json_integer((json_int_t)u->prompt_tokens));
    json_object_set_new(out, "completion_tokens", json_integer((json_int_t)u->completion_tokens));
    json_object_set_new(out, "total_tokens",
                        json_integer((json_int_t)(u->prompt_tokens + u->completion_tokens)));
    json_object_set_new(details, "cached_tokens", json_integer((json_int_t)u->cached_tokens));
    json_object_set_new(out, "prompt_tokens_details", details);
    return out;
}

static char *dump(json_t *root)
{
    char *text = root != NULL ? json_dumps(root, JSON_COMPACT) : NULL;

    json_decref(root);
    return text;
}

static json_t *text_value(const char *text, size_t n_text)
{
    json_t *value = json_stringn(text != NULL ? text : "", n_text);

    return value != NULL ? value : json_string("\xEF\xBF\xBD");
}

static json_t *finish_value(const char *finish_reason)
{
    return finish_reason != NULL ? json_string(finish_reason) : json_null();
}

static json_t *logprobs_value(const json_t *logprobs)
{
    return logprobs != NULL ? json_deep_copy(logprobs) : json_null();
}

/* One choice object: `index`, `key` = value (taken, may be NULL: then NULL), logprobs and
 * finish_reason. NULL when out of memory. */
static json_t *choice_object(uint32_t index, const char *key, json_t *value, const json_t *logprobs,
                             const char *finish_reason)
{
    /* "o" takes each reference, also when packing fails */
    return json_pack("{s:i, s:o, s:o, s:o}", "index", (int)index, key, value, "logprobs",
                     logprobs_value(logprobs), "finish_reason", finish_value(finish_reason));
}

/* base(ctx, object) with one choice (choice_object). NULL when out of memory. */
static json_t *one_choice(const router_openai_ctx_t *ctx, const char *object, uint32_t index,
                          const char *key, json_t *value, const json_t *logprobs,
                          const char *finish_reason)
{
    json_t *root = base(ctx, object);
    json_t *choice = choice_object(index, key, value, logprobs, finish_reason);
    json_t *choices = json_array();

    if (root == NULL || choice == NULL || choices == NULL) {
        json_decref(root);
        json_decref(choice);
        json_decref(choices);
        return NULL;
    }
    json_array_append_new(choices, choice);
    json_object_set_new(root, "choices", choices);
    return root;
}

char *router_openai_chunk(const router_openai_ctx_t *ctx, uint32_t index, const char *text,
                          size_t n_text, int role_first, const char *finish_reason,
                          const json_t *logprobs)
{
    json_t *delta;

    if (ctx->api != ROUTER_API_CHAT) {
        return dump(one_choice(ctx, "text_completion", index, "text", text_value(text, n_text),
                               logprobs, finish_reason));
    }
    delta = json_object();
    if (delta != NULL && role_first) {
        json_object_set_new(delta, "role", json_string("assistant"));
    }
    if (delta != NULL && (n_text > 0 || role_first)) {
        json_object_set_new(delta, "content", text_value(text, n_text));
    }
    return dump(
        one_choice(ctx, "chat.completion.chunk", index, "delta", delta, logprobs, finish_reason));
}

char *router_openai_chunk_delta(const router_openai_ctx_t *ctx, uint32_t index, json_t *delta,
                                const char *finish_reason, const json_t *logprobs)
{
    return dump(
        one_choice(ctx, "chat.completion.chunk", index, "delta", delta, logprobs, finish_reason));
}

json_t *router_openai_string(const char *text, size_t n_text)
{
    return text_value(text, n_text);
}

char *router_openai_usage_chunk(const router_openai_ctx_t *ctx, const router_openai_usage_t *u)
{
    json_t *root =
        base(ctx, ctx->api == ROUTER_API_CHAT ? "chat.completion.chunk" : "text_completion");

    if (root == NULL) {
        return NULL;
    }
    json_object_set_new(root, "choices", json_array());
    json_object_set_new(root, "usage", usage(u));
    return dump(root);
}

/* The value of a choice: a chat message {role, content} or a completion's text. */
static json_t *choice_value(router_api_t api, const char *text, size_t n_text)
{
    json_t *message;

    if (api != ROUTER_API_CHAT) {
        return text_value(text, n_text);
    }
    message = json_object();
    if (message != NULL) {
        json_object_set_new(message, "role", json_string("assistant"));
        json_object_set_new(message, "content", text_value(text, n_text));
    }
    return message;
}

char *router_openai_response(const router_openai_ctx_t *ctx, const router_openai_choice_t *choices,
                             uint32_t n_choices, const router_openai_usage_t *u)
{
    int chat = ctx->api == ROUTER_API_CHAT;
    json_t *root = base(ctx, chat ? "chat.completion" : "text_completion");
    json_t *list = json_array();

    if (root == NULL || list == NULL) {
        json_decref(root);
        json_decref(list);
        return NULL;
    }
    for (uint32_t i = 0; i < n_choices; i++) {
        const router_openai_choice_t *c = &choices[i];
        json_t *choice =
            choice_object(i, chat ? "message" : "text",
                          chat && c->message != NULL ? json_deep_copy(c->message)
                                                     : choice_value(ctx->api, c->text, c->n_text),
                          c->logprobs, c->finish_reason);
        if (choice == NULL || json_array_append_new(list, choice) != 0) {
            json_decref(root);
            json_decref(list);
            return NULL;
        }
    }
    json_object_set_new(root, "choices", list);
    json_object_set_new(root, "usage", usage(u));
    return dump(root);
}

/* The OpenAI model object of the served model (new reference or NULL). */
static json_t *model_object(const char *model, uint32_t max_context, uint32_t n_vocab)
{
    json_t *entry = json_object();

    if (entry == NULL) {
        return NULL;
    }
    json_object_set_new(entry, "id", json_string(model));
    json_object_set_new(entry, "object", json_string("model"));
    json_object_set_new(entry, "created", json_integer(0));
    json_object_set_new(entry, "owned_by", json_string("tandem"));
    json_object_set_new(entry, "max_model_len", json_integer(max_context));
    json_object_set_new(entry, "vocab_size", json_integer(n_vocab));
    return entry;
}

char *router_openai_model(const char *model, uint32_t max_context, uint32_t n_vocab)
{
    return dump(model_object(model, max_context, n_vocab));
}

char *router_openai_models(const char *model, uint32_t max_context, uint32_t n_vocab)
{
    json_t *root = json_object();
    json_t *data = json_array();
    json_t *entry = model_object(model, max_context, n_vocab);

    if (root == NULL || data == NULL || entry == NULL) {
        json_decref(root);
        json_decref(data);
        json_decref(entry);
        return NULL;
    }
    json_array_append_new(data, entry);
    json_object_set_new(root, "object", json_string("list"));
    json_object_set_new(root, "data", data);
    return dump(root);
}
