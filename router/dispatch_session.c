/* dispatch_session.c - which session a turn belongs to (docs/PROTOCOL.md 6: share pages, not
 * sessions; sessions belong to their tenant). Split from dispatch.c; shares its types through
 * dispatch_impl.h.
 */
#include "router/dispatch_impl.h"

#include <stdio.h>

#include "common/hash.h"
#include "common/http_status.h"

/* ---- sessions --------------------------------------------------------------------------- */

static tdm_status_t new_session(router_dispatch_t *d, uint32_t tenant, uint64_t now_ns,
                                router_session_t **s_out)
{
    char id[ROUTER_SESSION_ID_BYTES + 1];
    tdm_status_t status;

    do {
        d->session_counter++;
        snprintf(id, sizeof(id), "s-%016llx",
                 (unsigned long long)tdm_hash_splitmix64(d->session_salt + d->session_counter));
    } while (router_sessions_get(d->sessions, id) != NULL);
    status = router_sessions_add(d->sessions, id, tenant, now_ns, s_out);
    return status;
}

/*
 * Find or make the session of f; on failure f has been failed (and freed). A request names its
 * session (X-Session-Id, or previous_response_id's) or gets a new one: it is never attached to
 * a session found by prefix, which would continue another conversation's state (an approximate
 * rewind, and possibly another client's session). A prefix match of the same tenant only lets
 * the new session share the matched pages on the worker that holds them ("share pages, not
 * sessions"; docs/PROTOCOL.md 3c prefix_session_id). A named session of another tenant is a
 * 404, as if it did not exist.
 */
tdm_status_t dispatch_resolve_session(router_dispatch_t *d, inflight_t *f, uint64_t now_ns)
{
    const router_gen_request_t *gen = router_request_gen(f->req);
    const char *asked = router_request_asked_session(f->req);
    uint32_t tenant = router_request_tenant(f->req);
    router_session_t *s = NULL;
    router_session_t *m = NULL;
    size_t matched = 0;
    int share = 0;
    int share_slot = -1;
    uint64_t share_gen = 0;
    char share_id[ROUTER_SESSION_ID_BYTES + 1] = "";
    tdm_status_t status = TDM_OK;

    if (asked != NULL) {
        s = router_sessions_get(d->sessions, asked);
        if (s != NULL && s->tenant != tenant) {
            dispatch_fail(d, f, TDM_HTTP_NOT_FOUND, ROUTER_APIERR_NOT_FOUND, "session_not_found",
                          "session '%s' does not exist for this API key", asked);
            return TDM_ERR_NOT_FOUND;
        }
        if (s != NULL && s->active_request != 0) {
            dispatch_fail(d, f, TDM_HTTP_CONFLICT, ROUTER_APIERR_INVALID_REQUEST, "session_busy",
                          "session '%s' already has a request in flight", asked);
            return TDM_ERR_BUSY;
        }
        if (s == NULL) {
            status = router_sessions_add(d->sessions, asked, tenant, now_ns, &s);
        }
    } else {
        m = router_sessions_match_prefix(d->sessions, tenant, gen->prompt_ids, gen->n_prompt_ids,
                                         &matched);
        if (m != NULL) {
            router_metrics_count(d->metrics, ROUTER_METRIC_PREFIX_HITS, 1);
            /* m may be evicted to make room for the new session: keep what sharing needs. */
            share =
                router_registry_worker(d->registry, m->worker_slot, m->worker_generation) != NULL &&
                m->cached_len >= matched;
            share_slot = m->worker_slot;
            share_gen = m->worker_generation;
            snprintf(share_id, sizeof(share_id), "%s", m->id);
        }
        status = new_session(d, tenant, now_ns, &s);
        if (status == TDM_OK && share && router_sessions_get(d->sessions, share_id) == NULL) {
            share = 0; /* evicted: its pages may be gone with it */
        }
    }
    if (status != TDM_OK) {
        dispatch_fail(d, f, TDM_HTTP_UNAVAILABLE, ROUTER_APIERR_OVERLOADED, "sessions_full",
                      "the session table is full of active sessions");
        return status;
    }
    status = router_sessions_set_history(d->sessions, s, gen->prompt_ids, gen->n_prompt_ids);
    if (status != TDM_OK) {
        dispatch_fail(d, f, TDM_HTTP_INTERNAL, ROUTER_APIERR_SERVER, "internal_error",
                      "out of memory");
        return status;
    }
    if (share) {
        s->worker_slot = share_slot;
        s->worker_generation = share_gen;
        s->cached_len = matched;
        snprintf(f->prefix_session, sizeof(f->prefix_session), "%s", share_id);
    }
    s->prompt_len = gen->n_prompt_ids;
    s->active_request = f->id;
    s->last_used_ns = now_ns;
    f->session = s;
    router_request_set_session(f->req, s->id);
    return TDM_OK;
}
