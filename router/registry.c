#include "router/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "router/registry_impl.h"

#define ID_MIN_BUCKETS 256u

static void remove_slot(router_registry_t *r, int slot);

tdm_status_t router_registry_create(const proto_compat_t *compat, uint32_t timeout_ms,
                                    router_registry_t **registry_out)
{
    router_registry_t *r;

    if (compat == NULL || timeout_ms == 0 || registry_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    r->compat = compat;
    r->timeout_ns = (uint64_t)timeout_ms * TDM_NS_PER_MS;
    r->stall_grace_ns = (uint64_t)ROUTER_REGISTRY_STALL_GRACE_MS * TDM_NS_PER_MS;
    r->next_generation = 1;
    r->n_id_buckets = ID_MIN_BUCKETS;
    r->id_buckets = malloc(r->n_id_buckets * sizeof(*r->id_buckets));
    if (r->id_buckets == NULL || registry_index_init(r) != TDM_OK) {
        router_registry_destroy(r);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < r->n_id_buckets; i++) {
        r->id_buckets[i] = -1;
    }
    *registry_out = r;
    return TDM_OK;
}

void router_registry_set_stall_grace(router_registry_t *registry, uint32_t grace_ms)
{
    registry->stall_grace_ns =
        (uint64_t)(grace_ms > 0 ? grace_ms : ROUTER_REGISTRY_STALL_GRACE_MS) * TDM_NS_PER_MS;
}

router_worker_t *registry_slot_worker(const router_registry_t *r, int slot)
{
    uint32_t chunk = (uint32_t)slot / ROUTER_REGISTRY_CHUNK_SLOTS;

    if (slot < 0 || chunk >= r->n_chunks) {
        return NULL;
    }
    return &r->chunks[chunk]->w[(uint32_t)slot % ROUTER_REGISTRY_CHUNK_SLOTS];
}

registry_entry_t *registry_slot_entry(const router_registry_t *r, int slot)
{
    uint32_t chunk = (uint32_t)slot / ROUTER_REGISTRY_CHUNK_SLOTS;

    if (slot < 0 || chunk >= r->n_chunks) {
        return NULL;
    }
    return &r->chunks[chunk]->e[(uint32_t)slot % ROUTER_REGISTRY_CHUNK_SLOTS];
}

static void clear_slot(router_worker_t *w)
{
    free(w->transfer_descriptor);
    free(w->history_sessions);
    memset(w, 0, sizeof(*w));
}

void router_registry_destroy(router_registry_t *registry)
{
    if (registry == NULL) {
        return;
    }
    for (uint32_t c = 0; c < registry->n_chunks; c++) {
        for (int i = 0; i < ROUTER_REGISTRY_CHUNK_SLOTS; i++) {
            clear_slot(&registry->chunks[c]->w[i]);
        }
        free(registry->chunks[c]);
    }
    free(registry->chunks);
    free(registry->id_buckets);
    registry_index_fini(registry);
    free(registry);
}

static uint32_t id_bucket(uint32_t n_buckets, const char *id)
{
    return (uint32_t)(tdm_hash_xxh3_64(id, strlen(id)) & (n_buckets - 1));
}

int router_registry_find(const router_registry_t *registry, const char *routing_id)
{
    int slot = registry->id_buckets[id_bucket(registry->n_id_buckets, routing_id)];

    while (slot >= 0) {
        const router_worker_t *w = registry_slot_worker(registry, slot);
        if (w != NULL && w->generation != 0 && strcmp(w->id, routing_id) == 0) {
            return slot;
        }
        slot = registry_slot_entry(registry, slot)->next_in_bucket;
    }
    return -1;
}

/* Put live `slot` (its id set) into the id table, doubling the table past one slot per bucket
 * (out of memory: the table keeps its size, chains grow). */
static void id_link(router_registry_t *r, int slot)
{
    uint32_t b;

    if (r->n_live > r->n_id_buckets) {
        uint32_t n = r->n_id_buckets * 2;
        int *grown = malloc(n * sizeof(*grown));
        if (grown != NULL) {
            for (uint32_t i = 0; i < n; i++) {
                grown[i] = -1;
            }
            for (int s = router_registry_next(r, -1); s >= 0; s = router_registry_next(r, s)) {
                if (s == slot) {
                    continue;
                }
                b = id_bucket(n, registry_slot_worker(r, s)->id);
                registry_slot_entry(r, s)->next_in_bucket = grown[b];
                grown[b] = s;
            }
            free(r->id_buckets);
            r->id_buckets = grown;
            r->n_id_buckets = n;
        }
    }
    b = id_bucket(r->n_id_buckets, registry_slot_worker(r, slot)->id);
    registry_slot_entry(r, slot)->next_in_bucket = r->id_buckets[b];
    r->id_buckets[b] = slot;
}

static void id_unlink(router_registry_t *r, int slot)
{
    int *link = &r->id_buckets[id_bucket(r->n_id_buckets, registry_slot_worker(r, slot)->id)];

    while (*link >= 0 && *link != slot) {
        link = &registry_slot_entry(r, *link)->next_in_bucket;
    }
    if (*link == slot) {
        *link = registry_slot_entry(r, slot)->next_in_bucket;
    }
}

/* The lowest free slot, allocating a chunk when every one is taken; -1 out of memory. */
static int free_slot(router_registry_t *r)
{
    registry_chunk_t **chunks;
    registry_chunk_t *chunk;

    for (uint32_t c = 0; c < r->n_chunks; c++) {
        if (r->chunks[c]->n_live == ROUTER_REGISTRY_CHUNK_SLOTS) {
            continue;
        }
        for (int i = 0; i < ROUTER_REGISTRY_CHUNK_SLOTS; i++) {
            if (r->chunks[c]->w[i].generation == 0) {
                return (int)(c * ROUTER_REGISTRY_CHUNK_SLOTS + (uint32_t)i);
            }
        }
    }
    if (r->n_chunks >= (uint32_t)(INT32_MAX / ROUTER_REGISTRY_CHUNK_SLOTS) - 1) {
        return -1;
    }
    chunks = realloc(r->chunks, (r->n_chunks + 1) * sizeof(*chunks));
    if (chunks == NULL) {
        return -1;
    }
    r->chunks = chunks;
    chunk = calloc(1, sizeof(*chunk));
    if (chunk == NULL) {
        return -1;
    }
    r->chunks[r->n_chunks++] = chunk;
    return (int)((r->n_chunks - 1) * ROUTER_REGISTRY_CHUNK_SLOTS);
}

static void copy_id(char *dst, const char *src)
{
    size_t n = src != NULL ? strlen(src) : 0;

    if (n > ROUTER_WORKER_ID_BYTES) {
        n = ROUTER_WORKER_ID_BYTES;
    }
    if (n > 0) {
        memcpy(dst, src, n);
    }
    dst[n] = '\0';
}

int router_registry_transports_shared(const router_worker_t *a, const router_worker_t *b)
{
    if (a->n_transports == 0 || b->n_transports == 0) {
        return 1;
    }
    for (uint32_t i = 0; i < a->n_transports; i++) {
        for (uint32_t j = 0; j < b->n_transports; j++) {
            if (strcmp(a->transports[i], b->transports[j]) != 0) {
                continue;
            }
            /* shared memory reaches only a worker on the same host */
            if (strcmp(a->transports[i], "shm") == 0 && strcmp(a->node, b->node) != 0) {
                continue;
            }
            return 1;
        }
    }
    return 0;
}

int router_registry_placeable(const router_worker_t *w)
{
    return w != NULL && w->generation != 0 && !w->stalled && !w->draining;
}

static void join_transports(const router_worker_t *w, char *out, size_t out_bytes)
{
    size_t used = 0;

    out[0] = '\0';
    for (uint32_t i = 0; i < w->n_transports && used + 1 < out_bytes; i++) {
        int n = snprintf(out + used, out_bytes - used, "%s%s", i > 0 ? "," : "", w->transports[i]);
        if (n < 0) {
            break;
        }
        used += (size_t)n;
    }
}

/* Log and count the workers of the other role that `w` (just registered) shares no transport
 * with: their pairings never carry pages, so placement keeps them apart (issue 16). */
static void check_transport_pairs(router_registry_t *r, const router_worker_t *w)
{
    char mine[PROTO_MAX_TRANSPORTS * (PROTO_MAX_TRANSPORT_BYTES + 1) + 1];
    char theirs[sizeof(mine)];

    for (int i = router_registry_next(r, -1); i >= 0; i = router_registry_next(r, i)) {
        const router_worker_t *o = registry_slot_worker(r, i);
        if (o == w || o->generation == 0 || o->role == w->role ||
            router_registry_transports_shared(w, o)) {
            continue;
        }
        r->n_transport_mismatch_total++;
        join_transports(w, mine, sizeof(mine));
        join_transports(o, theirs, sizeof(theirs));
        tdm_log(TDM_LOG_WARN, "registry",
                "transport mismatch: worker=%s role=%s transports=[%s] and worker=%s role=%s "
                "transports=[%s] share none: no prefill job pairs them (those turns prefill on "
                "the decode node)",
                w->id, proto_role_name(w->role), mine, o->id, proto_role_name(o->role), theirs);
    }
}

static void refuse(router_registry_t *r, const char *routing_id, const char *reason)
{
    r->n_refused_total++;
    tdm_log(TDM_LOG_WARN, "registry", "registration refused: worker=%s reason=\"%s\"", routing_id,
            reason);
}

tdm_status_t router_registry_register(router_registry_t *registry, const char *routing_id,
                                      const Tandem__Register *reg, uint64_t now_ns, int *slot_out,
                                      char *reason, size_t reason_bytes)
{
    router_worker_t *w;
    uint8_t *descriptor = NULL;
    int slot;
    int fresh;
    tdm_status_t status;

    if (strcmp(routing_id, reg->incarnation_id) != 0) {
        snprintf(reason, reason_bytes, "incarnation id '%s' differs from routing id '%s'",
                 reg->incarnation_id, routing_id);
        refuse(registry, routing_id, reason);
        return TDM_ERR_MISMATCH;
    }
    status = proto_compat_check(registry->compat, reg, reason, reason_bytes);
    if (status != TDM_OK) {
        refuse(registry, routing_id, reason);
        return status;
    }
    slot = router_registry_find(registry, routing_id);
    fresh = slot < 0;
    if (fresh) {
        slot = free_slot(registry);
        if (slot < 0) {
            snprintf(reason, reason_bytes, "router worker table could not grow (out of memory)");
            refuse(registry, routing_id, reason);
            return TDM_ERR_NO_MEMORY;
        }
    }
    if (reg->transfer_descriptor.len > 0) {
        descriptor = malloc(reg->transfer_descriptor.len);
        if (descriptor == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        memcpy(descriptor, reg->transfer_descriptor.data, reg->transfer_descriptor.len);
    }
    w = registry_slot_worker(registry, slot);
    if (!fresh) {
        registry_index_unlink(registry, slot);
        if (strcmp(w->rack, reg->rack != NULL ? reg->rack : "") != 0) {
            registry_slot_entry(registry, slot)->rack = NULL; /* moved rack: attach again */
        }
    }
    if (fresh) {
        w->generation = registry->next_generation++;
        w->registered_ns = now_ns;
        tdm_log(TDM_LOG_INFO, "registry",
                "worker registered: worker=%s role=%s rack=%s node=%s pages=%u sequences=%u "
                "max_tokens=%llu transports=%zu",
                routing_id, proto_role_name(reg->role), reg->rack, reg->node,
                reg->capacity->total_pages, reg->capacity->max_sequences,
                (unsigned long long)reg->capacity->max_tokens, reg->n_transports);
    }
    free(w->transfer_descriptor);
    w->transfer_descriptor = descriptor;
    w->n_transfer_descriptor = reg->transfer_descriptor.len;
    copy_id(w->id, routing_id);
    copy_id(w->rack, reg->rack);
    copy_id(w->node, reg->node);
    w->role = reg->role;
    w->total_pages = reg->capacity->total_pages;
    w->max_sequences = reg->capacity->max_sequences;
    w->max_tokens = reg->capacity->max_tokens;
    w->n_transports = 0;
    for (size_t i = 0; i < reg->n_transports && i < PROTO_MAX_TRANSPORTS; i++) {
        snprintf(w->transports[w->n_transports++], sizeof(w->transports[0]), "%s",
                 reg->transports[i]);
    }
    w->free_pages = reg->capacity->total_pages;
    w->last_seen_ns = now_ns;
    if (fresh) {
        registry->n_live++;
        registry->chunks[(uint32_t)slot / ROUTER_REGISTRY_CHUNK_SLOTS]->n_live++;
        id_link(registry, slot);
    }
    if (registry_slot_entry(registry, slot)->rack == NULL &&
        registry_index_attach(registry, slot) != TDM_OK) {
        snprintf(reason, reason_bytes, "router rack table could not grow (out of memory)");
        remove_slot(registry, slot);
        return TDM_ERR_NO_MEMORY;
    }
    registry_index_link(registry, slot);
    check_transport_pairs(registry, w);
    *slot_out = slot;
    return TDM_OK;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* Keep the heartbeat's history session keys, sorted (out of memory: none, the hint is lost). */
static void set_history_sessions(router_worker_t *w, const Tandem__Load *load)
{
    size_t n = load->n_history_sessions;

    if (n > PROTO_MAX_HISTORY_SESSIONS) {
        n = PROTO_MAX_HISTORY_SESSIONS;
    }
    if (n != w->n_history_sessions) {
        uint64_t *keys = n > 0 ? realloc(w->history_sessions, n * sizeof(uint64_t)) : NULL;
        if (n > 0 && keys == NULL) {
            n = 0;
        }
        if (keys == NULL) {
            free(w->history_sessions);
        }
        w->history_sessions = keys;
    }
    w->n_history_sessions = (uint32_t)n;
    if (n > 0) {
        memcpy(w->history_sessions, load->history_sessions, n * sizeof(uint64_t));
        qsort(w->history_sessions, n, sizeof(uint64_t), cmp_u64);
    }
}

tdm_status_t router_registry_heartbeat(router_registry_t *registry, const char *routing_id,
                                       const Tandem__Heartbeat *hb, uint64_t now_ns)
{
    int slot = router_registry_find(registry, routing_id);
    router_worker_t *w;

    if (slot < 0) {
        return TDM_ERR_NOT_FOUND;
    }
    w = registry_slot_worker(registry, slot);
    registry_index_unlink(registry, slot);
    w->last_seen_ns = now_ns;
    w->heartbeat_seq = hb->seq;
    w->queued_prefill_tokens = hb->load->queued_prefill_tokens;
    w->running_sequences = hb->load->running_sequences;
    w->free_pages = hb->load->free_pages;
    w->reserved_pages = hb->load->reserved_pages;
    w->draining = w->draining || hb->load->draining; /* sticky: a drain never ends */
    if (hb->load->total_pages > 0) {
        w->total_pages = hb->load->total_pages;
    }
    w->recent_tokens_per_s =
        hb->load->recent_tokens_per_s >= 0.0 ? hb->load->recent_tokens_per_s : 0.0;
    if (hb->load->stalled && !w->stalled) {
        w->stalled_since_ns = now_ns;
        tdm_log(TDM_LOG_WARN, "registry", "worker stalled: worker=%s role=%s pending=%u", w->id,
                proto_role_name(w->role), hb->load->pending_work);
    } else if (!hb->load->stalled && w->stalled) {
        w->stalled_since_ns = 0;
        tdm_log(TDM_LOG_INFO, "registry", "worker progressing again: worker=%s", w->id);
    }
    w->stalled = hb->load->stalled ? 1 : 0;
    set_history_sessions(w, hb->load);
    registry_index_link(registry, slot);
    return TDM_OK;
}

int router_registry_touch(router_registry_t *registry, const char *routing_id, uint64_t now_ns)
{
    int slot = router_registry_find(registry, routing_id);

    if (slot >= 0) {
        registry_slot_worker(registry, slot)->last_seen_ns = now_ns;
    }
    return slot;
}

router_worker_t *router_registry_worker(router_registry_t *registry, int slot, uint64_t generation)
{
    router_worker_t *w = registry_slot_worker(registry, slot);

    if (w == NULL || w->generation == 0 || (generation != 0 && w->generation != generation)) {
        return NULL;
    }
    return w;
}

/* Free live `slot`: out of the indexes and the id table, then cleared. */
static void remove_slot(router_registry_t *r, int slot)
{
    registry_index_unlink(r, slot);
    registry_slot_entry(r, slot)->rack = NULL;
    id_unlink(r, slot);
    clear_slot(registry_slot_worker(r, slot));
    r->n_live--;
    r->chunks[(uint32_t)slot / ROUTER_REGISTRY_CHUNK_SLOTS]->n_live--;
}

void router_registry_remove(router_registry_t *registry, int slot,
                            router_registry_removal_t removal, const char *why)
{
    router_worker_t *w = router_registry_worker(registry, slot, 0);

    if (w == NULL) {
        return;
    }
    if (removal == ROUTER_REGISTRY_LOST) {
        registry->n_lost_total++;
        tdm_log(TDM_LOG_WARN, "registry", "worker lost: worker=%s role=%s reason=\"%s\"", w->id,
                proto_role_name(w->role), why);
    } else {
        tdm_log(TDM_LOG_INFO, "registry", "worker left: worker=%s role=%s reason=\"%s\"", w->id,
                proto_role_name(w->role), why);
    }
    remove_slot(registry, slot);
}

uint64_t router_registry_tick(router_registry_t *registry, uint64_t now_ns)
{
    uint64_t max_gap = (uint64_t)ROUTER_REGISTRY_MAX_TICK_GAP_MS * TDM_NS_PER_MS;
    uint64_t credit;

    if (registry->last_tick_ns == 0 || now_ns <= registry->last_tick_ns + max_gap) {
        if (now_ns > registry->last_tick_ns) {
            registry->last_tick_ns = now_ns;
        }
        return 0;
    }
    credit = now_ns - registry->last_tick_ns - max_gap;
    registry->last_tick_ns = now_ns;
    registry->stall_credit_ns_total += credit;
    for (int i = router_registry_next(registry, -1); i >= 0;
         i = router_registry_next(registry, i)) {
        router_worker_t *w = registry_slot_worker(registry, i);
        w->last_seen_ns = w->last_seen_ns + credit < now_ns ? w->last_seen_ns + credit : now_ns;
        if (w->stalled_since_ns != 0) {
            w->stalled_since_ns =
                w->stalled_since_ns + credit < now_ns ? w->stalled_since_ns + credit : now_ns;
        }
    }
    /* a loaded host delays the loop by a fraction of a second often: worth a warning only when
     * it approaches a heartbeat timeout */
    tdm_log(credit + max_gap >= registry->timeout_ns / 2 ? TDM_LOG_WARN : TDM_LOG_DEBUG, "registry",
            "router loop stalled: ms=%.0f; not counted against workers' heartbeats",
            (double)(credit + max_gap) / TDM_NS_PER_MS);
    return credit;
}

int router_registry_expire(const router_registry_t *registry, uint64_t now_ns, const char **why_out)
{
    for (int i = router_registry_next(registry, -1); i >= 0;
         i = router_registry_next(registry, i)) {
        const router_worker_t *w = registry_slot_worker(registry, i);
        const char *why = NULL;
        if (now_ns > w->last_seen_ns && now_ns - w->last_seen_ns > registry->timeout_ns) {
            why = "heartbeat timeout";
        } else if (w->stalled && now_ns > w->stalled_since_ns &&
                   now_ns - w->stalled_since_ns > registry->stall_grace_ns) {
            why = "stalled past its grace (work pending, no progress)";
        }
        if (why != NULL) {
            if (why_out != NULL) {
                *why_out = why;
            }
            return i;
        }
    }
    return -1;
}

int router_registry_capacity(const router_registry_t *registry)
{
    return (int)(registry->n_chunks * ROUTER_REGISTRY_CHUNK_SLOTS);
}

int router_registry_next(const router_registry_t *registry, int slot)
{
    uint32_t s = slot < 0 ? 0 : (uint32_t)slot + 1;

    while (s / ROUTER_REGISTRY_CHUNK_SLOTS < registry->n_chunks) {
        const registry_chunk_t *c = registry->chunks[s / ROUTER_REGISTRY_CHUNK_SLOTS];
        if (c->n_live == 0) { /* skip an empty chunk at once */
            s = (s / ROUTER_REGISTRY_CHUNK_SLOTS + 1) * ROUTER_REGISTRY_CHUNK_SLOTS;
            continue;
        }
        if (c->w[s % ROUTER_REGISTRY_CHUNK_SLOTS].generation != 0) {
            return (int)s;
        }
        s++;
    }
    return -1;
}

uint32_t router_registry_count(const router_registry_t *registry)
{
    return registry->n_live;
}

void router_registry_note_assigned(router_registry_t *registry, int slot, uint64_t generation,
                                   uint64_t n_tokens)
{
    router_worker_t *w = router_registry_worker(registry, slot, generation);

    if (w == NULL) {
        return;
    }
    registry_index_unlink(registry, slot);
    w->n_active++;
    w->n_assigned_tokens += n_tokens;
    registry_index_link(registry, slot);
}

void router_registry_note_released(router_registry_t *registry, int slot, uint64_t generation,
                                   uint64_t n_tokens)
{
    router_worker_t *w = router_registry_worker(registry, slot, generation);

    if (w == NULL) {
        return;
    }
    registry_index_unlink(registry, slot);
    w->n_active -= w->n_active > 0 ? 1 : 0;
    w->n_assigned_tokens -= w->n_assigned_tokens >= n_tokens ? n_tokens : w->n_assigned_tokens;
    registry_index_link(registry, slot);
}

void router_registry_set_draining(router_registry_t *registry, int slot)
{
    router_worker_t *w = router_registry_worker(registry, slot, 0);

    if (w == NULL || w->draining) {
        return;
    }
    registry_index_unlink(registry, slot);
    w->draining = 1;
    registry_index_link(registry, slot);
}

void router_registry_limit_max_tokens(router_registry_t *registry, int slot, uint64_t generation,
                                      uint64_t max_tokens)
{
    router_worker_t *w = router_registry_worker(registry, slot, generation);

    if (w == NULL || (w->max_tokens != 0 && w->max_tokens <= max_tokens)) {
        return;
    }
    registry_index_unlink(registry, slot);
    w->max_tokens = max_tokens;
    registry_index_link(registry, slot);
}

void router_registry_stats(const router_registry_t *registry, router_registry_stats_t *stats_out)
{
    router_registry_stats_t st;
    double prefill_rate = 0.0;
    uint64_t free_pages = 0;
    uint64_t total_pages = 0;

    memset(&st, 0, sizeof(st));
    for (int i = router_registry_next(registry, -1); i >= 0;
         i = router_registry_next(registry, i)) {
        const router_worker_t *w = registry_slot_worker(registry, i);
        st.n_stalled += w->stalled ? 1u : 0u;
        if (w->role == TANDEM__ROLE__ROLE_PREFILL) {
            st.n_prefill++;
            st.queued_prefill_tokens += w->queued_prefill_tokens;
            prefill_rate += w->recent_tokens_per_s;
        } else {
            st.n_decode++;
            st.running_sequences += w->running_sequences;
            free_pages += w->free_pages < w->total_pages ? w->free_pages : w->total_pages;
            total_pages += w->total_pages;
        }
    }
    st.prefill_backlog_s =
        prefill_rate > 0.0 ? (double)st.queued_prefill_tokens / prefill_rate : 0.0;
    st.decode_kv_occupancy = total_pages > 0 ? 1.0 - (double)free_pages / (double)total_pages : 0.0;
    st.n_lost_total = registry->n_lost_total;
    st.n_refused_total = registry->n_refused_total;
    st.n_transport_mismatch_total = registry->n_transport_mismatch_total;
    st.router_stall_ms_total = registry->stall_credit_ns_total / TDM_NS_PER_MS;
    *stats_out = st;
}
