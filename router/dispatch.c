#include "router/dispatch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/http_status.h"
#include "common/log.h"
#include "proto/proto_hash.h"
#include "router/fence.h"
#include "router/dispatch_impl.h"
#include "router/placement.h"

void router_dispatch_params_default(router_dispatch_params_t *params)
{
    params->local_prefill_tokens = 512;
    params->max_attempts = 4;
    params->reservation_timeout_ms = 10000;
    params->prefill_timeout_ms = 600000;
}

tdm_status_t router_dispatch_create(const router_dispatch_params_t *params,
                                    const router_model_t *model, router_registry_t *registry,
                                    router_sessions_t *sessions, router_metrics_t *metrics,
                                    router_send_fn *send, void *send_ctx,
                                    router_dispatch_t **dispatch_out)
{
    router_dispatch_t *d;

    if (params == NULL || model == NULL || registry == NULL || sessions == NULL ||
        metrics == NULL || send == NULL || dispatch_out == NULL || params->max_attempts == 0) {
        return TDM_ERR_INVALID_ARG;
    }
    d = calloc(1, sizeof(*d));
    if (d == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (router_fences_create(&d->fences) != TDM_OK) {
        free(d);
        return TDM_ERR_NO_MEMORY;
    }
    d->params = *params;
    d->model = model;
    d->info = router_model_info(model);
    d->registry = registry;
    d->sessions = sessions;
    d->metrics = metrics;
    d->send = send;
    d->send_ctx = send_ctx;
    d->session_salt = tdm_hash_splitmix64(tdm_clock_now_ns() ^ (uint64_t)(uintptr_t)d);
    *dispatch_out = d;
    return TDM_OK;
}

/* ---- table ------------------------------------------------------------------------------ */

static inflight_t **bucket_of(router_dispatch_t *d, uint64_t id)
{
    return &d->buckets[tdm_hash_splitmix64(id) & (INFLIGHT_BUCKETS - 1)];
}

inflight_t *dispatch_find(router_dispatch_t *d, uint64_t id)
{
    inflight_t *f = *bucket_of(d, id);

    while (f != NULL && f->id != id) {
        f = f->next;
    }
    return f;
}

/* Ids of every turn in flight (caller frees); NULL with *n_out 0 when none or out of memory. */
static uint64_t *collect_ids(router_dispatch_t *d, size_t *n_out)
{
    uint64_t *ids;
    size_t n = 0;

    *n_out = 0;
    if (d->n_inflight == 0) {
        return NULL;
    }
    ids = malloc(d->n_inflight * sizeof(*ids));
    if (ids == NULL) {
        return NULL;
    }
    for (uint32_t b = 0; b < INFLIGHT_BUCKETS; b++) {
        for (inflight_t *f = d->buckets[b]; f != NULL; f = f->next) {
            ids[n++] = f->id;
        }
    }
    *n_out = n;
    return ids;
}

static void set_decode(router_dispatch_t *d, inflight_t *f, int slot, uint64_t gen)
{
    router_registry_note_released(d->registry, f->decode_slot, f->decode_gen, 0);
    f->decode_slot = slot;
    f->decode_gen = gen;
    router_registry_note_assigned(d->registry, slot, gen, 0);
}

static void set_prefill(router_dispatch_t *d, inflight_t *f, int slot, uint64_t gen,
                        uint64_t n_tokens)
{
    router_registry_note_released(d->registry, f->prefill_slot, f->prefill_gen, f->prefill_tokens);
    f->prefill_slot = slot;
    f->prefill_gen = gen;
    f->prefill_tokens = slot >= 0 ? n_tokens : 0;
    router_registry_note_assigned(d->registry, slot, gen, f->prefill_tokens);
}

static void end_turn(router_dispatch_t *d, inflight_t *f)
{
    inflight_t **link = bucket_of(d, f->id);

    while (*link != f) {
        link = &(*link)->next;
    }
    *link = f->next;
    d->n_inflight--;
    set_decode(d, f, -1, 0);
    set_prefill(d, f, -1, 0, 0);
    if (f->session != NULL && f->session->active_request == f->id) {
        f->session->active_request = 0;
    }
    router_request_unref(f->req);
    free(f);
}

/* ---- sending ---------------------------------------------------------------------------- */

tdm_status_t dispatch_send_to(router_dispatch_t *d, int slot, uint64_t gen,
                              const Tandem__Envelope *env)
{
    router_worker_t *w = router_registry_worker(d->registry, slot, gen);
    tdm_status_t status;

    if (w == NULL) {
        return TDM_ERR_PEER_LOST;
    }
    status = d->send(d->send_ctx, w->id, env);
    if (status == TDM_ERR_PEER_LOST && d->n_lost < DISPATCH_MAX_LOST) {
        for (int i = 0; i < d->n_lost; i++) {
            if (d->lost[i] == slot) {
                return status;
            }
        }
        d->lost[d->n_lost++] = slot;
    }
    return status;
}

void dispatch_fail(router_dispatch_t *d, inflight_t *f, int http_status, const char *type,
                   const char *code, const char *fmt, ...)
{
    router_apierr_t err;
    va_list ap;

    err.http_status = http_status;
    err.type = type;
    err.code = code;
    err.param = NULL;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof(err.message), fmt, ap);
    va_end(ap);
    tdm_log(TDM_LOG_WARN, "dispatch", "request failed: request=%llu code=%s reason=\"%s\"",
            (unsigned long long)f->id, code, err.message);
    dispatch_abort_workers(d, f, code, 0);
    router_request_post_error(f->req, &err);
    end_turn(d, f);
}

static void fill_sampling(const router_dispatch_t *d, const router_gen_request_t *gen,
                          Tandem__SamplingParams *s, int32_t *stop_ids)
{
    s->temperature = gen->temperature;
    s->top_k = gen->top_k;
    s->top_p = gen->top_p;
    s->min_p = gen->min_p;
    s->seed = gen->seed;
    s->n_logprobs = gen->n_logprobs;
    s->n_choices = gen->n_choices > 1 ? gen->n_choices : 0;
    s->min_tokens = gen->min_tokens;
    s->n_stop_token_ids = 0;
    s->stop_token_ids = stop_ids;
    /* protobuf-c packs a const string; "" (the default) is no constraint */
    s->response_format = gen->response_format_json != NULL ? gen->response_format_json : (char *)"";
    s->tool_calls = gen->tool_constraint_json != NULL ? gen->tool_constraint_json : (char *)"";
    if (!gen->ignore_eos && d->info->eos_id >= 0) {
        stop_ids[s->n_stop_token_ids++] = d->info->eos_id;
    }
}

/* ---- the stages ------------------------------------------------------------------------- */

static void start_attempt(router_dispatch_t *d, inflight_t *f, uint64_t now_ns);

static void send_decode(router_dispatch_t *d, inflight_t *f,
                        const Tandem__CompletionNotice *handoff, uint64_t now_ns)
{
    const router_gen_request_t *gen = router_request_gen(f->req);
    router_session_t *s = f->session;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__DecodeRequest dr = TANDEM__DECODE_REQUEST__INIT;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    int32_t stop_ids[1];
    size_t delta = f->total_len - f->cached_len;

    fill_sampling(d, gen, &sp, stop_ids);
    if (f->n_generated == 0) { /* usage.prompt_tokens_details.cached_tokens: H of this attempt */
        router_request_set_cached_tokens(f->req, f->cached_len);
    }
    dr.request_id = f->id;
    dr.session_id = s->id;
    dr.tenant = s->tenant; /* kept by the node for SessionHistory (issue 18 item 3) */
    dr.cached_len = f->cached_len;
    dr.total_len = f->total_len;
    dr.sampling = &sp;
    dr.max_tokens = gen->max_tokens - f->n_generated;
    dr.canonical_start = delta >= d->params.local_prefill_tokens;
    dr.prefix_session_id = f->prefix_session;
    if (f->prefix_session[0] != '\0') { /* the node matches the prefix on these ids */
        dr.prefix_ids = s->tokens;
        dr.n_prefix_ids = f->cached_len;
    }
    dr.spec = (char *)router_spec_name(gen->spec); /* "": the node's --spec */
    /* REMOTE too: the decode node records the session's ids for a later rewind (PROTOCOL.md 3c) */
    dr.delta_tokens = s->tokens + f->cached_len;
    dr.n_delta_tokens = delta;
    if (handoff != NULL) {
        dr.mode = TANDEM__PREFILL_MODE__PREFILL_REMOTE;
        dr.handoff = (Tandem__CompletionNotice *)handoff;
    } else {
        dr.mode = TANDEM__PREFILL_MODE__PREFILL_LOCAL;
        router_metrics_count(d->metrics, ROUTER_METRIC_PREFILL_LOCAL_TOKENS, delta);
    }
    env.body_case = TANDEM__ENVELOPE__BODY_DECODE_REQUEST;
    env.decode_request = &dr;
    f->stage = STAGE_DECODING;
    f->deadline_ns = 0;
    tdm_log(TDM_LOG_DEBUG, "dispatch",
            "decode: request=%llu session=%s mode=%s cached_len=%zu total_len=%zu attempt=%u "
            "spec=%s",
            (unsigned long long)f->id, s->id, handoff != NULL ? "remote" : "local", f->cached_len,
            f->total_len, f->attempts, gen->spec != ROUTER_SPEC_DEFAULT ? dr.spec : "default");
    (void)now_ns;
    dispatch_send_to(d, f->decode_slot, f->decode_gen, &env);
}

static void send_reserve(router_dispatch_t *d, inflight_t *f, uint64_t now_ns)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__ReservePages rp = TANDEM__RESERVE_PAGES__INIT;

    rp.request_id = f->id;
    rp.session_id = f->session->id;
    rp.cached_len = f->cached_len;
    rp.total_len = f->total_len;
    rp.prefix_session_id = f->prefix_session;
    if (f->prefix_session[0] != '\0') { /* the node matches the prefix on these ids */
        rp.prefix_ids = f->session->tokens;
        rp.n_prefix_ids = f->cached_len;
    }
    rp.attempt = f->attempts + 1;
    /* The pages must outlive the prefill job too: the handoff comes only after its notice, so
     * the reservation lapses past both stage deadlines (a lost or late job is aborted sooner). */
    rp.timeout_ms = d->params.reservation_timeout_ms + d->params.prefill_timeout_ms;
    if (rp.timeout_ms < d->params.prefill_timeout_ms) {
        rp.timeout_ms = UINT32_MAX;
    }
    env.body_case = TANDEM__ENVELOPE__BODY_RESERVE_PAGES;
    env.reserve_pages = &rp;
    f->stage = STAGE_RESERVING;
    f->deadline_ns = now_ns + (uint64_t)d->params.reservation_timeout_ms * TDM_NS_PER_MS;
    dispatch_send_to(d, f->decode_slot, f->decode_gen, &env);
}

/* Count a remote prefill that could not be placed and became local (issue 16); no prefill
 * worker at all (MISS_NONE) is the plan, not a fallback. */
static void count_fallback(router_dispatch_t *d, router_place_miss_t miss, const inflight_t *f)
{
    static const router_metric_t metric_of[] = {
        [ROUTER_PLACE_MISS_STALLED] = ROUTER_METRIC_PREFILL_FALLBACK_STALLED,
        [ROUTER_PLACE_MISS_TRANSPORT] = ROUTER_METRIC_PREFILL_FALLBACK_TRANSPORT,
        [ROUTER_PLACE_MISS_CAPACITY] = ROUTER_METRIC_PREFILL_FALLBACK_CAPACITY,
    };

    if (miss != ROUTER_PLACE_MISS_NONE) {
        router_metrics_count(d->metrics, metric_of[miss], 1);
        tdm_log(TDM_LOG_DEBUG, "dispatch",
                "local prefill fallback: request=%llu tokens=%zu "
                "reason=\"%s\"",
                (unsigned long long)f->id, f->total_len, router_place_miss_name(miss));
    }
}

/* The session's decode worker for this attempt: its sticky worker while that one is placeable
 * and holds the session; else a new placement (the session's KV starts over there). Returns the
 * worker, or NULL after failing f. */
static router_worker_t *decode_worker_for(router_dispatch_t *d, inflight_t *f)
{
    router_session_t *s = f->session;
    router_worker_t *w = router_registry_worker(d->registry, s->worker_slot, s->worker_generation);
    router_place_miss_t miss = ROUTER_PLACE_MISS_NONE;
    uint64_t largest = 0;
    uint64_t gen_id = 0;
    int slot;

    if (w != NULL && (!router_registry_placeable(w) || !router_worker_holds(w, s->n_tokens))) {
        /* stalled, draining or too small: the session moves and is rebuilt from its token
         * history there (cached_len 0) */
        tdm_log(TDM_LOG_INFO, "dispatch",
                "session moved: session=%s worker=%s reason=%s tokens=%zu max_tokens=%llu", s->id,
                w->id,
                w->stalled    ? "stalled"
                : w->draining ? "draining"
                              : "too long for the worker",
                s->n_tokens, (unsigned long long)w->max_tokens);
        w = NULL;
    }
    if (w != NULL) {
        return w;
    }
    slot = router_place_decode(d->registry, s->n_tokens, &gen_id, &miss, &largest);
    if (slot < 0) {
        if (miss == ROUTER_PLACE_MISS_CAPACITY) {
            dispatch_fail(
                d, f, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                "context_length_exceeded",
                "the conversation is %zu tokens; the largest decode worker holds %llu (its "
                "declared Capacity.max_tokens)",
                s->n_tokens, (unsigned long long)largest);
        } else if (miss == ROUTER_PLACE_MISS_STALLED) {
            dispatch_fail(d, f, TDM_HTTP_UNAVAILABLE, ROUTER_APIERR_OVERLOADED, "no_decode_workers",
                          "every decode worker is stalled or draining");
        } else {
            dispatch_fail(d, f, TDM_HTTP_UNAVAILABLE, ROUTER_APIERR_OVERLOADED, "no_decode_workers",
                          "no decode worker is available");
        }
        return NULL;
    }
    s->worker_slot = slot;
    s->worker_generation = gen_id;
    s->cached_len = 0;
    f->prefix_session[0] = '\0';
    w = router_registry_worker(d->registry, slot, gen_id);
    tdm_log(TDM_LOG_DEBUG, "dispatch", "session placed: session=%s worker=%s", s->id, w->id);
    return w;
}

static void start_attempt(router_dispatch_t *d, inflight_t *f, uint64_t now_ns)
{
    const router_gen_request_t *gen = router_request_gen(f->req);
    router_session_t *s = f->session;
    router_place_miss_t miss = ROUTER_PLACE_MISS_NONE;
    uint64_t prefill_gen;
    router_worker_t *w;
    size_t delta;

    if (f->n_generated >= gen->max_tokens) {
        router_request_post_finish(f->req, ROUTER_FINISH_LENGTH);
        end_turn(d, f);
        return;
    }
    w = decode_worker_for(d, f);
    if (w == NULL) {
        return;
    }
    set_decode(d, f, s->worker_slot, s->worker_generation);
    f->total_len = s->n_tokens;
    f->cached_len = s->cached_len < s->n_tokens ? s->cached_len : s->n_tokens - 1;
    f->reservation_id = 0;
    f->prefill_attempt = 0;
    delta = f->total_len - f->cached_len;
    if (delta >= d->params.local_prefill_tokens) {
        /* only a prefill worker that holds the sequence and can reach this decode worker */
        if (router_place_prefill_session(d->registry, w, f->total_len,
                                         proto_session_hash(f->session->id), &prefill_gen,
                                         &miss) >= 0) {
            send_reserve(d, f, now_ns);
            return;
        }
        count_fallback(d, miss, f);
    }
    send_decode(d, f, NULL, now_ns);
}

static void retry(router_dispatch_t *d, inflight_t *f, const char *why, uint64_t now_ns)
{
    const router_gen_request_t *gen = router_request_gen(f->req);
    uint32_t posted = f->n_generated;

    router_metrics_count(d->metrics, ROUTER_METRIC_RETRIES, 1);
    f->attempts++;
    set_prefill(d, f, -1, 0, 0);
    for (uint32_t c = 1; c < PROTO_MAX_CHOICES; c++) {
        posted += f->n_fork_generated[c];
    }
    if (gen->n_choices > 1 && posted > 0) {
        /* the forks' state is gone with the attempt; a retry continues the session alone */
        dispatch_fail(d, f, TDM_HTTP_UNAVAILABLE, ROUTER_APIERR_OVERLOADED, "retries_exhausted",
                      "the %u choices could not be finished (%s)", gen->n_choices, why);
        return;
    }
    if (f->attempts >= d->params.max_attempts) {
        dispatch_fail(d, f, TDM_HTTP_UNAVAILABLE, ROUTER_APIERR_OVERLOADED, "retries_exhausted",
                      "the request could not be served after %u attempts (last: %s)", f->attempts,
                      why);
        return;
    }
    tdm_log(TDM_LOG_INFO, "dispatch", "turn retried: request=%llu session=%s attempt=%u reason=%s",
            (unsigned long long)f->id, f->session->id, f->attempts, why);
    start_attempt(d, f, now_ns);
}

static void drain_lost(router_dispatch_t *d, uint64_t now_ns)
{
    if (d->draining) {
        return;
    }
    d->draining = 1;
    while (d->n_lost > 0) {
        int slot = d->lost[--d->n_lost];
        d->draining = 0;
        router_dispatch_worker_gone(d, slot, ROUTER_REGISTRY_LOST, "unreachable: send failed",
                                    now_ns);
        d->draining = 1;
    }
    d->draining = 0;
}

/* ---- public entry points ---------------------------------------------------------------- */

void router_dispatch_submit(router_dispatch_t *dispatch, router_request_t *request, uint64_t now_ns)
{
    router_dispatch_t *d = dispatch;
    inflight_t *f = calloc(1, sizeof(*f));
    inflight_t **bucket;
    router_apierr_t err;

    if (f == NULL) {
        router_apierr_set(&err, TDM_HTTP_INTERNAL, ROUTER_APIERR_SERVER, "internal_error", NULL,
                          "out of memory");
        router_request_post_error(request, &err);
        return;
    }
    f->req = router_request_ref(request);
    f->id = router_request_id(request);
    f->decode_slot = -1;
    f->prefill_slot = -1;
    bucket = bucket_of(d, f->id);
    f->next = *bucket;
    *bucket = f;
    d->n_inflight++;
    router_metrics_count(d->metrics, ROUTER_METRIC_PROMPT_TOKENS,
                         router_request_gen(request)->n_prompt_ids);
    if (dispatch_resolve_session(d, f, now_ns) == TDM_OK) {
        start_attempt(d, f, now_ns);
    }
    drain_lost(d, now_ns);
}

void router_dispatch_release(router_dispatch_t *dispatch, router_request_t *request,
                             int client_gone, uint64_t now_ns)
{
    router_dispatch_t *d = dispatch;
    inflight_t *f = dispatch_find(d, router_request_id(request));
    router_session_t *s;

    if (client_gone) {
        router_metrics_count(d->metrics, ROUTER_METRIC_CLIENT_ABORTS, 1);
    }
    if (f == NULL) {
        return;
    }
    s = f->session;
    /* The decode worker holds at least the positions that produced the tokens we saw. */
    if (f->stage == STAGE_DECODING && f->n_generated > 0) {
        s->cached_len = s->n_tokens - 1;
    } else {
        s->cached_len = f->cached_len;
    }
    dispatch_abort_workers(d, f, client_gone ? "client gone" : "output complete", 0);
    end_turn(d, f);
    drain_lost(d, now_ns);
}

static void on_reservation(router_dispatch_t *d, int slot, const Tandem__PageReservation *r,
                           uint64_t now_ns)
{
    inflight_t *f = dispatch_find(d, r->request_id);
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__PrefillJob job = TANDEM__PREFILL_JOB__INIT;
    Tandem__SamplingParams sp = TANDEM__SAMPLING_PARAMS__INIT;
    router_worker_t *dw;
    router_worker_t *pw;
    router_place_miss_t miss = ROUTER_PLACE_MISS_NONE;
    int32_t stop_ids[1];
    uint64_t pgen = 0;
    size_t n_context;
    int pslot;

    if (f == NULL || f->stage != STAGE_RESERVING || f->decode_slot != slot ||
        (r->attempt != 0 && r->attempt != f->attempts + 1)) {
        /* Nobody wants it (late: its try timed out, its turn moved on or ended): no writer ever
         * saw it, so its pages go back at once. */
        tdm_log(TDM_LOG_INFO, "dispatch",
                "late reservation released: request=%llu attempt=%u reservation=%llu pages=%u",
                (unsigned long long)r->request_id, r->attempt,
                (unsigned long long)r->reservation_id, r->n_pages);
        dispatch_send_abort(d, slot, 0, r->request_id, r->reservation_id, 0, 1,
                            "unwanted reservation");
        return;
    }
    f->reservation_id = r->reservation_id;
    if (r->cached_len < f->cached_len) {
        f->cached_len = r->cached_len;
        f->session->cached_len = r->cached_len;
    }
    dw = router_registry_worker(d->registry, f->decode_slot, f->decode_gen);
    pslot = router_place_prefill_session(d->registry, dw, f->total_len,
                                         proto_session_hash(f->session->id), &pgen, &miss);
    if (pslot < 0) {
        count_fallback(d, miss, f);
        dispatch_send_abort(d, f->decode_slot, f->decode_gen, f->id, f->reservation_id,
                            f->attempts + 1, 1, "no prefill worker");
        f->reservation_id = 0;
        send_decode(d, f, NULL, now_ns);
        return;
    }
    pw = router_registry_worker(d->registry, pslot, pgen);
    if (strcmp(pw->rack, dw->rack) != 0) { /* its KV crosses racks over RDMA (placement.h) */
        router_metrics_count(d->metrics, ROUTER_METRIC_PREFILL_CROSS_RACK, 1);
    }
    n_context = f->cached_len < d->info->context_tokens ? f->cached_len : d->info->context_tokens;
    fill_sampling(d, router_request_gen(f->req), &sp, stop_ids);
    job.request_id = f->id;
    job.session_id = f->session->id;
    job.decode_incarnation_id = dw->id;
    job.decode_transfer_descriptor.data = dw->transfer_descriptor;
    job.decode_transfer_descriptor.len = dw->n_transfer_descriptor;
    job.reservation_id = f->reservation_id;
    job.page_descriptor = r->descriptor;
    job.cached_len = f->cached_len;
    job.context_tokens = f->session->tokens + f->cached_len - n_context;
    job.n_context_tokens = n_context;
    job.delta_tokens = f->session->tokens + f->cached_len;
    job.n_delta_tokens = f->total_len - f->cached_len;
    job.sampling = &sp;
    job.canonical_start = 1;
    job.attempt = f->attempts + 1;
    f->prefill_attempt = job.attempt;
    env.body_case = TANDEM__ENVELOPE__BODY_PREFILL_JOB;
    env.prefill_job = &job;
    set_prefill(d, f, pslot, pgen, job.n_delta_tokens);
    f->stage = STAGE_PREFILLING;
    f->deadline_ns = now_ns + (uint64_t)d->params.prefill_timeout_ms * TDM_NS_PER_MS;
    router_metrics_count(d->metrics, ROUTER_METRIC_PREFILL_REMOTE_TOKENS, job.n_delta_tokens);
    tdm_log(TDM_LOG_DEBUG, "dispatch",
            "prefill job: request=%llu attempt=%u prefill=%s decode=%s tokens=%zu",
            (unsigned long long)f->id, job.attempt, pw->id, dw->id, job.n_delta_tokens);
    dispatch_send_to(d, pslot, pgen, &env);
}

static void on_completion(router_dispatch_t *d, int slot, const Tandem__CompletionNotice *c,
                          uint64_t now_ns)
{
    inflight_t *f = dispatch_find(d, c->request_id);

    if (dispatch_writer_answered(d, slot, c->request_id, c->attempt, "completion")) {
        return; /* an aborted attempt's notice: it only fences its writer */
    }
    if (f == NULL || f->stage != STAGE_PREFILLING || f->prefill_slot != slot ||
        c->reservation_id != f->reservation_id ||
        (c->attempt != 0 && c->attempt != f->prefill_attempt)) {
        tdm_log(TDM_LOG_DEBUG, "dispatch", "stale completion dropped: request=%llu attempt=%u",
                (unsigned long long)c->request_id, c->attempt);
        return;
    }
    set_prefill(d, f, -1, 0, 0);
    send_decode(d, f, c, now_ns);
}

static void on_chunk(router_dispatch_t *d, int slot, const Tandem__TokenChunk *t, uint64_t now_ns)
{
    inflight_t *f = dispatch_find(d, t->request_id);
    const router_gen_request_t *gen;
    size_t n;
    double gap_s;

    if (f == NULL || f->stage != STAGE_DECODING || f->decode_slot != slot) {
        return;
    }
    gen = router_request_gen(f->req);
    if (t->choice >= (gen->n_choices > 1 ? gen->n_choices : 1)) {
        dispatch_fail(d, f, TDM_HTTP_BAD_GATEWAY, ROUTER_APIERR_SERVER, "bad_worker_output",
                      "decode worker sent choice %u of a request with %u", t->choice,
                      gen->n_choices);
        return;
    }
    for (size_t i = 0; i < t->n_tokens; i++) {
        if ((uint32_t)t->tokens[i] >= d->info->n_vocab) {
            dispatch_fail(d, f, TDM_HTTP_BAD_GATEWAY, ROUTER_APIERR_SERVER, "bad_worker_output",
                          "decode worker sent token id %d outside the vocabulary", t->tokens[i]);
            return;
        }
    }
    n = t->n_tokens;
    if (t->choice > 0) {
        /* another choice: its own count; the session's history continues choice 0 only */
        uint32_t *done = &f->n_fork_generated[t->choice];
        if (n > gen->max_tokens - *done) {
            n = gen->max_tokens - *done;
        }
        if (n > 0 && router_request_post_tokens(f->req, t->choice, t->tokens,
                                                t->n_logprobs > 0 ? t->logprobs : NULL,
                                                t->n_top > 0 ? t->top : NULL, n) != TDM_OK) {
            dispatch_fail(d, f, TDM_HTTP_INTERNAL, ROUTER_APIERR_SERVER, "internal_error",
                          "out of memory");
            return;
        }
        *done += (uint32_t)n;
        return;
    }
    if (n > gen->max_tokens - f->n_generated) {
        n = gen->max_tokens - f->n_generated;
    }
    if (n == 0) {
        return;
    }
    if (router_sessions_append(d->sessions, f->session, t->tokens, n) != TDM_OK ||
        router_request_post_tokens(f->req, 0, t->tokens, t->n_logprobs > 0 ? t->logprobs : NULL,
                                   t->n_top > 0 ? t->top : NULL, n) != TDM_OK) {
        dispatch_fail(d, f, TDM_HTTP_INTERNAL, ROUTER_APIERR_SERVER, "internal_error",
                      "out of memory");
        return;
    }
    if (f->n_generated == 0) {
        router_metrics_ttft(d->metrics,
                            (double)(now_ns - router_request_t_start_ns(f->req)) / TDM_NS_PER_S);
    } else {
        gap_s = (double)(now_ns - f->t_last_token_ns) / TDM_NS_PER_S / (double)n;
        for (size_t i = 0; i < n; i++) {
            router_metrics_itl(d->metrics, gap_s);
        }
    }
    f->t_last_token_ns = now_ns;
    f->n_generated += (uint32_t)n;
}

static void on_finish(router_dispatch_t *d, int slot, const Tandem__Finish *fin, uint64_t now_ns)
{
    inflight_t *f = dispatch_find(d, fin->request_id);
    router_session_t *s;

    if (f == NULL || f->stage != STAGE_DECODING || f->decode_slot != slot) {
        return;
    }
    s = f->session;
    if (fin->reason == TANDEM__FINISH_REASON__FINISH_ABORTED) {
        /* We did not ask for it: the worker gave the turn up. */
        s->cached_len = f->cached_len;
        retry(d, f, "worker aborted the turn", now_ns);
        return;
    }
    s->cached_len = fin->cached_len < s->n_tokens ? fin->cached_len : s->n_tokens;
    router_request_post_finish(f->req, fin->reason == TANDEM__FINISH_REASON__FINISH_STOP_TOKEN
                                           ? ROUTER_FINISH_STOP
                                           : ROUTER_FINISH_LENGTH);
    end_turn(d, f);
}

static void on_error(router_dispatch_t *d, int slot, const Tandem__Error *e, uint64_t now_ns)
{
    inflight_t *f = dispatch_find(d, e->request_id);
    int from_prefill;

    if (dispatch_writer_answered(d, slot, e->request_id, e->attempt, "error")) {
        return; /* an aborted attempt's error: it only fences its writer */
    }
    if (f != NULL && slot == f->prefill_slot && slot != f->decode_slot && e->attempt != 0 &&
        e->attempt != f->prefill_attempt) {
        tdm_log(TDM_LOG_DEBUG, "dispatch", "stale error dropped: request=%llu attempt=%u code=%s",
                (unsigned long long)e->request_id, e->attempt, proto_error_code_name(e->code));
        return;
    }
    if (f == NULL || (slot != f->decode_slot && slot != f->prefill_slot)) {
        tdm_log(TDM_LOG_DEBUG, "dispatch", "worker error without a turn: request=%llu code=%s",
                (unsigned long long)e->request_id, proto_error_code_name(e->code));
        return;
    }
    from_prefill = slot == f->prefill_slot && f->stage == STAGE_PREFILLING;
    tdm_log(TDM_LOG_INFO, "dispatch", "worker error: request=%llu code=%s message=\"%s\"",
            (unsigned long long)f->id, proto_error_code_name(e->code), e->message);
    if (e->code == TANDEM__ERROR_CODE__ERROR_STATE_LOST) {
        if (e->cached_len < f->session->cached_len) {
            f->session->cached_len = e->cached_len;
        }
        if (f->reservation_id != 0) {
            dispatch_abort_workers(d, f, "state lost", 0);
        }
        retry(d, f, "state lost", now_ns);
        return;
    }
    if (e->code == TANDEM__ERROR_CODE__ERROR_DRAINING && slot == f->decode_slot) {
        /* the worker began draining before its heartbeat said so: it takes nothing new, so
         * place the turn elsewhere (start_attempt skips draining workers) */
        router_registry_set_draining(d->registry, slot);
        if (f->reservation_id != 0) {
            dispatch_abort_workers(d, f, "decode worker draining", 0);
        }
        retry(d, f, "decode worker draining", now_ns);
        return;
    }
    if (from_prefill && (e->code == TANDEM__ERROR_CODE__ERROR_TOO_LARGE ||
                         e->code == TANDEM__ERROR_CODE__ERROR_NO_PAGES)) {
        /* the prefill worker cannot hold this sequence: never send it one this long again, and
         * let the decode worker prefill it (issue 16: not four failed retries) */
        if (f->total_len > 0) {
            router_registry_limit_max_tokens(d->registry, f->prefill_slot, f->prefill_gen,
                                             f->total_len - 1);
        }
        router_metrics_count(d->metrics, ROUTER_METRIC_PREFILL_FALLBACK_CAPACITY, 1);
        dispatch_send_abort(
            d, f->decode_slot, f->decode_gen, f->id, f->reservation_id, f->attempts + 1, 1,
            "prefill worker cannot hold it"); /* its Error is the writer's last word */
        f->reservation_id = 0;
        set_prefill(d, f, -1, 0, 0);
        send_decode(d, f, NULL, now_ns);
        return;
    }
    if (from_prefill) {
        if (e->code == TANDEM__ERROR_CODE__ERROR_DRAINING) {
            /* the prefill node is stopping: no new job for it (its Goodbye follows) */
            router_registry_set_draining(d->registry, slot);
        }
        dispatch_abort_workers(d, f, "prefill failed", 1); /* its Error is the writer's last word */
        retry(d, f, "prefill worker error", now_ns);
        return;
    }
    if (e->code == TANDEM__ERROR_CODE__ERROR_TOO_LARGE) {
        if (f->total_len > 0) { /* its next turns go where they fit */
            router_registry_limit_max_tokens(d->registry, f->decode_slot, f->decode_gen,
                                             f->total_len - 1);
        }
        dispatch_fail(d, f, TDM_HTTP_BAD_REQUEST, ROUTER_APIERR_INVALID_REQUEST,
                      "context_length_exceeded", "the decode worker cannot hold %zu tokens: %s",
                      f->total_len, e->message);
        return;
    }
    if (e->code == TANDEM__ERROR_CODE__ERROR_NO_PAGES ||
        e->code == TANDEM__ERROR_CODE__ERROR_BUSY) {
        dispatch_fail(d, f, TDM_HTTP_UNAVAILABLE, ROUTER_APIERR_OVERLOADED, "worker_overloaded",
                      "the decode worker is out of capacity: %s", e->message);
        return;
    }
    dispatch_fail(d, f, TDM_HTTP_BAD_GATEWAY, ROUTER_APIERR_SERVER, "worker_error",
                  "decode worker failed (%s): %s", proto_error_code_name(e->code), e->message);
}

/* A prefill node stopped an aborted job and has nothing in flight. */
static void on_abort_ack(router_dispatch_t *d, int slot, const Tandem__AbortAck *a, uint64_t now_ns)
{
    inflight_t *f = dispatch_find(d, a->request_id);

    if (dispatch_writer_answered(d, slot, a->request_id, a->attempt, "abort_ack")) {
        return;
    }
    if (f != NULL && f->stage == STAGE_PREFILLING && f->prefill_slot == slot &&
        a->attempt == f->prefill_attempt) {
        /* the node stopped the running attempt on its own: a failed try, writer fenced */
        dispatch_abort_workers(d, f, "prefill stopped", 1);
        retry(d, f, "prefill worker stopped the job", now_ns);
        return;
    }
    tdm_log(TDM_LOG_DEBUG, "dispatch", "stale abort ack dropped: request=%llu attempt=%u",
            (unsigned long long)a->request_id, a->attempt);
}

void router_dispatch_on_message(router_dispatch_t *dispatch, int slot, const Tandem__Envelope *env,
                                uint64_t now_ns)
{
    router_dispatch_t *d = dispatch;

    switch (env->body_case) {
    case TANDEM__ENVELOPE__BODY_PAGE_RESERVATION:
        on_reservation(d, slot, env->page_reservation, now_ns);
        break;
    case TANDEM__ENVELOPE__BODY_COMPLETION:
        on_completion(d, slot, env->completion, now_ns);
        break;
    case TANDEM__ENVELOPE__BODY_TOKEN_CHUNK:
        on_chunk(d, slot, env->token_chunk, now_ns);
        break;
    case TANDEM__ENVELOPE__BODY_FINISH:
        on_finish(d, slot, env->finish, now_ns);
        break;
    case TANDEM__ENVELOPE__BODY_ERROR:
        on_error(d, slot, env->error, now_ns);
        break;
    case TANDEM__ENVELOPE__BODY_ABORT_ACK:
        on_abort_ack(d, slot, env->abort_ack, now_ns);
        break;
    default:
        tdm_log(TDM_LOG_WARN, "dispatch", "unexpected message from worker: type=%s",
                proto_type_name(env->body_case));
        break;
    }
    drain_lost(d, now_ns);
}

void router_dispatch_worker_gone(router_dispatch_t *dispatch, int slot,
                                 router_registry_removal_t removal, const char *why,
                                 uint64_t now_ns)
{
    router_dispatch_t *d = dispatch;
    router_worker_t *w = router_registry_worker(d->registry, slot, 0);
    uint64_t gen;
    uint64_t *ids;
    size_t n_ids;
    size_t n_sessions;

    if (w == NULL) {
        return;
    }
    gen = w->generation;
    dispatch_release_fences_of(d, slot, removal);
    n_sessions = router_sessions_unplace_worker(d->sessions, slot, gen);
    router_registry_remove(d->registry, slot, removal, why);
    tdm_log(TDM_LOG_INFO, "dispatch", "worker sessions unplaced: slot=%d sessions=%zu", slot,
            n_sessions);
    ids = collect_ids(d, &n_ids);
    for (size_t i = 0; i < n_ids; i++) {
        inflight_t *f = dispatch_find(d, ids[i]);
        if (f == NULL) {
            continue;
        }
        if (f->decode_slot == slot && f->decode_gen == gen) {
            f->decode_slot = -1;
            if (f->stage == STAGE_PREFILLING) {
                dispatch_send_abort(d, f->prefill_slot, f->prefill_gen, f->id, f->reservation_id,
                                    f->prefill_attempt, 0, "decode worker lost");
            }
            f->reservation_id = 0;
            retry(d, f, "decode worker lost", now_ns);
        } else if (f->prefill_slot == slot && f->prefill_gen == gen) {
            f->prefill_slot = -1;
            /* a Goodbye comes after the node's last answer (its puts are done); a worker lost
             * without a word may still write: its pages wait for the timer fence */
            dispatch_send_abort(d, f->decode_slot, f->decode_gen, f->id, f->reservation_id,
                                f->attempts + 1, removal == ROUTER_REGISTRY_LEFT,
                                "prefill worker lost");
            f->reservation_id = 0;
            retry(d, f, "prefill worker lost", now_ns);
        }
    }
    free(ids);
    drain_lost(d, now_ns);
}

void router_dispatch_tick(router_dispatch_t *dispatch, uint64_t now_ns)
{
    router_dispatch_t *d = dispatch;
    uint64_t *ids;
    size_t n_ids;

    ids = collect_ids(d, &n_ids);
    for (size_t i = 0; i < n_ids; i++) {
        inflight_t *f = dispatch_find(d, ids[i]);
        if (f == NULL || f->deadline_ns == 0 || now_ns < f->deadline_ns) {
            continue;
        }
        dispatch_abort_workers(d, f, "stage timeout", 0);
        retry(d, f, f->stage == STAGE_RESERVING ? "reservation timeout" : "prefill timeout",
              now_ns);
    }
    free(ids);
    drain_lost(d, now_ns);
}

uint64_t router_dispatch_n_inflight(const router_dispatch_t *dispatch)
{
    return dispatch->n_inflight;
}

void router_dispatch_destroy(router_dispatch_t *dispatch)
{
    uint64_t *ids;
    size_t n_ids;

    if (dispatch == NULL) {
        return;
    }
    ids = collect_ids(dispatch, &n_ids);
    for (size_t i = 0; i < n_ids; i++) {
        inflight_t *f = dispatch_find(dispatch, ids[i]);
        if (f != NULL) {
            dispatch_fail(dispatch, f, TDM_HTTP_UNAVAILABLE, ROUTER_APIERR_OVERLOADED,
                          "shutting_down", "the router is shutting down");
        }
    }
    free(ids);
    router_fences_destroy(dispatch->fences);
    free(dispatch);
}
