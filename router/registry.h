/* registry.h - the router's table of live workers: registration, liveness, load.
 *
 * Owns one slot per registered worker incarnation: its identity (incarnation id = ZeroMQ routing
 * id), role, rack, node, capacity, transfer descriptor and the latest load from its heartbeats,
 * plus the router's own count of work it has handed the worker since. Registration checks
 * compatibility (proto_compat_check) and refuses a mismatch. Liveness uses only the monotonic
 * clock: a worker silent for longer than the timeout is lost. Each registration gets a fresh
 * generation number, so a restarted worker (a new incarnation) is a new peer and stale
 * references to a lost one never match. Knows nothing of sockets, sessions or requests.
 * Not thread-safe: the caller serialises access (the router's control state lock).
 */
#ifndef TANDEM_ROUTER_REGISTRY_H
#define TANDEM_ROUTER_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"

/* Most workers one router tracks. */
#define ROUTER_MAX_WORKERS 256
/* Longest worker id, rack or node, bytes (no NUL). */
#define ROUTER_WORKER_ID_BYTES PROTO_MAX_ID_BYTES

/* One worker (plain data, owned by the registry; read through router_registry_worker). */
typedef struct {
    uint64_t generation;                 /* unique per registration; 0: free slot */
    char id[ROUTER_WORKER_ID_BYTES + 1]; /* incarnation id = ZeroMQ routing id */
    Tandem__Role role;
    char rack[ROUTER_WORKER_ID_BYTES + 1];
    char node[ROUTER_WORKER_ID_BYTES + 1];
    uint32_t total_pages; /* capacity */
    uint32_t max_sequences;
    uint8_t *transfer_descriptor; /* owned; [n_transfer_descriptor] */
    size_t n_transfer_descriptor;
    uint64_t registered_ns; /* monotonic */
    uint64_t last_seen_ns;  /* monotonic, last message of any kind */
    uint64_t heartbeat_seq;
    /* latest Load */
    uint64_t queued_prefill_tokens;
    uint32_t running_sequences;
    uint32_t free_pages;
    uint32_t reserved_pages;
    double recent_tokens_per_s;
    int draining; /* Load.draining (or its ERROR_DRAINING): placement skips it (placement.h) */
    /* the router's own view since the last heartbeat */
    uint32_t n_active;          /* requests or jobs in flight on it */
    uint64_t n_assigned_tokens; /* prefill tokens handed to it, not yet done */
} router_worker_t;

/* Aggregates for /health and /metrics (plain data). */
typedef struct {
    uint32_t n_prefill;             /* live prefill workers */
    uint32_t n_decode;              /* live decode workers */
    uint64_t n_lost_total;          /* workers declared lost since start */
    uint64_t n_refused_total;       /* registrations refused */
    double prefill_backlog_s;       /* queued prefill tokens / prefill tok/s, all prefill */
    double decode_kv_occupancy;     /* 1 - free / total pages over decode workers, [0, 1] */
    uint64_t queued_prefill_tokens; /* over prefill workers */
    uint32_t running_sequences;     /* over decode workers */
} router_registry_stats_t;

/* The registry; opaque. */
typedef struct router_registry router_registry_t;

/*
 * router_registry_create - an empty registry that admits workers matching `compat` (borrowed;
 * must outlive the registry) and declares them lost after `timeout_ms` of silence (> 0).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY.
 */
tdm_status_t router_registry_create(const proto_compat_t *compat, uint32_t timeout_ms,
                                    router_registry_t **registry_out);

/* router_registry_destroy - free every slot. Accepts NULL. */
void router_registry_destroy(router_registry_t *registry);

/*
 * router_registry_register - admit the worker of `reg` (checked by proto_check) at now_ns.
 * The incarnation id must equal `routing_id` (the ZeroMQ identity the message came from).
 * A repeated Register of a live incarnation refreshes it (same generation).
 *
 * Returns TDM_OK with *slot_out, or (registry unchanged) TDM_ERR_MISMATCH (incompatible, or id
 * != routing_id; reason says which field and both values), TDM_ERR_BUSY (table full) or
 * TDM_ERR_NO_MEMORY; reason (reason_bytes, may be 0) is filled on failure. Logs the admission
 * or the refusal once.
 */
tdm_status_t router_registry_register(router_registry_t *registry, const char *routing_id,
                                      const Tandem__Register *reg, uint64_t now_ns, int *slot_out,
                                      char *reason, size_t reason_bytes);

/*
 * router_registry_heartbeat - record a heartbeat (load) of the live worker `routing_id`.
 * Returns TDM_OK or TDM_ERR_NOT_FOUND (not registered: it should register again).
 */
tdm_status_t router_registry_heartbeat(router_registry_t *registry, const char *routing_id,
                                       const Tandem__Heartbeat *hb, uint64_t now_ns);

/*
 * router_registry_touch - any other message from a live worker counts as a sign of life.
 * Returns the slot, or -1 when `routing_id` is not registered.
 */
int router_registry_touch(router_registry_t *registry, const char *routing_id, uint64_t now_ns);

/* router_registry_find - the slot of live worker `routing_id`, or -1. */
int router_registry_find(const router_registry_t *registry, const char *routing_id);

/*
 * router_registry_worker - the worker in `slot` when it is live and, if generation != 0, has
 * that generation; NULL otherwise. Borrowed until the slot is removed.
 */
router_worker_t *router_registry_worker(router_registry_t *registry, int slot, uint64_t generation);

/*
 * router_registry_remove - forget the worker in `slot` (goodbye, send failure, timeout), count
 * it as lost when `lost` is ROUTER_REGISTRY_LOST, and log why. No-op on a free slot.
 */
typedef enum {
    ROUTER_REGISTRY_LEFT = 0, /* it said goodbye */
    ROUTER_REGISTRY_LOST = 1, /* silent too long, or unreachable */
} router_registry_removal_t;
void router_registry_remove(router_registry_t *registry, int slot,
                            router_registry_removal_t removal, const char *why);

/*
 * router_registry_expire - the first live worker silent since before now_ns - timeout, as its
 * slot, or -1 when none. The caller handles and removes it, then asks again.
 */
int router_registry_expire(const router_registry_t *registry, uint64_t now_ns);

/* router_registry_capacity - number of slots (iterate 0 .. capacity-1 with _worker). */
int router_registry_capacity(const router_registry_t *registry);

/* router_registry_stats - aggregates over live workers. */
void router_registry_stats(const router_registry_t *registry, router_registry_stats_t *stats_out);

#endif
