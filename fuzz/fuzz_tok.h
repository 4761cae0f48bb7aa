/* fuzz_tok.h - what the tokenizer harnesses (fuzz_tokenizer, fuzz_gguf) do with a vocabulary
 * that loaded: encode a fixed sample (plain, with special tokens parsed, with BOS), decode the
 * ids whole and streamed, and read every token's bytes, text and kind (header-only).
 */
#ifndef TANDEM_FUZZ_TOK_H
#define TANDEM_FUZZ_TOK_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

/* Tokens read back per loaded vocabulary (the rest are like them; keeps each input fast). */
#define FUZZ_TOK_MAX_IDS 4096u

/* Text the loaded vocabulary encodes: code, a special token, UTF-8 of several lengths, an
 * ill-formed byte. */
static const char fuzz_tok_sample[] =
    "<\xEF\xBD\x9C"
    "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>def fib(n):\n"
    "    return n if n < 2 else fib(n - 1) + fib(n - 2)  # \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 "
    "\xFF 123\t\r\n  ";

/* Stream the ids through a detokenizer (and flush); results are only read. */
static inline void fuzz_tok_stream(const text_tokenizer_t *tok, const int32_t *ids, size_t n)
{
    text_detok_t *detok = NULL;
    const char *text;
    size_t n_text;

    if (text_detok_create(tok, TEXT_DETOK_SKIP_CONTROL, &detok) != TDM_OK) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        (void)text_detok_push(detok, ids[i], &text, &n_text);
    }
    (void)text_detok_flush(detok, &text, &n_text);
    text_detok_destroy(detok);
}

/* fuzz_tok_exercise - everything above, on a tokenizer that loaded. */
static inline void fuzz_tok_exercise(const text_tokenizer_t *tok)
{
    static const uint32_t flag_sets[] = {0, TEXT_TOKENIZE_PARSE_SPECIAL,
                                         TEXT_TOKENIZE_PARSE_SPECIAL | TEXT_TOKENIZE_ADD_BOS};
    uint32_t n_vocab = text_tokenizer_n_vocab(tok);
    text_tokenizer_info_t info;

    text_tokenizer_get_info(tok, &info);
    for (size_t f = 0; f < sizeof(flag_sets) / sizeof(flag_sets[0]); f++) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        char *text = NULL;
        size_t n_text = 0;

        if (text_tokenizer_encode(tok, fuzz_tok_sample, sizeof(fuzz_tok_sample) - 1, flag_sets[f],
                                  &ids, &n_ids) != TDM_OK) {
            continue;
        }
        if (text_detok_decode(tok, ids, n_ids, 0, &text, &n_text) == TDM_OK) {
            free(text);
        }
        fuzz_tok_stream(tok, ids, n_ids);
        text_tokens_free(ids);
    }
    for (uint32_t id = 0; id < n_vocab && id < FUZZ_TOK_MAX_IDS; id++) {
        const uint8_t *bytes;
        const char *text;
        size_t n;
        text_token_kind_t kind;

        (void)text_tokenizer_token_bytes(tok, (int32_t)id, &bytes, &n);
        (void)text_tokenizer_token_text(tok, (int32_t)id, &text, &n);
        (void)text_tokenizer_token_kind(tok, (int32_t)id, &kind);
    }
}

#endif
