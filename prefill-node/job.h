/* job.h - the prefill jobs of a prefill node, start to finish (docs/PROTOCOL.md 3b), several at
 * a time.
 *
 * A job is a small state machine the node drives on its compute thread:
 *   start   (prefill_job_start)  - for a delta [H, T) of a session held by a decode node: pulls
 *             the session's pages below H from the decode node (one UCX get batch into local
 *             pages: prefill_job_pull's step; only those the node's history cache,
 *             history.h, does not hold unchanged), imports them with the state record at H from the
 *             reservation descriptor (engine_seq_import checks identity, fingerprint and checksum
 *             of every page);
 *   steps   (prefill_jobs_step)  - the replay of the rings of layers 0..c at H (MODEL.md 6(d)(1),
 *             canonical start) of the jobs new to the step, in one batched call
 *             (engine_fwd_replay_batch); then the CED prefill of the delta, in parts: one step
 *             takes the next tokens of several jobs (oldest first, a chunk at most per job,
 *             under a token budget) and runs them in one engine_fwd_prefill_parts call, one
 *             batch (each job keeps its own sequence, history and pages; each gets the bits it
 *             gets alone). The pages holding rows n_c(H) .. are put into the reserved pages as
 *             soon as they are final: one non-blocking UCX put batch per job and chunk (its
 *             pages the chunk completed) while the compute goes on (job_stream.h explains the
 *             choice);
 *   finish  (prefill_job_finish) - samples the first token at position T (MODEL.md 8), puts the
 *             pages still being appended to at the end (each source's last one) in a last batch,
 *             and once every batch has completed (flushed) builds the CompletionNotice: page
 *             checksums in reservation order, first token, its log-probability, the state record
 *             at T and its checksum. Unless env->state_inband, the record and the checksums then
 *             go to the decode node in a transfer notice (node/node_state.h) and the notice for
 *             the router keeps only state_direct, n_pages and state_checksum.
 * An abort seen at a layer boundary (or before a step) stops the job's puts at once: it posts
 * nothing more, waits for its batches in flight and calls env->fenced, takes no part in later
 * steps (the step it was in runs to its end: the engine has no cancel point inside a pass), and
 * its finish returns TDM_ERR_TIMEOUT. A job that fails (its puts, its peer, its pages) is over
 * alone: the others of its steps go on. prefill_job_destroy frees its pages and sequence.
 * Borrows the model, the engine pool and the transfer context. Single-threaded (the node's
 * compute thread).
 */
#ifndef TANDEM_PREFILL_JOB_H
#define TANDEM_PREFILL_JOB_H

#include <stdint.h>

#include "common/status.h"
#include "engine/forward.h"
#include "engine/constrain.h"
#include "engine/model.h"
#include "node/node_pages.h"
#include "node/node_progress.h"
#include "prefill-node/history.h"
#include "proto/proto.h"
#include "transfer/context.h"
#include "transfer/pool.h"

/* What a job needs from the node (borrowed). */
typedef struct {
    const engine_model_t *model;
    engine_kv_pool_t *kv; /* node_pages_engine(pages): page i is xfer page i */
    xfer_context_t *xfer;
    xfer_pool_t *xpool; /* node_pages_xfer(pages) */
    /* The pages' host bytes UCX reads and writes (node/node_pages.h): the engine's own on the
     * CPU; on a device, staging copies the jobs download before sealing, hashing and putting
     * them, and read what they get (history pages, the staged record) from. */
    node_pages_t *pages;
    engine_fwd_t *fwd;
    /* Called between phases and after every layer of every prefill chunk of a job, with the
     * job's `user` cookie (prefill_job_start); returns nonzero when that job was aborted (stop:
     * post no more puts). */
    int (*aborted)(void *arg, void *job_user);
    void *aborted_arg;
    /* Called (with aborted_arg and the job's cookie) at most once per job, on the compute
     * thread, as soon as a job that saw an abort mid-compute has no put in flight any more
     * (every batch it posted completed or failed): it will write nothing more into the
     * reservation, so the caller may acknowledge the abort (AbortAck) before the compute ends.
     * pages_put: pages posted before the stop. May be NULL. */
    void (*fenced)(void *arg, void *job_user, uint32_t pages_put);
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
    /* 0 (the default): the state record at T and the page checksums go to the decode node
     * directly in a transfer notice (node/node_state.h) and the CompletionNotice to the router
     * says state_direct; 1 (--state-inband, TANDEM_STATE_INBAND=1): they ride in the
     * CompletionNotice through the router, as before issue 18 (rolling upgrades: decode nodes
     * that predate the direct path). */
    int state_inband;
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
    uint64_t compute_ns;   /* replay, the steps it took part in (each whole: with several jobs
                              in a step they overlap) and sampling */
    uint64_t put_ns;       /* after the compute: the last batch and the wait for every batch */
} prefill_job_report_t;

/* One job; opaque. */
typedef struct prefill_job prefill_job_t;

/*
 * prefill_job_pages_needed - local pages `job` needs at most (the history it pulls, held twice
 * while it is imported, then its sequence at T), from its page descriptor; 0 when the
 * descriptor does not parse (the start then fails). For admission: a node starts a job only
 * when that many pages are free beside what its running jobs will still take.
 */
uint32_t prefill_job_pages_needed(const Tandem__PrefillJob *job);

/*
 * prefill_job_start - check `job` (borrowed until prefill_job_destroy) against its descriptor,
 * reach its decode node, pull and import the history (its ring replay at H runs in its first
 * step). user: the cookie
 * env->aborted and env->fenced get for this job. On TDM_OK *job_out is the started job
 * (prefill_job_destroy frees it), with prefill_job_rows_left() delta tokens to compute.
 * Returns TDM_OK; TDM_ERR_TIMEOUT (aborted before its compute; nothing put);
 * TDM_ERR_FORMAT / TDM_ERR_MISMATCH (descriptor or pages do not check: err says which);
 * TDM_ERR_PEER_LOST; TDM_ERR_NO_PAGES (local pool too small); TDM_ERR_NO_MEMORY;
 * TDM_ERR_INTERNAL. On failure nothing is left (no page, no transfer). err: err_bytes, may be 0.
 */
tdm_status_t prefill_job_start(const prefill_job_env_t *env, const Tandem__PrefillJob *job,
                               void *user, prefill_job_t **job_out, char *err, size_t err_bytes);

/* prefill_job_rows_left - delta tokens the job has still to compute (0 once it has computed
 * them all, or has failed or stopped: prefill_job_finish then tells which). */
int64_t prefill_job_rows_left(const prefill_job_t *job);

/* prefill_job_pages_to_come - local pages the job's sequence will still reserve up to T. */
uint32_t prefill_job_pages_to_come(const prefill_job_t *job);

/*
 * prefill_jobs_step - one step of jobs [n_jobs] (oldest first; 1 <= n_jobs <=
 * ENGINE_FWD_MAX_BATCH): the canonical ring replays of the jobs that have not had theirs, in one
 * batched call, then the next tokens of each job that has some left, at most job_tokens
 * (>= 1) per job, in order, until budget_tokens (>= 1) are taken (a job's delta is thus split
 * across steps and a long job does not hold the others back), in one engine_fwd_prefill_parts
 * call, with each job's page puts on the engine's per-layer hook. A job with tokens left that an
 * abort names is stopped (fenced) instead of stepped. A failure is the job's: the others go on
 * (a NaN in the batch, TDM_ERR_INTERNAL, fails every job of the step: their rows were one
 * batch). n_tokens_out: tokens computed (may be NULL).
 * Returns TDM_OK, or the engine's status when it failed (the jobs it names are over).
 */
tdm_status_t prefill_jobs_step(const prefill_job_env_t *env, prefill_job_t *const *jobs, int n_jobs,
                               int64_t budget_tokens, int64_t job_tokens, int64_t *n_tokens_out);

/*
 * prefill_job_finish - end a job whose rows_left is 0: on TDM_OK *notice_out is filled; its
 * arrays (page_checksums, state_record.data, and first_top / choice_first when asked for top
 * logprobs or n_choices > 1) are malloc'ed; free them with prefill_job_notice_fini.
 * Returns TDM_OK; TDM_ERR_TIMEOUT when aborted (nothing posted after the abort was seen; the
 * pages already put stay the reservation's until the decode node hears that the writer is
 * fenced, docs/PROTOCOL.md 4); the job's failure (TDM_ERR_PEER_LOST, TDM_ERR_MISMATCH,
 * TDM_ERR_NO_PAGES, TDM_ERR_INTERNAL, ... with err); TDM_ERR_INVALID_ARG (rows left). Every
 * return leaves no transfer in flight; report_out->n_put counts the pages put on every return.
 */
tdm_status_t prefill_job_finish(prefill_job_t *job, Tandem__CompletionNotice *notice_out,
                                prefill_job_report_t *report_out, char *err, size_t err_bytes);

/* prefill_job_destroy - wait for the job's batches in flight, free its pages, sequence and
 * connection. Accepts NULL. */
void prefill_job_destroy(prefill_job_t *job);

/* prefill_job_notice_fini - free what prefill_job_run allocated in a notice. */
void prefill_job_notice_fini(Tandem__CompletionNotice *notice);

#endif
