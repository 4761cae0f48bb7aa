/* sched_prefix.c - a new session starts from another resident session's pages (issue 17 item 2,
 * docs/PROTOCOL.md 6 "share pages, not sessions"): DecodeRequest / ReservePages.prefix_session_id
 * names the donor, prefix_ids the tokens of [0, cached_len). Split from sched.c; declared in
 * sched_impl.h. */
#include "decode-node/sched_impl.h"

#include <string.h>

#include "common/log.h"
#include "node/node_handoff.h"

/*
 * The tenant hook (issue 17: "scoped per tenant key when the API has keys"): 1 when `session`
 * may read `donor`'s pages. The router scopes every prefix match to the request's tenant
 * (router_sessions_match_prefix) and the API has no per-tenant keys on the node's side yet, so
 * every pair passes; when DecodeRequest carries a tenant key, decode_session_t records it and this
 * compares the two.
 */
static int same_tenant(const decode_session_t *session, const decode_session_t *donor)
{
    (void)session;
    (void)donor;
    return 1;
}

/* 64 * the largest compression ratio: a shared prefix covers whole pages of every source. */
static int64_t share_unit(const engine_config_t *cfg)
{
    int64_t unit = KERN_KV_PAGE_ROWS;
    for (int s = 0; s < cfg->n_kv_source_layer_ids; s++) {
        int64_t u = KERN_KV_PAGE_ROWS * (int64_t)cfg->roles[cfg->kv_source_layer_ids[s]].ratio;
        unit = u > unit ? u : unit;
    }
    return unit;
}

/* Why the donor cannot give `session` its first p tokens matching ids[0, n_ids), or NULL. */
static const char *refusal(const decode_sched_t *s, const decode_session_t *session,
                           const decode_session_t *donor, int64_t p, const int32_t *ids,
                           size_t n_ids)
{
    if (!s->params.prefix_share) {
        return "prefix sharing is off (the decode node runs without --prefix-share)";
    }
    if (donor == NULL || donor == session || donor->seq == NULL) {
        return "the named session holds no state here";
    }
    if (!same_tenant(session, donor)) {
        return "the named session belongs to another tenant";
    }
    if (p % share_unit(s->cfg) != 0 || p < s->cfg->sliding_window) {
        return "cached_len is not a whole-page prefix of at least W tokens (MODEL.md 7)";
    }
    if (engine_seq_length(donor->seq) < p || donor->n_ids < p) {
        return "the named session holds fewer tokens (with ids) than cached_len";
    }
    /* matched on tokens, never on a hash alone: the router sends the ids it matched */
    if (ids == NULL || (int64_t)n_ids != p ||
        memcmp(donor->ids, ids, (size_t)p * sizeof(int32_t)) != 0) {
        return "prefix_ids differ from the named session's tokens";
    }
    return NULL;
}

tdm_status_t sched_prefix_share(decode_sched_t *s, decode_session_t *session,
                                const char *prefix_session_id, uint64_t cached_len,
                                const int32_t *prefix_ids, size_t n_prefix_ids)
{
    int64_t p = (int64_t)cached_len;
    decode_session_t *donor;
    const char *why;
    tdm_status_t status;

    if (prefix_session_id == NULL || prefix_session_id[0] == '\0' || cached_len == 0 ||
        (session->seq != NULL && engine_seq_length(session->seq) > 0)) {
        return TDM_ERR_UNSUPPORTED; /* not a new session starting from a shared prefix */
    }
    donor = decode_sessions_find(s->sessions, prefix_session_id);
    why = refusal(s, session, donor, p, prefix_ids, n_prefix_ids);
    if (why != NULL) {
        tdm_log(TDM_LOG_INFO, "sched", "prefix not shared: session=%s from=%s cached_len=%lld: %s",
                session->id, prefix_session_id, (long long)p, why);
        return TDM_ERR_UNSUPPORTED;
    }
    if (session->seq == NULL) {
        status = engine_seq_create(s->model, decode_pool_engine(s->pool), &session->seq);
        if (status != TDM_OK) {
            return status;
        }
    }
    status = engine_seq_share_prefix(session->seq, donor->seq, p);
    if (status == TDM_OK) {
        /* MODEL.md 6(d)(2) recovery: every layer's rings and the DSpark taps from the ids */
        status = engine_fwd_replay(s->fwd, session->seq, prefix_ids, p, ENGINE_REPLAY_RECOVERY,
                                   NULL);
    }
    if (status == TDM_OK) {
        status = decode_sessions_note_ids(session, 0, prefix_ids, p);
    }
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "sched", "prefix share failed: session=%s from=%s status=%s",
                session->id, prefix_session_id, tdm_status_name(status));
        decode_sessions_drop_state(session);
        return status;
    }
    s->stats.prefix_shares_total++;
    s->stats.prefix_shared_tokens_total += (uint64_t)p;
    tdm_log(TDM_LOG_DEBUG, "sched", "prefix shared: session=%s from=%s tokens=%lld pages=%u",
            session->id, prefix_session_id, (long long)p, engine_seq_n_pages(session->seq));
    return TDM_OK;
}

void sched_prefix_hold(decode_sched_t *s, const decode_session_t *session, uint32_t n_sources,
                       const uint32_t *first_target, engine_kv_table_t *held)
{
    engine_kv_pool_t *kv = decode_pool_engine(s->pool);

    for (uint32_t i = 0; i < NODE_MAX_SOURCES; i++) {
        int layer = i < n_sources ? (int)s->cfg->kv_source_layer_ids[i] : -1;
        const engine_kv_table_t *t =
            layer >= 0 && session->seq != NULL ? engine_seq_table(session->seq, layer) : NULL;
        uint32_t k = 0;

        memset(&held[i], 0, sizeof(held[i]));
        if (t == NULL) {
            continue;
        }
        (void)engine_kv_table_init(&held[i], layer, t->ratio);
        while (k < first_target[i] && k < t->n_pages &&
               (int64_t)(k + 1) * KERN_KV_PAGE_ROWS <= t->n_rows &&
               engine_kv_pool_page_refs(kv, t->page_ids[k]) >= 2) {
            k++;
        }
        if (k > 0) {
            (void)engine_kv_table_share(kv, &held[i], t, (int64_t)k * KERN_KV_PAGE_ROWS);
        }
    }
}

void sched_prefix_relink(decode_sched_t *s, engine_seq_t *seq, engine_kv_table_t *held)
{
    engine_kv_pool_t *kv = decode_pool_engine(s->pool);
    uint32_t n = 0;

    for (uint32_t i = 0; i < NODE_MAX_SOURCES; i++) {
        for (uint32_t j = 0; seq != NULL && j < held[i].n_pages; j++) {
            n += engine_seq_relink_page(seq, held[i].source_layer, j, held[i].page_ids[j]) ==
                 TDM_OK;
        }
        engine_kv_table_release(kv, &held[i]);
    }
    if (n > 0) {
        tdm_log(TDM_LOG_DEBUG, "sched", "handoff kept %u shared page(s) shared", n);
    }
}
