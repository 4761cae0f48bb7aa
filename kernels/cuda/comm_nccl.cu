/* comm_nccl.cu - the nccl half of kernels/comm.h: one communicator per CUDA device of the group
 * (ncclCommInitAll), the all-gather of variable blocks as one broadcast per root inside one
 * NCCL group call (NCCL documentation: ncclBroadcast, in place when sendbuff == recvbuff;
 * ncclGroupStart/ncclGroupEnd). Compiled to nothing without TANDEM_HAVE_NCCL. */
#ifdef TANDEM_HAVE_NCCL

extern "C" {
#include "common/errbuf.h"
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
        tdm_errbuf_set(err, err_bytes, "nccl group of %d devices: ncclCommInitAll: %s", g->n_ranks,
                       ncclGetErrorString(rc));
        return TDM_ERR_INTERNAL;
    }
    for (int r = 0; r < g->n_ranks; r++) {
        g->ranks[r].nccl = comms[r];
    }
    return TDM_OK;
}

/* Every rank's communicator released (ncclCommAbort when abort, else ncclCommDestroy), each
 * under its owner's lock: never while its owner is inside an NCCL call. */
static void release_comms(kern_comm_group_t *g, int abort)
{
    for (int r = 0; r < g->n_ranks; r++) {
        kern_comm_t *c = &g->ranks[r];
        pthread_mutex_lock(&c->nccl_mu);
        if (c->nccl != NULL) {
            if (abort) {
                ncclCommAbort((ncclComm_t)c->nccl);
            } else {
                ncclCommDestroy((ncclComm_t)c->nccl);
            }
            c->nccl = NULL;
        }
        pthread_mutex_unlock(&c->nccl_mu);
    }
}

extern "C" void kern_comm_nccl_abort(kern_comm_group_t *g)
{
    release_comms(g, 1);
}

extern "C" void kern_comm_nccl_free(kern_comm_group_t *g)
{
    release_comms(g, 0);
}

/* The all-gather's NCCL calls (comm->nccl_mu held, communicator live). */
static tdm_status_t allgatherv_locked(kern_comm_t *comm, ncclComm_t nc, cudaStream_t stream,
                                      void *buf, const size_t *offsets)
{
    ncclResult_t rc = ncclGroupStart();

    for (int r = 0; r < comm->group->n_ranks && rc == ncclSuccess; r++) {
        size_t count = offsets[r + 1] - offsets[r];
        uint8_t *block = (uint8_t *)buf + offsets[r];
        /* every rank skips the same empty blocks: the offsets are the same on all of them */
        if (count > 0) {
            rc = ncclBroadcast(block, block, count, ncclUint8, r, nc, stream);
        }
    }
    return group_end(rc, "all-gather", comm);
}

/* The all-to-all's NCCL calls (comm->nccl_mu held, communicator live): one send and one receive
 * per peer, itself included, in one group (NCCL pairs them). */
static tdm_status_t alltoallv_locked(kern_comm_t *comm, ncclComm_t nc, cudaStream_t stream,
                                     const void *send, const size_t *send_off, void *recv,
                                     const size_t *recv_off)
{
    ncclResult_t rc = ncclGroupStart();

    for (int q = 0; q < comm->group->n_ranks && rc == ncclSuccess; q++) {
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

extern "C" tdm_status_t kern_comm_nccl_allgatherv(kern_comm_t *comm, kern_ctx_t *ctx, void *buf,
                                                  const size_t *offsets)
{
    tdm_status_t st = TDM_ERR_PEER_LOST;

    pthread_mutex_lock(&comm->nccl_mu);
    if (comm->nccl != NULL) {
        st = allgatherv_locked(comm, (ncclComm_t)comm->nccl, kc_stream(ctx), buf, offsets);
    }
    pthread_mutex_unlock(&comm->nccl_mu);
    return st;
}

extern "C" tdm_status_t kern_comm_nccl_alltoallv(kern_comm_t *comm, kern_ctx_t *ctx,
                                                 const void *send, const size_t *send_off,
                                                 void *recv, const size_t *recv_off)
{
    tdm_status_t st = TDM_ERR_PEER_LOST;

    pthread_mutex_lock(&comm->nccl_mu);
    if (comm->nccl != NULL) {
        st = alltoallv_locked(comm, (ncclComm_t)comm->nccl, kc_stream(ctx), send, send_off, recv,
                              recv_off);
    }
    pthread_mutex_unlock(&comm->nccl_mu);
    return st;
}

extern "C" tdm_status_t kern_comm_nccl_warmup(kern_comm_t *comm, kern_ctx_t *ctx)
{
    /* one 8-byte block per rank in an all-gather and per pair in an all-to-all: every
     * connection either collective uses, made now while every rank is here */
    int n = comm->group->n_ranks;
    size_t offs[KERN_COMM_MAX_RANKS + 1];
    uint8_t *dev = NULL;
    cudaStream_t stream = kc_stream(ctx);
    tdm_status_t st = kc_call_status("nccl warm-up", "cudaMalloc",
                                     cudaMalloc((void **)&dev, (size_t)n * 16));

    for (int r = 0; r <= n; r++) {
        offs[r] = (size_t)r * 8;
    }
    if (st == TDM_OK) {
        st = kern_comm_nccl_allgatherv(comm, ctx, dev, offs);
    }
    if (st == TDM_OK) {
        st = kern_comm_nccl_alltoallv(comm, ctx, dev, offs, dev + n * 8, offs);
    }
    if (st == TDM_OK) {
        st = kc_call_status("nccl warm-up", "cudaStreamSynchronize",
                            cudaStreamSynchronize(stream));
    }
    cudaFree(dev);
    return st;
}

#endif
