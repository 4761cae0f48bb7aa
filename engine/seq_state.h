/* seq_state.h - the per-sequence state of MODEL.md sections 6 and 7.
 *
 * Owns, for one sequence of committed length n: one window ring per backbone layer and DSpark
 * block (capacity C = W + B + 1 entries, slot p mod C, entry d E4M3 codes + d/32 UE8M0 scales,
 * Q_swa), one block table per KV source (engine/kv_cache.h; pages owned by the table), the
 * pending half-group (a_p, b_p) FP32 of each ratio-2 KV source (present iff n is odd), and the
 * recent token ids (the last W + N - 1, for Engram lookback and bounded replay). Pages may be
 * shared with other sequences (engine_seq_share_prefix; reference-counted, copy-on-write). Exports and
 * imports exactly the section-7 handoff state record, optionally followed by the sequence's
 * pages, as one versioned byte blob, so another process can continue the sequence.
 * Knows nothing of the math that fills it (engine/forward.h). Not thread-safe; a sequence is
 * used by one forward call at a time.
 *
 * Blob format [tandem], little-endian, version 1 (docs/MODEL-NOTES.md):
 *   header 64 B: magic "TDSQ", u32 version, u64 model fingerprint, i64 length T, u32 n_rings,
 *     u32 ring entries stored E = min(W, T), u32 entry bytes (d + d/32), u32 n_ratio2 sources,
 *     u32 d, u32 n_ids stored = min(N - 1, T), u32 n_kv_sources, u32 flags (1 = pages follow),
 *     u64 page bytes;
 *   rings: for each ring r < n_rings, entries for positions T-E .. T-1 in order (codes, scales);
 *   pending: for each ratio-2 source in kv_source_layer_ids order: u32 present, then a[d], b[d]
 *     FP32 (zeros when absent);
 *   ids: n_ids int32, positions T-n_ids .. T-1;
 *   pages (flag 1): for each KV source: i64 n_rows, u32 n_pages, then n_pages sealed pages;
 *   trailer: u64 XXH3-64 of every byte before it.
 */
#ifndef TANDEM_ENGINE_SEQ_STATE_H
#define TANDEM_ENGINE_SEQ_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/kv_cache.h"
#include "engine/model.h"

#define ENGINE_SEQ_BLOB_MAGIC   "TDSQ"
#define ENGINE_SEQ_BLOB_VERSION 1u
#define ENGINE_SEQ_BLOB_HEADER_BYTES 64u

/* engine_seq_export flags. */
typedef enum {
    ENGINE_SEQ_EXPORT_RECORD = 0,    /* the section-7 state record only */
    ENGINE_SEQ_EXPORT_PAGES = 1u,    /* the record followed by every page of every KV source */
} engine_seq_export_flags_t;

/* One sequence's state; opaque. */
typedef struct engine_seq engine_seq_t;

/*
 * engine_seq_create - an empty sequence (length 0, no pages) of `model` drawing pages from
 * `pool`. Borrows model and pool: both must outlive the sequence.
 *
 * Returns TDM_OK and *seq_out (engine_seq_destroy frees it), TDM_ERR_INVALID_ARG for NULL, a pool
 * whose fingerprint is not the model's (TDM_ERR_MISMATCH), or TDM_ERR_NO_MEMORY.
 */
tdm_status_t engine_seq_create(const engine_model_t *model, engine_kv_pool_t *pool,
                               engine_seq_t **seq_out);

/* engine_seq_destroy - give every page back to the pool and free the state; accepts NULL. */
void engine_seq_destroy(engine_seq_t *seq);

/* engine_seq_length - committed tokens n. */
int64_t engine_seq_length(const engine_seq_t *seq);

/* engine_seq_n_rows - rows held by KV source `source_layer` (-1 when it is not a source). */
int64_t engine_seq_n_rows(const engine_seq_t *seq, int source_layer);

/* engine_seq_n_pages - pages held by all the sequence's block tables. */
uint32_t engine_seq_n_pages(const engine_seq_t *seq);

/*
 * engine_seq_table - the block table of KV source `source_layer`, owned by the sequence (NULL
 * when the layer is not a KV source). For transport code that puts or checks pages.
 */
const engine_kv_table_t *engine_seq_table(const engine_seq_t *seq, int source_layer);

/*
 * engine_seq_last_ids - copy the last min(n_ids_max, kept) committed token ids, oldest first,
 * into ids_out; returns how many were written. The sequence keeps the last W + N - 1 ids.
 */
int64_t engine_seq_last_ids(const engine_seq_t *seq, int32_t *ids_out, int64_t n_ids_max);

/*
 * engine_seq_ring_entry - the Q_swa codes [d] and scales [d/32] of ring `ring` (layer or DSpark
 * block, < n_roles) at position p, borrowed from the sequence; TDM_ERR_INVALID_ARG when p is
 * not within the last C positions or out of range. For tests and dumps. The bytes are the model
 * kernel table's memory (read them with its mem_copy D2H when its host_memory is 0).
 */
tdm_status_t engine_seq_ring_entry(const engine_seq_t *seq, int ring, int64_t p,
                                   const uint8_t **codes_out, const uint8_t **scales_out);

/*
 * engine_seq_rollback - shrink the committed length to n after a partial speculative accept
 * (MODEL.md 8, rollback): every KV source keeps n_c(n - 1) = floor(n / ratio) rows and index
 * keys (a ratio-2 row whose second token was dropped goes, with its pages); each ratio-2 pending
 * half becomes the verify scratch of token n - 1 when n is odd, else empty; ring entries (window
 * and DSpark context) and ids at positions >= n become invalid (C = W + B + 1 means no live
 * entry was overwritten: nothing is copied). n = length only gives back pages reserved beyond
 * the rows. The result equals, byte for byte in engine_seq_export, a sequence that ran only
 * tokens [0, n).
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (nothing changed) for NULL, n > length, or n below
 * engine_seq_rollback_floor (the scratch and rings no longer hold what n needs), or
 * TDM_ERR_NO_PAGES (nothing changed) when a shared page cut into finds no free page for its copy.
 */
tdm_status_t engine_seq_rollback(engine_seq_t *seq, int64_t n);

/* engine_seq_rollback_floor - the smallest n engine_seq_rollback accepts: length - (B + 1). */
int64_t engine_seq_rollback_floor(const engine_seq_t *seq);

/*
 * engine_seq_reset_rings - forget every ring entry (the window state), keeping pages, pending
 * halves, ids and the length. Used before a bounded replay (engine_fwd_replay).
 */
void engine_seq_reset_rings(engine_seq_t *seq);

/*
 * engine_seq_export_bytes - the size of engine_seq_export's blob for `flags`.
 */
size_t engine_seq_export_bytes(const engine_seq_t *seq, uint32_t flags);

/*
 * engine_seq_export - write the state record (and with ENGINE_SEQ_EXPORT_PAGES every page,
 * sealed first) into blob_out (blob_bytes >= engine_seq_export_bytes). Reads the sequence
 * (pages are sealed in place: their checksums are refreshed).
 *
 * Returns TDM_OK and *n_written_out, or TDM_ERR_INVALID_ARG (NULL, blob too small; nothing
 * written).
 */
tdm_status_t engine_seq_export(engine_seq_t *seq, uint32_t flags, uint8_t *blob_out,
                               size_t blob_bytes, size_t *n_written_out);

/*
 * engine_seq_import - a new sequence from a blob of engine_seq_export. With pages in the blob,
 * pages are taken from `pool`, checked (kern_kv_page_check: identity, fingerprint and checksum)
 * and copied in; without them, the caller adopts pages later (not supported yet: the sequence has
 * length T and no rows, TDM_ERR_UNSUPPORTED unless T has no rows).
 *
 * Returns TDM_OK and *seq_out, or with nothing changed (pool back to its free count):
 * TDM_ERR_INVALID_ARG (NULL), TDM_ERR_FORMAT (bad magic, version, sizes or checksum),
 * TDM_ERR_MISMATCH (another model's fingerprint or config dims, a page failing its check),
 * TDM_ERR_NO_PAGES, TDM_ERR_NO_MEMORY, TDM_ERR_UNSUPPORTED.
 */
tdm_status_t engine_seq_import(const engine_model_t *model, engine_kv_pool_t *pool,
                               const uint8_t *blob, size_t blob_bytes, engine_seq_t **seq_out);

/*
 * engine_seq_blob_add_pages - a blob with pages (flags ENGINE_SEQ_EXPORT_PAGES) made without the
 * sequence: `record` (an ENGINE_SEQ_EXPORT_RECORD blob of n_record bytes, trailer included) with
 * its flags set to 1, then for each of n_sources KV sources in kv_source_layer_ids order
 * i64 n_rows[s], u32 n_pages[s] and its n_pages[s] pages of page_bytes (pages[] holds every
 * source's pages back to back), then a fresh XXH3-64 trailer (format at the top of this file).
 * For a node that holds a sequence's record and pages but not the sequence (a handoff);
 * engine_seq_import checks the result. Reads the record's magic and version only: its trailer is
 * replaced, and the import checks the pages and every size.
 *
 * Returns TDM_OK with *blob_out (malloc'ed, caller frees) and *n_blob_out, TDM_ERR_FORMAT (NULL
 * or short record, bad magic or version) or TDM_ERR_NO_MEMORY; outputs untouched on error.
 */
tdm_status_t engine_seq_blob_add_pages(const uint8_t *record, size_t n_record, uint32_t n_sources,
                                       const int64_t *n_rows, const uint32_t *n_pages,
                                       const void *const *pages, size_t page_bytes,
                                       uint8_t **blob_out, size_t *n_blob_out);

/*
 * engine_seq_truncate - cut the sequence back to its first p tokens, p in [0, length], whatever
 * the distance (MODEL.md 6(d)(2), a prefix-cache hit: pages only). Every KV source keeps
 * n_c(p - 1) = floor(p / ratio) rows and index keys (rows below p are never rewritten; pages past
 * them go back to the pool, dropped slots of a kept page zeroed); pending halves are dropped, the
 * verify scratch forgotten, every ring (window and DSpark context) reset and the length set to p.
 * The sequence then lacks its window state: the caller MUST run engine_fwd_replay(...,
 * ENGINE_REPLAY_RECOVERY, ...) with the ids of [p - min(W, p) - N + 1, p) (or all p) before any
 * forward call (the replay also rebuilds the pending half when p is odd and rewrites the kept
 * ids). For p > 0 the result then equals, byte for byte in engine_seq_export, a sequence that
 * held only the pages of tokens [0, p) and was replayed the same way, and one that prefilled
 * only [0, p) when p <= W (the replay then runs from 0); it is approximate against a loss-free
 * continuation when p > W (MODEL.md 6(e)). p = 0 leaves an empty sequence (no replay).
 *
 * Pages the sequence shares with others (engine_seq_share_prefix) stay shared; a shared page cut
 * into is copied first (copy-on-write, engine/kv_cache.h).
 *
 * Returns TDM_OK, or (nothing changed) TDM_ERR_INVALID_ARG for NULL or p outside [0, length],
 * TDM_ERR_NO_PAGES when a copy-on-write finds no free page.
 */
tdm_status_t engine_seq_truncate(engine_seq_t *seq, int64_t p);

/*
 * engine_seq_relink_page - page i of KV source `source_layer` becomes the equal page `page_id`
 * that other sequences hold (engine_kv_table_relink: the sequence's own copy goes back to the
 * pool). Returns TDM_OK, TDM_ERR_INVALID_ARG (no such source, page or free page_id) or
 * TDM_ERR_MISMATCH (the bytes differ); nothing changed on error.
 */
tdm_status_t engine_seq_relink_page(engine_seq_t *seq, int source_layer, uint32_t i,
                                    uint32_t page_id);

/*
 * engine_seq_share_prefix - start the empty sequence dst (length 0, no pages) from the first p
 * tokens of src without computing them (MODEL.md 7 prefix cache, issue 17): dst links src's pages
 * holding the rows below p (each page then has one more reference, engine/kv_cache.h; both
 * sequences read them, a write into one copies it first) and is left exactly as
 * engine_seq_truncate(copy of src, p) would leave a copy of src: length p, rows n_c(p - 1) =
 * p / ratio per source, no pending half, no verify scratch, empty rings. p must be a multiple of
 * 64 * max ratio (whole pages, even p), 0 < p <= src's length; dst and src use one model and pool.
 * The caller MUST then run engine_fwd_replay(..., ENGINE_REPLAY_RECOVERY, ...) on dst with the
 * ids of [p - min(W, p) - N + 1, p) (or all p) - the ids are the caller's: src keeps only its
 * last W + N - 1 - before any other forward call. The result is then bit-identical (export, next
 * logits) to src cut back by engine_seq_truncate to p and replayed the same way, and approximate
 * against a cold prefill of the p tokens when p > W (MODEL.md 6(e)). src is not changed.
 *
 * Returns TDM_OK, or (nothing changed) TDM_ERR_INVALID_ARG (NULL, dst not empty, p not a whole
 * page multiple or out of range, other model or pool) or TDM_ERR_NO_MEMORY.
 */
tdm_status_t engine_seq_share_prefix(engine_seq_t *dst, const engine_seq_t *src, int64_t p);

#endif
