/* registry_impl.h - private layout of the registry (registry.c) and its placement indexes
 * (registry_index.c). Included by those two files only.
 *
 * Slots live in chunks of ROUTER_REGISTRY_CHUNK_SLOTS allocated on demand and never moved, so a
 * slot index (and a worker pointer) stays valid while the worker is registered; ids find their
 * slot through a chained hash table that grows with the number of workers. Each live slot has an
 * index entry: its rack, and (while placeable) its node in its rack's decode or prefill set.
 */
#ifndef TANDEM_ROUTER_REGISTRY_IMPL_H
#define TANDEM_ROUTER_REGISTRY_IMPL_H

#include "router/ordset.h"
#include "router/registry.h"

/* Slots per chunk. */
#define ROUTER_REGISTRY_CHUNK_SLOTS 256

/* One rack (NVLink domain): its placeable workers by role, ordered by score, and the prefill
 * sums its backlog is computed from. Owned by the registry; never freed before it. */
struct router_rack {
    char name[ROUTER_WORKER_ID_BYTES + 1];
    uint32_t id;                 /* index in rack table */
    router_ordset_t decode;      /* placeable decode workers, key: decode score */
    router_ordset_t prefill;     /* placeable prefill workers, key: backlog */
    uint64_t prefill_tokens;     /* queued + assigned over the prefill set */
    uint64_t prefill_rate_milli; /* tok/s x 1000 over the prefill set */
    router_ordnode_t by_decode;  /* in racks_by_decode while decode is not empty */
    router_ordnode_t by_prefill; /* in racks_by_prefill while prefill is not empty */
    struct router_rack *next_by_name;
};

/* One slot's index entry. */
typedef struct {
    router_rack_t *rack;   /* set while live */
    router_ordnode_t node; /* in rack->decode or rack->prefill while linked */
    uint64_t tokens;       /* what this worker added to rack->prefill_tokens */
    uint64_t rate_milli;   /* ... and to prefill_rate_milli */
    int linked;            /* 1 while in a set */
    int next_in_bucket;    /* id hash chain, -1 ends */
} registry_entry_t;

typedef struct {
    router_worker_t w[ROUTER_REGISTRY_CHUNK_SLOTS];
    registry_entry_t e[ROUTER_REGISTRY_CHUNK_SLOTS];
    uint32_t n_live;
} registry_chunk_t;

struct router_registry {
    const proto_compat_t *compat;
    uint64_t timeout_ns;
    uint64_t stall_grace_ns;
    uint64_t last_tick_ns; /* 0: never ticked */
    uint64_t stall_credit_ns_total;
    uint64_t n_transport_mismatch_total;
    uint64_t next_generation;
    uint64_t n_lost_total;
    uint64_t n_refused_total;
    registry_chunk_t **chunks; /* [n_chunks], each owned */
    uint32_t n_chunks;
    uint32_t n_live;
    int *id_buckets; /* [n_id_buckets] first slot of each chain, -1 empty */
    uint32_t n_id_buckets;
    /* placement indexes (registry_index.c) */
    router_rack_t **racks; /* [n_racks], each owned */
    uint32_t n_racks;
    router_rack_t **rack_buckets; /* [n_rack_buckets] by name */
    uint32_t n_rack_buckets;
    router_ordset_t racks_by_decode;  /* key: best decode score + rack term */
    router_ordset_t racks_by_prefill; /* key: rack prefill backlog */
    uint32_t n_placeable_prefill;     /* over the fleet */
};

/* The worker and index entry of `slot` (any state), or NULL past the chunks. */
router_worker_t *registry_slot_worker(const router_registry_t *r, int slot);
registry_entry_t *registry_slot_entry(const router_registry_t *r, int slot);

/* registry_index_init / _fini - set up / free the rack tables. */
tdm_status_t registry_index_init(router_registry_t *r);
void registry_index_fini(router_registry_t *r);

/* registry_index_attach - the live worker in `slot` joined rack w->rack (created on demand).
 * TDM_OK or TDM_ERR_NO_MEMORY (worker not attached). */
tdm_status_t registry_index_attach(router_registry_t *r, int slot);

/* registry_index_unlink - take `slot` out of its sets before its fields change. */
void registry_index_unlink(router_registry_t *r, int slot);

/* registry_index_link - put `slot` back, keyed by its current fields (when placeable). */
void registry_index_link(router_registry_t *r, int slot);

#endif
