#include "router/placement.h"

#include <string.h>

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

static void note_miss(router_place_miss_t *miss, router_place_miss_t why)
{
    if (why > *miss) {
        *miss = why;
    }
}

/* Why no worker of `role` could take the job (the rare path: one scan over the workers), and the
 * largest max_tokens a placeable one declared. */
static router_place_miss_t explain_miss(router_registry_t *registry, Tandem__Role role,
                                        const router_worker_t *decode, uint64_t n_tokens,
                                        uint64_t *largest_out)
{
    router_place_miss_t miss = ROUTER_PLACE_MISS_NONE;
    uint64_t largest = 0;

    for (int i = router_registry_next(registry, -1); i >= 0;
         i = router_registry_next(registry, i)) {
        const router_worker_t *w = router_registry_worker(registry, i, 0);
        if (w->role != role) {
            continue;
        }
        if (!router_registry_placeable(w)) {
            note_miss(&miss, ROUTER_PLACE_MISS_STALLED);
            continue;
        }
        largest = w->max_tokens > largest ? w->max_tokens : largest;
        if (decode != NULL && !router_registry_transports_shared(w, decode)) {
            note_miss(&miss, ROUTER_PLACE_MISS_TRANSPORT);
            continue;
        }
        if (!router_worker_holds(w, n_tokens)) {
            note_miss(&miss, ROUTER_PLACE_MISS_CAPACITY);
        }
    }
    if (largest_out != NULL) {
        *largest_out = largest;
    }
    return miss;
}

/* (score, n_active, slot) order of decode candidates. */
static int key_less(uint64_t score_a, uint32_t tie_a, int slot_a, uint64_t score_b, uint32_t tie_b,
                    int slot_b)
{
    if (score_a != score_b) {
        return score_a < score_b;
    }
    if (tie_a != tie_b) {
        return tie_a < tie_b;
    }
    return slot_a < slot_b;
}

int router_place_decode(router_registry_t *registry, uint64_t n_tokens, uint64_t *generation_out,
                        router_place_miss_t *miss_out, uint64_t *largest_out)
{
    int best = -1;
    uint64_t best_score = 0;
    uint32_t best_tie = 0;

    /* Racks in order of their best worker's score + rack term: that is a lower bound for every
     * worker of the rack, so the walk stops at the first rack that cannot beat the best found
     * (usually after one rack and one worker). */
    for (const router_rack_t *k = router_registry_rack_next(registry, ROUTER_INDEX_DECODE, NULL);
         k != NULL; k = router_registry_rack_next(registry, ROUTER_INDEX_DECODE, k)) {
        router_rack_info_t info;
        int first = router_registry_index_next(registry, k, ROUTER_INDEX_DECODE, -1);
        const router_worker_t *fw = router_registry_worker(registry, first, 0);
        uint64_t term;

        router_registry_rack_info(registry, k, &info);
        if (best >= 0 &&
            !key_less(info.decode_key, fw->n_active, first, best_score, best_tie, best)) {
            break;
        }
        term = info.decode_key - router_worker_decode_score(fw);
        for (int s = first; s >= 0;
             s = router_registry_index_next(registry, k, ROUTER_INDEX_DECODE, s)) {
            const router_worker_t *w = router_registry_worker(registry, s, 0);
            uint64_t score;
            if (!router_worker_holds(w, n_tokens)) {
                continue;
            }
            score = router_worker_decode_score(w) + term;
            if (best < 0 || key_less(score, w->n_active, s, best_score, best_tie, best)) {
                best = s;
                best_score = score;
                best_tie = w->n_active;
            }
            break; /* the rack's first that holds it is its best */
        }
    }
    if (best >= 0) {
        *generation_out = router_registry_worker(registry, best, 0)->generation;
        return best;
    }
    {
        uint64_t largest = 0;
        router_place_miss_t miss =
            explain_miss(registry, TANDEM__ROLE__ROLE_DECODE, NULL, n_tokens, &largest);
        if (miss_out != NULL) {
            *miss_out = miss;
        }
        if (largest_out != NULL) {
            *largest_out = largest;
        }
    }
    return -1;
}

int router_place_prefill(router_registry_t *registry, const router_worker_t *decode,
                         uint64_t n_tokens, uint64_t *generation_out, router_place_miss_t *miss_out)
{
    return router_place_prefill_session(registry, decode, n_tokens, 0, generation_out, miss_out);
}

static int prefill_usable(const router_worker_t *w, const router_worker_t *decode,
                          uint64_t n_tokens)
{
    return (decode == NULL || router_registry_transports_shared(w, decode)) &&
           router_worker_holds(w, n_tokens);
}

/* The best usable prefill worker of rack k for the job: the least backlog, or within
 * ROUTER_PLACE_HISTORY_SLACK_S of it one that holds the session. -1 when none is usable. */
static int best_in_rack(router_registry_t *registry, const router_rack_t *k,
                        const router_worker_t *decode, uint64_t n_tokens, uint64_t session_key)
{
    const uint64_t slack = (uint64_t)(ROUTER_PLACE_HISTORY_SLACK_S * (double)ROUTER_SCORE_ONE);
    int best = -1;
    uint64_t best_backlog = 0;

    for (int s = router_registry_index_next(registry, k, ROUTER_INDEX_PREFILL, -1); s >= 0;
         s = router_registry_index_next(registry, k, ROUTER_INDEX_PREFILL, s)) {
        const router_worker_t *w = router_registry_worker(registry, s, 0);
        uint64_t backlog = router_worker_backlog_score(w);
        if (best >= 0 && (session_key == 0 || backlog > best_backlog + slack)) {
            break;
        }
        if (!prefill_usable(w, decode, n_tokens)) {
            continue;
        }
        if (best < 0) {
            best = s;
            best_backlog = backlog;
            if (router_worker_holds_session(w, session_key)) {
                break;
            }
        } else if (router_worker_holds_session(w, session_key)) {
            return s; /* it pulls only what changed since its last turn there */
        }
    }
    return best;
}

int router_place_rack_saturated(const router_registry_t *registry, const router_rack_t *rack)
{
    router_rack_info_t info;

    router_registry_rack_info(registry, rack, &info);
    return info.prefill_backlog >
           (uint64_t)(ROUTER_PLACE_RACK_SATURATED_S * (double)ROUTER_SCORE_ONE);
}

int router_place_prefill_session(router_registry_t *registry, const router_worker_t *decode,
                                 uint64_t n_tokens, uint64_t session_key, uint64_t *generation_out,
                                 router_place_miss_t *miss_out)
{
    const router_rack_t *home =
        decode != NULL ? router_registry_rack_named(registry, decode->rack) : NULL;
    int best = -1;

    if (home != NULL && !router_place_rack_saturated(registry, home)) {
        best = best_in_rack(registry, home, decode, n_tokens, session_key);
    }
    /* home saturated, or nothing usable there: the least loaded rack that has a usable one */
    for (const router_rack_t *k = router_registry_rack_next(registry, ROUTER_INDEX_PREFILL, NULL);
         best < 0 && k != NULL; k = router_registry_rack_next(registry, ROUTER_INDEX_PREFILL, k)) {
        best = best_in_rack(registry, k, decode, n_tokens, session_key);
    }
    if (best >= 0) {
        *generation_out = router_registry_worker(registry, best, 0)->generation;
        return best;
    }
    if (miss_out != NULL) {
        *miss_out = explain_miss(registry, TANDEM__ROLE__ROLE_PREFILL, decode, n_tokens, NULL);
    }
    return -1;
}
