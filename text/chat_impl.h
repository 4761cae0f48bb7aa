/* chat_impl.h - private layout shared by text/chat.c, text/chat_dsv4.c and text/chat_json.c.
 *
 * A conversation is rendered as a list of segments, each either a format marker (a special
 * token such as "<｜User｜>" or "｜DSML｜", looked up as one id) or text. Text segments borrow
 * the caller's strings, literals, or buffers the segment list owns (freed by chat_segs_free).
 * Not part of the public API (text/tokenizer.h).
 */
#ifndef TANDEM_TEXT_CHAT_IMPL_H
#define TANDEM_TEXT_CHAT_IMPL_H

#include <jansson.h>
#include <stddef.h>

#include "common/buf.h"
#include "common/status.h"
#include "text/tokenizer.h"

/* DeepSeek-V4's DSML markup token (encoding_dsv4.py dsml_token; one special token, id 128825
 * in the released vocabulary). Fullwidth vertical bars U+FF5C around "DSML". */

/* One piece of the rendered conversation. */
typedef struct {
    int is_marker;
    const char *text;
    size_t n_bytes;
} chat_seg_t;

/* The segment list; zero-initialised is empty. The first failure sticks in `status` and later
 * appends are ignored, so renderers append freely and check once. */
typedef struct {
    chat_seg_t *items;
    size_t n, cap;
    char **owned; /* malloc'd buffers text segments point into */
    size_t n_owned, cap_owned;
    json_t **roots; /* parsed JSON whose strings text segments point into */
    size_t n_roots, cap_roots;
    tdm_status_t status;
} chat_segs_t;

/* Append a marker (NUL-terminated literal). */
void chat_seg_marker(chat_segs_t *s, const char *marker);
/* Append borrowed text (empty text appends nothing). */
void chat_seg_text(chat_segs_t *s, const char *text, size_t n_bytes);
/* Append a NUL-terminated literal as text. */
void chat_seg_literal(chat_segs_t *s, const char *literal);
/* Append a literal template, turning each "｜DSML｜", "<think>" and "</think>" in it into a
 * marker (the reference tokenizes them as their tokens). */
void chat_seg_template(chat_segs_t *s, const char *literal);
/* Append `buf` (malloc'd, n_bytes) as text and take ownership of it (freed even on failure). */
void chat_seg_owned(chat_segs_t *s, char *buf, size_t n_bytes);
/* Keep `root` (a reference the caller gives up) alive until chat_segs_free. */
void chat_seg_keep_json(chat_segs_t *s, json_t *root);
/* Free everything the list holds and zero it. */
void chat_segs_free(chat_segs_t *s);

/*
 * chat_render_dsv4 - append the DeepSeek-V4 rendering of the conversation to `out`
 * (text/chat_dsv4.c; arguments already checked by the caller). Failures go to out->status:
 * TDM_ERR_INVALID_ARG (params->tools_json or a tool call's arguments unusable), or
 * TDM_ERR_NO_MEMORY.
 */
void chat_render_dsv4(const text_chat_params_t *params, const text_chat_message_t *msgs,
                      size_t n_msgs, chat_segs_t *out);

/*
 * chat_json_dumps_py - append `value` to `out` exactly as Python's
 * json.dumps(value, ensure_ascii=False) writes it (text/chat_json.c): separators ", " and ": ",
 * object keys in their stored order, non-ASCII characters as they are, only '"', '\\' and
 * U+0000..U+001F escaped ("\n", "\r", "\t", "\b", "\f", else "\u00xx" in lower-case hex),
 * integers in decimal, reals as Python's float repr (shortest round-trip digits; positional
 * notation with ".0" when the decimal exponent is in [-4, 16), else "1e+16" style with at least
 * two exponent digits). Returns TDM_OK, TDM_ERR_INVALID_ARG (NaN or infinity, nesting over 64)
 * or TDM_ERR_NO_MEMORY.
 */
tdm_status_t chat_json_dumps_py(const json_t *value, tdm_buf_t *out);

#endif
