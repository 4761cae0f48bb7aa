#include "router/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

struct router_registry {
    const proto_compat_t *compat;
    uint64_t timeout_ns;
    uint64_t next_generation;
    uint64_t n_lost_total;
    uint64_t n_refused_total;
    router_worker_t slots[ROUTER_MAX_WORKERS];
};

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
    r->next_generation = 1;
    *registry_out = r;
    return TDM_OK;
}

static void clear_slot(router_worker_t *w)
{
    free(w->transfer_descriptor);
    memset(w, 0, sizeof(*w));
}

void router_registry_destroy(router_registry_t *registry)
{
    if (registry == NULL) {
        return;
    }
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        clear_slot(&registry->slots[i]);
    }
    free(registry);
}

int router_registry_find(const router_registry_t *registry, const char *routing_id)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        if (registry->slots[i].generation != 0 && strcmp(registry->slots[i].id, routing_id) == 0) {
            return i;
        }
    }
    return -1;
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
    if (slot < 0) {
        for (slot = 0; slot < ROUTER_MAX_WORKERS; slot++) {
            if (registry->slots[slot].generation == 0) {
                break;
            }
        }
        if (slot == ROUTER_MAX_WORKERS) {
            snprintf(reason, reason_bytes, "router worker table full (%d)", ROUTER_MAX_WORKERS);
            refuse(registry, routing_id, reason);
            return TDM_ERR_BUSY;
        }
    }
    if (reg->transfer_descriptor.len > 0) {
        descriptor = malloc(reg->transfer_descriptor.len);
        if (descriptor == NULL) {
            return TDM_ERR_NO_MEMORY;
        }
        memcpy(descriptor, reg->transfer_descriptor.data, reg->transfer_descriptor.len);
    }
    w = &registry->slots[slot];
    if (w->generation == 0) {
        w->generation = registry->next_generation++;
        w->registered_ns = now_ns;
        tdm_log(TDM_LOG_INFO, "registry",
                "worker registered: worker=%s role=%s rack=%s node=%s pages=%u sequences=%u",
                routing_id, proto_role_name(reg->role), reg->rack, reg->node,
                reg->capacity->total_pages, reg->capacity->max_sequences);
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
    w->free_pages = reg->capacity->total_pages;
    w->last_seen_ns = now_ns;
    *slot_out = slot;
    return TDM_OK;
}

tdm_status_t router_registry_heartbeat(router_registry_t *registry, const char *routing_id,
                                       const Tandem__Heartbeat *hb, uint64_t now_ns)
{
    int slot = router_registry_find(registry, routing_id);
    router_worker_t *w;

    if (slot < 0) {
        return TDM_ERR_NOT_FOUND;
    }
    w = &registry->slots[slot];
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
    return TDM_OK;
}

int router_registry_touch(router_registry_t *registry, const char *routing_id, uint64_t now_ns)
{
    int slot = router_registry_find(registry, routing_id);

    if (slot >= 0) {
        registry->slots[slot].last_seen_ns = now_ns;
    }
    return slot;
}

router_worker_t *router_registry_worker(router_registry_t *registry, int slot, uint64_t generation)
{
    router_worker_t *w;

    if (slot < 0 || slot >= ROUTER_MAX_WORKERS) {
        return NULL;
    }
    w = &registry->slots[slot];
    if (w->generation == 0 || (generation != 0 && w->generation != generation)) {
        return NULL;
    }
    return w;
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
    clear_slot(w);
}

int router_registry_expire(const router_registry_t *registry, uint64_t now_ns)
{
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        const router_worker_t *w = &registry->slots[i];
        if (w->generation != 0 && now_ns > w->last_seen_ns &&
            now_ns - w->last_seen_ns > registry->timeout_ns) {
            return i;
        }
    }
    return -1;
}

int router_registry_capacity(const router_registry_t *registry)
{
    (void)registry;
    return ROUTER_MAX_WORKERS;
}

void router_registry_stats(const router_registry_t *registry, router_registry_stats_t *stats_out)
{
    router_registry_stats_t st;
    double prefill_rate = 0.0;
    uint64_t free_pages = 0;
    uint64_t total_pages = 0;

    memset(&st, 0, sizeof(st));
    for (int i = 0; i < ROUTER_MAX_WORKERS; i++) {
        const router_worker_t *w = &registry->slots[i];
        if (w->generation == 0) {
            continue;
        }
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
    *stats_out = st;
}
