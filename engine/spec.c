/* spec.c - speculative decoding contexts and steps (engine/spec.h): drafting for a batch,
 * verify as one multi-token decode, acceptance, rollback, metrics. */
#include "engine/spec.h"

#include "common/log.h"
#include "engine/forward_impl.h"
#include "engine/spec_impl.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_BATCH        16
#define DEFAULT_DRAFTS_NO_DSPARK 5
#define NGRAM_LIMIT              8
#define GEMM_K_ALIGN             16

static const char *const drafter_names[ENGINE_SPEC_N_DRAFTERS] = {"off", "dspark", "ngram",
                                                                  "external"};

void engine_spec_params_default(const engine_model_t *model, engine_spec_params_t *params)
{
    const engine_config_t *c = model != NULL ? engine_model_config(model) : NULL;
    memset(params, 0, sizeof(*params));
    params->accept = ENGINE_SPEC_ACCEPT_COUPLED;
    params->confidence_threshold = ENGINE_SPEC_DEFAULT_THRESHOLD;
    params->max_drafts =
        c != NULL && c->n_blocks > 0 ? (int)c->dspark_block_size : DEFAULT_DRAFTS_NO_DSPARK;
    params->ngram_max = ENGINE_SPEC_NGRAM_MAX_DEFAULT;
    params->ngram_min = ENGINE_SPEC_NGRAM_MIN_DEFAULT;
    params->max_batch = DEFAULT_MAX_BATCH;
}

tdm_status_t engine_spec_drafter_parse(const char *name, engine_spec_drafter_t *drafter_out)
{
    for (int i = 0; name != NULL && i < ENGINE_SPEC_EXTERNAL; i++) {
        if (strcmp(name, drafter_names[i]) == 0) {
            *drafter_out = (engine_spec_drafter_t)i;
            return TDM_OK;
        }
    }
    return TDM_ERR_INVALID_ARG;
}

const char *engine_spec_drafter_name(engine_spec_drafter_t drafter)
{
    if ((int)drafter < 0 || drafter >= ENGINE_SPEC_N_DRAFTERS) {
        return "unknown";
    }
    return drafter_names[drafter];
}

tdm_status_t engine_spec_accept_parse(const char *name, engine_spec_accept_t *accept_out)
{
    if (name != NULL && strcmp(name, "coupled") == 0) {
        *accept_out = ENGINE_SPEC_ACCEPT_COUPLED;
        return TDM_OK;
    }
    if (name != NULL && strcmp(name, "rejection") == 0) {
        *accept_out = ENGINE_SPEC_ACCEPT_REJECTION;
        return TDM_OK;
    }
    return TDM_ERR_INVALID_ARG;
}

static tdm_status_t check_params(const engine_config_t *c, const engine_spec_params_t *p)
{
    int64_t b_limit = c->n_blocks > 0 ? c->dspark_block_size : DEFAULT_DRAFTS_NO_DSPARK;
    const char *field = NULL;

    if (p->accept != ENGINE_SPEC_ACCEPT_COUPLED && p->accept != ENGINE_SPEC_ACCEPT_REJECTION) {
        field = "accept";
    } else if (!(p->confidence_threshold >= 0.0 && p->confidence_threshold <= 1.0)) {
        field = "confidence_threshold";
    } else if (p->max_drafts < 1 || p->max_drafts > ENGINE_SPEC_MAX_DRAFTS ||
               p->max_drafts > b_limit || p->max_drafts >= c->sliding_window) {
        field = "max_drafts"; /* rings hold B + 1 positions beyond the window (C = W + B + 1) */
    } else if (p->ngram_min < 1 || p->ngram_max < p->ngram_min || p->ngram_max > NGRAM_LIMIT) {
        field = "ngram_min/ngram_max";
    } else if (p->max_batch < 1 || p->max_batch > ENGINE_FWD_MAX_BATCH) {
        field = "max_batch";
    } else if (c->n_blocks > 0 && c->dspark_markov_rank % GEMM_K_ALIGN != 0) {
        field = "dspark_markov_rank";
    }
    if (field != NULL) {
        tdm_log(TDM_LOG_WARN, "spec", "speculative parameters rejected: field=%s", field);
        return TDM_ERR_INVALID_ARG;
    }
    return TDM_OK;
}

/* n 4-byte elements of the model's backend memory (ops->mem_alloc) into *ptr_out. */
static tdm_status_t spec_backend_alloc(engine_spec_t *spec, size_t n, void **ptr_out)
{
    return spec->ops->mem_alloc(&spec->kctx, n * sizeof(float), ptr_out);
}

tdm_status_t engine_spec_create(engine_fwd_t *fwd, const engine_spec_params_t *params,
                                engine_spec_t **spec_out)
{
    engine_spec_t *spec;
    const engine_model_t *model;
    const engine_config_t *c;
    int64_t rows, B;
    tdm_status_t st;

    if (fwd == NULL || params == NULL || spec_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    model = fwd->model;
    c = engine_model_config(model);
    st = check_params(c, params);
    if (st != TDM_OK) {
        return st;
    }
    rows = (int64_t)params->max_batch * (params->max_drafts + 1);
    if (rows > fwd->params.max_chunk_tokens && rows > ENGINE_FWD_MAX_BATCH) {
        tdm_log(TDM_LOG_WARN, "spec", "forward context too small: rows=%lld max_chunk_tokens=%lld",
                (long long)rows, (long long)fwd->params.max_chunk_tokens);
        return TDM_ERR_INVALID_ARG;
    }
    spec = calloc(1, sizeof(*spec));
    if (spec == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    spec->fwd = fwd;
    spec->model = model;
    spec->cfg = c;
    spec->ops = engine_model_ops(model);
    spec->kctx.backend = KERN_BACKEND_CPU;
    spec->kctx.n_threads = engine_model_n_threads(model);
    spec->kctx.pool = fwd->kctx.pool; /* borrowed: fwd outlives spec, and both run on one thread */
    spec->params = *params;
    spec->V = c->vocab_size;
    spec->H = c->hidden_size;
    spec->B = c->n_blocks > 0 ? c->dspark_block_size : 0;
    B = spec->B > 0 ? spec->B : 1;
    spec->logits = malloc((size_t)(rows * spec->V) * sizeof(float));
    spec->draft_logits =
        malloc((size_t)((int64_t)params->max_batch * params->max_drafts * spec->V) * sizeof(float));
    /* what the heads' ops read and write: backend memory (device memory on CUDA) */
    st = spec_backend_alloc(spec, (size_t)((int64_t)params->max_batch * B * spec->H),
                            (void **)&spec->x);
    if (st == TDM_OK) {
        st = spec_backend_alloc(spec, (size_t)(B * spec->V), (void **)&spec->U);
    }
    if (st == TDM_OK) {
        st = spec_backend_alloc(spec, (size_t)(B * spec->H), (void **)&spec->hn);
    }
    if (st == TDM_OK) {
        st = spec_backend_alloc(spec, (size_t)(c->dspark_markov_rank + GEMM_K_ALIGN),
                                (void **)&spec->e);
    }
    if (st == TDM_OK) { /* the GEMM reads e's zero padding */
        st = spec->ops->mem_set(&spec->kctx, spec->e, 0,
                                (size_t)(c->dspark_markov_rank + GEMM_K_ALIGN) * sizeof(float));
    }
    if (st == TDM_OK) {
        st = spec_backend_alloc(spec, (size_t)spec->V, (void **)&spec->ml);
    }
    if (st == TDM_OK) {
        st = spec_backend_alloc(spec, 1, (void **)&spec->prev);
    }
    if (st != TDM_OK) {
        engine_spec_destroy(spec);
        return st;
    }
    spec->conf_h = malloc((size_t)((B + 1) * spec->H + 2 * c->dspark_markov_rank) * sizeof(float));
    spec->p = malloc((size_t)spec->V * sizeof(double));
    spec->q = malloc((size_t)spec->V * sizeof(double));
    spec->ids = malloc((size_t)rows * sizeof(int32_t));
    if (spec->logits == NULL || spec->draft_logits == NULL || spec->conf_h == NULL ||
        spec->p == NULL || spec->q == NULL || spec->ids == NULL) {
        engine_spec_destroy(spec);
        return TDM_ERR_NO_MEMORY;
    }
    st = tdm_arena_init(&spec->arena, engine_sampler_scratch_bytes(spec->V) * 2 + 4096);
    if (st != TDM_OK) {
        engine_spec_destroy(spec);
        return st;
    }
    *spec_out = spec;
    return TDM_OK;
}

void engine_spec_destroy(engine_spec_t *spec)
{
    if (spec == NULL) {
        return;
    }
    tdm_arena_fini(&spec->arena);
    free(spec->logits);
    free(spec->draft_logits);
    spec->ops->mem_free(&spec->kctx, spec->x);
    spec->ops->mem_free(&spec->kctx, spec->U);
    spec->ops->mem_free(&spec->kctx, spec->hn);
    spec->ops->mem_free(&spec->kctx, spec->e);
    spec->ops->mem_free(&spec->kctx, spec->ml);
    spec->ops->mem_free(&spec->kctx, spec->prev);
    free(spec->conf_h);
    free(spec->p);
    free(spec->q);
    free(spec->ids);
    free(spec);
}

/* Drafts a request may have: the params, its budget (max_emit - 1) and the context limit. */
static int draft_limit(const engine_spec_t *spec, const engine_spec_req_t *r)
{
    int64_t limit = spec->params.max_drafts;
    int64_t room = spec->cfg->max_position_embeddings - engine_seq_length(r->seq) - 1;
    if (r->max_emit - 1 < limit) {
        limit = r->max_emit - 1;
    }
    if (room < limit) {
        limit = room;
    }
    return limit > 0 ? (int)limit : 0;
}

static tdm_status_t check_reqs(const engine_spec_t *spec, const engine_spec_req_t *reqs, int n_reqs,
                               const engine_spec_result_t *results_out)
{
    if (spec == NULL || reqs == NULL || results_out == NULL || n_reqs < 1 ||
        n_reqs > spec->params.max_batch) {
        return TDM_ERR_INVALID_ARG;
    }
    for (int i = 0; i < n_reqs; i++) {
        const engine_spec_req_t *r = &reqs[i];
        if (r->seq == NULL || r->sampling == NULL || r->max_emit < 1 || r->anchor < 0 ||
            r->anchor >= spec->V || (int)r->drafter < 0 || r->drafter >= ENGINE_SPEC_N_DRAFTERS ||
            (r->drafter == ENGINE_SPEC_DSPARK && (spec->B == 0 || engine_seq_length(r->seq) < 1)) ||
            (r->drafter == ENGINE_SPEC_NGRAM && r->history == NULL) ||
            (r->drafter == ENGINE_SPEC_EXTERNAL && r->n_ext_drafts > 0 && r->ext_drafts == NULL)) {
            tdm_log(TDM_LOG_WARN, "spec", "speculative step rejected: request=%d", i);
            return TDM_ERR_INVALID_ARG;
        }
        for (int k = 0; r->drafter == ENGINE_SPEC_EXTERNAL && k < r->n_ext_drafts; k++) {
            if (r->ext_drafts[k] < 0 || r->ext_drafts[k] >= spec->V) {
                return TDM_ERR_INVALID_ARG;
            }
        }
    }
    return TDM_OK;
}

/* Draft for every request: ids [y, d_1 .. d_L] per request into spec->ids, n_ids[i] = L + 1. */
static tdm_status_t draft_all(engine_spec_t *spec, const engine_spec_req_t *reqs, int n_reqs,
                              int64_t *n_ids, int64_t *off, engine_spec_result_t *results)
{
    engine_seq_t *ds_seqs[ENGINE_FWD_MAX_BATCH];
    int32_t ds_anchor[ENGINE_FWD_MAX_BATCH];
    int ds_req[ENGINE_FWD_MAX_BATCH];
    int n_ds = 0;
    int64_t at = 0;
    int stride = spec->params.max_drafts + 1;
    tdm_status_t st = TDM_OK;

    for (int i = 0; i < n_reqs; i++) {
        const engine_spec_req_t *r = &reqs[i];
        int32_t *ids = spec->ids + (int64_t)i * stride;
        int limit = draft_limit(spec, r);
        int L = 0;

        ids[0] = r->anchor;
        if (limit > 0 && r->drafter == ENGINE_SPEC_NGRAM) {
            L = spec_ngram_propose(r->history, r->n_history, spec->params.ngram_max,
                                   spec->params.ngram_min, limit, ids + 1);
        } else if (limit > 0 && r->drafter == ENGINE_SPEC_EXTERNAL) {
            L = r->n_ext_drafts < limit ? r->n_ext_drafts : limit;
            memcpy(ids + 1, r->ext_drafts, (size_t)L * sizeof(int32_t));
        } else if (limit > 0 && r->drafter == ENGINE_SPEC_DSPARK) {
            ds_seqs[n_ds] = r->seq;
            ds_anchor[n_ds] = r->anchor;
            ds_req[n_ds] = i;
            n_ds++;
        }
        n_ids[i] = L + 1;
        results[i].n_drafted = L;
    }
    if (n_ds > 0) {
        st = fwd_dspark_draft_backend(spec->fwd, ds_seqs, ds_anchor, n_ds, spec->x);
    }
    for (int k = 0; k < n_ds && st == TDM_OK; k++) {
        int i = ds_req[k];
        int L = 0;
        st = spec_dspark_heads(spec, spec->x + (int64_t)k * spec->B * spec->H, reqs[i].anchor,
                               engine_seq_length(reqs[i].seq), reqs[i].sampling,
                               draft_limit(spec, &reqs[i]), spec->ids + (int64_t)i * stride + 1,
                               spec->draft_logits + (int64_t)i * spec->params.max_drafts * spec->V,
                               &L);
        n_ids[i] = L + 1;
        results[i].n_drafted = L;
    }
    /* pack the per-request id rows contiguously, in request order */
    for (int i = 0; i < n_reqs && st == TDM_OK; i++) {
        off[i] = at;
        memmove(spec->ids + at, spec->ids + (int64_t)i * stride,
                (size_t)n_ids[i] * sizeof(int32_t));
        at += n_ids[i];
    }
    return st;
}

/* Emit min(m + 1, max_emit, through the first stop id) tokens; roll back to a + emitted. */
static tdm_status_t finish_request(engine_spec_t *spec, const engine_spec_req_t *r, int64_t a,
                                   int L, int m, engine_spec_result_t *res)
{
    int k = m + 1;
    engine_spec_metrics_t *mt = &spec->metrics[r->drafter];

    if (k > r->max_emit) {
        k = r->max_emit;
    }
    for (int i = 0; i < k; i++) {
        if (engine_sampler_is_stop(r->sampling, res->samples[i].token)) {
            k = i + 1;
            break;
        }
    }
    res->n_emitted = k;
    res->n_verified = L;
    res->n_accepted = m;
    mt->n_steps++;
    mt->drafted += (uint64_t)res->n_drafted;
    mt->verified += (uint64_t)L;
    mt->accepted += (uint64_t)m;
    mt->emitted += (uint64_t)k;
    return engine_seq_rollback(r->seq, a + k);
}

tdm_status_t engine_spec_step(engine_spec_t *spec, const engine_spec_req_t *reqs, int n_reqs,
                              engine_spec_result_t *results_out)
{
    engine_seq_t *seqs[ENGINE_FWD_MAX_BATCH];
    int64_t n_ids[ENGINE_FWD_MAX_BATCH];
    int64_t off[ENGINE_FWD_MAX_BATCH];
    int64_t a[ENGINE_FWD_MAX_BATCH];
    tdm_status_t st;

    st = check_reqs(spec, reqs, n_reqs, results_out);
    if (st != TDM_OK) {
        return st;
    }
    memset(results_out, 0, (size_t)n_reqs * sizeof(*results_out));
    for (int i = 0; i < n_reqs; i++) {
        seqs[i] = reqs[i].seq;
        a[i] = engine_seq_length(reqs[i].seq);
    }
    st = draft_all(spec, reqs, n_reqs, n_ids, off, results_out);
    if (st != TDM_OK) {
        return st;
    }
    st = engine_fwd_decode_multi(spec->fwd, seqs, spec->ids, n_ids, n_reqs, spec->logits);
    if (st != TDM_OK) {
        return st;
    }
    for (int i = 0; i < n_reqs && st == TDM_OK; i++) {
        const engine_spec_req_t *r = &reqs[i];
        int L = (int)n_ids[i] - 1;
        int m = 0;
        const float *dl = r->drafter == ENGINE_SPEC_DSPARK
                              ? spec->draft_logits + (int64_t)i * spec->params.max_drafts * spec->V
                              : NULL;
        st = spec_accept(spec, spec->logits + off[i] * spec->V, spec->ids + off[i] + 1, L, dl, a[i],
                         r->sampling, r->constraint, results_out[i].samples, &m);
        if (st == TDM_OK) {
            st = finish_request(spec, r, a[i], L, m, &results_out[i]);
        }
    }
    return st;
}

void engine_spec_metrics(const engine_spec_t *spec, engine_spec_drafter_t drafter,
                         engine_spec_metrics_t *metrics_out)
{
    memset(metrics_out, 0, sizeof(*metrics_out));
    if (spec == NULL || (int)drafter < 0 || drafter >= ENGINE_SPEC_N_DRAFTERS) {
        return;
    }
    *metrics_out = spec->metrics[drafter];
    metrics_out->acceptance_rate =
        metrics_out->verified > 0 ? (double)metrics_out->accepted / (double)metrics_out->verified
                                  : 0.0;
    metrics_out->mean_accepted_length =
        metrics_out->n_steps > 0 ? (double)metrics_out->accepted / (double)metrics_out->n_steps
                                 : 0.0;
}
