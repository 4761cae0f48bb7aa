/* chat.c - DeepSeek conversation rendering: messages -> prompt text or token ids.
 *
 * A conversation is first rendered as a list of segments (text/chat_impl.h), each either a
 * format marker (a special token such as "<｜User｜>") or message text. text_chat_render
 * concatenates them; text_chat_encode looks each marker up as an added token and encodes the
 * text between markers without special-token parsing. The DeepSeek-V4 format (encoding_dsv4.py)
 * is rendered by text/chat_dsv4.c; this file holds the segment list, the DeepSeek-V3.1
 * chat_template.jinja format (as copied in llama.cpp models/templates) and the public entry
 * points. Sources: docs/TOKENIZER.md.
 */
#include "text/tokenizer.h"

#include "common/buf.h"
#include "common/log.h"
#include "text/chat_impl.h"
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#define ALL_CHAT_FLAGS                                                                             \
    ((uint32_t)(TEXT_CHAT_ADD_GENERATION_PROMPT | TEXT_CHAT_THINKING | TEXT_CHAT_NO_BOS |          \
                TEXT_CHAT_REASONING_MAX))

/* ---- segment list (chat_impl.h) -------------------------------------------------------------- */

static void append(chat_segs_t *s, int is_marker, const char *text, size_t n_bytes)
{
    if (s->status != TDM_OK || (!is_marker && n_bytes == 0)) {
        return;
    }
    if (s->n == s->cap) {
        chat_seg_t *items = tdm_array_grow(s->items, sizeof(*items), s->n + 1, 32, &s->cap);
        if (items == NULL) {
            s->status = TDM_ERR_NO_MEMORY;
            return;
        }
        s->items = items;
    }
    s->items[s->n++] = (chat_seg_t){is_marker, text, n_bytes};
}

void chat_seg_marker(chat_segs_t *s, const char *marker)
{
    append(s, 1, marker, strlen(marker));
}

void chat_seg_text(chat_segs_t *s, const char *t, size_t n_bytes)
{
    append(s, 0, t, n_bytes);
}

void chat_seg_literal(chat_segs_t *s, const char *t)
{
    append(s, 0, t, strlen(t));
}

void chat_seg_template(chat_segs_t *s, const char *t)
{
    static const char *const markers[] = {TEXT_TOKENIZER_DSML, TEXT_TOKENIZER_DS_THINK,
                                          TEXT_TOKENIZER_DS_END_THINK};
    const char *run = t;

    while (*t != '\0') {
        size_t k = 0;
        while (k < sizeof(markers) / sizeof(markers[0]) &&
               strncmp(t, markers[k], strlen(markers[k])) != 0) {
            k++;
        }
        if (k == sizeof(markers) / sizeof(markers[0])) {
            t++;
            continue;
        }
        chat_seg_text(s, run, (size_t)(t - run));
        chat_seg_marker(s, markers[k]);
        t += strlen(markers[k]);
        run = t;
    }
    chat_seg_text(s, run, (size_t)(t - run));
}

void chat_seg_owned(chat_segs_t *s, char *buf, size_t n_bytes)
{
    if (s->status == TDM_OK && s->n_owned == s->cap_owned) {
        char **owned = tdm_array_grow(s->owned, sizeof(*owned), s->n_owned + 1, 8, &s->cap_owned);
        if (owned == NULL) {
            s->status = TDM_ERR_NO_MEMORY;
        } else {
            s->owned = owned;
        }
    }
    if (s->status != TDM_OK) {
        free(buf);
        return;
    }
    s->owned[s->n_owned++] = buf;
    chat_seg_text(s, buf, n_bytes);
}

void chat_seg_keep_json(chat_segs_t *s, json_t *root)
{
    if (s->status == TDM_OK && s->n_roots == s->cap_roots) {
        json_t **roots = tdm_array_grow(s->roots, sizeof(*roots), s->n_roots + 1, 8, &s->cap_roots);
        if (roots == NULL) {
            s->status = TDM_ERR_NO_MEMORY;
        } else {
            s->roots = roots;
        }
    }
    if (s->status != TDM_OK) {
        json_decref(root);
        return;
    }
    s->roots[s->n_roots++] = root;
}

void chat_segs_free(chat_segs_t *s)
{
    for (size_t i = 0; i < s->n_owned; i++) {
        free(s->owned[i]);
    }
    for (size_t i = 0; i < s->n_roots; i++) {
        json_decref(s->roots[i]);
    }
    free(s->owned);
    free(s->roots);
    free(s->items);
    memset(s, 0, sizeof(*s));
}

static void marker(chat_segs_t *s, const char *t)
{
    chat_seg_marker(s, t);
}

static void text(chat_segs_t *s, const char *t, size_t n_bytes)
{
    chat_seg_text(s, t, n_bytes);
}

static void literal(chat_segs_t *s, const char *t)
{
    chat_seg_literal(s, t);
}

/* ---- DeepSeek-V3.1 (chat_template.jinja) ----------------------------------------------------- */

/* Text after the first "</think>" (the template's content.split('</think>', 1)[1]). */
static void after_think(const text_chat_message_t *m, const char **text_out, size_t *n_out)
{
    static const char end_think[] = TEXT_TOKENIZER_DS_END_THINK;
    size_t n_tag = sizeof(end_think) - 1;

    *text_out = m->content;
    *n_out = m->content_bytes;
    for (size_t i = 0; i + n_tag <= m->content_bytes; i++) {
        if (memcmp(m->content + i, end_think, n_tag) == 0) {
            *text_out = m->content + i + n_tag;
            *n_out = m->content_bytes - i - n_tag;
            return;
        }
    }
}

static void render_dsv31(const text_chat_params_t *params, const text_chat_message_t *msgs,
                         size_t n_msgs, chat_segs_t *out)
{
    int is_tool = 0, is_last_user = 0, first_system = 1;

    if ((params->flags & TEXT_CHAT_NO_BOS) == 0) {
        marker(out, TEXT_TOKENIZER_DS_BOS);
    }
    for (size_t i = 0; i < n_msgs; i++) {
        if (msgs[i].role == TEXT_CHAT_SYSTEM) {
            if (!first_system) {
                literal(out, "\n\n");
            }
            text(out, msgs[i].content, msgs[i].content_bytes);
            first_system = 0;
        }
    }
    for (size_t i = 0; i < n_msgs; i++) {
        const text_chat_message_t *m = &msgs[i];
        const char *content;
        size_t n_content;
        switch (m->role) {
        case TEXT_CHAT_SYSTEM:
            break;
        case TEXT_CHAT_USER:
            is_tool = 0;
            is_last_user = 1;
            marker(out, TEXT_TOKENIZER_DS_USER);
            text(out, m->content, m->content_bytes);
            break;
        case TEXT_CHAT_ASSISTANT:
            if (is_last_user) {
                marker(out, TEXT_TOKENIZER_DS_ASSISTANT);
                marker(out, TEXT_TOKENIZER_DS_END_THINK);
            }
            is_last_user = 0;
            if (is_tool) {
                text(out, m->content, m->content_bytes);
                is_tool = 0;
            } else {
                after_think(m, &content, &n_content);
                text(out, content, n_content);
            }
            marker(out, TEXT_TOKENIZER_DS_EOS);
            break;
        case TEXT_CHAT_TOOL:
            is_last_user = 0;
            is_tool = 1;
            marker(out, TEXT_TOKENIZER_DS_TOOL_OUTPUT_BEGIN);
            text(out, m->content, m->content_bytes);
            marker(out, TEXT_TOKENIZER_DS_TOOL_OUTPUT_END);
            break;
        }
    }
    if ((params->flags & TEXT_CHAT_ADD_GENERATION_PROMPT) != 0 && is_last_user && !is_tool) {
        marker(out, TEXT_TOKENIZER_DS_ASSISTANT);
        marker(out, (params->flags & TEXT_CHAT_THINKING) != 0 ? TEXT_TOKENIZER_DS_THINK
                                                              : TEXT_TOKENIZER_DS_END_THINK);
    }
}

/* ---- public ---------------------------------------------------------------------------------- */

void text_chat_params_default(text_chat_params_t *params)
{
    params->format = TEXT_CHAT_FORMAT_DSV4;
    params->flags = TEXT_CHAT_ADD_GENERATION_PROMPT;
    params->tools_json = NULL;
    params->tools_json_bytes = 0;
}

static tdm_status_t validate(const text_chat_params_t *params, const text_chat_message_t *messages,
                             size_t n_messages)
{
    if (params == NULL || (messages == NULL && n_messages > 0) ||
        (params->format != TEXT_CHAT_FORMAT_DSV4 && params->format != TEXT_CHAT_FORMAT_DSV31) ||
        (params->flags & ~ALL_CHAT_FLAGS) != 0 ||
        (params->tools_json == NULL && params->tools_json_bytes > 0) ||
        (params->format == TEXT_CHAT_FORMAT_DSV31 &&
         (params->tools_json_bytes > 0 || (params->flags & TEXT_CHAT_REASONING_MAX) != 0))) {
        return TDM_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n_messages; i++) {
        const text_chat_message_t *m = &messages[i];
        if ((m->role != TEXT_CHAT_SYSTEM && m->role != TEXT_CHAT_USER &&
             m->role != TEXT_CHAT_ASSISTANT && m->role != TEXT_CHAT_TOOL) ||
            (m->content == NULL && m->content_bytes > 0) ||
            (m->reasoning == NULL && m->reasoning_bytes > 0) ||
            (m->tool_call_id == NULL && m->tool_call_id_bytes > 0) ||
            (m->tool_calls == NULL && m->n_tool_calls > 0) ||
            (m->n_tool_calls > 0 &&
             (m->role != TEXT_CHAT_ASSISTANT || params->format != TEXT_CHAT_FORMAT_DSV4))) {
            return TDM_ERR_INVALID_ARG;
        }
        for (size_t k = 0; k < m->n_tool_calls; k++) {
            const text_chat_tool_call_t *c = &m->tool_calls[k];
            if ((c->id == NULL && c->id_bytes > 0) || (c->name == NULL && c->name_bytes > 0) ||
                (c->arguments == NULL && c->arguments_bytes > 0)) {
                return TDM_ERR_INVALID_ARG;
            }
        }
    }
    return TDM_OK;
}

static tdm_status_t render_segments(const text_chat_params_t *params,
                                    const text_chat_message_t *messages, size_t n_messages,
                                    chat_segs_t *out)
{
    tdm_status_t status = validate(params, messages, n_messages);

    memset(out, 0, sizeof(*out));
    if (status != TDM_OK) {
        return status;
    }
    if (params->format == TEXT_CHAT_FORMAT_DSV4) {
        chat_render_dsv4(params, messages, n_messages, out);
    } else {
        render_dsv31(params, messages, n_messages, out);
    }
    status = out->status;
    if (status != TDM_OK) {
        chat_segs_free(out);
    }
    return status;
}

tdm_status_t text_chat_render(const text_chat_params_t *params, const text_chat_message_t *messages,
                              size_t n_messages, char **text_out, size_t *n_bytes_out)
{
    chat_segs_t segs;
    size_t n = 0;
    char *buf;
    tdm_status_t status;

    if (text_out == NULL || n_bytes_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    status = render_segments(params, messages, n_messages, &segs);
    if (status != TDM_OK) {
        return status;
    }
    for (size_t i = 0; i < segs.n; i++) {
        n += segs.items[i].n_bytes;
    }
    buf = malloc(n + 1);
    if (buf == NULL) {
        chat_segs_free(&segs);
        return TDM_ERR_NO_MEMORY;
    }
    n = 0;
    for (size_t i = 0; i < segs.n; i++) {
        memcpy(buf + n, segs.items[i].text, segs.items[i].n_bytes);
        n += segs.items[i].n_bytes;
    }
    buf[n] = '\0';
    chat_segs_free(&segs);
    *text_out = buf;
    *n_bytes_out = n;
    return TDM_OK;
}

/* Append ids to (ids, n, cap). */
static tdm_status_t append_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *src,
                               size_t n_src)
{
    if (*n + n_src > *cap) {
        int32_t *p = tdm_array_grow(*ids, sizeof(*p), *n + n_src, 256, cap);
        if (p == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        *ids = p;
    }
    memcpy(*ids + *n, src, n_src * sizeof(*src));
    *n += n_src;
    return TDM_OK;
}

/* Encode the run of text segments [first, end) as one string, as if rendered together. */
static tdm_status_t encode_text_run(const text_tokenizer_t *tok, const chat_segs_t *segs,
                                    size_t first, size_t end, int32_t **ids, size_t *n, size_t *cap)
{
    size_t n_text = 0;
    char *buf;
    int32_t *run_ids = NULL;
    size_t n_run = 0;
    tdm_status_t status;

    for (size_t i = first; i < end; i++) {
        n_text += segs->items[i].n_bytes;
    }
    buf = malloc(n_text + 1);
    if (buf == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    n_text = 0;
    for (size_t i = first; i < end; i++) {
        memcpy(buf + n_text, segs->items[i].text, segs->items[i].n_bytes);
        n_text += segs->items[i].n_bytes;
    }
    status = text_tokenizer_encode(tok, buf, n_text, 0, &run_ids, &n_run);
    free(buf);
    if (status == TDM_OK) {
        status = append_ids(ids, n, cap, run_ids, n_run);
    }
    text_tokens_free(run_ids);
    return status;
}

tdm_status_t text_chat_encode(const text_tokenizer_t *tok, const text_chat_params_t *params,
                              const text_chat_message_t *messages, size_t n_messages,
                              int32_t **ids_out, size_t *n_ids_out)
{
    chat_segs_t segs;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0, i = 0;
    tdm_status_t status;

    if (tok == NULL || ids_out == NULL || n_ids_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    status = render_segments(params, messages, n_messages, &segs);
    while (status == TDM_OK && i < segs.n) {
        if (segs.items[i].is_marker) {
            int32_t id;
            status = text_tokenizer_find_special(tok, segs.items[i].text, &id);
            if (status == TDM_ERR_NOT_FOUND) {
                tdm_log(TDM_LOG_ERROR, "tokenizer",
                        "chat marker is not a token of this "
                        "vocabulary: marker=%s",
                        segs.items[i].text);
            }
            if (status == TDM_OK) {
                status = append_ids(&ids, &n, &cap, &id, 1);
            }
            i++;
        } else {
            size_t end = i;
            while (end < segs.n && !segs.items[end].is_marker) {
                end++;
            }
            status = encode_text_run(tok, &segs, i, end, &ids, &n, &cap);
            i = end;
        }
    }
    chat_segs_free(&segs);
    if (status != TDM_OK) {
        free(ids);
        return status;
    }
    *ids_out = ids;
    *n_ids_out = n;
    return TDM_OK;
}
