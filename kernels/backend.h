/* backend.h - kernel execution context and backend discovery.
 *
 * kern_ctx_t carries what differs between backends (CPU threads; CUDA device and stream) so that
 * both backends share one signature per kernel (STYLE.md section 6). Owns no model state.
 */
#ifndef TANDEM_KERNELS_BACKEND_H
#define TANDEM_KERNELS_BACKEND_H

#include "common/status.h"

typedef enum {
    KERN_BACKEND_CPU = 0,  /* plain C, host memory */
    KERN_BACKEND_CUDA = 1, /* CUDA, device memory */
} kern_backend_t;

/* Plain data describing where kernels run. Zero-initialised = CPU, one thread. */
typedef struct {
    kern_backend_t backend;
    int n_threads;     /* CPU worker threads (0 or 1: the calling thread only) */
    int cuda_device;   /* CUDA device ordinal (CUDA backend) */
    void *cuda_stream; /* cudaStream_t, NULL = default stream (CUDA backend) */
} kern_ctx_t;

/*
 * kern_cuda_available - 1 when this build has the CUDA backend and a CUDA device is usable,
 * else 0. Never fails; the reason for 0 is written to `reason` (may be NULL) as a static string.
 */
int kern_cuda_available(const char **reason);

#endif
