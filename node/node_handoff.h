/* node_handoff.h - what a decode node and a prefill node exchange about one disaggregated turn
 * (docs/PROTOCOL.md 3b, MODEL.md 7 "Prefill -> decode handoff").
 *
 * Owns two byte formats:
 *  - the reservation descriptor (PageReservation.descriptor, PrefillJob.page_descriptor): for each
 *    KV source the decode node's pages that hold the session's rows below H (the prefill node
 *    pulls them with UCX gets) and the reserved pages that receive page indices
 *    floor(n_c(H)/64) .. of the sequence at T (UCX puts), plus the section-7 state record at H;
 *    wire form, little-endian: "TDRV", u32 version 2, u64 reservation id, u64 H, u64 T,
 *    u32 n_sources, per source {i32 layer, u32 n_history, u32 first_target, u32 n_targets,
 *    u32 history[n_history], u64 digests[n_history], u32 targets[n_targets]}, u64 record bytes,
 *    record, u64 XXH3-64 of every byte before it. Version 3 (the record at H staged in the
 *    decode node's pool, fields n_stage / stage / record_checksum below) replaces the inline
 *    record by u64 record checksum, u32 n_stage, u32 stage[n_stage]; encode writes version 3
 *    only when n_stage > 0, so an in-band descriptor stays version 2. digests[j] is
 *    node_page_digest of history page j as the decode node sealed it when it described the
 *    reservation (0: not known), so a prefill node that kept a copy of the page
 *    (prefill-node/history.h) pulls it only when the digests differ. Version 1 (no digests)
 *    still parses, with history_digests NULL;
 *  - a sequence blob with pages (engine/seq_state.h format, flag 1) assembled from a state record
 *    blob (flag 0) and the pages of every source, so engine_seq_import can check and adopt them.
 * Page ids are indices in the sender's xfer pool, which is the engine page pool's memory.
 * Knows nothing of UCX, ZeroMQ or the engine's objects.
 */
#ifndef TANDEM_NODE_HANDOFF_H
#define TANDEM_NODE_HANDOFF_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Most KV sources a descriptor carries. */
#define NODE_MAX_SOURCES 64u

/* One KV source's page lists (arrays owned by the descriptor). */
typedef struct {
    int32_t layer;
    uint32_t n_history;        /* pages of the session at H (pulled) */
    uint32_t first_target;     /* page index of the sequence at T that targets[0] receives */
    uint32_t n_targets;        /* pages put: indices first_target .. first_target + n_targets - 1 */
    uint32_t *history;         /* [n_history] decode-node page ids */
    uint64_t *history_digests; /* [n_history] node_page_digest of each history page (0: not
                                  known), or NULL: none known (encode writes zeros) */
    uint32_t *targets;         /* [n_targets] reserved decode-node page ids */
} node_resv_source_t;

/* A reservation descriptor. node_resv_desc_fini frees the arrays and the record. */
typedef struct {
    uint64_t reservation_id;
    uint64_t cached_len; /* H */
    uint64_t total_len;  /* T */
    uint32_t n_sources;
    node_resv_source_t src[NODE_MAX_SOURCES];
    uint8_t *record; /* engine_seq_export record blob at H; NULL when H = 0 or staged */
    size_t n_record; /* its bytes (also when staged) */
    /* Version 3 (sequence state off the router, issue 18 item 4): the record at H is not in the
     * descriptor (which the router relays) but in n_stage pages of the decode node's pool that
     * the reservation holds, its bytes in order from the start of stage[0], page after page; the
     * prefill node gets them with UCX and checks record_checksum (XXH3-64 of the n_record
     * bytes). n_stage 0: the record is inline (version 2). stage: owned after parse (fini frees
     * it); borrowed by encode. */
    uint32_t n_stage;
    uint32_t *stage;
    uint64_t record_checksum;
} node_resv_desc_t;

/* Bytes of a KV page's header that node_page_digest covers (kern_kv_page.h's 64-byte header). */
#define NODE_PAGE_DIGEST_BYTES 64u

/*
 * node_page_digest - the digest of a sealed KV page (kernels/kv_page.h): XXH3-64 of its 64-byte
 * header, which holds the page's identity (source layer, first row, dims, model fingerprint), its
 * row count and the XXH3-64 checksum of its rows, so two sealed pages with equal digests hold the
 * same rows (a page whose header says stale never equals a sealed one). Never returns 0 (a 0 hash
 * is mapped to 1: 0 means "not known" in a descriptor). page: at least NODE_PAGE_DIGEST_BYTES
 * readable bytes.
 */
uint64_t node_page_digest(const void *page);

/* node_resv_desc_encode - the wire form into a malloc'ed *buf_out (caller frees). Returns TDM_OK,
 * TDM_ERR_INVALID_ARG or TDM_ERR_NO_MEMORY. */
tdm_status_t node_resv_desc_encode(const node_resv_desc_t *desc, uint8_t **buf_out,
                                   size_t *n_bytes_out);

/* node_resv_desc_parse - check and decode bytes from outside into *desc_out (arrays malloc'ed;
 * free with node_resv_desc_fini). Returns TDM_OK, TDM_ERR_FORMAT (truncated, bad magic, counts
 * over the limits, checksum) or TDM_ERR_NO_MEMORY; *desc_out zeroed on error. */
tdm_status_t node_resv_desc_parse(const uint8_t *bytes, size_t n_bytes, node_resv_desc_t *desc_out);

/* node_resv_desc_fini - free what parse allocated; accepts a zeroed descriptor. */
void node_resv_desc_fini(node_resv_desc_t *desc);

/*
 * node_blob_with_pages - a sequence blob with pages: `record` (an engine_seq_export RECORD blob,
 * trailer included) with its flags set to "pages follow", then for each source s < n_sources:
 * u64 n_rows[s], u32 n_pages[s], the n_pages[s] pages pages[k] (page_bytes each, in order,
 * sources concatenated), then a fresh XXH3-64 trailer. *blob_out malloc'ed (caller frees).
 * Returns TDM_OK, TDM_ERR_FORMAT (record too short, not a record, or another blob version) or
 * TDM_ERR_NO_MEMORY. The engine owns the format: this is engine_seq_blob_add_pages.
 */
tdm_status_t node_blob_with_pages(const uint8_t *record, size_t n_record, uint32_t n_sources,
                                  const int64_t *n_rows, const uint32_t *n_pages,
                                  const void *const *pages, size_t page_bytes, uint8_t **blob_out,
                                  size_t *n_blob_out);

#endif
