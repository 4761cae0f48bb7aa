/* router_place_ref.h - the placement policy of router/placement.h computed the plain way: a
 * linear scan over every live worker, and for each decode worker a scan over every worker for
 * its rack's prefill backlog (O(N^2) per decision). The oracle the indexed placement is checked
 * against (test_router_scale.c). Header-only (static functions). */
#ifndef TANDEM_TESTS_ROUTER_PLACE_REF_H
#define TANDEM_TESTS_ROUTER_PLACE_REF_H

#include <stdint.h>
#include <string.h>

#include "router/placement.h"
#include "router/registry.h"

/* One rack's aggregates by scan. */
typedef struct {
    uint32_t n_decode, n_prefill;
    uint64_t prefill_tokens, prefill_rate_milli;
} ref_rack_t;

static ref_rack_t ref_rack(router_registry_t *r, const char *rack)
{
    ref_rack_t k;

    memset(&k, 0, sizeof(k));
    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        if (!router_registry_placeable(w) || strcmp(w->rack, rack) != 0) {
            continue;
        }
        if (w->role == TANDEM__ROLE__ROLE_PREFILL) {
            k.n_prefill++;
            k.prefill_tokens += w->queued_prefill_tokens + w->n_assigned_tokens;
            k.prefill_rate_milli += router_worker_rate_milli(w);
        } else {
            k.n_decode++;
        }
    }
    return k;
}

static int ref_fleet_has_prefill(router_registry_t *r)
{
    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        if (router_registry_placeable(w) && w->role == TANDEM__ROLE__ROLE_PREFILL) {
            return 1;
        }
    }
    return 0;
}

/* The decode worker the policy picks, or -1. */
static int ref_place_decode(router_registry_t *r, uint64_t n_tokens)
{
    int fleet = ref_fleet_has_prefill(r);
    int best = -1;
    uint64_t best_score = 0;
    uint32_t best_active = 0;

    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        ref_rack_t k;
        uint64_t score;
        if (w->role != TANDEM__ROLE__ROLE_DECODE || !router_registry_placeable(w) ||
            !router_worker_holds(w, n_tokens)) {
            continue;
        }
        k = ref_rack(r, w->rack);
        score = router_worker_decode_score(w) +
                router_rack_term_score(fleet, k.n_prefill, k.prefill_tokens, k.prefill_rate_milli);
        if (best < 0 || score < best_score || (score == best_score && w->n_active < best_active)) {
            best = i;
            best_score = score;
            best_active = w->n_active;
        }
    }
    return best;
}

static int ref_prefill_usable(const router_worker_t *w, const router_worker_t *decode,
                              uint64_t n_tokens)
{
    return w->role == TANDEM__ROLE__ROLE_PREFILL && router_registry_placeable(w) &&
           (decode == NULL || router_registry_transports_shared(w, decode)) &&
           router_worker_holds(w, n_tokens);
}

/* The policy's choice inside `rack`, or -1. */
static int ref_best_in_rack(router_registry_t *r, const char *rack, const router_worker_t *decode,
                            uint64_t n_tokens, uint64_t session_key)
{
    const uint64_t slack = (uint64_t)(ROUTER_PLACE_HISTORY_SLACK_S * (double)ROUTER_SCORE_ONE);
    int best = -1, holder = -1;
    uint64_t best_b = 0, holder_b = 0;

    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        uint64_t b;
        if (!ref_prefill_usable(w, decode, n_tokens) || strcmp(w->rack, rack) != 0) {
            continue;
        }
        b = router_worker_backlog_score(w);
        if (best < 0 || b < best_b) {
            best = i;
            best_b = b;
        }
        if (router_worker_holds_session(w, session_key) && (holder < 0 || b < holder_b)) {
            holder = i;
            holder_b = b;
        }
    }
    if (holder >= 0 && holder_b <= best_b + slack) {
        return holder;
    }
    return best;
}

/* Whether `slot` is an answer the policy allows for a prefill job (rack ties between racks of
 * equal backlog may go either way). */
static int ref_prefill_ok(router_registry_t *r, const router_worker_t *decode, uint64_t n_tokens,
                          uint64_t session_key, int slot)
{
    const uint64_t saturated = (uint64_t)(ROUTER_PLACE_RACK_SATURATED_S * (double)ROUTER_SCORE_ONE);
    uint64_t min_backlog = UINT64_MAX;
    const router_worker_t *pw;
    ref_rack_t k;

    if (decode != NULL) {
        k = ref_rack(r, decode->rack);
        if (router_backlog_score(k.prefill_tokens, k.prefill_rate_milli) <= saturated) {
            int home = ref_best_in_rack(r, decode->rack, decode, n_tokens, session_key);
            if (home >= 0) {
                return slot == home;
            }
        }
    }
    /* the least loaded rack with a usable worker */
    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *w = router_registry_worker(r, i, 0);
        if (ref_prefill_usable(w, decode, n_tokens)) {
            k = ref_rack(r, w->rack);
            uint64_t b = router_backlog_score(k.prefill_tokens, k.prefill_rate_milli);
            min_backlog = b < min_backlog ? b : min_backlog;
        }
    }
    if (min_backlog == UINT64_MAX) {
        return slot == -1;
    }
    pw = router_registry_worker(r, slot, 0);
    if (pw == NULL) {
        return 0;
    }
    k = ref_rack(r, pw->rack);
    return router_backlog_score(k.prefill_tokens, k.prefill_rate_milli) == min_backlog &&
           slot == ref_best_in_rack(r, pw->rack, decode, n_tokens, session_key);
}

#endif
