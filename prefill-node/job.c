/* job.c - one prefill job (job.h). */
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
#include "engine/sampler.h"
#include "kernels/kv_page.h"
#include "transfer/batch.h"
#include "transfer/desc.h"
#include "transfer/peer.h"

#define JOB_WAIT_MS 100u

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
                pages[k] = engine_kv_pool_page(env->kv, local[g++]);
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
 * Per-chunk puts (ARCHITECTURE.md, life of a turn 4; MODEL.md 7 handoff (1)).
 *
 * engine_fwd_prefill runs the delta chunk by chunk (--chunk-tokens rows per layer pass), each
 * chunk through layers 0..c before the next one starts. Every KV source is a layer <= c
 * (c = max(kv_source_layer_ids)) and writes its rows when it processes the chunk that publishes
 * them, so once layer c has finished the chunk ending at position e, each source s holds its
 * final rows j < n_c_s(e - 1) and no later chunk writes any of them again. The stream listens to
 * the engine's per-layer hook (engine_dump_sink_t: called after each layer of each chunk, on the
 * compute thread, between kernel calls) and at layer c of every chunk seals, checksums and posts
 * (one non-blocking put batch) every reserved page whose 64 slots are all below that row count:
 * those pages are final, so UCX may read them while the next chunk computes (batch.h: the pages
 * stay unchanged until the callback). At every layer it also progresses the transfer context so
 * the puts move during the compute.
 *
 * A page with a free slot left is still being appended to (its rows, its header's row_count and
 * checksum change with the next chunk): that is each source's last page at T (and any reserved
 * page not yet reached), and the partly filled first page until it fills. Those are never put
 * mid-compute; after the prefill returns they are sealed and put once, in a last batch. Every
 * page is thus put exactly once, with the bytes and checksum the notice names; the notice
 * (checksums in reservation order, first token, state record) is sent only after every batch
 * has completed, and no return path leaves a batch in flight (its pages are the sequence's).
 */
typedef struct {
    const prefill_job_env_t *env;
    xfer_peer_t *peer;
    const node_resv_desc_t *rd;
    engine_seq_t *seq;
    uint64_t job_id;
    size_t page_bytes;
    uint32_t base[NODE_MAX_SOURCES]; /* index of source s's first target in the arrays below */
    uint32_t next[NODE_MAX_SOURCES]; /* targets of source s sealed and queued so far */
    uint32_t n_all;
    uint32_t *local, *remote;        /* [n_all] reservation order */
    uint64_t *sums;                  /* [n_all] XXH3-64 of each sealed page */
    uint32_t *pend;                  /* [n_all] indices sealed, not yet posted (post was BUSY) */
    uint32_t n_pend;
    int checked;                     /* tables at T compared with the reservation */
    int aborted;                     /* an abort was seen: post nothing more */
    int fenced;                      /* env->fenced was called */
    uint32_t n_in_flight;            /* batches posted, callback not yet run */
    uint32_t n_chunk_batches;        /* batches posted while the prefill computed */
    uint32_t n_early_pages;          /* pages posted while the prefill computed */
    uint32_t n_posted_pages;
    tdm_status_t status;             /* first failure: a table mismatch, a post or a batch */
} put_stream_t;

static void on_stream_batch_done(void *arg, const xfer_batch_result_t *result)
{
    put_stream_t *ps = arg;

    if (result->status != TDM_OK && ps->status == TDM_OK) {
        ps->status = result->status;
    }
    ps->n_in_flight--;
}

static tdm_status_t stream_init(put_stream_t *ps, const prefill_job_env_t *env, xfer_peer_t *peer,
                                const node_resv_desc_t *rd, engine_seq_t *seq, uint64_t job_id)
{
    memset(ps, 0, sizeof(*ps));
    ps->env = env;
    ps->peer = peer;
    ps->rd = rd;
    ps->seq = seq;
    ps->job_id = job_id;
    ps->page_bytes = engine_kv_pool_page_bytes(env->kv);
    ps->status = TDM_OK;
    for (uint32_t s = 0; s < rd->n_sources; s++) {
        ps->base[s] = ps->n_all;
        ps->n_all += rd->src[s].n_targets;
    }
    ps->local = malloc((ps->n_all + 1) * sizeof(uint32_t));
    ps->remote = malloc((ps->n_all + 1) * sizeof(uint32_t));
    ps->sums = malloc((ps->n_all + 1) * sizeof(uint64_t));
    ps->pend = malloc((ps->n_all + 1) * sizeof(uint32_t));
    if (ps->local == NULL || ps->remote == NULL || ps->sums == NULL || ps->pend == NULL) {
        return TDM_ERR_NO_MEMORY;
    }
    return TDM_OK;
}

/* Free the arrays; the caller has drained the stream (no batch in flight). */
static void stream_fini(put_stream_t *ps)
{
    free(ps->local);
    free(ps->remote);
    free(ps->sums);
    free(ps->pend);
    ps->local = ps->remote = ps->pend = NULL;
    ps->sums = NULL;
}

/* The sequence's tables must hold exactly the reserved pages at T (checked once they exist). */
static tdm_status_t stream_check(put_stream_t *ps)
{
    if (ps->checked) {
        return ps->status;
    }
    ps->checked = 1;
    for (uint32_t s = 0; s < ps->rd->n_sources; s++) {
        const engine_kv_table_t *t = engine_seq_table(ps->seq, ps->rd->src[s].layer);
        if (t == NULL || t->n_pages != ps->rd->src[s].first_target + ps->rd->src[s].n_targets) {
            ps->status = TDM_ERR_MISMATCH;
            break;
        }
    }
    return ps->status;
}

/* Seal, checksum and queue the targets of every source whose pages are final once the rows
 * below n_c(end - 1) are written (end = INT64_MAX: every remaining target). */
static void stream_collect(put_stream_t *ps, int64_t end)
{
    const engine_config_t *cfg = engine_model_config(ps->env->model);

    for (uint32_t s = 0; s < ps->rd->n_sources; s++) {
        const node_resv_source_t *src = &ps->rd->src[s];
        const engine_kv_table_t *t = engine_seq_table(ps->seq, src->layer);
        int64_t rows = end == INT64_MAX ? INT64_MAX : engine_config_n_c(cfg, src->layer, end - 1);

        while (ps->next[s] < src->n_targets) {
            uint32_t p = src->first_target + ps->next[s];
            uint32_t k = ps->base[s] + ps->next[s];
            void *page;

            if (rows != INT64_MAX && (int64_t)(p + 1) * KERN_KV_PAGE_ROWS > rows) {
                break; /* a slot of page p is still to be written */
            }
            page = engine_kv_pool_page(ps->env->kv, t->page_ids[p]);
            kern_kv_page_seal(page);
            ps->sums[k] = tdm_hash_xxh3_64(page, ps->page_bytes);
            ps->local[k] = t->page_ids[p];
            ps->remote[k] = src->targets[ps->next[s]];
            ps->pend[ps->n_pend++] = k;
            ps->next[s]++;
        }
    }
}

/* Post the queued pages as one put batch; BUSY keeps them queued for the next try. */
static void stream_post(put_stream_t *ps, int computing)
{
    xfer_batch_params_t bp;
    uint32_t *local, *remote;
    tdm_status_t status;

    if (ps->n_pend == 0 || ps->status != TDM_OK || ps->aborted) {
        return;
    }
    local = malloc(ps->n_pend * sizeof(uint32_t));
    remote = malloc(ps->n_pend * sizeof(uint32_t));
    if (local == NULL || remote == NULL) {
        free(local);
        free(remote);
        ps->status = TDM_ERR_NO_MEMORY;
        return;
    }
    for (uint32_t i = 0; i < ps->n_pend; i++) {
        local[i] = ps->local[ps->pend[i]];
        remote[i] = ps->remote[ps->pend[i]];
    }
    memset(&bp, 0, sizeof(bp));
    bp.op = XFER_OP_PUT;
    bp.job_id = ps->job_id;
    bp.local_pool = ps->env->xpool;
    bp.local_pages = local;
    bp.remote_pages = remote;
    bp.n_pages = ps->n_pend;
    bp.done = on_stream_batch_done;
    bp.done_arg = ps;
    status = xfer_batch_post(ps->peer, &bp);
    free(local);
    free(remote);
    if (status == TDM_IN_PROGRESS) {
        ps->n_in_flight++;
        ps->n_posted_pages += ps->n_pend;
        if (computing) {
            ps->n_chunk_batches++;
            ps->n_early_pages += ps->n_pend;
        }
        ps->n_pend = 0;
    } else if (status != TDM_ERR_BUSY) {
        ps->status = status;
    }
}

/* An abort reached the job: drop what is sealed but not posted, wait for every batch in flight
 * (the puts either landed or failed), then tell the node the writer is fenced. */
static void stream_stop(put_stream_t *ps)
{
    ps->aborted = 1;
    ps->n_pend = 0;
    while (ps->n_in_flight > 0) {
        xfer_context_wait(ps->env->xfer, JOB_WAIT_MS);
    }
    if (!ps->fenced && ps->env->fenced != NULL) {
        ps->fenced = 1;
        ps->env->fenced(ps->env->aborted_arg, ps->n_posted_pages);
    }
}

/* The engine's per-layer hook during the prefill: look for an abort (then stop putting), progress
 * the puts; at layer c, post the chunk's final pages. Touches only the pool's pages, the transfer
 * context and the node's abort check, never the forward context (engine_dump_sink_t's rule). */
static void stream_on_layer(void *user, const engine_dump_layer_t *rec)
{
    put_stream_t *ps = user;

    node_progress_tick(ps->env->progress);
    if (!ps->aborted && ps->env->aborted(ps->env->aborted_arg, ps->job_id)) {
        tdm_log(TDM_LOG_INFO, "prefill",
                "job aborted mid-compute: request=%llu layer=%d position=%lld pages_put=%u",
                (unsigned long long)ps->job_id, rec->layer, (long long)rec->first_position,
                ps->n_posted_pages);
        stream_stop(ps);
    }
    if (ps->aborted) {
        return; /* the compute runs to its end; nothing more is put */
    }
    xfer_context_progress(ps->env->xfer);
    if (rec->layer != engine_model_config(ps->env->model)->ced_cut ||
        stream_check(ps) != TDM_OK) {
        return;
    }
    stream_collect(ps, rec->first_position + rec->n_rows);
    stream_post(ps, 1);
}

/* Post whatever is queued, retrying while BUSY, then wait for every batch in flight. Always
 * returns with nothing in flight. */
static tdm_status_t stream_drain(put_stream_t *ps)
{
    while (ps->n_pend > 0 && ps->status == TDM_OK && !ps->aborted) {
        if (ps->env->aborted(ps->env->aborted_arg, ps->job_id)) {
            stream_stop(ps); /* checked before every post: nothing goes out after an abort */
            break;
        }
        stream_post(ps, 0);
        if (ps->n_pend > 0 && ps->status == TDM_OK) {
            xfer_context_wait(ps->env->xfer, JOB_WAIT_MS);
        }
    }
    while (ps->n_in_flight > 0) {
        xfer_context_wait(ps->env->xfer, JOB_WAIT_MS);
    }
    return ps->status;
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

/* Run the CED prefill of the delta with the put stream on the engine's per-layer hook. */
static tdm_status_t compute_streaming(const prefill_job_env_t *env, const Tandem__PrefillJob *job,
                                      engine_seq_t *seq, put_stream_t *ps, float *logits)
{
    engine_dump_sink_t sink = {ps, stream_on_layer};
    tdm_status_t status;

    engine_fwd_set_dump(env->fwd, &sink);
    status = engine_fwd_prefill(env->fwd, seq, job->delta_tokens, (int64_t)job->n_delta_tokens,
                                ENGINE_PREFILL_DEFAULT, logits, NULL);
    engine_fwd_set_dump(env->fwd, NULL);
    return status;
}

tdm_status_t prefill_job_run(const prefill_job_env_t *env, const Tandem__PrefillJob *job,
                             Tandem__CompletionNotice *notice_out, prefill_job_report_t *report_out,
                             char *err, size_t err_bytes)
{
    const engine_config_t *cfg = engine_model_config(env->model);
    node_resv_desc_t rd;
    xfer_desc_t xd;
    xfer_peer_t *peer = NULL;
    engine_seq_t *seq = NULL;
    float *logits = NULL;
    engine_sample_t samples[PROTO_MAX_CHOICES];
    uint32_t n_samples = 0;
    put_stream_t ps;
    int streaming = 0;
    uint64_t *sums = NULL;
    uint8_t *record = NULL;
    size_t n_record = 0;
    uint64_t T = job->cached_len + job->n_delta_tokens;
    uint64_t t0;
    tdm_status_t status, drained;

    memset(report_out, 0, sizeof(*report_out));
    memset(&ps, 0, sizeof(ps));
    status = node_resv_desc_parse(job->page_descriptor.data, job->page_descriptor.len, &rd);
    if (status != TDM_OK) {
        set_err(err, err_bytes, "page descriptor does not parse");
        return status;
    }
    if (rd.reservation_id != job->reservation_id || rd.cached_len != job->cached_len ||
        rd.total_len != T || rd.n_sources != (uint32_t)cfg->n_kv_source_layer_ids) {
        set_err(err, err_bytes, "page descriptor does not match the job");
        status = TDM_ERR_MISMATCH;
        goto out;
    }
    for (size_t i = 0; i < job->n_delta_tokens; i++) {
        if (job->delta_tokens[i] >= cfg->vocab_size) {
            set_err(err, err_bytes, "token id outside the vocabulary");
            status = TDM_ERR_FORMAT;
            goto out;
        }
    }
    status = xfer_desc_parse(job->decode_transfer_descriptor.data,
                             job->decode_transfer_descriptor.len, &xd);
    if (status == TDM_OK) {
        status = xfer_peer_connect(env->xfer, &xd, &peer);
    }
    if (status != TDM_OK) {
        set_err(err, err_bytes, "cannot reach the decode node's page pool");
        goto out;
    }
    status = load_history(env, peer, &rd, job->session_id, job->request_id, &seq, report_out, err,
                          err_bytes);
    if (status != TDM_OK) {
        goto out;
    }
    if (env->aborted(env->aborted_arg, job->request_id)) {
        status = TDM_ERR_TIMEOUT;
        goto out;
    }
    t0 = tdm_clock_now_ns();
    if (job->canonical_start && job->cached_len > 0) {
        /* MODEL.md 6(d)(1): rings of layers 0..c replayed at H, as the decode node would. */
        engine_seq_reset_rings(seq);
        status = engine_fwd_replay(env->fwd, seq, job->context_tokens,
                                   (int64_t)job->n_context_tokens, ENGINE_REPLAY_CANONICAL, NULL);
    }
    logits = malloc((size_t)cfg->vocab_size * sizeof(float));
    if (status == TDM_OK && logits == NULL) {
        status = TDM_ERR_NO_MEMORY;
    }
    if (status == TDM_OK) {
        status = stream_init(&ps, env, peer, &rd, seq, job->request_id);
        streaming = 1;
    }
    if (status == TDM_OK) {
        status = compute_streaming(env, job, seq, &ps, logits);
        if (ps.aborted) {
            report_out->compute_ns = tdm_clock_now_ns() - t0;
            status = TDM_ERR_TIMEOUT; /* stopped putting at a layer boundary */
            goto out;
        }
    }
    if (status == TDM_OK) {
        char why[256] = "";

        status = sample_first(env, job->sampling, logits, (int64_t)T, samples, &n_samples, why,
                              sizeof(why));
        if (status != TDM_OK && why[0] != '\0') {
            set_err(err, err_bytes, why);
            report_out->compute_ns = tdm_clock_now_ns() - t0;
            goto out;
        }
    }
    report_out->compute_ns = tdm_clock_now_ns() - t0;
    if (status != TDM_OK) {
        set_err(err, err_bytes, "the prefill computation failed");
        goto out;
    }
    if (ps.aborted || env->aborted(env->aborted_arg, job->request_id)) {
        status = TDM_ERR_TIMEOUT; /* pages put mid-compute stay the reservation's (fence) */
        goto out;
    }
    /* The pages still open during the compute (each source's last one, ...) are final now. */
    t0 = tdm_clock_now_ns();
    status = stream_check(&ps);
    if (status == TDM_OK) {
        stream_collect(&ps, INT64_MAX);
        stream_post(&ps, 0);
        /* The state record at T does not touch the pages: built while the last puts fly. */
        n_record = engine_seq_export_bytes(seq, ENGINE_SEQ_EXPORT_RECORD);
        record = malloc(n_record);
        status = record == NULL ? TDM_ERR_NO_MEMORY
                                : engine_seq_export(seq, ENGINE_SEQ_EXPORT_RECORD, record,
                                                    n_record, &n_record);
    }
    drained = stream_drain(&ps);
    status = status != TDM_OK ? status : drained;
    if (status == TDM_OK && ps.aborted) {
        status = TDM_ERR_TIMEOUT; /* aborted while the last batch waited to be posted */
    }
    report_out->put_ns = tdm_clock_now_ns() - t0;
    report_out->n_put = ps.n_posted_pages;
    report_out->n_put_early = ps.n_early_pages;
    report_out->n_chunk_puts = ps.n_chunk_batches;
    tdm_log(TDM_LOG_DEBUG, "prefill",
            "job puts: request=%llu pages=%u during_compute=%u in_batches=%u after_compute=%u "
            "compute_ms=%.1f put_tail_ms=%.1f",
            (unsigned long long)job->request_id, ps.n_posted_pages, ps.n_early_pages,
            ps.n_chunk_batches, ps.n_posted_pages - ps.n_early_pages,
            (double)report_out->compute_ns / 1e6, (double)report_out->put_ns / 1e6);
    if (status != TDM_OK) {
        set_err(err, err_bytes,
                status == TDM_ERR_MISMATCH ? "reserved pages do not match the sequence at T"
                                           : "putting the pages into the reservation failed");
        free(record);
        goto out;
    }
    report_out->n_prefilled = job->n_delta_tokens;
    /* the session's pages below T, every one sealed and equal to what the decode node now holds:
     * its next turn here pulls only what changes meanwhile (history.h) */
    if (env->history != NULL &&
        prefill_history_keep_seq(env->history, job->session_id, env->kv, seq) != TDM_OK) {
        tdm_log(TDM_LOG_WARN, "prefill", "history pages not kept (out of memory): request=%llu",
                (unsigned long long)job->request_id);
    }
    sums = ps.sums;
    ps.sums = NULL; /* the notice owns the checksums */
    tandem__completion_notice__init(notice_out);
    notice_out->request_id = job->request_id;
    notice_out->reservation_id = job->reservation_id;
    notice_out->cached_len = job->cached_len;
    notice_out->total_len = T;
    notice_out->page_checksums = sums;
    notice_out->n_page_checksums = ps.n_all;
    notice_out->sampler_counter = T;
    notice_out->state_record.data = record;
    notice_out->state_record.len = n_record;
    notice_out->state_checksum = tdm_hash_xxh3_64(record, n_record);
    notice_out->prefill_ns = report_out->compute_ns;
    status = notice_first(notice_out, samples, n_samples,
                          job->sampling != NULL ? job->sampling->n_logprobs : -1);
    if (status != TDM_OK) {
        prefill_job_notice_fini(notice_out);
        set_err(err, err_bytes, "out of memory");
    }

out:
    if (streaming) {
        stream_drain(&ps); /* no batch may outlive the sequence's pages or `ps` */
        report_out->n_put = ps.n_posted_pages;
        stream_fini(&ps);
    }
    free(logits);
    engine_seq_destroy(seq);
    xfer_peer_close(peer);
    node_resv_desc_fini(&rd);
    return status;
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
