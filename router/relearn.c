/* relearn.c - learning unknown sessions from peers' replicas and decode nodes (relearn.h). */
#include "router/relearn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "proto/proto_hash.h"

typedef struct parked {
    router_request_t *request; /* one reference */
    uint64_t query_id;
    char session_id[ROUTER_SESSION_ID_BYTES + 1];
    char node_id[ROUTER_RESIDENTS_ID_BYTES + 1];
    uint64_t deadline_ns;
    struct parked *next;
} parked_t;

struct router_relearn {
    router_registry_t *registry;
    router_sessions_t *sessions;
    router_residents_t *residents;
    uint64_t timeout_ns;
    uint64_t warmup_end_ns; /* named unknown sessions wait for reports until then */
    router_send_fn *send;
    void *send_ctx;
    router_relearn_submit_fn *submit;
    void *submit_ctx;
    parked_t *parked;
    uint64_t next_query;
    router_relearn_stats_t stats;
};

tdm_status_t router_relearn_create(router_registry_t *registry, router_sessions_t *sessions,
                                   router_residents_t *residents, uint32_t query_timeout_ms,
                                   uint32_t warmup_ms, router_send_fn *send, void *send_ctx,
                                   router_relearn_submit_fn *submit, void *submit_ctx,
                                   router_relearn_t **relearn_out)
{
    router_relearn_t *rl;

    if (registry == NULL || sessions == NULL || residents == NULL || send == NULL ||
        submit == NULL || relearn_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    rl = calloc(1, sizeof(*rl));
    if (rl == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    rl->registry = registry;
    rl->sessions = sessions;
    rl->residents = residents;
    rl->timeout_ns =
        (uint64_t)(query_timeout_ms != 0 ? query_timeout_ms : ROUTER_RELEARN_QUERY_TIMEOUT_MS) *
        TDM_NS_PER_MS;
    rl->warmup_end_ns = tdm_clock_now_ns() + (uint64_t)warmup_ms * TDM_NS_PER_MS;
    rl->send = send;
    rl->send_ctx = send_ctx;
    rl->submit = submit;
    rl->submit_ctx = submit_ctx;
    /* query ids differ between routers and restarts (a late answer never matches a new query) */
    rl->next_query = tdm_hash_splitmix64(tdm_clock_now_ns() ^ (uint64_t)(uintptr_t)rl) | 1;
    *relearn_out = rl;
    return TDM_OK;
}

/* Resume and free p (already unlinked). */
static void resume(router_relearn_t *rl, parked_t *p, uint64_t now_ns)
{
    rl->submit(rl->submit_ctx, p->request, now_ns);
    router_request_unref(p->request);
    free(p);
}

void router_relearn_destroy(router_relearn_t *relearn, uint64_t now_ns)
{
    if (relearn == NULL) {
        return;
    }
    while (relearn->parked != NULL) {
        parked_t *p = relearn->parked;
        relearn->parked = p->next;
        resume(relearn, p, now_ns);
    }
    free(relearn);
}

static int node_live(void *ctx, const char *node_id)
{
    router_relearn_t *rl = ctx;
    int slot = router_registry_find(rl->registry, node_id);
    router_worker_t *w = slot >= 0 ? router_registry_worker(rl->registry, slot, 0) : NULL;

    return w != NULL && w->role == TANDEM__ROLE__ROLE_DECODE;
}

static parked_t *parked_for_session(router_relearn_t *rl, const char *session_id)
{
    for (parked_t *p = rl->parked; p != NULL; p = p->next) {
        if (strcmp(p->session_id, session_id) == 0) {
            return p;
        }
    }
    return NULL;
}

/* Send a SessionQuery for p's session to node_id; p gets the query id, node and deadline.
 * Returns 0, or -1 when it could not be sent. */
static int send_query(router_relearn_t *rl, parked_t *p, const char *node_id, uint64_t node_len,
                      uint64_t now_ns)
{
    Tandem__Envelope env = TANDEM__ENVELOPE__INIT;
    Tandem__SessionQuery q = TANDEM__SESSION_QUERY__INIT;

    q.query_id = rl->next_query;
    q.session_id = p->session_id;
    env.body_case = TANDEM__ENVELOPE__BODY_SESSION_QUERY;
    env.session_query = &q;
    if (rl->send(rl->send_ctx, node_id, &env) != TDM_OK) {
        return -1;
    }
    p->query_id = rl->next_query;
    rl->next_query += 2;
    snprintf(p->node_id, sizeof(p->node_id), "%s", node_id);
    p->deadline_ns = now_ns + rl->timeout_ns;
    rl->stats.n_queries++;
    tdm_log(TDM_LOG_INFO, "relearn",
            "session query: session=%s node=%s reported_len=%llu query=%llu", p->session_id,
            node_id, (unsigned long long)node_len, (unsigned long long)p->query_id);
    return 0;
}

int router_relearn_submit(router_relearn_t *relearn, router_request_t *request, uint64_t now_ns)
{
    router_relearn_t *rl = relearn;
    const char *asked = router_request_asked_session(request);
    router_session_t *s;
    parked_t *ahead;
    parked_t *p;
    char node_id[ROUTER_RESIDENTS_ID_BYTES + 1];
    uint64_t node_len = 0;
    int reported;

    if (asked == NULL || asked[0] == '\0' || strlen(asked) > ROUTER_SESSION_ID_BYTES) {
        return 0;
    }
    ahead = parked_for_session(rl, asked);
    s = router_sessions_get(rl->sessions, asked);
    if (ahead == NULL && s != NULL &&
        (s->active_request != 0 ||
         (s->cached_len > 0 &&
          router_registry_worker(rl->registry, s->worker_slot, s->worker_generation) != NULL))) {
        return 0; /* busy (dispatch answers 409) or known and placed */
    }
    reported = ahead == NULL && router_residents_lookup(rl->residents, proto_session_hash(asked),
                                                        node_live, rl, node_id, &node_len);
    if (ahead == NULL && !reported && (s != NULL || now_ns >= rl->warmup_end_ns)) {
        return 0; /* nobody reports it, and no node is still on its way back */
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return 0;
    }
    snprintf(p->session_id, sizeof(p->session_id), "%s", asked);
    if (ahead != NULL) { /* a query (or a warmup wait) for this session is out: share it */
        p->query_id = ahead->query_id;
        snprintf(p->node_id, sizeof(p->node_id), "%s", ahead->node_id);
        p->deadline_ns = ahead->deadline_ns;
    } else if (reported) {
        if (send_query(rl, p, node_id, node_len, now_ns) != 0) {
            free(p);
            return 0;
        }
    } else { /* warmup: wait for the nodes' reports (query_id 0 never matches an answer) */
        p->deadline_ns = rl->warmup_end_ns;
        rl->stats.n_warmup_waits++;
        tdm_log(TDM_LOG_INFO, "relearn", "session waits for the nodes' reports: session=%s", asked);
    }
    p->request = router_request_ref(request);
    p->next = rl->parked;
    rl->parked = p;
    return 1;
}

/* Install what the node holds as the session's history, placed on that node. */
static void install(router_relearn_t *rl, const char *node_id, const Tandem__SessionHistory *h,
                    uint64_t now_ns)
{
    int slot = router_registry_find(rl->registry, node_id);
    router_worker_t *w = slot >= 0 ? router_registry_worker(rl->registry, slot, 0) : NULL;
    router_session_t *s = router_sessions_get(rl->sessions, h->session_id);

    if (w == NULL || (s != NULL && (s->active_request != 0 || s->tenant != h->tenant))) {
        rl->stats.n_not_found++;
        return;
    }
    if (s == NULL &&
        router_sessions_add(rl->sessions, h->session_id, h->tenant, now_ns, &s) != TDM_OK) {
        rl->stats.n_not_found++;
        return;
    }
    if (router_sessions_set_history(rl->sessions, s, h->tokens, h->n_tokens) != TDM_OK) {
        rl->stats.n_not_found++;
        return;
    }
    s->worker_slot = slot;
    s->worker_generation = w->generation;
    s->cached_len = (size_t)h->cached_len;
    s->prompt_len = h->prompt_len;
    s->last_used_ns = now_ns;
    rl->stats.n_learned++;
    tdm_log(TDM_LOG_INFO, "relearn", "session learned: session=%s node=%s cached_len=%llu",
            h->session_id, node_id, (unsigned long long)h->cached_len);
}

void router_relearn_on_history(router_relearn_t *relearn, const char *node_id,
                               const Tandem__SessionHistory *history, uint64_t now_ns)
{
    router_relearn_t *rl = relearn;
    parked_t **pp = &rl->parked;
    parked_t *ready = NULL;
    int matched = 0;

    while (*pp != NULL) {
        parked_t *p = *pp;
        if (p->query_id == history->query_id && strcmp(p->node_id, node_id) == 0 &&
            strcmp(p->session_id, history->session_id) == 0) {
            *pp = p->next;
            p->next = ready;
            ready = p;
            matched = 1;
        } else {
            pp = &p->next;
        }
    }
    if (!matched) {
        tdm_log(TDM_LOG_DEBUG, "relearn", "late or unknown session history: node=%s query=%llu",
                node_id, (unsigned long long)history->query_id);
        return;
    }
    if (history->found && history->cached_len > 0) {
        install(rl, node_id, history, now_ns);
    } else {
        rl->stats.n_not_found++;
        tdm_log(TDM_LOG_INFO, "relearn", "session not held: session=%s node=%s",
                history->session_id, node_id);
    }
    while (ready != NULL) { /* oldest first: they were pushed in front */
        parked_t *last = ready;
        parked_t **lp = &ready;
        while (last->next != NULL) {
            lp = &last->next;
            last = last->next;
        }
        *lp = NULL;
        resume(rl, last, now_ns);
    }
}

void router_relearn_on_replica(router_relearn_t *relearn, const Tandem__SessionReplica *replica,
                               uint64_t now_ns)
{
    router_relearn_t *rl = relearn;
    router_session_t *s = router_sessions_get(rl->sessions, replica->session_id);
    int slot = replica->decode_incarnation_id[0] != '\0'
                   ? router_registry_find(rl->registry, replica->decode_incarnation_id)
                   : -1;
    router_worker_t *w = slot >= 0 ? router_registry_worker(rl->registry, slot, 0) : NULL;

    if (replica->dropped ||
        (s != NULL && (s->active_request != 0 || s->tenant != replica->tenant))) {
        rl->stats.n_replicas_ignored++;
        return;
    }
    if (s == NULL && router_sessions_add(rl->sessions, replica->session_id, replica->tenant, now_ns,
                                         &s) != TDM_OK) {
        rl->stats.n_replicas_ignored++;
        return;
    }
    if (router_sessions_set_history(rl->sessions, s, replica->tokens, replica->n_tokens) !=
        TDM_OK) {
        rl->stats.n_replicas_ignored++;
        return;
    }
    if (w != NULL) {
        s->worker_slot = slot;
        s->worker_generation = w->generation;
        s->cached_len = replica->cached_len < replica->n_tokens ? (size_t)replica->cached_len
                                                                : replica->n_tokens;
    } else { /* its node is not (yet) known here: a SessionQuery finds it at the next turn */
        s->worker_slot = -1;
        s->worker_generation = 0;
        s->cached_len = 0;
    }
    s->prompt_len = replica->prompt_len;
    s->last_used_ns = now_ns;
    rl->stats.n_replicas_applied++;
}

int router_relearn_cancel(router_relearn_t *relearn, router_request_t *request)
{
    for (parked_t **pp = &relearn->parked; *pp != NULL; pp = &(*pp)->next) {
        parked_t *p = *pp;
        if (p->request == request) {
            *pp = p->next;
            tdm_log(TDM_LOG_INFO, "relearn", "parked turn released: session=%s", p->session_id);
            router_request_unref(p->request);
            free(p);
            return 1;
        }
    }
    return 0;
}

/* Warmup waiters whose session a node now reports: one query for each session, shared by every
 * turn of that session waiting. */
static void ask_reported(router_relearn_t *rl, uint64_t now_ns)
{
    for (parked_t *p = rl->parked; p != NULL; p = p->next) {
        char node_id[ROUTER_RESIDENTS_ID_BYTES + 1];
        uint64_t node_len = 0;

        if (p->query_id != 0 ||
            !router_residents_lookup(rl->residents, proto_session_hash(p->session_id), node_live,
                                     rl, node_id, &node_len) ||
            send_query(rl, p, node_id, node_len, now_ns) != 0) {
            continue;
        }
        for (parked_t *o = rl->parked; o != NULL; o = o->next) {
            if (o != p && o->query_id == 0 && strcmp(o->session_id, p->session_id) == 0) {
                o->query_id = p->query_id;
                snprintf(o->node_id, sizeof(o->node_id), "%s", p->node_id);
                o->deadline_ns = p->deadline_ns;
            }
        }
    }
}

void router_relearn_tick(router_relearn_t *relearn, uint64_t now_ns)
{
    parked_t **pp = &relearn->parked;

    ask_reported(relearn, now_ns);

    while (*pp != NULL) {
        parked_t *p = *pp;
        if (now_ns >= p->deadline_ns) {
            *pp = p->next;
            if (p->query_id != 0) {
                relearn->stats.n_timeouts++;
                tdm_log(TDM_LOG_WARN, "relearn", "session query timed out: session=%s node=%s",
                        p->session_id, p->node_id);
            }
            resume(relearn, p, now_ns);
        } else {
            pp = &p->next;
        }
    }
}

void router_relearn_stats(const router_relearn_t *relearn, router_relearn_stats_t *stats_out)
{
    *stats_out = relearn->stats;
}

void router_relearn_make_replica(router_relearn_t *relearn, const router_session_t *session,
                                 Tandem__SessionReplica *replica)
{
    router_worker_t *w =
        router_registry_worker(relearn->registry, session->worker_slot, session->worker_generation);

    replica->session_id = (char *)session->id;
    replica->tenant = session->tenant;
    replica->decode_incarnation_id = w != NULL ? w->id : "";
    replica->cached_len = w != NULL ? session->cached_len : 0;
    replica->tokens = session->tokens;
    replica->n_tokens = session->n_tokens;
    replica->prompt_len = (uint32_t)(session->prompt_len <= session->n_tokens ? session->prompt_len
                                                                              : session->n_tokens);
    replica->dropped = 0;
}
