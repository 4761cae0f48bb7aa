/* pool.h - the decode node's KV page pool and its reservations (docs/PROTOCOL.md section 4).
 *
 * Owns the engine page pool (engine/kv_cache.h), its registration with UCX as one xfer pool
 * (transfer/pool.h: page i of the engine pool is page i of the xfer pool, so a prefill node
 * reads and writes pages by engine page id; node/node_pages.h: the same bytes on the CPU, a host
 * staging copy when the engine runs on a device), and every reservation. A page is free (engine
 * pool), linked into a sequence (engine block tables, owned by sessions), or held by a reservation.
 * A reservation owns its pages until its handoff is consumed (decode_pool_release) or, after a
 * timeout or an abort, until its fence has passed: a page a remote write may still hit is never
 * reused (docs/PROTOCOL.md 4). The fence is the writer's: the router forwards the prefill node's
 * acknowledgement that it stopped and has nothing in flight (Abort.writer_fenced, or a reservation
 * no writer was ever given), and decode_pool_release then frees the pages at once. Only for a
 * writer that never answers (lost, killed or paused) is the fence time based: the pages wait
 * `fence_ms` after the abort or the timeout (the last resort: this pool cannot revoke a peer's
 * access to its memory). Knows nothing of sessions, requests or the router.
 */
#ifndef TANDEM_DECODE_POOL_H
#define TANDEM_DECODE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "node/node_handoff.h"
#include "node/node_pages.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "transfer/context.h"
#include "transfer/pool.h"

typedef enum {
    DECODE_RESV_ACTIVE = 0, /* waiting for its handoff */
    DECODE_RESV_FENCED = 1, /* aborted or timed out: pages held until fence_deadline_ns */
} decode_resv_state_t;

/* One reservation (owned by the pool; plain fields readable by the caller). */
typedef struct decode_resv {
    uint64_t id;
    uint64_t request_id;
    char session_id[129];
    uint64_t cached_len; /* H */
    uint64_t total_len;  /* T */
    decode_resv_state_t state;
    uint64_t deadline_ns; /* ACTIVE: timeout; FENCED: when the pages may be reused */
    uint32_t n_sources;
    uint32_t first_target[NODE_MAX_SOURCES];
    engine_kv_table_t tables[NODE_MAX_SOURCES]; /* the reserved pages, per source */
    uint32_t n_pages;
    /* Pages holding the session's state record at H for the prefill node to get (descriptor
     * version 3, decode_pool_stage; issue 18 item 4); n_pages 0 when none. Freed with the
     * reservation, counted in decode_pool_n_reserved, not in n_pages. */
    engine_kv_table_t stage;
    struct decode_resv *next;
} decode_resv_t;

typedef struct decode_pool decode_pool_t;

/*
 * decode_pool_create - n_pages pages for `model` (borrowed), registered in `xfer` (borrowed; may
 * be NULL: then no descriptor and no remote access). Returns TDM_OK, TDM_ERR_NO_MEMORY or the
 * transfer layer's status.
 */
tdm_status_t decode_pool_create(const engine_model_t *model, uint32_t n_pages, xfer_context_t *xfer,
                                decode_pool_t **pool_out);

/* decode_pool_destroy - release every reservation and the pool. Accepts NULL. */
void decode_pool_destroy(decode_pool_t *pool);

/* decode_pool_engine - the engine pool (owned by this pool). */
engine_kv_pool_t *decode_pool_engine(decode_pool_t *pool);

/* decode_pool_pages - the engine pool with the host bytes UCX reads and writes (owned by this
 * pool; node/node_pages.h): where a prefill node's puts land and its gets read. */
node_pages_t *decode_pool_pages(decode_pool_t *pool);

/* decode_pool_descriptor - the xfer pool descriptor (NULL/0 without UCX). */
void decode_pool_descriptor(const decode_pool_t *pool, const uint8_t **bytes_out, size_t *n_out);

/* Counts: pages in the pool, free, held by reservations (active or fenced). */
uint32_t decode_pool_n_total(const decode_pool_t *pool);
uint32_t decode_pool_n_free(const decode_pool_t *pool);
uint32_t decode_pool_n_reserved(const decode_pool_t *pool);

/*
 * decode_pool_reserve - reserve pages_per_source[s] pages for each source (layer/ratio from the
 * model config's kv_source_layer_ids order) for the delta [H, T); first_target[s] is the page
 * index of the sequence at T its first page receives. timeout_ms: the reservation lapses then.
 * Returns TDM_OK with *resv_out (owned by the pool), TDM_ERR_NO_PAGES (nothing changed) or
 * TDM_ERR_NO_MEMORY.
 */
tdm_status_t decode_pool_reserve(decode_pool_t *pool, uint64_t request_id, const char *session_id,
                                 uint64_t cached_len, uint64_t total_len,
                                 const uint32_t *first_target, const uint32_t *pages_per_source,
                                 uint32_t timeout_ms, decode_resv_t **resv_out);

/* decode_pool_find - the reservation `id` in any state, or NULL. */
decode_resv_t *decode_pool_find(decode_pool_t *pool, uint64_t id);

/* decode_pool_find_request - a reservation made for request_id (non-zero; active_only: an ACTIVE
 * one, else any state), or NULL. */
decode_resv_t *decode_pool_find_request(decode_pool_t *pool, uint64_t request_id, int active_only);

/* decode_pool_fence - an aborted reservation: keep its pages fence_ms more, then free them. */
void decode_pool_fence(decode_pool_t *pool, decode_resv_t *resv, uint32_t fence_ms);

/*
 * decode_pool_stage - hold n_bytes (> 0) of `bytes` (borrowed) in ceil(n_bytes / page) more
 * pages of resv (resv->stage), in order from the start of its first page: the state record at
 * H a prefill node gets with UCX instead of receiving it through the router. Once per
 * reservation. Returns TDM_OK, TDM_ERR_NO_PAGES (nothing changed), TDM_ERR_INVALID_ARG (staged
 * already, 0 bytes) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t decode_pool_stage(decode_pool_t *pool, decode_resv_t *resv, const uint8_t *bytes,
                               size_t n_bytes);

/* decode_pool_release - free the pages now, in any state: the handoff was consumed, or the
 * writer is fenced (acknowledged, or never given the reservation). `resv` is freed. */
void decode_pool_release(decode_pool_t *pool, decode_resv_t *resv);

/*
 * decode_pool_lapse_all - every ACTIVE reservation times out at once (the router that asked for
 * them is gone: restarted, or it declared this node lost and registered it again, so no handoff
 * will ever come). The next decode_pool_expire fences each one (its pages wait fence_ms, the
 * writer may still be putting) and reports it through on_lapse. Returns how many it lapsed.
 */
uint32_t decode_pool_lapse_all(decode_pool_t *pool, uint64_t now_ns);

/* decode_pool_lapse_if - decode_pool_lapse_all for the ACTIVE reservations pick(arg, resv) says
 * nonzero for (pick NULL: all): the ones one router of several asked for, when only that router
 * restarted or declared this node lost (issue 18 item 3). Returns how many it lapsed. */
uint32_t decode_pool_lapse_if(decode_pool_t *pool, uint64_t now_ns,
                              int (*pick)(void *arg, const decode_resv_t *resv), void *arg);

/*
 * decode_pool_expire - at now_ns, fence every ACTIVE reservation past its timeout (fence_ms) and
 * free every FENCED one past its fence. Calls on_lapse(arg, resv) for each newly timed-out one.
 * Returns the nanoseconds until the next deadline (UINT64_MAX when none).
 */
uint64_t decode_pool_expire(decode_pool_t *pool, uint64_t now_ns, uint32_t fence_ms,
                            void (*on_lapse)(void *arg, decode_resv_t *resv), void *arg);

#endif
