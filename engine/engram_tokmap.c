/* engram_tokmap.c - MODEL.md 9.2's token normaliser over utf8proc and the real checkpoint's token
 * map (see engram_tokmap.h). The steps follow the reference's Hugging Face normalizers.Sequence
 * (NFKC, NFD, StripAccents, Lowercase, Replace("[ \t\r\n]+", " "), Replace("^ $", U+E000),
 * Strip, Replace(U+E000, " ")) and its _build_lookup_table loop. */
#include "engine/engram_tokmap.h"

#include "common/buf.h"
#include "common/hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* The reference's sentinel that keeps a lone space through Strip (a private-use code point). */
#define TOKMAP_SENTINEL 0xE000
/* Bytes of U+FFFD REPLACEMENT CHARACTER in UTF-8. */
#define TOKMAP_REPLACEMENT "\xEF\xBF\xBD"

/* Unicode White_Space (PropList.txt), what Rust's char::is_whitespace and so HF Strip test. */
static int is_white_space(int32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static int is_collapsed_space(int32_t cp)
{
    return cp == ' ' || cp == '\t' || cp == '\r' || cp == '\n';
}

static int is_mark(int32_t cp)
{
    utf8proc_category_t category = utf8proc_category(cp);
    return category == UTF8PROC_CATEGORY_MN || category == UTF8PROC_CATEGORY_MC ||
           category == UTF8PROC_CATEGORY_ME;
}

/* NFKC then NFD of n_bytes at text: *out_ (malloc'd by utf8proc) of *n_out_ bytes. */
static tdm_status_t nfkc_nfd(const char *text, size_t n_bytes, utf8proc_uint8_t **out_,
                             size_t *n_out_)
{
    utf8proc_uint8_t *nfkc = NULL;
    utf8proc_uint8_t *nfd = NULL;
    utf8proc_ssize_t n_nfkc;
    utf8proc_ssize_t n_nfd;

    n_nfkc = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)n_bytes, &nfkc,
                          UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (n_nfkc < 0) {
        return n_nfkc == UTF8PROC_ERROR_NOMEM ? TDM_ERR_NO_MEMORY : TDM_ERR_FORMAT;
    }
    n_nfd = utf8proc_map(nfkc, n_nfkc, &nfd, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    free(nfkc);
    if (n_nfd < 0) {
        return n_nfd == UTF8PROC_ERROR_NOMEM ? TDM_ERR_NO_MEMORY : TDM_ERR_FORMAT;
    }
    *out_ = nfd;
    *n_out_ = (size_t)n_nfd;
    return TDM_OK;
}

tdm_status_t engine_engram_normalize(const char *text, size_t n_bytes, char **norm_out,
                                     size_t *n_norm_out)
{
    utf8proc_uint8_t *nfd = NULL;
    size_t n_nfd = 0;
    int32_t *cps;
    size_t n_cps = 0;
    size_t first;
    size_t end;
    char *norm;
    size_t n_norm = 0;
    tdm_status_t status;

    if (norm_out == NULL || n_norm_out == NULL || (text == NULL && n_bytes > 0)) {
        return TDM_ERR_INVALID_ARG;
    }
    status = nfkc_nfd(n_bytes > 0 ? text : "", n_bytes, &nfd, &n_nfd);
    if (status != TDM_OK) {
        return status;
    }
    cps = malloc((n_nfd + 1) * sizeof(*cps));
    if (cps == NULL) {
        free(nfd);
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t pos = 0; pos < n_nfd;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t used = utf8proc_iterate(nfd + pos, (utf8proc_ssize_t)(n_nfd - pos), &cp);
        if (used <= 0) {
            free(cps);
            free(nfd);
            return TDM_ERR_FORMAT;
        }
        pos += (size_t)used;
        if (is_mark(cp)) {
            continue; /* StripAccents */
        }
        cp = utf8proc_tolower(cp);
        if (is_collapsed_space(cp)) {
            /* runs of [ \t\r\n] become one ' ' (a run's earlier members are already ' ') */
            cp = ' ';
            if (n_cps > 0 && cps[n_cps - 1] == ' ') {
                continue;
            }
        }
        cps[n_cps++] = cp;
    }
    free(nfd);
    if (n_cps == 1 && cps[0] == ' ') {
        cps[0] = TOKMAP_SENTINEL;
    }
    first = 0;
    end = n_cps;
    while (first < end && is_white_space(cps[first])) {
        first++;
    }
    while (end > first && is_white_space(cps[end - 1])) {
        end--;
    }
    norm = malloc(4 * (end - first) + 1);
    if (norm == NULL) {
        free(cps);
        return TDM_ERR_NO_MEMORY;
    }
    for (size_t i = first; i < end; i++) {
        int32_t cp = cps[i] == TOKMAP_SENTINEL ? ' ' : cps[i];
        n_norm += (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)norm + n_norm);
    }
    norm[n_norm] = '\0';
    free(cps);
    *norm_out = norm;
    *n_norm_out = n_norm;
    return TDM_OK;
}

/* Distinct keys seen so far: pooled bytes plus an open-addressing table of compressed ids. */
typedef struct {
    tdm_buf_t pool;     /* the keys' bytes, back to back */
    size_t *key_offset; /* [n_keys + 1] */
    int64_t n_keys;
    int32_t *slots; /* compressed id or -1; capacity mask + 1, a power of two */
    uint64_t mask;
} key_set_t;

static void key_set_fini(key_set_t *set)
{
    tdm_buf_fini(&set->pool);
    free(set->key_offset);
    free(set->slots);
    memset(set, 0, sizeof(*set));
}

static tdm_status_t key_set_init(key_set_t *set, size_t max_keys)
{
    uint64_t capacity = 16;

    memset(set, 0, sizeof(*set));
    while (capacity < 2 * (uint64_t)max_keys) {
        capacity *= 2;
    }
    set->slots = malloc(capacity * sizeof(*set->slots));
    set->key_offset = malloc((max_keys + 1) * sizeof(*set->key_offset));
    if (set->slots == NULL || set->key_offset == NULL) {
        key_set_fini(set);
        return TDM_ERR_NO_MEMORY;
    }
    memset(set->slots, 0xff, capacity * sizeof(*set->slots));
    set->mask = capacity - 1;
    set->key_offset[0] = 0;
    return TDM_OK;
}

/* *id_out = the compressed id of key (n bytes), a new one (= n_keys) when first seen. The set
 * has room for max_keys keys, which the caller never exceeds (one key per token id). */
static tdm_status_t key_set_intern(key_set_t *set, const char *key, size_t n, int32_t *id_out)
{
    uint64_t slot = tdm_hash_xxh3_64(key, n) & set->mask;

    for (;; slot = (slot + 1) & set->mask) {
        int32_t id = set->slots[slot];
        if (id < 0) {
            break;
        }
        if (set->key_offset[id + 1] - set->key_offset[id] == n &&
            memcmp(set->pool.data + set->key_offset[id], key, n) == 0) {
            *id_out = id;
            return TDM_OK;
        }
    }
    if (tdm_buf_append(&set->pool, key, n) != TDM_OK) {
        return TDM_ERR_NO_MEMORY;
    }
    set->slots[slot] = (int32_t)set->n_keys;
    set->key_offset[set->n_keys + 1] = set->pool.n_bytes;
    *id_out = (int32_t)set->n_keys++;
    return TDM_OK;
}

/* The compressed id of tokenizer id `id` (MODEL.md 9.2's key rule). */
static tdm_status_t map_one(const text_tokenizer_t *tok, int32_t id, key_set_t *set,
                            int32_t *cid_out, char *err, size_t err_bytes)
{
    char *text = NULL;
    size_t n_text = 0;
    char *norm = NULL;
    size_t n_norm = 0;
    const char *key;
    size_t n_key;
    tdm_status_t status;

    status = text_detok_decode(tok, &id, 1, 0, &text, &n_text);
    if (status != TDM_OK) {
        return status;
    }
    if (memmem(text, n_text, TOKMAP_REPLACEMENT, strlen(TOKMAP_REPLACEMENT)) != NULL) {
        status = text_tokenizer_token_text(tok, id, &key, &n_key);
    } else {
        status = engine_engram_normalize(text, n_text, &norm, &n_norm);
        if (status == TDM_ERR_FORMAT && err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "token %d: decoded text is not UTF-8", (int)id);
        }
        key = n_norm > 0 ? norm : text;
        n_key = n_norm > 0 ? n_norm : n_text;
    }
    if (status == TDM_OK) {
        status = key_set_intern(set, key, n_key, cid_out);
    }
    free(norm);
    free(text);
    return status;
}

tdm_status_t engine_engram_token_map_build(const text_tokenizer_t *tok, const engine_config_t *cfg,
                                           int32_t *token_map_out, int64_t *n_compressed_out,
                                           char *err, size_t err_bytes)
{
    uint32_t n_tok;
    int32_t *map;
    key_set_t set;
    tdm_status_t status;

    if (tok == NULL || cfg == NULL || token_map_out == NULL || n_compressed_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    n_tok = text_tokenizer_n_vocab(tok);
    if ((int64_t)n_tok > cfg->vocab_size) {
        snprintf(err, err_bytes, "tokenizer has %u ids but config vocab_size is %lld", n_tok,
                 (long long)cfg->vocab_size);
        return TDM_ERR_MISMATCH;
    }
    if (cfg->engram_pad_token_id < 0 || cfg->engram_pad_token_id >= (int64_t)n_tok) {
        snprintf(err, err_bytes, "engram_pad_token_id %lld is not a tokenizer id (0..%u)",
                 (long long)cfg->engram_pad_token_id, n_tok - 1);
        return TDM_ERR_MISMATCH;
    }
    map = malloc((size_t)cfg->vocab_size * sizeof(*map));
    if (map == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    status = key_set_init(&set, n_tok);
    for (uint32_t id = 0; status == TDM_OK && id < n_tok; id++) {
        status = map_one(tok, (int32_t)id, &set, &map[id], err, err_bytes);
    }
    if (status == TDM_OK) {
        for (int64_t id = n_tok; id < cfg->vocab_size; id++) {
            map[id] = map[cfg->engram_pad_token_id];
        }
        memcpy(token_map_out, map, (size_t)cfg->vocab_size * sizeof(*map));
        *n_compressed_out = set.n_keys;
    }
    key_set_fini(&set);
    free(map);
    return status;
}
