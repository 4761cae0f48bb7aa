/* sched.c - turns of the decode node (sched.h). */
#include "decode-node/sched.h"
#include "decode-node/sched_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "decode-node/report.h"
#include "engine/forward.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "kernels/kv_page.h"
#include "transfer/notice.h"

#define IDLE_WAIT_MS   100u
#define RATE_WINDOW_NS (10ull * TDM_NS_PER_S)
#define MSG_BYTES      256

/* ---- messages ------------------------------------------------------------------------ */

static void link_send(void *arg, const Tandem__Envelope *env)
{
    node_link_send(arg, env); /* a failed pack is logged there; the message is dropped */
}

static void link_set_load(void *arg, const node_load_t *load)
{
    node_link_set_load(arg, load);
}

void decode_sched_out_link(node_link_t *link, decode_sched_out_t *out)
{
    out->send = link_send;
    out->set_load = link_set_load;
    out->arg = link;
}

void sched_send_error(decode_sched_t *s, uint64_t request_id, Tandem__ErrorCode code,
                      uint64_t cached_len, const char *message)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Error e = TANDEM__ERROR__INIT;

    e.request_id = request_id;
    e.code = code;
    e.message = (char *)message;
    e.cached_len = cached_len;
    env.body_case = TANDEM__ENVELOPE__BODY_ERROR;
    env.error = &e;
    tdm_log(TDM_LOG_DEBUG, "sched", "error sent: request=%llu code=%s message=\"%s\"",
            (unsigned long long)request_id, proto_error_code_name(code), message);
    s->out.send(s->out.arg, &env);
}

/*
 * send_tokens - tokens[0..n) of r, the first at `position`, in ONE TokenChunk (a speculative
 * step keeps several): their logprobs (logprobs[k]) and, when r asked for alternatives,
 * samples[k]'s top list (samples may be NULL: no alternatives). n <= ENGINE_SPEC_MAX_EMIT.
 */
static void send_tokens(decode_sched_t *s, const req_t *r, uint64_t position, const int32_t *tokens,
                        const engine_sample_t *samples, const float *logprobs, int n)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    Tandem__TopLogprobs top[ENGINE_SPEC_MAX_EMIT];
    Tandem__TopLogprobs *tops[ENGINE_SPEC_MAX_EMIT];
    int32_t top_tokens[ENGINE_SPEC_MAX_EMIT][ENGINE_SAMPLER_MAX_LOGPROBS];
    float top_lps[ENGINE_SPEC_MAX_EMIT][ENGINE_SAMPLER_MAX_LOGPROBS];

    c.request_id = r->id;
    c.choice = r->choice;
    c.first_position = position;
    c.n_tokens = (size_t)n;
    c.tokens = (int32_t *)tokens;
    if (r->sp.n_logprobs >= 0) {
        c.n_logprobs = (size_t)n;
        c.logprobs = (float *)logprobs;
        if (samples != NULL && r->sp.n_logprobs > 0) {
            for (int k = 0; k < n; k++) {
                const engine_sample_t *sample = &samples[k];
                tandem__top_logprobs__init(&top[k]);
                for (int i = 0; i < sample->n_top; i++) {
                    top_tokens[k][i] = sample->top[i].token;
                    top_lps[k][i] = (float)sample->top[i].logprob;
                }
                top[k].n_tokens = (size_t)sample->n_top;
                top[k].tokens = top_tokens[k];
                top[k].n_logprobs = (size_t)sample->n_top;
                top[k].logprobs = top_lps[k];
                tops[k] = &top[k];
            }
            c.n_top = (size_t)n;
            c.top = tops;
        }
    }
    env.body_case = TANDEM__ENVELOPE__BODY_TOKEN_CHUNK;
    env.token_chunk = &c;
    s->out.send(s->out.arg, &env);
}

/* The length of r's session now (what a Finish reports as cached_len). */
static uint64_t held_len(const req_t *r)
{
    return r->session->seq != NULL ? (uint64_t)engine_seq_length(r->session->seq) : 0;
}

/* The Finish of r's turn (plain data: no pointer into r). A grouped choice that ended last
 * reports the group: choice 0's reason and cached_len, every choice's tokens. */
static void finish_of(const req_t *r, Tandem__FinishReason reason, Tandem__Finish *f)
{
    f->request_id = r->id;
    f->reason = r->group != NULL ? r->group->reason : reason;
    f->n_generated = r->group != NULL ? r->group->n_generated : r->n_generated;
    f->cached_len = r->group != NULL ? r->group->cached_len : held_len(r);
    f->n_prefilled = r->group != NULL ? r->group->n_prefilled : r->n_prefilled;
    tdm_log(TDM_LOG_DEBUG, "sched", "finish: request=%llu reason=%s generated=%u cached_len=%llu",
            (unsigned long long)r->id, proto_finish_reason_name(reason), r->n_generated,
            (unsigned long long)f->cached_len);
}

static void send_finish(decode_sched_t *s, const req_t *r, Tandem__FinishReason reason)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__Finish f = TANDEM__FINISH__INIT;

    finish_of(r, reason, &f);
    env.body_case = TANDEM__ENVELOPE__BODY_FINISH;
    env.finish = &f;
    s->out.send(s->out.arg, &env);
}

/* ---- requests ------------------------------------------------------------------------ */

req_t *sched_find_req(decode_sched_t *s, uint64_t id)
{
    for (req_t *r = s->reqs; r != NULL; r = r->next) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

/* r leaves the batch (it stays allocated: free_req); its session becomes idle. */
static void unlink_req(decode_sched_t *s, req_t *r)
{
    req_t **link = &s->reqs;

    while (*link != r) {
        link = &(*link)->next;
    }
    *link = r->next;
    sched_prefill_abandon(r);
    r->session->busy = 0;
    r->session->last_used_ns = tdm_clock_now_ns();
}

static void free_req(req_t *r)
{
    sched_free_fork(r);
    free(r->delta);
    free(r->history);
    engine_constraint_destroy(r->constraint);
    free(r);
}

/* Forget r (no Finish); its session becomes idle. A grouped choice leaves its group (freed with
 * its last choice). */
static void end_req(decode_sched_t *s, req_t *r)
{
    unlink_req(s, r);
    if (r->group != NULL &&
        sched_group_end(r, TANDEM__FINISH_REASON__FINISH_ABORTED, held_len(r))) {
        free(r->group);
    }
    free_req(r);
}

/*
 * evicted_for_retry - after an operation that returned `status`: when it ran out of pages and
 * an idle session could leave the pool to free some (sched_tier_evict: the highest-scored one,
 * demoted to the tiers or dropped), count the eviction and
 * return 1 (run the operation again); else 0. Every page-hungry step of the scheduler retries
 * through this one rule.
 */
int sched_evicted_for_retry(decode_sched_t *s, tdm_status_t status)
{
    if (status != TDM_ERR_NO_PAGES || !sched_tier_evict(s)) {
        return 0;
    }
    s->stats.evictions_total++;
    return 1;
}

/*
 * end_turn - r's turn ends with `reason`: r leaves the batch, sched_publish() puts the counters
 * that include the turn (its tokens, speculative steps, local prefill or handoff, an abort) where
 * /metrics reads them, and only then do its last chunk (tokens[0..n), the first at `position`;
 * n = 0: none) and its Finish go out; r is freed. The router answers the client on the last
 * token (its stream reaching max_tokens or a stop id) or on the Finish, so in this order whoever
 * saw a turn end reads that turn on /metrics; sent first, the counters lagged until the end of
 * the step (publish in decode_sched_step), a window a loaded host widens.
 */
static void end_turn(decode_sched_t *s, req_t *r, Tandem__FinishReason reason, uint64_t position,
                     const int32_t *tokens, const engine_sample_t *samples, const float *logprobs,
                     int n)
{
    int last = 1;

    unlink_req(s, r);
    if (r->group != NULL) {
        last = sched_group_end(r, reason, held_len(r));
    }
    sched_publish(s);
    if (n > 0) {
        send_tokens(s, r, position, tokens, samples, logprobs, n);
    }
    if (last && (r->group == NULL || !r->group->failed)) {
        send_finish(s, r, reason);
    }
    if (last) {
        free(r->group);
    }
    free_req(r);
}

void sched_finish_req(decode_sched_t *s, req_t *r, Tandem__FinishReason reason)
{
    end_turn(s, r, reason, 0, NULL, NULL, NULL, 0);
}

void sched_end_req(decode_sched_t *s, req_t *r)
{
    end_req(s, r);
}

static tdm_status_t sampling_from(const decode_sched_t *s, const Tandem__SamplingParams *in,
                                  engine_sampler_params_t *sp, char *err, size_t err_bytes)
{
    engine_sampler_params_default(sp);
    if (in != NULL) {
        sp->temperature = in->temperature;
        sp->top_k = in->top_k;
        sp->top_p = in->top_p == 0.0 ? 1.0 : in->top_p;
        sp->min_p = in->min_p;
        sp->seed = in->seed;
        sp->n_logprobs = in->n_logprobs > ENGINE_SAMPLER_MAX_LOGPROBS ? ENGINE_SAMPLER_MAX_LOGPROBS
                                                                      : in->n_logprobs;
        for (size_t i = 0; i < in->n_stop_token_ids && i < ENGINE_SAMPLER_MAX_STOP_IDS; i++) {
            sp->stop_ids[sp->n_stop_ids++] = in->stop_token_ids[i];
        }
    }
    return engine_sampler_params_validate(sp, s->cfg->vocab_size, err, err_bytes);
}

/* The drafter of a request: its spec field, else the node's; OFF on a node without a
 * speculative context (plain decode gives the same tokens). */
static tdm_status_t drafter_from(const decode_sched_t *s, const char *name,
                                 engine_spec_drafter_t *drafter_out, const char **why)
{
    engine_spec_drafter_t d = s->params.spec_drafter;

    if (name != NULL && name[0] != '\0' && engine_spec_drafter_parse(name, &d) != TDM_OK) {
        *why = "spec must be off, dspark or ngram";
        return TDM_ERR_INVALID_ARG;
    }
    if (d == ENGINE_SPEC_DSPARK && s->cfg->n_blocks == 0) {
        *why = "spec dspark: the model has no DSpark blocks";
        return TDM_ERR_INVALID_ARG;
    }
    *drafter_out = s->spec != NULL ? d : ENGINE_SPEC_OFF;
    return TDM_OK;
}

/*
 * emit - tokens[0..n) freshly chosen for r, the first at `position` (one step's: one token, or
 * what a speculative step kept): count them, note them in the session's history (and, when
 * to_history, in the n-gram drafter's: speculative steps), stop at the first that ends the turn,
 * and send the kept ones in one TokenChunk. samples may be NULL (no top alternatives);
 * logprobs[k] is token k's. A turn's last chunk goes out through end_turn (after the counters
 * that include the turn). Returns 1 when r was finished (and freed).
 */
static void fail_req(decode_sched_t *s, req_t *r, tdm_status_t status);

static int emit(decode_sched_t *s, req_t *r, uint64_t position, const int32_t *tokens,
                const engine_sample_t *samples, const float *logprobs, int n, int to_history)
{
    Tandem__FinishReason reason = TANDEM__FINISH_REASON__FINISH_UNSPECIFIED;
    int used = 0;

    while (used < n && reason == TANDEM__FINISH_REASON__FINISH_UNSPECIFIED) {
        int32_t token = tokens[used];
        uint64_t q = position + (uint64_t)used;

        /* every token was sampled under the mask, so this only refuses a first token that a
         * prefill node chose without the constraint (a node of an older build) */
        if (r->constraint != NULL && engine_constraint_advance(r->constraint, token) != TDM_OK) {
            tdm_log(TDM_LOG_ERROR, "sched",
                    "token outside the response_format: request=%llu token=%d position=%llu",
                    (unsigned long long)r->id, (int)token, (unsigned long long)q);
            fail_req(s, r, TDM_ERR_INTERNAL);
            return 1;
        } /* the history a later rewind replays from; a failed record only shortens it */
        (void)decode_sessions_note_ids(r->session, (int64_t)q, &token, 1);
        if (to_history && r->history != NULL) {
            r->history[r->n_history++] = token;
        }
        r->n_generated++;
        r->last_token = token;
        s->rate_tokens++;
        s->stats.generated_tokens_total++;
        used++;
        if (engine_sampler_is_stop(&r->sp, token)) {
            reason = TANDEM__FINISH_REASON__FINISH_STOP_TOKEN;
        } else if (r->n_generated >= r->max_tokens) {
            reason = TANDEM__FINISH_REASON__FINISH_LENGTH;
        } else if ((int64_t)q + 1 >= s->cfg->max_position_embeddings) {
            reason = TANDEM__FINISH_REASON__FINISH_CONTEXT;
        }
    }
    if (reason == TANDEM__FINISH_REASON__FINISH_UNSPECIFIED) {
        send_tokens(s, r, position, tokens, samples, logprobs, used);
        r->phase = REQ_RUNNING;
        return 0;
    }
    end_turn(s, r, reason, position, tokens, samples, logprobs, used);
    return 1;
}

void sched_note_min_tokens(req_t *r)
{
    r->sp.suppress_stop = r->n_generated < r->min_tokens;
}

/* emit() of one token (a plain decode step, a prefill's or handoff's first token). */
int sched_emit_one(decode_sched_t *s, req_t *r, uint64_t position, int32_t token,
                   const engine_sample_t *sample, float logprob)
{
    return emit(s, r, position, &token, sample, &logprob, 1, 0);
}

/* ---- handlers ------------------------------------------------------------------------ */

req_t *sched_new_req(decode_sched_t *s, const Tandem__DecodeRequest *dr, decode_session_t *session)
{
    char err[MSG_BYTES] = "";
    const char *why = NULL;
    req_t *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_INTERNAL, 0, "out of memory");
        return NULL;
    }
    if (drafter_from(s, dr->spec, &r->drafter, &why) != TDM_OK) {
        sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE, 0, why);
        free(r);
        return NULL;
    }
    if (sampling_from(s, dr->sampling, &r->sp, err, sizeof(err)) != TDM_OK || dr->max_tokens == 0) {
        sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE, 0,
                         dr->max_tokens == 0 ? "max_tokens is 0" : err);
        free(r);
        return NULL;
    }
    if (dr->sampling != NULL &&
        engine_constraint_create_request(s->params.constrain_vocab, dr->sampling->response_format,
                                         dr->sampling->tool_calls, r->sp.stop_ids, r->sp.n_stop_ids,
                                         &r->constraint, err, sizeof(err)) != TDM_OK) {
        sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE, 0, err);
        free(r);
        return NULL;
    }
    r->id = dr->request_id;
    r->session = session;
    session->tenant = dr->tenant; /* what SessionHistory reports (report.h) */
    session->prompt_len = dr->total_len;
    r->max_tokens = dr->max_tokens;
    r->min_tokens = dr->sampling != NULL ? dr->sampling->min_tokens : 0;
    r->n_choices =
        dr->sampling != NULL && dr->sampling->n_choices > 1 ? dr->sampling->n_choices : 1;
    r->canonical = dr->canonical_start;
    session->busy = 1;
    r->next = s->reqs;
    s->reqs = r;
    s->stats.requests_total++;
    return r;
}

/*
 * MODEL.md 6(d)(2): cut the session's sequence back to its first p positions (0 < p < held,
 * p <= the recorded ids) and replay every layer's rings and the DSpark taps at p from the
 * recorded ids, so that a prompt sharing only p tokens with the history continues from there
 * instead of from 0. Returns TDM_OK, TDM_ERR_UNSUPPORTED (p out of that range: nothing changed)
 * or the engine's status (the state is dropped).
 */
tdm_status_t sched_rewind_session(decode_sched_t *s, decode_session_t *session, int64_t p)
{
    int64_t held = session->seq != NULL ? engine_seq_length(session->seq) : 0;
    tdm_status_t status;

    if (p <= 0 || p >= held || p > session->n_ids) {
        return TDM_ERR_UNSUPPORTED;
    }
    status = engine_seq_truncate(session->seq, p);
    if (status == TDM_OK) {
        status =
            engine_fwd_replay(s->fwd, session->seq, session->ids, p, ENGINE_REPLAY_RECOVERY, NULL);
    }
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "sched", "rewind failed: session=%s held=%lld p=%lld status=%s",
                session->id, (long long)held, (long long)p, tdm_status_name(status));
        decode_sessions_drop_state(session);
        return status;
    }
    decode_sessions_forget_ids_from(session, p);
    s->stats.rewinds_total++;
    s->stats.rewind_kept_tokens_total += (uint64_t)p;
    tdm_log(TDM_LOG_DEBUG, "sched", "rewound: session=%s held=%lld kept=%lld", session->id,
            (long long)held, (long long)p);
    return TDM_OK;
}

/* The longest prefix <= want of the session that a rewind can rebuild (0: none). */
int64_t sched_rewind_target(const decode_session_t *session, int64_t want)
{
    int64_t held = session->seq != NULL ? engine_seq_length(session->seq) : 0;
    int64_t p = want < session->n_ids ? want : session->n_ids;

    return p > 0 && p < held ? p : 0;
}

static void on_local(decode_sched_t *s, const Tandem__DecodeRequest *dr)
{
    decode_session_t *session = decode_sessions_get(s->sessions, dr->session_id);
    int64_t rewind_to = 0;
    uint64_t held;
    req_t *r;

    if (session == NULL || session->busy) {
        sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_BUSY, 0,
                         session == NULL ? "session table full" : "session busy");
        return;
    }
    sched_tier_on_turn(s, session); /* a demoted state comes back first */
    for (size_t i = 0; i < dr->n_delta_tokens; i++) {
        if (dr->delta_tokens[i] >= s->cfg->vocab_size) {
            sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE, 0,
                             "token id outside the vocabulary");
            return;
        }
    }
    /* a new session sharing another's prefix (prefix_session_id): sched_prefix.c */
    (void)sched_prefix_share(s, session, dr->prefix_session_id, dr->cached_len, dr->prefix_ids,
                             dr->n_prefix_ids);
    held = session->seq != NULL ? (uint64_t)engine_seq_length(session->seq) : 0;
    if (held > dr->cached_len && dr->cached_len > 0) {
        /* The prompt shares only cached_len tokens with what the node holds: rewind to the
         * longest prefix <= cached_len it can rebuild (docs/PROTOCOL.md 3c), as the turn's first
         * piece between decode steps (sched_prefill.c); when that prefix is shorter than
         * cached_len the turn then ends with STATE_LOST at it (the router retries from there). */
        rewind_to = sched_rewind_target(session, (int64_t)dr->cached_len);
    }
    if (rewind_to == 0 && held != dr->cached_len) {
        /* Nothing to continue from: drop the state and have the router resend from 0
         * (docs/PROTOCOL.md 3c). */
        decode_sessions_drop_state(session);
        if (dr->cached_len != 0) {
            s->stats.state_lost_total++;
            sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_STATE_LOST, 0,
                             "session state not held at cached_len");
            return;
        }
    }
    if (session->seq == NULL &&
        engine_seq_create(s->model, decode_pool_engine(s->pool), &session->seq) != TDM_OK) {
        sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_INTERNAL, 0, "no memory");
        return;
    }
    r = sched_new_req(s, dr, session);
    if (r == NULL) {
        return;
    }
    r->delta = malloc(dr->n_delta_tokens * sizeof(int32_t));
    if (r->delta == NULL) {
        sched_send_error(s, r->id, TANDEM__ERROR_CODE__ERROR_INTERNAL, 0, "no memory");
        end_req(s, r);
        return;
    }
    memcpy(r->delta, dr->delta_tokens, dr->n_delta_tokens * sizeof(int32_t));
    r->n_delta = (int64_t)dr->n_delta_tokens;
    r->rewind_to = rewind_to;
    r->rewind_lost = rewind_to > 0 && (uint64_t)rewind_to < dr->cached_len;
    r->phase = REQ_PREFILL;
}

void decode_sched_router_changed(decode_sched_t *s)
{
    uint32_t n = decode_pool_lapse_all(s->pool, tdm_clock_now_ns());

    tdm_log(n > 0 ? TDM_LOG_WARN : TDM_LOG_INFO, "sched",
            "registered again with the router: %u reservation(s) of the old registration lapse now",
            n);
}

uint32_t decode_sched_abort_where(decode_sched_t *s, int (*pick)(void *arg, uint64_t id), void *arg)
{
    uint32_t n = 0, n_reqs = 0;
    req_t *r;

    for (r = s->reqs; r != NULL; r = r->next) {
        n_reqs++;
    }
    /* one at a time: an abort ends every choice of its request and changes the list */
    for (uint32_t pass = 0; pass < n_reqs && (r = s->reqs) != NULL; pass++) {
        Tandem__Abort a = TANDEM__ABORT__INIT;

        while (r != NULL && !pick(arg, r->id)) {
            r = r->next;
        }
        if (r == NULL) {
            break;
        }
        a.request_id = r->id;
        a.reason = (char *)"its router is gone";
        sched_on_abort(s, &a);
        n++;
    }
    return n;
}

void decode_sched_drain(decode_sched_t *s)
{
    if (!s->draining) {
        s->draining = 1;
        tdm_log(TDM_LOG_INFO, "sched", "draining: admitting nothing new; running=%u reserved=%u",
                s->stats.running_sequences + s->stats.pending_prefills,
                decode_pool_n_reserved(s->pool));
    }
}

int decode_sched_idle(const decode_sched_t *s)
{
    return s->reqs == NULL && decode_pool_n_reserved(s->pool) == 0;
}

/* While draining: does this DecodeRequest complete a reservation granted before (admitted)? */
static int completes_reservation(decode_sched_t *s, const Tandem__DecodeRequest *dr)
{
    decode_resv_t *resv;

    if (dr->mode != TANDEM__PREFILL_MODE__PREFILL_REMOTE || dr->handoff == NULL) {
        return 0;
    }
    resv = decode_pool_find(s->pool, dr->handoff->reservation_id);
    return resv != NULL && resv->state == DECODE_RESV_ACTIVE;
}

void decode_sched_on_message(decode_sched_t *s, const Tandem__Envelope *env)
{
    switch (env->body_case) {
    case TANDEM__ENVELOPE__BODY_DECODE_REQUEST:
        if (s->draining && !completes_reservation(s, env->decode_request)) {
            sched_send_error(s, env->decode_request->request_id, TANDEM__ERROR_CODE__ERROR_DRAINING,
                             0, "decode node draining: place the turn elsewhere");
        } else if (sched_find_req(s, env->decode_request->request_id) != NULL) {
            sched_send_error(s, env->decode_request->request_id,
                             TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE, 0,
                             "request id already running");
        } else if (env->decode_request->mode == TANDEM__PREFILL_MODE__PREFILL_REMOTE) {
            sched_on_remote(s, env->decode_request);
        } else {
            on_local(s, env->decode_request);
        }
        break;
    case TANDEM__ENVELOPE__BODY_RESERVE_PAGES:
        if (s->draining) {
            sched_send_error(s, env->reserve_pages->request_id, TANDEM__ERROR_CODE__ERROR_DRAINING,
                             0, "decode node draining: place the turn elsewhere");
        } else {
            sched_on_reserve(s, env->reserve_pages);
        }
        break;
    case TANDEM__ENVELOPE__BODY_ABORT:
        sched_on_abort(s, env->abort);
        break;
    case TANDEM__ENVELOPE__BODY_SESSION_QUERY: {
        /* a router re-learning the session asks what this node holds of it (report.h) */
        Tandem__Envelope out = TANDEM__ENVELOPE__INIT;
        Tandem__SessionHistory h;

        decode_report_history(s->sessions, env->session_query, &h);
        out.body_case = TANDEM__ENVELOPE__BODY_SESSION_HISTORY;
        out.session_history = &h;
        s->out.send(s->out.arg, &out);
        break;
    }
    default:
        tdm_log(TDM_LOG_WARN, "sched", "unexpected message: type=%s",
                proto_type_name(env->body_case));
        break;
    }
}

/* ---- compute ------------------------------------------------------------------------- */

static void fail_req(decode_sched_t *s, req_t *r, tdm_status_t status)
{
    tdm_log(TDM_LOG_ERROR, "sched", "request failed: request=%llu choice=%u status=%s",
            (unsigned long long)r->id, r->choice, tdm_status_name(status));
    /* one Error per request: a grouped choice's siblings run on until the router's Abort */
    if (r->group == NULL || !r->group->failed) {
        sched_send_error(s, r->id,
                         status == TDM_ERR_NO_PAGES ? TANDEM__ERROR_CODE__ERROR_NO_PAGES
                                                    : TANDEM__ERROR_CODE__ERROR_INTERNAL,
                         0, tdm_status_message(status));
    }
    if (r->group != NULL) {
        r->group->failed = 1;
    }
    if (status != TDM_ERR_NO_PAGES) {
        decode_sessions_drop_state(r->session);
    }
    end_req(s, r);
}

/* fail_req for every request of a batch whose engine step failed as a whole. */
static void fail_batch(decode_sched_t *s, req_t *const *batch, int n, tdm_status_t status)
{
    for (int i = 0; i < n; i++) {
        fail_req(s, batch[i], status);
    }
}

void sched_fail_req(decode_sched_t *s, req_t *r, tdm_status_t status)
{
    fail_req(s, r, status);
}

/* The n-gram drafter's history of r, made once before r first decodes: the turn's local delta
 * when r still holds it and it is longer than what the sequence keeps, else the sequence's kept
 * ids (the last W + N - 1 committed); then the anchor. Every emitted id is appended after. */
tdm_status_t sched_make_history(decode_sched_t *s, req_t *r)
{
    int64_t n_left = (int64_t)(r->max_tokens - r->n_generated);
    int use_delta = r->delta != NULL && r->n_delta > s->n_ids_cap;
    int64_t cap;

    if (n_left > s->cfg->max_position_embeddings) {
        n_left = s->cfg->max_position_embeddings;
    }
    cap = (use_delta ? r->n_delta : s->n_ids_cap) + 1 + n_left;
    r->history = malloc((size_t)cap * sizeof(int32_t));
    if (r->history == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (use_delta) {
        memcpy(r->history, r->delta, (size_t)r->n_delta * sizeof(int32_t));
        r->n_history = r->n_delta;
    } else {
        r->n_history = decode_sessions_last_ids(r->session, r->history, s->n_ids_cap);
    }
    r->history[r->n_history++] = r->last_token;
    return TDM_OK;
}

/*
 * 1 when every request of the batch takes the argmax of its raw logits and asks for nothing else
 * of them: greedy (engine_sampler_is_greedy), no logprobs, no constraint, no stop ids masked by
 * min_tokens (sched_note_min_tokens ran). engine_sampler_sample then returns the lowest id with
 * the largest logit and logprob 0, which is what engine_fwd_decode_greedy computes on the
 * backend, so only the tokens need leave it (on a GPU: n ids instead of n x V floats).
 */
static int batch_is_plain_greedy(req_t *const *batch, int n)
{
    for (int i = 0; i < n; i++) {
        const req_t *r = batch[i];
        if (!engine_sampler_is_greedy(&r->sp) || r->sp.n_logprobs != ENGINE_SAMPLER_LOGPROBS_OFF ||
            r->sp.suppress_stop || r->constraint != NULL) {
            return 0;
        }
    }
    return 1;
}

/* One decode step of a batch_is_plain_greedy batch: the tokens from the backend's argmax. */
static void run_greedy(decode_sched_t *s, req_t *const *batch, engine_seq_t *const *seqs,
                       const int32_t *ids, int n)
{
    int32_t tokens[ENGINE_FWD_MAX_BATCH];
    tdm_status_t status;

    do {
        status = engine_fwd_decode_greedy(s->fwd, seqs, ids, n, tokens);
    } while (sched_evicted_for_retry(s, status));
    if (status != TDM_OK) {
        fail_batch(s, batch, n, status);
        return;
    }
    s->stats.greedy_steps_total++;
    for (int i = 0; i < n; i++) {
        engine_sample_t sample;

        if (tokens[i] < 0) { /* a NaN, +inf or no finite logit: this request alone fails */
            tdm_log(TDM_LOG_WARN, "sched", "greedy step: no finite logit: request=%llu",
                    (unsigned long long)batch[i]->id);
            fail_req(s, batch[i], TDM_ERR_INTERNAL);
            continue;
        }
        memset(&sample, 0, sizeof(sample));
        sample.token = tokens[i]; /* logprob 0, no alternatives: as the sampler with them off */
        sched_emit_one(s, batch[i], (uint64_t)engine_seq_length(batch[i]->session->seq), tokens[i],
                       &sample, 0.0f);
    }
}

/* One engine_spec_step over batch[0..n): draft, verify in one pass, stream what each kept. */
static void run_spec(decode_sched_t *s, req_t **batch, int n)
{
    engine_spec_req_t reqs[ENGINE_FWD_MAX_BATCH];
    int64_t anchor_pos[ENGINE_FWD_MAX_BATCH];
    tdm_status_t status;

    memset(reqs, 0, (size_t)n * sizeof(reqs[0]));
    for (int i = 0; i < n; i++) {
        req_t *r = batch[i];
        int64_t a = engine_seq_length(r->session->seq);
        int64_t max_emit = (int64_t)(r->max_tokens - r->n_generated);

        /* emit() ends the turn at the context limit: a + 1 + k + 1 >= max_position_embeddings */
        if (max_emit > s->cfg->max_position_embeddings - a - 1) {
            max_emit = s->cfg->max_position_embeddings - a - 1;
        }
        if (max_emit > ENGINE_SPEC_MAX_EMIT) {
            max_emit = ENGINE_SPEC_MAX_EMIT;
        }
        /* a step below min_tokens stays below it: the mask holds for every token it keeps */
        if (r->n_generated < r->min_tokens &&
            max_emit > (int64_t)(r->min_tokens - r->n_generated)) {
            max_emit = (int64_t)(r->min_tokens - r->n_generated);
        }
        sched_note_min_tokens(r);
        anchor_pos[i] = a;
        reqs[i].seq = r->session->seq;
        reqs[i].anchor = r->last_token;
        reqs[i].drafter = r->drafter;
        reqs[i].sampling = &r->sp;
        reqs[i].constraint = r->constraint;
        reqs[i].history = r->history;
        reqs[i].n_history = r->n_history;
        reqs[i].max_emit = max_emit < 1 ? 1 : (int)max_emit;
    }
    do {
        status = engine_spec_step(s->spec, reqs, n, s->spec_results);
    } while (sched_evicted_for_retry(s, status));
    if (status != TDM_OK) {
        fail_batch(s, batch, n, status);
        return;
    }
    for (int i = 0; i < n; i++) {
        req_t *r = batch[i];
        const engine_spec_result_t *res = &s->spec_results[i];

        int32_t toks[ENGINE_SPEC_MAX_EMIT];
        float lps[ENGINE_SPEC_MAX_EMIT];
        for (int k = 0; k < res->n_emitted; k++) {
            toks[k] = res->samples[k].token;
            lps[k] = (float)res->samples[k].logprob;
        }
        if (res->n_emitted > 0) { /* every kept token in one chunk */
            emit(s, r, (uint64_t)(anchor_pos[i] + 1), toks, res->samples, lps, res->n_emitted, 1);
        }
    }
}

static void run_decode(decode_sched_t *s)
{
    engine_seq_t *seqs[ENGINE_FWD_MAX_BATCH];
    int32_t ids[ENGINE_FWD_MAX_BATCH];
    req_t *batch[ENGINE_FWD_MAX_BATCH];
    req_t *next;
    int n = 0;
    tdm_status_t status;

    for (req_t *r = s->reqs; r != NULL && n < (int)s->params.max_batch; r = next) {
        next = r->next;
        if (r->phase != REQ_RUNNING) {
            continue;
        }
        if (r->drafter == ENGINE_SPEC_NGRAM && r->history == NULL) {
            status = sched_make_history(s, r);
            if (status != TDM_OK) {
                fail_req(s, r, status);
                continue;
            }
        }
        sched_note_min_tokens(r);
        batch[n] = r;
        seqs[n] = r->session->seq;
        ids[n] = r->last_token;
        n++;
    }
    if (n == 0) {
        return;
    }
    if (s->spec != NULL) {
        run_spec(s, batch, n);
        return;
    }
    if (batch_is_plain_greedy(batch, n)) {
        run_greedy(s, batch, seqs, ids, n);
        return;
    }
    do {
        status = engine_fwd_decode(s->fwd, seqs, ids, n, s->logits);
    } while (sched_evicted_for_retry(s, status));
    if (status != TDM_OK) {
        fail_batch(s, batch, n, status);
        return;
    }
    for (int i = 0; i < n; i++) {
        req_t *r = batch[i];
        float *row = s->logits + (size_t)i * (size_t)s->cfg->vocab_size;
        int64_t q = engine_seq_length(r->session->seq);
        engine_sample_t sample;

        status = r->constraint == NULL
                     ? TDM_OK
                     : engine_constraint_apply(r->constraint, row, s->cfg->vocab_size);
        if (status == TDM_OK) {
            status = engine_sampler_sample(&r->sp, row, s->cfg->vocab_size, q, &s->arena, &sample);
        }
        if (status != TDM_OK) {
            fail_req(s, r, status);
            continue;
        }
        sched_emit_one(s, r, (uint64_t)q, sample.token, &sample, (float)sample.logprob);
    }
}

void sched_publish(decode_sched_t *s)
{
    uint64_t now = tdm_clock_now_ns();
    decode_stats_t st;
    node_load_t load;

    if (now - s->rate_t0_ns >= RATE_WINDOW_NS) {
        s->stats.recent_tokens_per_s =
            (double)s->rate_tokens * TDM_NS_PER_S / (double)(now - s->rate_t0_ns);
        s->rate_t0_ns = now;
        s->rate_tokens = 0;
    }
    s->stats.running_sequences = 0;
    s->stats.pending_prefills = 0;
    s->stats.queued_prefill_tokens = 0;
    for (req_t *r = s->reqs; r != NULL; r = r->next) {
        if (r->phase == REQ_RUNNING) {
            s->stats.running_sequences++;
        } else {
            s->stats.pending_prefills++;
            s->stats.queued_prefill_tokens += (uint64_t)(r->n_delta - r->n_done);
        }
    }
    s->stats.free_pages = decode_pool_n_free(s->pool);
    s->stats.total_pages = decode_pool_n_total(s->pool);
    s->stats.reserved_pages = decode_pool_n_reserved(s->pool);
    if (s->params.notices != NULL) {
        decode_notices_stats(s->params.notices, &s->stats.notices);
    }
    s->stats.resident_sessions = decode_sessions_n_resident(s->sessions);
    s->stats.session_pages = decode_sessions_n_pages(s->sessions);
    decode_tier_stats(s->params.tier, &s->stats.tier);
    s->stats.shared_pages = engine_kv_pool_n_shared(decode_pool_engine(s->pool));
    s->stats.shared_page_refs = engine_kv_pool_n_extra_refs(decode_pool_engine(s->pool));
    s->stats.staged_pages_total = node_pages_n_downloaded(decode_pool_pages(s->pool));
    for (int d = 0; d < ENGINE_SPEC_N_DRAFTERS && s->spec != NULL; d++) {
        engine_spec_metrics(s->spec, (engine_spec_drafter_t)d, &s->stats.spec[d]);
    }
    st = s->stats;
    pthread_mutex_lock(&s->stats_lock);
    s->shared = st;
    pthread_mutex_unlock(&s->stats_lock);
    load.queued_prefill_tokens = st.queued_prefill_tokens;
    load.running_sequences = st.running_sequences;
    load.free_pages = st.free_pages;
    load.total_pages = st.total_pages;
    load.reserved_pages = st.reserved_pages;
    load.resident_sessions = st.resident_sessions;
    load.recent_tokens_per_s = st.recent_tokens_per_s;
    s->out.set_load(s->out.arg, &load);
}

/* The rows the step's decode runs: one per running sequence (max_batch at most), each with its
 * drafts' verify rows under a drafter. */
static int64_t decode_rows(const decode_sched_t *s)
{
    int64_t n = 0;

    for (const req_t *r = s->reqs; r != NULL; r = r->next) {
        n += r->phase == REQ_RUNNING;
    }
    if (n > (int64_t)s->params.max_batch) {
        n = (int64_t)s->params.max_batch;
    }
    return s->spec != NULL ? n * (int64_t)(s->params.spec.max_drafts + 1) : n;
}

uint32_t decode_sched_step(decode_sched_t *s)
{
    uint64_t next_ns;
    uint32_t wait_ms = IDLE_WAIT_MS;

    decode_sched_join_notices(s);
    next_ns =
        decode_pool_expire(s->pool, tdm_clock_now_ns(), s->params.fence_ms, sched_on_lapse, s);
    sched_prefill_step(s, decode_rows(s));
    run_decode(s);
    sched_publish(s);
    if (s->reqs != NULL) {
        wait_ms = 0;
    }
    if (wait_ms > 0 && next_ns != UINT64_MAX && next_ns / TDM_NS_PER_MS + 1 < wait_ms) {
        wait_ms = (uint32_t)(next_ns / TDM_NS_PER_MS) + 1;
    }
    return wait_ms;
}

void decode_sched_stats(decode_sched_t *s, decode_stats_t *stats_out)
{
    pthread_mutex_lock(&s->stats_lock);
    *stats_out = s->shared;
    pthread_mutex_unlock(&s->stats_lock);
}

tdm_status_t decode_sched_create(const decode_sched_params_t *params, const engine_model_t *model,
                                 decode_pool_t *pool, decode_sessions_t *sessions,
                                 const decode_sched_out_t *out, decode_sched_t **sched_out)
{
    decode_sched_t *s;
    engine_fwd_params_t fp;
    tdm_status_t status;

    if (out == NULL || out->send == NULL || out->set_load == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    s->params = *params;
    if (s->params.max_batch == 0 || s->params.max_batch > ENGINE_FWD_MAX_BATCH) {
        s->params.max_batch = ENGINE_FWD_MAX_BATCH;
    }
    s->model = model;
    s->cfg = engine_model_config(model);
    s->pool = pool;
    s->sessions = sessions;
    s->out = *out;
    s->rate_t0_ns = tdm_clock_now_ns();
    pthread_mutex_init(&s->stats_lock, NULL);
    engine_fwd_params_default(model, &fp);
    if (params->chunk_tokens > 0) {
        fp.max_chunk_tokens = params->chunk_tokens;
    }
    if (params->n_threads > 0) {
        fp.n_threads = params->n_threads;
    }
    if (fp.max_chunk_tokens < (int64_t)s->params.max_batch) {
        fp.max_chunk_tokens = s->params.max_batch;
    }
    if (s->params.spec_drafter != ENGINE_SPEC_OFF) {
        /* engine_spec_create: the context holds max_batch * (max_drafts + 1) verify rows */
        int64_t rows = (int64_t)s->params.max_batch * (s->params.spec.max_drafts + 1);
        s->params.spec.max_batch = (int)s->params.max_batch;
        if (fp.max_chunk_tokens < rows) {
            fp.max_chunk_tokens = rows;
        }
    }
    s->n_ids_cap = s->cfg->sliding_window +
                   (s->cfg->engram_max_ngram_size > 0 ? s->cfg->engram_max_ngram_size - 1 : 0);
    s->logits = malloc((size_t)s->params.max_batch * (size_t)s->cfg->vocab_size * sizeof(float));
    s->ids = malloc((size_t)(s->n_ids_cap + 1) * sizeof(int32_t));
    status = s->logits == NULL || s->ids == NULL ? TDM_ERR_NO_MEMORY : TDM_OK;
    if (status == TDM_OK) {
        status = tdm_arena_init(&s->arena, engine_sampler_scratch_bytes(s->cfg->vocab_size));
    }
    if (status == TDM_OK) {
        status = engine_fwd_create(model, decode_pool_engine(pool), &fp, &s->fwd);
    }
    if (status == TDM_OK && s->params.spec_drafter != ENGINE_SPEC_OFF) {
        s->spec_results = calloc(s->params.max_batch, sizeof(*s->spec_results));
        status = s->spec_results == NULL ? TDM_ERR_NO_MEMORY
                                         : engine_spec_create(s->fwd, &s->params.spec, &s->spec);
    }
    if (status != TDM_OK) {
        decode_sched_destroy(s);
        return status;
    }
    *sched_out = s;
    return TDM_OK;
}

void decode_sched_destroy(decode_sched_t *s)
{
    if (s == NULL) {
        return;
    }
    while (s->reqs != NULL) {
        sched_prefill_abandon(s->reqs); /* the Finish says no half-prefilled state is held */
        send_finish(s, s->reqs, TANDEM__FINISH_REASON__FINISH_ABORTED);
        end_req(s, s->reqs);
    }
    engine_spec_destroy(s->spec);
    free(s->spec_results);
    engine_fwd_destroy(s->fwd);
    tdm_arena_fini(&s->arena);
    free(s->logits);
    free(s->ids);
    pthread_mutex_destroy(&s->stats_lock);
    free(s);
}
