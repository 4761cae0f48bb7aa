/* fit.c - context fit: error parsing, scale suggestion, the one hint; see fit.h. */
#include "bench/replay/fit.h"

#include "bench/replay/tokens.h"
#include "common/log.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIT_LOWER_BYTES 2048 /* of an error text searched */
#define FIT_MIN_SCALE   1e-4 /* --scale's floor (main.c) */
#define FIT_COUNT_BYTES 32

struct bench_fit {
    pthread_mutex_t lock;
    int exact;
    size_t n_sessions;
    double *ratio;           /* per trace session: server tokens per estimated token, 0: none */
    int64_t *ratio_estimate; /* per trace session: the estimate its ratio came from */
    int hinted;
    char hint[BENCH_FIT_HINT_BYTES];
};

/* The integer right after `anchor` in `text` (spaces and '(' skipped), or -1. */
static int64_t int_after(const char *text, const char *anchor, const char **end_out)
{
    const char *p = strstr(text, anchor);
    int64_t value = 0;
    int n_digits = 0;

    if (p == NULL) {
        return -1;
    }
    p += strlen(anchor);
    while (*p == ' ' || *p == '(') {
        p++;
    }
    while (isdigit((unsigned char)*p) && n_digits < 15) {
        value = value * 10 + (*p - '0');
        p++;
        n_digits++;
    }
    if (end_out != NULL) {
        *end_out = p;
    }
    return n_digits > 0 ? value : -1;
}

/* The first anchor of `anchors` (NULL-terminated) with an integer after it, or -1. */
static int64_t first_int_after(const char *text, const char *const *anchors)
{
    for (size_t i = 0; anchors[i] != NULL; i++) {
        int64_t value = int_after(text, anchors[i], NULL);
        if (value >= 0) {
            return value;
        }
    }
    return -1;
}

int bench_fit_parse_error(const char *text, int64_t *prompt_tokens_out, int64_t *max_out)
{
    static const char *const max_anchors[] = {"maximum context length is", "maximum context is",
                                              "maximum context of", "largest decode worker holds",
                                              NULL};
    static const char *const prompt_anchors[] = {"prompt has", "the prompt (", "conversation is",
                                                 "cannot hold", NULL};
    char lower[FIT_LOWER_BYTES];
    size_t n = 0;
    int64_t prompt;
    const char *after = NULL;

    *prompt_tokens_out = -1;
    *max_out = -1;
    if (text == NULL) {
        return 0;
    }
    for (; text[n] != '\0' && n + 1 < sizeof(lower); n++) {
        lower[n] = (char)tolower((unsigned char)text[n]);
    }
    lower[n] = '\0';
    if (strstr(lower, "context_length_exceeded") == NULL &&
        strstr(lower, "maximum context") == NULL) {
        return 0;
    }
    *max_out = first_int_after(lower, max_anchors);
    prompt = first_int_after(lower, prompt_anchors);
    if (prompt < 0 && int_after(lower, "you requested", &after) >= 0) {
        /* vLLM: "you requested N tokens (P in the messages, K in the completion)" */
        prompt = int_after(lower, "you requested", NULL);
        if (after != NULL && strncmp(after, " tokens (", 9) == 0) {
            const char *end = NULL;
            int64_t in_messages = int_after(after, " tokens (", &end);
            if (in_messages >= 0 && end != NULL && strncmp(end, " in the messages", 16) == 0) {
                prompt = in_messages;
            }
        }
    }
    *prompt_tokens_out = prompt;
    return 1;
}

double bench_fit_suggest_scale(double scale, double needed_tokens, int64_t max_context)
{
    double x;
    double step;

    if (max_context <= 0 || !(needed_tokens > 0.0) || !(scale > 0.0)) {
        return -1.0;
    }
    x = scale * BENCH_FIT_MARGIN * (double)max_context / needed_tokens;
    x = x > 1.0 ? 1.0 : x;
    if (x >= 0.1) {
        /* the 1e-9 keeps 0.35 from flooring to 0.30 through binary rounding */
        x = floor(x * 20.0 + 1e-9) / 20.0;
    } else {
        step = pow(10.0, floor(log10(x)) - 1.0);
        x = floor(x / step + 1e-9) * step;
    }
    return x < FIT_MIN_SCALE ? -1.0 : x;
}

/* n with thousands separators: 17735 -> "17,735". */
static void format_count(int64_t n, char *out, size_t out_bytes)
{
    char digits[FIT_COUNT_BYTES];
    char grouped[FIT_COUNT_BYTES * 2];
    int n_digits = snprintf(digits, sizeof(digits), "%lld", (long long)(n < 0 ? -n : n));
    size_t g = 0;

    if (n < 0) {
        grouped[g++] = '-';
    }
    for (int i = 0; i < n_digits; i++) {
        if (i > 0 && (n_digits - i) % 3 == 0) {
            grouped[g++] = ',';
        }
        grouped[g++] = digits[i];
    }
    grouped[g] = '\0';
    snprintf(out, out_bytes, "%s", grouped);
}

void bench_fit_hint_format(const bench_fit_case_t *c, char *out, size_t out_bytes)
{
    char needed[FIT_COUNT_BYTES];
    char max[FIT_COUNT_BYTES];
    char longest[FIT_COUNT_BYTES];
    char server[FIT_COUNT_BYTES * 2];
    char note[FIT_COUNT_BYTES * 4] = "";
    double factor = c->longest_factor > 1.0 ? c->longest_factor : 1.0;
    double longest_tokens = (double)c->needed_tokens * factor;
    double suggest = bench_fit_suggest_scale(c->scale, longest_tokens, c->max_context);
    char advice[FIT_COUNT_BYTES * 4];

    format_count(c->needed_tokens, needed, sizeof(needed));
    if (c->max_context > 0) {
        format_count(c->max_context, max, sizeof(max));
        snprintf(server, sizeof(server), "the server takes %s", max);
    } else {
        snprintf(server, sizeof(server), "the server refused it as too long");
    }
    if (factor > 1.05) {
        format_count((int64_t)llround(longest_tokens), longest, sizeof(longest));
        snprintf(note, sizeof(note), " (the trace's longest turn needs about %s)", longest);
    }
    if (suggest > 0.0 && suggest < c->scale) {
        snprintf(advice, sizeof(advice), "use --scale %g or a larger preset", suggest);
    } else if (c->max_context > 0 && suggest < 0.0) {
        snprintf(advice, sizeof(advice), "use a larger preset (no --scale fits)");
    } else {
        /* the limit is unknown, or the numbers fit and the server still refused */
        snprintf(advice, sizeof(advice), "use a smaller --scale or a larger preset");
    }
    snprintf(out, out_bytes, "turn %zu of session %s needs %s tokens at --scale %g, %s%s: %s",
             c->turn_index + 1, c->session_id != NULL ? c->session_id : "?", needed, c->scale,
             server, note, advice);
}

void bench_fit_longest(const bench_trace_t *trace, double scale, size_t *session_out,
                       size_t *turn_out, int64_t *tokens_out)
{
    int64_t best = -1;

    *session_out = 0;
    *turn_out = 0;
    for (size_t s = 0; s < trace->n_sessions; s++) {
        const bench_session_t *session = &trace->sessions[s];
        for (size_t t = 0; t < session->n_turns; t++) {
            const bench_turn_t *turn = &session->turns[t];
            int64_t prompt = trace->format == BENCH_TRACE_MOONCAKE
                                 ? (int64_t)bench_tokens_scaled(turn->input_length, scale)
                                 : turn->input_length;
            int64_t tokens = prompt + (int64_t)bench_tokens_scaled(turn->output_length, scale);
            if (tokens > best) {
                best = tokens;
                *session_out = s;
                *turn_out = t;
            }
        }
    }
    *tokens_out = best;
}

tdm_status_t bench_fit_create(int exact, size_t n_sessions, bench_fit_t **fit_out)
{
    bench_fit_t *fit;

    if (n_sessions == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    fit = calloc(1, sizeof(*fit));
    if (fit == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    fit->ratio = calloc(n_sessions, sizeof(double));
    fit->ratio_estimate = calloc(n_sessions, sizeof(int64_t));
    if (fit->ratio == NULL || fit->ratio_estimate == NULL) {
        goto err_free_fit;
    }
    if (pthread_mutex_init(&fit->lock, NULL) != 0) {
        goto err_free_fit;
    }
    fit->exact = exact;
    fit->n_sessions = n_sessions;
    *fit_out = fit;
    return TDM_OK;

err_free_fit:
    free(fit->ratio_estimate);
    free(fit->ratio);
    free(fit);
    return TDM_ERR_NO_MEMORY;
}

void bench_fit_destroy(bench_fit_t *fit)
{
    if (fit == NULL) {
        return;
    }
    pthread_mutex_destroy(&fit->lock);
    free(fit->ratio_estimate);
    free(fit->ratio);
    free(fit);
}

void bench_fit_learn(bench_fit_t *fit, size_t session, int64_t estimate, int64_t server_tokens)
{
    if (fit->exact || session >= fit->n_sessions || estimate <= 0 || server_tokens <= 0) {
        return;
    }
    pthread_mutex_lock(&fit->lock);
    if (estimate >= fit->ratio_estimate[session]) {
        fit->ratio[session] = (double)server_tokens / (double)estimate;
        fit->ratio_estimate[session] = estimate;
    }
    pthread_mutex_unlock(&fit->lock);
}

int64_t bench_fit_tokens(bench_fit_t *fit, size_t session, int64_t estimate)
{
    int64_t tokens = -1;

    if (fit->exact) {
        return estimate;
    }
    if (session >= fit->n_sessions) {
        return -1;
    }
    pthread_mutex_lock(&fit->lock);
    if (fit->ratio[session] > 0.0) {
        tokens = (int64_t)ceil((double)estimate * fit->ratio[session]);
    }
    pthread_mutex_unlock(&fit->lock);
    return tokens;
}

int bench_fit_offer(bench_fit_t *fit, const bench_fit_case_t *c)
{
    int first;

    pthread_mutex_lock(&fit->lock);
    first = !fit->hinted;
    if (first) {
        fit->hinted = 1;
        bench_fit_hint_format(c, fit->hint, sizeof(fit->hint));
    }
    pthread_mutex_unlock(&fit->lock);
    if (first) {
        tdm_log(TDM_LOG_WARN, "bench", "trace does not fit the server's context: %s", fit->hint);
    }
    return first;
}

void bench_fit_hint_copy(bench_fit_t *fit, char *out, size_t out_bytes)
{
    pthread_mutex_lock(&fit->lock);
    snprintf(out, out_bytes, "%s", fit->hint);
    pthread_mutex_unlock(&fit->lock);
}
