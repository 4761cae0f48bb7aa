/* job_stream.h - the page puts of one prefill job while and after it computes (internal to
 * prefill-node/: job.c uses it; nothing outside the prefill node includes it). */
#ifndef TANDEM_PREFILL_JOB_STREAM_H
#define TANDEM_PREFILL_JOB_STREAM_H

#include <stdint.h>

#include "node/node_handoff.h"
#include "prefill-node/job.h"
#include "transfer/peer.h"

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
 *
 * With several jobs in one step (job.c, prefill_jobs_step) each job's rows are a segment of
 * the batch and each per-layer record names its job (seq_index = its part): the rule above holds
 * per job, and a job whose delta spans several steps reserves its pages step by step (the check
 * against the reservation counts the pages it will hold at T).
 */
typedef struct {
    const prefill_job_env_t *env;
    xfer_peer_t *peer;
    const node_resv_desc_t *rd;
    engine_seq_t *seq;
    uint64_t job_id;
    void *user; /* the job's cookie for env->aborted and env->fenced */
    size_t page_bytes;
    uint32_t base[NODE_MAX_SOURCES]; /* index of source s's first target in the arrays below */
    uint32_t next[NODE_MAX_SOURCES]; /* targets of source s sealed and queued so far */
    uint32_t n_all;
    uint32_t *local, *remote; /* [n_all] reservation order */
    uint64_t *sums;           /* [n_all] XXH3-64 of each sealed page */
    uint32_t *pend;           /* [n_all] indices sealed, not yet posted (post was BUSY) */
    uint32_t n_pend;
    int checked;              /* tables at T compared with the reservation */
    int aborted;              /* an abort was seen: post nothing more */
    int fenced;               /* env->fenced was called */
    uint32_t n_in_flight;     /* batches posted, callback not yet run */
    uint32_t n_chunk_batches; /* batches posted while the prefill computed */
    uint32_t n_early_pages;   /* pages posted while the prefill computed */
    uint32_t n_posted_pages;
    tdm_status_t status; /* first failure: a table mismatch, a post or a batch */
} prefill_stream_t;

/* prefill_stream_init - a stream of the reserved pages of `rd` (borrowed, as env, peer and seq,
 * for the stream's life); user: the job's cookie for env->aborted / env->fenced. TDM_OK or
 * TDM_ERR_NO_MEMORY (prefill_stream_fini frees what was made either way). */
tdm_status_t prefill_stream_init(prefill_stream_t *ps, const prefill_job_env_t *env,
                                 xfer_peer_t *peer, const node_resv_desc_t *rd, engine_seq_t *seq,
                                 uint64_t job_id, void *user);

/* prefill_stream_fini - free the arrays; the caller has drained the stream (nothing in
 * flight). */
void prefill_stream_fini(prefill_stream_t *ps);

/* prefill_stream_check - the sequence's tables will hold exactly the reserved pages at T (the
 * pages held plus those still to reserve; checked once): TDM_OK or TDM_ERR_MISMATCH (kept in
 * ps->status). */
tdm_status_t prefill_stream_check(prefill_stream_t *ps);

/* prefill_stream_collect - seal, checksum and queue every target whose rows below
 * n_c(end - 1) are all written (end = INT64_MAX: every remaining target). */
void prefill_stream_collect(prefill_stream_t *ps, int64_t end);

/* prefill_stream_post - post the queued pages as one put batch (computing: counted as an early
 * batch); BUSY keeps them queued. */
void prefill_stream_post(prefill_stream_t *ps, int computing);

/* prefill_stream_stop - an abort reached the job: drop what is queued, wait for every batch in
 * flight, then call env->fenced once. */
void prefill_stream_stop(prefill_stream_t *ps);

/* prefill_stream_on_layer - the engine's per-layer record of this job's rows (called by the
 * node's dump sink, on the compute thread): look for an abort (then stop), progress the puts,
 * and at layer c post the pages the rows completed. */
void prefill_stream_on_layer(prefill_stream_t *ps, const engine_dump_layer_t *rec);

/* prefill_stream_drain - post what is queued (retrying while BUSY, stopping at an abort), then
 * wait for every batch in flight. Returns ps->status; always returns with nothing in flight. */
tdm_status_t prefill_stream_drain(prefill_stream_t *ps);

/* prefill_stream_notice - after prefill_stream_drain returned TDM_OK (nothing in flight): send
 * `payload` (n_bytes, copied at post; node/node_state.h) to the decode node in a completion
 * notice of no pages (transfer/batch.h: XFER_BATCH_NOTICE with n_pages 0, which flushes the
 * endpoint first), retrying while BUSY, and wait until UCX has taken it. Returns TDM_OK, or the
 * post's or the batch's failure (TDM_ERR_PEER_LOST, ...); never leaves the batch in flight. */
tdm_status_t prefill_stream_notice(prefill_stream_t *ps, const void *payload, size_t n_bytes);

#endif
