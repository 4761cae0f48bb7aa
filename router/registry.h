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
 * references to a lost one never match. Slots come in chunks allocated on demand and never move
 * (no worker cap); an id finds its slot through a hash table. The registry also keeps placement
 * indexes incrementally (registry_index.c, issue 18): per rack (NVLink domain, Register.rack) its
 * placeable decode workers ordered by decode score and its placeable prefill workers ordered by
 * backlog, the rack's prefill backlog sums, and the racks ordered by their best decode score and
 * by their prefill backlog, so placement costs O(log N). Every change to a field the indexes
 * read (load, n_active, n_assigned_tokens, draining, stalled, max_tokens) goes through a
 * registry function. Knows nothing of sockets, sessions or requests.
 * Not thread-safe: the caller serialises access (the router's control state lock).
 */
#ifndef TANDEM_ROUTER_REGISTRY_H
#define TANDEM_ROUTER_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "proto/proto.h"

/* Workers have no fixed cap: slots come in chunks allocated on demand (registry_impl.h). */
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
    uint32_t n_transports;        /* 0: not declared (any) */
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
    /* the router's own view since the last heartbeat (changed only through
     * router_registry_note_assigned / _note_released) */
    uint32_t n_active;          /* requests or jobs in flight on it */
    uint64_t n_assigned_tokens; /* prefill tokens handed to it, not yet done */
} router_worker_t;

/* ---- load scores the placement indexes keep (fixed point, exact integer order) ---- */

/* Fixed-point unit of every score: 1.0 = ROUTER_SCORE_ONE. */
#define ROUTER_SCORE_ONE (UINT64_C(1) << 20)
/* Prefill rate assumed for a worker that has measured none, tokens/s. */
#define ROUTER_REGISTRY_DEFAULT_PREFILL_TOK_S 1000u

/* Score added to a decode worker whose rack has no placeable prefill worker while another rack
 * has (0.5). */
#define ROUTER_PLACE_NO_PREFILL_PENALTY 0.5
/* Weight of a rack's prefill backlog (per second) in the decode score, and its cap. */
#define ROUTER_PLACE_BACKLOG_WEIGHT_PER_S 0.05
#define ROUTER_PLACE_BACKLOG_CAP_S        10.0

/* router_worker_decode_score - KV occupancy (1 - free/total pages) + batch load ((running +
 * n_active) / max_sequences), each in ROUTER_SCORE_ONE units, rounded down. */
uint64_t router_worker_decode_score(const router_worker_t *w);

/* router_worker_rate_milli - measured prefill throughput x 1000 (tokens per 1,000 s; the default
 * ROUTER_REGISTRY_DEFAULT_PREFILL_TOK_S when none is measured). */
uint64_t router_worker_rate_milli(const router_worker_t *w);

/* router_backlog_score - seconds to prefill `tokens` at rate_milli / 1000 tok/s, in
 * ROUTER_SCORE_ONE units (saturates at UINT64_MAX / 4; 0 tokens: 0). */
uint64_t router_backlog_score(uint64_t tokens, uint64_t rate_milli);

/* router_worker_backlog_score - router_backlog_score of the worker's queued + assigned tokens. */
uint64_t router_worker_backlog_score(const router_worker_t *w);

/* router_rack_term_score - what a rack adds to its decode workers' score: 0 when the fleet has
 * no placeable prefill worker (fleet_has_prefill 0); ROUTER_PLACE_NO_PREFILL_PENALTY when the
 * rack has none (n_prefill 0); else ROUTER_PLACE_BACKLOG_WEIGHT_PER_S x its prefill backlog
 * (tokens over rate_milli, seconds) capped at ROUTER_PLACE_BACKLOG_CAP_S. */
uint64_t router_rack_term_score(int fleet_has_prefill, uint32_t n_prefill, uint64_t tokens,
                                uint64_t rate_milli);

/* Aggregates for /health and /metrics (plain data). */
typedef struct {
    uint32_t n_prefill;                  /* live prefill workers */
    uint32_t n_decode;                   /* live decode workers */
    uint64_t n_lost_total;               /* workers declared lost since start */
    uint64_t n_refused_total;            /* registrations refused */
    uint64_t n_transport_mismatch_total; /* prefill/decode pairs sharing no transport, counted
                                            when the later of the two registered */
    uint32_t n_stalled;                  /* live workers reporting stalled */
    uint64_t router_stall_ms_total;      /* the router's own loop stalls credited to workers */
    double prefill_backlog_s;            /* queued prefill tokens / prefill tok/s, all prefill */
    double decode_kv_occupancy;          /* 1 - free / total pages over decode workers, [0, 1] */
    uint64_t queued_prefill_tokens;      /* over prefill workers */
    uint32_t running_sequences;          /* over decode workers */
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
 * != routing_id; reason says which field and both values) or TDM_ERR_NO_MEMORY (the slot,
 * id or rack table could not grow; there is no fixed cap); reason (reason_bytes, may be 0) is
 * filled on failure. Logs the admission or the refusal once. The worker joins the placement
 * indexes of its rack (Register.rack) while placeable.
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

/* router_registry_capacity - number of slots allocated so far (slots are 0 .. capacity-1; most
 * callers iterate live ones with router_registry_next instead). */
int router_registry_capacity(const router_registry_t *registry);

/* router_registry_next - the first live slot after `slot` (-1: from the start), or -1 when none:
 * for (s = router_registry_next(r, -1); s >= 0; s = router_registry_next(r, s)). */
int router_registry_next(const router_registry_t *registry, int slot);

/* router_registry_count - live workers. */
uint32_t router_registry_count(const router_registry_t *registry);

/*
 * The router's own bookkeeping of the live worker (slot, generation) (generation 0: any); each
 * is a no-op when that incarnation is gone, and keeps the placement indexes right.
 *   note_assigned: one more request or job in flight, n_tokens more prefill tokens handed to it;
 *   note_released: one fewer, n_tokens fewer (never below 0);
 *   set_draining: it admits nothing new (sticky, like Load.draining);
 *   limit_max_tokens: it cannot hold max_tokens + 1 tokens (lowers Capacity.max_tokens; never
 *   raises it).
 */
void router_registry_note_assigned(router_registry_t *registry, int slot, uint64_t generation,
                                   uint64_t n_tokens);
void router_registry_note_released(router_registry_t *registry, int slot, uint64_t generation,
                                   uint64_t n_tokens);
void router_registry_set_draining(router_registry_t *registry, int slot);
void router_registry_limit_max_tokens(router_registry_t *registry, int slot, uint64_t generation,
                                      uint64_t max_tokens);

/* ---- placement indexes (registry_index.c) ---- */

/* A rack (NVLink domain); opaque, owned by the registry, valid until it is destroyed. */
typedef struct router_rack router_rack_t;

/* Which of a rack's sets, or which order of racks. */
typedef enum {
    ROUTER_INDEX_DECODE = 0,  /* decode workers by decode score; racks by best score + term */
    ROUTER_INDEX_PREFILL = 1, /* prefill workers by backlog; racks by prefill backlog */
} router_index_t;

/* A rack's aggregates (plain data, a snapshot). */
typedef struct {
    const char *name;            /* Register.rack ("" when none declared); borrowed */
    uint32_t n_decode;           /* placeable decode workers */
    uint32_t n_prefill;          /* placeable prefill workers */
    uint64_t prefill_tokens;     /* queued + assigned over them */
    uint64_t prefill_rate_milli; /* router_worker_rate_milli summed over them */
    uint64_t prefill_backlog;    /* router_backlog_score(prefill_tokens, prefill_rate_milli) */
    uint64_t decode_key;         /* best decode worker's score + rack term (n_decode > 0) */
} router_rack_info_t;

/* router_registry_rack_named - the rack called `name` (a worker of it has registered), or NULL. */
const router_rack_t *router_registry_rack_named(const router_registry_t *registry,
                                                const char *name);

/* router_registry_rack_of - the rack of live worker `slot`, or NULL. */
const router_rack_t *router_registry_rack_of(const router_registry_t *registry, int slot);

/* router_registry_rack_info - the aggregates of `rack`. */
void router_registry_rack_info(const router_registry_t *registry, const router_rack_t *rack,
                               router_rack_info_t *info_out);

/*
 * router_registry_rack_next - racks in ascending order of `order` after `after` (NULL: the
 * first), only those with a placeable worker of that role: ROUTER_INDEX_DECODE by decode_key
 * (then the best worker's n_active and slot), ROUTER_INDEX_PREFILL by prefill backlog (then
 * rack creation order). NULL at the end. O(1) per step.
 */
const router_rack_t *router_registry_rack_next(const router_registry_t *registry,
                                               router_index_t order, const router_rack_t *after);

/*
 * router_registry_index_next - the placeable workers of role `set` in `rack`, in ascending key
 * order (decode: router_worker_decode_score, then n_active, then slot; prefill:
 * router_worker_backlog_score, then slot): the slot after `slot` (-1: the first), or -1 at the
 * end. `slot` must be in that set. O(1) per step.
 */
int router_registry_index_next(const router_registry_t *registry, const router_rack_t *rack,
                               router_index_t set, int slot);

/* router_registry_fleet_has_prefill - whether any placeable prefill worker is live. */
int router_registry_fleet_has_prefill(const router_registry_t *registry);

/* router_registry_stats - aggregates over live workers. */
void router_registry_stats(const router_registry_t *registry, router_registry_stats_t *stats_out);

#endif
