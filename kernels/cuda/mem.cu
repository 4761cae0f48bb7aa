/* mem.cu - the CUDA backend's memory members (kernels/mem.h): cudaMalloc / cudaFree, copies and
 * fills queued on the context's stream, a copy to the host completed before return; host ranges
 * mapped for kernels in place (cudaHostRegister, read-only) or, where the device cannot map
 * read-only pages, through a pinned copy. */
#include "kernels/cuda/ops_cuda.h"

#include "kernels/cuda/cuda_common.cuh"

extern "C" {
#include "common/clock.h"
}

#include <cuda_runtime.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
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

/* Registrations that could not pin the caller's pages in place (a read-only file mapping on a
 * device without cudaHostRegisterReadOnly): the range is copied once into pinned, mapped host
 * memory (cudaHostAlloc) and kernels read the copy; unregister frees it. Guarded by reg_lock. */
#define HOST_COPIES_MAX 256
static struct {
    const void *base; /* the caller's page range */
    void *copy;       /* its pinned copy */
} host_copies[HOST_COPIES_MAX];
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

/* 1 when the current device pins read-only host pages in place. */
static int read_only_register_supported(void)
{
    int dev = 0;
    int ok = 0;

    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&ok, cudaDevAttrHostRegisterReadOnlySupported, dev) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return ok != 0;
}

/* The fallback: [base, base + len) copied into pinned mapped memory; *dev_out = the device
 * address of host's byte in the copy. */
static tdm_status_t register_copy(const void *host, const void *base, size_t len,
                                  const void **dev_out)
{
    void *copy = NULL;
    void *dev = NULL;
    int slot = -1;

    /* the copy (possibly gigabytes) outside the lock; the registry entry under it */
    if (kc_call_status("host_register_cuda", "cudaHostAlloc",
                       cudaHostAlloc(&copy, len, cudaHostAllocMapped)) != TDM_OK) {
        return TDM_ERR_INTERNAL;
    }
    memcpy(copy, base, len);
    if (kc_call_status("host_register_cuda", "cudaHostGetDevicePointer",
                       cudaHostGetDevicePointer(&dev, copy, 0)) != TDM_OK) {
        (void)cudaFreeHost(copy);
        return TDM_ERR_INTERNAL;
    }
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; i < HOST_COPIES_MAX && slot < 0; i++) {
        slot = host_copies[i].base == NULL ? i : -1;
    }
    if (slot >= 0) {
        host_copies[slot].base = base;
        host_copies[slot].copy = copy;
    }
    pthread_mutex_unlock(&reg_lock);
    if (slot < 0) {
        (void)cudaFreeHost(copy);
        tdm_log(TDM_LOG_ERROR, KC_LOG, "host_register_cuda: more than %d copied ranges",
                HOST_COPIES_MAX);
        return TDM_ERR_INTERNAL;
    }
    *dev_out = (const uint8_t *)dev + ((const uint8_t *)host - (const uint8_t *)base);
    return TDM_OK;
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
    if (!read_only_register_supported()) {
        tdm_log(TDM_LOG_INFO, KC_LOG,
                "host_register_cuda: the device cannot map read-only host pages in place; "
                "copying %zu bytes into pinned host memory",
                len);
        return register_copy(host, base, len, dev_out);
    }
    const uint64_t t0 = tdm_clock_now_ns();
    err = cudaHostRegister(base, len, cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    tdm_log(TDM_LOG_DEBUG, KC_LOG, "host_register_cuda: %zu bytes in place: %s in %.1f ms", len,
            cudaGetErrorString(err), (double)(tdm_clock_now_ns() - t0) / 1e6);
    if (err == cudaErrorNotSupported) {
        (void)cudaGetLastError();
        tdm_log(TDM_LOG_WARN, KC_LOG,
                "host_register_cuda: cudaHostRegister not supported here (%s); copying %zu "
                "bytes into pinned host memory",
                cudaGetErrorString(err), len);
        return register_copy(host, base, len, dev_out);
    }
    /* any other error (a page registered twice, which kernels/mem.h forbids, included) */
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
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; i < HOST_COPIES_MAX; i++) {
        if (host_copies[i].base == base) {
            (void)cudaFreeHost(host_copies[i].copy);
            host_copies[i].base = NULL;
            host_copies[i].copy = NULL;
            pthread_mutex_unlock(&reg_lock);
            return;
        }
    }
    pthread_mutex_unlock(&reg_lock);
    if (cudaHostUnregister(base) != cudaSuccess) {
        (void)cudaGetLastError(); /* not registered: nothing to end */
    }
}
