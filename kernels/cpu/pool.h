/* pool.h - the CPU kernels' worker threads (private to kernels/cpu). One process-wide pool of
 * sleeping workers runs a job's chunks beside the calling thread: chunks are claimed one at a
 * time under the pool's mutex, the caller claims too, and it waits only for chunks a worker has
 * already claimed, so a worker the OS schedules late costs nothing (it finds no chunk left).
 * Workers sleep on a condition variable between jobs (no spinning). Not a public header.
 */
#ifndef TANDEM_KERNELS_CPU_POOL_H
#define TANDEM_KERNELS_CPU_POOL_H

#include <stdint.h>

/* cpu_pool_chunk_fn - run chunk c (0 <= c < n_chunks) of a job; arg is the job's argument. */
typedef void cpu_pool_chunk_fn(void *arg, int64_t c);

/*
 * cpu_pool_run - run chunks [0, n_chunks) of fn(arg, c) on the calling thread and at most
 * n_threads - 1 pool workers (started on first use, kept for the process's lifetime, at most
 * CPU_POOL_MAX_WORKERS). Returns when every chunk has run. Runs everything on the caller when
 * n_threads <= 1, when the workers cannot be started, or when another thread's job holds the
 * pool (so concurrent callers never wait on each other's work). Chunks must be independent.
 */
void cpu_pool_run(int n_threads, int64_t n_chunks, cpu_pool_chunk_fn *fn, void *arg);

#define CPU_POOL_MAX_WORKERS 63

#endif
