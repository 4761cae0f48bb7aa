/* notice.h - completion notices: "these pages of yours now hold this job's data".
 *
 * A notice is one UCX active message sent by the writer after its puts have landed (the batch
 * flushed its endpoint first). It carries the job id, the receiver's page list, the XXH3-64 of
 * every page as sent, and a small payload (the state record, first token, ...). The receiving
 * context checks the frame, then hashes its own copies of the pages, and hands the notice with
 * the verdict to the owner's callback. Owns the wire format and the page check; the sending and
 * receiving over UCX live in batch.c and context.c.
 *
 * Wire form, version 1 (offsets in bytes, integers little-endian):
 *   0   4  magic "TDXN"
 *   4   2  format version (1)
 *   6   2  flags (0)
 *   8   8  job id
 *   16  8  sender incarnation id
 *   24  8  receiver incarnation id (from the descriptor the sender used)
 *   32  4  receiver pool id
 *   36  4  number of pages N
 *   40  4  payload length P
 *   44  4  zero
 *   48  64 sender worker name, NUL-padded
 *   112 4N page indices in the receiver's pool
 *   ..  8N XXH3-64 (seed 0) of each whole page
 *   ..  P  payload
 *   ..  8  XXH3-64 (seed 0) of every byte before it
 */
#ifndef TANDEM_TRANSFER_NOTICE_H
#define TANDEM_TRANSFER_NOTICE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "transfer/desc.h"

#define XFER_NOTICE_VERSION           1
#define XFER_NOTICE_HEADER_BYTES      112
#define XFER_NOTICE_MAX_PAGES         (1u << 20)  /* 23 GB of full-size pages */
#define XFER_NOTICE_MAX_PAYLOAD_BYTES (64u << 20) /* the state record is ~2.9 MB */
#define XFER_NOTICE_NO_BAD_PAGE       UINT32_MAX

/*
 * A received notice as handed to xfer_notice_fn. Plain data; every pointer is borrowed and
 * valid only during the callback.
 */
typedef struct {
    uint64_t job_id;
    char sender_name[XFER_NAME_MAX_BYTES];
    uint64_t sender_incarnation_id;
    uint32_t pool_id; /* the receiving pool (xfer_pool_id) */
    uint32_t n_pages;
    const uint32_t *pages;     /* [n_pages] page indices in that pool */
    const uint64_t *checksums; /* [n_pages] XXH3-64 of each page as the sender saw it */
    const uint8_t *payload;    /* [payload_bytes]; NULL when 0 */
    size_t payload_bytes;
    /*
     * The check of the pages against the checksums:
     *   TDM_OK            every page matched
     *   TDM_ERR_MISMATCH  n_bad_pages pages differ (first at pages[first_bad_index]); treat
     *                     the job's data as lost
     *   TDM_ERR_NOT_FOUND the pool id names no pool of this context (pages not checked)
     *   TDM_ERR_INVALID_ARG a page index is outside the pool (pages not checked)
     */
    tdm_status_t status;
    uint32_t n_bad_pages;
    uint32_t first_bad_index; /* XFER_NOTICE_NO_BAD_PAGE when none */
} xfer_notice_t;

/*
 * Called from xfer_context_progress once per well-formed notice addressed to this incarnation,
 * with its verdict. Malformed notices are counted and logged, never delivered.
 */
typedef void xfer_notice_fn(void *arg, const xfer_notice_t *notice);

/* The fields a sender puts in a notice frame. Plain data; arrays borrowed. */
typedef struct {
    uint64_t job_id;
    const char *sender_name; /* 1..63 characters */
    uint64_t sender_incarnation_id;
    uint64_t receiver_incarnation_id;
    uint32_t receiver_pool_id;
    uint32_t n_pages;
    const uint32_t *pages;     /* [n_pages] receiver page indices */
    const uint64_t *checksums; /* [n_pages] */
    const void *payload;       /* [payload_bytes]; may be NULL when 0 */
    size_t payload_bytes;
} xfer_notice_frame_t;

/* A decoded, checked frame. Page and checksum arrays stay in wire form: read them with
 * xfer_notice_frame_page / xfer_notice_frame_checksum. Borrows the bytes it was decoded from. */
typedef struct {
    uint64_t job_id;
    char sender_name[XFER_NAME_MAX_BYTES];
    uint64_t sender_incarnation_id;
    uint64_t receiver_incarnation_id;
    uint32_t receiver_pool_id;
    uint32_t n_pages;
    const uint8_t *pages_le;     /* 4 * n_pages bytes */
    const uint8_t *checksums_le; /* 8 * n_pages bytes */
    const uint8_t *payload;
    size_t payload_bytes;
} xfer_notice_view_t;

/* xfer_notice_encoded_bytes - the wire size of a frame with n_pages pages and payload_bytes. */
size_t xfer_notice_encoded_bytes(uint32_t n_pages, size_t payload_bytes);

/*
 * xfer_notice_encode - write the frame into buf (capacity n_buf_bytes, at least
 * xfer_notice_encoded_bytes). Returns TDM_OK with *n_bytes_out, or TDM_ERR_INVALID_ARG (name
 * empty or too long, over XFER_NOTICE_MAX_PAGES or XFER_NOTICE_MAX_PAYLOAD_BYTES, NULL arrays,
 * buffer too small); buf untouched on error.
 */
tdm_status_t xfer_notice_encode(const xfer_notice_frame_t *frame, uint8_t *buf, size_t n_buf_bytes,
                                size_t *n_bytes_out);

/*
 * xfer_notice_decode - check and decode n_bytes from outside. Returns TDM_OK with *view_out
 * (borrowing bytes), TDM_ERR_FORMAT (truncated, bad magic, lengths that disagree, limits,
 * unterminated name), TDM_ERR_UNSUPPORTED (version) or TDM_ERR_MISMATCH (frame checksum).
 * *view_out untouched on error.
 */
tdm_status_t xfer_notice_decode(const uint8_t *bytes, size_t n_bytes, xfer_notice_view_t *view_out);

/* xfer_notice_frame_page / _checksum - entry i (< n_pages) of a decoded frame's arrays. */
uint32_t xfer_notice_frame_page(const xfer_notice_view_t *view, uint32_t i);
uint64_t xfer_notice_frame_checksum(const xfer_notice_view_t *view, uint32_t i);

/*
 * xfer_notice_check_pages - hash each listed page of a host-memory pool and compare:
 * page pages[i] starts at pool_host + pages[i] * page_size_bytes. Writes the number of
 * disagreeing pages and the index (into pages[]) of the first, or XFER_NOTICE_NO_BAD_PAGE.
 * Returns TDM_OK (all match), TDM_ERR_MISMATCH, or TDM_ERR_INVALID_ARG when a page index is
 * >= n_pool_pages (nothing hashed, outputs zero/none). Source: MODEL.md 7 (XXH3-64 seed 0).
 */
tdm_status_t xfer_notice_check_pages(const uint8_t *pool_host, uint32_t page_size_bytes,
                                     uint32_t n_pool_pages, const uint32_t *pages,
                                     const uint64_t *checksums, uint32_t n_pages,
                                     uint32_t *n_bad_out, uint32_t *first_bad_out);

#endif
