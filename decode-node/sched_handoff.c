/* sched_handoff.c - the decode scheduler's handoff path (sched_impl.h): page reservations for
 * a remote prefill, adopting the pages and state record of its CompletionNotice, aborts and
 * lapsed reservations. Runs on the scheduler's thread. */
#include "decode-node/sched_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "node/node_handoff.h"
#include "node/node_state.h"
#include "kernels/kv_page.h"
#include "transfer/notice.h"

/*
 * Import the sequence at T from the reservation's pages and the notice's state record. Releases
 * resv in every case (the writer is done: its notice arrived). The blob the import reads holds a
 * copy of every page, so once it is built the reservation's pages and the session's old
 * sequence (its history pages) go back to the pool before the import takes the new sequence's:
 * a handoff needs no pages beyond its reservation (issue 16: the import used to need as many
 * again, evicted every idle session for them and failed as an "import check").
 */
static tdm_status_t sched_adopt(decode_sched_t *s, decode_session_t *session, decode_resv_t *resv,
                                const Tandem__CompletionNotice *h, engine_seq_t **seq_out,
                                const char **why)
{
    engine_kv_pool_t *kv = decode_pool_engine(s->pool);
    node_pages_t *pages_of = decode_pool_pages(s->pool);
    size_t page_bytes = engine_kv_pool_page_bytes(kv);
    int64_t n_rows[NODE_MAX_SOURCES];
    uint32_t n_pages[NODE_MAX_SOURCES];
    uint32_t *targets;
    const void **pages;
    uint32_t n_all = 0, k = 0, n_bad = 0, first_bad = 0;
    uint8_t *blob = NULL;
    size_t n_blob = 0;
    engine_kv_table_t held[NODE_MAX_SOURCES];
    tdm_status_t status = TDM_OK;

    if (h->n_page_checksums != resv->n_pages || h->state_record.len == 0 ||
        tdm_hash_xxh3_64(h->state_record.data, h->state_record.len) != h->state_checksum ||
        h->total_len != resv->total_len || h->cached_len != resv->cached_len) {
        *why = "handoff does not match the reservation (pages, record or lengths)";
        decode_pool_release(s->pool, resv);
        return TDM_ERR_MISMATCH;
    }
    for (uint32_t i = 0; i < resv->n_sources; i++) {
        int layer = (int)s->cfg->kv_source_layer_ids[i];
        n_rows[i] = engine_config_n_c(s->cfg, layer, (int64_t)resv->total_len - 1);
        n_pages[i] = (uint32_t)kern_kv_page_count(n_rows[i]);
        if (n_pages[i] != resv->first_target[i] + resv->tables[i].n_pages) {
            *why = "reserved pages do not cover the sequence";
            decode_pool_release(s->pool, resv);
            return TDM_ERR_MISMATCH;
        }
        n_all += n_pages[i];
    }
    targets = malloc((resv->n_pages + 1) * sizeof(uint32_t));
    pages = malloc((n_all + 1) * sizeof(void *));
    if (targets == NULL || pages == NULL) {
        free(targets);
        free(pages);
        decode_pool_release(s->pool, resv);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < resv->n_sources; i++) {
        for (uint32_t j = 0; j < resv->tables[i].n_pages; j++) {
            targets[k++] = resv->tables[i].page_ids[j];
        }
    }
    /* the pages as they arrived: the engine's own on the CPU, their staging copies when the
     * engine runs on a device (node/node_pages.h); the blob below carries them into it */
    status = xfer_notice_check_pages(node_pages_host_base(pages_of), (uint32_t)page_bytes,
                                     engine_kv_pool_n_pages(kv), targets, h->page_checksums,
                                     resv->n_pages, &n_bad, &first_bad);
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "sched", "handoff page check failed: status=%s bad=%u first=%u of=%u",
                tdm_status_name(status), n_bad, first_bad, resv->n_pages);
        *why = "a page differs from its checksum in the notice";
        status = TDM_ERR_MISMATCH;
    }
    k = 0;
    for (uint32_t i = 0; i < resv->n_sources && status == TDM_OK; i++) {
        int layer = (int)s->cfg->kv_source_layer_ids[i];
        const engine_kv_table_t *old =
            session->seq != NULL ? engine_seq_table(session->seq, layer) : NULL;
        for (uint32_t j = 0; j < n_pages[i]; j++) {
            if (j < resv->first_target[i]) {
                if (old == NULL || j >= old->n_pages) {
                    *why = "the session no longer holds its history pages";
                    status = TDM_ERR_MISMATCH;
                    break;
                }
                /* downloaded and sealed when the reservation was made (the session has been
                 * busy since: nothing appended to them) */
                pages[k++] = node_pages_host(pages_of, old->page_ids[j]);
            } else {
                pages[k++] =
                    node_pages_host(pages_of, resv->tables[i].page_ids[j - resv->first_target[i]]);
            }
        }
    }
    if (status == TDM_OK) {
        status = node_blob_with_pages(h->state_record.data, h->state_record.len, resv->n_sources,
                                      n_rows, n_pages, pages, page_bytes, &blob, &n_blob);
    }
    if (status == TDM_OK) {
        /* pages shared with other sessions stay shared (issue 17): held across the import */
        sched_prefix_hold(s, session, resv->n_sources, resv->first_target, held);
    }
    decode_pool_release(s->pool, resv);
    if (status == TDM_OK) {
        decode_sessions_drop_state(session); /* its pages are in the blob */
        do {
            status = engine_seq_import(s->model, kv, blob, n_blob, seq_out);
        } while (sched_evicted_for_retry(s, status));
        sched_prefix_relink(s, status == TDM_OK ? *seq_out : NULL, held);
    }
    if (status == TDM_ERR_NO_PAGES && *why == NULL) {
        *why = "no free pages for the handed-off sequence";
    } else if (status != TDM_OK && *why == NULL) {
        *why = "the state record or a page failed the engine's import check";
    }
    free(blob);
    free(targets);
    free(pages);
    return status;
}

/* Adopt the handoff h of dr (its state record and page checksums in h: in-band, or merged from
 * the direct notice by remote_with_state). */
static void remote_adopt(decode_sched_t *s, const Tandem__DecodeRequest *dr,
                         const Tandem__CompletionNotice *h)
{
    decode_resv_t *resv = decode_pool_find(s->pool, h->reservation_id);
    decode_session_t *session = decode_sessions_find(s->sessions, dr->session_id);
    engine_seq_t *seq = NULL;
    const char *why = NULL;
    int64_t known;
    tdm_status_t status;
    req_t *r;

    if (resv == NULL || resv->state != DECODE_RESV_ACTIVE || session == NULL ||
        strcmp(resv->session_id, dr->session_id) != 0) {
        s->stats.handoff_failures_total++;
        sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_STATE_LOST, 0,
                         "no live reservation for this handoff");
        return;
    }
    /* the recorded history keeps [0, H); the delta's ids follow when the router sent them */
    known = session->n_ids < (int64_t)resv->cached_len ? session->n_ids : (int64_t)resv->cached_len;
    status = sched_adopt(s, session, resv, h, &seq, &why); /* releases resv */
    if (status != TDM_OK) {
        s->stats.handoff_failures_total++;
        tdm_log(TDM_LOG_ERROR, "sched", "handoff refused: request=%llu status=%s reason=\"%s\"",
                (unsigned long long)dr->request_id, tdm_status_name(status), why);
        session->busy = 0;
        decode_sessions_drop_state(session);
        sched_send_error(s, dr->request_id,
                         status == TDM_ERR_NO_PAGES ? TANDEM__ERROR_CODE__ERROR_NO_PAGES
                                                    : TANDEM__ERROR_CODE__ERROR_STATE_LOST,
                         0, why);
        return;
    }
    session->busy = 0;
    decode_sessions_drop_state(session);
    session->seq = seq;
    session->n_ids = known; /* drop_state forgot them; the buffer is still there */
    if (dr->n_delta_tokens > 0 && dr->n_delta_tokens == h->total_len - h->cached_len &&
        known == (int64_t)h->cached_len) {
        /* the router sends a remote delta's ids too (docs/PROTOCOL.md 3b): record them */
        (void)decode_sessions_note_ids(session, known, dr->delta_tokens,
                                       (int64_t)dr->n_delta_tokens);
    }
    r = sched_new_req(s, dr, session);
    if (r == NULL) {
        return;
    }
    s->stats.handoffs_total++;
    {
        /* the prefill node's top alternatives of the first token (CompletionNotice.first_top) */
        engine_sample_t first;
        memset(&first, 0, sizeof(first));
        first.token = h->first_token;
        first.logprob = h->first_logprob;
        for (size_t i = 0;
             h->first_top != NULL && i < h->first_top->n_tokens && i < ENGINE_SAMPLER_MAX_LOGPROBS;
             i++) {
            first.top[i].token = h->first_top->tokens[i];
            first.top[i].logprob = h->first_top->logprobs[i];
            first.n_top = (int)i + 1;
        }
        sched_start_choices(s, r, h->first_token, &first, h->first_logprob, NULL, h);
    }
}

/* A state_direct handoff with its state from the transfer notice (node/node_state.h): the two
 * halves must name the same request, record and page count, else the handoff is refused (as an
 * in-band one whose record does not check). */
static void remote_with_state(decode_sched_t *s, const Tandem__DecodeRequest *dr,
                              const Tandem__CompletionNotice *state)
{
    Tandem__CompletionNotice h = *dr->handoff;

    if (state->request_id == h.request_id && state->state_checksum == h.state_checksum &&
        state->n_page_checksums == h.n_pages && state->total_len == h.total_len &&
        state->cached_len == h.cached_len) {
        h.page_checksums = state->page_checksums;
        h.n_page_checksums = state->n_page_checksums;
        h.state_record = state->state_record;
    } else {
        tdm_log(TDM_LOG_ERROR, "sched",
                "state notice does not match the router's completion: request=%llu/%llu "
                "reservation=%llu pages=%zu/%u",
                (unsigned long long)state->request_id, (unsigned long long)h.request_id,
                (unsigned long long)h.reservation_id, state->n_page_checksums, h.n_pages);
        h.state_record.len = 0; /* refused by sched_adopt's check, which frees the pages */
    }
    remote_adopt(s, dr, &h);
}

void sched_on_remote(decode_sched_t *s, const Tandem__DecodeRequest *dr)
{
    const Tandem__CompletionNotice *h = dr->handoff;
    decode_notices_t *notices = s->params.notices;
    Tandem__CompletionNotice *state;
    decode_resv_t *resv;
    tdm_status_t status;

    if (!h->state_direct) {
        remote_adopt(s, dr, h); /* in-band: the record and checksums came through the router */
        return;
    }
    state = notices != NULL ? decode_notices_take(notices, h->reservation_id) : NULL;
    if (state != NULL) { /* the notice came first */
        remote_with_state(s, dr, state);
        node_state_free(state);
        return;
    }
    resv = decode_pool_find(s->pool, h->reservation_id);
    status = notices == NULL || resv == NULL || resv->state != DECODE_RESV_ACTIVE
                 ? TDM_ERR_NOT_FOUND
                 : decode_notices_park(notices, dr, tdm_clock_now_ns());
    if (status != TDM_OK) {
        /* no table, no live reservation, or too many waiting: refused like a bad handoff */
        remote_adopt(s, dr, h);
        return;
    }
    tdm_log(TDM_LOG_DEBUG, "sched",
            "handoff waits for its state notice: request=%llu reservation=%llu",
            (unsigned long long)dr->request_id, (unsigned long long)h->reservation_id);
}

/* A handoff whose state notice never came (decode_notices_next: TIMEOUT): that request alone
 * fails; its reservation's pages go back now (the writer answered the router: fenced). */
static void remote_timeout(decode_sched_t *s, const Tandem__DecodeRequest *dr)
{
    decode_resv_t *resv = decode_pool_find(s->pool, dr->handoff->reservation_id);
    decode_session_t *session = decode_sessions_find(s->sessions, dr->session_id);
    uint64_t held = 0;
    char why[128];

    s->stats.handoff_failures_total++;
    if (resv != NULL) {
        decode_pool_release(s->pool, resv);
    }
    if (session != NULL && sched_find_req(s, dr->request_id) == NULL) {
        session->busy = 0;
        held = session->seq != NULL ? (uint64_t)engine_seq_length(session->seq) : 0;
    }
    snprintf(why, sizeof(why), "the prefill node's state notice did not arrive within %u ms",
             s->params.notices != NULL ? decode_notices_wait_ms(s->params.notices) : 0u);
    tdm_log(TDM_LOG_ERROR, "sched", "handoff failed: request=%llu reservation=%llu reason=\"%s\"",
            (unsigned long long)dr->request_id, (unsigned long long)dr->handoff->reservation_id,
            why);
    sched_send_error(s, dr->request_id, TANDEM__ERROR_CODE__ERROR_STATE_LOST, held, why);
}

void decode_sched_join_notices(decode_sched_t *s)
{
    Tandem__DecodeRequest *dr;
    Tandem__CompletionNotice *state;
    decode_notices_event_t ev;

    if (s->params.notices == NULL) {
        return;
    }
    while ((ev = decode_notices_next(s->params.notices, tdm_clock_now_ns(), &dr, &state)) !=
           DECODE_NOTICES_NONE) {
        if (ev == DECODE_NOTICES_READY) {
            remote_with_state(s, dr, state);
        } else {
            remote_timeout(s, dr);
        }
        node_state_free(state);
        tandem__decode_request__free_unpacked(dr, NULL);
    }
}

void sched_on_reserve(decode_sched_t *s, const Tandem__ReservePages *rp)
{
    decode_session_t *session = decode_sessions_get(s->sessions, rp->session_id);
    uint32_t first[NODE_MAX_SOURCES], need[NODE_MAX_SOURCES];
    node_resv_desc_t desc;
    decode_resv_t *resv = NULL;
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__PageReservation pr = TANDEM__PAGE_RESERVATION__INIT;
    uint8_t *bytes = NULL;
    size_t n_bytes = 0;
    uint64_t H = rp->cached_len, T = rp->total_len;
    tdm_status_t sealed = TDM_OK; /* the history pages sealed where a peer reads them */
    tdm_status_t status;

    if (session == NULL || session->busy) {
        sched_send_error(s, rp->request_id, TANDEM__ERROR_CODE__ERROR_BUSY, 0,
                         session == NULL ? "session table full" : "session busy");
        return;
    }
    sched_tier_on_turn(s, session); /* a demoted state comes back first */
    if (T == 0 || H >= T || T > (uint64_t)s->cfg->max_position_embeddings) {
        sched_send_error(s, rp->request_id, TANDEM__ERROR_CODE__ERROR_BAD_MESSAGE, 0,
                         "reservation lengths out of range");
        return;
    }
    /* a new session sharing another's prefix (prefix_session_id): sched_prefix.c */
    (void)sched_prefix_share(s, session, rp->prefix_session_id, H, rp->prefix_ids,
                             rp->n_prefix_ids);
    if (session->seq != NULL && (uint64_t)engine_seq_length(session->seq) > H && H > 0) {
        /* rewind to the longest prefix <= H the node can rebuild; the reservation then says
         * the H it holds (docs/PROTOCOL.md 3c) */
        int64_t p = sched_rewind_target(session, (int64_t)H);
        if (p > 0 && sched_rewind_session(s, session, p) == TDM_OK) {
            H = (uint64_t)p;
        }
    }
    if (session->seq != NULL && (uint64_t)engine_seq_length(session->seq) != H) {
        decode_sessions_drop_state(session); /* nothing to continue from: start from 0 */
    }
    if (session->seq == NULL) {
        H = 0;
    }
    session->busy = 1;
    memset(&desc, 0, sizeof(desc));
    desc.cached_len = H;
    desc.total_len = T;
    desc.n_sources = (uint32_t)s->cfg->n_kv_source_layer_ids;
    for (uint32_t i = 0; i < desc.n_sources; i++) {
        int layer = (int)s->cfg->kv_source_layer_ids[i];
        int64_t rows_T = engine_config_n_c(s->cfg, layer, (int64_t)T - 1);
        int64_t rows_H = engine_config_n_c(s->cfg, layer, (int64_t)H - 1);
        uint32_t pages_T = (uint32_t)kern_kv_page_count(rows_T);
        first[i] = (uint32_t)(rows_H / KERN_KV_PAGE_ROWS);
        need[i] = pages_T - first[i];
    }
    do {
        status = decode_pool_reserve(s->pool, rp->request_id, rp->session_id, H, T, first, need,
                                     rp->timeout_ms > 0 ? rp->timeout_ms : 10000u, &resv);
    } while (sched_evicted_for_retry(s, status));
    if (status != TDM_OK) {
        session->busy = 0;
        sched_send_error(s, rp->request_id,
                         status == TDM_ERR_NO_PAGES ? TANDEM__ERROR_CODE__ERROR_NO_PAGES
                                                    : TANDEM__ERROR_CODE__ERROR_INTERNAL,
                         0, "cannot reserve pages");
        return;
    }
    desc.reservation_id = resv->id;
    for (uint32_t i = 0; i < desc.n_sources; i++) {
        int layer = (int)s->cfg->kv_source_layer_ids[i];
        const engine_kv_table_t *t =
            session->seq != NULL ? engine_seq_table(session->seq, layer) : NULL;
        desc.src[i].layer = layer;
        desc.src[i].first_target = first[i];
        desc.src[i].n_targets = resv->tables[i].n_pages;
        desc.src[i].targets = resv->tables[i].page_ids;
        desc.src[i].n_history = t != NULL ? t->n_pages : 0;
        desc.src[i].history = t != NULL ? t->page_ids : NULL;
        /* digests let a prefill node that kept these pages pull only the changed ones
         * (prefill-node/history.h); none (NULL) when out of memory: it pulls them all */
        desc.src[i].history_digests =
            desc.src[i].n_history > 0 ? malloc(desc.src[i].n_history * sizeof(uint64_t)) : NULL;
        /* pulled and checked: sealed in the engine, and where the prefill node gets them (the
         * engine's pages on the CPU, their staging copies on a device: node_pages.h) */
        if (t != NULL && node_pages_seal(decode_pool_pages(s->pool), t->page_ids,
                                         desc.src[i].n_history) != TDM_OK) {
            sealed = TDM_ERR_INTERNAL;
        }
        for (uint32_t j = 0; j < desc.src[i].n_history; j++) {
            const void *page = node_pages_host(decode_pool_pages(s->pool), t->page_ids[j]);
            if (desc.src[i].history_digests != NULL) {
                desc.src[i].history_digests[j] = node_page_digest(page);
            }
        }
    }
    status = sealed;
    if (status == TDM_OK && H > 0) {
        desc.n_record = engine_seq_export_bytes(session->seq, ENGINE_SEQ_EXPORT_RECORD);
        desc.record = malloc(desc.n_record);
        status = desc.record == NULL
                     ? TDM_ERR_NO_MEMORY
                     : engine_seq_export(session->seq, ENGINE_SEQ_EXPORT_RECORD, desc.record,
                                         desc.n_record, &desc.n_record);
    }
    if (status == TDM_OK && desc.n_record > 0 && !s->params.state_inband) {
        /* sequence state off the router (issue 18 item 4): the record at H goes into staged
         * pages of the reservation, which the prefill node gets with UCX; the descriptor the
         * router relays names them (version 3). Without the pages: inline, as before. */
        tdm_status_t staged;
        do {
            staged = decode_pool_stage(s->pool, resv, desc.record, desc.n_record);
        } while (sched_evicted_for_retry(s, staged));
        if (staged == TDM_OK) {
            desc.n_stage = resv->stage.n_pages;
            desc.stage = resv->stage.page_ids;
            desc.record_checksum = tdm_hash_xxh3_64(desc.record, desc.n_record);
        }
    }
    if (status == TDM_OK) {
        status = node_resv_desc_encode(&desc, &bytes, &n_bytes);
    }
    free(desc.record);
    for (uint32_t i = 0; i < desc.n_sources; i++) {
        free(desc.src[i].history_digests);
    }
    if (status != TDM_OK) {
        decode_pool_release(s->pool, resv);
        session->busy = 0;
        sched_send_error(s, rp->request_id, TANDEM__ERROR_CODE__ERROR_INTERNAL, 0,
                         "cannot describe the reservation");
        return;
    }
    pr.request_id = rp->request_id;
    pr.attempt = rp->attempt;
    pr.reservation_id = resv->id;
    pr.cached_len = H;
    pr.n_pages = resv->n_pages;
    pr.descriptor.data = bytes;
    pr.descriptor.len = n_bytes;
    env.body_case = TANDEM__ENVELOPE__BODY_PAGE_RESERVATION;
    env.page_reservation = &pr;
    s->out.send(s->out.arg, &env);
    free(bytes);
    s->stats.reservations_total++;
    tdm_log(TDM_LOG_DEBUG, "sched",
            "reserved: request=%llu reservation=%llu H=%llu T=%llu pages=%u",
            (unsigned long long)rp->request_id, (unsigned long long)resv->id, (unsigned long long)H,
            (unsigned long long)T, resv->n_pages);
}

/* A reservation ended without its handoff: its session becomes idle again. */
static void sched_release_session_of(decode_sched_t *s, const decode_resv_t *resv)
{
    decode_session_t *session = decode_sessions_find(s->sessions, resv->session_id);

    if (session != NULL && session->busy && sched_find_req(s, resv->request_id) == NULL) {
        session->busy = 0;
    }
}

void sched_on_lapse(void *arg, decode_resv_t *resv)
{
    decode_sched_t *s = arg;

    s->stats.reservations_lapsed_total++;
    /* a handoff waiting for its state notice keeps waiting: its wait (far shorter than the
     * reservation's timeout) ends it with an Error; an unclaimed notice expires on its own */
    sched_release_session_of(s, resv);
}

/* An Abort reached reservation `resv`: with the writer fenced (it acknowledged, or never got the
 * reservation) its pages are free at once; else they wait for that word or the timer fence. */
static void sched_abort_resv(decode_sched_t *s, decode_resv_t *resv, int writer_fenced)
{
    if (s->params.notices != NULL) {
        (void)decode_notices_drop(s->params.notices, resv->id); /* its waiting handoff too */
    }
    if (resv->state == DECODE_RESV_ACTIVE) {
        sched_release_session_of(s, resv);
    }
    if (writer_fenced) {
        tdm_log(TDM_LOG_DEBUG, "sched",
                "reservation released, writer fenced: reservation=%llu "
                "pages=%u",
                (unsigned long long)resv->id, resv->n_pages);
        decode_pool_release(s->pool, resv);
    } else {
        decode_pool_fence(s->pool, resv, s->params.fence_ms);
    }
}

void sched_on_abort(decode_sched_t *s, const Tandem__Abort *a)
{
    req_t *r = a->request_id != 0 ? sched_find_req(s, a->request_id) : NULL;

    uint64_t waited = a->request_id != 0 && s->params.notices != NULL
                          ? decode_notices_drop_request(s->params.notices, a->request_id)
                          : 0;

    if (waited != 0) {
        /* a handoff waiting for its state notice: its writer answered the router (fenced), so
         * the reservation's pages go back now and the session is idle again */
        decode_resv_t *resv = decode_pool_find(s->pool, waited);
        s->stats.aborts_total++;
        if (resv != NULL) {
            sched_release_session_of(s, resv);
            decode_pool_release(s->pool, resv);
        }
    }

    if (a->reservation_id != 0) {
        decode_resv_t *resv = decode_pool_find(s->pool, a->reservation_id);
        if (resv != NULL) {
            sched_abort_resv(s, resv, a->writer_fenced);
        }
    } else if (a->request_id != 0) {
        /* A turn aborted while still reserving (writer_fenced: the router never saw the
         * reservation, so no writer has it): the request's active reservations go too. One the
         * router aborted by id before (FENCED) keeps waiting for its own writer's word. */
        decode_resv_t *resv;
        while ((resv = decode_pool_find_request(s->pool, a->request_id, 1)) != NULL) {
            sched_abort_resv(s, resv, a->writer_fenced); /* released, or FENCED */
        }
    }
    if (r != NULL) {
        s->stats.aborts_total++;
    }
    while (r != NULL) { /* every choice of the request */
        sched_finish_req(s, r, TANDEM__FINISH_REASON__FINISH_ABORTED);
        r = sched_find_req(s, a->request_id);
    }
}
