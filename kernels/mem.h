/* mem.h - the memory members of kern_ops_t: allocate, free, copy and fill the memory a backend's
 * kernels read and write (host memory for "cpu", device memory for "cuda").
 *
 * Engine code that moves activations, KV rows or selections between its own buffers goes
 * through these, never through memcpy or cudaMemcpy by name, so that one orchestration serves
 * both backends (issue 14 item 2). Owns nothing: every allocation belongs to its caller until it
 * passes it to the same backend's mem_free. Knows nothing of models or pages.
 *
 * CUDA ordering: every member runs on ctx->cuda_stream (NULL ctx or stream: the default
 * stream), in order with the kernels queued there. A copy to the host (KERN_COPY_D2H) waits for
 * its stream before it returns, so the host may read the bytes at once; the other copies and
 * the fill are asynchronous (their source must stay valid until the stream reaches them: host
 * sources of KERN_COPY_H2D are pageable memory, which the CUDA runtime stages before the call
 * returns). The device is the calling thread's current CUDA device (ctx->cuda_device is the
 * caller's record of it).
 */
#ifndef TANDEM_KERNELS_MEM_H
#define TANDEM_KERNELS_MEM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/* Direction of a kern_mem_copy_fn ("host" = ordinary process memory, "device" = the backend's
 * memory; for the CPU backend the two are the same and every kind is a memmove). */
typedef enum {
    KERN_COPY_H2D = 0, /* host -> device */
    KERN_COPY_D2H = 1, /* device -> host; complete when the call returns */
    KERN_COPY_D2D = 2, /* device -> device */
} kern_copy_kind_t;

/*
 * kern_mem_alloc_fn - n_bytes of backend memory, aligned to at least 64 bytes, contents
 * undefined. n_bytes 0 gives a valid pointer that must still be freed.
 * Returns TDM_OK with the pointer in *ptr_out (the caller owns it and frees it with the same
 * backend's mem_free), TDM_ERR_INVALID_ARG (ptr_out NULL) or TDM_ERR_NO_MEMORY (*ptr_out
 * untouched on every error). CPU: aligned_alloc. CUDA: cudaMalloc (synchronous).
 */
typedef tdm_status_t kern_mem_alloc_fn(kern_ctx_t *ctx, size_t n_bytes, void **ptr_out);
kern_mem_alloc_fn kern_mem_alloc_cpu;

/*
 * kern_mem_free_fn - release memory from the same backend's mem_alloc. Accepts NULL; cannot
 * fail. CUDA: cudaFree, which waits for the device first.
 */
typedef void kern_mem_free_fn(kern_ctx_t *ctx, void *ptr);
kern_mem_free_fn kern_mem_free_cpu;

/*
 * kern_mem_copy_fn - copy n_bytes from src to dst in the direction `kind`. dst and src are host
 * or backend memory as `kind` says; overlapping ranges are allowed only when both are the same
 * buffer kind (CPU: memmove). n_bytes 0 does nothing (pointers may then be NULL).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL pointer with n_bytes > 0, unknown kind; nothing
 * copied) or TDM_ERR_INTERNAL (CUDA error, logged).
 */
typedef tdm_status_t kern_mem_copy_fn(kern_ctx_t *ctx, void *dst, const void *src, size_t n_bytes,
                                      kern_copy_kind_t kind);
kern_mem_copy_fn kern_mem_copy_cpu;

/*
 * kern_mem_set_fn - set n_bytes of backend memory at dst to the byte value `byte` (0..255; the
 * low 8 bits are used). n_bytes 0 does nothing. Returns TDM_OK, TDM_ERR_INVALID_ARG (dst NULL
 * with n_bytes > 0) or TDM_ERR_INTERNAL (CUDA error, logged).
 */
typedef tdm_status_t kern_mem_set_fn(kern_ctx_t *ctx, void *dst, int byte, size_t n_bytes);
kern_mem_set_fn kern_mem_set_cpu;

/*
 * kern_sync_fn - wait until every kernel and copy queued on ctx's stream has finished. CPU: a
 * no-op (CPU kernels return finished). Returns TDM_OK or TDM_ERR_INTERNAL (CUDA error of this
 * or an earlier asynchronous call, logged).
 */
typedef tdm_status_t kern_sync_fn(kern_ctx_t *ctx);
kern_sync_fn kern_sync_cpu;

/*
 * kern_host_register_fn - make n_bytes of ordinary host memory at host (e.g. a read-only file
 * mapping: the Engram tables, MODEL.md host RAM) readable by the backend's kernels, and give the
 * address kernels use for it in *dev_out (dev_out + i addresses host + i). The memory stays the
 * caller's and must outlive the registration; kernels only read it. CPU (and any backend whose
 * kernels read host memory): *dev_out = host, nothing else. CUDA: cudaHostRegister (mapped,
 * read-only) of the enclosing pages and cudaHostGetDevicePointer; where the device cannot map
 * read-only pages (cudaDevAttrHostRegisterReadOnlySupported 0, or cudaErrorNotSupported), the
 * pages are copied once into pinned mapped memory (cudaHostAlloc, logged) that kernels read
 * instead and unregister frees. Two live registrations must not share a page (callers merge
 * neighbouring ranges into one registration).
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (host or dev_out NULL; *dev_out untouched) or
 * TDM_ERR_INTERNAL (CUDA error, logged; nothing registered).
 */
typedef tdm_status_t kern_host_register_fn(kern_ctx_t *ctx, const void *host, size_t n_bytes,
                                           const void **dev_out);
kern_host_register_fn kern_host_register_cpu;

/*
 * kern_host_unregister_fn - end a kern_host_register_fn registration of host (the same pointer
 * and size). Accepts NULL; cannot fail (CUDA errors are cleared: a range shared with another
 * registration may already be gone). CPU: nothing.
 */
typedef void kern_host_unregister_fn(kern_ctx_t *ctx, const void *host, size_t n_bytes);
kern_host_unregister_fn kern_host_unregister_cpu;

#ifdef __cplusplus
}
#endif

#endif
