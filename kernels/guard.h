/* kernels/guard.h - the "guard" kernel table: a checking backend that proves code never
 * dereferences backend memory on the host (issue 14 items 1 and 5). The tests use it directly;
 * `--device guard` (kernels/device.h) runs a whole tool or node on it, e.g. the cluster tests
 * with one role's nodes on it (tandem local --prefill-device / --decode-device guard), so the
 * nodes' device paths (node/node_pages.h) run on machines without a GPU. It is a debugging
 * backend: every op call costs two mprotect calls. The region is reserved with MAP_NORESERVE
 * (no memory committed until used); under vm.overcommit_memory=2 the kernel commits it all at
 * the first op, so set TANDEM_GUARD_BYTES to what the run needs there. The table that
 * kern_device_ops makes for "guard" lives until the process exits: do not kern_guard_destroy it.
 *
 * The guard table is a copy of the CPU table (same kernels, same bits) with host_memory = 0
 * whose mem_alloc carves every allocation from ONE mmap'd region. That region is readable and
 * writable only while a member of the table runs (PROT_READ | PROT_WRITE from entry to return)
 * and PROT_NONE otherwise, so a host read or write of backend memory outside an op (an engine
 * loop over activations, a memcpy into a ring, a page header read) faults with SIGSEGV at the
 * offending line. Host memory (the caller's buffers, the mapped checkpoint) is never protected:
 * kernels read it inside an op as on the CPU.
 *
 * Allocator: first fit over a host-side, offset-sorted list of blocks (the bookkeeping lives
 * outside the region, so allocating touches no guarded byte); every block is 64-byte aligned and
 * a multiple of 64 bytes; freeing merges a block with free neighbours. An allocation the region
 * cannot hold returns TDM_ERR_NO_MEMORY. mem_copy additionally checks that the backend side of
 * each copy lies inside the region and the host side outside (a wrong direction aborts with a
 * message naming the copy).
 *
 * Threading: one guard table per process at a time (its state is static), called from one
 * thread at a time; the CPU kernels' own worker threads run inside an op, while the region is
 * open, which is fine. Source: kernels/cpu/guard.c.
 */
#ifndef TANDEM_KERNELS_GUARD_H
#define TANDEM_KERNELS_GUARD_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/ops.h"

/*
 * kern_guard_create - map a guarded region of pool_bytes (rounded up to whole pages, > 0) and
 * fill the guard table. *ops_out points at the table (static storage) until kern_guard_destroy.
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (ops_out NULL, pool_bytes 0), TDM_ERR_BUSY (a guard table
 * already exists) or TDM_ERR_NO_MEMORY (mmap failed); *ops_out untouched on errors.
 */
tdm_status_t kern_guard_create(size_t pool_bytes, const kern_ops_t **ops_out);

/* kern_guard_destroy - unmap the region (every allocation is gone with it). No-op without a
 * table. Returns the bytes still allocated at that point (0 when every mem_alloc was freed). */
size_t kern_guard_destroy(void);

/*
 * kern_guard_report - report mode on (1) or off (0); returns the reports so far. In report mode a
 * host access of backend memory does not kill the process: a SIGSEGV handler prints the address
 * and the stack (symbolized when the sanitizer runtime is linked), opens the region so that the
 * access completes, and the next op call closes it again; a host pointer passed to an op is
 * printed instead of aborting. For listing every faulting site of a run; the default (off)
 * faults at the first one.
 */
size_t kern_guard_report(int on);

/* kern_guard_contains - 1 when [p, p + n_bytes) lies inside the guarded region, else 0. */
int kern_guard_contains(const void *p, size_t n_bytes);

/* kern_guard_used - bytes currently allocated from the region (blocks, rounded to 64). */
size_t kern_guard_used(void);

#endif
