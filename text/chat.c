/* chat.c - DeepSeek conversation rendering: messages -> prompt text or token ids.
 *
 * A conversation is first rendered as a list of segments, each either a format marker (a special
 * token such as "<｜User｜>") or message text. text_chat_render concatenates them;
 * text_chat_encode looks each marker up as an added token and encodes the text between markers
 * without special-token parsing. Sources (docs/TOKENIZER.md): DeepSeek-V4
 * encoding/encoding_dsv4.py (encode_messages, render_message, merge_tool_messages) and the
 * DeepSeek-V3.1 chat_template.jinja (as copied in llama.cpp models/templates).
 */
#include "text/tokenizer.h"

#include "common/buf.h"
#include "common/log.h"
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#define ALL_CHAT_FLAGS                                                                             \
    ((uint32_t)(TEXT_CHAT_ADD_GENERATION_PROMPT | TEXT_CHAT_THINKING | TEXT_CHAT_NO_BOS))

/* One piece of the rendered conversation; text is borrowed (a message or a literal). */
typedef struct {
    int is_marker;
    const char *text;
    size_t n_bytes;
} segment_t;

typedef struct {
    segment_t *items;
    size_t n, cap;
    tdm_status_t status; /* first failure; later appends are ignored */
} segments_t;

static void append(segments_t *s, int is_marker, const char *text, size_t n_bytes)
{
    if (s->status != TDM_OK || (!is_marker && n_bytes == 0)) {
        return;
    }
    if (s->n == s->cap) {
        segment_t *items = tdm_array_grow(s->items, sizeof(*items), s->n + 1, 32, &s->cap);
        if (items == NULL) {
            s->status = TDM_ERR_NO_MEMORY;
            return;
        }
        s->items = items;
    }
    s->items[s->n++] = (segment_t){is_marker, text, n_bytes};
}

static void marker(segments_t *s, const char *text)
{
    append(s, 1, text, strlen(text));
}

static void text(segments_t *s, const char *t, size_t n_bytes)
{
    append(s, 0, t, n_bytes);
}

static void literal(segments_t *s, const char *t)
{
    append(s, 0, t, strlen(t));
}

/* ---- DeepSeek-V4 (encoding_dsv4.py) ---------------------------------------------------------- */

/* A message after merge_tool_messages: tool results and user text fold into user turns. */
typedef struct {
    text_chat_role_t role;             /* SYSTEM, USER or ASSISTANT */
    const text_chat_message_t *source; /* SYSTEM/ASSISTANT: the message */
    size_t first_block, n_blocks;      /* USER: range of blocks (messages) */
} dsv4_turn_t;

static void render_dsv4(const text_chat_params_t *params, const text_chat_message_t *msgs,
                        size_t n_msgs, segments_t *out)
{
    dsv4_turn_t *turns = calloc(n_msgs > 0 ? n_msgs : 1, sizeof(*turns));
    const text_chat_message_t **blocks = calloc(n_msgs > 0 ? n_msgs : 1, sizeof(*blocks));
    int thinking = (params->flags & TEXT_CHAT_THINKING) != 0;
    size_t n_turns = 0, n_blocks = 0, last_user = SIZE_MAX;

    if (turns == NULL || blocks == NULL) {
        out->status = TDM_ERR_NO_MEMORY;
        free(turns);
        free(blocks);
        return;
    }
    /* merge_tool_messages: a tool result or user text joins a preceding user turn. */
    for (size_t i = 0; i < n_msgs; i++) {
        const text_chat_message_t *m = &msgs[i];
        if (m->role == TEXT_CHAT_USER || m->role == TEXT_CHAT_TOOL) {
            if (n_turns == 0 || turns[n_turns - 1].role != TEXT_CHAT_USER) {
                turns[n_turns++] = (dsv4_turn_t){TEXT_CHAT_USER, NULL, n_blocks, 0};
            }
            blocks[n_blocks++] = m;
            turns[n_turns - 1].n_blocks++;
        } else {
            turns[n_turns++] = (dsv4_turn_t){m->role, m, 0, 0};
        }
    }
    for (size_t t = 0; t < n_turns; t++) {
        if (turns[t].role == TEXT_CHAT_USER) {
            last_user = t;
        }
    }
    if ((params->flags & TEXT_CHAT_NO_BOS) == 0) {
        marker(out, TEXT_TOKENIZER_DS_BOS);
    }
    for (size_t t = 0; t < n_turns; t++) {
        const dsv4_turn_t *turn = &turns[t];
        int is_last = t + 1 == n_turns;
        if (turn->role == TEXT_CHAT_SYSTEM) {
            text(out, turn->source->content, turn->source->content_bytes);
        } else if (turn->role == TEXT_CHAT_USER) {
            marker(out, TEXT_TOKENIZER_DS_USER);
            for (size_t k = 0; k < turn->n_blocks; k++) {
                const text_chat_message_t *b = blocks[turn->first_block + k];
                if (k > 0) {
                    literal(out, "\n\n");
                }
                if (b->role == TEXT_CHAT_TOOL) {
                    literal(out, "<tool_result>");
                }
                text(out, b->content, b->content_bytes);
                if (b->role == TEXT_CHAT_TOOL) {
                    literal(out, "</tool_result>");
                }
            }
        } else {
            /* drop_thinking: reasoning is kept only after the last user turn. */
            if (thinking && (last_user == SIZE_MAX || t > last_user)) {
                text(out, turn->source->reasoning, turn->source->reasoning_bytes);
                marker(out, TEXT_TOKENIZER_DS_END_THINK);
            }
            text(out, turn->source->content, turn->source->content_bytes);
            marker(out, TEXT_TOKENIZER_DS_EOS);
        }
        /* Transition into the assistant: only when the next turn is the assistant's or this is
         * the last turn (then only if a generation prompt is wanted). */
        if (turn->role != TEXT_CHAT_USER) {
            continue;
        }
        if (is_last ? (params->flags & TEXT_CHAT_ADD_GENERATION_PROMPT) != 0
                    : turns[t + 1].role == TEXT_CHAT_ASSISTANT) {
            marker(out, TEXT_TOKENIZER_DS_ASSISTANT);
            marker(out, thinking && t >= last_user ? TEXT_TOKENIZER_DS_THINK
                                                   : TEXT_TOKENIZER_DS_END_THINK);
        }
    }
    free(turns);
    free(blocks);
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
                         size_t n_msgs, segments_t *out)
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
}

static tdm_status_t validate(const text_chat_params_t *params, const text_chat_message_t *messages,
                             size_t n_messages)
{
    if (params == NULL || (messages == NULL && n_messages > 0) ||
        (params->format != TEXT_CHAT_FORMAT_DSV4 && params->format != TEXT_CHAT_FORMAT_DSV31) ||
        (params->flags & ~ALL_CHAT_FLAGS) != 0) {
        return TDM_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n_messages; i++) {
        const text_chat_message_t *m = &messages[i];
        if ((m->role != TEXT_CHAT_SYSTEM && m->role != TEXT_CHAT_USER &&
             m->role != TEXT_CHAT_ASSISTANT && m->role != TEXT_CHAT_TOOL) ||
            (m->content == NULL && m->content_bytes > 0) ||
            (m->reasoning == NULL && m->reasoning_bytes > 0)) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    return TDM_OK;
}

static tdm_status_t render_segments(const text_chat_params_t *params,
                                    const text_chat_message_t *messages, size_t n_messages,
                                    segments_t *out)
{
    tdm_status_t status = validate(params, messages, n_messages);

    memset(out, 0, sizeof(*out));
    if (status != TDM_OK) {
        return status;
    }
    if (params->format == TEXT_CHAT_FORMAT_DSV4) {
        render_dsv4(params, messages, n_messages, out);
    } else {
        render_dsv31(params, messages, n_messages, out);
    }
    if (out->status != TDM_OK) {
        free(out->items);
        memset(out, 0, sizeof(*out));
        return TDM_ERR_NO_MEMORY;
    }
    return TDM_OK;
}

tdm_status_t text_chat_render(const text_chat_params_t *params, const text_chat_message_t *messages,
                              size_t n_messages, char **text_out, size_t *n_bytes_out)
{
    segments_t segs;
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
        free(segs.items);
        return TDM_ERR_NO_MEMORY;
    }
    n = 0;
    for (size_t i = 0; i < segs.n; i++) {
        memcpy(buf + n, segs.items[i].text, segs.items[i].n_bytes);
        n += segs.items[i].n_bytes;
    }
    buf[n] = '\0';
    free(segs.items);
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
static tdm_status_t encode_text_run(const text_tokenizer_t *tok, const segments_t *segs,
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
    segments_t segs;
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
    free(segs.items);
    if (status != TDM_OK) {
        free(ids);
        return status;
    }
    *ids_out = ids;
    *n_ids_out = n;
    return TDM_OK;
}
