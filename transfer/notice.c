#include "transfer/notice.h"

#include "common/hash.h"
#include "transfer/wire.h"

#include <string.h>

static const uint8_t NOTICE_MAGIC[4] = {'T', 'D', 'X', 'N'};

size_t xfer_notice_encoded_bytes(uint32_t n_pages, size_t payload_bytes)
{
    return XFER_NOTICE_HEADER_BYTES + (size_t)n_pages * 12u + payload_bytes + 8u;
}

tdm_status_t xfer_notice_encode(const xfer_notice_frame_t *frame, uint8_t *buf, size_t n_buf_bytes,
                                size_t *n_bytes_out)
{
    size_t name_len;
    size_t n_bytes;
    uint8_t *p;

    if (frame->sender_name == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    name_len = strnlen(frame->sender_name, XFER_NAME_MAX_BYTES);
    if (name_len == 0 || name_len >= XFER_NAME_MAX_BYTES ||
        frame->n_pages > XFER_NOTICE_MAX_PAGES ||
        frame->payload_bytes > XFER_NOTICE_MAX_PAYLOAD_BYTES ||
        (frame->n_pages > 0 && (frame->pages == NULL || frame->checksums == NULL)) ||
        (frame->payload_bytes > 0 && frame->payload == NULL)) {
        return TDM_ERR_INVALID_ARG;
    }
    n_bytes = xfer_notice_encoded_bytes(frame->n_pages, frame->payload_bytes);
    if (n_buf_bytes < n_bytes) {
        return TDM_ERR_INVALID_ARG;
    }

    memset(buf, 0, XFER_NOTICE_HEADER_BYTES);
    memcpy(buf, NOTICE_MAGIC, sizeof(NOTICE_MAGIC));
    wire_put_u16(buf + 4, XFER_NOTICE_VERSION);
    wire_put_u64(buf + 8, frame->job_id);
    wire_put_u64(buf + 16, frame->sender_incarnation_id);
    wire_put_u64(buf + 24, frame->receiver_incarnation_id);
    wire_put_u32(buf + 32, frame->receiver_pool_id);
    wire_put_u32(buf + 36, frame->n_pages);
    wire_put_u32(buf + 40, (uint32_t)frame->payload_bytes);
    memcpy(buf + 48, frame->sender_name, name_len);
    p = buf + XFER_NOTICE_HEADER_BYTES;
    for (uint32_t i = 0; i < frame->n_pages; i++, p += 4) {
        wire_put_u32(p, frame->pages[i]);
    }
    for (uint32_t i = 0; i < frame->n_pages; i++, p += 8) {
        wire_put_u64(p, frame->checksums[i]);
    }
    if (frame->payload_bytes > 0) {
        memcpy(p, frame->payload, frame->payload_bytes);
        p += frame->payload_bytes;
    }
    wire_put_u64(p, tdm_hash_xxh3_64(buf, (size_t)(p - buf)));
    *n_bytes_out = n_bytes;
    return TDM_OK;
}

tdm_status_t xfer_notice_decode(const uint8_t *bytes, size_t n_bytes, xfer_notice_view_t *view_out)
{
    xfer_notice_view_t view;
    size_t body_bytes;

    if (bytes == NULL || n_bytes < XFER_NOTICE_HEADER_BYTES + 8u ||
        memcmp(bytes, NOTICE_MAGIC, sizeof(NOTICE_MAGIC)) != 0) {
        return TDM_ERR_FORMAT;
    }
    if (wire_get_u16(bytes + 4) != XFER_NOTICE_VERSION) {
        return TDM_ERR_UNSUPPORTED;
    }
    memset(&view, 0, sizeof(view));
    view.n_pages = wire_get_u32(bytes + 36);
    view.payload_bytes = wire_get_u32(bytes + 40);
    if (view.n_pages > XFER_NOTICE_MAX_PAGES ||
        view.payload_bytes > XFER_NOTICE_MAX_PAYLOAD_BYTES ||
        n_bytes != xfer_notice_encoded_bytes(view.n_pages, view.payload_bytes)) {
        return TDM_ERR_FORMAT;
    }
    body_bytes = n_bytes - 8u;
    if (wire_get_u64(bytes + body_bytes) != tdm_hash_xxh3_64(bytes, body_bytes)) {
        return TDM_ERR_MISMATCH;
    }
    if (memchr(bytes + 48, '\0', XFER_NAME_MAX_BYTES) == NULL || bytes[48] == '\0') {
        return TDM_ERR_FORMAT;
    }
    view.job_id = wire_get_u64(bytes + 8);
    view.sender_incarnation_id = wire_get_u64(bytes + 16);
    view.receiver_incarnation_id = wire_get_u64(bytes + 24);
    view.receiver_pool_id = wire_get_u32(bytes + 32);
    memcpy(view.sender_name, bytes + 48, XFER_NAME_MAX_BYTES);
    view.pages_le = bytes + XFER_NOTICE_HEADER_BYTES;
    view.checksums_le = view.pages_le + (size_t)view.n_pages * 4u;
    view.payload = view.payload_bytes > 0 ? view.checksums_le + (size_t)view.n_pages * 8u : NULL;
    *view_out = view;
    return TDM_OK;
}

uint32_t xfer_notice_frame_page(const xfer_notice_view_t *view, uint32_t i)
{
    return wire_get_u32(view->pages_le + (size_t)i * 4u);
}

uint64_t xfer_notice_frame_checksum(const xfer_notice_view_t *view, uint32_t i)
{
    return wire_get_u64(view->checksums_le + (size_t)i * 8u);
}

tdm_status_t xfer_notice_check_pages(const uint8_t *pool_host, uint32_t page_size_bytes,
                                     uint32_t n_pool_pages, const uint32_t *pages,
                                     const uint64_t *checksums, uint32_t n_pages,
                                     uint32_t *n_bad_out, uint32_t *first_bad_out)
{
    uint32_t n_bad = 0;
    uint32_t first_bad = XFER_NOTICE_NO_BAD_PAGE;

    *n_bad_out = 0;
    *first_bad_out = XFER_NOTICE_NO_BAD_PAGE;
    for (uint32_t i = 0; i < n_pages; i++) {
        if (pages[i] >= n_pool_pages) {
            return TDM_ERR_INVALID_ARG;
        }
    }
    for (uint32_t i = 0; i < n_pages; i++) {
        const uint8_t *page = pool_host + (size_t)pages[i] * page_size_bytes;

        if (tdm_hash_xxh3_64(page, page_size_bytes) != checksums[i]) {
            if (n_bad == 0) {
                first_bad = i;
            }
            n_bad++;
        }
    }
    *n_bad_out = n_bad;
    *first_bad_out = first_bad;
    return n_bad == 0 ? TDM_OK : TDM_ERR_MISMATCH;
}
