/* kv_page.h - the KV page byte format of MODEL.md section 7 [tandem].
 *
 * A page holds 64 consecutive rows of one KV source: a 64-byte little-endian header, then four
 * 16-byte-aligned regions (structure of arrays): main E2M1 codes [64, d/2], main E4M3 scales
 * [64, d/16] (Q_ckv), index E2M1 codes [64, d_I/2], index UE8M0 scales [64, d_I/32] (Q_mx4).
 * This module lays out, fills, seals (XXH3-64 checksum) and checks pages in caller-provided
 * host memory. It owns no memory and knows nothing of pools, block tables, sequences or
 * transport; a page's owner (STYLE.md 4) is whoever holds the buffer. Functions on distinct
 * pages are thread-safe; one page is not.
 */
#ifndef TANDEM_KERNELS_KV_PAGE_H
#define TANDEM_KERNELS_KV_PAGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/codec.h"

#define KERN_KV_PAGE_ROWS          64     /* rows per page (header rows_per_page) */
#define KERN_KV_PAGE_HEADER_BYTES  64     /* header size; region 0 starts here */
#define KERN_KV_PAGE_ALIGN_BYTES   16     /* every region starts at a multiple of this */
#define KERN_KV_PAGE_VERSION       1      /* header format_version */
#define KERN_KV_PAGE_MAGIC         "TDKV" /* header bytes 0..3 */
#define KERN_KV_PAGE_CHECKSUM_FROM 64     /* the checksum covers bytes [64, page end) */
#define KERN_KV_PAGE_DIM_LIMIT     65535u /* largest d and d_I (u16 header fields) */

/* Header fields a backend kernel updates in place (kern_page_mark_fn): little-endian u16
 * format_version at byte 4, u16 row_count at byte 16, the flag byte at 21. */
#define KERN_KV_PAGE_HDR_VERSION   4
#define KERN_KV_PAGE_HDR_ROW_COUNT 16
#define KERN_KV_PAGE_HDR_FLAGS     21

/* Header flag bits (byte 21). Any other bit set is a format error. */
#define KERN_KV_PAGE_FLAG_STALE 0x01u /* rows written since the last seal: checksum invalid */

/* Values of kern_kv_page_check()'s check_checksum argument. */
typedef enum {
    KERN_KV_PAGE_CHECK_HEADER = 0,   /* header and identity only */
    KERN_KV_PAGE_CHECK_CHECKSUM = 1, /* also recompute and compare the XXH3-64 checksum */
} kern_kv_page_check_t;

/*
 * kern_kv_page_layout_t - byte offsets and sizes of one page's regions for (d, d_I); computed
 * by kern_kv_page_layout(). For d = 512, d_I = 128: offsets 64 / 16448 / 18496 / 22592, page
 * 22848 bytes. Plain data.
 */
typedef struct {
    uint32_t d;                  /* main row dims (multiple of 16) */
    uint32_t d_I;                /* index key dims (multiple of 32; 0 = no index key) */
    size_t main_codes_offset;    /* [64, d/2] packed E2M1, low nibble = even dim */
    size_t main_codes_row_bytes; /* d/2 */
    size_t main_scales_offset;   /* [64, d/16] E4M3 */
    size_t main_scales_row_bytes;
    size_t index_codes_offset; /* [64, d_I/2] packed E2M1 */
    size_t index_codes_row_bytes;
    size_t index_scales_offset; /* [64, d_I/32] UE8M0 */
    size_t index_scales_row_bytes;
    size_t page_bytes; /* total, a multiple of 16 */
} kern_kv_page_layout_t;

/*
 * kern_kv_page_params_t - the identity a page is created with and checked against. Plain data.
 */
typedef struct {
    uint16_t source_layer; /* the KV source layer (MODEL.md 7) */
    uint64_t first_row;    /* source row of slot 0; a multiple of 64 (page = row / 64) */
    uint8_t ratio;         /* the source's compression ratio (1 or 2), >= 1 */
    uint16_t d;            /* main row dims, a multiple of 16, > 0 */
    uint16_t d_I;          /* index key dims, a multiple of 32 (0: the source has none) */
    uint64_t fingerprint;  /* model fingerprint; readers reject pages of another model */
} kern_kv_page_params_t;

/*
 * kern_kv_page_header_t - a parsed header (kern_kv_page_header_read). Plain data.
 */
typedef struct {
    uint16_t version;
    uint16_t source_layer;
    uint64_t first_row;
    uint16_t row_count;     /* 1 + highest slot written, <= 64 */
    uint16_t rows_per_page; /* 64 */
    uint8_t ratio;
    uint8_t flags; /* KERN_KV_PAGE_FLAG_* */
    uint16_t d;
    uint16_t d_I;
    uint64_t checksum; /* XXH3-64 of bytes [64, page end) when not stale */
    uint64_t fingerprint;
} kern_kv_page_header_t;

/* kern_kv_page_align_up - n rounded up to a multiple of KERN_KV_PAGE_ALIGN_BYTES. */
static inline size_t kern_kv_page_align_up(size_t n)
{
    return (n + KERN_KV_PAGE_ALIGN_BYTES - 1) / KERN_KV_PAGE_ALIGN_BYTES * KERN_KV_PAGE_ALIGN_BYTES;
}

/*
 * kern_kv_page_dims_valid - 1 when main dims d and index dims d_I give a page layout: d > 0, d a
 * multiple of 16 (KERN_CKV_GROUP), d_I a multiple of 32 (KERN_MX4_GROUP, 0 allowed), both at most
 * KERN_KV_PAGE_DIM_LIMIT; else 0. Header-only, like kern_kv_page_layout_of.
 */
static inline int kern_kv_page_dims_valid(uint32_t d, uint32_t d_I)
{
    return d > 0 && d <= KERN_KV_PAGE_DIM_LIMIT && d % KERN_CKV_GROUP == 0 &&
           d_I <= KERN_KV_PAGE_DIM_LIMIT && d_I % KERN_MX4_GROUP == 0;
}

/*
 * kern_kv_page_layout_of - the layout (region offsets, page size) for main dims d and index dims
 * d_I that kern_kv_page_dims_valid accepts; other dims give meaningless sizes. Pure arithmetic,
 * defined in this header (the one definition, kern_kv_page_layout uses it) so that a part that
 * only sizes pages, the router, need not link the kernels library.
 */
static inline kern_kv_page_layout_t kern_kv_page_layout_of(uint32_t d, uint32_t d_I)
{
    kern_kv_page_layout_t layout;

    layout.d = d;
    layout.d_I = d_I;
    layout.main_codes_row_bytes = d / 2;
    layout.main_scales_row_bytes = d / KERN_CKV_GROUP;
    layout.index_codes_row_bytes = d_I / 2;
    layout.index_scales_row_bytes = d_I / KERN_MX4_GROUP;
    layout.main_codes_offset = KERN_KV_PAGE_HEADER_BYTES;
    layout.main_scales_offset = kern_kv_page_align_up(
        layout.main_codes_offset + KERN_KV_PAGE_ROWS * layout.main_codes_row_bytes);
    layout.index_codes_offset = kern_kv_page_align_up(
        layout.main_scales_offset + KERN_KV_PAGE_ROWS * layout.main_scales_row_bytes);
    layout.index_scales_offset = kern_kv_page_align_up(
        layout.index_codes_offset + KERN_KV_PAGE_ROWS * layout.index_codes_row_bytes);
    layout.page_bytes = kern_kv_page_align_up(layout.index_scales_offset +
                                              KERN_KV_PAGE_ROWS * layout.index_scales_row_bytes);
    return layout;
}

/*
 * kern_kv_geometry_t - what a worker registers and the router checks about pages
 * (Register.page_format, docs/PROTOCOL.md), from kern_kv_geometry(). Plain data.
 */
typedef struct {
    uint32_t rows_per_page;    /* KERN_KV_PAGE_ROWS */
    uint32_t page_bytes;       /* kern_kv_page_layout_of(d, d_I).page_bytes */
    uint32_t tokens_per_block; /* prefix-cache block: KERN_KV_PAGE_ROWS x the largest ratio, so
                                * that one block fills exactly one page of every KV source */
} kern_kv_geometry_t;

/*
 * kern_kv_geometry - the page geometry of main dims d, index dims d_I and `max_ratio`, the
 * largest compression ratio among the KV sources (engine_config_max_kv_ratio: >= 1). The one
 * derivation of page_bytes and tokens_per_block for the workers, the router and the planners.
 * Header-only, like kern_kv_page_layout_of.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (geometry_out untouched, nothing logged) if
 * geometry_out is NULL, kern_kv_page_dims_valid(d, d_I) is 0, or max_ratio is 0 or so large
 * that tokens_per_block overflows.
 */
static inline tdm_status_t kern_kv_geometry(uint32_t d, uint32_t d_I, uint32_t max_ratio,
                                            kern_kv_geometry_t *geometry_out)
{
    if (geometry_out == NULL || max_ratio == 0 || max_ratio > UINT32_MAX / KERN_KV_PAGE_ROWS ||
        !kern_kv_page_dims_valid(d, d_I)) {
        return TDM_ERR_INVALID_ARG;
    }
    geometry_out->rows_per_page = KERN_KV_PAGE_ROWS;
    geometry_out->page_bytes = (uint32_t)kern_kv_page_layout_of(d, d_I).page_bytes;
    geometry_out->tokens_per_block = KERN_KV_PAGE_ROWS * max_ratio;
    return TDM_OK;
}

/* kern_kv_page_count - the pages that hold n_rows rows of one source: ceil(n_rows / 64); 0 for
 * n_rows <= 0. Header-only. */
static inline int64_t kern_kv_page_count(int64_t n_rows)
{
    return n_rows <= 0 ? 0 : (n_rows + KERN_KV_PAGE_ROWS - 1) / KERN_KV_PAGE_ROWS;
}

/*
 * kern_kv_page_layout - the checked form of kern_kv_page_layout_of.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (layout_out untouched, a warning logged) if layout_out
 * is NULL, d is 0, not a multiple of 16 or above 65535, or d_I is not a multiple of 32 or above
 * 65535.
 */
tdm_status_t kern_kv_page_layout(uint32_t d, uint32_t d_I, kern_kv_page_layout_t *layout_out);

/*
 * kern_kv_page_init - make `page` an empty page for `params`: zero all page_bytes bytes, write
 * the header (row_count 0) and seal it (checksum of the all-zero body), so that an empty page
 * passes kern_kv_page_check.
 *
 * page:       host memory, page_bytes bytes, written; borrowed, no alignment needed.
 * page_bytes: at least the layout's page_bytes (extra bytes are zeroed and not part of the
 *             page).
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (page untouched) for NULL pointers, invalid dims,
 * ratio 0, first_row not a multiple of 64, or page_bytes too small.
 */
tdm_status_t kern_kv_page_init(void *page, size_t page_bytes, const kern_kv_page_params_t *params);

/*
 * kern_kv_page_write_row - store one already-quantized row in `slot`: main codes [d/2] and
 * scales [d/16] (Q_ckv), index codes [d_I/2] and scales [d_I/32] (Q_mx4). Sets
 * row_count = max(row_count, slot + 1) and marks the checksum stale (KERN_KV_PAGE_FLAG_STALE)
 * until kern_kv_page_seal.
 *
 * page: a page made by kern_kv_page_init (or one that passed kern_kv_page_check); its header
 * gives d and d_I and is trusted for the region bounds. Index pointers may be NULL when d_I is
 * 0.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (page untouched) for a NULL pointer, slot >= 64, or a
 * header without the magic/version.
 */
tdm_status_t kern_kv_page_write_row(void *page, uint32_t slot, const uint8_t *main_codes,
                                    const uint8_t *main_scales, const uint8_t *index_codes,
                                    const uint8_t *index_scales);

/*
 * kern_kv_page_mark_rows - the header change of writing slots below slot_end, as
 * kern_kv_page_write_row makes it: row_count = max(row_count, slot_end) and
 * KERN_KV_PAGE_FLAG_STALE set; nothing else changes. For a writer that copies a run of rows into
 * a page it cannot touch with host code (device memory, issue 14): it copies the page's first
 * KERN_KV_PAGE_HEADER_BYTES bytes to the host, calls this on the copy and copies them back, so
 * the page's bytes equal those of kern_kv_page_write_row on each slot.
 *
 * header: the KERN_KV_PAGE_HEADER_BYTES header bytes of a page made by kern_kv_page_init (host
 *         memory, read and written; the rest of the page is not needed).
 * slot_end: 1 .. KERN_KV_PAGE_ROWS.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (header untouched, a warning logged) for NULL, slot_end
 * 0 or above 64, or a header without the magic/version or with invalid dims.
 */
tdm_status_t kern_kv_page_mark_rows(void *header, uint32_t slot_end);

/*
 * kern_kv_page_read_row - copy slot's four records out (shapes as kern_kv_page_write_row).
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (outputs untouched) for a NULL pointer (index outputs
 * may be NULL when d_I is 0), a header without the magic/version, or slot >= row_count.
 */
tdm_status_t kern_kv_page_read_row(const void *page, uint32_t slot, uint8_t *main_codes_out,
                                   uint8_t *main_scales_out, uint8_t *index_codes_out,
                                   uint8_t *index_scales_out);

/*
 * kern_kv_page_encode_row - quantize one FP32 row into `slot`: main_row [d] through Q_ckv,
 * index_key [d_I] through Q_mx4 (MODEL.md R6; both after RoPE, the caller's job), then as
 * kern_kv_page_write_row. index_key may be NULL when d_I is 0.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (page untouched) as kern_kv_page_write_row.
 */
tdm_status_t kern_kv_page_encode_row(void *page, uint32_t slot, const float *main_row,
                                     const float *index_key);

/*
 * kern_kv_page_decode_row - dequantize slot into main_out [d] and index_out [d_I] f32 (the QDQ
 * values later math uses). index_out may be NULL when d_I is 0.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (outputs untouched) as kern_kv_page_read_row.
 */
tdm_status_t kern_kv_page_decode_row(const void *page, uint32_t slot, float *main_out,
                                     float *index_out);

/*
 * kern_kv_page_seal - write the XXH3-64 (seed 0) of bytes [64, page end) into the header and
 * clear KERN_KV_PAGE_FLAG_STALE. Call after the last write, before the page crosses a process
 * boundary.
 *
 * Returns TDM_OK, or TDM_ERR_INVALID_ARG (page untouched) for NULL or a header without the
 * magic/version.
 */
tdm_status_t kern_kv_page_seal(void *page);

/*
 * kern_kv_page_header_read - parse and validate the header's structure (not its identity).
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG for NULL pointers, or TDM_ERR_FORMAT (header_out
 * untouched, one warn line naming the field) if page_bytes < 64, or the magic, version,
 * rows_per_page, row_count, flags, reserved bytes or dims are invalid, or page_bytes is
 * smaller than the page the dims describe ("truncated").
 */
tdm_status_t kern_kv_page_header_read(const void *page, size_t page_bytes,
                                      kern_kv_page_header_t *header_out);

/*
 * kern_kv_page_check - validate a page received from elsewhere (MODEL.md 7: magic, version,
 * layer, ratio, dims, fingerprint, and the checksum whenever a page crosses a process
 * boundary).
 *
 * expected:       identity to compare with (source_layer, first_row, ratio, d, d_I,
 *                 fingerprint); NULL checks structure (and checksum) only.
 * check_checksum: KERN_KV_PAGE_CHECK_CHECKSUM (nonzero) also recomputes the checksum; a page
 *                 whose checksum is stale fails it.
 *
 * Returns TDM_OK; TDM_ERR_INVALID_ARG for a NULL page or invalid expected dims;
 * TDM_ERR_FORMAT for a malformed header (as kern_kv_page_header_read); TDM_ERR_MISMATCH if
 * source_layer, first_row, ratio, d, d_I, fingerprint or the checksum differ. Each failure logs
 * one warn line with `field=<name>` and both values. Reads only.
 */
tdm_status_t kern_kv_page_check(const void *page, size_t page_bytes,
                                const kern_kv_page_params_t *expected, int check_checksum);

#ifdef __cplusplus
}
#endif

#endif
