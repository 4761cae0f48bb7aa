#include "transfer/desc.h"

#include "common/hash.h"
#include "transfer/wire.h"

#include <string.h>

static const uint8_t DESC_MAGIC[4] = {'T', 'D', 'X', 'D'};

size_t xfer_desc_encoded_bytes(const xfer_desc_t *desc)
{
    return XFER_DESC_HEADER_BYTES + desc->worker_address_bytes + desc->rkey_bytes +
           XFER_DESC_CHECKSUM_BYTES;
}

/* The checks both directions share: 0 when the decoded fields are self-consistent. */
static int fields_valid(const xfer_desc_t *desc)
{
    size_t name_len = strnlen(desc->name, XFER_NAME_MAX_BYTES);

    return name_len > 0 && name_len < XFER_NAME_MAX_BYTES && desc->incarnation_id != 0 &&
           desc->page_size_bytes != 0 && desc->n_pages != 0 &&
           desc->pool_bytes == (uint64_t)desc->page_size_bytes * desc->n_pages &&
           desc->worker_address_bytes > 0 && desc->rkey_bytes > 0;
}

tdm_status_t xfer_desc_encode(const xfer_desc_t *desc, uint8_t *buf, size_t n_buf_bytes,
                              size_t *n_bytes_out)
{
    size_t n_bytes;
    size_t off;

    if (!fields_valid(desc) || desc->worker_address_bytes > XFER_DESC_MAX_BLOB_BYTES ||
        desc->rkey_bytes > XFER_DESC_MAX_BLOB_BYTES ||
        (desc->mem_type != XFER_MEM_HOST && desc->mem_type != XFER_MEM_CUDA) ||
        desc->worker_address == NULL || desc->rkey == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    n_bytes = xfer_desc_encoded_bytes(desc);
    if (n_buf_bytes < n_bytes) {
        return TDM_ERR_INVALID_ARG;
    }

    memset(buf, 0, XFER_DESC_HEADER_BYTES);
    memcpy(buf, DESC_MAGIC, sizeof(DESC_MAGIC));
    wire_put_u16(buf + 4, XFER_DESC_VERSION);
    wire_put_u16(buf + 6, (uint16_t)desc->mem_type);
    wire_put_u64(buf + 8, desc->incarnation_id);
    wire_put_u64(buf + 16, desc->base_addr);
    wire_put_u64(buf + 24, desc->pool_bytes);
    wire_put_u32(buf + 32, desc->page_size_bytes);
    wire_put_u32(buf + 36, desc->n_pages);
    wire_put_u32(buf + 40, desc->pool_id);
    wire_put_u16(buf + 44, (uint16_t)desc->worker_address_bytes);
    wire_put_u16(buf + 46, (uint16_t)desc->rkey_bytes);
    memcpy(buf + 48, desc->name, strlen(desc->name));
    wire_put_u64(buf + 112, desc->owner.host_id);
    wire_put_u64(buf + 120, desc->owner.pid_ns);
    wire_put_u64(buf + 128, desc->owner.start_ticks);
    wire_put_u32(buf + 136, desc->owner.pid);
    off = XFER_DESC_HEADER_BYTES;
    memcpy(buf + off, desc->worker_address, desc->worker_address_bytes);
    off += desc->worker_address_bytes;
    memcpy(buf + off, desc->rkey, desc->rkey_bytes);
    off += desc->rkey_bytes;
    wire_put_u64(buf + off, tdm_hash_xxh3_64(buf, off));
    *n_bytes_out = n_bytes;
    return TDM_OK;
}

tdm_status_t xfer_desc_parse(const uint8_t *bytes, size_t n_bytes, xfer_desc_t *desc_out)
{
    xfer_desc_t desc;
    uint16_t version;
    uint16_t mem_type;
    size_t body_bytes;

    if (bytes == NULL || n_bytes < XFER_DESC_HEADER_BYTES + XFER_DESC_CHECKSUM_BYTES ||
        memcmp(bytes, DESC_MAGIC, sizeof(DESC_MAGIC)) != 0) {
        return TDM_ERR_FORMAT;
    }
    version = wire_get_u16(bytes + 4);
    if (version != XFER_DESC_VERSION) {
        return TDM_ERR_UNSUPPORTED;
    }

    memset(&desc, 0, sizeof(desc));
    desc.worker_address_bytes = wire_get_u16(bytes + 44);
    desc.rkey_bytes = wire_get_u16(bytes + 46);
    body_bytes = XFER_DESC_HEADER_BYTES + desc.worker_address_bytes + desc.rkey_bytes;
    if (n_bytes != body_bytes + XFER_DESC_CHECKSUM_BYTES) {
        return TDM_ERR_FORMAT;
    }
    if (wire_get_u64(bytes + body_bytes) != tdm_hash_xxh3_64(bytes, body_bytes)) {
        return TDM_ERR_MISMATCH;
    }

    mem_type = wire_get_u16(bytes + 6);
    if (mem_type != XFER_MEM_HOST && mem_type != XFER_MEM_CUDA) {
        return TDM_ERR_UNSUPPORTED;
    }
    desc.mem_type = (xfer_mem_type_t)mem_type;
    desc.incarnation_id = wire_get_u64(bytes + 8);
    desc.base_addr = wire_get_u64(bytes + 16);
    desc.pool_bytes = wire_get_u64(bytes + 24);
    desc.page_size_bytes = wire_get_u32(bytes + 32);
    desc.n_pages = wire_get_u32(bytes + 36);
    desc.pool_id = wire_get_u32(bytes + 40);
    if (memchr(bytes + 48, '\0', XFER_NAME_MAX_BYTES) == NULL) {
        return TDM_ERR_FORMAT;
    }
    memcpy(desc.name, bytes + 48, XFER_NAME_MAX_BYTES);
    desc.owner.host_id = wire_get_u64(bytes + 112);
    desc.owner.pid_ns = wire_get_u64(bytes + 120);
    desc.owner.start_ticks = wire_get_u64(bytes + 128);
    desc.owner.pid = wire_get_u32(bytes + 136);
    desc.worker_address = bytes + XFER_DESC_HEADER_BYTES;
    desc.rkey = desc.worker_address + desc.worker_address_bytes;
    if (!fields_valid(&desc)) {
        return TDM_ERR_FORMAT;
    }
    *desc_out = desc;
    return TDM_OK;
}
