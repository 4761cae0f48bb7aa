/* job.c - one prefill job (job.h). */
#include "prefill-node/job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "decode-node/node_handoff.h"
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

/* The sequence at H: a fresh one (H = 0), or the pulled pages with the record at H. */
static tdm_status_t load_history(const prefill_job_env_t *env, xfer_peer_t *peer,
                                 const node_resv_desc_t *rd, uint64_t job_id, engine_seq_t **seq_out,
                                 prefill_job_report_t *rep, char *err, size_t err_bytes)
{
    const engine_config_t *cfg = engine_model_config(env->model);
    size_t page_bytes = engine_kv_pool_page_bytes(env->kv);
    engine_kv_table_t scratch;
    int64_t n_rows[NODE_MAX_SOURCES];
    uint32_t n_pages[NODE_MAX_SOURCES];
    uint32_t n_all = 0, k = 0;
    uint32_t *remote = NULL;
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
        if (n_pages[s] != (uint32_t)((n_rows[s] + KERN_KV_PAGE_ROWS - 1) / KERN_KV_PAGE_ROWS)) {
            set_err(err, err_bytes, "history pages do not cover the rows below H");
            return TDM_ERR_FORMAT;
        }
        n_all += n_pages[s];
    }
    engine_kv_table_init(&scratch, (int)cfg->kv_source_layer_ids[0], 1);
    status = engine_kv_table_reserve(env->kv, &scratch, (int64_t)n_all * KERN_KV_PAGE_ROWS);
    remote = malloc((n_all + 1) * sizeof(uint32_t));
    pages = malloc((n_all + 1) * sizeof(void *));
    if (status == TDM_OK && (remote == NULL || pages == NULL)) {
        status = TDM_ERR_NO_MEMORY;
    }
    if (status == TDM_OK) {
        for (uint32_t s = 0; s < rd->n_sources; s++) {
            for (uint32_t j = 0; j < n_pages[s]; j++) {
                pages[k] = engine_kv_pool_page(env->kv, scratch.page_ids[k]);
                remote[k++] = rd->src[s].history[j];
            }
        }
        status = move_pages(env, peer, XFER_OP_GET, job_id, scratch.page_ids, remote, n_all);
        if (status != TDM_OK) {
            set_err(err, err_bytes, "pulling the history pages failed");
        }
    }
    rep->n_pulled = n_all;
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
    engine_kv_table_release(env->kv, &scratch);
    return status;
}

/* Seal and put the pages of the sequence at T that the reservation receives. */
static tdm_status_t put_pages(const prefill_job_env_t *env, xfer_peer_t *peer,
                              const node_resv_desc_t *rd, engine_seq_t *seq, uint64_t job_id,
                              uint64_t **checksums_out, uint32_t *n_out, char *err,
                              size_t err_bytes)
{
    size_t page_bytes = engine_kv_pool_page_bytes(env->kv);
    uint32_t n_all = 0, k = 0;
    uint32_t *local, *remote;
    uint64_t *sums;
    tdm_status_t status = TDM_OK;

    for (uint32_t s = 0; s < rd->n_sources; s++) {
        const engine_kv_table_t *t = engine_seq_table(seq, rd->src[s].layer);
        if (t == NULL || t->n_pages != rd->src[s].first_target + rd->src[s].n_targets) {
            set_err(err, err_bytes, "reserved pages do not match the sequence at T");
            return TDM_ERR_MISMATCH;
        }
        n_all += rd->src[s].n_targets;
    }
    local = malloc((n_all + 1) * sizeof(uint32_t));
    remote = malloc((n_all + 1) * sizeof(uint32_t));
    sums = malloc((n_all + 1) * sizeof(uint64_t));
    if (local == NULL || remote == NULL || sums == NULL) {
        free(local);
        free(remote);
        free(sums);
        return TDM_ERR_NO_MEMORY;
    }
    for (uint32_t s = 0; s < rd->n_sources; s++) {
        const engine_kv_table_t *t = engine_seq_table(seq, rd->src[s].layer);
        for (uint32_t j = 0; j < rd->src[s].n_targets; j++) {
            uint32_t id = t->page_ids[rd->src[s].first_target + j];
            void *page = engine_kv_pool_page(env->kv, id);
            kern_kv_page_seal(page);
            sums[k] = tdm_hash_xxh3_64(page, page_bytes);
            local[k] = id;
            remote[k++] = rd->src[s].targets[j];
        }
    }
    status = move_pages(env, peer, XFER_OP_PUT, job_id, local, remote, n_all);
    free(local);
    free(remote);
    if (status != TDM_OK) {
        set_err(err, err_bytes, "putting the pages into the reservation failed");
        free(sums);
        return status;
    }
    *checksums_out = sums;
    *n_out = n_all;
    return TDM_OK;
}

static tdm_status_t sample_first(const engine_model_t *model, const Tandem__SamplingParams *in,
                                 const float *logits, int64_t position, engine_sample_t *out)
{
    const engine_config_t *cfg = engine_model_config(model);
    engine_sampler_params_t sp;
    tdm_arena_t arena;
    tdm_status_t status;

    engine_sampler_params_default(&sp);
    if (in != NULL) {
        sp.temperature = in->temperature;
        sp.top_k = in->top_k;
        sp.top_p = in->top_p == 0.0 ? 1.0 : in->top_p;
        sp.min_p = in->min_p;
        sp.seed = in->seed;
        sp.n_logprobs = in->n_logprobs >= 0 ? 0 : ENGINE_SAMPLER_LOGPROBS_OFF;
        for (size_t i = 0; i < in->n_stop_token_ids && i < ENGINE_SAMPLER_MAX_STOP_IDS; i++) {
            sp.stop_ids[sp.n_stop_ids++] = in->stop_token_ids[i];
        }
    }
    status = tdm_arena_init(&arena, engine_sampler_scratch_bytes(cfg->vocab_size));
    if (status == TDM_OK) {
        status = engine_sampler_sample(&sp, logits, cfg->vocab_size, position, &arena, out);
    }
    tdm_arena_fini(&arena);
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
    engine_sample_t sample;
    uint64_t *sums = NULL;
    uint32_t n_sums = 0;
    uint8_t *record = NULL;
    size_t n_record = 0;
    uint64_t T = job->cached_len + job->n_delta_tokens;
    uint64_t t0;
    tdm_status_t status;

    memset(report_out, 0, sizeof(*report_out));
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
    status = load_history(env, peer, &rd, job->request_id, &seq, report_out, err, err_bytes);
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
        status = engine_fwd_prefill(env->fwd, seq, job->delta_tokens,
                                    (int64_t)job->n_delta_tokens, ENGINE_PREFILL_DEFAULT, logits,
                                    NULL);
    }
    if (status == TDM_OK) {
        status = sample_first(env->model, job->sampling, logits, (int64_t)T, &sample);
    }
    report_out->compute_ns = tdm_clock_now_ns() - t0;
    if (status != TDM_OK) {
        set_err(err, err_bytes, "the prefill computation failed");
        goto out;
    }
    if (env->aborted(env->aborted_arg, job->request_id)) {
        status = TDM_ERR_TIMEOUT;
        goto out;
    }
    t0 = tdm_clock_now_ns();
    status = put_pages(env, peer, &rd, seq, job->request_id, &sums, &n_sums, err, err_bytes);
    report_out->put_ns = tdm_clock_now_ns() - t0;
    if (status != TDM_OK) {
        goto out;
    }
    report_out->n_put = n_sums;
    report_out->n_prefilled = job->n_delta_tokens;
    n_record = engine_seq_export_bytes(seq, ENGINE_SEQ_EXPORT_RECORD);
    record = malloc(n_record);
    status = record == NULL ? TDM_ERR_NO_MEMORY
                            : engine_seq_export(seq, ENGINE_SEQ_EXPORT_RECORD, record, n_record,
                                                &n_record);
    if (status != TDM_OK) {
        free(sums);
        free(record);
        goto out;
    }
    tandem__completion_notice__init(notice_out);
    notice_out->request_id = job->request_id;
    notice_out->reservation_id = job->reservation_id;
    notice_out->cached_len = job->cached_len;
    notice_out->total_len = T;
    notice_out->page_checksums = sums;
    notice_out->n_page_checksums = n_sums;
    notice_out->first_token = sample.token;
    notice_out->first_logprob = (float)sample.logprob;
    notice_out->sampler_counter = T;
    notice_out->state_record.data = record;
    notice_out->state_record.len = n_record;
    notice_out->state_checksum = tdm_hash_xxh3_64(record, n_record);
    notice_out->prefill_ns = report_out->compute_ns;

out:
    free(logits);
    engine_seq_destroy(seq);
    xfer_peer_close(peer);
    node_resv_desc_fini(&rd);
    return status;
}

void prefill_job_notice_fini(Tandem__CompletionNotice *notice)
{
    free(notice->page_checksums);
    free(notice->state_record.data);
    notice->page_checksums = NULL;
    notice->state_record.data = NULL;
}
