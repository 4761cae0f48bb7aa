/* tokenizer_impl.h - private layout and helpers shared by the .c files of text/.
 *
 * Not part of the public API: only the .c files of text/ include it. Owns the definition of struct
 * text_tokenizer, the vocabulary builder used by both loaders (hf.c, gguf.c), the pre-tokenizer
 * (pretok.c) and the UTF-8 helpers the detokenizer and the writer share. Knows nothing of file
 * formats beyond what each loader passes.
 */
#ifndef TANDEM_TEXT_TOKENIZER_IMPL_H
#define TANDEM_TEXT_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "text/tokenizer.h"

/* Longest token text a loader accepts, bytes. */
#define TEXT_TOKENIZER_MAX_TOKEN_BYTES (1u << 16)
/* Most pre-tokenizer steps (Split/ByteLevel) in one pipeline. */
#define TEXT_TOKENIZER_MAX_PRETOK_STEPS 16

/* DeepSeek's special token texts (U+FF5C FULLWIDTH VERTICAL LINE, U+2581 LOWER ONE EIGHTH BLOCK),
 * shared by the chat encoder and the synthetic writer. */
#define TEXT_TOKENIZER_DS_BOS               "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
#define TEXT_TOKENIZER_DS_EOS               "<\uff5cend\u2581of\u2581sentence\uff5c>"
#define TEXT_TOKENIZER_DS_PAD               "<\uff5c\u2581pad\u2581\uff5c>"
#define TEXT_TOKENIZER_DS_USER              "<\uff5cUser\uff5c>"
#define TEXT_TOKENIZER_DS_ASSISTANT         "<\uff5cAssistant\uff5c>"
#define TEXT_TOKENIZER_DS_THINK             "<think>"
#define TEXT_TOKENIZER_DS_END_THINK         "</think>"
#define TEXT_TOKENIZER_DS_TOOL_OUTPUT_BEGIN "<\uff5ctool\u2581output\u2581begin\uff5c>"
#define TEXT_TOKENIZER_DS_TOOL_OUTPUT_END   "<\uff5ctool\u2581output\u2581end\uff5c>"

/* ---- pre-tokenizer --------------------------------------------------------------------------- */

/* Hugging Face SplitDelimiterBehavior. */
typedef enum {
    TEXT_TOKENIZER_SPLIT_REMOVED = 0,
    TEXT_TOKENIZER_SPLIT_ISOLATED = 1,
    TEXT_TOKENIZER_SPLIT_MERGED_WITH_PREVIOUS = 2,
    TEXT_TOKENIZER_SPLIT_MERGED_WITH_NEXT = 3,
    TEXT_TOKENIZER_SPLIT_CONTIGUOUS = 4,
} text_tokenizer_split_behavior_t;

/* One pipeline step: a regex split, optionally preceded by ByteLevel's prefix space. */
typedef struct {
    pcre2_code *code; /* NULL: no split in this step */
    text_tokenizer_split_behavior_t behavior;
    int invert;           /* split on the non-matches instead */
    int add_prefix_space; /* ByteLevel: prepend ' ' unless present */
} text_tokenizer_pretok_step_t;

/* The pre-tokenizer: steps applied in order to every piece (Hugging Face Sequence). */
typedef struct {
    text_tokenizer_pretok_step_t steps[TEXT_TOKENIZER_MAX_PRETOK_STEPS];
    size_t n_steps;
    int has_byte_level; /* a ByteLevel step was seen (required for byte-level BPE) */
} text_tokenizer_pretok_t;

/* A piece of pre-tokenized text: [offset, offset + n_bytes) of the scratch work buffer. */
typedef struct {
    size_t offset;
    size_t n_bytes;
} text_tokenizer_piece_t;

/* Per-call scratch of one encode (grown as needed, freed at the end of the call). */
typedef struct {
    uint8_t *work; /* segment text plus prefixed copies of pieces */
    size_t n_work, cap_work;
    text_tokenizer_piece_t *pieces; /* current pieces */
    size_t n_pieces, cap_pieces;
    text_tokenizer_piece_t *next; /* pieces being produced by one step */
    size_t n_next, cap_next;
    size_t *matches; /* [start, end) pairs of one piece's regex matches */
    size_t n_matches, cap_matches;
    pcre2_match_data *match_data;
    pcre2_match_context *match_ctx;
    pcre2_jit_stack *jit_stack;
} text_tokenizer_scratch_t;

/*
 * text_tokenizer_pretok_add_split - append a Split step compiling `pattern` (n bytes; PCRE2
 * syntax, UTF + UCP + MATCH_INVALID_UTF + DOLLAR_ENDONLY; `literal` = match the text itself).
 * Returns TDM_OK, TDM_ERR_FORMAT (bad regex: err has PCRE2's message and offset),
 * TDM_ERR_UNSUPPORTED (too many steps) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t text_tokenizer_pretok_add_split(text_tokenizer_pretok_t *pretok, const char *pattern,
                                             size_t n_bytes, int literal,
                                             text_tokenizer_split_behavior_t behavior, int invert,
                                             char *err, size_t err_bytes);

/* text_tokenizer_pretok_add_byte_level - append Hugging Face ByteLevel (with its GPT-2 regex
 * when use_regex). Errors as text_tokenizer_pretok_add_split. */
tdm_status_t text_tokenizer_pretok_add_byte_level(text_tokenizer_pretok_t *pretok,
                                                  int add_prefix_space, int use_regex, char *err,
                                                  size_t err_bytes);

/*
 * text_tokenizer_pretok_preset - the regex sequence llama.cpp (src/llama-vocab.cpp) uses for
 * GGUF tokenizer.ggml.pre `name` (NULL or unknown: "default", logged at warn). Sets
 * *ignore_merges_out (llama3-family names). Errors as text_tokenizer_pretok_add_split.
 */
tdm_status_t text_tokenizer_pretok_preset(text_tokenizer_pretok_t *pretok, const char *name,
                                          int *ignore_merges_out, char *err, size_t err_bytes);

/* text_tokenizer_pretok_fini - free the compiled regexes; zeroes *pretok. Accepts zeroed. */
void text_tokenizer_pretok_fini(text_tokenizer_pretok_t *pretok);

/* text_tokenizer_scratch_init / _fini - per-call scratch (fini accepts a zeroed struct). */
tdm_status_t text_tokenizer_scratch_init(text_tokenizer_scratch_t *scratch);
void text_tokenizer_scratch_fini(text_tokenizer_scratch_t *scratch);

/*
 * text_tokenizer_pretok_run - split `n_bytes` at `text` into pieces: scratch->pieces[0 ..
 * n_pieces) index scratch->work. Returns TDM_OK, TDM_ERR_NO_MEMORY or TDM_ERR_INTERNAL (a PCRE2
 * match error, logged).
 */
tdm_status_t text_tokenizer_pretok_run(const text_tokenizer_pretok_t *pretok, const uint8_t *text,
                                       size_t n_bytes, text_tokenizer_scratch_t *scratch);

/* ---- vocabulary ------------------------------------------------------------------------------ */

/* Open-addressing map from a token's text or bytes (held in a pool) to its id. */
typedef struct {
    int32_t *slots; /* id or -1; capacity is a power of two */
    uint32_t mask;  /* capacity - 1 */
} text_tokenizer_strmap_t;

/* One merge rule: (left id, right id) -> result id at priority `rank` (lower merges first). */
typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX marks an empty slot */
    uint32_t rank;
    int32_t result;
} text_tokenizer_merge_t;

/* Trie node over added-token bytes (children as a sorted sibling list). */
typedef struct {
    int32_t first_child; /* node index or -1 */
    int32_t next_sibling;
    int32_t token; /* id ending here or -1 */
    uint8_t byte;
} text_tokenizer_trie_node_t;

struct text_tokenizer {
    uint32_t n_vocab;
    /* Stored text of each token (as in the file), pooled: text_offset[id] .. text_offset[id+1]. */
    char *text_pool;
    uint32_t *text_offset;
    /* Bytes each token stands for, pooled the same way. */
    uint8_t *bytes_pool;
    uint32_t *bytes_offset;
    uint8_t *kind;                     /* text_token_kind_t per id */
    uint8_t *lstrip_rstrip;            /* bit 0 lstrip, bit 1 rstrip (added tokens) */
    int32_t byte_id[256];              /* token of each single byte */
    text_tokenizer_strmap_t text_map;  /* stored text -> id, every token */
    text_tokenizer_strmap_t bytes_map; /* bytes -> id, NORMAL tokens (ignore_merges) */
    text_tokenizer_merge_t *merges;    /* hash table, capacity merge_mask + 1 */
    uint32_t merge_mask;
    uint32_t n_merges;
    uint32_t n_added;
    text_tokenizer_trie_node_t *trie; /* node 0 is the root */
    uint32_t n_trie;
    uint8_t trie_first[32]; /* bitmap of first bytes of added tokens */
    text_tokenizer_pretok_t pretok;
    int ignore_merges;
    int32_t bos_id, eos_id, pad_id;
    char pre_name[48];
    /* SentencePiece-style vocabulary (GGUF model "llama"): score-ordered merges of adjacent
     * pieces, U+2581 for spaces, "<0xHH>" byte tokens; merges/pretok unused. */
    int spm;
    int add_space_prefix; /* SPM: text after a special token (or the start) gets ' ' prepended */
    float *scores;        /* [n_vocab], SPM only */
};

/* Growable id array of one encode call. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} text_tokenizer_ids_t;

/* text_tokenizer_ids_push - append one id. Returns TDM_OK or TDM_ERR_NO_MEMORY. */
tdm_status_t text_tokenizer_ids_push(text_tokenizer_ids_t *v, int32_t id);

/*
 * text_tokenizer_spm_encode - SentencePiece-style encoding of one segment free of added tokens,
 * as llama.cpp's llm_tokenizer_spm_session: optional leading ' ', spaces to U+2581, one piece
 * per UTF-8 character, repeatedly merge the adjacent pair whose joined text is the
 * highest-scoring token (ties leftmost), pieces that are not tokens fall back to "<0xHH>" byte
 * tokens. Appends to `out`. Returns TDM_OK or TDM_ERR_NO_MEMORY.
 */
tdm_status_t text_tokenizer_spm_encode(const text_tokenizer_t *tok, const uint8_t *text,
                                       size_t n_bytes, int prefix_space, text_tokenizer_ids_t *out);

/* Where the builder placed a token's text in tok->text_pool before packing. */
typedef struct {
    uint32_t offset;
    uint32_t n_bytes;
} text_tokenizer_text_ref_t;

/* Collects tokens and merges from a loader, then builds the tokenizer. */
typedef struct {
    text_tokenizer_t *tok;           /* being built; owned by the builder until finish */
    text_tokenizer_text_ref_t *refs; /* [n_vocab], until index() packs the pool */
    size_t cap_text;                 /* capacity of tok->text_pool */
    size_t n_text;                   /* bytes used */
    uint32_t n_set;                  /* tokens set so far (must reach n_vocab) */
    uint8_t *is_set;
    uint32_t cap_merges; /* merge slots allocated (power of two) */
    char *scratch;       /* concatenation buffer for merge lookups */
    size_t cap_scratch;
} text_tokenizer_builder_t;

/* text_tokenizer_builder_init - start a vocabulary of n_vocab ids (1 .. MAX_VOCAB) and up to
 * max_merges merges. Returns TDM_OK, TDM_ERR_FORMAT (n_vocab out of range) or TDM_ERR_NO_MEMORY. */
tdm_status_t text_tokenizer_builder_init(text_tokenizer_builder_t *b, uint32_t n_vocab,
                                         uint32_t max_merges, char *err, size_t err_bytes);

/* text_tokenizer_builder_set_token - token `id` has stored text `text` (n bytes) and `kind`.
 * Returns TDM_OK, TDM_ERR_FORMAT (id out of range, set twice with other text, empty or too long)
 * or TDM_ERR_NO_MEMORY. */
tdm_status_t text_tokenizer_builder_set_token(text_tokenizer_builder_t *b, uint32_t id,
                                              const char *text, size_t n_bytes,
                                              text_token_kind_t kind, char *err, size_t err_bytes);

/* text_tokenizer_builder_mark_added - id is an added token: set kind and lstrip/rstrip bits. */
void text_tokenizer_builder_mark_added(text_tokenizer_builder_t *b, uint32_t id,
                                       text_token_kind_t kind, int lstrip, int rstrip);

/* text_tokenizer_builder_index - after all tokens are set: check every id is set and texts
 * are unique, compute token bytes, the maps and the byte table. Returns TDM_OK,
 * TDM_ERR_FORMAT (a gap, a duplicate, a byte without a token) or TDM_ERR_NO_MEMORY. */
tdm_status_t text_tokenizer_builder_index(text_tokenizer_builder_t *b, char *err, size_t err_bytes);

/* text_tokenizer_builder_add_merge - next merge rule (rank = number added so far) joining the
 * tokens whose stored texts are `left` and `right`. Returns TDM_OK, TDM_ERR_NOT_FOUND (a part or
 * the joined text is not a token; nothing added), TDM_ERR_FORMAT (same pair twice) or
 * TDM_ERR_NO_MEMORY. Call after text_tokenizer_builder_index. */
tdm_status_t text_tokenizer_builder_add_merge(text_tokenizer_builder_t *b, const char *left,
                                              size_t n_left, const char *right, size_t n_right);

/* text_tokenizer_builder_finish - build the added-token trie; hand the tokenizer (with the
 * pretok the caller moved into b->tok->pretok) to *tok_out. The builder is then empty. */
tdm_status_t text_tokenizer_builder_finish(text_tokenizer_builder_t *b, text_tokenizer_t **tok_out);

/* text_tokenizer_builder_fini - free whatever the builder still holds. Accepts zeroed. */
void text_tokenizer_builder_fini(text_tokenizer_builder_t *b);

/* text_tokenizer_lookup_text - id whose stored text is text[0..n), or -1. */
int32_t text_tokenizer_lookup_text(const text_tokenizer_t *tok, const char *text, size_t n);

/* ---- byte-level table and UTF-8 -------------------------------------------------------------- */

/* text_tokenizer_byte_to_cp - the GPT-2 byte-to-unicode code point of byte b (Radford et al.
 * 2019, encoder.py bytes_to_unicode): printable Latin-1 maps to itself, the rest to 256 + n. */
uint32_t text_tokenizer_byte_to_cp(uint8_t b);

/* text_tokenizer_cp_to_byte - inverse of text_tokenizer_byte_to_cp, or -1. */
int text_tokenizer_cp_to_byte(uint32_t cp);

/* text_tokenizer_utf8_put - write code point cp (<= 0x10FFFF) as UTF-8; returns bytes (1..4). */
size_t text_tokenizer_utf8_put(uint32_t cp, uint8_t out[4]);

/* text_tokenizer_utf8_next - decode one well-formed code point at s[0..n) into *cp_out and
 * return its length, or 0 if the bytes there are ill-formed or incomplete. */
size_t text_tokenizer_utf8_next(const uint8_t *s, size_t n, uint32_t *cp_out);

/* A merge the BPE (tokenizer.c) or SentencePiece (spm.c) encoder may make: the symbols
 * or pieces at `left` and `right`. Queued smallest key first, then leftmost. What the encoder
 * re-checks when it pops the candidate (a neighbour may have merged since) rides along. */
typedef struct {
    double key;      /* BPE: merge rank; SentencePiece: -score (the best score first) */
    uint32_t left;   /* symbol or piece index */
    uint32_t right;  /* SentencePiece: piece index (BPE follows its symbol list instead) */
    int32_t left_id; /* BPE: the two token ids at push time */
    int32_t right_id;
    uint32_t size; /* SentencePiece: bytes of the joined text at push time */
} text_tokenizer_cand_t;

/* A binary min-heap of candidates; zero it to start, text_tokenizer_heap_fini frees it. Set
 * n = 0 to empty it and keep its storage. */
typedef struct {
    text_tokenizer_cand_t *items;
    size_t n;
    size_t cap;
} text_tokenizer_heap_t;

/* text_tokenizer_heap_push - add `cand`. Returns TDM_OK or TDM_ERR_NO_MEMORY (heap unchanged). */
tdm_status_t text_tokenizer_heap_push(text_tokenizer_heap_t *heap, text_tokenizer_cand_t cand);

/* text_tokenizer_heap_pop - remove and return the first candidate: the smallest key, the
 * smallest left among equal keys. heap->n must be > 0. */
text_tokenizer_cand_t text_tokenizer_heap_pop(text_tokenizer_heap_t *heap);

/* text_tokenizer_heap_fini - free the storage; accepts a zeroed heap. */
void text_tokenizer_heap_fini(text_tokenizer_heap_t *heap);

#endif
