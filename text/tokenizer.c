/* tokenizer.c - vocabulary building, BPE merging and encode for text/tokenizer.h.
 *
 * The loaders (hf.c, gguf.c) feed tokens and merges through the builder here; encode splits out
 * added tokens, runs the pre-tokenizer (pretok.c) and merges each pre-token by rank. Source of the
 * algorithm: Sennrich, Haddow & Birch 2016 (BPE), GPT-2's byte-level variant (Radford et al. 2019);
 * the rank/leftmost priority matches Hugging Face tokenizers (models/bpe/word.rs) and llama.cpp
 * (llm_tokenizer_bpe_session).
 */
#include "text/tokenizer.h"

#include "common/buf.h"
#include "common/errbuf.h"
#include "common/hash.h"
#include "common/log.h"
#include "text/tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMPTY_MERGE UINT64_MAX
#define LSTRIP_BIT  1u
#define RSTRIP_BIT  2u

/* ---- string maps ----------------------------------------------------------------------------- */

static uint32_t pow2_at_least(uint64_t n)
{
    uint64_t cap = 16;

    while (cap < n) {
        cap <<= 1;
    }
    return (uint32_t)cap;
}

static tdm_status_t strmap_init(text_tokenizer_strmap_t *map, uint32_t n_keys)
{
    uint32_t cap = pow2_at_least((uint64_t)n_keys * 2);

    map->slots = malloc((size_t)cap * sizeof(*map->slots));
    if (map->slots == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    memset(map->slots, 0xff, (size_t)cap * sizeof(*map->slots));
    map->mask = cap - 1;
    return TDM_OK;
}

/* Slot holding the id whose pooled key equals key[0..n), or the empty slot where it would go. */
static uint32_t strmap_slot(const text_tokenizer_strmap_t *map, const void *pool,
                            const uint32_t *offset, const void *key, size_t n)
{
    uint32_t slot = (uint32_t)tdm_hash_xxh3_64(key, n) & map->mask;

    for (;;) {
        int32_t id = map->slots[slot];
        if (id < 0) {
            return slot;
        }
        if (offset[id + 1] - offset[id] == n &&
            memcmp((const uint8_t *)pool + offset[id], key, n) == 0) {
            return slot;
        }
        slot = (slot + 1) & map->mask;
    }
}

int32_t text_tokenizer_lookup_text(const text_tokenizer_t *tok, const char *text, size_t n)
{
    uint32_t slot = strmap_slot(&tok->text_map, tok->text_pool, tok->text_offset, text, n);

    return tok->text_map.slots[slot];
}

static int32_t lookup_bytes(const text_tokenizer_t *tok, const uint8_t *bytes, size_t n)
{
    uint32_t slot = strmap_slot(&tok->bytes_map, tok->bytes_pool, tok->bytes_offset, bytes, n);

    return tok->bytes_map.slots[slot];
}

/* ---- merges ---------------------------------------------------------------------------------- */

static uint32_t merge_slot(const text_tokenizer_t *tok, uint64_t key)
{
    uint32_t slot = (uint32_t)tdm_hash_splitmix64(key) & tok->merge_mask;

    while (tok->merges[slot].key != EMPTY_MERGE && tok->merges[slot].key != key) {
        slot = (slot + 1) & tok->merge_mask;
    }
    return slot;
}

static const text_tokenizer_merge_t *find_merge(const text_tokenizer_t *tok, int32_t left,
                                                int32_t right)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    const text_tokenizer_merge_t *m = &tok->merges[merge_slot(tok, key)];

    return m->key == EMPTY_MERGE ? NULL : m;
}

/* ---- builder --------------------------------------------------------------------------------- */

tdm_status_t text_tokenizer_builder_init(text_tokenizer_builder_t *b, uint32_t n_vocab,
                                         uint32_t max_merges, char *err, size_t err_bytes)
{
    text_tokenizer_t *tok;
    uint32_t cap;

    memset(b, 0, sizeof(*b));
    if (n_vocab == 0 || n_vocab > TEXT_TOKENIZER_MAX_VOCAB) {
        tdm_errbuf_set(err, err_bytes, "vocabulary size %u outside 1..%u", n_vocab,
                       TEXT_TOKENIZER_MAX_VOCAB);
        return TDM_ERR_FORMAT;
    }
    if (max_merges > TEXT_TOKENIZER_MAX_VOCAB * 4u) {
        tdm_errbuf_set(err, err_bytes, "%u merges exceed the limit %u", max_merges,
                       TEXT_TOKENIZER_MAX_VOCAB * 4u);
        return TDM_ERR_FORMAT;
    }
    tok = calloc(1, sizeof(*tok));
    if (tok == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    b->tok = tok;
    tok->n_vocab = n_vocab;
    tok->bos_id = -1;
    tok->eos_id = -1;
    tok->pad_id = -1;
    tok->kind = calloc(n_vocab, 1);
    tok->lstrip_rstrip = calloc(n_vocab, 1);
    b->refs = calloc(n_vocab, sizeof(*b->refs));
    b->is_set = calloc(n_vocab, 1);
    cap = pow2_at_least((uint64_t)max_merges * 2);
    tok->merges = malloc((size_t)cap * sizeof(*tok->merges));
    if (tok->kind == NULL || tok->lstrip_rstrip == NULL || b->refs == NULL || b->is_set == NULL ||
        tok->merges == NULL) {
        text_tokenizer_builder_fini(b);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < cap; i++) {
        tok->merges[i].key = EMPTY_MERGE;
    }
    tok->merge_mask = cap - 1;
    b->cap_merges = cap;
    return TDM_OK;
}

tdm_status_t text_tokenizer_builder_set_token(text_tokenizer_builder_t *b, uint32_t id,
                                              const char *text, size_t n_bytes,
                                              text_token_kind_t kind, char *err, size_t err_bytes)
{
    text_tokenizer_t *tok = b->tok;
    text_tokenizer_text_ref_t *refs = b->refs;

    if (id >= tok->n_vocab) {
        tdm_errbuf_set(err, err_bytes, "token id %u outside the vocabulary (0..%u)", id,
                       tok->n_vocab - 1);
        return TDM_ERR_FORMAT;
    }
    if (n_bytes == 0 || n_bytes > TEXT_TOKENIZER_MAX_TOKEN_BYTES) {
        tdm_errbuf_set(err, err_bytes, "token id %u has text of %zu bytes (1..%u)", id, n_bytes,
                       TEXT_TOKENIZER_MAX_TOKEN_BYTES);
        return TDM_ERR_FORMAT;
    }
    if (b->is_set[id]) {
        if (refs[id].n_bytes == n_bytes &&
            memcmp(tok->text_pool + refs[id].offset, text, n_bytes) == 0) {
            return TDM_OK;
        }
        tdm_errbuf_set(err, err_bytes, "token id %u given two different texts", id);
        return TDM_ERR_FORMAT;
    }
    if (b->n_text + n_bytes > UINT32_MAX - 1) {
        tdm_errbuf_set(err, err_bytes, "token texts exceed 4 GiB");
        return TDM_ERR_FORMAT;
    }
    if (b->n_text + n_bytes > b->cap_text) {
        char *pool = tdm_array_grow(tok->text_pool, 1, b->n_text + n_bytes, 4096, &b->cap_text);
        if (pool == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        tok->text_pool = pool;
    }
    memcpy(tok->text_pool + b->n_text, text, n_bytes);
    refs[id].offset = (uint32_t)b->n_text;
    refs[id].n_bytes = (uint32_t)n_bytes;
    b->n_text += n_bytes;
    b->is_set[id] = 1;
    b->n_set++;
    tok->kind[id] = (uint8_t)kind;
    return TDM_OK;
}

void text_tokenizer_builder_mark_added(text_tokenizer_builder_t *b, uint32_t id,
                                       text_token_kind_t kind, int lstrip, int rstrip)
{
    b->tok->kind[id] = (uint8_t)kind;
    b->tok->lstrip_rstrip[id] = (uint8_t)((lstrip ? LSTRIP_BIT : 0u) | (rstrip ? RSTRIP_BIT : 0u));
}

/* Bytes a NORMAL token's stored text stands for: each code point through the byte-level table;
 * a code point outside it (or an ill-formed byte) is kept as its own UTF-8 bytes. */
static size_t byte_level_decode(const uint8_t *text, size_t n, uint8_t *out)
{
    size_t i = 0, n_out = 0;

    while (i < n) {
        uint32_t cp;
        size_t len = text_tokenizer_utf8_next(text + i, n - i, &cp);
        int byte = len > 0 ? text_tokenizer_cp_to_byte(cp) : -1;
        if (byte >= 0) {
            out[n_out++] = (uint8_t)byte;
        } else {
            if (len == 0) {
                len = 1;
            }
            memcpy(out + n_out, text + i, len);
            n_out += len;
        }
        i += len;
    }
    return n_out;
}

/* Value of hex digit c, or -1. */
static int hex_value(uint8_t c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

/* Bytes a NORMAL SentencePiece token stands for: "<0xHH>" is that byte; otherwise the text
 * with each U+2581 (E2 96 81) as a space. */
static size_t spm_decode(const uint8_t *text, size_t n, uint8_t *out)
{
    size_t n_out = 0;

    if (n == 6 && memcmp(text, "<0x", 3) == 0 && text[5] == '>' && hex_value(text[3]) >= 0 &&
        hex_value(text[4]) >= 0) {
        out[0] = (uint8_t)(hex_value(text[3]) * 16 + hex_value(text[4]));
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (i + 3 <= n && text[i] == 0xe2 && text[i + 1] == 0x96 && text[i + 2] == 0x81) {
            out[n_out++] = ' ';
            i += 2;
        } else {
            out[n_out++] = text[i];
        }
    }
    return n_out;
}

/* Pack the texts in id order and compute every token's bytes. */
static tdm_status_t pack_texts(text_tokenizer_builder_t *b)
{
    text_tokenizer_t *tok = b->tok;
    const text_tokenizer_text_ref_t *refs = b->refs;
    uint32_t n = tok->n_vocab;
    uint32_t *text_offset = malloc(((size_t)n + 1) * sizeof(*text_offset));
    uint32_t *bytes_offset = malloc(((size_t)n + 1) * sizeof(*bytes_offset));
    char *text_pool = malloc(b->n_text + 1);
    uint8_t *bytes_pool = malloc(b->n_text + 1);
    size_t pos = 0, pos_bytes = 0;

    if (text_offset == NULL || bytes_offset == NULL || text_pool == NULL || bytes_pool == NULL) {
        free(text_offset);
        free(bytes_offset);
        free(text_pool);
        free(bytes_pool);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t id = 0; id < n; id++) {
        const char *src = tok->text_pool + refs[id].offset;
        size_t len = refs[id].n_bytes;
        text_offset[id] = (uint32_t)pos;
        memcpy(text_pool + pos, src, len);
        pos += len;
        bytes_offset[id] = (uint32_t)pos_bytes;
        if ((tok->kind[id] == TEXT_TOKEN_NORMAL || tok->kind[id] == TEXT_TOKEN_UNUSED) &&
            tok->spm) {
            pos_bytes += spm_decode((const uint8_t *)src, len, bytes_pool + pos_bytes);
        } else if (tok->kind[id] == TEXT_TOKEN_NORMAL || tok->kind[id] == TEXT_TOKEN_UNUSED) {
            pos_bytes += byte_level_decode((const uint8_t *)src, len, bytes_pool + pos_bytes);
        } else {
            memcpy(bytes_pool + pos_bytes, src, len);
            pos_bytes += len;
        }
    }
    text_offset[n] = (uint32_t)pos;
    bytes_offset[n] = (uint32_t)pos_bytes;
    free(tok->text_pool);
    free(b->refs);
    b->refs = NULL;
    tok->text_pool = text_pool;
    tok->text_offset = text_offset;
    tok->bytes_pool = bytes_pool;
    tok->bytes_offset = bytes_offset;
    return TDM_OK;
}

tdm_status_t text_tokenizer_builder_index(text_tokenizer_builder_t *b, char *err, size_t err_bytes)
{
    text_tokenizer_t *tok = b->tok;
    int n_missing = 0;
    tdm_status_t status;

    if (b->n_set != tok->n_vocab) {
        for (uint32_t id = 0; id < tok->n_vocab; id++) {
            if (!b->is_set[id]) {
                tdm_errbuf_set(err, err_bytes,
                               "token ids not contiguous: id %u of 0..%u is missing", id,
                               tok->n_vocab - 1);
                break;
            }
        }
        return TDM_ERR_FORMAT;
    }
    status = pack_texts(b);
    if (status != TDM_OK) {
        return status;
    }
    status = strmap_init(&tok->text_map, tok->n_vocab);
    if (status == TDM_OK) {
        status = strmap_init(&tok->bytes_map, tok->n_vocab);
    }
    if (status != TDM_OK) {
        return status;
    }
    for (uint32_t id = 0; id < tok->n_vocab; id++) {
        const char *text = tok->text_pool + tok->text_offset[id];
        size_t len = tok->text_offset[id + 1] - tok->text_offset[id];
        uint32_t slot = strmap_slot(&tok->text_map, tok->text_pool, tok->text_offset, text, len);
        if (tok->text_map.slots[slot] >= 0) {
            tdm_errbuf_set(err, err_bytes, "duplicate token text at ids %d and %u",
                           tok->text_map.slots[slot], id);
            return TDM_ERR_FORMAT;
        }
        tok->text_map.slots[slot] = (int32_t)id;
        if (tok->kind[id] == TEXT_TOKEN_NORMAL) {
            const uint8_t *bytes = tok->bytes_pool + tok->bytes_offset[id];
            size_t n_bytes = tok->bytes_offset[id + 1] - tok->bytes_offset[id];
            slot = strmap_slot(&tok->bytes_map, tok->bytes_pool, tok->bytes_offset, bytes, n_bytes);
            if (tok->bytes_map.slots[slot] < 0) {
                tok->bytes_map.slots[slot] = (int32_t)id;
            }
        }
    }
    for (int byte = 0; byte < 256; byte++) {
        char utf8[8];
        size_t len = tok->spm ? (size_t)snprintf(utf8, sizeof(utf8), "<0x%02X>", byte)
                              : text_tokenizer_utf8_put(text_tokenizer_byte_to_cp((uint8_t)byte),
                                                        (uint8_t *)utf8);
        /* Vocabularies often lack bytes that never occur in UTF-8 (C0, C1, F5..FF); such a
         * byte encodes to no token, as in Hugging Face and llama.cpp. */
        tok->byte_id[byte] = text_tokenizer_lookup_text(tok, utf8, len);
        if (tok->byte_id[byte] < 0) {
            n_missing++;
        }
    }
    if (n_missing > 0) {
        tdm_log(TDM_LOG_DEBUG, "tokenizer", "vocabulary lacks byte tokens: n_bytes=%d", n_missing);
    }
    return TDM_OK;
}

tdm_status_t text_tokenizer_builder_add_merge(text_tokenizer_builder_t *b, const char *left,
                                              size_t n_left, const char *right, size_t n_right)
{
    text_tokenizer_t *tok = b->tok;
    int32_t l = text_tokenizer_lookup_text(tok, left, n_left);
    int32_t r = text_tokenizer_lookup_text(tok, right, n_right);
    int32_t m;
    uint64_t key;
    uint32_t slot;

    if (l < 0 || r < 0) {
        return TDM_ERR_NOT_FOUND;
    }
    if (n_left + n_right > b->cap_scratch) {
        char *scratch = realloc(b->scratch, n_left + n_right);
        if (scratch == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        b->scratch = scratch;
        b->cap_scratch = n_left + n_right;
    }
    memcpy(b->scratch, left, n_left);
    memcpy(b->scratch + n_left, right, n_right);
    m = text_tokenizer_lookup_text(tok, b->scratch, n_left + n_right);
    if (m < 0) {
        return TDM_ERR_NOT_FOUND;
    }
    if ((uint64_t)tok->n_merges * 2 >= b->cap_merges) {
        return TDM_ERR_FORMAT;
    }
    key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    slot = merge_slot(tok, key);
    if (tok->merges[slot].key == key) {
        return TDM_OK; /* a repeated pair keeps its first (lowest) rank */
    }
    tok->merges[slot].key = key;
    tok->merges[slot].rank = tok->n_merges++;
    tok->merges[slot].result = m;
    return TDM_OK;
}

static int32_t trie_child(const text_tokenizer_t *tok, int32_t node, uint8_t byte)
{
    for (int32_t c = tok->trie[node].first_child; c >= 0; c = tok->trie[c].next_sibling) {
        if (tok->trie[c].byte == byte) {
            return c;
        }
    }
    return -1;
}

static tdm_status_t build_trie(text_tokenizer_t *tok)
{
    size_t cap = 1;

    for (uint32_t id = 0; id < tok->n_vocab; id++) {
        if (tok->kind[id] == TEXT_TOKEN_CONTROL || tok->kind[id] == TEXT_TOKEN_USER_DEFINED) {
            cap += tok->text_offset[id + 1] - tok->text_offset[id];
            tok->n_added++;
        }
    }
    if (cap > INT32_MAX) {
        return TDM_ERR_NO_MEMORY;
    }
    tok->trie = malloc(cap * sizeof(*tok->trie));
    if (tok->trie == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    tok->trie[0] = (text_tokenizer_trie_node_t){-1, -1, -1, 0};
    tok->n_trie = 1;
    for (uint32_t id = 0; id < tok->n_vocab; id++) {
        const uint8_t *text = (const uint8_t *)tok->text_pool + tok->text_offset[id];
        size_t len = tok->text_offset[id + 1] - tok->text_offset[id];
        int32_t node = 0;
        if (tok->kind[id] != TEXT_TOKEN_CONTROL && tok->kind[id] != TEXT_TOKEN_USER_DEFINED) {
            continue;
        }
        tok->trie_first[text[0] >> 3] |= (uint8_t)(1u << (text[0] & 7));
        for (size_t i = 0; i < len; i++) {
            int32_t child = trie_child(tok, node, text[i]);
            if (child < 0) {
                child = (int32_t)tok->n_trie++;
                tok->trie[child] =
                    (text_tokenizer_trie_node_t){-1, tok->trie[node].first_child, -1, text[i]};
                tok->trie[node].first_child = child;
            }
            node = child;
        }
        tok->trie[node].token = (int32_t)id;
    }
    return TDM_OK;
}

tdm_status_t text_tokenizer_builder_finish(text_tokenizer_builder_t *b, text_tokenizer_t **tok_out)
{
    tdm_status_t status = build_trie(b->tok);

    if (status != TDM_OK) {
        return status;
    }
    *tok_out = b->tok;
    b->tok = NULL;
    text_tokenizer_builder_fini(b);
    return TDM_OK;
}

void text_tokenizer_builder_fini(text_tokenizer_builder_t *b)
{
    text_tokenizer_destroy(b->tok);
    free(b->refs);
    free(b->is_set);
    free(b->scratch);
    memset(b, 0, sizeof(*b));
}

void text_tokenizer_destroy(text_tokenizer_t *tok)
{
    if (tok == NULL) {
        return;
    }
    text_tokenizer_pretok_fini(&tok->pretok);
    free(tok->text_pool);
    free(tok->text_offset);
    free(tok->bytes_pool);
    free(tok->bytes_offset);
    free(tok->kind);
    free(tok->lstrip_rstrip);
    free(tok->text_map.slots);
    free(tok->bytes_map.slots);
    free(tok->merges);
    free(tok->trie);
    free(tok->scores);
    free(tok);
}

/* ---- encode ---------------------------------------------------------------------------------- */

tdm_status_t text_tokenizer_ids_push(text_tokenizer_ids_t *v, int32_t id)
{
    if (v->n == v->cap) {
        int32_t *ids = tdm_array_grow(v->ids, sizeof(*ids), v->n + 1, 256, &v->cap);
        if (ids == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        v->ids = ids;
    }
    v->ids[v->n++] = id;
    return TDM_OK;
}

/* Symbol list and candidate heap of one pre-token. */
typedef struct {
    int32_t *sym_id;   /* -1 once merged away */
    int32_t *sym_next; /* -1 at the end */
    int32_t *sym_prev;
    size_t cap_sym;
    text_tokenizer_heap_t heap; /* candidates: rank, left, left_id, right_id */
} bpe_scratch_t;

/* Candidate a goes before b: the smaller key, then the leftmost. */
static int cand_before(const text_tokenizer_cand_t *a, const text_tokenizer_cand_t *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

tdm_status_t text_tokenizer_heap_push(text_tokenizer_heap_t *heap, text_tokenizer_cand_t cand)
{
    size_t i;

    if (heap->n == heap->cap) {
        text_tokenizer_cand_t *items =
            tdm_array_grow(heap->items, sizeof(*items), heap->n + 1, 64, &heap->cap);
        if (items == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        heap->items = items;
    }
    i = heap->n++;
    while (i > 0 && cand_before(&cand, &heap->items[(i - 1) / 2])) {
        heap->items[i] = heap->items[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap->items[i] = cand;
    return TDM_OK;
}

text_tokenizer_cand_t text_tokenizer_heap_pop(text_tokenizer_heap_t *heap)
{
    text_tokenizer_cand_t top = heap->items[0];
    text_tokenizer_cand_t last = heap->items[--heap->n];
    size_t i = 0;

    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= heap->n) {
            break;
        }
        if (child + 1 < heap->n && cand_before(&heap->items[child + 1], &heap->items[child])) {
            child++;
        }
        if (!cand_before(&heap->items[child], &last)) {
            break;
        }
        heap->items[i] = heap->items[child];
        i = child;
    }
    if (heap->n > 0) {
        heap->items[i] = last;
    }
    return top;
}

void text_tokenizer_heap_fini(text_tokenizer_heap_t *heap)
{
    free(heap->items);
    memset(heap, 0, sizeof(*heap));
}

static tdm_status_t push_candidate(const text_tokenizer_t *tok, bpe_scratch_t *s, int32_t left)
{
    const text_tokenizer_merge_t *m;
    int32_t right;

    if (left < 0 || s->sym_next[left] < 0) {
        return TDM_OK;
    }
    right = s->sym_next[left];
    if (s->sym_id[left] < 0 || s->sym_id[right] < 0) {
        return TDM_OK; /* a byte without a token never merges */
    }
    m = find_merge(tok, s->sym_id[left], s->sym_id[right]);
    if (m == NULL) {
        return TDM_OK;
    }
    return text_tokenizer_heap_push(&s->heap, (text_tokenizer_cand_t){
                                                  .key = m->rank,
                                                  .left = (uint32_t)left,
                                                  .left_id = s->sym_id[left],
                                                  .right_id = s->sym_id[right],
                                              });
}

/* Merge one pre-token's bytes into ids appended to `out`. */
static tdm_status_t bpe_piece(const text_tokenizer_t *tok, const uint8_t *text, size_t n,
                              bpe_scratch_t *s, text_tokenizer_ids_t *out)
{
    tdm_status_t status;

    if (n == 1) {
        return tok->byte_id[text[0]] < 0 ? TDM_OK
                                         : text_tokenizer_ids_push(out, tok->byte_id[text[0]]);
    }
    if (tok->ignore_merges) {
        int32_t whole = lookup_bytes(tok, text, n);
        if (whole >= 0) {
            return text_tokenizer_ids_push(out, whole);
        }
    }
    if (n > s->cap_sym) {
        size_t cap = n < 64 ? 64 : n;
        int32_t *ids = realloc(s->sym_id, cap * sizeof(*ids));
        int32_t *next = ids == NULL ? NULL : realloc(s->sym_next, cap * sizeof(*next));
        int32_t *prev = next == NULL ? NULL : realloc(s->sym_prev, cap * sizeof(*prev));
        if (ids != NULL) {
            s->sym_id = ids;
        }
        if (next != NULL) {
            s->sym_next = next;
        }
        if (prev == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        s->sym_prev = prev;
        s->cap_sym = cap;
    }
    for (size_t i = 0; i < n; i++) {
        s->sym_id[i] = tok->byte_id[text[i]];
        s->sym_prev[i] = (int32_t)i - 1;
        s->sym_next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    s->heap.n = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        status = push_candidate(tok, s, (int32_t)i);
        if (status != TDM_OK) {
            return status;
        }
    }
    while (s->heap.n > 0) {
        text_tokenizer_cand_t c = text_tokenizer_heap_pop(&s->heap);
        int32_t left = (int32_t)c.left;
        int32_t right = s->sym_next[left];
        if (s->sym_id[left] != c.left_id || right < 0 || s->sym_id[right] != c.right_id) {
            continue; /* stale: a neighbour merged since this candidate was queued */
        }
        s->sym_id[left] = find_merge(tok, c.left_id, c.right_id)->result;
        s->sym_id[right] = -1;
        s->sym_next[left] = s->sym_next[right];
        if (s->sym_next[right] >= 0) {
            s->sym_prev[s->sym_next[right]] = left;
        }
        status = push_candidate(tok, s, s->sym_prev[left]);
        if (status == TDM_OK) {
            status = push_candidate(tok, s, left);
        }
        if (status != TDM_OK) {
            return status;
        }
    }
    for (int32_t i = 0; i >= 0; i = s->sym_next[i]) {
        if (s->sym_id[i] < 0) {
            continue;
        }
        status = text_tokenizer_ids_push(out, s->sym_id[i]);
        if (status != TDM_OK) {
            return status;
        }
    }
    return TDM_OK;
}

/* Pre-tokenize and merge one segment free of added tokens. A segment always starts the text or
 * follows an added token, so SentencePiece prepends its space to every one (llama.cpp's
 * is_prev_special is true for each raw fragment). */
static tdm_status_t encode_segment(const text_tokenizer_t *tok, const uint8_t *text, size_t n,
                                   text_tokenizer_scratch_t *scratch, bpe_scratch_t *bpe,
                                   text_tokenizer_ids_t *out)
{
    tdm_status_t status;

    if (n == 0) {
        return TDM_OK;
    }
    if (tok->spm) {
        return text_tokenizer_spm_encode(tok, text, n, tok->add_space_prefix, out);
    }
    status = text_tokenizer_pretok_run(&tok->pretok, text, n, scratch);
    if (status != TDM_OK) {
        return status;
    }
    for (size_t i = 0; i < scratch->n_pieces; i++) {
        const text_tokenizer_piece_t *piece = &scratch->pieces[i];
        if (piece->n_bytes == 0) {
            continue;
        }
        status = bpe_piece(tok, scratch->work + piece->offset, piece->n_bytes, bpe, out);
        if (status != TDM_OK) {
            return status;
        }
    }
    return TDM_OK;
}

/* Longest added token allowed by `flags` starting at text[0..n): its id and length, or -1. */
static int32_t match_added(const text_tokenizer_t *tok, const uint8_t *text, size_t n,
                           uint32_t flags, size_t *len_out)
{
    int32_t node = 0, best = -1;

    for (size_t i = 0; i < n; i++) {
        node = trie_child(tok, node, text[i]);
        if (node < 0) {
            break;
        }
        int32_t id = tok->trie[node].token;
        if (id >= 0 && (tok->kind[id] == TEXT_TOKEN_USER_DEFINED ||
                        (flags & TEXT_TOKENIZE_PARSE_SPECIAL) != 0)) {
            best = id;
            *len_out = i + 1;
        }
    }
    return best;
}

static int is_ascii_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

tdm_status_t text_tokenizer_encode(const text_tokenizer_t *tok, const char *text, size_t n_bytes,
                                   uint32_t flags, int32_t **ids_out, size_t *n_ids_out)
{
    const uint8_t *s = (const uint8_t *)text;
    text_tokenizer_scratch_t scratch;
    bpe_scratch_t bpe = {0};
    text_tokenizer_ids_t out = {0};
    size_t pos = 0, seg_start = 0;
    tdm_status_t status;

    if (tok == NULL || ids_out == NULL || n_ids_out == NULL || (text == NULL && n_bytes > 0) ||
        (flags & ~(uint32_t)(TEXT_TOKENIZE_PARSE_SPECIAL | TEXT_TOKENIZE_ADD_BOS)) != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    if ((flags & TEXT_TOKENIZE_ADD_BOS) != 0 && tok->bos_id < 0) {
        tdm_log(TDM_LOG_WARN, "tokenizer", "encode with ADD_BOS but the vocabulary has no bos");
        return TDM_ERR_NOT_FOUND;
    }
    status = text_tokenizer_scratch_init(&scratch);
    if (status != TDM_OK) {
        return status;
    }
    if ((flags & TEXT_TOKENIZE_ADD_BOS) != 0) {
        status = text_tokenizer_ids_push(&out, tok->bos_id);
    }
    while (status == TDM_OK && pos < n_bytes) {
        size_t len = 0, start = pos, end;
        int32_t id = -1;
        if ((tok->trie_first[s[pos] >> 3] >> (s[pos] & 7)) & 1u) {
            id = match_added(tok, s + pos, n_bytes - pos, flags, &len);
        }
        if (id < 0) {
            pos++;
            continue;
        }
        end = pos + len;
        if ((tok->lstrip_rstrip[id] & LSTRIP_BIT) != 0) {
            while (start > seg_start && is_ascii_space(s[start - 1])) {
                start--;
            }
        }
        if ((tok->lstrip_rstrip[id] & RSTRIP_BIT) != 0) {
            while (end < n_bytes && is_ascii_space(s[end])) {
                end++;
            }
        }
        status = encode_segment(tok, s + seg_start, start - seg_start, &scratch, &bpe, &out);
        if (status == TDM_OK) {
            status = text_tokenizer_ids_push(&out, id);
        }
        pos = end;
        seg_start = end;
    }
    if (status == TDM_OK) {
        status = encode_segment(tok, s + seg_start, n_bytes - seg_start, &scratch, &bpe, &out);
    }
    text_tokenizer_scratch_fini(&scratch);
    free(bpe.sym_id);
    free(bpe.sym_next);
    free(bpe.sym_prev);
    text_tokenizer_heap_fini(&bpe.heap);
    if (status != TDM_OK) {
        free(out.ids);
        return status;
    }
    *ids_out = out.ids;
    *n_ids_out = out.n;
    return TDM_OK;
}

void text_tokens_free(int32_t *ids)
{
    free(ids);
}

/* ---- queries --------------------------------------------------------------------------------- */

uint32_t text_tokenizer_n_vocab(const text_tokenizer_t *tok)
{
    return tok->n_vocab;
}

void text_tokenizer_get_info(const text_tokenizer_t *tok, text_tokenizer_info_t *info_out)
{
    memset(info_out, 0, sizeof(*info_out));
    info_out->n_vocab = tok->n_vocab;
    info_out->n_merges = tok->n_merges;
    info_out->n_added = tok->n_added;
    info_out->bos_id = tok->bos_id;
    info_out->eos_id = tok->eos_id;
    info_out->pad_id = tok->pad_id;
    info_out->ignore_merges = tok->ignore_merges;
    info_out->sentencepiece = tok->spm;
    memcpy(info_out->pre_name, tok->pre_name, sizeof(info_out->pre_name));
}

tdm_status_t text_tokenizer_token_bytes(const text_tokenizer_t *tok, int32_t id,
                                        const uint8_t **bytes_out, size_t *n_bytes_out)
{
    if (tok == NULL || bytes_out == NULL || n_bytes_out == NULL || id < 0 ||
        (uint32_t)id >= tok->n_vocab) {
        return TDM_ERR_INVALID_ARG;
    }
    *bytes_out = tok->bytes_pool + tok->bytes_offset[id];
    *n_bytes_out = tok->bytes_offset[id + 1] - tok->bytes_offset[id];
    return TDM_OK;
}

tdm_status_t text_tokenizer_token_text(const text_tokenizer_t *tok, int32_t id,
                                       const char **text_out, size_t *n_bytes_out)
{
    if (tok == NULL || text_out == NULL || n_bytes_out == NULL || id < 0 ||
        (uint32_t)id >= tok->n_vocab) {
        return TDM_ERR_INVALID_ARG;
    }
    *text_out = tok->text_pool + tok->text_offset[id];
    *n_bytes_out = tok->text_offset[id + 1] - tok->text_offset[id];
    return TDM_OK;
}

tdm_status_t text_tokenizer_token_kind(const text_tokenizer_t *tok, int32_t id,
                                       text_token_kind_t *kind_out)
{
    if (tok == NULL || kind_out == NULL || id < 0 || (uint32_t)id >= tok->n_vocab) {
        return TDM_ERR_INVALID_ARG;
    }
    *kind_out = (text_token_kind_t)tok->kind[id];
    return TDM_OK;
}

tdm_status_t text_tokenizer_find_special(const text_tokenizer_t *tok, const char *text,
                                         int32_t *id_out)
{
    int32_t id;

    if (tok == NULL || text == NULL || id_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    id = text_tokenizer_lookup_text(tok, text, strlen(text));
    if (id < 0 ||
        (tok->kind[id] != TEXT_TOKEN_CONTROL && tok->kind[id] != TEXT_TOKEN_USER_DEFINED)) {
        return TDM_ERR_NOT_FOUND;
    }
    *id_out = id;
    return TDM_OK;
}
