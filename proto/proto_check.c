/* proto_check.c - structural checks of unpacked envelopes (proto_check in proto.h). */
#include "proto/proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/errbuf.h"

static tdm_status_t fail(char *err, size_t err_bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tdm_status_t fail(char *err, size_t err_bytes, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    tdm_errbuf_vset(err, err_bytes, fmt, ap);
    va_end(ap);
    return TDM_ERR_INVALID_ARG;
}

/* A NULL string is protobuf-c's empty string. */
static size_t str_bytes(const char *s)
{
    return s == NULL ? 0 : strlen(s);
}

static tdm_status_t check_id(const char *what, const char *id, int required, char *err,
                             size_t err_bytes)
{
    size_t n = str_bytes(id);

    if (required && n == 0) {
        return fail(err, err_bytes, "%s is empty", what);
    }
    if (n > PROTO_MAX_ID_BYTES) {
        return fail(err, err_bytes, "%s is %zu bytes, limit %u", what, n, PROTO_MAX_ID_BYTES);
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c <= 0x20 || c == 0x7f) {
            return fail(err, err_bytes, "%s holds a space or control byte at %zu", what, i);
        }
    }
    return TDM_OK;
}

static tdm_status_t check_text(const char *what, const char *text, char *err, size_t err_bytes)
{
    size_t n = str_bytes(text);

    if (n > PROTO_MAX_TEXT_BYTES) {
        return fail(err, err_bytes, "%s is %zu bytes, limit %u", what, n, PROTO_MAX_TEXT_BYTES);
    }
    return TDM_OK;
}

static tdm_status_t check_tokens(const char *what, const int32_t *ids, size_t n_ids, size_t limit,
                                 char *err, size_t err_bytes)
{
    if (n_ids > limit) {
        return fail(err, err_bytes, "%s has %zu ids, limit %zu", what, n_ids, limit);
    }
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0) {
            return fail(err, err_bytes, "%s[%zu] = %d is negative", what, i, ids[i]);
        }
    }
    return TDM_OK;
}

static tdm_status_t check_sampling(const Tandem__SamplingParams *s, char *err, size_t err_bytes)
{
    if (s == NULL) {
        return fail(err, err_bytes, "sampling params missing");
    }
    if (!(s->temperature >= 0.0) || s->temperature > 1e6) {
        return fail(err, err_bytes, "sampling temperature %g out of range", s->temperature);
    }
    if (s->top_k < 0) {
        return fail(err, err_bytes, "sampling top_k %d is negative", s->top_k);
    }
    if (!(s->top_p > 0.0 && s->top_p <= 1.0)) {
        return fail(err, err_bytes, "sampling top_p %g not in (0, 1]", s->top_p);
    }
    if (!(s->min_p >= 0.0 && s->min_p <= 1.0)) {
        return fail(err, err_bytes, "sampling min_p %g not in [0, 1]", s->min_p);
    }
    if (s->n_logprobs < -1 || s->n_logprobs > (int32_t)PROTO_MAX_TOP_LOGPROBS) {
        return fail(err, err_bytes, "sampling n_logprobs %d not in [-1, %u]", s->n_logprobs,
                    PROTO_MAX_TOP_LOGPROBS);
    }
    if (s->n_choices > PROTO_MAX_CHOICES) {
        return fail(err, err_bytes, "sampling n_choices %u over %u", s->n_choices,
                    PROTO_MAX_CHOICES);
    }
    return check_tokens("sampling stop_token_ids", s->stop_token_ids, s->n_stop_token_ids,
                        PROTO_MAX_STOP_TOKEN_IDS, err, err_bytes);
}

static tdm_status_t check_register(const Tandem__Register *r, char *err, size_t err_bytes)
{
    tdm_status_t status;

    if (r->role != TANDEM__ROLE__ROLE_PREFILL && r->role != TANDEM__ROLE__ROLE_DECODE) {
        return fail(err, err_bytes, "register role %d is not prefill or decode", (int)r->role);
    }
    status = check_id("register incarnation_id", r->incarnation_id, 1, err, err_bytes);
    if (status == TDM_OK) {
        status = check_id("register rack", r->rack, 0, err, err_bytes);
    }
    if (status == TDM_OK) {
        status = check_id("register node", r->node, 0, err, err_bytes);
    }
    if (status == TDM_OK) {
        status = check_id("register http_endpoint", r->http_endpoint, 0, err, err_bytes);
    }
    if (status != TDM_OK) {
        return status;
    }
    if (r->page_format == NULL) {
        return fail(err, err_bytes, "register page_format missing");
    }
    if (r->capacity == NULL) {
        return fail(err, err_bytes, "register capacity missing");
    }
    if (r->n_kv_formats > PROTO_MAX_KV_FORMATS) {
        return fail(err, err_bytes, "register has %zu kv formats, limit %u", r->n_kv_formats,
                    PROTO_MAX_KV_FORMATS);
    }
    for (size_t i = 0; i < r->n_kv_formats; i++) {
        status = check_id("register kv_formats[]", r->kv_formats[i], 1, err, err_bytes);
        if (status != TDM_OK) {
            return status;
        }
    }
    status = check_id("register kv_layout", r->kv_layout, 0, err, err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    if (r->n_transports > PROTO_MAX_TRANSPORTS) {
        return fail(err, err_bytes, "register has %zu transports, limit %u", r->n_transports,
                    PROTO_MAX_TRANSPORTS);
    }
    for (size_t i = 0; i < r->n_transports; i++) {
        status = check_id("register transports[]", r->transports[i], 1, err, err_bytes);
        if (status != TDM_OK) {
            return status;
        }
        if (strlen(r->transports[i]) > PROTO_MAX_TRANSPORT_BYTES) {
            return fail(err, err_bytes, "register transports[%zu] is longer than %u bytes", i,
                        PROTO_MAX_TRANSPORT_BYTES);
        }
    }
    if (r->transfer_descriptor.len > PROTO_MAX_TEXT_BYTES * 16) {
        return fail(err, err_bytes, "register transfer_descriptor is %zu bytes",
                    r->transfer_descriptor.len);
    }
    return TDM_OK;
}

/* One TopLogprobs list (NULL allowed): as many logprobs as tokens, none negative, at most
 * PROTO_MAX_TOP_LOGPROBS. */
static tdm_status_t check_top(const char *what, const Tandem__TopLogprobs *top, char *err,
                              size_t err_bytes)
{
    if (top == NULL) {
        return TDM_OK;
    }
    if (top->n_tokens != top->n_logprobs || top->n_tokens > PROTO_MAX_TOP_LOGPROBS) {
        return fail(err, err_bytes, "%s malformed", what);
    }
    return check_tokens(what, top->tokens, top->n_tokens, PROTO_MAX_TOP_LOGPROBS, err, err_bytes);
}

static tdm_status_t check_notice(const Tandem__CompletionNotice *c, char *err, size_t err_bytes)
{
    tdm_status_t status;

    if (c->total_len <= c->cached_len) {
        return fail(err, err_bytes, "completion total_len %llu <= cached_len %llu",
                    (unsigned long long)c->total_len, (unsigned long long)c->cached_len);
    }
    if (c->first_token < 0) {
        return fail(err, err_bytes, "completion first_token %d is negative", c->first_token);
    }
    if (c->n_choice_first + 1 > PROTO_MAX_CHOICES) {
        return fail(err, err_bytes, "completion has %zu extra choices", c->n_choice_first);
    }
    if (c->state_direct && (c->state_record.len > 0 || c->n_page_checksums > 0)) {
        return fail(err, err_bytes,
                    "completion with state_direct carries a state record or page checksums");
    }
    status = check_top("completion first_top", c->first_top, err, err_bytes);
    for (size_t i = 0; i < c->n_choice_first && status == TDM_OK; i++) {
        if (c->choice_first[i] == NULL || c->choice_first[i]->token < 0) {
            return fail(err, err_bytes, "completion choice_first[%zu] malformed", i);
        }
        status = check_top("completion choice_first top", c->choice_first[i]->top, err, err_bytes);
    }
    return status;
}

static tdm_status_t check_chunk(const Tandem__TokenChunk *t, char *err, size_t err_bytes)
{
    tdm_status_t status;

    status = check_tokens("token_chunk tokens", t->tokens, t->n_tokens, PROTO_MAX_TOKENS, err,
                          err_bytes);
    if (status != TDM_OK) {
        return status;
    }
    if (t->n_tokens == 0) {
        return fail(err, err_bytes, "token_chunk has no tokens");
    }
    if (t->n_logprobs != 0 && t->n_logprobs != t->n_tokens) {
        return fail(err, err_bytes, "token_chunk has %zu logprobs for %zu tokens", t->n_logprobs,
                    t->n_tokens);
    }
    if (t->choice >= PROTO_MAX_CHOICES) {
        return fail(err, err_bytes, "token_chunk choice %u over %u", t->choice,
                    PROTO_MAX_CHOICES - 1);
    }
    if (t->n_top != 0 && t->n_top != t->n_tokens) {
        return fail(err, err_bytes, "token_chunk has %zu top lists for %zu tokens", t->n_top,
                    t->n_tokens);
    }
    for (size_t i = 0; i < t->n_top; i++) {
        const Tandem__TopLogprobs *top = t->top[i];
        if (top == NULL || top->n_tokens != top->n_logprobs ||
            top->n_tokens > PROTO_MAX_TOP_LOGPROBS) {
            return fail(err, err_bytes, "token_chunk top[%zu] malformed", i);
        }
        status = check_tokens("token_chunk top tokens", top->tokens, top->n_tokens,
                              PROTO_MAX_TOP_LOGPROBS, err, err_bytes);
        if (status != TDM_OK) {
            return status;
        }
    }
    return TDM_OK;
}

static tdm_status_t check_decode_request(const Tandem__DecodeRequest *d, char *err,
                                         size_t err_bytes)
{
    tdm_status_t status;

    status = check_id("decode_request session_id", d->session_id, 1, err, err_bytes);
    if (status == TDM_OK) {
        status =
            check_id("decode_request prefix_session_id", d->prefix_session_id, 0, err, err_bytes);
    }
    if (status == TDM_OK) {
        status = check_tokens("decode_request delta_tokens", d->delta_tokens, d->n_delta_tokens,
                              PROTO_MAX_TOKENS, err, err_bytes);
    }
    if (status == TDM_OK) {
        status = check_sampling(d->sampling, err, err_bytes);
    }
    if (status != TDM_OK) {
        return status;
    }
    if (d->max_tokens == 0) {
        return fail(err, err_bytes, "decode_request max_tokens is 0");
    }
    switch (d->mode) {
    case TANDEM__PREFILL_MODE__PREFILL_LOCAL:
        if (d->n_delta_tokens == 0) {
            return fail(err, err_bytes, "decode_request local prefill without delta tokens");
        }
        if (d->total_len != d->cached_len + d->n_delta_tokens) {
            return fail(err, err_bytes, "decode_request total_len %llu != %llu + %zu",
                        (unsigned long long)d->total_len, (unsigned long long)d->cached_len,
                        d->n_delta_tokens);
        }
        return TDM_OK;
    case TANDEM__PREFILL_MODE__PREFILL_REMOTE:
        if (d->handoff == NULL) {
            return fail(err, err_bytes, "decode_request remote prefill without handoff");
        }
        return check_notice(d->handoff, err, err_bytes);
    default:
        return fail(err, err_bytes, "decode_request mode %d unknown", (int)d->mode);
    }
}

static tdm_status_t check_prefill_job(const Tandem__PrefillJob *p, char *err, size_t err_bytes)
{
    tdm_status_t status;

    status = check_id("prefill_job session_id", p->session_id, 1, err, err_bytes);
    if (status == TDM_OK) {
        status = check_id("prefill_job decode_incarnation_id", p->decode_incarnation_id, 1, err,
                          err_bytes);
    }
    if (status == TDM_OK) {
        status = check_tokens("prefill_job context_tokens", p->context_tokens, p->n_context_tokens,
                              PROTO_MAX_CONTEXT_TOKENS, err, err_bytes);
    }
    if (status == TDM_OK) {
        status = check_tokens("prefill_job delta_tokens", p->delta_tokens, p->n_delta_tokens,
                              PROTO_MAX_TOKENS, err, err_bytes);
    }
    if (status == TDM_OK) {
        status = check_sampling(p->sampling, err, err_bytes);
    }
    if (status != TDM_OK) {
        return status;
    }
    if (p->n_delta_tokens == 0) {
        return fail(err, err_bytes, "prefill_job has no delta tokens");
    }
    if (p->n_context_tokens > p->cached_len) {
        return fail(err, err_bytes, "prefill_job has %zu context tokens before position %llu",
                    p->n_context_tokens, (unsigned long long)p->cached_len);
    }
    return TDM_OK;
}

static tdm_status_t check_body(const Tandem__Envelope *env, char *err, size_t err_bytes)
{
    switch (env->body_case) {
    case TANDEM__ENVELOPE__BODY_REGISTER:
        return check_register(env->register_, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_REGISTER_ACK:
        return check_text("register_ack reason", env->register_ack->reason, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_HEARTBEAT:
        if (env->heartbeat->load == NULL) {
            return fail(err, err_bytes, "heartbeat load missing");
        }
        if (env->heartbeat->load->n_history_sessions > PROTO_MAX_HISTORY_SESSIONS) {
            return fail(err, err_bytes, "heartbeat load history_sessions over the limit");
        }
        if (env->heartbeat->load->n_resident_session_keys > PROTO_MAX_RESIDENT_SESSIONS ||
            env->heartbeat->load->n_resident_session_keys !=
                env->heartbeat->load->n_resident_cached_lens) {
            return fail(err, err_bytes,
                        "heartbeat load resident_session_keys over the limit or not paired with "
                        "resident_cached_lens");
        }
        return TDM_OK;
    case TANDEM__ENVELOPE__BODY_RESERVE_PAGES:
        if (env->reserve_pages->total_len <= env->reserve_pages->cached_len) {
            return fail(err, err_bytes, "reserve_pages total_len <= cached_len");
        }
        return check_id("reserve_pages session_id", env->reserve_pages->session_id, 1, err,
                        err_bytes);
    case TANDEM__ENVELOPE__BODY_PAGE_RESERVATION:
        if (env->page_reservation->reservation_id == 0) {
            return fail(err, err_bytes, "page_reservation reservation_id is 0");
        }
        return TDM_OK;
    case TANDEM__ENVELOPE__BODY_PREFILL_JOB:
        return check_prefill_job(env->prefill_job, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_COMPLETION:
        return check_notice(env->completion, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_DECODE_REQUEST:
        return check_decode_request(env->decode_request, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_TOKEN_CHUNK:
        return check_chunk(env->token_chunk, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_FINISH:
        if (env->finish->reason < TANDEM__FINISH_REASON__FINISH_STOP_TOKEN ||
            env->finish->reason > TANDEM__FINISH_REASON__FINISH_CONTEXT) {
            return fail(err, err_bytes, "finish reason %d unknown", (int)env->finish->reason);
        }
        return TDM_OK;
    case TANDEM__ENVELOPE__BODY_ABORT:
        return check_text("abort reason", env->abort->reason, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_ERROR:
        if (env->error->code <= TANDEM__ERROR_CODE__ERROR_UNSPECIFIED ||
            env->error->code > TANDEM__ERROR_CODE__ERROR_TOO_LARGE) {
            return fail(err, err_bytes, "error code %d unknown", (int)env->error->code);
        }
        return check_text("error message", env->error->message, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_GOODBYE:
        return check_text("goodbye reason", env->goodbye->reason, err, err_bytes);
    case TANDEM__ENVELOPE__BODY_ABORT_ACK:
        if (env->abort_ack->request_id == 0) {
            return fail(err, err_bytes, "abort_ack request_id is 0");
        }
        return TDM_OK;
    case TANDEM__ENVELOPE__BODY_SESSION_QUERY:
        if (env->session_query->query_id == 0) {
            return fail(err, err_bytes, "session_query query_id is 0");
        }
        return check_id("session_query session_id", env->session_query->session_id, 1, err,
                        err_bytes);
    case TANDEM__ENVELOPE__BODY_SESSION_HISTORY:
        if (env->session_history->n_tokens != env->session_history->cached_len ||
            env->session_history->prompt_len > env->session_history->cached_len) {
            return fail(err, err_bytes,
                        "session_history has %zu tokens for cached_len %llu (prompt_len %u)",
                        env->session_history->n_tokens,
                        (unsigned long long)env->session_history->cached_len,
                        env->session_history->prompt_len);
        }
        if (check_tokens("session_history tokens", env->session_history->tokens,
                         env->session_history->n_tokens, PROTO_MAX_TOKENS, err,
                         err_bytes) != TDM_OK) {
            return TDM_ERR_INVALID_ARG; /* err says which id */
        }
        return check_id("session_history session_id", env->session_history->session_id, 1, err,
                        err_bytes);
    case TANDEM__ENVELOPE__BODY_SESSION_REPLICA:
        if (env->session_replica->prompt_len > env->session_replica->n_tokens ||
            check_tokens("session_replica tokens", env->session_replica->tokens,
                         env->session_replica->n_tokens, PROTO_MAX_TOKENS, err,
                         err_bytes) != TDM_OK) {
            return fail(err, err_bytes, "session_replica tokens malformed");
        }
        if (check_id("session_replica decode_incarnation_id",
                     env->session_replica->decode_incarnation_id, 0, err, err_bytes) != TDM_OK) {
            return TDM_ERR_INVALID_ARG; /* err says why */
        }
        return check_id("session_replica session_id", env->session_replica->session_id, 1, err,
                        err_bytes);
    case TANDEM__ENVELOPE__BODY__NOT_SET:
    default:
        return fail(err, err_bytes, "envelope has no body (case %d)", (int)env->body_case);
    }
}

tdm_status_t proto_check(const Tandem__Envelope *env, char *err, size_t err_bytes)
{
    if (env == NULL) {
        return fail(err, err_bytes, "envelope is NULL");
    }
    /* A set oneof case with a NULL member cannot come from unpack, but can from a builder. */
    if (env->body_case != TANDEM__ENVELOPE__BODY__NOT_SET && env->register_ == NULL) {
        return fail(err, err_bytes, "envelope body %d set but NULL", (int)env->body_case);
    }
    return check_body(env, err, err_bytes);
}
