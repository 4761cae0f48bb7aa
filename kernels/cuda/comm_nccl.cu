/* comm_nccl.cu - the nccl half of kernels/comm.h: one communicator per CUDA device of the group
 * (ncclCommInitAll), the all-gather of variable blocks as one broadcast per root inside one
 * NCCL group call (NCCL documentation: ncclBroadcast, in place when sendbuff == recvbuff;
 * ncclGroupStart/ncclGroupEnd). Compiled to nothing without TANDEM_HAVE_NCCL. */
#ifdef TANDEM_HAVE_NCCL

extern "C" {
#include "common/log.h"
#include "kernels/comm_impl.h"
}

#include <nccl.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/cuda/cuda_common.cuh"

/* Close the group call opened by ncclGroupStart (always, so NCCL's group depth returns to 0),
 * the first error of the queued calls or of the close logged as one line. */
static tdm_status_t group_end(ncclResult_t rc, const char *what, const kern_comm_t *comm)
{
    ncclResult_t end = ncclGroupEnd();

    if (rc == ncclSuccess) {
        rc = end;
    }
    if (rc != ncclSuccess) {
        tdm_log(TDM_LOG_ERROR, KC_LOG, "nccl %s failed: rank=%d of %d nccl=%s", what, comm->rank,
                comm->group->n_ranks, ncclGetErrorString(rc));
        return TDM_ERR_INTERNAL;
    }
    return TDM_OK;
}

extern "C" tdm_status_t kern_comm_nccl_init(kern_comm_group_t *g, char *err, size_t err_bytes)
{
    ncclComm_t comms[KERN_COMM_MAX_RANKS];
    ncclResult_t rc = ncclCommInitAll(comms, g->n_ranks, g->devices);

    if (rc != ncclSuccess) {
        if (err != NULL && err_bytes > 0) {
            snprintf(err, err_bytes, "nccl group of %d devices: ncclCommInitAll: %s", g->n_ranks,
                     ncclGetErrorString(rc));
        }
        return TDM_ERR_INTERNAL;
    }
    for (int r = 0; r < g->n_ranks; r++) {
        g->ranks[r].nccl = comms[r];
    }
    return TDM_OK;
}

extern "C" void kern_comm_nccl_abort(kern_comm_group_t *g)
{
    for (int r = 0; r < g->n_ranks; r++) {
        if (g->ranks[r].nccl != NULL) {
            ncclCommAbort((ncclComm_t)g->ranks[r].nccl);
            g->ranks[r].nccl = NULL;
        }
    }
}

extern "C" void kern_comm_nccl_free(kern_comm_group_t *g)
{
    for (int r = 0; r < g->n_ranks; r++) {
        if (g->ranks[r].nccl != NULL) {
            ncclCommDestroy((ncclComm_t)g->ranks[r].nccl);
            g->ranks[r].nccl = NULL;
        }
    }
}

extern "C" tdm_status_t kern_comm_nccl_allgatherv(kern_comm_t *comm, kern_ctx_t *ctx, void *buf,
                                                  const size_t *offsets)
{
    ncclComm_t nc = (ncclComm_t)comm->nccl;
    cudaStream_t stream = kc_stream(ctx);
    ncclResult_t rc;
    int n = comm->group->n_ranks;

    if (nc == NULL) {
        return TDM_ERR_PEER_LOST;
    }
    rc = ncclGroupStart();
    for (int r = 0; r < n && rc == ncclSuccess; r++) {
        size_t count = offsets[r + 1] - offsets[r];
        uint8_t *block = (uint8_t *)buf + offsets[r];
        /* every rank skips the same empty blocks: the offsets are the same on all of them */
        if (count > 0) {
            rc = ncclBroadcast(block, block, count, ncclUint8, r, nc, stream);
        }
    }
    return group_end(rc, "all-gather", comm);
}

extern "C" tdm_status_t kern_comm_nccl_alltoallv(kern_comm_t *comm, kern_ctx_t *ctx,
                                                 const void *send, const size_t *send_off,
                                                 void *recv, const size_t *recv_off)
{
    ncclComm_t nc = (ncclComm_t)comm->nccl;
    cudaStream_t stream = kc_stream(ctx);
    ncclResult_t rc;
    int n = comm->group->n_ranks;

    if (nc == NULL) {
        return TDM_ERR_PEER_LOST;
    }
    /* one send and one receive per peer, itself included, in one group: NCCL pairs them */
    rc = ncclGroupStart();
    for (int q = 0; q < n && rc == ncclSuccess; q++) {
        size_t n_send = send_off[q + 1] - send_off[q];
        size_t n_recv = recv_off[q + 1] - recv_off[q];
        if (n_send > 0) {
            rc = ncclSend((const uint8_t *)send + send_off[q], n_send, ncclUint8, q, nc, stream);
        }
        if (rc == ncclSuccess && n_recv > 0) {
            rc = ncclRecv((uint8_t *)recv + recv_off[q], n_recv, ncclUint8, q, nc, stream);
        }
    }
    return group_end(rc, "all-to-all", comm);
}

#endif
