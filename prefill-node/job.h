/* job.h - one prefill job of a prefill node, start to finish (docs/PROTOCOL.md 3b).
 *
 * For a delta [H, T) of a session held by a decode node: pulls the session's pages below H from
 * the decode node (one UCX get batch into local pages; only those the node's history cache,
 * history.h, does not hold unchanged), imports them with the state record at H
 * from the reservation descriptor (engine_seq_import checks identity, fingerprint and checksum of
 * every page), replays the rings of layers 0..c at H (MODEL.md 6(d)(1), canonical start), runs
 * the CED prefill of the delta (engine_fwd_prefill, chunked inside the engine), samples the first
 * token at position T (MODEL.md 8), and puts the pages holding rows n_c(H) .. into the reserved
 * pages: each page as soon as it is final, one non-blocking UCX put batch per prefill chunk (its
 * pages that the chunk completed) while the next chunk computes, and the pages still being
 * appended to at the end (each source's last one) in a last batch after the compute (job.c
 * explains the choice). An abort seen at a layer boundary stops the puts at once: the job posts
 * nothing more, waits for its batches in flight and calls env->fenced, then lets the compute end
 * (the engine has no cancel point inside a prefill) and returns TDM_ERR_TIMEOUT.
 * Once every batch has completed (flushed) it builds the CompletionNotice:
 * page checksums in reservation order, first token, its log-probability, the state record at T
 * and its checksum.
 * Borrows the model, the engine pool and the transfer context; owns the job's sequence until it
 * returns. Single-threaded (the node's compute thread).
 */
#ifndef TANDEM_PREFILL_JOB_H
#define TANDEM_PREFILL_JOB_H

#include <stdint.h>

#include "common/status.h"
#include "engine/forward.h"
#include "engine/constrain.h"
#include "engine/model.h"
#include "node/node_progress.h"
#include "prefill-node/history.h"
#include "proto/proto.h"
#include "transfer/context.h"
#include "transfer/pool.h"

/* What a job needs from the node (borrowed). */
typedef struct {
    const engine_model_t *model;
    engine_kv_pool_t *kv;   /* pages lie in xpool's memory: page i is xfer page i */
    xfer_context_t *xfer;
    xfer_pool_t *xpool;
    engine_fwd_t *fwd;
    /* Called between phases and after every layer of every prefill chunk; returns nonzero when
     * the job was aborted (stop: post no more puts). */
    int (*aborted)(void *arg, uint64_t request_id);
    void *aborted_arg;
    /* Called (with aborted_arg) at most once, on the compute thread, as soon as a job that saw
     * an abort mid-compute has no put in flight any more (every batch it posted completed or
     * failed): it will write nothing more into the reservation, so the caller may acknowledge
     * the abort (AbortAck) before the compute ends. pages_put: pages posted before the stop.
     * May be NULL. */
    void (*fenced)(void *arg, uint32_t pages_put);
    /* Constrained decoding of the first token (a job's SamplingParams.response_format or
     * tool_calls): the vocabulary's byte tries, or NULL (a constrained job then fails, naming
     * tokenizer.json). */
    const engine_constrain_vocab_t *constrain_vocab;
    /* Liveness (node_progress.h): ticked after every layer pass of the compute, so a long job
     * is not taken for a wedged thread; NULL: none. */
    node_progress_t *progress;
    /* The node's history page cache (history.h): the job takes the history pages it holds
     * unchanged instead of pulling them, and leaves the session's pages at T there after a
     * successful job; NULL: none (every history page is pulled). */
    prefill_history_t *history;
} prefill_job_env_t;

/* What a job did (plain data, for metrics). */
typedef struct {
    uint64_t n_prefilled;  /* delta tokens */
    uint32_t n_history;    /* history pages below H the job needed (what a node without the
                              history cache pulls) */
    uint32_t n_pulled;     /* pages got from the decode node (the others came from the cache) */
    uint32_t n_put;        /* pages put into the reservation */
    uint32_t n_put_early;  /* of which posted while the prefill still computed */
    uint32_t n_chunk_puts; /* put batches posted while the prefill computed (one per chunk that
                              completed a page) */
    uint64_t pull_ns;      /* history gets */
    uint64_t compute_ns;   /* replay, CED prefill (with the per-chunk puts) and sampling */
    uint64_t put_ns;       /* after the compute: the last batch and the wait for every batch */
} prefill_job_report_t;

/*
 * prefill_job_run - run `job` (borrowed). On TDM_OK, *notice_out is filled: its arrays
 * (page_checksums, state_record.data, and first_top / choice_first when asked for top logprobs or
 * n_choices > 1) are malloc'ed; free them with prefill_job_notice_fini.
 * Returns TDM_OK; TDM_ERR_TIMEOUT when aborted (nothing posted after the abort was seen, at the
 * next layer boundary; the pages already put stay the reservation's until the decode node hears
 * that the writer is fenced, docs/PROTOCOL.md 4); every return leaves no transfer in flight, and
 * report_out->n_put counts the pages put on every return;
 * TDM_ERR_FORMAT / TDM_ERR_MISMATCH (descriptor or pages do not check: err says which);
 * TDM_ERR_PEER_LOST (the decode node vanished); TDM_ERR_NO_PAGES (local pool too small);
 * TDM_ERR_INTERNAL. err: err_bytes, may be 0.
 */
tdm_status_t prefill_job_run(const prefill_job_env_t *env, const Tandem__PrefillJob *job,
                             Tandem__CompletionNotice *notice_out, prefill_job_report_t *report_out,
                             char *err, size_t err_bytes);

/* prefill_job_notice_fini - free what prefill_job_run allocated in a notice. */
void prefill_job_notice_fini(Tandem__CompletionNotice *notice);

#endif
