/* comm.c - expert-parallel groups (kernels/comm.h): the group itself and the cpu collective; the
 * nccl collective is kernels/cuda/comm_nccl.cu. */
#include "kernels/comm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/errbuf.h"
#include "common/log.h"
#include "kernels/comm_impl.h"

/* A zeroed group of n ranks of `kind` with its lock made; NULL when out of memory. */
static kern_comm_group_t *group_new(kern_comm_kind_t kind, int n_ranks)
{
    kern_comm_group_t *g = calloc(1, sizeof(*g));

    if (g == NULL) {
        return NULL;
    }
    if (pthread_mutex_init(&g->mu, NULL) != 0) {
        goto fail_free;
    }
    if (pthread_cond_init(&g->cv, NULL) != 0) {
        goto fail_mutex;
    }
    g->kind = kind;
    g->n_ranks = n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        g->ranks[r].group = g;
        g->ranks[r].rank = r;
        if (pthread_mutex_init(&g->ranks[r].nccl_mu, NULL) != 0) {
            while (r-- > 0) {
                pthread_mutex_destroy(&g->ranks[r].nccl_mu);
            }
            goto fail_cond;
        }
    }
    return g;

fail_cond:
    pthread_cond_destroy(&g->cv);
fail_mutex:
    pthread_mutex_destroy(&g->mu);
fail_free:
    free(g);
    return NULL;
}

static void group_free(kern_comm_group_t *g)
{
    for (int r = 0; r < g->n_ranks; r++) {
        pthread_mutex_destroy(&g->ranks[r].nccl_mu);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

tdm_status_t kern_comm_group_create_cpu(int n_ranks, kern_comm_group_t **group_out)
{
    kern_comm_group_t *g;

    if (n_ranks < 1 || n_ranks > KERN_COMM_MAX_RANKS || group_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    g = group_new(KERN_COMM_CPU, n_ranks);
    if (g == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    *group_out = g;
    return TDM_OK;
}

tdm_status_t kern_comm_group_create_nccl(const int *devices, int n_ranks,
                                         kern_comm_group_t **group_out, char *err, size_t err_bytes)
{
    if (devices == NULL || group_out == NULL || n_ranks < 1 || n_ranks > KERN_COMM_MAX_RANKS) {
        tdm_errbuf_set(err, err_bytes, "nccl group: NULL argument or rank count outside 1..%d",
                       KERN_COMM_MAX_RANKS);
        return TDM_ERR_INVALID_ARG;
    }
    for (int r = 0; r < n_ranks; r++) {
        for (int q = 0; q < r; q++) {
            if (devices[q] == devices[r]) {
                tdm_errbuf_set(err, err_bytes, "nccl group: device %d named twice", devices[r]);
                return TDM_ERR_INVALID_ARG;
            }
        }
        if (devices[r] < 0) {
            tdm_errbuf_set(err, err_bytes, "nccl group: negative device ordinal");
            return TDM_ERR_INVALID_ARG;
        }
    }
#ifdef TANDEM_HAVE_NCCL
    kern_comm_group_t *g = group_new(KERN_COMM_NCCL, n_ranks);
    tdm_status_t st;

    if (g == NULL) {
        tdm_errbuf_set(err, err_bytes, "nccl group: out of memory");
        return TDM_ERR_NO_MEMORY;
    }
    memcpy(g->devices, devices, (size_t)n_ranks * sizeof(int));
    st = kern_comm_nccl_init(g, err, err_bytes);
    if (st != TDM_OK) {
        group_free(g);
        return st;
    }
    *group_out = g;
    return TDM_OK;
#else
    tdm_errbuf_set(
        err, err_bytes, "%s",
#ifdef TANDEM_HAVE_CUDA
        "expert parallel over CUDA devices needs NCCL: this build found no nccl.h/libnccl "
        "at configure time"
#else
        "expert parallel over CUDA devices needs the CUDA backend with NCCL: this build has "
        "no CUDA backend (nvcc was absent at configure time)"
#endif
    );
    return TDM_ERR_UNSUPPORTED;
#endif
}

int kern_comm_group_size(const kern_comm_group_t *group)
{
    return group != NULL ? group->n_ranks : 0;
}

kern_comm_t *kern_comm_group_rank(kern_comm_group_t *group, int r)
{
    if (group == NULL || r < 0 || r >= group->n_ranks) {
        return NULL;
    }
    return &group->ranks[r];
}

void kern_comm_group_abort(kern_comm_group_t *group)
{
    int first;

    if (group == NULL) {
        return;
    }
    pthread_mutex_lock(&group->mu);
    first = !group->aborted;
    __atomic_store_n(&group->aborted, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&group->cv);
    pthread_mutex_unlock(&group->mu);
#ifdef TANDEM_HAVE_NCCL
    if (first && group->kind == KERN_COMM_NCCL) {
        kern_comm_nccl_abort(group);
    }
#else
    (void)first;
#endif
}

tdm_status_t kern_comm_group_reset(kern_comm_group_t *group)
{
    tdm_status_t st = TDM_OK;

    if (group == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&group->mu);
    if (group->aborted) {
#ifdef TANDEM_HAVE_NCCL
        if (group->kind == KERN_COMM_NCCL) {
            char err[256];
            kern_comm_nccl_free(group);
            st = kern_comm_nccl_init(group, err, sizeof(err));
            if (st != TDM_OK) {
                tdm_log(TDM_LOG_ERROR, "kernels", "nccl group reset: %s", err);
            }
        }
#endif
        if (st == TDM_OK) {
            group->aborted = 0;
            group->arrived = 0;
        }
    }
    pthread_mutex_unlock(&group->mu);
    return st;
}

void kern_comm_group_destroy(kern_comm_group_t *group)
{
    if (group == NULL) {
        return;
    }
#ifdef TANDEM_HAVE_NCCL
    if (group->kind == KERN_COMM_NCCL) {
        kern_comm_nccl_free(group);
    }
#endif
    group_free(group);
}

int kern_comm_rank(const kern_comm_t *comm)
{
    return comm != NULL ? comm->rank : -1;
}

int kern_comm_size(const kern_comm_t *comm)
{
    return comm != NULL ? comm->group->n_ranks : 0;
}

/* Spins of a barrier waiter before it sleeps: the last rank usually arrives within
 * microseconds (ranks run the same layer), and a condition-variable wake-up costs tens of them. */
#define BARRIER_SPINS 20000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The cpu barrier: TDM_OK once every rank has arrived in this round, TDM_ERR_PEER_LOST when the
 * group is (or becomes, while waiting) aborted before the round completes. generation and
 * aborted change under mu with release stores, so a waiter may first spin on them unlocked
 * (acquire loads), then sleep on cv. */
static tdm_status_t cpu_barrier(kern_comm_group_t *g)
{
    tdm_status_t st = TDM_OK;
    unsigned long gen;

    pthread_mutex_lock(&g->mu);
    if (g->aborted) {
        pthread_mutex_unlock(&g->mu);
        return TDM_ERR_PEER_LOST;
    }
    gen = g->generation;
    if (++g->arrived == g->n_ranks) {
        g->arrived = 0;
        __atomic_store_n(&g->generation, gen + 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&g->cv);
    } else {
        pthread_mutex_unlock(&g->mu);
        for (int i = 0; i < BARRIER_SPINS; i++) {
            if (__atomic_load_n(&g->generation, __ATOMIC_ACQUIRE) != gen ||
                __atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE)) {
                break;
            }
            cpu_relax();
        }
        pthread_mutex_lock(&g->mu);
        while (gen == g->generation && !g->aborted) {
            pthread_cond_wait(&g->cv, &g->mu);
        }
        if (gen == g->generation) {
            st = TDM_ERR_PEER_LOST;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* Rank me's part of the cpu all-gather: publish buf, copy every other block out of its owner's
 * buf, and wait until all have copied (so no owner rewrites its block under a reader). */
static tdm_status_t cpu_allgatherv(kern_comm_t *comm, void *buf, const size_t *offsets)
{
    kern_comm_group_t *g = comm->group;
    tdm_status_t st;

    pthread_mutex_lock(&g->mu);
    g->bufs[comm->rank] = buf;
    pthread_mutex_unlock(&g->mu);
    st = cpu_barrier(g);
    if (st != TDM_OK) {
        return st;
    }
    for (int r = 0; r < g->n_ranks; r++) {
        size_t n = offsets[r + 1] - offsets[r];
        if (r != comm->rank && n > 0) {
            memcpy((uint8_t *)buf + offsets[r], (const uint8_t *)g->bufs[r] + offsets[r], n);
        }
    }
    return cpu_barrier(g);
}

/* Rank me's part of the cpu all-to-all: publish send and its offsets, copy every rank's block
 * for me out of its send buffer, and wait until all have copied. */
static tdm_status_t cpu_alltoallv(kern_comm_t *comm, const void *send, const size_t *send_off,
                                  void *recv, const size_t *recv_off)
{
    kern_comm_group_t *g = comm->group;
    int me = comm->rank;
    tdm_status_t st;

    pthread_mutex_lock(&g->mu);
    g->bufs[me] = (void *)send;
    g->offs[me] = send_off;
    pthread_mutex_unlock(&g->mu);
    st = cpu_barrier(g);
    if (st != TDM_OK) {
        return st;
    }
    for (int q = 0; q < g->n_ranks && st == TDM_OK; q++) {
        size_t n = recv_off[q + 1] - recv_off[q];
        size_t sent = g->offs[q][me + 1] - g->offs[q][me];
        if (sent != n) {
            tdm_log(TDM_LOG_ERROR, "kernels",
                    "all-to-all: rank %d expects %zu bytes from rank %d, which sends %zu", me, n, q,
                    sent);
            st = TDM_ERR_INTERNAL;
        } else if (n > 0) {
            memcpy((uint8_t *)recv + recv_off[q], (const uint8_t *)g->bufs[q] + g->offs[q][me], n);
        }
    }
    if (st != TDM_OK) {
        kern_comm_group_abort(g);
        return st;
    }
    return cpu_barrier(g);
}

#ifdef TANDEM_HAVE_NCCL
/* 1 when the group is aborted (nccl collectives check before they queue anything). */
static int group_aborted(kern_comm_group_t *g)
{
    return __atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE) != 0;
}
#endif

/* 1 when offsets[0..n] do not decrease. */
static int offsets_ok(const size_t *offsets, int n)
{
    for (int r = 0; r < n; r++) {
        if (offsets[r + 1] < offsets[r]) {
            return 0;
        }
    }
    return 1;
}

tdm_status_t kern_comm_alltoallv(kern_comm_t *comm, kern_ctx_t *ctx, const void *send,
                                 const size_t *send_off, void *recv, const size_t *recv_off)
{
    if (comm == NULL || send_off == NULL || recv_off == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    int n = comm->group->n_ranks;
    if (!offsets_ok(send_off, n) || !offsets_ok(recv_off, n) ||
        (send == NULL && send_off[n] > send_off[0]) ||
        (recv == NULL && recv_off[n] > recv_off[0])) {
        return TDM_ERR_INVALID_ARG;
    }
#ifdef TANDEM_HAVE_NCCL
    if (comm->group->kind == KERN_COMM_NCCL) {
        return group_aborted(comm->group)
                   ? TDM_ERR_PEER_LOST
                   : kern_comm_nccl_alltoallv(comm, ctx, send, send_off, recv, recv_off);
    }
#endif
    (void)ctx;
    if (n == 1) {
        size_t bytes = recv_off[1] - recv_off[0];
        if (bytes != send_off[1] - send_off[0]) {
            return TDM_ERR_INVALID_ARG;
        }
        if (bytes > 0) {
            memcpy((uint8_t *)recv + recv_off[0], (const uint8_t *)send + send_off[0], bytes);
        }
        return TDM_OK;
    }
    return cpu_alltoallv(comm, send, send_off, recv, recv_off);
}

tdm_status_t kern_comm_warmup(kern_comm_t *comm, kern_ctx_t *ctx)
{
    if (comm == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
#ifdef TANDEM_HAVE_NCCL
    if (comm->group->kind == KERN_COMM_NCCL && comm->group->n_ranks > 1) {
        return group_aborted(comm->group) ? TDM_ERR_PEER_LOST : kern_comm_nccl_warmup(comm, ctx);
    }
#endif
    (void)ctx;
    return TDM_OK;
}

tdm_status_t kern_comm_allgatherv(kern_comm_t *comm, kern_ctx_t *ctx, void *buf,
                                  const size_t *offsets)
{
    if (comm == NULL || offsets == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    int n = comm->group->n_ranks;
    if (!offsets_ok(offsets, n)) {
        return TDM_ERR_INVALID_ARG;
    }
    if (buf == NULL && offsets[n] > offsets[0]) {
        return TDM_ERR_INVALID_ARG;
    }
    if (n == 1) {
        return TDM_OK;
    }
#ifdef TANDEM_HAVE_NCCL
    if (comm->group->kind == KERN_COMM_NCCL) {
        return group_aborted(comm->group) ? TDM_ERR_PEER_LOST
                                          : kern_comm_nccl_allgatherv(comm, ctx, buf, offsets);
    }
#endif
    (void)ctx;
    return cpu_allgatherv(comm, buf, offsets);
}
