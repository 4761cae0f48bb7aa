/* gen_prompt.c - prompt sources of tandem-generate (gen_prompt.h). */
#include "gen_prompt.h"

#include "common/buf.h"
#include "common/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest @file of ids read (bytes). */
#define GEN_PROMPT_MAX_FILE_BYTES (64u << 20)
#define GEN_PROMPT_READ_BYTES     4096

static tdm_status_t read_file(const char *path, char **text_out, char *err, size_t err_bytes)
{
    FILE *f = fopen(path, "rb");
    tdm_buf_t text = {0};
    char chunk[GEN_PROMPT_READ_BYTES];
    size_t got;
    tdm_status_t status = TDM_OK;

    if (f == NULL) {
        int open_errno = errno;
        snprintf(err, err_bytes, "--prompt-ids: cannot open %s: %s", path, strerror(open_errno));
        return open_errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    while (status == TDM_OK && (got = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (text.n_bytes + got >= GEN_PROMPT_MAX_FILE_BYTES ||
            tdm_buf_append(&text, chunk, got) != TDM_OK) {
            snprintf(err, err_bytes, "--prompt-ids: %s is too large", path);
            status = TDM_ERR_NO_MEMORY;
        }
    }
    if (status == TDM_OK && ferror(f)) {
        snprintf(err, err_bytes, "--prompt-ids: cannot read %s: %s", path, strerror(errno));
        status = TDM_ERR_IO;
    }
    fclose(f);
    if (status == TDM_OK) {
        char *taken = tdm_buf_take(&text, NULL); /* an empty file gives "" */
        if (taken == NULL) {
            status = TDM_ERR_NO_MEMORY;
        } else {
            *text_out = taken;
        }
    }
    tdm_buf_fini(&text);
    return status;
}

static int is_separator(char c)
{
    return c == ',' || c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

tdm_status_t gen_prompt_parse_ids(const char *text, int64_t vocab, int32_t **ids_out,
                                  int64_t *n_ids_out, char *err, size_t err_bytes)
{
    char *owned = NULL;
    const char *p;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    tdm_status_t status = TDM_OK;

    if (text == NULL || ids_out == NULL || n_ids_out == NULL || vocab < 1) {
        return TDM_ERR_INVALID_ARG;
    }
    if (text[0] == '@') {
        status = read_file(text + 1, &owned, err, err_bytes);
        if (status != TDM_OK) {
            return status;
        }
        text = owned;
    }
    p = text;
    for (;;) {
        char *end;
        long long v;

        while (is_separator(*p)) {
            p++;
        }
        if (*p == '\0') {
            break;
        }
        errno = 0;
        v = strtoll(p, &end, 10);
        if (end == p || (*end != '\0' && !is_separator(*end)) || errno != 0) {
            int len = 0;
            while (p[len] != '\0' && !is_separator(p[len]) && len < 32) {
                len++;
            }
            snprintf(err, err_bytes, "--prompt-ids: item %lld '%.*s' is not a token id",
                     (long long)n + 1, len, p);
            status = TDM_ERR_INVALID_ARG;
            break;
        }
        if (v < 0 || v >= vocab) {
            snprintf(err, err_bytes,
                     "--prompt-ids: item %lld is id %lld, outside the vocabulary [0, %lld)",
                     (long long)n + 1, v, (long long)vocab);
            status = TDM_ERR_INVALID_ARG;
            break;
        }
        if (n == cap) {
            int32_t *q = tdm_array_grow(ids, sizeof(*q), n + 1, 256, &cap);
            if (q == NULL) {
                status = TDM_ERR_NO_MEMORY;
                break;
            }
            ids = q;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (status == TDM_OK && n == 0) {
        snprintf(err, err_bytes, "--prompt-ids: empty prompt (give at least one token id)");
        status = TDM_ERR_INVALID_ARG;
    }
    free(owned);
    if (status != TDM_OK) {
        free(ids);
        return status;
    }
    *ids_out = ids;
    *n_ids_out = (int64_t)n;
    return TDM_OK;
}

/* Copy tokenizer-owned ids (text_tokens_free) into a malloc'd array, BOS first if bos >= 0. */
static tdm_status_t take_ids(int32_t *tok_ids, size_t n_tok_ids, int32_t bos, int32_t **ids_out,
                             int64_t *n_ids_out)
{
    size_t n = n_tok_ids + (bos >= 0 ? 1 : 0);
    int32_t *ids = malloc((n > 0 ? n : 1) * sizeof(int32_t));

    if (ids == NULL) {
        text_tokens_free(tok_ids);
        return TDM_ERR_NO_MEMORY;
    }
    if (bos >= 0) {
        ids[0] = bos;
    }
    if (n_tok_ids > 0) {
        memcpy(ids + (bos >= 0 ? 1 : 0), tok_ids, n_tok_ids * sizeof(int32_t));
    }
    text_tokens_free(tok_ids);
    *ids_out = ids;
    *n_ids_out = (int64_t)n;
    return TDM_OK;
}

tdm_status_t gen_prompt_encode_text(const text_tokenizer_t *tok, const char *text,
                                    int32_t **ids_out, int64_t *n_ids_out, char *err,
                                    size_t err_bytes)
{
    text_tokenizer_info_t info;
    int32_t *tok_ids = NULL;
    size_t n_tok_ids = 0;
    tdm_status_t status;

    if (tok == NULL || text == NULL || ids_out == NULL || n_ids_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (text[0] == '\0') {
        snprintf(err, err_bytes, "--prompt: empty prompt");
        return TDM_ERR_INVALID_ARG;
    }
    status = text_tokenizer_encode(tok, text, strlen(text), TEXT_TOKENIZE_PARSE_SPECIAL, &tok_ids,
                                   &n_tok_ids);
    if (status != TDM_OK) {
        snprintf(err, err_bytes, "--prompt: tokenizing failed: %s", tdm_status_message(status));
        return status;
    }
    if (n_tok_ids == 0) {
        text_tokens_free(tok_ids);
        snprintf(err, err_bytes, "--prompt: the text gives no tokens");
        return TDM_ERR_INVALID_ARG;
    }
    text_tokenizer_get_info(tok, &info);
    return take_ids(tok_ids, n_tok_ids, info.bos_id, ids_out, n_ids_out);
}

static int parse_role(const char *name, text_chat_role_t *role_out)
{
    static const struct {
        const char *name;
        text_chat_role_t role;
    } roles[] = {{"system", TEXT_CHAT_SYSTEM},
                 {"user", TEXT_CHAT_USER},
                 {"assistant", TEXT_CHAT_ASSISTANT},
                 {"tool", TEXT_CHAT_TOOL}};
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (strcmp(name, roles[i].name) == 0) {
            *role_out = roles[i].role;
            return 0;
        }
    }
    return -1;
}

/* Fill msgs[i] from the JSON message objects of `list` (borrowed strings). */
static tdm_status_t chat_messages(const json_t *list, const char *path, text_chat_message_t *msgs,
                                  char *err, size_t err_bytes)
{
    size_t i;
    const json_t *item;

    json_array_foreach(list, i, item)
    {
        const json_t *role = json_object_get(item, "role");
        const json_t *content = json_object_get(item, "content");
        const json_t *reasoning = json_object_get(item, "reasoning_content");
        text_chat_message_t *m = &msgs[i];

        if (!json_is_object(item) || !json_is_string(role) ||
            parse_role(json_string_value(role), &m->role) != 0) {
            snprintf(err, err_bytes,
                     "--chat: %s: message %zu needs \"role\": system, user, assistant or tool",
                     path, i);
            return TDM_ERR_INVALID_ARG;
        }
        if (!json_is_string(content)) {
            snprintf(err, err_bytes, "--chat: %s: message %zu needs a string \"content\"", path, i);
            return TDM_ERR_INVALID_ARG;
        }
        m->content = json_string_value(content);
        m->content_bytes = json_string_length(content);
        if (json_is_string(reasoning)) {
            m->reasoning = json_string_value(reasoning);
            m->reasoning_bytes = json_string_length(reasoning);
        }
    }
    return TDM_OK;
}

tdm_status_t gen_prompt_encode_chat(const text_tokenizer_t *tok, const char *path,
                                    uint32_t chat_flags, int32_t **ids_out, int64_t *n_ids_out,
                                    char *err, size_t err_bytes)
{
    char jerr[512];
    json_t *root = NULL;
    const json_t *list;
    text_chat_message_t *msgs = NULL;
    text_chat_params_t params;
    int32_t *tok_ids = NULL;
    size_t n_tok_ids = 0, n_msgs;
    tdm_status_t status;

    if (tok == NULL || path == NULL || ids_out == NULL || n_ids_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    status = tdm_json_load_file(path, &root, jerr, sizeof(jerr));
    if (status != TDM_OK) {
        snprintf(err, err_bytes, "--chat: %s", jerr);
        return status;
    }
    list = json_is_object(root) ? json_object_get(root, "messages") : root;
    if (!json_is_array(list)) {
        snprintf(err, err_bytes,
                 "--chat: %s: expected a JSON list of {\"role\", \"content\"} messages", path);
        status = TDM_ERR_INVALID_ARG;
        goto out;
    }
    n_msgs = json_array_size(list);
    if (n_msgs == 0) {
        snprintf(err, err_bytes, "--chat: %s: empty prompt (no messages)", path);
        status = TDM_ERR_INVALID_ARG;
        goto out;
    }
    msgs = calloc(n_msgs, sizeof(*msgs));
    if (msgs == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out;
    }
    status = chat_messages(list, path, msgs, err, err_bytes);
    if (status != TDM_OK) {
        goto out;
    }
    text_chat_params_default(&params);
    params.flags |= chat_flags;
    status = text_chat_encode(tok, &params, msgs, n_msgs, &tok_ids, &n_tok_ids);
    if (status != TDM_OK) {
        snprintf(err, err_bytes, "--chat: %s: chat encoding failed: %s", path,
                 tdm_status_message(status));
        goto out;
    }
    if (n_tok_ids == 0) {
        text_tokens_free(tok_ids);
        snprintf(err, err_bytes, "--chat: %s: the conversation gives no tokens", path);
        status = TDM_ERR_INVALID_ARG;
        goto out;
    }
    status = take_ids(tok_ids, n_tok_ids, -1, ids_out, n_ids_out);
out:
    free(msgs);
    json_decref(root);
    return status;
}
