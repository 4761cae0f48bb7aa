/* sched_tier.c - the decode scheduler's side of session tiering (sched_impl.h, issue 17): under
 * page pressure an idle session's state goes down to the tiers (decode-node/tier.h) instead of
 * being dropped, and comes back into the pool when its next turn starts. Runs on the
 * scheduler's thread.
 *
 * Demotion: the session with the highest eviction score (decode_sessions_victim) is exported
 * with its pages (engine_seq_export, ENGINE_SEQ_EXPORT_PAGES: the section-7 record and every
 * page, sealed, under the blob's XXH3-64 trailer), the blob and its recorded ids go to the tiers,
 * then the sequence is destroyed (its pages back to the pool). When no tier takes it the state is
 * dropped as before tiering (the next turn gets ERROR_STATE_LOST and the router rebuilds it).
 * Promotion: the tier hands the blob back (a disk entry checked against both checksums first),
 * engine_seq_import takes pages from the pool (evicting others when short) and checks every page
 * (identity, fingerprint, checksum). Any failure drops the state: the turn then sees nothing held
 * and the router resends the history (never wrong KV).
 */
#include "decode-node/sched_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

/* Move session's state into the tiers; TDM_OK when its pages went back to the pool. */
static tdm_status_t demote(decode_sched_t *s, decode_session_t *session)
{
    decode_tier_t *tier = s->params.tier;
    size_t n_blob = engine_seq_export_bytes(session->seq, ENGINE_SEQ_EXPORT_PAGES);
    uint8_t *blob = malloc(n_blob);
    decode_tier_usage_t usage;
    decode_tier_kind_t kind = DECODE_TIER_HOST;
    size_t n_written = 0;
    int32_t *kept = NULL; /* the ids the session keeps for routers' questions (report.h) */
    tdm_status_t status;

    if (blob == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    if (session->n_ids > 0 && (kept = malloc((size_t)session->n_ids * sizeof(int32_t))) != NULL) {
        memcpy(kept, session->ids, (size_t)session->n_ids * sizeof(int32_t));
    }
    status = engine_seq_export(session->seq, ENGINE_SEQ_EXPORT_PAGES, blob, n_blob, &n_written);
    if (status == TDM_OK) {
        usage.last_used_ns = session->last_used_ns;
        usage.n_turns = session->n_turns;
        usage.gap_mean_ns = session->gap_mean_ns;
        usage.size = 0; /* the tier counts the bytes */
        status = decode_tier_put(tier, session->id, &usage, blob, n_written, session->ids,
                                 session->n_ids, &kind);
    }
    if (status != TDM_OK) {
        free(blob);
        free(kept);
        return status;
    }
    /* the tier owns the blob and the ids buffer now */
    tdm_log(TDM_LOG_DEBUG, "tier", "session demoted to %s: session=%s tokens=%lld bytes=%zu",
            decode_tier_kind_name(kind), session->id, (long long)engine_seq_length(session->seq),
            n_written);
    session->tier_len = engine_seq_length(session->seq);
    engine_seq_destroy(session->seq);
    session->seq = NULL;
    session->ids = kept; /* out of memory: none, and the session is not reported while down */
    session->n_ids = kept != NULL ? session->n_ids : 0;
    session->ids_cap = session->n_ids;
    session->tier_home = tier;
    return TDM_OK;
}

int sched_tier_evict(decode_sched_t *s)
{
    decode_session_t *victim;
    tdm_status_t status;

    if (!decode_tier_enabled(s->params.tier)) {
        return decode_sessions_evict_lru(s->sessions);
    }
    victim = decode_sessions_victim(s->sessions, tdm_clock_now_ns());
    if (victim == NULL) {
        return 0;
    }
    status = demote(s, victim);
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_INFO, "tier",
                "idle session dropped under page pressure (no tier took it: %s): session=%s",
                tdm_status_name(status), victim->id);
        decode_sessions_drop_state(victim);
    }
    return 1;
}

void sched_tier_on_turn(decode_sched_t *s, decode_session_t *session)
{
    decode_tier_t *tier = session->tier_home;
    decode_tier_kind_t kind = DECODE_TIER_HOST;
    uint64_t t0 = tdm_clock_now_ns();
    uint8_t *blob = NULL;
    size_t n_blob = 0;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    engine_seq_t *seq = NULL;
    tdm_status_t status;

    decode_sessions_note_turn(session, t0);
    if (tier == NULL) {
        return;
    }
    session->tier_home = NULL;
    status = decode_tier_take(tier, session->id, &blob, &n_blob, &ids, &n_ids, &kind);
    if (status == TDM_OK) {
        do {
            status = engine_seq_import(s->model, decode_pool_engine(s->pool), blob, n_blob, &seq);
        } while (sched_evicted_for_retry(s, status));
        free(blob);
        if (status != TDM_OK) {
            decode_tier_note_miss(tier, kind);
            free(ids);
        }
    }
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "tier",
                "session state not restored from %s (%s): session=%s; rebuilt from the router's "
                "history",
                decode_tier_kind_name(kind), tdm_status_name(status), session->id);
        decode_sessions_drop_state(session);
        return;
    }
    engine_seq_destroy(session->seq); /* NULL while demoted */
    free(session->ids);
    session->seq = seq;
    session->ids = ids;
    session->n_ids = n_ids;
    session->ids_cap = n_ids;
    decode_tier_note_restore(tier, kind, tdm_clock_now_ns() - t0, engine_seq_length(seq));
    tdm_log(TDM_LOG_DEBUG, "tier", "session promoted from %s: session=%s tokens=%lld ms=%.3f",
            decode_tier_kind_name(kind), session->id, (long long)engine_seq_length(seq),
            tdm_clock_elapsed_ms(t0));
}
