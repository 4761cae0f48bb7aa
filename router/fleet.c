/* fleet.c - this router's part in a fleet of routers (fleet.h). */
#include "router/fleet.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "router/peers.h"
#include "router/residents.h"

struct router_fleet {
    router_registry_t *registry;
    router_sessions_t *sessions;
    router_residents_t *residents;
    router_relearn_t *relearn; /* NULL once stopped */
    router_peers_t *peers;
    uint64_t n_replicas_sent;
    router_relearn_stats_t final_stats; /* the relearning's counters when it stopped */
};

tdm_status_t router_fleet_create(const router_fleet_params_t *params, router_fleet_t **fleet_out)
{
    router_fleet_t *f;
    char err[512] = "";
    tdm_status_t status;

    if (params == NULL || params->zctx == NULL || params->router_id == NULL ||
        params->registry == NULL || params->sessions == NULL || fleet_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    f = calloc(1, sizeof(*f));
    if (f == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    f->registry = params->registry;
    f->sessions = params->sessions;
    status = router_residents_create(&f->residents);
    if (status == TDM_OK) {
        status = router_relearn_create(params->registry, params->sessions, f->residents,
                                       params->query_timeout_ms, params->warmup_ms, params->send,
                                       params->send_ctx, params->submit, params->submit_ctx,
                                       &f->relearn);
    }
    if (status == TDM_OK) {
        status = router_peers_create(params->zctx, params->router_id, params->peers, params->curve,
                                     &f->peers, err, sizeof(err));
        if (status != TDM_OK) {
            tdm_log(TDM_LOG_ERROR, "fleet", "peer routers refused: %s", err);
        }
    }
    if (status != TDM_OK) {
        router_fleet_destroy(f, 0);
        return status;
    }
    *fleet_out = f;
    return TDM_OK;
}

void router_fleet_stop(router_fleet_t *fleet, uint64_t now_ns)
{
    if (fleet != NULL && fleet->relearn != NULL) {
        router_relearn_stats(fleet->relearn, &fleet->final_stats);
        router_relearn_destroy(fleet->relearn, now_ns);
        fleet->relearn = NULL;
    }
}

void router_fleet_destroy(router_fleet_t *fleet, uint64_t now_ns)
{
    if (fleet == NULL) {
        return;
    }
    router_fleet_stop(fleet, now_ns);
    router_peers_destroy(fleet->peers);
    router_residents_destroy(fleet->residents);
    free(fleet);
}

void router_fleet_on_heartbeat(router_fleet_t *fleet, const char *worker_id,
                               const Tandem__Heartbeat *heartbeat)
{
    const Tandem__Load *load = heartbeat != NULL ? heartbeat->load : NULL;

    if (load == NULL) {
        return;
    }
    if (router_residents_update(fleet->residents, worker_id, load->resident_session_keys,
                                load->n_resident_session_keys, load->resident_cached_lens,
                                load->n_resident_cached_lens) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "fleet", "resident sessions not indexed: worker=%s keys=%zu",
                worker_id, load->n_resident_session_keys);
    }
}

void router_fleet_worker_gone(router_fleet_t *fleet, const char *worker_id)
{
    router_residents_forget(fleet->residents, worker_id);
}

int router_fleet_on_message(router_fleet_t *fleet, const char *sender_id,
                            const Tandem__Envelope *env, uint64_t now_ns)
{
    if (fleet->relearn == NULL) {
        return 0;
    }
    if (env->body_case == TANDEM__ENVELOPE__BODY_SESSION_REPLICA) {
        /* from a peer router (routing id "peer:<id>"), never registered as a worker */
        if (strncmp(sender_id, ROUTER_PEERS_ID_PREFIX, strlen(ROUTER_PEERS_ID_PREFIX)) != 0) {
            return 0;
        }
        router_relearn_on_replica(fleet->relearn, env->session_replica, now_ns);
        return 1;
    }
    if (env->body_case == TANDEM__ENVELOPE__BODY_SESSION_HISTORY) {
        if (router_registry_touch(fleet->registry, sender_id, now_ns) < 0) {
            return 0;
        }
        router_relearn_on_history(fleet->relearn, sender_id, env->session_history, now_ns);
        return 1;
    }
    return 0;
}

int router_fleet_submit(router_fleet_t *fleet, router_request_t *request, uint64_t now_ns)
{
    return fleet->relearn != NULL && router_relearn_submit(fleet->relearn, request, now_ns);
}

void router_fleet_release(router_fleet_t *fleet, router_request_t *request)
{
    char sid[ROUTER_SESSION_ID_BYTES + 1] = "";
    Tandem__SessionReplica r = TANDEM__SESSION_REPLICA__INIT;
    router_session_t *s;

    if (fleet->relearn == NULL) {
        return;
    }
    router_relearn_cancel(fleet->relearn, request); /* its client left while it was parked */
    if (router_peers_count(fleet->peers) == 0) {
        return;
    }
    router_request_session(request, sid, sizeof(sid));
    s = sid[0] != '\0' ? router_sessions_get(fleet->sessions, sid) : NULL;
    if (s == NULL || s->active_request != 0 || s->n_tokens == 0) {
        return;
    }
    router_relearn_make_replica(fleet->relearn, s, &r);
    fleet->n_replicas_sent += router_peers_replicate(fleet->peers, &r);
}

void router_fleet_tick(router_fleet_t *fleet, uint64_t now_ns)
{
    if (fleet->relearn != NULL) {
        router_relearn_tick(fleet->relearn, now_ns);
    }
    router_peers_drain(fleet->peers);
}

void router_fleet_gauges(const router_fleet_t *fleet, router_metrics_gauges_t *gauges)
{
    router_relearn_stats_t rs = fleet->final_stats;

    if (fleet->relearn != NULL) {
        router_relearn_stats(fleet->relearn, &rs);
    }
    gauges->n_session_queries = rs.n_queries;
    gauges->n_sessions_learned = rs.n_learned;
    gauges->n_session_query_timeouts = rs.n_timeouts;
    gauges->n_replicas_applied = rs.n_replicas_applied;
    gauges->n_replicas_sent = fleet->n_replicas_sent;
    gauges->n_replica_send_failures = router_peers_send_failures(fleet->peers);
    gauges->n_resident_indexed = router_residents_count(fleet->residents);
}
