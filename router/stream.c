#include "router/stream.h"

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "router/validate.h"

#define STREAM_MAX_STOP_IDS 64

struct router_stream {
    text_detok_t *detok;
    char *stop[ROUTER_MAX_STOP_STRINGS];
    size_t stop_bytes[ROUTER_MAX_STOP_STRINGS];
    int n_stop;
    int32_t stop_ids[STREAM_MAX_STOP_IDS];
    int n_stop_ids;
    const text_tokenizer_t *tok;
    int32_t keep_ids[ROUTER_STREAM_MAX_KEEP_IDS];
    int n_keep_ids;
    uint32_t max_tokens;
    uint32_t min_tokens;
    uint32_t n_tokens;
    router_stream_state_t state;
    tdm_buf_t text;   /* emitted and held text */
    size_t n_emitted; /* text[0, n_emitted) has been handed out */
};

tdm_status_t router_stream_create(const router_stream_params_t *params,
                                  router_stream_t **stream_out)
{
    router_stream_t *s;
    tdm_status_t status;

    if (params == NULL || stream_out == NULL || params->tok == NULL || params->max_tokens == 0 ||
        params->n_stop < 0 || params->n_stop > ROUTER_MAX_STOP_STRINGS || params->n_stop_ids < 0 ||
        params->n_stop_ids > STREAM_MAX_STOP_IDS || params->n_keep_ids < 0 ||
        params->n_keep_ids > ROUTER_STREAM_MAX_KEEP_IDS ||
        (params->n_keep_ids > 0 && params->keep_ids == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < params->n_stop; i++) {
        if (params->stop[i] == NULL || params->stop_bytes[i] == 0) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    /* With kept ids the stream skips the other CONTROL tokens itself (same text). */
    status = text_detok_create(params->tok, params->n_keep_ids > 0 ? 0 : TEXT_DETOK_SKIP_CONTROL,
                               &s->detok);
    if (status != TDM_OK) {
        free(s);
        return status;
    }
    if (tdm_buf_reserve(&s->text, 0) != TDM_OK) { /* text_out points into it from the start */
        router_stream_destroy(s);
        return TDM_ERR_NO_MEMORY;
    }
    for (int i = 0; i < params->n_stop; i++) {
        s->stop[i] = malloc(params->stop_bytes[i]);
        if (s->stop[i] == NULL) {
            router_stream_destroy(s);
            return TDM_ERR_NO_MEMORY;
        }
        memcpy(s->stop[i], params->stop[i], params->stop_bytes[i]);
        s->stop_bytes[i] = params->stop_bytes[i];
        s->n_stop++;
    }
    if (params->n_stop_ids > 0) {
        memcpy(s->stop_ids, params->stop_ids, (size_t)params->n_stop_ids * sizeof(int32_t));
    }
    s->n_stop_ids = params->n_stop_ids;
    s->tok = params->tok;
    if (params->n_keep_ids > 0) {
        memcpy(s->keep_ids, params->keep_ids, (size_t)params->n_keep_ids * sizeof(int32_t));
    }
    s->n_keep_ids = params->n_keep_ids;
    s->max_tokens = params->max_tokens;
    s->min_tokens = params->min_tokens;
    *stream_out = s;
    return TDM_OK;
}

void router_stream_destroy(router_stream_t *stream)
{
    if (stream == NULL) {
        return;
    }
    text_detok_destroy(stream->detok);
    for (int i = 0; i < stream->n_stop; i++) {
        free(stream->stop[i]);
    }
    tdm_buf_fini(&stream->text);
    free(stream);
}

/* Earliest start >= from of any stop string in text, or SIZE_MAX. */
static size_t find_stop(const router_stream_t *s, size_t from)
{
    size_t best = SIZE_MAX;

    for (int i = 0; i < s->n_stop; i++) {
        size_t n = s->stop_bytes[i];
        for (size_t at = from; at + n <= s->text.n_bytes && at < best; at++) {
            if (memcmp(s->text.data + at, s->stop[i], n) == 0) {
                best = at;
                break;
            }
        }
    }
    return best;
}

/* Bytes at the end of the unemitted text that are a proper prefix of some stop string. */
static size_t held_suffix(const router_stream_t *s)
{
    size_t pending = s->text.n_bytes - s->n_emitted;
    size_t hold = 0;

    for (int i = 0; i < s->n_stop; i++) {
        size_t k = s->stop_bytes[i] - 1 < pending ? s->stop_bytes[i] - 1 : pending;
        for (; k > hold; k--) {
            if (memcmp(s->text.data + s->text.n_bytes - k, s->stop[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}

/* Decide what of the new text may go out; `final`: the stream ends now, release everything. */
static void release(router_stream_t *s, int final, const char **text_out, size_t *n_bytes_out)
{
    size_t from = s->n_emitted;
    /* within the first min_tokens tokens no stop string counts and nothing is held */
    int may_stop = s->n_tokens > s->min_tokens;
    size_t stop_at = may_stop ? find_stop(s, s->n_emitted) : SIZE_MAX;
    size_t upto;

    if (stop_at != SIZE_MAX) {
        tdm_buf_truncate(&s->text, stop_at);
        s->state = ROUTER_STREAM_STOP;
        upto = s->text.n_bytes;
    } else if (final || !may_stop) {
        upto = s->text.n_bytes;
    } else {
        upto = s->text.n_bytes - held_suffix(s);
    }
    s->n_emitted = upto;
    *text_out = s->text.data + from;
    *n_bytes_out = upto - from;
}

static int is_stop_id(const router_stream_t *s, int32_t id)
{
    for (int i = 0; i < s->n_stop_ids; i++) {
        if (s->stop_ids[i] == id) {
            return 1;
        }
    }
    return 0;
}

/* With kept ids: a CONTROL token that is not kept gives no text (as TEXT_DETOK_SKIP_CONTROL). */
static int is_skipped(const router_stream_t *s, int32_t id)
{
    text_token_kind_t kind;

    if (s->n_keep_ids == 0 || text_tokenizer_token_kind(s->tok, id, &kind) != TDM_OK ||
        kind != TEXT_TOKEN_CONTROL) {
        return 0;
    }
    for (int i = 0; i < s->n_keep_ids; i++) {
        if (s->keep_ids[i] == id) {
            return 0;
        }
    }
    return 1;
}

static tdm_status_t flush_into_text(router_stream_t *s)
{
    const char *tail;
    size_t n_tail;
    tdm_status_t status = text_detok_flush(s->detok, &tail, &n_tail);

    if (status == TDM_OK && n_tail > 0) {
        status = tdm_buf_append(&s->text, tail, n_tail);
    }
    return status;
}

tdm_status_t router_stream_push(router_stream_t *stream, int32_t id, const char **text_out,
                                size_t *n_bytes_out)
{
    const char *piece;
    size_t n_piece;
    tdm_status_t status;

    *text_out = stream->text.data + stream->n_emitted;
    *n_bytes_out = 0;
    if (stream->state != ROUTER_STREAM_RUNNING) {
        return TDM_OK;
    }
    if (is_stop_id(stream, id) && stream->n_tokens >= stream->min_tokens) {
        stream->n_tokens++;
        status = flush_into_text(stream);
        if (status != TDM_OK) {
            return status;
        }
        release(stream, 1, text_out, n_bytes_out);
        stream->state = ROUTER_STREAM_STOP;
        return TDM_OK;
    }
    if (is_skipped(stream, id)) {
        piece = NULL;
        n_piece = 0;
    } else {
        status = text_detok_push(stream->detok, id, &piece, &n_piece);
        if (status != TDM_OK) {
            return status;
        }
    }
    stream->n_tokens++;
    status = tdm_buf_append(&stream->text, piece, n_piece);
    if (status == TDM_OK && stream->n_tokens >= stream->max_tokens) {
        status = flush_into_text(stream);
        if (status == TDM_OK) {
            release(stream, 1, text_out, n_bytes_out);
            if (stream->state == ROUTER_STREAM_RUNNING) {
                stream->state = ROUTER_STREAM_LENGTH;
            }
        }
        return status;
    }
    if (status == TDM_OK) {
        release(stream, 0, text_out, n_bytes_out);
    }
    return status;
}

tdm_status_t router_stream_finish(router_stream_t *stream, router_stream_state_t state_if_running,
                                  const char **text_out, size_t *n_bytes_out)
{
    tdm_status_t status;

    *text_out = stream->text.data + stream->n_emitted;
    *n_bytes_out = 0;
    if (stream->state != ROUTER_STREAM_RUNNING) {
        return TDM_OK;
    }
    status = flush_into_text(stream);
    if (status != TDM_OK) {
        return status;
    }
    release(stream, 1, text_out, n_bytes_out);
    if (stream->state == ROUTER_STREAM_RUNNING) {
        stream->state = state_if_running;
    }
    return TDM_OK;
}

router_stream_state_t router_stream_state(const router_stream_t *stream)
{
    return stream->state;
}

uint32_t router_stream_n_tokens(const router_stream_t *stream)
{
    return stream->n_tokens;
}

const char *router_stream_text(const router_stream_t *stream, size_t *n_bytes_out)
{
    *n_bytes_out = stream->n_emitted;
    return stream->text.data;
}
