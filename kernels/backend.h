/* backend.h - kernel execution context and backend discovery.
 *
 * kern_ctx_t carries what differs between backends (CPU threads; CUDA device and stream) so that
 * both backends share one signature per kernel (STYLE.md section 6). Owns no model state. The CPU
 * worker pool (kern_pool_t) is an object of its own: whoever fills a kern_ctx_t with n_threads > 1
 * creates one with kern_pool_create, points the context at it, and destroys it after the last
 * kernel call; there is no process-wide pool, so two contexts each run on their own threads.
 */
#ifndef TANDEM_KERNELS_BACKEND_H
#define TANDEM_KERNELS_BACKEND_H

#include <stdint.h>

#include "common/status.h"

typedef enum {
    KERN_BACKEND_CPU = 0,  /* plain C, host memory */
    KERN_BACKEND_CUDA = 1, /* CUDA, device memory */
    KERN_BACKEND_GUARD = 2, /* the CPU kernels over guarded memory (kernels/guard.h): a check */
} kern_backend_t;

/* kern_pool_t - a CPU worker pool: n_threads - 1 worker threads that run a kernel's chunks beside
 * the calling thread. An idle worker polls for the next job for TANDEM_POOL_SPIN_US
 * microseconds (read at create; default 200, 0 = never poll, 0..100000) and then sleeps, so the
 * back-to-back GEMMs of a decode step do not each pay a thread wake-up (layout and memory
 * ordering in kernels/cpu/pool.c). */
typedef struct kern_pool kern_pool_t;

/* Largest n_threads kern_pool_create accepts (the caller plus 63 workers). */
#define KERN_POOL_MAX_THREADS 64

/*
 * Plain data describing where kernels run. Zero-initialised = CPU, one thread (no pool).
 * A CPU kernel uses min(n_threads, kern_pool_n_threads(pool)) threads: with pool NULL it runs on
 * the calling thread alone, whatever n_threads says. The thread count never changes results (the
 * work split is over independent outputs).
 */
typedef struct {
    kern_backend_t backend;
    int n_threads;     /* CPU threads to use, the caller's included (0 or 1: the caller only) */
    kern_pool_t *pool; /* CPU workers, borrowed (must outlive every kernel call); NULL = none */
    int cuda_device;   /* CUDA device ordinal (CUDA backend) */
    void *cuda_stream; /* cudaStream_t, NULL = default stream (CUDA backend) */
    /* CPU RoPE cos/sin rows of recent positions (kernels/rope.h kern_rope_cache_create),
     * borrowed like pool; NULL = computed in every call. Changes no result, only time. */
    struct kern_rope_cache *rope_cache;
    /* Deferred status (backend memory, one int32; NULL = off). Off: an op whose failure depends on
     * the data (kern_moe_route_fn's NaN) returns it, which on CUDA means waiting for the stream.
     * On: the op ORs its KERN_STATUS_* bit into the word, leaves outputs that later ops accept,
     * and returns TDM_OK without waiting; the caller zeroes the word before and reads it once
     * after, where it waits anyway (a decode step's last copy to the host). A CPU op that can
     * check at no cost may still return its error at once (kern_page_mark_fn on the CPU). */
    int32_t *status_word;
} kern_ctx_t;

/* Bits of kern_ctx_t.status_word. */
#define KERN_STATUS_ROUTE_NAN   0x1 /* kern_moe_route_fn: a row with a NaN or fewer than K scores */
#define KERN_STATUS_PAGE_HEADER 0x2 /* kern_page_mark_fn (CUDA): not an initialised page header */
#define KERN_STATUS_TOPK_NAN    0x4 /* kern_topk_fn: a NaN among the values */

/*
 * kern_pool_create - start a pool of n_threads - 1 worker threads (all started here, none later;
 * n_threads 1 gives a pool with no workers, on which every kernel runs on its caller).
 *
 * Returns TDM_OK with the pool in *pool_out (the caller owns it and frees it with
 * kern_pool_destroy); TDM_ERR_INVALID_ARG if n_threads is outside 1..KERN_POOL_MAX_THREADS or
 * pool_out is NULL; TDM_ERR_NO_MEMORY if memory or a thread could not be had (any workers already
 * started are joined; *pool_out untouched on every error).
 * Threading: a pool runs one kernel call at a time; a second thread's call that finds it busy
 * runs on that thread alone (same results), so contexts may share a pool, but each context
 * itself is not thread-safe.
 */
tdm_status_t kern_pool_create(int n_threads, kern_pool_t **pool_out);

/*
 * kern_pool_destroy - stop every worker, join it, and free the pool. Accepts NULL. Must not be
 * called while a kernel call runs on the pool; contexts that point at it must not be used after.
 */
void kern_pool_destroy(kern_pool_t *pool);

/* kern_pool_n_threads - threads a call on pool can use (its workers + the caller); 1 for NULL. */
int kern_pool_n_threads(const kern_pool_t *pool);

/*
 * kern_cuda_available - 1 when this build has the CUDA backend and a CUDA device is usable,
 * else 0. Never fails; the reason for 0 is written to `reason` (may be NULL) as a static string.
 */
int kern_cuda_available(const char **reason);

#endif
