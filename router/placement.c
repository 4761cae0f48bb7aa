#include "router/placement.h"

#include <string.h>

/* Seconds of prefill backlog of one worker (0 when idle; queued tokens count as 1 s per 1,000
 * tokens while no throughput has been measured). */
static double backlog_s(const router_worker_t *w)
{
    double queued = (double)(w->queued_prefill_tokens + w->n_assigned_tokens);

    if (w->recent_tokens_per_s > 0.0) {
        return queued / w->recent_tokens_per_s;
    }
    return queued / 1000.0;
}

/* Least backlog of the rack's prefill workers, or a negative value when the rack has none. */
static double rack_backlog_s(router_registry_t *registry, const char *rack)
{
    double best = -1.0;

    for (int i = 0; i < router_registry_capacity(registry); i++) {
        const router_worker_t *w = router_registry_worker(registry, i, 0);
        if (!router_registry_placeable(w) || w->role != TANDEM__ROLE__ROLE_PREFILL ||
            strcmp(w->rack, rack) != 0) {
            continue;
        }
        if (best < 0.0 || backlog_s(w) < best) {
            best = backlog_s(w);
        }
    }
    return best;
}

const char *router_place_miss_name(router_place_miss_t miss)
{
    switch (miss) {
    case ROUTER_PLACE_MISS_STALLED:
        return "every worker of the role is stalled or draining";
    case ROUTER_PLACE_MISS_TRANSPORT:
        return "no prefill worker shares a transport with the decode worker";
    case ROUTER_PLACE_MISS_CAPACITY:
        return "no worker of the role declared it holds the sequence";
    default:
        return "no worker of the role";
    }
}

int router_worker_holds(const router_worker_t *w, uint64_t n_tokens)
{
    return w->max_tokens == 0 || n_tokens <= w->max_tokens;
}

static void note_miss(router_place_miss_t *miss, router_place_miss_t why)
{
    if (why > *miss) {
        *miss = why;
    }
}

static int any_prefill(router_registry_t *registry)
{
    for (int i = 0; i < router_registry_capacity(registry); i++) {
        const router_worker_t *w = router_registry_worker(registry, i, 0);
        if (router_registry_placeable(w) && w->role == TANDEM__ROLE__ROLE_PREFILL) {
            return 1;
        }
    }
    return 0;
}

static double decode_score(router_registry_t *registry, const router_worker_t *w, int have_prefill)
{
    double occupancy = 0.0;
    double load = (double)(w->running_sequences + w->n_active) /
                  (double)(w->max_sequences > 0 ? w->max_sequences : 1);
    double score;

    if (w->total_pages > 0) {
        uint32_t free_pages = w->free_pages < w->total_pages ? w->free_pages : w->total_pages;
        occupancy = 1.0 - (double)free_pages / (double)w->total_pages;
    }
    score = occupancy + load;
    if (have_prefill) {
        double rack = rack_backlog_s(registry, w->rack);
        if (rack < 0.0) {
            score += ROUTER_PLACE_NO_PREFILL_PENALTY;
        } else {
            score += ROUTER_PLACE_BACKLOG_WEIGHT_PER_S *
                     (rack < ROUTER_PLACE_BACKLOG_CAP_S ? rack : ROUTER_PLACE_BACKLOG_CAP_S);
        }
    }
    return score;
}

int router_place_decode(router_registry_t *registry, uint64_t n_tokens, uint64_t *generation_out,
                        router_place_miss_t *miss_out, uint64_t *largest_out)
{
    int have_prefill = any_prefill(registry);
    int best = -1;
    double best_score = 0.0;
    uint32_t best_active = 0;
    router_place_miss_t miss = ROUTER_PLACE_MISS_NONE;
    uint64_t largest = 0;

    for (int i = 0; i < router_registry_capacity(registry); i++) {
        const router_worker_t *w = router_registry_worker(registry, i, 0);
        double score;
        if (w == NULL || w->role != TANDEM__ROLE__ROLE_DECODE) {
            continue;
        }
        if (!router_registry_placeable(w)) { /* stalled or draining */
            note_miss(&miss, ROUTER_PLACE_MISS_STALLED);
            continue;
        }
        largest = w->max_tokens > largest ? w->max_tokens : largest;
        if (!router_worker_holds(w, n_tokens)) {
            note_miss(&miss, ROUTER_PLACE_MISS_CAPACITY);
            continue;
        }
        score = decode_score(registry, w, have_prefill);
        if (best < 0 || score < best_score || (score == best_score && w->n_active < best_active)) {
            best = i;
            best_score = score;
            best_active = w->n_active;
        }
    }
    if (best >= 0) {
        *generation_out = router_registry_worker(registry, best, 0)->generation;
    } else {
        if (miss_out != NULL) {
            *miss_out = miss;
        }
        if (largest_out != NULL) {
            *largest_out = largest;
        }
    }
    return best;
}

int router_worker_holds_session(const router_worker_t *w, uint64_t session_key)
{
    uint32_t lo = 0, hi = w->n_history_sessions;

    if (session_key == 0) {
        return 0;
    }
    while (lo < hi) { /* sorted ascending (registry.c) */
        uint32_t mid = lo + (hi - lo) / 2;
        if (w->history_sessions[mid] == session_key) {
            return 1;
        }
        if (w->history_sessions[mid] < session_key) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return 0;
}

int router_place_prefill(router_registry_t *registry, const router_worker_t *decode,
                         uint64_t n_tokens, uint64_t *generation_out,
                         router_place_miss_t *miss_out)
{
    return router_place_prefill_session(registry, decode, n_tokens, 0, generation_out, miss_out);
}

int router_place_prefill_session(router_registry_t *registry, const router_worker_t *decode,
                                 uint64_t n_tokens, uint64_t session_key, uint64_t *generation_out,
                                 router_place_miss_t *miss_out)
{
    const char *rack = decode != NULL ? decode->rack : NULL;
    router_place_miss_t miss = ROUTER_PLACE_MISS_NONE;
    int best = -1, holder = -1;
    int best_same_rack = 0, holder_same_rack = 0;
    double best_backlog = 0.0, holder_backlog = 0.0;

    for (int i = 0; i < router_registry_capacity(registry); i++) {
        const router_worker_t *w = router_registry_worker(registry, i, 0);
        int same_rack;
        double backlog;
        if (w == NULL || w->role != TANDEM__ROLE__ROLE_PREFILL) {
            continue;
        }
        if (!router_registry_placeable(w)) { /* stalled or draining */
            note_miss(&miss, ROUTER_PLACE_MISS_STALLED);
            continue;
        }
        if (decode != NULL && !router_registry_transports_shared(w, decode)) {
            note_miss(&miss, ROUTER_PLACE_MISS_TRANSPORT);
            continue;
        }
        if (!router_worker_holds(w, n_tokens)) {
            note_miss(&miss, ROUTER_PLACE_MISS_CAPACITY);
            continue;
        }
        same_rack = rack != NULL && strcmp(w->rack, rack) == 0;
        backlog = backlog_s(w);
        if (best < 0 || same_rack > best_same_rack ||
            (same_rack == best_same_rack && backlog < best_backlog)) {
            best = i;
            best_same_rack = same_rack;
            best_backlog = backlog;
        }
        if (router_worker_holds_session(w, session_key) &&
            (holder < 0 || same_rack > holder_same_rack ||
             (same_rack == holder_same_rack && backlog < holder_backlog))) {
            holder = i;
            holder_same_rack = same_rack;
            holder_backlog = backlog;
        }
    }
    if (holder >= 0 && holder_same_rack == best_same_rack &&
        holder_backlog <= best_backlog + ROUTER_PLACE_HISTORY_SLACK_S) {
        best = holder; /* it pulls only what changed since its last turn there */
    }
    if (best >= 0) {
        *generation_out = router_registry_worker(registry, best, 0)->generation;
    } else if (miss_out != NULL) {
        *miss_out = miss;
    }
    return best;
}
