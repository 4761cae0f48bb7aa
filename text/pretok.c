/* pretok.c - the pre-tokenizer (regex splits through PCRE2), its llama.cpp presets, the
 * GPT-2 byte-to-unicode table and UTF-8 helpers.
 *
 * Split semantics follow Hugging Face tokenizers (pre_tokenizers/split.rs and
 * normalizer.rs SplitDelimiterBehavior): each step splits every current piece on its own (a
 * regex never sees past the piece), empty pieces are dropped. The presets are the regex lists of
 * llama.cpp src/llama-vocab.cpp (llm_tokenizer_bpe), matched here with PCRE2 in UTF + UCP mode.
 */
#include "text/tokenizer.h"

#include "common/buf.h"
#include "common/errbuf.h"
#include "common/log.h"
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* PCRE2 options of every pre-tokenizer regex: Unicode classes (\p{L}, \s, \w by property),
 * ill-formed UTF-8 never matches but never fails a match, `$` only at the end of the piece. */
#define PRETOK_PCRE2_OPTIONS                                                                       \
    (PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY)
/* A literal pattern (Hugging Face {"String": ...}) admits only the UTF options. */
#define PRETOK_PCRE2_LITERAL_OPTIONS (PCRE2_LITERAL | PCRE2_UTF | PCRE2_MATCH_INVALID_UTF)
/* Initial and largest JIT stack of one encode call, bytes. */
#define PRETOK_JIT_STACK_MIN_BYTES (32u * 1024u)
#define PRETOK_JIT_STACK_MAX_BYTES (8u * 1024u * 1024u)
/* Capture pairs in the match data (patterns may have groups; only pair 0 is read). */
#define PRETOK_OVECTOR_PAIRS 32

/* ---- byte-level table and UTF-8 -------------------------------------------------------------- */

static int byte_is_printable_latin1(uint32_t b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t text_tokenizer_byte_to_cp(uint8_t b)
{
    uint32_t n = 0;

    if (byte_is_printable_latin1(b)) {
        return b;
    }
    for (uint32_t i = 0; i < b; i++) {
        n += byte_is_printable_latin1(i) ? 0u : 1u;
    }
    return 256 + n;
}

int text_tokenizer_cp_to_byte(uint32_t cp)
{
    uint32_t n = 0;

    if (cp < 256) {
        return byte_is_printable_latin1(cp) ? (int)cp : -1;
    }
    if (cp >= 256 + 68) {
        return -1; /* 68 bytes are remapped: 0..32, 127..160, 173 */
    }
    for (uint32_t b = 0; b < 256; b++) {
        if (!byte_is_printable_latin1(b)) {
            if (n == cp - 256) {
                return (int)b;
            }
            n++;
        }
    }
    return -1;
}

size_t text_tokenizer_utf8_put(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

size_t text_tokenizer_utf8_next(const uint8_t *s, size_t n, uint32_t *cp_out)
{
    uint8_t b0;
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf;
    uint32_t cp;

    if (n == 0) {
        return 0;
    }
    b0 = s[0];
    if (b0 < 0x80) {
        *cp_out = b0;
        return 1;
    }
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        len = 2;
        cp = b0 & 0x1fu;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
        len = 3;
        cp = b0 & 0x0fu;
        lo = b0 == 0xe0 ? 0xa0 : 0x80;
        hi = b0 == 0xed ? 0x9f : 0xbf;
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
        len = 4;
        cp = b0 & 0x07u;
        lo = b0 == 0xf0 ? 0x90 : 0x80;
        hi = b0 == 0xf4 ? 0x8f : 0xbf;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi) {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (s[i] & 0x3fu);
    }
    *cp_out = cp;
    return len;
}

/* ---- steps ----------------------------------------------------------------------------------- */

/* GPT-2's pattern as Hugging Face ByteLevel(use_regex=true) applies it. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static tdm_status_t add_step(text_tokenizer_pretok_t *pretok, const char *pattern, size_t n_bytes,
                             uint32_t options, text_tokenizer_split_behavior_t behavior, int invert,
                             int add_prefix_space, char *err, size_t err_bytes)
{
    text_tokenizer_pretok_step_t *step;
    pcre2_code *code = NULL;

    if (pretok->n_steps == TEXT_TOKENIZER_MAX_PRETOK_STEPS) {
        tdm_errbuf_set(err, err_bytes, "more than %d pre-tokenizer steps",
                       TEXT_TOKENIZER_MAX_PRETOK_STEPS);
        return TDM_ERR_UNSUPPORTED;
    }
    if (pattern != NULL) {
        int error_code;
        PCRE2_SIZE error_offset;
        code =
            pcre2_compile((PCRE2_SPTR)pattern, n_bytes, options, &error_code, &error_offset, NULL);
        if (code == NULL) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(error_code, message, sizeof(message));
            tdm_errbuf_set(err, err_bytes, "bad regex at offset %zu: %s: \"%.*s\"",
                           (size_t)error_offset, (const char *)message,
                           n_bytes > 200 ? 200 : (int)n_bytes, pattern);
            return error_code == PCRE2_ERROR_NOMEMORY ? TDM_ERR_NO_MEMORY : TDM_ERR_FORMAT;
        }
        /* JIT is an optimisation only: without it (unsupported CPU) the interpreter runs. */
        (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    }
    step = &pretok->steps[pretok->n_steps++];
    step->code = code;
    step->behavior = behavior;
    step->invert = invert;
    step->add_prefix_space = add_prefix_space;
    return TDM_OK;
}

tdm_status_t text_tokenizer_pretok_add_split(text_tokenizer_pretok_t *pretok, const char *pattern,
                                             size_t n_bytes, int literal,
                                             text_tokenizer_split_behavior_t behavior, int invert,
                                             char *err, size_t err_bytes)
{
    return add_step(pretok, pattern, n_bytes,
                    literal ? PRETOK_PCRE2_LITERAL_OPTIONS : PRETOK_PCRE2_OPTIONS, behavior, invert,
                    0, err, err_bytes);
}

tdm_status_t text_tokenizer_pretok_add_byte_level(text_tokenizer_pretok_t *pretok,
                                                  int add_prefix_space, int use_regex, char *err,
                                                  size_t err_bytes)
{
    tdm_status_t status;

    status = add_step(pretok, use_regex ? gpt2_pattern : NULL, strlen(gpt2_pattern),
                      PRETOK_PCRE2_OPTIONS, TEXT_TOKENIZER_SPLIT_ISOLATED, 0, add_prefix_space, err,
                      err_bytes);
    if (status == TDM_OK) {
        pretok->has_byte_level = 1;
    }
    return status;
}

void text_tokenizer_pretok_fini(text_tokenizer_pretok_t *pretok)
{
    for (size_t i = 0; i < pretok->n_steps; i++) {
        pcre2_code_free(pretok->steps[i].code);
    }
    memset(pretok, 0, sizeof(*pretok));
}

/* ---- llama.cpp presets ----------------------------------------------------------------------- */

/* GPT-2's pattern without the final `\s+` alternative, as llama.cpp writes it (unmatched text
 * becomes its own piece, so the result is the same). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                  \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"     \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"     \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Cased letters of DeepSeek LLM's tokenizer.json, written as code points. */
#define RE_DEEPSEEK_LLM_LETTERS                                                                    \
    "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}"            \
    "\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}"         \
    "\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}" \
    "\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}"  \
    "\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}"                 \
    "\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}"                 \
    "\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}"         \
    "\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}"        \
    "\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}"                 \
    "\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}"         \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}"                   \
    "\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}"         \
    "\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}"                  \
    "\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}"                 \
    "\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}"                 \
    "\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}"           \
    "\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+"
#define RE_DEEPSEEK_LLM_PUNCT                                                                      \
    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+"
#define RE_DEEPSEEK_CJK    "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+"
#define RE_DEEPSEEK_V3_CJK "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+"
#define RE_DEEPSEEK_V3                                                                             \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"           \
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"    \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}|"                     \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_TEKKEN                                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"   \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{ff0c}\\x{3001}\\x{964}\\x{6d4}\\x{60c})]+"

/* One family of pre names sharing a regex list. */
typedef struct {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    int ignore_merges;
    const char *regexes[6]; /* NULL-terminated */
} pretok_preset_t;

static const pretok_preset_t presets[] = {
    {"default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2", 1, {RE_LLAMA3, NULL}},
    {"dbrx|smaug-bpe|glm4|chatglm-bpe", 0, {RE_LLAMA3, NULL}},
    {"deepseek-llm",
     0,
     {"[\\r\\n]", RE_DEEPSEEK_LLM_LETTERS, RE_DEEPSEEK_LLM_PUNCT, "\\s+$", RE_DEEPSEEK_CJK,
      "\\p{N}+"}},
    {"deepseek-coder",
     0,
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}", NULL}},
    {"deepseek-v3|hunyuan-dense", 0, {"\\p{N}{1,3}", RE_DEEPSEEK_V3_CJK, RE_DEEPSEEK_V3, NULL}},
    {"falcon", 0, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", 0, {"\\p{N}", RE_GPT2, NULL}},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v1-en|jina-v2-es|jina-v2-de|jina-v2-code|"
     "roberta-bpe|mpt|olmo|jais|trillion|exaone4|a.x-4.0|mellum",
     0,
     {RE_GPT2, NULL}},
    {"qwen2|deepseek-r1-qwen|kormo|stablelm2|megrez|hunyuan", 0, {RE_QWEN2, NULL}},
    {"tekken", 1, {RE_TEKKEN, NULL}},
    {"gpt-4o|llama4|minimax-m2", 0, {RE_GPT4O, NULL}},
    {"poro-chat|bloom|gpt3-finnish", 0, {RE_PORO, NULL}},
    {"viking", 0, {RE_PORO, "\\p{N}", NULL}},
};

static int name_in_list(const char *name, const char *list)
{
    size_t n = strlen(name);

    while (*list != '\0') {
        const char *bar = strchr(list, '|');
        size_t len = bar != NULL ? (size_t)(bar - list) : strlen(list);
        if (len == n && memcmp(list, name, n) == 0) {
            return 1;
        }
        list += len + (bar != NULL ? 1 : 0);
    }
    return 0;
}

tdm_status_t text_tokenizer_pretok_preset(text_tokenizer_pretok_t *pretok, const char *name,
                                          int *ignore_merges_out, char *err, size_t err_bytes)
{
    const pretok_preset_t *preset = &presets[0];
    tdm_status_t status = TDM_OK;

    if (name != NULL) {
        size_t i;
        for (i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
            if (name_in_list(name, presets[i].names)) {
                preset = &presets[i];
                break;
            }
        }
        if (i == sizeof(presets) / sizeof(presets[0])) {
            tdm_log(TDM_LOG_WARN, "tokenizer",
                    "unknown pre-tokenizer, using llama.cpp's default: pre=%s", name);
        }
    }
    for (size_t i = 0; i < 6 && preset->regexes[i] != NULL && status == TDM_OK; i++) {
        status =
            text_tokenizer_pretok_add_split(pretok, preset->regexes[i], strlen(preset->regexes[i]),
                                            0, TEXT_TOKENIZER_SPLIT_ISOLATED, 0, err, err_bytes);
    }
    if (status == TDM_OK) {
        pretok->has_byte_level = 1;
        *ignore_merges_out = preset->ignore_merges;
    }
    return status;
}

/* ---- running --------------------------------------------------------------------------------- */

tdm_status_t text_tokenizer_scratch_init(text_tokenizer_scratch_t *scratch)
{
    memset(scratch, 0, sizeof(*scratch));
    scratch->match_data = pcre2_match_data_create(PRETOK_OVECTOR_PAIRS, NULL);
    scratch->match_ctx = pcre2_match_context_create(NULL);
    scratch->jit_stack =
        pcre2_jit_stack_create(PRETOK_JIT_STACK_MIN_BYTES, PRETOK_JIT_STACK_MAX_BYTES, NULL);
    if (scratch->match_data == NULL || scratch->match_ctx == NULL) {
        text_tokenizer_scratch_fini(scratch);
        return TDM_ERR_NO_MEMORY;
    }
    if (scratch->jit_stack != NULL) {
        pcre2_jit_stack_assign(scratch->match_ctx, NULL, scratch->jit_stack);
    }
    return TDM_OK;
}

void text_tokenizer_scratch_fini(text_tokenizer_scratch_t *scratch)
{
    free(scratch->work);
    free(scratch->pieces);
    free(scratch->next);
    free(scratch->matches);
    pcre2_match_data_free(scratch->match_data);
    pcre2_match_context_free(scratch->match_ctx);
    pcre2_jit_stack_free(scratch->jit_stack);
    memset(scratch, 0, sizeof(*scratch));
}

static tdm_status_t grow(void **buf, size_t *cap, size_t need, size_t elem_bytes)
{
    void *p;

    if (need <= *cap) {
        return TDM_OK;
    }
    p = tdm_array_grow(*buf, elem_bytes, need, 64, cap);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *buf = p;
    return TDM_OK;
}

static tdm_status_t push_next(text_tokenizer_scratch_t *s, size_t offset, size_t n_bytes)
{
    tdm_status_t status;

    if (n_bytes == 0) {
        return TDM_OK;
    }
    status = grow((void **)&s->next, &s->cap_next, s->n_next + 1, sizeof(*s->next));
    if (status != TDM_OK) {
        return status;
    }
    s->next[s->n_next].offset = offset;
    s->next[s->n_next].n_bytes = n_bytes;
    s->n_next++;
    return TDM_OK;
}

/* Length of the character at s[0..n) for stepping past an empty match (1 if ill-formed). */
static size_t char_len(const uint8_t *s, size_t n)
{
    uint32_t cp;
    size_t len = text_tokenizer_utf8_next(s, n, &cp);

    return len == 0 ? 1 : len;
}

/* All matches of `code` in the piece, as [start, end) pairs relative to it. */
static tdm_status_t find_matches(const pcre2_code *code, const uint8_t *subject, size_t n,
                                 text_tokenizer_scratch_t *s)
{
    size_t start = 0;
    tdm_status_t status;

    s->n_matches = 0;
    while (start <= n) {
        PCRE2_SIZE *ov;
        int rc = pcre2_match(code, subject, n, start, 0, s->match_data, s->match_ctx);
        if (rc == PCRE2_ERROR_NOMATCH) {
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR message[128];
            pcre2_get_error_message(rc, message, sizeof(message));
            tdm_log(TDM_LOG_ERROR, "tokenizer",
                    "pre-tokenizer regex failed: rc=%d error=%s "
                    "piece_bytes=%zu",
                    rc, (const char *)message, n);
            return TDM_ERR_INTERNAL;
        }
        ov = pcre2_get_ovector_pointer(s->match_data);
        status =
            grow((void **)&s->matches, &s->cap_matches, s->n_matches * 2 + 2, sizeof(*s->matches));
        if (status != TDM_OK) {
            return status;
        }
        s->matches[s->n_matches * 2] = ov[0];
        s->matches[s->n_matches * 2 + 1] = ov[1];
        s->n_matches++;
        if (ov[1] > ov[0]) {
            start = ov[1];
        } else if (ov[1] < n) {
            start = ov[1] + char_len(subject + ov[1], n - ov[1]);
        } else {
            break;
        }
    }
    return TDM_OK;
}

/* The output piece split_piece holds back: [start, end) of the piece, and whether it came from a
 * match. */
typedef struct {
    size_t start;
    size_t end;
    int have;
    int is_match;
} pending_t;

/* Emit the pending piece, if any, and hold [a, b) in its place. */
static tdm_status_t pending_replace(pending_t *pend, text_tokenizer_scratch_t *s, size_t offset,
                                    size_t a, size_t b, int is_match)
{
    tdm_status_t status = TDM_OK;

    if (pend->have) {
        status = push_next(s, offset + pend->start, pend->end - pend->start);
    }
    pend->start = a;
    pend->end = b;
    pend->is_match = is_match;
    pend->have = 1;
    return status;
}

/* Split one piece by its matches according to the behaviour (Hugging Face semantics). */
static tdm_status_t split_piece(const text_tokenizer_pretok_step_t *step, size_t offset, size_t n,
                                text_tokenizer_scratch_t *s)
{
    size_t prev_end = 0;
    pending_t pend = {0, 0, 0, 0};
    tdm_status_t status = find_matches(step->code, s->work + offset, n, s);

    for (size_t i = 0; status == TDM_OK && i <= s->n_matches; i++) {
        /* Segments in order: the gap before match i (if any), then match i. */
        size_t seg[2][2];
        int seg_match[2], n_seg = 0;
        size_t m_start = i < s->n_matches ? s->matches[2 * i] : n;
        size_t m_end = i < s->n_matches ? s->matches[2 * i + 1] : n;
        if (m_start > prev_end) {
            seg[n_seg][0] = prev_end;
            seg[n_seg][1] = m_start;
            seg_match[n_seg++] = 0;
        }
        if (i < s->n_matches) {
            seg[n_seg][0] = m_start;
            seg[n_seg][1] = m_end;
            seg_match[n_seg++] = 1;
        }
        prev_end = m_end;
        for (int k = 0; k < n_seg && status == TDM_OK; k++) {
            int is_match = seg_match[k] != step->invert;
            size_t a = seg[k][0], b = seg[k][1];
            switch (step->behavior) {
            case TEXT_TOKENIZER_SPLIT_REMOVED:
                if (!is_match) {
                    status = push_next(s, offset + a, b - a);
                }
                break;
            case TEXT_TOKENIZER_SPLIT_ISOLATED:
                status = push_next(s, offset + a, b - a);
                break;
            case TEXT_TOKENIZER_SPLIT_MERGED_WITH_PREVIOUS:
                /* A match joins the piece before it unless that piece was a match. */
                if (is_match && pend.have && !pend.is_match) {
                    pend.end = b;
                    pend.is_match = 1;
                    break;
                }
                status = pending_replace(&pend, s, offset, a, b, is_match);
                break;
            case TEXT_TOKENIZER_SPLIT_MERGED_WITH_NEXT:
                /* A match joins the piece after it unless that piece is a match. */
                if (pend.have && pend.is_match && !is_match) {
                    pend.end = b;
                    pend.is_match = 0;
                    break;
                }
                status = pending_replace(&pend, s, offset, a, b, is_match);
                break;
            case TEXT_TOKENIZER_SPLIT_CONTIGUOUS:
                /* Runs of matches (and runs of non-matches) become one piece each. */
                if (pend.have && pend.is_match == is_match) {
                    pend.end = b;
                    break;
                }
                status = pending_replace(&pend, s, offset, a, b, is_match);
                break;
            }
        }
    }
    if (status == TDM_OK && pend.have) {
        status = push_next(s, offset + pend.start, pend.end - pend.start);
    }
    return status;
}

/* ByteLevel's prefix space: copy the piece after a ' ' at the end of the work buffer. */
static tdm_status_t prefix_space(text_tokenizer_scratch_t *s, text_tokenizer_piece_t *piece)
{
    size_t src = piece->offset;
    tdm_status_t status = grow((void **)&s->work, &s->cap_work, s->n_work + piece->n_bytes + 1, 1);

    if (status != TDM_OK) {
        return status;
    }
    s->work[s->n_work] = ' ';
    memcpy(s->work + s->n_work + 1, s->work + src, piece->n_bytes);
    piece->offset = s->n_work;
    piece->n_bytes += 1;
    s->n_work += piece->n_bytes;
    return TDM_OK;
}

tdm_status_t text_tokenizer_pretok_run(const text_tokenizer_pretok_t *pretok, const uint8_t *text,
                                       size_t n_bytes, text_tokenizer_scratch_t *scratch)
{
    text_tokenizer_scratch_t *s = scratch;
    tdm_status_t status = grow((void **)&s->work, &s->cap_work, n_bytes, 1);

    if (status == TDM_OK) {
        status = grow((void **)&s->pieces, &s->cap_pieces, 1, sizeof(*s->pieces));
    }
    if (status != TDM_OK) {
        return status;
    }
    memcpy(s->work, text, n_bytes);
    s->n_work = n_bytes;
    s->pieces[0].offset = 0;
    s->pieces[0].n_bytes = n_bytes;
    s->n_pieces = n_bytes > 0 ? 1 : 0;
    for (size_t k = 0; k < pretok->n_steps; k++) {
        const text_tokenizer_pretok_step_t *step = &pretok->steps[k];
        text_tokenizer_piece_t *swap;
        size_t swap_cap;
        s->n_next = 0;
        for (size_t i = 0; i < s->n_pieces && status == TDM_OK; i++) {
            text_tokenizer_piece_t piece = s->pieces[i];
            if (step->add_prefix_space && s->work[piece.offset] != ' ') {
                status = prefix_space(s, &piece);
            }
            if (status != TDM_OK) {
                break;
            }
            if (step->code == NULL) {
                status = push_next(s, piece.offset, piece.n_bytes);
            } else {
                status = split_piece(step, piece.offset, piece.n_bytes, s);
            }
        }
        if (status != TDM_OK) {
            return status;
        }
        swap = s->pieces;
        swap_cap = s->cap_pieces;
        s->pieces = s->next;
        s->cap_pieces = s->cap_next;
        s->n_pieces = s->n_next;
        s->next = swap;
        s->cap_next = swap_cap;
    }
    return TDM_OK;
}
