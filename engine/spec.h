/* spec.h - speculative decoding (MODEL.md section 8): drafters, verify inside a decode batch,
 * acceptance and rollback.
 *
 * An engine_spec_t runs decode steps for a batch of sequences. Each sequence in a step has an
 * anchor y at position a = engine_seq_length(seq) (sampled by the target, not yet run) and a
 * drafter:
 *   ENGINE_SPEC_OFF      - plain decode: the target runs [y] and the token at a + 1 is sampled;
 *   ENGINE_SPEC_DSPARK   - the DSpark blocks and heads draft d_1 .. d_L (spec_dspark.c), L from
 *                          the confidence product and the threshold theta_v;
 *   ENGINE_SPEC_NGRAM    - prompt lookup in the request's token history (spec_ngram.c);
 *   ENGINE_SPEC_EXTERNAL - drafts given by the caller (tests, the controlled-acceptance bench).
 * The target runs every sequence's [y, d_1 .. d_L] as one engine_fwd_decode_multi call, so a
 * speculative sequence and a plain one share the batch without changing each other's result
 * (every row is batch-invariant). Acceptance (spec_accept.c):
 *   coupled (default)  - d_i is kept iff it equals the target's own token at a + i (the
 *                        section-8 primitive on p_i at position a + i); at the first mismatch the
 *                        target's token is emitted; if all match, the target's token at
 *                        a + L + 1. Token-identical to non-speculative decoding, same seed.
 *   rejection (option) - the standard rule: keep d_i with probability min(1, p_i(d_i)/q_i(d_i))
 *                        (q_i the filtered draft distribution; a point mass for n-gram and
 *                        external drafts), else emit a sample of normalize(max(0, p_i - q_i));
 *                        if all are kept the bonus token comes from the primitive on p_{L+1}.
 *                        Randomness [tandem]: u and the residual draw use word 0 and word 1 of
 *                        Philox-4x32-10(key = seed, counter = (a + i, 0, 1, 0)), counters the
 *                        primitive's (q, x, 0, 0) never use. Lossless in distribution only.
 * After the accept the sequence is rolled back to its committed length n = a + m + 1
 * (engine_seq_rollback); tokens after the first stop id, or past the request's budget, are
 * neither emitted nor committed, so the state always equals a non-speculative run's.
 *
 * Owns its scratch (logits, draft buffers, sampler arena: sized at create, no malloc per step)
 * and per-drafter metrics. Borrows the forward context (and through it the model and pool).
 * Not thread-safe; one step at a time. Knows nothing of HTTP, flags or tokenization.
 */
#ifndef TANDEM_ENGINE_SPEC_H
#define TANDEM_ENGINE_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/constrain.h"
#include "engine/forward.h"
#include "engine/sampler.h"

/* Most draft tokens one step verifies for one sequence (>= every config's B). */
#define ENGINE_SPEC_MAX_DRAFTS 16

/* Most tokens one step emits for one sequence: every draft plus the bonus token. */
#define ENGINE_SPEC_MAX_EMIT (ENGINE_SPEC_MAX_DRAFTS + 1)

/* Default verify-length threshold theta_v (MODEL.md 8, --spec-confidence-threshold). */
#define ENGINE_SPEC_DEFAULT_THRESHOLD 0.3

/* Default n-gram sizes of the prompt-lookup drafter (longest tried first). */
#define ENGINE_SPEC_NGRAM_MAX_DEFAULT 4
#define ENGINE_SPEC_NGRAM_MIN_DEFAULT 2

/* Which drafter a sequence uses. */
typedef enum {
    ENGINE_SPEC_OFF = 0,
    ENGINE_SPEC_DSPARK = 1,
    ENGINE_SPEC_NGRAM = 2,
    ENGINE_SPEC_EXTERNAL = 3,
    ENGINE_SPEC_N_DRAFTERS = 4,
} engine_spec_drafter_t;

/* The acceptance rule. */
typedef enum {
    ENGINE_SPEC_ACCEPT_COUPLED = 0,
    ENGINE_SPEC_ACCEPT_REJECTION = 1,
} engine_spec_accept_t;

/*
 * engine_spec_params_t - engine_spec_params_default() fills it.
 *
 * accept:               coupled (default) or rejection.
 * confidence_threshold: theta_v in [0, 1]; 0 = always verify B DSpark drafts (default 0.3).
 * max_drafts:           most drafts per step, 1 .. ENGINE_SPEC_MAX_DRAFTS; DSpark never more
 *                       than B (default B).
 * ngram_max, ngram_min: n-gram sizes tried by prompt lookup, longest first (4, 2);
 *                       1 <= min <= max <= 8.
 * max_batch:            most sequences per step, 1 .. ENGINE_FWD_MAX_BATCH (default 16).
 */
typedef struct {
    engine_spec_accept_t accept;
    double confidence_threshold;
    int max_drafts;
    int ngram_max;
    int ngram_min;
    int max_batch;
} engine_spec_params_t;

/*
 * engine_spec_req_t - one sequence in a step (plain data, borrowed for the call).
 *
 * seq:         the sequence; its committed length a is the anchor's position.
 * anchor:      the token at a, sampled by the target, not yet run.
 * drafter:     as above (DSPARK needs a model with DSpark blocks and a >= 1).
 * sampling:    the request's validated sampling parameters (same for draft and target).
 * history:     [n_history] every token of the sequence, prompt first, ending with the anchor
 *              (n_history = a + 1); used by the n-gram drafter; may be NULL otherwise.
 * ext_drafts:  [n_ext_drafts] the EXTERNAL drafter's proposals for a + 1 ...
 * max_emit:    most tokens the step may emit (the request's remaining budget), >= 1.
 * constraint:  the request's constrained decoding (engine/constrain.h), or NULL. Every verify
 *              row is masked by the constraint's state advanced along the drafts kept before it,
 *              so drafts outside the language are never kept and every emitted token is one
 *              the mask allowed; the state is left as it was (the caller advances it by the
 *              emitted tokens).
 */
typedef struct {
    engine_seq_t *seq;
    int32_t anchor;
    engine_spec_drafter_t drafter;
    const engine_sampler_params_t *sampling;
    const int32_t *history;
    int64_t n_history;
    const int32_t *ext_drafts;
    int n_ext_drafts;
    int max_emit;
    engine_constraint_t *constraint;
} engine_spec_req_t;

/*
 * engine_spec_result_t - what one sequence got from a step.
 *
 * n_emitted:  tokens emitted, 1 .. max_emit; samples[k] is the token at position a + 1 + k with
 *             its log-probability under the target (engine_sample_t); the last one is the next
 *             anchor. The sequence's committed length is a + n_emitted.
 * n_drafted:  drafts proposed; n_verified: drafts the target ran; n_accepted: drafts kept.
 */
typedef struct {
    int n_emitted;
    engine_sample_t samples[ENGINE_SPEC_MAX_EMIT];
    int n_drafted;
    int n_verified;
    int n_accepted;
} engine_spec_result_t;

/*
 * engine_spec_metrics_t - cumulative counters of one drafter, and derived rates.
 *
 * n_steps: sequence-steps that used the drafter; drafted / verified / accepted: draft tokens;
 * emitted: tokens emitted. acceptance_rate = accepted / verified (0 without verifies);
 * mean_accepted_length = accepted / n_steps (drafts kept per step; tokens per step is that + 1
 * before stop/budget cuts).
 */
typedef struct {
    uint64_t n_steps;
    uint64_t drafted;
    uint64_t verified;
    uint64_t accepted;
    uint64_t emitted;
    double acceptance_rate;
    double mean_accepted_length;
} engine_spec_metrics_t;

/* A speculative decoding context; opaque. */
typedef struct engine_spec engine_spec_t;

/* engine_spec_params_default - coupled, theta_v 0.3, max_drafts B (5 if the model has no
 * DSpark), n-gram 4..2, max_batch 16. model may be NULL (then max_drafts 5). */
void engine_spec_params_default(const engine_model_t *model, engine_spec_params_t *params);

/* engine_spec_drafter_parse - "off", "dspark", "ngram" -> drafter; TDM_ERR_INVALID_ARG else. */
tdm_status_t engine_spec_drafter_parse(const char *name, engine_spec_drafter_t *drafter_out);

/* engine_spec_drafter_name - "off", "dspark", "ngram", "external" (static strings). */
const char *engine_spec_drafter_name(engine_spec_drafter_t drafter);

/* engine_spec_accept_parse - "coupled", "rejection" -> rule; TDM_ERR_INVALID_ARG else. */
tdm_status_t engine_spec_accept_parse(const char *name, engine_spec_accept_t *accept_out);

/*
 * engine_spec_create - a context over `fwd` (borrowed; must outlive it) whose max_chunk_tokens
 * must hold max_batch * (max_drafts + 1) rows. Sizes all step scratch.
 *
 * Returns TDM_OK and *spec_out (engine_spec_destroy frees it), TDM_ERR_INVALID_ARG (NULL, a
 * parameter out of range; logged at warn with the field), TDM_ERR_NO_MEMORY.
 */
tdm_status_t engine_spec_create(engine_fwd_t *fwd, const engine_spec_params_t *params,
                                engine_spec_t **spec_out);

/* engine_spec_destroy - free the context; accepts NULL. */
void engine_spec_destroy(engine_spec_t *spec);

/*
 * engine_spec_step - one decode step for n_reqs (1 .. max_batch) distinct sequences: draft,
 * verify all of them in one engine_fwd_decode_multi, accept, roll back. results_out [n_reqs].
 *
 * Returns TDM_OK; TDM_ERR_INVALID_ARG (a bad request: NULL, max_emit < 1, DSPARK without DSpark
 * blocks, an id >= V, a position past the context limit; no sequence changed);
 * TDM_ERR_NO_PAGES (no sequence changed); TDM_ERR_NO_MEMORY, TDM_ERR_INTERNAL (sequences whose
 * verify ran are invalid and must be destroyed).
 */
tdm_status_t engine_spec_step(engine_spec_t *spec, const engine_spec_req_t *reqs, int n_reqs,
                              engine_spec_result_t *results_out);

/* engine_spec_metrics - the counters of `drafter` so far, rates computed (for /metrics). */
void engine_spec_metrics(const engine_spec_t *spec, engine_spec_drafter_t drafter,
                         engine_spec_metrics_t *metrics_out);

#endif
