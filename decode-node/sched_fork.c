/* sched_fork.c - the choices of a request with n_choices > 1 (sched_impl.h: sched_start_choices).
 *
 * The prompt is prefilled once (locally, or by a prefill node into a reservation). Choice 0 keeps
 * the session's sequence; each other choice gets a copy of it at T, made by exporting the
 * sequence with its pages and importing the blob into fresh pages of the same pool: the KV is
 * copied, never recomputed. The engine's block tables own their pages outright (no reference
 * counts, engine/kv_cache.h), so the full pages cannot be shared between the copies; a copy
 * costs one memcpy of the session's pages and as many pages again. A fork lives in a private
 * decode_session_t (not in the session table: nothing else can find, evict or continue it) and
 * its sequence is destroyed when the choice ends; the session continues choice 0.
 */
#include "decode-node/sched_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

void sched_free_fork(req_t *r)
{
    if (r->own == NULL) {
        return;
    }
    engine_seq_destroy(r->own->seq);
    free(r->own->ids);
    free(r->own);
    r->own = NULL;
}

int sched_group_end(req_t *r, Tandem__FinishReason reason, uint64_t cached_len)
{
    req_group_t *g = r->group;

    g->n_generated += r->n_generated;
    if (r->choice == 0) {
        g->reason = reason;
        g->cached_len = cached_len;
        g->n_prefilled = r->n_prefilled;
    }
    g->n_live--;
    return g->n_live == 0;
}

/* A new sequence from `blob` (the exported sequence with its pages) in fresh pages of the same
 * pool, evicting idle sessions when short. */
static tdm_status_t copy_seq(decode_sched_t *s, const uint8_t *blob, size_t n_blob,
                             engine_seq_t **copy_out)
{
    tdm_status_t status;

    do {
        status = engine_seq_import(s->model, decode_pool_engine(s->pool), blob, n_blob, copy_out);
    } while (sched_evicted_for_retry(s, status));
    return status;
}

/* A fork of r for choice c on a copy of r's sequence; NULL (status set) on failure. */
static req_t *new_fork(decode_sched_t *s, req_t *r, uint32_t c, const uint8_t *blob, size_t n_blob,
                       tdm_status_t *status)
{
    req_t *f = calloc(1, sizeof(*f));
    decode_session_t *own = calloc(1, sizeof(*own));

    if (f == NULL || own == NULL) {
        free(f);
        free(own);
        *status = TDM_ERR_NO_MEMORY;
        return NULL;
    }
    *status = copy_seq(s, blob, n_blob, &own->seq);
    if (*status == TDM_OK && r->constraint != NULL) {
        /* each choice walks its own constraint state (all start where r's is: before the first
         * token, whose logits r's mask already covered) */
        *status = engine_constraint_clone(r->constraint, &f->constraint);
        if (*status != TDM_OK) {
            engine_seq_destroy(own->seq);
        }
    }
    if (*status != TDM_OK) {
        free(f);
        free(own);
        return NULL;
    }
    snprintf(own->id, sizeof(own->id), "%.100s#%u", r->session->id, c);
    own->busy = 1;
    f->id = r->id;
    f->session = own;
    f->own = own;
    f->sp = r->sp;
    f->sp.seed = proto_choice_seed(r->sp.seed, c);
    f->max_tokens = r->max_tokens;
    f->min_tokens = r->min_tokens;
    f->n_choices = r->n_choices;
    f->choice = c;
    f->drafter = r->drafter;
    f->group = r->group;
    f->phase = REQ_RUNNING;
    f->next = s->reqs;
    s->reqs = f;
    return f;
}

void sched_start_choices(decode_sched_t *s, req_t *r, int32_t token, const engine_sample_t *sample,
                         float logprob, const float *logits, const Tandem__CompletionNotice *h)
{
    req_t *forks[PROTO_MAX_CHOICES];
    engine_sample_t firsts[PROTO_MAX_CHOICES];
    uint64_t T = (uint64_t)engine_seq_length(r->session->seq);
    uint64_t t0 = tdm_clock_now_ns();
    uint32_t n = r->n_choices;
    uint32_t made = 0;
    uint8_t *blob = NULL;
    size_t n_blob = 0;
    tdm_status_t status = TDM_OK;

    if (n <= 1) {
        sched_emit_one(s, r, T, token, sample, logprob);
        return;
    }
    if (n > PROTO_MAX_CHOICES || (h != NULL && h->n_choice_first + 1 < n)) {
        status = TDM_ERR_INVALID_ARG;
    }
    if (status == TDM_OK) {
        r->group = calloc(1, sizeof(*r->group));
        n_blob = engine_seq_export_bytes(r->session->seq, ENGINE_SEQ_EXPORT_PAGES);
        blob = malloc(n_blob);
        status = r->group == NULL || blob == NULL
                     ? TDM_ERR_NO_MEMORY
                     : engine_seq_export(r->session->seq, ENGINE_SEQ_EXPORT_PAGES, blob, n_blob,
                                         &n_blob);
    }
    if (r->group != NULL) {
        r->group->n_live = 1;
    }
    for (uint32_t c = 1; c < n && status == TDM_OK; c++) {
        req_t *f = new_fork(s, r, c, blob, n_blob, &status);
        if (f == NULL) {
            break;
        }
        forks[made++] = f;
        r->group->n_live++;
        memset(&firsts[c], 0, sizeof(firsts[c]));
        if (h != NULL) { /* sampled by the prefill node from the same logits */
            const Tandem__ChoiceFirst *cf = h->choice_first[c - 1];
            firsts[c].token = cf->token;
            firsts[c].logprob = cf->logprob;
            for (size_t i = 0;
                 cf->top != NULL && i < cf->top->n_tokens && i < ENGINE_SAMPLER_MAX_LOGPROBS; i++) {
                firsts[c].top[i].token = cf->top->tokens[i];
                firsts[c].top[i].logprob = cf->top->logprobs[i];
                firsts[c].n_top = (int)i + 1;
            }
        } else {
            sched_note_min_tokens(f);
            status = engine_sampler_sample(&f->sp, logits, s->cfg->vocab_size, (int64_t)T,
                                           &s->arena, &firsts[c]);
        }
        if (status == TDM_OK && (firsts[c].token < 0 || firsts[c].token >= s->cfg->vocab_size)) {
            status = TDM_ERR_FORMAT;
        }
    }
    free(blob);
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, "sched", "choices not forked: request=%llu n=%u made=%u status=%s",
                (unsigned long long)r->id, n, made, tdm_status_name(status));
        sched_send_error(s, r->id,
                         status == TDM_ERR_NO_PAGES ? TANDEM__ERROR_CODE__ERROR_NO_PAGES
                                                    : TANDEM__ERROR_CODE__ERROR_INTERNAL,
                         0, "could not fork the choices of the request");
        if (r->group != NULL) {
            r->group->failed = 1;
        }
        for (uint32_t i = 0; i < made; i++) {
            sched_finish_req(s, forks[i], TANDEM__FINISH_REASON__FINISH_ABORTED);
        }
        sched_finish_req(s, r, TANDEM__FINISH_REASON__FINISH_ABORTED);
        return;
    }
    tdm_log(TDM_LOG_INFO, "sched",
            "choices forked: request=%llu n=%u T=%llu pages_each=%u blob_bytes=%zu fork_us=%llu",
            (unsigned long long)r->id, n, (unsigned long long)T,
            engine_seq_n_pages(r->session->seq), n_blob,
            (unsigned long long)((tdm_clock_now_ns() - t0) / 1000));
    /* every choice is in the group before the first emit: none can end the group early */
    sched_emit_one(s, r, T, token, sample, logprob);
    for (uint32_t i = 0; i < made; i++) {
        req_t *f = forks[i];
        sched_emit_one(s, f, T, firsts[f->choice].token, &firsts[f->choice],
                       (float)firsts[f->choice].logprob);
    }
}
