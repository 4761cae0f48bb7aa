/* pool.h - a registered page pool: memory UCX may read and write remotely, in page slots.
 *
 * Owns one UCX memory registration (and the memory itself when the pool allocates it), its
 * packed remote key and its encoded descriptor (desc.h). A pool is page geometry over bytes: it
 * knows nothing of which pages are free or whose they are (the decode node's page pool decides
 * that); it only lets peers address pages by index.
 *
 * Memory: with params.base NULL the pool allocates through UCX (ucp_mem_map ALLOCATE), which on
 * one host gives shared memory that a peer writes with a plain copy (UCX "sysv"/"posix" lanes).
 * Caller memory (base non-NULL) is registered in place; over shm in UCX 1.13 it is then reached
 * only by active-message emulation, several times slower. CUDA memory: mem_type XFER_MEM_CUDA,
 * in builds with TANDEM_HAVE_CUDA; UCX then chooses cuda_ipc or GPUDirect RDMA where present.
 */
#ifndef TANDEM_TRANSFER_POOL_H
#define TANDEM_TRANSFER_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "transfer/context.h"
#include "transfer/desc.h"

typedef struct xfer_pool xfer_pool_t;

/* Parameters of xfer_pool_create. Plain data. */
typedef struct {
    uint32_t page_size_bytes; /* > 0; MODEL.md 7: 22848 at full size */
    uint32_t n_pages;         /* > 0 */
    xfer_mem_type_t mem_type;
    void *base; /* NULL: the pool allocates host or device memory; else page_size_bytes *
                   n_pages bytes of `mem_type` memory, borrowed: it must outlive the pool */
} xfer_pool_params_t;

/*
 * xfer_pool_create - register (and, with base NULL, allocate) the pool and encode its
 * descriptor. Allocated host memory is zeroed.
 *
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (zero geometry, size overflow, unknown memory type;
 * nothing registered), TDM_ERR_UNSUPPORTED (XFER_MEM_CUDA in a build without CUDA, or UCX has no
 * transport for that memory: UCX's reason logged), or TDM_ERR_NO_MEMORY. Borrows ctx: it must
 * outlive the pool. Not thread-safe (the context's thread).
 */
tdm_status_t xfer_pool_create(xfer_context_t *ctx, const xfer_pool_params_t *params,
                              xfer_pool_t **pool_out);

/* xfer_pool_destroy - unregister (and free allocated memory). The caller ensures no batch on
 * this pool is in flight and that peers no longer write it. Accepts NULL. */
void xfer_pool_destroy(xfer_pool_t *pool);

/* xfer_pool_page - address of page `page` (< n_pages) in this process: host or device memory
 * per the pool's mem_type. NULL for an index out of range. */
void *xfer_pool_page(const xfer_pool_t *pool, uint32_t page);

/* xfer_pool_page_size - bytes per page. */
uint32_t xfer_pool_page_size(const xfer_pool_t *pool);

/* xfer_pool_n_pages - number of pages. */
uint32_t xfer_pool_n_pages(const xfer_pool_t *pool);

/* xfer_pool_id - the pool's id within this incarnation (in its descriptor and in notices). */
uint32_t xfer_pool_id(const xfer_pool_t *pool);

/* xfer_pool_mem_type - where the pages live. */
xfer_mem_type_t xfer_pool_mem_type(const xfer_pool_t *pool);

/*
 * xfer_pool_descriptor - the pool's encoded descriptor (desc.h wire form), to hand to peers.
 * The bytes are owned by the pool and valid until xfer_pool_destroy.
 */
void xfer_pool_descriptor(const xfer_pool_t *pool, const uint8_t **bytes_out, size_t *n_bytes_out);

/*
 * xfer_pool_device_memory_available - 1 when this build has CUDA (TANDEM_HAVE_CUDA) and the CUDA
 * runtime sees at least one device, else 0. Tests use it to skip device-memory cases.
 */
int xfer_pool_device_memory_available(void);

#endif
