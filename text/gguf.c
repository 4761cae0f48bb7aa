/* gguf.c - the tokenizer metadata of a GGUF file -> text_tokenizer_t.
 *
 * Parses the GGUF v2/v3 little-endian header, every metadata key/value (all value types,
 * nested arrays included, so unneeded keys can be skipped) and the tensor-info table, checking
 * every length and count against the bytes that remain. Reads tokenizer.ggml.{model, tokens,
 * token_type, merges, pre, bos_token_id, eos_token_id, padding_token_id}. Format source: the
 * GGUF specification (ggml docs/gguf.md); token types and `pre` names as llama.cpp
 * (src/llama-vocab.cpp) interprets them.
 */
#include "text/tokenizer.h"

#include "common/errbuf.h"
#include "common/log.h"
#include "text/tokenizer_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC           "GGUF"
#define GGUF_MAX_KEY_BYTES   65535u
#define GGUF_MAX_ARRAY_DEPTH 4
#define GGUF_MAX_DIMS        4
/* The fixed header: magic, version u32, n_tensors u64, n_kv u64. */
#define GGUF_HEADER_BYTES 24u

/* GGUF value types (gguf.md, enum gguf_metadata_value_type). */
enum {
    GGUF_UINT8 = 0,
    GGUF_INT8 = 1,
    GGUF_UINT16 = 2,
    GGUF_INT16 = 3,
    GGUF_UINT32 = 4,
    GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_UINT64 = 10,
    GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
    GGUF_N_TYPES = 13,
};

/* Bytes of a scalar of each type; 0 for string and array. */
static const uint8_t scalar_bytes[GGUF_N_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* llama.cpp token types (llama_token_type). */
enum {
    GGUF_TOKEN_NORMAL = 1,
    GGUF_TOKEN_UNKNOWN = 2,
    GGUF_TOKEN_CONTROL = 3,
    GGUF_TOKEN_USER_DEFINED = 4,
    GGUF_TOKEN_UNUSED = 5,
    GGUF_TOKEN_BYTE = 6,
};

/* A bounds-checked reader over the file bytes. */
typedef struct {
    const uint8_t *data;
    size_t n;
    size_t pos;
    const char *what;
    char key[96]; /* the key being read, for messages */
    char *err;
    size_t err_bytes;
} cursor_t;

/* Where a key we need was found. */
typedef struct {
    int present;
    uint32_t type;
    size_t key_offset;
    size_t value_offset; /* arrays: the first element */
    uint32_t elem_type;
    uint64_t n_elems;
} kv_ref_t;

/* The keys the tokenizer reads. */
typedef enum {
    KEY_MODEL,
    KEY_PRE,
    KEY_TOKENS,
    KEY_TOKEN_TYPE,
    KEY_MERGES,
    KEY_BOS,
    KEY_EOS,
    KEY_PAD,
    KEY_SCORES,
    KEY_ADD_SPACE_PREFIX,
    KEY_COUNT,
} key_index_t;

static const char *const key_names[KEY_COUNT] = {
    "tokenizer.ggml.model",        "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",       "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",       "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.scores",       "tokenizer.ggml.add_space_prefix",
};

static tdm_status_t fail(cursor_t *c, size_t offset, const char *reason)
{
    tdm_errbuf_set(c->err, c->err_bytes, "%s: offset %zu%s%s%s: %s", c->what, offset,
                   c->key[0] != '\0' ? ": key '" : "", c->key, c->key[0] != '\0' ? "'" : "",
                   reason);
    return TDM_ERR_FORMAT;
}

static size_t remaining(const cursor_t *c)
{
    return c->n - c->pos;
}

static uint64_t load_le(const uint8_t *p, size_t n_bytes)
{
    uint64_t v = 0;

    for (size_t i = 0; i < n_bytes; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

static tdm_status_t read_uint(cursor_t *c, size_t n_bytes, const char *what, uint64_t *v_out)
{
    char reason[96];

    if (remaining(c) < n_bytes) {
        snprintf(reason, sizeof(reason), "file ends inside %s (%zu of %zu bytes left)", what,
                 remaining(c), n_bytes);
        return fail(c, c->pos, reason);
    }
    *v_out = load_le(c->data + c->pos, n_bytes);
    c->pos += n_bytes;
    return TDM_OK;
}

/* A GGUF string: u64 length then bytes. *text_out points into the file. */
static tdm_status_t read_string(cursor_t *c, const char *what, const uint8_t **text_out,
                                uint64_t *n_out)
{
    size_t start = c->pos;
    uint64_t n;
    tdm_status_t status = read_uint(c, 8, what, &n);
    char reason[160];

    if (status != TDM_OK) {
        return status;
    }
    if (n > remaining(c)) {
        snprintf(reason, sizeof(reason), "%s of %llu bytes runs past the end (%zu bytes left)",
                 what, (unsigned long long)n, remaining(c));
        return fail(c, start, reason);
    }
    *text_out = c->data + c->pos;
    *n_out = n;
    c->pos += (size_t)n;
    return TDM_OK;
}

static tdm_status_t read_type(cursor_t *c, const char *what, uint32_t *type_out)
{
    size_t start = c->pos;
    uint64_t type;
    tdm_status_t status = read_uint(c, 4, what, &type);
    char reason[96];

    if (status != TDM_OK) {
        return status;
    }
    if (type >= GGUF_N_TYPES) {
        snprintf(reason, sizeof(reason), "%s %llu is not a GGUF value type (0..12)", what,
                 (unsigned long long)type);
        return fail(c, start, reason);
    }
    *type_out = (uint32_t)type;
    return TDM_OK;
}

static tdm_status_t skip_value(cursor_t *c, uint32_t type, int depth);

/* Array header (element type, count) after the ARRAY type; checks the elements fit. */
static tdm_status_t read_array_header(cursor_t *c, int depth, uint32_t *elem_type_out,
                                      uint64_t *n_out)
{
    size_t start = c->pos;
    uint64_t n, min_elem_bytes;
    char reason[160];
    tdm_status_t status = read_type(c, "array element type", elem_type_out);

    if (status == TDM_OK) {
        status = read_uint(c, 8, "array length", &n);
    }
    if (status != TDM_OK) {
        return status;
    }
    if (*elem_type_out == GGUF_ARRAY && depth + 1 >= GGUF_MAX_ARRAY_DEPTH) {
        return fail(c, start, "arrays nested deeper than 4 levels");
    }
    min_elem_bytes = scalar_bytes[*elem_type_out];
    if (*elem_type_out == GGUF_STRING) {
        min_elem_bytes = 8;
    } else if (*elem_type_out == GGUF_ARRAY) {
        min_elem_bytes = 12;
    }
    if (n > remaining(c) / min_elem_bytes) {
        snprintf(reason, sizeof(reason),
                 "array of %llu elements of type %u cannot fit in the %zu bytes left",
                 (unsigned long long)n, *elem_type_out, remaining(c));
        return fail(c, start, reason);
    }
    *n_out = n;
    return TDM_OK;
}

static tdm_status_t skip_value(cursor_t *c, uint32_t type, int depth)
{
    const uint8_t *text;
    uint64_t n, v;
    uint32_t elem_type;
    tdm_status_t status;

    if (type == GGUF_STRING) {
        return read_string(c, "string value", &text, &n);
    }
    if (type != GGUF_ARRAY) {
        return read_uint(c, scalar_bytes[type], "scalar value", &v);
    }
    status = read_array_header(c, depth, &elem_type, &n);
    if (status != TDM_OK) {
        return status;
    }
    if (elem_type != GGUF_STRING && elem_type != GGUF_ARRAY) {
        c->pos += (size_t)n * scalar_bytes[elem_type]; /* fits: checked by the header */
        return TDM_OK;
    }
    for (uint64_t i = 0; i < n; i++) {
        status = skip_value(c, elem_type, depth + 1);
        if (status != TDM_OK) {
            return status;
        }
    }
    return TDM_OK;
}

static void set_key(cursor_t *c, const uint8_t *key, uint64_t n)
{
    size_t len = n < sizeof(c->key) - 1 ? (size_t)n : sizeof(c->key) - 1;

    for (size_t i = 0; i < len; i++) {
        c->key[i] = key[i] >= 0x20 && key[i] < 0x7f ? (char)key[i] : '?';
    }
    c->key[len] = '\0';
}

static tdm_status_t parse_header(cursor_t *c, uint64_t *n_tensors_out, uint64_t *n_kv_out)
{
    uint64_t version;
    char reason[128];
    tdm_status_t status;

    if (c->n < 4 || memcmp(c->data, GGUF_MAGIC, 4) != 0) {
        return fail(c, 0, "not a GGUF file (magic is not \"GGUF\")");
    }
    c->pos = 4;
    status = read_uint(c, 4, "version", &version);
    if (status != TDM_OK) {
        return status;
    }
    if (version == 1) {
        tdm_errbuf_set(c->err, c->err_bytes, "%s: GGUF version 1 is not supported", c->what);
        return TDM_ERR_UNSUPPORTED;
    }
    if ((version & 0xffffu) == 0 && (version >> 16) != 0) {
        tdm_errbuf_set(c->err, c->err_bytes,
                       "%s: big-endian GGUF (version field 0x%08llx) is not supported", c->what,
                       (unsigned long long)version);
        return TDM_ERR_UNSUPPORTED;
    }
    if (version != 2 && version != 3) {
        snprintf(reason, sizeof(reason), "GGUF version %llu (this reader knows 2 and 3)",
                 (unsigned long long)version);
        return fail(c, 4, reason);
    }
    status = read_uint(c, 8, "tensor count", n_tensors_out);
    if (status == TDM_OK) {
        status = read_uint(c, 8, "metadata count", n_kv_out);
    }
    if (status != TDM_OK) {
        return status;
    }
    /* A key/value takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes. */
    if (*n_kv_out > remaining(c) / 14) {
        snprintf(reason, sizeof(reason), "%llu metadata entries cannot fit in %zu bytes",
                 (unsigned long long)*n_kv_out, remaining(c));
        return fail(c, 16, reason);
    }
    /* A tensor info takes at least 8 + 1 + 4 + 8 + 4 + 8 bytes. */
    if (*n_tensors_out > remaining(c) / 33) {
        snprintf(reason, sizeof(reason), "%llu tensor infos cannot fit in %zu bytes",
                 (unsigned long long)*n_tensors_out, remaining(c));
        return fail(c, 8, reason);
    }
    return TDM_OK;
}

static tdm_status_t parse_kvs(cursor_t *c, uint64_t n_kv, kv_ref_t refs[KEY_COUNT])
{
    for (uint64_t i = 0; i < n_kv; i++) {
        size_t key_offset = c->pos;
        const uint8_t *key;
        uint64_t n_key;
        uint32_t type;
        int which = -1;
        tdm_status_t status;

        c->key[0] = '\0';
        status = read_string(c, "key", &key, &n_key);
        if (status != TDM_OK) {
            return status;
        }
        if (n_key == 0 || n_key > GGUF_MAX_KEY_BYTES) {
            return fail(c, key_offset, "key length outside 1..65535");
        }
        set_key(c, key, n_key);
        status = read_type(c, "value type", &type);
        if (status != TDM_OK) {
            return status;
        }
        for (int k = 0; k < KEY_COUNT; k++) {
            if (strlen(key_names[k]) == n_key && memcmp(key_names[k], key, n_key) == 0) {
                which = k;
            }
        }
        if (which >= 0) {
            kv_ref_t *ref = &refs[which];
            if (ref->present) {
                return fail(c, key_offset, "key appears twice");
            }
            ref->present = 1;
            ref->type = type;
            ref->key_offset = key_offset;
            ref->value_offset = c->pos;
            if (type == GGUF_ARRAY) {
                size_t save = c->pos;
                status = read_array_header(c, 0, &ref->elem_type, &ref->n_elems);
                if (status != TDM_OK) {
                    return status;
                }
                ref->value_offset = c->pos;
                c->pos = save;
            }
        }
        status = skip_value(c, type, 0);
        if (status != TDM_OK) {
            return status;
        }
    }
    c->key[0] = '\0';
    return TDM_OK;
}

/* The tensor-info table is not used, but a well-formed file must contain it. */
static tdm_status_t parse_tensor_infos(cursor_t *c, uint64_t n_tensors)
{
    for (uint64_t i = 0; i < n_tensors; i++) {
        const uint8_t *name;
        uint64_t n_name, n_dims, v;
        size_t start = c->pos;
        tdm_status_t status = read_string(c, "tensor name", &name, &n_name);

        if (status == TDM_OK) {
            set_key(c, name, n_name);
            status = read_uint(c, 4, "tensor dimension count", &n_dims);
        }
        if (status == TDM_OK && n_dims > GGUF_MAX_DIMS) {
            return fail(c, start, "tensor has more than 4 dimensions");
        }
        for (uint64_t d = 0; status == TDM_OK && d < n_dims; d++) {
            status = read_uint(c, 8, "tensor dimension", &v);
        }
        if (status == TDM_OK) {
            status = read_uint(c, 4, "tensor type", &v);
        }
        if (status == TDM_OK) {
            status = read_uint(c, 8, "tensor offset", &v);
        }
        if (status != TDM_OK) {
            return status;
        }
    }
    c->key[0] = '\0';
    return TDM_OK;
}

/* The integer value of a scalar key (any integer type), or -1 if it is not one. */
static int64_t ref_integer(const cursor_t *c, const kv_ref_t *ref)
{
    const uint8_t *p = c->data + ref->value_offset;

    switch (ref->type) {
    case GGUF_UINT8:
    case GGUF_UINT16:
    case GGUF_UINT32:
        return (int64_t)load_le(p, scalar_bytes[ref->type]);
    case GGUF_INT8:
        return (int8_t)p[0];
    case GGUF_INT16:
        return (int16_t)load_le(p, 2);
    case GGUF_INT32:
        return (int32_t)load_le(p, 4);
    case GGUF_UINT64:
    case GGUF_INT64: {
        uint64_t v = load_le(p, 8);
        return v > INT64_MAX ? -1 : (int64_t)v;
    }
    default:
        return -1;
    }
}

static tdm_status_t require_array(cursor_t *c, const kv_ref_t *ref, int key, uint32_t elem_a,
                                  uint32_t elem_b)
{
    char reason[128];

    snprintf(c->key, sizeof(c->key), "%s", key_names[key]);
    if (!ref->present) {
        return fail(c, c->n, "required key is missing");
    }
    if (ref->type != GGUF_ARRAY || (ref->elem_type != elem_a && ref->elem_type != elem_b)) {
        snprintf(reason, sizeof(reason), "has type %u (element type %u); expected an array of %u",
                 ref->type, ref->type == GGUF_ARRAY ? ref->elem_type : 0, elem_a);
        return fail(c, ref->key_offset, reason);
    }
    return TDM_OK;
}

static text_token_kind_t kind_of(int64_t type)
{
    switch (type) {
    case GGUF_TOKEN_CONTROL:
    case GGUF_TOKEN_UNKNOWN:
        return TEXT_TOKEN_CONTROL;
    case GGUF_TOKEN_USER_DEFINED:
        return TEXT_TOKEN_USER_DEFINED;
    case GGUF_TOKEN_UNUSED:
        return TEXT_TOKEN_UNUSED;
    default:
        return TEXT_TOKEN_NORMAL; /* normal, byte, undefined */
    }
}

static tdm_status_t add_tokens(cursor_t *c, const kv_ref_t refs[KEY_COUNT],
                               text_tokenizer_builder_t *b)
{
    const kv_ref_t *tokens = &refs[KEY_TOKENS], *types = &refs[KEY_TOKEN_TYPE];
    char reason[256];
    tdm_status_t status;

    c->pos = tokens->value_offset;
    snprintf(c->key, sizeof(c->key), "%s", key_names[KEY_TOKENS]);
    for (uint64_t i = 0; i < tokens->n_elems; i++) {
        size_t start = c->pos;
        const uint8_t *text;
        uint64_t n;
        text_token_kind_t kind = TEXT_TOKEN_NORMAL;
        status = read_string(c, "token", &text, &n);
        if (status != TDM_OK) {
            return status;
        }
        if (types->present) {
            kind = kind_of((int32_t)load_le(c->data + types->value_offset + 4 * i, 4));
        }
        status = text_tokenizer_builder_set_token(b, (uint32_t)i, (const char *)text, n, kind,
                                                  reason, sizeof(reason));
        if (status != TDM_OK) {
            return status == TDM_ERR_FORMAT ? fail(c, start, reason) : status;
        }
        if (kind == TEXT_TOKEN_CONTROL || kind == TEXT_TOKEN_USER_DEFINED) {
            text_tokenizer_builder_mark_added(b, (uint32_t)i, kind, 0, 0);
        }
    }
    return TDM_OK;
}

static tdm_status_t add_merges(cursor_t *c, const kv_ref_t *merges, text_tokenizer_builder_t *b)
{
    uint32_t n_skipped = 0;
    tdm_status_t status;

    c->pos = merges->value_offset;
    snprintf(c->key, sizeof(c->key), "%s", key_names[KEY_MERGES]);
    for (uint64_t i = 0; i < merges->n_elems; i++) {
        size_t start = c->pos, space;
        const uint8_t *text;
        uint64_t n;
        status = read_string(c, "merge", &text, &n);
        if (status != TDM_OK) {
            return status;
        }
        /* "left right"; the separator is searched from the second byte, as llama.cpp does. */
        for (space = 1; space < n && text[space] != ' '; space++) {
        }
        if (space >= n) {
            char reason[96];
            snprintf(reason, sizeof(reason), "merge %llu has no \"left right\" separator",
                     (unsigned long long)i);
            return fail(c, start, reason);
        }
        status = text_tokenizer_builder_add_merge(
            b, (const char *)text, space, (const char *)text + space + 1, (size_t)n - space - 1);
        if (status == TDM_ERR_NOT_FOUND) {
            n_skipped++;
        } else if (status != TDM_OK) {
            return status;
        }
    }
    if (n_skipped > 0) {
        tdm_log(TDM_LOG_DEBUG, "tokenizer", "merges naming unknown tokens skipped: file=%s n=%u",
                c->what, n_skipped);
    }
    return TDM_OK;
}

static void set_special_ids(const cursor_t *c, const kv_ref_t refs[KEY_COUNT],
                            text_tokenizer_t *tok)
{
    static const int keys[3] = {KEY_BOS, KEY_EOS, KEY_PAD};
    int32_t *ids[3] = {&tok->bos_id, &tok->eos_id, &tok->pad_id};

    for (int k = 0; k < 3; k++) {
        const kv_ref_t *ref = &refs[keys[k]];
        int64_t id;
        if (!ref->present) {
            continue;
        }
        id = ref_integer(c, ref);
        if (id < 0 || id >= (int64_t)tok->n_vocab) {
            /* llama.cpp also ignores a bad special id with a warning. */
            tdm_log(TDM_LOG_WARN, "tokenizer",
                    "bad special token id ignored: file=%s key=%s "
                    "id=%lld n_vocab=%u",
                    c->what, key_names[keys[k]], (long long)id, tok->n_vocab);
            continue;
        }
        *ids[k] = (int32_t)id;
    }
}

/* Copy a string key's value into out, truncated, bytes outside printable ASCII as '?'. */
static void ref_string(const cursor_t *c, const kv_ref_t *ref, char *out, size_t out_bytes)
{
    uint64_t n = load_le(c->data + ref->value_offset, 8);
    size_t len = n < out_bytes - 1 ? (size_t)n : out_bytes - 1;
    const uint8_t *src = c->data + ref->value_offset + 8;

    for (size_t i = 0; i < len; i++) {
        out[i] = src[i] >= 0x20 && src[i] < 0x7f ? (char)src[i] : '?';
    }
    out[len] = '\0';
}

/* Checks of the keys both models share; reads `pre`. */
static tdm_status_t check_common_keys(cursor_t *c, const kv_ref_t refs[KEY_COUNT], int spm,
                                      char *pre, size_t pre_bytes)
{
    const kv_ref_t *tokens = &refs[KEY_TOKENS];
    char reason[160];
    tdm_status_t status = require_array(c, tokens, KEY_TOKENS, GGUF_STRING, GGUF_STRING);

    if (status == TDM_OK && !spm) {
        status = require_array(c, &refs[KEY_MERGES], KEY_MERGES, GGUF_STRING, GGUF_STRING);
    }
    if (status == TDM_OK && refs[KEY_TOKEN_TYPE].present) {
        status = require_array(c, &refs[KEY_TOKEN_TYPE], KEY_TOKEN_TYPE, GGUF_INT32, GGUF_UINT32);
        if (status == TDM_OK && refs[KEY_TOKEN_TYPE].n_elems != tokens->n_elems) {
            snprintf(reason, sizeof(reason), "%llu types for %llu tokens",
                     (unsigned long long)refs[KEY_TOKEN_TYPE].n_elems,
                     (unsigned long long)tokens->n_elems);
            status = fail(c, refs[KEY_TOKEN_TYPE].key_offset, reason);
        }
    }
    if (status == TDM_OK && spm && refs[KEY_SCORES].present) {
        status = require_array(c, &refs[KEY_SCORES], KEY_SCORES, GGUF_FLOAT32, GGUF_FLOAT32);
        if (status == TDM_OK && refs[KEY_SCORES].n_elems != tokens->n_elems) {
            snprintf(reason, sizeof(reason), "%llu scores for %llu tokens",
                     (unsigned long long)refs[KEY_SCORES].n_elems,
                     (unsigned long long)tokens->n_elems);
            status = fail(c, refs[KEY_SCORES].key_offset, reason);
        }
    }
    if (status == TDM_OK && refs[KEY_PRE].present) {
        snprintf(c->key, sizeof(c->key), "%s", key_names[KEY_PRE]);
        if (refs[KEY_PRE].type != GGUF_STRING) {
            status = fail(c, refs[KEY_PRE].key_offset, "not a string");
        } else {
            ref_string(c, &refs[KEY_PRE], pre, pre_bytes);
        }
    }
    if (status == TDM_OK &&
        (tokens->n_elems == 0 || tokens->n_elems > TEXT_TOKENIZER_MAX_VOCAB ||
         (!spm && refs[KEY_MERGES].n_elems > TEXT_TOKENIZER_MAX_VOCAB * 4ull))) {
        snprintf(c->key, sizeof(c->key), "%s", key_names[KEY_TOKENS]);
        snprintf(reason, sizeof(reason), "%llu tokens and %llu merges (limits 1..%u and %u)",
                 (unsigned long long)tokens->n_elems,
                 (unsigned long long)(spm ? 0 : refs[KEY_MERGES].n_elems), TEXT_TOKENIZER_MAX_VOCAB,
                 TEXT_TOKENIZER_MAX_VOCAB * 4u);
        status = fail(c, tokens->key_offset, reason);
    }
    return status;
}

/* SentencePiece extras: scores (default 0) and add_space_prefix (default on, as llama.cpp). */
static tdm_status_t set_spm_fields(const cursor_t *c, const kv_ref_t refs[KEY_COUNT],
                                   text_tokenizer_t *tok)
{
    const kv_ref_t *prefix = &refs[KEY_ADD_SPACE_PREFIX];

    tok->scores = calloc(tok->n_vocab, sizeof(*tok->scores));
    if (tok->scores == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (refs[KEY_SCORES].present) {
        for (uint32_t i = 0; i < tok->n_vocab; i++) {
            uint32_t bits = (uint32_t)load_le(c->data + refs[KEY_SCORES].value_offset + 4 * i, 4);
            memcpy(&tok->scores[i], &bits, sizeof(bits));
        }
    }
    tok->add_space_prefix = 1;
    if (prefix->present && prefix->type == GGUF_BOOL) {
        tok->add_space_prefix = c->data[prefix->value_offset] != 0;
    }
    return TDM_OK;
}

static tdm_status_t build(cursor_t *c, const kv_ref_t refs[KEY_COUNT], text_tokenizer_t **tok_out)
{
    text_tokenizer_builder_t b;
    char model[32], pre[48] = "default", reason[256];
    int ignore_merges = 0, spm;
    tdm_status_t status;

    snprintf(c->key, sizeof(c->key), "%s", key_names[KEY_MODEL]);
    if (!refs[KEY_MODEL].present || refs[KEY_MODEL].type != GGUF_STRING) {
        return fail(c, refs[KEY_MODEL].present ? refs[KEY_MODEL].key_offset : c->n,
                    "missing or not a string");
    }
    ref_string(c, &refs[KEY_MODEL], model, sizeof(model));
    spm = strcmp(model, "llama") == 0;
    if (!spm && strcmp(model, "gpt2") != 0) {
        tdm_errbuf_set(c->err, c->err_bytes,
                       "%s: tokenizer.ggml.model \"%s\" is not supported (byte-level BPE "
                       "\"gpt2\" and SentencePiece \"llama\" are)",
                       c->what, model);
        return TDM_ERR_UNSUPPORTED;
    }
    status = check_common_keys(c, refs, spm, pre, sizeof(pre));
    if (status != TDM_OK) {
        return status;
    }
    status = text_tokenizer_builder_init(&b, (uint32_t)refs[KEY_TOKENS].n_elems,
                                         spm ? 0 : (uint32_t)refs[KEY_MERGES].n_elems, reason,
                                         sizeof(reason));
    if (status != TDM_OK) {
        return status;
    }
    b.tok->spm = spm;
    status = add_tokens(c, refs, &b);
    if (status == TDM_OK) {
        status = text_tokenizer_builder_index(&b, reason, sizeof(reason));
        if (status == TDM_ERR_FORMAT) {
            snprintf(c->key, sizeof(c->key), "%s", key_names[KEY_TOKENS]);
            status = fail(c, refs[KEY_TOKENS].key_offset, reason);
        }
    }
    if (status == TDM_OK && spm) {
        status = set_spm_fields(c, refs, b.tok);
    }
    if (status == TDM_OK && !spm) {
        status = add_merges(c, &refs[KEY_MERGES], &b);
    }
    if (status == TDM_OK && !spm) {
        status = text_tokenizer_pretok_preset(&b.tok->pretok, refs[KEY_PRE].present ? pre : NULL,
                                              &ignore_merges, reason, sizeof(reason));
        if (status != TDM_OK) {
            tdm_errbuf_set(c->err, c->err_bytes, "%s: pre-tokenizer %s: %s", c->what, pre, reason);
        }
    }
    if (status != TDM_OK) {
        text_tokenizer_builder_fini(&b);
        return status;
    }
    b.tok->ignore_merges = ignore_merges;
    snprintf(b.tok->pre_name, sizeof(b.tok->pre_name), "%s", pre);
    set_special_ids(c, refs, b.tok);
    return text_tokenizer_builder_finish(&b, tok_out);
}

tdm_status_t text_tokenizer_load_gguf_buffer(const void *data, size_t n_bytes, const char *what,
                                             text_tokenizer_t **tok_out, char *err,
                                             size_t err_bytes)
{
    cursor_t c;
    kv_ref_t refs[KEY_COUNT];
    uint64_t n_tensors = 0, n_kv = 0;
    tdm_status_t status;

    if ((data == NULL && n_bytes > 0) || tok_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&c, 0, sizeof(c));
    memset(refs, 0, sizeof(refs));
    c.data = data;
    c.n = n_bytes;
    c.what = what != NULL ? what : "<gguf>";
    c.err = err;
    c.err_bytes = err_bytes;
    status = parse_header(&c, &n_tensors, &n_kv);
    if (status == TDM_OK) {
        status = parse_kvs(&c, n_kv, refs);
    }
    if (status == TDM_OK) {
        status = parse_tensor_infos(&c, n_tensors);
    }
    if (status == TDM_OK) {
        status = build(&c, refs, tok_out);
    }
    return status;
}

tdm_status_t text_tokenizer_load_gguf(const char *path, text_tokenizer_t **tok_out, char *err,
                                      size_t err_bytes)
{
    struct stat st;
    void *map;
    int fd;
    tdm_status_t status;

    if (path == NULL || tok_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tdm_errbuf_set(err, err_bytes, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? TDM_ERR_NOT_FOUND : TDM_ERR_IO;
    }
    if (fstat(fd, &st) != 0) {
        tdm_errbuf_set(err, err_bytes, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return TDM_ERR_IO;
    }
    if (st.st_size < (off_t)GGUF_HEADER_BYTES) {
        tdm_errbuf_set(err, err_bytes,
                       "%s: offset 0: %lld bytes is shorter than the "
                       "GGUF header",
                       path, (long long)st.st_size);
        close(fd);
        return TDM_ERR_FORMAT;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        tdm_errbuf_set(err, err_bytes, "%s: mmap: %s", path, strerror(errno));
        return TDM_ERR_IO;
    }
    status =
        text_tokenizer_load_gguf_buffer(map, (size_t)st.st_size, path, tok_out, err, err_bytes);
    munmap(map, (size_t)st.st_size);
    return status;
}
