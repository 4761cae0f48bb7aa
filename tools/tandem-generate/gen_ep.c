/* gen_ep.c - tandem-generate on an expert-parallel group (gen_ep.h). */
#include "gen_ep.h"

#include <stdlib.h>

#include "engine/ep.h"
#include "engine/forward.h"

struct gen_ep {
    engine_ep_t *group;
    int n_ranks;
    engine_seq_t *seq; /* rank 0's */
};

/* What one run asks of rank 0 (the others serve its tokens' experts). */
typedef struct {
    gen_ep_t *ep;
    int decode; /* 0: prefill */
    const int32_t *ids;
    int64_t n_ids;
    uint32_t flags;
    float *logits;
    int64_t tail;
} gen_ep_job_t;

static tdm_status_t job_rank(const engine_ep_rank_t *rank, void *user)
{
    gen_ep_job_t *job = user;
    engine_seq_t **seq = &job->ep->seq;
    tdm_status_t st;

    if (rank->rank != 0) {
        return TDM_OK; /* engine/ep.h has it serve until rank 0 is done */
    }
    if (*seq == NULL) {
        st = engine_seq_create(rank->model, rank->pool, seq);
        if (st != TDM_OK) {
            return st;
        }
    }
    if (job->decode) {
        return engine_fwd_decode(rank->fwd, seq, job->ids, 1, job->logits);
    }
    return engine_fwd_prefill(rank->fwd, *seq, job->ids, job->n_ids, job->flags, job->logits,
                              &job->tail);
}

tdm_status_t gen_ep_open(const char *model_dir, const char *devices, int n_threads,
                         int64_t chunk_tokens, uint32_t n_pages, gen_ep_t **ep_out, char *err,
                         size_t err_bytes)
{
    engine_ep_params_t p;
    gen_ep_t *ep;
    tdm_status_t st;

    /* data-parallel (the default there): the sequence lives on rank 0 alone */
    st = engine_ep_params_from_devices(devices, n_threads, n_pages, &p, err, err_bytes);
    if (st != TDM_OK) {
        return st;
    }
    p.fwd.max_chunk_tokens = chunk_tokens;
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
    *ep_out = ep;
    return TDM_OK;
}

static tdm_status_t release_seq(const engine_ep_rank_t *rank, void *user)
{
    gen_ep_t *ep = user;
    if (rank->rank == 0) {
        engine_seq_destroy(ep->seq); /* on its own thread: its device */
        ep->seq = NULL;
    }
    return TDM_OK;
}

void gen_ep_close(gen_ep_t *ep)
{
    if (ep == NULL) {
        return;
    }
    (void)engine_ep_run(ep->group, release_seq, ep);
    engine_ep_close(ep->group);
    free(ep);
}

int gen_ep_size(const gen_ep_t *ep)
{
    return ep->n_ranks;
}

int64_t gen_ep_length(const gen_ep_t *ep)
{
    return ep->seq != NULL ? engine_seq_length(ep->seq) : 0;
}

tdm_status_t gen_ep_prefill(gen_ep_t *ep, const int32_t *ids, int64_t n_ids, uint32_t flags,
                            float *logits_out, int64_t *tail_out)
{
    gen_ep_job_t job = {ep, 0, ids, n_ids, flags, logits_out, 0};
    tdm_status_t st = engine_ep_run(ep->group, job_rank, &job);

    if (st == TDM_OK && tail_out != NULL) {
        *tail_out = job.tail;
    }
    return st;
}

tdm_status_t gen_ep_decode(gen_ep_t *ep, int32_t token, float *logits_out)
{
    gen_ep_job_t job = {ep, 1, &token, 1, 0, logits_out, 0};
    return engine_ep_run(ep->group, job_rank, &job);
}
