#include "transfer/pool.h"

#include "common/log.h"
#include "transfer/internal.h"

#include <stdlib.h>
#include <string.h>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

int xfer_pool_device_memory_available(void)
{
#ifdef TANDEM_HAVE_CUDA
    int n_devices = 0;

    if (cudaGetDeviceCount(&n_devices) != cudaSuccess) {
        return 0;
    }
    return n_devices > 0;
#else
    return 0;
#endif
}

#ifdef TANDEM_HAVE_CUDA
/* Device memory the pool allocates itself (UCX 1.13 cannot allocate it for us). */
static tdm_status_t device_alloc(size_t n_bytes, void **ptr_out)
{
    void *ptr = NULL;
    cudaError_t err = cudaMalloc(&ptr, n_bytes);

    if (err != cudaSuccess) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "device pool allocation failed: bytes=%zu cuda=%s",
                n_bytes, cudaGetErrorString(err));
        return err == cudaErrorMemoryAllocation ? TDM_ERR_NO_MEMORY : TDM_ERR_UNSUPPORTED;
    }
    err = cudaMemset(ptr, 0, n_bytes);
    if (err != cudaSuccess) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "device pool clear failed: bytes=%zu cuda=%s",
                n_bytes, cudaGetErrorString(err));
        cudaFree(ptr);
        return TDM_ERR_UNSUPPORTED;
    }
    *ptr_out = ptr;
    return TDM_OK;
}
#endif

xfer_pool_t *xfer_pool_find(const xfer_context_t *ctx, uint32_t pool_id)
{
    for (xfer_pool_t *pool = ctx->pools; pool != NULL; pool = pool->next) {
        if (pool->pool_id == pool_id) {
            return pool;
        }
    }
    return NULL;
}

const uint8_t *xfer_pool_host_page(const xfer_pool_t *pool, uint32_t page, uint8_t *staging)
{
    const uint8_t *src = pool->base + (size_t)page * pool->page_size_bytes;

    if (pool->mem_type == XFER_MEM_HOST) {
        return src;
    }
#ifdef TANDEM_HAVE_CUDA
    {
        cudaError_t err = cudaMemcpy(staging, src, pool->page_size_bytes, cudaMemcpyDeviceToHost);

        if (err != cudaSuccess) {
            tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "device page read failed: page=%u cuda=%s",
                    page, cudaGetErrorString(err));
            return NULL;
        }
        return staging;
    }
#else
    (void)staging;
    return NULL;
#endif
}

/* Encode the pool's descriptor (worker address, packed rkey, geometry) into pool->desc_bytes. */
static tdm_status_t encode_descriptor(xfer_pool_t *pool)
{
    xfer_context_t *ctx = pool->ctx;
    xfer_desc_t desc;
    ucp_address_t *address = NULL;
    size_t address_bytes = 0;
    void *rkey = NULL;
    size_t rkey_bytes = 0;
    ucs_status_t ucs;
    tdm_status_t status;

    ucs = ucp_worker_get_address(ctx->worker, &address, &address_bytes);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "worker address failed: ucx=\"%s\"",
                ucs_status_string(ucs));
        return TDM_ERR_UNSUPPORTED;
    }
    ucs = ucp_rkey_pack(ctx->ucp, pool->memh, &rkey, &rkey_bytes);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "rkey pack failed: pool_id=%u ucx=\"%s\"",
                pool->pool_id, ucs_status_string(ucs));
        status = TDM_ERR_UNSUPPORTED;
        goto out_release_address;
    }

    memset(&desc, 0, sizeof(desc));
    memcpy(desc.name, ctx->name, sizeof(desc.name));
    desc.incarnation_id = ctx->incarnation_id;
    desc.mem_type = pool->mem_type;
    desc.base_addr = (uint64_t)(uintptr_t)pool->base;
    desc.pool_bytes = pool->n_bytes;
    desc.page_size_bytes = pool->page_size_bytes;
    desc.n_pages = pool->n_pages;
    desc.pool_id = pool->pool_id;
    desc.owner = ctx->self;
    desc.worker_address = (const uint8_t *)address;
    desc.worker_address_bytes = address_bytes;
    desc.rkey = rkey;
    desc.rkey_bytes = rkey_bytes;
    pool->desc_n_bytes = xfer_desc_encoded_bytes(&desc);
    pool->desc_bytes = malloc(pool->desc_n_bytes);
    if (pool->desc_bytes == NULL) {
        status = TDM_ERR_NO_MEMORY;
        goto out_release_rkey;
    }
    status = xfer_desc_encode(&desc, pool->desc_bytes, pool->desc_n_bytes, &pool->desc_n_bytes);
    if (status != TDM_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "descriptor encode failed: pool_id=%u address_bytes=%zu rkey_bytes=%zu",
                pool->pool_id, address_bytes, rkey_bytes);
        free(pool->desc_bytes);
        pool->desc_bytes = NULL;
    }

out_release_rkey:
    ucp_rkey_buffer_release(rkey);
out_release_address:
    ucp_worker_release_address(ctx->worker, address);
    return status;
}

tdm_status_t xfer_pool_create(xfer_context_t *ctx, const xfer_pool_params_t *params,
                              xfer_pool_t **pool_out)
{
    xfer_pool_t *pool;
    ucp_mem_map_params_t map_params;
    ucp_mem_attr_t attr;
    ucs_status_t ucs;
    tdm_status_t status;
    void *owned_device = NULL;

    if (params->page_size_bytes == 0 || params->n_pages == 0 ||
        (params->mem_type != XFER_MEM_HOST && params->mem_type != XFER_MEM_CUDA) ||
        (uint64_t)params->page_size_bytes * params->n_pages > (uint64_t)SIZE_MAX / 2) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "pool rejected: page_bytes=%u pages=%u mem_type=%d (need both > 0, known type)",
                params->page_size_bytes, params->n_pages, (int)params->mem_type);
        return TDM_ERR_INVALID_ARG;
    }
#ifndef TANDEM_HAVE_CUDA
    if (params->mem_type == XFER_MEM_CUDA) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "device pool refused: built without CUDA");
        return TDM_ERR_UNSUPPORTED;
    }
#endif

    pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    pool->ctx = ctx;
    pool->page_size_bytes = params->page_size_bytes;
    pool->n_pages = params->n_pages;
    pool->mem_type = params->mem_type;
    pool->n_bytes = (size_t)params->page_size_bytes * params->n_pages;
    pool->pool_id = ctx->next_pool_id;

    memset(&map_params, 0, sizeof(map_params));
    map_params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                            UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    map_params.length = pool->n_bytes;
    map_params.address = params->base;
    map_params.memory_type = UCS_MEMORY_TYPE_HOST;
#ifdef TANDEM_HAVE_CUDA
    if (params->mem_type == XFER_MEM_CUDA) {
        map_params.memory_type = UCS_MEMORY_TYPE_CUDA;
        if (params->base == NULL) {
            status = device_alloc(pool->n_bytes, &owned_device);
            if (status != TDM_OK) {
                goto err_free_pool;
            }
            map_params.address = owned_device;
        }
    }
#endif
    if (map_params.address == NULL) {
        map_params.flags = UCP_MEM_MAP_ALLOCATE;
    }
    ucs = ucp_mem_map(ctx->ucp, &map_params, &pool->memh);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE,
                "pool registration failed: bytes=%zu mem_type=%s ucx=\"%s\"", pool->n_bytes,
                params->mem_type == XFER_MEM_CUDA ? "cuda" : "host", ucs_status_string(ucs));
        status = ucs == UCS_ERR_NO_MEMORY ? TDM_ERR_NO_MEMORY : TDM_ERR_UNSUPPORTED;
        goto err_free_device;
    }
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    ucs = ucp_mem_query(pool->memh, &attr);
    if (ucs != UCS_OK) {
        tdm_log(TDM_LOG_ERROR, XFER_LOG_MODULE, "pool query failed: ucx=\"%s\"",
                ucs_status_string(ucs));
        status = TDM_ERR_INTERNAL;
        goto err_unmap;
    }
    pool->base = attr.address;
    if (map_params.flags & UCP_MEM_MAP_ALLOCATE) {
        memset(pool->base, 0, pool->n_bytes);
    }
    pool->owned_device = owned_device;

    status = encode_descriptor(pool);
    if (status != TDM_OK) {
        goto err_unmap;
    }

    ctx->next_pool_id++;
    pool->prev = NULL;
    pool->next = ctx->pools;
    if (ctx->pools != NULL) {
        ctx->pools->prev = pool;
    }
    ctx->pools = pool;
    tdm_log(TDM_LOG_INFO, XFER_LOG_MODULE,
            "pool registered: pool_id=%u pages=%u page_bytes=%u mem_type=%s allocated=%s",
            pool->pool_id, pool->n_pages, pool->page_size_bytes,
            pool->mem_type == XFER_MEM_CUDA ? "cuda" : "host", params->base == NULL ? "yes" : "no");
    *pool_out = pool;
    return TDM_OK;

err_unmap:
    ucp_mem_unmap(ctx->ucp, pool->memh);
    pool->owned_device = NULL;
err_free_device:
#ifdef TANDEM_HAVE_CUDA
    if (owned_device != NULL) {
        cudaFree(owned_device);
    }
err_free_pool:
#endif
    free(pool);
    return status;
}

void xfer_pool_destroy(xfer_pool_t *pool)
{
    xfer_context_t *ctx;

    if (pool == NULL) {
        return;
    }
    ctx = pool->ctx;
    if (ctx != NULL) {
        if (pool->prev != NULL) {
            pool->prev->next = pool->next;
        } else {
            ctx->pools = pool->next;
        }
        if (pool->next != NULL) {
            pool->next->prev = pool->prev;
        }
        ucp_mem_unmap(ctx->ucp, pool->memh);
    }
#ifdef TANDEM_HAVE_CUDA
    if (pool->owned_device != NULL) {
        cudaFree(pool->owned_device);
    }
#endif
    free(pool->desc_bytes);
    free(pool);
}

void *xfer_pool_page(const xfer_pool_t *pool, uint32_t page)
{
    if (page >= pool->n_pages || pool->base == NULL) {
        return NULL;
    }
    return pool->base + (size_t)page * pool->page_size_bytes;
}

uint32_t xfer_pool_page_size(const xfer_pool_t *pool)
{
    return pool->page_size_bytes;
}

uint32_t xfer_pool_n_pages(const xfer_pool_t *pool)
{
    return pool->n_pages;
}

uint32_t xfer_pool_id(const xfer_pool_t *pool)
{
    return pool->pool_id;
}

xfer_mem_type_t xfer_pool_mem_type(const xfer_pool_t *pool)
{
    return pool->mem_type;
}

void xfer_pool_descriptor(const xfer_pool_t *pool, const uint8_t **bytes_out, size_t *n_bytes_out)
{
    *bytes_out = pool->desc_bytes;
    *n_bytes_out = pool->desc_n_bytes;
}
