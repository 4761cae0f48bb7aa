/* proc.h - host-local process identity, so a peer on the same host can be checked for life.
 *
 * UCX 1.13 notices a dead shared-memory peer only through its keepalive, which stalls when the
 * dead peer's receive FIFO is full (an emulated put was queued to it): operations then hang
 * forever. A peer on the same host and in the same pid namespace is therefore also checked
 * directly: is the process with that pid and that start time still running? Owns nothing;
 * reads /proc. Knows nothing of UCX.
 */
#ifndef TANDEM_TRANSFER_PROC_H
#define TANDEM_TRANSFER_PROC_H

#include <stdint.h>

#include "common/status.h"

/*
 * Who a process is on its host. Plain data; all zero when unknown (no /proc), which disables
 * the check. host_id: XXH3-64 of the kernel boot id; pid_ns: inode of the pid namespace;
 * start_ticks: start time in clock ticks after boot (/proc/<pid>/stat field 22), which tells a
 * reused pid from the original.
 */
typedef struct {
    uint64_t host_id;
    uint64_t pid_ns;
    uint64_t start_ticks;
    uint32_t pid;
} xfer_proc_id_t;

/* xfer_proc_id_self - this process's identity into *id_out (zeros where /proc lacks a field).
 * Never fails. */
void xfer_proc_id_self(xfer_proc_id_t *id_out);

/* xfer_proc_id_comparable - 1 when `other` is on the same host and in the same pid namespace as
 * `self` (both known), so xfer_proc_check may judge it; else 0. */
int xfer_proc_id_comparable(const xfer_proc_id_t *self, const xfer_proc_id_t *other);

/*
 * xfer_proc_check - whether the process `id` still runs: TDM_OK (running), TDM_ERR_PEER_LOST
 * (no such pid, a different start time, or a zombie), TDM_ERR_UNSUPPORTED (id unknown or /proc
 * unreadable for another reason: no verdict). Only meaningful when comparable.
 */
tdm_status_t xfer_proc_check(const xfer_proc_id_t *id);

#endif
