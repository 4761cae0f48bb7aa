/* registry_index.c - the registry's placement indexes (registry.h, registry_impl.h): racks by
 * name, each rack's placeable workers ordered by score, the racks ordered by best decode score
 * plus rack term and by prefill backlog, kept by unlink (before a worker's fields change) and
 * link (after). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "router/registry_impl.h"

#define RACK_MIN_BUCKETS 64u
#define MILLI            1000u

/* ---- scores ------------------------------------------------------------------------------ */

uint64_t router_worker_decode_score(const router_worker_t *w)
{
    uint64_t occupancy = 0;
    uint64_t load;
    uint64_t max_sequences = w->max_sequences > 0 ? w->max_sequences : 1;

    if (w->total_pages > 0) {
        uint64_t free_pages = w->free_pages < w->total_pages ? w->free_pages : w->total_pages;
        occupancy = (w->total_pages - free_pages) * ROUTER_SCORE_ONE / w->total_pages;
    }
    load = ((uint64_t)w->running_sequences + w->n_active) * ROUTER_SCORE_ONE / max_sequences;
    return occupancy + load;
}

uint64_t router_worker_rate_milli(const router_worker_t *w)
{
    double milli = w->recent_tokens_per_s * MILLI;

    if (!(w->recent_tokens_per_s > 0.0)) {
        return (uint64_t)ROUTER_REGISTRY_DEFAULT_PREFILL_TOK_S * MILLI;
    }
    if (milli < 1.0) {
        return 1;
    }
    return milli > 1e15 ? (uint64_t)1e15 : (uint64_t)milli;
}

uint64_t router_backlog_score(uint64_t tokens, uint64_t rate_milli)
{
    const uint64_t limit = UINT64_MAX / 4;

    if (tokens == 0) {
        return 0;
    }
    if (rate_milli == 0 || tokens > limit / (MILLI * ROUTER_SCORE_ONE)) {
        return limit;
    }
    return tokens * MILLI * ROUTER_SCORE_ONE / rate_milli;
}

uint64_t router_worker_backlog_score(const router_worker_t *w)
{
    return router_backlog_score(w->queued_prefill_tokens + w->n_assigned_tokens,
                                router_worker_rate_milli(w));
}

uint64_t router_rack_term_score(int fleet_has_prefill, uint32_t n_prefill, uint64_t tokens,
                                uint64_t rate_milli)
{
    const uint64_t cap = (uint64_t)(ROUTER_PLACE_BACKLOG_CAP_S * (double)ROUTER_SCORE_ONE);
    const uint64_t per = (uint64_t)(1.0 / ROUTER_PLACE_BACKLOG_WEIGHT_PER_S + 0.5);
    uint64_t backlog;

    if (!fleet_has_prefill) {
        return 0;
    }
    if (n_prefill == 0) {
        return (uint64_t)(ROUTER_PLACE_NO_PREFILL_PENALTY * (double)ROUTER_SCORE_ONE);
    }
    backlog = router_backlog_score(tokens, rate_milli);
    return (backlog < cap ? backlog : cap) / per; /* weight 1/per per second */
}

/* ---- racks ------------------------------------------------------------------------------- */

tdm_status_t registry_index_init(router_registry_t *r)
{
    r->n_rack_buckets = RACK_MIN_BUCKETS;
    r->rack_buckets = calloc(r->n_rack_buckets, sizeof(*r->rack_buckets));
    if (r->rack_buckets == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    router_ordset_init(&r->racks_by_decode, 0x5eed0001u);
    router_ordset_init(&r->racks_by_prefill, 0x5eed0002u);
    return TDM_OK;
}

void registry_index_fini(router_registry_t *r)
{
    for (uint32_t i = 0; i < r->n_racks; i++) {
        free(r->racks[i]);
    }
    free(r->racks);
    free(r->rack_buckets);
}

static uint32_t rack_bucket(uint32_t n_buckets, const char *name)
{
    return (uint32_t)(tdm_hash_xxh3_64(name, strlen(name)) & (n_buckets - 1));
}

static router_rack_t *rack_find(const router_registry_t *r, const char *name)
{
    router_rack_t *k = r->rack_buckets[rack_bucket(r->n_rack_buckets, name)];

    while (k != NULL && strcmp(k->name, name) != 0) {
        k = k->next_by_name;
    }
    return k;
}

/* Double the rack buckets past one rack per bucket (out of memory: chains grow instead). */
static void rack_rehash(router_registry_t *r)
{
    uint32_t n = r->n_rack_buckets * 2;
    router_rack_t **grown = calloc(n, sizeof(*grown));

    if (grown == NULL) {
        return;
    }
    for (uint32_t i = 0; i < r->n_racks; i++) {
        uint32_t b = rack_bucket(n, r->racks[i]->name);
        r->racks[i]->next_by_name = grown[b];
        grown[b] = r->racks[i];
    }
    free(r->rack_buckets);
    r->rack_buckets = grown;
    r->n_rack_buckets = n;
}

static router_rack_t *rack_get(router_registry_t *r, const char *name)
{
    router_rack_t *k = rack_find(r, name);
    router_rack_t **racks;
    uint32_t b;

    if (k != NULL) {
        return k;
    }
    racks = realloc(r->racks, (r->n_racks + 1) * sizeof(*racks));
    if (racks == NULL) {
        return NULL;
    }
    r->racks = racks;
    k = calloc(1, sizeof(*k));
    if (k == NULL) {
        return NULL;
    }
    snprintf(k->name, sizeof(k->name), "%s", name);
    k->id = r->n_racks;
    router_ordset_init(&k->decode, 0xdec0de00u + k->id);
    router_ordset_init(&k->prefill, 0x9ef11000u + k->id);
    if (r->n_racks + 1 > r->n_rack_buckets) {
        rack_rehash(r); /* the racks so far; k is linked below */
    }
    r->racks[r->n_racks++] = k;
    b = rack_bucket(r->n_rack_buckets, name);
    k->next_by_name = r->rack_buckets[b];
    r->rack_buckets[b] = k;
    return k;
}

/* Re-key rack k in racks_by_decode (its best decode worker + its rack term). */
static void rack_rekey_decode(router_registry_t *r, router_rack_t *k)
{
    const router_ordnode_t *best = router_ordset_first(&k->decode);
    router_ordkey_t key;

    if (best == NULL) {
        router_ordset_remove(&r->racks_by_decode, &k->by_decode);
        return;
    }
    key = best->key;
    key.score += router_rack_term_score(r->n_placeable_prefill > 0, k->prefill.n, k->prefill_tokens,
                                        k->prefill_rate_milli);
    if (k->by_decode.n_levels != 0 && router_ordset_key_cmp(&key, &k->by_decode.key) == 0) {
        return; /* unchanged: most changes are to a worker that is not the rack's best */
    }
    router_ordset_remove(&r->racks_by_decode, &k->by_decode);
    router_ordset_insert(&r->racks_by_decode, &k->by_decode, &key);
}

static void rack_rekey_prefill(router_registry_t *r, router_rack_t *k)
{
    router_ordkey_t key = {0, 0, k->id};

    if (k->prefill.n == 0) {
        router_ordset_remove(&r->racks_by_prefill, &k->by_prefill);
        return;
    }
    key.score = router_backlog_score(k->prefill_tokens, k->prefill_rate_milli);
    if (k->by_prefill.n_levels != 0 && router_ordset_key_cmp(&key, &k->by_prefill.key) == 0) {
        return;
    }
    router_ordset_remove(&r->racks_by_prefill, &k->by_prefill);
    router_ordset_insert(&r->racks_by_prefill, &k->by_prefill, &key);
}

/* The fleet went from no placeable prefill worker to some, or back: every rack term changes. */
static void rekey_all_racks(router_registry_t *r)
{
    for (uint32_t i = 0; i < r->n_racks; i++) {
        rack_rekey_decode(r, r->racks[i]);
    }
}

tdm_status_t registry_index_attach(router_registry_t *r, int slot)
{
    router_rack_t *k = rack_get(r, registry_slot_worker(r, slot)->rack);

    if (k == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    registry_slot_entry(r, slot)->rack = k;
    return TDM_OK;
}

void registry_index_unlink(router_registry_t *r, int slot)
{
    registry_entry_t *e = registry_slot_entry(r, slot);
    const router_worker_t *w = registry_slot_worker(r, slot);
    router_rack_t *k = e->rack;

    if (!e->linked) {
        return;
    }
    e->linked = 0;
    if (w->role == TANDEM__ROLE__ROLE_PREFILL) {
        router_ordset_remove(&k->prefill, &e->node);
        k->prefill_tokens -= e->tokens;
        k->prefill_rate_milli -= e->rate_milli;
        e->tokens = 0;
        e->rate_milli = 0;
        r->n_placeable_prefill--;
        rack_rekey_prefill(r, k);
        if (r->n_placeable_prefill == 0) {
            rekey_all_racks(r);
            return;
        }
    } else {
        router_ordset_remove(&k->decode, &e->node);
    }
    rack_rekey_decode(r, k);
}

void registry_index_link(router_registry_t *r, int slot)
{
    registry_entry_t *e = registry_slot_entry(r, slot);
    const router_worker_t *w = registry_slot_worker(r, slot);
    router_rack_t *k = e->rack;
    router_ordkey_t key = {0, 0, (uint32_t)slot};

    if (e->linked || k == NULL || !router_registry_placeable(w)) {
        return;
    }
    e->linked = 1;
    if (w->role == TANDEM__ROLE__ROLE_PREFILL) {
        key.score = router_worker_backlog_score(w);
        router_ordset_insert(&k->prefill, &e->node, &key);
        e->tokens = w->queued_prefill_tokens + w->n_assigned_tokens;
        e->rate_milli = router_worker_rate_milli(w);
        k->prefill_tokens += e->tokens;
        k->prefill_rate_milli += e->rate_milli;
        r->n_placeable_prefill++;
        rack_rekey_prefill(r, k);
        if (r->n_placeable_prefill == 1) {
            rekey_all_racks(r);
            return;
        }
    } else {
        key.score = router_worker_decode_score(w);
        key.tie = w->n_active;
        router_ordset_insert(&k->decode, &e->node, &key);
    }
    rack_rekey_decode(r, k);
}

/* ---- queries ----------------------------------------------------------------------------- */

const router_rack_t *router_registry_rack_named(const router_registry_t *registry, const char *name)
{
    return rack_find(registry, name);
}

const router_rack_t *router_registry_rack_of(const router_registry_t *registry, int slot)
{
    const router_worker_t *w = registry_slot_worker(registry, slot);

    if (w == NULL || w->generation == 0) {
        return NULL;
    }
    return registry_slot_entry(registry, slot)->rack;
}

void router_registry_rack_info(const router_registry_t *registry, const router_rack_t *rack,
                               router_rack_info_t *info_out)
{
    const router_ordnode_t *best = router_ordset_first(&rack->decode);
    router_rack_info_t info;

    memset(&info, 0, sizeof(info));
    info.name = rack->name;
    info.n_decode = rack->decode.n;
    info.n_prefill = rack->prefill.n;
    info.prefill_tokens = rack->prefill_tokens;
    info.prefill_rate_milli = rack->prefill_rate_milli;
    info.prefill_backlog = router_backlog_score(rack->prefill_tokens, rack->prefill_rate_milli);
    if (best != NULL) {
        info.decode_key = best->key.score +
                          router_rack_term_score(registry->n_placeable_prefill > 0, rack->prefill.n,
                                                 rack->prefill_tokens, rack->prefill_rate_milli);
    }
    *info_out = info;
}

#define CONTAINER_OF(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

const router_rack_t *router_registry_rack_next(const router_registry_t *registry,
                                               router_index_t order, const router_rack_t *after)
{
    const router_ordnode_t *n;

    if (order == ROUTER_INDEX_PREFILL) {
        n = after == NULL ? router_ordset_first(&registry->racks_by_prefill)
                          : router_ordset_next(&after->by_prefill);
        return n == NULL ? NULL : CONTAINER_OF(n, router_rack_t, by_prefill);
    }
    n = after == NULL ? router_ordset_first(&registry->racks_by_decode)
                      : router_ordset_next(&after->by_decode);
    return n == NULL ? NULL : CONTAINER_OF(n, router_rack_t, by_decode);
}

int router_registry_index_next(const router_registry_t *registry, const router_rack_t *rack,
                               router_index_t set, int slot)
{
    const router_ordnode_t *n;

    if (slot < 0) {
        n = router_ordset_first(set == ROUTER_INDEX_PREFILL ? &rack->prefill : &rack->decode);
    } else {
        n = router_ordset_next(&registry_slot_entry(registry, slot)->node);
    }
    return n == NULL ? -1 : (int)n->key.id;
}

int router_registry_fleet_has_prefill(const router_registry_t *registry)
{
    return registry->n_placeable_prefill > 0;
}
