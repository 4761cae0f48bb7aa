/* fit.h - does a trace fit the server's context, and which flags would make it fit.
 *
 * A chat trace's token counts are the server's to make: the bench only estimates them (content
 * bytes / 4, trace.h), so it learns how many server tokens one estimated token is from the
 * server's own answers (usage.prompt_tokens of a served turn, the counts in a
 * context_length_exceeded error), per trace session: the text of one session (its turns, and
 * every replayed copy of it) tokenizes alike, another session's may not. Mooncake prompts are token
 * ids, so their counts are exact. When a turn does not fit, the run says so once, with the --scale
 * that would make the trace's longest turn fit, and the report names that cause instead of a bare
 * error rate. Owns the learned ratio and the hint; thread-safe (the agents of a level share one).
 * Knows nothing of HTTP.
 */
#ifndef TANDEM_BENCH_FIT_H
#define TANDEM_BENCH_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "bench/replay/trace.h"
#include "common/status.h"

#define BENCH_FIT_HINT_BYTES 512
/* A suggested scale aims at this fraction of the server's context: the chat template's markers,
 * the run tag and the estimate's error are not scaled with the text. */
#define BENCH_FIT_MARGIN 0.9

/* One turn that does not fit. Plain data; strings borrowed. */
typedef struct {
    const char *session_id; /* the trace's session id */
    size_t turn_index;      /* 0-based (printed 1-based) */
    int64_t needed_tokens;  /* prompt + reply tokens the turn needs at the run's scale */
    int64_t max_context;    /* the server's context, tokens; <= 0 when unknown */
    double scale;           /* the run's --scale, (0, 1] */
    double longest_factor;  /* the trace's longest turn over this one (>= 1; estimated) */
} bench_fit_case_t;

/*
 * bench_fit_parse_error - read a context-length refusal out of an error text (an HTTP error body
 * or the client's error line). Understands Tandem's router ("the prompt has N tokens; this
 * model's maximum context is M tokens", "the prompt (N tokens) plus max_tokens (K) exceeds this
 * model's maximum context of M tokens", "the conversation is N tokens; the largest decode worker
 * holds M", "the decode worker cannot hold N tokens") and vLLM ("This model's maximum context
 * length is M tokens. However, you requested N tokens (P in the messages, ...)").
 *
 * Returns 1 when `text` is such a refusal (it names context_length_exceeded or a maximum
 * context), else 0. *prompt_tokens_out gets N (vLLM: P when given, else N) and *max_out gets M,
 * each -1 when the text does not give it. Pure.
 */
int bench_fit_parse_error(const char *text, int64_t *prompt_tokens_out, int64_t *max_out);

/*
 * bench_fit_suggest_scale - the --scale to suggest when a turn needs `needed_tokens` at `scale`
 * and the server takes max_context: scale * BENCH_FIT_MARGIN * max_context / needed_tokens,
 * rounded down to a multiple of 0.05 (0.1 and above) or to two significant digits (below).
 * Returns -1 when max_context or needed_tokens is not positive, or the result is below 1e-4
 * (--scale's floor: no scale fits). Pure.
 */
double bench_fit_suggest_scale(double scale, double needed_tokens, int64_t max_context);

/*
 * bench_fit_hint_format - the hint for `c` into out (NUL-terminated, cut to out_bytes), e.g.
 * "turn 1 of session X needs 17,735 tokens, the server takes 8,192: use --scale 0.4 or a larger
 * preset". When longest_factor > 1 the scale is chosen for the longest turn and the text says
 * so. Without a known limit (max_context <= 0) it advises "a smaller --scale"; when even
 * --scale's floor is too large, only a larger preset. Pure.
 */
void bench_fit_hint_format(const bench_fit_case_t *c, char *out, size_t out_bytes);

/*
 * bench_fit_longest - the trace's longest turn at `scale`: estimated prompt tokens (Mooncake:
 * exact, round(input_length * scale); chat: the input_length estimate) plus the scaled reply.
 * Writes its session and turn index and its token count. trace must have a turn.
 */
void bench_fit_longest(const bench_trace_t *trace, double scale, size_t *session_out,
                       size_t *turn_out, int64_t *tokens_out);

typedef struct bench_fit bench_fit_t;

/*
 * bench_fit_create - a fit tracker for a trace of n_sessions sessions. exact: 1 when the bench's
 * prompt counts are the server's (Mooncake token ids), 0 when they are estimates to calibrate
 * (chat). Returns TDM_OK, TDM_ERR_INVALID_ARG (n_sessions 0) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t bench_fit_create(int exact, size_t n_sessions, bench_fit_t **fit_out);

/* bench_fit_destroy - free it; accepts NULL. */
void bench_fit_destroy(bench_fit_t *fit);

/*
 * bench_fit_learn - the server counted `server_tokens` for a prompt of trace session `session`
 * the bench estimated at `estimate` tokens. The session's ratio from its largest estimate seen
 * is kept (small prompts are mostly template). Ignored when exact, session out of range, or
 * either count is not positive.
 */
void bench_fit_learn(bench_fit_t *fit, size_t session, int64_t estimate, int64_t server_tokens);

/*
 * bench_fit_tokens - the server's count for a prompt of trace session `session` estimated at
 * `estimate`: the estimate when exact, ceil(estimate * the session's ratio) once the server has
 * counted one of its prompts, else -1 (unknown: send the turn and let the server decide).
 */
int64_t bench_fit_tokens(bench_fit_t *fit, size_t session, int64_t estimate);

/*
 * bench_fit_offer - decide whether `c` is the run's hint: the first call returns 1, formats the
 * hint (bench_fit_hint_format), keeps it and logs it at warn; every later call returns 0 and
 * changes nothing. The one-hint-per-run rule.
 */
int bench_fit_offer(bench_fit_t *fit, const bench_fit_case_t *c);

/* bench_fit_hint_copy - the kept hint ("" when none) into out (out_bytes > 0). */
void bench_fit_hint_copy(bench_fit_t *fit, char *out, size_t out_bytes);

#endif
