#include "router/turn.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/http_status.h"
#include "router/openai.h"
#include "router/stream.h"

#define TURN_ID_BYTES 64

/* The output of one choice ("n"; choice 0 alone for n = 1). */
typedef struct {
    router_stream_t *stream;
    json_t *lp_entries; /* NULL when logprobs are off */
    size_t lp_sent;     /* entries already streamed */
    tdm_buf_t delta;    /* text produced since the choice's last chunk */
    int finish_sent;    /* its finish chunk went out (streaming) */
} turn_choice_t;

struct router_turn {
    router_turn_params_t params;
    const router_model_t *model;
    router_control_t *control;
    router_metrics_t *metrics;
    router_request_t *request;       /* one reference */
    const router_gen_request_t *gen; /* the request's, borrowed */
    turn_choice_t choices[PROTO_MAX_CHOICES];
    uint32_t n_choices;
    router_request_batch_t batch;
    int batch_pending; /* batch holds events not yet absorbed */
    char id[TURN_ID_BYTES];
    char session[ROUTER_SESSION_ID_BYTES + 1];
    router_openai_ctx_t octx;
    int ended; /* every choice's output is complete (or the turn failed) */
    int failed;
    router_apierr_t error;
    int released;
    int counted; /* usage counted in metrics */
    /* server-sent events: out[off_out, n_bytes) not yet handed to the HTTP server */
    tdm_buf_t out;
    size_t off_out;
    int sse_started;
    int sse_done;
    uint64_t t_progress_ns; /* monotonic time of the last event */
    /* client watch (non-streamed waits) */
    router_turn_gone_fn_t gone;
    void *gone_ctx;
    int client_gone;
};

tdm_status_t router_turn_create(const router_turn_params_t *params, const router_model_t *model,
                                router_control_t *control, router_metrics_t *metrics,
                                router_request_t *request, router_turn_t **turn_out)
{
    const router_model_info_t *info;
    router_stream_params_t sp;
    router_turn_t *t;
    int32_t stop_ids[1];
    tdm_status_t status;

    if (params == NULL || model == NULL || control == NULL || metrics == NULL || request == NULL ||
        turn_out == NULL || params->timeout_ms == 0 || params->keepalive_ms == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    info = router_model_info(model);
    t->params = *params;
    t->model = model;
    t->control = control;
    t->metrics = metrics;
    t->gen = router_request_gen(request);
    memset(&sp, 0, sizeof(sp));
    sp.tok = router_model_tokenizer(model);
    sp.stop = (const char *const *)t->gen->stop;
    sp.stop_bytes = t->gen->stop_bytes;
    sp.n_stop = t->gen->n_stop;
    if (!t->gen->ignore_eos && info->eos_id >= 0) {
        stop_ids[0] = info->eos_id;
        sp.stop_ids = stop_ids;
        sp.n_stop_ids = 1;
    }
    sp.max_tokens = t->gen->max_tokens;
    sp.min_tokens = t->gen->min_tokens;
    t->n_choices = t->gen->n_choices > 1 ? t->gen->n_choices : 1;
    if (t->n_choices > PROTO_MAX_CHOICES) {
        free(t);
        return TDM_ERR_INVALID_ARG;
    }
    for (uint32_t c = 0; c < t->n_choices; c++) {
        status = router_stream_create(&sp, &t->choices[c].stream);
        if (status == TDM_OK && t->gen->n_logprobs >= 0) {
            t->choices[c].lp_entries = json_array();
            status = t->choices[c].lp_entries == NULL ? TDM_ERR_NO_MEMORY : TDM_OK;
        }
        if (status != TDM_OK) {
            for (uint32_t k = 0; k <= c; k++) {
                router_stream_destroy(t->choices[k].stream);
                json_decref(t->choices[k].lp_entries);
            }
            free(t);
            return status;
        }
    }
    t->request = router_request_ref(request);
    snprintf(t->id, sizeof(t->id), "%s-%016" PRIx64,
             t->gen->api == ROUTER_API_CHAT ? "chatcmpl" : "cmpl",
             tdm_hash_splitmix64(router_request_id(request) ^ router_request_t_start_ns(request)));
    t->octx.api = t->gen->api;
    t->octx.id = t->id;
    t->octx.model = info->name;
    t->octx.created_s = (int64_t)time(NULL);
    t->t_progress_ns = tdm_clock_now_ns();
    *turn_out = t;
    return TDM_OK;
}

static void release(router_turn_t *t, int client_gone)
{
    if (!t->released) {
        t->released = 1;
        router_control_release(t->control, t->request, client_gone);
    }
}

void router_turn_destroy(router_turn_t *turn)
{
    if (turn == NULL) {
        return;
    }
    release(turn, !turn->ended);
    router_request_unref(turn->request);
    router_request_batch_fini(&turn->batch);
    for (uint32_t c = 0; c < turn->n_choices; c++) {
        router_stream_destroy(turn->choices[c].stream);
        json_decref(turn->choices[c].lp_entries);
        tdm_buf_fini(&turn->choices[c].delta);
    }
    tdm_buf_fini(&turn->out);
    free(turn);
}

void router_turn_watch_client(router_turn_t *turn, router_turn_gone_fn_t gone, void *ctx)
{
    turn->gone = gone;
    turn->gone_ctx = ctx;
}

/* Whether the watched client has left; on the first yes, release the request as a client abort. */
static int client_left(router_turn_t *t)
{
    if (!t->client_gone && t->gone != NULL && t->gone(t->gone_ctx)) {
        t->client_gone = 1;
        release(t, 1);
    }
    return t->client_gone;
}

static void set_failed(router_turn_t *t, const router_apierr_t *err)
{
    t->failed = 1;
    t->ended = 1;
    t->error = *err;
}

static void fail_oom(router_turn_t *t)
{
    router_apierr_t err;

    router_apierr_set(&err, TDM_HTTP_INTERNAL, ROUTER_APIERR_SERVER, "internal_error", NULL,
                      "out of memory");
    set_failed(t, &err);
}

static void add_delta(router_turn_t *t, turn_choice_t *c, const char *text, size_t n)
{
    if (n == 0 || t->failed) {
        return;
    }
    if (tdm_buf_append(&c->delta, text, n) != TDM_OK) {
        fail_oom(t);
    }
}

static void add_logprob(router_turn_t *t, turn_choice_t *c, size_t i)
{
    const router_request_batch_t *b = &t->batch;
    json_t *entry;

    if (c->lp_entries == NULL) {
        return;
    }
    entry = router_openai_logprob_entry(
        t->gen->api, router_model_tokenizer(t->model), b->ids[i], b->logprobs[i],
        b->top_ids + i * ROUTER_REQUEST_MAX_TOP, b->top_logprobs + i * ROUTER_REQUEST_MAX_TOP,
        (size_t)(b->n_top[i] < t->gen->n_logprobs ? b->n_top[i] : t->gen->n_logprobs));
    if (entry != NULL) {
        json_array_append_new(c->lp_entries, entry);
    }
}

static int choice_running(const turn_choice_t *c)
{
    return router_stream_state(c->stream) == ROUTER_STREAM_RUNNING;
}

/* Every choice's output is complete. */
static int all_ended(const router_turn_t *t)
{
    for (uint32_t c = 0; c < t->n_choices; c++) {
        if (choice_running(&t->choices[c])) {
            return 0;
        }
    }
    return 1;
}

/* Completion tokens of every choice (usage). */
static uint64_t completion_tokens(const router_turn_t *t)
{
    uint64_t n = 0;

    for (uint32_t c = 0; c < t->n_choices; c++) {
        n += router_stream_n_tokens(t->choices[c].stream);
    }
    return n;
}

static void usage_of(router_turn_t *t, router_openai_usage_t *u)
{
    u->prompt_tokens = t->gen->n_prompt_ids;
    u->completion_tokens = completion_tokens(t);
    u->cached_tokens = router_request_cached_tokens(t->request);
}

/* Feed the pending batch into the output stream; note the end. */
static void absorb(router_turn_t *t)
{
    const char *text;
    size_t n;

    if (!t->batch_pending) {
        return;
    }
    t->batch_pending = 0;
    for (size_t i = 0; i < t->batch.n && !t->ended; i++) {
        /* a choice ended by a stop string ignores the rest the worker still sends for it */
        turn_choice_t *c = &t->choices[t->batch.choice[i] < t->n_choices ? t->batch.choice[i] : 0];
        if (!choice_running(c)) {
            continue;
        }
        if (router_stream_push(c->stream, t->batch.ids[i], &text, &n) != TDM_OK) {
            fail_oom(t);
            break;
        }
        add_logprob(t, c, i);
        add_delta(t, c, text, n);
        if (all_ended(t)) {
            t->ended = 1;
        }
    }
    if (!t->ended && t->batch.end == ROUTER_REQUEST_FINISHED) {
        router_stream_state_t state =
            t->batch.finish == ROUTER_FINISH_LENGTH ? ROUTER_STREAM_LENGTH : ROUTER_STREAM_STOP;
        for (uint32_t k = 0; k < t->n_choices && !t->failed; k++) {
            turn_choice_t *c = &t->choices[k];
            if (router_stream_finish(c->stream, state, &text, &n) != TDM_OK) {
                fail_oom(t);
            } else {
                add_delta(t, c, text, n);
            }
        }
        t->ended = 1;
    }
    if (!t->ended && t->batch.end == ROUTER_REQUEST_FAILED) {
        set_failed(t, &t->batch.error);
    }
    if (t->ended) {
        if (!t->failed && !t->counted) {
            t->counted = 1;
            router_metrics_count(t->metrics, ROUTER_METRIC_COMPLETION_TOKENS, completion_tokens(t));
        }
        release(t, 0);
    }
}

/*
 * Wait up to wait_ms for the next events, asking a watched client every ROUTER_TURN_WATCH_MS.
 * Returns TDM_OK (batch pending), TDM_ERR_TIMEOUT or TDM_ERR_PEER_LOST (the client left).
 */
static tdm_status_t take(router_turn_t *t, uint32_t wait_ms)
{
    uint64_t deadline_ns = tdm_clock_now_ns() + (uint64_t)wait_ms * TDM_NS_PER_MS;
    uint64_t until_ns;
    uint64_t now_ns;
    tdm_status_t status;

    for (;;) {
        if (client_left(t)) {
            return TDM_ERR_PEER_LOST;
        }
        until_ns = deadline_ns;
        if (t->gone != NULL) {
            now_ns = tdm_clock_now_ns();
            if (now_ns + (uint64_t)ROUTER_TURN_WATCH_MS * TDM_NS_PER_MS < deadline_ns) {
                until_ns = now_ns + (uint64_t)ROUTER_TURN_WATCH_MS * TDM_NS_PER_MS;
            }
        }
        status = router_request_take(t->request, until_ns, &t->batch);
        if (status != TDM_ERR_TIMEOUT || until_ns >= deadline_ns) {
            break;
        }
    }
    if (status == TDM_ERR_NO_MEMORY) {
        fail_oom(t);
        return TDM_OK;
    }
    if (status == TDM_OK) {
        t->batch_pending = 1;
        t->t_progress_ns = tdm_clock_now_ns();
    }
    return status;
}

static void fail_timeout(router_turn_t *t)
{
    router_apierr_t err;

    router_apierr_set(&err, TDM_HTTP_GATEWAY_TIMEOUT, ROUTER_APIERR_SERVER, "timeout", NULL,
                      "no token arrived within %u ms", t->params.timeout_ms);
    set_failed(t, &err);
}

tdm_status_t router_turn_wait_first(router_turn_t *turn, router_apierr_t *err_out)
{
    router_turn_t *t = turn;
    tdm_status_t status;

    status = take(t, t->params.timeout_ms);
    if (status == TDM_ERR_PEER_LOST) {
        return TDM_ERR_PEER_LOST;
    }
    if (status == TDM_ERR_TIMEOUT) {
        fail_timeout(t);
    }
    router_request_session(t->request, t->session, sizeof(t->session));
    if (!t->failed && t->batch.n == 0 && t->batch.end == ROUTER_REQUEST_FAILED) {
        t->batch_pending = 0;
        set_failed(t, &t->batch.error);
    }
    if (t->failed) {
        *err_out = t->error;
        release(t, 0);
        return t->error.http_status == TDM_HTTP_GATEWAY_TIMEOUT ? TDM_ERR_TIMEOUT
                                                                : TDM_ERR_UNSUPPORTED;
    }
    return TDM_OK;
}

const char *router_turn_session(const router_turn_t *turn)
{
    return turn->session;
}

static const char *finish_reason(const turn_choice_t *c)
{
    return router_stream_state(c->stream) == ROUTER_STREAM_LENGTH ? "length" : "stop";
}

static json_t *folded_logprobs(router_turn_t *t, const turn_choice_t *c, size_t from)
{
    json_t *slice;
    json_t *folded;

    if (c->lp_entries == NULL) {
        return NULL;
    }
    slice = json_array();
    for (size_t i = from; i < json_array_size(c->lp_entries); i++) {
        json_array_append(slice, json_array_get(c->lp_entries, i));
    }
    folded = router_openai_logprobs_fold(t->gen->api, slice);
    json_decref(slice);
    return folded;
}

tdm_status_t router_turn_body(router_turn_t *turn, char **body_out, size_t *n_body_out,
                              int *status_out)
{
    router_turn_t *t = turn;
    router_openai_choice_t choices[PROTO_MAX_CHOICES];
    json_t *logprobs[PROTO_MAX_CHOICES];
    router_openai_usage_t usage;
    char *body;
    tdm_status_t status;

    for (;;) {
        absorb(t);
        if (t->ended) {
            break;
        }
        status = take(t, t->params.timeout_ms);
        if (status == TDM_ERR_PEER_LOST) {
            return TDM_ERR_PEER_LOST;
        }
        if (status == TDM_ERR_TIMEOUT) {
            fail_timeout(t);
        }
    }
    if (t->failed) {
        router_metrics_error(t->metrics, t->error.code, t->error.http_status);
        body = router_apierr_json(&t->error);
        *status_out = t->error.http_status;
    } else {
        for (uint32_t c = 0; c < t->n_choices; c++) {
            choices[c].text = router_stream_text(t->choices[c].stream, &choices[c].n_text);
            choices[c].finish_reason = finish_reason(&t->choices[c]);
            logprobs[c] = folded_logprobs(t, &t->choices[c], 0);
            choices[c].logprobs = logprobs[c];
        }
        usage_of(t, &usage);
        body = router_openai_response(&t->octx, choices, t->n_choices, &usage);
        for (uint32_t c = 0; c < t->n_choices; c++) {
            json_decref(logprobs[c]);
        }
        *status_out = TDM_HTTP_OK;
    }
    if (body == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *body_out = body;
    *n_body_out = strlen(body);
    return TDM_OK;
}

/* Append "data: <json>\n\n" (or a raw line) to the SSE output; takes ownership of json. */
static void emit_event(router_turn_t *t, char *json)
{
    if (json == NULL || tdm_buf_printf(&t->out, "data: %s\n\n", json) != TDM_OK) {
        fail_oom(t);
    }
    free(json);
}

static void emit_raw(router_turn_t *t, const char *line)
{
    if (tdm_buf_append(&t->out, line, strlen(line)) != TDM_OK) {
        fail_oom(t);
    }
}

/* Produce the next events into the SSE output (blocking for tokens when none are pending). */
static void produce(router_turn_t *t)
{
    json_t *logprobs;
    router_openai_usage_t usage;

    if (!t->sse_started) {
        t->sse_started = 1;
        for (uint32_t c = 0; c < t->n_choices && t->gen->api == ROUTER_API_CHAT; c++) {
            emit_event(t, router_openai_chunk(&t->octx, c, "", 0, 1, NULL, NULL));
        }
    }
    if (!t->ended && !t->batch_pending) {
        if (take(t, t->params.keepalive_ms) == TDM_ERR_TIMEOUT) {
            if (tdm_clock_now_ns() - t->t_progress_ns <
                (uint64_t)t->params.timeout_ms * TDM_NS_PER_MS) {
                emit_raw(t, ": keep-alive\n\n");
                return;
            }
            fail_timeout(t);
        }
    }
    absorb(t);
    for (uint32_t k = 0; k < t->n_choices && !t->failed; k++) {
        turn_choice_t *c = &t->choices[k];
        if (c->delta.n_bytes > 0) {
            logprobs = folded_logprobs(t, c, c->lp_sent);
            c->lp_sent = c->lp_entries != NULL ? json_array_size(c->lp_entries) : 0;
            emit_event(t, router_openai_chunk(&t->octx, k, c->delta.data, c->delta.n_bytes, 0, NULL,
                                              logprobs));
            json_decref(logprobs);
            tdm_buf_reset(&c->delta);
        }
        /* each choice's finish chunk as soon as it ends (all of them at the turn's end) */
        if (!c->finish_sent && (!choice_running(c) || t->ended)) {
            c->finish_sent = 1;
            emit_event(t, router_openai_chunk(&t->octx, k, "", 0, 0, finish_reason(c), NULL));
        }
    }
    if (!t->ended) {
        return;
    }
    if (t->failed) {
        router_metrics_error(t->metrics, t->error.code, t->error.http_status);
        emit_event(t, router_apierr_json(&t->error));
    } else if (t->gen->include_usage) {
        usage_of(t, &usage);
        emit_event(t, router_openai_usage_chunk(&t->octx, &usage));
    }
    emit_raw(t, "data: [DONE]\n\n");
    t->sse_done = 1;
}

size_t router_turn_sse_read(router_turn_t *turn, char *buf, size_t max_bytes)
{
    router_turn_t *t = turn;
    size_t n;

    while (t->off_out == t->out.n_bytes && !t->sse_done) {
        t->off_out = 0;
        tdm_buf_reset(&t->out);
        produce(t);
    }
    n = t->out.n_bytes - t->off_out;
    if (n > max_bytes) {
        n = max_bytes;
    }
    if (n > 0) {
        memcpy(buf, t->out.data + t->off_out, n);
    }
    t->off_out += n;
    return n;
}
