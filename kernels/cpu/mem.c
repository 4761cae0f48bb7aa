/* mem.c - the CPU backend's memory members (kernels/mem.h): host memory, libc calls. */
#include "kernels/mem.h"

#include <stdlib.h>
#include <string.h>

#define MEM_ALIGN_BYTES 64

tdm_status_t kern_mem_alloc_cpu(kern_ctx_t *ctx, size_t n_bytes, void **ptr_out)
{
    size_t rounded;
    void *p;

    (void)ctx;
    if (ptr_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    /* aligned_alloc wants a multiple of the alignment, and a non-zero size */
    rounded = (n_bytes + MEM_ALIGN_BYTES - 1) / MEM_ALIGN_BYTES * MEM_ALIGN_BYTES;
    if (rounded < n_bytes) {
        return TDM_ERR_NO_MEMORY; /* overflow */
    }
    p = aligned_alloc(MEM_ALIGN_BYTES, rounded > 0 ? rounded : MEM_ALIGN_BYTES);
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *ptr_out = p;
    return TDM_OK;
}

void kern_mem_free_cpu(kern_ctx_t *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
}

tdm_status_t kern_mem_copy_cpu(kern_ctx_t *ctx, void *dst, const void *src, size_t n_bytes,
                               kern_copy_kind_t kind)
{
    (void)ctx;
    if (kind != KERN_COPY_H2D && kind != KERN_COPY_D2H && kind != KERN_COPY_D2D) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n_bytes == 0) {
        return TDM_OK;
    }
    if (dst == NULL || src == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memmove(dst, src, n_bytes);
    return TDM_OK;
}

tdm_status_t kern_mem_set_cpu(kern_ctx_t *ctx, void *dst, int byte, size_t n_bytes)
{
    (void)ctx;
    if (n_bytes == 0) {
        return TDM_OK;
    }
    if (dst == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(dst, byte & 0xFF, n_bytes);
    return TDM_OK;
}

tdm_status_t kern_sync_cpu(kern_ctx_t *ctx)
{
    (void)ctx;
    return TDM_OK;
}

tdm_status_t kern_host_register_cpu(kern_ctx_t *ctx, const void *host, size_t n_bytes,
                                    const void **dev_out)
{
    (void)ctx;
    (void)n_bytes;
    if (host == NULL || dev_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    *dev_out = host;
    return TDM_OK;
}

void kern_host_unregister_cpu(kern_ctx_t *ctx, const void *host, size_t n_bytes)
{
    (void)ctx;
    (void)host;
    (void)n_bytes;
}
