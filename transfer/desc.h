/* desc.h - the pool descriptor: what a peer needs to reach one registered page pool.
 *
 * A descriptor names the owning worker (name and incarnation id), its UCX worker address, the
 * pool's packed remote key, base address, size and page geometry. It travels inside control
 * messages (ZeroMQ + protobuf as opaque bytes), so its wire form is versioned, little-endian and
 * ends in an XXH3-64 checksum. Owns only the encoding; knows nothing of UCX objects (the bytes
 * are opaque here).
 *
 * Wire form, version 1 (offsets in bytes, integers little-endian):
 *   0   4  magic "TDXD"
 *   4   2  format version (1)
 *   6   2  memory type (xfer_mem_type_t)
 *   8   8  incarnation id of the owning process (nonzero)
 *   16  8  base address of the pool in the owner's address space
 *   24  8  pool size, bytes (= page_size_bytes * n_pages)
 *   32  4  page size, bytes
 *   36  4  number of pages
 *   40  4  pool id (unique within the incarnation)
 *   44  2  worker address length A
 *   46  2  packed rkey length R
 *   48  64 worker name, NUL-padded (1..63 characters)
 *   112 8  owner's host id     \
 *   120 8  owner's pid namespace > proc.h: lets a same-host peer check the owner is alive
 *   128 8  owner's start ticks  |  (all zero when unknown)
 *   136 4  owner's pid         /
 *   140 4  zero
 *   144 A  UCX worker address
 *   ..  R  UCX packed rkey
 *   ..  8  XXH3-64 (seed 0) of every byte before it
 */
#ifndef TANDEM_TRANSFER_DESC_H
#define TANDEM_TRANSFER_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "transfer/proc.h"

#define XFER_DESC_VERSION        1
#define XFER_DESC_HEADER_BYTES   144
#define XFER_DESC_CHECKSUM_BYTES 8
#define XFER_NAME_MAX_BYTES      64    /* worker name including its NUL */
#define XFER_DESC_MAX_BLOB_BYTES 65535 /* limit of the worker address and of the rkey */

/* Where a pool's pages live. */
typedef enum {
    XFER_MEM_HOST = 0, /* host memory */
    XFER_MEM_CUDA = 1, /* NVIDIA device memory (builds with TANDEM_HAVE_CUDA only) */
} xfer_mem_type_t;

/*
 * A decoded descriptor. Plain data; `worker_address` and `rkey` point into the bytes it was
 * parsed from (borrowed: valid while those bytes are), `name` is a copy.
 */
typedef struct {
    char name[XFER_NAME_MAX_BYTES];
    uint64_t incarnation_id;
    xfer_mem_type_t mem_type;
    uint64_t base_addr;
    uint64_t pool_bytes;
    uint32_t page_size_bytes;
    uint32_t n_pages;
    uint32_t pool_id;
    xfer_proc_id_t owner; /* the owning process on its host (proc.h); zeros when unknown */
    const uint8_t *worker_address;
    size_t worker_address_bytes;
    const uint8_t *rkey;
    size_t rkey_bytes;
} xfer_desc_t;

/* xfer_desc_encoded_bytes - the size of desc's wire form (header, blobs, checksum). */
size_t xfer_desc_encoded_bytes(const xfer_desc_t *desc);

/*
 * xfer_desc_encode - write desc's wire form into buf (capacity n_buf_bytes).
 * Returns TDM_OK with *n_bytes_out set, or TDM_ERR_INVALID_ARG (empty or too long name, zero
 * incarnation or geometry, pool_bytes != page size * pages, blob over 65535 bytes, unknown
 * memory type, buffer too small); buf is not written on error.
 */
tdm_status_t xfer_desc_encode(const xfer_desc_t *desc, uint8_t *buf, size_t n_buf_bytes,
                              size_t *n_bytes_out);

/*
 * xfer_desc_parse - check and decode n_bytes at `bytes` (from outside: any content).
 * Returns TDM_OK with *desc_out filled (its blob pointers borrow `bytes`), or:
 *   TDM_ERR_FORMAT       truncated, bad magic, lengths that disagree with n_bytes, name not
 *                        NUL-terminated or empty, zero incarnation or geometry, size mismatch
 *   TDM_ERR_UNSUPPORTED  a format version or memory type this build does not know
 *   TDM_ERR_MISMATCH     the checksum does not match the bytes
 * *desc_out is untouched on error.
 */
tdm_status_t xfer_desc_parse(const uint8_t *bytes, size_t n_bytes, xfer_desc_t *desc_out);

#endif
