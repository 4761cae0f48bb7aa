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
#include "router/output.h"

#define TURN_ID_BYTES 64

/* The output of one choice ("n"; choice 0 alone for n = 1). */
typedef struct {
    router_output_t *output; /* stream, logprobs, agent output (router/output.h) */
    int finish_sent;         /* its finish chunk went out (streaming) */
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
    router_output_params_t op;
    router_turn_t *t;
    uint64_t seed;
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
    seed = tdm_hash_splitmix64(router_request_id(request) ^ router_request_t_start_ns(request));
    snprintf(t->id, sizeof(t->id), "%s-%016" PRIx64,
             t->gen->api == ROUTER_API_CHAT ? "chatcmpl" : "cmpl", seed);
    t->octx.api = t->gen->api;
    t->octx.id = t->id;
    t->octx.model = info->name;
    t->octx.created_s = (int64_t)time(NULL);
    t->n_choices = t->gen->n_choices > 1 ? t->gen->n_choices : 1;
    if (t->n_choices > PROTO_MAX_CHOICES) {
        free(t);
        return TDM_ERR_INVALID_ARG;
    }
    memset(&op, 0, sizeof(op));
    op.tok = router_model_tokenizer(model);
    op.gen = t->gen;
    op.octx = &t->octx;
    op.stop_id = !t->gen->ignore_eos && info->eos_id >= 0 ? info->eos_id : -1;
    for (uint32_t c = 0; c < t->n_choices; c++) {
        op.index = c;
        op.call_id_seed = tdm_hash_splitmix64(seed + c + 1); /* distinct call ids per choice */
        status = router_output_create(&op, &t->choices[c].output);
        if (status != TDM_OK) {
            for (uint32_t k = 0; k < c; k++) {
                router_output_destroy(t->choices[k].output);
            }
            free(t);
            return status;
        }
    }
    t->request = router_request_ref(request);
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
        router_output_destroy(turn->choices[c].output);
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

/* The log-probability entry of the batch's token i, or NULL when logprobs are off. */
static json_t *logprob_entry(const router_turn_t *t, size_t i)
{
    const router_request_batch_t *b = &t->batch;

    if (t->gen->n_logprobs < 0) {
        return NULL;
    }
    return router_openai_logprob_entry(
        t->gen->api, router_model_tokenizer(t->model), b->ids[i], b->logprobs[i],
        b->top_ids + i * ROUTER_REQUEST_MAX_TOP, b->top_logprobs + i * ROUTER_REQUEST_MAX_TOP,
        (size_t)(b->n_top[i] < t->gen->n_logprobs ? b->n_top[i] : t->gen->n_logprobs));
}

static int choice_running(const turn_choice_t *c)
{
    return router_output_state(c->output) == ROUTER_STREAM_RUNNING;
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
        n += router_output_n_tokens(t->choices[c].output);
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
        if (router_output_push(c->output, t->batch.ids[i], logprob_entry(t, i)) != TDM_OK) {
            fail_oom(t);
            break;
        }
        if (all_ended(t)) {
            t->ended = 1;
        }
    }
    if (!t->ended && t->batch.end == ROUTER_REQUEST_FINISHED) {
        router_stream_state_t state =
            t->batch.finish == ROUTER_FINISH_LENGTH ? ROUTER_STREAM_LENGTH : ROUTER_STREAM_STOP;
        for (uint32_t k = 0; k < t->n_choices && !t->failed; k++) {
            if (router_output_finish(t->choices[k].output, state) != TDM_OK) {
                fail_oom(t);
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

tdm_status_t router_turn_body(router_turn_t *turn, char **body_out, size_t *n_body_out,
                              int *status_out)
{
    router_turn_t *t = turn;
    router_openai_choice_t choices[PROTO_MAX_CHOICES];
    router_openai_usage_t usage;
    char *body = NULL;
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
        status = TDM_OK;
        for (uint32_t c = 0; c < t->n_choices && status == TDM_OK; c++) {
            status = router_output_choice(t->choices[c].output, &choices[c]);
        }
        usage_of(t, &usage);
        if (status == TDM_OK) {
            body = router_openai_response(&t->octx, choices, t->n_choices, &usage);
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

/* router_output_emit_fn_t: one chunk into the SSE output. */
static void emit_chunk(void *ctx, char *json)
{
    emit_event(ctx, json);
}

/* Produce the next events into the SSE output (blocking for tokens when none are pending). */
static void produce(router_turn_t *t)
{
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
        if (router_output_drain(c->output, emit_chunk, t) != TDM_OK) {
            fail_oom(t);
            break;
        }
        /* each choice's finish chunk as soon as it ends (all of them at the turn's end) */
        if (!c->finish_sent && (!choice_running(c) || t->ended)) {
            c->finish_sent = 1;
            emit_event(t, router_output_final_chunk(c->output));
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
