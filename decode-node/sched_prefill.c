/* sched_prefill.c - local prefills in pieces between decode steps (sched_impl.h:
 * sched_prefill_step; issue 17, docs/ARCHITECTURE.md "The decode node's step").
 *
 * A local turn (REQ_PREFILL) is a list of pieces run in order: the rewind (engine_seq_truncate +
 * recovery replay, MODEL.md 6(d)(2)) when the prompt shares less than the node holds, the
 * canonical-start replay (6(d)(1)) when the router asked for one, then the delta in parts of
 * engine_fwd_prefill_parts (the parts give the bits of one engine_fwd_prefill). Each step gives
 * the pending turns, oldest first, what the running batch's decode rows leave of the step's
 * token budget; a replay counts its W' = min(W, length) tokens and runs whole. The session stays
 * busy (no other turn, reservation or eviction touches it) until the last part ran; then the
 * first token is sampled from the last part's logits and the turn joins the batch. A turn that
 * ends part way (Abort, failure, drain timeout, destroy) drops its session's state: a
 * half-prefilled sequence is never kept.
 */
#include "decode-node/sched_impl.h"

#include <stdint.h>
#include <stdlib.h>

#include "common/log.h"

/* What one step may still spend: INT64_MAX without a budget. */
static int64_t step_left(const decode_sched_t *s, int64_t decode_rows)
{
    if (s->params.step_token_budget == 0) {
        return INT64_MAX;
    }
    return (int64_t)s->params.step_token_budget - decode_rows;
}

/* The tokens of r's next replay piece (0: none is pending): W' = min(W, the length it runs at). */
static int64_t replay_cost(const decode_sched_t *s, const req_t *r)
{
    int64_t at = 0;
    int64_t W = s->cfg->sliding_window;

    if (r->rewind_to > 0) {
        at = r->rewind_to;
    } else if (r->canonical && r->n_done == 0) {
        at = engine_seq_length(r->session->seq); /* 0 for a new sequence: no replay */
    }
    return at < W ? at : W;
}

void sched_prefill_abandon(req_t *r)
{
    if (r->phase == REQ_PREFILL && r->mid_prefill) {
        tdm_log(TDM_LOG_INFO, "sched",
                "prefill ended part way: request=%llu session=%s done=%lld of %lld; state dropped",
                (unsigned long long)r->id, r->session->id, (long long)r->n_done,
                (long long)r->n_delta);
        decode_sessions_drop_state(r->session);
        r->mid_prefill = 0;
    }
}

/*
 * run_replay - r's next replay piece: the rewind (then, when it kept less than cached_len, the
 * turn ends with STATE_LOST at the kept length) or the canonical-start replay. Returns 1 when r
 * ended (an Error was sent; r freed), else 0.
 */
static int run_replay(decode_sched_t *s, req_t *r)
{
    engine_seq_t *seq = r->session->seq;
    tdm_status_t status;

    s->stats.prefill_pieces_total++;
    if (r->rewind_to > 0) {
        int64_t p = r->rewind_to;

        r->rewind_to = 0;
        if (sched_rewind_session(s, r->session, p) != TDM_OK) {
            /* the state was dropped: nothing to continue from (docs/PROTOCOL.md 3c) */
            s->stats.state_lost_total++;
            s->stats.requests_total--; /* refused, as before the rewind became a piece */
            sched_send_error(s, r->id, TANDEM__ERROR_CODE__ERROR_STATE_LOST, 0,
                             "session state not held at cached_len");
            sched_end_req(s, r);
            return 1;
        }
        if (r->rewind_lost) {
            /* the router retries from p, which the node now holds */
            s->stats.state_lost_total++;
            s->stats.requests_total--;
            sched_send_error(s, r->id, TANDEM__ERROR_CODE__ERROR_STATE_LOST, (uint64_t)p,
                             "session state rewound to a shorter prefix than cached_len");
            sched_end_req(s, r);
            return 1;
        }
        return 0;
    }
    /* MODEL.md 6(d)(1): a large delta starts from rings of layers 0..c replayed at H. */
    r->canonical = 0;
    r->mid_prefill = 1;
    {
        /* the recorded history: a handed-off sequence keeps only the record's last N - 1 ids */
        int64_t n = decode_sessions_last_ids(r->session, s->ids, s->n_ids_cap);
        engine_seq_reset_rings(seq);
        status = engine_fwd_replay(s->fwd, seq, s->ids, n, ENGINE_REPLAY_CANONICAL, NULL);
    }
    if (status != TDM_OK) {
        sched_fail_req(s, r, status);
        return 1;
    }
    return 0;
}

/* r's prefill is whole (its last part wrote `logits`, one row): sample the first token as a
 * one-shot prefill would and start the turn (it joins the batch). */
static void finish_prefill(decode_sched_t *s, req_t *r, float *logits)
{
    engine_seq_t *seq = r->session->seq;
    engine_sample_t sample;
    tdm_status_t status = TDM_OK;

    r->mid_prefill = 0;
    /* the history a later rewind replays from; a failed record only shortens it */
    (void)decode_sessions_note_ids(r->session, r->prefill_start, r->delta, r->n_delta);
    if (r->constraint != NULL) {
        status = engine_constraint_apply(r->constraint, logits, s->cfg->vocab_size);
    }
    if (status == TDM_OK) {
        sched_note_min_tokens(r);
        status = engine_sampler_sample(&r->sp, logits, s->cfg->vocab_size, engine_seq_length(seq),
                                       &s->arena, &sample);
    }
    if (status != TDM_OK) {
        sched_fail_req(s, r, status);
        return;
    }
    s->stats.local_prefill_tokens_total += (uint64_t)r->n_delta;
    r->n_prefilled = (uint64_t)r->n_delta;
    r->last_token = sample.token; /* the anchor of the history */
    if (r->drafter == ENGINE_SPEC_NGRAM && sched_make_history(s, r) != TDM_OK) {
        sched_fail_req(s, r, TDM_ERR_NO_MEMORY);
        return;
    }
    free(r->delta);
    r->delta = NULL;
    sched_start_choices(s, r, sample.token, &sample, (float)sample.logprob, logits, NULL);
}

/*
 * run_parts - parts[0..n) (owners[k]'s; len0[k]: its sequence's length before) in one call. Out
 * of pages: the parts before the failing one ran; an idle session is evicted and the failing one
 * and those after run again, or, with none to evict, the failing one's request fails (owners[k]
 * set to NULL; a half-prefilled state is dropped, which may free what the others need) and those
 * after it run again. Another error fails the request whose part did not complete (TDM_ERR_
 * INVALID_ARG: nothing ran, every request fails; the ranges were checked before the call).
 */
static void run_parts(decode_sched_t *s, engine_prefill_part_t *parts, req_t **owners,
                      const int64_t *len0, int n)
{
    int i = 0;

    while (i < n) {
        tdm_status_t status = engine_fwd_prefill_parts(s->fwd, parts + i, n - i);
        int bad = i;

        if (status == TDM_OK) {
            return;
        }
        if (status == TDM_ERR_INVALID_ARG) {
            for (int k = i; k < n; k++) {
                sched_fail_req(s, owners[k], status);
                owners[k] = NULL;
            }
            return;
        }
        while (bad < n && engine_seq_length(parts[bad].seq) == len0[bad] + parts[bad].n_ids) {
            bad++; /* this part ran */
        }
        if (bad == n) {
            return; /* not reached: a failed call leaves its failing part undone */
        }
        if (sched_evicted_for_retry(s, status)) {
            i = bad;
            continue;
        }
        if (status != TDM_ERR_NO_PAGES) {
            /* NaN at a top-k or no memory: a pass is one batch, so every part not finished
             * when it happened holds an invalid sequence (engine/forward.h) */
            for (int k = bad; k < n; k++) {
                tdm_log(TDM_LOG_WARN, "sched", "prefill part failed: request=%llu status=%s",
                        (unsigned long long)owners[k]->id, tdm_status_name(status));
                sched_fail_req(s, owners[k], status);
                owners[k] = NULL;
            }
            return;
        }
        tdm_log(TDM_LOG_WARN, "sched", "prefill part failed: request=%llu done=%lld status=%s",
                (unsigned long long)owners[bad]->id, (long long)owners[bad]->n_done,
                tdm_status_name(status));
        sched_fail_req(s, owners[bad], status);
        owners[bad] = NULL;
        i = bad + 1;
    }
}

void sched_prefill_step(decode_sched_t *s, int64_t decode_rows)
{
    req_t *pending[ENGINE_FWD_MAX_BATCH];
    engine_prefill_part_t parts[ENGINE_FWD_MAX_BATCH];
    req_t *owners[ENGINE_FWD_MAX_BATCH];
    int64_t len0[ENGINE_FWD_MAX_BATCH];
    int64_t left = step_left(s, decode_rows);
    int64_t chunk =
        s->params.prefill_chunk_tokens > 0 ? (int64_t)s->params.prefill_chunk_tokens : INT64_MAX;
    int n_pending = 0;
    int n_parts = 0;
    int ran = 0; /* pieces this step */
    int64_t V = s->cfg->vocab_size;

    /* oldest first: the list is newest first, so the last max_batch pending are the oldest */
    for (req_t *r = s->reqs; r != NULL; r = r->next) {
        if (r->phase != REQ_PREFILL) {
            continue;
        }
        if (n_pending == (int)s->params.max_batch) {
            for (int k = 0; k + 1 < n_pending; k++) {
                pending[k] = pending[k + 1];
            }
            n_pending--;
        }
        pending[n_pending++] = r;
    }
    for (int k = n_pending - 1; k >= 0 && (ran == 0 || left > 0); k--) {
        req_t *r = pending[k];
        int64_t cost = replay_cost(s, r), n;
        int ended = 0;

        while (cost > 0 && (ran == 0 || cost <= left)) {
            ended = run_replay(s, r); /* r is freed when it ended */
            ran++;
            left -= cost;
            if (ended) {
                break;
            }
            cost = replay_cost(s, r);
        }
        if (ended) {
            continue;
        }
        if (cost > 0) {
            break; /* its replay waits for the next step, and the younger turns behind it */
        }
        if (r->n_done == 0) {
            r->canonical = 0; /* ran, or nothing to replay at 0: never after a part */
            r->prefill_start = engine_seq_length(r->session->seq);
            if (r->n_delta <= 0 ||
                r->prefill_start + r->n_delta > s->cfg->max_position_embeddings) {
                sched_fail_req(s, r, TDM_ERR_INVALID_ARG);
                continue;
            }
        }
        n = r->n_delta - r->n_done;
        n = n < chunk ? n : chunk;
        if (ran == 0 && left < SCHED_MIN_PIECE_TOKENS) {
            n = n < SCHED_MIN_PIECE_TOKENS ? n : SCHED_MIN_PIECE_TOKENS;
        } else if (n > left) {
            n = left;
        }
        if (n <= 0) {
            break;
        }
        parts[n_parts] = (engine_prefill_part_t){r->session->seq,
                                                 r->prefill_start,
                                                 r->prefill_start + r->n_delta,
                                                 r->delta + r->n_done,
                                                 n,
                                                 ENGINE_PREFILL_DEFAULT,
                                                 s->logits + (size_t)n_parts * (size_t)V,
                                                 0};
        owners[n_parts] = r;
        len0[n_parts] = engine_seq_length(r->session->seq);
        n_parts++;
        ran++;
        left -= n;
    }
    if (n_parts == 0) {
        return;
    }
    run_parts(s, parts, owners, len0, n_parts);
    for (int k = 0; k < n_parts; k++) {
        req_t *r = owners[k];

        if (r == NULL) {
            continue;
        }
        s->stats.prefill_pieces_total++;
        r->mid_prefill = 1;
        r->n_done += parts[k].n_ids;
        if (r->n_done == r->n_delta) {
            finish_prefill(s, r, parts[k].logits_out);
        }
    }
}
