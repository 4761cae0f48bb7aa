/* gen_prompt.h - tandem-generate's three prompt sources turned into token ids.
 *
 * --prompt-ids "1,2,3" (or @FILE holding the list), --prompt TEXT (encoded with the checkpoint's
 * tokenizer.json, BOS prepended, special-token text parsed: a command-line user is trusted), and
 * --chat FILE.json (a JSON list of {"role", "content"[, "reasoning_content"]} messages, or an
 * object with such a "messages" list, rendered with the DeepSeek chat encoding of
 * text/tokenizer.h). Every id is checked against the model's vocabulary. Errors are written
 * into the caller's buffer as one line naming the flag; nothing is logged. Owns nothing after
 * return except the id arrays it hands out.
 */
#ifndef TANDEM_TOOLS_GEN_PROMPT_H
#define TANDEM_TOOLS_GEN_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "text/tokenizer.h"

/*
 * gen_prompt_parse_ids - parse "--prompt-ids" text: decimal ids separated by commas, spaces or
 * newlines; "@PATH" reads the list from a file. Each id must lie in [0, vocab).
 *
 * Returns TDM_OK with *ids_out (caller frees with free()) and *n_ids_out >= 1, or with outputs
 * untouched and err filled: TDM_ERR_INVALID_ARG (empty list, not a number, id out of range),
 * TDM_ERR_NOT_FOUND / TDM_ERR_IO (the @file), TDM_ERR_NO_MEMORY.
 */
tdm_status_t gen_prompt_parse_ids(const char *text, int64_t vocab, int32_t **ids_out,
                                  int64_t *n_ids_out, char *err, size_t err_bytes);

/*
 * gen_prompt_encode_text - the ids of a --prompt text: BOS (when the vocabulary has one), then
 * the text encoded with special-token parsing. An empty text is TDM_ERR_INVALID_ARG.
 * Outputs and errors as gen_prompt_parse_ids (ids freed with free()).
 */
tdm_status_t gen_prompt_encode_text(const text_tokenizer_t *tok, const char *text,
                                    int32_t **ids_out, int64_t *n_ids_out, char *err,
                                    size_t err_bytes);

/*
 * gen_prompt_encode_chat - the ids of a --chat file: messages rendered with the DSV4 chat
 * encoding and the generation prompt (chat_flags: text_chat_flags_t bits added to
 * TEXT_CHAT_ADD_GENERATION_PROMPT, e.g. TEXT_CHAT_THINKING). Roles: system, user,
 * assistant, tool. An empty list, a message without a string content or an unknown role is
 * TDM_ERR_INVALID_ARG; an unreadable file TDM_ERR_NOT_FOUND / TDM_ERR_IO; bad JSON
 * TDM_ERR_FORMAT. Outputs as gen_prompt_parse_ids (ids freed with free()).
 */
tdm_status_t gen_prompt_encode_chat(const text_tokenizer_t *tok, const char *path,
                                    uint32_t chat_flags, int32_t **ids_out, int64_t *n_ids_out,
                                    char *err, size_t err_bytes);

#endif
