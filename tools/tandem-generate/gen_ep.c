/* gen_ep.c - tandem-generate on an expert-parallel group (gen_ep.h). */
#include "gen_ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ep.h"
#include "engine/forward.h"
#include "kernels/device.h"

struct gen_ep {
    engine_ep_t *group;
    int n_ranks;
    int64_t V;
    engine_seq_t *seqs[ENGINE_EP_MAX_RANKS];
    float *scratch; /* [n_ranks - 1, rows, V] logits of ranks > 0 */
    int64_t scratch_rows;
};

/* What one run asks of each rank. */
typedef struct {
    gen_ep_t *ep;
    int decode; /* 0: prefill */
    const int32_t *ids;
    int64_t n_ids;
    uint32_t flags;
    float *logits0;
    int64_t tail;
} gen_ep_job_t;

static float *rank_logits(gen_ep_job_t *job, int rank)
{
    gen_ep_t *ep = job->ep;
    return rank == 0 ? job->logits0
                     : ep->scratch + (size_t)(rank - 1) * (size_t)(ep->scratch_rows * ep->V);
}

static tdm_status_t job_rank(const engine_ep_rank_t *rank, void *user)
{
    gen_ep_job_t *job = user;
    engine_seq_t **seq = &job->ep->seqs[rank->rank];
    int64_t tail = 0;
    tdm_status_t st;

    if (*seq == NULL) {
        st = engine_seq_create(rank->model, rank->pool, seq);
        if (st != TDM_OK) {
            return st;
        }
    }
    if (job->decode) {
        return engine_fwd_decode(rank->fwd, seq, job->ids, 1, rank_logits(job, rank->rank));
    }
    st = engine_fwd_prefill(rank->fwd, *seq, job->ids, job->n_ids, job->flags,
                            rank_logits(job, rank->rank), &tail);
    if (rank->rank == 0) {
        job->tail = tail;
    }
    return st;
}

/* Scratch for `rows` logit rows on every rank but 0. */
static tdm_status_t ensure_scratch(gen_ep_t *ep, int64_t rows)
{
    float *p;

    if (rows <= ep->scratch_rows || ep->n_ranks == 1) {
        return TDM_OK;
    }
    p = realloc(ep->scratch, (size_t)(ep->n_ranks - 1) * (size_t)(rows * ep->V) * sizeof(float));
    if (p == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    ep->scratch = p;
    ep->scratch_rows = rows;
    return TDM_OK;
}

tdm_status_t gen_ep_open(const char *model_dir, const char *devices, int n_threads,
                         int64_t chunk_tokens, uint32_t n_pages, gen_ep_t **ep_out, char *err,
                         size_t err_bytes)
{
    engine_ep_params_t p;
    gen_ep_t *ep;
    tdm_status_t st;

    memset(&p, 0, sizeof(p));
    st = kern_device_parse_list(devices, p.devices, ENGINE_EP_MAX_RANKS, &p.n_ranks, err,
                                err_bytes);
    if (st != TDM_OK) {
        return st;
    }
    engine_model_params_default(&p.model);
    p.model.n_threads = n_threads;
    engine_fwd_params_default(NULL, &p.fwd);
    p.fwd.n_threads = n_threads;
    p.fwd.max_chunk_tokens = chunk_tokens;
    p.n_pages = n_pages;
    ep = calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    st = engine_ep_open(model_dir, &p, &ep->group, err, err_bytes);
    if (st != TDM_OK) {
        free(ep);
        return st;
    }
    ep->n_ranks = p.n_ranks;
    ep->V = engine_model_config(engine_ep_rank(ep->group, 0)->model)->vocab_size;
    *ep_out = ep;
    return TDM_OK;
}

static tdm_status_t release_rank(const engine_ep_rank_t *rank, void *user)
{
    gen_ep_t *ep = user;
    engine_seq_destroy(ep->seqs[rank->rank]); /* on its own thread: its device */
    ep->seqs[rank->rank] = NULL;
    return TDM_OK;
}

void gen_ep_close(gen_ep_t *ep)
{
    if (ep == NULL) {
        return;
    }
    (void)engine_ep_run(ep->group, release_rank, ep);
    engine_ep_close(ep->group);
    free(ep->scratch);
    free(ep);
}

const engine_config_t *gen_ep_config(const gen_ep_t *ep)
{
    return engine_model_config(engine_ep_rank(ep->group, 0)->model);
}

int gen_ep_size(const gen_ep_t *ep)
{
    return ep->n_ranks;
}

int64_t gen_ep_length(const gen_ep_t *ep)
{
    return ep->seqs[0] != NULL ? engine_seq_length(ep->seqs[0]) : 0;
}

tdm_status_t gen_ep_prefill(gen_ep_t *ep, const int32_t *ids, int64_t n_ids, uint32_t flags,
                            float *logits_out, int64_t *tail_out)
{
    gen_ep_job_t job = {ep, 0, ids, n_ids, flags, logits_out, 0};
    tdm_status_t st = ensure_scratch(ep, (flags & ENGINE_PREFILL_ALL_LOGITS) ? n_ids : 1);

    if (st == TDM_OK) {
        st = engine_ep_run(ep->group, job_rank, &job);
    }
    if (st == TDM_OK && tail_out != NULL) {
        *tail_out = job.tail;
    }
    return st;
}

tdm_status_t gen_ep_decode(gen_ep_t *ep, int32_t token, float *logits_out)
{
    gen_ep_job_t job = {ep, 1, &token, 1, 0, logits_out, 0};
    tdm_status_t st = ensure_scratch(ep, 1);

    return st == TDM_OK ? engine_ep_run(ep->group, job_rank, &job) : st;
}
