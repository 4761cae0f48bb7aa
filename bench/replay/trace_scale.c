/* trace_scale.c - --scale on SWE-agent chat text: every message's content cut to a fraction of
 * its characters; see trace.h. */
#include "bench/replay/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SCALE_BYTES_PER_TOKEN 4 /* as trace_swe.c's estimate (content bytes / 4) */

/* 1 when `byte` starts a UTF-8 character (not a 10xxxxxx continuation byte). */
static int starts_char(unsigned char byte)
{
    return (byte & 0xC0u) != 0x80u;
}

size_t bench_trace_text_chars(const char *text, size_t n_bytes)
{
    size_t n = 0;

    for (size_t i = 0; i < n_bytes; i++) {
        n += starts_char((unsigned char)text[i]);
    }
    return n;
}

size_t bench_trace_text_cut(const char *text, size_t n_bytes, double scale)
{
    size_t n_chars = bench_trace_text_chars(text, n_bytes);
    size_t keep;
    size_t seen = 0;

    if (n_chars == 0 || scale >= 1.0) {
        return n_bytes;
    }
    keep = (size_t)llround((double)n_chars * scale);
    keep = keep < 1 ? 1 : keep;
    for (size_t i = 0; i < n_bytes; i++) {
        if (starts_char((unsigned char)text[i])) {
            if (seen == keep) {
                return i;
            }
            seen++;
        }
    }
    return n_bytes;
}

/* Replaces the string `value` (a member `key` of `parent`) by its cut; 0 on success. */
static int cut_member(json_t *parent, const char *key, const json_t *value, double scale)
{
    size_t n_bytes = json_string_length(value);
    size_t n_keep = bench_trace_text_cut(json_string_value(value), n_bytes, scale);

    if (n_keep == n_bytes) {
        return 0;
    }
    return json_object_set_new(parent, key, json_stringn(json_string_value(value), n_keep));
}

/* Cuts one message's content (a string, or an array of parts with "text") and adds the bytes
 * kept to *bytes_out; 0 on success. */
static int cut_message(json_t *message, double scale, size_t *bytes_out)
{
    json_t *content = json_object_get(message, "content");
    size_t i;
    json_t *part;

    if (json_is_string(content)) {
        if (cut_member(message, "content", content, scale) != 0) {
            return -1;
        }
        content = json_object_get(message, "content");
        *bytes_out += json_string_length(content);
        return 0;
    }
    if (!json_is_array(content)) {
        return 0;
    }
    json_array_foreach(content, i, part)
    {
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(text)) {
            continue;
        }
        if (cut_member(part, "text", text, scale) != 0) {
            return -1;
        }
        text = json_object_get(part, "text");
        *bytes_out += json_string_length(text);
    }
    return 0;
}

tdm_status_t bench_trace_scale_text(bench_trace_t *trace, double scale)
{
    if (trace == NULL || !(scale > 0.0) || scale > 1.0) {
        return TDM_ERR_INVALID_ARG;
    }
    if (trace->format != BENCH_TRACE_SWE_AGENT || scale == 1.0) {
        return TDM_OK;
    }
    /* Each turn holds its own copy of the history before it; cutting every copy by the same pure
     * rule keeps a session's later turns an extension of its earlier ones. A copy that fails to
     * cut stays partly cut: the caller destroys the trace on error. */
    for (size_t s = 0; s < trace->n_sessions; s++) {
        bench_session_t *session = &trace->sessions[s];
        for (size_t t = 0; t < session->n_turns; t++) {
            bench_turn_t *turn = &session->turns[t];
            size_t bytes = 0;
            size_t m;
            json_t *message;
            json_array_foreach(turn->messages, m, message)
            {
                if (cut_message(message, scale, &bytes) != 0) {
                    return TDM_ERR_NO_MEMORY;
                }
            }
            turn->input_length = (int64_t)(bytes / SCALE_BYTES_PER_TOKEN) + 1;
        }
    }
    return TDM_OK;
}
