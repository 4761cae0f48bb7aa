/* registry.h - the router's table of live workers: registration, liveness, load.
 *
 * Owns one slot per registered worker incarnation: its identity (incarnation id = ZeroMQ routing
 * id), role, rack, node, capacity, transfer descriptor and the latest load from its heartbeats,
 * plus the router's own count of work it has handed the worker since. Registration checks
 * compatibility (proto_compat_check) and refuses a mismatch, and keeps what the worker declared
 * for placement (transports, Capacity.max_tokens). Liveness uses only the monotonic clock and
 * counts silence only while the router itself runs: router_registry_tick credits every worker
 * with a gap in the router's own loop (the router descheduled, paused, or busy), so a router
 * that stalls never declares its workers dead on resume (issue 16). A worker that reports
 * Load.stalled (work pending, no progress) is lost once it has stayed stalled for the stall
 * grace, measured the same way; placement skips it meanwhile. Each registration gets a fresh
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

/* Longest gap between two router_registry_tick calls that counts as the router running; the
 * rest of a longer gap is the router's own stall, credited to every worker. The control loop
 * ticks every 20 ms or sooner. */
#define ROUTER_REGISTRY_MAX_TICK_GAP_MS 100u

/* Default grace of a worker that reports itself stalled before it is declared lost. */
#define ROUTER_REGISTRY_STALL_GRACE_MS 10000u

/* One worker (plain data, owned by the registry; read through router_registry_worker). */
typedef struct {
    uint64_t generation;                 /* unique per registration; 0: free slot */
    char id[ROUTER_WORKER_ID_BYTES + 1]; /* incarnation id = ZeroMQ routing id */
    Tandem__Role role;
    char rack[ROUTER_WORKER_ID_BYTES + 1];
    char node[ROUTER_WORKER_ID_BYTES + 1];
    uint32_t total_pages; /* capacity */
    uint32_t max_sequences;
    uint64_t max_tokens; /* Capacity.max_tokens: longest sequence it holds; 0: not declared */
    char transports[PROTO_MAX_TRANSPORTS][PROTO_MAX_TRANSPORT_BYTES + 1]; /* Register.transports */
    uint32_t n_transports;   /* 0: not declared (any) */
    uint8_t *transfer_descriptor; /* owned; [n_transfer_descriptor] */
    size_t n_transfer_descriptor;
    uint64_t registered_ns; /* monotonic */
    uint64_t last_seen_ns;  /* monotonic, last message of any kind (moved later by the router's
                               own stalls, router_registry_tick) */
    uint64_t heartbeat_seq;
    /* latest Load */
    uint64_t queued_prefill_tokens;
    uint32_t running_sequences;
    uint32_t free_pages;
    uint32_t reserved_pages;
    double recent_tokens_per_s;
    int stalled;               /* Load.stalled: work pending, no progress (not placed on) */
    int draining;              /* Load.draining (or its ERROR_DRAINING): admits nothing new */
    uint64_t stalled_since_ns; /* monotonic (credited like last_seen_ns); 0 while not stalled */
    /* Load.history_sessions: session keys (proto_session_hash) whose history pages this prefill
     * worker keeps, sorted ascending (router_worker_holds_session), owned; a hint only */
    uint64_t *history_sessions;
    uint32_t n_history_sessions;
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
    uint64_t n_transport_mismatch_total; /* prefill/decode pairs sharing no transport, counted
                                            when the later of the two registered */
    uint32_t n_stalled;                  /* live workers reporting stalled */
    uint64_t router_stall_ms_total;      /* the router's own loop stalls credited to workers */
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

/* router_registry_set_stall_grace - how long a worker may report Load.stalled before it is
 * declared lost (router_registry_expire); default ROUTER_REGISTRY_STALL_GRACE_MS; 0 keeps the
 * default. */
void router_registry_set_stall_grace(router_registry_t *registry, uint32_t grace_ms);

/* router_registry_destroy - free every slot. Accepts NULL. */
void router_registry_destroy(router_registry_t *registry);

/*
 * router_registry_register - admit the worker of `reg` (checked by proto_check) at now_ns.
 * The incarnation id must equal `routing_id` (the ZeroMQ identity the message came from).
 * A repeated Register of a live incarnation refreshes it (same generation). A prefill worker and
 * a decode worker that share no declared transport are logged (warn, both lists) and counted in
 * n_transport_mismatch_total; they stay registered, and placement never pairs them.
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
 * router_registry_tick - the router's loop ran at now_ns (monotonic). When more than
 * ROUTER_REGISTRY_MAX_TICK_GAP_MS passed since the previous tick, the excess is the router's own
 * stall: every live worker's last_seen_ns and stalled_since_ns move later by it (never past
 * now_ns), so silence is only counted while the router was running. Returns the credited
 * nanoseconds (0 normally). The first call only records now_ns. Call once per loop turn, before
 * router_registry_expire.
 */
uint64_t router_registry_tick(router_registry_t *registry, uint64_t now_ns);

/*
 * router_registry_expire - the first live worker silent since before now_ns - timeout, or
 * stalled (Load.stalled) since before now_ns - stall grace, as its slot; -1 when none. *why_out
 * (may be NULL) gets a static reason ("heartbeat timeout", "stalled past its grace"). The caller
 * handles and removes it, then asks again.
 */
int router_registry_expire(const router_registry_t *registry, uint64_t now_ns,
                           const char **why_out);

/*
 * router_registry_transports_shared - whether workers a and b can move pages: 1 when either
 * declared no transports (an older worker: any) or they declare at least one name in common
 * ("shm" counts only between workers of the same Register.node, the host name).
 */
int router_registry_transports_shared(const router_worker_t *a, const router_worker_t *b);

/*
 * router_registry_placeable - whether new work may go to `w`: live, not stalled, not draining.
 */
int router_registry_placeable(const router_worker_t *w);

/* router_registry_capacity - number of slots (iterate 0 .. capacity-1 with _worker). */
int router_registry_capacity(const router_registry_t *registry);

/* router_registry_stats - aggregates over live workers. */
void router_registry_stats(const router_registry_t *registry, router_registry_stats_t *stats_out);

#endif
