/* comm.h - collectives between the ranks of one expert-parallel group (issue 14 item 6): the
 * ranks of a model split by experts exchange the routed experts' outputs of every MoE layer.
 *
 * A group is R ranks, each driven by its own thread (rank r's thread is the only one that calls
 * collectives on rank r's handle). Two implementations with the same contract:
 *   - "cpu":  R ranks in one process on host memory (threads meet at a barrier and copy each
 *             other's blocks); what the CPU tests and `--devices cpu,cpu` run.
 *   - "nccl": one rank per CUDA device of this node (ncclCommInitAll), the blocks moved by NCCL
 *             on each rank's stream (kern_ctx_t.cuda_stream) over NVLink / PCIe. Built when the
 *             CUDA backend is built and nccl.h + libnccl were found at configure time
 *             (TANDEM_HAVE_NCCL); otherwise its create returns TDM_ERR_UNSUPPORTED saying so.
 *
 * The one collective, an in-place all-gather of variable-size blocks, is what expert-parallel
 * decode needs when attention is replicated: every rank holds every token, computes the routed
 * experts it owns and gets back the outputs of the others, so that each rank can add all of a
 * token's expert outputs in the single-device order (bit-identical to one device on the CPU;
 * engine/forward_layer.c). It is NCCL's ncclBroadcast from each root in one group call
 * (NCCL documentation, "Collective Operations: Broadcast" and "Group Calls"); MPI names it
 * MPI_Allgatherv (MPI 4.0, 6.7).
 *
 * Failure: a rank that fails outside a collective never arrives; kern_comm_group_abort (called by
 * whoever saw the failure, engine/ep.h does) wakes the ranks waiting in one with TDM_ERR_PEER_LOST,
 * and every later collective returns TDM_ERR_PEER_LOST until kern_comm_group_reset. Owns its
 * barrier state (cpu) or its NCCL communicators (nccl); never the caller's buffers.
 */
#ifndef TANDEM_KERNELS_COMM_H
#define TANDEM_KERNELS_COMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"
#include "kernels/backend.h"

/* Most ranks in a group: the GPUs of one GB300 NVL72 NVLink domain. */
#define KERN_COMM_MAX_RANKS 72

/* A group of ranks; opaque. */
typedef struct kern_comm_group kern_comm_group_t;

/* One rank's handle in a group; opaque, owned by the group. */
typedef struct kern_comm kern_comm_t;

/*
 * kern_comm_group_create_cpu - a group of n_ranks ranks in this process, on host memory.
 * Returns TDM_OK with *group_out (kern_comm_group_destroy frees it), TDM_ERR_INVALID_ARG
 * (n_ranks outside 1..KERN_COMM_MAX_RANKS, group_out NULL) or TDM_ERR_NO_MEMORY; *group_out
 * untouched on error.
 */
tdm_status_t kern_comm_group_create_cpu(int n_ranks, kern_comm_group_t **group_out);

/*
 * kern_comm_group_create_nccl - one rank per CUDA device ordinal of devices[0..n_ranks)
 * (distinct), communicators made with ncclCommInitAll. Rank r's collectives run on the stream
 * of the kern_ctx_t it passes (the thread must have made devices[r] current, kernels/device.h).
 * Returns TDM_OK with *group_out, TDM_ERR_INVALID_ARG (n_ranks outside 1..KERN_COMM_MAX_RANKS,
 * NULL, a repeated or negative ordinal), TDM_ERR_UNSUPPORTED (built without NCCL or without the
 * CUDA backend; err says which) or TDM_ERR_INTERNAL (NCCL's own error string in err).
 * err (err_bytes may be 0) gets one line on every error; *group_out untouched on error.
 */
tdm_status_t kern_comm_group_create_nccl(const int *devices, int n_ranks,
                                         kern_comm_group_t **group_out, char *err,
                                         size_t err_bytes);

/* kern_comm_group_size - the group's rank count. */
int kern_comm_group_size(const kern_comm_group_t *group);

/* kern_comm_group_rank - rank r's handle (0 <= r < size), owned by the group; NULL otherwise. */
kern_comm_t *kern_comm_group_rank(kern_comm_group_t *group, int r);

/*
 * kern_comm_group_abort - mark the group failed: ranks waiting in a collective return
 * TDM_ERR_PEER_LOST at once, later collectives too (nccl: ncclCommAbort on every rank's
 * communicator). Thread-safe; idempotent.
 */
void kern_comm_group_abort(kern_comm_group_t *group);

/*
 * kern_comm_group_reset - make an aborted group usable again once no rank is inside a
 * collective (the caller's threads have all returned): clears the mark (nccl: new
 * communicators). TDM_OK, or TDM_ERR_INTERNAL when NCCL could not make them (the group then
 * stays aborted). A group that was not aborted is left as it is.
 */
tdm_status_t kern_comm_group_reset(kern_comm_group_t *group);

/* kern_comm_group_destroy - free the group (no rank may be in a collective); accepts NULL. */
void kern_comm_group_destroy(kern_comm_group_t *group);

/* kern_comm_rank / kern_comm_size - the handle's rank and its group's size. */
int kern_comm_rank(const kern_comm_t *comm);
int kern_comm_size(const kern_comm_t *comm);

/*
 * kern_comm_warmup - make every connection this rank's collectives will use, while every rank is
 * alive: collective, called once by every rank after the group is made (engine/ep.h does). NCCL
 * sets up its peer-to-peer connections lazily, inside the first collective between two ranks,
 * and a rank waiting there for a peer that has failed could not be aborted; after this, a
 * collective only queues work on the stream, and kern_comm_group_abort frees a rank waiting on
 * that stream. cpu groups: nothing to do. Returns as kern_comm_alltoallv.
 */
tdm_status_t kern_comm_warmup(kern_comm_t *comm, kern_ctx_t *ctx);

/*
 * kern_comm_allgatherv - in-place all-gather of byte blocks: rank r's block is
 * buf[offsets[r], offsets[r + 1]) of its own buf, already written; when every rank has returned
 * TDM_OK, each rank's buf holds every block at the same offsets (its own block untouched).
 * Collective: every rank of the group calls it, with the same offsets[0..size] (non-decreasing,
 * offsets[0] may be > 0) and a buf of at least offsets[size] bytes in its backend's memory
 * (host for cpu, its device for nccl). Blocks may be empty.
 *
 * cpu: blocks until every rank has arrived and copied (ctx's threads are not used).
 * nccl: queued on ctx's stream; the bytes are there for kernels queued after it on that stream.
 * Returns TDM_OK, TDM_ERR_INVALID_ARG (NULL comm or offsets, NULL buf with a non-empty range,
 * decreasing offsets; this rank does not enter the collective, so the caller must abort the
 * group), TDM_ERR_PEER_LOST (the group was or became aborted; buf's other blocks unspecified) or
 * TDM_ERR_INTERNAL (an NCCL error, logged).
 */
tdm_status_t kern_comm_allgatherv(kern_comm_t *comm, kern_ctx_t *ctx, void *buf,
                                  const size_t *offsets);

/*
 * kern_comm_alltoallv - personalised exchange of byte blocks: this rank sends
 * send[send_off[q], send_off[q + 1]) to rank q and receives rank q's block for it into
 * recv[recv_off[q], recv_off[q + 1]), for every q (itself included). Collective; what q sends to
 * r must have the size r expects from q (callers exchange the sizes first, with
 * kern_comm_allgatherv of a header). send and recv must not overlap; buffers in the backend's
 * memory as for kern_comm_allgatherv. The tokens-to-experts dispatch and the outputs' return of
 * data-parallel expert parallelism (engine/forward_layer.c); MPI_Alltoallv (MPI 4.0, 6.8), in
 * NCCL ncclSend/ncclRecv pairs inside one group call (NCCL documentation, "Point-to-point
 * communication: all-to-all").
 * Returns as kern_comm_allgatherv (TDM_ERR_INVALID_ARG for NULL offsets or decreasing ones).
 */
tdm_status_t kern_comm_alltoallv(kern_comm_t *comm, kern_ctx_t *ctx, const void *send,
                                 const size_t *send_off, void *recv, const size_t *recv_off);

#ifdef __cplusplus
}
#endif

#endif
