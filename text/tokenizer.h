/* tokenizer.h - byte-level BPE tokenizer, streaming detokenizer and DeepSeek chat encoding.
 *
 * Owns a loaded vocabulary (token bytes, merge ranks, added/special tokens, the pre-tokenizer's
 * compiled PCRE2 regexes) read from a Hugging Face `tokenizer.json` or from the tokenizer
 * metadata of a GGUF file; turns UTF-8 text into token ids and ids back into bytes; renders chat
 * conversations in DeepSeek's format; writes the deterministic synthetic tokenizer.json used by
 * random test checkpoints. Knows nothing of models, sessions, HTTP or sampling.
 *
 * Supported: byte-level BPE ("gpt2" style, GPT-2 byte-to-unicode table) with pre-tokenizers
 * ByteLevel, Split (regex or literal, all five behaviours, invert) and Sequence; normalizer none
 * or NFC (treated as identity, exact for text already in NFC); added tokens with lstrip/rstrip.
 * From GGUF also SentencePiece-style "llama" vocabularies (score-ordered merges, byte fallback,
 * space prefix; as llama.cpp). Not supported (load fails with TDM_ERR_UNSUPPORTED): WordPiece
 * and Unigram models, SentencePiece-style tokenizer.json (Metaspace, byte_fallback), other
 * normalizers and pre-tokenizers, BPE dropout, subword prefixes/suffixes.
 * docs/TOKENIZER.md describes sources, limits and the chat format choices.
 *
 * Threading: a loaded text_tokenizer_t is immutable; any number of threads may encode, decode
 * and query it concurrently. An text_detok_t belongs to one stream (one thread at a time).
 */
#ifndef TANDEM_TEXT_TOKENIZER_H
#define TANDEM_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Largest vocabulary a loader accepts (ids are int32; 2^24 keeps every table small). */
#define TEXT_TOKENIZER_MAX_VOCAB (1u << 24)

/* Ids fixed by the model config for the synthetic tokenizer (MODEL.md section 2 and 9). */
#define TEXT_TOKENIZER_SYNTH_BOS_ID 0
#define TEXT_TOKENIZER_SYNTH_EOS_ID 1
#define TEXT_TOKENIZER_SYNTH_PAD_ID 2
/* Smallest vocab_size text_tokenizer_write_synthetic_hf accepts: 3 + 256 bytes + 26 specials. */
#define TEXT_TOKENIZER_SYNTH_MIN_VOCAB 285u
/* Largest vocab_size it accepts (its enumerated merges run out past this). */
#define TEXT_TOKENIZER_SYNTH_MAX_VOCAB (1u << 19)

/* A loaded vocabulary; opaque, immutable after load. */
typedef struct text_tokenizer text_tokenizer_t;

/* Flags of text_tokenizer_encode(). */
typedef enum {
    /* Match special (control) tokens written in the text, e.g. "<｜User｜>", and emit their ids.
     * Without it their text is tokenized as ordinary bytes (safe for untrusted content).
     * Added tokens that are not special are always matched, as Hugging Face does. */
    TEXT_TOKENIZE_PARSE_SPECIAL = 1u << 0,
    /* Prepend the vocabulary's BOS id (TDM_ERR_NOT_FOUND if it has none). */
    TEXT_TOKENIZE_ADD_BOS = 1u << 1,
} text_tokenize_flags_t;

/* What kind of token an id is (GGUF token_type / Hugging Face added_tokens.special). */
typedef enum {
    TEXT_TOKEN_NORMAL = 0,       /* an ordinary BPE token; bytes via the byte-level table */
    TEXT_TOKEN_CONTROL = 1,      /* a special token; matched only with PARSE_SPECIAL */
    TEXT_TOKEN_USER_DEFINED = 2, /* an added non-special token; always matched; raw text */
    TEXT_TOKEN_UNUSED = 3,       /* present but never produced by encode (GGUF "unused") */
} text_token_kind_t;

/* Facts about a loaded vocabulary (plain data, filled by text_tokenizer_get_info). */
typedef struct {
    uint32_t n_vocab;  /* ids are 0 .. n_vocab-1 */
    uint32_t n_merges; /* merge rules in use (ranks 0 .. n_merges-1) */
    uint32_t n_added;  /* CONTROL + USER_DEFINED tokens */
    int32_t bos_id;    /* -1 when the vocabulary names none */
    int32_t eos_id;    /* -1 when none */
    int32_t pad_id;    /* -1 when none */
    int ignore_merges; /* 1: a pre-token found whole in the vocabulary skips the merges */
    int sentencepiece; /* 1: a SentencePiece-style GGUF "llama" vocabulary (score merges) */
    char pre_name[48]; /* GGUF tokenizer.ggml.pre ("default" if absent) or "tokenizer.json" */
} text_tokenizer_info_t;

/*
 * text_tokenizer_load_hf - load a Hugging Face tokenizer.json (model.type "BPE" with a
 * ByteLevel pre-tokenizer). model.merges may be "a b" strings or [a, b] pairs. BOS/EOS/PAD are
 * found by the usual names among added tokens ("<｜begin▁of▁sentence｜>", "<s>",
 * "<|endoftext|>", ...; see docs/TOKENIZER.md).
 *
 * On success *tok_out owns the tokenizer (text_tokenizer_destroy). On failure *tok_out is
 * untouched and err (err_bytes, may be 0) names the field: TDM_ERR_NOT_FOUND / TDM_ERR_IO (file),
 * TDM_ERR_FORMAT (bad JSON, missing "model", bad vocab or merges, bad regex, duplicate tokens,
 * ids not contiguous), TDM_ERR_UNSUPPORTED (model type other than BPE, unsupported normalizer or
 * pre-tokenizer), TDM_ERR_NO_MEMORY. Thread-safe.
 */
tdm_status_t text_tokenizer_load_hf(const char *path, text_tokenizer_t **tok_out, char *err,
                                    size_t err_bytes);

/*
 * text_tokenizer_load_hf_buffer - as text_tokenizer_load_hf, from `n_bytes` of JSON text in
 * memory (borrowed for the call). `what` names the source in error messages.
 */
tdm_status_t text_tokenizer_load_hf_buffer(const char *json, size_t n_bytes, const char *what,
                                           text_tokenizer_t **tok_out, char *err, size_t err_bytes);

/*
 * text_tokenizer_load_gguf - read the tokenizer metadata of a GGUF v2/v3 little-endian file
 * (tokenizer.ggml.model, .tokens, .token_type, .merges, .scores, .pre, .add_space_prefix,
 * .bos/.eos/.padding_token_id; other keys and all tensors are parsed and skipped) and build the
 * tokenizer: model "gpt2" as from tokenizer.json, with the pre-tokenizer regexes llama.cpp uses
 * for the `pre` name (unknown or absent: "default"); model "llama" as SentencePiece-style BPE.
 * The file is mapped read-only for the call; nothing is kept open.
 *
 * Every length, count and type is bounds-checked: a truncated or garbled file is TDM_ERR_FORMAT
 * with err naming the byte offset and key. Also TDM_ERR_NOT_FOUND / TDM_ERR_IO (file),
 * TDM_ERR_UNSUPPORTED (GGUF v1, big-endian, tokenizer model other than "gpt2" and "llama"),
 * TDM_ERR_NO_MEMORY. *tok_out written only on success. Thread-safe.
 */
tdm_status_t text_tokenizer_load_gguf(const char *path, text_tokenizer_t **tok_out, char *err,
                                      size_t err_bytes);

/*
 * text_tokenizer_load_gguf_buffer - as text_tokenizer_load_gguf, from `n_bytes` at `data`
 * (borrowed for the call; any alignment). `what` names the source in error messages.
 */
tdm_status_t text_tokenizer_load_gguf_buffer(const void *data, size_t n_bytes, const char *what,
                                             text_tokenizer_t **tok_out, char *err,
                                             size_t err_bytes);

/* text_tokenizer_destroy - release everything the tokenizer owns. Accepts NULL. */
void text_tokenizer_destroy(text_tokenizer_t *tok);

/*
 * text_tokenizer_encode - token ids of `n_bytes` of text (UTF-8; ill-formed bytes are kept and
 * encoded as their byte tokens; a byte the vocabulary has no token for, typically C0, C1 or
 * F5..FF, yields no id, as in Hugging Face and llama.cpp). Steps: added tokens are split out first
 * (leftmost-longest; CONTROL ones only with TEXT_TOKENIZE_PARSE_SPECIAL), each remaining
 * segment runs through the pre-tokenizer (PCRE2, UTF + UCP), each pre-token through BPE (lowest
 * merge rank first, ties leftmost; Sennrich et al. 2016, GPT-2 byte-level variant).
 *
 * flags: text_tokenize_flags_t bits. On success *ids_out is a new array of *n_ids_out ids
 * (caller frees with text_tokens_free(); NULL when there are no ids). Returns TDM_OK,
 * TDM_ERR_INVALID_ARG (NULL tok/outputs, text NULL with n_bytes > 0, unknown flags),
 * TDM_ERR_NOT_FOUND (ADD_BOS without a BOS), TDM_ERR_NO_MEMORY, TDM_ERR_INTERNAL (PCRE2 failed
 * at match time, e.g. its match limit). Outputs untouched on failure. Thread-safe; allocates
 * per call (not for the decode loop).
 */
tdm_status_t text_tokenizer_encode(const text_tokenizer_t *tok, const char *text, size_t n_bytes,
                                   uint32_t flags, int32_t **ids_out, size_t *n_ids_out);

/* text_tokens_free - free an id array returned by this module. Accepts NULL. */
void text_tokens_free(int32_t *ids);

/* text_tokenizer_n_vocab - number of ids (max id + 1). */
uint32_t text_tokenizer_n_vocab(const text_tokenizer_t *tok);

/* text_tokenizer_get_info - fill *info_out with the vocabulary's facts. */
void text_tokenizer_get_info(const text_tokenizer_t *tok, text_tokenizer_info_t *info_out);

/*
 * text_tokenizer_token_bytes - the bytes token `id` stands for (NORMAL and UNUSED tokens:
 * byte-level decoded, or for SentencePiece U+2581 as ' ' and "<0xHH>" as that byte; CONTROL and
 * USER_DEFINED tokens: their raw text). *bytes_out is borrowed
 * from the tokenizer (valid until destroy, not NUL-terminated). Returns TDM_OK or
 * TDM_ERR_INVALID_ARG (id out of range; outputs untouched).
 */
tdm_status_t text_tokenizer_token_bytes(const text_tokenizer_t *tok, int32_t id,
                                        const uint8_t **bytes_out, size_t *n_bytes_out);

/*
 * text_tokenizer_token_text - the token's text as stored in the vocabulary, e.g. "\u0120the" for
 * " the" in a byte-level BPE (Hugging Face convert_ids_to_tokens; for GGUF the tokens array
 * entry). *text_out is borrowed from the tokenizer (valid until destroy, not NUL-terminated).
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (id out of range; outputs untouched).
 */
tdm_status_t text_tokenizer_token_text(const text_tokenizer_t *tok, int32_t id,
                                       const char **text_out, size_t *n_bytes_out);

/* text_tokenizer_token_kind - *kind_out = the kind of `id`. TDM_ERR_INVALID_ARG if out of range.
 */
tdm_status_t text_tokenizer_token_kind(const text_tokenizer_t *tok, int32_t id,
                                       text_token_kind_t *kind_out);

/*
 * text_tokenizer_find_special - *id_out = the id of the added (CONTROL or USER_DEFINED) token
 * whose text is exactly `text` (NUL-terminated UTF-8), e.g. "<｜end▁of▁sentence｜>".
 * Returns TDM_OK, TDM_ERR_NOT_FOUND (no such added token; *id_out untouched) or
 * TDM_ERR_INVALID_ARG (NULL argument).
 */
tdm_status_t text_tokenizer_find_special(const text_tokenizer_t *tok, const char *text,
                                         int32_t *id_out);

/* ---- streaming, UTF-8-safe detokenization ---------------------------------------------------- */

/* A detokenizer for one output stream; opaque. */
typedef struct text_detok text_detok_t;

/* Flags of text_detok_create() and text_detok_decode(). */
typedef enum {
    TEXT_DETOK_SKIP_CONTROL = 1u << 0, /* CONTROL tokens produce no text */
} text_detok_flags_t;

/*
 * text_detok_create - a detokenizer over `tok` (borrowed; must outlive the detokenizer).
 * flags: text_detok_flags_t bits. Returns TDM_OK, TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY;
 * destroy with text_detok_destroy().
 */
tdm_status_t text_detok_create(const text_tokenizer_t *tok, uint32_t flags,
                               text_detok_t **detok_out);

/*
 * text_detok_push - append token `id` and return the text that is now complete: only whole,
 * valid UTF-8 characters (for a SentencePiece vocabulary with a space prefix, the first token
 * producing bytes loses one leading space, as SentencePiece decoding does). A character split
 * across tokens is held until its last byte arrives; bytes that can never start or continue a valid
 * character (RFC 3629: C0, C1, F5..FF, stray continuation bytes, overlongs, surrogates, > U+10FFFF)
 * become U+FFFD as soon as that is certain, one U+FFFD per maximal ill-formed subpart (Unicode 15,
 * section 3.9).
 *
 * *text_out (may be empty, *n_bytes_out == 0) points into the detokenizer and stays valid until
 * the next call on it. Returns TDM_OK or TDM_ERR_INVALID_ARG (id out of range: nothing changed).
 * No allocation once the internal buffer has grown to the longest token.
 */
tdm_status_t text_detok_push(text_detok_t *detok, int32_t id, const char **text_out,
                             size_t *n_bytes_out);

/*
 * text_detok_flush - end of stream: an incomplete character still held becomes U+FFFD.
 * Returns the remaining text like text_detok_push; the detokenizer is then empty (reusable).
 */
tdm_status_t text_detok_flush(text_detok_t *detok, const char **text_out, size_t *n_bytes_out);

/* text_detok_reset - drop any held bytes; the detokenizer starts a new stream. */
void text_detok_reset(text_detok_t *detok);

/* text_detok_destroy - free the detokenizer. Accepts NULL. */
void text_detok_destroy(text_detok_t *detok);

/*
 * text_detok_decode - the whole-sequence form: text of `n_ids` ids, exactly what pushing each
 * id and then flushing would produce (valid UTF-8, U+FFFD for ill-formed bytes), NUL-terminated.
 * *text_out: caller frees with free(); *n_bytes_out excludes the NUL. Returns TDM_OK,
 * TDM_ERR_INVALID_ARG (an id out of range, NULL argument) or TDM_ERR_NO_MEMORY; outputs untouched
 * on failure. Thread-safe.
 */
tdm_status_t text_detok_decode(const text_tokenizer_t *tok, const int32_t *ids, size_t n_ids,
                               uint32_t flags, char **text_out, size_t *n_bytes_out);

/*
 * TEXT_TOKENIZER_DSML - the text of DeepSeek-V4's DSML special token, "｜DSML｜" (U+FF5C bars, UTF-8
 * EF BD 9C; id 128825 in the release vocabulary, vocab - 26 in the synthetic one): the prefix of
 * every tool-call tag the model reads and writes (encoding_dsv4.py's dsml_token). The prompt
 * renderer, the output parser, the constraint compiler and the token masks all spell it from here.
 */
#define TEXT_TOKENIZER_DSML "\xEF\xBD\x9C" "DSML" "\xEF\xBD\x9C"

/* ---- DeepSeek chat encoding ------------------------------------------------------------------ */

/* Message roles. */
typedef enum {
    TEXT_CHAT_SYSTEM = 0,
    TEXT_CHAT_USER = 1,
    TEXT_CHAT_ASSISTANT = 2,
    TEXT_CHAT_TOOL = 3, /* a tool result */
} text_chat_role_t;

/*
 * One tool call of an assistant message (an OpenAI "tool_calls" item; plain data, strings
 * borrowed, UTF-8, not necessarily NUL-ended). DSV4 renders it as a DSML invoke block
 * (docs/TOKENIZER.md); DSV3.1 does not render tool calls.
 */
typedef struct {
    const char *id; /* "id": orders the tool results that answer it (encoding_dsv4.py
                       sort_tool_results_by_call_order); not rendered; NULL when none */
    size_t id_bytes;
    const char *name; /* function.name, rendered as is inside name="..." */
    size_t name_bytes;
    const char *arguments; /* function.arguments: JSON text of an object (key order kept);
                              text that is not JSON renders as one string parameter named
                              "arguments", as the encoder does; JSON that is not an object is
                              TDM_ERR_INVALID_ARG */
    size_t arguments_bytes;
} text_chat_tool_call_t;

/* One chat message (plain data; the strings are borrowed, UTF-8, not necessarily NUL-ended).
 * Zero-initialise, then set what the message has. */
typedef struct {
    text_chat_role_t role;
    const char *content; /* may be NULL when content_bytes is 0 */
    size_t content_bytes;
    const char *reasoning; /* assistant reasoning_content (thinking mode); NULL when none */
    size_t reasoning_bytes;
    const text_chat_tool_call_t *tool_calls; /* ASSISTANT: [n_tool_calls], else none */
    size_t n_tool_calls;
    const char *tool_call_id; /* TOOL: the call this result answers; NULL when none */
    size_t tool_call_id_bytes;
} text_chat_message_t;

/* Which published DeepSeek conversation format to render. */
typedef enum {
    /* DeepSeek-V4 `encoding/encoding_dsv4.py` (the V4.1 model's format): tool results become
     * "<tool_result>...</tool_result>" blocks of a user turn. The default. */
    TEXT_CHAT_FORMAT_DSV4 = 0,
    /* DeepSeek-V3.1 chat_template.jinja: tool results as
     * "<｜tool▁output▁begin｜>...<｜tool▁output▁end｜>". */
    TEXT_CHAT_FORMAT_DSV31 = 1,
} text_chat_format_t;

/* Flags of text_chat_params_t. */
typedef enum {
    /* End with "<｜Assistant｜>" and the thinking token when the last message is the user's
     * (DSV4: or a tool result). encoding_dsv4.py always does this; the template only when asked. */
    TEXT_CHAT_ADD_GENERATION_PROMPT = 1u << 0,
    /* Thinking mode: the generation prompt opens "<think>" instead of closing "</think>". */
    TEXT_CHAT_THINKING = 1u << 1,
    /* Do not start with "<｜begin▁of▁sentence｜>" (continuing an already encoded prefix). */
    TEXT_CHAT_NO_BOS = 1u << 2,
    /* DSV4 only: reasoning_effort "max" of encoding_dsv4.py. In thinking mode the release's
     * maximum-effort instruction ("Reasoning Effort: Absolute maximum ...") opens the prompt,
     * before the first message; in chat mode it changes nothing. ("high" renders like no
     * effort at all in that encoder, so it has no flag.) */
    TEXT_CHAT_REASONING_MAX = 1u << 3,
} text_chat_flags_t;

/* Chat rendering parameters; fill with text_chat_params_default() and override. */
typedef struct {
    text_chat_format_t format;
    uint32_t flags; /* text_chat_flags_t bits */
    /* The request's tools (DSV4 only; DSV3.1 refuses them): JSON text of an array of OpenAI
     * tools, [{"type": "function", "function": {"name", "description", "parameters", ...}}],
     * each function object rendered with Python json.dumps formatting in its own key order,
     * without "strict" and members whose value is null. Attached, as SGLang's DSV4 chat path
     * does, to the first message when it is a system message, else to an empty system message
     * put first. Borrowed; NULL (or "[]") when none. */
    const char *tools_json;
    size_t tools_json_bytes;
} text_chat_params_t;

/* text_chat_params_default - DSV4, TEXT_CHAT_ADD_GENERATION_PROMPT, chat (non-thinking), no
 * tools. */
void text_chat_params_default(text_chat_params_t *params);

/*
 * text_chat_render - the conversation as prompt text (NUL-terminated; caller frees with
 * free()). Returns TDM_OK, TDM_ERR_INVALID_ARG (unknown role/format/flags, NULL content with
 * content_bytes > 0, tool calls on a non-assistant message, tool calls or tools with DSV3.1,
 * tools_json not an array of {"type": "function", "function": {...}} objects, a call whose
 * arguments are JSON but not an object, NULL outputs; outputs untouched) or TDM_ERR_NO_MEMORY.
 * Thread-safe.
 */
tdm_status_t text_chat_render(const text_chat_params_t *params, const text_chat_message_t *messages,
                              size_t n_messages, char **text_out, size_t *n_bytes_out);

/*
 * text_chat_encode - the conversation as token ids. Each format marker is looked up as an
 * added token (text_tokenizer_find_special); message text is encoded without
 * TEXT_TOKENIZE_PARSE_SPECIAL, so special-token text inside content cannot inject markers.
 * The ids equal encoding the rendered text with PARSE_SPECIAL whenever the content holds no
 * special-token text. *ids_out: caller frees with text_tokens_free().
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (as text_chat_render), TDM_ERR_NOT_FOUND (a marker the
 * format needs is not an added token of `tok`; the marker's text is logged at error level), or
 * an text_tokenizer_encode error. Outputs untouched on failure. Thread-safe.
 */
tdm_status_t text_chat_encode(const text_tokenizer_t *tok, const text_chat_params_t *params,
                              const text_chat_message_t *messages, size_t n_messages,
                              int32_t **ids_out, size_t *n_ids_out);

/* ---- synthetic tokenizer for random checkpoints ---------------------------------------------- */

/*
 * text_tokenizer_synthetic_hf_text - the synthetic tokenizer.json for `vocab_size` as text
 * (NUL-terminated; caller frees with free()). Layout (docs/TOKENIZER.md): id 0 BOS
 * "<｜begin▁of▁sentence｜>", 1 EOS "<｜end▁of▁sentence｜>", 2 PAD "<｜▁pad▁｜>", 3..258 the 256
 * byte tokens in byte order, then merges (most frequent pairs of an embedded code-like corpus,
 * then enumerated 2- and 3-character strings), then the 24 DSML, chat, tool, FIM and task special
 * tokens (vocab_size-26 "｜DSML｜", vocab_size-25 "<｜User｜>", ...), then vocab_size-2
 * "<｜image｜>" and vocab_size-1 "<｜dspark▁noise｜>". Exactly vocab_size tokens; the same bytes
 * on every run and machine. Pre-tokenizer: DeepSeek-V3's Split sequence plus
 * ByteLevel. Returns TDM_OK, TDM_ERR_INVALID_ARG (vocab_size outside
 * TEXT_TOKENIZER_SYNTH_MIN_VOCAB .. TEXT_TOKENIZER_SYNTH_MAX_VOCAB) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t text_tokenizer_synthetic_hf_text(uint32_t vocab_size, char **json_out,
                                              size_t *n_bytes_out, char *err, size_t err_bytes);

/*
 * text_tokenizer_write_synthetic_hf - write text_tokenizer_synthetic_hf_text(vocab_size) to
 * `path` (via "<path>.tmp" and rename, so readers never see a partial file). Returns TDM_OK,
 * TDM_ERR_INVALID_ARG, TDM_ERR_IO (errno text in err) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t text_tokenizer_write_synthetic_hf(const char *path, uint32_t vocab_size, char *err,
                                               size_t err_bytes);

#endif
