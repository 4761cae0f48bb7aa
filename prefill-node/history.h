/* history.h - the prefill node's cache of recently used sessions' history pages (issue 17,
 * item 6; docs/ARCHITECTURE.md "Prefill node history cache").
 *
 * A job continues a session from H: it needs the session's KV pages below H, which the decode
 * node holds. Without a cache the node pulls them all on every turn. This cache keeps, per
 * session, a copy of the pages the session had after its last job here (the pages below T: the
 * pulled history and the pages the job computed itself), so the next turn pulls only what it
 * lacks or what changed. A cached page is used only when the decode node's digest of its own page
 * (node_page_digest, in the reservation descriptor, taken right after it sealed the page) equals
 * the digest of the cached copy, and the copy passes kern_kv_page_check with its checksum against
 * the identity the job expects; anything else (a page the decode node rewound, appended to or
 * rebuilt, a descriptor without digests, a copy that no longer checks) is pulled. So a rewind on
 * the decode node never lets a stale page through. engine_seq_import checks every page once more.
 *
 * Bounded: at most max_bytes of page copies (and PREFILL_HISTORY_MAX_SESSIONS sessions);
 * keeping a session evicts the least recently used others until it fits; a session larger than
 * the whole budget is not kept. max_bytes 0 disables the cache (lookups miss, keeps keep nothing).
 * Owns its page copies (malloc'ed host memory, outside the engine's page pool). Knows nothing of
 * UCX or the router. Not thread-safe: the node's compute thread only.
 */
#ifndef TANDEM_PREFILL_HISTORY_H
#define TANDEM_PREFILL_HISTORY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/config.h"
#include "engine/kv_cache.h"
#include "engine/seq_state.h"
#include "node/node_handoff.h"
#include "node/node_pages.h"

/* Most sessions kept (and reported in Load.history_sessions). */
#define PREFILL_HISTORY_MAX_SESSIONS 4096u

/* The cache; opaque. */
typedef struct prefill_history prefill_history_t;

/* What the cache did and holds (plain data, prefill_history_stats). */
typedef struct {
    uint64_t hit_pages_total;  /* history pages a job took from the cache */
    uint64_t miss_pages_total; /* history pages a job had to pull (absent, changed, unchecked) */
    uint64_t evictions_total;  /* sessions dropped to make room */
    uint64_t bytes;            /* page bytes held now */
    uint32_t sessions;         /* sessions held now */
    uint64_t max_bytes;        /* the budget (0: disabled) */
} prefill_history_stats_t;

/*
 * prefill_history_create - an empty cache of at most max_bytes page bytes for the pages of the
 * model described by `cfg` (borrowed; must outlive the cache) stamped with `fingerprint`,
 * page_bytes each (engine_kv_pool_page_bytes). max_bytes 0: disabled.
 * Returns TDM_OK and *out, TDM_ERR_INVALID_ARG (NULL, page_bytes below the page header) or
 * TDM_ERR_NO_MEMORY; *out untouched on error.
 */
tdm_status_t prefill_history_create(const engine_config_t *cfg, uint64_t fingerprint,
                                    size_t page_bytes, uint64_t max_bytes, prefill_history_t **out);

/* prefill_history_destroy - free every copy. Accepts NULL. */
void prefill_history_destroy(prefill_history_t *h);

/*
 * prefill_history_lookup - the cached pages a job for `session_id` may use instead of pulling:
 * for each history page of `rd` (sources in order, then page order: the order the job pulls
 * them in), pages_out[k] is the cached copy when the session's entry holds that page of that
 * source with the digest rd gives for it and the copy checks (identity and checksum), else NULL.
 * Returns the number of non-NULL entries (0 for a session not held, a disabled cache or a
 * descriptor without digests). The copies are borrowed: valid, unchanged, until the next
 * prefill_history_keep / _drop / _destroy. Marks the session most recently used and counts the
 * hits and misses. pages_out: room for the sum of rd->src[s].n_history.
 */
uint32_t prefill_history_lookup(prefill_history_t *h, const char *session_id,
                                const node_resv_desc_t *rd, const void **pages_out);

/*
 * prefill_history_keep - make `session_id`'s entry the n_sources sources' pages: source s is KV
 * source layer layers[s] with n_pages[s] pages, pages[k] (page_bytes each, sealed; sources
 * concatenated). A page equal (by digest) to the one the entry held at the same place is kept
 * as it is; the others are copied. Evicts least recently used sessions until the entry fits; an
 * entry larger than max_bytes replaces nothing and drops the session's old entry (the next turn
 * pulls everything). Returns TDM_OK (also when disabled: nothing kept), TDM_ERR_INVALID_ARG or
 * TDM_ERR_NO_MEMORY (the session's entry is dropped; the cache stays consistent).
 */
tdm_status_t prefill_history_keep(prefill_history_t *h, const char *session_id, uint32_t n_sources,
                                  const int32_t *layers, const uint32_t *n_pages,
                                  const void *const *pages);

/*
 * prefill_history_keep_seq - prefill_history_keep with the pages of `seq` (borrowed; its pages
 * lie in `pages`' engine pool and every one is final and sealed): for each KV source of the
 * model, the pages holding its rows, as the decode node holds them. On the CPU they are read in
 * place; when the engine's pages are on a device they are downloaded into their staging copies
 * first (node/node_pages.h; no transfer may be reading those). Returns prefill_history_keep's
 * statuses, TDM_ERR_INVALID_ARG for NULL arguments, or the download's (the entry is dropped).
 */
tdm_status_t prefill_history_keep_seq(prefill_history_t *h, const char *session_id,
                                      node_pages_t *pages, const engine_seq_t *seq);

/* prefill_history_drop - forget `session_id` (a no-op when not held). */
void prefill_history_drop(prefill_history_t *h, const char *session_id);

/* prefill_history_stats - the counters and sizes now. h may be NULL (all zero). */
void prefill_history_stats(const prefill_history_t *h, prefill_history_stats_t *out);

/*
 * prefill_history_sessions - the proto_session_hash keys of the sessions held, most recently
 * used first, at most `max` into keys_out. Returns how many were written.
 */
uint32_t prefill_history_sessions(const prefill_history_t *h, uint64_t *keys_out, uint32_t max);

#endif
