/* spec_impl.h - what the speculative-decoding files share (spec.c: context, step, metrics;
 * spec_dspark.c: DSpark heads and verify length; spec_ngram.c: prompt lookup; spec_accept.c:
 * coupled and rejection acceptance). Not a public header: other modules use engine/spec.h.
 */
#ifndef TANDEM_ENGINE_SPEC_IMPL_H
#define TANDEM_ENGINE_SPEC_IMPL_H

#include "common/arena.h"
#include "engine/model_impl.h"
#include "engine/spec.h"
#include "kernels/ops.h"

struct engine_spec {
    engine_fwd_t *fwd;
    const engine_model_t *model;
    const engine_config_t *cfg;
    const kern_ops_t *ops;
    kern_ctx_t kctx;
    engine_spec_params_t params;
    int64_t V;
    int64_t H;
    int64_t B;           /* DSpark block size (0 without DSpark blocks) */
    float *logits;       /* [max_batch * (max_drafts + 1), V] target logits of a verify */
    float *draft_logits; /* [max_batch * max_drafts, V] DSpark draft logits l_i (q of rejection) */
    /* backend memory (the model's ops->mem_alloc: device memory on CUDA) */
    float *x;      /* [max_batch * B, H] DSpark head inputs */
    float *U;      /* [B, V] head logits of one sequence's block */
    float *hn;     /* [B, H] normed head inputs */
    float *e;      /* [r_m rounded up to 16] Markov embedding of prev_i (zero padded) */
    float *ml;     /* [V] Markov logits, then the draft logits l_i */
    int32_t *prev; /* [1] the previous draft id, embed's input */
    /* host memory */
    float *conf_h;     /* [(B + 1) * H + 2 * r_m] staging of the confidence head's inputs */
    double *p;         /* [V] target distribution */
    double *q;         /* [V] draft distribution */
    int32_t *ids;      /* [max_batch * (max_drafts + 1)] verify ids */
    tdm_arena_t arena; /* sampler scratch */
    engine_spec_metrics_t metrics[ENGINE_SPEC_N_DRAFTERS];
};

/*
 * spec_dspark_heads - the heads and the verify length of one sequence (MODEL.md 8): x [B, H]
 * the draft forward's collapse, anchor y at position a. Drafts d_1 .. d_L into drafts_out
 * (sampled with the request's primitive at a + j), L <= max_drafts from the confidence
 * product and theta_v (at least 1); the draft logits l_0 .. l_{L-1} into dlogits_out [L, V].
 * x is backend memory (spec->x); dlogits_out host memory (the sampler reads it there).
 */
tdm_status_t spec_dspark_heads(engine_spec_t *spec, const float *x, int32_t anchor, int64_t a,
                               const engine_sampler_params_t *sampling, int max_drafts,
                               int32_t *drafts_out, float *dlogits_out, int *n_drafts_out);

/*
 * spec_ngram_propose - prompt lookup: the most recent earlier occurrence of the history's last
 * k tokens (k = n_max .. n_min, longest first) and up to max_drafts tokens that followed it.
 * Returns the number written to drafts_out (0: no match).
 */
int spec_ngram_propose(const int32_t *history, int64_t n_history, int n_max, int n_min,
                       int max_drafts, int32_t *drafts_out);

/*
 * spec_accept - the acceptance rule of spec->params on one sequence: logits [L + 1, V] of the
 * verify rows (row i at a + i), drafts d_1 .. d_L, dlogits [L, V] the draft logits (NULL: the
 * drafts are point masses). samples_out [L + 1]; *n_accepted_out = m; m + 1 samples written.
 * constraint (may be NULL): each row is masked (in place) by the constraint's state advanced
 * along the drafts kept before it; a kept stop id ends the rows (m + 1 samples, the last the
 * stop id). The constraint's state is given back unchanged.
 */
tdm_status_t spec_accept(engine_spec_t *spec, float *logits, const int32_t *drafts, int L,
                         const float *dlogits, int64_t a, const engine_sampler_params_t *sampling,
                         engine_constraint_t *constraint, engine_sample_t *samples_out,
                         int *n_accepted_out);

#endif
