/* mem.cu - the CUDA backend's memory members (kernels/mem.h): cudaMalloc / cudaFree, copies and
 * fills queued on the context's stream, a copy to the host completed before return. */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

extern "C" tdm_status_t kern_mem_alloc_cuda(kern_ctx_t *ctx, size_t n_bytes, void **ptr_out)
{
    void *p = NULL;
    cudaError_t err;

    (void)ctx;
    if (ptr_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    err = cudaMalloc(&p, n_bytes > 0 ? n_bytes : 1); /* cudaMalloc aligns to >= 256 bytes */
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear the sticky-free allocation error */
        tdm_log(TDM_LOG_WARN, KC_LOG, "device allocation failed: bytes=%zu", n_bytes);
        return TDM_ERR_NO_MEMORY;
    }
    if (kc_call_status("mem_alloc_cuda", "cudaMalloc", err) != TDM_OK) {
        return TDM_ERR_INTERNAL;
    }
    *ptr_out = p;
    return TDM_OK;
}

extern "C" void kern_mem_free_cuda(kern_ctx_t *ctx, void *ptr)
{
    (void)ctx;
    if (ptr != NULL) {
        (void)cudaFree(ptr);
    }
}

extern "C" tdm_status_t kern_mem_copy_cuda(kern_ctx_t *ctx, void *dst, const void *src,
                                           size_t n_bytes, kern_copy_kind_t kind)
{
    cudaStream_t stream = kc_stream(ctx);
    cudaMemcpyKind dir;
    tdm_status_t st;

    switch (kind) {
    case KERN_COPY_H2D:
        dir = cudaMemcpyHostToDevice;
        break;
    case KERN_COPY_D2H:
        dir = cudaMemcpyDeviceToHost;
        break;
    case KERN_COPY_D2D:
        dir = cudaMemcpyDeviceToDevice;
        break;
    default:
        return TDM_ERR_INVALID_ARG;
    }
    if (n_bytes == 0) {
        return TDM_OK;
    }
    if (dst == NULL || src == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    st = kc_call_status("mem_copy_cuda", "cudaMemcpyAsync",
                        cudaMemcpyAsync(dst, src, n_bytes, dir, stream));
    if (st == TDM_OK && kind == KERN_COPY_D2H) {
        st =
            kc_call_status("mem_copy_cuda", "cudaStreamSynchronize", cudaStreamSynchronize(stream));
    }
    return st;
}

extern "C" tdm_status_t kern_mem_set_cuda(kern_ctx_t *ctx, void *dst, int byte, size_t n_bytes)
{
    if (n_bytes == 0) {
        return TDM_OK;
    }
    if (dst == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    return kc_call_status("mem_set_cuda", "cudaMemsetAsync",
                          cudaMemsetAsync(dst, byte & 0xFF, n_bytes, kc_stream(ctx)));
}

extern "C" tdm_status_t kern_sync_cuda(kern_ctx_t *ctx)
{
    return kc_call_status("sync_cuda", "cudaStreamSynchronize",
                          cudaStreamSynchronize(kc_stream(ctx)));
}

/* The page-aligned range [*base, *base + *len) that holds [host, host + n_bytes). */
static void page_range(const void *host, size_t n_bytes, void **base, size_t *len)
{
    long sys_page = sysconf(_SC_PAGESIZE);
    const uintptr_t page = sys_page > 0 ? (uintptr_t)sys_page : 4096;
    uintptr_t lo = (uintptr_t)host & ~(page - 1);
    uintptr_t hi = ((uintptr_t)host + (n_bytes > 0 ? n_bytes : 1) + page - 1) & ~(page - 1);
    *base = (void *)lo;
    *len = (size_t)(hi - lo);
}

extern "C" tdm_status_t kern_host_register_cuda(kern_ctx_t *ctx, const void *host, size_t n_bytes,
                                                const void **dev_out)
{
    void *base;
    void *dev = NULL;
    size_t len;
    cudaError_t err;

    (void)ctx;
    if (host == NULL || dev_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    page_range(host, n_bytes, &base, &len);
    err = cudaHostRegister(base, len, cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (kc_call_status("host_register_cuda", "cudaHostRegister", err) != TDM_OK) {
        return TDM_ERR_INTERNAL;
    }
    if (kc_call_status("host_register_cuda", "cudaHostGetDevicePointer",
                       cudaHostGetDevicePointer(&dev, (void *)host, 0)) != TDM_OK) {
        (void)cudaHostUnregister(base);
        return TDM_ERR_INTERNAL;
    }
    *dev_out = dev;
    return TDM_OK;
}

extern "C" void kern_host_unregister_cuda(kern_ctx_t *ctx, const void *host, size_t n_bytes)
{
    void *base;
    size_t len;

    (void)ctx;
    if (host == NULL) {
        return;
    }
    page_range(host, n_bytes, &base, &len);
    if (cudaHostUnregister(base) != cudaSuccess) {
        (void)cudaGetLastError(); /* not registered: nothing to end */
    }
}
