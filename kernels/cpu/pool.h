/* pool.h - running one job's chunks on a kernel context's worker pool (private to kernels/cpu).
 *
 * The pool itself (kern_pool_t, created and destroyed with kern_pool_create/kern_pool_destroy)
 * is declared in kernels/backend.h and owned by whoever made the kern_ctx_t; this header only
 * runs work on it. Chunks are claimed one at a time (a compare-and-swap on the job's ticket), the
 * caller claims too, and it waits only for chunks a worker has already claimed, so a worker the
 * OS schedules late costs nothing (it finds no chunk left). Idle workers poll for the next job
 * for TANDEM_POOL_SPIN_US microseconds, then sleep on a condition variable; the caller polls
 * for its job's claimed chunks (yielding the CPU after a while), whatever that setting. Layout
 * and memory ordering: kernels/cpu/pool.c. Not a public header.
 */
#ifndef TANDEM_KERNELS_CPU_POOL_H
#define TANDEM_KERNELS_CPU_POOL_H

#include "kernels/backend.h"

#include <stddef.h>
#include <stdint.h>

/* cpu_pool_chunk_fn - run chunk c (0 <= c < n_chunks) of a job; arg is the job's argument. */
typedef void cpu_pool_chunk_fn(void *arg, int64_t c);

/*
 * cpu_pool_run - run chunks [0, n_chunks) of fn(arg, c) on the calling thread and at most
 * n_threads - 1 of pool's workers. Returns when every chunk has run. Runs everything on the
 * caller when pool is NULL, when n_threads <= 1, or when another thread's job holds the pool (so
 * concurrent callers never wait on each other's work). Chunks must be independent; which thread
 * runs a chunk never changes its result. Borrows pool.
 */
void cpu_pool_run(kern_pool_t *pool, int n_threads, int64_t n_chunks, cpu_pool_chunk_fn *fn,
                  void *arg);

/*
 * cpu_pool_threads - the threads a kernel call on ctx may use: min(ctx->n_threads,
 * kern_pool_n_threads(ctx->pool)), at least 1 (1 for a NULL ctx or pool, or n_threads <= 1).
 */
static inline int cpu_pool_threads(const kern_ctx_t *ctx)
{
    int n = ctx != NULL && ctx->n_threads > 1 ? ctx->n_threads : 1;
    int most = kern_pool_n_threads(ctx != NULL ? ctx->pool : NULL);
    return n < most ? n : most;
}

#endif
