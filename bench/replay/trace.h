/* trace.h - agent traces for tandem-bench: Mooncake JSONL and SWE-agent .traj, as sessions.
 *
 * Owns the parsed trace: sessions, each an ordered list of turns. A Mooncake turn is a token
 * count plus the hash ids of its 512-token blocks (prompt tokens are synthesised later, see
 * tokens.h); a SWE-agent turn is the recorded chat history up to one model reply. Sessions come
 * from `session_id` when the trace has it, else they are rebuilt from hash-id prefix chains.
 * Knows nothing of HTTP, timing or metrics.
 */
#ifndef TANDEM_BENCH_TRACE_H
#define TANDEM_BENCH_TRACE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Tokens per Mooncake hash block (the trace format's fixed block size). */
#define BENCH_TRACE_BLOCK_TOKENS 512

typedef enum {
    BENCH_TRACE_MOONCAKE = 0,  /* JSONL: timestamp, input_length, output_length, hash_ids */
    BENCH_TRACE_SWE_AGENT = 1, /* SWE-agent .traj JSON (one file, or a folder of them) */
} bench_trace_format_t;

/* One request of a session. Owned by its session. */
typedef struct {
    int64_t timestamp_ms;  /* arrival from trace start, or -1 when the trace has none */
    int64_t input_length;  /* prompt tokens as recorded (estimated for SWE-agent) */
    int64_t output_length; /* reply tokens as recorded (estimated for SWE-agent) */
    int64_t *hash_ids;     /* n_hash_ids ids of the prompt's 512-token blocks, or NULL */
    size_t n_hash_ids;
    int64_t delay_ms; /* pause after the previous turn ends (trace `delay`), or -1 */
    int64_t gap_ms;   /* timestamp minus the previous turn's timestamp, or -1 */
    size_t line;      /* 1-based source line (Mooncake), 0 for SWE-agent */
    json_t *messages; /* SWE-agent: chat messages to send (owned reference); else NULL */
} bench_turn_t;

/* One agent session: turns in order. Owned by its trace. */
typedef struct {
    char *id;            /* trace session_id, "r<line>" when rebuilt, or the .traj file name */
    bench_turn_t *turns; /* n_turns entries */
    size_t n_turns;
    long tag_message; /* SWE-agent: index of the message a per-run tag is prefixed to; else -1 */
} bench_session_t;

/* A parsed trace. Create with a bench_trace_load* function; free with bench_trace_destroy. */
typedef struct {
    bench_trace_format_t format;
    bench_session_t *sessions; /* in order of each session's first request */
    size_t n_sessions;
    size_t n_requests;
    size_t n_rebuilt_sessions; /* sessions built from hash-id prefix chains */
} bench_trace_t;

/*
 * bench_trace_parse_mooncake - parse Mooncake JSONL text (`n_bytes` at `text`, need not be
 * NUL-terminated) into *trace_out (caller frees with bench_trace_destroy).
 *
 * Each non-blank line is one JSON object: `input_length` (integer >= 1) and `output_length`
 * (integer >= 1) are required; `timestamp` (ms, >= 0), `hash_ids` (array of integers >= 0),
 * `session_id` (string or integer) and `delay` (ms, >= 0, the pause before this turn as AIPerf
 * writes it) are optional. Lines with a session_id are grouped by it in file order; the others
 * are rebuilt into sessions (bench_trace.c: a request whose hash_ids begin with all of the
 * latest turn's ids, or all but its last partial block, and whose input is longer, continues
 * that session, if the shared prefix holds a block first seen in that session).
 *
 * what: names the source in errors. On failure writes "what:LINE: reason" into err
 * (err_bytes may be 0) and returns TDM_ERR_FORMAT (bad JSON, missing or wrong-typed field,
 * value out of range, no requests) or TDM_ERR_NO_MEMORY; *trace_out is untouched.
 */
tdm_status_t bench_trace_parse_mooncake(const char *text, size_t n_bytes, const char *what,
                                        bench_trace_t **trace_out, char *err, size_t err_bytes);

/*
 * bench_trace_load_swe_agent - read one SWE-agent .traj file, or every *.traj file in a folder
 * (sorted by name), into *trace_out: one session per file, one turn per assistant message in
 * `history`, whose messages are the history before it (role and content; assistant
 * `tool_calls` and a tool message's first `tool_call_ids` entry as `tool_call_id` are kept).
 * Output length: the file's model_stats.tokens_received shared out by reply characters when
 * model_stats.api_calls equals the number of replies, else characters / 4 (at least 1). Input
 * length: message characters / 4 (an estimate; the server's usage counts are reported instead).
 *
 * Returns TDM_OK, TDM_ERR_NOT_FOUND (no such path, or no .traj in the folder), TDM_ERR_IO,
 * TDM_ERR_FORMAT (bad JSON, no history, no assistant reply) or TDM_ERR_NO_MEMORY, with the
 * reason in err.
 */
tdm_status_t bench_trace_load_swe_agent(const char *path, bench_trace_t **trace_out, char *err,
                                        size_t err_bytes);

/*
 * bench_trace_load - read the trace at `path` in `format` (see the two functions above).
 * Same errors as those, plus TDM_ERR_NOT_FOUND / TDM_ERR_IO when a Mooncake file is missing
 * or unreadable.
 */
tdm_status_t bench_trace_load(const char *path, bench_trace_format_t format,
                              bench_trace_t **trace_out, char *err, size_t err_bytes);

/*
 * bench_trace_format_parse - "mooncake" or "swe-agent" into *format_out; "auto" picks by path
 * (a folder or a name ending in .traj is swe-agent, anything else mooncake).
 * Returns TDM_OK or TDM_ERR_INVALID_ARG (*format_out untouched).
 */
tdm_status_t bench_trace_format_parse(const char *text, const char *path,
                                      bench_trace_format_t *format_out);

/* bench_trace_format_name - "mooncake" or "swe-agent". Static string. */
const char *bench_trace_format_name(bench_trace_format_t format);

/* bench_trace_text_chars - UTF-8 characters in n_bytes at `text` (bytes that do not continue a
 * character). Pure. */
size_t bench_trace_text_chars(const char *text, size_t n_bytes);

/*
 * bench_trace_text_cut - how many leading bytes of `text` (n_bytes, UTF-8) to keep for `scale`:
 * the first round(chars * scale) characters, at least one of a non-empty text, cut on a
 * character boundary (never inside a multi-byte sequence). scale >= 1 keeps everything. Pure:
 * the same text and scale always give the same cut, wherever the text appears.
 */
size_t bench_trace_text_cut(const char *text, size_t n_bytes, double scale);

/*
 * bench_trace_scale_text - apply --scale to the text of a SWE-agent trace, in place: the content
 * of every message of every turn (a string, or each "text" part of an array) is cut with
 * bench_trace_text_cut; roles, message order, assistant tool_calls (arguments untouched) and
 * tool_call_id stay. Every turn's copy of a message is cut by the same rule, so turn k's
 * messages are still a prefix of turn k+1's (prefix caching keeps hitting). Each turn's
 * input_length estimate is recomputed from the kept bytes (/ 4, as at load). Output lengths are
 * not changed here (the replay scales them). Mooncake traces and scale 1 are left as they are.
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (trace NULL or scale outside (0, 1]; nothing changed) or
 * TDM_ERR_NO_MEMORY (the trace is partly cut: destroy it).
 */
tdm_status_t bench_trace_scale_text(bench_trace_t *trace, double scale);

/* bench_trace_destroy - free the trace and everything in it; accepts NULL. */
void bench_trace_destroy(bench_trace_t *trace);

#endif
