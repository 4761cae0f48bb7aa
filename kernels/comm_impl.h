/* comm_impl.h - the layout of a kern_comm_group_t, shared by kernels/comm.c (the group, the cpu
 * collectives) and kernels/cuda/comm_nccl.cu (the nccl ones). Internal to kernels/: nothing
 * outside includes it (kernels/comm.h is the interface). */
#ifndef TANDEM_KERNELS_COMM_IMPL_H
#define TANDEM_KERNELS_COMM_IMPL_H

#include <pthread.h>

#include "kernels/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KERN_COMM_CPU = 0,
    KERN_COMM_NCCL = 1,
} kern_comm_kind_t;

struct kern_comm {
    kern_comm_group_t *group;
    int rank;
    /* nccl groups: this rank's ncclComm_t, NULL once aborted. NCCL forbids concurrent calls on
     * one communicator, and the abort comes from whichever rank failed: every NCCL call on it,
     * the abort included, holds nccl_mu (the owner never blocks while holding it once the
     * connections exist: kern_comm_warmup). */
    void *nccl;
    pthread_mutex_t nccl_mu;
};

struct kern_comm_group {
    kern_comm_kind_t kind;
    int n_ranks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int aborted;                     /* under mu */
    int arrived;                     /* ranks waiting at the cpu barrier, under mu */
    unsigned long generation;        /* cpu barrier rounds completed, under mu */
    void *bufs[KERN_COMM_MAX_RANKS]; /* cpu: each rank's buf of the current all-gather, or its
                                        send buffer of the current all-to-all */
    const size_t *offs[KERN_COMM_MAX_RANKS]; /* cpu: each rank's send offsets (all-to-all) */
    int devices[KERN_COMM_MAX_RANKS];        /* nccl: CUDA ordinal of each rank */
    kern_comm_t ranks[KERN_COMM_MAX_RANKS];
};

/* The nccl half (kernels/cuda/comm_nccl.cu, built with TANDEM_HAVE_NCCL): make, abort and free
 * the communicators of g->ranks[*].nccl for g->devices, and one rank's all-gather. The make
 * returns TDM_OK or TDM_ERR_INTERNAL with NCCL's reason in err. */
tdm_status_t kern_comm_nccl_init(kern_comm_group_t *g, char *err, size_t err_bytes);
void kern_comm_nccl_abort(kern_comm_group_t *g);
void kern_comm_nccl_free(kern_comm_group_t *g);
tdm_status_t kern_comm_nccl_allgatherv(kern_comm_t *comm, kern_ctx_t *ctx, void *buf,
                                       const size_t *offsets);
tdm_status_t kern_comm_nccl_alltoallv(kern_comm_t *comm, kern_ctx_t *ctx, const void *send,
                                      const size_t *send_off, void *recv, const size_t *recv_off);
tdm_status_t kern_comm_nccl_warmup(kern_comm_t *comm, kern_ctx_t *ctx);

#ifdef __cplusplus
}
#endif

#endif
