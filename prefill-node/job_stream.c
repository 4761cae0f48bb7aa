/* job_stream.c - the page puts of one prefill job (job_stream.h; the design is at the top of
 * job_stream.h). */
#include "prefill-node/job_stream.h"

#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/log.h"
#include "kernels/kv_page.h"
#include "transfer/batch.h"

#define STREAM_WAIT_MS 100u

static void on_stream_batch_done(void *arg, const xfer_batch_result_t *result)
{
    prefill_stream_t *ps = arg;

    if (result->status != TDM_OK && ps->status == TDM_OK) {
        ps->status = result->status;
    }
    ps->n_in_flight--;
}

tdm_status_t prefill_stream_init(prefill_stream_t *ps, const prefill_job_env_t *env,
                                 xfer_peer_t *peer, const node_resv_desc_t *rd, engine_seq_t *seq,
                                 uint64_t job_id, void *user)
{
    memset(ps, 0, sizeof(*ps));
    ps->env = env;
    ps->peer = peer;
    ps->rd = rd;
    ps->seq = seq;
    ps->job_id = job_id;
    ps->user = user;
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
void prefill_stream_fini(prefill_stream_t *ps)
{
    free(ps->local);
    free(ps->remote);
    free(ps->sums);
    free(ps->pend);
    ps->local = ps->remote = ps->pend = NULL;
    ps->sums = NULL;
}

/* The sequence's tables must hold exactly the reserved pages at T (checked once they exist). */
tdm_status_t prefill_stream_check(prefill_stream_t *ps)
{
    if (ps->checked) {
        return ps->status;
    }
    ps->checked = 1;
    for (uint32_t s = 0; s < ps->rd->n_sources; s++) {
        const node_resv_source_t *src = &ps->rd->src[s];
        const engine_kv_table_t *t = engine_seq_table(ps->seq, src->layer);
        /* the pages at T: those held plus those a step of the job has still to reserve (a job
         * in several steps reserves part by part) */
        int64_t rows_at_t = engine_config_n_c(engine_model_config(ps->env->model), src->layer,
                                              (int64_t)ps->rd->total_len - 1);
        if (t == NULL || t->n_pages + engine_kv_table_pages_needed(t, rows_at_t) !=
                             src->first_target + src->n_targets) {
            ps->status = TDM_ERR_MISMATCH;
            break;
        }
    }
    return ps->status;
}

/* Seal, checksum and queue the targets of every source whose pages are final once the rows
 * below n_c(end - 1) are written (end = INT64_MAX: every remaining target). */
void prefill_stream_collect(prefill_stream_t *ps, int64_t end)
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
            /* sealed (the page is final), then hashed and put from the host bytes UCX reads:
             * the engine's page on the CPU, its staging copy on a device (node_pages.h) */
            if (node_pages_seal(ps->env->pages, &t->page_ids[p], 1) != TDM_OK) {
                ps->status = TDM_ERR_INTERNAL;
                return;
            }
            page = node_pages_host(ps->env->pages, t->page_ids[p]);
            ps->sums[k] = tdm_hash_xxh3_64(page, ps->page_bytes);
            ps->local[k] = t->page_ids[p];
            ps->remote[k] = src->targets[ps->next[s]];
            ps->pend[ps->n_pend++] = k;
            ps->next[s]++;
        }
    }
}

/* Post the queued pages as one put batch; BUSY keeps them queued for the next try. */
void prefill_stream_post(prefill_stream_t *ps, int computing)
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
void prefill_stream_stop(prefill_stream_t *ps)
{
    ps->aborted = 1;
    ps->n_pend = 0;
    while (ps->n_in_flight > 0) {
        xfer_context_wait(ps->env->xfer, STREAM_WAIT_MS);
    }
    if (!ps->fenced && ps->env->fenced != NULL) {
        ps->fenced = 1;
        ps->env->fenced(ps->env->aborted_arg, ps->user, ps->n_posted_pages);
    }
}

void prefill_stream_on_layer(prefill_stream_t *ps, const engine_dump_layer_t *rec)
{
    node_progress_tick(ps->env->progress);
    if (!ps->aborted && ps->env->aborted(ps->env->aborted_arg, ps->user)) {
        tdm_log(TDM_LOG_INFO, "prefill",
                "job aborted mid-compute: request=%llu layer=%d position=%lld pages_put=%u",
                (unsigned long long)ps->job_id, rec->layer, (long long)rec->first_position,
                ps->n_posted_pages);
        prefill_stream_stop(ps);
    }
    if (ps->aborted) {
        return; /* the compute runs to its end; nothing more is put */
    }
    xfer_context_progress(ps->env->xfer);
    if (rec->layer != engine_model_config(ps->env->model)->ced_cut ||
        prefill_stream_check(ps) != TDM_OK) {
        return;
    }
    prefill_stream_collect(ps, rec->first_position + rec->n_rows);
    prefill_stream_post(ps, 1);
}

/* Post whatever is queued, retrying while BUSY, then wait for every batch in flight. Always
 * returns with nothing in flight. */
tdm_status_t prefill_stream_drain(prefill_stream_t *ps)
{
    while (ps->n_pend > 0 && ps->status == TDM_OK && !ps->aborted) {
        if (ps->env->aborted(ps->env->aborted_arg, ps->user)) {
            prefill_stream_stop(
                ps); /* checked before every post: nothing goes out after an abort */
            break;
        }
        prefill_stream_post(ps, 0);
        if (ps->n_pend > 0 && ps->status == TDM_OK) {
            xfer_context_wait(ps->env->xfer, STREAM_WAIT_MS);
        }
    }
    while (ps->n_in_flight > 0) {
        xfer_context_wait(ps->env->xfer, STREAM_WAIT_MS);
    }
    return ps->status;
}

tdm_status_t prefill_stream_notice(prefill_stream_t *ps, const void *payload, size_t n_bytes)
{
    xfer_batch_params_t bp;
    tdm_status_t status;

    if (ps->n_in_flight > 0 || ps->status != TDM_OK) {
        return ps->status != TDM_OK ? ps->status : TDM_ERR_INVALID_ARG;
    }
    memset(&bp, 0, sizeof(bp));
    bp.op = XFER_OP_PUT;
    bp.flags = XFER_BATCH_NOTICE;
    bp.job_id = ps->job_id;
    bp.local_pool = ps->env->xpool;
    bp.n_pages = 0; /* the pages went in the job's put batches; this carries the state only */
    bp.payload = payload;
    bp.payload_bytes = n_bytes;
    bp.done = on_stream_batch_done;
    bp.done_arg = ps;
    for (;;) {
        status = xfer_batch_post(ps->peer, &bp);
        if (status != TDM_ERR_BUSY) {
            break;
        }
        xfer_context_wait(ps->env->xfer, STREAM_WAIT_MS);
    }
    if (status != TDM_IN_PROGRESS) {
        return status;
    }
    ps->n_in_flight++;
    while (ps->n_in_flight > 0) {
        xfer_context_wait(ps->env->xfer, STREAM_WAIT_MS);
    }
    return ps->status;
}
