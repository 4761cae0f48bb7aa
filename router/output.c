#include "router/output.h"

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "text/agentout.h"
#include "text/tokenizer.h"

/* The DSML marker token's text (encoding_dsv4.py dsml_token) and the end of the reasoning. */
#define OUTPUT_DSML_TOKEN TEXT_TOKENIZER_DSML
#define OUTPUT_THINK_END "</think>"

/* One piece of a streaming chunk still to send (agent requests). */
typedef struct {
    text_agent_event_kind_t kind; /* REASONING, CONTENT, CALL_BEGIN (text: name), CALL_ARGS */
    uint32_t index;
    char id[TEXT_AGENT_CALL_ID_BYTES];
    tdm_buf_t text;
} output_seg_t;

/* One tool call of the whole response. */
typedef struct {
    char id[TEXT_AGENT_CALL_ID_BYTES];
    tdm_buf_t name;
    tdm_buf_t args;
} output_call_t;

struct router_output {
    const router_gen_request_t *gen;
    const router_openai_ctx_t *octx;
    uint32_t index;
    router_stream_t *stream;
    json_t *lp_entries; /* NULL when logprobs are off */
    size_t lp_sent;     /* entries already streamed */
    /* plain requests: text released since the last drain */
    tdm_buf_t delta;
    /* agent requests */
    text_agentout_t *parser; /* NULL for plain requests */
    output_seg_t *segs;      /* [n_segs] not yet drained */
    size_t n_segs;
    size_t cap_segs;
    tdm_buf_t content;   /* the whole response's content ... */
    tdm_buf_t reasoning; /* ... and reasoning */
    output_call_t *calls;
    size_t n_calls;
    size_t cap_calls;
    /* router_output_choice's objects */
    json_t *choice_logprobs;
    json_t *choice_message;
};

tdm_status_t router_output_create(const router_output_params_t *params,
                                  router_output_t **output_out)
{
    const router_gen_request_t *gen;
    router_stream_params_t sp;
    router_output_t *o;
    uint32_t flags = 0;
    int32_t keep[2];
    int n_keep = 0;
    tdm_status_t status;

    if (params == NULL || output_out == NULL || params->tok == NULL || params->gen == NULL ||
        params->octx == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    gen = params->gen;
    memset(&sp, 0, sizeof(sp));
    sp.tok = params->tok;
    sp.stop = (const char *const *)gen->stop;
    sp.stop_bytes = gen->stop_bytes;
    sp.n_stop = gen->n_stop;
    if (params->stop_id >= 0) {
        sp.stop_ids = &params->stop_id;
        sp.n_stop_ids = 1;
    }
    sp.max_tokens = gen->max_tokens;
    sp.min_tokens = gen->min_tokens;
    if (gen->api == ROUTER_API_CHAT) {
        if (gen->thinking) {
            flags |= TEXT_AGENT_THINKING;
        }
        if (gen->n_tools > 0 && gen->tool_choice != ROUTER_TOOL_CHOICE_NONE) {
            flags |= TEXT_AGENT_TOOLS;
        }
    }
    /* The markers the parser reads may be special tokens of the vocabulary ("｜DSML｜" is one
       in DeepSeek's): keep their text, which the stream would otherwise drop. */
    if ((flags & TEXT_AGENT_TOOLS) != 0 &&
        text_tokenizer_find_special(params->tok, OUTPUT_DSML_TOKEN, &keep[n_keep]) == TDM_OK) {
        n_keep++;
    }
    if ((flags & TEXT_AGENT_THINKING) != 0 &&
        text_tokenizer_find_special(params->tok, OUTPUT_THINK_END, &keep[n_keep]) == TDM_OK) {
        n_keep++;
    }
    sp.keep_ids = keep;
    sp.n_keep_ids = n_keep;
    o = calloc(1, sizeof(*o));
    if (o == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    o->gen = gen;
    o->octx = params->octx;
    o->index = params->index;
    status = router_stream_create(&sp, &o->stream);
    if (status == TDM_OK && flags != 0) {
        status = text_agentout_create(flags, params->call_id_seed, &o->parser);
    }
    if (status == TDM_OK && gen->n_logprobs >= 0) {
        o->lp_entries = json_array();
        status = o->lp_entries != NULL ? TDM_OK : TDM_ERR_NO_MEMORY;
    }
    if (status != TDM_OK) {
        router_output_destroy(o);
        return status;
    }
    *output_out = o;
    return TDM_OK;
}

static void clear_segs(router_output_t *o)
{
    for (size_t i = 0; i < o->n_segs; i++) {
        tdm_buf_fini(&o->segs[i].text);
    }
    o->n_segs = 0;
}

void router_output_destroy(router_output_t *output)
{
    if (output == NULL) {
        return;
    }
    router_stream_destroy(output->stream);
    json_decref(output->lp_entries);
    tdm_buf_fini(&output->delta);
    text_agentout_destroy(output->parser);
    clear_segs(output);
    free(output->segs);
    tdm_buf_fini(&output->content);
    tdm_buf_fini(&output->reasoning);
    for (size_t i = 0; i < output->n_calls; i++) {
        tdm_buf_fini(&output->calls[i].name);
        tdm_buf_fini(&output->calls[i].args);
    }
    free(output->calls);
    json_decref(output->choice_logprobs);
    json_decref(output->choice_message);
    free(output);
}

/* A new pending segment, or the last one when the event continues it (same text kind). */
static output_seg_t *seg_for(router_output_t *o, const text_agent_event_t *ev)
{
    output_seg_t *seg;

    if (o->n_segs > 0 && (ev->kind == TEXT_AGENT_REASONING || ev->kind == TEXT_AGENT_CONTENT) &&
        o->segs[o->n_segs - 1].kind == ev->kind) {
        return &o->segs[o->n_segs - 1];
    }
    if (o->n_segs == o->cap_segs) {
        void *grown = tdm_array_grow(o->segs, sizeof(*o->segs), o->n_segs + 1, 8, &o->cap_segs);
        if (grown == NULL) {
            return NULL;
        }
        o->segs = grown;
    }
    seg = &o->segs[o->n_segs++];
    memset(seg, 0, sizeof(*seg));
    seg->kind = ev->kind;
    seg->index = ev->index;
    if (ev->id != NULL) {
        memcpy(seg->id, ev->id, sizeof(seg->id));
    }
    return seg;
}

/* Record one parser event for the stream (a segment) and for the whole body. */
static tdm_status_t take_event(router_output_t *o, const text_agent_event_t *ev)
{
    output_seg_t *seg;
    output_call_t *call;
    tdm_buf_t *whole = NULL;

    if (ev->kind == TEXT_AGENT_CALL_END) {
        return TDM_OK;
    }
    seg = seg_for(o, ev);
    if (seg == NULL || tdm_buf_append(&seg->text, ev->text, ev->n_text) != TDM_OK) {
        return TDM_ERR_NO_MEMORY;
    }
    switch (ev->kind) {
    case TEXT_AGENT_REASONING:
        whole = &o->reasoning;
        break;
    case TEXT_AGENT_CONTENT:
        whole = &o->content;
        break;
    case TEXT_AGENT_CALL_BEGIN:
        if (o->n_calls == o->cap_calls) {
            void *grown =
                tdm_array_grow(o->calls, sizeof(*o->calls), o->n_calls + 1, 4, &o->cap_calls);
            if (grown == NULL) {
                return TDM_ERR_NO_MEMORY;
            }
            o->calls = grown;
        }
        call = &o->calls[o->n_calls++];
        memset(call, 0, sizeof(*call));
        memcpy(call->id, ev->id, sizeof(call->id));
        whole = &call->name;
        break;
    case TEXT_AGENT_CALL_ARGS:
        whole = &o->calls[ev->index].args;
        break;
    case TEXT_AGENT_CALL_END:
        break;
    }
    return tdm_buf_append(whole, ev->text, ev->n_text);
}

/* Released stream text: to the pending delta, or through the parser (final: the output ended). */
static tdm_status_t take_text(router_output_t *o, const char *text, size_t n, int final)
{
    const text_agent_event_t *ev;
    size_t n_ev;
    tdm_status_t status;

    if (o->parser == NULL) {
        return n > 0 ? tdm_buf_append(&o->delta, text, n) : TDM_OK;
    }
    status = text_agentout_push(o->parser, text, n, &ev, &n_ev);
    for (size_t i = 0; i < n_ev && status == TDM_OK; i++) {
        status = take_event(o, &ev[i]);
    }
    if (status == TDM_OK && final) {
        status = text_agentout_finish(o->parser, &ev, &n_ev);
        for (size_t i = 0; i < n_ev && status == TDM_OK; i++) {
            status = take_event(o, &ev[i]);
        }
    }
    return status;
}

tdm_status_t router_output_push(router_output_t *output, int32_t id, json_t *logprob_entry)
{
    router_output_t *o = output;
    const char *text;
    size_t n;
    tdm_status_t status;

    if (router_stream_state(o->stream) != ROUTER_STREAM_RUNNING) {
        json_decref(logprob_entry);
        return TDM_OK;
    }
    status = router_stream_push(o->stream, id, &text, &n);
    if (status != TDM_OK) {
        json_decref(logprob_entry);
        return status;
    }
    if (logprob_entry != NULL && o->lp_entries != NULL) {
        json_array_append(o->lp_entries, logprob_entry);
    }
    json_decref(logprob_entry);
    return take_text(o, text, n, router_stream_state(o->stream) != ROUTER_STREAM_RUNNING);
}

tdm_status_t router_output_finish(router_output_t *output, router_stream_state_t state_if_running)
{
    const char *text;
    size_t n;
    tdm_status_t status;

    if (router_stream_state(output->stream) != ROUTER_STREAM_RUNNING) {
        return TDM_OK;
    }
    status = router_stream_finish(output->stream, state_if_running, &text, &n);
    return status == TDM_OK ? take_text(output, text, n, 1) : status;
}

router_stream_state_t router_output_state(const router_output_t *output)
{
    return router_stream_state(output->stream);
}

uint32_t router_output_n_tokens(const router_output_t *output)
{
    return router_stream_n_tokens(output->stream);
}

const char *router_output_finish_reason(const router_output_t *output)
{
    int length = router_stream_state(output->stream) == ROUTER_STREAM_LENGTH;

    if (output->parser != NULL && text_agentout_n_calls(output->parser) > 0 &&
        !(length && text_agentout_unfinished(output->parser))) {
        return "tool_calls";
    }
    return length ? "length" : "stop";
}

/* Folded log-probabilities of the entries from `from` on (NULL when off); completions'
 * text_offset continues from the entries before `from`. */
static json_t *folded_logprobs(const router_output_t *o, size_t from)
{
    json_t *slice;
    json_t *folded;

    if (o->lp_entries == NULL) {
        return NULL;
    }
    slice = json_array();
    for (size_t i = from; i < json_array_size(o->lp_entries); i++) {
        json_array_append(slice, json_array_get(o->lp_entries, i));
    }
    folded = router_openai_logprobs_fold(o->gen->api, slice,
                                         router_openai_logprobs_text_bytes(o->lp_entries, from));
    json_decref(slice);
    return folded;
}

/* Entries not streamed yet (tokens whose text is held back or that gave none). */
static int lp_pending(const router_output_t *o)
{
    return o->lp_entries != NULL && o->lp_sent < json_array_size(o->lp_entries);
}

/* The delta object of one pending segment. NULL when out of memory. */
static json_t *seg_delta(const output_seg_t *seg)
{
    json_t *text = router_openai_string(seg->text.data, seg->text.n_bytes);

    switch (seg->kind) {
    case TEXT_AGENT_REASONING:
        return json_pack("{s:o}", "reasoning_content", text);
    case TEXT_AGENT_CONTENT:
        return json_pack("{s:o}", "content", text);
    case TEXT_AGENT_CALL_BEGIN:
        return json_pack("{s:[{s:i, s:s, s:s, s:{s:o, s:s}}]}", "tool_calls", "index",
                         (int)seg->index, "id", seg->id, "type", "function", "function", "name",
                         text, "arguments", "");
    default:
        return json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", (int)seg->index, "function",
                         "arguments", text);
    }
}

tdm_status_t router_output_drain(router_output_t *output, router_output_emit_fn_t emit, void *ctx)
{
    router_output_t *o = output;
    json_t *logprobs = NULL;
    int has_chunk = o->parser != NULL ? o->n_segs > 0 : o->delta.n_bytes > 0;
    tdm_status_t status = TDM_OK;

    if (!has_chunk) {
        return TDM_OK;
    }
    logprobs = folded_logprobs(o, o->lp_sent);
    o->lp_sent = o->lp_entries != NULL ? json_array_size(o->lp_entries) : 0;
    if (o->parser == NULL) {
        char *json = router_openai_chunk(o->octx, o->index, o->delta.data, o->delta.n_bytes, 0,
                                         NULL, logprobs);
        tdm_buf_reset(&o->delta);
        if (json == NULL) {
            status = TDM_ERR_NO_MEMORY;
        } else {
            emit(ctx, json);
        }
    }
    for (size_t i = 0; o->parser != NULL && i < o->n_segs && status == TDM_OK; i++) {
        json_t *delta = seg_delta(&o->segs[i]);
        char *json = delta != NULL ? router_openai_chunk_delta(o->octx, o->index, delta, NULL,
                                                               i == 0 ? logprobs : NULL)
                                   : NULL;
        if (json == NULL) {
            status = TDM_ERR_NO_MEMORY;
        } else {
            emit(ctx, json);
        }
    }
    clear_segs(o);
    json_decref(logprobs);
    return status;
}

char *router_output_final_chunk(router_output_t *output)
{
    /* the entries of tokens that released no text (a stop id, a CONTROL token, a token cut by a
       stop string) ride here, so the stream carries one entry per counted token */
    json_t *logprobs = lp_pending(output) ? folded_logprobs(output, output->lp_sent) : NULL;
    char *json;

    if (lp_pending(output) && logprobs == NULL) {
        return NULL;
    }
    json = router_openai_chunk(output->octx, output->index, "", 0, 0,
                               router_output_finish_reason(output), logprobs);
    if (json != NULL && output->lp_entries != NULL) {
        output->lp_sent = json_array_size(output->lp_entries);
    }
    json_decref(logprobs);
    return json;
}

/* message.tool_calls of the whole response. NULL when out of memory. */
static json_t *calls_json(const router_output_t *o)
{
    json_t *calls = json_array();

    for (size_t i = 0; calls != NULL && i < o->n_calls; i++) {
        const output_call_t *c = &o->calls[i];
        json_t *call =
            json_pack("{s:s, s:s, s:{s:o, s:o}}", "id", c->id, "type", "function", "function",
                      "name", router_openai_string(c->name.data, c->name.n_bytes), "arguments",
                      router_openai_string(c->args.data, c->args.n_bytes));
        if (call == NULL || json_array_append_new(calls, call) != 0) {
            json_decref(calls);
            return NULL;
        }
    }
    return calls;
}

tdm_status_t router_output_choice(router_output_t *output, router_openai_choice_t *choice_out)
{
    router_output_t *o = output;
    json_t *message = NULL;

    json_decref(o->choice_logprobs);
    json_decref(o->choice_message);
    o->choice_logprobs = folded_logprobs(o, 0);
    o->choice_message = NULL;
    memset(choice_out, 0, sizeof(*choice_out));
    choice_out->text = router_stream_text(o->stream, &choice_out->n_text);
    choice_out->finish_reason = router_output_finish_reason(o);
    choice_out->logprobs = o->choice_logprobs;
    if (o->lp_entries != NULL && o->choice_logprobs == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (o->parser == NULL) {
        return TDM_OK;
    }
    message = json_object();
    if (message != NULL) {
        json_object_set_new(message, "role", json_string("assistant"));
        json_object_set_new(message, "content",
                            o->n_calls > 0 && o->content.n_bytes == 0
                                ? json_null()
                                : router_openai_string(o->content.data, o->content.n_bytes));
        if (o->gen->thinking) {
            json_object_set_new(message, "reasoning_content",
                                router_openai_string(o->reasoning.data, o->reasoning.n_bytes));
        }
        if (o->n_calls > 0) {
            json_object_set_new(message, "tool_calls", calls_json(o));
        }
    }
    o->choice_message = message;
    choice_out->message = message;
    return message != NULL ? TDM_OK : TDM_ERR_NO_MEMORY;
}
