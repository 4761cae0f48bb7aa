/* hf.c - Hugging Face tokenizer.json -> text_tokenizer_t.
 *
 * Reads model (type "BPE": vocab, merges as "a b" strings or [a, b] pairs, ignore_merges),
 * added_tokens, normalizer and pre_tokenizer; checks each against what text/tokenizer.h
 * supports and names the offending field on failure. Format source: the serialisation of
 * huggingface/tokenizers (tokenizer/serialization.rs, models/bpe/serialization.rs,
 * pre_tokenizers/{byte_level,split,sequence}.rs).
 */
#include "text/tokenizer.h"

#include "common/errbuf.h"
#include "common/json.h"
#include "common/log.h"
#include "text/tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Deepest Sequence nesting accepted in normalizer / pre_tokenizer. */
#define HF_MAX_NESTING 4

/* Usual texts of BOS/EOS/PAD (tokenizer.json does not name them; tokenizer_config.json does). */
static const char *const bos_names[] = {"<｜begin▁of▁sentence｜>", "<|begin_of_text|>", "<s>",
                                        "<|startoftext|>", "<bos>"};
static const char *const eos_names[] = {"<｜end▁of▁sentence｜>", "<|end_of_text|>", "</s>",
                                        "<|endoftext|>", "<eos>"};
static const char *const pad_names[] = {"<｜▁pad▁｜>", "<pad>", "<|pad|>", "[PAD]"};

/* Error context: the source name and the output buffer. */
typedef struct {
    const char *what;
    char *err;
    size_t err_bytes;
} hf_ctx_t;

static tdm_status_t hf_fail(const hf_ctx_t *ctx, tdm_status_t status, const char *field,
                            const char *reason)
{
    tdm_errbuf_set(ctx->err, ctx->err_bytes, "%s: %s: %s", ctx->what, field, reason);
    return status;
}

static const char *type_of(const json_t *obj)
{
    const json_t *type = json_is_object(obj) ? json_object_get(obj, "type") : NULL;

    return json_is_string(type) ? json_string_value(type) : NULL;
}

/* True when a JSON member is absent, null, false or an empty string. */
static int is_unset(const json_t *value)
{
    return value == NULL || json_is_null(value) || json_is_false(value) ||
           (json_is_string(value) && json_string_length(value) == 0);
}

static tdm_status_t check_normalizer(const hf_ctx_t *ctx, const json_t *norm, int depth)
{
    const char *type;
    char reason[128];

    if (norm == NULL || json_is_null(norm)) {
        return TDM_OK;
    }
    type = type_of(norm);
    if (type == NULL) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "normalizer", "not an object with a \"type\"");
    }
    if (strcmp(type, "NFC") == 0) {
        return TDM_OK; /* identity here: exact for text already in NFC (docs/TOKENIZER.md) */
    }
    if (strcmp(type, "Sequence") == 0 && depth < HF_MAX_NESTING) {
        const json_t *list = json_object_get(norm, "normalizers");
        size_t i;
        json_t *item;
        if (!json_is_array(list)) {
            return hf_fail(ctx, TDM_ERR_FORMAT, "normalizer.normalizers", "not an array");
        }
        json_array_foreach(list, i, item)
        {
            tdm_status_t status = check_normalizer(ctx, item, depth + 1);
            if (status != TDM_OK) {
                return status;
            }
        }
        return TDM_OK;
    }
    snprintf(reason, sizeof(reason), "type \"%s\" is not supported (none, NFC or Sequence)", type);
    return hf_fail(ctx, TDM_ERR_UNSUPPORTED, "normalizer", reason);
}

static int parse_behavior(const char *name, text_tokenizer_split_behavior_t *out)
{
    static const struct {
        const char *name;
        text_tokenizer_split_behavior_t behavior;
    } table[] = {
        {"Removed", TEXT_TOKENIZER_SPLIT_REMOVED},
        {"Isolated", TEXT_TOKENIZER_SPLIT_ISOLATED},
        {"MergedWithPrevious", TEXT_TOKENIZER_SPLIT_MERGED_WITH_PREVIOUS},
        {"MergedWithNext", TEXT_TOKENIZER_SPLIT_MERGED_WITH_NEXT},
        {"Contiguous", TEXT_TOKENIZER_SPLIT_CONTIGUOUS},
    };

    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        if (strcmp(name, table[i].name) == 0) {
            *out = table[i].behavior;
            return 1;
        }
    }
    return 0;
}

static tdm_status_t add_split(const hf_ctx_t *ctx, text_tokenizer_pretok_t *pretok,
                              const json_t *split)
{
    const json_t *pattern = json_object_get(split, "pattern");
    const json_t *behavior = json_object_get(split, "behavior");
    const json_t *invert = json_object_get(split, "invert");
    const json_t *regex = json_is_object(pattern) ? json_object_get(pattern, "Regex") : NULL;
    const json_t *literal = json_is_object(pattern) ? json_object_get(pattern, "String") : NULL;
    const json_t *text = json_is_string(regex) ? regex : literal;
    text_tokenizer_split_behavior_t how;
    char reason[512];
    tdm_status_t status;

    if (!json_is_string(text)) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "pre_tokenizer Split.pattern",
                       "needs {\"Regex\": string} or {\"String\": string}");
    }
    if (!json_is_string(behavior) || !parse_behavior(json_string_value(behavior), &how)) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "pre_tokenizer Split.behavior",
                       "not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                       "Contiguous");
    }
    if (invert != NULL && !json_is_boolean(invert)) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "pre_tokenizer Split.invert", "not a boolean");
    }
    status = text_tokenizer_pretok_add_split(pretok, json_string_value(text),
                                             json_string_length(text), text == literal, how,
                                             json_is_true(invert), reason, sizeof(reason));
    if (status != TDM_OK) {
        return hf_fail(ctx, status, "pre_tokenizer Split.pattern", reason);
    }
    return TDM_OK;
}

static tdm_status_t add_pre_tokenizer(const hf_ctx_t *ctx, text_tokenizer_pretok_t *pretok,
                                      const json_t *pre, int depth)
{
    const char *type = type_of(pre);
    char reason[512];
    tdm_status_t status;

    if (type == NULL) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "pre_tokenizer", "not an object with a \"type\"");
    }
    if (strcmp(type, "ByteLevel") == 0) {
        const json_t *use_regex = json_object_get(pre, "use_regex");
        status = text_tokenizer_pretok_add_byte_level(
            pretok, json_is_true(json_object_get(pre, "add_prefix_space")),
            use_regex == NULL || json_is_true(use_regex), reason, sizeof(reason));
        return status == TDM_OK ? TDM_OK : hf_fail(ctx, status, "pre_tokenizer ByteLevel", reason);
    }
    if (strcmp(type, "Split") == 0) {
        return add_split(ctx, pretok, pre);
    }
    if (strcmp(type, "Sequence") == 0 && depth < HF_MAX_NESTING) {
        const json_t *list = json_object_get(pre, "pretokenizers");
        size_t i;
        json_t *item;
        if (!json_is_array(list)) {
            return hf_fail(ctx, TDM_ERR_FORMAT, "pre_tokenizer.pretokenizers", "not an array");
        }
        json_array_foreach(list, i, item)
        {
            status = add_pre_tokenizer(ctx, pretok, item, depth + 1);
            if (status != TDM_OK) {
                return status;
            }
        }
        return TDM_OK;
    }
    snprintf(reason, sizeof(reason), "type \"%s\" is not supported (ByteLevel, Split or Sequence)",
             type);
    return hf_fail(ctx, TDM_ERR_UNSUPPORTED, "pre_tokenizer", reason);
}

/* An id member: a non-negative integer below TEXT_TOKENIZER_MAX_VOCAB. */
static int get_id(const json_t *value, uint32_t *id_out)
{
    int64_t id;

    if (value == NULL || tdm_json_int_exact(value, &id) != TDM_OK || id < 0 ||
        id >= (int64_t)TEXT_TOKENIZER_MAX_VOCAB) {
        return 0;
    }
    *id_out = (uint32_t)id;
    return 1;
}

/* Vocabulary size: one more than the largest id in model.vocab and added_tokens. */
static tdm_status_t count_vocab(const hf_ctx_t *ctx, const json_t *vocab, const json_t *added,
                                uint32_t *n_out)
{
    const char *key;
    size_t key_len, i;
    json_t *value, *item;
    uint32_t id, n = 0;
    char reason[160];

    json_object_keylen_foreach((json_t *)vocab, key, key_len, value)
    {
        if (!get_id(value, &id)) {
            snprintf(reason, sizeof(reason), "token \"%.*s\" has no valid id (0..%u)",
                     key_len > 64 ? 64 : (int)key_len, key, TEXT_TOKENIZER_MAX_VOCAB - 1);
            return hf_fail(ctx, TDM_ERR_FORMAT, "model.vocab", reason);
        }
        n = id + 1 > n ? id + 1 : n;
    }
    json_array_foreach(added, i, item)
    {
        if (!json_is_object(item) || !get_id(json_object_get(item, "id"), &id)) {
            snprintf(reason, sizeof(reason), "entry %zu has no valid \"id\"", i);
            return hf_fail(ctx, TDM_ERR_FORMAT, "added_tokens", reason);
        }
        n = id + 1 > n ? id + 1 : n;
    }
    if (n == 0) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "model.vocab", "empty vocabulary");
    }
    *n_out = n;
    return TDM_OK;
}

static tdm_status_t add_vocab(const hf_ctx_t *ctx, text_tokenizer_builder_t *b, const json_t *vocab,
                              const json_t *added)
{
    const char *key;
    size_t key_len, i;
    json_t *value, *item;
    uint32_t id = 0;
    char reason[192], field[64];
    tdm_status_t status;

    json_object_keylen_foreach((json_t *)vocab, key, key_len, value)
    {
        (void)get_id(value, &id); /* checked by count_vocab */
        status = text_tokenizer_builder_set_token(b, id, key, key_len, TEXT_TOKEN_NORMAL, reason,
                                                  sizeof(reason));
        if (status != TDM_OK) {
            return status == TDM_ERR_FORMAT ? hf_fail(ctx, status, "model.vocab", reason) : status;
        }
    }
    json_array_foreach(added, i, item)
    {
        const json_t *content = json_object_get(item, "content");
        text_token_kind_t kind = json_is_true(json_object_get(item, "special"))
                                     ? TEXT_TOKEN_CONTROL
                                     : TEXT_TOKEN_USER_DEFINED;
        snprintf(field, sizeof(field), "added_tokens[%zu]", i);
        if (!json_is_string(content)) {
            return hf_fail(ctx, TDM_ERR_FORMAT, field, "\"content\" is not a string");
        }
        (void)get_id(json_object_get(item, "id"), &id);
        status = text_tokenizer_builder_set_token(b, id, json_string_value(content),
                                                  json_string_length(content), kind, reason,
                                                  sizeof(reason));
        if (status != TDM_OK) {
            return status == TDM_ERR_FORMAT ? hf_fail(ctx, status, field, reason) : status;
        }
        text_tokenizer_builder_mark_added(b, id, kind,
                                          json_is_true(json_object_get(item, "lstrip")),
                                          json_is_true(json_object_get(item, "rstrip")));
    }
    return TDM_OK;
}

static tdm_status_t add_merges(const hf_ctx_t *ctx, text_tokenizer_builder_t *b,
                               const json_t *merges)
{
    size_t i;
    json_t *item;
    char field[48], reason[160];

    json_array_foreach(merges, i, item)
    {
        const char *left = NULL, *right = NULL;
        size_t n_left = 0, n_right = 0;
        tdm_status_t status;
        snprintf(field, sizeof(field), "model.merges[%zu]", i);
        if (json_is_string(item)) {
            const char *text = json_string_value(item);
            size_t n = json_string_length(item);
            const char *space = memchr(text, ' ', n);
            if (space == NULL || memchr(space + 1, ' ', n - (size_t)(space - text) - 1) != NULL) {
                return hf_fail(ctx, TDM_ERR_FORMAT, field, "not \"left right\" (one space)");
            }
            left = text;
            n_left = (size_t)(space - text);
            right = space + 1;
            n_right = n - n_left - 1;
        } else if (json_is_array(item) && json_array_size(item) == 2 &&
                   json_is_string(json_array_get(item, 0)) &&
                   json_is_string(json_array_get(item, 1))) {
            left = json_string_value(json_array_get(item, 0));
            n_left = json_string_length(json_array_get(item, 0));
            right = json_string_value(json_array_get(item, 1));
            n_right = json_string_length(json_array_get(item, 1));
        } else {
            return hf_fail(ctx, TDM_ERR_FORMAT, field, "neither \"a b\" nor [\"a\", \"b\"]");
        }
        status = text_tokenizer_builder_add_merge(b, left, n_left, right, n_right);
        if (status == TDM_ERR_NOT_FOUND) {
            snprintf(reason, sizeof(reason),
                     "\"%.*s\" + \"%.*s\": a part or the result is not "
                     "in the vocabulary",
                     n_left > 40 ? 40 : (int)n_left, left, n_right > 40 ? 40 : (int)n_right, right);
            return hf_fail(ctx, TDM_ERR_FORMAT, field, reason);
        }
        if (status != TDM_OK) {
            return status;
        }
    }
    return TDM_OK;
}

/* Checks on model.* options this tokenizer cannot honour. */
static tdm_status_t check_model_options(const hf_ctx_t *ctx, const json_t *model)
{
    const json_t *dropout = json_object_get(model, "dropout");

    if (!is_unset(json_object_get(model, "byte_fallback"))) {
        return hf_fail(ctx, TDM_ERR_UNSUPPORTED, "model.byte_fallback",
                       "byte fallback (SPM-style "
                       "BPE) is not supported");
    }
    if (!is_unset(json_object_get(model, "continuing_subword_prefix")) ||
        !is_unset(json_object_get(model, "end_of_word_suffix"))) {
        return hf_fail(ctx, TDM_ERR_UNSUPPORTED, "model",
                       "subword prefixes/suffixes are not "
                       "supported");
    }
    if (dropout != NULL && !json_is_null(dropout) && json_number_value(dropout) > 0.0) {
        return hf_fail(ctx, TDM_ERR_UNSUPPORTED, "model.dropout", "BPE dropout is not supported");
    }
    return TDM_OK;
}

static void find_named(text_tokenizer_t *tok, const char *const *names, size_t n_names,
                       int32_t *id_out)
{
    for (size_t i = 0; i < n_names; i++) {
        int32_t id = text_tokenizer_lookup_text(tok, names[i], strlen(names[i]));
        if (id >= 0) {
            *id_out = id;
            return;
        }
    }
}

static tdm_status_t load_root(const hf_ctx_t *ctx, const json_t *root, text_tokenizer_t **tok_out)
{
    const json_t *model = json_is_object(root) ? json_object_get(root, "model") : NULL;
    const json_t *added = json_is_object(root) ? json_object_get(root, "added_tokens") : NULL;
    const json_t *vocab, *merges, *empty = NULL;
    const char *type;
    text_tokenizer_builder_t b;
    uint32_t n_vocab = 0;
    char reason[256];
    tdm_status_t status;

    if (!json_is_object(model)) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "model", "missing or not an object");
    }
    vocab = json_object_get(model, "vocab");
    merges = json_object_get(model, "merges");
    type = type_of(model);
    if (type == NULL && json_object_get(model, "type") != NULL) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "model.type", "not a string");
    }
    if (type != NULL && strcmp(type, "BPE") != 0) {
        snprintf(reason, sizeof(reason), "\"%s\" is not supported (only \"BPE\")", type);
        return hf_fail(ctx, TDM_ERR_UNSUPPORTED, "model.type", reason);
    }
    if (!json_is_object(vocab)) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "model.vocab", "missing or not an object");
    }
    if (!json_is_array(merges)) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "model.merges", "missing or not an array");
    }
    if (added != NULL && !json_is_array(added) && !json_is_null(added)) {
        return hf_fail(ctx, TDM_ERR_FORMAT, "added_tokens", "not an array");
    }
    if (!json_is_array(added)) {
        empty = json_array();
        if (empty == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        added = empty;
    }
    status = check_model_options(ctx, model);
    if (status == TDM_OK) {
        status = check_normalizer(ctx, json_object_get(root, "normalizer"), 0);
    }
    if (status == TDM_OK) {
        status = count_vocab(ctx, vocab, added, &n_vocab);
    }
    if (status == TDM_OK && json_array_size(merges) > TEXT_TOKENIZER_MAX_VOCAB * 4u) {
        status = hf_fail(ctx, TDM_ERR_FORMAT, "model.merges", "too many merges");
    }
    if (status != TDM_OK) {
        json_decref((json_t *)empty);
        return status;
    }
    status = text_tokenizer_builder_init(&b, n_vocab, (uint32_t)json_array_size(merges), reason,
                                         sizeof(reason));
    if (status != TDM_OK) {
        json_decref((json_t *)empty);
        return status == TDM_ERR_FORMAT ? hf_fail(ctx, status, "model.vocab", reason) : status;
    }
    status = add_vocab(ctx, &b, vocab, added);
    json_decref((json_t *)empty);
    if (status == TDM_OK) {
        status = text_tokenizer_builder_index(&b, reason, sizeof(reason));
        if (status == TDM_ERR_FORMAT) {
            status = hf_fail(ctx, status, "model.vocab", reason);
        }
    }
    if (status == TDM_OK) {
        status = add_merges(ctx, &b, merges);
    }
    if (status == TDM_OK) {
        const json_t *pre = json_object_get(root, "pre_tokenizer");
        if (pre == NULL || json_is_null(pre)) {
            status = hf_fail(ctx, TDM_ERR_UNSUPPORTED, "pre_tokenizer",
                             "missing; byte-level BPE needs a ByteLevel pre-tokenizer");
        } else {
            status = add_pre_tokenizer(ctx, &b.tok->pretok, pre, 0);
        }
    }
    if (status == TDM_OK && !b.tok->pretok.has_byte_level) {
        status = hf_fail(ctx, TDM_ERR_UNSUPPORTED, "pre_tokenizer",
                         "no ByteLevel step: only byte-level BPE is supported");
    }
    if (status != TDM_OK) {
        text_tokenizer_builder_fini(&b);
        return status;
    }
    b.tok->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    snprintf(b.tok->pre_name, sizeof(b.tok->pre_name), "tokenizer.json");
    find_named(b.tok, bos_names, sizeof(bos_names) / sizeof(bos_names[0]), &b.tok->bos_id);
    find_named(b.tok, eos_names, sizeof(eos_names) / sizeof(eos_names[0]), &b.tok->eos_id);
    find_named(b.tok, pad_names, sizeof(pad_names) / sizeof(pad_names[0]), &b.tok->pad_id);
    return text_tokenizer_builder_finish(&b, tok_out);
}

tdm_status_t text_tokenizer_load_hf_buffer(const char *json, size_t n_bytes, const char *what,
                                           text_tokenizer_t **tok_out, char *err, size_t err_bytes)
{
    hf_ctx_t ctx = {what != NULL ? what : "<tokenizer.json>", err, err_bytes};
    json_t *root = NULL;
    tdm_status_t status;

    if ((json == NULL && n_bytes > 0) || tok_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    status = tdm_json_load_text(json, n_bytes, ctx.what, &root, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    status = load_root(&ctx, root, tok_out);
    json_decref(root);
    return status;
}

tdm_status_t text_tokenizer_load_hf(const char *path, text_tokenizer_t **tok_out, char *err,
                                    size_t err_bytes)
{
    hf_ctx_t ctx = {path, err, err_bytes};
    json_t *root = NULL;
    struct stat st;
    tdm_status_t status;

    if (path == NULL || tok_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (stat(path, &st) != 0) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        tdm_errbuf_set(err, err_bytes, "%s: not a regular file", path);
        return TDM_ERR_IO;
    }
    status = tdm_json_load_file(path, &root, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    status = load_root(&ctx, root, tok_out);
    json_decref(root);
    return status;
}
