/* kv_page.c - KV page layout, fill, seal and check (kernels/kv_page.h, MODEL.md section 7). */
#include "kernels/kv_page.h"

#include "common/hash.h"
#include "common/log.h"
#include "kernels/codec.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KV_LOG "kv_page"

/* Header byte offsets (MODEL.md 7; little-endian). */
#define HDR_MAGIC         0
#define HDR_VERSION       4
#define HDR_SOURCE_LAYER  6
#define HDR_FIRST_ROW     8
#define HDR_ROW_COUNT     16
#define HDR_ROWS_PER_PAGE 18
#define HDR_RATIO         20
#define HDR_FLAGS         21
#define HDR_D             22
#define HDR_D_I           24
_Static_assert(HDR_VERSION == KERN_KV_PAGE_HDR_VERSION &&
                   HDR_ROW_COUNT == KERN_KV_PAGE_HDR_ROW_COUNT &&
                   HDR_FLAGS == KERN_KV_PAGE_HDR_FLAGS,
               "kernels/kv_page.h header offsets");
#define HDR_RESERVED_A    26 /* 6 bytes zero */
#define HDR_RESERVED_A_N  6
#define HDR_CHECKSUM      32
#define HDR_FINGERPRINT   40
#define HDR_RESERVED_B    48 /* 16 bytes zero */
#define HDR_RESERVED_B_N  16
#define MAGIC_BYTES       4

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

tdm_status_t kern_kv_page_layout(uint32_t d, uint32_t d_I, kern_kv_page_layout_t *layout_out)
{
    if (layout_out == NULL) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "layout rejected: NULL layout_out");
        return TDM_ERR_INVALID_ARG;
    }
    if (!kern_kv_page_dims_valid(d, d_I)) {
        tdm_log(TDM_LOG_WARN, KV_LOG,
                "layout rejected: d=%u d_I=%u (need d>0, d%%16==0, d_I%%32==0, both<=65535)", d,
                d_I);
        return TDM_ERR_INVALID_ARG;
    }
    *layout_out = kern_kv_page_layout_of(d, d_I);
    return TDM_OK;
}

/* The layout of a page we wrote: magic and version present, dims valid. Logs nothing. */
static int trusted_layout(const uint8_t *page, kern_kv_page_layout_t *layout_out)
{
    uint16_t d;
    uint16_t d_I;

    if (memcmp(page + HDR_MAGIC, KERN_KV_PAGE_MAGIC, MAGIC_BYTES) != 0 ||
        get_u16(page + HDR_VERSION) != KERN_KV_PAGE_VERSION) {
        return 0;
    }
    d = get_u16(page + HDR_D);
    d_I = get_u16(page + HDR_D_I);
    if (!kern_kv_page_dims_valid(d, d_I)) {
        return 0;
    }
    return kern_kv_page_layout(d, d_I, layout_out) == TDM_OK;
}

static uint64_t body_checksum(const uint8_t *page, const kern_kv_page_layout_t *layout)
{
    return tdm_hash_xxh3_64(page + KERN_KV_PAGE_CHECKSUM_FROM,
                            layout->page_bytes - KERN_KV_PAGE_CHECKSUM_FROM);
}

tdm_status_t kern_kv_page_init(void *page, size_t page_bytes, const kern_kv_page_params_t *params)
{
    kern_kv_page_layout_t layout;
    uint8_t *bytes = page;

    if (page == NULL || params == NULL) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "init rejected: NULL pointer");
        return TDM_ERR_INVALID_ARG;
    }
    if (kern_kv_page_layout(params->d, params->d_I, &layout) != TDM_OK) {
        return TDM_ERR_INVALID_ARG;
    }
    if (params->ratio == 0 || params->first_row % KERN_KV_PAGE_ROWS != 0 ||
        page_bytes < layout.page_bytes) {
        tdm_log(TDM_LOG_WARN, KV_LOG,
                "init rejected: ratio=%u first_row=%" PRIu64 " page_bytes=%zu "
                "(need ratio>=1, first_row%%64==0, page_bytes>=%zu)",
                params->ratio, params->first_row, page_bytes, layout.page_bytes);
        return TDM_ERR_INVALID_ARG;
    }
    memset(bytes, 0, page_bytes);
    memcpy(bytes + HDR_MAGIC, KERN_KV_PAGE_MAGIC, MAGIC_BYTES);
    put_u16(bytes + HDR_VERSION, KERN_KV_PAGE_VERSION);
    put_u16(bytes + HDR_SOURCE_LAYER, params->source_layer);
    put_u64(bytes + HDR_FIRST_ROW, params->first_row);
    put_u16(bytes + HDR_ROW_COUNT, 0);
    put_u16(bytes + HDR_ROWS_PER_PAGE, KERN_KV_PAGE_ROWS);
    bytes[HDR_RATIO] = params->ratio;
    bytes[HDR_FLAGS] = 0;
    put_u16(bytes + HDR_D, params->d);
    put_u16(bytes + HDR_D_I, params->d_I);
    put_u64(bytes + HDR_FINGERPRINT, params->fingerprint);
    put_u64(bytes + HDR_CHECKSUM, body_checksum(bytes, &layout));
    return TDM_OK;
}

/* Records written: row_count grows to cover slot; the checksum no longer matches. */
static void mark_written(uint8_t *page, uint32_t slot)
{
    if (get_u16(page + HDR_ROW_COUNT) < slot + 1) {
        put_u16(page + HDR_ROW_COUNT, (uint16_t)(slot + 1));
    }
    page[HDR_FLAGS] |= KERN_KV_PAGE_FLAG_STALE;
}

tdm_status_t kern_kv_page_mark_rows(void *header, uint32_t slot_end)
{
    kern_kv_page_layout_t layout;

    if (header == NULL || slot_end == 0 || slot_end > KERN_KV_PAGE_ROWS) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "mark_rows rejected: header=%p slot_end=%u (need 1..%d)",
                header, slot_end, KERN_KV_PAGE_ROWS);
        return TDM_ERR_INVALID_ARG;
    }
    if (!trusted_layout(header, &layout)) {
        tdm_log(TDM_LOG_WARN, KV_LOG,
                "mark_rows rejected: not an initialised page (magic, version or dims)");
        return TDM_ERR_INVALID_ARG;
    }
    mark_written(header, slot_end - 1);
    return TDM_OK;
}

static tdm_status_t check_slot_args(const char *op, const uint8_t *page, uint32_t slot,
                                    uint32_t slot_limit, const void *main_a, const void *main_b,
                                    const void *index_a, const void *index_b,
                                    kern_kv_page_layout_t *layout_out)
{
    if (page == NULL || main_a == NULL || main_b == NULL) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "%s rejected: NULL pointer", op);
        return TDM_ERR_INVALID_ARG;
    }
    if (!trusted_layout(page, layout_out)) {
        tdm_log(TDM_LOG_WARN, KV_LOG,
                "%s rejected: not an initialised page (magic, version or "
                "dims)",
                op);
        return TDM_ERR_INVALID_ARG;
    }
    if (layout_out->d_I > 0 && (index_a == NULL || index_b == NULL)) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "%s rejected: NULL index pointer with d_I=%u", op,
                layout_out->d_I);
        return TDM_ERR_INVALID_ARG;
    }
    if (slot >= slot_limit) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "%s rejected: slot=%u limit=%u (slots must be below it)", op,
                slot, slot_limit);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

/* A row's records in their page order: main codes, main scales, index codes, index scales. */
#define KV_ROW_RECORDS 4

/* Which slots an operation may touch: any of the page's, or only those below its row count. */
typedef enum { SLOTS_ANY, SLOTS_WRITTEN } slot_range_t;

/* Where one slot's records lie in a page. */
typedef struct {
    kern_kv_page_layout_t layout;
    size_t offset[KV_ROW_RECORDS];  /* byte offset of each record in the page */
    size_t n_bytes[KV_ROW_RECORDS]; /* its size */
    int n_records;                  /* 2 without an indexer (d_I 0), else KV_ROW_RECORDS */
} slot_row_t;

/* check_slot_args for op on slot (in `range`), then where its records lie. */
static tdm_status_t slot_row(const char *op, const uint8_t *page, uint32_t slot, slot_range_t range,
                             const void *main_a, const void *main_b, const void *index_a,
                             const void *index_b, slot_row_t *row_out)
{
    uint32_t limit = KERN_KV_PAGE_ROWS;
    const kern_kv_page_layout_t *l = &row_out->layout;
    tdm_status_t status;

    if (range == SLOTS_WRITTEN) {
        limit = page != NULL ? get_u16(page + HDR_ROW_COUNT) : 0;
    }
    status =
        check_slot_args(op, page, slot, limit, main_a, main_b, index_a, index_b, &row_out->layout);
    if (status != TDM_OK) {
        return status;
    }
    {
        const size_t offsets[KV_ROW_RECORDS] = {l->main_codes_offset, l->main_scales_offset,
                                                l->index_codes_offset, l->index_scales_offset};
        const size_t row_bytes[KV_ROW_RECORDS] = {l->main_codes_row_bytes, l->main_scales_row_bytes,
                                                  l->index_codes_row_bytes,
                                                  l->index_scales_row_bytes};

        for (int r = 0; r < KV_ROW_RECORDS; r++) {
            row_out->offset[r] = offsets[r] + slot * row_bytes[r];
            row_out->n_bytes[r] = row_bytes[r];
        }
    }
    row_out->n_records = l->d_I > 0 ? KV_ROW_RECORDS : 2;
    return TDM_OK;
}

tdm_status_t kern_kv_page_write_row(void *page, uint32_t slot, const uint8_t *main_codes,
                                    const uint8_t *main_scales, const uint8_t *index_codes,
                                    const uint8_t *index_scales)
{
    const uint8_t *records[KV_ROW_RECORDS] = {main_codes, main_scales, index_codes, index_scales};
    uint8_t *bytes = page;
    slot_row_t row;
    tdm_status_t status = slot_row("write_row", bytes, slot, SLOTS_ANY, main_codes, main_scales,
                                   index_codes, index_scales, &row);

    if (status != TDM_OK) {
        return status;
    }
    for (int r = 0; r < row.n_records; r++) {
        memcpy(bytes + row.offset[r], records[r], row.n_bytes[r]);
    }
    mark_written(bytes, slot);
    return TDM_OK;
}

tdm_status_t kern_kv_page_read_row(const void *page, uint32_t slot, uint8_t *main_codes_out,
                                   uint8_t *main_scales_out, uint8_t *index_codes_out,
                                   uint8_t *index_scales_out)
{
    uint8_t *records[KV_ROW_RECORDS] = {main_codes_out, main_scales_out, index_codes_out,
                                        index_scales_out};
    const uint8_t *bytes = page;
    slot_row_t row;
    tdm_status_t status = slot_row("read_row", bytes, slot, SLOTS_WRITTEN, main_codes_out,
                                   main_scales_out, index_codes_out, index_scales_out, &row);

    if (status != TDM_OK) {
        return status;
    }
    for (int r = 0; r < row.n_records; r++) {
        memcpy(records[r], bytes + row.offset[r], row.n_bytes[r]);
    }
    return TDM_OK;
}

tdm_status_t kern_kv_page_encode_row(void *page, uint32_t slot, const float *main_row,
                                     const float *index_key)
{
    uint8_t *bytes = page;
    slot_row_t row;
    tdm_status_t status = slot_row("encode_row", bytes, slot, SLOTS_ANY, main_row, main_row,
                                   index_key, index_key, &row);

    if (status != TDM_OK) {
        return status;
    }
    /* Arguments are valid, so neither quantizer can fail part-way. */
    status = kern_quant_ckv_cpu(NULL, main_row, 1, row.layout.d, bytes + row.offset[0],
                                bytes + row.offset[1]);
    if (status == TDM_OK && row.n_records == KV_ROW_RECORDS) {
        status = kern_quant_mx4_cpu(NULL, index_key, 1, row.layout.d_I, bytes + row.offset[2],
                                    bytes + row.offset[3]);
    }
    if (status != TDM_OK) {
        return status;
    }
    mark_written(bytes, slot);
    return TDM_OK;
}

tdm_status_t kern_kv_page_decode_row(const void *page, uint32_t slot, float *main_out,
                                     float *index_out)
{
    const uint8_t *bytes = page;
    slot_row_t row;
    tdm_status_t status = slot_row("decode_row", bytes, slot, SLOTS_WRITTEN, main_out, main_out,
                                   index_out, index_out, &row);

    if (status != TDM_OK) {
        return status;
    }
    status = kern_dequant_ckv_cpu(NULL, bytes + row.offset[0], bytes + row.offset[1], 1,
                                  row.layout.d, main_out);
    if (status == TDM_OK && row.n_records == KV_ROW_RECORDS) {
        status = kern_dequant_mx4_cpu(NULL, bytes + row.offset[2], bytes + row.offset[3], 1,
                                      row.layout.d_I, index_out);
    }
    return status;
}

tdm_status_t kern_kv_page_seal(void *page)
{
    kern_kv_page_layout_t layout;
    uint8_t *bytes = page;

    if (bytes == NULL || !trusted_layout(bytes, &layout)) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "seal rejected: %s",
                bytes == NULL ? "NULL page" : "not an initialised page (magic, version or dims)");
        return TDM_ERR_INVALID_ARG;
    }
    put_u64(bytes + HDR_CHECKSUM, body_checksum(bytes, &layout));
    bytes[HDR_FLAGS] &= (uint8_t)~KERN_KV_PAGE_FLAG_STALE;
    return TDM_OK;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

static tdm_status_t format_error(const char *field, const char *detail)
{
    tdm_log(TDM_LOG_WARN, KV_LOG, "page rejected: field=%s %s", field, detail);
    return TDM_ERR_FORMAT;
}

tdm_status_t kern_kv_page_header_read(const void *page, size_t page_bytes,
                                      kern_kv_page_header_t *header_out)
{
    const uint8_t *bytes = page;
    kern_kv_page_header_t header;
    kern_kv_page_layout_t layout;
    char detail[128];

    if (page == NULL || header_out == NULL) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "header read rejected: NULL pointer");
        return TDM_ERR_INVALID_ARG;
    }
    if (page_bytes < KERN_KV_PAGE_HEADER_BYTES) {
        snprintf(detail, sizeof(detail), "truncated: page_bytes=%zu header_bytes=%d", page_bytes,
                 KERN_KV_PAGE_HEADER_BYTES);
        return format_error("page_bytes", detail);
    }
    if (memcmp(bytes + HDR_MAGIC, KERN_KV_PAGE_MAGIC, MAGIC_BYTES) != 0) {
        snprintf(detail, sizeof(detail), "got=%02x%02x%02x%02x want=\"%s\"", bytes[0], bytes[1],
                 bytes[2], bytes[3], KERN_KV_PAGE_MAGIC);
        return format_error("magic", detail);
    }
    header.version = get_u16(bytes + HDR_VERSION);
    header.source_layer = get_u16(bytes + HDR_SOURCE_LAYER);
    header.first_row = get_u64(bytes + HDR_FIRST_ROW);
    header.row_count = get_u16(bytes + HDR_ROW_COUNT);
    header.rows_per_page = get_u16(bytes + HDR_ROWS_PER_PAGE);
    header.ratio = bytes[HDR_RATIO];
    header.flags = bytes[HDR_FLAGS];
    header.d = get_u16(bytes + HDR_D);
    header.d_I = get_u16(bytes + HDR_D_I);
    header.checksum = get_u64(bytes + HDR_CHECKSUM);
    header.fingerprint = get_u64(bytes + HDR_FINGERPRINT);
    if (header.version != KERN_KV_PAGE_VERSION) {
        snprintf(detail, sizeof(detail), "got=%u want=%d", header.version, KERN_KV_PAGE_VERSION);
        return format_error("version", detail);
    }
    if (header.rows_per_page != KERN_KV_PAGE_ROWS) {
        snprintf(detail, sizeof(detail), "got=%u want=%d", header.rows_per_page, KERN_KV_PAGE_ROWS);
        return format_error("rows_per_page", detail);
    }
    if (header.row_count > KERN_KV_PAGE_ROWS) {
        snprintf(detail, sizeof(detail), "got=%u max=%d", header.row_count, KERN_KV_PAGE_ROWS);
        return format_error("row_count", detail);
    }
    if ((header.flags & (uint8_t)~KERN_KV_PAGE_FLAG_STALE) != 0) {
        snprintf(detail, sizeof(detail), "got=0x%02x known=0x%02x", header.flags,
                 KERN_KV_PAGE_FLAG_STALE);
        return format_error("flags", detail);
    }
    if (!all_zero(bytes + HDR_RESERVED_A, HDR_RESERVED_A_N) ||
        !all_zero(bytes + HDR_RESERVED_B, HDR_RESERVED_B_N)) {
        return format_error("reserved", "reserved header bytes 26..31 and 48..63 must be zero");
    }
    if (!kern_kv_page_dims_valid(header.d, header.d_I)) {
        snprintf(detail, sizeof(detail), "d=%u d_I=%u (need d>0, d%%16==0, d_I%%32==0)", header.d,
                 header.d_I);
        return format_error(header.d == 0 || header.d % KERN_CKV_GROUP != 0 ? "d" : "d_I", detail);
    }
    kern_kv_page_layout(header.d, header.d_I, &layout);
    if (page_bytes < layout.page_bytes) {
        snprintf(detail, sizeof(detail), "truncated: page_bytes=%zu need=%zu", page_bytes,
                 layout.page_bytes);
        return format_error("page_bytes", detail);
    }
    *header_out = header;
    return TDM_OK;
}

static tdm_status_t mismatch(const char *field, uint64_t got, uint64_t want)
{
    tdm_log(TDM_LOG_WARN, KV_LOG, "page rejected: field=%s got=%" PRIu64 " want=%" PRIu64, field,
            got, want);
    return TDM_ERR_MISMATCH;
}

/* As mismatch(), for 64-bit hashes (printed in hex). */
static tdm_status_t mismatch_hash(const char *field, uint64_t got, uint64_t want)
{
    tdm_log(TDM_LOG_WARN, KV_LOG, "page rejected: field=%s got=0x%016" PRIx64 " want=0x%016" PRIx64,
            field, got, want);
    return TDM_ERR_MISMATCH;
}

tdm_status_t kern_kv_page_check(const void *page, size_t page_bytes,
                                const kern_kv_page_params_t *expected, int check_checksum)
{
    kern_kv_page_header_t header;
    kern_kv_page_layout_t layout;
    tdm_status_t status;
    uint64_t computed;

    if (page == NULL) {
        tdm_log(TDM_LOG_WARN, KV_LOG, "check rejected: NULL page");
        return TDM_ERR_INVALID_ARG;
    }
    if (expected != NULL && kern_kv_page_layout(expected->d, expected->d_I, &layout) != TDM_OK) {
        return TDM_ERR_INVALID_ARG;
    }
    status = kern_kv_page_header_read(page, page_bytes, &header);
    if (status != TDM_OK) {
        return status;
    }
    if (expected != NULL) {
        /* In the order they are checked; the first that differs is reported. */
        const struct {
            const char *name;
            uint64_t got;
            uint64_t want;
        } fields[] = {
            {"d", header.d, expected->d},
            {"d_I", header.d_I, expected->d_I},
            {"source_layer", header.source_layer, expected->source_layer},
            {"first_row", header.first_row, expected->first_row},
            {"ratio", header.ratio, expected->ratio},
        };

        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
            if (fields[i].got != fields[i].want) {
                return mismatch(fields[i].name, fields[i].got, fields[i].want);
            }
        }
        if (header.fingerprint != expected->fingerprint) {
            return mismatch_hash("fingerprint", header.fingerprint, expected->fingerprint);
        }
    }
    if (check_checksum != KERN_KV_PAGE_CHECK_HEADER) {
        if ((header.flags & KERN_KV_PAGE_FLAG_STALE) != 0) {
            tdm_log(TDM_LOG_WARN, KV_LOG,
                    "page rejected: field=checksum stale (rows written after the last seal)");
            return TDM_ERR_MISMATCH;
        }
        kern_kv_page_layout(header.d, header.d_I, &layout);
        computed = body_checksum(page, &layout);
        if (computed != header.checksum) {
            tdm_log(TDM_LOG_WARN, KV_LOG,
                    "page rejected: field=checksum stored=0x%016" PRIx64 " computed=0x%016" PRIx64,
                    header.checksum, computed);
            return TDM_ERR_MISMATCH;
        }
    }
    return TDM_OK;
}
