/* job.c - the prefill jobs of a prefill node: start (pull, import), steps of several jobs in one
 * batch (their ring replays, then their deltas), finish (sample, last puts, notice) (job.h). */
#include "prefill-node/job.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "node/node_handoff.h"
#include "node/node_state.h"
#include "engine/sampler.h"
#include "kernels/kv_page.h"
#include "transfer/batch.h"
#include "transfer/desc.h"
#include "transfer/peer.h"
#include "prefill-node/job_stream.h"

#define JOB_WAIT_MS           100u
#define PREFILL_JOB_ERR_BYTES 256

/* Completion of one batch (filled by its callback). */
typedef struct {
    uint32_t n_done;
    tdm_status_t status;
} batch_wait_t;

static void on_batch_done(void *arg, const xfer_batch_result_t *result)
{
    batch_wait_t *w = arg;

    if (result->status != TDM_OK && w->status == TDM_OK) {
        w->status = result->status;
    }
    w->n_done++;
}

/* Move n pages between local and remote slots in one batch and wait for it. */
static tdm_status_t move_pages(const prefill_job_env_t *env, xfer_peer_t *peer, xfer_op_t op,
                               uint64_t job_id, const uint32_t *local, const uint32_t *remote,
                               uint32_t n)
{
    batch_wait_t w = {0, TDM_OK};
    xfer_batch_params_t bp;
    tdm_status_t status;

    if (n == 0) {
        return TDM_OK;
    }
    memset(&bp, 0, sizeof(bp));
    bp.op = op;
    bp.job_id = job_id;
    bp.local_pool = env->xpool;
    bp.local_pages = local;
    bp.remote_pages = remote;
    bp.n_pages = n;
    bp.done = on_batch_done;
    bp.done_arg = &w;
    for (;;) {
        status = xfer_batch_post(peer, &bp);
        if (status != TDM_ERR_BUSY) {
            break;
        }
        xfer_context_wait(env->xfer, JOB_WAIT_MS);
    }
    if (status != TDM_IN_PROGRESS) {
        return status;
    }
    while (w.n_done == 0) {
        xfer_context_wait(env->xfer, JOB_WAIT_MS);
    }
    return w.status;
}

static void set_err(char *err, size_t err_bytes, const char *what)
{
    if (err != NULL && err_bytes > 0) {
        snprintf(err, err_bytes, "%s", what);
    }
}

/* The sequence at H: a fresh one (H = 0), or the history pages (those the history cache holds
 * unchanged from it, history.h; the others pulled) with the record at H. */
static tdm_status_t load_history(const prefill_job_env_t *env, xfer_peer_t *peer,
                                 const node_resv_desc_t *rd, const char *session_id,
                                 uint64_t job_id, engine_seq_t **seq_out, prefill_job_report_t *rep,
                                 char *err, size_t err_bytes)
{
    const engine_config_t *cfg = engine_model_config(env->model);
    size_t page_bytes = engine_kv_pool_page_bytes(env->kv);
    engine_kv_table_t scratch;
    int64_t n_rows[NODE_MAX_SOURCES];
    uint32_t n_pages[NODE_MAX_SOURCES];
    uint32_t n_all = 0, n_get = 0;
    uint32_t *remote = NULL, *local = NULL;
    const void **pages = NULL;
    uint8_t *blob = NULL;
    size_t n_blob = 0;
    uint64_t t0 = tdm_clock_now_ns();
    tdm_status_t status;

    if (rd->cached_len == 0) {
        return engine_seq_create(env->model, env->kv, seq_out);
    }
    if (rd->record == NULL) {
        set_err(err, err_bytes, "descriptor has no state record at H");
        return TDM_ERR_FORMAT;
    }
    for (uint32_t s = 0; s < rd->n_sources; s++) {
        n_rows[s] = engine_config_n_c(cfg, rd->src[s].layer, (int64_t)rd->cached_len - 1);
        n_pages[s] = rd->src[s].n_history;
        if (n_pages[s] != (uint32_t)kern_kv_page_count(n_rows[s])) {
            set_err(err, err_bytes, "history pages do not cover the rows below H");
            return TDM_ERR_FORMAT;
        }
        n_all += n_pages[s];
    }
    engine_kv_table_init(&scratch, (int)cfg->kv_source_layer_ids[0], 1);
    remote = malloc((n_all + 1) * sizeof(uint32_t));
    local = malloc((n_all + 1) * sizeof(uint32_t));
    pages = calloc(n_all + 1, sizeof(void *));
    status = remote == NULL || local == NULL || pages == NULL ? TDM_ERR_NO_MEMORY : TDM_OK;
    if (status == TDM_OK) {
        /* the pages the cache holds as the decode node does (digest and check, history.h) */
        n_get = n_all - prefill_history_lookup(env->history, session_id, rd, pages);
        status = engine_kv_table_reserve(env->kv, &scratch, (int64_t)n_get * KERN_KV_PAGE_ROWS);
    }
    if (status == TDM_OK) {
        uint32_t k = 0, g = 0;
        for (uint32_t s = 0; s < rd->n_sources; s++) {
            for (uint32_t j = 0; j < n_pages[s]; j++, k++) {
                if (pages[k] != NULL) {
                    continue;
                }
                local[g] = scratch.page_ids[g];
                remote[g] = rd->src[s].history[j];
                /* where the get lands: the engine's page on the CPU, its staging copy on a
                 * device (the import below carries it into the engine) */
                pages[k] = node_pages_host(env->pages, local[g++]);
            }
        }
        status = move_pages(env, peer, XFER_OP_GET, job_id, local, remote, n_get);
        if (status != TDM_OK) {
            set_err(err, err_bytes, "pulling the history pages failed");
        }
    }
    rep->n_history = n_all;
    rep->n_pulled = n_get;
    rep->pull_ns = tdm_clock_now_ns() - t0;
    if (status == TDM_OK) {
        status = node_blob_with_pages(rd->record, rd->n_record, rd->n_sources, n_rows, n_pages,
                                      pages, page_bytes, &blob, &n_blob);
    }
    if (status == TDM_OK) {
        status = engine_seq_import(env->model, env->kv, blob, n_blob, seq_out);
        if (status != TDM_OK) {
            set_err(err, err_bytes, "the pulled pages or the record at H failed the import check");
        }
    }
    free(blob);
    free(pages);
    free(remote);
    free(local);
    engine_kv_table_release(env->kv, &scratch);
    return status;
}

/*
 * The first tokens of a job: choice 0's (CompletionNotice.first_token) and, with
 * SamplingParams.n_choices > 1, those of choices 1 .. n - 1 (choice_first), each sampled from the
 * same last-position logits with proto_choice_seed; with n_logprobs > 0 each carries its top list
 * (first_top, choice_first[i].top). One malloc'ed block the notice points into; `tops` is its
 * first member so prefill_job_notice_fini finds the block from either pointer.
 */
typedef struct {
    Tandem__TopLogprobs tops[PROTO_MAX_CHOICES];
    int32_t top_ids[PROTO_MAX_CHOICES][ENGINE_SAMPLER_MAX_LOGPROBS];
    float top_lps[PROTO_MAX_CHOICES][ENGINE_SAMPLER_MAX_LOGPROBS];
    Tandem__ChoiceFirst choices[PROTO_MAX_CHOICES];
    Tandem__ChoiceFirst *choice_ptrs[PROTO_MAX_CHOICES];
} first_block_t;

/*
 * The first tokens at position T (choice 0 and, with n_choices > 1, the others), into out[0..n)
 * and *n_out. A job with a response_format or tool_calls constraint samples them from the masked
 * logits (engine/constrain.h, the automaton's start state, the same for every choice; `logits` is
 * masked in place); err names the reason of a refused constraint.
 */
static tdm_status_t sample_first(const prefill_job_env_t *env, const Tandem__SamplingParams *in,
                                 float *logits, int64_t position, engine_sample_t *out,
                                 uint32_t *n_out, char *err, size_t err_bytes)
{
    const engine_config_t *cfg = engine_model_config(env->model);
    engine_sampler_params_t sp;
    tdm_arena_t arena;
    uint32_t n = 1;
    tdm_status_t status;

    engine_sampler_params_default(&sp);
    if (in != NULL) {
        sp.temperature = in->temperature;
        sp.top_k = in->top_k;
        sp.top_p = in->top_p == 0.0 ? 1.0 : in->top_p;
        sp.min_p = in->min_p;
        sp.n_logprobs = in->n_logprobs > ENGINE_SAMPLER_MAX_LOGPROBS ? ENGINE_SAMPLER_MAX_LOGPROBS
                                                                     : in->n_logprobs;
        for (size_t i = 0; i < in->n_stop_token_ids && i < ENGINE_SAMPLER_MAX_STOP_IDS; i++) {
            sp.stop_ids[sp.n_stop_ids++] = in->stop_token_ids[i];
        }
        sp.suppress_stop = in->min_tokens > 0; /* the first token is generated token 1 */
        n = in->n_choices > 1 ? in->n_choices : 1;
    }
    if (n > PROTO_MAX_CHOICES) {
        return TDM_ERR_INVALID_ARG;
    }
    if (in != NULL) {
        engine_constraint_t *c = NULL;

        status = engine_constraint_create_request(env->constrain_vocab, in->response_format,
                                                  in->tool_calls, sp.stop_ids, sp.n_stop_ids, &c,
                                                  err, err_bytes);
        if (status == TDM_OK && c != NULL) {
            status = engine_constraint_apply(c, logits, cfg->vocab_size);
        }
        engine_constraint_destroy(c);
        if (status != TDM_OK) {
            return status;
        }
    }
    status = tdm_arena_init(&arena, engine_sampler_scratch_bytes(cfg->vocab_size));
    for (uint32_t c = 0; c < n && status == TDM_OK; c++) {
        sp.seed = proto_choice_seed(in != NULL ? in->seed : 0, c);
        status = engine_sampler_sample(&sp, logits, cfg->vocab_size, position, &arena, &out[c]);
    }
    tdm_arena_fini(&arena);
    *n_out = n;
    return status;
}

/* Point `notice` at the first tokens of samples[0..n) (sample_first): first_top and
 * choice_first, in one block (NULL when neither is needed). TDM_ERR_NO_MEMORY on failure. */
static tdm_status_t notice_first(Tandem__CompletionNotice *notice, const engine_sample_t *samples,
                                 uint32_t n, int n_logprobs)
{
    first_block_t *b;

    notice->first_token = samples[0].token;
    notice->first_logprob = (float)samples[0].logprob;
    if (n <= 1 && n_logprobs <= 0) {
        return TDM_OK;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t c = 0; c < n; c++) {
        tandem__top_logprobs__init(&b->tops[c]);
        for (int i = 0; n_logprobs > 0 && i < samples[c].n_top; i++) {
            b->top_ids[c][i] = samples[c].top[i].token;
            b->top_lps[c][i] = (float)samples[c].top[i].logprob;
        }
        b->tops[c].n_tokens = n_logprobs > 0 ? (size_t)samples[c].n_top : 0;
        b->tops[c].tokens = b->top_ids[c];
        b->tops[c].n_logprobs = b->tops[c].n_tokens;
        b->tops[c].logprobs = b->top_lps[c];
        if (c > 0) {
            tandem__choice_first__init(&b->choices[c]);
            b->choices[c].token = samples[c].token;
            b->choices[c].logprob = (float)samples[c].logprob;
            b->choices[c].top = n_logprobs > 0 ? &b->tops[c] : NULL;
            b->choice_ptrs[c - 1] = &b->choices[c];
        }
    }
    notice->first_top = n_logprobs > 0 ? &b->tops[0] : NULL;
    notice->choice_first = b->choice_ptrs;
    notice->n_choice_first = n - 1;
    return TDM_OK;
}

/* One job (job.h): what start made, what the steps did, what finish needs. */
struct prefill_job {
    const prefill_job_env_t *env;
    const Tandem__PrefillJob *job; /* borrowed until destroy */
    void *user;
    node_resv_desc_t rd;
    int have_rd;
    xfer_peer_t *peer;
    engine_seq_t *seq;
    prefill_stream_t ps;
    int streaming;
    float *logits;       /* [V] first-token logits, written by the step that reaches T */
    int need_replay;     /* the canonical replay at H is still to run (its first step) */
    int64_t done;        /* delta tokens computed */
    uint32_t pages_at_t; /* the sequence's pages at T (every source's reservation) */
    tdm_status_t status; /* TDM_OK, or why the job is over (TDM_ERR_TIMEOUT: stopped) */
    char err[PREFILL_JOB_ERR_BYTES];
    prefill_job_report_t rep;
};

/* The job is over with `status` (the first reason wins). */
static void job_fail(prefill_job_t *j, tdm_status_t status, const char *why)
{
    if (j->status == TDM_OK) {
        j->status = status;
        set_err(j->err, sizeof(j->err), why);
    }
}

uint32_t prefill_job_pages_needed(const Tandem__PrefillJob *job)
{
    node_resv_desc_t rd;
    uint32_t n = 0;

    if (job == NULL ||
        node_resv_desc_parse(job->page_descriptor.data, job->page_descriptor.len, &rd) != TDM_OK) {
        return 0;
    }
    for (uint32_t s = 0; s < rd.n_sources; s++) {
        n += 2 * rd.src[s].n_history + rd.src[s].first_target + rd.src[s].n_targets;
    }
    n += rd.n_stage; /* the staged record at H, got before the history */
    node_resv_desc_fini(&rd);
    return n;
}

/* The descriptor and the delta must match the job (nothing is pulled before). */
static tdm_status_t check_job(prefill_job_t *j)
{
    const engine_config_t *cfg = engine_model_config(j->env->model);
    const Tandem__PrefillJob *job = j->job;
    uint64_t T = job->cached_len + job->n_delta_tokens;
    tdm_status_t status;

    status = node_resv_desc_parse(job->page_descriptor.data, job->page_descriptor.len, &j->rd);
    if (status != TDM_OK) {
        job_fail(j, status, "page descriptor does not parse");
        return status;
    }
    j->have_rd = 1;
    if (j->rd.reservation_id != job->reservation_id || j->rd.cached_len != job->cached_len ||
        j->rd.total_len != T || j->rd.n_sources != (uint32_t)cfg->n_kv_source_layer_ids ||
        job->n_delta_tokens == 0) {
        job_fail(j, TDM_ERR_MISMATCH, "page descriptor does not match the job");
        return TDM_ERR_MISMATCH;
    }
    for (size_t i = 0; i < job->n_delta_tokens; i++) {
        if (job->delta_tokens[i] >= cfg->vocab_size) {
            job_fail(j, TDM_ERR_FORMAT, "token id outside the vocabulary");
            return TDM_ERR_FORMAT;
        }
    }
    for (uint32_t s = 0; s < j->rd.n_sources; s++) {
        j->pages_at_t += j->rd.src[s].first_target + j->rd.src[s].n_targets;
    }
    return TDM_OK;
}

/* The pull step: the sequence at H from the decode node's pages (load_history). */
/* Descriptor version 3 (node_handoff.h; issue 18 item 4): the state record at H lies in the
 * decode node's staged pages, not in the descriptor the router relayed: get them into scratch
 * pages, copy the record out into rd->record and check it against rd->record_checksum. */
static tdm_status_t get_staged_record(prefill_job_t *j)
{
    node_resv_desc_t *rd = &j->rd;
    engine_kv_pool_t *kv = j->env->kv;
    size_t page_bytes = engine_kv_pool_page_bytes(kv);
    engine_kv_table_t scratch;
    uint8_t *record;
    tdm_status_t status;

    if (rd->n_stage == 0 || rd->record != NULL) {
        return TDM_OK;
    }
    if (rd->n_record > (size_t)rd->n_stage * page_bytes ||
        rd->n_record <= (size_t)(rd->n_stage - 1) * page_bytes) {
        job_fail(j, TDM_ERR_FORMAT, "staged record length does not match its pages");
        return TDM_ERR_FORMAT;
    }
    record = malloc(rd->n_record);
    engine_kv_table_init(&scratch, (int)engine_model_config(j->env->model)->kv_source_layer_ids[0],
                         1);
    status = record == NULL
                 ? TDM_ERR_NO_MEMORY
                 : engine_kv_table_reserve(kv, &scratch, (int64_t)rd->n_stage * KERN_KV_PAGE_ROWS);
    if (status == TDM_OK) {
        status = move_pages(j->env, j->peer, XFER_OP_GET, j->job->request_id, scratch.page_ids,
                            rd->stage, rd->n_stage);
    }
    for (uint32_t i = 0; status == TDM_OK && i < rd->n_stage; i++) {
        size_t at = (size_t)i * page_bytes;
        size_t n = rd->n_record - at < page_bytes ? rd->n_record - at : page_bytes;
        memcpy(record + at, node_pages_host(j->env->pages, scratch.page_ids[i]), n);
    }
    engine_kv_table_release(kv, &scratch);
    if (status == TDM_OK && tdm_hash_xxh3_64(record, rd->n_record) != rd->record_checksum) {
        status = TDM_ERR_MISMATCH;
    }
    if (status != TDM_OK) {
        free(record);
        job_fail(j, status,
                 status == TDM_ERR_MISMATCH ? "the staged record at H does not match its checksum"
                                            : "getting the staged record at H failed");
        return status;
    }
    rd->record = record;
    return TDM_OK;
}

static tdm_status_t prefill_job_pull(prefill_job_t *j)
{
    xfer_desc_t xd;
    tdm_status_t status;

    status = xfer_desc_parse(j->job->decode_transfer_descriptor.data,
                             j->job->decode_transfer_descriptor.len, &xd);
    if (status == TDM_OK) {
        status = xfer_peer_connect(j->env->xfer, &xd, &j->peer);
    }
    if (status != TDM_OK) {
        job_fail(j, status, "cannot reach the decode node's page pool");
        return status;
    }
    status = get_staged_record(j);
    if (status != TDM_OK) {
        return status;
    }
    status = load_history(j->env, j->peer, &j->rd, j->job->session_id, j->job->request_id, &j->seq,
                          &j->rep, j->err, sizeof(j->err));
    if (status != TDM_OK) {
        job_fail(j, status, j->err[0] != '\0' ? j->err : "loading the history failed");
    }
    return status;
}

tdm_status_t prefill_job_start(const prefill_job_env_t *env, const Tandem__PrefillJob *job,
                               void *user, prefill_job_t **job_out, char *err, size_t err_bytes)
{
    const engine_config_t *cfg;
    prefill_job_t *j;
    uint64_t t0;
    tdm_status_t status;

    if (env == NULL || job == NULL || job_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    j = calloc(1, sizeof(*j));
    if (j == NULL) {
        set_err(err, err_bytes, "out of memory");
        return TDM_ERR_NO_MEMORY;
    }
    cfg = engine_model_config(env->model);
    j->env = env;
    j->job = job;
    j->user = user;
    status = check_job(j);
    if (status == TDM_OK) {
        status = prefill_job_pull(j);
    }
    if (status == TDM_OK && env->aborted(env->aborted_arg, user)) {
        status = TDM_ERR_TIMEOUT;
        job_fail(j, status, "aborted");
    }
    t0 = tdm_clock_now_ns();
    if (status == TDM_OK && job->canonical_start && job->cached_len > 0) {
        /* MODEL.md 6(d)(1): rings of layers 0..c replayed at H, as the decode node would; the
         * replay runs in the job's first step, batched with the other new jobs' */
        engine_seq_reset_rings(j->seq);
        j->need_replay = 1;
    }
    if (status == TDM_OK) {
        j->logits = malloc((size_t)cfg->vocab_size * sizeof(float));
        status = j->logits == NULL ? TDM_ERR_NO_MEMORY
                                   : prefill_stream_init(&j->ps, env, j->peer, &j->rd, j->seq,
                                                         job->request_id, user);
        j->streaming = j->logits != NULL;
        if (status != TDM_OK) {
            job_fail(j, status, "out of memory");
        }
    }
    j->rep.compute_ns += tdm_clock_now_ns() - t0;
    if (status != TDM_OK) {
        set_err(err, err_bytes, j->err);
        prefill_job_destroy(j);
        return status;
    }
    *job_out = j;
    return TDM_OK;
}

int64_t prefill_job_rows_left(const prefill_job_t *j)
{
    if (j == NULL || j->status != TDM_OK || j->ps.aborted || j->ps.status != TDM_OK) {
        return 0; /* over: finish says why */
    }
    return (int64_t)j->job->n_delta_tokens - j->done;
}

uint32_t prefill_job_pages_to_come(const prefill_job_t *j)
{
    uint32_t have;

    if (j == NULL || j->seq == NULL || j->status != TDM_OK) {
        return 0;
    }
    have = engine_seq_n_pages(j->seq);
    return have < j->pages_at_t ? j->pages_at_t - have : 0;
}

/* The engine's per-layer hook during a step: each record is one job's rows (seq_index = its
 * part), handed to that job's put stream. */
typedef struct {
    prefill_job_t *jobs[ENGINE_FWD_MAX_BATCH];
} step_sink_t;

static void step_on_layer(void *user, const engine_dump_layer_t *rec)
{
    step_sink_t *sk = user;

    if (rec->seq_index >= 0 && rec->seq_index < ENGINE_FWD_MAX_BATCH &&
        sk->jobs[rec->seq_index] != NULL) {
        prefill_stream_on_layer(&sk->jobs[rec->seq_index]->ps, rec);
    }
}

/* The engine's per-layer hook during the replays: liveness only (nothing is put yet). */
static void replay_on_layer(void *user, const engine_dump_layer_t *rec)
{
    const prefill_job_env_t *env = user;

    (void)rec;
    node_progress_tick(env->progress);
}

/* The canonical replays of the jobs [n] that still need theirs, in one batched call; a job
 * whose context does not check fails alone (each is then replayed on its own). */
static void replay_new_jobs(const prefill_job_env_t *env, prefill_job_t *const *jobs, int n)
{
    engine_dump_sink_t sink = {(void *)env, replay_on_layer};
    engine_seq_t *seqs[ENGINE_FWD_MAX_BATCH];
    const int32_t *ids[ENGINE_FWD_MAX_BATCH];
    int64_t n_ids[ENGINE_FWD_MAX_BATCH];
    prefill_job_t *mine[ENGINE_FWD_MAX_BATCH];
    int m = 0;
    uint64_t t0 = tdm_clock_now_ns(), dt;
    tdm_status_t status;

    for (int i = 0; i < n; i++) {
        if (jobs[i]->need_replay && prefill_job_rows_left(jobs[i]) > 0) {
            mine[m] = jobs[i];
            seqs[m] = jobs[i]->seq;
            ids[m] = jobs[i]->job->context_tokens;
            n_ids[m++] = (int64_t)jobs[i]->job->n_context_tokens;
        }
    }
    if (m == 0) {
        return;
    }
    engine_fwd_set_dump(env->fwd, &sink); /* many replays take a while: a long step is live */
    status = engine_fwd_replay_batch(env->fwd, seqs, ids, n_ids, m);
    for (int k = 0; k < m; k++) {
        tdm_status_t own = status;
        if (status == TDM_ERR_INVALID_ARG) { /* which one: each alone */
            own = engine_fwd_replay(env->fwd, seqs[k], ids[k], n_ids[k], ENGINE_REPLAY_CANONICAL,
                                    NULL);
        }
        mine[k]->need_replay = 0;
        if (own != TDM_OK) {
            job_fail(mine[k], own, "the prefill computation failed");
        }
    }
    engine_fwd_set_dump(env->fwd, NULL);
    dt = tdm_clock_now_ns() - t0;
    for (int k = 0; k < m; k++) {
        mine[k]->rep.compute_ns += dt;
    }
}

tdm_status_t prefill_jobs_step(const prefill_job_env_t *env, prefill_job_t *const *jobs, int n_jobs,
                               int64_t budget_tokens, int64_t job_tokens, int64_t *n_tokens_out)
{
    engine_prefill_part_t parts[ENGINE_FWD_MAX_BATCH];
    step_sink_t sk;
    engine_dump_sink_t sink = {&sk, step_on_layer};
    int64_t left_before[ENGINE_FWD_MAX_BATCH];
    int64_t n_tokens = 0;
    int n_parts = 0;
    uint64_t t0, dt;
    tdm_status_t status;

    if (n_tokens_out != NULL) {
        *n_tokens_out = 0;
    }
    if (env == NULL || jobs == NULL || n_jobs < 1 || n_jobs > ENGINE_FWD_MAX_BATCH ||
        budget_tokens < 1 || job_tokens < 1) {
        return TDM_ERR_INVALID_ARG;
    }
    memset(&sk, 0, sizeof(sk));
    for (int i = 0; i < n_jobs; i++) { /* every waiting job is looked at, in the step or not */
        if (prefill_job_rows_left(jobs[i]) > 0 && env->aborted(env->aborted_arg, jobs[i]->user)) {
            prefill_stream_stop(&jobs[i]->ps); /* fenced: nothing more goes out */
            job_fail(jobs[i], TDM_ERR_TIMEOUT, "aborted");
        }
    }
    replay_new_jobs(env, jobs, n_jobs);
    for (int i = 0; i < n_jobs; i++) {
        prefill_job_t *j = jobs[i];
        int64_t left = prefill_job_rows_left(j);
        int64_t n = left < job_tokens ? left : job_tokens;
        n = n < budget_tokens - n_tokens ? n : budget_tokens - n_tokens;
        if (n <= 0) {
            continue;
        }
        parts[n_parts] =
            (engine_prefill_part_t){j->seq,
                                    (int64_t)j->job->cached_len,
                                    (int64_t)(j->job->cached_len + j->job->n_delta_tokens),
                                    j->job->delta_tokens + j->done,
                                    n,
                                    ENGINE_PREFILL_DEFAULT,
                                    j->logits,
                                    0};
        left_before[n_parts] = engine_seq_length(j->seq);
        sk.jobs[n_parts++] = j;
        n_tokens += n;
    }
    if (n_parts == 0) {
        return TDM_OK;
    }
    t0 = tdm_clock_now_ns();
    engine_fwd_set_dump(env->fwd, &sink);
    status = engine_fwd_prefill_parts(env->fwd, parts, n_parts);
    engine_fwd_set_dump(env->fwd, NULL);
    dt = tdm_clock_now_ns() - t0;
    n_tokens = 0;
    for (int k = 0; k < n_parts; k++) {
        prefill_job_t *j = sk.jobs[k];
        int ran = engine_seq_length(j->seq) == left_before[k] + parts[k].n_ids;

        j->rep.compute_ns += dt;
        if (status == TDM_OK || (status == TDM_ERR_NO_PAGES && ran)) {
            j->done += parts[k].n_ids;
            n_tokens += parts[k].n_ids;
        } else {
            job_fail(j, status,
                     status == TDM_ERR_NO_PAGES ? "the local page pool is full"
                                                : "the prefill computation failed");
        }
        if (j->ps.aborted) {
            job_fail(j, TDM_ERR_TIMEOUT, "aborted"); /* stopped putting at a layer boundary */
        }
    }
    if (n_tokens_out != NULL) {
        *n_tokens_out = n_tokens;
    }
    return status;
}

/* Sequence state off the router (job.h, env->state_inband 0): the record at T and the page
 * checksums of `notice` go to the decode node in a transfer notice; `notice` keeps what the
 * router relays (state_direct, n_pages, state_checksum). On failure the job fails. */
static tdm_status_t send_state_direct(prefill_job_t *j, Tandem__CompletionNotice *notice)
{
    uint8_t *payload = NULL;
    size_t n_payload = 0;
    tdm_status_t status = node_state_pack(notice, &payload, &n_payload);

    if (status == TDM_OK) {
        status = prefill_stream_notice(&j->ps, payload, n_payload);
    }
    free(payload);
    if (status != TDM_OK) {
        prefill_job_notice_fini(notice);
        job_fail(j, status, "sending the state notice to the decode node failed");
        return status;
    }
    free(notice->page_checksums);
    free(notice->state_record.data);
    notice->page_checksums = NULL;
    notice->n_page_checksums = 0;
    notice->state_record.data = NULL;
    notice->state_record.len = 0;
    notice->state_direct = 1;
    tdm_log(TDM_LOG_DEBUG, "prefill",
            "state sent direct: request=%llu reservation=%llu payload_bytes=%zu pages=%u",
            (unsigned long long)notice->request_id, (unsigned long long)notice->reservation_id,
            n_payload, notice->n_pages);
    return TDM_OK;
}

/* The last puts, the state record at T and the notice of a job that computed every row. */
static tdm_status_t finish_notice(prefill_job_t *j, const engine_sample_t *samples,
                                  uint32_t n_samples, Tandem__CompletionNotice *notice_out)
{
    const Tandem__PrefillJob *job = j->job;
    prefill_stream_t *ps = &j->ps;
    uint8_t *record = NULL;
    size_t n_record = 0;
    uint64_t t0 = tdm_clock_now_ns();
    tdm_status_t status, drained;

    /* The pages still open during the compute (each source's last one, ...) are final now. */
    status = prefill_stream_check(ps);
    if (status == TDM_OK) {
        prefill_stream_collect(ps, INT64_MAX);
        prefill_stream_post(ps, 0);
        /* The state record at T does not touch the pages: built while the last puts fly. */
        n_record = engine_seq_export_bytes(j->seq, ENGINE_SEQ_EXPORT_RECORD);
        record = malloc(n_record);
        status = record == NULL ? TDM_ERR_NO_MEMORY
                                : engine_seq_export(j->seq, ENGINE_SEQ_EXPORT_RECORD, record,
                                                    n_record, &n_record);
    }
    drained = prefill_stream_drain(ps);
    status = status != TDM_OK ? status : drained;
    if (status == TDM_OK && ps->aborted) {
        status = TDM_ERR_TIMEOUT; /* aborted while the last batch waited to be posted */
    }
    j->rep.put_ns = tdm_clock_now_ns() - t0;
    j->rep.n_put = ps->n_posted_pages;
    j->rep.n_put_early = ps->n_early_pages;
    j->rep.n_chunk_puts = ps->n_chunk_batches;
    tdm_log(TDM_LOG_DEBUG, "prefill",
            "job puts: request=%llu pages=%u during_compute=%u in_batches=%u after_compute=%u "
            "compute_ms=%.1f put_tail_ms=%.1f",
            (unsigned long long)job->request_id, ps->n_posted_pages, ps->n_early_pages,
            ps->n_chunk_batches, ps->n_posted_pages - ps->n_early_pages,
            (double)j->rep.compute_ns / 1e6, (double)j->rep.put_ns / 1e6);
    if (status != TDM_OK) {
        job_fail(j, status,
                 status == TDM_ERR_TIMEOUT    ? "aborted"
                 : status == TDM_ERR_MISMATCH ? "reserved pages do not match the sequence at T"
                                              : "putting the pages into the reservation failed");
        free(record);
        return status;
    }
    j->rep.n_prefilled = job->n_delta_tokens;
    /* the session's pages below T, every one sealed and equal to what the decode node now holds:
     * its next turn here pulls only what changes meanwhile (history.h) */
    if (j->env->history != NULL) {
        tdm_status_t kept =
            prefill_history_keep_seq(j->env->history, job->session_id, j->env->pages, j->seq);
        if (kept != TDM_OK) {
            tdm_log(TDM_LOG_WARN, "prefill", "history pages not kept (%s): request=%llu",
                    tdm_status_message(kept), (unsigned long long)job->request_id);
        }
    }
    tandem__completion_notice__init(notice_out);
    notice_out->request_id = job->request_id;
    notice_out->reservation_id = job->reservation_id;
    notice_out->cached_len = job->cached_len;
    notice_out->total_len = job->cached_len + job->n_delta_tokens;
    notice_out->page_checksums = ps->sums;
    notice_out->n_page_checksums = ps->n_all;
    ps->sums = NULL; /* the notice owns the checksums */
    notice_out->sampler_counter = notice_out->total_len;
    notice_out->state_record.data = record;
    notice_out->state_record.len = n_record;
    notice_out->state_checksum = tdm_hash_xxh3_64(record, n_record);
    notice_out->prefill_ns = j->rep.compute_ns;
    notice_out->n_pages = ps->n_all;
    notice_out->attempt = job->attempt;
    status = notice_first(notice_out, samples, n_samples,
                          job->sampling != NULL ? job->sampling->n_logprobs : -1);
    if (status != TDM_OK) {
        prefill_job_notice_fini(notice_out);
        job_fail(j, status, "out of memory");
        return status;
    }
    if (!j->env->state_inband) {
        status = send_state_direct(j, notice_out);
    }
    return status;
}

tdm_status_t prefill_job_finish(prefill_job_t *j, Tandem__CompletionNotice *notice_out,
                                prefill_job_report_t *report_out, char *err, size_t err_bytes)
{
    engine_sample_t samples[PROTO_MAX_CHOICES];
    uint32_t n_samples = 0;
    tdm_status_t status = TDM_OK;

    if (j == NULL || notice_out == NULL || report_out == NULL) {
        return TDM_ERR_INVALID_ARG;
    }
    if (j->status == TDM_OK && (j->ps.aborted || j->env->aborted(j->env->aborted_arg, j->user))) {
        prefill_stream_stop(&j->ps);             /* fenced (once): nothing more goes out */
        job_fail(j, TDM_ERR_TIMEOUT, "aborted"); /* pages put mid-compute stay the reservation's */
    }
    if (j->status == TDM_OK && j->ps.status != TDM_OK) {
        job_fail(j, j->ps.status,
                 j->ps.status == TDM_ERR_MISMATCH
                     ? "reserved pages do not match the sequence at T"
                     : "putting the pages into the reservation failed");
    }
    if (j->status == TDM_OK && j->done < (int64_t)j->job->n_delta_tokens) {
        return TDM_ERR_INVALID_ARG; /* rows left: not finished */
    }
    if (j->status == TDM_OK) {
        char why[PREFILL_JOB_ERR_BYTES] = "";
        uint64_t t0 = tdm_clock_now_ns();

        status = sample_first(j->env, j->job->sampling, j->logits,
                              (int64_t)(j->job->cached_len + j->job->n_delta_tokens), samples,
                              &n_samples, why, sizeof(why));
        j->rep.compute_ns += tdm_clock_now_ns() - t0;
        if (status != TDM_OK) {
            job_fail(j, status, why[0] != '\0' ? why : "the prefill computation failed");
        }
    }
    if (j->status == TDM_OK && j->env->aborted(j->env->aborted_arg, j->user)) {
        job_fail(j, TDM_ERR_TIMEOUT, "aborted");
    }
    if (j->status == TDM_OK) {
        status = finish_notice(j, samples, n_samples, notice_out);
    }
    if (j->streaming) {
        prefill_stream_drain(&j->ps); /* no batch may outlive the sequence's pages */
        j->rep.n_put = j->ps.n_posted_pages;
    }
    *report_out = j->rep;
    if (j->status != TDM_OK) {
        set_err(err, err_bytes, j->err);
        return j->status;
    }
    return status;
}

void prefill_job_destroy(prefill_job_t *j)
{
    if (j == NULL) {
        return;
    }
    if (j->streaming) {
        prefill_stream_drain(&j->ps); /* no batch may outlive the sequence's pages or `ps` */
        prefill_stream_fini(&j->ps);
    }
    free(j->logits);
    engine_seq_destroy(j->seq);
    xfer_peer_close(j->peer);
    if (j->have_rd) {
        node_resv_desc_fini(&j->rd);
    }
    free(j);
}

void prefill_job_notice_fini(Tandem__CompletionNotice *notice)
{
    if (notice->first_top != NULL) {
        free(notice->first_top); /* first_block_t's first member */
    } else if (notice->choice_first != NULL) {
        free((char *)notice->choice_first - offsetof(first_block_t, choice_ptrs));
    }
    notice->first_top = NULL;
    notice->choice_first = NULL;
    notice->n_choice_first = 0;
    free(notice->page_checksums);
    free(notice->state_record.data);
    notice->page_checksums = NULL;
    notice->state_record.data = NULL;
}
