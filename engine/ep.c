/* ep.c - expert-parallel groups (engine/ep.h): rank threads that load their shard and then run
 * what engine_ep_run hands them.
 *
 * Mailbox (one per group, under mu): the caller writes fn/user and bumps `job`, then waits until
 * `done` reaches n_ranks; each rank thread waits for `job` to pass the last one it ran, runs it
 * unlocked, stores its status and bumps `done`. `quit` (with a job bump) ends the threads. At
 * open the same channel carries the load: each thread stores its load status and bumps `done`.
 */
#include "engine/ep.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errbuf.h"
#include "common/log.h"
#include "kernels/comm.h"

typedef struct {
    struct engine_ep *ep;
    engine_ep_rank_t view;
    pthread_t thread;
    int started;
    tdm_status_t status; /* of the load, then of the last run */
    char err[256];       /* the load's message */
} ep_rank_t;

struct engine_ep {
    int n_ranks;
    char dir[4096];
    engine_ep_params_t params;
    kern_comm_group_t *group;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long job; /* runs handed out (0 = the load) */
    int done;          /* ranks finished with the current job */
    int quit;
    engine_ep_fn *fn;
    void *user;
    tdm_status_t first_failure; /* of the current run: the first rank to fail, before it aborts */
    ep_rank_t ranks[ENGINE_EP_MAX_RANKS];
};

/* Rank r's load on its own thread: device current, shard, pool, context. */
static tdm_status_t rank_load(ep_rank_t *rk)
{
    struct engine_ep *ep = rk->ep;
    int r = rk->view.rank;
    engine_model_params_t mp = ep->params.model;
    engine_fwd_params_t fp = ep->params.fwd;
    const engine_config_t *cfg;
    tdm_status_t st = kern_device_ops(&ep->params.devices[r], &mp.ops, rk->err, sizeof(rk->err));

    if (st != TDM_OK) {
        return st;
    }
    mp.ep_rank = r;
    mp.ep_size = ep->n_ranks;
    st = engine_model_load(ep->dir, &mp, &rk->view.model, rk->err, sizeof(rk->err));
    if (st != TDM_OK) {
        return st;
    }
    cfg = engine_model_config(rk->view.model);
    st = engine_kv_pool_create_ops(cfg, engine_model_fingerprint(rk->view.model),
                                   ep->params.n_pages, mp.ops, &rk->view.pool);
    if (st != TDM_OK) {
        snprintf(rk->err, sizeof(rk->err), "KV pool of %u pages: %s", ep->params.n_pages,
                 tdm_status_message(st));
        return st;
    }
    fp.comm = kern_comm_group_rank(ep->group, r);
    st = engine_fwd_create(rk->view.model, rk->view.pool, &fp, &rk->view.fwd);
    if (st != TDM_OK) {
        snprintf(rk->err, sizeof(rk->err), "forward context: %s", tdm_status_message(st));
    }
    return st;
}

static void *rank_main(void *arg)
{
    ep_rank_t *rk = arg;
    struct engine_ep *ep = rk->ep;
    unsigned long seen = 0;

    rk->status = rank_load(rk);
    pthread_mutex_lock(&ep->mu);
    ep->done++;
    pthread_cond_broadcast(&ep->cv);
    for (;;) {
        while (ep->job == seen && !ep->quit) {
            pthread_cond_wait(&ep->cv, &ep->mu);
        }
        if (ep->quit) {
            break;
        }
        seen = ep->job;
        engine_ep_fn *fn = ep->fn;
        void *user = ep->user;
        pthread_mutex_unlock(&ep->mu);
        tdm_status_t st = fn(&rk->view, user);
        if (st == TDM_OK && ep->params.fwd.ep_data_parallel) {
            /* its own work done: serve the others' tokens until every rank is done */
            st = engine_fwd_ep_serve(rk->view.fwd);
        }
        if (st != TDM_OK) {
            /* recorded before the abort: the ranks that fail because of it come later */
            pthread_mutex_lock(&ep->mu);
            if (ep->first_failure == TDM_OK) {
                ep->first_failure = st;
            }
            pthread_mutex_unlock(&ep->mu);
            kern_comm_group_abort(ep->group); /* the others must not wait for this rank */
        }
        pthread_mutex_lock(&ep->mu);
        rk->status = st;
        ep->done++;
        pthread_cond_broadcast(&ep->cv);
    }
    pthread_mutex_unlock(&ep->mu);
    /* the rank's CUDA memory is freed on the thread whose device it is */
    engine_fwd_destroy(rk->view.fwd);
    engine_kv_pool_destroy(rk->view.pool);
    engine_model_destroy(rk->view.model);
    return NULL;
}

/* Wait (mu held) until every started rank has finished the current job. */
static void wait_done(struct engine_ep *ep, int n_started)
{
    while (ep->done < n_started) {
        pthread_cond_wait(&ep->cv, &ep->mu);
    }
}

/* The group of the devices' kind: cpu, or nccl over their ordinals. */
static tdm_status_t open_group(struct engine_ep *ep, char *err, size_t err_bytes)
{
    const engine_ep_params_t *p = &ep->params;
    int cuda = p->devices[0].backend == KERN_BACKEND_CUDA;
    int ordinals[ENGINE_EP_MAX_RANKS];

    for (int r = 0; r < p->n_ranks; r++) {
        if ((p->devices[r].backend == KERN_BACKEND_CUDA) != cuda) {
            tdm_errbuf_set(err, err_bytes,
                           "expert parallel: devices of mixed kinds (rank %d differs)", r);
            return TDM_ERR_INVALID_ARG;
        }
        ordinals[r] = p->devices[r].ordinal;
    }
    if (cuda) {
        /* every ordinal present before NCCL is asked (its own error would not name it) */
        const char *reason = NULL;
        int count = kern_cuda_device_count(&reason);
        if (count == 0) {
            tdm_errbuf_set(err, err_bytes, "expert parallel: no usable CUDA device (%s; %d asked)",
                           reason != NULL ? reason : "none", p->n_ranks);
            return TDM_ERR_UNSUPPORTED;
        }
        for (int r = 0; r < p->n_ranks; r++) {
            if (ordinals[r] >= count) {
                tdm_errbuf_set(err, err_bytes,
                               "expert parallel: device cuda:%d not found (the driver reports %d "
                               "CUDA device(s))",
                               ordinals[r], count);
                return TDM_ERR_NOT_FOUND;
            }
        }
    }
    if (!cuda) {
        tdm_status_t st = kern_comm_group_create_cpu(p->n_ranks, &ep->group);
        if (st != TDM_OK) {
            tdm_errbuf_set(err, err_bytes, "expert parallel: %s (%d cpu ranks)",
                           tdm_status_message(st), p->n_ranks);
        }
        return st;
    }
    return kern_comm_group_create_nccl(ordinals, p->n_ranks, &ep->group, err, err_bytes);
}

static tdm_status_t warm_rank(const engine_ep_rank_t *rank, void *user)
{
    (void)user;
    return engine_fwd_ep_warmup(rank->fwd);
}

void engine_ep_close(engine_ep_t *ep)
{
    if (ep == NULL) {
        return;
    }
    pthread_mutex_lock(&ep->mu);
    ep->quit = 1;
    pthread_cond_broadcast(&ep->cv);
    pthread_mutex_unlock(&ep->mu);
    for (int r = 0; r < ep->n_ranks; r++) {
        if (ep->ranks[r].started) {
            pthread_join(ep->ranks[r].thread, NULL);
        }
    }
    kern_comm_group_destroy(ep->group);
    pthread_cond_destroy(&ep->cv);
    pthread_mutex_destroy(&ep->mu);
    free(ep);
}

tdm_status_t engine_ep_open(const char *dir, const engine_ep_params_t *params, engine_ep_t **ep_out,
                            char *err, size_t err_bytes)
{
    struct engine_ep *ep;
    tdm_status_t st = TDM_OK;
    int n_started = 0;

    if (dir == NULL || params == NULL || ep_out == NULL || params->n_ranks < 1 ||
        params->n_ranks > ENGINE_EP_MAX_RANKS || strlen(dir) >= sizeof(ep->dir)) {
        tdm_errbuf_set(err, err_bytes, "expert parallel: invalid argument (ranks 1..%d)",
                       ENGINE_EP_MAX_RANKS);
        return TDM_ERR_INVALID_ARG;
    }
    ep = calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    ep->n_ranks = params->n_ranks;
    ep->params = *params;
    memcpy(ep->dir, dir, strlen(dir) + 1);
    if (pthread_mutex_init(&ep->mu, NULL) != 0) {
        free(ep);
        return TDM_ERR_NO_MEMORY;
    }
    if (pthread_cond_init(&ep->cv, NULL) != 0) {
        pthread_mutex_destroy(&ep->mu);
        free(ep);
        return TDM_ERR_NO_MEMORY;
    }
    st = open_group(ep, err, err_bytes);
    if (st != TDM_OK) {
        engine_ep_close(ep);
        return st;
    }
    for (int r = 0; r < ep->n_ranks; r++) {
        ep_rank_t *rk = &ep->ranks[r];
        rk->ep = ep;
        rk->view.rank = r;
        rk->view.n_ranks = ep->n_ranks;
        if (pthread_create(&rk->thread, NULL, rank_main, rk) != 0) {
            st = TDM_ERR_NO_MEMORY;
            tdm_errbuf_set(err, err_bytes, "expert parallel: no thread for rank %d", r);
            break;
        }
        rk->started = 1;
        n_started++;
    }
    pthread_mutex_lock(&ep->mu);
    wait_done(ep, n_started);
    pthread_mutex_unlock(&ep->mu);
    for (int r = 0; r < n_started && st == TDM_OK; r++) {
        if (ep->ranks[r].status != TDM_OK) {
            st = ep->ranks[r].status;
            tdm_errbuf_set(err, err_bytes, "rank %d: %s", r, ep->ranks[r].err);
        }
    }
    if (st == TDM_OK) {
        /* every collective's connections made now, while every rank is alive */
        st = engine_ep_run(ep, warm_rank, NULL);
        if (st != TDM_OK) {
            tdm_errbuf_set(err, err_bytes,
                           "expert parallel: the ranks' first collectives failed: %s",
                           tdm_status_message(st));
        }
    }
    if (st != TDM_OK) {
        engine_ep_close(ep);
        return st;
    }
    tdm_log(TDM_LOG_INFO, "engine", "expert parallel: %d ranks on %s devices, %u KV pages each",
            ep->n_ranks, ep->params.devices[0].backend == KERN_BACKEND_CUDA ? "cuda" : "cpu",
            ep->params.n_pages);
    *ep_out = ep;
    return TDM_OK;
}

tdm_status_t engine_ep_params_from_devices(const char *devices, int n_threads, uint32_t n_pages,
                                           engine_ep_params_t *out, char *err, size_t err_bytes)
{
    if (out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(out, 0, sizeof(*out));
    tdm_status_t st = kern_device_parse_list(devices, out->devices, ENGINE_EP_MAX_RANKS,
                                             &out->n_ranks, err, err_bytes);
    if (st != TDM_OK) {
        return st;
    }
    engine_model_params_default(&out->model);
    out->model.n_threads = n_threads;
    engine_fwd_params_default(NULL, &out->fwd);
    out->fwd.n_threads = n_threads;
    out->fwd.ep_data_parallel = 1;
    out->n_pages = n_pages;
    return TDM_OK;
}

int engine_ep_size(const engine_ep_t *ep)
{
    return ep != NULL ? ep->n_ranks : 0;
}

const engine_ep_rank_t *engine_ep_rank(const engine_ep_t *ep, int r)
{
    if (ep == NULL || r < 0 || r >= ep->n_ranks) {
        return NULL;
    }
    return &ep->ranks[r].view;
}

tdm_status_t engine_ep_run(engine_ep_t *ep, engine_ep_fn *fn, void *user)
{
    tdm_status_t st = TDM_OK;

    if (ep == NULL || fn == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&ep->mu);
    ep->fn = fn;
    ep->user = user;
    ep->first_failure = TDM_OK;
    ep->done = 0;
    ep->job++;
    pthread_cond_broadcast(&ep->cv);
    wait_done(ep, ep->n_ranks);
    pthread_mutex_unlock(&ep->mu);
    /* the cause: the first rank to fail (a rank that saw the abort fails after it) */
    st = ep->first_failure;
    if (st != TDM_OK) {
        tdm_status_t rs = kern_comm_group_reset(ep->group);
        if (rs != TDM_OK) {
            tdm_log(TDM_LOG_ERROR, "engine", "expert parallel: the group could not be reset");
        }
    }
    return st;
}
