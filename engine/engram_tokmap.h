/* engram_tokmap.h - the Engram token map of a real checkpoint, built from its tokenizer.
 *
 * MODEL.md 9.2 (real checkpoint, converter run once): every token id is decoded alone, its text
 * normalised (NFKC -> NFD -> strip accents -> lowercase -> runs of [ \t\r\n] to one space ->
 * protect a lone space -> strip -> restore it), and ids whose keys are equal share one compressed
 * id, numbered in order of first appearance. Owns nothing past a call. Uses utf8proc for the
 * Unicode steps and text/tokenizer.h for the vocabulary; knows nothing of files, hashing or
 * multipliers (engine/engram_hash.h). Random checkpoints use engine_engram_random_token_map()
 * instead. The reading of the reference's corner cases is in docs/CONVERT.md.
 */
#ifndef TANDEM_ENGINE_ENGRAM_TOKMAP_H
#define TANDEM_ENGINE_ENGRAM_TOKMAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"
#include "text/tokenizer.h"

/*
 * engine_engram_normalize - the MODEL.md 9.2 normaliser on n_bytes of valid UTF-8 (embedded NUL
 * allowed), as the reference's Hugging Face normalizers.Sequence: NFKC, NFD, drop every
 * General_Category Mark (Mn, Mc, Me; StripAccents), lowercase each code point (simple mapping;
 * after NFD and StripAccents it equals Rust's char::to_lowercase), runs of ' ', '\t', '\r', '\n'
 * to one ' ', a text that is exactly " " replaced by the sentinel U+E000, White_Space stripped
 * from both ends, then every U+E000 replaced by ' '.
 *
 * *norm_out: a new NUL-terminated string of *n_norm_out bytes (may be 0); caller frees with
 * free(). Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL output, text NULL with n_bytes > 0),
 * TDM_ERR_FORMAT (text not valid UTF-8) or TDM_ERR_NO_MEMORY; outputs untouched on failure.
 * Thread-safe.
 */
tdm_status_t engine_engram_normalize(const char *text, size_t n_bytes, char **norm_out,
                                     size_t *n_norm_out);

/*
 * engine_engram_token_map_build - token_map_out[id] for every id < cfg->vocab_size (MODEL.md
 * 9.2): for a tokenizer id, the key is the id decoded alone (text_detok_decode, no flags: raw,
 * special tokens kept, ill-formed bytes as U+FFFD); a decoding containing U+FFFD is keyed by the
 * raw token string (text_tokenizer_token_text), otherwise by its normalised text, or by the
 * decoding itself when that normalises to "" (the reference's `norm if norm else text`). Keys of
 * both kinds share one namespace; compressed ids are assigned in order of first appearance by
 * id. Ids at or past the tokenizer's vocabulary take token_map_out[engram_pad_token_id].
 *
 * tok: borrowed. token_map_out: [cfg->vocab_size] int32, written only on success.
 * *n_compressed_out: the number of distinct keys (the map's V_c; the converter requires it to
 * equal engram_compressed_vocab_size, 99092 for the release).
 * Returns TDM_OK, or with one line in err (err_bytes, may be 0) and the outputs untouched:
 * TDM_ERR_INVALID_ARG (NULL), TDM_ERR_MISMATCH (the tokenizer has more ids than vocab_size, or
 * the pad id is not a tokenizer id), TDM_ERR_FORMAT (a decoding that is not UTF-8),
 * TDM_ERR_NO_MEMORY. Thread-safe; allocates per call.
 */
tdm_status_t engine_engram_token_map_build(const text_tokenizer_t *tok, const engine_config_t *cfg,
                                           int32_t *token_map_out, int64_t *n_compressed_out,
                                           char *err, size_t err_bytes);

#endif
